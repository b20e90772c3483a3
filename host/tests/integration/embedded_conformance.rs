//! The store conformance suite (`conformance/`) run against the embedded (SQLite) backend,
//! one temp file per test. `cargo test conformance` runs exactly the suite.

use homing::store::embedded::EmbeddedStore;

use crate::conformance;

conformance::suite!(file = EmbeddedStore::open);

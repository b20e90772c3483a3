//! The store conformance suite (`tests/conformance/`) run against the embedded (SQLite) backend,
//! one temp file per test. `cargo test conformance` runs exactly the suite.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod conformance;

use homing::store::embedded::EmbeddedStore;

conformance::suite!(embedded_conformance, file = EmbeddedStore::open);

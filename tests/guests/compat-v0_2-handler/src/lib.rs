//! A `handler` component built against the frozen `homing:agent@0.2.0` (`wit/0.2.0/`), for the
//! test that 0.2.0 components keep running on a host that speaks 0.2.1: wasmtime links their
//! 0.2.0 imports to the host's 0.2.1 definitions.
//!
//! It appends its payload to the thread log, stores and reads a step, emits a chunk, and
//! returns a report of what each call answered.

#![allow(clippy::missing_safety_doc)]

wit_bindgen::generate!({
    path: "../../../wit/0.2.0",
    world: "handler",
});

use exports::homing::agent::handle::Guest;
use homing::agent::mailbox::Claim;

struct Compat;

impl Guest for Compat {
    fn handle(claim: &Claim) -> Result<Vec<u8>, String> {
        let info = claim.info();
        let appended = claim.append(&info.payload);
        let put = claim.step_put("k", b"v");
        let got = claim.step_get("k");
        let emitted = claim.emit(b"chunk");
        let report = format!(
            "append {:?}; step-put {put:?}; step-get {:?}; emit {emitted:?}",
            appended.is_ok(),
            got.map(|v| v.map(|v| String::from_utf8_lossy(&v).into_owned())),
        );
        Ok(report.into_bytes())
    }
}

export!(Compat);

//! Host bindings of the `homing:agent` WIT package, one module per world.
//!
//! Both worlds share the `types`, `mailbox` and `log` interfaces: the `agent` world reuses the
//! `handler` world's generated modules through `with`, so one set of host trait impls serves
//! both. Every import is async (host calls reach the store) and trappable (a host failure that
//! is not the guest's business, such as a missing resource, traps the guest rather than
//! lying to it).

/// The `handler` world: the host claims and calls `handle`.
pub mod handler {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "handler",
        imports: { default: async | trappable },
        exports: { default: async },
        with: {
            "homing:agent/mailbox.claim": crate::claim::ClaimHandle,
        },
    });
}

/// The `agent` world: the guest drives through `claim-next`.
pub mod agent {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "agent",
        imports: { default: async | trappable },
        exports: { default: async },
        with: {
            "homing:agent/types": super::handler::homing::agent::types,
            "homing:agent/mailbox": super::handler::homing::agent::mailbox,
            "homing:agent/log": super::handler::homing::agent::log,
        },
    });
}

pub use handler::homing::agent::log::Level;
pub use handler::homing::agent::types::{
    DispatchInfo, EnqueueRequest, Error as GuestError, LogEntry, StopReason,
};

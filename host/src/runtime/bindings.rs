//! Host bindings of the `homing:agent` WIT package: one module per contract version, one
//! module per world inside it.
//!
//! - [`v0_2`]: `homing:agent@0.2.1` (`wit/homing.wit`), the contract the host implements.
//!   Components built against 0.2.0 (`wit/0.2.0/`, frozen) link to it unchanged: 0.2.1 only
//!   added (the MCP broker's methods and types), and wasmtime matches 0.2.x imports to 0.2.1.
//! - [`v0_1`]: `homing:agent@0.1.0` (`wit/0.1.0/homing.wit`, frozen), served to components
//!   built before 0.2.0. wasmtime's linker matches an import only to a definition of the same
//!   `0.x` track, so the host defines both versions' interfaces under their own names; the
//!   0.1.0 trait impls (`runtime/host/v0_1.rs`) convert and delegate to the 0.2.0 ones.
//!
//! In each version both worlds share the `types`, `mailbox` and `log` interfaces: the `agent`
//! world reuses the `handler` world's generated modules through `with`, so one set of host
//! trait impls serves both. Both versions map the `claim` resource to the same host type,
//! [`ClaimHandle`](crate::claim::ClaimHandle). Every import is async (host calls reach the
//! store) and trappable (a host failure that is not the guest's business, such as a missing
//! resource, traps the guest rather than lying to it).

/// `homing:agent@0.2.1` (serving 0.2.0 too).
pub mod v0_2 {
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
}

/// `homing:agent@0.1.0`, frozen: components built against it run unchanged.
pub mod v0_1 {
    /// The `handler` world of 0.1.0.
    pub mod handler {
        wasmtime::component::bindgen!({
            path: "../wit/0.1.0",
            world: "handler",
            imports: { default: async | trappable },
            exports: { default: async },
            with: {
                "homing:agent/mailbox.claim": crate::claim::ClaimHandle,
            },
        });
    }

    /// The `agent` world of 0.1.0.
    pub mod agent {
        wasmtime::component::bindgen!({
            path: "../wit/0.1.0",
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
}

pub use v0_2::handler::homing::agent::log::Level;
pub use v0_2::handler::homing::agent::types::{
    DispatchInfo, EnqueueRequest, Error as GuestError, LogEntry, StopReason,
};
/// The 0.2.0 `mailbox` interface (its `claim` resource and `enqueue`).
pub use v0_2::handler::homing::agent::{log, mailbox, types};

//! The code `wit-bindgen` generates from `wit/homing.wit`; not part of the public API.
//!
//! Each world's bindings are generated behind its cargo feature: `handler` generates the
//! `handler` world, `agent` the `agent` world. Cargo unifies features across a workspace, so
//! both are often on at once (a workspace with a handler and an agent builds this crate once
//! with both). That is safe because of `pub_export_macro: true`: the custom section that
//! `wit-bindgen` embeds in this crate then describes only a world's *imports*, which
//! `wit-component` unions and prunes (an import no code calls is dropped from the component).
//! A world's exports are described by a second section that only its export macro emits, in
//! the guest's crate, so a component exports exactly the world whose `export_*!` macro it
//! invoked.
//!
//! When both worlds are generated, the `handler` world reuses the `agent` world's `types`,
//! `mailbox` and `log` modules (`with`), so there is one `Claim` type and one `Error` type.
//! The modules [`types`], [`mailbox`] and [`log`] name the imports whichever world made them.

/// Bindings of the `agent` world: imports `mailbox`, `queue` and `log`, exports `run`.
#[cfg(feature = "agent")]
pub mod agent_world {
    wit_bindgen::generate!({
        path: "wit",
        world: "agent",
        pub_export_macro: true,
        export_macro_name: "__export_agent_world",
        default_bindings_module: "homing_guest::__bindings::agent_world",
    });
}

/// Bindings of the `handler` world, sharing the `agent` world's imported interfaces.
#[cfg(all(feature = "handler", feature = "agent"))]
pub mod handler_world {
    wit_bindgen::generate!({
        path: "wit",
        world: "handler",
        pub_export_macro: true,
        export_macro_name: "__export_handler_world",
        default_bindings_module: "homing_guest::__bindings::handler_world",
        with: {
            "homing:agent/types@0.2.1": crate::__bindings::agent_world::homing::agent::types,
            "homing:agent/mailbox@0.2.1": crate::__bindings::agent_world::homing::agent::mailbox,
            "homing:agent/log@0.2.1": crate::__bindings::agent_world::homing::agent::log,
        },
    });
}

/// Bindings of the `handler` world: imports `mailbox` and `log`, exports `handle`.
#[cfg(all(feature = "handler", not(feature = "agent")))]
pub mod handler_world {
    wit_bindgen::generate!({
        path: "wit",
        world: "handler",
        pub_export_macro: true,
        export_macro_name: "__export_handler_world",
        default_bindings_module: "homing_guest::__bindings::handler_world",
    });
}

#[cfg(feature = "agent")]
pub use agent_world::homing::agent::{log, mailbox, queue, types};
#[cfg(all(feature = "handler", not(feature = "agent")))]
pub use handler_world::homing::agent::{log, mailbox, types};

/// Bindings of `wasi:config/store@0.2.0-rc.1` (feature `config`), generated from the copy in
/// `wit/deps/config` (from `wasmtime-wasi-config` 48.0.8, Apache-2.0 WITH LLVM-exception).
/// Only imports; a component that never calls them imports nothing (`wit-component` prunes).
#[cfg(feature = "config")]
pub mod config_world {
    wit_bindgen::generate!({
        path: "wit/deps/config",
        world: "wasi:config/imports@0.2.0-rc.1",
    });
}

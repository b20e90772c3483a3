//! The `handler` world: the host claims a dispatch and calls your [`Handler`] once for it.
//!
//! Implement [`Handler`] on a unit struct and name it in [`export_handler!`](crate::export_handler):
//!
//! ```no_run
//! use homing_guest::{Claim, Handler};
//!
//! struct Shout;
//!
//! impl Handler for Shout {
//!     fn handle(claim: &Claim) -> Result<Vec<u8>, String> {
//!         Ok(claim.payload_str()?.to_uppercase().into_bytes())
//!     }
//! }
//!
//! homing_guest::export_handler!(Shout);
//! ```
//!
//! What the return value does, unless the handler settled the claim itself: `Ok(output)`
//! completes the dispatch with `output`; `Err(message)` nacks it, so the host retries it with
//! backoff until the attempt limit, then dead-letters it. To give up at once, call
//! [`Claim::dead_letter`] and return; to retry at a chosen time, call [`Claim::nack`]. After
//! the handler settled the claim, its return value is ignored.
//!
//! A panic in a handler traps the instance; the host treats that as a failed attempt. Prefer
//! returning `Err`.

use crate::__bindings::mailbox;
use crate::claim::Claim;

/// A guest of the `handler` world: handles one dispatch per call.
pub trait Handler {
    /// Handles one dispatch the host claimed and lent to this call.
    ///
    /// # Errors
    ///
    /// `Err(message)` nacks the dispatch (a retry with backoff) unless the handler settled it.
    fn handle(claim: &Claim) -> Result<Vec<u8>, String>;
}

/// Runs `H` on a claim the host lent; called by the code [`export_handler!`](crate::export_handler)
/// generates.
#[doc(hidden)]
pub fn dispatch<H: Handler>(claim: &mailbox::Claim) -> Result<Vec<u8>, String> {
    H::handle(&Claim::lent(claim))
}

/// Exports a [`Handler`] as this component's `homing:agent/handle` implementation.
///
/// Invoke it once, at the top level of the guest crate, with the handler's type. It needs the
/// `handler` feature (on by default).
#[macro_export]
macro_rules! export_handler {
    ($handler:ty) => {
        const _: () = {
            struct HomingHandlerExport;

            impl $crate::__bindings::handler_world::exports::homing::agent::handle::Guest
                for HomingHandlerExport
            {
                fn handle(
                    claim: &$crate::__bindings::mailbox::Claim,
                ) -> ::core::result::Result<::std::vec::Vec<u8>, ::std::string::String> {
                    $crate::handler::dispatch::<$handler>(claim)
                }
            }

            $crate::__bindings::handler_world::__export_handler_world!(
                HomingHandlerExport with_types_in $crate::__bindings::handler_world
            );
        };
    };
}

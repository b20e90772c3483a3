//! The `agent` world: the host calls your [`Agent`] once, and it claims work itself.
//!
//! [`Agent::run`] loops over [`claim_next`], settles each claim, and returns when
//! `claim_next` gives `None` (nothing arrived in time, the instance used its claim budget, or
//! the host is stopping):
//!
//! ```no_run
//! use homing_guest::{claim_next, Agent};
//!
//! struct Lengths;
//!
//! impl Agent for Lengths {
//!     fn run() -> Result<(), String> {
//!         while let Some(claim) = claim_next(500)? {
//!             claim.complete(claim.payload().len().to_string())?;
//!         }
//!         Ok(())
//!     }
//! }
//!
//! homing_guest::export_agent!(Lengths);
//! ```
//!
//! A claim dropped without being settled is nacked by the host (a retry with backoff), so
//! complete, ack, nack or dead-letter every claim. An `Err` from `run` is logged by the host.

use crate::__bindings::queue;
use crate::claim::Claim;
use crate::error::Error;

/// A guest of the `agent` world: drives its own claim loop.
pub trait Agent {
    /// Claims and settles dispatches until [`claim_next`] gives `None`.
    ///
    /// # Errors
    ///
    /// An `Err` is logged by the host; unsettled claims are nacked.
    fn run() -> Result<(), String>;
}

/// Claims the next dispatch routed to this plugin, waiting up to `wait_ms` milliseconds (capped
/// by the host) for one to arrive.
///
/// `None` means nothing arrived in time, this instance used its claim budget, or the host is
/// stopping: return from [`Agent::run`] then.
///
/// # Errors
///
/// Whatever the host refuses with, for example [`Error::Unavailable`] when the store is
/// unreachable.
pub fn claim_next(wait_ms: u32) -> Result<Option<Claim<'static>>, Error> {
    Ok(queue::claim_next(wait_ms)?.map(Claim::owned))
}

/// Runs `A`; called by the code [`export_agent!`](crate::export_agent) generates.
#[doc(hidden)]
pub fn dispatch<A: Agent>() -> Result<(), String> {
    A::run()
}

/// Exports an [`Agent`] as this component's `run` function.
///
/// Invoke it once, at the top level of the guest crate, with the agent's type. It needs the
/// `agent` feature.
#[macro_export]
macro_rules! export_agent {
    ($agent:ty) => {
        const _: () = {
            struct HomingAgentExport;

            impl $crate::__bindings::agent_world::Guest for HomingAgentExport {
                fn run() -> ::core::result::Result<(), ::std::string::String> {
                    $crate::agent::dispatch::<$agent>()
                }
            }

            $crate::__bindings::agent_world::__export_agent_world!(
                HomingAgentExport with_types_in $crate::__bindings::agent_world
            );
        };
    };
}

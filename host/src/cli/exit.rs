//! The exit codes of `homing`, so scripts can tell failures apart:
//!
//! | code | meaning |
//! | --- | --- |
//! | 0 | success |
//! | 1 | any other failure |
//! | 2 | invalid input: a bad argument, config or payload (also clap's usage errors) |
//! | 3 | not found: no such dispatch, agent or file |
//! | 4 | the store is unavailable (or too busy): retrying later may succeed |
//! | 5 | `enqueue --wait`: the dispatch ended dead-lettered, cancelled or superseded |
//! | 6 | `enqueue --wait`: the timeout passed before the dispatch finished |
//! | 7 | `thread send --on-busy reject`: the thread is busy; nothing was sent |
//!
//! The code is read off the error: a [`Coded`] error says it outright; otherwise the first
//! error in the chain whose kind is known decides (a store error by its variant, a config or
//! input error as invalid input).

use std::process::ExitCode;

use crate::config::ConfigError;
use crate::input::InputError;
use crate::store::StoreError;
use crate::work::OpError;

/// An exit code with its meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 1.
    Failure = 1,
    /// 2.
    Invalid = 2,
    /// 3.
    NotFound = 3,
    /// 4.
    Unavailable = 4,
    /// 5.
    DispatchFailed = 5,
    /// 6.
    TimedOut = 6,
    /// 7.
    Busy = 7,
}

/// An error that carries its exit code.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Coded {
    /// The code.
    pub exit: Exit,
    /// What to print.
    pub message: String,
}

/// An error with exit code `exit`.
pub fn coded(exit: Exit, message: impl Into<String>) -> anyhow::Error {
    Coded {
        exit,
        message: message.into(),
    }
    .into()
}

fn of_store(e: &StoreError) -> Exit {
    match e {
        StoreError::NotFound { .. } => Exit::NotFound,
        StoreError::Busy { .. } => Exit::Busy,
        StoreError::Unavailable(_) | StoreError::Contention(_) => Exit::Unavailable,
        StoreError::Invalid(_) | StoreError::Duplicate { .. } | StoreError::Limit(_) => {
            Exit::Invalid
        }
        _ => Exit::Failure,
    }
}

/// The exit code of a failed command.
pub fn code(e: &anyhow::Error) -> Exit {
    for cause in e.chain() {
        if let Some(c) = cause.downcast_ref::<Coded>() {
            return c.exit;
        }
        if let Some(s) = cause.downcast_ref::<StoreError>() {
            return of_store(s);
        }
        if let Some(op) = cause.downcast_ref::<OpError>() {
            return match op {
                OpError::NotFound(_) => Exit::NotFound,
                OpError::WrongState { .. } => Exit::Failure,
                OpError::Store(s) => of_store(s),
            };
        }
        if cause.is::<ConfigError>() || cause.is::<InputError>() {
            return Exit::Invalid;
        }
        if let Some(io) = cause.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::NotFound
        {
            return Exit::NotFound;
        }
    }
    Exit::Failure
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit as u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_their_codes_through_context() {
        use anyhow::Context;
        let e: anyhow::Result<()> = Err(StoreError::Unavailable("down".into())).context("opening");
        assert_eq!(e.map_err(|e| code(&e)).err(), Some(Exit::Unavailable));
        let e = anyhow::Error::from(OpError::NotFound("x".into()));
        assert_eq!(code(&e), Exit::NotFound);
        assert_eq!(code(&coded(Exit::TimedOut, "late")), Exit::TimedOut);
        assert_eq!(code(&anyhow::anyhow!("other")), Exit::Failure);
        let e = anyhow::Error::from(StoreError::Invalid("payload: too big".into()));
        assert_eq!(code(&e), Exit::Invalid);
    }
}

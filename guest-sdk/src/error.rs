//! [`Error`]: why the host refused a call.
//!
//! It mirrors the WIT variant `homing:agent/types.error` case for case and, like it, is closed,
//! so a guest can match on every case. Two questions cover most handling:
//! [`Error::claim_is_gone`] (stop working on this dispatch, do not retry) and
//! [`Error::is_transient`] (the same call may succeed later). The SDK also reports a few
//! problems it finds itself, before any host call, as [`Error::Invalid`] (a payload that is not
//! UTF-8 or not the expected JSON, an enqueue without a thread outside a claim).
//!
//! A handler returns `Result<Vec<u8>, String>`; `From<Error> for String` lets `?` carry an
//! [`Error`] out of it, which nacks the dispatch with the error's text.

use std::fmt;

use crate::__bindings::types;

/// Why the host (or, for [`Error::Invalid`], sometimes the SDK) refused a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The claim is gone: the lease ran out and another holder may have the work, or the
    /// dispatch was already settled. Stop working on it; do not retry.
    LostClaim(String),
    /// The dispatch's thread was interrupted after it was enqueued; the dispatch is now
    /// superseded. Stop working on it.
    Interrupted(String),
    /// Transient contention in the store; the same call may succeed later.
    Contention(String),
    /// The input is invalid (the text says which field and why); fix it, do not retry as is.
    Invalid(String),
    /// The host's configuration does not allow this (for example enqueueing to an agent this
    /// plugin may not address).
    Denied(String),
    /// A dispatch with this id or dedupe key already exists; the text is the holder's id.
    Duplicate(String),
    /// `append_expected` lost: the thread log's latest sequence is now this value.
    Conflict(u64),
    /// The store is unreachable; the host will retry the dispatch later.
    Unavailable(String),
    /// An unexpected host failure; the text is for logs.
    Internal(String),
}

impl Error {
    /// Whether the claim is gone ([`Error::LostClaim`] or [`Error::Interrupted`]): every
    /// further write through it will fail too, so stop working on the dispatch.
    pub fn claim_is_gone(&self) -> bool {
        matches!(self, Error::LostClaim(_) | Error::Interrupted(_))
    }

    /// Whether the same call may succeed later ([`Error::Contention`] or
    /// [`Error::Unavailable`]).
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Contention(_) | Error::Unavailable(_))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::LostClaim(why) => write!(f, "lost claim: {why}"),
            Error::Interrupted(why) => write!(f, "interrupted: {why}"),
            Error::Contention(why) => write!(f, "contention: {why}"),
            Error::Invalid(why) => write!(f, "invalid: {why}"),
            Error::Denied(why) => write!(f, "denied: {why}"),
            Error::Duplicate(holder) => write!(f, "duplicate of dispatch {holder}"),
            Error::Conflict(latest) => write!(f, "conflict: the thread log's latest is {latest}"),
            Error::Unavailable(why) => write!(f, "store unavailable: {why}"),
            Error::Internal(why) => write!(f, "internal host error: {why}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<types::Error> for Error {
    fn from(error: types::Error) -> Self {
        match error {
            types::Error::LostClaim(why) => Error::LostClaim(why),
            types::Error::Interrupted(why) => Error::Interrupted(why),
            types::Error::Contention(why) => Error::Contention(why),
            types::Error::Invalid(why) => Error::Invalid(why),
            types::Error::Denied(why) => Error::Denied(why),
            types::Error::Duplicate(holder) => Error::Duplicate(holder),
            types::Error::Conflict(latest) => Error::Conflict(latest),
            types::Error::Unavailable(why) => Error::Unavailable(why),
            types::Error::Internal(why) => Error::Internal(why),
        }
    }
}

/// Lets `?` carry an [`Error`] out of [`Handler::handle`](crate::Handler::handle) or
/// [`Agent::run`](crate::Agent::run), whose error type is the WIT's `string`.
impl From<Error> for String {
    fn from(error: Error) -> Self {
        error.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_wit_case_converts_to_the_same_case() {
        let cases = [
            (
                types::Error::LostClaim("a".into()),
                Error::LostClaim("a".into()),
            ),
            (
                types::Error::Interrupted("b".into()),
                Error::Interrupted("b".into()),
            ),
            (
                types::Error::Contention("c".into()),
                Error::Contention("c".into()),
            ),
            (
                types::Error::Invalid("d".into()),
                Error::Invalid("d".into()),
            ),
            (types::Error::Denied("e".into()), Error::Denied("e".into())),
            (
                types::Error::Duplicate("f".into()),
                Error::Duplicate("f".into()),
            ),
            (types::Error::Conflict(7), Error::Conflict(7)),
            (
                types::Error::Unavailable("g".into()),
                Error::Unavailable("g".into()),
            ),
            (
                types::Error::Internal("h".into()),
                Error::Internal("h".into()),
            ),
        ];
        for (wit, expected) in cases {
            assert_eq!(Error::from(wit), expected);
        }
    }

    #[test]
    fn lost_claim_and_interrupted_mean_the_claim_is_gone() {
        assert!(Error::LostClaim(String::new()).claim_is_gone());
        assert!(Error::Interrupted(String::new()).claim_is_gone());
        assert!(!Error::Contention(String::new()).claim_is_gone());
        assert!(Error::Contention(String::new()).is_transient());
        assert!(Error::Unavailable(String::new()).is_transient());
        assert!(!Error::Invalid(String::new()).is_transient());
    }

    #[test]
    fn converting_to_string_keeps_the_case_and_text() {
        assert_eq!(String::from(Error::Denied("no".into())), "denied: no");
        assert_eq!(
            String::from(Error::Conflict(3)),
            "conflict: the thread log's latest is 3"
        );
    }
}

//! Waitpoints: a run waits for a person or a webhook without holding a worker.
//!
//! A waitpoint is a record in the store, named by the guest and unique within its dispatch,
//! that someone outside completes (`POST /v1/waitpoints/{id}/complete`, `homing waitpoint
//! complete`, the dashboard's Approve and Reject buttons), or that times out. A run creates it
//! with [`Claim::waitpoint`] and then either waits in place ([`Claim::await_waitpoint`], which
//! holds the worker: for waits of seconds) or suspends ([`Claim::suspend`]): the attempt ends,
//! the dispatch becomes `waiting` and holds no worker, and once a waitpoint of the dispatch
//! leaves `pending` the dispatch is claimed again, as a resume that counts no attempt.
//!
//! **A resumed run starts from the beginning of the handler**, with the same dispatch: nothing
//! of the earlier instance is kept. It finds its waitpoints again by name (creating one is
//! idempotent) and reads what became of them. Whatever the run did before it suspended, it
//! does again unless it looks first: keep progress in the thread log and skip what is done.
//!
//! [`Claim::wait_for`] does the usual sequence in one call:
//!
//! ```no_run
//! use std::time::Duration;
//! use homing_guest::{Claim, Handler, Wait};
//!
//! struct Deploy;
//!
//! impl Handler for Deploy {
//!     fn handle(claim: &Claim) -> Result<Vec<u8>, String> {
//!         let timeout = Duration::from_secs(3600);
//!         match claim.wait_for("approve-deploy", timeout, &[("action", "deploy")])? {
//!             // The run is over: return now (the return value is ignored). The handler runs
//!             // again from its start once someone answers or the hour is up.
//!             Wait::Suspended => Ok(Vec::new()),
//!             Wait::Completed(answer) => Ok(format!("answered: {}", answer.text()).into_bytes()),
//!             Wait::TimedOut(_) => Ok(b"nobody answered within the hour".to_vec()),
//!             Wait::Cancelled(_) => Ok(b"the wait was cancelled".to_vec()),
//!         }
//!     }
//! }
//! # homing_guest::export_handler!(Deploy);
//! ```
//!
//! **Tokens.** The host mints a bearer token that completes this waitpoint and no other, and
//! hands it to the call that created the waitpoint (and, when a later run finds the waitpoint
//! still pending, to that run's first call: the earlier token may have been lost with the run
//! that made it; both stay valid). The store keeps only a digest, so no later call can return
//! it: hand it on at once, to whoever will complete the waitpoint and to nobody else
//! ([`Claim::wait_for_with`] calls a function with it before suspending). Never log it, append
//! it to the thread log or put it in an output. [`WaitpointToken`]'s `Debug` prints
//! `<redacted>`, and it has no `Display`. Operators complete any waitpoint without its token.
//!
//! **Timeouts are mandatory** (from 1 ms to 30 days): a waitpoint nobody answers times out,
//! and the run resumes and reads [`WaitpointState::TimedOut`].

use std::fmt;
use std::time::Duration;

use crate::__bindings::types;
use crate::claim::{Claim, duration_to_ms};
use crate::error::Error;

pub use crate::__bindings::types::WaitpointState;

/// A waitpoint of the dispatch, as the host answered it.
///
/// `Debug` leaves out the token (see [`Waitpoint::token`]).
#[derive(Clone, PartialEq, Eq)]
pub struct Waitpoint {
    /// Its id (a UUID v7 minted by the store), as the API, the CLI and the dashboard name it.
    pub id: String,
    /// The name the guest gave it; unique within the dispatch.
    pub name: String,
    /// Where it is in its life; it leaves [`WaitpointState::Pending`] once.
    pub state: WaitpointState,
    /// When it times out unless something settles it first (Unix milliseconds, store clock).
    pub timeout_at: u64,
    /// What the completion sent (only when [`WaitpointState::Completed`]).
    pub completion: Option<Vec<u8>>,
    /// When it left pending (Unix milliseconds).
    pub settled_at: Option<u64>,
    /// What made it leave pending: `token`, `operator:<token name>`, `cli`, `timeout`,
    /// `interrupt` or `dispatch-ended`.
    pub settled_by: Option<String>,
    /// The metadata it was created with (shown to operators).
    pub metadata: Vec<(String, String)>,
    /// When it was created (Unix milliseconds).
    pub created_at: u64,
    token: Option<WaitpointToken>,
}

impl Waitpoint {
    /// Whether it is still waiting for a completion, a cancellation or its timeout.
    pub fn is_pending(&self) -> bool {
        self.state == WaitpointState::Pending
    }

    /// What the completion sent; empty unless it was completed (a completion may be empty
    /// too).
    pub fn completion(&self) -> &[u8] {
        self.completion.as_deref().unwrap_or_default()
    }

    /// What the completion sent, as text (invalid UTF-8 replaced); empty unless completed.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(self.completion()).into_owned()
    }

    /// The metadata value under `key`, if it was created with one.
    pub fn metadata(&self, key: &str) -> Option<&str> {
        self.metadata
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The token that completes this waitpoint, and its callback URL: present only in the
    /// answer of the call that created it, or of a later run's first call that found it still
    /// pending. Hand it to whoever will complete the waitpoint; never log it.
    pub fn token(&self) -> Option<&WaitpointToken> {
        self.token.as_ref()
    }

    /// Takes the token out, leaving `None`.
    pub fn take_token(&mut self) -> Option<WaitpointToken> {
        self.token.take()
    }
}

impl fmt::Debug for Waitpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waitpoint")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("state", &self.state)
            .field("timeout_at", &self.timeout_at)
            .field("completion", &self.completion.as_ref().map(Vec::len))
            .field("settled_at", &self.settled_at)
            .field("settled_by", &self.settled_by)
            .field("metadata", &self.metadata)
            .field("created_at", &self.created_at)
            .field("token", &self.token)
            .finish()
    }
}

impl From<types::Waitpoint> for Waitpoint {
    fn from(raw: types::Waitpoint) -> Self {
        let token = raw.token.map(|secret| WaitpointToken {
            secret,
            callback_url: raw.callback_url,
        });
        Waitpoint {
            id: raw.id,
            name: raw.name,
            state: raw.state,
            timeout_at: raw.timeout_at,
            completion: raw.completion,
            settled_at: raw.settled_at,
            settled_by: raw.settled_by,
            metadata: raw.metadata,
            created_at: raw.created_at,
            token,
        }
    }
}

/// The bearer token that completes one waitpoint, and the URL that carries it.
///
/// A secret: `Debug` prints `<redacted>`, there is no `Display`, and the only way to the value
/// is the explicit [`WaitpointToken::secret`] (and [`WaitpointToken::callback_url`], which holds
/// it too).
#[derive(Clone, PartialEq, Eq)]
pub struct WaitpointToken {
    secret: String,
    callback_url: Option<String>,
}

impl WaitpointToken {
    /// The token (`hwp_...`): sent as `Authorization: Bearer <token>` (or `?token=`) to
    /// `POST /v1/waitpoints/{id}/complete`, it completes this waitpoint and no other.
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// The URL that completes the waitpoint with this token (`{public_url}/v1/waitpoints/
    /// {id}/complete?token=...`) when the host's `[api] public_url` is set: POST the result to
    /// it. It holds the token, so it is as secret.
    pub fn callback_url(&self) -> Option<&str> {
        self.callback_url.as_deref()
    }
}

impl fmt::Debug for WaitpointToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WaitpointToken(<redacted>)")
    }
}

/// What [`Claim::wait_for`] found.
#[must_use = "after `Wait::Suspended` the handler must return at once"]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    /// The waitpoint is pending and this run is suspended: return from the handler now (its
    /// return value is ignored). Every further call through the claim fails with
    /// [`Error::LostClaim`]. The dispatch runs again from the start once the waitpoint (or
    /// another of its waitpoints) leaves pending.
    Suspended,
    /// It was completed; [`Waitpoint::completion`] holds what was sent and
    /// [`Waitpoint::settled_by`] who sent it (`token`, `operator:<name>`, `cli`).
    Completed(Waitpoint),
    /// Its timeout passed before anyone completed it.
    TimedOut(Waitpoint),
    /// An operator cancelled it, its thread was interrupted, or its dispatch ended.
    Cancelled(Waitpoint),
}

impl Wait {
    /// Whether the run suspended (return now).
    pub fn is_suspended(&self) -> bool {
        matches!(self, Wait::Suspended)
    }

    /// The settled waitpoint, or `None` when the run suspended.
    pub fn waitpoint(&self) -> Option<&Waitpoint> {
        match self {
            Wait::Suspended => None,
            Wait::Completed(w) | Wait::TimedOut(w) | Wait::Cancelled(w) => Some(w),
        }
    }

    /// What a settled waitpoint became; `None` while it is pending.
    fn settled(waitpoint: Waitpoint) -> Option<Wait> {
        match waitpoint.state {
            WaitpointState::Pending => None,
            WaitpointState::Completed => Some(Wait::Completed(waitpoint)),
            WaitpointState::TimedOut => Some(Wait::TimedOut(waitpoint)),
            WaitpointState::Cancelled => Some(Wait::Cancelled(waitpoint)),
        }
    }
}

impl Claim<'_> {
    /// The waitpoint named `name` of this dispatch, created if it does not exist yet: pending,
    /// timing out `timeout` from now (whole milliseconds; at least 1 ms, at most 30 days), with
    /// `metadata` (shown to operators, at most 16 KiB). A run that is retried or resumed gets
    /// the waitpoint it created before, in its current state (its timeout and metadata as they
    /// were first given).
    ///
    /// The answer carries a [`Waitpoint::token`] only when this call created the waitpoint, or
    /// is the first call of a later run to find it still pending.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] for a blank name or one over 256 bytes, a bad timeout or metadata
    /// over 16 KiB; [`Error::Denied`] past 256 waitpoints for the dispatch;
    /// [`Error::LostClaim`], [`Error::Interrupted`].
    pub fn waitpoint(
        &self,
        name: &str,
        timeout: Duration,
        metadata: &[(&str, &str)],
    ) -> Result<Waitpoint, Error> {
        let metadata: Vec<(String, String)> = metadata
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Ok(self
            .raw()
            .waitpoint(name, duration_to_ms(timeout), &metadata)?
            .into())
    }

    /// Every waitpoint of this dispatch, oldest first, without tokens.
    ///
    /// # Errors
    ///
    /// Whatever the host refuses with, notably [`Error::Unavailable`].
    pub fn waitpoints(&self) -> Result<Vec<Waitpoint>, Error> {
        Ok(self
            .raw()
            .waitpoints()?
            .into_iter()
            .map(Waitpoint::from)
            .collect())
    }

    /// Waits in place until waitpoint `id` (its id, not its name) leaves pending, up to `wait`
    /// (whole milliseconds, capped at about 49 days and cut to end a second before the
    /// dispatch's deadline), and returns it as it then is: still pending when the time ran out
    /// or the host wants the guest to stop (see [`Claim::stop_requested`]).
    ///
    /// The wait holds the worker and the instance: use it for answers expected within seconds,
    /// and [`Claim::suspend`] for anything longer.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] when `id` is not a waitpoint of this dispatch; [`Error::LostClaim`],
    /// [`Error::Interrupted`].
    pub fn await_waitpoint(&self, id: &str, wait: Duration) -> Result<Waitpoint, Error> {
        let wait_ms = u32::try_from(wait.as_millis()).unwrap_or(u32::MAX);
        Ok(self.raw().await_waitpoint(id, wait_ms)?.into())
    }

    /// Ends this run without finishing the dispatch: the dispatch becomes `waiting`, holding
    /// no lease, worker or instance, and keeps its id and its thread's turn. It is claimed
    /// again, as a resume that counts no attempt, once one of its waitpoints leaves pending (at
    /// once if one already did during this run); the resumed run starts from the beginning.
    ///
    /// After it, return from the handler (its return value is ignored); in the agent world,
    /// carry on with [`claim_next`](crate::claim_next). Every later call through this claim
    /// fails with [`Error::LostClaim`].
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] when the dispatch has no pending waitpoint and none left pending
    /// during this run; [`Error::Denied`] when it has resumed `max_resumes` times;
    /// [`Error::LostClaim`], [`Error::Interrupted`].
    pub fn suspend(&self) -> Result<(), Error> {
        Ok(self.raw().suspend()?)
    }

    /// Waits for the waitpoint `name` without holding a worker: creates it (or finds it, on a
    /// resumed or retried run), and either returns what became of it or, while it is pending,
    /// suspends the run and returns [`Wait::Suspended`], after which the handler returns at
    /// once. The resumed run calls `wait_for` again with the same name and gets the outcome.
    ///
    /// `timeout` and `metadata` apply when the waitpoint is created, as in
    /// [`Claim::waitpoint`]. The token the host hands out is dropped: an operator completes
    /// the waitpoint (the dashboard's Approve and Reject buttons, `homing waitpoint complete`,
    /// the API with an operator token). To hand the token to someone, use
    /// [`Claim::wait_for_with`].
    ///
    /// # Errors
    ///
    /// As [`Claim::waitpoint`] and [`Claim::suspend`].
    pub fn wait_for(
        &self,
        name: &str,
        timeout: Duration,
        metadata: &[(&str, &str)],
    ) -> Result<Wait, Error> {
        self.wait_for_with(name, timeout, metadata, |_, _| Ok::<(), Error>(()))
    }

    /// [`Claim::wait_for`], calling `hand_out` with the waitpoint and its token whenever the
    /// host hands one out (the call that creates the waitpoint, and the first call of a later
    /// run that finds it still pending), before the run suspends: the claim is still live
    /// there, so it may append to the thread log (never the token), enqueue, or send the token
    /// or its callback URL over HTTP to whoever will complete the waitpoint.
    ///
    /// When `hand_out` fails, its error is returned and the run does not suspend: returning it
    /// from the handler nacks the dispatch, and the retry finds the waitpoint still pending and
    /// gets a fresh token to hand out again (earlier tokens stay valid).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use homing_guest::{Claim, Wait};
    /// # fn send_to_reviewer(url: &str) -> Result<(), String> { Ok(()) }
    /// # fn approve(claim: &Claim) -> Result<Vec<u8>, String> {
    /// let wait = claim.wait_for_with(
    ///     "approve",
    ///     Duration::from_secs(24 * 3600),
    ///     &[("tool", "send_email")],
    ///     |waitpoint, token| {
    ///         let url = token.callback_url().ok_or("no [api] public_url on this host")?;
    ///         claim.append(format!("asked a reviewer (waitpoint {})", waitpoint.id))?;
    ///         send_to_reviewer(url)
    ///     },
    /// )?;
    /// let Wait::Completed(answer) = wait else {
    ///     return Ok(Vec::new()); // suspended, timed out or cancelled
    /// };
    /// # Ok(answer.completion().to_vec())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Claim::wait_for`], and whatever `hand_out` fails with.
    pub fn wait_for_with<E: From<Error>>(
        &self,
        name: &str,
        timeout: Duration,
        metadata: &[(&str, &str)],
        hand_out: impl FnOnce(&Waitpoint, &WaitpointToken) -> Result<(), E>,
    ) -> Result<Wait, E> {
        let mut waitpoint = self.waitpoint(name, timeout, metadata)?;
        if let Some(token) = waitpoint.take_token() {
            hand_out(&waitpoint, &token)?;
        }
        if let Some(settled) = Wait::settled(waitpoint) {
            return Ok(settled);
        }
        // A completion that lands between the look above and this call is not lost: the host
        // then resumes the dispatch at once.
        self.suspend()?;
        Ok(Wait::Suspended)
    }
}

#[cfg(feature = "json")]
impl Waitpoint {
    /// Parses what the completion sent as JSON into `T` (the dashboard's buttons send
    /// `{"approved": true}` or `{"approved": false}`).
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] when it was not completed or what it holds is not JSON of `T`'s
    /// shape.
    pub fn completion_json<'de, T: serde::Deserialize<'de>>(&'de self) -> Result<T, Error> {
        let Some(bytes) = self.completion.as_deref() else {
            return Err(Error::Invalid(format!(
                "waitpoint {} was not completed (it is {:?})",
                self.name, self.state
            )));
        };
        serde_json::from_slice(bytes).map_err(|e| {
            Error::Invalid(format!(
                "the completion of waitpoint {} is not the expected JSON ({}): {e}",
                self.name,
                std::any::type_name::<T>()
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(state: WaitpointState, token: Option<&str>) -> types::Waitpoint {
        types::Waitpoint {
            id: "w1".into(),
            name: "approve".into(),
            state,
            timeout_at: 10,
            completion: (state == WaitpointState::Completed)
                .then(|| br#"{"approved":true}"#.to_vec()),
            settled_at: None,
            settled_by: None,
            metadata: vec![("tool".into(), "add".into())],
            created_at: 1,
            token: token.map(str::to_owned),
            callback_url: token
                .map(|t| format!("https://h.example/v1/waitpoints/w1/complete?token={t}")),
        }
    }

    #[test]
    fn debug_output_never_shows_the_token_or_its_url() {
        let w = Waitpoint::from(raw(WaitpointState::Pending, Some("hwp_secret")));
        let shown = format!("{w:?} {:?}", w.token());
        assert!(!shown.contains("hwp_secret"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
        let token = w.token().map(WaitpointToken::secret);
        assert_eq!(token, Some("hwp_secret"));
        assert!(
            w.token()
                .and_then(WaitpointToken::callback_url)
                .is_some_and(|url| url.ends_with("token=hwp_secret"))
        );
    }

    #[test]
    fn a_waitpoint_without_a_token_has_none() {
        let w = Waitpoint::from(raw(WaitpointState::Pending, None));
        assert!(w.token().is_none());
        assert!(w.is_pending());
        assert_eq!(w.metadata("tool"), Some("add"));
        assert_eq!(w.metadata("other"), None);
    }

    #[test]
    fn settled_states_map_to_their_outcome_and_pending_to_none() {
        let settled = |state| Wait::settled(Waitpoint::from(raw(state, None)));
        assert!(settled(WaitpointState::Pending).is_none());
        let completed = settled(WaitpointState::Completed);
        assert!(matches!(completed, Some(Wait::Completed(_))));
        assert_eq!(
            completed
                .as_ref()
                .and_then(Wait::waitpoint)
                .map(Waitpoint::text),
            Some(r#"{"approved":true}"#.to_owned())
        );
        assert!(matches!(
            settled(WaitpointState::TimedOut),
            Some(Wait::TimedOut(_))
        ));
        assert!(matches!(
            settled(WaitpointState::Cancelled),
            Some(Wait::Cancelled(_))
        ));
        assert!(Wait::Suspended.is_suspended());
        assert!(Wait::Suspended.waitpoint().is_none());
    }

    #[test]
    fn a_waitpoint_that_was_not_completed_has_an_empty_completion() {
        let w = Waitpoint::from(raw(WaitpointState::TimedOut, None));
        assert!(w.completion().is_empty());
        assert_eq!(w.text(), "");
    }
}

//! Memoized steps: run a piece of work once per dispatch, and on a later run of the same
//! dispatch (a retry after a failure, a resume after a waitpoint) get its result back without
//! running it again.
//!
//! [`Claim::step`] (feature `json`) names the work, runs the closure, stores what it returned as
//! JSON with the host's `step-put`, and returns it. A later run of the dispatch that reaches the
//! same call finds the stored value with `step-get` and returns it without calling the closure
//! (see the example on [`Claim::step`]). [`Claim::step_bytes`] does the same with raw bytes,
//! without serde.
//!
//! **Names and repeats.** A step is stored under its name. The same name may be used more than
//! once in a run (in a loop, say): within one claim the n-th call with name `x` uses the key `x`
//! for the first call, then `x#2`, `x#3`, ... So a run that makes the same calls in the same
//! order gets the same values back; keep a name free of `#` so it cannot meet such a key. Keys
//! are at most 256 bytes (the host refuses longer ones with [`Error::Invalid`]).
//!
//! **When steps last.** Steps are durable only when the plugin's config sets `journal =
//! "steps"` or `journal = "run"`. With `journal = "off"` (the default) the host stores nothing
//! and every run calls every closure again: the helpers behave the same, they just remember
//! nothing. A closure that fails stores nothing, so the next run tries it again. A step's value
//! is kept with the dispatch (across its retries and resumes) and removed with it; a new
//! dispatch starts with none.

use std::cell::RefCell;
use std::collections::HashMap;

use crate::claim::Claim;
use crate::error::Error;

/// How many times each step name was used in one claim, to give each use its own key.
#[derive(Debug, Default)]
pub(crate) struct StepKeys {
    seen: RefCell<HashMap<String, u32>>,
}

impl StepKeys {
    /// The key for the next use of `name`: `name` the first time, then `name#2`, `name#3`, ...
    pub(crate) fn next(&self, name: &str) -> String {
        let mut seen = self.seen.borrow_mut();
        let count = seen.entry(name.to_owned()).or_insert(0);
        *count = count.saturating_add(1);
        if *count == 1 {
            name.to_owned()
        } else {
            format!("{name}#{count}")
        }
    }
}

impl Claim<'_> {
    /// Runs `work` once per dispatch under `name` and keeps its bytes: on a later run of the
    /// dispatch (a retry, a resume) the same call returns the stored bytes without calling
    /// `work`. See the [`step`](crate::step) module for how repeated names are keyed and when
    /// values are kept (only with `journal = "steps"` or `"run"`).
    ///
    /// When `work` fails, nothing is stored and its error is returned.
    ///
    /// # Errors
    ///
    /// Whatever `work` fails with; [`Error::Invalid`] for a blank name or a key over 256
    /// bytes, or bytes over the host's `max_payload`; [`Error::LostClaim`],
    /// [`Error::Interrupted`] (the value was not stored: stop).
    pub fn step_bytes<E: From<Error>>(
        &self,
        name: &str,
        work: impl FnOnce() -> Result<Vec<u8>, E>,
    ) -> Result<Vec<u8>, E> {
        let key = self.step_keys().next(name);
        if let Some(stored) = self.raw().step_get(&key).map_err(Error::from)? {
            return Ok(stored);
        }
        let value = work()?;
        self.raw().step_put(&key, &value).map_err(Error::from)?;
        Ok(value)
    }
}

#[cfg(feature = "json")]
impl Claim<'_> {
    /// Runs `work` once per dispatch under `name` and keeps its result as JSON: on a later run
    /// of the dispatch (a retry, a resume) the same call returns the stored value without
    /// calling `work`. See the [`step`](crate::step) module for how repeated names are keyed and
    /// when values are kept (only with `journal = "steps"` or `"run"`; with `"off"` `work` runs
    /// every time).
    ///
    /// When `work` fails, nothing is stored and its error is returned.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use homing_guest::{Claim, Error, Handler, Wait};
    ///
    /// # fn draft_reply(_: &str) -> Result<String, Error> { Ok(String::new()) }
    /// struct Reply;
    ///
    /// impl Handler for Reply {
    ///     fn handle(claim: &Claim) -> Result<Vec<u8>, String> {
    ///         // Asked once: the resumed run below gets the same draft back from the host.
    ///         let draft: String = claim.step("draft", || draft_reply(claim.payload_str()?))?;
    ///         match claim.wait_for("approve", Duration::from_secs(3600), &[])? {
    ///             Wait::Completed(_) => Ok(draft.into_bytes()),
    ///             _ => Ok(Vec::new()),
    ///         }
    ///     }
    /// }
    /// # homing_guest::export_handler!(Reply);
    /// ```
    ///
    /// # Errors
    ///
    /// Whatever `work` fails with; [`Error::Invalid`] when the value does not serialize, a
    /// stored value does not parse as `T` (the step's type changed between versions), for a
    /// blank name, a key over 256 bytes or a value over the host's `max_payload`;
    /// [`Error::LostClaim`], [`Error::Interrupted`] (the value was not stored: stop).
    pub fn step<T, E>(&self, name: &str, work: impl FnOnce() -> Result<T, E>) -> Result<T, E>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
        E: From<Error>,
    {
        let key = self.step_keys().next(name);
        if let Some(stored) = self.raw().step_get(&key).map_err(Error::from)? {
            return serde_json::from_slice(&stored).map_err(|e| {
                E::from(Error::Invalid(format!(
                    "the stored value of step {key} is not the expected JSON ({}): {e}",
                    std::any::type_name::<T>()
                )))
            });
        }
        let value = work()?;
        let bytes = crate::json::to_vec(&value)?;
        self.raw().step_put(&key, &bytes).map_err(Error::from)?;
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::StepKeys;

    #[test]
    fn the_first_use_of_a_name_is_the_name_and_repeats_are_numbered_from_two() {
        let keys = StepKeys::default();
        assert_eq!(keys.next("fetch"), "fetch");
        assert_eq!(keys.next("fetch"), "fetch#2");
        assert_eq!(keys.next("summarize"), "summarize");
        assert_eq!(keys.next("fetch"), "fetch#3");
        assert_eq!(keys.next("summarize"), "summarize#2");
    }

    #[test]
    fn each_claim_counts_on_its_own() {
        let first = StepKeys::default();
        assert_eq!(first.next("x"), "x");
        assert_eq!(first.next("x"), "x#2");
        let second = StepKeys::default();
        assert_eq!(second.next("x"), "x");
    }
}

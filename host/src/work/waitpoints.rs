//! Completing and cancelling waitpoints, and how a reader sees one: what the API, the
//! dashboard and the CLI do with a waitpoint, written once.
//!
//! Who may complete a waitpoint is decided by its caller: an operator (an API token of that
//! role, an operator's dashboard session, the CLI, which acts with the authority of whoever
//! can read the config) may complete any; anyone else presents the waitpoint's own token,
//! which [`authorize`] checks. The store keeps only digests of tokens; the check hashes what
//! was presented and compares it with every stored digest, and with fixed dummies up to
//! [`MAX_TOKEN_DIGESTS`], in constant time, so neither the comparison nor its length tells
//! how much of a guess was right, or whether the id exists: an unknown id takes the same path
//! against the dummies alone and is answered as a wrong token is.
//!
//! [`complete`] and [`cancel`] make the store call (W2, W4), check the result against the
//! limit in force, and count each settlement this process makes in the metrics.

use std::future::Future;
use std::time::Instant;

use serde_json::{Value, json};
use subtle::{Choice, ConstantTimeEq};

use crate::config::Config;
use crate::store::model::check_name;
use crate::store::waitpoints::{MAX_TOKEN_DIGESTS, token_digest};
use crate::store::{Settlement, Store, StoreError, Waitpoint};

/// `settled_by` of a completion by the waitpoint's own token.
pub const BY_TOKEN: &str = "token";
/// `settled_by` of a completion or cancellation through the CLI.
pub const BY_CLI: &str = "cli";

/// `settled_by` of an operator named `name` (an API token or a dashboard session).
pub fn by_operator(name: &str) -> String {
    format!("operator:{name}")
}

/// Why a waitpoint was not completed or cancelled.
#[derive(Debug, thiserror::Error)]
pub enum WaitpointError {
    /// The id names no waitpoint or the token presented is not one of its own: one answer for
    /// both, so a caller without a right token learns nothing of which.
    #[error("no waitpoint has this id and token")]
    Unauthorized,
    /// No waitpoint has this id (said only to an operator).
    #[error("no waitpoint `{0}`")]
    NotFound(String),
    /// It is not pending: completed, timed out or cancelled before (the record, unchanged).
    #[error("waitpoint `{}` is {}", .0.id, .0.state)]
    Settled(Box<Waitpoint>),
    /// The result is over the limit in force ([`max_result`]).
    #[error("result: {size} bytes exceeds the limit of {limit} bytes ([host] max_payload)")]
    TooLarge {
        /// The result's size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The store refused or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The largest result a completion may carry: `[host] max_payload`, clamped to what the
/// store keeps.
pub fn max_result(config: &Config, store: &Store) -> u64 {
    config.host.max_payload.min(store.waitpoints.max_result())
}

/// A digest no token hashes to (not hex, so not the digest of anything): what the slots
/// beyond a waitpoint's digests, and every slot of an unknown id, are compared with.
const DUMMY_DIGEST: &[u8; 64] = b"................................................................";

/// Whether `presented` is a token of `w`: its SHA-256 against each of `w`'s digests and
/// dummies up to [`MAX_TOKEN_DIGESTS`], in constant time. `w` of `None` (an unknown id) runs
/// the same comparisons and matches nothing.
pub fn token_matches(w: Option<&Waitpoint>, presented: &str) -> bool {
    let digest = token_digest(presented);
    let digests = w.map_or(&[][..], |w| w.token_digests.as_slice());
    let mut found = Choice::from(0);
    for i in 0..digests.len().max(MAX_TOKEN_DIGESTS) {
        let (stored, real) = match digests.get(i) {
            Some(d) => (d.as_bytes(), 1),
            None => (&DUMMY_DIGEST[..], 0),
        };
        found |= stored.ct_eq(digest.as_bytes()) & Choice::from(real);
    }
    bool::from(found & Choice::from(u8::from(w.is_some())))
}

/// The waitpoint `id` when one of `presented` is one of its tokens. An id that is not a
/// well-formed name is looked up as no waitpoint (nothing is read), and answered alike.
///
/// # Errors
///
/// [`WaitpointError::Unauthorized`] for an unknown id or tokens none of which is its own;
/// the store's failure.
pub async fn authorize(
    store: &Store,
    id: &str,
    presented: &[&str],
) -> Result<Waitpoint, WaitpointError> {
    let w = if check_name("id", id).is_ok() {
        store.waitpoints.waitpoint(id).await?
    } else {
        None
    };
    // Every candidate is compared, whatever matched before.
    let matched = presented
        .iter()
        .fold(false, |matched, p| token_matches(w.as_ref(), p) | matched);
    match w {
        Some(w) if matched => Ok(w),
        _ => Err(WaitpointError::Unauthorized),
    }
}

/// Completes the pending waitpoint `id` with `result`, as `settled_by` (the caller has
/// checked the token or the role): W2, which resumes its dispatch when that was waiting.
/// Returns the completed record, counted in the metrics.
///
/// # Errors
///
/// [`WaitpointError::TooLarge`] over [`max_result`] (nothing changes);
/// [`WaitpointError::NotFound`]; [`WaitpointError::Settled`] when it is not pending (also when
/// its timeout passed: it is timed out then); the store's failure.
pub async fn complete(
    store: &Store,
    config: &Config,
    id: &str,
    result: Vec<u8>,
    settled_by: &str,
) -> Result<Waitpoint, WaitpointError> {
    let limit = max_result(config, store);
    let size = result.len() as u64;
    if size > limit {
        return Err(WaitpointError::TooLarge { size, limit });
    }
    check_id(id)?;
    settled(
        id,
        store
            .waitpoints
            .complete_waitpoint(id, result, settled_by)
            .await,
    )
}

/// Cancels the pending waitpoint `id` as `settled_by` (an operator): W4, which resumes its
/// dispatch when that was waiting (its run reads `cancelled`). Counted in the metrics.
///
/// # Errors
///
/// [`WaitpointError::NotFound`]; [`WaitpointError::Settled`] when it is not pending; the
/// store's failure.
pub async fn cancel(
    store: &Store,
    id: &str,
    settled_by: &str,
) -> Result<Waitpoint, WaitpointError> {
    check_id(id)?;
    settled(id, store.waitpoints.cancel_waitpoint(id, settled_by).await)
}

/// An id that is no well-formed name names no waitpoint.
fn check_id(id: &str) -> Result<(), WaitpointError> {
    check_name("id", id).map_err(|_| WaitpointError::NotFound(id.to_owned()))
}

/// What a settlement by this process comes to: the record it settled (counted), or why not.
fn settled(id: &str, outcome: Result<Settlement, StoreError>) -> Result<Waitpoint, WaitpointError> {
    match outcome {
        Ok(Settlement::Settled(w)) => {
            crate::telemetry::waitpoint_settled(&w);
            Ok(w)
        }
        Ok(Settlement::Already(w)) => Err(WaitpointError::Settled(Box::new(w))),
        Err(StoreError::NotFound { .. }) => Err(WaitpointError::NotFound(id.to_owned())),
        Err(e) => Err(e.into()),
    }
}

/// The cursor of a list page that ends at `w`: `<created_at>:<id>`.
pub fn cursor(w: &Waitpoint) -> String {
    format!("{}:{}", w.created_at, w.id)
}

/// Reads a cursor [`cursor`] wrote.
///
/// # Errors
///
/// A sentence saying what a cursor looks like.
pub fn parse_cursor(text: &str) -> Result<(u64, String), String> {
    text.trim()
        .split_once(':')
        .and_then(|(at, id)| Some((at.parse::<u64>().ok()?, id)))
        .filter(|(_, id)| check_name("id", id).is_ok())
        .map(|(at, id)| (at, id.to_owned()))
        .ok_or_else(|| "not a waitpoint cursor (`<created_at>:<id>`, as a page gives it)".into())
}

/// A waitpoint as readers see it (the API, the CLI's JSON): every field but its token
/// digests. The result is text, or `{"base64": ...}`.
pub fn view(w: &Waitpoint) -> Value {
    json!({
        "id": w.id,
        "dispatch": w.dispatch,
        "thread": w.thread,
        "agent": w.agent,
        "name": w.name,
        "state": w.state.as_str(),
        "metadata": w.metadata,
        "timeout_at": w.timeout_at,
        "result": w.result.as_deref().map(bytes),
        "settled_by": w.settled_by,
        "created_at": w.created_at,
        "settled_at": w.settled_at,
        "created_claim": w.created_claim,
    })
}

fn bytes(data: &[u8]) -> Value {
    use base64::Engine;
    match std::str::from_utf8(data) {
        Ok(text) => Value::String(text.to_owned()),
        Err(_) => json!({ "base64": base64::engine::general_purpose::STANDARD.encode(data) }),
    }
}

/// Waitpoint `id` of `dispatch` (on `thread`) once it left `pending`, or as it is when `until`
/// passed or `stop` resolved first. The thread's watch is registered before the first read,
/// so a settlement in between is never waited past.
///
/// # Errors
///
/// `Invalid` when `id` is not a waitpoint of `dispatch`; when the store fails.
pub async fn wait_settled(
    store: &Store,
    thread: &str,
    dispatch: &str,
    id: &str,
    until: Instant,
    stop: impl Future<Output = ()>,
) -> Result<Waitpoint, StoreError> {
    let mut watch = store.inbox.watch(thread);
    tokio::pin!(stop);
    loop {
        let w = store
            .waitpoints
            .waitpoint(id)
            .await?
            .filter(|w| w.dispatch == dispatch)
            .ok_or_else(|| {
                StoreError::Invalid(format!(
                    "id: `{}` is not a waitpoint of dispatch `{dispatch}`",
                    id.escape_debug()
                ))
            })?;
        if !w.is_pending() || Instant::now() >= until {
            return Ok(w.public());
        }
        tokio::select! {
            () = watch.changed() => {}
            () = &mut stop => return Ok(w.public()),
            () = tokio::time::sleep_until(until.into()) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::store::waitpoints::WaitpointState;

    fn waitpoint(tokens: &[&str]) -> Waitpoint {
        Waitpoint {
            id: "w1".into(),
            dispatch: "d1".into(),
            thread: "t".into(),
            agent: "a".into(),
            name: "approve".into(),
            state: WaitpointState::Pending,
            token_digests: tokens.iter().map(|t| token_digest(t)).collect(),
            metadata: [("k".to_owned(), "v".to_owned())].into(),
            timeout_at: 10,
            result: Some(vec![0xff, 0]),
            settled_by: None,
            created_at: 1,
            settled_at: None,
            created_claim: 1,
        }
    }

    #[test]
    fn a_token_matches_only_its_own_waitpoint() {
        let w = waitpoint(&["hwp_a", "hwp_b"]);
        assert!(token_matches(Some(&w), "hwp_a"));
        assert!(token_matches(Some(&w), "hwp_b"));
        assert!(!token_matches(Some(&w), "hwp_c"));
        assert!(!token_matches(Some(&w), ""));
        assert!(
            !token_matches(None, "hwp_a"),
            "an unknown id matches nothing"
        );
        // Neither a digest nor the dummy works as a token.
        assert!(!token_matches(Some(&w), &token_digest("hwp_a")));
        let dummy = std::str::from_utf8(DUMMY_DIGEST).unwrap();
        assert!(!token_matches(Some(&waitpoint(&[])), dummy));
        let mut odd = waitpoint(&[]);
        odd.token_digests = vec![dummy.to_owned()];
        assert!(!token_matches(Some(&odd), dummy));
    }

    #[test]
    fn cursors_round_trip_and_views_have_no_digests() {
        let w = waitpoint(&["hwp_a"]);
        assert_eq!(parse_cursor(&cursor(&w)), Ok((1, "w1".to_owned())));
        for bad in ["", "x:y", "12", "12:", "-1:w"] {
            assert!(parse_cursor(bad).is_err(), "{bad}");
        }
        let v = view(&w);
        assert!(v.get("token_digests").is_none(), "{v}");
        assert!(!v.to_string().contains(&token_digest("hwp_a")));
        assert_eq!(v["result"]["base64"], "/wA=");
        assert_eq!(v["state"], "pending");
        assert_eq!(by_operator("ops"), "operator:ops");
    }
}

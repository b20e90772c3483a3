//! The rules of flow control (the contract, section 13), pure functions of stored state and
//! the clock shared by both backends: a bucket refills continuously; a block of tokens is taken
//! for a short while and lapses; a slot is held by a live claim (or, for a request slot, until
//! its own expiry), so a host that dies while holding one frees it when its lease runs out,
//! without anyone having to release it; a pause holds back its agent or its key.

use crate::store::model::limits::{Bucket, Holder, Pause, Rate};
use crate::store::model::{Dispatch, Status, check_concurrency_key, check_name};
use crate::store::{StoreError, StoreResult};

impl Bucket {
    /// The tokens held at `now` under `rate`, starting from `stored` (full when `None`).
    pub fn level(stored: Option<Bucket>, rate: &Rate, now: u64) -> f64 {
        let burst = f64::from(rate.burst.max(1));
        match stored {
            None => burst,
            Some(b) => {
                let elapsed = now.saturating_sub(b.at) as f64;
                let tokens = if b.tokens.is_finite() { b.tokens } else { 0.0 };
                (tokens + elapsed / rate.ms_per_token()).clamp(0.0, burst)
            }
        }
    }

    /// Takes one token at `now`: the bucket to store, or the time the next token arrives.
    ///
    /// # Errors
    ///
    /// The time (milliseconds) at which a token will be there.
    pub fn take(stored: Option<Bucket>, rate: &Rate, now: u64) -> Result<Bucket, u64> {
        let level = Bucket::level(stored, rate, now);
        if level >= 1.0 {
            Ok(Bucket {
                tokens: level - 1.0,
                at: now,
            })
        } else {
            let wait = ((1.0 - level) * rate.ms_per_token()).ceil().max(1.0);
            Err(now.saturating_add(wait as u64))
        }
    }
}

/// How long a block of tokens lasts: a host (or an embedded store's writer) takes enough of a
/// scope's tokens for this long at the rate (at least one, at most the burst) for its claims,
/// and the tokens it has not spent by then lapse.
pub const BLOCK_MS: u64 = 100;

/// Tokens taken from a shared bucket for claims and not spent yet.
#[derive(Debug, Clone, Copy, Default)]
pub struct Block {
    /// Tokens left.
    pub left: u32,
    /// When the tokens left lapse.
    pub until: u64,
}

impl Block {
    /// Takes a block of `rate`'s tokens out of the bucket `stored` at `now`: [`BLOCK_MS`]
    /// worth, at least one, at most the burst, fewer when the bucket holds fewer. The bucket
    /// to store and how many were taken, or when the next token arrives.
    ///
    /// # Errors
    ///
    /// The time (milliseconds) at which a token will be there.
    pub fn take(stored: Option<Bucket>, rate: &Rate, now: u64) -> Result<(Bucket, u32), u64> {
        let want = block_size(rate);
        let level = Bucket::level(stored, rate, now);
        let take = if level >= f64::from(want) {
            want
        } else {
            // The level is within 0 and the burst, a u32.
            level.floor() as u32
        };
        if take == 0 {
            return Err(Bucket::take(stored, rate, now)
                .err()
                .unwrap_or(now.saturating_add(1)));
        }
        Ok((
            Bucket {
                tokens: level - f64::from(take),
                at: now,
            },
            take,
        ))
    }

    /// The block after `left` more tokens were taken at `at`: added to what `old` has left
    /// (tokens given back by a claim that did not land stay), lapsing with the older tokens,
    /// so none is spent later than a block after its take.
    pub fn refilled(old: Option<Block>, left: u32, at: u64) -> Block {
        let fresh = Block {
            left,
            until: at.saturating_add(BLOCK_MS),
        };
        match old {
            Some(old) if old.left > 0 && old.until > at => Block {
                left: old.left.saturating_add(fresh.left),
                until: old.until.min(fresh.until),
            },
            _ => fresh,
        }
    }

    /// Whether the bucket `stored` holds at least two blocks of `rate`'s tokens at `now`: a
    /// block taken now is then all but sure to be there when the take lands, whoever else
    /// takes one meanwhile.
    pub fn plenty(stored: Option<Bucket>, rate: &Rate, now: u64) -> bool {
        Bucket::level(stored, rate, now) >= 2.0 * f64::from(block_size(rate))
    }

    /// Spends one token at `now`, if one is left and has not lapsed.
    pub fn spend(&mut self, now: u64) -> bool {
        if self.left > 0 && self.until > now {
            self.left -= 1;
            true
        } else {
            false
        }
    }

    /// Whether a token is left at `now`.
    pub fn has(&self, now: u64) -> bool {
        self.left > 0 && self.until > now
    }
}

/// How many tokens of `rate` a block takes: [`BLOCK_MS`] worth, at least one, at most the
/// burst.
fn block_size(rate: &Rate) -> u32 {
    let worth = (BLOCK_MS as f64 / rate.ms_per_token()).floor();
    let burst = rate.burst.max(1);
    if worth >= f64::from(burst) {
        burst
    } else if worth >= 1.0 {
        worth as u32
    } else {
        1
    }
}

impl Holder {
    /// Whether the slot is still held at `now`: a request slot until its expiry; a claim slot
    /// while `current` (the dispatch's record as the store has it) is the same claim, still
    /// claimed and within its lease.
    pub fn live(&self, current: Option<&Dispatch>, now: u64) -> bool {
        match current {
            Some(d) => self.held(
                d.status == Status::Claimed,
                d.claims,
                d.claim.as_ref().map(|c| c.lease_until),
                now,
            ),
            None => self.claims == 0 && self.until > now,
        }
    }

    /// [`Holder::live`] from the three fields it reads of the holder's record: whether it is
    /// claimed, its claim number and its lease.
    pub fn held(&self, claimed: bool, claims: u32, lease_until: Option<u64>, now: u64) -> bool {
        if self.claims == 0 {
            return self.until > now;
        }
        // The lease boundary of the rules (`lease_live`): a lease still runs at its last
        // millisecond.
        if claimed && claims == self.claims && lease_until.is_some_and(|l| l >= now) {
            return true;
        }
        // Written ahead of its claim, which has not landed (yet): held for as long as that
        // claim could live. A claim that landed is judged by its record alone.
        claims < self.claims && self.until > now
    }
}

/// The stored pause of `agent` and `key` (or the agent's whole pause), as a name.
pub fn pause_name(agent: &str, key: Option<&str>) -> String {
    match key {
        Some(key) => format!("{agent}\u{1f}{key}"),
        None => agent.to_owned(),
    }
}

/// Whether `pauses` holds `d` back: its agent is paused, or its key is.
pub fn paused(pauses: &[Pause], agent: &str, key: Option<&str>) -> bool {
    pauses
        .iter()
        .any(|p| p.agent == agent && (p.key.is_none() || p.key.as_deref() == key))
}

/// The checks every backend makes of a pause before storing it.
///
/// # Errors
///
/// `Invalid` naming the agent, the key or the reason.
pub fn check_pause(agent: &str, key: Option<&str>, reason: &str) -> StoreResult<()> {
    check_name("agent", agent).map_err(StoreError::Invalid)?;
    if let Some(key) = key {
        check_concurrency_key(key).map_err(StoreError::Invalid)?;
    }
    if reason.len() > 1024 {
        return Err(StoreError::Invalid(format!(
            "reason is {} bytes; at most 1024",
            reason.len()
        )));
    }
    if reason.chars().any(char::is_control) {
        return Err(StoreError::Invalid(
            "reason holds a control character".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn rates_parse_in_every_unit_and_refuse_the_rest() {
        assert_eq!("60/min".parse::<Rate>().unwrap(), Rate::new(60, 60_000));
        assert_eq!("10/s".parse::<Rate>().unwrap(), Rate::new(10, 1_000));
        assert_eq!("500/minute".parse::<Rate>().unwrap().per_ms, 60_000);
        assert_eq!("1000/h".parse::<Rate>().unwrap().per_ms, 3_600_000);
        assert_eq!("3/250ms".parse::<Rate>().unwrap().per_ms, 250);
        assert_eq!("5/day".parse::<Rate>().unwrap().to_string(), "5/day");
        for bad in ["60/fortnight", "60", "x/min", "0/min", "-1/min", "5/0s", ""] {
            assert!(bad.parse::<Rate>().is_err(), "{bad}");
        }
        assert!(
            "60/fortnight"
                .parse::<Rate>()
                .unwrap_err()
                .contains("60/fortnight")
        );
    }

    #[test]
    fn a_bucket_starts_full_refills_and_says_when_the_next_token_comes() {
        let rate = Rate::new(60, 60_000).with_burst(2);
        let b = Bucket::take(None, &rate, 0).unwrap();
        let b = Bucket::take(Some(b), &rate, 0).unwrap();
        assert_eq!(Bucket::take(Some(b), &rate, 0), Err(1_000));
        assert_eq!(Bucket::take(Some(b), &rate, 500), Err(1_000));
        let b = Bucket::take(Some(b), &rate, 1_000).unwrap();
        assert!(b.tokens.abs() < 1e-9);
        // Never above the burst, whatever the quiet spell.
        assert!((Bucket::level(Some(b), &rate, 10_000_000) - 2.0).abs() < 1e-9);
    }

    #[test]
    fn a_claim_slot_lives_with_its_claim_and_a_request_slot_until_its_expiry() {
        let new = crate::store::NewDispatch::new("a", "t", "");
        let d = crate::store::rules::queued_record("d", &new, 0, 0);
        let crate::store::rules::Take::Claimed(d) =
            crate::store::rules::take(d, (0, 0), "w", 1_000, 10, false)
        else {
            panic!("not claimed");
        };
        let held = Holder::of_claim(&d);
        assert!(held.live(Some(&d), 500));
        assert!(!held.live(Some(&d), 2_000), "lease ran out");
        assert!(!held.live(None, 500), "gone");
        let mut again = d.clone();
        again.claims += 1;
        assert!(!held.live(Some(&again), 500), "a later claim");
        let req = Holder {
            id: "r".into(),
            claims: 0,
            until: 100,
            slots: 0,
        };
        assert!(req.live(None, 99) && !req.live(None, 100));
        // A slot written ahead of its claim: held while the claim may still land, then by the
        // claim itself.
        let queued = crate::store::rules::queued_record("d", &new, 0, 0);
        let ahead = Holder::ahead_of_claim(&d);
        assert_eq!((ahead.claims, ahead.until), (1, 1_010));
        assert!(ahead.live(Some(&queued), 500), "the claim may still land");
        assert!(!ahead.live(Some(&queued), 1_010), "it could no longer live");
        assert!(ahead.live(Some(&d), 500), "landed");
        assert!(!ahead.live(Some(&again), 500), "a later claim");
        assert!(!ahead.live(None, 500), "gone");
    }

    #[test]
    fn a_pause_holds_back_its_agent_or_only_its_key() {
        let p = |key: Option<&str>| Pause {
            agent: "a".into(),
            key: key.map(str::to_owned),
            reason: String::new(),
            at: 0,
        };
        assert!(paused(&[p(None)], "a", Some("k")));
        assert!(paused(&[p(Some("k"))], "a", Some("k")));
        assert!(!paused(&[p(Some("k"))], "a", Some("j")));
        assert!(!paused(&[p(Some("k"))], "a", None));
        assert!(!paused(&[p(None)], "b", None));
    }
}

//! Versions in the store (the contract, docs/contract.md, section 14): which version of its
//! plugin each claim of a dispatch ran, and the pin that sends a dispatch's later claims back to
//! the version its run started on.
//!
//! A claimer offers the versions it can run (its newest first, then the older ones it keeps);
//! the store decides inside the claim's atomic step which of them the claim runs, records it on
//! the dispatch, and passes over a dispatch pinned to a version the claimer does not offer until
//! that dispatch has been available for the offer's `foreign_after_ms` (then the claimer's
//! newest takes it, and the pin moves). The rules are pure functions shared by both backends.

use super::model::Dispatch;
/// What a dispatch records of the versions it ran lives with the record (`model`).
pub use super::model::{MAX_VERSION_RUNS, VersionRun};

/// One version a claimer can run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfferedVersion {
    /// The component's content hash, short form.
    pub version: String,
    /// The plugin's `version` label, when it has one.
    pub label: Option<String>,
}

/// The versions a claim may run a dispatch on, and whether runs stay on theirs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    /// Newest first; never empty when offered.
    pub versions: Vec<OfferedVersion>,
    /// `pin = "run"`: a dispatch that already ran goes back to the version it last ran, when it
    /// is offered. With `false` (`pin = "none"`) every claim takes the newest.
    pub pin: bool,
    /// How long (milliseconds) a dispatch pinned to a version not offered is left, from the time
    /// it became available, for a claimer that has it; after that the newest offered takes it.
    pub foreign_after_ms: u64,
}

/// What a claim does with a dispatch under an offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// Run it on the offered version at this index.
    Run(usize),
    /// Pass it over: it is pinned to a version this claimer does not have, and is still left to
    /// those that do.
    Elsewhere,
}

impl Offer {
    /// The version `d` runs on if claimed at `now` under this offer.
    pub fn choose(&self, d: &Dispatch, now: u64) -> Choice {
        let Some(pinned) = pinned(d).filter(|_| self.pin) else {
            return Choice::Run(0);
        };
        match self.versions.iter().position(|v| v.version == pinned) {
            Some(index) => Choice::Run(index),
            None if now >= d.available_at.saturating_add(self.foreign_after_ms) => Choice::Run(0),
            None => Choice::Elsewhere,
        }
    }

    /// Records on the claimed `d` that this claim runs the offered version at `index` (a claim
    /// records one entry; the oldest entries beyond [`MAX_VERSION_RUNS`] go).
    pub fn record(&self, d: &mut Dispatch, index: usize) {
        let Some(offered) = self.versions.get(index).or_else(|| self.versions.first()) else {
            return;
        };
        d.versions.push(VersionRun {
            claim: d.claims,
            version: offered.version.clone(),
            label: offered.label.clone(),
        });
        let excess = d.versions.len().saturating_sub(MAX_VERSION_RUNS);
        d.versions.drain(..excess);
    }
}

/// The version `d` is pinned to: the one its latest claim ran.
pub fn pinned(d: &Dispatch) -> Option<&str> {
    d.versions.last().map(|v| v.version.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::NewDispatch;
    use crate::store::rules::queued_record;

    fn offer(versions: &[&str], pin: bool) -> Offer {
        Offer {
            versions: versions
                .iter()
                .map(|v| OfferedVersion {
                    version: (*v).into(),
                    label: None,
                })
                .collect(),
            pin,
            foreign_after_ms: 1_000,
        }
    }

    fn dispatch() -> Dispatch {
        queued_record("d", &NewDispatch::new("a", "t", Vec::new()), 0, 100)
    }

    #[test]
    fn a_fresh_dispatch_takes_the_newest_and_a_ran_one_goes_back_to_its_version() {
        let mut d = dispatch();
        let o = offer(&["new", "old"], true);
        assert_eq!(o.choose(&d, 100), Choice::Run(0));
        d.claims = 1;
        o.record(&mut d, 1);
        assert_eq!(pinned(&d), Some("old"));
        assert_eq!(o.choose(&d, 100), Choice::Run(1));
        assert_eq!(
            offer(&["new", "old"], false).choose(&d, 100),
            Choice::Run(0)
        );
    }

    #[test]
    fn a_dispatch_pinned_elsewhere_is_left_until_its_wait_is_over() {
        let mut d = dispatch();
        d.claims = 1;
        offer(&["gone"], true).record(&mut d, 0);
        let o = offer(&["new"], true);
        assert_eq!(o.choose(&d, d.available_at + 999), Choice::Elsewhere);
        assert_eq!(o.choose(&d, d.available_at + 1_000), Choice::Run(0));
    }

    #[test]
    fn the_entries_are_capped_and_the_pin_is_the_last() {
        let mut d = dispatch();
        let o = offer(&["a", "b"], true);
        for claim in 0..40u32 {
            d.claims = claim + 1;
            o.record(&mut d, (claim % 2) as usize);
        }
        assert_eq!(d.versions.len(), MAX_VERSION_RUNS);
        assert_eq!(d.versions.last().map(|v| v.claim), Some(40));
        assert_eq!(pinned(&d), Some("b"));
    }
}

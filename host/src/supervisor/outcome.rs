//! How one run of a dispatch ended, as this host saw it: a closed set, so the metric's
//! `outcome` label, the `dispatch finished` log line, the span and the run's report all name the
//! same few values.

use std::fmt;

use crate::claim::Settlement;

/// How one run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    /// The guest acked or completed it.
    Acked,
    /// The guest nacked it (the store requeued it or dead-lettered it).
    Nacked,
    /// Dead-lettered: by the guest, or by the host's nack at the attempt limit.
    DeadLettered,
    /// Its thread was interrupted while it ran.
    Superseded,
    /// The guest suspended it to wait on its waitpoints.
    Suspended,
    /// An upstream status (`park_on`) parked it: queued again without an attempt.
    Parked,
    /// It outlived `drain_timeout` on a replaced version: stopped, queued again without an
    /// attempt.
    Drained,
    /// The handler returned and the host completed it.
    Completed,
    /// The handler failed or trapped and the host nacked it for a retry.
    Retrying,
    /// The lease was lost (or the host shut down) while it ran: the sweeper reclaims it.
    LeaseLost,
    /// The host could not settle it (the store failed): its lease runs out and it is reclaimed.
    Unsettled,
    /// The claim could not be taken back from the instance.
    Lost,
    /// An `agent`-world run returned.
    RunReturned,
    /// An `agent`-world run returned an error.
    RunFailed,
    /// An `agent`-world run trapped.
    RunTrapped,
}

impl Outcome {
    /// Its name, as metrics, logs, spans and the report give it.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Acked => "acked",
            Outcome::Nacked => "nacked",
            Outcome::DeadLettered => "dead-lettered",
            Outcome::Superseded => "superseded",
            Outcome::Suspended => "suspended",
            Outcome::Parked => "parked",
            Outcome::Drained => "drained",
            Outcome::Completed => "completed",
            Outcome::Retrying => "retrying",
            Outcome::LeaseLost => "lease-lost",
            Outcome::Unsettled => "unsettled",
            Outcome::Lost => "lost",
            Outcome::RunReturned => "run-returned",
            Outcome::RunFailed => "run-failed",
            Outcome::RunTrapped => "run-trapped",
        }
    }

    /// Whether it counts as a failure on the dispatch's span.
    pub fn failed(self) -> bool {
        !matches!(
            self,
            Outcome::Acked
                | Outcome::Completed
                | Outcome::Superseded
                | Outcome::Suspended
                | Outcome::Parked
                | Outcome::Drained
                | Outcome::RunReturned
        )
    }
}

impl From<Settlement> for Outcome {
    fn from(settled: Settlement) -> Outcome {
        match settled {
            Settlement::Acked => Outcome::Acked,
            Settlement::Nacked => Outcome::Nacked,
            Settlement::DeadLettered => Outcome::DeadLettered,
            Settlement::Superseded => Outcome::Superseded,
            Settlement::Suspended => Outcome::Suspended,
            Settlement::Parked => Outcome::Parked,
            Settlement::Drained => Outcome::Drained,
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_settlement_keeps_its_name() {
        for s in [
            Settlement::Acked,
            Settlement::Nacked,
            Settlement::DeadLettered,
            Settlement::Superseded,
            Settlement::Suspended,
            Settlement::Parked,
            Settlement::Drained,
        ] {
            assert_eq!(Outcome::from(s).as_str(), s.as_str());
        }
    }
}

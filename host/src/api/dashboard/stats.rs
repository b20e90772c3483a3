//! What the overview shows beyond the store's current counts: each agent's throughput over the
//! last [`MINUTES`] minutes and the hosts seen lately. The store keeps no history of either,
//! so this process samples it: every [`SAMPLE_EVERY`] (and on every overview), it reads the
//! store's counts and adds the growth of each agent's settled total (acked, dead-lettered,
//! cancelled, superseded) to the current minute; and it notes the hosts holding claims. A count
//! that shrinks (terminal records purged) adds nothing. The figures start empty when the
//! process starts, and count the work of every host on the store, not only this one.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::store::{DispatchRow, ListFilter, Status, StatusCount, Store};

/// Minutes of throughput kept and drawn.
pub(super) const MINUTES: usize = 15;
/// How often the background sampler reads the store.
const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// The most claimed dispatches read per sample to find their hosts.
pub(super) const CLAIM_SCAN: usize = 1000;
const MINUTE_MS: u64 = 60_000;

#[derive(Debug, Default)]
struct Inner {
    /// Each agent's settled total at the last sample.
    last: Option<BTreeMap<String, u64>>,
    /// Settled per agent, per minute (minute index since the epoch), oldest first.
    minutes: VecDeque<(u64, BTreeMap<String, u64>)>,
    /// Host → when it was last seen holding a claim (ms since the epoch).
    hosts: BTreeMap<String, u64>,
}

/// The samples of this process.
#[derive(Debug, Default)]
pub(super) struct Stats(Mutex<Inner>);

/// The host part of a claimant (`host-id/agent`).
pub(super) fn host_of(claimed_by: &str) -> &str {
    claimed_by
        .rsplit_once('/')
        .map_or(claimed_by, |(host, _)| host)
}

impl Stats {
    /// Adds the growth of settled totals since the last sample to the minute of `now`.
    pub fn observe_counts(&self, now: u64, counts: &[StatusCount]) {
        let mut totals: BTreeMap<String, u64> = BTreeMap::new();
        for c in counts.iter().filter(|c| c.status.is_terminal()) {
            *totals.entry(c.agent.clone()).or_default() += c.count;
        }
        let Ok(mut inner) = self.0.lock() else {
            return;
        };
        let minute = now / MINUTE_MS;
        if let Some(last) = inner.last.take() {
            let mut grown = BTreeMap::new();
            for (agent, total) in &totals {
                let before = last.get(agent).copied().unwrap_or(0);
                if *total > before {
                    grown.insert(agent.clone(), total - before);
                }
            }
            if inner.minutes.back().is_none_or(|(m, _)| *m != minute) {
                inner.minutes.push_back((minute, BTreeMap::new()));
            }
            if let Some((_, bucket)) = inner.minutes.back_mut() {
                for (agent, n) in grown {
                    *bucket.entry(agent).or_default() += n;
                }
            }
        }
        let oldest = minute.saturating_sub(MINUTES as u64 - 1);
        while inner.minutes.front().is_some_and(|(m, _)| *m < oldest) {
            inner.minutes.pop_front();
        }
        inner.last = Some(totals);
    }

    /// Notes the hosts holding these claims.
    pub fn observe_claims(&self, now: u64, claimed: &[DispatchRow]) {
        let Ok(mut inner) = self.0.lock() else {
            return;
        };
        for d in claimed {
            if let Some(by) = &d.claimed_by {
                inner.hosts.insert(host_of(by).to_owned(), now);
            }
        }
        let horizon = now.saturating_sub(MINUTES as u64 * MINUTE_MS);
        inner.hosts.retain(|_, seen| *seen >= horizon);
    }

    /// Settled per minute for `agent`, oldest of the last [`MINUTES`] first.
    pub fn series(&self, now: u64, agent: &str) -> [u64; MINUTES] {
        let mut out = [0; MINUTES];
        let Ok(inner) = self.0.lock() else {
            return out;
        };
        let minute = now / MINUTE_MS;
        for (m, bucket) in &inner.minutes {
            let back = minute.saturating_sub(*m) as usize;
            if back < MINUTES
                && let Some(n) = bucket.get(agent)
            {
                out[MINUTES - 1 - back] = *n;
            }
        }
        out
    }

    /// Hosts seen holding claims in the last [`MINUTES`] minutes, with when.
    pub fn hosts(&self) -> Vec<(String, u64)> {
        self.0
            .lock()
            .map(|inner| inner.hosts.iter().map(|(h, t)| (h.clone(), *t)).collect())
            .unwrap_or_default()
    }

    /// Reads the store once and records what it found.
    pub async fn sample(&self, store: &Store) {
        let now = store.now();
        if let Ok(counts) = store.mailbox.counts().await {
            self.observe_counts(now, &counts);
        }
        let filter = ListFilter {
            statuses: vec![Status::Claimed],
            limit: CLAIM_SCAN,
            ..ListFilter::default()
        };
        if let Ok(claimed) = store.mailbox.list_rows(&filter).await {
            self.observe_claims(now, &claimed);
        }
    }
}

/// Samples the store every [`SAMPLE_EVERY`] until `stop`.
pub(super) async fn run(
    stats: Arc<Stats>,
    store: Store,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        stats.sample(&store).await;
        tokio::select! {
            () = tokio::time::sleep(SAMPLE_EVERY) => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(agent: &str, status: Status, count: u64) -> StatusCount {
        StatusCount {
            agent: agent.into(),
            status,
            count,
        }
    }

    #[test]
    fn throughput_is_the_growth_of_settled_totals_per_minute() {
        let stats = Stats::default();
        let t0 = 100 * MINUTE_MS;
        stats.observe_counts(t0, &[count("a", Status::Acked, 10)]);
        assert_eq!(
            stats.series(t0, "a"),
            [0; MINUTES],
            "the first sample is a baseline"
        );
        stats.observe_counts(
            t0 + 1000,
            &[
                count("a", Status::Acked, 13),
                count("a", Status::DeadLetter, 1),
                count("a", Status::Queued, 50),
            ],
        );
        stats.observe_counts(t0 + MINUTE_MS, &[count("a", Status::Acked, 15)]);
        let s = stats.series(t0 + MINUTE_MS, "a");
        assert_eq!((s[MINUTES - 2], s[MINUTES - 1]), (4, 1));
        // A purge shrinks the total: nothing is added, and the next growth counts from there.
        stats.observe_counts(t0 + MINUTE_MS + 1, &[count("a", Status::Acked, 2)]);
        stats.observe_counts(t0 + MINUTE_MS + 2, &[count("a", Status::Acked, 5)]);
        assert_eq!(stats.series(t0 + MINUTE_MS, "a")[MINUTES - 1], 4);
        // Sixteen minutes on, it has all scrolled out.
        let later = t0 + 16 * MINUTE_MS;
        stats.observe_counts(later, &[count("a", Status::Acked, 5)]);
        assert_eq!(stats.series(later, "a"), [0; MINUTES]);
        assert_eq!(host_of("web-1/echo"), "web-1");
        assert_eq!(host_of("solo"), "solo");
    }
}

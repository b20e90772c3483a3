//! Hosts whose clocks are hours off, on one real `nats-server`: the store's clock is the
//! server's (docs/contract.md, "The store's clock"), so a host six hours ahead neither takes a
//! live lease nor fires a schedule's slot before its time, and a host two hours behind writes
//! leases the others read as live. Both tests failed while each host read its own wall clock:
//! the first host reclaimed the second's claim at once, and the slots fired six hours early.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use homing::store::nats::{NatsConfig, NatsStore};
use homing::store::schedules::{META_SCHEDULED_FOR, ScheduleDef, Source, Spec};
use homing::store::{Clock, NewDispatch, ServerClock, SharedClock, Status, Store, SystemClock};
use homing::work::schedules as sched;

use crate::conformance::schedules::{def, fired, tick_once};
use crate::natsd::NatsServer;

const HOUR: i64 = 3_600_000;

/// This machine's wall clock moved by `offset_ms`: a host whose clock is off.
#[derive(Debug)]
struct Skewed(i64);

impl Clock for Skewed {
    fn now_ms(&self) -> u64 {
        SystemClock.now_ms().saturating_add_signed(self.0)
    }
}

/// A host as `homing run` opens it: its clock follows the server, over a wall clock `offset_ms`
/// off.
async fn host(server: &NatsServer, prefix: &str, offset_ms: i64) -> Store {
    let config = NatsConfig {
        urls: vec![server.url()],
        prefix: prefix.into(),
        ..NatsConfig::default()
    };
    let clock: SharedClock = ServerClock::over(Arc::new(Skewed(offset_ms)));
    NatsStore::open(&config, clock).await.expect("open a host")
}

/// How far `store`'s clock is from this machine's (the server's) clock, in milliseconds.
fn off(store: &Store) -> i64 {
    let real = i64::try_from(SystemClock.now_ms()).expect("a time");
    i64::try_from(store.now()).expect("a time") - real
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_clock_runs_ahead_does_not_take_a_live_lease() {
    let server = NatsServer::start();
    let ahead = host(&server, "clk-lease", 6 * HOUR).await;
    let behind = host(&server, "clk-lease", -2 * HOUR).await;
    // The host behind claims with a 30 s lease: by its own clock, the lease would have ended
    // two hours ago for everyone else.
    behind
        .mailbox
        .enqueue(NewDispatch::new("agent", "t", b"x".to_vec()).with_id("d"))
        .await
        .expect("enqueue");
    let claimed = behind
        .mailbox
        .claim("agent", "behind", 30_000)
        .await
        .expect("claim")
        .expect("the dispatch");
    assert_eq!(claimed.id, "d");

    // The host ahead sweeps for expired leases, as its supervisor does, at its store's time.
    for store in [&ahead, &behind] {
        let reclaimed = store
            .mailbox
            .reclaim_expired(store.now(), 100)
            .await
            .expect("reclaim");
        assert!(
            reclaimed.is_empty(),
            "a live 30 s lease was reclaimed: {reclaimed:?}"
        );
    }
    let d = ahead
        .mailbox
        .load("d")
        .await
        .expect("get")
        .expect("the dispatch");
    assert_eq!(d.status, Status::Claimed);
    assert_eq!(
        d.claim.as_ref().map(|c| c.claimed_by.as_str()),
        Some("behind"),
        "still the first holder's"
    );
    assert!(
        ahead
            .mailbox
            .claim("agent", "ahead", 30_000)
            .await
            .expect("claim")
            .is_none(),
        "the host ahead claimed live work"
    );
    for (name, store) in [("ahead", &ahead), ("behind", &behind)] {
        assert!(
            off(store).abs() < 5_000,
            "the {name} host's store clock is {} ms off the server's",
            off(store)
        );
    }
}

fn every_second(name: &str) -> ScheduleDef {
    def(
        name,
        Spec::Every {
            every_ms: 1_000,
            anchor_ms: 0,
        },
        "UTC",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_six_hours_ahead_and_two_behind_fire_each_slot_once_and_never_early() {
    let server = NatsServer::start();
    let hosts = [
        host(&server, "clk-sched", 6 * HOUR).await,
        host(&server, "clk-sched", -2 * HOUR).await,
    ];
    // Created on the host ahead: its slots start from the server's now, not six hours on.
    sched::create(&hosts[0], every_second("sec"), Source::Api)
        .await
        .expect("create the schedule");

    // Both hosts take turns at the ticks for four seconds of real time, as their tick workers
    // do (they poll; so does this loop).
    let until = SystemClock.now_ms() + 4_000;
    let mut turn = 0usize;
    let mut ticks = 0;
    while SystemClock.now_ms() < until {
        let store = &hosts[turn % hosts.len()];
        turn += 1;
        if !tick_once(store, &format!("host-{}", turn % 2)).await {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        ticks += 1;

        // Every slot fired so far is at or before the real time now.
        let now = SystemClock.now_ms();
        for d in fired(store).await {
            let slot = d
                .metadata
                .get(META_SCHEDULED_FOR)
                .and_then(|s| sched::parse_time(s).ok())
                .expect("a fire time");
            assert!(
                slot <= now,
                "slot {} fired {} ms before its time",
                d.id,
                slot - now
            );
        }
    }
    let all = fired(&hosts[1]).await;
    let slots: BTreeSet<String> = all.iter().map(|d| d.id.clone()).collect();
    assert_eq!(slots.len(), all.len(), "a slot fired twice: {all:?}");
    assert!(
        (3..=5).contains(&all.len()),
        "{} slots fired in four seconds ({ticks} ticks): {slots:?}",
        all.len()
    );
    let record = hosts[1]
        .schedules
        .schedule("sec")
        .await
        .expect("read")
        .expect("the schedule")
        .schedule;
    assert!(
        record.outcomes.iter().all(|o| o.skipped.is_none()),
        "no slot was skipped or caught up: {:?}",
        record.outcomes
    );
}

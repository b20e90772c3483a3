//! Schedules (the contract, section 16) on each backend: the record's compare-and-set, and the
//! ticks that ride the mailbox, driven by the [`ManualClock`] across several instances (hosts)
//! with a tick left half done, clocks stepped back and forward, daylight-saving transitions,
//! an overlapping run, a pause and a removal.

use std::collections::BTreeMap;

use homing::store::schedules::{
    Catchup, DEFAULT_MAX_BUFFERED, Dst, Fold, Gap, Overlap, Schedule, ScheduleDef, SkipReason,
    Source, Spec, ThreadChoice, dispatch_id, fire_label,
};
use homing::store::waitpoints::token_digest;
use homing::store::{Clock, Dispatch, Fence, ListFilter, NewWaitpoint, Status, Store, StoreError};
use homing::work::schedules::{self as sched, TICK_AGENT, fire_dispatch};

use super::{Env, Factory, retry};

/// An hour, in milliseconds.
const HOUR: u64 = 3_600_000;

/// A schedule of `sched-agent` with a thread per fire and `allow`, firing `spec` in `tz`.
pub fn def(name: &str, spec: Spec, tz: &str) -> ScheduleDef {
    ScheduleDef {
        name: name.into(),
        agent: "sched-agent".into(),
        payload: b"tick".to_vec(),
        metadata: BTreeMap::new(),
        // Nothing claims these dispatches: they stay queued, live, so overlap must allow.
        thread: ThreadChoice::PerFire,
        spec,
        timezone: tz.into(),
        start_at: None,
        end_at: None,
        jitter_ms: 0,
        overlap: Overlap::Allow,
        max_buffered: DEFAULT_MAX_BUFFERED,
        catchup: Catchup::default(),
        dst: Dst::default(),
        pause_on_failure: false,
    }
}

/// UTC milliseconds of an RFC 3339 time.
fn t(s: &str) -> u64 {
    sched::parse_time(s).expect("a time")
}

/// Runs every tick due now, each claimed by the next host in turn, until none is due; returns
/// how many ran.
async fn run_ticks(stores: &[Store]) -> usize {
    let mut ran = 0;
    let mut idle_rounds = 0;
    let mut i = 0;
    while idle_rounds < stores.len() {
        let store = &stores[i % stores.len()];
        i += 1;
        if !tick_once(store, &format!("host-{}", i % stores.len())).await {
            idle_rounds += 1;
            continue;
        }
        idle_rounds = 0;
        ran += 1;
        assert!(ran < 10_000, "ticks never ran out");
    }
    ran
}

/// Claims one due tick as `host` would, runs it and acks it; `false` when none is due.
pub async fn tick_once(store: &Store, host: &str) -> bool {
    let Some(d) = store
        .mailbox
        .claim(TICK_AGENT, host, 30_000)
        .await
        .expect("claim a tick")
    else {
        return false;
    };
    let name = d.metadata.get("schedule").cloned().unwrap_or_default();
    sched::tick(store, &name, &d.id).await.expect("a tick");
    let token = d
        .claim
        .as_ref()
        .map(|c| c.token.clone())
        .unwrap_or_default();
    store
        .mailbox
        .ack(&d.id, &token)
        .await
        .expect("ack the tick");
    true
}

/// The dispatches of the schedule's agent, by id.
pub async fn fired(store: &Store) -> Vec<Dispatch> {
    let mut out = store
        .mailbox
        .list(&ListFilter {
            agent: Some("sched-agent".into()),
            limit: 1000,
            ..ListFilter::default()
        })
        .await
        .expect("list");
    assert!(out.len() < 1000, "one page holds them all");
    out.sort_by(|a, b| a.id.cmp(&b.id));
    out
}

async fn record(store: &Store, name: &str) -> Schedule {
    store
        .schedules
        .schedule(name)
        .await
        .expect("read")
        .expect("the schedule")
        .schedule
}

/// Compare-and-set: a create expects nothing, a write the revision it read; a lost race is
/// `Contention` and changes nothing; a deleted name can be created again.
pub async fn schedule_records_are_written_under_a_compare_and_set_of_their_revision<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let store = env.open().await;
    let now = env.clock.now_ms();
    let s = Schedule {
        def: def("cas", Spec::Cron("0 * * * *".into()), "UTC"),
        source: Source::Api,
        watermark: now,
        tick: None,
        ticks: 0,
        last_dispatch: None,
        buffered: Default::default(),
        paused: None,
        outcomes: Default::default(),
        created_at: now,
        updated_at: now,
    };
    let r1 = store.schedules.put_schedule(&s, 0).await.expect("create");
    assert!(r1 > 0);
    assert!(matches!(
        store.schedules.put_schedule(&s, 0).await,
        Err(StoreError::Contention(_))
    ));
    let mut s2 = s.clone();
    s2.watermark += 1;
    let r2 = store.schedules.put_schedule(&s2, r1).await.expect("update");
    assert_ne!(r1, r2);
    assert!(matches!(
        store.schedules.put_schedule(&s, r1).await,
        Err(StoreError::Contention(_))
    ));
    let read = store
        .schedules
        .schedule("cas")
        .await
        .expect("read")
        .expect("there");
    assert_eq!((read.schedule, read.revision), (s2.clone(), r2));
    // Another instance sees the same record.
    let other = env.open().await;
    let seen = other
        .schedules
        .schedule("cas")
        .await
        .expect("read")
        .expect("there");
    assert_eq!(seen.revision, r2);
    let mut more = s.clone();
    more.def.name = "cas-b".into();
    other
        .schedules
        .put_schedule(&more, 0)
        .await
        .expect("create b");
    let names: Vec<String> = store
        .schedules
        .schedules(None, 10, None)
        .await
        .expect("list")
        .into_iter()
        .map(|s| s.schedule.def.name)
        .collect();
    assert_eq!(names, ["cas", "cas-b"]);
    let after: Vec<String> = store
        .schedules
        .schedules(Some("cas"), 10, None)
        .await
        .expect("list")
        .into_iter()
        .map(|s| s.schedule.def.name)
        .collect();
    assert_eq!(after, ["cas-b"]);
    assert!(matches!(
        store.schedules.delete_schedule("cas", Some(r1)).await,
        Err(StoreError::Contention(_))
    ));
    assert!(
        store
            .schedules
            .delete_schedule("cas", Some(r2))
            .await
            .expect("delete")
    );
    assert!(
        !store
            .schedules
            .delete_schedule("cas", None)
            .await
            .expect("again")
    );
    assert!(
        store
            .schedules
            .schedule("cas")
            .await
            .expect("read")
            .is_none()
    );
    store
        .schedules
        .put_schedule(&s, 0)
        .await
        .expect("created again");

    // A page bounded in bytes ends at the record that reaches the budget, passing over a
    // deleted name; the next page starts after its last.
    let mut big = s.clone();
    big.def.payload = vec![b'x'; 10_000];
    for name in ["big-a", "big-b", "big-c", "big-d"] {
        big.def.name = name.into();
        store
            .schedules
            .put_schedule(&big, 0)
            .await
            .expect("create a big one");
    }
    assert!(
        store
            .schedules
            .delete_schedule("big-b", None)
            .await
            .expect("delete")
    );
    let page = |after: Option<&'static str>| {
        let store = store.clone();
        async move {
            store
                .schedules
                .schedules(after, 10, Some(15_000))
                .await
                .expect("list")
                .into_iter()
                .map(|s| s.schedule.def.name)
                .collect::<Vec<String>>()
        }
    };
    assert_eq!(page(Some("b")).await, ["big-a", "big-c"]);
    assert_eq!(page(Some("big-c")).await, ["big-d", "cas", "cas-b"]);
    let first = store
        .schedules
        .schedules(Some("b"), 10, Some(1))
        .await
        .expect("list");
    assert_eq!(first.len(), 1, "the first record is always taken");
}

/// Every half hour of a day fires exactly once across three hosts taking ticks in turn, with
/// one tick left after its first step (its slot's dispatch enqueued, nothing else: a host
/// killed there) and one run twice (a host killed after its write, before its ack).
pub async fn every_slot_of_a_day_fires_once_across_three_hosts_with_a_tick_left_half_done<
    F: Factory,
>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let stores = env.open_many(3).await;
    env.clock.set(t("2026-12-07T00:00:00Z"));
    let d = def("day", Spec::Cron("*/30 * * * *".into()), "UTC");
    sched::create(&stores[0], d.clone(), Source::Api)
        .await
        .expect("create");
    let mut half_done = false;
    let mut twice = false;
    for step in 1..=48u64 {
        env.clock.set(t("2026-12-07T00:00:00Z") + step * HOUR / 2);
        if step == 10 && !half_done {
            // A host claims the tick, enqueues the slot's dispatch (step 1), and dies.
            let tick = stores[1]
                .mailbox
                .claim(TICK_AGENT, "doomed", 1_000)
                .await
                .expect("claim")
                .expect("a tick due");
            stores[1]
                .mailbox
                .enqueue(fire_dispatch(
                    &d,
                    env.clock.now_ms(),
                    homing::store::schedules::FireKind::OnTime,
                ))
                .await
                .expect("step 1");
            half_done = true;
            // Its lease runs out; a sweep gives the tick back.
            env.clock.advance(2_000);
            stores[2]
                .mailbox
                .reclaim_expired(env.clock.now_ms(), 100)
                .await
                .expect("reclaim");
            assert_eq!(
                stores[0]
                    .mailbox
                    .load(&tick.id)
                    .await
                    .expect("load")
                    .map(|d| d.status),
                Some(Status::Queued)
            );
        }
        if step == 20 && !twice {
            // A host runs the whole tick and dies before its ack: the tick runs again.
            let tick = stores[2]
                .mailbox
                .claim(TICK_AGENT, "doomed", 1_000)
                .await
                .expect("claim")
                .expect("a tick due");
            sched::tick(&stores[2], "day", &tick.id)
                .await
                .expect("tick");
            twice = true;
            env.clock.advance(2_000);
            stores[0]
                .mailbox
                .reclaim_expired(env.clock.now_ms(), 100)
                .await
                .expect("reclaim");
        }
        run_ticks(&stores).await;
    }
    let all = fired(&stores[0]).await;
    let ids: Vec<&str> = all.iter().map(|d| d.id.as_str()).collect();
    let want: Vec<String> = (1..=48u64)
        .map(|s| dispatch_id("day", t("2026-12-07T00:00:00Z") + s * HOUR / 2))
        .collect();
    let mut want_sorted = want.clone();
    want_sorted.sort();
    assert_eq!(ids, want_sorted, "every slot once");
    let s = record(&stores[1], "day").await;
    assert_eq!(s.watermark, t("2026-12-08T00:00:00Z"));
    assert!(
        s.outcomes.iter().all(|o| o.skipped.is_none()),
        "{:?}",
        s.outcomes
    );
}

/// A clock stepped back never fires a slot twice nor early; a jump forward is downtime: only
/// the newest missed slot fires (`latest`), the rest are recorded with their reason.
pub async fn a_clock_stepped_back_fires_nothing_twice_and_a_jump_forward_fires_only_the_latest<
    F: Factory,
>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let stores = env.open_many(2).await;
    let start = t("2026-12-07T00:00:00Z");
    env.clock.set(start);
    sched::create(
        &stores[0],
        def("hourly", Spec::Cron("0 * * * *".into()), "UTC"),
        Source::Api,
    )
    .await
    .expect("create");
    for h in 1..=3 {
        env.clock.set(start + h * HOUR);
        run_ticks(&stores).await;
    }
    assert_eq!(fired(&stores[0]).await.len(), 3);
    // Back two hours: nothing is due, nothing fires again.
    env.clock.set(start + HOUR + 1);
    assert_eq!(run_ticks(&stores).await, 0);
    env.clock.set(start + 3 * HOUR + 10);
    run_ticks(&stores).await;
    assert_eq!(fired(&stores[0]).await.len(), 3, "no slot fired twice");
    // Forward six hours (the window is one hour): 04:00 to 09:00 missed, only 09:00 fires.
    env.clock.set(start + 9 * HOUR + 5_000);
    run_ticks(&stores).await;
    let all = fired(&stores[0]).await;
    assert_eq!(
        all.len(),
        4,
        "{:?}",
        all.iter().map(|d| &d.id).collect::<Vec<_>>()
    );
    assert!(
        all.iter()
            .any(|d| d.id == dispatch_id("hourly", start + 9 * HOUR))
    );
    let s = record(&stores[1], "hourly").await;
    let skipped: u64 = s
        .outcomes
        .iter()
        .filter(|o| o.skipped == Some(SkipReason::MissedWindow))
        .map(|o| o.slots)
        .sum();
    assert_eq!(skipped, 5, "{:?}", s.outcomes);
}

/// The spring gap and the autumn fold of America/New_York, end to end: `30 2 * * *` fires
/// once at the end of the gap (or not, recorded, with `gap = skip`); `30 1 * * *` fires at the
/// first occurrence; `*/30 * * * *` fires through the repeated hour.
pub async fn daylight_saving_transitions_fire_as_the_policy_says<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let store = env.open().await;
    let ny = "America/New_York";
    env.clock.set(t("2026-03-08T04:00:00Z"));
    sched::create(
        &store,
        def("gap", Spec::Cron("30 2 * * *".into()), ny),
        Source::Api,
    )
    .await
    .expect("create");
    let mut skip = def("gapskip", Spec::Cron("30 2 * * *".into()), ny);
    skip.dst = Dst {
        gap: Gap::Skip,
        fold: Fold::First,
    };
    sched::create(&store, skip, Source::Api)
        .await
        .expect("create");
    for m in 1..=16u64 {
        env.clock.set(t("2026-03-08T04:00:00Z") + m * HOUR / 2);
        run_ticks(std::slice::from_ref(&store)).await;
    }
    let ids: Vec<String> = fired(&store).await.into_iter().map(|d| d.id).collect();
    assert_eq!(ids, [dispatch_id("gap", t("2026-03-08T07:00:00Z"))]);
    let s = record(&store, "gapskip").await;
    assert_eq!(s.outcomes.len(), 1);
    assert_eq!(s.outcomes[0].skipped, Some(SkipReason::DstGap));
    assert_eq!(fire_label(s.outcomes[0].fire), "2026-03-08T07:00:00Z");

    env.clock.set(t("2026-11-01T04:00:00Z"));
    sched::create(
        &store,
        def("fold", Spec::Cron("30 1 * * *".into()), ny),
        Source::Api,
    )
    .await
    .expect("create");
    sched::create(
        &store,
        def("half", Spec::Cron("*/30 * * * *".into()), ny),
        Source::Api,
    )
    .await
    .expect("create");
    for m in 1..=6u64 {
        env.clock.set(t("2026-11-01T04:00:00Z") + m * HOUR / 2);
        run_ticks(std::slice::from_ref(&store)).await;
    }
    let fold: Vec<String> = fired(&store)
        .await
        .into_iter()
        .filter(|d| d.id.starts_with("sched:fold:"))
        .map(|d| d.id)
        .collect();
    assert_eq!(fold, [dispatch_id("fold", t("2026-11-01T05:30:00Z"))]);
    let half = fired(&store)
        .await
        .into_iter()
        .filter(|d| d.id.starts_with("sched:half:"))
        .count();
    // 04:30Z to 07:00Z every half hour: six, the repeated 01:00 and 01:30 included.
    assert_eq!(half, 6);
}

/// `skip` while the last run waits three days on a waitpoint: one recorded skip per slot
/// (folded), then, once the run ended, the next slot fires on time.
pub async fn skip_records_each_slot_while_the_last_run_lives_and_fires_the_next_on_time<
    F: Factory,
>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let store = env.open().await;
    let start = t("2026-12-07T00:00:00Z");
    env.clock.set(start);
    let mut d = def("skipper", Spec::Cron("0 * * * *".into()), "UTC");
    d.overlap = Overlap::Skip;
    d.thread = ThreadChoice::Fixed("skipper".into());
    sched::create(&store, d, Source::Api).await.expect("create");
    env.clock.set(start + HOUR);
    run_ticks(std::slice::from_ref(&store)).await;
    let first = dispatch_id("skipper", start + HOUR);
    // The run is claimed, creates a waitpoint and suspends: it waits three days.
    let claimed = store
        .mailbox
        .claim_dispatch(&first, "worker", HOUR)
        .await
        .expect("claim")
        .expect("claimed");
    let fence = Fence::of(&claimed).expect("a fence");
    let created = retry(|| {
        store.waitpoints.create_waitpoint(
            &fence,
            NewWaitpoint {
                name: "approval".into(),
                timeout_ms: 4 * 24 * HOUR,
                metadata: BTreeMap::new(),
                token_digest: token_digest("hwp_approval"),
            },
        )
    })
    .await
    .expect("a waitpoint");
    let token = claimed
        .claim
        .as_ref()
        .map(|c| c.token.clone())
        .unwrap_or_default();
    let waiting = retry(|| store.mailbox.suspend(&first, &token, 100))
        .await
        .expect("suspend");
    assert_eq!(waiting.status, Status::Waiting);
    for h in 2..=73 {
        env.clock.set(start + h * HOUR);
        run_ticks(std::slice::from_ref(&store)).await;
    }
    assert_eq!(fired(&store).await.len(), 1);
    let s = record(&store, "skipper").await;
    let skips: Vec<(SkipReason, u64)> = s
        .outcomes
        .iter()
        .filter_map(|o| o.skipped.map(|r| (r, o.slots)))
        .collect();
    // 72 slots skipped, one run of them in the outcomes.
    assert_eq!(skips.iter().map(|(_, n)| n).sum::<u64>(), 72, "{skips:?}");
    assert!(skips.iter().all(|(r, _)| *r == SkipReason::OverlapSkip));
    // The waitpoint completes, the run resumes, runs and is acked.
    retry(|| {
        store
            .waitpoints
            .complete_waitpoint(&created.waitpoint.id, b"ok".to_vec(), "token")
    })
    .await
    .expect("complete");
    let again = store
        .mailbox
        .claim_dispatch(&first, "worker", HOUR)
        .await
        .expect("claim")
        .expect("claimed again");
    let token = again
        .claim
        .as_ref()
        .map(|c| c.token.clone())
        .unwrap_or_default();
    store.mailbox.ack(&first, &token).await.expect("ack");
    env.clock.set(start + 74 * HOUR);
    run_ticks(std::slice::from_ref(&store)).await;
    assert!(
        fired(&store)
            .await
            .iter()
            .any(|d| d.id == dispatch_id("skipper", start + 74 * HOUR))
    );
}

/// A paused schedule fires nothing; a resume records the slots it missed and fires from then
/// on; a deleted (or no longer declared) one fires no more, and its dispatch stays.
pub async fn pause_resume_and_removal_stop_and_restart_fires<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let store = env.open().await;
    let start = t("2026-12-07T00:00:00Z");
    env.clock.set(start);
    let d = def("p", Spec::Cron("0 * * * *".into()), "UTC");
    sched::reconcile(&store, std::slice::from_ref(&d))
        .await
        .expect("declare");
    sched::pause(&store, "p", "maintenance")
        .await
        .expect("pause");
    env.clock.set(start + 3 * HOUR);
    run_ticks(std::slice::from_ref(&store)).await;
    assert!(fired(&store).await.is_empty());
    sched::resume(&store, "p", false).await.expect("resume");
    let s = record(&store, "p").await;
    assert_eq!(
        s.outcomes
            .iter()
            .filter(|o| o.skipped == Some(SkipReason::Paused))
            .map(|o| o.slots)
            .sum::<u64>(),
        3
    );
    env.clock.set(start + 4 * HOUR);
    run_ticks(std::slice::from_ref(&store)).await;
    assert_eq!(fired(&store).await.len(), 1);
    // The config no longer declares it: deleted, its dispatch untouched.
    let gone = sched::reconcile(&store, &[]).await.expect("reconcile");
    assert_eq!(gone, ["p"]);
    env.clock.set(start + 6 * HOUR);
    run_ticks(std::slice::from_ref(&store)).await;
    let all = fired(&store).await;
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].status, Status::Queued);
    assert!(store.schedules.schedule("p").await.expect("read").is_none());
}

/// A trigger and a backfill follow the schedule's overlap policy, or the one they are given:
/// with the last dispatch live, `skip` records a skip naming it, `buffer_all` buffers (and a
/// tick within the buffer's poll releases the slots one at a time once it ends), `allow` fires.
pub async fn trigger_and_backfill_follow_the_overlap_policy<F: Factory>(factory: &F) {
    use homing::store::schedules::Overlap as O;
    let env = Env::new(factory).await;
    let store = env.open().await;
    let start = t("2026-12-07T00:00:00Z");
    env.clock.set(start);
    let mut d = def("ov", Spec::Cron("0 0 1 1 *".into()), "UTC");
    d.thread = ThreadChoice::Fixed("ov".into());
    d.overlap = Overlap::Skip;
    sched::create(&store, d, Source::Api).await.expect("create");

    // Nothing live: fired.
    let first = sched::trigger(&store, "ov", None).await.expect("trigger");
    assert_eq!(first.outcome, "fired", "{first:?}");
    let first_id = first.id.clone().expect("its dispatch");
    // The first is live (queued): the schedule's `skip` skips, naming it.
    env.clock.advance(1_000);
    let skipped = sched::trigger(&store, "ov", None).await.expect("trigger");
    assert_eq!(skipped.outcome, "overlap_skip", "{skipped:?}");
    assert_eq!(skipped.id, None);
    assert_eq!(skipped.live.as_deref(), Some(first_id.as_str()));
    assert!(
        record(&store, "ov")
            .await
            .outcomes
            .iter()
            .any(|o| o.skipped == Some(SkipReason::OverlapSkip) && o.fire == start + 1_000),
        "the skip is recorded"
    );
    // `allow` fires anyway.
    env.clock.advance(1_000);
    let allowed = sched::trigger(&store, "ov", Some(O::Allow))
        .await
        .expect("trigger");
    assert_eq!(allowed.outcome, "fired");
    let second_id = allowed.id.expect("its dispatch");

    // A backfill of three past slots: skipped under the schedule's policy, buffered under
    // `buffer_all`.
    let (from, to) = (t("2024-01-01T00:00:00Z"), t("2026-01-01T00:00:00Z"));
    let slots = sched::backfill(&store, "ov", from, to, None)
        .await
        .expect("backfill");
    assert_eq!(slots.len(), 3);
    assert!(
        slots
            .iter()
            .all(|m| m.outcome == "overlap_skip" && m.live.as_deref() == Some(second_id.as_str())),
        "{slots:?}"
    );
    let slots = sched::backfill(&store, "ov", from, to, Some(O::BufferAll))
        .await
        .expect("backfill");
    assert!(slots.iter().all(|m| m.outcome == "buffered"), "{slots:?}");
    let s = record(&store, "ov").await;
    assert_eq!(s.buffered.len(), 3);
    let tick = store
        .mailbox
        .load(s.tick.as_deref().expect("a tick"))
        .await
        .expect("load")
        .expect("the tick");
    assert!(
        tick.available_at <= store.now() + sched::BUFFER_POLL_MS,
        "the tick releasing the buffer is due within the poll"
    );

    // The live ones end: each tick releases one buffered slot while the last is not live.
    for id in [&first_id, &second_id] {
        store.mailbox.cancel(id).await.expect("cancel");
    }
    let mut released = Vec::new();
    for _ in 0..3 {
        env.clock.advance(sched::BUFFER_POLL_MS);
        run_ticks(std::slice::from_ref(&store)).await;
        let last = record(&store, "ov").await.last_dispatch.expect("fired");
        released.push(last.clone());
        store.mailbox.cancel(&last).await.expect("cancel");
    }
    let expected: Vec<String> = [
        "2024-01-01T00:00:00Z",
        "2025-01-01T00:00:00Z",
        "2026-01-01T00:00:00Z",
    ]
    .iter()
    .map(|at| dispatch_id("ov", t(at)))
    .collect();
    assert_eq!(released, expected, "oldest first, one at a time");
    assert!(record(&store, "ov").await.buffered.is_empty());
}

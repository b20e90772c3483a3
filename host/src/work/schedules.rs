//! Schedules (the contract, section 16), written once for the API, the CLI, the config's
//! reconcile and the hosts' tick workers: create, pause, resume, trigger, backfill and delete,
//! and the tick that fires a schedule's due slots.
//!
//! A schedule rides the mailbox: it keeps one tick dispatch (agent [`TICK_AGENT`], a thread of
//! its own) due at its next fire, which any host's tick worker claims with the usual lease. A
//! tick (1) enqueues each due slot's dispatch by its derived id (an id already stored counts as
//! fired), (2) enqueues the next tick, by an id numbered from the record, (3) writes the
//! schedule forward under a compare-and-set of its revision, then (4) acks. A host killed
//! between two steps leaves its tick to a reclaim, which redoes them: the same slots and the
//! same next tick by the same ids, then the write. No host leads, and no host scans every
//! schedule.

use async_trait::async_trait;

use crate::store::model::schedules::{
    FireKind, KEPT_OUTCOMES, Outcome, Overlap, Schedule, ScheduleDef, SchedulePause, SkipReason,
    Source,
};
use crate::store::rules::WALK_PAGE_BYTES;
use crate::store::rules::schedules::{
    self as rules, META_FIRE, META_SCHEDULE, META_SCHEDULED_FOR, Overlapped, Plan,
};
use crate::store::schedules::Stored;
use crate::store::{Dispatch, NewDispatch, Status, Store, StoreError};

/// The agent of tick dispatches: claimed by every host's tick worker, routed to no plugin (a
/// plugin's name holds no `.`, so none can take it).
pub const TICK_AGENT: &str = "homing.schedule";
/// How often a tick looks again while fires wait in the buffer for the last dispatch to end.
pub const BUFFER_POLL_MS: u64 = 5_000;
/// The most slots one tick handles (a schedule firing every second, after a long outage):
/// the rest are handled by the next tick, at once.
pub const MAX_SLOTS_PER_TICK: usize = 10_000;
/// The most slots one backfill enqueues.
pub const MAX_BACKFILL: usize = 1_000;
/// How many times an operation reads the schedule again after another write came first.
const ATTEMPTS: usize = 16;

/// Why an operation on a schedule did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// No schedule of this name.
    #[error("no schedule `{0}`")]
    NotFound(String),
    /// One exists already.
    #[error("schedule `{0}` exists already")]
    Exists(String),
    /// The declaration or the request is wrong; the message names the field.
    #[error("{0}")]
    Invalid(String),
    /// The store refused or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Whether `e` is a compare-and-set that lost (read again and decide again).
fn lost(e: &StoreError) -> bool {
    matches!(e, StoreError::Contention(_))
}

/// What a fire's dispatch is: the schedule's agent, payload and metadata, its thread, its
/// derived id, and metadata naming the schedule, the fire time and how it fired.
pub fn fire_dispatch(def: &ScheduleDef, fire: u64, kind: FireKind) -> NewDispatch {
    let mut new = NewDispatch::new(
        &def.agent,
        rules::fire_thread(def, fire),
        def.payload.clone(),
    )
    .with_id(rules::dispatch_id(&def.name, fire));
    for (k, v) in &def.metadata {
        new = new.with_metadata(k, v);
    }
    new.with_metadata(META_SCHEDULE, &def.name)
        .with_metadata(META_SCHEDULED_FOR, rules::fire_label(fire))
        .with_metadata(META_FIRE, kind.as_str())
}

/// Enqueues fire `fire`'s dispatch; one already stored under its id (an earlier attempt of the
/// same tick, another host's) counts as fired. Returns its id.
async fn enqueue_fire(
    store: &Store,
    def: &ScheduleDef,
    fire: u64,
    kind: FireKind,
) -> Result<String, StoreError> {
    let new = fire_dispatch(def, fire, kind);
    let id = rules::dispatch_id(&def.name, fire);
    match store.mailbox.enqueue(new).await {
        Ok(d) => Ok(d.id),
        Err(StoreError::Duplicate { id: dup, holder }) if dup == id && holder.is_none() => Ok(id),
        Err(e) => Err(e),
    }
}

/// Enqueues tick `s.ticks + 1` of `s`, due at `due`, and records it as the schedule's tick.
async fn make_tick(store: &Store, s: &mut Schedule, due: u64) -> Result<(), StoreError> {
    let n = s.ticks + 1;
    let id = rules::tick_id(&s.def.name, n, due);
    let new = NewDispatch::new(TICK_AGENT, rules::tick_thread(&s.def.name), Vec::new())
        .with_id(&id)
        .with_metadata(META_SCHEDULE, &s.def.name)
        .with_delay_ms(due.saturating_sub(store.now()));
    match store.mailbox.enqueue(new).await {
        Ok(_) => {}
        Err(StoreError::Duplicate { id: dup, holder }) if dup == id && holder.is_none() => {}
        Err(e) => return Err(e),
    }
    s.ticks = n;
    s.tick = Some(id);
    Ok(())
}

/// When the schedule next has something to do after `after`: its next fire's due time (its
/// jitter included), or a wall time its gap skips before it (recorded at its time).
fn next_due(plan: &Plan, def: &ScheduleDef, after: u64) -> Option<u64> {
    let span = plan.fires(after, u64::MAX, 1);
    let fire = span
        .fires
        .first()
        .map(|f| rules::due(&def.name, *f, def.jitter_ms, plan.next(*f)));
    match (fire, span.gaps.first().copied()) {
        (Some(f), Some(g)) => Some(f.min(g)),
        (f, g) => f.or(g),
    }
}

/// Cancels a tick that is no longer the schedule's (best effort: a stale tick does nothing
/// when it runs anyway).
async fn drop_tick(store: &Store, tick: Option<&str>) {
    if let Some(tick) = tick
        && let Err(e) = store.mailbox.cancel(tick).await
    {
        tracing::debug!(tick, error = %e, "a stale tick was not cancelled; it will do nothing");
    }
}

/// Appends outcomes, keeping the newest [`KEPT_OUTCOMES`]. A skip for the reason of the
/// newest outcome, itself a skip, extends it (a run of skipped slots is one outcome, with its
/// count and its last fire time, however many ticks it took).
fn record(s: &mut Schedule, outcomes: impl IntoIterator<Item = Outcome>) {
    for o in outcomes {
        match s.outcomes.back_mut() {
            Some(last)
                if o.skipped.is_some()
                    && last.skipped == o.skipped
                    && o.fire >= last.through.unwrap_or(last.fire) =>
            {
                last.through = Some(o.through.unwrap_or(o.fire));
                last.slots = last.slots.saturating_add(o.slots);
                last.at = o.at;
            }
            _ => s.outcomes.push_back(o),
        }
    }
    while s.outcomes.len() > KEPT_OUTCOMES {
        s.outcomes.pop_front();
    }
}

fn fired(fire: u64, at: u64, dispatch: String, kind: FireKind) -> Outcome {
    Outcome {
        fire,
        through: None,
        slots: 1,
        at,
        dispatch: Some(dispatch),
        kind: Some(kind),
        skipped: None,
    }
}

/// Whether `d` (a schedule's last dispatch) still lives: queued, claimed or waiting.
fn live(d: &Option<Dispatch>) -> bool {
    d.as_ref()
        .is_some_and(|d| matches!(d.status, Status::Queued | Status::Claimed | Status::Waiting))
}

/// What became of a slot placed under the overlap policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placed {
    /// It fired: its dispatch's id.
    Fired(String),
    /// It waits in the buffer; under `buffer_one`, the slot it displaced (recorded
    /// `buffer_full`).
    Buffered {
        /// The older slot pushed out of a buffer of one.
        displaced: Option<u64>,
    },
    /// It did not fire, for this reason (not yet recorded: the caller folds its skips).
    Skipped(SkipReason),
}

/// Places slot `fire` of `def` against `last`, the schedule's last dispatch, as `def`'s
/// overlap policy says: fired (after interrupting the last one's thread, for `cancel_other`),
/// buffered or skipped. A fire is recorded on `s` and becomes its last dispatch (and `last`).
async fn place(
    store: &Store,
    s: &mut Schedule,
    def: &ScheduleDef,
    fire: u64,
    kind: FireKind,
    now: u64,
    last: &mut Option<Dispatch>,
) -> Result<Placed, StoreError> {
    match rules::overlap(def, live(last), s.buffered.len()) {
        Overlapped::Fire => {}
        Overlapped::InterruptThenFire => {
            if let Some(d) = last.as_ref() {
                store
                    .mailbox
                    .interrupt(&d.thread, "schedule overlap: cancel_other")
                    .await?;
            }
        }
        Overlapped::Buffer => {
            let displaced = if def.overlap == Overlap::BufferOne {
                s.buffered.pop_front()
            } else {
                None
            };
            s.buffered.push_back(fire);
            return Ok(Placed::Buffered { displaced });
        }
        Overlapped::Skip(reason) => return Ok(Placed::Skipped(reason)),
    }
    let id = enqueue_fire(store, def, fire, kind).await?;
    record(s, [fired(fire, now, id.clone(), kind)]);
    s.last_dispatch = Some(id.clone());
    if def.overlap != Overlap::Allow {
        *last = store.mailbox.load(&id).await?;
    }
    Ok(Placed::Fired(id))
}

/// Creates a schedule from `def` (checked at the store's time), firing from now on.
///
/// # Errors
///
/// [`ScheduleError::Invalid`] naming the field, [`ScheduleError::Exists`], or the store's.
pub async fn create(
    store: &Store,
    def: ScheduleDef,
    source: Source,
) -> Result<Stored, ScheduleError> {
    let now = store.now();
    let plan = rules::check(&def, now).map_err(ScheduleError::Invalid)?;
    if store.schedules.schedule(&def.name).await?.is_some() {
        return Err(ScheduleError::Exists(def.name));
    }
    let mut s = Schedule {
        def,
        source,
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
    if let Some(due) = next_due(&plan, &s.def, now) {
        make_tick(store, &mut s, due).await?;
    }
    match store.schedules.put_schedule(&s, 0).await {
        Ok(revision) => Ok(Stored {
            schedule: s,
            revision,
        }),
        Err(e) if lost(&e) => Err(ScheduleError::Exists(s.def.name)),
        Err(e) => Err(e.into()),
    }
}

/// Reads `name`, applies `change` and writes it back, again while other writes come first.
/// `change` returns the tick to drop once written.
async fn update<F>(store: &Store, name: &str, mut change: F) -> Result<Stored, ScheduleError>
where
    F: AsyncChange,
{
    for _ in 0..ATTEMPTS {
        let Some(stored) = store.schedules.schedule(name).await? else {
            return Err(ScheduleError::NotFound(name.to_owned()));
        };
        let mut s = stored.schedule.clone();
        let old_tick = s.tick.clone();
        change.apply(store, &mut s).await?;
        s.updated_at = store.now();
        match store.schedules.put_schedule(&s, stored.revision).await {
            Ok(revision) => {
                if s.tick != old_tick {
                    drop_tick(store, old_tick.as_deref()).await;
                }
                return Ok(Stored {
                    schedule: s,
                    revision,
                });
            }
            Err(e) if lost(&e) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(ScheduleError::Store(StoreError::Contention(format!(
        "schedule `{name}` kept changing under this operation; retry"
    ))))
}

/// One change of a schedule's record, decided on the record as read (it may run again on a
/// newer record).
#[async_trait]
trait AsyncChange: Send {
    async fn apply(&mut self, store: &Store, s: &mut Schedule) -> Result<(), ScheduleError>;
}

/// Replaces a schedule's declaration (a reload of the config, an edit), keeping its watermark,
/// outcomes and buffer; its next tick is made anew for the new times.
struct Redeclare(ScheduleDef, Source);

#[async_trait]
impl AsyncChange for Redeclare {
    async fn apply(&mut self, store: &Store, s: &mut Schedule) -> Result<(), ScheduleError> {
        {
            let now = store.now();
            let plan = rules::check(&self.0, now).map_err(ScheduleError::Invalid)?;
            s.def = self.0.clone();
            s.source = self.1;
            s.tick = None;
            if s.paused.is_none()
                && let Some(due) = next_due(&plan, &s.def, s.watermark.max(now))
            {
                make_tick(store, s, due).await?;
            }
            Ok(())
        }
    }
}

/// Creates `def`, or replaces the declaration of the schedule of its name.
///
/// # Errors
///
/// As [`create`]'s.
pub async fn declare(
    store: &Store,
    def: ScheduleDef,
    source: Source,
) -> Result<Stored, ScheduleError> {
    match store.schedules.schedule(&def.name).await? {
        None => match create(store, def.clone(), source).await {
            Err(ScheduleError::Exists(_)) => {
                let name = def.name.clone();
                update(store, &name, Redeclare(def, source)).await
            }
            other => other,
        },
        Some(stored) if stored.schedule.def == def && stored.schedule.source == source => {
            Ok(stored)
        }
        Some(_) => {
            let name = def.name.clone();
            update(store, &name, Redeclare(def, source)).await
        }
    }
}

struct Pause(String);

#[async_trait]
impl AsyncChange for Pause {
    async fn apply(&mut self, store: &Store, s: &mut Schedule) -> Result<(), ScheduleError> {
        {
            s.paused = Some(SchedulePause {
                reason: crate::store::rules::error_text(&self.0),
                at: store.now(),
            });
            s.tick = None;
            Ok(())
        }
    }
}

/// Pauses a schedule: no tick runs until it is resumed (pausing again replaces the reason).
///
/// # Errors
///
/// [`ScheduleError::NotFound`], or the store's.
pub async fn pause(store: &Store, name: &str, reason: &str) -> Result<Stored, ScheduleError> {
    if reason.len() > 1024 || reason.chars().any(char::is_control) {
        return Err(ScheduleError::Invalid(
            "reason: at most 1024 bytes, no control characters".into(),
        ));
    }
    update(store, name, Pause(reason.to_owned())).await
}

struct Resume(bool);

#[async_trait]
impl AsyncChange for Resume {
    async fn apply(&mut self, store: &Store, s: &mut Schedule) -> Result<(), ScheduleError> {
        {
            if s.paused.is_none() && s.tick.is_some() {
                return Ok(());
            }
            let now = store.now();
            let plan = Plan::of(&s.def).map_err(ScheduleError::Invalid)?;
            if !self.0 && now > s.watermark {
                // The slots of the pause are recorded, not fired.
                let missed = plan.fires(s.watermark, now, MAX_SLOTS_PER_TICK);
                let mut skips: Vec<(u64, SkipReason)> = missed
                    .fires
                    .iter()
                    .map(|f| (*f, SkipReason::Paused))
                    .collect();
                skips.extend(missed.gaps.iter().map(|g| (*g, SkipReason::Paused)));
                skips.sort_unstable_by_key(|(f, _)| *f);
                record(s, rules::fold_skips(&skips, now));
                s.watermark = now;
            }
            s.paused = None;
            s.tick = None;
            // With `--catch-up`, the next tick is at once and the catch-up policy decides.
            let due = if self.0 {
                Some(now)
            } else {
                next_due(&plan, &s.def, s.watermark)
            };
            if let Some(due) = due {
                make_tick(store, s, due).await?;
            }
            Ok(())
        }
    }
}

/// Resumes a paused schedule. Without `catch_up`, the slots it missed are recorded as skipped
/// (`paused`) and it fires from now on; with it, the catch-up policy decides at once.
///
/// # Errors
///
/// [`ScheduleError::NotFound`], or the store's.
pub async fn resume(store: &Store, name: &str, catch_up: bool) -> Result<Stored, ScheduleError> {
    update(store, name, Resume(catch_up)).await
}

/// What a manual fire or a backfill made of a slot.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Manual {
    /// The slot's fire time (UTC milliseconds).
    pub fire: u64,
    /// `fired`, `buffered`, or the reason it was skipped (`overlap_skip`, `buffer_full`).
    pub outcome: String,
    /// The dispatch it fired, when it fired.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The live dispatch it overlapped, when it did not fire.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live: Option<String>,
}

/// Places manual slots (a trigger's, a backfill's) under an overlap policy: the schedule's,
/// or the caller's `overlap`. A buffered slot gets a tick soon enough to release it.
struct Place {
    fires: Vec<u64>,
    kind: FireKind,
    overlap: Option<Overlap>,
    out: Vec<Manual>,
}

#[async_trait]
impl AsyncChange for Place {
    async fn apply(&mut self, store: &Store, s: &mut Schedule) -> Result<(), ScheduleError> {
        let now = store.now();
        let mut def = s.def.clone();
        if let Some(overlap) = self.overlap {
            def.overlap = overlap;
        }
        // A retried change starts again from the record as read.
        self.out.clear();
        let mut last = match &s.last_dispatch {
            Some(id) => store.mailbox.load(id).await?,
            None => None,
        };
        let mut skips: Vec<(u64, SkipReason)> = Vec::new();
        for &fire in &self.fires {
            let before = s.last_dispatch.clone();
            let (outcome, id) = match place(store, s, &def, fire, self.kind, now, &mut last).await?
            {
                Placed::Fired(id) => ("fired".to_owned(), Some(id)),
                Placed::Buffered { displaced } => {
                    skips.extend(displaced.map(|older| (older, SkipReason::BufferFull)));
                    ("buffered".to_owned(), None)
                }
                Placed::Skipped(reason) => {
                    skips.push((fire, reason));
                    (reason.as_str().to_owned(), None)
                }
            };
            let live = id.is_none().then_some(before).flatten();
            self.out.push(Manual {
                fire,
                outcome,
                id,
                live,
            });
        }
        skips.sort_unstable_by_key(|(f, _)| *f);
        record(s, rules::fold_skips(&skips, now));
        if !s.buffered.is_empty() && s.paused.is_none() {
            // The buffer is released by a tick: one due within the poll, as a tick makes (the
            // one replaced is dropped once the record is written).
            let poll = now.saturating_add(BUFFER_POLL_MS);
            let soon = match &s.tick {
                Some(tick) => store
                    .mailbox
                    .load(tick)
                    .await?
                    .is_some_and(|t| t.status == Status::Queued && t.available_at <= poll),
                None => false,
            };
            if !soon {
                make_tick(store, s, poll).await?;
            }
        }
        Ok(())
    }
}

async fn place_manual(
    store: &Store,
    name: &str,
    fires: Vec<u64>,
    kind: FireKind,
    overlap: Option<Overlap>,
) -> Result<Vec<Manual>, ScheduleError> {
    let mut change = Place {
        fires,
        kind,
        overlap,
        out: Vec::new(),
    };
    update(store, name, &mut change).await?;
    Ok(change.out)
}

/// Fires a schedule now, whatever its times and pause (the fire time is now), under its
/// overlap policy or `overlap`: fired, buffered or skipped (recorded as a slot would be). The
/// watermark stays.
///
/// # Errors
///
/// [`ScheduleError::NotFound`], or the store's.
pub async fn trigger(
    store: &Store,
    name: &str,
    overlap: Option<Overlap>,
) -> Result<Manual, ScheduleError> {
    let now = store.now();
    let mut out = place_manual(store, name, vec![now], FireKind::Manual, overlap).await?;
    out.pop()
        .ok_or_else(|| ScheduleError::NotFound(name.to_owned()))
}

#[async_trait]
impl<T: AsyncChange> AsyncChange for &mut T {
    async fn apply(&mut self, store: &Store, s: &mut Schedule) -> Result<(), ScheduleError> {
        (**self).apply(store, s).await
    }
}

/// Places the slots of `name` in `[from, to]`, oldest first, under its overlap policy or
/// `overlap` (each against the one before: under `skip`, slots after one still live are
/// skipped; `allow` fires them all), at most [`MAX_BACKFILL`]. A slot that already fired keeps
/// its dispatch; the watermark stays. Returns what became of each slot.
///
/// # Errors
///
/// [`ScheduleError::NotFound`], [`ScheduleError::Invalid`] for an empty or too long span, or
/// the store's.
pub async fn backfill(
    store: &Store,
    name: &str,
    from: u64,
    to: u64,
    overlap: Option<Overlap>,
) -> Result<Vec<Manual>, ScheduleError> {
    let Some(stored) = store.schedules.schedule(name).await? else {
        return Err(ScheduleError::NotFound(name.to_owned()));
    };
    if to < from {
        return Err(ScheduleError::Invalid(format!(
            "to: {} is before from {}",
            rules::fire_label(to),
            rules::fire_label(from)
        )));
    }
    let def = &stored.schedule.def;
    let plan = Plan::of(def).map_err(ScheduleError::Invalid)?;
    let slots = plan
        .fires(from.saturating_sub(1), to, MAX_BACKFILL + 1)
        .fires;
    if slots.len() > MAX_BACKFILL {
        return Err(ScheduleError::Invalid(format!(
            "from, to: the span holds more than {MAX_BACKFILL} slots; backfill it in parts"
        )));
    }
    place_manual(store, name, slots, FireKind::Backfill, overlap).await
}

/// Deletes a schedule and its tick; its dispatches are left as they are. `false` when there
/// was none.
///
/// # Errors
///
/// The store's.
pub async fn delete(store: &Store, name: &str) -> Result<bool, ScheduleError> {
    let Some(stored) = store.schedules.schedule(name).await? else {
        return Ok(false);
    };
    let deleted = store.schedules.delete_schedule(name, None).await?;
    drop_tick(store, stored.schedule.tick.as_deref()).await;
    Ok(deleted)
}

/// Makes the config's `[schedules]` the stored ones of source `config`: each declared,
/// those the config no longer declares deleted (their dispatches untouched). Returns the
/// names deleted.
///
/// # Errors
///
/// The first declaration refused, naming the schedule, or the store's.
pub async fn reconcile(store: &Store, defs: &[ScheduleDef]) -> Result<Vec<String>, ScheduleError> {
    for def in defs {
        declare(store, def.clone(), Source::Config)
            .await
            .map_err(|e| match e {
                ScheduleError::Invalid(m) => {
                    ScheduleError::Invalid(format!("schedules.{}: {m}", def.name))
                }
                other => other,
            })?;
    }
    let mut gone = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store
            .schedules
            .schedules(after.as_deref(), 100, Some(WALK_PAGE_BYTES))
            .await?;
        let Some(last) = page.last() else { break };
        after = Some(last.schedule.def.name.clone());
        for stored in &page {
            let s = &stored.schedule;
            if s.source == Source::Config && !defs.iter().any(|d| d.name == s.def.name) {
                delete(store, &s.def.name).await?;
                gone.push(s.def.name.clone());
            }
        }
    }
    Ok(gone)
}

/// What a tick did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ticked {
    /// The dispatches it fired (their ids) with how.
    pub fired: Vec<(String, FireKind)>,
    /// The slots it skipped, by reason.
    pub skipped: Vec<(SkipReason, u64)>,
    /// The tick was stale or its schedule gone: it did nothing.
    pub stale: bool,
}

/// Runs tick `tick` of schedule `name` (steps 1 to 3; the caller acks it after).
///
/// # Errors
///
/// The store's; the tick is then left to a reclaim, which runs it again.
pub async fn tick(store: &Store, name: &str, tick: &str) -> Result<Ticked, ScheduleError> {
    for _ in 0..ATTEMPTS {
        let Some(stored) = store.schedules.schedule(name).await? else {
            return Ok(Ticked {
                stale: true,
                ..Ticked::default()
            });
        };
        let mut s = stored.schedule.clone();
        if s.tick.as_deref() != Some(tick) {
            return Ok(Ticked {
                stale: true,
                ..Ticked::default()
            });
        }
        let now = store.now();
        let done = match Plan::of(&s.def) {
            Ok(plan) => run_tick(store, &mut s, &plan, now).await?,
            Err(e) => {
                // A record this host cannot read the times of (an older zone database):
                // paused with the reason, not retried forever.
                s.paused = Some(SchedulePause {
                    reason: crate::store::rules::error_text(&format!(
                        "cannot compute its times: {e}"
                    )),
                    at: now,
                });
                s.tick = None;
                Ticked::default()
            }
        };
        s.updated_at = now;
        match store.schedules.put_schedule(&s, stored.revision).await {
            Ok(_) => return Ok(done),
            Err(e) if lost(&e) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(ScheduleError::Store(StoreError::Contention(format!(
        "schedule `{name}` kept changing under its tick"
    ))))
}

/// Steps 1 and 2 of a tick on the record `s` as read, at `now`: fires, buffers and skips the
/// due slots, makes the next tick, and moves `s` forward for step 3.
async fn run_tick(
    store: &Store,
    s: &mut Schedule,
    plan: &Plan,
    now: u64,
) -> Result<Ticked, ScheduleError> {
    let mut done = Ticked::default();
    let def = s.def.clone();
    // The due slots: fire times past the watermark whose due time (jitter included) has come.
    let span = plan.fires(s.watermark, now, MAX_SLOTS_PER_TICK);
    let mut due: Vec<(u64, u64)> = Vec::new();
    for (i, fire) in span.fires.iter().enumerate() {
        let next = span.fires.get(i + 1).copied().or_else(|| plan.next(*fire));
        let at = rules::due(&def.name, *fire, def.jitter_ms, next);
        if at > now {
            break;
        }
        due.push((*fire, at));
    }
    let handled_to = due.last().map(|(f, _)| *f);
    // The gaps before the first slot not due yet (a jittered one) are handled with the rest.
    let pending = span.fires.get(due.len()).copied();
    let gaps: Vec<u64> = span
        .gaps
        .iter()
        .copied()
        .filter(|g| pending.is_none_or(|p| *g < p))
        .collect();
    let verdict = rules::catch_up(&def, &due, &gaps, now);
    let mut skips: Vec<(u64, SkipReason)> = Vec::new();
    record(s, verdict.skipped.iter().cloned());
    for o in &verdict.skipped {
        if let Some(r) = o.skipped {
            done.skipped.push((r, o.slots));
        }
    }

    // The last dispatch: live, ended, dead-lettered.
    let mut last = match &s.last_dispatch {
        Some(id) => store.mailbox.load(id).await?,
        None => None,
    };
    if def.pause_on_failure
        && let Some(d) = &last
        && d.status == Status::DeadLetter
    {
        // The pause names the failure; the schedule forgets the dispatch, so a resume does not
        // pause it again for the same one.
        s.paused = Some(SchedulePause {
            reason: format!("dispatch {} dead-lettered (pause_on_failure)", d.id),
            at: now,
        });
        s.last_dispatch = None;
        s.tick = None;
        if let Some(to) = handled_to {
            s.watermark = s.watermark.max(to);
        }
        return Ok(done);
    }
    // A buffered fire goes first once the last dispatch has ended.
    if !live(&last)
        && let Some(fire) = s.buffered.pop_front()
    {
        let id = enqueue_fire(store, &def, fire, FireKind::Buffered).await?;
        record(s, [fired(fire, now, id.clone(), FireKind::Buffered)]);
        done.fired.push((id.clone(), FireKind::Buffered));
        s.last_dispatch = Some(id.clone());
        last = store.mailbox.load(&id).await?;
    }
    for (fire, late) in verdict.fire {
        let kind = if late {
            FireKind::CatchUp
        } else {
            FireKind::OnTime
        };
        match place(store, s, &def, fire, kind, now, &mut last).await? {
            Placed::Fired(id) => done.fired.push((id, kind)),
            Placed::Buffered { displaced } => {
                skips.extend(displaced.map(|older| (older, SkipReason::BufferFull)));
            }
            Placed::Skipped(reason) => skips.push((fire, reason)),
        }
    }
    skips.sort_unstable_by_key(|(f, _)| *f);
    let folded = rules::fold_skips(&skips, now);
    for o in &folded {
        if let Some(r) = o.skipped {
            done.skipped.push((r, o.slots));
        }
    }
    record(s, folded);
    if let Some(to) = handled_to {
        s.watermark = s.watermark.max(to);
    }
    if let Some(g) = gaps.last() {
        s.watermark = s.watermark.max(*g);
    }
    // Step 2: the next tick, at the next due time, sooner while fires wait in the buffer, and
    // at once when this tick left due slots for the next.
    let mut next = next_due(plan, &def, s.watermark);
    if due.len() >= MAX_SLOTS_PER_TICK {
        next = Some(now);
    }
    if !s.buffered.is_empty() {
        let poll = now.saturating_add(BUFFER_POLL_MS);
        next = Some(next.map_or(poll, |n| n.min(poll)));
    }
    s.tick = None;
    if let Some(due) = next {
        make_tick(store, s, due).await?;
    }
    Ok(done)
}

/// A time of the config or a request: RFC 3339 (`2026-12-24T18:00:00Z`, or with an offset),
/// as UTC milliseconds.
///
/// # Errors
///
/// What is wrong.
pub fn parse_time(text: &str) -> Result<u64, String> {
    let ts: jiff::Timestamp = text.parse().map_err(|e| {
        format!(
            "`{}` is not an RFC 3339 time such as 2026-12-24T18:00:00Z ({e})",
            text.escape_debug()
        )
    })?;
    u64::try_from(ts.as_millisecond())
        .map_err(|_| format!("`{}` is before 1970", text.escape_debug()))
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The declaration of schedule `name` from its table `c` (of the config, or of a request's
/// body) and its payload, before the rules check its times: the key that is wrong and why.
///
/// # Errors
///
/// The key and the reason.
pub fn def_of(
    name: &str,
    c: &crate::config::schedules::ScheduleConfig,
    payload: Vec<u8>,
) -> Result<ScheduleDef, (String, String)> {
    use crate::store::model::schedules::{
        Catchup, CatchupPolicy, DEFAULT_CATCHUP_MAX, DEFAULT_CATCHUP_WINDOW_MS,
        DEFAULT_MAX_BUFFERED, Dst, Fold, Gap, Spec, ThreadChoice,
    };
    let key = |k: &'static str| move |e: String| (k.to_owned(), e);
    let spec = match (&c.cron, c.every, &c.at) {
        (Some(cron), None, None) => Spec::Cron(cron.clone()),
        (None, Some(every), None) => Spec::Every {
            every_ms: millis(every),
            anchor_ms: c
                .anchor
                .as_deref()
                .map(parse_time)
                .transpose()
                .map_err(key("anchor"))?
                .unwrap_or(0),
        },
        (None, None, Some(at)) => Spec::At(parse_time(at).map_err(key("at"))?),
        _ => {
            return Err((
                "cron".into(),
                "set exactly one of cron, every and at".into(),
            ));
        }
    };
    let thread = match c.thread.as_deref() {
        Some(crate::config::schedules::PER_FIRE) => ThreadChoice::PerFire,
        Some(t) => ThreadChoice::Fixed(t.to_owned()),
        None => ThreadChoice::Fixed(name.to_owned()),
    };
    let gap = match c.dst.gap.as_deref() {
        None | Some("shift") => Gap::Shift,
        Some("skip") => Gap::Skip,
        Some(o) => {
            return Err((
                "dst".into(),
                format!(
                    "gap: unknown `{}` (expected shift or skip)",
                    o.escape_debug()
                ),
            ));
        }
    };
    let fold = match c.dst.fold.as_deref() {
        None | Some("first") => Fold::First,
        Some("last") => Fold::Last,
        Some("both") => Fold::Both,
        Some(o) => {
            return Err((
                "dst".into(),
                format!(
                    "fold: unknown `{}` (expected first, last or both)",
                    o.escape_debug()
                ),
            ));
        }
    };
    let policy = match c.catchup.policy.as_deref() {
        None | Some("latest") => CatchupPolicy::Latest,
        Some("all") => CatchupPolicy::All,
        Some("none") => CatchupPolicy::None,
        Some(o) => {
            return Err((
                "catchup".into(),
                format!(
                    "policy: unknown `{}` (expected latest, all or none)",
                    o.escape_debug()
                ),
            ));
        }
    };
    Ok(ScheduleDef {
        name: name.to_owned(),
        agent: c.agent.clone(),
        payload,
        metadata: c.metadata.clone(),
        thread,
        spec,
        timezone: c.timezone.clone().unwrap_or_else(|| "UTC".into()),
        start_at: c
            .start_at
            .as_deref()
            .map(parse_time)
            .transpose()
            .map_err(key("start_at"))?,
        end_at: c
            .end_at
            .as_deref()
            .map(parse_time)
            .transpose()
            .map_err(key("end_at"))?,
        jitter_ms: millis(c.jitter),
        overlap: c
            .overlap
            .as_deref()
            .map(str::parse)
            .transpose()
            .map_err(key("overlap"))?
            .unwrap_or_default(),
        max_buffered: c.max_buffered.unwrap_or(DEFAULT_MAX_BUFFERED),
        catchup: Catchup {
            policy,
            window_ms: c.catchup.window.map_or(DEFAULT_CATCHUP_WINDOW_MS, millis),
            max: c.catchup.max.unwrap_or(DEFAULT_CATCHUP_MAX),
        },
        dst: Dst { gap, fold },
        pause_on_failure: c.pause_on_failure,
    })
}

/// The declarations of the config's `[schedules]`, each checked by the rules at `now`.
///
/// # Errors
///
/// The first refused, as `<file>: line N: [schedules.<name>] <key>: <why>`.
pub fn defs_of(config: &crate::config::Config, now: u64) -> Result<Vec<ScheduleDef>, String> {
    let mut out = Vec::with_capacity(config.schedules.len());
    for (name, c) in &config.schedules {
        let fail = |key: &str, why: &str| {
            let at = c.at_line(key);
            if key.is_empty() {
                format!("{}: {at}[schedules.{name}]: {why}", config.source)
            } else {
                format!("{}: {at}[schedules.{name}] {key}: {why}", config.source)
            }
        };
        let def = c
            .payload_bytes(&config.base_dir, config.host.max_payload)
            .and_then(|payload| def_of(name, c, payload))
            .map_err(|(key, why)| fail(&key, &why))?;
        rules::check(&def, now).map_err(|why| {
            // The rules name the field first: `cron: ...`, `jitter: ...`.
            let key = why
                .split(':')
                .next()
                .and_then(|k| k.split('.').next())
                .unwrap_or("")
                .trim()
                .to_owned();
            let key = if c.lines.contains_key(&key) {
                key
            } else {
                String::new()
            };
            let why = why
                .strip_prefix(&format!("{key}:"))
                .map_or(why.as_str(), str::trim_start);
            fail(&key, why)
        })?;
        out.push(def);
    }
    Ok(out)
}

/// A schedule as `show`, the API and the dashboard give it: the record, its revision, and its
/// next fires in UTC and in its zone.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ScheduleView {
    /// The record.
    #[serde(flatten)]
    pub schedule: Schedule,
    /// Its revision.
    pub revision: u64,
    /// The next fires (at most [`NEXT_SHOWN`]; none while paused), with their due times.
    pub next: Vec<NextFire>,
}

/// One upcoming fire.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NextFire {
    /// The fire time (UTC milliseconds).
    pub fire: u64,
    /// The same, RFC 3339 in UTC.
    pub utc: String,
    /// The same in the schedule's zone.
    pub local: String,
    /// When it is due (its jitter added).
    pub due: u64,
}

/// How many upcoming fires a view lists.
pub const NEXT_SHOWN: usize = 5;

/// The view of `stored` at `now`.
pub fn view(stored: Stored, now: u64) -> ScheduleView {
    let s = &stored.schedule;
    let next = match (Plan::of(&s.def), rules::zone(&s.def.timezone)) {
        (Ok(plan), Ok(tz)) if s.paused.is_none() => {
            let fires = plan.upcoming(s.watermark.max(now), NEXT_SHOWN + 1);
            fires
                .iter()
                .take(NEXT_SHOWN)
                .enumerate()
                .map(|(i, f)| NextFire {
                    fire: *f,
                    utc: rules::fire_label(*f),
                    local: rules::local_label(*f, &tz),
                    due: rules::due(&s.def.name, *f, s.def.jitter_ms, fires.get(i + 1).copied()),
                })
                .collect()
        }
        _ => Vec::new(),
    };
    ScheduleView {
        schedule: stored.schedule,
        revision: stored.revision,
        next,
    }
}

/// The view of schedule `name`.
///
/// # Errors
///
/// [`ScheduleError::NotFound`], or the store's.
pub async fn show(store: &Store, name: &str) -> Result<ScheduleView, ScheduleError> {
    match store.schedules.schedule(name).await? {
        Some(stored) => Ok(view(stored, store.now())),
        None => Err(ScheduleError::NotFound(name.to_owned())),
    }
}

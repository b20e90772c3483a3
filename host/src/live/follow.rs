//! Following one dispatch's stream: its status changes, what its claims stream, and its
//! outcome, for a watcher anywhere (the API's server-sent events, `homing dispatch watch`).
//!
//! A [`Follower`] subscribes before it reads (the live bus, the thread's watch, the hub's
//! openings), then reads: the local buffer while the claim streams on this host, else the
//! stored batches after its cursor, then what the live bus brings, dropping repeats by
//! sequence. A gap (a lost bus message, deltas newer than the last persisted batch) is filled
//! from the store shortly after. A claim numbered higher than the cursor's is announced with
//! [`Event::Reset`] first, so a watcher never shows a failed attempt's text as current.
//! Once the dispatch settles for good, the rest is read from the store (the running host
//! persisted it before settling) and [`Event::Result`] ends the stream.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{Hub, Live};
use crate::store::deltas::{Cursor, DeltaBatch};
use crate::store::{Dispatch, Status, StoreResult, ThreadWatch};

/// How far (bytes) a watcher that was following the newest deltas may fall behind them, for
/// longer than [`PATIENCE`], before it is dropped ([`Event::Dropped`]); it resumes from its
/// cursor. A burst that a reading client soon catches up with drops nobody.
pub const MAX_LAG_BYTES: u64 = 1 << 20;
/// How long a watcher may stay more than [`MAX_LAG_BYTES`] behind.
pub const PATIENCE: Duration = Duration::from_secs(10);
/// The most deltas taken from the local buffer at once.
const TAKE: usize = 1024;
/// How long a gap waits for the running host's next batch before the store is read.
const GAP_WAIT: Duration = Duration::from_millis(120);
/// The store is read again at least this often, doubling from `POLL_MIN` while nothing moves.
const POLL_MIN: Duration = Duration::from_millis(50);
const POLL_MAX: Duration = Duration::from_millis(1000);

/// What a watcher is told.
#[derive(Debug, Clone)]
pub enum Event {
    /// The dispatch as it is now: first, and after each change of its status or claim.
    Status(Dispatch),
    /// A later claim started: drop what earlier claims streamed.
    Reset {
        /// The new claim number.
        claim: u32,
    },
    /// A delta, at its position.
    Delta {
        /// Its claim and sequence.
        at: Cursor,
        /// Its bytes.
        chunk: Bytes,
    },
    /// The watcher fell too far behind; it should resume from `last`.
    Dropped {
        /// The last position it was given.
        last: Cursor,
    },
    /// The dispatch settled for good; nothing follows.
    Result(Dispatch),
}

/// A watcher of one dispatch.
pub struct Follower {
    hub: Hub,
    dispatch: String,
    cursor: Cursor,
    /// The status and claim last reported.
    seen: Option<(Status, u32)>,
    queue: VecDeque<Event>,
    watch: ThreadWatch,
    opened: watch::Receiver<u64>,
    local: Option<(Arc<Live>, watch::Receiver<u64>)>,
    bus: Option<BoxStream<'static, DeltaBatch>>,
    /// A full look (record and store) is due.
    due: bool,
    /// When a gap is filled from the store.
    gap: Option<Instant>,
    /// Whether it ever reached the newest local delta (only then can it fall behind).
    caught_up: bool,
    /// Since when it has been more than `MAX_LAG_BYTES` behind.
    behind_since: Option<Instant>,
    patience: Duration,
    ended: bool,
    poll: Duration,
    _open: OpenGauge,
}

struct OpenGauge;

impl OpenGauge {
    fn new() -> OpenGauge {
        metrics::gauge!(crate::telemetry::STREAMS_OPEN).increment(1.0);
        OpenGauge
    }
}

impl Drop for OpenGauge {
    fn drop(&mut self) {
        metrics::gauge!(crate::telemetry::STREAMS_OPEN).decrement(1.0);
    }
}

impl std::fmt::Debug for Follower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Follower")
            .field("dispatch", &self.dispatch)
            .field("cursor", &self.cursor)
            .finish_non_exhaustive()
    }
}

impl Follower {
    /// Starts following `dispatch` after `after` (from the current claim's first delta when
    /// `None`). `None` when there is no such dispatch.
    ///
    /// # Errors
    ///
    /// When the store cannot be read or the live bus subscribed.
    pub async fn open(
        hub: &Hub,
        dispatch: &str,
        after: Option<Cursor>,
    ) -> StoreResult<Option<Follower>> {
        let store = hub.store();
        let Some(d) = store.mailbox.load(dispatch).await? else {
            return Ok(None);
        };
        // Subscribed before the first read, so nothing streamed in between is missed.
        let watch = store.inbox.watch(&d.thread);
        let opened = hub.opened();
        let bus = match hub.bus() {
            Some(bus) => Some(bus.subscribe(dispatch).await?),
            None => None,
        };
        Ok(Some(Follower {
            hub: hub.clone(),
            dispatch: dispatch.to_owned(),
            cursor: after.unwrap_or_default(),
            seen: None,
            queue: VecDeque::new(),
            watch,
            opened,
            local: None,
            bus,
            due: true,
            gap: None,
            caught_up: false,
            behind_since: None,
            patience: PATIENCE,
            ended: false,
            poll: POLL_MIN,
            _open: OpenGauge::new(),
        }))
    }

    /// Drops it once it stayed too far behind for `patience` instead of [`PATIENCE`].
    pub fn with_patience(mut self, patience: Duration) -> Follower {
        self.patience = patience;
        self
    }

    /// The dispatch it follows.
    pub fn dispatch(&self) -> &str {
        &self.dispatch
    }

    /// The position of the last delta given out.
    pub fn cursor(&self) -> Cursor {
        self.cursor
    }

    /// The next event; `None` after [`Event::Result`] or [`Event::Dropped`] (or once the
    /// dispatch is gone).
    ///
    /// # Errors
    ///
    /// When the store cannot be read.
    pub async fn next(&mut self) -> StoreResult<Option<Event>> {
        loop {
            if let Some(event) = self.queue.pop_front() {
                return Ok(Some(event));
            }
            if self.ended {
                return Ok(None);
            }
            if self.due || self.gap.is_some_and(|at| at <= Instant::now()) {
                self.due = false;
                self.look().await?;
                continue;
            }
            // The local buffer holds more than one read takes: go on reading, no waiting.
            if self
                .local
                .as_ref()
                .is_some_and(|(live, _)| live.head() > self.cursor.seq)
            {
                self.read_local();
                continue;
            }
            self.wait().await;
        }
    }

    /// Moves to claim `claim`, telling the watcher to drop what it has unless it has nothing.
    fn move_to_claim(&mut self, claim: u32) {
        if self.cursor != Cursor::default() {
            self.queue.push_back(Event::Reset { claim });
        }
        self.cursor = Cursor::new(claim, 0);
        self.caught_up = false;
    }

    fn push(&mut self, chunk: Bytes, head: u64) {
        self.cursor.seq += 1;
        metrics::histogram!(crate::telemetry::STREAM_CLIENT_LAG)
            .record(head.saturating_sub(self.cursor.seq) as f64);
        self.queue.push_back(Event::Delta {
            at: self.cursor,
            chunk,
        });
    }

    /// Reads the record, then the deltas: from the local buffer while the claim streams here,
    /// else from the store.
    async fn look(&mut self) -> StoreResult<()> {
        let store = self.hub.store().clone();
        let Some(d) = store.mailbox.load(&self.dispatch).await? else {
            self.ended = true;
            return Ok(());
        };
        if self.seen != Some((d.status, d.claims)) {
            self.seen = Some((d.status, d.claims));
            self.queue.push_back(Event::Status(d.clone()));
        }
        if d.status == Status::Claimed && d.claims > self.cursor.claim {
            self.move_to_claim(d.claims);
        }
        if let Some(live) = self
            .hub
            .get(&self.dispatch)
            .filter(|l| l.claim >= self.cursor.claim)
        {
            if live.claim > self.cursor.claim {
                self.move_to_claim(live.claim);
            }
            if !self
                .local
                .as_ref()
                .is_some_and(|(l, _)| Arc::ptr_eq(l, &live))
            {
                self.local = Some((live.clone(), live.watch()));
            }
            self.read_local();
            return Ok(());
        }
        self.local = None;
        let read = store
            .deltas
            .read_deltas(&self.dispatch, self.cursor)
            .await?;
        self.gap = None;
        if read.claim > self.cursor.claim {
            self.move_to_claim(read.claim);
        }
        if read.claim == self.cursor.claim && read.first == self.cursor.seq + 1 {
            let head = self.cursor.seq + read.chunks.len() as u64;
            for chunk in read.chunks {
                self.push(chunk, head);
            }
        }
        if d.status.is_terminal() {
            self.queue.push_back(Event::Result(d));
            self.ended = true;
        }
        Ok(())
    }

    /// Takes what the local buffer holds after the cursor; drops a watcher that fell too far
    /// behind.
    fn read_local(&mut self) {
        let Some((live, _)) = &self.local else {
            return;
        };
        let live = live.clone();
        let head = live.head();
        if self.caught_up && live.behind_more_than(self.cursor.seq, MAX_LAG_BYTES) {
            let since = *self.behind_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= self.patience {
                metrics::counter!(crate::telemetry::STREAM_CLIENTS_DROPPED).increment(1);
                self.queue.push_back(Event::Dropped { last: self.cursor });
                self.ended = true;
                return;
            }
        } else {
            self.behind_since = None;
        }
        for chunk in live.after(self.cursor.seq, TAKE) {
            self.push(chunk, head);
        }
        if self.cursor.seq >= head {
            self.caught_up = true;
        }
    }

    /// Takes a batch from the live bus: the part after the cursor, or notes a gap.
    fn take(&mut self, batch: DeltaBatch) {
        if batch.claim < self.cursor.claim {
            return;
        }
        if batch.claim > self.cursor.claim {
            if batch.first != 1 {
                self.gap.get_or_insert_with(|| Instant::now() + GAP_WAIT);
                return;
            }
            self.move_to_claim(batch.claim);
        }
        let next = self.cursor.seq + 1;
        if batch.first > next {
            self.gap.get_or_insert_with(|| Instant::now() + GAP_WAIT);
            return;
        }
        let head = batch.last();
        let skip = usize::try_from(next - batch.first).unwrap_or(usize::MAX);
        for chunk in batch.chunks.into_iter().skip(skip) {
            self.push(chunk, head);
        }
    }

    /// Waits for something to happen: a local delta, a bus message, a change of the thread, a
    /// stream opening here, a gap's deadline, or the poll.
    async fn wait(&mut self) {
        let deadline = match self.gap {
            Some(at) => at.min(Instant::now() + self.poll),
            None => Instant::now() + self.poll,
        };
        let woke = {
            let local = self.local.as_mut().map(|(_, w)| w);
            let bus = self.bus.as_mut();
            let (thread, opened) = (&mut self.watch, &mut self.opened);
            tokio::select! {
                changed = async move {
                    match local {
                        Some(w) => w.changed().await.is_ok(),
                        None => std::future::pending().await,
                    }
                } => Woke::Local(changed),
                batch = async move {
                    match bus {
                        Some(bus) => bus.next().await,
                        None => std::future::pending().await,
                    }
                } => Woke::Bus(batch),
                () = thread.changed() => Woke::Thread,
                _ = opened.changed() => Woke::Opened,
                () = tokio::time::sleep_until(deadline) => Woke::Timer,
            }
        };
        match woke {
            Woke::Local(changed) => {
                let finished = self
                    .local
                    .as_ref()
                    .is_some_and(|(l, _)| *l.finished().borrow() || l.is_closed());
                if changed && !finished {
                    self.read_local();
                } else {
                    self.due = true;
                }
                self.poll = POLL_MIN;
            }
            Woke::Bus(Some(batch)) => {
                self.take(batch);
                self.poll = POLL_MIN;
            }
            // The subscription ended: the store is the source from here on.
            Woke::Bus(None) => self.bus = None,
            Woke::Thread => {
                self.due = true;
                self.poll = POLL_MIN;
            }
            Woke::Opened => self.due = self.hub.get(&self.dispatch).is_some(),
            Woke::Timer => {
                self.due = true;
                self.poll = (self.poll * 2).min(POLL_MAX);
            }
        }
    }
}

/// What ended a wait.
enum Woke {
    Local(bool),
    Bus(Option<DeltaBatch>),
    Thread,
    Opened,
    Timer,
}

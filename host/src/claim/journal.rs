//! The journal of one claim's run: what the host records of it, and what it replays from the
//! journal of the dispatch's earlier runs (docs/contract.md, section 11; the guide in
//! docs/agents.md, "Durable runs").
//!
//! A [`Recorder`] lives as long as its claim. Each journaled call (an outbound HTTP exchange,
//! a log read or append, an enqueue) takes the run's next *position* when it starts
//! ([`Recorder::start`]), so calls the guest makes in parallel keep the order it made them in.
//! Then [`Recorder::decide`] answers whether it is replayed or goes live:
//!
//! - the earlier runs' entry at that position, when it is the same kind of call with the same
//!   identity (the digest of what the call asks), answers it: no network, no second write;
//! - a missing entry (a call in flight when the earlier run ended, or one too large to keep)
//!   makes the call live, and the replay goes on after it;
//! - the first entry that differs ends the replay: the entries from there on are dropped (the
//!   log line and `homing_journal_divergences_total` say where) and the rest of the run is live.
//!
//! A live call that ends with a lasting answer is recorded at its position
//! ([`Recorder::record`]); a transient failure (a failed connection, a timeout, status 408,
//! 429 or 5xx) is not, and gives its position back when no later call took one
//! ([`Recorder::release`]), so the retry of that call finds it. The journal is loaded once per
//! claim, lazily and only when the dispatch ran before (`claims > 1`).
//!
//! The wall-clock and random values the run reads between two calls ride on the entry of the
//! call that follows them ([`Recorder::wall_clock`], [`Recorder::random`]): while the run
//! replays, each read is answered with the earlier run's value at the same point, so a request
//! built from a timestamp or a random id is the same request again. They are read without
//! touching the store (the journal is loaded before the run starts, [`Recorder::prepare`]);
//! values read after a run's last call are never recorded (no entry follows them).
//!
//! Steps (`step-get`, `step-put`) are kept by key, beside the calls, under `journal = "steps"`
//! and `"run"`. The host keeps its own records as steps too, under keys starting
//! [`HOST_STEP_PREFIX`] (a guest's are refused): a brokered MCP call ([`mcp_key`]) is found by
//! what it asks, so no divergence drops it.
//!
//! Past `journal_max_bytes` for the dispatch nothing more is recorded (one warning per claim);
//! the run goes on. Every write goes through the claim's fence: once the claim is lost the
//! store refuses it, and a refused record is only logged (the run is ending anyway).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use metrics::{counter, histogram};
use tokio::sync::OnceCell;
use tracing::{info, warn};

use crate::config::JournalMode;
use crate::store::journal::{CallEntry, CallKind, Cheap, NewStep};
use crate::store::{Fence, Store, StoreError, StoreResult};
use crate::telemetry::{JOURNAL_DIVERGENCES, JOURNAL_RECORDED, JOURNAL_REPLAYED, JOURNAL_SAVED};

/// What a claim journals, from its plugin's config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalSettings {
    /// `journal`.
    pub mode: JournalMode,
    /// `journal_max_bytes`.
    pub max_bytes: u64,
}

impl Default for JournalSettings {
    fn default() -> Self {
        JournalSettings {
            mode: JournalMode::Off,
            max_bytes: crate::config::DEFAULT_JOURNAL_MAX_BYTES,
        }
    }
}

/// The earlier runs' journal, as loaded once per claim.
#[derive(Debug, Default)]
struct Earlier {
    calls: BTreeMap<u32, CallEntry>,
    steps: BTreeMap<String, Vec<u8>>,
    bytes: u64,
}

#[derive(Debug, Default)]
struct State {
    /// The next position a call takes.
    next: u32,
    /// Where this run diverged from the earlier runs' journal.
    diverged: Option<u32>,
    /// Bytes recorded by this run.
    bytes: u64,
    /// Set once the cap stopped recording (warned once).
    capped: bool,
    /// Steps this claim stored, newest value per key.
    steps: BTreeMap<String, Vec<u8>>,
    /// The wall-clock and random values read since the last call started (they go with the
    /// next call's entry). Replayed from the entry at `next` while the replay lasts.
    pending: Cheap,
}

pub use crate::store::journal::HOST_STEP_PREFIX;

/// The step key of the `nth` brokered MCP call with identity `identity` (of tool `tool`, cut
/// to 100 bytes, on server `server`) in a run: MCP calls are kept by what they ask and which
/// such call of the run they are, not by position, so a run that diverges from its earlier
/// runs still finds them (docs/contract.md, section 11). At most 252 bytes.
pub fn mcp_key(server: &str, tool: &str, identity: &str, nth: u32) -> String {
    format!("{HOST_STEP_PREFIX}mcp/{server}/{tool}/{identity}#{nth}")
}

/// The most bytes of wall-clock and random values kept for one entry: a guest drawing more
/// random bytes than this between two calls gets the rest live on a replay.
pub const MAX_CHEAP: usize = 16 * 1024;

/// Which random source a value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RandomSource {
    /// `wasi:random/random`.
    Secure,
    /// `wasi:random/insecure`.
    Insecure,
}

/// The journal of one claim's run.
#[derive(Debug)]
pub struct Recorder {
    store: Store,
    fence: Fence,
    agent: String,
    /// The claim number (the dispatch's `claims`).
    claim: u32,
    attempt: u32,
    settings: JournalSettings,
    earlier: OnceCell<Earlier>,
    state: Mutex<State>,
}

/// A journaled call in progress: its position and what identifies it.
#[derive(Debug, Clone)]
pub struct Call {
    /// Its position in the run.
    pub pos: u32,
    /// Its kind.
    pub kind: CallKind,
    /// The digest of what it asks.
    pub identity: String,
    /// The wall-clock and random values read before it (since the previous call started).
    cheap: Cheap,
    started: Instant,
}

impl Call {
    /// How long it has run, in µs.
    pub fn elapsed_us(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX)
    }
}

/// Whether a call is answered from the journal or goes live.
#[derive(Debug)]
pub enum Turn {
    /// The earlier run's entry answers it.
    Replay(Box<CallEntry>),
    /// It goes live (and is recorded when its answer lasts).
    Live,
}

impl Recorder {
    /// The recorder of a claim of dispatch `fence.dispatch` (claim number `claim`, attempt
    /// `attempt`) under `settings`; `None` when the plugin journals nothing.
    pub fn new(
        store: &Store,
        fence: Fence,
        agent: &str,
        claim: u32,
        attempt: u32,
        settings: JournalSettings,
    ) -> Option<Arc<Recorder>> {
        if settings.mode == JournalMode::Off {
            return None;
        }
        let earlier = OnceCell::new();
        if claim <= 1 {
            // The first run of the dispatch: there is nothing to load.
            let _ = earlier.set(Earlier::default());
        }
        Some(Arc::new(Recorder {
            store: store.clone(),
            fence,
            agent: agent.to_owned(),
            claim,
            attempt,
            settings,
            earlier,
            state: Mutex::new(State::default()),
        }))
    }

    /// Loads the earlier runs' journal now (a run that replays reads its clock and random
    /// values without waiting). A journal that cannot be read is loaded lazily later.
    pub async fn prepare(&self) {
        if self.journals_calls()
            && let Err(e) = self.earlier().await
        {
            warn!(agent = %self.agent, dispatch = %self.fence.dispatch, "the journal could not be read before the run: {e}");
        }
    }

    /// The earlier run's cheap values for the next call, while the replay lasts.
    fn replaying<'a>(&'a self, state: &State) -> Option<&'a Cheap> {
        if state.diverged.is_some_and(|at| state.next >= at) {
            return None;
        }
        self.earlier
            .get()?
            .calls
            .get(&state.next)
            .map(|entry| &entry.cheap)
    }

    /// A wall-clock read: the earlier run's value at this point while the replay lasts, else
    /// `live`; kept for the next entry.
    pub fn wall_clock(&self, live: std::time::Duration) -> std::time::Duration {
        let live = u64::try_from(live.as_nanos()).unwrap_or(u64::MAX);
        let mut state = self.state();
        let at = state.pending.clock.len();
        let value = self
            .replaying(&state)
            .and_then(|cheap| cheap.clock.get(at).copied())
            .unwrap_or(live);
        if state.pending.len() + 8 <= MAX_CHEAP {
            state.pending.clock.push(value);
        }
        std::time::Duration::from_nanos(value)
    }

    /// A random read filling `buf`: the earlier run's bytes at this point while the replay
    /// lasts, else `live` fills it; kept for the next entry.
    pub fn random(&self, source: RandomSource, buf: &mut [u8], live: impl FnOnce(&mut [u8])) {
        let mut state = self.state();
        let at = match source {
            RandomSource::Secure => state.pending.random.len(),
            RandomSource::Insecure => state.pending.insecure.len(),
        };
        let earlier = self.replaying(&state).and_then(|cheap| {
            let drawn = match source {
                RandomSource::Secure => &cheap.random,
                RandomSource::Insecure => &cheap.insecure,
            };
            drawn.get(at..at + buf.len())
        });
        match earlier {
            Some(bytes) => buf.copy_from_slice(bytes),
            None => live(buf),
        }
        if state.pending.len() + buf.len() <= MAX_CHEAP {
            match source {
                RandomSource::Secure => state.pending.random.extend_from_slice(buf),
                RandomSource::Insecure => state.pending.insecure.extend_from_slice(buf),
            }
        }
    }

    /// Whether the run's calls are journaled (`journal = "run"`), not only its steps.
    pub fn journals_calls(&self) -> bool {
        self.settings.mode == JournalMode::Run
    }

    /// The dispatch.
    pub fn dispatch(&self) -> &str {
        &self.fence.dispatch
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while the lock was held cannot leave the state half-written (each update is
        // a single assignment), so a poisoned lock is used as it is.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn earlier(&self) -> StoreResult<&Earlier> {
        self.earlier
            .get_or_try_init(|| async {
                let data = self
                    .store
                    .journal
                    .load_journal(&self.fence.dispatch)
                    .await?;
                Ok::<_, StoreError>(Earlier {
                    bytes: data.bytes(),
                    calls: data.calls.into_iter().map(|c| (c.pos, c)).collect(),
                    steps: data.steps.into_iter().map(|s| (s.key, s.value)).collect(),
                })
            })
            .await
    }

    /// Starts a journaled call of `kind` identified by `identity`: takes the run's next
    /// position.
    pub fn start(&self, kind: CallKind, identity: String) -> Call {
        let mut state = self.state();
        let pos = state.next;
        state.next = state.next.saturating_add(1);
        Call {
            pos,
            kind,
            identity,
            cheap: std::mem::take(&mut state.pending),
            started: Instant::now(),
        }
    }

    /// Whether `call` is replayed or goes live (see the module's documentation). A journal
    /// that cannot be read makes the call live.
    pub async fn decide(&self, call: &Call) -> Turn {
        if self.state().diverged.is_some_and(|at| call.pos >= at) {
            return Turn::Live;
        }
        let earlier = match self.earlier().await {
            Ok(earlier) => earlier,
            Err(e) => {
                warn!(agent = %self.agent, dispatch = %self.fence.dispatch, "the journal could not be read; the run goes live: {e}");
                self.state().diverged = Some(0);
                return Turn::Live;
            }
        };
        let Some(entry) = earlier.calls.get(&call.pos) else {
            return Turn::Live;
        };
        if entry.kind == call.kind && entry.identity == call.identity {
            return Turn::Replay(Box::new(entry.clone()));
        }
        self.diverge(call, Some(entry.kind)).await;
        Turn::Live
    }

    /// Ends the replay at `call` (its position and what the journal held there are logged),
    /// dropping the entries from there on.
    pub async fn diverge(&self, call: &Call, held: Option<CallKind>) {
        {
            let mut state = self.state();
            if state.diverged.is_some_and(|at| at <= call.pos) {
                return;
            }
            state.diverged = Some(call.pos);
        }
        info!(
            agent = %self.agent,
            dispatch = %self.fence.dispatch,
            position = call.pos,
            kind = %call.kind,
            journaled = held.map_or("nothing usable", CallKind::as_str),
            "journal: the run diverged from its earlier run here; the rest of it goes live"
        );
        counter!(JOURNAL_DIVERGENCES, "agent" => self.agent.clone(), "kind" => call.kind.as_str())
            .increment(1);
        if let Err(e) = self.store.journal.drop_calls(&self.fence, call.pos).await {
            warn!(agent = %self.agent, dispatch = %self.fence.dispatch, "journal: dropping the entries past a divergence failed: {e}");
        }
    }

    /// Counts a replayed call and the time its live run took.
    pub fn replayed(&self, entry: &CallEntry) {
        counter!(JOURNAL_REPLAYED, "agent" => self.agent.clone(), "kind" => entry.kind.as_str())
            .increment(1);
        // In seconds, Prometheus's base unit: a call under a millisecond counts too.
        histogram!(JOURNAL_SAVED, "agent" => self.agent.clone())
            .record(entry.duration_us as f64 / 1e6);
    }

    /// Gives `call`'s position back (a transient failure): the next call takes it, unless a
    /// later call already took the next one.
    pub fn release(&self, call: &Call) {
        let mut state = self.state();
        if state.next == call.pos.saturating_add(1) {
            state.next = call.pos;
            // Its values go with the call that takes the position next.
            let mut cheap = call.cheap.clone();
            cheap.clock.append(&mut state.pending.clock);
            cheap.random.append(&mut state.pending.random);
            cheap.insecure.append(&mut state.pending.insecure);
            state.pending = cheap;
        }
    }

    /// The entry recording `call` with `answer` (and `body`), or `None` when the journal is
    /// full (past `journal_max_bytes`: warned once per claim). A body over the store's limit
    /// is recorded without its bytes.
    pub async fn entry(
        &self,
        call: &Call,
        answer: serde_json::Value,
        mut body: Option<Vec<u8>>,
    ) -> Option<CallEntry> {
        if body
            .as_ref()
            .is_some_and(|b| b.len() as u64 > self.store.journal.max_body())
        {
            body = None;
        }
        let entry = CallEntry::new(
            &self.fence.dispatch,
            call.pos,
            call.kind,
            call.identity.clone(),
            answer,
            body,
            self.claim,
            self.attempt,
            call.elapsed_us(),
        )
        .with_cheap(call.cheap.clone());
        let held = self.earlier().await.map_or(0, |e| e.bytes);
        let mut state = self.state();
        if state.capped {
            return None;
        }
        if held + state.bytes + entry.size > self.settings.max_bytes {
            state.capped = true;
            warn!(
                agent = %self.agent,
                dispatch = %self.fence.dispatch,
                limit = self.settings.max_bytes,
                "journal: the dispatch's journal reached journal_max_bytes; nothing more of this run is recorded"
            );
            return None;
        }
        state.bytes += entry.size;
        Some(entry)
    }

    /// Records `entry` (from [`Recorder::entry`]). A refusal is logged: a lost claim refuses
    /// every write, and the run is ending.
    pub async fn record(&self, entry: CallEntry) {
        let kind = entry.kind;
        match self.store.journal.record(&self.fence, entry).await {
            Ok(()) => self.recorded(kind),
            Err(e) => {
                warn!(agent = %self.agent, dispatch = %self.fence.dispatch, kind = %kind, "journal: an entry was not recorded: {e}");
            }
        }
    }

    /// Counts a recorded entry of `kind`.
    pub fn recorded(&self, kind: CallKind) {
        counter!(JOURNAL_RECORDED, "agent" => self.agent.clone(), "kind" => kind.as_str())
            .increment(1);
    }

    /// The value stored under step `key`: this claim's, else the earlier runs'.
    ///
    /// # Errors
    ///
    /// When the journal cannot be read.
    pub async fn step_get(&self, key: &str) -> StoreResult<Option<Vec<u8>>> {
        if let Some(value) = self.state().steps.get(key) {
            return Ok(Some(value.clone()));
        }
        Ok(self.earlier().await?.steps.get(key).cloned())
    }

    /// Stores step `key`. Past `journal_max_bytes` it stores nothing (warned once) and
    /// succeeds.
    ///
    /// # Errors
    ///
    /// As the store's `put_step`: a lost claim, a bad key.
    pub async fn step_put(&self, key: String, value: Vec<u8>) -> StoreResult<()> {
        self.keep(key, value).await.map(drop)
    }

    /// Stores step `key` as [`Recorder::step_put`] does, and says whether it was stored:
    /// `false` past `journal_max_bytes`.
    ///
    /// # Errors
    ///
    /// As the store's `put_step`: a lost claim, a bad key.
    pub async fn keep(&self, key: String, value: Vec<u8>) -> StoreResult<bool> {
        let size = (key.len() + value.len()) as u64;
        let held = self.earlier().await?.bytes;
        {
            let mut state = self.state();
            if state.capped || held + state.bytes + size > self.settings.max_bytes {
                if !state.capped {
                    warn!(agent = %self.agent, dispatch = %self.fence.dispatch, limit = self.settings.max_bytes, "journal: the dispatch's journal reached journal_max_bytes; step `{key}` is not stored");
                }
                state.capped = true;
                return Ok(false);
            }
        }
        let step = NewStep {
            key: key.clone(),
            value: value.clone(),
            claim: self.claim,
            attempt: self.attempt,
        };
        self.store.journal.put_step(&self.fence, step).await?;
        let mut state = self.state();
        state.bytes += size;
        state.steps.insert(key, value);
        Ok(true)
    }

    /// Counts a call of `kind` answered from a record kept by key (a brokered MCP call).
    pub fn replayed_kept(&self, kind: CallKind) {
        counter!(JOURNAL_REPLAYED, "agent" => self.agent.clone(), "kind" => kind.as_str())
            .increment(1);
    }

    /// The largest body an entry keeps (the store's limit).
    pub fn max_body(&self) -> u64 {
        self.store.journal.max_body()
    }

    /// The claim's fence (for the journaled writes made with their effect).
    pub fn fence(&self) -> &Fence {
        &self.fence
    }
}

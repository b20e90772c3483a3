//! The thread inboxes of the embedded backend (the contract, docs/contract.md, section 9).
//!
//! Messages live in `messages`, keyed by (thread, seq); each thread's watermarks (`latest`,
//! `pending`, `followed`) and its last agent live on its `threads` row. Every operation is one
//! transaction on the writer thread, like the mailbox's: a send stores the message, moves the
//! watermarks and enqueues any follow-up dispatch together; an acknowledgement checks the
//! claim's fence, appends the log entry and settles the message together.
//!
//! Watches are woken after the commit of a write made through this store instance; writes of
//! another process on the same file are noticed by a poller that reads `PRAGMA data_version`
//! every [`CHANGE_POLL`] while at least one watch is open, and compares the watched threads'
//! marks.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Weak;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::effects::{follow_up, has_live_work, save_inbox};
use super::lanes::thread_row;
use super::log::{check_fence, marks, marks as log_marks, push_entry};
use super::mailbox::interrupt_in;
use super::rows::{self, db};
use super::{EmbeddedStore, Inner, MAX_VALUE};
use crate::store::inbox::{
    Inbox, InboxMarks, Message, MessageFilter, MessageKind, MessageState, NOTE_ROOM, NewMessage,
    OnBusy, Sent, ThreadWatch,
};
use crate::store::model::{EntryNote, TurnEvent};
use crate::store::rules::inbox::{Stopped, merge_agent, send_verdict, turn_mark};
use crate::store::rules::{self, ByteBudget, Effects, clamp};
use crate::store::{Fence, StoreError, StoreResult};

/// How often the poller looks for other processes' writes while a watch is open.
pub const CHANGE_POLL: Duration = Duration::from_millis(5);

/// How long the poller sleeps while no watch is open.
const IDLE_POLL: Duration = Duration::from_millis(50);

const MESSAGE_COLUMNS: &str = "thread, seq, kind, agent, payload, metadata, sent_by, sent_at, \
    state, settled_at, acked_by, log_seq, applied";

fn corrupt(thread: &str, seq: u64, reason: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        key: format!("messages/{thread}/{seq}"),
        reason: reason.into(),
    }
}

/// Decodes a row selected with [`MESSAGE_COLUMNS`].
fn decode(row: &Row<'_>) -> StoreResult<Message> {
    let thread: String = row.get(0).map_err(|e| corrupt("?", 0, e.to_string()))?;
    let seq: u64 = row.get(1).map_err(|e| corrupt(&thread, 0, e.to_string()))?;
    let field = |e: rusqlite::Error| corrupt(&thread, seq, e.to_string());
    let kind: String = row.get(2).map_err(field)?;
    let metadata: String = row.get(5).map_err(field)?;
    let state: String = row.get(8).map_err(field)?;
    Ok(Message {
        kind: kind.parse().map_err(|e: String| corrupt(&thread, seq, e))?,
        agent: row.get(3).map_err(field)?,
        payload: row.get(4).map_err(field)?,
        metadata: serde_json::from_str::<BTreeMap<String, String>>(&metadata)
            .map_err(|e| corrupt(&thread, seq, format!("metadata: {e}")))?,
        sent_by: row.get(6).map_err(field)?,
        sent_at: row.get(7).map_err(field)?,
        state: state
            .parse()
            .map_err(|e: String| corrupt(&thread, seq, e))?,
        settled_at: row.get(9).map_err(field)?,
        acked_by: row.get(10).map_err(field)?,
        log_seq: row.get(11).map_err(field)?,
        applied: match row.get::<_, Option<String>>(12).map_err(field)? {
            None => None,
            Some(text) => Some(text.parse().map_err(|e: String| corrupt(&thread, seq, e))?),
        },
        thread,
        seq,
    })
}

/// M5 for a `merge`: the messages of `thread` that `dispatch` acknowledged, pending again,
/// oldest first, with the agent each names.
fn reopen_acked(
    tx: &Connection,
    thread: &str,
    dispatch: &str,
) -> StoreResult<Vec<(u64, Option<String>)>> {
    let mut stmt = tx
        .prepare_cached(
            "UPDATE messages SET state = 'pending', settled_at = NULL, acked_by = NULL, \
             log_seq = NULL WHERE thread = ?1 AND acked_by = ?2 AND state = 'acked' \
             RETURNING seq, agent",
        )
        .map_err(db)?;
    let rows = stmt
        .query_map(params![thread, dispatch], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })
        .map_err(db)?;
    let mut out: Vec<(u64, Option<String>)> = rows.collect::<Result<_, _>>().map_err(db)?;
    out.sort_unstable();
    Ok(out)
}

fn load_message(tx: &Connection, thread: &str, seq: u64) -> StoreResult<Option<Message>> {
    let mut stmt = tx
        .prepare_cached(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages WHERE thread = ?1 AND seq = ?2"
        ))
        .map_err(db)?;
    let mut rows = stmt.query(params![thread, clamp(seq)]).map_err(db)?;
    match rows.next().map_err(db)? {
        Some(row) => decode(row).map(Some),
        None => Ok(None),
    }
}

impl EmbeddedStore {
    /// Wakes the watches of `thread` (after a commit that changed it).
    fn changed(&self, thread: &str) {
        self.inner.watches.notify(thread);
    }
}

#[async_trait]
impl Inbox for EmbeddedStore {
    async fn send(&self, thread: &str, new: NewMessage, max_pending: u64) -> StoreResult<Sent> {
        new.validate(thread, self.max_message())
            .map_err(StoreError::Invalid)?;
        let thread = thread.to_owned();
        let name = thread.clone();
        let sent = self
            .write(move |tx, now| {
                super::lanes::ensure_thread(tx, &thread)?;
                let t = thread_row(tx, &thread)?;
                let mut marks = t.inbox;
                if marks.pending >= max_pending {
                    return Err(StoreError::Limit(format!(
                        "max_inbox: thread `{}` already has {} pending messages (the limit is {max_pending})",
                        thread.escape_debug(),
                        marks.pending
                    ))
                    .into());
                }
                // Under a policy, what holds the thread decides the kind (or refuses), and
                // whether the send stops it.
                let busy = t.holder.clone();
                // Only a policy that stops the run reads its row: whether it was stopped
                // already, and where the log stood at its first claim.
                let holder = match &busy {
                    Some(id) if new.on_busy.is_some_and(OnBusy::stops) => {
                        rows::load(tx, id)?.map(|row| row.dispatch)
                    }
                    _ => None,
                };
                let current = holder.as_ref().is_some_and(|d| !rules::stale(d, t.epoch));
                let verdict = send_verdict(
                    &thread,
                    new.kind,
                    new.on_busy,
                    busy.as_deref().map(|id| (id, current)),
                )?;
                let kind = verdict.kind;
                let starts_follow_up =
                    kind == MessageKind::FollowUp && !has_live_work(tx, &thread)?;
                if starts_follow_up && new.agent.is_none() && t.last_agent.is_none() {
                    return Err(StoreError::Invalid(format!(
                        "agent: thread `{}` has never run an agent; name the agent to answer this message",
                        thread.escape_debug()
                    ))
                    .into());
                }
                marks.latest += 1;
                marks.pending += 1;
                // An interrupt: T4 for the whole thread and the turn's end in its log, in this
                // step; the follow-up below waits for the stopped run to let the thread go.
                let mut effects = Effects::NONE;
                let mut interrupted = None;
                let mut reopened = Vec::new();
                if let (Some(TurnEvent::Merged), Some(holder)) = (verdict.stop, holder.as_ref()) {
                    merge_agent(new.agent.as_deref(), holder)?;
                }
                if let (Some(event), Some(holder)) = (verdict.stop, holder.as_ref()) {
                    let reason = format!("interrupted by message {} of its thread", marks.latest);
                    let (_, e) = interrupt_in(tx, &thread, &reason, now)?;
                    effects = e;
                    let mut log = log_marks(tx, &thread)?;
                    let at = log.reserved.max(log.latest) + 1;
                    let note = serde_json::to_string(&EntryNote::Turn {
                        turn: turn_mark(event, holder, marks.latest, at),
                    })
                    .map_err(|e| StoreError::Invalid(format!("turn mark: {e}")))?;
                    let at = push_entry(tx, &thread, &mut log, b"", Some(&note), now)?;
                    interrupted = Some((holder.id.clone(), at));
                    if event == TurnEvent::Merged {
                        reopened = reopen_acked(tx, &thread, &holder.id)?;
                        marks.pending += reopened.len() as u64;
                    }
                }
                let metadata = serde_json::to_string(&new.metadata)
                    .map_err(|e| StoreError::Invalid(format!("metadata: {e}")))?;
                tx.prepare_cached(
                    "INSERT INTO messages (thread, seq, kind, agent, payload, metadata, sent_by, \
                     sent_at, state, applied) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'pending', ?9)",
                )
                .map_err(db)?
                .execute(params![
                    thread,
                    clamp(marks.latest),
                    kind.as_str(),
                    new.agent,
                    new.payload,
                    metadata,
                    new.sent_by,
                    clamp(now),
                    verdict.applied(busy.is_some()).map(OnBusy::as_str),
                ])
                .map_err(db)?;
                save_inbox(tx, &thread, marks)?;
                let follow_ups = if let (Some(_), Some(dispatch)) = (&interrupted, &holder) {
                    let stopped = Stopped {
                        dispatch,
                        merge: verdict.stop == Some(TurnEvent::Merged),
                    };
                    follow_up(
                        tx,
                        &thread,
                        new.agent.as_deref(),
                        Some(stopped),
                        &reopened,
                        None,
                        now,
                    )?
                } else if starts_follow_up {
                    follow_up(
                        tx,
                        &thread,
                        new.agent.as_deref(),
                        None,
                        &[],
                        new.follow_up_window,
                        now,
                    )?
                } else {
                    // A follow-up still waiting in its inbox window takes this message too,
                    // and waits a quiet time more.
                    // It is covered by that follow-up now (`followed`), so a run that leaves it
                    // pending does not start a second one for it.
                    if kind == MessageKind::FollowUp
                        && super::window::join_message(tx, &thread, marks.latest, now)?
                    {
                        marks.followed = marks.latest;
                        save_inbox(tx, &thread, marks)?;
                    }
                    Vec::new()
                };
                let message = Message {
                    thread: thread.clone(),
                    seq: marks.latest,
                    kind,
                    payload: new.payload,
                    metadata: new.metadata,
                    agent: new.agent,
                    sent_by: new.sent_by,
                    sent_at: now,
                    state: MessageState::Pending,
                    settled_at: None,
                    acked_by: None,
                    log_seq: None,
                    applied: verdict.applied(busy.is_some()),
                };
                Ok((
                    Sent {
                        message,
                        follow_ups,
                        applied: verdict.applied(busy.is_some()),
                        reopened: reopened.iter().map(|(seq, _)| *seq).collect(),
                        busy,
                        interrupted,
                    },
                    effects,
                ))
            })
            .await?;
        let (sent, effects) = sent;
        self.woken(&name, effects);
        if !sent.follow_ups.is_empty() {
            self.signal();
        }
        self.changed(&name);
        Ok(sent)
    }

    async fn ack_message(&self, thread: &str, seq: u64, fence: &Fence) -> StoreResult<u64> {
        let thread = thread.to_owned();
        let name = thread.clone();
        let fence = fence.clone();
        let out = self
            .write(move |tx, now| {
                check_fence(tx, &thread, &fence, now)?;
                let Some(message) = load_message(tx, &thread, seq)? else {
                    return Err(StoreError::Invalid(format!(
                        "seq: thread `{}` has no message {seq}",
                        thread.escape_debug()
                    ))
                    .into());
                };
                match message.state {
                    MessageState::Acked => {
                        return match (message.acked_by, message.log_seq) {
                            (Some(by), Some(log_seq)) if by == fence.dispatch => Ok(log_seq),
                            (by, _) => Err(StoreError::Duplicate {
                                id: fence.dispatch.clone(),
                                holder: Some(by.unwrap_or_default()),
                            }
                            .into()),
                        };
                    }
                    MessageState::Discarded => {
                        return Err(StoreError::Invalid(format!(
                            "seq: message {seq} of thread `{}` was discarded",
                            thread.escape_debug()
                        ))
                        .into());
                    }
                    MessageState::Pending => {}
                }
                let note = serde_json::to_string(&message.note())
                    .map_err(|e| corrupt(&thread, seq, format!("note: {e}")))?;
                let mut m = marks(tx, &thread)?;
                let log_seq = push_entry(tx, &thread, &mut m, &message.payload, Some(&note), now)?;
                tx.prepare_cached(
                    "UPDATE messages SET state = 'acked', settled_at = ?3, acked_by = ?4, \
                     log_seq = ?5 WHERE thread = ?1 AND seq = ?2",
                )
                .map_err(db)?
                .execute(params![
                    thread,
                    clamp(seq),
                    clamp(now),
                    fence.dispatch,
                    clamp(log_seq)
                ])
                .map_err(db)?;
                let mut inbox = thread_row(tx, &thread)?.inbox;
                inbox.pending = inbox.pending.saturating_sub(1);
                save_inbox(tx, &thread, inbox)?;
                Ok(log_seq)
            })
            .await;
        if matches!(out, Err(StoreError::StaleEpoch { .. })) {
            self.signal();
        }
        if out.is_ok() {
            self.changed(&name);
        }
        out
    }

    async fn discard_messages(&self, thread: &str, through: u64) -> StoreResult<usize> {
        let thread = thread.to_owned();
        let name = thread.clone();
        let n = self
            .write(move |tx, now| {
                let n = tx
                    .prepare_cached(
                        "UPDATE messages SET state = 'discarded', settled_at = ?3 \
                         WHERE thread = ?1 AND state = 'pending' AND seq <= ?2",
                    )
                    .map_err(db)?
                    .execute(params![thread, clamp(through), clamp(now)])
                    .map_err(db)?;
                if n > 0 {
                    let mut inbox = thread_row(tx, &thread)?.inbox;
                    inbox.pending = inbox.pending.saturating_sub(n as u64);
                    save_inbox(tx, &thread, inbox)?;
                }
                Ok(n)
            })
            .await?;
        if n > 0 {
            self.changed(&name);
        }
        Ok(n)
    }

    async fn message(&self, thread: &str, seq: u64) -> StoreResult<Option<Message>> {
        let thread = thread.to_owned();
        self.read(move |tx| load_message(tx, &thread, seq)).await
    }

    async fn messages(&self, thread: &str, filter: &MessageFilter) -> StoreResult<Vec<Message>> {
        let thread = thread.to_owned();
        let filter = filter.clone();
        let limit = crate::store::rules::page(filter.limit);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(move |tx| {
            let sql = match filter.state {
                Some(MessageState::Pending) => format!(
                    "SELECT {MESSAGE_COLUMNS} FROM messages INDEXED BY messages_pending \
                     WHERE thread = ?1 AND state = 'pending' AND seq > ?2 ORDER BY seq LIMIT ?3"
                ),
                Some(_) => format!(
                    "SELECT {MESSAGE_COLUMNS} FROM messages WHERE thread = ?1 AND seq > ?2 \
                     AND state = ?4 ORDER BY seq LIMIT ?3"
                ),
                None => format!(
                    "SELECT {MESSAGE_COLUMNS} FROM messages WHERE thread = ?1 AND seq > ?2 \
                     ORDER BY seq LIMIT ?3"
                ),
            };
            let mut stmt = tx.prepare_cached(&sql).map_err(db)?;
            let after = clamp(filter.after);
            let mut rows = match filter.state {
                Some(state @ (MessageState::Acked | MessageState::Discarded)) => stmt
                    .query(params![thread, after, limit, state.as_str()])
                    .map_err(db)?,
                _ => stmt.query(params![thread, after, limit]).map_err(db)?,
            };
            let mut out = Vec::new();
            // Rows are stepped one at a time: past the budget, the rest are never loaded.
            let mut budget = ByteBudget::new(filter.max_bytes);
            while budget.open()
                && let Some(row) = rows.next().map_err(db)?
            {
                let message = decode(row)?;
                budget.take(message.payload.len());
                out.push(message);
            }
            Ok(out)
        })
        .await
    }

    async fn inbox(&self, thread: &str) -> StoreResult<InboxMarks> {
        let thread = thread.to_owned();
        self.read(move |tx| Ok(thread_row(tx, &thread)?.inbox))
            .await
    }

    async fn purge_messages(&self, older_than: u64) -> StoreResult<usize> {
        self.write(move |tx, _| {
            Ok(tx
                .prepare_cached(
                    "DELETE FROM messages INDEXED BY messages_settled \
                     WHERE settled_at IS NOT NULL AND settled_at < ?1 AND state != 'pending'",
                )
                .map_err(db)?
                .execute(params![clamp(older_than)])
                .map_err(db)?)
        })
        .await
    }

    async fn pending_total(&self) -> StoreResult<u64> {
        self.read(|tx| {
            tx.prepare_cached(
                "SELECT count(*) FROM messages INDEXED BY messages_pending WHERE state = 'pending'",
            )
            .map_err(db)?
            .query_row([], |row| row.get(0))
            .map_err(db)
        })
        .await
    }

    fn watch(&self, thread: &str) -> ThreadWatch {
        self.inner.watches.watch(thread)
    }

    fn max_message(&self) -> u64 {
        MAX_VALUE - NOTE_ROOM
    }
}

/// What the poller compares per watched thread: its inbox marks, holder, epoch, log head and
/// pending waitpoints.
type Marks = (u64, u64, u64, Option<String>, u64, u64);

fn thread_marks(conn: &Connection, thread: &str) -> rusqlite::Result<Marks> {
    let t = conn
        .prepare_cached(
            "SELECT inbox_latest, inbox_pending, epoch, holder FROM threads WHERE thread = ?1",
        )?
        .query_row(params![thread], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
        })
        .optional()?
        .unwrap_or((0, 0, 0, None));
    let latest: u64 = conn
        .prepare_cached("SELECT latest FROM log_marks WHERE thread = ?1")?
        .query_row(params![thread], |row| row.get(0))
        .optional()?
        .unwrap_or(0);
    let waiting = super::waitpoints::pending_on_thread(conn, thread)?;
    Ok((t.0, t.1, t.2, t.3, latest, waiting))
}

/// Starts the thread that notices other processes' writes to the file at `path` and wakes the
/// watches of the threads they changed. It reads nothing while no watch is open, and one
/// pragma per [`CHANGE_POLL`] while nothing changes.
pub(super) fn start_change_poller(path: &Path, store: Weak<Inner>) -> StoreResult<()> {
    let (conn, _) = super::side_connection(path)?;
    std::thread::Builder::new()
        .name("homing-watch".into())
        .spawn(move || {
            let mut version: Option<i64> = None;
            let mut seen: HashMap<String, Marks> = HashMap::new();
            loop {
                let Some(inner) = store.upgrade() else {
                    break;
                };
                if inner.watches.open() == 0 {
                    drop(inner);
                    version = None;
                    seen.clear();
                    std::thread::sleep(IDLE_POLL);
                    continue;
                }
                let now: Option<i64> = conn
                    .query_row("PRAGMA data_version", [], |row| row.get(0))
                    .ok();
                if now != version {
                    version = now;
                    let threads = inner.watches.threads();
                    seen.retain(|thread, _| threads.contains(thread));
                    for thread in threads {
                        let Ok(marks) = thread_marks(&conn, &thread) else {
                            continue;
                        };
                        if seen.get(&thread) != Some(&marks) {
                            inner.watches.notify(&thread);
                            seen.insert(thread, marks);
                        }
                    }
                }
                drop(inner);
                std::thread::sleep(CHANGE_POLL);
            }
        })
        .map_err(|e| StoreError::Unavailable(format!("cannot start the watch thread: {e}")))?;
    Ok(())
}

//! The rotation's turns (`key_turns`) and each agent's turn floor (`counters`, `turn:AGENT`),
//! kept by the writer thread (the contract, docs/contract.md, section 13.2).
//!
//! A keyed claim reads its agent's floor and the keys in turn order until one has a free
//! lane, then advances the claimed key's turn. Read from and written to SQLite that is three
//! statements and two B-trees written per claim (the table and its turn-order index), about a
//! twentieth of an echo dispatch's cost end to end. The writer thread keeps them in memory
//! instead, an agent's turns read once, and writes the turns that moved to the table within
//! [`FLUSH_MS`] of the first of them moving (in the batch that ends then, or in a transaction
//! of its own when no batch comes), and when the store closes (dropping the store waits for
//! it). The table is the turns' durable copy, at most that much behind; what it costs:
//!
//! - a crash forgets the turns of the claims of its last [`FLUSH_MS`], so a key claimed then
//!   may be served again a little early after the restart (fairness only: caps and rates are
//!   never decided from turns);
//! - several store instances on one file each rotate by their own turns and see each other's
//!   at most that much late, as NATS hosts each rotate by their own.
//!
//! The memory is trusted only while it is current. SQLite's `PRAGMA data_version`, read at the
//! start of every batch inside its write lock ([`begin`]), moves only for other connections'
//! commits: when it has moved, the turns that moved here are written first (each the larger of
//! this instance's and the table's) and the rest is read again. An operation that is rolled
//! back has its changes to the turns undone ([`mark`], [`undo_to`]); when a whole batch fails,
//! every turn not yet written is dropped and read again from the table.
//!
//! An agent with more than [`MIRRORED_KEYS`] turns is not kept: its claims read and write the
//! table through its turn-order index, as every claim did before. A key with a lane has a row
//! in the table from the moment it gets the lane (the row is written at once), so a key of
//! another instance's enqueue is always found.
//!
//! All of it is a thread-local: the writer thread runs every operation of its store instance,
//! and each store instance has its own writer thread and connection.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use rusqlite::{Connection, params};

use super::rows::{db, scalar_u64};
use crate::store::StoreResult;
use crate::store::rules::{self, clamp};

/// An agent with more turns than this is not kept in memory (its keys would cost memory and a
/// long read each time another connection commits); its claims use the table's index.
pub const MIRRORED_KEYS: usize = 4096;

/// The longest the table's turns stay behind the writer's while it works, and how long the
/// writer waits without work before writing them.
pub const FLUSH_MS: u64 = 100;

thread_local! {
    static MIRROR: RefCell<Mirror> = RefCell::new(Mirror::default());
}

#[derive(Debug, Default)]
struct Mirror {
    /// The `data_version` the memory was read at.
    version: Option<i64>,
    /// Turns by agent; `None` for an agent with too many to keep.
    agents: HashMap<String, Option<Turns>>,
    /// Turn floors by agent, and whether the table's is behind.
    floors: HashMap<String, (u64, bool)>,
    /// Since when turns have moved that the table does not have (none: all written).
    moved_since: Option<Instant>,
    /// How to undo the changes of the operations not yet released, oldest first.
    undo: Vec<Undo>,
}

/// One change to undo, with what it replaced (a turn or floor and whether the table's was
/// behind, or nothing).
#[derive(Debug)]
enum Undo {
    /// A key's turn changed.
    Turn {
        agent: String,
        key: String,
        was: Option<(u64, bool)>,
    },
    /// An agent's floor changed.
    Floor {
        agent: String,
        was: Option<(u64, bool)>,
    },
    /// An agent's turns were read (the table may have held the operation's own writes).
    Read { agent: String },
}

/// One agent's turns: by key, and in rotation order (turn, then key, as the index orders
/// them: keys compare by their bytes in both).
#[derive(Debug, Default)]
struct Turns {
    by_key: HashMap<String, u64>,
    order: BTreeSet<(u64, String)>,
    /// The keys whose table turn is behind.
    moved: HashSet<String>,
}

impl Turns {
    /// Sets `key`'s turn and whether the table's is behind (or removes it), returning what
    /// they were.
    fn put(&mut self, key: &str, entry: Option<(u64, bool)>) -> Option<(u64, bool)> {
        let old = match entry {
            Some((turn, _)) => self.by_key.insert(key.to_owned(), turn),
            None => self.by_key.remove(key),
        };
        let was = old.map(|turn| (turn, self.moved.remove(key)));
        if let Some(old) = old {
            self.order.remove(&(old, key.to_owned()));
        }
        if let Some((turn, moved)) = entry {
            self.order.insert((turn, key.to_owned()));
            if moved {
                self.moved.insert(key.to_owned());
            }
        }
        was
    }
}

impl Mirror {
    fn any_moved(&self) -> bool {
        self.floors.values().any(|(_, moved)| *moved)
            || self.agents.values().flatten().any(|t| !t.moved.is_empty())
    }

    /// Writes every moved turn and floor to the table: each the larger of the two (the table's
    /// may have moved on through another instance).
    fn flush(&mut self, tx: &Connection) -> StoreResult<()> {
        for (agent, turns) in &mut self.agents {
            let Some(turns) = turns else { continue };
            for key in std::mem::take(&mut turns.moved) {
                if let Some(turn) = turns.by_key.get(&key) {
                    write_turn(tx, agent, &key, *turn)?;
                }
            }
        }
        for (agent, (floor, moved)) in &mut self.floors {
            if *moved {
                write_floor(tx, agent, *floor)?;
                *moved = false;
            }
        }
        self.moved_since = None;
        Ok(())
    }

    /// Sets `agent`'s floor and whether the table's is behind, recording how to undo it.
    fn set_floor(&mut self, agent: &str, floor: (u64, bool)) {
        let was = self.floors.insert(agent.to_owned(), floor);
        if floor.1 {
            self.moved();
        }
        self.undo.push(Undo::Floor {
            agent: agent.to_owned(),
            was,
        });
    }

    /// Whether `agent`'s turns are kept (read, and not too many).
    fn keeps(&self, agent: &str) -> bool {
        matches!(self.agents.get(agent), Some(Some(_)))
    }

    /// Notes that a turn or floor moved that the table does not have.
    fn moved(&mut self) {
        self.moved_since.get_or_insert_with(Instant::now);
    }

    /// Writes `agent`'s moved turns and stops keeping them (past [`MIRRORED_KEYS`]).
    fn give_up(&mut self, tx: &Connection, agent: &str) -> StoreResult<()> {
        if let Some(Some(turns)) = self.agents.get(agent) {
            for key in &turns.moved {
                if let Some(turn) = turns.by_key.get(key) {
                    write_turn(tx, agent, key, *turn)?;
                }
            }
        }
        // From here its turns are the table's: changes undone later for this agent are skipped
        // (when the operation that gave up is rolled back, the turns it wrote go with it:
        // fairness only, as with a crash).
        self.agents.insert(agent.to_owned(), None);
        Ok(())
    }
}

fn write_turn(tx: &Connection, agent: &str, key: &str, turn: u64) -> StoreResult<()> {
    tx.prepare_cached(
        "INSERT INTO key_turns (agent, key, turn) VALUES (?1, ?2, ?3) \
         ON CONFLICT (agent, key) DO UPDATE SET turn = max(turn, excluded.turn)",
    )
    .map_err(db)?
    .execute(params![agent, key, clamp(turn)])
    .map_err(db)?;
    Ok(())
}

fn write_floor(tx: &Connection, agent: &str, floor: u64) -> StoreResult<()> {
    tx.prepare_cached(
        "INSERT INTO counters (name, value) VALUES (?1, ?2) \
         ON CONFLICT (name) DO UPDATE SET value = max(value, excluded.value)",
    )
    .map_err(db)?
    .execute(params![format!("turn:{agent}"), clamp(floor)])
    .map_err(db)?;
    Ok(())
}

/// Called by the writer at the start of each batch, inside its write transaction: when another
/// connection has committed since the memory was read, writes the turns that moved here and
/// drops the memory (it is read again as claims need it).
///
/// # Errors
/// When the moved turns cannot be written; the batch then fails.
pub(super) fn begin(conn: &Connection) -> StoreResult<()> {
    let version: i64 = conn
        .prepare_cached("PRAGMA data_version")
        .map_err(db)?
        .query_row([], |row| row.get(0))
        .map_err(db)?;
    MIRROR.with(|m| {
        let mut m = m.borrow_mut();
        if m.version == Some(version) {
            return Ok(());
        }
        if m.any_moved() {
            m.flush(conn)?;
        }
        *m = Mirror {
            version: Some(version),
            ..Mirror::default()
        };
        Ok(())
    })
}

/// Writes the moved turns when the first of them moved [`FLUSH_MS`] before `now` (`force`:
/// whenever any moved), inside the batch's transaction, before it commits.
///
/// # Errors
/// When they cannot be written; the batch then fails.
pub(super) fn flush(conn: &Connection, now: Instant, force: bool) -> StoreResult<()> {
    MIRROR.with(|m| {
        let mut m = m.borrow_mut();
        let due = m.moved_since.is_some_and(|since| {
            force || now.saturating_duration_since(since) >= Duration::from_millis(FLUSH_MS)
        });
        if due {
            m.flush(conn)?;
        }
        Ok(())
    })
}

/// Puts the moved turns' next write [`FLUSH_MS`] off: a try to write them could not begin.
pub(super) fn postpone() {
    MIRROR.with(|m| {
        if let Some(since) = m.borrow_mut().moved_since.as_mut() {
            *since = Instant::now();
        }
    });
}

/// How long the writer may wait for work before the moved turns are due; `None` when every
/// turn is written.
pub(super) fn due_in() -> Option<Duration> {
    MIRROR.with(|m| {
        m.borrow()
            .moved_since
            .map(|since| Duration::from_millis(FLUSH_MS).saturating_sub(since.elapsed()))
    })
}

/// Where an operation (or a part of one) starts, for [`undo_to`].
pub(super) fn mark() -> usize {
    MIRROR.with(|m| m.borrow().undo.len())
}

/// Undoes the changes to the turns since `mark`: the operation or part was rolled back.
pub(super) fn undo_to(mark: usize) {
    MIRROR.with(|m| {
        let mut m = m.borrow_mut();
        while m.undo.len() > mark {
            let Some(undo) = m.undo.pop() else { break };
            match undo {
                Undo::Turn { agent, key, was } => {
                    // An agent no longer kept has its turns in the table.
                    if let Some(Some(turns)) = m.agents.get_mut(&agent) {
                        turns.put(&key, was);
                    }
                }
                Undo::Floor { agent, was } => match was {
                    Some(was) => {
                        m.floors.insert(agent, was);
                    }
                    None => {
                        m.floors.remove(&agent);
                    }
                },
                Undo::Read { agent } => {
                    m.agents.remove(&agent);
                }
            }
        }
        if !m.any_moved() {
            m.moved_since = None;
        }
    });
}

/// An operation was released (it stays in the batch): its changes need no undoing.
pub(super) fn released() {
    MIRROR.with(|m| m.borrow_mut().undo.clear());
}

/// Drops the memory, written or not: the batch failed, so the table is what stands.
pub(super) fn lost() {
    MIRROR.with(|m| *m.borrow_mut() = Mirror::default());
}

/// The sweep deleted `key`'s row (an idle key at or below the floor, by the table's turns):
/// a turn kept here that the table does not have yet stays (it is written again when due,
/// being above what the sweep read), any other goes too.
pub(super) fn deleted(tx: &Connection, agent: &str, key: &str) -> StoreResult<()> {
    let moved = MIRROR.with(|m| match m.borrow().agents.get(agent) {
        Some(Some(turns)) => turns.moved.contains(key),
        _ => true,
    });
    if !moved {
        set(tx, agent, key, None)?;
    }
    Ok(())
}

/// The turn every key of `agent` is brought up to (the turn of the key claimed last), so a key
/// that was idle a long time gets its fair share, not a run of catching up.
pub(super) fn floor(tx: &Connection, agent: &str) -> StoreResult<u64> {
    if let Some((floor, _)) = MIRROR.with(|m| m.borrow().floors.get(agent).copied()) {
        return Ok(floor);
    }
    let floor = scalar_u64(
        tx,
        "SELECT value FROM counters WHERE name = ?1",
        &[&format!("turn:{agent}")],
    )?
    .unwrap_or(0);
    MIRROR.with(|m| m.borrow_mut().set_floor(agent, (floor, false)));
    Ok(floor)
}

/// Reads `agent`'s turns into memory unless they are there (or too many).
fn load(m: &mut Mirror, tx: &Connection, agent: &str) -> StoreResult<()> {
    if m.agents.contains_key(agent) {
        return Ok(());
    }
    let mut turns = Turns::default();
    let mut stmt = tx
        .prepare_cached("SELECT key, turn FROM key_turns WHERE agent = ?1 LIMIT ?2")
        .map_err(db)?;
    let mut rows = stmt
        .query(params![agent, MIRRORED_KEYS as u64 + 1])
        .map_err(db)?;
    while let Some(row) = rows.next().map_err(db)? {
        let key: String = row.get(0).map_err(db)?;
        turns.put(&key, Some((row.get(1).map_err(db)?, false)));
    }
    let kept = (turns.by_key.len() <= MIRRORED_KEYS).then_some(turns);
    m.agents.insert(agent.to_owned(), kept);
    m.undo.push(Undo::Read {
        agent: agent.to_owned(),
    });
    Ok(())
}

/// Whether `agent`'s turns are kept in memory (reading them first if they may be).
fn kept(tx: &Connection, agent: &str) -> StoreResult<bool> {
    MIRROR.with(|m| {
        let mut m = m.borrow_mut();
        load(&mut m, tx, agent)?;
        Ok(m.keeps(agent))
    })
}

/// The turn of `key` of `agent`, if it has one.
pub(super) fn turn(tx: &Connection, agent: &str, key: &str) -> StoreResult<Option<u64>> {
    if kept(tx, agent)? {
        return Ok(MIRROR.with(|m| match m.borrow().agents.get(agent) {
            Some(Some(turns)) => turns.by_key.get(key).copied(),
            _ => None,
        }));
    }
    scalar_u64(
        tx,
        "SELECT turn FROM key_turns WHERE agent = ?1 AND key = ?2",
        &[&agent, &key],
    )
}

/// Calls `visit` with each key of `agent` and its turn, in rotation order (turn, then key),
/// until it returns `true`. `visit` must not call this module.
pub(super) fn in_order(
    tx: &Connection,
    agent: &str,
    mut visit: impl FnMut(&str, u64) -> StoreResult<bool>,
) -> StoreResult<()> {
    if kept(tx, agent)? {
        return MIRROR.with(|m| {
            let m = m.borrow();
            if let Some(Some(turns)) = m.agents.get(agent) {
                for (turn, key) in &turns.order {
                    if visit(key, *turn)? {
                        break;
                    }
                }
            }
            Ok(())
        });
    }
    let mut stmt = tx
        .prepare_cached(
            "SELECT key, turn FROM key_turns INDEXED BY key_turns_order \
             WHERE agent = ?1 ORDER BY turn, key",
        )
        .map_err(db)?;
    let mut rows = stmt.query(params![agent]).map_err(db)?;
    while let Some(row) = rows.next().map_err(db)? {
        let key: String = row.get(0).map_err(db)?;
        if visit(&key, row.get(1).map_err(db)?)? {
            break;
        }
    }
    Ok(())
}

/// Sets `key`'s turn in memory (`None`: removes it), recording how to undo it; `false` when
/// `agent`'s turns are not kept. Past [`MIRRORED_KEYS`] the agent's turns are written and no
/// longer kept.
fn set(tx: &Connection, agent: &str, key: &str, entry: Option<(u64, bool)>) -> StoreResult<bool> {
    MIRROR.with(|m| {
        let mut m = m.borrow_mut();
        let Some(Some(turns)) = m.agents.get_mut(agent) else {
            return Ok(false);
        };
        let was = turns.put(key, entry);
        let full = turns.by_key.len() > MIRRORED_KEYS;
        if entry.is_some_and(|(_, moved)| moved) {
            m.moved();
        }
        m.undo.push(Undo::Turn {
            agent: agent.to_owned(),
            key: key.to_owned(),
            was,
        });
        if full {
            m.give_up(tx, agent)?;
        }
        Ok(true)
    })
}

/// Gives `key` of `agent` a turn of 0 unless it has one: a key with a lane has a turn, and
/// its row is written at once (other instances find their keys in the table).
pub(super) fn enter(tx: &Connection, agent: &str, key: &str) -> StoreResult<()> {
    let known = MIRROR.with(|m| match m.borrow().agents.get(agent) {
        Some(Some(turns)) => turns.by_key.contains_key(key),
        _ => false,
    });
    if known {
        return Ok(());
    }
    let added = tx
        .prepare_cached(
            "INSERT INTO key_turns (agent, key, turn) VALUES (?1, ?2, 0) \
             ON CONFLICT (agent, key) DO NOTHING",
        )
        .map_err(db)?
        .execute(params![agent, key])
        .map_err(db)?;
    if added > 0 {
        set(tx, agent, key, Some((0, false)))?;
    }
    Ok(())
}

/// Forgets the turn of `key` of `agent` (an idle key at or below the floor).
pub(super) fn remove(tx: &Connection, agent: &str, key: &str) -> StoreResult<()> {
    tx.prepare_cached("DELETE FROM key_turns WHERE agent = ?1 AND key = ?2")
        .map_err(db)?
        .execute(params![agent, key])
        .map_err(db)?;
    set(tx, agent, key, None)?;
    Ok(())
}

/// Advances `key`'s turn after a claim of it at `turn` (its turn as the pick read it, at least
/// `floor`, the floor the pick read), and makes that turn the floor (only when it moves: in a
/// steady rotation most claims are at the floor). In memory when `agent`'s turns are kept,
/// else in the table.
pub(super) fn advance(
    tx: &Connection,
    agent: &str,
    key: &str,
    (turn, floor): (u64, u64),
    cost: u64,
) -> StoreResult<()> {
    let served = rules::turns::served(turn, cost, floor);
    let next = served.next;
    if !set(tx, agent, key, Some((next, true)))? {
        tx.prepare_cached(
            "INSERT INTO key_turns (agent, key, turn) VALUES (?1, ?2, ?3) \
             ON CONFLICT (agent, key) DO UPDATE SET turn = excluded.turn",
        )
        .map_err(db)?
        .execute(params![agent, key, next])
        .map_err(db)?;
    }
    if served.floor != floor {
        let kept = MIRROR.with(|m| m.borrow().keeps(agent));
        if !kept {
            write_floor(tx, agent, served.floor)?;
        }
        MIRROR.with(|m| m.borrow_mut().set_floor(agent, (served.floor, kept)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    /// A connection with the two tables the turns live in, and a fresh memory (each test runs
    /// on a thread of its own, but a thread may be reused).
    fn conn() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE key_turns (agent TEXT NOT NULL, key TEXT NOT NULL, \
             turn INTEGER NOT NULL, PRIMARY KEY (agent, key)) WITHOUT ROWID; \
             CREATE INDEX key_turns_order ON key_turns (agent, turn, key); \
             CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);",
        )
        .unwrap();
        lost();
        begin(&conn).unwrap();
        conn
    }

    fn order(conn: &Connection) -> Vec<(String, u64)> {
        let mut keys = Vec::new();
        in_order(conn, "x", |key, turn| {
            keys.push((key.to_owned(), turn));
            Ok(false)
        })
        .unwrap();
        keys
    }

    fn stored(conn: &Connection, key: &str) -> Option<u64> {
        scalar_u64(
            conn,
            "SELECT turn FROM key_turns WHERE agent = 'x' AND key = ?1",
            &[&key],
        )
        .unwrap()
    }

    /// Enters keys `a` and `b` of agent `x` and reads its floor and turns, as a claim would.
    fn two_keys_read(conn: &Connection) {
        for key in ["a", "b"] {
            enter(conn, "x", key).unwrap();
        }
        assert_eq!(floor(conn, "x").unwrap(), 0);
        assert_eq!(order(conn), pairs(&[("a", 0), ("b", 0)]));
    }

    fn pairs(keys: &[(&str, u64)]) -> Vec<(String, u64)> {
        keys.iter().map(|(k, t)| ((*k).to_owned(), *t)).collect()
    }

    #[test]
    fn a_rolled_back_operation_leaves_the_turns_as_they_were() {
        let conn = conn();
        two_keys_read(&conn);
        released();

        let op = mark();
        advance(&conn, "x", "a", (0, 0), 1_000).unwrap();
        advance(&conn, "x", "b", (500, 0), 1_000).unwrap();
        assert_eq!(order(&conn), pairs(&[("a", 1_000), ("b", 1_500)]));
        assert_eq!(floor(&conn, "x").unwrap(), 500);
        undo_to(op);
        assert_eq!(order(&conn), pairs(&[("a", 0), ("b", 0)]));
        assert_eq!(floor(&conn, "x").unwrap(), 0);
        assert_eq!(due_in(), None, "nothing left to write");
    }

    #[test]
    fn moved_turns_reach_the_table_when_due_each_the_larger() {
        let conn = conn();
        // A claim reads the turns before it advances one (an agent not read is written to).
        two_keys_read(&conn);
        let before = Instant::now();
        advance(&conn, "x", "a", (0, 0), 1_000).unwrap();
        advance(&conn, "x", "b", (0, 0), 1_000).unwrap();
        released();
        assert_eq!(
            stored(&conn, "a"),
            Some(0),
            "kept in memory, not yet written"
        );
        // Another instance served b further meanwhile.
        conn.execute(
            "UPDATE key_turns SET turn = 7000 WHERE agent = 'x' AND key = 'b'",
            [],
        )
        .unwrap();
        let flush_ms = Duration::from_millis(FLUSH_MS);
        flush(&conn, before + flush_ms - Duration::from_millis(1), false).unwrap();
        assert_eq!(stored(&conn, "a"), Some(0), "not due yet");
        flush(&conn, Instant::now() + flush_ms, false).unwrap();
        assert_eq!(stored(&conn, "a"), Some(1_000));
        assert_eq!(stored(&conn, "b"), Some(7_000), "the larger of the two");
        assert_eq!(due_in(), None);
    }

    #[test]
    fn a_turn_the_sweep_deletes_stays_when_moved_here_and_goes_otherwise() {
        let conn = conn();
        two_keys_read(&conn);
        advance(&conn, "x", "a", (0, 0), 1_000).unwrap();
        released();
        // The sweep's rule, on the table's turns (both at 0, no lane): both rows go.
        conn.execute("DELETE FROM key_turns", []).unwrap();
        for key in ["a", "b"] {
            deleted(&conn, "x", key).unwrap();
        }
        assert_eq!(order(&conn), pairs(&[("a", 1_000)]));
        flush(&conn, Instant::now(), true).unwrap();
        assert_eq!(stored(&conn, "a"), Some(1_000), "written again");
        assert_eq!(stored(&conn, "b"), None);
    }

    #[test]
    fn an_agent_read_inside_a_rolled_back_operation_is_read_again() {
        let conn = conn();
        let op = mark();
        enter(&conn, "x", "a").unwrap();
        assert_eq!(order(&conn), pairs(&[("a", 0)]));
        // The operation's insert goes with it; so does what it read.
        conn.execute("DELETE FROM key_turns", []).unwrap();
        undo_to(op);
        assert_eq!(order(&conn), Vec::new());
    }
}

//! Start-time fair queuing of an agent's concurrency keys (the contract, section 13.2), the
//! same on both backends: each key has a next turn, the agent a floor (the turn of the key
//! served last); a claim serves the key whose turn comes first and moves that key's turn on by
//! its cost. A key seen for the first time, or idle long enough to fall behind, counts at the
//! floor, so it waits its turn instead of catching up on what it missed. Where the turns are
//! kept is each backend's (the embedded store's table and its writer's memory, a NATS host's
//! memory); what they are is decided here.

/// The turn at which a key is served now: its stored next turn, or the agent's `floor` when it
/// has none or is behind it.
pub(crate) fn turn(stored: Option<u64>, floor: u64) -> u64 {
    stored.unwrap_or(0).max(floor)
}

/// What a claim of a key served at `turn` (as [`turn`] gave it) changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Served {
    /// The key's next turn: `turn` plus the key's cost (1,000 over its weight).
    pub next: u64,
    /// The agent's floor: the turn just served, when it is past the floor.
    pub floor: u64,
}

/// The turns after a claim of a key at `turn` that costs `cost`, the agent's floor being
/// `floor`. Times are clamped like every stored integer.
pub(crate) fn served(turn: u64, cost: u64, floor: u64) -> Served {
    Served {
        next: super::clamp(turn.saturating_add(cost)),
        floor: super::clamp(floor.max(turn)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two keys of weight 1 and one of weight 2 (cost 500) from the same floor: served in turn
    /// order, the heavier key twice as often, and a key that arrives late starts at the floor.
    #[test]
    fn keys_are_served_in_turn_order_by_their_weights() {
        let mut turns: std::collections::BTreeMap<&str, u64> = Default::default();
        let mut floor = 0;
        let costs = [("a", 1_000), ("b", 1_000), ("h", 500)];
        let mut served_keys = Vec::new();
        for round in 0..8 {
            if round == 4 {
                // A key seen for the first time counts at the floor.
                assert_eq!(turn(turns.get("late").copied(), floor), floor);
            }
            let (key, cost) = costs
                .iter()
                .map(|(k, c)| (*k, *c))
                .min_by_key(|(k, _)| (turn(turns.get(k).copied(), floor), *k))
                .unwrap_or(("a", 1_000));
            let at = turn(turns.get(key).copied(), floor);
            let s = served(at, cost, floor);
            turns.insert(key, s.next);
            floor = s.floor;
            served_keys.push(key);
        }
        assert_eq!(served_keys, ["a", "b", "h", "h", "a", "b", "h", "h"]);
        assert_eq!(floor, 1_500);
    }

    /// The floor never moves back, and a turn never passes the stored range.
    #[test]
    fn the_floor_only_moves_on_and_turns_are_clamped() {
        assert_eq!(served(10, 1_000, 50).floor, 50);
        assert_eq!(
            served(60, 1_000, 50),
            Served {
                next: 1_060,
                floor: 60
            }
        );
        assert_eq!(served(u64::MAX, 1_000, 0).next, i64::MAX as u64);
        assert_eq!(turn(Some(5), 7), 7);
        assert_eq!(turn(Some(9), 7), 9);
        assert_eq!(turn(None, 7), 7);
    }
}

//! Debounce windows (the contract, section 17): which queued dispatch an enqueue joins, and
//! what joining does to it. Both backends call these; they only find the open window and
//! check that the result fits their records.

use crate::store::StoreError;
use crate::store::model::{Debounce, Dispatch, Gather, Item, NewDispatch, Status, Window};

use super::clamp;
use super::inbox::FOLLOW_UP_MESSAGES;

/// Whether `d` is an open window keyed `key`: queued, never claimed and not sealed. A claim
/// closes it for good (a retry queues it again with what it gathered, closed).
pub fn is_open(d: &Dispatch, key: &str) -> bool {
    d.status == Status::Queued
        && d.claims == 0
        && d.window.as_ref().is_some_and(|w| !w.sealed && w.key == key)
}

/// The key of `d`'s window while it is open.
pub fn open_key(d: &Dispatch) -> Option<&str> {
    d.window
        .as_ref()
        .filter(|w| is_open(d, &w.key))
        .map(|w| w.key.as_str())
}

/// How `d`'s window stands, as the CLI and the dashboard name it: `open` (others may join),
/// `sealed` (full) or `closed` (claimed).
pub fn state(d: &Dispatch) -> &'static str {
    match &d.window {
        _ if open_key(d).is_some() => "open",
        Some(w) if w.sealed => "sealed",
        _ => "closed",
    }
}

fn item(new: &NewDispatch, now: u64) -> Item {
    Item {
        payload: new.payload.clone(),
        metadata: new.metadata.clone(),
        enqueued_at: now,
    }
}

/// The queued record `d` (just made from an enqueue debounced by `spec`) as the window it
/// opens: holding that enqueue, due `quiet` from now (at once when one item fills it).
pub fn opened(mut d: Dispatch, spec: &Debounce, now: u64) -> Dispatch {
    let items = if spec.payload == Gather::Collect {
        vec![Item {
            payload: d.payload.clone(),
            metadata: d.metadata.clone(),
            enqueued_at: now,
        }]
    } else {
        Vec::new()
    };
    let w = Window {
        key: spec.key.clone(),
        payload: spec.payload,
        quiet_ms: spec.quiet_ms,
        max_wait_ms: spec.max_wait_ms,
        max_items: spec.max_items,
        first_at: now,
        last_at: now,
        count: 1,
        sealed: spec.max_items <= 1,
        items,
    };
    d.available_at = clamp(if w.sealed { now } else { w.due() });
    d.window = Some(w);
    d
}

/// Checks that `new` may join `open`, the open window of its (thread, key).
///
/// # Errors
///
/// `Invalid`, naming the agent, when the window belongs to another agent.
pub fn check_join(open: &Dispatch, new: &NewDispatch) -> Result<(), StoreError> {
    if open.agent != new.agent {
        return Err(StoreError::Invalid(format!(
            "debounce.key: the open window `{}` of thread `{}` with this key is agent `{}`'s, \
             not `{}`'s",
            open.id,
            open.thread.escape_debug(),
            open.agent.escape_debug(),
            new.agent.escape_debug()
        )));
    }
    Ok(())
}

/// The open window `d` after `new` joined it at `now`: one more item, due a quiet time
/// from now but no later than its longest wait; `last` takes the new payload and metadata,
/// `first` keeps its own, `collect` adds an item (and takes them too, so a handler that reads
/// only the payload sees the latest). Reaching `max_items` seals it, due at once. The
/// window's settings are the ones it was opened with.
pub fn joined(mut d: Dispatch, new: &NewDispatch, now: u64) -> Dispatch {
    let Some(w) = d.window.as_mut() else {
        return d;
    };
    w.last_at = now.max(w.last_at);
    w.count = w.count.saturating_add(1);
    match w.payload {
        Gather::First | Gather::Inbox => {}
        Gather::Last => {
            d.payload = new.payload.clone();
            d.metadata = new.metadata.clone();
        }
        Gather::Collect => {
            w.items.push(item(new, now));
            d.payload = new.payload.clone();
            d.metadata = new.metadata.clone();
        }
    }
    if w.count >= w.max_items {
        w.sealed = true;
    }
    d.available_at = clamp(if w.sealed { now } else { w.due() });
    d.updated_at = now;
    d
}

/// The open window `d` sealed at `now`, due at once: what would join it does not fit its
/// record, so that enqueue opens the next window in the same step.
pub fn sealed(mut d: Dispatch, now: u64) -> Dispatch {
    if let Some(w) = d.window.as_mut() {
        w.sealed = true;
    }
    d.available_at = clamp(now);
    d.updated_at = now;
    d
}

/// The inbox's open follow-up window `d` after message `seq` of its thread arrived at `now`:
/// due a quiet time from now (no later than its longest wait), its range of messages widened
/// to `seq`. Its claim is handed every pending message, as any follow-up's is.
pub fn joined_by_message(d: Dispatch, seq: u64, now: u64) -> Dispatch {
    let first = d
        .metadata
        .get(FOLLOW_UP_MESSAGES)
        .and_then(|range| range.split('-').next())
        .and_then(|first| first.parse::<u64>().ok())
        .unwrap_or(seq);
    let mut d = joined(d, &NewDispatch::new("", "", Vec::new()), now);
    d.metadata
        .insert(FOLLOW_UP_MESSAGES.to_owned(), format!("{first}-{seq}"));
    d
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::store::rules::queued_record;

    fn spec(payload: Gather, max_items: u32) -> Debounce {
        Debounce {
            payload,
            max_items,
            ..Debounce::new("k", 100, 1_000)
        }
    }

    fn open(payload: Gather, max_items: u32) -> Dispatch {
        let new =
            NewDispatch::new("a", "t", b"one".to_vec()).with_debounce(spec(payload, max_items));
        queued_record("w", &new, 0, 10)
    }

    #[test]
    fn a_window_is_due_a_quiet_time_after_its_last_item_and_no_later_than_max_wait() {
        let d = open(Gather::Last, 100);
        assert_eq!(d.available_at, 110);
        assert!(is_open(&d, "k"));
        assert!(!is_open(&d, "other"));
        let mut d = joined(d, &NewDispatch::new("a", "t", b"two".to_vec()), 50);
        assert_eq!(d.available_at, 150);
        assert_eq!(d.payload, b"two");
        for at in [500, 900, 1_005] {
            d = joined(d, &NewDispatch::new("a", "t", b"n".to_vec()), at);
        }
        assert_eq!(d.available_at, 1_010, "first_at + max_wait caps it");
        assert_eq!(d.window.as_ref().map(|w| w.count), Some(5));
    }

    #[test]
    fn first_keeps_its_payload_collect_keeps_every_item_in_order() {
        let d = joined(
            open(Gather::First, 100),
            &NewDispatch::new("a", "t", b"two".to_vec()),
            20,
        );
        assert_eq!(d.payload, b"one");
        let d = joined(
            open(Gather::Collect, 100),
            &NewDispatch::new("a", "t", b"two".to_vec()),
            20,
        );
        let w = d.window.as_ref().unwrap();
        let payloads: Vec<&[u8]> = w.items.iter().map(|i| i.payload.as_slice()).collect();
        assert_eq!(payloads, vec![&b"one"[..], &b"two"[..]]);
        assert_eq!(d.payload, b"two");
        assert_eq!(w.bytes(), 6);
    }

    #[test]
    fn max_items_seals_the_window_due_at_once_and_a_claim_closes_it() {
        let d = joined(
            open(Gather::Last, 2),
            &NewDispatch::new("a", "t", b"x".to_vec()),
            30,
        );
        assert!(d.window.as_ref().unwrap().sealed);
        assert_eq!(d.available_at, 30);
        assert!(!is_open(&d, "k"));
        assert!(open(Gather::Last, 1).window.unwrap().sealed);
        let mut claimed = open(Gather::Last, 5);
        claimed.claims = 1;
        assert!(!is_open(&claimed, "k"), "a retried window stays closed");
        let s = sealed(open(Gather::Last, 5), 40);
        assert_eq!((s.available_at, open_key(&s)), (40, None));
    }

    #[test]
    fn another_agents_enqueue_cannot_join() {
        let d = open(Gather::Last, 5);
        assert!(check_join(&d, &NewDispatch::new("a", "t", Vec::new())).is_ok());
        let e = check_join(&d, &NewDispatch::new("b", "t", Vec::new())).unwrap_err();
        assert!(e.to_string().contains("agent `a`"), "{e}");
    }

    #[test]
    fn a_message_widens_the_follow_up_windows_range() {
        let new = NewDispatch::new("a", "t", Vec::new())
            .with_metadata(FOLLOW_UP_MESSAGES, "3-3")
            .with_debounce(Debounce {
                payload: Gather::Inbox,
                ..Debounce::new(crate::store::model::window::FOLLOW_UP_WINDOW, 100, 1_000)
            });
        let d = queued_record("f", &new, 0, 0);
        let d = joined_by_message(d, 5, 40);
        assert_eq!(
            d.metadata.get(FOLLOW_UP_MESSAGES).map(String::as_str),
            Some("3-5")
        );
        assert_eq!(d.available_at, 140);
    }

    #[test]
    fn bad_settings_are_refused_naming_the_field() {
        let bad = |d: Debounce, field: &str| {
            let e = d.validate().unwrap_err();
            assert!(e.starts_with(field), "{e}");
        };
        bad(Debounce::new("", 1, 2), "debounce.key");
        bad(Debounce::new("k".repeat(300), 1, 2), "debounce.key");
        bad(Debounce::new("k", 3, 2), "debounce.quiet");
        bad(
            Debounce::new("k", 1, 8 * 24 * 3_600_000),
            "debounce.max_wait",
        );
        bad(Debounce::new("k", 0, 0), "debounce.max_wait");
        bad(spec(Gather::Last, 0), "debounce.max_items");
        bad(spec(Gather::Inbox, 3), "debounce.payload");
        let both = NewDispatch::new("a", "t", Vec::new())
            .with_dedupe_key("x")
            .with_debounce(spec(Gather::Last, 3));
        assert!(both.validate().unwrap_err().starts_with("debounce"));
    }
}

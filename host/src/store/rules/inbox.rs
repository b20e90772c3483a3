//! The inbox's follow-up rule (M4, the contract, section 9): which dispatches answer a thread's
//! pending messages when its last live work settles, and what they carry. Both backends enqueue
//! them from here.

use crate::store::StoreError;
use crate::store::model::inbox::OnBusy;
use crate::store::model::inbox::{Message, MessageState};
use crate::store::model::window::{FOLLOW_UP_WINDOW, MAX_WINDOW_ITEMS};
use crate::store::model::{
    Debounce, Dispatch, Gather, LogRange, MessageKind, NewDispatch, TurnEvent, TurnMark,
};

/// Metadata keys of a follow-up dispatch (M4): who enqueued it and which messages it answers.
pub const FOLLOW_UP_BY: (&str, &str) = ("enqueued-by", "inbox");
/// The metadata key naming the range of messages a follow-up answers (`first-last`).
pub const FOLLOW_UP_MESSAGES: &str = "messages";
/// The metadata key of a follow-up an interrupting send enqueued: the dispatch it stopped, so
/// the follow-up's claim knows the turn before it was cut short.
pub const FOLLOW_UP_INTERRUPTED: &str = "interrupted";

/// The follow-up dispatches M4 enqueues for `pending` (the thread's pending messages with a
/// sequence above its `followed` watermark, oldest first): one per distinct target, the
/// message's agent or else `default_agent`, each with the range of sequences it answers.
/// Targets come in the order of their first message. Messages with no target (no agent and no
/// default) are left out: the caller refuses or skips them.
pub fn follow_up_targets<'a>(
    pending: impl IntoIterator<Item = (u64, Option<&'a str>)>,
    default_agent: Option<&'a str>,
) -> Vec<(String, u64, u64)> {
    let mut out: Vec<(String, u64, u64)> = Vec::new();
    for (seq, agent) in pending {
        let Some(target) = agent.or(default_agent) else {
            continue;
        };
        match out.iter_mut().find(|(name, _, _)| name == target) {
            Some((_, first, last)) => {
                *first = (*first).min(seq);
                *last = (*last).max(seq);
            }
            None => out.push((target.to_owned(), seq, seq)),
        }
    }
    out
}

/// The run a stopping send stopped, as the follow-ups it enqueues carry it.
#[derive(Debug, Clone, Copy)]
pub struct Stopped<'a> {
    /// The stopped dispatch.
    pub dispatch: &'a Dispatch,
    /// Whether the send merges: the follow-up for the stopped dispatch's agent carries its
    /// payload.
    pub merge: bool,
}

/// The dispatch that answers messages `first..=last` of `thread` for `agent` (M4), after the
/// run `stopped` when a stopping send enqueues it (case c): its metadata names the stopped
/// dispatch, and under `merge` the follow-up of that dispatch's agent carries its payload.
pub fn follow_up_dispatch(
    agent: &str,
    thread: &str,
    first: u64,
    last: u64,
    stopped: Option<Stopped<'_>>,
) -> NewDispatch {
    let payload = match stopped {
        Some(s) if s.merge && s.dispatch.agent == agent => s.dispatch.payload.clone(),
        _ => Vec::new(),
    };
    let new = NewDispatch::new(agent, thread, payload)
        .with_metadata(FOLLOW_UP_BY.0, FOLLOW_UP_BY.1)
        .with_metadata(FOLLOW_UP_MESSAGES, format!("{first}-{last}"));
    match stopped {
        Some(s) => new.with_metadata(FOLLOW_UP_INTERRUPTED, s.dispatch.id.as_str()),
        None => new,
    }
}

/// The inbox window a follow-up waits in when the message that starts it asked for one
/// (`quiet_ms`, `max_wait_ms`): later messages join it until it is due or claimed.
pub fn follow_up_window((quiet_ms, max_wait_ms): (u64, u64)) -> Debounce {
    Debounce {
        payload: Gather::Inbox,
        max_items: MAX_WINDOW_ITEMS,
        ..Debounce::new(FOLLOW_UP_WINDOW, quiet_ms, max_wait_ms)
    }
}

/// Checks that a `merge` sent to `agent` (none: the thread's own) can continue the turn of the
/// stopped `holder`: the stopped run's payload goes to the follow-up for its own agent, so a
/// message naming another agent cannot merge into it.
///
/// # Errors
///
/// `Invalid`, naming the field.
pub fn merge_agent(agent: Option<&str>, holder: &Dispatch) -> Result<(), StoreError> {
    match agent {
        Some(agent) if agent != holder.agent => Err(StoreError::Invalid(format!(
            "agent: a merge continues the stopped run of agent `{}`; a message for `{}` cannot \
             merge into it (send it with another policy)",
            holder.agent.escape_debug(),
            agent.escape_debug()
        ))),
        _ => Ok(()),
    }
}

/// A message a `merge` returns to pending: acknowledged by the stopped dispatch, pending again,
/// its acknowledgement's log entry masked by the merge's mark (M5).
pub fn reopened(mut message: Message) -> Message {
    message.state = MessageState::Pending;
    message.settled_at = None;
    message.acked_by = None;
    message.log_seq = None;
    message
}

/// The mark a send that stopped `holder` appends at log sequence `at` (message `message` of
/// the thread stopped it): a rollback's masks what `holder`'s runs wrote, every entry after
/// the log's latest at its first claim and before the mark (nothing when they wrote none).
pub fn turn_mark(event: TurnEvent, holder: &Dispatch, message: u64, at: u64) -> TurnMark {
    let first = holder.log_from.unwrap_or(0).saturating_add(1);
    let last = at.saturating_sub(1);
    TurnMark {
        event,
        dispatch: holder.id.clone(),
        message,
        masked: (event != TurnEvent::Interrupted && first <= last)
            .then_some(LogRange { first, last }),
    }
}

/// What a send does, as [`send_verdict`] decides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendVerdict {
    /// The kind the message is stored as.
    pub kind: MessageKind,
    /// How the send stops the run that holds the thread, when it does: it moves the thread's
    /// epoch on, supersedes its queued and waiting dispatches and marks the turn's end in its
    /// log with this event (a rollback's mark masks the run's entries), in the step that
    /// stores the message.
    pub stop: Option<TurnEvent>,
}

impl SendVerdict {
    /// The policy that took effect ([`Sent::applied`](crate::store::inbox::Sent)), when the
    /// thread was `busy`.
    pub fn applied(&self, busy: bool) -> Option<OnBusy> {
        busy.then_some(match (self.stop, self.kind) {
            (Some(TurnEvent::RolledBack), _) => OnBusy::Rollback,
            (Some(TurnEvent::Merged), _) => OnBusy::Merge,
            (Some(TurnEvent::Interrupted), _) => OnBusy::Interrupt,
            (None, MessageKind::Steer) => OnBusy::Steer,
            (None, MessageKind::FollowUp) => OnBusy::Enqueue,
        })
    }
}

/// What a message sent as `kind` under `on_busy` does, with `holder` the dispatch holding its
/// thread (claimed or waiting) when the send decides, and whether that holder is of the
/// thread's current epoch. On an idle thread every policy starts a turn (a follow-up); on a
/// busy one `enqueue` waits for the next turn, `steer` goes to the live run, `reject` refuses,
/// naming the holder, `interrupt` stops the holder and waits for the turn after it, and
/// `rollback` does so and masks what the holder wrote to the log. A
/// holder of an older epoch was stopped already: an `interrupt` then only waits for the next
/// turn, so messages racing to interrupt one run move the epoch once.
///
/// # Errors
///
/// [`StoreError::Busy`] for `reject` on a busy thread.
pub fn send_verdict(
    thread: &str,
    kind: MessageKind,
    on_busy: Option<OnBusy>,
    holder: Option<(&str, bool)>,
) -> Result<SendVerdict, StoreError> {
    let plain = |kind| SendVerdict { kind, stop: None };
    let Some(policy) = on_busy else {
        return Ok(plain(kind));
    };
    let Some((holder, current)) = holder else {
        return Ok(plain(MessageKind::FollowUp));
    };
    match policy {
        OnBusy::Enqueue => Ok(plain(MessageKind::FollowUp)),
        OnBusy::Steer => Ok(plain(MessageKind::Steer)),
        OnBusy::Reject => Err(StoreError::Busy {
            thread: thread.to_owned(),
            holder: holder.to_owned(),
        }),
        OnBusy::Interrupt | OnBusy::Rollback | OnBusy::Merge => Ok(SendVerdict {
            kind: MessageKind::FollowUp,
            stop: current.then_some(match policy {
                OnBusy::Rollback => TurnEvent::RolledBack,
                OnBusy::Merge => TurnEvent::Merged,
                _ => TurnEvent::Interrupted,
            }),
        }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn a_rollback_masks_what_the_stopped_dispatch_wrote_and_an_interrupt_nothing() {
        let mut holder =
            crate::store::rules::queued_record("d", &NewDispatch::new("a", "t", Vec::new()), 0, 1);
        holder.log_from = Some(4);
        let mark = turn_mark(TurnEvent::RolledBack, &holder, 2, 9);
        assert_eq!(mark.masked, Some(LogRange { first: 5, last: 8 }));
        assert_eq!(mark.dispatch, "d");
        assert_eq!(
            turn_mark(TurnEvent::Interrupted, &holder, 2, 9).masked,
            None
        );
        // A run that wrote nothing masks nothing.
        assert_eq!(turn_mark(TurnEvent::RolledBack, &holder, 2, 5).masked, None);
    }

    #[test]
    fn follow_ups_group_messages_by_target() {
        let got = follow_up_targets(
            [(3, None), (4, Some("b")), (5, None), (6, Some("b"))],
            Some("a"),
        );
        assert_eq!(got, vec![("a".into(), 3, 5), ("b".into(), 4, 6)]);
        assert!(follow_up_targets([(1, None)], None).is_empty());
    }

    #[test]
    fn a_policy_decides_only_on_a_busy_thread() {
        use MessageKind::{FollowUp, Steer};
        let kind = |kind, policy, holder| send_verdict("t", kind, policy, holder).map(|v| v.kind);
        for policy in [
            OnBusy::Enqueue,
            OnBusy::Steer,
            OnBusy::Reject,
            OnBusy::Interrupt,
            OnBusy::Rollback,
        ] {
            assert_eq!(
                send_verdict("t", Steer, Some(policy), None),
                Ok(SendVerdict {
                    kind: FollowUp,
                    stop: None
                })
            );
        }
        let live = Some(("d", true));
        assert_eq!(kind(Steer, None, live), Ok(Steer));
        assert_eq!(kind(Steer, Some(OnBusy::Enqueue), live), Ok(FollowUp));
        assert_eq!(kind(FollowUp, Some(OnBusy::Steer), live), Ok(Steer));
        assert_eq!(
            kind(FollowUp, Some(OnBusy::Reject), live),
            Err(StoreError::Busy {
                thread: "t".into(),
                holder: "d".into()
            })
        );
        assert_eq!(
            send_verdict("t", Steer, Some(OnBusy::Interrupt), live),
            Ok(SendVerdict {
                kind: FollowUp,
                stop: Some(TurnEvent::Interrupted)
            })
        );
        assert_eq!(
            send_verdict("t", Steer, Some(OnBusy::Rollback), live),
            Ok(SendVerdict {
                kind: FollowUp,
                stop: Some(TurnEvent::RolledBack)
            })
        );
        assert_eq!(
            send_verdict("t", Steer, Some(OnBusy::Rollback), Some(("d", false))).map(|v| v.stop),
            Ok(None)
        );
        let applied = |policy, holder| {
            send_verdict("t", FollowUp, Some(policy), holder).map(|v| v.applied(holder.is_some()))
        };
        assert_eq!(applied(OnBusy::Rollback, live), Ok(Some(OnBusy::Rollback)));
        assert_eq!(
            applied(OnBusy::Interrupt, live),
            Ok(Some(OnBusy::Interrupt))
        );
        assert_eq!(applied(OnBusy::Steer, live), Ok(Some(OnBusy::Steer)));
        assert_eq!(
            applied(OnBusy::Interrupt, Some(("d", false))),
            Ok(Some(OnBusy::Enqueue)),
            "a run stopped already: the message waits for the next turn"
        );
        assert_eq!(applied(OnBusy::Rollback, None), Ok(None));
        // A holder stopped already is not stopped again: the message waits for the next turn.
        assert_eq!(
            send_verdict("t", Steer, Some(OnBusy::Interrupt), Some(("d", false))),
            Ok(SendVerdict {
                kind: FollowUp,
                stop: None
            })
        );
    }
}

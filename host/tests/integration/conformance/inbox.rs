//! The inbox of a thread (the contract, docs/contract.md, section 9, and guarantee 10): M1
//! send, M2 acknowledge, M3 discard, M4 follow-up, the size limits of section 7, and the
//! thread watch.
//!
//! Time only moves through the [`ManualClock`]; nothing sleeps. The one test that waits (for a
//! watch) bounds the wait with a generous deadline, which only a broken backend reaches.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use homing::store::inbox::{
    DEFAULT_MAX_INBOX, FOLLOW_UP_BY, FOLLOW_UP_INTERRUPTED, FOLLOW_UP_MESSAGES,
};
use homing::store::{
    DEFAULT_MAX_ATTEMPTS, DEFAULT_PRIORITY, Fence, InboxMarks, LogEntry, Message, MessageFilter,
    MessageKind, MessageState, NewMessage, RunResult, Sent, Status, StoreError,
};
use tokio::task::JoinSet;

use super::*;

/// Who the tests' messages are sent by.
const SENDER: &str = "cli";
/// A second agent, for messages that address one.
const OTHER: &str = "other-agent";
/// How long a watch may take to fire before the test fails (a bound on failure, not a wait).
const WATCH_DEADLINE: Duration = Duration::from_secs(30);

fn steer(text: &str) -> NewMessage {
    NewMessage::new(MessageKind::Steer, text.as_bytes().to_vec(), SENDER)
}

fn follow_up(text: &str) -> NewMessage {
    NewMessage::new(MessageKind::FollowUp, text.as_bytes().to_vec(), SENDER)
}

/// Sends `new` to `thread` under the default pending limit; it must succeed.
async fn send(store: &Store, thread: &str, new: NewMessage) -> Sent {
    match store.inbox.send(thread, new, DEFAULT_MAX_INBOX).await {
        Ok(sent) => sent,
        Err(err) => panic!("send to {thread:?} failed: {err}"),
    }
}

/// The fence of a claimed dispatch.
fn fence(dispatch: &Dispatch) -> Fence {
    Fence::of(dispatch).unwrap_or_else(|| panic!("dispatch {} is not claimed", dispatch.id))
}

/// The sequences of the thread's messages in `state` (all when `None`), oldest first.
async fn seqs_in(store: &Store, thread: &str, state: Option<MessageState>) -> Vec<u64> {
    all_messages(store, thread, state)
        .await
        .iter()
        .map(|m| m.seq)
        .collect()
}

/// Every message of the thread in `state` (all when `None`), oldest first, page by page.
async fn all_messages(store: &Store, thread: &str, state: Option<MessageState>) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::new();
    loop {
        let page = store
            .inbox
            .messages(
                thread,
                &MessageFilter {
                    state,
                    after: out.last().map_or(0, |m| m.seq),
                    limit: 0,
                    max_bytes: None,
                },
            )
            .await
            .expect("messages");
        if page.is_empty() {
            return out;
        }
        out.extend(page);
    }
}

/// The pending messages a claim of the thread is handed (what `next-message` reads).
async fn pending(store: &Store, thread: &str) -> Vec<u64> {
    seqs_in(store, thread, Some(MessageState::Pending)).await
}

/// The stored message, which must exist.
async fn message(store: &Store, thread: &str, seq: u64) -> Message {
    store
        .inbox
        .message(thread, seq)
        .await
        .expect("message")
        .unwrap_or_else(|| panic!("message {seq} of {thread} is not stored"))
}

async fn marks(store: &Store, thread: &str) -> InboxMarks {
    store.inbox.inbox(thread).await.expect("inbox")
}

fn inbox_marks(latest: u64, pending: u64, followed: u64) -> InboxMarks {
    InboxMarks {
        latest,
        pending,
        followed,
    }
}

/// The follow-up dispatches the inbox enqueued on `thread` (metadata `enqueued-by=inbox`), in
/// list order.
async fn follow_ups_on(store: &Store, thread: &str) -> Vec<Dispatch> {
    store
        .mailbox
        .list(&ListFilter {
            thread: Some(thread.to_owned()),
            limit: 100_000,
            ..ListFilter::default()
        })
        .await
        .expect("list")
        .into_iter()
        .filter(|d| d.metadata.get(FOLLOW_UP_BY.0).map(String::as_str) == Some(FOLLOW_UP_BY.1))
        .collect()
}

/// The live (queued or claimed) dispatches of `thread`.
async fn live_on(store: &Store, thread: &str) -> Vec<Dispatch> {
    store
        .mailbox
        .list(&ListFilter {
            thread: Some(thread.to_owned()),
            statuses: vec![Status::Queued, Status::Claimed],
            limit: 100_000,
            ..ListFilter::default()
        })
        .await
        .expect("list")
}

/// Asserts `d` is a follow-up dispatch of `agent` on `thread` answering `first..=last`, as M4
/// makes it: queued, empty payload, the store's default priority and attempts.
fn assert_follow_up(d: &Dispatch, agent: &str, thread: &str, first: u64, last: u64) {
    assert_eq!(d.agent, agent, "follow-up agent: {d:#?}");
    assert_eq!(d.thread, thread, "follow-up thread: {d:#?}");
    assert_eq!(d.status, Status::Queued, "follow-up status: {d:#?}");
    assert!(d.payload.is_empty(), "a follow-up has an empty payload");
    let expected: BTreeMap<String, String> = [
        (FOLLOW_UP_BY.0.to_owned(), FOLLOW_UP_BY.1.to_owned()),
        (FOLLOW_UP_MESSAGES.to_owned(), format!("{first}-{last}")),
    ]
    .into_iter()
    .collect();
    assert_eq!(d.metadata, expected, "follow-up metadata: {d:#?}");
    assert_eq!(d.priority, DEFAULT_PRIORITY);
    assert_eq!(d.max_attempts, DEFAULT_MAX_ATTEMPTS);
    assert_eq!(d.attempt, 0);
    assert_shape(d);
}

/// Gives `thread` a last agent: enqueues dispatch `id` of [`AGENT`], claims and acks it.
async fn run_once(store: &Store, thread: &str, id: &str) {
    put_on(store, thread, id).await;
    let c = claim_id(store, id).await;
    store.mailbox.ack(id, &tok(&c)).await.unwrap();
}

/// Enqueues dispatch `id` of [`AGENT`] on `thread` and claims it with `lease_ms`.
async fn hold(store: &Store, thread: &str, id: &str, lease_ms: u64) -> Dispatch {
    put_on(store, thread, id).await;
    store
        .mailbox
        .claim_dispatch(id, WORKER, lease_ms)
        .await
        .expect("claim_dispatch")
        .unwrap_or_else(|| panic!("claim_dispatch({id}) returned nothing"))
}

fn expect_invalid_naming<T: std::fmt::Debug>(result: StoreResult<T>, field: &str, what: &str) {
    match result {
        Err(StoreError::Invalid(message)) => {
            assert!(
                message.contains(field),
                "{what}: must name {field}: {message}"
            )
        }
        other => panic!("{what}: expected Invalid naming {field}, got {other:?}"),
    }
}

/// Asserts that nothing of `thread` changed: its inbox marks, its messages and its log.
async fn assert_unchanged(
    store: &Store,
    thread: &str,
    inbox: InboxMarks,
    messages: &[Message],
    log: &[LogEntry],
    what: &str,
) {
    assert_eq!(marks(store, thread).await, inbox, "{what}: inbox marks");
    assert_eq!(
        all_messages(store, thread, None).await,
        messages,
        "{what}: messages"
    );
    assert_eq!(
        store.log.read(thread, 0, 100_000).await.unwrap(),
        log,
        "{what}: log"
    );
}

// ---------------------------------------------------------------------------------------------
// M1: order and no gaps

/// Sends are numbered 1, 2, 3 per thread, each thread on its own; every field is stored as
/// sent, stamped by the store's clock, and read back oldest first, a page at a time.
pub async fn messages_are_numbered_from_one_without_gaps_per_thread<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    assert_eq!(marks(&s, "a").await, InboxMarks::default());
    assert!(s.inbox.message("a", 1).await.unwrap().is_none());
    assert!(pending(&s, "a").await.is_empty());

    let first = send(
        &s,
        "a",
        steer("a1").with_metadata("lang", "en").to_agent(OTHER),
    )
    .await;
    assert!(first.follow_ups.is_empty(), "a steer starts nothing");
    let m = &first.message;
    assert_eq!((m.thread.as_str(), m.seq), ("a", 1));
    assert_eq!(m.kind, MessageKind::Steer);
    assert_eq!(m.payload, b"a1");
    assert_eq!(m.metadata.get("lang").map(String::as_str), Some("en"));
    assert_eq!(m.agent.as_deref(), Some(OTHER));
    assert_eq!(m.sent_by, SENDER);
    assert_eq!(m.sent_at, T0);
    assert_eq!(m.state, MessageState::Pending);
    assert_eq!((m.settled_at, &m.acked_by, m.log_seq), (None, &None, None));
    assert_eq!(&message(&s, "a", 1).await, m, "stored as returned");

    env.advance(5);
    assert_eq!(send(&s, "b", steer("b1")).await.message.seq, 1);
    assert_eq!(send(&s, "a", steer("a2")).await.message.seq, 2);
    assert_eq!(send(&s, "b", steer("b2")).await.message.seq, 2);
    assert_eq!(send(&s, "a", steer("a3")).await.message.seq, 3);
    assert_eq!(message(&s, "a", 3).await.sent_at, T0 + 5);

    assert_eq!(pending(&s, "a").await, vec![1, 2, 3]);
    assert_eq!(pending(&s, "b").await, vec![1, 2]);
    let payloads: Vec<Vec<u8>> = all_messages(&s, "a", None)
        .await
        .into_iter()
        .map(|m| m.payload)
        .collect();
    assert_eq!(
        payloads,
        vec![b"a1".to_vec(), b"a2".to_vec(), b"a3".to_vec()]
    );
    assert_eq!(marks(&s, "a").await, inbox_marks(3, 3, 0));
    assert_eq!(marks(&s, "b").await, inbox_marks(2, 2, 0));

    // A page starts after `after` and holds at most `limit`; 0 means 100.
    let page = |after, limit| MessageFilter {
        state: None,
        after,
        limit,
        max_bytes: None,
    };
    let got: Vec<u64> = s
        .inbox
        .messages("a", &page(1, 1))
        .await
        .unwrap()
        .iter()
        .map(|m| m.seq)
        .collect();
    assert_eq!(got, vec![2]);
    assert!(s.inbox.messages("a", &page(3, 0)).await.unwrap().is_empty());
    for i in 0..105 {
        send(&s, "deep", steer(&format!("m{i}"))).await;
    }
    let first_page = s.inbox.messages("deep", &page(0, 0)).await.unwrap();
    assert_eq!(
        first_page.iter().map(|m| m.seq).collect::<Vec<_>>(),
        (1..=100).collect::<Vec<_>>()
    );
    assert_eq!(pending(&s, "deep").await, (1..=105).collect::<Vec<_>>());
    assert_eq!(s.inbox.pending_total().await.unwrap(), 3 + 2 + 105);
}

/// A page of messages with a byte budget ends after the message that brings the payloads read
/// to it (one when the first alone passes it), in every state filter.
pub async fn a_page_of_messages_within_a_budget_ends_at_the_message_that_reaches_it<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    for i in 0..6u8 {
        let new = NewMessage::new(MessageKind::Steer, vec![b'a' + i; 100], SENDER);
        send(&s, "b", new).await;
    }
    s.inbox.discard_messages("b", 2).await.unwrap();
    let page = |state, after, limit, max_bytes| {
        let s = s.clone();
        async move {
            s.inbox
                .messages(
                    "b",
                    &MessageFilter {
                        state,
                        after,
                        limit,
                        max_bytes: Some(max_bytes),
                    },
                )
                .await
                .unwrap()
                .iter()
                .map(|m| m.seq)
                .collect::<Vec<u64>>()
        }
    };
    assert_eq!(page(None, 0, 10, 250).await, vec![1, 2, 3]);
    assert_eq!(page(None, 0, 10, 1).await, vec![1]);
    assert_eq!(page(None, 0, 2, 10_000).await, vec![1, 2]);
    let pending = Some(MessageState::Pending);
    assert_eq!(page(pending, 0, 10, 200).await, vec![3, 4]);
    assert_eq!(page(pending, 4, 10, 10_000).await, vec![5, 6]);
    assert_eq!(
        page(Some(MessageState::Discarded), 0, 10, 10_000).await,
        vec![1, 2]
    );
    assert!(page(pending, 6, 10, 10_000).await.is_empty());
    let whole = s.inbox.message("b", 3).await.unwrap().unwrap();
    assert_eq!(whole.payload, vec![b'c'; 100]);
}

// ---------------------------------------------------------------------------------------------
// Delivery and M2: at least once, acknowledged once

/// A claim lost before its acknowledgement leaves the messages pending: the next claim of the
/// thread is handed every one of them again, and acks them.
pub async fn messages_stay_pending_across_a_claim_lost_before_the_ack<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let c1 = hold(&s, "t", "d1", 100).await;
    let sent = send(&s, "t", steer("one")).await;
    assert!(sent.follow_ups.is_empty(), "the thread has live work");
    send(&s, "t", follow_up("two")).await;
    assert_eq!(
        pending(&s, "t").await,
        vec![1, 2],
        "handed to the first claim"
    );

    // The holder dies before acking anything; its lease is reclaimed (T13, requeued).
    env.advance(101);
    let reclaimed = s.mailbox.reclaim_expired(env.now(), 100).await.unwrap();
    assert_eq!(reclaimed.len(), 1);
    assert_eq!(reclaimed[0].status, Status::Queued);
    assert_eq!(pending(&s, "t").await, vec![1, 2]);
    assert!(
        follow_ups_on(&s, "t").await.is_empty(),
        "a reclaim that requeues leaves live work and starts nothing"
    );
    assert!(matches!(
        s.inbox.ack_message("t", 1, &fence(&c1)).await,
        Err(StoreError::NotClaimed { .. } | StoreError::LostClaim { .. })
    ));

    let c2 = claim_id(&s, "d1").await;
    assert_eq!(
        pending(&s, "t").await,
        vec![1, 2],
        "the next claim reads them again"
    );
    let f2 = fence(&c2);
    let l1 = s.inbox.ack_message("t", 1, &f2).await.unwrap();
    let l2 = s.inbox.ack_message("t", 2, &f2).await.unwrap();
    assert_eq!((l1, l2), (1, 2));
    assert!(pending(&s, "t").await.is_empty());
    for seq in [1, 2] {
        let m = message(&s, "t", seq).await;
        assert_eq!(m.state, MessageState::Acked);
        assert_eq!(m.acked_by.as_deref(), Some("d1"));
    }
    assert_eq!(marks(&s, "t").await, inbox_marks(2, 0, 0));
}

/// An acknowledgement repeated by the same dispatch (a lost reply, or a later claim of the same
/// dispatch) answers the same log sequence and appends nothing.
pub async fn a_repeated_ack_by_the_same_dispatch_returns_the_same_entry_and_appends_nothing<
    F: Factory,
>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let c1 = hold(&s, "t", "d1", LEASE).await;
    send(&s, "t", steer("hello")).await;
    let f1 = fence(&c1);
    let seq = s.inbox.ack_message("t", 1, &f1).await.unwrap();
    assert_eq!(seq, 1);
    let acked = message(&s, "t", 1).await;
    env.advance(10);
    assert_eq!(s.inbox.ack_message("t", 1, &f1).await.unwrap(), seq);
    assert_eq!(message(&s, "t", 1).await, acked, "a repeat changes nothing");
    assert_eq!(s.log.latest("t").await.unwrap(), 1);

    // A later claim of the same dispatch repeats it too.
    s.mailbox
        .nack("d1", &tok(&c1), env.now(), "retry")
        .await
        .unwrap();
    let c2 = claim_id(&s, "d1").await;
    assert_ne!(tok(&c1), tok(&c2));
    assert_eq!(s.inbox.ack_message("t", 1, &fence(&c2)).await.unwrap(), seq);
    assert_eq!(message(&s, "t", 1).await, acked);
    assert_eq!(s.log.latest("t").await.unwrap(), 1);
    assert_eq!(marks(&s, "t").await, inbox_marks(1, 0, 0));
}

/// A message acked by one dispatch is `Duplicate` for any other, naming the first acker, and
/// nothing is appended.
pub async fn an_ack_of_a_message_acked_by_another_dispatch_is_duplicate_naming_the_first_acker<
    F: Factory,
>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "d1").await;
    put_on(&s, "t", "d2").await;
    let c1 = claim_id(&s, "d1").await;
    send(&s, "t", steer("once")).await;
    assert_eq!(s.inbox.ack_message("t", 1, &fence(&c1)).await.unwrap(), 1);
    s.mailbox.ack("d1", &tok(&c1)).await.unwrap();
    let c2 = claim_id(&s, "d2").await;
    let before = message(&s, "t", 1).await;
    match s.inbox.ack_message("t", 1, &fence(&c2)).await {
        Err(StoreError::Duplicate { holder, .. }) => {
            assert_eq!(holder.as_deref(), Some("d1"), "the first acker")
        }
        other => panic!("expected Duplicate, got {other:?}"),
    }
    assert_eq!(message(&s, "t", 1).await, before);
    assert_eq!(s.log.latest("t").await.unwrap(), 1);
    assert_eq!(
        load(&s, "d2").await,
        c2,
        "the refusal leaves the claim alone"
    );
}

/// An acknowledgement of a message never sent, or of a discarded one, is `Invalid` and
/// appends nothing.
pub async fn an_ack_of_a_missing_or_discarded_message_is_invalid_and_appends_nothing<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let c = hold(&s, "t", "d1", LEASE).await;
    let f = fence(&c);
    assert!(matches!(
        s.inbox.ack_message("t", 1, &f).await,
        Err(StoreError::Invalid(_))
    ));
    send(&s, "t", steer("one")).await;
    send(&s, "t", steer("two")).await;
    assert_eq!(s.inbox.discard_messages("t", 1).await.unwrap(), 1);
    assert!(matches!(
        s.inbox.ack_message("t", 1, &f).await,
        Err(StoreError::Invalid(_))
    ));
    assert!(matches!(
        s.inbox.ack_message("t", 3, &f).await,
        Err(StoreError::Invalid(_))
    ));
    assert!(matches!(
        s.inbox.ack_message("t", u64::MAX, &f).await,
        Err(StoreError::Invalid(_))
    ));
    assert_eq!(s.log.latest("t").await.unwrap(), 0);
    assert_eq!(message(&s, "t", 1).await.state, MessageState::Discarded);
    assert_eq!(message(&s, "t", 2).await.state, MessageState::Pending);
    assert_eq!(marks(&s, "t").await, inbox_marks(2, 1, 0));
    assert_eq!(load(&s, "d1").await, c, "the claim is untouched");
    assert_eq!(s.inbox.ack_message("t", 2, &f).await.unwrap(), 1);
}

// ---------------------------------------------------------------------------------------------
// M2: the log append in the same write

/// An acknowledgement appends the message to the thread log in the same write: data = the
/// payload, note = its seq, kind, metadata, sent_at and sent_by, at the log's latest + 1; the
/// message records the ack. No entry carries a note without an acked message.
pub async fn an_acked_message_is_appended_to_the_log_with_its_note<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let c = hold(&s, "t", "d1", LEASE).await;
    let f = fence(&c);
    s.log.append("t", b"before", Some(&f)).await.unwrap();
    env.advance(3);
    let sent = send(
        &s,
        "t",
        NewMessage::new(MessageKind::FollowUp, binary(300, 7), "api:ops")
            .with_metadata("source", "slack")
            .with_metadata("thread-ts", "1700000000.1"),
    )
    .await;
    send(&s, "t", steer("second")).await;
    env.advance(4);
    let log_seq = s.inbox.ack_message("t", 1, &f).await.unwrap();
    assert_eq!(log_seq, 2, "appended at the log's latest + 1");

    let m = message(&s, "t", 1).await;
    assert_eq!(m.state, MessageState::Acked);
    assert_eq!(m.settled_at, Some(T0 + 7));
    assert_eq!(m.acked_by.as_deref(), Some("d1"));
    assert_eq!(m.log_seq, Some(2));
    assert_eq!(m.payload, sent.message.payload);

    let entries = s.log.read("t", 0, 100).await.unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0].note, None, "a plain append has no note");
    let entry = &entries[1];
    assert_eq!(entry.seq, 2);
    assert_eq!(entry.appended_at, T0 + 7);
    assert!(entry.data == sent.message.payload, "data is the payload");
    let note = entry
        .note
        .as_ref()
        .expect("the entry carries the message's note");
    assert_eq!(note.seq, 1);
    assert_eq!(note.kind, MessageKind::FollowUp);
    assert_eq!(note.metadata, sent.message.metadata);
    assert_eq!(note.sent_at, T0 + 3);
    assert_eq!(note.sent_by, "api:ops");
    assert_eq!(note, &m.note());
    assert_eq!(marks(&s, "t").await, inbox_marks(2, 1, 0));

    // Acked in any order, each appends one entry, in acknowledgement order.
    s.log.append("t", b"between", Some(&f)).await.unwrap();
    assert_eq!(s.inbox.ack_message("t", 2, &f).await.unwrap(), 4);
    let noted: Vec<(u64, u64)> = s
        .log
        .read("t", 0, 100)
        .await
        .unwrap()
        .iter()
        .filter_map(|e| e.note.as_ref().map(|n| (e.seq, n.seq)))
        .collect();
    assert_eq!(noted, vec![(2, 1), (4, 2)]);
    for (entry_seq, message_seq) in noted {
        assert_eq!(message(&s, "t", message_seq).await.log_seq, Some(entry_seq));
    }
}

/// A refused acknowledgement (forged token, a fence of another thread, a settled claim) appends
/// nothing and leaves the message pending.
pub async fn a_refused_ack_appends_nothing_and_leaves_the_message_pending<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let c = hold(&s, "t", "d1", LEASE).await;
    let f = fence(&c);
    s.log.append("t", b"kept", Some(&f)).await.unwrap();
    send(&s, "t", steer("waiting")).await;
    let inbox = marks(&s, "t").await;
    let messages = all_messages(&s, "t", None).await;
    let log = s.log.read("t", 0, 100).await.unwrap();

    let forged = Fence {
        token: "forged".into(),
        ..f.clone()
    };
    assert!(matches!(
        s.inbox.ack_message("t", 1, &forged).await,
        Err(StoreError::LostClaim { .. })
    ));
    assert_unchanged(&s, "t", inbox, &messages, &log, "forged token").await;

    let elsewhere = hold(&s, "u", "e1", LEASE).await;
    assert!(
        s.inbox
            .ack_message("t", 1, &fence(&elsewhere))
            .await
            .is_err(),
        "a fence of another thread's claim cannot ack"
    );
    assert_unchanged(&s, "t", inbox, &messages, &log, "fence of thread u").await;

    let ghost = Fence {
        dispatch: "ghost".into(),
        token: "x".into(),
        epoch: 0,
    };
    assert!(matches!(
        s.inbox.ack_message("t", 1, &ghost).await,
        Err(StoreError::NotFound { .. })
    ));
    assert_unchanged(&s, "t", inbox, &messages, &log, "fence of no dispatch").await;

    put_on(&s, "t", "d2").await;
    s.mailbox.ack("d1", &tok(&c)).await.unwrap();
    assert!(matches!(
        s.inbox.ack_message("t", 1, &f).await,
        Err(StoreError::NotClaimed { .. })
    ));
    assert_unchanged(&s, "t", inbox, &messages, &log, "settled claim").await;
}

// ---------------------------------------------------------------------------------------------
// M2: fencing

/// Once the lease ran out, an acknowledgement is refused (at the boundary it still holds),
/// nothing is appended and the message stays pending.
pub async fn an_ack_after_the_lease_ran_out_is_refused_and_the_message_stays_pending<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let c = hold(&s, "t", "d1", 100).await;
    let f = fence(&c);
    send(&s, "t", steer("in time")).await;
    send(&s, "t", steer("too late")).await;
    env.advance(100);
    assert_eq!(
        s.inbox.ack_message("t", 1, &f).await.unwrap(),
        1,
        "at the lease's end"
    );
    env.advance(1);
    match s.inbox.ack_message("t", 2, &f).await {
        Err(StoreError::LostClaim { id }) | Err(StoreError::NotClaimed { id, .. }) => {
            assert_eq!(id, "d1")
        }
        other => panic!("expected the expired claim to be refused, got {other:?}"),
    }
    assert_eq!(s.log.latest("t").await.unwrap(), 1);
    assert_eq!(pending(&s, "t").await, vec![2]);
    assert_eq!(marks(&s, "t").await, inbox_marks(2, 1, 0));

    // After the reclaim, the next claim acks it.
    s.mailbox.reclaim_expired(env.now(), 100).await.unwrap();
    let c2 = claim_id(&s, "d1").await;
    assert_eq!(s.inbox.ack_message("t", 2, &fence(&c2)).await.unwrap(), 2);
}

/// After an interrupt, an acknowledgement is `StaleEpoch`: the dispatch is superseded in the
/// same step, nothing is appended, the message stays pending and no follow-up starts.
pub async fn an_ack_after_an_interrupt_is_stale_epoch_and_supersedes_the_dispatch<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let c = hold(&s, "t", "d1", LEASE).await;
    let f = fence(&c);
    send(&s, "t", steer("steer me")).await;
    send(&s, "t", follow_up("then this")).await;
    s.mailbox.interrupt("t", "new user message").await.unwrap();
    match s.inbox.ack_message("t", 1, &f).await {
        Err(StoreError::StaleEpoch {
            id,
            dispatch,
            thread,
        }) => assert_eq!((id.as_str(), dispatch, thread), ("d1", 0, 1)),
        other => panic!("expected StaleEpoch, got {other:?}"),
    }
    let d = load(&s, "d1").await;
    assert_eq!(d.status, Status::Superseded);
    assert_shape(&d);
    assert_eq!(s.log.latest("t").await.unwrap(), 0);
    assert_eq!(pending(&s, "t").await, vec![1, 2]);
    assert_eq!(marks(&s, "t").await, inbox_marks(2, 2, 0));
    assert!(
        live_on(&s, "t").await.is_empty(),
        "an interrupt and its supersede start no follow-up"
    );
}

// ---------------------------------------------------------------------------------------------
// Survival and hand-over

/// Messages, their states and the inbox watermarks survive a restart; sequences continue.
pub async fn messages_and_watermarks_survive_a_restart<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    run_once(&s, "t", "d0").await;
    let c = hold(&s, "t", "d1", LEASE).await;
    send(&s, "t", steer("acked").with_metadata("k", "v")).await;
    send(&s, "t", steer("discarded")).await;
    send(&s, "t", steer("covered").to_agent(AGENT)).await;
    s.inbox.ack_message("t", 1, &fence(&c)).await.unwrap();
    env.advance(2);
    s.inbox.discard_messages("t", 2).await.unwrap();
    env.advance(2);
    s.mailbox.ack("d1", &tok(&c)).await.unwrap();
    send(&s, "t", steer("waiting")).await;
    send(&s, "idle", steer("alone")).await;

    let before_t = all_messages(&s, "t", None).await;
    let before_idle = all_messages(&s, "idle", None).await;
    let marks_t = marks(&s, "t").await;
    assert_eq!(marks_t, inbox_marks(4, 2, 3));
    let log = s.log.read("t", 0, 100).await.unwrap();
    let dispatches = all(&s).await;
    drop(s);

    let r = env.open().await;
    assert_eq!(all_messages(&r, "t", None).await, before_t);
    assert_eq!(all_messages(&r, "idle", None).await, before_idle);
    assert_eq!(marks(&r, "t").await, marks_t);
    assert_eq!(marks(&r, "idle").await, inbox_marks(1, 1, 0));
    assert_eq!(r.log.read("t", 0, 100).await.unwrap(), log);
    assert_eq!(all(&r).await, dispatches);
    assert_eq!(r.inbox.pending_total().await.unwrap(), 3);
    assert_eq!(send(&r, "t", steer("next")).await.message.seq, 5);
    assert_eq!(send(&r, "idle", steer("next")).await.message.seq, 2);
}

/// Messages a run leaves pending are handed to the next run of the thread, which acks them; the
/// log holds every acked message once, in acknowledgement order.
pub async fn messages_left_by_a_run_are_handed_to_the_next_run_of_the_thread<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    put_on(&s, "t", "d1").await;
    put_on(&s, "t", "d2").await;
    let c1 = claim_id(&s, "d1").await;
    for text in ["one", "two", "three"] {
        assert!(send(&s, "t", steer(text)).await.follow_ups.is_empty());
    }
    assert_eq!(pending(&s, "t").await, vec![1, 2, 3]);
    s.inbox.ack_message("t", 2, &fence(&c1)).await.unwrap();
    s.mailbox
        .complete("d1", &tok(&c1), RunResult::success(b"done".to_vec()))
        .await
        .unwrap();
    assert!(
        follow_ups_on(&s, "t").await.is_empty(),
        "d2 is still live: the thread is not idle"
    );

    let c2 = claim_some(&s).await;
    assert_eq!(c2.id, "d2");
    assert_eq!(
        pending(&s, "t").await,
        vec![1, 3],
        "the next run is handed them"
    );
    let f2 = fence(&c2);
    s.inbox.ack_message("t", 3, &f2).await.unwrap();
    s.inbox.ack_message("t", 1, &f2).await.unwrap();
    s.mailbox.ack("d2", &tok(&c2)).await.unwrap();
    assert!(
        follow_ups_on(&s, "t").await.is_empty(),
        "nothing left to answer"
    );
    let order: Vec<(u64, Vec<u8>)> = s
        .log
        .read("t", 0, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.note.expect("a message entry").seq, e.data))
        .collect();
    assert_eq!(
        order,
        vec![
            (2, b"two".to_vec()),
            (3, b"three".to_vec()),
            (1, b"one".to_vec())
        ]
    );
    let ackers: BTreeSet<Option<String>> = all_messages(&s, "t", None)
        .await
        .into_iter()
        .map(|m| m.acked_by)
        .collect();
    assert_eq!(
        ackers,
        [Some("d1".to_owned()), Some("d2".to_owned())]
            .into_iter()
            .collect()
    );
    assert_eq!(marks(&s, "t").await, inbox_marks(3, 0, 0));
}

// ---------------------------------------------------------------------------------------------
// M4: follow-ups

/// A `follow_up` sent to an idle thread that ran an agent before starts exactly one dispatch of
/// that agent, returned by the send, and moves `followed` to `latest`.
pub async fn a_follow_up_sent_to_an_idle_thread_starts_one_dispatch_of_its_last_agent<
    F: Factory,
>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    run_once(&s, "t", "d0").await;
    let sent = send(&s, "t", follow_up("what about tomorrow?")).await;
    assert_eq!(sent.follow_ups.len(), 1);
    let d = load(&s, &sent.follow_ups[0]).await;
    assert_follow_up(&d, AGENT, "t", 1, 1);
    assert_eq!(d.created_at, T0);
    assert_eq!(follow_ups_on(&s, "t").await, vec![d.clone()]);
    assert_eq!(marks(&s, "t").await, inbox_marks(1, 1, 1));

    // The follow-up is claimable like any dispatch and is handed the message.
    let c = claim_some(&s).await;
    assert_eq!(c.id, d.id);
    assert_eq!(pending(&s, "t").await, vec![1]);
    s.inbox.ack_message("t", 1, &fence(&c)).await.unwrap();
    s.mailbox.ack(&c.id, &tok(&c)).await.unwrap();
    assert_eq!(follow_ups_on(&s, "t").await.len(), 1, "no second follow-up");
    assert!(live_on(&s, "t").await.is_empty());
}

/// A `follow_up` naming an agent starts a dispatch of that agent, also on a thread that never
/// ran one; the pending messages it covers go to it.
pub async fn a_follow_up_naming_an_agent_starts_that_agents_dispatch<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    send(&s, "fresh", steer("context first")).await;
    let sent = send(&s, "fresh", follow_up("now answer").to_agent(OTHER)).await;
    assert_eq!(sent.follow_ups.len(), 1);
    assert_follow_up(&load(&s, &sent.follow_ups[0]).await, OTHER, "fresh", 1, 2);
    assert_eq!(marks(&s, "fresh").await, inbox_marks(2, 2, 2));

    run_once(&s, "ran", "d0").await;
    let sent = send(&s, "ran", follow_up("you, please").to_agent(OTHER)).await;
    assert_eq!(sent.follow_ups.len(), 1);
    assert_follow_up(&load(&s, &sent.follow_ups[0]).await, OTHER, "ran", 1, 1);
}

/// A `steer` sent to an idle thread starts nothing and waits; a later `follow_up` covers both.
pub async fn a_steer_sent_to_an_idle_thread_starts_nothing<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    run_once(&s, "t", "d0").await;
    let sent = send(&s, "t", steer("by the way")).await;
    assert!(sent.follow_ups.is_empty());
    assert!(live_on(&s, "t").await.is_empty());
    assert_eq!(marks(&s, "t").await, inbox_marks(1, 1, 0));

    let sent = send(&s, "t", follow_up("so?")).await;
    assert_eq!(sent.follow_ups.len(), 1);
    assert_follow_up(&load(&s, &sent.follow_ups[0]).await, AGENT, "t", 1, 2);
    assert_eq!(marks(&s, "t").await, inbox_marks(2, 2, 2));
}

/// A message sent while the thread has a queued or a claimed dispatch starts nothing at send,
/// whatever its kind.
pub async fn a_message_sent_while_a_dispatch_is_live_starts_nothing_at_send<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    run_once(&s, "t", "d0").await;
    put_on(&s, "t", "queued").await;
    for new in [follow_up("while queued"), steer("while queued")] {
        assert!(send(&s, "t", new).await.follow_ups.is_empty());
    }
    claim_id(&s, "queued").await;
    for new in [follow_up("while claimed"), steer("while claimed")] {
        assert!(send(&s, "t", new).await.follow_ups.is_empty());
    }
    assert!(follow_ups_on(&s, "t").await.is_empty());
    assert_eq!(marks(&s, "t").await, inbox_marks(4, 4, 0));
}

/// Each settlement that leaves the thread without live work with uncovered pending messages
/// starts one follow-up in the same step: an ack (T8) or a completion, a nack that
/// dead-letters (T10), a dead-letter (T11), a reclaim that dead-letters (T13). The follow-up
/// is of the settled dispatch's agent and covers every uncovered message; `followed` becomes
/// `latest`.
pub async fn each_settlement_that_leaves_the_thread_idle_starts_a_follow_up<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    for how in [
        "ack",
        "complete",
        "nack_at_max",
        "dead_letter",
        "reclaim_at_max",
    ] {
        let thread = format!("t-{how}");
        let id = format!("d-{how}");
        put(&s, nd(&thread, &id).with_max_attempts(1)).await;
        let c = s
            .mailbox
            .claim_dispatch(&id, WORKER, 100)
            .await
            .unwrap()
            .unwrap();
        send(&s, &thread, steer("first")).await;
        send(&s, &thread, follow_up("second")).await;
        send(&s, &thread, steer("third")).await;
        s.inbox.ack_message(&thread, 1, &fence(&c)).await.unwrap();
        assert!(follow_ups_on(&s, &thread).await.is_empty(), "{how}: live");
        let t = tok(&c);
        let settled = match how {
            "ack" => s.mailbox.ack(&id, &t).await.unwrap(),
            "complete" => s
                .mailbox
                .complete(&id, &t, RunResult::success(vec![1]))
                .await
                .unwrap(),
            "nack_at_max" => s.mailbox.nack(&id, &t, env.now(), "e").await.unwrap(),
            "dead_letter" => s.mailbox.dead_letter(&id, &t, "e").await.unwrap(),
            _ => {
                env.advance(101);
                let got = s.mailbox.reclaim_expired(env.now(), 100).await.unwrap();
                assert_eq!(got.len(), 1, "{how}");
                got.into_iter().next().unwrap()
            }
        };
        let expected = if matches!(how, "ack" | "complete") {
            Status::Acked
        } else {
            Status::DeadLetter
        };
        assert_eq!(settled.status, expected, "{how}");
        let ups = follow_ups_on(&s, &thread).await;
        assert_eq!(ups.len(), 1, "{how}: one follow-up");
        assert_follow_up(&ups[0], AGENT, &thread, 2, 3);
        assert_eq!(
            marks(&s, &thread).await,
            inbox_marks(3, 2, 3),
            "{how}: followed = latest"
        );
        assert_eq!(live_on(&s, &thread).await, ups, "{how}");
    }
}

/// A settlement starts nothing when every pending message is covered, or none is pending.
pub async fn a_settlement_with_nothing_uncovered_starts_nothing<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    // Nothing ever sent.
    run_once(&s, "quiet", "q0").await;
    assert!(follow_ups_on(&s, "quiet").await.is_empty());
    // Everything acked by the run.
    let c = hold(&s, "t", "d1", LEASE).await;
    send(&s, "t", steer("one")).await;
    send(&s, "t", follow_up("two")).await;
    let f = fence(&c);
    s.inbox.ack_message("t", 1, &f).await.unwrap();
    s.inbox.ack_message("t", 2, &f).await.unwrap();
    s.mailbox.ack("d1", &tok(&c)).await.unwrap();
    assert!(follow_ups_on(&s, "t").await.is_empty());
    // Everything discarded.
    let c = hold(&s, "t", "d2", LEASE).await;
    send(&s, "t", follow_up("three")).await;
    assert_eq!(s.inbox.discard_messages("t", 3).await.unwrap(), 1);
    s.mailbox.ack("d2", &tok(&c)).await.unwrap();
    assert!(follow_ups_on(&s, "t").await.is_empty());
    assert_eq!(marks(&s, "t").await.pending, 0);
}

/// A nack that requeues leaves live work: it starts nothing, and the requeued run is handed the
/// messages.
pub async fn a_nack_that_requeues_starts_no_follow_up<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let c = hold(&s, "t", "d1", LEASE).await;
    send(&s, "t", follow_up("please")).await;
    let d = s
        .mailbox
        .nack("d1", &tok(&c), env.now(), "e")
        .await
        .unwrap();
    assert_eq!(d.status, Status::Queued);
    assert!(follow_ups_on(&s, "t").await.is_empty());
    assert_eq!(marks(&s, "t").await, inbox_marks(1, 1, 0));
    let c = claim_some(&s).await;
    assert_eq!(c.id, "d1");
    assert_eq!(pending(&s, "t").await, vec![1]);
}

/// A cancel (T3), an interrupt (T4) and the supersedes it causes (T15, by a holder's write or by
/// the reclaim of its expired claim, and T14 by the control plane) start no follow-up: the
/// pending messages wait for the thread's next run.
pub async fn cancel_and_interrupt_start_no_follow_up<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;

    // Cancel of the thread's only live dispatch.
    run_once(&s, "c", "c0").await;
    put_on(&s, "c", "c1").await;
    send(&s, "c", follow_up("one")).await;
    send(&s, "c", steer("two")).await;
    assert!(s.mailbox.cancel("c1").await.unwrap().is_some());
    assert!(live_on(&s, "c").await.is_empty());
    assert!(follow_ups_on(&s, "c").await.is_empty(), "cancel");
    assert_eq!(marks(&s, "c").await, inbox_marks(2, 2, 0));

    // Interrupt of a thread with a claimed and a queued dispatch; the holder's next write is
    // refused and supersedes it.
    let c = hold(&s, "i", "i1", LEASE).await;
    put_on(&s, "i", "i2").await;
    send(&s, "i", follow_up("one")).await;
    let interrupt = s.mailbox.interrupt("i", "stop").await.unwrap();
    assert_eq!(interrupt.superseded, vec!["i2".to_owned()]);
    assert!(follow_ups_on(&s, "i").await.is_empty(), "interrupt");
    assert!(matches!(
        s.mailbox.ack("i1", &tok(&c)).await,
        Err(StoreError::StaleEpoch { .. })
    ));
    assert!(live_on(&s, "i").await.is_empty());
    assert!(
        follow_ups_on(&s, "i").await.is_empty(),
        "stale-epoch supersede"
    );
    assert_eq!(pending(&s, "i").await, vec![1]);

    // Supersede of the claimed dispatch by the control plane.
    hold(&s, "p", "p1", LEASE).await;
    send(&s, "p", follow_up("one")).await;
    assert!(
        s.mailbox
            .supersede_claimed("p1", None, "operator")
            .await
            .unwrap()
            .is_some()
    );
    assert!(live_on(&s, "p").await.is_empty());
    assert!(follow_ups_on(&s, "p").await.is_empty(), "supersede_claimed");
    assert_eq!(pending(&s, "p").await, vec![1]);

    // An interrupt of a thread whose holder then goes silent: the reclaim finds the expired
    // claim of a stale epoch and supersedes it (T15), which starts nothing either.
    hold(&s, "r", "r1", LEASE).await;
    send(&s, "r", follow_up("one")).await;
    s.mailbox.interrupt("r", "stop").await.unwrap();
    env.advance(LEASE + 1);
    let reclaimed = s.mailbox.reclaim_expired(env.now(), 100).await.unwrap();
    assert!(reclaimed.is_empty(), "a stale claim is not reported");
    assert_eq!(
        s.mailbox.load("r1").await.unwrap().map(|d| d.status),
        Some(Status::Superseded)
    );
    assert!(live_on(&s, "r").await.is_empty());
    assert!(
        follow_ups_on(&s, "r").await.is_empty(),
        "a reclaim that supersedes"
    );
    assert_eq!(pending(&s, "r").await, vec![1]);

    // The messages wait for the thread's next run: it is handed them, and when it settles
    // without acking them they are answered by a follow-up.
    let next = hold(&s, "i", "i3", LEASE).await;
    assert_eq!(pending(&s, "i").await, vec![1]);
    s.mailbox.ack("i3", &tok(&next)).await.unwrap();
    let ups = follow_ups_on(&s, "i").await;
    assert_eq!(ups.len(), 1, "the next run's settlement answers them");
    assert_follow_up(&ups[0], AGENT, "i", 1, 1);
}

/// A follow-up run that acks nothing leaves its messages pending and covered: its settlement
/// starts no second follow-up. A message sent later starts one of its own, covering only it.
pub async fn a_follow_up_run_that_acks_nothing_starts_no_second_follow_up<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    run_once(&s, "t", "d0").await;
    let first = send(&s, "t", follow_up("one")).await;
    assert_eq!(first.follow_ups.len(), 1);
    let c = claim_some(&s).await;
    assert_eq!(c.id, first.follow_ups[0]);
    s.mailbox.ack(&c.id, &tok(&c)).await.unwrap();
    assert_eq!(follow_ups_on(&s, "t").await.len(), 1, "no second follow-up");
    assert!(live_on(&s, "t").await.is_empty());
    assert_eq!(pending(&s, "t").await, vec![1], "left pending, visible");
    assert_eq!(marks(&s, "t").await, inbox_marks(1, 1, 1));

    // A follow-up that dead-letters without acking starts nothing either.
    let second = send(&s, "t", follow_up("two")).await;
    assert_eq!(second.follow_ups.len(), 1);
    assert_follow_up(&load(&s, &second.follow_ups[0]).await, AGENT, "t", 2, 2);
    let c = claim_some(&s).await;
    s.mailbox
        .dead_letter(&c.id, &tok(&c), "gave up")
        .await
        .unwrap();
    assert_eq!(follow_ups_on(&s, "t").await.len(), 2);
    assert!(live_on(&s, "t").await.is_empty());
    assert_eq!(pending(&s, "t").await, vec![1, 2]);
    assert_eq!(marks(&s, "t").await, inbox_marks(2, 2, 2));
}

/// Messages naming different agents start one follow-up per agent (the default being the
/// settled dispatch's agent), each covering its own messages.
pub async fn messages_naming_different_agents_start_one_follow_up_per_agent<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let c = hold(&s, "t", "d1", LEASE).await;
    send(&s, "t", steer("for the default")).await;
    send(&s, "t", follow_up("for the other").to_agent(OTHER)).await;
    send(&s, "t", follow_up("default again")).await;
    send(&s, "t", steer("other again").to_agent(OTHER)).await;
    send(&s, "t", steer("named default").to_agent(AGENT)).await;
    s.mailbox.ack("d1", &tok(&c)).await.unwrap();
    let mut ups = follow_ups_on(&s, "t").await;
    ups.sort_by(|a, b| a.agent.cmp(&b.agent));
    assert_eq!(ups.len(), 2, "one per agent: {ups:#?}");
    assert_follow_up(&ups[0], AGENT, "t", 1, 5);
    assert_follow_up(&ups[1], OTHER, "t", 2, 4);
    assert_eq!(marks(&s, "t").await, inbox_marks(5, 5, 5));

    // At send (M4 case a) too: the sent message's agent is the default.
    run_once(&s, "u", "u0").await;
    let c = hold(&s, "u", "u1", LEASE).await;
    send(&s, "u", steer("for the default")).await;
    send(&s, "u", steer("for the other").to_agent(OTHER)).await;
    s.inbox.ack_message("u", 1, &fence(&c)).await.unwrap();
    s.inbox.ack_message("u", 2, &fence(&c)).await.unwrap();
    s.mailbox.ack("u1", &tok(&c)).await.unwrap();
    send(&s, "u", steer("idle, for the other").to_agent(OTHER)).await;
    send(&s, "u", steer("idle, no agent")).await;
    let sent = send(&s, "u", follow_up("named").to_agent(AGENT)).await;
    assert_eq!(sent.follow_ups.len(), 2);
    let mut ups: Vec<Dispatch> = Vec::new();
    for id in &sent.follow_ups {
        ups.push(load(&s, id).await);
    }
    ups.sort_by(|a, b| a.agent.cmp(&b.agent));
    assert_follow_up(&ups[0], AGENT, "u", 4, 5);
    assert_follow_up(&ups[1], OTHER, "u", 3, 3);
}

/// A `follow_up` to a thread that never ran an agent and names none is `Invalid` mentioning
/// `agent`, and nothing is stored.
pub async fn a_follow_up_to_a_thread_that_never_ran_an_agent_and_names_none_is_invalid<
    F: Factory,
>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    expect_invalid_naming(
        s.inbox
            .send("t", follow_up("hello?"), DEFAULT_MAX_INBOX)
            .await,
        "agent",
        "follow-up to a thread that never ran",
    );
    assert_eq!(marks(&s, "t").await, InboxMarks::default());
    assert!(s.inbox.message("t", 1).await.unwrap().is_none());
    assert!(live_on(&s, "t").await.is_empty());

    // A steer is stored and starts nothing; the refusal stays until an agent is named.
    send(&s, "t", steer("context")).await;
    let inbox = marks(&s, "t").await;
    let messages = all_messages(&s, "t", None).await;
    expect_invalid_naming(
        s.inbox
            .send("t", follow_up("hello?"), DEFAULT_MAX_INBOX)
            .await,
        "agent",
        "follow-up after a steer",
    );
    assert_unchanged(&s, "t", inbox, &messages, &[], "refused follow-up").await;
    assert!(live_on(&s, "t").await.is_empty());
    let sent = send(&s, "t", follow_up("hello?").to_agent(OTHER)).await;
    assert_eq!(sent.message.seq, 2);
    assert_eq!(sent.follow_ups.len(), 1);
}

// ---------------------------------------------------------------------------------------------
// Limits

/// A send to a thread with `max_pending` pending messages is `Limit` naming the cap, and stores
/// nothing; once one is settled the next send is accepted with the next sequence.
pub async fn a_send_over_max_pending_is_limit_and_stores_nothing<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let c = hold(&s, "t", "d1", LEASE).await;
    for i in 1..=3u64 {
        let sent = s.inbox.send("t", steer("m"), 3).await.unwrap();
        assert_eq!(sent.message.seq, i);
    }
    let inbox = marks(&s, "t").await;
    let messages = all_messages(&s, "t", None).await;
    for new in [
        steer("over"),
        follow_up("over"),
        follow_up("over").to_agent(OTHER),
    ] {
        match s.inbox.send("t", new, 3).await {
            Err(StoreError::Limit(message)) => assert!(
                message.contains("max_inbox") && message.contains('3'),
                "the refusal names the cap and its value: {message}"
            ),
            other => panic!("expected Limit, got {other:?}"),
        }
        assert_unchanged(&s, "t", inbox, &messages, &[], "over max_pending").await;
    }
    assert!(matches!(
        s.inbox.send("u", steer("none allowed"), 0).await,
        Err(StoreError::Limit(_))
    ));
    assert_eq!(marks(&s, "u").await, InboxMarks::default());

    // A refusal by the cap also starts no follow-up on an idle thread.
    s.mailbox.ack("d1", &tok(&c)).await.unwrap();
    let ups = follow_ups_on(&s, "t").await;
    assert_eq!(ups.len(), 1);
    let inbox = marks(&s, "t").await;
    let messages = all_messages(&s, "t", None).await;
    let f = claim_some(&s).await;
    s.mailbox.ack(&f.id, &tok(&f)).await.unwrap();
    assert!(matches!(
        s.inbox.send("t", follow_up("over"), 3).await,
        Err(StoreError::Limit(_))
    ));
    assert_unchanged(&s, "t", inbox, &messages, &[], "over max_pending, idle").await;
    assert_eq!(follow_ups_on(&s, "t").await.len(), 1);

    assert_eq!(s.inbox.discard_messages("t", 1).await.unwrap(), 1);
    assert_eq!(
        s.inbox
            .send("t", steer("fits"), 3)
            .await
            .unwrap()
            .message
            .seq,
        4
    );
}

/// An empty payload, and one over the backend's `max_message`, are `Invalid` naming `payload`
/// (the latter with its size and the limit) and store nothing; metadata over 16 KiB is `Invalid`
/// naming `metadata`. A binary payload at the limit (or 2 MiB, whichever is less) is stored,
/// acked and appended byte for byte.
pub async fn empty_and_oversized_messages_are_invalid_and_store_nothing<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let limit = s.inbox.max_message();
    assert!(limit > 0);
    expect_invalid_naming(
        s.inbox.send("t", steer(""), DEFAULT_MAX_INBOX).await,
        "payload",
        "empty payload",
    );
    let over = usize::try_from(limit + 1).unwrap();
    expect_too_large(
        s.inbox
            .send(
                "t",
                NewMessage::new(MessageKind::Steer, vec![0u8; over], SENDER),
                DEFAULT_MAX_INBOX,
            )
            .await,
        "payload",
        over,
        limit,
    );
    expect_invalid_naming(
        s.inbox
            .send(
                "t",
                steer("fat").with_metadata("k", "v".repeat(16 * 1024)),
                DEFAULT_MAX_INBOX,
            )
            .await,
        "metadata",
        "metadata over 16 KiB",
    );
    expect_invalid_naming(
        s.inbox.send(" ", steer("x"), DEFAULT_MAX_INBOX).await,
        "thread",
        "blank thread",
    );
    assert_eq!(marks(&s, "t").await, InboxMarks::default());
    assert!(s.inbox.message("t", 1).await.unwrap().is_none());

    let n = usize::try_from(limit.min(2 << 20)).unwrap();
    let payload = binary(n, 5);
    let c = hold(&s, "t", "d1", LEASE).await;
    let sent = send(
        &s,
        "t",
        NewMessage::new(MessageKind::Steer, payload.clone(), SENDER).with_metadata("k", "v"),
    )
    .await;
    assert_eq!(sent.message.seq, 1);
    let log_seq = s.inbox.ack_message("t", 1, &fence(&c)).await.unwrap();
    for store in [&s, &env.open().await] {
        assert!(
            message(store, "t", 1).await.payload == payload,
            "stored payload differs"
        );
        let entries = store.log.read("t", 0, 10).await.unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].seq, log_seq);
        assert!(entries[0].data == payload, "appended payload differs");
        assert_eq!(entries[0].note.as_ref().map(|n| n.seq), Some(1));
    }
}

// ---------------------------------------------------------------------------------------------
// M3 and maintenance

/// Discard settles every pending message at or below `through` as `Discarded`, counts them,
/// appends nothing, and leaves acked and later messages alone.
pub async fn discard_settles_pending_messages_through_a_sequence_and_appends_nothing<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let c = hold(&s, "t", "d1", LEASE).await;
    for text in ["one", "two", "three", "four"] {
        send(&s, "t", steer(text)).await;
    }
    s.inbox.ack_message("t", 2, &fence(&c)).await.unwrap();
    let acked = message(&s, "t", 2).await;
    env.advance(9);
    assert_eq!(s.inbox.discard_messages("t", 3).await.unwrap(), 2);
    for seq in [1, 3] {
        let m = message(&s, "t", seq).await;
        assert_eq!(m.state, MessageState::Discarded, "{seq}");
        assert_eq!(m.settled_at, Some(T0 + 9), "{seq}");
        assert_eq!((&m.acked_by, m.log_seq), (&None, None), "{seq}");
    }
    assert_eq!(message(&s, "t", 2).await, acked);
    assert_eq!(pending(&s, "t").await, vec![4]);
    assert_eq!(
        seqs_in(&s, "t", Some(MessageState::Discarded)).await,
        vec![1, 3]
    );
    assert_eq!(seqs_in(&s, "t", Some(MessageState::Acked)).await, vec![2]);
    assert_eq!(s.log.latest("t").await.unwrap(), 1, "only the ack appended");
    assert_eq!(marks(&s, "t").await, inbox_marks(4, 1, 0));
    assert_eq!(s.inbox.discard_messages("t", 3).await.unwrap(), 0);
    assert_eq!(s.inbox.discard_messages("nobody", 100).await.unwrap(), 0);
    assert_eq!(s.inbox.discard_messages("t", u64::MAX).await.unwrap(), 1);
    assert_eq!(marks(&s, "t").await, inbox_marks(4, 0, 0));
    assert_eq!(s.log.latest("t").await.unwrap(), 1);
    assert_eq!(s.inbox.pending_total().await.unwrap(), 0);
}

/// Purge removes acked and discarded messages settled before the cutoff, never a pending one;
/// the log entry of an acked message stays, and sequences are never reused.
pub async fn purge_removes_settled_messages_before_the_cutoff_and_never_pending_ones<F: Factory>(
    factory: &F,
) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    let c = hold(&s, "t", "d1", LEASE).await;
    for text in ["acked", "discarded", "pending"] {
        send(&s, "t", steer(text)).await;
    }
    env.advance(10);
    s.inbox.ack_message("t", 1, &fence(&c)).await.unwrap();
    env.advance(10);
    s.inbox.discard_messages("t", 2).await.unwrap();
    send(&s, "u", steer("old but pending")).await;

    assert_eq!(
        s.inbox.purge_messages(T0 + 10).await.unwrap(),
        0,
        "strictly before"
    );
    assert_eq!(s.inbox.purge_messages(T0 + 11).await.unwrap(), 1);
    assert!(s.inbox.message("t", 1).await.unwrap().is_none());
    assert_eq!(message(&s, "t", 2).await.state, MessageState::Discarded);
    assert_eq!(
        s.inbox.purge_messages(u64::MAX).await.unwrap(),
        1,
        "pending messages are never purged"
    );
    assert_eq!(seqs_in(&s, "t", None).await, vec![3]);
    assert_eq!(pending(&s, "u").await, vec![1]);
    assert_eq!(marks(&s, "t").await, inbox_marks(3, 1, 0));
    let entries = s.log.read("t", 0, 10).await.unwrap();
    assert_eq!(entries.len(), 1, "the acked message's entry stays");
    assert_eq!(entries[0].note.as_ref().map(|n| n.seq), Some(1));
    assert_eq!(send(&s, "t", steer("next")).await.message.seq, 4);
}

// ---------------------------------------------------------------------------------------------
// Concurrency and watches

/// `follow_up` sends on two instances racing the settlement of the thread's run (and of the
/// follow-ups it starts) on a third: after everything settles, every message is covered by
/// exactly one follow-up (none pending above `followed` on an idle thread) and each follow-up
/// answers a range of its own.
pub async fn racing_sends_and_settlements_leave_no_message_uncovered<F: Factory>(factory: &F) {
    const THREADS: usize = 4;
    const SENDS: usize = 12;
    let env = Env::new(factory).await;
    let hosts = env.open_many(3).await;
    for t in 0..THREADS {
        let thread = format!("t{t}");
        put_on(&hosts[0], &thread, &format!("run-{t}")).await;
        claim_id(&hosts[0], &format!("run-{t}")).await;
    }

    let mut tasks = JoinSet::new();
    for (h, host) in hosts.iter().enumerate().take(2) {
        let host = host.clone();
        tasks.spawn(async move {
            for i in 0..SENDS {
                for t in 0..THREADS {
                    let thread = format!("t{t}");
                    let new = follow_up(&format!("h{h} m{i}"));
                    let sent = retry(|| host.inbox.send(&thread, new.clone(), DEFAULT_MAX_INBOX))
                        .await
                        .unwrap_or_else(|e| panic!("send to {thread}: {e}"));
                    assert!(sent.follow_ups.len() <= 1, "one agent, one follow-up");
                }
                tokio::task::yield_now().await;
            }
        });
    }
    // The worker: settles every claimable dispatch (the runs, then the follow-ups) without
    // acking any message, while the sends go on.
    let worker = hosts[2].clone();
    tasks.spawn(async move {
        for t in 0..THREADS {
            let id = format!("run-{t}");
            let d = load(&worker, &id).await;
            retry(|| worker.mailbox.ack(&id, d.token().unwrap()))
                .await
                .unwrap();
            tokio::task::yield_now().await;
        }
        for _ in 0..SENDS {
            while let Some(d) = retry(|| worker.mailbox.claim(AGENT, WORKER, LEASE))
                .await
                .unwrap()
            {
                let t = tok(&d);
                retry(|| worker.mailbox.ack(&d.id, &t)).await.unwrap();
            }
            tokio::task::yield_now().await;
        }
    });
    while let Some(joined) = tasks.join_next().await {
        if let Err(err) = joined {
            std::panic::resume_unwind(err.into_panic());
        }
    }
    // Drain what is left.
    let s = &hosts[0];
    while let Some(d) = claim(s).await {
        s.mailbox.ack(&d.id, &tok(&d)).await.unwrap();
    }

    for t in 0..THREADS {
        let thread = format!("t{t}");
        assert!(live_on(s, &thread).await.is_empty(), "{thread}: idle");
        let inbox = marks(s, &thread).await;
        let sent = u64::try_from(2 * SENDS).unwrap();
        assert_eq!(inbox.latest, sent, "{thread}: every send stored");
        assert_eq!(inbox.pending, sent, "{thread}: nothing acked");
        assert_eq!(
            inbox.followed, inbox.latest,
            "{thread}: a pending message above followed is uncovered"
        );
        assert_eq!(pending(s, &thread).await, (1..=sent).collect::<Vec<_>>());
        // Every message in exactly one follow-up's range.
        let mut covered: Vec<u64> = Vec::new();
        for d in follow_ups_on(s, &thread).await {
            let range = &d.metadata[FOLLOW_UP_MESSAGES];
            let (first, last) = range.split_once('-').expect("first-last");
            let (first, last): (u64, u64) = (first.parse().unwrap(), last.parse().unwrap());
            assert!(first <= last, "{thread}: {range}");
            covered.extend(first..=last);
        }
        covered.sort_unstable();
        assert_eq!(
            covered,
            (1..=sent).collect::<Vec<_>>(),
            "{thread}: each message covered by exactly one follow-up"
        );
    }
}

/// A watch made before a change fires: a send on another instance of the same data, an ack on
/// another instance, a discard on the same instance. (On NATS the design has clients watch
/// through an ordered consumer on the thread's subjects, so this holds for clients too.)
pub async fn a_watch_made_before_a_send_on_another_instance_fires<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let (a, b) = (env.open().await, env.open().await);
    let c = hold(&a, "t", "d1", LEASE).await;

    let mut w = a.inbox.watch("t");
    send(&b, "t", steer("wake up")).await;
    tokio::time::timeout(WATCH_DEADLINE, w.changed())
        .await
        .expect("a send on another instance wakes the watch");
    assert_eq!(pending(&a, "t").await, vec![1], "the woken waiter reads it");

    let mut w = b.inbox.watch("t");
    a.inbox.ack_message("t", 1, &fence(&c)).await.unwrap();
    tokio::time::timeout(WATCH_DEADLINE, w.changed())
        .await
        .expect("an ack on another instance wakes the watch");

    send(&a, "t", steer("again")).await;
    let mut w = a.inbox.watch("t");
    assert_eq!(a.inbox.discard_messages("t", 2).await.unwrap(), 1);
    tokio::time::timeout(WATCH_DEADLINE, w.changed())
        .await
        .expect("a discard on the same instance wakes the watch");
}

/// A send under a policy (`on_busy`): on an idle thread every policy starts a turn, as a
/// follow-up does; while a dispatch holds the thread (claimed here, on another instance),
/// `enqueue` waits for the next turn, `steer` goes to the live run, and `reject` is `Busy`
/// naming the holder and stores nothing. The answer names the holder it met.
pub async fn a_send_under_a_policy_is_decided_by_what_holds_the_thread<F: Factory>(factory: &F) {
    use homing::store::OnBusy;
    let env = Env::new(factory).await;
    let s = env.open().await;
    let other = env.open().await;
    run_once(&s, "t", "d0").await;

    // Idle: every policy starts one turn.
    let sent = send(&s, "t", steer("hello").on_busy(OnBusy::Reject)).await;
    assert_eq!(sent.message.kind, MessageKind::FollowUp);
    assert_eq!(sent.busy, None);
    assert_eq!(sent.follow_ups.len(), 1, "{sent:?}");
    let turn = sent.follow_ups[0].clone();

    // The turn runs, claimed on the other instance: the thread is busy.
    let running = other
        .mailbox
        .claim_dispatch(&turn, WORKER, 30_000)
        .await
        .expect("claim")
        .expect("the follow-up");
    let before = marks(&s, "t").await;
    match s
        .inbox
        .send(
            "t",
            follow_up("again").on_busy(OnBusy::Reject),
            DEFAULT_MAX_INBOX,
        )
        .await
    {
        Err(StoreError::Busy { thread, holder }) => {
            assert_eq!(thread, "t");
            assert_eq!(holder, running.id);
        }
        other => panic!("reject on a busy thread: {other:?}"),
    }
    assert_eq!(
        marks(&s, "t").await,
        before,
        "a rejected send stores nothing"
    );

    let steered = send(&s, "t", follow_up("faster").on_busy(OnBusy::Steer)).await;
    assert_eq!(steered.message.kind, MessageKind::Steer);
    assert_eq!(steered.busy.as_deref(), Some(running.id.as_str()));
    assert!(steered.follow_ups.is_empty());
    let queued = send(&s, "t", steer("next").on_busy(OnBusy::Enqueue)).await;
    assert_eq!(queued.message.kind, MessageKind::FollowUp);
    assert_eq!(queued.busy.as_deref(), Some(running.id.as_str()));
    assert!(queued.follow_ups.is_empty());
    let stored = s
        .inbox
        .message("t", steered.message.seq)
        .await
        .expect("read")
        .expect("the message");
    assert_eq!(
        stored.kind,
        MessageKind::Steer,
        "the decided kind is stored"
    );
    // ... and the policy that took effect, on every instance; none on an idle thread.
    for store in [&s, &other] {
        let read = |seq| async move {
            store
                .inbox
                .message("t", seq)
                .await
                .expect("read")
                .expect("the message")
        };
        assert_eq!(read(steered.message.seq).await.applied, Some(OnBusy::Steer));
        assert_eq!(
            read(queued.message.seq).await.applied,
            Some(OnBusy::Enqueue)
        );
        assert_eq!(read(sent.message.seq).await.applied, None);
    }

    // The run ends: the thread is idle again, and `reject` starts a turn.
    other
        .mailbox
        .ack(&running.id, &tok(&running))
        .await
        .expect("ack");
    let after = s
        .inbox
        .send(
            "t",
            follow_up("idle again").on_busy(OnBusy::Reject),
            DEFAULT_MAX_INBOX,
        )
        .await
        .expect("an idle thread takes it");
    assert_eq!(after.busy, None);
}

/// `interrupt` (section 9.5): a send to a busy thread stops its run in the step that stores the
/// message (the epoch moves on, queued work is superseded, the log marks the turn's end) and
/// queues the follow-up behind the stopped run; a second interrupt of the same run stops
/// nothing more and joins the turn after it; a waiting holder is superseded at once.
pub async fn an_interrupting_send_stops_the_run_marks_its_turn_and_queues_the_next<F: Factory>(
    factory: &F,
) {
    use homing::store::{OnBusy, TurnEvent};
    let env = Env::new(factory).await;
    let s = env.open().await;
    let other = env.open().await;

    // A run holds the thread on the other instance, with more work queued behind it.
    let running = hold(&other, "t", "d1", 30_000).await;
    other
        .log
        .append("t", b"before", Some(&fence(&running)))
        .await
        .expect("append");
    put_on(&s, "t", "q1").await;
    let epoch = s.mailbox.thread_epoch("t").await.expect("epoch");

    let sent = send(&s, "t", follow_up("stop").on_busy(OnBusy::Interrupt)).await;
    assert_eq!(sent.message.kind, MessageKind::FollowUp);
    assert_eq!(sent.busy.as_deref(), Some("d1"));
    let (stopped, at) = sent.interrupted.clone().expect("the run was interrupted");
    assert_eq!(stopped, "d1");
    assert_eq!(sent.follow_ups.len(), 1, "{sent:?}");
    let next = sent.follow_ups[0].clone();
    assert_eq!(s.mailbox.thread_epoch("t").await.expect("epoch"), epoch + 1);
    let q = s.mailbox.load("q1").await.expect("load").expect("q1");
    assert_eq!(q.status, Status::Superseded, "queued work goes: {q:?}");

    // The log: the run's entry stays, the turn's end follows it.
    let log = s.log.read("t", 0, 10).await.expect("read");
    assert_eq!(log.len(), 2, "{log:?}");
    assert_eq!(log[0].data, b"before");
    assert_eq!(log[1].seq, at);
    assert!(log[1].data.is_empty());
    let mark = log[1].turn.clone().expect("a turn mark");
    assert_eq!(mark.event, TurnEvent::Interrupted);
    assert_eq!((mark.dispatch.as_str(), mark.message), ("d1", 1));

    // A second interrupt of the same run moves nothing: it waits with the first.
    let again = send(&s, "t", follow_up("and this").on_busy(OnBusy::Interrupt)).await;
    assert_eq!(again.interrupted, None, "{again:?}");
    assert!(again.follow_ups.is_empty(), "{again:?}");
    assert_eq!(s.mailbox.thread_epoch("t").await.expect("epoch"), epoch + 1);
    assert_eq!(s.log.read("t", 0, 10).await.expect("read").len(), 2);

    // The follow-up waits for the stopped run, whose writes are fenced.
    assert!(
        s.mailbox
            .claim_dispatch(&next, WORKER, LEASE)
            .await
            .expect("claim")
            .is_none(),
        "the stopped run still holds the thread"
    );
    match s.log.append("t", b"late", Some(&fence(&running))).await {
        Err(StoreError::StaleEpoch { .. }) => {}
        other => panic!("the stopped run's write: {other:?}"),
    }
    let turn = retry(|| s.mailbox.claim_dispatch(&next, WORKER, LEASE))
        .await
        .expect("claim")
        .expect("the follow-up runs once the thread is free");
    assert_eq!(turn.epoch, epoch + 1);
    assert_eq!(
        turn.metadata.get(FOLLOW_UP_MESSAGES).map(String::as_str),
        Some("1-1")
    );
    assert_eq!(
        turn.metadata.get(FOLLOW_UP_INTERRUPTED).map(String::as_str),
        Some("d1"),
        "the follow-up's claim says which run was stopped"
    );
    assert_eq!(
        seqs_in(&s, "t", Some(MessageState::Pending)).await,
        vec![1, 2]
    );

    // A waiting holder is superseded in the same step, and the follow-up can run at once.
    let (waiting, _) = super::waitpoints::claimed_with(&other, "w", "d2", "approval").await;
    super::waitpoints::suspend(&other, &waiting).await;
    let sent = send(&s, "w", follow_up("stop").on_busy(OnBusy::Interrupt)).await;
    assert_eq!(
        sent.interrupted.as_ref().map(|(d, _)| d.as_str()),
        Some("d2")
    );
    let d2 = s.mailbox.load("d2").await.expect("load").expect("d2");
    assert_eq!(d2.status, Status::Superseded, "{d2:?}");
    let next = sent.follow_ups.first().expect("a follow-up").clone();
    retry(|| s.mailbox.claim_dispatch(&next, WORKER, LEASE))
        .await
        .expect("claim")
        .expect("the thread is free");

    // On an idle thread an interrupt starts a turn and stops nothing.
    run_once(&s, "idle", "d3").await;
    let sent = send(&s, "idle", follow_up("hi").on_busy(OnBusy::Interrupt)).await;
    assert_eq!(sent.applied, None, "an idle thread: no policy applies");
    assert_eq!((sent.busy, sent.interrupted), (None, None));
    assert_eq!(sent.follow_ups.len(), 1);
    let idle = load(&s, &sent.follow_ups[0]).await;
    assert_eq!(idle.metadata.get(FOLLOW_UP_INTERRUPTED), None, "{idle:?}");
}

/// `rollback` (section 9.6): as `interrupt`, and the mark masks every entry the stopped
/// dispatch's runs wrote (all its attempts, from where the log stood at its first claim), so
/// a reader of the conversation sees the log as it was before that dispatch ran; the entries
/// stay stored. A rollback of a run that wrote nothing masks nothing, and a second rollback
/// of a stopped run stops nothing more.
pub async fn a_rollback_masks_what_the_stopped_dispatch_wrote_across_its_attempts<F: Factory>(
    factory: &F,
) {
    use homing::store::{OnBusy, TurnEvent, unmasked};
    let env = Env::new(factory).await;
    let s = env.open().await;
    let other = env.open().await;

    // What came before the run stays: an operator's entry.
    s.log.append("t", b"before", None).await.expect("append");
    // The run's first attempt writes, fails and is retried; its second attempt writes too.
    let first = hold(&other, "t", "d1", 30_000).await;
    assert_eq!(first.log_from, Some(1), "{first:?}");
    other
        .log
        .append("t", b"attempt 1", Some(&fence(&first)))
        .await
        .expect("append");
    other
        .mailbox
        .nack("d1", first.token().expect("token"), 0, "flaky")
        .await
        .expect("nack");
    let second = retry(|| other.mailbox.claim_dispatch("d1", WORKER, 30_000))
        .await
        .expect("claim")
        .expect("the retry is claimed");
    assert_eq!(
        second.log_from,
        Some(1),
        "a retry keeps its first claim's mark"
    );
    for data in [&b"attempt 2"[..], b"tool call"] {
        other
            .log
            .append("t", data, Some(&fence(&second)))
            .await
            .expect("append");
    }

    let sent = send(&s, "t", follow_up("start over").on_busy(OnBusy::Rollback)).await;
    let (stopped, at) = sent.interrupted.clone().expect("the run was stopped");
    assert_eq!((stopped.as_str(), at), ("d1", 5));
    assert_eq!(sent.applied, Some(OnBusy::Rollback));
    assert_eq!(sent.follow_ups.len(), 1, "{sent:?}");
    let log = s.log.read("t", 0, 10).await.expect("read");
    assert_eq!(log.len(), 5, "the masked entries stay stored: {log:?}");
    let mark = log[4].turn.clone().expect("a turn mark");
    assert_eq!(mark.event, TurnEvent::RolledBack);
    assert_eq!((mark.dispatch.as_str(), mark.message), ("d1", 1));
    let masked = mark.masked.expect("a rollback masks the run's entries");
    assert_eq!((masked.first, masked.last), (2, 4));
    let shown: Vec<u64> = unmasked(log).iter().map(|e| e.seq).collect();
    assert_eq!(shown, vec![1, 5], "readers see the log as before the run");

    // A second rollback stops nothing: it waits for the next turn; the stopped run writes
    // nothing more.
    let again = send(&s, "t", follow_up("and this").on_busy(OnBusy::Rollback)).await;
    assert_eq!(again.interrupted, None, "{again:?}");
    assert_eq!(
        again.applied,
        Some(OnBusy::Enqueue),
        "it waits for the next turn"
    );
    match other.log.append("t", b"late", Some(&fence(&second))).await {
        Err(StoreError::StaleEpoch { .. }) => {}
        other => panic!("the stopped run's write: {other:?}"),
    }
    assert_eq!(s.log.read("t", 0, 10).await.expect("read").len(), 5);

    // The follow-up's run starts after the mark, so a rollback of it masks only its own.
    let next = sent.follow_ups[0].clone();
    let turn = retry(|| s.mailbox.claim_dispatch(&next, WORKER, 30_000))
        .await
        .expect("claim")
        .expect("the follow-up runs once the thread is free");
    assert_eq!(turn.log_from, Some(5));
    s.log
        .append("t", b"answer", Some(&fence(&turn)))
        .await
        .expect("append");
    let sent = send(&s, "t", follow_up("no, again").on_busy(OnBusy::Rollback)).await;
    // Its next write finds the stop (and lets the thread go).
    match s.log.append("t", b"late", Some(&fence(&turn))).await {
        Err(StoreError::StaleEpoch { .. }) => {}
        other => panic!("the stopped run's write: {other:?}"),
    }
    let log = s.log.read("t", 0, 10).await.expect("read");
    let mark = log.last().and_then(|e| e.turn.clone()).expect("a mark");
    assert_eq!(mark.dispatch, next);
    let masked = mark.masked.expect("masked");
    assert_eq!((masked.first, masked.last), (6, 6));
    assert_eq!(
        unmasked(log).iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![1, 5, 7]
    );

    // A run that wrote nothing before its rollback masks nothing.
    let next = sent.follow_ups[0].clone();
    retry(|| s.mailbox.claim_dispatch(&next, WORKER, 30_000))
        .await
        .expect("claim")
        .expect("claimed");
    send(&s, "t", follow_up("stop").on_busy(OnBusy::Rollback)).await;
    let log = s.log.read("t", 0, 10).await.expect("read");
    let mark = log.last().and_then(|e| e.turn.clone()).expect("a mark");
    assert_eq!((mark.event, mark.masked), (TurnEvent::RolledBack, None));
}

/// `merge` (section 9.6, M5): as `rollback`, and the messages the stopped dispatch
/// acknowledged return to pending in the same step, so the follow-up is handed them first,
/// then the new one; their acknowledgements' entries are masked with the rest of the run; the
/// stopped dispatch's payload goes to the follow-up of its agent. A message for another agent
/// cannot merge into the run, and nothing is stored then.
pub async fn a_merge_hands_the_next_turn_what_the_stopped_run_had_taken<F: Factory>(factory: &F) {
    use homing::store::{OnBusy, TurnEvent, unmasked};
    let env = Env::new(factory).await;
    let s = env.open().await;
    let other = env.open().await;

    // The run takes message 1 (its ack appends it to the log) and writes on.
    let run = hold(&other, "t", "d1", 30_000).await;
    send(&s, "t", follow_up("what is 2+2?")).await;
    other
        .inbox
        .ack_message("t", 1, &fence(&run))
        .await
        .expect("ack");
    other
        .log
        .append("t", b"thinking", Some(&fence(&run)))
        .await
        .expect("append");

    // A message for another agent cannot merge into it.
    let refused = s
        .inbox
        .send(
            "t",
            follow_up("x").to_agent(OTHER).on_busy(OnBusy::Merge),
            DEFAULT_MAX_INBOX,
        )
        .await;
    expect_invalid_naming(refused, "agent", "a message for another agent");
    assert_eq!(pending(&s, "t").await, Vec::<u64>::new(), "nothing stored");

    let sent = send(&s, "t", follow_up("and 3+3?").on_busy(OnBusy::Merge)).await;
    assert_eq!(sent.message.seq, 2, "{sent:?}");
    assert_eq!(sent.applied, Some(OnBusy::Merge));
    assert_eq!(sent.reopened, vec![1]);
    let (stopped, at) = sent.interrupted.clone().expect("the run was stopped");
    assert_eq!((stopped.as_str(), at), ("d1", 3));
    let log = s.log.read("t", 0, 10).await.expect("read");
    let mark = log[2].turn.clone().expect("a turn mark");
    assert_eq!(mark.event, TurnEvent::Merged);
    let masked = mark.masked.expect("masked");
    assert_eq!((masked.first, masked.last), (1, 2), "the ack's entry too");
    let first = message(&s, "t", 1).await;
    assert_eq!(first.state, MessageState::Pending, "{first:?}");
    assert_eq!((first.acked_by, first.log_seq), (None, None));
    assert_eq!(pending(&s, "t").await, vec![1, 2]);
    assert_eq!(marks(&s, "t").await.pending, 2);

    // One follow-up answers both, in order, and carries the stopped run's payload.
    assert_eq!(sent.follow_ups.len(), 1, "{sent:?}");
    let next = load(&s, &sent.follow_ups[0]).await;
    assert_eq!(next.payload, run.payload, "the stopped run's input goes on");
    assert_eq!(
        next.metadata.get(FOLLOW_UP_MESSAGES).map(String::as_str),
        Some("1-2")
    );
    assert_eq!(
        next.metadata.get(FOLLOW_UP_INTERRUPTED).map(String::as_str),
        Some("d1")
    );
    match other.inbox.ack_message("t", 2, &fence(&run)).await {
        Err(StoreError::StaleEpoch { .. }) => {}
        other => panic!("the stopped run's ack: {other:?}"),
    }
    let turn = retry(|| s.mailbox.claim_dispatch(&next.id, WORKER, 30_000))
        .await
        .expect("claim")
        .expect("the follow-up runs once the thread is free");
    for seq in [1, 2] {
        s.inbox
            .ack_message("t", seq, &fence(&turn))
            .await
            .unwrap_or_else(|e| panic!("the next turn acks message {seq}: {e}"));
    }
    let first = message(&s, "t", 1).await;
    assert_eq!(first.acked_by.as_deref(), Some(next.id.as_str()));
    let log = s.log.read("t", 0, 10).await.expect("read");
    let shown: Vec<(u64, Option<u64>)> = unmasked(log)
        .iter()
        .map(|e| (e.seq, e.note.as_ref().map(|n| n.seq)))
        .collect();
    assert_eq!(shown, vec![(3, None), (4, Some(1)), (5, Some(2))]);
    assert!(pending(&s, "t").await.is_empty());
}

/// A merge racing the stopped run's own acknowledgement, from two instances: either the ack
/// lands first and the merge reopens the message, or the merge does and the ack is
/// `StaleEpoch`. Either way the message is pending for the next turn, never acknowledged by a
/// run that was stopped.
pub async fn a_merge_racing_the_runs_ack_leaves_the_message_to_the_next_turn<F: Factory>(
    factory: &F,
) {
    use homing::store::OnBusy;
    let env = Env::new(factory).await;
    let hosts = env.open_many(2).await;
    let (mut acked_first, mut merged_first) = (0, 0);
    for round in 0..10 {
        let thread = format!("t{round}");
        let run = hold(&hosts[1], &thread, &format!("d{round}"), 60_000).await;
        send(&hosts[0], &thread, follow_up("question")).await;
        let acker = hosts[1].clone();
        let (t, f) = (thread.clone(), fence(&run));
        let ack = tokio::spawn(async move { acker.inbox.ack_message(&t, 1, &f).await });
        let sent = send(&hosts[0], &thread, follow_up("more").on_busy(OnBusy::Merge)).await;
        match ack.await.expect("the ack task") {
            Ok(_) => {
                acked_first += 1;
                assert_eq!(sent.reopened, vec![1], "{sent:?}");
            }
            Err(StoreError::StaleEpoch { .. }) => {
                merged_first += 1;
                assert!(sent.reopened.is_empty(), "{sent:?}");
            }
            Err(e) => panic!("the run's ack: {e}"),
        }
        assert_eq!(
            pending(&hosts[0], &thread).await,
            vec![1, 2],
            "round {round}"
        );
        let next = load(&hosts[0], &sent.follow_ups[0]).await;
        assert_eq!(
            next.metadata.get(FOLLOW_UP_MESSAGES).map(String::as_str),
            Some("1-2"),
            "round {round}"
        );
    }
    println!("the ack landed first {acked_first} times, the merge {merged_first} times");
}

/// Interrupting sends racing each other from two instances stop the run once: one epoch bump,
/// one turn mark, one follow-up, every message pending for it in order. An interrupting send
/// racing the run's own ack: either the ack lands (the send then meets an idle thread and
/// interrupts nothing) or the interrupt does (the ack is `StaleEpoch`), never both, never
/// neither.
pub async fn racing_interrupts_stop_a_run_once_and_race_its_ack_cleanly<F: Factory>(factory: &F) {
    use homing::store::OnBusy;
    const SENDS: usize = 10;
    let env = Env::new(factory).await;
    let hosts = env.open_many(3).await;
    let running = hold(&hosts[2], "t", "run", 60_000).await;
    let epoch = hosts[0].mailbox.thread_epoch("t").await.expect("epoch");

    let mut tasks = JoinSet::new();
    for (h, host) in hosts.iter().enumerate().take(2) {
        let host = host.clone();
        tasks.spawn(async move {
            let mut sent = Vec::new();
            for i in 0..SENDS / 2 {
                let new = follow_up(&format!("h{h} m{i}")).on_busy(OnBusy::Interrupt);
                sent.push(
                    retry(|| host.inbox.send("t", new.clone(), DEFAULT_MAX_INBOX))
                        .await
                        .unwrap_or_else(|e| panic!("send: {e}")),
                );
            }
            sent
        });
    }
    let mut sent = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(mine) => sent.extend(mine),
            Err(err) => std::panic::resume_unwind(err.into_panic()),
        }
    }
    let s = &hosts[0];
    let stops: Vec<&Sent> = sent.iter().filter(|x| x.interrupted.is_some()).collect();
    assert_eq!(stops.len(), 1, "one send stops the run: {sent:?}");
    let follow_ups: Vec<&String> = sent.iter().flat_map(|x| &x.follow_ups).collect();
    assert_eq!(follow_ups.len(), 1, "one follow-up: {sent:?}");
    assert!(
        sent.iter().all(|x| x.busy.as_deref() == Some("run")),
        "{sent:?}"
    );
    assert_eq!(s.mailbox.thread_epoch("t").await.expect("epoch"), epoch + 1);
    let marks: Vec<LogEntry> = s
        .log
        .read("t", 0, 100)
        .await
        .expect("read")
        .into_iter()
        .filter(|e| e.turn.is_some())
        .collect();
    assert_eq!(marks.len(), 1, "one turn mark: {marks:?}");
    let pending: Vec<u64> = (1..=SENDS as u64).collect();
    assert_eq!(seqs_in(s, "t", Some(MessageState::Pending)).await, pending);

    // The stopped run's ack is refused; the one follow-up runs next and is handed all ten.
    match s.mailbox.ack("run", &tok(&running)).await {
        Err(StoreError::StaleEpoch { .. }) => {}
        other => panic!("the stopped run's ack: {other:?}"),
    }
    let next = retry(|| s.mailbox.claim(AGENT, WORKER, LEASE))
        .await
        .expect("claim")
        .expect("the follow-up");
    assert_eq!(&next.id, follow_ups[0]);
    assert_eq!(next.epoch, epoch + 1);
    assert_eq!(seqs_in(s, "t", Some(MessageState::Pending)).await, pending);

    // An interrupt racing the run's own ack, a few rounds, each on a thread of its own.
    for round in 0..6 {
        let thread = format!("race-{round}");
        let id = format!("race-run-{round}");
        let run = hold(&hosts[2], &thread, &id, 60_000).await;
        let (sender, holder) = (hosts[round % 2].clone(), hosts[2].clone());
        let t = thread.clone();
        let send = tokio::spawn(async move {
            let new = follow_up("stop").on_busy(OnBusy::Interrupt);
            retry(|| sender.inbox.send(&t, new.clone(), DEFAULT_MAX_INBOX)).await
        });
        let token = tok(&run);
        let r = id.clone();
        let ack = tokio::spawn(async move { retry(|| holder.mailbox.ack(&r, &token)).await });
        let sent = send
            .await
            .expect("join")
            .expect("the send is stored either way");
        let acked = ack.await.expect("join");
        let d = load(s, &id).await;
        match (&acked, &sent.interrupted) {
            (Ok(_), None) => {
                assert_eq!(d.status, Status::Acked, "{d:?}");
                assert_eq!(sent.busy, None, "the send met an idle thread: {sent:?}");
            }
            (Err(StoreError::StaleEpoch { .. }), Some((stopped, _))) => {
                assert_eq!(stopped, &id);
                assert_eq!(d.status, Status::Superseded, "{d:?}");
            }
            other => panic!("round {round}: the ack and the interrupt disagree: {other:?}"),
        }
        assert_eq!(
            sent.follow_ups.len(),
            1,
            "a turn answers the message: {sent:?}"
        );
    }
}

/// A message that starts a turn on an idle thread under a follow-up window waits a quiet time
/// for more: the quick second and third messages join its follow-up (one dispatch, its range
/// widened, due a quiet time after the last, never past the longest wait), and its one claim
/// is handed all three. A message after the claim waits for the next turn.
pub async fn quick_messages_under_a_follow_up_window_make_one_turn<F: Factory>(factory: &F) {
    let env = Env::new(factory).await;
    let s = env.open().await;
    run_once(&s, "t", "d0").await;
    let quick = |text: &str| {
        follow_up(text)
            .to_agent(AGENT)
            .follow_up_window(1_000, 2_500)
    };
    let sent = send(&s, "t", quick("hi")).await;
    assert_eq!(sent.follow_ups.len(), 1);
    let id = sent.follow_ups[0].clone();
    let w = load(&s, &id).await;
    assert_eq!(
        w.available_at,
        T0 + 1_000,
        "due a quiet second after the message"
    );
    env.advance(600);
    let second = send(&s, "t", quick("one more thing")).await;
    assert!(second.follow_ups.is_empty(), "it joined the open window");
    env.advance(600);
    send(&s, "t", quick("and another")).await;
    let w = load(&s, &id).await;
    assert_follow_up(&w, AGENT, "t", 1, 3);
    assert_eq!(w.available_at, T0 + 2_200);
    assert_eq!(w.window.as_ref().map(|w| w.count), Some(3));
    assert_eq!(follow_ups_on(&s, "t").await.len(), 1);
    env.advance(999);
    assert!(claim(&s).await.is_none(), "not due before the quiet time");
    // The longest wait caps it: a message now would push it past T0 + 2,500.
    send(&s, "t", quick("last")).await;
    assert_eq!(load(&s, &id).await.available_at, T0 + 2_500);
    // Each message that joined is covered by the window's follow-up: a run that left one
    // pending would not start a second follow-up for it.
    assert_eq!(marks(&s, "t").await, inbox_marks(4, 4, 4));
    env.set(T0 + 2_500);
    let c = claim_some(&s).await;
    assert_eq!(c.id, id);
    assert_eq!(pending(&s, "t").await, vec![1, 2, 3, 4]);
    // A message after the claim starts nothing now and waits for the next turn.
    let late = send(&s, "t", quick("too late")).await;
    assert!(late.follow_ups.is_empty());
    for seq in 1..=4 {
        s.inbox.ack_message("t", seq, &fence(&c)).await.unwrap();
    }
    s.mailbox.ack(&c.id, &tok(&c)).await.unwrap();
    let next = follow_ups_on(&s, "t").await;
    assert_eq!(
        next.len(),
        2,
        "the settlement started the next turn for the late message"
    );
}

/// An interrupt of a thread with more queued work than one atomic step may hold, and pending
/// messages for twenty agents, is still one step: it stops the run, queues one follow-up per
/// agent, and leaves none of the old work runnable (what the step had no room to supersede is
/// of the old epoch, superseded when a claim meets it).
pub async fn an_interrupt_behind_a_full_batch_of_work_and_many_agents_is_one_step<F: Factory>(
    factory: &F,
) {
    use homing::store::OnBusy;
    let env = Env::new(factory).await;
    let s = env.open().await;
    let running = hold(&s, "t", "d1", 30_000).await;
    for n in 0..995 {
        put_on(&s, "t", &format!("q{n:04}")).await;
    }
    for n in 0..20 {
        send(
            &s,
            "t",
            follow_up("later").to_agent(format!("agent-{n:02}")),
        )
        .await;
    }
    let sent = send(&s, "t", follow_up("stop").on_busy(OnBusy::Interrupt)).await;
    assert!(sent.interrupted.is_some(), "{sent:?}");
    assert_eq!(
        sent.follow_ups.len(),
        21,
        "one follow-up per agent, and the run's own"
    );
    // The stopped run's ack is refused; nothing of the old work runs, only the turn's
    // follow-up for this agent.
    assert!(s.mailbox.ack(&running.id, &tok(&running)).await.is_err());
    let mut ran = Vec::new();
    while let Some(d) = claim(&s).await {
        s.mailbox.ack(&d.id, &tok(&d)).await.expect("ack");
        ran.push(d.id);
    }
    assert_eq!(ran.len(), 1, "only the follow-up ran: {ran:?}");
    assert!(sent.follow_ups.contains(&ran[0]));
    assert!(
        all_in(&s, Status::Queued)
            .await
            .iter()
            .all(|d| d.agent != AGENT)
    );
}

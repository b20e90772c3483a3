//! The host side of the WIT imports, called directly (no wasm): fencing of a guest's writes,
//! the enqueue allow-list and caps, backoff on nack, stop requests.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use homing::config::PluginConfig;
use homing::runtime::bindings::mailbox::{Host, HostClaim};
use homing::runtime::bindings::{EnqueueRequest, GuestError, StopReason};
use homing::runtime::host::{
    ClaimHandle, GuestState, LogState, PluginContext, check_returned_output, escape_log_text,
    max_payload_warning,
};
use homing::store::embedded::EmbeddedStore;
use homing::store::{ManualClock, NewDispatch, Status, Store};
use wasmtime::component::Resource;
use wasmtime_wasi::WasiCtxBuilder;

const LEASE_MS: u64 = 30_000;

struct Fixture {
    clock: Arc<ManualClock>,
    store: Store,
    ctx: Arc<PluginContext>,
    shutdown: Arc<AtomicBool>,
}

fn fixture(plugin_toml: &str) -> Fixture {
    let clock = ManualClock::new(1_000_000);
    let store = EmbeddedStore::open_in_memory(clock.clone())
        .unwrap()
        .store();
    let config: PluginConfig =
        toml::from_str(&format!("path = \"agent.wasm\"\n{plugin_toml}")).unwrap();
    let shutdown = Arc::new(AtomicBool::new(false));
    let ctx = Arc::new(PluginContext {
        name: "agent".into(),
        targets: config.enqueue_to.iter().map(|t| (t.clone(), 3)).collect(),
        // `helper` takes its concurrency key from metadata `customer`.
        target_keys: [(
            "helper".to_owned(),
            homing::config::limits::KeySource::Metadata("customer".into()),
        )]
        .into(),
        target_debounce: Default::default(),
        config,
        store: store.clone(),
        consumer: "test-host/agent".into(),
        lease: std::time::Duration::from_millis(LEASE_MS),
        max_payload: 1024,
        config_dir: ".".into(),
        values: Default::default(),
        tls_ca: Vec::new(),
        hosts: Default::default(),
        shutdown: shutdown.clone(),
        public_url: Some("https://homing.example.com".into()),
        live: homing::live::Hub::new(&store, Default::default()),
        limits: Default::default(),
        origin_limits: Vec::new(),
        models: Vec::new(),
        drain_timeout: std::time::Duration::from_secs(30),
        offer: Default::default(),
        retired: Default::default(),
    });
    Fixture {
        clock,
        store,
        ctx,
        shutdown,
    }
}

impl Fixture {
    fn guest(&self) -> GuestState {
        GuestState::new(
            WasiCtxBuilder::new().build(),
            self.ctx.clone(),
            Arc::new(Mutex::new(LogState::default())),
        )
    }

    /// Enqueues one dispatch on `thread` and claims it as the worker would.
    async fn claim(&self, guest: &mut GuestState, thread: &str) -> (u32, ClaimSnapshot) {
        self.store
            .mailbox
            .enqueue(NewDispatch::new("agent", thread, "payload"))
            .await
            .unwrap();
        let claim: ClaimHandle = homing::claim::claim_for(&self.ctx.claimer())
            .await
            .unwrap()
            .unwrap();
        let snapshot = ClaimSnapshot {
            id: claim.dispatch().id.clone(),
            thread: claim.dispatch().thread.clone(),
        };
        let resource = guest.table().push(claim).unwrap();
        (resource.rep(), snapshot)
    }
}

struct ClaimSnapshot {
    id: String,
    thread: String,
}

fn borrow(rep: u32) -> Resource<ClaimHandle> {
    Resource::new_borrow(rep)
}

#[tokio::test]
async fn a_guest_whose_lease_was_lost_cannot_ack_record_or_append() {
    let f = fixture("");
    let mut guest = f.guest();
    let (rep, claim) = f.claim(&mut guest, "t").await;
    f.clock.advance(LEASE_MS + 1);
    let reclaimed = f
        .store
        .mailbox
        .reclaim_expired(f.store.now(), 10)
        .await
        .unwrap();
    assert_eq!(reclaimed.len(), 1);

    let ack = guest.ack(borrow(rep)).await.unwrap();
    assert!(matches!(ack, Err(GuestError::LostClaim(_))), "{ack:?}");
    let record = guest
        .record_result(borrow(rep), b"late".to_vec())
        .await
        .unwrap();
    assert!(
        matches!(record, Err(GuestError::LostClaim(_))),
        "{record:?}"
    );
    let append = guest
        .append(borrow(rep), b"late entry".to_vec())
        .await
        .unwrap();
    assert!(
        matches!(append, Err(GuestError::LostClaim(_))),
        "{append:?}"
    );
    let complete = guest.complete(borrow(rep), b"late".to_vec()).await.unwrap();
    assert!(
        matches!(complete, Err(GuestError::LostClaim(_))),
        "{complete:?}"
    );

    // Exactly as the contract says for a reclaim: requeued, one failed attempt, nothing recorded.
    let d = f.store.mailbox.load(&claim.id).await.unwrap().unwrap();
    assert_eq!(d.status, Status::Queued);
    assert_eq!(d.attempt, 1);
    assert!(d.result.is_none());
    assert_eq!(f.store.log.latest(&claim.thread).await.unwrap(), 0);
}

#[tokio::test]
async fn a_guest_whose_thread_was_interrupted_cannot_append_or_ack() {
    let f = fixture("");
    let mut guest = f.guest();
    let (rep, claim) = f.claim(&mut guest, "t").await;
    let ok = guest.append(borrow(rep), b"before".to_vec()).await.unwrap();
    assert_eq!(ok.unwrap(), 1);

    let interrupt = f
        .store
        .mailbox
        .interrupt(&claim.thread, "user sent a newer message")
        .await
        .unwrap();
    assert_eq!(interrupt.active.unwrap().id, claim.id);

    let append = guest.append(borrow(rep), b"after".to_vec()).await.unwrap();
    assert!(
        matches!(append, Err(GuestError::Interrupted(_))),
        "{append:?}"
    );
    let ack = guest.ack(borrow(rep)).await.unwrap();
    assert!(matches!(ack, Err(GuestError::LostClaim(_))), "{ack:?}");
    let d = f.store.mailbox.load(&claim.id).await.unwrap().unwrap();
    assert_eq!(d.status, Status::Superseded);
    assert_eq!(
        f.store.log.latest(&claim.thread).await.unwrap(),
        1,
        "only the fenced-in entry"
    );
}

#[tokio::test]
async fn settling_twice_through_the_claim_is_refused_the_second_time_by_kind() {
    let f = fixture("");
    let mut guest = f.guest();
    let (rep, claim) = f.claim(&mut guest, "t").await;
    guest
        .complete(borrow(rep), b"done".to_vec())
        .await
        .unwrap()
        .unwrap();
    // A retry of the same settlement is idempotent; a different one is refused.
    guest.ack(borrow(rep)).await.unwrap().unwrap();
    let nack = guest
        .nack(borrow(rep), "too late".into(), None)
        .await
        .unwrap();
    assert!(matches!(nack, Err(GuestError::LostClaim(_))), "{nack:?}");
    let d = f.store.mailbox.load(&claim.id).await.unwrap().unwrap();
    assert_eq!(d.status, Status::Acked);
    assert_eq!(d.result.unwrap().output, b"done");
}

#[tokio::test]
async fn nack_applies_the_plugins_backoff_and_the_guests_hint_as_a_floor() {
    let f = fixture("[retry]\ninitial = \"2s\"\nmax = \"1m\"\njitter = 0.0\n");
    let mut guest = f.guest();
    let (rep, claim) = f.claim(&mut guest, "t").await;
    let now = f.store.now();
    guest
        .nack(borrow(rep), "busy".into(), Some(10_000))
        .await
        .unwrap()
        .unwrap();
    let d = f.store.mailbox.load(&claim.id).await.unwrap().unwrap();
    assert_eq!(d.status, Status::Queued);
    assert_eq!(
        d.available_at,
        now + 10_000,
        "the hint (10s) exceeds the policy (2s)"
    );
    assert_eq!(d.last_error.as_deref(), Some("busy"));

    let mut guest = f.guest();
    f.clock.advance(10_000);
    let claim: ClaimHandle = homing::claim::claim_for(&f.ctx.claimer())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claim.dispatch().attempt, 1);
    let rep = guest.table().push(claim).unwrap().rep();
    let now = f.store.now();
    guest
        .nack(borrow(rep), "busy again".into(), None)
        .await
        .unwrap()
        .unwrap();
    let d = f
        .store
        .mailbox
        .load(&claim_id(&f, "t").await)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        d.available_at,
        now + 4_000,
        "2s doubled for the second failure"
    );
}

async fn claim_id(f: &Fixture, thread: &str) -> String {
    let list = f
        .store
        .mailbox
        .list(&homing::store::ListFilter {
            thread: Some(thread.into()),
            ..Default::default()
        })
        .await
        .unwrap();
    list[0].id.clone()
}

#[tokio::test]
async fn enqueue_is_limited_to_allowed_agents_and_capped_in_size() {
    let f = fixture("enqueue_to = [\"helper\"]\n");
    let mut guest = f.guest();
    let (rep, claim) = f.claim(&mut guest, "t").await;
    let request = |agent: &str, payload: Vec<u8>| EnqueueRequest {
        agent: agent.into(),
        thread: None,
        payload,
        metadata: vec![],
        priority: None,
        delay_ms: None,
        dedupe_key: None,
        max_attempts: Some(99),
        concurrency_key: None,
        debounce: None,
    };
    let denied = HostClaim::enqueue(&mut guest, borrow(rep), request("stranger", b"x".to_vec()))
        .await
        .unwrap();
    assert!(matches!(denied, Err(GuestError::Denied(_))), "{denied:?}");
    let too_big = HostClaim::enqueue(&mut guest, borrow(rep), request("helper", vec![0; 2048]))
        .await
        .unwrap();
    assert!(
        matches!(too_big, Err(GuestError::Invalid(_))),
        "{too_big:?}"
    );
    let id = HostClaim::enqueue(&mut guest, borrow(rep), request("helper", b"x".to_vec()))
        .await
        .unwrap()
        .unwrap();
    let child = f.store.mailbox.load(&id).await.unwrap().unwrap();
    assert_eq!(child.thread, claim.thread, "same thread by default");
    assert_eq!(child.max_attempts, 3, "capped at the target's max_attempts");
    assert_eq!(child.metadata["parent"], claim.id);
    // Outside a claim, a thread is required.
    let no_thread = Host::enqueue(&mut guest, request("helper", b"x".to_vec()))
        .await
        .unwrap();
    assert!(
        matches!(no_thread, Err(GuestError::Invalid(_))),
        "{no_thread:?}"
    );
}

#[tokio::test]
async fn a_debounced_enqueue_joins_its_window_and_the_claim_hands_every_item() {
    use homing::runtime::bindings::types::{Debounce, Gather};
    let f = fixture("enqueue_to = [\"agent\"]\n");
    let mut guest = f.guest();
    let (rep, _) = f.claim(&mut guest, "t").await;
    let request = |payload: &[u8], debounce: Option<Debounce>| EnqueueRequest {
        agent: "agent".into(),
        thread: Some("w".into()),
        payload: payload.to_vec(),
        metadata: vec![],
        priority: None,
        delay_ms: None,
        dedupe_key: None,
        max_attempts: None,
        concurrency_key: None,
        debounce,
    };
    let window = |payload| Debounce {
        key: "burst".into(),
        quiet_ms: 1_000,
        max_wait_ms: 10_000,
        payload,
        max_items: 10,
    };
    let first = HostClaim::enqueue(
        &mut guest,
        borrow(rep),
        request(b"one", Some(window(Gather::Collect))),
    )
    .await
    .unwrap()
    .unwrap();
    f.clock.advance(500);
    let second = HostClaim::enqueue(
        &mut guest,
        borrow(rep),
        request(b"two", Some(window(Gather::Collect))),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(first, second, "the second enqueue joined the window");
    // A bad window is refused before the store, naming the field.
    let bad = HostClaim::enqueue(
        &mut guest,
        borrow(rep),
        request(
            b"x",
            Some(Debounce {
                quiet_ms: 20_000,
                ..window(Gather::Last)
            }),
        ),
    )
    .await
    .unwrap();
    assert!(
        matches!(&bad, Err(GuestError::Invalid(m)) if m.starts_with("debounce.quiet")),
        "{bad:?}"
    );
    guest.ack(borrow(rep)).await.unwrap().unwrap();
    // Not due before a quiet second after the last item.
    f.clock.advance(999);
    assert!(
        homing::claim::claim_for(&f.ctx.claimer())
            .await
            .unwrap()
            .is_none()
    );
    f.clock.advance(1);
    let claim: ClaimHandle = homing::claim::claim_for(&f.ctx.claimer())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claim.dispatch().id, first);
    let rep = guest.table().push(claim).unwrap().rep();
    let items = HostClaim::items(&mut guest, borrow(rep)).await.unwrap();
    let payloads: Vec<&[u8]> = items.iter().map(|i| i.payload.as_slice()).collect();
    assert_eq!(payloads, vec![&b"one"[..], &b"two"[..]]);
    let info = HostClaim::info(&mut guest, borrow(rep)).await.unwrap();
    assert_eq!(
        info.payload, b"two",
        "the handler's payload is the latest item"
    );
}

#[tokio::test]
async fn stop_requested_reports_shutdown_and_cancellation() {
    let f = fixture("");
    let mut guest = f.guest();
    let (rep, _) = f.claim(&mut guest, "t").await;
    assert_eq!(guest.stop_requested(borrow(rep)).await.unwrap(), None);
    f.shutdown.store(true, Ordering::SeqCst);
    assert_eq!(
        guest.stop_requested(borrow(rep)).await.unwrap(),
        Some(StopReason::Shutdown)
    );
    guest
        .table()
        .get(&borrow(rep))
        .unwrap()
        .control()
        .request_stop(homing::claim::StopReason::Interrupted);
    assert_eq!(
        guest.stop_requested(borrow(rep)).await.unwrap(),
        Some(StopReason::Interrupted)
    );
}

/// Asserts `invalid` naming the field, its size and the host's cap.
fn expect_over_cap<T: std::fmt::Debug>(result: Result<T, GuestError>, field: &str, len: usize) {
    match result {
        Err(GuestError::Invalid(message)) => assert_eq!(
            message,
            format!("{field}: {len} bytes exceeds the host's max_payload of 1024 bytes")
        ),
        other => panic!("{field} of {len} bytes: expected invalid, got {other:?}"),
    }
}

#[tokio::test]
async fn every_guest_value_over_max_payload_is_invalid_naming_field_and_cap() {
    let f = fixture("enqueue_to = [\"agent\"]\n");
    let mut guest = f.guest();
    let (rep, claim) = f.claim(&mut guest, "t").await;
    let over = vec![0xffu8; 1025];
    let request = |payload: Vec<u8>| EnqueueRequest {
        agent: "agent".into(),
        thread: Some("follow".into()),
        payload,
        metadata: Vec::new(),
        priority: None,
        delay_ms: None,
        dedupe_key: None,
        max_attempts: None,
        concurrency_key: None,
        debounce: None,
    };
    expect_over_cap(
        HostClaim::enqueue(&mut guest, borrow(rep), request(over.clone()))
            .await
            .unwrap(),
        "payload",
        1025,
    );
    expect_over_cap(
        Host::enqueue(&mut guest, request(over.clone()))
            .await
            .unwrap(),
        "payload",
        1025,
    );
    expect_over_cap(
        guest.append(borrow(rep), over.clone()).await.unwrap(),
        "entry",
        1025,
    );
    expect_over_cap(
        guest
            .append_expected(borrow(rep), over.clone(), 0)
            .await
            .unwrap(),
        "entry",
        1025,
    );
    expect_over_cap(
        guest
            .record_result(borrow(rep), over.clone())
            .await
            .unwrap(),
        "output",
        1025,
    );
    expect_over_cap(
        guest.complete(borrow(rep), over.clone()).await.unwrap(),
        "output",
        1025,
    );
    // Nothing was written, and the claim is still the guest's to settle.
    let d = f.store.mailbox.load(&claim.id).await.unwrap().unwrap();
    assert_eq!(d.status, Status::Claimed);
    assert!(d.result.is_none());
    assert_eq!(f.store.log.latest(&claim.thread).await.unwrap(), 0);
    assert_eq!(
        f.store
            .mailbox
            .list(&Default::default())
            .await
            .unwrap()
            .len(),
        1
    );

    // At the cap, every one is accepted.
    let at = vec![0xfeu8; 1024];
    HostClaim::enqueue(&mut guest, borrow(rep), request(at.clone()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        guest
            .append(borrow(rep), at.clone())
            .await
            .unwrap()
            .unwrap(),
        1
    );
    guest
        .record_result(borrow(rep), at.clone())
        .await
        .unwrap()
        .unwrap();
    guest
        .complete(borrow(rep), at.clone())
        .await
        .unwrap()
        .unwrap();
    let d = f.store.mailbox.load(&claim.id).await.unwrap().unwrap();
    assert_eq!(d.status, Status::Acked);
    assert!(d.result.unwrap().output == at);
}

#[test]
fn a_returned_output_over_the_cap_fails_naming_the_cap_and_a_cap_above_the_store_is_clamped() {
    let f = fixture("");
    assert_eq!(f.ctx.payload_cap(), 1024);
    assert_eq!(check_returned_output(&f.ctx, &[0u8; 1024]), None);
    assert_eq!(
        check_returned_output(&f.ctx, &[0u8; 1025]).as_deref(),
        Some("output of 1025 bytes exceeds max_payload 1024")
    );
    assert_eq!(max_payload_warning(1024, &f.store), None);

    // A host cap above what the store holds is clamped to it, and says so.
    let holds = f.store.max_value();
    let ctx = PluginContext {
        max_payload: u64::MAX,
        ..PluginContext::standalone("agent", f.ctx.config.clone(), f.store.clone(), ".".into())
    };
    assert_eq!(ctx.payload_cap(), holds);
    let over = usize::try_from(holds + 1).unwrap();
    assert_eq!(
        ctx.check_payload("entry", over),
        Err(format!(
            "entry: {over} bytes exceeds the host's max_payload of {holds} bytes (what the store \
             can hold; [host] max_payload is {})",
            u64::MAX
        ))
    );
    let warning = max_payload_warning(u64::MAX, &f.store).unwrap();
    assert!(
        warning.contains(&u64::MAX.to_string()) && warning.contains(&holds.to_string()),
        "{warning}"
    );
}

#[test]
fn guest_log_text_is_escaped_so_it_stays_one_line_without_terminal_escapes() {
    assert_eq!(
        escape_log_text("plain text\tand a tab"),
        "plain text\tand a tab"
    );
    assert_eq!(
        escape_log_text("one\nINFO host: forged\r\u{1b}[31mred\u{7}\u{0}\u{7f}\u{9b}"),
        r"one\nINFO host: forged\r\u{1b}[31mred\u{7}\u{0}\u{7f}\u{9b}"
    );
    assert_eq!(escape_log_text("ünï\u{202e}🙂"), "ünï\u{202e}🙂");
}

/// A guest's enqueue refuses control characters (and other non-printables) in the thread, a
/// metadata key and the dedupe key, through a claim or not, as `invalid` naming the field;
/// nothing is stored.
#[tokio::test]
async fn enqueue_refuses_names_that_are_not_printable() {
    let f = fixture("enqueue_to = [\"helper\"]\n");
    let mut guest = f.guest();
    let (rep, _) = f.claim(&mut guest, "t").await;
    let request = || EnqueueRequest {
        agent: "helper".into(),
        thread: None,
        payload: b"x".to_vec(),
        metadata: vec![],
        priority: None,
        delay_ms: None,
        dedupe_key: None,
        max_attempts: None,
        concurrency_key: None,
        debounce: None,
    };
    let bad = [
        (
            "thread",
            EnqueueRequest {
                thread: Some("forged\nINFO all good".into()),
                ..request()
            },
        ),
        (
            "thread",
            EnqueueRequest {
                thread: Some("\u{202e}txt.exe".into()),
                ..request()
            },
        ),
        (
            "metadata",
            EnqueueRequest {
                metadata: vec![("k\u{1b}[31m".into(), "v".into())],
                ..request()
            },
        ),
        (
            "dedupe_key",
            EnqueueRequest {
                dedupe_key: Some("key\u{0}".into()),
                ..request()
            },
        ),
    ];
    for (field, req) in bad {
        let through_claim = HostClaim::enqueue(&mut guest, borrow(rep), req.clone())
            .await
            .unwrap();
        let outside = Host::enqueue(
            &mut guest,
            EnqueueRequest {
                thread: req.thread.clone().or(Some("t".into())),
                ..req
            },
        )
        .await
        .unwrap();
        for out in [through_claim, outside] {
            match out {
                Err(GuestError::Invalid(message)) => {
                    assert!(message.starts_with(field), "{field}: {message}");
                    assert!(
                        !message.contains('\u{1b}') && !message.contains('\n'),
                        "{message}"
                    );
                }
                other => panic!("{field}: expected invalid, got {other:?}"),
            }
        }
    }
    assert_eq!(
        f.store
            .mailbox
            .list(&Default::default())
            .await
            .unwrap()
            .len(),
        1,
        "only the claimed dispatch"
    );
}

/// The inbox through a claim: `next-message` hands each pending message once per claim,
/// oldest first, and waits for one to be sent (woken by the send, not a poll); `ack-message`
/// appends it to the log with its note, repeats answer the same sequence, and an unknown
/// message or an interrupted claim is refused.
#[tokio::test]
async fn next_message_and_ack_message_read_and_settle_the_thread_inbox() {
    use homing::store::{MessageKind, NewMessage};
    let f = fixture("");
    let mut guest = f.guest();
    let (rep, claim) = f.claim(&mut guest, "t").await;
    let none = guest.next_message(borrow(rep), 0).await.unwrap();
    assert!(matches!(none, Ok(None)), "{none:?}");
    for text in ["one", "two"] {
        let m = NewMessage::new(MessageKind::Steer, text, "test").with_metadata("k", text);
        f.store.inbox.send("t", m, 10).await.unwrap();
    }
    let first = guest
        .next_message(borrow(rep), 0)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!((first.seq, first.body.as_slice()), (1, b"one".as_slice()));
    assert_eq!(first.sent_by, "test");
    let second = guest
        .next_message(borrow(rep), 0)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(second.seq, 2);
    let nothing = guest.next_message(borrow(rep), 0).await.unwrap();
    assert!(
        matches!(nothing, Ok(None)),
        "each message is handed once per claim: {nothing:?}"
    );

    // A wait is woken by a send.
    let store = f.store.clone();
    let started = std::time::Instant::now();
    let (woken, ()) = tokio::join!(guest.next_message(borrow(rep), 20_000), async move {
        tokio::task::yield_now().await;
        let m = NewMessage::new(MessageKind::FollowUp, "three", "test");
        store.inbox.send("t", m, 10).await.unwrap();
    });
    let woken = woken.unwrap().unwrap().unwrap();
    assert_eq!(woken.seq, 3);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "woken, not timed out"
    );

    let at = guest.ack_message(borrow(rep), 2).await.unwrap().unwrap();
    assert_eq!(
        guest.ack_message(borrow(rep), 2).await.unwrap().unwrap(),
        at,
        "a repeat"
    );
    let entries = guest.read_log(borrow(rep), 0, 10).await.unwrap().unwrap();
    assert_eq!(entries.len(), 1);
    let note = entries[0]
        .message
        .as_ref()
        .expect("the entry records the message");
    assert_eq!(
        (note.seq, entries[0].data.as_slice()),
        (2, b"two".as_slice())
    );
    assert_eq!(note.metadata, vec![("k".to_owned(), "two".to_owned())]);
    let unknown = guest.ack_message(borrow(rep), 99).await.unwrap();
    assert!(
        matches!(unknown, Err(GuestError::Invalid(_))),
        "{unknown:?}"
    );

    f.store.mailbox.interrupt("t", "stop").await.unwrap();
    let refused = guest.ack_message(borrow(rep), 1).await.unwrap();
    assert!(
        matches!(refused, Err(GuestError::Interrupted(_))),
        "{refused:?}"
    );
    let pending = f.store.inbox.message("t", 1).await.unwrap().unwrap();
    assert_eq!(
        pending.state,
        homing::store::MessageState::Pending,
        "kept for the next run"
    );
    drop(claim);
}

/// `waitpoint` creates once per name and hands the token (and its callback URL) to the call
/// that created it only; `await-waitpoint` is woken by a completion; `suspend` ends the claim
/// (the dispatch waits, holding no claim) and later writes through it are refused; a resumed
/// run finds its waitpoints with their results and a fresh token for a pending one.
#[tokio::test]
async fn waitpoints_are_created_once_awaited_and_suspended_on() {
    use homing::runtime::bindings::types::WaitpointState;
    use homing::store::waitpoints::token_digest;
    let f = fixture("max_resumes = 2");
    let mut guest = f.guest();
    let (rep, claim) = f.claim(&mut guest, "t").await;

    let bad = guest.suspend(borrow(rep)).await.unwrap();
    assert!(
        matches!(bad, Err(GuestError::Invalid(_))),
        "nothing to wait on: {bad:?}"
    );
    for (name, timeout) in [(" ", 1_000), ("x", 0), ("x", 31 * 24 * 3_600_000)] {
        let refused = guest
            .waitpoint(borrow(rep), name.into(), timeout, vec![])
            .await
            .unwrap();
        assert!(
            matches!(refused, Err(GuestError::Invalid(_))),
            "{name:?} {timeout}: {refused:?}"
        );
    }

    let meta = vec![("tool".to_owned(), "send_email".to_owned())];
    let first = guest
        .waitpoint(borrow(rep), "approve".into(), 60_000, meta.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.state, WaitpointState::Pending);
    assert_eq!(first.metadata, meta);
    let token = first
        .token
        .clone()
        .expect("the creating call gets the token");
    assert!(token.starts_with("hwp_") && token.len() > 40, "{token}");
    assert_eq!(
        first.callback_url.as_deref(),
        Some(
            format!(
                "https://homing.example.com/v1/waitpoints/{}/complete?token={token}",
                first.id
            )
            .as_str()
        )
    );
    let stored = f
        .store
        .waitpoints
        .waitpoint(&first.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        stored.token_digests,
        vec![token_digest(&token)],
        "only the digest is stored"
    );
    let again = guest
        .waitpoint(borrow(rep), "approve".into(), 5, vec![])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (again.id.as_str(), again.token.as_deref()),
        (first.id.as_str(), None)
    );
    assert_eq!(again.timeout_at, first.timeout_at, "returned unchanged");

    // A short wait in place, woken by a completion.
    let other = guest
        .waitpoint(borrow(rep), "quick".into(), 60_000, vec![])
        .await
        .unwrap()
        .unwrap();
    let store = f.store.clone();
    let quick = other.id.clone();
    let (woken, ()) = tokio::join!(
        guest.await_waitpoint(borrow(rep), other.id.clone(), 20_000),
        async move {
            tokio::task::yield_now().await;
            store
                .waitpoints
                .complete_waitpoint(&quick, b"yes".to_vec(), "test")
                .await
                .unwrap();
        }
    );
    let woken = woken.unwrap().unwrap();
    assert_eq!(
        (woken.state, woken.completion.as_deref()),
        (WaitpointState::Completed, Some(b"yes".as_slice()))
    );
    let unknown = guest
        .await_waitpoint(borrow(rep), "nope".into(), 0)
        .await
        .unwrap();
    assert!(
        matches!(unknown, Err(GuestError::Invalid(_))),
        "{unknown:?}"
    );
    let listed = guest.waitpoints(borrow(rep)).await.unwrap().unwrap();
    assert_eq!(
        listed.iter().map(|w| w.name.as_str()).collect::<Vec<_>>(),
        ["approve", "quick"]
    );
    assert!(
        listed.iter().all(|w| w.token.is_none()),
        "no token in a list"
    );

    // "quick" settled during this run: the suspend resumes at once (queued, one resume).
    guest.suspend(borrow(rep)).await.unwrap().unwrap();
    let d = f.store.mailbox.load(&claim.id).await.unwrap().unwrap();
    assert_eq!((d.status, d.resumes, d.attempt), (Status::Queued, 1, 0));
    let after = guest.append(borrow(rep), b"late".to_vec()).await.unwrap();
    assert!(matches!(after, Err(GuestError::LostClaim(_))), "{after:?}");

    // The resumed run: a fresh token for the pending waitpoint, then a real wait.
    f.clock.advance(10);
    let rep2 = {
        let c: ClaimHandle = homing::claim::claim_for(&f.ctx.claimer())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (c.dispatch().id.as_str(), c.dispatch().claims),
            (claim.id.as_str(), 2)
        );
        guest.table().push(c).unwrap().rep()
    };
    let found = guest
        .waitpoint(borrow(rep2), "approve".into(), 60_000, vec![])
        .await
        .unwrap()
        .unwrap();
    let fresh = found
        .token
        .clone()
        .expect("a later run gets a fresh token for a pending waitpoint");
    assert_ne!(fresh, token);
    let digests = f
        .store
        .waitpoints
        .waitpoint(&first.id)
        .await
        .unwrap()
        .unwrap()
        .token_digests;
    assert_eq!(
        digests,
        vec![token_digest(&token), token_digest(&fresh)],
        "both tokens stay valid"
    );
    let once = guest
        .waitpoint(borrow(rep2), "approve".into(), 60_000, vec![])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(once.token, None, "one fresh token per claim");
    guest.suspend(borrow(rep2)).await.unwrap().unwrap();
    let d = f.store.mailbox.load(&claim.id).await.unwrap().unwrap();
    assert_eq!((d.status, d.resumes), (Status::Waiting, 1));
    assert!(
        f.store
            .mailbox
            .claim("agent", "w", LEASE_MS)
            .await
            .unwrap()
            .is_none(),
        "a waiting dispatch is not claimed"
    );

    // The completion resumes it; the next run reads the result. A third suspend would pass
    // `max_resumes = 2`.
    f.clock.advance(10);
    f.store
        .waitpoints
        .complete_waitpoint(&first.id, b"{\"approved\": true}".to_vec(), "token")
        .await
        .unwrap();
    let claim3: ClaimHandle = homing::claim::claim_for(&f.ctx.claimer())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (claim3.dispatch().resumes, claim3.dispatch().claims),
        (2, 3)
    );
    let rep3 = guest.table().push(claim3).unwrap().rep();
    let all = guest.waitpoints(borrow(rep3)).await.unwrap().unwrap();
    assert_eq!(
        all[0].completion.as_deref(),
        Some(b"{\"approved\": true}".as_slice())
    );
    let _ = guest
        .waitpoint(borrow(rep3), "third".into(), 60_000, vec![])
        .await
        .unwrap()
        .unwrap();
    let capped = guest.suspend(borrow(rep3)).await.unwrap();
    assert!(
        matches!(&capped, Err(GuestError::Denied(m)) if m.contains("max_resumes")),
        "{capped:?}"
    );
}

/// `emit` numbers a claim's deltas from 1 and refuses an empty or oversized chunk as invalid;
/// the steps answer as `journal = "off"` does (nothing stored, nothing found) and still check
/// their input; `info` counts the claim; a concurrency key is passed through (or taken from the
/// metadata the target names), and one over 128 bytes is refused naming it.
#[tokio::test]
async fn emit_steps_off_and_info_answer_as_the_contract_says() {
    let f = fixture("enqueue_to = [\"helper\"]");
    let mut guest = f.guest();
    let (rep, _claim) = f.claim(&mut guest, "t").await;
    let info = guest.info(borrow(rep)).await.unwrap();
    assert_eq!((info.claims, info.resumes), (1, 0), "{info:?}");
    for want in 1..=2 {
        let seq = guest.emit(borrow(rep), b"tok".to_vec()).await.unwrap();
        assert_eq!(seq.ok(), Some(want));
    }
    for chunk in [Vec::new(), vec![b'x'; 64 * 1024 + 1]] {
        let refused = guest.emit(borrow(rep), chunk).await.unwrap();
        assert!(
            matches!(&refused, Err(GuestError::Invalid(m)) if m.contains("chunk")),
            "{refused:?}"
        );
    }

    let put = guest
        .step_put(borrow(rep), "model-call".into(), b"answer".to_vec())
        .await
        .unwrap();
    assert!(put.is_ok(), "{put:?}");
    let got = guest
        .step_get(borrow(rep), "model-call".into())
        .await
        .unwrap();
    assert!(
        matches!(got, Ok(None)),
        "journal = \"off\" stores nothing: {got:?}"
    );
    let blank = guest.step_get(borrow(rep), " ".into()).await.unwrap();
    assert!(matches!(blank, Err(GuestError::Invalid(_))), "{blank:?}");
    let long = guest
        .step_put(borrow(rep), "k".repeat(257), vec![])
        .await
        .unwrap();
    assert!(matches!(long, Err(GuestError::Invalid(_))), "{long:?}");
    let big = guest
        .step_put(borrow(rep), "k".into(), vec![0; 2048])
        .await
        .unwrap();
    assert!(matches!(big, Err(GuestError::Invalid(_))), "{big:?}");

    let request = |key: Option<String>, metadata: Vec<(String, String)>| EnqueueRequest {
        agent: "helper".into(),
        thread: None,
        payload: b"x".to_vec(),
        metadata,
        priority: None,
        delay_ms: None,
        dedupe_key: None,
        max_attempts: None,
        concurrency_key: key,
        debounce: None,
    };
    let keyed = HostClaim::enqueue(
        &mut guest,
        borrow(rep),
        request(Some("customer-1".into()), vec![]),
    )
    .await
    .unwrap()
    .unwrap();
    let d = f.store.mailbox.load(&keyed).await.unwrap().unwrap();
    assert_eq!(d.concurrency_key.as_deref(), Some("customer-1"));
    let from_meta = HostClaim::enqueue(
        &mut guest,
        borrow(rep),
        request(None, vec![("customer".into(), "c2".into())]),
    )
    .await
    .unwrap()
    .unwrap();
    let d = f.store.mailbox.load(&from_meta).await.unwrap().unwrap();
    assert_eq!(d.concurrency_key.as_deref(), Some("c2"));
    let long = HostClaim::enqueue(
        &mut guest,
        borrow(rep),
        request(Some("k".repeat(129)), vec![]),
    )
    .await
    .unwrap();
    match long {
        Err(GuestError::Invalid(text)) => assert!(text.contains("concurrency_key"), "{text}"),
        other => panic!("expected invalid, got {other:?}"),
    }
}

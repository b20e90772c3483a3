//! The store conformance suite (`conformance/`) run against the NATS JetStream backend:
//! one real `nats-server` for the whole test process (started on a free port with JetStream in a temp
//! directory), one stream per test under its own prefix. Several instances opened on one
//! prefix stand for several hosts. `cargo test conformance` runs it with the embedded suite.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use homing::store::nats::{NatsConfig, NatsStore};
use homing::store::{SharedClock, Store, StoreResult};

use crate::conformance;
use crate::natsd::NatsServer;

/// A prefix per test on one shared server.
struct NatsFactory;

/// The request timeout of the suite's stores. These tests check what the store decides, not how
/// fast: on a machine busy with a parallel build (load 8-10 on 2 cores) bursts of requests took
/// longer than the 5 s default, in about one run in five (a timeout is `Unavailable`, correctly,
/// but it is not what these tests are about). Latency has its own benchmarks.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

fn server() -> &'static NatsServer {
    static SERVER: OnceLock<NatsServer> = OnceLock::new();
    SERVER.get_or_init(NatsServer::start)
}

/// One test's stream (named by its prefix), deleted when the test ends, so the one server the
/// suite shares holds only the streams of the tests running, not several hundred by the end.
struct TestStream(String);

impl Drop for TestStream {
    fn drop(&mut self) {
        if let Some(reaper) = reaper() {
            let _ = reaper.send(self.0.clone());
        }
    }
}

/// A thread that deletes the streams sent to it, with a client of its own (a test's runtime
/// may already be shutting down when its data is dropped).
fn reaper() -> Option<&'static tokio::sync::mpsc::UnboundedSender<String>> {
    static REAPER: OnceLock<Option<tokio::sync::mpsc::UnboundedSender<String>>> = OnceLock::new();
    REAPER
        .get_or_init(|| {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
            let url = server().url();
            std::thread::Builder::new()
                .name("stream-reaper".into())
                .spawn(move || {
                    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    else {
                        return;
                    };
                    runtime.block_on(async move {
                        let Ok(client) = async_nats::connect(url).await else {
                            return;
                        };
                        let js = async_nats::jetstream::new(client);
                        while let Some(name) = rx.recv().await {
                            let _ = js.delete_stream(&name).await;
                        }
                    });
                })
                .ok()?;
            Some(tx)
        })
        .as_ref()
}

impl conformance::Factory for NatsFactory {
    type Data = TestStream;

    async fn create(&self) -> TestStream {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        server();
        TestStream(format!("conf{}", NEXT.fetch_add(1, Ordering::Relaxed)))
    }

    async fn open(&self, stream: &TestStream, clock: SharedClock) -> StoreResult<Store> {
        let config = NatsConfig {
            urls: vec![server().url()],
            prefix: stream.0.clone(),
            request_timeout: REQUEST_TIMEOUT,
            ..NatsConfig::default()
        };
        NatsStore::open(&config, clock).await
    }
}

conformance::suite!(NatsFactory);

/// The same suite with every instance a short-lived client's: each operation reads what it
/// decides on from the server instead of following the stream (the CLI's way).
mod clients {
    use super::*;

    /// A prefix per test; every instance opened with [`NatsStore::open_client`].
    struct ClientFactory;

    impl conformance::Factory for ClientFactory {
        type Data = TestStream;

        async fn create(&self) -> TestStream {
            NatsFactory.create().await
        }

        async fn open(&self, stream: &TestStream, clock: SharedClock) -> StoreResult<Store> {
            let config = NatsConfig {
                urls: vec![server().url()],
                prefix: stream.0.clone(),
                request_timeout: REQUEST_TIMEOUT,
                ..NatsConfig::default()
            };
            NatsStore::open_client(&config, clock).await
        }
    }

    conformance::suite!(ClientFactory);
}

/// The NATS backend's own size rules, beyond the shared suite.
mod nats_sizes {
    use super::*;
    use homing::store::nats::Room;
    use homing::store::{Mailbox, NewDispatch, StoreError, SystemClock};

    async fn open(prefix: &str) -> NatsStore {
        let config = NatsConfig {
            urls: vec![server().url()],
            prefix: prefix.into(),
            request_timeout: REQUEST_TIMEOUT,
            ..NatsConfig::default()
        };
        NatsStore::connect(&config, std::sync::Arc::new(SystemClock))
            .await
            .expect("connect")
    }

    /// The limits come from the server's advertised max_payload (1 MiB by default): payloads
    /// and outputs share one message, log entries have one each.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn limits_follow_the_servers_max_payload() {
        let store = open("sizes_room").await;
        let room = store.room();
        assert_eq!(room, Room::of(1024 * 1024));
        assert_eq!(room.value, 489_467);
        assert_eq!(room.entry, 1_044_472);
        let store = store.into_store();
        assert_eq!(store.mailbox.max_value(), room.value);
        assert_eq!(store.max_value(), room.value);
    }

    /// A dispatch whose metadata leaves no room in its message for an output of up to the
    /// limit is refused at enqueue, naming the metadata and the server's max_payload: it
    /// could be stored but never completed. With a smaller payload the same metadata fits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn metadata_leaving_no_room_for_an_output_is_refused_at_enqueue() {
        let store = open("sizes_meta").await;
        let room = store.room();
        let value = usize::try_from(room.value).unwrap();
        let meta = "m".repeat(60 * 1024);
        let crowded = NewDispatch::new("agent", "t", vec![1u8; value])
            .with_id("crowded")
            .with_metadata("notes", meta.clone());
        match store.enqueue(crowded).await {
            Err(StoreError::Invalid(message)) => assert!(
                message.starts_with("metadata: dispatch `crowded`")
                    && message.contains("max_payload is 1048576 bytes"),
                "{message}"
            ),
            other => panic!("expected Invalid, got {other:?}"),
        }
        assert!(store.load("crowded").await.unwrap().is_none());
        let roomy = NewDispatch::new("agent", "t", vec![1u8; 1024])
            .with_id("roomy")
            .with_metadata("notes", meta);
        let d = store.enqueue(roomy).await.unwrap();
        let c = store
            .claim_dispatch(&d.id, "w", 30_000)
            .await
            .unwrap()
            .unwrap();
        let token = c.token().unwrap().to_owned();
        let output = vec![2u8; value];
        let done = store
            .complete(
                &d.id,
                &token,
                homing::store::RunResult::success(output.clone()),
            )
            .await
            .unwrap();
        assert!(
            done.result.unwrap().output == output,
            "an output at the limit fits"
        );
    }
}

/// What a short-lived client costs: it reads the records its operation decides on, never the
/// stream.
mod nats_clients {
    use super::*;
    use homing::store::{ListFilter, Mailbox, NewDispatch, RunResult, SequenceStore, SystemClock};
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    fn config(prefix: &str) -> NatsConfig {
        NatsConfig {
            urls: vec![server().url()],
            prefix: prefix.into(),
            request_timeout: REQUEST_TIMEOUT,
            ..NatsConfig::default()
        }
    }

    /// With 2,000 dispatches over 200 threads retained (half of them settled), a client's
    /// enqueue, show, cancel, thread listing, interrupt and log append and read together
    /// receive fewer messages than one thread holds ten times over; a replay would receive
    /// every record.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_receives_only_the_records_its_operations_decide_on() {
        let prefix = "client_reads";
        let host = NatsStore::connect(&config(prefix), Arc::new(SystemClock))
            .await
            .unwrap();
        let mut minted = Vec::new();
        for i in 0..2_000 {
            let d = host
                .enqueue(NewDispatch::new("a", format!("t{}", i % 200), "x"))
                .await
                .unwrap();
            minted.push(d.id);
        }
        for _ in 0..1_000 {
            let d = host.claim("a", "w", 60_000).await.unwrap().unwrap();
            let token = d.token().unwrap().to_owned();
            host.complete(&d.id, &token, RunResult::success("ok"))
                .await
                .unwrap();
        }
        let client = NatsStore::connect_client(&config(prefix), Arc::new(SystemClock))
            .await
            .unwrap();
        let stats = client.client_statistics();
        let before = stats.in_messages.load(Ordering::Relaxed);

        let d = client
            .enqueue(NewDispatch::new("a", "t7", "new"))
            .await
            .unwrap();
        let shown = client.load(&d.id).await.unwrap().unwrap();
        assert_eq!(shown.payload, b"new");
        let old = client.load(&minted[0]).await.unwrap().unwrap();
        assert_eq!(old.thread, "t0");
        assert!(client.cancel(&d.id).await.unwrap().is_some());
        let listed = client
            .list(&ListFilter {
                thread: Some("t7".into()),
                ..ListFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(listed.len(), 11);
        let interrupt = client.interrupt("t8", "stop").await.unwrap();
        assert_eq!(interrupt.epoch, 1);
        let seq = client.append("t9", b"entry", None).await.unwrap();
        assert_eq!(client.read("t9", 0, 10).await.unwrap().len(), 1);
        assert_eq!(seq, 1);

        let received = stats.in_messages.load(Ordering::Relaxed) - before;
        assert!(
            received < 150,
            "a client received {received} messages for eight operations"
        );
        // The host sees what the client did.
        let seen = host.load(&d.id).await.unwrap().unwrap();
        assert_eq!(seen.status, homing::store::Status::Cancelled);
        client.close().await;
        host.close().await;
        NatsStore::delete_stream(&config(prefix)).await.unwrap();
    }

    /// A dispatch id that no thread holds is not found, whether it looks minted (a UUID,
    /// looked up across threads) or chosen (looked up through the id index).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_reports_unknown_ids_as_missing() {
        let prefix = "client_missing";
        let client = NatsStore::connect_client(&config(prefix), Arc::new(SystemClock))
            .await
            .unwrap();
        client
            .enqueue(NewDispatch::new("a", "t", "x").with_id("chosen"))
            .await
            .unwrap();
        let uuid = uuid::Uuid::now_v7().to_string();
        assert!(client.load(&uuid).await.unwrap().is_none());
        assert!(client.load("other").await.unwrap().is_none());
        assert!(client.cancel(&uuid).await.unwrap().is_none());
        assert_eq!(
            client.load("chosen").await.unwrap().unwrap().thread,
            "t".to_owned()
        );
        NatsStore::delete_stream(&config(prefix)).await.unwrap();
    }
}

/// Settled records leave their threads' trees for the archive (store/nats/archive.rs): every
/// read answers as before, a starting host does not read them, and the move never lets a stale
/// writer through.
mod nats_archive {
    use super::*;
    use homing::store::nats::keys::Key;
    use homing::store::{
        Dispatch, ListFilter, Mailbox, NewDispatch, RunResult, Status, StoreError, SystemClock,
    };
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    /// Settled records are archived at the first sweep after they settle.
    fn config(prefix: &str) -> NatsConfig {
        NatsConfig {
            urls: vec![server().url()],
            prefix: prefix.into(),
            request_timeout: REQUEST_TIMEOUT,
            settled_ttl: Some(Duration::from_secs(3600)),
            archive_after: Duration::ZERO,
            ..NatsConfig::default()
        }
    }

    async fn open_host(prefix: &str) -> NatsStore {
        NatsStore::connect(&config(prefix), Arc::new(SystemClock))
            .await
            .unwrap()
    }

    async fn jetstream() -> async_nats::jetstream::Context {
        let client = async_nats::connect(server().url()).await.unwrap();
        async_nats::jetstream::new(client)
    }

    /// The sequence of the last message of any subject matching `filter`, if any (a direct
    /// get).
    async fn last_seq(
        js: &async_nats::jetstream::Context,
        prefix: &str,
        filter: &str,
    ) -> Option<u64> {
        let body = serde_json::json!({ "last_by_subj": filter }).to_string();
        let reply = js
            .client()
            .request(format!("$JS.API.DIRECT.GET.{prefix}"), body.into())
            .await
            .unwrap();
        if reply.status.is_some_and(|s| s.as_u16() == 404) {
            return None;
        }
        assert!(
            reply.status.is_none(),
            "direct get: {:?}",
            reply.description
        );
        let seq = reply.headers.as_ref().and_then(|h| h.get("Nats-Sequence"));
        Some(seq.unwrap().as_str().parse().unwrap())
    }

    /// The time the stores read (a system clock).
    fn now() -> u64 {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        u64::try_from(since.as_millis()).unwrap()
    }

    /// Sweeps until `n` records were archived in all (each sweep reads one page).
    async fn archive_all(store: &NatsStore, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut archived = 0;
        while archived < n {
            assert!(Instant::now() < deadline, "archived {archived} of {n}");
            archived += store.archive_settled(now()).await.unwrap();
        }
        assert_eq!(archived, n);
    }

    /// Claims and settles `id`; its token and the settled record.
    async fn settle(store: &NatsStore, id: &str, how: &str) -> (String, Dispatch) {
        let c = store
            .claim_dispatch(id, "w", 60_000)
            .await
            .unwrap()
            .unwrap();
        let token = c.token().unwrap().to_owned();
        let d = match how {
            "complete" => store
                .complete(id, &token, RunResult::success("out"))
                .await
                .unwrap(),
            _ => store.dead_letter(id, &token, "poison").await.unwrap(),
        };
        (token, d)
    }

    /// Everything a reader sees of the records.
    async fn everything(store: &NatsStore, ids: &[String]) -> Vec<String> {
        let mut seen = Vec::new();
        for id in ids {
            seen.push(format!("{:?}", store.load(id).await.unwrap()));
        }
        for thread in [None, Some("t"), Some("u")] {
            let filter = ListFilter {
                thread: thread.map(str::to_owned),
                ..ListFilter::default()
            };
            seen.push(format!("{:?}", store.list(&filter).await.unwrap()));
        }
        seen.push(format!("{:?}", store.counts().await.unwrap()));
        seen.push(format!("{:?}", store.list_terminal(10, 0).await.unwrap()));
        seen
    }

    /// A settled record (acked, dead-lettered, cancelled; minted and chosen ids) leaves its
    /// thread's tree for the archive, and a host, a client and a restarted host show, list,
    /// count, dedupe and repeat settlements of it exactly as before; a purge removes it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_archived_record_reads_as_it_did_in_its_tree() {
        let prefix = "archive_reads";
        let host = open_host(prefix).await;
        let client = NatsStore::connect_client(&config(prefix), Arc::new(SystemClock))
            .await
            .unwrap();
        let minted = host.enqueue(NewDispatch::new("a", "t", "m")).await.unwrap();
        let chosen_new = NewDispatch::new("a", "t", "c").with_id("chosen-1");
        let chosen = host.enqueue(chosen_new.clone()).await.unwrap();
        let dead = host.enqueue(NewDispatch::new("a", "u", "d")).await.unwrap();
        let cancelled = host
            .enqueue(NewDispatch::new("a", "u", "x").with_dedupe_key("k"))
            .await
            .unwrap();
        let live = host
            .enqueue(NewDispatch::new("a", "t", "live"))
            .await
            .unwrap();
        let (token, done) = settle(&host, &minted.id, "complete").await;
        settle(&host, &chosen.id, "complete").await;
        settle(&host, &dead.id, "dead").await;
        host.cancel(&cancelled.id).await.unwrap().unwrap();
        let ids: Vec<String> = [&minted, &chosen, &dead, &cancelled, &live]
            .iter()
            .map(|d| d.id.clone())
            .collect();
        let before = everything(&host, &ids).await;
        assert_eq!(everything(&client, &ids).await, before);

        archive_all(&host, 4).await;
        let js = jetstream().await;
        for d in [&minted, &chosen, &dead, &cancelled] {
            let tree = Key::Dispatch(d.thread.clone(), d.id.clone()).subject(prefix);
            let archived = Key::Archive(d.thread.clone(), d.id.clone()).subject(prefix);
            assert_eq!(
                last_seq(&js, prefix, &tree).await,
                None,
                "{} left its tree",
                d.id
            );
            assert!(
                last_seq(&js, prefix, &archived).await.is_some(),
                "{} archived",
                d.id
            );
        }
        let live_subject = Key::Dispatch(live.thread.clone(), live.id.clone()).subject(prefix);
        assert!(
            last_seq(&js, prefix, &live_subject).await.is_some(),
            "live work stays"
        );
        assert_eq!(host.archive_settled(now()).await.unwrap(), 0);

        assert_eq!(everything(&host, &ids).await, before);
        assert_eq!(everything(&client, &ids).await, before);
        let restarted = open_host(prefix).await;
        assert_eq!(everything(&restarted, &ids).await, before);

        // A holder repeating its settlement gets the record back.
        for store in [&host, &client] {
            assert_eq!(
                store
                    .complete(&minted.id, &token, RunResult::success("out"))
                    .await
                    .unwrap(),
                done
            );
        }
        // Chosen ids and minted ids stay taken; the same content under a chosen id is the
        // stored record.
        assert_eq!(
            host.enqueue(chosen_new).await.unwrap(),
            host.load("chosen-1").await.unwrap().unwrap()
        );
        for (id, thread) in [
            (&minted.id, "t"),
            (&minted.id, "other"),
            (&chosen.id, "other"),
        ] {
            let again = NewDispatch::new("a", thread, "again").with_id(id);
            for store in [&host, &client] {
                match store.enqueue(again.clone()).await {
                    Err(StoreError::Duplicate { id: dup, .. }) => assert_eq!(&dup, id),
                    other => panic!("expected Duplicate for {id} on {thread}, got {other:?}"),
                }
            }
        }
        // A settled dedupe key is free again, as it was before the move.
        host.enqueue(NewDispatch::new("a", "u", "y").with_dedupe_key("k"))
            .await
            .unwrap();
        // What a retry reads.
        assert_eq!(
            client.load(&dead.id).await.unwrap().unwrap().status,
            Status::DeadLetter
        );

        let purged = host.purge_terminal(u64::MAX).await.unwrap();
        assert_eq!(purged, 4);
        for d in [&minted, &chosen, &dead, &cancelled] {
            assert_eq!(client.load(&d.id).await.unwrap(), None);
            assert_eq!(host.load(&d.id).await.unwrap(), None);
        }
        assert!(host.list_terminal(10, 0).await.unwrap().is_empty());
        restarted.close().await;
        client.close().await;
        host.close().await;
        NatsStore::delete_stream(&config(prefix)).await.unwrap();
    }

    /// How many messages a host receives from connecting until its view caught up.
    async fn start_cost(prefix: &str) -> (u64, NatsStore) {
        let store = open_host(prefix).await;
        let received = store
            .client_statistics()
            .in_messages
            .load(Ordering::Relaxed);
        (received, store)
    }

    /// With 600 settled dispatches over 60 threads archived, a starting host receives about
    /// what the trees hold (thread records and live work), not the archive: fewer messages
    /// than a tenth of what it received when the same records were still in the trees.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_starting_host_does_not_read_archived_records() {
        let prefix = "archive_start";
        let host = open_host(prefix).await;
        for i in 0..600 {
            host.enqueue(NewDispatch::new("a", format!("t{}", i % 60), "x"))
                .await
                .unwrap();
        }
        for _ in 0..600 {
            let d = host.claim("a", "w", 60_000).await.unwrap().unwrap();
            let token = d.token().unwrap().to_owned();
            host.ack(&d.id, &token).await.unwrap();
        }
        let live: Vec<String> = {
            let mut ids = Vec::new();
            for i in 0..5 {
                let d = host
                    .enqueue(NewDispatch::new("a", format!("live{i}"), "x"))
                    .await
                    .unwrap();
                ids.push(d.id);
            }
            ids
        };
        let (unarchived, before) = start_cost(prefix).await;
        assert!(unarchived >= 600, "received {unarchived} before archiving");
        before.close().await;

        archive_all(&host, 600).await;
        let (received, after) = start_cost(prefix).await;
        assert!(
            received < 150 && received * 4 < unarchived,
            "a host started over 600 archived records received {received} messages \
             ({unarchived} before they were archived)"
        );
        assert_eq!(after.view_records(), live.len());
        // It works: it claims the live dispatches and shows the archived ones.
        let mut claimed = Vec::new();
        while let Some(d) = after.claim("a", "w2", 60_000).await.unwrap() {
            claimed.push(d.id);
        }
        claimed.sort();
        let mut expected = live.clone();
        expected.sort();
        assert_eq!(claimed, expected);
        let listed = after
            .list(&ListFilter {
                statuses: vec![Status::Acked],
                limit: 1000,
                ..ListFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(listed.len(), 600);
        after.close().await;
        host.close().await;
        NatsStore::delete_stream(&config(prefix)).await.unwrap();
    }

    /// The archiver never deletes a tree's last message: a writer still holding the fence of
    /// the tree whose last message was the settled record is refused after the move, as it
    /// was before.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn archiving_never_moves_a_trees_fence_back() {
        let prefix = "archive_fence";
        let host = open_host(prefix).await;
        let d = host.enqueue(NewDispatch::new("a", "t", "x")).await.unwrap();
        settle(&host, &d.id, "complete").await;
        let js = jetstream().await;
        let tree = Key::tree(prefix, "t");
        let record = Key::Dispatch("t".into(), d.id.clone()).subject(prefix);
        let fence = last_seq(&js, prefix, &tree).await.unwrap();
        assert_eq!(
            last_seq(&js, prefix, &record).await,
            Some(fence),
            "the settled record is its tree's last message"
        );
        archive_all(&host, 1).await;
        assert_eq!(last_seq(&js, prefix, &record).await, None);
        let now_last = last_seq(&js, prefix, &tree).await.unwrap();
        assert!(
            now_last > fence,
            "the tree's last sequence moved on: {now_last}"
        );

        // A stale writer's thread record, fenced by the tree as it was before the move.
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Expected-Last-Subject-Sequence", fence.to_string());
        headers.insert("Nats-Expected-Last-Subject-Sequence-Subject", tree.as_str());
        let stale = js
            .publish_with_headers(
                Key::Thread("t".into()).subject(prefix),
                headers,
                bytes::Bytes::from_static(b"{\"epoch\":7}"),
            )
            .await
            .unwrap()
            .await;
        assert!(stale.is_err(), "a stale fence was accepted: {stale:?}");
        assert_eq!(host.thread_epoch("t").await.unwrap(), 0);
        host.close().await;
        NatsStore::delete_stream(&config(prefix)).await.unwrap();
    }
}

/// The thread inbox on NATS (store/nats/inbox.rs), as hosts and as clients: sends, acks,
/// discards, follow-ups at send and at settlement, purge, and watches.
mod nats_inbox {
    use super::*;
    use homing::store::inbox::{Inbox, MessageFilter, MessageKind, MessageState, NewMessage};
    use homing::store::{
        Fence, ListFilter, Mailbox, NewDispatch, RunResult, SequenceStore, Status, StoreError,
        SystemClock,
    };
    use std::sync::Arc;
    use std::time::Duration;

    fn config(prefix: &str) -> NatsConfig {
        NatsConfig {
            urls: vec![server().url()],
            prefix: prefix.into(),
            request_timeout: REQUEST_TIMEOUT,
            ..NatsConfig::default()
        }
    }

    async fn open(prefix: &str, host: bool) -> NatsStore {
        let clock = Arc::new(SystemClock);
        if host {
            NatsStore::connect(&config(prefix), clock).await.unwrap()
        } else {
            NatsStore::connect_client(&config(prefix), clock)
                .await
                .unwrap()
        }
    }

    fn steer(text: &str) -> NewMessage {
        NewMessage::new(MessageKind::Steer, text.as_bytes().to_vec(), "cli")
    }

    /// Enqueues and claims a dispatch of `agent` on `thread`; its fence.
    async fn claimed(store: &NatsStore, agent: &str, thread: &str) -> (String, String, Fence) {
        let d = store
            .enqueue(NewDispatch::new(agent, thread, "x"))
            .await
            .unwrap();
        let c = store
            .claim_dispatch(&d.id, "w", 60_000)
            .await
            .unwrap()
            .unwrap();
        let token = c.token().unwrap().to_owned();
        (d.id, token, Fence::of(&c).unwrap())
    }

    async fn follow_ups(store: &NatsStore, thread: &str) -> Vec<homing::store::Dispatch> {
        store
            .list(&ListFilter {
                thread: Some(thread.into()),
                ..ListFilter::default()
            })
            .await
            .unwrap()
            .into_iter()
            .filter(|d| d.metadata.get("enqueued-by").map(String::as_str) == Some("inbox"))
            .collect()
    }

    async fn send_ack_discard(host: bool) {
        let prefix = format!("inbox_basic_{host}");
        let store = open(&prefix, host).await;
        let other = open(&prefix, false).await;
        let (first_id, first_token, fence) = claimed(&store, "a", "t").await;
        let one = store.send("t", steer("one"), 10).await.unwrap();
        assert_eq!(one.message.seq, 1);
        assert!(one.follow_ups.is_empty());
        let two = other
            .send("t", steer("two").with_metadata("k", "v"), 10)
            .await
            .unwrap();
        assert_eq!(two.message.seq, 2);
        store.send("t", steer("three"), 10).await.unwrap();
        let marks = store.inbox("t").await.unwrap();
        assert_eq!((marks.latest, marks.pending, marks.followed), (3, 3, 0));
        assert!(matches!(
            store.send("t", steer("four"), 3).await,
            Err(StoreError::Limit(_))
        ));

        store.append("t", b"before", Some(&fence)).await.unwrap();
        let at = store.ack_message("t", 2, &fence).await.unwrap();
        assert_eq!(at, 2);
        assert_eq!(store.ack_message("t", 2, &fence).await.unwrap(), 2);
        let entries = store.read("t", 0, 10).await.unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].note, None);
        assert_eq!(entries[1].data, b"two");
        let note = entries[1].note.clone().unwrap();
        assert_eq!((note.seq, note.kind), (2, MessageKind::Steer));
        assert_eq!(note.metadata.get("k").map(String::as_str), Some("v"));
        let acked = other.message("t", 2).await.unwrap().unwrap();
        assert_eq!(acked.state, MessageState::Acked);
        assert_eq!(acked.acked_by.as_deref(), Some(fence.dispatch.as_str()));
        assert_eq!(acked.log_seq, Some(2));
        assert_eq!(acked.payload, b"two");

        match store.ack_message("t", 9, &fence).await {
            Err(StoreError::Invalid(m)) => assert!(m.starts_with("seq:"), "{m}"),
            other => panic!("expected Invalid, got {other:?}"),
        }
        assert_eq!(other.discard_messages("t", 1).await.unwrap(), 1);
        match store.ack_message("t", 1, &fence).await {
            Err(StoreError::Invalid(m)) => assert!(m.starts_with("seq:"), "{m}"),
            other => panic!("expected Invalid, got {other:?}"),
        }
        // Another holder of the thread finds message 2 acked by the first.
        store
            .complete(&first_id, &first_token, RunResult::success("ok"))
            .await
            .unwrap();
        let (_, _, second) = claimed(&store, "a", "t").await;
        match store.ack_message("t", 2, &second).await {
            Err(StoreError::Duplicate { id, holder }) => {
                assert_eq!(id, second.dispatch);
                assert_eq!(holder.as_deref(), Some(fence.dispatch.as_str()));
            }
            other => panic!("expected Duplicate, got {other:?}"),
        }
        let marks = other.inbox("t").await.unwrap();
        assert_eq!((marks.latest, marks.pending), (3, 1));
        let pending = store
            .messages(
                "t",
                &MessageFilter {
                    state: Some(MessageState::Pending),
                    ..MessageFilter::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(pending.iter().map(|m| m.seq).collect::<Vec<_>>(), vec![3]);
        let all = other
            .messages("t", &MessageFilter::default())
            .await
            .unwrap();
        assert_eq!(all.iter().map(|m| m.seq).collect::<Vec<_>>(), vec![1, 2, 3]);
        assert_eq!(store.pending_total().await.unwrap(), 1);
        assert_eq!(other.pending_total().await.unwrap(), 1);
        NatsStore::delete_stream(&config(&prefix)).await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_host_sends_acks_and_discards() {
        send_ack_discard(true).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_sends_acks_and_discards() {
        send_ack_discard(false).await;
    }

    async fn follow_up_at_send_and_settle(host: bool) {
        let prefix = format!("inbox_follow_{host}");
        let store = open(&prefix, host).await;
        let follow =
            |text: &str| NewMessage::new(MessageKind::FollowUp, text.as_bytes().to_vec(), "cli");
        // A thread that never ran an agent needs one named.
        match store.send("idle", follow("hi"), 10).await {
            Err(StoreError::Invalid(m)) => assert!(m.starts_with("agent:"), "{m}"),
            other => panic!("expected Invalid, got {other:?}"),
        }
        assert_eq!(store.inbox("idle").await.unwrap().latest, 0);
        let sent = store
            .send("idle", follow("hi").to_agent("b"), 10)
            .await
            .unwrap();
        assert_eq!(sent.follow_ups.len(), 1);
        let d = store.load(&sent.follow_ups[0]).await.unwrap().unwrap();
        assert_eq!((d.agent.as_str(), d.status), ("b", Status::Queued));
        assert_eq!(d.metadata.get("messages").map(String::as_str), Some("1-1"));
        assert_eq!(store.inbox("idle").await.unwrap().followed, 1);

        // Settlement (T8) of the last live work answers a steer sent meanwhile.
        let (id, token, _) = claimed(&store, "a", "t").await;
        let s = store.send("t", steer("later"), 10).await.unwrap();
        assert!(s.follow_ups.is_empty());
        store
            .complete(&id, &token, RunResult::success("ok"))
            .await
            .unwrap();
        let ups = follow_ups(&store, "t").await;
        assert_eq!(ups.len(), 1, "{ups:?}");
        assert_eq!(ups[0].agent, "a");
        assert_eq!(store.inbox("t").await.unwrap().followed, 1);
        // The follow-up runs and leaves the message pending: its settlement starts nothing.
        let c = store
            .claim_dispatch(&ups[0].id, "w", 60_000)
            .await
            .unwrap()
            .unwrap();
        store
            .dead_letter(&c.id, c.token().unwrap(), "boom")
            .await
            .unwrap();
        assert_eq!(follow_ups(&store, "t").await.len(), 1);
        // A follow-up sent to the now idle thread goes to its last agent.
        let again = store.send("t", follow("more"), 10).await.unwrap();
        assert_eq!(again.follow_ups.len(), 1);
        let d = store.load(&again.follow_ups[0]).await.unwrap().unwrap();
        assert_eq!(d.agent, "a");
        assert_eq!(d.metadata.get("messages").map(String::as_str), Some("2-2"));
        NatsStore::delete_stream(&config(&prefix)).await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_host_answers_messages_with_follow_ups() {
        follow_up_at_send_and_settle(true).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_answers_messages_with_follow_ups() {
        follow_up_at_send_and_settle(false).await;
    }

    /// Purged messages leave the stream; `latest` stays; pending ones are never purged.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn purged_messages_leave_and_latest_stays() {
        let prefix = "inbox_purge";
        let store = open(prefix, true).await;
        for text in ["a", "b", "c"] {
            store.send("t", steer(text), 10).await.unwrap();
        }
        assert_eq!(store.discard_messages("t", 2).await.unwrap(), 2);
        assert_eq!(store.purge_messages(u64::MAX).await.unwrap(), 2);
        assert!(store.message("t", 1).await.unwrap().is_none());
        assert!(store.message("t", 3).await.unwrap().is_some());
        assert_eq!(store.inbox("t").await.unwrap().latest, 3);
        assert_eq!(store.discard_messages("t", 3).await.unwrap(), 1);
        assert_eq!(store.purge_messages(u64::MAX).await.unwrap(), 1);
        let client = open(prefix, false).await;
        assert_eq!(client.inbox("t").await.unwrap().latest, 3);
        assert_eq!(
            client.send("t", steer("d"), 10).await.unwrap().message.seq,
            4
        );
        drop(store);
        let restarted = open(prefix, true).await;
        assert_eq!(restarted.inbox("t").await.unwrap().latest, 4);
        NatsStore::delete_stream(&config(prefix)).await.unwrap();
    }

    /// A watch opened before a send from another instance fires, on a host and on a client.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn watches_fire_on_another_instances_send() {
        let prefix = "inbox_watch";
        let host = open(prefix, true).await;
        let client = open(prefix, false).await;
        let sender = open(prefix, false).await;
        let mut on_host = host.watch("t");
        let mut on_client = client.watch("t");
        sender.send("t", steer("x"), 10).await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), on_host.changed())
            .await
            .expect("the host's watch fires");
        tokio::time::timeout(Duration::from_secs(10), on_client.changed())
            .await
            .expect("the client's watch fires");
        NatsStore::delete_stream(&config(prefix)).await.unwrap();
    }
}

/// Waitpoints and the `waiting` status on NATS (store/nats/waitpoints.rs), across hosts and
/// clients, with the archive and a restart.
mod nats_waitpoints {
    use super::*;
    use homing::store::nats::keys::Key;
    use homing::store::waitpoints::{BY_DISPATCH_ENDED, BY_INTERRUPT, BY_TIMEOUT, token_digest};
    use homing::store::{
        Dispatch, Fence, Inbox, ListFilter, Mailbox, NewDispatch, NewWaitpoint, RunResult,
        Settlement, Status, SystemClock, Waitpoint, WaitpointFilter, WaitpointState, Waitpoints,
    };
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    fn config(prefix: &str) -> NatsConfig {
        NatsConfig {
            urls: vec![server().url()],
            prefix: prefix.into(),
            request_timeout: REQUEST_TIMEOUT,
            settled_ttl: Some(Duration::from_secs(3600)),
            archive_after: Duration::ZERO,
            ..NatsConfig::default()
        }
    }

    async fn host(prefix: &str) -> NatsStore {
        NatsStore::connect(&config(prefix), Arc::new(SystemClock))
            .await
            .unwrap()
    }

    async fn client(prefix: &str) -> NatsStore {
        NatsStore::connect_client(&config(prefix), Arc::new(SystemClock))
            .await
            .unwrap()
    }

    /// The time the stores read (a system clock).
    fn now() -> u64 {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        u64::try_from(since.as_millis()).unwrap()
    }

    fn new_wp(name: &str, timeout_ms: u64) -> NewWaitpoint {
        NewWaitpoint {
            name: name.into(),
            timeout_ms,
            metadata: BTreeMap::from([("why".to_owned(), name.to_owned())]),
            token_digest: token_digest(&format!("hwp_{name}")),
        }
    }

    /// Enqueues `id` of agent `a` on `thread` and claims it by id, recording its start.
    async fn claimed(store: &NatsStore, thread: &str, id: &str) -> Dispatch {
        store
            .enqueue(NewDispatch::new("a", thread, id).with_id(id))
            .await
            .unwrap();
        let d = store
            .claim_dispatch(id, "w", 60_000)
            .await
            .unwrap()
            .unwrap();
        store.record_start(id, d.token().unwrap()).await.unwrap()
    }

    async fn create(store: &NatsStore, d: &Dispatch, name: &str, timeout_ms: u64) -> Waitpoint {
        let fence = Fence::of(d).unwrap();
        store
            .create_waitpoint(&fence, new_wp(name, timeout_ms))
            .await
            .unwrap()
            .waitpoint
    }

    async fn suspend(store: &NatsStore, d: &Dispatch) -> Dispatch {
        store.suspend(&d.id, d.token().unwrap(), 100).await.unwrap()
    }

    /// The sequence of the last message of any subject matching `filter`, if any.
    async fn last_seq(prefix: &str, filter: &str) -> Option<u64> {
        let client = async_nats::connect(server().url()).await.unwrap();
        let body = serde_json::json!({ "last_by_subj": filter }).to_string();
        let reply = client
            .request(format!("$JS.API.DIRECT.GET.{prefix}"), body.into())
            .await
            .unwrap();
        if reply.status.is_some_and(|s| s.as_u16() == 404) {
            return None;
        }
        let seq = reply.headers.as_ref().and_then(|h| h.get("Nats-Sequence"));
        Some(seq.unwrap().as_str().parse().unwrap())
    }

    /// A waiting dispatch keeps its thread from every other host and client until one of its
    /// waitpoints is completed; completions racing on two hosts and a client have one winner;
    /// a client completes what a host created, and the host's watch of the thread fires.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_waiting_thread_is_held_everywhere_and_one_completion_wins() {
        let prefix = "wp_race";
        let (a, b, c) = (host(prefix).await, host(prefix).await, client(prefix).await);
        let d = claimed(&a, "t", "d1").await;
        let w = create(&a, &d, "approve", 600_000).await;
        assert_eq!(suspend(&a, &d).await.status, Status::Waiting);
        b.enqueue(NewDispatch::new("a", "t", "s").with_id("sibling"))
            .await
            .unwrap();
        for store in [&a, &b, &c] {
            assert!(store.claim("a", "w2", 60_000).await.unwrap().is_none());
            for id in ["d1", "sibling"] {
                assert!(
                    store
                        .claim_dispatch(id, "w2", 60_000)
                        .await
                        .unwrap()
                        .is_none()
                );
            }
            assert!(store.has_live_work().await.unwrap());
        }
        let counts = c.live_counts().await.unwrap();
        assert!(
            counts
                .iter()
                .any(|r| r.status == Status::Waiting && r.count == 1),
            "{counts:?}"
        );

        let race = |store: NatsStore, result: &'static str| {
            let id = w.id.clone();
            async move {
                store
                    .complete_waitpoint(&id, result.as_bytes().to_vec(), "token")
                    .await
                    .unwrap()
            }
        };
        let answers = tokio::join!(
            race(a.clone(), "from a"),
            race(b.clone(), "from b"),
            race(c.clone(), "from c"),
        );
        let answers = [answers.0, answers.1, answers.2];
        let winners: Vec<&Waitpoint> = answers
            .iter()
            .filter_map(|s| match s {
                Settlement::Settled(w) => Some(w),
                Settlement::Already(_) => None,
            })
            .collect();
        assert_eq!(winners.len(), 1, "{answers:?}");
        for s in &answers {
            assert_eq!(s.waitpoint().result, winners[0].result);
            assert_eq!(s.waitpoint().state, WaitpointState::Completed);
        }
        let resumed = b.load("d1").await.unwrap().unwrap();
        assert_eq!((resumed.status, resumed.resumes), (Status::Queued, 1));
        // The resumed dispatch runs before its younger sibling, on any host.
        let again = b.claim("a", "w2", 60_000).await.unwrap().unwrap();
        assert_eq!((again.id.as_str(), again.claims), ("d1", 2));
        b.complete("d1", again.token().unwrap(), RunResult::success("ok"))
            .await
            .unwrap();
        assert_eq!(
            a.claim("a", "w3", 60_000).await.unwrap().unwrap().id,
            "sibling"
        );

        // A client completes a waitpoint a host created; the host's watch fires.
        let d2 = claimed(&a, "u", "d2").await;
        let w2 = create(&a, &d2, "approve", 600_000).await;
        suspend(&a, &d2).await;
        let mut watch = a.watch("u");
        match c.complete_waitpoint(&w2.id, vec![0xff, 0], "token").await {
            Ok(Settlement::Settled(done)) => assert_eq!(done.result, Some(vec![0xff, 0])),
            other => panic!("expected Settled, got {other:?}"),
        }
        tokio::time::timeout(Duration::from_secs(30), watch.changed())
            .await
            .expect("the host's watch fires");
        assert_eq!(a.load("d2").await.unwrap().unwrap().status, Status::Queued);
        assert_eq!(
            a.waitpoint(&w2.id).await.unwrap().unwrap().result,
            Some(vec![0xff, 0])
        );
        for store in [&a, &b, &c] {
            store.close().await;
        }
        NatsStore::delete_stream(&config(prefix)).await.unwrap();
    }

    /// Two hosts and a client sweeping at once time every due waitpoint out exactly once,
    /// whatever its dispatch (waiting, claimed, queued again after a nack); each waiting one
    /// resumes once; waitpoints not due stay pending.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn sweeping_hosts_time_each_waitpoint_out_once() {
        let prefix = "wp_sweep";
        let (a, b, c) = (host(prefix).await, host(prefix).await, client(prefix).await);
        let mut due = Vec::new();
        let mut later = Vec::new();
        for i in 0..8 {
            let d = claimed(&a, &format!("t{i}"), &format!("d{i}")).await;
            for j in 0..3 {
                due.push(create(&a, &d, &format!("w{j}"), 1).await.id);
            }
            later.push(create(&a, &d, "later", 600_000).await.id);
            match i % 3 {
                0 => {
                    suspend(&a, &d).await;
                }
                1 => {
                    a.nack(&d.id, d.token().unwrap(), now() + 600_000, "again")
                        .await
                        .unwrap();
                }
                _ => {}
            }
        }
        let at = now() + 60_000;
        let (x, y, z) = tokio::join!(
            a.time_out_waitpoints(at, 1000),
            b.time_out_waitpoints(at, 1000),
            c.time_out_waitpoints(at, 1000),
        );
        let mut timed_out: Vec<String> = [x.unwrap(), y.unwrap(), z.unwrap()]
            .into_iter()
            .flatten()
            .map(|w| {
                assert_eq!(
                    (w.state, w.settled_by.as_deref(), w.settled_at),
                    (WaitpointState::TimedOut, Some(BY_TIMEOUT), Some(at))
                );
                w.id
            })
            .collect();
        timed_out.sort();
        due.sort();
        assert_eq!(timed_out, due, "each due waitpoint timed out once");
        for store in [&a, &b, &c] {
            assert!(
                store
                    .time_out_waitpoints(at, 1000)
                    .await
                    .unwrap()
                    .is_empty()
            );
            for id in &later {
                assert!(store.waitpoint(id).await.unwrap().unwrap().is_pending());
            }
        }
        for i in 0..8 {
            let d = c.load(&format!("d{i}")).await.unwrap().unwrap();
            let want = match i % 3 {
                0 => (Status::Queued, 1),
                1 => (Status::Queued, 0),
                _ => (Status::Claimed, 0),
            };
            assert_eq!((d.status, d.resumes), want, "d{i}");
        }
        for store in [&a, &b, &c] {
            store.close().await;
        }
        NatsStore::delete_stream(&config(prefix)).await.unwrap();
    }

    /// A client's interrupt of a thread whose dispatch waits supersedes it and the queued
    /// ones, cancels their pending waitpoints (one left by an earlier run of a queued
    /// dispatch too) and frees the thread; the hosts' views let the waitpoints go.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_clients_interrupt_of_a_waiting_thread_frees_it() {
        let prefix = "wp_interrupt";
        let (a, b, c) = (host(prefix).await, host(prefix).await, client(prefix).await);
        let q1 = claimed(&a, "t", "q1").await;
        let left = create(&a, &q1, "left", 600_000).await;
        a.nack("q1", q1.token().unwrap(), now(), "again")
            .await
            .unwrap();
        a.enqueue(NewDispatch::new("a", "t", "q2").with_id("q2"))
            .await
            .unwrap();
        let d1 = claimed(&a, "t", "d1").await;
        let w1 = create(&a, &d1, "one", 600_000).await;
        let w2 = create(&a, &d1, "two", 600_000).await;
        suspend(&a, &d1).await;
        b.load("d1").await.unwrap();
        assert_eq!(b.view_waitpoints(), 3);

        let out = c.interrupt("t", "stop").await.unwrap();
        assert_eq!(out.superseded, ["d1", "q1", "q2"]);
        assert!(out.active.is_none());
        for store in [&a, &b, &c] {
            for w in [&left, &w1, &w2] {
                let w = store.waitpoint(&w.id).await.unwrap().unwrap();
                assert_eq!(
                    (w.state, w.settled_by.as_deref()),
                    (WaitpointState::Cancelled, Some(BY_INTERRUPT))
                );
            }
            assert_eq!(
                store.load("d1").await.unwrap().unwrap().status,
                Status::Superseded
            );
        }
        assert_eq!((a.view_waitpoints(), b.view_waitpoints()), (0, 0));
        a.enqueue(NewDispatch::new("a", "t", "n").with_id("newer"))
            .await
            .unwrap();
        assert_eq!(
            b.claim("a", "w", 60_000).await.unwrap().unwrap().id,
            "newer"
        );
        // A cancel of a waiting dispatch frees its thread too.
        let d3 = claimed(&b, "u", "d3").await;
        let w3 = create(&b, &d3, "x", 600_000).await;
        suspend(&b, &d3).await;
        assert!(c.cancel("d3").await.unwrap().is_some());
        let w3 = a.waitpoint(&w3.id).await.unwrap().unwrap();
        assert_eq!(w3.settled_by.as_deref(), Some(BY_DISPATCH_ENDED));
        b.enqueue(NewDispatch::new("a", "u", "n").with_id("after"))
            .await
            .unwrap();
        assert_eq!(
            a.claim("a", "w", 60_000).await.unwrap().unwrap().id,
            "after"
        );
        for store in [&a, &b, &c] {
            store.close().await;
        }
        NatsStore::delete_stream(&config(prefix)).await.unwrap();
    }

    /// Sweeps until `n` records were archived in all.
    async fn archive_all(store: &NatsStore, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut archived = 0;
        while archived < n {
            assert!(Instant::now() < deadline, "archived {archived} of {n}");
            archived += store.archive_settled(now()).await.unwrap();
        }
    }

    /// What a reader sees of the waitpoints of `d1`.
    async fn seen(store: &NatsStore, ids: &[String]) -> Vec<String> {
        let mut out = Vec::new();
        for id in ids {
            out.push(format!("{:?}", store.waitpoint(id).await.unwrap()));
        }
        out.push(format!("{:?}", store.waitpoints_of("d1").await.unwrap()));
        for filter in [
            WaitpointFilter::default(),
            WaitpointFilter {
                thread: Some("t".into()),
                ..WaitpointFilter::default()
            },
            WaitpointFilter {
                state: Some(WaitpointState::Completed),
                ..WaitpointFilter::default()
            },
        ] {
            out.push(format!(
                "{:?}",
                store.list_waitpoints(&filter).await.unwrap()
            ));
        }
        out
    }

    /// The waitpoints of an archived dispatch leave its tree with it and read as before, by
    /// id, by dispatch and in lists, on a host, a client and a restarted host; a late
    /// completion is `Already`; a purge removes them with the dispatch, archived or not.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn archived_waitpoints_read_as_they_did_in_their_tree() {
        let prefix = "wp_archive";
        let (a, c) = (host(prefix).await, client(prefix).await);
        let d = claimed(&a, "t", "d1").await;
        let done = create(&a, &d, "done", 600_000).await;
        let open = create(&a, &d, "open", 600_000).await;
        let binary: Vec<u8> = (0..=255u8).collect();
        c.complete_waitpoint(&done.id, binary.clone(), "token")
            .await
            .unwrap();
        a.complete("d1", d.token().unwrap(), RunResult::success("ok"))
            .await
            .unwrap();
        let ids = vec![done.id.clone(), open.id.clone()];
        let before = seen(&a, &ids).await;
        assert_eq!(seen(&c, &ids).await, before);
        let open_now = a.waitpoint(&open.id).await.unwrap().unwrap();
        assert_eq!(open_now.settled_by.as_deref(), Some(BY_DISPATCH_ENDED));
        assert_eq!(
            a.view_waitpoints(),
            0,
            "an ended dispatch's waitpoints leave the view"
        );

        archive_all(&a, 1).await;
        for w in [&done, &open] {
            let tree = Key::Waitpoint("t".into(), w.id.clone()).subject(prefix);
            let archived = Key::ArchivedWaitpoint("t".into(), w.id.clone()).subject(prefix);
            assert_eq!(last_seq(prefix, &tree).await, None, "left its tree");
            assert!(last_seq(prefix, &archived).await.is_some(), "archived");
        }
        assert_eq!(seen(&a, &ids).await, before);
        assert_eq!(seen(&c, &ids).await, before);
        let restarted = host(prefix).await;
        assert_eq!(seen(&restarted, &ids).await, before);
        match c
            .complete_waitpoint(&done.id, b"late".to_vec(), "token")
            .await
        {
            Ok(Settlement::Already(w)) => assert_eq!(w.result, Some(binary)),
            other => panic!("expected Already, got {other:?}"),
        }
        assert!(matches!(
            restarted.cancel_waitpoint(&open.id, "cli").await,
            Ok(Settlement::Already(_))
        ));

        // A second dispatch purged from its tree, and the archived one, take theirs along.
        let d2 = claimed(&a, "t", "d2").await;
        let w = create(&a, &d2, "x", 600_000).await;
        a.dead_letter("d2", d2.token().unwrap(), "no")
            .await
            .unwrap();
        assert_eq!(a.purge_terminal(u64::MAX).await.unwrap(), 2);
        for store in [&a, &c, &restarted] {
            for id in [&done.id, &open.id, &w.id] {
                assert_eq!(store.waitpoint(id).await.unwrap(), None);
            }
            assert!(store.waitpoints_of("d2").await.unwrap().is_empty());
            assert!(
                store
                    .list_waitpoints(&WaitpointFilter::default())
                    .await
                    .unwrap()
                    .is_empty()
            );
        }
        for store in [&a, &c, &restarted] {
            store.close().await;
        }
        NatsStore::delete_stream(&config(prefix)).await.unwrap();
    }

    /// A host started on a stream whose trees hold waitpoints of ended dispatches (not yet
    /// archived) and of a waiting one keeps only the latter: the waiting dispatch holds its
    /// thread there too, and its sweep times the waitpoint out and resumes it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_starting_host_keeps_the_waitpoints_of_live_work_only() {
        let prefix = "wp_start";
        let a = host(prefix).await;
        for i in 0..5 {
            let d = claimed(&a, &format!("t{i}"), &format!("d{i}")).await;
            let w = create(&a, &d, "x", 600_000).await;
            if i % 2 == 0 {
                a.complete_waitpoint(&w.id, b"ok".to_vec(), "token")
                    .await
                    .unwrap();
            }
            a.complete(&d.id, d.token().unwrap(), RunResult::success("ok"))
                .await
                .unwrap();
        }
        let d = claimed(&a, "live", "waiting").await;
        let w = create(&a, &d, "x", 1).await;
        suspend(&a, &d).await;
        a.enqueue(NewDispatch::new("a", "live", "s").with_id("sibling"))
            .await
            .unwrap();
        assert_eq!(a.view_waitpoints(), 1);
        a.close().await;

        let b = host(prefix).await;
        assert_eq!((b.view_waitpoints(), b.view_records()), (1, 2));
        assert!(b.claim("a", "w", 60_000).await.unwrap().is_none());
        // Its timeout (1 ms) passed while the host started.
        let out = b.time_out_waitpoints(now(), 10).await.unwrap();
        assert_eq!(out.iter().map(|x| x.id.clone()).collect::<Vec<_>>(), [w.id]);
        let resumed = b.claim("a", "w", 60_000).await.unwrap().unwrap();
        assert_eq!((resumed.id.as_str(), resumed.resumes), ("waiting", 1));
        // Its run finds the timed-out waitpoint by name.
        let again = b
            .create_waitpoint(&Fence::of(&resumed).unwrap(), new_wp("x", 600_000))
            .await
            .unwrap();
        assert!(!again.created && again.waitpoint.state == WaitpointState::TimedOut);
        let listed = b
            .list(&ListFilter {
                statuses: vec![Status::Waiting],
                ..ListFilter::default()
            })
            .await
            .unwrap();
        assert!(listed.is_empty());
        b.close().await;
        NatsStore::delete_stream(&config(prefix)).await.unwrap();
    }
}

/// The journal's layout on NATS (`store::nats::journal`): its writes are fenced by the thread's
/// tree without moving it, and the journals of dispatches that expired or were archived and
/// then expired are swept.
mod nats_journal {
    use super::*;
    use homing::store::journal::identity;
    use homing::store::nats::keys::Key;
    use homing::store::{
        CallEntry, CallKind, Dispatch, Fence, Journal, JournalData, Mailbox, NewDispatch,
        SequenceStore, SystemClock,
    };
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    fn config(prefix: &str, ttl: Duration) -> NatsConfig {
        NatsConfig {
            urls: vec![server().url()],
            prefix: prefix.into(),
            request_timeout: REQUEST_TIMEOUT,
            settled_ttl: Some(ttl),
            archive_after: Duration::ZERO,
            ..NatsConfig::default()
        }
    }

    async fn claimed(store: &NatsStore, thread: &str, id: &str) -> Dispatch {
        store
            .enqueue(NewDispatch::new("a", thread, id).with_id(id))
            .await
            .unwrap();
        store
            .claim_dispatch(id, "w", 600_000)
            .await
            .unwrap()
            .unwrap()
    }

    fn entry(d: &Dispatch, pos: u32) -> CallEntry {
        CallEntry::new(
            &d.id,
            pos,
            CallKind::Http,
            identity([&b"call"[..]]),
            serde_json::json!({ "status": 200 }),
            Some(b"body".to_vec()),
            d.claims,
            d.attempt,
            1,
        )
    }

    /// The sequence of the last message of any subject matching `filter`, if any.
    async fn last_seq(client: &async_nats::Client, prefix: &str, filter: &str) -> Option<u64> {
        let body = serde_json::json!({ "last_by_subj": filter }).to_string();
        let reply = client
            .request(format!("$JS.API.DIRECT.GET.{prefix}"), body.into())
            .await
            .unwrap();
        if reply.status.is_some_and(|s| s.as_u16() == 404) {
            return None;
        }
        let seq = reply.headers.as_ref().and_then(|h| h.get("Nats-Sequence"));
        Some(seq.unwrap().as_str().parse().unwrap())
    }

    /// Publishes an empty journal record expecting the tree of `thread` to end at `seq`;
    /// the server's reply.
    async fn publish_expecting(
        client: &async_nats::Client,
        prefix: &str,
        subject: String,
        thread: &str,
        seq: u64,
    ) -> serde_json::Value {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Expected-Last-Subject-Sequence", seq.to_string());
        headers.insert(
            "Nats-Expected-Last-Subject-Sequence-Subject",
            Key::tree(prefix, thread),
        );
        let reply = client
            .request_with_headers(subject, headers, bytes::Bytes::new())
            .await
            .unwrap();
        serde_json::from_slice(&reply.payload).unwrap()
    }

    /// A journal write leaves the tree's last sequence where it was (so it disturbs none of
    /// the thread's writers); one carrying the tree's expectation is stored while the tree
    /// is unchanged and refused once it moved.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_journal_write_is_fenced_by_the_tree_without_moving_it() {
        let prefix = "jn_fence";
        let cfg = config(prefix, Duration::from_secs(3600));
        let store = NatsStore::connect(&cfg, Arc::new(SystemClock))
            .await
            .unwrap();
        let client = async_nats::connect(server().url()).await.unwrap();
        let d = claimed(&store, "t", "d1").await;
        let fence = Fence::of(&d).unwrap();
        let tree = Key::tree(prefix, "t");
        let before = last_seq(&client, prefix, &tree).await.unwrap();
        store.record(&fence, entry(&d, 0)).await.unwrap();
        store
            .put_step(
                &fence,
                homing::store::NewStep {
                    key: "k".into(),
                    value: b"v".to_vec(),
                    claim: d.claims,
                    attempt: d.attempt,
                },
            )
            .await
            .unwrap();
        store.drop_calls(&fence, 5).await.unwrap();
        assert_eq!(last_seq(&client, prefix, &tree).await, Some(before));
        let journal = last_seq(&client, prefix, &format!("{prefix}.jn.>"))
            .await
            .unwrap();
        assert!(journal > before, "{journal} > {before}");
        assert!(
            last_seq(&client, prefix, &format!("{prefix}.jx.*"))
                .await
                .is_some()
        );

        // The fence the store's writes carry: stored while the tree is as expected...
        let subject = Key::JournalCall("d1".into(), 9).subject(prefix);
        let ok = publish_expecting(&client, prefix, subject.clone(), "t", before).await;
        assert!(ok.get("error").is_none(), "{ok}");
        assert_eq!(last_seq(&client, prefix, &tree).await, Some(before));
        // ...refused once the tree moved.
        store
            .append("t", b"moves the tree", Some(&fence))
            .await
            .unwrap();
        let moved = last_seq(&client, prefix, &tree).await.unwrap();
        assert!(moved > before);
        let refused = publish_expecting(&client, prefix, subject, "t", before).await;
        assert!(refused.get("error").is_some(), "{refused}");
        // An empty record is a dropped entry: the journal reads as the store wrote it.
        let j = store.load_journal("d1").await.unwrap();
        assert_eq!(j.calls.iter().map(|c| c.pos).collect::<Vec<_>>(), [0]);
        assert_eq!(j.steps.len(), 1);
        store.close().await;
        NatsStore::delete_stream(&cfg).await.unwrap();
    }

    /// Settled records expire by their TTL, in their tree or archived: a sweep keeps the
    /// journals of dispatches still stored (live, settled, archived) and removes those of the
    /// dispatches that expired, marks included.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn journals_of_expired_dispatches_are_swept() {
        let prefix = "jn_sweep";
        let cfg = config(prefix, Duration::from_secs(1));
        let store = NatsStore::connect(&cfg, Arc::new(SystemClock))
            .await
            .unwrap();
        let client = async_nats::connect(server().url()).await.unwrap();
        let mut settled = Vec::new();
        for (thread, id) in [("t1", "in-tree"), ("t2", "archived")] {
            let d = claimed(&store, thread, id).await;
            store
                .record(&Fence::of(&d).unwrap(), entry(&d, 0))
                .await
                .unwrap();
            store.ack(id, d.token().unwrap()).await.unwrap();
            settled.push(id);
        }
        let live = claimed(&store, "t3", "live").await;
        store
            .record(&Fence::of(&live).unwrap(), entry(&live, 0))
            .await
            .unwrap();
        // Archive the settled records (at least `archived`; `in-tree` may stay in its tree).
        let deadline = Instant::now() + Duration::from_secs(30);
        while store.load("archived").await.unwrap().is_some()
            && last_seq(
                &client,
                prefix,
                &Key::Archive("t2".into(), "archived".into()).subject(prefix),
            )
            .await
            .is_none()
        {
            assert!(Instant::now() < deadline, "nothing archived");
            store
                .archive_settled(homing::store::Clock::now_ms(&SystemClock))
                .await
                .unwrap();
        }
        // Nothing is removed while the dispatches are stored.
        assert_eq!(store.sweep_journals(true).await.unwrap(), 0);
        for id in ["in-tree", "archived", "live"] {
            assert_eq!(store.load_journal(id).await.unwrap().calls.len(), 1, "{id}");
        }
        // Once both settled records expired, a sweep removes their journals and marks.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut stored = 0;
            for id in &settled {
                if store.load(id).await.unwrap().is_some() {
                    stored += 1;
                }
            }
            if stored == 0 {
                break;
            }
            assert!(Instant::now() < deadline, "{stored} records did not expire");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let mut removed = 0;
        let deadline = Instant::now() + Duration::from_secs(30);
        while removed < 2 {
            assert!(Instant::now() < deadline, "removed {removed} of 2");
            removed += store.sweep_journals(false).await.unwrap();
        }
        for id in settled {
            assert_eq!(
                store.load_journal(id).await.unwrap(),
                JournalData::default()
            );
            let mark = Key::JournalMark(id.into()).subject(prefix);
            assert_eq!(last_seq(&client, prefix, &mark).await, None, "{id}");
        }
        assert_eq!(store.load_journal("live").await.unwrap().calls.len(), 1);
        store.close().await;
        NatsStore::delete_stream(&cfg).await.unwrap();
    }
}

/// Deltas on NATS beyond the shared suite: the live bus between instances, and delta batches
/// in the stream left alone by everything else that reads it.
mod nats_deltas {
    use super::*;
    use bytes::Bytes;
    use futures_util::StreamExt;
    use homing::store::nats::keys::Key;
    use homing::store::{
        Cursor, DeltaBatch, Deltas, ListFilter, Mailbox, NewDispatch, SystemClock,
    };
    use std::sync::Arc;
    use std::time::Duration;

    fn config(prefix: &str) -> NatsConfig {
        NatsConfig {
            urls: vec![server().url()],
            prefix: prefix.into(),
            request_timeout: REQUEST_TIMEOUT,
            ..NatsConfig::default()
        }
    }

    fn batch(dispatch: &str, claim: u32, first: u64, chunks: &[&[u8]]) -> DeltaBatch {
        DeltaBatch {
            dispatch: dispatch.into(),
            claim,
            first,
            chunks: chunks.iter().map(|c| Bytes::copy_from_slice(c)).collect(),
            expires_at: 0,
        }
    }

    /// Batches published through one instance reach a subscriber on another in the order
    /// published, only those of the dispatch subscribed to; a message that is not a batch is
    /// skipped.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn live_batches_published_on_one_instance_reach_another_in_order() {
        let prefix = "live_bus";
        let a = NatsStore::connect(&config(prefix), Arc::new(SystemClock))
            .await
            .unwrap();
        let b = NatsStore::connect_client(&config(prefix), Arc::new(SystemClock))
            .await
            .unwrap();
        let mut live = a.live_bus().unwrap().subscribe("d.1").await.unwrap();
        let raw = async_nats::connect(server().url()).await.unwrap();
        raw.publish(Key::live(prefix, "d.1"), Bytes::from_static(b"junk"))
            .await
            .unwrap();
        raw.flush().await.unwrap();
        let bus = b.live_bus().unwrap();
        let sent = [
            batch("d.1", 1, 1, &[b"a", b"b"]),
            batch("d.1", 1, 3, &[b""]),
            batch("d.1", 2, 1, &[&[0, 255, 7]]),
        ];
        bus.publish(&batch("d.2", 1, 1, &[b"other"]));
        for one in &sent {
            bus.publish(one);
        }
        for want in &sent {
            let got = tokio::time::timeout(Duration::from_secs(10), live.next())
                .await
                .expect("a live batch within 10 s")
                .expect("the subscription stays open");
            assert_eq!(&got, want);
        }
        // Nothing else arrives (the other dispatch's batch, the junk).
        let more = tokio::time::timeout(Duration::from_millis(300), live.next()).await;
        assert!(more.is_err(), "{more:?}");
        a.close().await;
        NatsStore::delete_stream(&config(prefix)).await.unwrap();
    }

    /// Delta batches live in the stream beside the records: a host loading and following
    /// the stream, a client's lists, the archiver, the purge and the journal sweep all go on
    /// as if they were not there, and leave them readable.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn delta_batches_are_left_alone_by_views_lists_and_sweeps() {
        let prefix = "deltas_apart";
        let cfg = NatsConfig {
            archive_after: Duration::ZERO,
            ..config(prefix)
        };
        let clock = Arc::new(SystemClock);
        let first = NatsStore::connect(&cfg, clock.clone()).await.unwrap();
        let d = first
            .enqueue(NewDispatch::new("a", "t", "x").with_id("d1"))
            .await
            .unwrap();
        let mut b = batch(&d.id, 1, 1, &[b"x", b"y"]);
        b.expires_at = clock_now() + 3_600_000;
        first.persist(b).await.unwrap();
        // A host started after the batch loads the stream with it in.
        let host = NatsStore::connect(&cfg, clock.clone()).await.unwrap();
        let client = NatsStore::connect_client(&cfg, clock.clone())
            .await
            .unwrap();
        let claimed = host.claim("a", "w", 60_000).await.unwrap().unwrap();
        assert_eq!(claimed.id, "d1");
        let mut b = batch("d1", claimed.claims, 3, &[b"z"]);
        b.expires_at = clock_now() + 3_600_000;
        host.persist(b).await.unwrap();
        host.ack("d1", claimed.token().unwrap()).await.unwrap();
        for store in [&host, &client] {
            let all = store
                .list(&ListFilter {
                    limit: 100,
                    ..ListFilter::default()
                })
                .await
                .unwrap();
            assert_eq!(all.len(), 1);
            assert!(!store.has_live_work().await.unwrap());
            assert!(store.queued_threads().await.unwrap().is_empty());
        }
        host.archive_settled(clock_now() + 1).await.unwrap();
        host.sweep_journals(true).await.unwrap();
        host.purge_terminal(0).await.unwrap();
        assert_eq!(host.view_records(), 0);
        let all = [b"x", b"y", b"z"].map(|c| Bytes::from_static(c)).to_vec();
        for store in [&first, &host, &client] {
            let r = store.read_deltas("d1", Cursor::default()).await.unwrap();
            assert_eq!((r.claim, r.first, &r.chunks), (claimed.claims, 1, &all));
        }
        for store in [first, host, client] {
            store.close().await;
        }
        NatsStore::delete_stream(&cfg).await.unwrap();
    }

    fn clock_now() -> u64 {
        homing::store::Clock::now_ms(&SystemClock)
    }
}

/// The NATS backend's claim after a completion, beyond the shared suite.
mod claim_after_completion {
    use std::time::{Duration, Instant};

    use futures_util::TryStreamExt;
    use homing::store::{LimitSet, ManualClock, RunResult, Status};

    use super::*;
    use crate::conformance::{Factory, T0, claim_some, next_claim, put_on, tok};

    /// Pauses consumer `name` of `stream` at the server (its deliveries stop), or resumes it.
    async fn pause(client: &async_nats::Client, stream: &str, name: &str, paused: bool) {
        let body = if paused {
            r#"{"pause_until":"2099-01-01T00:00:00Z"}"#
        } else {
            "{}"
        };
        let reply = client
            .request(
                format!("$JS.API.CONSUMER.PAUSE.{stream}.{name}"),
                body.into(),
            )
            .await
            .expect("the pause request");
        let text = String::from_utf8_lossy(&reply.payload);
        assert!(
            !text.contains("\"error\""),
            "pause {name} ({paused}): {text}"
        );
    }

    /// A worker's claim after its completion decides on a view that holds everything stored
    /// before the call. With the worker's watcher paused at the server, a dispatch another host
    /// enqueued just before the completion is not in the worker's view: the claim waits for the
    /// watcher (until it is resumed) instead of deciding at once and finding nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_claim_after_a_completion_waits_until_the_view_holds_what_came_before() {
        let stream = NatsFactory.create().await;
        let clock: SharedClock = ManualClock::new(T0);
        let worker = NatsFactory
            .open(&stream, clock.clone())
            .await
            .expect("open the worker's instance");
        let client = async_nats::connect(server().url()).await.expect("connect");
        let js = async_nats::jetstream::new(client.clone());
        // The worker's watcher is the only consumer before the other host opens.
        let watchers: Vec<String> = js
            .get_stream(&stream.0)
            .await
            .expect("the stream")
            .consumer_names()
            .try_collect()
            .await
            .expect("the consumer names");
        assert_eq!(watchers.len(), 1, "{watchers:?}");
        let other = NatsFactory
            .open(&stream, clock)
            .await
            .expect("open the other instance");

        put_on(&other, "t0", "d0").await;
        let held = claim_some(&worker).await;
        for name in &watchers {
            pause(&client, &stream.0, name, true).await;
        }
        put_on(&other, "t1", "d1").await;
        let limits = LimitSet::default();
        let task = tokio::spawn({
            let worker = worker.clone();
            async move {
                let next = next_claim(&limits);
                let token = tok(&held);
                worker
                    .mailbox
                    .complete_and_claim(&held.id, &token, RunResult::success("ok"), &next)
                    .await
            }
        });
        // Once the completion is stored the claim has what it needs but its view.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let d0 = other.mailbox.load("d0").await.expect("load d0");
            if d0.is_some_and(|d| d.status == Status::Acked) {
                break;
            }
            assert!(Instant::now() < deadline, "the completion was never stored");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            !task.is_finished(),
            "the claim decided before the worker's view held d1: {:?}",
            task.await
        );
        for name in &watchers {
            pause(&client, &stream.0, name, false).await;
        }
        let (done, claimed) = task.await.expect("the claim's task");
        assert_eq!(done.expect("complete").status, Status::Acked);
        let claimed = claimed.expect("the claim").dispatch.expect("d1 claimed");
        assert_eq!(claimed.id, "d1");
    }
}

/// Slot blocks (docs/contract.md, section 13.2): a host takes a large key's slots in blocks and
/// writes the key's record once per block, not once per claim; a small key's claims each write
/// their own slot; a claim under a block is not extended past the block's lapse.
mod slot_blocks {
    use homing::store::limits::key_scope_name;
    use homing::store::{Dispatch, LimitSet};

    use crate::conformance::{AGENT, Env, LEASE, nd, next_claim, put, tok};

    use super::*;

    /// The slots `store` sees held in `key`'s scope.
    async fn held(store: &Store, key: &str) -> u32 {
        store
            .limits
            .usage(&key_scope_name(AGENT, key), None)
            .await
            .expect("usage")
            .running
    }

    /// At most `cap` running per key.
    fn per_key(cap: u32) -> LimitSet {
        LimitSet {
            key_concurrency: Some(cap),
            ..LimitSet::default()
        }
    }

    /// Enqueues `n` dispatches with key `key`, each on a thread of its own.
    async fn enqueue(store: &Store, key: &str, n: usize) {
        for i in 0..n {
            let id = format!("{key}{i}");
            put(store, nd(&id, &id).with_concurrency_key(key)).await;
        }
    }

    /// Claims once under `limits`, which must take something.
    async fn claim_one(store: &Store, limits: &LimitSet) -> Dispatch {
        let got = store
            .mailbox
            .claim_gated(&next_claim(limits))
            .await
            .expect("claim_gated");
        got.dispatch.expect("something claimed")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_large_keys_claims_write_its_record_once_per_block_and_a_small_keys_once_per_claim() {
        let env = Env::new(&NatsFactory).await;
        let (host, other) = (env.open().await, env.open().await);
        // After each of `n` claims of `key` under a cap of `cap` on the host: what the other
        // instance sees held.
        let seen = |key: &'static str, cap: u32, n: usize| {
            let (host, other) = (host.clone(), other.clone());
            async move {
                let mut seen = Vec::new();
                for _ in 0..n {
                    claim_one(&host, &per_key(cap)).await;
                    seen.push(held(&other, key).await);
                }
                seen
            }
        };
        // A cap of 64 gives blocks of 4 slots: the first claim takes one, the next three use
        // it, the fifth grows it to 5.
        enqueue(&host, "large", 5).await;
        assert_eq!(seen("large", 64, 5).await, [4, 4, 4, 4, 5]);
        // Below a cap of 16 every claim holds one slot of its own.
        enqueue(&host, "small", 3).await;
        assert_eq!(seen("small", 8, 3).await, [1, 2, 3]);
    }

    /// A claim's extension under a slot block ends before the block does, even when the write
    /// that extends it reads the clock long after the block was checked (a descheduled task, a
    /// retry): the bound is the block's lapse, not a length. Claim `a` writes a block lasting
    /// three of its 10 s leases; claim `b` (a 20 s lease) joins it; `b` asks for 20 s more
    /// and the clock jumps 12 s between the block's check and the write. Measured as a length
    /// from the later reading, the lease would run 2 s past the block, when the key's slots
    /// may be other claims'.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_extension_under_a_block_never_outruns_it_however_late_the_write_reads_the_clock() {
        let env = Env::new(&NatsFactory).await;
        let host = env.open().await;
        enqueue(&host, "k", 2).await;
        let limits = per_key(128);
        let claim = |lease_ms| {
            let (host, limits) = (host.clone(), limits.clone());
            async move {
                let req = homing::store::ClaimRequest {
                    lease_ms,
                    ..next_claim(&limits)
                };
                let got = host.mailbox.claim_gated(&req).await.expect("claim_gated");
                got.dispatch.expect("something claimed")
            }
        };
        let block_lapses = env.now() + 3 * 10_000;
        claim(10_000).await;
        let b = claim(20_000).await;
        assert_eq!(
            held(&host, "k").await,
            8,
            "both claims under one block of 8"
        );
        env.clock.advance_after_next_read(12_000);
        assert!(
            host.mailbox
                .extend_lease(&b.id, &tok(&b), 20_000)
                .await
                .expect("extend_lease"),
            "a live claim under a live block is extended"
        );
        let lease = host.mailbox.load(&b.id).await.expect("load").expect("b");
        let until = lease.claim.expect("claimed").lease_until;
        assert!(
            until < block_lapses,
            "the lease runs to {until}, past its block's lapse at {block_lapses}"
        );
    }

    /// Another instance of the host (a restarted one, a second one in the process) extending a
    /// claim taken under the first one's slot block keeps the lease within that block too: it
    /// holds no block of its own for the claim, and the key's record holds no slot of the
    /// claim's own, so the claim is under some block of the key.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn another_instance_extends_a_claim_under_a_block_only_as_far_as_the_block_holds() {
        let env = Env::new(&NatsFactory).await;
        let (host, other) = (env.open().await, env.open().await);
        enqueue(&host, "k", 1).await;
        let block_lapses = env.now() + 3 * LEASE;
        let d = claim_one(&host, &per_key(64)).await;
        let seen = other.mailbox.load(&d.id).await.expect("load");
        assert_eq!(seen.and_then(|d| d.claim).map(|c| c.token), Some(tok(&d)));
        assert_eq!(
            held(&other, "k").await,
            4,
            "the other instance sees the block"
        );
        assert!(
            other
                .mailbox
                .extend_lease(&d.id, &tok(&d), 5 * LEASE)
                .await
                .expect("extend_lease"),
            "a live claim is extended by any instance"
        );
        let lease = other.mailbox.load(&d.id).await.expect("load").expect("d");
        let until = lease.claim.expect("claimed").lease_until;
        assert!(
            until < block_lapses,
            "the lease runs to {until}, past its block's lapse at {block_lapses}"
        );
    }

    /// Once a claim's block has lapsed (three leases after it was written, never held longer),
    /// its slots may be another host's: the claim's holder can no longer extend its lease, though
    /// nobody has taken the claim over.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claim_under_a_lapsed_block_cannot_extend_its_lease() {
        let env = Env::new(&NatsFactory).await;
        let host = env.open().await;
        enqueue(&host, "k", 1).await;
        let d = claim_one(&host, &per_key(64)).await;
        env.advance(3 * LEASE + 1);
        assert!(
            !host
                .mailbox
                .extend_lease(&d.id, &tok(&d), LEASE)
                .await
                .expect("extend_lease"),
            "extended past its block"
        );
    }
}

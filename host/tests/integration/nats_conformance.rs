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

fn server() -> &'static NatsServer {
    static SERVER: OnceLock<NatsServer> = OnceLock::new();
    SERVER.get_or_init(NatsServer::start)
}

impl conformance::Factory for NatsFactory {
    type Data = String;

    async fn create(&self) -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        server();
        format!("conf{}", NEXT.fetch_add(1, Ordering::Relaxed))
    }

    async fn open(&self, prefix: &String, clock: SharedClock) -> StoreResult<Store> {
        let config = NatsConfig {
            urls: vec![server().url()],
            prefix: prefix.clone(),
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
        type Data = String;

        async fn create(&self) -> String {
            NatsFactory.create().await
        }

        async fn open(&self, prefix: &String, clock: SharedClock) -> StoreResult<Store> {
            let config = NatsConfig {
                urls: vec![server().url()],
                prefix: prefix.clone(),
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
        let meta = "m".repeat(80 * 1024);
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

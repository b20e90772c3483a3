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

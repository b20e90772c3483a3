//! The store conformance suite (`tests/conformance/`) run against the NATS JetStream backend:
//! one real `nats-server` per test process (started on a free port with JetStream in a temp
//! directory), one stream per test under its own prefix. Several instances opened on one
//! prefix stand for several hosts. `cargo test conformance` runs it with the embedded suite.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod conformance;
mod natsd;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use homing::store::nats::{NatsConfig, NatsStore};
use homing::store::{SharedClock, Store, StoreResult};

use natsd::NatsServer;

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

conformance::suite!(nats_conformance, NatsFactory);

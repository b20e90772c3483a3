//! `--only stream`: how fast what a claim streams reaches a client of the API.
//!
//! A claim on a fresh store emits deltas through a live hub; a client reads
//! `GET /v1/dispatches/{id}/stream` from an API server over loopback. On the embedded store the
//! API shares the emitting host's hub (a watcher in the same process); on NATS the API serves
//! from a second store instance with a hub of its own (another host), so each delta crosses the
//! live bus. Figures: emit-to-client latency p50 and p99 (one delta at a time, each waited
//! for), and the deltas per second one claim pushes to one client (small deltas emitted as
//! fast as the host takes them, until the client has the last).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::target::Target;
use super::{Figure, figure};
use crate::api::ApiServer;
use crate::config::Config;
use crate::live::{Hub, LiveSettings};
use crate::store::NewDispatch;

const TOKEN: &str = "bench-token-0123456789abcdef";

fn config(dir: &std::path::Path) -> anyhow::Result<Config> {
    std::fs::write(dir.join("api.token"), TOKEN)?;
    let text = "[api]\nlisten = \"127.0.0.1:0\"\nmax_stream = \"1h\"\n\
        tokens = [{ name = \"bench\", role = \"operator\", secret = { file = \"api.token\" } }]\n";
    Ok(Config::parse(text, "homing bench", dir)?)
}

/// The bench's settings: no cap that the throughput run would reach.
fn settings() -> LiveSettings {
    LiveSettings {
        max_stream_bytes: 1 << 30,
        max_emit_rate: u32::MAX,
        retention: Duration::from_secs(3600),
    }
}

/// Latency over `n` deltas and throughput over `burst` deltas, `repeats` times.
pub(super) async fn stream(
    target: &Target,
    n: usize,
    burst: usize,
    repeats: usize,
) -> anyhow::Result<Vec<Figure>> {
    let mut p50s = Vec::new();
    let mut p99s = Vec::new();
    let mut rates = Vec::new();
    let mut across = "same host";
    for _ in 0..repeats {
        let scratch = target.scratch().await?;
        let emitting = Hub::new(&scratch.store, settings());
        let (reader, hub) = match target.second(&scratch).await? {
            Some(other) => {
                across = "across hosts";
                let hub = Hub::new(&other, settings());
                (other, hub)
            }
            None => (scratch.store.clone(), emitting.clone()),
        };
        let config = Arc::new(config(scratch.dir.path())?);
        let server = ApiServer::start_with_hub(config, reader, None, hub).await?;
        scratch
            .store
            .mailbox
            .enqueue(NewDispatch::new("echo", "bench", "x"))
            .await?;
        let Some(d) = scratch
            .store
            .mailbox
            .claim_started("echo", "bench", 600_000)
            .await?
        else {
            bail!("the dispatch was not claimable");
        };
        let (tx, mut rx) = mpsc::unbounded_channel();
        let client = tokio::spawn(read(server.addr(), d.id.clone(), tx));
        // The first event is the status: the client is subscribed from here on.
        recv(&mut rx, 0).await?;
        let live = emitting.open(&d.id, "echo", d.claims, Duration::from_secs(600));
        let mut latencies = Vec::with_capacity(n);
        for i in 1..=n {
            let sent = Instant::now();
            let seq = live.emit(format!("token {i}").as_bytes())?;
            let at = recv(&mut rx, seq).await?;
            latencies.push(at.duration_since(sent).as_secs_f64() * 1e6);
        }
        latencies.sort_by(|a, b| a.total_cmp(b));
        let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
        p50s.push(at(0.5));
        p99s.push(at(0.99));

        let started = Instant::now();
        let mut last = 0;
        for _ in 0..burst {
            last = live.emit(b"x")?;
        }
        recv(&mut rx, last).await?;
        rates.push(burst as f64 / started.elapsed().as_secs_f64());

        live.finish().await;
        client.abort();
        server.stop(Duration::from_secs(5)).await;
        target.drop_scratch(scratch).await;
    }
    let name = target.name();
    Ok(vec![
        figure(
            format!("stream emit-to-client p50 ({name}, {across})"),
            "µs",
            p50s,
        ),
        figure(
            format!("stream emit-to-client p99 ({name}, {across})"),
            "µs",
            p99s,
        ),
        figure(
            format!("stream deltas/s to one client ({name}, {across})"),
            "deltas/s",
            rates,
        ),
    ])
}

/// Waits until the client got delta `seq` (0: its first event); when it did.
async fn recv(
    rx: &mut mpsc::UnboundedReceiver<(u64, Instant)>,
    seq: u64,
) -> anyhow::Result<Instant> {
    loop {
        let got = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .context("the stream's client got nothing for 30 s")?;
        match got {
            Some((s, at)) if s >= seq => return Ok(at),
            Some(_) => {}
            None => bail!("the stream's client stopped"),
        }
    }
}

/// Reads the stream of `id` over one HTTP/1.1 connection (chunked), sending each event's
/// delta sequence (0 for other events) and when it arrived.
async fn read(
    addr: std::net::SocketAddr,
    id: String,
    tx: mpsc::UnboundedSender<(u64, Instant)>,
) -> anyhow::Result<()> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let mut stream = BufReader::new(stream);
    let request = format!(
        "GET /v1/dispatches/{id}/stream HTTP/1.1\r\nhost: bench\r\nauthorization: Bearer {TOKEN}\r\n\r\n"
    );
    stream.get_mut().write_all(request.as_bytes()).await?;
    let mut line = String::new();
    stream.read_line(&mut line).await?;
    if !line.contains(" 200 ") {
        bail!("the stream answered {line:?}");
    }
    loop {
        line.clear();
        stream.read_line(&mut line).await?;
        if line.trim_end().is_empty() {
            break;
        }
    }
    // The body is chunked: a hex size line, the bytes, CRLF. Events span chunks.
    let mut pending = Vec::new();
    loop {
        line.clear();
        if stream.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let size = usize::from_str_radix(line.trim(), 16)
            .with_context(|| format!("bad chunk size {line:?}"))?;
        if size == 0 {
            return Ok(());
        }
        let mut chunk = vec![0; size + 2];
        stream.read_exact(&mut chunk).await?;
        let at = Instant::now();
        pending.extend_from_slice(&chunk[..size]);
        while let Some(end) = pending.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = pending.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event);
            if text.starts_with(':') {
                continue;
            }
            let seq = text
                .lines()
                .find_map(|l| l.strip_prefix("id: "))
                .and_then(|id| id.split_once(':'))
                .and_then(|(_, s)| s.parse().ok())
                .unwrap_or(0);
            if tx.send((seq, at)).is_err() {
                return Ok(());
            }
        }
    }
}

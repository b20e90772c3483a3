//! The HTTP API under load: enqueue throughput through `POST /v1/dispatches` from concurrent
//! keep-alive connections, enqueue-to-result latency (`POST`, then `GET ?wait=` until the
//! echo guest's output is there) with a host running, and beside it the latency of one turn
//! through the OpenAI-compatible endpoint (`POST /openai/v1/chat/completions` on a new thread:
//! a message, the turn it starts, its output as the answer) and of one MCP `tools/call`
//! (`POST /mcp`: a dispatch enqueued and waited for in the one request). The API server, the host and the clients
//! run in this process over loopback, like a web application beside its host; the client is a
//! minimal HTTP/1.1 one (keep-alive, `Content-Length` bodies), so what is measured is the
//! server.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::target::Target;
use super::{Figure, Size, figure};
use crate::api::{AgentInfo, ApiServer};
use crate::config::Config;
use crate::store::NewDispatch;
use crate::supervisor::Supervisor;

/// The bench's bearer token (the server reads it from a file in the scratch directory).
const TOKEN: &str = "bench-token-0123456789abcdef";
/// Connections enqueuing at once.
const CONNECTIONS: usize = 16;

fn api_config(dir: &Path, echo: &Path, workers: u32) -> anyhow::Result<Config> {
    std::fs::write(dir.join("api.token"), TOKEN)?;
    let text = format!(
        "[host]\nsweep_interval = \"1s\"\n[api]\nlisten = \"127.0.0.1:0\"\ntokens = [{{ name = \"bench\", role = \"operator\", secret = {{ file = \"api.token\" }} }}]\n[plugins.echo]\npath = {:?}\nconcurrency = {workers}\n[plugins.echo.openai]\nexpose = true\n[plugins.echo.mcp_server]\nexpose = true\n",
        echo.display().to_string()
    );
    Ok(Config::parse(&text, "homing bench", dir)?)
}

/// One keep-alive HTTP/1.1 connection.
struct Conn {
    stream: BufReader<TcpStream>,
}

impl Conn {
    async fn open(addr: std::net::SocketAddr) -> anyhow::Result<Conn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream: BufReader::new(stream),
        })
    }

    /// Sends one request; returns the status and the body.
    async fn call(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> anyhow::Result<(u16, String)> {
        let body = body.unwrap_or("");
        let request = format!(
            "{method} {path} HTTP/1.1\r\nhost: bench\r\nauthorization: Bearer {TOKEN}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        self.stream.get_mut().write_all(request.as_bytes()).await?;
        let mut line = String::new();
        self.stream.read_line(&mut line).await?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("bad status line {line:?}"))?;
        let mut length = 0usize;
        loop {
            line.clear();
            self.stream.read_line(&mut line).await?;
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse()?;
            }
        }
        let mut body = vec![0; length];
        self.stream.read_exact(&mut body).await?;
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }
}

fn id_of(body: &str) -> anyhow::Result<String> {
    let value: serde_json::Value = serde_json::from_str(body)?;
    value["id"]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("no id in {body}"))
}

/// API enqueue throughput (no host claiming) and enqueue-to-result latency p50/p99 (a host
/// with `workers` echo workers), on fresh stores of `target`.
pub(super) async fn api(target: &Target, echo: &Path, size: Size) -> anyhow::Result<Vec<Figure>> {
    let name = target.name();
    let mut rates = Vec::new();
    let mut p50s = Vec::new();
    let mut p99s = Vec::new();
    let mut chat_p50s = Vec::new();
    let mut chat_p99s = Vec::new();
    let mut mcp_p50s = Vec::new();
    let mut mcp_p99s = Vec::new();
    for _ in 0..size.repeats {
        // Throughput: the API and the store alone.
        let scratch = target.scratch().await?;
        let config = Arc::new(api_config(scratch.dir.path(), echo, 1)?);
        let server = ApiServer::start(config, scratch.store.clone(), None).await?;
        let addr = server.addr();
        let per = (size.dispatches as usize).div_ceil(CONNECTIONS);
        let started = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for c in 0..CONNECTIONS {
            set.spawn(async move {
                let mut conn = Conn::open(addr).await?;
                for i in 0..per {
                    let body = format!(
                        "{{\"agent\":\"echo\",\"thread\":\"t{}\",\"payload\":\"hello\"}}",
                        (c * per + i) % 50
                    );
                    let (status, reply) = conn.call("POST", "/v1/dispatches", Some(&body)).await?;
                    if status != 201 {
                        bail!("enqueue answered {status}: {reply}");
                    }
                }
                anyhow::Ok(())
            });
        }
        while let Some(done) = set.join_next().await {
            done??;
        }
        rates.push((per * CONNECTIONS) as f64 / started.elapsed().as_secs_f64());
        server.stop(Duration::from_secs(5)).await;
        target.drop_scratch(scratch).await;

        // Latency: one client, a host running; enqueue, then wait for the result.
        let scratch = target.scratch().await?;
        let config = api_config(scratch.dir.path(), echo, 4)?;
        let server =
            ApiServer::start(Arc::new(config.clone()), scratch.store.clone(), None).await?;
        // A dispatch held back for an hour keeps the host from going idle until it is
        // cancelled: then `run(until_idle)` stops it cleanly, sweeper and all.
        let keep = scratch
            .store
            .mailbox
            .enqueue(NewDispatch::new("echo", "keep", "x").with_delay_ms(3_600_000))
            .await?;
        let supervisor = Supervisor::new(config, scratch.store.clone())?;
        server.plugins_loaded(
            supervisor
                .plugins()
                .iter()
                .map(|p| AgentInfo::of(p))
                .collect(),
        );
        let host = tokio::spawn(supervisor.run(true));
        let mut conn = Conn::open(server.addr()).await?;
        let mut samples = Vec::new();
        let mut chats = Vec::new();
        let mut tool_calls = Vec::new();
        let rounds = (size.claims).max(50);
        for i in 0..rounds + 10 {
            let body = format!("{{\"agent\":\"echo\",\"thread\":\"l{i}\",\"payload\":\"ping\"}}");
            let started = Instant::now();
            let (status, reply) = conn.call("POST", "/v1/dispatches", Some(&body)).await?;
            if status != 201 {
                bail!("enqueue answered {status}: {reply}");
            }
            let id = id_of(&reply)?;
            loop {
                let (status, reply) = conn
                    .call("GET", &format!("/v1/dispatches/{id}?wait=10s"), None)
                    .await?;
                if status != 200 {
                    bail!("get answered {status}: {reply}");
                }
                if reply.contains("\"terminal\":true") {
                    break;
                }
            }
            let waited = started.elapsed();
            // The same work as a chat turn, on a thread of its own.
            let started = Instant::now();
            let body = r#"{"model":"echo","messages":[{"role":"user","content":"ping"}]}"#;
            let (status, reply) = conn
                .call("POST", "/openai/v1/chat/completions", Some(body))
                .await?;
            if status != 200 {
                bail!("chat completion answered {status}: {reply}");
            }
            let chatted = started.elapsed();
            // And as an MCP tool call.
            let started = Instant::now();
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"ping"}}}}}}"#
            );
            let (status, reply) = conn.call("POST", "/mcp", Some(&body)).await?;
            if status != 200 || !reply.contains("\"isError\":false") {
                bail!("tools/call answered {status}: {reply}");
            }
            // The first rounds warm the instance pool and the connection.
            if i >= 10 {
                samples.push(waited.as_secs_f64() * 1e6);
                chats.push(chatted.as_secs_f64() * 1e6);
                tool_calls.push(started.elapsed().as_secs_f64() * 1e6);
            }
        }
        scratch.store.mailbox.cancel(&keep.id).await?;
        host.await??;
        server.stop(Duration::from_secs(5)).await;
        target.drop_scratch(scratch).await;
        let at = |samples: &mut Vec<f64>, q: f64| {
            samples.sort_by(f64::total_cmp);
            let index = (samples.len().saturating_sub(1) as f64 * q).round() as usize;
            samples.get(index).copied().unwrap_or(0.0)
        };
        p50s.push(at(&mut samples, 0.5));
        p99s.push(at(&mut samples, 0.99));
        chat_p50s.push(at(&mut chats, 0.5));
        chat_p99s.push(at(&mut chats, 0.99));
        mcp_p50s.push(at(&mut tool_calls, 0.5));
        mcp_p99s.push(at(&mut tool_calls, 0.99));
    }
    Ok(vec![
        figure(
            format!("api enqueue, {CONNECTIONS} connections ({name})"),
            "dispatches/s",
            rates,
        ),
        figure(
            format!("api enqueue-to-result p50, echo ({name})"),
            "µs",
            p50s,
        ),
        figure(
            format!("api enqueue-to-result p99, echo ({name})"),
            "µs",
            p99s,
        ),
        figure(
            format!("api chat completion p50, echo, a new thread each ({name})"),
            "µs",
            chat_p50s,
        ),
        figure(
            format!("api chat completion p99, echo, a new thread each ({name})"),
            "µs",
            chat_p99s,
        ),
        figure(
            format!("api MCP tools/call p50, echo, a new thread each ({name})"),
            "µs",
            mcp_p50s,
        ),
        figure(
            format!("api MCP tools/call p99, echo, a new thread each ({name})"),
            "µs",
            mcp_p99s,
        ),
    ])
}

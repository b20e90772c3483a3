//! The HTTP client the trace exporter posts batches with.
//!
//! `opentelemetry-otlp` can bring reqwest or its own hyper client; this one is a few lines on
//! the hyper and rustls the host already links for guests' outbound requests, so an `https`
//! collector is trusted through the same web roots and `[host] tls_ca`, and the binary gains
//! no second HTTP or TLS stack. The SDK exports from its own thread, outside the async
//! runtime: each request is spawned onto the host's runtime and awaited from there.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use async_trait::async_trait;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use opentelemetry_http::{HttpClient, HttpError};
use tokio::net::TcpStream;

/// The most of a collector's answer that is read.
const MAX_RESPONSE: usize = 1 << 20;

/// Posts OTLP batches, one connection each (a batch leaves every few seconds at most).
#[derive(Debug, Clone)]
pub(super) struct Client {
    tls: Arc<rustls::ClientConfig>,
    runtime: tokio::runtime::Handle,
    timeout: Duration,
}

impl Client {
    pub(super) fn new(
        tls: Arc<rustls::ClientConfig>,
        runtime: tokio::runtime::Handle,
        timeout: Duration,
    ) -> Self {
        Client {
            tls,
            runtime,
            timeout,
        }
    }
}

#[async_trait]
impl HttpClient for Client {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (tls, timeout) = (self.tls.clone(), self.timeout);
        let sent = self
            .runtime
            .spawn(async move { tokio::time::timeout(timeout, send(tls, request)).await });
        match sent.await {
            Ok(Ok(answer)) => answer.map_err(|e| format!("{e:#}").into()),
            Ok(Err(_)) => Err(format!("no answer within {timeout:?}").into()),
            Err(e) => Err(format!("the export task failed: {e}").into()),
        }
    }
}

async fn send(
    tls: Arc<rustls::ClientConfig>,
    request: Request<Bytes>,
) -> anyhow::Result<Response<Bytes>> {
    let uri = request.uri().clone();
    let host = uri.host().context("the endpoint has no host")?.to_owned();
    let https = uri.scheme_str() == Some("https");
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let tcp = TcpStream::connect((bare, port))
        .await
        .with_context(|| format!("connecting to {host}:{port}"))?;
    let _ = tcp.set_nodelay(true);
    let (mut parts, body) = request.into_parts();
    // hyper's connection-level client writes the request target as it is given: an absolute
    // URI would go out in absolute form, which only a proxy should receive (RFC 9112, section
    // 3.2.1), and a receiver routing on the raw target drops it. Send the origin form (the path
    // and query) with a Host header naming the server.
    parts.uri = uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .parse()
        .context("the endpoint's path is not a request target")?;
    let mut request = Request::from_parts(parts, Full::new(body));
    let authority = uri.authority().map(|a| a.as_str().to_owned());
    if let Some(authority) = authority
        && let Ok(value) = http::HeaderValue::from_str(&authority)
    {
        request.headers_mut().insert(http::header::HOST, value);
    }
    let response = if https {
        let name = rustls::pki_types::ServerName::try_from(bare.to_owned())
            .with_context(|| format!("`{host}` is not a TLS server name"))?;
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect(name, tcp)
            .await
            .with_context(|| format!("TLS with {host}"))?;
        exchange(TokioIo::new(stream), request).await?
    } else {
        exchange(TokioIo::new(tcp), request).await?
    };
    Ok(response)
}

async fn exchange<T>(io: T, request: Request<Full<Bytes>>) -> anyhow::Result<Response<Bytes>>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await?;
    tokio::spawn(connection);
    let response = sender.send_request(request).await?;
    let (parts, body) = response.into_parts();
    let body = Limited::new(body, MAX_RESPONSE)
        .collect()
        .await
        .map_err(|e| anyhow::anyhow!("reading the answer: {e}"))?
        .to_bytes();
    Ok(Response::from_parts(parts, body))
}

//! The MCP client side the broker speaks: JSON-RPC over Streamable HTTP (revisions 2025-03-26
//! to 2025-11-25), each request a POST through the plugin's outbound path
//! ([`HttpHooks::host_exchange`]), each answer JSON or an event stream.
//!
//! Hand-written rather than `rmcp`'s client: the broker uses four methods (`initialize`, its
//! notification, `tools/list`, `tools/call`), and every byte must go through the host's own
//! outbound path (the plugin's allow-list, the address rule checked on the resolved address,
//! its origin limits, its deadline and interrupt); `rmcp`'s HTTP transport brings its own
//! `reqwest` client, which would bypass all of that.

use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::runtime::outbound::{HostExchangeError, HttpHooks};

/// The revision the broker asks for.
const REVISION: &str = "2025-11-25";

/// The revisions whose `tools/list` and `tools/call` the broker reads.
const READS: &[&str] = &["2025-03-26", "2025-06-18", "2025-11-25"];

/// A session with one server, as `initialize` opened it.
#[derive(Debug, Clone)]
pub struct Session {
    /// `Mcp-Session-Id`, when the server keeps sessions.
    pub id: Option<String>,
    /// The revision the server chose.
    pub revision: String,
}

/// Why a request to a server failed.
#[derive(Debug)]
pub enum ClientError {
    /// The plugin's policy refused it: nothing was sent.
    Refused(String),
    /// Nothing reached the server.
    NotSent(String),
    /// It may have reached the server; no answer came back in full.
    Unknown(String),
    /// The answer passed `max_result` bytes (the call may have run).
    TooLarge(u64),
    /// The server (or the token endpoint) refused the host's credentials: nothing ran.
    Unauthorized(String),
    /// The server answered with a JSON-RPC error or a failing status; `expired` when it no
    /// longer knows the session (a new one may be opened).
    Answered { text: String, expired: bool },
}

impl From<HostExchangeError> for ClientError {
    fn from(e: HostExchangeError) -> Self {
        match e {
            HostExchangeError::Refused(why) => ClientError::Refused(why),
            HostExchangeError::NotSent(why) => ClientError::NotSent(why),
            HostExchangeError::Unknown(why) => ClientError::Unknown(why),
            HostExchangeError::TooLarge(cap) => ClientError::TooLarge(cap),
        }
    }
}

/// One server as a request reaches it.
pub struct Endpoint<'a> {
    /// The instance's outbound path.
    pub hooks: &'a HttpHooks,
    /// The server's URL.
    pub url: &'a str,
    /// The bearer the host sends, if any.
    pub bearer: Option<zeroize::Zeroizing<String>>,
    /// The longest one request may take.
    pub timeout: Duration,
    /// The most bytes of one answer read.
    pub cap: u64,
}

impl std::fmt::Debug for Endpoint<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the bearer, nor the URL's query.
        f.debug_struct("Endpoint")
            .field("url", &crate::config::mcp::shown_url(self.url))
            .finish_non_exhaustive()
    }
}

impl Endpoint<'_> {
    /// Opens a session: `initialize`, then `notifications/initialized`.
    pub async fn initialize(&self) -> Result<Session, ClientError> {
        let params = json!({
            "protocolVersion": REVISION,
            "capabilities": {},
            "clientInfo": { "name": "homing", "version": env!("CARGO_PKG_VERSION") },
        });
        let (result, headers) = self.request(None, "initialize", params).await?;
        let revision = result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if !READS.contains(&revision.as_str()) {
            return Err(ClientError::Answered {
                text: format!(
                    "the server speaks MCP revision `{revision}`; the host reads {}",
                    READS.join(", ")
                ),
                expired: false,
            });
        }
        let session = Session {
            id: headers
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
                .filter(|v| !v.is_empty() && v.len() <= 256)
                .map(str::to_owned),
            revision,
        };
        self.notify(&session, "notifications/initialized").await?;
        Ok(session)
    }

    /// `tools/list`, every page (at most 20), keeping the tools whose name `keep` allows (at
    /// most 1,000).
    pub async fn list_tools(
        &self,
        session: &Session,
        keep: impl Fn(&str) -> bool,
    ) -> Result<Vec<Value>, ClientError> {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..20 {
            let params = match &cursor {
                Some(c) => json!({ "cursor": c }),
                None => json!({}),
            };
            let (result, _) = self.request(Some(session), "tools/list", params).await?;
            if let Some(Value::Array(page)) = result.get("tools") {
                tools.extend(
                    page.iter()
                        .filter(|t| t.get("name").and_then(Value::as_str).is_some_and(&keep))
                        .cloned(),
                );
            }
            if tools.len() > 1_000 {
                return Err(ClientError::Answered {
                    text: "the server lists more than 1,000 allowed tools".into(),
                    expired: false,
                });
            }
            cursor = result
                .get("nextCursor")
                .and_then(Value::as_str)
                .map(str::to_owned);
            if cursor.is_none() {
                return Ok(tools);
            }
        }
        Err(ClientError::Answered {
            text: "the tool list runs past 20 pages".into(),
            expired: false,
        })
    }

    /// `tools/call`: the result object.
    pub async fn call_tool(
        &self,
        session: &Session,
        tool: &str,
        arguments: &Map<String, Value>,
    ) -> Result<Value, ClientError> {
        let params = json!({ "name": tool, "arguments": arguments });
        self.request(Some(session), "tools/call", params)
            .await
            .map(|(result, _)| result)
    }

    /// A notification: no answer is read beyond the status.
    async fn notify(&self, session: &Session, method: &str) -> Result<(), ClientError> {
        let body = json!({ "jsonrpc": "2.0", "method": method });
        let answer = self
            .hooks
            .host_exchange(
                self.post(Some(session), &body)?,
                self.timeout,
                self.cap,
                |_| false,
            )
            .await?;
        match answer.status {
            200..=299 => Ok(()),
            status => Err(status_error(status, session.id.is_some())),
        }
    }

    /// A request: its `result` and the answer's headers.
    async fn request(
        &self,
        session: Option<&Session>,
        method: &str,
        params: Value,
    ) -> Result<(Value, http::HeaderMap), ClientError> {
        let body = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
        let answer = self
            .hooks
            .host_exchange(
                self.post(session, &body)?,
                self.timeout,
                self.cap,
                |bytes| response_in(bytes).is_some(),
            )
            .await?;
        let may_have_run = method == "tools/call";
        if may_have_run && answer.status >= 500 {
            return Err(ClientError::Unknown(format!(
                "the server answered status {} to the call",
                answer.status
            )));
        }
        if !(200..=299).contains(&answer.status) {
            return Err(status_error(
                answer.status,
                session.is_some_and(|s| s.id.is_some()),
            ));
        }
        let event_stream = answer
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let message = if event_stream {
            response_in(&answer.body)
        } else {
            serde_json::from_slice::<Value>(&answer.body).ok()
        };
        let Some(message) = message else {
            return Err(ClientError::Unknown(format!(
                "the answer to `{method}` held no JSON-RPC response"
            )));
        };
        if let Some(error) = message.get("error") {
            let code = error.get("code").and_then(Value::as_i64).unwrap_or(0);
            let text = error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("no message");
            return Err(ClientError::Answered {
                text: format!("the server answered `{method}` with error {code}: {text}"),
                expired: false,
            });
        }
        match message.get("result") {
            Some(result @ Value::Object(_)) => Ok((result.clone(), answer.headers)),
            _ if may_have_run => Err(ClientError::Unknown(
                "the server's answer to the call has no result object".into(),
            )),
            _ => Err(ClientError::Answered {
                text: format!("the server's answer to `{method}` has no result object"),
                expired: false,
            }),
        }
    }

    /// The POST of `body`, with the session's headers and the credentials.
    fn post(
        &self,
        session: Option<&Session>,
        body: &Value,
    ) -> Result<http::Request<bytes::Bytes>, ClientError> {
        let mut request = http::Request::post(self.url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json, text/event-stream");
        if let Some(session) = session {
            request = request.header("mcp-protocol-version", session.revision.as_str());
            if let Some(id) = &session.id {
                request = request.header("mcp-session-id", id.as_str());
            }
        }
        if let Some(bearer) = &self.bearer {
            request = request.header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", bearer.as_str()),
            );
        }
        let bytes = serde_json::to_vec(body).map_err(|e| ClientError::Refused(e.to_string()))?;
        // Never the request's own text in an error: its headers carry the credentials.
        request
            .body(bytes::Bytes::from(bytes))
            .map_err(|_| ClientError::Refused("the request could not be built".into()))
    }
}

/// The error of a failing status. A 404 on a session the server no longer knows expires it.
fn status_error(status: u16, in_session: bool) -> ClientError {
    let text = match status {
        401 | 403 => {
            return ClientError::Unauthorized(format!(
                "the server refused the host's credentials ({status}); check auth"
            ));
        }
        404 if in_session => "the server no longer knows the session (404)".into(),
        _ => format!("the server answered status {status}"),
    };
    ClientError::Answered {
        text,
        expired: status == 404 && in_session,
    }
}

/// The JSON-RPC response (a message with an `id` and a `result` or an `error`) among the
/// complete events of an event stream, if one has arrived. Server requests and notifications
/// the stream carries before it are skipped: the broker declares no client capabilities, so
/// none asks for an answer it must give.
fn response_in(bytes: &[u8]) -> Option<Value> {
    let text = std::str::from_utf8(bytes).ok()?;
    let text = text.replace("\r\n", "\n");
    // Only events a blank line ended are complete.
    let complete = &text[..text.rfind("\n\n")?];
    for event in complete.split("\n\n") {
        let data: Vec<&str> = event
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        if data.is_empty() {
            continue;
        }
        let Ok(message) = serde_json::from_str::<Value>(&data.join("\n")) else {
            continue;
        };
        if message.get("id").is_some()
            && (message.get("result").is_some() || message.get("error").is_some())
        {
            return Some(message);
        }
    }
    None
}

/// Asks `oauth`'s token endpoint for an access token with the client's `secret` (OAuth 2.0
/// client credentials, the client authenticated with HTTP Basic): the token and when to stop
/// using it (30 s, or half its life, before it expires; an hour when the answer says nothing).
///
/// # Errors
///
/// `Unauthorized` when the endpoint refuses the client; as any exchange otherwise. Never the
/// secret or the token in the text.
pub async fn fetch_token(
    hooks: &HttpHooks,
    oauth: &crate::config::mcp::McpOAuth,
    secret: &str,
    timeout: Duration,
) -> Result<(zeroize::Zeroizing<String>, std::time::Instant), ClientError> {
    use base64::Engine;
    use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
    // RFC 6749, 2.3.1: the id and the secret form-encoded before Basic; unreserved characters
    // stay as they are (many servers compare without decoding).
    const FORM: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    let encode = |text: &str| utf8_percent_encode(text, FORM).to_string();
    let basic = zeroize::Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(format!(
        "{}:{}",
        encode(&oauth.client_id),
        encode(secret)
    )));
    let mut form = "grant_type=client_credentials".to_owned();
    if let Some(scope) = &oauth.scope {
        form.push_str(&format!("&scope={}", encode(scope)));
    }
    let request = http::Request::post(oauth.token_url.as_str())
        .header(
            http::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded",
        )
        .header(http::header::ACCEPT, "application/json")
        .header(
            http::header::AUTHORIZATION,
            format!("Basic {}", basic.as_str()),
        )
        .body(bytes::Bytes::from(form))
        .map_err(|_| ClientError::Refused("the token request could not be built".into()))?;
    let answer = hooks
        .host_exchange(request, timeout, 64 * 1024, |_| false)
        .await?;
    if !(200..=299).contains(&answer.status) {
        return Err(ClientError::Unauthorized(format!(
            "the token endpoint refused the client `{}` ({})",
            oauth.client_id, answer.status
        )));
    }
    let body: Value = serde_json::from_slice(&answer.body)
        .map_err(|_| ClientError::Unauthorized("the token endpoint's answer is not JSON".into()))?;
    let Some(token) = body
        .get("access_token")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty() && t.len() <= 8192 && !t.contains(['\r', '\n']))
    else {
        return Err(ClientError::Unauthorized(
            "the token endpoint's answer has no usable access_token".into(),
        ));
    };
    let life = Duration::from_secs(
        body.get("expires_in")
            .and_then(Value::as_u64)
            .unwrap_or(3600)
            .min(365 * 24 * 3600),
    );
    let margin = Duration::from_secs(30).min(life / 2);
    Ok((
        zeroize::Zeroizing::new(token.to_owned()),
        std::time::Instant::now() + (life - margin),
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_response_is_found_among_complete_events_only() {
        let stream = b"event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\r\n\r\nevent: message\r\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"x\":1}}\r\n\r\n";
        assert_eq!(response_in(stream).unwrap()["result"]["x"], 1);
        let cut = &stream[..stream.len() - 2];
        assert!(response_in(cut).is_none());
        let split = b"data: {\"jsonrpc\":\"2.0\",\ndata: \"id\":1,\"error\":{\"code\":-1}}\n\n";
        assert_eq!(response_in(split).unwrap()["error"]["code"], -1);
        assert!(response_in(b"data: not json\n\n").is_none());
    }

    #[test]
    fn a_404_expires_only_a_session() {
        assert!(matches!(
            status_error(404, true),
            ClientError::Answered { expired: true, .. }
        ));
        assert!(matches!(
            status_error(404, false),
            ClientError::Answered { expired: false, .. }
        ));
        let ClientError::Unauthorized(text) = status_error(401, true) else {
            unreachable!()
        };
        assert!(text.contains("credentials"));
    }
}

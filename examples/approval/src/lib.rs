//! `approval`: an agent that asks a person before it runs a tool.
//!
//! The payload is a request (text). The agent asks a model (an OpenAI-compatible
//! chat-completions endpoint, as `examples/assistant` does) which tool to run; the model answers
//! with a tool call. Before running it, the agent creates a waitpoint named for the tool
//! (`approve-<tool>`) with the call in its metadata (`tool`, `arguments`, `request`), so the
//! person who decides sees what they approve, and suspends: the dispatch waits, holding no
//! worker, until someone completes the waitpoint or its timeout passes.
//!
//! Whoever completes it sends JSON: `{"approved": true}` or `{"approved": false, "reason":
//! "..."}` (the dashboard's Approve and Reject buttons send the first two). The resumed run
//! starts from the beginning of the handler, finds the waitpoint with its outcome, and:
//!
//! - approved: runs the tool, asks the model for an answer with the tool's result, and
//!   completes with it;
//! - rejected (or an answer it cannot read): does not run the tool and says so;
//! - timed out or cancelled: gives up and says so.
//!
//! Each step is appended to the thread log as a line of text (`homing thread log THREAD`).
//!
//! **Running again from the start.** A resumed run must not ask the model for a plan again:
//! the plan is in the waitpoint's metadata, so the run first lists its waitpoints and, when
//! one is there, takes the tool call from it. Log lines the earlier run wrote are not written
//! again: the run reads the log and looks at what follows the line that announced its
//! waitpoint. A retry after the answer was logged returns that answer without calling the
//! model.
//!
//! **Who can approve.** Without a `notify_url`, an operator approves: the dashboard's Waiting
//! page, `homing waitpoint complete ID --payload '{"approved": true}'`, or the API with an
//! operator token. With `notify_url`, the agent also POSTs the waitpoint's id, its metadata,
//! its token and its callback URL (`[api] public_url`) to that URL (a chat webhook, a ticket
//! system) when the host hands them out, so that whoever receives them can approve with the
//! token alone. The token completes this one waitpoint; it is never logged or stored.
//!
//! The one tool is `add` (two numbers; the sum): harmless, so the demo can approve it.
//!
//! Variables (`[plugins.approval.variables]`): `base_url` and `model` (required), `api_key` (a
//! secret, optional) and `notify_url` (optional). Dispatch metadata `approval_timeout_ms` sets
//! how long the person has (default an hour).

use std::time::Duration;

use homing_guest::http::Request;
use homing_guest::{Claim, Handler, Wait, Waitpoint, WaitpointToken, config};
use serde_json::{Value, json};

/// How long a person has to answer, unless the dispatch's `approval_timeout_ms` says.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3600);

/// A model call's deadline.
const MODEL_TIMEOUT: Duration = Duration::from_secs(60);

/// The largest model reply read.
const MAX_REPLY_BYTES: usize = 1 << 20;

/// The system prompt, sent first on every call.
const SYSTEM: &str = "You are a careful assistant running as a Homing agent. \
    Use the `add` tool for arithmetic; a person approves every tool call before it runs.";

/// The tools offered to the model, in the chat-completions `tools` format.
fn tools() -> Value {
    json!([{
        "type": "function",
        "function": {
            "name": "add",
            "description": "Adds two numbers and returns the sum.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "number", "description": "the first number"},
                    "b": {"type": "number", "description": "the second number"}
                },
                "required": ["a", "b"]
            }
        }
    }])
}

/// Runs the tool `name` with its JSON-encoded `arguments`; the text is its result.
fn run_tool(name: &str, arguments: &str) -> String {
    match name {
        "add" => {
            let args: Value = serde_json::from_str(arguments).unwrap_or(Value::Null);
            match (args["a"].as_f64(), args["b"].as_f64()) {
                (Some(a), Some(b)) => number(a + b),
                _ => "error: add needs two numbers, `a` and `b`".to_owned(),
            }
        }
        other => format!("error: there is no tool `{other}`"),
    }
}

/// A number as text, without a fraction when it is whole.
fn number(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{x:.0}")
    } else {
        x.to_string()
    }
}

/// The tool call the model asked for.
struct ToolCall {
    id: String,
    tool: String,
    arguments: String,
}

impl ToolCall {
    /// The waitpoint that asks for approval of this call.
    fn waitpoint_name(&self) -> String {
        format!("approve-{}", self.tool)
    }

    /// The call as a resumed run reads it back from its waitpoint's metadata.
    fn from_waitpoint(w: &Waitpoint) -> Result<ToolCall, String> {
        let field = |key: &str| {
            w.metadata(key)
                .map(str::to_owned)
                .ok_or_else(|| format!("waitpoint {} has no `{key}` in its metadata", w.name))
        };
        Ok(ToolCall {
            id: field("call_id")?,
            tool: field("tool")?,
            arguments: field("arguments")?,
        })
    }

    fn shown(&self) -> String {
        format!("{} {}", self.tool, self.arguments)
    }
}

/// The answer the waitpoint takes, as a JSON Schema: `approved`, and a `reason` for a refusal.
const APPROVAL_SCHEMA: &str = r#"{"type":"object","properties":{"approved":{"type":"boolean","description":"run the tool"},"reason":{"type":"string","description":"why not, when refused"}},"required":["approved"]}"#;

/// The model endpoint and credentials, from the plugin's variables.
struct Model {
    url: String,
    name: String,
    api_key: Option<String>,
}

impl Model {
    fn from_config() -> Result<Model, String> {
        let base = config::require("base_url")?;
        Ok(Model {
            url: format!("{}/chat/completions", base.trim_end_matches('/')),
            name: config::require("model")?,
            api_key: config::get("api_key")?.filter(|key| !key.is_empty()),
        })
    }

    /// One chat-completions call; returns the reply's message.
    fn complete(&self, messages: &[Value]) -> Result<Value, String> {
        let mut all = vec![json!({"role": "system", "content": SYSTEM})];
        all.extend(messages.iter().cloned());
        let body = json!({"model": self.name, "messages": all, "tools": tools()});
        let mut request = Request::post(&self.url)
            .header("accept", "application/json")
            .timeout(MODEL_TIMEOUT)
            .max_response_bytes(MAX_REPLY_BYTES);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let response = request.json(&body)?.send()?;
        if !response.is_success() {
            return Err(format!(
                "the model server answered HTTP {} to POST {}",
                response.status, self.url
            ));
        }
        let reply: Value = response.json()?;
        let message = reply["choices"][0]["message"].clone();
        if !message.is_object() {
            return Err("the model's reply has no choices[0].message".to_owned());
        }
        Ok(message)
    }

    /// Asks which tool to run for `request`.
    fn plan(&self, request: &str) -> Result<Option<ToolCall>, String> {
        let reply = self.complete(&[json!({"role": "user", "content": request})])?;
        let Some(call) = reply["tool_calls"]
            .as_array()
            .and_then(|calls| calls.first())
        else {
            return Ok(None);
        };
        Ok(Some(ToolCall {
            id: call["id"].as_str().unwrap_or("call").to_owned(),
            tool: call["function"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            arguments: call["function"]["arguments"]
                .as_str()
                .unwrap_or("{}")
                .to_owned(),
        }))
    }

    /// The answer to `request`, given the approved call and its result.
    fn answer(&self, request: &str, call: &ToolCall, result: &str) -> Result<String, String> {
        let reply = self.complete(&[
            json!({"role": "user", "content": request}),
            json!({"role": "assistant", "content": null, "tool_calls": [{
                "id": call.id,
                "type": "function",
                "function": {"name": call.tool, "arguments": call.arguments},
            }]}),
            json!({"role": "tool", "tool_call_id": call.id, "content": result}),
        ])?;
        Ok(reply["content"].as_str().unwrap_or_default().to_owned())
    }
}

/// The thread log as text lines, to see what an earlier run of this dispatch already wrote.
struct Log {
    lines: Vec<String>,
}

impl Log {
    fn read(claim: &Claim) -> Result<Log, String> {
        let lines = claim
            .read_log_all()?
            .iter()
            .map(|entry| entry.text().unwrap_or_default().to_owned())
            .collect();
        Ok(Log { lines })
    }

    /// The line announcing waitpoint `id`, which every later line of this dispatch follows.
    fn announced(&self, id: &str) -> Option<usize> {
        let mark = format!("(waitpoint {id}");
        self.lines.iter().position(|line| line.contains(&mark))
    }

    /// The lines after the announcement of waitpoint `id` (none when it was not announced).
    fn after(&self, id: &str) -> &[String] {
        match self.announced(id) {
            Some(at) => &self.lines[at + 1..],
            None => &[],
        }
    }

    /// Appends `line` unless it already follows the announcement of waitpoint `id`.
    fn note(&mut self, claim: &Claim, id: &str, line: String) -> Result<(), String> {
        if !self.after(id).contains(&line) {
            claim.append(&line)?;
            self.lines.push(line);
        }
        Ok(())
    }
}

/// What a person answered, from a completion's bytes.
enum Decision {
    Approved,
    Rejected(Option<String>),
    Unreadable,
}

fn decision(w: &Waitpoint) -> Decision {
    match w.completion_json::<Value>() {
        Ok(answer) => match answer["approved"].as_bool() {
            Some(true) => Decision::Approved,
            Some(false) => Decision::Rejected(answer["reason"].as_str().map(str::to_owned)),
            None => Decision::Unreadable,
        },
        Err(_) => Decision::Unreadable,
    }
}

/// Sends the waitpoint and its token to `notify_url`, when one is configured: whoever receives
/// them can approve without an operator token. Nothing of this is logged.
fn notify(w: &Waitpoint, token: &WaitpointToken, call: &ToolCall) -> Result<(), String> {
    let Some(url) = config::get("notify_url")?.filter(|url| !url.is_empty()) else {
        return Ok(());
    };
    let body = json!({
        "waitpoint": w.id,
        "name": w.name,
        "tool": call.tool,
        "arguments": call.arguments,
        "timeout_at": w.timeout_at,
        "token": token.secret(),
        "callback_url": token.callback_url(),
    });
    let response = Request::post(&url)
        .timeout(Duration::from_secs(10))
        .json(&body)?
        .send()?;
    if !response.is_success() {
        // Failing the run nacks it; the retry gets a fresh token and notifies again.
        return Err(format!("notify_url answered HTTP {}", response.status));
    }
    Ok(())
}

/// How long the person has: the dispatch's `approval_timeout_ms`, else an hour.
fn timeout(claim: &Claim) -> Result<Duration, String> {
    match claim.metadata("approval_timeout_ms") {
        None => Ok(DEFAULT_TIMEOUT),
        Some(ms) => ms
            .parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|e| format!("approval_timeout_ms: {e}")),
    }
}

/// At most `max` bytes of `text`, cut at a character boundary.
fn prefix(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 3600.0 {
        format!("{:.0}h", s / 3600.0)
    } else if s >= 60.0 {
        format!("{:.0}min", s / 60.0)
    } else {
        format!("{s:.0}s")
    }
}

struct Approval;

impl Handler for Approval {
    fn handle(claim: &Claim) -> Result<Vec<u8>, String> {
        let request = claim.payload_str()?.to_owned();
        let model = Model::from_config()?;

        // A resumed (or retried) run finds its plan in the waitpoint it made; the first run
        // asks the model.
        let earlier = claim
            .waitpoints()?
            .into_iter()
            .find(|w| w.name.starts_with("approve-"));
        let call = match &earlier {
            Some(w) => ToolCall::from_waitpoint(w)?,
            None => match model.plan(&request)? {
                Some(call) if call.tool == "add" => call,
                other => {
                    // Nothing this agent could run: no person is asked.
                    let why = match other {
                        Some(call) => format!(
                            "the model asked for `{}`, a tool it does not have",
                            call.tool
                        ),
                        None => "the model asked for no tool".to_owned(),
                    };
                    claim.append(format!("request: {request}"))?;
                    claim.append(format!("{why}; nothing to approve"))?;
                    return Ok(format!("nothing to approve: {why}").into_bytes());
                }
            },
        };

        let timeout = timeout(claim)?;
        // What the person sees: the call, and the request (its first KiB: a waitpoint's
        // metadata is capped at 16 KiB). `message` and `schema` are what an MCP client is asked
        // when it called this agent as a tool (the host's `/mcp` turns a pending waitpoint into
        // a form with this message and schema).
        let message = format!("Approve running {}?", call.shown());
        let metadata = [
            ("message", prefix(&message, 1024)),
            ("schema", APPROVAL_SCHEMA),
            ("tool", call.tool.as_str()),
            ("arguments", call.arguments.as_str()),
            ("call_id", call.id.as_str()),
            ("request", prefix(&request, 1024)),
        ];
        let log = Log::read(claim)?;
        let wait =
            claim.wait_for_with(&call.waitpoint_name(), timeout, &metadata, |w, token| {
                // On the first run, and on a later run's first look while the waitpoint is still
                // pending (with a fresh token; the earlier one stays valid).
                if log.announced(&w.id).is_none() {
                    claim.append(format!("request: {request}"))?;
                    claim.append(format!(
                        "the model asks to run {}; waiting for a person to approve it (waitpoint {}, times out in {})",
                        call.shown(),
                        w.id,
                        seconds(timeout)
                    ))?;
                }
                notify(w, token, &call)
            })?;
        let (w, line, answer) = match wait {
            // Return at once: the handler runs again from the top once the waitpoint is
            // settled. The claim is over; the return value is ignored.
            Wait::Suspended => return Ok(Vec::new()),
            Wait::Completed(w) => match decision(&w) {
                Decision::Approved => return approved(claim, &model, &request, &call, &w),
                Decision::Rejected(reason) => {
                    let why = reason.map(|r| format!(" ({r})")).unwrap_or_default();
                    let line = format!("rejected by {}{why}: {} was not run", by(&w), call.tool);
                    let answer = format!("I did not run {}: a person rejected it{why}.", call.tool);
                    (w, line, answer)
                }
                Decision::Unreadable => {
                    let line = format!(
                        "the answer {:?} is not {{\"approved\": true|false}}: {} was not run",
                        w.text(),
                        call.tool
                    );
                    let answer = format!("I did not run {}: the approval was unclear.", call.tool);
                    (w, line, answer)
                }
            },
            Wait::TimedOut(w) => {
                let line = format!(
                    "nobody answered within {}: gave up, {} was not run",
                    seconds(timeout),
                    call.tool
                );
                let answer = format!("I gave up on {}: nobody approved it in time.", call.tool);
                (w, line, answer)
            }
            Wait::Cancelled(w) => {
                let line = format!(
                    "the approval was cancelled by {}: {} was not run",
                    by(&w),
                    call.tool
                );
                let answer = format!("I did not run {}: the approval was cancelled.", call.tool);
                (w, line, answer)
            }
        };
        let mut log = Log::read(claim)?;
        log.note(claim, &w.id, line)?;
        finish(claim, &mut log, &w, answer)
    }
}

/// Who settled the waitpoint (`token`, `operator:<name>`, `cli`, ...).
fn by(w: &Waitpoint) -> &str {
    w.settled_by.as_deref().unwrap_or("?")
}

/// Runs the approved call and answers with its result.
fn approved(
    claim: &Claim,
    model: &Model,
    request: &str,
    call: &ToolCall,
    w: &Waitpoint,
) -> Result<Vec<u8>, String> {
    let mut log = Log::read(claim)?;
    let done = log
        .after(&w.id)
        .iter()
        .find_map(|l| l.strip_prefix("answer: "));
    if let Some(answer) = done {
        // A retry after the answer was logged: nothing is left to do.
        return Ok(answer.as_bytes().to_vec());
    }
    let result = run_tool(&call.tool, &call.arguments);
    homing_guest::info!(
        "{} approved by {}: {} = {result}",
        w.name,
        by(w),
        call.shown()
    );
    log.note(
        claim,
        &w.id,
        format!("approved by {}: ran {} = {result}", by(w), call.shown()),
    )?;
    let answer = model.answer(request, call, &result)?;
    finish(claim, &mut log, w, answer)
}

/// Logs the answer (once) and returns it as the output.
fn finish(claim: &Claim, log: &mut Log, w: &Waitpoint, answer: String) -> Result<Vec<u8>, String> {
    log.note(claim, &w.id, format!("answer: {answer}"))?;
    Ok(answer.into_bytes())
}

homing_guest::export_handler!(Approval);

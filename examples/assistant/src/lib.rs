//! `assistant`: an agent that talks to an OpenAI-compatible chat-completions endpoint and
//! runs a tool when the model asks for one.
//!
//! The payload is one user message (text). The conversation is the thread log: one JSON entry
//! per chat message, `{"dispatch": "<id>", "message": {"role": ..., ...}}`, and each message
//! sent into the thread and acknowledged (a user turn). A dispatch the inbox started (empty
//! payload: a message arrived while no run was live, or interrupted the run that was) takes
//! the pending messages as the user's turn. Tool calls a stopped run left without results are
//! answered as unfinished before each model call (`homing_guest::history`), so a thread whose
//! run was interrupted mid-tool stays usable; the entries of a run a `rollback` message stopped
//! are left out (`homing_guest::unmasked`). On each dispatch the
//! agent reads the log, appends the user's message, and POSTs
//! `{model, messages, tools}` to `{base_url}/chat/completions` with
//! `authorization: Bearer <api_key>`. When the reply asks for a tool (`tool_calls`), the agent
//! runs it here, appends the call and its result, and asks again; the model's final text is
//! appended and returned as the dispatch's output.
//!
//! The model is asked to stream (`"stream": true`): the reply arrives as server-sent events,
//! and each piece of its text is passed on to whoever watches the dispatch (`claim.emit_text`)
//! as it comes, while the whole reply is put together for the log and the output as before. A
//! server that answers with plain JSON instead is read the old way. Streaming is best effort: a
//! host that refuses a chunk (its stream limits) gets no more of that reply, and the run goes
//! on.
//!
//! The tools are its own `add` (two numbers; the sum), enough to show the round trip; or, when
//! the variable `mcp_server` names one of the plugin's MCP servers (`[plugins.assistant.mcp.NAME]`),
//! that server's tools, called through the host: the host holds the server's URL and
//! credentials, lets the plugin call only what its `tools` allow, and holds a call its
//! `approval` rules name for a person (the run then suspends, holding no worker, and runs
//! again once the call is approved or rejected). The model is told what came back, a
//! rejection included.
//!
//! Variables (`[plugins.assistant.variables]` in `homing.toml`, read over `wasi:config`):
//! `base_url` (required), `model` (required), `api_key` (a secret; without it no
//! `authorization` header is sent, as a local Ollama wants) and `mcp_server` (optional). The
//! key is never logged, stored or returned.
//!
//! Every step is in the log before the next starts, so a retry (after a timeout or a failed
//! request) resumes where the last attempt stopped instead of asking the model again for an
//! answer already recorded: the user's message is not appended twice, a tool call already
//! answered is not run again, and a final answer already written is returned as it is.

use std::time::Duration;

use homing_guest::http::Request;
use homing_guest::{Claim, Error, Handler, McpOutcome, config};
use serde_json::{Value, json};

mod sse;

/// The most model calls per dispatch: a model that keeps asking for tools is stopped here.
const MAX_ROUNDS: usize = 4;

/// A model call's deadline.
const MODEL_TIMEOUT: Duration = Duration::from_secs(60);

/// The largest model reply read. A streamed reply spends some 200 bytes of event JSON per
/// token, so this is room for tens of thousands of tokens.
const MAX_REPLY_BYTES: usize = 8 << 20;

/// The system prompt, sent first on every call (not stored in the log).
const SYSTEM: &str = "You are a concise assistant running as a Homing agent. \
    When a question needs arithmetic, call the `add` tool rather than adding in your head.";

/// Where the tools come from: the agent's own `add`, or an MCP server through the host.
enum Tools {
    Own,
    Mcp(String),
}

impl Tools {
    fn from_config() -> Result<Tools, String> {
        Ok(match config::get("mcp_server")?.filter(|s| !s.is_empty()) {
            Some(server) => Tools::Mcp(server),
            None => Tools::Own,
        })
    }

    /// The tools offered to the model, in the chat-completions `tools` format.
    fn offered(&self, claim: &Claim) -> Result<Value, String> {
        let Tools::Mcp(server) = self else {
            return Ok(tools());
        };
        let listed = claim.mcp_tools(server).map_err(|e| e.to_string())?;
        Ok(Value::Array(
            listed
                .into_iter()
                .map(|t| {
                    let parameters: Value = serde_json::from_str(&t.input_schema)
                        .unwrap_or_else(|_| json!({"type": "object"}));
                    json!({"type": "function", "function": {
                        "name": t.name,
                        "description": t.description.unwrap_or_default(),
                        "parameters": parameters,
                    }})
                })
                .collect(),
        ))
    }

    /// Runs tool `name` with its JSON-encoded `arguments`: the tool message's content, or
    /// `None` when the call waits for a person's approval (the run has suspended).
    fn run(&self, claim: &Claim, name: &str, arguments: &str) -> Result<Option<String>, String> {
        let Tools::Mcp(server) = self else {
            return Ok(Some(run_tool(name, arguments)));
        };
        Ok(Some(match claim.mcp_call_or_suspend(server, name, arguments) {
            Ok(None) => return Ok(None),
            Ok(Some(McpOutcome::Done(result))) if result.is_error => {
                format!("error: {}", result.text())
            }
            Ok(Some(McpOutcome::Done(result))) => result.text(),
            Ok(Some(McpOutcome::Rejected(why))) => format!("the call was not run: {why}"),
            Ok(Some(McpOutcome::Unknown(why))) => {
                format!("whether the call ran is unknown: {why}")
            }
            Ok(Some(McpOutcome::NeedsApproval(_))) => "the call waits for approval".to_owned(),
            // The claim is gone: this run stops (another runs it).
            Err(e) if e.claim_is_gone() => return Err(e.to_string()),
            // A refusal (not allowed, a bad argument): for the model to see and correct.
            Err(e) => format!("error: {e}"),
        }))
    }
}

/// The agent's own tools, in the chat-completions `tools` format.
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

/// Runs the tool `name` with its JSON-encoded `arguments`; the result is the tool message's
/// content. A bad call is answered with an error text, for the model to see and correct.
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

    /// One chat-completions call, asked to stream; returns the reply's message (role,
    /// content, tool calls). The reply's text is streamed to the dispatch's watchers token by
    /// token as it arrives ([`Stream`]). A server that answers with plain JSON instead is read
    /// the old way.
    fn complete(&self, claim: &Claim, history: &[Value], tools: &Value) -> Result<Value, String> {
        let mut messages = vec![json!({"role": "system", "content": SYSTEM})];
        messages.extend(history.iter().cloned());
        // A run stopped between a reply asking for tools and their results (an interrupting
        // message) left calls no result will ever answer; the model refuses such a history.
        let closed = homing_guest::history::close_tool_calls_openai(&mut messages);
        if closed > 0 {
            homing_guest::info!("{closed} tool call(s) of a stopped run answered as unfinished");
        }
        // The usage in a last chunk: the host reads it when its [pricing] lists the origin.
        let body = json!({
            "model": self.name, "messages": messages, "tools": tools, "stream": true,
            "stream_options": {"include_usage": true}
        });
        let mut request = Request::post(&self.url)
            .header("accept", "text/event-stream, application/json")
            .timeout(MODEL_TIMEOUT)
            .max_response_bytes(MAX_REPLY_BYTES);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let mut response = request.json(&body)?.send_streaming()?;
        if !response.is_success() {
            // The status only: an error body may echo parts of the request.
            return Err(format!(
                "the model server answered HTTP {} to POST {}",
                response.status, self.url
            ));
        }
        let streamed = response.header("content-type").is_some_and(|t| {
            t.trim()
                .to_ascii_lowercase()
                .starts_with("text/event-stream")
        });
        if !streamed {
            return kept_message(&response.into_response()?.json()?);
        }

        let mut events = sse::Events::default();
        let mut reply = sse::Reply::default();
        let mut stream = Stream::new(claim);
        let mut done = false;
        while !done {
            let Some(piece) = response.read_chunk()? else {
                break;
            };
            for data in events.push(&piece)? {
                if data.trim() == "[DONE]" {
                    done = true;
                    break;
                }
                let chunk: Value = serde_json::from_str(&data)
                    .map_err(|_| "the model streamed an event that is not JSON".to_owned())?;
                let text = reply.add(&chunk)?;
                stream.emit(&text)?;
            }
        }
        if done {
            // Read the body to its end (what follows `[DONE]` is only the stream's close), so
            // the request ends cleanly; a failure there no longer matters.
            while let Ok(Some(_)) = response.read_chunk() {}
        } else if reply.finished.is_none() {
            return Err("the model's stream ended before its reply did".to_owned());
        }
        Ok(reply.message())
    }
}

/// A non-streamed reply's message, keeping what the next call needs; fields some servers add
/// (refusal, annotations) are dropped.
fn kept_message(reply: &Value) -> Result<Value, String> {
    let message = &reply["choices"][0]["message"];
    if !message.is_object() {
        return Err("the model's reply has no choices[0].message".to_owned());
    }
    let mut kept = json!({"role": "assistant", "content": message["content"]});
    if let Some(calls) = message["tool_calls"].as_array().filter(|c| !c.is_empty()) {
        kept["tool_calls"] = Value::Array(calls.clone());
    }
    Ok(kept)
}

/// Streams a reply's text to the dispatch's watchers with `claim.emit_text`. Streaming is a
/// courtesy: when the host refuses a chunk (over its stream limits, or a host that does not
/// stream) the rest of this reply is not streamed and the run goes on; only a claim that is
/// gone stops it.
struct Stream<'c, 'a> {
    claim: &'c Claim<'a>,
    on: bool,
}

impl<'c, 'a> Stream<'c, 'a> {
    fn new(claim: &'c Claim<'a>) -> Self {
        Stream { claim, on: true }
    }

    fn emit(&mut self, text: &str) -> Result<(), Error> {
        if !self.on {
            return Ok(());
        }
        match self.claim.emit_text(text) {
            Ok(_) => Ok(()),
            Err(error) if error.claim_is_gone() => Err(error),
            Err(error) => {
                homing_guest::warn!("not streaming the rest of this reply: {error}");
                self.on = false;
                Ok(())
            }
        }
    }
}

/// The thread log as chat messages, with the dispatch that wrote each.
struct Conversation {
    messages: Vec<Value>,
    /// Which of `messages` this dispatch wrote (on a retry, some already are).
    mine: Vec<bool>,
}

impl Conversation {
    fn read(claim: &Claim) -> Result<(Conversation, u64), Error> {
        let log = claim.read_log_all()?;
        let latest = log.last().map_or(0, |entry| entry.seq);
        // What a `rollback` message masked (a stopped run's turn) is not the conversation.
        let log = homing_guest::unmasked(log);
        let mut conversation = Conversation {
            messages: Vec::new(),
            mine: Vec::new(),
        };
        for entry in &log {
            // A message sent into the thread and acknowledged is the user's turn.
            if entry.message.is_some() {
                let text = entry.text().unwrap_or("(a message that is not text)");
                conversation.mine.push(false);
                conversation
                    .messages
                    .push(json!({"role": "user", "content": text}));
                continue;
            }
            // Entries this agent did not write (not its JSON shape) are skipped: turn marks,
            // other writers' entries.
            let Ok(value) = entry.json::<Value>() else {
                continue;
            };
            if value["message"]["role"].is_string() {
                conversation
                    .mine
                    .push(value["dispatch"].as_str() == Some(claim.id()));
                conversation.messages.push(value["message"].clone());
            }
        }
        Ok((conversation, latest))
    }

    /// Appends `message` to the log (as written by this dispatch) and to the conversation.
    fn push(&mut self, claim: &Claim, message: Value) -> Result<(), Error> {
        claim.append_json(&json!({"dispatch": claim.id(), "message": message}))?;
        self.messages.push(message);
        self.mine.push(true);
        Ok(())
    }

    /// This dispatch's last message, if it wrote any.
    fn last_mine(&self) -> Option<&Value> {
        match (self.messages.last(), self.mine.last()) {
            (Some(message), Some(true)) => Some(message),
            _ => None,
        }
    }

    /// Whether a tool message after the last assistant message answers the call `id` (ids
    /// are unique only within one reply: some servers reuse them across turns).
    fn answered(&self, id: &str) -> bool {
        self.messages
            .iter()
            .rev()
            .take_while(|m| m["role"] != "assistant")
            .any(|m| m["role"] == "tool" && m["tool_call_id"].as_str() == Some(id))
    }
}

struct Assistant;

impl Handler for Assistant {
    fn handle(claim: &Claim) -> Result<Vec<u8>, String> {
        let text = claim.payload_str()?.to_owned();
        let model = Model::from_config()?;
        let tools = Tools::from_config()?;
        let (mut conversation, latest) = Conversation::read(claim)?;

        if text.is_empty() {
            // Started by the inbox (a message arrived while no run was live, or one interrupted
            // the last run): the pending messages are the user's turn. Acknowledging one
            // appends it to the log, where a retry reads it back.
            for message in claim.messages() {
                let message = message?;
                let text = message.text().unwrap_or("(a message that is not text)").to_owned();
                claim.ack_message(message.seq)?;
                conversation
                    .messages
                    .push(json!({"role": "user", "content": text}));
                conversation.mine.push(true);
            }
        } else if !conversation.mine.contains(&true) {
            let user =
                json!({"dispatch": claim.id(), "message": {"role": "user", "content": text}});
            match claim.append_expected(homing_guest::json::to_vec(&user)?, latest) {
                Ok(_) => {}
                Err(Error::Conflict(_)) => {
                    return Err("the thread log changed while reading it; retrying".to_owned());
                }
                Err(error) => return Err(error.into()),
            }
            conversation.messages.push(user["message"].clone());
            conversation.mine.push(true);
        }

        // Listed once, when the model is first asked.
        let mut offered: Option<Value> = None;
        for _ in 0..MAX_ROUNDS {
            let last = conversation.last_mine().cloned().unwrap_or(Value::Null);
            if last["role"] == "assistant" {
                let calls = last["tool_calls"].as_array().cloned().unwrap_or_default();
                if calls.is_empty() {
                    let answer = last["content"].as_str().unwrap_or_default().to_owned();
                    return Ok(answer.into_bytes());
                }
                for call in &calls {
                    let id = call["id"].as_str().unwrap_or_default();
                    if conversation.answered(id) {
                        continue;
                    }
                    let name = call["function"]["name"].as_str().unwrap_or_default();
                    let arguments = call["function"]["arguments"].as_str().unwrap_or("{}");
                    let Some(result) = tools.run(claim, name, arguments)? else {
                        // Waiting for approval: suspended; the next run makes the same call.
                        return Ok(Vec::new());
                    };
                    homing_guest::info!("tool {name}({arguments}) -> {result}");
                    conversation.push(
                        claim,
                        json!({"role": "tool", "tool_call_id": id, "content": result}),
                    )?;
                }
            }
            let offered = match &offered {
                Some(offered) => offered,
                None => offered.insert(tools.offered(claim)?),
            };
            let reply = model.complete(claim, &conversation.messages, offered)?;
            conversation.push(claim, reply)?;
        }
        match conversation.last_mine() {
            Some(last) if last["role"] == "assistant" && last["tool_calls"].is_null() => {
                Ok(last["content"]
                    .as_str()
                    .unwrap_or_default()
                    .as_bytes()
                    .to_vec())
            }
            _ => Err(format!(
                "the model still asked for tools after {MAX_ROUNDS} calls; giving up"
            )),
        }
    }
}

homing_guest::export_handler!(Assistant);

//! Server-sent events, as a chat-completions server streams them (`"stream": true`): the
//! events' `data` fields cut out of a body that arrives in arbitrary pieces, and the reply put
//! back together from its `chat.completion.chunk` deltas.

use serde_json::{Value, json};

/// The most tool calls one streamed reply may build (a bound on what the network can make the
/// guest allocate).
const MAX_TOOL_CALLS: usize = 64;

/// Splits a byte stream into events and hands out each event's `data` (its `data:` lines
/// joined with `\n`). Lines may end in `\n` or `\r\n`; a piece may end anywhere, even inside a
/// UTF-8 character: the partial line waits for the next piece.
#[derive(Debug, Default)]
pub struct Events {
    /// Bytes after the last complete line.
    partial: Vec<u8>,
    /// The `data` lines of the event being read.
    data: Option<String>,
}

impl Events {
    /// Takes the next piece of the body; returns the data of every event it completed.
    ///
    /// # Errors
    ///
    /// When a line is not UTF-8.
    pub fn push(&mut self, piece: &[u8]) -> Result<Vec<String>, String> {
        self.partial.extend_from_slice(piece);
        let mut complete = Vec::new();
        let mut start = 0;
        while let Some(end) = self.partial[start..].iter().position(|&b| b == b'\n') {
            let line = &self.partial[start..start + end];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let line = std::str::from_utf8(line)
                .map_err(|_| "the model's event stream is not UTF-8".to_owned())?;
            if line.is_empty() {
                complete.extend(self.data.take());
            } else if let Some(value) = field(line, "data") {
                match &mut self.data {
                    Some(data) => {
                        data.push('\n');
                        data.push_str(value);
                    }
                    None => self.data = Some(value.to_owned()),
                }
            }
            // Other fields (`event`, `id`, `retry`) and comments (`:`) are not needed here.
            start += end + 1;
        }
        self.partial.drain(..start);
        Ok(complete)
    }
}

/// The value of `line` when it is field `name` (`name:value`, one leading space dropped).
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let value = line.strip_prefix(name)?.strip_prefix(':')?;
    Some(value.strip_prefix(' ').unwrap_or(value))
}

/// A reply being put together from `chat.completion.chunk` deltas.
#[derive(Debug, Default)]
pub struct Reply {
    content: String,
    /// `{id, type, function: {name, arguments}}` by the delta's `index`.
    tool_calls: Vec<Value>,
    /// The `finish_reason`, once a chunk gave one.
    pub finished: Option<String>,
}

impl Reply {
    /// Adds one chunk; returns the text it adds to the reply (`delta.content`), maybe empty.
    ///
    /// # Errors
    ///
    /// When the chunk reports an error or builds more than [`MAX_TOOL_CALLS`] tool calls.
    pub fn add(&mut self, chunk: &Value) -> Result<String, String> {
        if !chunk["error"].is_null() {
            // Its text may echo the request: not repeated here.
            return Err("the model server reported an error in its stream".to_owned());
        }
        let choice = &chunk["choices"][0];
        if let Some(reason) = choice["finish_reason"].as_str() {
            self.finished = Some(reason.to_owned());
        }
        let delta = &choice["delta"];
        let text = delta["content"].as_str().unwrap_or_default().to_owned();
        self.content.push_str(&text);
        for (position, call) in delta["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let index = call["index"]
                .as_u64()
                .and_then(|i| usize::try_from(i).ok())
                .unwrap_or(position);
            if index >= MAX_TOOL_CALLS {
                return Err(format!(
                    "the model's reply has more than {MAX_TOOL_CALLS} tool calls"
                ));
            }
            while self.tool_calls.len() <= index {
                self.tool_calls.push(json!({
                    "id": "", "type": "function", "function": {"name": "", "arguments": ""}
                }));
            }
            let built = &mut self.tool_calls[index];
            for key in ["id", "type"] {
                if let Some(value) = call[key].as_str() {
                    built[key] = Value::from(value);
                }
            }
            // Names and arguments come in pieces; the pieces join.
            for key in ["name", "arguments"] {
                if let Some(piece) = call["function"][key].as_str() {
                    let joined =
                        format!("{}{piece}", built["function"][key].as_str().unwrap_or(""));
                    built["function"][key] = Value::from(joined);
                }
            }
        }
        Ok(text)
    }

    /// The reply as the chat message the next call sends back: `role`, `content` (`null` for
    /// a reply of tool calls only) and `tool_calls` when there are any.
    pub fn message(self) -> Value {
        let content = if self.content.is_empty() && !self.tool_calls.is_empty() {
            Value::Null
        } else {
            Value::from(self.content)
        };
        let mut message = json!({"role": "assistant", "content": content});
        if !self.tool_calls.is_empty() {
            message["tool_calls"] = Value::Array(self.tool_calls);
        }
        message
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(pieces: &[&[u8]]) -> Vec<String> {
        let mut events = Events::default();
        let mut out = Vec::new();
        for piece in pieces {
            out.extend(events.push(piece).unwrap_or_default());
        }
        out
    }

    #[test]
    fn events_are_found_across_pieces() {
        let body = "data: {\"a\":1}\n\n: a comment\r\ndata: x\r\ndata:y\r\n\r\ndata: [DONE]\n\n";
        let whole = events(&[body.as_bytes()]);
        assert_eq!(whole, ["{\"a\":1}", "x\ny", "[DONE]"]);
        let bytes = body.as_bytes();
        for cut in 0..bytes.len() {
            assert_eq!(
                events(&[&bytes[..cut], &bytes[cut..]]),
                whole,
                "cut at {cut}"
            );
        }
        let one_by_one: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(events(&one_by_one), whole);
    }

    #[test]
    fn a_character_split_across_pieces_waits_for_its_rest() {
        let body = "data: caf\u{e9}\n\n".as_bytes();
        let cut = body.len() - 3; // inside the two bytes of `é`
        assert_eq!(events(&[&body[..cut], &body[cut..]]), ["caf\u{e9}"]);
    }

    #[test]
    fn a_reply_is_put_together_from_its_deltas() {
        let mut reply = Reply::default();
        let chunks = [
            json!({"choices": [{"delta": {"role": "assistant", "content": ""}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                "function": {"name": "add", "arguments": ""}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\": 1"}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": ", \"b\": 2}"}}]}}]}),
            json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}),
        ];
        for chunk in &chunks {
            assert_eq!(reply.add(chunk), Ok(String::new()));
        }
        assert_eq!(reply.finished.as_deref(), Some("tool_calls"));
        let message = reply.message();
        assert_eq!(message["content"], Value::Null);
        assert_eq!(message["tool_calls"][0]["id"], "c1");
        assert_eq!(message["tool_calls"][0]["function"]["name"], "add");
        assert_eq!(
            message["tool_calls"][0]["function"]["arguments"],
            "{\"a\": 1, \"b\": 2}"
        );

        let mut text = Reply::default();
        for token in ["The", " answer", " is 3."] {
            let chunk = json!({"choices": [{"delta": {"content": token}}]});
            assert_eq!(text.add(&chunk).as_deref(), Ok(token));
        }
        let message = text.message();
        assert_eq!(message["content"], "The answer is 3.");
        assert!(message["tool_calls"].is_null());
    }

    #[test]
    fn hostile_chunks_are_refused_not_trusted() {
        let mut reply = Reply::default();
        let far = json!({"choices": [{"delta": {"tool_calls": [{"index": 1_000_000_000u64}]}}]});
        assert!(reply.add(&far).is_err());
        assert!(reply.add(&json!({"error": {"message": "boom"}})).is_err());
        // Missing or odd fields are skipped.
        assert_eq!(reply.add(&json!({"choices": "nope"})), Ok(String::new()));
        assert_eq!(reply.add(&json!(42)), Ok(String::new()));
    }
}

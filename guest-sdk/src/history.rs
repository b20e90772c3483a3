//! Chat histories a model accepts after a run was stopped half way.
//!
//! A run stopped between a model's reply and the results of the tools it asked for (an
//! `interrupt` message, a cancelled or superseded dispatch) leaves the conversation with tool
//! calls that never got a result. Model APIs refuse such a history: every later call on the
//! thread fails, and the thread is dead. The thread log marks where the host stopped a turn
//! ([`LogEntry::turn`](crate::LogEntry)); these helpers close what the stopped run left open,
//! so the next turn's model call is valid.
//!
//! Each takes the conversation as the model API's messages (JSON values, oldest first), adds an
//! error result for every tool call that a later message shows will never be answered, and
//! returns how many it added. A tool call at the very end of the list, with nothing after it,
//! is left alone: the caller may be about to run it. So call them on the history with the new
//! turn's input appended. Calls already answered, and everything else, are kept as they are.
//!
//! The same cases (`testdata/tool_calls.json`) are checked against the Python
//! (`homing_guest.history`) and JavaScript (`homing-guest/history`) versions.

use serde_json::{Value, json};

/// The text of a result added for a tool call the stopped run never answered.
pub const UNANSWERED: &str =
    "error: this tool call was never finished: the run that made it was stopped";

/// OpenAI chat-completions messages: after an `assistant` message with `tool_calls`, a
/// `{"role": "tool", "tool_call_id": ..., "content": UNANSWERED}` is added, after the tool
/// messages that follow it, for each call none of them answers.
pub fn close_tool_calls_openai(messages: &mut Vec<Value>) -> usize {
    let mut added = 0;
    let mut i = 0;
    while i < messages.len() {
        let calls = call_ids(&messages[i], "assistant", |m| {
            m.get("tool_calls").and_then(Value::as_array)
        });
        i += 1;
        if calls.is_empty() {
            continue;
        }
        let mut answered = Vec::new();
        while let Some(m) = messages.get(i).filter(|m| m["role"] == "tool") {
            answered.push(m["tool_call_id"].clone());
            i += 1;
        }
        if i == messages.len() {
            break;
        }
        for id in calls.into_iter().filter(|id| !answered.contains(id)) {
            messages.insert(
                i,
                json!({"role": "tool", "tool_call_id": id, "content": UNANSWERED}),
            );
            i += 1;
            added += 1;
        }
    }
    added
}

/// Anthropic messages: after an `assistant` message whose content has `tool_use` blocks, the
/// next `user` message gets a `{"type": "tool_result", "tool_use_id": ..., "is_error": true,
/// "content": UNANSWERED}` block, after the results it already has (results come first in a
/// user message), for each call it does not answer; a text content becomes a text block. When
/// the next message is not the user's, a user message with the results is put before it.
pub fn close_tool_calls_anthropic(messages: &mut Vec<Value>) -> usize {
    let mut added = 0;
    let mut i = 0;
    while i < messages.len() {
        let calls = call_ids(&messages[i], "assistant", |m| {
            m.get("content").and_then(Value::as_array)
        });
        i += 1;
        if calls.is_empty() || i == messages.len() {
            continue;
        }
        if messages[i]["role"] != "user" {
            messages.insert(i, json!({"role": "user", "content": []}));
        }
        let content = &mut messages[i]["content"];
        if let Some(text) = content.as_str() {
            *content = json!([{"type": "text", "text": text}]);
        }
        let Some(blocks) = content.as_array_mut() else {
            continue;
        };
        let results = blocks
            .iter()
            .take_while(|b| b["type"] == "tool_result")
            .count();
        let answered: Vec<Value> = blocks
            .iter()
            .filter(|b| b["type"] == "tool_result")
            .map(|b| b["tool_use_id"].clone())
            .collect();
        let missing: Vec<Value> = calls
            .into_iter()
            .filter(|id| !answered.contains(id))
            .map(|id| {
                json!({"type": "tool_result", "tool_use_id": id, "is_error": true, "content": UNANSWERED})
            })
            .collect();
        added += missing.len();
        blocks.splice(results..results, missing);
    }
    added
}

/// The ids of the tool calls `message` makes, when its role is `role`: the `id` of each item
/// of the list `calls` finds in it that is a call (OpenAI's `tool_calls` items, Anthropic's
/// `tool_use` blocks).
fn call_ids<'a>(
    message: &'a Value,
    role: &str,
    calls: impl Fn(&'a Value) -> Option<&'a Vec<Value>>,
) -> Vec<Value> {
    if message["role"] != role {
        return Vec::new();
    }
    calls(message)
        .into_iter()
        .flatten()
        .filter(|c| {
            c.get("type")
                .is_none_or(|t| t == "function" || t == "tool_use")
        })
        .filter_map(|c| c.get("id").cloned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cases every SDK's version is checked against.
    const CASES: &str = include_str!("../testdata/tool_calls.json");

    #[test]
    fn the_shared_cases_come_out_as_expected() -> Result<(), serde_json::Error> {
        let cases: Vec<Value> = serde_json::from_str(CASES)?;
        assert!(cases.len() >= 8);
        for case in cases {
            let mut messages = case["input"].as_array().cloned().unwrap_or_default();
            assert!(!messages.is_empty(), "{}", case["name"]);
            let added = match case["format"].as_str() {
                Some("openai") => close_tool_calls_openai(&mut messages),
                Some("anthropic") => close_tool_calls_anthropic(&mut messages),
                other => {
                    assert_eq!(other, Some("openai or anthropic"), "{}", case["name"]);
                    0
                }
            };
            let name = &case["name"];
            assert_eq!(Value::Array(messages), case["expected"], "{name}");
            assert_eq!(Some(added as u64), case["added"].as_u64(), "{name}");
        }
        Ok(())
    }
}

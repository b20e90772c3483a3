// Chat histories a model accepts after a run was stopped half way.
//
// A run stopped between a model's reply and the results of the tools it asked for (an
// `interrupt` message, a cancelled or superseded dispatch) leaves the conversation with tool
// calls that never got a result, and model APIs refuse such a history on every later call. The
// thread log marks where the host stopped a turn (a log entry's `turn`); these helpers close
// what the stopped run left open, so the next turn's model call is valid.
//
// Each takes the conversation as the model API's messages (objects, oldest first), changes it
// in place, adds an error result for every tool call that a later message shows will never be
// answered, and returns how many it added. A tool call at the very end of the list is left
// alone: the caller may be about to run it. So call them on the history with the new turn's
// input appended.
//
// This module imports nothing from the bindings: it is plain JavaScript. The same cases as the
// Rust (`homing_guest::history`) and Python (`homing_guest.history`) versions check it.

/** The text of a result added for a tool call the stopped run never answered. */
export const UNANSWERED =
  'error: this tool call was never finished: the run that made it was stopped';

function callIds(message, calls) {
  if (!message || message.role !== 'assistant') return [];
  const items = calls(message);
  if (!Array.isArray(items)) return [];
  return items
    .filter((c) => c && typeof c === 'object' && 'id' in c)
    .filter((c) => c.type === undefined || c.type === 'function' || c.type === 'tool_use')
    .map((c) => c.id);
}

/**
 * OpenAI chat-completions messages: after an `assistant` message with `tool_calls`, a
 * `{role: 'tool', tool_call_id, content: UNANSWERED}` is added, after the tool messages that
 * follow it, for each call none of them answers.
 */
export function closeToolCallsOpenai(messages) {
  let added = 0;
  let i = 0;
  while (i < messages.length) {
    const calls = callIds(messages[i], (m) => m.tool_calls);
    i += 1;
    if (calls.length === 0) continue;
    const answered = [];
    while (i < messages.length && messages[i].role === 'tool') {
      answered.push(messages[i].tool_call_id);
      i += 1;
    }
    if (i === messages.length) break;
    for (const id of calls) {
      if (answered.includes(id)) continue;
      messages.splice(i, 0, { role: 'tool', tool_call_id: id, content: UNANSWERED });
      i += 1;
      added += 1;
    }
  }
  return added;
}

/**
 * Anthropic messages: after an `assistant` message whose content has `tool_use` blocks, the
 * next `user` message gets a `{type: 'tool_result', tool_use_id, is_error: true, content:
 * UNANSWERED}` block, after the results it already has, for each call it does not answer; a
 * text content becomes a text block. When the next message is not the user's, a user message
 * with the results is put before it.
 */
export function closeToolCallsAnthropic(messages) {
  let added = 0;
  let i = 0;
  while (i < messages.length) {
    const calls = callIds(messages[i], (m) => m.content);
    i += 1;
    if (calls.length === 0 || i === messages.length) continue;
    if (messages[i].role !== 'user') messages.splice(i, 0, { role: 'user', content: [] });
    if (typeof messages[i].content === 'string') {
      messages[i].content = [{ type: 'text', text: messages[i].content }];
    }
    const content = messages[i].content;
    if (!Array.isArray(content)) continue;
    let results = 0;
    while (results < content.length && content[results].type === 'tool_result') results += 1;
    const answered = content.filter((b) => b.type === 'tool_result').map((b) => b.tool_use_id);
    const missing = calls
      .filter((id) => !answered.includes(id))
      .map((id) => ({ type: 'tool_result', tool_use_id: id, is_error: true, content: UNANSWERED }));
    content.splice(results, 0, ...missing);
    added += missing.length;
  }
  return added;
}

/** The log entries a reader of the conversation keeps: all but those a `rollback` message
 * masked (a mark's `turn.masked`, `{first, last}`: the stopped run's entries, still stored). A
 * mark comes after what it masks, so give it entries read to the log's end, as
 * `claim.readLogAll()` returns them. The marks themselves are kept. */
export function unmasked(entries) {
  const masks = entries
    .map((e) => (e && e.turn ? e.turn.masked : undefined))
    .filter((m) => m !== undefined && m !== null);
  if (masks.length === 0) return [...entries];
  return entries.filter((e) => !masks.some((m) => m.first <= e.seq && e.seq <= m.last));
}

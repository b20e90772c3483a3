"""Chat histories a model accepts after a run was stopped half way.

A run stopped between a model's reply and the results of the tools it asked for (an
`interrupt` message, a cancelled or superseded dispatch) leaves the conversation with tool
calls that never got a result, and model APIs refuse such a history on every later call. The
thread log marks where the host stopped a turn (a log entry's `turn`); these helpers close what
the stopped run left open, so the next turn's model call is valid.

Each takes the conversation as the model API's messages (dicts, oldest first), changes it in
place, adds an error result for every tool call that a later message shows will never be
answered, and returns how many it added. A tool call at the very end of the list is left alone:
the caller may be about to run it. So call them on the history with the new turn's input
appended.

This module imports nothing from the bindings: it is plain Python. The same cases as the Rust
(`homing_guest::history`) and JavaScript (`homing-guest/history`) versions check it.
"""

UNANSWERED = "error: this tool call was never finished: the run that made it was stopped"


def _call_ids(message, calls):
    if message.get("role") != "assistant":
        return []
    items = calls(message)
    if not isinstance(items, list):
        return []
    return [
        c["id"]
        for c in items
        if isinstance(c, dict) and c.get("type", "function") in ("function", "tool_use") and "id" in c
    ]


def close_tool_calls_openai(messages):
    """OpenAI chat-completions messages: after an `assistant` message with `tool_calls`, a
    `{"role": "tool", "tool_call_id": ..., "content": UNANSWERED}` is added, after the tool
    messages that follow it, for each call none of them answers."""
    added = 0
    i = 0
    while i < len(messages):
        calls = _call_ids(messages[i], lambda m: m.get("tool_calls"))
        i += 1
        if not calls:
            continue
        answered = []
        while i < len(messages) and messages[i].get("role") == "tool":
            answered.append(messages[i].get("tool_call_id"))
            i += 1
        if i == len(messages):
            break
        for call in calls:
            if call not in answered:
                messages.insert(i, {"role": "tool", "tool_call_id": call, "content": UNANSWERED})
                i += 1
                added += 1
    return added


def close_tool_calls_anthropic(messages):
    """Anthropic messages: after an `assistant` message whose content has `tool_use` blocks, the
    next `user` message gets a `{"type": "tool_result", "tool_use_id": ..., "is_error": True,
    "content": UNANSWERED}` block, after the results it already has, for each call it does not
    answer; a text content becomes a text block. When the next message is not the user's, a
    user message with the results is put before it."""
    added = 0
    i = 0
    while i < len(messages):
        calls = _call_ids(messages[i], lambda m: m.get("content"))
        i += 1
        if not calls or i == len(messages):
            continue
        if messages[i].get("role") != "user":
            messages.insert(i, {"role": "user", "content": []})
        content = messages[i].get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
            messages[i]["content"] = content
        if not isinstance(content, list):
            continue
        results = 0
        while results < len(content) and content[results].get("type") == "tool_result":
            results += 1
        answered = [b.get("tool_use_id") for b in content if b.get("type") == "tool_result"]
        missing = [
            {"type": "tool_result", "tool_use_id": call, "is_error": True, "content": UNANSWERED}
            for call in calls
            if call not in answered
        ]
        content[results:results] = missing
        added += len(missing)
    return added


def unmasked(entries):
    """The log entries a reader of the conversation keeps: all but those a `rollback` message
    masked (a mark's `turn.masked`, `(first, last)`: the stopped run's entries, still stored).
    A mark comes after what it masks, so give it entries read to the log's end, as
    `Claim.read_log_all()` returns them. The marks themselves are kept."""
    masks = []
    for entry in entries:
        turn = getattr(entry, "turn", None)
        masked = getattr(turn, "masked", None) if turn is not None else None
        if masked is not None:
            masks.append((masked[0], masked[1]))
    if not masks:
        return list(entries)
    return [e for e in entries if not any(first <= e.seq <= last for first, last in masks)]

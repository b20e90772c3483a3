"""The `{{name}}` agent (Homing's `handler` world): the host claims a dispatch and calls
`handle` once for it. Returning `str` or `bytes` completes it; raising nacks it (a retry with
backoff, a dead letter at the attempt limit).

Each message is kept in the thread log, the agent's only memory: a later dispatch on the same
thread, on any host, reads it back.

To wait for a person (an approval, say) without holding a worker, wait on a waitpoint: while it
is pending the run is suspended and `handle` returns at once; once someone answers (the
dashboard's Approve and Reject buttons, `homing waitpoint complete ID --payload ...`) or the
timeout passes, `handle` runs again from the top and the same call returns the outcome. What
ran before it runs again too: keep its results in the thread log and skip what is done.

    wait = claim.wait_for("approve", 3_600_000, {"action": "deploy"})  # timeout in ms
    if wait.suspended:
        return None
    approved = wait.completed and wait.json().get("approved")  # the dashboard's buttons

Import every module at the top: the component is a snapshot taken after the imports ran.
"""

import homing_guest


def handle(claim: homing_guest.Claim) -> str:
    earlier = len(claim.read_log_all())
    claim.append(claim.text)
    homing_guest.info(f"message {earlier + 1} on thread {claim.thread}")
    return reply(claim.text, earlier + 1, claim.thread)


def reply(text: str, n: int, thread: str) -> str:
    """The answer to the `n`th message on `thread`."""
    return f"hello, {text}! (message {n} on thread {thread})"


Handle = homing_guest.export_handler(handle)

"""The `{{name}}` agent (Homing's `agent` world): the host calls `run`, which claims work
itself with `claim_next` and settles every claim (a claim left unsettled is nacked by the
host). `run` returns when `claim_next` gives `None`.

Each message is kept in the thread log, the agent's only memory: a later dispatch on the same
thread, on any host, reads it back.

To be steered while it runs (`homing thread send THREAD --kind steer --payload "..."`), a long
run reads its thread's inbox between steps and acknowledges what it takes, which appends the
message to the thread log:

    message = claim.next_message(0.2)
    if message is not None:
        claim.ack_message(message.seq)
        # change course with message.text

Import every module at the top: the component is a snapshot taken after the imports ran.
"""

import homing_guest

# How long each `claim_next` waits for more work before `run` returns.
WAIT_MS = 500


def run() -> None:
    while (claim := homing_guest.claim_next(WAIT_MS)) is not None:
        try:
            answer(claim)
        except homing_guest.HomingError as e:
            homing_guest.warn(f"dispatch {claim.id}: {e}")
            if not e.claim_is_gone():
                claim.nack(str(e))


def answer(claim: homing_guest.Claim) -> None:
    """Handles one claim: remember the message, complete with the reply."""
    earlier = len(claim.read_log_all())
    claim.append(claim.text)
    homing_guest.info(f"message {earlier + 1} on thread {claim.thread}")
    claim.complete(reply(claim.text, earlier + 1, claim.thread))


def reply(text: str, n: int, thread: str) -> str:
    """The answer to the `n`th message on `thread`."""
    return f"hello, {text}! (message {n} on thread {thread})"


WitWorld = homing_guest.export_agent(run)

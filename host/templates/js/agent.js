// The `{{name}}` agent (Homing's `agent` world): the host calls `run`, which claims work
// itself with `claimNext` and settles every claim (a claim left unsettled is nacked by the
// host). `run` returns when `claimNext` gives `undefined`.
//
// Each message is kept in the thread log, the agent's only memory: a later dispatch on the
// same thread, on any host, reads it back.
//
// To be steered while it runs (`homing thread send THREAD --kind steer --payload "..."`), a
// long run reads its thread's inbox between steps and acknowledges what it takes, which
// appends the message to the thread log:
//
//   const message = claim.nextMessage(200);
//   if (message) { claim.ackMessage(message.seq); /* change course with message.text */ }

import { HomingError, exportAgent, info, warn } from 'homing-guest';
import { claimNext } from 'homing-guest/agent';

/** How long each `claimNext` waits for more work before `run` returns. */
const WAIT_MS = 500;

export const run = exportAgent(() => {
  for (let claim; (claim = claimNext(WAIT_MS)); ) {
    try {
      answer(claim);
    } catch (e) {
      if (!(e instanceof HomingError)) throw e;
      warn(`dispatch ${claim.id}: ${e.message}`);
      if (!e.claimIsGone()) claim.nack(e.message);
    }
  }
});

/** Handles one claim: remember the message, complete with the reply. */
function answer(claim) {
  const earlier = claim.readLogAll().length;
  claim.append(claim.text);
  info(`message ${earlier + 1} on thread ${claim.thread}`);
  claim.complete(reply(claim.text, earlier + 1, claim.thread));
}

/** The answer to the `n`th message on `thread`. */
function reply(text, n, thread) {
  return `hello, ${text}! (message ${n} on thread ${thread})`;
}

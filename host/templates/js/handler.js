// The `{{name}}` agent (Homing's `handler` world): the host claims a dispatch and calls
// `handle` once for it. Returning a string or bytes completes it; throwing nacks it (a retry
// with backoff, a dead letter at the attempt limit).
//
// Each message is kept in the thread log, the agent's only memory: a later dispatch on the
// same thread, on any host, reads it back.

import { exportHandler, info } from 'homing-guest';

export const handle = exportHandler((claim) => {
  const earlier = claim.readLogAll().length;
  claim.append(claim.text);
  info(`message ${earlier + 1} on thread ${claim.thread}`);
  return reply(claim.text, earlier + 1, claim.thread);
});

/** The answer to the `n`th message on `thread`. */
function reply(text, n, thread) {
  return `hello, ${text}! (message ${n} on thread ${thread})`;
}

// The `{{name}}` agent (Homing's `handler` world): the host claims a dispatch and calls
// `handle` once for it. Returning a string or bytes completes it; throwing nacks it (a retry
// with backoff, a dead letter at the attempt limit).
//
// Each message is kept in the thread log, the agent's only memory: a later dispatch on the
// same thread, on any host, reads it back.
//
// To wait for a person (an approval, say) without holding a worker, wait on a waitpoint: while
// it is pending the run is suspended and the handler returns at once; once someone answers (the
// dashboard's Approve and Reject buttons, `homing waitpoint complete ID --payload ...`) or the
// timeout passes, the handler runs again from the top and the same call returns the outcome.
// What ran before it runs again too: keep its results in the thread log and skip what is done.
//
//   const wait = claim.waitFor('approve', 3600000, { action: 'deploy' });   // timeout in ms
//   if (wait.suspended) return undefined;
//   const approved = wait.completed && wait.json().approved;   // the dashboard's buttons

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

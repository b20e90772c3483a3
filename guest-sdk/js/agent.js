// The `agent` world's side of `homing-guest`: `claimNext`, apart from the main module because
// only the agent world imports `homing:agent/queue` (a handler that imported it would not
// build).
//
//     import { exportAgent } from 'homing-guest';
//     import { claimNext } from 'homing-guest/agent';
//
//     export const run = exportAgent(() => {
//       for (let claim; (claim = claimNext(1000)); ) claim.complete(`got ${claim.text}`);
//     });

import { claimNext as rawClaimNext } from 'homing:agent/queue@0.2.1';

import { Claim, host } from './homing-guest.js';

/** The next dispatch for this plugin, waiting up to `waitMs`; `undefined` when nothing came,
 * the instance's claim budget is used, or the host is stopping: return from `run` then. */
export function claimNext(waitMs = 0) {
  const raw = host(() => rawClaimNext(waitMs));
  return raw === undefined || raw === null ? undefined : new Claim(raw);
}

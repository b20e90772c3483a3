// Write Homing agents in JavaScript: a thin layer over the bindings componentize-js generates.
//
// The shape follows the Rust SDK (`homing-guest`): a handler is a function of a `Claim`, and one
// call exports it. A `Claim` reads the dispatch (`id`, `thread`, `payload`, `text`, `attempt`,
// `metadata(key)`), settles it (`complete`, `ack`, `nack`, `deadLetter`), writes and reads the
// thread log (`append`, `appendExpected`, `readLog`, `readLogAll`, `logLatest`) and enqueues
// follow-ups (`enqueue`). Host refusals throw `HomingError`, whose `kind` is the WIT `error`
// case (`'lost-claim'`, `'conflict'`, ...); stop on `error.claimIsGone()`.
//
//     import { exportHandler, info } from './homing-guest.js';
//
//     export const handle = exportHandler((claim) => {
//       info(`echoing ${claim.payload.length} bytes`);
//       return claim.payload;
//     });
//
// The handler returns a `Uint8Array` or a string (the output: the host completes the dispatch
// with it), `undefined` when it settled the claim itself, or throws (the host nacks: a retry
// with backoff, a dead letter at the attempt limit). A thrown value never traps the guest: its
// text becomes the nack's reason. Sequence numbers are `BigInt`s (WIT `u64`).
//
// Build with the componentize-js CLI: `cli.js app.js --wit <wit> -n <world> -d fetch-event`
// (`fetch()` stays on: it goes out over `wasi:http`).
// The component is a snapshot taken after the module's top level ran; the module imports only
// the `homing:agent` interfaces every world has, so it works in any world that includes
// `handler`. For the `agent` world, `claimNext` is in `homing-guest/agent` (`agent.js`), apart
// because only that world imports `homing:agent/queue`.

import { enqueue as rawEnqueue } from 'homing:agent/mailbox@0.2.0';
import { write } from 'homing:agent/log@0.2.0';

/** Entries asked for per `readLog` call by `readLogAll`; the host may cap a page. */
export const LOG_PAGE = 256;

const encoder = new TextEncoder();
const decoder = new TextDecoder('utf-8', { fatal: true });

/** The host refused a call: `kind` is the WIT `error` case, `value` its payload (the text, or
 * for `conflict` the thread log's latest sequence as a `BigInt`). */
export class HomingError extends Error {
  constructor(kind, value) {
    super(`${kind}: ${value}`);
    this.name = 'HomingError';
    this.kind = kind;
    this.value = value;
  }

  /** Whether the claim is lost or its thread interrupted: stop, do not retry. */
  claimIsGone() {
    return this.kind === 'lost-claim' || this.kind === 'interrupted';
  }
}

/** Calls a binding, turning the WIT error (thrown with the variant as `payload`) into a
 * `HomingError`. Exported for `homing-guest/agent`. */
export function host(call) {
  try {
    return call();
  } catch (e) {
    const variant = e && typeof e === 'object' && 'payload' in e ? e.payload : e;
    if (variant && typeof variant === 'object' && typeof variant.tag === 'string') {
      throw new HomingError(variant.tag, variant.val);
    }
    throw e;
  }
}

/** Bytes of a string (UTF-8) or of a byte array. */
export function bytes(data) {
  return typeof data === 'string' ? encoder.encode(data) : Uint8Array.from(data);
}

/** UTF-8 text of bytes; throws on invalid UTF-8. */
export function text(data) {
  return decoder.decode(data);
}

/** One thread-log entry: `seq` (BigInt), `data` (bytes), `appendedAt` (Unix ms, BigInt). */
export class LogEntry {
  constructor(raw) {
    this.seq = raw.seq;
    this.data = raw.data;
    this.appendedAt = raw.appendedAt;
  }

  /** The entry as UTF-8 text, or `undefined` when it is not text. */
  get text() {
    try {
      return decoder.decode(this.data);
    } catch {
      return undefined;
    }
  }
}

function request(agent, payload, options = {}) {
  const metadata = options.metadata ?? {};
  return {
    agent,
    thread: options.thread,
    payload: bytes(payload),
    metadata: Array.isArray(metadata) ? metadata : Object.entries(metadata),
    priority: options.priority,
    delayMs: options.delayMs === undefined ? undefined : BigInt(options.delayMs),
    dedupeKey: options.dedupeKey,
    maxAttempts: options.maxAttempts,
    // Concurrency keys are refused by hosts that do not limit runs by them yet.
    concurrencyKey: undefined,
  };
}

/** A dispatch this guest holds: what it is, and the calls that act on it. The dispatch info is
 * read once, when the claim is wrapped. */
export class Claim {
  constructor(raw) {
    this.raw = raw;
    this.info = raw.info();
  }

  get id() { return this.info.id; }
  get agent() { return this.info.agent; }
  get thread() { return this.info.thread; }
  get runId() { return this.info.runId; }
  get payload() { return this.info.payload; }
  /** Failed attempts before this one (0 on the first run). */
  get attempt() { return this.info.attempt; }
  get maxAttempts() { return this.info.maxAttempts; }
  get priority() { return this.info.priority; }

  /** The payload as UTF-8 text; throws `HomingError('invalid')` when it is not. */
  get text() {
    try {
      return decoder.decode(this.info.payload);
    } catch (e) {
      throw new HomingError('invalid', `payload is not UTF-8 text: ${e}`);
    }
  }

  /** Whether failing this attempt dead-letters the dispatch instead of retrying it. */
  isLastAttempt() {
    return this.info.attempt + 1 >= this.info.maxAttempts;
  }

  /** The metadata value under `key`, if the submitter set one. */
  metadata(key) {
    const pair = this.info.metadata.find(([k]) => k === key);
    return pair === undefined ? undefined : pair[1];
  }

  recordStart() { host(() => this.raw.recordStart()); }
  recordResult(output) { host(() => this.raw.recordResult(bytes(output))); }
  /** Records `output` and acks in one step. */
  complete(output) { host(() => this.raw.complete(bytes(output))); }
  ack() { host(() => this.raw.ack()); }
  /** Gives the dispatch back for a retry; `retryAfterMs` is a hint the host caps. */
  nack(error, retryAfterMs) {
    const hint = retryAfterMs === undefined ? undefined : BigInt(retryAfterMs);
    host(() => this.raw.nack(error, hint));
  }
  deadLetter(error) { host(() => this.raw.deadLetter(error)); }

  /** `undefined`, or why the host wants the guest to stop (`'interrupted'`, `'lease-lost'`,
   * `'shutdown'`, `'deadline'`): check it in long loops. */
  stopRequested() { return this.raw.stopRequested(); }

  /** Appends to the thread log; returns the entry's sequence (BigInt). */
  append(entry) { return host(() => this.raw.append(bytes(entry))); }

  /** Appends only if the log's latest sequence is `expectedLatest`; else throws
   * `HomingError('conflict', latest)`. */
  appendExpected(entry, expectedLatest) {
    return host(() => this.raw.appendExpected(bytes(entry), BigInt(expectedLatest)));
  }

  /** Up to `limit` entries with a sequence greater than `after`. */
  readLog(after = 0n, limit = LOG_PAGE) {
    return host(() => this.raw.readLog(BigInt(after), limit)).map((e) => new LogEntry(e));
  }

  /** The whole thread log, page by page. */
  readLogAll() {
    const entries = [];
    let after = 0n;
    for (;;) {
      const page = this.readLog(after, LOG_PAGE);
      if (page.length === 0) return entries;
      entries.push(...page);
      after = page[page.length - 1].seq;
    }
  }

  logLatest() { return host(() => this.raw.logLatest()); }

  /** Enqueues a follow-up to `agent` (on this thread unless `options.thread` says otherwise);
   * returns its id. Options: `thread`, `metadata` (object or pairs), `priority`, `delayMs`,
   * `dedupeKey`, `maxAttempts`. */
  enqueue(agent, payload, options = {}) {
    return host(() => this.raw.enqueue(request(agent, payload, options)));
  }
}

/** Enqueues a dispatch on an explicit thread; returns its id. */
export function enqueue(agent, thread, payload, options = {}) {
  return host(() => rawEnqueue(request(agent, payload, { ...options, thread })));
}

export function trace(message) { write('trace', message); }
export function debug(message) { write('debug', message); }
export function info(message) { write('info', message); }
export function warn(message) { write('warn', message); }
export function error(message) { write('error', message); }

/** The `err(message)` text for a thrown value. */
function failure(e) {
  if (!(e instanceof HomingError)) warn(`${e}${e && e.stack ? `\n${e.stack}` : ''}`);
  return String(e instanceof Error ? e.message : e) || 'error';
}

/** The handler's result as the output bytes. */
function output(out) {
  return out === undefined || out === null ? new Uint8Array() : bytes(out);
}

/** The object to export as `handle`, calling `handler(claim)` per dispatch. The handler may be
 * `async` (to `await fetch(...)`, say): componentize-js runs the event loop until the promise
 * settles, within the same call. */
export function exportHandler(handler) {
  return {
    handle(raw) {
      let out;
      try {
        out = handler(new Claim(raw));
      } catch (e) {
        // The generated binding lifts a thrown string into `err(string)`.
        throw failure(e);
      }
      if (out && typeof out.then === 'function') {
        return out.then(output, (e) => {
          throw failure(e);
        });
      }
      return output(out);
    },
  };
}

/** The function to export as `run` in the agent world, calling `run()` once per instance. */
export function exportAgent(run) {
  return () => {
    try {
      run();
    } catch (e) {
      throw failure(e);
    }
  };
}

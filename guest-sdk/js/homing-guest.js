// Write Homing agents in JavaScript: a thin layer over the bindings componentize-js generates.
//
// The shape follows the Rust SDK (`homing-guest`): a handler is a function of a `Claim`, and one
// call exports it. A `Claim` reads the dispatch (`id`, `thread`, `payload`, `text`, `attempt`,
// `metadata(key)`), settles it (`complete`, `ack`, `nack`, `deadLetter`), writes and reads the
// thread log (`append`, `appendExpected`, `readLog`, `readLogAll`, `logLatest`), reads and
// acknowledges the thread's inbox (`nextMessage`, `messages`, `ackMessage`), waits for people
// and webhooks (`waitFor`; under it `waitpoint`, `waitpoints`, `awaitWaitpoint`, `suspend`),
// memoizes work across retries and resumes (`step`), streams output to watchers (`emit`), calls
// the tools of the plugin's MCP servers through the host (`mcpTools`, `mcpCall`,
// `mcpCallOrSuspend`) and enqueues follow-ups (`enqueue`). Host
// refusals throw `HomingError`, whose `kind` is the WIT `error` case (`'lost-claim'`,
// `'conflict'`, ...); stop on `error.claimIsGone()`.
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

import { enqueue as rawEnqueue } from 'homing:agent/mailbox@0.2.1';
import { write } from 'homing:agent/log@0.2.1';

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

/** The longest wait `next-message` takes (a WIT `u32` of milliseconds); longer waits are cut. */
const MAX_WAIT_MS = 0xffffffff;

/** The value under `key` in a list of `[key, value]` pairs, or `undefined`. */
function lookup(pairs, key) {
  const pair = pairs.find(([k]) => k === key);
  return pair === undefined ? undefined : pair[1];
}

/** What a log entry carries when it records an acknowledged inbox message: `seq` (the message's
 * inbox sequence, BigInt), `kind` (`'steer'` or `'follow-up'`), `sentAt` (Unix ms, store clock,
 * BigInt), `sentBy` (`'cli'`, `'api:<token name>'`, ...) and the sender's metadata. */
export class MessageNote {
  constructor(raw) {
    this.seq = raw.seq;
    this.kind = raw.kind;
    this.sentAt = raw.sentAt;
    this.sentBy = raw.sentBy;
    this.metadataPairs = raw.metadata;
  }

  /** The metadata value under `key`, if the sender set one. */
  metadata(key) {
    return lookup(this.metadataPairs, key);
  }
}

/** Where the host ended a turn: `event` (`'interrupted'`, `'rolled-back'` or `'merged'`),
 * `dispatch` (the run it stopped), `message` (the inbox sequence of the message that stopped it,
 * a BigInt) and, for a rollback or a merge, `masked`: `{first, last}` (BigInts), the log entries that run wrote, which the
 * conversation no longer holds (`unmasked` in `homing-guest/history` drops them), else
 * `undefined`. Tool calls a stopped run left without results: see `homing-guest/history`. */
export class TurnMark {
  constructor(raw) {
    this.event = raw.event;
    this.dispatch = raw.dispatch;
    this.message = raw.message;
    this.masked = raw.masked === undefined || raw.masked === null
      ? undefined
      : { first: raw.masked.first, last: raw.masked.last };
  }
}

/** One thread-log entry: `seq` (BigInt), `data` (bytes), `appendedAt` (Unix ms, BigInt),
 * `message`, a `MessageNote` when the entry records an acknowledged inbox message (its body is
 * `data`), else `undefined`, and `turn`, a `TurnMark` when the host wrote the entry to mark
 * where a turn ended (its data is empty), else `undefined`. */
export class LogEntry {
  constructor(raw) {
    this.seq = raw.seq;
    this.data = raw.data;
    this.appendedAt = raw.appendedAt;
    this.message = raw.message === undefined || raw.message === null ? undefined : new MessageNote(raw.message);
    this.turn = raw.turn === undefined || raw.turn === null ? undefined : new TurnMark(raw.turn);
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

/** A message of the thread's inbox, as a claim is handed it: `seq` (its inbox sequence, a
 * BigInt, not a log sequence: pass it to `Claim.ackMessage`), `kind` (`'steer'` or
 * `'follow-up'`), `body` (bytes, never empty), `sentAt` (Unix ms, store clock, BigInt), `sentBy`
 * (`'cli'`, `'api:<token name>'`, ...), `agent` (the agent the sender addressed, or
 * `undefined`) and the sender's metadata (`metadata(key)`, `metadataPairs`). */
export class Message {
  constructor(raw) {
    this.seq = raw.seq;
    this.kind = raw.kind;
    this.body = raw.body;
    this.sentAt = raw.sentAt;
    this.sentBy = raw.sentBy;
    this.agent = raw.agent === null ? undefined : raw.agent;
    this.metadataPairs = raw.metadata;
  }

  /** The body as UTF-8 text, or `undefined` when it is not text. */
  get text() {
    try {
      return decoder.decode(this.body);
    } catch {
      return undefined;
    }
  }

  /** The metadata value under `key`, if the sender set one. */
  metadata(key) {
    return lookup(this.metadataPairs, key);
  }
}

/** Metadata given as an object or as `[key, value]` pairs, as pairs. */
function pairs(metadata) {
  const given = metadata ?? {};
  return Array.isArray(given) ? given : Object.entries(given);
}

/** A waitpoint of the dispatch: `id` (as the API, the CLI and the dashboard name it), `name`,
 * `state` (`'pending'`, `'completed'`, `'timed-out'` or `'cancelled'`), `timeoutAt`,
 * `createdAt` and `settledAt` (Unix ms, store clock, BigInts), `completion` (the bytes a
 * completion sent, else `undefined`), `settledBy` (`'token'`, `'operator:<name>'`, `'cli'`,
 * `'timeout'`, `'interrupt'`, `'dispatch-ended'`, or `undefined`) and its metadata
 * (`metadata(key)`, `metadataPairs`).
 *
 * `token` is the bearer token that completes this waitpoint and no other, and `callbackUrl` the
 * URL that carries it (when the host's `[api] public_url` is set); both are `undefined` except
 * in the answer of the call that created the waitpoint (or of a later run's first call that
 * found it still pending). Hand them to whoever will complete the waitpoint; never log them.
 * They are not enumerable, so `JSON.stringify` and spreading leave them out. */
export class Waitpoint {
  constructor(raw) {
    this.id = raw.id;
    this.name = raw.name;
    this.state = raw.state;
    this.timeoutAt = raw.timeoutAt;
    this.completion = raw.completion ?? undefined;
    this.settledAt = raw.settledAt ?? undefined;
    this.settledBy = raw.settledBy ?? undefined;
    this.metadataPairs = raw.metadata;
    this.createdAt = raw.createdAt;
    for (const [key, value] of [['token', raw.token], ['callbackUrl', raw.callbackUrl]]) {
      Object.defineProperty(this, key, { value: value ?? undefined, writable: true, enumerable: false });
    }
  }

  /** Whether it still waits for a completion, a cancellation or its timeout. */
  get pending() {
    return this.state === 'pending';
  }

  /** What the completion sent, as UTF-8 text; `undefined` when it was not completed or the
   * bytes are not text. */
  get text() {
    if (this.completion === undefined) return undefined;
    try {
      return decoder.decode(this.completion);
    } catch {
      return undefined;
    }
  }

  /** What the completion sent, parsed as JSON (the dashboard's buttons send
   * `{"approved": true}` or `{"approved": false}`); throws `HomingError('invalid')` when it was
   * not completed or is not JSON. */
  json() {
    if (this.completion === undefined) {
      throw new HomingError('invalid', `waitpoint ${this.name} is ${this.state}, not completed`);
    }
    try {
      return JSON.parse(decoder.decode(this.completion));
    } catch (e) {
      throw new HomingError('invalid', `waitpoint ${this.name}: completion is not JSON: ${e}`);
    }
  }

  /** The metadata value under `key`, if it was created with one. */
  metadata(key) {
    return lookup(this.metadataPairs, key);
  }
}

/** What `Claim.waitFor` found. `suspended` is true when the waitpoint is still pending and the
 * run is suspended: return from the handler at once (the return value is ignored; the handler
 * runs again from its start once the waitpoint is settled). Otherwise `state` is
 * `'completed'`, `'timed-out'` or `'cancelled'`, and `waitpoint` is the settled waitpoint
 * (`completion`, `text` and `json()` read what a completion sent). */
export class Wait {
  constructor(waitpoint, suspended) {
    this.waitpoint = waitpoint;
    this.suspended = suspended;
  }

  get state() { return this.waitpoint.state; }
  get completed() { return this.waitpoint.state === 'completed'; }
  get completion() { return this.waitpoint.completion; }
  get text() { return this.waitpoint.text; }
  json() { return this.waitpoint.json(); }
}

/** `text` parsed as JSON; throws `HomingError('invalid')` naming `what` when it is not. */
function parseJson(text, what) {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new HomingError('invalid', `${what} is not JSON: ${e}`);
  }
}

/** The arguments of an MCP call as JSON text: a string as is, `undefined` or `null` as `{}`,
 * anything else serialized. */
function argumentsJson(tool, args) {
  if (typeof args === 'string') return args;
  let json;
  try {
    json = JSON.stringify(args ?? {});
  } catch (e) {
    throw new HomingError('invalid', `the arguments of ${tool} are not JSON: ${e}`);
  }
  if (json === undefined) throw new HomingError('invalid', `the arguments of ${tool} are not JSON`);
  return json;
}

/** A tool of an MCP server, as the plugin's `[plugins.x.mcp.NAME]` lets it see it (only the
 * tools its `tools` allow-list names): `name`, `description` (what the server says the tool
 * does, or `undefined`), `inputSchema` (the JSON Schema of its arguments, parsed; `schemaText`
 * is the text as the host gave it), `needsApproval` (whether a call waits for a person first,
 * by the plugin's rules) and the server's hints (MCP tool annotations, with MCP's defaults when
 * absent): `readOnly` (it changes nothing), `destructive` (it may destroy data), `idempotent`
 * (calling it twice is harmless) and `openWorld` (it reaches beyond the server). */
export class McpTool {
  constructor(raw) {
    this.name = raw.name;
    this.description = raw.description ?? undefined;
    this.schemaText = raw.inputSchema;
    this.inputSchema = parseJson(raw.inputSchema, `the input schema of ${raw.name}`);
    this.needsApproval = raw.needsApproval;
    this.readOnly = raw.readOnly;
    this.destructive = raw.destructive;
    this.idempotent = raw.idempotent;
    this.openWorld = raw.openWorld;
  }
}

/** What an MCP tool answered: `content` (its content blocks, the MCP content objects as the
 * server sent them, parsed: an array), `structured` (its structured output, parsed, or
 * `undefined` when it gave none) and `isError` (the tool reported an error: a result the model
 * can read, not a failed call). `text` joins its text blocks. */
export class McpResult {
  constructor(raw) {
    this.content = parseJson(raw.content, 'the content of an MCP result');
    this.structured = raw.structured === undefined || raw.structured === null
      ? undefined
      : parseJson(raw.structured, 'the structured output of an MCP result');
    this.isError = raw.isError;
  }

  /** The text of its `text` content blocks, joined with newlines. */
  get text() {
    return (Array.isArray(this.content) ? this.content : [])
      .filter((b) => b && b.type === 'text' && typeof b.text === 'string')
      .map((b) => b.text)
      .join('\n');
  }
}

/** How an `mcpCall` ended. `kind` is the WIT `mcp-outcome` case:
 *
 * - `'done'`: the tool ran (or an earlier run of this dispatch ran it, answered from the
 *   journal); `result` is its `McpResult`, and `text` the text of its text blocks.
 * - `'needs-approval'`: the plugin's rules ask a person first; `waitpoint` is the `Waitpoint`
 *   the host made (without a token: an operator completes it with `{"approved": true}` or
 *   `{"approved": false, "reason": ".."}`, as the dashboard's Approve and Reject buttons do).
 *   Suspend, and make the same call again when the run resumes (`Claim.mcpCallOrSuspend` does
 *   both).
 * - `'rejected'`: not run: the approval was refused, timed out or was cancelled; `reason` says
 *   which, with the person's reason, to tell the model.
 * - `'unknown'`: an earlier run of this dispatch sent the call and ended before its answer was
 *   journaled, and the tool is not idempotent, so it was not sent again: whether it ran is
 *   unknown; `reason` says so, for the model or a person.
 *
 * The fields a case does not carry are `undefined`. */
export class McpOutcome {
  constructor(raw) {
    this.kind = raw.tag;
    this.result = undefined;
    this.waitpoint = undefined;
    this.reason = undefined;
    switch (raw.tag) {
      case 'done':
        this.result = new McpResult(raw.val);
        break;
      case 'needs-approval':
        this.waitpoint = new Waitpoint(raw.val);
        break;
      case 'rejected':
      case 'unknown':
        this.reason = raw.val;
        break;
      default:
        throw new HomingError('internal', `an MCP outcome this SDK does not know: ${raw.tag}`);
    }
  }

  /** Whether the tool ran (`result` holds its answer). */
  get done() { return this.kind === 'done'; }

  /** The text of the result's text blocks when the tool ran, else `undefined`. */
  get text() { return this.result === undefined ? undefined : this.result.text; }
}

/** Whole milliseconds of a waitpoint timeout, as the WIT's `u64`. */
function timeoutMsOf(ms) {
  if (typeof ms === 'bigint') return ms < 0n ? 0n : ms;
  const n = Math.floor(Number(ms));
  return BigInt(Number.isFinite(n) && n > 0 ? n : 0);
}

function request(agent, payload, options = {}) {
  return {
    agent,
    thread: options.thread,
    payload: bytes(payload),
    metadata: pairs(options.metadata),
    priority: options.priority,
    delayMs: options.delayMs === undefined ? undefined : BigInt(options.delayMs),
    dedupeKey: options.dedupeKey,
    maxAttempts: options.maxAttempts,
    // Concurrency keys are refused by hosts that do not limit runs by them yet.
    concurrencyKey: undefined,
    debounce: debounce(options.debounce),
  };
}

/** `options.debounce`: `{key, quietMs, maxWaitMs, payload, maxItems}` as WIT's `debounce`. */
function debounce(d) {
  if (d === undefined || d === null) return undefined;
  const payload = d.payload ?? 'last';
  if (!['last', 'first', 'collect'].includes(payload)) {
    throw new HomingError('invalid', `debounce payload ${JSON.stringify(payload)}: expected last, first or collect`);
  }
  return {
    key: d.key,
    quietMs: BigInt(d.quietMs),
    maxWaitMs: BigInt(d.maxWaitMs),
    payload,
    maxItems: d.maxItems ?? 100,
  };
}

/** A dispatch this guest holds: what it is, and the calls that act on it. The dispatch info is
 * read once, when the claim is wrapped. */
export class Claim {
  constructor(raw) {
    this.raw = raw;
    this.info = raw.info();
    // How often each step name was used in this claim (`step`).
    this.stepCounts = new Map();
  }

  get id() { return this.info.id; }
  get agent() { return this.info.agent; }
  get thread() { return this.info.thread; }
  get runId() { return this.info.runId; }
  get payload() { return this.info.payload; }
  /** Every enqueue the dispatch's `collect` debounce window gathered, oldest first
   * (`{payload, metadata, enqueuedAt}`); empty without one. The payload is the latest item's;
   * a retry gets the same items. */
  items() { return this.raw.items(); }
  /** Failed attempts before this one (0 on the first run). */
  get attempt() { return this.info.attempt; }
  get maxAttempts() { return this.info.maxAttempts; }
  /** How many times the dispatch has been claimed, this claim included (1 on its first run):
   * retries and resumes each add one. */
  get claims() { return this.info.claims; }
  /** How many times the dispatch came back from waiting on its waitpoints (0 until it first
   * suspends). A resume is not a failed attempt. */
  get resumes() { return this.info.resumes; }
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
    return lookup(this.info.metadata, key);
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

  /** The oldest pending message of the thread's inbox that this claim has not been handed yet,
   * waiting up to `waitMs` (0: do not wait) for one to arrive: the host wakes the wait as soon
   * as a message is sent. `undefined` when nothing came in time, or early when the host wants
   * the guest to stop (see `stopRequested`). A message stays pending until a claim acks it
   * (`ackMessage`), so a later run of the thread (a retry, the next dispatch) is handed it
   * again. Throws `HomingError` (`'lost-claim'` or `'interrupted'` once the claim is gone,
   * `'unavailable'`). */
  nextMessage(waitMs = 0) {
    const wait = Math.min(Math.max(Math.floor(Number(waitMs)) || 0, 0), MAX_WAIT_MS);
    const raw = host(() => this.raw.nextMessage(wait));
    return raw === undefined || raw === null ? undefined : new Message(raw);
  }

  /** Every message handed to this claim now, oldest first, without waiting: the steers and
   * follow-ups that arrived since the last call. A generator that ends when the inbox has
   * nothing new; a host refusal throws from it. */
  *messages() {
    for (let message; (message = this.nextMessage(0)); ) yield message;
  }

  /** Acknowledges message `seq` of this thread: it is marked acknowledged and appended to the
   * thread log in one step (its body as the entry's data, the rest as the entry's `message`
   * note), so a later run sees it in the history and is not handed it again. Returns the
   * entry's log sequence (BigInt); acking again returns the same sequence. Throws
   * `HomingError`: `'invalid'` when `seq` is not a message of this thread or was discarded,
   * `'duplicate'` (the acking dispatch's id as `value`) when another dispatch acked it,
   * `'lost-claim'`, `'interrupted'`. */
  ackMessage(seq) {
    return host(() => this.raw.ackMessage(BigInt(seq)));
  }

  /** The waitpoint `name` of this dispatch, created if it does not exist yet: pending, timing
   * out `timeoutMs` from now (1 ms to 30 days), with `metadata` (an object or pairs, shown to
   * operators). A retried or resumed run gets the one it created before, in its current state.
   * Its `token` is set only when this call created it (or is a later run's first look at it
   * while pending). Throws `HomingError` (`'invalid'` for a bad name, timeout or metadata;
   * `'denied'` past 256 waitpoints; `'lost-claim'`, `'interrupted'`). */
  waitpoint(name, timeoutMs, metadata = {}) {
    return new Waitpoint(host(() => this.raw.waitpoint(name, timeoutMsOf(timeoutMs), pairs(metadata))));
  }

  /** Every waitpoint of this dispatch, oldest first, without tokens. */
  waitpoints() {
    return host(() => this.raw.waitpoints()).map((w) => new Waitpoint(w));
  }

  /** Waits in place until waitpoint `id` (its id, not its name) leaves pending, up to
   * `waitMs`, and returns it as it then is: still pending when the time ran out or the host
   * wants the guest to stop. Holds the worker: for answers expected within seconds; `suspend`
   * is for longer waits. Throws `HomingError` (`'invalid'` when `id` is not a waitpoint of
   * this dispatch, `'lost-claim'`, `'interrupted'`). */
  awaitWaitpoint(id, waitMs = 0) {
    const wait = Math.min(Math.max(Math.floor(Number(waitMs)) || 0, 0), MAX_WAIT_MS);
    return new Waitpoint(host(() => this.raw.awaitWaitpoint(id, wait)));
  }

  /** Ends this run without finishing the dispatch: it becomes `waiting`, holding no worker,
   * and is claimed again (a resume, not a new attempt) once one of its waitpoints leaves
   * pending; the resumed run starts from the beginning of the handler. Return from the handler
   * next (its return value is ignored); every later call through this claim throws
   * `'lost-claim'`. Throws `HomingError` (`'invalid'` when nothing is pending, `'denied'` past
   * `max_resumes`). */
  suspend() {
    host(() => this.raw.suspend());
  }

  /** Waits for the waitpoint `name` without holding a worker: creates it (or finds it again on
   * a resumed or retried run) and, while it is pending, suspends the run. Returns a `Wait`:
   * when `wait.suspended`, return from the handler at once; the handler runs again from its
   * start once the waitpoint is completed, times out or is cancelled, and the same call then
   * returns its outcome.
   *
   *     const wait = claim.waitFor('approve', 3_600_000, { tool: 'send_email' });
   *     if (wait.suspended) return undefined;
   *     if (wait.completed && wait.json().approved) { ... }
   *
   * `options.onToken(waitpoint)` is called, before the run suspends, whenever the host hands
   * out a token (`waitpoint.token`, `waitpoint.callbackUrl`): when the waitpoint is created,
   * and on a later run's first call that finds it still pending. The claim is live there: send
   * the token to whoever will complete the waitpoint; never log it. When `onToken` is async
   * (returns a promise, to `await fetch(...)` say), `waitFor` returns a promise too: `await`
   * it. A throw (or rejection) from `onToken` propagates and the run does not suspend (out of
   * the handler, it nacks the dispatch: the retry gets a fresh token). Without `onToken` the
   * token is dropped and an operator completes the waitpoint (dashboard, CLI, API). */
  waitFor(name, timeoutMs, metadata = {}, options = {}) {
    const waitpoint = this.waitpoint(name, timeoutMs, metadata);
    const settle = () => {
      // The token is handed out (or dropped) by now, never kept in the answer.
      waitpoint.token = undefined;
      waitpoint.callbackUrl = undefined;
      if (!waitpoint.pending) return new Wait(waitpoint, false);
      // A completion landing between the look above and this call is not lost: the host
      // resumes the dispatch at once.
      this.suspend();
      return new Wait(waitpoint, true);
    };
    if (waitpoint.token !== undefined && options.onToken) {
      const handed = options.onToken(waitpoint);
      if (handed && typeof handed.then === 'function') return handed.then(settle);
    }
    return settle();
  }

  /** The key of the next use of `name` in this claim: `name`, then `name#2`, `name#3`, ... */
  stepKey(name) {
    const count = (this.stepCounts.get(name) ?? 0) + 1;
    this.stepCounts.set(name, count);
    return count === 1 ? name : `${name}#${count}`;
  }

  /** Runs `fn()` once per dispatch under `name` and keeps its result (JSON): a later run of the
   * same dispatch (a retry, or the run resumed after a waitpoint) gets the stored value back
   * without calling `fn` again.
   *
   *     const summary = claim.step('summarize', () => summarize(claim.text));
   *     const page = await claim.step('fetch', async () => (await fetch(url)).text());
   *
   * When `fn` is async (returns a promise), `step` returns a promise too: `await` it (a stored
   * value then comes back as a resolved promise, so the code reads the same on every run).
   * The n-th use of a name in one run is keyed `name`, `name#2`, `name#3`, ..., so steps in a
   * loop each keep their own value (keep `#` out of names). The result must be JSON (objects,
   * arrays, strings, numbers, booleans, null; `undefined` is kept as `null`, BigInts are
   * refused). When `fn` throws (or rejects), nothing is stored and the error propagates. Values
   * are kept only when the plugin's config sets `journal = "steps"` or `"run"`; with
   * `journal = "off"`, the default, `fn` runs every time. Throws `HomingError` (`'invalid'`
   * for a blank name, a key over 256 bytes, a value over `max_payload` or one that is not JSON;
   * `'lost-claim'`, `'interrupted'`). */
  step(name, fn) {
    const key = this.stepKey(name);
    const stored = host(() => this.raw.stepGet(key));
    const isAsync = fn.constructor && fn.constructor.name === 'AsyncFunction';
    if (stored !== undefined && stored !== null) {
      let value;
      try {
        value = JSON.parse(decoder.decode(stored));
      } catch (e) {
        throw new HomingError('invalid', `the stored value of step ${key} is not JSON: ${e}`);
      }
      return isAsync ? Promise.resolve(value) : value;
    }
    const keep = (value) => {
      let json;
      try {
        json = JSON.stringify(value === undefined ? null : value);
      } catch (e) {
        throw new HomingError('invalid', `the value of step ${key} is not JSON: ${e}`);
      }
      if (json === undefined) {
        throw new HomingError('invalid', `the value of step ${key} is not JSON`);
      }
      host(() => this.raw.stepPut(key, encoder.encode(json)));
      return value;
    };
    const value = fn();
    if (value && typeof value.then === 'function') return value.then(keep);
    return keep(value);
  }

  /** Streams `chunk` (a `Uint8Array`, or a string sent as UTF-8; a model's next tokens, say)
   * to whoever watches this dispatch; returns its sequence within this claim (a BigInt: 1n,
   * 2n, ...). Not durable: the result and the thread log stay the record, and a later claim of
   * the dispatch (a retry, a resume) starts again at 1. Cheap enough to call per token. An
   * empty chunk is passed to the host, which refuses it. Throws `HomingError`: `'invalid'`
   * for an empty chunk or one over 64 KiB, `'denied'` past the host's `max_stream_bytes` for
   * this claim or its emit rate (a guest may stop streaming and carry on), `'lost-claim'`,
   * `'interrupted'`. */
  emit(chunk) {
    return host(() => this.raw.emit(bytes(chunk)));
  }

  /** The tools of MCP server `server` (a `[plugins.x.mcp.NAME]` of this plugin) that its
   * allow-list lets the plugin call, sorted by name, as `McpTool`s. The host lists them with the
   * server's credentials, which the guest never sees. Throws `HomingError`: `'invalid'` for a
   * server the plugin does not configure, `'denied'` when the tool list no longer matches its
   * `pin` (the text names the digest found) or the server's URL is refused, `'unavailable'`
   * when the server cannot be listed, `'lost-claim'`, `'interrupted'`. */
  mcpTools(server) {
    return host(() => this.raw.mcpTools(server)).map((t) => new McpTool(t));
  }

  /** Calls tool `tool` of MCP server `server` with `args` (an object, serialized as JSON, or a
   * JSON object as a string; `undefined` sends `{}`) and returns how it ended, an
   * `McpOutcome`:
   *
   *     const outcome = claim.mcpCall('records', 'lookup', { id: '42' });
   *     if (outcome.done) return outcome.text;
   *
   * Nothing is sent unless the tool is allowed and listed, the list matches the `pin` and the
   * arguments satisfy the tool's input schema. Under `journal = "run"` a retried or resumed
   * run making the same calls in the same order is answered from the journal: no tool runs
   * twice. Throws `HomingError`: `'invalid'` for an unknown server or tool, or arguments that
   * are not a JSON object or fail the schema; `'denied'` for a tool outside the allow-list, a
   * changed tool list under a pin, or an answer over `max_result`; `'unavailable'` when the
   * server did not answer; `'lost-claim'`, `'interrupted'`. */
  mcpCall(server, tool, args) {
    const json = argumentsJson(tool, args);
    return new McpOutcome(host(() => this.raw.mcpCall(server, tool, json)));
  }

  /** `mcpCall`, suspending the run while the call waits for a person's approval: `undefined`
   * then (return from the handler at once; it runs again from its start once the approval
   * settles, and the same call then returns `'done'`, or `'rejected'` when it was refused,
   * timed out or was cancelled). Throws as `mcpCall` and `suspend`. */
  mcpCallOrSuspend(server, tool, args) {
    const outcome = this.mcpCall(server, tool, args);
    if (outcome.kind === 'needs-approval') {
      this.suspend();
      return undefined;
    }
    return outcome;
  }

  /** Enqueues a follow-up to `agent` (on this thread unless `options.thread` says otherwise);
   * returns its id. Options: `thread`, `metadata` (object or pairs), `priority`, `delayMs`,
   * `dedupeKey`, `maxAttempts`, `debounce` (`{key, quietMs, maxWaitMs, payload, maxItems}`,
   * `payload` 'last', 'first' or 'collect'; the id returned is then the window's). */
  enqueue(agent, payload, options = {}) {
    return host(() => this.raw.enqueue(request(agent, payload, options)));
  }
}

/** `claim.waitFor(name, timeoutMs, metadata, options)`. */
export function waitFor(claim, name, timeoutMs, metadata = {}, options = {}) {
  return claim.waitFor(name, timeoutMs, metadata, options);
}

/** `claim.step(name, fn)`. */
export function step(claim, name, fn) {
  return claim.step(name, fn);
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

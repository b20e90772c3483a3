// `js-agent`: a small tool-using assistant, in JavaScript.
//
// The same protocol as `examples/python-agent` (its module docs have the table): each dispatch
// is one user message; the first word picks a tool (`remember`, `recall`, `read`, `env`,
// `connect`, `ask`, `flaky`, `inbox`, `wait`, or a plain reply that counts the turns), and the
// turn is recorded in the thread log as two JSON entries, `{"role":"user",...}` and
// `{"role":"agent",...}`: the log is the agent's only memory. A failing tool is reported in the
// reply; only an unavailable tool (`flaky <n>`) gives the dispatch back for a retry. `inbox`
// and `wait <n> [ms]` read the thread's inbox (messages sent with `homing thread send`),
// acknowledge each into the log (the history has them as user turns) and reply with them; a
// dispatch the host enqueued to answer messages (`enqueued-by=inbox`) is an `inbox` turn.
// `wait-for <name> [ms] [notify-url]` waits for a person: it creates the waitpoint `<name>` and
// suspends the run; the resumed run (after `homing waitpoint complete`, the API or the
// dashboard) replies with what became of it. With a `notify-url`, the waitpoint's token and
// callback URL are POSTed there when the host hands them out (never logged).
// `mcp <server> <tool> [json-arguments]` calls a tool of an MCP server through the host
// (`[plugins.NAME.mcp.<server>]`), suspending while the call waits for approval, and replies
// `mcp done: <text>`, `mcp tool error: ...`, `mcp rejected: <reason>` or `mcp unknown: ...`.
// `research <n> <url> [fail-first]` makes `n` model calls with `fetch()`: each POSTs
// `{"turn":i,"history":<entries in the thread log, read just before>}` to `url`, and each answer
// is appended to the log as `{"role":"tool",...}`; the reply is the answers joined by ` | `.
// With `fail-first`, attempt 0 throws after the calls (before the turn's user and agent
// entries), so the dispatch is retried.
// `memo <n> <url> [fail-first]` makes `n` model calls, each a memoized step
// (`claim.step('ask', ...)`, keyed `ask`, `ask#2`, ...) that POSTs `{"turn":i,"history":0}` to
// `url`; the reply is the answers joined by ` | `, and `fail-first` throws on attempt 0 after the
// steps. Under `journal = "steps"` (or `"run"`) the retry gets the kept answers back without
// asking the model again; with `journal = "off"` it asks again. It appends no `tool` turns.
// `stream <text>` streams the text to the dispatch's watchers a word at a time (`claim.emit`,
// each word with the whitespace before it) and replies `streamed <n> chunks (last #<seq>):
// <text>`, `<seq>` being the last sequence `emit` returned; a refused chunk fails the tool.
//
// StarlingMonkey has no file system, environment or socket API of its own, so the `read`,
// `env` and `connect` tools call the WASI imports of the `tool-agent` world
// (`examples/wit/tool-agent.wit`) directly. What they reach is still what `homing.toml` grants.
// The `http <METHOD> <url> [body]` tool uses the standard `fetch()` (over `wasi:http`, to the
// origins `allowed_outbound_hosts` names) and `config <key>` reads a plugin variable, as the
// Python agent's do.

import { getEnvironment } from 'wasi:cli/environment@0.2.12';
import { getDirectories } from 'wasi:filesystem/preopens@0.2.12';
import { instanceNetwork } from 'wasi:sockets/instance-network@0.2.12';
import { createTcpSocket } from 'wasi:sockets/tcp-create-socket@0.2.12';

import { ConfigError, get as configGet } from './config.js';
import { HomingError, exportHandler, info, text } from './homing-guest.js';

/** The most a `read` returns. */
const READ_LIMIT = 4096n;

/** Variables whose names contain one of these are secrets: `config` says only that they are
 * set. */
const SECRET_WORDS = ['key', 'secret', 'token', 'password'];

/** A tool failed; the reply says so. */
class ToolError extends Error {}

/** The WASI error code (an enum string) of a thrown WASI error. */
function wasiCode(e) {
  return e && typeof e === 'object' && 'payload' in e ? e.payload : String(e);
}

function respond(claim) {
  // A follow-up the host enqueued for unacknowledged messages carries no text of its own.
  const message = claim.metadata('enqueued-by') === 'inbox' ? 'inbox' : claim.text.trim();
  const space = message.indexOf(' ');
  const tool = space < 0 ? message : message.slice(0, space);
  const arg = space < 0 ? '' : message.slice(space + 1).trim();
  const history = claim.readLogAll().map(turn);

  if (tool === 'http') return httpTurn(claim, arg, message);
  if (tool === 'wait-for') return waitTurn(claim, arg, message);
  if (tool === 'research') return researchTurn(claim, arg, message);
  if (tool === 'memo') return memoTurn(claim, arg, message);
  if (tool === 'mcp') return mcpTurn(claim, arg, message);

  let reply;
  if (tool === 'flaky') {
    const needed = Number(arg || '1');
    if (claim.attempt < needed) {
      // Before anything is written: the retry starts from the same log.
      claim.nack(`tool flaky unavailable (attempt ${claim.attempt + 1})`, 10);
      return undefined;
    }
    reply = `succeeded after ${claim.attempt} failed attempts`;
  } else {
    try {
      reply = runTool(claim, tool, arg, message, history);
    } catch (e) {
      if (!(e instanceof ToolError)) throw e;
      reply = `tool ${tool} failed: ${e.message}`;
    }
  }

  return record(claim, tool, message, reply);
}

/** Writes the turn to the thread log; returns the reply. */
function record(claim, tool, message, reply) {
  claim.append(JSON.stringify({ role: 'user', content: message }));
  claim.append(JSON.stringify({ role: 'agent', content: reply }));
  info(`turn on ${claim.thread}: ${tool} -> ${reply.slice(0, 60)}`);
  return reply;
}

/** The `http <METHOD> <url> [body]` turn: `fetch` is asynchronous, so this one is too (the
 * handler returns its promise; componentize-js runs the event loop until it settles). The
 * request carries `x-agent: <this agent>` (and the body as text/plain); the reply is the
 * status, the response's `x-reply` header and its body, as JSON. */
async function httpTurn(claim, arg, message) {
  const [method, url = '', ...rest] = arg.split(' ');
  const body = rest.join(' ');
  const headers = { 'x-agent': claim.agent };
  if (body) headers['content-type'] = 'text/plain';
  let reply;
  try {
    const response = await fetch(url, { method, headers, body: body || undefined });
    const received = await response.text();
    reply = JSON.stringify({ status: response.status, 'x-reply': response.headers.get('x-reply'), body: received });
  } catch (e) {
    reply = `tool http failed: ${e && e.message ? e.message : e}`;
  }
  return record(claim, 'http', message, reply);
}

/** `<n> <url> [fail-first]` as `{ n, url, failFirst }`, or `undefined` when it is not that. */
function callsArg(arg) {
  const [count, url, ...flag] = arg.split(/\s+/).filter((w) => w);
  const n = Number(count);
  const failFirst = flag.length === 1 && flag[0] === 'fail-first';
  if (!Number.isInteger(n) || n < 0 || url === undefined || (flag.length > 0 && !failFirst)) {
    return undefined;
  }
  return { n, url, failFirst };
}

/** POSTs `{ turn, history }` to `url` and returns the answer's text; a status of 300 or more
 * throws a `ToolError`. */
async function postTurn(url, turn, history) {
  const response = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ turn, history }),
  });
  const answer = await response.text();
  if (response.status >= 300) throw new ToolError(`${url} answered ${response.status}`);
  return answer;
}

/** The `research <n> <url> [fail-first]` turn: `n` POSTs to `url` in sequence, each after
 * reading the thread log (as an agent builds its conversation), each answer appended to the
 * log as a `tool` turn. With `fail-first`, attempt 0 throws after the calls: a nack, before the
 * turn's user and agent entries. */
async function researchTurn(claim, arg, message) {
  const calls = callsArg(arg);
  if (calls === undefined) {
    return record(claim, 'research', message, 'tool research failed: expected <n> <url> [fail-first]');
  }
  const { n, url, failFirst } = calls;
  const answers = [];
  for (let turn = 0; turn < n; turn++) {
    let answer;
    try {
      answer = await postTurn(url, turn, claim.readLogAll().length);
    } catch (e) {
      return record(claim, 'research', message, `tool research failed: ${e && e.message ? e.message : e}`);
    }
    claim.append(JSON.stringify({ role: 'tool', content: answer }));
    answers.push(answer);
  }
  if (failFirst && claim.attempt === 0) {
    throw new Error(`research failed on attempt 0 after ${n} calls (fail-first)`);
  }
  return record(claim, 'research', message, answers.join(' | '));
}

/** The `memo <n> <url> [fail-first]` turn: `n` POSTs to `url`, each inside the step `ask`
 * (keys `ask`, `ask#2`, ...), so a retry gets the kept answers back instead of asking again.
 * With `fail-first`, attempt 0 throws after the steps: a nack, before the turn's user and agent
 * entries. */
async function memoTurn(claim, arg, message) {
  const calls = callsArg(arg);
  if (calls === undefined) {
    return record(claim, 'memo', message, 'tool memo failed: expected <n> <url> [fail-first]');
  }
  const { n, url, failFirst } = calls;
  const answers = [];
  for (let turn = 0; turn < n; turn++) {
    let answer;
    try {
      answer = await claim.step('ask', async () => postTurn(url, turn, 0));
    } catch (e) {
      // A call that failed threw out of its step, which kept nothing.
      if (e instanceof HomingError) throw e;
      return record(claim, 'memo', message, `tool memo failed: ${e && e.message ? e.message : e}`);
    }
    answers.push(answer);
  }
  if (failFirst && claim.attempt === 0) {
    throw new Error(`memo failed on attempt 0 after ${n} steps (fail-first)`);
  }
  return record(claim, 'memo', message, answers.join(' | '));
}

/** The `mcp <server> <tool> [json-arguments]` turn: a tool of an MCP server, called through
 * the host; `undefined` once the run is suspended waiting for approval (the resumed run makes
 * the same call). */
function mcpTurn(claim, arg, message) {
  const [server = '', rest = ''] = splitOnce(arg);
  const [tool = '', args = ''] = splitOnce(rest);
  let outcome;
  try {
    outcome = claim.mcpCallOrSuspend(server, tool, args || undefined);
  } catch (e) {
    if (!(e instanceof HomingError)) throw e;
    return record(claim, 'mcp', message, `mcp refused: ${e.message}`);
  }
  if (outcome === undefined) return undefined;
  let reply;
  if (outcome.kind === 'done') {
    reply = `${outcome.result.isError ? 'mcp tool error' : 'mcp done'}: ${outcome.text}`;
  } else {
    reply = `mcp ${outcome.kind}: ${outcome.reason}`;
  }
  return record(claim, 'mcp', message, reply);
}

/** `text` split at its first space, both parts trimmed. */
function splitOnce(text) {
  const at = text.indexOf(' ');
  return at < 0 ? [text.trim(), ''] : [text.slice(0, at).trim(), text.slice(at + 1).trim()];
}

/** The `wait-for <name> [ms] [notify-url]` turn: `undefined` once the run is suspended (the
 * claim is over; the resumed run replies), else the reply naming what became of the
 * waitpoint. With a notify URL the hand-out is a `fetch`, so `waitFor` returns a promise. */
async function waitTurn(claim, arg, message) {
  const [name, ms, notify] = arg.split(/\s+/).filter((w) => w);
  const timeoutMs = ms === undefined ? 3600000 : Number(ms);
  if (name === undefined || !Number.isInteger(timeoutMs)) {
    return record(claim, 'wait-for', message, 'tool wait-for failed: expected <name> [ms] [notify-url]');
  }
  const onToken = async (waitpoint) => {
    info(`waitpoint ${name} (${waitpoint.id}) waits for a person`);
    if (notify === undefined) return;
    const response = await fetch(notify, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        waitpoint: waitpoint.id,
        name: waitpoint.name,
        token: waitpoint.token,
        callback_url: waitpoint.callbackUrl ?? null,
      }),
    });
    // A throw here nacks the dispatch, and the retry hands out a fresh token.
    if (response.status >= 300) throw new Error(`the notify URL answered ${response.status}`);
  };
  const wait = await claim.waitFor(name, timeoutMs, { 'asked-by': claim.agent }, { onToken });
  if (wait.suspended) return undefined;
  const who = wait.waitpoint.settledBy ?? '?';
  const after = `after ${claim.resumes} resume(s)`;
  let reply;
  if (wait.completed) reply = `${name} completed by ${who} ${after}: ${wait.text}`;
  else if (wait.state === 'cancelled') reply = `${name} cancelled by ${who} ${after}`;
  else reply = `${name} ${wait.state} ${after}`;
  return record(claim, 'wait-for', message, reply);
}

/** A log entry as a turn: an acknowledged inbox message is the user's; the rest are the JSON
 * turns this agent wrote. */
function turn(entry) {
  if (entry.message !== undefined) {
    return { role: 'user', content: entry.text ?? '', inbox: Number(entry.message.seq) };
  }
  return JSON.parse(entry.text);
}

/** `inbox`: the messages pending now; `wait <n> [ms]`: up to `n` messages, waiting up to `ms`
 * for each. Acknowledges each one as it is read. */
function readInbox(claim, arg, wait) {
  const read = [];
  const take = (m) => {
    claim.ackMessage(m.seq);
    const sender = m.metadata('from');
    const body = m.text ?? `<${m.body.length} bytes>`;
    read.push(`#${m.seq} ${m.kind} ${body}${sender ? ` (from ${sender})` : ''}`);
  };
  if (wait) {
    const words = arg.split(/\s+/).filter((w) => w);
    const count = words.length > 0 ? Number(words[0]) : 1;
    const each = words.length > 1 ? Number(words[1]) : 10000;
    if (!Number.isInteger(count) || !Number.isInteger(each)) {
      throw new ToolError(`${arg}: expected <n> [ms]`);
    }
    for (let i = 0; i < count; i++) {
      const m = claim.nextMessage(each);
      if (m === undefined) break;
      take(m);
    }
  } else {
    for (const m of claim.messages()) take(m);
  }
  return `inbox: ${read.length ? read.join('; ') : 'nothing'}`;
}

function runTool(claim, tool, arg, message, history) {
  switch (tool) {
    case 'inbox':
    case 'wait':
      return readInbox(claim, arg, tool === 'wait');
    case 'remember':
      return `noted: ${arg}`;
    case 'recall': {
      const facts = history
        .filter((e) => e.role === 'user' && e.content.startsWith('remember '))
        .map((e) => e.content.slice('remember '.length));
      return facts.length ? `you told me: ${facts.join('; ')}` : 'you have not told me anything yet';
    }
    case 'read':
      return readFile(arg);
    case 'env': {
      const found = getEnvironment().find(([name]) => name === arg);
      if (found === undefined) throw new ToolError(`${arg} is not set`);
      return found[1];
    }
    case 'connect':
      return connect(arg);
    case 'stream':
      return streamWords(claim, arg);
    case 'config': {
      let value;
      try {
        value = configGet(arg);
      } catch (e) {
        if (!(e instanceof ConfigError)) throw e;
        throw new ToolError(e.message);
      }
      if (value === undefined) throw new ToolError(`${arg} is not set`);
      if (SECRET_WORDS.some((word) => arg.includes(word))) {
        return `${arg} is set (${value.length} characters, not shown)`;
      }
      return value;
    }
    case 'ask': {
      const space = arg.indexOf(' ');
      const agent = space < 0 ? arg : arg.slice(0, space);
      const said = space < 0 ? '' : arg.slice(space + 1);
      let asked;
      try {
        // A retry of this dispatch must not ask twice: the dedupe key is this dispatch.
        asked = claim.enqueue(agent, said, {
          metadata: { from: claim.agent },
          dedupeKey: `ask-${claim.id}`,
        });
      } catch (e) {
        if (!(e instanceof HomingError)) throw e;
        if (e.kind !== 'duplicate') throw new ToolError(e.message);
        asked = e.value;
      }
      return `asked ${agent}: ${asked}`;
    }
    default: {
      const turns = 1 + history.filter((e) => e.role === 'user').length;
      return `#${turns}: you said "${message}"`;
    }
  }
}

/** `stream <text>`: emits the text to the dispatch's watchers a word at a time, each word with
 * the whitespace before it (the chunks join back into the text). A chunk the host refuses
 * fails the tool; a claim that is gone throws out of the handler. */
function streamWords(claim, arg) {
  const chunks = arg.match(/\s*\S+/g) ?? [];
  if (chunks.length === 0) throw new ToolError('expected <text>');
  let seq = 0n;
  for (const chunk of chunks) {
    try {
      seq = claim.emit(chunk);
    } catch (e) {
      if (!(e instanceof HomingError) || e.claimIsGone()) throw e;
      throw new ToolError(e.message);
    }
  }
  return `streamed ${chunks.length} chunks (last #${seq}): ${arg}`;
}

/** The first 4 KiB of the file at the guest path `path`, under one of the preopened
 * directories (the plugin's `dirs` grants). */
function readFile(path) {
  for (const [dir, mount] of getDirectories()) {
    const prefix = mount.endsWith('/') ? mount : `${mount}/`;
    if (!path.startsWith(prefix)) continue;
    try {
      const file = dir.openAt({ symlinkFollow: false }, path.slice(prefix.length), {}, { read: true });
      const [data] = file.read(READ_LIMIT, 0n);
      return new TextDecoder().decode(data);
    } catch (e) {
      throw new ToolError(`${path}: ${wasiCode(e)}`);
    }
  }
  throw new ToolError(`${path}: no such file or directory`);
}

/** Opens a TCP connection to `ip:port` through `wasi:sockets` and closes it.
 *
 * Creating the socket is where the host's sandbox answers (`access-denied` without an
 * `allowed_hosts` grant). With a grant, componentize-js 0.23 fails the next step: its bindings
 * lift `instance-network()`'s result into a class they never define (`wasi:sockets/network` has
 * a resource but no functions), so JavaScript agents cannot connect yet; the Python agent can. */
function connect(target) {
  const colon = target.lastIndexOf(':');
  const octets = target.slice(0, colon).split('.').map(Number);
  const port = Number(target.slice(colon + 1));
  if (colon < 0 || octets.length !== 4 || octets.some((o) => !Number.isInteger(o)) || !Number.isInteger(port)) {
    throw new ToolError(`${target}: expected <ipv4>:<port>`);
  }
  let socket;
  let network;
  try {
    socket = createTcpSocket('ipv4');
  } catch (e) {
    throw new ToolError(`${target}: ${wasiCode(e)}`);
  }
  try {
    network = instanceNetwork();
  } catch (e) {
    throw new ToolError(`${target}: not supported by componentize-js 0.23 (${e})`);
  }
  try {
    socket.startConnect(network, { tag: 'ipv4', val: { port, address: octets } });
    for (;;) {
      socket.subscribe().block();
      try {
        socket.finishConnect();
        break;
      } catch (e) {
        if (wasiCode(e) !== 'would-block') throw e;
      }
    }
  } catch (e) {
    throw new ToolError(`${target}: ${wasiCode(e)}`);
  }
  return `connected to ${target}`;
}

export const handle = exportHandler(respond);

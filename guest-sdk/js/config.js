// Plugin variables and secrets over `wasi:config/store`, apart from the main module because
// only a world that imports `wasi:config/store@0.2.0-rc.1` can use it (`homing new` worlds and
// `examples/wit/tool-agent.wit` do).
//
//     import { get, require } from 'homing-guest/config';
//
//     const model = get('model') ?? 'gpt-4o-mini';
//     const apiKey = require('api_key'); // a secret: keep it out of logs, replies and the log
//
// The host serves the plugin's `[plugins.NAME.variables]` from `homing.toml` (plain values, or
// values from the host's environment or a file, some marked secret); the guest sees only the
// final strings. Keys are lowercase letters, digits and `_`. Outbound HTTP needs no module:
// the standard `fetch()` goes out over `wasi:http`, to the origins `allowed_outbound_hosts`
// names.

import { get as rawGet, getAll as rawGetAll } from 'wasi:config/store@0.2.0-rc.1';

/** A variable could not be read: `kind` is `'upstream'` or `'io'` (the host failed) or
 * `'missing'` (`require` found no value). */
export class ConfigError extends Error {
  constructor(kind, message) {
    super(`config: ${kind}: ${message}`);
    this.name = 'ConfigError';
    this.kind = kind;
  }
}

/** Calls the host; a WIT `error` becomes a `ConfigError`. */
function call(f) {
  try {
    return f();
  } catch (e) {
    const payload = e && typeof e === 'object' && 'payload' in e ? e.payload : undefined;
    if (payload && typeof payload.tag === 'string') throw new ConfigError(payload.tag, String(payload.val));
    throw e;
  }
}

/** The value of variable `key`, or `undefined` when it has none. */
export function get(key) {
  const value = call(() => rawGet(key));
  return value === null ? undefined : value;
}

/** The value of variable `key`; throws `ConfigError` (`kind === 'missing'`) when unset. */
export function require(key) {
  const value = get(key);
  if (value === undefined) throw new ConfigError('missing', `variable \`${key}\` is not set`);
  return value;
}

/** Every variable as `[key, value]` pairs, secrets included: handle them with care. */
export function getAll() {
  return call(() => rawGetAll());
}

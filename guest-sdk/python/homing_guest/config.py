"""Plugin variables and secrets for Homing agents in Python, over `wasi:config/store`.

The component's world must import `wasi:config/store@0.2.0-rc.1` (see
`examples/wit/tool-agent.wit`); import this module only in such a world. The host serves the
plugin's `[plugins.NAME.variables]` from `homing.toml` (plain values, or values from the host's
environment or a file, some marked secret); the guest sees only the final strings.

    from homing_guest import config

    model = config.get("model") or "gpt-4o-mini"
    api_key = config.require("api_key")  # a secret: keep it out of logs, replies and the log

Keys are lowercase letters, digits and `_`.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from componentize_py_types import Err

from wit_world.imports import store as _store

__all__ = ["ConfigError", "get", "require", "get_all"]


class ConfigError(Exception):
    """A variable could not be read. `kind` is `"upstream"` or `"io"` (the host failed),
    or `"missing"` (`require` found no value)."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"config: {kind}: {message}")
        self.kind = kind


def _failed(e: Err) -> ConfigError:
    kind = "io" if isinstance(e.value, _store.Error_Io) else "upstream"
    return ConfigError(kind, str(getattr(e.value, "value", e.value)))


def get(key: str) -> Optional[str]:
    """The value of variable `key`, or `None` when it has none. Raises `ConfigError`."""
    try:
        return _store.get(key)
    except Err as e:
        raise _failed(e) from None


def require(key: str) -> str:
    """The value of variable `key`; raises `ConfigError` (`kind == "missing"`) when unset."""
    value = get(key)
    if value is None:
        raise ConfigError("missing", f"variable `{key}` is not set")
    return value


def get_all() -> List[Tuple[str, str]]:
    """Every variable as `(key, value)` pairs, secrets included: handle them with care."""
    try:
        return _store.get_all()
    except Err as e:
        raise _failed(e) from None

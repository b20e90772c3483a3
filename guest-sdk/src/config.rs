//! Plugin variables and secrets (feature `config`), read through `wasi:config/store`.
//!
//! The host serves the plugin's `[plugins.NAME.variables]` table from `homing.toml`: plain
//! values, and values taken from the host's environment or from a file, some marked secret.
//! A guest sees only the final string; whether it came from a file or the environment, and
//! whether it is a secret, stays on the host's side.
//!
//! ```no_run
//! # fn demo() -> Result<(), homing_guest::config::ConfigError> {
//! use homing_guest::config;
//!
//! let model = config::get("model")?.unwrap_or_else(|| "gpt-4o-mini".to_owned());
//! let api_key = config::require("api_key")?; // a secret: never log it
//! # let _ = (model, api_key);
//! # Ok(())
//! # }
//! ```
//!
//! Keys are lowercase letters, digits and `_` (the names under `variables`). Treat a secret's
//! value as such: keep it out of logs, errors, thread-log entries and results.

use std::fmt;

use crate::__bindings::config_world::wasi::config::store;

/// Why a variable could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// The host's source of variables failed (the text says how; never a value).
    Upstream(String),
    /// Reading the variable failed on the host (for example, a file it could not read).
    Io(String),
    /// [`require`] found no value for this key.
    Missing(String),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Upstream(why) => write!(f, "config: upstream error: {why}"),
            ConfigError::Io(why) => write!(f, "config: I/O error: {why}"),
            ConfigError::Missing(key) => write!(f, "config: variable `{key}` is not set"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Lets `?` carry a [`ConfigError`] out of a handler (which returns `Result<_, String>`).
impl From<ConfigError> for String {
    fn from(error: ConfigError) -> String {
        error.to_string()
    }
}

impl From<store::Error> for ConfigError {
    fn from(error: store::Error) -> ConfigError {
        match error {
            store::Error::Upstream(why) => ConfigError::Upstream(why),
            store::Error::Io(why) => ConfigError::Io(why),
        }
    }
}

/// The value of variable `key`, or `None` when the plugin has no such variable (or it has no
/// value and no default).
///
/// # Errors
///
/// [`ConfigError::Upstream`] or [`ConfigError::Io`] when the host could not produce the value.
pub fn get(key: &str) -> Result<Option<String>, ConfigError> {
    store::get(key).map_err(ConfigError::from)
}

/// The value of variable `key`, which must be set.
///
/// # Errors
///
/// [`ConfigError::Missing`] when there is no value, or the errors of [`get`].
pub fn require(key: &str) -> Result<String, ConfigError> {
    get(key)?.ok_or_else(|| ConfigError::Missing(key.to_owned()))
}

/// Every variable as `(key, value)` pairs. This includes secrets: handle the values with care.
///
/// # Errors
///
/// [`ConfigError::Upstream`] or [`ConfigError::Io`] when the host could not produce them.
pub fn all() -> Result<Vec<(String, String)>, ConfigError> {
    store::get_all().map_err(ConfigError::from)
}

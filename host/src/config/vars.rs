//! `[plugins.x.variables]` and `[plugins.x.env]`: values a guest reads, given in the file or
//! taken from the environment or a file, some of them secret.
//!
//! ```toml
//! [plugins.assistant.variables]
//! model = "gpt-4o-mini"                                   # plain
//! api_key = { env = "OPENAI_API_KEY", secret = true }     # required: no default
//! base_url = { env = "BASE_URL", default = "http://127.0.0.1:11434/v1" }
//! org = { file = "org.txt", required = false }
//! ```
//!
//! A value from the environment or a file is read when the host starts (and by `homing config
//! check`), never by the other commands, which do not run guests. A secret lives in a
//! [`SecretText`]: its `Debug` prints `<redacted>`, it has no `Display`, and its memory is
//! zeroed when dropped; errors name the variable and where it was looked for, never a value.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use zeroize::Zeroizing;

/// The largest file a value is read from.
pub const MAX_VALUE_FILE: u64 = 64 * 1024;

/// One entry of `variables` or `env`, as written.
#[derive(Debug, Clone, PartialEq)]
pub enum ValueSpec {
    /// `key = "text"`.
    Plain(String),
    /// `key = { env = "..", file = "..", secret = .., required = .., default = ".." }`.
    Sourced(Sourced),
}

/// A value taken from the environment or a file.
#[derive(Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sourced {
    /// The environment variable holding it.
    #[serde(default)]
    pub env: Option<String>,
    /// The file holding it (relative to the config); one trailing newline is dropped.
    #[serde(default)]
    pub file: Option<PathBuf>,
    /// Whether it is a secret: never shown, logged or stored by the host.
    #[serde(default)]
    pub secret: bool,
    /// Whether a missing value is an error (default: yes, unless there is a `default`).
    #[serde(default)]
    pub required: Option<bool>,
    /// The value when the source is unset.
    #[serde(default)]
    pub default: Option<String>,
}

impl fmt::Debug for Sourced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("Sourced");
        s.field("env", &self.env)
            .field("file", &self.file)
            .field("secret", &self.secret)
            .field("required", &self.required);
        if self.secret {
            s.field("default", &self.default.as_ref().map(|_| "<redacted>"));
        } else {
            s.field("default", &self.default);
        }
        s.finish()
    }
}

impl<'de> Deserialize<'de> for ValueSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SpecVisitor;
        impl<'de> Visitor<'de> for SpecVisitor {
            type Value = ValueSpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a string, or a table with `env` or `file` (and `secret`, `required`, `default`)",
                )
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ValueSpec, E> {
                Ok(ValueSpec::Plain(v.to_owned()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ValueSpec, A::Error> {
                Sourced::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(ValueSpec::Sourced)
            }
        }
        deserializer.deserialize_any(SpecVisitor)
    }
}

impl ValueSpec {
    /// Whether the value is secret.
    pub fn is_secret(&self) -> bool {
        matches!(self, ValueSpec::Sourced(s) if s.secret)
    }

    /// Where the value comes from, for `config check` and errors: never the value itself.
    pub fn origin(&self) -> String {
        match self {
            ValueSpec::Plain(_) => "the config".into(),
            ValueSpec::Sourced(s) => match (&s.env, &s.file) {
                (Some(var), _) => format!("environment variable {var}"),
                (None, Some(path)) => format!("file {}", path.display()),
                (None, None) => "its default".into(),
            },
        }
    }

    /// What can be checked without reading the environment or files.
    pub(super) fn check(&self) -> Result<(), String> {
        let ValueSpec::Sourced(s) = self else {
            return Ok(());
        };
        match (&s.env, &s.file) {
            (Some(_), Some(_)) => {
                return Err("names both `env` and `file`; choose one".into());
            }
            (Some(var), None) if var.is_empty() || var.contains(['=', '\0']) => {
                return Err(format!("`env = \"{var}\"` is not a variable name"));
            }
            (None, None) if s.default.is_none() => {
                return Err("names no `env`, `file` or `default`".into());
            }
            _ => {}
        }
        if s.required == Some(true) && s.default.is_some() {
            return Err("is `required` and has a `default`; a default makes it optional".into());
        }
        Ok(())
    }

    /// Reads the value. `Ok(None)`: not set and not required.
    ///
    /// # Errors
    ///
    /// A required value that is unset (naming where it was looked for), or a file that cannot
    /// be read. Never includes the value.
    pub fn resolve(&self, base_dir: &Path) -> Result<Option<Value>, String> {
        let s = match self {
            ValueSpec::Plain(text) => return Ok(Some(Value::Plain(text.clone()))),
            ValueSpec::Sourced(s) => s,
        };
        let found: Option<Zeroizing<String>> = match (&s.env, &s.file) {
            (Some(var), _) => match std::env::var(var) {
                Ok(value) => Some(Zeroizing::new(value)),
                Err(std::env::VarError::NotPresent) => None,
                Err(std::env::VarError::NotUnicode(_)) => {
                    return Err(format!("environment variable {var} is not UTF-8"));
                }
            },
            (None, Some(path)) => {
                let path = if path.is_absolute() {
                    path.clone()
                } else {
                    base_dir.join(path)
                };
                match std::fs::symlink_metadata(&path) {
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                    _ => {
                        let bytes = Zeroizing::new(
                            crate::input::read_file_capped(
                                &path,
                                MAX_VALUE_FILE,
                                "the value file",
                                "the value size limit",
                            )
                            .map_err(|e| e.to_string())?,
                        );
                        let mut text = Zeroizing::new(
                            String::from_utf8(bytes.to_vec())
                                .map_err(|_| format!("file {} is not UTF-8", path.display()))?,
                        );
                        if text.ends_with('\n') {
                            text.pop();
                            if text.ends_with('\r') {
                                text.pop();
                            }
                        }
                        Some(text)
                    }
                }
            }
            (None, None) => None,
        };
        let text = match (found, &s.default) {
            (Some(text), _) => text,
            (None, Some(default)) => Zeroizing::new(default.clone()),
            (None, None) if s.required != Some(false) => {
                return Err(format!("is required but {} is not set", self.origin()));
            }
            (None, None) => return Ok(None),
        };
        Ok(Some(if s.secret {
            Value::Secret(SecretText(text))
        } else {
            Value::Plain(text.to_string())
        }))
    }
}

/// A resolved value.
#[derive(Clone, PartialEq)]
pub enum Value {
    /// Shown as it is.
    Plain(String),
    /// Never shown.
    Secret(SecretText),
}

impl fmt::Debug for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Plain(text) => fmt::Debug::fmt(text, f),
            Value::Secret(secret) => fmt::Debug::fmt(secret, f),
        }
    }
}

impl Value {
    /// The value as a secret, however it was written (a credential is never shown).
    pub fn into_secret(self) -> Value {
        match self {
            Value::Plain(text) => Value::Secret(SecretText(Zeroizing::new(text))),
            secret => secret,
        }
    }

    /// The text, to hand to the guest; never for printing.
    pub fn expose(&self) -> &str {
        match self {
            Value::Plain(text) => text,
            Value::Secret(secret) => secret.expose(),
        }
    }
}

/// A secret string. `Debug` prints `<redacted>`; there is no `Display`; zeroed on drop.
#[derive(Clone, PartialEq)]
pub struct SecretText(Zeroizing<String>);

impl fmt::Debug for SecretText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl SecretText {
    /// The text; never for printing.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// A plugin's resolved variables and environment.
#[derive(Debug, Clone, Default)]
pub struct Resolved {
    /// `variables`, for `wasi:config/store`.
    pub variables: BTreeMap<String, Value>,
    /// `env`, for the guest's environment.
    pub env: BTreeMap<String, Value>,
    /// The credential of each `[plugins.x.mcp.NAME]` that has one (its bearer, or its OAuth
    /// client's secret), by server name: the host uses it, the guest never sees it.
    pub mcp: BTreeMap<String, Value>,
}

impl Resolved {
    /// Every secret value, for scrubbing text that might hold one. An MCP bearer is one
    /// however it was written.
    pub fn secrets(&self) -> impl Iterator<Item = &str> {
        self.variables
            .values()
            .chain(self.env.values())
            .filter_map(|v| match v {
                Value::Secret(s) if !s.expose().is_empty() => Some(s.expose()),
                _ => None,
            })
            .chain(
                self.mcp
                    .values()
                    .map(Value::expose)
                    .filter(|v| !v.is_empty()),
            )
    }
}

/// Checks a variable name: what `wasi:config` keys look like, lowercase letters, digits and
/// `_`, starting with a letter.
pub(super) fn check_variable_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{name}` is not a variable name (lowercase letters, digits and `_`, starting with a letter)"
        ))
    }
}

/// Resolves every entry of `specs`, naming the table and key in errors.
pub(super) fn resolve_all(
    specs: &BTreeMap<String, ValueSpec>,
    table: &str,
    base_dir: &Path,
) -> Result<BTreeMap<String, Value>, String> {
    let mut out = BTreeMap::new();
    for (name, spec) in specs {
        if let Some(value) = spec
            .resolve(base_dir)
            .map_err(|e| format!("{table} `{name}` {e}"))?
        {
            out.insert(name.clone(), value);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[derive(Deserialize)]
    struct Table {
        vars: BTreeMap<String, ValueSpec>,
    }

    fn specs(text: &str) -> BTreeMap<String, ValueSpec> {
        toml::from_str::<Table>(text).unwrap().vars
    }

    #[test]
    fn values_come_plain_from_the_environment_or_from_a_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("key.txt"), "file-secret-value\n").unwrap();
        // PATH is set in every test environment; the test sets nothing itself.
        let path = std::env::var("PATH").unwrap();
        let specs = specs(
            "[vars]\nplain = \"p\"\nfrom_env = { env = \"PATH\" }\nkey = { file = \"key.txt\", secret = true }\nopt = { env = \"HOMING_TEST_VARS_UNSET\", required = false }\ndef = { env = \"HOMING_TEST_VARS_UNSET\", default = \"d\" }\n",
        );
        let got = resolve_all(&specs, "variables", dir.path()).unwrap();
        assert_eq!(got["plain"].expose(), "p");
        assert_eq!(got["from_env"].expose(), path);
        assert_eq!(got["key"].expose(), "file-secret-value");
        assert!(matches!(got["key"], Value::Secret(_)));
        assert!(!got.contains_key("opt"));
        assert_eq!(got["def"].expose(), "d");
        let shown = format!("{got:?}");
        assert!(!shown.contains("file-secret-value"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }

    #[test]
    fn a_missing_required_value_names_the_variable_and_where_it_was_looked_for() {
        let dir = tempfile::tempdir().unwrap();
        let specs = specs(
            "[vars]\napi_key = { env = \"HOMING_TEST_VARS_MISSING\", secret = true }\ntoken = { file = \"nope.txt\" }\n",
        );
        let err = resolve_all(&specs, "[plugins.a.variables]", dir.path()).unwrap_err();
        assert_eq!(
            err,
            "[plugins.a.variables] `api_key` is required but environment variable HOMING_TEST_VARS_MISSING is not set"
        );
        let one: BTreeMap<_, _> = specs.into_iter().filter(|(k, _)| k == "token").collect();
        let err = resolve_all(&one, "variables", dir.path()).unwrap_err();
        assert!(
            err.contains("`token` is required but file nope.txt"),
            "{err}"
        );
    }

    #[test]
    fn contradictions_and_bad_names_are_refused() {
        let both = ValueSpec::Sourced(Sourced {
            env: Some("A".into()),
            file: Some("b".into()),
            secret: false,
            required: None,
            default: None,
        });
        assert!(both.check().unwrap_err().contains("both"));
        let err = toml::from_str::<Table>("[vars]\na = { evn = \"X\" }\n")
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("unknown field `evn`"), "{err}");
        assert!(check_variable_name("api_key").is_ok());
        assert!(check_variable_name("API_KEY").is_err());
        assert!(check_variable_name("1x").is_err());
    }
}

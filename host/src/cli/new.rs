//! `homing new NAME --lang rust|python|js [--world handler|agent]`: writes `./NAME`, a working
//! agent outside any repository: its source, its WIT, a README, a `.gitignore` and a
//! `homing.toml` that runs it once `homing build` has built it.
//!
//! The templates are files under `host/templates/`, embedded with `include_str!`; `{{name}}`
//! and the other placeholders below are replaced by plain text substitution.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::ValueEnum;

/// The language of an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Lang {
    /// Rust, with the `homing-guest` crate.
    Rust,
    /// Python, built with componentize-py.
    Python,
    /// JavaScript, built with componentize-js.
    Js,
}

impl Lang {
    /// How the language is named to people.
    pub fn title(self) -> &'static str {
        match self {
            Lang::Rust => "Rust",
            Lang::Python => "Python",
            Lang::Js => "JavaScript",
        }
    }
}

/// The world an agent exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum World {
    /// The host claims work and calls `handle` once per dispatch.
    Handler,
    /// The host calls `run`, which claims work itself with `claim-next`.
    Agent,
}

impl World {
    fn as_str(self) -> &'static str {
        match self {
            World::Handler => "handler",
            World::Agent => "agent",
        }
    }
}

/// The contract, written into every new agent (the Rust SDK carries its own copy too).
pub const CONTRACT: &str = include_str!("../../../wit/homing.wit");

const HOMING_TOML: &str = include_str!("../../templates/common/homing.toml");
const GITIGNORE: &str = include_str!("../../templates/common/gitignore");
const WORLD_WIT: &str = include_str!("../../templates/common/world.wit");

/// The WASI WIT the Python and JavaScript worlds need for `wasi:http` and `wasi:config`
/// (every package `wasi:http` names), the files of `examples/wit/deps`.
const WASI_DEPS: &[(&str, &str)] = &[
    (
        "wit/deps/wasi-cli.wit",
        include_str!("../../../examples/wit/deps/wasi-cli.wit"),
    ),
    (
        "wit/deps/wasi-clocks.wit",
        include_str!("../../../examples/wit/deps/wasi-clocks.wit"),
    ),
    (
        "wit/deps/wasi-filesystem.wit",
        include_str!("../../../examples/wit/deps/wasi-filesystem.wit"),
    ),
    (
        "wit/deps/wasi-http.wit",
        include_str!("../../../examples/wit/deps/wasi-http.wit"),
    ),
    (
        "wit/deps/wasi-io.wit",
        include_str!("../../../examples/wit/deps/wasi-io.wit"),
    ),
    (
        "wit/deps/wasi-random.wit",
        include_str!("../../../examples/wit/deps/wasi-random.wit"),
    ),
    (
        "wit/deps/wasi-sockets.wit",
        include_str!("../../../examples/wit/deps/wasi-sockets.wit"),
    ),
    (
        "wit/deps/wasi-config/store.wit",
        include_str!("../../../examples/wit/deps/wasi-config/store.wit"),
    ),
    (
        "wit/deps/wasi-config/world.wit",
        include_str!("../../../examples/wit/deps/wasi-config/world.wit"),
    ),
];

const RUST_CARGO: &str = include_str!("../../templates/rust/Cargo.toml");
const RUST_HANDLER: &str = include_str!("../../templates/rust/handler.rs");
const RUST_AGENT: &str = include_str!("../../templates/rust/agent.rs");
const RUST_README: &str = include_str!("../../templates/rust/README.md");

const PYTHON_HANDLER: &str = include_str!("../../templates/python/handler.py");
const PYTHON_AGENT: &str = include_str!("../../templates/python/agent.py");
const PYTHON_PROJECT: &str = include_str!("../../templates/python/pyproject.toml");
const PYTHON_README: &str = include_str!("../../templates/python/README.md");

const JS_HANDLER: &str = include_str!("../../templates/js/handler.js");
const JS_AGENT: &str = include_str!("../../templates/js/agent.js");
const JS_PACKAGE: &str = include_str!("../../templates/js/package.json");
const JS_README: &str = include_str!("../../templates/js/README.md");

/// The longest agent name `homing new` takes.
const MAX_NAME: usize = 64;

/// Checks that `name` can name the agent everywhere it is used: the folder, the plugin table in
/// `homing.toml`, the Cargo package, the npm package and the Python project.
///
/// # Errors
///
/// When it cannot, saying which rule it breaks.
pub fn check_name(name: &str) -> anyhow::Result<()> {
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        bail!("the agent name is empty");
    };
    if !first.is_ascii_lowercase() {
        bail!("agent name `{name}`: must start with a lowercase letter (a-z)");
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '_'))
    {
        bail!(
            "agent name `{name}`: `{bad}` is not allowed; use lowercase letters, digits, `-` and `_` \
             (the name is also a Cargo, npm and Python package name)"
        );
    }
    if name.len() > MAX_NAME {
        bail!("agent name `{name}`: at most {MAX_NAME} characters");
    }
    Ok(())
}

/// The name of the WIT package and world of a Python or JavaScript agent: the agent's name when
/// it is a WIT identifier (`-`-separated words, each starting with a letter), else `agent`.
fn wit_name(name: &str) -> String {
    let kebab = name.replace('_', "-");
    let valid = kebab.split('-').all(|word| {
        word.chars().next().is_some_and(|c| c.is_ascii_lowercase())
            && word
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    });
    if valid { kebab } else { "agent".into() }
}

/// The files of a new agent, as (path relative to its folder, content).
pub fn files(name: &str, lang: Lang, world: World) -> Vec<(&'static str, String)> {
    let fill = |template: &str| {
        template
            .replace("{{name}}", name)
            .replace("{{world}}", world.as_str())
    };
    let memory = match lang {
        // A 12-18 MB Python or JavaScript component needs room for its interpreter.
        Lang::Python | Lang::Js => "128MiB",
        Lang::Rust => "64MiB",
    };
    let mut files = vec![
        (
            "homing.toml",
            fill(HOMING_TOML).replace("{{memory}}", memory),
        ),
        (".gitignore", GITIGNORE.to_owned()),
    ];
    let world_wit = || fill(WORLD_WIT).replace("{{package}}", &wit_name(name));
    match lang {
        Lang::Rust => {
            let dependency = match world {
                World::Handler => {
                    r#"{ version = "0.2", features = ["http", "config"] }"#.to_owned()
                }
                World::Agent => r#"{ version = "0.2", default-features = false, features = ["agent", "http", "config"] }"#
                    .to_owned(),
            };
            files.push((
                "Cargo.toml",
                fill(RUST_CARGO).replace("{{dependency}}", &dependency),
            ));
            let source = match world {
                World::Handler => RUST_HANDLER,
                World::Agent => RUST_AGENT,
            };
            files.push(("src/lib.rs", fill(source)));
            files.push(("README.md", fill(RUST_README)));
            files.push(("wit/homing.wit", CONTRACT.to_owned()));
        }
        Lang::Python => {
            let source = match world {
                World::Handler => PYTHON_HANDLER,
                World::Agent => PYTHON_AGENT,
            };
            files.push(("app.py", fill(source)));
            files.push(("pyproject.toml", fill(PYTHON_PROJECT)));
            files.push(("README.md", fill(PYTHON_README)));
            files.push(("wit/world.wit", world_wit()));
            files.push(("wit/deps/homing-agent/homing.wit", CONTRACT.to_owned()));
            files.extend(
                WASI_DEPS
                    .iter()
                    .map(|(path, text)| (*path, (*text).to_owned())),
            );
        }
        Lang::Js => {
            let source = match world {
                World::Handler => JS_HANDLER,
                World::Agent => JS_AGENT,
            };
            files.push(("app.js", fill(source)));
            files.push(("package.json", fill(JS_PACKAGE)));
            files.push(("README.md", fill(JS_README)));
            files.push(("wit/world.wit", world_wit()));
            files.push(("wit/deps/homing-agent/homing.wit", CONTRACT.to_owned()));
            files.extend(
                WASI_DEPS
                    .iter()
                    .map(|(path, text)| (*path, (*text).to_owned())),
            );
        }
    }
    files
}

/// `homing new`: writes the agent into `parent/name`, which must not exist yet, and returns
/// that folder.
///
/// # Errors
///
/// When the name is not allowed, the folder exists, or a file cannot be written.
pub fn create(parent: &Path, name: &str, lang: Lang, world: World) -> anyhow::Result<PathBuf> {
    check_name(name)?;
    let dir = parent.join(name);
    // `create_dir` fails on an existing path, so an existing folder is never written into.
    std::fs::create_dir(&dir).map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => anyhow::anyhow!(
            "{} already exists; choose another name or remove it",
            dir.display()
        ),
        _ => anyhow::anyhow!("cannot create {}: {e}", dir.display()),
    })?;
    for (path, content) in files(name, lang, world) {
        let file = dir.join(path);
        if let Some(folder) = file.parent() {
            std::fs::create_dir_all(folder)
                .with_context(|| format!("cannot create {}", folder.display()))?;
        }
        std::fs::write(&file, content)
            .with_context(|| format!("cannot write {}", file.display()))?;
    }
    Ok(dir)
}

/// `homing new` as the command line runs it: writes `./NAME` and says what to do next.
///
/// # Errors
///
/// As [`create`].
pub fn run(name: &str, lang: Lang, world: World) -> anyhow::Result<()> {
    let dir = create(Path::new("."), name, lang, world)?;
    println!(
        "created {} ({} agent, {} world)\n\nnext:\n  cd {name}\n  homing build\n  \
         homing enqueue --agent {name} --thread t1 --payload \"world\"\n  \
         homing run --until-idle\n  homing dispatch list",
        dir.display(),
        lang.title(),
        world.as_str(),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn names_are_checked() {
        for good in ["hello", "my-agent", "a_1", "x"] {
            check_name(good).unwrap();
        }
        for (bad, why) in [
            ("", "empty"),
            ("Hello", "lowercase letter"),
            ("1st", "lowercase letter"),
            ("a b", "` ` is not allowed"),
            ("a/b", "`/` is not allowed"),
            ("..", "lowercase letter"),
        ] {
            let error = check_name(bad).unwrap_err().to_string();
            assert!(error.contains(why), "{bad:?}: {error}");
        }
        assert!(check_name(&"a".repeat(65)).is_err());
    }

    #[test]
    fn wit_names_are_identifiers() {
        assert_eq!(wit_name("hello"), "hello");
        assert_eq!(wit_name("my_agent"), "my-agent");
        assert_eq!(wit_name("agent-2"), "agent");
        assert_eq!(wit_name("a--b"), "agent");
    }

    #[test]
    fn every_placeholder_is_filled() {
        for lang in [Lang::Rust, Lang::Python, Lang::Js] {
            for world in [World::Handler, World::Agent] {
                for (path, content) in files("hello", lang, world) {
                    assert!(
                        !content.contains("{{"),
                        "{lang:?} {world:?} {path}: a placeholder is left:\n{content}"
                    );
                }
            }
        }
    }
}

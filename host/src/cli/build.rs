//! `homing build [DIR]`: builds the agent in `DIR` (default `.`) into `DIR/build/NAME.wasm`,
//! whatever its language, and prints that path.
//!
//! - **Rust** (`Cargo.toml`): `rustup target add wasm32-wasip2` when the target is missing, then
//!   `cargo build --release --target wasm32-wasip2` with `homing-guest` patched to the crate
//!   this binary carries (unpacked into the tool cache); the `cdylib` cargo reports is copied.
//! - **Python** (`pyproject.toml` or `app.py`): componentize-py builds the module `app` against
//!   `DIR/wit`, with the `homing_guest` package this binary carries.
//! - **JavaScript** (`package.json` or `app.js`): esbuild bundles the entry module (`main`,
//!   default `app.js`), resolving `homing-guest` to the package this binary carries, and
//!   componentize-js builds the bundle against `DIR/wit`.
//!
//! The Python and JavaScript tools are pinned and installed on first use into a user cache
//! (see [`tools`]), never into the agent's folder and never globally.

mod tools;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};

use super::new::Lang;

/// `homing build`.
///
/// # Errors
///
/// When `dir` holds no agent project, a tool is missing and cannot be installed, or the build
/// fails; the message names which.
pub fn run(dir: &Path) -> anyhow::Result<()> {
    let started = Instant::now();
    let project = Project::find(dir)?;
    let out_dir = project.dir.join("build");
    std::fs::create_dir_all(&out_dir)
        .with_context(|| format!("cannot create {}", out_dir.display()))?;
    let out = out_dir.join(format!("{}.wasm", project.name));
    eprintln!(
        "homing: building the {} agent `{}` in {}",
        project.lang.title(),
        project.name,
        project.dir.display()
    );
    match project.lang {
        Lang::Rust => build_rust(&project, &out)?,
        Lang::Python => build_python(&project, &out)?,
        Lang::Js => build_js(&project, &out)?,
    }
    let size = std::fs::metadata(&out)
        .with_context(|| format!("the build finished but {} is missing", out.display()))?
        .len();
    eprintln!(
        "homing: built {} ({:.1} MB) in {:.1} s",
        out.display(),
        size as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );
    println!("{}", out.display());
    Ok(())
}

/// An agent's folder, its language and its name (the component is `build/NAME.wasm`).
#[derive(Debug)]
struct Project {
    dir: PathBuf,
    lang: Lang,
    name: String,
}

/// Whether `dir` holds an agent project `homing build` builds.
pub(super) fn is_project(dir: &Path) -> bool {
    Project::find(dir).is_ok()
}

impl Project {
    fn find(dir: &Path) -> anyhow::Result<Project> {
        let dir = std::fs::canonicalize(dir)
            .with_context(|| format!("cannot open the agent folder {}", dir.display()))?;
        if !dir.is_dir() {
            bail!("{} is not a folder", dir.display());
        }
        let has = |file: &str| dir.join(file).is_file();
        let (lang, name) = if has("Cargo.toml") {
            (
                Lang::Rust,
                manifest_name(&dir, "Cargo.toml", &["package", "name"])?,
            )
        } else if has("pyproject.toml") {
            (
                Lang::Python,
                manifest_name(&dir, "pyproject.toml", &["project", "name"])?,
            )
        } else if has("package.json") {
            (Lang::Js, package_json(&dir)?.name)
        } else if has("app.py") {
            (Lang::Python, folder_name(&dir)?)
        } else if has("app.js") {
            (Lang::Js, folder_name(&dir)?)
        } else {
            bail!(
                "{} holds no agent: expected Cargo.toml (Rust), pyproject.toml or app.py \
                 (Python), or package.json or app.js (JavaScript); `homing new NAME --lang \
                 rust|python|js` writes one",
                dir.display()
            );
        };
        if name.is_empty() || name.contains(['/', '\\']) || name.starts_with('.') {
            bail!(
                "{}: the agent's name `{name}` cannot name its component file",
                dir.display()
            );
        }
        Ok(Project { dir, lang, name })
    }

    /// `DIR/wit`, which a Python or JavaScript agent is built against.
    fn wit(&self) -> anyhow::Result<PathBuf> {
        let wit = self.dir.join("wit");
        if !wit.is_dir() {
            bail!(
                "{} is missing: a {} agent is built against the world in its `wit` folder \
                 (`homing new` writes `wit/world.wit` and the contract in `wit/deps`)",
                wit.display(),
                self.lang.title()
            );
        }
        Ok(wit)
    }
}

/// A string at `keys` in the TOML file `file` of `dir`.
fn manifest_name(dir: &Path, file: &str, keys: &[&str]) -> anyhow::Result<String> {
    let path = dir.join(file);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let doc: toml::Table =
        toml::from_str(&text).with_context(|| format!("{} is not valid TOML", path.display()))?;
    let mut value = Some(&toml::Value::Table(doc));
    for key in keys {
        value = value.and_then(|v| v.get(*key));
    }
    value
        .and_then(toml::Value::as_str)
        .map(str::to_owned)
        .with_context(|| format!("{}: no `{}` string", path.display(), keys.join(".")))
}

/// The fields of a JavaScript agent's `package.json` that the build reads.
#[derive(Debug)]
struct PackageJson {
    name: String,
    main: String,
}

fn package_json(dir: &Path) -> anyhow::Result<PackageJson> {
    let path = dir.join("package.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let doc: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not valid JSON", path.display()))?;
    let name = doc
        .get("name")
        .and_then(serde_json::Value::as_str)
        .with_context(|| format!("{}: no `name` string", path.display()))?;
    let main = doc
        .get("main")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("app.js");
    Ok(PackageJson {
        name: name.to_owned(),
        main: main.to_owned(),
    })
}

fn folder_name(dir: &Path) -> anyhow::Result<String> {
    dir.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_owned)
        .with_context(|| format!("{}: the folder has no usable name", dir.display()))
}

fn build_rust(project: &Project, out: &Path) -> anyhow::Result<()> {
    let cargo = tools::require(
        "cargo",
        "building a Rust agent needs cargo (install Rust with rustup)",
    )?;
    tools::ensure_wasm_target(&project.dir)?;
    // `homing-guest` is on no registry: the crate this binary carries stands in for it, through
    // a `[patch.crates-io]` entry given on the command line (the agent's files stay as written).
    let sdk = tools::Tools::open()?
        .sdk()?
        .join("rust")
        .join("homing-guest");
    let patch = format!(
        "patch.crates-io.homing-guest.path={}",
        toml::Value::String(sdk.display().to_string())
    );
    eprintln!(
        "homing: cargo build --release --target wasm32-wasip2 (homing-guest from {})",
        sdk.display()
    );
    // Cargo shows its own progress on stderr; stdout carries the artifacts as JSON.
    let mut child = Command::new(&cargo)
        .current_dir(&project.dir)
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--message-format=json-render-diagnostics",
            "--config",
        ])
        .arg(&patch)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {}", cargo.display()))?;
    let mut wasm = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            wasm.extend(cdylib_wasm(&line));
        }
    }
    let status = child.wait().context("waiting for cargo")?;
    if !status.success() {
        bail!("cargo build failed ({status}); its errors are above");
    }
    let lib_name = project.name.replace('-', "_");
    let built = match wasm.as_slice() {
        [] => bail!(
            "cargo built no `.wasm` library: {} needs `crate-type = [\"cdylib\"]` under [lib]",
            project.dir.join("Cargo.toml").display()
        ),
        [one] => one.clone(),
        many => many
            .iter()
            .find(|p| p.file_stem().is_some_and(|s| s == lib_name.as_str()))
            .cloned()
            .with_context(|| {
                format!("cargo built several `.wasm` libraries and none is `{lib_name}`: {many:?}")
            })?,
    };
    std::fs::copy(&built, out)
        .with_context(|| format!("cannot copy {} to {}", built.display(), out.display()))?;
    Ok(())
}

/// The `.wasm` files of a `cdylib` in one line of cargo's JSON messages.
fn cdylib_wasm(line: &str) -> Vec<PathBuf> {
    let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
        return Vec::new();
    };
    let is_cdylib = message["reason"] == "compiler-artifact"
        && message["target"]["kind"]
            .as_array()
            .is_some_and(|kinds| kinds.iter().any(|k| k == "cdylib"));
    if !is_cdylib {
        return Vec::new();
    }
    message["filenames"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(serde_json::Value::as_str)
        .filter(|f| f.ends_with(".wasm"))
        .map(PathBuf::from)
        .collect()
}

fn build_python(project: &Project, out: &Path) -> anyhow::Result<()> {
    let wit = project.wit()?;
    if !project.dir.join("app.py").is_file() {
        bail!(
            "{} is missing: a Python agent's module is `app` (homing build runs \
             componentize-py on it)",
            project.dir.join("app.py").display()
        );
    }
    let toolset = tools::Tools::open()?;
    let componentize_py = toolset.componentize_py()?;
    let sdk = toolset.sdk()?;
    tools::step(
        "componentize-py: building the component (10-20 s)",
        Command::new(componentize_py)
            .current_dir(&project.dir)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .arg("-d")
            .arg(&wit)
            .args(["componentize", "app", "-p", "."])
            .arg("-p")
            .arg(sdk.join("python"))
            .arg("-o")
            .arg(out),
    )?;
    Ok(())
}

fn build_js(project: &Project, out: &Path) -> anyhow::Result<()> {
    let wit = project.wit()?;
    let main = if project.dir.join("package.json").is_file() {
        package_json(&project.dir)?.main
    } else {
        "app.js".to_owned()
    };
    let entry = project.dir.join(&main);
    if !entry.is_file() {
        bail!(
            "{} is missing: the agent's entry module (`main` in package.json, default app.js)",
            entry.display()
        );
    }
    let toolset = tools::Tools::open()?;
    let js = toolset.js_tools()?;
    let sdk = toolset.sdk()?;
    // componentize-js sees only the folder of the module it builds: the bundle gets its own.
    let stage = project.dir.join("build").join("bundle");
    std::fs::create_dir_all(&stage)
        .with_context(|| format!("cannot create {}", stage.display()))?;
    let bundle = stage.join("app.js");
    tools::step(
        "esbuild: bundling the modules",
        Command::new(&js.esbuild)
            .current_dir(&project.dir)
            .arg(&entry)
            .args([
                "--bundle",
                "--format=esm",
                "--platform=neutral",
                "--main-fields=module,main",
                "--external:homing:*",
                "--external:wasi:*",
                "--log-level=warning",
            ])
            .arg(format!("--alias:homing-guest={}", sdk.join("js").display()))
            .arg(format!("--outfile={}", bundle.display())),
    )?;
    tools::step(
        "componentize-js: building the component (10-20 s)",
        Command::new(&js.node)
            .current_dir(&stage)
            .arg(&js.componentize_js)
            .arg("app.js")
            .arg("--wit")
            .arg(&wit)
            // `fetch()` stays on (it goes out over wasi:http); the incoming-request handler
            // (`fetch-event`) is off.
            .args(["-d", "fetch-event", "-o"])
            .arg(out),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn finds_the_cdylib_in_cargo_messages() {
        let line = r#"{"reason":"compiler-artifact","target":{"kind":["cdylib"],"name":"hi"},"filenames":["/t/wasm32-wasip2/release/hi.wasm","/t/x.d"]}"#;
        assert_eq!(
            cdylib_wasm(line),
            vec![PathBuf::from("/t/wasm32-wasip2/release/hi.wasm")]
        );
        let lib = r#"{"reason":"compiler-artifact","target":{"kind":["lib"]},"filenames":["/t/libx.rlib"]}"#;
        assert!(cdylib_wasm(lib).is_empty());
        assert!(cdylib_wasm("Compiling x").is_empty());
    }

    #[test]
    fn a_folder_without_an_agent_is_named() {
        let dir = crate::scratch::ScratchDir::new("build-empty").unwrap();
        let error = Project::find(dir.path()).unwrap_err().to_string();
        assert!(error.contains("holds no agent"), "{error}");
        assert!(error.contains("homing new"), "{error}");
    }
}

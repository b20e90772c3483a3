//! The tools `homing build` runs, installed on first use into a user cache: `$HOMING_TOOLS`,
//! else `$XDG_CACHE_HOME/homing/tools`, else `~/.cache/homing/tools`.
//!
//! - `componentize-py-<version>/`: a Python virtualenv with the pinned componentize-py (never a
//!   global `pip install`: Debian and Ubuntu refuse one, PEP 668).
//! - `js-<hash>/`: `npm ci` of the pinned `package.json` and `package-lock.json` this binary
//!   embeds (`host/templates/tools/`): componentize-js, its preview2-shim, and esbuild. The
//!   hash is of those two files, so a changed pin installs afresh beside the old one.
//! - `sdk-<hash>/`: the Python, JavaScript and Rust `homing-guest` packages of this binary,
//!   which the build hands to the agent (so the agent's folder needs nothing installed, and a
//!   Rust agent needs no registry entry for the crate).
//!
//! Each is complete once its `.homing-ready` file exists, written last. Installs take an
//! exclusive lock on `.install.lock`, so concurrent builds install once and never see a half
//! install; a half install left by a killed build is removed and redone.

use std::ffi::OsStr;
use std::fs::File;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};

/// The componentize-py release Python agents are built with.
pub const COMPONENTIZE_PY: &str = "0.25.1";
/// The componentize-js release JavaScript agents are built with (pinned by the lock file).
pub const COMPONENTIZE_JS: &str = "0.23.0";
/// The esbuild release that bundles JavaScript agents (pinned by the lock file).
pub const ESBUILD: &str = "0.28.2";
/// The oldest Node.js componentize-js runs on.
const MIN_NODE: u32 = 18;

const JS_PACKAGE: &str = include_str!("../../../templates/tools/package.json");
const JS_LOCK: &str = include_str!("../../../templates/tools/package-lock.json");

/// The SDK files this binary hands to builds, as (path, content).
const SDK: &[(&str, &str)] = &[
    (
        "python/homing_guest/__init__.py",
        include_str!("../../../../guest-sdk/python/homing_guest/__init__.py"),
    ),
    (
        "python/homing_guest/http.py",
        include_str!("../../../../guest-sdk/python/homing_guest/http.py"),
    ),
    (
        "python/homing_guest/config.py",
        include_str!("../../../../guest-sdk/python/homing_guest/config.py"),
    ),
    (
        "python/homing_guest/history.py",
        include_str!("../../../../guest-sdk/python/homing_guest/history.py"),
    ),
    (
        "python/homing_guest/wit/homing.wit",
        super::super::new::CONTRACT,
    ),
    (
        "js/package.json",
        include_str!("../../../../guest-sdk/js/package.json"),
    ),
    (
        "js/homing-guest.js",
        include_str!("../../../../guest-sdk/js/homing-guest.js"),
    ),
    (
        "js/agent.js",
        include_str!("../../../../guest-sdk/js/agent.js"),
    ),
    (
        "js/config.js",
        include_str!("../../../../guest-sdk/js/config.js"),
    ),
    (
        "js/history.js",
        include_str!("../../../../guest-sdk/js/history.js"),
    ),
    ("js/wit/homing.wit", super::super::new::CONTRACT),
    // The Rust crate, as `cargo package` makes it (its `include` list: Cargo.toml, README.md,
    // src/, testdata/, wit/). `homing build` points `homing-guest` at this copy, so a Rust agent builds
    // with no checkout of Homing and no registry entry for the crate. A test checks this list
    // against the crate's files.
    (
        "rust/homing-guest/Cargo.toml",
        include_str!("../../../../guest-sdk/Cargo.toml"),
    ),
    (
        "rust/homing-guest/README.md",
        include_str!("../../../../guest-sdk/README.md"),
    ),
    (
        "rust/homing-guest/src/agent.rs",
        include_str!("../../../../guest-sdk/src/agent.rs"),
    ),
    (
        "rust/homing-guest/src/bindings.rs",
        include_str!("../../../../guest-sdk/src/bindings.rs"),
    ),
    (
        "rust/homing-guest/src/claim.rs",
        include_str!("../../../../guest-sdk/src/claim.rs"),
    ),
    (
        "rust/homing-guest/src/config.rs",
        include_str!("../../../../guest-sdk/src/config.rs"),
    ),
    (
        "rust/homing-guest/src/enqueue.rs",
        include_str!("../../../../guest-sdk/src/enqueue.rs"),
    ),
    (
        "rust/homing-guest/src/error.rs",
        include_str!("../../../../guest-sdk/src/error.rs"),
    ),
    (
        "rust/homing-guest/src/handler.rs",
        include_str!("../../../../guest-sdk/src/handler.rs"),
    ),
    (
        "rust/homing-guest/src/history.rs",
        include_str!("../../../../guest-sdk/src/history.rs"),
    ),
    (
        "rust/homing-guest/src/http.rs",
        include_str!("../../../../guest-sdk/src/http.rs"),
    ),
    (
        "rust/homing-guest/src/json.rs",
        include_str!("../../../../guest-sdk/src/json.rs"),
    ),
    (
        "rust/homing-guest/src/lib.rs",
        include_str!("../../../../guest-sdk/src/lib.rs"),
    ),
    (
        "rust/homing-guest/src/logging.rs",
        include_str!("../../../../guest-sdk/src/logging.rs"),
    ),
    (
        "rust/homing-guest/src/mcp.rs",
        include_str!("../../../../guest-sdk/src/mcp.rs"),
    ),
    (
        "rust/homing-guest/src/step.rs",
        include_str!("../../../../guest-sdk/src/step.rs"),
    ),
    (
        "rust/homing-guest/src/waitpoint.rs",
        include_str!("../../../../guest-sdk/src/waitpoint.rs"),
    ),
    (
        "rust/homing-guest/testdata/tool_calls.json",
        include_str!("../../../../guest-sdk/testdata/tool_calls.json"),
    ),
    (
        "rust/homing-guest/testdata/masks.json",
        include_str!("../../../../guest-sdk/testdata/masks.json"),
    ),
    (
        "rust/homing-guest/wit/homing.wit",
        include_str!("../../../../guest-sdk/wit/homing.wit"),
    ),
    (
        "rust/homing-guest/wit/deps/config/store.wit",
        include_str!("../../../../guest-sdk/wit/deps/config/store.wit"),
    ),
    (
        "rust/homing-guest/wit/deps/config/world.wit",
        include_str!("../../../../guest-sdk/wit/deps/config/world.wit"),
    ),
];

/// The marker written last into a complete install.
const READY: &str = ".homing-ready";

/// The user's tool cache.
#[derive(Debug)]
pub struct Tools {
    root: PathBuf,
}

/// What a JavaScript build runs.
#[derive(Debug)]
pub struct JsTools {
    pub node: PathBuf,
    pub esbuild: PathBuf,
    pub componentize_js: PathBuf,
}

/// The tool cache's folder: `$HOMING_TOOLS`, else `$XDG_CACHE_HOME/homing/tools`, else
/// `$HOME/.cache/homing/tools`.
///
/// # Errors
///
/// When none of those variables is set.
pub fn tools_root() -> anyhow::Result<PathBuf> {
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(dir) = var("HOMING_TOOLS") {
        return Ok(dir);
    }
    if let Some(cache) = var("XDG_CACHE_HOME") {
        return Ok(cache.join("homing").join("tools"));
    }
    if let Some(home) = var("HOME") {
        return Ok(home.join(".cache").join("homing").join("tools"));
    }
    bail!("no folder for the build tools: set HOMING_TOOLS (or XDG_CACHE_HOME or HOME)")
}

impl Tools {
    /// Opens (creates) the tool cache.
    ///
    /// # Errors
    ///
    /// When it cannot be created.
    pub fn open() -> anyhow::Result<Tools> {
        let root = tools_root()?;
        std::fs::create_dir_all(&root)
            .with_context(|| format!("cannot create the tool cache {}", root.display()))?;
        Ok(Tools { root })
    }

    /// Runs `install` into `dir` unless `dir` is complete, under the cache's install lock.
    fn ensure(
        &self,
        dir: &Path,
        install: impl FnOnce(&Path) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        if dir.join(READY).exists() {
            return Ok(());
        }
        let lock_path = self.root.join(".install.lock");
        let lock = File::create(&lock_path)
            .with_context(|| format!("cannot open {}", lock_path.display()))?;
        lock.lock()
            .with_context(|| format!("cannot lock {}", lock_path.display()))?;
        // Another build may have installed it while this one waited for the lock.
        if dir.join(READY).exists() {
            return Ok(());
        }
        if dir.exists() {
            std::fs::remove_dir_all(dir)
                .with_context(|| format!("cannot remove the half install {}", dir.display()))?;
        }
        install(dir)?;
        std::fs::write(dir.join(READY), b"")
            .with_context(|| format!("cannot write {}", dir.join(READY).display()))?;
        // The lock is released when `lock` is dropped.
        Ok(())
    }

    /// The venv's `componentize-py`, installed on first use.
    ///
    /// # Errors
    ///
    /// When Python is missing or the install fails.
    pub fn componentize_py(&self) -> anyhow::Result<PathBuf> {
        let venv = self.root.join(format!("componentize-py-{COMPONENTIZE_PY}"));
        let bin = venv.join("bin").join("componentize-py");
        self.ensure(&venv, |venv| {
            let python = python(&self.root)?;
            step(
                &format!("creating a Python virtualenv in {}", venv.display()),
                Command::new(&python).args(["-m", "venv"]).arg(venv),
            )?;
            step(
                &format!("installing componentize-py {COMPONENTIZE_PY} from PyPI (once)"),
                Command::new(venv.join("bin").join("python"))
                    .args([
                        "-m",
                        "pip",
                        "install",
                        "--disable-pip-version-check",
                        "--quiet",
                    ])
                    .arg(format!("componentize-py=={COMPONENTIZE_PY}")),
            )?;
            let version = capture(Command::new(&bin).arg("--version"))?;
            if !version.contains(COMPONENTIZE_PY) {
                bail!(
                    "{} reports `{}`, expected {COMPONENTIZE_PY}",
                    bin.display(),
                    version.trim()
                );
            }
            Ok(())
        })?;
        Ok(bin)
    }

    /// Node, esbuild and componentize-js, installed with `npm ci` on first use.
    ///
    /// # Errors
    ///
    /// When Node.js or npm is missing or too old, or the install fails.
    pub fn js_tools(&self) -> anyhow::Result<JsTools> {
        let why = format!(
            "building a JavaScript agent needs Node.js {MIN_NODE} or later with npm, to install \
             componentize-js {COMPONENTIZE_JS} and esbuild {ESBUILD} into {}",
            self.root.display()
        );
        let node = require("node", &why)?;
        let version = capture(Command::new(&node).arg("--version"))?;
        let major = version
            .trim()
            .trim_start_matches('v')
            .split('.')
            .next()
            .and_then(|m| m.parse::<u32>().ok());
        if major.is_none_or(|m| m < MIN_NODE) {
            bail!("{why}; {} is `{}`", node.display(), version.trim());
        }
        let prefix = self
            .root
            .join(format!("js-{}", short_hash(&[JS_PACKAGE, JS_LOCK])));
        let tools = JsTools {
            node,
            esbuild: prefix.join("node_modules").join(".bin").join("esbuild"),
            componentize_js: prefix
                .join("node_modules/@bytecodealliance/componentize-js/src/cli.js"),
        };
        self.ensure(&prefix, |prefix| {
            let npm = require("npm", &why)?;
            std::fs::create_dir_all(prefix)
                .with_context(|| format!("cannot create {}", prefix.display()))?;
            for (name, text) in [("package.json", JS_PACKAGE), ("package-lock.json", JS_LOCK)] {
                std::fs::write(prefix.join(name), text)
                    .with_context(|| format!("cannot write {}", prefix.join(name).display()))?;
            }
            step(
                &format!(
                    "installing componentize-js {COMPONENTIZE_JS} and esbuild {ESBUILD} with npm ci \
                     into {} (once)",
                    prefix.display()
                ),
                Command::new(npm).current_dir(prefix).args([
                    "ci",
                    "--no-audit",
                    "--no-fund",
                    "--loglevel=error",
                ]),
            )?;
            for file in [&tools.esbuild, &tools.componentize_js] {
                if !file.exists() {
                    bail!("npm ci finished but {} is missing", file.display());
                }
            }
            Ok(())
        })?;
        Ok(tools)
    }

    /// The folder holding this binary's Python (`python/`), JavaScript (`js/`) and Rust
    /// (`rust/homing-guest/`) SDK.
    ///
    /// # Errors
    ///
    /// When the files cannot be written.
    pub fn sdk(&self) -> anyhow::Result<PathBuf> {
        let contents: Vec<&str> = SDK.iter().flat_map(|(path, text)| [*path, *text]).collect();
        let dir = self.root.join(format!("sdk-{}", short_hash(&contents)));
        self.ensure(&dir, |dir| {
            for (path, text) in SDK {
                let file = dir.join(path);
                if let Some(parent) = file.parent() {
                    std::fs::create_dir_all(parent)
                        .with_context(|| format!("cannot create {}", parent.display()))?;
                }
                std::fs::write(&file, text)
                    .with_context(|| format!("cannot write {}", file.display()))?;
            }
            Ok(())
        })?;
        Ok(dir)
    }
}

/// The first 12 hex digits of the SHA-256 of `parts`, each length-prefixed.
fn short_hash(parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    hasher
        .finalize()
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The Python that creates the venv: `$HOMING_PYTHON`, else `python3` on the PATH.
fn python(root: &Path) -> anyhow::Result<PathBuf> {
    if let Some(python) = std::env::var_os("HOMING_PYTHON").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(python));
    }
    require(
        "python3",
        &format!(
            "building a Python agent needs Python 3.10 or later with its venv module, to install \
             componentize-py {COMPONENTIZE_PY} into {} (or set HOMING_PYTHON to a Python \
             executable)",
            root.display()
        ),
    )
}

/// `name` on the PATH.
///
/// # Errors
///
/// When it is not there: `why` says what needed it.
pub fn require(name: &str, why: &str) -> anyhow::Result<PathBuf> {
    find_on_path(name).with_context(|| format!("{why}: `{name}` is not on the PATH"))
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Adds the `wasm32-wasip2` target with rustup when the toolchain used in `dir` lacks it.
///
/// # Errors
///
/// When the target is missing and cannot be added.
pub fn ensure_wasm_target(dir: &Path) -> anyhow::Result<()> {
    const TARGET: &str = "wasm32-wasip2";
    let Some(rustup) = find_on_path("rustup") else {
        // A toolchain without rustup: the target is there when its standard library is.
        let rustc = require(
            "rustc",
            "building a Rust agent needs Rust (install it with rustup)",
        )?;
        let sysroot = capture(
            Command::new(rustc)
                .current_dir(dir)
                .args(["--print", "sysroot"]),
        )?;
        if Path::new(sysroot.trim())
            .join("lib/rustlib")
            .join(TARGET)
            .is_dir()
        {
            return Ok(());
        }
        bail!(
            "building a Rust agent needs the {TARGET} target, which this toolchain ({}) lacks, \
             and rustup is not on the PATH to add it",
            sysroot.trim()
        );
    };
    let installed =
        capture(
            Command::new(&rustup)
                .current_dir(dir)
                .args(["target", "list", "--installed"]),
        )?;
    if installed.lines().any(|line| line.trim() == TARGET) {
        return Ok(());
    }
    step(
        &format!("adding the {TARGET} target with rustup (once)"),
        Command::new(rustup)
            .current_dir(dir)
            .args(["target", "add", TARGET]),
    )
}

/// The stdout of a short command that must succeed.
fn capture(cmd: &mut Command) -> anyhow::Result<String> {
    let shown = program(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {shown}"))?;
    if !out.status.success() {
        bail!("{shown} failed ({}):\n{}", out.status, tail(&out));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn program(cmd: &Command) -> String {
    let args: Vec<&OsStr> = cmd.get_args().collect();
    let mut shown = cmd.get_program().to_string_lossy().into_owned();
    for arg in args.iter().take(3) {
        shown.push(' ');
        shown.push_str(&arg.to_string_lossy());
    }
    if args.len() > 3 {
        shown.push_str(" ...");
    }
    shown
}

/// The last lines a failed command wrote, stderr then stdout.
fn tail(out: &Output) -> String {
    const LINES: usize = 40;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LINES)..].join("\n")
}

/// Runs one step of a build: says what it does, shows the seconds going by while it runs
/// (updated in place on a terminal, every 10 s otherwise), and on failure reports the
/// command's last lines of output.
///
/// # Errors
///
/// When the command cannot start or fails.
pub fn step(what: &str, cmd: &mut Command) -> anyhow::Result<()> {
    let shown = program(cmd);
    let tty = std::io::stderr().is_terminal();
    let started = Instant::now();
    if tty {
        eprint!("homing: {what} ...");
    } else {
        eprintln!("homing: {what} ...");
    }
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("{what}: cannot start {shown}"))?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let mut next_report = 10;
    let out = loop {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(result) => break result.with_context(|| format!("{what}: waiting for {shown}"))?,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let secs = started.elapsed().as_secs();
                if tty {
                    eprint!("\rhoming: {what} ... {secs} s");
                } else if secs >= next_report {
                    eprintln!("homing: {what} ... {secs} s");
                    next_report = secs + 10;
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                bail!("{what}: lost track of {shown}")
            }
        }
    };
    let secs = started.elapsed().as_secs_f64();
    if tty {
        eprintln!("\rhoming: {what} ... {secs:.1} s");
    }
    if !out.status.success() {
        bail!("{what}: {shown} failed ({}):\n{}", out.status, tail(&out));
    }
    if !tty && secs >= 1.0 {
        eprintln!("homing: {what}: done in {secs:.1} s");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use std::collections::BTreeSet;
    use std::path::Path;

    use super::SDK;

    fn files_under(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files_under(root, &path, out);
            } else {
                let rel = path.strip_prefix(root).unwrap();
                out.insert(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }

    /// The Rust crate the binary carries is the whole crate as `cargo package` includes it
    /// (Cargo.toml, README.md, src/, testdata/, wit/), byte for byte.
    #[test]
    fn the_carried_rust_crate_is_the_whole_crate() {
        let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-sdk");
        let mut on_disk = BTreeSet::from(["Cargo.toml".to_owned(), "README.md".to_owned()]);
        for dir in ["src", "testdata", "wit"] {
            files_under(&crate_dir, &crate_dir.join(dir), &mut on_disk);
        }
        let carried: BTreeSet<String> = SDK
            .iter()
            .filter_map(|(path, _)| path.strip_prefix("rust/homing-guest/"))
            .map(str::to_owned)
            .collect();
        assert_eq!(carried, on_disk);
        for (path, text) in SDK {
            if let Some(rel) = path.strip_prefix("rust/homing-guest/") {
                let disk = std::fs::read_to_string(crate_dir.join(rel)).unwrap();
                assert_eq!(&disk, text, "{rel} differs from guest-sdk/{rel}");
            }
        }
    }
}

//! `homing new` and `homing build`, as a guest author outside the repository uses them: in a
//! temporary directory, `homing new`, `homing build`, `homing enqueue`, `homing run
//! --until-idle`, and each dispatch acked with the template's reply, for Rust, Python and
//! JavaScript in both worlds. The Rust templates build with the `homing-guest` crate the binary
//! carries (no checkout, no registry entry), with an empty `HOME` and tool cache.
//!
//! The Python and JavaScript tools are installed by `homing build` itself into one
//! `HOMING_TOOLS` under the cargo target directory, shared by every test and every run, so
//! they are installed once per machine. Installing them needs python3 with venv and node with
//! npm; a test fails loudly, never skips, when they are missing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::common::root;

/// The cargo target directory this test was built in (`<target>/release/homing`).
fn target_dir() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_homing"));
    bin.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// The tool cache every test shares.
fn tools_dir() -> PathBuf {
    target_dir().join("homing-tools")
}

/// `homing args` in `dir`, with the test's tool cache and nothing from the caller's Homing
/// environment.
fn homing(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_homing"));
    cmd.args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .env("HOMING_TOOLS", tools_dir())
        .env("HOMING_LOG", "info")
        // The Rust agents share one target directory (not the test's own, which cargo holds).
        .env("CARGO_TARGET_DIR", target_dir().join("new-agents"))
        .env_remove("RUSTFLAGS")
        .env_remove("HOMING_CONFIG")
        .env_remove("HOMING_STORE_PATH")
        .env_remove("HOMING_HOST_ID");
    cmd
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn run(mut cmd: impl std::borrow::BorrowMut<Command>, what: &str) -> String {
    ok(cmd.borrow_mut().output().unwrap(), what)
}

/// `homing new hello` in a fresh temporary directory, then `homing build`; returns the
/// directory (kept alive by the caller) and the agent's folder.
fn new_and_build(lang: &str, world: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    assert!(
        !tmp.path().starts_with(root()),
        "the agent must be outside the repository"
    );
    let made = run(
        homing(
            tmp.path(),
            &["new", "hello", "--lang", lang, "--world", world],
        ),
        "homing new",
    );
    assert!(made.contains("homing build"), "{made}");
    let agent = tmp.path().join("hello");
    for file in ["homing.toml", "README.md", ".gitignore"] {
        assert!(agent.join(file).is_file(), "{lang}: no {file}");
    }
    let mut build = homing(tmp.path(), &["build", "hello"]);
    if lang == "rust" {
        assert!(agent.join("wit/homing.wit").is_file());
        // `homing-guest` is on no registry and the agent names no path to it: the build must
        // use the crate the binary carries, with an empty HOME and an empty tool cache (cargo
        // and rustup keep their own homes, so the toolchain and crates.io's crates are found).
        let manifest = std::fs::read_to_string(agent.join("Cargo.toml")).unwrap();
        assert!(manifest.contains("homing-guest = "), "{manifest}");
        assert!(!manifest.contains("path"), "{manifest}");
        let home = tmp.path().join("home");
        let tools = tmp.path().join("tools");
        std::fs::create_dir(&home).unwrap();
        let real_home = PathBuf::from(std::env::var_os("HOME").unwrap());
        let cargo_home =
            std::env::var_os("CARGO_HOME").map_or_else(|| real_home.join(".cargo"), PathBuf::from);
        let rustup_home = std::env::var_os("RUSTUP_HOME")
            .map_or_else(|| real_home.join(".rustup"), PathBuf::from);
        build
            .env("HOME", &home)
            .env("HOMING_TOOLS", &tools)
            .env_remove("XDG_CACHE_HOME")
            .env("CARGO_HOME", cargo_home)
            .env("RUSTUP_HOME", rustup_home);
        let out = build.output().unwrap();
        let path = ok(out, &format!("homing build ({lang}, {world})"));
        let unpacked = std::fs::read_dir(&tools)
            .unwrap()
            .filter_map(Result::ok)
            .any(|e| e.path().join("rust/homing-guest/src/lib.rs").is_file());
        assert!(unpacked, "the crate is unpacked into the empty tool cache");
        return checked_build(tmp, agent, &path);
    }
    assert!(agent.join("wit/world.wit").is_file());
    assert!(agent.join("wit/deps/homing-agent/homing.wit").is_file());
    let out = build.output().unwrap();
    let path = ok(out, &format!("homing build ({lang}, {world})"));
    checked_build(tmp, agent, &path)
}

/// Checks that `homing build` printed `path`, the agent's component, and that it exists.
fn checked_build(
    tmp: tempfile::TempDir,
    agent: PathBuf,
    path: &str,
) -> (tempfile::TempDir, PathBuf) {
    let expected = std::fs::canonicalize(&agent)
        .unwrap()
        .join("build")
        .join("hello.wasm");
    assert_eq!(
        Path::new(&path),
        expected,
        "homing build prints the component"
    );
    assert!(expected.is_file());
    (tmp, agent)
}

/// The template's reply to the `n`th message `text` on thread `t1`.
fn reply(text: &str, n: usize) -> String {
    format!("hello, {text}! (message {n} on thread t1)")
}

/// The README's path: from the agent's folder, with its `homing.toml`, enqueue two messages on
/// one thread, run until idle, and find both acked with the template's replies (the second
/// read the first back from the thread log).
fn runs_from_new_to_acked(lang: &str, world: &str) {
    let (_tmp, agent) = new_and_build(lang, world);
    let enqueue = |text: &str| {
        run(
            homing(
                &agent,
                &[
                    "enqueue",
                    "--agent",
                    "hello",
                    "--thread",
                    "t1",
                    "--payload",
                    text,
                ],
            ),
            "homing enqueue",
        )
    };
    let first = enqueue("world");
    let second = enqueue("again");
    let out = homing(&agent, &["run", "--until-idle"]).output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    ok(out, "homing run --until-idle");
    // It says it is compiling before it does.
    let said = log
        .find("compiling the component")
        .unwrap_or_else(|| panic!("no compile notice in the log:\n{log}"));
    let done = log.find("component compiled (cache miss)").unwrap();
    assert!(said < done, "{log}");

    for (id, text, n) in [(&first, "world", 1), (&second, "again", 2)] {
        let shown = run(
            homing(&agent, &["dispatch", "show", id, "--json"]),
            "homing dispatch show",
        );
        let d: Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(d["status"], "acked", "{lang} {world}: {d}\n{log}");
        assert_eq!(d["result"]["output"], reply(text, n), "{lang} {world}: {d}");
    }
}

#[test]
fn rust_handler_from_new_to_acked() {
    runs_from_new_to_acked("rust", "handler");
}

#[test]
fn rust_agent_world_from_new_to_acked() {
    runs_from_new_to_acked("rust", "agent");
}

#[test]
fn python_handler_from_new_to_acked() {
    runs_from_new_to_acked("python", "handler");
}

#[test]
fn python_agent_world_from_new_to_acked() {
    runs_from_new_to_acked("python", "agent");
}

#[test]
fn js_handler_from_new_to_acked() {
    runs_from_new_to_acked("js", "handler");
}

#[test]
fn js_agent_world_from_new_to_acked() {
    runs_from_new_to_acked("js", "agent");
}

/// With no toolchain on the PATH and an empty tool cache, `homing build` names what is
/// missing for each language.
#[test]
fn a_missing_toolchain_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let empty_path = tmp.path().join("empty-path");
    std::fs::create_dir(&empty_path).unwrap();
    for (lang, missing) in [
        ("python", "`python3` is not on the PATH"),
        ("js", "`node` is not on the PATH"),
        ("rust", "`cargo` is not on the PATH"),
    ] {
        run(
            homing(tmp.path(), &["new", lang, "--lang", lang]),
            "homing new",
        );
        let out = homing(tmp.path(), &["build", lang])
            .env("PATH", &empty_path)
            .env("HOMING_TOOLS", tmp.path().join("tools"))
            .env_remove("HOMING_PYTHON")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{lang}: built without tools: {stderr}"
        );
        assert!(stderr.contains(missing), "{lang}: {stderr}");
        assert!(
            stderr.contains("needs"),
            "{lang}: says what needs it: {stderr}"
        );
    }
    // A folder with no agent in it.
    let out = homing(tmp.path(), &["build", "empty-path"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("holds no agent"), "{stderr}");
}

/// `homing new` refuses a bad name and an existing folder, and writes nothing then.
#[test]
fn new_refuses_bad_names_and_existing_folders() {
    let tmp = tempfile::tempdir().unwrap();
    let out = homing(tmp.path(), &["new", "Bad Name", "--lang", "rust"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("agent name"));
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);

    std::fs::create_dir(tmp.path().join("taken")).unwrap();
    let out = homing(tmp.path(), &["new", "taken", "--lang", "js"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists"));
    assert_eq!(
        std::fs::read_dir(tmp.path().join("taken")).unwrap().count(),
        0
    );
}

/// Every copy of the contract is the contract: the Rust crate's, the Python package's, the
/// JavaScript package's.
#[test]
fn sdk_wit_copies_match_the_contract() {
    let contract = std::fs::read_to_string(root().join("wit/homing.wit")).unwrap();
    for copy in [
        "guest-sdk/wit/homing.wit",
        "guest-sdk/python/homing_guest/wit/homing.wit",
        "guest-sdk/js/wit/homing.wit",
    ] {
        let text =
            std::fs::read_to_string(root().join(copy)).unwrap_or_else(|e| panic!("{copy}: {e}"));
        assert!(
            text == contract,
            "{copy} differs from wit/homing.wit: copy the contract over it"
        );
    }
}

/// The Rust SDK's copy of `wasi:config` is the one the examples and `homing new` use, and both
/// the examples' world and the template world import `wasi:http` and `wasi:config`.
#[test]
fn wasi_wit_copies_match() {
    for name in ["store.wit", "world.wit"] {
        let sdk =
            std::fs::read_to_string(root().join("guest-sdk/wit/deps/config").join(name)).unwrap();
        let examples =
            std::fs::read_to_string(root().join("examples/wit/deps/wasi-config").join(name))
                .unwrap();
        assert!(
            sdk == examples,
            "guest-sdk/wit/deps/config/{name} differs from examples/wit/deps/wasi-config/{name}"
        );
    }
    let world = std::fs::read_to_string(root().join("examples/wit/tool-agent.wit")).unwrap();
    let template = std::fs::read_to_string(root().join("host/templates/common/world.wit")).unwrap();
    for import in [
        "import wasi:http/outgoing-handler@0.2.12;",
        "import wasi:config/store@0.2.0-rc.1;",
    ] {
        assert!(world.contains(import), "tool-agent.wit lacks `{import}`");
        assert!(
            template.contains(import),
            "the template world lacks `{import}`"
        );
    }
}

/// `npm pack` packs the JavaScript SDK with its module, the agent-world module, the WIT and
/// the README.
#[test]
fn js_sdk_packs() {
    let out = Command::new("npm")
        .current_dir(root().join("guest-sdk/js"))
        .args(["pack", "--dry-run", "--json", "--loglevel=error"])
        .output()
        .expect("npm is needed to check the JavaScript SDK package");
    let packed: Value = serde_json::from_str(&ok(out, "npm pack --dry-run")).unwrap();
    let files: Vec<&str> = packed[0]["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    for file in [
        "homing-guest.js",
        "agent.js",
        "config.js",
        "wit/homing.wit",
        "README.md",
        "package.json",
    ] {
        assert!(files.contains(&file), "npm pack lacks {file}: {files:?}");
    }
}

/// The Python and JavaScript SDKs' history helpers (`history.py`, `history.js`) give what the
/// shared cases expect, as the Rust SDK's `history` module does (its unit test reads the same
/// file): tool calls a stopped run left unanswered get error results, and `unmasked` drops
/// what a rollback masked.
#[test]
fn sdk_history_helpers_close_unanswered_tool_calls_in_python_and_javascript() {
    let tool_calls = "guest-sdk/testdata/tool_calls.json";
    let python = in_python(
        "import importlib.util, json, sys\n\
             spec = importlib.util.spec_from_file_location('history', sys.argv[1])\n\
             h = importlib.util.module_from_spec(spec); spec.loader.exec_module(h)\n\
             n = 0\n\
             for c in json.load(open(sys.argv[2])):\n\
             \x20   m = c['input']\n\
             \x20   f = {'openai': h.close_tool_calls_openai, 'anthropic': h.close_tool_calls_anthropic}[c['format']]\n\
             \x20   added = f(m)\n\
             \x20   assert (m, added) == (c['expected'], c['added']), (c['name'], m, added)\n\
             \x20   n += 1\n\
             print(n)\n",
        tool_calls,
    );
    let node = in_node(
        "import { readFileSync } from 'node:fs';\n\
             import assert from 'node:assert/strict';\n\
             const h = await import(process.argv[1]);\n\
             let n = 0;\n\
             for (const c of JSON.parse(readFileSync(process.argv[2], 'utf8'))) {\n\
               const f = c.format === 'openai' ? h.closeToolCallsOpenai : h.closeToolCallsAnthropic;\n\
               const m = c.input; const added = f(m);\n\
               assert.deepStrictEqual(m, c.expected, c.name); assert.equal(added, c.added, c.name);\n\
               n += 1;\n\
             }\n\
             console.log(n);\n",
        tool_calls,
    );
    assert!(python >= 10, "every case ran in Python");
    assert_eq!(python, node);

    // `unmasked`, against the cases the Rust SDK checks too.
    let masks = "guest-sdk/testdata/masks.json";
    let python = in_python(
        "import importlib.util, json, sys\n\
             from types import SimpleNamespace as N\n\
             spec = importlib.util.spec_from_file_location('history', sys.argv[1])\n\
             h = importlib.util.module_from_spec(spec); spec.loader.exec_module(h)\n\
             n = 0\n\
             for c in json.load(open(sys.argv[2])):\n\
             \x20   es = [N(seq=e['seq'], turn=None if 'turn' not in e else N(masked=None if 'masked' not in e['turn'] else tuple(e['turn']['masked']))) for e in c['entries']]\n\
             \x20   kept = [e.seq for e in h.unmasked(es)]\n\
             \x20   assert kept == c['expected'], (c['name'], kept)\n\
             \x20   n += 1\n\
             print(n)\n",
        masks,
    );
    let node = in_node(
        "import { readFileSync } from 'node:fs';\n\
             import assert from 'node:assert/strict';\n\
             const h = await import(process.argv[1]);\n\
             let n = 0;\n\
             for (const c of JSON.parse(readFileSync(process.argv[2], 'utf8'))) {\n\
               const es = c.entries.map((e) => ({ seq: BigInt(e.seq), turn: e.turn === undefined ? undefined\n\
                 : { masked: e.turn.masked === undefined ? undefined : { first: BigInt(e.turn.masked[0]), last: BigInt(e.turn.masked[1]) } } }));\n\
               assert.deepStrictEqual(h.unmasked(es).map((e) => Number(e.seq)), c.expected, c.name);\n\
               n += 1;\n\
             }\n\
             console.log(n);\n",
        masks,
    );
    assert!(python >= 6, "every mask case ran in Python");
    assert_eq!(python, node);
}

/// Runs `script` with the Python SDK's `history.py` and the cases file `cases` (under the
/// repository) as its arguments; the number of cases it printed.
fn in_python(script: &str, cases: &str) -> usize {
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(root().join("guest-sdk/python/homing_guest/history.py"))
        .arg(root().join(cases))
        .output()
        .expect("python3 runs (the tests need Python)");
    counted("python", &out)
}

/// [`in_python`] for the JavaScript SDK's `history.js`, with Node.
fn in_node(script: &str, cases: &str) -> usize {
    let out = std::process::Command::new("node")
        .args(["--input-type=module", "-e"])
        .arg(script)
        .arg(format!(
            "file://{}",
            root().join("guest-sdk/js/history.js").display()
        ))
        .arg(root().join(cases))
        .output()
        .expect("node runs (the tests need Node)");
    counted("node", &out)
}

fn counted(what: &str, out: &std::process::Output) -> usize {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse::<usize>()
        .unwrap_or_else(|e| panic!("{what} printed no count: {e}"))
}

/// The Python SDK builds into a wheel carrying the package and its WIT (built from a copy, so
/// the build leaves nothing in the repository).
#[test]
fn python_sdk_builds_a_wheel() {
    let tmp = tempfile::tempdir().unwrap();
    let source = tmp.path().join("src");
    let sdk = root().join("guest-sdk/python");
    for file in [
        "pyproject.toml",
        "README.md",
        "homing_guest/__init__.py",
        "homing_guest/http.py",
        "homing_guest/config.py",
        "homing_guest/history.py",
        "homing_guest/py.typed",
        "homing_guest/wit/homing.wit",
    ] {
        let to = source.join(file);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(sdk.join(file), &to).unwrap_or_else(|e| panic!("{file}: {e}"));
    }
    let wheels = tmp.path().join("wheels");
    run(
        Command::new("python3")
            .args([
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--quiet",
                "--disable-pip-version-check",
                "-w",
            ])
            .arg(&wheels)
            .arg(&source),
        "pip wheel guest-sdk/python (needs python3 with pip)",
    );
    let wheel = std::fs::read_dir(&wheels)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .expect("no wheel built");
    let listing = run(
        Command::new("python3")
            .args(["-m", "zipfile", "-l"])
            .arg(&wheel),
        "listing the wheel",
    );
    for file in [
        "homing_guest/__init__.py",
        "homing_guest/http.py",
        "homing_guest/config.py",
        "homing_guest/wit/homing.wit",
    ] {
        assert!(listing.contains(file), "the wheel lacks {file}:\n{listing}");
    }
}

/// `homing dev` in the agent's folder: serves it, and a change to its source rebuilds it and
/// swaps it in while the host runs; the next dispatch answers with the new code.
fn dev_rebuilds_and_swaps(lang: &str, source: &str) {
    let (_tmp, agent) = new_and_build(lang, "handler");
    /// Stops `homing dev` however the test ends.
    struct Dev(std::process::Child);
    impl Drop for Dev {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _dev = Dev(homing(&agent, &["dev"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(agent.join("dev.log")).unwrap())
        .spawn()
        .unwrap());
    let log = || std::fs::read_to_string(agent.join("dev.log")).unwrap_or_default();
    let ask = |thread: &str| {
        run(
            homing(
                &agent,
                &[
                    "enqueue",
                    "--agent",
                    "hello",
                    "--thread",
                    thread,
                    "--payload",
                    "dev",
                    "--wait",
                    "--timeout",
                    "120s",
                ],
            ),
            "homing enqueue --wait",
        )
    };
    assert_eq!(
        ask("d0"),
        "hello, dev! (message 1 on thread d0)",
        "{}",
        log()
    );
    let path = agent.join(source);
    let code = std::fs::read_to_string(&path).unwrap();
    assert!(code.contains("hello, {text}!"), "{code}");
    std::fs::write(&path, code.replace("hello, {text}!", "howdy, {text}!")).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    let mut n = 1;
    loop {
        let answer = ask(&format!("d{n}"));
        if answer.starts_with("howdy") {
            assert_eq!(answer, format!("howdy, dev! (message 1 on thread d{n})"));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{lang}: the edit never reached the host:\n{}",
            log()
        );
        n += 1;
    }
    let log = log();
    assert!(log.contains("rebuilding"), "{log}");
    assert!(log.contains("plugin swapped to a new version"), "{log}");
}

#[test]
fn dev_rebuilds_and_swaps_a_rust_agent() {
    dev_rebuilds_and_swaps("rust", "src/lib.rs");
}

#[test]
fn dev_rebuilds_and_swaps_a_python_agent() {
    dev_rebuilds_and_swaps("python", "app.py");
}

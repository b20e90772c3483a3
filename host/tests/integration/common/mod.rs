//! Shared helpers of the end-to-end tests: real guest components built from source, a
//! scratch directory with a `homing.toml`, and the `homing` binary.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

/// The host workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The cargo target directory this test was built in (`<target>/release/homing`).
pub fn target_dir() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_homing"));
    bin.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// Builds the example guests and the test guests (once per test process) and returns the
/// directory holding their `.wasm` files. Fails loudly when the wasm target is missing.
pub fn guest_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = target_dir().join("guests");
        for workspace in ["examples", "tests/guests"] {
            let result = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
                .current_dir(root().join(workspace))
                .env("CARGO_TARGET_DIR", &out)
                .env_remove("RUSTFLAGS")
                .args(["build", "--release", "--target", "wasm32-wasip2", "--quiet"])
                .output()
                .expect("cannot run cargo to build the guests");
            assert!(
                result.status.success(),
                "building the {workspace} guests failed (is the wasm32-wasip2 target installed? \
                 `cargo xtask test` installs it):\n{}",
                String::from_utf8_lossy(&result.stderr)
            );
        }
        out.join("wasm32-wasip2").join("release")
    })
}

/// The path of a built guest.
pub fn guest(name: &str) -> PathBuf {
    let path = guest_dir().join(format!("{name}.wasm"));
    assert!(
        path.exists(),
        "guest {name} was not built at {}",
        path.display()
    );
    path
}

/// A scratch directory with a config and a store.
pub struct Env {
    pub dir: tempfile::TempDir,
}

impl Env {
    /// A scratch directory with `config` written to `homing.toml`.
    pub fn new(config: &str) -> Env {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("homing.toml"), config).unwrap();
        Env { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn config(&self) -> PathBuf {
        self.dir.path().join("homing.toml")
    }

    /// A `homing` command against this directory's config.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_homing"));
        cmd.arg("--config")
            .arg(self.config())
            .args(args)
            .current_dir(self.path());
        cmd.env("HOMING_LOG", "info")
            .env_remove("HOMING_STORE_PATH")
            .env_remove("HOMING_HOST_ID");
        cmd
    }

    /// Runs `homing args` to completion.
    pub fn homing(&self, args: &[&str]) -> Output {
        self.command(args).stdin(Stdio::null()).output().unwrap()
    }

    /// Runs `homing args` and expects success; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.homing(args);
        assert!(
            out.status.success(),
            "homing {args:?} failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Runs `homing args` and expects failure; returns stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let out = self.homing(args);
        assert!(
            !out.status.success(),
            "homing {args:?} should have failed but printed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// Enqueues a dispatch and returns its id.
    pub fn enqueue(&self, agent: &str, thread: &str, payload: &str, extra: &[&str]) -> String {
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
        self.ok(&args)
    }

    /// `homing run --until-idle`, expecting success; returns stderr (the log).
    pub fn run_until_idle(&self) -> String {
        let out = self
            .command(&["run", "--until-idle"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success(),
            "homing run failed: {}\n{log}",
            out.status
        );
        log
    }

    /// Starts `homing run` in the background (log to a file in the scratch dir).
    pub fn spawn_run(&self) -> Child {
        let log = std::fs::File::create(self.path().join("host.log")).unwrap();
        self.command(&["run"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
    }

    /// The host log written by [`Env::spawn_run`].
    pub fn host_log(&self) -> String {
        std::fs::read_to_string(self.path().join("host.log")).unwrap_or_default()
    }

    /// One dispatch as JSON.
    pub fn show(&self, id: &str) -> Value {
        serde_json::from_str(&self.ok(&["dispatch", "show", id, "--json"])).unwrap()
    }

    /// Every dispatch as JSON.
    pub fn list(&self) -> Vec<Value> {
        serde_json::from_str(&self.ok(&["dispatch", "list", "--limit", "10000", "--json"])).unwrap()
    }

    /// Polls until `id` reaches `status`, or fails after `within`.
    pub fn wait_status(&self, id: &str, status: &str, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let d = self.show(id);
            if d["status"] == status {
                return d;
            }
            assert!(
                Instant::now() < deadline,
                "dispatch {id} did not reach {status} within {within:?}: {d}\nhost log:\n{}",
                self.host_log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Sends a signal to a child process.
pub fn signal(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal} failed");
}

/// Waits for a child to exit, failing after `within`.
pub fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("process {} did not exit within {within:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A TOML string literal for a path.
pub fn toml_path(path: &Path) -> String {
    format!("{:?}", path.display().to_string())
}

/// Builds the Python and JavaScript example agents (once per test process) with `cargo xtask
/// polyglot`, which installs the pinned componentize-py and componentize-js into `.tools/` when
/// they are missing, and returns the directory holding `python-agent.wasm` and `js-agent.wasm`.
/// Fails loudly (never skips) when Python with pip or Node with npm is missing.
pub fn polyglot_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = target_dir().join("polyglot");
        let result = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(root())
            // Its own target dir: the test's cargo may still hold the lock on this one.
            .env("CARGO_TARGET_DIR", target_dir().join("xtask"))
            .env_remove("RUSTFLAGS")
            .args(["run", "--quiet", "--package", "xtask", "--", "polyglot"])
            .arg(&out)
            .output()
            .expect("cannot run cargo to build the Python and JavaScript guests");
        assert!(
            result.status.success(),
            "`cargo xtask polyglot` failed (it needs python3 with pip and venv, and node with \
             npm, to install componentize-py and componentize-js into .tools/):\n{}\n{}",
            String::from_utf8_lossy(&result.stdout),
            String::from_utf8_lossy(&result.stderr)
        );
        out
    })
}

/// The path of a built Python or JavaScript agent (`python-agent`, `js-agent`).
pub fn polyglot_guest(name: &str) -> PathBuf {
    let path = polyglot_dir().join(format!("{name}.wasm"));
    assert!(
        path.exists(),
        "agent {name} was not built at {}",
        path.display()
    );
    path
}

/// A compiled-component cache shared by the tests of one target dir: a Python or JavaScript
/// component takes about 10 s to compile, and most tests are not about the cache.
pub fn shared_cache_dir() -> PathBuf {
    target_dir().join("polyglot-cache")
}

/// `HOMING_SOAK=1`: run the long variants of the fault and fuzz tests.
pub fn soak() -> bool {
    std::env::var("HOMING_SOAK").is_ok_and(|v| v == "1")
}

/// `HOMING_SEED`, else a fresh seed from the clock (tests print it so a run can be replayed).
pub fn seed() -> u64 {
    std::env::var("HOMING_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            u64::try_from(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos()
                    % 1_000_000_007,
            )
            .unwrap()
        })
}

/// A count from the environment variable `name` (`None` when unset or not a number).
pub fn env_count(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|s| s.trim().parse().ok())
}

/// Load: one thread per core spinning without pause until dropped, so the test's own threads
/// (and a `nats-server` beside it) compete for every core and may be descheduled at any point,
/// as on a busy machine. It slows whatever else the test process runs meanwhile.
pub struct CpuHog {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<u64>>,
}

impl CpuHog {
    /// Starts one spinning thread per core the process may use.
    pub fn start() -> CpuHog {
        use std::sync::atomic::{AtomicBool, Ordering};
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let threads = (0..cores)
            .map(|i| {
                let stop = stop.clone();
                std::thread::Builder::new()
                    .name(format!("cpu-hog-{i}"))
                    .spawn(move || {
                        let mut spins = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            for _ in 0..1_000 {
                                std::hint::spin_loop();
                            }
                            spins = spins.wrapping_add(1);
                        }
                        spins
                    })
                    .expect("start a cpu hog thread")
            })
            .collect();
        eprintln!("cpu hog: {cores} threads spinning");
        CpuHog { stop, threads }
    }
}

impl Drop for CpuHog {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// A small deterministic random source (xorshift), seeded per task.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// An axum app served on a loopback port by a runtime of its own (a stand-in server for the
/// host to call: a model, an echo, a trace collector). Stops when dropped.
pub struct Served {
    pub addr: std::net::SocketAddr,
    _runtime: tokio::runtime::Runtime,
}

impl Served {
    pub fn start(app: axum::Router) -> Served {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        runtime.spawn(async move { axum::serve(listener, app).await });
        Served {
            addr,
            _runtime: runtime,
        }
    }
}

/// A tool the tests need: `var`'s value, else the first of `names` on `PATH`; fails loudly,
/// naming what `cargo xtask test` installs for it (`installs`), when there is none.
pub fn program(var: &str, names: &[&str], installs: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(var).filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        for name in names {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    panic!(
        "{} not found: set {var} or put it on PATH (`cargo xtask test` installs {installs})",
        names.join(" or ")
    );
}

/// Checks a scrape of `/metrics` with Prometheus's own linter, `promtool check metrics`
/// (`PROMTOOL`, else on `PATH`): names, units, suffixes and help as Prometheus reads them.
pub fn promtool_check(scrape: &str) {
    use std::io::Write;
    let promtool = program("PROMTOOL", &["promtool"], "Debian's prometheus package");
    let mut child = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", promtool.display()));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(scrape.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics refused the scrape:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

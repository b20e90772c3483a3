//! Every input the host reads from a file or a pipe is read with a bound: an endless or huge
//! payload, config, component or credentials file is refused fast, with an error naming the
//! limit, and the process's memory stays small. Each case runs the real `homing` binary as a
//! child and watches its peak resident memory (`VmHWM` in `/proc/PID/status`) until it exits.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{Env, guest, toml_path};

/// What a refused run did.
struct Refusal {
    stderr: String,
    peak_kib: u64,
    took: Duration,
}

/// The peak resident memory of a running process, in KiB.
fn peak_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Runs `cmd` (stdin as given) to its exit, polling its peak memory; kills it after 10 s.
/// `feed` writes to its stdin from another thread when set.
fn refused(mut cmd: Command, feed: bool) -> Refusal {
    cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    cmd.stdin(if feed { Stdio::piped() } else { Stdio::null() });
    let started = Instant::now();
    let mut child = cmd.spawn().unwrap();
    let feeder = child.stdin.take().map(|mut stdin| {
        std::thread::spawn(move || {
            // Like `yes`: writes until the reader goes away (a broken pipe ends it).
            let block = vec![b'y'; 64 * 1024];
            while stdin.write_all(&block).is_ok() {}
        })
    });
    let pid = child.id();
    let mut peak = 0;
    let status = loop {
        if let Some(kib) = peak_kib(pid) {
            peak = peak.max(kib);
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("still running after 10 s, peak {peak} KiB: the input was not bounded");
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let took = started.elapsed();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    if let Some(feeder) = feeder {
        feeder.join().unwrap();
    }
    assert!(!status.success(), "the command succeeded: {stderr}");
    Refusal {
        stderr,
        peak_kib: peak,
        took,
    }
}

/// A refusal within a second, using under `max_mib` of memory, whose error says `what`.
fn assert_refused(refusal: &Refusal, what: &str, max_mib: u64) {
    assert!(
        refusal.stderr.contains(what),
        "expected `{what}` in: {}",
        refusal.stderr
    );
    assert!(
        refusal.took < Duration::from_secs(1),
        "took {:?}: {}",
        refusal.took,
        refusal.stderr
    );
    assert!(
        refusal.peak_kib < max_mib * 1024,
        "peak resident memory {} KiB over {max_mib} MiB: {}",
        refusal.peak_kib,
        refusal.stderr
    );
}

fn echo_env(extra_host: &str) -> Env {
    Env::new(&format!(
        "[host]\nmax_payload = \"1MiB\"\n{extra_host}\n[plugins.echo]\npath = {}\n",
        toml_path(&guest("echo"))
    ))
}

#[test]
fn an_endless_payload_file_is_refused_one_byte_past_max_payload() {
    let env = echo_env("");
    let cmd = env.command(&[
        "enqueue",
        "--agent",
        "echo",
        "--thread",
        "t",
        "--payload-file",
        "/dev/zero",
    ]);
    let refusal = refused(cmd, false);
    assert_refused(
        &refusal,
        "the payload is over [host] max_payload of 1048576 bytes",
        64,
    );
    // Nothing was enqueued.
    assert_eq!(env.list().len(), 0);
}

#[test]
fn an_endless_payload_on_standard_input_is_refused_the_same_way() {
    let env = echo_env("");
    let cmd = env.command(&["enqueue", "--agent", "echo", "--thread", "t"]);
    let refusal = refused(cmd, true);
    assert_refused(
        &refusal,
        "the payload is over [host] max_payload of 1048576 bytes",
        64,
    );
}

#[test]
fn a_payload_at_max_payload_is_accepted() {
    let env = echo_env("");
    let file = env.path().join("payload");
    std::fs::write(&file, vec![b'x'; 1 << 20]).unwrap();
    let id = env.ok(&[
        "enqueue",
        "--agent",
        "echo",
        "--thread",
        "t",
        "--payload-file",
        file.to_str().unwrap(),
    ]);
    assert_eq!(env.show(&id)["status"], "queued");
}

#[test]
fn a_device_or_fifo_named_as_the_config_is_refused_by_name() {
    let env = echo_env("");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_homing"));
    cmd.args(["--config", "/dev/zero", "config", "check"]);
    assert_refused(
        &refused(cmd, false),
        "is not a regular file (a character device)",
        64,
    );

    let fifo = env.path().join("config.fifo");
    mkfifo(&fifo);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_homing"));
    cmd.arg("--config").arg(&fifo).args(["dispatch", "list"]);
    assert_refused(&refused(cmd, false), "is not a regular file (a FIFO)", 64);
}

#[test]
fn a_config_over_its_size_cap_is_refused_before_it_is_read() {
    let env = echo_env("");
    let big = env.path().join("big.toml");
    // Sparse: 1 GiB that takes no disk.
    std::fs::File::create(&big)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_homing"));
    cmd.arg("--config").arg(&big).args(["config", "check"]);
    assert_refused(
        &refused(cmd, false),
        "is over the config size limit of 4194304 bytes",
        64,
    );
}

#[test]
fn a_component_that_is_a_device_fifo_or_too_large_is_refused_by_name() {
    let env = echo_env("");
    let mut cmd = env.command(&["plugin", "inspect", "/dev/zero"]);
    cmd.env_remove("HOMING_LOG");
    assert_refused(
        &refused(cmd, false),
        "is not a regular file (a character device)",
        64,
    );

    // A plugin `path` naming a FIFO.
    let fifo = env.path().join("agent.wasm");
    mkfifo(&fifo);
    let fifo_env = Env::new(&format!("[plugins.agent]\npath = {}\n", toml_path(&fifo)));
    let cmd = fifo_env.command(&["config", "check"]);
    assert_refused(&refused(cmd, false), "is not a regular file (a FIFO)", 128);

    // Over `[host] max_component_size` (sparse, so it costs no disk): refused before reading.
    let huge = env.path().join("huge.wasm");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(300 << 20)
        .unwrap();
    let cmd = env.command(&["plugin", "inspect", huge.to_str().unwrap()]);
    assert_refused(
        &refused(cmd, false),
        "is over [host] max_component_size of 268435456 bytes",
        64,
    );
    let small_cap = Env::new(&format!(
        "[host]\nmax_component_size = \"1KiB\"\n[plugins.echo]\npath = {}\n",
        toml_path(&guest("echo"))
    ));
    let cmd = small_cap.command(&["config", "check"]);
    assert_refused(
        &refused(cmd, false),
        "is over [host] max_component_size of 1024 bytes",
        128,
    );
}

#[test]
fn a_nats_credentials_file_is_read_with_a_bound() {
    // Refused while reading the file, before any server is contacted.
    let env = Env::new("");
    let fifo = env.path().join("homing.creds");
    mkfifo(&fifo);
    std::fs::write(
        env.config(),
        format!(
            "[store]\nbackend = \"nats\"\nurl = \"nats://127.0.0.1:9\"\ncredentials = {}\n",
            toml_path(&fifo)
        ),
    )
    .unwrap();
    let cmd = env.command(&["dispatch", "list"]);
    assert_refused(&refused(cmd, false), "the NATS credentials file", 64);
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success(), "mkfifo {}", path.display());
}

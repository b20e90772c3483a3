//! End-to-end tests: the `homing` binary, real components built from source, a real store file.

use std::time::{Duration, Instant};

use base64::Engine;

use crate::common::{Env, guest, signal, toml_path, wait_exit};
use crate::natsd;
use serde_json::Value;

fn by_payload<'a>(list: &'a [Value], payload: &str) -> &'a Value {
    list.iter()
        .find(|d| d["payload"] == payload)
        .unwrap_or_else(|| panic!("no dispatch with payload {payload}"))
}

fn examples_config() -> String {
    format!(
        r#"
[host]
lease = "10s"
sweep_interval = "200ms"

[plugins.echo]
path = {echo}
enqueue_to = ["delegate"]

[plugins.memory]
path = {memory}

[plugins.batch]
path = {batch}
concurrency = 1
reuse_instance = 10

[plugins.flaky]
path = {flaky}
max_attempts = 3
[plugins.flaky.retry]
initial = "10ms"
max = "50ms"

[plugins.delegate]
path = {delegate}
enqueue_to = ["echo"]
"#,
        echo = toml_path(&guest("echo")),
        memory = toml_path(&guest("memory")),
        batch = toml_path(&guest("batch")),
        flaky = toml_path(&guest("flaky")),
        delegate = toml_path(&guest("delegate")),
    )
}

#[test]
fn stored_text_prints_with_its_control_characters_escaped() {
    let env = Env::new(&examples_config());
    let nasty = "hi\u{1b}[2J\nforged line\rback";
    env.enqueue("memory", "tty", nasty, &[]);
    env.run_until_idle();
    let text = env.ok(&["thread", "log", "tty"]);
    assert!(
        !text.contains('\u{1b}') && !text.contains('\r'),
        "raw control characters reached the terminal: {text:?}"
    );
    assert!(
        text.contains("user: hi\\u{1b}[2J\\nforged line\\rback"),
        "{text}"
    );
    assert!(!text.lines().any(|l| l.starts_with("forged")), "{text}");
    // JSON keeps the exact bytes.
    let log: Vec<Value> =
        serde_json::from_str(&env.ok(&["thread", "log", "tty", "--json"])).unwrap();
    assert_eq!(log[0]["data"], format!("user: {nasty}"));
}

#[test]
fn every_example_agent_processes_real_dispatches() {
    let env = Env::new(&examples_config());
    env.enqueue("echo", "e1", "hello", &[]);
    env.enqueue("memory", "chat", "my name is Ada", &[]);
    env.enqueue("memory", "chat", "what is my name?", &[]);
    env.enqueue("batch", "b1", "one two three", &[]);
    env.enqueue("batch", "b2", "four five", &[]);
    env.enqueue("flaky", "f1", "fail-until:2", &[]);
    env.enqueue("flaky", "f2", "always", &[]);
    env.enqueue("delegate", "fan", "alpha beta gamma", &[]);
    env.run_until_idle();

    let list = env.list();
    let echo = by_payload(&list, "hello");
    assert_eq!(echo["status"], "acked");
    assert_eq!(echo["result"]["output"], "hello");

    let second = by_payload(&list, "what is my name?");
    assert_eq!(second["status"], "acked");
    let reply = second["result"]["output"].as_str().unwrap();
    assert!(
        reply.contains("my name is Ada"),
        "the memory agent forgot: {reply}"
    );
    let log = env.ok(&["thread", "log", "chat", "--json"]);
    let log: Vec<Value> = serde_json::from_str(&log).unwrap();
    assert_eq!(log.len(), 4, "two user and two agent entries: {log:?}");
    assert_eq!(log[0]["data"], "user: my name is Ada");

    assert_eq!(
        by_payload(&list, "one two three")["result"]["output"],
        "words=3"
    );
    assert_eq!(
        by_payload(&list, "four five")["result"]["output"],
        "words=2"
    );

    let recovered = by_payload(&list, "fail-until:2");
    assert_eq!(recovered["status"], "acked");
    assert_eq!(
        recovered["attempt"], 2,
        "two failed attempts before success"
    );
    let doomed = by_payload(&list, "always");
    assert_eq!(doomed["status"], "dead_letter");
    assert_eq!(doomed["attempt"], 3);

    let fan_log: Vec<Value> =
        serde_json::from_str(&env.ok(&["thread", "log", "fan", "--json"])).unwrap();
    let last = fan_log.last().unwrap()["data"].as_str().unwrap().to_owned();
    assert!(
        last.starts_with("gathered:"),
        "delegate did not gather: {fan_log:?}"
    );
    for word in ["alpha", "beta", "gamma"] {
        assert!(last.contains(word), "{word} missing from {last}");
    }
    assert!(
        list.iter()
            .all(|d| d["status"] != "queued" && d["status"] != "claimed"),
        "nothing may stay live after --until-idle"
    );
}

/// A host with the `sandbox` test guest; `lease`, `timeout` and `max_attempts` vary by test.
fn sandbox_config(
    lease: &str,
    timeout: &str,
    max_attempts: u32,
    extra_plugin_keys: &str,
) -> String {
    format!(
        r#"
[host]
lease = "{lease}"
sweep_interval = "200ms"
shutdown_grace = "1s"

[plugins.sandbox]
path = {sandbox}
concurrency = 8
timeout = "{timeout}"
memory = "16MiB"
max_attempts = {max_attempts}
{extra_plugin_keys}
[plugins.sandbox.retry]
initial = "10ms"
max = "50ms"
"#,
        sandbox = toml_path(&guest("sandbox")),
    )
}

#[test]
fn sandbox_denies_files_env_and_network_without_a_grant() {
    let env = Env::new(&sandbox_config("5s", "1s", 1, ""));
    std::fs::write(env.path().join("secret.txt"), "top secret").unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let file = env.enqueue(
        "sandbox",
        "t1",
        &format!("read-file:{}", env.path().join("secret.txt").display()),
        &[],
    );
    let var = env.enqueue("sandbox", "t2", "env:HOMING_TEST_SECRET", &[]);
    let net = env.enqueue("sandbox", "t3", &format!("connect:127.0.0.1:{port}"), &[]);
    let out = env
        .command(&["run", "--until-idle"])
        .env("HOMING_TEST_SECRET", "leaked")
        .output()
        .unwrap();
    assert!(out.status.success());
    for id in [&file, &var, &net] {
        let d = env.show(id);
        assert_eq!(d["status"], "dead_letter", "{d}");
        assert!(
            d["result"].is_null(),
            "nothing may be produced without a grant: {d}"
        );
    }
    assert!(
        env.show(&var)["last_error"]
            .as_str()
            .unwrap()
            .contains("env HOMING_TEST_SECRET")
    );
    assert!(
        env.show(&net)["last_error"]
            .as_str()
            .unwrap()
            .contains("connect")
    );
}

#[test]
fn sandbox_grants_files_env_and_network_when_configured() {
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("hello.txt"), "hello from the host").unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let grants = format!(
        "allowed_hosts = [\"127.0.0.1:{port}\"]\ndirs = [{{ host = {}, guest = \"/data\" }}]\n[plugins.sandbox.env]\nGREETING = \"granted\"\n",
        toml_path(data.path())
    );
    let env = Env::new(&sandbox_config("5s", "1s", 2, &grants));
    let file = env.enqueue("sandbox", "t1", "read-file:/data/hello.txt", &[]);
    let write = env.enqueue(
        "sandbox",
        "t2",
        "write-file:/data/new.txt",
        &["--max-attempts", "1"],
    );
    let var = env.enqueue("sandbox", "t3", "env:GREETING", &[]);
    let net = env.enqueue("sandbox", "t4", &format!("connect:127.0.0.1:{port}"), &[]);
    // The grant names one port of the address: another port, listening too, stays closed.
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let other_port = other.local_addr().unwrap().port();
    let other_net = env.enqueue(
        "sandbox",
        "t5",
        &format!("connect:127.0.0.1:{other_port}"),
        &["--max-attempts", "1"],
    );
    env.run_until_idle();
    assert_eq!(env.show(&file)["result"]["output"], "hello from the host");
    assert_eq!(env.show(&var)["result"]["output"], "granted");
    assert_eq!(env.show(&net)["result"]["output"], "connected");
    assert_eq!(env.show(&other_net)["status"], "dead_letter");
    // The directory was granted read-only: writing is denied.
    assert_eq!(env.show(&write)["status"], "dead_letter");
    assert!(!data.path().join("new.txt").exists());
}

#[test]
fn hostile_guests_are_stopped_nacked_with_the_reason_and_dead_lettered() {
    hostile_guests_dead_letter(&sandbox_config("5s", "1s", 2, ""));
}

/// The same poison guests on NATS: the crashes count as attempts and dead-letter there too.
#[test]
fn nats_hostile_guests_are_stopped_nacked_with_the_reason_and_dead_lettered() {
    let server = natsd::NatsServer::start();
    hostile_guests_dead_letter(&format!(
        "{}\n{}",
        sandbox_config("5s", "1s", 2, ""),
        nats_store_section(&server, "hostile")
    ));
}

fn hostile_guests_dead_letter(config: &str) {
    let env = Env::new(config);
    let cases = [
        ("alloc", "memory limit"),
        ("spin", "timed out"),
        ("sleep", "timed out"),
        ("panic", "trapped"),
        ("recurse", "trapped"),
    ];
    let ids: Vec<(String, &str, &str)> = cases
        .iter()
        .map(|(payload, reason)| {
            (
                env.enqueue("sandbox", payload, payload, &[]),
                *payload,
                *reason,
            )
        })
        .collect();
    let fine = env.enqueue("sandbox", "fine", "still served", &[]);
    env.run_until_idle();
    for (id, payload, reason) in ids {
        let d = env.show(&id);
        assert_eq!(d["status"], "dead_letter", "{payload}: {d}");
        assert_eq!(d["attempt"], 2, "{payload}: both attempts used: {d}");
        let error = d["last_error"].as_str().unwrap_or_default();
        assert!(
            error.contains(reason),
            "{payload}: expected `{reason}` in `{error}`"
        );
    }
    assert_eq!(
        env.show(&fine)["status"],
        "acked",
        "other work is unaffected"
    );
}

#[test]
fn log_floods_and_enqueue_storms_are_capped() {
    let env = Env::new(&format!(
        "{}\n[plugins.sink]\npath = {}\nmax_attempts = 1\n",
        sandbox_config("5s", "20s", 2, "enqueue_to = [\"sink\"]"),
        toml_path(&guest("echo"))
    ));
    let flood = env.enqueue("sandbox", "flood", "log-flood", &[]);
    let storm = env.enqueue("sandbox", "storm", "enqueue-storm:sink", &[]);
    let log = env.run_until_idle();
    assert_eq!(env.show(&flood)["status"], "acked");
    assert!(
        log.contains("guest log budget"),
        "the flood must be cut off"
    );
    assert!(log.matches("flood line").count() <= 10_000);
    let storm = env.show(&storm);
    let output = storm["result"]["output"].as_str().unwrap();
    assert!(output.starts_with("sent 1000 then refused"), "{output}");
}

#[test]
fn interrupting_a_thread_stops_its_running_guest_and_supersedes_its_queue() {
    // A long lease: the interrupt must not wait for a renewal to be noticed.
    let env = Env::new(&sandbox_config("60s", "60s", 2, ""));
    let running = env.enqueue("sandbox", "talk", "wait-stop", &[]);
    let mut host = env.spawn_run();
    env.wait_status(&running, "claimed", Duration::from_secs(20));
    let queued = env.enqueue("sandbox", "talk", "queued behind it", &[]);
    let interrupt: Value =
        serde_json::from_str(&env.ok(&["thread", "interrupt", "talk", "--json"])).unwrap();
    assert_eq!(interrupt["epoch"], 1);
    assert_eq!(interrupt["active"]["id"], running.as_str());
    assert_eq!(interrupt["superseded"][0], queued.as_str());
    let stopped = env.wait_status(&running, "superseded", Duration::from_secs(5));
    assert!(
        stopped["result"].is_null(),
        "a superseded run records nothing: {stopped}"
    );
    // New work on the thread, at the new epoch, runs normally.
    let after = env.enqueue("sandbox", "talk", "after the interrupt", &[]);
    let done = env.wait_status(&after, "acked", Duration::from_secs(10));
    assert_eq!(done["epoch"], 1);
    signal(&host, "TERM");
    assert!(wait_exit(&mut host, Duration::from_secs(10)).success());
}

#[test]
fn sigterm_lets_running_work_finish_then_releases_what_is_left() {
    let env = Env::new(&sandbox_config("5s", "60s", 2, ""));
    let stuck = env.enqueue("sandbox", "stuck", "sleep", &[]);
    let mut host = env.spawn_run();
    env.wait_status(&stuck, "claimed", Duration::from_secs(20));
    signal(&host, "TERM");
    let status = wait_exit(&mut host, Duration::from_secs(15));
    assert!(status.success(), "host exit: {status}\n{}", env.host_log());
    let d = env.show(&stuck);
    assert_eq!(
        d["status"], "queued",
        "released, not left claimed by a gone host: {d}"
    );
    assert_eq!(d["attempt"], 1);
    assert!(d["last_error"].as_str().unwrap().contains("shut down"));
}

#[test]
fn second_start_loads_compiled_components_from_the_cache() {
    let env = Env::new(&format!(
        "[plugins.echo]\npath = {}\n",
        toml_path(&guest("echo"))
    ));
    let first = env.run_until_idle();
    assert!(first.contains("cache miss"), "{first}");
    let second = env.run_until_idle();
    assert!(second.contains("loaded from cache"), "{second}");
    assert!(!second.contains("cache miss"), "{second}");
}

#[test]
fn config_check_reports_each_plugin_world() {
    let env = Env::new(&examples_config());
    let out = env.ok(&["config", "check"]);
    assert!(out.contains("plugin batch: agent world"), "{out}");
    assert!(out.contains("plugin echo: handler world"), "{out}");
}

#[test]
fn plugin_inspect_shows_world_imports_and_exports() {
    let env = Env::new("");
    let out = env.ok(&[
        "plugin",
        "inspect",
        guest("batch").to_str().unwrap(),
        "--json",
    ]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["world"], "agent");
    assert!(
        v["imports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i.as_str().unwrap().starts_with("homing:agent/queue"))
    );
    assert!(v["exports"].as_array().unwrap().iter().any(|e| e == "run"));
}

#[test]
fn broken_toml_is_an_error_naming_file_and_line() {
    let env = Env::new("[host]\nlease = \"10s\"\nlease_typo = 3\n");
    let err = env.fails(&["config", "check"]);
    assert!(err.contains("homing.toml"), "{err}");
    assert!(err.contains("line 3"), "{err}");
    assert!(err.contains("lease_typo"), "{err}");
    let err = Env::new("[host\n").fails(&["run", "--until-idle"]);
    assert!(err.contains("line 1"), "{err}");
}

#[test]
fn missing_corrupt_and_wrong_world_components_are_refused() {
    let env = Env::new("[plugins.ghost]\npath = \"nowhere.wasm\"\n");
    let err = env.fails(&["run", "--until-idle"]);
    assert!(
        err.contains("ghost") && err.contains("nowhere.wasm"),
        "{err}"
    );

    let env = Env::new("[plugins.junk]\npath = \"junk.wasm\"\n");
    std::fs::write(env.path().join("junk.wasm"), b"this is not wasm").unwrap();
    let err = env.fails(&["config", "check"]);
    assert!(
        err.contains("junk") && err.contains("not a valid component"),
        "{err}"
    );

    let env = Env::new(&format!(
        "[plugins.cmd]\npath = {}\n",
        toml_path(&guest("wrong-world"))
    ));
    let err = env.fails(&["config", "check"]);
    assert!(err.contains("exports neither"), "{err}");
    assert!(err.contains("wasi:cli/run"), "{err}");
}

#[test]
fn enqueue_refuses_unknown_agents_and_oversized_payloads_and_writes_nothing() {
    let env = Env::new(&format!(
        "[host]\nmax_payload = \"1KiB\"\n[plugins.echo]\npath = {}\n",
        toml_path(&guest("echo"))
    ));
    let err = env.fails(&[
        "enqueue",
        "--agent",
        "nobody",
        "--thread",
        "t",
        "--payload",
        "x",
    ]);
    assert!(err.contains("`nobody` is not a plugin"), "{err}");
    let big = "x".repeat(2000);
    let err = env.fails(&[
        "enqueue",
        "--agent",
        "echo",
        "--thread",
        "t",
        "--payload",
        &big,
    ]);
    assert!(err.contains("max_payload"), "{err}");
    let err = env.fails(&[
        "enqueue",
        "--agent",
        "echo",
        "--thread",
        "t",
        "--payload",
        "x",
        "--delay",
        "soon",
    ]);
    assert!(err.contains("--delay"), "{err}");
    assert!(
        env.list().is_empty(),
        "nothing may be written by refused enqueues"
    );
}

#[test]
fn dispatch_cancel_and_retry_work_from_the_cli() {
    let env = Env::new(&format!(
        "[plugins.flaky]\npath = {}\nmax_attempts = 1\n",
        toml_path(&guest("flaky"))
    ));
    let doomed = env.enqueue("flaky", "t1", "always", &[]);
    let cancelled = env.enqueue("flaky", "t2", "fail-until:0", &["--delay", "1h"]);
    assert!(
        env.ok(&["dispatch", "cancel", &cancelled])
            .contains("cancelled")
    );
    env.run_until_idle();
    assert_eq!(env.show(&doomed)["status"], "dead_letter");
    let err = env.fails(&["dispatch", "cancel", &doomed]);
    assert!(err.contains("dead_letter"), "{err}");
    let retried = env.ok(&["dispatch", "retry", &cancelled]);
    let d = env.show(&retried);
    assert_eq!(d["status"], "queued");
    assert_eq!(d["metadata"]["retry-of"], cancelled.as_str());
}

#[test]
fn handler_instances_are_fresh_per_dispatch_unless_reuse_is_configured() {
    let outputs = |reuse: u32| -> Vec<String> {
        let env = Env::new(&format!(
            "[plugins.sandbox]\npath = {}\nconcurrency = 1\nreuse_instance = {reuse}\n",
            toml_path(&guest("sandbox"))
        ));
        let ids: Vec<String> = (0..5)
            .map(|_| env.enqueue("sandbox", "one-thread", "count", &[]))
            .collect();
        env.run_until_idle();
        ids.iter()
            .map(|id| {
                env.show(id)["result"]["output"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect()
    };
    assert_eq!(
        outputs(1),
        ["1", "1", "1", "1", "1"],
        "a fresh instance sees no earlier dispatch"
    );
    assert_eq!(
        outputs(3),
        ["1", "2", "3", "1", "2"],
        "one instance serves three, then a new one"
    );
}

#[test]
fn fuel_stops_a_spinning_guest_long_before_its_timeout() {
    let env = Env::new(&sandbox_config("5s", "60s", 1, "fuel = 5000000"));
    let spin = env.enqueue("sandbox", "spin", "spin", &[]);
    let fine = env.enqueue("sandbox", "fine", "cheap", &[]);
    env.run_until_idle();
    let d = env.show(&spin);
    assert_eq!(d["status"], "dead_letter", "{d}");
    let error = d["last_error"].as_str().unwrap();
    assert!(error.contains("fuel"), "{error}");
    assert_eq!(env.show(&fine)["status"], "acked");
}

#[test]
fn guest_stdout_and_stderr_become_log_lines_tagged_with_plugin_dispatch_and_attempt() {
    let env = Env::new(&sandbox_config("5s", "5s", 1, ""));
    let id = env.enqueue("sandbox", "talk", "print:hello from the guest", &[]);
    let log = env.run_until_idle();
    for stream in ["out", "err"] {
        let line = log
            .lines()
            .find(|l| l.contains(&format!("{stream}: hello from the guest")))
            .unwrap_or_else(|| panic!("no {stream} line in:\n{log}"));
        assert!(
            line.contains("plugin=\"sandbox\"") || line.contains("plugin=sandbox"),
            "{line}"
        );
        assert!(line.contains(&id), "{line}");
        assert!(line.contains("attempt=0"), "{line}");
    }
}

/// `homing bench --quick --json` with the echo guest and `extra` arguments: its figures.
fn quick_bench(env: &Env, extra: &[&str]) -> Vec<Value> {
    let echo = guest("echo");
    let mut args = vec![
        "bench",
        "--quick",
        "--json",
        "--echo",
        echo.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    serde_json::from_str(&env.ok(&args)).unwrap()
}

fn scenario_names(figures: &[Value]) -> Vec<&str> {
    figures
        .iter()
        .map(|f| f["scenario"].as_str().unwrap())
        .collect()
}

#[test]
fn bench_quick_reports_every_scenario_as_json() {
    let env = Env::new("");
    let figures = quick_bench(&env, &[]);
    let names = scenario_names(&figures);
    // Instance start and start + call, pooling on and off; store ops; four end-to-end runs,
    // each with its host overhead; p50 and p99 at two backlogs; API enqueue throughput and
    // enqueue-to-result p50 and p99, a chat completion's and an MCP tool call's p50 and p99; a message's send to
    // delivery p50 and p99; the end-to-end run in pairs, plain and with flow control set but
    // not binding, and the pairs' gap.
    assert_eq!(figures.len(), 29, "{names:?}");
    for f in &figures {
        let (median, min, max) = (
            f["median"].as_f64().unwrap(),
            f["min"].as_f64().unwrap(),
            f["max"].as_f64().unwrap(),
        );
        assert!(min <= median && median <= max, "{f}");
        // The gap is a signed percentage; everything else is a positive measure.
        if f["unit"] == "%" {
            assert!(median > -100.0, "{f}");
        } else {
            assert!(median > 0.0, "{f}");
        }
    }
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("with features against plain, paired runs, embedded")),
        "{names:?}"
    );
    assert!(names.iter().any(|n| n.contains("16 workers")), "{names:?}");
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("host overhead per dispatch p50, embedded, 1 workers")),
        "{names:?}"
    );
    let err = env.fails(&["bench", "--quick", "--echo", "missing.wasm"]);
    assert!(err.contains("cargo xtask guests"), "{err}");
}

/// `--only scale` times real `homing` processes against stores retaining more and more
/// records, on both backends, and is never part of the default run.
#[test]
fn bench_scale_times_commands_and_host_start_at_each_retained_size() {
    let env = Env::new("");
    let figures = quick_bench(&env, &["--only", "scale", "--backend", "all"]);
    let names = scenario_names(&figures);
    for backend in ["embedded", "nats"] {
        for size in [1_000, 10_000] {
            for what in [
                "CLI enqueue p50",
                "CLI dispatch show p50",
                "host start to first claim",
                "host resident memory",
            ] {
                let name = format!("scale {backend}, {size} retained: {what}");
                let f = figures
                    .iter()
                    .find(|f| f["scenario"] == name.as_str())
                    .unwrap_or_else(|| panic!("no {name} in {names:?}"));
                assert!(f["median"].as_f64().unwrap() > 0.0, "{f}");
            }
            for what in [
                "queue gauge read (live counts) p50",
                "count of every status p50",
            ] {
                let name = format!("scale {backend}, {size} retained: {what}");
                assert!(names.contains(&name.as_str()), "no {name} in {names:?}");
            }
        }
    }
    assert_eq!(figures.len(), 24, "{names:?}");
}

#[test]
fn bench_only_runs_the_chosen_scenario_groups() {
    let env = Env::new("");
    let figures = quick_bench(&env, &["--only", "start"]);
    let names = scenario_names(&figures);
    assert_eq!(
        names,
        [
            "fresh instance start, echo, pooling on",
            "fresh instance start + handle call, echo, pooling on",
            "fresh instance start, echo, pooling off",
            "fresh instance start + handle call, echo, pooling off",
        ]
    );
    let figures = quick_bench(&env, &["--only", "store", "--only", "latency"]);
    assert_eq!(figures.len(), 5, "{:?}", scenario_names(&figures));
    let err = env.fails(&["bench", "--quick", "--only", "everything"]);
    assert!(err.contains("everything"), "{err}");
}

#[test]
fn bench_quick_on_nats_starts_its_own_server_and_counts_requests() {
    let env = Env::new("");
    let figures = quick_bench(&env, &["--backend", "nats"]);
    let names = scenario_names(&figures);
    // Store ops, requests per dispatch twice and per debounced item, four end-to-end runs each with its host
    // overhead, p50 and p99 at two backlogs, API enqueue throughput and enqueue-to-result p50
    // and p99, a chat completion's and an MCP tool call's p50 and p99, a message's send to delivery (across two store
    // instances) p50 and p99, the end-to-end run in pairs, plain and with flow control set but
    // not binding, and their gap.
    assert_eq!(figures.len(), 28, "{names:?}");
    for f in &figures {
        // The gap is a signed percentage; everything else is a positive measure.
        let floor = if f["unit"] == "%" { -100.0 } else { 0.0 };
        assert!(f["median"].as_f64().unwrap() > floor, "{f}");
        assert!(f["scenario"].as_str().unwrap().contains("nats"), "{f}");
    }
    let requests = figures
        .iter()
        .find(|f| {
            f["scenario"]
                .as_str()
                .unwrap()
                .contains("requests per dispatch, store ops")
        })
        .unwrap();
    // Counted by the server itself: every lifecycle costs at least its enqueue, claim and
    // completion, each one request.
    assert!(requests["median"].as_f64().unwrap() >= 3.0, "{requests}");
    // A debounced item costs its enqueue, and a tenth of its window's claim and completion.
    let debounced = figures
        .iter()
        .find(|f| {
            f["scenario"]
                .as_str()
                .unwrap()
                .contains("requests per debounced item")
        })
        .unwrap();
    let per_item = debounced["median"].as_f64().unwrap();
    assert!(
        (1.0..requests["median"].as_f64().unwrap()).contains(&per_item),
        "{debounced}"
    );
}

#[test]
fn a_killed_hosts_claim_is_reclaimed_after_its_lease_and_the_crash_counts_as_an_attempt() {
    let env = Env::new(&sandbox_config("1s", "60s", 3, ""));
    let id = env.enqueue("sandbox", "crash", "hang-once", &[]);
    let mut doomed = env.spawn_run();
    env.wait_status(&id, "claimed", Duration::from_secs(20));
    signal(&doomed, "KILL");
    wait_exit(&mut doomed, Duration::from_secs(10));
    assert_eq!(
        env.show(&id)["status"],
        "claimed",
        "the dead host's claim is still held"
    );
    // A new host's sweeper reclaims it once the lease has run out, and runs it again.
    env.run_until_idle();
    let d = env.show(&id);
    assert_eq!(d["status"], "acked", "{d}");
    assert_eq!(d["attempt"], 1, "the crashed attempt counts");
    assert_eq!(d["result"]["output"], "recovered");
}

/// The sandbox guest's `big`/`oversize` bytes: byte `i` is `(i * 31 + 7) % 251`, with the top
/// bits set every seventh byte (not UTF-8).
fn pattern(n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| ((i * 31 + 7) % 251) as u8 | if i % 7 == 0 { 0xC0 } else { 0 })
        .collect()
}

/// Bytes as `dispatch show --json` and `thread log --json` print them.
fn bytes_of(v: &Value) -> Vec<u8> {
    match v {
        Value::String(text) => text.clone().into_bytes(),
        _ => base64::engine::general_purpose::STANDARD
            .decode(
                v["base64"]
                    .as_str()
                    .unwrap_or_else(|| panic!("not bytes: {v}")),
            )
            .unwrap(),
    }
}

/// A sandbox host for the size tests: a lease far longer than the test may take, one attempt,
/// enqueues allowed to itself, `[host] max_payload` when given, on `store` (a `[store]`
/// section, empty for the embedded store).
fn size_config(store: &str, max_payload: Option<&str>) -> String {
    format!(
        r#"
[host]
lease = "120s"
sweep_interval = "200ms"
{max_payload}
{store}
[plugins.sandbox]
path = {sandbox}
concurrency = 4
timeout = "60s"
memory = "64MiB"
max_attempts = 1
enqueue_to = ["sandbox"]
"#,
        max_payload = max_payload.map_or(String::new(), |m| format!("max_payload = \"{m}\"")),
        sandbox = toml_path(&guest("sandbox")),
    )
}

/// The size contract on one backend, with the host's cap at `cap` bytes: every guest value one
/// byte over it is `invalid` naming the field and the cap; an output returned one byte over it
/// fails the attempt at once (well within the lease) naming the cap; values at the cap, binary,
/// round-trip through the store.
fn values_over_the_cap_are_invalid_and_values_at_it_round_trip(
    store: &str,
    max_payload: Option<&str>,
    cap: usize,
) {
    let env = Env::new(&size_config(store, max_payload));
    let over = env.enqueue("sandbox", "over", &format!("oversize:{}", cap + 1), &[]);
    let at = env.enqueue("sandbox", "at", &format!("oversize:{cap}"), &[]);
    let returned_over = env.enqueue("sandbox", "big-over", &format!("big:{}", cap + 1), &[]);
    let returned_at = env.enqueue("sandbox", "big-at", &format!("big:{cap}"), &[]);
    let started = Instant::now();
    let log = env.run_until_idle();
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the run took {:?}: an attempt waited for its 120 s lease\n{log}",
        started.elapsed()
    );

    // One byte over: `invalid`, naming the field and the cap, for every call.
    let d = env.show(&over);
    assert_eq!(d["status"], "acked", "{d}");
    let report = String::from_utf8(bytes_of(&d["result"]["output"])).unwrap();
    let limit = format!("max_payload of {cap} bytes");
    for (call, field) in [
        ("append", "entry"),
        ("append-expected", "entry"),
        ("enqueue", "payload"),
        ("record-result", "output"),
        ("complete", "output"),
    ] {
        let line = report
            .lines()
            .find(|l| l.starts_with(&format!("{call}: ")))
            .unwrap_or_else(|| panic!("no {call} in {report}"));
        assert!(
            line.starts_with(&format!(
                "{call}: invalid: {field}: {} bytes exceeds",
                cap + 1
            )) && line.contains(&limit),
            "{line}"
        );
    }
    let log_of_over: Vec<Value> =
        serde_json::from_str(&env.ok(&["thread", "log", "over", "--json"])).unwrap();
    assert!(
        log_of_over.is_empty(),
        "nothing oversized was appended: {log_of_over:?}"
    );

    // At the cap: everything is stored, and reads back byte for byte.
    let data = pattern(cap);
    let d = env.show(&at);
    assert_eq!(d["status"], "acked", "{d}");
    assert!(
        bytes_of(&d["result"]["output"]) == data,
        "the output at the cap differs"
    );
    let entries: Vec<Value> =
        serde_json::from_str(&env.ok(&["thread", "log", "at", "--json"])).unwrap();
    assert_eq!(entries.len(), 1, "one append at the cap");
    assert!(
        bytes_of(&entries[0]["data"]) == data,
        "the entry at the cap differs"
    );
    let follow_up = env
        .list()
        .into_iter()
        .find(|d| d["thread"] == format!("oversize-{at}"))
        .unwrap_or_else(|| panic!("no follow-up of {at}"));
    assert!(
        bytes_of(&follow_up["payload"]) == data,
        "the payload at the cap differs"
    );

    // A returned output one byte over: nacked (one attempt: dead-lettered) at once, naming the cap.
    let d = env.show(&returned_over);
    assert_eq!(d["status"], "dead_letter", "{d}");
    let error = d["last_error"].as_str().unwrap();
    assert!(
        error.starts_with(&format!(
            "output of {} bytes exceeds max_payload {cap}",
            cap + 1
        )),
        "{error}"
    );
    assert!(d["result"].is_null(), "{d}");
    let d = env.show(&returned_at);
    assert_eq!(d["status"], "acked", "{d}");
    assert!(
        bytes_of(&d["result"]["output"]) == data,
        "the returned output differs"
    );
}

#[test]
fn embedded_values_over_max_payload_are_invalid_and_at_it_round_trip() {
    values_over_the_cap_are_invalid_and_values_at_it_round_trip("", Some("64KiB"), 64 * 1024);
}

fn nats_store_section(server: &natsd::NatsServer, prefix: &str) -> String {
    format!(
        "[store]\nbackend = \"nats\"\nurl = \"{}\"\nprefix = \"{prefix}\"\n",
        server.url()
    )
}

#[test]
fn nats_values_over_max_payload_are_invalid_and_at_it_round_trip() {
    let server = natsd::NatsServer::start();
    values_over_the_cap_are_invalid_and_values_at_it_round_trip(
        &nats_store_section(&server, "sizes"),
        Some("64KiB"),
        64 * 1024,
    );
}

/// With the default `max_payload` (1 MiB) on a server with the default `max_payload` (1 MiB),
/// the host caps guest values at what one NATS message holds for a payload and an output, says
/// so at start-up naming both values, and a 1.5 MB output fails at once naming that cap.
#[test]
fn nats_host_cap_above_the_servers_is_clamped_with_a_warning() {
    let server = natsd::NatsServer::start();
    let holds = 489_467;
    let env = Env::new(&size_config(&nats_store_section(&server, "clamped"), None));
    let check = env.ok(&["config", "check"]);
    assert!(check.contains("max_payload 1048576 bytes"), "{check}");
    assert!(
        check.contains(&format!("guest values are capped at {holds} bytes")),
        "{check}"
    );
    let huge = env.enqueue("sandbox", "huge", "big:1500000", &[]);
    let started = Instant::now();
    let log = env.run_until_idle();
    assert!(started.elapsed() < Duration::from_secs(60), "{log}");
    assert!(
        log.contains(&format!(
            "[host] max_payload is 1048576 bytes but the store holds at most {holds} bytes"
        )),
        "no start-up warning naming both values:\n{log}"
    );
    let d = env.show(&huge);
    assert_eq!(d["status"], "dead_letter", "{d}");
    let error = d["last_error"].as_str().unwrap();
    assert!(
        error.starts_with(&format!(
            "output of 1500000 bytes exceeds max_payload {holds}"
        )) && error.contains("[host] max_payload is 1048576"),
        "{error}"
    );
    // And the clamped cap is the one every guest value is held to, exactly at its edge.
    values_over_the_cap_are_invalid_and_values_at_it_round_trip(
        &nats_store_section(&server, "edge"),
        None,
        holds,
    );
}

#[test]
fn a_secret_a_guest_prints_or_logs_reaches_the_host_log_redacted() {
    // The README promises a secret never reaches the host's log: a guest that prints its API
    // key (stdout, stderr, log.write) gets `[redacted]` there instead. From the environment
    // and from wasi:config, one of them a PEM-like multi-line value printed line by line.
    let token = "sk-homing-test-printed-9f8e7d6c5b4a";
    let key_lines = [
        "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC",
        "BKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj",
    ];
    let env = Env::new(&sandbox_config(
        "5s",
        "5s",
        1,
        "[plugins.sandbox.env]\nAPI_TOKEN = { env = \"HOMING_TEST_PRINTED_TOKEN\", secret = true }\nPLAIN = \"not-a-secret-value\"\n[plugins.sandbox.variables]\npem = { file = \"key.pem\", secret = true }\n",
    ));
    std::fs::write(
        env.path().join("key.pem"),
        format!(
            "-----BEGIN KEY-----\n{}\n{}\n-----END KEY-----\n",
            key_lines[0], key_lines[1]
        ),
    )
    .unwrap();
    let env_id = env.enqueue("sandbox", "print-env", "print-env:API_TOKEN", &[]);
    let config_id = env.enqueue("sandbox", "print-config", "print-config:pem", &[]);
    let plain_id = env.enqueue("sandbox", "print-plain", "print-env:PLAIN", &[]);
    let out = env
        .command(&["run", "--until-idle"])
        .env("HOMING_TEST_PRINTED_TOKEN", token)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{log}");
    for id in [&env_id, &config_id, &plain_id] {
        assert_eq!(env.show(id)["status"], "acked", "{log}");
    }
    for secret in [token, key_lines[0], key_lines[1]] {
        assert!(!log.contains(secret), "a secret reached the log:\n{log}");
    }
    for stream in ["out", "err", "log"] {
        let line = log
            .lines()
            .find(|l| l.contains(&env_id) && l.contains(&format!("{stream}: API_TOKEN is")))
            .unwrap_or_else(|| panic!("no {stream} line of {env_id}:\n{log}"));
        assert!(line.contains("API_TOKEN is [redacted]."), "{line}");
    }
    // log.write sends the key in one line: redacted whole.
    assert!(
        log.lines()
            .any(|l| l.contains(&config_id) && l.contains("log: pem is [redacted].")),
        "{log}"
    );
    // stdout and stderr cut it into its four lines: each redacted on its own.
    let redacted = log
        .lines()
        .filter(|l| l.contains(&config_id))
        .map(|l| l.matches("[redacted]").count())
        .sum::<usize>();
    assert_eq!(redacted, 2 * 4 + 1, "{log}");
    // A plain value is no secret: it is logged as written.
    assert!(log.contains("out: PLAIN is not-a-secret-value."), "{log}");
}

#[test]
fn guest_log_text_cannot_forge_host_log_lines() {
    let env = Env::new(&sandbox_config("5s", "5s", 1, ""));
    let logged = env.enqueue(
        "sandbox",
        "forge-log",
        "log:real\nERROR homing: FORGED by log.write\r\u{1b}[31mred\u{7}",
        &[],
    );
    let printed = env.enqueue(
        "sandbox",
        "forge-print",
        "print:one\nFORGED by stdout\r\u{1b}[2Jcleared",
        &[],
    );
    let log = env.run_until_idle();
    assert!(
        !log.contains('\u{1b}'),
        "a guest's escape sequence reached the log:\n{log}"
    );
    assert!(
        !log.contains('\u{7}'),
        "a guest's bell reached the log:\n{log}"
    );
    for line in log.lines() {
        assert!(!line.contains('\r'), "a carriage return in {line:?}");
        if line.contains("FORGED") {
            // Every line holding guest text is a guest line: tagged with the plugin and the
            // dispatch that wrote it.
            assert!(
                line.contains("guest")
                    && (line.contains("plugin=\"sandbox\"") || line.contains("plugin=sandbox"))
                    && (line.contains(&logged) || line.contains(&printed)),
                "an untagged line: {line:?}\n{log}"
            );
        }
    }
    // log.write: one call, one line, the control characters spelled out.
    let line = log
        .lines()
        .find(|l| l.contains(&logged) && l.contains("real"))
        .unwrap_or_else(|| panic!("no log.write line:\n{log}"));
    assert!(
        line.contains(r"real\nERROR homing: FORGED by log.write\r\u{1b}[31mred\u{7}"),
        "{line}"
    );
    // stdout: one guest line per line written, each tagged; the rest escaped.
    let line = log
        .lines()
        .find(|l| l.contains("FORGED by stdout"))
        .unwrap_or_else(|| panic!("no stdout line:\n{log}"));
    assert!(line.contains(&printed), "{line}");
    assert!(
        line.contains(r"FORGED by stdout\r\u{1b}[2Jcleared"),
        "{line}"
    );
}

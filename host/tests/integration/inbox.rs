//! A thread's inbox end to end: a real `homing run`, the `inbox-probe` and `steerable` guests
//! built from source, and messages sent with `homing thread send` from another process.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{Env, guest, signal, toml_path, wait_exit};

fn config(lease: &str) -> String {
    format!(
        r#"
[host]
lease = "{lease}"
sweep_interval = "200ms"

[store]
backend = "embedded"
path = "homing.db"

[plugins.probe]
path = {probe}
concurrency = 2
timeout = "60s"
max_attempts = 3

[plugins.steerable]
path = {steerable}
concurrency = 1
timeout = "30s"
"#,
        probe = toml_path(&guest("inbox_probe")),
        steerable = toml_path(&guest("steerable")),
    )
}

fn messages(env: &Env, thread: &str) -> Vec<Value> {
    serde_json::from_str(&env.ok(&["thread", "messages", thread, "--json"])).unwrap()
}

fn log(env: &Env, thread: &str) -> Vec<Value> {
    serde_json::from_str(&env.ok(&["thread", "log", thread, "--json"])).unwrap()
}

/// Polls the thread log until an entry's data is `text`, or fails after `within`.
fn wait_for_entry(env: &Env, thread: &str, text: &str, within: Duration) {
    let deadline = Instant::now() + within;
    while !log(env, thread).iter().any(|e| e["data"] == text) {
        assert!(
            Instant::now() < deadline,
            "no `{text}` in {thread}'s log within {within:?}; host log:\n{}",
            env.host_log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Starts `steerable` on thread `r` under a `homing run` and waits until it works on its first
/// step: its dispatch's id and the host.
fn steerable_at_work(env: &Env) -> (String, std::process::Child) {
    let id = env.enqueue("steerable", "r", "survey 2024", &[]);
    let host = env.spawn_run();
    wait_for_entry(
        env,
        "r",
        "step 1/5: working on survey 2024",
        Duration::from_secs(30),
    );
    (id, host)
}

/// A guest waiting in `next-message` is woken by a message sent from another process (the
/// CLI), long before its wait would end; the latency from send to acknowledgement is printed.
#[test]
fn a_message_sent_while_a_guest_waits_wakes_it() {
    let env = Env::new(&config("10s"));
    let id = env.enqueue("probe", "t", "wait 30000", &[]);
    let mut host = env.spawn_run();
    wait_for_entry(&env, "t", "waiting", Duration::from_secs(30));
    let sent = Instant::now();
    let seq = env.ok(&[
        "thread",
        "send",
        "t",
        "--kind",
        "steer",
        "--payload",
        "hello",
    ]);
    assert_eq!(seq, "1");
    let d = env.wait_status(&id, "acked", Duration::from_secs(20));
    let waited = sent.elapsed();
    assert_eq!(d["result"]["output"], "got 1 hello as entry 2", "{d}");
    assert!(
        waited < Duration::from_secs(10),
        "the guest was not woken by the message (it took {waited:?})"
    );
    let m = &messages(&env, "t")[0];
    let entries = log(&env, "t");
    let entry = &entries[1];
    assert_eq!(
        (m["state"].as_str(), m["log_seq"].as_u64()),
        (Some("acked"), Some(2))
    );
    assert_eq!(entry["data"], "hello");
    assert_eq!(
        entry["message"]["seq"], 1,
        "the log entry records the message: {entry}"
    );
    assert_eq!(entry["message"]["sent_by"], "cli");
    let latency = entry["appended_at"].as_u64().unwrap() - m["sent_at"].as_u64().unwrap();
    println!("send to acknowledgement, across processes on one file: {latency} ms");
    signal(&host, "TERM");
    wait_exit(&mut host, Duration::from_secs(20));
}

/// Messages sent while no run is live wait in the inbox and reach the thread's next run; a
/// steer to an idle thread starts nothing, a follow-up starts a dispatch of the agent named.
#[test]
fn messages_sent_between_runs_reach_the_next_run() {
    let env = Env::new(&config("10s"));
    env.enqueue("probe", "t", "ignore", &[]);
    env.run_until_idle();
    env.ok(&["thread", "send", "t", "--kind", "steer", "--payload", "one"]);
    env.ok(&["thread", "send", "t", "--kind", "steer", "--payload", "two"]);
    assert_eq!(
        env.list().len(),
        1,
        "a steer to an idle thread starts nothing"
    );
    let pending = messages(&env, "t");
    assert!(
        pending.iter().all(|m| m["state"] == "pending"),
        "{pending:?}"
    );
    let next = env.enqueue("probe", "t", "drain", &[]);
    env.run_until_idle();
    assert_eq!(env.show(&next)["result"]["output"], "one|two");
    let data: Vec<_> = log(&env, "t").iter().map(|e| e["data"].clone()).collect();
    assert_eq!(data, ["one", "two"]);

    // A follow-up to the idle thread is answered by a new dispatch of the thread's last agent.
    let out: Value =
        serde_json::from_str(&env.ok(&["thread", "send", "t", "--payload", "three", "--json"]))
            .unwrap();
    let follow_up = out["follow_ups"][0].as_str().unwrap().to_owned();
    env.run_until_idle();
    let d = env.show(&follow_up);
    assert_eq!(
        (d["agent"].as_str(), d["status"].as_str()),
        (Some("probe"), Some("acked"))
    );
    assert_eq!(d["metadata"]["enqueued-by"], "inbox");
    assert_eq!(d["metadata"]["messages"], "3-3");
    assert_eq!(d["result"]["output"], "three");
}

/// A host killed after handing a message to its guest and before the guest acked it loses
/// nothing: the next attempt is handed the message again and acks it once.
#[test]
fn a_host_killed_between_delivery_and_ack_loses_no_message() {
    let env = Env::new(&config("1s"));
    env.ok(&[
        "thread",
        "send",
        "t",
        "--agent",
        "probe",
        "--kind",
        "steer",
        "--payload",
        "keep me",
    ]);
    let id = env.enqueue("probe", "t", "hold 30000", &[]);
    let mut doomed = env.spawn_run();
    wait_for_entry(&env, "t", "handed 1", Duration::from_secs(30));
    signal(&doomed, "KILL");
    wait_exit(&mut doomed, Duration::from_secs(10));
    assert_eq!(messages(&env, "t")[0]["state"], "pending");

    // The next attempt (once the dead host's lease ran out) is handed the message again.
    env.run_until_idle();
    let d = env.show(&id);
    assert_eq!(d["status"], "acked", "{d}");
    assert_eq!(d["attempt"], 1, "the killed attempt counts");
    let m = &messages(&env, "t")[0];
    assert_eq!(m["state"], "acked", "{m}");
    let notes = log(&env, "t")
        .iter()
        .filter(|e| e["message"]["seq"] == 1)
        .count();
    assert_eq!(notes, 1, "acknowledged once");
}

/// A steer sent while the `steerable` example works changes its course: the run acknowledges
/// it into the log and ends on the new goal.
#[test]
fn a_steer_changes_the_course_of_a_running_agent() {
    let env = Env::new(&config("10s"));
    let (id, mut host) = steerable_at_work(&env);
    let seq = env.ok(&[
        "thread",
        "send",
        "r",
        "--kind",
        "steer",
        "--payload",
        "survey 2025",
        "--wait",
        "--timeout",
        "20s",
    ]);
    let d = env.wait_status(&id, "acked", Duration::from_secs(30));
    assert_eq!(d["result"]["output"], "done: survey 2025");
    let entries = log(&env, "r");
    let at = entries
        .iter()
        .position(|e| e["data"] == "survey 2025")
        .expect("the steer is in the log");
    assert_eq!(
        entries[at]["seq"].to_string(),
        seq,
        "--wait printed the entry's sequence"
    );
    assert_eq!(entries[at + 1]["data"], "changed course: survey 2025");
    assert!(
        entries[at + 2..]
            .iter()
            .all(|e| e["data"].as_str().unwrap().contains("survey 2025")),
        "every later step works on the new goal: {entries:?}"
    );
    signal(&host, "TERM");
    wait_exit(&mut host, Duration::from_secs(20));
}

/// `[plugins.steerable.inbox] on_busy = "reject"`: while a `steerable` run holds the thread, a
/// message to the agent is refused (exit 7, naming the run) and nothing is stored; a message's
/// own `--on-busy steer` still steers it. A bad policy is refused naming the flag or the key.
#[test]
fn an_agent_that_rejects_messages_while_busy_refuses_them_and_a_steer_still_lands() {
    let cfg = config("10s").replace(
        "timeout = \"30s\"\n",
        "timeout = \"30s\"\n\n[plugins.steerable.inbox]\non_busy = \"reject\"\n",
    );
    assert!(cfg.contains("on_busy"), "{cfg}");
    let env = Env::new(&cfg);
    let (id, mut host) = steerable_at_work(&env);
    let refused = env.homing(&[
        "thread",
        "send",
        "r",
        "--agent",
        "steerable",
        "--payload",
        "stop",
    ]);
    assert_eq!(refused.status.code(), Some(7), "{refused:?}");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("busy") && err.contains(&id), "{err}");
    assert!(
        messages(&env, "r").is_empty(),
        "a rejected message is not stored"
    );
    let bad = env.homing(&[
        "thread",
        "send",
        "r",
        "--on-busy",
        "shout",
        "--payload",
        "x",
    ]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--on-busy"));
    let sent: Value = serde_json::from_str(&env.ok(&[
        "thread",
        "send",
        "r",
        "--agent",
        "steerable",
        "--on-busy",
        "steer",
        "--payload",
        "survey 2025",
        "--json",
    ]))
    .unwrap();
    assert_eq!(sent["kind"], "steer", "{sent}");
    assert_eq!(sent["busy"], id.as_str(), "{sent}");
    assert_eq!(sent["applied"], "steer", "{sent}");
    let d = env.wait_status(&id, "acked", Duration::from_secs(30));
    assert_eq!(d["result"]["output"], "done: survey 2025");
    signal(&host, "TERM");
    wait_exit(&mut host, Duration::from_secs(20));

    let typo = config("10s").replace(
        "timeout = \"30s\"\n",
        "timeout = \"30s\"\n\n[plugins.steerable.inbox]\non_busy = \"later\"\n",
    );
    let env = Env::new(&typo);
    let err = env.fails(&["config", "check"]);
    assert!(err.contains("on_busy") || err.contains("later"), "{err}");
}

/// Sends are checked before anything is stored: an unknown agent (exit 3), an empty message,
/// a full inbox and a bad kind (exit 2), each naming what was wrong.
/// `on_busy = "interrupt"` against a running guest: the send stops the run (its writes are
/// fenced, it ends superseded), the log marks the turn's end after the run's own entries, and a
/// follow-up answers the message; nothing of the stopped run lands after the mark.
fn an_interrupting_message_stops_the_run_and_the_next_turn_answers_it(store: &str) {
    let cfg = config("10s")
        .replace(
            "[store]\nbackend = \"embedded\"\npath = \"homing.db\"\n",
            store,
        )
        .replace(
            "timeout = \"30s\"\n",
            "timeout = \"30s\"\n\n[plugins.steerable.inbox]\non_busy = \"interrupt\"\n",
        );
    assert!(cfg.contains("on_busy") && cfg.contains(store), "{cfg}");
    let env = Env::new(&cfg);
    let (id, mut host) = steerable_at_work(&env);
    let sent: Value = serde_json::from_str(&env.ok(&[
        "thread",
        "send",
        "r",
        "--agent",
        "steerable",
        "--payload",
        "stop",
        "--json",
    ]))
    .unwrap();
    assert_eq!(sent["busy"], id.as_str(), "{sent}");
    assert_eq!(sent["applied"], "interrupt", "{sent}");
    assert_eq!(sent["interrupted"]["dispatch"], id.as_str(), "{sent}");
    let mark = sent["interrupted"]["entry"]
        .as_u64()
        .expect("the mark's entry");
    let next = sent["follow_ups"][0]
        .as_str()
        .expect("a follow-up")
        .to_owned();

    let done = env.wait_status(&next, "acked", Duration::from_secs(30));
    assert_eq!(done["result"]["output"], "noted 1 message(s)", "{done}");
    assert_eq!(done["metadata"]["interrupted"], id.as_str(), "{done}");
    let stopped = env.wait_status(&id, "superseded", Duration::from_secs(30));
    assert!(stopped["result"].is_null(), "{stopped}");

    let entries = log(&env, "r");
    let at = entries
        .iter()
        .position(|e| e["seq"] == mark)
        .unwrap_or_else(|| panic!("no entry {mark}: {entries:?}"));
    let turn = &entries[at]["turn"];
    assert_eq!(turn["event"], "interrupted", "{entries:?}");
    assert_eq!(turn["dispatch"], id.as_str());
    assert_eq!(turn["message"], 1);
    assert_eq!(entries[at]["data"], "");
    assert_eq!(entries[0]["data"], "step 1/5: working on survey 2024");
    let after: Vec<&Value> = entries[at + 1..].iter().map(|e| &e["data"]).collect();
    assert_eq!(after, ["stop", "noted: stop"], "{entries:?}");
    assert!(
        env.ok(&["thread", "log", "r"])
            .contains(&format!("[turn interrupted: dispatch {id} by message 1]")),
        "thread log shows the mark"
    );
    signal(&host, "TERM");
    wait_exit(&mut host, Duration::from_secs(20));
}

/// A host on `store` with the steerable guest at work on thread `r` (see
/// [`steerable_at_work`]), and the answer to `payload` sent to the thread with `--on-busy
/// policy`.
fn sent_to_busy_steerable(
    store: &str,
    policy: &str,
    payload: &str,
) -> (Env, String, std::process::Child, Value) {
    let cfg = config("10s").replace(
        "[store]\nbackend = \"embedded\"\npath = \"homing.db\"\n",
        store,
    );
    assert!(cfg.contains(store), "{cfg}");
    let env = Env::new(&cfg);
    let (id, host) = steerable_at_work(&env);
    let sent: Value = serde_json::from_str(&env.ok(&[
        "thread",
        "send",
        "r",
        "--agent",
        "steerable",
        "--on-busy",
        policy,
        "--payload",
        payload,
        "--json",
    ]))
    .unwrap();
    (env, id, host, sent)
}

/// `--on-busy rollback` against a running guest: as an interrupt, and the mark masks what the
/// stopped run wrote: `thread log` (and its `--json`) shows the log as it was before the run,
/// with the mark saying which entries it masked; `--all` shows them, marked.
fn a_rollback_message_masks_the_stopped_run(store: &str) {
    let (env, id, mut host, sent) = sent_to_busy_steerable(store, "rollback", "start over");
    assert_eq!(sent["interrupted"]["dispatch"], id.as_str(), "{sent}");
    assert_eq!(sent["applied"], "rollback", "{sent}");
    let mark = sent["interrupted"]["entry"]
        .as_u64()
        .expect("the mark's entry");
    assert!(mark > 1, "the run wrote before it was stopped: {sent}");
    let next = sent["follow_ups"][0]
        .as_str()
        .expect("a follow-up")
        .to_owned();
    let done = env.wait_status(&next, "acked", Duration::from_secs(30));
    assert_eq!(done["result"]["output"], "noted 1 message(s)", "{done}");
    env.wait_status(&id, "superseded", Duration::from_secs(30));

    // Shown: the mark and what followed it; the run's steps are masked.
    let shown = log(&env, "r");
    let data: Vec<&Value> = shown.iter().map(|e| &e["data"]).collect();
    assert_eq!(data, ["", "start over", "noted: start over"], "{shown:?}");
    let turn = &shown[0]["turn"];
    assert_eq!(turn["event"], "rolled_back", "{shown:?}");
    assert_eq!(turn["masked"]["first"], 1);
    assert_eq!(turn["masked"]["last"], mark - 1);
    let text = env.ok(&["thread", "log", "r"]);
    assert!(
        text.contains(&format!(
            "[turn rolled_back: dispatch {id} by message 1; masked entries 1-{}]",
            mark - 1
        )),
        "{text}"
    );
    assert!(!text.contains("step 1/5"), "{text}");
    // Nothing is deleted: `--all` shows the masked entries, marked.
    let all = env.ok(&["thread", "log", "r", "--all"]);
    assert!(
        all.contains("step 1/5: working on survey 2024  [masked]"),
        "{all}"
    );
    assert_eq!(all.lines().count() as u64, mark + 2, "{all}");
    signal(&host, "TERM");
    wait_exit(&mut host, Duration::from_secs(20));
}

/// `--on-busy merge` against a running guest: the run is rolled back and the next turn is
/// handed what it had taken: the follow-up runs the stopped goal again (its payload) and reads
/// the new message, which steers it.
fn a_merge_message_hands_the_next_turn_the_stopped_goal(store: &str) {
    let (env, id, mut host, sent) = sent_to_busy_steerable(store, "merge", "survey 2025");
    assert_eq!(sent["applied"], "merge", "{sent}");
    assert_eq!(sent["interrupted"]["dispatch"], id.as_str(), "{sent}");
    let next = sent["follow_ups"][0]
        .as_str()
        .expect("a follow-up")
        .to_owned();
    let done = env.wait_status(&next, "acked", Duration::from_secs(30));
    assert_eq!(
        done["payload"], "survey 2024",
        "the stopped goal goes on: {done}"
    );
    assert_eq!(done["result"]["output"], "done: survey 2025", "{done}");
    env.wait_status(&id, "superseded", Duration::from_secs(30));
    let shown = log(&env, "r");
    assert_eq!(shown[0]["turn"]["event"], "merged", "{shown:?}");
    assert_eq!(
        shown[1]["data"], "step 1/5: working on survey 2024",
        "{shown:?}"
    );
    assert!(
        shown
            .iter()
            .any(|e| e["data"] == "changed course: survey 2025"),
        "{shown:?}"
    );
    signal(&host, "TERM");
    wait_exit(&mut host, Duration::from_secs(20));
}

#[test]
fn a_merge_message_hands_the_next_turn_the_stopped_goal_embedded() {
    a_merge_message_hands_the_next_turn_the_stopped_goal(
        "[store]\nbackend = \"embedded\"\npath = \"homing.db\"\n",
    );
}

#[test]
fn a_merge_message_hands_the_next_turn_the_stopped_goal_on_nats() {
    let server = crate::natsd::NatsServer::start();
    a_merge_message_hands_the_next_turn_the_stopped_goal(&format!(
        "[store]\nbackend = \"nats\"\nurl = \"{}\"\nprefix = \"turns\"\nconnect_timeout = \"20s\"\n",
        server.url()
    ));
}

#[test]
fn a_rollback_message_masks_the_stopped_run_embedded() {
    a_rollback_message_masks_the_stopped_run(
        "[store]\nbackend = \"embedded\"\npath = \"homing.db\"\n",
    );
}

#[test]
fn a_rollback_message_masks_the_stopped_run_on_nats() {
    let server = crate::natsd::NatsServer::start();
    a_rollback_message_masks_the_stopped_run(&format!(
        "[store]\nbackend = \"nats\"\nurl = \"{}\"\nprefix = \"turns\"\nconnect_timeout = \"20s\"\n",
        server.url()
    ));
}

#[test]
fn an_interrupting_message_stops_the_run_and_the_next_turn_answers_it_embedded() {
    an_interrupting_message_stops_the_run_and_the_next_turn_answers_it(
        "[store]\nbackend = \"embedded\"\npath = \"homing.db\"\n",
    );
}

#[test]
fn an_interrupting_message_stops_the_run_and_the_next_turn_answers_it_on_nats() {
    let server = crate::natsd::NatsServer::start();
    an_interrupting_message_stops_the_run_and_the_next_turn_answers_it(&format!(
        "[store]\nbackend = \"nats\"\nurl = \"{}\"\nprefix = \"turns\"\nconnect_timeout = \"20s\"\n",
        server.url()
    ));
}

#[test]
fn bad_sends_are_refused_naming_what_was_wrong_and_store_nothing() {
    let mut cfg = config("10s");
    cfg = cfg.replace("[store]", "max_inbox = 2\n\n[store]");
    let env = Env::new(&cfg);
    let unknown = env.homing(&["thread", "send", "t", "--agent", "nobody", "--payload", "x"]);
    assert_eq!(unknown.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("nobody"));
    let empty = env.homing(&["thread", "send", "t", "--kind", "steer", "--payload", ""]);
    assert_eq!(empty.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&empty.stderr).contains("payload"));
    let kind = env.homing(&["thread", "send", "t", "--kind", "shout", "--payload", "x"]);
    assert_eq!(kind.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&kind.stderr).contains("--kind"));
    let never = env.homing(&["thread", "send", "t", "--payload", "x"]);
    assert_eq!(
        never.status.code(),
        Some(2),
        "a follow-up needs an agent to answer it"
    );
    assert!(String::from_utf8_lossy(&never.stderr).contains("agent"));
    assert!(messages(&env, "t").is_empty(), "nothing was stored");

    for _ in 0..2 {
        env.ok(&["thread", "send", "t", "--kind", "steer", "--payload", "x"]);
    }
    let full = env.homing(&["thread", "send", "t", "--kind", "steer", "--payload", "x"]);
    assert_eq!(full.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&full.stderr).contains("max_inbox"));
    assert_eq!(messages(&env, "t").len(), 2);
    let discarded = env.ok(&["thread", "discard", "t", "--through", "2"]);
    assert_eq!(discarded, "discarded 2 message(s)");
}

/// Two hosts on one NATS store: a message sent through host A's API wakes the guest that
/// waits for it on host B (A does not run the agent), and the latency from the API's answer
/// to the acknowledgement is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_sent_through_one_nats_hosts_api_reaches_the_run_on_another() {
    use crate::api::{PRODUCER, READER, TOKENS};
    use crate::hosts::spawn_run;
    use crate::natsd::{NatsServer, free_port};

    let server = NatsServer::start();
    let store = format!(
        "[store]\nbackend = \"nats\"\nurl = \"{}\"\nprefix = \"inbox2\"\nconnect_timeout = \"30s\"\n",
        server.url()
    );
    let port = free_port();
    // Host A serves the API and runs only echo; host B runs the probe.
    let a = Env::new(&format!(
        "[host]\nlease = \"10s\"\nsweep_interval = \"200ms\"\n\n{store}\n[api]\nlisten = \"127.0.0.1:{port}\"\n{TOKENS}\n\n[plugins.echo]\npath = {}\n",
        toml_path(&guest("echo"))
    ));
    std::fs::write(
        a.path().join("operator.token"),
        "operator-secret-0123456789abcdef\n",
    )
    .unwrap();
    let b = Env::new(&format!(
        "[host]\nlease = \"10s\"\nsweep_interval = \"200ms\"\n\n{store}\n[plugins.probe]\npath = {}\ntimeout = \"60s\"\n",
        toml_path(&guest("inbox_probe"))
    ));
    let _b = spawn_run(&b, "host-b");
    let id = b.enqueue("probe", "t", "wait 30000", &[]);
    let mut host_a = a
        .command(&["run"])
        .env("HOMING_HOST_ID", "host-a")
        .env("HOMING_TEST_READER", READER)
        .env("HOMING_TEST_PRODUCER", PRODUCER)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(a.path().join("host.log")).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !log(&b, "t").iter().any(|e| e["data"] == "waiting") {
        assert!(Instant::now() < deadline, "host B never ran the probe");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/v1/threads/t/messages");
    let sent = loop {
        let reply = client
            .post(&url)
            .bearer_auth(PRODUCER)
            .json(&serde_json::json!({ "payload": "over there", "kind": "steer" }))
            .send()
            .await;
        if let Ok(reply) = reply
            && reply.status() == 201
        {
            break Instant::now();
        }
        assert!(Instant::now() < deadline, "host A's API never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let d = b.wait_status(&id, "acked", Duration::from_secs(20));
    assert_eq!(d["result"]["output"], "got 1 over there as entry 2", "{d}");
    let m = &messages(&b, "t")[0];
    assert_eq!(m["sent_by"], "api:producer");
    let entry = &log(&b, "t")[1];
    let latency = entry["appended_at"].as_u64().unwrap() - m["sent_at"].as_u64().unwrap();
    println!(
        "NATS, API on host A to the guest on host B: {latency} ms from store to acknowledgement, {:?} from the API's answer to the dispatch seen acked",
        sent.elapsed()
    );
    let _ = host_a.kill();
    let _ = host_a.wait();
}

/// Debounce end to end: three `homing enqueue --debounce` calls join one window (each prints
/// its id), which runs once, after its quiet time, and the guest reads every item through
/// `claim.items()`; three quick `thread send`s to an idle thread under the agent's
/// `follow_up_quiet` make one turn that drains all three.
fn a_burst_makes_one_run(store: &str) {
    let cfg = config("10s")
        .replace(
            "[store]\nbackend = \"embedded\"\npath = \"homing.db\"\n",
            store,
        )
        .replace(
            "max_attempts = 3\n",
            "max_attempts = 3\n\n[plugins.probe.inbox]\nfollow_up_quiet = \"1s\"\nfollow_up_max_wait = \"30s\"\n",
        );
    let env = Env::new(&cfg);
    let window = [
        "--debounce",
        "burst",
        "--quiet",
        "1s",
        "--max-wait",
        "30s",
        "--debounce-payload",
        "collect",
    ];
    let ids: Vec<String> = ["items a", "items b", "items c"]
        .iter()
        .map(|p| env.enqueue("probe", "w", p, &window))
        .collect();
    assert!(ids.iter().all(|id| *id == ids[0]), "one window: {ids:?}");
    let shown = env.ok(&["dispatch", "show", &ids[0]]);
    assert!(
        shown.contains("window:       burst (open, collect): 3 of at most 100"),
        "{shown}"
    );
    // A bad window is refused naming the flag, storing nothing.
    let bad = env.homing(&[
        "enqueue",
        "--agent",
        "probe",
        "--thread",
        "w",
        "--payload",
        "x",
        "--debounce",
        "burst",
        "--quiet",
        "5s",
        "--max-wait",
        "1s",
    ]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("--quiet"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    for text in ["hi", "are you there?", "hello?"] {
        env.ok(&[
            "thread",
            "send",
            "chat",
            "--agent",
            "probe",
            "--payload",
            text,
        ]);
    }
    let mut host = env.spawn_run();
    let d = env.wait_status(&ids[0], "acked", Duration::from_secs(30));
    assert_eq!(d["result"]["output"], "items a|items b|items c", "{d}");
    let list: Vec<Value> =
        serde_json::from_str(&env.ok(&["dispatch", "list", "--thread", "chat", "--json"])).unwrap();
    assert_eq!(list.len(), 1, "one turn for three quick messages: {list:?}");
    let turn = env.wait_status(
        list[0]["id"].as_str().unwrap(),
        "acked",
        Duration::from_secs(30),
    );
    assert_eq!(
        turn["result"]["output"], "hi|are you there?|hello?",
        "{turn}"
    );
    signal(&host, "TERM");
    wait_exit(&mut host, Duration::from_secs(20));
}

#[test]
fn a_burst_makes_one_run_embedded() {
    a_burst_makes_one_run("[store]\nbackend = \"embedded\"\npath = \"homing.db\"\n");
}

#[test]
fn a_burst_makes_one_run_on_nats() {
    let server = crate::natsd::NatsServer::start();
    a_burst_makes_one_run(&format!(
        "[store]\nbackend = \"nats\"\nurl = \"{}\"\nprefix = \"burst\"\nconnect_timeout = \"20s\"\n",
        server.url()
    ));
}

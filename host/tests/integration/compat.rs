//! Components built against earlier contracts run unchanged. A 0.2.0 handler built straight
//! from the frozen `wit/0.2.0/` runs beside the current ones (0.2.1 only added to 0.2.0).
//!
//! Components built against `homing:agent@0.1.0` run unchanged on a host that speaks 0.2.0:
//! two guests made with wit-bindgen straight from the frozen `wit/0.1.0/` (not through the SDK,
//! which follows the current contract), beside a 0.2.0 agent on the same thread, on both
//! backends. Between them the two guests call every 0.1.0 import; what each call answered is
//! compared with what 0.1.0 answered.

use std::time::Duration;

use crate::common::{Env, guest, signal, toml_path, wait_exit};
use crate::natsd;
use sha2::Digest;

/// The SHA-256 of `wit/0.1.0/homing.wit` as 0.1.0 was released: the frozen copy is never
/// edited, or components built against it could stop linking.
const V0_1_WIT_SHA256: &str = "33f1111d71032a9978bce9d5266c64e4b67ac862831375b1906817c57786f26c";

/// The SHA-256 of `wit/0.2.0/homing.wit` as 0.2.0 was released, frozen likewise.
const V0_2_WIT_SHA256: &str = "4d15421706c69a4d6de532dfd20e881839ed388eda193dd2cfb3e433438b9d24";

fn config(store: &str) -> String {
    format!(
        r#"
[host]
lease = "10s"
sweep_interval = "200ms"
shutdown_grace = "20s"

[plugins.compat-handler]
path = {handler}
enqueue_to = ["compat-agent"]
[plugins.compat-handler.retry]
initial = "10ms"
max = "50ms"

[plugins.compat-agent]
path = {agent}
reuse_instance = 10

[plugins.echo]
path = {echo}

[plugins.compat-v02]
path = {v02}
journal = "steps"
{store}
"#,
        v02 = toml_path(&guest("compat_v0_2_handler")),
        handler = toml_path(&guest("compat_v0_1_handler")),
        agent = toml_path(&guest("compat_v0_1_agent")),
        echo = toml_path(&guest("echo")),
    )
}

/// What the `all` command of the 0.1.0 handler reports, call by call, on a fresh thread `t`:
/// the answers 0.1.0 gave.
const GOLDEN_ALL: &str = "\
info agent=compat-handler thread=t payload=all attempt=0 max=5 priority=128
start ok(())
append ok(1)
append-expected ok(2)
append-expected-stale conflict(2)
read-log ok(\"1:a,2:b\")
log-latest ok(2)
stop None
enqueue ok(true)
free-enqueue ok(true)
enqueue-stranger denied
record-result ok(())";

fn v0_1_components_run_unchanged(store: &str) {
    let env = Env::new(&config(store));
    let all = env.enqueue("compat-handler", "t", "all", &[]);
    let echo = env.enqueue("echo", "t", "hello", &[]);
    let complete = env.enqueue("compat-handler", "t2", "complete", &[]);
    let nack = env.enqueue("compat-handler", "t3", "nack", &[]);
    let dead = env.enqueue("compat-handler", "t4", "dead", &[]);
    let v02 = env.enqueue("compat-v02", "t5", "from 0.2.0", &[]);
    let log = env.run_until_idle();
    assert_eq!(
        env.show(&v02)["result"]["output"],
        "append true; step-put Ok(()); step-get Ok(Some(\"v\")); emit Ok(1)",
        "a 0.2.0 component runs unchanged on 0.2.1"
    );
    assert!(log.contains("compat handler ran every call"), "{log}");

    let d = env.show(&all);
    assert_eq!(d["status"], "acked", "{d}");
    assert_eq!(d["result"]["output"], GOLDEN_ALL, "{d}");
    assert_eq!(env.show(&echo)["result"]["output"], "hello");
    let d = env.show(&complete);
    assert_eq!(
        (d["status"].as_str(), d["result"]["output"].as_str()),
        (Some("acked"), Some("done")),
        "the handler's own complete wins over its return value: {d}"
    );
    let d = env.show(&nack);
    assert_eq!(
        (
            d["status"].as_str(),
            d["attempt"].as_u64(),
            d["result"]["output"].as_str()
        ),
        (Some("acked"), Some(1), Some("retried")),
        "{d}"
    );
    let d = env.show(&dead);
    assert_eq!(d["status"], "dead_letter", "{d}");
    assert_eq!(d["last_error"], "gave up", "{d}");

    // The two follow-ups the handler enqueued (through the claim and the free enqueue) ran on
    // the 0.1.0 agent, which acked them with a recorded result.
    let follow_ups: Vec<_> = env
        .list()
        .into_iter()
        .filter(|d| d["agent"] == "compat-agent")
        .collect();
    assert_eq!(follow_ups.len(), 2, "{follow_ups:?}");
    for d in &follow_ups {
        assert_eq!(d["status"], "acked", "{d}");
        assert_eq!(d["result"]["output"], "acked", "{d}");
        assert_eq!(d["metadata"]["from"], "compat-handler", "{d}");
        assert_eq!(d["metadata"]["enqueued-by"], "compat-handler", "{d}");
    }
    assert_eq!(
        follow_ups
            .iter()
            .filter(|d| d["metadata"]["parent"] == all.as_str())
            .count(),
        1,
        "only the enqueue through the claim names its parent: {follow_ups:?}"
    );

    // The thread log as the 0.1.0 agent reads it.
    let reader = env.enqueue("compat-agent", "t", "log", &[]);
    env.run_until_idle();
    assert_eq!(
        env.show(&reader)["result"]["output"],
        "1:a\n2:b\n3:agent saw\n4:agent saw"
    );

    // Asked to stop, the 0.1.0 agent hears `shutdown`.
    let stop = env.enqueue("compat-agent", "stop", "stop", &[]);
    let mut host = env.spawn_run();
    env.wait_status(&stop, "claimed", Duration::from_secs(30));
    signal(&host, "TERM");
    let status = wait_exit(&mut host, Duration::from_secs(40));
    assert!(status.success(), "{status}\n{}", env.host_log());
    let d = env.show(&stop);
    assert_eq!(
        d["result"]["output"], "stopped: StopReason::Shutdown",
        "{d}"
    );
}

#[test]
fn compat_v0_1_components_run_unchanged() {
    v0_1_components_run_unchanged("");
}

#[test]
fn nats_compat_v0_1_components_run_unchanged() {
    let server = natsd::NatsServer::start();
    v0_1_components_run_unchanged(&format!(
        "[store]\nbackend = \"nats\"\nurl = \"{}\"\nprefix = \"compat\"\n",
        server.url()
    ));
}

#[test]
fn the_tools_report_each_components_contract() {
    let env = Env::new(&config(""));
    let check = env.ok(&["config", "check"]);
    assert!(
        check.contains("plugin compat-handler: handler world, homing:agent@0.1.0"),
        "{check}"
    );
    assert!(
        check.contains("plugin compat-agent: agent world, homing:agent@0.1.0"),
        "{check}"
    );
    assert!(
        check.contains("plugin echo: handler world, homing:agent@0.2.1"),
        "{check}"
    );
    assert!(
        check.contains("plugin compat-v02: handler world, homing:agent@0.2.0"),
        "{check}"
    );
    for (name, world, contract) in [
        ("compat_v0_1_handler", "handler", "homing:agent@0.1.0"),
        ("compat_v0_1_agent", "agent", "homing:agent@0.1.0"),
        ("echo", "handler", "homing:agent@0.2.1"),
        ("compat_v0_2_handler", "handler", "homing:agent@0.2.0"),
    ] {
        let out = env.ok(&["plugin", "inspect", guest(name).to_str().unwrap(), "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            (v["world"].as_str(), v["contract"].as_str()),
            (Some(world), Some(contract)),
            "{name}: {v}"
        );
    }
}

#[test]
fn the_frozen_contracts_are_unchanged() {
    for (version, sha) in [("0.1.0", V0_1_WIT_SHA256), ("0.2.0", V0_2_WIT_SHA256)] {
        let text =
            std::fs::read(crate::common::root().join(format!("wit/{version}/homing.wit"))).unwrap();
        let digest = sha2::Sha256::digest(&text);
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex, sha,
            "wit/{version}/homing.wit changed: it is frozen; put changes in wit/homing.wit"
        );
    }
}

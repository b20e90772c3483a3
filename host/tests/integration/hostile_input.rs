//! What a client, a producer or a reader may send that a host must not take at its word, each
//! against a real `homing run` over loopback: made-up HTTP methods (the metrics' labels stay
//! the host's own), lists over big dispatches (rows carry no payloads, pages are capped, and
//! three at once leave the host's memory where it was), log pages over big entries, a login's
//! `next` pointing elsewhere, names holding control characters (refused at the API and the
//! CLI, `Location` percent-encoded, stored strings printed escaped), and the component hash
//! the dashboard shows (the one running, not the file on disk).

use std::time::{Duration, Instant};

use reqwest::header;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::api::{Api, OPERATOR, PRODUCER, READER, TOKENS};
use crate::common::{guest, toml_path};

/// The most bytes of rows one list page carries (`MAX_PAGE_BYTES` in `api/dispatches.rs`).
const PAGE_CAP: usize = 2 << 20;

fn config(port: u16) -> String {
    format!(
        r#"
[host]
lease = "5s"
sweep_interval = "200ms"
shutdown_grace = "2s"
max_payload = "1MiB"

[api]
listen = "127.0.0.1:{port}"
request_timeout = "30s"
{TOKENS}

[plugins.echo]
path = "echo.wasm"

[plugins.sandbox]
path = {sandbox}
max_attempts = 1
"#,
        sandbox = toml_path(&guest("sandbox")),
    )
}

/// A host whose `echo` runs from a copy of the component in its own directory.
async fn start() -> Api {
    Api::start_with(config, |dir| {
        std::fs::copy(guest("echo"), dir.join("echo.wasm")).unwrap();
    })
    .await
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// `GET path` with the reader token: status and body text.
async fn get_text(api: &Api, path: &str) -> (u16, String) {
    let r = client()
        .get(api.url(path))
        .bearer_auth(READER)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The resident memory of process `pid` in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// A dashboard session of `token`: the cookie to send.
async fn login(api: &Api, token: &str) -> String {
    let r = client()
        .post(api.url("/login"))
        .form(&[("token", token)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let set = r.headers()[header::SET_COOKIE].to_str().unwrap();
    set.split(';').next().unwrap().to_owned()
}

/// 2,000 requests with made-up methods, each method new: the metrics page grows by a few
/// series at most (`method="other"`), never one per method.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_methods_do_not_grow_the_metrics() {
    let api = start().await;
    let (status, before) = get_text(&api, "/metrics").await;
    assert_eq!(status, 200);
    let client = client();
    for i in 0..2000 {
        let method = reqwest::Method::from_bytes(format!("XMETHOD{i}").as_bytes()).unwrap();
        let r = client
            .request(method, api.url(&format!("/no-such-route-{i}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404);
    }
    let (_, after) = get_text(&api, "/metrics").await;
    assert!(
        !after.contains("XMETHOD"),
        "a made-up method became a label"
    );
    assert!(
        after.contains(r#"method="other""#),
        "made-up methods count as other:\n{after}"
    );
    assert!(
        after.len() < before.len() + 16 * 1024,
        "the metrics grew from {} to {} bytes",
        before.len(),
        after.len()
    );
}

/// Lists carry no payloads (their sizes instead), stay under the page cap whatever the rows
/// hold, and page through every row exactly once; three concurrent lists (and the dashboard's)
/// over 200 queued 1 MiB dispatches leave the host's memory where it was, and `/livez` answers
/// meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_carry_no_payloads_and_are_capped() {
    let api = start().await;
    let big = "p".repeat(1 << 20);
    for i in 0..200 {
        api.enqueue(json!({
            "agent": "echo", "thread": format!("big-{i}"), "payload": big, "delay": "1h"
        }))
        .await;
    }
    // Rows whose metadata is near its cap: 60 of them are more than one page's bytes.
    let notes = "m".repeat(60 * 1024);
    for i in 0..60 {
        api.enqueue(json!({
            "agent": "sandbox", "thread": format!("meta-{i}"), "payload": "x", "delay": "1h",
            "metadata": { "notes": notes }
        }))
        .await;
    }

    let (status, page) = get_text(&api, "/v1/dispatches?agent=echo&limit=1000").await;
    assert_eq!(status, 200);
    assert!(page.len() < 1 << 20, "{} bytes for 200 rows", page.len());
    let page: Value = serde_json::from_str(&page).unwrap();
    let rows = page["dispatches"].as_array().unwrap();
    assert_eq!(rows.len(), 200);
    for row in rows {
        assert!(row.get("payload").is_none(), "a list row has a payload");
        assert_eq!(row["payload_size"], 1 << 20, "{row}");
    }
    // The dispatch's own route still has the payload.
    let id = rows[0]["id"].as_str().unwrap();
    let (_, one) = api.get(&format!("/v1/dispatches/{id}")).await;
    assert_eq!(one["payload"].as_str().map(str::len), Some(1 << 20));

    // Pages of big rows end early, under the cap, and the cursor goes on from there.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/dispatches?agent=sandbox&limit=1000&cursor={c}"),
            None => "/v1/dispatches?agent=sandbox&limit=1000".to_owned(),
        };
        let (status, text) = get_text(&api, &path).await;
        assert_eq!(status, 200, "{text}");
        assert!(text.len() <= PAGE_CAP, "a page of {} bytes", text.len());
        let page: Value = serde_json::from_str(&text).unwrap();
        for row in page["dispatches"].as_array().unwrap() {
            assert_eq!(
                row["metadata"]["notes"].as_str().map(str::len),
                Some(notes.len())
            );
            seen.push(row["id"].as_str().unwrap().to_owned());
        }
        pages += 1;
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.replace(':', "%3A")),
            None => break,
        }
    }
    assert!(pages > 1, "60 rows of 60 KiB fit one page");
    let unique: std::collections::BTreeSet<_> = seen.iter().collect();
    assert_eq!((seen.len(), unique.len()), (60, 60), "every row once");

    // The attack: three concurrent lists of 1,000, the dashboard's overview and its newest
    // first list, while /livez is asked.
    let cookie = login(&api, READER).await;
    let pid = api.pid();
    let before = rss_kib(pid);
    let mut peak = before;
    let lists: Vec<_> = (0..3)
        .map(|_| {
            let url = api.url("/v1/dispatches?limit=1000");
            tokio::spawn(async move {
                let r = client().get(url).bearer_auth(READER).send().await.unwrap();
                assert_eq!(r.status(), 200);
                r.bytes().await.unwrap().len()
            })
        })
        .chain(["/", "/dispatches?order=newest"].into_iter().map(|path| {
            let (url, cookie) = (api.url(path), cookie.clone());
            tokio::spawn(async move {
                let r = client()
                    .get(url)
                    .header(header::COOKIE, cookie)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
                r.bytes().await.unwrap().len()
            })
        }))
        .collect();
    let mut slowest_livez = Duration::ZERO;
    while lists.iter().any(|l| !l.is_finished()) {
        let started = Instant::now();
        let r = client().get(api.url("/livez")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        slowest_livez = slowest_livez.max(started.elapsed());
        peak = peak.max(rss_kib(pid));
    }
    for list in lists {
        let bytes = list.await.unwrap();
        assert!(bytes <= PAGE_CAP, "a response of {bytes} bytes");
    }
    peak = peak.max(rss_kib(pid));
    eprintln!(
        "host memory: {before} KiB before the lists, {peak} KiB at most during them; \
         /livez took {slowest_livez:?} at most"
    );
    assert!(
        peak < before + 64 * 1024,
        "the lists took the host from {before} KiB to {peak} KiB"
    );
    assert!(
        slowest_livez < Duration::from_secs(2),
        "/livez took {slowest_livez:?}"
    );
}

/// A page of a thread's log over big entries ends early under the cap; asking after its last
/// entry reads the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_page_is_capped() {
    let api = start().await;
    // Each run appends one entry of 600,000 bytes (binary: 800,000 of base64 in JSON).
    for _ in 0..4 {
        let id = api
            .enqueue(
                json!({ "agent": "sandbox", "thread": "logged", "payload": "oversize:600000" }),
            )
            .await;
        api.wait_terminal(&id).await;
    }
    let mut after = 0;
    let mut entries = 0;
    let mut pages = 0;
    loop {
        let (status, text) = get_text(
            &api,
            &format!("/v1/threads/logged/log?limit=1000&after={after}"),
        )
        .await;
        assert_eq!(status, 200, "{text}");
        assert!(text.len() <= PAGE_CAP, "a page of {} bytes", text.len());
        let page: Value = serde_json::from_str(&text).unwrap();
        let got = page["entries"].as_array().unwrap();
        if got.is_empty() {
            break;
        }
        entries += got.len();
        pages += 1;
        after = got.last().unwrap()["seq"].as_u64().unwrap();
    }
    assert_eq!(entries, 4, "one append per run");
    assert!(pages > 1, "4 entries of 800 KB fit one page");
}

/// After login, only a path of this dashboard is followed: a tab, a second slash, a backslash
/// or an absolute URL lands on `/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_only_follows_local_paths() {
    let api = start().await;
    let client = client();
    let location =
        |r: &reqwest::Response| r.headers()[header::LOCATION].to_str().unwrap().to_owned();
    for (next, expected) in [
        ("/dispatches?agent=echo", "/dispatches?agent=echo"),
        ("/\t/evil.example", "/"),
        ("/\n/evil.example", "/"),
        ("/ /evil.example", "/"),
        ("//evil.example", "/"),
        ("/\\evil.example", "/"),
        ("\\/evil.example", "/"),
        ("https://evil.example/", "/"),
        ("evil.example", "/"),
        ("/caf\u{e9}", "/"),
    ] {
        let r = client
            .post(api.url("/login"))
            .form(&[("token", READER), ("next", next)])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 303, "{next:?}");
        assert_eq!(location(&r), expected, "POST /login next={next:?}");
        // Logged in already, the login page sends the browser on the same way.
        let cookie = r.headers()[header::SET_COOKIE]
            .to_str()
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .to_owned();
        let r = client
            .get(api.url("/login"))
            .query(&[("next", next)])
            .header(header::COOKIE, cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(location(&r), expected, "GET /login next={next:?}");
    }
}

/// Names with control characters are refused at every entry point with a 400 naming the
/// field, and nothing is stored; `Location` is percent-encoded; a thread name past enqueue's
/// cap is refused by interrupt as by enqueue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_with_control_characters_are_refused_by_the_api() {
    let api = start().await;
    let base = json!({ "agent": "echo", "thread": "t", "payload": "x", "delay": "1h" });
    let with = |key: &str, value: Value| {
        let mut body = base.clone();
        body[key] = value;
        body
    };
    for (field, body) in [
        ("id", with("id", json!("forged\nINFO homing: all good"))),
        ("id", with("id", json!("\u{1b}[2J"))),
        ("thread", with("thread", json!("t\u{1b}]0;owned\u{7}"))),
        ("thread", with("thread", json!("\u{202e}evil"))),
        ("thread", with("thread", json!("a\u{85}b"))),
        ("thread", with("thread", json!("x".repeat(10 * 1024)))),
        ("agent", with("agent", json!("echo\n"))),
        ("dedupe_key", with("dedupe_key", json!("k\u{0}"))),
        ("metadata", with("metadata", json!({ "a\nb": "v" }))),
        (
            "metadata",
            with("metadata", json!({ "big": "v".repeat(65 * 1024) })),
        ),
    ] {
        let (status, reply) = api.post("/v1/dispatches", PRODUCER, body.clone()).await;
        assert_eq!(
            (status, reply["field"].as_str()),
            (400, Some(field)),
            "{reply}"
        );
    }
    let (_, list) = api.get("/v1/dispatches").await;
    assert_eq!(list["dispatches"], json!([]), "nothing was stored");

    // Every route that takes an id or a thread applies the same rule.
    let long = "x".repeat(10 * 1024);
    for (path, token, field) in [
        (format!("/v1/threads/{long}/interrupt"), OPERATOR, "thread"),
        ("/v1/threads/a%0Ab/interrupt".to_owned(), OPERATOR, "thread"),
        ("/v1/dispatches/a%1Bb/cancel".to_owned(), OPERATOR, "id"),
        ("/v1/dispatches/a%0Ab/retry".to_owned(), OPERATOR, "id"),
    ] {
        let (status, reply) = api.post(&path, token, json!({})).await;
        assert_eq!(
            (status, reply["field"].as_str()),
            (400, Some(field)),
            "{path}: {reply}"
        );
    }
    for (path, field) in [
        ("/v1/dispatches/a%0Ab".to_owned(), "id"),
        (format!("/v1/threads/{long}/log"), "thread"),
        ("/v1/threads/a%1B/log/stream".to_owned(), "thread"),
        ("/v1/dispatches?thread=a%0Ab".to_owned(), "thread"),
    ] {
        let (status, reply) = api.get(&path).await;
        assert_eq!(
            (status, reply["field"].as_str()),
            (400, Some(field)),
            "{path}: {reply}"
        );
    }

    // A printable id with a space, a slash and a non-ASCII letter is kept, and its Location
    // is one percent-encoded segment that leads back to it.
    let r = client()
        .post(api.url("/v1/dispatches"))
        .bearer_auth(PRODUCER)
        .json(&with("id", json!("a b/\u{e9}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let location = r.headers()[header::LOCATION].to_str().unwrap().to_owned();
    assert_eq!(location, "/v1/dispatches/a%20b%2F%C3%A9");
    let (status, d) = api.get(&location).await;
    assert_eq!((status, d["id"].as_str()), (200, Some("a b/\u{e9}")));
}

/// `homing enqueue` refuses control characters in each name, naming the flag (exit 2, nothing
/// stored); strings stored through other fields (a metadata value, an interrupt's reason) are
/// printed escaped by `dispatch list` and `dispatch show`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_refuses_control_characters_and_prints_stored_ones_escaped() {
    let api = start().await;
    let env = &api.env;
    for (flag, args) in [
        ("--thread", vec!["--thread", "a\nb"]),
        (
            "--agent",
            vec!["--agent", "echo\u{1b}[31m", "--thread", "t"],
        ),
        ("--id", vec!["--thread", "t", "--id", "\u{1b}[2Jforged"]),
        ("--dedupe-key", vec!["--thread", "t", "--dedupe-key", "k\r"]),
        ("--meta", vec!["--thread", "t", "--meta", "k\u{7f}=v"]),
    ] {
        let mut full = vec!["enqueue", "--payload", "x"];
        if !args.contains(&"--agent") {
            full.extend(["--agent", "echo"]);
        }
        full.extend(args.iter().copied());
        let out = env.homing(&full);
        assert_eq!(out.status.code(), Some(2), "{full:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(flag), "{full:?}: {stderr}");
        assert!(!stderr.contains('\u{1b}'), "{stderr}");
    }
    let out = env.homing(&["thread", "interrupt", "a\nb"]);
    assert_eq!(out.status.code(), Some(2));
    let (_, list) = api.get("/v1/dispatches").await;
    assert_eq!(list["dispatches"], json!([]), "nothing was stored");

    let id = env.enqueue(
        "echo",
        "t",
        "x",
        &["--delay", "1h", "--meta", "note=\u{1b}[31mred\nline"],
    );
    env.ok(&[
        "thread",
        "interrupt",
        "t",
        "--reason",
        "\u{1b}[2Jgone\nforged",
    ]);
    let show = env.ok(&["dispatch", "show", &id]);
    let list = env.ok(&["dispatch", "list"]);
    for out in [&show, &list] {
        assert!(
            !out.contains('\u{1b}') && !out.contains("\nforged") && !out.contains("\nline"),
            "{out}"
        );
    }
    assert!(show.contains("\\u{1b}[31mred\\nline"), "{show}");
    assert!(list.contains("\\u{1b}[2Jgone\\nforged"), "{list}");
}

/// The dashboard and `GET /v1/agents` show the SHA-256 of the component the host loaded, even
/// after the file on disk changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_component_hash_is_of_what_runs() {
    let api = start().await;
    let path = api.env.path().join("echo.wasm");
    let hex = |bytes: &[u8]| -> String {
        Sha256::digest(bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let loaded = hex(&std::fs::read(&path).unwrap());
    let replacement = std::fs::read(guest("flaky")).unwrap();
    std::fs::write(&path, &replacement).unwrap();
    let on_disk = hex(&replacement);

    let (_, agents) = api.get("/v1/agents").await;
    let echo = agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "echo")
        .unwrap()
        .clone();
    assert_eq!(echo["component_sha256"].as_str(), Some(loaded.as_str()));

    let cookie = login(&api, READER).await;
    let page = client()
        .get(api.url("/agents"))
        .header(header::COOKIE, cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains(&loaded), "the loaded hash is shown");
    assert!(!page.contains(&on_disk), "the file's new hash is not");
}

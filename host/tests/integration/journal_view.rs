//! A dispatch's journal as readers see it, against a real `homing run` on the embedded store:
//! `GET /v1/dispatches/{id}/journal` (entries without bodies, the steps, pages), one entry with
//! its body (text, or base64), the refusals (an unknown dispatch or position, a bad `after`, no
//! token); `homing dispatch show ID --journal`; the dashboard's dispatch page, its stored values
//! escaped.
//!
//! No guest records anything here: the test opens the host's SQLite file, enqueues a dispatch of
//! an agent the host does not serve (so only the test claims it), claims it and writes its
//! journal through the store as the runtime would.

use homing::store::journal::identity;
use homing::store::{CallEntry, CallKind, Fence, NewDispatch, NewStep, Store};
use reqwest::header;
use serde_json::{Value, json};

use crate::api::{Api, READER};
use crate::dashboard::{raw_client, session};
use crate::waitpoints::{AGENT, Seeder, config};

/// The JSON body of the first http entry: it has markup in it, to be escaped on the page.
const JSON_BODY: &str = r#"{"reply":"<script>alert(1)</script>","n":[1,2]}"#;

/// A claimed dispatch of [`AGENT`] on `thread` with a journal: an http entry with a JSON body
/// (0), an http entry with a body that is not UTF-8 and a URL with a control character (1), a
/// log append (2), an enqueue (3); and two steps.
async fn journaled(store: &Store, thread: &str) -> String {
    let d = store
        .mailbox
        .enqueue(NewDispatch::new(AGENT, thread, b"ask".to_vec()))
        .await
        .unwrap();
    let claimed = store
        .mailbox
        .claim_dispatch(&d.id, "test-worker", 600_000)
        .await
        .unwrap()
        .expect("the seeded dispatch is claimable");
    let fence = Fence::of(&claimed).unwrap();
    let id = identity([&b"call"[..]]);
    let http = |pos, url: &str, status: u16, body: &[u8]| {
        CallEntry::new(
            &d.id,
            pos,
            CallKind::Http,
            id.clone(),
            json!({
                "method": "POST",
                "url": url,
                "status": status,
                "headers": [["content-type", "application/json"]],
            }),
            Some(body.to_vec()),
            1,
            0,
            12_500,
        )
    };
    store
        .journal
        .record(
            &fence,
            http(
                0,
                "https://api.example/v1/chat?key=",
                200,
                JSON_BODY.as_bytes(),
            ),
        )
        .await
        .unwrap();
    store
        .journal
        .record(
            &fence,
            http(1, "https://api.example/\u{1b}[2J", 201, &[0xff, 0xfe, 0x00]),
        )
        .await
        .unwrap();
    let append = CallEntry::new(
        &d.id,
        2,
        CallKind::LogAppend,
        id.clone(),
        json!({}),
        None,
        1,
        0,
        800,
    );
    let seq = store
        .journal
        .record_append(&fence, append, b"noted", None)
        .await
        .unwrap();
    assert_eq!(seq, 1);
    let enqueue = CallEntry::new(
        &d.id,
        3,
        CallKind::Enqueue,
        id,
        json!({ "id": "follow-up-1" }),
        None,
        1,
        0,
        2_000_000,
    );
    store.journal.record(&fence, enqueue).await.unwrap();
    for key in ["summarize", "summarize#2"] {
        store
            .journal
            .put_step(
                &fence,
                NewStep {
                    key: key.to_owned(),
                    value: br#""a summary""#.to_vec(),
                    claim: 1,
                    attempt: 0,
                },
            )
            .await
            .unwrap();
    }
    d.id
}

/// A dispatch with no journal.
async fn plain(store: &Store, thread: &str) -> String {
    store
        .mailbox
        .enqueue(NewDispatch::new(AGENT, thread, b"ask".to_vec()))
        .await
        .unwrap()
        .id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_lists_a_journal_and_shows_one_entry_with_its_body() {
    let api = Api::start_with(config, |_| {}).await;
    let seeder = Seeder::open(api.env.path());
    let id = journaled(&seeder.store, "jv-api").await;
    let empty = plain(&seeder.store, "jv-empty").await;

    // The list: entries without bodies or headers, the steps on the first page.
    let (status, page) = api.get(&format!("/v1/dispatches/{id}/journal")).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["dispatch"], id.as_str());
    let entries = page["entries"].as_array().unwrap();
    let pos: Vec<u64> = entries.iter().map(|e| e["pos"].as_u64().unwrap()).collect();
    assert_eq!(pos, vec![0, 1, 2, 3]);
    let first = &entries[0];
    assert_eq!(first["kind"], "http");
    assert_eq!(first["method"], "POST");
    assert_eq!(first["url"], "https://api.example/v1/chat?key=");
    assert_eq!(first["status"], 200);
    assert_eq!(first["claim"], 1);
    assert_eq!(first["attempt"], 0);
    assert_eq!(first["duration_us"], 12_500);
    assert_eq!(first["body_size"], JSON_BODY.len());
    assert!(first["size"].as_u64().unwrap() > JSON_BODY.len() as u64);
    assert!(first["recorded_at"].as_u64().unwrap() > 0);
    assert!(
        first.get("body").is_none() && first.get("headers").is_none(),
        "{first}"
    );
    assert_eq!(first["answer"], Value::Null, "{first}");
    assert_eq!(entries[2]["kind"], "log-append");
    assert_eq!(entries[2]["answer"]["seq"], 1);
    assert_eq!(entries[2]["method"], Value::Null);
    assert_eq!(entries[3]["answer"]["id"], "follow-up-1");
    let keys: Vec<&str> = page["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, vec!["summarize", "summarize#2"]);
    assert!(page["steps"][0].get("value").is_none());
    assert_eq!(page["next_cursor"], Value::Null);
    assert!(page["bytes"].as_u64().unwrap() > 0);

    // Pages by `after`.
    let (status, one) = api
        .get(&format!("/v1/dispatches/{id}/journal?limit=3"))
        .await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(one["entries"].as_array().unwrap().len(), 3);
    assert_eq!(one["next_cursor"], 2);
    let (status, two) = api
        .get(&format!("/v1/dispatches/{id}/journal?after=2&limit=3"))
        .await;
    assert_eq!(status, 200, "{two}");
    assert_eq!(two["entries"][0]["pos"], 3);
    assert_eq!(two["entries"].as_array().unwrap().len(), 1);
    assert_eq!(two["next_cursor"], Value::Null);
    assert!(two.get("steps").is_none(), "steps only on the first page");

    // One entry, with its body and whole answer.
    let (status, e) = api.get(&format!("/v1/dispatches/{id}/journal/0")).await;
    assert_eq!(status, 200, "{e}");
    assert_eq!(e["body"], JSON_BODY);
    assert!(e.get("encoding").is_none(), "{e}");
    assert_eq!(e["answer"]["headers"][0][1], "application/json");
    assert_eq!(e["dispatch"], id.as_str());
    let (status, e) = api.get(&format!("/v1/dispatches/{id}/journal/1")).await;
    assert_eq!(status, 200, "{e}");
    assert_eq!(e["encoding"], "base64");
    assert_eq!(e["body"], "//4A");
    assert_eq!(e["url"], "https://api.example/\u{1b}[2J");
    let (status, e) = api.get(&format!("/v1/dispatches/{id}/journal/2")).await;
    assert_eq!(status, 200, "{e}");
    assert_eq!(e["body"], Value::Null);

    // A dispatch without a journal has empty lists.
    let (status, none) = api.get(&format!("/v1/dispatches/{empty}/journal")).await;
    assert_eq!(status, 200, "{none}");
    assert_eq!(none["entries"], json!([]));
    assert_eq!(none["steps"], json!([]));

    // Refusals: the other dispatch routes' 404 for an unknown id, 404 for a position.
    let (status, shown) = api.get("/v1/dispatches/nope").await;
    assert_eq!(status, 404);
    let (status, listed) = api.get("/v1/dispatches/nope/journal").await;
    assert_eq!(status, 404, "{listed}");
    assert_eq!(listed, shown, "the same shape as the other dispatch routes");
    let (status, body) = api.get("/v1/dispatches/nope/journal/0").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body, shown);
    let (status, body) = api.get(&format!("/v1/dispatches/{id}/journal/9")).await;
    assert_eq!(status, 404, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("position 9"),
        "{body}"
    );
    for bad in [
        "journal/x",
        "journal/-1",
        "journal?after=x",
        "journal?limit=0",
        "journal?since=1",
    ] {
        let (status, body) = api.get(&format!("/v1/dispatches/{id}/{bad}")).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(body["field"].is_string(), "{bad}: {body}");
    }

    // No token: 401.
    let client = reqwest::Client::new();
    for path in [
        format!("/v1/dispatches/{id}/journal"),
        format!("/v1/dispatches/{id}/journal/0"),
    ] {
        let response = client.get(api.url(&path)).send().await.unwrap();
        assert_eq!(response.status(), 401, "{path}");
        let body: Value = response.json().await.unwrap();
        assert!(body["error"].is_string(), "{body}");
        let response = client
            .get(api.url(&path))
            .bearer_auth(READER)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_prints_the_journal_timeline() {
    let api = Api::start_with(config, |_| {}).await;
    let env = &api.env;
    let seeder = Seeder::open(env.path());
    let id = journaled(&seeder.store, "jv-cli").await;

    let out = env.ok(&["dispatch", "show", &id, "--journal"]);
    assert!(out.contains("journal:      4 entries, 2 steps"), "{out}");
    let lines: Vec<&str> = out.lines().collect();
    let line = |needle: &str| {
        lines
            .iter()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?}:\n{out}"))
            .to_owned()
    };
    let http = line("POST https://api.example/v1/chat?key= -> 200");
    assert!(http.trim_start().starts_with("0  http"), "{http}");
    assert!(http.contains("12.5ms"), "{http}");
    assert!(line("seq 1").contains("log-append"), "{out}");
    assert!(line("id follow-up-1").contains("2.00s"), "{out}");
    assert!(line("summarize#2").contains("1"), "{out}");
    // A stored control character is printed escaped.
    assert!(!out.contains('\u{1b}'), "{out:?}");
    assert!(line("-> 201").contains("\\u{1b}[2J"), "{out}");

    // Without --journal, no timeline; with --json, under `journal`.
    let plain = env.ok(&["dispatch", "show", &id]);
    assert!(!plain.contains("journal:"), "{plain}");
    let shown: Value =
        serde_json::from_str(&env.ok(&["dispatch", "show", &id, "--journal", "--json"])).unwrap();
    assert_eq!(shown["journal"]["entries"][0]["method"], "POST");
    assert_eq!(shown["journal"]["steps"][1]["key"], "summarize#2");
    assert!(shown["journal"]["entries"][0].get("body").is_none());
    let code = env
        .homing(&["dispatch", "show", "nope", "--journal"])
        .status
        .code();
    assert_eq!(code, Some(3), "an unknown id");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dispatch_page_shows_the_journal_escaped() {
    let api = Api::start_with(config, |_| {}).await;
    let seeder = Seeder::open(api.env.path());
    let id = journaled(&seeder.store, "jv-page").await;
    let empty = plain(&seeder.store, "jv-page-empty").await;
    let client = raw_client();
    let (cookie, _) = session(&api, &client, READER).await;
    let page = |id: String| {
        let client = client.clone();
        let cookie = cookie.clone();
        let url = api.url(&format!("/dispatches/{id}"));
        async move {
            let r = client
                .get(url)
                .header(header::COOKIE, cookie)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let csp = r.headers()["content-security-policy"]
                .to_str()
                .unwrap()
                .to_owned();
            assert!(!csp.contains("unsafe-inline"), "{csp}");
            r.text().await.unwrap()
        }
    };
    let html = page(id.clone()).await;
    assert!(html.contains("<h2>Journal</h2>"), "{html}");
    assert!(html.contains("id=\"journal\""), "{html}");
    assert!(html.contains("data-pos=\"3\""), "{html}");
    assert!(
        html.contains("POST https://api.example/v1/chat?key="),
        "{html}"
    );
    // The JSON body, pretty-printed and escaped, in a <details>.
    assert!(html.contains("<details>"), "{html}");
    assert!(
        html.contains("&quot;reply&quot;: &quot;&lt;script&gt;alert(1)&lt;/script&gt;&quot;"),
        "{html}"
    );
    assert!(!html.contains("<script>alert(1)"), "{html}");
    // The body that is not JSON is only sized.
    assert!(html.contains("body: 3 bytes"), "{html}");
    assert!(
        html.contains("seq 1") && html.contains("id follow-up-1"),
        "{html}"
    );
    assert!(html.contains("summarize#2"), "{html}");
    assert!(html.contains("12.5ms"), "{html}");
    // No journal, no section.
    let html = page(empty).await;
    assert!(!html.contains("Journal"), "{html}");
}

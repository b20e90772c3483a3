//! Waitpoints from the operator's and the caller's side, against a real `homing run` on the
//! embedded store: the API's routes (completion by the waitpoint's own token in the header
//! or the query, by an operator; refusals of an unknown id and of a wrong token alike, of
//! small roles, of a settled or timed-out waitpoint, of an oversized result; cancel; the list
//! and its filters and pages; `?status=waiting`), and `homing waitpoint ...` with its exit
//! codes.
//!
//! No guest makes the waitpoints here: the test opens the host's SQLite file itself (a second
//! process on one file is supported), enqueues a dispatch of an agent the host does not serve
//! (so only the test claims it), claims it, creates its waitpoints with tokens it mints, and
//! suspends it: the dispatch is `waiting`, as a guest's `suspend` leaves it.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use homing::store::embedded::EmbeddedStore;
use homing::store::waitpoints::{mint_token, token_digest};
use homing::store::{Fence, NewDispatch, NewWaitpoint, Store, SystemClock};
use serde_json::{Value, json};

use crate::api::{Api, OPERATOR, PRODUCER, READER, TOKENS, sample};
use crate::common::{guest, toml_path};

/// The agent of the seeded dispatches: no plugin of the test hosts, so the host never claims
/// them, before or after they resume.
pub(crate) const AGENT: &str = "approver";

/// A fresh waitpoint token, as the host mints them: `hwp_` and 32 random bytes, base64url.
pub(crate) fn mint() -> String {
    mint_token().unwrap()
}

/// A waitpoint to seed: its name, timeout in ms and metadata.
pub(crate) type Point<'a> = (&'a str, u64, &'a [(&'a str, &'a str)]);

/// The host's store, opened by the test.
pub(crate) struct Seeder {
    pub(crate) store: Store,
}

/// A waiting dispatch and its waitpoints, each with its id and token.
pub(crate) struct Seeded {
    pub(crate) dispatch: String,
    pub(crate) waitpoints: Vec<(String, String)>,
}

impl Seeded {
    pub(crate) fn id(&self, i: usize) -> &str {
        &self.waitpoints[i].0
    }

    pub(crate) fn token(&self, i: usize) -> &str {
        &self.waitpoints[i].1
    }
}

impl Seeder {
    /// Opens the embedded store of the host whose directory is `dir`.
    pub(crate) fn open(dir: &Path) -> Seeder {
        let store = EmbeddedStore::open(&dir.join("homing.db"), Arc::new(SystemClock))
            .unwrap()
            .store();
        Seeder { store }
    }

    /// A dispatch of [`AGENT`] on `thread`, claimed, given one waitpoint per `(name, timeout
    /// in ms, metadata)`, and suspended: `waiting`.
    pub(crate) async fn waiting(&self, thread: &str, points: &[Point<'_>]) -> Seeded {
        let d = self
            .store
            .mailbox
            .enqueue(NewDispatch::new(AGENT, thread, b"ask".to_vec()))
            .await
            .unwrap();
        let claimed = self
            .store
            .mailbox
            .claim_dispatch(&d.id, "test-worker", 60_000)
            .await
            .unwrap()
            .expect("the seeded dispatch is claimable");
        let token = claimed.token().unwrap().to_owned();
        let claimed = self
            .store
            .mailbox
            .record_start(&claimed.id, &token)
            .await
            .unwrap();
        let fence = Fence::of(&claimed).unwrap();
        let mut waitpoints = Vec::new();
        for (name, timeout_ms, metadata) in points {
            let secret = mint();
            let created = self
                .store
                .waitpoints
                .create_waitpoint(
                    &fence,
                    NewWaitpoint {
                        name: (*name).to_owned(),
                        timeout_ms: *timeout_ms,
                        metadata: metadata
                            .iter()
                            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                            .collect(),
                        token_digest: token_digest(&secret),
                    },
                )
                .await
                .unwrap();
            assert!(created.created);
            waitpoints.push((created.waitpoint.id, secret));
        }
        let suspended = self
            .store
            .mailbox
            .suspend(&claimed.id, &token, 100)
            .await
            .unwrap();
        assert_eq!(suspended.status.as_str(), "waiting");
        Seeded {
            dispatch: d.id,
            waitpoints,
        }
    }
}

pub(crate) fn config(port: u16) -> String {
    format!(
        r#"
[host]
lease = "5s"
sweep_interval = "200ms"
shutdown_grace = "2s"
max_payload = "64KiB"

[api]
listen = "127.0.0.1:{port}"
request_timeout = "10s"
{TOKENS}

[plugins.echo]
path = {echo}
"#,
        echo = toml_path(&guest("echo")),
    )
}

/// How a completion presents its token.
enum By<'a> {
    Header(&'a str),
    Query(&'a str),
    Both { header: &'a str, query: &'a str },
    Nothing,
}

/// `POST /v1/waitpoints/{id}/complete` with `body`: the status, and the body as JSON.
async fn complete(api: &Api, id: &str, by: By<'_>, body: Vec<u8>) -> (u16, Value) {
    let client = reqwest::Client::new();
    let mut url = api.url(&format!("/v1/waitpoints/{id}/complete"));
    let header = match by {
        By::Header(token) => Some(token),
        By::Query(token) => {
            url.push_str(&format!("?token={token}"));
            None
        }
        By::Both { header, query } => {
            url.push_str(&format!("?token={query}"));
            Some(header)
        }
        By::Nothing => None,
    };
    let mut request = client.post(url).body(body);
    if let Some(token) = header {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    let value = serde_json::from_str(&text)
        .unwrap_or_else(|_| panic!("complete {id}: not JSON ({status}): {text}"));
    (status, value)
}

async fn waitpoint(api: &Api, id: &str) -> Value {
    let (status, w) = api.get(&format!("/v1/waitpoints/{id}")).await;
    assert_eq!(status, 200, "{w}");
    w
}

async fn dispatch(api: &Api, id: &str) -> Value {
    let (status, d) = api.get(&format!("/v1/dispatches/{id}")).await;
    assert_eq!(status, 200, "{d}");
    d
}

/// Every page of `/v1/waitpoints?query` with `limit`, by cursor.
async fn pages(api: &Api, query: &str, limit: usize) -> Vec<Value> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..100 {
        let path = match &cursor {
            None => format!("/v1/waitpoints?{query}&limit={limit}"),
            Some(c) => format!("/v1/waitpoints?{query}&limit={limit}&cursor={c}"),
        };
        let (status, page) = api.get(&path).await;
        assert_eq!(status, 200, "{path}: {page}");
        let items = page["waitpoints"].as_array().unwrap();
        assert!(items.len() <= limit);
        out.extend(items.iter().cloned());
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return out,
        }
    }
    panic!("the pages of {query} never end");
}

fn ids(list: &[Value]) -> Vec<String> {
    list.iter()
        .map(|w| w["id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_completes_cancels_and_lists_waitpoints() {
    let api = Api::start_with(config, |_| {}).await;
    let seeder = Seeder::open(api.env.path());
    let ask: &[(&str, &str)] = &[("question", "ship it?")];
    // One dispatch with two waitpoints; four with one each.
    let a = seeder
        .waiting(
            "wp-a",
            &[("approve", 600_000, ask), ("review", 600_000, &[])],
        )
        .await;
    let b = seeder.waiting("wp-b", &[("approve", 600_000, ask)]).await;
    let c = seeder.waiting("wp-c", &[("approve", 600_000, &[])]).await;
    let late = seeder.waiting("wp-late", &[("approve", 1, &[])]).await;
    let e = seeder.waiting("wp-e", &[("approve", 600_000, &[])]).await;
    let all_tokens: Vec<String> = [&a, &b, &c, &late, &e]
        .iter()
        .flat_map(|s| s.waitpoints.iter().map(|(_, t)| t.clone()))
        .collect();
    let mut seen = String::new();

    // `?status=waiting` filters the lists; the record says waiting.
    let (status, list) = api.get("/v1/dispatches?status=waiting").await;
    assert_eq!(status, 200, "{list}");
    let waiting: Vec<&str> = list["dispatches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    for s in [&a, &b, &c, &late, &e] {
        assert!(waiting.contains(&s.dispatch.as_str()), "{list}");
    }
    assert_eq!(waiting.len(), 5, "{list}");
    let (_, none) = api.get("/v1/dispatches?status=queued").await;
    assert_eq!(none["dispatches"], json!([]), "{none}");
    assert_eq!(dispatch(&api, &a.dispatch).await["status"], "waiting");

    // The list, by thread and state, a page at a time.
    let (status, page) = api.get("/v1/waitpoints?thread=wp-a").await;
    assert_eq!(status, 200, "{page}");
    seen.push_str(&page.to_string());
    let shown = page["waitpoints"].as_array().unwrap();
    assert_eq!(ids(shown), vec![a.id(0), a.id(1)], "oldest first: {page}");
    assert_eq!(shown[0]["name"], "approve");
    assert_eq!(shown[0]["metadata"]["question"], "ship it?");
    assert_eq!(shown[0]["state"], "pending");
    assert_eq!(shown[0]["dispatch"].as_str(), Some(a.dispatch.as_str()));
    assert_eq!(shown[0]["agent"], AGENT);
    assert!(shown[0].get("token_digests").is_none(), "{page}");
    let every = pages(&api, "state=pending", 1000).await;
    assert_eq!(every.len(), 6);
    let paged = pages(&api, "state=pending", 2).await;
    assert_eq!(ids(&paged), ids(&every), "pages of two make the whole list");
    let (_, by_dispatch) = api
        .get(&format!("/v1/waitpoints?dispatch={}", b.dispatch))
        .await;
    assert_eq!(
        ids(by_dispatch["waitpoints"].as_array().unwrap()),
        vec![b.id(0)]
    );
    for bad in [
        "/v1/waitpoints?state=done",
        "/v1/waitpoints?cursor=nope",
        "/v1/waitpoints?limit=0",
        "/v1/waitpoints?colour=red",
    ] {
        let (status, body) = api.get(bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    let (status, _) = api.get("/v1/waitpoints/no-such-waitpoint").await;
    assert_eq!(status, 404);

    // Refusals: an unknown id and a wrong token alike; another waitpoint's token; configured
    // tokens of small roles; no token.
    let (s1, unknown) = complete(
        &api,
        "no-such-waitpoint",
        By::Header(a.token(0)),
        b"x".to_vec(),
    )
    .await;
    let (s2, wrong) = complete(&api, a.id(0), By::Header(&mint()), b"x".to_vec()).await;
    assert_eq!((s1, s2), (401, 401));
    assert_eq!(
        unknown, wrong,
        "one answer for an unknown id and a wrong token"
    );
    let (status, body) = complete(&api, a.id(0), By::Query(b.token(0)), b"x".to_vec()).await;
    assert_eq!(status, 401, "another waitpoint's token: {body}");
    let (status, body) = complete(&api, a.id(1), By::Header(a.token(0)), b"x".to_vec()).await;
    assert_eq!(status, 401, "a sibling's token: {body}");
    for small in [READER, PRODUCER] {
        let (status, body) = complete(&api, a.id(0), By::Header(small), b"x".to_vec()).await;
        assert_eq!(status, 403, "{body}");
    }
    let (status, _) = complete(&api, a.id(0), By::Nothing, b"x".to_vec()).await;
    assert_eq!(status, 401);
    assert_eq!(
        waitpoint(&api, a.id(0)).await["state"],
        "pending",
        "nothing changed"
    );

    // The waitpoint's token in the header completes it; its dispatch resumes.
    let (status, body) = complete(
        &api,
        a.id(0),
        By::Header(a.token(0)),
        br#"{"ok": 1}"#.to_vec(),
    )
    .await;
    assert_eq!(
        (status, body.clone()),
        (200, json!({ "state": "completed" })),
        "{body}"
    );
    let done = waitpoint(&api, a.id(0)).await;
    seen.push_str(&done.to_string());
    assert_eq!(done["state"], "completed");
    assert_eq!(done["result"], r#"{"ok": 1}"#);
    assert_eq!(done["settled_by"], "token");
    let d = dispatch(&api, &a.dispatch).await;
    assert_eq!(
        (d["status"].as_str(), d["resumes"].as_u64()),
        (Some("queued"), Some(1)),
        "{d}"
    );
    // A second completion: 409 with the first one's time.
    let (status, again) = complete(&api, a.id(0), By::Header(a.token(0)), b"late".to_vec()).await;
    assert_eq!(status, 409, "{again}");
    assert_eq!(again["state"], "completed");
    assert_eq!(again["settled_at"], done["settled_at"]);
    assert_eq!(
        waitpoint(&api, a.id(0)).await["result"],
        r#"{"ok": 1}"#,
        "the first result stays"
    );

    // `?token=` completes too, as the callback URL does; binary results come back as base64.
    let (status, body) = complete(&api, b.id(0), By::Query(b.token(0)), vec![0xff, 0x00]).await;
    assert_eq!(status, 200, "{body}");
    let done = waitpoint(&api, b.id(0)).await;
    assert_eq!(done["result"]["base64"], "/wA=", "{done}");
    assert_eq!(dispatch(&api, &b.dispatch).await["resumes"], 1);
    // A reader's bearer beside the right `?token=`: the waitpoint's token decides.
    let (status, body) = complete(
        &api,
        a.id(1),
        By::Both {
            header: READER,
            query: a.token(1),
        },
        b"both".to_vec(),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // An operator's token completes any waitpoint.
    let (status, body) = complete(&api, c.id(0), By::Header(OPERATOR), b"by hand".to_vec()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        waitpoint(&api, c.id(0)).await["settled_by"],
        "operator:operator"
    );
    let (status, body) =
        complete(&api, "no-such-waitpoint", By::Header(OPERATOR), Vec::new()).await;
    assert_eq!(status, 404, "an operator is told it does not exist: {body}");

    // Past its timeout it is timed out, not completed.
    let timeout_at = waitpoint(&api, late.id(0)).await["timeout_at"]
        .as_u64()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while seeder.store.now() <= timeout_at {
        assert!(
            Instant::now() < deadline,
            "the clock does not pass {timeout_at}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (status, body) = complete(&api, late.id(0), By::Header(late.token(0)), b"x".to_vec()).await;
    assert_eq!(
        (status, body["state"].as_str()),
        (409, Some("timed_out")),
        "{body}"
    );
    assert!(body["settled_at"].as_u64().is_some(), "{body}");
    let d = dispatch(&api, &late.dispatch).await;
    assert_eq!(
        (d["status"].as_str(), d["resumes"].as_u64()),
        (Some("queued"), Some(1)),
        "{d}"
    );

    // Over [host] max_payload (64 KiB): 413, and nothing changes; over max_body too.
    for size in [65 * 1024, 300 * 1024] {
        let (status, body) =
            complete(&api, e.id(0), By::Header(e.token(0)), vec![b'x'; size]).await;
        assert_eq!(
            (status, body["field"].as_str()),
            (413, Some("body")),
            "{size}: {body}"
        );
    }
    assert_eq!(waitpoint(&api, e.id(0)).await["state"], "pending");

    // Cancel: an operator's; 409 once settled; 404 for an unknown id.
    let path = format!("/v1/waitpoints/{}/cancel", e.id(0));
    let (status, _) = api.post(&path, PRODUCER, json!({})).await;
    assert_eq!(status, 403);
    let (status, body) = api.post(&path, OPERATOR, json!({})).await;
    assert_eq!(
        (status, body["state"].as_str()),
        (200, Some("cancelled")),
        "{body}"
    );
    assert_eq!(body["settled_by"], "operator:operator");
    seen.push_str(&body.to_string());
    let (status, body) = api.post(&path, OPERATOR, json!({})).await;
    assert_eq!(
        (status, body["state"].as_str()),
        (409, Some("cancelled")),
        "{body}"
    );
    let (status, _) = api
        .post(
            "/v1/waitpoints/no-such-waitpoint/cancel",
            OPERATOR,
            json!({}),
        )
        .await;
    assert_eq!(status, 404);
    assert_eq!(dispatch(&api, &e.dispatch).await["status"], "queued");
    let (status, body) = complete(&api, e.id(0), By::Header(e.token(0)), b"x".to_vec()).await;
    assert_eq!(
        (status, body["state"].as_str()),
        (409, Some("cancelled")),
        "{body}"
    );

    // What is left pending, and the states the list filters by.
    let (_, pending) = api.get("/v1/waitpoints?state=pending").await;
    assert_eq!(pending["waitpoints"], json!([]), "{pending}");
    let (_, completed) = api.get("/v1/waitpoints?state=completed").await;
    seen.push_str(&completed.to_string());
    assert_eq!(
        completed["waitpoints"].as_array().unwrap().len(),
        4,
        "{completed}"
    );
    let (_, timed_out) = api.get("/v1/waitpoints?state=timed_out").await;
    assert_eq!(
        ids(timed_out["waitpoints"].as_array().unwrap()),
        vec![late.id(0)]
    );

    // The settlements this host's API made are counted (the timeout is the store's or the
    // sweeper's, counted or not depending on which got there first).
    let m = api.metrics().await;
    let settled = |state| {
        sample(
            &m,
            "homing_waitpoints_settled_total",
            &[("agent", AGENT), ("state", state)],
        )
    };
    assert_eq!((settled("completed"), settled("cancelled")), (4.0, 1.0));

    // No token, and no digest of one, is in any answer or in the log.
    let log = api.log();
    for token in &all_tokens {
        assert!(!seen.contains(token.as_str()), "a token in an answer");
        assert!(
            !seen.contains(&token_digest(token)),
            "a digest in an answer"
        );
        assert!(!log.contains(token.as_str()), "a token in the log:\n{log}");
    }
    assert!(
        !log.contains("token=hwp_"),
        "a query string in the log:\n{log}"
    );
    assert!(log.contains("waitpoint completed through the API"), "{log}");
}

/// Wrong waitpoint tokens count toward the address's invalid-token limit with the bearer
/// check's: past it they are answered 429, and a right token still completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_waitpoint_tokens_are_throttled_but_a_right_one_passes() {
    let api = Api::start_with(config, |_| {}).await;
    let seeder = Seeder::open(api.env.path());
    let s = seeder.waiting("wp-t", &[("approve", 600_000, &[])]).await;
    let mut limited = None;
    for attempt in 0..40 {
        // A reader's bearer beside a wrong `?token=` is a wrong token too, counted.
        let guess = mint();
        let by = if attempt % 3 == 0 {
            By::Both {
                header: READER,
                query: &guess,
            }
        } else {
            By::Query(&guess)
        };
        let (status, body) = complete(&api, s.id(0), by, Vec::new()).await;
        match status {
            401 => {}
            429 => {
                limited = Some(attempt);
                break;
            }
            other => panic!("attempt {attempt}: {other} {body}"),
        }
    }
    assert_eq!(
        limited,
        Some(30),
        "30 wrong tokens a minute are answered 401, then 429"
    );
    // The bearer check of other routes counts the same failures.
    let (status, _) = api.get("/v1/agents").await;
    assert_eq!(status, 200, "a right bearer passes");
    let response = reqwest::Client::new()
        .get(api.url("/v1/agents"))
        .bearer_auth("wrong-token-0123456789abcdef")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 429);
    let (status, body) = complete(&api, s.id(0), By::Header(s.token(0)), b"yes".to_vec()).await;
    assert_eq!(status, 200, "the right token passes: {body}");
}

/// `homing waitpoint ...` on the store of a running host, and `--status waiting`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_lists_shows_completes_and_cancels_waitpoints() {
    let api = Api::start_with(config, |_| {}).await;
    let env = &api.env;
    let seeder = Seeder::open(env.path());
    let meta: &[(&str, &str)] = &[("question", "deploy\u{1b}[2J now?")];
    let a = seeder.waiting("cli-a", &[("approve", 600_000, meta)]).await;
    let b = seeder.waiting("cli-b", &[("approve", 600_000, &[])]).await;
    let code = |args: &[&str]| env.homing(args).status.code();

    // Lists.
    let listed: Vec<Value> =
        serde_json::from_str(&env.ok(&["waitpoint", "list", "--state", "pending", "--json"]))
            .unwrap();
    assert_eq!(ids(&listed), vec![a.id(0), b.id(0)]);
    assert!(listed[0].get("token_digests").is_none());
    let table = env.ok(&["waitpoint", "list", "--thread", "cli-b"]);
    assert!(
        table.contains(b.id(0)) && !table.contains(a.id(0)),
        "{table}"
    );
    let first = env.ok(&["waitpoint", "list", "--limit", "1"]);
    let after = first
        .lines()
        .find_map(|l| l.strip_prefix("next page: --after "))
        .unwrap_or_else(|| panic!("no next page: {first}"))
        .to_owned();
    let second = env.ok(&["waitpoint", "list", "--limit", "1", "--after", &after]);
    assert!(
        second.contains(b.id(0)) && !second.contains(a.id(0)),
        "{second}"
    );
    assert_eq!(code(&["waitpoint", "list", "--state", "done"]), Some(2));
    let waiting: Vec<Value> =
        serde_json::from_str(&env.ok(&["dispatch", "list", "--status", "waiting", "--json"]))
            .unwrap();
    assert_eq!(waiting.len(), 2);
    let counts = env.ok(&["dispatch", "counts"]);
    assert!(
        counts
            .lines()
            .any(|l| l.contains(AGENT) && l.contains("waiting") && l.trim_end().ends_with('2')),
        "{counts}"
    );

    // Shows, control characters escaped; the dispatch names its waitpoints.
    let shown = env.ok(&["waitpoint", "show", a.id(0)]);
    assert!(shown.contains("state:        pending"), "{shown}");
    assert!(
        shown.contains("question=deploy") && !shown.contains('\u{1b}'),
        "{shown}"
    );
    let json: Value =
        serde_json::from_str(&env.ok(&["waitpoint", "show", a.id(0), "--json"])).unwrap();
    assert_eq!(json["metadata"]["question"], "deploy\u{1b}[2J now?");
    assert!(json.get("token_digests").is_none(), "{json}");
    let d = env.ok(&["dispatch", "show", &a.dispatch]);
    assert!(
        d.contains("status:       waiting") && d.contains(a.id(0)),
        "{d}"
    );
    let d = env.show(&a.dispatch);
    assert_eq!(d["waitpoints"][0]["id"].as_str(), Some(a.id(0)), "{d}");
    assert_eq!(code(&["waitpoint", "show", "nope"]), Some(3));

    // Completes, as `cli`; a second time exits 1 naming the state; an unknown id exits 3.
    let out = env.ok(&["waitpoint", "complete", a.id(0), "--payload", "yes"]);
    assert_eq!(out, format!("{} completed", a.id(0)));
    let w = waitpoint(&api, a.id(0)).await;
    assert_eq!(
        (
            w["state"].as_str(),
            w["result"].as_str(),
            w["settled_by"].as_str()
        ),
        (Some("completed"), Some("yes"), Some("cli"))
    );
    let d = dispatch(&api, &a.dispatch).await;
    assert_eq!(
        (d["status"].as_str(), d["resumes"].as_u64()),
        (Some("queued"), Some(1)),
        "{d}"
    );
    let out = env.homing(&["waitpoint", "complete", a.id(0), "--payload", "again"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is completed"), "{err}");
    assert_eq!(
        code(&["waitpoint", "complete", "nope", "--payload", "x"]),
        Some(3)
    );
    // A result over [host] max_payload exits 2 and changes nothing.
    let big = env.path().join("big");
    std::fs::write(&big, vec![b'x'; 65 * 1024]).unwrap();
    let out = env.homing(&[
        "waitpoint",
        "complete",
        b.id(0),
        "--payload-file",
        big.to_str().unwrap(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(waitpoint(&api, b.id(0)).await["state"], "pending");

    // Cancels; a second time exits 1 naming the state.
    let out = env.ok(&["waitpoint", "cancel", b.id(0)]);
    assert_eq!(out, format!("{} cancelled", b.id(0)));
    let w = waitpoint(&api, b.id(0)).await;
    assert_eq!(
        (w["state"].as_str(), w["settled_by"].as_str()),
        (Some("cancelled"), Some("cli"))
    );
    let out = env.homing(&["waitpoint", "cancel", b.id(0)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is cancelled"));
    assert_eq!(code(&["waitpoint", "cancel", "nope"]), Some(3));
    assert_eq!(dispatch(&api, &b.dispatch).await["status"], "queued");
    let none: Vec<Value> =
        serde_json::from_str(&env.ok(&["dispatch", "list", "--status", "waiting", "--json"]))
            .unwrap();
    assert!(none.is_empty());
}

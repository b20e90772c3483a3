//! The dashboard in a real browser: a real `homing run` with `[api]` on the embedded store,
//! seeded through the API, and a headless Chromium (see `browser`) logging in and clicking.
//! The overview's counts match the store's; filters narrow the list; a dead letter retried from
//! its page is queued again and acked once the host runs it; a queued dispatch is cancelled; a
//! thread interrupted; dead letters selected and retried; a `<script>` payload shows as text
//! and opens no dialog. The refusals: pages without a session go to the login page; a wrong
//! token, a post without the CSRF token or from another origin, and a reader's post are
//! refused and change nothing; failed logins are rate-limited. A producer sends a message from
//! a thread's page (listed as pending, stored, escaped); a reader has no send box and its post
//! is refused; sends the host refuses come back saying why. An operator approves and rejects
//! waitpoints on the Waiting page, where their metadata shows as text; a reader has no buttons
//! and its decision is refused. Each test saves screenshots
//! under `<target>/dashboard-screenshots/` (and `docs/dashboard/` with
//! `HOMING_DASHBOARD_DOCS=1`).

use std::time::{Duration, Instant};

use fantoccini::Locator;
use fantoccini::key::Key;
use reqwest::header;
use serde_json::{Value, json};

use crate::api::{Api, OPERATOR, PRODUCER, READER, TOKENS};
use crate::browser::Browser;
use crate::common::{guest, toml_path};

fn config(port: u16) -> String {
    format!(
        r#"
[host]
lease = "5s"
sweep_interval = "200ms"
shutdown_grace = "2s"
max_message = "2KiB"
max_inbox = 4

[api]
listen = "127.0.0.1:{port}"
request_timeout = "10s"
{TOKENS}

[plugins.echo]
path = {echo}

[plugins.sandbox]
path = {sandbox}
max_attempts = 1
dirs = [{{ host = "data", guest = "/data" }}]

[plugins.flaky]
path = {flaky}
max_attempts = 3
retry = {{ initial = "1h", max = "1h" }}
"#,
        echo = toml_path(&guest("echo")),
        sandbox = toml_path(&guest("sandbox")),
        flaky = toml_path(&guest("flaky")),
    )
}

async fn start() -> Api {
    Api::start_with(config, |dir| {
        std::fs::create_dir_all(dir.join("data")).unwrap()
    })
    .await
}

/// Polls the API until dispatch `id` satisfies `ok`.
async fn wait_api(api: &Api, id: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, d) = api.get(&format!("/v1/dispatches/{id}")).await;
        assert_eq!(status, 200, "{d}");
        if ok(&d) {
            return d;
        }
        assert!(Instant::now() < deadline, "{what}: {d}\n{}", api.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn queue_counts(api: &Api) -> Value {
    let (status, agents) = api.get("/v1/agents").await;
    assert_eq!(status, 200);
    let mut out = serde_json::Map::new();
    for a in agents["agents"].as_array().unwrap() {
        out.insert(a["name"].as_str().unwrap().to_owned(), a["queue"].clone());
    }
    Value::Object(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_show_what_the_store_holds_and_escape_it() {
    let api = start().await;
    let mut chat = Vec::new();
    for n in 1..=3 {
        let id = api
            .enqueue(
                json!({ "agent": "echo", "thread": "chat-1", "payload": format!("hello {n}") }),
            )
            .await;
        chat.push(id);
    }
    let json_id = api
        .enqueue(json!({ "agent": "echo", "thread": "later", "payload": "{\"q\":\"what\",\"n\":[1,2]}", "delay": "1h", "metadata": { "team": "ops" } }))
        .await;
    api.enqueue(json!({ "agent": "echo", "thread": "later", "payload": "second", "delay": "1h" }))
        .await;
    let journal = api
        .enqueue(json!({ "agent": "sandbox", "thread": "journal", "payload": "journal:0" }))
        .await;
    let dead = api
        .enqueue(json!({ "agent": "sandbox", "thread": "dead-1", "payload": "panic" }))
        .await;
    let flaky = api
        .enqueue(json!({ "agent": "flaky", "thread": "flaky-1", "payload": "fail-until:2" }))
        .await;
    let xss = api
        .enqueue(
            json!({ "agent": "echo", "thread": "xss", "payload": "<script>alert(1)</script>" }),
        )
        .await;
    for id in chat.iter().chain([&journal, &dead, &xss]) {
        api.wait_terminal(id).await;
    }
    wait_api(&api, &flaky, "flaky waits for its retry", |d| {
        d["status"] == "queued" && d["attempts"] == 1
    })
    .await;

    let browser = Browser::start(1280, 900).await;
    browser.login(&api.base, OPERATOR).await;

    // The overview's counts are the store's.
    browser
        .wait_text(
            "#agents tr[data-agent='echo'] td[data-col='acked']",
            "acked count",
            |t| t == "4",
        )
        .await;
    let store = queue_counts(&api).await;
    for agent in ["echo", "sandbox", "flaky"] {
        for status in ["queued", "claimed", "waiting", "dead_letter", "acked"] {
            let shown = browser
                .text(&format!(
                    "#agents tr[data-agent='{agent}'] td[data-col='{status}']"
                ))
                .await
                .unwrap();
            assert_eq!(shown, store[agent][status].to_string(), "{agent} {status}");
        }
    }
    assert_eq!(store["echo"]["queued"], 2);
    assert_eq!(store["sandbox"]["dead_letter"], 1);
    let retrying = browser
        .text("#agents tr[data-agent='flaky'] td[data-col='retrying']")
        .await;
    assert_eq!(retrying.as_deref(), Some("1"));
    assert!(
        browser.count("#hosts li").await >= 1,
        "the overview names this host"
    );
    browser.screenshot("overview").await;

    // The list, then narrowed by the filter form.
    browser.goto(&api.url("/dispatches")).await;
    assert_eq!(browser.count("tr[data-id]").await, 9);
    browser
        .client
        .find(Locator::Css("select[name=agent]"))
        .await
        .unwrap()
        .select_by_value("echo")
        .await
        .unwrap();
    browser
        .client
        .find(Locator::Css("select[name=status]"))
        .await
        .unwrap()
        .select_by_value("queued")
        .await
        .unwrap();
    browser.click("form.filters button[type=submit]").await;
    browser.wait_path("/dispatches?agent=echo").await;
    let ids: Vec<String> = {
        let mut ids = Vec::new();
        for row in browser
            .client
            .find_all(Locator::Css("tr[data-id]"))
            .await
            .unwrap()
        {
            ids.push(row.attr("data-id").await.unwrap().unwrap());
        }
        ids
    };
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(ids.contains(&json_id));
    browser.screenshot("dispatches").await;
    // By keyboard: a skip link comes first; Enter in a filter field submits the filters.
    browser.goto(&api.url("/dispatches")).await;
    let first = browser
        .eval("return document.querySelector('a[href], button, input, select').className")
        .await;
    assert_eq!(first, "skip");
    browser
        .type_into("input[name=thread]", &format!("chat-1{}", Key::Enter))
        .await;
    browser
        .wait_path("/dispatches?agent=&status=&thread=chat-1")
        .await;
    assert_eq!(browser.count("tr[data-id]").await, 3);
    browser
        .goto(&api.url(&format!("/dispatches?id={dead}")))
        .await;
    assert_eq!(browser.count("tr[data-id]").await, 1);
    browser.goto(&api.url("/dispatches?order=newest")).await;
    let first = browser
        .client
        .find(Locator::Css("tr[data-id]"))
        .await
        .unwrap()
        .attr("data-id")
        .await
        .unwrap();
    assert_eq!(first.as_deref(), Some(xss.as_str()), "newest first");

    // A JSON payload shows pretty-printed, with its metadata and a link to its thread.
    browser
        .goto(&api.url(&format!("/dispatches/{json_id}")))
        .await;
    let payload = browser.text("#payload").await.unwrap();
    assert!(payload.contains("\"q\": \"what\""), "{payload}");
    assert_eq!(browser.text("#metadata dd").await.as_deref(), Some("ops"));
    assert_eq!(
        browser.count("#cancel").await,
        1,
        "a queued one can be cancelled"
    );
    assert_eq!(browser.count("#retry").await, 0, "but not retried");
    browser.screenshot("dispatch").await;

    // A script payload is text: shown as written, run never.
    browser.goto(&api.url(&format!("/dispatches/{xss}"))).await;
    assert_eq!(
        browser.text("#payload").await.as_deref(),
        Some("<script>alert(1)</script>")
    );
    assert_eq!(
        browser.text("#result").await.as_deref(),
        Some("<script>alert(1)</script>")
    );
    assert_eq!(
        browser
            .eval("return document.querySelectorAll('main script').length")
            .await,
        0
    );
    assert!(
        browser.client.get_alert_text().await.is_err(),
        "a dialog opened"
    );
    browser.screenshot("escaped").await;

    // The thread page shows the log the sandbox wrote.
    browser.goto(&api.url("/threads/journal")).await;
    let log = browser
        .wait_text("#log tbody", "the journal entries", |t| t.contains("end"))
        .await;
    assert!(log.contains(&format!("start {journal}")), "{log}");
    assert_eq!(browser.count("tr[data-id]").await, 1);
    browser.screenshot("thread").await;

    browser.goto(&api.url("/dead-letters")).await;
    assert_eq!(browser.count("tr[data-id]").await, 1);
    browser.screenshot("dead-letters").await;

    // Agents: grants by name, the component's hash.
    browser.goto(&api.url("/agents")).await;
    let sandbox = browser.text("section[data-agent='sandbox']").await.unwrap();
    assert!(sandbox.contains("/data (read-only)"), "{sandbox}");
    let hash = browser
        .text("section[data-agent='echo'] dd.mono")
        .await
        .unwrap();
    assert!(
        hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
        "{hash}"
    );
    browser.screenshot("agents").await;

    // A debounce window's page: its state, how many it holds, each item escaped.
    let window = json!({ "key": "burst", "quiet": "1h", "max_wait": "2h", "payload": "collect" });
    let mut joined = Vec::new();
    for item in ["first", "<b>second</b>"] {
        joined.push(
            api.enqueue(
                json!({ "agent": "echo", "thread": "win", "payload": item, "debounce": window }),
            )
            .await,
        );
    }
    assert_eq!(joined[0], joined[1], "one window");
    browser
        .goto(&api.url(&format!("/dispatches/{}", joined[0])))
        .await;
    let count = browser.text("#window-count").await.unwrap();
    assert_eq!(count, "2 of at most 100 (collect)");
    let state = browser.text("#window-state").await.unwrap();
    assert!(state.starts_with("open"), "{state}");
    assert_eq!(
        browser.text("#item-2").await.as_deref(),
        Some("<b>second</b>")
    );
    assert_eq!(
        browser.count("#window-items b").await,
        0,
        "an item is text, never markup"
    );
    browser.screenshot("dispatch-window").await;

    // A narrow screen: nothing wider than the window but the tables' own scrollers.
    browser.client.set_window_size(390, 844).await.unwrap();
    browser.goto(&api.url("/")).await;
    let fits = browser
        .eval("return document.documentElement.scrollWidth <= window.innerWidth")
        .await;
    assert_eq!(fits, true);
    browser.screenshot("overview-narrow").await;
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_retries_cancels_and_interrupts() {
    let api = start().await;
    let dead = api
        .enqueue(json!({ "agent": "sandbox", "thread": "dl", "payload": "read-file:/data/ready" }))
        .await;
    let d = api.wait_terminal(&dead).await;
    assert_eq!(d["status"], "dead_letter", "{d}");
    let queued = api
        .enqueue(json!({ "agent": "echo", "thread": "c1", "payload": "x", "delay": "1h" }))
        .await;
    let running = api
        .enqueue(json!({ "agent": "echo", "thread": "i1", "payload": "y", "delay": "1h" }))
        .await;

    let browser = Browser::start(1280, 900).await;
    browser.login(&api.base, OPERATOR).await;

    // Retry a dead letter from its page: a new dispatch, queued, then acked by the host.
    browser.goto(&api.url(&format!("/dispatches/{dead}"))).await;
    assert_eq!(browser.count("#cancel").await, 0);
    std::fs::write(api.env.path().join("data").join("ready"), "ready").unwrap();
    browser.click("#retry").await;
    // The dead letter's own page is under /dispatches/ too: wait for the redirect's notice.
    browser.wait_path_with("notice=retried").await;
    let path = browser.path().await;
    assert!(
        !path.contains(&dead) && path.contains("notice=retried"),
        "{path}"
    );
    let new = path
        .trim_start_matches("/dispatches/")
        .split('?')
        .next()
        .unwrap()
        .to_owned();
    let d = wait_api(&api, &new, "the retry is stored", |_| true).await;
    assert_eq!(d["metadata"]["retry-of"], dead.as_str(), "{d}");
    browser
        .wait_text("#status", "the retried dispatch is acked", |t| {
            t.starts_with("acked")
        })
        .await;
    let d = api.wait_terminal(&new).await;
    assert_eq!(
        (d["status"].as_str(), d["result"]["output"].as_str()),
        (Some("acked"), Some("ready")),
        "{d}"
    );
    browser.screenshot("retried").await;

    // Cancel a queued one.
    browser
        .goto(&api.url(&format!("/dispatches/{queued}")))
        .await;
    browser.click("#cancel").await;
    browser
        .wait_text("#status", "cancelled", |t| t.starts_with("cancelled"))
        .await;
    assert_eq!(browser.count("#cancel").await, 0);
    assert_eq!(
        browser.count("#retry").await,
        1,
        "a cancelled one can be retried"
    );
    let d = wait_api(&api, &queued, "cancelled", |d| d["status"] != "queued").await;
    assert_eq!(d["status"], "cancelled");
    browser.screenshot("cancelled").await;

    // Interrupt a thread: its queued work is superseded, its epoch moves on.
    browser.goto(&api.url("/threads/i1")).await;
    assert_eq!(browser.text("#epoch").await.as_deref(), Some("0"));
    browser.click("#interrupt").await;
    browser.wait_path("/threads/i1?notice=interrupted").await;
    assert_eq!(browser.text("#epoch").await.as_deref(), Some("1"));
    let d = wait_api(&api, &running, "superseded", |d| d["status"] != "queued").await;
    assert_eq!(d["status"], "superseded", "{d}");
    browser.screenshot("interrupted").await;

    // Select every dead letter and retry them at once.
    for thread in ["dl-a", "dl-b"] {
        let id = api
            .enqueue(json!({ "agent": "sandbox", "thread": thread, "payload": "panic" }))
            .await;
        api.wait_terminal(&id).await;
    }
    browser.goto(&api.url("/dead-letters")).await;
    assert_eq!(browser.count("input[name=id]").await, 3);
    browser.click("#select-all").await;
    assert_eq!(browser.count("input[name=id]:checked").await, 3);
    browser.click("#retry-selected").await;
    browser.wait_path("/dead-letters?notice=retried-n").await;
    assert_eq!(
        browser.text("p.notice").await.as_deref(),
        Some("Retried 3 dead letter(s).")
    );
    let (_, list) = api.get("/v1/dispatches?limit=1000").await;
    let retries = list["dispatches"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["metadata"]["retry-of"].is_string())
        .count();
    assert_eq!(retries, 4, "the first retry and these three");
    browser.close().await;
}

/// A client that follows no redirect, keeps no cookies.
pub(crate) fn raw_client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .pool_idle_timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// Logs in with `token`: the session cookie (`name=value`) and the session's CSRF token.
pub(crate) async fn session(api: &Api, client: &reqwest::Client, token: &str) -> (String, String) {
    let r = client
        .post(api.url("/login"))
        .form(&[("token", token), ("next", "/dead-letters")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()[header::LOCATION], "/dead-letters");
    let set = r.headers()[header::SET_COOKIE].to_str().unwrap().to_owned();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict") && !set.contains(token),
        "{set}"
    );
    let cookie = set.split(';').next().unwrap().to_owned();
    let page = client
        .get(api.url("/"))
        .header(header::COOKIE, &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let body = page.text().await.unwrap();
    let csrf = body
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned();
    (cookie, csrf)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_change_nothing() {
    let api = start().await;
    let queued = api
        .enqueue(json!({ "agent": "echo", "thread": "q", "payload": "x", "delay": "1h" }))
        .await;
    let dead = api
        .enqueue(json!({ "agent": "sandbox", "thread": "d", "payload": "panic" }))
        .await;
    api.wait_terminal(&dead).await;

    // Without a session, every page goes to the login page, which comes back after.
    let browser = Browser::start(1280, 900).await;
    browser
        .goto(&api.url(&format!("/dispatches/{queued}")))
        .await;
    let path = browser.wait_path("/login?next=").await;
    assert!(path.contains(&queued), "{path}");
    browser.type_into("#token", "not-a-token-0123456789").await;
    browser
        .click("form[action='/login'] button[type=submit]")
        .await;
    browser
        .wait_text("p.notice.error", "a wrong token is refused", |t| {
            t == "That token is not valid."
        })
        .await;
    browser.screenshot("login").await;
    // A reader logs in, lands on the page it asked for, and sees no action.
    browser.type_into("#token", READER).await;
    browser
        .click("form[action='/login'] button[type=submit]")
        .await;
    browser.wait_path(&format!("/dispatches/{queued}")).await;
    browser
        .wait_text("#status", "the reader sees the dispatch", |t| {
            t.starts_with("queued")
        })
        .await;
    assert_eq!(browser.count("main form[method=post]").await, 0);
    browser.goto(&api.url("/dead-letters")).await;
    assert_eq!(browser.count("tr[data-id]").await, 1);
    assert_eq!(browser.count("input[type=checkbox]").await, 0);
    browser.goto(&api.url("/threads/q")).await;
    assert_eq!(browser.count("#interrupt").await, 0);
    browser.screenshot("reader").await;
    browser.close().await;

    let client = raw_client();
    let get = |path: &str, cookie: Option<&str>| {
        let mut r = client.get(api.url(path));
        if let Some(cookie) = cookie {
            r = r.header(header::COOKIE, cookie);
        }
        r.send()
    };
    let r = get("/dead-letters?agent=echo", None).await.unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(
        r.headers()[header::LOCATION],
        "/login?next=%2Fdead-letters%3Fagent%3Decho"
    );
    let r = get(
        "/dispatches",
        Some("homing_session=0000000000000000000000000000000000000000000000000000000000000000"),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 303, "an unknown session is no session");

    let (cookie, csrf) = session(&api, &client, OPERATOR).await;
    let r = get(&format!("/dispatches/{queued}"), Some(&cookie))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let h = r.headers();
    let csp = h["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("script-src 'self'")
            && csp.contains("frame-ancestors 'none'")
            && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    assert_eq!(h["x-frame-options"], "DENY");
    assert_eq!(h["cache-control"], "no-store");
    let body = r.text().await.unwrap();
    assert!(!body.contains(OPERATOR) && !body.contains("<script>alert"));

    let post =
        |path: String, cookie: &str, form: Vec<(&'static str, String)>, origin: Option<&str>| {
            let mut r = client
                .post(api.url(&path))
                .header(header::COOKIE, cookie)
                .form(&form);
            if let Some(origin) = origin {
                r = r.header(header::ORIGIN, origin);
            }
            r.send()
        };
    let cancel = format!("/dispatches/{queued}/cancel");
    let origin = api.base.clone();
    for (form, from, why) in [
        (vec![], Some(origin.as_str()), "no CSRF token"),
        (
            vec![("csrf", "0".repeat(64))],
            Some(origin.as_str()),
            "a wrong CSRF token",
        ),
        (
            vec![("csrf", csrf.clone())],
            Some("http://evil.example"),
            "another origin",
        ),
    ] {
        let r = post(cancel.clone(), &cookie, form, from).await.unwrap();
        assert_eq!(r.status(), 403, "{why}");
    }
    let r = client
        .post(api.url(&cancel))
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "no session");
    let (reader, reader_csrf) = session(&api, &client, READER).await;
    let r = post(
        cancel.clone(),
        &reader,
        vec![("csrf", reader_csrf.clone())],
        Some(&origin),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 403, "a reader's post");
    let r = post(
        format!("/dispatches/{dead}/retry"),
        &reader,
        vec![("csrf", reader_csrf)],
        None,
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 403, "a reader's retry");
    let (_, d) = api.get(&format!("/v1/dispatches/{queued}")).await;
    assert_eq!(d["status"], "queued", "nothing refused changed it");
    let (_, list) = api.get("/v1/dispatches?status=queued").await;
    assert_eq!(
        list["dispatches"].as_array().unwrap().len(),
        1,
        "nothing was retried"
    );

    // The operator's own post goes through; a second cancel finds it in the wrong state.
    for expected in [303, 409] {
        let r = post(
            cancel.clone(),
            &cookie,
            vec![("csrf", csrf.clone())],
            Some(&origin),
        )
        .await
        .unwrap();
        assert_eq!(r.status(), expected);
        let (_, d) = api.get(&format!("/v1/dispatches/{queued}")).await;
        assert_eq!(d["status"], "cancelled");
    }
    // Logging out ends the session.
    let r = post(
        "/logout".into(),
        &cookie,
        vec![("csrf", csrf)],
        Some(&origin),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 303);
    let r = get("/", Some(&cookie)).await.unwrap();
    assert_eq!(r.status(), 303);

    // Failed logins are limited per address: after 30 in a minute (the browser's wrong token
    // was the first), a wrong token is 429; a right one still logs in.
    let mut refused = 0;
    for _ in 0..40 {
        let r = client
            .post(api.url("/login"))
            .form(&[("token", "wrong-token-0123456789abcdef")])
            .send()
            .await
            .unwrap();
        match r.status().as_u16() {
            401 => refused += 1,
            429 => break,
            other => panic!("login answered {other}"),
        }
    }
    assert_eq!(refused, 29);
    let r = client
        .post(api.url("/login"))
        .form(&[("token", PRODUCER)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303, "a right token always logs in");

    let log = api.log();
    for secret in [READER, PRODUCER, OPERATOR] {
        assert!(!log.contains(secret), "a token reached the log");
    }
    assert!(log.contains("dashboard action refused"), "{log}");
}

/// Sends the thread page's send box as the raw client would: `303` and where it goes back to.
async fn send_form(
    api: &Api,
    client: &reqwest::Client,
    cookie: &str,
    thread: &str,
    form: &[(&str, &str)],
) -> (u16, String) {
    let r = client
        .post(api.url(&format!("/threads/{thread}/messages")))
        .header(header::COOKIE, cookie)
        .header(header::ORIGIN, &api.base)
        .form(form)
        .send()
        .await
        .unwrap();
    let location = r
        .headers()
        .get(header::LOCATION)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (r.status().as_u16(), location)
}

async fn pending_messages(api: &Api, thread: &str) -> Vec<Value> {
    let (status, page) = api
        .get(&format!("/v1/threads/{thread}/messages?state=pending"))
        .await;
    assert_eq!(status, 200, "{page}");
    page["messages"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_sends_a_message_from_the_thread_page() {
    let api = start().await;
    // Queued for later: the thread has live work, so a message stays pending, and no run
    // holds it, so a steer waits for the next one.
    api.enqueue(json!({ "agent": "echo", "thread": "talk", "payload": "x", "delay": "1h" }))
        .await;

    let browser = Browser::start(1280, 900).await;
    browser.login(&api.base, PRODUCER).await;
    browser.goto(&api.url("/threads/talk")).await;
    assert_eq!(
        browser.count("#interrupt").await,
        0,
        "a producer cannot interrupt"
    );
    assert_eq!(browser.count("#send").await, 1, "but it can send");
    assert_eq!(browser.text("#inbox-pending").await.as_deref(), Some("0"));
    let text = "<b>bold</b> & <script>alert(1)</script>";
    browser.type_into("#send-text", text).await;
    browser
        .client
        .find(Locator::Css("select[name=kind]"))
        .await
        .unwrap()
        .select_by_value("steer")
        .await
        .unwrap();
    browser.click("#send-submit").await;
    browser.wait_path("/threads/talk?notice=sent&n=1").await;
    assert_eq!(
        browser.text("p.notice").await.as_deref(),
        Some("Message 1 sent: it is pending.")
    );
    assert_eq!(browser.text("#inbox-pending").await.as_deref(), Some("1"));
    let row = "#messages tr[data-message='1']";
    assert_eq!(
        browser.text(&format!("{row} pre")).await.as_deref(),
        Some(text),
        "shown as written"
    );
    let shown = browser.text(row).await.unwrap();
    assert!(
        shown.contains("steer")
            && shown.contains("waiting for the next run")
            && shown.contains("dashboard:producer"),
        "{shown}"
    );
    assert_eq!(
        browser
            .eval("return document.querySelectorAll('main script, main b').length")
            .await,
        0,
        "the text made no element"
    );
    assert!(
        browser.client.get_alert_text().await.is_err(),
        "a dialog opened"
    );
    browser.screenshot("thread-messages").await;
    // A follow-up to the same agent, by the agent select.
    browser.type_into("#send-text", "and then?").await;
    browser
        .client
        .find(Locator::Css("select[name=agent]"))
        .await
        .unwrap()
        .select_by_value("echo")
        .await
        .unwrap();
    browser.click("#send-submit").await;
    browser.wait_path("/threads/talk?notice=sent&n=2").await;
    assert_eq!(browser.count("#messages tr[data-message]").await, 2);

    let stored = pending_messages(&api, "talk").await;
    assert_eq!(stored.len(), 2, "{stored:?}");
    assert_eq!(
        (
            stored[0]["seq"].as_u64(),
            stored[0]["kind"].as_str(),
            stored[0]["payload"].as_str(),
            stored[0]["sent_by"].as_str(),
        ),
        (
            Some(1),
            Some("steer"),
            Some(text),
            Some("dashboard:producer")
        ),
        "{stored:?}"
    );
    assert_eq!(
        (stored[1]["kind"].as_str(), stored[1]["agent"].as_str()),
        (Some("follow_up"), Some("echo")),
        "{stored:?}"
    );
    browser.close().await;

    // A reader sees the messages but no send box, and its post is refused.
    let client = raw_client();
    let (reader, reader_csrf) = session(&api, &client, READER).await;
    let page = client
        .get(api.url("/threads/talk"))
        .header(header::COOKIE, &reader)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let body = page.text().await.unwrap();
    assert!(
        body.contains("data-message=\"1\"") && !body.contains("id=\"send\""),
        "the reader's page"
    );
    assert!(
        body.contains("&lt;b&gt;bold&lt;/b&gt; &amp; &lt;script&gt;") && !body.contains("<b>bold"),
        "escaped in the markup"
    );
    let (status, _) = send_form(
        &api,
        &client,
        &reader,
        "talk",
        &[("csrf", &reader_csrf), ("text", "from a reader")],
    )
    .await;
    assert_eq!(status, 403, "a reader's send");

    // The producer's refusals come back to the page saying why, and store nothing.
    let (producer, csrf) = session(&api, &client, PRODUCER).await;
    let (status, _) = send_form(&api, &client, &producer, "talk", &[("text", "no csrf")]).await;
    assert_eq!(status, 403, "without the CSRF token");
    let big = "x".repeat(3000);
    for (form, notice) in [
        (vec![("text", "   ")], "message-empty"),
        (
            vec![("text", "hi"), ("agent", "nobody")],
            "message-unknown-agent",
        ),
        (vec![("text", big.as_str())], "message-too-large"),
    ] {
        let mut form = form;
        form.push(("csrf", &csrf));
        let (status, location) = send_form(&api, &client, &producer, "talk", &form).await;
        assert_eq!(
            (status, location.as_str()),
            (303, format!("/threads/talk?notice={notice}").as_str())
        );
    }
    // A follow-up to a thread that never ran needs an agent.
    let (status, location) = send_form(
        &api,
        &client,
        &producer,
        "fresh",
        &[("csrf", &csrf), ("text", "hello?")],
    )
    .await;
    assert_eq!(
        (status, location.as_str()),
        (303, "/threads/fresh?notice=message-needs-agent")
    );
    assert!(pending_messages(&api, "fresh").await.is_empty());
    // `max_inbox = 4`: two more fit, the fifth is refused.
    for n in 3..=4 {
        let (status, location) = send_form(
            &api,
            &client,
            &producer,
            "talk",
            &[("csrf", &csrf), ("text", "more"), ("kind", "steer")],
        )
        .await;
        assert_eq!(
            (status, location),
            (303, format!("/threads/talk?notice=sent&n={n}"))
        );
    }
    let (status, location) = send_form(
        &api,
        &client,
        &producer,
        "talk",
        &[("csrf", &csrf), ("text", "one too many")],
    )
    .await;
    assert_eq!(
        (status, location.as_str()),
        (303, "/threads/talk?notice=message-inbox-full")
    );
    assert_eq!(pending_messages(&api, "talk").await.len(), 4);
    let page = client
        .get(api.url("/threads/talk?notice=message-inbox-full"))
        .header(header::COOKIE, &producer)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("Not sent: the thread&#39;s inbox is full")
            || page.contains("Not sent: the thread's inbox is full"),
        "the refusal is shown"
    );
}

/// Posts a waitpoint's Approve or Reject as the raw client would: the status and where it
/// goes back to.
async fn decide_form(
    api: &Api,
    client: &reqwest::Client,
    cookie: &str,
    id: &str,
    decision: &str,
    form: &[(&str, &str)],
) -> (u16, String) {
    let r = client
        .post(api.url(&format!("/waitpoints/{id}/{decision}")))
        .header(header::COOKIE, cookie)
        .header(header::ORIGIN, &api.base)
        .form(form)
        .send()
        .await
        .unwrap();
    let location = r
        .headers()
        .get(header::LOCATION)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (r.status().as_u16(), location)
}

async fn waitpoint_record(api: &Api, id: &str) -> Value {
    let (status, w) = api.get(&format!("/v1/waitpoints/{id}")).await;
    assert_eq!(status, 200, "{w}");
    w
}

/// The Waiting page: an operator sees the pending waitpoints with their metadata (as text),
/// approves one and rejects another; each is completed with its decision and its dispatch
/// resumes. A reader sees the page without buttons and its post is refused; a post without
/// the CSRF token is refused; a decision on a settled waitpoint comes back saying so. The
/// dispatch list filters by `waiting`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_approves_and_rejects_waitpoints_on_the_waiting_page() {
    use crate::waitpoints::Seeder;
    let api = start().await;
    let seeder = Seeder::open(api.env.path());
    let script = "<script>alert(1)</script>";
    let approve = seeder
        .waiting(
            "deploy",
            &[(
                "approve-deploy",
                600_000,
                &[("question", script), ("amount", "42 <b>€</b>")],
            )],
        )
        .await;
    let reject = seeder
        .waiting("refund", &[("approve-refund", 600_000, &[])])
        .await;

    let browser = Browser::start(1280, 900).await;
    browser.login(&api.base, OPERATOR).await;
    // The overview counts the waiting dispatches; the nav leads to the page.
    browser
        .wait_text(
            "#agents tr[data-agent='approver'] td[data-col='waiting']",
            "waiting count",
            |t| t == "2",
        )
        .await;
    browser.click("header nav a[href='/waiting']").await;
    browser.wait_path("/waiting").await;
    let row = |id: &str| format!("#waitpoints tr[data-waitpoint='{id}']");
    assert_eq!(browser.count("#waitpoints tr[data-waitpoint]").await, 2);
    let shown = browser.text(&row(approve.id(0))).await.unwrap();
    assert!(
        shown.contains("approve-deploy")
            && shown.contains("deploy")
            && shown.contains(&approve.dispatch),
        "{shown}"
    );
    assert_eq!(
        browser
            .text(&format!("{} dl.metadata dd", row(approve.id(0))))
            .await
            .as_deref(),
        Some("42 <b>€</b>"),
        "metadata shown as written (keys in order: amount first)"
    );
    assert!(shown.contains(script), "the script is text: {shown}");
    assert_eq!(
        browser
            .eval("return document.querySelectorAll('main script, main b').length")
            .await,
        0,
        "the metadata made no element"
    );
    assert!(
        browser.client.get_alert_text().await.is_err(),
        "a dialog opened"
    );
    browser.screenshot("waiting").await;

    browser
        .click(&format!("{} button.approve", row(approve.id(0))))
        .await;
    browser.wait_path("/waiting?notice=approved").await;
    assert_eq!(
        browser.text("p.notice").await.as_deref(),
        Some("Approved: the waitpoint is completed and its dispatch resumes.")
    );
    assert_eq!(
        browser.count(&row(approve.id(0))).await,
        0,
        "no longer waiting"
    );
    let w = waitpoint_record(&api, approve.id(0)).await;
    assert_eq!(
        (w["state"].as_str(), w["settled_by"].as_str()),
        (Some("completed"), Some("operator:operator")),
        "{w}"
    );
    let result: Value = serde_json::from_str(w["result"].as_str().unwrap()).unwrap();
    assert_eq!(result, json!({ "approved": true }));
    let (_, d) = api
        .get(&format!("/v1/dispatches/{}", approve.dispatch))
        .await;
    assert_eq!(
        (d["status"].as_str(), d["resumes"].as_u64()),
        (Some("queued"), Some(1)),
        "{d}"
    );

    browser
        .click(&format!("{} button.reject", row(reject.id(0))))
        .await;
    browser.wait_path("/waiting?notice=rejected").await;
    let w = waitpoint_record(&api, reject.id(0)).await;
    let result: Value = serde_json::from_str(w["result"].as_str().unwrap()).unwrap();
    assert_eq!(
        (w["state"].as_str(), result),
        (Some("completed"), json!({ "approved": false }))
    );
    assert_eq!(browser.count("#waitpoints tr[data-waitpoint]").await, 0);
    browser.close().await;

    // A reader sees the list but no buttons, and its decision is refused.
    let late = seeder
        .waiting("later", &[("approve-later", 600_000, &[("k", script)])])
        .await;
    let client = raw_client();
    let (reader, reader_csrf) = session(&api, &client, READER).await;
    let page = client
        .get(api.url("/waiting"))
        .header(header::COOKIE, &reader)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let body = page.text().await.unwrap();
    assert!(
        body.contains(&format!("data-waitpoint=\"{}\"", late.id(0)))
            && !body.contains("button class=\"approve\"")
            && !body.contains("/approve"),
        "the reader's page"
    );
    assert!(
        body.contains("&lt;script&gt;alert(1)&lt;/script&gt;") && !body.contains(script),
        "escaped in the markup"
    );
    let (status, _) = decide_form(
        &api,
        &client,
        &reader,
        late.id(0),
        "approve",
        &[("csrf", &reader_csrf)],
    )
    .await;
    assert_eq!(status, 403, "a reader's decision");
    // An operator's post without the CSRF token is refused; nothing changes.
    let (operator, csrf) = session(&api, &client, OPERATOR).await;
    let (status, _) = decide_form(&api, &client, &operator, late.id(0), "approve", &[]).await;
    assert_eq!(status, 403, "without the CSRF token");
    assert_eq!(waitpoint_record(&api, late.id(0)).await["state"], "pending");
    // A decision on a settled waitpoint, or an unknown one, comes back saying so.
    let (status, location) = decide_form(
        &api,
        &client,
        &operator,
        approve.id(0),
        "reject",
        &[("csrf", &csrf)],
    )
    .await;
    assert_eq!(
        (status, location.as_str()),
        (303, "/waiting?notice=waitpoint-settled")
    );
    let (status, location) = decide_form(
        &api,
        &client,
        &operator,
        "no-such",
        "approve",
        &[("csrf", &csrf)],
    )
    .await;
    assert_eq!(
        (status, location.as_str()),
        (303, "/waiting?notice=waitpoint-missing")
    );
    let w = waitpoint_record(&api, approve.id(0)).await;
    let result: Value = serde_json::from_str(w["result"].as_str().unwrap()).unwrap();
    assert_eq!(
        result,
        json!({ "approved": true }),
        "the first decision stays"
    );

    // The dispatch list filters by waiting; the dispatch page names its waitpoints.
    let page = client
        .get(api.url("/dispatches?status=waiting"))
        .header(header::COOKIE, &operator)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains(&format!("data-id=\"{}\"", late.dispatch))
            && !page.contains(&format!("data-id=\"{}\"", approve.dispatch)),
        "only the waiting dispatch is listed"
    );
    let page = client
        .get(api.url(&format!("/dispatches/{}", late.dispatch)))
        .header(header::COOKIE, &operator)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains(&format!("data-waitpoint=\"{}\"", late.id(0)))
            && page.contains("approve-later"),
        "the dispatch page lists its waitpoint"
    );
}

//! What readers of a thread can make a host hold: a real `homing run` (embedded store) with a
//! thread of large pending messages and large log entries, read at once by many readers of
//! `GET /v1/threads/{t}/messages`, of the dashboard's thread page and of the thread's log
//! stream. The host's resident memory must stay within a bound set by the routes' byte caps,
//! not by how much the thread holds or how many readers there are.
//!
//! The data is written through the store file the host serves (as `journal_view` does), so
//! the host's own peak is the readers' cost alone.

use homing::store::{MessageKind, NewMessage};
use reqwest::header;

use crate::api::{Api, READER};
use crate::dashboard::{raw_client, session};
use crate::waitpoints::Seeder;

/// A pending message's payload: the largest `max_payload` allows.
const MESSAGE: usize = 1 << 20;
/// The pending messages of the thread.
const MESSAGES: usize = 100;
/// A log entry's data, and how many the thread holds.
const ENTRY: usize = 256 << 10;
const ENTRIES: usize = 200;

/// The host's resident memory now, and its peak so far, in MiB.
fn rss_mib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
            / 1024
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn config(port: u16) -> String {
    crate::waitpoints::config(port).replace(
        "max_payload = \"64KiB\"",
        "max_payload = \"1MiB\"\nmax_inbox = 200",
    )
}

/// A host serving a thread `big` of [`MESSAGES`] pending messages and [`ENTRIES`] log entries.
async fn host() -> Api {
    let api = Api::start_with(config, |_| {}).await;
    let seeder = Seeder::open(api.env.path());
    let store = &seeder.store;
    for i in 0..MESSAGES {
        let payload = vec![b'a' + (i % 26) as u8; MESSAGE];
        store
            .inbox
            .send(
                "big",
                NewMessage::new(MessageKind::Steer, payload, "test"),
                1000,
            )
            .await
            .unwrap();
    }
    for i in 0..ENTRIES {
        let data = vec![b'a' + (i % 26) as u8; ENTRY];
        store.log.append("big", &data, None).await.unwrap();
    }
    api
}

/// Runs `readers` at once, `rounds` times, and returns the host's growth: its peak resident
/// memory less what it held before, in MiB.
async fn growth<F, Fut>(api: &Api, readers: usize, rounds: usize, read: F) -> u64
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    // One read first, so what every request needs once (pools, caches) is in the baseline.
    read().await;
    let (before, _) = rss_mib(api.pid());
    for _ in 0..rounds {
        futures_util::future::join_all((0..readers).map(|_| read())).await;
    }
    let (_, peak) = rss_mib(api.pid());
    peak.saturating_sub(before)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_readers_of_a_large_inbox_keep_the_host_within_the_page_cap() {
    let api = host().await;
    let client = reqwest::Client::new();
    let url = api.url("/v1/threads/big/messages?limit=1000");
    let grew = growth(&api, 8, 3, || {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let r = client.get(url).bearer_auth(READER).send().await.unwrap();
            assert_eq!(r.status(), 200);
            let page: serde_json::Value = r.json().await.unwrap();
            let shown = page["messages"].as_array().unwrap().len();
            // A page of at most 2 MiB: two of the 1 MiB messages.
            assert!((1..=2).contains(&shown), "{shown} messages on one page");
            assert_eq!(page["inbox"]["pending"], MESSAGES);
        }
    })
    .await;
    eprintln!("8 readers of 100 pending 1 MiB messages: the host grew {grew} MiB");
    // Before the reads were bounded: 790 MiB (each request read every message); after: 45.
    assert!(grew < 96, "the host grew {grew} MiB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_views_of_a_large_thread_page_keep_the_host_within_what_it_shows() {
    let api = host().await;
    let client = raw_client();
    let (cookie, _) = session(&api, &client, READER).await;
    let url = api.url("/threads/big");
    let grew = growth(&api, 4, 3, || {
        let (client, url, cookie) = (client.clone(), url.clone(), cookie.clone());
        async move {
            let r = client
                .get(url)
                .header(header::COOKIE, cookie)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let html = r.text().await.unwrap();
            assert!(
                html.contains(&format!("({ENTRY} bytes in all)")),
                "entries cut"
            );
            assert!(
                html.contains(&format!("({MESSAGE} bytes in all)")),
                "messages cut"
            );
            assert!(html.contains("data-seq=\"200\""), "the latest entry shown");
            assert!(
                html.contains("data-message=\"100\""),
                "every pending message shown"
            );
        }
    })
    .await;
    eprintln!("4 views of a thread of 150 MiB: the host grew {grew} MiB");
    // Before: 585 MiB (every entry and message read whole); after: 42.
    assert!(grew < 64, "the host grew {grew} MiB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_readers_of_a_log_stream_pin_a_capped_buffer_each() {
    let api = host().await;
    let client = reqwest::Client::new();
    let open = || {
        let client = client.clone();
        let url = api.url("/v1/threads/big/log/stream");
        async move {
            let mut r = client.get(url).bearer_auth(READER).send().await.unwrap();
            assert_eq!(r.status(), 200);
            // The first bytes of the first entry: the host is streaming; then it is left idle.
            assert!(r.chunk().await.unwrap().is_some());
            r
        }
    };
    let first = open().await;
    let (before, _) = rss_mib(api.pid());
    let mut idle = vec![first];
    for _ in 0..3 {
        idle.extend(futures_util::future::join_all((0..21).map(|_| open())).await);
    }
    let (_, peak) = rss_mib(api.pid());
    let grew = peak.saturating_sub(before);
    eprintln!(
        "{} idle readers of a log of 256 KiB entries: the host grew {grew} MiB",
        idle.len()
    );
    // Before the cap: 113 MiB (16 entries read ahead per stream); after: 42.
    assert!(grew < 80, "the host grew {grew} MiB");
    drop(idle);
}

/// A reader that stops reading while entries wait for it is dropped once it stalled longer
/// than the stream's patience (10 s): the `dropped` event names the sequence to resume after,
/// and resuming there with `Last-Event-ID` misses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stalls_while_entries_wait_is_dropped_and_resumes_where_it_was() {
    let api = host().await;
    let client = reqwest::Client::new();
    let url = api.url("/v1/threads/big/log/stream");
    let mut r = client.get(&url).bearer_auth(READER).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.chunk().await.unwrap().is_some());
    // The stall under test: 50 MiB of entries wait, more than the sockets between hold.
    tokio::time::sleep(std::time::Duration::from_secs(11)).await;
    let mut tail = Vec::new();
    let mut read = 0usize;
    while let Some(chunk) = r.chunk().await.unwrap() {
        read += chunk.len();
        tail.extend_from_slice(&chunk);
        let keep = tail.len().saturating_sub(640 << 10);
        tail.drain(..keep);
    }
    let tail = String::from_utf8_lossy(&tail);
    let event = tail
        .split("\n\n")
        .find(|e| e.contains("event: dropped"))
        .unwrap_or_else(|| {
            panic!(
                "no dropped event after {read} bytes; the end:\n{}",
                &tail[tail.len().saturating_sub(400)..]
            )
        });
    let data: serde_json::Value = serde_json::from_str(
        event
            .lines()
            .find_map(|l| l.strip_prefix("data: "))
            .unwrap(),
    )
    .unwrap();
    let last = data["last"].as_u64().unwrap();
    assert!(last >= 1 && last < ENTRIES as u64, "{data}");
    assert!(
        data["reason"].as_str().unwrap().contains("Last-Event-ID"),
        "{data}"
    );
    // The last entry event before it is the one it names.
    let last_id = tail
        .split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("id: ")))
        .last()
        .map(str::to_owned);
    assert_eq!(last_id, Some(last.to_string()));
    // Resuming there starts with the next entry.
    let mut again = client
        .get(&url)
        .bearer_auth(READER)
        .header("last-event-id", last.to_string())
        .send()
        .await
        .unwrap();
    let mut head = String::new();
    while !head.contains("\nid: ") && !head.starts_with("id: ") {
        let chunk = again.chunk().await.unwrap().unwrap();
        head.push_str(&String::from_utf8_lossy(&chunk));
    }
    let first = head
        .lines()
        .find_map(|l| l.strip_prefix("id: "))
        .unwrap()
        .parse::<u64>()
        .unwrap();
    assert_eq!(first, last + 1);
}

//! `/`: per agent, the dispatches in each status, how many are retrying, the oldest queued and
//! the throughput of the last minutes; the hosts seen.

use std::collections::BTreeSet;

use axum::extract::State;
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use maud::{Markup, html};

use super::super::stats::{self, MINUTES};
use super::super::view::{self, Nav, age, chart, encode};
use super::{Dashboard, PageError, PageState, SCAN, respond};
use crate::store::{ListFilter, Status};

/// One agent's row on the overview.
struct AgentRow {
    name: String,
    /// By status, in the order of [`Status::ALL`].
    counts: [u64; Status::ALL.len()],
    retrying: u64,
    oldest: Option<u64>,
    scanned_all: bool,
    series: [u64; MINUTES],
}

fn count_of(row: &AgentRow, status: Status) -> u64 {
    Status::ALL
        .iter()
        .position(|s| *s == status)
        .and_then(|i| row.counts.get(i).copied())
        .unwrap_or(0)
}

/// What the overview shows.
struct Overview {
    now: u64,
    rows: Vec<AgentRow>,
    hosts: BTreeSet<String>,
    /// This host, the one serving the page.
    this_host: String,
}

/// `GET /`.
pub(super) async fn page(
    State(d): PageState,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, PageError> {
    let session = d.session(&headers, &uri)?;
    let overview = read(&d).await?;
    Ok(respond(
        "Overview",
        Nav::Overview,
        &session,
        render(&overview),
    ))
}

/// The store's counts (also fed to the throughput samples), the claims held (for the hosts
/// seen) and, of each agent with queued work, its first [`SCAN`] queued dispatches.
async fn read(d: &Dashboard) -> Result<Overview, PageError> {
    let store = &d.api.store;
    let counts = store.mailbox.counts().await?;
    let now = d.now();
    d.stats.observe_counts(now, &counts);
    let claimed = store
        .mailbox
        .list_rows(&ListFilter {
            statuses: vec![Status::Claimed],
            limit: stats::CLAIM_SCAN,
            ..ListFilter::default()
        })
        .await?;
    d.stats.observe_claims(now, &claimed);
    let mut names: BTreeSet<String> = d.api.config().plugins.keys().cloned().collect();
    names.extend(counts.iter().map(|c| c.agent.clone()));
    let mut rows = Vec::new();
    for name in names {
        let mut row = AgentRow {
            counts: [0; Status::ALL.len()],
            retrying: 0,
            oldest: None,
            scanned_all: true,
            series: d.stats.series(now, &name),
            name,
        };
        for c in counts.iter().filter(|c| c.agent == row.name) {
            if let Some(slot) = Status::ALL
                .iter()
                .position(|s| *s == c.status)
                .and_then(|i| row.counts.get_mut(i))
            {
                *slot = c.count;
            }
        }
        if count_of(&row, Status::Queued) > 0 {
            let queued = store
                .mailbox
                .list_rows(&ListFilter {
                    agent: Some(row.name.clone()),
                    statuses: vec![Status::Queued],
                    limit: SCAN,
                    ..ListFilter::default()
                })
                .await?;
            row.scanned_all = queued.len() < SCAN;
            row.retrying = queued.iter().filter(|q| q.attempt > 0).count() as u64;
            row.oldest = queued.iter().map(|q| q.created_at).min();
        }
        rows.push(row);
    }
    let mut hosts: BTreeSet<String> = d.stats.hosts().into_iter().map(|(h, _)| h).collect();
    hosts.insert(d.host_id.clone());
    Ok(Overview {
        now,
        rows,
        hosts,
        this_host: d.host_id.clone(),
    })
}

fn render(o: &Overview) -> Markup {
    let Overview {
        now,
        rows,
        hosts,
        this_host,
    } = o;
    let now = *now;
    html! {
        h1 { "Overview" }
        div #live hx-get="/" hx-trigger="every 5s" hx-select="#live" hx-swap="outerHTML" {
            p.muted { "As of " (view::time(now)) "; refreshes every 5 seconds." }
            div.scroll {
                table.stack #agents {
                    caption.muted { "Dispatches per agent" }
                    thead { tr {
                        th scope="col" { "Agent" }
                        th.num scope="col" { "Queued" }
                        th.num scope="col" { "Claimed" }
                        th.num scope="col" { "Waiting" }
                        th.num scope="col" { "Retrying" }
                        th.num scope="col" { "Dead letters" }
                        th.num scope="col" { "Acked" }
                        th scope="col" { "Oldest queued" }
                        th scope="col" { "Settled per minute, last " (MINUTES) " min" }
                    } }
                    tbody {
                        @for row in rows {
                            tr data-agent=(row.name) {
                                th scope="row" { a href={ "/dispatches?agent=" (encode(&row.name)) } { (row.name) } }
                                td.num data-col="queued" data-label="Queued" { a href={ "/dispatches?agent=" (encode(&row.name)) "&status=queued" } { (count_of(row, Status::Queued)) } }
                                td.num data-col="claimed" data-label="Claimed" { (count_of(row, Status::Claimed)) }
                                td.num data-col="waiting" data-label="Waiting" { a href={ "/dispatches?agent=" (encode(&row.name)) "&status=waiting" } { (count_of(row, Status::Waiting)) } }
                                td.num data-col="retrying" data-label="Retrying" { (row.retrying) @if !row.scanned_all { "+" } }
                                td.num data-col="dead_letter" data-label="Dead letters" { a href={ "/dead-letters?agent=" (encode(&row.name)) } { (count_of(row, Status::DeadLetter)) } }
                                td.num data-col="acked" data-label="Acked" { (count_of(row, Status::Acked)) }
                                td data-col="oldest" data-label="Oldest queued" {
                                    @match row.oldest {
                                        Some(t) => { (age(now.saturating_sub(t))) @if !row.scanned_all { " or more" } }
                                        None => { span.muted { "none queued" } }
                                    }
                                }
                                td data-label="Settled per minute" {
                                    @let total: u64 = row.series.iter().sum();
                                    (chart(&row.series, &format!("{}: {total} settled in the last {MINUTES} minutes", row.name)))
                                    span.muted { (total) " in " (MINUTES) " min" }
                                }
                            }
                        }
                    }
                }
            }
            @if rows.iter().any(|r| !r.scanned_all) {
                p.muted { "Retrying and oldest-queued figures look at the first " (SCAN) " queued dispatches of an agent in priority order." }
            }
            h2 { "Hosts seen" }
            ul #hosts {
                @for host in hosts {
                    li.mono { (host) @if host == this_host { span.muted { " (this host, serving this page)" } } }
                }
            }
            p.muted { "Hosts holding claims in the last " (MINUTES) " minutes, as this host has sampled them, and this host. Throughput is sampled by this host from the store's counts since it started." }
        }
    }
}

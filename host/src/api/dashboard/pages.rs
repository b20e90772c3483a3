//! The dashboard's handlers: one per page and per action. Reads go through the same store
//! calls as the API's handlers (`list` with a filter and cursor, `counts`, `load`, the thread
//! log); actions through the same operations (`work::cancel`, `work::retry`, `interrupt`).

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::Form;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;
use tracing::{info, warn};

use super::session::{self, LoginRefused, Session};
use super::stats::{self, MINUTES};
use super::view::{
    self, Nav, age, bytes, chart, csrf, dispatch_href, encode, status, thread_href, when,
};
use super::{Dashboard, LOGIN_LIMIT};
use crate::api::limits::{ClientAddr, Failed};
use crate::store::model::check_name;
use crate::store::{DispatchRow, ListCursor, ListFilter, Status, StoreError};
use crate::work::{self, OpError};

/// Rows per page of a list.
const PAGE: usize = 50;
/// The most rows read to order a list newest first, or to find an agent's oldest queued.
const SCAN: usize = 1000;
/// Log entries a thread page shows (the latest).
const LOG_SHOW: usize = 200;
/// The most log entry bytes shown per entry.
const ENTRY_SHOW: usize = 4096;
/// The most dead letters retried by one post.
const MAX_SELECTED: usize = 100;

type PageState = State<Arc<Dashboard>>;

/// Why a page is not shown.
#[derive(Debug)]
pub(super) enum PageError {
    /// No session: to the login page, then back to this path.
    Login(String),
    /// A status and a sentence for the operator.
    Status(StatusCode, String),
}

impl From<StoreError> for PageError {
    fn from(e: StoreError) -> PageError {
        warn!("dashboard: the store failed: {e}");
        PageError::Status(
            StatusCode::SERVICE_UNAVAILABLE,
            "The store could not be read just now; try again.".into(),
        )
    }
}

impl From<OpError> for PageError {
    fn from(e: OpError) -> PageError {
        match e {
            OpError::NotFound(_) => not_found("No such dispatch."),
            OpError::WrongState { .. } => PageError::Status(
                StatusCode::CONFLICT,
                "That action does not apply to the dispatch in its current state.".into(),
            ),
            OpError::Store(e) => e.into(),
        }
    }
}

fn not_found(what: &str) -> PageError {
    PageError::Status(StatusCode::NOT_FOUND, what.to_owned())
}

fn forbidden(what: &str) -> PageError {
    PageError::Status(StatusCode::FORBIDDEN, what.to_owned())
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        match self {
            PageError::Login(next) => {
                Redirect::to(&format!("/login?next={}", encode(&next))).into_response()
            }
            PageError::Status(code, message) => {
                let body = view::page(
                    code.canonical_reason().unwrap_or("Error"),
                    Nav::None,
                    None,
                    html! {
                        h1 { (code.as_u16()) " " (code.canonical_reason().unwrap_or("")) }
                        p.notice.error role="alert" { (message) }
                        p { a href="/" { "Back to the overview" } }
                    },
                );
                (code, html_response(body)).into_response()
            }
        }
    }
}

fn html_response(markup: Markup) -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        markup.into_string(),
    )
        .into_response()
}

impl Dashboard {
    /// The request's session, or a redirect to the login page.
    fn session(&self, headers: &HeaderMap, uri: &Uri) -> Result<Session, PageError> {
        self.sessions.get(headers).ok_or_else(|| {
            PageError::Login(uri.path_and_query().map_or("/", |p| p.as_str()).to_owned())
        })
    }

    /// The session of an action, from the request's head (before its form is read): a
    /// session, posting from this origin, of the operator role. Each refusal is logged with
    /// the token's name, never a secret.
    fn acting(&self, headers: &HeaderMap, what: &str) -> Result<Session, PageError> {
        let Some(session) = self.sessions.get(headers) else {
            warn!(action = what, "dashboard action refused: no session");
            return Err(PageError::Status(
                StatusCode::UNAUTHORIZED,
                "Log in first.".into(),
            ));
        };
        if !same_origin(headers) {
            warn!(action = what, token = %session.name, "dashboard action refused: cross-origin");
            return Err(forbidden("The form was not posted from this dashboard."));
        }
        if !session.operator() {
            warn!(action = what, token = %session.name, role = %session.role, "dashboard action refused: role");
            return Err(forbidden(&format!(
                "Your token has role {}; actions need operator.",
                session.role
            )));
        }
        Ok(session)
    }

    /// The form's CSRF token is the session's.
    fn csrf_ok(session: &Session, csrf: &str, what: &str) -> Result<(), PageError> {
        if session.csrf_ok(csrf) {
            return Ok(());
        }
        warn!(action = what, token = %session.name, "dashboard action refused: CSRF token missing or wrong");
        Err(forbidden(
            "The form's CSRF token is missing or wrong; reload the page and try again.",
        ))
    }

    fn now(&self) -> u64 {
        self.api.store.now()
    }
}

/// The session of an action post, checked from the request's head by [`Dashboard::acting`]:
/// a handler takes it before its form, so that a post without a session, from another origin
/// or by a reader is refused before its body is read.
pub(super) struct Acting(Session);

impl FromRequestParts<Arc<Dashboard>> for Acting {
    type Rejection = PageError;

    async fn from_request_parts(
        parts: &mut Parts,
        d: &Arc<Dashboard>,
    ) -> Result<Acting, PageError> {
        d.acting(&parts.headers, parts.uri.path()).map(Acting)
    }
}

/// The session of a logout post: a session, posting from this origin, checked from the head.
pub(super) struct LoggingOut(Session);

impl FromRequestParts<Arc<Dashboard>> for LoggingOut {
    type Rejection = PageError;

    async fn from_request_parts(
        parts: &mut Parts,
        d: &Arc<Dashboard>,
    ) -> Result<LoggingOut, PageError> {
        match d.sessions.get(&parts.headers) {
            Some(session) if same_origin(&parts.headers) => Ok(LoggingOut(session)),
            _ => Err(forbidden("The form's CSRF token is missing or wrong.")),
        }
    }
}

/// A login post's head: from this origin, declaring no more than [`LOGIN_LIMIT`] bytes of
/// form. Anyone may post a login, so these are checked before its body is read (which then
/// gets `[api] body_timeout` and [`LOGIN_LIMIT`]). Carries the client's address, whose failed
/// logins are counted.
pub(super) struct LoginHead(ClientAddr);

impl FromRequestParts<Arc<Dashboard>> for LoginHead {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        _: &Arc<Dashboard>,
    ) -> Result<LoginHead, Response> {
        if !same_origin(&parts.headers) {
            return Err((
                StatusCode::FORBIDDEN,
                html_response(login_form(
                    "/",
                    Some("The form was not posted from this dashboard."),
                )),
            )
                .into_response());
        }
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > LOGIN_LIMIT as u64) {
            return Err((
                StatusCode::PAYLOAD_TOO_LARGE,
                [(header::CONNECTION, "close")],
                html_response(login_form("/", Some("The form is too large."))),
            )
                .into_response());
        }
        let client = parts
            .extensions
            .get::<ClientAddr>()
            .copied()
            .unwrap_or(ClientAddr::UNKNOWN);
        Ok(LoginHead(client))
    }
}

/// Whether a post comes from this origin: its `Origin` (when sent) names the `Host` it was
/// sent to, and `Sec-Fetch-Site` (when sent) says same-origin.
fn same_origin(headers: &HeaderMap) -> bool {
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = text("sec-fetch-site")
        && !matches!(site, "same-origin" | "none")
    {
        return false;
    }
    match (text(header::ORIGIN.as_str()), text(header::HOST.as_str())) {
        (None, _) => true,
        (Some(origin), Some(host)) => {
            origin.strip_prefix("http://") == Some(host)
                || origin.strip_prefix("https://") == Some(host)
        }
        (Some(_), None) => false,
    }
}

/// A local path to go to after login: `next` when it is one, else `/`. One is a path that
/// starts with exactly one `/` and holds only visible ASCII and no backslash: a browser drops
/// tabs and newlines from a `Location` and reads `\` as `/`, so `/<TAB>/evil.example` or
/// `/\evil.example` would take it to another site.
fn local(next: Option<&str>) -> &str {
    match next {
        Some(n)
            if n.starts_with('/')
                && !n.starts_with("//")
                && n.bytes().all(|b| b.is_ascii_graphic() && b != b'\\') =>
        {
            n
        }
        _ => "/",
    }
}

/// Checks a dispatch id or thread name from a page's path or query, as enqueue and the API
/// check it: 400 when it is blank, too long or not printable.
fn name(field: &str, value: &str) -> Result<(), PageError> {
    check_name(field, value).map_err(|e| PageError::Status(StatusCode::BAD_REQUEST, e))
}

/// One notice above a page, named by `?notice=`; unknown names show nothing.
fn notice(name: Option<&str>, n: Option<&str>) -> Markup {
    let n: Option<u64> = n.and_then(|n| n.parse().ok());
    let text = match name {
        Some("cancelled") => "Cancelled.".to_owned(),
        Some("retried") => "Retried: this is the new dispatch, queued again.".to_owned(),
        Some("interrupted") => "Thread interrupted.".to_owned(),
        Some("retried-n") => format!("Retried {} dead letter(s).", n.unwrap_or(0)),
        Some("none-selected") => "Nothing was selected.".to_owned(),
        _ => return html! {},
    };
    html! { p.notice role="status" { (text) } }
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct Params {
    agent: Option<String>,
    status: Option<String>,
    thread: Option<String>,
    id: Option<String>,
    order: Option<String>,
    after: Option<String>,
    page: Option<usize>,
    notice: Option<String>,
    n: Option<String>,
    next: Option<String>,
}

fn params(query: Result<Query<Params>, QueryRejection>) -> Result<Params, PageError> {
    query.map(|Query(p)| p).map_err(|_| {
        PageError::Status(
            StatusCode::BAD_REQUEST,
            "The address has a bad query string.".into(),
        )
    })
}

fn nonblank(s: &Option<String>) -> Option<&str> {
    s.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

// ---- overview ----

/// One agent's row on the overview.
struct AgentRow {
    name: String,
    counts: [u64; 6],
    retrying: u64,
    oldest: Option<u64>,
    scanned_all: bool,
    series: [u64; MINUTES],
}

fn count_of(row: &AgentRow, status: Status) -> u64 {
    Status::ALL
        .iter()
        .position(|s| *s == status)
        .map_or(0, |i| row.counts[i])
}

/// `GET /`.
pub(super) async fn overview(
    State(d): PageState,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, PageError> {
    let session = d.session(&headers, &uri)?;
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
    let mut names: BTreeSet<String> = d.api.config.plugins.keys().cloned().collect();
    names.extend(counts.iter().map(|c| c.agent.clone()));
    let mut rows = Vec::new();
    for name in names {
        let mut row = AgentRow {
            counts: [0; 6],
            retrying: 0,
            oldest: None,
            scanned_all: true,
            series: d.stats.series(now, &name),
            name,
        };
        for c in counts.iter().filter(|c| c.agent == row.name) {
            if let Some(i) = Status::ALL.iter().position(|s| *s == c.status) {
                row.counts[i] = c.count;
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
    let body = html! {
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
                        th.num scope="col" { "Retrying" }
                        th.num scope="col" { "Dead letters" }
                        th.num scope="col" { "Acked" }
                        th scope="col" { "Oldest queued" }
                        th scope="col" { "Settled per minute, last " (MINUTES) " min" }
                    } }
                    tbody {
                        @for row in &rows {
                            tr data-agent=(row.name) {
                                th scope="row" { a href={ "/dispatches?agent=" (encode(&row.name)) } { (row.name) } }
                                td.num data-col="queued" data-label="Queued" { a href={ "/dispatches?agent=" (encode(&row.name)) "&status=queued" } { (count_of(row, Status::Queued)) } }
                                td.num data-col="claimed" data-label="Claimed" { (count_of(row, Status::Claimed)) }
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
                @for host in &hosts {
                    li.mono { (host) @if *host == d.host_id { span.muted { " (this host, serving this page)" } } }
                }
            }
            p.muted { "Hosts holding claims in the last " (MINUTES) " minutes, as this host has sampled them, and this host. Throughput is sampled by this host from the store's counts since it started." }
        }
    };
    Ok(html_response(view::page(
        "Overview",
        Nav::Overview,
        Some(&session),
        body,
    )))
}

// ---- login ----

fn login_form(next: &str, error: Option<&str>) -> Markup {
    view::page(
        "Log in",
        Nav::None,
        None,
        html! {
            div.login {
                h1 { "Log in" }
                @if let Some(error) = error { p.notice.error role="alert" { (error) } }
                form method="post" action="/login" {
                    label for="token" { "API token" }
                    input #token type="password" name="token" autocomplete="off" required autofocus;
                    input type="hidden" name="next" value=(next);
                    button type="submit" { "Log in" }
                }
                p.muted { "Use a token from [api] tokens in homing.toml. A reader sees everything; an operator can also cancel, retry and interrupt." }
            }
        },
    )
}

/// `GET /login`.
pub(super) async fn login_page(
    State(d): PageState,
    headers: HeaderMap,
    query: Result<Query<Params>, QueryRejection>,
) -> Response {
    let next = query.ok().and_then(|Query(p)| p.next);
    let next = local(next.as_deref());
    if d.sessions.get(&headers).is_some() {
        return Redirect::to(next).into_response();
    }
    html_response(login_form(next, None))
}

#[derive(Debug, Deserialize)]
pub(super) struct LoginForm {
    #[serde(default)]
    token: String,
    next: Option<String>,
}

/// `POST /login`. A right token always logs in; a wrong one is 401, or 429 once its client
/// address has failed too often (with the API's invalid tokens; `limits::Failures`).
pub(super) async fn login(
    State(d): PageState,
    LoginHead(client): LoginHead,
    form: Result<Form<LoginForm>, FormRejection>,
) -> Response {
    let Ok(Form(form)) = form else {
        return (
            StatusCode::BAD_REQUEST,
            html_response(login_form("/", Some("The form could not be read."))),
        )
            .into_response();
    };
    let next = local(form.next.as_deref());
    let Some((name, role)) = d.api.tokens.identify(form.token.trim().as_bytes()) else {
        if let Failed::Limited { retry_after, first } = d.api.failures.fail(client) {
            if first {
                warn!(%client, "dashboard logins refused: too many invalid tokens from this address; wrong ones are answered 429 until they stop");
            }
            let page = login_form(
                next,
                Some("Too many failed logins from this address; wait a minute."),
            );
            return (
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, retry_after.to_string())],
                html_response(page),
            )
                .into_response();
        }
        let message = "That token is not valid.";
        warn!(%client, "dashboard login refused: {message}");
        return (
            StatusCode::UNAUTHORIZED,
            html_response(login_form(next, Some(message))),
        )
            .into_response();
    };
    match d.sessions.login(name.clone(), role) {
        Ok(id) => {
            info!(token = %name, "dashboard login");
            (
                StatusCode::SEE_OTHER,
                [
                    (header::LOCATION, next.to_owned()),
                    (header::SET_COOKIE, session::set_cookie(&id)),
                ],
            )
                .into_response()
        }
        Err(refused) => {
            let (code, message) = match refused {
                LoginRefused::Full | LoginRefused::NoRandom => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "No session can be opened just now; try again later.",
                ),
            };
            warn!(status = code.as_u16(), "dashboard login refused: {message}");
            (code, html_response(login_form(next, Some(message)))).into_response()
        }
    }
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct ActionForm {
    #[serde(default)]
    csrf: String,
}

fn action_form(form: Result<Form<ActionForm>, FormRejection>) -> ActionForm {
    form.map(|Form(f)| f).unwrap_or_default()
}

/// `POST /logout`.
pub(super) async fn logout(
    State(d): PageState,
    headers: HeaderMap,
    LoggingOut(current): LoggingOut,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Response {
    if !current.csrf_ok(&action_form(form).csrf) {
        return forbidden("The form's CSRF token is missing or wrong.").into_response();
    }
    d.sessions.logout(&headers);
    (
        StatusCode::SEE_OTHER,
        [
            (header::LOCATION, "/login".to_owned()),
            (header::SET_COOKIE, session::clear_cookie()),
        ],
    )
        .into_response()
}

// ---- dispatches ----

fn dispatch_table(rows: &[DispatchRow], now: u64, select: Option<&Session>) -> Markup {
    html! {
        div.scroll {
            table.dispatches.stack {
                thead { tr {
                    @if select.is_some() {
                        th scope="col" {
                            label { input #select-all type="checkbox" aria-label="Select all"; }
                        }
                    }
                    th scope="col" { "Id" }
                    th scope="col" { "Agent" }
                    th scope="col" { "Thread" }
                    th scope="col" { "Status" }
                    th.num scope="col" { "Priority" }
                    th.num scope="col" { "Attempts" }
                    th scope="col" { "Created" }
                    @if select.is_some() { th scope="col" { "Last error" } }
                } }
                tbody {
                    @for row in rows {
                        tr data-id=(row.id) {
                            @if select.is_some() {
                                td data-label="Select" { input type="checkbox" name="id" value=(row.id) aria-label={ "Select " (row.id) }; }
                            }
                            td.id data-label="Id" { a href=(dispatch_href(&row.id)) { (row.id) } }
                            td data-label="Agent" { (row.agent) }
                            td data-label="Thread" { a href=(thread_href(&row.thread)) { (row.thread) } }
                            td data-label="Status" { (status(row.status)) }
                            td.num data-label="Priority" { (row.priority) }
                            td.num data-label="Attempts" { (row.attempt) "/" (row.max_attempts) }
                            td data-label="Created" { (when(row.created_at, now)) }
                            @if select.is_some() { td data-label="Last error" { (row.last_error.as_deref().unwrap_or("")) } }
                        }
                    }
                    @if rows.is_empty() {
                        tr { td colspan="9" { span.muted { "No dispatches match." } } }
                    }
                }
            }
        }
    }
}

/// `GET /dispatches?agent=&status=&thread=&id=&order=priority|newest&after=&page=`.
pub(super) async fn dispatches(
    State(d): PageState,
    headers: HeaderMap,
    uri: Uri,
    query: Result<Query<Params>, QueryRejection>,
) -> Result<Response, PageError> {
    let session = d.session(&headers, &uri)?;
    let p = params(query)?;
    let agent = nonblank(&p.agent);
    let thread = nonblank(&p.thread);
    let id = nonblank(&p.id);
    for (field, value) in [("agent", agent), ("thread", thread), ("id", id)] {
        if let Some(value) = value {
            name(field, value)?;
        }
    }
    let newest = p.order.as_deref() == Some("newest");
    let status_filter = match nonblank(&p.status) {
        None => None,
        Some(s) => Some(
            s.parse::<Status>()
                .map_err(|e| PageError::Status(StatusCode::BAD_REQUEST, e))?,
        ),
    };
    let after = match nonblank(&p.after) {
        None => None,
        Some(c) => Some(
            c.parse::<ListCursor>()
                .map_err(|e| PageError::Status(StatusCode::BAD_REQUEST, e))?,
        ),
    };
    let paged = after.is_some();
    let store = &d.api.store;
    let now = d.now();
    let page_no = p.page.unwrap_or(0);
    let (rows, next, truncated) = if let Some(id) = id {
        let one = store.mailbox.load(id).await?.filter(|r| {
            agent.is_none_or(|a| r.agent == a)
                && thread.is_none_or(|t| r.thread == t)
                && status_filter.is_none_or(|s| r.status == s)
        });
        (
            one.iter().map(DispatchRow::of).collect::<Vec<_>>(),
            None,
            false,
        )
    } else {
        let filter = ListFilter {
            agent: agent.map(str::to_owned),
            thread: thread.map(str::to_owned),
            statuses: status_filter.into_iter().collect(),
            limit: if newest { SCAN } else { PAGE },
            after: if newest { None } else { after },
        };
        if newest {
            let mut all = store.mailbox.list_rows(&filter).await?;
            let truncated = all.len() == SCAN;
            all.sort_by(|a, b| {
                b.created_at
                    .cmp(&a.created_at)
                    .then_with(|| b.id.cmp(&a.id))
            });
            let start = page_no.saturating_mul(PAGE).min(all.len());
            let end = (start + PAGE).min(all.len());
            let more = end < all.len();
            let rows = all.drain(start..end).collect::<Vec<_>>();
            (
                rows,
                more.then(|| format!("page={}", page_no + 1)),
                truncated,
            )
        } else {
            let rows = store.mailbox.list_rows(&filter).await?;
            let next = (rows.len() == PAGE)
                .then(|| {
                    rows.last()
                        .map(|r| format!("after={}", encode(&r.cursor().to_string())))
                })
                .flatten();
            (rows, next, false)
        }
    };
    let mut keep = String::new();
    for (key, value) in [
        ("agent", agent),
        ("status", nonblank(&p.status)),
        ("thread", thread),
        ("order", p.order.as_deref()),
    ] {
        if let Some(value) = value {
            keep.push_str(&format!("{key}={}&", encode(value)));
        }
    }
    let agents: Vec<&String> = d.api.config.plugins.keys().collect();
    let body = html! {
        h1 { "Dispatches" }
        form.filters method="get" action="/dispatches" role="search" {
            label { "Agent"
                select name="agent" {
                    option value="" { "any" }
                    @for a in &agents { option value=(a) selected[agent == Some(a.as_str())] { (a) } }
                }
            }
            label { "Status"
                select name="status" {
                    option value="" { "any" }
                    @for s in Status::ALL { option value=(s.as_str()) selected[status_filter == Some(s)] { (s.as_str()) } }
                }
            }
            label { "Thread" input type="text" name="thread" value=[thread]; }
            label { "Id" input type="text" name="id" value=[id]; }
            label { "Order"
                select name="order" {
                    option value="priority" selected[!newest] { "priority" }
                    option value="newest" selected[newest] { "newest" }
                }
            }
            button type="submit" { "Filter" }
            a href="/dispatches" { "Clear" }
        }
        @if truncated {
            p.muted { "Newest first among the first " (SCAN) " matches in priority order; narrow the filter to see the rest." }
        }
        (dispatch_table(&rows, now, None))
        nav.pager aria-label="Pages" {
            @if newest && page_no > 0 { a href={ "/dispatches?" (keep) "page=" (page_no - 1) } { "Previous page" } }
            @if !newest && paged { a href={ "/dispatches?" (keep) } { "First page" } }
            @if let Some(next) = &next { a href={ "/dispatches?" (keep) (next) } rel="next" { "Next page" } }
        }
    };
    Ok(html_response(view::page(
        "Dispatches",
        Nav::Dispatches,
        Some(&session),
        body,
    )))
}

/// `GET /dispatches/{id}`.
pub(super) async fn dispatch(
    State(d): PageState,
    headers: HeaderMap,
    uri: Uri,
    Path(id): Path<String>,
    query: Result<Query<Params>, QueryRejection>,
) -> Result<Response, PageError> {
    let session = d.session(&headers, &uri)?;
    name("id", &id)?;
    let p = params(query)?;
    let Some(r) = d.api.store.mailbox.load(&id).await? else {
        return Err(not_found("No such dispatch."));
    };
    let now = d.now();
    let href = dispatch_href(&r.id);
    let mut timeline: Vec<(u64, String)> = vec![(r.created_at, "enqueued".into())];
    if r.available_at > r.created_at {
        timeline.push((r.available_at, "available to claim".into()));
    }
    if let Some(t) = r.started_at {
        timeline.push((t, "run started".into()));
    }
    if let Some(claim) = &r.claim {
        timeline.push((
            claim.lease_until,
            format!("lease ends (held by {})", claim.claimed_by),
        ));
    }
    if let Some(t) = r.completed_at {
        timeline.push((t, format!("settled: {}", r.status)));
    }
    timeline.push((r.updated_at, "last changed".into()));
    timeline.sort_by_key(|(t, _)| *t);
    let live = !r.status.is_terminal();
    let body = html! {
        h1 { "Dispatch " span.mono { (r.id) } }
        (notice(p.notice.as_deref(), p.n.as_deref()))
        div #live hx-get=[live.then_some(href.as_str())] hx-trigger=[live.then_some("every 2s")] hx-select=[live.then_some("#live")] hx-swap=[live.then_some("outerHTML")] {
            dl.meta {
                dt { "Status" } dd #status { (status(r.status)) @if live { span.muted { " (refreshing)" } } }
                dt { "Agent" } dd { (r.agent) }
                dt { "Thread" } dd { a #thread-link href=(thread_href(&r.thread)) { (r.thread) } }
                dt { "Priority" } dd { (r.priority) }
                dt { "Attempts" } dd { (r.attempt) " failed of " (r.max_attempts) " allowed" }
                dt { "Epoch" } dd { (r.epoch) }
                dt { "Run id" } dd.mono { (r.run_id) }
                @if let Some(key) = &r.dedupe_key { dt { "Dedupe key" } dd.mono { (key) } }
                @if let Some(claim) = &r.claim {
                    dt { "Held by" } dd.mono { (claim.claimed_by) " (host " (stats::host_of(&claim.claimed_by)) ")" }
                }
                @if let Some(e) = &r.last_error { dt { "Last error" } dd #last-error { (e) } }
            }
            @if session.operator() {
                div.actions {
                    @if r.status == Status::Queued {
                        form method="post" action={ (href) "/cancel" } {
                            (csrf(&session))
                            button.danger #cancel type="submit" { "Cancel" }
                        }
                    }
                    @if matches!(r.status, Status::DeadLetter | Status::Cancelled) {
                        form method="post" action={ (href) "/retry" } {
                            (csrf(&session))
                            button #retry type="submit" { "Retry" }
                        }
                    }
                    @if live {
                        form method="post" action={ (thread_href(&r.thread)) "/interrupt" } {
                            (csrf(&session))
                            button.danger #interrupt type="submit" { "Interrupt thread" }
                        }
                    }
                }
            }
            h2 { "Attempts" }
            p {
                (r.attempt) " failed attempt(s) so far."
                @if let Some(claim) = &r.claim { " The current attempt is held by " span.mono { (claim.claimed_by) } "." }
                @if let Some(e) = &r.last_error { " The last error: " q { (e) } }
            }
            p.muted { "The store keeps the latest attempt of a dispatch (holder, start, error), not each one." }
            h2 { "Timeline" }
            ol.timeline {
                @for (t, what) in &timeline { li { (when(*t, now)) " — " (what) } }
            }
            @if let Some(result) = &r.result {
                h2 { "Result (" (result.status.as_str()) ")" }
                @if let Some(e) = &result.error { p #result-error { "Error: " (e) } }
                (bytes(&result.output, "result"))
            }
        }
        h2 { "Payload" }
        (bytes(&r.payload, "payload"))
        h2 { "Metadata" }
        @if r.metadata.is_empty() { p.muted { "none" } }
        @else {
            dl.meta #metadata {
                @for (k, v) in &r.metadata {
                    dt.mono { (k) }
                    dd.mono {
                        @if k == "retry-of" { a href=(dispatch_href(v)) { (v) } } @else { (v) }
                    }
                }
            }
        }
    };
    Ok(html_response(view::page(
        &format!("Dispatch {}", r.id),
        Nav::Dispatches,
        Some(&session),
        body,
    )))
}

fn see_other(location: String) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response()
}

/// `POST /dispatches/{id}/cancel`.
pub(super) async fn cancel(
    State(d): PageState,
    Path(id): Path<String>,
    Acting(session): Acting,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Result<Response, PageError> {
    Dashboard::csrf_ok(&session, &action_form(form).csrf, "cancel")?;
    name("id", &id)?;
    let r = work::cancel(&d.api.store, &id).await?;
    info!(dispatch = %r.id, token = %session.name, "cancelled from the dashboard");
    Ok(see_other(format!(
        "{}?notice=cancelled",
        dispatch_href(&r.id)
    )))
}

/// `POST /dispatches/{id}/retry`.
pub(super) async fn retry(
    State(d): PageState,
    Path(id): Path<String>,
    Acting(session): Acting,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Result<Response, PageError> {
    Dashboard::csrf_ok(&session, &action_form(form).csrf, "retry")?;
    name("id", &id)?;
    let r = work::retry(&d.api.config, &d.api.store, &id).await?;
    info!(dispatch = %id, new = %r.id, token = %session.name, "retried from the dashboard");
    Ok(see_other(format!(
        "{}?notice=retried",
        dispatch_href(&r.id)
    )))
}

/// `POST /threads/{thread}/interrupt`.
pub(super) async fn interrupt(
    State(d): PageState,
    Path(thread): Path<String>,
    Acting(session): Acting,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Result<Response, PageError> {
    Dashboard::csrf_ok(&session, &action_form(form).csrf, "interrupt")?;
    name("thread", &thread)?;
    let reason = format!("interrupted from the dashboard by {}", session.name);
    let done = d.api.store.mailbox.interrupt(&thread, &reason).await?;
    info!(%thread, epoch = done.epoch, superseded = done.superseded.len(), token = %session.name, "thread interrupted from the dashboard");
    Ok(see_other(format!(
        "{}?notice=interrupted",
        thread_href(&thread)
    )))
}

// ---- threads ----

/// `GET /threads/{thread}`.
pub(super) async fn thread(
    State(d): PageState,
    headers: HeaderMap,
    uri: Uri,
    Path(thread): Path<String>,
    query: Result<Query<Params>, QueryRejection>,
) -> Result<Response, PageError> {
    let session = d.session(&headers, &uri)?;
    name("thread", &thread)?;
    let p = params(query)?;
    let store = &d.api.store;
    let now = d.now();
    let epoch = store.mailbox.thread_epoch(&thread).await?;
    let latest = store.log.latest(&thread).await?;
    let from = latest.saturating_sub(LOG_SHOW as u64);
    let entries = store.log.read(&thread, from, LOG_SHOW).await?;
    let rows = store
        .mailbox
        .list_rows(&ListFilter {
            thread: Some(thread.clone()),
            limit: PAGE,
            ..ListFilter::default()
        })
        .await?;
    let href = thread_href(&thread);
    let body = html! {
        h1 { "Thread " span.mono { (thread) } }
        (notice(p.notice.as_deref(), p.n.as_deref()))
        @if session.operator() {
            div.actions {
                form method="post" action={ (href) "/interrupt" } {
                    (csrf(&session))
                    button.danger #interrupt type="submit" { "Interrupt thread" }
                }
            }
        }
        div #live hx-get=(href) hx-trigger="every 2s" hx-select="#live" hx-swap="outerHTML" {
            dl.meta {
                dt { "Epoch" } dd #epoch { (epoch) }
                dt { "Log entries" } dd { (latest) }
            }
            h2 { "Log" }
            p.muted { "Follows new entries (refreshes every 2 seconds)."
                @if latest > LOG_SHOW as u64 { " The latest " (LOG_SHOW) " of " (latest) " are shown." } }
            div.scroll {
                table #log {
                    thead { tr { th.num scope="col" { "Seq" } th scope="col" { "Appended" } th scope="col" { "Entry" } } }
                    tbody {
                        @for e in &entries {
                            tr data-seq=(e.seq) {
                                td.num { (e.seq) }
                                td { (when(e.appended_at, now)) }
                                td { pre { (entry_text(&e.data)) } }
                            }
                        }
                        @if entries.is_empty() { tr { td colspan="3" { span.muted { "No entries." } } } }
                    }
                }
            }
            h2 { "Dispatches" }
            (dispatch_table(&rows, now, None))
            @if rows.len() == PAGE {
                p { a href={ "/dispatches?thread=" (encode(&thread)) } { "All dispatches of this thread" } }
            }
        }
    };
    Ok(html_response(view::page(
        &format!("Thread {thread}"),
        Nav::None,
        Some(&session),
        body,
    )))
}

/// A log entry, shown as text or hex, cut at [`ENTRY_SHOW`] bytes.
fn entry_text(data: &[u8]) -> String {
    let text = match view::shown(&data[..data.len().min(ENTRY_SHOW)]) {
        view::Shown::Json(t) | view::Shown::Text(t) | view::Shown::Hex(t) => t,
    };
    if data.len() > ENTRY_SHOW {
        format!("{text}… ({} bytes in all)", data.len())
    } else {
        text
    }
}

// ---- dead letters ----

/// `GET /dead-letters?agent=&after=`.
pub(super) async fn dead_letters(
    State(d): PageState,
    headers: HeaderMap,
    uri: Uri,
    query: Result<Query<Params>, QueryRejection>,
) -> Result<Response, PageError> {
    let session = d.session(&headers, &uri)?;
    let p = params(query)?;
    let after = match nonblank(&p.after) {
        None => None,
        Some(c) => Some(
            c.parse::<ListCursor>()
                .map_err(|e| PageError::Status(StatusCode::BAD_REQUEST, e))?,
        ),
    };
    let agent = nonblank(&p.agent);
    if let Some(agent) = agent {
        name("agent", agent)?;
    }
    let rows = d
        .api
        .store
        .mailbox
        .list_rows(&ListFilter {
            agent: agent.map(str::to_owned),
            statuses: vec![Status::DeadLetter],
            limit: PAGE,
            after,
            ..ListFilter::default()
        })
        .await?;
    let now = d.now();
    let keep = agent
        .map(|a| format!("agent={}&", encode(a)))
        .unwrap_or_default();
    let next = (rows.len() == PAGE)
        .then(|| rows.last().map(|r| encode(&r.cursor().to_string())))
        .flatten();
    let operator = session.operator().then_some(&session);
    let body = html! {
        h1 { "Dead letters" @if let Some(a) = agent { " of " (a) } }
        (notice(p.notice.as_deref(), p.n.as_deref()))
        @if let Some(session) = operator {
            form method="post" action="/dead-letters/retry" {
                (csrf(session))
                div.actions { button #retry-selected type="submit" { "Retry selected" } }
                (dispatch_table(&rows, now, Some(session)))
            }
        } @else {
            (dispatch_table(&rows, now, None))
        }
        nav.pager aria-label="Pages" {
            @if let Some(next) = &next { a href={ "/dead-letters?" (keep) "after=" (next) } rel="next" { "Next page" } }
        }
    };
    Ok(html_response(view::page(
        "Dead letters",
        Nav::DeadLetters,
        Some(&session),
        body,
    )))
}

/// `POST /dead-letters/retry` with `csrf` and one `id` per selected dead letter.
pub(super) async fn retry_selected(
    State(d): PageState,
    Acting(session): Acting,
    form: Result<Form<Vec<(String, String)>>, FormRejection>,
) -> Result<Response, PageError> {
    let pairs = form.map(|Form(p)| p).unwrap_or_default();
    let csrf = pairs
        .iter()
        .find(|(k, _)| k == "csrf")
        .map_or("", |(_, v)| v.as_str());
    Dashboard::csrf_ok(&session, csrf, "retry selected")?;
    let ids: Vec<&str> = pairs
        .iter()
        .filter(|(k, _)| k == "id")
        .map(|(_, v)| v.as_str())
        .collect();
    if ids.is_empty() {
        return Ok(see_other("/dead-letters?notice=none-selected".into()));
    }
    if ids.len() > MAX_SELECTED {
        return Err(PageError::Status(
            StatusCode::BAD_REQUEST,
            format!("Select at most {MAX_SELECTED} at once."),
        ));
    }
    for id in &ids {
        name("id", id)?;
    }
    let mut retried = 0;
    for id in ids {
        match work::retry(&d.api.config, &d.api.store, id).await {
            Ok(r) => {
                retried += 1;
                info!(dispatch = %id, new = %r.id, token = %session.name, "retried from the dashboard");
            }
            // Retried already by someone else, or gone: the rest go on.
            Err(OpError::NotFound(_) | OpError::WrongState { .. }) => {}
            Err(OpError::Store(e)) => return Err(e.into()),
        }
    }
    Ok(see_other(format!(
        "/dead-letters?notice=retried-n&n={retried}"
    )))
}

// ---- agents ----

/// `GET /agents`.
pub(super) async fn agents(
    State(d): PageState,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, PageError> {
    let session = d.session(&headers, &uri)?;
    let loaded = d.api.agents.read().map(|a| a.clone()).unwrap_or_default();
    let body = html! {
        h1 { "Agents" }
        div.cards {
            @for (name, p) in &d.api.config.plugins {
                @let info = loaded.as_ref().and_then(|a| a.iter().find(|a| &a.name == name));
                @let world = info.map(|a| a.world);
                section.card data-agent=(name) {
                    h2 { (name) }
                    dl.meta {
                        dt { "World" } dd { @match world { Some(w) => (w), None => span.muted { "not loaded yet" } } }
                        dt { "Component SHA-256" }
                        dd.mono {
                            @match info {
                                Some(a) => (a.sha256),
                                None => span.muted { "not loaded yet" },
                            }
                        }
                        dt { "Concurrency" } dd { (p.concurrency) }
                        dt { "Memory" } dd { (p.memory) " bytes" }
                        dt { "Timeout" } dd { (age(p.timeout.as_millis() as u64)) }
                        dt { "Fuel" } dd { @match p.fuel { Some(f) => (f), None => "unlimited" } }
                        dt { "Max attempts" } dd { (p.max_attempts) }
                        dt { "Reuse instance" } dd { (p.reuse_instance) }
                        dt { "Environment" }
                        dd { @if p.env.is_empty() { span.muted { "none" } } @else {
                            @for (i, k) in p.env.keys().enumerate() { @if i > 0 { ", " } span.mono { (k) } }
                            span.muted { " (names only)" }
                        } }
                        dt { "Directories" }
                        dd { @if p.dirs.is_empty() { span.muted { "none" } } @else {
                            @for (i, dir) in p.dirs.iter().enumerate() { @if i > 0 { ", " } span.mono { (dir.guest) } @if dir.writable { " (writable)" } @else { " (read-only)" } }
                        } }
                        dt { "Outbound hosts" }
                        dd { @if p.allowed_hosts.is_empty() { span.muted { "none" } } @else { span.mono { (p.allowed_hosts.join(", ")) } } }
                        dt { "May enqueue to" }
                        dd { @if p.enqueue_to.is_empty() { span.muted { "none" } } @else { (p.enqueue_to.join(", ")) } }
                    }
                }
            }
        }
        p.muted { "The SHA-256 is of the component as this host loaded and runs it (the file may have changed since)." }
    };
    Ok(html_response(view::page(
        "Agents",
        Nav::Agents,
        Some(&session),
        body,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_local_paths_are_followed_after_login() {
        assert_eq!(local(Some("/dispatches?agent=a")), "/dispatches?agent=a");
        for bad in [
            "//evil.example/",
            "https://evil.example/",
            "/\\evil",
            "",
            "/\t/evil.example",
            "/\n/evil.example",
            "/\r\n/evil.example",
            "/ /evil.example",
            "/\u{7f}/evil.example",
            "/caf\u{e9}",
            "\\/evil.example",
        ] {
            assert_eq!(local(Some(bad)), "/", "{bad}");
        }
        assert_eq!(local(None), "/");
    }

    #[test]
    fn a_post_from_another_origin_is_refused() {
        let mut h = HeaderMap::new();
        h.insert(
            header::HOST,
            "127.0.0.1:7080"
                .parse()
                .unwrap_or(header::HeaderValue::from_static("x")),
        );
        assert!(same_origin(&h));
        h.insert(
            header::ORIGIN,
            header::HeaderValue::from_static("http://127.0.0.1:7080"),
        );
        assert!(same_origin(&h));
        h.insert(
            header::ORIGIN,
            header::HeaderValue::from_static("http://evil.example"),
        );
        assert!(!same_origin(&h));
        h.insert(
            header::ORIGIN,
            header::HeaderValue::from_static("http://127.0.0.1:7080"),
        );
        h.insert(
            "sec-fetch-site",
            header::HeaderValue::from_static("cross-site"),
        );
        assert!(!same_origin(&h));
    }
}

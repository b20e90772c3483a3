//! `/threads/{thread}`: a thread's epoch, its inbox (counts and pending messages), its latest
//! log entries (following new ones; those that record an acknowledged message say so) and its
//! dispatches; interrupting it (operator) and sending it a message (producer or operator).

use axum::Form;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use maud::{Markup, html};
use serde::Deserialize;
use tracing::info;

use super::super::session::Session;
use super::super::view::{self, Nav, csrf, dispatch_table, encode, notice, thread_href, when};
use super::{
    Acting, ActionForm, Dashboard, PAGE, PageError, PageState, Params, Producing, action_form,
    bad_request, name, params, respond, see_other,
};
use crate::store::{
    DispatchRow, InboxMarks, ListFilter, LogEntry, Message, MessageFilter, MessageKind,
    MessageState, NewMessage, Status, StoreError,
};
use crate::work::messages::{self, SendError};

/// Log entries a thread page shows (the latest).
const LOG_SHOW: usize = 200;
/// The most log entry bytes shown per entry.
const ENTRY_SHOW: usize = 4096;
/// Pending messages a thread page shows (the oldest).
const MESSAGES_SHOW: usize = 100;
/// The data one store read of the page takes in (at least one entry or message): each is cut
/// to [`ENTRY_SHOW`] as soon as it is read, so a page holds what it shows and one such read.
const READ_BYTES: usize = 256 << 10;

/// What the page of a thread shows.
struct ThreadPage {
    thread: String,
    epoch: u64,
    /// The sequence of its latest log entry: how many it has.
    latest: u64,
    /// The latest [`LOG_SHOW`] of them, each cut to [`ENTRY_SHOW`], with its whole size.
    entries: Vec<(LogEntry, usize)>,
    /// Its first [`PAGE`] dispatches in priority order.
    rows: Vec<DispatchRow>,
    /// Its inbox watermarks.
    inbox: InboxMarks,
    /// Its oldest [`MESSAGES_SHOW`] pending messages, each cut to [`ENTRY_SHOW`], with its
    /// whole size.
    pending: Vec<(Message, usize)>,
    /// Whether a run of the thread holds a claim now (else a steer waits for the next run).
    running: bool,
    /// The configured agents, for the send box.
    agents: Vec<String>,
    now: u64,
}

/// `GET /threads/{thread}`.
pub(super) async fn page(
    State(d): PageState,
    headers: HeaderMap,
    uri: Uri,
    Path(thread): Path<String>,
    query: Result<Query<Params>, QueryRejection>,
) -> Result<Response, PageError> {
    let session = d.session(&headers, &uri)?;
    name("thread", &thread)?;
    let p = params(query)?;
    let page = read(&d, thread).await?;
    Ok(respond(
        &format!("Thread {}", page.thread),
        Nav::None,
        &session,
        render(&page, &p, &session),
    ))
}

async fn read(d: &Dashboard, thread: String) -> Result<ThreadPage, PageError> {
    let store = &d.api.store;
    let now = d.now();
    let epoch = store.mailbox.thread_epoch(&thread).await?;
    let latest = store.log.latest(&thread).await?;
    let from = latest.saturating_sub(LOG_SHOW as u64);
    let mut entries = Vec::new();
    let mut after = from;
    while entries.len() < LOG_SHOW {
        let want = LOG_SHOW - entries.len();
        let read = store
            .log
            .read_within(&thread, after, want, READ_BYTES)
            .await?;
        let Some(last) = read.last().map(|e| e.seq) else {
            break;
        };
        after = last;
        entries.extend(read.into_iter().map(|mut e| {
            let size = e.data.len();
            e.data = shown_part(&e.data);
            (e, size)
        }));
    }
    let rows = store
        .mailbox
        .list_rows(&ListFilter {
            thread: Some(thread.clone()),
            limit: PAGE,
            ..ListFilter::default()
        })
        .await?;
    let inbox = store.inbox.inbox(&thread).await?;
    let mut pending = Vec::new();
    let mut after = 0;
    while inbox.pending > 0 && pending.len() < MESSAGES_SHOW {
        let read = store
            .inbox
            .messages(
                &thread,
                &MessageFilter {
                    state: Some(MessageState::Pending),
                    after,
                    limit: MESSAGES_SHOW - pending.len(),
                    max_bytes: Some(READ_BYTES),
                },
            )
            .await?;
        let Some(last) = read.last().map(|m| m.seq) else {
            break;
        };
        after = last;
        pending.extend(read.into_iter().map(|mut m| {
            let size = m.payload.len();
            m.payload = shown_part(&m.payload);
            (m, size)
        }));
    }
    let running = !store
        .mailbox
        .list_rows(&ListFilter {
            thread: Some(thread.clone()),
            statuses: vec![Status::Claimed],
            limit: 1,
            ..ListFilter::default()
        })
        .await?
        .is_empty();
    let agents = d.api.config().plugins.keys().cloned().collect();
    Ok(ThreadPage {
        thread,
        epoch,
        latest,
        entries,
        rows,
        inbox,
        pending,
        running,
        agents,
        now,
    })
}

fn render(page: &ThreadPage, p: &Params, session: &Session) -> Markup {
    let ThreadPage {
        thread,
        epoch,
        latest,
        entries,
        rows,
        inbox,
        pending,
        running,
        agents,
        now,
    } = page;
    let (latest, now) = (*latest, *now);
    let href = thread_href(thread);
    // The rollback marks among the shown entries (the latest ones, so a mark is shown with
    // every entry it masks).
    let masks: Vec<_> = entries
        .iter()
        .filter_map(|(e, _)| e.turn.as_ref().and_then(|t| t.masked))
        .collect();
    html! {
        h1 { "Thread " span.mono { (thread) } }
        (notice(p.notice.as_deref(), p.n.as_deref()))
        @if session.operator() {
            div.actions {
                form method="post" action={ (href) "/interrupt" } {
                    (csrf(session))
                    button.danger #interrupt type="submit" { "Interrupt thread" }
                }
            }
        }
        @if session.producer() {
            (send_box(&href, agents, session))
        }
        div #live hx-get=(href) hx-trigger="every 2s" hx-select="#live" hx-swap="outerHTML" {
            dl.meta {
                dt { "Epoch" } dd #epoch { (epoch) }
                dt { "Log entries" } dd { (latest) }
                dt { "Messages sent" } dd #inbox-latest { (inbox.latest) }
                dt { "Messages pending" } dd #inbox-pending { (inbox.pending) }
                dt { "Followed up through" } dd #inbox-followed { (inbox.followed) }
            }
            h2 { "Pending messages" }
            (pending_table(pending, inbox, *running, now))
            h2 { "Log" }
            p.muted { "Follows new entries (refreshes every 2 seconds)."
                @if latest > LOG_SHOW as u64 { " The latest " (LOG_SHOW) " of " (latest) " are shown." } }
            div.scroll {
                table #log {
                    thead { tr { th.num scope="col" { "Seq" } th scope="col" { "Appended" } th scope="col" { "Entry" } } }
                    tbody {
                        @for (e, size) in entries {
                            tr data-seq=(e.seq) data-message=[e.note.as_ref().map(|n| n.seq)] {
                                td.num { (e.seq) }
                                td { (when(e.appended_at, now)) }
                                td {
                                    @if let Some(turn) = &e.turn {
                                        p.note.muted {
                                            "Turn " (turn.event.as_str()) ": dispatch "
                                            a.mono href={ "/dispatches/" (encode(&turn.dispatch)) } { (turn.dispatch) }
                                            " stopped by message " (turn.message)
                                            @if let Some(m) = turn.masked {
                                                "; entries " (m.first) " to " (m.last) " masked"
                                            }
                                        }
                                    }
                                    @if masks.iter().any(|m| m.contains(e.seq)) {
                                        p.note.muted.masked { "Masked by a rollback: hidden from the next turns' history" }
                                    }
                                    @if let Some(note) = &e.note {
                                        p.note.muted {
                                            "Message " (note.seq) " (" (kind_label(note.kind)) ") from "
                                            span.mono { (note.sent_by) } ", acknowledged"
                                        }
                                    }
                                    pre { (entry_text(&e.data, *size)) }
                                }
                            }
                        }
                        @if entries.is_empty() { tr { td colspan="3" { span.muted { "No entries." } } } }
                    }
                }
            }
            h2 { "Dispatches" }
            (dispatch_table(rows, now, None))
            @if rows.len() == PAGE {
                p { a href={ "/dispatches?thread=" (encode(thread)) } { "All dispatches of this thread" } }
            }
        }
    }
}

/// How a message kind reads on the page.
fn kind_label(kind: MessageKind) -> &'static str {
    match kind {
        MessageKind::Steer => "steer",
        MessageKind::FollowUp => "follow-up",
    }
}

/// The send box: the text, its kind, the agent to answer it (optional).
fn send_box(href: &str, agents: &[String], session: &Session) -> Markup {
    html! {
        form #send.send method="post" action={ (href) "/messages" } {
            (csrf(session))
            label for="send-text" { "Message" }
            textarea #send-text name="text" rows="3" required {}
            div.row {
                label { "Kind "
                    select name="kind" {
                        option value="follow_up" selected { "follow-up (asks for a next turn)" }
                        option value="steer" { "steer (for the live run)" }
                    }
                }
                label { "If busy "
                    select name="on_busy" {
                        option value="" selected { "(the agent's policy)" }
                        option value="enqueue" { "enqueue (wait for the next turn)" }
                        option value="steer" { "steer (to the live run)" }
                        option value="reject" { "reject (refuse)" }
                        option value="interrupt" { "interrupt (stop the run)" }
                        option value="rollback" { "rollback (stop it, mask its entries)" }
                        option value="merge" { "merge (roll it back, hand its messages on)" }
                    }
                }
                label { "Agent "
                    select name="agent" {
                        option value="" selected { "(the thread's own)" }
                        @for agent in agents { option value=(agent) { (agent) } }
                    }
                }
                button #send-submit type="submit" { "Send" }
            }
        }
    }
}

/// The pending messages, oldest first, with a hint for a steer no run will read until the
/// next one starts.
fn pending_table(
    pending: &[(Message, usize)],
    inbox: &InboxMarks,
    running: bool,
    now: u64,
) -> Markup {
    html! {
        div.scroll {
            table #messages {
                thead { tr {
                    th.num scope="col" { "Seq" } th scope="col" { "Kind" } th scope="col" { "From" }
                    th scope="col" { "Sent" } th scope="col" { "Text" }
                } }
                tbody {
                    @for (m, size) in pending {
                        tr data-message=(m.seq) {
                            td.num { (m.seq) }
                            td {
                                (kind_label(m.kind))
                                @if m.kind == MessageKind::Steer && !running {
                                    br; span.muted.hint { "waiting for the next run" }
                                }
                                @if let Some(policy) = m.applied {
                                    br; span.muted.applied { "busy thread: " (policy.as_str()) }
                                }
                            }
                            td { span.mono { (m.sent_by) }
                                @if let Some(agent) = &m.agent { br; span.muted { "to " (agent) } } }
                            td { (when(m.sent_at, now)) }
                            td { pre { (entry_text(&m.payload, *size)) } }
                        }
                    }
                    @if pending.is_empty() { tr { td colspan="5" { span.muted { "No pending messages." } } } }
                }
            }
        }
        @if inbox.pending > pending.len() as u64 {
            p.muted { "The oldest " (pending.len()) " of " (inbox.pending) " pending messages are shown." }
        }
    }
}

/// The first [`ENTRY_SHOW`] bytes of `data`, in an allocation of their own: the whole is freed
/// at once (a large buffer cut in place would stay behind as a hole in the heap).
fn shown_part(data: &[u8]) -> Vec<u8> {
    data[..data.len().min(ENTRY_SHOW)].to_vec()
}

/// A log entry or message of `size` bytes, shown as text or hex, cut at [`ENTRY_SHOW`] bytes.
fn entry_text(data: &[u8], size: usize) -> String {
    let text = match view::shown(&data[..data.len().min(ENTRY_SHOW)]) {
        view::Shown::Json(t) | view::Shown::Text(t) | view::Shown::Hex(t) => t,
    };
    if size > ENTRY_SHOW {
        format!("{text}… ({size} bytes in all)")
    } else {
        text
    }
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

/// The send box's form.
#[derive(Debug, Default, Deserialize)]
pub(super) struct SendForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    text: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    agent: String,
    #[serde(default)]
    on_busy: String,
}

/// The notice a refused send goes back to the page with.
fn refusal(e: &SendError) -> &'static str {
    match e {
        SendError::UnknownAgent(_) => "message-unknown-agent",
        SendError::TooLarge { .. } => "message-too-large",
        SendError::Store(StoreError::Limit(_)) => "message-inbox-full",
        SendError::Store(StoreError::Busy { .. }) => "message-thread-busy",
        SendError::Store(StoreError::Invalid(why)) if why.starts_with("agent:") => {
            "message-needs-agent"
        }
        SendError::Store(StoreError::Invalid(why)) if why.starts_with("payload:") => {
            "message-too-large"
        }
        SendError::Store(_) => "message-refused",
    }
}

/// `POST /threads/{thread}/messages`: sends the send box's text into the thread's inbox, as
/// `dashboard:<token name>`, through the same checks as the API (the agent, the size,
/// `[host] max_inbox`), then back to the thread's page saying what happened.
pub(super) async fn send(
    State(d): PageState,
    Path(thread): Path<String>,
    Producing(session): Producing,
    form: Result<Form<SendForm>, FormRejection>,
) -> Result<Response, PageError> {
    name("thread", &thread)?;
    let back = |notice: &str, n: Option<u64>| {
        let n = n.map_or_else(String::new, |n| format!("&n={n}"));
        see_other(format!("{}?notice={notice}{n}", thread_href(&thread)))
    };
    let form = match form {
        Ok(Form(form)) => form,
        // Over the dashboard's form limit: the session and origin were checked; nothing is
        // stored, and the page says why.
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return Ok(back("message-too-large", None));
        }
        Err(_) => SendForm::default(),
    };
    Dashboard::csrf_ok(&session, &form.csrf, "send")?;
    let kind = match form.kind.as_str() {
        "" => MessageKind::FollowUp,
        kind => kind
            .parse()
            .map_err(|e: String| bad_request(format!("kind: {e}")))?,
    };
    let on_busy = match form.on_busy.as_str() {
        "" => None,
        policy => Some(
            policy
                .parse()
                .map_err(|e: String| bad_request(format!("on_busy: {e}")))?,
        ),
    };
    let agent = Some(form.agent.trim())
        .filter(|a| !a.is_empty())
        .map(str::to_owned);
    if let Some(agent) = &agent {
        name("agent", agent)?;
    }
    if form.text.trim().is_empty() {
        return Ok(back("message-empty", None));
    }
    let new = NewMessage {
        kind,
        payload: form.text.into_bytes(),
        metadata: Default::default(),
        agent,
        sent_by: format!("dashboard:{}", session.name),
        on_busy,
        follow_up_window: None,
    };
    match messages::send(&d.api.store, &d.api.config(), &thread, new).await {
        Ok(sent) => {
            info!(thread = %thread.escape_debug(), seq = sent.message.seq, token = %session.name, "message sent from the dashboard");
            let notice = if sent.follow_ups.is_empty() {
                "sent"
            } else {
                "sent-follow-up"
            };
            Ok(back(notice, Some(sent.message.seq)))
        }
        Err(SendError::Store(e))
            if !matches!(
                e,
                StoreError::Limit(_) | StoreError::Invalid(_) | StoreError::Busy { .. }
            ) =>
        {
            Err(e.into())
        }
        Err(e) => {
            info!(thread = %thread.escape_debug(), token = %session.name, "message from the dashboard refused: {e}");
            Ok(back(refusal(&e), None))
        }
    }
}

//! `/v1/dispatches/{id}/journal`: what a dispatch's runs recorded (readers). The view is
//! `work::journal`'s, shared with the CLI and the dashboard.
//!
//! Also the host's budget for reads whose size is set by stored data ([`reserve`]): the
//! journal routes, the waitpoint list and the dashboard's dispatch page each hold a bounded
//! number of bytes whatever the store holds (a page, or one entry), and take a share of
//! [`READ_BUDGET`] for it before they read, so concurrent readers of large data wait their
//! turn instead of multiplying what the process holds.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use serde_json::{Value, json};
use tokio::sync::{Semaphore, SemaphorePermit, oneshot};

use super::dispatches::{MAX_PAGE_BYTES, limit, name, param, params};
use super::{ApiError, ApiState};
use crate::store::journal::JournalAsk;
use crate::work::journal::{self, EntryView, JournalError, StepView};

type RawQuery = Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>;

/// The bytes that reads sized by stored data may hold at once in this process (every API and
/// dashboard route that takes a share with [`reserve`]), beside what each request holds
/// anyway. A read is sized before it is made: a page by its byte cap, one journal entry by
/// its body's stored size.
pub(crate) const READ_BUDGET: usize = 32 << 20;

/// The unit of [`READ_BUDGET`]'s shares.
const SHARE_UNIT: usize = 1 << 10;

/// [`READ_BUDGET`] in shares: one process-wide budget (a host runs one API), handed out in
/// the order asked (tokio's semaphore is fair).
static READS: Semaphore = Semaphore::const_new(READ_BUDGET / SHARE_UNIT);

/// The share of a list page sized by [`MAX_PAGE_BYTES`] (the journal's, the waitpoints'):
/// what the store may hold of the page (and the copy the database makes of the record being
/// read), the JSON of the record being written and the page's JSON.
pub(crate) const PAGE_SHARE: usize = 4 * MAX_PAGE_BYTES;

/// The largest body whose entry is read without asking its size first: the store's own bound
/// on a body stands for it (a NATS store's bodies fit one message). Beyond it, the entry's
/// summary gives the body's size.
const SIZED_BY_STORE: u64 = 8 << 20;

/// A share of [`READ_BUDGET`] for a read that holds up to `bytes`, waited for in turn and held
/// while the read and its answer's encoding hold memory. A read over the whole budget takes
/// it all and goes alone.
///
/// # Errors
///
/// Never in practice: the budget is never closed.
pub(crate) async fn reserve(bytes: usize) -> Result<SemaphorePermit<'static>, ApiError> {
    let shares = bytes
        .div_ceil(SHARE_UNIT)
        .clamp(1, READ_BUDGET / SHARE_UNIT);
    READS
        .acquire_many(u32::try_from(shares).unwrap_or(u32::MAX))
        .await
        .map_err(|_| ApiError::busy("the host is shutting down"))
}

/// What reading and encoding an entry whose body takes `body` bytes holds: the body, the copy
/// the database makes of it while it is read, its encoding (base64 is four bytes for three)
/// and the rest of the entry.
pub(crate) fn entry_share(body: u64) -> usize {
    let body = usize::try_from(body).unwrap_or(usize::MAX);
    body.saturating_mul(2)
        .saturating_add(body.div_ceil(3).saturating_mul(4))
        .saturating_add(64 << 10)
}

/// Bytes of an answer written to hyper at a time by [`held_json`].
const ANSWER_CHUNK: usize = 256 << 10;

/// A JSON answer whose share of the read budget is held until the answer is sent, so answers
/// written faster than clients read them do not pile up past the budget; but no longer than
/// `hold` (the request's time): a client that stops reading does not keep the share.
pub(crate) fn held_json(
    document: Vec<u8>,
    share: SemaphorePermit<'static>,
    hold: Duration,
) -> Response {
    let (sent, done) = oneshot::channel::<()>();
    // The share goes when the body is dropped (its sender with it) or `hold` passes.
    tokio::spawn(async move {
        let _share = share;
        let _ = tokio::time::timeout(hold, done).await;
    });
    let body = HeldBody {
        data: Bytes::from(document),
        _sent: sent,
    };
    (
        [(header::CONTENT_TYPE, "application/json")],
        Body::new(body),
    )
        .into_response()
}

/// An answer's bytes, handed out a chunk at a time; dropping it ends its share's hold.
struct HeldBody {
    data: Bytes,
    _sent: oneshot::Sender<()>,
}

impl http_body::Body for HeldBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if this.data.is_empty() {
            return Poll::Ready(None);
        }
        let chunk = this.data.split_to(this.data.len().min(ANSWER_CHUNK));
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.len() as u64)
    }
}

impl From<JournalError> for ApiError {
    fn from(e: JournalError) -> ApiError {
        match e {
            JournalError::NoDispatch(id) => ApiError::not_found(format!("no dispatch `{id}`")),
            e @ JournalError::NoEntry { .. } => ApiError::not_found(e.to_string()),
            JournalError::Store(e) => e.into(),
        }
    }
}

/// A position from a path or a query: 400 naming `field` unless it is a `u32`.
fn position(field: &str, text: &str) -> Result<u32, ApiError> {
    text.parse::<u32>().map_err(|_| {
        ApiError::invalid(
            field,
            format!("{field}: must be a journal position (an integer from 0)"),
        )
    })
}

/// `GET /v1/dispatches/{id}/journal?after=&limit=`: a page of the call entries after position
/// `after` (from the start without it), without bodies, and `next_cursor` (the `after` of the
/// next page) when there may be more; the first page (no `after`) also lists the steps, by
/// key, without values (`more_steps` when some were left out: at most a quarter of the page
/// goes to them). 404 for an unknown dispatch; a dispatch without a journal has empty lists.
///
/// The store reads the page only ([`crate::store::Journal::journal_page`]): no body, at most
/// [`MAX_PAGE_BYTES`] of entries, under a [`PAGE_SHARE`] of the read budget.
pub(super) async fn list(
    State(state): State<Arc<ApiState>>,
    Path(id): Path<String>,
    query: RawQuery,
) -> Result<Json<Value>, ApiError> {
    name("id", &id)?;
    let pairs = params(query, &["after", "limit"])?;
    let limit = limit(&pairs)?;
    let after = param(&pairs, "after")
        .map(|text| position("after", text))
        .transpose()?;
    let _share = reserve(PAGE_SHARE).await?;
    let ask = JournalAsk {
        after,
        limit,
        max_bytes: MAX_PAGE_BYTES,
        max_step_bytes: if after.is_none() {
            MAX_PAGE_BYTES / 4
        } else {
            0
        },
    };
    let page = journal::page(&state.store, &id, &ask).await?;
    // The steps first (their share of the page), then the entries in what is left: a page
    // stops before passing the byte cap; the next starts after its last entry.
    let mut bytes = 0;
    let steps: Vec<Value> = page
        .steps
        .iter()
        .map(|s| {
            let v = json!(StepView::of(s));
            bytes += v.to_string().len() + 1;
            v
        })
        .collect();
    let mut entries = Vec::new();
    let mut cut = false;
    let mut last = None;
    for call in &page.calls {
        let v = json!(EntryView::of_summary(call));
        let size = v.to_string().len();
        if !entries.is_empty() && bytes + size > MAX_PAGE_BYTES {
            cut = true;
            break;
        }
        bytes += size + 1;
        entries.push(v);
        last = Some(call.entry.pos);
    }
    let next = (cut || page.more).then_some(last).flatten();
    let mut out = json!({
        "dispatch": id,
        "entries": entries,
        "next_cursor": next,
        "bytes": page.bytes,
    });
    if after.is_none()
        && let Value::Object(map) = &mut out
    {
        map.insert("steps".into(), Value::Array(steps));
        map.insert("more_steps".into(), json!(page.more_steps));
    }
    Ok(Json(out))
}

/// `GET /v1/dispatches/{id}/journal/{pos}`: one call entry with its whole answer and its body
/// (text, or base64 with `"encoding": "base64"`). 404 for an unknown dispatch or position.
///
/// The store reads that one entry; its share of the read budget is its body's size (asked
/// first when the store's bound on a body is large) with its encoding, held until the answer
/// is sent ([`held_json`]; the body itself is dropped once encoded).
pub(super) async fn entry(
    State(state): State<Arc<ApiState>>,
    Path((id, pos)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    name("id", &id)?;
    let pos = position("pos", &pos)?;
    let bound = state.store.journal.max_body();
    let body = if bound <= SIZED_BY_STORE {
        bound
    } else {
        journal::summary(&state.store, &id, pos)
            .await?
            .body_size
            .unwrap_or(0)
    };
    let share = reserve(entry_share(body)).await?;
    let entry = journal::entry(&state.store, &id, pos).await?;
    let document = journal::entry_document(entry);
    Ok(held_json(
        document,
        share,
        state.config().api.request_timeout,
    ))
}

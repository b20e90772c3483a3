//! The one place the NATS backend follows a dispatch's change of status: [`applied`] turns the
//! rules' verdict (`rules::effects`) into the writes of one atomic batch beside the record. The
//! thread's holder and lanes are derived from the records by every view, so a release or a
//! lane refresh writes nothing here; the end of the pending waitpoints (W4) goes in the batch
//! of every record that ends a dispatch (`commit::record_writes`, by `rules::waitpoints_end`);
//! the inbox's follow-ups (M4 b) go in it when the verdict says so.

use super::commit::{Write, put_dispatch};
use super::inbox::{Answer, answer_inbox, follow_up_writes};
use super::view::{Stored, View};
use crate::store::StoreResult;
use crate::store::model::Status;
use crate::store::rules;

/// What a change of status writes, and whether this host's claimers wake after it.
pub(super) struct Applied {
    /// The record with its effects, fenced by its thread's tree: one atomic batch.
    pub writes: Vec<Write>,
    /// Whether work may have become claimable.
    pub wake: bool,
}

/// The writes of `stored`, a dispatch that went from `before` to its status now, with the
/// effects of that change. `None` when the verdict asks for the inbox to be answered and the
/// view does not hold the thread's live work (a client's read of one record): the caller reads
/// the whole thread and decides again.
pub(super) fn applied(
    view: &View,
    before: Status,
    stored: Stored,
    now: u64,
) -> StoreResult<Option<Applied>> {
    let e = rules::effects(before, stored.dispatch.status);
    let d = e.answer_inbox.then(|| stored.dispatch.clone());
    let mut writes = put_dispatch(view, stored)?;
    let mut wake = e.wake_claimers;
    if let Some(d) = d {
        match answer_inbox(view, &d, now)? {
            Answer::Nothing => {}
            Answer::NeedThread => return Ok(None),
            Answer::FollowUps(follow_ups, rec) => {
                writes.extend(follow_up_writes(&d.thread, follow_ups, rec)?);
                wake = true;
            }
        }
    }
    Ok(Some(Applied { writes, wake }))
}

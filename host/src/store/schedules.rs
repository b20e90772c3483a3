//! The schedules' records in the store (the contract, section 16): one record per schedule,
//! written whole under a compare-and-set of its revision, so that two hosts' ticks (or a tick
//! and an operator) never both move one schedule forward. What a schedule fires and when is
//! decided by the rules (`rules::schedules`) and done by the host's ticks (`crate::schedules`)
//! through the mailbox; a backend only keeps the records.

use std::fmt;

use async_trait::async_trait;

use super::StoreResult;
pub use super::model::schedules::{
    Catchup, CatchupPolicy, DEFAULT_MAX_BUFFERED, Dst, FireKind, Fold, Gap, Outcome, Overlap,
    Schedule, ScheduleDef, SchedulePause, SkipReason, Source, Spec, ThreadChoice,
};
/// The rules a caller of the store sees: a schedule's fire times, the ids of its dispatches
/// and ticks, and what its declaration must be.
pub use super::rules::schedules::{
    Cron, META_FIRE, META_SCHEDULE, META_SCHEDULED_FOR, Plan, check, check_schedule_name,
    dispatch_id, due, fire_label, fire_thread, local_label, tick_id, tick_thread, zone,
};

/// A schedule as stored, with the revision a later write expects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// The record.
    pub schedule: Schedule,
    /// Its revision: changes with every write, never 0.
    pub revision: u64,
}

/// The records of schedules. Every method is atomic across every instance of the backend; none
/// panics on any input or stored state.
#[async_trait]
pub trait Schedules: Send + Sync + fmt::Debug + 'static {
    /// The schedule named `name`.
    async fn schedule(&self, name: &str) -> StoreResult<Option<Stored>>;

    /// Schedules by name after `after`, at most `limit` (0: the default page) and, with
    /// `max_bytes`, ending at the record that brings their stored bytes to it (the first is
    /// always taken): a page holds at most its budget and one record.
    async fn schedules(
        &self,
        after: Option<&str>,
        limit: usize,
        max_bytes: Option<usize>,
    ) -> StoreResult<Vec<Stored>>;

    /// Stores `schedule` when its stored revision is `expect` (0: when there is none), and
    /// returns the new revision.
    ///
    /// # Errors
    ///
    /// `Contention` when the stored revision is another (someone wrote it first: read it again
    /// and decide again); `Invalid` when the record cannot be stored.
    async fn put_schedule(&self, schedule: &Schedule, expect: u64) -> StoreResult<u64>;

    /// Deletes the schedule named `name` (when its revision is `expect`, if given); `false`
    /// when there was none.
    ///
    /// # Errors
    ///
    /// `Contention` when the stored revision is another.
    async fn delete_schedule(&self, name: &str, expect: Option<u64>) -> StoreResult<bool>;
}

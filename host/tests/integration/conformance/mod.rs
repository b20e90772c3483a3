//! The store conformance suite (the contract, docs/contract.md, sections 1 to 4 and 9 to 13),
//! generic over a backend [`Factory`].
//!
//! Every test is a `pub async fn name<F: Factory>(factory: &F)` (or a plain `fn` for the property
//! tests, which drive their own runtime). A backend instantiates the whole suite with one line
//! in a module of its own:
//!
//! ```ignore
//! crate::conformance::suite!(file = EmbeddedStore::open);
//! ```
//!
//! which generates, in that module, one `#[tokio::test]` per suite function, named after it.
//! The module's path must contain `conformance` (`embedded_conformance`, `nats_conformance`)
//! so that `cargo test conformance` runs exactly the suites.
//!
//! Time only moves through the [`ManualClock`] of each test's [`Env`]; nothing sleeps.
//!
//! Each test's name says the behaviour it pins; docs/test-names.md maps the tests that guard a
//! particular defect or guarantee to it.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use homing::store::{
    Dispatch, ListFilter, ManualClock, NewDispatch, SharedClock, Status, Store, StoreError,
    StoreResult,
};

pub mod concurrency;
pub mod dedupe;
pub mod deltas;
pub mod fencing;
pub mod inbox;
pub mod journal;
pub mod limits;
pub mod log;
pub mod mailbox;
pub mod maintenance;
pub mod model;
pub mod ordering;
pub mod records;
pub mod schedules;
pub mod waitpoints;
pub mod window;

/// Makes fresh, empty backends and opens instances on them.
///
/// `create` yields the data of one test (a temp file, a NATS prefix, ...); `open` opens an
/// instance on it. Opening the same data again gives another instance sharing the data: another
/// host, or the same host after a restart once the earlier instances are dropped.
pub trait Factory: Send + Sync + 'static {
    /// What keeps one test's data alive (dropped at the end of the test).
    type Data: Send + Sync + 'static;

    /// Fresh, empty data.
    fn create(&self) -> impl Future<Output = Self::Data> + Send;

    /// Opens an instance on `data` reading `clock`.
    fn open(
        &self,
        data: &Self::Data,
        clock: SharedClock,
    ) -> impl Future<Output = StoreResult<Store>> + Send;
}

/// A factory for backends kept in one file: a fresh temp directory per test.
pub struct FileBacked<O> {
    open: O,
}

impl<O> FileBacked<O>
where
    O: Fn(&Path, SharedClock) -> StoreResult<Store> + Send + Sync + 'static,
{
    /// A factory opening the store file with `open`.
    pub fn new(open: O) -> Self {
        FileBacked { open }
    }
}

impl<O> Factory for FileBacked<O>
where
    O: Fn(&Path, SharedClock) -> StoreResult<Store> + Send + Sync + 'static,
{
    type Data = tempfile::TempDir;

    async fn create(&self) -> tempfile::TempDir {
        tempfile::tempdir().expect("create a temp dir")
    }

    async fn open(&self, data: &tempfile::TempDir, clock: SharedClock) -> StoreResult<Store> {
        (self.open)(&data.path().join("homing-store.db"), clock)
    }
}

/// The start of every test's clock (a realistic Unix-millisecond time).
pub const T0: u64 = 1_700_000_000_000;
/// The agent most tests use.
pub const AGENT: &str = "agent";
/// The consumer most tests claim as.
pub const WORKER: &str = "worker-1";
/// The lease most tests claim with.
pub const LEASE: u64 = 30_000;

/// One test's backend: its data, its clock, and the factory to open instances.
pub struct Env<'f, F: Factory> {
    factory: &'f F,
    data: F::Data,
    /// The clock every instance of this env reads.
    pub clock: Arc<ManualClock>,
}

impl<'f, F: Factory> Env<'f, F> {
    /// A fresh, empty backend with the clock at [`T0`].
    pub async fn new(factory: &'f F) -> Self {
        let data = factory.create().await;
        Env {
            factory,
            data,
            clock: ManualClock::new(T0),
        }
    }

    /// Opens an instance (another host when earlier ones are still open).
    pub async fn open(&self) -> Store {
        let clock: SharedClock = self.clock.clone();
        self.factory
            .open(&self.data, clock)
            .await
            .expect("open a store instance")
    }

    /// Opens `n` instances on the same data.
    pub async fn open_many(&self, n: usize) -> Vec<Store> {
        let mut stores = Vec::with_capacity(n);
        for _ in 0..n {
            stores.push(self.open().await);
        }
        stores
    }

    /// The clock's time.
    pub fn now(&self) -> u64 {
        homing::store::Clock::now_ms(&*self.clock)
    }

    /// Moves the clock forward.
    pub fn advance(&self, ms: u64) {
        self.clock.advance(ms);
    }

    /// Sets the clock.
    pub fn set(&self, now: u64) {
        self.clock.set(now);
    }
}

/// A submission for [`AGENT`] on `thread` with the id `id` (payload = the id).
pub fn nd(thread: &str, id: &str) -> NewDispatch {
    NewDispatch::new(AGENT, thread, format!("payload of {id}").into_bytes()).with_id(id)
}

/// Enqueues `new`, which must succeed.
pub async fn put(store: &Store, new: NewDispatch) -> Dispatch {
    let id = new.id.clone();
    match store.mailbox.enqueue(new).await {
        Ok(dispatch) => dispatch,
        Err(err) => panic!("enqueue of {id:?} failed: {err}"),
    }
}

/// Enqueues a default dispatch `id` on `thread`.
pub async fn put_on(store: &Store, thread: &str, id: &str) -> Dispatch {
    put(store, nd(thread, id)).await
}

/// A claim for [`AGENT`] as [`WORKER`] with [`LEASE`], started, under `limits` (what a
/// worker asks for with its completion, `complete_and_claim`).
pub fn next_claim(limits: &homing::store::LimitSet) -> homing::store::ClaimRequest<'_> {
    homing::store::ClaimRequest {
        agent: AGENT,
        consumer: WORKER,
        lease_ms: LEASE,
        start: true,
        limits,
        offer: None,
    }
}

/// Claims for [`AGENT`] as [`WORKER`] with [`LEASE`].
pub async fn claim(store: &Store) -> Option<Dispatch> {
    store
        .mailbox
        .claim(AGENT, WORKER, LEASE)
        .await
        .expect("claim")
}

/// Claims for [`AGENT`]; something must be available.
pub async fn claim_some(store: &Store) -> Dispatch {
    claim(store)
        .await
        .expect("claim returned nothing, expected a dispatch")
}

/// Claims dispatch `id` by id; it must succeed.
pub async fn claim_id(store: &Store, id: &str) -> Dispatch {
    store
        .mailbox
        .claim_dispatch(id, WORKER, LEASE)
        .await
        .expect("claim_dispatch")
        .unwrap_or_else(|| panic!("claim_dispatch({id}) returned nothing"))
}

/// The claim token of a claimed dispatch.
pub fn tok(dispatch: &Dispatch) -> String {
    dispatch
        .token()
        .unwrap_or_else(|| panic!("dispatch {} has no claim token", dispatch.id))
        .to_owned()
}

/// The stored record, which must exist.
pub async fn load(store: &Store, id: &str) -> Dispatch {
    store
        .mailbox
        .load(id)
        .await
        .expect("load")
        .unwrap_or_else(|| panic!("dispatch {id} is not stored"))
}

/// Every stored dispatch, in list order.
pub async fn all(store: &Store) -> Vec<Dispatch> {
    store
        .mailbox
        .list(&ListFilter {
            limit: 100_000,
            ..ListFilter::default()
        })
        .await
        .expect("list")
}

/// Every stored dispatch in one status.
pub async fn all_in(store: &Store, status: Status) -> Vec<Dispatch> {
    store
        .mailbox
        .list(&ListFilter {
            statuses: vec![status],
            limit: 100_000,
            ..ListFilter::default()
        })
        .await
        .expect("list")
}

/// Asserts the shape rules of the contract (docs/contract.md) section 1.
pub fn assert_shape(dispatch: &Dispatch) {
    if let Err(err) = dispatch.check_shape() {
        panic!("shape rule broken: {err}\n{dispatch:#?}");
    }
    match dispatch.status {
        Status::Queued | Status::Waiting => {
            assert!(dispatch.claim.is_none(), "queued with claim: {dispatch:#?}");
            assert!(
                dispatch.started_at.is_none(),
                "queued with started_at: {dispatch:#?}"
            );
            assert!(
                dispatch.result.is_none(),
                "queued with result: {dispatch:#?}"
            );
            assert!(
                dispatch.completed_at.is_none(),
                "queued with completed_at: {dispatch:#?}"
            );
        }
        Status::Claimed => {
            assert!(
                dispatch.claim.is_some(),
                "claimed without claim: {dispatch:#?}"
            );
            assert!(
                dispatch.completed_at.is_none(),
                "claimed with completed_at: {dispatch:#?}"
            );
        }
        _ => {
            assert!(
                dispatch.claim.is_none(),
                "terminal with claim: {dispatch:#?}"
            );
            assert!(
                dispatch.completed_at.is_some(),
                "terminal without completed_at: {dispatch:#?}"
            );
        }
    }
    assert!(
        dispatch.attempt <= dispatch.max_attempts,
        "attempt above max: {dispatch:#?}"
    );
}

/// `n` bytes that are not UTF-8 (the top bits set every seventh byte), varied by `salt`.
pub fn binary(n: usize, salt: u8) -> Vec<u8> {
    (0..n)
        .map(|i| ((i * 31 + usize::from(salt)) % 251) as u8 | if i % 7 == 0 { 0xC0 } else { 0 })
        .collect()
}

/// Asserts an `Invalid` refusal naming `field`, the size refused and the limit.
pub fn expect_too_large<T: std::fmt::Debug>(
    result: StoreResult<T>,
    field: &str,
    size: usize,
    limit: u64,
) {
    match result {
        Err(StoreError::Invalid(message)) => assert!(
            message.starts_with(&format!("{field}: {size} bytes"))
                && message.contains(&format!("limit of {limit} bytes")),
            "the refusal must name {field}, {size} and {limit}: {message}"
        ),
        other => panic!("{field} of {size} bytes (limit {limit}): expected Invalid, got {other:?}"),
    }
}

/// Runs `op` again while the backend reports `Contention` (the contract's "retry later").
pub async fn retry<T, Fut, Op>(mut op: Op) -> StoreResult<T>
where
    Op: FnMut() -> Fut,
    Fut: Future<Output = StoreResult<T>>,
{
    for _ in 0..100_000 {
        match op().await {
            Err(StoreError::Contention(_)) => tokio::task::yield_now().await,
            other => return other,
        }
    }
    op().await
}

/// Generates `#[tokio::test]`s calling the async suite functions.
#[doc(hidden)]
macro_rules! __async_tests {
    ($factory:expr; $($module:ident :: { $($test:ident),* $(,)? }),* $(,)?) => {
        $($(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $test() {
                let factory = $factory;
                $crate::conformance::$module::$test(&factory).await;
            }
        )*)*
    };
}
pub(crate) use __async_tests;

/// Generates plain `#[test]`s calling the synchronous suite functions (property tests).
#[doc(hidden)]
macro_rules! __sync_tests {
    ($factory:expr; $($module:ident :: { $($test:ident),* $(,)? }),* $(,)?) => {
        $($(
            #[test]
            fn $test() {
                let factory = $factory;
                $crate::conformance::$module::$test(&factory);
            }
        )*)*
    };
}
pub(crate) use __sync_tests;

/// Instantiates the whole suite for one backend, as tests in the calling module:
///
/// - `suite!(factory_expression)` for any [`Factory`];
/// - `suite!(file = open_fn)` for a backend kept in one file, where
///   `open_fn(&Path, SharedClock) -> StoreResult<B>` and `B::store(&self) -> Store` (a fresh temp
///   file per test; opening it again gives another instance on the same data).
///
/// The calling module's path must contain `conformance` (so `cargo test conformance` selects
/// the suites).
macro_rules! suite {
    (file = $open:path) => {
        $crate::conformance::suite! {
            $crate::conformance::FileBacked::new(|path, clock| $open(path, clock).map(|s| s.store()))
        }
    };
    ($factory:expr) => {
            $crate::conformance::__async_tests! { $factory;
                records::{
                    status_terminality_matches_spec,
                    status_names_round_trip_through_text_and_json,
                    dispatch_json_round_trip_preserves_every_field,
                    run_result_and_interrupt_json_round_trip,
                    stored_dispatch_preserves_submitted_fields,
                    enqueue_mints_uuid_v7_and_run_id_defaults_to_id,
                    every_status_survives_reload_and_restart,
                    claim_fields_present_exactly_when_claimed,
                    store_stamps_times_from_its_clock,
                    claims_count_every_claim_and_survive_reopening,
                    settling_writes_add_their_usage_once_and_it_survives_reopening,
                },
                mailbox::{
                    chosen_id_equal_to_a_settled_minted_id_is_a_duplicate,
                    enqueued_dispatch_is_listed_for_its_thread_as_queued,
                    claim_returns_dispatch_claimed_with_token_consumer_and_lease,
                    claim_with_nothing_available_is_none,
                    claim_started_claims_and_records_the_start_in_one_step,
                    claim_only_takes_dispatches_of_its_agent,
                    ack_settles_as_acked_and_clears_claim_fields,
                    claim_and_ack_do_not_count_attempts,
                    nack_with_attempts_left_requeues_at_retry_at_without_projection,
                    nack_at_max_attempts_dead_letters,
                    nack_with_past_retry_at_is_claimable_at_once,
                    nack_with_future_retry_at_blocks_claim_until_then_but_not_claim_dispatch,
                    dead_letter_settles_with_reason_and_keeps_attempt,
                    complete_records_result_and_acks_in_one_step,
                    record_start_and_result_keep_dispatch_claimed_and_survive_ack,
                    holder_ops_on_missing_dispatch_are_not_found,
                    holder_ops_on_queued_dispatch_are_not_claimed_and_change_nothing,
                    cancel_of_queued_dispatch_returns_it_cancelled,
                    cancel_of_claimed_dispatch_is_none_and_leaves_it_claimed,
                    cancel_of_missing_or_terminal_dispatch_is_none,
                    claim_dispatch_claims_by_id,
                    claim_dispatch_ignores_available_at_but_claim_respects_it,
                    claim_dispatch_of_cancelled_or_missing_dispatch_is_none,
                    extend_lease_sets_lease_to_now_plus_extension,
                    extend_lease_with_wrong_token_is_false_and_changes_nothing,
                    extend_lease_of_missing_or_unclaimed_dispatch_is_false,
                    has_live_work_tracks_queued_and_claimed,
                    queued_threads_lists_exactly_threads_with_queued_work,
                    counts_track_statuses_per_agent_without_zero_rows,
                    list_rows_are_the_list_without_payloads,
                    list_filters_by_thread_agent_status_and_pages,
                    list_orders_by_priority_then_created_at_then_id,
                    list_terminal_returns_oldest_completion_first_and_pages,
                    work_signal_fires_on_enqueue_settle_and_reclaim,
                    enqueue_with_attempt_at_or_above_max_attempts_is_invalid,
                    enqueue_with_zero_max_attempts_is_invalid,
                    enqueue_with_blank_or_oversized_fields_is_invalid,
                    resubmission_with_attempts_used_dead_letters_at_max_without_overflow,
                    enqueue_same_id_different_content_is_duplicate,
                    enqueue_same_id_same_content_returns_existing_record,
                    reenqueue_of_claimed_dispatch_never_resets_it,
                    reenqueue_of_terminal_dispatch_never_requeues_it,
                    enqueue_without_id_creates_distinct_dispatches,
                    busy_thread_blocks_claims_of_other_agents_on_it,
                    no_operation_panics_on_extreme_inputs,
                    values_over_the_backends_limit_are_invalid_naming_it,
                    binary_values_at_the_backends_limit_round_trip,
                    long_error_texts_are_kept_cut_to_the_error_text_limit,
                },
                ordering::{
                    claim_skips_dispatch_until_its_available_at,
                    lower_priority_number_wins_over_older_dispatch,
                    same_priority_is_claimed_oldest_first,
                    same_priority_and_age_is_claimed_lowest_id_first,
                    three_priorities_are_claimed_in_order,
                    busy_thread_blocks_its_other_dispatches_until_ack,
                    claims_on_different_threads_are_independent,
                    claim_dispatch_of_sibling_on_busy_thread_is_none,
                    claim_prefers_most_urgent_dispatch_across_threads,
                    delayed_urgent_dispatch_does_not_block_available_sibling,
                    fairness_lone_dispatch_waits_at_most_one_claim_behind_a_thousand,
                    fairness_lone_dispatch_waits_at_most_one_claim_per_competing_thread,
                    busy_threads_of_equal_priority_are_served_round_robin,
                    priority_outranks_fairness,
                    claim_follows_priority_across_instances,
                    clock_stepping_back_releases_nothing_before_its_available_at,
                    clock_stepping_back_holds_a_dispatch_already_found_due,
                },
                fencing::{
                    ack_with_wrong_token_is_lost_claim_and_changes_nothing,
                    holder_ops_with_wrong_token_are_lost_claim_and_change_nothing,
                    ack_with_stale_epoch_supersedes_and_is_rejected,
                    every_holder_op_with_stale_epoch_supersedes_and_is_rejected,
                    extend_lease_after_interrupt_is_false_and_supersedes,
                    stale_epoch_holder_op_frees_the_thread_at_once,
                    settling_frees_the_thread_at_once_despite_long_lease,
                    interrupt_supersedes_every_queued_dispatch_of_thread_with_reason,
                    interrupt_reports_claimed_dispatch_as_active_and_leaves_it_claimed,
                    thread_epoch_starts_at_zero_and_follows_interrupts,
                    interrupt_of_idle_thread_bumps_epoch_only,
                    enqueue_after_interrupt_stamps_new_epoch_and_is_claimable,
                    stale_claimed_dispatch_keeps_thread_blocked_until_superseded,
                    supersede_claimed_by_holder_terminalizes_with_reason,
                    supersede_claimed_by_control_plane_needs_no_token,
                    supersede_claimed_with_wrong_token_is_lost_claim_and_changes_nothing,
                    supersede_claimed_of_queued_missing_or_terminal_dispatch_is_none,
                    repeated_ack_with_same_token_succeeds_and_changes_nothing,
                    repeated_settle_ops_are_idempotent_per_token,
                    settled_dispatch_refuses_other_ops_and_other_tokens,
                    old_owner_loses_after_reclaim_and_new_owner_acks,
                    old_token_after_reclaim_is_not_claimed,
                    ack_after_lease_ran_out_but_before_reclaim_settles,
                    append_with_live_fence_succeeds,
                    append_with_wrong_token_is_lost_claim,
                    append_after_settle_is_not_claimed,
                    append_after_interrupt_is_stale_epoch,
                    append_with_fence_of_missing_dispatch_is_not_found,
                    append_with_fence_of_expired_lease_is_rejected,
                    append_expected_is_fenced_too,
                    fence_of_another_thread_cannot_append,
                    append_after_reclaim_and_new_claim_is_lost_claim,
                    stale_fenced_append_supersedes_through_the_shared_path,
                },
                dedupe::{
                    dedupe_key_held_by_live_dispatch_is_duplicate_with_holder,
                    dedupe_key_is_scoped_per_thread,
                    dedupe_key_stays_held_across_nack_and_lease_reclaim,
                    dedupe_key_is_free_after_ack_complete_and_dead_letter,
                    dedupe_key_is_free_after_cancel,
                    dedupe_key_is_free_after_interrupt_supersedes_holder,
                    dedupe_key_is_free_after_attempts_are_exhausted,
                    dedupe_key_of_stale_claimed_holder_stays_held_until_superseded,
                    dedupe_key_is_free_after_supersede_claimed,
                    dedupe_decisions_use_no_wall_clock_grace,
                    late_ops_of_old_holder_do_not_release_newer_holders_key,
                    idempotent_resubmit_of_key_holder_is_not_duplicate,
                    purge_removes_dedupe_side_records_and_key_stays_enforced,
                },
                maintenance::{
                    reclaim_requeues_expired_lease_with_one_more_attempt,
                    reclaim_at_max_attempts_dead_letters_with_reason,
                    reclaim_needs_lease_strictly_past,
                    reclaim_supersedes_expired_stale_epoch_claim_without_returning_it,
                    reclaim_respects_its_limit,
                    reclaim_leaves_queued_terminal_and_live_records_alone,
                    expired_claim_blocks_its_thread_until_reclaimed,
                    claim_dispatch_takes_over_expired_holder_atomically,
                    claim_dispatch_does_not_take_over_live_holder,
                    purge_removes_terminal_records_completed_before_cutoff,
                    purge_keeps_thread_epoch,
                    purge_on_one_instance_removes_records_for_all,
                    restart_loses_nothing_acknowledged,
                    restart_resumes_leases_and_delays,
                    crashing_holder_still_dead_letters_after_max_attempts,
                    crashed_hosts_lease_is_reclaimed_and_claimed_by_another,
                    fresh_instance_claims_oldest_of_a_deep_thread,
                    load_reads_the_truth_across_instances,
                    dispatch_enqueued_elsewhere_is_claimable_without_wakeup,
                    interrupt_on_one_instance_is_seen_by_all,
                    queued_threads_agree_across_instances,
                },
                log::{
                    append_assigns_one_then_two,
                    sequences_are_per_thread,
                    read_returns_entries_after_cursor_in_order_with_limit,
                    a_read_within_a_budget_ends_at_the_entry_that_reaches_it,
                    unknown_thread_log_is_empty_with_zero_watermarks,
                    appended_at_comes_from_the_clock,
                    append_expected_appends_when_latest_matches,
                    append_expected_conflict_reports_latest_and_appends_nothing,
                    trim_drops_entries_at_or_below_and_is_clamped_to_latest,
                    trim_never_moves_watermarks_back,
                    delete_keeps_watermark_and_sequences_are_never_reused,
                    deleted_thread_reads_nothing_on_any_instance,
                    delete_tombstone_survives_restart,
                    log_survives_restart_and_continues_sequence,
                    large_entry_round_trips,
                    append_on_one_instance_is_visible_on_another,
                    failed_append_leaves_earlier_entries_intact,
                    entries_over_the_backends_limit_are_invalid_and_at_it_round_trip,
                },
                inbox::{
                    messages_are_numbered_from_one_without_gaps_per_thread,
                    a_page_of_messages_within_a_budget_ends_at_the_message_that_reaches_it,
                    messages_stay_pending_across_a_claim_lost_before_the_ack,
                    a_repeated_ack_by_the_same_dispatch_returns_the_same_entry_and_appends_nothing,
                    an_ack_of_a_message_acked_by_another_dispatch_is_duplicate_naming_the_first_acker,
                    an_ack_of_a_missing_or_discarded_message_is_invalid_and_appends_nothing,
                    an_acked_message_is_appended_to_the_log_with_its_note,
                    a_refused_ack_appends_nothing_and_leaves_the_message_pending,
                    an_ack_after_the_lease_ran_out_is_refused_and_the_message_stays_pending,
                    an_ack_after_an_interrupt_is_stale_epoch_and_supersedes_the_dispatch,
                    messages_and_watermarks_survive_a_restart,
                    messages_left_by_a_run_are_handed_to_the_next_run_of_the_thread,
                    a_follow_up_sent_to_an_idle_thread_starts_one_dispatch_of_its_last_agent,
                    a_follow_up_naming_an_agent_starts_that_agents_dispatch,
                    a_steer_sent_to_an_idle_thread_starts_nothing,
                    a_message_sent_while_a_dispatch_is_live_starts_nothing_at_send,
                    each_settlement_that_leaves_the_thread_idle_starts_a_follow_up,
                    a_settlement_with_nothing_uncovered_starts_nothing,
                    a_nack_that_requeues_starts_no_follow_up,
                    cancel_and_interrupt_start_no_follow_up,
                    a_follow_up_run_that_acks_nothing_starts_no_second_follow_up,
                    messages_naming_different_agents_start_one_follow_up_per_agent,
                    a_follow_up_to_a_thread_that_never_ran_an_agent_and_names_none_is_invalid,
                    a_send_over_max_pending_is_limit_and_stores_nothing,
                    empty_and_oversized_messages_are_invalid_and_store_nothing,
                    discard_settles_pending_messages_through_a_sequence_and_appends_nothing,
                    purge_removes_settled_messages_before_the_cutoff_and_never_pending_ones,
                    racing_sends_and_settlements_leave_no_message_uncovered,
                    a_watch_made_before_a_send_on_another_instance_fires,
                    a_send_under_a_policy_is_decided_by_what_holds_the_thread,
                    an_interrupting_send_stops_the_run_marks_its_turn_and_queues_the_next,
                    racing_interrupts_stop_a_run_once_and_race_its_ack_cleanly,
                    a_rollback_masks_what_the_stopped_dispatch_wrote_across_its_attempts,
                    a_merge_hands_the_next_turn_what_the_stopped_run_had_taken,
                    a_merge_racing_the_runs_ack_leaves_the_message_to_the_next_turn,
                    quick_messages_under_a_follow_up_window_make_one_turn,
                    an_interrupt_behind_a_full_batch_of_work_and_many_agents_is_one_step,
                },
                window::{
                    a_debounced_enqueue_joins_the_open_window_due_after_quiet_and_by_max_wait,
                    a_collect_window_keeps_every_item_across_a_retry,
                    a_full_window_is_sealed_and_bad_windows_are_refused,
                    steady_enqueues_from_two_hosts_make_a_run_every_max_wait,
                    an_enqueue_racing_its_windows_claim_lands_in_exactly_one_run,
                },
                waitpoints::{
                    creating_a_waitpoint_twice_by_name_returns_the_first,
                    creating_a_waitpoint_is_fenced_checked_and_capped,
                    a_suspended_dispatch_waits_holding_its_thread_and_nothing_else,
                    a_completion_resumes_the_waiting_dispatch_keeping_its_id_and_attempts,
                    a_completion_before_the_suspend_resumes_at_once,
                    a_suspend_past_max_resumes_is_limit,
                    the_first_of_concurrent_completions_wins_on_every_instance,
                    timeouts_fire_once_whoever_sweeps_and_beat_a_late_completion,
                    an_operator_cancel_resumes_and_settles_once,
                    interrupt_and_cancel_of_a_waiting_dispatch_cancel_its_waitpoints,
                    a_terminal_settlement_cancels_pending_waitpoints,
                    a_rerun_after_a_lost_lease_finds_the_same_waitpoint,
                    waitpoints_list_by_filter_and_go_with_their_dispatch,
                    a_watch_fires_when_a_waitpoint_settles_on_another_instance,
                },
                journal::{
                    journal_entries_load_in_position_order_with_every_field,
                    journal_writes_without_a_live_fence_are_refused_and_store_nothing,
                    journal_is_kept_across_a_nack_and_a_new_claim,
                    drop_calls_keeps_the_positions_below_from,
                    record_append_gives_the_log_entry_and_the_answer_one_sequence,
                    invalid_journal_writes_are_refused_and_store_nothing,
                    a_body_at_max_body_round_trips,
                    journal_goes_with_its_dispatch,
                },
                schedules::{
                    schedule_records_are_written_under_a_compare_and_set_of_their_revision,
                    every_slot_of_a_day_fires_once_across_three_hosts_with_a_tick_left_half_done,
                    a_clock_stepped_back_fires_nothing_twice_and_a_jump_forward_fires_only_the_latest,
                    daylight_saving_transitions_fire_as_the_policy_says,
                    skip_records_each_slot_while_the_last_run_lives_and_fires_the_next_on_time,
                    pause_resume_and_removal_stop_and_restart_fires,
                    trigger_and_backfill_follow_the_overlap_policy,
                },
                deltas::{
                    deltas_read_by_cursor_from_the_start_mid_batch_at_the_end_and_across_batches,
                    a_higher_claims_deltas_hide_the_lower_claims,
                    a_batch_persisted_again_with_the_same_first_replaces_it,
                    a_gap_stops_the_read,
                    an_unknown_dispatch_reads_no_deltas,
                    deltas_go_when_they_expire,
                },
                limits::{
                    an_expired_claim_is_not_revived_once_its_key_slot_was_taken,
                    a_lease_runs_at_its_last_millisecond_and_not_after,
                    a_key_cap_is_never_exceeded_by_claimers_on_several_instances,
                    a_slot_frees_on_ack_and_on_lease_expiry_and_a_waiting_dispatch_holds_none,
                    a_rate_admits_its_burst_then_says_when_the_next_token_comes,
                    a_rate_is_exact_across_two_instances,
                    a_plugin_rate_never_exceeds_its_bucket_across_two_instances,
                    a_named_limit_is_shared_by_two_agents,
                    a_pause_of_an_agent_or_of_one_key_holds_back_only_what_it_names,
                    every_small_key_is_served_before_the_big_keys_tenth_claim,
                    keys_and_unkeyed_dispatches_take_turns,
                    a_key_that_goes_idle_and_returns_does_not_starve_a_deep_key,
                    release_requeues_without_an_attempt_honouring_available_at,
                    tokens_and_request_slots_are_exact_across_two_instances,
                    a_concurrency_key_over_128_bytes_is_invalid_at_enqueue,
                    a_large_key_cap_holds_exactly_across_two_instances,
                    a_lease_extended_again_and_again_under_a_large_key_cap_stays_alive,
                    a_stopped_instances_slots_of_a_large_key_free_within_three_leases,
                },
                concurrency::{
                    no_dispatch_lost_or_invented_under_concurrent_chaos,
                    at_most_one_claim_per_thread_across_hosts,
                    concurrent_claims_of_one_dispatch_have_one_winner,
                    complete_and_claim_sees_what_another_host_stored_before_it,
                    concurrent_claims_of_sibling_dispatches_have_one_winner,
                    reclaim_racing_ack_never_overwrites_the_ack,
                    concurrent_reclaim_sweeps_transition_once,
                    stale_holders_racing_a_new_holder_change_nothing,
                    claims_within_a_thread_follow_priority_then_age_under_concurrency,
                    nothing_is_claimed_before_available_at_while_clock_moves,
                    attempts_never_decrease_under_concurrent_nack_and_reclaim,
                    no_older_epoch_append_start_or_ack_after_interrupt_returns,
                    enqueue_racing_interrupt_leaves_no_stale_queued_dispatch,
                    concurrent_enqueues_with_one_dedupe_key_admit_one,
                    dedupe_key_is_reusable_round_after_round_under_concurrency,
                    concurrent_enqueues_on_one_thread_all_land,
                    concurrent_enqueues_with_distinct_keys_all_persist,
                    log_concurrent_appenders_get_unique_sequences_and_readers_see_no_gaps,
                    concurrent_append_expected_with_same_expectation_admits_one,
                    log_watermarks_stay_ordered_and_monotonic_under_concurrency,
                    instance_opened_during_enqueues_sees_every_dispatch,
                },
            }

            $crate::conformance::__sync_tests! { $factory;
                model::{
                    mailbox_follows_the_spec_model,
                    log_watermarks_follow_the_model,
                },
            }
    };
}
pub(crate) use suite;

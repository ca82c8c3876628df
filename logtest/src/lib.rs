//! The conformance suite for the backends of the hub's own tables: the
//! event log ([`EventLog`](websub_hub::storage::events::EventLog), in its nine
//! parts) and the [`Backlog`](websub_hub::storage::backlog::Backlog).
//!
//! One public async check per behaviour of the contracts documented on the
//! traits: the [`events`] checks grouped by the part of the log they cover
//! (intake, queue, outcomes, endpoints, operations, upkeep, sessions,
//! denials, signing), the
//! [`backlog`]'s by fetches, intents and retention. SQLite and PostgreSQL
//! run every one; a third backend is proven by passing them too.
//!
//! A backend runs the suite from one of its own test files with
//! [`event_log_suite!`] and [`backlog_suite!`], which expand to one
//! `#[tokio::test]` per check on a multi-threaded runtime. Each check gets
//! a log of its own from the backend's [`Fresh`] factory (a file or a
//! schema no other check sees: the checks about limits, order and draining
//! everything rely on it), removed once the check passed; a failing check
//! leaves it behind for inspection.
//!
//! ```ignore
//! struct Scratch { log: MyEventLog }
//!
//! impl websub_logtest::Fresh for Scratch {
//!     type Log = MyEventLog;
//!     async fn new(check: &str) -> Option<Self> { /* None skips (outside CI only) */ }
//!     fn log(&self) -> &MyEventLog { &self.log }
//!     async fn remove(self) { /* delete the file or schema */ }
//! }
//!
//! websub_logtest::event_log_suite!(Scratch);
//! ```
//!
//! Checks assert on error variants, never on message text. A few print how
//! long they took (`--nocapture`); they assert correctness only.

use std::future::Future;

pub mod backlog;
pub mod events;

/// A backend's store made afresh for one check, and removed after it.
pub trait Fresh: Sized + Send {
    /// What the checks run against: an event log for
    /// [`event_log_suite!`], a backlog for [`backlog_suite!`].
    type Log: ?Sized;

    /// A store of its own for the check named `check`; `None` skips it
    /// (only outside CI, where a server may be missing).
    fn new(check: &str) -> impl Future<Output = Option<Self>> + Send;

    /// The store under test.
    fn log(&self) -> &Self::Log;

    /// Deletes the store once its check passed.
    fn remove(self) -> impl Future<Output = ()> + Send;
}

/// Calls `$callback!` with the name of every event log check, so the list
/// is written once.
#[doc(hidden)]
#[macro_export]
macro_rules! __event_log_checks {
    ($callback:ident ! ($($arg:tt)*)) => {
        $crate::$callback! { ($($arg)*)
            record_round_trip,
            record_once_records_an_id_once,
            unexpanded_lists_oldest_first,
            expand_creates_one_record_per_subscriber,
            expand_is_idempotent,
            expand_of_a_missing_event_fails,
            expand_a_hundred_thousand,
            claim_returns_due_records_only,
            claim_respects_limit_and_due_order,
            expansion_in_parts_survives_a_crash_between_parts,
            claimed_parts_return_only_the_records_they_create,
            claimed_parts_never_take_over_existing_records,
            claimed_records_of_a_dead_process_become_claimable,
            concurrent_claimed_parts_share_the_records,
            records_are_claimed_per_lane,
            ordered_lines_give_their_head_only,
            complete_sets_each_outcome,
            attempts_are_kept_per_delivery_and_go_with_their_event,
            complete_mixes_events_and_ignores_late_deliveries,
            unwritten_records_are_created_with_their_first_outcome,
            webhook_attempts_are_kept_and_go_by_age,
            endpoints_are_disabled_after_failures_in_a_row,
            changes_are_kept_and_listed_newest_first,
            unsent_changes_are_claimed_once_and_settled,
            the_backlog_for_the_webhook_is_bounded,
            the_history_is_bounded_and_purged_by_age,
            health_failed_and_retry_failed,
            deliveries_are_listed_by_state_topic_subscriber_and_time,
            activity_is_counted_per_bucket_and_endpoint,
            a_redelivery_is_a_copy_with_records_of_its_own,
            a_replay_sends_a_topics_originals_since_a_time,
            a_catch_up_owes_each_subscription_its_topics_events_since_its_request,
            purge_deletes_old_events_with_their_records,
            events_in_partitions_made_ahead_go_whole,
            expand_racing_purge_leaves_no_orphans,
            admin_sessions_are_kept_found_listed_and_ended,
            admin_sessions_are_bounded,
            denials_are_kept_listed_replaced_and_removed,
            the_deny_list_is_bounded,
            signing_is_kept_per_subscription_and_replaced_whole,
        }
    };
}

/// Calls `$callback!` with the name of every backlog check.
#[doc(hidden)]
#[macro_export]
macro_rules! __backlog_checks {
    ($callback:ident ! ($($arg:tt)*)) => {
        $crate::$callback! { ($($arg)*)
            fetches_are_claimed_once_each_until_their_claim_goes_stale,
            fetch_claims_respect_their_limit,
            a_done_fetch_leaves_the_backlog,
            validators_are_kept_replaced_and_forgotten,
            a_ping_during_a_fetch_leaves_it_due_after_done,
            a_ping_during_a_fetch_leaves_it_due_after_a_failure,
            a_fetch_retry_waits_for_its_time,
            a_failed_fetch_is_kept_until_pinged_again,
            fetch_listing_is_newest_first_within_its_limit,
            an_intent_round_trips_every_field,
            intents_are_claimed_oldest_first,
            admission_is_bounded_by_waiting_intents,
            a_group_is_admitted_in_order_up_to_the_bound,
            the_waiting_count_follows_every_change,
            a_newer_request_replaces_a_waiting_intent,
            a_newer_request_replaces_a_failed_intent,
            replacing_an_intent_in_flight_keeps_its_claim,
            a_replaced_intent_s_failure_leaves_the_newer_as_written,
            intent_retry_and_failure,
            outcomes_are_finished_in_one_group,
            intent_listing_filters_by_owner_and_state,
            subscribing_follows_waiting_subscribes,
            purge_removes_only_old_failures,
        }
    };
}

/// Expands to one `#[tokio::test(flavor = "multi_thread")]` per event log
/// check, each on a fresh `$fresh` ([`Fresh`], whose `Log` is an event log).
/// The calling crate needs `tokio` with the `macros` and `rt-multi-thread`
/// features among its dev-dependencies.
#[macro_export]
macro_rules! event_log_suite {
    ($fresh:ty) => {
        $crate::__event_log_checks!(__suite_tests!($fresh, events));
    };
}

/// Expands to one test per backlog check, each on a fresh `$fresh`
/// ([`Fresh`], whose `Log` is a backlog).
#[macro_export]
macro_rules! backlog_suite {
    ($fresh:ty) => {
        $crate::__backlog_checks!(__suite_tests!($fresh, backlog));
    };
}

/// One test per check named, each on a fresh `$fresh`; the checks are in
/// `$module`.
#[doc(hidden)]
#[macro_export]
macro_rules! __suite_tests {
    (($fresh:ty, $module:ident) $($check:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $check() {
                let Some(fresh) = <$fresh as $crate::Fresh>::new(stringify!($check)).await else {
                    return;
                };
                $crate::$module::$check($crate::Fresh::log(&fresh)).await;
                $crate::Fresh::remove(fresh).await;
            }
        )*
    };
}

//! The conformance suite for [`SubscriptionStore`] backends.
//!
//! One public async check per behaviour of the contract documented on
//! [`SubscriptionStore`], boundaries included. Each check takes a built store
//! and isolates itself with random topic and callback URLs (and a random
//! owner), so checks run concurrently against one shared store and never need
//! it wiped. A backend that passes every check is correct enough to ship.
//!
//! A backend runs the whole suite from one of its own `tests/*.rs` files with
//! [`suite!`], which expands to one `#[tokio::test]` per check on a
//! multi-threaded runtime, so each check's name shows in the test output:
//!
//! ```no_run
//! use std::sync::Arc;
//! use websub_store::{memory::MemoryStore, SubscriptionStore};
//!
//! async fn store_for_test() -> Option<Arc<dyn SubscriptionStore>> {
//!     Some(Arc::new(MemoryStore::new()))
//! }
//!
//! websub_storetest::suite!(store_for_test);
//! ```
//!
//! The factory returns `None` to skip (only ever outside CI: see
//! [`servers`]). [`run_all`] runs every check in sequence on one store, for a
//! harness that is not libtest.
//!
//! Checks assert on error *variants*, never on message text. They are
//! grouped by the part of the contract they cover, one module each, and
//! all exported at the crate's root.

mod concurrency;
mod expiry;
mod fields;
mod helpers;
mod lifecycle;
mod listing;
mod owners;
pub mod scratch;
pub mod servers;

pub use concurrency::*;
pub use expiry::*;
pub use fields::*;
pub use helpers::{SharedStore, unique_callback, unique_owner, unique_topic};
pub use lifecycle::*;
pub use listing::*;
pub use owners::*;

/// Calls `$callback!` with the name of every check, so the list is written
/// once for [`suite!`] and [`run_all`].
#[doc(hidden)]
#[macro_export]
macro_rules! __with_checks {
    ($callback:ident ! ($($arg:tt)*)) => {
        $crate::$callback! { ($($arg)*)
            round_trips_every_field,
            secret_absent_and_empty_are_distinct,
            timestamps_keep_microseconds,
            unicode_and_long_urls_round_trip,
            callback_query_strings_are_part_of_the_pair,
            save_replaces_every_field,
            save_twice_leaves_one_subscription,
            save_all_saves_each_as_save_would,
            renew_all_keeps_when_a_pair_was_created,
            a_store_that_answers_is_ready,
            get_missing_is_unknown_subscription,
            get_after_delete_is_unknown_subscription,
            delete_missing_is_ok,
            delete_twice_is_ok,
            same_callback_on_many_topics_is_independent,
            same_topic_with_many_callbacks_is_independent,
            list_by_topic_of_unknown_topic_is_empty,
            list_by_topic_returns_only_that_topic,
            list_by_topic_page_walks_every_subscription_once,
            has_subscriptions_follows_the_topic,
            topics_lists_each_topic_once,
            topic_disappears_with_its_last_subscription,
            list_expiring_is_strictly_before,
            list_expiring_bound_inside_a_microsecond,
            list_expiring_never_returns_permanent,
            list_expiring_follows_renewals,
            list_expiring_forgets_deleted,
            concurrent_upserts_of_one_pair_leave_one,
            concurrent_saves_and_deletes_of_distinct_pairs_lose_nothing,
            count_by_owner_counts_only_that_owner,
            count_by_owner_follows_owner_changes,
            list_by_owner_returns_only_that_owner,
            list_by_owner_follows_owner_changes_and_deletes,
            conditional_save_below_limit_saves,
            conditional_save_at_limit_is_refused_with_count,
            conditional_resave_at_limit_succeeds,
            conditional_save_needs_an_owner,
            conditional_save_frees_slot_after_delete,
            conditional_saves_of_other_owners_do_not_count,
            concurrent_conditional_saves_respect_the_limit,
        }
    };
}

/// Expands to one `#[tokio::test(flavor = "multi_thread")]` per check.
///
/// `$make` is a path to an `async fn() -> Option<Arc<dyn SubscriptionStore>>`
/// that builds the store under test (`None` skips, outside CI only). The
/// calling crate needs `tokio` with the `macros` and `rt-multi-thread`
/// features among its dev-dependencies.
#[macro_export]
macro_rules! suite {
    ($make:path) => {
        $crate::__with_checks!(__suite_tests!($make));
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __suite_tests {
    (($make:path) $($check:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $check() {
                let Some(store) = $make().await else {
                    return;
                };
                $crate::$check(store).await;
            }
        )*
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __run_all {
    (($store:ident) $($check:ident),* $(,)?) => {
        $(
            eprintln!("storetest: {}", stringify!($check));
            $crate::$check($store.clone()).await;
        )*
    };
}

/// Runs every check in sequence against one store, printing each name.
pub async fn run_all(store: SharedStore) {
    __with_checks!(__run_all!(store));
}

//! Reloading webhooks while the dispatcher runs, against a real PostgreSQL
//! and real receivers: each rule of `Dispatcher::reload_webhooks` — removed
//! subscribers pause with their rows kept, new ones are expanded within the
//! start-from cutoff, changed URLs apply from the next attempt, any refused
//! registration changes nothing — and handlers are never touched.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::Utc;
use common::{Db, EVENT, Running, config, eventually, eventually_async, webhook};
use url::Url;
use uuid::Uuid;
use websub_hub::delivery::RetryPolicy;
use websub_hub::delivery::outbox::{
    Dispatcher, DispatcherConfig, Envelope, HandlerError, RegistrationError, ReloadError,
    WebhookRegistrar, WebhookSubscriber,
};
use websub_tests::{Answer, RecordingReceiver};

const WAIT: Duration = Duration::from_secs(10);

/// Subscribers as a service would read them from its file: one event name,
/// subscriber name to URL.
#[derive(Clone)]
struct Subscriptions(Vec<(&'static str, Url)>);

impl Subscriptions {
    /// The registration code, the same at start-up and on reload.
    fn register(&self, registrar: &mut dyn WebhookRegistrar) -> Result<(), RegistrationError> {
        let subscribers: HashMap<String, WebhookSubscriber> = self
            .0
            .iter()
            .map(|(name, url)| {
                (
                    (*name).to_owned(),
                    WebhookSubscriber::new(None, url.clone()),
                )
            })
            .collect();
        registrar.register_webhooks(EVENT, subscribers)
    }
}

fn set(ids: Vec<Uuid>) -> HashSet<Uuid> {
    ids.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_subscriber_pauses_with_its_rows_kept_and_resumes_when_back() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    // The contract's retry curve, so a failing row stays pending for a while.
    let config = DispatcherConfig {
        retry: RetryPolicy {
            max_retries: 10,
            max_backoff: Duration::from_secs(10),
        },
        ..config(&db.tables)
    };
    let mut dispatcher = Dispatcher::new(db.pool.clone(), config).expect("dispatcher");
    let both = Subscriptions(vec![("a", receiver.url("/a")), ("b", receiver.url("/b"))]);
    both.register(&mut dispatcher)
        .expect("register at start-up");
    let running = Running::start(dispatcher.clone());

    receiver.answer("/a", Answer::status(503));
    let pending = db.produce(EVENT, None, true).await;
    assert!(receiver.wait_for("/a", 1, WAIT).await);
    assert!(receiver.wait_for("/b", 1, WAIT).await);

    let only_b = Subscriptions(vec![("b", receiver.url("/b"))]);
    dispatcher
        .reload_webhooks(|registrar| only_b.register(registrar))
        .expect("reload");
    // An attempt already claimed, or a pass already running, may still
    // finish with the old registrations; after that, nothing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let attempts = receiver.received_at("/a").len();
    // Each failure is recorded after its answer: wait for the row to count
    // every attempt the receiver got.
    let recorded = eventually_async(WAIT, || async {
        db.delivery(pending, "a")
            .await
            .is_some_and(|row| usize::try_from(row.retry_count).is_ok_and(|n| n >= attempts))
    })
    .await;
    assert!(recorded, "the row did not record the {attempts} failures");
    let row = db.delivery(pending, "a").await.expect("the row stays");
    assert!(row.processed_at.is_none() && row.retry_count >= 1);

    let while_away = db.produce(EVENT, None, true).await;
    assert!(receiver.wait_for("/b", 2, WAIT).await);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        receiver.received_at("/a").len(),
        attempts,
        "a removed subscriber is not claimed"
    );
    assert!(db.delivery(while_away, "a").await.is_none(), "nor expanded");
    let unchanged = db.delivery(pending, "a").await.expect("the row stays");
    assert_eq!(unchanged.retry_count, row.retry_count);
    assert!(unchanged.processed_at.is_none());

    // Back: its kept row resumes, and what it missed is expanded.
    receiver.answer("/a", Answer::status(200));
    dispatcher
        .reload_webhooks(|registrar| both.register(registrar))
        .expect("reload");
    let caught_up = receiver
        .wait_until(WAIT, |receiver| {
            set(receiver.event_ids("/a")).is_superset(&HashSet::from([pending, while_away]))
        })
        .await;
    assert!(caught_up, "got {:?}", receiver.event_ids("/a"));
    let resumed = eventually_async(WAIT, || async {
        db.delivery(pending, "a")
            .await
            .is_some_and(|row| row.processed_at.is_some())
    })
    .await;
    assert!(resumed);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_subscriber_is_expanded_within_the_start_from_cutoff() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    let old = db.produce(EVENT, None, false).await;
    db.age(old, Duration::from_secs(2 * 3600)).await;
    let recent = db.produce(EVENT, None, false).await;
    let config = DispatcherConfig {
        start_from: Some(Utc::now() - chrono::Duration::hours(1)),
        ..config(&db.tables)
    };
    let dispatcher = Dispatcher::new(db.pool.clone(), config).expect("dispatcher");
    let first = Subscriptions(vec![("a", receiver.url("/a"))]);
    dispatcher
        .reload_webhooks(|registrar| first.register(registrar))
        .expect("the first load");
    let running = Running::start(dispatcher.clone());
    assert!(receiver.wait_for("/a", 1, WAIT).await);

    let second = Subscriptions(vec![("a", receiver.url("/a")), ("c", receiver.url("/c"))]);
    dispatcher
        .reload_webhooks(|registrar| second.register(registrar))
        .expect("reload");
    assert!(receiver.wait_for("/c", 1, WAIT).await);
    let later = db.produce(EVENT, None, true).await;
    assert!(receiver.wait_for("/c", 2, WAIT).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        set(receiver.event_ids("/c")),
        HashSet::from([recent, later])
    );
    assert!(db.delivery(old, "c").await.is_none(), "outside the cutoff");
    assert_eq!(
        set(receiver.event_ids("/a")),
        HashSet::from([recent, later]),
        "the unchanged subscriber is not delivered to again"
    );
    assert_eq!(receiver.received_at("/a").len(), 2);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_url_applies_from_the_next_attempt() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    let config = DispatcherConfig {
        retry: RetryPolicy {
            max_retries: 10,
            max_backoff: Duration::from_secs(2),
        },
        ..config(&db.tables)
    };
    let dispatcher = Dispatcher::new(db.pool.clone(), config).expect("dispatcher");
    let old_url = Subscriptions(vec![("a", receiver.url("/old"))]);
    dispatcher
        .reload_webhooks(|registrar| old_url.register(registrar))
        .expect("load");
    let running = Running::start(dispatcher.clone());
    let delivered = db.produce(EVENT, None, true).await;
    assert!(receiver.wait_for("/old", 1, WAIT).await);

    // A failing row, retried at the old URL until the change.
    let retried = db.produce(EVENT, None, true).await;
    receiver.answer("/old", Answer::status(500));
    assert!(
        receiver
            .wait_until(WAIT, |receiver| receiver
                .event_ids("/old")
                .contains(&retried))
            .await,
        "attempted at the old URL"
    );
    let new_url = Subscriptions(vec![("a", receiver.url("/new"))]);
    dispatcher
        .reload_webhooks(|registrar| new_url.register(registrar))
        .expect("reload");
    let fresh = db.produce(EVENT, None, true).await;
    let moved = receiver
        .wait_until(WAIT, |receiver| {
            set(receiver.event_ids("/new")) == HashSet::from([retried, fresh])
        })
        .await;
    assert!(moved, "/new got {:?}", receiver.event_ids("/new"));
    assert!(!receiver.event_ids("/old").contains(&fresh));
    assert!(!receiver.event_ids("/new").contains(&delivered));
    let row = db.delivery(retried, "a").await.expect("row");
    assert!(row.retry_count >= 1, "the same row, its failures kept");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_refused_registration_changes_nothing() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    let dispatcher = Dispatcher::new(db.pool.clone(), config(&db.tables)).expect("dispatcher");
    dispatcher
        .register_webhooks(EVENT, webhook("a", None, receiver.url("/a")))
        .expect("register");
    let running = Running::start(dispatcher.clone());

    // A refusal the function went past, returning Ok anyway.
    let refused = dispatcher.reload_webhooks(|registrar| {
        registrar.register_webhooks(EVENT, webhook("b", None, receiver.url("/b")))?;
        let ignored = registrar.register_webhooks(
            "other.event",
            webhook("c", None, Url::parse("ftp://127.0.0.1/").expect("url")),
        );
        assert!(ignored.is_err());
        Ok::<(), RegistrationError>(())
    });
    assert!(
        matches!(
            refused,
            Err(ReloadError::Registration(
                RegistrationError::InvalidUrl { .. }
            ))
        ),
        "{refused:?}"
    );
    // The function's own failure.
    let failed = dispatcher.reload_webhooks(|registrar| {
        registrar
            .register_webhooks(EVENT, webhook("b", None, receiver.url("/b")))
            .map_err(|error| error.to_string())?;
        Err::<(), String>("the subscribers file is unreadable".to_owned())
    });
    assert!(
        matches!(failed, Err(ReloadError::Function(ref reason)) if reason.contains("unreadable"))
    );

    let id = db.produce(EVENT, None, true).await;
    assert!(receiver.wait_for("/a", 1, WAIT).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        receiver.event_ids("/a"),
        [id],
        "the old registration stands"
    );
    assert!(receiver.received_at("/b").is_empty());
    assert!(db.delivery(id, "b").await.is_none());
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_are_untouched_by_reloads_and_registration_works_while_running() {
    let Some(db) = Db::default_tables().await else {
        return;
    };
    let receiver = RecordingReceiver::start().await;
    let config = DispatcherConfig {
        subscriber_name: Some("svc".to_owned()),
        ..config(&db.tables)
    };
    let dispatcher = Dispatcher::new(db.pool.clone(), config).expect("dispatcher");
    let running = Running::start(dispatcher.clone());
    // Registered after the dispatcher started.
    let handled = Arc::new(AtomicUsize::new(0));
    let count = handled.clone();
    dispatcher
        .register_handler(EVENT, move |_envelope: Envelope| {
            let count = count.clone();
            async move {
                count.fetch_add(1, Ordering::SeqCst);
                Ok::<(), HandlerError>(())
            }
        })
        .expect("register a handler while running");
    dispatcher
        .register_webhooks(EVENT, webhook("a", None, receiver.url("/a")))
        .expect("register webhooks while running");
    db.produce(EVENT, None, true).await;
    assert!(receiver.wait_for("/a", 1, WAIT).await);
    assert!(eventually(WAIT, || handled.load(Ordering::SeqCst) == 1).await);

    dispatcher
        .reload_webhooks(|_registrar| Ok::<(), RegistrationError>(()))
        .expect("reload to no webhooks");
    // A pass already running finishes with the registrations it began with.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = db.produce(EVENT, None, true).await;
    assert!(eventually(WAIT, || handled.load(Ordering::SeqCst) == 2).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.received_at("/a").len(), 1, "webhooks are gone");
    assert!(db.delivery(after, "a").await.is_none());
    assert!(
        eventually_async(WAIT, || async {
            db.delivery(after, "svc")
                .await
                .is_some_and(|row| row.processed_at.is_some())
        })
        .await
    );
    running.stop().await;
}

//! The event log's contract ([`EventLog`]), checked against both backends:
//! PostgreSQL (a real server, from `websub_storetest::servers`) and SQLite (a
//! fresh file per test under the target's temporary directory).
//!
//! Every behaviour is one async check over `&dyn EventLog`, run for each
//! backend by `both!`. PostgreSQL tests share one server with each other and
//! with other test binaries whose dispatchers claim due rows, so each test
//! gets its own schema (on the connections' `search_path`): a claim in one
//! test can never take another test's rows. Most checks still look only at
//! their own event ids and subscribers; those about limits, ordering and
//! draining everything (claim limits, `unexpanded` order, the concurrent
//! claimers) rely on having the tables to themselves, which the private
//! schema (and on SQLite, the private file) gives them.
//!
//! A few checks print how long they took (`--nocapture` to see it); they
//! assert correctness only. Throughput is measured by `websub-bench`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chrono::{DateTime, TimeDelta, Utc};
use uuid::Uuid;
use websub_hub::storage::events::postgres::PostgresEventLog;
use websub_hub::storage::events::sqlite::SqliteEventLog;
use websub_hub::storage::events::{
    Attempt, Claimed, Completion, DeliveryFilter, DeliveryHealth, DeliveryOperations,
    DeliveryQueue, DeliveryRecord, DeliveryState, EventIntake, EventLog, EventLogError, Exhaustion,
    FailedFilter, LoggedEvent, NewEvent, Outcome, WebhookAttempt,
};

/// Long enough that no claim in a check goes stale unless the check says so.
const VISIBILITY: Duration = Duration::from_secs(30);

use crate::scratch;

use scratch::{PgScratch, SqliteScratch, base_time, secs, sqlite_path};

fn topic() -> String {
    format!("https://publisher.example/topics/{}", Uuid::new_v4())
}

fn subscribers(prefix: &str, n: usize) -> Vec<String> {
    let run = Uuid::new_v4().simple();
    (0..n)
        // Non-ASCII and a double quote: batches travel as JSON on SQLite.
        .map(|i| format!("https://subscriber.example/{prefix}/{run}/{i}?name=\"Zoë\""))
        .collect()
}

async fn record(log: &dyn EventLog, topic: &str, now: DateTime<Utc>) -> LoggedEvent {
    log.record(
        NewEvent {
            topic: topic.to_owned(),
            content_type: "application/json".to_owned(),
            body: Bytes::from_static(b"{\"hello\":\"world\"}"),
        },
        now,
    )
    .await
    .expect("record an event")
}

/// Claims everything due at `now` and keeps only this event's records.
async fn claim_own(log: &dyn EventLog, event_id: Uuid, now: DateTime<Utc>) -> Vec<Claimed> {
    log.claim(100_000, now, VISIBILITY)
        .await
        .expect("claim")
        .into_iter()
        .filter(|claimed| claimed.event_id == event_id)
        .collect()
}

/// The backend's name, for printed measurements.
fn backend(log: &dyn EventLog) -> &'static str {
    if format!("{log:?}").starts_with("Postgres") {
        "postgres"
    } else {
        "sqlite"
    }
}

fn record_of<'a>(records: &'a [DeliveryRecord], subscriber: &str) -> &'a DeliveryRecord {
    records
        .iter()
        .find(|record| record.subscriber == subscriber)
        .unwrap_or_else(|| panic!("no delivery record for {subscriber}"))
}

fn completion(event_id: Uuid, subscriber: &str, outcome: Outcome) -> Completion {
    Completion {
        event_id,
        subscriber: subscriber.to_owned(),
        outcome,
        attempt: None,
    }
}

fn pending(event_id: Uuid, subscriber: &str, due: DateTime<Utc>) -> DeliveryRecord {
    DeliveryRecord {
        event_id,
        subscriber: subscriber.to_owned(),
        processed_at: None,
        retry_count: 0,
        last_error: None,
        processing_since: None,
        next_attempt_at: Some(due),
        state: DeliveryState::Pending,
    }
}

// ---------------------------------------------------------------------------
// Checks
// ---------------------------------------------------------------------------

async fn record_round_trip(log: &dyn EventLog) {
    // Sub-microsecond digits are dropped by both backends; what record()
    // returns must already be what event() reads back.
    let now = base_time() + TimeDelta::nanoseconds(789);
    let body: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
    let new = NewEvent {
        topic: format!("{}?q=ü&x=%20", topic()),
        content_type: "application/atom+xml; charset=\"utf-8\"; type=feed".to_owned(),
        body: Bytes::from(body),
    };
    let recorded = log.record(new.clone(), now).await.expect("record");
    assert_eq!(recorded.topic, new.topic);
    assert_eq!(recorded.content_type, new.content_type);
    assert_eq!(recorded.body, new.body);
    assert_eq!(recorded.created_at, now - TimeDelta::nanoseconds(789));
    assert_eq!(recorded.id.get_version_num(), 7, "ids are UUIDv7");

    let read = log.event(recorded.id).await.expect("read the event");
    assert_eq!(read.as_ref(), Some(&recorded));

    let empty = log
        .record(
            NewEvent {
                topic: topic(),
                content_type: "text/plain".to_owned(),
                body: Bytes::new(),
            },
            now,
        )
        .await
        .expect("record an empty body");
    assert_ne!(empty.id, recorded.id);
    assert_eq!(
        log.event(empty.id).await.expect("read").map(|e| e.body),
        Some(Bytes::new())
    );

    assert_eq!(
        log.event(Uuid::now_v7())
            .await
            .expect("read a missing event"),
        None
    );
}
both!(record_round_trip);

async fn record_once_records_an_id_once(log: &dyn EventLog) {
    let now = base_time();
    let id = Uuid::new_v4();
    let first = NewEvent {
        topic: topic(),
        content_type: "application/json".to_owned(),
        body: Bytes::from_static(b"{\"first\":true}"),
    };
    let recorded = log
        .record_once(id, first.clone(), now)
        .await
        .expect("record");
    assert!(recorded.created);
    assert_eq!(
        recorded.event.id, id,
        "the caller's id, whatever its version"
    );
    assert_eq!(recorded.event.topic, first.topic);
    assert_eq!(recorded.event.body, first.body);
    assert_eq!(recorded.event.created_at, now);
    let stored = recorded.event;

    // Again, even with other content and later: the first recording stays.
    let again = NewEvent {
        topic: topic(),
        content_type: "text/plain".to_owned(),
        body: Bytes::from_static(b"second"),
    };
    let repeated = log
        .record_once(id, again.clone(), now + secs(5))
        .await
        .expect("record again");
    assert!(!repeated.created);
    assert_eq!(repeated.event, stored);
    assert_eq!(log.event(id).await.expect("read"), Some(stored.clone()));

    // Expanded and delivered once: a late repeat changes nothing.
    log.expand(id, &["https://subscriber.example/once".to_owned()], now)
        .await
        .expect("expand");
    let late = log
        .record_once(id, again.clone(), now + secs(10))
        .await
        .expect("record after expansion");
    assert!(!late.created);
    assert!(
        !is_unexpanded(&log.unexpanded(100).await.expect("unexpanded"), id),
        "still expanded"
    );
    assert_eq!(log.deliveries(id).await.expect("records").len(), 1);

    // At once, from many tasks: stored once, and every call gets it.
    let racing = Uuid::new_v4();
    let calls = (0..8).map(|n| {
        let event = NewEvent {
            topic: format!("{}/{n}", topic()),
            content_type: "text/plain".to_owned(),
            body: Bytes::from(format!("call {n}")),
        };
        log.record_once(racing, event, now)
    });
    let results: Vec<_> = futures::future::join_all(calls)
        .await
        .into_iter()
        .map(|result| result.expect("record at once"))
        .collect();
    assert_eq!(results.iter().filter(|result| result.created).count(), 1);
    let winner = results
        .iter()
        .find(|result| result.created)
        .map(|result| result.event.clone())
        .expect("one call stored it");
    assert!(results.iter().all(|result| result.event == winner));

    // Purged, it is no longer there to be found: recorded again.
    log.purge_before(now + secs(1)).await.expect("purge");
    assert_eq!(log.event(id).await.expect("read"), None);
    let anew = log
        .record_once(id, again.clone(), now + secs(20))
        .await
        .expect("record after the purge");
    assert!(anew.created);
    assert_eq!(anew.event.topic, again.topic);
}
both!(record_once_records_an_id_once);

async fn expand_creates_one_record_per_subscriber(log: &dyn EventLog) {
    let t0 = base_time();
    let topic = topic();
    let event = record(log, &topic, t0).await;
    let unexpanded: Vec<Uuid> = log
        .unexpanded(10_000)
        .await
        .expect("unexpanded")
        .iter()
        .map(|e| e.id)
        .collect();
    assert!(
        unexpanded.contains(&event.id),
        "a recorded event waits for expansion"
    );
    assert_eq!(log.deliveries(event.id).await.expect("deliveries"), vec![]);

    let subs = subscribers("expand", 3);
    // A duplicate in the list still makes one record.
    let mut with_duplicate = subs.clone();
    with_duplicate.push(subs[0].clone());
    let t1 = t0 + secs(1);
    assert_eq!(
        log.expand(event.id, &with_duplicate, t1)
            .await
            .expect("expand"),
        3
    );

    let mut expected: Vec<DeliveryRecord> = subs.iter().map(|s| pending(event.id, s, t1)).collect();
    expected.sort_by(|a, b| a.subscriber.cmp(&b.subscriber));
    let mut records = log.deliveries(event.id).await.expect("deliveries");
    records.sort_by(|a, b| a.subscriber.cmp(&b.subscriber));
    assert_eq!(records, expected);

    let unexpanded = log.unexpanded(10_000).await.expect("unexpanded");
    assert!(
        unexpanded.iter().all(|e| e.id != event.id),
        "an expanded event is not listed again"
    );
}
both!(expand_creates_one_record_per_subscriber);

async fn expand_is_idempotent(log: &dyn EventLog) {
    let t0 = base_time();
    let event = record(log, &topic(), t0).await;
    let subs = subscribers("idempotent", 3);
    assert_eq!(log.expand(event.id, &subs, t0).await.expect("expand"), 3);

    // Give one record some state: claimed, failed, due again later.
    let claimed = claim_own(log, event.id, t0).await;
    assert_eq!(claimed.len(), 3);
    let retry_at = t0 + secs(60);
    log.complete(
        &[completion(
            event.id,
            &subs[0],
            Outcome::Retry {
                error: "HTTP 503".to_owned(),
                next_attempt_at: retry_at,
            },
        )],
        t0,
    )
    .await
    .expect("complete");
    let before = log.deliveries(event.id).await.expect("deliveries");

    // The same list again creates nothing and changes nothing.
    let t1 = t0 + secs(5);
    assert_eq!(log.expand(event.id, &subs, t1).await.expect("re-expand"), 0);
    assert_eq!(log.deliveries(event.id).await.expect("deliveries"), before);

    // A longer list adds only the new subscriber, due at the new time.
    let mut more = subs.clone();
    more.push(format!("{}-late", subs[0]));
    assert_eq!(
        log.expand(event.id, &more, t1).await.expect("expand more"),
        1
    );
    let after = log.deliveries(event.id).await.expect("deliveries");
    assert_eq!(after.len(), 4);
    assert_eq!(
        record_of(&after, &more[3]),
        &pending(event.id, &more[3], t1)
    );
    let first = record_of(&after, &subs[0]);
    assert_eq!(first.retry_count, 1);
    assert_eq!(first.last_error.as_deref(), Some("HTTP 503"));
    assert_eq!(first.next_attempt_at, Some(retry_at));

    // No subscribers at all still marks the event expanded.
    let lonely = record(log, &topic(), t0).await;
    assert_eq!(
        log.expand(lonely.id, &[], t0).await.expect("expand none"),
        0
    );
    let unexpanded = log.unexpanded(10_000).await.expect("unexpanded");
    assert!(
        unexpanded
            .iter()
            .all(|e| e.id != lonely.id && e.id != event.id)
    );
}
both!(expand_is_idempotent);

async fn expand_of_a_missing_event_fails(log: &dyn EventLog) {
    let missing = Uuid::now_v7();
    let result = log
        .expand(missing, &subscribers("missing", 2), base_time())
        .await;
    assert!(
        matches!(result, Err(EventLogError::UnknownEvent(id)) if id == missing),
        "expected UnknownEvent, got {result:?}"
    );
    let result = log.expand(missing, &[], base_time()).await;
    assert!(matches!(result, Err(EventLogError::UnknownEvent(id)) if id == missing));
    assert_eq!(log.deliveries(missing).await.expect("deliveries"), vec![]);
}
both!(expand_of_a_missing_event_fails);

async fn unexpanded_lists_oldest_first(log: &dyn EventLog) {
    let t0 = base_time();
    let topic = topic();
    let middle = record(log, &topic, t0 + secs(1)).await;
    let newest = record(log, &topic, t0 + secs(2)).await;
    let oldest = record(log, &topic, t0).await;
    let expanded = record(log, &topic, t0 - secs(1)).await;
    log.expand(expanded.id, &[], t0).await.expect("expand");

    let ours = [oldest.id, middle.id, newest.id];
    let listed: Vec<Uuid> = log
        .unexpanded(10_000)
        .await
        .expect("unexpanded")
        .into_iter()
        .map(|e| e.id)
        .filter(|id| ours.contains(id) || *id == expanded.id)
        .collect();
    assert_eq!(listed, ours);

    let listed = log.unexpanded(2).await.expect("unexpanded");
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0], oldest, "full events, oldest first");
}
both!(unexpanded_lists_oldest_first);

async fn expand_a_hundred_thousand(log: &dyn EventLog) {
    // PostgreSQL refuses statements with more than 65 535 parameters, SQLite
    // more than 32 766 variables: a naive multi-row INSERT fails here.
    let t0 = base_time();
    let event = record(log, &topic(), t0).await;
    let subs = subscribers("wide", 100_000);
    let started = Instant::now();
    let created = log
        .expand(event.id, &subs, t0)
        .await
        .expect("expand 100 000");
    let took = started.elapsed();
    println!("{}: expand 100 000 subscribers took {took:?}", backend(log));
    assert_eq!(created, 100_000);
    let records = log.deliveries(event.id).await.expect("deliveries");
    assert_eq!(records.len(), 100_000);
    let distinct: HashSet<&str> = records.iter().map(|r| r.subscriber.as_str()).collect();
    assert_eq!(distinct.len(), 100_000);
    assert!(records.iter().all(|r| r.next_attempt_at == Some(t0)));

    let started = Instant::now();
    assert_eq!(log.expand(event.id, &subs, t0).await.expect("re-expand"), 0);
    println!(
        "{}: re-expand 100 000 subscribers took {:?}",
        backend(log),
        started.elapsed()
    );
}
both!(expand_a_hundred_thousand);

async fn claim_returns_due_records_only(log: &dyn EventLog) {
    let t0 = base_time();
    let topic = topic();
    let event = record(log, &topic, t0).await;
    let names = [
        "due",
        "future",
        "processed",
        "exhausted",
        "in-flight",
        "dropped",
    ];
    let subs: Vec<String> = names
        .iter()
        .map(|n| format!("https://subscriber.example/{n}/{}", Uuid::new_v4()))
        .collect();
    let sub = |n: &str| {
        let i = names.iter().position(|x| *x == n).expect("known name");
        subs[i].clone()
    };
    log.expand(event.id, &subs, t0).await.expect("expand");

    // Nothing is due before the records' due time.
    assert_eq!(claim_own(log, event.id, t0 - secs(1)).await, vec![]);

    // At t0 every record is due and claimed once, with its topic.
    let claimed = claim_own(log, event.id, t0).await;
    assert_eq!(claimed.len(), subs.len());
    assert!(
        claimed
            .iter()
            .all(|c| c.topic == topic && c.retry_count == 0)
    );
    let records = log.deliveries(event.id).await.expect("deliveries");
    assert!(records.iter().all(|r| r.processing_since == Some(t0)));
    // Claimed records are not claimed again while the claim is fresh.
    assert_eq!(claim_own(log, event.id, t0).await, vec![]);

    let t1 = t0 + secs(1);
    log.complete(
        &[
            completion(
                event.id,
                &sub("due"),
                Outcome::Retry {
                    error: "HTTP 500".to_owned(),
                    next_attempt_at: t1,
                },
            ),
            completion(
                event.id,
                &sub("future"),
                Outcome::Retry {
                    error: "HTTP 502".to_owned(),
                    next_attempt_at: t0 + secs(3600),
                },
            ),
            completion(event.id, &sub("processed"), Outcome::Delivered),
            completion(
                event.id,
                &sub("exhausted"),
                Outcome::Exhausted {
                    error: "HTTP 500".to_owned(),
                },
            ),
            completion(
                event.id,
                &sub("dropped"),
                Outcome::Dropped {
                    reason: "HTTP 410".to_owned(),
                },
            ),
        ],
        t0,
    )
    .await
    .expect("complete");

    // At t1 only the retried record is due; "in-flight" was claimed at t0,
    // which is within the visibility timeout.
    let claimed = claim_own(log, event.id, t1).await;
    assert_eq!(
        claimed,
        vec![Claimed {
            event_id: event.id,
            topic: topic.clone(),
            subscriber: sub("due"),
            retry_count: 1,
        }]
    );

    // A claim exactly as old as the visibility timeout is still alive.
    let at_boundary = t0 + TimeDelta::from_std(VISIBILITY).expect("fits");
    assert_eq!(claim_own(log, event.id, at_boundary).await, vec![]);

    // Older than that it belongs to a dead dispatcher: claimable again. The
    // record claimed at t1 is exactly at the boundary, so it stays claimed.
    let later = at_boundary + secs(1);
    let claimed = claim_own(log, event.id, later).await;
    assert_eq!(
        claimed
            .iter()
            .map(|c| c.subscriber.clone())
            .collect::<Vec<_>>(),
        vec![sub("in-flight")]
    );
    let records = log.deliveries(event.id).await.expect("deliveries");
    assert_eq!(
        record_of(&records, &sub("in-flight")).processing_since,
        Some(later)
    );
    assert_eq!(record_of(&records, &sub("due")).processing_since, Some(t1));

    // The future retry becomes due at its time.
    let claimed = claim_own(log, event.id, t0 + secs(3600)).await;
    let claimed: HashSet<String> = claimed.into_iter().map(|c| c.subscriber).collect();
    assert!(claimed.contains(&sub("future")));
    assert!(!claimed.contains(&sub("processed")));
    assert!(!claimed.contains(&sub("exhausted")));
    assert!(!claimed.contains(&sub("dropped")));
}
both!(claim_returns_due_records_only);

async fn claim_respects_limit_and_due_order(log: &dyn EventLog) {
    let t0 = base_time();
    let event = record(log, &topic(), t0).await;
    let subs = subscribers("order", 5);
    log.expand(event.id, &subs, t0).await.expect("expand");
    let claimed = claim_own(log, event.id, t0).await;
    assert_eq!(claimed.len(), 5);
    // Due at different times, latest first in the list.
    let completions: Vec<Completion> = subs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            completion(
                event.id,
                s,
                Outcome::Retry {
                    error: "timeout".to_owned(),
                    next_attempt_at: t0 + secs(10 - i64::try_from(i).expect("small")),
                },
            )
        })
        .collect();
    log.complete(&completions, t0).await.expect("complete");

    let t1 = t0 + secs(20);
    assert_eq!(log.claim(0, t1, VISIBILITY).await.expect("claim 0"), vec![]);
    let first = log.claim(2, t1, VISIBILITY).await.expect("claim 2");
    assert_eq!(first.len(), 2);
    let first: HashSet<String> = first.into_iter().map(|c| c.subscriber).collect();
    assert_eq!(
        first,
        HashSet::from([subs[4].clone(), subs[3].clone()]),
        "the longest overdue first"
    );
    let rest = claim_own(log, event.id, t1).await;
    assert_eq!(rest.len(), 3);
    assert!(rest.iter().all(|c| c.retry_count == 1));
}
both!(claim_respects_limit_and_due_order);

async fn complete_sets_each_outcome(log: &dyn EventLog) {
    let t0 = base_time();
    let event = record(log, &topic(), t0).await;
    let subs = subscribers("outcome", 4);
    log.expand(event.id, &subs, t0).await.expect("expand");
    assert_eq!(claim_own(log, event.id, t0).await.len(), 4);

    let t1 = t0 + secs(2);
    let retry_at = t1 + secs(8);
    log.complete(
        &[
            completion(event.id, &subs[0], Outcome::Delivered),
            completion(
                event.id,
                &subs[1],
                Outcome::Retry {
                    error: "HTTP 503 Service Unavailable".to_owned(),
                    next_attempt_at: retry_at,
                },
            ),
            completion(
                event.id,
                &subs[2],
                Outcome::Exhausted {
                    error: "connection refused".to_owned(),
                },
            ),
            completion(
                event.id,
                &subs[3],
                Outcome::Dropped {
                    reason: "HTTP 410 Gone".to_owned(),
                },
            ),
        ],
        t1,
    )
    .await
    .expect("complete");

    let records = log.deliveries(event.id).await.expect("deliveries");
    assert_eq!(
        record_of(&records, &subs[0]),
        &DeliveryRecord {
            processed_at: Some(t1),
            next_attempt_at: None,
            state: DeliveryState::Delivered,
            ..pending(event.id, &subs[0], t0)
        }
    );
    assert_eq!(
        record_of(&records, &subs[1]),
        &DeliveryRecord {
            retry_count: 1,
            last_error: Some("HTTP 503 Service Unavailable".to_owned()),
            next_attempt_at: Some(retry_at),
            ..pending(event.id, &subs[1], t0)
        }
    );
    assert_eq!(
        record_of(&records, &subs[2]),
        &DeliveryRecord {
            retry_count: 1,
            last_error: Some("connection refused".to_owned()),
            next_attempt_at: None,
            state: DeliveryState::Failed,
            ..pending(event.id, &subs[2], t0)
        }
    );
    assert_eq!(
        record_of(&records, &subs[3]),
        &DeliveryRecord {
            processed_at: Some(t1),
            last_error: Some("HTTP 410 Gone".to_owned()),
            next_attempt_at: None,
            state: DeliveryState::Dropped,
            ..pending(event.id, &subs[3], t0)
        }
    );

    // The retried record fails once more, then succeeds: the count grows,
    // and the last failure stays readable after delivery.
    assert_eq!(claim_own(log, event.id, retry_at).await.len(), 1);
    let retry_again = retry_at + secs(1);
    log.complete(
        &[completion(
            event.id,
            &subs[1],
            Outcome::Retry {
                error: "HTTP 500".to_owned(),
                next_attempt_at: retry_again,
            },
        )],
        retry_at,
    )
    .await
    .expect("complete");
    let claimed = claim_own(log, event.id, retry_again).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].retry_count, 2);
    log.complete(
        &[completion(event.id, &subs[1], Outcome::Delivered)],
        retry_again,
    )
    .await
    .expect("complete");
    let records = log.deliveries(event.id).await.expect("deliveries");
    assert_eq!(
        record_of(&records, &subs[1]),
        &DeliveryRecord {
            processed_at: Some(retry_again),
            retry_count: 2,
            last_error: Some("HTTP 500".to_owned()),
            next_attempt_at: None,
            state: DeliveryState::Delivered,
            ..pending(event.id, &subs[1], t0)
        }
    );

    // A late outcome for a closed record (its claim had gone stale and
    // another dispatcher finished it) changes nothing.
    log.complete(
        &[completion(
            event.id,
            &subs[0],
            Outcome::Retry {
                error: "late".to_owned(),
                next_attempt_at: t1,
            },
        )],
        t1 + secs(100),
    )
    .await
    .expect("late complete");
    assert_eq!(log.deliveries(event.id).await.expect("deliveries"), records);

    // An empty batch is a no-op.
    log.complete(&[], t1).await.expect("empty complete");
}
both!(complete_sets_each_outcome);

async fn purge_deletes_old_events_with_their_records(log: &dyn EventLog) {
    let t0 = base_time();
    let topic = topic();
    let old = record(log, &topic, t0 - secs(86_400)).await;
    log.expand(old.id, &subscribers("old", 3), t0)
        .await
        .expect("expand");
    let new = record(log, &topic, t0).await;
    log.expand(new.id, &subscribers("new", 2), t0)
        .await
        .expect("expand");
    // More old events than one purge chunk.
    let mut many = Vec::new();
    for _ in 0..1_100 {
        many.push(record(log, &topic, t0 - secs(7_200)).await.id);
    }
    // Exactly at the cutoff is not before it.
    let cutoff = t0 - secs(3_600);
    let at_cutoff = record(log, &topic, cutoff).await;

    let deleted = log.purge_before(cutoff).await.expect("purge");
    assert!(deleted >= 1_101, "deleted {deleted}");
    assert_eq!(log.event(old.id).await.expect("read"), None);
    assert_eq!(log.deliveries(old.id).await.expect("deliveries"), vec![]);
    for id in [many[0], many[549], many[1_099]] {
        assert_eq!(log.event(id).await.expect("read"), None);
    }
    assert_eq!(log.event(new.id).await.expect("read"), Some(new.clone()));
    assert_eq!(log.deliveries(new.id).await.expect("deliveries").len(), 2);
    assert!(log.event(at_cutoff.id).await.expect("read").is_some());
    assert_eq!(log.purge_before(cutoff).await.expect("purge again"), 0);
}
both!(purge_deletes_old_events_with_their_records);

/// Every attempt is kept with the outcome it came to, in the completion's
/// write: when, how long, the status, the error, the answer's beginning
/// (bytes as they came); a completion without an attempt (a lease that ran
/// out) adds none; they go with their event.
async fn attempts_are_kept_per_delivery_and_go_with_their_event(log: &dyn EventLog) {
    let t0 = base_time();
    let topic = topic();
    let event = record(log, &topic, t0).await;
    let subscribers = subscribers("history", 2);
    log.expand(event.id, &subscribers, t0)
        .await
        .expect("expand");
    let attempt = |at: DateTime<Utc>, status: Option<u16>, response: &[u8]| Attempt {
        at,
        duration_micros: 1_234,
        status,
        error: None,
        response: Bytes::copy_from_slice(response),
    };
    let failed = Completion {
        attempt: Some(attempt(t0, Some(503), b"\x00busy\xff")),
        ..completion(
            event.id,
            &subscribers[0],
            Outcome::Retry {
                error: "HTTP 503 Service Unavailable".to_owned(),
                next_attempt_at: t0 + secs(1),
            },
        )
    };
    let refused = Completion {
        attempt: Some(attempt(t0, None, b"")),
        ..completion(
            event.id,
            &subscribers[1],
            Outcome::Retry {
                error: "request failed: connection refused".to_owned(),
                next_attempt_at: t0 + secs(1),
            },
        )
    };
    log.complete(&[failed, refused], t0)
        .await
        .expect("complete");
    claim_own(log, event.id, t0 + secs(2)).await;
    let delivered = Completion {
        attempt: Some(attempt(t0 + secs(2), Some(204), b"")),
        ..completion(event.id, &subscribers[0], Outcome::Delivered)
    };
    let expired = completion(
        event.id,
        &subscribers[1],
        Outcome::Dropped {
            reason: "lease expired".to_owned(),
        },
    );
    log.complete(&[delivered, expired], t0 + secs(2))
        .await
        .expect("complete again");
    // One of the three attempts was answered 2xx; an event recorded before
    // the window is outside it, however late its delivery.
    assert_eq!(log.delivered_since(t0).await.expect("delivered"), 1);
    assert_eq!(
        log.delivered_since(t0 + secs(1)).await.expect("delivered"),
        0
    );

    let first = log
        .attempts(event.id, &subscribers[0])
        .await
        .expect("attempts");
    assert_eq!(
        first,
        vec![
            Attempt {
                error: Some("HTTP 503 Service Unavailable".to_owned()),
                ..attempt(t0, Some(503), b"\x00busy\xff")
            },
            attempt(t0 + secs(2), Some(204), b""),
        ],
        "{}",
        backend(log)
    );
    let second = log
        .attempts(event.id, &subscribers[1])
        .await
        .expect("attempts");
    assert_eq!(
        second,
        vec![Attempt {
            error: Some("request failed: connection refused".to_owned()),
            ..attempt(t0, None, b"")
        }],
        "the dropped completion made no attempt"
    );
    assert_eq!(
        log.attempts(event.id, "nobody").await.expect("attempts"),
        vec![]
    );

    assert!(log.purge_before(t0 + secs(1)).await.expect("purge") >= 1);
    assert_eq!(
        log.attempts(event.id, &subscribers[0])
            .await
            .expect("attempts"),
        vec![],
        "purged with the event"
    );
}
both!(attempts_are_kept_per_delivery_and_go_with_their_event);

/// Eight dispatchers draining one event's 5 000 records at once.
async fn concurrent_claimers_never_share_a_record(log: Arc<dyn EventLog>) {
    let t0 = base_time();
    let event = record(&*log, &topic(), t0).await;
    let subs = subscribers("concurrent", 5_000);
    log.expand(event.id, &subs, t0).await.expect("expand");

    let claimers: Vec<_> = (0..8)
        .map(|_| {
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let batch = log.claim(37, t0, VISIBILITY).await.expect("claim");
                    if batch.is_empty() {
                        return mine;
                    }
                    mine.extend(batch);
                }
            })
        })
        .collect();
    let mut seen = HashSet::new();
    let mut per_claimer = Vec::new();
    for claimer in claimers {
        let mine = claimer.await.expect("claimer task");
        per_claimer.push(mine.len());
        for claimed in mine {
            assert_eq!(claimed.event_id, event.id);
            assert!(
                seen.insert(claimed.subscriber.clone()),
                "{} was claimed twice",
                claimed.subscriber
            );
        }
    }
    assert_eq!(
        seen.len(),
        subs.len(),
        "every record claimed ({per_claimer:?})"
    );
    println!("{}: 8 claimers took {per_claimer:?}", backend(&*log));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn concurrent_claimers_postgres() {
    let Some(scratch) = PgScratch::new().await else {
        return;
    };
    concurrent_claimers_never_share_a_record(Arc::new(scratch.log.clone())).await;
    scratch.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn concurrent_claimers_sqlite() {
    let scratch = SqliteScratch::new("concurrent").await;
    concurrent_claimers_never_share_a_record(Arc::new(scratch.log.clone())).await;
    scratch.remove().await;
}

/// Expansions and purges of the same events at once: whichever wins, an
/// event that is gone has no delivery records left behind.
async fn expand_racing_purge_leaves_no_orphans(log: &dyn EventLog) {
    let t0 = base_time();
    let cutoff = t0 - secs(60);
    let subs = subscribers("race", 2_000);
    let (mut purged, mut kept) = (0, 0);
    for _ in 0..8 {
        let event = record(log, &topic(), t0 - secs(3_600)).await;
        let (expanded, purge) =
            tokio::join!(log.expand(event.id, &subs, t0), log.purge_before(cutoff));
        purge.expect("purge");
        let records = log.deliveries(event.id).await.expect("deliveries");
        match log.event(event.id).await.expect("read") {
            None => {
                purged += 1;
                assert_eq!(records, vec![], "records outlived their event");
            }
            Some(_) => {
                kept += 1;
                assert_eq!(expanded.expect("expand of a live event"), 2_000);
                assert_eq!(records.len(), 2_000);
            }
        }
    }
    // Purge whatever an expansion kept alive; its records go with it.
    log.purge_before(cutoff).await.expect("purge");
    println!(
        "{}: race purged first {purged}, expanded first {kept}",
        backend(log)
    );
}
both!(expand_racing_purge_leaves_no_orphans);

/// The database itself refuses delivery records without an event, deletes
/// them with their event, and never lets either key change (PostgreSQL
/// enforces this with statement-level triggers; see the migration).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_delivery_records_need_their_event() {
    let Some(scratch) = PgScratch::new().await else {
        return;
    };
    let log = &scratch.log;
    let pool = log.pool();
    let orphan = sqlx::query(
        "INSERT INTO websub_deliveries (event_id, subscriber, next_attempt_at) \
         VALUES ($1, 'https://subscriber.example/orphan', now())",
    )
    .bind(Uuid::now_v7())
    .execute(pool)
    .await
    .expect_err("a record for a missing event");
    assert_eq!(
        orphan.as_database_error().and_then(|e| e.code()).as_deref(),
        Some("23503"),
        "{orphan}"
    );

    let event = record(log, &topic(), base_time()).await;
    log.expand(event.id, &subscribers("fk", 3), base_time())
        .await
        .expect("expand");
    let moved = sqlx::query("UPDATE websub_deliveries SET event_id = $1 WHERE event_id = $2")
        .bind(Uuid::now_v7())
        .bind(event.id)
        .execute(pool)
        .await
        .expect_err("moving records to another event");
    assert_eq!(
        moved.as_database_error().and_then(|e| e.code()).as_deref(),
        Some("23503")
    );
    sqlx::query("UPDATE websub_events SET id = $1 WHERE id = $2")
        .bind(Uuid::now_v7())
        .bind(event.id)
        .execute(pool)
        .await
        .expect_err("changing an event's id");

    sqlx::query("DELETE FROM websub_events WHERE id = $1")
        .bind(event.id)
        .execute(pool)
        .await
        .expect("delete the event");
    assert_eq!(log.deliveries(event.id).await.expect("deliveries"), vec![]);
    scratch.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_delivery_records_need_their_event() {
    let scratch = SqliteScratch::new("fk").await;
    let log = &scratch.log;
    let pool = log.pool();
    sqlx::query(
        "INSERT INTO websub_deliveries (event_id, subscriber, next_attempt_at) \
         VALUES (?1, 'https://subscriber.example/orphan', 0)",
    )
    .bind(Uuid::now_v7())
    .execute(pool)
    .await
    .expect_err("a record for a missing event");

    let event = record(log, &topic(), base_time()).await;
    log.expand(event.id, &subscribers("fk", 3), base_time())
        .await
        .expect("expand");
    sqlx::query("DELETE FROM websub_events WHERE id = ?1")
        .bind(event.id)
        .execute(pool)
        .await
        .expect("delete the event");
    assert_eq!(log.deliveries(event.id).await.expect("deliveries"), vec![]);
    scratch.remove().await;
}

// ---------------------------------------------------------------------------
// Connecting and migrating
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_connect_is_idempotent_and_concurrent() {
    let path = sqlite_path("connect");
    let url = format!("sqlite:{}", path.display());
    // Several pools opening one new file at once, the subscription store's
    // among them: one migrates each schema, the others find nothing to do.
    let (opened, store) = tokio::join!(
        futures::future::join_all((0..4).map(|_| SqliteEventLog::connect(&url))),
        websub_hub::store::sqlite::SqliteStore::connect(&url)
    );
    let store = store.expect("open the subscription store on the same file");
    let logs: Vec<SqliteEventLog> = opened
        .into_iter()
        .collect::<Result<_, _>>()
        .expect("concurrent connects");
    let event = record(&logs[0], &topic(), base_time()).await;
    let again = SqliteEventLog::connect(path.to_str().expect("utf-8 path"))
        .await
        .expect("reopen by plain path");
    assert_eq!(again.event(event.id).await.expect("read"), Some(event));

    let tables: Vec<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .fetch_all(again.pool())
            .await
            .expect("list tables");
    for table in [
        "websub_hub_migrations",
        "websub_store_migrations",
        "websub_events",
        "websub_deliveries",
        "websub_subscriptions",
    ] {
        assert!(tables.contains(&table.to_owned()), "{table} in {tables:?}");
    }
    assert!(
        !tables.contains(&"_sqlx_migrations".to_owned()),
        "{tables:?}"
    );
    let (journal, foreign_keys, synchronous): (String, i64, i64) = sqlx::query_as(
        "SELECT (SELECT journal_mode FROM pragma_journal_mode), \
                (SELECT foreign_keys FROM pragma_foreign_keys), \
                (SELECT synchronous FROM pragma_synchronous)",
    )
    .fetch_one(again.pool())
    .await
    .expect("read pragmas");
    assert_eq!(journal, "wal");
    assert_eq!(foreign_keys, 1);
    assert_eq!(synchronous, 1, "NORMAL");

    store.pool().close().await;
    again.pool().close().await;
    for log in logs {
        log.pool().close().await;
    }
    SqliteScratch { log: again, path }.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_connect_migrates_the_default_schema() {
    let Some(url) = websub_storetest::servers::postgres_url().await else {
        return;
    };
    // Replicas starting together, each migrating the subscription store and
    // the event log: the migrators' advisory lock serialises them, and each
    // keeps its own history table. The tables may already exist from another
    // test binary; nothing here assumes they are empty.
    let (a, b, store) = tokio::join!(
        PostgresEventLog::connect(&url),
        PostgresEventLog::connect(&url),
        websub_hub::store::postgres::PostgresStore::connect(&url)
    );
    let (a, b) = (a.expect("connect a"), b.expect("connect b"));
    store.expect("migrate the subscription store beside the event log");
    let event = record(&a, &topic(), base_time()).await;
    assert_eq!(b.event(event.id).await.expect("read"), Some(event.clone()));
    for table in ["websub_hub_migrations", "websub_store_migrations"] {
        let found: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
            .bind(table)
            .fetch_one(a.pool())
            .await
            .expect("look up a migrations table");
        assert_eq!(found.as_deref(), Some(table));
    }
    // Leave nothing behind in the shared schema.
    sqlx::query("DELETE FROM websub_events WHERE id = $1")
        .bind(event.id)
        .execute(a.pool())
        .await
        .expect("clean up");
}

async fn health_failed_and_retry_failed(log: &dyn EventLog) {
    let t0 = base_time();
    let watched = topic();
    let subs = subscribers("health", 2);
    let (a, b) = (subs[0].as_str(), subs[1].as_str());
    let mut events = Vec::new();
    for offset in 0..3 {
        let event = record(log, &watched, t0 + secs(offset)).await;
        log.expand(event.id, &subs, t0).await.expect("expand");
        events.push(event);
    }
    let elsewhere = record(log, &topic(), t0).await;
    log.expand(elsewhere.id, &subs[..1], t0)
        .await
        .expect("expand");
    let claimed = log
        .claim(100, t0 + secs(3), VISIBILITY)
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 7);

    let done = t0 + secs(4);
    let exhausted = |error: &str| Outcome::Exhausted {
        error: error.to_owned(),
    };
    log.complete(
        &[
            completion(events[0].id, a, Outcome::Delivered),
            completion(events[0].id, b, exhausted("HTTP 500 Internal Server Error")),
            completion(
                events[1].id,
                a,
                Outcome::Retry {
                    error: "HTTP 503 Service Unavailable".to_owned(),
                    next_attempt_at: done + secs(100),
                },
            ),
            completion(events[1].id, b, Outcome::Delivered),
            completion(events[2].id, a, exhausted("timed out")),
            completion(elsewhere.id, a, exhausted("connection refused")),
        ],
        done,
    )
    .await
    .expect("complete");

    assert_eq!(
        log.health(&watched, a, 10).await.expect("health"),
        DeliveryHealth {
            last_success: Some(done),
            last_error: Some("timed out".to_owned()),
            pending: 1,
            failed: 1,
        }
    );
    // events[2] to b is still in flight: pending.
    assert_eq!(
        log.health(&watched, b, 10).await.expect("health"),
        DeliveryHealth {
            last_success: Some(done),
            last_error: Some("HTTP 500 Internal Server Error".to_owned()),
            pending: 1,
            failed: 1,
        }
    );
    // A window of one sees the newest event alone.
    assert_eq!(
        log.health(&watched, a, 1).await.expect("health"),
        DeliveryHealth {
            last_success: None,
            last_error: Some("timed out".to_owned()),
            pending: 0,
            failed: 1,
        }
    );
    assert_eq!(
        log.health(&topic(), a, 10).await.expect("health"),
        DeliveryHealth::default()
    );

    let of_topic = FailedFilter {
        topic: Some(&watched),
        subscriber: None,
        event_id: None,
    };
    let failed = log.failed(of_topic, 10).await.expect("failed");
    let listed: Vec<_> = failed
        .iter()
        .map(|f| (f.event_id, f.subscriber.as_str(), f.last_error.as_deref()))
        .collect();
    assert_eq!(
        listed,
        vec![
            (events[2].id, a, Some("timed out")),
            (events[0].id, b, Some("HTTP 500 Internal Server Error")),
        ]
    );
    assert_eq!(failed[0].topic, watched);
    assert_eq!(failed[0].created_at, events[2].created_at);
    assert_eq!(failed[0].retry_count, 1);
    assert_eq!(log.failed(of_topic, 1).await.expect("failed").len(), 1);
    let everywhere_for_a = FailedFilter {
        topic: None,
        subscriber: Some(a),
        event_id: None,
    };
    assert_eq!(
        log.failed(everywhere_for_a, 10)
            .await
            .expect("failed")
            .len(),
        2
    );

    // One event's record, whatever its topic and subscriber.
    let one_event = FailedFilter {
        event_id: Some(events[0].id),
        ..FailedFilter::default()
    };
    let only = log.failed(one_event, 10).await.expect("failed");
    let listed: Vec<_> = only
        .iter()
        .map(|f| (f.event_id, f.subscriber.as_str()))
        .collect();
    assert_eq!(listed, vec![(events[0].id, b)]);

    let again = done + secs(10);
    let one = FailedFilter {
        topic: Some(&watched),
        subscriber: Some(a),
        event_id: None,
    };
    assert_eq!(log.retry_failed(one, again).await.expect("retry"), 1);
    let records = log.deliveries(events[2].id).await.expect("deliveries");
    let reopened = record_of(&records, a);
    assert_eq!(reopened.next_attempt_at, Some(again));
    assert_eq!(reopened.retry_count, 0);
    assert_eq!(reopened.last_error.as_deref(), Some("timed out"));
    assert_eq!(log.failed(of_topic, 10).await.expect("failed").len(), 1);
    let due = claim_own(log, events[2].id, again).await;
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].subscriber, a);

    assert_eq!(log.retry_failed(of_topic, again).await.expect("retry"), 1);
    assert!(log.failed(of_topic, 10).await.expect("failed").is_empty());
    // The other topic's exhausted record is untouched.
    assert_eq!(
        log.failed(everywhere_for_a, 10)
            .await
            .expect("failed")
            .len(),
        1
    );
    let elsewhere = log.failed(everywhere_for_a, 10).await.expect("failed");
    let in_flight = FailedFilter {
        event_id: Some(events[2].id),
        ..FailedFilter::default()
    };
    assert_eq!(
        log.retry_failed(in_flight, again).await.expect("retry"),
        0,
        "an event with no exhausted record"
    );
    let that_one = FailedFilter {
        event_id: Some(elsewhere[0].event_id),
        ..FailedFilter::default()
    };
    assert_eq!(log.retry_failed(that_one, again).await.expect("retry"), 1);
    assert!(
        log.failed(everywhere_for_a, 10)
            .await
            .expect("failed")
            .is_empty()
    );
}
both!(health_failed_and_retry_failed);

async fn expansion_in_parts_survives_a_crash_between_parts(log: &dyn EventLog) {
    let t0 = base_time();
    let event = record(log, &topic(), t0).await;
    let subs = subscribers("parts", 30);
    let refs: Vec<&str> = subs.iter().map(String::as_str).collect();
    let first = log.expand_claimed(event.id, &refs[..10], t0).await;
    assert_eq!(first.expect("part").len(), 10);
    // Parts leave the event unexpanded.
    assert!(
        log.unexpanded(1000)
            .await
            .expect("unexpanded")
            .iter()
            .any(|unexpanded| unexpanded.id == event.id)
    );
    // A part repeated, overlapping the next: existing records stay as they are.
    let overlapping = log.expand_claimed(event.id, &refs[5..20], t0).await;
    assert_eq!(overlapping.expect("part").len(), 10);
    // The process "crashed"; the event is expanded again in full, which
    // creates only what is missing and marks it.
    assert_eq!(log.expand(event.id, &subs, t0).await.expect("expand"), 10);
    assert!(
        !log.unexpanded(1000)
            .await
            .expect("unexpanded")
            .iter()
            .any(|unexpanded| unexpanded.id == event.id)
    );
    let records = log.deliveries(event.id).await.expect("deliveries");
    assert_eq!(records.len(), 30);
    assert_eq!(
        records
            .iter()
            .filter(|record| record.processing_since.is_some())
            .count(),
        20,
        "the claimed records were not reset"
    );
    match log.expand_claimed(Uuid::now_v7(), &refs, t0).await {
        Err(EventLogError::UnknownEvent(_)) => {}
        other => panic!("expand_claimed of a missing event: {other:?}"),
    }
}
both!(expansion_in_parts_survives_a_crash_between_parts);

fn strs(subscribers: &[String]) -> Vec<&str> {
    subscribers.iter().map(String::as_str).collect()
}

fn sorted(mut subscribers: Vec<String>) -> Vec<String> {
    subscribers.sort();
    subscribers
}

fn is_unexpanded(unexpanded: &[LoggedEvent], event_id: Uuid) -> bool {
    unexpanded.iter().any(|event| event.id == event_id)
}

async fn claimed_parts_return_only_the_records_they_create(log: &dyn EventLog) {
    let t0 = base_time();
    let t1 = t0 + secs(1);
    let event = record(log, &topic(), t0).await;
    let subs = subscribers("claimed", 20);

    let first = log
        .expand_claimed(event.id, &strs(&subs[..10]), t0)
        .await
        .expect("first part");
    assert_eq!(sorted(first), sorted(subs[..10].to_vec()));
    // Overlapping the first part, with a subscriber listed twice: only the
    // ten new records come back.
    let mut second_part = strs(&subs[5..20]);
    second_part.push(subs[15].as_str());
    let second = log
        .expand_claimed(event.id, &second_part, t1)
        .await
        .expect("second part");
    assert_eq!(sorted(second), sorted(subs[10..20].to_vec()));
    assert_eq!(
        log.expand_claimed(event.id, &strs(&subs), t1)
            .await
            .expect("a part of existing records"),
        Vec::<String>::new()
    );

    // Each record is claimed as of the call that created it, due at once,
    // with no attempt counted; the overlap kept its first claim.
    let records = log.deliveries(event.id).await.expect("deliveries");
    assert_eq!(records.len(), 20);
    for (index, subscriber) in subs.iter().enumerate() {
        let created = if index < 10 { t0 } else { t1 };
        assert_eq!(
            record_of(&records, subscriber),
            &DeliveryRecord {
                processing_since: Some(created),
                ..pending(event.id, subscriber, created)
            }
        );
    }
    // Claimed, so not claimable until the visibility timeout passes.
    assert!(claim_own(log, event.id, t1 + secs(1)).await.is_empty());

    // Parts leave the event unexpanded; an expansion with no subscribers
    // marks it and creates nothing.
    assert!(is_unexpanded(
        &log.unexpanded(1000).await.expect("unexpanded"),
        event.id
    ));
    assert_eq!(log.expand(event.id, &[], t1).await.expect("mark"), 0);
    assert!(!is_unexpanded(
        &log.unexpanded(1000).await.expect("unexpanded"),
        event.id
    ));
    assert_eq!(
        log.deliveries(event.id).await.expect("deliveries").len(),
        20
    );

    for part in [strs(&subs[..1]), Vec::new()] {
        match log.expand_claimed(Uuid::now_v7(), &part, t0).await {
            Err(EventLogError::UnknownEvent(_)) => {}
            other => panic!("expand_claimed of a missing event: {other:?}"),
        }
    }
}
both!(claimed_parts_return_only_the_records_they_create);

async fn claimed_parts_never_take_over_existing_records(log: &dyn EventLog) {
    let t0 = base_time();
    let event = record(log, &topic(), t0).await;
    let subs = subscribers("existing", 4);
    // Records another process wrote and left in every state: due and
    // unclaimed, claimed, delivered, and failed once.
    assert_eq!(log.expand(event.id, &subs, t0).await.expect("expand"), 4);
    let claimed = claim_own(log, event.id, t0).await;
    assert_eq!(claimed.len(), 4);
    let t1 = t0 + secs(1);
    log.complete(
        &[
            completion(event.id, &subs[1], Outcome::Delivered),
            completion(
                event.id,
                &subs[2],
                Outcome::Retry {
                    error: "HTTP 500".to_owned(),
                    next_attempt_at: t1,
                },
            ),
            completion(
                event.id,
                &subs[3],
                Outcome::Retry {
                    error: "HTTP 503".to_owned(),
                    next_attempt_at: t1,
                },
            ),
        ],
        t1,
    )
    .await
    .expect("complete");
    let before = log.deliveries(event.id).await.expect("deliveries");

    // Expanded again (a restart, or another replica): nothing is this
    // caller's to deliver, and no record changes.
    let t2 = t1 + secs(1);
    assert_eq!(
        log.expand_claimed(event.id, &strs(&subs), t2)
            .await
            .expect("claimed part"),
        Vec::<String>::new()
    );
    assert_eq!(log.deliveries(event.id).await.expect("deliveries"), before);
    // The retried ones are still the claim path's to take.
    let mut due: Vec<String> = claim_own(log, event.id, t2)
        .await
        .into_iter()
        .map(|claimed| claimed.subscriber)
        .collect();
    due.sort();
    assert_eq!(due, sorted(subs[2..].to_vec()));
}
both!(claimed_parts_never_take_over_existing_records);

async fn claimed_records_of_a_dead_process_become_claimable(log: &dyn EventLog) {
    let t0 = base_time();
    let event = record(log, &topic(), t0).await;
    let subs = subscribers("dead", 5);
    assert_eq!(
        log.expand_claimed(event.id, &strs(&subs), t0)
            .await
            .expect("claimed part")
            .len(),
        5
    );
    // The process that wrote them died before any attempt finished.
    assert!(claim_own(log, event.id, t0 + secs(29)).await.is_empty());
    let after_timeout = t0 + TimeDelta::from_std(VISIBILITY).expect("visibility") + secs(1);
    let mut taken: Vec<(String, u32)> = claim_own(log, event.id, after_timeout)
        .await
        .into_iter()
        .map(|claimed| (claimed.subscriber, claimed.retry_count))
        .collect();
    taken.sort();
    assert_eq!(
        taken,
        sorted(subs.clone())
            .into_iter()
            .map(|subscriber| (subscriber, 0))
            .collect::<Vec<_>>()
    );
}
both!(claimed_records_of_a_dead_process_become_claimable);

async fn concurrent_claimed_parts_share_the_records(log: &dyn EventLog) {
    // Four expanders of one event at once (replicas, or a restart racing a
    // slow process), each writing overlapping parts: every record is
    // created, and handed to exactly one of them.
    let t0 = base_time();
    let event = record(log, &topic(), t0).await;
    let subs = subscribers("shared", 400);
    let expanders = (0..4).map(|expander| {
        let subs = &subs;
        async move {
            let mut mine = Vec::new();
            // Each starts at another place and walks round the whole list
            // in parts of 50.
            for part in 0..8 {
                let start = (expander * 100 + part * 50) % subs.len();
                let slice = &subs[start..start + 50];
                mine.extend(
                    log.expand_claimed(event.id, &strs(slice), t0)
                        .await
                        .expect("claimed part"),
                );
            }
            mine
        }
    });
    let handed: Vec<Vec<String>> = futures::future::join_all(expanders).await;
    let mut all: Vec<String> = handed.iter().flatten().cloned().collect();
    all.sort();
    let unique: HashSet<&String> = all.iter().collect();
    assert_eq!(unique.len(), all.len(), "a record was handed out twice");
    assert_eq!(all, sorted(subs.clone()));
    assert_eq!(
        log.deliveries(event.id).await.expect("deliveries").len(),
        400
    );
}
both!(concurrent_claimed_parts_share_the_records);

async fn complete_mixes_events_and_ignores_late_deliveries(log: &dyn EventLog) {
    // One batch of outcomes for two events, interleaved as attempts finish:
    // each record gets its own outcome, whatever else is in the batch.
    let t0 = base_time();
    let first = record(log, &topic(), t0).await;
    let second = record(log, &topic(), t0).await;
    let subs = subscribers("mixed", 3);
    for event in [&first, &second] {
        assert_eq!(
            log.expand_claimed(event.id, &strs(&subs), t0)
                .await
                .expect("claimed part")
                .len(),
            3
        );
    }
    let t1 = t0 + secs(1);
    let retry_at = t1 + secs(5);
    log.complete(
        &[
            completion(first.id, &subs[0], Outcome::Delivered),
            completion(second.id, &subs[0], Outcome::Delivered),
            completion(
                first.id,
                &subs[1],
                Outcome::Retry {
                    error: "HTTP 502".to_owned(),
                    next_attempt_at: retry_at,
                },
            ),
            completion(first.id, &subs[2], Outcome::Delivered),
            completion(second.id, &subs[1], Outcome::Delivered),
        ],
        t1,
    )
    .await
    .expect("complete");
    let delivered = |event_id: Uuid, subscriber: &str| DeliveryRecord {
        processed_at: Some(t1),
        next_attempt_at: None,
        state: DeliveryState::Delivered,
        ..pending(event_id, subscriber, t0)
    };
    let firsts = log.deliveries(first.id).await.expect("deliveries");
    assert_eq!(record_of(&firsts, &subs[0]), &delivered(first.id, &subs[0]));
    assert_eq!(
        record_of(&firsts, &subs[1]),
        &DeliveryRecord {
            retry_count: 1,
            last_error: Some("HTTP 502".to_owned()),
            next_attempt_at: Some(retry_at),
            ..pending(first.id, &subs[1], t0)
        }
    );
    assert_eq!(record_of(&firsts, &subs[2]), &delivered(first.id, &subs[2]));
    let seconds = log.deliveries(second.id).await.expect("deliveries");
    assert_eq!(
        record_of(&seconds, &subs[0]),
        &delivered(second.id, &subs[0])
    );
    assert_eq!(
        record_of(&seconds, &subs[1]),
        &delivered(second.id, &subs[1])
    );
    assert_eq!(
        record_of(&seconds, &subs[2]),
        &DeliveryRecord {
            processing_since: Some(t0),
            ..pending(second.id, &subs[2], t0)
        },
        "a record with no outcome in the batch is untouched"
    );

    // A late delivery of a closed record (its claim went stale and another
    // dispatcher delivered it) keeps the first delivery's time.
    log.complete(
        &[completion(first.id, &subs[0], Outcome::Delivered)],
        t1 + secs(100),
    )
    .await
    .expect("late complete");
    assert_eq!(log.deliveries(first.id).await.expect("deliveries"), firsts);
}
both!(complete_mixes_events_and_ignores_late_deliveries);

async fn unwritten_records_are_created_with_their_first_outcome(log: &dyn EventLog) {
    // A scheduler that held records in memory writes each with its first
    // outcome: delivered (its attempt kept in the record), retried, dropped.
    let t0 = base_time();
    let event = record(log, &topic(), t0).await;
    assert!(!log.has_records(event.id).await.expect("has records"));
    let subs = subscribers("unwritten", 4);
    let t1 = t0 + secs(1);
    let retry_at = t1 + secs(5);
    let delivering = Attempt {
        at: t0,
        duration_micros: 900,
        status: Some(204),
        error: None,
        response: Bytes::new(),
    };
    // A resend wrote one of them meanwhile: it is completed, not created.
    log.expand_waiting(event.id, &[subs[3].as_str()], t0, false)
        .await
        .expect("written meanwhile");
    let gone = Uuid::now_v7();
    log.complete_unwritten(
        &[
            Completion {
                attempt: Some(delivering.clone()),
                ..completion(event.id, &subs[0], Outcome::Delivered)
            },
            completion(
                event.id,
                &subs[1],
                Outcome::Retry {
                    error: "HTTP 502".to_owned(),
                    next_attempt_at: retry_at,
                },
            ),
            completion(
                event.id,
                &subs[2],
                Outcome::Dropped {
                    reason: "the lease expired".to_owned(),
                },
            ),
            completion(event.id, &subs[3], Outcome::Delivered),
            completion(gone, &subs[0], Outcome::Delivered),
        ],
        t1,
    )
    .await
    .expect("complete unwritten");
    assert!(log.has_records(event.id).await.expect("has records"));
    assert!(!log.has_records(gone).await.expect("has records"));
    let delivered = |subscriber: &str| DeliveryRecord {
        processed_at: Some(t1),
        next_attempt_at: None,
        state: DeliveryState::Delivered,
        ..pending(event.id, subscriber, t0)
    };
    let records = log.deliveries(event.id).await.expect("deliveries");
    assert_eq!(records.len(), 4, "{}", backend(log));
    assert_eq!(record_of(&records, &subs[0]), &delivered(&subs[0]));
    assert_eq!(
        record_of(&records, &subs[1]),
        &DeliveryRecord {
            retry_count: 1,
            last_error: Some("HTTP 502".to_owned()),
            next_attempt_at: Some(retry_at),
            ..pending(event.id, &subs[1], t0)
        }
    );
    assert_eq!(
        record_of(&records, &subs[2]),
        &DeliveryRecord {
            processed_at: Some(t1),
            last_error: Some("the lease expired".to_owned()),
            next_attempt_at: None,
            state: DeliveryState::Dropped,
            ..pending(event.id, &subs[2], t0)
        }
    );
    assert_eq!(record_of(&records, &subs[3]), &delivered(&subs[3]));
    assert_eq!(
        log.attempts(event.id, &subs[0]).await.expect("attempts"),
        vec![delivering.clone()]
    );

    // A late first outcome of a record closed meanwhile changes nothing.
    log.complete_unwritten(
        &[completion(event.id, &subs[0], Outcome::Delivered)],
        t1 + secs(100),
    )
    .await
    .expect("late");
    assert_eq!(log.deliveries(event.id).await.expect("deliveries"), records);

    // A batch of hundreds, as a fan-out writes them: every one created.
    let many = record(log, &topic(), t0).await;
    let subs = subscribers("many", 321);
    let completions: Vec<Completion> = subs
        .iter()
        .map(|subscriber| Completion {
            attempt: Some(delivering.clone()),
            ..completion(many.id, subscriber, Outcome::Delivered)
        })
        .collect();
    log.complete_unwritten(&completions, t1)
        .await
        .expect("complete a batch");
    let records = log.deliveries(many.id).await.expect("deliveries");
    assert_eq!(records.len(), subs.len(), "{}", backend(log));
    for subscriber in &subs {
        assert_eq!(
            record_of(&records, subscriber).state,
            DeliveryState::Delivered
        );
    }
    assert_eq!(
        log.attempts(many.id, &subs[320]).await.expect("attempts"),
        vec![delivering]
    );
}
both!(unwritten_records_are_created_with_their_first_outcome);

// ---------------------------------------------------------------------------
// What operators read and steer
// ---------------------------------------------------------------------------

/// The state of each listed record, by (event, subscriber).
fn states(
    listed: &[websub_hub::storage::events::DeliverySummary],
) -> Vec<(Uuid, String, DeliveryState)> {
    listed
        .iter()
        .map(|record| (record.event_id, record.subscriber.clone(), record.state))
        .collect()
}

async fn deliveries_are_listed_by_state_topic_subscriber_and_time(log: &dyn EventLog) {
    let t0 = base_time();
    let watched = topic();
    let subs = subscribers("listed", 2);
    let (a, b) = (subs[0].as_str(), subs[1].as_str());
    let first = record(log, &watched, t0).await;
    let second = record(log, &watched, t0 + secs(1)).await;
    let elsewhere = record(log, &topic(), t0 + secs(2)).await;
    for event in [&first, &second, &elsewhere] {
        log.expand(event.id, &subs, t0).await.expect("expand");
    }
    let done = t0 + secs(3);
    log.complete(
        &[
            completion(first.id, a, Outcome::Delivered),
            completion(
                first.id,
                b,
                Outcome::Exhausted {
                    error: "HTTP 500".to_owned(),
                },
            ),
            completion(
                second.id,
                a,
                Outcome::Dropped {
                    reason: "410 Gone".to_owned(),
                },
            ),
            completion(
                second.id,
                b,
                Outcome::Skipped {
                    reason: "endpoint disabled".to_owned(),
                },
            ),
        ],
        done,
    )
    .await
    .expect("complete");
    let of_topic = |state: Option<DeliveryState>| DeliveryFilter {
        topic: Some(&watched),
        state,
        ..DeliveryFilter::default()
    };
    let listed = log.list(of_topic(None), 100).await.expect("list");
    assert_eq!(
        states(&listed),
        vec![
            (second.id, a.to_owned(), DeliveryState::Dropped),
            (second.id, b.to_owned(), DeliveryState::Skipped),
            (first.id, a.to_owned(), DeliveryState::Delivered),
            (first.id, b.to_owned(), DeliveryState::Failed),
        ],
        "newest event first, then by subscriber"
    );
    assert_eq!(listed[3].last_error.as_deref(), Some("HTTP 500"));
    assert_eq!(listed[3].topic, watched);
    assert_eq!(listed[1].processed_at, Some(done));
    for (state, expected) in [
        (DeliveryState::Delivered, (first.id, a)),
        (DeliveryState::Failed, (first.id, b)),
        (DeliveryState::Dropped, (second.id, a)),
        (DeliveryState::Skipped, (second.id, b)),
    ] {
        let listed = log.list(of_topic(Some(state)), 100).await.expect("list");
        assert_eq!(
            states(&listed),
            vec![(expected.0, expected.1.to_owned(), state)],
            "{state:?}"
        );
    }
    let pending = log
        .list(
            DeliveryFilter {
                state: Some(DeliveryState::Pending),
                subscriber: Some(a),
                ..DeliveryFilter::default()
            },
            100,
        )
        .await
        .expect("list");
    assert_eq!(
        states(&pending),
        vec![(elsewhere.id, a.to_owned(), DeliveryState::Pending)]
    );
    let window = log
        .list(
            DeliveryFilter {
                subscriber: Some(b),
                since: Some(t0 + secs(1)),
                until: Some(t0 + secs(2)),
                ..DeliveryFilter::default()
            },
            100,
        )
        .await
        .expect("list");
    assert_eq!(
        states(&window),
        vec![(second.id, b.to_owned(), DeliveryState::Skipped)],
        "since is inclusive, until exclusive"
    );
    let limited = log.list(of_topic(None), 1).await.expect("list");
    assert_eq!(limited.len(), 1);
    let record = log.delivery(second.id, b).await.expect("delivery");
    assert_eq!(
        record.map(|record| record.state),
        Some(DeliveryState::Skipped)
    );
    let record = log.delivery(first.id, a).await.expect("delivery");
    assert_eq!(
        record.map(|record| record.state),
        Some(DeliveryState::Delivered)
    );
}
both!(deliveries_are_listed_by_state_topic_subscriber_and_time);

async fn a_redelivery_is_a_copy_with_records_of_its_own(log: &dyn EventLog) {
    let t0 = base_time();
    let watched = topic();
    let subs = subscribers("again", 2);
    let (a, b) = (subs[0].as_str(), subs[1].as_str());
    let original = record(log, &watched, t0).await;
    log.expand(original.id, &subs[..1], t0)
        .await
        .expect("expand");
    log.complete(&[completion(original.id, a, Outcome::Delivered)], t0)
        .await
        .expect("complete");

    let later = t0 + secs(5);
    let copy = log
        .redeliver(original.id, &[a, b], later)
        .await
        .expect("redeliver")
        .expect("the event is there");
    assert_ne!(copy, original.id);
    let stored = log.event(copy).await.expect("event").expect("the copy");
    assert_eq!(stored.original_id, Some(original.id));
    assert_eq!(stored.delivered_id(), original.id);
    assert_eq!(
        (stored.body, stored.topic),
        (original.body.clone(), watched.clone())
    );
    assert_eq!(
        log.delivery(original.id, a)
            .await
            .expect("delivery")
            .map(|r| r.state),
        Some(DeliveryState::Delivered),
        "the original record keeps its round"
    );
    let claimed = claim_own(log, copy, later).await;
    let mut claimed: Vec<&str> = claimed.iter().map(|c| c.subscriber.as_str()).collect();
    claimed.sort_unstable();
    assert_eq!(claimed, vec![a, b]);
    assert!(
        log.unexpanded(1000)
            .await
            .expect("unexpanded")
            .iter()
            .all(|event| event.id != copy),
        "a copy is never expanded to the topic's other subscribers"
    );
    let both_rounds = log
        .list(
            DeliveryFilter {
                event_id: Some(original.id),
                subscriber: Some(a),
                ..DeliveryFilter::default()
            },
            100,
        )
        .await
        .expect("list");
    assert_eq!(
        both_rounds
            .iter()
            .map(|r| (r.event_id, r.original_id))
            .collect::<Vec<_>>(),
        vec![(copy, Some(original.id)), (original.id, None)]
    );
    // A copy of the copy names the first original.
    let again = log
        .redeliver(copy, &[a], later)
        .await
        .expect("redeliver")
        .expect("the copy is there");
    let stored = log.event(again).await.expect("event").expect("the copy");
    assert_eq!(stored.original_id, Some(original.id));
    assert_eq!(
        log.redeliver(Uuid::now_v7(), &[a], later)
            .await
            .expect("redeliver"),
        None
    );
    let latest = log
        .latest(&watched)
        .await
        .expect("latest")
        .expect("an event");
    assert_eq!(
        latest.id, original.id,
        "a copy is not the topic's latest content"
    );
    let newcomer = "https://subscriber.example/newcomer";
    assert_eq!(
        log.deliver_since(&watched, newcomer, t0, later)
            .await
            .expect("deliver_since"),
        1,
        "a new subscription gets the originals only"
    );
}
both!(a_redelivery_is_a_copy_with_records_of_its_own);

async fn a_replay_sends_a_topics_originals_since_a_time(log: &dyn EventLog) {
    let t0 = base_time();
    let watched = topic();
    let subscriber = "https://subscriber.example/replayed";
    let mut originals = Vec::new();
    for offset in 0..3 {
        originals.push(record(log, &watched, t0 + secs(offset)).await);
    }
    let _other = record(log, &topic(), t0 + secs(1)).await;
    let later = t0 + secs(10);
    log.redeliver(originals[2].id, &[subscriber], later)
        .await
        .expect("redeliver");

    let first = log
        .replay(&watched, subscriber, t0 + secs(1), 1, later)
        .await
        .expect("replay");
    assert_eq!(first.redeliveries.len(), 1);
    assert_eq!(first.resume_since, Some(originals[2].created_at));
    let copy = log
        .event(first.redeliveries[0])
        .await
        .expect("event")
        .expect("the copy");
    assert_eq!(copy.original_id, Some(originals[1].id));

    let rest = log
        .replay(&watched, subscriber, t0, 10, later)
        .await
        .expect("replay");
    assert_eq!(rest.redeliveries.len(), 3, "originals only, never copies");
    assert_eq!(rest.resume_since, None);
    let none = log
        .replay(&watched, subscriber, t0 + secs(60), 10, later)
        .await
        .expect("replay");
    assert!(none.redeliveries.is_empty());
}
both!(a_replay_sends_a_topics_originals_since_a_time);

async fn endpoints_are_disabled_after_failures_in_a_row(log: &dyn EventLog) {
    let t0 = base_time();
    let run = Uuid::new_v4().simple();
    let dead = format!("https://dead.example/{run}");
    let flaky = format!("https://flaky.example/{run}");
    let failing = |endpoint: &str| Exhaustion {
        endpoint: Box::leak(endpoint.to_owned().into_boxed_str()),
        error: "HTTP 500",
    };
    let disabled = log
        .tally_endpoints(
            "websub",
            &[failing(&dead), failing(&dead), failing(&flaky)],
            &[],
            3,
            t0,
        )
        .await
        .expect("tally");
    assert!(disabled.is_empty());
    let ours =
        |records: Vec<websub_hub::storage::events::EndpointRecord>| -> Vec<(String, u32, bool)> {
            records
                .into_iter()
                .filter(|record| record.endpoint.ends_with(&run.to_string()))
                .map(|record| {
                    (
                        record.endpoint,
                        record.failures,
                        record.disabled_at.is_some(),
                    )
                })
                .collect()
        };
    assert_eq!(
        ours(log.endpoints("websub", 1000).await.expect("endpoints")),
        vec![(dead.clone(), 2, false), (flaky.clone(), 1, false)]
    );
    // A delivery clears the failures; the third exhaustion in a row
    // disables, once.
    let disabled = log
        .tally_endpoints("websub", &[failing(&dead)], &[&flaky], 3, t0 + secs(1))
        .await
        .expect("tally");
    assert_eq!(disabled, vec![dead.clone()]);
    let disabled = log
        .tally_endpoints("websub", &[failing(&dead)], &[&dead], 3, t0 + secs(2))
        .await
        .expect("tally");
    assert!(disabled.is_empty(), "already disabled");
    let listed = log.endpoints("websub", 1000).await.expect("endpoints");
    let record = listed
        .iter()
        .find(|record| record.endpoint == dead)
        .expect("the dead endpoint");
    assert_eq!(record.disabled_at, Some(t0 + secs(1)));
    assert!(
        record
            .disabled_reason
            .as_deref()
            .is_some_and(|reason| reason.contains("3 deliveries")),
        "{record:?}"
    );
    assert_eq!(
        record.failures, 4,
        "a delivery does not clear a disabled endpoint"
    );
    assert_eq!(ours(listed), vec![(dead.clone(), 4, true)]);

    assert!(
        log.set_endpoint_disabled("websub", &dead, None, t0)
            .await
            .expect("enable")
    );
    assert!(
        !log.set_endpoint_disabled("websub", &dead, None, t0)
            .await
            .expect("enable")
    );
    assert!(
        log.set_endpoint_disabled("websub", &flaky, Some("maintenance"), t0)
            .await
            .expect("disable")
    );
    assert!(
        !log.set_endpoint_disabled("websub", &flaky, Some("again"), t0)
            .await
            .expect("disable"),
        "already disabled"
    );
    assert_eq!(
        ours(log.endpoints("websub", 1000).await.expect("endpoints")),
        vec![(flaky.clone(), 0, true)]
    );
    // Never disabled with a threshold of 0.
    let never = format!("https://never.example/{run}");
    let disabled = log
        .tally_endpoints("websub", &[failing(&never); 10], &[], 0, t0)
        .await
        .expect("tally");
    assert!(disabled.is_empty());
    // Channels are apart: a webhook of the same name is another endpoint.
    assert!(
        log.set_endpoint_disabled("webhook", &flaky, Some("webhook down"), t0)
            .await
            .expect("disable")
    );
    let webhooks = log.endpoints("webhook", 1000).await.expect("endpoints");
    assert!(
        webhooks
            .iter()
            .any(|record| record.endpoint == flaky && record.channel == "webhook")
    );
    assert!(
        log.set_endpoint_disabled("websub", &flaky, None, t0)
            .await
            .expect("enable")
    );
    assert!(
        log.endpoints("webhook", 1000)
            .await
            .expect("endpoints")
            .iter()
            .any(|record| record.endpoint == flaky),
        "enabling the callback leaves the webhook disabled"
    );
}
both!(endpoints_are_disabled_after_failures_in_a_row);

async fn webhook_attempts_are_kept_and_go_by_age(log: &dyn EventLog) {
    let t0 = base_time();
    let (old_event, new_event) = (Uuid::new_v4(), Uuid::new_v4());
    let failed = Attempt {
        at: t0,
        duration_micros: 1500,
        status: Some(503),
        error: Some("HTTP 503".to_owned()),
        response: Bytes::from_static(b"busy"),
    };
    let delivered = Attempt {
        at: t0 + secs(10),
        duration_micros: 900,
        status: Some(204),
        error: None,
        response: Bytes::new(),
    };
    log.keep_webhook_attempts(&[
        WebhookAttempt {
            event_id: old_event,
            subscriber: "billing",
            attempt: &failed,
        },
        WebhookAttempt {
            event_id: new_event,
            subscriber: "billing",
            attempt: &delivered,
        },
        WebhookAttempt {
            event_id: old_event,
            subscriber: "billing",
            attempt: &delivered,
        },
    ])
    .await
    .expect("keep");
    log.keep_webhook_attempts(&[]).await.expect("keep none");
    // The events a webhook was attempted for since a time, each once: what
    // a recovered webhook's breaker re-sends.
    let mut since_start = log
        .webhook_events_attempted_since("billing", t0, 10)
        .await
        .expect("attempted since");
    since_start.sort();
    let mut both = vec![old_event, new_event];
    both.sort();
    assert_eq!(since_start, both);
    assert!(
        log.webhook_events_attempted_since("billing", t0 + secs(11), 10)
            .await
            .expect("attempted since")
            .is_empty()
    );
    assert!(
        log.webhook_events_attempted_since("audit", t0, 10)
            .await
            .expect("attempted since")
            .is_empty()
    );
    assert_eq!(
        log.webhook_attempts(old_event, "billing")
            .await
            .expect("attempts"),
        vec![failed, delivered.clone()]
    );
    assert!(
        log.webhook_attempts(old_event, "audit")
            .await
            .expect("attempts")
            .is_empty()
    );
    log.purge_before(t0 + secs(5)).await.expect("purge");
    assert_eq!(
        log.webhook_attempts(old_event, "billing")
            .await
            .expect("attempts"),
        vec![delivered.clone()],
        "the older attempt went by age"
    );
    assert_eq!(
        log.webhook_attempts(new_event, "billing")
            .await
            .expect("attempts"),
        vec![delivered]
    );
}
both!(webhook_attempts_are_kept_and_go_by_age);

/// Lanes: the log derives each record's lane as `lane_of` does, claims per
/// lane only what is asked, in due order, and lists the lanes with due
/// records; waiting records are written unclaimed; a claim is released.
async fn records_are_claimed_per_lane(log: &dyn EventLog) {
    use websub_hub::delivery::websub::lane_of;
    let t0 = base_time();
    let event = record(log, &topic(), t0).await;
    let run = Uuid::new_v4().simple();
    let big = format!("big-{run}.example:8443");
    let odd: Vec<String> = vec![
        format!("https://user:pw@odd-{run}.example/cb"),
        format!("http://odd-{run}.example?x=1/2"),
        format!("https://odd-{run}.example#frag"),
        format!("https://a@b@odd-{run}.example/x"),
        format!("http://[::1]:81{}/cb", run.to_string().len()),
    ];
    let many: Vec<String> = (0..50).map(|i| format!("https://{big}/cb/{i}")).collect();
    let small: Vec<String> = (0..3)
        .map(|i| format!("https://small-{i}-{run}.example/cb"))
        .collect();
    let claimed_now = [small[0].as_str()];
    log.expand_claimed(event.id, &claimed_now, t0)
        .await
        .expect("claimed part");
    let waiting: Vec<&str> = many
        .iter()
        .chain(&small[1..])
        .chain(&odd)
        .map(String::as_str)
        .collect();
    let created = log
        .expand_waiting(event.id, &waiting, t0, false)
        .await
        .expect("waiting part");
    assert_eq!(created, waiting.len() as u64);
    assert_eq!(
        log.expand_waiting(event.id, &waiting, t0, false)
            .await
            .expect("again"),
        0,
        "idempotent"
    );

    let lanes = log.due_lanes(100_000).await.expect("due lanes");
    let listed: HashSet<&str> = lanes.iter().map(|(lane, _)| lane.as_str()).collect();
    for subscriber in many.iter().chain(&small).chain(&odd) {
        assert!(
            listed.contains(lane_of(subscriber)),
            "{} lists {subscriber}'s lane {}: {listed:?}",
            backend(log),
            lane_of(subscriber)
        );
    }
    assert!(lanes.iter().all(|(_, due)| *due == t0));

    // The big lane gives only what is asked; the small ones theirs; the
    // record claimed at expansion is not claimed again.
    let small_lanes: Vec<&str> = small.iter().map(|s| lane_of(s)).collect();
    let mut asks = vec![(big.as_str(), 20)];
    asks.extend(small_lanes.iter().map(|lane| (*lane, 5)));
    let claimed = log
        .claim_lanes(&asks, t0, VISIBILITY)
        .await
        .expect("claim lanes");
    let of_big = claimed
        .iter()
        .filter(|c| lane_of(&c.subscriber) == big)
        .count();
    assert_eq!(of_big, 20);
    let of_small: HashSet<&str> = claimed
        .iter()
        .filter(|c| small_lanes.contains(&lane_of(&c.subscriber)))
        .map(|c| c.subscriber.as_str())
        .collect();
    assert_eq!(
        of_small,
        HashSet::from([small[1].as_str(), small[2].as_str()])
    );
    assert!(
        claimed
            .iter()
            .all(|c| c.event_id == event.id && c.retry_count == 0)
    );
    let rest = log
        .claim_lanes(&[(big.as_str(), 1_000)], t0, VISIBILITY)
        .await
        .expect("the rest");
    assert_eq!(
        rest.len(),
        30,
        "claimed once: the first 20 are not claimed again"
    );
    let odd_lanes: HashSet<&str> = odd.iter().map(|s| lane_of(s)).collect();
    let mut got = HashSet::new();
    for lane in odd_lanes {
        let claimed = log
            .claim_lanes(&[(lane, 10)], t0, VISIBILITY)
            .await
            .expect("odd lane");
        got.extend(claimed.into_iter().map(|c| c.subscriber));
    }
    for subscriber in &odd {
        assert!(
            got.contains(subscriber),
            "{}: {subscriber} in lane {}",
            backend(log),
            lane_of(subscriber)
        );
    }

    // A retry due later shows as the lane's due time; not claimable before.
    let retried = completion(
        event.id,
        &many[0],
        Outcome::Retry {
            error: "HTTP 503 Service Unavailable".to_owned(),
            next_attempt_at: t0 + secs(30),
        },
    );
    log.complete(&[retried], t0).await.expect("complete");
    let early = log
        .claim_lanes(&[(big.as_str(), 10)], t0 + secs(1), VISIBILITY)
        .await
        .expect("early");
    assert!(early.iter().all(|c| c.subscriber != many[0]));

    // Released: every claim is claimable again at once.
    let released = log.release_claims().await.expect("release");
    if backend(log) == "sqlite" {
        assert!(released >= 52, "released {released}");
        let again = log
            .claim_lanes(&[(big.as_str(), 1_000)], t0 + secs(1), VISIBILITY)
            .await
            .expect("again");
        assert_eq!(again.len(), 49);
    }
}
both!(records_are_claimed_per_lane);

/// Ordered lines: records written for an ordered subscription form its
/// callback's lane, apart from the host's; a claim gives the head only, in
/// recording order, never while it is in flight or not yet due; a retried
/// head holds the rest; an exhausted one leaves the line; the requests are
/// kept, listed and withdrawn.
async fn ordered_lines_give_their_head_only(log: &dyn EventLog) {
    use websub_hub::delivery::websub::{lane_of, ordered_lane_of};
    let t0 = base_time();
    let topic = topic();
    let run = Uuid::new_v4().simple();
    let callback = format!("https://ordered-{run}.example/cb");
    let free = format!("https://ordered-{run}.example/free");
    let mut events = Vec::new();
    for n in 0..4 {
        let event = record(log, &topic, t0 + secs(n)).await;
        assert_eq!(
            log.expand_waiting(event.id, &[callback.as_str()], t0, true)
                .await
                .expect("ordered record"),
            1
        );
        log.expand_waiting(event.id, &[free.as_str()], t0, false)
            .await
            .expect("free record");
        events.push(event.id);
    }
    let line = ordered_lane_of(&callback);
    let lanes = log.due_lanes(100_000).await.expect("due lanes");
    assert!(lanes.iter().any(|(lane, _)| lane == line), "{lanes:?}");
    let host = log
        .claim_lanes(&[(lane_of(&callback), 100)], t0, VISIBILITY)
        .await
        .expect("host lane");
    assert!(
        host.iter().all(|claim| claim.subscriber == free),
        "the host's lane holds none of the line's records: {host:?}"
    );
    assert_eq!(host.len(), 4);

    let claim = |at| async move {
        log.claim_ordered(&[line], at, VISIBILITY)
            .await
            .expect("claim ordered")
    };
    let head = claim(t0).await;
    assert_eq!(head.len(), 1);
    assert_eq!(head[0].event_id, events[0]);
    assert!(
        claim(t0).await.is_empty(),
        "nothing while the head is in flight"
    );

    // The head fails and is retried later: the rest wait behind it.
    log.complete(
        &[completion(
            events[0],
            &callback,
            Outcome::Retry {
                error: "HTTP 503 Service Unavailable".to_owned(),
                next_attempt_at: t0 + secs(30),
            },
        )],
        t0,
    )
    .await
    .expect("retry");
    assert!(
        claim(t0 + secs(1)).await.is_empty(),
        "the retried head holds the line"
    );
    let again = claim(t0 + secs(30)).await;
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].event_id, again[0].retry_count), (events[0], 1));
    log.complete(&[completion(events[0], &callback, Outcome::Delivered)], t0)
        .await
        .expect("delivered");
    let next = claim(t0 + secs(30)).await;
    assert_eq!(next[0].event_id, events[1]);

    // Out of retries: it leaves the line, and the next goes.
    log.complete(
        &[completion(
            events[1],
            &callback,
            Outcome::Exhausted {
                error: "HTTP 500".to_owned(),
            },
        )],
        t0,
    )
    .await
    .expect("exhausted");
    let next = claim(t0 + secs(30)).await;
    assert_eq!(next[0].event_id, events[2]);
    log.complete(&[completion(events[2], &callback, Outcome::Delivered)], t0)
        .await
        .expect("delivered");
    // A claim older than the visibility timeout is taken over.
    let head = claim(t0 + secs(30)).await;
    assert_eq!(head[0].event_id, events[3]);
    let late = t0 + secs(30) + TimeDelta::from_std(VISIBILITY).expect("visibility") + secs(1);
    assert_eq!(claim(late).await[0].event_id, events[3]);

    // The requests.
    log.set_ordered(&topic, &callback, true, t0)
        .await
        .expect("order");
    log.set_ordered(&topic, &callback, true, t0 + secs(5))
        .await
        .expect("again");
    let requests = log.ordered_subscriptions(100_000).await.expect("list");
    let mine: Vec<_> = requests.iter().filter(|r| r.topic == topic).collect();
    assert_eq!(mine.len(), 1);
    assert_eq!(
        (mine[0].callback.as_str(), mine[0].since),
        (callback.as_str(), t0),
        "a request asked again keeps its time"
    );
    log.set_ordered(&topic, &callback, false, t0)
        .await
        .expect("unorder");
    let requests = log.ordered_subscriptions(100_000).await.expect("list");
    assert!(requests.iter().all(|r| r.topic != topic));
}
both!(ordered_lines_give_their_head_only);

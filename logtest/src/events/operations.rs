//! What operators read and do ([`DeliveryOperations`]): health, failed
//! deliveries and their retry, listing, redelivery, replay.
//!
//! [`DeliveryOperations`]: websub_hub::storage::events::DeliveryOperations

use uuid::Uuid;
use websub_hub::storage::events::{
    ActivityWindow, DeliveryFilter, DeliveryHealth, DeliveryState, EventLog, FailedFilter, Outcome,
    Owed,
};

use super::helpers::{
    VISIBILITY, base_time, claim_own, completion, record, record_of, secs, states, subscribers,
    topic,
};

pub async fn health_failed_and_retry_failed(log: &dyn EventLog) {
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

pub async fn deliveries_are_listed_by_state_topic_subscriber_and_time(log: &dyn EventLog) {
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

pub async fn a_redelivery_is_a_copy_with_records_of_its_own(log: &dyn EventLog) {
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
        log.deliver_since(
            &[Owed {
                topic: &watched,
                subscriber: newcomer,
                since: t0,
            }],
            later
        )
        .await
        .expect("deliver_since"),
        1,
        "a new subscription gets the originals only"
    );
}

pub async fn a_replay_sends_a_topics_originals_since_a_time(log: &dyn EventLog) {
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

pub async fn a_catch_up_owes_each_subscription_its_topics_events_since_its_request(
    log: &dyn EventLog,
) {
    let t0 = base_time();
    let (watched, other) = (topic(), topic());
    let subs = subscribers("owed", 4);
    let (x, y, z, w) = (
        subs[0].as_str(),
        subs[1].as_str(),
        subs[2].as_str(),
        subs[3].as_str(),
    );
    let first = record(log, &watched, t0).await;
    let second = record(log, &watched, t0 + secs(2)).await;
    let third = record(log, &watched, t0 + secs(4)).await;
    let elsewhere = record(log, &other, t0 + secs(1)).await;
    // w already has the third event's record: it is left as it is.
    log.expand(third.id, &subs[3..], t0 + secs(4))
        .await
        .expect("expand");
    let owed = |topic, subscriber, at| Owed {
        topic,
        subscriber,
        since: t0 + secs(at),
    };
    let later = t0 + secs(10);
    let written = log
        .deliver_since(
            &[
                owed(&watched, x, 2),
                owed(&other, y, 0),
                owed(&watched, z, 20),
                owed(&watched, w, 3),
            ],
            later,
        )
        .await
        .expect("deliver_since");
    assert_eq!(written, 3, "x owed two events, y one, z and w none");
    let claimed = log.claim(100_000, later, VISIBILITY).await.expect("claim");
    let to = |subscriber: &str| {
        let mut events: Vec<Uuid> = claimed
            .iter()
            .filter(|claim| claim.subscriber == subscriber)
            .map(|claim| claim.event_id)
            .collect();
        events.sort();
        events
    };
    assert_eq!(to(x), vec![second.id, third.id]);
    assert_eq!(to(y), vec![elsewhere.id]);
    assert!(to(z).is_empty(), "nothing recorded since z's request");
    assert_eq!(to(w), vec![third.id], "w's record is the one expanded");
    assert!(
        !claimed
            .iter()
            .any(|claim| claim.event_id == first.id && subs.contains(&claim.subscriber)),
        "an event before every request is owed to none"
    );
    assert_eq!(
        log.deliver_since(&[], later).await.expect("nothing owed"),
        0
    );
}

/// An attempt at `at` lasting `micros`, answered `status`, coming to
/// `outcome`.
fn attempted(
    event_id: Uuid,
    subscriber: &str,
    at: chrono::DateTime<chrono::Utc>,
    micros: i64,
    status: u16,
    outcome: Outcome,
) -> websub_hub::storage::events::Completion {
    websub_hub::storage::events::Completion {
        attempt: Some(websub_hub::storage::events::Attempt {
            at,
            duration_micros: micros,
            status: Some(status),
            error: outcome.error().map(str::to_owned),
            response: bytes::Bytes::new(),
        }),
        ..completion(event_id, subscriber, outcome)
    }
}

/// The charts' read: attempts counted per bucket of the window (delivered
/// ones from their records, failed ones from their rows), the median and
/// the 99th percentile of their durations by nearest rank, every bucket
/// returned, empty ones too; only events recorded in the window, and
/// attempts in it; the endpoints ranked by deliveries and by failures,
/// within their limit.
pub async fn activity_is_counted_per_bucket_and_endpoint(log: &dyn EventLog) {
    let t0 = base_time();
    let window = ActivityWindow {
        since: t0,
        bucket: secs(60),
        buckets: 3,
        endpoints: 5,
    };
    let empty = log.activity(window).await.expect("activity");
    assert_eq!(empty.buckets.len(), 3);
    assert!(
        empty.buckets.iter().all(|bucket| bucket.delivered == 0
            && bucket.failed == 0
            && bucket.p50_micros.is_none())
    );
    assert!(empty.busiest.is_empty() && empty.failing.is_empty());
    assert_eq!(empty.buckets[1].start, t0 + secs(60));

    let subs = subscribers("activity", 3);
    let (a, b, c) = (subs[0].as_str(), subs[1].as_str(), subs[2].as_str());
    let event = record(log, &topic(), t0).await;
    log.expand(event.id, &subs, t0).await.expect("expand");
    let retry = |at| Outcome::Retry {
        error: "HTTP 500".to_owned(),
        next_attempt_at: at + secs(60),
    };
    claim_own(log, event.id, t0).await;
    log.complete(
        &[
            attempted(event.id, a, t0 + secs(1), 1_000, 500, retry(t0 + secs(1))),
            attempted(event.id, b, t0 + secs(2), 3_000, 204, Outcome::Delivered),
            attempted(event.id, c, t0 + secs(3), 1_000, 500, retry(t0 + secs(3))),
        ],
        t0 + secs(3),
    )
    .await
    .expect("complete");
    claim_own(log, event.id, t0 + secs(70)).await;
    log.complete(
        &[
            attempted(event.id, a, t0 + secs(70), 5_000, 200, Outcome::Delivered),
            attempted(
                event.id,
                c,
                t0 + secs(65),
                9_000,
                500,
                Outcome::Exhausted {
                    error: "HTTP 500".to_owned(),
                },
            ),
        ],
        t0 + secs(70),
    )
    .await
    .expect("complete again");
    // Recorded before the window: its attempt in the window is not counted.
    let older = record(log, &topic(), t0 - secs(10)).await;
    log.expand(older.id, &subs[..1], t0 - secs(10))
        .await
        .expect("expand");
    claim_own(log, older.id, t0 + secs(5)).await;
    log.complete(
        &[attempted(
            older.id,
            a,
            t0 + secs(5),
            7,
            200,
            Outcome::Delivered,
        )],
        t0 + secs(5),
    )
    .await
    .expect("complete the older");
    // After the window: not counted.
    let later = record(log, &topic(), t0 + secs(190)).await;
    log.expand(later.id, &subs[..1], t0 + secs(190))
        .await
        .expect("expand");
    claim_own(log, later.id, t0 + secs(190)).await;
    log.complete(
        &[attempted(
            later.id,
            a,
            t0 + secs(190),
            7,
            200,
            Outcome::Delivered,
        )],
        t0 + secs(190),
    )
    .await
    .expect("complete the later");

    let activity = log.activity(window).await.expect("activity");
    let counts: Vec<_> = activity
        .buckets
        .iter()
        .map(|bucket| {
            (
                bucket.delivered,
                bucket.failed,
                bucket.p50_micros,
                bucket.p99_micros,
            )
        })
        .collect();
    assert_eq!(
        counts,
        vec![
            (1, 2, Some(1_000), Some(3_000)),
            (1, 1, Some(5_000), Some(9_000)),
            (0, 0, None, None),
        ],
        "{}",
        super::helpers::backend(log)
    );
    let ranked = |endpoints: &[websub_hub::storage::events::EndpointActivity]| {
        endpoints
            .iter()
            .map(|endpoint| {
                (
                    endpoint.endpoint.clone(),
                    endpoint.delivered,
                    endpoint.failed,
                )
            })
            .collect::<Vec<_>>()
    };
    let mut tied = vec![(a.to_owned(), 1, 1), (b.to_owned(), 1, 0)];
    tied.sort();
    assert_eq!(ranked(&activity.busiest), tied);
    assert_eq!(
        ranked(&activity.failing),
        vec![(c.to_owned(), 0, 2), (a.to_owned(), 1, 1)]
    );

    let one = log
        .activity(ActivityWindow {
            endpoints: 1,
            ..window
        })
        .await
        .expect("activity");
    assert_eq!(ranked(&one.failing), vec![(c.to_owned(), 0, 2)]);
    assert_eq!(one.busiest.len(), 1);
}

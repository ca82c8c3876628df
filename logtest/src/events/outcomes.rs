//! Outcomes and attempts ([`DeliveryOutcomes`]): each outcome's effect,
//! late answers ignored, records written with their first outcome, the
//! attempts of WebSub records and of outbox webhooks.
//!
//! [`DeliveryOutcomes`]: websub_hub::storage::events::DeliveryOutcomes

use bytes::Bytes;
use chrono::{DateTime, Utc};
use uuid::Uuid;
use websub_hub::storage::events::{
    Attempt, Completion, DeliveryRecord, DeliveryState, EventLog, Outcome, WebhookAttempt,
};

use super::helpers::{
    backend, base_time, claim_own, completion, pending, record, record_of, secs, strs, subscribers,
    topic,
};

pub async fn complete_sets_each_outcome(log: &dyn EventLog) {
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

/// Every attempt is kept with the outcome it came to, in the completion's
/// write: when, how long, the status, the error, the answer's beginning
/// (bytes as they came); a completion without an attempt (a lease that ran
/// out) adds none; they go with their event.
pub async fn attempts_are_kept_per_delivery_and_go_with_their_event(log: &dyn EventLog) {
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

pub async fn complete_mixes_events_and_ignores_late_deliveries(log: &dyn EventLog) {
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

pub async fn unwritten_records_are_created_with_their_first_outcome(log: &dyn EventLog) {
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

    // A batch of hundreds, as a fan-out writes them, another event's
    // outcomes in between: every one created.
    let many = record(log, &topic(), t0).await;
    let between = record(log, &topic(), t0).await;
    let subs = subscribers("many", 321);
    let completions: Vec<Completion> = subs
        .iter()
        .enumerate()
        .flat_map(|(at, subscriber)| {
            let events = if at % 3 == 0 {
                vec![many.id, between.id]
            } else {
                vec![many.id]
            };
            events.into_iter().map(|event_id| Completion {
                attempt: Some(delivering.clone()),
                ..completion(event_id, subscriber, Outcome::Delivered)
            })
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
    let records = log.deliveries(between.id).await.expect("deliveries");
    assert_eq!(records.len(), subs.len().div_ceil(3), "{}", backend(log));
    assert!(
        records
            .iter()
            .all(|record| record.state == DeliveryState::Delivered)
    );
    assert_eq!(
        log.attempts(many.id, &subs[320]).await.expect("attempts"),
        vec![delivering]
    );
}

pub async fn webhook_attempts_are_kept_and_go_by_age(log: &dyn EventLog) {
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

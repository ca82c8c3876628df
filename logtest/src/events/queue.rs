//! The delivery queue ([`DeliveryQueue`]): expansion (whole, in claimed
//! parts, to waiting records), claims (due order, limits, per lane, per
//! ordered line), takeover of a dead process's claims.
//!
//! [`DeliveryQueue`]: websub_hub::storage::events::DeliveryQueue

use std::collections::HashSet;
use std::time::Instant;

use chrono::TimeDelta;
use uuid::Uuid;
use websub_hub::storage::events::{
    Claimed, Completion, DeliveryRecord, EventLog, EventLogError, Outcome,
};

use super::helpers::{
    VISIBILITY, backend, base_time, claim_own, completion, is_unexpanded, pending, record,
    record_of, secs, sorted, strs, subscribers, topic,
};

pub async fn expand_creates_one_record_per_subscriber(log: &dyn EventLog) {
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

pub async fn expand_is_idempotent(log: &dyn EventLog) {
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

pub async fn expand_of_a_missing_event_fails(log: &dyn EventLog) {
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

pub async fn expand_a_hundred_thousand(log: &dyn EventLog) {
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

pub async fn claim_returns_due_records_only(log: &dyn EventLog) {
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

pub async fn claim_respects_limit_and_due_order(log: &dyn EventLog) {
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

pub async fn expansion_in_parts_survives_a_crash_between_parts(log: &dyn EventLog) {
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

pub async fn claimed_parts_return_only_the_records_they_create(log: &dyn EventLog) {
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

pub async fn claimed_parts_never_take_over_existing_records(log: &dyn EventLog) {
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

pub async fn claimed_records_of_a_dead_process_become_claimable(log: &dyn EventLog) {
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

pub async fn concurrent_claimed_parts_share_the_records(log: &dyn EventLog) {
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

/// Lanes: the log derives each record's lane as `lane_of` does, claims per
/// lane only what is asked, in due order, and lists the lanes with due
/// records; waiting records are written unclaimed; a claim is released.
pub async fn records_are_claimed_per_lane(log: &dyn EventLog) {
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

/// Ordered lines: records written for an ordered subscription form its
/// callback's lane, apart from the host's; a claim gives the head only, in
/// recording order, never while it is in flight or not yet due; a retried
/// head holds the rest; an exhausted one leaves the line; the requests are
/// kept, listed and withdrawn.
pub async fn ordered_lines_give_their_head_only(log: &dyn EventLog) {
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

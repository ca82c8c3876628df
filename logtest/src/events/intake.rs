//! Events recorded and read back ([`EventIntake`]): every field, ids
//! recorded once, the unexpanded ones found again.
//!
//! [`EventIntake`]: websub_hub::storage::events::EventIntake

use bytes::Bytes;
use chrono::TimeDelta;
use uuid::Uuid;
use websub_hub::storage::events::{EventLog, NewEvent};

use super::helpers::{base_time, is_unexpanded, record, secs, topic};

pub async fn record_round_trip(log: &dyn EventLog) {
    // Sub-microsecond digits are dropped by both backends; what record()
    // returns must already be what event() reads back.
    let now = base_time() + TimeDelta::nanoseconds(789);
    let body: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
    let new = NewEvent {
        topic: format!("{}?q=ü&x=%20", topic()),
        content_type: "application/atom+xml; charset=\"utf-8\"; type=feed".to_owned(),
        body: Bytes::from(body),
        trace_context: Some(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\nvendor=value".to_owned(),
        ),
    };
    let recorded = log.record(new.clone(), now).await.expect("record");
    assert_eq!(recorded.topic, new.topic);
    assert_eq!(recorded.trace_context, new.trace_context);
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
                trace_context: None,
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

pub async fn record_once_records_an_id_once(log: &dyn EventLog) {
    let now = base_time();
    let id = Uuid::new_v4();
    let first = NewEvent {
        topic: topic(),
        content_type: "application/json".to_owned(),
        body: Bytes::from_static(b"{\"first\":true}"),
        trace_context: None,
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
        trace_context: None,
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
            trace_context: None,
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

pub async fn unexpanded_lists_oldest_first(log: &dyn EventLog) {
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

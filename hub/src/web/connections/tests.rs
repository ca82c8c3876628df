//! Tests of the serving loop: its clocks, evictions and canned refusals.

use super::*;

fn limits() -> Limits {
    Limits {
        header_read_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(75),
        max_connections: 2,
    }
}

#[test]
fn the_canned_refusal_is_a_whole_answer() {
    let text = std::str::from_utf8(CANNED_REFUSAL).expect("ASCII");
    let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
    assert_eq!(body, BUSY_REASON);
    assert!(
        head.contains(&format!("Content-Length: {}", body.len())),
        "{head}"
    );
    assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
}

#[tokio::test(start_paused = true)]
async fn each_phase_has_its_clock() {
    let limits = limits();
    let activity = Activity::new(Instant::now());
    let accepted = Instant::now();
    assert_eq!(
        activity.deadline(&limits),
        Some(accepted + limits.header_read_timeout)
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(activity.begin_request());
    assert_eq!(activity.deadline(&limits), None, "no clock in flight");
    assert_eq!(activity.waiting_since(), None, "never evicted in flight");
    assert!(!activity.close(true), "a request in flight is not closed");
    activity.awaiting_body();
    assert_eq!(
        activity.deadline(&limits),
        Some(Instant::now() + limits.header_read_timeout),
        "a stalled body has the head's clock"
    );
    assert!(!activity.close(false), "not cut at shutdown");
    activity.body_arrived();
    assert_eq!(activity.deadline(&limits), None);
    tokio::time::advance(Duration::from_secs(100)).await;
    activity.end_request();
    let answered = Instant::now();
    assert_eq!(
        activity.deadline(&limits),
        Some(answered + limits.idle_timeout)
    );
    tokio::time::advance(Duration::from_secs(5)).await;
    activity.on_write();
    assert_eq!(
        activity.deadline(&limits),
        Some(Instant::now() + limits.idle_timeout),
        "an answer still being written is not idle"
    );
    tokio::time::advance(Duration::from_secs(20)).await;
    activity.on_read();
    assert_eq!(
        activity.deadline(&limits),
        Some(Instant::now() + limits.header_read_timeout),
        "the next head's clock starts at its first byte"
    );
    assert_eq!(activity.expire(&limits), None);
    tokio::time::advance(limits.header_read_timeout).await;
    assert_eq!(activity.expire(&limits), Some("header_timeout"));
    assert!(activity.is_closed());
    assert!(
        !activity.begin_request(),
        "a closed connection takes no request"
    );
}

#[tokio::test(start_paused = true)]
async fn the_longest_waiting_connection_makes_room() {
    let slots = Arc::new(Slots::new(2));
    let first = slots.admit().expect("room");
    tokio::time::advance(Duration::from_secs(1)).await;
    let second = slots.admit().expect("room");
    let third = slots.admit().expect("room, by evicting");
    assert!(first.activity.is_closed(), "the oldest waiter went");
    assert!(!second.activity.is_closed());
    assert!(second.activity.begin_request());
    assert!(third.activity.begin_request());
    assert!(slots.admit().is_none(), "every connection is in flight");
    third.activity.end_request();
    drop(first);
    let fourth = slots.admit().expect("room, by evicting the idle one");
    assert!(third.activity.is_closed());
    assert!(!second.activity.is_closed());
    assert!(fourth.activity.begin_request());
    second.activity.awaiting_body();
    let fifth = slots
        .admit()
        .expect("room, by evicting the one stalled on its body");
    assert!(second.activity.is_closed());
    assert!(!fourth.activity.is_closed());
    drop(second);
    drop(third);
    drop(fourth);
    drop(fifth);
    assert!(
        slots
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    );
}

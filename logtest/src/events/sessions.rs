//! The admin page's sessions ([`AdminSessions`]): kept under a digest of
//! their token, found while live, listed newest first, ended one by one
//! and all at once, and bounded.
//!
//! [`AdminSessions`]: websub_hub::storage::events::AdminSessions

use chrono::{DateTime, Utc};
use websub_hub::storage::events::sessions::MAX_SESSIONS;
use websub_hub::storage::events::{AdminSession, EventLog};

use super::helpers::{base_time, secs};

fn session(id: &str, key_id: &str, created_at: DateTime<Utc>) -> AdminSession {
    AdminSession {
        id: id.to_owned(),
        key_id: key_id.to_owned(),
        created_at,
        expires_at: created_at + chrono::TimeDelta::hours(12),
        // Non-ASCII and a quote, as a browser's may hold.
        user_agent: Some("Zoë's \"browser\"".to_owned()),
    }
}

pub async fn admin_sessions_are_kept_found_listed_and_ended(log: &dyn EventLog) {
    let t0 = base_time();
    let first = session("a1", "key-a", t0);
    let second = session("b2", "key-b", t0 + secs(1));
    let third = session("c3", "key-a", t0 + secs(2));
    for (session, hash) in [(&first, "hash-1"), (&second, "hash-2"), (&third, "hash-3")] {
        log.open_session(session, hash, session.created_at)
            .await
            .expect("open");
    }
    let now = t0 + secs(3);
    assert_eq!(
        log.session("hash-2", now).await.expect("find"),
        Some(second.clone())
    );
    assert_eq!(log.session("hash-9", now).await.expect("find"), None);
    assert_eq!(
        log.session("b2", now).await.expect("find"),
        None,
        "found by the digest of its token, not by its id"
    );
    let listed = log.sessions(now).await.expect("list");
    assert_eq!(listed, vec![third.clone(), second.clone(), first.clone()]);

    // An expired session is neither found nor listed.
    let expired = first.expires_at;
    assert_eq!(log.session("hash-1", expired).await.expect("find"), None);
    assert!(!log.sessions(expired).await.expect("list").contains(&first));

    assert!(log.end_session("b2").await.expect("end"));
    assert!(!log.end_session("b2").await.expect("end again"));
    assert_eq!(log.session("hash-2", now).await.expect("find"), None);
    assert_eq!(log.sessions(now).await.expect("list"), vec![third, first]);
    assert_eq!(log.end_sessions().await.expect("end all"), 2);
    assert!(log.sessions(now).await.expect("list").is_empty());
    assert_eq!(log.session("hash-3", now).await.expect("find"), None);
}

pub async fn admin_sessions_are_bounded(log: &dyn EventLog) {
    let t0 = base_time();
    let count = usize::try_from(MAX_SESSIONS).expect("a count") + 5;
    for n in 0..count {
        let at = t0 + secs(i64::try_from(n).expect("small"));
        log.open_session(&session(&format!("s{n}"), "key", at), &format!("h{n}"), at)
            .await
            .expect("open");
    }
    let now = t0 + secs(i64::try_from(count).expect("small"));
    let listed = log.sessions(now).await.expect("list");
    assert_eq!(
        listed.len(),
        usize::try_from(MAX_SESSIONS).expect("a count")
    );
    assert_eq!(listed[0].id, format!("s{}", count - 1), "the newest kept");
    assert_eq!(
        log.session("h0", now).await.expect("find"),
        None,
        "the oldest ended"
    );
    assert!(log.session("h5", now).await.expect("find").is_some());

    // Opening one ends those expired, whatever the count.
    let later = now + chrono::TimeDelta::hours(13);
    log.open_session(&session("late", "key", later), "h-late", later)
        .await
        .expect("open");
    assert_eq!(
        log.sessions(later).await.expect("list").len(),
        1,
        "only the new one is live"
    );
    assert_eq!(
        log.end_sessions().await.expect("end all"),
        1,
        "expired rows went"
    );
}

//! Retention ([`LogUpkeep`]): events purged with their records and
//! attempts, a purge racing an expansion, and partitions made ahead and
//! dropped whole.
//!
//! [`LogUpkeep`]: websub_hub::storage::events::LogUpkeep

use std::time::Duration;

use chrono::Utc;
use websub_hub::storage::events::EventLog;

use super::helpers::{backend, base_time, record, retried, secs, subscribers, topic};

pub async fn purge_deletes_old_events_with_their_records(log: &dyn EventLog) {
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

/// Expansions and purges of the same events at once: whichever wins, an
/// event that is gone has no delivery records left behind.
pub async fn expand_racing_purge_leaves_no_orphans(log: &dyn EventLog) {
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

/// Room made ahead of the clock ([`LogUpkeep::partition_ahead`]) holds the
/// events recorded in it, and a purge past them takes every one with its
/// records and attempts, as the row-by-row purge does; making room twice
/// adds nothing the first call made.
pub async fn events_in_partitions_made_ahead_go_whole(log: &dyn EventLog) {
    let span = Duration::from_secs(1);
    let t0 = base_time();
    log.partition_ahead(span, Utc::now())
        .await
        .expect("make room ahead");
    assert_eq!(
        log.partition_ahead(span, Utc::now() - secs(1))
            .await
            .expect("again"),
        0,
        "{}: what is made is found",
        backend(log)
    );
    let topic = topic();
    let subs = subscribers("ahead", 3);
    let mut ids = Vec::new();
    for _ in 0..5 {
        let event = record(log, &topic, t0).await;
        log.expand(event.id, &subs, t0).await.expect("expand");
        log.complete(&[retried(event.id, &subs[0], t0, 503)], t0)
            .await
            .expect("complete");
        ids.push(event.id);
    }
    assert_eq!(
        log.attempts(ids[0], &subs[0])
            .await
            .expect("attempts")
            .len(),
        1
    );

    assert_eq!(
        log.purge_before(t0).await.expect("purge before them"),
        0,
        "{}: nothing older than the cutoff",
        backend(log)
    );
    assert!(log.event(ids[4]).await.expect("read").is_some());

    let cutoff = Utc::now() + secs(3_600);
    let purged = log.purge_before(cutoff).await.expect("purge past them");
    assert!(purged >= 5, "{}: purged {purged}", backend(log));
    for id in &ids {
        assert_eq!(log.event(*id).await.expect("read"), None);
        assert_eq!(log.deliveries(*id).await.expect("deliveries"), vec![]);
        assert_eq!(log.attempts(*id, &subs[0]).await.expect("attempts"), vec![]);
    }
    // Room is made again past the purge, and what is recorded there kept.
    log.partition_ahead(span, Utc::now())
        .await
        .expect("make room again");
    let later = record(log, &topic, Utc::now()).await;
    assert!(log.event(later.id).await.expect("read").is_some());
}

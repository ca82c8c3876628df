//! Retention ([`LogUpkeep`]): events purged with their records and
//! attempts, and a purge racing an expansion.
//!
//! [`LogUpkeep`]: websub_hub::storage::events::LogUpkeep

use websub_hub::storage::events::EventLog;

use super::helpers::{backend, base_time, record, secs, subscribers, topic};

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

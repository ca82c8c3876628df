//! Retention: only old failures purged.

use websub_hub::storage::backlog::{Backlog, FetchResult, IntentResult};

use super::{
    admit, all, at, callback, claim_fetches, claim_intents, failed, fetch_states, finish_fetch,
    finish_intent, intent_states, ping, subscribe, topic,
};

/// Purging takes only rows failed for good from before the cutoff, fetches
/// and intents alike, and counts them; waiting rows stay however old.
pub async fn purge_removes_only_old_failures(backlog: &dyn Backlog) {
    let (old_failed, new_failed, old_waiting, old_retrying) = (
        topic("old-failed"),
        topic("new-failed"),
        topic("old-waiting"),
        topic("old-retrying"),
    );
    ping(backlog, &[old_failed.clone(), old_retrying.clone()], at(0)).await;
    ping(backlog, std::slice::from_ref(&new_failed), at(100)).await;
    for fetch in claim_fetches(backlog, at(100)).await {
        let result = if fetch.topic == old_retrying {
            FetchResult::Retry {
                at: at(1_000),
                error: "503".to_owned(),
            }
        } else {
            FetchResult::Failed {
                error: "410".to_owned(),
            }
        };
        finish_fetch(backlog, &fetch, result, at(101)).await;
    }
    ping(backlog, std::slice::from_ref(&old_waiting), at(0)).await;

    let t = topic("purge");
    admit(backlog, subscribe(&t, &callback("old-failed")), at(0)).await;
    admit(backlog, subscribe(&t, &callback("new-failed")), at(100)).await;
    for intent in claim_intents(backlog, at(100)).await {
        finish_intent(
            backlog,
            &intent,
            IntentResult::Failed {
                error: "denied".to_owned(),
            },
        )
        .await;
    }
    admit(backlog, subscribe(&t, &callback("old-waiting")), at(0)).await;

    assert_eq!(backlog.purge_failed_before(at(50)).await.expect("purge"), 2);
    let mut fetches: Vec<String> = fetch_states(backlog, None)
        .await
        .into_iter()
        .map(|state| state.topic)
        .collect();
    fetches.sort();
    let mut expected = vec![new_failed, old_waiting, old_retrying];
    expected.sort();
    assert_eq!(fetches, expected);
    let mut intents: Vec<String> = intent_states(backlog, all())
        .await
        .into_iter()
        .map(|state| state.callback)
        .collect();
    intents.sort();
    let mut expected = vec![callback("new-failed"), callback("old-waiting")];
    expected.sort();
    assert_eq!(intents, expected);

    assert_eq!(backlog.purge_failed_before(at(50)).await.expect("purge"), 0);
    assert_eq!(
        backlog.purge_failed_before(at(100)).await.expect("purge"),
        0,
        "the cutoff itself is not before the cutoff"
    );
    assert_eq!(
        backlog.purge_failed_before(at(101)).await.expect("purge"),
        2
    );
    assert_eq!(fetch_states(backlog, Some(true)).await, vec![]);
    assert_eq!(intent_states(backlog, failed(true)).await, vec![]);
    assert_eq!(fetch_states(backlog, Some(false)).await.len(), 2);
    assert_eq!(intent_states(backlog, failed(false)).await.len(), 1);
}

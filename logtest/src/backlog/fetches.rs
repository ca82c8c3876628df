//! Topic fetches: one row per topic, claims not handed out twice until their
//! visibility timeout lapses, done fetches leaving, validators kept, replaced
//! and forgotten, the generation rule (a ping during a fetch leaves the row due
//! at once), retries, failures kept and revived, listings.

use std::collections::HashSet;

use chrono::TimeDelta;
use websub_hub::storage::backlog::{Backlog, FetchResult, FetchState, Listing, Validators};

use super::{
    VISIBILITY, at, claim_fetches, claim_one_fetch, done, fetch_states, finish_fetch, ping, topic,
    visibility,
};

/// A request makes one row per topic, however often a topic is named; a
/// claimed row is not handed out again until its claim is older than the
/// visibility timeout, which is how a dead worker's fetch comes back.
pub async fn fetches_are_claimed_once_each_until_their_claim_goes_stale(backlog: &dyn Backlog) {
    let (a, b) = (topic("a"), topic("b"));
    ping(backlog, &[], at(0)).await;
    assert_eq!(fetch_states(backlog, None).await, vec![]);

    ping(
        backlog,
        &[a.clone(), b.clone(), a.clone(), b.clone()],
        at(0),
    )
    .await;
    let listed = fetch_states(backlog, None).await;
    assert_eq!(listed.len(), 2, "one row per topic: {listed:?}");
    for state in &listed {
        assert_eq!(state.requested_at, at(0));
        assert_eq!(state.attempts, 0);
        assert_eq!(state.next_attempt_at, Some(at(0)));
        assert_eq!(state.last_error, None);
    }

    // Not due before its ping.
    assert_eq!(claim_fetches(backlog, at(-1)).await, vec![]);

    let claimed = claim_fetches(backlog, at(0)).await;
    let topics: Vec<&str> = claimed.iter().map(|fetch| fetch.topic.as_str()).collect();
    assert_eq!(topics, vec![a.as_str(), b.as_str()]);
    for fetch in &claimed {
        assert_eq!(fetch.attempts, 0);
        assert_eq!(fetch.requested_at, at(0));
        assert_eq!(fetch.validators, Validators::default());
    }

    assert_eq!(claim_fetches(backlog, at(0)).await, vec![]);
    assert_eq!(
        claim_fetches(backlog, at(0) + visibility() - TimeDelta::seconds(1)).await,
        vec![]
    );

    let reclaimed = claim_fetches(backlog, at(0) + visibility() + TimeDelta::seconds(1)).await;
    assert_eq!(
        reclaimed, claimed,
        "a stale claim is claimed again, unchanged"
    );
}

/// A claim takes at most `limit` rows; the rest stay for the next claim.
pub async fn fetch_claims_respect_their_limit(backlog: &dyn Backlog) {
    let topics: Vec<String> = (0..5).map(|i| topic(&format!("limit-{i}"))).collect();
    ping(backlog, &topics, at(0)).await;
    let first = backlog
        .claim_fetches(3, at(0), VISIBILITY)
        .await
        .expect("claim");
    let second = backlog
        .claim_fetches(3, at(0), VISIBILITY)
        .await
        .expect("claim");
    assert_eq!(first.len(), 3);
    assert_eq!(second.len(), 2);
    let seen: HashSet<String> = first
        .into_iter()
        .chain(second)
        .map(|fetch| fetch.topic)
        .collect();
    assert_eq!(seen, topics.into_iter().collect::<HashSet<_>>());
}

/// A done fetch leaves the backlog and is not claimed again.
pub async fn a_done_fetch_leaves_the_backlog(backlog: &dyn Backlog) {
    let a = topic("done");
    ping(backlog, std::slice::from_ref(&a), at(0)).await;
    let fetch = claim_one_fetch(backlog, at(0)).await;
    finish_fetch(backlog, &fetch, done(None), at(1)).await;
    assert_eq!(fetch_states(backlog, None).await, vec![]);
    assert_eq!(
        claim_fetches(backlog, at(0) + visibility() * 10).await,
        vec![]
    );
}

/// Validators a fetch answered come with the topic's next claim: new ones
/// replace the old wholesale, `None` (no content answered) keeps them, and
/// empty ones forget them. They belong to their topic only.
pub async fn validators_are_kept_replaced_and_forgotten(backlog: &dyn Backlog) {
    let (a, other) = (topic("validators"), topic("validators-other"));
    let first = Validators {
        etag: Some("\"v1\"".to_owned()),
        last_modified: Some("Wed, 02 Jan 2030 03:04:05 GMT".to_owned()),
    };
    let second = Validators {
        etag: Some("W/\"v2\"".to_owned()),
        last_modified: None,
    };

    ping(backlog, std::slice::from_ref(&a), at(0)).await;
    let fetch = claim_one_fetch(backlog, at(0)).await;
    assert_eq!(fetch.validators, Validators::default());
    finish_fetch(backlog, &fetch, done(Some(first.clone())), at(1)).await;
    assert_eq!(fetch_states(backlog, None).await, vec![]);

    ping(backlog, &[a.clone(), other.clone()], at(2)).await;
    let claimed = claim_fetches(backlog, at(2)).await;
    assert_eq!(claimed.len(), 2);
    let (fetch, unrelated) = if claimed[0].topic == a {
        (&claimed[0], &claimed[1])
    } else {
        (&claimed[1], &claimed[0])
    };
    assert_eq!(fetch.validators, first);
    assert_eq!(unrelated.validators, Validators::default());
    finish_fetch(backlog, unrelated, done(None), at(3)).await;
    finish_fetch(backlog, fetch, done(None), at(3)).await;

    ping(backlog, std::slice::from_ref(&a), at(4)).await;
    let fetch = claim_one_fetch(backlog, at(4)).await;
    assert_eq!(fetch.validators, first, "Done with None keeps them");
    finish_fetch(backlog, &fetch, done(Some(second.clone())), at(5)).await;

    ping(backlog, std::slice::from_ref(&a), at(6)).await;
    let fetch = claim_one_fetch(backlog, at(6)).await;
    assert_eq!(fetch.validators, second, "new validators replace all");
    finish_fetch(backlog, &fetch, done(Some(Validators::default())), at(7)).await;

    ping(backlog, std::slice::from_ref(&a), at(8)).await;
    let fetch = claim_one_fetch(backlog, at(8)).await;
    assert_eq!(fetch.validators, Validators::default(), "empty ones forget");
}

/// A ping during a fetch asks for content newer than what the fetch may
/// have read: the fetch's Done leaves the row due at once, fresh, rather
/// than deleting it.
pub async fn a_ping_during_a_fetch_leaves_it_due_after_done(backlog: &dyn Backlog) {
    let a = topic("overtaken-done");
    ping(backlog, std::slice::from_ref(&a), at(0)).await;
    let fetch = claim_one_fetch(backlog, at(0)).await;

    ping(backlog, std::slice::from_ref(&a), at(1)).await;
    // The ping does not undo the claim: one worker fetches a topic at a time.
    assert_eq!(claim_fetches(backlog, at(1)).await, vec![]);

    finish_fetch(backlog, &fetch, done(None), at(2)).await;
    let listed = fetch_states(backlog, None).await;
    assert_eq!(
        listed,
        vec![FetchState {
            topic: a.clone(),
            requested_at: at(1),
            attempts: 0,
            next_attempt_at: Some(at(2)),
            last_error: None,
        }]
    );

    let again = claim_one_fetch(backlog, at(2)).await;
    assert_eq!(again.topic, a);
    assert_eq!(again.attempts, 0);
    assert_eq!(again.requested_at, at(1));
    assert_ne!(again.generation, fetch.generation);

    finish_fetch(backlog, &again, done(None), at(3)).await;
    assert_eq!(fetch_states(backlog, None).await, vec![]);
}

/// The generation rule holds for failures too: an overtaken claim's Retry
/// or Failed leaves the row due at once with a fresh budget, not at the
/// retry's time nor failed for good.
pub async fn a_ping_during_a_fetch_leaves_it_due_after_a_failure(backlog: &dyn Backlog) {
    let a = topic("overtaken-failure");
    ping(backlog, std::slice::from_ref(&a), at(0)).await;
    let fetch = claim_one_fetch(backlog, at(0)).await;
    finish_fetch(
        backlog,
        &fetch,
        FetchResult::Retry {
            at: at(60),
            error: "503".to_owned(),
        },
        at(1),
    )
    .await;
    let fetch = claim_one_fetch(backlog, at(60)).await;
    assert_eq!(fetch.attempts, 1);

    ping(backlog, std::slice::from_ref(&a), at(61)).await;
    finish_fetch(
        backlog,
        &fetch,
        FetchResult::Retry {
            at: at(3_600),
            error: "503 again".to_owned(),
        },
        at(62),
    )
    .await;
    let listed = fetch_states(backlog, None).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].attempts, 0, "a fresh budget: {listed:?}");
    assert_eq!(listed[0].next_attempt_at, Some(at(62)), "due at once");
    let fetch = claim_one_fetch(backlog, at(62)).await;
    assert_eq!(fetch.attempts, 0);
    assert_eq!(fetch.requested_at, at(61));

    ping(backlog, std::slice::from_ref(&a), at(63)).await;
    finish_fetch(
        backlog,
        &fetch,
        FetchResult::Failed {
            error: "gone".to_owned(),
        },
        at(64),
    )
    .await;
    assert_eq!(fetch_states(backlog, Some(true)).await, vec![]);
    let listed = fetch_states(backlog, Some(false)).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].attempts, 0);
    assert_eq!(listed[0].next_attempt_at, Some(at(64)));
    let fetch = claim_one_fetch(backlog, at(64)).await;
    assert_eq!(fetch.attempts, 0);
    assert_eq!(fetch.requested_at, at(63));
}

/// A retry counts an attempt, keeps its error for the listing and is due
/// at its time, not before.
pub async fn a_fetch_retry_waits_for_its_time(backlog: &dyn Backlog) {
    let a = topic("retry");
    ping(backlog, std::slice::from_ref(&a), at(0)).await;
    let fetch = claim_one_fetch(backlog, at(0)).await;
    finish_fetch(
        backlog,
        &fetch,
        FetchResult::Retry {
            at: at(60),
            error: "connection refused".to_owned(),
        },
        at(1),
    )
    .await;

    let expected = vec![FetchState {
        topic: a.clone(),
        requested_at: at(0),
        attempts: 1,
        next_attempt_at: Some(at(60)),
        last_error: Some("connection refused".to_owned()),
    }];
    assert_eq!(fetch_states(backlog, None).await, expected);
    assert_eq!(fetch_states(backlog, Some(false)).await, expected);
    assert_eq!(fetch_states(backlog, Some(true)).await, vec![]);

    assert_eq!(claim_fetches(backlog, at(59)).await, vec![]);
    let fetch = claim_one_fetch(backlog, at(60)).await;
    assert_eq!(fetch.attempts, 1);
    finish_fetch(
        backlog,
        &fetch,
        FetchResult::Retry {
            at: at(180),
            error: "timed out".to_owned(),
        },
        at(61),
    )
    .await;
    let listed = fetch_states(backlog, None).await;
    assert_eq!(listed[0].attempts, 2);
    assert_eq!(listed[0].next_attempt_at, Some(at(180)));
    assert_eq!(listed[0].last_error.as_deref(), Some("timed out"));
}

/// A fetch failed for good stays, listed as failed, and is never claimed;
/// a new ping for its topic makes it due again with a fresh budget.
pub async fn a_failed_fetch_is_kept_until_pinged_again(backlog: &dyn Backlog) {
    let (a, b) = (topic("failed"), topic("waiting"));
    ping(backlog, std::slice::from_ref(&a), at(0)).await;
    ping(backlog, std::slice::from_ref(&b), at(1)).await;
    let claimed = claim_fetches(backlog, at(1)).await;
    assert_eq!(claimed.len(), 2);
    for fetch in &claimed {
        let result = if fetch.topic == a {
            FetchResult::Failed {
                error: "410 Gone".to_owned(),
            }
        } else {
            FetchResult::Retry {
                at: at(120),
                error: "503".to_owned(),
            }
        };
        finish_fetch(backlog, fetch, result, at(2)).await;
    }

    let failed_state = FetchState {
        topic: a.clone(),
        requested_at: at(0),
        attempts: 1,
        next_attempt_at: None,
        last_error: Some("410 Gone".to_owned()),
    };
    assert_eq!(fetch_states(backlog, Some(true)).await, vec![failed_state]);
    let waiting = fetch_states(backlog, Some(false)).await;
    assert_eq!(waiting.len(), 1);
    assert_eq!(waiting[0].topic, b);
    let every: Vec<String> = fetch_states(backlog, None)
        .await
        .into_iter()
        .map(|state| state.topic)
        .collect();
    assert_eq!(
        every,
        vec![b.clone(), a.clone()],
        "most recently pinged first"
    );

    let much_later = at(0) + visibility() * 1_000;
    let claimed = claim_fetches(backlog, much_later).await;
    assert_eq!(claimed.len(), 1, "only the waiting one: {claimed:?}");
    assert_eq!(claimed[0].topic, b);

    ping(backlog, std::slice::from_ref(&a), much_later).await;
    let listed: Vec<FetchState> = fetch_states(backlog, Some(false))
        .await
        .into_iter()
        .filter(|state| state.topic == a)
        .collect();
    assert_eq!(listed.len(), 1, "revived: {listed:?}");
    assert_eq!(listed[0].attempts, 0);
    assert_eq!(listed[0].next_attempt_at, Some(much_later));
    let revived = claim_one_fetch(backlog, much_later).await;
    assert_eq!(revived.topic, a);
    assert_eq!(revived.attempts, 0);
    assert_eq!(revived.requested_at, much_later);
}

/// The fetch listing is newest first and stops at its limit.
pub async fn fetch_listing_is_newest_first_within_its_limit(backlog: &dyn Backlog) {
    for i in 0..5 {
        ping(backlog, &[topic(&format!("listing-{i}"))], at(i)).await;
    }
    let listed: Vec<String> = backlog
        .fetches(Listing::default(), 3)
        .await
        .expect("list")
        .into_iter()
        .map(|state| state.topic)
        .collect();
    assert_eq!(
        listed,
        vec![topic("listing-4"), topic("listing-3"), topic("listing-2")]
    );
    let searched: Vec<String> = backlog
        .fetches(
            Listing {
                search: Some(&topic("listing-1")),
                ..Listing::default()
            },
            3,
        )
        .await
        .expect("search")
        .into_iter()
        .map(|state| state.topic)
        .collect();
    assert_eq!(searched, vec![topic("listing-1")]);
}

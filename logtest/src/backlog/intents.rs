//! Verifications of intent: every field round-tripped, oldest claimed first,
//! the admission bound, replacement of a waiting, failed or in-flight intent by
//! a newer one and what the older's outcome then does, retries and failures,
//! outcomes finished in one group, listings, `subscribing`.

use chrono::TimeDelta;
use websub_hub::protocol::SubscriptionRequest;
use websub_hub::storage::backlog::{
    Admission, Backlog, Intent, IntentResult, IntentState, Listing,
};

use super::{
    VISIBILITY, admit, all, at, callback, claim_intents, claim_one_intent, failed, finish_intent,
    intent_states, owned_by, subscribe, subscribing, topic, unsubscribe, visibility, waiting_state,
};

/// A claimed intent is the one admitted, field for field: the verifier
/// sends the secret and lease from here, and compares the callback byte for
/// byte. A claim is not handed out twice until it goes stale.
pub async fn an_intent_round_trips_every_field(backlog: &dyn Backlog) {
    let sub = admit(
        backlog,
        subscribe(
            "https://publisher.example/\u{30cb}\u{30e5}\u{30fc}\u{30b9}/\u{fc}?lang=\u{65e5}&x=1",
            "https://subscriber.example/r\u{fc}ckruf?token=a%20b&n=\"Zo\u{eb}\"#frag",
        ),
        at(0),
    )
    .await;
    let unsub = admit(
        backlog,
        unsubscribe(&topic("round-trip"), &callback("round-trip")),
        at(1),
    )
    .await;

    assert_eq!(
        claim_intents(backlog, at(0) - TimeDelta::seconds(1)).await,
        vec![]
    );
    let mut claimed = claim_intents(backlog, at(1)).await;
    claimed.sort_by_key(|intent| intent.requested_at);
    assert_eq!(claimed, vec![sub.clone(), unsub.clone()]);

    assert_eq!(claim_intents(backlog, at(1)).await, vec![]);
    assert_eq!(
        claim_intents(backlog, at(0) + visibility() - TimeDelta::seconds(1)).await,
        vec![]
    );
    let mut reclaimed = claim_intents(backlog, at(1) + visibility() + TimeDelta::seconds(1)).await;
    reclaimed.sort_by_key(|intent| intent.requested_at);
    assert_eq!(
        reclaimed,
        vec![sub, unsub],
        "a stale claim comes back whole"
    );
}

/// Due intents are claimed oldest first, at most `limit` at a time.
pub async fn intents_are_claimed_oldest_first(backlog: &dyn Backlog) {
    let t = topic("oldest");
    let middle = admit(backlog, subscribe(&t, &callback("middle")), at(1)).await;
    let newest = admit(backlog, subscribe(&t, &callback("newest")), at(2)).await;
    let oldest = admit(backlog, subscribe(&t, &callback("oldest")), at(0)).await;
    for expected in [oldest, middle, newest] {
        let claimed = backlog
            .claim_intents(1, at(10), VISIBILITY)
            .await
            .expect("claim");
        assert_eq!(claimed, vec![expected]);
    }
    assert_eq!(claim_intents(backlog, at(10)).await, vec![]);
}

/// Admission refuses a new pair once `bound` intents wait (claimed ones
/// included: they are not verified yet), writes nothing then, and does not
/// count intents failed for good.
pub async fn admission_is_bounded_by_waiting_intents(backlog: &dyn Backlog) {
    let t = topic("bound");
    for i in 0..3 {
        let intent = Intent::new(subscribe(&t, &callback(&format!("{i}"))), at(i));
        assert_eq!(
            backlog.request_intent(&intent, 3).await.expect("request"),
            Admission::Accepted
        );
    }
    let fourth = Intent::new(subscribe(&t, &callback("fourth")), at(3));
    assert_eq!(
        backlog.request_intent(&fourth, 3).await.expect("request"),
        Admission::Full { pending: 3 }
    );
    let listed = intent_states(backlog, all()).await;
    assert_eq!(listed.len(), 3);
    assert!(
        listed
            .iter()
            .all(|state| state.callback != fourth.request.callback),
        "a refused intent is not written: {listed:?}"
    );

    let claimed = claim_intents(backlog, at(3)).await;
    assert_eq!(claimed.len(), 3);
    assert_eq!(
        backlog.request_intent(&fourth, 3).await.expect("request"),
        Admission::Full { pending: 3 },
        "claimed intents still wait"
    );

    finish_intent(
        backlog,
        &claimed[0],
        IntentResult::Failed {
            error: "denied".to_owned(),
        },
    )
    .await;
    assert_eq!(
        backlog.request_intent(&fourth, 3).await.expect("request"),
        Admission::Accepted,
        "a failed intent does not count"
    );
    let fifth = Intent::new(subscribe(&t, &callback("fifth")), at(4));
    assert_eq!(
        backlog.request_intent(&fifth, 3).await.expect("request"),
        Admission::Full { pending: 3 }
    );
    assert_eq!(intent_states(backlog, all()).await.len(), 4);
}

/// A group is written in one call, in order: every field as a single
/// request writes it, the first up to the bound admitted and the rest
/// refused with the count, and a pair already waiting replaced.
pub async fn a_group_is_admitted_in_order_up_to_the_bound(backlog: &dyn Backlog) {
    let t = topic("group");
    let waiting = admit(backlog, subscribe(&t, &callback("waiting")), at(0)).await;
    let mut replacing = Intent::new(subscribe(&t, &callback("waiting")), at(1));
    replacing.request.secret = Some("a newer secret".to_owned());
    replacing.request.lease_seconds = Some(u64::MAX);
    replacing.request.owner = Some("owner of the group".to_owned());
    let mut group = vec![replacing.clone()];
    for i in 0..4 {
        group.push(Intent::new(
            unsubscribe(&t, &callback(&format!("g{i}"))),
            at(2 + i),
        ));
    }
    // One waits already; a bound of 4 leaves room for the first three of
    // the group (the replacement counted as new).
    let admissions = backlog
        .request_intents(&group, 4)
        .await
        .expect("request a group");
    assert_eq!(
        admissions,
        vec![
            Admission::Accepted,
            Admission::Accepted,
            Admission::Accepted,
            Admission::Full { pending: 3 },
            Admission::Full { pending: 3 },
        ]
    );
    let mut claimed = claim_intents(backlog, at(10)).await;
    claimed.sort_by_key(|intent| intent.requested_at);
    let mut stored_replacement = replacing.clone();
    stored_replacement.request.lease_seconds = Some(i64::MAX.unsigned_abs());
    assert_eq!(
        claimed,
        vec![stored_replacement, group[1].clone(), group[2].clone()],
        "the replacement took the waiting one's place ({waiting:?})"
    );
    assert_eq!(
        backlog
            .request_intents(&[], 4)
            .await
            .expect("an empty group"),
        vec![]
    );
}

/// The count of waiting intents that admission reads follows every change
/// of a row: admitted, retried, failed for good, requested again after
/// failing, replaced while waiting, done.
pub async fn the_waiting_count_follows_every_change(backlog: &dyn Backlog) {
    async fn agrees(backlog: &dyn Backlog, expected: u64, after: &str) {
        let listed = intent_states(backlog, all()).await;
        let waiting = listed
            .iter()
            .filter(|state| state.next_attempt_at.is_some())
            .count();
        let counted = backlog.waiting().await.expect("waiting").verifications;
        assert_eq!(counted, expected, "after {after}: {listed:?}");
        assert_eq!(u64::try_from(waiting).ok(), Some(expected), "after {after}");
    }
    let t = topic("count");
    agrees(backlog, 0, "nothing").await;
    for i in 0..3 {
        admit(
            backlog,
            subscribe(&t, &callback(&format!("count-{i}"))),
            at(i),
        )
        .await;
    }
    agrees(backlog, 3, "three admitted").await;
    let claimed = claim_intents(backlog, at(3)).await;
    agrees(backlog, 3, "claimed").await;
    let retried = IntentResult::Retry {
        at: at(5),
        error: "timed out".to_owned(),
    };
    finish_intent(backlog, &claimed[0], retried).await;
    agrees(backlog, 3, "one retried").await;
    let failed = IntentResult::Failed {
        error: "denied".to_owned(),
    };
    finish_intent(backlog, &claimed[1], failed).await;
    agrees(backlog, 2, "one failed for good").await;
    admit(backlog, claimed[1].request.clone(), at(6)).await;
    agrees(backlog, 3, "the failed one requested again").await;
    admit(backlog, claimed[2].request.clone(), at(7)).await;
    agrees(backlog, 3, "a waiting one replaced").await;
    // Late enough that the replaced one's claim has gone stale too.
    let due = claim_intents(backlog, at(1000)).await;
    assert_eq!(due.len(), 3, "{due:?}");
    for intent in &due {
        finish_intent(backlog, intent, IntentResult::Done).await;
    }
    agrees(backlog, 0, "all done").await;
}

/// A newer request for a waiting pair replaces it: one row, the newer's
/// fields, the newer's id when claimed.
pub async fn a_newer_request_replaces_a_waiting_intent(backlog: &dyn Backlog) {
    let (t, c) = (topic("replace-waiting"), callback("replace-waiting"));
    admit(backlog, subscribe(&t, &c), at(0)).await;
    let newer_request = SubscriptionRequest {
        lease_seconds: Some(60),
        secret: Some("another".to_owned()),
        owner: Some("bob".to_owned()),
        ..subscribe(&t, &c)
    };
    let newer = admit(backlog, newer_request, at(1)).await;
    assert_eq!(
        intent_states(backlog, all()).await,
        vec![waiting_state(&newer)]
    );
    assert_eq!(claim_intents(backlog, at(1)).await, vec![newer]);
}

/// A newer request for a failed pair replaces it with a fresh one: due,
/// no attempts, no error.
pub async fn a_newer_request_replaces_a_failed_intent(backlog: &dyn Backlog) {
    let (t, c) = (topic("replace-failed"), callback("replace-failed"));
    admit(backlog, subscribe(&t, &c), at(0)).await;
    let older = claim_one_intent(backlog, at(0)).await;
    finish_intent(
        backlog,
        &older,
        IntentResult::Failed {
            error: "challenge not echoed".to_owned(),
        },
    )
    .await;
    let newer = admit(backlog, unsubscribe(&t, &c), at(1)).await;
    assert_eq!(
        intent_states(backlog, all()).await,
        vec![waiting_state(&newer)]
    );
    assert_eq!(claim_intents(backlog, at(1)).await, vec![newer]);
}

/// Replacing an intent in flight keeps its claim (one verification per
/// pair at a time); the older's Done then deletes nothing but releases the
/// newer, which is claimable at once as it was written.
pub async fn replacing_an_intent_in_flight_keeps_its_claim(backlog: &dyn Backlog) {
    let (t, c) = (topic("replace-in-flight"), callback("replace-in-flight"));
    admit(backlog, subscribe(&t, &c), at(0)).await;
    let older = claim_one_intent(backlog, at(0)).await;

    let newer = admit(backlog, unsubscribe(&t, &c), at(1)).await;
    assert_ne!(newer.id, older.id);
    assert_eq!(
        intent_states(backlog, all()).await,
        vec![waiting_state(&newer)]
    );
    assert_eq!(claim_intents(backlog, at(1)).await, vec![]);
    assert_eq!(
        claim_intents(backlog, at(0) + visibility() - TimeDelta::seconds(1)).await,
        vec![]
    );

    finish_intent(backlog, &older, IntentResult::Done).await;
    assert_eq!(
        intent_states(backlog, all()).await,
        vec![waiting_state(&newer)],
        "the older's Done must not delete the newer"
    );
    assert_eq!(claim_intents(backlog, at(2)).await, vec![newer.clone()]);

    finish_intent(backlog, &newer, IntentResult::Done).await;
    assert_eq!(intent_states(backlog, all()).await, vec![]);
}

/// The older's Retry or Failed, once a newer request replaced it, only
/// releases the claim: the newer stays due as written, with no attempt
/// counted and no error.
pub async fn a_replaced_intent_s_failure_leaves_the_newer_as_written(backlog: &dyn Backlog) {
    let t = topic("replaced-failure");
    let outcomes = [
        (
            "failed",
            IntentResult::Failed {
                error: "refused".to_owned(),
            },
        ),
        (
            "retry",
            IntentResult::Retry {
                at: at(3_600),
                error: "timed out".to_owned(),
            },
        ),
    ];
    for (name, outcome) in outcomes {
        let c = callback(name);
        admit(backlog, subscribe(&t, &c), at(0)).await;
        let older = claim_one_intent(backlog, at(0)).await;
        let newer = admit(backlog, owned_by(Some("bob"), subscribe(&t, &c)), at(1)).await;

        finish_intent(backlog, &older, outcome).await;
        assert_eq!(
            intent_states(backlog, all()).await,
            vec![waiting_state(&newer)],
            "{name} of the replaced intent touched the newer"
        );
        assert_eq!(claim_intents(backlog, at(1)).await, vec![newer.clone()]);
        finish_intent(backlog, &newer, IntentResult::Done).await;
    }
    assert_eq!(intent_states(backlog, all()).await, vec![]);
}

/// The current intent's Retry counts an attempt and waits for its time;
/// Failed counts one and keeps it for good, never claimed again.
pub async fn intent_retry_and_failure(backlog: &dyn Backlog) {
    let (t, c) = (topic("intent-retry"), callback("intent-retry"));
    let intent = admit(backlog, subscribe(&t, &c), at(0)).await;
    let claimed = claim_one_intent(backlog, at(0)).await;
    finish_intent(
        backlog,
        &claimed,
        IntentResult::Retry {
            at: at(60),
            error: "timed out".to_owned(),
        },
    )
    .await;
    let retrying = IntentState {
        attempts: 1,
        next_attempt_at: Some(at(60)),
        last_error: Some("timed out".to_owned()),
        ..waiting_state(&intent)
    };
    assert_eq!(intent_states(backlog, all()).await, vec![retrying.clone()]);
    assert_eq!(intent_states(backlog, failed(false)).await, vec![retrying]);
    assert_eq!(intent_states(backlog, failed(true)).await, vec![]);

    assert_eq!(claim_intents(backlog, at(59)).await, vec![]);
    let claimed = claim_one_intent(backlog, at(60)).await;
    assert_eq!(
        claimed,
        Intent {
            attempts: 1,
            ..intent.clone()
        }
    );
    finish_intent(
        backlog,
        &claimed,
        IntentResult::Failed {
            error: "404 from the callback".to_owned(),
        },
    )
    .await;
    let failed_state = IntentState {
        attempts: 2,
        next_attempt_at: None,
        last_error: Some("404 from the callback".to_owned()),
        ..waiting_state(&intent)
    };
    assert_eq!(
        intent_states(backlog, failed(true)).await,
        vec![failed_state]
    );
    assert_eq!(intent_states(backlog, failed(false)).await, vec![]);
    assert_eq!(
        claim_intents(backlog, at(0) + visibility() * 1_000).await,
        vec![]
    );
}

/// Outcomes ended together are written together, each as it would be on
/// its own: done ones leave, a retry waits with its attempt counted, a
/// failure is kept, and a done one a newer request replaced only releases
/// its claim, the newer staying due as written.
pub async fn outcomes_are_finished_in_one_group(backlog: &dyn Backlog) {
    let t = topic("finished-together");
    for name in ["done-1", "done-2", "retry", "failed", "replaced"] {
        admit(backlog, subscribe(&t, &callback(name)), at(0)).await;
    }
    let claimed = claim_intents(backlog, at(0)).await;
    assert_eq!(claimed.len(), 5);
    let newer = admit(
        backlog,
        owned_by(Some("bob"), subscribe(&t, &callback("replaced"))),
        at(1),
    )
    .await;
    let by_callback = |name: &str| {
        claimed
            .iter()
            .find(|intent| intent.request.callback == callback(name))
            .expect("claimed")
            .clone()
    };
    let retry = IntentResult::Retry {
        at: at(60),
        error: "timed out".to_owned(),
    };
    let failure = IntentResult::Failed {
        error: "404 from the callback".to_owned(),
    };
    backlog
        .finish_intents(&[
            (by_callback("done-1"), IntentResult::Done),
            (by_callback("retry"), retry),
            (by_callback("replaced"), IntentResult::Done),
            (by_callback("failed"), failure),
            (by_callback("done-2"), IntentResult::Done),
        ])
        .await
        .expect("finish a group");
    backlog.finish_intents(&[]).await.expect("finish nothing");

    let mut states = intent_states(backlog, all()).await;
    states.sort_by(|a, b| a.callback.cmp(&b.callback));
    assert_eq!(
        states,
        vec![
            IntentState {
                attempts: 1,
                next_attempt_at: None,
                last_error: Some("404 from the callback".to_owned()),
                ..waiting_state(&by_callback("failed"))
            },
            waiting_state(&newer),
            IntentState {
                attempts: 1,
                next_attempt_at: Some(at(60)),
                last_error: Some("timed out".to_owned()),
                ..waiting_state(&by_callback("retry"))
            },
        ]
    );
    assert_eq!(claim_intents(backlog, at(1)).await, vec![newer]);
    assert_eq!(
        backlog.waiting().await.expect("waiting").verifications,
        2,
        "the newer and the retry wait"
    );
}

/// The intent listing filters by owner, by state and by text in the topic
/// or callback, newest first, within its limit.
pub async fn intent_listing_filters_by_owner_and_state(backlog: &dyn Backlog) {
    let t = topic("listing");
    let owners = [
        Some("alice"),
        Some("bob"),
        Some("alice"),
        Some("bob"),
        Some("alice"),
        None,
    ];
    let mut admitted = Vec::new();
    for (i, owner) in owners.into_iter().enumerate() {
        let n = i64::try_from(i).expect("small");
        let request = owned_by(owner, subscribe(&t, &callback(&format!("listing-{i}"))));
        admitted.push(admit(backlog, request, at(n)).await);
    }
    // Bob's newer one fails for good.
    let claimed = claim_intents(backlog, at(10)).await;
    let bobs = claimed
        .iter()
        .find(|intent| intent.id == admitted[3].id)
        .expect("bob's intent claimed");
    finish_intent(
        backlog,
        bobs,
        IntentResult::Failed {
            error: "denied".to_owned(),
        },
    )
    .await;

    let callbacks = |states: Vec<IntentState>| -> Vec<String> {
        states.into_iter().map(|state| state.callback).collect()
    };
    let nth = |indices: &[usize]| -> Vec<String> {
        indices
            .iter()
            .map(|&i| admitted[i].request.callback.clone())
            .collect()
    };

    assert_eq!(
        callbacks(intent_states(backlog, all()).await),
        nth(&[5, 4, 3, 2, 1, 0])
    );
    let alice = Listing {
        failed: None,
        owner: Some("alice"),
        search: None,
    };
    assert_eq!(
        callbacks(intent_states(backlog, alice).await),
        nth(&[4, 2, 0])
    );
    let bob_failed = Listing {
        failed: Some(true),
        owner: Some("bob"),
        search: None,
    };
    let listed = intent_states(backlog, bob_failed).await;
    assert_eq!(callbacks(listed.clone()), nth(&[3]));
    assert_eq!(listed[0].owner.as_deref(), Some("bob"));
    assert_eq!(listed[0].last_error.as_deref(), Some("denied"));
    let bob_waiting = Listing {
        failed: Some(false),
        owner: Some("bob"),
        search: None,
    };
    assert_eq!(
        callbacks(intent_states(backlog, bob_waiting).await),
        nth(&[1])
    );
    assert_eq!(
        callbacks(intent_states(backlog, failed(false)).await),
        nth(&[5, 4, 2, 1, 0])
    );
    let nobody = Listing {
        failed: None,
        owner: Some("carol"),
        search: None,
    };
    assert_eq!(intent_states(backlog, nobody).await, vec![]);
    // A search finds text in the callback or the topic, with the other
    // filters.
    fn found<'a>(search: &'a str, owner: Option<&'a str>) -> Listing<'a> {
        Listing {
            failed: None,
            owner,
            search: Some(search),
        }
    }
    let fourth = admitted[4].request.callback.clone();
    assert_eq!(
        callbacks(intent_states(backlog, found(&fourth, None)).await),
        nth(&[4])
    );
    assert_eq!(
        callbacks(intent_states(backlog, found("listing-", Some("alice"))).await),
        nth(&[4, 2, 0])
    );
    assert_eq!(
        callbacks(intent_states(backlog, found(&t, Some("bob"))).await),
        nth(&[3, 1])
    );
    assert_eq!(
        intent_states(backlog, found("no such text", None)).await,
        vec![]
    );
    assert_eq!(
        callbacks(backlog.intents(all(), 2).await.expect("list")),
        nth(&[5, 4])
    );
}

/// `subscribing` is true exactly while a subscribe to the topic waits
/// (claimed or retrying included), so a publish meanwhile is not dropped.
pub async fn subscribing_follows_waiting_subscribes(backlog: &dyn Backlog) {
    let (t, unsub_only, failing) = (
        topic("subscribing"),
        topic("unsubscribing"),
        topic("subscribe-failing"),
    );
    assert!(!subscribing(backlog, &t).await);

    admit(backlog, subscribe(&t, &callback("s")), at(0)).await;
    admit(backlog, unsubscribe(&unsub_only, &callback("u")), at(0)).await;
    admit(backlog, subscribe(&failing, &callback("f")), at(0)).await;
    assert!(subscribing(backlog, &t).await, "waiting");
    assert!(!subscribing(backlog, &unsub_only).await, "unsubscribe only");
    assert!(subscribing(backlog, &failing).await);
    assert!(!subscribing(backlog, &topic("nobody")).await);

    let claimed = claim_intents(backlog, at(0)).await;
    assert_eq!(claimed.len(), 3);
    assert!(subscribing(backlog, &t).await, "claimed");
    let find = |topic: &str| {
        claimed
            .iter()
            .find(|intent| intent.request.topic == topic)
            .expect("claimed")
            .clone()
    };

    let failing_intent = find(&failing);
    finish_intent(
        backlog,
        &failing_intent,
        // Within the visibility timeout, so the other claims stay held.
        IntentResult::Retry {
            at: at(10),
            error: "timed out".to_owned(),
        },
    )
    .await;
    assert!(subscribing(backlog, &failing).await, "retrying");
    let failing_intent = claim_one_intent(backlog, at(10)).await;
    finish_intent(
        backlog,
        &failing_intent,
        IntentResult::Failed {
            error: "denied".to_owned(),
        },
    )
    .await;
    assert!(!subscribing(backlog, &failing).await, "failed");

    finish_intent(backlog, &find(&t), IntentResult::Done).await;
    assert!(!subscribing(backlog, &t).await, "done");
}

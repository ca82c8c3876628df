//! Endpoint state ([`EndpointStates`]): failures in a row and disabling,
//! and the history of changes: kept, listed, claimed for the operator
//! webhook, settled, bounded, purged.
//!
//! [`EndpointStates`]: websub_hub::storage::events::EndpointStates

use chrono::{DateTime, Utc};
use uuid::Uuid;
use websub_hub::storage::events::{
    ChangeFilter, EndpointChange, EndpointState, EventLog, Exhaustion, MAX_CHANGES, NewChange,
    Sent, WebhookState,
};

use super::helpers::{base_time, secs};

fn change(endpoint: &str, to: EndpointState, at: DateTime<Utc>) -> NewChange {
    NewChange {
        channel: "websub",
        endpoint: endpoint.to_owned(),
        to,
        at,
        failures: Some(3),
        since: Some(at - secs(10)),
        // Non-ASCII and a quote: what an error text may hold.
        reason: Some("HTTP 503 \"Zoë\"".to_owned()),
        source: "breaker",
    }
}

fn change_states(changes: &[EndpointChange]) -> Vec<EndpointState> {
    changes.iter().map(|change| change.to).collect()
}

pub async fn endpoints_are_disabled_after_failures_in_a_row(log: &dyn EventLog) {
    let t0 = base_time();
    let run = Uuid::new_v4().simple();
    let dead = format!("https://dead.example/{run}");
    let flaky = format!("https://flaky.example/{run}");
    let failing = |endpoint: &str| Exhaustion {
        endpoint: Box::leak(endpoint.to_owned().into_boxed_str()),
        error: "HTTP 500",
    };
    let disabled = log
        .tally_endpoints(
            "websub",
            &[failing(&dead), failing(&dead), failing(&flaky)],
            &[],
            3,
            t0,
        )
        .await
        .expect("tally");
    assert!(disabled.is_empty());
    let ours =
        |records: Vec<websub_hub::storage::events::EndpointRecord>| -> Vec<(String, u32, bool)> {
            records
                .into_iter()
                .filter(|record| record.endpoint.ends_with(&run.to_string()))
                .map(|record| {
                    (
                        record.endpoint,
                        record.failures,
                        record.disabled_at.is_some(),
                    )
                })
                .collect()
        };
    assert_eq!(
        ours(log.endpoints("websub", 1000).await.expect("endpoints")),
        vec![(dead.clone(), 2, false), (flaky.clone(), 1, false)]
    );
    // A delivery clears the failures; the third exhaustion in a row
    // disables, once.
    let disabled = log
        .tally_endpoints("websub", &[failing(&dead)], &[&flaky], 3, t0 + secs(1))
        .await
        .expect("tally");
    assert_eq!(disabled, vec![dead.clone()]);
    let disabled = log
        .tally_endpoints("websub", &[failing(&dead)], &[&dead], 3, t0 + secs(2))
        .await
        .expect("tally");
    assert!(disabled.is_empty(), "already disabled");
    let listed = log.endpoints("websub", 1000).await.expect("endpoints");
    let record = listed
        .iter()
        .find(|record| record.endpoint == dead)
        .expect("the dead endpoint");
    assert_eq!(record.disabled_at, Some(t0 + secs(1)));
    assert!(
        record
            .disabled_reason
            .as_deref()
            .is_some_and(|reason| reason.contains("3 deliveries")),
        "{record:?}"
    );
    assert_eq!(
        record.failures, 4,
        "a delivery does not clear a disabled endpoint"
    );
    assert_eq!(
        log.endpoint("websub", &dead)
            .await
            .expect("one endpoint")
            .as_ref(),
        Some(record),
        "one endpoint read alone is as the list has it"
    );
    assert_eq!(
        log.endpoint("webhook", &dead).await.expect("one endpoint"),
        None,
        "an endpoint is its channel's"
    );
    assert_eq!(ours(listed), vec![(dead.clone(), 4, true)]);

    assert!(
        log.set_endpoint_disabled("websub", &dead, None, t0)
            .await
            .expect("enable")
    );
    assert!(
        !log.set_endpoint_disabled("websub", &dead, None, t0)
            .await
            .expect("enable")
    );
    assert!(
        log.set_endpoint_disabled("websub", &flaky, Some("maintenance"), t0)
            .await
            .expect("disable")
    );
    assert!(
        !log.set_endpoint_disabled("websub", &flaky, Some("again"), t0)
            .await
            .expect("disable"),
        "already disabled"
    );
    assert_eq!(
        ours(log.endpoints("websub", 1000).await.expect("endpoints")),
        vec![(flaky.clone(), 0, true)]
    );
    // Never disabled with a threshold of 0.
    let never = format!("https://never.example/{run}");
    let disabled = log
        .tally_endpoints("websub", &[failing(&never); 10], &[], 0, t0)
        .await
        .expect("tally");
    assert!(disabled.is_empty());
    // Channels are apart: a webhook of the same name is another endpoint.
    assert!(
        log.set_endpoint_disabled("webhook", &flaky, Some("webhook down"), t0)
            .await
            .expect("disable")
    );
    let webhooks = log.endpoints("webhook", 1000).await.expect("endpoints");
    assert!(
        webhooks
            .iter()
            .any(|record| record.endpoint == flaky && record.channel == "webhook")
    );
    assert!(
        log.set_endpoint_disabled("websub", &flaky, None, t0)
            .await
            .expect("enable")
    );
    assert!(
        log.endpoints("webhook", 1000)
            .await
            .expect("endpoints")
            .iter()
            .any(|record| record.endpoint == flaky),
        "enabling the callback leaves the webhook disabled"
    );
}

pub async fn changes_are_kept_and_listed_newest_first(log: &dyn EventLog) {
    let t0 = base_time();
    let changes = log.changes();
    let a = "https://a.example/cb";
    let b = "https://b.example/cb";
    changes
        .append_changes(&[
            change(a, EndpointState::Failing, t0),
            change(a, EndpointState::Open, t0 + secs(1)),
            change(b, EndpointState::Failing, t0 + secs(1)),
        ])
        .await
        .expect("append");
    let mut webhook = change("orders", EndpointState::Disabled, t0 + secs(2));
    webhook.channel = "webhook";
    webhook.failures = None;
    webhook.since = None;
    webhook.source = "operator";
    changes
        .append_changes(&[change(a, EndpointState::Recovered, t0 + secs(3)), webhook])
        .await
        .expect("append");

    let all = changes
        .list_changes(ChangeFilter::default(), 100)
        .await
        .expect("list");
    assert_eq!(
        change_states(&all),
        [
            EndpointState::Disabled,
            EndpointState::Recovered,
            EndpointState::Failing,
            EndpointState::Open,
            EndpointState::Failing,
        ],
        "newest first, in the order they were appended"
    );
    assert!(all.windows(2).all(|pair| pair[0].id > pair[1].id));
    let first = all.last().expect("the oldest");
    assert_eq!(first.endpoint, a);
    assert_eq!(first.at, t0);
    assert_eq!(first.failures, Some(3));
    assert_eq!(first.since, Some(t0 - secs(10)));
    assert_eq!(first.reason.as_deref(), Some("HTTP 503 \"Zoë\""));
    assert_eq!(first.source.as_deref(), Some("breaker"));
    assert_eq!(first.webhook_state, WebhookState::Pending);
    assert_eq!(first.webhook_retries, 0);
    assert_eq!(first.delivered_at, None);
    assert_eq!(all[0].failures, None);
    assert_eq!(all[0].channel, "webhook");

    let of_a = changes
        .list_changes(
            ChangeFilter {
                endpoint: Some(a),
                ..ChangeFilter::default()
            },
            100,
        )
        .await
        .expect("list");
    assert_eq!(
        change_states(&of_a),
        [
            EndpointState::Recovered,
            EndpointState::Open,
            EndpointState::Failing
        ]
    );
    let webhooks = changes
        .list_changes(
            ChangeFilter {
                channel: Some("webhook"),
                ..ChangeFilter::default()
            },
            100,
        )
        .await
        .expect("list");
    assert_eq!(webhooks.len(), 1);
    let newest = changes
        .list_changes(ChangeFilter::default(), 2)
        .await
        .expect("list");
    assert_eq!(newest.len(), 2, "the limit holds");
    assert_eq!(newest[0].id, all[0].id);
}

pub async fn unsent_changes_are_claimed_once_and_settled(log: &dyn EventLog) {
    let t0 = base_time();
    let changes = log.changes();
    let batch: Vec<NewChange> = (0..5)
        .map(|i| {
            change(
                &format!("https://e{i}.example/"),
                EndpointState::Failing,
                t0,
            )
        })
        .collect();
    changes.append_changes(&batch).await.expect("append");
    let claim_until = t0 + secs(60);
    let first = changes
        .claim_unsent(t0, claim_until, 2)
        .await
        .expect("claim");
    assert_eq!(first.len(), 2);
    assert!(first[0].id < first[1].id, "oldest first");
    assert_eq!(first[0].endpoint, "https://e0.example/");
    let second = changes
        .claim_unsent(t0, claim_until, 10)
        .await
        .expect("claim");
    assert_eq!(second.len(), 3, "a claimed change is not claimed again");
    assert!(
        changes
            .claim_unsent(t0, claim_until, 10)
            .await
            .expect("claim")
            .is_empty()
    );
    // Not due before its time.
    let later = change("https://later.example/", EndpointState::Open, t0 + secs(30));
    changes.append_changes(&[later]).await.expect("append");
    assert!(
        changes
            .claim_unsent(t0, claim_until, 10)
            .await
            .expect("claim")
            .is_empty()
    );

    changes
        .settle_sent(&[
            (first[0].id, Sent::Delivered(t0 + secs(1))),
            (
                first[1].id,
                Sent::Retry {
                    error: "HTTP 500".to_owned(),
                    next_attempt_at: t0 + secs(5),
                    counted: true,
                },
            ),
            (second[0].id, Sent::Released),
            (
                second[1].id,
                Sent::Failed {
                    error: "HTTP 400".to_owned(),
                },
            ),
            (
                second[2].id,
                Sent::Retry {
                    error: "held".to_owned(),
                    next_attempt_at: t0 + secs(5),
                    counted: false,
                },
            ),
        ])
        .await
        .expect("settle");
    let again = changes
        .claim_unsent(t0 + secs(1), claim_until, 10)
        .await
        .expect("claim");
    assert_eq!(
        again.iter().map(|change| change.id).collect::<Vec<_>>(),
        vec![second[0].id],
        "a released claim is due as it was; retries wait"
    );
    let due = changes
        .claim_unsent(t0 + secs(5), claim_until, 10)
        .await
        .expect("claim");
    assert_eq!(
        due.iter().map(|change| change.id).collect::<Vec<_>>(),
        vec![first[1].id, second[2].id]
    );
    assert_eq!(due[0].webhook_retries, 1, "a counted retry");
    assert_eq!(due[1].webhook_retries, 0, "a held one spends none");
    assert_eq!(due[0].webhook_error.as_deref(), Some("HTTP 500"));
    // A claim that ran out is taken over.
    let taken_over = changes
        .claim_unsent(claim_until, claim_until + secs(60), 10)
        .await
        .expect("claim");
    assert_eq!(taken_over.len(), 4, "{taken_over:?}");

    let listed = changes
        .list_changes(ChangeFilter::default(), 100)
        .await
        .expect("list");
    let by_id = |id: i64| {
        listed
            .iter()
            .find(|change| change.id == id)
            .expect("listed")
    };
    assert_eq!(by_id(first[0].id).webhook_state, WebhookState::Delivered);
    assert_eq!(by_id(first[0].id).delivered_at, Some(t0 + secs(1)));
    assert_eq!(by_id(second[1].id).webhook_state, WebhookState::Failed);
    assert_eq!(
        by_id(second[1].id).webhook_error.as_deref(),
        Some("HTTP 400")
    );
}

pub async fn the_backlog_for_the_webhook_is_bounded(log: &dyn EventLog) {
    let t0 = base_time();
    let changes = log.changes();
    let old = change(
        "https://old.example/",
        EndpointState::Failing,
        t0 - secs(7200),
    );
    changes.append_changes(&[old]).await.expect("append");
    let batch: Vec<NewChange> = (0..10)
        .map(|i| change(&format!("https://e{i}.example/"), EndpointState::Open, t0))
        .collect();
    changes.append_changes(&batch).await.expect("append");
    // Delivered ones are not part of the backlog.
    let claimed = changes
        .claim_unsent(t0, t0 + secs(60), 2)
        .await
        .expect("claim");
    assert_eq!(claimed[0].endpoint, "https://old.example/");
    changes
        .settle_sent(&[
            (claimed[0].id, Sent::Released),
            (claimed[1].id, Sent::Delivered(t0)),
        ])
        .await
        .expect("settle");
    // 10 pending: the old one, and e1..e9. Keep 20, nothing older than an
    // hour: the old one goes.
    assert_eq!(
        changes
            .shed_unsent(20, t0 - secs(3600))
            .await
            .expect("shed"),
        1
    );
    // Keep the newest 4 of the 9 left.
    assert_eq!(
        changes.shed_unsent(4, t0 - secs(3600)).await.expect("shed"),
        5
    );
    assert_eq!(
        changes.shed_unsent(4, t0 - secs(3600)).await.expect("shed"),
        0,
        "within the bound"
    );
    let listed = changes
        .list_changes(ChangeFilter::default(), 100)
        .await
        .expect("list");
    let pending: Vec<&str> = listed
        .iter()
        .filter(|change| change.webhook_state == WebhookState::Pending)
        .map(|change| change.endpoint.as_str())
        .collect();
    assert_eq!(
        pending,
        [
            "https://e9.example/",
            "https://e8.example/",
            "https://e7.example/",
            "https://e6.example/"
        ]
    );
    assert_eq!(
        listed
            .iter()
            .filter(|change| change.webhook_state == WebhookState::Dropped)
            .count(),
        6
    );
    assert_eq!(
        listed
            .iter()
            .find(|change| change.endpoint == "https://e0.example/")
            .map(|change| change.webhook_state),
        Some(WebhookState::Delivered),
        "a delivered change stays as it was"
    );
    let pending = changes
        .claim_unsent(t0, t0 + secs(60), 100)
        .await
        .expect("claim");
    assert_eq!(pending.len(), 4, "dropped changes are not claimed");
}

pub async fn the_history_is_bounded_and_purged_by_age(log: &dyn EventLog) {
    let t0 = base_time();
    let changes = log.changes();
    let old = change(
        "https://old.example/",
        EndpointState::Failing,
        t0 - secs(86_400),
    );
    changes.append_changes(&[old]).await.expect("append");
    assert_eq!(
        changes
            .purge_changes_before(t0 - secs(3600))
            .await
            .expect("purge"),
        1
    );
    // Beyond the bound, the oldest go as new ones come.
    let total = usize::try_from(MAX_CHANGES).expect("small") + 25;
    let mut appended = 0;
    while appended < total {
        let batch: Vec<NewChange> = (appended..(appended + 5_000).min(total))
            .map(|i| {
                change(
                    &format!("https://e{i}.example/"),
                    EndpointState::Failing,
                    t0,
                )
            })
            .collect();
        appended += batch.len();
        changes.append_changes(&batch).await.expect("append");
    }
    let listed = changes
        .list_changes(ChangeFilter::default(), usize::MAX)
        .await
        .expect("list");
    assert_eq!(listed.len(), usize::try_from(MAX_CHANGES).expect("small"));
    assert_eq!(
        listed[0].endpoint,
        format!("https://e{}.example/", total - 1),
        "the newest is kept"
    );
    assert_eq!(
        listed.last().map(|change| change.endpoint.clone()),
        Some("https://e25.example/".to_owned()),
        "the oldest beyond the bound are gone"
    );
}

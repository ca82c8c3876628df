//! Subscriptions' signing ([`SubscriptionSigning`]): kept per subscription,
//! replaced whole, listed by topic and callback within a limit.
//!
//! [`SubscriptionSigning`]: websub_hub::storage::events::SubscriptionSigning

use websub_hub::storage::events::{EventLog, Signing, SigningScheme};

use super::helpers::{base_time, secs};

pub async fn signing_is_kept_per_subscription_and_replaced_whole(log: &dyn EventLog) {
    let t0 = base_time();
    let rotating = Signing {
        topic: "https://p.example/t".to_owned(),
        callback: "https://b.example/cb".to_owned(),
        scheme: SigningScheme::StandardWebhooks,
        previous: Some(("whsec_b2xkLXNlY3JldA==".to_owned(), t0 + secs(60))),
        since: t0,
    };
    let plain = Signing {
        topic: "https://p.example/t".to_owned(),
        callback: "https://a.example/cb".to_owned(),
        scheme: SigningScheme::WebSub,
        previous: None,
        since: t0 + secs(1),
    };
    log.set_signing(&rotating).await.expect("set");
    log.set_signing(&plain).await.expect("set");
    assert_eq!(
        log.signings(10).await.expect("list"),
        vec![plain.clone(), rotating.clone()],
        "by topic, then callback"
    );
    assert_eq!(log.signings(1).await.expect("list"), vec![plain]);

    let settled = Signing {
        previous: None,
        since: t0 + secs(120),
        ..rotating
    };
    log.set_signing(&settled).await.expect("replace");
    let listed = log.signings(10).await.expect("list");
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[1], settled, "replaced whole");
}

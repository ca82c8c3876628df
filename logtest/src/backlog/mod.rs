//! The backlog's checks ([`Backlog`]), and the helpers they are written
//! with (public, for a backend's own tests).
//!
//! [`Backlog`]: websub_hub::storage::backlog::Backlog

mod fetches;
mod intents;
mod retention;

pub use fetches::*;
pub use intents::*;
pub use retention::*;

use std::time::Duration;

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use websub_hub::protocol::{Mode, SubscriptionRequest};
use websub_hub::storage::backlog::{
    Admission, Backlog, ClaimedFetch, FetchResult, FetchState, Intent, IntentResult, IntentState,
    Listing, Validators,
};

/// Long enough that no claim in a check goes stale unless the check moves
/// its `now` past it.
pub const VISIBILITY: Duration = Duration::from_secs(30);

/// Large enough that only the admission check meets the bound.
pub const NO_BOUND: u64 = 1_000_000;

/// `n` seconds after a fixed instant, with a microsecond part so that a
/// backend rounding to milliseconds or seconds would show.
pub fn at(n: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2030, 1, 2, 3, 4, 5)
        .single()
        .expect("a valid fixed time")
        + TimeDelta::microseconds(123_456)
        + TimeDelta::seconds(n)
}

pub fn visibility() -> TimeDelta {
    TimeDelta::from_std(VISIBILITY).expect("visibility in range")
}

pub fn topic(name: &str) -> String {
    // Non-ASCII and a double quote: topic lists travel as JSON on SQLite.
    format!("https://publisher.example/t\u{f6}pics/{name}?q=\"x\"")
}

pub fn callback(name: &str) -> String {
    format!("https://subscriber.example/callback/{name}?token=a%20b&name=Zo\u{eb}")
}

pub fn subscribe(topic: &str, callback: &str) -> SubscriptionRequest {
    SubscriptionRequest {
        mode: Mode::Subscribe,
        topic: topic.to_owned(),
        callback: callback.to_owned(),
        lease_seconds: Some(864_000),
        secret: Some("s3cr\u{e9}t".to_owned()),
        owner: Some("alice".to_owned()),
    }
}

pub fn unsubscribe(topic: &str, callback: &str) -> SubscriptionRequest {
    SubscriptionRequest {
        mode: Mode::Unsubscribe,
        topic: topic.to_owned(),
        callback: callback.to_owned(),
        lease_seconds: None,
        secret: None,
        owner: None,
    }
}

pub fn owned_by(owner: Option<&str>, request: SubscriptionRequest) -> SubscriptionRequest {
    SubscriptionRequest {
        owner: owner.map(str::to_owned),
        ..request
    }
}

pub async fn ping(backlog: &dyn Backlog, topics: &[String], now: DateTime<Utc>) {
    backlog
        .request_fetches(topics, now, None)
        .await
        .expect("request fetches");
}

/// Claims every due fetch at `now`, sorted by topic (a claim's order is
/// not part of the contract).
pub async fn claim_fetches(backlog: &dyn Backlog, now: DateTime<Utc>) -> Vec<ClaimedFetch> {
    let mut claimed = backlog
        .claim_fetches(100, now, VISIBILITY)
        .await
        .expect("claim fetches");
    claimed.sort_by(|a, b| a.topic.cmp(&b.topic));
    claimed
}

pub async fn claim_one_fetch(backlog: &dyn Backlog, now: DateTime<Utc>) -> ClaimedFetch {
    let mut claimed = claim_fetches(backlog, now).await;
    assert_eq!(claimed.len(), 1, "one fetch due at {now}: {claimed:?}");
    claimed.remove(0)
}

pub async fn finish_fetch(
    backlog: &dyn Backlog,
    fetch: &ClaimedFetch,
    result: FetchResult,
    now: DateTime<Utc>,
) {
    backlog
        .finish_fetch(fetch, result, now)
        .await
        .expect("finish a fetch");
}

pub fn done(validators: Option<Validators>) -> FetchResult {
    FetchResult::Done { validators }
}

pub async fn fetch_states(backlog: &dyn Backlog, failed: Option<bool>) -> Vec<FetchState> {
    backlog
        .fetches(
            Listing {
                failed,
                owner: None,
                search: None,
            },
            100,
        )
        .await
        .expect("list fetches")
}

pub async fn admit(
    backlog: &dyn Backlog,
    request: SubscriptionRequest,
    now: DateTime<Utc>,
) -> Intent {
    let intent = Intent::new(request, now);
    assert_eq!(
        backlog
            .request_intent(&intent, NO_BOUND)
            .await
            .expect("request an intent"),
        Admission::Accepted
    );
    intent
}

/// Claims every due intent at `now`, sorted by callback.
pub async fn claim_intents(backlog: &dyn Backlog, now: DateTime<Utc>) -> Vec<Intent> {
    let mut claimed = backlog
        .claim_intents(100, now, VISIBILITY)
        .await
        .expect("claim intents");
    claimed.sort_by(|a, b| {
        (&a.request.topic, &a.request.callback).cmp(&(&b.request.topic, &b.request.callback))
    });
    claimed
}

pub async fn claim_one_intent(backlog: &dyn Backlog, now: DateTime<Utc>) -> Intent {
    let mut claimed = claim_intents(backlog, now).await;
    assert_eq!(claimed.len(), 1, "one intent due at {now}: {claimed:?}");
    claimed.remove(0)
}

pub async fn finish_intent(backlog: &dyn Backlog, intent: &Intent, result: IntentResult) {
    backlog
        .finish_intent(intent, result)
        .await
        .expect("finish an intent");
}

pub async fn intent_states(backlog: &dyn Backlog, listing: Listing<'_>) -> Vec<IntentState> {
    backlog.intents(listing, 100).await.expect("list intents")
}

pub fn all() -> Listing<'static> {
    Listing::default()
}

pub fn failed(failed: bool) -> Listing<'static> {
    Listing {
        failed: Some(failed),
        owner: None,
        search: None,
    }
}

/// The state a just-admitted intent is listed with.
pub fn waiting_state(intent: &Intent) -> IntentState {
    IntentState {
        mode: intent.request.mode,
        topic: intent.request.topic.clone(),
        callback: intent.request.callback.clone(),
        owner: intent.request.owner.clone(),
        requested_at: intent.requested_at,
        attempts: 0,
        next_attempt_at: Some(intent.requested_at),
        last_error: None,
    }
}

pub async fn subscribing(backlog: &dyn Backlog, topic: &str) -> bool {
    backlog.subscribing(topic).await.expect("subscribing")
}

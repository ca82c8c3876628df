//! Verification of intent and the subscription workflow over real HTTP on
//! 127.0.0.1: the recording receiver plays the subscriber, records every
//! request it gets and answers as each test scripts it.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{Method, StatusCode};
use chrono::{DateTime, TimeZone, Utc};
use websub_hub::clock::{Clock, ManualClock};
use websub_hub::config::{LeasePolicy, VerificationPolicy};
use websub_hub::delivery::net::{NetError, NetPolicy};
use websub_hub::intake::verify::{
    CHALLENGE_LENGTH, ProcessError, Processed, Subscriptions, Verifier, VerifyError,
};
use websub_hub::protocol::{Mode, SubscriptionRequest};
use websub_hub::storage::backlog::{Admission, Backlog, Listing};
use websub_hub::storage::events::sqlite::SqliteEventLog;
use websub_store::memory::MemoryStore;
use websub_store::{StoreError, Subscription, SubscriptionStore};
use websub_tests::{Received, RecordingReceiver, Route};

const TOPIC: &str = "https://publisher.example/feed?format=atom";
const TIMEOUT: Duration = Duration::from_secs(10);

/// How the subscriber answers requests to one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// 200 with the challenge.
    Echo,
    /// 202 with the challenge: any 2xx counts.
    EchoAccepted,
    /// 404 with the challenge: the subscriber's "no" wins over the body.
    NotFound,
    /// 200 with the challenge and one byte more.
    WrongBody,
    /// 200 with an empty body.
    Empty,
    /// 200 with a body far larger than any challenge.
    Oversized,
    /// 500 with the challenge.
    ServerError,
    /// 302 to a path that would echo.
    Redirect,
    /// Never answers.
    Hang,
}

impl Answer {
    /// What the recording receiver answers for this case.
    fn scripted(self) -> websub_tests::Answer {
        use websub_tests::Answer as Scripted;
        match self {
            Self::Echo => Scripted::echo(),
            Self::EchoAccepted => Scripted::echo().with_status(202),
            Self::NotFound => Scripted::echo().with_status(404),
            Self::WrongBody => Scripted::challenge_with(|challenge| format!("{challenge}\n")),
            Self::Empty => Scripted::status(200),
            Self::Oversized => Scripted::challenge_with(|challenge| challenge.repeat(10_000)),
            Self::ServerError => Scripted::echo().with_status(500),
            Self::Redirect => Scripted::echo()
                .with_status(302)
                .with_header("location", "/followed-redirect"),
            Self::Hang => Scripted::never(),
        }
    }
}

/// The test subscriber: the recording receiver, answering each callback
/// path as scripted and any other path [`Answer::NotFound`].
struct Subscriber {
    receiver: RecordingReceiver,
}

impl Subscriber {
    async fn start() -> Self {
        let receiver = RecordingReceiver::start().await;
        receiver.answer(Route::any(), Answer::NotFound.scripted());
        Self { receiver }
    }

    /// A callback URL on this subscriber answering `answer`.
    fn callback(&self, path_and_query: &str, answer: Answer) -> String {
        let path = path_and_query.split('?').next().unwrap_or(path_and_query);
        self.answer(path, answer);
        format!("http://{}{path_and_query}", self.receiver.address())
    }

    fn answer(&self, path: &str, answer: Answer) {
        self.receiver.answer(path, answer.scripted());
    }

    fn seen(&self) -> Vec<Received> {
        self.receiver.received()
    }
}

fn start_time() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2030, 6, 1, 12, 0, 0)
        .single()
        .unwrap_or_else(|| panic!("valid date"))
}

fn lease_policy() -> LeasePolicy {
    LeasePolicy {
        default: Duration::from_secs(600),
        min: Duration::from_secs(60),
        max: Duration::from_secs(3600),
    }
}

/// A backlog in a fresh SQLite file (its tables come with the event log's
/// migrations).
async fn temporary_backlog() -> Arc<dyn Backlog> {
    let url = websub_storetest::scratch::sqlite_url("verification");
    SqliteEventLog::connect(&url).await.expect("event log");
    websub_hub::storage::backlog::connect(&url)
        .await
        .expect("backlog")
}

/// The hub side: the workflow over a memory store, a manual clock, and a
/// client allowed to reach loopback.
struct Hub {
    subscriptions: Subscriptions,
    store: Arc<MemoryStore>,
    clock: Arc<ManualClock>,
}

impl Hub {
    async fn new(allow_private_network: bool, timeout: Duration) -> Self {
        let store = Arc::new(MemoryStore::new());
        let clock = Arc::new(ManualClock::new(start_time()));
        let policy = NetPolicy {
            allow_private_network,
        };
        let verification = VerificationPolicy {
            timeout,
            concurrency: 8,
            ..VerificationPolicy::default()
        };
        let client = callback_clients(&policy, timeout);
        let subscriptions = Subscriptions::new(
            store.clone(),
            temporary_backlog().await,
            Verifier::new(client, verification),
            policy,
            lease_policy(),
            verification,
            clock.clone(),
        );
        Self {
            subscriptions,
            store,
            clock,
        }
    }

    async fn allowing_loopback() -> Self {
        Self::new(true, TIMEOUT).await
    }

    async fn process(&self, request: SubscriptionRequest) -> Result<Processed, ProcessError> {
        self.subscriptions.process(request).await
    }

    async fn stored(&self, callback: &str) -> Option<Subscription> {
        match self.store.get(TOPIC, callback).await {
            Ok(subscription) => Some(subscription),
            Err(StoreError::UnknownSubscription { .. }) => None,
            Err(error) => panic!("store: {error}"),
        }
    }

    async fn all(&self) -> Vec<Subscription> {
        self.store
            .list_by_topic(TOPIC)
            .await
            .unwrap_or_else(|error| panic!("store: {error}"))
    }
}

fn subscribe(
    callback: &str,
    lease_seconds: Option<u64>,
    secret: Option<&str>,
) -> SubscriptionRequest {
    SubscriptionRequest {
        mode: Mode::Subscribe,
        topic: TOPIC.to_owned(),
        callback: callback.to_owned(),
        lease_seconds,
        secret: secret.map(str::to_owned),
        owner: Some("subscriber-1".to_owned()),
    }
}

fn unsubscribe(callback: &str) -> SubscriptionRequest {
    SubscriptionRequest {
        mode: Mode::Unsubscribe,
        topic: TOPIC.to_owned(),
        callback: callback.to_owned(),
        lease_seconds: None,
        secret: None,
        owner: None,
    }
}

#[tokio::test]
async fn echoed_challenge_saves_the_subscription_with_the_granted_lease() {
    let subscriber = Subscriber::start().await;
    let hub = Hub::allowing_loopback().await;
    let callback = subscriber.callback("/cb/long", Answer::Echo);

    // Asked for far more than the maximum: clamped to 3600.
    let outcome = hub
        .process(subscribe(&callback, Some(1_000_000), Some("s3cret")))
        .await;
    assert_eq!(
        outcome.ok(),
        Some(Processed::Subscribed {
            lease_seconds: 3600
        })
    );

    let now = hub.clock.now();
    let saved = hub
        .stored(&callback)
        .await
        .unwrap_or_else(|| panic!("not saved"));
    assert_eq!(
        saved,
        Subscription {
            topic: TOPIC.to_owned(),
            callback: callback.clone(),
            secret: Some("s3cret".to_owned()),
            lease_seconds: Some(3600),
            created_at: now,
            verified_at: now,
            expires_at: Some(now + chrono::Duration::seconds(3600)),
            owner: Some("subscriber-1".to_owned()),
        }
    );

    let seen = subscriber.seen();
    assert_eq!(seen.len(), 1);
    let request = &seen[0];
    assert_eq!(request.method, Method::GET);
    assert_eq!(request.param("hub.mode"), Some("subscribe"));
    assert_eq!(request.param("hub.topic"), Some(TOPIC));
    assert_eq!(request.param("hub.lease_seconds"), Some("3600"));
    let challenge = request.param("hub.challenge").unwrap_or_default();
    assert!(challenge.len() >= 32, "challenge {challenge:?}");
    assert!(
        challenge.bytes().all(|byte| byte.is_ascii_alphanumeric()),
        "challenge {challenge:?}"
    );
}

#[tokio::test]
async fn leases_are_clamped_up_and_defaulted() {
    let subscriber = Subscriber::start().await;
    let hub = Hub::allowing_loopback().await;
    let short = subscriber.callback("/cb/short", Answer::Echo);
    let default = subscriber.callback("/cb/default", Answer::EchoAccepted);

    assert_eq!(
        hub.process(subscribe(&short, Some(1), None)).await.ok(),
        Some(Processed::Subscribed { lease_seconds: 60 })
    );
    assert_eq!(
        hub.process(subscribe(&default, None, None)).await.ok(),
        Some(Processed::Subscribed { lease_seconds: 600 })
    );
    let lease_sent: Vec<Option<String>> = subscriber
        .seen()
        .iter()
        .map(|seen| seen.param("hub.lease_seconds").map(str::to_owned))
        .collect();
    assert_eq!(lease_sent, [Some("60".to_owned()), Some("600".to_owned())]);
    let stored = hub
        .stored(&short)
        .await
        .unwrap_or_else(|| panic!("not saved"));
    assert_eq!(
        stored.expires_at,
        Some(stored.verified_at + chrono::Duration::seconds(60))
    );
}

#[tokio::test]
async fn the_callbacks_own_query_string_is_kept_and_ours_appended() {
    let subscriber = Subscriber::start().await;
    let hub = Hub::allowing_loopback().await;
    let callback = subscriber.callback("/cb/query?id=7&name=a%20b&hub.mode=theirs", Answer::Echo);

    assert!(hub.process(subscribe(&callback, None, None)).await.is_ok());
    // Stored with the callback exactly as given.
    assert!(hub.stored(&callback).await.is_some());

    let seen = subscriber.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/cb/query");
    assert!(
        seen[0]
            .query()
            .starts_with("id=7&name=a%20b&hub.mode=theirs&hub.mode=subscribe&"),
        "{}",
        seen[0].query()
    );
    let names: Vec<&str> = seen[0]
        .params
        .iter()
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "id",
            "name",
            "hub.mode",
            "hub.mode",
            "hub.topic",
            "hub.challenge",
            "hub.lease_seconds"
        ]
    );
    assert_eq!(seen[0].params[1].1, "a b");
}

#[tokio::test]
async fn every_failed_verification_saves_nothing() {
    let subscriber = Subscriber::start().await;
    let hub = Hub::allowing_loopback().await;
    let cases = [
        ("/cb/not-found", Answer::NotFound),
        ("/cb/wrong-body", Answer::WrongBody),
        ("/cb/empty", Answer::Empty),
        ("/cb/oversized", Answer::Oversized),
        ("/cb/server-error", Answer::ServerError),
        ("/cb/redirect", Answer::Redirect),
    ];
    for (path, answer) in cases {
        let callback = subscriber.callback(path, answer);
        let outcome = hub.process(subscribe(&callback, None, Some("x"))).await;
        let matched = match (&outcome, answer) {
            (Err(ProcessError::Verification(VerifyError::NotFound)), Answer::NotFound) => true,
            (
                Err(ProcessError::Verification(VerifyError::ChallengeMismatch { body_bytes })),
                Answer::WrongBody,
            ) => *body_bytes == CHALLENGE_LENGTH + 1,
            (
                Err(ProcessError::Verification(VerifyError::ChallengeMismatch { body_bytes: 0 })),
                Answer::Empty,
            ) => true,
            (
                Err(ProcessError::Verification(VerifyError::ChallengeMismatch { body_bytes })),
                Answer::Oversized,
            ) => *body_bytes > 1024,
            (
                Err(ProcessError::Verification(VerifyError::Status { status })),
                Answer::ServerError,
            ) => *status == StatusCode::INTERNAL_SERVER_ERROR,
            (
                Err(ProcessError::Verification(VerifyError::Redirect { status })),
                Answer::Redirect,
            ) => *status == StatusCode::FOUND,
            _ => false,
        };
        assert!(matched, "{answer:?}: {outcome:?}");
    }
    assert!(hub.all().await.is_empty());
    // The redirect was not followed.
    let paths: Vec<String> = subscriber
        .seen()
        .into_iter()
        .map(|seen| seen.path)
        .collect();
    assert_eq!(paths.len(), cases.len());
    assert!(!paths.iter().any(|path| path == "/followed-redirect"));
}

#[tokio::test]
async fn a_callback_that_hangs_times_out_and_saves_nothing() {
    let subscriber = Subscriber::start().await;
    let hub = Hub::new(true, Duration::from_millis(300)).await;
    let callback = subscriber.callback("/cb/hang", Answer::Hang);
    let outcome = hub.process(subscribe(&callback, None, None)).await;
    assert!(
        matches!(
            outcome,
            Err(ProcessError::Verification(VerifyError::Timeout { .. }))
        ),
        "{outcome:?}"
    );
    assert!(hub.all().await.is_empty());
}

#[tokio::test]
async fn a_callback_nobody_listens_on_is_a_connection_error() {
    let hub = Hub::allowing_loopback().await;
    let closed = {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|error| panic!("bind: {error}"));
        listener
            .local_addr()
            .unwrap_or_else(|error| panic!("local address: {error}"))
    };
    let callback = format!("http://{closed}/cb");
    let outcome = hub.process(subscribe(&callback, None, None)).await;
    assert!(
        matches!(
            outcome,
            Err(ProcessError::Verification(VerifyError::Connect { .. }))
        ),
        "{outcome:?}"
    );
    assert!(hub.all().await.is_empty());
}

#[tokio::test]
async fn resubscribing_replaces_the_state_and_keeps_created_at() {
    let subscriber = Subscriber::start().await;
    let hub = Hub::allowing_loopback().await;
    let callback = subscriber.callback("/cb/renew", Answer::Echo);

    assert!(
        hub.process(subscribe(&callback, Some(120), Some("first")))
            .await
            .is_ok()
    );
    let created_at = hub.clock.now();
    hub.clock.advance(Duration::from_secs(100));
    assert_eq!(
        hub.process(subscribe(&callback, Some(900), Some("second")))
            .await
            .ok(),
        Some(Processed::Subscribed { lease_seconds: 900 })
    );

    let all = hub.all().await;
    assert_eq!(all.len(), 1);
    let renewed = &all[0];
    let now = hub.clock.now();
    assert_eq!(renewed.secret.as_deref(), Some("second"));
    assert_eq!(renewed.created_at, created_at);
    assert_eq!(renewed.verified_at, now);
    assert_eq!(renewed.lease_seconds, Some(900));
    assert_eq!(
        renewed.expires_at,
        Some(now + chrono::Duration::seconds(900))
    );

    // A renewal may also drop the secret.
    assert!(hub.process(subscribe(&callback, None, None)).await.is_ok());
    assert_eq!(hub.stored(&callback).await.and_then(|sub| sub.secret), None);
}

#[tokio::test]
async fn a_failed_renewal_keeps_the_old_subscription_and_secret() {
    let subscriber = Subscriber::start().await;
    let hub = Hub::allowing_loopback().await;
    let callback = subscriber.callback("/cb/flaky", Answer::Echo);
    assert!(
        hub.process(subscribe(&callback, Some(300), Some("kept")))
            .await
            .is_ok()
    );
    let before = hub.stored(&callback).await;

    hub.clock.advance(Duration::from_secs(60));
    subscriber.answer("/cb/flaky", Answer::ServerError);
    let outcome = hub
        .process(subscribe(&callback, Some(3000), Some("replacement")))
        .await;
    assert!(
        matches!(outcome, Err(ProcessError::Verification(_))),
        "{outcome:?}"
    );

    let after = hub.stored(&callback).await;
    assert!(after.is_some());
    assert_eq!(after, before);
    assert_eq!(after.and_then(|sub| sub.secret).as_deref(), Some("kept"));
}

#[tokio::test]
async fn a_verified_unsubscribe_deletes() {
    let subscriber = Subscriber::start().await;
    let hub = Hub::allowing_loopback().await;
    let callback = subscriber.callback("/cb/leaving", Answer::Echo);
    assert!(hub.process(subscribe(&callback, None, None)).await.is_ok());

    assert_eq!(
        hub.process(unsubscribe(&callback)).await.ok(),
        Some(Processed::Unsubscribed)
    );
    assert_eq!(hub.stored(&callback).await, None);

    let seen = subscriber.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].param("hub.mode"), Some("unsubscribe"));
    assert_eq!(seen[1].param("hub.topic"), Some(TOPIC));
    assert_eq!(seen[1].param("hub.lease_seconds"), None);
    assert!(seen[1].param("hub.challenge").is_some());

    // Unsubscribing what is not there is still verified, and succeeds.
    assert_eq!(
        hub.process(unsubscribe(&callback)).await.ok(),
        Some(Processed::Unsubscribed)
    );
}

#[tokio::test]
async fn a_refused_unsubscribe_keeps_the_subscription() {
    let subscriber = Subscriber::start().await;
    let hub = Hub::allowing_loopback().await;
    let callback = subscriber.callback("/cb/staying", Answer::Echo);
    assert!(
        hub.process(subscribe(&callback, None, Some("s")))
            .await
            .is_ok()
    );
    let before = hub.stored(&callback).await;

    // Someone else asks to unsubscribe; the subscriber says no.
    subscriber.answer("/cb/staying", Answer::NotFound);
    let outcome = hub.process(unsubscribe(&callback)).await;
    assert!(
        matches!(
            outcome,
            Err(ProcessError::Verification(VerifyError::NotFound))
        ),
        "{outcome:?}"
    );
    assert!(before.is_some());
    assert_eq!(hub.stored(&callback).await, before);
}

#[tokio::test]
async fn challenges_are_unique_across_requests() {
    let subscriber = Subscriber::start().await;
    let hub = Hub::allowing_loopback().await;
    let callback = subscriber.callback("/cb/many", Answer::Echo);
    for _ in 0..8 {
        assert!(hub.process(subscribe(&callback, None, None)).await.is_ok());
    }
    assert!(hub.process(unsubscribe(&callback)).await.is_ok());
    let challenges: Vec<String> = subscriber
        .seen()
        .iter()
        .filter_map(|seen| seen.param("hub.challenge").map(str::to_owned))
        .collect();
    assert_eq!(challenges.len(), 9);
    let distinct: HashSet<&String> = challenges.iter().collect();
    assert_eq!(distinct.len(), challenges.len());
}

#[tokio::test]
async fn deny_sends_mode_denied_with_the_reason() {
    let subscriber = Subscriber::start().await;
    let hub = Hub::allowing_loopback().await;
    let callback = subscriber.callback("/cb/denied?id=9", Answer::Empty);

    let sent = hub
        .subscriptions
        .verifier()
        .deny(TOPIC, &callback, "too many subscriptions")
        .await;
    assert!(sent.is_ok(), "{sent:?}");

    let seen = subscriber.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, Method::GET);
    assert_eq!(seen[0].param("id"), Some("9"));
    assert_eq!(seen[0].param("hub.mode"), Some("denied"));
    assert_eq!(seen[0].param("hub.topic"), Some(TOPIC));
    assert_eq!(seen[0].param("hub.reason"), Some("too many subscriptions"));
    assert_eq!(seen[0].param("hub.challenge"), None);
}

#[tokio::test]
async fn the_network_policy_refuses_loopback_callbacks_when_not_allowed() {
    let subscriber = Subscriber::start().await;
    let hub = Hub::new(false, TIMEOUT).await;
    let literal = subscriber.callback("/cb/private", Answer::Echo);
    let named = literal.replace("127.0.0.1", "localhost");

    // At request time, for the 400.
    for callback in [&literal, &named] {
        let checked = hub
            .subscriptions
            .check(&subscribe(callback, None, None))
            .await;
        assert!(
            matches!(checked, Err(NetError::NonPublicAddress { .. })),
            "{callback}: {checked:?}"
        );
    }
    // And again when processing, before anything is sent. (Other names that
    // resolve to loopback are refused by the client's resolver at connect
    // time; net.rs tests that.)
    for callback in [&literal, &named] {
        let outcome = hub.process(subscribe(callback, None, None)).await;
        assert!(
            matches!(
                outcome,
                Err(ProcessError::Refused(NetError::NonPublicAddress { .. }))
            ),
            "{callback}: {outcome:?}"
        );
    }
    assert!(
        subscriber.seen().is_empty(),
        "a private callback was contacted"
    );
    assert!(hub.all().await.is_empty());

    // The same callback passes when private networks are allowed.
    let allowed = Hub::allowing_loopback().await;
    assert!(
        allowed
            .subscriptions
            .check(&subscribe(&literal, None, None))
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn accepted_requests_are_processed_in_the_background_and_drained() {
    let subscriber = Subscriber::start().await;
    let hub = Hub::allowing_loopback().await;
    let first = subscriber.callback("/cb/bg-1", Answer::Echo);
    let second = subscriber.callback("/cb/bg-2", Answer::NotFound);

    for callback in [&first, &second] {
        let admission = hub
            .subscriptions
            .accept(subscribe(callback, None, None))
            .await;
        assert_eq!(admission.expect("accepted"), Admission::Accepted);
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let verifiers = tokio::spawn(hub.subscriptions.clone().run_verifiers(stop.clone()));
    tokio::time::timeout(Duration::from_secs(10), async {
        while subscriber.seen().len() < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("both callbacks asked");
    stop.cancel();
    verifiers.await.expect("verifiers stop");
    hub.subscriptions.tracker().close();
    hub.subscriptions.tracker().wait().await;

    assert!(hub.stored(&first).await.is_some());
    assert!(hub.stored(&second).await.is_none());
    assert_eq!(subscriber.seen().len(), 2);
    // The refusal is final and kept, with its reason, for the requester.
    let failed = hub
        .subscriptions
        .backlog()
        .intents(Listing::default(), 10)
        .await
        .expect("listing");
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].callback, second);
    assert_eq!(failed[0].next_attempt_at, None);
    assert!(
        failed[0]
            .last_error
            .as_deref()
            .is_some_and(|error| error.contains("404")),
        "{failed:?}"
    );
}

/// A store whose every save is refused as over quota: stands in for the
/// quota check that will plug into the workflow's save.
#[derive(Debug, Default)]
struct FullStore(MemoryStore);

#[async_trait::async_trait]
impl SubscriptionStore for FullStore {
    async fn save(&self, _subscription: &Subscription) -> Result<(), StoreError> {
        Err(StoreError::LimitReached { limit: 3, used: 3 })
    }
    async fn get(&self, topic: &str, callback: &str) -> Result<Subscription, StoreError> {
        self.0.get(topic, callback).await
    }
    async fn delete(&self, topic: &str, callback: &str) -> Result<(), StoreError> {
        self.0.delete(topic, callback).await
    }
    async fn list_by_topic(&self, topic: &str) -> Result<Vec<Subscription>, StoreError> {
        self.0.list_by_topic(topic).await
    }
    async fn topics(&self) -> Result<Vec<String>, StoreError> {
        self.0.topics().await
    }
    async fn list_expiring(&self, before: DateTime<Utc>) -> Result<Vec<Subscription>, StoreError> {
        self.0.list_expiring(before).await
    }
    async fn count_by_owner(&self, owner: &str) -> Result<u64, StoreError> {
        self.0.count_by_owner(owner).await
    }
    async fn list_by_owner(&self, owner: &str) -> Result<Vec<Subscription>, StoreError> {
        self.0.list_by_owner(owner).await
    }
    async fn list_by_topic_page(
        &self,
        topic: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Subscription>, StoreError> {
        self.0.list_by_topic_page(topic, after, limit).await
    }
    async fn save_within_limit(
        &self,
        subscription: &Subscription,
        _quota: &websub_store::OwnerQuota,
    ) -> Result<(), StoreError> {
        self.save(subscription).await
    }
}

#[tokio::test]
async fn a_save_refused_by_policy_sends_a_denial_after_verification() {
    let subscriber = Subscriber::start().await;
    let store = Arc::new(FullStore::default());
    let policy = NetPolicy {
        allow_private_network: true,
    };
    let verification = VerificationPolicy {
        timeout: TIMEOUT,
        concurrency: 1,
        ..VerificationPolicy::default()
    };
    let subscriptions = Subscriptions::new(
        store.clone(),
        temporary_backlog().await,
        Verifier::new(callback_clients(&policy, TIMEOUT), verification),
        policy,
        lease_policy(),
        verification,
        Arc::new(ManualClock::new(start_time())),
    );
    let callback = subscriber.callback("/cb/over-quota", Answer::Echo);

    let outcome = subscriptions
        .process(subscribe(&callback, None, None))
        .await;
    assert!(
        matches!(outcome, Err(ProcessError::Denied { .. })),
        "{outcome:?}"
    );
    assert!(matches!(
        store.get(TOPIC, &callback).await,
        Err(StoreError::UnknownSubscription { .. })
    ));
    let modes: Vec<Option<String>> = subscriber
        .seen()
        .iter()
        .map(|seen| seen.param("hub.mode").map(str::to_owned))
        .collect();
    assert_eq!(
        modes,
        [Some("subscribe".to_owned()), Some("denied".to_owned())]
    );
    let denial = &subscriber.seen()[1];
    assert_eq!(denial.param("hub.topic"), Some(TOPIC));
    assert!(
        denial
            .param("hub.reason")
            .is_some_and(|reason| !reason.is_empty())
    );
}

/// The clients a verifier contacts callbacks with, as the hub builds them.
fn callback_clients(
    policy: &websub_hub::delivery::net::NetPolicy,
    timeout: Duration,
) -> websub_hub::delivery::pool::HostClients {
    websub_hub::delivery::pool::HostClients::new(
        policy,
        timeout,
        &websub_hub::delivery::client::Trust::system(),
        websub_hub::delivery::pool::IdleLimits::of_budget(64, 2),
    )
    .expect("callback clients")
}

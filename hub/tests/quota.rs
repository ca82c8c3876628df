//! Quota enforcement over real HTTP: the enforcer asks the fake
//! subscriptions service on 127.0.0.1 for limits, and saves into the memory
//! store and a real PostgreSQL store (a fresh database per check, from
//! `websub_storetest::servers`).
//!
//! Every `check_total` rule is one async check over `&dyn
//! SubscriptionStore`, run for both stores.

#![cfg(feature = "testing")]

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use websub_hub::intake::quota::fake::FakeQuotaServer;
use websub_hub::intake::quota::{
    self, DEFAULT_INTERNAL_API_KEY_HEADER, DEFAULT_TIMEOUT, ErrorBody, Quota, QuotaConfig,
    QuotaEnforcer, QuotaError,
};
use websub_hub::web::api::ApiError;
use websub_store::memory::MemoryStore;
use websub_store::postgres::PostgresStore;
use websub_store::{OwnerQuota, StoreError, Subscription, SubscriptionStore};

const KEY: &str = "quota-test-internal-key-0123456789abcdef";
const TYPE: &str = OwnerQuota::DEFAULT_TYPE;
const TOPIC: &str = "https://publisher.example/feed";

fn enforcer(server: &FakeQuotaServer) -> QuotaEnforcer {
    QuotaEnforcer::new(server.config()).expect("the fake's config is complete")
}

fn subscription(owner: &str, n: usize) -> Subscription {
    Subscription::new(TOPIC, format!("https://subscriber.example/cb/{n}")).with_owner(owner)
}

// ---------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------

#[test]
fn config_defaults_and_keeps_the_key_out_of_debug() {
    let config = QuotaConfig::default();
    assert_eq!(config.base_url, None);
    assert_eq!(config.timeout, DEFAULT_TIMEOUT);
    assert_eq!(config.timeout, Duration::from_secs(5));
    assert_eq!(config.internal_api_key, None);
    assert_eq!(
        config.internal_api_key_header,
        DEFAULT_INTERNAL_API_KEY_HEADER
    );
    assert_eq!(config.quota_type, TYPE);
    // Incomplete, so refused where the service starts.
    assert!(matches!(
        QuotaEnforcer::new(config),
        Err(QuotaError::InvalidConfig(_))
    ));

    let keyed = QuotaConfig {
        internal_api_key: Some(KEY.to_owned()),
        ..QuotaConfig::default()
    };
    assert!(
        !format!("{keyed:?}").contains(KEY),
        "Debug must not print the key"
    );
}

#[test]
fn new_refuses_an_incomplete_config() {
    let complete = QuotaConfig {
        base_url: Some("http://127.0.0.1:9/".parse().expect("a URL")),
        internal_api_key: Some(KEY.to_owned()),
        ..QuotaConfig::default()
    };
    assert!(QuotaEnforcer::new(complete.clone()).is_ok());

    let cases = [
        QuotaConfig {
            base_url: None,
            ..complete.clone()
        },
        QuotaConfig {
            internal_api_key: None,
            ..complete.clone()
        },
        QuotaConfig {
            internal_api_key: Some(String::new()),
            ..complete.clone()
        },
        QuotaConfig {
            timeout: Duration::ZERO,
            ..complete.clone()
        },
        QuotaConfig {
            base_url: Some("ftp://files.example/".parse().expect("a URL")),
            ..complete.clone()
        },
        QuotaConfig {
            internal_api_key_header: "bad header".to_owned(),
            ..complete.clone()
        },
    ];
    for config in cases {
        let shown = format!("{config:?}");
        assert!(
            matches!(
                QuotaEnforcer::new(config),
                Err(QuotaError::InvalidConfig(_))
            ),
            "{shown} must be refused"
        );
    }
}

// ---------------------------------------------------------------------------
// Limits: what the subscriptions service answers, and how it is read
// ---------------------------------------------------------------------------

#[tokio::test]
async fn limit_reads_a_total_quota_and_sends_the_internal_key() {
    let server = FakeQuotaServer::start(KEY);
    server.set_default_quotas(vec![Quota::total("other_type", 9), Quota::total(TYPE, 5)]);
    let quota = enforcer(&server)
        .limit(TYPE, "user-1")
        .await
        .expect("a quota");
    assert_eq!(quota, Quota::total(TYPE, 5));
    assert_eq!(quota.kind, "total");
    // The fake answers 401 without its key, so an answer proves it was sent.
    assert_eq!(server.requests(), 1);
}

#[tokio::test]
async fn unlimited_is_read_from_unlimited_not_from_a_zero_limit() {
    let server = FakeQuotaServer::start(KEY);
    server.set_quotas("supporter", vec![Quota::unlimited(TYPE)]);
    server.set_quotas("nobody", vec![Quota::total(TYPE, 0)]);
    let enforcer = enforcer(&server);

    let supporter = enforcer.limit(TYPE, "supporter").await.expect("a quota");
    assert!(supporter.unlimited);
    assert_eq!(supporter.limit, 0);

    let nobody = enforcer.limit(TYPE, "nobody").await.expect("a quota");
    assert!(!nobody.unlimited);
    assert_eq!(nobody.limit, 0);
}

#[tokio::test]
async fn decoding_is_strict() {
    let server = FakeQuotaServer::start(KEY);
    let enforcer = enforcer(&server);
    let bodies = [
        ("no quotas", r#"{}"#.to_owned()),
        ("null quotas", r#"{"quotas":null}"#.to_owned()),
        (
            "no quota_limit",
            format!(r#"{{"quotas":[{{"quota_type":"{TYPE}","kind":"total","unlimited":false}}]}}"#),
        ),
        (
            "no unlimited",
            format!(r#"{{"quotas":[{{"quota_type":"{TYPE}","kind":"total","quota_limit":5}}]}}"#),
        ),
        (
            "negative limit",
            format!(
                r#"{{"quotas":[{{"quota_type":"{TYPE}","kind":"total","quota_limit":-1,"unlimited":false}}]}}"#
            ),
        ),
        (
            "limit as text",
            format!(
                r#"{{"quotas":[{{"quota_type":"{TYPE}","kind":"total","quota_limit":"5","unlimited":false}}]}}"#
            ),
        ),
        ("garbage", "<html>gateway</html>".to_owned()),
        ("empty", String::new()),
    ];
    for (what, body) in bodies {
        server.respond_with_body(body);
        match enforcer.limit(TYPE, "user-1").await {
            Err(QuotaError::UnexpectedResponse { status, .. }) => {
                assert_eq!(status, StatusCode::OK, "{what}");
            }
            other => panic!("{what}: expected UnexpectedResponse, got {other:?}"),
        }
    }
    // The same shape with both fields decodes, so the refusals above are
    // about the missing or wrong field.
    server.respond_with_body(format!(
        r#"{{"quotas":[{{"quota_type":"{TYPE}","kind":"total","quota_limit":5,"unlimited":false,"extra":1}}]}}"#
    ));
    assert_eq!(
        enforcer.limit(TYPE, "user-1").await.expect("decodes"),
        Quota::total(TYPE, 5)
    );
}

#[tokio::test]
async fn a_tier_without_the_quota_type_is_not_allowed() {
    let server = FakeQuotaServer::start(KEY);
    server.set_default_quotas(vec![Quota::total(TYPE, 5)]);
    server.set_quotas("no-quotas", vec![]);
    server.set_quotas("other-quotas", vec![Quota::total("private_setups", 3)]);
    let enforcer = enforcer(&server);
    for user in ["no-quotas", "other-quotas"] {
        assert!(
            matches!(
                enforcer.limit(TYPE, user).await,
                Err(QuotaError::NotAllowed { ref quota_type }) if quota_type == TYPE
            ),
            "{user}"
        );
    }
    // Users without quotas of their own still get the defaults.
    assert!(enforcer.limit(TYPE, "someone-else").await.is_ok());
}

#[tokio::test]
async fn an_unknown_user_is_resource_not_found() {
    let server = FakeQuotaServer::start(KEY);
    let enforcer = enforcer(&server);
    // No defaults: the fake answers 404 for anyone without quotas.
    assert!(matches!(
        enforcer.limit(TYPE, "ghost").await,
        Err(QuotaError::ResourceNotFound { ref subscriber }) if subscriber == "ghost"
    ));
    server.set_default_quotas(vec![Quota::total(TYPE, 1)]);
    server.respond_with(StatusCode::NOT_FOUND);
    assert!(matches!(
        enforcer.limit(TYPE, "ghost").await,
        Err(QuotaError::ResourceNotFound { .. })
    ));
}

#[tokio::test]
async fn other_statuses_are_unexpected_responses_that_keep_the_status() {
    let server = FakeQuotaServer::start(KEY);
    server.set_default_quotas(vec![Quota::total(TYPE, 5)]);
    let enforcer = enforcer(&server);
    for status in [
        StatusCode::INTERNAL_SERVER_ERROR,
        StatusCode::BAD_GATEWAY,
        StatusCode::NO_CONTENT,
        StatusCode::FOUND,
        StatusCode::FORBIDDEN,
    ] {
        server.respond_with(status);
        match enforcer.limit(TYPE, "user-1").await {
            Err(QuotaError::UnexpectedResponse { status: got, .. }) => assert_eq!(got, status),
            other => panic!("{status}: expected UnexpectedResponse, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_wrong_internal_key_is_an_unexpected_401() {
    let server = FakeQuotaServer::start(KEY);
    server.set_default_quotas(vec![Quota::total(TYPE, 5)]);
    let wrong = QuotaEnforcer::new(QuotaConfig {
        internal_api_key: Some("not-the-key-the-service-expects-at-all".to_owned()),
        ..server.config()
    })
    .expect("complete");
    assert!(matches!(
        wrong.limit(TYPE, "user-1").await,
        Err(QuotaError::UnexpectedResponse {
            status: StatusCode::UNAUTHORIZED,
            ..
        })
    ));
    let other_header = QuotaEnforcer::new(QuotaConfig {
        internal_api_key_header: "X-Other-Key".to_owned(),
        ..server.config()
    })
    .expect("complete");
    assert!(matches!(
        other_header.limit(TYPE, "user-1").await,
        Err(QuotaError::UnexpectedResponse {
            status: StatusCode::UNAUTHORIZED,
            ..
        })
    ));
    assert_eq!(server.requests(), 2);
    assert!(enforcer(&server).limit(TYPE, "user-1").await.is_ok());
}

#[tokio::test]
async fn the_user_id_travels_as_one_encoded_path_segment() {
    let server = FakeQuotaServer::start(KEY);
    let awkward = "team/42 owner?x=1#frag%2F";
    server.set_quotas(awkward, vec![Quota::total(TYPE, 7)]);
    let quota = enforcer(&server)
        .limit(TYPE, awkward)
        .await
        .expect("the fake decodes the segment back to the id");
    assert_eq!(quota.limit, 7);

    // Ids that cannot be a path segment are no subscriber at all, and are
    // not asked about.
    for id in ["", ".", ".."] {
        assert!(matches!(
            enforcer(&server).limit(TYPE, id).await,
            Err(QuotaError::ResourceNotFound { .. })
        ));
    }
    assert_eq!(server.requests(), 1);
}

#[tokio::test]
async fn a_base_url_with_a_path_keeps_it() {
    let server = FakeQuotaServer::start(KEY);
    server.set_default_quotas(vec![Quota::total(TYPE, 5)]);
    let mut config = server.config();
    config.base_url = Some(server.url().join("api/").expect("a URL"));
    // The fake serves at the root only, so the request reaches it under
    // /api/... and is a 404 for an unknown route: the path was kept.
    assert!(matches!(
        QuotaEnforcer::new(config)
            .expect("complete")
            .limit(TYPE, "u")
            .await,
        Err(QuotaError::ResourceNotFound { .. })
    ));
    assert_eq!(server.requests(), 1);
}

#[tokio::test]
async fn an_unreachable_service_is_unavailable_until_reachable_again() {
    let server = FakeQuotaServer::start(KEY);
    server.set_default_quotas(vec![Quota::total(TYPE, 5)]);
    let enforcer = enforcer(&server);
    server.respond_unreachable();
    let error = enforcer.limit(TYPE, "user-1").await.expect_err("no answer");
    assert!(matches!(error, QuotaError::Unavailable(_)), "{error:?}");
    assert!(
        std::error::Error::source(&error).is_some(),
        "the cause is kept"
    );
    assert_eq!(server.requests(), 0, "dropped connections are not answered");

    server.reachable();
    assert!(enforcer.limit(TYPE, "user-1").await.is_ok());

    server.respond_unreachable();
    server.reset();
    assert!(enforcer.limit(TYPE, "user-1").await.is_ok());
}

#[tokio::test]
async fn a_closed_service_is_unavailable() {
    let server = FakeQuotaServer::start(KEY);
    server.set_default_quotas(vec![Quota::total(TYPE, 5)]);
    let enforcer = enforcer(&server);
    assert!(enforcer.limit(TYPE, "user-1").await.is_ok());
    server.close();
    server.close(); // idempotent
    assert!(matches!(
        enforcer.limit(TYPE, "user-1").await,
        Err(QuotaError::Unavailable(_))
    ));
}

#[tokio::test]
async fn a_service_that_never_answers_times_out_as_unavailable() {
    // Connections complete in the backlog, but nothing ever reads or
    // answers them.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/", silent.local_addr().expect("address"));
    let enforcer = QuotaEnforcer::new(QuotaConfig {
        base_url: Some(url.parse().expect("a URL")),
        internal_api_key: Some(KEY.to_owned()),
        timeout: Duration::from_millis(300),
        ..QuotaConfig::default()
    })
    .expect("complete");
    let started = Instant::now();
    match enforcer.limit(TYPE, "user-1").await {
        Err(QuotaError::Unavailable(cause)) => assert!(cause.is_timeout(), "{cause:?}"),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    drop(silent);
}

// ---------------------------------------------------------------------------
// check_total, against each store
// ---------------------------------------------------------------------------

/// Runs one check against the memory store and a fresh PostgreSQL store.
macro_rules! both_stores {
    ($($name:ident),* $(,)?) => {
        mod memory_store {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(&websub_store::memory::MemoryStore::new()).await;
                }
            )*
        }
        mod postgres_store {
            $(
                #[tokio::test]
                async fn $name() {
                    let Some(store) = super::postgres_store().await else { return };
                    super::$name(&store).await;
                }
            )*
        }
    };
}

both_stores!(
    saves_under_the_limit_and_refuses_at_it,
    a_resubscribe_of_an_owned_pair_does_not_count,
    an_unlimited_quota_saves_without_counting,
    a_zero_limit_refuses_everything,
    a_quota_not_allowed_saves_nothing,
    an_unobtainable_limit_saves_nothing,
    a_subscription_without_owner_is_refused_before_asking,
    pools_of_different_owners_are_separate,
);

async fn postgres_store() -> Option<PostgresStore> {
    let Some(url) = websub_storetest::servers::fresh_postgres_url().await else {
        eprintln!("skipping: no PostgreSQL server for tests");
        return None;
    };
    Some(
        PostgresStore::connect(&url)
            .await
            .expect("connect to the fresh database"),
    )
}

async fn saves_under_the_limit_and_refuses_at_it(store: &dyn SubscriptionStore) {
    let server = FakeQuotaServer::start(KEY);
    server.set_quotas("alice", vec![Quota::total(TYPE, 2)]);
    let enforcer = enforcer(&server);
    for n in 0..2 {
        enforcer
            .check_total(store, &subscription("alice", n))
            .await
            .expect("room in the pool");
    }
    let third = subscription("alice", 2);
    assert!(matches!(
        enforcer.check_total(store, &third).await,
        Err(QuotaError::LimitReached { limit: 2, used: 2 })
    ));
    assert_eq!(store.count_by_owner("alice").await.expect("count"), 2);
    assert!(matches!(
        store.get(&third.topic, &third.callback).await,
        Err(StoreError::UnknownSubscription { .. })
    ));
}

async fn a_resubscribe_of_an_owned_pair_does_not_count(store: &dyn SubscriptionStore) {
    let server = FakeQuotaServer::start(KEY);
    server.set_quotas("bob", vec![Quota::total(TYPE, 2)]);
    let enforcer = enforcer(&server);
    for n in 0..2 {
        enforcer
            .check_total(store, &subscription("bob", n))
            .await
            .expect("room in the pool");
    }
    let renewed = subscription("bob", 1).with_secret("a new secret");
    enforcer
        .check_total(store, &renewed)
        .await
        .expect("a re-subscribe of a held pair is not new");
    assert_eq!(
        store
            .get(&renewed.topic, &renewed.callback)
            .await
            .expect("kept")
            .secret
            .as_deref(),
        Some("a new secret")
    );
    assert_eq!(store.count_by_owner("bob").await.expect("count"), 2);
}

async fn an_unlimited_quota_saves_without_counting(store: &dyn SubscriptionStore) {
    let server = FakeQuotaServer::start(KEY);
    // Read as a limit, 0 would refuse the first save.
    server.set_quotas("supporter", vec![Quota::unlimited(TYPE)]);
    let enforcer = enforcer(&server);
    for n in 0..4 {
        enforcer
            .check_total(store, &subscription("supporter", n))
            .await
            .expect("no cap");
    }
    assert_eq!(store.count_by_owner("supporter").await.expect("count"), 4);
}

async fn a_zero_limit_refuses_everything(store: &dyn SubscriptionStore) {
    let server = FakeQuotaServer::start(KEY);
    server.set_quotas("zero", vec![Quota::total(TYPE, 0)]);
    assert!(matches!(
        enforcer(&server)
            .check_total(store, &subscription("zero", 0))
            .await,
        Err(QuotaError::LimitReached { limit: 0, used: 0 })
    ));
    assert_eq!(store.count_by_owner("zero").await.expect("count"), 0);
}

async fn a_quota_not_allowed_saves_nothing(store: &dyn SubscriptionStore) {
    let server = FakeQuotaServer::start(KEY);
    server.set_quotas("free", vec![Quota::total("private_setups", 10)]);
    assert!(matches!(
        enforcer(&server)
            .check_total(store, &subscription("free", 0))
            .await,
        Err(QuotaError::NotAllowed { .. })
    ));
    assert_eq!(store.count_by_owner("free").await.expect("count"), 0);
}

async fn an_unobtainable_limit_saves_nothing(store: &dyn SubscriptionStore) {
    let server = FakeQuotaServer::start(KEY);
    let enforcer = enforcer(&server);
    // 404: no defaults and no quotas for this user.
    assert!(matches!(
        enforcer.check_total(store, &subscription("carol", 0)).await,
        Err(QuotaError::ResourceNotFound { .. })
    ));
    server.set_default_quotas(vec![Quota::total(TYPE, 5)]);
    server.respond_with(StatusCode::INTERNAL_SERVER_ERROR);
    assert!(matches!(
        enforcer.check_total(store, &subscription("carol", 1)).await,
        Err(QuotaError::UnexpectedResponse { .. })
    ));
    server.respond_unreachable();
    assert!(matches!(
        enforcer.check_total(store, &subscription("carol", 2)).await,
        Err(QuotaError::Unavailable(_))
    ));
    server.close();
    assert!(matches!(
        enforcer.check_total(store, &subscription("carol", 3)).await,
        Err(QuotaError::Unavailable(_))
    ));
    assert_eq!(store.count_by_owner("carol").await.expect("count"), 0);
    assert!(store.topics().await.expect("topics").is_empty());
}

async fn a_subscription_without_owner_is_refused_before_asking(store: &dyn SubscriptionStore) {
    let server = FakeQuotaServer::start(KEY);
    server.set_default_quotas(vec![Quota::total(TYPE, 5)]);
    let enforcer = enforcer(&server);
    let ownerless = Subscription::new(TOPIC, "https://subscriber.example/none");
    let empty_owner = ownerless.clone().with_owner("");
    for subscription in [ownerless, empty_owner] {
        assert!(matches!(
            enforcer.check_total(store, &subscription).await,
            Err(QuotaError::Store(StoreError::MissingOwner))
        ));
    }
    assert_eq!(server.requests(), 0);
    assert!(store.topics().await.expect("topics").is_empty());
}

async fn pools_of_different_owners_are_separate(store: &dyn SubscriptionStore) {
    let server = FakeQuotaServer::start(KEY);
    server.set_default_quotas(vec![Quota::total(TYPE, 1)]);
    let enforcer = enforcer(&server);
    enforcer
        .check_total(store, &subscription("dave", 0))
        .await
        .expect("dave has room");
    enforcer
        .check_total(store, &subscription("erin", 1))
        .await
        .expect("erin's pool is her own");
    assert!(matches!(
        enforcer.check_total(store, &subscription("dave", 2)).await,
        Err(QuotaError::LimitReached { limit: 1, used: 1 })
    ));
}

/// 50 saves of one owner at once, limit 5: exactly 5 land.
async fn concurrent_saves_never_exceed_the_limit(store: std::sync::Arc<dyn SubscriptionStore>) {
    let server = FakeQuotaServer::start(KEY);
    server.set_quotas("frank", vec![Quota::total(TYPE, 5)]);
    let enforcer = enforcer(&server);
    let tasks: Vec<_> = (0..50)
        .map(|n| {
            let (enforcer, store) = (enforcer.clone(), store.clone());
            tokio::spawn(async move {
                enforcer
                    .check_total(store.as_ref(), &subscription("frank", n))
                    .await
            })
        })
        .collect();
    let (mut saved, mut refused) = (0, 0);
    for task in tasks {
        match task.await.expect("the task ran") {
            Ok(()) => saved += 1,
            Err(QuotaError::LimitReached { limit: 5, used: 5 }) => refused += 1,
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((saved, refused), (5, 45));
    assert_eq!(store.count_by_owner("frank").await.expect("count"), 5);
    assert_eq!(server.requests(), 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_saves_on_postgres_never_exceed_the_limit() {
    let Some(store) = postgres_store().await else {
        return;
    };
    concurrent_saves_never_exceed_the_limit(std::sync::Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_saves_in_memory_never_exceed_the_limit() {
    concurrent_saves_never_exceed_the_limit(std::sync::Arc::new(MemoryStore::new())).await;
}

// ---------------------------------------------------------------------------
// HTTP answers
// ---------------------------------------------------------------------------

async fn body_of(response: Response) -> (StatusCode, ErrorBody) {
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 64 * 1024)
        .await
        .expect("a small body");
    (
        status,
        serde_json::from_slice(&bytes).expect("a JSON error body"),
    )
}

/// A real `Unavailable` cause: a request to a port nothing listens on.
async fn unavailable() -> QuotaError {
    let server = FakeQuotaServer::start(KEY);
    let enforcer = enforcer(&server);
    server.close();
    enforcer
        .limit(TYPE, "u")
        .await
        .expect_err("nothing listens")
}

#[tokio::test]
async fn every_error_maps_to_its_status_and_code() {
    let cases = [
        (
            QuotaError::LimitReached { limit: 5, used: 5 },
            StatusCode::FORBIDDEN,
            "limit_reached",
        ),
        (
            QuotaError::NotAllowed {
                quota_type: TYPE.to_owned(),
            },
            StatusCode::FORBIDDEN,
            "quota_not_allowed",
        ),
        (
            QuotaError::ResourceNotFound {
                subscriber: "u".to_owned(),
            },
            StatusCode::BAD_GATEWAY,
            "quota_resource_not_found",
        ),
        (
            QuotaError::UnexpectedResponse {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                reason: "boom".to_owned(),
            },
            StatusCode::BAD_GATEWAY,
            "quota_unexpected_response",
        ),
        (
            unavailable().await,
            StatusCode::SERVICE_UNAVAILABLE,
            "quota_unavailable",
        ),
        (
            QuotaError::Store(StoreError::Invalid("secret detail".to_owned())),
            StatusCode::INTERNAL_SERVER_ERROR,
            "quota_store_failed",
        ),
        (
            QuotaError::InvalidConfig("secret detail".to_owned()),
            StatusCode::INTERNAL_SERVER_ERROR,
            "quota_misconfigured",
        ),
    ];
    for (error, status, code) in cases {
        assert_eq!(error.status(), status, "{error:?}");
        assert_eq!(error.code(), code);
        let via_chain = quota::error_response(&error).expect("a quota error");
        let (got_status, body) = body_of(ApiError::from(error).into_response()).await;
        assert_eq!(got_status, status);
        assert_eq!(body.code, code);
        assert!(!body.message.is_empty());
        assert!(
            !body.message.contains("secret detail"),
            "internals stay out"
        );
        if code == "limit_reached" {
            assert_eq!((body.limit, body.used), (Some(5), Some(5)));
        } else {
            assert_eq!((body.limit, body.used), (None, None));
        }
        let (chain_status, chain_body) = body_of(via_chain).await;
        assert_eq!((chain_status, chain_body), (status, body));
    }
}

/// An application error that wraps whatever went wrong.
#[derive(Debug, thiserror::Error)]
#[error("save subscription")]
struct SaveError(#[source] Box<dyn std::error::Error + Send + Sync>);

#[tokio::test]
async fn error_response_finds_a_quota_error_in_a_chain_and_nothing_else() {
    let wrapped = SaveError(Box::new(QuotaError::NotAllowed {
        quota_type: TYPE.to_owned(),
    }));
    let response = quota::error_response(&wrapped).expect("found under the wrapper");
    let (status, body) = body_of(response).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(body.code, "quota_not_allowed");

    let unrelated = SaveError(Box::new(std::io::Error::other("disk full")));
    assert!(quota::error_response(&unrelated).is_none());
    assert!(quota::error_response(&StoreError::MissingOwner).is_none());
}

#[derive(Clone)]
struct App {
    enforcer: QuotaEnforcer,
    store: std::sync::Arc<MemoryStore>,
}

async fn subscribe(State(app): State<App>, Path((owner, n)): Path<(String, usize)>) -> Response {
    let result = app
        .enforcer
        .check_total(app.store.as_ref(), &subscription(&owner, n))
        .await
        .map_err(|error| SaveError(Box::new(error)));
    match result {
        Ok(()) => StatusCode::CREATED.into_response(),
        Err(error) => quota::error_response(&error)
            .unwrap_or_else(|| StatusCode::INTERNAL_SERVER_ERROR.into_response()),
    }
}

#[tokio::test]
async fn a_route_answers_quota_refusals_over_http() {
    let server = FakeQuotaServer::start(KEY);
    server.set_quotas("grace", vec![Quota::total(TYPE, 1)]);
    server.set_quotas("free", vec![]);
    let app = Router::new()
        .route("/subscribe/{owner}/{n}", post(subscribe))
        .with_state(App {
            enforcer: enforcer(&server),
            store: std::sync::Arc::new(MemoryStore::new()),
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("address"));
    let serving = tokio::spawn(async move { axum::serve(listener, app).await });
    let client = websub_tests::http_client();
    let post = |path: &str| client.post(format!("{base}{path}")).send();

    let first = post("/subscribe/grace/0").await.expect("answered");
    assert_eq!(first.status(), StatusCode::CREATED);

    let full = post("/subscribe/grace/1").await.expect("answered");
    assert_eq!(full.status(), StatusCode::FORBIDDEN);
    let body: serde_json::Value = full.json().await.expect("JSON");
    assert_eq!(body["code"], "limit_reached");
    assert_eq!(body["limit"], 1);
    assert_eq!(body["used"], 1);

    let not_allowed = post("/subscribe/free/0").await.expect("answered");
    assert_eq!(not_allowed.status(), StatusCode::FORBIDDEN);
    let body: serde_json::Value = not_allowed.json().await.expect("JSON");
    assert_eq!(body["code"], "quota_not_allowed");

    let unknown = post("/subscribe/nobody/0").await.expect("answered");
    assert_eq!(unknown.status(), StatusCode::BAD_GATEWAY);

    server.respond_unreachable();
    let down = post("/subscribe/grace/2").await.expect("answered");
    assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: serde_json::Value = down.json().await.expect("JSON");
    assert_eq!(body["code"], "quota_unavailable");
    serving.abort();
}

// ---------------------------------------------------------------------------
// One fake shared by a suite
// ---------------------------------------------------------------------------

/// Started once for the whole test binary; each test below runs on a
/// runtime of its own.
fn shared() -> &'static FakeQuotaServer {
    static SERVER: OnceLock<FakeQuotaServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let server = FakeQuotaServer::start(KEY);
        server.set_default_quotas(vec![Quota::total(TYPE, 3)]);
        server
    })
}

#[tokio::test]
async fn shared_server_first_test() {
    let server = shared();
    let _exclusive = server.exclusive().await;
    assert_eq!(server.requests(), 0, "reset when taken");
    server.set_quotas("shared-user", vec![Quota::unlimited(TYPE)]);
    let enforcer = enforcer(server);
    assert!(
        enforcer
            .limit(TYPE, "shared-user")
            .await
            .expect("a quota")
            .unlimited
    );
    server.respond_with(StatusCode::SERVICE_UNAVAILABLE);
    assert!(matches!(
        enforcer.limit(TYPE, "shared-user").await,
        Err(QuotaError::UnexpectedResponse { .. })
    ));
    assert_eq!(server.requests(), 2);
}

#[tokio::test]
async fn shared_server_second_test() {
    let server = shared();
    let _exclusive = server.exclusive().await;
    assert_eq!(server.requests(), 0, "reset when taken");
    let enforcer = enforcer(server);
    // Whatever the other test set is gone; the defaults stay.
    let quota = enforcer.limit(TYPE, "shared-user").await.expect("a quota");
    assert_eq!(quota, Quota::total(TYPE, 3));
    server.respond_unreachable();
    assert!(matches!(
        enforcer.limit(TYPE, "shared-user").await,
        Err(QuotaError::Unavailable(_))
    ));
    server.reset();
    assert!(enforcer.limit(TYPE, "shared-user").await.is_ok());
    assert_eq!(server.requests(), 1, "the reset cleared the count");
}

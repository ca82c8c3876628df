//! The hub endpoint's refusals, on the router itself: each request goes
//! through `Hub::router()` with `tower::ServiceExt::oneshot`, no socket, on
//! a memory store and an SQLite event log of the test's own. Every refusal
//! answers before any network call, so the whole 4xx table runs in
//! milliseconds; the socket tests in `hub.rs` cover the same answers end to
//! end.

use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use tower::ServiceExt;
use websub_hub::HubConfig;
use websub_hub::clock::SystemClock;
use websub_hub::server::Hub;
use websub_hub::storage::events::sqlite::SqliteEventLog;
use websub_store::memory::MemoryStore;
use websub_tests::INTERNAL_KEY;

const FORM: &str = "application/x-www-form-urlencoded";
const CALLBACK: &str = "https://subscriber.example/cb";
const TOPIC: &str = "https://publisher.example/feed";

/// A hub assembled for the test, with its event log file removed on drop.
struct TestRouter {
    hub: Hub,
    database: PathBuf,
}

impl Drop for TestRouter {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut path = self.database.clone().into_os_string();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }
}

impl TestRouter {
    /// A hub refusing private networks, with the [`INTERNAL_KEY`], after
    /// `configure` has had its say.
    async fn new(configure: impl FnOnce(&mut HubConfig)) -> Self {
        websub_hub::delivery::net::install_crypto_provider();
        let mut config = HubConfig {
            internal_api_key: Some(INTERNAL_KEY.to_owned()),
            ..HubConfig::default()
        };
        configure(&mut config);
        let database =
            std::env::temp_dir().join(format!("websub-router-{}.db", uuid::Uuid::new_v4()));
        let url = format!("sqlite:{}", database.display());
        let events = SqliteEventLog::connect(&url)
            .await
            .unwrap_or_else(|error| panic!("open the event log: {error}"));
        let backlog = websub_hub::storage::backlog::connect(&url)
            .await
            .unwrap_or_else(|error| panic!("open the backlog: {error}"));
        let hub = Hub::assemble(
            config,
            Arc::new(MemoryStore::new()),
            Arc::new(events),
            backlog,
            Arc::new(SystemClock),
        )
        .unwrap_or_else(|error| panic!("assemble the hub: {error}"));
        Self { hub, database }
    }

    /// Sends `request` through the router; the status and the body as text.
    async fn send(&self, request: Request<Body>) -> (StatusCode, String) {
        let response = self
            .hub
            .router()
            .oneshot(request)
            .await
            .unwrap_or_else(|error| match error {});
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap_or_else(|error| panic!("read the body: {error}"));
        (status, String::from_utf8_lossy(&body).into_owned())
    }
}

/// A POST to the hub URL.
fn post(query: Option<&str>, content_type: Option<&str>, body: impl Into<Body>) -> Request<Body> {
    let uri = match query {
        Some(query) => format!("/?{query}"),
        None => "/".to_owned(),
    };
    let mut request = Request::post(uri);
    if let Some(content_type) = content_type {
        request = request.header(header::CONTENT_TYPE, content_type);
    }
    request
        .body(body.into())
        .unwrap_or_else(|error| panic!("build a request: {error}"))
}

/// A form POST to the hub URL.
fn form(pairs: &[(&str, &str)]) -> Request<Body> {
    let body = serde_urlencoded::to_string(pairs).unwrap_or_else(|error| panic!("{error}"));
    post(None, Some(FORM), body)
}

/// A fat ping of `body` to `query`, with `key` in the internal key header.
fn fat_ping(query: &str, key: Option<&str>, body: impl Into<Body>) -> Request<Body> {
    let mut request = post(Some(query), Some("text/plain"), body);
    if let Some(key) = key {
        let value = key
            .parse()
            .unwrap_or_else(|error| panic!("header value: {error}"));
        request.headers_mut().insert("x-internal-api-key", value);
    }
    request
}

/// Sends each case and checks its status, and that the body names the
/// reason (`names` is part of it).
async fn refuses(router: &TestRouter, cases: Vec<(&str, Request<Body>, StatusCode, &str)>) {
    for (case, request, expected, names) in cases {
        let (status, reason) = router.send(request).await;
        assert_eq!(status, expected, "{case}: answered {status}: {reason}");
        assert!(
            reason.contains(names),
            "{case}: the reason {reason:?} does not name {names:?}"
        );
    }
}

#[tokio::test]
async fn bad_forms_get_a_400_naming_what_is_wrong() {
    let router = TestRouter::new(|_| {}).await;
    let long_secret = "s".repeat(200);
    let subscribe = |extra: &[(&'static str, &'static str)]| {
        let mut pairs = vec![
            ("hub.mode", "subscribe"),
            ("hub.topic", TOPIC),
            ("hub.callback", CALLBACK),
        ];
        pairs.extend_from_slice(extra);
        form(&pairs)
    };
    let bad_request = StatusCode::BAD_REQUEST;
    let cases = vec![
        (
            "no hub.mode",
            form(&[("hub.topic", TOPIC), ("hub.callback", CALLBACK)]),
            bad_request,
            "hub.mode",
        ),
        (
            "an unknown hub.mode",
            form(&[
                ("hub.mode", "follow"),
                ("hub.topic", TOPIC),
                ("hub.callback", CALLBACK),
            ]),
            bad_request,
            "hub.mode \"follow\"",
        ),
        (
            "no hub.topic",
            form(&[("hub.mode", "subscribe"), ("hub.callback", CALLBACK)]),
            bad_request,
            "hub.topic",
        ),
        (
            "an empty hub.topic",
            form(&[
                ("hub.mode", "subscribe"),
                ("hub.topic", ""),
                ("hub.callback", CALLBACK),
            ]),
            bad_request,
            "hub.topic",
        ),
        (
            "a relative hub.topic",
            form(&[
                ("hub.mode", "subscribe"),
                ("hub.topic", "/relative"),
                ("hub.callback", CALLBACK),
            ]),
            bad_request,
            "hub.topic",
        ),
        (
            "no hub.callback",
            form(&[("hub.mode", "subscribe"), ("hub.topic", TOPIC)]),
            bad_request,
            "hub.callback",
        ),
        (
            "an ftp hub.callback",
            form(&[
                ("hub.mode", "subscribe"),
                ("hub.topic", TOPIC),
                ("hub.callback", "ftp://subscriber.example/cb"),
            ]),
            bad_request,
            "hub.callback",
        ),
        (
            "hub.callback twice",
            subscribe(&[("hub.callback", "https://other.example/cb")]),
            bad_request,
            "hub.callback",
        ),
        (
            "a negative lease",
            subscribe(&[("hub.lease_seconds", "-5")]),
            bad_request,
            "hub.lease_seconds",
        ),
        (
            "a lease that is not a number",
            subscribe(&[("hub.lease_seconds", "soon")]),
            bad_request,
            "hub.lease_seconds",
        ),
        (
            "a 200-byte secret",
            {
                let pairs = [
                    ("hub.mode", "subscribe"),
                    ("hub.topic", TOPIC),
                    ("hub.callback", CALLBACK),
                    ("hub.secret", long_secret.as_str()),
                ];
                form(&pairs)
            },
            bad_request,
            "hub.secret",
        ),
        (
            "a publish naming no topic",
            form(&[("hub.mode", "publish")]),
            bad_request,
            "hub.url",
        ),
        (
            "a form that is not UTF-8",
            post(None, Some(FORM), "hub.mode=%FF"),
            bad_request,
            "UTF-8",
        ),
    ];
    refuses(&router, cases).await;
}

#[tokio::test]
async fn private_callbacks_and_topics_get_a_400() {
    let router = TestRouter::new(|config| config.allow_private_network = false).await;
    let cases = vec![
        (
            "a loopback callback",
            form(&[
                ("hub.mode", "subscribe"),
                ("hub.topic", TOPIC),
                ("hub.callback", "http://127.0.0.1:9/cb"),
            ]),
            StatusCode::BAD_REQUEST,
            "127.0.0.1",
        ),
        (
            "a publish of a private topic",
            form(&[("hub.mode", "publish"), ("hub.url", "http://10.0.0.1/feed")]),
            StatusCode::BAD_REQUEST,
            "10.0.0.1",
        ),
    ];
    refuses(&router, cases).await;
}

#[tokio::test]
async fn what_is_not_a_form_gets_a_415_and_an_oversized_form_a_413() {
    let router = TestRouter::new(|_| {}).await;
    let oversized = format!("hub.mode=subscribe&pad={}", "x".repeat(128 * 1024));
    let cases = vec![
        (
            "a JSON body",
            post(None, Some("application/json"), "{}"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            FORM,
        ),
        (
            "no content type",
            post(None, None, "hub.mode=publish"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            FORM,
        ),
        (
            "a form over max_form_bytes",
            post(None, Some(FORM), oversized),
            StatusCode::PAYLOAD_TOO_LARGE,
            "65536 bytes",
        ),
    ];
    refuses(&router, cases).await;
}

#[tokio::test]
async fn fat_pings_need_the_key_and_exactly_one_valid_topic() {
    let router = TestRouter::new(|_| {}).await;
    let topic = serde_urlencoded::to_string([("hub.mode", "publish"), ("hub.topic", TOPIC)])
        .unwrap_or_else(|error| panic!("{error}"));
    let two_topics = format!("{topic}&hub.topic=https%3A%2F%2Fpublisher.example%2Fother");
    let cases = vec![
        (
            "no key",
            fat_ping(&topic, None, "x"),
            StatusCode::UNAUTHORIZED,
            "missing internal API key",
        ),
        (
            "a wrong key",
            fat_ping(&topic, Some("wrong-key-wrong-key-wrong-key-wrong"), "x"),
            StatusCode::UNAUTHORIZED,
            "wrong internal API key",
        ),
        (
            "no hub.topic",
            fat_ping("hub.mode=publish", Some(INTERNAL_KEY), "x"),
            StatusCode::BAD_REQUEST,
            "hub.topic",
        ),
        (
            "two topics",
            fat_ping(&two_topics, Some(INTERNAL_KEY), "x"),
            StatusCode::BAD_REQUEST,
            "exactly one hub.topic",
        ),
        (
            "a topic that is not a URL",
            fat_ping(
                "hub.mode=publish&hub.topic=nota-url",
                Some(INTERNAL_KEY),
                "x",
            ),
            StatusCode::BAD_REQUEST,
            "hub.topic",
        ),
    ];
    refuses(&router, cases).await;
}

#[tokio::test]
async fn a_fat_ping_over_max_content_bytes_gets_a_413() {
    let router = TestRouter::new(|config| config.max_content_bytes = 16).await;
    let query = serde_urlencoded::to_string([("hub.mode", "publish"), ("hub.topic", TOPIC)])
        .unwrap_or_else(|error| panic!("{error}"));
    let cases = vec![(
        "17 bytes of content",
        fat_ping(&query, Some(INTERNAL_KEY), "x".repeat(17)),
        StatusCode::PAYLOAD_TOO_LARGE,
        "16 bytes",
    )];
    refuses(&router, cases).await;
}

#[tokio::test]
async fn without_a_configured_key_every_fat_ping_gets_a_403() {
    let router = TestRouter::new(|config| config.internal_api_key = None).await;
    let query = serde_urlencoded::to_string([("hub.mode", "publish"), ("hub.topic", TOPIC)])
        .unwrap_or_else(|error| panic!("{error}"));
    let cases = vec![(
        "the right key for another hub",
        fat_ping(&query, Some(INTERNAL_KEY), "x"),
        StatusCode::FORBIDDEN,
        "no publish-keys configured",
    )];
    refuses(&router, cases).await;
}

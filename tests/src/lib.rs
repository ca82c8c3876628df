//! What the end-to-end tests share: the recording receiver ([`receiver`]),
//! a WebSub subscriber on top of it and a publisher beside it (real axum
//! servers on 127.0.0.1), and a hub started in process on a free port.
//!
//! The subscriber is the recording receiver in WebSub's shape: callbacks at
//! `/cb/<name>` that echo every challenge and take every delivery with a 204
//! until a test scripts otherwise; the publisher serves topics, honouring
//! conditional GETs. Tests wait for what they expect with an upper bound —
//! they are woken by the request itself, never by sleeping.

pub mod receiver;

pub use receiver::{Answer, LoopbackServer, Received, RecordingReceiver, Route, serve_on_loopback};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A WebSub subscriber: a [`RecordingReceiver`] whose callbacks are
/// `/cb/<name>`. A verification is a GET to a callback, an attempt any POST
/// to one, and a delivery an attempt answered with a 2xx.
#[derive(Debug)]
pub struct TestSubscriber {
    receiver: RecordingReceiver,
}

impl TestSubscriber {
    /// Starts a subscriber on 127.0.0.1, echoing every challenge and
    /// answering every delivery 204 until told otherwise.
    pub async fn start() -> Self {
        let receiver = RecordingReceiver::start().await;
        receiver.answer(Route::method(Method::GET), Answer::echo());
        receiver.answer(Route::method(Method::POST), Answer::status(204));
        Self { receiver }
    }

    /// The receiver underneath, for what this WebSub view does not cover.
    pub fn receiver(&self) -> &RecordingReceiver {
        &self.receiver
    }

    /// The callback URL named `name`.
    pub fn callback(&self, name: &str) -> String {
        format!("http://{}{}", self.receiver.address(), path_of(name))
    }

    /// Scripts the verification answer of one callback.
    pub fn answer_verification(&self, name: &str, answer: Answer) {
        self.receiver.answer(Route::get(&path_of(name)), answer);
    }

    /// Scripts the delivery answer of one callback.
    pub fn answer_delivery(&self, name: &str, answer: Answer) {
        self.receiver.answer(Route::post(&path_of(name)), answer);
    }

    /// Scripts the next delivery answers of one callback: each in turn, then
    /// the last for ever.
    pub fn answer_deliveries_in_turn(&self, name: &str, answers: impl IntoIterator<Item = Answer>) {
        self.receiver
            .answer_in_turn(Route::post(&path_of(name)), answers);
    }

    /// Scripts the delivery answer of every callback without its own.
    pub fn answer_every_delivery(&self, answer: Answer) {
        self.receiver.answer(Route::method(Method::POST), answer);
    }

    /// Every verification received so far, in arrival order.
    pub fn verifications(&self) -> Vec<Received> {
        self.receiver
            .received_where(|received| received.method == Method::GET)
    }

    /// Every delivery received so far, to any callback, in arrival order.
    pub fn deliveries(&self) -> Vec<Received> {
        self.receiver.received_where(is_delivery)
    }

    /// Deliveries received by one callback.
    pub fn deliveries_to(&self, name: &str) -> Vec<Received> {
        let path = path_of(name);
        self.receiver
            .received_where(|received| received.path == path && is_delivery(received))
    }

    /// How many delivery attempts one callback has seen (answered or not).
    pub fn attempts(&self, name: &str) -> usize {
        let path = path_of(name);
        self.receiver
            .count_where(|received| received.method == Method::POST && received.path == path)
    }

    /// Waits until `condition` holds, for at most `limit`; woken by every
    /// request the subscriber receives. Returns whether it held.
    pub async fn wait_until(&self, limit: Duration, condition: impl Fn(&Self) -> bool) -> bool {
        self.receiver.wait_until(limit, |_| condition(self)).await
    }

    /// Waits for `count` deliveries to `name`, at most `limit`.
    pub async fn wait_for_deliveries(
        &self,
        name: &str,
        count: usize,
        limit: Duration,
    ) -> Vec<Received> {
        self.wait_until(limit, |subscriber| {
            subscriber.deliveries_to(name).len() >= count
        })
        .await;
        self.deliveries_to(name)
    }

    /// Waits for `count` verifications in all, at most `limit`.
    pub async fn wait_for_verifications(&self, count: usize, limit: Duration) -> Vec<Received> {
        self.wait_until(limit, |subscriber| {
            subscriber.verifications().len() >= count
        })
        .await;
        self.verifications()
    }
}

fn path_of(callback: &str) -> String {
    format!("/cb/{callback}")
}

fn is_delivery(received: &Received) -> bool {
    received.method == Method::POST && received.succeeded()
}

/// A topic the publisher serves.
#[derive(Debug, Clone)]
pub struct Topic {
    /// Its Content-Type.
    pub content_type: String,
    /// Its content.
    pub body: Bytes,
    /// Its ETag, if it sends one.
    pub etag: Option<String>,
}

#[derive(Debug, Default)]
struct PublisherState {
    topics: Mutex<HashMap<String, Topic>>,
    fetches: Mutex<HashMap<String, usize>>,
}

/// A publisher serving topics at `/topics/<name>`.
#[derive(Debug)]
pub struct TestPublisher {
    server: LoopbackServer,
    state: Arc<PublisherState>,
}

impl TestPublisher {
    /// Starts a publisher on 127.0.0.1.
    pub async fn start() -> Self {
        let state = Arc::new(PublisherState::default());
        let app = Router::new()
            .route("/topics/{name}", get(serve_topic))
            .with_state(state.clone());
        Self {
            server: serve_on_loopback(app).await,
            state,
        }
    }

    /// The URL of topic `name`.
    pub fn topic_url(&self, name: &str) -> String {
        format!("http://{}/topics/{name}", self.server.address)
    }

    /// Sets what topic `name` serves.
    pub fn set_topic(
        &self,
        name: &str,
        content_type: &str,
        body: impl Into<Bytes>,
        etag: Option<&str>,
    ) {
        lock(&self.state.topics).insert(
            name.to_owned(),
            Topic {
                content_type: content_type.to_owned(),
                body: body.into(),
                etag: etag.map(str::to_owned),
            },
        );
    }

    /// How many times topic `name` was fetched.
    pub fn fetches(&self, name: &str) -> usize {
        lock(&self.state.fetches).get(name).copied().unwrap_or(0)
    }
}

async fn serve_topic(
    State(state): State<Arc<PublisherState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    *lock(&state.fetches).entry(name.clone()).or_default() += 1;
    let Some(topic) = lock(&state.topics).get(&name).cloned() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    if let (Some(etag), Some(asked)) = (&topic.etag, headers.get(header::IF_NONE_MATCH))
        && asked.as_bytes() == etag.as_bytes()
    {
        return StatusCode::NOT_MODIFIED.into_response();
    }
    let mut response = (StatusCode::OK, topic.body).into_response();
    if let Ok(value) = HeaderValue::from_str(&topic.content_type) {
        response.headers_mut().insert(header::CONTENT_TYPE, value);
    }
    if let Some(etag) = topic
        .etag
        .and_then(|etag| HeaderValue::from_str(&etag).ok())
    {
        response.headers_mut().insert(header::ETAG, etag);
    }
    response
}

/// The internal API key test hubs are given (`config.internal_api_key`), and
/// that [`TestHub::fat_ping`] sends.
pub const INTERNAL_KEY: &str = "an-internal-api-key-of-at-least-32-characters";

/// A hub running in this process on a free loopback port.
#[derive(Debug)]
pub struct TestHub {
    /// The hub URL (ends with a slash).
    pub url: String,
    /// The hub's subscription store.
    pub store: std::sync::Arc<dyn websub_store::SubscriptionStore>,
    /// The hub's event log.
    pub events: std::sync::Arc<dyn websub_hub::storage::events::EventLog>,
    /// The database it keeps its event log and backlog in.
    pub database_url: String,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<Result<(), websub_hub::server::ServeError>>>,
}

/// Which database a test hub keeps its event log and subscriptions in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A fresh SQLite file.
    Sqlite,
    /// A fresh database on the test PostgreSQL server.
    Postgres,
}

/// A configuration for a test hub: loopback allowed, quick polls, a fresh
/// database of the given kind. `None` when the backend's server is missing
/// outside CI (the test skips).
pub async fn test_config(backend: Backend) -> Option<websub_hub::HubConfig> {
    let database_url = match backend {
        Backend::Sqlite => websub_storetest::scratch::sqlite_url("hub"),
        Backend::Postgres => websub_storetest::servers::fresh_postgres_url().await?,
    };
    let mut config = websub_hub::HubConfig {
        database_url,
        allow_private_network: true,
        poll_interval: Duration::from_millis(200),
        ..websub_hub::HubConfig::default()
    };
    config.delivery.timeout = Duration::from_secs(5);
    config.delivery.visibility_timeout = Duration::from_secs(30);
    config.verification.timeout = Duration::from_secs(5);
    Some(config)
}

impl TestHub {
    /// Starts a hub with `config` on a free loopback port (the listen address
    /// and public URL are set here).
    pub async fn start(config: websub_hub::HubConfig) -> Self {
        Self::start_with(config, None).await
    }

    /// Starts a hub as [`TestHub::start`] does, keeping its subscriptions in
    /// `store` (e.g. a real store wrapped to hold a save at a chosen moment).
    pub async fn start_with_store(
        config: websub_hub::HubConfig,
        store: std::sync::Arc<dyn websub_store::SubscriptionStore>,
    ) -> Self {
        Self::start_with(config, Some(store)).await
    }

    async fn start_with(
        mut config: websub_hub::HubConfig,
        store: Option<std::sync::Arc<dyn websub_store::SubscriptionStore>>,
    ) -> Self {
        websub_hub::delivery::net::install_crypto_provider();
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|error| panic!("bind a loopback port: {error}"));
        let address = listener
            .local_addr()
            .unwrap_or_else(|error| panic!("local address: {error}"));
        config.listen = address;
        config.public_url = websub_hub::config::public_url_for(address);
        let url = config.public_url.to_string();
        let database_url = config.database_url.clone();
        let hub = match store {
            None => websub_hub::server::Hub::open(config)
                .await
                .unwrap_or_else(|error| panic!("open the hub: {error}")),
            Some(store) => {
                let events = websub_hub::storage::events::connect(&config.database_url)
                    .await
                    .unwrap_or_else(|error| panic!("open the event log: {error}"));
                let backlog = websub_hub::storage::backlog::connect(&config.database_url)
                    .await
                    .unwrap_or_else(|error| panic!("open the backlog: {error}"));
                websub_hub::server::Hub::assemble(
                    config,
                    store,
                    events,
                    backlog,
                    std::sync::Arc::new(websub_hub::clock::SystemClock),
                )
                .unwrap_or_else(|error| panic!("assemble the hub: {error}"))
            }
        };
        let store = hub.store().clone();
        let events = hub.events().clone();
        let stop = CancellationToken::new();
        let task = tokio::spawn(hub.run(listener, stop.clone().cancelled_owned()));
        Self {
            url,
            store,
            events,
            database_url,
            stop,
            task: Some(task),
        }
    }

    /// POSTs a form to the hub; returns the status and the body text.
    pub async fn post_form(&self, form: &[(&str, &str)]) -> (u16, String) {
        let response = http_client()
            .post(&self.url)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(serde_urlencoded::to_string(form).unwrap_or_default())
            .send()
            .await
            .unwrap_or_else(|error| panic!("POST to the hub: {error}"));
        let status = response.status().as_u16();
        (status, response.text().await.unwrap_or_default())
    }

    /// POSTs a subscription request (`mode` is `subscribe` or
    /// `unsubscribe`) with any `extra` parameters.
    pub async fn request(
        &self,
        mode: &str,
        topic: &str,
        callback: &str,
        extra: &[(&str, &str)],
    ) -> (u16, String) {
        let mut form = vec![
            ("hub.mode", mode),
            ("hub.topic", topic),
            ("hub.callback", callback),
        ];
        form.extend_from_slice(extra);
        self.post_form(&form).await
    }

    /// Subscribes `callback` to `topic` and waits until the hub holds the
    /// subscription (the subscriber must echo the challenge).
    pub async fn subscribe(&self, topic: &str, callback: &str, extra: &[(&str, &str)]) {
        let (status, body) = self.request("subscribe", topic, callback, extra).await;
        assert_eq!(status, 202, "subscribe answered {status}: {body}");
        assert!(
            self.wait_for_subscription(topic, callback, true).await,
            "{callback} never became subscribed to {topic}"
        );
    }

    /// Waits (at most 10 s, polling the store) until the pair is held or not.
    pub async fn wait_for_subscription(&self, topic: &str, callback: &str, held: bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if self.store.get(topic, callback).await.is_ok() == held {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Sends a fat ping: `body` as the content of `topic`, with the
    /// [`INTERNAL_KEY`]. Returns the status and the body text.
    pub async fn fat_ping(
        &self,
        topic: &str,
        content_type: &str,
        body: impl Into<reqwest::Body>,
    ) -> (u16, String) {
        let query = serde_urlencoded::to_string([("hub.mode", "publish"), ("hub.topic", topic)])
            .unwrap_or_default();
        let response = http_client()
            .post(format!("{}?{query}", self.url))
            .header("content-type", content_type)
            .header("X-Internal-API-Key", INTERNAL_KEY)
            .body(body)
            .send()
            .await
            .unwrap_or_else(|error| panic!("fat ping: {error}"));
        let status = response.status().as_u16();
        (status, response.text().await.unwrap_or_default())
    }

    /// Sends a thin publish ping for `topics`.
    pub async fn publish(&self, topics: &[&str]) -> (u16, String) {
        let form: Vec<(&str, &str)> = topics.iter().map(|topic| ("hub.url", *topic)).collect();
        let mut form = form;
        form.insert(0, ("hub.mode", "publish"));
        self.post_form(&form).await
    }

    /// Stops the hub and waits for it to drain.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for TestHub {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A plain HTTP client for tests.
pub fn http_client() -> reqwest::Client {
    client_builder()
        .build()
        .unwrap_or_else(|error| panic!("build a client: {error}"))
}

/// A test client's builder: no proxy, and the system's roots loaded once
/// per process. Loading them took some 20 ms of a debug build for every
/// client, and tests build a client per request; a client itself is not
/// shared, as its pooled connections belong to the runtime that opened them
/// and each test has its own.
pub fn client_builder() -> reqwest::ClientBuilder {
    static TLS: std::sync::OnceLock<rustls::ClientConfig> = std::sync::OnceLock::new();
    let tls = TLS.get_or_init(|| {
        use rustls_platform_verifier::BuilderVerifierExt;
        websub_hub::delivery::net::install_crypto_provider();
        let mut config = rustls::ClientConfig::builder()
            .with_platform_verifier()
            .unwrap_or_else(|error| panic!("the system's roots: {error}"))
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        config
    });
    reqwest::Client::builder()
        .no_proxy()
        .tls_backend_preconfigured(tls.clone())
}

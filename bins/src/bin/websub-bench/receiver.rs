//! The in-process loopback receiver of the fan-out benchmarks: echoes
//! verification challenges, counts deliveries, serves the topic's content
//! to thin pings, and can be served over TLS (`websub-bench tls`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use tokio::sync::Notify;

use crate::Failure;
use crate::progress::Progress;

/// Loopback subscribers and the topic they subscribe to: echo challenges,
/// count deliveries, serve the topic's content to the hub's fetches.
pub(crate) struct Receiver {
    pub(crate) base: String,
    /// The topic URL, served at `/topic`: fat pings never fetch it, thin
    /// pings do.
    pub(crate) topic: String,
    deliveries: Arc<AtomicUsize>,
    arrived: Arc<Notify>,
    first_at: Arc<std::sync::Mutex<Option<Instant>>>,
    fetched_at: Arc<std::sync::Mutex<Option<Instant>>>,
}

#[derive(Clone)]
struct ReceiverState {
    deliveries: Arc<AtomicUsize>,
    arrived: Arc<Notify>,
    first_at: Arc<std::sync::Mutex<Option<Instant>>>,
    fetched_at: Arc<std::sync::Mutex<Option<Instant>>>,
}

impl Receiver {
    /// A receiver served over plain HTTP on a free loopback port.
    pub(crate) async fn start() -> Result<Self, Failure> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let (receiver, app) = Self::with_routes(format!("http://{}", listener.local_addr()?));
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(receiver)
    }

    /// A receiver whose URLs start with `base`, and the routes to serve
    /// there (`websub-bench tls` serves them over TLS).
    pub(crate) fn with_routes(base: String) -> (Self, Router) {
        let state = ReceiverState {
            deliveries: Arc::new(AtomicUsize::new(0)),
            arrived: Arc::new(Notify::new()),
            first_at: Arc::new(std::sync::Mutex::new(None)),
            fetched_at: Arc::new(std::sync::Mutex::new(None)),
        };
        let app = Router::new()
            .route("/sink", post(|| async { StatusCode::NO_CONTENT }))
            .route("/topic", get(serve_topic))
            .route("/cb/{name}", get(echo_challenge).post(count_delivery))
            .with_state(state.clone());
        let receiver = Self {
            topic: format!("{base}/topic"),
            base,
            deliveries: state.deliveries,
            arrived: state.arrived,
            first_at: state.first_at,
            fetched_at: state.fetched_at,
        };
        (receiver, app)
    }

    pub(crate) fn reset(&self) {
        self.deliveries.store(0, Ordering::Relaxed);
        *lock(&self.first_at) = None;
        *lock(&self.fetched_at) = None;
    }

    pub(crate) fn first_delivery(&self) -> Option<Instant> {
        *lock(&self.first_at)
    }

    /// When the topic was last fetched.
    pub(crate) fn fetched(&self) -> Option<Instant> {
        *lock(&self.fetched_at)
    }

    /// Waits until `count` deliveries arrived; returns when the wait ended.
    pub(crate) async fn all_delivered(
        &self,
        backend: &str,
        count: usize,
    ) -> Result<Instant, Failure> {
        let _progress = Progress::follow(backend, count, self.deliveries.clone());
        if !self.wait_for(count, Duration::from_secs(600)).await {
            return Err(format!(
                "{backend}: only {} of {count} delivered",
                self.deliveries.load(Ordering::Relaxed)
            )
            .into());
        }
        Ok(Instant::now())
    }

    async fn wait_for(&self, count: usize, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let arrived = self.arrived.notified();
            if self.deliveries.load(Ordering::Relaxed) >= count {
                return true;
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return false;
            }
        }
    }
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn serve_topic(State(state): State<ReceiverState>) -> impl axum::response::IntoResponse {
    *lock(&state.fetched_at) = Some(Instant::now());
    (
        [("content-type", "application/json")],
        r#"{"bench":"the topic's latest content"}"#,
    )
}

async fn echo_challenge(Path(_name): Path<String>, RawQuery(query): RawQuery) -> String {
    url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .find(|(key, _)| key == "hub.challenge")
        .map(|(_, value)| value.into_owned())
        .unwrap_or_default()
}

async fn count_delivery(
    State(state): State<ReceiverState>,
    Path(_name): Path<String>,
    _body: Bytes,
) -> StatusCode {
    if state.deliveries.fetch_add(1, Ordering::Relaxed) == 0 {
        *lock(&state.first_at) = Some(Instant::now());
    }
    state.arrived.notify_waiters();
    StatusCode::NO_CONTENT
}

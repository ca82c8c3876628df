//! The in-process loopback receiver `websub-bench tls` serves over plain
//! HTTP and over TLS alike, with TLS terminated in this process so that
//! the bench can count the handshakes: echoes verification challenges and
//! counts deliveries. (`websub-bench hub` receives with nginx instead; see
//! [`crate::nginx`].)

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::routing::get;
use tokio::sync::Notify;

use crate::Failure;
use crate::progress::Progress;

/// Loopback subscribers and the topic they subscribe to: echo challenges,
/// count deliveries.
pub(crate) struct Receiver {
    pub(crate) base: String,
    /// The topic URL; only fat pings are sent to it, so it is never fetched.
    pub(crate) topic: String,
    deliveries: Arc<AtomicUsize>,
    arrived: Arc<Notify>,
}

#[derive(Clone)]
struct ReceiverState {
    deliveries: Arc<AtomicUsize>,
    arrived: Arc<Notify>,
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
        };
        let app = Router::new()
            .route("/cb/{name}", get(echo_challenge).post(count_delivery))
            .with_state(state.clone());
        let receiver = Self {
            topic: format!("{base}/topic"),
            base,
            deliveries: state.deliveries,
            arrived: state.arrived,
        };
        (receiver, app)
    }

    pub(crate) fn reset(&self) {
        self.deliveries.store(0, Ordering::Relaxed);
    }

    /// Waits until `count` deliveries arrived; returns when the wait ended.
    pub(crate) async fn all_delivered(
        &self,
        label: &str,
        count: usize,
    ) -> Result<Instant, Failure> {
        let _progress = Progress::follow(label, count, self.deliveries.clone());
        if !self.wait_for(count, Duration::from_secs(600)).await {
            return Err(format!(
                "{label}: only {} of {count} delivered",
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
    state.deliveries.fetch_add(1, Ordering::Relaxed);
    state.arrived.notify_waiters();
    StatusCode::NO_CONTENT
}

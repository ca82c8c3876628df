//! A stand-in for the subscriptions service's quotas endpoint, for tests:
//! a real HTTP server on 127.0.0.1 that answers
//! `GET /internal/subscriptions/{user_id}/quotas` from quotas the test sets.
//!
//! It runs on a thread of its own with its own runtime, so one server can
//! serve a single test or a whole suite of `#[tokio::test]`s (each of which
//! has a runtime of its own that ends with the test). Handles are cheap
//! clones; dropping the last one stops the server.
//!
//! ```no_run
//! use websub_hub::intake::quota::{Quota, QuotaEnforcer, fake::FakeQuotaServer};
//!
//! let server = FakeQuotaServer::start("an-internal-key-of-at-least-32-chars");
//! server.set_default_quotas(vec![Quota::total("websub_subscriptions", 3)]);
//! server.set_quotas("supporter", vec![Quota::unlimited("websub_subscriptions")]);
//! server.set_quotas("free-tier", vec![]); // no such quota: NotAllowed
//! // anyone else gets the defaults; without defaults, 404 (ResourceNotFound)
//! let enforcer = QuotaEnforcer::new(server.config()).expect("valid config");
//! # drop(enforcer);
//! ```
//!
//! It answers 401 to a request without the right internal key, so a test
//! that passes proves the enforcer sends it.
//!
//! A suite sharing one server (e.g. in a `static OnceLock`) serialises the
//! tests that change it with [`FakeQuotaServer::exclusive`], which resets
//! the server when taken.

use std::collections::HashMap;
use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use url::Url;

use super::{DEFAULT_INTERNAL_API_KEY_HEADER, Quota, QuotaConfig, QuotasBody};

/// The timeout of [`FakeQuotaServer::config`]: short, because the server is
/// local and a test waiting on a dead one should fail fast.
pub const FAKE_TIMEOUT: Duration = Duration::from_secs(2);

/// A running fake quotas endpoint. Clones share the server.
#[derive(Debug, Clone)]
pub struct FakeQuotaServer {
    inner: Arc<FakeServerState>,
}

#[derive(Debug)]
struct FakeServerState {
    url: Url,
    key: String,
    shared: Arc<FakeShared>,
    running: Mutex<Option<Running>>,
    /// Serialises the tests of a suite that share this server.
    exclusive: Arc<tokio::sync::Mutex<()>>,
}

#[derive(Debug)]
struct Running {
    stop: oneshot::Sender<()>,
    thread: JoinHandle<()>,
}

#[derive(Debug)]
struct FakeShared {
    key: String,
    state: Mutex<FakeState>,
}

#[derive(Debug, Default)]
struct FakeState {
    defaults: Option<Vec<Quota>>,
    per_user: HashMap<String, Vec<Quota>>,
    mode: Behaviour,
    unreachable: bool,
    requests: usize,
}

#[derive(Debug, Default)]
enum Behaviour {
    #[default]
    Quotas,
    Status(StatusCode),
    Body(String),
}

impl FakeShared {
    fn state(&self) -> MutexGuard<'_, FakeState> {
        // A test that panicked while holding the lock left whole values
        // behind; the next test may still use them.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl FakeQuotaServer {
    /// Starts a server on an ephemeral loopback port that requires
    /// `internal_key` in the `X-Internal-API-Key` header. It is listening
    /// when this returns.
    ///
    /// # Panics
    /// When no loopback port can be bound or no thread started.
    pub fn start(internal_key: impl Into<String>) -> Self {
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port for the fake");
        Self::serve(listener, internal_key)
    }

    /// Starts a server on `address` (e.g. for trying a hub by hand).
    pub fn start_on(
        address: std::net::SocketAddr,
        internal_key: impl Into<String>,
    ) -> std::io::Result<Self> {
        Ok(Self::serve(
            std::net::TcpListener::bind(address)?,
            internal_key,
        ))
    }

    fn serve(listener: std::net::TcpListener, internal_key: impl Into<String>) -> Self {
        let key = internal_key.into();
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener for the fake");
        let addr = listener.local_addr().expect("the fake's bound address");
        let url = Url::parse(&format!("http://{addr}/")).expect("a loopback URL parses");
        let shared = Arc::new(FakeShared {
            key: key.clone(),
            state: Mutex::new(FakeState::default()),
        });
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("fake-quota-server".to_owned())
            .spawn({
                let shared = Arc::clone(&shared);
                move || run(listener, shared, stopped)
            })
            .expect("start the fake's thread");
        Self {
            inner: Arc::new(FakeServerState {
                url,
                key,
                shared,
                running: Mutex::new(Some(Running { stop, thread })),
                exclusive: Arc::new(tokio::sync::Mutex::new(())),
            }),
        }
    }

    /// The base URL (ends with a slash).
    pub fn url(&self) -> Url {
        self.inner.url.clone()
    }

    /// The internal key the server requires.
    pub fn internal_key(&self) -> &str {
        &self.inner.key
    }

    /// A configuration pointing at this server, with its key and a
    /// [`FAKE_TIMEOUT`].
    pub fn config(&self) -> QuotaConfig {
        QuotaConfig {
            base_url: Some(self.url()),
            timeout: FAKE_TIMEOUT,
            internal_api_key: Some(self.inner.key.clone()),
            internal_api_key_header: DEFAULT_INTERNAL_API_KEY_HEADER.to_owned(),
            ..QuotaConfig::default()
        }
    }

    /// The quotas of every user without quotas of their own.
    pub fn set_default_quotas(&self, quotas: Vec<Quota>) {
        self.inner.shared.state().defaults = Some(quotas);
    }

    /// Removes the default quotas: users without quotas of their own get a
    /// 404.
    pub fn clear_default_quotas(&self) {
        self.inner.shared.state().defaults = None;
    }

    /// The quotas of `user_id`'s tier; an empty list is a tier without any
    /// quota (so every quota type is not allowed).
    pub fn set_quotas(&self, user_id: impl Into<String>, quotas: Vec<Quota>) {
        self.inner
            .shared
            .state()
            .per_user
            .insert(user_id.into(), quotas);
    }

    /// Answers every authorised request with `status` and an empty body.
    pub fn respond_with(&self, status: StatusCode) {
        self.inner.shared.state().mode = Behaviour::Status(status);
    }

    /// Answers every authorised request with 200 and exactly `body`.
    pub fn respond_with_body(&self, body: impl Into<String>) {
        self.inner.shared.state().mode = Behaviour::Body(body.into());
    }

    /// Accepts every connection and closes it without an answer, until
    /// [`reachable`](Self::reachable) or [`reset`](Self::reset).
    pub fn respond_unreachable(&self) {
        self.inner.shared.state().unreachable = true;
    }

    /// Undoes [`respond_unreachable`](Self::respond_unreachable).
    pub fn reachable(&self) {
        self.inner.shared.state().unreachable = false;
    }

    /// How many requests reached the handler (answered ones, 401s
    /// included; connections dropped while unreachable are not requests).
    pub fn requests(&self) -> usize {
        self.inner.shared.state().requests
    }

    /// Clears the per-user quotas, every `respond_*` mode and the request
    /// count; keeps the default quotas.
    pub fn reset(&self) {
        let mut state = self.inner.shared.state();
        state.per_user.clear();
        state.mode = Behaviour::Quotas;
        state.unreachable = false;
        state.requests = 0;
    }

    /// Waits until no other holder of the guard is using the server, then
    /// [`reset`](Self::reset)s it. Tests of one suite that share a server
    /// hold this guard for their whole body, so their settings, modes and
    /// request counts never mix.
    pub async fn exclusive(&self) -> tokio::sync::OwnedMutexGuard<()> {
        let guard = Arc::clone(&self.inner.exclusive).lock_owned().await;
        self.reset();
        guard
    }

    /// Stops listening: later requests are refused (the enforcer reports
    /// the service as unavailable). Cannot be undone; idempotent.
    pub fn close(&self) {
        self.inner.close();
    }
}

impl FakeServerState {
    fn close(&self) {
        let running = self
            .running
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(Running { stop, thread }) = running {
            // The thread may already have ended; either way it is joined, so
            // the port is closed when this returns.
            let _ = stop.send(());
            let _ = thread.join();
        }
    }
}

impl Drop for FakeServerState {
    fn drop(&mut self) {
        self.close();
    }
}

/// The server thread: serves until told to stop, then drops the listener
/// and every connection with the runtime.
fn run(listener: std::net::TcpListener, shared: Arc<FakeShared>, stopped: oneshot::Receiver<()>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime for the fake");
    runtime.block_on(async move {
        let listener = TcpListener::from_std(listener).expect("register the fake's listener");
        let app = Router::new()
            .route("/internal/subscriptions/{user_id}/quotas", get(quotas))
            .fallback(not_found)
            .with_state(Arc::clone(&shared));
        let serve = axum::serve(Gate { listener, shared }, app).into_future();
        tokio::select! {
            _ = serve => {}
            _ = stopped => {}
        }
    });
}

/// The listener: hands connections to the server, or drops them unanswered
/// while the server plays unreachable.
struct Gate {
    listener: TcpListener,
    shared: Arc<FakeShared>,
}

impl axum::serve::Listener for Gate {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            match self.listener.accept().await {
                Ok((stream, addr)) => {
                    if self.shared.state().unreachable {
                        drop(stream);
                        continue;
                    }
                    return (stream, addr);
                }
                // Out of descriptors and the like: wait rather than spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

async fn quotas(
    State(shared): State<Arc<FakeShared>>,
    Path(user_id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let mut state = shared.state();
    state.requests += 1;
    if !authorised(&shared, &headers) {
        return answer(StatusCode::UNAUTHORIZED, "missing or wrong internal key");
    }
    match &state.mode {
        Behaviour::Status(status) => return answer(*status, ""),
        Behaviour::Body(body) => return json(body.clone()),
        Behaviour::Quotas => {}
    }
    let quotas = state
        .per_user
        .get(&user_id)
        .or(state.defaults.as_ref())
        .cloned();
    match quotas {
        Some(quotas) => match serde_json::to_string(&QuotasBody { quotas }) {
            Ok(body) => json(body),
            Err(error) => answer(StatusCode::INTERNAL_SERVER_ERROR, &error.to_string()),
        },
        None => answer(StatusCode::NOT_FOUND, "no such user"),
    }
}

async fn not_found(State(shared): State<Arc<FakeShared>>) -> Response {
    shared.state().requests += 1;
    answer(StatusCode::NOT_FOUND, "no such route")
}

fn authorised(shared: &FakeShared, headers: &HeaderMap) -> bool {
    headers
        .get(DEFAULT_INTERNAL_API_KEY_HEADER)
        .is_some_and(|given| given.as_bytes() == shared.key.as_bytes())
}

/// Every answer closes its connection, so a mode set between two requests
/// of one client applies to the second (no pooled connection outlives it).
fn answer(status: StatusCode, body: &str) -> Response {
    (
        status,
        [(header::CONNECTION, HeaderValue::from_static("close"))],
        body.to_owned(),
    )
        .into_response()
}

fn json(body: String) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONNECTION, HeaderValue::from_static("close")),
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
        ],
        body,
    )
        .into_response()
}

//! The recording receiver every test that needs an HTTP peer uses: a real
//! axum server on 127.0.0.1 that answers each request as the test scripts it
//! and records it whole (method, path, query, headers, raw body), and the
//! loopback serving under it.
//!
//! A test scripts answers per [`Route`] (a path, a method, both, or every
//! request), one [`Answer`] or several in turn, and waits for what it
//! expects with [`RecordingReceiver::wait_until`]: every request wakes the
//! waiter when it arrives and again when it is answered, so nothing sleeps
//! in a loop and every wait has an upper bound.
//!
//! ```
//! use std::time::Duration;
//! use websub_tests::{Answer, RecordingReceiver, Route, http_client};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let receiver = RecordingReceiver::start().await;
//! receiver.answer(Route::post("/hook"), Answer::status(503));
//! let response = http_client()
//!     .post(receiver.url("/hook?try=1"))
//!     .body("ping")
//!     .send()
//!     .await
//!     .expect("the receiver answers");
//! assert_eq!(response.status().as_u16(), 503);
//!
//! assert!(receiver.wait_for("/hook", 1, Duration::from_secs(5)).await);
//! let received = &receiver.received_at("/hook")[0];
//! assert_eq!(received.param("try"), Some("1"));
//! assert_eq!(&received.body[..], b"ping");
//! # }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use reqwest::Url;
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use websub_hub::delivery::outbox::Envelope;

/// A server on a loopback port, stopped when dropped.
#[derive(Debug)]
pub struct LoopbackServer {
    /// Where it listens.
    pub address: SocketAddr,
    stop: CancellationToken,
}

impl Drop for LoopbackServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Serves `app` on a free loopback port until the returned server is dropped.
pub async fn serve_on_loopback(app: Router) -> LoopbackServer {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|error| panic!("bind a loopback port: {error}"));
    let address = listener
        .local_addr()
        .unwrap_or_else(|error| panic!("local address: {error}"));
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(stopped.cancelled_owned())
            .await;
    });
    LoopbackServer { address, stop }
}

/// Which requests an [`Answer`] applies to. A request takes the answer of
/// the most specific route that matches: method and path, then path, then
/// method, then [`Route::any`]; with none, it gets an empty 200.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Route {
    method: Option<Method>,
    path: Option<String>,
}

impl Route {
    /// Every request.
    pub fn any() -> Self {
        Self {
            method: None,
            path: None,
        }
    }

    /// Every request to `path` (without its query string).
    pub fn path(path: &str) -> Self {
        Self {
            method: None,
            path: Some(path.to_owned()),
        }
    }

    /// Every `method` request, to any path.
    pub fn method(method: Method) -> Self {
        Self {
            method: Some(method),
            path: None,
        }
    }

    /// GETs to `path`: verifications of intent, topic fetches.
    pub fn get(path: &str) -> Self {
        Self {
            method: Some(Method::GET),
            path: Some(path.to_owned()),
        }
    }

    /// POSTs to `path`: deliveries.
    pub fn post(path: &str) -> Self {
        Self {
            method: Some(Method::POST),
            path: Some(path.to_owned()),
        }
    }
}

impl From<&str> for Route {
    fn from(path: &str) -> Self {
        Self::path(path)
    }
}

/// What the receiver answers: a status, a body (fixed, or made from the
/// `hub.challenge` of the query string), headers, and when.
#[derive(Clone)]
pub struct Answer {
    status: StatusCode,
    body: Body,
    headers: Vec<(HeaderName, HeaderValue)>,
    wait: Wait,
}

#[derive(Clone)]
enum Body {
    Fixed(Bytes),
    FromChallenge(Arc<dyn Fn(&str) -> String + Send + Sync>),
}

#[derive(Debug, Clone)]
enum Wait {
    No,
    For(Duration),
    /// Until a permit is free; held while answering.
    Permit(Arc<Semaphore>),
    Forever,
}

impl Answer {
    /// This status with an empty body.
    pub fn status(status: u16) -> Self {
        Self {
            status: status_code(status),
            body: Body::Fixed(Bytes::new()),
            headers: Vec::new(),
            wait: Wait::No,
        }
    }

    /// 200 with the request's `hub.challenge` as the body: a subscriber
    /// confirming its intent.
    pub fn echo() -> Self {
        Self::challenge_with(str::to_owned)
    }

    /// 200 with `body(challenge)` as the body, for subscribers that get the
    /// challenge wrong in a particular way.
    pub fn challenge_with(body: impl Fn(&str) -> String + Send + Sync + 'static) -> Self {
        Self {
            body: Body::FromChallenge(Arc::new(body)),
            ..Self::status(200)
        }
    }

    /// Never answers: the request stays open until the client gives up.
    pub fn never() -> Self {
        Self {
            wait: Wait::Forever,
            ..Self::status(200)
        }
    }

    /// The same answer with another status.
    pub fn with_status(self, status: u16) -> Self {
        Self {
            status: status_code(status),
            ..self
        }
    }

    /// The same answer with this body.
    pub fn with_body(self, body: impl Into<Bytes>) -> Self {
        Self {
            body: Body::Fixed(body.into()),
            ..self
        }
    }

    /// The same answer with one more header.
    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        let name = HeaderName::try_from(name)
            .unwrap_or_else(|error| panic!("header name {name:?}: {error}"));
        let value = HeaderValue::try_from(value)
            .unwrap_or_else(|error| panic!("header value {value:?}: {error}"));
        self.headers.push((name, value));
        self
    }

    /// The same answer, given `delay` after the request arrives.
    pub fn after(self, delay: Duration) -> Self {
        Self {
            wait: Wait::For(delay),
            ..self
        }
    }

    /// The same answer, given once a permit of `gate` is free (the test adds
    /// permits to let requests through); the permit is held while answering.
    pub fn gated(self, gate: Arc<Semaphore>) -> Self {
        Self {
            wait: Wait::Permit(gate),
            ..self
        }
    }

    async fn respond(&self, challenge: &str) -> Response {
        let _permit = match &self.wait {
            Wait::No => None,
            Wait::For(delay) => {
                tokio::time::sleep(*delay).await;
                None
            }
            Wait::Permit(gate) => gate.acquire().await.ok(),
            Wait::Forever => std::future::pending().await,
        };
        let body = match &self.body {
            Body::Fixed(bytes) => bytes.clone(),
            Body::FromChallenge(body) => Bytes::from(body(challenge)),
        };
        let mut response = (self.status, body).into_response();
        for (name, value) in &self.headers {
            response.headers_mut().append(name.clone(), value.clone());
        }
        response
    }
}

impl fmt::Debug for Answer {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let body = match &self.body {
            Body::Fixed(bytes) => format!("{} bytes", bytes.len()),
            Body::FromChallenge(_) => "made from the challenge".to_owned(),
        };
        formatter
            .debug_struct("Answer")
            .field("status", &self.status)
            .field("body", &body)
            .field("headers", &self.headers)
            .field("wait", &self.wait)
            .finish()
    }
}

fn status_code(status: u16) -> StatusCode {
    StatusCode::from_u16(status).unwrap_or_else(|error| panic!("status {status}: {error}"))
}

/// One request the receiver got, recorded as it arrived.
#[derive(Debug, Clone)]
pub struct Received {
    /// Its method.
    pub method: Method,
    /// Its path, without the query string.
    pub path: String,
    /// The raw query string, if there was one.
    pub raw_query: Option<String>,
    /// The query string decoded, every pair in order.
    pub params: Vec<(String, String)>,
    /// Every header.
    pub headers: HeaderMap,
    /// The body, byte for byte.
    pub body: Bytes,
    /// When it arrived.
    pub at: Instant,
    /// The status it was answered with; `None` while it is being answered,
    /// or when the client gave up first.
    pub status: Option<u16>,
    /// Its place in the receiver's order of arrivals and endings.
    arrived: u64,
    /// When it stopped being answered, answered or not, in that same order.
    ended: Option<u64>,
}

impl Received {
    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }

    /// The first value of a query parameter.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    /// The raw query string, empty when there was none.
    pub fn query(&self) -> &str {
        self.raw_query.as_deref().unwrap_or_default()
    }

    /// Whether it was answered with a 2xx.
    pub fn succeeded(&self) -> bool {
        self.status
            .is_some_and(|status| (200..300).contains(&status))
    }

    /// The body as an outbox envelope; panics when it is not one.
    pub fn envelope(&self) -> Envelope {
        serde_json::from_slice(&self.body).unwrap_or_else(|error| {
            panic!(
                "the body of a request to {} is not an envelope: {error}",
                self.path
            )
        })
    }

    /// The event id of the envelope in the body.
    pub fn event_id(&self) -> Uuid {
        self.envelope().event_id
    }
}

/// One route's answers: each in turn, then the last for ever.
#[derive(Debug)]
struct Script {
    answers: Vec<Answer>,
    given: usize,
}

#[derive(Debug, Default)]
struct Shared {
    scripts: Mutex<HashMap<Route, Script>>,
    log: Mutex<Log>,
    changed: Notify,
}

#[derive(Debug, Default)]
struct Log {
    received: Vec<Received>,
    /// Numbers arrivals and endings in one sequence, so overlaps are exact
    /// however close in time two requests are.
    clock: u64,
}

impl Shared {
    fn next_answer(&self, method: &Method, path: &str) -> Answer {
        let mut scripts = lock(&self.scripts);
        let routes = [
            Route {
                method: Some(method.clone()),
                path: Some(path.to_owned()),
            },
            Route::path(path),
            Route::method(method.clone()),
            Route::any(),
        ];
        let Some(script) = routes
            .into_iter()
            .find(|route| scripts.contains_key(route))
            .and_then(|route| scripts.get_mut(&route))
        else {
            return Answer::status(200);
        };
        let index = script.given.min(script.answers.len().saturating_sub(1));
        script.given += 1;
        script
            .answers
            .get(index)
            .cloned()
            .unwrap_or_else(|| Answer::status(200))
    }

    fn record(&self, mut received: Received) -> usize {
        let index = {
            let mut log = lock(&self.log);
            log.clock += 1;
            received.arrived = log.clock;
            log.received.push(received);
            log.received.len() - 1
        };
        self.changed.notify_waiters();
        index
    }

    fn end(&self, index: usize, status: Option<u16>) {
        {
            let mut log = lock(&self.log);
            log.clock += 1;
            let clock = log.clock;
            if let Some(received) = log.received.get_mut(index) {
                received.status = status;
                received.ended = Some(clock);
            }
        }
        self.changed.notify_waiters();
    }
}

/// Ends a request's record when its handler finishes or is dropped (the
/// client went away mid-answer), so an abandoned request does not count as
/// in flight for ever.
struct Ending {
    shared: Arc<Shared>,
    index: usize,
    status: Option<u16>,
}

impl Drop for Ending {
    fn drop(&mut self) {
        self.shared.end(self.index, self.status);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The recording receiver: one server on a loopback port, any paths.
/// Answers an empty 200 until told otherwise; stopped when dropped.
#[derive(Debug)]
pub struct RecordingReceiver {
    server: LoopbackServer,
    shared: Arc<Shared>,
}

impl RecordingReceiver {
    /// Starts a receiver on a free loopback port.
    pub async fn start() -> Self {
        let shared = Arc::new(Shared::default());
        // Bodies are recorded whole, whatever their size.
        let app = Router::new()
            .fallback(receive)
            .layer(DefaultBodyLimit::disable())
            .with_state(shared.clone());
        Self {
            server: serve_on_loopback(app).await,
            shared,
        }
    }

    /// Where it listens.
    pub fn address(&self) -> SocketAddr {
        self.server.address
    }

    /// The URL of `path_and_query` on this receiver.
    pub fn url(&self, path_and_query: &str) -> Url {
        let url = format!("http://{}{path_and_query}", self.server.address);
        Url::parse(&url).unwrap_or_else(|error| panic!("receiver URL {url}: {error}"))
    }

    /// Answers every request `route` matches with `answer`, from now on.
    pub fn answer(&self, route: impl Into<Route>, answer: Answer) {
        self.answer_in_turn(route, [answer]);
    }

    /// Answers the requests `route` matches from now on with each of
    /// `answers` in turn, then with the last for ever.
    pub fn answer_in_turn(
        &self,
        route: impl Into<Route>,
        answers: impl IntoIterator<Item = Answer>,
    ) {
        let answers: Vec<Answer> = answers.into_iter().collect();
        assert!(!answers.is_empty(), "a route needs at least one answer");
        lock(&self.shared.scripts).insert(route.into(), Script { answers, given: 0 });
    }

    /// Every request received so far, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        lock(&self.shared.log).received.clone()
    }

    /// The requests received so far that `keep` keeps, in arrival order.
    pub fn received_where(&self, keep: impl Fn(&Received) -> bool) -> Vec<Received> {
        lock(&self.shared.log)
            .received
            .iter()
            .filter(|received| keep(received))
            .cloned()
            .collect()
    }

    /// How many requests received so far `keep` keeps.
    pub fn count_where(&self, keep: impl Fn(&Received) -> bool) -> usize {
        lock(&self.shared.log)
            .received
            .iter()
            .filter(|received| keep(received))
            .count()
    }

    /// The requests to `path`, any method, in arrival order.
    pub fn received_at(&self, path: &str) -> Vec<Received> {
        self.received_where(|received| received.path == path)
    }

    /// The event ids of the envelopes received at `path`, in arrival order.
    pub fn event_ids(&self, path: &str) -> Vec<Uuid> {
        self.received_at(path)
            .iter()
            .map(Received::event_id)
            .collect()
    }

    /// How many requests arrived while another one to the same path with the
    /// same value of `header` (an event id) was still being answered.
    /// Requests without the header are not counted.
    pub fn overlaps(&self, header: &str) -> usize {
        let log = lock(&self.shared.log);
        // Per (path, value): the latest ending among the earlier arrivals.
        let mut busy_until: HashMap<(&str, &str), u64> = HashMap::new();
        let mut overlaps = 0;
        for received in &log.received {
            let Some(value) = received.header(header) else {
                continue;
            };
            let ended = received.ended.unwrap_or(u64::MAX);
            let until = busy_until
                .entry((received.path.as_str(), value))
                .or_insert(0);
            if *until > received.arrived {
                overlaps += 1;
            }
            *until = (*until).max(ended);
        }
        overlaps
    }

    /// The most requests `keep` keeps that were being answered at once.
    pub fn most_at_once_where(&self, keep: impl Fn(&Received) -> bool) -> usize {
        let log = lock(&self.shared.log);
        // Arrivals and endings share one order: +1 at an arrival, -1 at an
        // ending; a request never ended stays open.
        let mut steps: Vec<(u64, i64)> = Vec::new();
        for received in log.received.iter().filter(|received| keep(received)) {
            steps.push((received.arrived, 1));
            if let Some(ended) = received.ended {
                steps.push((ended, -1));
            }
        }
        steps.sort_unstable();
        let mut at_once = 0i64;
        let mut most = 0i64;
        for (_, step) in steps {
            at_once += step;
            most = most.max(at_once);
        }
        usize::try_from(most).unwrap_or(0)
    }

    /// Waits until `condition` holds, for at most `limit`; it is checked now,
    /// and again whenever a request arrives or is answered. Returns whether
    /// it held.
    pub async fn wait_until(&self, limit: Duration, condition: impl Fn(&Self) -> bool) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            // Taken before the check: a request that lands between the check
            // and the wait still wakes it.
            let changed = self.shared.changed.notified();
            if condition(self) {
                return true;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return condition(self);
            }
        }
    }

    /// Waits until `path` has received at least `count` requests.
    pub async fn wait_for(&self, path: &str, count: usize, limit: Duration) -> bool {
        self.wait_until(limit, |receiver| {
            receiver.count_where(|received| received.path == path) >= count
        })
        .await
    }

    /// Waits until anything at all has been received.
    pub async fn wait_for_any(&self, limit: Duration) -> bool {
        self.wait_until(limit, |receiver| receiver.count_where(|_| true) > 0)
            .await
    }
}

async fn receive(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let at = Instant::now();
    let path = uri.path().to_owned();
    let raw_query = uri.query().map(str::to_owned);
    let params: Vec<(String, String)> = raw_query
        .as_deref()
        .map(|query| serde_urlencoded::from_str(query).unwrap_or_default())
        .unwrap_or_default();
    let challenge = params
        .iter()
        .find(|(key, _)| key == "hub.challenge")
        .map(|(_, value)| value.clone())
        .unwrap_or_default();
    let answer = shared.next_answer(&method, &path);
    let index = shared.record(Received {
        method,
        path,
        raw_query,
        params,
        headers,
        body,
        at,
        status: None,
        arrived: 0,
        ended: None,
    });
    let mut ending = Ending {
        shared,
        index,
        status: None,
    };
    let response = answer.respond(&challenge).await;
    ending.status = Some(response.status().as_u16());
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_secs(5);

    async fn send(receiver: &RecordingReceiver, method: Method, path: &str, id: &str) -> u16 {
        crate::http_client()
            .request(method, receiver.url(path))
            .header("x-id", id)
            .send()
            .await
            .unwrap_or_else(|error| panic!("send to the receiver: {error}"))
            .status()
            .as_u16()
    }

    #[tokio::test]
    async fn the_most_specific_route_answers_and_scripts_go_in_turn() {
        let receiver = RecordingReceiver::start().await;
        assert_eq!(send(&receiver, Method::GET, "/x", "").await, 200);
        receiver.answer(Route::any(), Answer::status(500));
        receiver.answer(Route::method(Method::POST), Answer::status(201));
        receiver.answer("/a", Answer::status(202));
        receiver.answer_in_turn(Route::post("/a"), [203, 204].map(Answer::status));
        let mut statuses = Vec::new();
        for (method, path) in [
            (Method::GET, "/x"),
            (Method::POST, "/x"),
            (Method::GET, "/a"),
            (Method::POST, "/a"),
            (Method::POST, "/a"),
            (Method::POST, "/a"),
        ] {
            statuses.push(send(&receiver, method, path, "").await);
        }
        assert_eq!(statuses, [500, 201, 202, 203, 204, 204]);
        assert!(
            receiver
                .wait_until(WAIT, |receiver| receiver
                    .count_where(|r| r.status.is_some())
                    == 7)
                .await
        );
        let recorded: Vec<Option<u16>> = receiver.received().iter().map(|r| r.status).collect();
        assert_eq!(
            recorded,
            [200, 500, 201, 202, 203, 204, 204].map(Some).to_vec()
        );
    }

    #[tokio::test]
    async fn echo_answers_the_challenge_and_the_query_is_recorded_whole() {
        let receiver = RecordingReceiver::start().await;
        receiver.answer(Route::get("/cb"), Answer::echo().with_status(202));
        let response = crate::http_client()
            .get(receiver.url("/cb?own=1&hub.challenge=abc%20d"))
            .send()
            .await
            .unwrap_or_else(|error| panic!("{error}"));
        assert_eq!(response.status().as_u16(), 202);
        assert_eq!(response.text().await.unwrap_or_default(), "abc d");
        let received = &receiver.received()[0];
        assert_eq!(received.method, Method::GET);
        assert_eq!(received.query(), "own=1&hub.challenge=abc%20d");
        assert_eq!(received.param("hub.challenge"), Some("abc d"));
    }

    #[tokio::test]
    async fn overlaps_count_requests_for_an_event_already_in_flight_on_its_path() {
        let receiver = Arc::new(RecordingReceiver::start().await);
        let gate = Arc::new(Semaphore::new(0));
        receiver.answer(Route::any(), Answer::status(204).gated(gate.clone()));
        let requests = [("/a", "1"), ("/a", "1"), ("/a", "2"), ("/b", "1")].map(|(path, id)| {
            let receiver = receiver.clone();
            tokio::spawn(async move { send(&receiver, Method::POST, path, id).await })
        });
        assert!(receiver.wait_for_any(WAIT).await);
        assert!(
            receiver
                .wait_until(WAIT, |receiver| receiver.count_where(|_| true) == 4)
                .await
        );
        assert_eq!(receiver.overlaps("x-id"), 1);
        gate.add_permits(4);
        for request in requests {
            assert_eq!(request.await.unwrap_or_else(|error| panic!("{error}")), 204);
        }
        // Sent after the others were answered: not an overlap.
        assert_eq!(send(&receiver, Method::POST, "/a", "1").await, 204);
        assert_eq!(receiver.overlaps("x-id"), 1);
    }

    #[tokio::test]
    async fn a_wait_for_what_never_comes_ends_at_its_limit() {
        let receiver = RecordingReceiver::start().await;
        let started = Instant::now();
        assert!(
            !receiver
                .wait_for("/never", 1, Duration::from_millis(50))
                .await
        );
        assert!(started.elapsed() >= Duration::from_millis(50));
    }
}

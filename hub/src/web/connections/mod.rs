//! Serving HTTP on the hub's listener: the accept loop, the bound on open
//! connections, the clocks that close slow and idle clients, the answer a
//! client gets past the bound, and closing connections at shutdown.
//!
//! What an operator can count on:
//!
//! - **A request head has [`Limits::header_read_timeout`]** (`10s` by
//!   default), counted from the connection's accept, or from the first byte
//!   of a later request on a kept-alive connection. A client that trickles
//!   its head, or connects and says nothing, is closed then; so is one
//!   that leaves the hub waiting as long for more of a request body. A
//!   head is at most [`MAX_HEAD_BYTES`] (request line and headers); a
//!   larger one is answered `431 Request Header Fields Too Large`.
//! - **A kept-alive connection may wait [`Limits::idle_timeout`]** (`75s`
//!   by default) for its next request, counted from the end of the last
//!   answer (its last byte written). The default outlasts the 60 s idle
//!   timeout common to load balancers and reverse proxies, so a proxy that
//!   pools connections to the hub is the side that closes an idle one, and
//!   its next request never races the hub's close. A long idle wait
//!   crowds nobody out: at the bound, the connection that has waited
//!   longest makes room (next point).
//! - **At most [`Limits::max_connections`] are open** (`512` by default:
//!   under a 1 024 file-descriptor limit, that leaves room for the 256
//!   deliveries and 64 verifications in flight by default, the database
//!   pools and the refusals below). When one more arrives, the connection
//!   that has waited longest for its client (idle, still sending its head,
//!   or stalled in the middle of a body) is closed to make room: clients
//!   that send nothing, or next to nothing, cannot keep out one that has
//!   something to ask, `/healthz` included. Only when the hub is working
//!   on a request on every open connection is the new one refused: it is
//!   read (at most for [`REFUSAL_DEADLINE`]) and answered
//!   `503 Service Unavailable` with `Retry-After: 1` and `Connection:
//!   close`, except `GET /healthz`, which is answered as usual since the
//!   process is alive, only busy. At most [`REFUSAL_SLOTS`] such refusals
//!   are in progress at once; past that, the 503 is written without reading
//!   the request and the connection closed at once.
//! - Every refusal and every connection closed for the hub's own reasons
//!   is counted: `websub_http_connections_open`,
//!   `websub_http_connections_closed_total{reason}` (`header_timeout`,
//!   `body_timeout`, `idle_timeout`, `evicted`) and
//!   `websub_http_connections_refused_total`.
//! - **At shutdown** the listener is closed (new connections are refused by
//!   the system), connections without a request in flight are closed at
//!   once, and those with one finish it and close (a body still arriving
//!   keeps its clock); whatever is still open after the grace period is
//!   cut.
//!
//! A connection closed while its body is awaited loses nothing: every
//! handler reads the whole body before it acts.
//!
//! hyper's own head timer is set too, but longer than these clocks: it
//! starts when a kept-alive connection begins to wait, so it would count
//! the idle wait against the next head, and the two timeouts could not
//! differ. It is only a backstop.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, Request, StatusCode, header};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;
use tracing::{debug, warn};

use crate::config::HubConfig;

/// The largest request head (request line and headers) read, in bytes.
/// hyper's own bound is about 400 KiB, which a few hundred slow clients
/// could make the hub hold for each of them.
pub(crate) const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Refusals being read and answered at once, past the connection bound.
pub(crate) const REFUSAL_SLOTS: usize = 64;

/// The time a refused connection has to send its request and read the 503.
pub(crate) const REFUSAL_DEADLINE: Duration = Duration::from_secs(2);

/// The wait after an accept fails for lack of resources (file descriptors,
/// memory) before trying again: they come back only as connections close.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// `websub_http_connections_open`.
pub(crate) const OPEN_METRIC: &str = "websub_http_connections_open";
/// `websub_http_connections_closed_total{reason}`.
pub(crate) const CLOSED_METRIC: &str = "websub_http_connections_closed_total";
/// `websub_http_connections_refused_total`.
pub(crate) const REFUSED_METRIC: &str = "websub_http_connections_refused_total";

const BUSY_REASON: &str = "the hub is at its connection limit; retry shortly\n";

/// The 503 written, without reading the request, when even the refusals
/// are at their bound.
const CANNED_REFUSAL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
Retry-After: 1\r\n\
Connection: close\r\n\
Content-Type: text/plain; charset=utf-8\r\n\
Content-Length: 50\r\n\
\r\n\
the hub is at its connection limit; retry shortly\n";

/// The bounds of serving (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// The time a request head has to arrive.
    pub(crate) header_read_timeout: Duration,
    /// The time a kept-alive connection may wait for its next request.
    pub(crate) idle_timeout: Duration,
    /// Open connections at most.
    pub(crate) max_connections: usize,
}

impl From<&HubConfig> for Limits {
    fn from(config: &HubConfig) -> Self {
        Self {
            header_read_timeout: config.header_read_timeout,
            idle_timeout: config.idle_timeout,
            max_connections: config.max_connections,
        }
    }
}

/// Serves `router` on `listener` until `stop` is cancelled; then closes the
/// listener, lets requests in flight finish for at most `grace`, and
/// returns once every connection is closed.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    stop: CancellationToken,
    grace: Duration,
) {
    let slots = Arc::new(Slots::new(limits.max_connections));
    let refusals = Arc::new(Semaphore::new(REFUSAL_SLOTS));
    let connections = TaskTracker::new();
    let cut = CancellationToken::new();
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(
            limits
                .header_read_timeout
                .saturating_add(limits.idle_timeout),
        )
        .max_header_size(MAX_HEAD_BYTES)
        .keep_alive(true);
    loop {
        let stream = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    if !is_connection_error(&error) {
                        warn!(%error, "accepting a connection failed");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                    continue;
                }
            },
        };
        // Answers are small; waiting to fill a segment only delays them.
        let _ = stream.set_nodelay(true);
        match slots.admit() {
            Some(slot) => {
                connections.spawn(serve_connection(
                    builder.clone(),
                    stream,
                    router.clone(),
                    slot,
                    limits,
                    stop.clone(),
                    cut.clone(),
                ));
            }
            None => refuse(stream, &refusals, &router, &connections),
        }
    }
    drop(listener);
    connections.close();
    if tokio::time::timeout(grace, connections.wait())
        .await
        .is_err()
    {
        warn!(
            open = connections.len(),
            "requests still in flight after {grace:?}; their connections are cut"
        );
        cut.cancel();
        connections.wait().await;
    }
}

/// Errors of one connection that died in the backlog: nothing to wait for.
fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Serves one admitted connection, closing it when its clock runs out, when
/// it is evicted, or at shutdown.
async fn serve_connection(
    builder: http1::Builder,
    stream: TcpStream,
    router: Router,
    slot: Slot,
    limits: Limits,
    stop: CancellationToken,
    cut: CancellationToken,
) {
    let activity = slot.activity.clone();
    let io = TokioIo::new(Watched {
        inner: stream,
        activity: activity.clone(),
    });
    let service = Tracked {
        inner: TowerToHyperService::new(router),
        activity: activity.clone(),
    };
    let mut conn = pin!(builder.serve_connection(io, service));
    let mut stopping = false;
    loop {
        if activity.is_closed() {
            return;
        }
        let deadline = activity.deadline(&limits);
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(error) = result {
                    debug!(%error, "connection ended");
                }
                return;
            }
            () = sleep_until(deadline) => {
                if let Some(reason) = activity.expire(&limits) {
                    debug!(reason, "connection closed");
                    metrics::counter!(CLOSED_METRIC, "reason" => reason).increment(1);
                    return;
                }
            }
            () = activity.changed.notified() => {}
            () = stop.cancelled(), if !stopping => {
                stopping = true;
                // A request in flight (its body still arriving, too)
                // finishes and its connection then closes; one without is
                // closed now.
                conn.as_mut().graceful_shutdown();
                if activity.close(false) {
                    return;
                }
            }
            () = cut.cancelled() => return,
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Answers a connection past the bound (see the module docs).
fn refuse(
    stream: TcpStream,
    refusals: &Arc<Semaphore>,
    router: &Router,
    connections: &TaskTracker,
) {
    metrics::counter!(REFUSED_METRIC).increment(1);
    let Ok(permit) = refusals.clone().try_acquire_owned() else {
        // Nothing is awaited here: a send buffer this fresh takes the whole
        // answer, and if it does not, the client only misses the reason.
        let _ = stream.try_write(CANNED_REFUSAL);
        return;
    };
    let router = router.clone();
    connections.spawn(async move {
        let _permit = permit;
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let router = router.clone();
            async move {
                if request.uri().path() == "/healthz" {
                    router.oneshot(request).await
                } else {
                    Ok::<_, Infallible>(busy())
                }
            }
        });
        let mut builder = http1::Builder::new();
        // The deadline below bounds the whole exchange.
        builder
            .keep_alive(false)
            .header_read_timeout(None)
            .max_header_size(MAX_HEAD_BYTES);
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        let _ = tokio::time::timeout(REFUSAL_DEADLINE, conn).await;
    });
}

/// The answer past the bound.
fn busy() -> Response {
    let mut response = (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        BUSY_REASON,
    )
        .into_response();
    let headers = response.headers_mut();
    headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// The open connections, for the bound and for choosing whom to evict.
#[derive(Debug)]
struct Slots {
    max: usize,
    epoch: Instant,
    next_id: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Activity>>>,
}

/// An admitted connection's place; leaving it frees the place.
#[derive(Debug)]
struct Slot {
    id: u64,
    activity: Arc<Activity>,
    slots: Arc<Slots>,
}

impl Slots {
    fn new(max: usize) -> Self {
        Self {
            max,
            epoch: Instant::now(),
            next_id: AtomicU64::new(0),
            open: Mutex::new(HashMap::new()),
        }
    }

    /// A place for a new connection, evicting the one that has waited
    /// longest without a request in flight if the bound is reached; `None`
    /// when every open connection has a request in flight.
    fn admit(self: &Arc<Self>) -> Option<Slot> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if open.len() >= self.max {
            // Closed ones are on their way out already.
            open.retain(|_, activity| !activity.is_closed());
        }
        while open.len() >= self.max {
            let (_, victim) = open
                .iter()
                .filter_map(|(id, activity)| Some((activity.waiting_since()?, *id)))
                .min()?;
            // A victim that took a request since the scan is passed over.
            if let Some(activity) = open.get(&victim)
                && activity.close(true)
            {
                open.remove(&victim);
                metrics::counter!(CLOSED_METRIC, "reason" => "evicted").increment(1);
                debug!("connection evicted at the connection limit");
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let activity = Arc::new(Activity::new(self.epoch));
        open.insert(id, activity.clone());
        metrics::gauge!(OPEN_METRIC).set(open.len() as f64);
        Some(Slot {
            id,
            activity,
            slots: self.clone(),
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self
            .slots
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        open.remove(&self.id);
        metrics::gauge!(OPEN_METRIC).set(open.len() as f64);
    }
}

/// Waiting for (or reading) a request head.
const HEAD: u8 = 0;
/// A request in flight, the hub working on it.
const BUSY: u8 = 1;
/// Answered, or answering; waiting for the next request.
const IDLE: u8 = 2;
/// A request in flight, the hub waiting for more of its body.
const BODY: u8 = 3;
/// Closed by the hub; the connection's task drops it.
const CLOSED: u8 = 4;

/// What one connection is doing, shared by its reader, its service and its
/// task. Times are milliseconds since the slots' epoch.
#[derive(Debug)]
struct Activity {
    epoch: Instant,
    phase: AtomicU8,
    /// When the phase began.
    since: AtomicU64,
    /// When bytes were last written: an answer still being sent is not idle.
    wrote: AtomicU64,
    /// Wakes the connection's task when its deadline may have moved or the
    /// connection was closed.
    changed: Notify,
}

impl Activity {
    fn new(epoch: Instant) -> Self {
        let now = millis_since(epoch);
        Self {
            epoch,
            phase: AtomicU8::new(HEAD),
            since: AtomicU64::new(now),
            wrote: AtomicU64::new(now),
            changed: Notify::new(),
        }
    }

    fn now(&self) -> u64 {
        millis_since(self.epoch)
    }

    fn at(&self, millis: u64) -> Instant {
        self.epoch + Duration::from_millis(millis)
    }

    /// When the connection's clock runs out; `None` with a request in
    /// flight, or once closed.
    fn deadline(&self, limits: &Limits) -> Option<Instant> {
        // The time is read after the phase and written before it, so a
        // phase is never paired with an older start than its own.
        let phase = self.phase.load(Ordering::SeqCst);
        let since = self.since.load(Ordering::SeqCst);
        match phase {
            HEAD | BODY => Some(self.at(since) + limits.header_read_timeout),
            IDLE => {
                let since = since.max(self.wrote.load(Ordering::SeqCst));
                Some(self.at(since) + limits.idle_timeout)
            }
            _ => None,
        }
    }

    /// Closes the connection if its clock has run out, naming why.
    fn expire(&self, limits: &Limits) -> Option<&'static str> {
        loop {
            let phase = self.phase.load(Ordering::SeqCst);
            let reason = match phase {
                HEAD => "header_timeout",
                BODY => "body_timeout",
                IDLE => "idle_timeout",
                _ => return None,
            };
            if self.deadline(limits)? > Instant::now() {
                return None;
            }
            if self
                .phase
                .compare_exchange(phase, CLOSED, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                return Some(reason);
            }
        }
    }

    /// Since when the connection has been waiting without a request in
    /// flight; `None` with one, or once closed.
    fn waiting_since(&self) -> Option<u64> {
        match self.phase.load(Ordering::SeqCst) {
            HEAD | BODY => Some(self.since.load(Ordering::SeqCst)),
            IDLE => Some(
                self.since
                    .load(Ordering::SeqCst)
                    .max(self.wrote.load(Ordering::SeqCst)),
            ),
            _ => None,
        }
    }

    /// Closes the connection if it is waiting for its client: for a
    /// request head, for the next request, or (`with_body`) for more of a
    /// request body. Whether it is closed now.
    fn close(&self, with_body: bool) -> bool {
        let closed = self
            .phase
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |phase| {
                let waiting = phase == HEAD || phase == IDLE || (with_body && phase == BODY);
                waiting.then_some(CLOSED)
            })
            .is_ok();
        if closed {
            self.changed.notify_one();
        }
        closed
    }

    fn is_closed(&self) -> bool {
        self.phase.load(Ordering::SeqCst) == CLOSED
    }

    /// A request head is complete; `false` if the connection was closed
    /// first.
    fn begin_request(&self) -> bool {
        self.phase
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |phase| {
                (phase != CLOSED).then_some(BUSY)
            })
            .is_ok()
    }

    /// The request's answer is ready; the idle clock starts.
    fn end_request(&self) {
        self.since.store(self.now(), Ordering::SeqCst);
        let ended = self
            .phase
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |phase| {
                (phase == BUSY || phase == BODY).then_some(IDLE)
            })
            .is_ok();
        if ended {
            self.changed.notify_one();
        }
    }

    /// The handler waits for more of the request body: the body's clock
    /// starts, unless it is already running.
    fn awaiting_body(&self) {
        if self.phase.load(Ordering::SeqCst) == BUSY {
            self.since.store(self.now(), Ordering::SeqCst);
            if self
                .phase
                .compare_exchange(BUSY, BODY, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                self.changed.notify_one();
            }
        }
    }

    /// More of the body arrived: the hub is working again.
    fn body_arrived(&self) {
        let _ = self
            .phase
            .compare_exchange(BODY, BUSY, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Bytes arrived: on an idle connection, they start the next head's
    /// clock.
    fn on_read(&self) {
        if self.phase.load(Ordering::SeqCst) == IDLE {
            self.since.store(self.now(), Ordering::SeqCst);
            if self
                .phase
                .compare_exchange(IDLE, HEAD, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                self.changed.notify_one();
            }
        }
    }

    fn on_write(&self) {
        self.wrote.store(self.now(), Ordering::SeqCst);
    }
}

fn millis_since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The router, telling the connection's [`Activity`] when a request is in
/// flight.
struct Tracked {
    inner: TowerToHyperService<Router>,
    activity: Arc<Activity>,
}

type Answer = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for Tracked {
    type Response = Response;
    type Error = Infallible;
    type Future = Answer;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        if !self.activity.begin_request() {
            // Closed as the head completed; the answer is never sent.
            return Box::pin(std::future::ready(Ok(busy())));
        }
        let activity = self.activity.clone();
        let answer = self.inner.call(request.map(|body| WatchedBody {
            inner: body,
            activity: activity.clone(),
        }));
        Box::pin(async move {
            let response = answer.await;
            activity.end_request();
            response
        })
    }
}

/// A request body, telling the connection's [`Activity`] when the handler
/// waits for it.
struct WatchedBody {
    inner: Incoming,
    activity: Arc<Activity>,
}

impl Body for WatchedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_frame(cx);
        if poll.is_pending() {
            this.activity.awaiting_body();
        } else {
            this.activity.body_arrived();
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The connection's socket, telling its [`Activity`] when bytes move.
struct Watched {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let poll = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(poll, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.on_read();
        }
        poll
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write(cx, buf);
        if matches!(poll, Poll::Ready(Ok(written)) if written > 0) {
            this.activity.on_write();
        }
        poll
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if matches!(poll, Poll::Ready(Ok(written)) if written > 0) {
            this.activity.on_write();
        }
        poll
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;

//! The client that carries WebSub deliveries and verifications to one
//! callback host: hyper's HTTP/1.1 connections on the same rustls
//! configuration, resolver (with the network policy) and connection
//! settings as the reqwest clients of [`client`](crate::client), kept in a
//! stack of idle connections of the host's own. A client serves one host
//! (see [`pool`](crate::pool)), so a generic pool keyed by scheme and
//! authority, with its hashing, locking and request conversions on every
//! request, buys nothing here; at tens of thousands of deliveries a second
//! to one host reqwest's layers were a sixth of the hub's CPU and hyper's
//! pooled client another twentieth.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::uri::{PathAndQuery, Scheme};
use http::{HeaderValue, Request, Response, Uri};
use http_body_util::Full;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::time::Instant;
use tower::ServiceExt as _;
use tracing::debug;

use crate::net::{NetPolicy, PolicyResolver};

type Connector = HttpsConnector<HttpConnector<PolicyResolver>>;

/// The user agent of every request the hub makes.
pub const USER_AGENT: &str = concat!("websub-hub/", env!("CARGO_PKG_VERSION"));

/// One host's keep-alive connections and the requests made on them. Cheap
/// to clone; clones share the connections.
#[derive(Clone, Debug)]
pub struct DirectClient {
    connections: Arc<HostConnections>,
}

struct HostConnections {
    connector: Connector,
    /// The host's authority as its callbacks write it, and the `Host`
    /// header of a request to it over http and over https.
    authority: Box<str>,
    host_headers: [Option<HeaderValue>; 2],
    idle: Mutex<Vec<IdleSender>>,
    max_idle: usize,
    idle_timeout: Duration,
    /// Whether a task closes the connections idle past `idle_timeout`.
    reaped: AtomicBool,
}

impl std::fmt::Debug for HostConnections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostConnections")
            .field("max_idle", &self.max_idle)
            .field("idle_timeout", &self.idle_timeout)
            .finish_non_exhaustive()
    }
}

/// A connection between two requests: its sending half (dropping it closes
/// the connection), whether it is TLS, and since when it is idle.
struct IdleSender {
    sender: SendRequest<Full<Bytes>>,
    https: bool,
    since: Instant,
}

impl DirectClient {
    /// A client of the host at `authority` (as callbacks write it, without
    /// credentials) under `policy` on `tls`, connecting within `timeout`
    /// and keeping up to `max_idle` idle connections for `idle_timeout`.
    pub fn new(
        authority: &str,
        policy: &NetPolicy,
        timeout: Duration,
        mut tls: rustls::ClientConfig,
        max_idle: usize,
        idle_timeout: Duration,
    ) -> Self {
        // The connector offers what it enables (HTTP/1.1) itself.
        tls.alpn_protocols.clear();
        let mut http = HttpConnector::new_with_resolver(PolicyResolver {
            policy: policy.clone(),
        });
        // https URLs go through it too, to the TLS layer around it.
        http.enforce_http(false);
        http.set_connect_timeout(Some(timeout));
        http.set_nodelay(true);
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Self {
            connections: Arc::new(HostConnections {
                connector,
                authority: authority.into(),
                host_headers: [false, true].map(|https| {
                    let scheme = if https { "https" } else { "http" };
                    let uri = Uri::try_from(format!("{scheme}://{authority}/")).ok()?;
                    host_of(&uri).ok()
                }),
                idle: Mutex::new(Vec::new()),
                max_idle,
                idle_timeout,
                reaped: AtomicBool::new(false),
            }),
        }
    }

    /// Sends `request` to `url` and returns the answer's head with its body
    /// still to be read. The connection is kept for the next request once
    /// the body has been read to its end.
    pub async fn send(
        &self,
        url: &str,
        mut request: Request<Full<Bytes>>,
    ) -> Result<Response<AnswerBody>, BoxError> {
        let (uri, authorization) = uri_of(url)?;
        let https = uri.scheme() == Some(&Scheme::HTTPS);
        let headers = request.headers_mut();
        headers.insert(
            http::header::HOST,
            self.connections.host_header(&uri, https)?,
        );
        headers.insert(
            http::header::USER_AGENT,
            HeaderValue::from_static(USER_AGENT),
        );
        headers.insert(http::header::ACCEPT, HeaderValue::from_static("*/*"));
        if let Some(authorization) = authorization {
            headers.insert(http::header::AUTHORIZATION, authorization);
        }
        *request.uri_mut() = origin_form(&uri);
        let (mut sender, mut reused) = match self.connections.reuse(https).await {
            Some(sender) => (sender, true),
            None => (self.connections.connect(&uri).await?, false),
        };
        loop {
            match sender.try_send_request(request).await {
                Ok(response) => {
                    let (head, body) = response.into_parts();
                    let body = AnswerBody {
                        body,
                        finished: false,
                        connection: Some((sender, https, Arc::downgrade(&self.connections))),
                    };
                    return Ok(Response::from_parts(head, body));
                }
                Err(mut error) => match error.take_message() {
                    // A kept connection the host closed before this request
                    // went out on it: the request goes out on a new one.
                    Some(unsent) if reused => {
                        request = unsent;
                        sender = self.connections.connect(&uri).await?;
                        reused = false;
                    }
                    _ => return Err(error.into_error().into()),
                },
            }
        }
    }
}

impl HostConnections {
    /// The `Host` header of a request to `uri`: the one made at the start
    /// when `uri` is on the client's own authority, as it always is from
    /// [`pool`](crate::pool).
    fn host_header(&self, uri: &Uri, https: bool) -> Result<HeaderValue, BoxError> {
        match &self.host_headers[usize::from(https)] {
            Some(host) if uri.authority().map(|at| at.as_str()) == Some(&*self.authority) => {
                Ok(host.clone())
            }
            _ => host_of(uri),
        }
    }

    /// The idle connection used last that can take a request, if any.
    async fn reuse(&self, https: bool) -> Option<SendRequest<Full<Bytes>>> {
        loop {
            let idle = {
                let mut idle = self.lock();
                let at = idle.iter().rposition(|kept| kept.https == https)?;
                idle.remove(at)
            };
            if idle.since.elapsed() >= self.idle_timeout {
                continue;
            }
            let mut sender = idle.sender;
            // Ready at once, or as soon as its connection has finished
            // reading the last answer; an error means it is closed.
            if sender.ready().await.is_ok() {
                return Some(sender);
            }
        }
    }

    /// A new connection to the host of `uri`, run by a task of its own.
    async fn connect(&self, uri: &Uri) -> Result<SendRequest<Full<Bytes>>, BoxError> {
        let stream = self
            .connector
            .clone()
            .oneshot(uri.clone())
            .await
            .map_err(|source| ConnectFailed { source })?;
        let (sender, connection) = http1::Builder::new().handshake(stream).await?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                debug!(%error, "a callback connection ended with an error");
            }
        });
        Ok(sender)
    }

    /// Keeps `sender` for the next request, the one idle longest dropped
    /// past the limit.
    fn keep(self: &Arc<Self>, sender: SendRequest<Full<Bytes>>, https: bool) {
        if self.max_idle == 0 || sender.is_closed() {
            return;
        }
        let (dropped, reaper_wanted) = {
            let mut idle = self.lock();
            let dropped = (idle.len() >= self.max_idle).then(|| idle.remove(0));
            idle.push(IdleSender {
                sender,
                https,
                since: Instant::now(),
            });
            // Under the lock, as the reaper's ending is: one runs while
            // any connection is idle, none otherwise.
            (dropped, !self.reaped.swap(true, Ordering::AcqRel))
        };
        // Closed outside the lock.
        drop(dropped);
        if reaper_wanted {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn(reap(Arc::downgrade(self), self.idle_timeout))),
                Err(_) => self.reaped.store(false, Ordering::Release),
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<IdleSender>> {
        self.idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Closes the connections of `connections` that stay idle past `timeout`;
/// ends once none is idle (the next one kept starts another) or the client
/// is dropped, so that only clients with idle connections have a reaper.
async fn reap(connections: Weak<HostConnections>, timeout: Duration) {
    let mut ticks = tokio::time::interval((timeout / 2).max(Duration::from_millis(100)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        let Some(connections) = connections.upgrade() else {
            return;
        };
        let (expired, done): (Vec<IdleSender>, bool) = {
            let mut idle = connections.lock();
            let fresh = idle
                .iter()
                .position(|kept| kept.since.elapsed() < timeout)
                .unwrap_or(idle.len());
            let expired = idle.drain(..fresh).collect();
            let done = idle.is_empty();
            if done {
                connections.reaped.store(false, Ordering::Release);
            }
            (expired, done)
        };
        drop(expired);
        if done {
            return;
        }
    }
}

/// The body of an answer, which hands its connection back to the host's
/// idle ones once read to its end; one dropped before that closes it.
pub struct AnswerBody {
    body: Incoming,
    finished: bool,
    connection: Option<(SendRequest<Full<Bytes>>, bool, Weak<HostConnections>)>,
}

impl std::fmt::Debug for AnswerBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnswerBody")
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

impl Body for AnswerBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            this.finished = true;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.finished || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for AnswerBody {
    fn drop(&mut self) {
        if let Some((sender, https, connections)) = self.connection.take()
            && self.is_end_stream()
            && let Some(connections) = connections.upgrade()
        {
            connections.keep(sender, https);
        }
    }
}

/// Connecting to the host failed: the request never went out.
#[derive(Debug, thiserror::Error)]
#[error("could not connect")]
pub struct ConnectFailed {
    #[source]
    source: BoxError,
}

/// The request target of a request to `uri` on a connection to its host:
/// its path and query, `/` when it has neither.
fn origin_form(uri: &Uri) -> Uri {
    match uri.path_and_query() {
        Some(path) if path.as_str() != "/" => Uri::from(path.clone()),
        _ => Uri::from(PathAndQuery::from_static("/")),
    }
}

/// The `Host` header of a request to `uri`: its host, and its port unless
/// it is the scheme's default.
fn host_of(uri: &Uri) -> Result<HeaderValue, BoxError> {
    let host = uri.host().ok_or("the URL has no host")?;
    let default_port = if uri.scheme() == Some(&Scheme::HTTPS) {
        443
    } else {
        80
    };
    let value = match uri.port_u16() {
        Some(port) if port != default_port => HeaderValue::try_from(format!("{host}:{port}"))?,
        _ => HeaderValue::try_from(host)?,
    };
    Ok(value)
}

/// An error of any kind, as the exchange reports it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The request target of `url`, and the `Authorization` its credentials
/// make (as a browser and reqwest send them: Basic, decoded). A URL that is
/// valid but not a valid request target as written (a space, a non-ASCII
/// letter) is sent as the URL parser spells it, percent-encoded.
fn uri_of(url: &str) -> Result<(Uri, Option<HeaderValue>), BoxError> {
    let has_credentials = crate::pool::authority_with_credentials(url).contains('@');
    if !has_credentials && let Ok(uri) = Uri::try_from(url) {
        return Ok((uri, None));
    }
    let mut parsed = url::Url::parse(url)?;
    let authorization = if has_credentials {
        let decode = |part: &str| {
            percent_encoding::percent_decode_str(part)
                .decode_utf8_lossy()
                .into_owned()
        };
        let credentials = format!(
            "{}:{}",
            decode(parsed.username()),
            decode(parsed.password().unwrap_or_default())
        );
        let value = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(credentials)
        );
        let _ = parsed.set_username("");
        let _ = parsed.set_password(None);
        let mut value = HeaderValue::try_from(value)?;
        value.set_sensitive(true);
        Some(value)
    } else {
        None
    };
    Ok((Uri::try_from(parsed.as_str())?, authorization))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_is_the_url_as_written_or_as_the_parser_spells_it() {
        let (uri, authorization) = uri_of("http://127.0.0.1:8080/cb?x=1").expect("a target");
        assert_eq!(uri, "http://127.0.0.1:8080/cb?x=1");
        assert!(authorization.is_none());
        let (uri, _) = uri_of("http://example.com/caf\u{e9} x").expect("a target");
        assert_eq!(uri, "http://example.com/caf%C3%A9%20x");
    }

    #[test]
    fn credentials_become_basic_authorization_and_leave_the_target() {
        let (uri, authorization) =
            uri_of("http://al%20ice:s3cr%3At@example.com:81/cb").expect("a target");
        assert_eq!(uri, "http://example.com:81/cb");
        // "al ice:s3cr:t"
        assert_eq!(
            authorization.as_ref().and_then(|value| value.to_str().ok()),
            Some("Basic YWwgaWNlOnMzY3I6dA==")
        );
    }

    const NO_CONTENT: &[u8] = b"HTTP/1.1 204 No Content\r\n\r\n";

    /// A host on 127.0.0.1 that gives every request `answer`, closing the
    /// connection after each answer when `close_after` (without saying so);
    /// with the connections it accepted, and the requests' heads.
    async fn host(
        answer: &'static [u8],
        close_after: bool,
    ) -> (
        String,
        Arc<std::sync::atomic::AtomicUsize>,
        Arc<Mutex<Vec<String>>>,
    ) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let heads = Arc::new(Mutex::new(Vec::new()));
        let (counted, kept) = (accepted.clone(), heads.clone());
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                let kept = kept.clone();
                tokio::spawn(async move {
                    let mut read = Vec::new();
                    let mut buffer = [0_u8; 4096];
                    while let Ok(n) = stream.read(&mut buffer).await {
                        if n == 0 {
                            return;
                        }
                        read.extend_from_slice(&buffer[..n]);
                        // Bodies here are empty: a head is a request.
                        while let Some(end) = read.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head: Vec<u8> = read.drain(..end + 4).collect();
                            kept.lock()
                                .expect("heads")
                                .push(String::from_utf8_lossy(&head).into_owned());
                            if stream.write_all(answer).await.is_err() || close_after {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (format!("127.0.0.1:{}", address.port()), accepted, heads)
    }

    fn client_of(authority: &str, max_idle: usize) -> DirectClient {
        client_idle_for(authority, max_idle, Duration::from_secs(90))
    }

    fn client_idle_for(authority: &str, max_idle: usize, idle_timeout: Duration) -> DirectClient {
        let policy = NetPolicy {
            allow_private_network: true,
        };
        let tls = crate::client::callback_tls(&crate::client::Trust::system()).expect("tls");
        DirectClient::new(
            authority,
            &policy,
            Duration::from_secs(2),
            tls,
            max_idle,
            idle_timeout,
        )
    }

    async fn get(client: &DirectClient, url: &str) -> http::StatusCode {
        use http_body_util::BodyExt as _;
        let response = client
            .send(url, Request::new(Full::new(Bytes::new())))
            .await
            .expect("an answer");
        let status = response.status();
        response.into_body().collect().await.expect("a body");
        status
    }

    #[tokio::test]
    async fn a_kept_connection_carries_the_next_request_with_its_host_and_target() {
        let (authority, accepted, heads) = host(NO_CONTENT, false).await;
        let client = client_of(&authority, 4);
        for path in ["/cb?one", "/cb?two", "/"] {
            let url = format!("http://{authority}{path}");
            assert_eq!(get(&client, &url).await, http::StatusCode::NO_CONTENT);
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one connection for all three"
        );
        let heads = heads.lock().expect("heads").clone();
        assert!(
            heads[0].starts_with("GET /cb?one HTTP/1.1\r\n"),
            "{heads:?}"
        );
        assert!(heads[2].starts_with("GET / HTTP/1.1\r\n"), "{heads:?}");
        let host_line = format!("host: {authority}\r\n");
        assert!(
            heads
                .iter()
                .all(|head| head.to_ascii_lowercase().contains(&host_line)),
            "{heads:?}"
        );
    }

    #[tokio::test]
    async fn a_connection_the_host_closed_is_replaced_and_the_request_goes_out() {
        let (authority, accepted, heads) = host(NO_CONTENT, true).await;
        let client = client_of(&authority, 4);
        for _ in 0..5 {
            let url = format!("http://{authority}/cb");
            assert_eq!(get(&client, &url).await, http::StatusCode::NO_CONTENT);
        }
        assert_eq!(heads.lock().expect("heads").len(), 5);
        assert_eq!(accepted.load(Ordering::SeqCst), 5);
    }

    #[tokio::test]
    async fn idle_connections_are_kept_up_to_the_limit() {
        let (authority, accepted, _) = host(NO_CONTENT, false).await;
        let client = client_of(&authority, 1);
        let url = format!("http://{authority}/cb");
        let (first, second) = tokio::join!(get(&client, &url), get(&client, &url));
        assert_eq!(
            (first, second),
            (http::StatusCode::NO_CONTENT, http::StatusCode::NO_CONTENT)
        );
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            2,
            "two at once need two connections"
        );
        assert_eq!(client.connections.lock().len(), 1, "one is kept");
        let none = client_of(&authority, 0);
        get(&none, &url).await;
        assert!(none.connections.lock().is_empty(), "none is kept");
    }

    #[tokio::test]
    async fn a_connection_idle_past_its_timeout_is_closed() {
        let (authority, accepted, _) = host(NO_CONTENT, false).await;
        let client = client_idle_for(&authority, 4, Duration::from_millis(300));
        let url = format!("http://{authority}/cb");
        get(&client, &url).await;
        assert_eq!(client.connections.lock().len(), 1);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(client.connections.lock().is_empty(), "closed by the reaper");
        get(&client, &url).await;
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            2,
            "the next request connects again"
        );
    }

    #[tokio::test]
    async fn an_answer_dropped_unread_takes_its_connection_with_it() {
        let (authority, _, _) = host(NO_CONTENT, false).await;
        let client = client_of(&authority, 4);
        let url = format!("http://{authority}/cb");
        // A 204 is read to its end as it arrives: kept.
        drop(
            client
                .send(&url, Request::new(Full::new(Bytes::new())))
                .await
                .expect("an answer"),
        );
        assert_eq!(client.connections.lock().len(), 1);
    }
}

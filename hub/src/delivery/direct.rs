//! The client that carries WebSub deliveries to their callbacks: hyper's
//! pooled HTTP/1.1 client on the same rustls configuration, resolver
//! (with the network policy) and connection settings as the reqwest
//! clients of [`client`](super::client), without reqwest's layers around
//! each request. Those layers parse a callback's URL twice per request
//! (once into reqwest's URL, once more for a redirect policy that follows
//! nothing), convert the request between two types and clone the client;
//! at tens of thousands of deliveries a second to one host they were about
//! a sixth of the hub's CPU.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderValue, Request, Response, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::delivery::net::{NetPolicy, PolicyResolver};

type Connector = HttpsConnector<HttpConnector<PolicyResolver>>;

/// The user agent of every request the hub makes.
pub const USER_AGENT: &str = concat!("websub-hub/", env!("CARGO_PKG_VERSION"));

/// A pool of keep-alive connections and the POSTs made on it. Cheap to
/// clone; clones share the pool.
#[derive(Clone, Debug)]
pub struct DirectClient {
    // hyper's client is some 400 bytes; a lane's runners each hold one.
    client: Arc<Client<Connector, Full<Bytes>>>,
}

impl DirectClient {
    /// A client under `policy` on `tls`, connecting within `timeout` and
    /// keeping up to `max_idle_per_host` idle connections per host for
    /// `idle_timeout`.
    pub fn new(
        policy: &NetPolicy,
        timeout: Duration,
        mut tls: rustls::ClientConfig,
        max_idle_per_host: usize,
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
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(idle_timeout)
            .pool_max_idle_per_host(max_idle_per_host)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .build(connector);
        Self {
            client: Arc::new(client),
        }
    }

    /// Sends `request` to `url` and returns the answer's head with its body
    /// still to be read.
    pub async fn send(
        &self,
        url: &str,
        mut request: Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, BoxError> {
        let (uri, authorization) = uri_of(url)?;
        *request.uri_mut() = uri;
        let headers = request.headers_mut();
        headers.insert(
            http::header::USER_AGENT,
            HeaderValue::from_static(USER_AGENT),
        );
        headers.insert(http::header::ACCEPT, HeaderValue::from_static("*/*"));
        if let Some(authorization) = authorization {
            headers.insert(http::header::AUTHORIZATION, authorization);
        }
        Ok(self.client.request(request).await?)
    }
}

/// An error of any kind, as the exchange reports it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The request target of `url`, and the `Authorization` its credentials
/// make (as a browser and reqwest send them: Basic, decoded). A URL that is
/// valid but not a valid request target as written (a space, a non-ASCII
/// letter) is sent as the URL parser spells it, percent-encoded.
fn uri_of(url: &str) -> Result<(Uri, Option<HeaderValue>), BoxError> {
    let has_credentials = super::pool::authority_with_credentials(url).contains('@');
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
}

//! The hub's configuration: every setting with its default
//! ([`HubConfig`]), the one settings layer ([`Settings`]) that the TOML
//! file, the `WEBSUB_*` environment and the flags are each read into, the
//! layering of those (defaults, file, environment, flags: later layers win),
//! and the validation that runs once at start-up so a bad value is named
//! before anything is served. Behind the `cli` feature, [`CommandLine`]
//! is the same settings as `clap` arguments and loads all the layers.
//! [`descriptors`] fits the delivery settings under the process's
//! file-descriptor limit; `text` is the parsing and the errors of settings
//! written as text, shared with the outbox dispatcher's and the feeds'.

#[cfg(feature = "cli")]
mod command_line;
pub mod descriptors;
mod settings;
/// The test configurations and files the other modules' tests share.
#[cfg(test)]
pub(crate) use settings::tests as test_settings;
pub(crate) use websub_delivery::setting as text;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use url::Url;

use crate::delivery::RetryPolicy;
use crate::delivery::client::Trust;
pub use crate::delivery::health::BreakerPolicy;
use crate::intake::feed::{FeedConfig, TopicTemplate};
#[cfg(feature = "cli")]
pub use command_line::{CommandLine, LoadError};
pub use settings::Settings;
pub use text::{ConfigError, format_duration, parse_duration};
use text::{invalid, secs};

/// The longest header read or idle timeout accepted: a client allowed
/// more than a day to say something holds its connection for good.
const MAX_CONNECTION_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// How long events and their deliveries are kept unless told otherwise:
/// well past the three days after which a failing endpoint is disabled for
/// good, and two weeks of history to look into and replay, while the disk
/// a hub uses stays bounded by its traffic of two weeks.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(14 * 86_400);

/// Everything a hub needs to run. Build it with [`HubConfig::default`] (the
/// embedded default), adjust fields, and call [`HubConfig::validate`]; or
/// lay [`Settings`] over the default with [`HubConfig::layered`].
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// The address `websubd` listens on.
    pub listen: SocketAddr,
    /// The hub URL announced in `rel="hub"`, exactly as given; it ends with
    /// a slash.
    pub public_url: Url,
    /// Where the event log lives, and by default the subscriptions:
    /// `sqlite:PATH` or `postgres://…`.
    pub database_url: String,
    /// Where subscriptions live when not in the database: `memory`,
    /// `sqlite:…`, `postgres://…` or `redis://…`.
    pub store: Option<String>,
    /// Lease granted when none is asked for, and the bounds requests are
    /// clamped to.
    pub lease: LeasePolicy,
    /// How deliveries are made and retried.
    pub delivery: DeliveryPolicy,
    /// How verification requests are made.
    pub verification: VerificationPolicy,
    /// Allow callbacks and topics that resolve to loopback, private,
    /// link-local or unique-local addresses. Off by default, so a public hub
    /// cannot be aimed at its own network.
    pub allow_private_network: bool,
    /// A PEM file of CA certificates trusted besides the system's roots by
    /// every client the hub makes: deliveries, verifications, topic
    /// fetches, outbox webhooks and the subscriptions service.
    pub extra_ca: Option<PathBuf>,
    /// A PEM file of the client certificate (and its chain) that every
    /// client the hub makes shows a server asking for one (mTLS), with
    /// [`client_key`](Self::client_key); a feed or a webhook may show its
    /// own instead.
    pub client_cert: Option<PathBuf>,
    /// The PEM file of [`client_cert`](Self::client_cert)'s private key.
    pub client_key: Option<PathBuf>,
    /// The one key of every role but metrics (≥ 32 characters): fat
    /// pings, the operator API and admin page, and the subscriptions
    /// service when [`quota_api_key`](Self::quota_api_key) is unset.
    pub internal_api_key: Option<String>,
    /// Keys that authorise fat pings, besides the internal key (≥ 32
    /// characters each); several, so one can be replaced without downtime.
    pub publish_keys: Vec<String>,
    /// Keys of the operator API and the admin page, besides the internal
    /// key. An admin session ends when the key it was opened with is
    /// removed.
    pub operator_keys: Vec<String>,
    /// Keys that `/metrics` asks for; it is open without any.
    pub metrics_keys: Vec<String>,
    /// The key the hub sends to the subscriptions service; the internal
    /// key when unset.
    pub quota_api_key: Option<String>,
    /// The header the internal key travels in.
    pub internal_api_key_header: String,
    /// The largest subscription or publish form accepted, in bytes.
    pub max_form_bytes: usize,
    /// The largest content accepted from a fat ping or a topic fetch, in
    /// bytes.
    pub max_content_bytes: usize,
    /// The time a request head (request line and headers) has to arrive,
    /// from the connection's accept or the first byte of a later request
    /// on it, and the longest a request body may stall; a client too slow
    /// is closed.
    pub header_read_timeout: Duration,
    /// The time a kept-alive connection may wait for its next request after
    /// an answer. Longer than the 60 s idle timeout of common load
    /// balancers, so that a proxy pooling connections to the hub closes
    /// them first.
    pub idle_timeout: Duration,
    /// HTTP connections open at most. Past it, the connection that has
    /// waited longest for its client is closed to make room; with the hub
    /// working on a request on every one, a new one is answered 503. The
    /// default fits within the descriptors kept apart from callback
    /// connections ([`crate::config::descriptors::RESERVED`]).
    pub max_connections: usize,
    /// How the binary writes its log lines.
    pub log_format: LogFormat,
    /// How often expired subscriptions are removed.
    pub reaper_interval: Duration,
    /// How often the dispatcher polls for due deliveries when nothing wakes it.
    pub poll_interval: Duration,
    /// Delete events (and their delivery records, attempts and endpoint
    /// changes) older than this; `None` keeps everything.
    pub retention: Option<Duration>,
    /// The HS256 key of user tokens. Subscribers authenticate with one when
    /// the quota is on, and for the subscriber API.
    pub user_token_key: Option<String>,
    /// The header carrying the user token (`Authorization: Bearer …` by
    /// default).
    pub user_token_header: String,
    /// The subscriptions service that sets each subscriber's limit; the
    /// quota is enforced when this is set.
    pub quota_url: Option<Url>,
    /// Time allowed for the subscriptions service to answer.
    pub quota_timeout: Duration,
    /// The quota type that caps a subscriber's subscriptions.
    pub quota_type: String,
    /// Producers' outbox tables the hub delivers from (`[[feed]]` in the
    /// configuration file).
    pub feeds: Vec<FeedConfig>,
    /// Where every endpoint state change is POSTed, signed with
    /// [`operator_webhook_secret`](Self::operator_webhook_secret); none
    /// when unset (see [`crate::delivery::operator`]).
    pub operator_webhook: Option<Url>,
    /// The Standard Webhooks secret (`whsec_<base64>`) the operator
    /// webhook's requests are signed with; required with it.
    pub operator_webhook_secret: Option<String>,
    /// The secret [`operator_webhook_secret`](Self::operator_webhook_secret)
    /// replaces, while the receiver moves to the new one: each request
    /// carries a signature with each.
    pub operator_webhook_previous_secret: Option<String>,
}

/// Lease bounds. Requests outside `[min, max]` are clamped; WebSub
/// subscriptions are never perpetual.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeasePolicy {
    /// Granted when the subscriber asks for none (10 days).
    pub default: Duration,
    /// The shortest lease granted.
    pub min: Duration,
    /// The longest lease granted.
    pub max: Duration,
}

/// Delivery timing, retries and concurrency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryPolicy {
    /// Time allowed for one delivery POST, connection included.
    pub timeout: Duration,
    /// Retries and their backoff.
    pub retry: RetryPolicy,
    /// Deliveries in flight at once, over all callbacks.
    pub concurrency: usize,
    /// The most deliveries in flight at once to one callback host. Each
    /// host's limit starts at [`crate::delivery::limit::INITIAL_LIMIT`] and adapts
    /// to how the host answers, between `per_host_min` and this.
    pub per_host: usize,
    /// The least a callback host's in-flight limit falls to.
    pub per_host_min: usize,
    /// The most deliveries started per second to one callback host (or one
    /// ordered subscription's callback), evenly spaced; 0 for no limit.
    pub per_host_rate: u32,
    /// Idle keep-alive connections kept in all to callback hosts with no
    /// delivery under way, up to `per_host` to a host: the hosts idle
    /// longest close theirs first (see [`crate::delivery::pool`]).
    pub idle_connections: usize,
    /// Delivery records claimed per round trip to the event log.
    pub batch_size: usize,
    /// A claim older than this is taken to be from a dead process and the
    /// delivery becomes claimable again.
    pub visibility_timeout: Duration,
    /// Deliveries to one endpoint that exhaust their retries in a row before
    /// it is disabled; 0 never disables this way.
    pub disable_endpoint_after: u32,
    /// When a callback's breaker opens, and when a callback whose breaker
    /// stayed open is disabled.
    pub breaker: BreakerPolicy,
}

/// Verification of intent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerificationPolicy {
    /// Time allowed for the callback to answer.
    pub timeout: Duration,
    /// Verifications in flight at once.
    pub concurrency: usize,
    /// Attempts a verification gets when the callback cannot be reached,
    /// times out or answers 5xx; a 4xx or a wrong challenge is final.
    pub attempts: u32,
    /// The wait before the first retry; each later one waits twice as long.
    pub retry_wait: Duration,
    /// Verifications waiting at most; past it a subscribe or unsubscribe is
    /// answered 503 with `Retry-After`.
    pub max_pending: u64,
}

impl Default for HubConfig {
    fn default() -> Self {
        let listen = SocketAddr::from(([127, 0, 0, 1], 8080));
        Self {
            listen,
            public_url: public_url_for(listen),
            database_url: "sqlite:websub.db".to_owned(),
            store: None,
            lease: LeasePolicy::default(),
            delivery: DeliveryPolicy::default(),
            verification: VerificationPolicy::default(),
            allow_private_network: false,
            extra_ca: None,
            client_cert: None,
            client_key: None,
            internal_api_key: None,
            publish_keys: Vec::new(),
            operator_keys: Vec::new(),
            metrics_keys: Vec::new(),
            quota_api_key: None,
            internal_api_key_header: crate::web::auth::DEFAULT_INTERNAL_API_KEY_HEADER.to_owned(),
            max_form_bytes: 64 * 1024,
            max_content_bytes: 16 * 1024 * 1024,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(75),
            max_connections: 512,
            log_format: LogFormat::Text,
            reaper_interval: Duration::from_secs(60),
            poll_interval: Duration::from_secs(1),
            retention: Some(DEFAULT_RETENTION),
            user_token_key: None,
            user_token_header: crate::web::auth::DEFAULT_USER_TOKEN_HEADER.to_owned(),
            quota_url: None,
            quota_timeout: crate::intake::quota::DEFAULT_TIMEOUT,
            quota_type: websub_store::OwnerQuota::DEFAULT_TYPE.to_owned(),
            feeds: Vec::new(),
            operator_webhook: None,
            operator_webhook_secret: None,
            operator_webhook_previous_secret: None,
        }
    }
}

impl Default for LeasePolicy {
    fn default() -> Self {
        Self {
            default: Duration::from_secs(10 * 24 * 3600),
            min: Duration::from_secs(60),
            max: Duration::from_secs(365 * 24 * 3600),
        }
    }
}

impl Default for DeliveryPolicy {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(10),
            retry: RetryPolicy::default(),
            // Thousands in flight cost little (a task, a connection, some
            // 30 KiB each) and are what slow subscribers need: at 200 ms
            // an answer, 4 096 make 20 000 deliveries a second. A host
            // starts at 8 in flight (a browser opens 6) and earns up to 32
            // by answering quickly and without errors, enough to keep a
            // fast receiver busy on loopback; one that slows down or fails
            // falls back towards 1. 512 idle connections keep the hosts used
            // last warm. See docs/benchmarks.md for what they cost.
            concurrency: 4096,
            per_host: 32,
            per_host_min: 1,
            per_host_rate: 0,
            idle_connections: 512,
            batch_size: 500,
            visibility_timeout: Duration::from_secs(60),
            disable_endpoint_after: 0,
            breaker: BreakerPolicy::default(),
        }
    }
}

impl Default for VerificationPolicy {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(10),
            // A verification in flight is a task and a callback connection,
            // and holds no database connection: its writes go in groups.
            // With 64, subscribing waited on verifiers (some 2 800 pending
            // at a time in a 10 000-request run), and a handful of
            // callbacks slow to answer held most of them; 256 keep up with
            // what the hub accepts, and fit well inside the descriptors
            // kept for everything but deliveries (`descriptors::RESERVED`).
            // See docs/benchmarks.md.
            concurrency: 256,
            // With the timeout, a callback that never answers is given up
            // after about a minute: 10 s, a 10 s wait, 10 s, 20 s, 10 s.
            attempts: 3,
            retry_wait: Duration::from_secs(10),
            max_pending: 10_000,
        }
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, with the fields of the spans it is in.
    Json,
}

/// The public URL a hub listening on `listen` announces by default.
pub fn public_url_for(listen: SocketAddr) -> Url {
    let host = match listen.ip() {
        ip if ip.is_unspecified() => "127.0.0.1".to_owned(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        std::net::IpAddr::V4(ip) => ip.to_string(),
    };
    Url::parse(&format!("http://{host}:{}/", listen.port())).unwrap_or_else(|_| unreachable_url())
}

fn unreachable_url() -> Url {
    // Only reachable if formatting an IP address produced an invalid URL.
    Url::parse("http://127.0.0.1/").unwrap_or_else(|error| panic!("constant URL: {error}"))
}

impl HubConfig {
    /// Checks every setting; the first bad one is named in the error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let url = &self.public_url;
        if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
            return Err(invalid(
                "public-url",
                url,
                "must be an absolute http(s) URL",
            ));
        }
        if !url.path().ends_with('/') {
            return Err(invalid("public-url", url, "must end with a slash"));
        }
        if !(self.database_url.starts_with("sqlite:")
            || self.database_url.starts_with("postgres://")
            || self.database_url.starts_with("postgresql://"))
        {
            return Err(invalid(
                "database-url",
                &self.database_url,
                "must be sqlite:PATH or postgres://…",
            ));
        }
        if let Some(store) = &self.store {
            let known = store == "memory"
                || [
                    "sqlite:",
                    "postgres://",
                    "postgresql://",
                    "redis://",
                    "rediss://",
                    "redis+cluster://",
                ]
                .iter()
                .any(|prefix| store.starts_with(prefix));
            if !known {
                return Err(invalid(
                    "store",
                    store,
                    "must be memory, sqlite:PATH, postgres://… or redis://…",
                ));
            }
        }
        let lease = &self.lease;
        if lease.min.is_zero() {
            return Err(invalid("lease-min", secs(lease.min), "must be positive"));
        }
        if lease.min > lease.max {
            return Err(invalid(
                "lease-min",
                secs(lease.min),
                format!("is above lease-max ({})", secs(lease.max)),
            ));
        }
        if lease.default < lease.min || lease.default > lease.max {
            return Err(invalid(
                "lease-default",
                secs(lease.default),
                format!(
                    "must lie within lease-min ({}) and lease-max ({})",
                    secs(lease.min),
                    secs(lease.max)
                ),
            ));
        }
        if lease.max.as_secs() > u64::from(u32::MAX) {
            return Err(invalid("lease-max", secs(lease.max), "is beyond 136 years"));
        }
        let delivery = &self.delivery;
        if delivery.timeout.is_zero() {
            return Err(invalid(
                "delivery-timeout",
                secs(delivery.timeout),
                "must be positive",
            ));
        }
        if delivery.concurrency == 0 {
            return Err(invalid("delivery-concurrency", 0, "must be positive"));
        }
        if delivery.per_host == 0 {
            return Err(invalid("delivery-per-host", 0, "must be positive"));
        }
        if delivery.per_host_min == 0 || delivery.per_host_min > delivery.per_host {
            return Err(invalid(
                "delivery-per-host-min",
                delivery.per_host_min,
                "must be positive and at most delivery-per-host",
            ));
        }
        if delivery.idle_connections == 0 {
            return Err(invalid("delivery-idle-connections", 0, "must be positive"));
        }
        if delivery.batch_size == 0 || delivery.batch_size > 10_000 {
            return Err(invalid(
                "delivery-batch-size",
                delivery.batch_size,
                "must be between 1 and 10000",
            ));
        }
        if delivery.visibility_timeout <= delivery.timeout {
            return Err(invalid(
                "visibility-timeout",
                secs(delivery.visibility_timeout),
                "must be longer than delivery-timeout, or a slow delivery would be claimed twice",
            ));
        }
        if self.verification.timeout.is_zero() {
            return Err(invalid(
                "verification-timeout",
                secs(self.verification.timeout),
                "must be positive",
            ));
        }
        if self.verification.concurrency == 0 {
            return Err(invalid("verification-concurrency", 0, "must be positive"));
        }
        if !(1..=20).contains(&self.verification.attempts) {
            return Err(invalid(
                "verification-attempts",
                self.verification.attempts,
                "must be between 1 and 20",
            ));
        }
        if self.verification.retry_wait.is_zero() {
            return Err(invalid(
                "verification-retry-wait",
                secs(self.verification.retry_wait),
                "must be positive",
            ));
        }
        if self.verification.max_pending == 0 {
            return Err(invalid("max-pending-verifications", 0, "must be positive"));
        }
        self.trust()?;
        let keys = [
            ("internal-api-key", self.internal_api_key.as_slice()),
            ("publish-keys", &self.publish_keys),
            ("operator-keys", &self.operator_keys),
            ("metrics-keys", &self.metrics_keys),
            ("quota-api-key", self.quota_api_key.as_slice()),
        ];
        for (setting, keys) in keys {
            for key in keys {
                let chars = key.chars().count();
                if chars < crate::web::auth::MIN_INTERNAL_KEY_CHARS {
                    return Err(invalid(
                        setting,
                        "<redacted>",
                        format!(
                            "holds a key of {chars} characters; at least {} are required",
                            crate::web::auth::MIN_INTERNAL_KEY_CHARS
                        ),
                    ));
                }
            }
        }
        if self.internal_api_key_header.is_empty()
            || http::HeaderName::from_bytes(self.internal_api_key_header.as_bytes()).is_err()
        {
            return Err(invalid(
                "internal-api-key-header",
                &self.internal_api_key_header,
                "is not a valid HTTP header name",
            ));
        }
        if self
            .user_token_key
            .as_ref()
            .is_some_and(|key| key.is_empty())
        {
            return Err(invalid("user-token-key", "\"\"", "must not be empty"));
        }
        if self.user_token_header.is_empty()
            || http::HeaderName::from_bytes(self.user_token_header.as_bytes()).is_err()
        {
            return Err(invalid(
                "user-token-header",
                &self.user_token_header,
                "is not a valid HTTP header name",
            ));
        }
        if let Some(url) = &self.quota_url {
            if !matches!(url.scheme(), "http" | "https") {
                return Err(invalid("quota-url", url, "must be an http(s) URL"));
            }
            if self.quota_key().is_none() {
                return Err(invalid(
                    "quota-url",
                    url,
                    "needs quota-api-key (or internal-api-key): the subscriptions service \
                     is called with it",
                ));
            }
            if self.user_token_key.is_none() {
                return Err(invalid(
                    "quota-url",
                    url,
                    "needs user-token-key: subscribers are identified by their user token",
                ));
            }
        }
        if self.quota_timeout.is_zero() {
            return Err(invalid(
                "quota-timeout",
                secs(self.quota_timeout),
                "must be positive",
            ));
        }
        if self.quota_type.is_empty() {
            return Err(invalid("quota-type", "\"\"", "must not be empty"));
        }
        for feed in &self.feeds {
            feed.dispatcher_config()?;
            let template = TopicTemplate::parse(&feed.topic_template)?;
            template.check(&self.public_url)?;
        }
        if self.poll_interval.is_zero() {
            return Err(invalid(
                "poll-interval",
                secs(self.poll_interval),
                "must be positive",
            ));
        }
        if self.max_form_bytes == 0 {
            return Err(invalid("max-form-bytes", 0, "must be positive"));
        }
        if self.max_content_bytes == 0 {
            return Err(invalid("max-content-bytes", 0, "must be positive"));
        }
        for (setting, timeout) in [
            ("header-read-timeout", self.header_read_timeout),
            ("idle-timeout", self.idle_timeout),
        ] {
            if timeout.is_zero() || timeout > MAX_CONNECTION_TIMEOUT {
                return Err(invalid(
                    setting,
                    secs(timeout),
                    "must be positive and at most a day",
                ));
            }
        }
        if self.max_connections == 0 {
            return Err(invalid("max-connections", 0, "must be positive"));
        }
        if self.reaper_interval.is_zero() {
            return Err(invalid(
                "reaper-interval",
                secs(self.reaper_interval),
                "must be positive",
            ));
        }
        self.operator_webhook_key()?;
        self.operator_webhook_previous_key()?;
        Ok(())
    }

    /// The key sent to the subscriptions service: its own, or the
    /// internal key.
    pub fn quota_key(&self) -> Option<&str> {
        self.quota_api_key
            .as_deref()
            .or(self.internal_api_key.as_deref())
    }

    /// The key the operator webhook's secret being replaced holds, during a
    /// rotation; a malformed one, or one without a secret to replace it, is
    /// named (never shown).
    pub fn operator_webhook_previous_key(&self) -> Result<Option<Vec<u8>>, ConfigError> {
        let Some(previous) = &self.operator_webhook_previous_secret else {
            return Ok(None);
        };
        if self.operator_webhook_secret.is_none() {
            return Err(invalid(
                "operator-webhook-previous-secret",
                "<redacted>",
                "needs operator-webhook-secret, the secret that replaces it",
            ));
        }
        crate::signature::standard_key(previous)
            .map(Some)
            .map_err(|why| invalid("operator-webhook-previous-secret", "<redacted>", why))
    }

    /// The operator webhook's URL and signing key, when one is configured;
    /// a URL that is not http(s), or a secret missing, malformed or without
    /// a URL, is named (the secret never shown).
    pub fn operator_webhook_key(&self) -> Result<Option<(&Url, Vec<u8>)>, ConfigError> {
        match (&self.operator_webhook, &self.operator_webhook_secret) {
            (None, None) => Ok(None),
            (None, Some(_)) => Err(invalid(
                "operator-webhook-secret",
                "<redacted>",
                "is set without operator-webhook",
            )),
            (Some(url), None) => Err(invalid(
                "operator-webhook",
                url,
                "needs operator-webhook-secret: its requests are signed",
            )),
            (Some(url), Some(secret)) => {
                if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
                    return Err(invalid(
                        "operator-webhook",
                        url,
                        "must be an absolute http(s) URL",
                    ));
                }
                let key = crate::signature::standard_key(secret)
                    .map_err(|why| invalid("operator-webhook-secret", "<redacted>", why))?;
                Ok(Some((url, key)))
            }
        }
    }
}
impl HubConfig {
    /// The roots the hub's clients trust: the system's, and the
    /// certificates of [`extra_ca`](Self::extra_ca) when set. Reads the
    /// file; one that cannot be read, or holds no usable certificate, is
    /// named with what is wrong.
    pub fn trust(&self) -> Result<Trust, ConfigError> {
        let trust = match &self.extra_ca {
            None => Trust::system(),
            Some(path) => Trust::from_pem_file(path)
                .map_err(|error| invalid("extra-ca", path.display(), error.to_string()))?,
        };
        let identity = client_identity(
            ("client-cert", self.client_cert.as_deref()),
            ("client-key", self.client_key.as_deref()),
        )?;
        Ok(trust.with_identity(identity))
    }

    /// The defaults with each layer laid over them in turn (later layers
    /// win), then validated: the one way a configuration is assembled from
    /// settings. `websubd` passes the file, the environment and the flags.
    pub fn layered(layers: impl IntoIterator<Item = Settings>) -> Result<Self, ConfigError> {
        let mut config = Self::default();
        for layer in layers {
            layer.apply(&mut config)?;
        }
        config.validate()?;
        Ok(config)
    }
}

/// The client certificate and key of two settings (`certificate` and
/// `key`, each a setting's name and its file), given together or not at
/// all; a fault names the setting and the file.
pub(crate) fn client_identity(
    certificate: (&'static str, Option<&std::path::Path>),
    key: (&'static str, Option<&std::path::Path>),
) -> Result<Option<crate::delivery::client::ClientIdentity>, ConfigError> {
    use crate::delivery::client::{ClientIdentity, IdentityFile};
    match (certificate.1, key.1) {
        (None, None) => Ok(None),
        (Some(path), None) => Err(invalid(
            certificate.0,
            path.display(),
            format!("needs {} (the certificate's private key)", key.0),
        )),
        (None, Some(path)) => Err(invalid(
            key.0,
            path.display(),
            format!("needs {} (the certificate it is the key of)", certificate.0),
        )),
        (Some(cert_path), Some(key_path)) => ClientIdentity::from_pem_files(cert_path, key_path)
            .map(Some)
            .map_err(|(file, error)| match file {
                IdentityFile::Certificate => {
                    invalid(certificate.0, cert_path.display(), error.to_string())
                }
                IdentityFile::Key => invalid(key.0, key_path.display(), error.to_string()),
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_announces_a_slash_terminated_hub_url() {
        let config = HubConfig::default();
        config.validate().expect("the default is valid");
        assert_eq!(config.public_url.as_str(), "http://127.0.0.1:8080/");
    }

    #[test]
    fn validation_names_the_bad_setting() {
        let mut config = HubConfig::default();
        config.lease.min = Duration::from_secs(100);
        config.lease.max = Duration::from_secs(10);
        assert!(matches!(
            config.validate(),
            Err(ConfigError::Invalid {
                setting: "lease-min",
                ..
            })
        ));

        let config = HubConfig {
            internal_api_key: Some("short".to_owned()),
            ..HubConfig::default()
        };
        let error = config.validate().expect_err("a short key");
        assert!(matches!(
            error,
            ConfigError::Invalid {
                setting: "internal-api-key",
                ..
            }
        ));
        assert!(
            !error.to_string().contains("short"),
            "the key leaked: {error}"
        );

        let config = HubConfig {
            public_url: Url::parse("http://hub.example/hub").expect("url"),
            ..HubConfig::default()
        };
        assert!(matches!(
            config.validate(),
            Err(ConfigError::Invalid {
                setting: "public-url",
                ..
            })
        ));

        let config = HubConfig {
            store: Some("mongodb://x".to_owned()),
            ..HubConfig::default()
        };
        assert!(matches!(
            config.validate(),
            Err(ConfigError::Invalid {
                setting: "store",
                ..
            })
        ));
    }
}

//! The hub's configuration: every setting with its default
//! ([`HubConfig`]), the one settings layer ([`Settings`]) that the TOML
//! file, the `WEBSUB_*` environment and the flags are each read into, the
//! layering of those (defaults, file, environment, flags: later layers win),
//! and the validation that runs once at start-up so a bad value is named
//! before anything is served. Behind the `cli` feature, [`CommandLine`]
//! is the same settings as `clap` arguments and loads all the layers.

#[cfg(feature = "cli")]
use std::collections::BTreeMap;
#[cfg(feature = "cli")]
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use url::Url;

use crate::delivery::RetryPolicy;
use crate::feed::{FeedConfig, TopicTemplate};
pub use crate::setting::{ConfigError, format_duration, parse_duration};
use crate::setting::{invalid, secs};

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
    /// The key that authorises fat pings and internal APIs (≥ 32 characters).
    pub internal_api_key: Option<String>,
    /// The header the internal key travels in.
    pub internal_api_key_header: String,
    /// The largest subscription or publish form accepted, in bytes.
    pub max_form_bytes: usize,
    /// The largest content accepted from a fat ping or a topic fetch, in
    /// bytes.
    pub max_content_bytes: usize,
    /// How often expired subscriptions are removed.
    pub reaper_interval: Duration,
    /// How often the dispatcher polls for due deliveries when nothing wakes it.
    pub poll_interval: Duration,
    /// Delete events (and their delivery records) older than this, hourly.
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
    /// Deliveries in flight at once to one callback host.
    pub per_host: usize,
    /// Delivery records claimed per round trip to the event log.
    pub batch_size: usize,
    /// A claim older than this is taken to be from a dead process and the
    /// delivery becomes claimable again.
    pub visibility_timeout: Duration,
}

/// Verification of intent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerificationPolicy {
    /// Time allowed for the callback to answer.
    pub timeout: Duration,
    /// Verifications in flight at once.
    pub concurrency: usize,
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
            internal_api_key: None,
            internal_api_key_header: crate::auth::DEFAULT_INTERNAL_API_KEY_HEADER.to_owned(),
            max_form_bytes: 64 * 1024,
            max_content_bytes: 16 * 1024 * 1024,
            reaper_interval: Duration::from_secs(60),
            poll_interval: Duration::from_secs(1),
            retention: None,
            user_token_key: None,
            user_token_header: crate::auth::DEFAULT_USER_TOKEN_HEADER.to_owned(),
            quota_url: None,
            quota_timeout: crate::quota::DEFAULT_TIMEOUT,
            quota_type: websub_store::OwnerQuota::DEFAULT_TYPE.to_owned(),
            feeds: Vec::new(),
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
            concurrency: 256,
            per_host: 64,
            batch_size: 500,
            visibility_timeout: Duration::from_secs(60),
        }
    }
}

impl Default for VerificationPolicy {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(10),
            concurrency: 64,
        }
    }
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
        if let Some(key) = &self.internal_api_key
            && key.chars().count() < 32
        {
            return Err(invalid(
                "internal-api-key",
                "<redacted>",
                format!(
                    "is {} characters; at least 32 are required",
                    key.chars().count()
                ),
            ));
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
            if self.internal_api_key.is_none() {
                return Err(invalid(
                    "quota-url",
                    url,
                    "needs internal-api-key: the subscriptions service is called with it",
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
        if self.reaper_interval.is_zero() {
            return Err(invalid(
                "reaper-interval",
                secs(self.reaper_interval),
                "must be positive",
            ));
        }
        Ok(())
    }
}

/// One layer of settings: the TOML file, the `WEBSUB_*` environment and the
/// flags are each read into one of these, and [`Settings::apply`] lays it
/// over what the layers below it gave.
///
/// Every field is optional (unset leaves the value below), and one name
/// serves every layer: `delivery_timeout` in the file, `--delivery-timeout`
/// on the command line, `WEBSUB_DELIVERY_TIMEOUT` in the environment.
/// Durations are strings like `"250ms"`, `"10s"`, `"5m"`, `"10d"`. The
/// outbox feeds (`[[feed]]`) come from the file alone.
///
/// The field docs are also the lines of `websubd --help`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Address to listen on.
    #[cfg_attr(feature = "cli", arg(long, value_name = "ADDRESS"))]
    pub listen: Option<SocketAddr>,
    /// The hub URL announced in rel="hub", exactly as given, ending with a
    /// slash; follows the listen address unless set.
    #[cfg_attr(feature = "cli", arg(long, value_name = "URL"))]
    pub public_url: Option<String>,
    /// The event log, and by default the subscriptions: sqlite:PATH or
    /// postgres://…; migrations run at start.
    #[cfg_attr(feature = "cli", arg(long, value_name = "URL"))]
    pub database_url: Option<String>,
    /// Where subscriptions live instead of the database: memory,
    /// sqlite:PATH, postgres://… or redis://….
    #[cfg_attr(feature = "cli", arg(long, value_name = "URL"))]
    pub store: Option<String>,
    /// Lease granted when the subscriber asks for none.
    #[cfg_attr(feature = "cli", arg(long, value_name = "DURATION"))]
    pub lease_default: Option<String>,
    /// Shortest lease granted; shorter requests are raised to it.
    #[cfg_attr(feature = "cli", arg(long, value_name = "DURATION"))]
    pub lease_min: Option<String>,
    /// Longest lease granted; longer requests are lowered to it.
    #[cfg_attr(feature = "cli", arg(long, value_name = "DURATION"))]
    pub lease_max: Option<String>,
    /// Time allowed for one delivery, connection included.
    #[cfg_attr(feature = "cli", arg(long, value_name = "DURATION"))]
    pub delivery_timeout: Option<String>,
    /// Retries after a failed delivery: the first at once, the last after
    /// the max backoff, doubling in between.
    #[cfg_attr(feature = "cli", arg(long, value_name = "N"))]
    pub delivery_retries: Option<u32>,
    /// Wait before the last retry.
    #[cfg_attr(feature = "cli", arg(long, value_name = "DURATION"))]
    pub delivery_max_backoff: Option<String>,
    /// Deliveries in flight at once, over all callbacks.
    #[cfg_attr(feature = "cli", arg(long, value_name = "N"))]
    pub delivery_concurrency: Option<usize>,
    /// Deliveries in flight at once to one callback host.
    #[cfg_attr(feature = "cli", arg(long, value_name = "N"))]
    pub delivery_per_host: Option<usize>,
    /// Delivery records claimed per round trip to the event log (1 to
    /// 10000).
    #[cfg_attr(feature = "cli", arg(long, value_name = "N"))]
    pub delivery_batch_size: Option<usize>,
    /// A delivery claimed by a process that died is claimed again after
    /// this; must exceed the delivery timeout.
    #[cfg_attr(feature = "cli", arg(long, value_name = "DURATION"))]
    pub visibility_timeout: Option<String>,
    /// How often due deliveries are looked for when nothing signals them.
    #[cfg_attr(feature = "cli", arg(long, value_name = "DURATION"))]
    pub poll_interval: Option<String>,
    /// Time allowed for a callback to answer a verification of intent.
    #[cfg_attr(feature = "cli", arg(long, value_name = "DURATION"))]
    pub verification_timeout: Option<String>,
    /// Verifications of intent in flight at once.
    #[cfg_attr(feature = "cli", arg(long, value_name = "N"))]
    pub verification_concurrency: Option<usize>,
    /// How often expired subscriptions are removed.
    #[cfg_attr(feature = "cli", arg(long, value_name = "DURATION"))]
    pub reaper_interval: Option<String>,
    /// Delete events and their delivery records older than this, hourly;
    /// kept for ever when unset.
    #[cfg_attr(feature = "cli", arg(long, value_name = "DURATION"))]
    pub retention: Option<String>,
    /// The largest subscription or publish form accepted, in bytes.
    #[cfg_attr(feature = "cli", arg(long, value_name = "BYTES"))]
    pub max_form_bytes: Option<usize>,
    /// The largest content accepted from a fat ping or a topic fetch, in
    /// bytes.
    #[cfg_attr(feature = "cli", arg(long, value_name = "BYTES"))]
    pub max_content_bytes: Option<usize>,
    /// Allow callbacks and topics on loopback, private, link-local or
    /// unique-local addresses (refused with 400 otherwise).
    // A bare `--allow-private-network` means true, as it always has; a
    // value is taken too, so a later layer can turn it off again.
    #[cfg_attr(
        feature = "cli",
        arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")
    )]
    pub allow_private_network: Option<bool>,
    /// The key for fat pings and the operator API (at least 32
    /// characters).
    #[cfg_attr(feature = "cli", arg(long, value_name = "KEY"))]
    pub internal_api_key: Option<String>,
    /// The header carrying the internal key.
    #[cfg_attr(feature = "cli", arg(long, value_name = "HEADER"))]
    pub internal_api_key_header: Option<String>,
    /// The HS256 key of user tokens, for the subscriber API and the quota.
    #[cfg_attr(feature = "cli", arg(long, value_name = "KEY"))]
    pub user_token_key: Option<String>,
    /// The header carrying the user token (as "Bearer TOKEN" in
    /// Authorization).
    #[cfg_attr(feature = "cli", arg(long, value_name = "HEADER"))]
    pub user_token_header: Option<String>,
    /// The subscriptions service that sets each subscriber's limit; the
    /// quota is enforced when set (needs the internal key and the user
    /// token key).
    #[cfg_attr(feature = "cli", arg(long, value_name = "URL"))]
    pub quota_url: Option<String>,
    /// Time allowed for the subscriptions service to answer.
    #[cfg_attr(feature = "cli", arg(long, value_name = "DURATION"))]
    pub quota_timeout: Option<String>,
    /// The quota type that caps a subscriber's subscriptions.
    #[cfg_attr(feature = "cli", arg(long, value_name = "NAME"))]
    pub quota_type: Option<String>,
    /// The outbox feeds, one `[[feed]]` table each; see [`HubConfig::feeds`].
    #[serde(default, skip_serializing)]
    #[cfg_attr(feature = "cli", arg(skip))]
    pub feed: Vec<FeedConfig>,
}

impl Settings {
    /// Reads and parses a TOML file.
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let failed = |reason: String| ConfigError::File {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|error| failed(error.to_string()))?;
        toml::from_str(&text).map_err(|error| failed(error.to_string()))
    }

    /// Lays every value this layer sets over `config`; what it leaves unset
    /// keeps the value below. Durations and URLs are parsed here, so a bad
    /// one is named whichever layer it came from.
    pub fn apply(self, config: &mut HubConfig) -> Result<(), ConfigError> {
        // Taken apart in full, so a setting cannot be read and never applied.
        let Self {
            listen,
            public_url,
            database_url,
            store,
            lease_default,
            lease_min,
            lease_max,
            delivery_timeout,
            delivery_retries,
            delivery_max_backoff,
            delivery_concurrency,
            delivery_per_host,
            delivery_batch_size,
            visibility_timeout,
            poll_interval,
            verification_timeout,
            verification_concurrency,
            reaper_interval,
            retention,
            max_form_bytes,
            max_content_bytes,
            allow_private_network,
            internal_api_key,
            internal_api_key_header,
            user_token_key,
            user_token_header,
            quota_url,
            quota_timeout,
            quota_type,
            feed,
        } = self;
        if let Some(listen) = listen {
            // The announced URL follows the address until some layer names
            // one: a URL still equal to the one the old address gives is
            // taken as derived, so a later `--listen` cannot undo a
            // `public_url` from the file.
            if config.public_url == public_url_for(config.listen) {
                config.public_url = public_url_for(listen);
            }
            config.listen = listen;
        }
        if let Some(url) = public_url {
            config.public_url = parse_public_url(&url)?;
        }
        set(&mut config.database_url, database_url);
        if store.is_some() {
            config.store = store;
        }
        let lease = &mut config.lease;
        set_duration(&mut lease.default, "lease-default", lease_default)?;
        set_duration(&mut lease.min, "lease-min", lease_min)?;
        set_duration(&mut lease.max, "lease-max", lease_max)?;
        let delivery = &mut config.delivery;
        set_duration(&mut delivery.timeout, "delivery-timeout", delivery_timeout)?;
        set(&mut delivery.retry.max_retries, delivery_retries);
        set_duration(
            &mut delivery.retry.max_backoff,
            "delivery-max-backoff",
            delivery_max_backoff,
        )?;
        set(&mut delivery.concurrency, delivery_concurrency);
        set(&mut delivery.per_host, delivery_per_host);
        set(&mut delivery.batch_size, delivery_batch_size);
        set_duration(
            &mut delivery.visibility_timeout,
            "visibility-timeout",
            visibility_timeout,
        )?;
        set_duration(&mut config.poll_interval, "poll-interval", poll_interval)?;
        set_duration(
            &mut config.verification.timeout,
            "verification-timeout",
            verification_timeout,
        )?;
        set(
            &mut config.verification.concurrency,
            verification_concurrency,
        );
        set_duration(
            &mut config.reaper_interval,
            "reaper-interval",
            reaper_interval,
        )?;
        if let Some(retention) = retention {
            config.retention = Some(parse_duration("retention", &retention)?);
        }
        set(&mut config.max_form_bytes, max_form_bytes);
        set(&mut config.max_content_bytes, max_content_bytes);
        set(&mut config.allow_private_network, allow_private_network);
        if internal_api_key.is_some() {
            config.internal_api_key = internal_api_key;
        }
        set(&mut config.internal_api_key_header, internal_api_key_header);
        if user_token_key.is_some() {
            config.user_token_key = user_token_key;
        }
        set(&mut config.user_token_header, user_token_header);
        if let Some(url) = quota_url {
            config.quota_url = Some(parse_quota_url(&url)?);
        }
        set_duration(&mut config.quota_timeout, "quota-timeout", quota_timeout)?;
        set(&mut config.quota_type, quota_type);
        if !feed.is_empty() {
            config.feeds = feed;
        }
        Ok(())
    }

    /// Every value this layer sets, as text, by field name (which is also
    /// the clap argument's id).
    #[cfg(feature = "cli")]
    fn values(&self) -> BTreeMap<String, String> {
        let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(self) else {
            return BTreeMap::new();
        };
        fields
            .into_iter()
            .filter_map(|(name, value)| match value {
                serde_json::Value::Null => None,
                serde_json::Value::String(text) => Some((name, text)),
                other => Some((name, other.to_string())),
            })
            .collect()
    }
}

/// The settings that give `config` when laid over the defaults: each
/// value written the way the file and the flags take it.
impl From<&HubConfig> for Settings {
    fn from(config: &HubConfig) -> Self {
        // Taken apart in full, so a new field of the configuration is a
        // compile error here until it has a setting.
        let HubConfig {
            listen,
            public_url,
            database_url,
            store,
            lease,
            delivery,
            verification,
            allow_private_network,
            internal_api_key,
            internal_api_key_header,
            max_form_bytes,
            max_content_bytes,
            reaper_interval,
            poll_interval,
            retention,
            user_token_key,
            user_token_header,
            quota_url,
            quota_timeout,
            quota_type,
            feeds,
        } = config;
        let LeasePolicy { default, min, max } = lease;
        let DeliveryPolicy {
            timeout,
            retry,
            concurrency,
            per_host,
            batch_size,
            visibility_timeout,
        } = delivery;
        let RetryPolicy {
            max_retries,
            max_backoff,
        } = retry;
        let VerificationPolicy {
            timeout: verification_timeout,
            concurrency: verification_concurrency,
        } = verification;
        let duration = |duration: &Duration| Some(format_duration(*duration));
        Self {
            listen: Some(*listen),
            public_url: Some(public_url.to_string()),
            database_url: Some(database_url.clone()),
            store: store.clone(),
            lease_default: duration(default),
            lease_min: duration(min),
            lease_max: duration(max),
            delivery_timeout: duration(timeout),
            delivery_retries: Some(*max_retries),
            delivery_max_backoff: duration(max_backoff),
            delivery_concurrency: Some(*concurrency),
            delivery_per_host: Some(*per_host),
            delivery_batch_size: Some(*batch_size),
            visibility_timeout: duration(visibility_timeout),
            poll_interval: duration(poll_interval),
            verification_timeout: duration(verification_timeout),
            verification_concurrency: Some(*verification_concurrency),
            reaper_interval: duration(reaper_interval),
            retention: retention.as_ref().and_then(duration),
            max_form_bytes: Some(*max_form_bytes),
            max_content_bytes: Some(*max_content_bytes),
            allow_private_network: Some(*allow_private_network),
            internal_api_key: internal_api_key.clone(),
            internal_api_key_header: Some(internal_api_key_header.clone()),
            user_token_key: user_token_key.clone(),
            user_token_header: Some(user_token_header.clone()),
            quota_url: quota_url.as_ref().map(Url::to_string),
            quota_timeout: duration(quota_timeout),
            quota_type: Some(quota_type.clone()),
            feed: feeds.clone(),
        }
    }
}

impl HubConfig {
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

/// Parses the subscriptions service's base URL, naming it when it is bad.
fn parse_quota_url(value: &str) -> Result<Url, ConfigError> {
    Url::parse(value).map_err(|error| invalid("quota-url", value, error.to_string()))
}

/// Parses a public hub URL: absolute http(s), ending with a slash.
fn parse_public_url(value: &str) -> Result<Url, ConfigError> {
    let url = Url::parse(value).map_err(|error| invalid("public-url", value, error.to_string()))?;
    if !url.path().ends_with('/') {
        return Err(invalid("public-url", value, "must end with a slash"));
    }
    Ok(url)
}

fn set<T>(field: &mut T, value: Option<T>) {
    if let Some(value) = value {
        *field = value;
    }
}

fn set_duration(
    field: &mut Duration,
    setting: &'static str,
    value: Option<String>,
) -> Result<(), ConfigError> {
    if let Some(value) = value {
        *field = parse_duration(setting, &value)?;
    }
    Ok(())
}

/// A hub binary's command line: `--config FILE` and every [`Settings`]
/// field as a flag, each also read from the environment variable named
/// after it (`--delivery-timeout` is `WEBSUB_DELIVERY_TIMEOUT`).
///
/// The variables are not clap's own `env` arguments: clap reads those from
/// the process environment as the command is built, so nothing could hand
/// it another, and a bad value would be blamed on the flag. They are looked
/// up through the function given to [`CommandLine::load`] and parsed as
/// their flags are, into a layer of their own.
///
/// ```
/// use websub_hub::config::CommandLine;
///
/// let command = clap::Command::new("websubd");
/// let config = CommandLine::load(command, ["websubd", "--delivery-retries", "3"], |name| {
///     (name == "WEBSUB_DELIVERY_RETRIES").then(|| "5".into())
/// })
/// .expect("valid");
/// assert_eq!(config.delivery.retry.max_retries, 3, "the flag beats the environment");
/// ```
#[cfg(feature = "cli")]
#[derive(Debug, Clone, Default, clap::Args)]
pub struct CommandLine {
    /// The TOML file: the layer below the environment and the flags.
    #[arg(
        long,
        value_name = "FILE",
        help = "A TOML file with any of the settings below, named with underscores \
                (delivery_timeout = \"5s\"), and the outbox feeds as [[feed]] tables"
    )]
    pub config: Option<std::path::PathBuf>,
    /// The flags (or the environment variables) themselves.
    #[command(flatten)]
    pub settings: Settings,
}

/// Why [`CommandLine::load`] gave no configuration.
#[cfg(feature = "cli")]
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The flags are malformed, or ask for the help or the version;
    /// [`clap::Error::exit`] prints it and exits with the right status.
    #[error(transparent)]
    Command(#[from] clap::Error),
    /// A setting is bad, or the file cannot be read; the error names it.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// The environment variable a flag is also read from.
#[cfg(feature = "cli")]
fn variable_of(long: &str) -> String {
    format!("WEBSUB_{}", long.to_ascii_uppercase().replace('-', "_"))
}

#[cfg(feature = "cli")]
impl CommandLine {
    /// `command` with every argument added, each help line naming its
    /// environment variable and its default (from [`HubConfig::default`],
    /// so the help cannot drift from what the hub does).
    pub fn command(command: clap::Command) -> clap::Command {
        use clap::Args;
        let defaults = Settings::from(&HubConfig::default()).values();
        // The derive makes these types' docs the command's about text; the
        // binary's own is put back.
        let about = command.get_about().cloned();
        let long_about = command.get_long_about().cloned();
        let mut command = Self::augment_args(command)
            .about(None::<&str>)
            .long_about(None::<&str>);
        if let Some(about) = about {
            command = command.about(about);
        }
        if let Some(long_about) = long_about {
            command = command.long_about(long_about);
        }
        command.mut_args(|arg| {
            let Some(long) = arg.get_long() else {
                return arg;
            };
            let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
            let default = defaults
                .get(arg.get_id().as_str())
                .map_or("none", String::as_str);
            let variable = variable_of(long);
            arg.help(format!("{help} [env: {variable}] [default: {default}]"))
        })
    }

    /// The configuration `args` (the program name first) and the
    /// environment give: the defaults, then the file (`--config` or
    /// `WEBSUB_CONFIG`), then the `WEBSUB_*` variables, then the flags,
    /// later layers winning, validated once.
    ///
    /// `command` is the bare binary (its name, version and about); `env`
    /// looks a variable up (`std::env::var_os`, or a map in tests). Empty
    /// variables count as unset.
    pub fn load<I, T>(
        command: clap::Command,
        args: I,
        env: impl Fn(&str) -> Option<OsString>,
    ) -> Result<HubConfig, LoadError>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        use clap::FromArgMatches;
        let command = Self::command(command);
        // The flags first, so `--help` answers even beside a bad variable.
        let flags = Self::from_arg_matches(&command.clone().try_get_matches_from(args)?)?;
        let env = Self::from_env(&command, env)?;
        let file = match flags.config.as_ref().or(env.config.as_ref()) {
            Some(path) => Some(Settings::read(path)?),
            None => None,
        };
        Ok(HubConfig::layered(
            file.into_iter().chain([env.settings, flags.settings]),
        )?)
    }

    /// The environment layer. Each variable set is handed to the same
    /// parser as its flag (`--name=value`), so a value means the same in
    /// both; a value that does not parse is named by its variable.
    fn from_env(
        command: &clap::Command,
        env: impl Fn(&str) -> Option<OsString>,
    ) -> Result<Self, ConfigError> {
        use clap::FromArgMatches;
        let mut args = vec![OsString::from(command.get_name())];
        let mut read = Vec::new();
        for arg in command.get_arguments() {
            let Some(long) = arg.get_long() else {
                continue;
            };
            if !arg.get_action().takes_values() {
                continue;
            }
            let variable = variable_of(long);
            let Some(value) = env(&variable).filter(|value| !value.is_empty()) else {
                continue;
            };
            let Some(value) = value.to_str().map(str::to_owned) else {
                return Err(ConfigError::Environment {
                    variable,
                    value: value.to_string_lossy().into_owned(),
                    reason: "is not UTF-8".to_owned(),
                });
            };
            args.push(OsString::from(format!("--{long}={value}")));
            read.push((format!("--{long}"), variable, value));
        }
        let refused = |error: clap::Error| {
            let flag = match error.get(clap::error::ContextKind::InvalidArg) {
                Some(clap::error::ContextValue::String(arg)) => {
                    arg.split_whitespace().next().map(str::to_owned)
                }
                _ => None,
            };
            let (variable, value) = read
                .iter()
                .find(|(long, _, _)| Some(long) == flag.as_ref())
                .map_or_else(
                    || ("WEBSUB_*".to_owned(), String::new()),
                    |(_, variable, value)| (variable.clone(), value.clone()),
                );
            let reason = std::error::Error::source(&error)
                .map_or_else(|| error.kind().to_string(), ToString::to_string);
            ConfigError::Environment {
                variable,
                value,
                reason,
            }
        };
        let matches = command
            .clone()
            .try_get_matches_from(args)
            .map_err(&refused)?;
        Self::from_arg_matches(&matches).map_err(refused)
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

    #[test]
    fn file_values_apply_and_unknown_keys_are_refused() {
        let file: Settings = toml::from_str(
            "listen = \"127.0.0.1:9000\"\nlease_default = \"1d\"\ndelivery_retries = 3\n",
        )
        .expect("parse");
        let mut config = HubConfig::default();
        file.apply(&mut config).expect("apply");
        assert_eq!(config.public_url.as_str(), "http://127.0.0.1:9000/");
        assert_eq!(config.lease.default, Duration::from_secs(86_400));
        assert_eq!(config.delivery.retry.max_retries, 3);
        assert!(toml::from_str::<Settings>("lease = 1").is_err());
    }

    /// A configuration with every field away from its default, and valid.
    /// Written out in full (no `..`), so a new field must be added here.
    fn every_field_changed() -> HubConfig {
        HubConfig {
            listen: SocketAddr::from(([127, 0, 0, 2], 9001)),
            public_url: Url::parse("https://hub.example/websub/").expect("url"),
            database_url: "postgres://hub@db.example/events".to_owned(),
            store: Some("redis://cache.example/".to_owned()),
            lease: LeasePolicy {
                default: Duration::from_secs(2 * 86_400),
                min: Duration::from_secs(120),
                max: Duration::from_secs(30 * 86_400),
            },
            delivery: DeliveryPolicy {
                timeout: Duration::from_secs(7),
                retry: RetryPolicy {
                    max_retries: 4,
                    max_backoff: Duration::from_millis(2500),
                },
                concurrency: 100,
                per_host: 9,
                batch_size: 42,
                visibility_timeout: Duration::from_secs(90),
            },
            verification: VerificationPolicy {
                timeout: Duration::from_secs(3),
                concurrency: 11,
            },
            allow_private_network: true,
            internal_api_key: Some("an-internal-key-of-at-least-32-characters".to_owned()),
            internal_api_key_header: "X-Service-Key".to_owned(),
            max_form_bytes: 1000,
            max_content_bytes: 2000,
            reaper_interval: Duration::from_secs(5 * 60),
            poll_interval: Duration::from_millis(200),
            retention: Some(Duration::from_secs(7 * 86_400)),
            user_token_key: Some("user-token-key".to_owned()),
            user_token_header: "X-User-Token".to_owned(),
            quota_url: Some(Url::parse("http://quota.example/api/").expect("url")),
            quota_timeout: Duration::from_millis(750),
            quota_type: "feeds".to_owned(),
            // Feeds come from the file alone; see the layering test.
            feeds: Vec::new(),
        }
    }

    #[test]
    fn every_field_is_settable_from_the_file() {
        let expected = every_field_changed();
        expected
            .validate()
            .expect("the changed configuration is valid");
        let text = toml::to_string(&Settings::from(&expected)).expect("serialise");
        let file: Settings = toml::from_str(&text).expect("parse");
        let config = HubConfig::layered([file]).expect("valid");
        assert_eq!(format!("{config:?}"), format!("{expected:?}"), "{text}");
    }

    #[test]
    fn the_new_settings_have_their_names_in_the_file() {
        let file: Settings = toml::from_str(
            "max_form_bytes = 1000\nmax_content_bytes = 2000\nreaper_interval = \"5m\"\n\
             verification_timeout = \"3s\"\nverification_concurrency = 11\n\
             delivery_batch_size = 42\nvisibility_timeout = \"90s\"\n",
        )
        .expect("parse");
        let config = HubConfig::layered([file]).expect("valid");
        assert_eq!(config.max_form_bytes, 1000);
        assert_eq!(config.max_content_bytes, 2000);
        assert_eq!(config.reaper_interval, Duration::from_secs(300));
        assert_eq!(config.verification.timeout, Duration::from_secs(3));
        assert_eq!(config.verification.concurrency, 11);
        assert_eq!(config.delivery.batch_size, 42);
        assert_eq!(config.delivery.visibility_timeout, Duration::from_secs(90));
    }

    #[test]
    fn a_later_listen_address_keeps_a_public_url_named_below() {
        let file: Settings =
            toml::from_str("public_url = \"https://hub.example/\"").expect("parse");
        let flags = Settings {
            listen: Some(SocketAddr::from(([0, 0, 0, 0], 9000))),
            ..Settings::default()
        };
        let config = HubConfig::layered([file, flags]).expect("valid");
        assert_eq!(config.public_url.as_str(), "https://hub.example/");

        let flags = Settings {
            listen: Some(SocketAddr::from(([0, 0, 0, 0], 9000))),
            ..Settings::default()
        };
        let config = HubConfig::layered([Settings::default(), flags]).expect("valid");
        assert_eq!(config.public_url.as_str(), "http://127.0.0.1:9000/");
    }

    #[test]
    fn a_bad_file_value_names_its_setting() {
        for (text, setting) in [
            ("verification_timeout = \"soon\"", "verification-timeout"),
            ("reaper_interval = \"0s\"", "reaper-interval"),
            ("delivery_batch_size = 0", "delivery-batch-size"),
            ("max_form_bytes = 0", "max-form-bytes"),
            ("quota_url = \"not a url\"", "quota-url"),
        ] {
            let file: Settings = toml::from_str(text).expect("parse");
            match HubConfig::layered([file]) {
                Err(ConfigError::Invalid { setting: named, .. }) => {
                    assert_eq!(named, setting, "{text}");
                }
                other => panic!("{text}: {other:?}"),
            }
        }
        let wrong_type =
            toml::from_str::<Settings>("delivery_batch_size = \"many\"").expect_err("not a number");
        assert!(
            wrong_type.to_string().contains("delivery_batch_size"),
            "{wrong_type}"
        );
    }

    #[cfg(feature = "cli")]
    mod command_line {
        use std::collections::HashMap;

        use clap::error::{ContextKind, ContextValue, ErrorKind};

        use super::*;

        fn websubd() -> clap::Command {
            clap::Command::new("websubd")
        }

        fn no_env(_: &str) -> Option<OsString> {
            None
        }

        fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> + use<> {
            let vars: HashMap<String, OsString> = vars
                .iter()
                .map(|(name, value)| ((*name).to_owned(), OsString::from(value)))
                .collect();
            move |name| vars.get(name).cloned()
        }

        fn load(
            args: &[&str],
            env: impl Fn(&str) -> Option<OsString>,
        ) -> Result<HubConfig, LoadError> {
            let args = std::iter::once("websubd").chain(args.iter().copied());
            CommandLine::load(websubd(), args, env)
        }

        /// Every setting of `config` as (flag, value) pairs.
        fn pairs(config: &HubConfig) -> Vec<(String, String)> {
            Settings::from(config)
                .values()
                .into_iter()
                .map(|(name, value)| (name.replace('_', "-"), value))
                .collect()
        }

        struct Scratch(std::path::PathBuf);

        impl Scratch {
            fn file(text: &str) -> Self {
                let path = std::env::temp_dir()
                    .join(format!("websub-config-{}.toml", uuid::Uuid::new_v4()));
                std::fs::write(&path, text).expect("write the file");
                Self(path)
            }

            fn path(&self) -> &str {
                self.0.to_str().expect("a UTF-8 temporary path")
            }
        }

        impl Drop for Scratch {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }

        #[test]
        fn the_file_then_the_environment_then_the_flags() {
            let file = Scratch::file(
                "delivery_timeout = \"3s\"\ndelivery_retries = 3\npoll_interval = \"3s\"\n\
                 allow_private_network = true\n\
                 [[feed]]\ndatabase_url = \"postgres://producer@db.example/app\"\n",
            );
            let env = env_of(&[
                ("WEBSUB_CONFIG", file.path()),
                ("WEBSUB_DELIVERY_RETRIES", "4"),
                ("WEBSUB_POLL_INTERVAL", "4s"),
                ("WEBSUB_QUOTA_TYPE", ""),
            ]);
            let config = load(
                &["--poll-interval", "5s", "--allow-private-network=false"],
                env,
            )
            .expect("valid");
            assert_eq!(config.delivery.timeout, Duration::from_secs(3), "file");
            assert_eq!(config.delivery.retry.max_retries, 4, "env over file");
            assert_eq!(
                config.poll_interval,
                Duration::from_secs(5),
                "flag over env"
            );
            assert!(!config.allow_private_network, "flag over file");
            assert_eq!(config.feeds.len(), 1, "feeds from the file stay");
            assert_eq!(
                config.quota_type,
                HubConfig::default().quota_type,
                "an empty variable is unset"
            );

            // `--config` beats `WEBSUB_CONFIG` like any flag.
            let other = Scratch::file("delivery_timeout = \"6s\"\n");
            let env = env_of(&[("WEBSUB_CONFIG", file.path())]);
            let config = load(&["--config", other.path()], env).expect("valid");
            assert_eq!(config.delivery.timeout, Duration::from_secs(6));
        }

        #[test]
        fn every_field_is_settable_from_flags_and_from_the_environment() {
            let expected = every_field_changed();
            let pairs = pairs(&expected);
            let flags: Vec<String> = pairs
                .iter()
                .map(|(flag, value)| format!("--{flag}={value}"))
                .collect();
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            let config = load(&flags, no_env).expect("valid");
            assert_eq!(format!("{config:?}"), format!("{expected:?}"), "{flags:?}");

            let vars: Vec<(String, String)> = pairs
                .iter()
                .map(|(flag, value)| (variable_of(flag), value.clone()))
                .collect();
            let vars: Vec<(&str, &str)> = vars
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_str()))
                .collect();
            let config = load(&[], env_of(&vars)).expect("valid");
            assert_eq!(format!("{config:?}"), format!("{expected:?}"), "{vars:?}");
        }

        #[test]
        fn the_new_settings_have_their_flags() {
            let config = load(
                &[
                    "--max-form-bytes",
                    "1000",
                    "--max-content-bytes",
                    "2000",
                    "--reaper-interval",
                    "5m",
                    "--verification-timeout",
                    "3s",
                    "--verification-concurrency",
                    "11",
                    "--delivery-batch-size",
                    "42",
                ],
                no_env,
            )
            .expect("valid");
            assert_eq!(config.max_form_bytes, 1000);
            assert_eq!(config.max_content_bytes, 2000);
            assert_eq!(config.reaper_interval, Duration::from_secs(300));
            assert_eq!(config.verification.timeout, Duration::from_secs(3));
            assert_eq!(config.verification.concurrency, 11);
            assert_eq!(config.delivery.batch_size, 42);
        }

        #[test]
        fn allow_private_network_is_a_bare_flag_or_a_value() {
            let config = load(
                &["--allow-private-network", "--poll-interval", "2s"],
                no_env,
            )
            .expect("valid");
            assert!(config.allow_private_network);
            assert_eq!(config.poll_interval, Duration::from_secs(2));
            let env = env_of(&[("WEBSUB_ALLOW_PRIVATE_NETWORK", "true")]);
            assert!(load(&[], env).expect("valid").allow_private_network);
            let env = env_of(&[("WEBSUB_ALLOW_PRIVATE_NETWORK", "true")]);
            let config = load(&["--allow-private-network", "false"], env).expect("valid");
            assert!(!config.allow_private_network);
            assert!(!load(&[], no_env).expect("valid").allow_private_network);
        }

        #[test]
        fn a_bad_flag_or_variable_names_its_setting() {
            match load(&["--delivery-batch-size", "many"], no_env) {
                Err(LoadError::Command(error)) => {
                    assert_eq!(error.kind(), ErrorKind::ValueValidation);
                    assert!(
                        matches!(
                            error.get(ContextKind::InvalidArg),
                            Some(ContextValue::String(arg)) if arg.starts_with("--delivery-batch-size")
                        ),
                        "{error}"
                    );
                }
                other => panic!("{other:?}"),
            }
            match load(&["--verification-timeout", "soon"], no_env) {
                Err(LoadError::Config(ConfigError::Invalid { setting, .. })) => {
                    assert_eq!(setting, "verification-timeout");
                }
                other => panic!("{other:?}"),
            }
            let env = env_of(&[
                ("WEBSUB_DELIVERY_RETRIES", "2"),
                ("WEBSUB_VERIFICATION_CONCURRENCY", "lots"),
            ]);
            match load(&[], env) {
                Err(LoadError::Config(ConfigError::Environment {
                    variable, value, ..
                })) => {
                    assert_eq!(variable, "WEBSUB_VERIFICATION_CONCURRENCY");
                    assert_eq!(value, "lots");
                }
                other => panic!("{other:?}"),
            }
            let env = env_of(&[("WEBSUB_LISTEN", "nowhere")]);
            assert!(matches!(
                load(&[], env),
                Err(LoadError::Config(ConfigError::Environment { variable, .. }))
                    if variable == "WEBSUB_LISTEN"
            ));
            // Every layer is checked, even where a later one overrides it.
            let env = env_of(&[("WEBSUB_DELIVERY_RETRIES", "x")]);
            assert!(matches!(
                load(&["--delivery-retries", "2"], env),
                Err(LoadError::Config(ConfigError::Environment { .. }))
            ));
        }

        #[test]
        fn the_help_names_every_setting_with_its_variable_and_default() {
            let mut command = CommandLine::command(websubd());
            let help = command.render_long_help().to_string();
            let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
            let defaults = pairs(&HubConfig::default());
            let mut longs = Vec::new();
            for arg in command.get_arguments() {
                let Some(long) = arg.get_long() else {
                    continue;
                };
                if !arg.get_action().takes_values() {
                    continue;
                }
                longs.push(long.to_owned());
                let at = help
                    .find(&format!("--{long} "))
                    .unwrap_or_else(|| panic!("--{long} missing: {help}"));
                let rest = &help[at..];
                let shown = |label: &str| {
                    rest.split(label)
                        .nth(1)
                        .and_then(|tail| tail.split(']').next())
                };
                assert_eq!(
                    shown("[env: "),
                    Some(variable_of(long).as_str()),
                    "--{long}"
                );
                let default = defaults
                    .iter()
                    .find(|(flag, _)| flag == long)
                    .map_or("none", |(_, value)| value.as_str());
                assert_eq!(shown("[default: "), Some(default), "--{long}");
            }
            // Every setting but the feeds, and the file.
            assert_eq!(longs.len(), pairs(&every_field_changed()).len() + 1);
        }
    }
}

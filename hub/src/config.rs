//! The hub's configuration: every setting with its default, the TOML file
//! format, and the validation that runs once at start-up so a bad value is
//! named before anything is served.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;
use url::Url;

use crate::delivery::RetryPolicy;
pub use crate::setting::{ConfigError, parse_duration};
use crate::setting::{invalid, secs};

/// Everything a hub needs to run. Build it with [`HubConfig::default`] (the
/// embedded default), adjust fields, and call [`HubConfig::validate`].
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
    pub feeds: Vec<crate::feed::FeedConfig>,
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
            internal_api_key_header: "X-Internal-API-Key".to_owned(),
            max_form_bytes: 64 * 1024,
            max_content_bytes: 16 * 1024 * 1024,
            reaper_interval: Duration::from_secs(60),
            poll_interval: Duration::from_secs(1),
            retention: None,
            user_token_key: None,
            user_token_header: "Authorization".to_owned(),
            quota_url: None,
            quota_timeout: Duration::from_secs(5),
            quota_type: "websub_subscriptions".to_owned(),
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
            let template = crate::feed::TopicTemplate::parse(&feed.topic_template)?;
            template.check(&self.public_url)?;
        }
        if self.poll_interval.is_zero() {
            return Err(invalid(
                "poll-interval",
                secs(self.poll_interval),
                "must be positive",
            ));
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

/// The TOML configuration file: every field optional, the same names as the
/// command-line flags (with underscores). Durations are strings like `"10s"`,
/// `"5m"`, `"10d"`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// See [`HubConfig::listen`].
    pub listen: Option<SocketAddr>,
    /// See [`HubConfig::public_url`].
    pub public_url: Option<String>,
    /// See [`HubConfig::database_url`].
    pub database_url: Option<String>,
    /// See [`HubConfig::store`].
    pub store: Option<String>,
    /// See [`LeasePolicy::default`].
    pub lease_default: Option<String>,
    /// See [`LeasePolicy::min`].
    pub lease_min: Option<String>,
    /// See [`LeasePolicy::max`].
    pub lease_max: Option<String>,
    /// See [`DeliveryPolicy::timeout`].
    pub delivery_timeout: Option<String>,
    /// See [`RetryPolicy::max_retries`].
    pub delivery_retries: Option<u32>,
    /// See [`RetryPolicy::max_backoff`].
    pub delivery_max_backoff: Option<String>,
    /// See [`DeliveryPolicy::concurrency`].
    pub delivery_concurrency: Option<usize>,
    /// See [`DeliveryPolicy::per_host`].
    pub delivery_per_host: Option<usize>,
    /// See [`DeliveryPolicy::visibility_timeout`].
    pub visibility_timeout: Option<String>,
    /// See [`HubConfig::poll_interval`].
    pub poll_interval: Option<String>,
    /// See [`HubConfig::allow_private_network`].
    pub allow_private_network: Option<bool>,
    /// See [`HubConfig::internal_api_key`].
    pub internal_api_key: Option<String>,
    /// See [`HubConfig::internal_api_key_header`].
    pub internal_api_key_header: Option<String>,
    /// See [`HubConfig::retention`].
    pub retention: Option<String>,
    /// See [`HubConfig::user_token_key`].
    pub user_token_key: Option<String>,
    /// See [`HubConfig::user_token_header`].
    pub user_token_header: Option<String>,
    /// See [`HubConfig::quota_url`].
    pub quota_url: Option<String>,
    /// See [`HubConfig::quota_timeout`].
    pub quota_timeout: Option<String>,
    /// See [`HubConfig::quota_type`].
    pub quota_type: Option<String>,
    /// See [`HubConfig::feeds`]: one `[[feed]]` table each.
    #[serde(default)]
    pub feed: Vec<crate::feed::FeedConfig>,
}

impl FileConfig {
    /// Reads and parses a TOML file.
    pub fn read(path: &str) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::File {
            path: path.to_owned(),
            reason: error.to_string(),
        })?;
        toml::from_str(&text).map_err(|error| ConfigError::File {
            path: path.to_owned(),
            reason: error.to_string(),
        })
    }

    /// Applies every value the file sets onto `config`.
    pub fn apply(self, config: &mut HubConfig) -> Result<(), ConfigError> {
        if let Some(listen) = self.listen {
            config.listen = listen;
            config.public_url = public_url_for(listen);
        }
        if let Some(url) = self.public_url {
            config.public_url = parse_public_url(&url)?;
        }
        set(&mut config.database_url, self.database_url);
        if self.store.is_some() {
            config.store = self.store;
        }
        set_duration(
            &mut config.lease.default,
            "lease-default",
            self.lease_default,
        )?;
        set_duration(&mut config.lease.min, "lease-min", self.lease_min)?;
        set_duration(&mut config.lease.max, "lease-max", self.lease_max)?;
        set_duration(
            &mut config.delivery.timeout,
            "delivery-timeout",
            self.delivery_timeout,
        )?;
        set(
            &mut config.delivery.retry.max_retries,
            self.delivery_retries,
        );
        set_duration(
            &mut config.delivery.retry.max_backoff,
            "delivery-max-backoff",
            self.delivery_max_backoff,
        )?;
        set(&mut config.delivery.concurrency, self.delivery_concurrency);
        set_duration(
            &mut config.delivery.visibility_timeout,
            "visibility-timeout",
            self.visibility_timeout,
        )?;
        set_duration(
            &mut config.poll_interval,
            "poll-interval",
            self.poll_interval,
        )?;
        set(&mut config.delivery.per_host, self.delivery_per_host);
        set(
            &mut config.allow_private_network,
            self.allow_private_network,
        );
        if self.internal_api_key.is_some() {
            config.internal_api_key = self.internal_api_key;
        }
        set(
            &mut config.internal_api_key_header,
            self.internal_api_key_header,
        );
        if let Some(retention) = self.retention {
            config.retention = Some(parse_duration("retention", &retention)?);
        }
        if self.user_token_key.is_some() {
            config.user_token_key = self.user_token_key;
        }
        set(&mut config.user_token_header, self.user_token_header);
        if let Some(url) = self.quota_url {
            config.quota_url = Some(parse_quota_url(&url)?);
        }
        set_duration(
            &mut config.quota_timeout,
            "quota-timeout",
            self.quota_timeout,
        )?;
        set(&mut config.quota_type, self.quota_type);
        if !self.feed.is_empty() {
            config.feeds = self.feed;
        }
        Ok(())
    }
}

/// Parses the subscriptions service's base URL, naming it when it is bad.
pub fn parse_quota_url(value: &str) -> Result<Url, ConfigError> {
    Url::parse(value).map_err(|error| invalid("quota-url", value, error.to_string()))
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

/// Parses a public hub URL: absolute http(s), ending with a slash.
pub fn parse_public_url(value: &str) -> Result<Url, ConfigError> {
    let url = Url::parse(value).map_err(|error| invalid("public-url", value, error.to_string()))?;
    if !url.path().ends_with('/') {
        return Err(invalid("public-url", value, "must end with a slash"));
    }
    Ok(url)
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
        let file: FileConfig = toml::from_str(
            "listen = \"127.0.0.1:9000\"\nlease_default = \"1d\"\ndelivery_retries = 3\n",
        )
        .expect("parse");
        let mut config = HubConfig::default();
        file.apply(&mut config).expect("apply");
        assert_eq!(config.public_url.as_str(), "http://127.0.0.1:9000/");
        assert_eq!(config.lease.default, Duration::from_secs(86_400));
        assert_eq!(config.delivery.retry.max_retries, 3);
        assert!(toml::from_str::<FileConfig>("lease = 1").is_err());
    }
}

//! The one settings layer: every setting optional, one name for the file,
//! the environment and the flags, laid over the layers below it; and the
//! settings a configuration stands for, which the help shows as defaults.

#[cfg(feature = "cli")]
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use url::Url;

use crate::config::text::{ConfigError, format_duration, invalid, parse_duration};
use crate::delivery::RetryPolicy;
use crate::intake::feed::FeedConfig;

use super::{
    DeliveryPolicy, HubConfig, LeasePolicy, LogFormat, VerificationPolicy, public_url_for,
};

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
    /// The most deliveries in flight at once to one callback host: each
    /// host's limit starts at 8 and adapts to how it answers, up to this.
    #[cfg_attr(feature = "cli", arg(long, value_name = "N"))]
    pub delivery_per_host: Option<usize>,
    /// The least a callback host's adaptive in-flight limit falls to.
    #[cfg_attr(feature = "cli", arg(long, value_name = "N"))]
    pub delivery_per_host_min: Option<usize>,
    /// The most deliveries started per second to one callback host, evenly
    /// spaced (0, the default: no limit beside the in-flight one).
    #[cfg_attr(feature = "cli", arg(long, value_name = "N"))]
    pub delivery_per_host_rate: Option<u32>,
    /// Idle keep-alive connections kept in all to callback hosts with no
    /// delivery under way (up to delivery-per-host per host); the hosts
    /// idle longest close theirs first.
    #[cfg_attr(feature = "cli", arg(long, value_name = "N"))]
    pub delivery_idle_connections: Option<usize>,
    /// Deliveries to one callback that exhaust their retries in a row before
    /// the callback is disabled (its new deliveries are then skipped until
    /// an operator enables it); 0, the default, never disables this way.
    #[cfg_attr(feature = "cli", arg(long, value_name = "N"))]
    pub disable_endpoint_after: Option<u32>,
    /// Failed attempts in a row to one callback that open its breaker: its
    /// deliveries then wait, without spending retries, while the next one
    /// probes it; 0 never opens one.
    #[cfg_attr(feature = "cli", arg(long, value_name = "N"))]
    pub endpoint_open_after: Option<u32>,
    /// How long a callback's breaker stays open (the callback failing all
    /// along) before the callback is disabled and its deliveries skipped
    /// until an operator enables it; 0 never disables.
    #[cfg_attr(feature = "cli", arg(long, value_name = "DURATION"))]
    pub endpoint_disable_after: Option<String>,
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
    /// Attempts a verification of intent gets when the callback cannot be
    /// reached, times out or answers 5xx.
    #[cfg_attr(feature = "cli", arg(long, value_name = "N"))]
    pub verification_attempts: Option<u32>,
    /// The wait before a verification's first retry; later ones double it.
    #[cfg_attr(feature = "cli", arg(long, value_name = "DURATION"))]
    pub verification_retry_wait: Option<String>,
    /// Verifications of intent waiting at most; past it subscribe answers
    /// 503.
    #[cfg_attr(feature = "cli", arg(long, value_name = "N"))]
    pub max_pending_verifications: Option<u64>,
    /// How log lines are written: text, or json (one object per line).
    #[cfg_attr(feature = "cli", arg(long, value_name = "FORMAT"))]
    pub log_format: Option<LogFormat>,
    /// How often expired subscriptions are removed.
    #[cfg_attr(feature = "cli", arg(long, value_name = "DURATION"))]
    pub reaper_interval: Option<String>,
    /// Delete events, their delivery records and attempts, and endpoint
    /// changes older than this (default 14d); `none` keeps everything.
    #[cfg_attr(feature = "cli", arg(long, value_name = "DURATION"))]
    pub retention: Option<String>,
    /// The largest subscription or publish form accepted, in bytes.
    #[cfg_attr(feature = "cli", arg(long, value_name = "BYTES"))]
    pub max_form_bytes: Option<usize>,
    /// The largest content accepted from a fat ping or a topic fetch, in
    /// bytes.
    #[cfg_attr(feature = "cli", arg(long, value_name = "BYTES"))]
    pub max_content_bytes: Option<usize>,
    /// Time a request head has to arrive, from the connection's accept or
    /// the first byte of a later request on it; also the longest a request
    /// body may stall.
    #[cfg_attr(feature = "cli", arg(long, value_name = "DURATION"))]
    pub header_read_timeout: Option<String>,
    /// Time a kept-alive connection may wait for its next request.
    #[cfg_attr(feature = "cli", arg(long, value_name = "DURATION"))]
    pub idle_timeout: Option<String>,
    /// HTTP connections open at most; past it the one waiting longest for
    /// its client makes room, or, with every one busy, the new one is
    /// answered 503.
    #[cfg_attr(feature = "cli", arg(long, value_name = "N"))]
    pub max_connections: Option<usize>,
    /// Allow callbacks and topics on loopback, private, link-local or
    /// unique-local addresses (refused with 400 otherwise).
    // A bare `--allow-private-network` means true, as it always has; a
    // value is taken too, so a later layer can turn it off again.
    #[cfg_attr(
        feature = "cli",
        arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")
    )]
    pub allow_private_network: Option<bool>,
    /// A PEM file of CA certificates to trust besides the system's roots,
    /// for HTTPS callbacks, topics, webhooks and the subscriptions service.
    #[cfg_attr(feature = "cli", arg(long, value_name = "FILE"))]
    pub extra_ca: Option<PathBuf>,
    /// A PEM file of the client certificate (and chain) shown to servers
    /// that ask for one (mTLS): callbacks, topics, webhooks, the
    /// subscriptions service; needs client-key.
    #[cfg_attr(feature = "cli", arg(long, value_name = "FILE"))]
    pub client_cert: Option<PathBuf>,
    /// The PEM file of client-cert's private key.
    #[cfg_attr(feature = "cli", arg(long, value_name = "FILE"))]
    pub client_key: Option<PathBuf>,
    /// One key for every role but metrics: fat pings, the operator API
    /// and admin page, the subscriptions service (at least 32 characters).
    #[cfg_attr(feature = "cli", arg(long, value_name = "KEY"))]
    pub internal_api_key: Option<String>,
    /// Keys for fat pings, besides the internal key; comma-separated (an
    /// array in the file), so one can be replaced without downtime.
    #[cfg_attr(feature = "cli", arg(long, value_name = "KEYS", value_delimiter = ','))]
    pub publish_keys: Option<Vec<String>>,
    /// Keys for the operator API and the admin page, besides the internal
    /// key; comma-separated.
    #[cfg_attr(feature = "cli", arg(long, value_name = "KEYS", value_delimiter = ','))]
    pub operator_keys: Option<Vec<String>>,
    /// Keys /metrics asks for (in the key header or as a bearer token);
    /// comma-separated; open when unset.
    #[cfg_attr(feature = "cli", arg(long, value_name = "KEYS", value_delimiter = ','))]
    pub metrics_keys: Option<Vec<String>>,
    /// The key sent to the subscriptions service; the internal key when
    /// unset.
    #[cfg_attr(feature = "cli", arg(long, value_name = "KEY"))]
    pub quota_api_key: Option<String>,
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
    /// Where every endpoint state change (failing, open, recovered,
    /// disabled, enabled) is POSTed as JSON, signed; none when unset.
    #[cfg_attr(feature = "cli", arg(long, value_name = "URL"))]
    pub operator_webhook: Option<String>,
    /// The Standard Webhooks secret (`whsec_<base64>`) the operator
    /// webhook's requests are signed with; required with it.
    #[cfg_attr(feature = "cli", arg(long, value_name = "SECRET"))]
    pub operator_webhook_secret: Option<String>,
    /// The operator webhook's secret being replaced: while set, each
    /// request carries a signature with each.
    #[cfg_attr(feature = "cli", arg(long, value_name = "SECRET"))]
    pub operator_webhook_previous_secret: Option<String>,
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
            delivery_per_host_min,
            delivery_per_host_rate,
            delivery_idle_connections,
            disable_endpoint_after,
            endpoint_open_after,
            endpoint_disable_after,
            delivery_batch_size,
            visibility_timeout,
            poll_interval,
            verification_timeout,
            verification_concurrency,
            verification_attempts,
            verification_retry_wait,
            max_pending_verifications,
            log_format,
            reaper_interval,
            retention,
            max_form_bytes,
            max_content_bytes,
            header_read_timeout,
            idle_timeout,
            max_connections,
            allow_private_network,
            extra_ca,
            client_cert,
            client_key,
            internal_api_key,
            publish_keys,
            operator_keys,
            metrics_keys,
            quota_api_key,
            internal_api_key_header,
            user_token_key,
            user_token_header,
            quota_url,
            quota_timeout,
            quota_type,
            operator_webhook,
            operator_webhook_secret,
            operator_webhook_previous_secret,
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
        set(&mut delivery.per_host_min, delivery_per_host_min);
        set(&mut delivery.per_host_rate, delivery_per_host_rate);
        set(&mut delivery.idle_connections, delivery_idle_connections);
        set(&mut delivery.disable_endpoint_after, disable_endpoint_after);
        set(&mut delivery.breaker.open_after, endpoint_open_after);
        set_duration(
            &mut delivery.breaker.disable_after,
            "endpoint-disable-after",
            endpoint_disable_after,
        )?;
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
        set(&mut config.verification.attempts, verification_attempts);
        set_duration(
            &mut config.verification.retry_wait,
            "verification-retry-wait",
            verification_retry_wait,
        )?;
        set(
            &mut config.verification.max_pending,
            max_pending_verifications,
        );
        set(&mut config.log_format, log_format);
        set_duration(
            &mut config.reaper_interval,
            "reaper-interval",
            reaper_interval,
        )?;
        if let Some(retention) = retention {
            config.retention = match retention.trim() {
                "none" => None,
                retention => Some(parse_duration("retention", retention)?),
            };
        }
        set(&mut config.max_form_bytes, max_form_bytes);
        set(&mut config.max_content_bytes, max_content_bytes);
        set_duration(
            &mut config.header_read_timeout,
            "header-read-timeout",
            header_read_timeout,
        )?;
        set_duration(&mut config.idle_timeout, "idle-timeout", idle_timeout)?;
        set(&mut config.max_connections, max_connections);
        set(&mut config.allow_private_network, allow_private_network);
        if extra_ca.is_some() {
            config.extra_ca = extra_ca;
        }
        if client_cert.is_some() {
            config.client_cert = client_cert;
        }
        if client_key.is_some() {
            config.client_key = client_key;
        }
        if internal_api_key.is_some() {
            config.internal_api_key = internal_api_key;
        }
        set(&mut config.publish_keys, publish_keys.map(without_blanks));
        set(&mut config.operator_keys, operator_keys.map(without_blanks));
        set(&mut config.metrics_keys, metrics_keys.map(without_blanks));
        if quota_api_key.is_some() {
            config.quota_api_key = quota_api_key;
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
        if let Some(url) = operator_webhook {
            config.operator_webhook = Some(
                Url::parse(&url)
                    .map_err(|error| invalid("operator-webhook", &url, error.to_string()))?,
            );
        }
        if operator_webhook_secret.is_some() {
            config.operator_webhook_secret = operator_webhook_secret;
        }
        if operator_webhook_previous_secret.is_some() {
            config.operator_webhook_previous_secret = operator_webhook_previous_secret;
        }
        Ok(())
    }

    /// Every value this layer sets, as text, by field name (which is also
    /// the clap argument's id).
    #[cfg(feature = "cli")]
    pub(super) fn values(&self) -> BTreeMap<String, String> {
        let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(self) else {
            return BTreeMap::new();
        };
        fields
            .into_iter()
            .filter_map(|(name, value)| match value {
                serde_json::Value::Null => None,
                serde_json::Value::String(text) => Some((name, text)),
                // A list as the flag and the variable take it.
                serde_json::Value::Array(items) => Some((
                    name,
                    items
                        .iter()
                        .map(|item| {
                            item.as_str()
                                .map_or_else(|| item.to_string(), str::to_owned)
                        })
                        .collect::<Vec<_>>()
                        .join(","),
                )),
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
            extra_ca,
            client_cert,
            client_key,
            internal_api_key,
            publish_keys,
            operator_keys,
            metrics_keys,
            quota_api_key,
            internal_api_key_header,
            max_form_bytes,
            max_content_bytes,
            header_read_timeout,
            idle_timeout,
            max_connections,
            log_format,
            reaper_interval,
            poll_interval,
            retention,
            user_token_key,
            user_token_header,
            quota_url,
            quota_timeout,
            quota_type,
            feeds,
            operator_webhook,
            operator_webhook_secret,
            operator_webhook_previous_secret,
        } = config;
        let LeasePolicy { default, min, max } = lease;
        let DeliveryPolicy {
            timeout,
            retry,
            concurrency,
            per_host,
            per_host_min,
            per_host_rate,
            idle_connections,
            batch_size,
            visibility_timeout,
            disable_endpoint_after,
            breaker,
        } = delivery;
        let RetryPolicy {
            max_retries,
            max_backoff,
        } = retry;
        let VerificationPolicy {
            timeout: verification_timeout,
            concurrency: verification_concurrency,
            attempts: verification_attempts,
            retry_wait: verification_retry_wait,
            max_pending: max_pending_verifications,
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
            delivery_per_host_min: Some(*per_host_min),
            delivery_per_host_rate: Some(*per_host_rate),
            delivery_idle_connections: Some(*idle_connections),
            disable_endpoint_after: Some(*disable_endpoint_after),
            endpoint_open_after: Some(breaker.open_after),
            endpoint_disable_after: duration(&breaker.disable_after),
            delivery_batch_size: Some(*batch_size),
            visibility_timeout: duration(visibility_timeout),
            poll_interval: duration(poll_interval),
            verification_timeout: duration(verification_timeout),
            verification_concurrency: Some(*verification_concurrency),
            verification_attempts: Some(*verification_attempts),
            verification_retry_wait: duration(verification_retry_wait),
            max_pending_verifications: Some(*max_pending_verifications),
            log_format: Some(*log_format),
            reaper_interval: duration(reaper_interval),
            retention: Some(retention.map_or_else(|| "none".to_owned(), format_duration)),
            max_form_bytes: Some(*max_form_bytes),
            max_content_bytes: Some(*max_content_bytes),
            header_read_timeout: duration(header_read_timeout),
            idle_timeout: duration(idle_timeout),
            max_connections: Some(*max_connections),
            allow_private_network: Some(*allow_private_network),
            extra_ca: extra_ca.clone(),
            client_cert: client_cert.clone(),
            client_key: client_key.clone(),
            internal_api_key: internal_api_key.clone(),
            publish_keys: keys(publish_keys),
            operator_keys: keys(operator_keys),
            metrics_keys: keys(metrics_keys),
            quota_api_key: quota_api_key.clone(),
            internal_api_key_header: Some(internal_api_key_header.clone()),
            user_token_key: user_token_key.clone(),
            user_token_header: Some(user_token_header.clone()),
            quota_url: quota_url.as_ref().map(Url::to_string),
            quota_timeout: duration(quota_timeout),
            quota_type: Some(quota_type.clone()),
            operator_webhook: operator_webhook.as_ref().map(Url::to_string),
            operator_webhook_secret: operator_webhook_secret.clone(),
            operator_webhook_previous_secret: operator_webhook_previous_secret.clone(),
            feed: feeds.clone(),
        }
    }
}

/// A role's keys as a setting: none when there are none.
fn keys(keys: &[String]) -> Option<Vec<String>> {
    (!keys.is_empty()).then(|| keys.to_vec())
}

/// A list of keys without the empty entries a trailing comma or an empty
/// variable leaves.
fn without_blanks(keys: Vec<String>) -> Vec<String> {
    keys.into_iter()
        .map(|key| key.trim().to_owned())
        .filter(|key| !key.is_empty())
        .collect()
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

#[cfg(test)]
pub(crate) mod tests;

//! websubd: the hub service. Parses flags, environment (`WEBSUB_*`) and an
//! optional TOML file (flags beat environment, which beats the file, which
//! beats the defaults; outbox feeds come from the file's `[[feed]]` tables),
//! validates once, binds, and runs the hub until Ctrl-C or SIGTERM, then
//! drains. SIGHUP reloads the feeds' webhooks files.

/// Delivery allocates and frees many small buffers per request; mimalloc
/// serves them with less contention and less CPU than the system allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;
use websub_hub::HubConfig;
use websub_hub::config::{
    ConfigError, FileConfig, parse_duration, parse_public_url, parse_quota_url, public_url_for,
};

/// A WebSub hub that is also the delivery end of a transactional outbox.
#[derive(Debug, Parser)]
#[command(name = "websubd", version)]
struct Args {
    /// A TOML file with any of the settings below (underscored names).
    #[arg(long, env = "WEBSUB_CONFIG")]
    config: Option<String>,
    /// Address to listen on [default: 127.0.0.1:8080].
    #[arg(long, env = "WEBSUB_LISTEN")]
    listen: Option<SocketAddr>,
    /// The hub URL announced in rel="hub", ending with a slash [default:
    /// http://<listen>/].
    #[arg(long, env = "WEBSUB_PUBLIC_URL")]
    public_url: Option<String>,
    /// The event log (and by default the subscriptions): sqlite:PATH or
    /// postgres://… [default: sqlite:websub.db].
    #[arg(long, env = "WEBSUB_DATABASE_URL")]
    database_url: Option<String>,
    /// Where subscriptions live instead: memory, sqlite:PATH, postgres://…,
    /// redis://….
    #[arg(long, env = "WEBSUB_STORE")]
    store: Option<String>,
    /// Lease granted when none is asked for [default: 10d].
    #[arg(long, env = "WEBSUB_LEASE_DEFAULT")]
    lease_default: Option<String>,
    /// Shortest lease granted [default: 1m].
    #[arg(long, env = "WEBSUB_LEASE_MIN")]
    lease_min: Option<String>,
    /// Longest lease granted [default: 365d].
    #[arg(long, env = "WEBSUB_LEASE_MAX")]
    lease_max: Option<String>,
    /// Time allowed for one delivery [default: 10s].
    #[arg(long, env = "WEBSUB_DELIVERY_TIMEOUT")]
    delivery_timeout: Option<String>,
    /// Retries after a failed delivery [default: 10].
    #[arg(long, env = "WEBSUB_DELIVERY_RETRIES")]
    delivery_retries: Option<u32>,
    /// Wait before the last retry [default: 10s].
    #[arg(long, env = "WEBSUB_DELIVERY_MAX_BACKOFF")]
    delivery_max_backoff: Option<String>,
    /// Deliveries in flight at once [default: 256].
    #[arg(long, env = "WEBSUB_DELIVERY_CONCURRENCY")]
    delivery_concurrency: Option<usize>,
    /// Deliveries in flight at once per callback host [default: 64].
    #[arg(long, env = "WEBSUB_DELIVERY_PER_HOST")]
    delivery_per_host: Option<usize>,
    /// Allow callbacks and topics on loopback or private networks.
    #[arg(long, env = "WEBSUB_ALLOW_PRIVATE_NETWORK")]
    allow_private_network: bool,
    /// The key for fat pings and internal APIs (at least 32 characters).
    #[arg(long, env = "WEBSUB_INTERNAL_API_KEY", hide_env_values = true)]
    internal_api_key: Option<String>,
    /// The header carrying the internal key [default: X-Internal-API-Key].
    #[arg(long, env = "WEBSUB_INTERNAL_API_KEY_HEADER")]
    internal_api_key_header: Option<String>,
    /// After this long, a delivery claimed by a process that died is claimed
    /// again [default: 60s; must exceed the delivery timeout].
    #[arg(long, env = "WEBSUB_VISIBILITY_TIMEOUT")]
    visibility_timeout: Option<String>,
    /// How often to look for due deliveries when nothing signals them
    /// [default: 1s].
    #[arg(long, env = "WEBSUB_POLL_INTERVAL")]
    poll_interval: Option<String>,
    /// Delete events older than this, hourly (e.g. 7d).
    #[arg(long, env = "WEBSUB_RETENTION")]
    retention: Option<String>,
    /// The HS256 key that signs user tokens (subscriber API, quota).
    #[arg(long, env = "WEBSUB_USER_TOKEN_KEY", hide_env_values = true)]
    user_token_key: Option<String>,
    /// The header carrying the user token [default: Authorization, as
    /// "Bearer <token>"].
    #[arg(long, env = "WEBSUB_USER_TOKEN_HEADER")]
    user_token_header: Option<String>,
    /// The subscriptions service's base URL; the subscription quota is
    /// enforced when set (needs the internal key and the user token key).
    #[arg(long, env = "WEBSUB_QUOTA_URL")]
    quota_url: Option<String>,
    /// Time allowed for the subscriptions service to answer [default: 5s].
    #[arg(long, env = "WEBSUB_QUOTA_TIMEOUT")]
    quota_timeout: Option<String>,
    /// The quota type that caps subscriptions [default:
    /// websub_subscriptions].
    #[arg(long, env = "WEBSUB_QUOTA_TYPE")]
    quota_type: Option<String>,
}

impl Args {
    fn into_config(self) -> Result<HubConfig, ConfigError> {
        let mut config = HubConfig::default();
        if let Some(path) = &self.config {
            FileConfig::read(path)?.apply(&mut config)?;
        }
        if let Some(listen) = self.listen {
            config.listen = listen;
            config.public_url = public_url_for(listen);
        }
        if let Some(url) = &self.public_url {
            config.public_url = parse_public_url(url)?;
        }
        if let Some(url) = self.database_url {
            config.database_url = url;
        }
        if self.store.is_some() {
            config.store = self.store;
        }
        let durations = [
            (
                &mut config.lease.default,
                "lease-default",
                self.lease_default,
            ),
            (&mut config.lease.min, "lease-min", self.lease_min),
            (&mut config.lease.max, "lease-max", self.lease_max),
            (
                &mut config.delivery.timeout,
                "delivery-timeout",
                self.delivery_timeout,
            ),
            (
                &mut config.delivery.retry.max_backoff,
                "delivery-max-backoff",
                self.delivery_max_backoff,
            ),
            (
                &mut config.delivery.visibility_timeout,
                "visibility-timeout",
                self.visibility_timeout,
            ),
            (
                &mut config.poll_interval,
                "poll-interval",
                self.poll_interval,
            ),
            (
                &mut config.quota_timeout,
                "quota-timeout",
                self.quota_timeout,
            ),
        ];
        for (field, setting, value) in durations {
            if let Some(value) = value {
                *field = parse_duration(setting, &value)?;
            }
        }
        if let Some(retries) = self.delivery_retries {
            config.delivery.retry.max_retries = retries;
        }
        if let Some(concurrency) = self.delivery_concurrency {
            config.delivery.concurrency = concurrency;
        }
        if let Some(per_host) = self.delivery_per_host {
            config.delivery.per_host = per_host;
        }
        config.allow_private_network |= self.allow_private_network;
        if self.internal_api_key.is_some() {
            config.internal_api_key = self.internal_api_key;
        }
        if let Some(header) = self.internal_api_key_header {
            config.internal_api_key_header = header;
        }
        if let Some(retention) = self.retention {
            config.retention = Some(parse_duration("retention", &retention)?);
        }
        if self.user_token_key.is_some() {
            config.user_token_key = self.user_token_key;
        }
        if let Some(header) = self.user_token_header {
            config.user_token_header = header;
        }
        if let Some(url) = &self.quota_url {
            config.quota_url = Some(parse_quota_url(url)?);
        }
        if let Some(quota_type) = self.quota_type {
            config.quota_type = quota_type;
        }
        config.validate()?;
        Ok(config)
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let config = match Args::parse().into_config() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("websubd: {error}");
            return ExitCode::from(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(config.listen).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("websubd: cannot listen on {}: {error}", config.listen);
            return ExitCode::from(1);
        }
    };
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder();
    let hub = match websub_hub::server::Hub::open(config).await {
        Ok(hub) => hub,
        Err(error) => {
            eprintln!("websubd: {error}");
            return ExitCode::from(1);
        }
    };
    let hub = match metrics {
        Ok(handle) => hub.with_metrics(handle),
        Err(error) => {
            tracing::warn!(%error, "metrics are disabled");
            hub
        }
    };
    reload_on_hangup(hub.feed_reloader());
    match hub.run(listener, shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("websubd: {error}");
            ExitCode::from(1)
        }
    }
}

/// On SIGHUP, the outbox feeds read their webhooks files again.
fn reload_on_hangup(reloader: websub_hub::server::FeedReloader) {
    #[cfg(unix)]
    tokio::spawn(async move {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(mut hangups) => {
                while hangups.recv().await.is_some() {
                    tracing::info!("SIGHUP: reloading the webhooks files");
                    reloader.reload();
                }
            }
            Err(error) => tracing::warn!(%error, "cannot listen for SIGHUP"),
        }
    });
    #[cfg(not(unix))]
    drop(reloader);
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let interrupt = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::warn!(%error, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
    tracing::info!("shutdown requested");
}

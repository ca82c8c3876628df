//! websub: the operator's command line.
//!
//! `websub listen ADDR` runs a small subscriber and publisher for trying a
//! hub by hand: it answers verification GETs on any path (echoing the
//! challenge), prints every delivery it receives (checking `X-Hub-Signature`
//! when given the secret), and serves a topic at `/feed` whose content
//! changes on every fetch.
//!
//! `websub token` prints a user token signed with the hub's user token key,
//! and `websub fake-quota ADDR` runs a stand-in for the subscriptions
//! service's quota endpoint: together they let the quota and the subscriber
//! API be tried without the real services.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::routing::get;
use clap::{Parser, Subcommand};
use websub_hub::auth::issue_token;
use websub_hub::config::parse_duration;
use websub_hub::quota::Quota;
use websub_hub::quota::fake::FakeQuotaServer;
use websub_hub::signature::{EVENT_ID_HEADER, HUB_SIGNATURE_HEADER, verify};

#[derive(Debug, Parser)]
#[command(name = "websub", version, about = "Operator tools for websub-hub")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a subscriber (any path) and a topic (/feed) for trying a hub.
    Listen {
        /// The address to listen on, e.g. 127.0.0.1:9000.
        address: SocketAddr,
        /// The subscription's secret, to check X-Hub-Signature.
        #[arg(long)]
        secret: Option<String>,
    },
    /// Print a user token (HS256 JWT) for trying the hub's user features.
    Token {
        /// The hub's user token key.
        #[arg(long, env = "WEBSUB_USER_TOKEN_KEY", hide_env_values = true)]
        user_token_key: String,
        /// The user (the token's `sub`).
        #[arg(long)]
        sub: String,
        /// How long the token is valid, e.g. 1h.
        #[arg(long, default_value = "1h")]
        ttl: String,
    },
    /// Run a stand-in subscriptions service answering quota requests.
    FakeQuota {
        /// The address to listen on, e.g. 127.0.0.1:9100.
        address: SocketAddr,
        /// The internal key callers must send (X-Internal-API-Key).
        #[arg(long, env = "WEBSUB_INTERNAL_API_KEY", hide_env_values = true)]
        internal_api_key: String,
        /// Every user's subscription limit.
        #[arg(long, default_value_t = 5)]
        limit: u64,
        /// The quota type served.
        #[arg(long, default_value = "websub_subscriptions")]
        quota_type: String,
        /// Users with no limit (repeatable).
        #[arg(long)]
        unlimited: Vec<String>,
    },
}

#[derive(Debug, Clone)]
struct Listener {
    secret: Option<Arc<str>>,
    fetches: Arc<AtomicU64>,
}

#[tokio::main]
async fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Listen { address, secret } => listen(address, secret).await,
        Command::Token {
            user_token_key,
            sub,
            ttl,
        } => token(&user_token_key, &sub, &ttl),
        Command::FakeQuota {
            address,
            internal_api_key,
            limit,
            quota_type,
            unlimited,
        } => fake_quota(address, internal_api_key, limit, quota_type, unlimited).await,
    }
}

fn token(key: &str, sub: &str, ttl: &str) -> ExitCode {
    let ttl = match parse_duration("ttl", ttl) {
        Ok(ttl) => ttl,
        Err(error) => {
            eprintln!("websub: {error}");
            return ExitCode::from(2);
        }
    };
    if key.is_empty() || sub.is_empty() {
        eprintln!("websub: --user-token-key and --sub must not be empty");
        return ExitCode::from(2);
    }
    let ttl = chrono::TimeDelta::from_std(ttl).unwrap_or(chrono::TimeDelta::MAX);
    println!("{}", issue_token(key, sub, None, ttl));
    ExitCode::SUCCESS
}

async fn fake_quota(
    address: SocketAddr,
    key: String,
    limit: u64,
    quota_type: String,
    unlimited: Vec<String>,
) -> ExitCode {
    let server = match FakeQuotaServer::start_on(address, key) {
        Ok(server) => server,
        Err(error) => {
            eprintln!("websub: cannot listen on {address}: {error}");
            return ExitCode::from(1);
        }
    };
    server.set_default_quotas(vec![Quota::total(&quota_type, limit)]);
    for user in unlimited {
        server.set_quotas(user, vec![Quota::unlimited(&quota_type)]);
    }
    println!(
        "subscriptions service on {}: {quota_type} limit {limit}",
        server.url()
    );
    if let Err(error) = tokio::signal::ctrl_c().await {
        eprintln!("websub: {error}");
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

async fn listen(address: SocketAddr, secret: Option<String>) -> ExitCode {
    let state = Listener {
        secret: secret.map(Arc::from),
        fetches: Arc::new(AtomicU64::new(0)),
    };
    let app = Router::new()
        .route("/feed", get(feed))
        .fallback(callback)
        .with_state(state);
    let listener = match tokio::net::TcpListener::bind(address).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("websub: cannot listen on {address}: {error}");
            return ExitCode::from(1);
        }
    };
    println!("listening on http://{address}/ (topic: http://{address}/feed)");
    match axum::serve(listener, app).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("websub: {error}");
            ExitCode::from(1)
        }
    }
}

async fn feed(State(state): State<Listener>) -> ([(&'static str, &'static str); 1], String) {
    let fetch = state.fetches.fetch_add(1, Ordering::Relaxed) + 1;
    (
        [("content-type", "text/plain; charset=utf-8")],
        format!("update number {fetch}\n"),
    )
}

async fn callback(
    State(state): State<Listener>,
    uri: Uri,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    let params: Vec<(String, String)> =
        serde_urlencoded::from_str(query.as_deref().unwrap_or("")).unwrap_or_default();
    let param = |name: &str| {
        params
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.clone())
    };
    if let Some(mode) = param("hub.mode") {
        let topic = param("hub.topic").unwrap_or_default();
        println!("verification: {mode} {topic} on {}", uri.path());
        if let Some(reason) = param("hub.reason") {
            println!("  denied: {reason}");
        }
        return (StatusCode::OK, param("hub.challenge").unwrap_or_default());
    }
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("-")
            .to_owned()
    };
    let signature = match &state.secret {
        Some(secret) => {
            let given = headers
                .get(HUB_SIGNATURE_HEADER)
                .and_then(|value| value.to_str().ok());
            if verify(secret.as_bytes(), &body, given) {
                "valid"
            } else {
                "INVALID"
            }
        }
        None => "not checked",
    };
    println!(
        "delivery to {}: {} bytes, content-type {}, event {}, signature {signature}",
        uri.path(),
        body.len(),
        header("content-type"),
        header(EVENT_ID_HEADER),
    );
    println!("  link: {}", header("link"));
    println!("  body: {}", String::from_utf8_lossy(&body).trim_end());
    (StatusCode::NO_CONTENT, String::new())
}

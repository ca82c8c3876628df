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
//!
//! `websub outbox-ddl --schema S [--scan-index]` prints the DDL of a
//! producer's outbox tables (names configurable; optionally with an index
//! on `created_at` for polling scans), and `websub outbox-purge --database-url URL
//! --older-than 30d` deletes expired outbox events on demand, e.g. from cron.
//!
//! `websub routes` prints the hub's routes with their policies, and
//! `websub routes --traefik` a Traefik file-provider configuration routing
//! them (the table and the export are `websub_hub::routes`'); a refused
//! setting is named by the flag or variable it came from, with exit code 2.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::routing::get;
use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use websub_hub::auth::issue_token;
use websub_hub::config::parse_duration;
use websub_hub::outbox::{
    DEFAULT_DELIVERIES_TABLE, DEFAULT_OUTBOX_TABLE, OutboxError, OutboxTables, ddl, purge_expired,
    scan_index_ddl,
};
use websub_hub::quota::Quota;
use websub_hub::quota::fake::FakeQuotaServer;
use websub_hub::routes::traefik::{
    DEFAULT_ADMIN_MIDDLEWARES, DEFAULT_ENRICHED_MIDDLEWARES, DEFAULT_ENTRY_POINT, DEFAULT_NAME,
    DEFAULT_PROTECTED_MIDDLEWARES, DEFAULT_SERVICE_URL, Setting, TraefikConfig, split_list,
};
use websub_hub::routes::{Policy, ROUTES};
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
    /// Print the DDL that creates a producer's outbox tables.
    OutboxDdl {
        #[command(flatten)]
        tables: TableNames,
        /// Also print an index on the outbox's created_at (beyond the
        /// contract), so that polling scans and retention sweeps read only
        /// their window instead of the whole table.
        #[arg(long)]
        scan_index: bool,
    },
    /// Delete outbox events older than a duration, with their delivery rows.
    OutboxPurge {
        /// The producer's database.
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
        /// Delete events created longer ago than this, e.g. 30d or 12h.
        #[arg(long)]
        older_than: String,
        #[command(flatten)]
        tables: TableNames,
    },
    /// Print the hub's routes and their policies, or (--traefik) a Traefik
    /// file-provider configuration that routes them.
    Routes(RoutesArgs),
}

/// `websub routes`. The lists are comma-separated, as the
/// `TRAEFIK_MIDDLEWARES_*` variables shared by an environment's services
/// hold them; an empty entry or one holding whitespace is refused.
#[derive(Debug, clap::Args)]
struct RoutesArgs {
    /// Print the Traefik dynamic configuration (TOML, file provider).
    #[arg(long)]
    traefik: bool,
    /// The prefix of the routers' names and the service's name.
    #[arg(long, env = "WEBSUB_TRAEFIK_NAME", default_value = DEFAULT_NAME)]
    name: String,
    /// The hub's public host name, matched by every rule (without it the
    /// routes answer on every host of their entry points).
    #[arg(long, env = "WEBSUB_TRAEFIK_HOST")]
    host: Option<String>,
    /// The entry points of the public routes.
    #[arg(long, value_name = "LIST", env = "WEBSUB_TRAEFIK_ENTRY_POINTS",
          default_value = DEFAULT_ENTRY_POINT)]
    entry_points: String,
    /// The entry points of the internal routes (operator API, /admin,
    /// /metrics); without them those routes are not routed at all.
    #[arg(
        long,
        value_name = "LIST",
        env = "WEBSUB_TRAEFIK_INTERNAL_ENTRY_POINTS"
    )]
    internal_entry_points: Option<String>,
    /// The hub's URLs as Traefik reaches them (one per replica).
    #[arg(long, value_name = "LIST", env = "WEBSUB_TRAEFIK_SERVICE_URL",
          default_value = DEFAULT_SERVICE_URL)]
    service_url: String,
    /// The middlewares of the enriched policy.
    #[arg(long, value_name = "LIST", env = "TRAEFIK_MIDDLEWARES_ENRICHED",
          default_value_t = DEFAULT_ENRICHED_MIDDLEWARES.join(","))]
    enriched_middlewares: String,
    /// The middlewares of the protected policy (the subscriber API).
    #[arg(long, value_name = "LIST", env = "TRAEFIK_MIDDLEWARES_PROTECTED",
          default_value_t = DEFAULT_PROTECTED_MIDDLEWARES.join(","))]
    protected_middlewares: String,
    /// The middlewares of the admin policy.
    #[arg(long, value_name = "LIST", env = "TRAEFIK_MIDDLEWARES_ADMIN",
          default_value_t = DEFAULT_ADMIN_MIDDLEWARES.join(","))]
    admin_middlewares: String,
}

impl RoutesArgs {
    fn config(&self) -> TraefikConfig {
        TraefikConfig {
            name: self.name.clone(),
            host: self.host.clone(),
            entry_points: split_list(&self.entry_points),
            internal_entry_points: self
                .internal_entry_points
                .as_deref()
                .map(split_list)
                .unwrap_or_default(),
            service_urls: split_list(&self.service_url),
            enriched_middlewares: split_list(&self.enriched_middlewares),
            protected_middlewares: split_list(&self.protected_middlewares),
            admin_middlewares: split_list(&self.admin_middlewares),
        }
    }
}

/// Where a setting's value came from, as the operator would look for it:
/// the variable when the environment gave it, the flag otherwise.
fn source_of(matches: &ArgMatches, setting: Setting) -> String {
    let id = match setting {
        Setting::Host => "host",
        Setting::EntryPoints => "entry_points",
        Setting::InternalEntryPoints => "internal_entry_points",
        Setting::ServiceUrls => "service_url",
        Setting::Middlewares(Policy::Enriched) => "enriched_middlewares",
        Setting::Middlewares(Policy::Protected) => "protected_middlewares",
        Setting::Middlewares(Policy::Admin) => "admin_middlewares",
        Setting::Name => "name",
        // Nothing else comes from this command's arguments.
        _ => return setting.to_string(),
    };
    let arg = RoutesArgs::augment_args(clap::Command::new("routes"))
        .get_arguments()
        .find(|arg| arg.get_id() == id)
        .cloned();
    let flag = arg
        .as_ref()
        .and_then(clap::Arg::get_long)
        .map_or_else(|| id.to_owned(), |long| format!("--{long}"));
    match (
        matches.value_source(id),
        arg.as_ref().and_then(clap::Arg::get_env),
    ) {
        (Some(ValueSource::EnvVariable), Some(variable)) => variable.to_string_lossy().into_owned(),
        _ => flag,
    }
}

fn routes(args: &RoutesArgs, matches: &ArgMatches) -> ExitCode {
    let config = args.config();
    // The listing is checked too, so that a bad environment shows before
    // anything is exported with it.
    let exported = config.validate().and_then(|()| {
        if args.traefik {
            config.export().map(Some)
        } else {
            Ok(None)
        }
    });
    match exported {
        Ok(Some(toml)) => print!("{toml}"),
        Ok(None) => list_routes(&config),
        Err(error) => {
            eprintln!("websub: {}: {error}", source_of(matches, error.setting()));
            return ExitCode::from(2);
        }
    }
    ExitCode::SUCCESS
}

/// Each route with its policy, where it is routed and behind what.
fn list_routes(config: &TraefikConfig) {
    println!(
        "{:<24} {:<10} {:<16} MIDDLEWARES",
        "PATH", "POLICY", "ENTRY POINTS"
    );
    for route in ROUTES {
        let served = match route.policy {
            Policy::Internal if config.internal_entry_points.is_empty() => "not routed".to_owned(),
            Policy::Internal => config.internal_entry_points.join(","),
            _ => config.entry_points.join(","),
        };
        println!(
            "{:<24} {:<10} {:<16} {}",
            route.path.to_string(),
            route.policy.name(),
            served,
            config.middlewares(route.policy).join(",")
        );
    }
}

/// Where a producer's outbox tables are.
#[derive(Debug, clap::Args)]
struct TableNames {
    /// The schema of both tables (the search path's when not given).
    #[arg(long)]
    schema: Option<String>,
    /// The outbox table's name.
    #[arg(long, default_value = DEFAULT_OUTBOX_TABLE)]
    outbox_table: String,
    /// The deliveries table's name.
    #[arg(long, default_value = DEFAULT_DELIVERIES_TABLE)]
    deliveries_table: String,
}

impl TableNames {
    fn resolve(&self) -> Result<OutboxTables, OutboxError> {
        let qualify = |table: &str| match &self.schema {
            Some(schema) => format!("{schema}.{table}"),
            None => table.to_owned(),
        };
        OutboxTables::new(qualify(&self.outbox_table), qualify(&self.deliveries_table))
    }
}

#[derive(Debug, Clone)]
struct Listener {
    secret: Option<Arc<str>>,
    fetches: Arc<AtomicU64>,
}

#[tokio::main]
async fn main() -> ExitCode {
    // The matches are kept to tell a flag from a variable in errors.
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    match cli.command {
        Command::Routes(args) => {
            let matches = matches.subcommand_matches("routes").unwrap_or(&matches);
            routes(&args, matches)
        }
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
        Command::OutboxDdl { tables, scan_index } => match tables.resolve() {
            Ok(tables) => {
                print!("{}", ddl(&tables));
                if scan_index {
                    print!("\n{}", scan_index_ddl(&tables));
                }
                ExitCode::SUCCESS
            }
            Err(error) => fail(&error),
        },
        Command::OutboxPurge {
            database_url,
            older_than,
            tables,
        } => {
            let purged = async {
                let ttl = parse_duration("older-than", &older_than).map_err(|e| e.to_string())?;
                let tables = tables.resolve().map_err(|e| e.to_string())?;
                purge(&database_url, &tables, ttl).await
            };
            match purged.await {
                Ok(deleted) => {
                    println!("deleted {deleted} expired outbox events");
                    ExitCode::SUCCESS
                }
                Err(error) => fail(&error),
            }
        }
    }
}

fn fail(error: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("websub: {error}");
    ExitCode::from(1)
}

/// Deletes the events in `tables` older than `ttl`; how many.
async fn purge(database_url: &str, tables: &OutboxTables, ttl: Duration) -> Result<u64, String> {
    use sqlx::Connection;
    let mut connection = sqlx::PgConnection::connect(database_url)
        .await
        .map_err(|error| format!("cannot connect to the database: {error}"))?;
    let deleted = purge_expired(&mut connection, tables, ttl)
        .await
        .map_err(|error| error.to_string());
    let _ = connection.close().await;
    deleted
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

#[cfg(test)]
mod tests {
    use super::*;

    fn names(schema: Option<&str>, outbox: &str, deliveries: &str) -> TableNames {
        TableNames {
            schema: schema.map(str::to_owned),
            outbox_table: outbox.to_owned(),
            deliveries_table: deliveries.to_owned(),
        }
    }

    #[test]
    fn table_names_are_qualified_by_the_schema() {
        let tables = names(Some("shared"), "outbox", "outbox_deliveries")
            .resolve()
            .expect("valid");
        assert_eq!(tables.outbox(), "shared.outbox");
        assert_eq!(tables.deliveries(), "shared.outbox_deliveries");
        let plain = names(None, "events", "event_deliveries")
            .resolve()
            .expect("valid");
        assert_eq!(plain.outbox(), "events");
        assert!(names(Some("Bad Schema"), "outbox", "d").resolve().is_err());
        assert!(names(Some("s"), "x.outbox", "d").resolve().is_err());
    }

    #[test]
    fn the_command_line_parses() {
        let cli =
            Cli::try_parse_from(["websub", "outbox-ddl", "--schema", "shared"]).expect("parse");
        assert!(matches!(
            cli.command,
            Command::OutboxDdl { ref tables, scan_index: false } if tables.outbox_table == "outbox"
        ));
        let cli = Cli::try_parse_from(["websub", "outbox-ddl", "--scan-index"]).expect("parse");
        assert!(matches!(
            cli.command,
            Command::OutboxDdl {
                scan_index: true,
                ..
            }
        ));
        let cli = Cli::try_parse_from([
            "websub",
            "outbox-purge",
            "--database-url",
            "postgres://db/app",
            "--older-than",
            "30d",
            "--outbox-table",
            "events",
        ])
        .expect("parse");
        assert!(matches!(
            cli.command,
            Command::OutboxPurge { ref older_than, ref tables, .. }
                if older_than == "30d" && tables.outbox_table == "events"
        ));
    }

    /// The purge against a real database: the DDL's tables, one old event
    /// and one fresh.
    #[tokio::test]
    async fn purge_deletes_only_what_is_older() {
        let Some(url) = websub_storetest::servers::fresh_postgres_url().await else {
            return;
        };
        let tables = names(Some("shop"), "outbox", "outbox_deliveries")
            .resolve()
            .expect("valid");
        let pool = sqlx::PgPool::connect(&url).await.expect("connect");
        sqlx::raw_sql(sqlx::AssertSqlSafe(ddl(&tables)))
            .execute(&pool)
            .await
            .expect("the DDL runs");
        sqlx::raw_sql(
            "INSERT INTO shop.outbox (event_name, resource_type, resource_id, event_type, payload, created_at) \
             VALUES ('a', 'r', '1', 't', '{}', timezone('utc', now()) - interval '40 days'), \
                    ('b', 'r', '2', 't', '{}', timezone('utc', now()))",
        )
        .execute(&pool)
        .await
        .expect("events");
        let ttl = parse_duration("older-than", "30d").expect("duration");
        assert_eq!(purge(&url, &tables, ttl).await, Ok(1));
        assert_eq!(purge(&url, &tables, ttl).await, Ok(0));
        let left: Vec<String> = sqlx::query_scalar("SELECT event_name FROM shop.outbox")
            .fetch_all(&pool)
            .await
            .expect("read");
        assert_eq!(left, ["b"]);
        assert!(
            purge("postgres://127.0.0.1:1/none", &tables, ttl)
                .await
                .is_err()
        );
    }
}

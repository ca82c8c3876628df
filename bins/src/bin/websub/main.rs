//! websub: the operator's command line. Each command lives in a module of
//! its own:
//!
//! - `websub listen ADDR` ([`listen`]): a subscriber and a topic for trying a
//!   hub by hand;
//! - `websub token` prints a user token signed with the hub's user token
//!   key, and `websub fake-quota ADDR` runs a stand-in for the subscriptions
//!   service's quota endpoint: together they let the quota and the
//!   subscriber API be tried without the real services;
//! - `websub outbox-ddl` ([`outbox`]) prints a producer's outbox tables;
//! - `websub purge` ([`purge`]) deletes old events, of a producer's outbox
//!   or of the hub's own event log;
//! - `websub routes` ([`routes`]) prints the hub's routes, or a Traefik
//!   configuration routing them;
//! - `websub topics`, `subscriptions`, `deliveries`, `feeds` ([`operator`])
//!   ask a running hub through its operator API ([`client`] is what they
//!   share; [`table`] prints their answers).
//!
//! Exit codes: 0 done; 1 a hub, database or service refused or failed;
//! 2 a bad command line, naming the value.

mod access;
mod client;
mod listen;
mod operator;
mod outbox;
mod purge;
mod routes;
mod steer;
mod table;

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use websub_hub::config::parse_duration;
use websub_hub::delivery::outbox::{ddl, scan_index_ddl};
use websub_hub::intake::quota::Quota;
use websub_hub::intake::quota::fake::FakeQuotaServer;
use websub_hub::web::auth::issue_token;

use operator::OperatorCommand;
use outbox::TableNames;
use purge::PurgeArgs;
use routes::RoutesArgs;

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
    /// Delete old events: a producer's outbox (--database-url) or the hub's
    /// event log (--hub), with their deliveries.
    #[command(alias = "outbox-purge")]
    Purge(PurgeArgs),
    /// Print the hub's routes and their policies, or (--traefik) a Traefik
    /// file-provider configuration that routes them.
    Routes(RoutesArgs),
    #[command(flatten)]
    Operator(OperatorCommand),
}

#[tokio::main]
async fn main() -> ExitCode {
    // The matches are kept to tell a flag from a variable in errors.
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    let own = |name: &str| matches.subcommand_matches(name).unwrap_or(&matches);
    match cli.command {
        Command::Routes(args) => routes::routes(&args, own("routes")),
        Command::Listen { address, secret } => listen::listen(address, secret).await,
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
            Err(error) => {
                eprintln!("websub: {error}");
                ExitCode::from(2)
            }
        },
        Command::Purge(args) => purge::run(args, own("purge")).await,
        Command::Operator(command) => match operator::run(command).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(failure) => failure.report(),
        },
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

#[cfg(test)]
mod tests {
    use super::*;

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
            "purge",
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
            Command::Purge(ref purge) if format!("{purge:?}").contains("events")
        ));
    }

    #[test]
    fn the_former_name_of_purge_still_parses() {
        let cli = Cli::try_parse_from([
            "websub",
            "outbox-purge",
            "--database-url",
            "postgres://db/app",
            "--older-than",
            "30d",
        ])
        .expect("parse");
        assert!(matches!(cli.command, Command::Purge(_)));
    }

    #[test]
    fn the_operator_commands_parse() {
        let cli =
            Cli::try_parse_from(["websub", "subscriptions", "list", "--json"]).expect("parse");
        assert!(matches!(cli.command, Command::Operator(_)));
        let bad_id = Cli::try_parse_from([
            "websub",
            "deliveries",
            "show",
            "not-a-uuid",
            "--subscriber",
            "http://s.example/cb",
        ])
        .expect_err("a malformed event id is refused");
        assert_eq!(bad_id.exit_code(), 2);
        assert!(bad_id.to_string().contains("not-a-uuid"), "{bad_id}");
    }
}

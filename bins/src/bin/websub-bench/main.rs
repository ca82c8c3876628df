//! websub-bench: measures websub-hub on this machine and prints tables.
//!
//! - `websub-bench store`: each subscription backend loaded with N
//!   subscriptions: save/s, `list_by_topic` and `list_expiring` latency, the
//!   memory backend's resident memory.
//! - `websub-bench hub`: what a user of `websubd` on its defaults sees, with
//!   nginx as the subscribers and every subscription made through the hub:
//!   a fan-out to one host, one big host beside many small ones, a host
//!   down for a minute under steady pings, and websubd killed and restarted
//!   mid fan-out; each judged against `wrk` into the same nginx, optionally
//!   beside a baseline binary.
//! - `websub-bench slow`: one fan-out to 100 000 callbacks over 1 000
//!   loopback hosts that answer after 200 ms, 1 % of the hosts dead: time
//!   until every healthy one is delivered, websubd's peak memory, open files
//!   and CPU per delivery.
//! - `websub-bench subscribe`: 10 000 subscribe requests accepted,
//!   verified and saved, and websubd's peak memory while they wait; with
//!   `--baseline`, against a second build in the same sitting.
//! - `websub-bench sustained`: 10 000 topics × 10 subscribers, fat pings
//!   at 500/s for 60 s: deliveries/s held, publish-to-receipt percentiles,
//!   the event log's size with retention on.
//! - `websub-bench outbox`: producers committing outbox events, the
//!   PostgreSQL claim ceiling, and events delivered end to end through a
//!   `websubd` feed to a webhook, with commit-to-receipt latency; with
//!   `--bare-notify`, the producers write plain SQL and a `NOTIFY` without
//!   payload instead of using the producer library.
//! - `websub-bench tls`: the fan-out to HTTPS callbacks on one host (a test
//!   CA made by the bench, given to websubd with `--extra-ca`) against
//!   plain HTTP in the same run, rounds alternating, with the handshakes
//!   the receivers saw.
//!
//! PostgreSQL and Redis are measured when their URLs are given; each run uses
//! a throwaway database (PostgreSQL) or key prefix (Redis) and removes it.
//!
//! `--json FILE` also writes the tables a run prints as JSON (every
//! benchmark's but `outbox`'s), and `websub-bench chart FILE --column C --out
//! X.svg` draws one of their columns as an SVG bar chart.

mod https;
mod hub;
mod launch;
mod nginx;
mod outbox;
mod progress;
mod receiver;
mod report;
mod slow;
mod store;
mod subscribe;
mod sustained;
mod tally;
mod tls;
mod wrk;

use std::time::Duration;

use clap::{Parser, Subcommand};
use rand::Rng;

#[derive(Debug, Parser)]
#[command(name = "websub-bench", about = "Benchmarks of websub-hub", version)]
struct Cli {
    /// Also write the tables the run prints to FILE, as JSON.
    #[arg(long, global = true, value_name = "FILE")]
    json: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Subscription stores: save/s, list_by_topic and list_expiring latency.
    Store(store::StoreArgs),
    /// The hub end to end on its defaults, against nginx and wrk's ceiling.
    Hub(hub::HubArgs),
    /// The outbox path: producers' rate, claim ceiling, end-to-end delivery.
    Outbox(outbox::OutboxArgs),
    /// A fan-out to slow, distinct and partly dead callback hosts.
    Slow(slow::SlowArgs),
    /// Subscribe requests accepted and verified, and the memory they take.
    Subscribe(subscribe::SubscribeArgs),
    /// Fat pings held at a rate over many topics: throughput and latency.
    Sustained(sustained::SustainedArgs),
    /// The fan-out to HTTPS callbacks against plain HTTP, rounds alternating.
    Tls(tls::TlsArgs),
    /// Draw one column of a --json report's table as an SVG bar chart.
    Chart(report::ChartArgs),
}

pub(crate) type Failure = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let cli = Cli::parse();
    match cli.command {
        Command::Store(args) => store::run(args).await,
        Command::Hub(args) => hub::run(args).await,
        Command::Outbox(args) => outbox::run(args).await,
        Command::Slow(args) => slow::run(args).await,
        Command::Subscribe(args) => subscribe::run(args).await,
        Command::Sustained(args) => sustained::run(args).await,
        Command::Tls(args) => tls::run(args).await,
        Command::Chart(args) => report::chart(args),
    }?;
    if let Some(path) = &cli.json {
        report::write(path)?;
    }
    Ok(())
}

/// The guard of `mutex`, poisoned or not: a panicking task leaves a count
/// or a sample list as it was, still worth reading.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub(crate) fn percentile(samples: &mut [Duration], at: f64) -> Duration {
    samples.sort_unstable();
    let rank = ((at / 100.0) * samples.len() as f64).ceil() as usize;
    samples[rank.clamp(1, samples.len()) - 1]
}

pub(crate) fn micros(duration: Duration) -> String {
    if duration >= Duration::from_millis(10) {
        format!("{:.1} ms", duration.as_secs_f64() * 1e3)
    } else {
        format!("{} µs", duration.as_micros())
    }
}

/// A database created for one run and dropped after it.
pub(crate) struct ThrowawayDatabase {
    admin_url: String,
    name: String,
    pub(crate) url: String,
}

impl ThrowawayDatabase {
    pub(crate) async fn create(admin_url: &str) -> Result<Self, Failure> {
        use sqlx::Connection;
        let name = format!("websub_bench_{}", rand::rng().random_range(0..u32::MAX));
        let mut admin = sqlx::PgConnection::connect(admin_url).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await?;
        admin.close().await?;
        let url = websub_store::postgres::with_database(admin_url, &name);
        Ok(Self {
            admin_url: admin_url.to_owned(),
            name,
            url,
        })
    }

    pub(crate) async fn drop_it(self) -> Result<(), Failure> {
        use sqlx::Connection;
        let mut admin = sqlx::PgConnection::connect(&self.admin_url).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        )))
        .execute(&mut admin)
        .await?;
        Ok(())
    }
}

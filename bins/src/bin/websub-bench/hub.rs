//! `websub-bench hub`: what a user of `websubd` on its defaults sees, end
//! to end. websubd is started with only what a test needs (private
//! addresses allowed, the internal key for fat pings, a database, a port);
//! subscribers are nginx (see [`crate::nginx`]), and every subscription is
//! made through the hub's `POST /` and verified against nginx, as a
//! subscriber would make it. Each scenario is judged against the ceiling
//! `wrk` reaches into the same nginx in the same run (see [`crate::wrk`]).
//!
//! Scenarios:
//! - `one-host`: N subscriptions on one host, one fat ping, time until the
//!   last delivery.
//! - `mixed`: one host with many subscriptions beside many small hosts
//!   (distinct 127.x.y.z addresses) with a few each, one topic, one fat
//!   ping: when the small hosts had theirs, and the total.
//! - `outage`: callbacks on one topic, one of them on a second nginx that
//!   is stopped for a while and started again on its port; fat pings at a
//!   steady rate: what it got in the end, and how long after its return.
//! - `restart`: a fan-out during which websubd is killed (SIGKILL) and
//!   started again on the same database: the time from the restart until
//!   every subscriber had its delivery, the ones that never did, and the
//!   ones that got it twice.
//!
//! With `--baseline`, a second websubd binary runs every scenario too, the
//! two alternating, so both meet the same machine.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::seq::SliceRandom;
use websub_hub::delivery::net;

use crate::launch::{Hub, INTERNAL_KEY, fat_ping, is_loopback_url, locate_websubd, urlencode};
use crate::nginx::Nginx;
use crate::progress::Progress;
use crate::tally::{Follower, Tally, now_ms};
use crate::{Failure, ThrowawayDatabase, wrk};

mod scenarios;

/// The first of the small hosts of `mixed`: 127.0.1.1, so that 1 000 hosts
/// end at 127.0.4.232 and none is 127.0.0.1, the big host's.
const FIRST_HOST: u32 = u32::from_be_bytes([127, 0, 1, 1]);

/// The most small hosts `mixed` takes: nginx listens on each address.
const MOST_HOSTS: usize = 1_000;

/// How long subscribing may take, all requests and their verification.
const SUBSCRIBE_LIMIT: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Scenario {
    OneHost,
    Mixed,
    Outage,
    Restart,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Self::OneHost => "one-host",
            Self::Mixed => "mixed",
            Self::Outage => "outage",
            Self::Restart => "restart",
        }
    }
}

#[derive(Debug, clap::Args)]
pub(crate) struct HubArgs {
    /// The scenarios, comma-separated: one-host, mixed, outage (over 90 s
    /// a run), restart.
    #[arg(long, value_delimiter = ',', default_value = "one-host,mixed,restart")]
    scenario: Vec<Scenario>,
    /// Runs of each scenario by each websubd binary.
    #[arg(long, default_value_t = 2)]
    runs: usize,
    /// The websubd binary [default: next to this one].
    #[arg(long)]
    websubd: Option<PathBuf>,
    /// A second websubd binary that runs each scenario too, alternating
    /// with the first (baseline, new, baseline, new, …).
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// An extra websubd flag (repeatable), added after the ones every run
    /// needs, e.g. `--hub-arg=--delivery-per-host=64`; the defaults
    /// otherwise.
    #[arg(long = "hub-arg", allow_hyphen_values = true)]
    hub_args: Vec<String>,
    /// A PostgreSQL server on loopback for websubd; the bench creates and
    /// drops a database per run. An SQLite file per run otherwise.
    #[arg(long, env = "WEBSUB_BENCH_DATABASE_URL")]
    postgres: Option<String>,
    /// Subscribe requests in flight at once.
    #[arg(long, default_value_t = 64)]
    subscribe_concurrency: usize,
    /// Size of each published JSON body, and of wrk's.
    #[arg(long, default_value_t = 1024)]
    body_bytes: usize,
    /// one-host: subscriptions.
    #[arg(long, default_value_t = 10_000)]
    one_host_subscribers: usize,
    /// mixed: subscriptions on the big host (127.0.0.1).
    #[arg(long, default_value_t = 50_000)]
    mixed_big: usize,
    /// mixed: small hosts, 127.0.1.1 onwards (at most 1000).
    #[arg(long, default_value_t = 500)]
    mixed_hosts: usize,
    /// mixed: subscriptions on each small host.
    #[arg(long, default_value_t = 20)]
    mixed_per_host: usize,
    /// outage: callbacks on the topic, one of them on the host that goes
    /// down.
    #[arg(long, default_value_t = 100)]
    outage_callbacks: usize,
    /// outage: fat pings per second.
    #[arg(long, default_value_t = 2)]
    outage_rate: u32,
    /// outage: seconds of publishing.
    #[arg(long, default_value_t = 90)]
    outage_seconds: u64,
    /// outage: seconds after the first ping when the host goes down.
    #[arg(long, default_value_t = 10)]
    outage_at: u64,
    /// outage: seconds the host stays down.
    #[arg(long, default_value_t = 60)]
    outage_down: u64,
    /// restart: subscriptions.
    #[arg(long, default_value_t = 10_000)]
    restart_subscribers: usize,
    /// restart: websubd is killed once this percentage of the deliveries
    /// arrived.
    #[arg(long, default_value_t = 20)]
    restart_kill_at: u8,
    /// Seconds a scenario waits for its deliveries: from the ping (from
    /// the restart for restart, from the last ping for outage). What has
    /// not arrived by then counts as lost.
    #[arg(long, default_value_t = 180)]
    deadline: u64,
    /// Keep the scratch directory (nginx's configuration and logs,
    /// websubd's logs and databases) after a run that succeeded too.
    #[arg(long)]
    keep_logs: bool,
}

impl HubArgs {
    /// Every bad value is named, before anything starts.
    fn validate(&self) -> Result<(), Failure> {
        let positive = [
            ("--runs", self.runs),
            ("--subscribe-concurrency", self.subscribe_concurrency),
            ("--one-host-subscribers", self.one_host_subscribers),
            ("--mixed-big", self.mixed_big),
            ("--mixed-hosts", self.mixed_hosts),
            ("--mixed-per-host", self.mixed_per_host),
            ("--restart-subscribers", self.restart_subscribers),
            ("--deadline", usize::try_from(self.deadline).unwrap_or(1)),
            (
                "--outage-seconds",
                usize::try_from(self.outage_seconds).unwrap_or(1),
            ),
            (
                "--outage-down",
                usize::try_from(self.outage_down).unwrap_or(1),
            ),
        ];
        if let Some((flag, _)) = positive.iter().find(|(_, value)| *value == 0) {
            return Err(format!("{flag} 0: must be at least 1").into());
        }
        if self.scenario.is_empty() {
            return Err("--scenario: name at least one of one-host, mixed, outage, restart".into());
        }
        if self.mixed_hosts > MOST_HOSTS {
            return Err(format!(
                "--mixed-hosts {}: at most {MOST_HOSTS} (127.0.1.1 to 127.0.4.232)",
                self.mixed_hosts
            )
            .into());
        }
        if self.outage_callbacks < 2 {
            return Err(format!(
                "--outage-callbacks {}: at least 2, the one that goes down and one that stays",
                self.outage_callbacks
            )
            .into());
        }
        if !(1..=100).contains(&self.outage_rate) {
            return Err(format!("--outage-rate {}: 1 to 100 pings/s", self.outage_rate).into());
        }
        if self.outage_at + self.outage_down > self.outage_seconds {
            return Err(format!(
                "--outage-at {} + --outage-down {} is past --outage-seconds {}: the host must be back before the pings end",
                self.outage_at, self.outage_down, self.outage_seconds
            )
            .into());
        }
        if !(1..=99).contains(&self.restart_kill_at) {
            return Err(format!(
                "--restart-kill-at {}: a percentage from 1 to 99",
                self.restart_kill_at
            )
            .into());
        }
        if self.body_bytes < 16 {
            return Err(format!("--body-bytes {}: at least 16", self.body_bytes).into());
        }
        if let Some(url) = &self.postgres
            && !is_loopback_url(url)
        {
            return Err(format!("--postgres {url}: only a server on loopback may be used").into());
        }
        if let Some(flag) = self.hub_args.iter().find(|flag| {
            ["--listen", "--database-url", "--internal-api-key"]
                .iter()
                .any(|own| flag.starts_with(own))
        }) {
            return Err(format!("--hub-arg {flag}: the bench sets that one itself").into());
        }
        Ok(())
    }
}

/// One websubd binary under test.
struct Binary {
    label: &'static str,
    path: PathBuf,
}

/// One line of the table.
struct Row {
    scenario: &'static str,
    websubd: String,
    run: String,
    deliveries: Option<usize>,
    elapsed: Option<Duration>,
    rate: f64,
    /// Of the wrk ceiling measured for the scenario; none where the time
    /// is not set by throughput (outage, restart).
    share: Option<f64>,
    cpu_per_delivery: Option<Duration>,
    peak_rss: Option<u64>,
    details: String,
}

pub(crate) async fn run(args: HubArgs) -> Result<(), Failure> {
    net::install_crypto_provider();
    args.validate()?;
    let mut binaries = Vec::new();
    if let Some(baseline) = &args.baseline {
        binaries.push(Binary {
            label: "baseline",
            path: locate_websubd(Some(baseline))?,
        });
    }
    binaries.push(Binary {
        label: "new",
        path: locate_websubd(args.websubd.as_ref())?,
    });
    let scratch = std::env::temp_dir().join(format!("websub-bench-hub-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;

    // Dropping the measurement on a signal stops its nginx and websubd
    // processes, which a plain exit would leave running.
    let measured = tokio::select! {
        measured = measure(&args, &binaries, &scratch) => measured,
        signal = interrupted() => Err(format!("stopped by {signal}").into()),
    };
    let rows = match measured {
        Ok(rows) => rows,
        Err(error) => {
            eprintln!(
                "the logs of nginx and websubd are kept in {}",
                scratch.display()
            );
            return Err(error);
        }
    };
    if args.keep_logs {
        eprintln!("the logs of nginx and websubd are in {}", scratch.display());
    } else {
        std::fs::remove_dir_all(&scratch)?;
    }

    for binary in &binaries {
        println!("websubd ({}): {}", binary.label, binary.path.display());
    }
    let settings = format!(
        "settings: defaults{}; database: {}",
        if args.hub_args.is_empty() {
            String::new()
        } else {
            format!(" and {}", args.hub_args.join(" "))
        },
        if args.postgres.is_some() {
            "PostgreSQL"
        } else {
            "SQLite"
        }
    );
    println!("{settings}");
    println!();
    print_table(&rows, vec![settings]);
    Ok(())
}

async fn interrupted() -> &'static str {
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        _ = async {
            match &mut terminate {
                Some(terminate) => terminate.recv().await,
                None => std::future::pending().await,
            }
        } => "SIGTERM",
    }
}

async fn measure(args: &HubArgs, binaries: &[Binary], scratch: &Path) -> Result<Vec<Row>, Failure> {
    let body = json_body(args.body_bytes, None);
    let mut rows = Vec::new();
    for &scenario in &args.scenario {
        let dir = scratch.join(scenario.name());
        let mut addresses = vec![Ipv4Addr::LOCALHOST];
        if scenario == Scenario::Mixed {
            addresses.extend((0..args.mixed_hosts).map(small_host));
        }
        let nginx = Nginx::start(&dir.join("nginx"), &addresses).await?;
        eprintln!("{}: ceiling, {}", scenario.name(), wrk::COMMAND);
        let ceiling = wrk::ceiling(
            &dir,
            &format!("{}/ceiling", nginx.base(Ipv4Addr::LOCALHOST)),
            &body,
        )
        .await?;
        eprintln!("{}: ceiling {ceiling:.0} requests/s", scenario.name());
        rows.push(Row {
            scenario: scenario.name(),
            websubd: format!("{} → nginx", wrk::COMMAND),
            run: "ceiling".to_owned(),
            deliveries: None,
            elapsed: Some(Duration::from_secs(5)),
            rate: ceiling,
            share: Some(1.0),
            cpu_per_delivery: None,
            peak_rss: None,
            details: format!("{} B JSON POSTs answered 204", args.body_bytes),
        });
        for number in 1..=args.runs {
            for binary in binaries {
                let run = Run {
                    args,
                    websubd: &binary.path,
                    label: binary.label,
                    number,
                    dir: dir.join(format!("{}-{number}", binary.label)),
                    tag: format!("{}-{}-{number}", scenario.name(), binary.label),
                    ceiling,
                };
                std::fs::create_dir_all(&run.dir)?;
                eprintln!("{}: run {number}, {}", scenario.name(), binary.label);
                let database = Database::create(args, &run.dir).await?;
                let row = match scenario {
                    Scenario::OneHost => scenarios::one_host(&run, &nginx, &database.url).await,
                    Scenario::Mixed => scenarios::mixed(&run, &nginx, &database.url).await,
                    Scenario::Outage => scenarios::outage(&run, &nginx, &database.url).await,
                    Scenario::Restart => scenarios::restart(&run, &nginx, &database.url).await,
                };
                database.drop_it().await?;
                rows.push(row?);
            }
        }
    }
    Ok(rows)
}

/// One run of a scenario by one binary.
struct Run<'a> {
    args: &'a HubArgs,
    websubd: &'a Path,
    label: &'static str,
    number: usize,
    /// The run's own directory: its database (SQLite) and websubd's log.
    dir: PathBuf,
    /// Unique to the run: callback paths start with `/cb/<tag>/`.
    tag: String,
    ceiling: f64,
}

impl Run<'_> {
    fn prefix(&self) -> String {
        format!("/cb/{}/", self.tag)
    }

    /// A callback URL on `base` (an nginx address), of group `group`.
    fn callback(&self, base: &str, group: &str, index: usize) -> String {
        format!("{base}/cb/{}/{group}/{index}", self.tag)
    }

    fn topic(&self, base: &str) -> String {
        format!("{base}/topic/{}", self.tag)
    }

    /// Starts websubd on `database_url` with what every run needs and the
    /// extra flags, its log lines appended to the run's `websubd.log`; on
    /// `port` when given (a restart), a free port otherwise.
    async fn start_websubd(&self, database_url: &str, port: Option<u16>) -> Result<Hub, Failure> {
        let mut flags = vec![
            "--database-url",
            database_url,
            "--internal-api-key",
            INTERNAL_KEY,
            "--allow-private-network",
        ];
        flags.extend(self.args.hub_args.iter().map(String::as_str));
        let port = match port {
            Some(port) => port,
            None => std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
                .local_addr()?
                .port(),
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("websubd.log"))?;
        Hub::spawn_on(&self.websubd.to_owned(), port, &flags, Stdio::from(log))
            .await
            .map_err(|error| {
                format!(
                    "{error} (its log: {})",
                    self.dir.join("websubd.log").display()
                )
                .into()
            })
    }

    fn row(&self, scenario: Scenario) -> Row {
        Row {
            scenario: scenario.name(),
            websubd: self.label.to_owned(),
            run: self.number.to_string(),
            deliveries: None,
            elapsed: None,
            rate: 0.0,
            share: None,
            cpu_per_delivery: None,
            peak_rss: None,
            details: String::new(),
        }
    }
}

/// The database of one run.
struct Database {
    url: String,
    throwaway: Option<ThrowawayDatabase>,
}

impl Database {
    async fn create(args: &HubArgs, dir: &Path) -> Result<Self, Failure> {
        match &args.postgres {
            Some(admin) => {
                let database = ThrowawayDatabase::create(admin).await?;
                Ok(Self {
                    url: database.url.clone(),
                    throwaway: Some(database),
                })
            }
            None => Ok(Self {
                url: format!("sqlite:{}", dir.join("hub.db").display()),
                throwaway: None,
            }),
        }
    }

    async fn drop_it(self) -> Result<(), Failure> {
        match self.throwaway {
            Some(database) => database.drop_it().await,
            None => Ok(()),
        }
    }
}

/// 127.0.1.1, 127.0.1.2, …: the `index`-th small host.
fn small_host(index: usize) -> Ipv4Addr {
    Ipv4Addr::from(FIRST_HOST + u32::try_from(index).unwrap_or(u32::MAX - FIRST_HOST))
}

/// A JSON object of exactly `bytes` bytes (at least 16), numbered when
/// `sequence` is given.
fn json_body(bytes: usize, sequence: Option<u64>) -> String {
    let head = match sequence {
        Some(sequence) => format!("{{\"seq\":{sequence},\"bench\":\""),
        None => "{\"bench\":\"".to_owned(),
    };
    let padding = bytes.saturating_sub(head.len() + 2);
    format!("{head}{}\"}}", "x".repeat(padding))
}

fn print_table(rows: &[Row], notes: Vec<String>) {
    use crate::report::{Cell, Table};
    let dash = || Cell::text("–");
    let table = Table {
        benchmark: "hub".to_owned(),
        notes,
        columns: [
            "scenario",
            "websubd",
            "run",
            "deliveries",
            "elapsed",
            "deliveries/s",
            "% of wrk ceiling",
            "websubd CPU per delivery",
            "websubd peak RSS",
            "details",
        ]
        .map(str::to_owned)
        .to_vec(),
        rows: rows
            .iter()
            .map(|row| {
                vec![
                    Cell::text(row.scenario),
                    Cell::text(&row.websubd),
                    Cell::text(&row.run),
                    row.deliveries
                        .map_or_else(dash, |count| Cell::number(count.to_string(), count as f64)),
                    row.elapsed.map_or_else(dash, |elapsed| {
                        Cell::number(
                            format!("{:.2} s", elapsed.as_secs_f64()),
                            elapsed.as_secs_f64(),
                        )
                    }),
                    Cell::number(format!("{:.0}", row.rate), row.rate),
                    row.share.map_or_else(dash, |share| {
                        Cell::number(format!("{:.0} %", share * 100.0), share * 100.0)
                    }),
                    row.cpu_per_delivery.map_or_else(dash, |cpu| {
                        let micros = cpu.as_secs_f64() * 1e6;
                        Cell::number(format!("{micros:.1} µs"), micros)
                    }),
                    row.peak_rss.map_or_else(dash, |bytes| {
                        let megabytes = bytes as f64 / 1e6;
                        Cell::number(format!("{megabytes:.0} MB"), megabytes)
                    }),
                    if row.details.is_empty() {
                        dash()
                    } else {
                        Cell::text(&row.details)
                    },
                ]
            })
            .collect(),
    };
    crate::report::print(table);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_have_the_size_asked_for() {
        for bytes in [16, 1024, 4096] {
            let body = json_body(bytes, None);
            assert_eq!(body.len(), bytes);
            assert!(serde_json::from_str::<serde_json::Value>(&body).is_ok());
        }
        let numbered = json_body(1024, Some(179));
        assert_eq!(numbered.len(), 1024);
        assert!(numbered.starts_with("{\"seq\":179,"));
    }

    #[test]
    fn small_hosts_are_loopback_and_not_the_big_one() {
        assert_eq!(small_host(0), Ipv4Addr::new(127, 0, 1, 1));
        assert_eq!(small_host(MOST_HOSTS - 1), Ipv4Addr::new(127, 0, 4, 232));
        assert!((0..MOST_HOSTS).all(|index| small_host(index).is_loopback()));
    }
}

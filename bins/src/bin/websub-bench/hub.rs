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

use axum::http::StatusCode;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use websub_hub::delivery::net;

use crate::launch::{Hub, INTERNAL_KEY, fat_ping, is_loopback_url, locate_websubd, urlencode};
use crate::nginx::Nginx;
use crate::progress::Progress;
use crate::tally::{Follower, Tally, now_ms};
use crate::{Failure, ThrowawayDatabase, wrk};

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
                    Scenario::OneHost => one_host(&run, &nginx, &database.url).await,
                    Scenario::Mixed => mixed(&run, &nginx, &database.url).await,
                    Scenario::Outage => outage(&run, &nginx, &database.url).await,
                    Scenario::Restart => restart(&run, &nginx, &database.url).await,
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

/// Subscribes every callback to `topic` through the hub's `POST /`, a
/// bounded number at once, and waits until nginx has answered every
/// verification and the hub lists them all; returns how long it took.
async fn subscribe(
    run: &Run<'_>,
    hub: &Hub,
    follower: &Follower,
    topic: &str,
    callbacks: Vec<String>,
) -> Result<Duration, Failure> {
    let total = callbacks.len();
    let client = crate::launch::loopback_client(run.args.subscribe_concurrency)?;
    let callbacks = Arc::new(callbacks);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let deadline = started + SUBSCRIBE_LIMIT;
    let progress = Progress::follow(
        &format!("{}: verified", run.tag),
        total,
        follower.verified(),
    );
    let senders: Vec<_> = (0..run.args.subscribe_concurrency.min(total))
        .map(|_| {
            let (client, callbacks, next) = (client.clone(), callbacks.clone(), next.clone());
            let (hub_url, topic, tag) = (hub.url.clone(), topic.to_owned(), run.tag.clone());
            tokio::spawn(async move {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some(callback) = callbacks.get(index) else {
                        return Ok::<(), String>(());
                    };
                    let form = format!(
                        "hub.mode=subscribe&hub.topic={}&hub.callback={}&hub.secret=bench-{tag}-{index}",
                        urlencode(&topic),
                        urlencode(callback),
                    );
                    loop {
                        let response = client
                            .post(&hub_url)
                            .header("content-type", "application/x-www-form-urlencoded")
                            .body(form.clone())
                            .send()
                            .await
                            .map_err(|error| format!("subscribing {callback}: {error}"))?;
                        match response.status() {
                            StatusCode::ACCEPTED => break,
                            // Verifications waiting are bounded; the hub
                            // asks to come back later.
                            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS => {
                                if Instant::now() > deadline {
                                    return Err(format!(
                                        "subscribing {callback}: still answered {} after {SUBSCRIBE_LIMIT:?}",
                                        response.status()
                                    ));
                                }
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                            other => {
                                let reason = response.text().await.unwrap_or_default();
                                return Err(format!(
                                    "subscribing {callback}: the hub answered {other}: {reason}"
                                ));
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for sender in senders {
        sender.await??;
    }
    while follower.tally().verified() < total {
        if Instant::now() > deadline {
            return Err(format!(
                "{}: nginx answered {} of {total} verifications within {SUBSCRIBE_LIMIT:?}",
                run.tag,
                follower.tally().verified()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(progress);
    // The hub saves a subscription just after its verification answered.
    let client = crate::launch::loopback_client(1)?;
    loop {
        let listed = subscribers_of(&client, &hub.url, topic).await?;
        if listed >= total {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{}: the hub lists {listed} of {total} subscriptions within {SUBSCRIBE_LIMIT:?}",
                run.tag
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let elapsed = started.elapsed();
    eprintln!(
        "{}: {total} subscribed in {:.1} s",
        run.tag,
        elapsed.as_secs_f64()
    );
    Ok(elapsed)
}

/// How many subscriptions the hub's operator API lists for `topic`.
async fn subscribers_of(
    client: &reqwest::Client,
    hub_url: &str,
    topic: &str,
) -> Result<usize, Failure> {
    let response = client
        .get(format!("{hub_url}api/v1/operator/topics"))
        .header("X-Internal-API-Key", INTERNAL_KEY)
        .send()
        .await?;
    if !response.status().is_success() {
        return Err(format!("the operator API answered {}", response.status()).into());
    }
    let topics: serde_json::Value = response.json().await?;
    Ok(topics
        .as_array()
        .into_iter()
        .flatten()
        .find(|summary| summary["topic"] == topic)
        .and_then(|summary| summary["subscribers"].as_u64())
        .unwrap_or(0) as usize)
}

/// Sends one fat ping to `topic`; returns when it was sent, in ms since
/// the epoch, nginx's clock.
async fn ping(
    run: &Run<'_>,
    hub: &Hub,
    topic: &str,
    sequence: Option<u64>,
) -> Result<u64, Failure> {
    let client = crate::launch::loopback_client(1)?;
    let sent = now_ms();
    let body = json_body(run.args.body_bytes, sequence);
    if !fat_ping(&client, &hub.url, topic, "application/json", body).await? {
        return Err(format!("{}: the hub refused the fat ping", run.tag).into());
    }
    Ok(sent)
}

/// Waits until `expected` distinct deliveries arrived, or `deadline`;
/// true when they did.
async fn delivered(run: &Run<'_>, follower: &Follower, expected: usize, deadline: Instant) -> bool {
    let _progress = Progress::follow(
        &format!("{}: delivered", run.tag),
        expected,
        follower.distinct(),
    );
    loop {
        if follower.tally().distinct >= expected {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// websubd's CPU time since `before`, once it is idle: the last outcomes
/// are written a moment after the last delivery arrives.
async fn settled_cpu(hub: &Hub, before: Duration) -> Option<Duration> {
    let mut last = hub.cpu_time()?;
    // Idle: under 2 ms of CPU in 250 ms; or 10 s on.
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = hub.cpu_time()?;
        if now.saturating_sub(last) < Duration::from_millis(2) {
            break;
        }
        last = now;
    }
    Some(hub.cpu_time()?.saturating_sub(before))
}

fn per_delivery(cpu: Option<Duration>, deliveries: usize) -> Option<Duration> {
    Some(cpu? / u32::try_from(deliveries).ok()?.max(1))
}

fn seconds_between(from_ms: u64, to_ms: u64) -> Duration {
    Duration::from_millis(to_ms.saturating_sub(from_ms))
}

/// Fills in the columns every fan-out has, from one ping at `ping_ms` to
/// the last new delivery.
fn fan_out_row(
    run: &Run<'_>,
    scenario: Scenario,
    tally: &Tally,
    ping_ms: u64,
    cpu: Option<Duration>,
    peak_rss: Option<u64>,
) -> Row {
    let elapsed = seconds_between(ping_ms, tally.last_new_ms);
    let rate = tally.distinct as f64 / elapsed.as_secs_f64().max(1e-3);
    Row {
        deliveries: Some(tally.distinct),
        elapsed: Some(elapsed),
        rate,
        share: Some(rate / run.ceiling),
        cpu_per_delivery: per_delivery(cpu, tally.distinct),
        peak_rss,
        ..run.row(scenario)
    }
}

/// What a run did not get: appended to its details.
fn shortfall(tally: &Tally, expected: usize) -> String {
    let mut notes = Vec::new();
    if tally.distinct < expected {
        notes.push(format!(
            "INCOMPLETE: {} of {expected} by the deadline",
            tally.distinct
        ));
    }
    if tally.duplicates > 0 {
        notes.push(format!("{} duplicates", tally.duplicates));
    }
    if tally.refused > 0 {
        notes.push(format!("{} answered non-2xx", tally.refused));
    }
    notes.join("; ")
}

fn join(parts: &[String]) -> String {
    parts
        .iter()
        .filter(|part| !part.is_empty())
        .cloned()
        .collect::<Vec<_>>()
        .join("; ")
}

async fn one_host(run: &Run<'_>, nginx: &Nginx, database_url: &str) -> Result<Row, Failure> {
    let subscribers = run.args.one_host_subscribers;
    let base = nginx.base(Ipv4Addr::LOCALHOST);
    let topic = run.topic(&base);
    let callbacks = (0..subscribers)
        .map(|index| run.callback(&base, "0", index))
        .collect();
    let follower = Follower::start(&[nginx.access_log()], &run.prefix())?;
    let hub = run.start_websubd(database_url, None).await?;
    let subscribed = subscribe(run, &hub, &follower, &topic, callbacks).await?;

    let cpu_before = hub.cpu_time();
    let ping_ms = ping(run, &hub, &topic, None).await?;
    let deadline = Instant::now() + Duration::from_secs(run.args.deadline);
    delivered(run, &follower, subscribers, deadline).await;
    let cpu = match cpu_before {
        Some(before) => settled_cpu(&hub, before).await,
        None => None,
    };
    let peak_rss = hub.peak_rss();
    hub.stop();
    let tally = follower.tally();
    let mut row = fan_out_row(run, Scenario::OneHost, &tally, ping_ms, cpu, peak_rss);
    row.details = join(&[
        format!("subscribed in {:.1} s", subscribed.as_secs_f64()),
        shortfall(&tally, subscribers),
    ]);
    Ok(row)
}

async fn mixed(run: &Run<'_>, nginx: &Nginx, database_url: &str) -> Result<Row, Failure> {
    let args = run.args;
    let expected = args.mixed_big + args.mixed_hosts * args.mixed_per_host;
    let big = nginx.base(Ipv4Addr::LOCALHOST);
    let topic = run.topic(&big);
    // Group 0 is the big host, group h the h-th small one.
    let mut callbacks: Vec<String> = (0..args.mixed_big)
        .map(|index| run.callback(&big, "0", index))
        .collect();
    for host in 0..args.mixed_hosts {
        let base = nginx.base(small_host(host));
        let group = (host + 1).to_string();
        callbacks.extend((0..args.mixed_per_host).map(|index| run.callback(&base, &group, index)));
    }
    // Subscribers come in no particular order: the small hosts'
    // subscriptions are spread among the big host's, the same way in
    // every run.
    callbacks.shuffle(&mut rand::rngs::StdRng::seed_from_u64(1));
    let follower = Follower::start(&[nginx.access_log()], &run.prefix())?;
    let hub = run.start_websubd(database_url, None).await?;
    let subscribed = subscribe(run, &hub, &follower, &topic, callbacks).await?;

    let cpu_before = hub.cpu_time();
    let ping_ms = ping(run, &hub, &topic, None).await?;
    let deadline = Instant::now() + Duration::from_secs(args.deadline);
    delivered(run, &follower, expected, deadline).await;
    let cpu = match cpu_before {
        Some(before) => settled_cpu(&hub, before).await,
        None => None,
    };
    let peak_rss = hub.peak_rss();
    hub.stop();

    let tally = follower.tally();
    let prefix = run.prefix();
    // Per small host: its first delivery and its last one.
    let mut hosts: std::collections::HashMap<&str, (u64, u64, usize)> =
        std::collections::HashMap::new();
    for (path, received) in &tally.callbacks {
        let group = path
            .strip_prefix(&prefix)
            .and_then(|rest| rest.split('/').next())
            .unwrap_or("0");
        if group == "0" {
            continue;
        }
        let host = hosts.entry(group).or_insert((u64::MAX, 0, 0));
        host.0 = host.0.min(received.first_ms);
        host.1 = host.1.max(received.first_ms);
        host.2 += 1;
    }
    let small = args.mixed_hosts * args.mixed_per_host;
    let small_delivered: usize = hosts.values().map(|host| host.2).sum();
    let every_first = hosts.values().map(|host| host.0).max();
    let every_last = hosts.values().map(|host| host.1).max();
    let small_hosts = if hosts.len() == args.mixed_hosts && small_delivered == small {
        format!(
            "{} small hosts: each had its first delivery by {:.2} s, all {small} by {:.2} s",
            args.mixed_hosts,
            seconds_between(ping_ms, every_first.unwrap_or_default()).as_secs_f64(),
            seconds_between(ping_ms, every_last.unwrap_or_default()).as_secs_f64(),
        )
    } else {
        format!(
            "small hosts: INCOMPLETE, {small_delivered} of {small} delivered on {} of {} hosts",
            hosts.len(),
            args.mixed_hosts
        )
    };
    let mut row = fan_out_row(run, Scenario::Mixed, &tally, ping_ms, cpu, peak_rss);
    row.details = join(&[
        small_hosts,
        format!("subscribed in {:.1} s", subscribed.as_secs_f64()),
        shortfall(&tally, expected),
    ]);
    Ok(row)
}

async fn outage(run: &Run<'_>, nginx: &Nginx, database_url: &str) -> Result<Row, Failure> {
    let args = run.args;
    let mut down_host = Nginx::start(&run.dir.join("nginx-down"), &[Ipv4Addr::LOCALHOST]).await?;
    let base = nginx.base(Ipv4Addr::LOCALHOST);
    let topic = run.topic(&base);
    let down_callback = run.callback(&down_host.base(Ipv4Addr::LOCALHOST), "down", 0);
    let down_path = format!("{}down/0", run.prefix());
    let mut callbacks: Vec<String> = (0..args.outage_callbacks - 1)
        .map(|index| run.callback(&base, "0", index))
        .collect();
    callbacks.push(down_callback);
    let follower = Follower::start(&[nginx.access_log(), down_host.access_log()], &run.prefix())?;
    let hub = run.start_websubd(database_url, None).await?;
    subscribe(run, &hub, &follower, &topic, callbacks).await?;

    let pings = args.outage_seconds * u64::from(args.outage_rate);
    let cpu_before = hub.cpu_time();
    let first_ms = now_ms();
    let started = Instant::now();
    let publisher = tokio::spawn({
        let (hub_url, topic, body_bytes) = (hub.url.clone(), topic.clone(), args.body_bytes);
        let period = Duration::from_secs(1) / args.outage_rate;
        async move {
            let client = crate::launch::loopback_client(1).map_err(|error| error.to_string())?;
            let mut ticks = tokio::time::interval(period);
            let mut refused = 0_u64;
            for sequence in 0..pings {
                ticks.tick().await;
                let body = json_body(body_bytes, Some(sequence));
                match fat_ping(&client, &hub_url, &topic, "application/json", body).await {
                    Ok(true) => {}
                    Ok(false) | Err(_) => refused += 1,
                }
            }
            Ok::<u64, String>(refused)
        }
    });
    let progress = Progress::follow(
        &format!("{}: delivered", run.tag),
        usize::try_from(pings).unwrap_or(usize::MAX) * args.outage_callbacks,
        follower.distinct(),
    );
    tokio::time::sleep_until((started + Duration::from_secs(args.outage_at)).into()).await;
    down_host.stop().await?;
    let down_ms = now_ms();
    tokio::time::sleep_until(
        (started + Duration::from_secs(args.outage_at + args.outage_down)).into(),
    )
    .await;
    down_host.resume().await?;
    let up_ms = now_ms();
    let refused = tokio::time::timeout(Duration::from_secs(args.outage_seconds + 60), publisher)
        .await
        .map_err(|_| format!("{}: the pings did not end in time", run.tag))???;
    let published = pings - refused;
    let expected = usize::try_from(published).unwrap_or(usize::MAX) * args.outage_callbacks;
    let deadline = Instant::now() + Duration::from_secs(args.deadline);
    // The clock is read from nginx's log, so waiting does not count.
    delivered(run, &follower, expected, deadline).await;
    drop(progress);
    let cpu = match cpu_before {
        Some(before) => settled_cpu(&hub, before).await,
        None => None,
    };
    let peak_rss = hub.peak_rss();
    hub.stop();
    down_host.stop().await?;

    let tally = follower.tally();
    let everything = usize::try_from(published).unwrap_or(usize::MAX);
    let missing = tally.events() < everything;
    let down = tally.callbacks.get(down_path.as_str());
    let down_got = down.map_or(0, |received| received.events.len());
    let down_duplicates = down.map_or(0, |received| received.duplicates);
    let down_all = match down {
        Some(received) if down_got >= everything => format!(
            "all of them {:.1} s after its return",
            seconds_between(up_ms, received.last_new_ms).as_secs_f64()
        ),
        Some(received) if received.last_new_ms >= up_ms => {
            format!("not all by {} s after the last ping", args.deadline)
        }
        _ => format!(
            "none after its return, by {} s after the last ping",
            args.deadline
        ),
    };
    let others = tally
        .callbacks
        .iter()
        .filter(|(path, received)| {
            path.as_ref() != down_path.as_str() && received.events.len() >= everything
        })
        .count();
    let elapsed = seconds_between(first_ms, tally.last_new_ms);
    let rate = tally.distinct as f64 / elapsed.as_secs_f64().max(1e-3);
    Ok(Row {
        deliveries: Some(tally.distinct),
        elapsed: Some(elapsed),
        rate,
        cpu_per_delivery: per_delivery(cpu, tally.distinct),
        peak_rss,
        details: join(&[
            format!(
                "{published} events published ({refused} refused); the host down for {:.0} s got {down_got} of them, {down_all}, {down_duplicates} twice",
                seconds_between(down_ms, up_ms).as_secs_f64()
            ),
            format!("the other {}: {others} got all", args.outage_callbacks - 1),
            if missing {
                format!("{} events reached nobody", everything - tally.events())
            } else {
                String::new()
            },
            if tally.duplicates > 0 {
                format!("{} duplicates in all", tally.duplicates)
            } else {
                String::new()
            },
        ]),
        ..run.row(Scenario::Outage)
    })
}

async fn restart(run: &Run<'_>, nginx: &Nginx, database_url: &str) -> Result<Row, Failure> {
    let args = run.args;
    let subscribers = args.restart_subscribers;
    let base = nginx.base(Ipv4Addr::LOCALHOST);
    let topic = run.topic(&base);
    let callbacks = (0..subscribers)
        .map(|index| run.callback(&base, "0", index))
        .collect();
    let follower = Follower::start(&[nginx.access_log()], &run.prefix())?;
    let hub = run.start_websubd(database_url, None).await?;
    subscribe(run, &hub, &follower, &topic, callbacks).await?;

    let kill_at = (subscribers * usize::from(args.restart_kill_at)).div_ceil(100);
    let cpu_before = hub.cpu_time();
    let ping_ms = ping(run, &hub, &topic, None).await?;
    let deadline = Instant::now() + Duration::from_secs(args.deadline);
    if !delivered(run, &follower, kill_at, deadline).await {
        return Err(format!(
            "{}: {} of {kill_at} delivered before the kill, within {} s",
            run.tag,
            follower.tally().distinct,
            args.deadline
        )
        .into());
    }
    let first_cpu = match (cpu_before, hub.cpu_time()) {
        (Some(before), Some(now)) => Some(now.saturating_sub(before)),
        _ => None,
    };
    let first_rss = hub.peak_rss();
    let port = hub.port().ok_or("websubd's URL has no port")?;
    hub.kill();
    let killed_at = follower.tally().distinct;

    let restarted = Instant::now();
    let restart_ms = now_ms();
    let hub = run.start_websubd(database_url, Some(port)).await?;
    let ready = restarted.elapsed();
    let second_before = hub.cpu_time();
    let deadline = restarted + Duration::from_secs(args.deadline);
    let complete = delivered(run, &follower, subscribers, deadline).await;
    let second_cpu = match second_before {
        Some(before) => settled_cpu(&hub, before).await,
        None => None,
    };
    let peak_rss = hub.peak_rss().max(first_rss);
    hub.stop();

    let tally = follower.tally();
    let cpu = first_cpu
        .zip(second_cpu)
        .map(|(first, second)| first + second);
    let mut row = fan_out_row(run, Scenario::Restart, &tally, ping_ms, cpu, peak_rss);
    row.share = None;
    let lost = subscribers.saturating_sub(tally.callbacks.len());
    row.details = join(&[
        format!(
            "killed at {killed_at} delivered ({:.0} %); ready again in {:.1} s",
            100.0 * killed_at as f64 / subscribers as f64,
            ready.as_secs_f64()
        ),
        if complete {
            format!(
                "all delivered {:.1} s after the restart",
                seconds_between(restart_ms, tally.last_new_ms).as_secs_f64()
            )
        } else {
            String::new()
        },
        format!("lost {lost}"),
        format!("{} duplicates", tally.duplicates),
    ]);
    Ok(row)
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

//! `websub-bench sustained`: load held for a while rather than one burst.
//! T topics with S subscribers each (saved straight into the store; the
//! S-th subscriber of every topic on the S-th loopback host), fat
//! pings at a fixed rate to topics taken in turn for D seconds, through a
//! real `websubd` with retention on. Every ping carries the moment it was
//! sent, so the receiver measures each delivery's publish-to-receipt
//! latency; the table gives the deliveries per second held, the latency
//! percentiles, and the event log's size on disk at the end. With
//! `--window`, a second table follows the run window by window (the
//! deliveries received in each, their latency, the database's size at its
//! end): with a short `--retention`, whether disk use and latency stay flat
//! across several retention periods.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use websub_hub::delivery::net;

use crate::launch::{HubFlags, fat_ping, loopback_client, save_subscriptions, serve_on};
use crate::progress::Progress;
use crate::report::{self, Cell, Table, maybe};
use crate::{Failure, lock, micros, percentile};

#[derive(Debug, clap::Args)]
pub(crate) struct SustainedArgs {
    /// Topics.
    #[arg(long, default_value_t = 10_000)]
    topics: usize,
    /// Subscribers of each topic.
    #[arg(long, default_value_t = 10)]
    subscribers: usize,
    /// Fat pings per second.
    #[arg(long, default_value_t = 500)]
    rate: u32,
    /// Seconds of publishing.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// websubd's `--retention`.
    #[arg(long, default_value = "10m")]
    retention: String,
    /// Seconds of each window of the second table; none when 0.
    #[arg(long, default_value_t = 0)]
    window: u64,
    #[command(flatten)]
    hub: HubFlags,
}

/// The first subscriber host: 127.0.5.1, clear of `slow`'s hosts and of
/// 127.0.0.1, where websubd listens.
const FIRST_HOST: u32 = u32::from_be_bytes([127, 0, 5, 1]);

/// What the receiver keeps: a count, and for each delivery when it came
/// (since `origin`) and its latency.
#[derive(Clone)]
struct Receipts {
    origin: Instant,
    delivered: Arc<AtomicUsize>,
    latencies: Arc<Mutex<Vec<(Duration, Duration)>>>,
}

pub(crate) async fn run(args: SustainedArgs) -> Result<(), Failure> {
    net::install_crypto_provider();
    let pings = usize::try_from(u64::from(args.rate) * args.seconds)?;
    let expected = pings * args.subscribers;
    let receipts = Receipts {
        origin: Instant::now(),
        delivered: Arc::new(AtomicUsize::new(0)),
        latencies: Arc::new(Mutex::new(Vec::with_capacity(expected))),
    };
    let app = Router::new()
        .route("/cb/{name}", post(receive))
        .with_state(receipts.clone());
    // Each of a topic's subscribers is a host of its own, as subscribers
    // are: one origin for all would meet the per-host limit, not the hub's.
    let mut bases = Vec::with_capacity(args.subscribers);
    for subscriber in 0..args.subscribers {
        let offset = u32::try_from(subscriber)?;
        bases.push(serve_on(app.clone(), Ipv4Addr::from(FIRST_HOST + offset)).await?);
    }

    let scratch =
        std::env::temp_dir().join(format!("websub-bench-sustained-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let database = scratch.join("sustained.db");
    let database_url = args.hub.database_url(&scratch, "sustained.db");
    fn topic_of(topic: usize) -> String {
        format!("http://127.0.0.1:9/bench/sustained/{topic}")
    }
    eprintln!(
        "sustained: saving {} topics × {} subscribers",
        args.topics, args.subscribers
    );
    let subscribers = args.subscribers;
    save_subscriptions(&database_url, args.topics * subscribers, {
        let bases = bases.clone();
        move |index| {
            let (topic, subscriber) = (index / subscribers, index % subscribers);
            let base = &bases[subscriber];
            (topic_of(topic), format!("{base}/cb/t{topic}-s{subscriber}"))
        }
    })
    .await?;

    let hub = args
        .hub
        .spawn(&database_url, &["--retention", &args.retention])
        .await?;
    let sizes = DatabaseSize::new(&database_url, &database).await?;
    // A sample a second: the run is bounded in time, and so are they.
    let samples: Arc<Mutex<Vec<(Duration, u64)>>> = Arc::default();
    let sampling = (args.window > 0).then(|| {
        let (sizes, samples, origin) = (sizes.clone(), samples.clone(), receipts.origin);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(Duration::from_secs(1));
            loop {
                ticks.tick().await;
                let bytes = sizes.bytes().await;
                lock(&samples).push((origin.elapsed(), bytes));
            }
        })
    });
    let client = loopback_client(64)?;

    eprintln!(
        "sustained: {} pings/s for {} s ({expected} deliveries)",
        args.rate, args.seconds
    );
    let progress = Progress::follow("sustained", expected, receipts.delivered.clone());
    let started = Instant::now();
    let mut ticks = tokio::time::interval(Duration::from_secs(1) / args.rate);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    // Bounded: a hub that stops answering stops the publisher too, and the
    // run fails rather than piling up requests.
    let in_flight = Arc::new(tokio::sync::Semaphore::new(256));
    let refused = Arc::new(AtomicUsize::new(0));
    let mut publishes = tokio::task::JoinSet::new();
    for ping in 0..pings {
        ticks.tick().await;
        let permit = in_flight.clone().acquire_owned().await?;
        let (client, hub_url, topic) = (
            client.clone(),
            hub.url.clone(),
            topic_of(ping % args.topics),
        );
        let (origin, refused) = (receipts.origin, refused.clone());
        publishes.spawn(async move {
            let sent = origin.elapsed().as_nanos().to_string();
            if !matches!(
                fat_ping(&client, &hub_url, &topic, "text/plain", sent).await,
                Ok(true)
            ) {
                refused.fetch_add(1, Ordering::Relaxed);
            }
            drop(permit);
        });
    }
    let published = started.elapsed();
    while publishes.join_next().await.is_some() {}
    let deadline = Instant::now() + Duration::from_secs(300);
    while receipts.delivered.load(Ordering::Relaxed)
        < expected - refused.load(Ordering::Relaxed) * args.subscribers
    {
        if Instant::now() > deadline {
            return Err(format!(
                "{} of {expected} delivered within 300 s of the last ping",
                receipts.delivered.load(Ordering::Relaxed)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = started.elapsed();
    drop(progress);
    if let Some(sampling) = sampling {
        sampling.abort();
    }
    let samples = std::mem::take(&mut *lock(&samples));
    let peak_rss = hub.peak_rss();
    let log_bytes = sizes.bytes().await;
    hub.stop();
    std::fs::remove_dir_all(&scratch)?;

    let mut receipts_taken = std::mem::take(&mut *lock(&receipts.latencies));
    let mut latencies: Vec<Duration> = receipts_taken.iter().map(|(_, latency)| *latency).collect();
    let delivered = latencies.len();
    let mut table = Table::new(
        "sustained",
        &[
            "topics × subscribers",
            "pings/s",
            "publishing",
            "deliveries",
            "refused pings",
            "delivered /s",
            "p50",
            "p99",
            "max",
            "database at the end",
            "websubd peak RSS",
        ],
    );
    let rate = delivered as f64 / elapsed.as_secs_f64();
    let refused = refused.load(Ordering::Relaxed);
    let mut latency = |percent: f64| {
        let at = percentile(&mut latencies, percent);
        Cell::number(micros(at), at.as_secs_f64() * 1e6)
    };
    let (p50, p99, max) = (latency(50.0), latency(99.0), latency(100.0));
    table.rows.push(vec![
        Cell::text(format!("{} × {}", args.topics, args.subscribers)),
        Cell::number(args.rate.to_string(), args.rate as f64),
        Cell::number(
            format!("{:.1} s", published.as_secs_f64()),
            published.as_secs_f64(),
        ),
        Cell::number(delivered.to_string(), delivered as f64),
        Cell::number(refused.to_string(), refused as f64),
        Cell::number(format!("{rate:.0}"), rate),
        p50,
        p99,
        max,
        Cell::number(
            format!("{:.0} MB", log_bytes as f64 / 1e6),
            log_bytes as f64 / 1e6,
        ),
        maybe(peak_rss.map(|bytes| bytes as f64 / 1e6), |mb| {
            format!("{mb:.0} MB")
        }),
    ]);
    report::print(table);
    if args.window > 0 {
        let from = started.duration_since(receipts.origin);
        print_windows(
            &mut receipts_taken,
            &samples,
            from,
            Duration::from_secs(args.window),
        );
    }
    Ok(())
}

/// The second table: from `from`, window by window, the deliveries
/// received in each, their latency, and the database's size at its end.
fn print_windows(
    receipts: &mut [(Duration, Duration)],
    samples: &[(Duration, u64)],
    from: Duration,
    window: Duration,
) {
    receipts.sort_by_key(|(received, _)| *received);
    let Some(&(last, _)) = receipts.last() else {
        return;
    };
    println!();
    let mut table = Table::new(
        "sustained",
        &[
            "window",
            "deliveries",
            "delivered /s",
            "p50",
            "p99",
            "database at its end",
        ],
    );
    let mut start = from;
    while start <= last {
        let end = start + window;
        let mut latencies: Vec<Duration> = receipts
            .iter()
            .filter(|(received, _)| *received >= start && *received < end)
            .map(|(_, latency)| *latency)
            .collect();
        let size = samples
            .iter()
            .rev()
            .find(|(at, _)| *at <= end)
            .map(|(_, bytes)| *bytes as f64 / 1e6);
        let count = latencies.len();
        let mut latency = |percent: f64| {
            if count == 0 {
                Cell::text("–")
            } else {
                let at = percentile(&mut latencies, percent);
                Cell::number(micros(at), at.as_secs_f64() * 1e6)
            }
        };
        let (p50, p99) = (latency(50.0), latency(99.0));
        let rate = count as f64 / window.as_secs_f64();
        table.rows.push(vec![
            Cell::text(format!(
                "{:.0}–{:.0} s",
                (start - from).as_secs_f64(),
                (end - from).as_secs_f64()
            )),
            Cell::number(count.to_string(), count as f64),
            Cell::number(format!("{rate:.0}"), rate),
            p50,
            p99,
            maybe(size, |mb| format!("{mb:.1} MB")),
        ]);
        start = end;
    }
    report::print(table);
}

/// Where the size of the hub's database is read: its SQLite files, or the
/// PostgreSQL database's own count.
#[derive(Clone)]
enum DatabaseSize {
    Sqlite(std::path::PathBuf),
    Postgres(sqlx::PgPool),
}

impl DatabaseSize {
    async fn new(database_url: &str, sqlite_file: &std::path::Path) -> Result<Self, Failure> {
        if database_url.starts_with("sqlite:") {
            Ok(Self::Sqlite(sqlite_file.to_path_buf()))
        } else {
            Ok(Self::Postgres(
                sqlx::postgres::PgPoolOptions::new()
                    .max_connections(1)
                    .connect(database_url)
                    .await?,
            ))
        }
    }

    /// The bytes on disk now; 0 when they cannot be read.
    async fn bytes(&self) -> u64 {
        match self {
            Self::Sqlite(file) => ["", "-wal", "-shm"]
                .iter()
                .filter_map(|suffix| {
                    std::fs::metadata(format!("{}{suffix}", file.display()))
                        .ok()
                        .map(|metadata| metadata.len())
                })
                .sum(),
            Self::Postgres(pool) => {
                sqlx::query_scalar::<_, i64>("SELECT pg_database_size(current_database())")
                    .fetch_one(pool)
                    .await
                    .map_or(0, |bytes| u64::try_from(bytes).unwrap_or(0))
            }
        }
    }
}

/// Counts a delivery and its latency from the moment in its body.
async fn receive(State(receipts): State<Receipts>, body: Bytes) -> StatusCode {
    let received = receipts.origin.elapsed();
    let sent = std::str::from_utf8(&body)
        .ok()
        .and_then(|text| text.parse::<u64>().ok())
        .map(Duration::from_nanos);
    if let Some(sent) = sent {
        lock(&receipts.latencies).push((received, received.saturating_sub(sent)));
    }
    receipts.delivered.fetch_add(1, Ordering::Relaxed);
    StatusCode::NO_CONTENT
}

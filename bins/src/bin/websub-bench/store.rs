//! `websub-bench store`: loads each subscription backend with N
//! subscriptions over T topics and measures save throughput, `list_by_topic`
//! and `list_expiring` latency, and the memory backend's resident memory.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{Duration as Lease, Utc};
use rand::Rng;
use websub_store::memory::MemoryStore;
use websub_store::postgres::PostgresStore;
use websub_store::redis::RedisStore;
use websub_store::sqlite::SqliteStore;
use websub_store::{Subscription, SubscriptionStore};

use crate::report::{self, Cell, Table, maybe};
use crate::{Failure, ThrowawayDatabase, micros, percentile};

#[derive(Debug, clap::Args)]
pub(crate) struct StoreArgs {
    /// Subscriptions loaded into every backend.
    #[arg(long, default_value_t = 100_000)]
    subscriptions: usize,
    /// Topics the subscriptions are spread over.
    #[arg(long, default_value_t = 1_000)]
    topics: usize,
    /// A second, larger load for the memory and PostgreSQL backends (0: none).
    #[arg(long, default_value_t = 1_000_000)]
    large: usize,
    /// Concurrent tasks saving.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// list_by_topic calls sampled per run.
    #[arg(long, default_value_t = 2_000)]
    samples: usize,
    /// A PostgreSQL server; the bench creates and drops its own database.
    #[arg(long, env = "WEBSUB_BENCH_DATABASE_URL")]
    postgres: Option<String>,
    /// A Redis server; the bench uses its own key prefix and removes it.
    #[arg(long, env = "WEBSUB_BENCH_REDIS_URL")]
    redis: Option<String>,
}

/// One measured run of one backend.
#[derive(Debug)]
struct Row {
    backend: &'static str,
    subscriptions: usize,
    saves_per_second: f64,
    by_topic_p50: Duration,
    by_topic_p99: Duration,
    expiring_p50: Duration,
    expiring_rows: usize,
    rss_per_100k: Option<u64>,
}

pub(crate) async fn run(args: StoreArgs) -> Result<(), Failure> {
    if args.topics == 0 || args.subscriptions < args.topics {
        return Err(format!(
            "--subscriptions ({}) must be at least --topics ({}), which must be positive",
            args.subscriptions, args.topics
        )
        .into());
    }
    let mut rows = Vec::new();
    let mut sizes = vec![args.subscriptions];
    if args.large > 0 {
        sizes.push(args.large);
    }

    for &size in &sizes {
        // Memory first, in a process not yet grown by other backends, so its
        // resident-memory figure is its own.
        let before = resident_bytes();
        let store: Arc<dyn SubscriptionStore> = Arc::new(MemoryStore::new());
        let mut row = measure("memory", store.clone(), size, &args).await?;
        row.rss_per_100k = resident_bytes()
            .zip(before)
            .map(|(after, before)| after.saturating_sub(before) * 100_000 / size as u64);
        rows.push(row);
        drop(store);
    }

    let sqlite_dir = std::env::temp_dir().join(format!("websub-bench-{}", std::process::id()));
    std::fs::create_dir_all(&sqlite_dir)?;
    let sqlite_path = sqlite_dir.join("subscriptions.db");
    let sqlite = SqliteStore::connect(&format!("sqlite:{}", sqlite_path.display())).await?;
    rows.push(measure("sqlite", Arc::new(sqlite), args.subscriptions, &args).await?);
    std::fs::remove_dir_all(&sqlite_dir)?;

    if let Some(url) = &args.postgres {
        for &size in &sizes {
            let database = ThrowawayDatabase::create(url).await?;
            let store = PostgresStore::connect(&database.url).await?;
            let analyze = store.pool().clone();
            let after_load = async move {
                // What autovacuum does on a live database within a minute of
                // a bulk load; without statistics the planner guesses.
                sqlx::query("ANALYZE websub_subscriptions")
                    .execute(&analyze)
                    .await
                    .map(drop)
            };
            rows.push(
                measure_after("postgres", Arc::new(store.clone()), size, &args, after_load).await?,
            );
            store.pool().close().await;
            database.drop_it().await?;
        }
    } else {
        eprintln!("postgres: skipped (no --postgres URL)");
    }

    if let Some(url) = &args.redis {
        let prefix = format!("websub-bench-{}", std::process::id());
        let store = RedisStore::with_prefix(url, &prefix).await?;
        let measured = measure("redis", Arc::new(store), args.subscriptions, &args).await;
        remove_redis_prefix(url, &prefix).await?;
        rows.push(measured?);
    } else {
        eprintln!("redis: skipped (no --redis URL)");
    }

    print_table(&rows);
    Ok(())
}

async fn measure(
    backend: &'static str,
    store: Arc<dyn SubscriptionStore>,
    size: usize,
    args: &StoreArgs,
) -> Result<Row, Failure> {
    measure_after(backend, store, size, args, async {
        Ok::<(), sqlx::Error>(())
    })
    .await
}

/// Loads `size` subscriptions, runs `after_load`, then samples the queries.
async fn measure_after<E: std::error::Error + Send + Sync + 'static>(
    backend: &'static str,
    store: Arc<dyn SubscriptionStore>,
    size: usize,
    args: &StoreArgs,
    after_load: impl Future<Output = Result<(), E>>,
) -> Result<Row, Failure> {
    eprintln!("{backend}: loading {size} subscriptions");
    let now = Utc::now();
    let topics = args.topics;
    let started = Instant::now();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..args.concurrency.max(1) {
        let store = store.clone();
        let next = next.clone();
        workers.push(tokio::spawn(async move {
            loop {
                let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if index >= size {
                    return Ok::<(), websub_store::StoreError>(());
                }
                store.save(&subscription(index, topics, now)).await?;
            }
        }));
    }
    for worker in workers {
        worker.await??;
    }
    let saves_per_second = size as f64 / started.elapsed().as_secs_f64();
    after_load.await?;

    let mut rng = rand::rng();
    let mut by_topic = Vec::with_capacity(args.samples);
    for _ in 0..args.samples {
        let topic = topic_url(rng.random_range(0..topics));
        let started = Instant::now();
        let found = store.list_by_topic(&topic).await?;
        by_topic.push(started.elapsed());
        if found.len() < size / topics {
            return Err(format!("{backend}: {topic} lists {} subscriptions", found.len()).into());
        }
    }

    // Leases run out evenly over the next ten days: two hours from now is
    // about 0.8 % of them, what a reaper sweep sees on a busy hub.
    let mut expiring = Vec::new();
    let mut expiring_rows = 0;
    for _ in 0..20 {
        let started = Instant::now();
        expiring_rows = store
            .list_expiring(now + Lease::hours(2) + Lease::minutes(1))
            .await?
            .len();
        expiring.push(started.elapsed());
    }

    Ok(Row {
        backend,
        subscriptions: size,
        saves_per_second,
        by_topic_p50: percentile(&mut by_topic, 50.0),
        by_topic_p99: percentile(&mut by_topic, 99.0),
        expiring_p50: percentile(&mut expiring, 50.0),
        expiring_rows,
        rss_per_100k: None,
    })
}

fn topic_url(index: usize) -> String {
    format!("https://publisher.bench.example/topics/{index}")
}

/// The `index`-th subscription: round-robin over the topics, leases ending
/// evenly over ten days, a secret and an owner like a real one.
fn subscription(index: usize, topics: usize, now: chrono::DateTime<Utc>) -> Subscription {
    let lease = Lease::hours(1) + Lease::seconds((index as i64 * 7919) % (240 * 3600));
    Subscription::new(
        topic_url(index % topics),
        format!(
            "https://subscriber-{}.bench.example/callback?id={index}",
            index % 97
        ),
    )
    .with_lease(lease, now)
    .with_secret(format!("secret-{index}"))
    .with_owner(format!("owner-{}", index % 5_000))
}

/// This process's resident set size, from /proc.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn print_table(rows: &[Row]) {
    let mut table = Table::new(
        "store",
        &[
            "backend",
            "subscriptions",
            "save/s",
            "list_by_topic p50",
            "list_by_topic p99",
            "list_expiring p50 (rows)",
            "RSS per 100k",
        ],
    );
    let latency = |duration: Duration| Cell::number(micros(duration), duration.as_secs_f64() * 1e6);
    for row in rows {
        table.rows.push(vec![
            Cell::text(row.backend),
            Cell::number(row.subscriptions.to_string(), row.subscriptions as f64),
            Cell::number(format!("{:.0}", row.saves_per_second), row.saves_per_second),
            latency(row.by_topic_p50),
            latency(row.by_topic_p99),
            Cell::number(
                format!("{} ({})", micros(row.expiring_p50), row.expiring_rows),
                row.expiring_p50.as_secs_f64() * 1e6,
            ),
            maybe(
                row.rss_per_100k
                    .map(|bytes| bytes as f64 / (1024.0 * 1024.0)),
                |mib| format!("{mib:.1} MiB"),
            ),
        ]);
    }
    report::print(table);
}

async fn remove_redis_prefix(url: &str, prefix: &str) -> Result<(), Failure> {
    let client = redis::Client::open(url)?;
    let mut connection = client.get_multiplexed_async_connection().await?;
    let pattern = format!("{{{prefix}:*");
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(10_000)
            .query_async(&mut connection)
            .await?;
        if !keys.is_empty() {
            let _: () = redis::cmd("UNLINK")
                .arg(&keys)
                .query_async(&mut connection)
                .await?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

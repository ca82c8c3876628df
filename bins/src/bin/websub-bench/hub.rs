//! `websub-bench hub`: the hub end to end, against a real `websubd` process.
//!
//! 1. The ceiling: keep-alive POSTs/s from the hub's own HTTP client to a
//!    loopback server answering 204, at the concurrency the hub is given.
//! 2. Fan-out: N subscribers on loopback receivers, one fat ping, time until
//!    every subscriber has its delivery; SQLite, PostgreSQL, and a larger N
//!    on PostgreSQL. websubd's peak resident memory is read from /proc. On
//!    PostgreSQL a thin ping follows: the hub fetches the topic from the
//!    receiver, and the line's "first delivery" counts from that fetch, so
//!    it shows what the hub does before its first POST at that size.
//! 3. Subscribe throughput: N subscribe requests, time until all are
//!    verified and saved.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::StatusCode;
use websub_hub::net::{self, NetPolicy};
use websub_store::SubscriptionStore;

use crate::launch::{Hub, INTERNAL_KEY, locate_websubd, save_subscriptions, urlencode};
use crate::receiver::Receiver;
use crate::{Failure, ThrowawayDatabase};

#[derive(Debug, clap::Args)]
pub(crate) struct HubArgs {
    /// Subscribers of the fan-out and subscribe runs.
    #[arg(long, default_value_t = 10_000)]
    subscribers: usize,
    /// Subscribers of the large fan-out on PostgreSQL (0: skip it).
    #[arg(long, default_value_t = 100_000)]
    large: usize,
    /// Deliveries in flight at once, for the hub and the ceiling alike.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Size of the published body.
    #[arg(long, default_value_t = 1024)]
    body_bytes: usize,
    /// A PostgreSQL server; the bench creates and drops its own databases.
    #[arg(long, env = "WEBSUB_BENCH_DATABASE_URL")]
    postgres: Option<String>,
    /// The websubd binary [default: next to this one].
    #[arg(long)]
    websubd: Option<PathBuf>,
}

/// One line of the table.
struct Line {
    measurement: String,
    count: usize,
    /// From the request (for a thin ping: from the topic fetch) to the
    /// first delivery, for fan-outs.
    first: Option<Duration>,
    elapsed: Duration,
    rate: f64,
    peak_rss: Option<u64>,
    /// websubd's CPU time (user and system) per delivery, outcomes
    /// written included.
    cpu_per_delivery: Option<Duration>,
}

pub(crate) async fn run(args: HubArgs) -> Result<(), Failure> {
    net::install_crypto_provider();
    let websubd = locate_websubd(args.websubd.as_ref())?;
    let receiver = Receiver::start().await?;
    let mut lines = Vec::new();

    let ceiling = ceiling(&receiver, args.concurrency, args.body_bytes).await?;
    eprintln!("ceiling: {ceiling:.0} POSTs/s");
    lines.push(Line {
        measurement: format!("ceiling: POSTs/s, {} in flight", args.concurrency),
        count: 50_000,
        first: None,
        elapsed: Duration::from_secs_f64(50_000.0 / ceiling),
        rate: ceiling,
        peak_rss: None,
        cpu_per_delivery: None,
    });

    let scratch = std::env::temp_dir().join(format!("websub-bench-hub-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let sqlite = format!("sqlite:{}", scratch.join("fanout.db").display());
    lines.extend(
        fan_out(
            &websubd,
            &receiver,
            &sqlite,
            "sqlite",
            args.subscribers,
            &args,
        )
        .await?,
    );

    if let Some(admin) = &args.postgres {
        let mut sizes = vec![args.subscribers];
        if args.large > 0 {
            sizes.push(args.large);
        }
        for size in sizes {
            let database = ThrowawayDatabase::create(admin).await?;
            let lines_of_size =
                fan_out(&websubd, &receiver, &database.url, "postgres", size, &args).await;
            database.drop_it().await?;
            lines.extend(lines_of_size?);
        }
    } else {
        eprintln!("postgres: skipped (no --postgres URL)");
    }

    let subscribe_db = format!("sqlite:{}", scratch.join("subscribe.db").display());
    lines.push(subscribe(&websubd, &receiver, &subscribe_db, args.subscribers, &args).await?);
    std::fs::remove_dir_all(&scratch)?;

    println!(
        "| measurement | count | first delivery | time | rate /s | % of ceiling | websubd peak RSS | websubd CPU per delivery |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for line in &lines {
        println!(
            "| {} | {} | {} | {:.2} s | {:.0} | {} | {} | {} |",
            line.measurement,
            line.count,
            line.first
                .map(|first| format!("{:.0} ms", first.as_secs_f64() * 1e3))
                .unwrap_or_else(|| "–".to_owned()),
            line.elapsed.as_secs_f64(),
            line.rate,
            if line.measurement.starts_with("fan-out") || line.measurement.starts_with("thin") {
                format!("{:.0} %", 100.0 * line.rate / ceiling)
            } else {
                "–".to_owned()
            },
            line.peak_rss
                .map(|bytes| format!("{:.0} MB", bytes as f64 / 1e6))
                .unwrap_or_else(|| "–".to_owned()),
            line.cpu_per_delivery
                .map(|cpu| format!("{:.1} µs", cpu.as_secs_f64() * 1e6))
                .unwrap_or_else(|| "–".to_owned()),
        );
    }
    Ok(())
}

/// POSTs/s the hub's own client reaches against a 204 on loopback.
async fn ceiling(
    receiver: &Receiver,
    concurrency: usize,
    body_bytes: usize,
) -> Result<f64, Failure> {
    const REQUESTS: usize = 50_000;
    let policy = NetPolicy {
        allow_private_network: true,
    };
    let client = websub_hub::delivery::client::for_deliveries(
        &policy,
        Duration::from_secs(10),
        concurrency,
    )?;
    let body = Bytes::from(vec![b'x'; body_bytes]);
    let url = format!("{}/sink", receiver.base);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (client, body, url, next) =
                (client.clone(), body.clone(), url.clone(), next.clone());
            tokio::spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < REQUESTS {
                    let response = client
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(body.clone())
                        .send()
                        .await
                        .map_err(|error| error.to_string())?;
                    if !response.status().is_success() {
                        return Err(format!("the sink answered {}", response.status()));
                    }
                }
                Ok::<(), String>(())
            })
        })
        .collect();
    for worker in workers {
        worker.await??;
    }
    Ok(REQUESTS as f64 / started.elapsed().as_secs_f64())
}

/// websubd's CPU time since `before`, per delivery of `deliveries`, once its
/// outcomes are written: the last ones are recorded a moment after the last
/// delivery arrives, so the reading waits until websubd is idle.
async fn settled_cpu(hub: &Hub, before: Option<Duration>, deliveries: usize) -> Option<Duration> {
    let before = before?;
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
    Some(hub.cpu_time()?.saturating_sub(before) / u32::try_from(deliveries).ok()?.max(1))
}

async fn fan_out(
    websubd: &PathBuf,
    receiver: &Receiver,
    database_url: &str,
    backend: &str,
    subscribers: usize,
    args: &HubArgs,
) -> Result<Vec<Line>, Failure> {
    eprintln!("{backend}: saving {subscribers} subscriptions");
    let prefix = format!("fan{subscribers}{backend}");
    let (base, topic) = (receiver.base.clone(), receiver.topic.clone());
    save_subscriptions(database_url, subscribers, move |index| {
        (topic.clone(), format!("{base}/cb/{prefix}-{index}"))
    })
    .await?;
    let hub = spawn_hub(websubd, database_url, args).await?;
    let publisher = crate::launch::loopback_client(1)?;

    receiver.reset();
    eprintln!("{backend}: publishing to {subscribers}");
    let cpu_before = hub.cpu_time();
    let started = Instant::now();
    let response = publisher
        .post(format!(
            "{}?hub.mode=publish&hub.topic={}",
            hub.url,
            urlencode(&receiver.topic)
        ))
        .header("content-type", "application/json")
        .header("X-Internal-API-Key", INTERNAL_KEY)
        .body(vec![b'x'; args.body_bytes])
        .send()
        .await?;
    if response.status() != StatusCode::ACCEPTED {
        return Err(format!("the fat ping answered {}", response.status()).into());
    }
    let elapsed = receiver.all_delivered(backend, subscribers).await?;
    let first = receiver.first_delivery().map(|at| at - started);
    let cpu_per_delivery = settled_cpu(&hub, cpu_before, subscribers).await;
    let mut lines = vec![Line {
        measurement: format!("fan-out, {backend}: deliveries/s to the last delivery"),
        count: subscribers,
        first,
        elapsed: elapsed - started,
        rate: subscribers as f64 / (elapsed - started).as_secs_f64(),
        peak_rss: hub.peak_rss(),
        cpu_per_delivery,
    }];

    if backend == "postgres" {
        receiver.reset();
        eprintln!("{backend}: thin ping to {subscribers}");
        let cpu_before = hub.cpu_time();
        let response = publisher
            .post(&hub.url)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!(
                "hub.mode=publish&hub.url={}",
                urlencode(&receiver.topic)
            ))
            .send()
            .await?;
        if !response.status().is_success() {
            return Err(format!("the thin ping answered {}", response.status()).into());
        }
        let elapsed = receiver.all_delivered(backend, subscribers).await?;
        let fetched = receiver
            .fetched()
            .ok_or("the thin ping's topic was never fetched")?;
        let first = receiver.first_delivery().map(|at| at - fetched);
        let cpu_per_delivery = settled_cpu(&hub, cpu_before, subscribers).await;
        lines.push(Line {
            measurement: format!(
                "thin ping, {backend}: deliveries/s from the topic fetch to the last delivery"
            ),
            count: subscribers,
            first,
            elapsed: elapsed - fetched,
            rate: subscribers as f64 / (elapsed - fetched).as_secs_f64(),
            peak_rss: hub.peak_rss(),
            cpu_per_delivery,
        });
    }
    hub.stop();
    Ok(lines)
}

async fn subscribe(
    websubd: &PathBuf,
    receiver: &Receiver,
    database_url: &str,
    subscribers: usize,
    args: &HubArgs,
) -> Result<Line, Failure> {
    let hub = spawn_hub(websubd, database_url, args).await?;
    let store = websub_hub::server::open_store(database_url).await?;
    let client = crate::launch::loopback_client(64)?;
    eprintln!("subscribe: {subscribers} requests");
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..64)
        .map(|_| {
            let (client, next, hub_url, base, topic) = (
                client.clone(),
                next.clone(),
                hub.url.clone(),
                receiver.base.clone(),
                receiver.topic.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    if index >= subscribers {
                        return Ok::<(), String>(());
                    }
                    let form = format!(
                        "hub.mode=subscribe&hub.topic={}&hub.callback={}",
                        urlencode(&topic),
                        urlencode(&format!("{base}/cb/sub{index}"))
                    );
                    let response = client
                        .post(&hub_url)
                        .header("content-type", "application/x-www-form-urlencoded")
                        .body(form)
                        .send()
                        .await
                        .map_err(|error| error.to_string())?;
                    if response.status() != StatusCode::ACCEPTED {
                        return Err(format!("subscribe answered {}", response.status()));
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await??;
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    while store.list_by_topic(&receiver.topic).await?.len() < subscribers {
        if Instant::now() > deadline {
            return Err("subscriptions were not all verified within 300 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = started.elapsed();
    let peak_rss = hub.peak_rss();
    hub.stop();
    Ok(Line {
        measurement: "subscribe, sqlite: verified subscriptions/s".to_owned(),
        count: subscribers,
        first: None,
        elapsed,
        rate: subscribers as f64 / elapsed.as_secs_f64(),
        peak_rss,
        cpu_per_delivery: None,
    })
}

/// websubd with the hub bench's concurrency, for the hub and per host.
async fn spawn_hub(websubd: &PathBuf, database_url: &str, args: &HubArgs) -> Result<Hub, Failure> {
    let concurrency = args.concurrency.to_string();
    Hub::spawn_with(
        websubd,
        &[
            "--database-url",
            database_url,
            "--internal-api-key",
            INTERNAL_KEY,
            "--delivery-concurrency",
            &concurrency,
            "--delivery-per-host",
            &concurrency,
            "--allow-private-network",
        ],
    )
    .await
}

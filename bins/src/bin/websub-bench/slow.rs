//! `websub-bench slow`: a fan-out of the shape the internet has, on
//! loopback. N subscriptions spread over H distinct callback hosts (the
//! addresses 127.0.1.1, 127.0.1.2, … each with its own listener), every
//! healthy callback answering after a delay, and a share of the hosts dead:
//! they accept the connection and never answer. One fat ping goes to all of
//! them through a real `websubd` on its defaults; the clock runs until every
//! healthy callback has its delivery. websubd's peak memory, its peak of
//! open file descriptors and its CPU time are read from /proc while it runs.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use tokio::sync::Notify;
use websub_hub::delivery::net;

use crate::Failure;
use crate::launch::{HubFlags, fat_ping, loopback_client, save_subscriptions};
use crate::progress::Progress;
use crate::report::{self, Cell, Table, maybe};

/// The first of the loopback hosts: 127.0.1.1, so that 1 000 hosts end at
/// 127.0.4.232 and none is 127.0.0.1, where websubd itself listens.
const FIRST_HOST: u32 = u32::from_be_bytes([127, 0, 1, 1]);

#[derive(Debug, clap::Args)]
pub(crate) struct SlowArgs {
    /// Subscriptions of the topic.
    #[arg(long, default_value_t = 100_000)]
    subscribers: usize,
    /// Distinct callback hosts they are spread over.
    #[arg(long, default_value_t = 1_000)]
    hosts: usize,
    /// How long a healthy callback takes to answer, in milliseconds.
    #[arg(long, default_value_t = 200)]
    delay_ms: u64,
    /// Percent of the hosts that never answer.
    #[arg(long, default_value_t = 1.0)]
    dead_percent: f64,
    #[command(flatten)]
    hub: HubFlags,
}

/// What the callbacks saw.
#[derive(Clone)]
struct Callbacks {
    delivered: Arc<AtomicUsize>,
    arrived: Arc<Notify>,
    delay: Duration,
}

pub(crate) async fn run(args: SlowArgs) -> Result<(), Failure> {
    net::install_crypto_provider();
    if args.hosts == 0 || args.hosts > 60_000 || args.subscribers < args.hosts {
        return Err(format!(
            "--hosts {} must be between 1 and 60000 and at most --subscribers {}",
            args.hosts, args.subscribers
        )
        .into());
    }
    let dead_every = if args.dead_percent > 0.0 {
        (100.0 / args.dead_percent).round().max(1.0) as usize
    } else {
        usize::MAX
    };
    let is_dead =
        move |host: usize| dead_every != usize::MAX && host % dead_every == dead_every - 1;

    let callbacks = Callbacks {
        delivered: Arc::new(AtomicUsize::new(0)),
        arrived: Arc::new(Notify::new()),
        delay: Duration::from_millis(args.delay_ms),
    };
    eprintln!("slow: {} callback hosts listening", args.hosts);
    let mut addresses = Vec::with_capacity(args.hosts);
    for host in 0..args.hosts {
        addresses.push(listen(host, is_dead(host), &callbacks).await?);
    }
    let healthy = (0..args.subscribers)
        .filter(|index| !is_dead(index % args.hosts))
        .count();

    let scratch = std::env::temp_dir().join(format!("websub-bench-slow-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let database_url = args.hub.database_url(&scratch, "slow.db");
    let topic = "http://127.0.0.1:9/bench/slow";
    eprintln!("slow: saving {} subscriptions", args.subscribers);
    let callback_addresses = Arc::new(addresses);
    save_subscriptions(&database_url, args.subscribers, {
        let addresses = callback_addresses.clone();
        move |index| {
            let host = addresses[index % addresses.len()];
            (topic.to_owned(), format!("http://{host}/cb/{index}"))
        }
    })
    .await?;

    let hub = args.hub.spawn(&database_url, &[]).await?;
    let cpu_before = hub.cpu_time().unwrap_or_default();

    eprintln!(
        "slow: publishing to {} ({healthy} healthy)",
        args.subscribers
    );
    let started = Instant::now();
    if !fat_ping(
        &loopback_client(1)?,
        &hub.url,
        topic,
        "application/json",
        vec![b'x'; 1024],
    )
    .await?
    {
        return Err("the fat ping was refused".into());
    }

    let progress = Progress::follow("slow", healthy, callbacks.delivered.clone());
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut peak_files = 0;
    let elapsed = loop {
        let arrived = callbacks.arrived.notified();
        if callbacks.delivered.load(Ordering::Relaxed) >= healthy {
            break started.elapsed();
        }
        if Instant::now() > deadline {
            return Err(format!(
                "only {} of {healthy} healthy callbacks delivered within 600 s",
                callbacks.delivered.load(Ordering::Relaxed)
            )
            .into());
        }
        peak_files = peak_files.max(hub.open_files().unwrap_or(0));
        let _ = tokio::time::timeout(Duration::from_millis(50), arrived).await;
    };
    drop(progress);
    let cpu = hub
        .cpu_time()
        .unwrap_or_default()
        .saturating_sub(cpu_before);
    let peak_rss = hub.peak_rss();
    hub.stop();
    std::fs::remove_dir_all(&scratch)?;

    let settings = args.hub.settings();
    let mut table = Table::new(
        "slow",
        &[
            "websubd",
            "subscriptions",
            "hosts",
            "dead hosts",
            "answer after",
            "healthy delivered",
            "time to the last healthy",
            "rate /s",
            "websubd peak RSS",
            "peak open files",
            "websubd CPU per delivery",
        ],
    );
    let dead = (0..args.hosts).filter(|host| is_dead(*host)).count();
    let rate = healthy as f64 / elapsed.as_secs_f64();
    let cpu_micros = cpu.as_secs_f64() * 1e6 / healthy as f64;
    table.rows.push(vec![
        Cell::text(settings),
        Cell::number(args.subscribers.to_string(), args.subscribers as f64),
        Cell::number(args.hosts.to_string(), args.hosts as f64),
        Cell::number(dead.to_string(), dead as f64),
        Cell::number(format!("{} ms", args.delay_ms), args.delay_ms as f64),
        Cell::number(healthy.to_string(), healthy as f64),
        Cell::number(
            format!("{:.2} s", elapsed.as_secs_f64()),
            elapsed.as_secs_f64(),
        ),
        Cell::number(format!("{rate:.0}"), rate),
        maybe(peak_rss.map(|bytes| bytes as f64 / 1e6), |mb| {
            format!("{mb:.0} MB")
        }),
        Cell::number(peak_files.to_string(), peak_files as f64),
        Cell::number(format!("{cpu_micros:.0} µs"), cpu_micros),
    ]);
    report::print(table);
    Ok(())
}

/// Starts the `host`-th callback host on its own loopback address and a
/// free port; returns its `address:port`.
async fn listen(host: usize, dead: bool, callbacks: &Callbacks) -> Result<SocketAddr, Failure> {
    let offset = u32::try_from(host)?;
    let address = IpAddr::V4(Ipv4Addr::from(FIRST_HOST + offset));
    let listener = tokio::net::TcpListener::bind((address, 0)).await?;
    let bound = listener.local_addr()?;
    let app = if dead {
        Router::new().route("/cb/{index}", post(never_answer))
    } else {
        Router::new()
            .route("/cb/{index}", post(answer_after_delay))
            .with_state(callbacks.clone())
    };
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(bound)
}

async fn answer_after_delay(State(callbacks): State<Callbacks>, _body: Bytes) -> StatusCode {
    tokio::time::sleep(callbacks.delay).await;
    callbacks.delivered.fetch_add(1, Ordering::Relaxed);
    callbacks.arrived.notify_waiters();
    StatusCode::NO_CONTENT
}

/// A dead host: the connection is accepted and the request read, and then
/// nothing, until the hub gives up on it.
async fn never_answer() -> StatusCode {
    std::future::pending().await
}

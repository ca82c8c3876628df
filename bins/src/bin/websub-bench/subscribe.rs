//! `websub-bench subscribe`: N subscribe requests to a real `websubd` on
//! its defaults, from concurrent clients (coming back after a `503`). Each
//! is answered 202 and verified later by a GET the loopback callback
//! echoes; the bench times the acceptance of all N and their verification
//! up to the last subscription saved, and reads websubd's peak memory.
//! With `--baseline`, a second websubd binary runs too, alternating with
//! the first, each run on a database (and a topic) of its own.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{RawQuery, State};
use axum::routing::get;
use websub_hub::delivery::net;

use crate::Failure;
use crate::launch::{
    HubFlags, locate_websubd, loopback_client, serve, subscribe_until_accepted, urlencode,
};
use crate::progress::Progress;
use crate::report::{self, Cell, Table, maybe};

#[derive(Debug, clap::Args)]
pub(crate) struct SubscribeArgs {
    /// Subscribe requests sent.
    #[arg(long, default_value_t = 10_000)]
    subscribers: usize,
    /// Requests in flight at once from the bench.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Runs by each websubd binary.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// A second websubd binary that runs too, alternating with the first
    /// (baseline, new, baseline, new, …).
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// Which websubd runs (the new one), on which database, with which
    /// settings; `--hub-arg=--max-pending-verifications=100000` lets every
    /// request of the default 100 000 wait at once.
    #[command(flatten)]
    hub: HubFlags,
}

/// What one run measured.
struct Measured {
    accepted_in: Duration,
    shed: usize,
    saved_in: Duration,
    peak_pending: usize,
    peak_rss: Option<u64>,
}

pub(crate) async fn run(args: SubscribeArgs) -> Result<(), Failure> {
    net::install_crypto_provider();
    let verified = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/cb/{index}", get(echo_challenge))
        .with_state(verified.clone());
    let base = serve(app).await?;
    let mut binaries = Vec::new();
    if let Some(baseline) = &args.baseline {
        binaries.push(("baseline", locate_websubd(Some(baseline))?));
    }
    binaries.push(("new", args.hub.binary()?));
    eprintln!(
        "subscribe: {} requests from {} clients",
        args.subscribers, args.clients
    );
    let mut rows = Vec::new();
    for number in 1..=args.runs {
        for (label, websubd) in &binaries {
            eprintln!("subscribe: run {number}, {label}");
            verified.store(0, Ordering::Relaxed);
            let run = format!("{label}-{number}");
            let measured = measure(&args, websubd, &base, &run, &verified).await?;
            rows.push((*label, number, measured));
        }
    }
    for (label, websubd) in &binaries {
        println!("websubd ({label}): {}", websubd.display());
    }
    println!("settings: {}", args.hub.settings());
    let mut table = Table::new(
        "subscribe",
        &[
            "websubd",
            "run",
            "subscribe requests",
            "clients",
            "accepted /s",
            "time to all accepted",
            "answered 503",
            "verified and saved /s",
            "time to all saved",
            "peak waiting",
            "websubd peak RSS",
        ],
    );
    for (label, number, measured) in rows {
        let accepted = args.subscribers as f64 / measured.accepted_in.as_secs_f64();
        let saved = args.subscribers as f64 / measured.saved_in.as_secs_f64();
        let seconds = |duration: Duration| {
            Cell::number(
                format!("{:.2} s", duration.as_secs_f64()),
                duration.as_secs_f64(),
            )
        };
        table.rows.push(vec![
            Cell::text(label),
            Cell::text(number.to_string()),
            Cell::number(args.subscribers.to_string(), args.subscribers as f64),
            Cell::number(args.clients.to_string(), args.clients as f64),
            Cell::number(format!("{accepted:.0}"), accepted),
            seconds(measured.accepted_in),
            Cell::number(measured.shed.to_string(), measured.shed as f64),
            Cell::number(format!("{saved:.0}"), saved),
            seconds(measured.saved_in),
            Cell::number(
                measured.peak_pending.to_string(),
                measured.peak_pending as f64,
            ),
            maybe(measured.peak_rss.map(|bytes| bytes as f64 / 1e6), |mb| {
                format!("{mb:.0} MB")
            }),
        ]);
    }
    report::print(table);
    Ok(())
}

/// One run, named `run`: `websubd` on a fresh database (or the one
/// given), every request subscribing a callback of `base` to a topic of
/// the run's own.
async fn measure(
    args: &SubscribeArgs,
    websubd: &PathBuf,
    base: &str,
    run: &str,
    verified: &Arc<AtomicUsize>,
) -> Result<Measured, Failure> {
    let topic = &format!("{base}/topic-{run}");
    let scratch = std::env::temp_dir().join(format!(
        "websub-bench-subscribe-{}-{run}",
        std::process::id()
    ));
    std::fs::create_dir_all(&scratch)?;
    let database_url = args.hub.database_url(&scratch, "subscribe.db");
    let hub = args.hub.spawn_binary(websubd, &database_url, &[]).await?;
    let client = loopback_client(args.clients)?;

    let accepted = Arc::new(AtomicUsize::new(0));
    let shed = Arc::new(AtomicUsize::new(0));
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(900);
    let progress = Progress::follow("verified", args.subscribers, verified.clone());
    let senders: Vec<_> = (0..args.clients)
        .map(|_| {
            let (client, hub_url, base, topic) = (
                client.clone(),
                hub.url.clone(),
                base.to_owned(),
                topic.to_owned(),
            );
            let (accepted, shed, next) = (accepted.clone(), shed.clone(), next.clone());
            let total = args.subscribers;
            tokio::spawn(async move {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    if index >= total {
                        return Ok::<(), String>(());
                    }
                    let form = format!(
                        "hub.mode=subscribe&hub.topic={}&hub.callback={}",
                        urlencode(&topic),
                        urlencode(&format!("{base}/cb/{index}"))
                    );
                    let sheds = subscribe_until_accepted(
                        &client,
                        &hub_url,
                        form,
                        Duration::from_millis(100),
                        deadline,
                    )
                    .await?;
                    shed.fetch_add(sheds, Ordering::Relaxed);
                    accepted.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let mut all_accepted = None;
    let mut peak_pending = 0;
    loop {
        let (done, waiting) = (
            verified.load(Ordering::Relaxed),
            accepted.load(Ordering::Relaxed),
        );
        peak_pending = peak_pending.max(waiting.saturating_sub(done));
        if all_accepted.is_none() && waiting >= args.subscribers {
            all_accepted = Some(started.elapsed());
        }
        if done >= args.subscribers {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("{done} of {} verified within 900 s", args.subscribers).into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for sender in senders {
        sender.await??;
    }
    // The callback answered every verification; the subscription is saved
    // just after, so the clock stops when the store holds them all.
    let store = websub_hub::server::open_store(&database_url).await?;
    while store
        .list_by_topic_page(topic, None, args.subscribers)
        .await?
        .len()
        < args.subscribers
    {
        if Instant::now() > deadline {
            return Err("verified subscriptions were not all saved within 900 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let saved_in = started.elapsed();
    drop(progress);
    let peak_rss = hub.peak_rss();
    hub.stop();
    std::fs::remove_dir_all(&scratch)?;
    Ok(Measured {
        accepted_in: all_accepted.unwrap_or(saved_in),
        shed: shed.load(Ordering::Relaxed),
        saved_in,
        peak_pending,
        peak_rss,
    })
}

async fn echo_challenge(
    State(verified): State<Arc<AtomicUsize>>,
    RawQuery(query): RawQuery,
) -> String {
    verified.fetch_add(1, Ordering::Relaxed);
    url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .find(|(key, _)| key == "hub.challenge")
        .map(|(_, value)| value.into_owned())
        .unwrap_or_default()
}

//! `websub-bench subscribe`: N subscribe requests to a real `websubd`, from
//! enough concurrent clients that the client is not what limits it. Each is
//! answered 202 and verified later by a GET the loopback callback echoes;
//! the bench times the acceptance of all N and their verification, and
//! reads websubd's peak memory while up to N verifications wait.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::routing::get;
use websub_hub::net;

use crate::Failure;
use crate::launch::{HubFlags, loopback_client, serve, urlencode};
use crate::progress::Progress;

#[derive(Debug, clap::Args)]
pub(crate) struct SubscribeArgs {
    /// Subscribe requests sent.
    #[arg(long, default_value_t = 100_000)]
    subscribers: usize,
    /// Requests in flight at once from the bench.
    #[arg(long, default_value_t = 128)]
    clients: usize,
    /// websubd runs with room for every request to wait for its
    /// verification.
    #[command(flatten)]
    hub: HubFlags,
}

pub(crate) async fn run(args: SubscribeArgs) -> Result<(), Failure> {
    net::install_crypto_provider();
    let verified = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/cb/{index}", get(echo_challenge))
        .with_state(verified.clone());
    let base = serve(app).await?;

    let scratch =
        std::env::temp_dir().join(format!("websub-bench-subscribe-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let database_url = args.hub.database_url(&scratch, "subscribe.db");
    let max_pending = args.subscribers.to_string();
    let hub = args
        .hub
        .spawn(
            &database_url,
            &["--max-pending-verifications", &max_pending],
        )
        .await?;
    let client = loopback_client(args.clients)?;

    let topic = format!("{base}/topic");
    let accepted = Arc::new(AtomicUsize::new(0));
    let shed = Arc::new(AtomicUsize::new(0));
    let next = Arc::new(AtomicUsize::new(0));
    eprintln!(
        "subscribe: {} requests from {} clients",
        args.subscribers, args.clients
    );
    let started = Instant::now();
    let progress = Progress::follow("verified", args.subscribers, verified.clone());
    let senders: Vec<_> = (0..args.clients)
        .map(|_| {
            let (client, hub_url, base, topic) =
                (client.clone(), hub.url.clone(), base.clone(), topic.clone());
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
                    loop {
                        let response = client
                            .post(&hub_url)
                            .header("content-type", "application/x-www-form-urlencoded")
                            .body(form.clone())
                            .send()
                            .await
                            .map_err(|error| error.to_string())?;
                        match response.status() {
                            StatusCode::ACCEPTED => break,
                            StatusCode::SERVICE_UNAVAILABLE => {
                                shed.fetch_add(1, Ordering::Relaxed);
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                            other => return Err(format!("subscribe answered {other}")),
                        }
                    }
                    accepted.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let mut all_accepted = None;
    let mut peak_pending = 0;
    let deadline = started + Duration::from_secs(900);
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
        .list_by_topic_page(&topic, None, args.subscribers)
        .await?
        .len()
        < args.subscribers
    {
        if Instant::now() > deadline {
            return Err("verified subscriptions were not all saved within 900 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = started.elapsed();
    drop(progress);
    let peak_rss = hub.peak_rss();
    hub.stop();
    std::fs::remove_dir_all(&scratch)?;

    let all_accepted = all_accepted.unwrap_or(elapsed);
    println!(
        "| subscribe requests | clients | accepted /s | time to all accepted | answered 503 | verified and saved /s | time to all saved | peak waiting | websubd peak RSS |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {} | {} | {:.0} | {:.2} s | {} | {:.0} | {:.2} s | {peak_pending} | {} |",
        args.subscribers,
        args.clients,
        args.subscribers as f64 / all_accepted.as_secs_f64(),
        all_accepted.as_secs_f64(),
        shed.load(Ordering::Relaxed),
        args.subscribers as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64(),
        peak_rss
            .map(|bytes| format!("{:.0} MB", bytes as f64 / 1e6))
            .unwrap_or_else(|| "–".to_owned()),
    );
    Ok(())
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

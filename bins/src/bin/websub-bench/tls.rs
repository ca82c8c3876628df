//! `websub-bench tls`: the fan-out of `websub-bench hub` to HTTPS
//! callbacks, against plain HTTP in the same run.
//!
//! The bench makes a CA and a server certificate for 127.0.0.1 (rcgen),
//! serves the same receiver over plain HTTP and over TLS (one host each),
//! saves N subscriptions to each, and starts one real `websubd` trusting
//! the CA through `--extra-ca`. Each round fat-pings every kind in turn
//! (the order rotating, so load on the machine falls on each alike) and
//! times until all N deliveries arrived:
//! - HTTP;
//! - HTTPS, the receiver keeping connections alive, as the target judges;
//! - HTTPS, the receiver closing each connection after one answer, so that
//!   every delivery costs a handshake (resumed, when a ticket is at hand).
//!
//! Besides the rates it reads, per delivery, the CPU time of websubd and
//! of this process (the receivers, TLS included) from /proc, the
//! handshakes the HTTPS receivers saw, and websubd's peak memory.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use websub_hub::delivery::net;

use crate::Failure;
use crate::https::{Connections, HttpsServer, TestCa};
use crate::launch::{
    Hub, INTERNAL_KEY, cpu_time, fat_ping, locate_websubd, loopback_client, save_subscriptions,
};
use crate::receiver::Receiver;
use crate::report::{self, Cell, Table};

#[derive(Debug, clap::Args)]
pub(crate) struct TlsArgs {
    /// Subscribers of each kind (HTTP, HTTPS, HTTPS reconnecting).
    #[arg(long, default_value_t = 10_000)]
    subscribers: usize,
    /// Rounds; each fans out once to every kind.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Deliveries in flight at once, overall and per host.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Size of the published body.
    #[arg(long, default_value_t = 1024)]
    body_bytes: usize,
    /// The websubd binary [default: next to this one].
    #[arg(long)]
    websubd: Option<PathBuf>,
}

/// How the callbacks of one receiver are reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Http,
    Https,
    HttpsReconnecting,
}

impl Kind {
    const ALL: [Self; 3] = [Self::Http, Self::Https, Self::HttpsReconnecting];

    fn label(self) -> &'static str {
        match self {
            Self::Http => "HTTP",
            Self::Https => "HTTPS, kept alive",
            Self::HttpsReconnecting => "HTTPS, a connection per delivery",
        }
    }
}

/// One receiver and, for HTTPS, the TLS server in front of it.
struct Target {
    kind: Kind,
    receiver: Receiver,
    tls: Option<HttpsServer>,
}

impl Target {
    /// (full, resumed, failed) handshakes so far; none for plain HTTP.
    fn handshakes(&self) -> (usize, usize, usize) {
        self.tls.as_ref().map_or((0, 0, 0), |server| {
            let counted = &server.handshakes;
            (counted.full(), counted.resumed(), counted.failed())
        })
    }
}

/// One fan-out to one kind.
struct Sample {
    round: usize,
    kind: Kind,
    rate: f64,
    /// CPU of websubd per delivery.
    hub_cpu: Duration,
    /// CPU of this process (the receivers) per delivery.
    receiver_cpu: Duration,
    /// Handshakes during the fan-out: full, resumed, failed.
    handshakes: (usize, usize, usize),
}

pub(crate) async fn run(args: TlsArgs) -> Result<(), Failure> {
    net::install_crypto_provider();
    let websubd = locate_websubd(args.websubd.as_ref())?;
    let scratch = std::env::temp_dir().join(format!("websub-bench-tls-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let ca = TestCa::new("websub-bench test CA")?;
    let ca_file = scratch.join("extra-ca.pem");
    std::fs::write(&ca_file, ca.pem())?;
    // One configuration, so one ticket key, for both TLS receivers: the
    // hub's session cache is per host name (127.0.0.1), not per port, so
    // tickets from one must open the other, as on one real host.
    let server_config = ca.server_config()?;

    let mut targets = Vec::new();
    for kind in Kind::ALL {
        let target = match kind {
            Kind::Http => Target {
                kind,
                receiver: Receiver::start().await?,
                tls: None,
            },
            Kind::Https | Kind::HttpsReconnecting => {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
                let (receiver, app) =
                    Receiver::with_routes(format!("https://{}", listener.local_addr()?));
                let connections = if kind == Kind::Https {
                    Connections::KeepAlive
                } else {
                    Connections::CloseEach
                };
                let tls = HttpsServer::serve(listener, app, server_config.clone(), connections)?;
                Target {
                    kind,
                    receiver,
                    tls: Some(tls),
                }
            }
        };
        targets.push(target);
    }

    let database = format!("sqlite:{}", scratch.join("tls.db").display());
    for target in &targets {
        eprintln!(
            "{}: saving {} subscriptions",
            target.kind.label(),
            args.subscribers
        );
        let prefix = format!("{:?}", target.kind).to_lowercase();
        let (base, topic) = (target.receiver.base.clone(), target.receiver.topic.clone());
        save_subscriptions(&database, args.subscribers, move |index| {
            (topic.clone(), format!("{base}/cb/{prefix}-{index}"))
        })
        .await?;
    }
    let concurrency = args.concurrency.to_string();
    let ca_path = ca_file.to_str().ok_or("the scratch path is not UTF-8")?;
    let hub = Hub::spawn_with(
        &websubd,
        &[
            "--database-url",
            &database,
            "--internal-api-key",
            INTERNAL_KEY,
            "--delivery-concurrency",
            &concurrency,
            "--delivery-per-host",
            &concurrency,
            "--allow-private-network",
            "--extra-ca",
            ca_path,
        ],
    )
    .await?;
    let publisher = loopback_client(1)?;

    let mut samples = Vec::new();
    for round in 1..=args.rounds {
        for offset in 0..targets.len() {
            let target = &targets[(round - 1 + offset) % targets.len()];
            samples.push(fan_out(&hub, &publisher, target, round, &args).await?);
        }
    }
    let peak_rss = hub.peak_rss();
    hub.stop();
    std::fs::remove_dir_all(&scratch)?;
    print_tables(&samples, &args, peak_rss);
    Ok(())
}

/// One fat ping to `target`'s topic, timed until every subscriber has it.
async fn fan_out(
    hub: &Hub,
    publisher: &reqwest::Client,
    target: &Target,
    round: usize,
    args: &TlsArgs,
) -> Result<Sample, Failure> {
    let receiver = &target.receiver;
    receiver.reset();
    let handshakes_before = target.handshakes();
    let hub_cpu_before = cpu_time(hub.pid()).ok_or("websubd's CPU time is unreadable")?;
    let own_cpu_before =
        cpu_time(std::process::id()).ok_or("the bench's CPU time is unreadable")?;
    let started = Instant::now();
    let body = vec![b'x'; args.body_bytes];
    if !fat_ping(
        publisher,
        &hub.url,
        &receiver.topic,
        "application/json",
        body,
    )
    .await?
    {
        return Err("the fat ping was refused".into());
    }
    let label = format!("round {round}, {}", target.kind.label());
    let done = receiver.all_delivered(&label, args.subscribers).await?;
    let elapsed = done - started;
    let per_delivery = |cpu: Duration| cpu / args.subscribers as u32;
    let handshakes_after = target.handshakes();
    Ok(Sample {
        round,
        kind: target.kind,
        rate: args.subscribers as f64 / elapsed.as_secs_f64(),
        hub_cpu: per_delivery(
            cpu_time(hub.pid())
                .ok_or("websubd's CPU time is unreadable")?
                .saturating_sub(hub_cpu_before),
        ),
        receiver_cpu: per_delivery(
            cpu_time(std::process::id())
                .ok_or("the bench's CPU time is unreadable")?
                .saturating_sub(own_cpu_before),
        ),
        handshakes: (
            handshakes_after.0 - handshakes_before.0,
            handshakes_after.1 - handshakes_before.1,
            handshakes_after.2 - handshakes_before.2,
        ),
    })
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        len if len % 2 == 1 => values[len / 2],
        len => (values[len / 2 - 1] + values[len / 2]) / 2.0,
    }
}

fn print_tables(samples: &[Sample], args: &TlsArgs, peak_rss: Option<u64>) {
    let of = |kind: Kind| samples.iter().filter(move |sample| sample.kind == kind);
    println!(
        "{} subscribers of each kind on one host, {} in flight, {} B bodies, {} rounds",
        args.subscribers, args.concurrency, args.body_bytes, args.rounds
    );
    println!();
    let mut rounds = Table::new(
        "tls",
        &[
            "round",
            "HTTP /s",
            "HTTPS kept alive /s",
            "HTTPS ÷ HTTP",
            "HTTPS, a connection per delivery /s",
            "handshakes kept alive (full / resumed)",
            "handshakes per delivery (full / resumed)",
        ],
    );
    for round in 1..=args.rounds {
        let sample = |kind: Kind| {
            samples
                .iter()
                .find(|sample| sample.round == round && sample.kind == kind)
        };
        let rate = |kind: Kind| sample(kind).map_or(f64::NAN, |sample| sample.rate);
        let handshakes = |kind: Kind| {
            Cell::text(sample(kind).map_or_else(String::new, |sample| {
                let (full, resumed, failed) = sample.handshakes;
                if failed > 0 {
                    format!("{full} / {resumed} ({failed} failed)")
                } else {
                    format!("{full} / {resumed}")
                }
            }))
        };
        let per_second = |kind: Kind| Cell::number(format!("{:.0}", rate(kind)), rate(kind));
        let share = 100.0 * rate(Kind::Https) / rate(Kind::Http);
        rounds.rows.push(vec![
            Cell::number(round.to_string(), round as f64),
            per_second(Kind::Http),
            per_second(Kind::Https),
            Cell::number(format!("{share:.0} %"), share),
            per_second(Kind::HttpsReconnecting),
            handshakes(Kind::Https),
            handshakes(Kind::HttpsReconnecting),
        ]);
    }
    report::print(rounds);
    println!();
    let mut medians = Table::new(
        "tls",
        &[
            "callbacks",
            "median deliveries/s",
            "% of HTTP",
            "websubd CPU per delivery",
            "receiver CPU per delivery",
            "handshakes, all rounds (full / resumed)",
        ],
    );
    let http = median(of(Kind::Http).map(|sample| sample.rate).collect());
    for kind in Kind::ALL {
        let rate = median(of(kind).map(|sample| sample.rate).collect());
        let micros = |pick: fn(&Sample) -> Duration| {
            median(
                of(kind)
                    .map(|sample| pick(sample).as_secs_f64() * 1e6)
                    .collect(),
            )
        };
        let (full, resumed) = of(kind).fold((0, 0), |(full, resumed), sample| {
            (full + sample.handshakes.0, resumed + sample.handshakes.1)
        });
        let share = 100.0 * rate / http;
        let hub_cpu = micros(|sample| sample.hub_cpu);
        let receiver_cpu = micros(|sample| sample.receiver_cpu);
        medians.rows.push(vec![
            Cell::text(kind.label()),
            Cell::number(format!("{rate:.0}"), rate),
            Cell::number(format!("{share:.0} %"), share),
            Cell::number(format!("{hub_cpu:.0} µs"), hub_cpu),
            Cell::number(format!("{receiver_cpu:.0} µs"), receiver_cpu),
            Cell::text(if kind == Kind::Http {
                "–".to_owned()
            } else {
                format!("{full} / {resumed}")
            }),
        ]);
    }
    report::print(medians);
    if let Some(bytes) = peak_rss {
        println!();
        println!("websubd peak RSS: {:.0} MB", bytes as f64 / 1e6);
    }
}

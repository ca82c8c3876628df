//! `websub-bench outbox`: the transactional outbox path, on one PostgreSQL.
//!
//! 1. The producers' own rate: N events committed one per transaction (with
//!    `NOTIFY`) from P connections, with nothing consuming. Measured once
//!    before the end-to-end run and twice after it, and the comparison is
//!    with the median: on a machine whose cores the database shares, the
//!    rate drifts by a fifth from minute to minute, and one sample is not
//!    enough to compare with.
//! 2. The claim ceiling: due delivery rows claimed 100 at a time with
//!    `FOR UPDATE SKIP LOCKED` and marked processed, rows/s.
//! 3. End to end: the same producers commit N more events while a real
//!    `websubd` with a feed of that outbox (starting from now, on analyzed
//!    tables that hold the earlier events) delivers each to one webhook on
//!    loopback:
//!    delivered events/s, commit-to-receipt latency, the backlog left when
//!    the producers stop, and how long it takes to drain.
//!
//! The producers use the project's producer library by default, which
//! names each event in its `NOTIFY`. With `--bare-notify` they write the
//! same row with plain SQL and send `NOTIFY <channel>` without a payload,
//! as a producer in another language does: the hub then learns only that
//! something was committed and finds the events by scanning the outbox.
//! Both modes write identical rows, so the runs differ only in the
//! notification.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use sqlx::PgConnection;
use sqlx::postgres::{PgPool, PgPoolOptions};
use uuid::Uuid;
use websub_hub::delivery::outbox::{Event, Outbox, OutboxTables, ddl, scan_index_ddl};
use websub_hub::signature::MESSAGING_EVENT_ID_HEADER;

use crate::launch::{Hub, locate_websubd};
use crate::report::{self, Cell, Table};
use crate::{Failure, ThrowawayDatabase, lock, micros, percentile};

#[derive(Debug, clap::Args)]
pub(crate) struct OutboxArgs {
    /// A PostgreSQL server; the bench creates and drops its own database.
    #[arg(long, env = "WEBSUB_BENCH_DATABASE_URL")]
    postgres: String,
    /// Events committed by the producers in each run.
    #[arg(long, default_value_t = 10_000)]
    events: usize,
    /// Producer connections, each committing one event per transaction.
    #[arg(long, default_value_t = 4)]
    producers: usize,
    /// The websubd binary [default: next to this one].
    #[arg(long)]
    websubd: Option<PathBuf>,
    /// Producers write the outbox row with plain SQL and send a `NOTIFY`
    /// without payload, instead of using the producer library.
    #[arg(long)]
    bare_notify: bool,
    /// Creates the optional index on the outbox's `created_at` (`websub
    /// outbox-ddl --scan-index`) with the tables.
    #[arg(long)]
    scan_index: bool,
}

/// What an outbox bench event carries: about 1 KiB of JSON.
struct BenchEvent {
    sequence: usize,
    filler: Arc<str>,
}

impl Event for BenchEvent {
    fn name(&self) -> &str {
        "bench.order.created"
    }
    fn resource_type(&self) -> &str {
        "order"
    }
    fn resource_id(&self) -> String {
        self.sequence.to_string()
    }
    fn event_type(&self) -> &str {
        "created"
    }
    fn payload(&self) -> Result<serde_json::Value, serde_json::Error> {
        Ok(serde_json::json!({ "sequence": self.sequence, "filler": &*self.filler }))
    }
}

/// When each event was committed.
type Commits = Vec<(Uuid, Instant)>;

/// How the producers write each event in its transaction.
enum Producer {
    /// The producer library: the row, then `pg_notify(channel, event id)`.
    Library(Outbox),
    /// By hand, as a producer without the library: a plain `INSERT` of the
    /// library's columns, then a `NOTIFY` that names no event.
    Bare { insert: String, notify: String },
}

impl Producer {
    fn new(outbox: Outbox, bare_notify: bool) -> Self {
        if !bare_notify {
            return Self::Library(outbox);
        }
        // The names as a service writes them in its own SQL, unquoted (the
        // library accepts only names that need no quoting), and the column
        // list of the library's insert, so that both modes write the same
        // row.
        Self::Bare {
            insert: format!(
                "INSERT INTO {} (id, event_name, resource_type, resource_id, event_type, app, payload) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb)",
                outbox.tables().outbox()
            ),
            notify: format!("NOTIFY {}", outbox.channel()),
        }
    }

    /// What the tables and headings call this mode.
    fn describe(&self) -> &'static str {
        match self {
            Self::Library(_) => "producer library, NOTIFY with the event id",
            Self::Bare { .. } => "plain SQL, bare NOTIFY without payload",
        }
    }

    /// Writes `event` and its notification on `connection`, an open
    /// transaction; returns the event's id.
    async fn send(
        &self,
        connection: &mut PgConnection,
        event: &BenchEvent,
    ) -> Result<Uuid, Failure> {
        match self {
            Self::Library(outbox) => Ok(outbox.message(event).notify().send(connection).await?),
            Self::Bare { insert, notify } => {
                // A UUIDv7 made by the client, as the library makes it: the
                // primary key's index then grows at the same end in both
                // modes.
                let id = Uuid::now_v7();
                sqlx::query(sqlx::AssertSqlSafe(insert.as_str()))
                    .bind(id)
                    .bind(event.name())
                    .bind(event.resource_type())
                    .bind(event.resource_id())
                    .bind(event.event_type())
                    .bind(None::<&str>)
                    .bind(event.payload()?.to_string())
                    .execute(&mut *connection)
                    .await?;
                sqlx::query(sqlx::AssertSqlSafe(notify.as_str()))
                    .execute(&mut *connection)
                    .await?;
                Ok(id)
            }
        }
    }
}

pub(crate) async fn run(args: OutboxArgs) -> Result<(), Failure> {
    websub_hub::delivery::net::install_crypto_provider();
    let websubd = locate_websubd(args.websubd.as_ref())?;
    let database = ThrowawayDatabase::create(&args.postgres).await?;
    let url = database.url.clone();
    // The producers run on a thread of their own with a current-thread
    // runtime. On the multi-thread runtime every reply was read by one
    // thread and awaited on another: three thread wake-ups per statement,
    // on the cores that the database and the hub share.
    let result = tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(measure(&args, &websubd, &url))
    })
    .await
    .map_err(|error| format!("measurement thread: {error}"))?;
    database.drop_it().await?;
    let table = result?;
    for note in &table.notes {
        println!("{note}\n");
    }
    report::print(table);
    Ok(())
}

async fn measure(args: &OutboxArgs, websubd: &PathBuf, url: &str) -> Result<Table, Failure> {
    let pool = PgPoolOptions::new()
        .max_connections(u32::try_from(args.producers + 2).unwrap_or(u32::MAX))
        .connect(url)
        .await?;
    let tables = OutboxTables::in_schema("bench")?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl(&tables)))
        .execute(&pool)
        .await?;
    if args.scan_index {
        sqlx::raw_sql(sqlx::AssertSqlSafe(scan_index_ddl(&tables)))
            .execute(&pool)
            .await?;
    }
    let producer = Producer::new(Outbox::new(tables), args.bare_notify);
    eprintln!("producers: {}", producer.describe());

    eprintln!("producers alone: {} events", args.events);
    let solo_before = span(&produce(&pool, &producer, args.events, args.producers).await?);

    eprintln!("claim ceiling: {} rows", args.events);
    let (claimed, claim_elapsed) = claim_ceiling(&pool).await?;
    let claim_rate = claimed as f64 / claim_elapsed.as_secs_f64();

    // The end-to-end run meets tables as a running service has them: with
    // history, and statistics that autovacuum keeps current (a table that
    // has never been analyzed leads the planner to whole-table joins). The
    // feed starts from now, so the history is not delivered.
    sqlx::query("ANALYZE bench.outbox, bench.outbox_deliveries")
        .execute(&pool)
        .await?;
    eprintln!("end to end: {} events through websubd", args.events);
    let end_to_end = end_to_end(args, websubd, url, &pool, &producer).await?;
    let mut solo = vec![("before", solo_before)];
    for _ in 0..2 {
        eprintln!("producers alone again: {} events", args.events);
        let after = span(&produce(&pool, &producer, args.events, args.producers).await?);
        solo.push(("after", after));
    }
    let rate = |elapsed: Duration| args.events as f64 / elapsed.as_secs_f64();
    let mut solo_rates: Vec<f64> = solo.iter().map(|(_, elapsed)| rate(*elapsed)).collect();
    solo_rates.sort_by(f64::total_cmp);
    let solo_rate = solo_rates[solo_rates.len() / 2];

    let index = if args.scan_index {
        "with the index on `created_at`"
    } else {
        "without the index on `created_at`"
    };
    let note = format!("Producers: {}; outbox {index}.", producer.describe());
    let mut table = Table::new(
        "outbox",
        &[
            "measurement",
            "events",
            "time",
            "rate /s",
            "% of producers",
            "p50",
            "p99",
            "backlog at last commit",
            "drained after last commit",
        ],
    );
    table.notes.push(note);
    let dash = || Cell::text("–");
    let seconds = |elapsed: Duration| {
        Cell::number(
            format!("{:.2} s", elapsed.as_secs_f64()),
            elapsed.as_secs_f64(),
        )
    };
    let per_second = |rate: f64| Cell::number(format!("{rate:.0}"), rate);
    let events = Cell::number(args.events.to_string(), args.events as f64);
    for (when, elapsed) in solo {
        table.rows.push(vec![
            Cell::text(format!(
                "producers alone ({when} end to end): commits/s, {} connections",
                args.producers
            )),
            events.clone(),
            seconds(elapsed),
            per_second(rate(elapsed)),
            dash(),
            dash(),
            dash(),
            dash(),
            dash(),
        ]);
    }
    table.rows.push(vec![
        Cell::text("claim ceiling: rows/s, 100 per claim + mark processed"),
        Cell::number(claimed.to_string(), claimed as f64),
        seconds(claim_elapsed),
        per_second(claim_rate),
        dash(),
        dash(),
        dash(),
        dash(),
        dash(),
    ]);
    let mut latencies = end_to_end.latencies;
    let path = match producer {
        Producer::Library(_) => "NOTIFY path",
        Producer::Bare { .. } => "bare NOTIFY path",
    };
    let latency = |duration: Duration| Cell::number(micros(duration), duration.as_secs_f64() * 1e6);
    let share = 100.0 * end_to_end.rate / solo_rate;
    table.rows.push(vec![
        Cell::text(format!(
            "end to end: delivered events/s ({path}), % of the producers' median"
        )),
        events,
        seconds(end_to_end.elapsed),
        per_second(end_to_end.rate),
        Cell::number(format!("{share:.0} %"), share),
        latency(percentile(&mut latencies, 50.0)),
        latency(percentile(&mut latencies, 99.0)),
        Cell::number(end_to_end.backlog.to_string(), end_to_end.backlog as f64),
        latency(end_to_end.drained),
    ]);
    Ok(table)
}

/// From the first commit to the last.
fn span(commits: &Commits) -> Duration {
    let first = commits.iter().map(|(_, at)| *at).min();
    let last = commits.iter().map(|(_, at)| *at).max();
    match (first, last) {
        (Some(first), Some(last)) => last - first,
        _ => Duration::ZERO,
    }
}

/// Commits `events` events, one per transaction with a NOTIFY, from
/// `producers` connections; returns each event's commit time.
async fn produce(
    pool: &PgPool,
    producer: &Producer,
    events: usize,
    producers: usize,
) -> Result<Commits, Failure> {
    let filler: Arc<str> = "x".repeat(1000).into();
    let lanes = (0..producers).map(|lane| {
        let filler = filler.clone();
        async move {
            let mut commits = Vec::new();
            for sequence in (lane..events).step_by(producers) {
                let event = BenchEvent {
                    sequence,
                    filler: filler.clone(),
                };
                let mut tx = pool.begin().await?;
                let id = producer.send(&mut tx, &event).await?;
                tx.commit().await?;
                commits.push((id, Instant::now()));
            }
            Ok::<_, Failure>(commits)
        }
    });
    let mut all = Vec::with_capacity(events);
    for lane in futures::future::join_all(lanes).await {
        all.extend(lane?);
    }
    Ok(all)
}

/// Gives every event a due delivery row, then claims them 100 at a time and
/// marks each batch processed until none is left.
async fn claim_ceiling(pool: &PgPool) -> Result<(usize, Duration), Failure> {
    sqlx::query(
        "INSERT INTO bench.outbox_deliveries (event_id, subscriber, next_attempt_at) \
         SELECT id, 'ceiling', timezone('utc', now()) FROM bench.outbox",
    )
    .execute(pool)
    .await?;
    sqlx::query("ANALYZE bench.outbox_deliveries")
        .execute(pool)
        .await?;
    let started = Instant::now();
    let mut claimed = 0;
    loop {
        let ids: Vec<Uuid> = sqlx::query_scalar(
            "UPDATE bench.outbox_deliveries SET processing_since = timezone('utc', now()) \
             WHERE (event_id, subscriber) IN ( \
                 SELECT event_id, subscriber FROM bench.outbox_deliveries \
                 WHERE processed_at IS NULL AND next_attempt_at <= timezone('utc', now()) \
                   AND processing_since IS NULL \
                 ORDER BY next_attempt_at LIMIT 100 FOR UPDATE SKIP LOCKED) \
             RETURNING event_id",
        )
        .fetch_all(pool)
        .await?;
        if ids.is_empty() {
            return Ok((claimed, started.elapsed()));
        }
        claimed += ids.len();
        sqlx::query(
            "UPDATE bench.outbox_deliveries SET processed_at = timezone('utc', now()), \
                 processing_since = NULL \
             WHERE subscriber = 'ceiling' AND event_id = ANY($1)",
        )
        .bind(&ids)
        .execute(pool)
        .await?;
    }
}

struct EndToEnd {
    elapsed: Duration,
    rate: f64,
    latencies: Vec<Duration>,
    backlog: usize,
    drained: Duration,
}

type Receipts = Arc<Mutex<HashMap<Uuid, Instant>>>;

async fn end_to_end(
    args: &OutboxArgs,
    websubd: &PathBuf,
    url: &str,
    pool: &PgPool,
    producer: &Producer,
) -> Result<EndToEnd, Failure> {
    let receipts: Receipts = Arc::default();
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(receive))
        .with_state(receipts.clone());
    // The receiver is another service: it runs on a thread and runtime of
    // its own, so that its work does not queue behind the producers' tasks
    // (nor theirs behind it), as it would sharing their runtime.
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let hook = format!("http://{}/hook", listener.local_addr()?);
    let receiver = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::spawn(move || {
        receiver.block_on(async move {
            if let Ok(listener) = tokio::net::TcpListener::from_std(listener) {
                let _ = axum::serve(listener, app).await;
            }
        });
    });

    let scratch = std::env::temp_dir().join(format!("websub-bench-outbox-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let webhooks = scratch.join("webhooks.toml");
    std::fs::write(
        &webhooks,
        format!(
            "[[webhook]]\nevent = \"bench.order.created\"\nsubscriber = \"bench-sink\"\nurl = \"{hook}\"\n"
        ),
    )?;
    let config = scratch.join("websubd.toml");
    std::fs::write(
        &config,
        format!(
            "[[feed]]\ndatabase_url = \"{url}\"\noutbox_table = \"bench.outbox\"\n\
             deliveries_table = \"bench.outbox_deliveries\"\nwebhooks_file = \"{}\"\n\
             signing_secret = \"bench\"\nevents = []\nstart_from = \"now\"\n\
             allow_private_network = true\n",
            webhooks.display()
        ),
    )?;
    let hub_db = format!("sqlite:{}", scratch.join("hub.db").display());
    let config_path = config.display().to_string();
    let hub = Hub::spawn_with(
        websubd,
        &["--database-url", &hub_db, "--config", &config_path],
    )
    .await?;
    // The feed's listener connects after the hub serves.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let commits = produce(pool, producer, args.events, args.producers).await?;
    let backlog = args.events - lock(&receipts).len();
    let last_commit = commits
        .iter()
        .map(|(_, at)| *at)
        .max()
        .unwrap_or_else(Instant::now);
    let deadline = Instant::now() + Duration::from_secs(120);
    while lock(&receipts).len() < args.events {
        if Instant::now() > deadline {
            hub.stop();
            return Err(format!(
                "only {} of {} events delivered within 120 s",
                lock(&receipts).len(),
                args.events
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    hub.stop();
    std::fs::remove_dir_all(&scratch)?;

    let receipts = lock(&receipts).clone();
    let first_commit = commits
        .iter()
        .map(|(_, at)| *at)
        .min()
        .unwrap_or(last_commit);
    let last_receipt = receipts.values().max().copied().unwrap_or(last_commit);
    let latencies = commits
        .iter()
        .filter_map(|(id, committed)| {
            receipts
                .get(id)
                .map(|received| received.saturating_duration_since(*committed))
        })
        .collect();
    let elapsed = last_receipt - first_commit;
    Ok(EndToEnd {
        elapsed,
        rate: args.events as f64 / elapsed.as_secs_f64(),
        latencies,
        backlog,
        drained: last_receipt.saturating_duration_since(last_commit),
    })
}

async fn receive(State(receipts): State<Receipts>, headers: HeaderMap) -> StatusCode {
    let at = Instant::now();
    let id = headers
        .get(MESSAGING_EVENT_ID_HEADER)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| Uuid::parse_str(value).ok());
    match id {
        Some(id) => {
            lock(&receipts).entry(id).or_insert(at);
            StatusCode::NO_CONTENT
        }
        None => StatusCode::BAD_REQUEST,
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        outbox: OutboxArgs,
    }

    #[test]
    fn bare_notify_is_off_unless_asked() {
        let plain = Cli::try_parse_from(["outbox", "--postgres", "postgres://db"]).expect("parses");
        assert!(!plain.outbox.bare_notify);
        let bare = Cli::try_parse_from(["outbox", "--postgres", "postgres://db", "--bare-notify"])
            .expect("parses");
        assert!(bare.outbox.bare_notify);
        assert!(!bare.outbox.scan_index);
        let indexed =
            Cli::try_parse_from(["outbox", "--postgres", "x", "--scan-index"]).expect("parses");
        assert!(indexed.outbox.scan_index);
        assert!(
            Cli::try_parse_from(["outbox", "--postgres", "x", "--bare-notify=yes"]).is_err(),
            "a switch, not a value"
        );
    }

    #[test]
    fn the_bare_producer_writes_the_library_row_and_names_no_event() {
        let outbox = Outbox::new(OutboxTables::in_schema("bench").expect("valid"));
        let Producer::Bare { insert, notify } = Producer::new(outbox.clone(), true) else {
            panic!("--bare-notify makes a bare producer");
        };
        assert_eq!(
            insert,
            "INSERT INTO bench.outbox (id, event_name, resource_type, resource_id, event_type, app, payload) \
             VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb)"
        );
        // The channel websubd listens on for these tables (README, "Outbox
        // feeds"), with no payload.
        assert_eq!(notify, "NOTIFY bench_outbox_events");
        assert!(matches!(Producer::new(outbox, false), Producer::Library(_)));
    }
}

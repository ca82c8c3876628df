//! Shared pieces of the outbox tests: a fresh database with the outbox
//! tables, a producer, dispatchers delivering to the recording receiver of
//! `websub-tests`, a private PostgreSQL cluster for restart tests, and
//! bounded waits for what the receiver cannot wake a test for.
//!
//! Every test binary uses a different part of this module.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::NaiveDateTime;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Row};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use url::Url;
use uuid::Uuid;
use websub_hub::delivery::RetryPolicy;
use websub_hub::delivery::net::NetPolicy;
use websub_hub::delivery::outbox::{
    Dispatcher, DispatcherConfig, Event, Outbox, OutboxTables, WebhookSubscriber, ddl,
};
use websub_tests::RecordingReceiver;

// ---------------------------------------------------------------------------
// Database
// ---------------------------------------------------------------------------

/// A database of its own with the outbox tables created.
pub(crate) struct Db {
    pub(crate) url: String,
    pub(crate) pool: PgPool,
    pub(crate) tables: OutboxTables,
}

impl Db {
    /// A fresh database on the test server with `tables` created, or `None`
    /// (skip) outside CI without a server.
    pub(crate) async fn fresh(tables: OutboxTables) -> Option<Self> {
        websub_hub::delivery::net::install_crypto_provider();
        let url = websub_storetest::servers::fresh_postgres_url().await?;
        let pool = pool(&url, 4).await;
        sqlx::raw_sql(AssertSqlSafe(ddl(&tables)))
            .execute(&pool)
            .await
            .expect("create the outbox tables");
        Some(Self { url, pool, tables })
    }

    /// A fresh database with the default table names.
    pub(crate) async fn default_tables() -> Option<Self> {
        Self::fresh(OutboxTables::default()).await
    }

    /// The outbox writing to these tables.
    pub(crate) fn outbox(&self) -> Outbox {
        Outbox::new(self.tables.clone())
    }

    /// Writes `name` in a committed transaction of its own, with a `NOTIFY`
    /// when `notify`.
    pub(crate) async fn produce(&self, name: &str, app: Option<&str>, notify: bool) -> Uuid {
        let outbox = self.outbox();
        let event = TestEvent::named(name);
        let mut tx = self.pool.begin().await.expect("begin");
        let mut message = outbox.message(&event);
        if let Some(app) = app {
            message = message.for_app(app);
        }
        if notify {
            message = message.notify();
        }
        let id = message.send(&mut tx).await.expect("send");
        tx.commit().await.expect("commit");
        id
    }

    /// Moves an event's `created_at` back by `by`.
    pub(crate) async fn age(&self, id: Uuid, by: Duration) {
        let sql = format!(
            "UPDATE {} SET created_at = created_at - make_interval(secs => $2) WHERE id = $1",
            quoted(self.tables.outbox())
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(id)
            .bind(by.as_secs_f64())
            .execute(&self.pool)
            .await
            .expect("age an event");
    }

    /// The delivery row of (`event`, `subscriber`), if any.
    pub(crate) async fn delivery(&self, event: Uuid, subscriber: &str) -> Option<DeliveryRow> {
        let sql = format!(
            "SELECT processed_at, retry_count, last_error, processing_since, next_attempt_at \
             FROM {} WHERE event_id = $1 AND subscriber = $2",
            quoted(self.tables.deliveries())
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(event)
            .bind(subscriber)
            .fetch_optional(&self.pool)
            .await
            .expect("read a delivery row")?;
        Some(DeliveryRow {
            processed_at: row.get(0),
            retry_count: row.get(1),
            last_error: row.get(2),
            processing_since: row.get(3),
            next_attempt_at: row.get(4),
        })
    }

    /// How many delivery rows there are for `event`.
    pub(crate) async fn delivery_count(&self, event: Uuid) -> i64 {
        let sql = format!(
            "SELECT count(*) FROM {} WHERE event_id = $1",
            quoted(self.tables.deliveries())
        );
        sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(event)
            .fetch_one(&self.pool)
            .await
            .expect("count delivery rows")
    }

    /// How many events there are.
    pub(crate) async fn event_count(&self) -> i64 {
        let sql = format!("SELECT count(*) FROM {}", quoted(self.tables.outbox()));
        sqlx::query_scalar(AssertSqlSafe(sql))
            .fetch_one(&self.pool)
            .await
            .expect("count events")
    }

    /// The backend pid of a connection listening (the last statement it ran
    /// was a `LISTEN`), if any.
    pub(crate) async fn listener_pid(&self) -> Option<i32> {
        self.listener_pids().await.into_iter().next()
    }

    /// The backend pids of every connection listening.
    pub(crate) async fn listener_pids(&self) -> Vec<i32> {
        sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity \
             WHERE datname = current_database() AND query ILIKE 'LISTEN%' \
               AND pid <> pg_backend_pid() \
             ORDER BY backend_start",
        )
        .fetch_all(&self.pool)
        .await
        .expect("read pg_stat_activity")
    }
}

/// `schema.table` quoted as the library quotes it.
pub(crate) fn quoted(name: &str) -> String {
    name.split('.')
        .map(|part| format!("\"{part}\""))
        .collect::<Vec<_>>()
        .join(".")
}

/// A pool of at most `size` connections to `url`.
pub(crate) async fn pool(url: &str, size: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(size)
        .connect(url)
        .await
        .expect("connect to the test database")
}

/// One delivery row, as stored.
#[derive(Debug, Clone)]
pub(crate) struct DeliveryRow {
    pub(crate) processed_at: Option<NaiveDateTime>,
    pub(crate) retry_count: i32,
    pub(crate) last_error: Option<String>,
    pub(crate) processing_since: Option<NaiveDateTime>,
    pub(crate) next_attempt_at: Option<NaiveDateTime>,
}

/// A domain event for tests.
#[derive(Debug, Clone)]
pub(crate) struct TestEvent {
    pub(crate) name: String,
    pub(crate) resource_id: String,
    pub(crate) data: serde_json::Value,
}

impl TestEvent {
    pub(crate) fn named(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            resource_id: Uuid::new_v4().to_string(),
            data: serde_json::json!({"name": name, "n": 1}),
        }
    }
}

impl Event for TestEvent {
    fn name(&self) -> &str {
        &self.name
    }
    fn resource_type(&self) -> &str {
        "user"
    }
    fn resource_id(&self) -> String {
        self.resource_id.clone()
    }
    fn event_type(&self) -> &str {
        "authenticated"
    }
    fn payload(&self) -> Result<serde_json::Value, serde_json::Error> {
        Ok(self.data.clone())
    }
}

// ---------------------------------------------------------------------------
// Dispatchers
// ---------------------------------------------------------------------------

/// A configuration for tests: short timings, `tables`.
pub(crate) fn config(tables: &OutboxTables) -> DispatcherConfig {
    DispatcherConfig {
        tables: tables.clone(),
        poll_interval: Duration::from_millis(200),
        retry: RetryPolicy {
            max_retries: 3,
            max_backoff: Duration::from_millis(400),
        },
        network: NetPolicy {
            allow_private_network: true,
        },
        delivery_timeout: Duration::from_secs(2),
        visibility_timeout: Duration::from_secs(5),
        listener_max_backoff: Duration::from_millis(500),
        ..DispatcherConfig::default()
    }
}

/// A running dispatcher task and the token that stops it.
pub(crate) struct Running {
    pub(crate) dispatcher: Dispatcher,
    pub(crate) token: CancellationToken,
    pub(crate) task: tokio::task::JoinHandle<()>,
}

impl Running {
    pub(crate) fn start(dispatcher: Dispatcher) -> Self {
        let token = CancellationToken::new();
        let task = tokio::spawn(dispatcher.clone().run(token.clone()));
        Self {
            dispatcher,
            token,
            task,
        }
    }

    /// Waits until the listener is connected, so a `NOTIFY` is heard.
    pub(crate) async fn listening(&self) {
        assert!(
            eventually(Duration::from_secs(10), || self.dispatcher.is_listening()).await,
            "the listener did not connect"
        );
    }

    /// Stops the dispatcher and waits for it to drain.
    pub(crate) async fn stop(self) {
        self.token.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("the dispatcher stops")
            .expect("the dispatcher task");
    }
}

/// The event name the outbox tests produce, unless a test needs another.
pub(crate) const EVENT: &str = "auth-api.user.authenticated";

/// [`run_with_hook`] on `db` with the test timings, polling only once a
/// minute, once its listener is up: a prompt delivery can only be the
/// listener's doing.
pub(crate) async fn run_listening_with_hook(db: &Db, receiver: &RecordingReceiver) -> Running {
    let config = DispatcherConfig {
        poll_interval: Duration::from_secs(60),
        ..config(&db.tables)
    };
    let running = run_with_hook(db.pool.clone(), config, receiver);
    running.listening().await;
    running
}

/// A dispatcher on `pool` with `config`, running, whose one webhook
/// subscriber, "hook", gets every [`EVENT`] at `receiver`'s `/hook`.
pub(crate) fn run_with_hook(
    pool: PgPool,
    config: DispatcherConfig,
    receiver: &RecordingReceiver,
) -> Running {
    let dispatcher = Dispatcher::new(pool, config).expect("dispatcher");
    dispatcher
        .register_webhooks(EVENT, webhook("hook", None, receiver.url("/hook")))
        .expect("register");
    Running::start(dispatcher)
}

/// One webhook subscriber map entry.
pub(crate) fn webhook(
    name: &str,
    app: Option<&str>,
    url: Url,
) -> HashMap<String, WebhookSubscriber> {
    HashMap::from([(
        name.to_owned(),
        WebhookSubscriber::new(app.map(str::to_owned), url),
    )])
}

// ---------------------------------------------------------------------------
// Waiting
// ---------------------------------------------------------------------------

/// Polls `condition` every 10 ms until it holds or `limit` passes: for
/// state nothing announces (a dispatcher's listener, a handler's counter).
/// What a receiver gets is waited for with
/// [`RecordingReceiver::wait_until`], which wakes on each request instead.
pub(crate) async fn eventually(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// [`eventually`] with an async condition (a query).
pub(crate) async fn eventually_async<F, Fut>(limit: Duration, mut condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if condition().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------
// A private PostgreSQL cluster
// ---------------------------------------------------------------------------

/// A PostgreSQL cluster of the test's own, in a temporary directory, that
/// the test may stop and restart. Needs root (to run the server as the
/// `postgres` user) and the server binaries.
pub(crate) struct PrivateCluster {
    paths: ClusterPaths,
}

#[derive(Clone)]
struct ClusterPaths {
    port: u16,
    dir: std::path::PathBuf,
    bin: std::path::PathBuf,
}

impl PrivateCluster {
    /// Initialises and starts a cluster, or `None` (after printing why)
    /// outside CI when this machine cannot; in CI it panics instead.
    pub(crate) async fn start() -> Option<Self> {
        tokio::task::spawn_blocking(Self::start_blocking)
            .await
            .expect("the cluster start task")
    }

    fn start_blocking() -> Option<Self> {
        let cannot = |reason: &str| -> Option<Self> {
            if websub_storetest::servers::in_ci() {
                panic!("a private PostgreSQL cluster is needed under CI=true: {reason}");
            }
            eprintln!("skipping: no private PostgreSQL cluster ({reason})");
            None
        };
        let Some(bin) = server_binaries() else {
            return cannot("no /usr/lib/postgresql/*/bin/initdb");
        };
        if run("id", &["-u"]).is_none_or(|out| out.trim() != "0") {
            return cannot("not running as root, so the server cannot run as postgres");
        }
        let dir =
            std::env::temp_dir().join(format!("websub-outbox-pg-{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("create the cluster directory");
        let dir_text = dir.display().to_string();
        if run("chown", &["postgres", &dir_text]).is_none() {
            let _ = std::fs::remove_dir_all(&dir);
            return cannot("cannot chown the cluster directory to postgres");
        }
        let initdb = bin.join("initdb").display().to_string();
        let data = dir.join("data").display().to_string();
        let initialised = run(
            "runuser",
            &[
                "-u",
                "postgres",
                "--",
                &initdb,
                "-D",
                &data,
                "-U",
                "postgres",
                "--auth=trust",
            ],
        );
        if initialised.is_none() {
            let _ = std::fs::remove_dir_all(&dir);
            return cannot("initdb failed");
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let cluster = Self {
            paths: ClusterPaths { port, dir, bin },
        };
        if !cluster.paths.pg_ctl(&["start"]) {
            return cannot("pg_ctl start failed");
        }
        Some(cluster)
    }

    pub(crate) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.paths.port)
    }

    /// Restarts the server (fast shutdown: every connection is closed).
    pub(crate) async fn restart(&self) {
        let paths = self.paths.clone();
        let restarted =
            tokio::task::spawn_blocking(move || paths.pg_ctl(&["restart", "-m", "fast"]))
                .await
                .expect("the restart task");
        assert!(restarted, "pg_ctl restart failed");
    }
}

impl ClusterPaths {
    fn pg_ctl(&self, action: &[&str]) -> bool {
        let pg_ctl = self.bin.join("pg_ctl").display().to_string();
        let data = self.dir.join("data").display().to_string();
        let log = self.dir.join("log").display().to_string();
        let options = format!(
            "-c listen_addresses=127.0.0.1 -c port={} -c unix_socket_directories={} -c fsync=off",
            self.port,
            self.dir.display()
        );
        let mut args = vec![
            "-u", "postgres", "--", &pg_ctl, "-D", &data, "-l", &log, "-w", "-o", &options,
        ];
        args.extend(action.iter().copied());
        run("runuser", &args).is_some()
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        self.paths.pg_ctl(&["stop", "-m", "immediate"]);
        let _ = std::fs::remove_dir_all(&self.paths.dir);
    }
}

fn server_binaries() -> Option<std::path::PathBuf> {
    let mut versions: Vec<_> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .map(|entry| entry.path().join("bin"))
        .filter(|bin| bin.join("initdb").exists())
        .collect();
    versions.sort();
    versions.pop()
}

/// Runs a command; its stdout when it succeeds.
fn run(program: &str, args: &[&str]) -> Option<String> {
    let output = std::process::Command::new(program)
        .args(args)
        .output()
        .ok()?;
    if !output.status.success() {
        eprintln!(
            "{program} {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        return None;
    }
    Some(String::from_utf8_lossy(&output.stdout).into_owned())
}

// ---------------------------------------------------------------------------
// A TCP proxy that can go silent
// ---------------------------------------------------------------------------

/// A TCP proxy on 127.0.0.1 in front of `target`. [`SilentProxy::freeze`]
/// stops forwarding on every connection open at that moment without closing
/// it — the peer is gone but nobody says so, as when a NAT or firewall drops
/// an idle connection — while new connections work normally.
pub(crate) struct SilentProxy {
    pub(crate) address: SocketAddr,
    /// Connections accepted so far, numbered from 1.
    accepted: Arc<std::sync::atomic::AtomicU64>,
    /// Connections numbered up to this are silent.
    frozen: tokio::sync::watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl SilentProxy {
    pub(crate) async fn start(target: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let address = listener.local_addr().expect("proxy address");
        let (frozen, watch) = tokio::sync::watch::channel(0u64);
        let accepted = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = accepted.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let id = counter.fetch_add(1, Ordering::SeqCst) + 1;
                let mut watch = watch.clone();
                tokio::spawn(async move {
                    let Ok(mut server) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => return,
                        _ = watch.wait_for(|frozen_up_to| *frozen_up_to >= id) => {}
                    }
                    // Silent: both sockets stay open, nothing moves.
                    std::future::pending::<()>().await;
                    drop((client, server));
                });
            }
        });
        Self {
            address,
            accepted,
            frozen,
            task,
        }
    }

    /// Silences every connection open now.
    pub(crate) fn freeze(&self) {
        let _ = self.frozen.send(self.accepted.load(Ordering::SeqCst));
    }

    /// A database URL like `url` that goes through the proxy.
    pub(crate) fn url_for(&self, url: &str) -> String {
        let mut parsed = Url::parse(url).expect("a database URL");
        parsed.set_host(Some("127.0.0.1")).expect("set the host");
        parsed
            .set_port(Some(self.address.port()))
            .expect("set the port");
        parsed.to_string()
    }
}

impl Drop for SilentProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

//! Running the real `websubd` binary from tests: a scratch directory, a free
//! loopback port, readiness, and the signals an operator sends.

#![allow(dead_code)]

pub(crate) mod browser;
pub(crate) mod prometheus;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::collections::HashSet;
use std::sync::Arc;

use websub_store::{Subscription, SubscriptionStore};
use websub_tests::{TestSubscriber, http_client};

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free loopback port")
}

/// A fresh directory for a websubd's files (see `websub_storetest::scratch`).
pub(crate) fn scratch_dir(name: &str) -> PathBuf {
    websub_storetest::scratch::directory(&format!("websubd-{name}"))
}

/// A running websubd, killed when dropped.
pub(crate) struct Websubd {
    child: Child,
    pub(crate) url: String,
}

impl Websubd {
    /// Starts websubd in `dir` on `port` with `extra` arguments.
    pub(crate) fn spawn(dir: &PathBuf, port: u16, extra: &[&str]) -> Self {
        Self::spawn_logging(dir, port, extra, "warn", Stdio::inherit())
    }

    /// Starts websubd with `RUST_LOG=filter`, its log lines going to
    /// `stderr` (take them with [`Self::log`] when piped).
    pub(crate) fn spawn_logging(
        dir: &PathBuf,
        port: u16,
        extra: &[&str],
        filter: &str,
        stderr: Stdio,
    ) -> Self {
        Self::spawn_with_env(dir, port, extra, filter, stderr, &[])
    }

    /// Starts websubd as [`Self::spawn_logging`] does, with the variables
    /// `env` set too.
    pub(crate) fn spawn_with_env(
        dir: &PathBuf,
        port: u16,
        extra: &[&str],
        filter: &str,
        stderr: Stdio,
        env: &[(&str, &str)],
    ) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_websubd"))
            .current_dir(dir)
            .env("RUST_LOG", filter)
            .envs(env.iter().copied())
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start websubd");
        Self {
            child,
            url: format!("http://127.0.0.1:{port}/"),
        }
    }

    /// Starts websubd in `dir` on a free port, keeping everything in
    /// `database_url`, with loopback callbacks allowed, the tests' internal
    /// key and then `extra`, and waits until it serves.
    pub(crate) async fn on_database(dir: &PathBuf, database_url: &str, extra: &[&str]) -> Self {
        let mut args = vec![
            "--database-url",
            database_url,
            "--allow-private-network",
            "--internal-api-key",
            websub_tests::INTERNAL_KEY,
        ];
        args.extend_from_slice(extra);
        Self::spawn(dir, free_port(), &args).ready().await
    }

    /// Its stderr, when it was spawned with it piped.
    pub(crate) fn log(&mut self) -> Option<std::process::ChildStderr> {
        self.child.stderr.take()
    }

    /// Waits until `/healthz` answers.
    pub(crate) async fn ready(self) -> Self {
        let client = http_client();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(response) = client.get(format!("{}healthz", self.url)).send().await
                && response.status().is_success()
            {
                return self;
            }
            assert!(Instant::now() < deadline, "websubd did not become ready");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The process id, e.g. to read its memory from `/proc`.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its resident memory in KiB, from `/proc/<pid>/status`.
    pub(crate) fn resident_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("read the process status");
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in the process status")
    }

    pub(crate) fn kill_9(mut self) {
        self.child.kill().expect("SIGKILL websubd");
        let _ = self.child.wait();
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([format!("-{name}"), self.child.id().to_string()])
            .status()
            .expect("send a signal");
        assert!(status.success(), "kill -{name}");
    }

    pub(crate) fn hangup(&self) {
        self.signal("HUP");
    }

    pub(crate) fn terminate(&mut self) -> std::process::ExitStatus {
        self.signal("TERM");
        self.child.wait().expect("wait for websubd")
    }
}

impl Drop for Websubd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Websubd {
    /// What `GET /metrics` answers now.
    pub(crate) async fn metrics_text(&self) -> String {
        http_client()
            .get(format!("{}metrics", self.url))
            .send()
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("metrics text")
    }

    /// A subscribe request of `callback` to `topic` (the form a subscriber
    /// posts); returns the status.
    pub(crate) async fn subscribe(&self, topic: &str, callback: &str) -> u16 {
        self.subscribe_with(topic, callback, &[], None).await
    }

    /// A subscribe request with the fields `extra` too (`hub.secret`, …),
    /// as the user of the user token `token` when there is one; returns the
    /// status.
    pub(crate) async fn subscribe_with(
        &self,
        topic: &str,
        callback: &str,
        extra: &[(&str, &str)],
        token: Option<&str>,
    ) -> u16 {
        let mut form = vec![
            ("hub.mode", "subscribe"),
            ("hub.topic", topic),
            ("hub.callback", callback),
        ];
        form.extend_from_slice(extra);
        let mut request = http_client()
            .post(&self.url)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(serde_urlencoded::to_string(form).expect("a form"));
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        request.send().await.expect("subscribe").status().as_u16()
    }

    /// Waits, at most `wait`, until the hub holds `callback`'s subscription
    /// to `topic` (the operator API finds it).
    pub(crate) async fn wait_until_held(&self, topic: &str, callback: &str, wait: Duration) {
        let query = serde_urlencoded::to_string([("topic", topic), ("callback", callback)])
            .expect("a query");
        let deadline = Instant::now() + wait;
        loop {
            let held = http_client()
                .get(format!("{}api/v1/operator/subscription?{query}", self.url))
                .header("X-Internal-API-Key", websub_tests::INTERNAL_KEY)
                .send()
                .await
                .expect("look it up")
                .status();
            if held == 200 {
                return;
            }
            assert!(Instant::now() < deadline, "{callback} never subscribed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A fat ping of `body` (JSON) for `topic`, with the tests' internal key;
    /// returns the status.
    pub(crate) async fn fat_ping(&self, topic: &str, body: &str) -> u16 {
        http_client()
            .post(format!(
                "{}?hub.mode=publish&hub.topic={}",
                self.url,
                url::form_urlencoded::byte_serialize(topic.as_bytes()).collect::<String>()
            ))
            .header("content-type", "application/json")
            .header("X-Internal-API-Key", websub_tests::INTERNAL_KEY)
            .body(body.to_owned())
            .send()
            .await
            .expect("fat ping")
            .status()
            .as_u16()
    }
}

/// Saves a subscription of `topic` for each of `callbacks` straight into the
/// store websubd opens on `database_url`, each with a day's lease, a thousand
/// to a write. A large fan-out needs its subscribers in seconds; subscribing
/// each through the hub would verify each one first, which is not what such
/// a test is about.
pub(crate) async fn save_subscriptions(database_url: &str, topic: &str, callbacks: Vec<String>) {
    use futures::StreamExt;
    let store: Arc<dyn SubscriptionStore> = websub_hub::server::open_store(database_url)
        .await
        .expect("open the store websubd will use");
    let now = chrono::Utc::now();
    let subscriptions: Vec<Subscription> = callbacks
        .into_iter()
        .map(|callback| {
            Subscription::new(topic, callback).with_lease(chrono::Duration::days(1), now)
        })
        .collect();
    // In groups of a thousand, a write each: a hundred thousand saved one
    // by one took most of a test's time on PostgreSQL.
    let saves = futures::stream::iter(subscriptions.chunks(1_000))
        .map(|group| {
            let store = store.clone();
            async move { store.save_all(group).await }
        })
        .buffer_unordered(4)
        .collect::<Vec<_>>()
        .await;
    for saved in saves {
        saved.expect("save a group of subscriptions");
    }
}

/// How many callbacks received at least one delivery.
pub(crate) fn distinct_callbacks(subscriber: &TestSubscriber) -> usize {
    subscriber
        .deliveries()
        .into_iter()
        .map(|delivery| delivery.path)
        .collect::<HashSet<_>>()
        .len()
}

/// Cuts one database of the test PostgreSQL off (no new connections, every
/// open one terminated) until [`DatabaseOutage::end`], while the server and
/// its other databases stay up.
pub(crate) struct DatabaseOutage {
    admin: sqlx::PgConnection,
    name: String,
}

impl DatabaseOutage {
    pub(crate) async fn begin(database_url: &str) -> Self {
        use sqlx::Connection;
        let admin_url = websub_storetest::servers::postgres_url()
            .await
            .expect("the test PostgreSQL");
        let mut admin = sqlx::PgConnection::connect(&admin_url)
            .await
            .expect("connect as the administrator");
        let name = database_url
            .rsplit('/')
            .next()
            .expect("a database name")
            .to_owned();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER DATABASE {name} WITH ALLOW_CONNECTIONS false"
        )))
        .execute(&mut admin)
        .await
        .expect("refuse connections");
        sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1")
            .bind(&name)
            .execute(&mut admin)
            .await
            .expect("cut the open connections");
        Self { admin, name }
    }

    pub(crate) async fn end(mut self) {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER DATABASE {} WITH ALLOW_CONNECTIONS true",
            self.name
        )))
        .execute(&mut self.admin)
        .await
        .expect("allow connections again");
    }
}

/// A receiver written in Python (a published library as the judge of what
/// the hub sends): `script` runs with the given arguments, then the file
/// it writes its port to and the file it writes a line to per request.
/// Killed when dropped.
pub(crate) struct PythonReceiver {
    child: Child,
    pub(crate) port: u16,
    log: PathBuf,
}

/// How every [`PythonReceiver`] serves its `Receiver` handler: on a free
/// loopback port, written to `port_file`, without a log line a request.
const SERVE: &str = r#"
Receiver.log_message = lambda self, *args: None
server = http.server.HTTPServer(("127.0.0.1", 0), Receiver)
with open(port_file, "w") as out:
    out.write(str(server.server_address[1]))
server.serve_forever()
"#;

impl PythonReceiver {
    /// Starts `script` (saved as `name.py` in `dir`) and waits for its port.
    /// The script defines `Receiver`, an `http.server` request handler,
    /// and reads `args` then `port_file` and `log_file` from `sys.argv`;
    /// serving it on a loopback port, quietly, is added here.
    pub(crate) async fn start(
        dir: &std::path::Path,
        name: &str,
        script: &str,
        args: &[&str],
    ) -> Self {
        let path = dir.join(format!("{name}.py"));
        std::fs::write(&path, format!("{script}{SERVE}")).expect("write the receiver");
        let port_file = dir.join(format!("{name}.port"));
        let log = dir.join(format!("{name}.log"));
        let child = Command::new("python3")
            .arg(&path)
            .args(args)
            .args([port_file.as_os_str(), log.as_os_str()])
            .spawn()
            .expect("start the receiver");
        let deadline = Instant::now() + Duration::from_secs(30);
        let port = loop {
            if let Some(port) = std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|port| port.trim().parse::<u16>().ok())
            {
                break port;
            }
            assert!(
                Instant::now() < deadline,
                "the receiver {name} never started"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        Self { child, port, log }
    }

    /// Every line it wrote so far.
    pub(crate) fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Its lines once there are at least `count` (within 30 s).
    pub(crate) async fn wait_for(&self, count: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let lines = self.lines();
            if lines.len() >= count {
                return lines;
            }
            assert!(
                Instant::now() < deadline,
                "{count} requests never arrived: {lines:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for PythonReceiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client that reports redirects rather than following them: how a test
/// reads a page's `303` and the cookie it sets.
pub(crate) fn no_redirects() -> reqwest::Client {
    websub_tests::client_builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a client")
}

/// The `name=value` of the cookie `response` sets.
pub(crate) fn cookie_set_by(response: &reqwest::Response) -> String {
    response.headers()[reqwest::header::SET_COOKIE]
        .to_str()
        .expect("a text cookie")
        .split("; ")
        .next()
        .expect("name=value")
        .to_owned()
}

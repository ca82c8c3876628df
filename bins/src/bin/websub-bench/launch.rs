//! What the benchmarks of a whole `websubd` share: the process itself and
//! the flags that choose and configure it, the subscriptions saved before
//! it starts, the loopback servers they stand up, and the client they talk
//! to the hub and the receivers with.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use websub_hub::delivery::net::NetPolicy;
use websub_store::{Subscription, SubscriptionStore};

use crate::Failure;

/// The operator key every benchmark's websubd is started with.
pub(crate) const INTERNAL_KEY: &str = "websub-bench-internal-key-0123456789abcdef";

/// Which websubd runs, on which database, with which settings.
#[derive(Debug, clap::Args)]
pub(crate) struct HubFlags {
    /// A PostgreSQL database URL for websubd; the embedded SQLite default
    /// in a scratch directory otherwise.
    #[arg(long)]
    database_url: Option<String>,
    /// An extra websubd flag (repeatable), e.g.
    /// `--hub-arg=--delivery-concurrency=4096`; websubd's defaults otherwise.
    #[arg(long = "hub-arg", allow_hyphen_values = true)]
    hub_args: Vec<String>,
    /// The websubd binary [default: next to this one].
    #[arg(long)]
    websubd: Option<PathBuf>,
}

impl HubFlags {
    /// The database websubd is to use: the one given, or an SQLite file
    /// named `name` under `scratch`.
    pub(crate) fn database_url(&self, scratch: &std::path::Path, name: &str) -> String {
        self.database_url
            .clone()
            .unwrap_or_else(|| format!("sqlite:{}", scratch.join(name).display()))
    }

    /// The settings, for the table: the extra flags, or "defaults".
    pub(crate) fn settings(&self) -> String {
        if self.hub_args.is_empty() {
            "defaults".to_owned()
        } else {
            self.hub_args.join(" ")
        }
    }

    /// Starts websubd on `database_url` with the bench's internal key,
    /// private addresses allowed, `settings` and then the extra flags, and
    /// waits until it serves.
    pub(crate) async fn spawn(
        &self,
        database_url: &str,
        settings: &[&str],
    ) -> Result<Hub, Failure> {
        self.spawn_binary(&self.binary()?, database_url, settings)
            .await
    }

    /// The websubd binary these flags name, or the one next to the bench.
    pub(crate) fn binary(&self) -> Result<PathBuf, Failure> {
        locate_websubd(self.websubd.as_ref())
    }

    /// Starts `websubd` as [`HubFlags::spawn`] starts its own.
    pub(crate) async fn spawn_binary(
        &self,
        websubd: &PathBuf,
        database_url: &str,
        settings: &[&str],
    ) -> Result<Hub, Failure> {
        let mut args = vec![
            "--database-url",
            database_url,
            "--internal-api-key",
            INTERNAL_KEY,
            "--allow-private-network",
        ];
        args.extend_from_slice(settings);
        args.extend(self.hub_args.iter().map(String::as_str));
        Hub::spawn_with(websubd, &args).await
    }
}

/// A client for loopback servers, with up to `in_flight` connections kept
/// per host.
pub(crate) fn loopback_client(in_flight: usize) -> Result<reqwest::Client, Failure> {
    Ok(websub_hub::delivery::client::for_deliveries(
        &NetPolicy {
            allow_private_network: true,
        },
        Duration::from_secs(30),
        in_flight,
    )?)
}

/// Sends the subscription request `form` to the hub at `hub_url` until it
/// is accepted (`202`). The hub sheds a request while the verifications
/// waiting are at their bound (`503`, or `429`): it is sent again after
/// `pause`, until `deadline`. Returns how many times it was shed.
pub(crate) async fn subscribe_until_accepted(
    client: &reqwest::Client,
    hub_url: &str,
    form: String,
    pause: Duration,
    deadline: Instant,
) -> Result<usize, String> {
    let mut shed = 0;
    loop {
        let response = client
            .post(hub_url)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form.clone())
            .send()
            .await
            .map_err(|error| error.to_string())?;
        match response.status() {
            StatusCode::ACCEPTED => return Ok(shed),
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS => {
                if Instant::now() > deadline {
                    return Err(format!("still answered {}", response.status()));
                }
                shed += 1;
                tokio::time::sleep(pause).await;
            }
            other => {
                let reason = response.text().await.unwrap_or_default();
                return Err(format!("the hub answered {other}: {reason}"));
            }
        }
    }
}

/// Serves `app` on a free port of 127.0.0.1; returns its base URL.
pub(crate) async fn serve(app: Router) -> Result<String, Failure> {
    serve_on(app, std::net::Ipv4Addr::LOCALHOST).await
}

/// Serves `app` on a free port of the loopback `address`; returns its base
/// URL.
pub(crate) async fn serve_on(app: Router, address: std::net::Ipv4Addr) -> Result<String, Failure> {
    let listener = tokio::net::TcpListener::bind((address, 0)).await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(base)
}

/// Publishes `body` to `topic` as a fat ping; true when the hub took it.
pub(crate) async fn fat_ping(
    client: &reqwest::Client,
    hub_url: &str,
    topic: &str,
    content_type: &str,
    body: impl Into<reqwest::Body>,
) -> Result<bool, reqwest::Error> {
    let response = client
        .post(format!(
            "{hub_url}?hub.mode=publish&hub.topic={}",
            urlencode(topic)
        ))
        .header("content-type", content_type)
        .header("X-Internal-API-Key", INTERNAL_KEY)
        .body(body)
        .send()
        .await?;
    Ok(response.status() == StatusCode::ACCEPTED)
}

/// Saves `count` subscriptions straight into the store behind
/// `database_url`, the topic and callback of the `index`-th given by
/// `pair`.
pub(crate) async fn save_subscriptions(
    database_url: &str,
    count: usize,
    pair: impl Fn(usize) -> (String, String) + Send + Sync + 'static,
) -> Result<(), Failure> {
    let store: Arc<dyn SubscriptionStore> = websub_hub::server::open_store(database_url).await?;
    let next = Arc::new(AtomicUsize::new(0));
    let pair = Arc::new(pair);
    let now = chrono::Utc::now();
    let workers: Vec<_> = (0..16)
        .map(|_| {
            let (store, next, pair) = (store.clone(), next.clone(), pair.clone());
            tokio::spawn(async move {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    if index >= count {
                        return Ok::<(), websub_store::StoreError>(());
                    }
                    let (topic, callback) = pair(index);
                    let subscription = Subscription::new(topic, callback)
                        .with_lease(chrono::Duration::days(1), now)
                        .with_secret(format!("secret-{index}"));
                    store.save(&subscription).await?;
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await??;
    }
    Ok(())
}

/// Whether `url` is an http(s) URL whose host is a loopback address (or
/// `localhost`): the only places a benchmark may send requests to.
pub(crate) fn is_loopback_url(url: &str) -> bool {
    let Ok(url) = url::Url::parse(url) else {
        return false;
    };
    match url.host() {
        Some(url::Host::Ipv4(address)) => address.is_loopback(),
        Some(url::Host::Ipv6(address)) => address.is_loopback(),
        // A scheme the URL standard does not know (`postgres:`) has an
        // opaque host: an address literal comes as a name.
        Some(url::Host::Domain(name)) => {
            name == "localhost"
                || name
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|address| address.is_loopback())
        }
        None => false,
    }
}

pub(crate) fn urlencode(value: &str) -> String {
    url::form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

/// The websubd binary: `given`, or the one next to this binary.
pub(crate) fn locate_websubd(given: Option<&PathBuf>) -> Result<PathBuf, Failure> {
    let websubd = match given {
        Some(path) => path.clone(),
        None => std::env::current_exe()?.with_file_name("websubd"),
    };
    if !websubd.exists() {
        return Err(format!(
            "{} not found: build it first (cargo build --release --bins)",
            websubd.display()
        )
        .into());
    }
    Ok(websubd)
}

/// A websubd process.
pub(crate) struct Hub {
    child: Child,
    pub(crate) url: String,
}

impl Hub {
    /// Starts websubd on a free port with `args` and waits until it serves.
    pub(crate) async fn spawn_with(websubd: &PathBuf, args: &[&str]) -> Result<Self, Failure> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        Self::spawn_on(websubd, port, args, Stdio::inherit()).await
    }

    /// Starts websubd on `port` of 127.0.0.1 with `args`, its log lines
    /// going to `log`, and waits until it serves.
    pub(crate) async fn spawn_on(
        websubd: &PathBuf,
        port: u16,
        args: &[&str],
        log: Stdio,
    ) -> Result<Self, Failure> {
        let child = Command::new(websubd)
            .env(
                "RUST_LOG",
                std::env::var("WEBSUB_BENCH_HUB_LOG").unwrap_or_else(|_| "warn".to_owned()),
            )
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|error| format!("cannot start {}: {error}", websubd.display()))?;
        let mut hub = Self {
            child,
            url: format!("http://127.0.0.1:{port}/"),
        };
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(response) = client.get(format!("{}healthz", hub.url)).send().await
                && response.status().is_success()
            {
                return Ok(hub);
            }
            if let Some(status) = hub.child.try_wait()? {
                return Err(format!("{} exited at start ({status})", websubd.display()).into());
            }
            if Instant::now() > deadline {
                return Err("websubd did not become ready within 60 s".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The port websubd listens on.
    pub(crate) fn port(&self) -> Option<u16> {
        url::Url::parse(&self.url).ok()?.port()
    }

    /// Peak resident memory since start (VmHWM).
    pub(crate) fn peak_rss(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }

    /// The process id of websubd.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The CPU time websubd has used so far, all its threads.
    pub(crate) fn cpu_time(&self) -> Option<Duration> {
        cpu_time(self.child.id())
    }

    /// How many file descriptors websubd holds open now.
    pub(crate) fn open_files(&self) -> Option<usize> {
        Some(
            std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
                .ok()?
                .count(),
        )
    }

    /// Asks websubd to stop (SIGTERM, so it drains) and waits until it
    /// has, or for 30 s; then kills it.
    pub(crate) fn stop(mut self) {
        if let Some(pid) = i32::try_from(self.child.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        // Drop kills it if it is still there.
    }

    /// Kills websubd at once (SIGKILL), as a crash would.
    pub(crate) fn kill(self) {
        drop(self);
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The user and system CPU time process `pid` has used so far, all its
/// threads, from `/proc/<pid>/stat`.
pub(crate) fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may hold spaces; the fields after its closing
    // parenthesis are fixed: utime and stime are the 12th and 13th.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // USER_HZ, which Linux fixes at 100 for /proc.
    Some(Duration::from_millis(ticks * 10))
}

#[cfg(test)]
mod tests {
    use super::is_loopback_url;

    #[test]
    fn only_loopback_servers_pass_whatever_the_scheme() {
        for url in [
            "http://127.0.0.1:8080/",
            "http://localhost/",
            "http://[::1]:80/",
            "postgres://postgres@127.0.0.1:55432/postgres",
            "postgres://postgres@127.3.2.1/postgres",
            "postgres://postgres@localhost:55432/postgres",
        ] {
            assert!(is_loopback_url(url), "{url}");
        }
        for url in [
            "http://10.0.0.1/",
            "postgres://postgres@db.example:5432/postgres",
            "postgres://postgres@10.0.0.1:5432/postgres",
            "not a url",
        ] {
            assert!(!is_loopback_url(url), "{url}");
        }
    }
}

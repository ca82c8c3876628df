//! Running the real `websubd` binary from tests: a scratch directory, a free
//! loopback port, readiness, and the signals an operator sends.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::collections::HashSet;

use websub_tests::{TestSubscriber, http_client};

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free loopback port")
}

pub(crate) fn scratch_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("websubd-{name}-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// A running websubd, killed when dropped.
pub(crate) struct Websubd {
    child: Child,
    pub(crate) url: String,
}

impl Websubd {
    /// Starts websubd in `dir` on `port` with `extra` arguments.
    pub(crate) fn spawn(dir: &PathBuf, port: u16, extra: &[&str]) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_websubd"))
            .current_dir(dir)
            .env("RUST_LOG", "warn")
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .stdout(Stdio::null())
            .spawn()
            .expect("start websubd");
        Self {
            child,
            url: format!("http://127.0.0.1:{port}/"),
        }
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

/// How many callbacks received at least one delivery.
pub(crate) fn distinct_callbacks(subscriber: &TestSubscriber) -> usize {
    subscriber
        .deliveries()
        .into_iter()
        .map(|delivery| delivery.path)
        .collect::<HashSet<_>>()
        .len()
}

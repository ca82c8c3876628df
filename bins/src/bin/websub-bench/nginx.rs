//! The subscribers of `websub-bench hub`: nginx from Debian's packages
//! (`nginx-light`, `libnginx-mod-http-echo`), started by the bench with a
//! configuration it writes into a directory of its own, and stopped with
//! it. nginx answers a verification GET with its `hub.challenge` and every
//! POST with 204 at once, and writes one access-log line per request; the
//! bench learns what each callback received from that log (see
//! [`crate::tally`]), so nothing of the bench's own sits on the receiving
//! path.
//!
//! A receiver of one's own (axum, reqwest) costs more per request than
//! nginx does and would be measured along with the hub; nginx is what most
//! subscribers' servers are, and what the `wrk` ceiling is taken against.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::Failure;

/// Where Debian installs them.
const NGINX: &str = "/usr/sbin/nginx";
const ECHO_MODULE: &str = "/usr/lib/nginx/modules/ngx_http_echo_module.so";

/// How long nginx may take to listen, or to exit once told to.
const START_LIMIT: Duration = Duration::from_secs(10);
const STOP_LIMIT: Duration = Duration::from_secs(10);

/// One nginx (a master and two workers) serving the given loopback
/// addresses on one port.
#[derive(Debug)]
pub(crate) struct Nginx {
    dir: PathBuf,
    port: u16,
    addresses: Vec<Ipv4Addr>,
    master: Option<Child>,
}

impl Nginx {
    /// Starts nginx in `dir` (created if missing) on a free port of every
    /// address in `addresses`, all of which must be loopback, and waits
    /// until it accepts connections.
    pub(crate) async fn start(dir: &Path, addresses: &[Ipv4Addr]) -> Result<Self, Failure> {
        for path in [NGINX, ECHO_MODULE] {
            if !Path::new(path).exists() {
                return Err(format!(
                    "{path} not found: apt-get install -y nginx-light libnginx-mod-http-echo"
                )
                .into());
            }
        }
        if let Some(address) = addresses.iter().find(|address| !address.is_loopback()) {
            return Err(format!("nginx may only listen on loopback, not on {address}").into());
        }
        if addresses.is_empty() {
            return Err("nginx needs at least one address to listen on".into());
        }
        std::fs::create_dir_all(dir)?;
        // A port free on 127.0.0.1 is almost always free on the other
        // loopback addresses too; when it is not, nginx refuses to start
        // and another port is tried.
        let mut last_error = None;
        for _ in 0..5 {
            let port = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
                .local_addr()?
                .port();
            let mut nginx = Self {
                dir: dir.to_owned(),
                port,
                addresses: addresses.to_vec(),
                master: None,
            };
            std::fs::write(nginx.dir.join("nginx.conf"), config(dir, port, addresses))?;
            match nginx.resume().await {
                Ok(()) => return Ok(nginx),
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or_else(|| "nginx did not start".into()))
    }

    /// `http://address:port`, for one of its addresses.
    pub(crate) fn base(&self, address: Ipv4Addr) -> String {
        format!("http://{address}:{}", self.port)
    }

    /// The access log: one line per request, in [`LOG_FORMAT`].
    pub(crate) fn access_log(&self) -> PathBuf {
        self.dir.join("access.log")
    }

    /// Starts nginx again with the same configuration, so on the same
    /// port; the access log is appended to.
    pub(crate) async fn resume(&mut self) -> Result<(), Failure> {
        if self.master.is_some() {
            return Err("nginx is already running".into());
        }
        let error_log = self.dir.join("error.log");
        let master = Command::new(NGINX)
            .arg("-p")
            .arg(&self.dir)
            .arg("-c")
            .arg(self.dir.join("nginx.conf"))
            .arg("-e")
            .arg(&error_log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|error| format!("cannot start {NGINX}: {error}"))?;
        self.master = Some(master);
        let deadline = Instant::now() + START_LIMIT;
        loop {
            if let Some(master) = &mut self.master
                && let Some(status) = master.try_wait()?
            {
                self.master = None;
                let log = std::fs::read_to_string(&error_log).unwrap_or_default();
                return Err(format!("nginx exited at start ({status}): {}", log.trim()).into());
            }
            if self.accepts().await {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.stop().await?;
                return Err(format!(
                    "nginx did not accept connections on port {} within {START_LIMIT:?}",
                    self.port
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether the first and the last address take a connection.
    async fn accepts(&self) -> bool {
        let (Some(first), Some(last)) = (self.addresses.first(), self.addresses.last()) else {
            return false;
        };
        for address in [first, last] {
            if tokio::net::TcpStream::connect((*address, self.port))
                .await
                .is_err()
            {
                return false;
            }
        }
        true
    }

    /// Stops nginx (a fast shutdown: open connections are closed) and
    /// waits until its master has exited, which it does after its workers.
    pub(crate) async fn stop(&mut self) -> Result<(), Failure> {
        let Some(mut master) = self.master.take() else {
            return Ok(());
        };
        signal(&master, rustix::process::Signal::TERM);
        let deadline = Instant::now() + STOP_LIMIT;
        while master.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = master.kill();
                let _ = master.wait();
                return Err(format!("nginx did not stop within {STOP_LIMIT:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGKILL on the master would leave its workers serving the port,
        // so the master is asked to stop them and given time to.
        if let Some(mut master) = self.master.take() {
            signal(&master, rustix::process::Signal::TERM);
            let deadline = Instant::now() + STOP_LIMIT;
            while matches!(master.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = master.kill();
            let _ = master.wait();
        }
    }
}

fn signal(child: &Child, signal: rustix::process::Signal) {
    if let Some(pid) = i32::try_from(child.id())
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, signal);
    }
}

/// The access log's line: when the request ended (seconds since the epoch,
/// to the millisecond), the method, the path and query as sent, the
/// status, and the hub's event id (`-` when the request had none).
pub(crate) const LOG_FORMAT: &str =
    "$msec $request_method $request_uri $status $http_x_websub_event_id";

/// nginx's configuration: two workers, `port` on each of `addresses`.
fn config(dir: &Path, port: u16, addresses: &[Ipv4Addr]) -> String {
    let dir = dir.display();
    let listen: String = addresses
        .iter()
        .map(|address| format!("        listen {address}:{port};\n"))
        .collect();
    // `$arg_hub_challenge` would not do: nginx matches `$arg_` names
    // literally, and the parameter is `hub.challenge`. The value is taken
    // as sent, undecoded, which is the challenge itself because the hub's
    // challenges are alphanumeric.
    //
    // Every websubd keeps up to 8 connections per host by default, and a
    // scenario has up to a thousand hosts: hence the connections per
    // worker.
    format!(
        r#"load_module {ECHO_MODULE};
daemon off;
master_process on;
worker_processes 2;
worker_rlimit_nofile 20000;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;

events {{
    worker_connections 8192;
}}

http {{
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    log_format bench '{LOG_FORMAT}';
    access_log {dir}/access.log bench;

    map $args $hub_challenge {{
        default "";
        "~(?:^|&)hub\.challenge=(?<challenge>[^&]*)" $challenge;
    }}

    server {{
{listen}
        location / {{
            if ($request_method = POST) {{
                return 204;
            }}
            echo -n $hub_challenge;
        }}
    }}
}}
"#
    )
}

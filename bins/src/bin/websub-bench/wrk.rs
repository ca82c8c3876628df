//! The ceiling `websub-bench hub` judges a fan-out by: `wrk -t2 -c64
//! -d5s` POSTing the same JSON body the hub is given into the same nginx,
//! in the same run. wrk (from Debian's package) is about the cheapest HTTP
//! client there is, so what it reaches is what this machine and this
//! receiver allow one origin, not what some client library allows.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::Failure;

const WRK: &str = "/usr/bin/wrk";

/// The wrk command line, for the table.
pub(crate) const COMMAND: &str = "wrk -t2 -c64 -d5s";

/// How long wrk may take on top of its 5 s before it is killed.
const SLACK: Duration = Duration::from_secs(25);

/// Requests/s wrk reaches POSTing `body` as JSON to `url` (a loopback URL),
/// with its Lua script written into `dir`.
pub(crate) async fn ceiling(dir: &Path, url: &str, body: &str) -> Result<f64, Failure> {
    if !Path::new(WRK).exists() {
        return Err(format!("{WRK} not found: apt-get install -y wrk").into());
    }
    if !crate::launch::is_loopback_url(url) {
        return Err(format!("the ceiling may only be measured on loopback, not at {url}").into());
    }
    let script = dir.join("post.lua");
    std::fs::write(&script, lua_script(body)?)?;
    let mut child = Command::new(WRK)
        .args(COMMAND.split_whitespace().skip(1))
        .arg("-s")
        .arg(&script)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| format!("cannot start {WRK}: {error}"))?;
    let limit = Duration::from_secs(5) + SLACK;
    let deadline = Instant::now() + limit;
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{COMMAND} did not finish within {limit:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let output = child.wait_with_output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!(
            "{COMMAND} failed ({}): {}{}",
            output.status,
            stdout.trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into());
    }
    requests_per_second(&stdout).ok_or_else(|| format!("{COMMAND} gave no rate: {stdout}").into())
}

/// The script: POST `body` as JSON. The body goes between Lua's long
/// brackets, which need no escaping as long as it does not hold `]]`.
fn lua_script(body: &str) -> Result<String, Failure> {
    if body.contains("]]") {
        return Err("the ceiling's body may not contain \"]]\"".into());
    }
    Ok(format!(
        "wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.body = [[{body}]]\n"
    ))
}

/// wrk's `Requests/sec:` line; none when any answer was not 2xx or 3xx,
/// since then the ceiling would count errors.
fn requests_per_second(output: &str) -> Option<f64> {
    if output.contains("Non-2xx or 3xx responses") {
        return None;
    }
    output
        .lines()
        .find_map(|line| line.trim().strip_prefix("Requests/sec:"))
        .and_then(|rate| rate.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_read_from_wrks_summary() {
        let output = "Running 5s test @ http://127.0.0.1:1/ceiling\n  2 threads and 64 connections\n  475001 requests in 5.00s, 49.38MB read\nRequests/sec:  94991.51\nTransfer/sec:      9.88MB\n";
        assert_eq!(requests_per_second(output), Some(94991.51));
        let refused = format!("{output}  Non-2xx or 3xx responses: 12\n");
        assert_eq!(requests_per_second(&refused), None);
    }
}

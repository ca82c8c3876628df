//! HTTPS callbacks and topics against the real `websubd` binary: a
//! subscription verified over TLS, fat and thin pings delivered over TLS
//! with their signature, the topic fetched over TLS, all trusting a test CA
//! given with `--extra-ca`; a callback the hub does not trust without it,
//! and why; TLS sessions resumed when the callback closes its connections,
//! one connection reused when it keeps them; and the start-up errors of a
//! bad `--extra-ca` file.
//!
//! The callback is the HTTPS server `websub-bench tls` measures with
//! (`https.rs`, included by path), on SQLite, so no server is needed.

use crate::common;
#[allow(dead_code)]
#[path = "../src/bin/websub-bench/https.rs"]
pub(crate) mod https;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use serde_json::Value;

use common::{Websubd, free_port, scratch_dir};
use https::{Connections, HttpsServer, TestCa};
use websub_tests::{INTERNAL_KEY, http_client};

const WAIT: Duration = Duration::from_secs(30);
const SECRET: &str = "a-secret-of-the-tls-callback";

/// What the HTTPS peer received: verifications, deliveries (headers and
/// body), and fetches of its topic.
#[derive(Debug, Default)]
struct Log {
    verifications: usize,
    deliveries: Vec<(HeaderMap, Bytes)>,
    fetches: usize,
}

type Shared = Arc<Mutex<Log>>;

fn log(shared: &Shared) -> std::sync::MutexGuard<'_, Log> {
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A subscriber and publisher on one HTTPS origin: `/callback` answers
/// verifications with their challenge and deliveries with 204, `/topic`
/// serves the topic's content.
struct Peer {
    address: std::net::SocketAddr,
    server: HttpsServer,
    shared: Shared,
}

const TOPIC_CONTENT: &str = "the topic's content, fetched over TLS";

impl Peer {
    async fn start(ca: &TestCa, connections: Connections) -> Self {
        let shared = Shared::default();
        let app = Router::new()
            .route("/callback", get(verify).post(deliver))
            .route("/topic", get(topic))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the HTTPS peer");
        let address = listener.local_addr().expect("the peer's address");
        let config = ca.server_config().expect("a server certificate");
        let server =
            HttpsServer::serve(listener, app, config, connections).expect("serve over TLS");
        Self {
            address,
            server,
            shared,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("https://{}{path}", self.address)
    }

    fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        log(&self.shared)
    }

    /// (full, resumed, failed) handshakes so far.
    fn handshakes(&self) -> (usize, usize, usize) {
        let handshakes = &self.server.handshakes;
        (handshakes.full(), handshakes.resumed(), handshakes.failed())
    }

    async fn wait_until(&self, what: &str, condition: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + WAIT;
        while !condition(self) {
            assert!(
                Instant::now() < deadline,
                "{what} within {WAIT:?}: {:?}, handshakes {:?}",
                self.log(),
                self.handshakes()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

async fn verify(State(shared): State<Shared>, RawQuery(query): RawQuery) -> String {
    log(&shared).verifications += 1;
    url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .find(|(key, _)| key == "hub.challenge")
        .map(|(_, value)| value.into_owned())
        .unwrap_or_default()
}

async fn deliver(State(shared): State<Shared>, headers: HeaderMap, body: Bytes) -> StatusCode {
    log(&shared).deliveries.push((headers, body));
    StatusCode::NO_CONTENT
}

async fn topic(State(shared): State<Shared>) -> impl axum::response::IntoResponse {
    log(&shared).fetches += 1;
    ([("content-type", "text/plain")], TOPIC_CONTENT)
}

/// The test CA's certificate written where `--extra-ca` can read it.
fn write_ca(ca: &TestCa, dir: &Path) -> PathBuf {
    let path = dir.join("extra-ca.pem");
    std::fs::write(&path, ca.pem()).expect("write the CA file");
    path
}

fn urlencode(value: &str) -> String {
    url::form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

/// A websubd on SQLite in `dir` that allows loopback peers, with `extra`
/// arguments.
async fn websubd(dir: &Path, extra: &[&str]) -> Websubd {
    let mut args = vec![
        "--allow-private-network",
        "--internal-api-key",
        INTERNAL_KEY,
        "--verification-attempts",
        "1",
    ];
    args.extend_from_slice(extra);
    Websubd::spawn(&dir.to_path_buf(), free_port(), &args)
        .ready()
        .await
}

/// Subscribes the peer's callback to its topic, with a secret; the answer's
/// status.
async fn subscribe(hub: &Websubd, peer: &Peer) -> u16 {
    http_client()
        .post(&hub.url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!(
            "hub.mode=subscribe&hub.topic={}&hub.callback={}&hub.secret={SECRET}",
            urlencode(&peer.url("/topic")),
            urlencode(&peer.url("/callback"))
        ))
        .send()
        .await
        .expect("subscribe")
        .status()
        .as_u16()
}

/// The hub's verifications of intent still waiting or given up.
async fn verifications(hub: &Websubd) -> Vec<Value> {
    let listed: Value = http_client()
        .get(format!("{}api/v1/operator/verifications", hub.url))
        .header("X-Internal-API-Key", INTERNAL_KEY)
        .send()
        .await
        .expect("list the verifications")
        .json()
        .await
        .expect("a JSON listing");
    listed.as_array().cloned().unwrap_or_default()
}

/// Subscribes and waits until the hub has saved the subscription: the
/// verification is no longer listed (a failed one would stay).
async fn subscribe_and_wait(hub: &Websubd, peer: &Peer) {
    assert_eq!(subscribe(hub, peer).await, 202);
    let deadline = Instant::now() + WAIT;
    loop {
        let waiting = verifications(hub).await;
        if waiting.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the verification did not succeed: {waiting:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_callbacks_and_topics_work_with_the_extra_ca_and_sessions_resume() {
    let dir = scratch_dir("tls-resume");
    let ca = TestCa::new("websubd TLS test CA").expect("a CA");
    // Every connection closed after one answer: the hub must reconnect,
    // and with a session ticket it resumes.
    let peer = Peer::start(&ca, Connections::CloseEach).await;
    let extra_ca = write_ca(&ca, &dir);
    let hub = websubd(&dir, &["--extra-ca", extra_ca.to_str().expect("UTF-8")]).await;

    subscribe_and_wait(&hub, &peer).await;
    assert_eq!(peer.log().verifications, 1);
    assert_eq!(
        peer.handshakes(),
        (1, 0, 0),
        "the verification's handshake is the first, and full"
    );

    let bodies = ["{\"n\":1}", "{\"n\":2}", "{\"n\":3}"];
    for (index, body) in bodies.iter().enumerate() {
        assert_eq!(hub.fat_ping(&peer.url("/topic"), body).await, 202);
        peer.wait_until("a fat ping delivered", |peer| {
            peer.log().deliveries.len() == index + 1
        })
        .await;
    }
    for ((headers, body), sent) in peer.log().deliveries.iter().zip(bodies) {
        assert_eq!(&body[..], sent.as_bytes());
        let signature = headers
            .get("x-hub-signature")
            .and_then(|value| value.to_str().ok());
        assert!(
            websub_hub::signature::verify(SECRET.as_bytes(), body, signature),
            "{signature:?}"
        );
    }
    assert_eq!(
        peer.handshakes(),
        (1, 3, 0),
        "each delivery reconnects and resumes the verification's session"
    );

    // A thin ping: the hub fetches the topic over TLS (with its fetch
    // client, so a handshake of its own) and delivers what it got.
    let status = http_client()
        .post(&hub.url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!(
            "hub.mode=publish&hub.url={}",
            urlencode(&peer.url("/topic"))
        ))
        .send()
        .await
        .expect("thin ping")
        .status();
    assert_eq!(status.as_u16(), 202);
    peer.wait_until("the fetched content delivered", |peer| {
        peer.log().deliveries.len() == 4
    })
    .await;
    assert_eq!(peer.log().fetches, 1);
    let (headers, body) = peer.log().deliveries[3].clone();
    assert_eq!(&body[..], TOPIC_CONTENT.as_bytes());
    assert!(websub_hub::signature::verify(
        SECRET.as_bytes(),
        &body,
        headers
            .get("x-hub-signature")
            .and_then(|value| value.to_str().ok())
    ));
    let (full, resumed, failed) = peer.handshakes();
    assert_eq!(
        (full, resumed, failed),
        (2, 4, 0),
        "the fetch client's first handshake is full, the delivery after it resumed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_per_host_carries_the_verification_and_every_delivery() {
    let dir = scratch_dir("tls-reuse");
    let ca = TestCa::new("websubd TLS test CA").expect("a CA");
    let peer = Peer::start(&ca, Connections::KeepAlive).await;
    let extra_ca = write_ca(&ca, &dir);
    let hub = websubd(&dir, &["--extra-ca", extra_ca.to_str().expect("UTF-8")]).await;

    subscribe_and_wait(&hub, &peer).await;
    for index in 0..5 {
        let body = format!("{{\"n\":{index}}}");
        assert_eq!(hub.fat_ping(&peer.url("/topic"), &body).await, 202);
        peer.wait_until("a fat ping delivered", |peer| {
            peer.log().deliveries.len() == index + 1
        })
        .await;
    }
    assert_eq!(
        peer.handshakes(),
        (1, 0, 0),
        "one handshake: the verification's connection stays in the pool for the deliveries"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_extra_ca_the_callback_is_not_trusted() {
    let dir = scratch_dir("tls-untrusted");
    let ca = TestCa::new("a CA the hub was not told of").expect("a CA");
    let peer = Peer::start(&ca, Connections::KeepAlive).await;
    let hub = websubd(&dir, &[]).await;

    assert_eq!(subscribe(&hub, &peer).await, 202);
    let deadline = Instant::now() + WAIT;
    let failed = loop {
        let listed = verifications(&hub).await;
        if let Some(failed) = listed.iter().find(|entry| entry["state"] == "failed") {
            break failed.clone();
        }
        assert!(
            Instant::now() < deadline,
            "the verification did not fail: {listed:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let error = failed["last_error"].as_str().unwrap_or_default();
    eprintln!("recorded: {error}");
    assert!(
        error.contains("certificate is not trusted"),
        "the recorded error says why: {error}"
    );
    assert_eq!(peer.log().verifications, 0, "no request got through");
    // The peer counts the refused handshake when it reads the hub's alert,
    // which may be after the hub recorded the failure.
    peer.wait_until("the refused handshake counted", |peer| {
        peer.handshakes().2 >= 1
    })
    .await;
    let (full, resumed, refused) = peer.handshakes();
    assert_eq!((full, resumed), (0, 0));
    assert!(refused >= 1, "the hub refused the handshake");
}

/// Runs websubd with `args` and `env` until it exits; its exit code and
/// stderr.
fn run_to_exit(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_websubd"))
        .current_dir(dir)
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run websubd");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_bad_extra_ca_file_stops_websubd_naming_the_file_and_the_fault() {
    let dir = scratch_dir("tls-bad-ca");
    let missing = dir.join("missing.pem");
    let empty = dir.join("empty.pem");
    std::fs::write(&empty, "no certificate here\n").expect("write");
    let key_only = dir.join("key-only.pem");
    std::fs::write(
        &key_only,
        "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
    )
    .expect("write");
    let garbage = dir.join("garbage.pem");
    std::fs::write(
        &garbage,
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    )
    .expect("write");
    let text = |path: &Path| path.to_str().expect("UTF-8").to_owned();
    for (path, fault) in [
        (text(&missing), "cannot be read: No such file or directory"),
        // A directory opens but does not read.
        (text(&dir), "cannot be read: Is a directory"),
        (text(&empty), "holds no certificate"),
        (text(&key_only), "holds no certificate"),
        (text(&garbage), "certificate 1 cannot be a trusted root"),
    ] {
        let (code, stderr) = run_to_exit(&dir, &["--extra-ca", &path], &[]);
        assert_eq!(code, Some(2), "{path}: {stderr}");
        assert!(
            stderr.contains("extra-ca") && stderr.contains(&path) && stderr.contains(fault),
            "{path}: {stderr}"
        );
    }
    let (code, stderr) = run_to_exit(&dir, &[], &[("WEBSUB_EXTRA_CA", &text(&missing))]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains(&text(&missing)) && stderr.contains("cannot be read"),
        "{stderr}"
    );
}

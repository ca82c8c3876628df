//! End to end: clients that are slow, idle or too many cannot hold the hub.
//! A real hub on loopback, real sockets: heads trickled a byte a second,
//! connections that never speak, a kept-alive connection left idle, and
//! signed user tokens too large to be read.
//!
//! The waits here are bounds against hanging, many times what the hub
//! needs; nothing asserts how fast it was.

use std::net::SocketAddr;
use std::time::Duration;

use chrono::TimeDelta;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use websub_hub::HubConfig;
use websub_hub::intake::quota::Quota;
use websub_hub::intake::quota::fake::FakeQuotaServer;
use websub_hub::web::auth::issue_token;
use websub_tests::{Backend, INTERNAL_KEY, TestHub, TestSubscriber, http_client, test_config};

/// The longest any step below may take before the test fails.
const GUARD: Duration = Duration::from_secs(30);
const TOKEN_KEY: &str = "the-user-token-signing-key";

async fn hub_with(configure: impl FnOnce(&mut HubConfig)) -> TestHub {
    let mut config = test_config(Backend::Sqlite)
        .await
        .expect("SQLite needs no server");
    configure(&mut config);
    TestHub::start(config).await
}

fn address_of(hub: &TestHub) -> SocketAddr {
    hub.url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .unwrap_or_else(|error| panic!("{}: {error}", hub.url))
}

/// Reads and discards until the hub closes the connection; `false` if it
/// is still open after `limit`.
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> bool {
    let mut buffer = [0_u8; 4096];
    tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

/// Reads one answer to a `GET /healthz` (its body is `ok`) off `stream`.
async fn read_healthz_answer(stream: &mut TcpStream) -> String {
    let mut answer = Vec::new();
    let mut buffer = [0_u8; 1024];
    tokio::time::timeout(GUARD, async {
        while !answer.ends_with(b"\r\n\r\nok") {
            let read = stream.read(&mut buffer).await.expect("the answer");
            assert!(read > 0, "closed before answering: {answer:?}");
            answer.extend_from_slice(&buffer[..read]);
        }
    })
    .await
    .expect("answered");
    String::from_utf8(answer).expect("a text answer")
}

/// The open-files limit of this process, from `/proc` (no unsafe code for
/// `getrlimit`).
fn open_files_limit() -> usize {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|limits| {
            let line = limits
                .lines()
                .find(|line| line.starts_with("Max open files"))?
                .to_owned();
            line.split_whitespace().nth(3)?.parse().ok()
        })
        .unwrap_or(1024)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn trickled_heads_are_cut_at_the_header_timeout_and_a_subscribe_gets_through() {
    const TRICKLERS: usize = 100;
    let hub = hub_with(|config| {
        config.header_read_timeout = Duration::from_secs(2);
        // Every place is taken by a trickler when the subscribe comes.
        config.max_connections = TRICKLERS;
    })
    .await;
    let address = address_of(&hub);
    let mut tricklers = tokio::task::JoinSet::new();
    for _ in 0..TRICKLERS {
        let stream = TcpStream::connect(address).await.expect("connect");
        let (mut reader, mut writer) = stream.into_split();
        writer
            .write_all(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Trickle: ")
            .await
            .expect("the first bytes");
        tricklers.spawn(async move {
            // A head that never ends, a byte a second, until the hub hangs
            // up; `true` if it did within the guard.
            let trickle = async {
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    if writer.write_all(b"a").await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
            };
            let hung_up = async {
                let mut buffer = [0_u8; 1024];
                while let Ok(read) = reader.read(&mut buffer).await {
                    if read == 0 {
                        break;
                    }
                }
            };
            tokio::time::timeout(GUARD, async {
                tokio::select! {
                    () = trickle => {}
                    () = hung_up => {}
                }
            })
            .await
            .is_ok()
        });
    }

    let subscriber = TestSubscriber::start().await;
    let callback = subscriber.callback("beside-the-tricklers");
    tokio::time::timeout(
        GUARD,
        hub.subscribe("http://127.0.0.1:9/topics/slow", &callback, &[]),
    )
    .await
    .expect("the subscribe was answered and verified");

    let mut cut = 0;
    while let Some(hung_up) = tricklers.join_next().await {
        if hung_up.expect("a trickler") {
            cut += 1;
        }
    }
    assert_eq!(cut, TRICKLERS, "every trickled head was cut by the hub");
    hub.stop().await;
}

/// Opens `count` connections that each send a whole head, a tenth of the
/// body it announces, then nothing.
async fn stall_bodies(address: SocketAddr, count: usize) -> Vec<TcpStream> {
    let mut stallers = Vec::with_capacity(count);
    for _ in 0..count {
        let mut stream = TcpStream::connect(address).await.expect("connect");
        stream
            .write_all(
                b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n\
                  Content-Type: application/x-www-form-urlencoded\r\n\
                  Content-Length: 100\r\n\r\nhub.mode=",
            )
            .await
            .expect("a head and some body");
        stallers.push(stream);
    }
    stallers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stalled_bodies_do_not_keep_out_a_request() {
    const STALLERS: usize = 20;
    let hub = hub_with(|config| {
        config.max_connections = STALLERS;
        // Far longer than the test: only the bound can make room.
        config.header_read_timeout = Duration::from_secs(300);
    })
    .await;
    let stallers = stall_bodies(address_of(&hub), STALLERS).await;
    let response = tokio::time::timeout(
        GUARD,
        http_client().get(format!("{}healthz", hub.url)).send(),
    )
    .await
    .expect("answered in time")
    .expect("answered");
    assert_eq!(response.status().as_u16(), 200);
    // A body still arriving at shutdown is waited for; these never will be.
    drop(stallers);
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_body_is_cut_at_the_header_timeout() {
    let hub = hub_with(|config| {
        config.header_read_timeout = Duration::from_secs(1);
    })
    .await;
    for (index, mut stream) in stall_bodies(address_of(&hub), 5)
        .await
        .into_iter()
        .enumerate()
    {
        assert!(
            closed_within(&mut stream, GUARD).await,
            "stalled body {index} was never cut"
        );
    }
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_every_connection_busy_a_new_one_is_refused_but_healthz_answers() {
    // A subscriptions service that takes connections and never answers:
    // a subscribe waits on it with the hub working, not on its client.
    let silent_service = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let service_url = format!(
        "http://{}/",
        silent_service.local_addr().expect("an address")
    );
    let hub = hub_with(|config| {
        config.max_connections = 2;
        config.internal_api_key = Some(INTERNAL_KEY.to_owned());
        config.user_token_key = Some(TOKEN_KEY.to_owned());
        config.quota_url = Some(service_url.parse().expect("a URL"));
        config.quota_timeout = Duration::from_secs(300);
    })
    .await;
    let mut busy = tokio::task::JoinSet::new();
    for user in ["first", "second"] {
        let url = hub.url.clone();
        busy.spawn(async move {
            let form = serde_urlencoded::to_string([
                ("hub.mode", "subscribe"),
                ("hub.topic", "http://127.0.0.1:9/topics/busy"),
                ("hub.callback", "http://127.0.0.1:9/callback"),
            ])
            .expect("a form");
            http_client()
                .post(url)
                .header("content-type", "application/x-www-form-urlencoded")
                .bearer_auth(issue_token(TOKEN_KEY, user, None, TimeDelta::hours(1)))
                .body(form)
                .send()
                .await
                .map(|response| response.status().as_u16())
        });
    }
    // Both are in flight once the hub has called the service for each.
    let mut calls = Vec::new();
    for _ in 0..2 {
        let (call, _) = tokio::time::timeout(GUARD, silent_service.accept())
            .await
            .expect("the hub called the service")
            .expect("accepted");
        calls.push(call);
    }

    let refused = http_client()
        .get(format!("{}api/v1/subscriptions", hub.url))
        .send()
        .await
        .expect("answered");
    assert_eq!(refused.status().as_u16(), 503);
    let header = |name: &str| {
        refused
            .headers()
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::to_ascii_lowercase)
    };
    assert_eq!(header("retry-after").as_deref(), Some("1"));
    assert_eq!(header("connection").as_deref(), Some("close"));
    assert!(
        refused
            .text()
            .await
            .expect("a body")
            .contains("connection limit")
    );

    let health = http_client()
        .get(format!("{}healthz", hub.url))
        .send()
        .await
        .expect("answered");
    assert_eq!(
        health.status().as_u16(),
        200,
        "the process is alive, if busy"
    );

    // The service hangs up; the subscribes are answered and the hub stops.
    drop(calls);
    drop(silent_service);
    while let Some(answered) = busy.join_next().await {
        let status = answered.expect("a subscribe").expect("answered");
        assert_eq!(status, 503, "the quota could not be read");
    }
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn silent_connections_beyond_the_bound_do_not_keep_out_healthz() {
    const MAX: usize = 100;
    // 2 000 where the process may open that many files (the hub's side of
    // its connections lives here too), else as many as it safely can.
    let silent = 2000.min(open_files_limit().saturating_sub(MAX + 400));
    assert!(
        silent > 2 * MAX,
        "the open-files limit ({}) is too low for this test",
        open_files_limit()
    );
    let hub = hub_with(|config| {
        config.max_connections = MAX;
        // Far longer than the test: only the bound can make room.
        config.header_read_timeout = Duration::from_secs(300);
    })
    .await;
    let address = address_of(&hub);
    let mut streams = Vec::with_capacity(silent);
    for _ in 0..silent {
        streams.push(TcpStream::connect(address).await.expect("connect"));
    }

    let response = tokio::time::timeout(
        GUARD,
        http_client().get(format!("{}healthz", hub.url)).send(),
    )
    .await
    .expect("answered in time")
    .expect("answered");
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(response.text().await.expect("a body"), "ok");

    // The hub never kept more than its bound: all but at most MAX of the
    // silent connections were closed by it.
    let mut waits: FuturesUnordered<_> = streams
        .iter_mut()
        .map(|stream| closed_within(stream, GUARD))
        .collect();
    let mut closed = 0;
    while closed < silent - MAX {
        match waits.next().await {
            Some(true) => closed += 1,
            Some(false) | None => break,
        }
    }
    assert!(
        closed >= silent - MAX,
        "only {closed} of {silent} silent connections were closed"
    );
    drop(waits);
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_kept_alive_connection_is_closed_after_the_idle_timeout() {
    let hub = hub_with(|config| {
        config.idle_timeout = Duration::from_secs(1);
        // Far longer than the test: only the idle clock can close it.
        config.header_read_timeout = Duration::from_secs(300);
    })
    .await;
    let mut stream = TcpStream::connect(address_of(&hub)).await.expect("connect");
    for _ in 0..2 {
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            .await
            .expect("a request");
        let answer = read_healthz_answer(&mut stream).await;
        assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
        assert!(
            !answer.to_ascii_lowercase().contains("connection: close"),
            "kept alive: {answer}"
        );
    }
    assert!(
        closed_within(&mut stream, GUARD).await,
        "the idle connection was never closed"
    );
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_oversized_signed_token_is_refused_with_a_4xx() {
    let quota = FakeQuotaServer::start(INTERNAL_KEY);
    quota.set_default_quotas(vec![Quota::total("websub_subscriptions", 10)]);
    let hub = hub_with(|config| {
        config.internal_api_key = Some(INTERNAL_KEY.to_owned());
        config.user_token_key = Some(TOKEN_KEY.to_owned());
        config.quota_url = Some(quota.url());
    })
    .await;
    let client = http_client();
    // Correctly signed; the subject makes it large.
    let token =
        |bytes: usize| issue_token(TOKEN_KEY, &"u".repeat(bytes), None, TimeDelta::hours(1));

    let normal = client
        .get(format!("{}api/v1/subscriptions", hub.url))
        .bearer_auth(token(8))
        .send()
        .await
        .expect("answered");
    assert_eq!(normal.status().as_u16(), 200, "a normal token works");

    // 20 KB is read, and refused by the token's bound; 100 KB is beyond the
    // bound of a whole request head.
    for bytes in [20 * 1024, 100 * 1024] {
        let token = token(bytes);
        let listed = client
            .get(format!("{}api/v1/subscriptions", hub.url))
            .bearer_auth(&token)
            .send()
            .await
            .expect("answered");
        let form = serde_urlencoded::to_string([
            ("hub.mode", "subscribe"),
            ("hub.topic", "http://127.0.0.1:9/topics/big-token"),
            ("hub.callback", "http://127.0.0.1:9/callback"),
        ])
        .expect("a form");
        let subscribed = client
            .post(&hub.url)
            .header("content-type", "application/x-www-form-urlencoded")
            .bearer_auth(&token)
            .body(form)
            .send()
            .await
            .expect("answered");
        for response in [listed, subscribed] {
            let status = response.status().as_u16();
            let body = response.text().await.unwrap_or_default();
            assert_eq!(status, 431, "{bytes} bytes: {body}");
            if bytes == 20 * 1024 {
                assert!(body.contains("larger than"), "a reason: {body}");
            }
        }
    }
    hub.stop().await;
}

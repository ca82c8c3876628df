//! The real `websubd` binary: start-up on the embedded default, errors that
//! name bad values, the layers of its configuration (file, environment,
//! flags) and its help, a clean exit on SIGTERM, no delivery lost when
//! the process is killed with SIGKILL in the middle of a fan-out, and
//! retention deleting what is older than it.

use crate::common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Websubd, distinct_callbacks, free_port, save_subscriptions, scratch_dir};

use websub_tests::{Answer, TestSubscriber, http_client};

const INTERNAL_KEY: &str = "an-internal-api-key-of-at-least-32-characters";

#[test]
fn bad_values_are_named_and_refused() {
    for (args, named) in [
        (vec!["--lease-min", "ten"], "lease-min"),
        (vec!["--internal-api-key", "too-short"], "internal-api-key"),
        (
            vec!["--public-url", "http://hub.example/no-slash"],
            "public-url",
        ),
        (vec!["--store", "mongodb://db"], "store"),
        (vec!["--database-url", "mysql://db"], "database-url"),
        (vec!["--quota-url", "not a url"], "quota-url"),
        (
            vec!["--quota-url", "http://127.0.0.1:9100/"],
            "needs quota-api-key (or internal-api-key)",
        ),
        (
            vec![
                "--operator-keys",
                "an-operator-key-of-at-least-32-characters,short",
            ],
            "operator-keys",
        ),
        (vec!["--metrics-keys", "short"], "metrics-keys"),
        (
            vec![
                "--quota-url",
                "http://127.0.0.1:9100/",
                "--internal-api-key",
                "an-internal-api-key-of-at-least-32-characters",
            ],
            "needs user-token-key",
        ),
        (vec!["--quota-timeout", "0s"], "quota-timeout"),
        (
            vec!["--user-token-header", "bad header"],
            "user-token-header",
        ),
        (vec!["--delivery-batch-size", "0"], "delivery-batch-size"),
        (
            vec!["--verification-timeout", "soon"],
            "verification-timeout",
        ),
        (vec!["--max-content-bytes", "many"], "max-content-bytes"),
        (vec!["--max-connections", "0"], "max-connections"),
        (vec!["--header-read-timeout", "0s"], "header-read-timeout"),
        (vec!["--idle-timeout", "soon"], "idle-timeout"),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_websubd"))
            .args(&args)
            .output()
            .expect("run websubd");
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(named), "{args:?}: {stderr}");
    }
}

#[test]
fn a_bad_variable_is_named_and_refused() {
    let output = Command::new(env!("CARGO_BIN_EXE_websubd"))
        .env("WEBSUB_DELIVERY_RETRIES", "several")
        .output()
        .expect("run websubd");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("WEBSUB_DELIVERY_RETRIES"), "{stderr}");
}

#[test]
fn the_help_lists_every_setting_with_its_default() {
    let output = Command::new(env!("CARGO_BIN_EXE_websubd"))
        .arg("--help")
        .output()
        .expect("run websubd --help");
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    for (flag, default) in [
        ("--delivery-batch-size <N>", "500"),
        ("--verification-timeout <DURATION>", "10s"),
        ("--verification-concurrency <N>", "256"),
        ("--reaper-interval <DURATION>", "1m"),
        ("--max-form-bytes <BYTES>", "65536"),
        ("--max-content-bytes <BYTES>", "16777216"),
        ("--delivery-timeout <DURATION>", "10s"),
        ("--allow-private-network [<BOOL>]", "false"),
        ("--header-read-timeout <DURATION>", "10s"),
        ("--idle-timeout <DURATION>", "75s"),
        ("--max-connections <N>", "512"),
        ("--retention <DURATION>", "14d"),
    ] {
        let entry = help
            .split_once(flag)
            .map(|(_, rest)| rest)
            .unwrap_or_else(|| panic!("{flag} is not listed: {help}"));
        let shown = entry
            .split_once("[default: ")
            .and_then(|(_, rest)| rest.split_once(']'))
            .map(|(value, _)| value);
        assert_eq!(shown, Some(default), "{flag}");
    }
}

/// A websubd started with `env` besides the arguments, killed when dropped.
struct WithEnv(Child);

impl Drop for WithEnv {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_and_the_environment_override_the_file() {
    const FILE_KEY: &str = "the-internal-key-the-file-gives-0123456789";
    const ENV_KEY: &str = "the-internal-key-the-environment-gives-0123";
    let dir = scratch_dir("layers");
    let (file_port, port) = (free_port(), free_port());
    let config = dir.join("websubd.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{file_port}\"\ninternal_api_key = \"{FILE_KEY}\"\n\
             allow_private_network = true\n"
        ),
    )
    .expect("write the file");
    let child = Command::new(env!("CARGO_BIN_EXE_websubd"))
        .current_dir(&dir)
        .env("RUST_LOG", "warn")
        .env("WEBSUB_CONFIG", &config)
        .env("WEBSUB_INTERNAL_API_KEY", ENV_KEY)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--allow-private-network=false")
        .stdout(Stdio::null())
        .spawn()
        .expect("start websubd");
    let _hub = WithEnv(child);
    let client = http_client();
    let url = format!("http://127.0.0.1:{port}/");
    let deadline = Instant::now() + Duration::from_secs(30);
    // Serving on the flag's port, not the file's: the flag won.
    loop {
        if let Ok(response) = client.get(format!("{url}healthz")).send().await
            && response.status().is_success()
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "websubd did not serve on the flag's port"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let topics = |key: &'static str| {
        client
            .get(format!("{url}api/v1/operator/topics"))
            .header("X-Internal-API-Key", key)
            .send()
    };
    let by_env = topics(ENV_KEY).await.expect("answered");
    assert_eq!(by_env.status().as_u16(), 200, "the environment's key works");
    let by_file = topics(FILE_KEY).await.expect("answered");
    assert_eq!(
        by_file.status().as_u16(),
        401,
        "the file's key was overridden"
    );
    let response = subscribe_a_loopback_callback(&client, &url).await;
    assert_eq!(
        response.status().as_u16(),
        400,
        "--allow-private-network=false beats the file's true"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn embedded_default_serves_and_sigterm_exits_cleanly() {
    let dir = scratch_dir("default");
    let mut hub = Websubd::spawn(&dir, free_port(), &[]).ready().await;
    assert!(
        dir.join("websub.db").exists(),
        "the embedded SQLite file is created"
    );
    let response = subscribe_a_loopback_callback(&http_client(), &hub.url).await;
    assert_eq!(
        response.status().as_u16(),
        400,
        "a loopback callback is refused without --allow-private-network"
    );
    let status = hub.terminate();
    assert!(status.success(), "websubd exited with {status}");
}

async fn kill_9_during_fan_out_loses_nothing(database_url: String) {
    const SUBSCRIBERS: usize = 10_000;
    let dir = scratch_dir("crash");
    let subscriber = TestSubscriber::start().await;
    // Slow enough that the kill lands mid-fan-out.
    subscriber.answer_every_delivery(Answer::status(200).after(Duration::from_millis(10)));
    let topic = "http://127.0.0.1:9/topics/crash";

    let started = Instant::now();
    save_subscriptions(
        &database_url,
        topic,
        (0..SUBSCRIBERS)
            .map(|index| subscriber.callback(&format!("c{index}")))
            .collect(),
    )
    .await;
    eprintln!(
        "saved {SUBSCRIBERS} subscriptions in {:?}",
        started.elapsed()
    );

    let args = [
        "--database-url",
        &database_url,
        "--allow-private-network",
        "--internal-api-key",
        INTERNAL_KEY,
        "--delivery-concurrency",
        "32",
        "--delivery-timeout",
        "2s",
        "--visibility-timeout",
        "3s",
        "--poll-interval",
        "200ms",
    ];
    let first = Websubd::spawn(&dir, free_port(), &args).ready().await;
    assert_eq!(
        first
            .fat_ping("http://127.0.0.1:9/topics/crash", "{\"crash\":true}")
            .await,
        202
    );

    assert!(
        subscriber
            .wait_until(Duration::from_secs(60), |s| s.deliveries().len() >= 1_000)
            .await,
        "the fan-out never got going"
    );
    eprintln!("killing after {:?}", started.elapsed());
    first.kill_9();
    let at_kill = distinct_callbacks(&subscriber);
    assert!(
        at_kill < SUBSCRIBERS,
        "the fan-out finished before the kill ({at_kill}); the test proves nothing"
    );

    let second = Websubd::spawn(&dir, free_port(), &args).ready().await;
    let all = subscriber
        .wait_until(Duration::from_secs(120), |s| {
            distinct_callbacks(s) >= SUBSCRIBERS
        })
        .await;
    let delivered = distinct_callbacks(&subscriber);
    eprintln!("all delivered after {:?}", started.elapsed());
    drop(second);
    assert!(
        all,
        "only {delivered} of {SUBSCRIBERS} subscribers were delivered to after the restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_during_fan_out_loses_nothing_on_sqlite() {
    let dir = scratch_dir("crash-sqlite");
    kill_9_during_fan_out_loses_nothing(format!("sqlite:{}", dir.join("hub.db").display())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_during_fan_out_loses_nothing_on_postgres() {
    let Some(url) = websub_storetest::servers::fresh_postgres_url().await else {
        return;
    };
    kill_9_during_fan_out_loses_nothing(url).await;
}

/// A subscribe request whose callback is on loopback: 400 unless private
/// networks are allowed.
async fn subscribe_a_loopback_callback(client: &reqwest::Client, hub: &str) -> reqwest::Response {
    client
        .post(hub)
        .header("content-type", "application/x-www-form-urlencoded")
        .body("hub.mode=subscribe&hub.topic=https%3A%2F%2Fexample.com%2Ff&hub.callback=http%3A%2F%2F127.0.0.1%3A1%2Fcb")
        .send()
        .await
        .expect("subscribe")
}

/// The deliveries the operator API lists for `topic`.
async fn listed_deliveries(hub: &Websubd, topic: &str) -> usize {
    let url = format!(
        "{}api/v1/operator/deliveries?topic={}",
        hub.url,
        url::form_urlencoded::byte_serialize(topic.as_bytes()).collect::<String>()
    );
    let listed: Vec<serde_json::Value> = http_client()
        .get(url)
        .header("X-Internal-API-Key", websub_tests::INTERNAL_KEY)
        .send()
        .await
        .expect("list deliveries")
        .json()
        .await
        .expect("a JSON list");
    listed.len()
}

/// With `--retention 3s`, a delivered event and its record are gone a few
/// seconds later, while a newer one is still there.
/// The deliveries of `topic` the hub lists, once it lists any (at most
/// 10 s): a record is written with its outcome, a moment after the answer.
async fn listed_soon(hub: &Websubd, topic: &str) -> usize {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) && listed_deliveries(hub, topic).await == 0 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    listed_deliveries(hub, topic).await
}

async fn retention_deletes_what_is_older(database_url: String) {
    let dir = scratch_dir("retention");
    let subscriber = TestSubscriber::start().await;
    let topic = "http://127.0.0.1:9/topics/retention";
    save_subscriptions(&database_url, topic, vec![subscriber.callback("kept")]).await;
    let hub = Websubd::on_database(&dir, &database_url, &["--retention", "3s"]).await;
    assert_eq!(hub.fat_ping(topic, "{\"first\":true}").await, 202);
    assert_eq!(
        subscriber
            .wait_for_deliveries("kept", 1, Duration::from_secs(10))
            .await
            .len(),
        1
    );
    assert_eq!(listed_soon(&hub, topic).await, 1);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(15) && listed_deliveries(&hub, topic).await > 0 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let purged_after = started.elapsed();
    assert_eq!(
        listed_deliveries(&hub, topic).await,
        0,
        "the event was kept past its retention"
    );
    // Deleted because it was older, not because everything goes: a new
    // event is delivered and listed.
    assert_eq!(hub.fat_ping(topic, "{\"second\":true}").await, 202);
    subscriber
        .wait_for_deliveries("kept", 2, Duration::from_secs(10))
        .await;
    assert_eq!(listed_soon(&hub, topic).await, 1);
    eprintln!("purged {purged_after:?} after its delivery was listed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_what_is_older_on_sqlite() {
    let dir = scratch_dir("retention-sqlite");
    retention_deletes_what_is_older(format!("sqlite:{}", dir.join("hub.db").display())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_what_is_older_on_postgres() {
    let Some(url) = websub_storetest::servers::fresh_postgres_url().await else {
        return;
    };
    retention_deletes_what_is_older(url).await;
}

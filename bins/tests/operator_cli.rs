//! The operator commands of the real `websub` binary against a real
//! `websubd`: topics and subscriptions listed, shown and deleted, a
//! delivery that ran out of retries shown and retried once its subscriber
//! is fixed, the hub's event log purged, the outbox feeds' state (on a
//! PostgreSQL producer), `--json` that parses and tables that hold the
//! values, and the exit codes: 1 when the hub refuses or cannot be reached,
//! 2 for a bad value or a missing key variable.

use crate::common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{Websubd, free_port, scratch_dir};
use serde_json::Value;
use websub_tests::{Answer, TestSubscriber, http_client};

const INTERNAL_KEY: &str = "an-internal-api-key-of-at-least-32-characters";
const WAIT: Duration = Duration::from_secs(30);

/// `websub ARGS` against `hub` with the tests' key in the environment.
async fn websub(hub: &str, args: &[&str]) -> Output {
    websub_with(
        args,
        &[
            ("WEBSUB_HUB", hub),
            ("WEBSUB_INTERNAL_API_KEY", INTERNAL_KEY),
        ],
    )
    .await
}

/// `websub ARGS` with only `env` of the variables it reads.
async fn websub_with(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_websub"));
    command.args(args);
    for variable in [
        "WEBSUB_HUB",
        "WEBSUB_INTERNAL_API_KEY",
        "WEBSUB_INTERNAL_API_KEY_HEADER",
        "DATABASE_URL",
    ] {
        command.env_remove(variable);
    }
    command.envs(env.iter().copied());
    tokio::task::spawn_blocking(move || command.output().expect("run websub"))
        .await
        .expect("websub ran")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The output of a command that must succeed.
fn succeeded(output: &Output) -> String {
    assert_eq!(
        output.status.code(),
        Some(0),
        "stdout: {}\nstderr: {}",
        stdout(output),
        stderr(output)
    );
    stdout(output)
}

/// The JSON printed by `websub ARGS --json`.
async fn json(hub: &str, args: &[&str]) -> Value {
    let args: Vec<&str> = args.iter().copied().chain(["--json"]).collect();
    let output = websub(hub, &args).await;
    serde_json::from_str(&succeeded(&output)).expect("--json prints JSON")
}

/// Waits until `websub ARGS --json` prints a value `done` accepts. A
/// command that fails meanwhile counts as not yet: right after a publish,
/// the delivery it asks about may not be recorded.
async fn wait_for(hub: &str, args: &[&str], done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT;
    let with_json: Vec<&str> = args.iter().copied().chain(["--json"]).collect();
    loop {
        let output = websub(hub, &with_json).await;
        let said = if output.status.success() {
            let value: Value = serde_json::from_str(&stdout(&output)).expect("--json prints JSON");
            if done(&value) {
                return value;
            }
            value.to_string()
        } else {
            stderr(&output)
        };
        assert!(
            Instant::now() < deadline,
            "websub {args:?} still says {said}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn subscribe(hub: &str, topic: &str, callback: &str) {
    let form = serde_urlencoded::to_string([
        ("hub.mode", "subscribe"),
        ("hub.topic", topic),
        ("hub.callback", callback),
    ])
    .expect("a form");
    let status = http_client()
        .post(hub)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form)
        .send()
        .await
        .expect("subscribe")
        .status();
    assert_eq!(status.as_u16(), 202);
}

/// Publishes `body` to `topic` by fat ping; the event's id.
async fn fat_ping(hub: &str, topic: &str, body: &str) -> String {
    let answer = http_client()
        .post(format!(
            "{hub}?{}",
            serde_urlencoded::to_string([("hub.mode", "publish"), ("hub.topic", topic)])
                .expect("a query")
        ))
        .header("content-type", "application/json")
        .header("X-Internal-API-Key", INTERNAL_KEY)
        .body(body.to_owned())
        .send()
        .await
        .expect("fat ping");
    assert_eq!(answer.status().as_u16(), 202);
    let text = answer.text().await.expect("the answer");
    text.trim()
        .strip_prefix("recorded event ")
        .expect("the event's id")
        .to_owned()
}

/// `subscriptions VERB --topic TOPIC --callback CALLBACK`.
fn pair<'a>(verb: &'a str, topic: &'a str, callback: &'a str) -> [&'a str; 6] {
    [
        "subscriptions",
        verb,
        "--topic",
        topic,
        "--callback",
        callback,
    ]
}

/// websubd's flags: loopback callbacks, the key, and retries that run out
/// fast.
const HUB_ARGS: [&str; 9] = [
    "--allow-private-network",
    "--internal-api-key",
    INTERNAL_KEY,
    "--delivery-retries",
    "1",
    "--delivery-max-backoff",
    "100ms",
    "--poll-interval",
    "200ms",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cli_shows_and_changes_what_the_hub_holds() {
    let dir = scratch_dir("operator-cli");
    let websubd = Websubd::spawn(&dir, free_port(), &HUB_ARGS).ready().await;
    let hub = websubd.url.as_str();
    let subscriber = TestSubscriber::start().await;
    let topic = "http://127.0.0.1:9/topics/orders";
    let (good, bad) = (subscriber.callback("good"), subscriber.callback("bad"));
    subscriber.answer_delivery("bad", Answer::status(500).with_body("not today"));
    subscribe(hub, topic, &good).await;
    subscribe(hub, topic, &bad).await;

    // Topics: the table and the JSON hold the count.
    let topics = wait_for(hub, &["topics"], |topics| topics[0]["subscribers"] == 2).await;
    assert_eq!(topics[0]["topic"], topic);
    let table = succeeded(&websub(hub, &["topics"]).await);
    assert!(table.starts_with("TOPIC"), "{table}");
    let row = table
        .lines()
        .find(|line| line.starts_with(topic))
        .expect("the topic's row");
    assert_eq!(row.split_whitespace().nth(1), Some("2"), "{table}");

    // Subscriptions: every topic's, one callback's, one shown.
    let table = succeeded(&websub(hub, &["subscriptions", "list"]).await);
    assert!(table.contains(&good) && table.contains(&bad), "{table}");
    let one = json(
        hub,
        &[
            "subscriptions",
            "list",
            "--topic",
            topic,
            "--callback",
            &good,
        ],
    )
    .await;
    assert_eq!(one.as_array().map(Vec::len), Some(1), "{one}");
    assert_eq!(one[0]["callback"], good.as_str());
    let shown = succeeded(&websub(hub, &pair("show", topic, &good)).await);
    assert!(
        shown.contains(&good) && shown.contains("pending:"),
        "{shown}"
    );

    // A delivery that runs out of retries, shown with its attempts...
    let event = fat_ping(hub, topic, r#"{"order":1}"#).await;
    let delivery = [
        "deliveries",
        "show",
        event.as_str(),
        "--subscriber",
        bad.as_str(),
    ];
    let failed = wait_for(hub, &delivery, |shown| shown["state"] == "failed").await;
    assert_eq!(
        failed["attempts"].as_array().map(Vec::len),
        Some(2),
        "{failed}"
    );
    assert_eq!(failed["attempts"][0]["status"], 500);
    let table = succeeded(&websub(hub, &delivery).await);
    assert!(table.contains("failed") && table.contains("500"), "{table}");
    assert!(table.contains("not today"), "the answer's body: {table}");
    let health = json(hub, &pair("show", topic, &bad)).await;
    assert_eq!(health["delivery"]["failed"], 1, "{health}");

    // ...then retried once the subscriber is fixed.
    subscriber.answer_delivery("bad", Answer::status(204));
    let retried = succeeded(&websub(hub, &["deliveries", "retry", "--subscriber", &bad]).await);
    assert_eq!(retried.trim(), "re-opened 1 failed deliveries");
    wait_for(hub, &delivery, |shown| shown["state"] == "delivered").await;
    let again = json(hub, &["deliveries", "retry"]).await;
    assert_eq!(again["retried"], 0, "nothing is left failed");

    // Deleting a subscription: then it is not there to show or delete.
    let removed = websub(hub, &pair("delete", topic, &good)).await;
    assert!(succeeded(&removed).contains("removed"));
    let gone = websub(hub, &pair("show", topic, &good)).await;
    assert_eq!(gone.status.code(), Some(1));
    assert!(stderr(&gone).contains("404"), "{}", stderr(&gone));
    let topics = json(hub, &["topics"]).await;
    assert_eq!(topics[0]["subscribers"], 1, "{topics}");

    // Purging the hub's log: the event goes with its deliveries.
    let deadline = Instant::now() + WAIT;
    loop {
        let purged = json(hub, &["purge", "--hub", hub, "--older-than", "1s"]).await;
        if purged["deleted"] == 1 {
            break;
        }
        assert_eq!(purged["deleted"], 0, "{purged}");
        assert!(Instant::now() < deadline, "the event was never purged");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let purged = websub(hub, &delivery).await;
    assert_eq!(purged.status.code(), Some(1), "{}", stdout(&purged));
    assert!(stderr(&purged).contains("404"), "{}", stderr(&purged));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_map_to_exit_codes_that_name_the_cause() {
    let dir = scratch_dir("operator-cli-errors");
    let websubd = Websubd::spawn(&dir, free_port(), &HUB_ARGS).ready().await;
    let hub = websubd.url.as_str();

    // The hub refuses: exit 1 with its status and reason.
    let wrong_key = websub_with(
        &["topics", "--hub", hub],
        &[(
            "WEBSUB_INTERNAL_API_KEY",
            "a-wrong-key-of-at-least-32-characters-long",
        )],
    )
    .await;
    assert_eq!(wrong_key.status.code(), Some(1));
    assert!(stderr(&wrong_key).contains("401"), "{}", stderr(&wrong_key));
    let absurd = websub(hub, &["purge", "--hub", hub, "--older-than", "36600d"]).await;
    assert_eq!(absurd.status.code(), Some(1));
    assert!(stderr(&absurd).contains("400"), "{}", stderr(&absurd));

    // No hub there: exit 1.
    let nobody = format!("http://127.0.0.1:{}/", free_port());
    let unreachable = websub(&nobody, &["feeds"]).await;
    assert_eq!(unreachable.status.code(), Some(1));
    assert!(
        stderr(&unreachable).contains(&nobody),
        "{}",
        stderr(&unreachable)
    );

    // Bad usage: exit 2, naming the value or the variable.
    for (args, named) in [
        (
            vec![
                "deliveries",
                "show",
                "not-a-uuid",
                "--subscriber",
                "http://s.example/cb",
            ],
            "not-a-uuid",
        ),
        (vec!["topics", "--hub", "127.0.0.1:8080"], "127.0.0.1:8080"),
        (vec!["purge", "--hub", hub, "--older-than", "soon"], "soon"),
        (
            vec![
                "purge",
                "--hub",
                hub,
                "--older-than",
                "1d",
                "--schema",
                "shop",
            ],
            "--schema",
        ),
        (
            vec!["subscriptions", "list", "--frobnicate"],
            "--frobnicate",
        ),
    ] {
        let output = websub(hub, &args).await;
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains(named),
            "{args:?}: {}",
            stderr(&output)
        );
    }
    // Neither form named, or both by the environment: refused.
    for env in [
        vec![],
        vec![
            ("WEBSUB_HUB", hub),
            ("DATABASE_URL", "postgres://127.0.0.1:1/shop"),
        ],
    ] {
        let output = websub_with(&["purge", "--older-than", "1d"], &env).await;
        assert_eq!(output.status.code(), Some(2), "{env:?}");
        assert!(stderr(&output).contains("--hub"), "{}", stderr(&output));
    }
    let no_key = websub_with(&["topics", "--hub", hub], &[]).await;
    assert_eq!(no_key.status.code(), Some(2));
    assert!(
        stderr(&no_key).contains("WEBSUB_INTERNAL_API_KEY"),
        "{}",
        stderr(&no_key)
    );

    // A hub without feeds says so.
    let feeds = succeeded(&websub(hub, &["feeds"]).await);
    assert_eq!(feeds.trim(), "this hub runs no outbox feed");
    assert_eq!(json(hub, &["feeds"]).await, serde_json::json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feeds_show_their_backlog_and_listener() {
    let Some(shop) = websub_storetest::servers::fresh_postgres_url().await else {
        eprintln!("skipped: no PostgreSQL for the producer's database (CI is unset)");
        return;
    };
    let tables =
        websub_hub::delivery::outbox::OutboxTables::in_schema("shop").expect("valid names");
    let pool = sqlx::PgPool::connect(&shop)
        .await
        .expect("connect to the shop");
    sqlx::raw_sql(sqlx::AssertSqlSafe(websub_hub::delivery::outbox::ddl(
        &tables,
    )))
    .execute(&pool)
    .await
    .expect("create the outbox tables");
    let dir = scratch_dir("operator-cli-feeds");
    // The webhook's port has no listener, and its retries are spread over
    // far longer than the test: its delivery stays in the backlog.
    let webhooks = dir.join("webhooks.toml");
    std::fs::write(
        &webhooks,
        format!(
            "[[webhook]]\nevent = \"shop.order.created\"\nsubscriber = \"billing\"\n\
             url = \"http://127.0.0.1:{}/hook\"\n",
            free_port()
        ),
    )
    .expect("write the webhooks file");
    let config = dir.join("websubd.toml");
    std::fs::write(
        &config,
        format!(
            "allow_private_network = true\ninternal_api_key = \"{INTERNAL_KEY}\"\n\n\
             [[feed]]\ndatabase_url = \"{shop}\"\noutbox_table = \"shop.outbox\"\n\
             deliveries_table = \"shop.outbox_deliveries\"\nwebhooks_file = \"{}\"\n\
             poll_interval = \"200ms\"\ndelivery_retries = 50\ndelivery_max_backoff = \"10m\"\n",
            webhooks.display()
        ),
    )
    .expect("write the config");
    let config = config.display().to_string();
    let websubd = Websubd::spawn(&dir, free_port(), &["--config", &config])
        .ready()
        .await;
    let hub = websubd.url.as_str();
    sqlx::raw_sql(
        "INSERT INTO shop.outbox (event_name, resource_type, resource_id, event_type, payload) \
         VALUES ('shop.order.created', 'order', '1', 'created', '{}')",
    )
    .execute(&pool)
    .await
    .expect("an event");

    let feeds = wait_for(hub, &["feeds"], |feeds| {
        feeds[0]["backlog"] == 1 && feeds[0]["listener_connected"] == true
    })
    .await;
    assert_eq!(feeds.as_array().map(Vec::len), Some(1), "{feeds}");
    assert_eq!(feeds[0]["outbox_table"], "shop.outbox");
    assert!(
        feeds[0]["oldest_undelivered_seconds"].as_f64().is_some(),
        "{feeds}"
    );
    let table = succeeded(&websub(hub, &["feeds"]).await);
    let row = table
        .lines()
        .find(|line| line.starts_with("shop.outbox"))
        .unwrap_or_else(|| panic!("the feed's row: {table}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells.get(1), Some(&"1"), "the backlog: {table}");
    assert!(cells.contains(&"connected"), "the listener: {table}");

    // Its webhook's row, listed with its state.
    let rows = json(hub, &["deliveries", "list", "--webhook", "billing"]).await;
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "{rows}");
    assert_eq!(
        (&rows[0]["outbox"], &rows[0]["state"]),
        (&Value::from("shop.outbox"), &Value::from("pending")),
        "{rows}"
    );
    let table = succeeded(&websub(hub, &["deliveries", "list", "--webhook", "billing"]).await);
    assert!(
        table.contains("shop.order.created") && table.contains("pending"),
        "{table}"
    );

    // Its webhook's row sent again: re-opened unless an attempt holds it.
    let since = (chrono::Utc::now() - chrono::Duration::hours(1)).to_rfc3339();
    let replayed = json(hub, &["webhook-replay", "billing", "--since", &since]).await;
    assert!(
        replayed["reopened"]
            .as_u64()
            .is_some_and(|reopened| reopened <= 1),
        "{replayed}"
    );
    let table = succeeded(&websub(hub, &["webhook-replay", "billing", "--since", &since]).await);
    assert!(table.contains("rows of webhook billing"), "{table}");
    let neither = websub(hub, &["webhook-replay", "billing"]).await;
    assert_eq!(neither.status.code(), Some(2), "{}", stderr(&neither));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cli_disables_redelivers_and_replays() {
    let dir = scratch_dir("operator-cli-steer");
    let args: Vec<&str> = HUB_ARGS
        .iter()
        .copied()
        // No breaker: the first delivery runs out of retries at once.
        .chain([
            "--disable-endpoint-after",
            "1",
            "--endpoint-open-after",
            "0",
        ])
        .collect();
    let websubd = Websubd::spawn(&dir, free_port(), &args).ready().await;
    let hub = websubd.url.as_str();
    let subscriber = TestSubscriber::start().await;
    let topic = "http://127.0.0.1:9/topics/invoices";
    let bad = subscriber.callback("bad");
    subscriber.answer_delivery("bad", Answer::status(500));
    subscribe(hub, topic, &bad).await;
    wait_for(hub, &["topics"], |topics| topics[0]["subscribers"] == 1).await;
    let started = chrono::Utc::now() - chrono::Duration::seconds(1);

    // One exhausted delivery disables the callback; the next is skipped.
    let first = fat_ping(hub, topic, r#"{"invoice":1}"#).await;
    let listed = wait_for(hub, &["endpoints", "list"], |listed| {
        listed[0]["disabled_at"].is_string()
    })
    .await;
    assert_eq!(listed[0]["endpoint"], bad.as_str(), "{listed}");
    let table = succeeded(&websub(hub, &["endpoints", "list", "--channel", "websub"]).await);
    assert!(
        table.starts_with("CHANNEL")
            && table.contains(&bad)
            && table.contains("exhausted its retries"),
        "{table}"
    );
    let second = fat_ping(hub, topic, r#"{"invoice":2}"#).await;
    let of_bad = ["deliveries", "list", "--subscriber", bad.as_str()];
    let skipped: Vec<&str> = of_bad
        .iter()
        .copied()
        .chain(["--state", "skipped"])
        .collect();
    let listed = wait_for(hub, &skipped, |listed| {
        listed.as_array().is_some_and(|rows| rows.len() == 1)
    })
    .await;
    assert_eq!(listed[0]["event_id"], second.as_str(), "{listed}");
    let table = succeeded(&websub(hub, &skipped).await);
    assert!(
        table.contains("skipped") && table.contains("endpoint disabled"),
        "{table}"
    );
    let refused = websub(hub, &["redeliver", &second, "--subscriber", &bad]).await;
    assert_eq!(refused.status.code(), Some(1));
    assert!(stderr(&refused).contains("409"), "{}", stderr(&refused));

    // Fixed and enabled, then replayed: both events arrive again.
    subscriber.answer_delivery("bad", Answer::status(204));
    let enabled = succeeded(&websub(hub, &["endpoints", "enable", &bad]).await);
    assert_eq!(enabled.trim(), format!("enabled {bad}"));
    let since = started.to_rfc3339();
    let replayed = succeeded(
        &websub(
            hub,
            &[
                "replay",
                "--topic",
                topic,
                "--subscriber",
                &bad,
                "--since",
                &since,
            ],
        )
        .await,
    );
    assert!(replayed.starts_with("replaying 2 events"), "{replayed}");
    let delivered: Vec<&str> = of_bad
        .iter()
        .copied()
        .chain(["--state", "delivered"])
        .collect();
    let listed = wait_for(hub, &delivered, |listed| {
        listed.as_array().is_some_and(|rows| rows.len() == 2)
    })
    .await;
    let mut originals: Vec<&str> = listed
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|row| row["original_id"].as_str())
        .collect();
    originals.sort_unstable();
    let mut expected = vec![first.as_str(), second.as_str()];
    expected.sort_unstable();
    assert_eq!(originals, expected, "{listed}");
    let again = succeeded(&websub(hub, &["redeliver", &first]).await);
    assert!(again.contains(&format!("sent again to {bad}")), "{again}");
    assert!(subscriber.wait_for_deliveries("bad", 3, WAIT).await.len() >= 3);

    // Disabled by hand, with a reason.
    let disabled = succeeded(
        &websub(
            hub,
            &["endpoints", "disable", &bad, "--reason", "maintenance"],
        )
        .await,
    );
    assert_eq!(disabled.trim(), format!("disabled {bad}"));
    let listed = json(hub, &["endpoints", "list"]).await;
    assert_eq!(listed[0]["disabled_reason"], "maintenance", "{listed}");

    // Bad values are named, with exit code 2.
    for (args, named) in [
        (
            vec![
                "replay",
                "--topic",
                topic,
                "--subscriber",
                &bad,
                "--since",
                "yesterday",
            ],
            "yesterday",
        ),
        (vec!["endpoints", "list", "--channel", "mail"], "mail"),
        (vec!["deliveries", "list", "--state", "lost"], "lost"),
        (vec!["redeliver", "not-an-id"], "not-an-id"),
    ] {
        let output = websub(hub, &args).await;
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains(named),
            "{args:?}: {}",
            stderr(&output)
        );
    }
}

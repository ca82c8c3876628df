//! Keys by role against the real `websubd`: a publishing key publishes and
//! does nothing else, an operator key drives the operator API and the admin
//! page, a metrics key opens `/metrics` (in the key header or as a bearer
//! token), the single internal key still does what it did; each role's key
//! is replaced through an overlap in which neither the old nor the new one
//! is refused; the admin page's sessions are kept by the hub, listed and
//! ended through the API and the CLI, by logging out, and by removing the
//! key they were opened with; and the subscriptions service is sent its own
//! key.

use crate::common;

use std::time::Duration;

use chrono::TimeDelta;
use common::{Websubd, cookie_set_by, free_port, no_redirects, scratch_dir};
use reqwest::header;
use websub_hub::intake::quota::Quota;
use websub_hub::intake::quota::fake::FakeQuotaServer;
use websub_hub::web::auth::issue_token;
use websub_tests::{TestSubscriber, http_client};

const PUBLISH_OLD: &str = "publish-key-old-0123456789abcdef0123456789";
const PUBLISH_NEW: &str = "publish-key-new-0123456789abcdef0123456789";
const OPERATOR_OLD: &str = "operator-key-old-0123456789abcdef012345678";
const OPERATOR_NEW: &str = "operator-key-new-0123456789abcdef012345678";
const METRICS_OLD: &str = "metrics-key-old-0123456789abcdef0123456789";
const METRICS_NEW: &str = "metrics-key-new-0123456789abcdef0123456789";
const FORM: &str = "application/x-www-form-urlencoded";
const TOPIC: &str = "http://127.0.0.1:9/keys";

async fn start(dir: &std::path::Path, keys: &[&str]) -> Websubd {
    let database = format!("sqlite:{}", dir.join("hub.db").display());
    let mut arguments = vec!["--database-url", &database, "--allow-private-network"];
    arguments.extend_from_slice(keys);
    Websubd::spawn(&dir.to_path_buf(), free_port(), &arguments)
        .ready()
        .await
}

/// The status of a fat ping sent with `key`.
async fn fat_ping(hub: &Websubd, key: &str) -> u16 {
    http_client()
        .post(format!("{}?hub.mode=publish&hub.topic={TOPIC}", hub.url))
        .header(header::CONTENT_TYPE, "application/json")
        .header("X-Internal-API-Key", key)
        .body("{}")
        .send()
        .await
        .expect("a fat ping")
        .status()
        .as_u16()
}

/// The status of an operator request sent with `key`.
async fn operator_get(hub: &Websubd, key: &str) -> u16 {
    http_client()
        .get(format!("{}api/v1/operator/topics", hub.url))
        .header("X-Internal-API-Key", key)
        .send()
        .await
        .expect("an operator request")
        .status()
        .as_u16()
}

/// The status of `GET /metrics` with `header` set.
async fn metrics(hub: &Websubd, header: Option<(&str, String)>) -> u16 {
    let mut request = http_client().get(format!("{}metrics", hub.url));
    if let Some((name, value)) = header {
        request = request.header(name, value);
    }
    request
        .send()
        .await
        .expect("GET /metrics")
        .status()
        .as_u16()
}

#[tokio::test]
async fn each_role_takes_its_own_keys_and_each_is_replaced_without_a_refusal() {
    let dir = scratch_dir("keys-roles");
    let publish_both = both(PUBLISH_OLD, PUBLISH_NEW);
    let operator_both = both(OPERATOR_OLD, OPERATOR_NEW);
    let metrics_both = both(METRICS_OLD, METRICS_NEW);
    // Before, during and after the overlap of each role's two keys: the
    // callers move from the old key to the new one during the overlap, so
    // at no time is a caller's current key refused.
    let phases: [(&[&str], &str, &str, &str); 3] = [
        (
            &[
                "--publish-keys",
                PUBLISH_OLD,
                "--operator-keys",
                OPERATOR_OLD,
                "--metrics-keys",
                METRICS_OLD,
            ],
            "before",
            "old",
            "",
        ),
        (
            &[
                "--publish-keys",
                &publish_both,
                "--operator-keys",
                &operator_both,
                "--metrics-keys",
                &metrics_both,
            ],
            "overlap",
            "old",
            "new",
        ),
        (
            &[
                "--publish-keys",
                PUBLISH_NEW,
                "--operator-keys",
                OPERATOR_NEW,
                "--metrics-keys",
                METRICS_NEW,
            ],
            "after",
            "new",
            "",
        ),
    ];
    for (keys, phase, accepted, also) in phases {
        let hub = start(&dir, keys).await;
        let pick = |old: &'static str, new: &'static str, which: &str| match which {
            "old" => Some(old),
            "new" => Some(new),
            _ => None,
        };
        for which in [accepted, also] {
            let Some(publish) = pick(PUBLISH_OLD, PUBLISH_NEW, which) else {
                continue;
            };
            let operator = pick(OPERATOR_OLD, OPERATOR_NEW, which).expect("a key");
            let metrics_key = pick(METRICS_OLD, METRICS_NEW, which).expect("a key");
            assert_eq!(
                fat_ping(&hub, publish).await,
                202,
                "{phase}: {which} publish"
            );
            assert_eq!(operator_get(&hub, operator).await, 200, "{phase}: {which}");
            assert_eq!(
                metrics(&hub, Some(("X-Internal-API-Key", metrics_key.to_owned()))).await,
                200,
                "{phase}: {which} metrics in the key header"
            );
            assert_eq!(
                metrics(
                    &hub,
                    Some(("Authorization", format!("Bearer {metrics_key}")))
                )
                .await,
                200,
                "{phase}: {which} metrics as a bearer token"
            );
            // A key of one role opens no other.
            assert_eq!(fat_ping(&hub, operator).await, 401, "{phase}");
            assert_eq!(fat_ping(&hub, metrics_key).await, 401, "{phase}");
            assert_eq!(operator_get(&hub, publish).await, 401, "{phase}");
            assert_eq!(operator_get(&hub, metrics_key).await, 401, "{phase}");
            assert_eq!(
                metrics(&hub, Some(("X-Internal-API-Key", operator.to_owned()))).await,
                401,
                "{phase}"
            );
        }
        assert_eq!(
            metrics(&hub, None).await,
            401,
            "{phase}: metrics need a key"
        );
        if phase == "after" {
            assert_eq!(fat_ping(&hub, PUBLISH_OLD).await, 401, "the old key ended");
            assert_eq!(operator_get(&hub, OPERATOR_OLD).await, 401);
            assert_eq!(
                metrics(&hub, Some(("X-Internal-API-Key", METRICS_OLD.to_owned()))).await,
                401
            );
        }
        drop(hub);
    }

    // The single internal key, as before: publishing and operating, with
    // /metrics open.
    let hub = start(&dir, &["--internal-api-key", websub_tests::INTERNAL_KEY]).await;
    assert_eq!(fat_ping(&hub, websub_tests::INTERNAL_KEY).await, 202);
    assert_eq!(operator_get(&hub, websub_tests::INTERNAL_KEY).await, 200);
    assert_eq!(metrics(&hub, None).await, 200, "open without metrics keys");
    drop(hub);

    // A role without a key refuses with 403 and says which setting.
    let hub = start(&dir, &["--operator-keys", OPERATOR_NEW]).await;
    let answer = http_client()
        .post(format!("{}?hub.mode=publish&hub.topic={TOPIC}", hub.url))
        .header(header::CONTENT_TYPE, "application/json")
        .header("X-Internal-API-Key", OPERATOR_NEW)
        .body("{}")
        .send()
        .await
        .expect("a fat ping");
    assert_eq!(answer.status(), 403);
    assert!(
        answer
            .text()
            .await
            .expect("a reason")
            .contains("publish-keys"),
        "the reason names the setting"
    );
}

/// Two keys as one comma-separated value.
fn both(first: &str, second: &str) -> String {
    format!("{first},{second}")
}

/// Logs in with `key`; the session cookie (`name=value`).
async fn log_in(hub: &Websubd, key: &str) -> String {
    let answer = no_redirects()
        .post(format!("{}admin/login", hub.url))
        .header(header::USER_AGENT, "keys-test-browser")
        .header(header::CONTENT_TYPE, FORM)
        .body(serde_urlencoded::to_string([("key", key)]).expect("a form"))
        .send()
        .await
        .expect("POST the login");
    assert_eq!(answer.status(), 303, "logged in with {key}");
    cookie_set_by(&answer)
}

/// The overview's status with `cookie`, and its CSRF token when it came.
async fn overview(hub: &Websubd, cookie: &str) -> (u16, Option<String>) {
    let answer = no_redirects()
        .get(format!("{}admin", hub.url))
        .header(header::COOKIE, cookie)
        .send()
        .await
        .expect("GET the overview");
    let status = answer.status().as_u16();
    let page = answer.text().await.expect("a body");
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .map(str::to_owned);
    (status, csrf)
}

async fn sessions(hub: &Websubd, key: &str) -> Vec<serde_json::Value> {
    let answer = http_client()
        .get(format!("{}api/v1/operator/admin-sessions", hub.url))
        .header("X-Internal-API-Key", key)
        .send()
        .await
        .expect("list the sessions");
    assert_eq!(answer.status(), 200);
    answer.json().await.expect("JSON")
}

/// The CLI, with `key` as the operator key, against `hub`.
fn websub(hub: &Websubd, key: &str, arguments: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_websub"))
        .args(arguments)
        .env("WEBSUB_HUB", &hub.url)
        .env("WEBSUB_OPERATOR_KEY", key)
        .env_remove("WEBSUB_INTERNAL_API_KEY")
        .output()
        .expect("run websub")
}

#[tokio::test]
async fn admin_sessions_are_kept_by_the_hub_and_end_every_way_they_should() {
    let dir = scratch_dir("keys-sessions");
    let both = both(OPERATOR_OLD, OPERATOR_NEW);
    let hub = start(&dir, &["--operator-keys", &both]).await;

    let first = log_in(&hub, OPERATOR_OLD).await;
    let second = log_in(&hub, OPERATOR_NEW).await;
    let third = log_in(&hub, OPERATOR_OLD).await;
    for cookie in [&first, &second, &third] {
        assert_eq!(overview(&hub, cookie).await.0, 200);
    }
    let listed = sessions(&hub, OPERATOR_NEW).await;
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert!(
        listed
            .iter()
            .all(|session| session["user_agent"] == "keys-test-browser")
    );
    let keys: std::collections::HashSet<&str> = listed
        .iter()
        .filter_map(|session| session["key_id"].as_str())
        .collect();
    assert_eq!(keys.len(), 2, "each key has its own id: {listed:?}");
    for session in &listed {
        let text = session.to_string();
        for cookie in [&first, &second, &third] {
            let token = cookie.trim_start_matches("websub_admin=");
            assert!(!text.contains(token), "a listing never shows a token");
        }
    }

    // Logging out ends the session, not only the browser's cookie.
    let (_, csrf) = overview(&hub, &third).await;
    let logout = no_redirects()
        .post(format!("{}admin/logout", hub.url))
        .header(header::COOKIE, &third)
        .header(header::CONTENT_TYPE, FORM)
        .body(serde_urlencoded::to_string([("csrf", csrf.expect("a CSRF token"))]).expect("a form"))
        .send()
        .await
        .expect("log out");
    assert_eq!(logout.status(), 303);
    assert_eq!(
        overview(&hub, &third).await.0,
        303,
        "a copy of its cookie is dead"
    );
    assert_eq!(sessions(&hub, OPERATOR_NEW).await.len(), 2);

    // An operator ends one through the API.
    let newest = sessions(&hub, OPERATOR_NEW).await;
    let second_id = newest[0]["id"].as_str().expect("an id").to_owned();
    let ended = http_client()
        .delete(format!(
            "{}api/v1/operator/admin-sessions/{second_id}",
            hub.url
        ))
        .header("X-Internal-API-Key", OPERATOR_OLD)
        .send()
        .await
        .expect("end a session");
    assert_eq!(ended.status(), 204);
    assert_eq!(overview(&hub, &second).await.0, 303, "the newest ended");
    assert_eq!(overview(&hub, &first).await.0, 200, "the other goes on");
    let again = http_client()
        .delete(format!(
            "{}api/v1/operator/admin-sessions/{second_id}",
            hub.url
        ))
        .header("X-Internal-API-Key", OPERATOR_OLD)
        .send()
        .await
        .expect("end it again");
    assert_eq!(again.status(), 404);

    // And all at once through the CLI.
    let listed = websub(&hub, OPERATOR_NEW, &["admin-sessions", "list"]);
    assert!(listed.status.success(), "{listed:?}");
    let first_id = sessions(&hub, OPERATOR_NEW).await[0]["id"]
        .as_str()
        .expect("an id")
        .to_owned();
    assert!(String::from_utf8_lossy(&listed.stdout).contains(&first_id));
    let bad = websub(&hub, OPERATOR_NEW, &["admin-sessions", "end", "../topics"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("../topics"));
    let all = websub(&hub, OPERATOR_NEW, &["admin-sessions", "end", "--all"]);
    assert!(all.status.success(), "{all:?}");
    assert!(String::from_utf8_lossy(&all.stdout).contains("ended 1 admin sessions"));
    assert_eq!(overview(&hub, &first).await.0, 303, "every session ended");
    assert!(sessions(&hub, OPERATOR_NEW).await.is_empty());

    // Sessions outlive a restart; the one whose key was removed does not.
    let by_old = log_in(&hub, OPERATOR_OLD).await;
    let by_new = log_in(&hub, OPERATOR_NEW).await;
    drop(hub);
    let hub = start(&dir, &["--operator-keys", OPERATOR_NEW]).await;
    assert_eq!(
        overview(&hub, &by_new).await.0,
        200,
        "kept across a restart"
    );
    assert_eq!(overview(&hub, &by_old).await.0, 303, "its key was removed");
    assert_eq!(sessions(&hub, OPERATOR_NEW).await.len(), 1);
}

#[tokio::test]
async fn the_subscriptions_service_is_sent_its_own_key() {
    const QUOTA_KEY: &str = "the-quota-services-own-key-0123456789abcdef";
    const TOKEN_KEY: &str = "the key user tokens are signed with";
    let service = FakeQuotaServer::start(QUOTA_KEY);
    service.set_default_quotas(vec![Quota::total(
        websub_store::OwnerQuota::DEFAULT_TYPE,
        5,
    )]);
    let subscriber = TestSubscriber::start().await;
    let dir = scratch_dir("keys-quota");
    let quota_url = service.url().to_string();
    let hub = start(
        &dir,
        &[
            "--internal-api-key",
            websub_tests::INTERNAL_KEY,
            "--quota-api-key",
            QUOTA_KEY,
            "--quota-url",
            &quota_url,
            "--user-token-key",
            TOKEN_KEY,
        ],
    )
    .await;
    let token = issue_token(TOKEN_KEY, "alice", None, TimeDelta::minutes(10));
    let answer = http_client()
        .post(&hub.url)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, FORM)
        .body(
            serde_urlencoded::to_string([
                ("hub.mode", "subscribe"),
                ("hub.topic", TOPIC),
                ("hub.callback", subscriber.callback("quota").as_str()),
            ])
            .expect("a form"),
        )
        .send()
        .await
        .expect("subscribe");
    assert_eq!(answer.status(), 202, "{:?}", answer.text().await);
    assert!(
        subscriber
            .wait_for_verifications(1, Duration::from_secs(10))
            .await
            .len()
            == 1,
        "verified after the quota was read with the quota key"
    );
    assert!(service.requests() >= 1, "the service was asked");
}

//! A WebSub subscriber's signing, set through the subscriber API of the real
//! `websubd`: it chooses the Standard Webhooks scheme, then replaces its
//! secret with an overlap. The receiver is the published Python library,
//! checking each delivery against the old secret and the new one apart:
//! before the rotation only the old verifies, during the overlap both do
//! (no receiver is refused whichever it holds), after it only the new.

use crate::common;

use std::time::Duration;

use chrono::TimeDelta;
use common::{PythonReceiver, Websubd, scratch_dir};
use reqwest::header;
use serde_json::{Value, json};
use websub_hub::web::auth::issue_token;
use websub_tests::http_client;

const TOKEN_KEY: &str = "the key user tokens are signed with";
const OLD: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const NEW: &str = "whsec_c2Vjb25kLXNlY3JldC1mb3Itcm90YXRpb24=";
const TOPIC: &str = "http://127.0.0.1:9/signed";
const WAIT: Duration = Duration::from_secs(20);

/// A callback on Python's HTTP server: answers verifications with their
/// challenge, and checks each delivery with the Standard Webhooks library
/// against each of two secrets, one line per delivery.
const RECEIVER: &str = r#"
import http.server, sys, urllib.parse
from standardwebhooks.webhooks import Webhook
old, new, port_file, log_file = sys.argv[1:5]
hooks = {"old": Webhook(old), "new": Webhook(new)}
class Receiver(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
        challenge = query.get("hub.challenge", [""])[0].encode()
        self.send_response(200)
        self.send_header("content-length", str(len(challenge)))
        self.end_headers()
        self.wfile.write(challenge)
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        verdicts = []
        for name, hook in hooks.items():
            try:
                hook.verify(body, dict(self.headers.items()))
                verdicts.append(name + "=ok")
            except Exception:
                verdicts.append(name + "=refused")
        if self.headers.get("x-hub-signature"):
            verdicts.append("x-hub-signature")
        with open(log_file, "a") as log:
            log.write(" ".join(verdicts) + "\n")
        self.send_response(204)
        self.send_header("content-length", "0")
        self.end_headers()
"#;

async fn set_signing(hub: &Websubd, token: &str, callback: &str, body: Value) -> (u16, Value) {
    let query =
        serde_urlencoded::to_string([("topic", TOPIC), ("callback", callback)]).expect("a query");
    let answer = http_client()
        .put(format!("{}api/v1/subscriptions/signing?{query}", hub.url))
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("PUT the signing");
    let status = answer.status().as_u16();
    let text = answer.text().await.expect("a body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_chooses_standard_webhooks_and_replaces_its_secret_through_an_overlap() {
    if !crate::feeds::python_has("standardwebhooks") {
        return;
    }
    let dir = scratch_dir("signing");
    let receiver = PythonReceiver::start(&dir, "receiver", RECEIVER, &[OLD, NEW]).await;
    let port = receiver.port;
    let next_verdict = |count: usize| {
        let receiver = &receiver;
        async move { receiver.wait_for(count).await[count - 1].clone() }
    };

    let database = format!("sqlite:{}", dir.join("hub.db").display());
    let hub = Websubd::on_database(&dir, &database, &["--user-token-key", TOKEN_KEY]).await;
    let token = issue_token(TOKEN_KEY, "alice", None, TimeDelta::minutes(10));
    let callback = format!("http://127.0.0.1:{port}/callback");
    let extra = [("hub.secret", OLD)];
    assert_eq!(
        hub.subscribe_with(TOPIC, &callback, &extra, Some(&token))
            .await,
        202
    );
    hub.wait_until_held(TOPIC, &callback, WAIT * 2).await;

    // Another subscriber sees nothing to change; a secret Standard
    // Webhooks cannot use is refused.
    let mallory = issue_token(TOKEN_KEY, "mallory", None, TimeDelta::minutes(10));
    let (status, _) = set_signing(
        &hub,
        &mallory,
        &callback,
        json!({"scheme": "standard-webhooks"}),
    )
    .await;
    assert_eq!(status, 404);
    let (status, reason) = set_signing(
        &hub,
        &token,
        &callback,
        json!({"scheme": "standard-webhooks", "secret": "not-whsec"}),
    )
    .await;
    assert_eq!(status, 400, "{reason}");

    let (status, view) = set_signing(
        &hub,
        &token,
        &callback,
        json!({"scheme": "standard-webhooks"}),
    )
    .await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["scheme"], "standard-webhooks");
    assert_eq!(hub.fat_ping(TOPIC, "{\"n\":1}").await, 202);
    assert_eq!(
        next_verdict(1).await,
        "old=ok new=refused",
        "before the rotation"
    );

    let (status, view) = set_signing(
        &hub,
        &token,
        &callback,
        json!({"secret": NEW, "overlap_seconds": 3}),
    )
    .await;
    assert_eq!(status, 200, "{view}");
    assert!(view["previous_secret_until"].is_string(), "{view}");
    assert_eq!(hub.fat_ping(TOPIC, "{\"n\":2}").await, 202);
    assert_eq!(next_verdict(2).await, "old=ok new=ok", "during the overlap");

    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(hub.fat_ping(TOPIC, "{\"n\":3}").await, 202);
    assert_eq!(next_verdict(3).await, "old=refused new=ok", "after it");
    drop(hub);
}

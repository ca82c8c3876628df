//! CloudEvents through the real `websubd`: an outbox webhook that asks for
//! them (`format` in the webhooks file) receives each event as a CloudEvent
//! 1.0, in binary or in structured content mode, which the published
//! CloudEvents SDK for Python reads back with the envelope's id, source,
//! type, time, subject and data, signed over the body as the envelope is.

use crate::common;
use crate::feeds::{EVENT_NAME, Shop};

use common::{PythonReceiver, Websubd, free_port, scratch_dir};
use serde_json::Value;
use websub_hub::signature::MESSAGING_SIGNATURE_HEADER;

const SECRET: &str = "the feed's webhook secret";

/// A receiver on Python's HTTP server that reads every POST with the
/// CloudEvents SDK, checks the body's HMAC-SHA256 signature, and writes one
/// JSON line per event: the path, the attributes, the data and the check.
const RECEIVER: &str = r#"
import hashlib, hmac, http.server, json, sys
from cloudevents.core.bindings.http import HTTPMessage, from_http_event
secret, header, port_file, log_file = sys.argv[1:5]
class Receiver(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        try:
            event = from_http_event(HTTPMessage(headers=dict(self.headers.items()), body=body))
            line = {
                "path": self.path,
                "content_type": self.headers.get("content-type"),
                "id": event.get_id(), "source": event.get_source(), "type": event.get_type(),
                "subject": event.get_subject(), "time": event.get_time().isoformat(),
                "data": event.get_data(),
                "signed": hmac.compare_digest(self.headers.get(header, ""), expected),
            }
            status = 204
        except Exception as error:
            line, status = {"path": self.path, "error": repr(error)}, 400
        with open(log_file, "a") as log:
            log.write(json.dumps(line) + "\n")
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_in_both_modes_read_back_with_the_published_sdk() {
    if !crate::feeds::python_has("cloudevents.core.bindings.http") {
        return;
    }
    let Some(shop) = Shop::open().await else {
        return;
    };
    let dir = scratch_dir("cloudevents");
    let receiver = PythonReceiver::start(
        &dir,
        "receiver",
        RECEIVER,
        &[SECRET, MESSAGING_SIGNATURE_HEADER],
    )
    .await;
    let port = receiver.port;
    let webhooks = dir.join("webhooks.toml");
    let entry = |subscriber: &str, format: &str| {
        format!(
            "[[webhook]]\nevent = \"{EVENT_NAME}\"\nsubscriber = \"{subscriber}\"\n\
             url = \"http://127.0.0.1:{port}/{subscriber}\"\nformat = \"{format}\"\n\n"
        )
    };
    std::fs::write(
        &webhooks,
        entry("binary", "cloudevents-binary") + &entry("structured", "cloudevents-structured"),
    )
    .expect("write the webhooks file");
    let config = dir.join("websubd.toml");
    std::fs::write(
        &config,
        format!(
            "allow_private_network = true\n\n[[feed]]\ndatabase_url = \"{url}\"\n\
             outbox_table = \"shop.outbox\"\ndeliveries_table = \"shop.outbox_deliveries\"\n\
             webhooks_file = \"{webhooks}\"\nsigning_secret = \"{SECRET}\"\npoll_interval = \"200ms\"\n",
            url = shop.url,
            webhooks = webhooks.display(),
        ),
    )
    .expect("write the configuration");
    let database = format!("sqlite:{}", dir.join("hub.db").display());
    let config = config.display().to_string();
    let hub = Websubd::spawn(
        &dir,
        free_port(),
        &["--config", &config, "--database-url", &database],
    )
    .ready()
    .await;
    shop.produce(0..3).await;
    let received: Vec<Value> = receiver
        .wait_for(6)
        .await
        .iter()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    let mut orders = std::collections::BTreeMap::<&str, Vec<i64>>::new();
    for event in &received {
        assert!(event.get("error").is_none(), "the SDK read it: {event}");
        assert_eq!(event["signed"], true, "{event}");
        assert_eq!(event["type"], EVENT_NAME, "{event}");
        assert_eq!(event["source"], "/order", "{event}");
        assert!(
            uuid::Uuid::parse_str(event["id"].as_str().unwrap_or("")).is_ok(),
            "{event}"
        );
        let order = event["data"]["order"].as_i64().expect("the payload");
        assert_eq!(event["subject"], order.to_string(), "{event}");
        let path = event["path"].as_str().expect("a path");
        let content_type = event["content_type"].as_str().unwrap_or("");
        match path {
            "/binary" => assert_eq!(content_type, "application/json", "{event}"),
            "/structured" => {
                assert!(
                    content_type.starts_with("application/cloudevents+json"),
                    "{event}"
                );
            }
            other => panic!("unexpected path {other}"),
        }
        orders.entry(path).or_default().push(order);
    }
    for orders in orders.values_mut() {
        orders.sort_unstable();
        assert_eq!(*orders, [0, 1, 2], "every event once per mode");
    }
    assert_eq!(orders.len(), 2, "both modes: {received:?}");
    drop(hub);
}

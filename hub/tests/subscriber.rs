//! The subscriber helpers against a real hub: the hub runs in process on
//! 127.0.0.1 with an embedded SQLite file, the receiver is served on another
//! loopback port, and every request between them is real HTTP. Direct POSTs
//! to the receiver cover what a hub does not do on purpose (forged
//! signatures, duplicates, denials).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::http::{StatusCode, header};
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tokio::sync::{Notify, broadcast};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use url::Url;
use websub_hub::HubConfig;
use websub_hub::protocol::Mode;
use websub_hub::signature::{
    self, EVENT_ID_HEADER, HUB_SIGNATURE_HEADER, MESSAGING_EVENT_ID_HEADER,
    MESSAGING_SIGNATURE_HEADER,
};
use websub_hub::subscriber::{
    ClientError, MemoryDedup, Notification, NotificationError, NotificationHandler, Receiver,
    ReceiverEvent, ReceiverStats, Renewer, Source, State, SubscriberClient,
};
use websub_store::SubscriptionStore;
use websub_tests::{LoopbackServer, serve_on_loopback};

const INTERNAL_KEY: &str = "an-internal-api-key-of-at-least-32-characters";
const SECRET: &str = "a secret shared with the hub";
const WAIT: Duration = Duration::from_secs(10);

fn http() -> reqwest::Client {
    websub_tests::client_builder()
        .build()
        .expect("build a client")
}

/// A hub in this process: SQLite in the temp dir, loopback allowed, short
/// polls and backoffs, and leases from one second.
struct TestHub {
    url: Url,
    store: Arc<dyn SubscriptionStore>,
    stop: CancellationToken,
    database: std::path::PathBuf,
}

impl Drop for TestHub {
    fn drop(&mut self) {
        self.stop.cancel();
        for suffix in ["", "-wal", "-shm"] {
            let mut path = self.database.clone().into_os_string();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }
}

impl TestHub {
    async fn start() -> Self {
        websub_hub::delivery::net::install_crypto_provider();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let database = websub_storetest::scratch::path("subscriber.db");
        let mut config = HubConfig {
            listen: address,
            public_url: websub_hub::config::public_url_for(address),
            database_url: format!("sqlite:{}", database.display()),
            allow_private_network: true,
            internal_api_key: Some(INTERNAL_KEY.to_owned()),
            poll_interval: Duration::from_millis(100),
            ..HubConfig::default()
        };
        config.lease.min = Duration::from_secs(1);
        config.delivery.timeout = Duration::from_secs(5);
        config.delivery.retry.max_backoff = Duration::from_millis(500);
        config.delivery.visibility_timeout = Duration::from_secs(30);
        config.verification.timeout = Duration::from_secs(5);
        let url = config.public_url.clone();
        let hub = websub_hub::server::Hub::open(config)
            .await
            .expect("open the hub");
        let store = hub.store().clone();
        let stop = CancellationToken::new();
        tokio::spawn(hub.run(listener, stop.clone().cancelled_owned()));
        Self {
            url,
            store,
            stop,
            database,
        }
    }

    /// Waits until the hub holds the pair (or no longer does).
    async fn holds(&self, topic: &str, callback: &str, held: bool) -> bool {
        let deadline = Instant::now() + WAIT;
        loop {
            if self.store.get(topic, callback).await.is_ok() == held {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A fat ping: `body` becomes an event of `topic` at once.
    async fn fat_ping(&self, topic: &str, content_type: &str, body: &'static str) {
        let mut url = self.url.clone();
        url.query_pairs_mut()
            .append_pair("hub.mode", "publish")
            .append_pair("hub.topic", topic);
        let response = http()
            .post(url)
            .header(header::CONTENT_TYPE, content_type)
            .header("X-Internal-API-Key", INTERNAL_KEY)
            .body(body)
            .send()
            .await
            .expect("fat ping");
        assert_eq!(response.status(), StatusCode::ACCEPTED);
    }

    async fn post_form(&self, form: &[(&str, &str)]) -> StatusCode {
        http()
            .post(self.url.clone())
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(serde_urlencoded::to_string(form).expect("form"))
            .send()
            .await
            .expect("POST to the hub")
            .status()
    }

    fn client(&self, receiver: &Receiver) -> SubscriberClient {
        SubscriberClient::new(self.url.clone(), http()).with_intents(receiver.intents().clone())
    }
}

/// Records what the handler got; fails the first `failures` calls and
/// waits at `gate` when one is set.
#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<Notification>>,
    calls: AtomicUsize,
    failures: AtomicUsize,
    changed: Notify,
    gate: Option<Arc<Notify>>,
    entered: Notify,
}

impl Recorder {
    fn failing(failures: usize) -> Arc<Self> {
        let recorder = Self::default();
        recorder.failures.store(failures, Ordering::SeqCst);
        Arc::new(recorder)
    }

    fn seen(&self) -> Vec<Notification> {
        self.seen.lock().expect("lock").clone()
    }

    /// Waits until at least `count` notifications were processed.
    async fn wait_for(&self, count: usize) -> Vec<Notification> {
        let deadline = Instant::now() + WAIT;
        loop {
            let changed = self.changed.notified();
            if self.seen().len() >= count {
                return self.seen();
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.seen();
            }
        }
    }
}

/// A handler written as a type rather than a closure.
struct Recording(Arc<Recorder>);

#[async_trait]
impl NotificationHandler for Recording {
    async fn handle(&self, notification: Notification) -> Result<(), NotificationError> {
        let recorder = &self.0;
        recorder.calls.fetch_add(1, Ordering::SeqCst);
        if let Some(gate) = &recorder.gate {
            let opened = gate.notified();
            recorder.entered.notify_one();
            opened.await;
        }
        let failed = recorder
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            })
            .is_ok();
        if failed {
            recorder.changed.notify_waiters();
            return Err("the service's database is down".into());
        }
        recorder.seen.lock().expect("lock").push(notification);
        recorder.changed.notify_waiters();
        Ok(())
    }
}

/// A receiver served on loopback.
struct Subscriber {
    receiver: Receiver,
    recorder: Arc<Recorder>,
    server: LoopbackServer,
}

impl Subscriber {
    async fn start(
        recorder: Arc<Recorder>,
        build: impl FnOnce(
            websub_hub::subscriber::ReceiverBuilder,
        ) -> websub_hub::subscriber::ReceiverBuilder,
    ) -> Self {
        let receiver = build(Receiver::builder())
            .handler(Recording(recorder.clone()))
            .build()
            .expect("build the receiver");
        let server = serve_on_loopback(receiver.router()).await;
        Self {
            receiver,
            recorder,
            server,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.server.address)
    }

    async fn get(&self, path_and_query: &str) -> (StatusCode, String) {
        let response = http()
            .get(self.url(path_and_query))
            .send()
            .await
            .expect("GET the receiver");
        let status = response.status();
        (status, response.text().await.expect("body"))
    }

    async fn post(&self, path: &str, headers: &[(&str, String)], body: &'static str) -> StatusCode {
        let mut request = http().post(self.url(path)).body(body);
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        request.send().await.expect("POST to the receiver").status()
    }
}

/// The headers of a WebSub delivery of `topic`, signed with `secret`.
fn delivery_headers(
    topic: &str,
    event_id: &str,
    signature: Option<String>,
) -> Vec<(&'static str, String)> {
    let mut headers = vec![
        ("content-type", "application/json".to_owned()),
        (
            "link",
            format!("<http://hub.example/>; rel=\"hub\", <{topic}>; rel=\"self\""),
        ),
        (EVENT_ID_HEADER, event_id.to_owned()),
    ];
    if let Some(signature) = signature {
        headers.push((HUB_SIGNATURE_HEADER, signature));
    }
    headers
}

/// The next event `condition` accepts, at most `WAIT` from now.
async fn next_event(
    events: &mut broadcast::Receiver<ReceiverEvent>,
    condition: impl Fn(&ReceiverEvent) -> bool,
) -> Option<ReceiverEvent> {
    tokio::time::timeout(WAIT, async {
        loop {
            match events.recv().await {
                Ok(event) if condition(&event) => return Some(event),
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
    .await
    .ok()
    .flatten()
}

fn is_active(status: &websub_hub::subscriber::Status) -> bool {
    status.state == State::Active
}

#[tokio::test]
async fn subscription_is_verified_and_fat_pings_reach_the_handler_once_each() {
    let hub = TestHub::start().await;
    let subscriber = Subscriber::start(Arc::default(), |builder| builder.callback("/websub")).await;
    let client = hub.client(&subscriber.receiver);
    let topic = "http://127.0.0.1:9/topics/orders";
    let callback = subscriber.url("/websub");

    client
        .subscribe(
            topic,
            &callback,
            Some(Duration::from_secs(3600)),
            Some(SECRET),
        )
        .await
        .expect("the hub accepts the request");
    let status = client
        .intents()
        .wait_for(topic, &callback, WAIT, is_active)
        .await
        .expect("the verification was confirmed");
    assert_eq!(status.lease, Some(Duration::from_secs(3600)));
    assert!(hub.holds(topic, &callback, true).await, "the hub saved it");

    hub.fat_ping(topic, "application/json", "{\"order\":1}")
        .await;
    let seen = subscriber.recorder.wait_for(1).await;
    assert_eq!(seen.len(), 1);
    let first = &seen[0];
    assert_eq!(first.body.as_ref(), b"{\"order\":1}");
    assert_eq!(first.topic, topic);
    assert_eq!(first.content_type.as_deref(), Some("application/json"));
    assert_eq!(first.source, Source::WebSub);
    assert!(first.event_id.is_some(), "the hub sends an event id");

    // Deliveries of one topic to one callback are made in order, so once
    // the second event is in, a repeat of the first would have been too.
    hub.fat_ping(topic, "text/plain", "second").await;
    let seen = subscriber.recorder.wait_for(2).await;
    let bodies: Vec<&[u8]> = seen.iter().map(|n| n.body.as_ref()).collect();
    assert_eq!(bodies, vec![&b"{\"order\":1}"[..], &b"second"[..]]);
    assert_ne!(seen[0].event_id, seen[1].event_id);
    let stats = settled_stats(&subscriber.receiver, |stats| stats.delivered >= 2).await;
    assert_eq!(stats.delivered, 2);
    assert_eq!(
        stats.signature_rejected, 0,
        "the hub's signature checks out"
    );
    assert_eq!(stats.duplicates, 0);
}

/// A topic that is an IRI: the hub's `Link` header spells it as a URI
/// (`caf%C3%A9`), and the receiver takes that for the topic subscribed to
/// (`café`) rather than refusing the delivery as unwanted.
#[tokio::test]
async fn a_delivery_of_an_iri_topic_reaches_its_subscription() {
    let hub = TestHub::start().await;
    let subscriber = Subscriber::start(Arc::default(), |builder| builder.callback("/websub")).await;
    let client = hub.client(&subscriber.receiver);
    let topic = "http://127.0.0.1:9/flux/caf\u{e9}?q=\u{2713}";
    let callback = subscriber.url("/websub");
    client
        .subscribe(topic, &callback, None, Some(SECRET))
        .await
        .expect("the hub accepts the request");
    client
        .intents()
        .wait_for(topic, &callback, WAIT, is_active)
        .await
        .expect("the verification was confirmed");
    assert!(hub.holds(topic, &callback, true).await, "kept as given");

    hub.fat_ping(topic, "text/plain", "bonjour").await;
    let seen = subscriber.recorder.wait_for(1).await;
    assert_eq!(seen.len(), 1, "delivered and wanted");
    assert_eq!(seen[0].topic, topic, "reported as subscribed");
    let self_link = seen[0]
        .headers
        .get(header::LINK)
        .and_then(|link| link.to_str().ok())
        .expect("an ASCII Link header");
    assert!(
        self_link.contains("<http://127.0.0.1:9/flux/caf%C3%A9?q=%E2%9C%93>; rel=\"self\""),
        "{self_link}"
    );
    let stats = settled_stats(&subscriber.receiver, |stats| stats.delivered >= 1).await;
    assert_eq!(stats.unwanted, 0);
    assert!(hub.holds(topic, &callback, true).await, "still subscribed");
}

#[tokio::test]
async fn thin_ping_delivers_the_fetched_topic_with_its_content_type() {
    let hub = TestHub::start().await;
    let publisher = serve_on_loopback(Router::new().route(
        "/feed",
        get(|| async {
            (
                [(header::CONTENT_TYPE, "application/atom+xml")],
                "<feed>entry</feed>",
            )
        }),
    ))
    .await;
    let topic = format!("http://{}/feed", publisher.address);
    let subscriber = Subscriber::start(Arc::default(), |builder| builder.callback("/cb")).await;
    let client = hub.client(&subscriber.receiver);
    let callback = subscriber.url("/cb");
    client
        .subscribe(&topic, &callback, None, None)
        .await
        .expect("subscribe");
    assert!(hub.holds(&topic, &callback, true).await);

    let status = hub
        .post_form(&[("hub.mode", "publish"), ("hub.url", &topic)])
        .await;
    assert!(status.is_success(), "publish answered {status}");
    let seen = subscriber.recorder.wait_for(1).await;
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body.as_ref(), b"<feed>entry</feed>");
    assert_eq!(
        seen[0].content_type.as_deref(),
        Some("application/atom+xml")
    );
}

#[tokio::test]
async fn a_duplicate_event_id_reaches_the_handler_once() {
    let topic = "https://pub.example/feed";
    let subscriber = Subscriber::start(Arc::default(), |builder| {
        builder.expect(topic, "/websub", Some(SECRET))
    })
    .await;
    let body = "{\"n\":1}";
    let headers = delivery_headers(
        topic,
        "event-1",
        Some(signature::sign(SECRET.as_bytes(), body.as_bytes())),
    );
    for _ in 0..2 {
        let status = subscriber.post("/websub", &headers, body).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
    }
    assert_eq!(subscriber.recorder.seen().len(), 1);
    assert_eq!(subscriber.recorder.calls.load(Ordering::SeqCst), 1);
    let stats = subscriber.receiver.stats();
    assert_eq!((stats.delivered, stats.duplicates), (1, 1));

    // Another event is not a duplicate.
    let headers = delivery_headers(
        topic,
        "event-2",
        Some(signature::sign(SECRET.as_bytes(), body.as_bytes())),
    );
    assert_eq!(
        subscriber.post("/websub", &headers, body).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(subscriber.recorder.seen().len(), 2);
}

#[tokio::test]
async fn a_bad_signature_is_acknowledged_and_ignored() {
    let topic = "https://pub.example/feed";
    let subscriber = Subscriber::start(Arc::default(), |builder| {
        builder.expect(topic, "/websub", Some(SECRET))
    })
    .await;
    let mut events = subscriber.receiver.events();
    let body = "{\"amount\":100}";
    let good = signature::sign(SECRET.as_bytes(), body.as_bytes());
    let forged = [
        Some(signature::sign(b"another secret", body.as_bytes())),
        Some(signature::sign(SECRET.as_bytes(), b"{\"amount\":999}")),
        Some(good.replacen("sha256=", "sha1=", 1)),
        Some("sha256=not-hex".to_owned()),
        None,
    ];
    for signature in forged {
        let headers = delivery_headers(topic, "event-1", signature.clone());
        let status = subscriber.post("/websub", &headers, body).await;
        assert!(status.is_success(), "{signature:?} answered {status}");
    }
    assert_eq!(subscriber.recorder.calls.load(Ordering::SeqCst), 0);
    assert_eq!(subscriber.receiver.stats().signature_rejected, 5);
    assert!(matches!(
        next_event(&mut events, |_| true).await,
        Some(ReceiverEvent::SignatureRejected { event_id: Some(id), .. }) if id == "event-1"
    ));

    // The forgeries did not mark the event seen: the real one goes through.
    let headers = delivery_headers(topic, "event-1", Some(good));
    assert_eq!(
        subscriber.post("/websub", &headers, body).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(subscriber.recorder.seen().len(), 1);
}

#[tokio::test]
async fn an_unrequested_verification_is_refused_and_the_hub_stores_nothing() {
    let hub = TestHub::start().await;
    let subscriber = Subscriber::start(Arc::default(), |builder| {
        builder.expect("https://pub.example/wanted", "/websub", None)
    })
    .await;
    let mut events = subscriber.receiver.events();
    let topic = "https://pub.example/unwanted";
    let callback = subscriber.url("/websub");

    // Someone else asks the hub to subscribe this callback.
    let status = hub
        .post_form(&[
            ("hub.mode", "subscribe"),
            ("hub.topic", topic),
            ("hub.callback", &callback),
        ])
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let refused = next_event(&mut events, |event| {
        matches!(event, ReceiverEvent::Refused { .. })
    })
    .await;
    assert_eq!(
        refused,
        Some(ReceiverEvent::Refused {
            mode: "subscribe".to_owned(),
            topic: topic.to_owned(),
            callback: "/websub".to_owned(),
        })
    );
    // The hub acts on the 404 right after it: give it a moment to save
    // anything, then check it did not.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(hub.store.get(topic, &callback).await.is_err());

    // Direct GETs: unknown topic, wrong mode, malformed.
    let (status, body) = subscriber
        .get("/websub?hub.mode=subscribe&hub.topic=https%3A%2F%2Fpub.example%2Fother&hub.challenge=abc&hub.lease_seconds=60")
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_ne!(body, "abc");
    let (status, _) = subscriber
        .get("/websub?hub.mode=unsubscribe&hub.topic=https%3A%2F%2Fpub.example%2Fwanted&hub.challenge=abc")
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "unsubscribe was never asked");
    let (status, _) = subscriber.get("/websub").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, body) = subscriber
        .get("/websub?hub.mode=subscribe&hub.topic=https%3A%2F%2Fpub.example%2Fwanted&hub.challenge=abc&hub.lease_seconds=60")
        .await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::OK, "abc"),
        "the expected pair is confirmed"
    );
    assert_eq!(subscriber.receiver.stats().refused, 3);
}

#[tokio::test]
async fn unsubscription_is_verified_and_the_hub_removes_the_subscription() {
    let hub = TestHub::start().await;
    let subscriber = Subscriber::start(Arc::default(), |builder| builder.callback("/websub")).await;
    let client = hub.client(&subscriber.receiver);
    let topic = "http://127.0.0.1:9/topics/leaving";
    let callback = subscriber.url("/websub");
    client
        .subscribe(topic, &callback, None, Some(SECRET))
        .await
        .expect("subscribe");
    assert!(hub.holds(topic, &callback, true).await);

    client
        .unsubscribe(topic, &callback)
        .await
        .expect("unsubscribe");
    let status = client
        .intents()
        .wait_for(topic, &callback, WAIT, |status| {
            status.state == State::Unsubscribed
        })
        .await;
    assert!(status.is_some(), "the unsubscription was confirmed");
    assert!(
        hub.holds(topic, &callback, false).await,
        "the hub removed it"
    );

    // Content for it now is unwanted: 410 lets a hub end the subscription.
    let body = "late";
    let headers = delivery_headers(
        topic,
        "late-1",
        Some(signature::sign(SECRET.as_bytes(), body.as_bytes())),
    );
    assert_eq!(
        subscriber.post("/websub", &headers, body).await,
        StatusCode::GONE
    );
    assert_eq!(subscriber.receiver.stats().unwanted, 1);
    assert_eq!(subscriber.recorder.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn the_lease_is_renewed_before_it_expires() {
    let hub = TestHub::start().await;
    let subscriber = Subscriber::start(Arc::default(), |builder| builder.callback("/websub")).await;
    let mut events = subscriber.receiver.events();
    let client = hub.client(&subscriber.receiver);
    let topic = "http://127.0.0.1:9/topics/short";
    let callback = subscriber.url("/websub");
    let stop = CancellationToken::new();
    let renewer = tokio::spawn(Renewer::new(client.clone()).run(stop.clone()));

    client
        .subscribe(topic, &callback, Some(Duration::from_secs(2)), Some(SECRET))
        .await
        .expect("subscribe");
    let subscribed = |event: &ReceiverEvent| {
        matches!(
            event,
            ReceiverEvent::Verified {
                mode: Mode::Subscribe,
                ..
            }
        )
    };
    let first = next_event(&mut events, subscribed).await;
    let granted_at = Instant::now();
    assert!(
        matches!(
            first,
            Some(ReceiverEvent::Verified {
                lease_seconds: Some(2),
                ..
            })
        ),
        "{first:?}"
    );
    assert!(hub.holds(topic, &callback, true).await);
    let first_expiry = hub
        .store
        .get(topic, &callback)
        .await
        .expect("held")
        .expires_at
        .expect("a lease");

    let second = tokio::time::timeout_at(
        granted_at + Duration::from_secs(2),
        next_event(&mut events, subscribed),
    )
    .await;
    let renewed_after = granted_at.elapsed();
    assert!(
        matches!(second, Ok(Some(_))),
        "no renewal within the 2 s lease"
    );
    assert!(
        renewed_after >= Duration::from_millis(1200),
        "renewed after {renewed_after:?}, far earlier than 80 % of the lease"
    );
    let status = client.intents().status(topic, &callback).expect("recorded");
    assert!(status.verifications >= 2);
    let deadline = Instant::now() + WAIT;
    loop {
        let held = hub.store.get(topic, &callback).await.expect("still held");
        if held.expires_at.expect("a lease") > first_expiry {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the hub never extended the lease"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(2), renewer)
        .await
        .expect("the renewer stops when cancelled")
        .expect("the renewer did not panic");
}

#[tokio::test]
async fn a_denial_is_acknowledged_and_recorded() {
    let topic = "https://pub.example/feed";
    let subscriber = Subscriber::start(Arc::default(), |builder| {
        builder.expect(topic, "/websub", None)
    })
    .await;
    let mut events = subscriber.receiver.events();
    let (status, _) = subscriber
        .get("/websub?hub.mode=denied&hub.topic=https%3A%2F%2Fpub.example%2Ffeed&hub.reason=quota+exceeded")
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        subscriber
            .receiver
            .intents()
            .status(topic, "/websub")
            .map(|status| status.state),
        Some(State::Denied {
            reason: Some("quota exceeded".to_owned())
        })
    );
    assert_eq!(
        next_event(&mut events, |_| true).await,
        Some(ReceiverEvent::Denied {
            topic: topic.to_owned(),
            callback: "/websub".to_owned(),
            reason: Some("quota exceeded".to_owned()),
        })
    );
    assert_eq!(subscriber.receiver.stats().denied, 1);
    // A denied subscription is no longer confirmed.
    let (status, _) = subscriber
        .get("/websub?hub.mode=subscribe&hub.topic=https%3A%2F%2Fpub.example%2Ffeed&hub.challenge=c&hub.lease_seconds=60")
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_messaging_webhook_checks_its_signature_and_drops_duplicates() {
    let subscriber = Subscriber::start(Arc::default(), |builder| {
        builder.webhook("/hooks/outbox", SECRET)
    })
    .await;
    let body = "{\"event_id\":\"0190\",\"event_name\":\"auth.user.authenticated\",\"data\":{}}";
    let signed = |signature: Option<String>| {
        let mut headers = vec![
            ("content-type", "application/json".to_owned()),
            (MESSAGING_EVENT_ID_HEADER, "0190".to_owned()),
        ];
        if let Some(signature) = signature {
            headers.push((MESSAGING_SIGNATURE_HEADER, signature));
        }
        headers
    };
    let good = signed(Some(signature::sign(SECRET.as_bytes(), body.as_bytes())));

    assert_eq!(
        subscriber.post("/hooks/outbox", &good, body).await,
        StatusCode::NO_CONTENT
    );
    let seen = subscriber.recorder.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].topic, "auth.user.authenticated");
    assert_eq!(seen[0].source, Source::Webhook);
    assert_eq!(seen[0].event_id.as_deref(), Some("0190"));
    assert_eq!(seen[0].body.as_ref(), body.as_bytes());

    assert_eq!(
        subscriber.post("/hooks/outbox", &good, body).await,
        StatusCode::NO_CONTENT,
        "a duplicate is acknowledged"
    );
    for signature in [
        Some(signature::sign(b"wrong", body.as_bytes())),
        Some("sha256=00".to_owned()),
        None,
    ] {
        assert_eq!(
            subscriber
                .post("/hooks/outbox", &signed(signature), body)
                .await,
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(subscriber.recorder.calls.load(Ordering::SeqCst), 1);
    let stats = subscriber.receiver.stats();
    assert_eq!(
        (stats.delivered, stats.duplicates, stats.unauthorized),
        (1, 1, 3)
    );
}

#[tokio::test]
async fn a_webhook_given_two_secrets_accepts_either_while_a_feed_rotates() {
    const NEW: &str = "the feed's new signing secret";
    let subscriber = Subscriber::start(Arc::default(), |builder| {
        builder
            .webhook("/hooks/outbox", SECRET)
            .webhook("/hooks/outbox", NEW)
    })
    .await;
    let bodies = [
        "{\"event_id\":\"0\",\"event_name\":\"e\",\"data\":{}}",
        "{\"event_id\":\"1\",\"event_name\":\"e\",\"data\":{}}",
        "{\"event_id\":\"2\",\"event_name\":\"e\",\"data\":{}}",
    ];
    for (n, (secret, body)) in [SECRET, NEW, "neither of them"]
        .into_iter()
        .zip(bodies)
        .enumerate()
    {
        let headers = vec![
            ("content-type", "application/json".to_owned()),
            (MESSAGING_EVENT_ID_HEADER, n.to_string()),
            (
                MESSAGING_SIGNATURE_HEADER,
                signature::sign(secret.as_bytes(), body.as_bytes()),
            ),
        ];
        let expected = if secret == "neither of them" {
            StatusCode::UNAUTHORIZED
        } else {
            StatusCode::NO_CONTENT
        };
        assert_eq!(
            subscriber.post("/hooks/outbox", &headers, body).await,
            expected,
            "{secret}"
        );
    }
    assert_eq!(subscriber.recorder.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_callback_checks_every_signature_method_the_recommendation_names() {
    use hmac::{Hmac, KeyInit, Mac};
    let topic = "https://pub.example/methods";
    let subscriber = Subscriber::start(Arc::default(), |builder| {
        builder.expect(topic, "/websub", Some(SECRET))
    })
    .await;
    let body = "{\"other\":\"hub\"}";
    fn hex_mac<M: Mac + KeyInit>(body: &str) -> String {
        let mut mac = <M as KeyInit>::new_from_slice(SECRET.as_bytes()).expect("a key");
        mac.update(body.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }
    let signatures = [
        format!("sha1={}", hex_mac::<Hmac<sha1::Sha1>>(body)),
        format!("sha256={}", hex_mac::<Hmac<sha2::Sha256>>(body)),
        format!("sha384={}", hex_mac::<Hmac<sha2::Sha384>>(body)),
        format!("sha512={}", hex_mac::<Hmac<sha2::Sha512>>(body)),
    ];
    for (n, signature) in signatures.into_iter().enumerate() {
        let headers = delivery_headers(topic, &format!("event-{n}"), Some(signature.clone()));
        assert_eq!(
            subscriber.post("/websub", &headers, body).await,
            StatusCode::NO_CONTENT,
            "{signature}"
        );
    }
    assert_eq!(subscriber.recorder.seen().len(), 4, "each method accepted");
    assert_eq!(subscriber.receiver.stats().signature_rejected, 0);
}

#[tokio::test]
async fn a_handler_failure_answers_5xx_and_the_hubs_retry_is_processed() {
    let hub = TestHub::start().await;
    let subscriber =
        Subscriber::start(Recorder::failing(1), |builder| builder.callback("/websub")).await;
    let client = hub.client(&subscriber.receiver);
    let topic = "http://127.0.0.1:9/topics/flaky";
    let callback = subscriber.url("/websub");
    client
        .subscribe(topic, &callback, None, Some(SECRET))
        .await
        .expect("subscribe");
    assert!(hub.holds(topic, &callback, true).await);

    hub.fat_ping(topic, "application/json", "{\"retry\":true}")
        .await;
    let seen = subscriber.recorder.wait_for(1).await;
    assert_eq!(seen.len(), 1, "the retry was processed");
    assert_eq!(seen[0].body.as_ref(), b"{\"retry\":true}");
    assert_eq!(subscriber.recorder.calls.load(Ordering::SeqCst), 2);
    let stats = settled_stats(&subscriber.receiver, |stats| stats.delivered >= 1).await;
    assert_eq!((stats.handler_failed, stats.delivered), (1, 1));
}

/// The receiver's counters once `settled` holds (a delivery is counted
/// after its handler returns, just after the handler passed it on), or
/// after five seconds.
async fn settled_stats(
    receiver: &Receiver,
    settled: impl Fn(&ReceiverStats) -> bool,
) -> ReceiverStats {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let stats = receiver.stats();
        if settled(&stats) || tokio::time::Instant::now() > deadline {
            return stats;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_failed_event_is_processed_when_sent_again() {
    let topic = "https://pub.example/feed";
    let subscriber = Subscriber::start(Recorder::failing(1), |builder| {
        builder.expect(topic, "/websub", None)
    })
    .await;
    let headers = delivery_headers(topic, "event-1", None);
    assert_eq!(
        subscriber.post("/websub", &headers, "x").await,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(
        subscriber.post("/websub", &headers, "x").await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(subscriber.recorder.seen().len(), 1);
    assert_eq!(
        subscriber.post("/websub", &headers, "x").await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(subscriber.recorder.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_duplicate_while_the_first_is_processed_is_asked_to_retry() {
    let topic = "https://pub.example/feed";
    let gate = Arc::new(Notify::new());
    let recorder = Arc::new(Recorder {
        gate: Some(gate.clone()),
        ..Recorder::default()
    });
    let subscriber = Arc::new(
        Subscriber::start(recorder.clone(), |builder| {
            builder.expect(topic, "/websub", None)
        })
        .await,
    );
    let headers = delivery_headers(topic, "event-1", None);
    let entered = recorder.entered.notified();
    let first = tokio::spawn({
        let subscriber = subscriber.clone();
        let headers = headers.clone();
        async move { subscriber.post("/websub", &headers, "x").await }
    });
    tokio::time::timeout(WAIT, entered)
        .await
        .expect("the handler started");
    assert_eq!(
        subscriber.post("/websub", &headers, "x").await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    gate.notify_one();
    assert_eq!(first.await.expect("first"), StatusCode::NO_CONTENT);
    assert_eq!(subscriber.receiver.stats().in_progress, 1);
    assert_eq!(recorder.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn the_dedup_store_bound_is_honoured() {
    let topic = "https://pub.example/feed";
    let dedup = Arc::new(MemoryDedup::new(2));
    let subscriber = Subscriber::start(Arc::default(), |builder| {
        builder.expect(topic, "/websub", None).dedup(dedup.clone())
    })
    .await;
    for id in ["a", "b", "c"] {
        let headers = delivery_headers(topic, id, None);
        assert_eq!(
            subscriber.post("/websub", &headers, "x").await,
            StatusCode::NO_CONTENT
        );
    }
    assert_eq!(dedup.len(), 2);
    // "a" was forgotten to make room; "c" is still remembered.
    for id in ["a", "c"] {
        let headers = delivery_headers(topic, id, None);
        subscriber.post("/websub", &headers, "x").await;
    }
    assert_eq!(subscriber.recorder.calls.load(Ordering::SeqCst), 4);
    assert_eq!(subscriber.receiver.stats().duplicates, 1);
    assert_eq!(dedup.len(), 2);
}

#[tokio::test]
async fn the_client_surfaces_the_hubs_refusal_and_forgets_the_intent() {
    let hub = TestHub::start().await;
    let subscriber = Subscriber::start(Arc::default(), |builder| builder.callback("/websub")).await;
    let client = hub.client(&subscriber.receiver);
    let callback = subscriber.url("/websub");

    let error = client
        .subscribe("not a url", &callback, None, None)
        .await
        .expect_err("the hub refuses a bad topic");
    match error {
        ClientError::Refused { status, reason } => {
            assert_eq!(status, StatusCode::BAD_REQUEST);
            assert!(reason.contains("hub.topic"), "{reason}");
        }
        other => panic!("expected Refused, got {other:?}"),
    }
    assert_eq!(client.intents().status("not a url", &callback), None);

    let long = "s".repeat(200);
    assert!(matches!(
        client
            .subscribe("https://pub.example/feed", &callback, None, Some(&long))
            .await,
        Err(ClientError::SecretTooLong { bytes: 200 })
    ));
}

#[tokio::test]
async fn the_user_token_travels_with_every_request() {
    // A hub front that requires a user token, as an authenticating proxy
    // before a hub does.
    let front = serve_on_loopback(Router::new().route(
        "/",
        post(|headers: axum::http::HeaderMap| async move {
            match headers.get(header::AUTHORIZATION) {
                Some(value) if value == "Bearer user-token" => (StatusCode::ACCEPTED, "accepted"),
                _ => (StatusCode::UNAUTHORIZED, "a user token is required"),
            }
        }),
    ))
    .await;
    let hub_url: Url = format!("http://{}/", front.address).parse().expect("url");
    let client = SubscriberClient::new(hub_url, http());
    let error = client
        .subscribe(
            "https://pub.example/feed",
            "https://me.example/cb",
            None,
            None,
        )
        .await
        .expect_err("no token");
    assert!(
        matches!(&error, ClientError::Refused { status, reason }
            if *status == StatusCode::UNAUTHORIZED && reason == "a user token is required"),
        "{error:?}"
    );
    let client = client
        .with_user_token("Authorization", "user-token")
        .expect("a valid header");
    client
        .subscribe(
            "https://pub.example/feed",
            "https://me.example/cb",
            None,
            None,
        )
        .await
        .expect("with the token");
    client
        .unsubscribe("https://pub.example/feed", "https://me.example/cb")
        .await
        .expect("with the token");
    assert!(matches!(
        client.with_user_token("bad header", "t"),
        Err(ClientError::InvalidToken { .. })
    ));
}

#[tokio::test]
async fn discovery_finds_the_hub_and_the_client_subscribes_through_it() {
    let hub = TestHub::start().await;
    let hub_link = format!("<{}>; rel=\"hub\", </feed?v=2>; rel=\"self\"", hub.url);
    let publisher = serve_on_loopback(
        Router::new()
            .route(
                "/feed",
                get(move || async move { ([(header::LINK, hub_link)], "feed") }),
            )
            .route("/plain", get(|| async { "no links" })),
    )
    .await;
    let topic_url = format!("http://{}/feed", publisher.address);

    let subscriber = Subscriber::start(Arc::default(), |builder| builder.callback("/websub")).await;
    let probe = SubscriberClient::new(hub.url.clone(), http());
    let found = probe.discover(&topic_url).await.expect("discover");
    assert_eq!(found.hub(), Some(&hub.url));
    let topic = found.topic.to_string();
    assert_eq!(topic, format!("http://{}/feed?v=2", publisher.address));

    let client = SubscriberClient::new(found.hubs[0].clone(), http())
        .with_intents(subscriber.receiver.intents().clone());
    let callback = subscriber.url("/websub");
    client
        .subscribe(&topic, &callback, None, None)
        .await
        .expect("subscribe");
    assert!(hub.holds(&topic, &callback, true).await);

    assert!(matches!(
        probe
            .discover(&format!("http://{}/plain", publisher.address))
            .await,
        Err(ClientError::NoHub { .. })
    ));
    assert!(matches!(
        probe
            .discover(&format!("http://{}/missing", publisher.address))
            .await,
        Err(ClientError::Unexpected { status, .. }) if status == StatusCode::NOT_FOUND
    ));
}

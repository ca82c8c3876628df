//! End to end: a real hub on loopback, a scripted subscriber and publisher,
//! and real HTTP for subscribing, verifying, publishing and delivering.

use std::time::Duration;

use websub_hub::signature::{EVENT_ID_HEADER, HUB_SIGNATURE_HEADER, sign};
use websub_tests::{
    Answer, Backend, INTERNAL_KEY, TestHub, TestPublisher, TestSubscriber, http_client, test_config,
};

const WAIT: Duration = Duration::from_secs(10);

async fn hub_on(backend: Backend) -> Option<TestHub> {
    let mut config = test_config(backend).await?;
    config.internal_api_key = Some(INTERNAL_KEY.to_owned());
    Some(TestHub::start(config).await)
}

async fn subscribe_publish_deliver(backend: Backend) {
    let Some(hub) = hub_on(backend).await else {
        return;
    };
    let subscriber = TestSubscriber::start().await;
    let publisher = TestPublisher::start().await;
    let topic = publisher.topic_url("news");
    publisher.set_topic(
        "news",
        "application/atom+xml; charset=utf-8",
        "<feed>first</feed>",
        None,
    );
    let callback = subscriber.callback("reader");

    hub.subscribe(
        &topic,
        &callback,
        &[("hub.secret", "s3cret"), ("hub.lease_seconds", "3600")],
    )
    .await;
    let verification = &subscriber.verifications()[0];
    assert_eq!(verification.param("hub.mode"), Some("subscribe"));
    assert_eq!(verification.param("hub.topic"), Some(topic.as_str()));
    assert_eq!(verification.param("hub.lease_seconds"), Some("3600"));
    assert!(
        verification
            .param("hub.challenge")
            .is_some_and(|c| c.len() >= 32)
    );

    let (status, body) = hub.publish(&[&topic]).await;
    assert_eq!(status, 202, "publish answered {status}: {body}");
    let deliveries = subscriber.wait_for_deliveries("reader", 1, WAIT).await;
    assert_eq!(deliveries.len(), 1, "exactly one delivery");
    let delivery = &deliveries[0];
    assert_eq!(&delivery.body[..], b"<feed>first</feed>");
    assert_eq!(
        delivery.header("content-type"),
        Some("application/atom+xml; charset=utf-8")
    );
    assert_eq!(
        delivery.header("link"),
        Some(format!("<{}>; rel=\"hub\", <{topic}>; rel=\"self\"", hub.url).as_str())
    );
    assert_eq!(
        delivery.header(HUB_SIGNATURE_HEADER),
        Some(sign(b"s3cret", b"<feed>first</feed>").as_str())
    );
    assert!(delivery.header(EVENT_ID_HEADER).is_some());
    assert_eq!(delivery.header("content-length"), Some("18"));
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn subscribe_publish_and_deliver_on_sqlite() {
    subscribe_publish_deliver(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn subscribe_publish_and_deliver_on_postgres() {
    subscribe_publish_deliver(Backend::Postgres).await;
}

/// A topic that is an IRI keeps its identity everywhere (the store, the
/// verification, the event log, the signature), while the `Link` header,
/// which only a URI may go in, spells it percent-encoded, in ASCII.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_iri_topic_is_announced_as_a_uri_in_the_link_header() {
    let Some(hub) = hub_on(Backend::Sqlite).await else {
        return;
    };
    let subscriber = TestSubscriber::start().await;
    let topic = "http://127.0.0.1:9/flux/caf\u{e9}?q=\u{2713}";
    let callback = subscriber.callback("iri");
    hub.subscribe(topic, &callback, &[("hub.secret", "s3cret")])
        .await;
    assert_eq!(
        subscriber.verifications()[0].param("hub.topic"),
        Some(topic)
    );
    assert_eq!(hub.store.list_by_topic(topic).await.expect("list").len(), 1);

    let (status, body) = hub.fat_ping(topic, "text/plain", b"bonjour".to_vec()).await;
    assert_eq!(status, 202, "fat ping answered {status}: {body}");
    let deliveries = subscriber.wait_for_deliveries("iri", 1, WAIT).await;
    assert_eq!(deliveries.len(), 1);
    let delivery = &deliveries[0];
    let link = delivery.headers.get("link").expect("a Link header");
    assert!(link.as_bytes().is_ascii(), "{link:?}");
    assert_eq!(
        link.to_str().expect("ASCII"),
        format!(
            "<{}>; rel=\"hub\", <http://127.0.0.1:9/flux/caf%C3%A9?q=%E2%9C%93>; rel=\"self\"",
            hub.url
        )
    );
    assert_eq!(
        delivery.header(HUB_SIGNATURE_HEADER),
        Some(sign(b"s3cret", b"bonjour").as_str())
    );
    let event = hub
        .events
        .latest(topic)
        .await
        .expect("read the log")
        .expect("recorded under the topic as given");
    assert_eq!(event.topic, topic);
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resubscribe_gives_one_delivery_per_publish() {
    let Some(hub) = hub_on(Backend::Sqlite).await else {
        return;
    };
    let subscriber = TestSubscriber::start().await;
    let topic = "http://127.0.0.1:9/topics/resubscribed";
    let callback = subscriber.callback("twice");
    hub.subscribe(topic, &callback, &[]).await;
    hub.subscribe(topic, &callback, &[]).await;
    assert_eq!(hub.store.list_by_topic(topic).await.expect("list").len(), 1);

    let (status, _) = hub.fat_ping(topic, "text/plain", b"one".to_vec()).await;
    assert_eq!(status, 202);
    subscriber.wait_for_deliveries("twice", 1, WAIT).await;
    let (status, _) = hub.fat_ping(topic, "text/plain", b"two".to_vec()).await;
    assert_eq!(status, 202);
    subscriber.wait_for_deliveries("twice", 2, WAIT).await;
    // Stopping drains the dispatcher: a duplicate would have arrived by now.
    hub.stop().await;
    let bodies: Vec<Vec<u8>> = subscriber
        .deliveries_to("twice")
        .iter()
        .map(|delivery| delivery.body.to_vec())
        .collect();
    assert_eq!(bodies, vec![b"one".to_vec(), b"two".to_vec()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_verification_stores_nothing() {
    let Some(hub) = hub_on(Backend::Sqlite).await else {
        return;
    };
    let subscriber = TestSubscriber::start().await;
    let topic = "http://127.0.0.1:9/topics/refused";
    for (name, answer) in [
        ("not-found", Answer::status(404)),
        (
            "wrong-body",
            Answer::challenge_with(|challenge| format!("not-{challenge}")),
        ),
        ("error", Answer::status(500)),
    ] {
        subscriber.answer_verification(name, answer);
        let callback = subscriber.callback(name);
        let (status, _) = hub.request("subscribe", topic, &callback, &[]).await;
        assert_eq!(status, 202, "the answer never depends on verification");
    }
    subscriber.wait_for_verifications(3, WAIT).await;
    let store = hub.store.clone();
    // Stopping drains the verifications in flight, so every outcome is in.
    hub.stop().await;
    assert_eq!(subscriber.verifications().len(), 3);
    assert!(store.list_by_topic(topic).await.expect("list").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failed_renewal_keeps_the_old_secret() {
    let Some(hub) = hub_on(Backend::Sqlite).await else {
        return;
    };
    let subscriber = TestSubscriber::start().await;
    let topic = "http://127.0.0.1:9/topics/renewal";
    let callback = subscriber.callback("renewing");
    hub.subscribe(topic, &callback, &[("hub.secret", "old-secret")])
        .await;

    subscriber.answer_verification("renewing", Answer::status(404));
    let (status, _) = hub
        .request(
            "subscribe",
            topic,
            &callback,
            &[("hub.secret", "new-secret")],
        )
        .await;
    assert_eq!(status, 202);
    subscriber.wait_for_verifications(2, WAIT).await;

    let (status, _) = hub.fat_ping(topic, "text/plain", b"signed".to_vec()).await;
    assert_eq!(status, 202);
    let deliveries = subscriber.wait_for_deliveries("renewing", 1, WAIT).await;
    assert_eq!(
        deliveries[0].header(HUB_SIGNATURE_HEADER),
        Some(sign(b"old-secret", b"signed").as_str())
    );
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gone_callback_loses_its_subscription() {
    let Some(hub) = hub_on(Backend::Sqlite).await else {
        return;
    };
    let subscriber = TestSubscriber::start().await;
    let topic = "http://127.0.0.1:9/topics/gone";
    let callback = subscriber.callback("leaving");
    hub.subscribe(topic, &callback, &[]).await;
    subscriber.answer_delivery("leaving", Answer::status(410));
    let (status, _) = hub.fat_ping(topic, "text/plain", b"bye".to_vec()).await;
    assert_eq!(status, 202);
    assert!(hub.wait_for_subscription(topic, &callback, false).await);
    assert_eq!(subscriber.attempts("leaving"), 1, "a 410 is not retried");
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_error_is_retried_until_delivered() {
    let Some(hub) = hub_on(Backend::Sqlite).await else {
        return;
    };
    let subscriber = TestSubscriber::start().await;
    let topic = "http://127.0.0.1:9/topics/flaky";
    let callback = subscriber.callback("flaky");
    hub.subscribe(topic, &callback, &[]).await;
    subscriber.answer_deliveries_in_turn("flaky", [500, 503, 204].map(Answer::status));
    let (status, _) = hub
        .fat_ping(topic, "text/plain", b"eventually".to_vec())
        .await;
    assert_eq!(status, 202);
    let deliveries = subscriber.wait_for_deliveries("flaky", 1, WAIT).await;
    assert_eq!(deliveries.len(), 1);
    assert_eq!(subscriber.attempts("flaky"), 3);
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hanging_callback_does_not_delay_its_neighbour() {
    let Some(hub) = hub_on(Backend::Sqlite).await else {
        return;
    };
    let subscriber = TestSubscriber::start().await;
    let topic = "http://127.0.0.1:9/topics/shared";
    let slow = subscriber.callback("slow");
    let quick = subscriber.callback("quick");
    hub.subscribe(topic, &slow, &[]).await;
    hub.subscribe(topic, &quick, &[]).await;
    subscriber.answer_delivery("slow", Answer::status(200).after(Duration::from_secs(20)));
    let (status, _) = hub.fat_ping(topic, "text/plain", b"news".to_vec()).await;
    assert_eq!(status, 202);
    // Within 3 s of a 20 s hang: the quick one is delivered while the slow
    // one is still being attempted.
    let quick_while_slow_hangs = subscriber
        .wait_until(Duration::from_secs(3), |subscriber| {
            subscriber.deliveries_to("quick").len() == 1 && subscriber.attempts("slow") == 1
        })
        .await;
    assert!(
        quick_while_slow_hangs,
        "quick delivered {} times, slow attempted {} times",
        subscriber.deliveries_to("quick").len(),
        subscriber.attempts("slow")
    );
    assert!(subscriber.deliveries_to("slow").is_empty());
}

async fn many_subscribers_each_get_one(backend: Backend) {
    let Some(hub) = hub_on(backend).await else {
        return;
    };
    let subscriber = TestSubscriber::start().await;
    let topic = "http://127.0.0.1:9/topics/popular";
    for index in 0..200 {
        let callback = subscriber.callback(&format!("s{index}"));
        let (status, _) = hub.request("subscribe", topic, &callback, &[]).await;
        assert_eq!(status, 202);
    }
    let verified = hub.store.list_by_topic(topic).await.expect("list").len();
    let all_verified = subscriber
        .wait_until(WAIT, |subscriber| subscriber.verifications().len() >= 200)
        .await;
    assert!(all_verified, "only {verified} verified");
    let deadline = std::time::Instant::now() + WAIT;
    while hub.store.list_by_topic(topic).await.expect("list").len() < 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "subscriptions not saved"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, _) = hub
        .fat_ping(topic, "application/json", b"{\"n\":1}".to_vec())
        .await;
    assert_eq!(status, 202);
    assert!(
        subscriber
            .wait_until(WAIT, |subscriber| subscriber.deliveries().len() >= 200)
            .await
    );
    hub.stop().await;
    let mut paths: Vec<String> = subscriber
        .deliveries()
        .into_iter()
        .map(|d| d.path)
        .collect();
    paths.sort();
    paths.dedup();
    assert_eq!(paths.len(), 200, "every subscriber got a delivery");
    assert_eq!(subscriber.deliveries().len(), 200, "and exactly one");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_subscribers_each_get_exactly_one_on_sqlite() {
    many_subscribers_each_get_one(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_subscribers_each_get_exactly_one_on_postgres() {
    many_subscribers_each_get_one(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_mebibyte_binary_body_arrives_byte_identical() {
    let Some(hub) = hub_on(Backend::Sqlite).await else {
        return;
    };
    let subscriber = TestSubscriber::start().await;
    let topic = "http://127.0.0.1:9/topics/binary?format=raw&v=2";
    let callback = format!("{}?token=abc&x=%2F", subscriber.callback("binary"));
    hub.subscribe(topic, &callback, &[("hub.secret", "k")])
        .await;
    let verification = &subscriber.verifications()[0];
    assert!(
        verification.query().starts_with("token=abc&x=%2F&"),
        "the callback's own query string is kept first: {}",
        verification.query()
    );
    let body: Vec<u8> = (0..1024 * 1024).map(|index| (index % 251) as u8).collect();
    let (status, text) = hub
        .fat_ping(topic, "application/octet-stream", body.clone())
        .await;
    assert_eq!(status, 202, "{text}");
    let deliveries = subscriber.wait_for_deliveries("binary", 1, WAIT).await;
    assert_eq!(deliveries[0].body.len(), body.len());
    assert!(
        deliveries[0].body[..] == body[..],
        "the body changed on the way"
    );
    assert_eq!(deliveries[0].raw_query.as_deref(), Some("token=abc&x=%2F"));
    assert_eq!(
        deliveries[0].header(HUB_SIGNATURE_HEADER),
        Some(sign(b"k", &body).as_str())
    );
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unchanged_topic_is_not_distributed_again() {
    let Some(hub) = hub_on(Backend::Sqlite).await else {
        return;
    };
    let subscriber = TestSubscriber::start().await;
    let publisher = TestPublisher::start().await;
    publisher.set_topic("etagged", "text/plain", "v1", Some("\"v1\""));
    let topic = publisher.topic_url("etagged");
    hub.subscribe(&topic, &subscriber.callback("etag"), &[])
        .await;
    hub.publish(&[&topic]).await;
    subscriber.wait_for_deliveries("etag", 1, WAIT).await;
    hub.publish(&[&topic]).await;
    let deadline = std::time::Instant::now() + WAIT;
    while publisher.fetches("etagged") < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "second fetch never came"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    publisher.set_topic("etagged", "text/plain", "v2", Some("\"v2\""));
    hub.publish(&[&topic]).await;
    let deliveries = subscriber.wait_for_deliveries("etag", 2, WAIT).await;
    hub.stop().await;
    let bodies: Vec<&[u8]> = deliveries.iter().map(|d| &d.body[..]).collect();
    assert_eq!(
        bodies,
        vec![&b"v1"[..], &b"v2"[..]],
        "the 304 was distributed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unsubscribe_stops_deliveries() {
    let Some(hub) = hub_on(Backend::Sqlite).await else {
        return;
    };
    let subscriber = TestSubscriber::start().await;
    let topic = "http://127.0.0.1:9/topics/unsub";
    let callback = subscriber.callback("quitter");
    hub.subscribe(topic, &callback, &[]).await;
    let (status, _) = hub.request("unsubscribe", topic, &callback, &[]).await;
    assert_eq!(status, 202);
    assert!(hub.wait_for_subscription(topic, &callback, false).await);
    let last = subscriber.verifications().pop().expect("a verification");
    assert_eq!(last.param("hub.mode"), Some("unsubscribe"));
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_requests_get_their_4xx() {
    let Some(hub) = hub_on(Backend::Sqlite).await else {
        return;
    };
    let callback = "http://127.0.0.1:9/cb";
    let topic = "http://127.0.0.1:9/topic";
    let long_secret = "s".repeat(200);
    let cases: Vec<Vec<(&str, &str)>> = vec![
        vec![("hub.topic", topic), ("hub.callback", callback)],
        vec![("hub.mode", "subscribe"), ("hub.callback", callback)],
        vec![("hub.mode", "subscribe"), ("hub.topic", topic)],
        vec![
            ("hub.mode", "follow"),
            ("hub.topic", topic),
            ("hub.callback", callback),
        ],
        vec![
            ("hub.mode", "subscribe"),
            ("hub.topic", topic),
            ("hub.callback", "ftp://x/cb"),
        ],
        vec![
            ("hub.mode", "subscribe"),
            ("hub.topic", "/relative"),
            ("hub.callback", callback),
        ],
        vec![
            ("hub.mode", "subscribe"),
            ("hub.topic", topic),
            ("hub.callback", callback),
            ("hub.secret", &long_secret),
        ],
        vec![
            ("hub.mode", "subscribe"),
            ("hub.topic", topic),
            ("hub.callback", callback),
            ("hub.lease_seconds", "-5"),
        ],
        vec![("hub.mode", "publish")],
    ];
    for form in cases {
        let (status, reason) = hub.post_form(&form).await;
        assert_eq!(status, 400, "{form:?} answered {status}: {reason}");
        assert!(!reason.trim().is_empty(), "{form:?}: a reason is given");
    }

    let client = http_client();
    let response = client
        .post(&hub.url)
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .expect("post");
    assert_eq!(response.status().as_u16(), 415);
    let response = client
        .post(&hub.url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("hub.mode=subscribe&pad={}", "x".repeat(128 * 1024)))
        .send()
        .await
        .expect("post");
    assert_eq!(response.status().as_u16(), 413);

    let fat = format!("{}?hub.mode=publish&hub.topic={}", hub.url, topic);
    let response = client.post(&fat).body("x").send().await.expect("post");
    assert_eq!(response.status().as_u16(), 401, "fat ping without the key");
    let response = client
        .post(&fat)
        .header("X-Internal-API-Key", "wrong-key-wrong-key-wrong-key-wrong")
        .body("x")
        .send()
        .await
        .expect("post");
    assert_eq!(response.status().as_u16(), 401, "fat ping with a wrong key");
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn private_callbacks_are_refused_by_default() {
    let Some(mut config) = test_config(Backend::Sqlite).await else {
        return;
    };
    config.allow_private_network = false;
    let hub = TestHub::start(config).await;
    let (status, reason) = hub
        .request(
            "subscribe",
            "https://example.com/feed",
            "http://127.0.0.1:1/cb",
            &[],
        )
        .await;
    assert_eq!(status, 400, "{reason}");
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renewal_with_a_new_secret_signs_the_next_delivery_with_it() {
    let Some(hub) = hub_on(Backend::Sqlite).await else {
        return;
    };
    let subscriber = TestSubscriber::start().await;
    let topic = "http://127.0.0.1:9/topics/rotated";
    let callback = subscriber.callback("rotating");
    hub.subscribe(topic, &callback, &[("hub.secret", "first")])
        .await;
    let (status, _) = hub.fat_ping(topic, "text/plain", b"one".to_vec()).await;
    assert_eq!(status, 202);
    subscriber.wait_for_deliveries("rotating", 1, WAIT).await;

    let (status, _) = hub
        .request("subscribe", topic, &callback, &[("hub.secret", "second")])
        .await;
    assert_eq!(status, 202);
    let deadline = std::time::Instant::now() + WAIT;
    while hub
        .store
        .get(topic, &callback)
        .await
        .expect("held")
        .secret
        .as_deref()
        != Some("second")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the renewal was not saved"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, _) = hub.fat_ping(topic, "text/plain", b"two".to_vec()).await;
    assert_eq!(status, 202);
    let deliveries = subscriber.wait_for_deliveries("rotating", 2, WAIT).await;
    assert_eq!(
        deliveries[1].header(HUB_SIGNATURE_HEADER),
        Some(sign(b"second", b"two").as_str()),
        "the delivery after the renewal is signed with the new secret"
    );
    hub.stop().await;
}

//! Tests of the hub URL's form parsing and validation.

use super::*;

const TOPIC_URL: &str = "https://publisher.example/feed";
const CALLBACK_URL: &str = "https://subscriber.example/cb?id=7";

fn form(pairs: &[(&str, &str)]) -> Vec<u8> {
    serde_urlencoded::to_string(pairs)
        .unwrap_or_else(|error| panic!("encode: {error}"))
        .into_bytes()
}

fn subscription(body: &[u8]) -> SubscriptionRequest {
    match parse_form(body) {
        Ok(HubRequest::Subscription(request)) => request,
        other => panic!("expected a subscription, got {other:?}"),
    }
}

fn publish(body: &[u8]) -> PublishRequest {
    match parse_form(body) {
        Ok(HubRequest::Publish(request)) => request,
        other => panic!("expected a publish, got {other:?}"),
    }
}

fn subscribe_with(extra: &[(&str, &str)]) -> Vec<u8> {
    let mut pairs = vec![
        ("hub.mode", "subscribe"),
        ("hub.topic", TOPIC_URL),
        ("hub.callback", CALLBACK_URL),
    ];
    pairs.extend_from_slice(extra);
    form(&pairs)
}

#[test]
fn iris_are_spelled_as_uris_and_uris_stay_as_written() {
    assert_eq!(
        iri_to_uri("http://127.0.0.1:8080/flux/caf\u{e9}?q=\u{2713}"),
        "http://127.0.0.1:8080/flux/caf%C3%A9?q=%E2%9C%93"
    );
    for uri in [
        TOPIC_URL,
        "https://pub.example/a%2Fb/caf%c3%a9?x=%20&y=[1]#top",
        "https://pub.example/!$&'()*+,;=:@~-._",
    ] {
        assert!(matches!(iri_to_uri(uri), Cow::Borrowed(same) if same == uri));
    }
    assert_eq!(
        iri_to_uri("https://pub.example/a b<c>\"d\"{|}\\^`\u{7f}\t%zz%4"),
        "https://pub.example/a%20b%3Cc%3E%22d%22%7B%7C%7D%5C%5E%60%7F%09%25zz%254"
    );
}

#[test]
fn subscribe_with_every_parameter() {
    let request = subscription(&subscribe_with(&[
        ("hub.lease_seconds", "3600"),
        ("hub.secret", "s3cr3t"),
    ]));
    assert_eq!(
        request,
        SubscriptionRequest {
            mode: Mode::Subscribe,
            topic: TOPIC_URL.to_owned(),
            callback: CALLBACK_URL.to_owned(),
            lease_seconds: Some(3600),
            secret: Some("s3cr3t".to_owned()),
            owner: None,
        }
    );
}

#[test]
fn subscribe_with_only_the_required_parameters() {
    let request = subscription(&subscribe_with(&[]));
    assert_eq!(request.lease_seconds, None);
    assert_eq!(request.secret, None);
    assert_eq!(request.owner, None);
}

#[test]
fn unsubscribe_ignores_lease_and_secret_even_when_invalid() {
    let body = form(&[
        ("hub.mode", "unsubscribe"),
        ("hub.topic", TOPIC_URL),
        ("hub.callback", CALLBACK_URL),
        ("hub.lease_seconds", "-5"),
        ("hub.lease_seconds", "abc"),
        ("hub.secret", &"x".repeat(300)),
    ]);
    let request = subscription(&body);
    assert_eq!(request.mode, Mode::Unsubscribe);
    assert_eq!(request.lease_seconds, None);
    assert_eq!(request.secret, None);
}

#[test]
fn unknown_parameters_are_ignored() {
    let request = subscription(&subscribe_with(&[
        ("hub.verify", "async"),
        ("hub.verify", "sync"),
        ("hub.verify_token", "tok"),
        ("other", "1"),
    ]));
    assert_eq!(request.topic, TOPIC_URL);
}

#[test]
fn owner_never_comes_from_the_form() {
    let request = subscription(&subscribe_with(&[("owner", "mallory"), ("hub.owner", "m")]));
    assert_eq!(request.owner, None);
}

#[test]
fn missing_parameters_are_named() {
    let cases: [(&[(&str, &str)], &str); 5] = [
        (
            &[("hub.topic", TOPIC_URL), ("hub.callback", CALLBACK_URL)],
            "hub.mode",
        ),
        (
            &[("hub.mode", "subscribe"), ("hub.callback", CALLBACK_URL)],
            "hub.topic",
        ),
        (
            &[("hub.mode", "subscribe"), ("hub.topic", TOPIC_URL)],
            "hub.callback",
        ),
        (
            &[
                ("hub.mode", "subscribe"),
                ("hub.topic", ""),
                ("hub.callback", CALLBACK_URL),
            ],
            "hub.topic",
        ),
        (&[("hub.mode", "")], "hub.mode"),
    ];
    for (pairs, missing) in cases {
        assert_eq!(
            parse_form(&form(pairs)),
            Err(ProtocolError::MissingParameter { name: missing }),
            "{pairs:?}"
        );
    }
    assert_eq!(
        parse_form(b""),
        Err(ProtocolError::MissingParameter { name: "hub.mode" })
    );
}

#[test]
fn unknown_mode_is_named() {
    let body = form(&[("hub.mode", "Subscribe"), ("hub.topic", TOPIC_URL)]);
    assert_eq!(
        parse_form(&body),
        Err(ProtocolError::UnknownMode {
            mode: "Subscribe".to_owned()
        })
    );
}

#[test]
fn long_values_are_shortened_in_errors() {
    let mode = "m".repeat(10_000);
    let Err(ProtocolError::UnknownMode { mode: echoed }) =
        parse_form(&form(&[("hub.mode", &mode)]))
    else {
        panic!("expected UnknownMode");
    };
    assert!(echoed.len() < 100, "{} bytes echoed", echoed.len());
}

#[test]
fn topic_and_callback_must_be_absolute_http_urls() {
    for bad in [
        "/relative",
        "ftp://example.com/x",
        "mailto:a@example.com",
        "not a url",
        "http://",
    ] {
        let body = form(&[
            ("hub.mode", "subscribe"),
            ("hub.topic", bad),
            ("hub.callback", CALLBACK_URL),
        ]);
        assert!(
            matches!(
                parse_form(&body),
                Err(ProtocolError::InvalidUrl {
                    name: "hub.topic",
                    ..
                })
            ),
            "topic {bad:?}"
        );
        let body = form(&[
            ("hub.mode", "subscribe"),
            ("hub.topic", TOPIC_URL),
            ("hub.callback", bad),
        ]);
        assert!(
            matches!(
                parse_form(&body),
                Err(ProtocolError::InvalidUrl {
                    name: "hub.callback",
                    ..
                })
            ),
            "callback {bad:?}"
        );
    }
    let request = subscription(&form(&[
        ("hub.mode", "subscribe"),
        ("hub.topic", "http://publisher.example:8080/feed"),
        ("hub.callback", "http://[2001:db8::1]/cb"),
    ]));
    assert_eq!(request.topic, "http://publisher.example:8080/feed");
    assert_eq!(request.callback, "http://[2001:db8::1]/cb");
}

#[test]
fn urls_are_kept_as_sent() {
    // No host lower-casing, no trailing slash added, reserved escapes and
    // their hex case untouched, query and its order kept.
    let topic = "HTTP://Publisher.Example/Feed%2fA%3f?b=2&a=1";
    let callback = "https://Sub.Example?z=1&z=2&%2F";
    let request = subscription(&form(&[
        ("hub.mode", "subscribe"),
        ("hub.topic", topic),
        ("hub.callback", callback),
    ]));
    assert_eq!(request.topic, topic);
    assert_eq!(request.callback, callback);
}

#[test]
fn percent_encoded_unreserved_characters_are_decoded() {
    let request = subscription(&form(&[
        ("hub.mode", "subscribe"),
        (
            "hub.topic",
            "https://publisher.example/%7Euser/%41%62%2D%2e%5F%30",
        ),
        ("hub.callback", "https://sub.example/cb?x=%7e%20%2F%zz%4"),
    ]));
    assert_eq!(request.topic, "https://publisher.example/~user/Ab-._0");
    assert_eq!(request.callback, "https://sub.example/cb?x=~%20%2F%zz%4");
}

#[test]
fn secret_must_be_shorter_than_200_bytes() {
    let longest = "s".repeat(199);
    let request = subscription(&subscribe_with(&[("hub.secret", &longest)]));
    assert_eq!(request.secret.as_deref(), Some(longest.as_str()));

    let too_long = "s".repeat(200);
    assert_eq!(
        parse_form(&subscribe_with(&[("hub.secret", &too_long)])),
        Err(ProtocolError::SecretTooLong { length: 200 })
    );
    // Bytes, not characters: 100 two-byte characters are 200 bytes.
    let multibyte = "é".repeat(100);
    assert_eq!(
        parse_form(&subscribe_with(&[("hub.secret", &multibyte)])),
        Err(ProtocolError::SecretTooLong { length: 200 })
    );
}

#[test]
fn empty_secret_means_no_secret() {
    let request = subscription(&subscribe_with(&[("hub.secret", "")]));
    assert_eq!(request.secret, None);
}

#[test]
fn lease_seconds_must_be_a_positive_integer() {
    for bad in ["0", "000", "-1", "+5", "1.5", "ten", " 5", "5s", "1e3"] {
        assert!(
            matches!(
                parse_form(&subscribe_with(&[("hub.lease_seconds", bad)])),
                Err(ProtocolError::InvalidLeaseSeconds { .. })
            ),
            "{bad:?}"
        );
    }
    let request = subscription(&subscribe_with(&[("hub.lease_seconds", "007")]));
    assert_eq!(request.lease_seconds, Some(7));
    let request = subscription(&subscribe_with(&[(
        "hub.lease_seconds",
        "99999999999999999999999999",
    )]));
    assert_eq!(request.lease_seconds, Some(u64::MAX));
    let request = subscription(&subscribe_with(&[("hub.lease_seconds", "")]));
    assert_eq!(request.lease_seconds, None);
}

#[test]
fn single_valued_parameters_given_twice_are_refused() {
    let repeated: [(&'static str, &str); 5] = [
        ("hub.mode", "subscribe"),
        ("hub.topic", TOPIC_URL),
        ("hub.callback", CALLBACK_URL),
        ("hub.lease_seconds", "60"),
        ("hub.secret", "secret"),
    ];
    for (name, value) in repeated {
        assert_eq!(
            parse_form(&subscribe_with(&[(name, value), (name, value)])),
            Err(ProtocolError::Duplicate { name }),
            "{name}"
        );
    }
}

#[test]
fn body_that_is_not_utf8_is_malformed() {
    assert_eq!(
        parse_form(b"hub.mode=subscribe&hub.topic=%FF"),
        Err(ProtocolError::Malformed)
    );
    assert_eq!(parse_form(b"hub.mode=\xff"), Err(ProtocolError::Malformed));
    // A stray percent sign is not an escape and stays literal.
    let request = subscription(&subscribe_with(&[("hub.verify_token", "100%")]));
    assert_eq!(request.topic, TOPIC_URL);
}

#[test]
fn publish_collects_hub_url_and_hub_topic_in_order_without_duplicates() {
    let body = form(&[
        ("hub.mode", "publish"),
        ("hub.url", "https://a.example/1"),
        ("hub.topic", "https://a.example/2"),
        ("hub.url", "https://a.example/1"),
        ("hub.url", "https://a.example/3"),
        ("hub.topic", "https://a.example/%32"),
        ("hub.callback", "ignored"),
    ]);
    assert_eq!(
        publish(&body).topics,
        [
            "https://a.example/1",
            "https://a.example/2",
            "https://a.example/3"
        ]
    );
}

#[test]
fn publish_needs_a_valid_topic() {
    assert!(matches!(
        parse_form(&form(&[("hub.mode", "publish")])),
        Err(ProtocolError::MissingParameter { .. })
    ));
    assert!(matches!(
        parse_form(&form(&[("hub.mode", "publish"), ("hub.url", "")])),
        Err(ProtocolError::MissingParameter { .. })
    ));
    assert!(matches!(
        parse_form(&form(&[
            ("hub.mode", "publish"),
            ("hub.url", "https://a.example/1"),
            ("hub.topic", "file:///etc/passwd"),
        ])),
        Err(ProtocolError::InvalidUrl {
            name: "hub.topic",
            ..
        })
    ));
    assert!(matches!(
        parse_form(&form(&[("hub.mode", "publish"), ("hub.url", "nope")])),
        Err(ProtocolError::InvalidUrl {
            name: "hub.url",
            ..
        })
    ));
}

#[test]
fn a_single_topic_is_validated_like_hub_topic() {
    assert_eq!(
        parse_topic("https://a.example/%7Efeed").ok().as_deref(),
        Some("https://a.example/~feed")
    );
    assert!(matches!(
        parse_topic("ftp://a.example/"),
        Err(ProtocolError::InvalidUrl {
            name: "hub.topic",
            ..
        })
    ));
    assert_eq!(
        parse_topic(""),
        Err(ProtocolError::MissingParameter { name: "hub.topic" })
    );
}

#[test]
fn every_error_is_a_bad_request() {
    assert_eq!(
        ProtocolError::Malformed.status(),
        http::StatusCode::BAD_REQUEST
    );
    assert_eq!(
        ProtocolError::Duplicate { name: "hub.mode" }.status(),
        http::StatusCode::BAD_REQUEST
    );
}

#[test]
fn debug_output_hides_the_secret() {
    let request = subscription(&subscribe_with(&[("hub.secret", "hunter2")]));
    assert!(!format!("{request:?}").contains("hunter2"));
}

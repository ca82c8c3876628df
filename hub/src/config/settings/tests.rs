//! The settings layer's own tests, and the settings every test of a
//! layer above sets (`every_field_changed`, `assert_the_new_settings`).

use super::*;

#[test]
fn file_values_apply_and_unknown_keys_are_refused() {
    let file: Settings = toml::from_str(
        "listen = \"127.0.0.1:9000\"\nlease_default = \"1d\"\ndelivery_retries = 3\n",
    )
    .expect("parse");
    let mut config = HubConfig::default();
    file.apply(&mut config).expect("apply");
    assert_eq!(config.public_url.as_str(), "http://127.0.0.1:9000/");
    assert_eq!(config.lease.default, Duration::from_secs(86_400));
    assert_eq!(config.delivery.retry.max_retries, 3);
    assert!(toml::from_str::<Settings>("lease = 1").is_err());
}

/// A configuration with every field away from its default, and valid.
/// Written out in full (no `..`), so a new field must be added here.
/// The values the tests of the newer settings give, in the file and on
/// the command line alike.
pub(crate) fn assert_the_new_settings(config: &HubConfig) {
    assert_eq!(config.max_form_bytes, 1000);
    assert_eq!(config.max_content_bytes, 2000);
    assert_eq!(config.reaper_interval, Duration::from_secs(300));
    assert_eq!(config.verification.timeout, Duration::from_secs(3));
    assert_eq!(config.verification.concurrency, 11);
    assert_eq!(config.delivery.batch_size, 42);
    assert_eq!(config.header_read_timeout, Duration::from_secs(4));
    assert_eq!(config.idle_timeout, Duration::from_secs(20));
    assert_eq!(config.max_connections, 300);
}

/// A PEM file holding one CA certificate, written once per test
/// process in its scratch directory.
pub(crate) fn test_ca_file() -> PathBuf {
    static FILE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let mut params = rcgen::CertificateParams::new(Vec::new()).expect("CA parameters");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let key = rcgen::KeyPair::generate().expect("a CA key");
        let ca = params.self_signed(&key).expect("a CA certificate");
        let path = websub_storetest::scratch::path("ca.pem");
        std::fs::write(&path, ca.pem()).expect("write the test CA");
        path
    })
    .clone()
}

/// A PEM file of a self-signed client certificate and one of its key,
/// written once per test process in its scratch directory.
pub(crate) fn test_identity_files() -> (PathBuf, PathBuf) {
    static FILES: std::sync::OnceLock<(PathBuf, PathBuf)> = std::sync::OnceLock::new();
    FILES
        .get_or_init(|| {
            let certified = rcgen::generate_simple_self_signed(vec!["client".to_owned()])
                .expect("a client certificate");
            let cert = websub_storetest::scratch::path("client.pem");
            let key = websub_storetest::scratch::path("client-key.pem");
            std::fs::write(&cert, certified.cert.pem()).expect("write the certificate");
            std::fs::write(&key, certified.signing_key.serialize_pem()).expect("write the key");
            (cert, key)
        })
        .clone()
}

pub(crate) fn every_field_changed() -> HubConfig {
    HubConfig {
        listen: SocketAddr::from(([127, 0, 0, 2], 9001)),
        public_url: Url::parse("https://hub.example/websub/").expect("url"),
        database_url: "postgres://hub@db.example/events".to_owned(),
        store: Some("redis://cache.example/".to_owned()),
        lease: LeasePolicy {
            default: Duration::from_secs(2 * 86_400),
            min: Duration::from_secs(120),
            max: Duration::from_secs(30 * 86_400),
        },
        delivery: DeliveryPolicy {
            timeout: Duration::from_secs(7),
            retry: RetryPolicy {
                max_retries: 4,
                max_backoff: Duration::from_millis(2500),
            },
            concurrency: 100,
            per_host: 9,
            per_host_min: 3,
            per_host_rate: 50,
            idle_connections: 99,
            batch_size: 42,
            visibility_timeout: Duration::from_secs(90),
            disable_endpoint_after: 7,
            breaker: crate::config::BreakerPolicy {
                open_after: 7,
                disable_after: Duration::from_secs(3600),
            },
        },
        verification: VerificationPolicy {
            timeout: Duration::from_secs(3),
            concurrency: 11,
            attempts: 5,
            retry_wait: Duration::from_secs(2),
            max_pending: 77,
        },
        allow_private_network: true,
        extra_ca: Some(test_ca_file()),
        client_cert: Some(test_identity_files().0),
        client_key: Some(test_identity_files().1),
        internal_api_key: Some("an-internal-key-of-at-least-32-characters".to_owned()),
        publish_keys: vec![
            "a-publishing-key-of-at-least-32-characters".to_owned(),
            "another-publishing-key-of-32-characters-".to_owned(),
        ],
        operator_keys: vec!["an-operator-key-of-at-least-32-characters".to_owned()],
        metrics_keys: vec!["a-metrics-key-of-at-least-32-characters--".to_owned()],
        quota_api_key: Some("a-quota-key-of-at-least-32-characters----".to_owned()),
        internal_api_key_header: "X-Service-Key".to_owned(),
        max_form_bytes: 1000,
        max_content_bytes: 2000,
        header_read_timeout: Duration::from_secs(4),
        idle_timeout: Duration::from_secs(20),
        max_connections: 300,
        log_format: crate::config::LogFormat::Json,
        reaper_interval: Duration::from_secs(5 * 60),
        poll_interval: Duration::from_millis(200),
        retention: Some(Duration::from_secs(7 * 86_400)),
        user_token_key: Some("user-token-key".to_owned()),
        user_token_header: "X-User-Token".to_owned(),
        quota_url: Some(Url::parse("http://quota.example/api/").expect("url")),
        quota_timeout: Duration::from_millis(750),
        quota_type: "feeds".to_owned(),
        // Feeds come from the file alone; see the layering test.
        feeds: Vec::new(),
        operator_webhook: Some(Url::parse("https://ops.example/hooks/hub").expect("url")),
        operator_webhook_secret: Some("whsec_b3BlcmF0b3Itd2ViaG9vay1rZXk=".to_owned()),
        operator_webhook_previous_secret: Some("whsec_cHJldmlvdXMta2V5".to_owned()),
    }
}

#[test]
fn every_field_is_settable_from_the_file() {
    let expected = every_field_changed();
    expected
        .validate()
        .expect("the changed configuration is valid");
    let text = toml::to_string(&Settings::from(&expected)).expect("serialise");
    let file: Settings = toml::from_str(&text).expect("parse");
    let config = HubConfig::layered([file]).expect("valid");
    assert_eq!(format!("{config:?}"), format!("{expected:?}"), "{text}");
}

#[test]
fn the_new_settings_have_their_names_in_the_file() {
    let file: Settings = toml::from_str(
        "max_form_bytes = 1000\nmax_content_bytes = 2000\nreaper_interval = \"5m\"\n\
         verification_timeout = \"3s\"\nverification_concurrency = 11\n\
         delivery_batch_size = 42\nvisibility_timeout = \"90s\"\n\
         header_read_timeout = \"4s\"\nidle_timeout = \"20s\"\nmax_connections = 300\n",
    )
    .expect("parse");
    let config = HubConfig::layered([file]).expect("valid");
    assert_the_new_settings(&config);
    assert_eq!(config.delivery.visibility_timeout, Duration::from_secs(90));
}

#[test]
fn retention_is_on_by_default_and_none_keeps_everything() {
    assert_eq!(
        HubConfig::default().retention,
        Some(crate::config::DEFAULT_RETENTION)
    );
    let file: Settings = toml::from_str("retention = \"none\"").expect("parse");
    let config = HubConfig::layered([file]).expect("valid");
    assert_eq!(config.retention, None);
    // And back: a configuration that keeps everything says so.
    let text = toml::to_string(&Settings::from(&config)).expect("serialise");
    assert!(text.contains("retention = \"none\""), "{text}");
    let again =
        HubConfig::layered([toml::from_str::<Settings>(&text).expect("parse")]).expect("valid");
    assert_eq!(again.retention, None);
    let file: Settings = toml::from_str("retention = \"2h\"").expect("parse");
    let config = HubConfig::layered([file]).expect("valid");
    assert_eq!(config.retention, Some(Duration::from_secs(7200)));
}

#[test]
fn a_later_listen_address_keeps_a_public_url_named_below() {
    let file: Settings = toml::from_str("public_url = \"https://hub.example/\"").expect("parse");
    let flags = Settings {
        listen: Some(SocketAddr::from(([0, 0, 0, 0], 9000))),
        ..Settings::default()
    };
    let config = HubConfig::layered([file, flags]).expect("valid");
    assert_eq!(config.public_url.as_str(), "https://hub.example/");

    let flags = Settings {
        listen: Some(SocketAddr::from(([0, 0, 0, 0], 9000))),
        ..Settings::default()
    };
    let config = HubConfig::layered([Settings::default(), flags]).expect("valid");
    assert_eq!(config.public_url.as_str(), "http://127.0.0.1:9000/");
}

#[test]
fn a_bad_file_value_names_its_setting() {
    for (text, setting) in [
        ("verification_timeout = \"soon\"", "verification-timeout"),
        ("reaper_interval = \"0s\"", "reaper-interval"),
        ("delivery_batch_size = 0", "delivery-batch-size"),
        ("max_form_bytes = 0", "max-form-bytes"),
        ("header_read_timeout = \"0s\"", "header-read-timeout"),
        ("idle_timeout = \"never\"", "idle-timeout"),
        ("max_connections = 0", "max-connections"),
        ("quota_url = \"not a url\"", "quota-url"),
        ("extra_ca = \"/nonexistent/ca.pem\"", "extra-ca"),
        ("client_cert = \"/nonexistent/client.pem\"", "client-cert"),
        ("client_key = \"/nonexistent/key.pem\"", "client-key"),
        (
            "client_cert = \"/nonexistent/client.pem\"\n\
             client_key = \"/nonexistent/key.pem\"",
            "client-cert",
        ),
        ("operator_webhook = \"not a url\"", "operator-webhook"),
        (
            "operator_webhook = \"https://ops.example/\"",
            "operator-webhook",
        ),
        (
            "operator_webhook = \"https://ops.example/\"\n\
             operator_webhook_secret = \"plain\"",
            "operator-webhook-secret",
        ),
        (
            "operator_webhook_secret = \"whsec_a2V5\"",
            "operator-webhook-secret",
        ),
        (
            "operator_webhook_previous_secret = \"whsec_a2V5\"",
            "operator-webhook-previous-secret",
        ),
        (
            "operator_webhook = \"https://ops.example/\"\n\
             operator_webhook_secret = \"whsec_a2V5\"\n\
             operator_webhook_previous_secret = \"plain\"",
            "operator-webhook-previous-secret",
        ),
    ] {
        let file: Settings = toml::from_str(text).expect("parse");
        match HubConfig::layered([file]) {
            Err(ConfigError::Invalid { setting: named, .. }) => {
                assert_eq!(named, setting, "{text}");
            }
            other => panic!("{text}: {other:?}"),
        }
    }
    let wrong_type =
        toml::from_str::<Settings>("delivery_batch_size = \"many\"").expect_err("not a number");
    assert!(
        wrong_type.to_string().contains("delivery_batch_size"),
        "{wrong_type}"
    );
}

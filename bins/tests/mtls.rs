//! Client certificates (mTLS) against the real `websubd`: a callback that
//! requires one from its own CA is verified and delivered to by a hub
//! showing one (`--client-cert`, `--client-key`), and refuses a hub showing
//! none or one from another CA; an outbox webhook is shown the feed's
//! certificate, or the one its webhooks file names in place of it; and a
//! certificate or
//! key that cannot be used stops the hub at start, naming the setting and
//! the file.
//!
//! The receivers are the HTTPS server the TLS tests use (`https.rs`, by way
//! of the `tls` module), here with a configuration that requires a client
//! certificate.

use crate::common;
use crate::tls::https;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::RawQuery;
use axum::http::StatusCode;
use axum::routing::get;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use common::{Websubd, free_port, scratch_dir};
use https::{Connections, HttpsServer};
use websub_tests::{INTERNAL_KEY, http_client};

const WAIT: Duration = Duration::from_secs(20);

/// A certificate authority made for one test.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        Self {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().expect("a key"))
                .expect("a CA"),
        }
    }

    /// A certificate for `names` signed by this CA, for `purpose`: its
    /// chain (leaf, then the CA) and key, as PEM.
    fn issue(&self, names: &[&str], purpose: ExtendedKeyUsagePurpose) -> (String, String) {
        let key = KeyPair::generate().expect("a key");
        let mut params = CertificateParams::new(
            names
                .iter()
                .map(|name| (*name).to_owned())
                .collect::<Vec<_>>(),
        )
        .expect("parameters");
        params.distinguished_name.push(DnType::CommonName, names[0]);
        params.extended_key_usages = vec![purpose];
        let certificate = params.signed_by(&key, &self.issuer).expect("signed");
        (
            format!("{}{}", certificate.pem(), self.issuer.pem()),
            key.serialize_pem(),
        )
    }

    /// Writes a client certificate and key of this CA into `dir`; their
    /// paths.
    fn client_files(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let (chain, key) = self.issue(&[name], ExtendedKeyUsagePurpose::ClientAuth);
        let cert_path = dir.join(format!("{name}.pem"));
        let key_path = dir.join(format!("{name}-key.pem"));
        std::fs::write(&cert_path, chain).expect("write the certificate");
        std::fs::write(&key_path, key).expect("write the key");
        (cert_path, key_path)
    }

    /// A server configuration for 127.0.0.1 signed by this CA that requires
    /// a client certificate issued by `clients`.
    fn server_requiring(&self, clients: &Ca) -> Arc<rustls::ServerConfig> {
        let (chain, key) = self.issue(&["127.0.0.1"], ExtendedKeyUsagePurpose::ServerAuth);
        let chain: Vec<CertificateDer<'static>> =
            rustls::pki_types::pem::PemObject::pem_slice_iter(chain.as_bytes())
                .collect::<Result<_, _>>()
                .expect("the chain");
        let key: PrivateKeyDer<'static> = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
            rustls::pki_types::pem::PemObject::from_pem_slice(key.as_bytes())
                .map(|key: PrivatePkcs8KeyDer<'static>| key.secret_pkcs8_der().to_vec())
                .expect("the key"),
        ));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(clients.issuer.der().clone())
            .expect("the client CA");
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.into(),
            provider.clone(),
        )
        .build()
        .expect("a client verifier");
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .expect("a server configuration");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }
}

/// What the receiver was sent: verification challenges answered, and
/// deliveries.
#[derive(Default)]
struct Seen {
    verifications: usize,
    deliveries: Vec<Bytes>,
}

/// An HTTPS receiver at `/callback` that requires a client certificate:
/// it answers verifications with their challenge and deliveries with 204.
struct Receiver {
    address: std::net::SocketAddr,
    server: HttpsServer,
    seen: Arc<Mutex<Seen>>,
}

impl Receiver {
    async fn start(config: Arc<rustls::ServerConfig>) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (on_get, on_post) = (seen.clone(), seen.clone());
        let app = Router::new().route(
            "/callback",
            get(move |RawQuery(query): RawQuery| {
                let seen = on_get.clone();
                async move {
                    let challenge = query
                        .as_deref()
                        .unwrap_or("")
                        .split('&')
                        .find_map(|pair| pair.strip_prefix("hub.challenge="))
                        .unwrap_or("")
                        .to_owned();
                    lock(&seen).verifications += 1;
                    (StatusCode::OK, challenge)
                }
            })
            .post(move |body: Bytes| {
                let seen = on_post.clone();
                async move {
                    lock(&seen).deliveries.push(body);
                    StatusCode::NO_CONTENT
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the receiver");
        let address = listener.local_addr().expect("its address");
        let server = HttpsServer::serve(listener, app, config, Connections::KeepAlive)
            .expect("serve over TLS");
        Self {
            address,
            server,
            seen,
        }
    }

    fn url(&self) -> String {
        format!("https://{}/callback", self.address)
    }

    fn verifications(&self) -> usize {
        lock(&self.seen).verifications
    }

    fn deliveries(&self) -> usize {
        lock(&self.seen).deliveries.len()
    }
}

fn lock(seen: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn wait_for(what: &str, condition: impl Fn() -> bool) {
    let start = Instant::now();
    while !condition() {
        assert!(start.elapsed() < WAIT, "waited {WAIT:?} for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Subscribes `callback` to `topic` through `POST /`; the status.
/// A hub on SQLite in `dir` trusting `server_ca`, with `extra` arguments.
async fn start_hub(dir: &Path, server_ca: &Ca, extra: &[&str]) -> Websubd {
    let ca_file = dir.join("server-ca.pem");
    std::fs::write(&ca_file, server_ca.issuer.pem()).expect("write the CA");
    let database = format!("sqlite:{}", dir.join("hub.db").display());
    let ca_file = ca_file.display().to_string();
    let mut arguments = vec!["--extra-ca", &ca_file, "--verification-attempts", "1"];
    arguments.extend_from_slice(extra);
    Websubd::on_database(&dir.to_path_buf(), &database, &arguments).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callback_requiring_a_client_certificate_gets_the_hubs_and_refuses_others() {
    websub_hub::delivery::net::install_crypto_provider();
    let server_ca = Ca::new("callback servers");
    let client_ca = Ca::new("the receiver's clients");
    let stranger_ca = Ca::new("someone else");
    let receiver = Receiver::start(server_ca.server_requiring(&client_ca)).await;

    // Without a certificate, and with one the receiver does not trust: the
    // handshake fails, so the verification never reaches it and nothing is
    // subscribed.
    let dir = scratch_dir("mtls-refused");
    let (stranger_cert, stranger_key) = stranger_ca.client_files(&dir, "stranger");
    let (stranger_cert, stranger_key) = (
        stranger_cert.display().to_string(),
        stranger_key.display().to_string(),
    );
    for (case, extra) in [
        ("no certificate", vec![]),
        (
            "a certificate of another CA",
            vec![
                "--client-cert",
                stranger_cert.as_str(),
                "--client-key",
                stranger_key.as_str(),
            ],
        ),
    ] {
        let hub = start_hub(&dir, &server_ca, &extra).await;
        let topic = format!("http://127.0.0.1:9/refused/{}", case.len());
        assert_eq!(hub.subscribe(&topic, &receiver.url()).await, 202, "{case}");
        let failed = || async {
            http_client()
                .get(format!(
                    "{}api/v1/operator/verifications?state=failed",
                    hub.url
                ))
                .header("X-Internal-API-Key", INTERNAL_KEY)
                .send()
                .await
                .expect("list verifications")
                .json::<serde_json::Value>()
                .await
                .expect("JSON")
        };
        let start = Instant::now();
        loop {
            let listed = failed().await;
            if listed
                .as_array()
                .is_some_and(|failed| failed.iter().any(|one| one["topic"] == topic.as_str()))
            {
                break;
            }
            assert!(
                start.elapsed() < WAIT,
                "{case}: the verification never failed: {listed}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(receiver.verifications(), 0, "{case}: nothing got through");
        drop(hub);
    }
    assert!(
        receiver.server.handshakes.failed() >= 2,
        "the receiver refused them"
    );

    // With the certificate of its CA: verified, then delivered to.
    let dir = scratch_dir("mtls-accepted");
    let (cert, key) = client_ca.client_files(&dir, "hub");
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let hub = start_hub(
        &dir,
        &server_ca,
        &["--client-cert", &cert, "--client-key", &key],
    )
    .await;
    let topic = "http://127.0.0.1:9/accepted";
    assert_eq!(hub.subscribe(topic, &receiver.url()).await, 202);
    wait_for("the verification", || receiver.verifications() == 1).await;
    // The subscription is saved just after the verification's answer.
    let start = Instant::now();
    loop {
        let found = http_client()
            .get(format!(
                "{}api/v1/operator/subscription?{}",
                hub.url,
                serde_urlencoded::to_string([("topic", topic), ("callback", &receiver.url())])
                    .expect("a query")
            ))
            .header("X-Internal-API-Key", INTERNAL_KEY)
            .send()
            .await
            .expect("look the subscription up")
            .status();
        if found == 200 {
            break;
        }
        assert!(start.elapsed() < WAIT, "never subscribed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(hub.fat_ping(topic, "{\"over\":\"mTLS\"}").await, 202);
    wait_for("a delivery over mTLS", || receiver.deliveries() >= 1).await;
}

#[test]
fn a_client_certificate_that_cannot_be_used_stops_the_hub_naming_it() {
    let dir = scratch_dir("mtls-bad-files");
    let ca = Ca::new("bad files");
    let (cert, key) = ca.client_files(&dir, "good");
    let (_, other_key) = ca.client_files(&dir, "other");
    let not_pem = dir.join("not.pem");
    std::fs::write(&not_pem, "not a certificate").expect("write");
    let missing = dir.join("missing.pem");
    for (arguments, named, file) in [
        (
            vec!["--client-cert", path(&missing), "--client-key", path(&key)],
            "client-cert",
            &missing,
        ),
        (
            vec!["--client-cert", path(&not_pem), "--client-key", path(&key)],
            "client-cert",
            &not_pem,
        ),
        (
            vec!["--client-cert", path(&cert), "--client-key", path(&not_pem)],
            "client-key",
            &not_pem,
        ),
        (
            vec![
                "--client-cert",
                path(&cert),
                "--client-key",
                path(&other_key),
            ],
            "client-key",
            &other_key,
        ),
        (vec!["--client-cert", path(&cert)], "client-cert", &cert),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_websubd"))
            .current_dir(&dir)
            .args(&arguments)
            .output()
            .expect("run websubd");
        assert_eq!(output.status.code(), Some(2), "{arguments:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(named), "{arguments:?}: {stderr}");
        assert!(
            stderr.contains(&file.display().to_string()),
            "{arguments:?}: {stderr}"
        );
    }
}

fn path(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_webhooks_are_shown_the_feeds_certificate_or_their_own() {
    websub_hub::delivery::net::install_crypto_provider();
    let Some(shop) = crate::feeds::Shop::open().await else {
        return;
    };
    let server_ca = Ca::new("webhook servers");
    let client_ca = Ca::new("the webhooks' clients");
    let stranger_ca = Ca::new("another PKI");
    let by_feed = Receiver::start(server_ca.server_requiring(&client_ca)).await;
    let by_own = Receiver::start(server_ca.server_requiring(&client_ca)).await;
    let dir = scratch_dir("mtls-webhooks");
    let (feed_cert, feed_key) = client_ca.client_files(&dir, "feed");
    // Relative to the webhooks file, which is in `dir`.
    stranger_ca.client_files(&dir, "own");
    let webhooks = dir.join("webhooks.toml");
    std::fs::write(
        &webhooks,
        format!(
            "[[webhook]]\nevent = \"{event}\"\nsubscriber = \"by-feed\"\nurl = \"{feed_url}\"\n\n\
             [[webhook]]\nevent = \"{event}\"\nsubscriber = \"by-own\"\nurl = \"{own_url}\"\n\
             client_cert = \"own.pem\"\nclient_key = \"own-key.pem\"\n",
            event = crate::feeds::EVENT_NAME,
            feed_url = by_feed.url(),
            own_url = by_own.url(),
        ),
    )
    .expect("write the webhooks file");
    let ca_file = dir.join("server-ca.pem");
    std::fs::write(&ca_file, server_ca.issuer.pem()).expect("write the CA");
    let config = dir.join("websubd.toml");
    std::fs::write(
        &config,
        format!(
            "allow_private_network = true\nextra_ca = \"{ca}\"\n\n[[feed]]\n\
             database_url = \"{url}\"\noutbox_table = \"shop.outbox\"\n\
             deliveries_table = \"shop.outbox_deliveries\"\nwebhooks_file = \"{webhooks}\"\n\
             poll_interval = \"200ms\"\ndelivery_retries = 1\ndelivery_max_backoff = \"100ms\"\n\
             client_cert = \"{cert}\"\nclient_key = \"{key}\"\n",
            ca = ca_file.display(),
            url = shop.url,
            webhooks = webhooks.display(),
            cert = feed_cert.display(),
            key = feed_key.display(),
        ),
    )
    .expect("write the configuration");
    let database = format!("sqlite:{}", dir.join("hub.db").display());
    let config = config.display().to_string();
    let _hub = Websubd::spawn(
        &dir,
        free_port(),
        &["--config", &config, "--database-url", &database],
    )
    .ready()
    .await;
    shop.produce(0..3).await;
    wait_for("the feed's certificate accepted", || {
        by_feed.deliveries() == 3
    })
    .await;
    wait_for("the webhook's own certificate refused", || {
        by_own.server.handshakes.failed() >= 2
    })
    .await;
    assert_eq!(
        by_own.deliveries(),
        0,
        "another CA's certificate got nothing through"
    );
}

//! The one builder of outgoing reqwest clients, and of the TLS
//! configuration of the callbacks' own clients ([`direct`](crate::direct)):
//! pools, timeouts, TLS, the user agent, redirects, and the network policy
//! on every client that contacts a URL someone else chose. Nothing else in
//! the crate builds a `reqwest::Client`.
//!
//! TLS is rustls on the process's crypto provider (ring), verifying with the
//! system's roots plus the extra CA certificates of a [`Trust`] (`--extra-ca`
//! for `websubd`), and showing its [`ClientIdentity`], when it has one, to
//! servers that ask for a client certificate (mTLS). Each client resumes TLS sessions from an in-memory cache
//! of its own, sized for how many hosts it talks to, and keeps connections
//! alive per host, so a callback host is handshaken with once per pooled
//! connection, and in full only once while its tickets last.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::client::Resumption;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, OtherError, SignatureScheme};

use crate::net::{
    MAX_FETCH_REDIRECTS, NetError, NetPolicy, PolicyResolver, install_crypto_provider,
};

/// How long an idle pooled connection is kept.
pub(crate) const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Hosts whose TLS sessions the clients of callbacks and topics remember.
/// rustls's default remembers 32 (its 256 "sessions" are tickets, 8 kept
/// per host), too few for a hub whose subscribers sit on many hosts: past
/// it, the host seen least recently is handshaken in full again. A host
/// holds at most 8 tickets of a few hundred bytes to a few KiB (the
/// ticket, its secret, the server's chain), so 1 024 hosts cost a few MiB
/// at most.
const SESSION_CACHE_HOSTS: usize = 1024;

/// The TLS 1.3 tickets rustls keeps per host, the unit its cache is sized in.
const TICKETS_PER_HOST: usize = 8;

/// Which roots a client trusts: the system's, plus extra CA certificates
/// (a private PKI, a test CA); and the certificate it shows a server that
/// asks for one. [`Trust::default`] is the system's roots alone, and no
/// certificate. Cheap to clone.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Trust {
    extra_roots: Arc<[CertificateDer<'static>]>,
    identity: Option<ClientIdentity>,
}

/// A client certificate (with the chain up to its issuer) and its private
/// key, shown to servers that ask for one. Cheap to clone.
#[derive(Clone)]
pub struct ClientIdentity {
    chain: Arc<[CertificateDer<'static>]>,
    key: Arc<PrivateKeyDer<'static>>,
}

impl PartialEq for ClientIdentity {
    fn eq(&self, other: &Self) -> bool {
        self.chain == other.chain && self.key == other.key
    }
}

impl Eq for ClientIdentity {}

// The key stays out of logs.
impl fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientIdentity")
            .field("certificates", &self.chain.len())
            .finish_non_exhaustive()
    }
}

/// Why a client certificate and key cannot be used. The text completes a
/// sentence that starts with the file's name.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// A file could not be read (missing, a directory, not permitted).
    #[error("cannot be read: {cause}")]
    Unreadable {
        /// What the file system said.
        cause: std::io::Error,
    },
    /// The certificate file holds no certificate.
    #[error("holds no certificate (no -----BEGIN CERTIFICATE----- block)")]
    NoCertificate,
    /// The key file holds no private key.
    #[error("holds no private key (PKCS#8, PKCS#1 or SEC1 PEM)")]
    NoKey,
    /// A PEM block is malformed.
    #[error("is not valid PEM: {reason}")]
    NotPem {
        /// What the PEM parser said.
        reason: String,
    },
    /// The key is not one TLS can sign with, or not the certificate's.
    #[error("does not go with the certificate, or cannot sign: {reason}")]
    Unusable {
        /// What rustls said.
        reason: String,
    },
}

/// Which of a [`ClientIdentity`]'s two files a fault is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentityFile {
    /// The certificate (chain) file.
    Certificate,
    /// The private key file.
    Key,
}

impl ClientIdentity {
    /// The certificate chain in the PEM file `certificate` (the client's
    /// first, then any intermediates) and the private key in the PEM file
    /// `key`; a fault names which file it is in.
    pub fn from_pem_files(
        certificate: &Path,
        key: &Path,
    ) -> Result<Self, (IdentityFile, IdentityError)> {
        let read = |path: &Path, file| {
            std::fs::read(path).map_err(|cause| (file, IdentityError::Unreadable { cause }))
        };
        let chain_pem = read(certificate, IdentityFile::Certificate)?;
        let key_pem = read(key, IdentityFile::Key)?;
        Self::from_pem(&chain_pem, &key_pem)
    }

    /// The certificate chain in `chain_pem` and the key in `key_pem`.
    pub fn from_pem(
        chain_pem: &[u8],
        key_pem: &[u8],
    ) -> Result<Self, (IdentityFile, IdentityError)> {
        let chain = CertificateDer::pem_slice_iter(chain_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| {
                (
                    IdentityFile::Certificate,
                    IdentityError::NotPem {
                        reason: error.to_string(),
                    },
                )
            })?;
        if chain.is_empty() {
            return Err((IdentityFile::Certificate, IdentityError::NoCertificate));
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|error| {
            let fault = match error {
                rustls::pki_types::pem::Error::NoItemsFound => IdentityError::NoKey,
                other => IdentityError::NotPem {
                    reason: other.to_string(),
                },
            };
            (IdentityFile::Key, fault)
        })?;
        install_crypto_provider();
        let provider = rustls::crypto::CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
        rustls::sign::CertifiedKey::from_der(chain.clone(), key.clone_key(), &provider).map_err(
            |error| {
                (
                    IdentityFile::Key,
                    IdentityError::Unusable {
                        reason: error.to_string(),
                    },
                )
            },
        )?;
        Ok(Self {
            chain: chain.into(),
            key: Arc::new(key),
        })
    }
}

/// Why extra CA certificates cannot be trusted. The text completes a
/// sentence that starts with the file's name.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrustError {
    /// The file could not be read (missing, a directory, not permitted).
    #[error("cannot be read: {cause}")]
    Unreadable {
        /// What the file system said.
        cause: std::io::Error,
    },
    /// A `CERTIFICATE` block is malformed.
    #[error("is not valid PEM: {reason}")]
    NotPem {
        /// What the PEM parser said.
        reason: String,
    },
    /// No `-----BEGIN CERTIFICATE-----` block in it.
    #[error("holds no certificate (no -----BEGIN CERTIFICATE----- block)")]
    NoCertificate,
    /// A certificate that cannot be a root (not X.509, no usable key).
    #[error("certificate {number} cannot be a trusted root: {reason}")]
    NotARoot {
        /// Its place in the file, from 1.
        number: usize,
        /// What rustls said.
        reason: String,
    },
}

impl Trust {
    /// The system's roots alone.
    pub fn system() -> Self {
        Self::default()
    }

    /// The system's roots and `roots`, each checked to be usable as a
    /// trust anchor.
    pub fn with_extra_roots(
        roots: impl IntoIterator<Item = CertificateDer<'static>>,
    ) -> Result<Self, TrustError> {
        let roots: Vec<CertificateDer<'static>> = roots.into_iter().collect();
        let mut store = rustls::RootCertStore::empty();
        for (index, root) in roots.iter().enumerate() {
            store
                .add(root.clone())
                .map_err(|error| TrustError::NotARoot {
                    number: index + 1,
                    reason: error.to_string(),
                })?;
        }
        Ok(Self {
            extra_roots: roots.into(),
            identity: None,
        })
    }

    /// The same roots, showing `identity` (none: no certificate) to
    /// servers that ask for a client certificate.
    pub fn with_identity(mut self, identity: Option<ClientIdentity>) -> Self {
        self.identity = identity;
        self
    }

    /// The certificate shown to servers that ask for one.
    pub fn identity(&self) -> Option<&ClientIdentity> {
        self.identity.as_ref()
    }

    /// The system's roots and every certificate of the PEM file at `path`
    /// (one or more; other blocks, such as keys, are ignored).
    pub fn from_pem_file(path: &Path) -> Result<Self, TrustError> {
        let pem = std::fs::read(path).map_err(|cause| TrustError::Unreadable { cause })?;
        Self::from_pem(&pem)
    }

    /// The system's roots and every certificate of `pem`.
    pub fn from_pem(pem: &[u8]) -> Result<Self, TrustError> {
        let roots = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| TrustError::NotPem {
                reason: error.to_string(),
            })?;
        if roots.is_empty() {
            return Err(TrustError::NoCertificate);
        }
        Self::with_extra_roots(roots)
    }

    /// The extra roots, in the order given.
    pub fn extra_roots(&self) -> &[CertificateDer<'static>] {
        &self.extra_roots
    }
}

// Certificates are long; their count says what matters in a log line.
impl fmt::Debug for Trust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Trust")
            .field("extra_roots", &self.extra_roots.len())
            .field("identity", &self.identity)
            .finish()
    }
}

/// What an outgoing client is for, and so how it is built.
#[derive(Debug, Clone)]
pub enum Purpose {
    /// Outbox webhooks (WebSub callbacks have clients of their own, on the
    /// same settings: [`HostClients`](crate::pool::HostClients)): the
    /// network policy applies, redirects are never followed (a
    /// redirect is a failed attempt), HTTP/1.1 with up to
    /// `max_idle_per_host` keep-alive connections per host.
    Deliveries {
        /// Which addresses may be contacted.
        policy: NetPolicy,
        /// Keep-alive connections kept per host.
        max_idle_per_host: usize,
    },
    /// Topic fetches: the network policy applies, and at most
    /// [`MAX_FETCH_REDIRECTS`] redirects are followed, each hop checked.
    TopicFetches {
        /// Which addresses may be contacted.
        policy: NetPolicy,
    },
    /// A service the operator configured for the hub itself (the
    /// subscriptions service of the quota): it may live on a private
    /// network, so the policy does not apply; no proxy and no redirects, so
    /// the credentials sent reach that service and nothing in between.
    OperatorService,
}

/// Builds the client for `purpose`, with `timeout` for connecting and for a
/// whole exchange, trusting the roots of `trust`.
///
/// Request paths with a policy call [`NetPolicy::check_literal`] on each URL
/// first: IP literals never reach the resolver that filters names.
pub fn build(
    purpose: Purpose,
    timeout: Duration,
    trust: &Trust,
) -> Result<reqwest::Client, NetError> {
    install_crypto_provider();
    let builder = match purpose {
        Purpose::Deliveries {
            policy,
            max_idle_per_host,
        } => {
            let tls = tls_config(trust, &[b"http/1.1"], SESSION_CACHE_HOSTS)?;
            return callback_client(&policy, timeout, tls, max_idle_per_host);
        }
        Purpose::TopicFetches { policy } => {
            let hops = policy.clone();
            let redirects = reqwest::redirect::Policy::custom(move |attempt| {
                if attempt.previous().len() > MAX_FETCH_REDIRECTS {
                    attempt.error(NetError::TooManyRedirects)
                } else if let Err(refused) = hops.check_literal(attempt.url()) {
                    attempt.error(refused)
                } else {
                    attempt.follow()
                }
            });
            common(timeout)
                .tls_backend_preconfigured(tls_config(
                    trust,
                    &[b"h2", b"http/1.1"],
                    SESSION_CACHE_HOSTS,
                )?)
                .dns_resolver(Arc::new(PolicyResolver { policy }))
                .redirect(redirects)
        }
        // One host: rustls's default cache is plenty.
        Purpose::OperatorService => common(timeout)
            .tls_backend_preconfigured(tls_config(trust, &[b"h2", b"http/1.1"], 32)?)
            .redirect(reqwest::redirect::Policy::none()),
    };
    builder.build().map_err(NetError::Client)
}

/// The client traces are exported with (`crate::traces`): a
/// blocking one, run on the exporter's own thread, never on the runtime
/// deliveries share; the collector is the operator's, so neither the
/// network policy nor redirects apply.
pub fn collector_client(
    timeout: Duration,
    trust: &Trust,
) -> Result<reqwest::blocking::Client, NetError> {
    install_crypto_provider();
    reqwest::blocking::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .no_proxy()
        .user_agent(crate::direct::USER_AGENT)
        .tls_backend_preconfigured(tls_config(trust, &[b"http/1.1"], 4)?)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(NetError::Client)
}

/// What every client has: the timeouts, no proxy, the user agent.
fn common(timeout: Duration) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        // A proxy would connect on our behalf and bypass the resolver.
        .no_proxy()
        .user_agent(crate::direct::USER_AGENT)
}

/// A client of [`Purpose::Deliveries`] on the TLS configuration `tls`
/// (from [`callback_tls`]): clones of one configuration share its roots and
/// its session cache, so many such clients cost no more handshakes than one.
pub(crate) fn callback_client(
    policy: &NetPolicy,
    timeout: Duration,
    tls: rustls::ClientConfig,
    max_idle_per_host: usize,
) -> Result<reqwest::Client, NetError> {
    common(timeout)
        .tls_backend_preconfigured(tls)
        .dns_resolver(Arc::new(PolicyResolver {
            policy: policy.clone(),
        }))
        .redirect(reqwest::redirect::Policy::none())
        .http1_only()
        .pool_max_idle_per_host(max_idle_per_host)
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .tcp_nodelay(true)
        .build()
        .map_err(NetError::Client)
}

/// The TLS configuration of [`Purpose::Deliveries`] clients trusting
/// `trust`, for [`callback_client`].
pub(crate) fn callback_tls(trust: &Trust) -> Result<rustls::ClientConfig, NetError> {
    install_crypto_provider();
    tls_config(trust, &[b"http/1.1"], SESSION_CACHE_HOSTS)
}

/// The rustls configuration of one client: the system's roots and
/// `trust`'s, `alpn` offered (what the client's HTTP versions can speak, as
/// reqwest would offer), and sessions resumed from a cache of `hosts`
/// hosts. Built here rather than by reqwest because reqwest leaves the
/// session cache at rustls's default; everything else is as reqwest sets
/// it (TLS 1.2 and 1.3, SNI on).
fn tls_config(
    trust: &Trust,
    alpn: &[&[u8]],
    hosts: usize,
) -> Result<rustls::ClientConfig, NetError> {
    let provider = rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
    let verifier = if trust.extra_roots.is_empty() {
        rustls_platform_verifier::Verifier::new(provider.clone())
    } else {
        rustls_platform_verifier::Verifier::new_with_extra_roots(
            trust.extra_roots.iter().cloned(),
            provider.clone(),
        )
    }
    .map_err(NetError::Tls)?;
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(NetError::Tls)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Explained(verifier)));
    let mut config = match &trust.identity {
        None => builder.with_no_client_auth(),
        Some(identity) => builder
            .with_client_auth_cert(identity.chain.to_vec(), identity.key.clone_key())
            .map_err(NetError::Tls)?,
    };
    config.alpn_protocols = alpn.iter().map(|protocol| protocol.to_vec()).collect();
    config.resumption = Resumption::in_memory_sessions(hosts * TICKETS_PER_HOST);
    Ok(config)
}

/// The platform verifier, with a certificate from an unknown issuer
/// explained: rustls words it `invalid peer certificate: UnknownIssuer`,
/// which a subscriber reading its failed verification, or an operator
/// reading the log, may not take for "the hub does not trust who signed
/// this". rustls prints its own certificate errors' causes in their debug
/// form, so the explanation travels as `Error::Other`, whose text it
/// prints as given. The price is the alert the server receives:
/// `handshake_failure` rather than `unknown_ca`.
#[derive(Debug)]
struct Explained(rustls_platform_verifier::Verifier);

/// The reason a certificate from an unknown issuer is refused.
#[derive(Debug, thiserror::Error)]
#[error(
    "the certificate is not trusted (UnknownIssuer): it is not issued by a root the hub trusts \
     (the system's, or an extra CA certificate)"
)]
struct NotTrusted;

impl ServerCertVerifier for Explained {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
            .map_err(|error| match error {
                rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
                    rustls::Error::Other(OtherError(Arc::new(NotTrusted)))
                }
                other => other,
            })
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// The client of deliveries and verifications under `policy`, trusting the
/// system's roots: see [`Purpose::Deliveries`].
pub fn for_deliveries(
    policy: &NetPolicy,
    timeout: Duration,
    max_idle_per_host: usize,
) -> Result<reqwest::Client, NetError> {
    let purpose = Purpose::Deliveries {
        policy: policy.clone(),
        max_idle_per_host,
    };
    build(purpose, timeout, &Trust::system())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const DENY: NetPolicy = NetPolicy {
        allow_private_network: false,
    };

    /// A self-signed CA certificate (P-256, valid until 2126), for tests
    /// that need a root the parser accepts; nothing is ever signed with it.
    pub(crate) const TEST_CA_PEM: &str = "-----BEGIN CERTIFICATE-----
MIIBkDCCATegAwIBAgIUToG7SM/On4kGjzf4ciBf222HuDMwCgYIKoZIzj0EAwIw
HTEbMBkGA1UEAwwSd2Vic3ViLWh1YiB0ZXN0IENBMCAXDTI2MTIwMTIyMzQ1NloY
DzIxMjYxMTA3MjIzNDU2WjAdMRswGQYDVQQDDBJ3ZWJzdWItaHViIHRlc3QgQ0Ew
WTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAARLp8wRr9jHF6z8PQBX8SfrZ1VrKER/
UYBi1RnLOZ6uUd4362rsgwELm6FBtqfoArTahdnsmxZ7fTu7zyiVAVzwo1MwUTAd
BgNVHQ4EFgQUZjmY9oMmpmUp1cHlRmIbkJHS5X4wHwYDVR0jBBgwFoAUZjmY9oMm
pmUp1cHlRmIbkJHS5X4wDwYDVR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNHADBE
AiBzjCyvv2wnhobOLuRlGuTyJ8KWuZSL0hQ3ODdjkxZTEQIgas6r16z2xbIfvIXX
jT6JIGI+hsX9t8NyBp85XueJYKk=
-----END CERTIFICATE-----
";

    #[tokio::test]
    async fn clients_refuse_loopback_names_at_connect_time() {
        let purpose = Purpose::Deliveries {
            policy: DENY,
            max_idle_per_host: 1,
        };
        let client = build(purpose, Duration::from_secs(2), &Trust::system()).expect("client");
        // Nothing listens here; the refusal comes before any connection.
        let error = client
            .get("http://localhost:9/")
            .send()
            .await
            .err()
            .unwrap_or_else(|| panic!("a loopback name was contacted"));
        assert!(error.is_connect(), "{error:?}");
        let source_chain = std::iter::successors(
            Some(&error as &(dyn std::error::Error + 'static)),
            |error| error.source(),
        );
        assert!(
            source_chain
                .filter_map(|error| error.downcast_ref::<NetError>())
                .any(|error| matches!(error, NetError::NonPublicAddress { .. })),
            "{error:?}"
        );
        let _ = build(
            Purpose::TopicFetches { policy: DENY },
            Duration::from_secs(2),
            &Trust::system(),
        )
        .expect("client");
    }

    #[test]
    fn extra_roots_come_from_every_certificate_block_and_nothing_else() {
        let pem = format!(
            "a comment\n{TEST_CA_PEM}-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n{TEST_CA_PEM}"
        );
        let trust = Trust::from_pem(pem.as_bytes()).expect("two roots");
        assert_eq!(trust.extra_roots().len(), 2);
        assert_eq!(
            format!("{trust:?}"),
            "Trust { extra_roots: 2, identity: None }"
        );
        for purpose in [
            Purpose::Deliveries {
                policy: DENY,
                max_idle_per_host: 1,
            },
            Purpose::TopicFetches { policy: DENY },
            Purpose::OperatorService,
        ] {
            build(purpose, Duration::from_secs(2), &trust).expect("a client trusting them");
        }
    }

    #[test]
    fn unusable_extra_roots_say_why() {
        assert!(matches!(
            Trust::from_pem(b"no PEM at all"),
            Err(TrustError::NoCertificate)
        ));
        let truncated = &TEST_CA_PEM[..TEST_CA_PEM.len() - 30];
        assert!(matches!(
            Trust::from_pem(truncated.as_bytes()),
            Err(TrustError::NotPem { .. })
        ));
        let not_x509 = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert!(matches!(
            Trust::from_pem(not_x509.as_bytes()),
            Err(TrustError::NotARoot { number: 1, .. })
        ));
        let missing = std::env::temp_dir().join(format!("websub-no-ca-{}", uuid::Uuid::new_v4()));
        let error = Trust::from_pem_file(&missing).expect_err("no such file");
        assert!(
            matches!(&error, TrustError::Unreadable { cause } if cause.kind() == std::io::ErrorKind::NotFound),
            "{error:?}"
        );
    }
}

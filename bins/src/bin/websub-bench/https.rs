//! HTTPS peers on loopback: a throwaway CA and a server certificate for
//! 127.0.0.1 made with rcgen, and an axum router served over rustls that
//! counts every handshake by kind (full, resumed, failed), keeping
//! connections alive or closing each after one answer so that every
//! request costs a handshake.
//!
//! `websub-bench tls` measures with it and the TLS tests of `websubd`
//! include this file by its path, so the server whose handshakes a test
//! proves is the one the benchmark counts.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub(crate) type Error = Box<dyn std::error::Error + Send + Sync>;

/// A certificate authority that exists for one run: its certificate is
/// what the hub is told to trust (`--extra-ca`), its key signs the
/// servers'.
pub(crate) struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl TestCa {
    pub(crate) fn new(name: &str) -> Result<Self, Error> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        Ok(Self {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate()?)?,
        })
    }

    /// The CA certificate, PEM-encoded: the contents of an `--extra-ca`
    /// file.
    pub(crate) fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server configuration presenting a certificate for 127.0.0.1 and
    /// localhost signed by this CA, its chain ending at the CA. It issues
    /// stateless session tickets, as common servers do, so clients can
    /// resume.
    pub(crate) fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, Error> {
        let key = KeyPair::generate()?;
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?;
        params
            .distinguished_name
            .push(DnType::CommonName, "127.0.0.1");
        let certificate = params.signed_by(&key, &self.issuer)?;
        let chain: Vec<CertificateDer<'static>> =
            vec![certificate.der().clone(), self.issuer.der().clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        config.ticketer = rustls::crypto::ring::Ticketer::new()?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// The handshakes a server saw, by kind.
#[derive(Debug, Default)]
pub(crate) struct Handshakes {
    full: AtomicUsize,
    resumed: AtomicUsize,
    failed: AtomicUsize,
}

impl Handshakes {
    /// Full handshakes (a HelloRetryRequest's included).
    pub(crate) fn full(&self) -> usize {
        self.full.load(Ordering::Relaxed)
    }

    /// Handshakes that resumed an earlier session.
    pub(crate) fn resumed(&self) -> usize {
        self.resumed.load(Ordering::Relaxed)
    }

    /// Handshakes that did not complete: the client refused the
    /// certificate, or went away.
    pub(crate) fn failed(&self) -> usize {
        self.failed.load(Ordering::Relaxed)
    }
}

/// What the server does with a connection after an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Connections {
    /// Keeps it for the client's next request.
    KeepAlive,
    /// Closes it (`Connection: close`), so the next request needs a new
    /// connection and a new handshake.
    CloseEach,
}

/// `app` served over TLS on a listener; stops accepting when dropped.
pub(crate) struct HttpsServer {
    pub(crate) handshakes: Arc<Handshakes>,
    accepting: JoinHandle<()>,
}

impl HttpsServer {
    /// Serves `app` on `listener` with `config`, each connection on a task
    /// of its own.
    pub(crate) fn serve(
        listener: TcpListener,
        app: Router,
        config: Arc<rustls::ServerConfig>,
        connections: Connections,
    ) -> Result<Self, Error> {
        let handshakes = Arc::new(Handshakes::default());
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let counted = handshakes.clone();
        let accepting = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (acceptor, app, counted) = (acceptor.clone(), app.clone(), counted.clone());
                tokio::spawn(async move {
                    let _ = tcp.set_nodelay(true);
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        counted.failed.fetch_add(1, Ordering::Relaxed);
                        return;
                    };
                    let kind = match tls.get_ref().1.handshake_kind() {
                        Some(rustls::HandshakeKind::Resumed) => &counted.resumed,
                        _ => &counted.full,
                    };
                    kind.fetch_add(1, Ordering::Relaxed);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .keep_alive(connections == Connections::KeepAlive)
                        .serve_connection(TokioIo::new(tls), TowerToHyperService::new(app))
                        .await;
                });
            }
        });
        Ok(Self {
            handshakes,
            accepting,
        })
    }
}

impl Drop for HttpsServer {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

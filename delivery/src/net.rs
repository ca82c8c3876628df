//! The network policy for everything the hub contacts on someone else's
//! behalf — verification and delivery to callbacks, topic fetches, outbox
//! webhooks — and the resolver that enforces it in every client
//! ([`crate::client`] builds them).
//!
//! A public hub must not become a proxy into its own network (SSRF): unless
//! [`NetPolicy::allow_private_network`] is set, it contacts only public
//! addresses. The policy is enforced three times, because each check alone
//! has a gap:
//! - [`NetPolicy::check_url`] at request time, so the subscriber gets a 400
//!   with a clear reason;
//! - the clients' DNS resolver at connect time, so a name that resolved to a
//!   public address at request time and to a private one later (DNS
//!   rebinding) still cannot be reached;
//! - [`NetPolicy::check_literal`] before every request, because URLs whose
//!   host is an IP address never reach a resolver.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use url::{Host, Url};

/// How many redirects a topic fetch follows.
pub const MAX_FETCH_REDIRECTS: usize = 5;

/// Installs rustls's ring crypto provider as the process default, once.
///
/// reqwest is built without a provider of its own and panics when a client
/// is built before one is installed. Idempotent; a provider installed by
/// someone else first stays in place.
pub fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another installer is fine: a provider is in place
        // either way.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Which addresses the hub may contact.
#[derive(Clone, Debug, Default)]
pub struct NetPolicy {
    /// Allow loopback, private, link-local, unique-local and other
    /// non-public addresses (tests, hubs inside a private network).
    pub allow_private_network: bool,
}

/// Why the network policy refused a URL, or a client could not be built.
/// The `Display` text is meant for the subscriber or publisher.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetError {
    /// The text is not a URL at all.
    #[error("not a valid URL: {reason}")]
    InvalidUrl {
        /// What the URL parser said.
        reason: String,
    },
    /// A scheme other than http or https.
    #[error("only http and https URLs are contacted, not {scheme}")]
    UnsupportedScheme {
        /// The scheme given.
        scheme: String,
    },
    /// A URL without a host.
    #[error("the URL has no host")]
    MissingHost,
    /// The host is, or resolves to, an address this hub does not contact.
    #[error("{host} is a non-public address ({address}); this hub only contacts public addresses")]
    NonPublicAddress {
        /// The host as written in the URL.
        host: String,
        /// The first refused address.
        address: IpAddr,
    },
    /// Name resolution failed.
    #[error("the host {host} could not be resolved")]
    Unresolvable {
        /// The host.
        host: String,
        /// The resolver's error.
        #[source]
        source: std::io::Error,
    },
    /// Name resolution succeeded with no address.
    #[error("the host {host} has no address")]
    NoAddress {
        /// The host.
        host: String,
    },
    /// A fetch was redirected more than [`MAX_FETCH_REDIRECTS`] times.
    #[error("more than {MAX_FETCH_REDIRECTS} redirects")]
    TooManyRedirects,
    /// The HTTP client could not be built (e.g. no CA certificates could be
    /// loaded from the system).
    #[error("the HTTP client could not be built")]
    Client(#[source] reqwest::Error),
    /// The TLS configuration of a client could not be built (e.g. no root
    /// certificate at all could be loaded).
    #[error("the TLS configuration could not be built")]
    Tls(#[source] rustls::Error),
}

impl NetError {
    /// The HTTP status to answer a request with when this refused its URL:
    /// 400, except a client that could not be built (500).
    pub fn status(&self) -> http::StatusCode {
        match self {
            Self::Client(_) | Self::Tls(_) => http::StatusCode::INTERNAL_SERVER_ERROR,
            _ => http::StatusCode::BAD_REQUEST,
        }
    }
}

impl NetPolicy {
    /// Checks `url` as it stands now: an http(s) URL whose host — an IP
    /// literal, or every address its name resolves to — is public, unless
    /// private networks are allowed. For answering a request with a clear
    /// 400 before accepting it.
    pub async fn check_url(&self, url: &Url) -> Result<(), NetError> {
        self.check_literal(url)?;
        if self.allow_private_network {
            return Ok(());
        }
        let Some(Host::Domain(domain)) = url.host() else {
            // IP literals were checked above.
            return Ok(());
        };
        let addresses = resolve(domain).await?;
        if let Some(address) = addresses.iter().find(|address| !is_public(address.ip())) {
            return Err(NetError::NonPublicAddress {
                host: domain.to_owned(),
                address: address.ip(),
            });
        }
        Ok(())
    }

    /// Parses `url` and checks it with [`check_url`](Self::check_url).
    pub async fn check_str(&self, url: &str) -> Result<Url, NetError> {
        let parsed = parse_url(url)?;
        self.check_url(&parsed).await?;
        Ok(parsed)
    }

    /// The check every outgoing request makes, without name resolution: an
    /// http(s) URL with a host that is not a non-public IP literal nor a
    /// `localhost` name, unless private networks are allowed. Names are left
    /// to the clients' resolver, which filters at connect time.
    pub fn check_literal(&self, url: &Url) -> Result<(), NetError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(NetError::UnsupportedScheme {
                scheme: url.scheme().to_owned(),
            });
        }
        let host = url.host().ok_or(NetError::MissingHost)?;
        if self.allow_private_network {
            return Ok(());
        }
        let address = match host {
            Host::Ipv4(ip) => IpAddr::V4(ip),
            Host::Ipv6(ip) => IpAddr::V6(ip),
            // RFC 6761: these names are loopback by definition, whatever a
            // resolver says.
            Host::Domain(name) if is_localhost_name(name) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            Host::Domain(_) => return Ok(()),
        };
        if is_public(address) {
            Ok(())
        } else {
            Err(NetError::NonPublicAddress {
                host: url.host_str().unwrap_or_default().to_owned(),
                address,
            })
        }
    }
}

/// Parses a URL, mapping the parser's error to [`NetError::InvalidUrl`].
pub fn parse_url(url: &str) -> Result<Url, NetError> {
    Url::parse(url).map_err(|error| NetError::InvalidUrl {
        reason: error.to_string(),
    })
}

fn is_localhost_name(name: &str) -> bool {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost" || name.ends_with(".localhost")
}

/// Whether `ip` is a globally reachable unicast address.
///
/// Not public: unspecified, loopback, private (10/8, 172.16/12, 192.168/16),
/// shared/CGNAT (100.64/10), link-local, IETF protocol assignments
/// (192.0.0/24), documentation, benchmarking (198.18/15), multicast,
/// reserved (240/4) and broadcast; for IPv6 everything outside global
/// unicast 2000::/3 (which excludes unique-local fc00::/7, link-local,
/// site-local, multicast, ::1 and ::) plus documentation and ORCHID ranges.
/// IPv6 forms that embed an IPv4 address — IPv4-mapped ::ffff:0:0/96, NAT64
/// 64:ff9b::/96 and 6to4 2002::/16 — are judged by that IPv4 address.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(ip) => is_public_v4(ip),
        IpAddr::V6(ip) => is_public_v6(ip),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [first, second, third, _] = ip.octets();
    let this_network = first == 0;
    let shared = first == 100 && (second & 0b1100_0000) == 64;
    let protocol_assignments = first == 192 && second == 0 && third == 0;
    let benchmarking = first == 198 && (second & 0b1111_1110) == 18;
    let reserved = first >= 240; // includes 255.255.255.255
    !(this_network
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || shared
        || protocol_assignments
        || ip.is_documentation()
        || benchmarking
        || ip.is_multicast()
        || reserved)
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    if let Some(embedded) = ip.to_ipv4_mapped() {
        return is_public_v4(embedded);
    }
    let segments = ip.segments();
    let low_32 = |high: u16, low: u16| Ipv4Addr::from((u32::from(high) << 16) | u32::from(low));
    // NAT64 well-known prefix: a gateway forwards to the embedded address.
    if segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return is_public_v4(low_32(segments[6], segments[7]));
    }
    // 6to4: the relay forwards to the IPv4 address in bits 16..48.
    if segments[0] == 0x2002 {
        return is_public_v4(low_32(segments[1], segments[2]));
    }
    let global_unicast = (segments[0] & 0xe000) == 0x2000;
    let documentation = (segments[0] == 0x2001 && segments[1] == 0x0db8)
        || (segments[0] == 0x3fff && segments[1] < 0x1000);
    // ORCHID (2001:10::/28) and ORCHIDv2 (2001:20::/28).
    let orchid = segments[0] == 0x2001 && matches!(segments[1] & 0xfff0, 0x0010 | 0x0020);
    let benchmarking = segments[0] == 0x2001 && segments[1] == 0x0002 && segments[2] == 0;
    global_unicast && !documentation && !orchid && !benchmarking
}

async fn resolve(host: &str) -> Result<Vec<SocketAddr>, NetError> {
    let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host, 0))
        .await
        .map_err(|source| NetError::Unresolvable {
            host: host.to_owned(),
            source,
        })?
        .collect();
    if addresses.is_empty() {
        return Err(NetError::NoAddress {
            host: host.to_owned(),
        });
    }
    Ok(addresses)
}

/// The clients' resolver: the system's, with non-public addresses removed
/// unless allowed, so the check happens on the addresses actually connected
/// to.
#[derive(Clone, Debug)]
pub(crate) struct PolicyResolver {
    pub(crate) policy: NetPolicy,
}

impl PolicyResolver {
    /// The addresses of `host` this policy lets a client connect to.
    async fn allowed(
        allow_private_network: bool,
        host: String,
    ) -> Result<Vec<SocketAddr>, NetError> {
        if !allow_private_network && is_localhost_name(&host) {
            return Err(NetError::NonPublicAddress {
                host,
                address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            });
        }
        let addresses = resolve(&host).await?;
        let first = addresses[0].ip();
        let allowed: Vec<SocketAddr> = addresses
            .into_iter()
            .filter(|address| allow_private_network || is_public(address.ip()))
            .collect();
        if allowed.is_empty() {
            return Err(NetError::NonPublicAddress {
                host,
                address: first,
            });
        }
        Ok(allowed)
    }
}

impl reqwest::dns::Resolve for PolicyResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let resolving = Self::allowed(self.policy.allow_private_network, name.as_str().to_owned());
        Box::pin(async move {
            let allowed: reqwest::dns::Addrs = Box::new(resolving.await?.into_iter());
            Ok(allowed)
        })
    }
}

/// The same resolver for hyper's own connector (the deliveries' client).
impl tower::Service<hyper_util::client::legacy::connect::dns::Name> for PolicyResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = NetError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, NetError>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), NetError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: hyper_util::client::legacy::connect::dns::Name) -> Self::Future {
        let resolving = Self::allowed(self.policy.allow_private_network, name.as_str().to_owned());
        Box::pin(async move { Ok(resolving.await?.into_iter()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse()
            .unwrap_or_else(|error| panic!("{text}: {error}"))
    }

    fn url(text: &str) -> Url {
        Url::parse(text).unwrap_or_else(|error| panic!("{text}: {error}"))
    }

    const DENY: NetPolicy = NetPolicy {
        allow_private_network: false,
    };
    const ALLOW: NetPolicy = NetPolicy {
        allow_private_network: true,
    };

    #[test]
    fn public_addresses() {
        for text in [
            "8.8.8.8",
            "1.1.1.1",
            "93.184.216.34",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.169.0.1",
            "2606:4700:4700::1111",
            "2a00:1450:4001:80b::200e",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert!(is_public(ip(text)), "{text} should be public");
        }
    }

    #[test]
    fn non_public_ipv4_addresses() {
        for text in [
            "0.0.0.0",
            "0.1.2.3",
            "127.0.0.1",
            "127.255.255.254",
            "10.0.0.1",
            "10.255.255.255",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "192.0.0.8",
            "192.0.2.1",
            "198.51.100.7",
            "203.0.113.9",
            "198.18.0.1",
            "198.19.255.255",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
        ] {
            assert!(!is_public(ip(text)), "{text} should not be public");
        }
    }

    #[test]
    fn non_public_ipv6_addresses() {
        for text in [
            "::",
            "::1",
            "fe80::1",
            "fe80::1ff:fe23:4567:890a",
            "fc00::1",
            "fd12:3456:789a::1",
            "fec0::1",
            "ff02::1",
            "ff0e::1",
            "2001:db8::1",
            "3fff::1",
            "2001:10::1",
            "2001:2f::1",
            "2001:2::1",
            "100::1",
            // IPv4-mapped, IPv4-compatible, NAT64 and 6to4 forms of
            // non-public IPv4 addresses.
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:192.168.0.1",
            "::ffff:169.254.169.254",
            "::ffff:0.0.0.0",
            "::127.0.0.1",
            "64:ff9b::7f00:1",
            "64:ff9b::a00:1",
            "2002:7f00:1::1",
            "2002:a9fe:a9fe::1",
        ] {
            assert!(!is_public(ip(text)), "{text} should not be public");
        }
    }

    #[tokio::test]
    async fn loopback_literal_is_refused_unless_allowed() {
        let loopback = url("http://127.0.0.1:8080/cb");
        assert!(matches!(
            DENY.check_url(&loopback).await,
            Err(NetError::NonPublicAddress { address, .. }) if address == ip("127.0.0.1")
        ));
        assert!(ALLOW.check_url(&loopback).await.is_ok());
        assert!(matches!(
            DENY.check_url(&url("http://[::1]/")).await,
            Err(NetError::NonPublicAddress { .. })
        ));
        // The URL parser reads these as IPv4 literals too.
        for sneaky in ["http://2130706433/", "http://0x7f.1/", "http://127.1/"] {
            assert!(
                matches!(
                    DENY.check_url(&url(sneaky)).await,
                    Err(NetError::NonPublicAddress { .. })
                ),
                "{sneaky}"
            );
        }
    }

    #[tokio::test]
    async fn localhost_is_refused_unless_allowed() {
        for name in [
            "http://localhost/",
            "http://LOCALHOST.:81/",
            "http://api.localhost/x",
        ] {
            assert!(
                matches!(
                    DENY.check_url(&url(name)).await,
                    Err(NetError::NonPublicAddress { .. })
                ),
                "{name}"
            );
        }
        assert!(ALLOW.check_url(&url("http://localhost/")).await.is_ok());
    }

    #[tokio::test]
    async fn public_literal_passes() {
        assert!(DENY.check_url(&url("https://93.184.216.34/")).await.is_ok());
        assert!(
            DENY.check_url(&url("http://[2606:4700::1111]:8080/"))
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn only_http_and_https_are_contacted() {
        for policy in [DENY, ALLOW] {
            assert!(matches!(
                policy.check_url(&url("ftp://93.184.216.34/")).await,
                Err(NetError::UnsupportedScheme { .. })
            ));
            assert!(matches!(
                policy.check_str("file:///etc/passwd").await,
                Err(NetError::UnsupportedScheme { .. })
            ));
            assert!(matches!(
                policy.check_str("not a url").await,
                Err(NetError::InvalidUrl { .. })
            ));
        }
    }

    #[test]
    fn check_literal_leaves_names_to_the_resolver() {
        assert!(DENY.check_literal(&url("https://hub.example/")).is_ok());
        assert!(matches!(
            DENY.check_literal(&url("http://10.1.2.3/")),
            Err(NetError::NonPublicAddress { .. })
        ));
        assert!(matches!(
            DENY.check_literal(&url("http://[::ffff:7f00:1]/")),
            Err(NetError::NonPublicAddress { .. })
        ));
        assert!(ALLOW.check_literal(&url("http://10.1.2.3/")).is_ok());
    }

    #[tokio::test]
    async fn resolver_filters_non_public_addresses_at_connect_time() {
        use reqwest::dns::Resolve;
        let name = |host: &str| {
            host.parse::<reqwest::dns::Name>()
                .unwrap_or_else(|_| panic!("name {host}"))
        };
        let refused = PolicyResolver { policy: DENY }
            .resolve(name("localhost"))
            .await;
        assert!(refused.is_err());
        let allowed = PolicyResolver { policy: ALLOW }
            .resolve(name("localhost"))
            .await
            .unwrap_or_else(|error| panic!("resolve localhost: {error}"));
        assert!(allowed.into_iter().all(|address| !is_public(address.ip())));
    }
}

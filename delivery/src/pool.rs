//! The connections to callback hosts, bounded as a whole.
//!
//! A client's pool bounds idle connections per host but not in total: a hub
//! that has delivered to a hundred thousand hosts would keep one or more
//! idle connections to each until they time out, and run out of file
//! descriptors long before. So each callback host gets a client (and a
//! pool) of its own, which carries its verifications and its deliveries. A host with deliveries under way holds its client
//! ([`HostClients::checkout`]); once it has none, the client joins the
//! idle ones ([`HostClients::checkin`]), of which only the hosts used most
//! recently keep theirs: the client of the host idle longest is dropped,
//! and with it that host's idle connections. Open connections are thus
//! those of the attempts under way, plus idle ones: at most
//! `idle_per_host` for each host at work and for each of the `hosts` idle
//! clients. The clients share one TLS configuration, so one set of roots
//! and one session cache serve every host, and a host evicted and
//! contacted again resumes its TLS session.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lru::LruCache;

use crate::client::{POOL_IDLE_TIMEOUT, Trust, callback_tls};
use crate::direct::DirectClient;
use crate::net::{NetError, NetPolicy};

/// How many idle connections the pool keeps, and to how many hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdleLimits {
    /// Idle keep-alive connections kept per host.
    pub per_host: usize,
    /// Hosts that keep their idle connections.
    pub hosts: usize,
}

impl IdleLimits {
    /// The limits of a budget of `connections` idle connections in all,
    /// `per_host` to a host.
    pub fn of_budget(connections: usize, per_host: usize) -> Self {
        let per_host = per_host.max(1);
        Self {
            per_host,
            hosts: (connections / per_host).max(1),
        }
    }

    /// The most idle connections kept at once.
    pub fn connections(self) -> usize {
        self.per_host.saturating_mul(self.hosts)
    }
}

/// The clients of callback hosts (deliveries and verifications). Cheap to
/// clone; clones share the clients.
#[derive(Clone)]
pub struct HostClients {
    inner: Arc<Shared>,
}

struct Shared {
    policy: NetPolicy,
    timeout: Duration,
    tls: rustls::ClientConfig,
    idle: IdleLimits,
    clients: Mutex<LruCache<Box<str>, DirectClient>>,
}

impl std::fmt::Debug for HostClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostClients")
            .field("idle", &self.inner.idle)
            .field("hosts", &self.hosts())
            .finish_non_exhaustive()
    }
}

impl HostClients {
    /// Clients under `policy`, with `timeout` for connecting and for an
    /// exchange, trusting `trust`, keeping idle connections within `idle`.
    pub fn new(
        policy: &NetPolicy,
        timeout: Duration,
        trust: &Trust,
        idle: IdleLimits,
    ) -> Result<Self, NetError> {
        let tls = callback_tls(trust)?;
        let hosts = NonZeroUsize::new(idle.hosts).unwrap_or(NonZeroUsize::MIN);
        Ok(Self {
            inner: Arc::new(Shared {
                policy: policy.clone(),
                timeout,
                tls,
                idle,
                clients: Mutex::new(LruCache::new(hosts)),
            }),
        })
    }

    /// The client of the host of `url` (an absolute http(s) URL).
    pub fn for_url(&self, url: &str) -> DirectClient {
        let host = authority(url);
        let mut clients = self.lock();
        if let Some(client) = clients.get(host) {
            return client.clone();
        }
        let client = self.build(host);
        let evicted = clients.push(host.into(), client.clone());
        drop(clients);
        // Dropped outside the lock: closing its idle connections is I/O.
        drop(evicted);
        client
    }

    /// The client of `host` (a `host:port`) for a run of deliveries to it:
    /// taken out of the idle ones, or a new one. Hand it back with
    /// [`Self::checkin`] when the run ends.
    pub fn checkout(&self, host: &str) -> DirectClient {
        match self.lock().pop(host) {
            Some(client) => client,
            None => self.build(host),
        }
    }

    /// A new client for `host`, on the shared TLS configuration.
    fn build(&self, host: &str) -> DirectClient {
        let shared = &self.inner;
        DirectClient::new(
            host,
            &shared.policy,
            shared.timeout,
            shared.tls.clone(),
            shared.idle.per_host,
            POOL_IDLE_TIMEOUT,
        )
    }

    /// `host` has no deliveries under way any more: its client joins the
    /// idle ones, and the one idle longest is dropped if there are too many.
    pub fn checkin(&self, host: &str, client: DirectClient) {
        let evicted = self.lock().push(host.into(), client);
        // Dropped outside the lock: closing idle connections is I/O.
        drop(evicted);
    }

    /// Hosts holding an idle client now.
    pub fn hosts(&self) -> usize {
        self.lock().len()
    }

    /// The limits the clients keep.
    pub fn idle_limits(&self) -> IdleLimits {
        self.inner.idle
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<Box<str>, DirectClient>> {
        self.inner
            .clients
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The `host:port` part of an absolute URL, as written: what a host's
/// client and its delivery slots are keyed by. Cheaper than parsing the URL
/// on every delivery, and callbacks were validated as absolute http(s) URLs
/// when subscribed. The scheme is kept out: one host's http and https
/// connections share a client, whose pool keeps them apart.
pub fn authority(url: &str) -> &str {
    let authority = authority_with_credentials(url);
    // Credentials are not part of the host.
    authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host)
}

/// The authority of an absolute URL as written, credentials included.
pub(crate) fn authority_with_credentials(url: &str) -> &str {
    // The scheme ends at the first colon of an absolute URL; a search for
    // the whole separator costs more, once per delivery.
    let rest = match url.find(':') {
        Some(colon) if url[colon..].starts_with("://") => &url[colon + 3..],
        _ => url.split_once("://").map_or(url, |(_, rest)| rest),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    &rest[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authority_is_host_and_port_as_written() {
        assert_eq!(authority("http://127.0.0.1:9000/cb?x=1"), "127.0.0.1:9000");
        assert_eq!(authority("https://user:pw@Sub.example/cb"), "Sub.example");
        assert_eq!(authority("https://[::1]:8443?q"), "[::1]:8443");
        assert_eq!(authority("https://sub.example"), "sub.example");
    }

    #[test]
    fn a_budget_is_shared_out_per_host() {
        let limits = IdleLimits::of_budget(2048, 16);
        assert_eq!(
            limits,
            IdleLimits {
                per_host: 16,
                hosts: 128
            }
        );
        assert_eq!(limits.connections(), 2048);
        assert_eq!(IdleLimits::of_budget(4, 16).hosts, 1);
        assert_eq!(IdleLimits::of_budget(10, 0).per_host, 1);
    }

    /// Clients for loopback hosts keeping `per_host` idle connections to
    /// each of `hosts` hosts.
    fn loopback_clients(per_host: usize, hosts: usize) -> HostClients {
        let policy = NetPolicy {
            allow_private_network: true,
        };
        let idle = IdleLimits { per_host, hosts };
        HostClients::new(&policy, Duration::from_secs(2), &Trust::system(), idle).expect("clients")
    }

    #[tokio::test]
    async fn only_the_hosts_used_last_keep_a_client() {
        let clients = loopback_clients(2, 2);
        for host in ["http://127.0.0.1:1/a", "http://127.0.0.2:1/b"] {
            clients.for_url(host);
        }
        // Used again: 127.0.0.1 becomes the most recent.
        clients.for_url("http://127.0.0.1:1/c");
        clients.for_url("http://127.0.0.3:1/");
        assert_eq!(clients.hosts(), 2);
        let kept = clients.lock();
        assert!(kept.contains("127.0.0.1:1"));
        assert!(kept.contains("127.0.0.3:1"));
        assert!(!kept.contains("127.0.0.2:1"));
    }

    #[tokio::test]
    async fn a_host_at_work_holds_its_client_outside_the_idle_ones() {
        let clients = loopback_clients(1, 1);
        let busy = clients.checkout("127.0.0.1:1");
        assert_eq!(clients.hosts(), 0, "a host at work is not idle");
        clients.checkin("127.0.0.1:1", busy);
        assert_eq!(clients.hosts(), 1);
        // A second host ends its work: the one idle longer is dropped.
        let other = clients.checkout("127.0.0.2:1");
        clients.checkin("127.0.0.2:1", other);
        assert_eq!(clients.hosts(), 1);
        assert!(clients.lock().contains("127.0.0.2:1"));
        // Taken again, the idle client is the one handed out.
        let again = clients.checkout("127.0.0.2:1");
        assert_eq!(clients.hosts(), 0);
        drop(again);
    }
}

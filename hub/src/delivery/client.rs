//! The one builder of outgoing HTTP clients: pools, timeouts, TLS (rustls
//! with the system roots), the user agent, redirects, and the network policy
//! on every client that contacts a URL someone else chose. Nothing else in
//! the crate builds a `reqwest::Client`.

use std::sync::Arc;
use std::time::Duration;

use crate::net::{
    MAX_FETCH_REDIRECTS, NetError, NetPolicy, PolicyResolver, install_crypto_provider,
};

/// How long an idle pooled connection is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// What an outgoing client is for, and so how it is built.
#[derive(Debug, Clone)]
pub enum Purpose {
    /// Verification and delivery to WebSub callbacks, and outbox webhooks:
    /// the network policy applies, redirects are never followed (a
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
/// whole exchange.
///
/// Request paths with a policy call [`NetPolicy::check_literal`] on each URL
/// first: IP literals never reach the resolver that filters names.
pub fn build(purpose: Purpose, timeout: Duration) -> Result<reqwest::Client, NetError> {
    install_crypto_provider();
    let builder = reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        // A proxy would connect on our behalf and bypass the resolver.
        .no_proxy()
        .user_agent(concat!("websub-hub/", env!("CARGO_PKG_VERSION")));
    let builder = match purpose {
        Purpose::Deliveries {
            policy,
            max_idle_per_host,
        } => builder
            .dns_resolver(Arc::new(PolicyResolver { policy }))
            .redirect(reqwest::redirect::Policy::none())
            .http1_only()
            .pool_max_idle_per_host(max_idle_per_host)
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .tcp_nodelay(true),
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
            builder
                .dns_resolver(Arc::new(PolicyResolver { policy }))
                .redirect(redirects)
        }
        Purpose::OperatorService => builder.redirect(reqwest::redirect::Policy::none()),
    };
    builder.build().map_err(NetError::Client)
}

/// The client of deliveries and verifications under `policy`: see
/// [`Purpose::Deliveries`].
pub fn for_deliveries(
    policy: &NetPolicy,
    timeout: Duration,
    max_idle_per_host: usize,
) -> Result<reqwest::Client, NetError> {
    let purpose = Purpose::Deliveries {
        policy: policy.clone(),
        max_idle_per_host,
    };
    build(purpose, timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DENY: NetPolicy = NetPolicy {
        allow_private_network: false,
    };

    #[tokio::test]
    async fn clients_refuse_loopback_names_at_connect_time() {
        let purpose = Purpose::Deliveries {
            policy: DENY,
            max_idle_per_host: 1,
        };
        let client = build(purpose, Duration::from_secs(2)).expect("client");
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
        )
        .expect("client");
    }
}

//! The process's file-descriptor limit, and the delivery settings fitted
//! under it. Every connection in flight and every idle keep-alive
//! connection holds a descriptor; running out of them fails deliveries,
//! verifications and accepted requests alike. So at start the soft limit
//! is raised to the hard one (a default soft limit of 1 024 is far below
//! what thousands of deliveries in flight need), and if the settings still
//! ask for more than it allows, they are lowered, with a warning that says
//! so, rather than left to fail at the worst moment.

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
use tracing::{info, warn};

use crate::config::DeliveryPolicy;

/// Descriptors kept for everything but callback connections: the listener
/// and its connections, the databases' pools, topic fetches, outbox
/// webhooks, the subscriptions service, files.
pub const RESERVED: u64 = 1024;

/// Raises the soft descriptor limit to the hard one; returns the limit in
/// force (`None`: unlimited).
pub fn raise_limit() -> Option<u64> {
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => {
                info!(from = ?limit.current, to = ?limit.maximum, "raised the file-descriptor limit");
                return limit.maximum;
            }
            Err(error) => {
                warn!(%error, limit = ?limit.current, "could not raise the file-descriptor limit");
            }
        }
    }
    limit.current
}

/// `delivery` with its connections (in flight, and idle) fitted within
/// `limit` descriptors less [`RESERVED`]: both lowered in proportion when
/// they ask for more.
pub fn fit(delivery: DeliveryPolicy, limit: Option<u64>) -> DeliveryPolicy {
    let Some(limit) = limit else {
        return delivery;
    };
    let room = usize::try_from(limit.saturating_sub(RESERVED))
        .unwrap_or(usize::MAX)
        .max(2);
    let asked = delivery
        .concurrency
        .saturating_add(delivery.idle_connections);
    if asked <= room {
        return delivery;
    }
    let scaled = |value: usize| {
        let value = u128::try_from(value).unwrap_or(u128::MAX);
        let share = value * room as u128 / asked as u128;
        usize::try_from(share).unwrap_or(usize::MAX).max(1)
    };
    let fitted = DeliveryPolicy {
        concurrency: scaled(delivery.concurrency),
        idle_connections: scaled(delivery.idle_connections),
        ..delivery
    };
    warn!(
        limit,
        delivery_concurrency = fitted.concurrency,
        delivery_idle_connections = fitted.idle_connections,
        asked_concurrency = delivery.concurrency,
        asked_idle_connections = delivery.idle_connections,
        "the file-descriptor limit (ulimit -n) is too low for the delivery settings: \
         lowered them to fit; raise the hard limit to keep them"
    );
    fitted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_within_the_limit_are_kept() {
        let delivery = DeliveryPolicy::default();
        assert_eq!(fit(delivery, None), delivery);
        assert_eq!(fit(delivery, Some(1 << 20)), delivery);
    }

    #[test]
    fn settings_over_the_limit_are_lowered_in_proportion() {
        let delivery = DeliveryPolicy {
            concurrency: 3000,
            idle_connections: 1000,
            ..DeliveryPolicy::default()
        };
        let fitted = fit(delivery, Some(RESERVED + 2000));
        assert_eq!(fitted.concurrency, 1500);
        assert_eq!(fitted.idle_connections, 500);
        assert_eq!(fitted.per_host, delivery.per_host);
        let tiny = fit(delivery, Some(10));
        assert!(tiny.concurrency >= 1 && tiny.idle_connections >= 1);
    }

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        let limit = raise_limit();
        assert_eq!(getrlimit(Resource::Nofile).current, limit);
    }
}

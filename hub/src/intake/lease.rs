//! Leases: how long a verified subscription lasts ([`grant`]), and the
//! [`Reaper`] that removes subscriptions whose lease has ended and reports
//! each one.
//!
//! WebSub hubs must enforce expiry and must never grant a perpetual lease:
//! every lease granted here is between the policy's minimum and maximum, and
//! never zero.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use websub_store::{StoreError, SubscriptionStore};

use crate::clock::Clock;
use crate::config::LeasePolicy;

/// The counter of subscriptions removed because their lease ended.
pub const EXPIRED_METRIC: &str = "websub_subscriptions_expired_total";

/// The lease, in seconds, granted for a request asking for `requested`:
/// the policy's default when none is asked, otherwise the request clamped to
/// `[min, max]`. At least one second, so never perpetual.
pub fn grant(policy: &LeasePolicy, requested: Option<u64>) -> u32 {
    let min = policy.min.as_secs().max(1);
    let max = policy.max.as_secs().max(min);
    let wanted = requested.unwrap_or(policy.default.as_secs());
    u32::try_from(wanted.clamp(min, max)).unwrap_or(u32::MAX)
}

/// Removes subscriptions whose lease has ended, on an interval.
///
/// Cloning is cheap and clones share the count, so one clone can run while
/// another reports [`expired_total`](Self::expired_total).
#[derive(Debug, Clone)]
pub struct Reaper {
    store: Arc<dyn SubscriptionStore>,
    clock: Arc<dyn Clock>,
    interval: Duration,
    expired: Arc<AtomicU64>,
}

impl Reaper {
    /// A reaper sweeping `store` every `interval`, by `clock`'s time.
    pub fn new(
        store: Arc<dyn SubscriptionStore>,
        clock: Arc<dyn Clock>,
        interval: Duration,
    ) -> Self {
        Self {
            store,
            clock,
            interval,
            expired: Arc::new(AtomicU64::new(0)),
        }
    }

    /// How many subscriptions this reaper (and its clones) removed.
    pub fn expired_total(&self) -> u64 {
        self.expired.load(Ordering::Relaxed)
    }

    /// One sweep: removes every subscription whose lease ended strictly
    /// before now and returns how many it removed.
    ///
    /// "Strictly before" is the store's `list_expiring` contract, so a lease
    /// ending exactly now is removed by the next sweep — at most one interval
    /// late. (Deliveries use `Subscription::is_expired`, which already treats
    /// it as ended.)
    ///
    /// A subscription renewed between the listing and its removal is kept:
    /// each one is read again and removed only if still expired. A renewal
    /// landing between that read and the delete can still be lost; the store
    /// has no conditional delete, and the window is one round trip.
    pub async fn reap_once(&self) -> Result<usize, StoreError> {
        let now = self.clock.now();
        let mut removed = 0;
        for listed in self.store.list_expiring(now).await? {
            let current = match self.store.get(&listed.topic, &listed.callback).await {
                Ok(current) => current,
                Err(StoreError::UnknownSubscription { .. }) => continue,
                Err(error) => return Err(error),
            };
            if current
                .expires_at
                .is_none_or(|expires_at| expires_at >= now)
            {
                continue;
            }
            self.store.delete(&current.topic, &current.callback).await?;
            removed += 1;
            self.expired.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(EXPIRED_METRIC).increment(1);
            tracing::info!(
                topic = %current.topic,
                callback = %current.callback,
                expired_at = ?current.expires_at,
                "subscription lease ended; subscription removed"
            );
        }
        Ok(removed)
    }

    /// Sweeps now and then every interval until `shutdown` is cancelled. A
    /// failed sweep is logged and retried at the next interval.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut ticks = tokio::time::interval(self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticks.tick() => {}
            }
            if let Err(error) = self.reap_once().await {
                tracing::warn!(error = %error, "expired-subscription sweep failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, TimeZone, Utc};
    use websub_store::Subscription;
    use websub_store::memory::MemoryStore;

    use super::*;
    use crate::clock::ManualClock;

    const DAY: u64 = 24 * 3600;

    fn policy() -> LeasePolicy {
        LeasePolicy {
            default: Duration::from_secs(10 * DAY),
            min: Duration::from_secs(60),
            max: Duration::from_secs(30 * DAY),
        }
    }

    #[test]
    fn default_lease_when_none_is_asked() {
        assert_eq!(grant(&policy(), None), 864_000);
    }

    #[test]
    fn requests_are_clamped_both_ways() {
        let policy = policy();
        assert_eq!(grant(&policy, Some(1)), 60);
        assert_eq!(grant(&policy, Some(59)), 60);
        assert_eq!(grant(&policy, Some(60)), 60);
        assert_eq!(grant(&policy, Some(3600)), 3600);
        assert_eq!(grant(&policy, Some(30 * DAY)), 2_592_000);
        assert_eq!(grant(&policy, Some(30 * DAY + 1)), 2_592_000);
        assert_eq!(grant(&policy, Some(u64::MAX)), 2_592_000);
    }

    #[test]
    fn never_perpetual_even_with_a_degenerate_policy() {
        let zero = LeasePolicy {
            default: Duration::ZERO,
            min: Duration::ZERO,
            max: Duration::ZERO,
        };
        assert_eq!(grant(&zero, None), 1);
        assert_eq!(grant(&zero, Some(0)), 1);
        let huge = LeasePolicy {
            default: Duration::from_secs(u64::MAX),
            min: Duration::from_secs(1),
            max: Duration::from_secs(u64::MAX),
        };
        assert_eq!(grant(&huge, None), u32::MAX);
    }

    fn start() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0)
            .single()
            .unwrap_or_else(|| panic!("valid date"))
    }

    fn leased(callback: &str, seconds: i64) -> Subscription {
        Subscription::new("https://publisher.example/feed", callback)
            .with_lease(chrono::Duration::seconds(seconds), start())
    }

    async fn saved(store: &MemoryStore, subscription: &Subscription) {
        store
            .save(subscription)
            .await
            .unwrap_or_else(|error| panic!("save: {error}"));
    }

    async fn callbacks(store: &MemoryStore) -> Vec<String> {
        let mut callbacks: Vec<String> = store
            .list_by_topic("https://publisher.example/feed")
            .await
            .unwrap_or_else(|error| panic!("list: {error}"))
            .into_iter()
            .map(|subscription| subscription.callback)
            .collect();
        callbacks.sort();
        callbacks
    }

    #[tokio::test]
    async fn reap_once_removes_exactly_the_expired_ones() {
        let store = Arc::new(MemoryStore::new());
        let clock = Arc::new(ManualClock::new(start()));
        saved(&store, &leased("https://a.example/short", 60)).await;
        saved(&store, &leased("https://a.example/exact", 120)).await;
        saved(&store, &leased("https://a.example/long", 3600)).await;
        let mut permanent = Subscription::new(
            "https://publisher.example/feed",
            "https://a.example/permanent",
        );
        permanent.created_at = start();
        permanent.verified_at = start();
        saved(&store, &permanent).await;

        let reaper = Reaper::new(store.clone(), clock.clone(), Duration::from_secs(60));
        assert_eq!(reaper.reap_once().await.ok(), Some(0));

        // At +120s "short" has ended; "exact" ends right now and is not yet
        // strictly before now, so it stays until the next sweep.
        clock.advance(Duration::from_secs(120));
        assert_eq!(reaper.reap_once().await.ok(), Some(1));
        assert_eq!(
            callbacks(&store).await,
            [
                "https://a.example/exact",
                "https://a.example/long",
                "https://a.example/permanent"
            ]
        );
        assert_eq!(reaper.expired_total(), 1);

        clock.advance(Duration::from_micros(1));
        assert_eq!(reaper.reap_once().await.ok(), Some(1));
        assert_eq!(
            callbacks(&store).await,
            ["https://a.example/long", "https://a.example/permanent"]
        );

        // Far in the future only the permanent subscription is left.
        clock.advance(Duration::from_secs(100 * 365 * DAY));
        let counting_clone = reaper.clone();
        assert_eq!(reaper.reap_once().await.ok(), Some(1));
        assert_eq!(callbacks(&store).await, ["https://a.example/permanent"]);
        assert_eq!(counting_clone.expired_total(), 3);
        assert_eq!(reaper.reap_once().await.ok(), Some(0));
    }

    #[tokio::test]
    async fn a_renewed_subscription_is_kept() {
        let store = Arc::new(MemoryStore::new());
        let clock = Arc::new(ManualClock::new(start()));
        saved(&store, &leased("https://a.example/renewed", 60)).await;
        clock.advance(Duration::from_secs(120));
        // Renewed before the sweep: the lease now runs from +120s.
        let renewed = leased("https://a.example/renewed", 60)
            .with_lease(chrono::Duration::seconds(60), clock.now());
        saved(&store, &renewed).await;
        let reaper = Reaper::new(store.clone(), clock, Duration::from_secs(60));
        assert_eq!(reaper.reap_once().await.ok(), Some(0));
        assert_eq!(callbacks(&store).await, ["https://a.example/renewed"]);
    }

    #[tokio::test(start_paused = true)]
    async fn run_sweeps_on_the_interval_until_cancelled() {
        let store = Arc::new(MemoryStore::new());
        let clock = Arc::new(ManualClock::new(start()));
        saved(&store, &leased("https://a.example/short", 60)).await;
        let reaper = Reaper::new(store.clone(), clock.clone(), Duration::from_secs(30));
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(reaper.clone().run(shutdown.clone()));

        clock.advance(Duration::from_secs(61));
        // Paused time: this advances tokio's clock past the next tick at once.
        tokio::time::sleep(Duration::from_secs(31)).await;
        assert_eq!(reaper.expired_total(), 1);
        assert!(callbacks(&store).await.is_empty());

        shutdown.cancel();
        assert!(running.await.is_ok());
    }
}

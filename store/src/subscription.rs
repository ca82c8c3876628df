//! The stored value: one verified subscription of a callback to a topic, and
//! the quota a conditional save is held to.

use chrono::{DateTime, Duration, Timelike, Utc};

/// One verified subscription, identified by its (topic, callback) pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    /// The topic URL, exactly as the subscriber sent it.
    pub topic: String,
    /// The callback URL, exactly as the subscriber sent it (query included).
    pub callback: String,
    /// The HMAC secret for authenticated distribution. `Some("")` and `None`
    /// are different values and both round-trip.
    pub secret: Option<String>,
    /// The lease the hub granted, in seconds; `None` for a permanent
    /// subscription.
    pub lease_seconds: Option<u32>,
    /// When the subscription was first created.
    pub created_at: DateTime<Utc>,
    /// When the hub last verified the subscriber's intent.
    pub verified_at: DateTime<Utc>,
    /// When the lease ends; `None` means permanent.
    pub expires_at: Option<DateTime<Utc>>,
    /// The subscriber the subscription counts against for quotas.
    pub owner: Option<String>,
}

impl Subscription {
    /// A permanent subscription without secret or owner, created and verified
    /// now.
    pub fn new(topic: impl Into<String>, callback: impl Into<String>) -> Self {
        let now = to_micros(Utc::now());
        Self {
            topic: topic.into(),
            callback: callback.into(),
            secret: None,
            lease_seconds: None,
            created_at: now,
            verified_at: now,
            expires_at: None,
            owner: None,
        }
    }

    /// Grants `lease` from `verified_at`: sets the lease, the verification
    /// time and the expiry. Leases longer than `u32::MAX` seconds saturate.
    pub fn with_lease(mut self, lease: Duration, verified_at: DateTime<Utc>) -> Self {
        let seconds = u32::try_from(lease.num_seconds().max(0)).unwrap_or(u32::MAX);
        self.verified_at = to_micros(verified_at);
        self.lease_seconds = Some(seconds);
        self.expires_at = Some(self.verified_at + Duration::seconds(i64::from(seconds)));
        self
    }

    /// Sets the HMAC secret.
    pub fn with_secret(mut self, secret: impl Into<String>) -> Self {
        self.secret = Some(secret.into());
        self
    }

    /// Sets the owner the subscription counts against.
    pub fn with_owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// Whether the lease has ended at `now` (never, for a permanent one).
    pub fn is_expired(&self, now: DateTime<Utc>) -> bool {
        self.expires_at.is_some_and(|expires| expires <= now)
    }
}

/// Truncates a timestamp to whole microseconds, the precision every backend
/// stores.
pub fn to_micros(at: DateTime<Utc>) -> DateTime<Utc> {
    // Plain arithmetic on the nanoseconds: `duration_trunc` is general
    // enough to cost a measurable share of a delivery, which reads the clock
    // several times.
    let nanos = at.timestamp_subsec_nanos();
    at.with_nanosecond(nanos - nanos % 1_000).unwrap_or(at)
}

/// The whole microsecond `m` such that, for every stored (whole-microsecond)
/// `at`, `at < before` exactly when `at < m`: `before` rounded up. Backends
/// bind this rather than `before`, whose sub-microsecond part a driver would
/// truncate, missing a subscription expiring in the microsecond `before` falls
/// in.
pub fn expiry_bound_micros(before: DateTime<Utc>) -> i64 {
    let floor = before.timestamp_micros();
    if before.timestamp_subsec_nanos().is_multiple_of(1_000) {
        floor
    } else {
        floor.saturating_add(1)
    }
}

/// The pool a conditional save is held to: at most `limit` subscriptions per
/// owner, serialised per (quota type, owner).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerQuota {
    /// The quota type, as the subscriptions service names it.
    pub quota_type: String,
    /// How many subscriptions the owner may hold.
    pub limit: u64,
}

impl OwnerQuota {
    /// The default quota type of WebSub subscriptions.
    pub const DEFAULT_TYPE: &'static str = "websub_subscriptions";

    /// A quota of the default type.
    pub fn new(limit: u64) -> Self {
        Self {
            quota_type: Self::DEFAULT_TYPE.to_owned(),
            limit,
        }
    }

    /// The name every backend serialises conditional saves on:
    /// `quota:<quota type>:<owner>`.
    pub fn lock_key(&self, owner: &str) -> String {
        format!("quota:{}:{}", self.quota_type, owner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_is_cut_to_its_microsecond() {
        let at = DateTime::from_timestamp(1_700_000_000, 123_456_789).expect("a time");
        let cut = to_micros(at);
        assert_eq!(cut.timestamp(), 1_700_000_000);
        assert_eq!(cut.timestamp_subsec_nanos(), 123_456_000);
        assert_eq!(to_micros(cut), cut);
        let before_epoch = DateTime::from_timestamp(-5, 999_999_999).expect("a time");
        assert_eq!(
            to_micros(before_epoch).timestamp_subsec_nanos(),
            999_999_000
        );
        assert_eq!(to_micros(before_epoch).timestamp(), -5);
    }
}

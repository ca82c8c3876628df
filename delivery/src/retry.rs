//! The retry policy every delivery follows, whichever channel it is on: how
//! many retries a failed delivery gets, how long each waits, and the one
//! decision taken after a failure.

use std::time::Duration;

/// Retries and their waits, under the messaging contract's curve: the first
/// retry is immediate, the last waits `max_backoff`, and the ones in between
/// double towards it. With the defaults (10 retries, 10 s), a dead target is
/// exhausted in about 20 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first failed attempt.
    pub max_retries: u32,
    /// The wait before the last retry.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 10,
            max_backoff: Duration::from_secs(10),
        }
    }
}

/// What follows a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextStep {
    /// Try again after this long.
    RetryAfter(Duration),
    /// No retries left: the delivery stops and keeps its last error.
    GiveUp,
}

impl RetryPolicy {
    /// The wait before retry number `retry` (1-based).
    pub fn backoff(&self, retry: u32) -> Duration {
        if retry <= 1 {
            return Duration::ZERO;
        }
        if retry >= self.max_retries {
            return self.max_backoff;
        }
        let halvings = (self.max_retries - retry).min(31);
        self.max_backoff / 2u32.saturating_pow(halvings)
    }

    /// What follows an attempt that failed after `failures_before` failed
    /// attempts of the same delivery.
    pub fn after_failure(&self, failures_before: u32) -> NextStep {
        let failures = failures_before.saturating_add(1);
        if failures > self.max_retries {
            NextStep::GiveUp
        } else {
            NextStep::RetryAfter(self.backoff(failures))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_follows_the_contract_curve() {
        let policy = RetryPolicy::default();
        let max = policy.max_backoff;
        assert_eq!(policy.backoff(1), Duration::ZERO);
        assert_eq!(policy.backoff(10), max);
        assert_eq!(policy.backoff(9), Duration::from_secs(5));
        assert_eq!(policy.backoff(2), max / 256);
        for retry in 2..10 {
            assert!(policy.backoff(retry) < policy.backoff(retry + 1));
        }
        let total: Duration = (1..=10).map(|retry| policy.backoff(retry)).sum();
        assert!(
            total > Duration::from_secs(19) && total < Duration::from_secs(21),
            "a dead target is exhausted in about 20 s, not {total:?}"
        );
    }

    #[test]
    fn failures_retry_until_the_limit_then_give_up() {
        let policy = RetryPolicy::default();
        assert_eq!(
            policy.after_failure(0),
            NextStep::RetryAfter(Duration::ZERO),
            "the first retry is immediate"
        );
        assert_eq!(
            policy.after_failure(9),
            NextStep::RetryAfter(Duration::from_secs(10))
        );
        assert_eq!(policy.after_failure(10), NextStep::GiveUp);
        assert_eq!(policy.after_failure(u32::MAX), NextStep::GiveUp);
    }

    #[test]
    fn a_policy_without_retries_gives_up_at_once() {
        let policy = RetryPolicy {
            max_retries: 0,
            max_backoff: Duration::from_secs(1),
        };
        assert_eq!(policy.after_failure(0), NextStep::GiveUp);
    }
}

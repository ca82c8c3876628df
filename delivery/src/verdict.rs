//! What an attempt comes to once the retry policy has had its say, decided
//! in one place for every channel, counted, and logged once per failure.

use std::time::Duration;

use tracing::{info, warn};

use crate::Channel;
use crate::attempt::{Answer, status_error};
use crate::metrics::{DeliveryMetrics, InFlight, Tally};
use crate::retry::{NextStep, RetryPolicy};

/// The end of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Delivered.
    Delivered,
    /// The WebSub subscriber answered 410: its subscription ends.
    Gone,
    /// Failed; try again after `wait`.
    Retry {
        /// Why, as recorded.
        error: String,
        /// The backoff before the next attempt.
        wait: Duration,
    },
    /// Failed with no retries left; the delivery keeps its error.
    Exhausted {
        /// Why the last attempt failed.
        error: String,
    },
    /// The hub lacked a resource of its own: try again after `wait`, with
    /// the target's failures not counted.
    Postponed {
        /// Why, as recorded.
        error: String,
        /// How long until it is tried again.
        wait: Duration,
    },
}

/// How long a delivery the hub could not make for want of its own
/// resources waits: long enough for connections to close and memory to be
/// freed, short against any retry backoff.
pub const LOCAL_FAILURE_WAIT: Duration = Duration::from_secs(1);

/// Turns a channel's answers into verdicts under its retry policy.
#[derive(Debug, Clone)]
pub struct Judge {
    channel: Channel,
    retry: RetryPolicy,
    metrics: DeliveryMetrics,
}

impl Judge {
    /// The judge of `channel`, registering its metrics.
    pub fn new(channel: Channel, retry: RetryPolicy) -> Self {
        Self {
            channel,
            retry,
            metrics: DeliveryMetrics::register(channel),
        }
    }

    /// An attempt of this channel starts: it is counted in flight until
    /// [`Self::judge`] has its answer (or it is dropped).
    pub fn attempting(&self) -> InFlight {
        self.metrics.attempting()
    }

    /// The verdict on the answer to `attempt`, whose event was recorded at
    /// `recorded` (see [`Self::verdict`]); the attempt's duration and, when
    /// delivered, the event's latency are measured.
    pub fn judge(
        &self,
        attempt: InFlight,
        recorded: chrono::DateTime<chrono::Utc>,
        answer: Answer,
        failures_before: u32,
    ) -> Verdict {
        let delivered = answer == Answer::Delivered;
        self.metrics.attempted(attempt, recorded, delivered);
        self.verdict(answer, failures_before)
    }

    /// The verdict on `answer` for a delivery that had `failures_before`
    /// failed attempts. Only WebSub gives 410 a meaning of its own; to a
    /// webhook it is a failure like any other status.
    pub fn verdict(&self, answer: Answer, failures_before: u32) -> Verdict {
        let error = match answer {
            Answer::Delivered => return self.counted(Verdict::Delivered),
            Answer::Gone if self.channel == Channel::WebSub => {
                return self.counted(Verdict::Gone);
            }
            Answer::Gone => status_error(http::StatusCode::GONE),
            Answer::Failed(error) => error,
            Answer::Local(error) => {
                warn!(%error, channel = self.channel.label(), "delivery not made for want of the hub's own resources; trying again soon");
                return self.counted(Verdict::Postponed {
                    error,
                    wait: LOCAL_FAILURE_WAIT,
                });
            }
        };
        let failures = failures_before.saturating_add(1);
        let verdict = match self.retry.after_failure(failures_before) {
            NextStep::RetryAfter(wait) => {
                info!(%error, failures, channel = self.channel.label(), "delivery failed; retrying");
                Verdict::Retry { error, wait }
            }
            NextStep::GiveUp => {
                warn!(%error, failures, channel = self.channel.label(), "delivery failed; no retries left");
                Verdict::Exhausted { error }
            }
        };
        self.counted(verdict)
    }

    /// Counts a delivery the scheduler put off without attempting it (its
    /// host could not take it in time).
    pub fn postponed(&self) {
        self.metrics.count(Tally::Postponed);
    }

    fn counted(&self, verdict: Verdict) -> Verdict {
        self.metrics.count(match verdict {
            Verdict::Delivered => Tally::Delivered,
            Verdict::Gone => Tally::Gone,
            Verdict::Retry { .. } => Tally::Retried,
            Verdict::Exhausted { .. } => Tally::Exhausted,
            Verdict::Postponed { .. } => Tally::Postponed,
        });
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gone_ends_only_websub_subscriptions() {
        let websub = Judge::new(Channel::WebSub, RetryPolicy::default());
        let webhook = Judge::new(Channel::Webhook, RetryPolicy::default());
        assert_eq!(websub.verdict(Answer::Gone, 0), Verdict::Gone);
        assert_eq!(
            webhook.verdict(Answer::Gone, 0),
            Verdict::Retry {
                error: "HTTP 410 Gone".to_owned(),
                wait: Duration::ZERO
            }
        );
    }

    #[test]
    fn failures_follow_the_retry_policy() {
        let judge = Judge::new(Channel::Handler, RetryPolicy::default());
        assert_eq!(judge.verdict(Answer::Delivered, 7), Verdict::Delivered);
        assert_eq!(
            judge.verdict(Answer::Failed("boom".to_owned()), 9),
            Verdict::Retry {
                error: "boom".to_owned(),
                wait: Duration::from_secs(10)
            }
        );
        assert_eq!(
            judge.verdict(Answer::Failed("boom".to_owned()), 10),
            Verdict::Exhausted {
                error: "boom".to_owned()
            }
        );
    }
}

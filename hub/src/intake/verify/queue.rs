//! The verification queue: a subscribe or unsubscribe is admitted into the
//! backlog (or refused when too many wait) before its 202, and verifiers
//! claim intents from there, verify, and record the outcome. A callback
//! that could not answer (no connection, a timeout, a 5xx) or a failure on
//! the hub's side is tried again with doubling waits up to the policy's
//! attempts; a refusal, a 4xx, a wrong challenge or a denial is final. The
//! final outcome of a failed intent stays in the backlog, with its error,
//! for the requester and the operator to read.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{GroupCommit, ProcessError, Subscriptions, VerifyError, group_commit};
use crate::delivery::error_chain;
use crate::protocol::SubscriptionRequest;
use crate::storage::backlog::worker::{self, Job};
use crate::storage::backlog::{Admission, Backlog, BacklogError, Intent, IntentResult};

/// Verifications by mode and outcome: `verified`, `retried`, `failed`
/// (given up), `denied` (refused by the hub's policy after confirmation).
pub const VERIFICATIONS_TOTAL: &str = "websub_verifications_total";

/// Attempts to record an outcome while the database is failing, before the
/// claim is left to expire (the intent is then verified again).
const FINISH_TRIES: u32 = 5;

impl Subscriptions {
    /// Writes `request` to the backlog, to be verified, unless the number
    /// waiting has reached the policy's bound, with the requests that
    /// arrive beside it (see `group_commit`).
    /// Returns once it is durable.
    pub async fn accept(&self, request: SubscriptionRequest) -> Result<Admission, BacklogError> {
        let intent = Intent::new(request, self.inner.clock.now());
        let admissions = self.inner.admissions.get_or_init(|| {
            let backlog = self.inner.backlog.clone();
            let bound = self.inner.verifier.policy().max_pending;
            let written = self.inner.written.clone();
            GroupCommit::start(move |intents: Vec<Intent>| {
                let backlog = backlog.clone();
                let written = written.clone();
                async move {
                    match backlog.request_intents(&intents, bound).await {
                        Ok(admissions) => {
                            if admissions.contains(&Admission::Accepted) {
                                written.notify_one();
                            }
                            admissions.into_iter().map(Ok).collect()
                        }
                        Err(error) => group_commit::failed(intents.len(), error),
                    }
                }
            })
        });
        admissions
            .join(intent)
            .await
            .unwrap_or_else(|| Err(group_commit::stopped()))
    }

    /// The backlog the intents wait in.
    pub fn backlog(&self) -> &Arc<dyn Backlog> {
        &self.inner.backlog
    }

    /// Claims and verifies intents until `stop`; the verifications in
    /// flight then go on in [`Subscriptions::tracker`].
    pub async fn run_verifiers(self, stop: CancellationToken) {
        let policy = self.inner.verifier.policy();
        let written = self.inner.written.clone();
        let tracker = self.inner.tracker.clone();
        worker::work(
            Arc::new(Verifiers(self)),
            policy.concurrency,
            written,
            tracker,
            stop,
        )
        .await;
    }

    async fn verify_intent(&self, intent: Intent) {
        let policy = self.inner.verifier.policy();
        let mode = intent.request.mode.as_str();
        let span = tracing::info_span!(
            "verification",
            mode,
            topic = %intent.request.topic,
            callback = %intent.request.callback,
            attempt = intent.attempts + 1,
        );
        let outcome = self.process(intent.request.clone()).await;
        let (result, label) = match outcome {
            Ok(_) => (IntentResult::Done, "verified"),
            Err(error) => {
                let failures = intent.attempts + 1;
                let reason = error_chain(&error);
                if worth_retrying(&error) && failures < policy.attempts {
                    let wait = retry_wait(policy.retry_wait, failures);
                    span.in_scope(|| tracing::info!(?wait, "verification to be tried again"));
                    let at = self.inner.clock.now()
                        + chrono::TimeDelta::from_std(wait).unwrap_or(chrono::TimeDelta::MAX);
                    (IntentResult::Retry { at, error: reason }, "retried")
                } else {
                    let label = if matches!(error, ProcessError::Denied { .. }) {
                        "denied"
                    } else {
                        "failed"
                    };
                    span.in_scope(|| tracing::info!(attempts = failures, "verification given up"));
                    (IntentResult::Failed { error: reason }, label)
                }
            }
        };
        metrics::counter!(VERIFICATIONS_TOTAL, "mode" => mode, "outcome" => label).increment(1);
        self.finish(intent, result).instrument(span).await;
    }

    /// Records how `intent` ended, with the verifications that end beside
    /// it (see [`group_commit`](super::group_commit)).
    async fn finish(&self, intent: Intent, result: IntentResult) {
        let outcomes = self.inner.outcomes.get_or_init(|| {
            let backlog = self.inner.backlog.clone();
            GroupCommit::start(move |finished: Vec<(Intent, IntentResult)>| {
                let backlog = backlog.clone();
                async move {
                    match record(backlog.as_ref(), &finished).await {
                        Ok(()) => finished.iter().map(|_| Ok(())).collect(),
                        Err(error) => group_commit::failed(finished.len(), error),
                    }
                }
            })
        });
        let recorded = outcomes
            .join((intent, result))
            .await
            .unwrap_or_else(|| Err(group_commit::stopped()));
        if let Err(error) = recorded {
            tracing::warn!(%error, "verification outcome not recorded; it will be verified again");
        }
    }
}

/// Writes `finished` to `backlog`, trying again while the database fails.
async fn record(
    backlog: &dyn Backlog,
    finished: &[(Intent, IntentResult)],
) -> Result<(), BacklogError> {
    let mut attempt = 1;
    loop {
        match backlog.finish_intents(finished).await {
            Err(error) if attempt < FINISH_TRIES => {
                tracing::warn!(%error, "recording verifications' outcomes failed; retrying");
                tokio::time::sleep(Duration::from_millis(200) * 2u32.pow(attempt)).await;
                attempt += 1;
            }
            result => return result,
        }
    }
}

/// Whether another attempt could succeed: the callback did not get to
/// answer, answered that it is failing, or the hub failed on its side.
fn worth_retrying(error: &ProcessError) -> bool {
    match error {
        ProcessError::Verification(error) => match error {
            VerifyError::Timeout { .. }
            | VerifyError::Connect { .. }
            | VerifyError::Request { .. }
            | VerifyError::Local(_) => true,
            VerifyError::Status { status } => {
                status.is_server_error() || *status == http::StatusCode::TOO_MANY_REQUESTS
            }
            _ => false,
        },
        ProcessError::Store(_)
        | ProcessError::Quota(_)
        | ProcessError::CatchUp(_)
        | ProcessError::DenyList(_) => true,
        ProcessError::Refused(_) | ProcessError::Denied { .. } => false,
    }
}

/// The wait before retry number `retry` (1-based): `first`, then doubling.
fn retry_wait(first: Duration, retry: u32) -> Duration {
    first.saturating_mul(2u32.saturating_pow(retry.saturating_sub(1).min(16)))
}

/// The claim of an intent outlives every step of one attempt: the
/// verification request, the quota's lookup and a denial notice.
fn visibility(timeout: Duration) -> Duration {
    timeout * 3 + Duration::from_secs(5)
}

struct Verifiers(Subscriptions);

#[async_trait]
impl Job for Verifiers {
    type Item = Intent;

    fn name(&self) -> &'static str {
        "verification"
    }

    async fn claim(&self, limit: usize) -> Result<Vec<Intent>, BacklogError> {
        let inner = &self.0.inner;
        inner
            .backlog
            .claim_intents(
                limit,
                inner.clock.now(),
                visibility(inner.verifier.policy().timeout),
            )
            .await
    }

    async fn run(&self, intent: Intent) {
        self.0.verify_intent(intent).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_wait_twice_as_long_each_time() {
        let first = Duration::from_secs(10);
        assert_eq!(retry_wait(first, 1), Duration::from_secs(10));
        assert_eq!(retry_wait(first, 2), Duration::from_secs(20));
        assert_eq!(retry_wait(first, 3), Duration::from_secs(40));
        assert_eq!(retry_wait(first, 100), first * 65_536);
    }

    #[test]
    fn only_failures_another_attempt_could_mend_are_retried() {
        let status = |code: u16| {
            ProcessError::Verification(VerifyError::Status {
                status: http::StatusCode::from_u16(code).expect("status"),
            })
        };
        assert!(worth_retrying(&status(503)));
        assert!(worth_retrying(&status(429)));
        assert!(!worth_retrying(&status(400)));
        assert!(!worth_retrying(&ProcessError::Verification(
            VerifyError::NotFound
        )));
        assert!(!worth_retrying(&ProcessError::Verification(
            VerifyError::ChallengeMismatch { body_bytes: 3 }
        )));
        assert!(!worth_retrying(&ProcessError::Denied {
            reason: "limit".to_owned()
        }));
    }
}

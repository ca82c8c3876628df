//! One attempt of a claimed record, as a lane's runner makes it: the
//! checks before it goes out (a confirmed unsubscribe, a disabled callback,
//! a record that waited too long, the callback's breaker), the POST through
//! the delivery core, and the outcome the answer makes of it, the breaker
//! told and, on a recovery, what waited for the callback released.

use std::time::Duration;

use tracing::{info, warn};

use websub_store::Subscription;

use super::lanes::Job;
use super::{Distributor, STALE_RECORD_WAIT, SignedWith};
use crate::delivery::Verdict;
use crate::delivery::attempt::{
    self, Answer, Carrier, Request, STANDARD_WEBHOOKS_SCHEME, SignatureScheme, WEBSUB_SCHEME,
};
use crate::delivery::direct::DirectClient;
use crate::delivery::health::{Breaker, Gate, SKIPPED_REASON, Tried};
use crate::delivery::limit::Reply;
use crate::signature::standard_key;
use crate::storage::events::{Attempt, Completion, Outcome, SigningScheme};

impl Distributor {
    /// Makes one attempt of `job`. Returns its completion, how the host
    /// took it (for the lane's limit), and how long the host asked the lane
    /// to pause (`Retry-After` on a `429` or `503`).
    pub(super) async fn attempt(
        &self,
        job: &Job,
        client: &DirectClient,
    ) -> (Completion, Option<Reply>, Option<Duration>) {
        let Job {
            subscription,
            outgoing,
            retry_count,
            ..
        } = job;
        let retry_count = *retry_count;
        if self.inner.unsubscribed.covers(
            &subscription.topic,
            &subscription.callback,
            outgoing.event.created_at,
        ) {
            let completion = Completion {
                event_id: outgoing.event.id,
                subscriber: subscription.callback.clone(),
                outcome: Outcome::Dropped {
                    reason: crate::intake::verify::UNSUBSCRIBED.to_owned(),
                },
                attempt: None,
            };
            return (completion, None, None);
        }
        if self.inner.endpoints.is_disabled(&subscription.callback) {
            let completion = Completion {
                event_id: outgoing.event.id,
                subscriber: subscription.callback.clone(),
                outcome: Outcome::Skipped {
                    reason: SKIPPED_REASON.to_owned(),
                },
                attempt: None,
            };
            return (completion, None, None);
        }
        let Ok(_http_slot) = self.inner.http_slots.acquire().await else {
            return (self.postponed(job, None, Duration::ZERO), None, None);
        };
        if job.is_stale(self.inner.lanes.max_wait()) {
            return (self.postponed(job, None, STALE_RECORD_WAIT), None, None);
        }
        let endpoints = &self.inner.endpoints;
        let gate = endpoints.gate(&subscription.callback, self.inner.clock.now());
        if let Gate::Hold(until) = gate {
            self.inner.judge.postponed();
            let completion = Completion {
                event_id: outgoing.event.id,
                subscriber: subscription.callback.clone(),
                outcome: Outcome::Postponed {
                    error: None,
                    next_attempt_at: until,
                },
                attempt: None,
            };
            return (completion, None, None);
        }
        let (answer, attempted, reply, retry_after) = match &outgoing.headers {
            Ok(headers) => {
                let signed = self.inner.signings.of(subscription, self.inner.clock.now());
                let keys = signed.as_ref().map(|signed| keys_of(signed, subscription));
                let (scheme, secret, previous_secret) = match &keys {
                    None => (
                        &WEBSUB_SCHEME,
                        subscription.secret.as_deref().map(str::as_bytes),
                        None,
                    ),
                    Some((scheme, secret, previous)) => {
                        (*scheme, secret.as_deref(), previous.as_deref())
                    }
                };
                let request = Request {
                    url: &subscription.callback,
                    scheme,
                    content_type: headers.content_type.clone(),
                    event_id: headers.event_id.clone(),
                    body: outgoing.event.body.clone(),
                    secret,
                    previous_secret,
                    headers: &headers.link,
                    parent: outgoing.trace_parent.clone(),
                    resend_count: retry_count,
                };
                let at = self.inner.clock.now();
                let in_flight = self.inner.judge.attempting();
                let attempted = attempt::post(
                    Carrier::Direct(client),
                    request,
                    self.inner.policy.timeout,
                    None,
                )
                .await;
                let took = in_flight.elapsed();
                let reply = Reply::of(&attempted, took);
                let history = Attempt {
                    at,
                    duration_micros: i64::try_from(took.as_micros()).unwrap_or(i64::MAX),
                    status: attempted.status,
                    error: None,
                    response: attempted.response,
                };
                (
                    attempted.answer,
                    Some((in_flight, history)),
                    reply,
                    attempted.retry_after,
                )
            }
            Err(error) => (Answer::Failed(error.clone()), None, None, None),
        };
        let judge = &self.inner.judge;
        let (verdict, history) = match attempted {
            Some((in_flight, history)) => (
                judge.judge(in_flight, outgoing.event.created_at, answer, retry_count),
                Some(history),
            ),
            None => (judge.verdict(answer, retry_count), None),
        };
        let tried = match &verdict {
            Verdict::Delivered | Verdict::Gone => Tried::Succeeded,
            Verdict::Retry { .. } | Verdict::Exhausted { .. } => Tried::Failed,
            Verdict::Postponed { .. } => Tried::Neither,
        };
        let error = match &verdict {
            Verdict::Retry { error, .. } | Verdict::Exhausted { error } => Some(error.as_str()),
            _ => None,
        };
        let now = self.inner.clock.now();
        let breaker = endpoints.tried_because(
            &subscription.callback,
            gate == Gate::Probe,
            tried,
            error,
            now,
        );
        if let Breaker::Recovered(since) = breaker {
            self.release(&subscription.callback, since).await;
        }
        let held_until = match breaker {
            Breaker::Open(until) | Breaker::Opened(until) => Some(until),
            Breaker::Closed | Breaker::Recovered(_) => None,
        };
        let outcome = match verdict {
            // The breaker is open: the failure waits with the rest, its
            // retries not spent.
            Verdict::Retry { error, .. } | Verdict::Exhausted { error } if held_until.is_some() => {
                Outcome::Postponed {
                    error: Some(error),
                    next_attempt_at: held_until.unwrap_or(now),
                }
            }
            Verdict::Delivered => Outcome::Delivered,
            Verdict::Gone => {
                info!("callback answered 410 Gone: removing the subscription");
                if let Err(error) = self
                    .inner
                    .store
                    .delete(&subscription.topic, &subscription.callback)
                    .await
                {
                    warn!(%error, "removing a gone subscription failed");
                }
                self.forget_topic(&subscription.topic);
                Outcome::Dropped {
                    reason: "410 Gone: subscription removed".to_owned(),
                }
            }
            Verdict::Retry { error, wait } => Outcome::Retry {
                error,
                // The host asked for a pause: the retry waits it out too.
                next_attempt_at: self.due_after(wait.max(retry_after.unwrap_or_default())),
            },
            Verdict::Exhausted { error } => Outcome::Exhausted { error },
            Verdict::Postponed { error, wait } => Outcome::Postponed {
                error: Some(error),
                next_attempt_at: self.due_after(wait),
            },
        };
        let completion = Completion {
            event_id: outgoing.event.id,
            subscriber: subscription.callback.clone(),
            outcome,
            attempt: history,
        };
        (completion, reply, retry_after)
    }
}

/// The scheme and keys a subscription with a signing setting is signed
/// with: under Standard Webhooks the `whsec_…` secrets decoded (a secret
/// that does not decode signs nothing, as the API refuses to set one);
/// under WebSub's one header, the current secret's alone.
fn keys_of(
    signed: &SignedWith,
    subscription: &Subscription,
) -> (&'static SignatureScheme, Option<Vec<u8>>, Option<Vec<u8>>) {
    match signed.scheme {
        SigningScheme::WebSub => (
            &WEBSUB_SCHEME,
            subscription
                .secret
                .as_deref()
                .map(|secret| secret.as_bytes().to_vec()),
            None,
        ),
        SigningScheme::StandardWebhooks => (
            &STANDARD_WEBHOOKS_SCHEME,
            subscription
                .secret
                .as_deref()
                .and_then(|secret| standard_key(secret).ok()),
            signed
                .previous_secret
                .as_deref()
                .and_then(|secret| standard_key(secret).ok()),
        ),
    }
}

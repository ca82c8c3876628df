//! Lease renewal: WebSub leases end, so a subscriber that wants content for
//! good asks again before its lease runs out. The renewer watches the leases
//! the receiver recorded from the hub's verifications and re-subscribes each
//! one when a fraction of it has gone.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::client::SubscriberClient;

/// The share of a lease after which it is renewed by default.
pub const DEFAULT_RENEW_FRACTION: f64 = 0.8;

/// The shortest wait before a renewal that got no verification is sent
/// again.
const MIN_RETRY: Duration = Duration::from_secs(1);

/// Re-subscribes the client's active subscriptions before their leases
/// end. Only subscriptions made through this client's hub are renewed;
/// those merely expected ([`Intents::expect`](super::Intents::expect)) are
/// not.
#[derive(Debug, Clone)]
pub struct Renewer {
    client: SubscriberClient,
    fraction: f64,
}

impl Renewer {
    /// A renewer for `client`'s subscriptions, renewing at 80 % of a lease.
    pub fn new(client: SubscriberClient) -> Self {
        Self {
            client,
            fraction: DEFAULT_RENEW_FRACTION,
        }
    }

    /// Renews once `fraction` of a lease has gone, kept within 0.1–0.95 so
    /// a renewal neither floods the hub nor lands after the expiry.
    pub fn at_fraction(mut self, fraction: f64) -> Self {
        self.fraction = if fraction.is_finite() {
            fraction.clamp(0.1, 0.95)
        } else {
            DEFAULT_RENEW_FRACTION
        };
        self
    }

    /// Runs until `stop` is cancelled.
    pub async fn run(self, stop: CancellationToken) {
        let intents = self.client.intents().clone();
        let mut changes = intents.changes();
        loop {
            changes.borrow_and_update();
            let now = Instant::now();
            let (due, next) = intents.due_renewals(self.client.hub(), self.fraction, now);
            for job in due {
                let renewal = job.renewal;
                // If no verification arrives (the hub lost the request, or
                // refused it), try again well before the lease ends.
                let retry = renewal
                    .lease
                    .map_or(MIN_RETRY, |lease| {
                        lease.mul_f64((1.0 - self.fraction) / 4.0)
                    })
                    .max(MIN_RETRY);
                let sent = tokio::select! {
                    () = stop.cancelled() => return,
                    sent = self.client.subscribe(
                        &renewal.topic,
                        &renewal.callback,
                        renewal.lease,
                        job.secret.as_ref().map(|secret| secret.as_str()),
                    ) => sent,
                };
                match sent {
                    Ok(()) => {
                        info!(topic = %renewal.topic, callback = %renewal.callback, "lease renewal requested");
                    }
                    Err(error) => {
                        warn!(topic = %renewal.topic, callback = %renewal.callback, %error, "lease renewal failed; trying again");
                    }
                }
                // Not again before `retry`, unless the verification arrives
                // (it clears this): an answered renewal is sent once, a
                // lost one again.
                intents.renewal_sent(
                    &renewal.topic,
                    &renewal.callback,
                    now,
                    Instant::now() + retry,
                );
            }
            // With nothing due, only a change or the stop wakes it.
            let sleep = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = stop.cancelled() => return,
                _ = changes.changed() => {}
                () = sleep => {}
            }
        }
    }
}

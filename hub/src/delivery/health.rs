//! Endpoint health: deliveries that exhausted their retries are counted
//! against their endpoint (a callback URL, a webhook's name), and an
//! endpoint that exhausts a configured number in a row is disabled. While
//! disabled, its deliveries are recorded as skipped rather than sent (never
//! lost: a replay sends them again), until an operator enables it.
//!
//! The tally lives in the event log, so every replica sees one state and a
//! restart keeps it. Each process keeps a copy of the troubled endpoints
//! (failing or disabled), reloaded every [`HEALTH_REFRESH`]: deciding to
//! skip, and whether a delivery clears failures, costs a set lookup, and a
//! fan-out to healthy endpoints never writes to the tally at all.

use std::collections::HashSet;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::Channel;
use crate::events::{Completion, EndpointRecord, EventLog, EventLogError, Exhaustion, Outcome};

/// `websub_endpoints_disabled_total{channel, by}`: endpoints disabled, by
/// the hub after failures (`by="failures"`) or by an operator
/// (`by="operator"`).
pub const ENDPOINTS_DISABLED_TOTAL: &str = "websub_endpoints_disabled_total";

/// `websub_endpoints_disabled{channel}`: endpoints disabled now.
pub const ENDPOINTS_DISABLED: &str = "websub_endpoints_disabled";

/// How often each process reloads the troubled endpoints, so that one
/// replica's decisions reach the others.
pub const HEALTH_REFRESH: Duration = Duration::from_secs(5);

/// The most troubled endpoints a process keeps; more than this many failing
/// at once and the rest are only seen in the tally.
const TROUBLED_LIMIT: usize = 100_000;

/// Exhausted deliveries in a row before an endpoint is disabled, unless
/// configured otherwise.
pub const DEFAULT_DISABLE_AFTER: u32 = 5;

/// The reason recorded on a skipped delivery.
pub const SKIPPED_REASON: &str = "endpoint disabled";

/// A recorded outcome, as the tally counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tallied<'a> {
    /// Delivered to this endpoint.
    Delivered(&'a str),
    /// Exhausted its retries.
    Exhausted {
        /// The endpoint.
        endpoint: &'a str,
        /// Why the last attempt failed.
        error: &'a str,
    },
}

impl<'a> Tallied<'a> {
    /// How the tally counts a WebSub completion, if it counts at all.
    pub fn of(completion: &'a Completion) -> Option<Self> {
        match &completion.outcome {
            Outcome::Delivered => Some(Self::Delivered(&completion.subscriber)),
            Outcome::Exhausted { error } => Some(Self::Exhausted {
                endpoint: &completion.subscriber,
                error,
            }),
            _ => None,
        }
    }
}

/// One channel's endpoint health. Cheap to clone; clones share state.
#[derive(Debug, Clone)]
pub struct Endpoints {
    inner: Arc<EndpointsState>,
}

#[derive(Debug)]
struct EndpointsState {
    events: Arc<dyn EventLog>,
    channel: Channel,
    disable_after: u32,
    troubled: RwLock<Troubled>,
}

#[derive(Debug, Default)]
struct Troubled {
    disabled: HashSet<String>,
    failing: HashSet<String>,
}

impl Endpoints {
    /// Health of `channel`'s endpoints, tallied in `events`; an endpoint is
    /// disabled after `disable_after` exhausted deliveries in a row (never,
    /// when 0).
    pub fn new(events: Arc<dyn EventLog>, channel: Channel, disable_after: u32) -> Self {
        Self {
            inner: Arc::new(EndpointsState {
                events,
                channel,
                disable_after,
                troubled: RwLock::default(),
            }),
        }
    }

    /// Whether deliveries to `endpoint` are to be skipped.
    pub fn is_disabled(&self, endpoint: &str) -> bool {
        self.read(|troubled| troubled.disabled.contains(endpoint))
    }

    /// Reloads the troubled endpoints from the log.
    pub async fn refresh(&self) -> Result<(), EventLogError> {
        let records = self
            .inner
            .events
            .endpoints(self.inner.channel.label(), TROUBLED_LIMIT)
            .await?;
        let mut loaded = Troubled::default();
        for record in records {
            if record.disabled_at.is_some() {
                loaded.disabled.insert(record.endpoint);
            } else {
                loaded.failing.insert(record.endpoint);
            }
        }
        let disabled = loaded.disabled.len();
        *self.write() = loaded;
        self.gauge(disabled);
        Ok(())
    }

    /// Reloads every [`HEALTH_REFRESH`] until `shutdown`.
    pub async fn keep_fresh(self, shutdown: CancellationToken) {
        loop {
            if let Err(error) = self.refresh().await {
                warn!(%error, channel = self.inner.channel.label(), "reading endpoint health failed");
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(HEALTH_REFRESH) => {}
            }
        }
    }

    /// Counts a batch of recorded outcomes: exhaustions against their
    /// endpoints, deliveries clearing them. Disables (and says so) the
    /// endpoints that reach the threshold.
    pub async fn tally<'a>(
        &self,
        outcomes: impl IntoIterator<Item = Tallied<'a>>,
        now: DateTime<Utc>,
    ) {
        let mut exhausted = Vec::new();
        let mut delivered = Vec::new();
        self.read(|troubled| {
            for outcome in outcomes {
                match outcome {
                    Tallied::Exhausted { endpoint, error } => {
                        exhausted.push(Exhaustion { endpoint, error });
                    }
                    Tallied::Delivered(endpoint) if troubled.failing.contains(endpoint) => {
                        delivered.push(endpoint);
                    }
                    Tallied::Delivered(_) => {}
                }
            }
        });
        if exhausted.is_empty() && delivered.is_empty() {
            return;
        }
        let tallied = self
            .inner
            .events
            .tally_endpoints(
                self.inner.channel.label(),
                &exhausted,
                &delivered,
                self.inner.disable_after,
                now,
            )
            .await;
        let disabled = match tallied {
            Ok(disabled) => disabled,
            Err(error) => {
                warn!(%error, "counting failures against endpoints failed");
                return;
            }
        };
        let mut troubled = self.write();
        for endpoint in &delivered {
            troubled.failing.remove(*endpoint);
        }
        for exhaustion in &exhausted {
            troubled.failing.insert(exhaustion.endpoint.to_owned());
        }
        for endpoint in disabled {
            warn!(
                channel = self.inner.channel.label(),
                endpoint = %endpoint,
                after = self.inner.disable_after,
                "endpoint disabled after {} deliveries in a row exhausted their retries; new \
                 deliveries to it are skipped until an operator enables it",
                self.inner.disable_after,
            );
            metrics::counter!(ENDPOINTS_DISABLED_TOTAL,
                "channel" => self.inner.channel.label(), "by" => "failures")
            .increment(1);
            troubled.failing.remove(&endpoint);
            troubled.disabled.insert(endpoint);
        }
        let count = troubled.disabled.len();
        drop(troubled);
        self.gauge(count);
    }

    /// Disables `endpoint` at an operator's request. Returns whether it was
    /// enabled before.
    pub async fn disable(
        &self,
        endpoint: &str,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, EventLogError> {
        let changed = self
            .inner
            .events
            .set_endpoint_disabled(self.inner.channel.label(), endpoint, Some(reason), now)
            .await?;
        if changed {
            info!(
                channel = self.inner.channel.label(),
                endpoint, reason, "endpoint disabled by an operator"
            );
            metrics::counter!(ENDPOINTS_DISABLED_TOTAL,
                "channel" => self.inner.channel.label(), "by" => "operator")
            .increment(1);
        }
        let count = {
            let mut troubled = self.write();
            troubled.failing.remove(endpoint);
            troubled.disabled.insert(endpoint.to_owned());
            troubled.disabled.len()
        };
        self.gauge(count);
        Ok(changed)
    }

    /// Enables `endpoint` again, its failures cleared. Returns whether it was
    /// disabled or failing before.
    pub async fn enable(&self, endpoint: &str, now: DateTime<Utc>) -> Result<bool, EventLogError> {
        let changed = self
            .inner
            .events
            .set_endpoint_disabled(self.inner.channel.label(), endpoint, None, now)
            .await?;
        if changed {
            info!(
                channel = self.inner.channel.label(),
                endpoint, "endpoint enabled"
            );
        }
        let count = {
            let mut troubled = self.write();
            troubled.failing.remove(endpoint);
            troubled.disabled.remove(endpoint);
            troubled.disabled.len()
        };
        self.gauge(count);
        Ok(changed)
    }

    /// The troubled endpoints as the log has them, disabled first.
    pub async fn list(&self, limit: usize) -> Result<Vec<EndpointRecord>, EventLogError> {
        self.inner
            .events
            .endpoints(self.inner.channel.label(), limit)
            .await
    }

    fn gauge(&self, disabled: usize) {
        metrics::gauge!(ENDPOINTS_DISABLED, "channel" => self.inner.channel.label())
            .set(disabled as f64);
    }

    fn read<T>(&self, read: impl FnOnce(&Troubled) -> T) -> T {
        read(
            &self
                .inner
                .troubled
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        )
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Troubled> {
        self.inner
            .troubled
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

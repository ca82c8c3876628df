//! Endpoint health: deliveries that exhausted their retries are counted
//! against their endpoint (a callback URL, a webhook's name), and an
//! endpoint that exhausts a configured number in a row is disabled (outbox
//! webhooks, when their feed asks for it). While disabled, its deliveries
//! are recorded as skipped rather than sent (never lost: a replay sends
//! them again), until an operator enables it.
//!
//! Beside the tally, each endpoint of a channel that has one has a
//! **breaker** ([`Gate`]), kept by each process for the attempts it makes:
//!
//! - **closed**: deliveries go out; a success clears the failures.
//! - **open**, after `open_after` failed attempts in a row: deliveries
//!   wait, postponed without spending a retry, and failures of attempts
//!   already under way are held the same way. The next real delivery
//!   probes the endpoint, first [`FIRST_PROBE`] after opening, then at
//!   twice the interval each time up to [`LONGEST_PROBE`].
//! - **recovered**: the first successful probe closes it; what waited is
//!   due at once, with the deliveries that ran out of retries while it was
//!   failing (the hub's event log releases what waited on it).
//! - **disabled**: open for `disable_after` (days by default), the
//!   endpoint is disabled as an operator would, until one enables it.
//!
//! Every change of state (failing, open, recovered, disabled, enabled) is
//! counted and kept in the history from one place here, through
//! [`ChangeSink`]: the breaker's changes without waiting for the database,
//! an operator's before the call returns (see [`super::changes`]).
//!
//! The tally lives in the event log, so every replica sees one state and a
//! restart keeps it. Each process keeps a copy of the troubled endpoints
//! (failing or disabled), reloaded every [`HEALTH_REFRESH`]: deciding to
//! skip, and whether a delivery clears failures, costs a set lookup, and a
//! fan-out to healthy endpoints never writes to the tally at all.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::Channel;
use super::changes::{ChangeSink, change, failing_stage, was_failing};
use crate::history::{EndpointState, NewChange};
use crate::state::{EndpointRecord, EndpointStates, EventLogError, Exhaustion};

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

/// The reason recorded on a skipped delivery.
pub const SKIPPED_REASON: &str = "endpoint disabled";

/// Failed attempts in a row that open an endpoint's breaker, unless
/// configured otherwise.
pub const DEFAULT_OPEN_AFTER: u32 = 5;

/// How long an endpoint's breaker stays open before the endpoint is
/// disabled, unless configured otherwise.
pub const DEFAULT_DISABLE_OPEN_AFTER: Duration = Duration::from_secs(3 * 86_400);

/// The first probe of an open endpoint comes this long after it opened.
pub const FIRST_PROBE: Duration = Duration::from_secs(2);

/// Probes of an open endpoint come at most this far apart: a probe is one
/// real delivery, cheap to the endpoint, and an endpoint back from an
/// outage of any length waits at most this long for what it missed.
pub const LONGEST_PROBE: Duration = Duration::from_secs(15);

/// How long a delivery waits while its endpoint's probe is under way.
const HOLD_WHILE_PROBING: Duration = Duration::from_secs(1);

pub use super::changes::ENDPOINT_CHANGES_TOTAL;

/// `websub_endpoints_open{channel}`: endpoints whose breaker is open now,
/// in this process.
pub const ENDPOINTS_OPEN: &str = "websub_endpoints_open";

/// What a delivery to an endpoint may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Go out: the breaker is closed.
    Send,
    /// Go out as the probe of an open breaker.
    Probe,
    /// Wait, postponed until this time, without spending a retry.
    Hold(DateTime<Utc>),
}

/// How an attempt through [`Endpoints::gate`] came out, for the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tried {
    /// The endpoint answered as it should (delivered, or gone).
    Succeeded,
    /// The endpoint failed the attempt (an error status, a timeout, a
    /// refused connection).
    Failed,
    /// Nothing to tell of the endpoint (the hub lacked a resource).
    Neither,
}

/// What the breaker made of an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Breaker {
    /// Closed, and stays so.
    Closed,
    /// Open: a failure is held until this time rather than counted.
    Open(DateTime<Utc>),
    /// This attempt opened it: held until this time.
    Opened(DateTime<Utc>),
    /// This probe closed it; it had been failing since this time.
    Recovered(DateTime<Utc>),
}

/// The breaker state of one endpoint, in this process.
#[derive(Debug, Clone)]
struct Circuit {
    failures: u32,
    failing_since: DateTime<Utc>,
    open: Option<Opened>,
}

#[derive(Debug, Clone)]
struct Opened {
    at: DateTime<Utc>,
    probe_at: DateTime<Utc>,
    interval: Duration,
    probing: bool,
}

/// When the breakers open and give up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerPolicy {
    /// Failed attempts in a row that open a breaker; 0: never.
    pub open_after: u32,
    /// How long a breaker stays open before its endpoint is disabled;
    /// zero: never.
    pub disable_after: Duration,
}

impl BreakerPolicy {
    /// No breaker: every failure is counted against its delivery's retries.
    pub const NONE: Self = Self {
        open_after: 0,
        disable_after: Duration::ZERO,
    };
}

impl Default for BreakerPolicy {
    fn default() -> Self {
        Self {
            open_after: DEFAULT_OPEN_AFTER,
            disable_after: DEFAULT_DISABLE_OPEN_AFTER,
        }
    }
}

fn later(at: DateTime<Utc>, wait: Duration) -> DateTime<Utc> {
    at + chrono::Duration::from_std(wait).unwrap_or(chrono::Duration::MAX)
}

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

/// One channel's endpoint health. Cheap to clone; clones share state.
#[derive(Debug, Clone)]
pub struct Endpoints {
    inner: Arc<EndpointsState>,
}

#[derive(Debug)]
struct EndpointsState {
    events: Arc<dyn EndpointStates>,
    channel: Channel,
    disable_after: u32,
    troubled: RwLock<Troubled>,
    breaker: BreakerPolicy,
    /// Endpoints with failures in a row, in this process; bounded by
    /// [`TROUBLED_LIMIT`].
    circuits: Mutex<HashMap<String, Circuit>>,
    /// Where state changes are kept.
    changes: ChangeSink,
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
    pub fn new(events: Arc<dyn EndpointStates>, channel: Channel, disable_after: u32) -> Self {
        Self::with_breakers(events, channel, disable_after, BreakerPolicy::NONE)
    }

    /// The same, with a breaker per endpoint under `breaker`.
    pub fn with_breakers(
        events: Arc<dyn EndpointStates>,
        channel: Channel,
        disable_after: u32,
        breaker: BreakerPolicy,
    ) -> Self {
        let changes = ChangeSink::new(events.clone());
        Self {
            inner: Arc::new(EndpointsState {
                events,
                channel,
                disable_after,
                troubled: RwLock::default(),
                breaker,
                circuits: Mutex::default(),
                changes,
            }),
        }
    }

    /// What a delivery to `endpoint` may do at `now`: see [`Gate`]. A
    /// [`Gate::Probe`] must be followed by [`Self::tried`].
    pub fn gate(&self, endpoint: &str, now: DateTime<Utc>) -> Gate {
        if self.inner.breaker.open_after == 0 {
            return Gate::Send;
        }
        let mut circuits = self.circuits();
        let Some(open) = circuits
            .get_mut(endpoint)
            .and_then(|circuit| circuit.open.as_mut())
        else {
            return Gate::Send;
        };
        if open.probing {
            // The probe's answer may close the breaker any moment: look
            // again soon rather than a whole round later, or a delivery
            // held just before the recovery would miss it.
            return Gate::Hold(later(now, HOLD_WHILE_PROBING));
        }
        if now < open.probe_at {
            return Gate::Hold(open.probe_at);
        }
        open.probing = true;
        Gate::Probe
    }

    /// Tells the breaker of `endpoint` how an attempt let through by
    /// [`Self::gate`] (`probe` if it was the probe) came out at `now`.
    pub fn tried(&self, endpoint: &str, probe: bool, tried: Tried, now: DateTime<Utc>) -> Breaker {
        self.tried_because(endpoint, probe, tried, None, now)
    }

    /// The same, with why the attempt failed (`error`), kept with the
    /// change it may make.
    pub fn tried_because(
        &self,
        endpoint: &str,
        probe: bool,
        tried: Tried,
        error: Option<&str>,
        now: DateTime<Utc>,
    ) -> Breaker {
        let policy = self.inner.breaker;
        if policy.open_after == 0 {
            return Breaker::Closed;
        }
        let mut circuits = self.circuits();
        // What this attempt made of the breaker, with the failures in a row
        // and since when, for the change it may record.
        let (change, failures, since) = match (tried, circuits.get_mut(endpoint)) {
            (Tried::Neither, circuit) => {
                if probe && let Some(open) = circuit.and_then(|circuit| circuit.open.as_mut()) {
                    open.probing = false;
                }
                return Breaker::Closed;
            }
            (Tried::Succeeded, None) => return Breaker::Closed,
            (Tried::Succeeded, Some(circuit)) => {
                // An attempt that was under way when the breaker opened
                // says as much as a probe.
                let since = circuit.failing_since;
                let failures = circuit.failures;
                let was_open = circuit.open.is_some();
                circuits.remove(endpoint);
                if was_open {
                    (Breaker::Recovered(since), failures, since)
                } else if !was_failing(failures, policy.open_after) {
                    // A blip: no failing change was recorded for it.
                    return Breaker::Closed;
                } else {
                    // Failing, not open: nothing waited, but the history
                    // says it answers again.
                    drop(circuits);
                    let mut recovered = self.change(endpoint, EndpointState::Recovered, now);
                    recovered.failures = Some(failures);
                    recovered.since = Some(since);
                    self.inner.changes.record(recovered);
                    return Breaker::Closed;
                }
            }
            (Tried::Failed, None) => {
                if circuits.len() >= TROUBLED_LIMIT {
                    return Breaker::Closed;
                }
                let circuit = circuits.entry(endpoint.to_owned()).or_insert(Circuit {
                    failures: 0,
                    failing_since: now,
                    open: None,
                });
                let change = Self::failed(circuit, policy, probe, now);
                (change, circuit.failures, circuit.failing_since)
            }
            (Tried::Failed, Some(circuit)) => {
                let change = Self::failed(circuit, policy, probe, now);
                (change, circuit.failures, circuit.failing_since)
            }
        };
        // Counted only when a breaker opens or closes: a failure of an
        // endpoint already open changes nothing, and walking every circuit
        // per failed attempt would cost a dead endpoint's whole backlog.
        if matches!(change, Breaker::Opened(_) | Breaker::Recovered(_)) {
            let open = circuits
                .values()
                .filter(|circuit| circuit.open.is_some())
                .count();
            metrics::gauge!(ENDPOINTS_OPEN, "channel" => self.inner.channel.label())
                .set(open as f64);
        }
        drop(circuits);
        let channel = self.inner.channel.label();
        let to = match change {
            Breaker::Opened(probe_at) => {
                warn!(channel, endpoint, %probe_at, "endpoint keeps failing: its deliveries wait, and the next one probes it");
                EndpointState::Open
            }
            Breaker::Recovered(since) => {
                info!(channel, endpoint, failing_since = %since, "endpoint recovered: what waited is sent");
                EndpointState::Recovered
            }
            Breaker::Closed
                if tried == Tried::Failed && failing_stage(failures, policy.open_after) =>
            {
                EndpointState::Failing
            }
            Breaker::Closed | Breaker::Open(_) => return change,
        };
        let mut recorded = self.change(endpoint, to, now);
        recorded.failures = Some(failures);
        recorded.since = Some(since);
        recorded.reason = error.map(str::to_owned);
        self.inner.changes.record(recorded);
        change
    }

    /// A change of `endpoint` to `to` at `now`, as the breaker makes it.
    fn change(&self, endpoint: &str, to: EndpointState, now: DateTime<Utc>) -> NewChange {
        change(self.inner.channel.label(), endpoint, to, now, "breaker")
    }

    fn failed(
        circuit: &mut Circuit,
        policy: BreakerPolicy,
        probe: bool,
        now: DateTime<Utc>,
    ) -> Breaker {
        circuit.failures = circuit.failures.saturating_add(1);
        match &mut circuit.open {
            Some(open) => {
                if probe {
                    open.probing = false;
                    open.interval = (open.interval * 2).min(LONGEST_PROBE);
                    open.probe_at = later(now, open.interval);
                }
                Breaker::Open(open.probe_at.max(now))
            }
            None if circuit.failures >= policy.open_after => {
                let probe_at = later(now, FIRST_PROBE);
                circuit.open = Some(Opened {
                    at: now,
                    probe_at,
                    interval: FIRST_PROBE,
                    probing: false,
                });
                Breaker::Opened(probe_at)
            }
            None => Breaker::Closed,
        }
    }

    /// The endpoints whose breaker has been open longer than the policy
    /// allows at `now`: each is forgotten here, for the caller to disable.
    fn open_too_long(&self, now: DateTime<Utc>) -> Vec<(String, DateTime<Utc>)> {
        let limit = self.inner.breaker.disable_after;
        if limit.is_zero() {
            return Vec::new();
        }
        let mut circuits = self.circuits();
        let expired: Vec<(String, DateTime<Utc>)> = circuits
            .iter()
            .filter_map(|(endpoint, circuit)| {
                let open = circuit.open.as_ref()?;
                (later(open.at, limit) <= now).then(|| (endpoint.clone(), circuit.failing_since))
            })
            .collect();
        for (endpoint, _) in &expired {
            circuits.remove(endpoint);
        }
        expired
    }

    /// Whether `endpoint`'s breaker is open in this process.
    pub fn is_open(&self, endpoint: &str) -> bool {
        self.circuits()
            .get(endpoint)
            .is_some_and(|circuit| circuit.open.is_some())
    }

    fn circuits(&self) -> std::sync::MutexGuard<'_, HashMap<String, Circuit>> {
        self.inner
            .circuits
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
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
        let channel = self.inner.channel.label();
        // Without a breaker, the tally is what tells an endpoint failing
        // (its first delivery out of retries) and recovered (delivered
        // again); with one, the breaker tells it attempt by attempt.
        let tallied_changes = self.inner.breaker.open_after == 0;
        let mut changes = Vec::new();
        let mut troubled = self.write();
        for endpoint in &delivered {
            if troubled.failing.remove(*endpoint) && tallied_changes {
                changes.push(change(
                    channel,
                    endpoint,
                    EndpointState::Recovered,
                    now,
                    "tally",
                ));
            }
        }
        for exhaustion in &exhausted {
            let endpoint = exhaustion.endpoint;
            if troubled.failing.insert(endpoint.to_owned())
                && tallied_changes
                && !troubled.disabled.contains(endpoint)
            {
                let in_batch = exhausted
                    .iter()
                    .filter(|other| other.endpoint == endpoint)
                    .count();
                let mut failing = change(channel, endpoint, EndpointState::Failing, now, "tally");
                failing.failures = u32::try_from(in_batch).ok();
                failing.reason = Some(exhaustion.error.to_owned());
                changes.push(failing);
            }
        }
        for endpoint in disabled {
            let mut change = change(channel, &endpoint, EndpointState::Disabled, now, "tally");
            change.failures = Some(self.inner.disable_after);
            change.reason = Some(format!(
                "{} deliveries in a row exhausted their retries",
                self.inner.disable_after
            ));
            changes.push(change);
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
        for change in changes {
            self.inner.changes.record(change);
        }
    }

    /// Disables `endpoint` at an operator's request. Returns whether it was
    /// enabled before.
    pub async fn disable(
        &self,
        endpoint: &str,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, EventLogError> {
        self.disable_by(endpoint, reason, "operator", None, now)
            .await
    }

    /// Disables every endpoint whose breaker has stayed open longer than
    /// the policy allows at `now` (see `open_too_long`).
    pub async fn disable_long_outages(&self, now: DateTime<Utc>) {
        for (endpoint, since) in self.open_too_long(now) {
            let reason = format!("failing since {}", since.to_rfc3339());
            match self
                .disable_by(&endpoint, &reason, "outage", Some(since), now)
                .await
            {
                Ok(_) => {
                    warn!(channel = self.inner.channel.label(), endpoint, %since, "endpoint disabled after a long outage; its deliveries are skipped until an operator enables it");
                }
                Err(error) => {
                    warn!(%error, endpoint, "disabling an endpoint after a long outage failed")
                }
            }
        }
    }

    async fn disable_by(
        &self,
        endpoint: &str,
        reason: &str,
        by: &'static str,
        since: Option<DateTime<Utc>>,
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
                endpoint, reason, by, "endpoint disabled"
            );
            metrics::counter!(ENDPOINTS_DISABLED_TOTAL,
                "channel" => self.inner.channel.label(), "by" => by)
            .increment(1);
            let mut change = change(
                self.inner.channel.label(),
                endpoint,
                EndpointState::Disabled,
                now,
                by,
            );
            change.since = since;
            change.reason = Some(reason.to_owned());
            self.inner.changes.record_now(change).await;
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
        self.circuits().remove(endpoint);
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
            let change = change(
                self.inner.channel.label(),
                endpoint,
                EndpointState::Enabled,
                now,
                "operator",
            );
            self.inner.changes.record_now(change).await;
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

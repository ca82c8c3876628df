//! The WebSub scheduler: expands the events of the hub's own log into one
//! delivery record per subscription of their topic, claims due records, and
//! hands each attempt to the delivery core ([`crate::delivery`]), which
//! POSTs it and judges the answer; the outcome — delivered, retried with
//! backoff, exhausted, or dropped — is written back through the core's
//! recorder. The callback host is the unit of scheduling: each has a lane
//! (`lanes`) with its own claims, queue and adaptive in-flight limit, so
//! many subscriptions share a host and one slow host never takes every slot.
//!
//! Delivery is at least once. A record is claimed before its attempt and
//! completed after it; a process killed in between leaves a claim that is
//! taken over: at once by its successor on a log only one process uses
//! (SQLite); within seconds by a live replica on PostgreSQL, once the dead
//! one's heartbeat stops ([`crate::storage::replicas`]); after the visibility
//! timeout for an attempt that hangs in a live process. A first attempt needs
//! no separate claim when its lane has room: the expander writes its record
//! already claimed and hands it straight to the attempts; the records a
//! lane has no room for are written unclaimed and claimed for that lane as
//! it frees room, in due order, with retries and the records another
//! process left. Nothing is written back to make room. On a log only one
//! process uses (SQLite) a fresh expansion writes nothing up front: its
//! records are held in memory (`held`) and each is written with its
//! first outcome. One slow or dead
//! subscriber never delays another: attempts run concurrently, bounded
//! overall and per lane, and each carries its own timeout.

mod cache;
mod expand;
mod held;
mod lanes;
mod ordered;
mod outcomes;
mod send;
mod signing;
mod unsubscribed;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, debug_span, info, warn};
use uuid::Uuid;
use websub_store::{Subscription, SubscriptionStore};

use crate::clock::Clock;
use crate::config::DeliveryPolicy;
use crate::delivery::direct::DirectClient;
use crate::delivery::pool::HostClients;
use crate::delivery::recorder;
use crate::delivery::{Channel, Endpoints, Judge};
use crate::protocol::iri_to_uri;
use crate::storage::events::{Claimed, Completion, EventLog, EventLogError, Outcome};

pub use crate::delivery::limit::INITIAL_LIMIT;
pub use cache::SUBSCRIBERS_TTL;
use cache::{EventCache, Outgoing, SubscriberCache, Subscribers};
use held::Held;
use lanes::{Admission, Ask, Job, Lanes, Next};
pub use lanes::{is_ordered_lane, lane_of, ordered_lane_of};
use ordered::Ordered;
pub use ordered::{ORDERED_LIMIT, ORDERED_REFRESH};
use outcomes::{LogOutcomes, batching};
pub use signing::{SIGNING_LIMIT, SignedWith};
use unsubscribed::Unsubscribed;

/// The WebSub scheduler. Cheap to clone; clones share state.
#[derive(Debug, Clone)]
pub struct Distributor {
    inner: Arc<DistributorState>,
}

#[derive(Debug)]
struct DistributorState {
    events: Arc<dyn EventLog>,
    store: Arc<dyn SubscriptionStore>,
    hub_url: String,
    policy: DeliveryPolicy,
    poll_interval: Duration,
    clock: Arc<dyn Clock>,
    wake: Notify,
    /// Asks the expander to look for unexpanded events.
    expand: Notify,
    /// Signalled whenever an attempt finishes and frees a slot.
    room: Notify,
    /// Deliveries on the network at once.
    http_slots: Semaphore,
    bodies: EventCache,
    subscribers: SubscriberCache,
    judge: Judge,
    endpoints: Endpoints,
    lanes: Lanes,
    unsubscribed: Unsubscribed,
    ordered: Ordered,
    signings: signing::Signings,
    /// Records held in memory until their first outcome, on a log only one
    /// process uses.
    held: Held,
}

/// What the claim loop and the expander share to start attempts.
#[derive(Debug, Clone)]
struct Pipeline {
    /// One permit per record claimed and not yet through its attempt: the
    /// attempts in flight plus the records waiting in their lanes' queues,
    /// a bound over all lanes besides each lane's own. A record waits at
    /// most [`host_wait`], far inside the visibility timeout.
    pending: Arc<Semaphore>,
    attempts: TaskTracker,
    /// Once cancelled, records still waiting go back to the log instead of
    /// being attempted.
    shutdown: CancellationToken,
    /// The outcomes of records in the log; see [`Pipeline::record`].
    completed: mpsc::UnboundedSender<Completion>,
    /// The outcomes of records held in memory, which create their records.
    completed_unwritten: mpsc::UnboundedSender<Completion>,
    /// How much room a claim waits for, and the size of an expanded part.
    /// Each costs a round trip whatever its size, so they are made for half
    /// the queue at a time rather than one record per finished attempt.
    batch: usize,
    /// Set when the claim loop found less room than a batch: the runner
    /// that brings it back to a batch wakes the loop, once.
    starved: Arc<AtomicBool>,
}

impl Pipeline {
    /// Sends `completion` to its recorder: when `unwritten` (its record is
    /// held in memory), to the one that creates the record with it.
    fn record(&self, completion: Completion, unwritten: bool) {
        let recorder = if unwritten {
            &self.completed_unwritten
        } else {
            &self.completed
        };
        let _ = recorder.send(completion);
    }
}

impl Distributor {
    /// A scheduler delivering `events` to the subscriptions in `store`,
    /// announcing `hub_url` in its `Link` headers.
    pub fn new(
        events: Arc<dyn EventLog>,
        store: Arc<dyn SubscriptionStore>,
        clients: HostClients,
        hub_url: String,
        policy: DeliveryPolicy,
        poll_interval: Duration,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let endpoints = Endpoints::with_breakers(
            events.clone(),
            Channel::WebSub,
            policy.disable_endpoint_after,
            policy.breaker,
        );
        Self {
            inner: Arc::new(DistributorState {
                endpoints,
                events,
                store,
                hub_url,
                policy,
                poll_interval,
                clock,
                wake: Notify::new(),
                expand: Notify::new(),
                room: Notify::new(),
                http_slots: Semaphore::new(policy.concurrency),
                bodies: EventCache::new(256),
                subscribers: SubscriberCache::default(),
                judge: Judge::new(Channel::WebSub, policy.retry),
                unsubscribed: Unsubscribed::default(),
                ordered: Ordered::default(),
                signings: signing::Signings::default(),
                held: Held::default(),
                lanes: Lanes::new(
                    policy.per_host_min,
                    policy.per_host,
                    policy.per_host_rate,
                    host_wait(&policy),
                    clients,
                ),
            }),
        }
    }

    /// Tells the dispatcher there is new work (an event recorded), so it does
    /// not wait for its next poll.
    pub fn wake(&self) {
        self.inner.wake.notify_one();
    }

    /// The health of the callbacks this scheduler delivers to.
    pub fn endpoints(&self) -> &Endpoints {
        &self.inner.endpoints
    }

    /// `callback` answered its unsubscribe verification from `topic` at
    /// `since` (`None`: it is subscribed again): attempts of the topic's
    /// events recorded since are dropped from now on.
    pub fn set_unsubscribed(
        &self,
        topic: &str,
        callback: &str,
        since: Option<chrono::DateTime<chrono::Utc>>,
    ) {
        self.inner
            .unsubscribed
            .set(topic, callback, since, self.inner.clock.now());
    }

    /// Asks for ordered delivery to the subscription of `callback` to
    /// `topic`, or takes the request back: kept in the log, and in force in
    /// this process at once (in other replicas within
    /// [`ORDERED_REFRESH`]). Records already written keep the order they
    /// were written with.
    pub async fn set_ordered(
        &self,
        topic: &str,
        callback: &str,
        ordered: bool,
    ) -> Result<(), EventLogError> {
        let now = self.inner.clock.now();
        self.inner
            .events
            .set_ordered(topic, callback, ordered, now)
            .await?;
        // A request already known keeps its time here as in the log; one
        // only another replica knew is read with its own at the next
        // refresh.
        self.inner
            .ordered
            .set(topic, callback, ordered.then_some(now));
        Ok(())
    }

    /// Reads again the subscriptions' settings kept in the log (ordered
    /// delivery, signing), as other replicas may have changed them. What
    /// fails to read stays as it was, and is read again with the lanes.
    async fn read_settings(&self) {
        if let Err(error) = self.inner.ordered.refresh(&*self.inner.events).await {
            warn!(%error, "reading the requests for ordered delivery failed");
        }
        if let Err(error) = self.inner.signings.refresh(&*self.inner.events).await {
            warn!(%error, "reading the subscriptions' signing failed");
        }
    }

    /// Whether `subscription` gets its events in order.
    pub fn is_ordered(&self, subscription: &Subscription) -> bool {
        self.inner.ordered.is_ordered(subscription)
    }

    /// Forgets the cached subscribers of `topic`: a subscription to it was
    /// saved or deleted here, and the next delivery must see that.
    pub fn forget_topic(&self, topic: &str) {
        self.inner.subscribers.forget(topic);
    }

    /// Runs until `shutdown` is cancelled, then waits for the attempts in
    /// flight and records their outcomes before returning.
    pub async fn run(self, shutdown: CancellationToken) {
        let policy = self.inner.policy;
        let (completed, completions) = mpsc::unbounded_channel();
        let (completed_unwritten, unwritten_completions) = mpsc::unbounded_channel();
        let pipeline = Pipeline {
            pending: Arc::new(Semaphore::new(policy.concurrency + waiting_room(&policy))),
            attempts: TaskTracker::new(),
            shutdown: shutdown.clone(),
            completed,
            completed_unwritten,
            batch: (policy.batch_size / 2).max(1),
            starved: Arc::new(AtomicBool::new(false)),
        };
        let recorders = [(completions, false), (unwritten_completions, true)].map(
            |(completions, unwritten)| {
                tokio::spawn(recorder::record(
                    LogOutcomes {
                        distributor: self.clone(),
                        unwritten,
                    },
                    completions,
                    batching(&policy, &*self.inner.events),
                ))
            },
        );
        let expander = tokio::spawn(
            self.clone()
                .run_expander(pipeline.clone(), shutdown.clone()),
        );
        let health = tokio::spawn(self.inner.endpoints.clone().keep_fresh(shutdown.clone()));
        self.read_settings().await;
        match self.inner.events.release_claims().await {
            Ok(0) => {}
            Ok(released) => info!(released, "took over the claims of the process before"),
            Err(error) => warn!(%error, "taking over the claims of the process before failed"),
        }
        self.expand_soon();
        let mut walked: Option<Instant> = None;
        let mut settings_read = Instant::now();
        while !shutdown.is_cancelled() {
            if walked.is_none_or(|at| at.elapsed() >= self.inner.poll_interval) {
                if settings_read.elapsed() >= ORDERED_REFRESH {
                    self.read_settings().await;
                    settings_read = Instant::now();
                }
                self.walk_lanes().await;
                walked = Some(Instant::now());
            }
            let now = self.inner.clock.now();
            let budget = pipeline.pending.available_permits();
            if budget < pipeline.batch {
                pipeline.starved.store(true, Ordering::Release);
            }
            if self.holds_records() {
                let overdue = self.inner.held.overdue(Instant::now());
                if !overdue.is_empty() {
                    self.write_held(overdue).await;
                }
            }
            let asks = if budget == 0 {
                Vec::new()
            } else {
                self.inner.lanes.reserve(now, budget)
            };
            if asks.is_empty() {
                let sleep = self
                    .inner
                    .lanes
                    .next_due(now)
                    .and_then(|due| (due - now).to_std().ok())
                    .map_or(self.inner.poll_interval, |until| {
                        until.min(self.inner.poll_interval)
                    });
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = self.inner.room.notified() => {}
                    () = self.inner.wake.notified() => self.expand_soon(),
                    () = tokio::time::sleep(sleep) => self.expand_soon(),
                }
                continue;
            }
            self.claim_for(asks, now, &pipeline).await;
        }
        if let Err(error) = expander.await {
            warn!(%error, "the expander stopped abnormally");
        }
        let _ = health.await;
        let Pipeline {
            attempts,
            completed,
            completed_unwritten,
            ..
        } = pipeline;
        attempts.close();
        attempts.wait().await;
        drop((completed, completed_unwritten));
        for recorder in recorders {
            if let Err(error) = recorder.await {
                warn!(%error, "the outcome recorder stopped abnormally");
            }
        }
    }

    /// Claims the records `asks` want and starts their attempts.
    async fn claim_for(
        &self,
        asks: Vec<Ask>,
        now: chrono::DateTime<chrono::Utc>,
        pipeline: &Pipeline,
    ) {
        let (lines, mut hosts): (Vec<Ask>, Vec<Ask>) =
            asks.into_iter().partition(|ask| is_ordered_lane(&ask.lane));
        if self.holds_records() {
            hosts = self.take_held(hosts, pipeline).await;
        }
        for (asks, ordered) in [(hosts, false), (lines, true)] {
            if !asks.is_empty() {
                self.claim_lanes(asks, ordered, now, pipeline).await;
            }
        }
    }

    /// Claims for `asks`, the lanes of hosts or (`ordered`) the lines of
    /// ordered subscriptions, and starts the attempts.
    async fn claim_lanes(
        &self,
        asks: Vec<Ask>,
        ordered: bool,
        now: chrono::DateTime<chrono::Utc>,
        pipeline: &Pipeline,
    ) {
        let visibility = self.inner.policy.visibility_timeout;
        let claimed = if ordered {
            let wanted: Vec<&str> = asks.iter().map(|ask| &*ask.lane).collect();
            self.inner
                .events
                .claim_ordered(&wanted, now, visibility)
                .await
        } else {
            let wanted: Vec<(&str, usize)> =
                asks.iter().map(|ask| (&*ask.lane, ask.count)).collect();
            self.inner
                .events
                .claim_lanes(&wanted, now, visibility)
                .await
        };
        let lane_of_claim = |claim: &Claimed| -> Arc<str> {
            if ordered {
                Arc::from(ordered_lane_of(&claim.subscriber))
            } else {
                Arc::from(lane_of(&claim.subscriber))
            }
        };
        let claimed = match claimed {
            Ok(claimed) => {
                let claimed: Vec<(Claimed, Arc<str>)> = claimed
                    .into_iter()
                    .map(|claim| {
                        let lane = lane_of_claim(&claim);
                        (claim, lane)
                    })
                    .collect();
                let mut got: HashMap<&str, usize> = HashMap::new();
                for (_, lane) in &claimed {
                    *got.entry(lane).or_default() += 1;
                }
                self.inner.lanes.claimed(&asks, Some(&got));
                claimed
            }
            Err(error) => {
                warn!(%error, "claiming deliveries failed; retrying at the next poll");
                self.inner.lanes.claimed(&asks, None);
                tokio::time::sleep(self.inner.poll_interval).await;
                return;
            }
        };
        debug!(claimed = claimed.len(), lanes = asks.len(), "claimed");
        if !claimed.is_empty()
            && let Err(error) = self.start_attempts(claimed, pipeline).await
        {
            warn!(%error, "preparing deliveries failed; they are retried after the visibility timeout");
        }
    }

    /// Reads which lanes hold due records in the log: what this process did
    /// not write itself (records of a process that died, of another
    /// replica, retries from before a restart). Disables, on the way, the
    /// callbacks whose breaker stayed open too long.
    async fn walk_lanes(&self) {
        self.inner
            .endpoints
            .disable_long_outages(self.inner.clock.now())
            .await;
        match self.inner.events.due_lanes(WALKED_LANES).await {
            Ok(found) => {
                for (lane, due) in found {
                    self.inner.lanes.mark_due(&lane, due);
                }
            }
            Err(error) => warn!(%error, "reading the lanes with due deliveries failed"),
        }
    }

    async fn start_attempts(
        &self,
        claimed: Vec<(Claimed, Arc<str>)>,
        pipeline: &Pipeline,
    ) -> Result<(), DispatchError> {
        // Per topic: its subscribers, and whether they were read for this
        // batch (then a missing callback is really gone). A topic with few
        // records here and no cached list (retries, records put off, a
        // replica's leftovers) has just those subscriptions read: listing a
        // topic of 100 000 for a handful of records would cost seconds.
        let mut callbacks_by_topic: HashMap<&str, Vec<&str>> = HashMap::new();
        for (claim, _) in &claimed {
            callbacks_by_topic
                .entry(&claim.topic)
                .or_default()
                .push(&claim.subscriber);
        }
        let mut subscribers: HashMap<String, (Arc<Subscribers>, bool)> = HashMap::new();
        for (topic, callbacks) in callbacks_by_topic {
            let known = match self.inner.subscribers.get(topic) {
                Some(cached) => (cached, false),
                None if callbacks.len() <= POINT_READS => {
                    (Arc::new(self.read_each(topic, &callbacks).await?), true)
                }
                None => self.subscribers(topic, true).await?,
            };
            subscribers.insert(topic.to_owned(), known);
        }
        let mut events: HashMap<Uuid, Arc<Outgoing>> = HashMap::new();
        for (claim, _) in &claimed {
            // Every claimed topic was read above.
            let Some((known, fresh)) = subscribers.get(&claim.topic).cloned() else {
                continue;
            };
            if !fresh && known.get(&claim.subscriber).is_none() {
                // Subscribed after the cached list was read: read it again
                // rather than drop a delivery the expansion wrote for it.
                let refreshed = self.subscribers(&claim.topic, true).await?;
                subscribers.insert(claim.topic.clone(), refreshed);
            }
            if let std::collections::hash_map::Entry::Vacant(slot) = events.entry(claim.event_id)
                && let Some(event) = self.event(claim.event_id).await?
            {
                slot.insert(event);
            }
        }

        let now = self.inner.clock.now();
        for (claim, lane) in claimed {
            let subscription = subscribers
                .get(&claim.topic)
                .and_then(|(known, _)| known.get(&claim.subscriber))
                .cloned();
            let event = events.get(&claim.event_id).cloned();
            let (subscription, event) = match (subscription, event) {
                (Some(subscription), _) if subscription.is_expired(now) => {
                    pipeline.record(dropped(&claim, LEASE_EXPIRED), false);
                    continue;
                }
                (Some(subscription), Some(event)) => (subscription, event),
                (None, _) => {
                    pipeline.record(dropped(&claim, "no longer subscribed"), false);
                    continue;
                }
                (Some(_), None) => {
                    pipeline.record(dropped(&claim, "the event was purged"), false);
                    continue;
                }
            };
            let Ok(permit) = pipeline.pending.clone().acquire_owned().await else {
                return Ok(());
            };
            let job = Job::new(permit, (event, subscription), claim.retry_count, false);
            self.enqueue(pipeline, &lane, job);
        }
        Ok(())
    }

    /// Hands `job` to `lane`, whose permit is held until its outcome is
    /// sent; starts a runner for the lane if it has a free slot.
    fn enqueue(&self, pipeline: &Pipeline, lane: &str, job: Job) {
        match self.inner.lanes.admit(lane, job) {
            Admission::Run(lane, job, client) => {
                let runner = self.clone().run_lane(pipeline.clone(), lane, job, client);
                pipeline.attempts.spawn(runner);
            }
            Admission::Queued => {}
            Admission::Paused(job, wait) => {
                let completion = self.postponed(&job, None, wait);
                self.finish(pipeline, completion, job);
            }
        }
    }

    /// One runner of `lane`: attempts `job`, then the lane's next records
    /// while its limit allows. Records that waited too long, or are still
    /// waiting at shutdown or while the lane is paused, go back to the log
    /// postponed.
    async fn run_lane(
        self,
        pipeline: Pipeline,
        lane: Arc<str>,
        mut job: Job,
        client: DirectClient,
    ) {
        let mut stale = Vec::new();
        loop {
            let (completion, reply) = if pipeline.shutdown.is_cancelled() {
                (self.postponed(&job, None, Duration::ZERO), None)
            } else {
                // Debug level: an enabled span per delivery costs
                // measurable CPU at tens of thousands of deliveries a second.
                if let Some(wait) = self.inner.lanes.pace(&lane) {
                    tokio::select! {
                        () = pipeline.shutdown.cancelled() => {}
                        () = tokio::time::sleep(wait) => {}
                    }
                }
                let span = debug_span!("deliver", topic = %job.subscription.topic, callback = %job.subscription.callback, event = %job.outgoing.event.id);
                let (completion, reply, pause) = self.attempt(&job, &client).instrument(span).await;
                if let Some(pause) = pause {
                    self.inner.lanes.pause(&lane, pause);
                }
                (completion, reply)
            };
            self.finish(&pipeline, completion, job);
            let (next, refill) = self.inner.lanes.next(&lane, reply, &mut stale);
            if !stale.is_empty() {
                let wait = self
                    .inner
                    .lanes
                    .paused_for(&lane)
                    .unwrap_or(STALE_RECORD_WAIT);
                for waited in stale.drain(..) {
                    let completion = self.postponed(&waited, None, wait);
                    self.finish(&pipeline, completion, waited);
                }
            }
            let fed = pipeline.starved.load(Ordering::Acquire)
                && pipeline.pending.available_permits() >= pipeline.batch
                && pipeline.starved.swap(false, Ordering::AcqRel);
            if refill || fed {
                self.inner.room.notify_one();
            }
            match next {
                Next::Attempt(next) => job = next,
                Next::Stop => return,
            }
        }
    }

    /// Sends `completion` to the recorder and frees `job`'s room.
    fn finish(&self, pipeline: &Pipeline, completion: Completion, job: Job) {
        pipeline.record(completion, job.unwritten);
        drop(job.permit);
    }

    /// `job` goes back to the log, due again after `wait`, its retries not
    /// counted; `error` is the local one that kept it from being made.
    fn postponed(&self, job: &Job, error: Option<String>, wait: Duration) -> Completion {
        self.inner.judge.postponed();
        Completion {
            event_id: job.outgoing.event.id,
            subscriber: job.subscription.callback.clone(),
            outcome: Outcome::Postponed {
                error,
                next_attempt_at: self.due_after(wait),
            },
            attempt: None,
        }
    }

    /// When a record put off for `wait` from now is due again.
    fn due_after(&self, wait: Duration) -> chrono::DateTime<chrono::Utc> {
        self.inner.clock.now() + chrono::Duration::from_std(wait).unwrap_or(chrono::Duration::MAX)
    }

    /// `callback` answered again after failing since `since`: what waited
    /// for it, and what ran out of retries meanwhile, is due now.
    async fn release(&self, callback: &str, since: chrono::DateTime<chrono::Utc>) {
        let now = self.inner.clock.now();
        match self
            .inner
            .events
            .release_endpoint(callback, since, now)
            .await
        {
            Ok(released) => {
                info!(
                    callback,
                    released, "sending what waited for a recovered callback"
                );
                self.inner.lanes.mark_due(lane_of(callback), now);
                if self.inner.ordered.has_callback(callback) {
                    self.inner.lanes.mark_due(ordered_lane_of(callback), now);
                }
                self.inner.room.notify_one();
            }
            Err(error) => {
                warn!(%error, callback, "releasing the deliveries of a recovered callback failed; they follow at their own times")
            }
        }
    }
}

/// The outcome of a record whose subscription's lease ran out before its
/// attempt: dropped.
fn lease_expired(outgoing: &Outgoing, subscription: &Subscription) -> Completion {
    Completion {
        event_id: outgoing.event.id,
        subscriber: subscription.callback.clone(),
        outcome: Outcome::Dropped {
            reason: LEASE_EXPIRED.to_owned(),
        },
        attempt: None,
    }
}

fn dropped(claim: &Claimed, reason: &str) -> Completion {
    Completion {
        event_id: claim.event_id,
        subscriber: claim.subscriber.clone(),
        outcome: Outcome::Dropped {
            reason: reason.to_owned(),
        },
        attempt: None,
    }
}

/// The `Link` header of a delivery: the hub and the topic, combined. A
/// link's target must be a URI (RFC 8288), and a header value ASCII, so an
/// IRI is sent percent-encoded ([`iri_to_uri`]); the topic itself, in the
/// store, the log and the signature, stays as given.
pub fn link_header(hub_url: &str, topic: &str) -> String {
    format!(
        "<{}>; rel=\"hub\", <{}>; rel=\"self\"",
        iri_to_uri(hub_url),
        iri_to_uri(topic)
    )
}

/// Why a record of an expired subscription is closed undelivered.
const LEASE_EXPIRED: &str = "the subscription's lease has expired";

/// How many claimed records may wait in their lanes' queues, besides the
/// attempts in flight: one round of them, enough for the queues of many
/// lanes to keep their slots busy. A waiting record costs a few dozen
/// bytes, but every lane that holds one is a host at work, with its
/// connections open: with four rounds, a fan-out over a thousand slow
/// hosts had half of them at work at once and peaked 100 MB higher, no
/// faster (docs/benchmarks.md). A lane's own queue is bounded besides
/// ([`lanes::QUEUE_ROUNDS`]), so one host cannot take the room: what it
/// cannot take stays in the log, or held, for later.
fn waiting_room(policy: &DeliveryPolicy) -> usize {
    policy.batch_size.max(policy.concurrency)
}

/// How long a claimed record may wait for a slot of its host before it
/// goes back to the log: long enough for a host with many records to work
/// through its queue, short enough that a host that cannot keep up holds
/// its records only briefly; and, with its attempt, well inside the
/// visibility timeout, so no claim goes stale in a queue.
fn host_wait(policy: &DeliveryPolicy) -> Duration {
    let inside_claim = policy.visibility_timeout.saturating_sub(policy.timeout) / 2;
    HOST_WAIT.min(inside_claim)
}

/// The longest wait for a host's slot, when the claims allow it.
const HOST_WAIT: Duration = Duration::from_secs(20);

/// When a record that waited too long in its lane's queue (its host slowed
/// down) is due again.
const STALE_RECORD_WAIT: Duration = Duration::from_secs(1);

/// The most lanes one walk of the log reads.
const WALKED_LANES: usize = 100_000;

/// The most records of one topic in a claimed batch whose subscriptions
/// are read one by one rather than listed with the whole topic. Listing a
/// topic of 100 000 takes over a second on SQLite and holds the claim loop
/// meanwhile, so a lane's rounds read their own (websub-bench slow); a
/// larger claim lists the topic once, kept for [`SUBSCRIBERS_TTL`].
const POINT_READS: usize = 64;

/// Failures the dispatcher reports (each is retried; none loses a record).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DispatchError {
    /// The event log failed.
    #[error(transparent)]
    Events(#[from] EventLogError),
    /// The subscription store failed.
    #[error(transparent)]
    Store(#[from] websub_store::StoreError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_header_combines_hub_and_self() {
        assert_eq!(
            link_header("https://hub.example/", "https://pub.example/feed?x=1"),
            "<https://hub.example/>; rel=\"hub\", <https://pub.example/feed?x=1>; rel=\"self\""
        );
    }

    #[test]
    fn link_header_spells_an_iri_topic_as_a_uri() {
        let link = link_header(
            "https://hub.example/",
            "http://127.0.0.1:9/flux/caf\u{e9}?q=\u{2713}&sp=a b",
        );
        assert_eq!(
            link,
            "<https://hub.example/>; rel=\"hub\", \
             <http://127.0.0.1:9/flux/caf%C3%A9?q=%E2%9C%93&sp=a%20b>; rel=\"self\""
        );
        assert!(link.is_ascii());
        let links = crate::subscriber::parse_link_header(&link);
        assert_eq!(links.len(), 2);
        assert!(links[1].has_rel("self"));
        assert_eq!(
            links[1].target,
            "http://127.0.0.1:9/flux/caf%C3%A9?q=%E2%9C%93&sp=a%20b"
        );
    }
}

//! The WebSub scheduler: expands the events of the hub's own log into one
//! delivery record per subscription of their topic, claims due records, and
//! hands each attempt to the delivery core ([`crate::delivery`]), which
//! POSTs it and judges the answer; the outcome — delivered, retried with
//! backoff, exhausted, or dropped — is written back through the core's
//! recorder. Fairness here is per callback host: many subscriptions share a
//! host, and one slow host must not take every slot.
//!
//! Delivery is at least once. A record is claimed before its attempt and
//! completed after it; a process killed in between leaves a claim that
//! becomes claimable again after the visibility timeout. A first attempt
//! needs no separate claim: the expander writes its record already claimed
//! and hands it straight to the attempts, while retries (and records another
//! process left) are claimed from the log. One slow or dead subscriber never
//! delays another: attempts run concurrently, bounded overall and per
//! callback host, and each carries its own timeout.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use http::{HeaderMap, HeaderValue};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, debug_span, info, warn};
use uuid::Uuid;
use websub_store::{Subscription, SubscriptionStore};

use crate::clock::Clock;
use crate::config::DeliveryPolicy;
use crate::delivery::attempt::{self, Answer, Request, WEBSUB_SCHEME};
use crate::delivery::recorder::{self, Batching, OutcomeStore};
use crate::delivery::{Channel, Judge, Verdict};
use crate::events::{Claimed, Completion, EventLog, EventLogError, LoggedEvent, Outcome};

/// The WebSub scheduler. Cheap to clone; clones share state.
#[derive(Debug, Clone)]
pub struct Distributor {
    inner: Arc<DistributorState>,
}

#[derive(Debug)]
struct DistributorState {
    events: Arc<dyn EventLog>,
    store: Arc<dyn SubscriptionStore>,
    client: reqwest::Client,
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
    hosts: Mutex<HashMap<String, Arc<Semaphore>>>,
}

/// What the claim loop and the expander share to start attempts.
#[derive(Debug, Clone)]
struct Pipeline {
    /// One permit per record claimed and not yet through its attempt: the
    /// attempts in flight plus a queue waiting for a network slot, so the
    /// network never waits for the log. The queue is short enough (eight
    /// rounds of attempts) that nothing claimed waits in it anywhere near
    /// the visibility timeout.
    pending: Arc<Semaphore>,
    attempts: TaskTracker,
    completed: mpsc::UnboundedSender<Completion>,
    /// How much room a claim waits for, and the size of an expanded part.
    /// Each costs a round trip whatever its size, so they are made for half
    /// the queue at a time rather than one record per finished attempt.
    batch: usize,
}

impl Distributor {
    /// A dispatcher delivering `events` to the subscriptions in `store`,
    /// announcing `hub_url` in its `Link` headers.
    pub fn new(
        events: Arc<dyn EventLog>,
        store: Arc<dyn SubscriptionStore>,
        client: reqwest::Client,
        hub_url: String,
        policy: DeliveryPolicy,
        poll_interval: Duration,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            inner: Arc::new(DistributorState {
                events,
                store,
                client,
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
                hosts: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Tells the dispatcher there is new work (an event recorded), so it does
    /// not wait for its next poll.
    pub fn wake(&self) {
        self.inner.wake.notify_one();
    }

    /// Forgets the cached subscribers of `topic`: a subscription to it was
    /// saved or deleted here, and the next delivery must see that.
    pub fn forget_topic(&self, topic: &str) {
        self.inner.subscribers.forget(topic);
    }

    /// Expands every recorded but unexpanded event and starts the first
    /// attempts of the records it writes. Returns how many records were
    /// created; stops early, leaving the event it was on unexpanded, when
    /// `shutdown` is cancelled.
    async fn expand_pending(
        &self,
        pipeline: &Pipeline,
        shutdown: &CancellationToken,
    ) -> Result<u64, DispatchError> {
        let mut created = 0;
        loop {
            let pending = self.inner.events.unexpanded(64).await?;
            if pending.is_empty() {
                return Ok(created);
            }
            for event in pending {
                match self.expand_event(event, pipeline, shutdown).await? {
                    Some(records) => created += records,
                    None => return Ok(created),
                }
            }
        }
    }

    /// Expands one event: reads its topic's subscribers page by page, writes
    /// each part of a page as delivery records already claimed by this
    /// process ([`EventLog::expand_claimed`]), starts the first attempt of
    /// every record it created, and marks the event expanded after the last
    /// page.
    ///
    /// The first deliveries leave after one small page, not after the whole
    /// list, and no first attempt pays for a claim. The next page is read
    /// while the current one goes out, in pages four times larger each time
    /// (few round trips for a large topic), and parts are written one ahead
    /// of the pipeline's room (see [`deliver_page`](Self::deliver_page)), so
    /// a claimed record never waits long for its attempt. Records that exist
    /// already (another replica expanding the same event, a restart after a
    /// crash mid-expansion) are left to whoever holds them or to the claim
    /// loop.
    ///
    /// Returns how many records were created, or `None` if `shutdown`
    /// interrupted it (the event stays unexpanded and is expanded again).
    async fn expand_event(
        &self,
        event: LoggedEvent,
        pipeline: &Pipeline,
        shutdown: &CancellationToken,
    ) -> Result<Option<u64>, DispatchError> {
        let outgoing = Arc::new(Outgoing::new(event, &self.inner.hub_url));
        self.inner.bodies.insert(outgoing.clone());
        let topic = outgoing.event.topic.as_str();
        let mut limit = self.inner.policy.concurrency.clamp(1, MAX_PAGE);
        let mut page = self
            .inner
            .store
            .list_by_topic_page(topic, None, limit)
            .await?;
        let (mut created, mut subscribers) = (0, 0);
        loop {
            subscribers += page.len();
            let next_limit = (limit * 4).min(MAX_PAGE);
            let after = (page.len() == limit)
                .then(|| {
                    page.last()
                        .map(|subscription| subscription.callback.clone())
                })
                .flatten();
            let read_next = async {
                let Some(after) = &after else {
                    return Ok(None);
                };
                let started = std::time::Instant::now();
                let next = self
                    .inner
                    .store
                    .list_by_topic_page(topic, Some(after), next_limit)
                    .await?;
                debug!(subscribers = next.len(), took = ?started.elapsed(), "read a page of subscribers");
                Ok::<_, websub_store::StoreError>(Some(next))
            };
            let (delivered, next) = tokio::join!(
                self.deliver_page(&outgoing, page, pipeline, shutdown),
                read_next
            );
            let Some(delivered) = delivered? else {
                return Ok(None);
            };
            created += delivered;
            match next? {
                Some(next) => {
                    page = next;
                    limit = next_limit;
                }
                None => break,
            }
        }
        let id = outgoing.event.id;
        self.inner
            .events
            .expand(id, &[], self.inner.clock.now())
            .await?;
        debug!(event = %id, %topic, subscribers, created, "expanded");
        Ok(Some(created))
    }

    /// Writes one page of an event's subscribers as claimed records, a part
    /// at a time, and starts their attempts. Returns how many records were
    /// created, or `None` on shutdown.
    ///
    /// A part is written while the previous one is still queued, then waits
    /// for room in the pipeline: the write's latency (on SQLite, the wait
    /// for the file's one writer) overlaps with the attempts already queued
    /// instead of leaving the network idle, and a claimed record waits at
    /// most for one part's worth of attempts to finish before its own starts.
    /// A part written is a part delivered, shutdown or not: the pipeline
    /// drains meanwhile, and its records are not left to wait for the
    /// visibility timeout.
    async fn deliver_page(
        &self,
        outgoing: &Arc<Outgoing>,
        page: Vec<Subscription>,
        pipeline: &Pipeline,
        shutdown: &CancellationToken,
    ) -> Result<Option<u64>, DispatchError> {
        let mut rest = page.into_iter();
        let mut created = 0;
        while rest.len() > 0 {
            if shutdown.is_cancelled() {
                return Ok(None);
            }
            let part: Vec<Subscription> = rest.by_ref().take(pipeline.batch).collect();
            let callbacks: Vec<&str> = part
                .iter()
                .map(|subscription| subscription.callback.as_str())
                .collect();
            let now = self.inner.clock.now();
            let started = std::time::Instant::now();
            let inserted = self
                .inner
                .events
                .expand_claimed(outgoing.event.id, &callbacks, now)
                .await?;
            debug!(records = part.len(), created = inserted.len(), took = ?started.elapsed(), "wrote a claimed part");
            created += inserted.len() as u64;
            // Usually every record is new; otherwise only the new ones are
            // this process's to deliver.
            let ours: Option<HashSet<String>> =
                (inserted.len() < part.len()).then(|| inserted.into_iter().collect());
            let mut deliverable = Vec::with_capacity(part.len());
            for subscription in part {
                if ours
                    .as_ref()
                    .is_some_and(|ours| !ours.contains(&subscription.callback))
                {
                    continue;
                }
                if subscription.is_expired(now) {
                    let _ = pipeline.completed.send(Completion {
                        event_id: outgoing.event.id,
                        subscriber: subscription.callback,
                        outcome: Outcome::Dropped {
                            reason: LEASE_EXPIRED.to_owned(),
                        },
                    });
                    continue;
                }
                deliverable.push(subscription);
            }
            if deliverable.is_empty() {
                continue;
            }
            let Ok(mut permits) = pipeline
                .pending
                .clone()
                .acquire_many_owned(permit_count(deliverable.len()))
                .await
            else {
                return Ok(None);
            };
            for subscription in deliverable {
                let Some(permit) = permits.split(1) else {
                    // One permit per record of the part was taken.
                    break;
                };
                self.spawn_attempt(
                    pipeline,
                    permit,
                    outgoing.clone(),
                    Arc::new(subscription),
                    0,
                );
            }
        }
        Ok(Some(created))
    }

    /// Expands whenever [`expand_soon`](Self::expand_soon) asks, apart from
    /// the claim loop, so that claims and retries go on while a large
    /// fan-out is being written.
    async fn run_expander(self, pipeline: Pipeline, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.inner.expand.notified() => {}
            }
            if let Err(error) = self.expand_pending(&pipeline, &shutdown).await {
                warn!(%error, "expanding events failed; retrying at the next poll");
            }
        }
    }

    fn expand_soon(&self) {
        self.inner.expand.notify_one();
    }

    /// Runs until `shutdown` is cancelled, then waits for the attempts in
    /// flight and records their outcomes before returning.
    pub async fn run(self, shutdown: CancellationToken) {
        let policy = self.inner.policy;
        let queue = policy.batch_size.min(policy.concurrency * 8);
        let (completed, completions) = mpsc::unbounded_channel();
        let pipeline = Pipeline {
            pending: Arc::new(Semaphore::new(policy.concurrency + queue)),
            attempts: TaskTracker::new(),
            completed,
            batch: (queue / 2).max(1),
        };
        let recorder = tokio::spawn(recorder::record(
            LogOutcomes(self.clone()),
            completions,
            batching(&policy),
        ));
        let expander = tokio::spawn(
            self.clone()
                .run_expander(pipeline.clone(), shutdown.clone()),
        );
        self.expand_soon();
        while !shutdown.is_cancelled() {
            let room = pipeline.pending.available_permits();
            if room < pipeline.batch {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = self.inner.room.notified() => {}
                }
                continue;
            }
            let limit = room.min(self.inner.policy.batch_size);
            let claimed = match self
                .inner
                .events
                .claim(
                    limit,
                    self.inner.clock.now(),
                    self.inner.policy.visibility_timeout,
                )
                .await
            {
                Ok(claimed) => claimed,
                Err(error) => {
                    warn!(%error, "claiming deliveries failed; retrying at the next poll");
                    Vec::new()
                }
            };
            let more_due = claimed.len() == limit;
            debug!(claimed = claimed.len(), limit, "claimed");
            if !claimed.is_empty()
                && let Err(error) = self.start_attempts(claimed, &pipeline).await
            {
                warn!(%error, "preparing deliveries failed; they are retried after the visibility timeout");
            }
            if !more_due {
                // Fewer records were due than there was room for: wait for
                // news instead of asking the log again at once.
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = self.inner.wake.notified() => self.expand_soon(),
                    () = tokio::time::sleep(self.inner.poll_interval) => self.expand_soon(),
                }
            }
        }
        if let Err(error) = expander.await {
            warn!(%error, "the expander stopped abnormally");
        }
        let Pipeline {
            attempts,
            completed,
            ..
        } = pipeline;
        attempts.close();
        attempts.wait().await;
        drop(completed);
        if let Err(error) = recorder.await {
            warn!(%error, "the outcome recorder stopped abnormally");
        }
    }

    async fn start_attempts(
        &self,
        claimed: Vec<Claimed>,
        pipeline: &Pipeline,
    ) -> Result<(), DispatchError> {
        // Per topic: its subscribers, and whether they were read for this
        // batch (then a missing callback is really gone).
        let mut subscribers: HashMap<String, (Arc<Subscribers>, bool)> = HashMap::new();
        let mut events: HashMap<Uuid, Arc<Outgoing>> = HashMap::new();
        for claim in &claimed {
            let (known, fresh) = match subscribers.get(&claim.topic) {
                Some(known) => known.clone(),
                None => {
                    let known = self.subscribers(&claim.topic, false).await?;
                    subscribers.insert(claim.topic.clone(), known.clone());
                    known
                }
            };
            if !fresh && !known.by_callback.contains_key(&claim.subscriber) {
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
        for claim in claimed {
            let subscription = subscribers
                .get(&claim.topic)
                .and_then(|(known, _)| known.by_callback.get(&claim.subscriber))
                .cloned();
            let event = events.get(&claim.event_id).cloned();
            let (subscription, event) = match (subscription, event) {
                (Some(subscription), _) if subscription.is_expired(now) => {
                    let _ = pipeline.completed.send(dropped(&claim, LEASE_EXPIRED));
                    continue;
                }
                (Some(subscription), Some(event)) => (subscription, event),
                (None, _) => {
                    let _ = pipeline
                        .completed
                        .send(dropped(&claim, "no longer subscribed"));
                    continue;
                }
                (Some(_), None) => {
                    let _ = pipeline
                        .completed
                        .send(dropped(&claim, "the event was purged"));
                    continue;
                }
            };
            let Ok(permit) = pipeline.pending.clone().acquire_owned().await else {
                return Ok(());
            };
            self.spawn_attempt(pipeline, permit, event, subscription, claim.retry_count);
        }
        Ok(())
    }

    /// Starts one attempt, holding `permit` until its outcome is sent.
    fn spawn_attempt(
        &self,
        pipeline: &Pipeline,
        permit: OwnedSemaphorePermit,
        outgoing: Arc<Outgoing>,
        subscription: Arc<Subscription>,
        retry_count: u32,
    ) {
        let dispatcher = self.clone();
        let completed = pipeline.completed.clone();
        // Debug level: an enabled span per delivery costs measurable CPU at
        // tens of thousands of deliveries a second.
        let span = debug_span!("deliver", topic = %subscription.topic, callback = %subscription.callback, event = %outgoing.event.id);
        pipeline.attempts.spawn(
            async move {
                let completion = dispatcher
                    .attempt(retry_count, subscription, outgoing)
                    .await;
                let _ = completed.send(completion);
                drop(permit);
                dispatcher.inner.room.notify_one();
            }
            .instrument(span),
        );
    }

    /// The subscribers of `topic`, from a short-lived cache unless
    /// `refresh`. Each claimed batch needs them, and reading 100 000
    /// subscriptions per batch of a few hundred deliveries would make a
    /// retried fan-out quadratic. See [`SUBSCRIBERS_TTL`] for how fresh it
    /// is. Returns the list and whether it was read just now.
    async fn subscribers(
        &self,
        topic: &str,
        refresh: bool,
    ) -> Result<(Arc<Subscribers>, bool), DispatchError> {
        if !refresh && let Some(cached) = self.inner.subscribers.get(topic) {
            return Ok((cached, false));
        }
        let listed = self.inner.store.list_by_topic(topic).await?;
        Ok((self.inner.subscribers.put(topic, listed), true))
    }

    async fn event(&self, id: Uuid) -> Result<Option<Arc<Outgoing>>, DispatchError> {
        if let Some(outgoing) = self.inner.bodies.get(id) {
            return Ok(Some(outgoing));
        }
        let Some(event) = self.inner.events.event(id).await? else {
            return Ok(None);
        };
        let outgoing = Arc::new(Outgoing::new(event, &self.inner.hub_url));
        self.inner.bodies.insert(outgoing.clone());
        Ok(Some(outgoing))
    }

    fn host_limit(&self, callback: &str) -> Arc<Semaphore> {
        let host = authority(callback);
        let mut hosts = self
            .inner
            .hosts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(limit) = hosts.get(host) {
            return limit.clone();
        }
        let limit = Arc::new(Semaphore::new(self.inner.policy.per_host));
        hosts.insert(host.to_owned(), limit.clone());
        limit
    }

    async fn attempt(
        &self,
        retry_count: u32,
        subscription: Arc<Subscription>,
        outgoing: Arc<Outgoing>,
    ) -> Completion {
        let host = self.host_limit(&subscription.callback);
        // The host's slot first: waiting for a saturated host must not hold
        // one of the slots other hosts' deliveries need.
        let slots = (host.acquire().await, self.inner.http_slots.acquire().await);
        let answer = match (slots, &outgoing.headers) {
            ((Ok(_host_slot), Ok(_http_slot)), Ok(headers)) => {
                let request = Request {
                    url: &subscription.callback,
                    scheme: &WEBSUB_SCHEME,
                    content_type: headers.content_type.clone(),
                    event_id: headers.event_id.clone(),
                    body: outgoing.event.body.clone(),
                    secret: subscription.secret.as_deref().map(str::as_bytes),
                    headers: Some(&headers.link),
                };
                attempt::post(&self.inner.client, request, self.inner.policy.timeout, None).await
            }
            (_, Err(error)) => Answer::Failed(error.clone()),
            _ => Answer::Failed("the dispatcher is shutting down".to_owned()),
        };
        let outcome = match self.inner.judge.verdict(answer, retry_count) {
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
                next_attempt_at: self.inner.clock.now()
                    + chrono::Duration::from_std(wait).unwrap_or(chrono::Duration::MAX),
            },
            Verdict::Exhausted { error } => Outcome::Exhausted { error },
        };
        Completion {
            event_id: outgoing.event.id,
            subscriber: subscription.callback.clone(),
            outcome,
        }
    }
}

/// The event log as the recorder writes to it.
#[derive(Debug)]
struct LogOutcomes(Distributor);

#[async_trait]
impl OutcomeStore for LogOutcomes {
    type Entry = Completion;

    async fn write(&self, batch: &[Completion]) -> Result<(), String> {
        let inner = &self.0.inner;
        inner
            .events
            .complete(batch, inner.clock.now())
            .await
            .map_err(|error| error.to_string())
    }

    fn retry_in(&self, completion: &Completion) -> Option<Duration> {
        match completion.outcome {
            Outcome::Retry {
                next_attempt_at, ..
            } => Some(
                (next_attempt_at - self.0.inner.clock.now())
                    .to_std()
                    .unwrap_or_default(),
            ),
            _ => None,
        }
    }

    fn wake(&self) {
        self.0.wake();
    }
}

fn dropped(claim: &Claimed, reason: &str) -> Completion {
    Completion {
        event_id: claim.event_id,
        subscriber: claim.subscriber.clone(),
        outcome: Outcome::Dropped {
            reason: reason.to_owned(),
        },
    }
}

/// The `host:port` part of an absolute URL, as written: the key of the
/// per-host limit. Cheaper than parsing the URL on every delivery, and the
/// callbacks were validated as absolute http(s) URLs when subscribed.
fn authority(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    // Credentials are not part of the host.
    authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host)
}

/// The `Link` header of a delivery: the hub and the topic, combined.
pub fn link_header(hub_url: &str, topic: &str) -> String {
    format!("<{hub_url}>; rel=\"hub\", <{topic}>; rel=\"self\"")
}

/// An event ready to go out, with the headers every subscriber gets built
/// once rather than once per delivery.
#[derive(Debug)]
struct Outgoing {
    event: LoggedEvent,
    /// Its headers, or why they cannot be sent (a stored value no header can
    /// hold: every attempt fails with it).
    headers: Result<EventHeaders, String>,
}

/// The headers of an event's deliveries that do not depend on the
/// subscription.
#[derive(Debug)]
struct EventHeaders {
    content_type: HeaderValue,
    event_id: HeaderValue,
    /// `Link`, the hub and the topic.
    link: HeaderMap,
}

impl Outgoing {
    fn new(event: LoggedEvent, hub_url: &str) -> Self {
        let headers = [
            HeaderValue::from_str(&event.content_type),
            HeaderValue::from_str(&link_header(hub_url, &event.topic)),
            HeaderValue::from_str(&event.id.to_string()),
        ];
        let headers = match headers {
            [Ok(content_type), Ok(link), Ok(event_id)] => Ok(EventHeaders {
                content_type,
                event_id,
                link: HeaderMap::from_iter([(http::header::LINK, link)]),
            }),
            _ => Err(format!(
                "the event's content type or topic cannot be sent in a header: {:?}, {:?}",
                event.content_type, event.topic
            )),
        };
        Self { event, headers }
    }
}

/// Recently delivered events, so a fan-out to thousands of subscribers reads
/// its body from the log once.
#[derive(Debug)]
struct EventCache {
    capacity: usize,
    entries: Mutex<CachedEvents>,
}

/// The cached events, and their ids oldest first for eviction.
#[derive(Debug, Default)]
struct CachedEvents {
    by_id: HashMap<Uuid, Arc<Outgoing>>,
    order: VecDeque<Uuid>,
}

impl EventCache {
    fn new(capacity: usize) -> Self {
        Self {
            capacity,
            entries: Mutex::new(CachedEvents::default()),
        }
    }

    fn get(&self, id: Uuid) -> Option<Arc<Outgoing>> {
        let entries = self
            .entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        entries.by_id.get(&id).cloned()
    }

    fn insert(&self, outgoing: Arc<Outgoing>) {
        let id = outgoing.event.id;
        let mut guard = self
            .entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let cached = &mut *guard;
        if cached.by_id.insert(id, outgoing).is_none() {
            cached.order.push_back(id);
        }
        while cached.order.len() > self.capacity {
            if let Some(oldest) = cached.order.pop_front() {
                cached.by_id.remove(&oldest);
            }
        }
    }
}

/// The largest page of subscribers an expansion reads at once: a 100 000
/// fan-out takes a dozen reads, and two pages in memory stay a few MB.
const MAX_PAGE: usize = 10_000;

/// Why a record of an expired subscription is closed undelivered.
const LEASE_EXPIRED: &str = "the subscription's lease has expired";

/// A permit count for the semaphore API; batches are far below `u32::MAX`.
fn permit_count(records: usize) -> u32 {
    u32::try_from(records).unwrap_or(u32::MAX)
}

/// How WebSub outcomes are written: in a fan-out of tens of thousands of
/// deliveries a second, a batched update on PostgreSQL takes tens of
/// milliseconds, so several writes run at once (the records of different
/// batches never overlap) and each gathers only briefly, keeping the log
/// abreast of the network.
fn batching(policy: &DeliveryPolicy) -> Batching {
    Batching {
        limit: policy.batch_size,
        gathering: Duration::from_millis(2),
        writers: 4,
    }
}

/// How long a topic's subscriber list is reused between claimed batches.
/// Changes made through this hub reach the cache at once
/// ([`Distributor::forget_topic`]); this bounds how long one made through
/// another replica (a renewed secret, an unsubscribe) takes to be seen.
pub const SUBSCRIBERS_TTL: Duration = Duration::from_secs(10);

/// A topic's subscriptions by callback, as read at one moment.
#[derive(Debug)]
struct Subscribers {
    by_callback: HashMap<String, Arc<Subscription>>,
    read_at: std::time::Instant,
}

#[derive(Debug, Default)]
struct SubscriberCache {
    topics: Mutex<HashMap<String, Arc<Subscribers>>>,
}

impl SubscriberCache {
    fn get(&self, topic: &str) -> Option<Arc<Subscribers>> {
        let topics = self
            .topics
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let cached = topics.get(topic)?;
        (cached.read_at.elapsed() < SUBSCRIBERS_TTL).then(|| cached.clone())
    }

    fn forget(&self, topic: &str) {
        self.topics
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(topic);
    }

    fn put(&self, topic: &str, listed: Vec<Subscription>) -> Arc<Subscribers> {
        let subscribers = Arc::new(Subscribers {
            by_callback: listed
                .into_iter()
                .map(|subscription| (subscription.callback.clone(), Arc::new(subscription)))
                .collect(),
            read_at: std::time::Instant::now(),
        });
        let mut topics = self
            .topics
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        topics.retain(|_, cached| cached.read_at.elapsed() < SUBSCRIBERS_TTL);
        topics.insert(topic.to_owned(), subscribers.clone());
        subscribers
    }
}

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
    fn authority_is_host_and_port_as_written() {
        assert_eq!(authority("http://127.0.0.1:9000/cb?x=1"), "127.0.0.1:9000");
        assert_eq!(authority("https://user:pw@Sub.example/cb"), "Sub.example");
        assert_eq!(authority("https://[::1]:8443?q"), "[::1]:8443");
        assert_eq!(authority("https://sub.example"), "sub.example");
    }

    #[test]
    fn link_header_combines_hub_and_self() {
        assert_eq!(
            link_header("https://hub.example/", "https://pub.example/feed?x=1"),
            "<https://hub.example/>; rel=\"hub\", <https://pub.example/feed?x=1>; rel=\"self\""
        );
    }
}

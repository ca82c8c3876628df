//! Expansion: an event of the log becomes one delivery record per
//! subscription of its topic, written in parts: the records whose lanes
//! have room already claimed and handed straight to the attempts, the rest
//! unclaimed, for their lanes to claim as they free room. On a log only
//! one process uses, a fresh expansion writes neither: the records go
//! straight to their attempts or are held for their lanes ([`super::held`]),
//! and the event is marked expanded once the last of them is written.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};
use websub_store::{Subscription, SubscriptionStore};

use crate::storage::events::{ExpansionClaim, LoggedEvent};
use crate::telemetry::traces;

use super::cache::{ByCallback, Outgoing};
use super::lanes::Job;
use super::{DispatchError, Distributor, Pipeline, lane_of, lease_expired, ordered_lane_of};

impl Distributor {
    /// Expands every recorded but unexpanded event and starts the first
    /// attempts of the records it writes. Returns how many records were
    /// created; stops early, leaving the event it was on unexpanded, when
    /// `shutdown` is cancelled.
    pub(super) async fn expand_pending(
        &self,
        pipeline: &Pipeline,
        shutdown: &CancellationToken,
    ) -> Result<u64, DispatchError> {
        let mut created = 0;
        loop {
            // Events whose records are held are expanded already, as far as
            // this process goes: they are marked once their records are in.
            let held = &self.inner.held;
            let pending: Vec<LoggedEvent> = self
                .inner
                .events
                .unexpanded(64 + held.draining())
                .await?
                .into_iter()
                .filter(|event| !held.is_draining(event.id))
                .collect();
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
    /// process ([`DeliveryQueue::expand_claimed`]), starts the first attempt of
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
    pub(super) async fn expand_event(
        &self,
        event: LoggedEvent,
        pipeline: &Pipeline,
        shutdown: &CancellationToken,
    ) -> Result<Option<u64>, DispatchError> {
        let started = std::time::SystemTime::now();
        let afresh = match self.inner.events.take_expansion(event.id).await? {
            ExpansionClaim::Taken { afresh } => afresh,
            // Another replica's, maybe holding its records: left to it whole.
            ExpansionClaim::Elsewhere => return Ok(Some(0)),
        };
        let outgoing = Arc::new(Outgoing::new(event, &self.inner.hub_url));
        self.inner.bodies.insert(outgoing.clone());
        let id = outgoing.event.id;
        // Records are held only for an expansion that starts afresh: one
        // taken up after a crash writes what is missing, leaving what was
        // written as it is.
        let holding = self.holds_records() && afresh && self.inner.held.begin(id);
        let expanded = self
            .expand_listed(&outgoing, holding, pipeline, shutdown)
            .await;
        if holding {
            let drained = match &expanded {
                Ok(Some(_)) => self.inner.held.listed(id, true),
                Ok(None) => None,
                Err(_) => self.inner.held.listed(id, false),
            };
            if let Some(drained) = drained {
                self.settle(vec![drained]).await;
            }
        } else if matches!(expanded, Ok(Some(_))) {
            self.inner
                .events
                .expand(id, &[], self.inner.clock.now())
                .await?;
        }
        let created = expanded?;
        if let Some(created) = created {
            traces::websub_expansion(
                outgoing.trace_parent.as_ref(),
                &outgoing.event.topic,
                created,
                started,
            );
        }
        debug!(event = %id, topic = %outgoing.event.topic, ?created, holding, "expanded");
        Ok(created)
    }

    /// The pages of [`expand_event`](Self::expand_event): returns how many
    /// records were created (or held), or `None` on shutdown.
    async fn expand_listed(
        &self,
        outgoing: &Arc<Outgoing>,
        holding: bool,
        pipeline: &Pipeline,
        shutdown: &CancellationToken,
    ) -> Result<Option<u64>, DispatchError> {
        let topic = outgoing.event.topic.as_str();
        let mut limit = FIRST_PAGE;
        let mut page = self
            .inner
            .store
            .list_by_topic_page(topic, None, limit)
            .await?;
        let (mut created, mut subscribers) = (0, 0);
        // A topic of more than one page leaves records for its lanes to
        // claim later: the pages read here become the cached list those
        // claims find, so that none of them lists the whole topic again
        // (over a second at 100 000 on SQLite, the claim loop held).
        let mut read: Vec<Arc<ByCallback>> = Vec::new();
        loop {
            subscribers += page.len();
            let shared: Vec<Arc<Subscription>> = page.into_iter().map(Arc::new).collect();
            let full = shared.len() == limit;
            if full || !read.is_empty() {
                read.push(Arc::new(
                    shared
                        .iter()
                        .map(|subscription| (subscription.callback.clone(), subscription.clone()))
                        .collect(),
                ));
                self.inner.subscribers.put_read(topic, read.clone());
            }
            let next_limit = (limit * 4).min(MAX_PAGE);
            let after = full
                .then(|| {
                    shared
                        .last()
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
                self.deliver_page(outgoing, shared, holding, pipeline, shutdown),
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
        debug!(%topic, subscribers, created, "listed");
        Ok(Some(created))
    }

    /// Writes one page of an event's subscribers, a part at a time: of each
    /// part, the records whose lanes have room (and the scheduler too)
    /// claimed, their attempts started as they are in, then the others
    /// unclaimed, due now, and their lanes told; the records of ordered
    /// subscriptions last, unclaimed. Returns how many records were
    /// created, or `None` on shutdown.
    ///
    /// Expansion never waits for a lane: a host with a hundred thousand
    /// subscriptions is written out at the log's pace (a page a statement
    /// or so) and sent at its own, and the hosts after it in the list, and
    /// the events after it, are expanded meanwhile. A part written is a
    /// part delivered, shutdown or not: the pipeline drains meanwhile, and
    /// its records are not left to wait for the visibility timeout.
    pub(super) async fn deliver_page(
        &self,
        outgoing: &Arc<Outgoing>,
        page: Vec<Arc<Subscription>>,
        holding: bool,
        pipeline: &Pipeline,
        shutdown: &CancellationToken,
    ) -> Result<Option<u64>, DispatchError> {
        let now = self.inner.clock.now();
        let mut ordered = Vec::new();
        let page: Vec<_> = page
            .into_iter()
            .filter_map(|subscription| {
                if self.inner.ordered.is_ordered(&subscription) && !subscription.is_expired(now) {
                    // Its line is claimed head first: never written claimed.
                    ordered.push(subscription);
                    None
                } else {
                    Some(subscription)
                }
            })
            .collect();
        let mut created = 0;
        // A part at a time, each sorted again by the room its lanes have
        // then: a host's lane frees room while the parts before are
        // written, and what it can take is written claimed and sent
        // rather than written to wait and claimed again.
        for part in page.chunks(WAITING_PART) {
            let (claimable, waiting) = self.sort_by_room(part, now, pipeline);
            if holding {
                created += self
                    .hand_over(outgoing, claimable, waiting, now, pipeline)
                    .await?;
                continue;
            }
            let mut rest = claimable.into_iter();
            while rest.len() > 0 {
                if shutdown.is_cancelled() {
                    self.give_back(rest);
                    return Ok(None);
                }
                let part: Vec<_> = rest.by_ref().take(pipeline.batch).collect();
                match self.write_claimed(outgoing, part, now, pipeline).await {
                    Ok(written) => created += written,
                    Err(error) => {
                        self.give_back(rest);
                        return Err(error);
                    }
                }
            }
            if !waiting.is_empty() {
                created += self.write_waiting(outgoing, &waiting, now, false).await?;
            }
        }
        for part in ordered.chunks(WAITING_PART) {
            created += self.write_waiting(outgoing, part, now, true).await?;
        }
        Ok(Some(created))
    }

    /// `part` sorted into the records whose lanes have room (and the
    /// scheduler too), each holding both until it is handed over, and
    /// those that wait. An expired subscription's record goes with the
    /// first, without a slot: it is written claimed and closed at once.
    fn sort_by_room(
        &self,
        part: &[Arc<Subscription>],
        now: chrono::DateTime<chrono::Utc>,
        pipeline: &Pipeline,
    ) -> (Vec<Reserved>, Vec<Arc<Subscription>>) {
        let lanes = &self.inner.lanes;
        let mut claimable = Vec::with_capacity(part.len());
        let mut waiting = Vec::new();
        for subscription in part {
            let lane = lane_of(&subscription.callback);
            let permit = if subscription.is_expired(now) {
                None
            } else if lanes.try_reserve(lane) {
                match pipeline.pending.clone().try_acquire_owned() {
                    Ok(permit) => Some(permit),
                    Err(_) => {
                        lanes.unreserve(lane, 1);
                        waiting.push(subscription.clone());
                        continue;
                    }
                }
            } else {
                waiting.push(subscription.clone());
                continue;
            };
            claimable.push((subscription.clone(), permit));
        }
        (claimable, waiting)
    }

    /// Of a part of a page whose records are held in memory: hands the
    /// `claimable` records to their attempts, unwritten, and holds the
    /// `waiting` ones for their lanes, writing to wait those past the
    /// bound. Returns how many records it made.
    async fn hand_over(
        &self,
        outgoing: &Arc<Outgoing>,
        claimable: Vec<Reserved>,
        waiting: Vec<Arc<Subscription>>,
        now: chrono::DateTime<chrono::Utc>,
        pipeline: &Pipeline,
    ) -> Result<u64, DispatchError> {
        let held = &self.inner.held;
        let lanes = &self.inner.lanes;
        let made = (claimable.len() + waiting.len()) as u64;
        held.sent(outgoing.event.id, claimable.len());
        for reserved in claimable {
            self.start_reserved(outgoing, reserved, true, pipeline);
        }
        let mut spilled = Vec::new();
        let mut told: Option<&str> = None;
        for subscription in &waiting {
            let lane = lane_of(&subscription.callback);
            if !held.hold(lane, (outgoing.clone(), subscription.clone())) {
                spilled.push(subscription.clone());
                continue;
            }
            if told != Some(lane) {
                lanes.mark_due(lane, now);
                told = Some(lane);
            }
        }
        if told.is_some() {
            self.inner.room.notify_one();
        }
        if !spilled.is_empty() {
            self.write_waiting(outgoing, &spilled, now, false).await?;
        }
        Ok(made)
    }

    /// Gives back the lane slots `reserved` records held, unwritten.
    fn give_back(&self, reserved: impl IntoIterator<Item = Reserved>) {
        for (subscription, permit) in reserved {
            if permit.is_some() {
                self.inner
                    .lanes
                    .unreserve(lane_of(&subscription.callback), 1);
            }
        }
    }

    /// Writes `records` unclaimed, due now, and tells their lanes: the
    /// host's, or the line of an ordered subscription. Returns how many
    /// were created.
    pub(super) async fn write_waiting(
        &self,
        outgoing: &Arc<Outgoing>,
        records: &[Arc<Subscription>],
        now: chrono::DateTime<chrono::Utc>,
        ordered: bool,
    ) -> Result<u64, DispatchError> {
        let started = std::time::Instant::now();
        let callbacks: Vec<&str> = records
            .iter()
            .map(|subscription| subscription.callback.as_str())
            .collect();
        let created = self
            .inner
            .events
            .expand_waiting(outgoing.event.id, &callbacks, now, ordered)
            .await?;
        let mut told: Option<&str> = None;
        for callback in callbacks {
            let lane = if ordered {
                ordered_lane_of(callback)
            } else {
                lane_of(callback)
            };
            // The list comes lane by lane, mostly: tell each once.
            if told != Some(lane) {
                self.inner.lanes.mark_due(lane, now);
                told = Some(lane);
            }
        }
        self.inner.room.notify_one();
        debug!(waiting = records.len(), ordered, took = ?started.elapsed(), "wrote the records that wait");
        Ok(created)
    }

    /// Writes `part` claimed and starts the attempts of the records it
    /// created; gives back the lane slots it held. Returns how many were
    /// created.
    async fn write_claimed(
        &self,
        outgoing: &Arc<Outgoing>,
        part: Vec<Reserved>,
        now: chrono::DateTime<chrono::Utc>,
        pipeline: &Pipeline,
    ) -> Result<u64, DispatchError> {
        let lanes = &self.inner.lanes;
        let started = std::time::Instant::now();
        let callbacks: Vec<&str> = part
            .iter()
            .map(|(subscription, _)| subscription.callback.as_str())
            .collect();
        let inserted = match self
            .inner
            .events
            .expand_claimed(outgoing.event.id, &callbacks, now)
            .await
        {
            Ok(inserted) => inserted,
            Err(error) => {
                self.give_back(part);
                return Err(error.into());
            }
        };
        debug!(claimed = part.len(), created = inserted.len(), took = ?started.elapsed(), "wrote a claimed part");
        let created = inserted.len() as u64;
        // Usually every record is new; otherwise only the new ones are
        // this process's to deliver.
        let ours: Option<HashSet<String>> =
            (inserted.len() < part.len()).then(|| inserted.into_iter().collect());
        for reserved in part {
            let mine = ours
                .as_ref()
                .is_none_or(|ours| ours.contains(&reserved.0.callback));
            if mine {
                self.start_reserved(outgoing, reserved, false, pipeline);
            } else if reserved.1.is_some() {
                lanes.unreserve(lane_of(&reserved.0.callback), 1);
            }
        }
        Ok(created)
    }

    /// Starts the attempt of a record whose lane slot was reserved
    /// (`unwritten` when the record is held in memory), or records it
    /// dropped when its subscription's lease ran out meanwhile.
    fn start_reserved(
        &self,
        outgoing: &Arc<Outgoing>,
        (subscription, permit): Reserved,
        unwritten: bool,
        pipeline: &Pipeline,
    ) {
        let Some(permit) = permit else {
            pipeline.record(lease_expired(outgoing, &subscription), unwritten);
            return;
        };
        let lane = lane_of(&subscription.callback);
        // Handed over before its slot is given back, so the lane is never
        // seen idle in between.
        let job = Job::new(
            permit,
            (outgoing.clone(), subscription.clone()),
            0,
            unwritten,
        );
        self.enqueue(pipeline, lane, job);
        self.inner.lanes.unreserve(lane, 1);
    }

    /// Expands whenever [`expand_soon`](Self::expand_soon) asks, apart from
    /// the claim loop, so that claims and retries go on while a large
    /// fan-out is being written.
    pub(super) async fn run_expander(self, pipeline: Pipeline, shutdown: CancellationToken) {
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

    pub(super) fn expand_soon(&self) {
        self.inner.expand.notify_one();
    }
}

/// A record to be written claimed, with its slot in the scheduler; none for
/// an expired subscription's, closed as it is written.
type Reserved = (Arc<Subscription>, Option<OwnedSemaphorePermit>);

/// The largest page of subscribers an expansion reads at once: a 100 000
/// fan-out takes a dozen reads, and two pages in memory stay a few MB.
pub(super) const MAX_PAGE: usize = 10_000;

/// The first page of subscribers an expansion reads: small, so that the
/// first deliveries leave a few milliseconds after the event, whatever the
/// size of its topic; each page after is four times larger.
const FIRST_PAGE: usize = 256;

/// The most records that wait for their lanes written at once: a part
/// holds the log's write connection for a few milliseconds.
const WAITING_PART: usize = 1_024;

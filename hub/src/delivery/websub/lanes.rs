//! Lanes: the endpoint as the unit of scheduling. Every callback host (its
//! authority, [`lane_of`]) has a lane: its records claimed from the log in
//! due order and only as many as it can take soon, its runners, and an
//! in-flight limit that adapts to how the host answers.
//!
//! - **Claimed once, sent.** A lane holds at most [`QUEUE_ROUNDS`] rounds
//!   of its limit (its slots plus a short queue). What it cannot take
//!   stays in the log, unclaimed, and is claimed for it as room frees: a
//!   host with a hundred thousand due records holds a few dozen of them,
//!   and the hosts beside it are claimed for in the same round. Nothing is
//!   written back to make room.
//! - **Knowing what is due without asking for everything.** A lane knows
//!   the earliest time the log may hold an unclaimed due record of its own
//!   ([`Lane::due`]), or held for it in memory: set when the expander
//!   writes or holds records the lane had no room for, when an outcome is recorded with a next attempt, and by the
//!   scheduler's periodic walk of the lanes in the log (records of a dead
//!   process, of another replica, retries written before a restart). A
//!   claim that finds fewer records than it asked for clears it.
//! - **A limit that adapts** ([`Limit`], shared with the outbox): a slow
//!   start, then additive increase, while the host answers quickly and
//!   without errors, multiplicative decrease on
//!   timeouts, refused connections, `5xx` and `429`, and when its answers
//!   slow down well past the fastest seen; between the configured floor
//!   and cap. A `Retry-After` on a `429` or `503` pauses the lane.
//!
//! A subscription that asked for ordered delivery has a lane of its own,
//! its callback's line ([`ordered_lane_of`]): records claimed one at a
//! time, head first, in recording order, never queued, limit one.
//!
//! A host at work holds its HTTP client, which its runners share; when its
//! work ends the client goes back to the idle ones ([`HostClients`]). A
//! lane is known only while it has work or due records: the map never
//! outgrows what the log holds.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use lru::LruCache;
use tokio::sync::OwnedSemaphorePermit;
use websub_store::Subscription;

use super::cache::Outgoing;
use crate::delivery::Channel;
use crate::delivery::direct::DirectClient;
use crate::delivery::limit::{Limit, Reply};
use crate::delivery::metrics::DELIVERIES_WAITING_FOR_HOST;
use crate::delivery::pool::HostClients;

/// How many rounds of its limit a lane holds claimed: one in flight, the
/// rest queued, so the next attempts are ready the moment a slot frees and
/// a claim is needed only once half of it has gone out.
pub(super) const QUEUE_ROUNDS: usize = 4;

/// The lane of a callback: its authority as written, less any credentials
/// (up to the first `@`). The event log derives the same from every record
/// (`lane` in the migrations), and claims by it.
pub fn lane_of(callback: &str) -> &str {
    let Some((_, rest)) = callback.split_once("://") else {
        return callback;
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    authority
        .split_once('@')
        .map_or(authority, |(_, host)| host)
}

/// The lane of the records of a subscription that asked for ordered
/// delivery: its callback, whole. The event log derives the same from
/// every ordered record (`lane` in the migrations).
pub fn ordered_lane_of(callback: &str) -> &str {
    callback
}

/// Whether `lane` is an ordered subscription's line ([`ordered_lane_of`])
/// rather than a host's ([`lane_of`]): an authority never holds `://`.
pub fn is_ordered_lane(lane: &str) -> bool {
    lane.contains("://")
}

/// A claimed record on its way to its host.
#[derive(Debug)]
pub(super) struct Job {
    pub(super) subscription: Arc<Subscription>,
    pub(super) outgoing: Arc<Outgoing>,
    pub(super) retry_count: u32,
    /// Its share of the scheduler's room, released when its outcome is sent.
    pub(super) permit: OwnedSemaphorePermit,
    pub(super) queued: Instant,
    /// Its record is held in memory, not in the log: its outcome creates it.
    pub(super) unwritten: bool,
}

impl Job {
    /// A record handed to its lane now, holding `permit` until its outcome
    /// is sent; `unwritten` when it is held in memory rather than the log.
    pub(super) fn new(
        permit: OwnedSemaphorePermit,
        (outgoing, subscription): (Arc<Outgoing>, Arc<Subscription>),
        retry_count: u32,
        unwritten: bool,
    ) -> Self {
        Self {
            subscription,
            outgoing,
            retry_count,
            permit,
            queued: Instant::now(),
            unwritten,
        }
    }

    /// Whether it waited longer than `max_wait` and goes back to the log.
    pub(super) fn is_stale(&self, max_wait: Duration) -> bool {
        self.queued.elapsed() > max_wait
    }
}

/// What becomes of a record handed to its lane.
#[derive(Debug)]
pub(super) enum Admission {
    /// The lane has a free slot: start a runner with the record, sending
    /// with the host's client.
    Run(Arc<str>, Job, DirectClient),
    /// It waits in the lane's queue.
    Queued,
    /// The lane is paused by a `Retry-After`: the record goes back to the
    /// log, due after the wait.
    Paused(Job, Duration),
}

/// What a runner does after an attempt.
#[derive(Debug)]
pub(super) enum Next {
    /// Attempt this record.
    Attempt(Job),
    /// Stop; the lane needs no more runners now.
    Stop,
}

#[derive(Debug)]
struct Lane {
    name: Arc<str>,
    /// The line of an ordered subscription's callback: one record held at a
    /// time, none queued.
    ordered: bool,
    /// Held while the lane has work.
    client: Option<DirectClient>,
    runners: usize,
    waiting: VecDeque<Job>,
    /// Records asked of the log (or being written claimed) for it and not
    /// yet handed over.
    asking: usize,
    limit: Limit,
    /// The earliest the log may hold an unclaimed due record of the lane.
    due: Option<DateTime<Utc>>,
    /// Counts the times `due` was set, so a claim clears only what it saw.
    marks: u64,
    /// With a rate limit: when the next attempt may start, and the most
    /// records the rate sends within a queue's wait.
    paced: Option<Pace>,
}

/// A lane's rate limit: attempts evenly spaced.
#[derive(Debug, Clone, Copy)]
struct Pace {
    every: Duration,
    next_start: Option<Instant>,
    /// The most records the lane holds: what the rate sends in half the
    /// longest wait in a queue, so that none goes back to the log for it.
    most_held: usize,
}

impl Lane {
    fn new(name: Arc<str>, limit: Limit, paced: Option<Pace>) -> Self {
        Self {
            paced,
            ordered: is_ordered_lane(&name),
            name,
            client: None,
            runners: 0,
            waiting: VecDeque::new(),
            asking: 0,
            limit,
            due: None,
            marks: 0,
        }
    }

    fn capacity(&self) -> usize {
        if self.ordered {
            return 1;
        }
        let capacity = self.limit.current().saturating_mul(QUEUE_ROUNDS);
        self.paced
            .map_or(capacity, |pace| capacity.min(pace.most_held))
    }

    fn held(&self) -> usize {
        self.runners + self.waiting.len() + self.asking
    }

    fn room(&self) -> usize {
        self.capacity().saturating_sub(self.held())
    }

    /// The room worth a claim: half the lane, so claims are few.
    fn refill_at(&self) -> usize {
        (self.capacity() / 2).max(1)
    }

    fn is_paused(&self, now: Instant) -> bool {
        self.limit.paused_for(now).is_some()
    }

    fn is_idle(&self) -> bool {
        self.runners == 0 && self.waiting.is_empty() && self.asking == 0 && self.due.is_none()
    }

    fn mark_due(&mut self, at: DateTime<Utc>) {
        self.due = Some(self.due.map_or(at, |due| due.min(at)));
        self.marks = self.marks.wrapping_add(1);
    }
}

/// Records asked of the log for one lane.
#[derive(Debug)]
pub(super) struct Ask {
    pub(super) lane: Arc<str>,
    pub(super) count: usize,
    marks: u64,
}

/// The most limits of idle lanes remembered: a few hundred KB.
const RESTING: std::num::NonZeroUsize = std::num::NonZeroUsize::new(4096).unwrap();

/// Every lane the scheduler knows.
#[derive(Debug)]
pub(super) struct Lanes {
    floor: usize,
    cap: usize,
    /// Attempts started per second per lane at most; 0 for no limit.
    rate: u32,
    max_wait: Duration,
    clients: HostClients,
    lanes: Mutex<HashMap<Arc<str>, Lane>>,
    /// The limits of lanes forgotten while idle, the most recent
    /// [`RESTING`]: a lane that comes back while its limit still holds
    /// ([`Limit::still_holds`]) takes it up again. Locked inside `lanes`.
    resting: Mutex<LruCache<Arc<str>, Limit>>,
    /// [`DELIVERIES_WAITING_FOR_HOST`].
    waiting: metrics::Gauge,
}

impl Lanes {
    /// Lanes whose limits stay within `floor..=cap`, a record waiting at
    /// most `max_wait` in a queue, sending with the hosts' `clients`.
    pub(super) fn new(
        floor: usize,
        cap: usize,
        rate: u32,
        max_wait: Duration,
        clients: HostClients,
    ) -> Self {
        Self {
            floor,
            cap,
            rate,
            max_wait,
            clients,
            lanes: Mutex::new(HashMap::new()),
            resting: Mutex::new(LruCache::new(RESTING)),
            waiting: metrics::gauge!(DELIVERIES_WAITING_FOR_HOST, "channel" => Channel::WebSub.label()),
        }
    }

    /// How long a record may wait in a queue.
    pub(super) fn max_wait(&self) -> Duration {
        self.max_wait
    }

    /// The log may hold unclaimed records of `lane` due at `at`.
    pub(super) fn mark_due(&self, lane: &str, at: DateTime<Utc>) {
        let mut lanes = self.lock();
        self.entry(&mut lanes, lane).mark_due(at);
    }

    /// Takes one slot of `lane`'s room for a record about to be written
    /// claimed; `false` when it has none (the record is written unclaimed
    /// and the lane marked due). A slot taken is handed over with
    /// [`admit`](Self::admit) or given back with [`unreserve`](Self::unreserve).
    pub(super) fn try_reserve(&self, lane: &str) -> bool {
        let mut lanes = self.lock();
        let lane = self.entry(&mut lanes, lane);
        if lane.room() == 0 || lane.is_paused(Instant::now()) {
            return false;
        }
        lane.asking += 1;
        true
    }

    /// Gives back `count` slots taken by [`try_reserve`](Self::try_reserve).
    pub(super) fn unreserve(&self, lane: &str, count: usize) {
        let mut lanes = self.lock();
        if let Some(entry) = lanes.get_mut(lane) {
            entry.asking = entry.asking.saturating_sub(count);
            self.forget_if_idle(&mut lanes, lane);
        }
    }

    /// The claims worth making at `now`, at most `budget` records in all:
    /// lanes with records due and room for half their queue, the most
    /// overdue first. Their room is taken until [`claimed`](Self::claimed).
    pub(super) fn reserve(&self, now: DateTime<Utc>, budget: usize) -> Vec<Ask> {
        let instant = Instant::now();
        let mut lanes = self.lock();
        let mut ready: Vec<(DateTime<Utc>, &mut Lane)> = lanes
            .values_mut()
            .filter_map(|lane| {
                let due = lane.due.filter(|due| *due <= now)?;
                (!lane.is_paused(instant) && lane.room() >= lane.refill_at()).then_some((due, lane))
            })
            .collect();
        ready.sort_by_key(|(due, _)| *due);
        let mut left = budget;
        let mut asks = Vec::new();
        for (_, lane) in ready {
            if left == 0 {
                break;
            }
            let count = lane.room().min(left);
            left -= count;
            lane.asking += count;
            asks.push(Ask {
                lane: lane.name.clone(),
                count,
                marks: lane.marks,
            });
        }
        asks
    }

    /// `count` of what `ask` asked for was found held in memory and is
    /// being handed over: its room is freed, and the claim asks the log
    /// only for the rest.
    pub(super) fn handed(&self, ask: &mut Ask, count: usize) {
        let mut lanes = self.lock();
        if let Some(lane) = lanes.get_mut(&ask.lane) {
            lane.asking = lane.asking.saturating_sub(count);
        }
        ask.count -= count;
    }

    /// The claim for `asks` came back with `got` records per lane (`None`
    /// when it failed): their room is freed for the records to be admitted,
    /// and a lane that got fewer than it asked for has nothing more due,
    /// unless it was marked since.
    pub(super) fn claimed(&self, asks: &[Ask], got: Option<&HashMap<&str, usize>>) {
        let mut lanes = self.lock();
        for ask in asks {
            let Some(lane) = lanes.get_mut(&ask.lane) else {
                continue;
            };
            lane.asking = lane.asking.saturating_sub(ask.count);
            if let Some(got) = got
                && got.get(&*ask.lane).copied().unwrap_or(0) < ask.count
                && lane.marks == ask.marks
            {
                lane.due = None;
            }
            self.forget_if_idle(&mut lanes, &ask.lane);
        }
    }

    /// The earliest due time of a lane that is waiting for it (for the
    /// scheduler's sleep), if any is later than `now`.
    pub(super) fn next_due(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.lock()
            .values()
            .filter_map(|lane| lane.due)
            .filter(|due| *due > now)
            .min()
    }

    /// Hands `job` to `lane`: see [`Admission`].
    pub(super) fn admit(&self, lane: &str, job: Job) -> Admission {
        let mut lanes = self.lock();
        let entry = self.entry(&mut lanes, lane);
        let now = Instant::now();
        if let Some(wait) = entry.limit.paused_for(now) {
            return Admission::Paused(job, wait);
        }
        if entry.runners < entry.limit.current() {
            let client = match &entry.client {
                Some(client) => client.clone(),
                None => {
                    let name = entry.name.clone();
                    // Building a client takes longer than the lock should
                    // be held; a lane is only ever removed when idle, and
                    // this one is about to hold a runner.
                    entry.runners += 1;
                    drop(lanes);
                    let client = self.clients.checkout(&name);
                    let mut lanes = self.lock();
                    let entry = self.entry(&mut lanes, &name);
                    let spare = entry.client.replace(client.clone());
                    drop(lanes);
                    if let Some(spare) = spare {
                        self.clients.checkin(&name, spare);
                    }
                    return Admission::Run(name, job, client);
                }
            };
            entry.runners += 1;
            return Admission::Run(entry.name.clone(), job, client);
        }
        entry.waiting.push_back(job);
        self.waiting.increment(1.0);
        Admission::Queued
    }

    /// A runner of `lane` is free after an attempt the host took as
    /// `reply` (none if it made none, or the reply says nothing of the
    /// host): what it does next. Records that waited too long are moved to
    /// `stale`; a lane paused by a `Retry-After` hands every waiting record
    /// there. Returns whether the lane has room worth a claim and no claim
    /// under way.
    pub(super) fn next(
        &self,
        lane: &str,
        reply: Option<Reply>,
        stale: &mut Vec<Job>,
    ) -> (Next, bool) {
        let now = Instant::now();
        let mut lanes = self.lock();
        let Some(entry) = lanes.get_mut(lane) else {
            return (Next::Stop, false);
        };
        if let Some(reply) = reply {
            entry.limit.observe(reply, now);
        }
        let mut next = Next::Stop;
        if entry.is_paused(now) {
            while let Some(job) = entry.waiting.pop_front() {
                self.waiting.decrement(1.0);
                stale.push(job);
            }
        } else if entry.runners <= entry.limit.current() {
            while let Some(job) = entry.waiting.pop_front() {
                self.waiting.decrement(1.0);
                if job.is_stale(self.max_wait) {
                    stale.push(job);
                } else {
                    next = Next::Attempt(job);
                    break;
                }
            }
        }
        if matches!(next, Next::Stop) {
            entry.runners -= 1;
        }
        // The record just done, and any handed back, freed room: worth a
        // claim once it reaches half the lane and no claim is under way.
        // Whether it is, not whether it just crossed: a limit that grew
        // with this reply makes the room jump past half, and the claim
        // loop, told of no crossing, would sleep out its poll interval.
        let refill = entry.due.is_some()
            && entry.asking == 0
            && !entry.is_paused(now)
            && entry.room() >= entry.refill_at();
        if entry.runners == 0 && entry.waiting.is_empty() {
            if let Some(client) = entry.client.take() {
                drop(lanes);
                self.clients.checkin(lane, client);
                lanes = self.lock();
            }
            self.forget_if_idle(&mut lanes, lane);
        }
        (next, refill)
    }

    /// Pauses `lane` for `wait` (a `Retry-After`): no attempt starts before
    /// then, and no claim is made for it.
    pub(super) fn pause(&self, lane: &str, wait: Duration) {
        let mut lanes = self.lock();
        if let Some(entry) = lanes.get_mut(lane) {
            entry.limit.pause(wait, Instant::now());
        }
    }

    /// How long the next attempt of `lane` waits for its rate limit, if it
    /// has one: each attempt takes the next start, evenly spaced.
    pub(super) fn pace(&self, lane: &str) -> Option<Duration> {
        if self.rate == 0 {
            return None;
        }
        let now = Instant::now();
        let mut lanes = self.lock();
        let pace = lanes.get_mut(lane)?.paced.as_mut()?;
        let start = pace.next_start.map_or(now, |next| next.max(now));
        pace.next_start = Some(start + pace.every);
        start
            .checked_duration_since(now)
            .filter(|wait| !wait.is_zero())
    }

    /// How long `lane` is still paused, if it is.
    pub(super) fn paused_for(&self, lane: &str) -> Option<Duration> {
        let now = Instant::now();
        self.lock()
            .get(lane)
            .and_then(|lane| lane.limit.paused_for(now))
    }

    fn entry<'a>(&self, lanes: &'a mut HashMap<Arc<str>, Lane>, lane: &str) -> &'a mut Lane {
        if !lanes.contains_key(lane) {
            let name: Arc<str> = Arc::from(lane);
            let rested = self
                .lock_resting()
                .pop(lane)
                .filter(|limit| limit.still_holds(Instant::now()));
            let limit = if is_ordered_lane(&name) {
                Limit::new(1, 1)
            } else {
                rested.unwrap_or_else(|| Limit::new(self.floor, self.cap))
            };
            let paced = (self.rate > 0).then(|| Pace {
                every: Duration::from_secs(1) / self.rate,
                next_start: None,
                most_held: usize::try_from(
                    u64::from(self.rate).saturating_mul(self.max_wait.as_secs() / 2),
                )
                .unwrap_or(usize::MAX)
                .max(1),
            });
            lanes.insert(name.clone(), Lane::new(name, limit, paced));
        }
        // Inserted just above when missing.
        #[allow(clippy::unwrap_used)]
        lanes.get_mut(lane).unwrap()
    }

    fn forget_if_idle(&self, lanes: &mut HashMap<Arc<str>, Lane>, lane: &str) {
        if lanes.get(lane).is_some_and(Lane::is_idle)
            && let Some(lane) = lanes.remove(lane)
            && !lane.ordered
        {
            self.lock_resting().put(lane.name, lane.limit);
        }
    }

    fn lock_resting(&self) -> std::sync::MutexGuard<'_, LruCache<Arc<str>, Limit>> {
        self.resting
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Lane>> {
        self.lanes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lane_is_the_authority_less_credentials() {
        assert_eq!(lane_of("http://127.0.0.1:9000/cb?x=1"), "127.0.0.1:9000");
        assert_eq!(lane_of("https://user:pw@Sub.example/cb"), "Sub.example");
        assert_eq!(lane_of("https://[::1]:8443?q"), "[::1]:8443");
        assert_eq!(lane_of("https://sub.example"), "sub.example");
        assert_eq!(lane_of("https://sub.example#frag"), "sub.example");
        assert_eq!(lane_of("https://a@b@sub.example/x"), "b@sub.example");
        assert_eq!(lane_of("orders-webhook"), "orders-webhook");
    }
}

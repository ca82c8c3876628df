//! The queue of each callback host: claimed records wait here for one of
//! their host's delivery slots, so that a busy, slow or dead host holds
//! only its own share of the scheduler and never the slots of the others.
//!
//! A host has at most `per_host` runners, each sending its records one
//! after another; a record that finds every runner of its host busy waits
//! in the host's queue. Waiting costs a few dozen bytes, not a task, so
//! thousands of records can wait cheaply while the network is slow. A host
//! is known only while it has work: the map never outgrows what is claimed.
//!
//! What a host holds is bounded twice:
//!
//! - in records: its queue holds [`QUEUE_ROUNDS`] rounds of its slots. A
//!   record beyond that goes back to the log at once, due when the host
//!   should have room for it, paced by how long the host's attempts take
//!   ([`Admission::Overflow`]). So one host with a hundred thousand records
//!   (or a dead one) cannot fill the scheduler's room and hold up the hosts
//!   after it, and what it cannot take now stays in the log for any
//!   replica to claim.
//! - in time: a record that waited longer than the scheduler allows is
//!   handed back to go back to the log too, so no claim goes stale in a
//!   queue.
//!
//! Neither counts as a failed attempt.
//!
//! A host at work holds its HTTP client, which its runners share; when its
//! work ends the client goes back to the idle ones ([`HostClients`]).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::OwnedSemaphorePermit;
use websub_store::Subscription;

use super::cache::Outgoing;
use crate::delivery::Channel;
use crate::delivery::metrics::DELIVERIES_WAITING_FOR_HOST;
use crate::delivery::pool::HostClients;

/// How many rounds of its slots a host's queue holds.
pub(super) const QUEUE_ROUNDS: usize = 16;

/// The earliest a record put off for a full queue is due again: the claim
/// loop should not take it straight back.
const LEAST_OVERFLOW_WAIT: Duration = Duration::from_millis(250);

/// A claimed record on its way to its host.
#[derive(Debug)]
pub(super) struct Job {
    pub(super) subscription: Arc<Subscription>,
    pub(super) outgoing: Arc<Outgoing>,
    pub(super) retry_count: u32,
    /// Its share of the scheduler's room, released when its outcome is sent.
    pub(super) permit: OwnedSemaphorePermit,
    pub(super) queued: Instant,
}

impl Job {
    /// Whether it waited longer than `max_wait` and goes back to the log.
    pub(super) fn is_stale(&self, max_wait: Duration) -> bool {
        self.queued.elapsed() > max_wait
    }
}

/// What becomes of a record handed to its host.
#[derive(Debug)]
pub(super) enum Admission {
    /// The host has a free runner: start one with the record, sending
    /// with the host's client.
    Run(Arc<str>, Job, reqwest::Client),
    /// It waits in the host's queue.
    Queued,
    /// The queue is full: the record goes back to the log, due after
    /// `wait`, when the host should have room for it.
    Overflow(Job, Duration),
}

#[derive(Debug)]
struct Host {
    name: Arc<str>,
    client: reqwest::Client,
    runners: usize,
    waiting: VecDeque<Job>,
    /// When the host got work: before any attempt has ended, the time
    /// since is the least its attempts take.
    since: Instant,
    /// How long its attempts take, a moving average.
    mean_attempt: Option<Duration>,
    /// When the last record put off for a full queue is due.
    overflow_until: Option<Instant>,
}

impl Host {
    fn new(name: Arc<str>, client: reqwest::Client) -> Self {
        Self {
            name,
            client,
            runners: 1,
            waiting: VecDeque::new(),
            since: Instant::now(),
            mean_attempt: None,
            overflow_until: None,
        }
    }

    /// One attempt took `took`: the average moves an eighth of the way.
    fn observe(&mut self, took: Duration) {
        self.mean_attempt = Some(match self.mean_attempt {
            None => took,
            Some(mean) => (mean * 7 + took) / 8,
        });
    }

    /// When another record put off now should be due: after the queue
    /// ahead of it and every record put off before it, at the pace of
    /// `per_host` attempts of the host's usual length at once.
    fn pace_overflow(&mut self, per_host: usize, now: Instant) -> Duration {
        let attempt = self.mean_attempt.unwrap_or_else(|| self.since.elapsed());
        let per_record = attempt / u32::try_from(per_host).unwrap_or(u32::MAX).max(1);
        let queued = u32::try_from(self.waiting.len()).unwrap_or(u32::MAX);
        let after_queue = now + per_record.saturating_mul(queued);
        let due = self
            .overflow_until
            .map_or(after_queue, |until| until.max(after_queue))
            + per_record;
        self.overflow_until = Some(due);
        due.saturating_duration_since(now).max(LEAST_OVERFLOW_WAIT)
    }
}

/// The queues of every host with work.
#[derive(Debug)]
pub(super) struct HostQueues {
    per_host: usize,
    max_wait: Duration,
    clients: HostClients,
    hosts: Mutex<HashMap<Arc<str>, Host>>,
    /// [`DELIVERIES_WAITING_FOR_HOST`].
    waiting: metrics::Gauge,
}

impl HostQueues {
    /// Queues with up to `per_host` runners per host, a record waiting at
    /// most `max_wait`, sending with the hosts' `clients`.
    pub(super) fn new(per_host: usize, max_wait: Duration, clients: HostClients) -> Self {
        Self {
            per_host,
            max_wait,
            clients,
            hosts: Mutex::new(HashMap::new()),
            waiting: metrics::gauge!(DELIVERIES_WAITING_FOR_HOST, "channel" => Channel::WebSub.label()),
        }
    }

    /// How long a record may wait for its host.
    pub(super) fn max_wait(&self) -> Duration {
        self.max_wait
    }

    /// Hands `job` to `host`: see [`Admission`].
    pub(super) fn admit(&self, host: &str, job: Job) -> Admission {
        let mut hosts = self.lock();
        if !hosts.contains_key(host) {
            // Building a client takes longer than the lock should be held.
            drop(hosts);
            let client = self.clients.checkout(host);
            hosts = self.lock();
            if !hosts.contains_key(host) {
                let name: Arc<str> = Arc::from(host);
                hosts.insert(name.clone(), Host::new(name.clone(), client.clone()));
                return Admission::Run(name, job, client);
            }
            // Another record of the host came first: this client is spare.
            drop(hosts);
            self.clients.checkin(host, client);
            hosts = self.lock();
        }
        let per_host = self.per_host;
        let admission = match hosts.get_mut(host) {
            // Only `next` removes a host, when its last runner stops; then
            // this record starts the host again.
            None => Err(job),
            Some(queue) if queue.runners < per_host => {
                queue.runners += 1;
                Ok(Admission::Run(
                    queue.name.clone(),
                    job,
                    queue.client.clone(),
                ))
            }
            Some(queue) if queue.waiting.len() >= per_host.saturating_mul(QUEUE_ROUNDS) => {
                let wait = queue.pace_overflow(per_host, Instant::now());
                Ok(Admission::Overflow(job, wait))
            }
            Some(queue) => {
                queue.waiting.push_back(job);
                self.waiting.increment(1.0);
                Ok(Admission::Queued)
            }
        };
        drop(hosts);
        admission.unwrap_or_else(|job| self.admit(host, job))
    }

    /// A runner of `host` is free after an attempt that took `took` (none
    /// if it made none): its next record, or `None` and the runner stops.
    /// Records that waited too long are moved to `stale`.
    pub(super) fn next(
        &self,
        host: &str,
        took: Option<Duration>,
        stale: &mut Vec<Job>,
    ) -> Option<Job> {
        let mut hosts = self.lock();
        let queue = hosts.get_mut(host)?;
        if let Some(took) = took {
            queue.observe(took);
        }
        while let Some(job) = queue.waiting.pop_front() {
            self.waiting.decrement(1.0);
            if job.is_stale(self.max_wait) {
                stale.push(job);
            } else {
                return Some(job);
            }
        }
        queue.runners -= 1;
        if queue.runners == 0
            && let Some(done) = hosts.remove(host)
        {
            drop(hosts);
            self.clients.checkin(host, done.client);
        }
        None
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Host>> {
        self.hosts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_client() -> reqwest::Client {
        crate::net::install_crypto_provider();
        reqwest::Client::new()
    }

    #[test]
    fn records_put_off_are_paced_by_the_hosts_attempts() {
        let mut host = Host::new(Arc::from("h:1"), test_client());
        host.observe(Duration::from_millis(800));
        let now = Instant::now();
        // 4 at a time, 800 ms each: one record every 200 ms.
        let first = host.pace_overflow(4, now);
        let second = host.pace_overflow(4, now);
        let third = host.pace_overflow(4, now);
        assert_eq!(first, Duration::from_millis(250));
        assert_eq!(second, Duration::from_millis(400));
        assert_eq!(third, Duration::from_millis(600));
    }

    #[test]
    fn the_average_follows_the_attempts() {
        let mut host = Host::new(Arc::from("h:1"), test_client());
        host.observe(Duration::from_millis(80));
        assert_eq!(host.mean_attempt, Some(Duration::from_millis(80)));
        host.observe(Duration::from_millis(160));
        assert_eq!(host.mean_attempt, Some(Duration::from_millis(90)));
    }
}

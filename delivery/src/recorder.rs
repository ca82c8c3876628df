//! The outcome recorder: gathers the outcomes of finished attempts, writes
//! them in batches through a small [`OutcomeStore`] (the hub's event log, a
//! producer's deliveries table), retries a failed write, and wakes its
//! scheduler when the earliest retry it wrote falls due.
//!
//! Delivery stays at least once whatever happens here: outcomes whose write
//! fails for good leave their records claimed, and the records are attempted
//! again once the visibility timeout passes.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

/// Where a scheduler's outcomes are written.
#[async_trait]
pub trait OutcomeStore: Send + Sync + 'static {
    /// One finished attempt, as the store records it.
    type Entry: Send + Sync + 'static;

    /// Writes `batch` in one round trip.
    async fn write(&self, batch: &[Self::Entry]) -> Result<(), String>;

    /// How long until `outcome` is due again, if it is a retry.
    fn retry_in(&self, outcome: &Self::Entry) -> Option<Duration>;

    /// Asks the scheduler to look for due work (a retry fell due).
    fn wake(&self);

    /// Writing `batch` failed for good: its records are left to the
    /// visibility timeout, or to whatever else the store knows to do.
    fn given_up(&self, _batch: &[Self::Entry]) {}
}

/// How a scheduler's outcomes are batched. The two schedulers tune these
/// differently; each says why where it sets them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    /// The most outcomes in one write.
    pub limit: usize,
    /// How long outcomes are gathered into one write after the first.
    pub gathering: Duration,
    /// Writes in flight at once.
    pub writers: usize,
}

/// Tries of one write before its outcomes are left to the visibility
/// timeout: with the backoff below, about 16 s, well inside the default
/// visibility timeout of 60 s.
const WRITE_ATTEMPTS: u32 = 10;

/// Receives outcomes until every sender is dropped, writing them in batches;
/// returns once the last batch is written (or given up).
pub async fn record<S: OutcomeStore>(
    store: S,
    mut outcomes: mpsc::UnboundedReceiver<S::Entry>,
    batching: Batching,
) {
    let store = Arc::new(store);
    let limit = batching.limit.max(1);
    let writers = Arc::new(Semaphore::new(batching.writers.max(1)));
    let writes = TaskTracker::new();
    loop {
        let mut batch = Vec::with_capacity(limit);
        if outcomes.recv_many(&mut batch, limit).await == 0 {
            break;
        }
        // One write of a hundred outcomes costs about what one write of one
        // does: what arrives in the next moment joins it.
        let gather = async {
            while batch.len() < limit {
                let room = limit - batch.len();
                if outcomes.recv_many(&mut batch, room).await == 0 {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(batching.gathering, gather).await;
        // While every writer is busy the batch goes on growing: the busier
        // the store, the fewer and larger its writes.
        let mut open = true;
        let writer = loop {
            let room = limit - batch.len();
            tokio::select! {
                biased;
                writer = writers.clone().acquire_owned() => break writer,
                received = outcomes.recv_many(&mut batch, room), if open && room > 0 => {
                    open = received > 0;
                }
            }
        };
        let Ok(writer) = writer else {
            break;
        };
        let store = store.clone();
        writes.spawn(async move {
            write(store, &batch).await;
            drop(writer);
        });
    }
    writes.close();
    writes.wait().await;
}

async fn write<S: OutcomeStore>(store: Arc<S>, batch: &[S::Entry]) {
    let mut delay = Duration::from_millis(50);
    for attempt in 1..=WRITE_ATTEMPTS {
        let started = std::time::Instant::now();
        match store.write(batch).await {
            Ok(()) => {
                debug!(records = batch.len(), took = ?started.elapsed(), "recorded outcomes");
                break;
            }
            Err(error) if attempt < WRITE_ATTEMPTS => {
                warn!(%error, records = batch.len(), "recording outcomes failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err(error) => {
                warn!(%error, records = batch.len(), "recording outcomes failed; they will be attempted again");
                store.given_up(batch);
                return;
            }
        }
    }
    // Retries are due sooner than the next poll, the first at once: the
    // scheduler is woken when the earliest falls due.
    if let Some(wait) = batch
        .iter()
        .filter_map(|outcome| store.retry_in(outcome))
        .min()
    {
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            store.wake();
        });
    }
}

//! The loop that works a backlog queue: claim as many due rows as there is
//! room for, run each in its own task, and claim again when room frees, when
//! new work is written (a wake-up), or at the poll interval (work written by
//! another replica, retries falling due, claims of a dead process expiring).
//! The topic fetchers and the verifiers both run it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::warn;

use super::BacklogError;

/// How often a worker looks for due rows when nothing wakes it.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// One kind of backlog work.
#[async_trait]
pub trait Job: Send + Sync + 'static {
    /// A claimed row.
    type Item: Send + 'static;

    /// What the work is called in logs.
    fn name(&self) -> &'static str;

    /// Claims up to `limit` due rows.
    async fn claim(&self, limit: usize) -> Result<Vec<Self::Item>, BacklogError>;

    /// Does the work of one row and records how it ended.
    async fn run(&self, item: Self::Item);
}

/// Runs `job` with at most `concurrency` rows in flight until `stop`, then
/// returns; the rows in flight go on in `tracker`, which the caller closes
/// and waits for. `wake` is notified whenever new work is written.
pub async fn work<J: Job>(
    job: Arc<J>,
    concurrency: usize,
    wake: Arc<Notify>,
    tracker: TaskTracker,
    stop: CancellationToken,
) {
    let room = Arc::new(Semaphore::new(concurrency.clamp(1, Semaphore::MAX_PERMITS)));
    let freed = Arc::new(Notify::new());
    loop {
        let available = room.available_permits();
        let mut claimed = 0;
        if available > 0 {
            match job.claim(available).await {
                Ok(items) => {
                    claimed = items.len();
                    for item in items {
                        // Never fails: at most `available` rows were claimed.
                        let Ok(permit) = room.clone().try_acquire_owned() else {
                            break;
                        };
                        let job = job.clone();
                        let freed = freed.clone();
                        tracker.spawn(async move {
                            job.run(item).await;
                            drop(permit);
                            freed.notify_one();
                        });
                    }
                }
                Err(error) => warn!(%error, work = job.name(), "claiming backlog work failed"),
            }
        }
        if claimed > 0 && claimed == available {
            // There may be more due: claim again as soon as room frees.
            tokio::select! {
                () = stop.cancelled() => return,
                () = freed.notified() => continue,
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = wake.notified() => {}
            () = freed.notified(), if room.available_permits() == 0 => {}
            () = tokio::time::sleep(POLL_INTERVAL) => {}
        }
    }
}

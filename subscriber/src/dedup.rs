//! Dropping deliveries already processed. Delivery is at least once, so a
//! receiver sees the same event again after a lost acknowledgement or a
//! hub restart; this module remembers event ids so the handler runs once per
//! event.
//!
//! A key goes through three states: unseen, in progress (claimed by a
//! delivery whose handler is running), done. A failed handler releases its
//! claim, so the hub's retry is processed; a duplicate that arrives while
//! the first copy is still in progress is told to come back later rather
//! than acknowledged, since the first copy may yet fail.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Mutex;

use async_trait::async_trait;

/// What [`DedupStore::claim`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Never seen (or forgotten): the caller now holds the claim and must
    /// [`complete`](DedupStore::complete) or [`release`](DedupStore::release)
    /// it.
    New,
    /// Claimed by a delivery still being processed.
    InProgress,
    /// Processed already.
    Done,
}

/// A dedup store that could not answer.
#[derive(Debug, thiserror::Error)]
#[error("the dedup store failed: {0}")]
pub struct DedupError(#[source] pub Box<dyn std::error::Error + Send + Sync>);

/// Remembers which deliveries were processed.
///
/// # Contract
/// - `claim` is atomic: of concurrent claims of one key, exactly one gets
///   [`Claim::New`].
/// - `complete` makes later claims of the key [`Claim::Done`], for as long
///   as the store remembers it; `release` makes the key unseen again.
/// - A store may forget keys (it is bounded), and should let a claim that
///   was neither completed nor released lapse after a while, or a process
///   that died mid-handler would block that event for good.
///
/// Keys are opaque strings built by the receiver from the event id and the
/// callback it arrived at.
#[async_trait]
pub trait DedupStore: Send + Sync + 'static {
    /// Claims `key` if it is unseen; reports its state otherwise.
    async fn claim(&self, key: &str) -> Result<Claim, DedupError>;
    /// Marks a claimed key processed.
    async fn complete(&self, key: &str) -> Result<(), DedupError>;
    /// Gives up a claim whose processing failed, so a retry is processed.
    async fn release(&self, key: &str) -> Result<(), DedupError>;
}

/// The ids a receiver remembers by default.
pub const DEFAULT_DEDUP_CAPACITY: usize = 100_000;

/// An in-memory [`DedupStore`] bounded to a number of keys: past it, the
/// oldest claimed key is forgotten first. Lost on restart.
pub struct MemoryDedup {
    capacity: usize,
    inner: Mutex<Slots>,
}

#[derive(Default)]
struct Slots {
    /// Key → (claim order, done).
    states: HashMap<String, (u64, bool)>,
    /// Keys in claim order; an entry whose order no longer matches the map
    /// is stale (the key was released or claimed again) and is skipped.
    order: VecDeque<(u64, String)>,
    next: u64,
}

impl Slots {
    fn insert(&mut self, key: &str, done: bool, capacity: usize) {
        let order = self.next;
        self.next += 1;
        self.states.insert(key.to_owned(), (order, done));
        self.order.push_back((order, key.to_owned()));
        while self.states.len() > capacity {
            let Some((order, key)) = self.order.pop_front() else {
                break;
            };
            if self
                .states
                .get(&key)
                .is_some_and(|(held, _)| *held == order)
            {
                self.states.remove(&key);
            }
        }
        // Stale entries pile up when keys are released; drop them before
        // the queue outgrows the map by much.
        if self.order.len() > 2 * capacity + 16 {
            let states = &self.states;
            self.order
                .retain(|(order, key)| states.get(key).is_some_and(|(held, _)| held == order));
        }
    }
}

impl fmt::Debug for MemoryDedup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryDedup")
            .field("capacity", &self.capacity)
            .field("len", &self.len())
            .finish()
    }
}

impl Default for MemoryDedup {
    fn default() -> Self {
        Self::new(DEFAULT_DEDUP_CAPACITY)
    }
}

impl MemoryDedup {
    /// A store remembering at most `capacity` keys (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            inner: Mutex::new(Slots::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// How many keys it remembers now.
    pub fn len(&self) -> usize {
        self.lock().states.len()
    }

    /// Whether it remembers nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most keys it remembers.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

#[async_trait]
impl DedupStore for MemoryDedup {
    async fn claim(&self, key: &str) -> Result<Claim, DedupError> {
        let mut slots = self.lock();
        Ok(match slots.states.get(key) {
            Some((_, true)) => Claim::Done,
            Some((_, false)) => Claim::InProgress,
            None => {
                slots.insert(key, false, self.capacity);
                Claim::New
            }
        })
    }

    async fn complete(&self, key: &str) -> Result<(), DedupError> {
        let mut slots = self.lock();
        match slots.states.get_mut(key) {
            Some((_, done)) => *done = true,
            // Forgotten while its handler ran: remember it again.
            None => slots.insert(key, true, self.capacity),
        }
        Ok(())
    }

    async fn release(&self, key: &str) -> Result<(), DedupError> {
        let mut slots = self.lock();
        if slots.states.get(key).is_some_and(|(_, done)| !done) {
            slots.states.remove(key);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_key_is_new_then_in_progress_then_done() {
        let store = MemoryDedup::new(10);
        assert_eq!(store.claim("a").await.ok(), Some(Claim::New));
        assert_eq!(store.claim("a").await.ok(), Some(Claim::InProgress));
        store.complete("a").await.expect("complete");
        assert_eq!(store.claim("a").await.ok(), Some(Claim::Done));
        // Releasing a processed key changes nothing.
        store.release("a").await.expect("release");
        assert_eq!(store.claim("a").await.ok(), Some(Claim::Done));
    }

    #[tokio::test]
    async fn a_released_claim_can_be_claimed_again() {
        let store = MemoryDedup::new(10);
        assert_eq!(store.claim("a").await.ok(), Some(Claim::New));
        store.release("a").await.expect("release");
        assert_eq!(store.claim("a").await.ok(), Some(Claim::New));
    }

    #[tokio::test]
    async fn the_oldest_key_is_forgotten_past_the_capacity() {
        let store = MemoryDedup::new(3);
        for key in ["a", "b", "c", "d"] {
            assert_eq!(store.claim(key).await.ok(), Some(Claim::New));
            store.complete(key).await.expect("complete");
        }
        assert_eq!(store.len(), 3);
        assert_eq!(store.claim("b").await.ok(), Some(Claim::Done));
        assert_eq!(store.claim("a").await.ok(), Some(Claim::New), "forgotten");
        assert_eq!(store.len(), 3);
        assert_eq!(store.claim("b").await.ok(), Some(Claim::New), "forgotten");
    }

    #[tokio::test]
    async fn released_keys_do_not_grow_the_queue_without_bound() {
        let store = MemoryDedup::new(4);
        for round in 0..1_000 {
            let key = format!("k{round}");
            store.claim(&key).await.expect("claim");
            store.release(&key).await.expect("release");
        }
        assert!(store.is_empty());
        assert!(store.lock().order.len() <= 2 * 4 + 16 + 1);
    }
}

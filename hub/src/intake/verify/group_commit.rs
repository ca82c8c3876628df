//! Writes in groups: the subscription requests that arrive while a write is
//! under way, the subscriptions verified meanwhile, the catch-ups of those
//! saved meanwhile, or the verifications that end meanwhile, are written
//! together, in one statement or transaction, and each caller is answered
//! once its part is durable. Under load one costs a share of a write
//! instead of a write of its own; alone, it is written at once.
//!
//! Bounded: at most [`QUEUED`] wait for a group, past which callers wait
//! to join one; a group holds at most [`MOST_AT_ONCE`], and names a
//! subscription (a topic and callback) once: a second for the same pair
//! goes with the next group, after the first.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use websub_store::{StoreError, Subscription, SubscriptionStore};

use crate::storage::backlog::{BacklogError, Intent, IntentResult};
use crate::storage::events::{DeliveryQueue, EventLogError, Owed};

/// The most written in one transaction.
const MOST_AT_ONCE: usize = 256;

/// The most waiting for a group.
const QUEUED: usize = 1024;

/// What a group holds: something about one subscription.
pub(super) trait Part: Send + 'static {
    /// The topic and callback it is about.
    fn pair(&self) -> (&str, &str);
}

impl Part for Intent {
    fn pair(&self) -> (&str, &str) {
        (&self.request.topic, &self.request.callback)
    }
}

impl Part for (Intent, IntentResult) {
    fn pair(&self) -> (&str, &str) {
        self.0.pair()
    }
}

impl Part for Subscription {
    fn pair(&self) -> (&str, &str) {
        (&self.topic, &self.callback)
    }
}

/// A subscription just saved, owed the events of its topic recorded since
/// its verification request was sent.
#[derive(Debug)]
pub(super) struct Owing {
    pub(super) topic: String,
    pub(super) callback: String,
    pub(super) since: chrono::DateTime<chrono::Utc>,
}

impl Owing {
    fn owed(&self) -> Owed<'_> {
        Owed {
            topic: &self.topic,
            subscriber: &self.callback,
            since: self.since,
        }
    }
}

impl Part for Owing {
    fn pair(&self) -> (&str, &str) {
        (&self.topic, &self.callback)
    }
}

/// A part waiting for its group, and where its answer goes.
type Waiting<P, R> = (P, oneshot::Sender<R>);

/// The way into the groups of one kind of write, each part answered with
/// an `R`.
#[derive(Debug)]
pub(super) struct GroupCommit<P, R> {
    sender: mpsc::Sender<Waiting<P, R>>,
}

impl<P: Part, R: Send + 'static> GroupCommit<P, R> {
    /// Starts the writer of groups: `write` writes a group durably and
    /// answers each of its parts, in order.
    pub(super) fn start<W, F>(write: W) -> Self
    where
        W: Fn(Vec<P>) -> F + Send + 'static,
        F: Future<Output = Vec<R>> + Send + 'static,
    {
        let (sender, receiver) = mpsc::channel(QUEUED);
        tokio::spawn(write_groups(write, receiver));
        Self { sender }
    }

    /// Writes `part` with the group it arrives in; returns its answer once
    /// that is durable, or `None` if the writer of groups is gone.
    pub(super) async fn join(&self, part: P) -> Option<R> {
        let (answer, answered) = oneshot::channel();
        self.sender.send((part, answer)).await.ok()?;
        answered.await.ok()
    }
}

/// Each of a group of `count`'s answer when its write failed with `error`.
pub(super) fn failed<A>(count: usize, error: BacklogError) -> Vec<Result<A, BacklogError>> {
    let error = Arc::new(error);
    (0..count)
        .map(|_| Err(BacklogError::Group(error.clone())))
        .collect()
}

/// Saves `subscriptions` in one write, each renewing the subscription of
/// its pair if there is one (see [`SubscriptionStore::renew_all`]), and
/// answers each; when that fails, each is saved on its own, so that each
/// hears its own answer (one over a store's limit fails alone).
pub(super) async fn renew_all(
    store: &dyn SubscriptionStore,
    subscriptions: &[Subscription],
) -> Vec<Result<(), StoreError>> {
    if store.renew_all(subscriptions).await.is_ok() {
        return subscriptions.iter().map(|_| Ok(())).collect();
    }
    let mut saved = Vec::with_capacity(subscriptions.len());
    for subscription in subscriptions {
        saved.push(store.renew_all(std::slice::from_ref(subscription)).await);
    }
    saved
}

/// Writes the records `owing` is owed, due at `now`, in one write, and
/// answers each; when that fails, each is caught up on its own, so that
/// each hears its own answer. `wake` (the scheduler's) is called when
/// records were written.
pub(super) async fn deliver_since_all(
    events: &dyn DeliveryQueue,
    owing: &[Owing],
    now: chrono::DateTime<chrono::Utc>,
    wake: &(dyn Fn() + Send + Sync),
) -> Vec<Result<(), EventLogError>> {
    let handed_over = |written: u64| {
        if written > 0 {
            tracing::info!(
                events = written,
                "events published during verification handed over"
            );
            wake();
        }
    };
    let all: Vec<Owed<'_>> = owing.iter().map(Owing::owed).collect();
    if let Ok(written) = events.deliver_since(&all, now).await {
        handed_over(written);
        return owing.iter().map(|_| Ok(())).collect();
    }
    let mut answers = Vec::with_capacity(all.len());
    for owed in all {
        answers.push(events.deliver_since(&[owed], now).await.map(handed_over));
    }
    answers
}

/// What a caller hears when the writer of groups is gone.
pub(super) fn stopped() -> BacklogError {
    BacklogError::Invalid("the writer of groups stopped".to_owned())
}

async fn write_groups<P: Part, R, W, F>(write: W, mut receiver: mpsc::Receiver<Waiting<P, R>>)
where
    W: Fn(Vec<P>) -> F,
    F: Future<Output = Vec<R>>,
{
    let mut arrived = Vec::with_capacity(MOST_AT_ONCE);
    while receiver.recv_many(&mut arrived, MOST_AT_ONCE).await > 0 {
        let mut rest = std::mem::take(&mut arrived);
        while !rest.is_empty() {
            let mut pairs = HashSet::new();
            let end = rest
                .iter()
                .position(|(part, _)| !pairs.insert(part.pair()))
                .unwrap_or(rest.len());
            let later = rest.split_off(end);
            let (parts, answers): (Vec<P>, Vec<_>) = rest.into_iter().unzip();
            for (answer, result) in answers.into_iter().zip(write(parts).await) {
                let _ = answer.send(result);
            }
            rest = later;
        }
    }
}

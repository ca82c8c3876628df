//! Which outbox events a feed's bridge takes: those whose topic has at least
//! one WebSub subscription in the hub's subscription store. An event nobody
//! subscribes to gets no delivery row, as for any subscriber of an outbox.
//!
//! The feed keeps the subscribed topics its template can render, each with
//! when its oldest subscription was made, and hands the dispatcher one
//! [`EventMatch`] per topic ([`Dispatcher::restrict_catch_all`]); expansion
//! then writes the bridge's rows for the events those describe, in SQL, with
//! no look at the store per event. The list is read from the store when the
//! feed starts, again for a topic whenever a subscription to it is saved or
//! deleted through this hub ([`SubscribedTopics::changed`]), and in full
//! every [`TOPICS_REFRESH`] (changes made through other replicas, leases the
//! reaper ended, callbacks that answered 410).
//!
//! **No event committed after a subscription was saved is lost to a list
//! that did not know it yet.** Every change of the list makes the
//! dispatcher scan every event since `start_from` with the new list (see
//! [`Dispatcher::restrict_catch_all`]); an event an expansion with the old
//! list passed over has no row for the bridge, so that scan, or any later
//! one, writes it. A stale list only delays such an event until the store
//! is read again: at once for a change made through this hub, within
//! [`TOPICS_REFRESH`] for one made elsewhere. The scan looks back to the
//! topic's oldest subscription less [`BEFORE_FIRST_SUBSCRIPTION`], not to
//! `start_from`, so a topic's first subscriber is not sent the topic's whole
//! past: an event committed after a subscription whose transaction began
//! more than that before the subscription was made (or the hub's clock
//! running that far ahead of the producer database's) would not be taken.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};
use url::Url;
use websub_store::{StoreError, SubscriptionStore};

use super::TopicTemplate;
use crate::delivery::outbox::{Dispatcher, EventMatch};

/// How often a feed reads every subscribed topic from the store again.
pub const TOPICS_REFRESH: Duration = Duration::from_secs(30);

/// How long before a topic's oldest subscription was made the bridge starts
/// taking the topic's events: room for producer transactions open across
/// the subscription and for clocks that disagree, while a topic's first
/// subscriber is sent at most this much of the topic's past.
pub const BEFORE_FIRST_SUBSCRIPTION: Duration = Duration::from_secs(300);

/// How soon the store is read again after it failed.
const ERROR_RETRY: Duration = Duration::from_secs(1);

/// The hub's WebSub subscriptions as its feeds need them: the store, and
/// word of each topic whose subscriptions change through this hub. Cheap to
/// clone; clones share the feeds they tell.
#[derive(Clone)]
pub struct SubscribedTopics {
    store: Arc<dyn SubscriptionStore>,
    feeds: Arc<Mutex<Vec<Weak<Changes>>>>,
}

impl std::fmt::Debug for SubscribedTopics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscribedTopics")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

/// The topics changed since one feed last looked, each once: bounded by the
/// number of topics, however many changes they had.
#[derive(Debug, Default)]
struct Changes {
    topics: Mutex<HashSet<String>>,
    arrived: Notify,
}

impl SubscribedTopics {
    /// The subscriptions in `store`.
    pub fn new(store: Arc<dyn SubscriptionStore>) -> Self {
        Self {
            store,
            feeds: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Tells every running feed that a subscription to `topic` was saved or
    /// deleted: the hub's subscription workflow calls it after each change
    /// (its [`crate::intake::verify::ChangeListener`]).
    pub fn changed(&self, topic: &str) {
        lock(&self.feeds).retain(|feed| match feed.upgrade() {
            Some(changes) => {
                lock(&changes.topics).insert(topic.to_owned());
                changes.arrived.notify_one();
                true
            }
            None => false,
        });
    }

    fn watch(&self) -> Arc<Changes> {
        let changes = Arc::new(Changes::default());
        lock(&self.feeds).push(Arc::downgrade(&changes));
        changes
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain data: a panic while holding the lock cannot leave it half made.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One feed's subscribed topics, kept in step with the store and handed to
/// its dispatcher; see the module doc.
pub(super) struct Wanted {
    store: Arc<dyn SubscriptionStore>,
    changes: Arc<Changes>,
    template: TopicTemplate,
    public_url: Url,
    dispatcher: Dispatcher,
    /// Each subscribed topic the template renders, and when its oldest
    /// subscription was made.
    topics: BTreeMap<String, DateTime<Utc>>,
}

impl Wanted {
    /// Watches `subscribed` for the bridge of `dispatcher`, whose topics
    /// `template` renders for a hub at `public_url`. Nothing is read until
    /// [`refresh`](Self::refresh).
    pub(super) fn new(
        subscribed: &SubscribedTopics,
        template: TopicTemplate,
        public_url: Url,
        dispatcher: Dispatcher,
    ) -> Self {
        Self {
            store: subscribed.store.clone(),
            changes: subscribed.watch(),
            template,
            public_url,
            dispatcher,
            topics: BTreeMap::new(),
        }
    }

    /// Reads every subscribed topic from the store, and hands the
    /// dispatcher the new list if it changed.
    pub(super) async fn refresh(&mut self) -> Result<(), StoreError> {
        let mut topics = BTreeMap::new();
        for topic in self.store.topics().await? {
            if self.template.events_of(&self.public_url, &topic).is_empty() {
                continue;
            }
            // Once known, a topic keeps the earliest time seen for it: its
            // events since then have been taken.
            let oldest = match self.topics.get(&topic) {
                Some(known) => Some(*known),
                None => oldest_subscription(&*self.store, &topic).await?,
            };
            if let Some(oldest) = oldest {
                topics.insert(topic, oldest);
            }
        }
        if topics != self.topics {
            self.topics = topics;
            self.publish();
        }
        Ok(())
    }

    /// Reads one topic's subscriptions, and hands the dispatcher the new
    /// list if it changed.
    async fn refresh_topic(&mut self, topic: &str) -> Result<(), StoreError> {
        if self.template.events_of(&self.public_url, topic).is_empty() {
            return Ok(());
        }
        let before = self.topics.get(topic).copied();
        let after = match before {
            // A subscription made now is younger than the known time, so
            // all that can change is whether the topic has any left: one
            // existence check, however many subscriptions the topic has.
            Some(known) => self.store.has_subscriptions(topic).await?.then_some(known),
            None => oldest_subscription(&*self.store, topic).await?,
        };
        if after != before {
            match after {
                Some(oldest) => self.topics.insert(topic.to_owned(), oldest),
                None => self.topics.remove(topic),
            };
            self.publish();
        }
        Ok(())
    }

    /// Hands the dispatcher one description per reading of each topic.
    pub(super) fn publish(&self) {
        let margin = chrono::Duration::from_std(BEFORE_FIRST_SUBSCRIPTION)
            .unwrap_or_else(|_| unreachable!("five minutes is a chrono duration"));
        let matches: Vec<EventMatch> = self
            .topics
            .iter()
            .flat_map(|(topic, oldest)| {
                // Before the epoch is before any event: take them all.
                let since = oldest.checked_sub_signed(margin);
                self.template
                    .events_of(&self.public_url, topic)
                    .into_iter()
                    .map(move |described| EventMatch { since, ..described })
            })
            .collect();
        debug!(
            topics = self.topics.len(),
            descriptions = matches.len(),
            "the bridge takes the events of the subscribed topics"
        );
        self.dispatcher.restrict_catch_all(matches);
    }

    /// Follows changes until `shutdown`: each topic changed through this
    /// hub as it is reported, everything every [`TOPICS_REFRESH`].
    pub(super) async fn run(mut self, shutdown: CancellationToken) {
        let mut next_refresh = Instant::now() + TOPICS_REFRESH;
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                () = self.changes.arrived.notified() => {}
                () = tokio::time::sleep_until(next_refresh) => {
                    next_refresh = match self.refresh().await {
                        Ok(()) => Instant::now() + TOPICS_REFRESH,
                        Err(error) => {
                            warn!(%error, "reading the subscribed topics failed; retrying shortly");
                            Instant::now() + ERROR_RETRY
                        }
                    };
                    continue;
                }
            }
            let changed = std::mem::take(&mut *lock(&self.changes.topics));
            for topic in changed {
                if let Err(error) = self.refresh_topic(&topic).await {
                    // The full read covers this topic too.
                    warn!(%topic, %error, "reading a changed topic's subscriptions failed; retrying shortly");
                    next_refresh = next_refresh.min(Instant::now() + ERROR_RETRY);
                }
            }
        }
    }
}

/// When the topic's oldest subscription was made; `None` when it has none.
async fn oldest_subscription(
    store: &dyn SubscriptionStore,
    topic: &str,
) -> Result<Option<DateTime<Utc>>, StoreError> {
    Ok(store
        .list_by_topic(topic)
        .await?
        .iter()
        .map(|subscription| subscription.created_at)
        .min())
}

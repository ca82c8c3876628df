//! What the WebSub scheduler keeps in memory between claims: events ready
//! to go out with their headers built once, and each topic's subscribers
//! for a short while; and the scheduler's reads through them.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use opentelemetry::trace::SpanContext;
use uuid::Uuid;
use websub_store::Subscription;

use websub_store::SubscriptionStore;

use crate::storage::events::LoggedEvent;
use crate::telemetry::traces;

use super::{DispatchError, Distributor, link_header};

/// An event ready to go out, with the headers every subscriber gets built
/// once rather than once per delivery.
#[derive(Debug)]
pub(super) struct Outgoing {
    pub(super) event: LoggedEvent,
    /// Its headers, or why they cannot be sent (a stored value no header can
    /// hold: every attempt fails with it).
    pub(super) headers: Result<EventHeaders, String>,
    /// The span its expansion and attempts continue, read once from the
    /// context kept with it (when tracing is on).
    pub(super) trace_parent: Option<SpanContext>,
}

/// The headers of an event's deliveries that do not depend on the
/// subscription.
#[derive(Debug)]
pub(super) struct EventHeaders {
    pub(super) content_type: HeaderValue,
    pub(super) event_id: HeaderValue,
    /// `Link`, the hub and the topic.
    pub(super) link: [(HeaderName, HeaderValue); 1],
}

impl Outgoing {
    pub(super) fn new(event: LoggedEvent, hub_url: &str) -> Self {
        let headers = [
            HeaderValue::from_str(&event.content_type),
            HeaderValue::from_str(&link_header(hub_url, &event.topic)),
            HeaderValue::from_str(&event.delivered_id().to_string()),
        ];
        let headers = match headers {
            [Ok(content_type), Ok(link), Ok(event_id)] => Ok(EventHeaders {
                content_type,
                event_id,
                link: [(http::header::LINK, link)],
            }),
            _ => Err(format!(
                "the event's content type or topic cannot be sent in a header: {:?}, {:?}",
                event.content_type, event.topic
            )),
        };
        let trace_parent = event.trace_context.as_deref().and_then(traces::kept_parent);
        Self {
            event,
            headers,
            trace_parent,
        }
    }
}

/// Recently delivered events, so a fan-out to thousands of subscribers reads
/// its body from the log once.
#[derive(Debug)]
pub(super) struct EventCache {
    pub(super) capacity: usize,
    pub(super) entries: Mutex<CachedEvents>,
}

/// The cached events, and their ids oldest first for eviction.
#[derive(Debug, Default)]
pub(super) struct CachedEvents {
    pub(super) by_id: HashMap<Uuid, Arc<Outgoing>>,
    pub(super) order: VecDeque<Uuid>,
}

impl EventCache {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            entries: Mutex::new(CachedEvents::default()),
        }
    }

    pub(super) fn get(&self, id: Uuid) -> Option<Arc<Outgoing>> {
        let entries = self
            .entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        entries.by_id.get(&id).cloned()
    }

    pub(super) fn insert(&self, outgoing: Arc<Outgoing>) {
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

/// How long a topic's subscriber list is reused between claimed batches.
/// Changes made through this hub reach the cache at once
/// ([`Distributor::forget_topic`]); this bounds how long one made through
/// another replica (a renewed secret, an unsubscribe) takes to be seen.
pub const SUBSCRIBERS_TTL: Duration = Duration::from_secs(10);

/// A topic's subscriptions by callback, as read at one moment: in the pages
/// they were read in, so that a list still being read is kept page by page
/// without copying the pages before.
#[derive(Debug)]
pub(super) struct Subscribers {
    pages: Vec<Arc<ByCallback>>,
    /// The page the last lookup found its callback in, tried first: the
    /// records of a claimed batch come mostly from one page.
    last_found: AtomicUsize,
    read_at: std::time::Instant,
}

/// Subscriptions by callback.
pub(super) type ByCallback = HashMap<String, Arc<Subscription>>;

impl Subscribers {
    pub(super) fn new(pages: Vec<Arc<ByCallback>>) -> Self {
        Self {
            pages,
            last_found: AtomicUsize::new(0),
            read_at: std::time::Instant::now(),
        }
    }

    pub(super) fn get(&self, callback: &str) -> Option<&Arc<Subscription>> {
        let hint = self.last_found.load(Ordering::Relaxed);
        if let Some(found) = self.pages.get(hint).and_then(|page| page.get(callback)) {
            return Some(found);
        }
        let (index, found) = self
            .pages
            .iter()
            .enumerate()
            .find_map(|(index, page)| page.get(callback).map(|found| (index, found)))?;
        self.last_found.store(index, Ordering::Relaxed);
        Some(found)
    }
}

#[derive(Debug, Default)]
pub(super) struct SubscriberCache {
    pub(super) topics: Mutex<HashMap<String, Arc<Subscribers>>>,
}

impl SubscriberCache {
    pub(super) fn get(&self, topic: &str) -> Option<Arc<Subscribers>> {
        let topics = self
            .topics
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let cached = topics.get(topic)?;
        (cached.read_at.elapsed() < SUBSCRIBERS_TTL).then(|| cached.clone())
    }

    pub(super) fn forget(&self, topic: &str) {
        self.topics
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(topic);
    }

    pub(super) fn put(&self, topic: &str, listed: Vec<Subscription>) -> Arc<Subscribers> {
        let page = listed
            .into_iter()
            .map(|subscription| (subscription.callback.clone(), Arc::new(subscription)))
            .collect();
        self.put_read(topic, vec![Arc::new(page)])
    }

    /// Keeps `pages`, read just now, as `topic`'s subscribers.
    pub(super) fn put_read(&self, topic: &str, pages: Vec<Arc<ByCallback>>) -> Arc<Subscribers> {
        let subscribers = Arc::new(Subscribers::new(pages));
        let mut topics = self
            .topics
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        topics.retain(|_, cached| cached.read_at.elapsed() < SUBSCRIBERS_TTL);
        topics.insert(topic.to_owned(), subscribers.clone());
        subscribers
    }
}

impl Distributor {
    /// The subscribers of `topic`, from a short-lived cache unless
    /// `refresh`. Each claimed batch needs them, and reading 100 000
    /// subscriptions per batch of a few hundred deliveries would make a
    /// retried fan-out quadratic. See [`SUBSCRIBERS_TTL`] for how fresh it
    /// is. Returns the list and whether it was read just now.
    pub(super) async fn subscribers(
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

    /// The subscriptions of `topic` for `callbacks`, each read by its key;
    /// one that is gone is left out.
    pub(super) async fn read_each(
        &self,
        topic: &str,
        callbacks: &[&str],
    ) -> Result<Subscribers, DispatchError> {
        let mut by_callback = HashMap::with_capacity(callbacks.len());
        for callback in callbacks {
            match self.inner.store.get(topic, callback).await {
                Ok(subscription) => {
                    by_callback.insert(subscription.callback.clone(), Arc::new(subscription));
                }
                Err(websub_store::StoreError::UnknownSubscription { .. }) => {}
                Err(error) => return Err(error.into()),
            }
        }
        Ok(Subscribers::new(vec![Arc::new(by_callback)]))
    }

    pub(super) async fn event(&self, id: Uuid) -> Result<Option<Arc<Outgoing>>, DispatchError> {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(callbacks: &[&str]) -> Arc<ByCallback> {
        Arc::new(
            callbacks
                .iter()
                .map(|callback| {
                    let subscription = Subscription::new("https://topic.example/", *callback);
                    ((*callback).to_owned(), Arc::new(subscription))
                })
                .collect(),
        )
    }

    #[test]
    fn a_lookup_finds_its_callback_in_any_page_whichever_was_found_last() {
        let subscribers = Subscribers::new(vec![
            page(&["https://a.example/1", "https://a.example/2"]),
            page(&["https://b.example/1"]),
            page(&["https://c.example/1"]),
        ]);
        for callback in [
            "https://c.example/1",
            "https://a.example/2",
            "https://b.example/1",
            "https://b.example/1",
            "https://a.example/1",
        ] {
            let found = subscribers
                .get(callback)
                .map(|found| found.callback.as_str());
            assert_eq!(found, Some(callback));
        }
        assert!(subscribers.get("https://d.example/1").is_none());
        assert_eq!(
            subscribers
                .get("https://c.example/1")
                .map(|found| found.callback.as_str()),
            Some("https://c.example/1"),
            "a miss leaves the lookups after it whole"
        );
    }
}

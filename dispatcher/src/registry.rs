//! Registrations: in-process handlers and webhooks, by event name, and the
//! reload that replaces every webhook at once. The registry is replaced
//! whole on every change, so a pass works on one consistent picture.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use url::Url;

use super::Dispatcher;
use super::signals::Scan;
use crate::sql::{MatchColumns, Registrations};
use websub_delivery::net::NetPolicy;
use websub_outbox::Envelope;

/// A webhook subscriber of one event name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookSubscriber {
    /// Which application's events it wants: those recorded for this app and
    /// those recorded for none, never another app's. `None` (or empty) takes
    /// everything.
    pub app: Option<String>,
    /// Where its deliveries are POSTed.
    pub url: Url,
    /// Whether it gets its events one at a time, strictly in the outbox's
    /// recording order (`created_at`, then id): its next row is claimed
    /// only once the one before is delivered or out of retries, so a
    /// failing row holds the ones behind it. Beyond the messaging contract.
    /// A subscriber is ordered when any of its registrations says so.
    pub ordered: bool,
    /// The most attempts it may have in flight at once, in place of
    /// [`super::DispatcherConfig::per_subscriber`]; `None` keeps that.
    /// Beyond the messaging contract. When its registrations differ, the
    /// smallest applies.
    pub max_in_flight: Option<usize>,
    /// The client certificate it is shown when it asks for one, in place of
    /// the dispatcher's ([`super::DispatcherConfig::trust`]). Beyond the
    /// messaging contract.
    pub identity: Option<websub_delivery::client::ClientIdentity>,
    /// How its events are sent: the envelope (the default) or CloudEvents.
    /// Beyond the messaging contract.
    pub format: crate::WebhookFormat,
}

impl WebhookSubscriber {
    /// An unordered subscriber at `url`, of `app`'s events (every app's
    /// when `None`), with the dispatcher's concurrency per subscriber.
    pub fn new(app: Option<String>, url: Url) -> Self {
        Self {
            app,
            url,
            ordered: false,
            max_in_flight: None,
            identity: None,
            format: crate::WebhookFormat::Envelope,
        }
    }
}

/// A description of outbox events, for a catch-all handler that takes only
/// some ([`Dispatcher::restrict_catch_all`]): an event fits when it has
/// every value given (`None` takes any value) and was created at or after
/// `since`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventMatch {
    /// The event name.
    pub event_name: Option<String>,
    /// The application, `""` for an event recorded for none (exactly: no
    /// app scoping here).
    pub app: Option<String>,
    /// The kind of resource.
    pub resource_type: Option<String>,
    /// What happened to it.
    pub event_type: Option<String>,
    /// Events created before this (by the outbox's clock) do not fit.
    pub since: Option<DateTime<Utc>>,
}

/// Why an in-process handler failed; the delivery is retried.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;

/// An in-process consumer of outbox events.
///
/// `Ok` marks the delivery processed; an error (or a panic, or running past
/// the delivery timeout) is retried with backoff like a failed webhook, with
/// the error's text kept in `last_error`. Delivery is at least once, so a
/// handler must tolerate seeing an event twice (de-duplicate on
/// [`Envelope::event_id`]).
///
/// Closures `Fn(Envelope) -> impl Future<Output = Result<(), HandlerError>>`
/// are handlers.
#[async_trait]
pub trait Handler: Send + Sync {
    /// Handles one delivery.
    async fn handle(&self, envelope: &Envelope) -> Result<(), HandlerError>;

    /// Whether a failure never says anything about the event, only about
    /// the handler's own footing: the WebSub bridge fails only while the
    /// hub's own database does. Such a handler's failed delivery waits the
    /// longest backoff and is tried again, without spending the retry
    /// budget, until it succeeds: an outage of the hub's database delays
    /// events, never exhausts them.
    fn retries_without_limit(&self) -> bool {
        false
    }
}

#[async_trait]
impl<F, Fut> Handler for F
where
    F: Fn(Envelope) -> Fut + Send + Sync,
    Fut: Future<Output = Result<(), HandlerError>> + Send,
{
    async fn handle(&self, envelope: &Envelope) -> Result<(), HandlerError> {
        self(envelope.clone()).await
    }
}

/// What webhook registration code is written against, so the same code runs
/// at start-up (against the [`Dispatcher`]) and on reload (against the
/// registrar [`Dispatcher::reload_webhooks`] hands it).
pub trait WebhookRegistrar {
    /// Registers `subscribers` (by name) for `event_name`, replacing any
    /// registration of the same subscriber for the same event name.
    fn register_webhooks(
        &mut self,
        event_name: &str,
        subscribers: HashMap<String, WebhookSubscriber>,
    ) -> Result<(), RegistrationError>;
}

/// Why a registration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistrationError {
    /// In-process handlers deliver as the dispatcher's subscriber name, and
    /// none is configured.
    #[error("registering an in-process handler needs a subscriber name; configure one")]
    NoSubscriberName,
    /// An empty event name.
    #[error("the event name is empty")]
    EmptyEventName,
    /// An empty subscriber name.
    #[error("a webhook subscriber of {event_name:?} has an empty name")]
    EmptySubscriberName {
        /// The event name it was registered for.
        event_name: String,
    },
    /// A webhook subscriber named like the dispatcher's own subscriber: their
    /// delivery rows would be indistinguishable.
    #[error(
        "webhook subscriber {subscriber:?} has the name in-process handlers deliver as; pick another"
    )]
    ReservedSubscriber {
        /// The name.
        subscriber: String,
    },
    /// A webhook URL that is not http(s).
    #[error("webhook subscriber {subscriber:?} of {event_name:?}: {url} is not an http(s) URL")]
    InvalidUrl {
        /// The event name.
        event_name: String,
        /// The subscriber.
        subscriber: String,
        /// The URL given.
        url: String,
    },
    /// A webhook URL the network policy refuses (a private address while
    /// private networks are not allowed).
    #[error("webhook subscriber {subscriber:?} of {event_name:?}: {url}: {reason}")]
    RefusedUrl {
        /// The event name.
        event_name: String,
        /// The subscriber.
        subscriber: String,
        /// The URL given.
        url: String,
        /// Why the policy refuses it.
        reason: String,
    },
    /// A limit of zero attempts in flight: nothing would ever be delivered.
    #[error(
        "webhook subscriber {subscriber:?} of {event_name:?}: max_in_flight must be at least 1"
    )]
    NoRoomInFlight {
        /// The event name.
        event_name: String,
        /// The subscriber.
        subscriber: String,
    },
    /// One subscriber registered for two event names with different
    /// delivery settings (ordered, max_in_flight): they apply to the
    /// subscriber, not to one of its event names.
    #[error(
        "webhook subscriber {subscriber:?} of {event_name:?} disagrees with its registration for \
         {other_event_name:?} on ordered or max_in_flight; they apply to the whole subscriber"
    )]
    Disagreeing {
        /// The event name.
        event_name: String,
        /// The subscriber.
        subscriber: String,
        /// The event name it is also registered for, otherwise.
        other_event_name: String,
    },
}

/// Why [`Dispatcher::reload_webhooks`] changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError<E> {
    /// A registration the function made was refused (even if the function
    /// went on and returned `Ok`).
    #[error("a webhook registration was refused: {0}")]
    Registration(#[source] RegistrationError),
    /// The function itself failed.
    #[error("reloading webhooks failed: {0}")]
    Function(#[source] E),
}

/// Registered handlers and webhooks, as of one moment. Replaced whole on
/// every change, so a pass works on one consistent picture.
#[derive(Default)]
pub(super) struct Registry {
    pub(super) handlers: HashMap<String, Arc<dyn Handler>>,
    pub(super) catch_all: Option<Arc<dyn Handler>>,
    /// The events the catch-all handler takes: every one when `None`.
    pub(super) catch_all_matches: Option<Arc<[EventMatch]>>,
    pub(super) webhooks: BTreeMap<String, HashMap<String, WebhookSubscriber>>,
    pub(super) subscriptions: Registrations,
    /// Every subscriber in `subscriptions`, once each, sorted.
    pub(super) names: Vec<String>,
    /// How each webhook subscriber is delivered to, by name: only those
    /// that differ from the dispatcher's defaults.
    pub(super) delivery: HashMap<String, Delivery>,
    /// The ordered webhook subscribers, each with its event names, sorted.
    ordered: Vec<(String, Vec<String>)>,
}

/// How one webhook subscriber is delivered to, folded over its
/// registrations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Delivery {
    /// One row at a time, in recording order.
    pub(super) ordered: bool,
    /// The most attempts in flight at once; the dispatcher's
    /// `per_subscriber` when `None`.
    pub(super) max_in_flight: Option<usize>,
}

impl Delivery {
    /// What one registration asks for, when it asks for anything.
    fn of(subscriber: &WebhookSubscriber) -> Option<Self> {
        (subscriber.ordered || subscriber.max_in_flight.is_some()).then_some(Self {
            ordered: subscriber.ordered,
            max_in_flight: subscriber.max_in_flight,
        })
    }

    /// Two registrations of one subscriber together: ordered if either is,
    /// the smaller limit.
    fn and(self, other: Self) -> Self {
        let max_in_flight = match (self.max_in_flight, other.max_in_flight) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Self {
            ordered: self.ordered || other.ordered,
            max_in_flight,
        }
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("handlers", &self.handlers.keys().collect::<Vec<_>>())
            .field("catch_all", &self.catch_all.is_some())
            .field("catch_all_matches", &self.catch_all_matches)
            .field("webhooks", &self.webhooks)
            .field("delivery", &self.delivery)
            .finish()
    }
}

impl Registry {
    pub(super) fn with_subscriptions(mut self, own: Option<&str>) -> Self {
        let mut subscriptions = Registrations::default();
        if let Some(own) = own {
            if self.catch_all.is_some() && self.catch_all_matches.is_none() {
                subscriptions.every_event.push(own.to_owned());
            } else {
                if let (Some(_), Some(matches)) = (&self.catch_all, &self.catch_all_matches) {
                    subscriptions.matching = Some(own.to_owned());
                    subscriptions.matches = match_columns(matches);
                }
                // A handler of an event name takes that name's events,
                // whatever a restricted catch-all's descriptions say.
                for event_name in self.handlers.keys() {
                    subscriptions.subscribers.push(own.to_owned());
                    subscriptions.apps.push(None);
                    subscriptions.event_names.push(event_name.clone());
                }
            }
        }
        let mut delivery: HashMap<String, Delivery> = HashMap::new();
        for (event_name, subscribers) in &self.webhooks {
            for (name, subscriber) in subscribers {
                subscriptions.subscribers.push(name.clone());
                subscriptions.apps.push(subscriber.app.clone());
                subscriptions.event_names.push(event_name.clone());
                if let Some(asked) = Delivery::of(subscriber) {
                    delivery
                        .entry(name.clone())
                        .and_modify(|folded| *folded = folded.and(asked))
                        .or_insert(asked);
                }
            }
        }
        let mut ordered: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (event_name, subscribers) in &self.webhooks {
            for name in subscribers.keys() {
                if delivery.get(name).is_some_and(|asked| asked.ordered) {
                    ordered
                        .entry(name.clone())
                        .or_default()
                        .push(event_name.clone());
                }
            }
        }
        self.ordered = ordered.into_iter().collect();
        self.delivery = delivery;
        self.names = subscriptions.names();
        self.subscriptions = subscriptions;
        self
    }

    /// The ordered webhook subscribers, with the event names each is
    /// registered for, sorted by name.
    pub(super) fn ordered(&self) -> &[(String, Vec<String>)] {
        &self.ordered
    }

    /// Whether `subscriber` is an ordered webhook subscriber.
    pub(super) fn is_ordered(&self, subscriber: &str) -> bool {
        self.delivery
            .get(subscriber)
            .is_some_and(|delivery| delivery.ordered)
    }

    pub(super) fn copy(&self) -> Self {
        Self {
            handlers: self.handlers.clone(),
            catch_all: self.catch_all.clone(),
            catch_all_matches: self.catch_all_matches.clone(),
            webhooks: self.webhooks.clone(),
            subscriptions: Registrations::default(),
            names: Vec::new(),
            delivery: HashMap::new(),
            ordered: Vec::new(),
        }
    }
}

fn match_columns(matches: &[EventMatch]) -> MatchColumns {
    MatchColumns {
        event_names: matches.iter().map(|m| m.event_name.clone()).collect(),
        apps: matches.iter().map(|m| m.app.clone()).collect(),
        resource_types: matches.iter().map(|m| m.resource_type.clone()).collect(),
        event_types: matches.iter().map(|m| m.event_type.clone()).collect(),
        since: matches
            .iter()
            .map(|m| m.since.map(|at| at.naive_utc()))
            .collect(),
    }
}

/// Validates one webhook registration into `webhooks`.
pub(super) fn add_webhooks(
    webhooks: &mut BTreeMap<String, HashMap<String, WebhookSubscriber>>,
    own: Option<&str>,
    network: &NetPolicy,
    event_name: &str,
    subscribers: HashMap<String, WebhookSubscriber>,
) -> Result<(), RegistrationError> {
    if event_name.is_empty() {
        return Err(RegistrationError::EmptyEventName);
    }
    let mut checked = Vec::with_capacity(subscribers.len());
    for (name, mut subscriber) in subscribers {
        if name.is_empty() {
            return Err(RegistrationError::EmptySubscriberName {
                event_name: event_name.to_owned(),
            });
        }
        if Some(name.as_str()) == own {
            return Err(RegistrationError::ReservedSubscriber { subscriber: name });
        }
        if !matches!(subscriber.url.scheme(), "http" | "https") {
            return Err(RegistrationError::InvalidUrl {
                event_name: event_name.to_owned(),
                url: subscriber.url.to_string(),
                subscriber: name,
            });
        }
        // Names are checked again by the client's resolver at connect time.
        if let Err(refused) = network.check_literal(&subscriber.url) {
            return Err(RegistrationError::RefusedUrl {
                event_name: event_name.to_owned(),
                url: subscriber.url.to_string(),
                subscriber: name,
                reason: refused.to_string(),
            });
        }
        if subscriber.max_in_flight == Some(0) {
            return Err(RegistrationError::NoRoomInFlight {
                event_name: event_name.to_owned(),
                subscriber: name,
            });
        }
        let disagreeing = webhooks.iter().find(|(other, registered)| {
            other.as_str() != event_name
                && registered.get(&name).is_some_and(|registered| {
                    (registered.ordered, registered.max_in_flight)
                        != (subscriber.ordered, subscriber.max_in_flight)
                })
        });
        if let Some((other, _)) = disagreeing {
            return Err(RegistrationError::Disagreeing {
                event_name: event_name.to_owned(),
                subscriber: name,
                other_event_name: other.clone(),
            });
        }
        if subscriber.app.as_deref() == Some("") {
            subscriber.app = None;
        }
        checked.push((name, subscriber));
    }
    webhooks
        .entry(event_name.to_owned())
        .or_default()
        .extend(checked);
    Ok(())
}

/// The registrar a reload's function registers into: it collects, and
/// remembers the first refusal even if the function carries on.
pub(super) struct Collector<'a> {
    pub(super) own: Option<&'a str>,
    pub(super) network: &'a NetPolicy,
    pub(super) webhooks: BTreeMap<String, HashMap<String, WebhookSubscriber>>,
    pub(super) refused: Option<RegistrationError>,
}

impl WebhookRegistrar for Collector<'_> {
    fn register_webhooks(
        &mut self,
        event_name: &str,
        subscribers: HashMap<String, WebhookSubscriber>,
    ) -> Result<(), RegistrationError> {
        let result = add_webhooks(
            &mut self.webhooks,
            self.own,
            self.network,
            event_name,
            subscribers,
        );
        if let Err(error) = &result
            && self.refused.is_none()
        {
            self.refused = Some(error.clone());
        }
        result
    }
}

impl Dispatcher {
    /// Registers the in-process handler of `event_name`, replacing any
    /// previous one. Deliveries are recorded under
    /// [`DispatcherConfig::subscriber_name`](super::DispatcherConfig::subscriber_name), which must be set. Safe while
    /// running; reloads never touch handlers.
    pub fn register_handler<H: Handler + 'static>(
        &self,
        event_name: &str,
        handler: H,
    ) -> Result<(), RegistrationError> {
        self.own_name()?;
        if event_name.is_empty() {
            return Err(RegistrationError::EmptyEventName);
        }
        self.update(|registry| {
            registry
                .handlers
                .insert(event_name.to_owned(), Arc::new(handler));
        });
        Ok(())
    }

    /// Registers a handler for every event name, under the dispatcher's
    /// subscriber name (which must be set). An extension of the messaging
    /// contract, for consumers that forward everything (the WebSub bridge).
    /// A handler registered for a specific event name takes precedence for
    /// that name; there is still one delivery row per event.
    pub fn register_catch_all_handler<H: Handler + 'static>(
        &self,
        handler: H,
    ) -> Result<(), RegistrationError> {
        self.own_name()?;
        self.update(|registry| registry.catch_all = Some(Arc::new(handler)));
        Ok(())
    }

    /// Has the catch-all handler take only the events one of `matches`
    /// describes (it takes every event until this is called; an empty list
    /// takes none), replacing any earlier list. Its rows written before
    /// stay, and are delivered. Safe while running; reloads never touch it.
    ///
    /// Like any registration change, it has the next pass scan every event
    /// since `start_from`: an event that an expansion with the earlier list
    /// passed over is expanded if the new one describes it, whatever
    /// expansions were in flight when the list changed.
    pub fn restrict_catch_all(&self, matches: Vec<EventMatch>) {
        let matches: Arc<[EventMatch]> = matches.into();
        self.update(|registry| registry.catch_all_matches = Some(matches));
    }

    /// Registers webhook `subscribers` (keyed by subscriber name: what their
    /// rows are recorded under; it never leaves this process) for
    /// `event_name`. A subscriber already registered for the event name is
    /// replaced. Safe while running.
    pub fn register_webhooks(
        &self,
        event_name: &str,
        subscribers: HashMap<String, WebhookSubscriber>,
    ) -> Result<(), RegistrationError> {
        let own = self.inner.config.subscriber_name.as_deref();
        let mut added = BTreeMap::new();
        add_webhooks(
            &mut added,
            own,
            &self.inner.config.network,
            event_name,
            subscribers,
        )?;
        self.update(|registry| {
            for (event, subscribers) in added {
                registry
                    .webhooks
                    .entry(event)
                    .or_default()
                    .extend(subscribers);
            }
        });
        Ok(())
    }

    /// Replaces every registered webhook with what `register` registers, all
    /// at once; handlers are untouched.
    ///
    /// - A subscriber no longer registered stops being expanded and claimed;
    ///   its rows stay, and resume if it is registered again.
    /// - A new subscriber is expanded as at start-up, within `start_from`.
    /// - A changed URL applies from the subscriber's next attempt.
    /// - If `register` fails, or any registration it made was refused (even
    ///   one it went past), nothing changes.
    ///
    /// The change applies from the next pass; a pass already running
    /// finishes with the registrations it began with.
    pub fn reload_webhooks<F, E>(&self, register: F) -> Result<(), ReloadError<E>>
    where
        F: FnOnce(&mut dyn WebhookRegistrar) -> Result<(), E>,
    {
        let mut collector = Collector {
            own: self.inner.config.subscriber_name.as_deref(),
            network: &self.inner.config.network,
            webhooks: BTreeMap::new(),
            refused: None,
        };
        register(&mut collector).map_err(ReloadError::Function)?;
        if let Some(refused) = collector.refused {
            return Err(ReloadError::Registration(refused));
        }
        let webhooks = collector.webhooks;
        self.update(move |registry| registry.webhooks = webhooks);
        Ok(())
    }

    pub(super) fn own_name(&self) -> Result<&str, RegistrationError> {
        self.inner
            .config
            .subscriber_name
            .as_deref()
            .ok_or(RegistrationError::NoSubscriberName)
    }

    pub(super) fn registry(&self) -> Arc<Registry> {
        self.inner
            .registry
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Applies `change` to a copy of the registry and publishes it, then has
    /// the next pass look at every event (new subscribers are expanded as
    /// at start-up).
    pub(super) fn update(&self, change: impl FnOnce(&mut Registry)) {
        {
            let mut current = self
                .inner
                .registry
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let mut next = current.copy();
            change(&mut next);
            *current =
                Arc::new(next.with_subscriptions(self.inner.config.subscriber_name.as_deref()));
        }
        self.request(Scan::Full);
    }
}

impl WebhookRegistrar for Dispatcher {
    fn register_webhooks(
        &mut self,
        event_name: &str,
        subscribers: HashMap<String, WebhookSubscriber>,
    ) -> Result<(), RegistrationError> {
        Dispatcher::register_webhooks(self, event_name, subscribers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use websub_delivery::net::NetPolicy;

    const ALLOW: NetPolicy = NetPolicy {
        allow_private_network: true,
    };

    fn url(text: &str) -> Url {
        Url::parse(text).expect("valid URL")
    }

    #[test]
    fn webhook_registrations_are_checked() {
        let mut webhooks = BTreeMap::new();
        let subscriber =
            |app: Option<&str>, at: &str| WebhookSubscriber::new(app.map(str::to_owned), url(at));
        assert_eq!(
            add_webhooks(&mut webhooks, None, &ALLOW, "", HashMap::new()),
            Err(RegistrationError::EmptyEventName)
        );
        let ftp = HashMap::from([("a".to_owned(), subscriber(None, "ftp://x/"))]);
        assert!(matches!(
            add_webhooks(&mut webhooks, None, &ALLOW, "e", ftp),
            Err(RegistrationError::InvalidUrl { .. })
        ));
        let mine = HashMap::from([("me".to_owned(), subscriber(None, "http://x/"))]);
        assert!(matches!(
            add_webhooks(&mut webhooks, Some("me"), &ALLOW, "e", mine),
            Err(RegistrationError::ReservedSubscriber { .. })
        ));
        assert!(webhooks.is_empty(), "a refused registration adds nothing");
        let empty_app = HashMap::from([("a".to_owned(), subscriber(Some(""), "http://x/"))]);
        add_webhooks(&mut webhooks, None, &ALLOW, "e", empty_app).expect("valid");
        let loopback = HashMap::from([("a".to_owned(), subscriber(None, "http://127.0.0.1:9/"))]);
        assert!(matches!(
            add_webhooks(&mut webhooks, None, &NetPolicy::default(), "e2", loopback),
            Err(RegistrationError::RefusedUrl { .. })
        ));
        assert_eq!(webhooks["e"]["a"].app, None, "an empty app is none");
    }

    #[test]
    fn subscriptions_cover_handlers_and_webhooks() {
        let mut registry = Registry::default();
        let handler: Arc<dyn Handler> =
            Arc::new(|_envelope: Envelope| async { Ok::<(), HandlerError>(()) });
        registry.handlers.insert("e1".to_owned(), handler.clone());
        registry.webhooks.insert(
            "e2".to_owned(),
            HashMap::from([(
                "hook".to_owned(),
                WebhookSubscriber::new(Some("ush".to_owned()), url("http://x/")),
            )]),
        );
        let with_handlers = registry.copy().with_subscriptions(Some("me"));
        let subscriptions = &with_handlers.subscriptions;
        assert_eq!(subscriptions.subscribers, ["me", "hook"]);
        assert_eq!(subscriptions.apps, [None, Some("ush".to_owned())]);
        assert_eq!(subscriptions.event_names, ["e1", "e2"]);
        assert!(subscriptions.every_event.is_empty());

        registry.catch_all = Some(handler);
        let with_catch_all = registry.copy().with_subscriptions(Some("me"));
        assert_eq!(with_catch_all.subscriptions.every_event, ["me"]);
        assert_eq!(with_catch_all.subscriptions.subscribers, ["hook"]);

        registry.catch_all_matches = Some(Arc::from(vec![EventMatch {
            event_name: Some("e3".to_owned()),
            app: Some(String::new()),
            ..EventMatch::default()
        }]));
        let restricted = registry.with_subscriptions(Some("me"));
        let subscriptions = &restricted.subscriptions;
        assert!(subscriptions.every_event.is_empty());
        assert_eq!(subscriptions.matching.as_deref(), Some("me"));
        assert_eq!(subscriptions.matches.event_names, [Some("e3".to_owned())]);
        assert_eq!(subscriptions.matches.apps, [Some(String::new())]);
        assert_eq!(subscriptions.matches.resource_types, [None]);
        assert_eq!(
            subscriptions.subscribers,
            ["me", "hook"],
            "the handler of e1 still takes e1"
        );
        assert_eq!(restricted.names, ["hook", "me"]);
    }

    #[test]
    fn delivery_settings_apply_to_the_whole_subscriber() {
        let hook = |ordered: bool, max_in_flight: Option<usize>| WebhookSubscriber {
            ordered,
            max_in_flight,
            ..WebhookSubscriber::new(None, url("http://x/"))
        };
        let mut webhooks = BTreeMap::new();
        let one = |subscriber: WebhookSubscriber| HashMap::from([("a".to_owned(), subscriber)]);
        add_webhooks(&mut webhooks, None, &ALLOW, "e1", one(hook(true, None))).expect("valid");
        // Registering the same event again replaces it, whatever it said.
        add_webhooks(&mut webhooks, None, &ALLOW, "e1", one(hook(false, None))).expect("valid");
        add_webhooks(&mut webhooks, None, &ALLOW, "e2", one(hook(false, None))).expect("agrees");
        assert!(matches!(
            add_webhooks(&mut webhooks, None, &ALLOW, "e3", one(hook(true, None))),
            Err(RegistrationError::Disagreeing { subscriber, .. }) if subscriber == "a"
        ));
        assert!(matches!(
            add_webhooks(&mut webhooks, None, &ALLOW, "e3", one(hook(false, Some(0)))),
            Err(RegistrationError::NoRoomInFlight { .. })
        ));

        // Registered one event at a time (as `register_webhooks` may be),
        // the registry folds: ordered if any says so, the smallest limit.
        let mut registry = Registry::default();
        registry.webhooks.insert(
            "e1".to_owned(),
            HashMap::from([
                ("a".to_owned(), hook(true, None)),
                ("b".to_owned(), hook(false, Some(4))),
                ("c".to_owned(), hook(false, None)),
            ]),
        );
        registry.webhooks.insert(
            "e2".to_owned(),
            HashMap::from([
                ("a".to_owned(), hook(false, None)),
                ("b".to_owned(), hook(false, Some(2))),
            ]),
        );
        let registry = registry.with_subscriptions(None);
        assert!(registry.is_ordered("a"));
        assert!(!registry.is_ordered("b"));
        assert_eq!(registry.delivery["b"].max_in_flight, Some(2));
        assert!(!registry.delivery.contains_key("c"), "c has the defaults");
        assert_eq!(
            registry.ordered(),
            [("a".to_owned(), vec!["e1".to_owned(), "e2".to_owned()])]
        );
    }
}

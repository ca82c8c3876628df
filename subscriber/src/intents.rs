//! What a subscriber wants, per (topic, callback): the record the receiver
//! consults before confirming a verification of intent or accepting content,
//! and that the client and the renewer keep up to date.
//!
//! WebSub lets anyone ask a hub to subscribe any callback to any topic; the
//! callback's answer to the verification is what stops that. So the answer
//! must come from what this service itself asked for, which is what this
//! record holds.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use url::Url;

use websub_protocol::{self as protocol, Mode};

/// Where a subscription stands, as far as this subscriber knows.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum State {
    /// Subscription asked for (or expected), no verification seen yet.
    Requested,
    /// The hub verified the subscription with this subscriber.
    Active,
    /// Unsubscription asked for, no verification seen yet.
    Unsubscribing,
    /// The hub verified the unsubscription.
    Unsubscribed,
    /// The hub denied the subscription (`hub.mode=denied`).
    Denied {
        /// `hub.reason`, when the hub gave one.
        reason: Option<String>,
    },
}

impl State {
    /// Whether content for this pair is wanted and a subscribe
    /// verification is confirmed.
    fn wants_content(&self) -> bool {
        matches!(self, Self::Requested | Self::Active)
    }

    /// Whether an unsubscribe verification is confirmed.
    fn wants_unsubscription(&self) -> bool {
        matches!(self, Self::Unsubscribing | Self::Unsubscribed)
    }
}

/// A snapshot of one (topic, callback) pair.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Status {
    /// Where it stands.
    pub state: State,
    /// The lease the hub granted at the last subscribe verification.
    pub lease: Option<Duration>,
    /// When the last subscribe verification arrived; the lease runs from
    /// then.
    pub verified_at: Option<Instant>,
    /// How many subscribe verifications were confirmed for the pair.
    pub verifications: u32,
}

/// Why a callback cannot be recorded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IntentError {
    /// The callback is neither an absolute http(s) URL nor a path starting
    /// with `/`.
    #[error("invalid callback {callback:?}: {reason}")]
    InvalidCallback {
        /// The callback given.
        callback: String,
        /// Why it was refused.
        reason: String,
    },
}

/// A secret shared with the hub. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(Arc<str>);

impl Secret {
    pub(crate) fn new(secret: &str) -> Self {
        Self(Arc::from(secret))
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// A callback as the receiver sees it: its path and its own query pairs
/// (without the `hub.*` parameters a hub appends). Scheme, host and port are
/// not part of it: a service behind a proxy does not know the name it is
/// reached by, and the route is what identifies the callback.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct CallbackKey {
    path: String,
    query: Vec<(String, String)>,
}

impl CallbackKey {
    /// From an absolute http(s) URL or a path (`/websub?x=1`).
    pub(crate) fn parse(callback: &str) -> Result<Self, IntentError> {
        let invalid = |reason: &str| IntentError::InvalidCallback {
            callback: callback.to_owned(),
            reason: reason.to_owned(),
        };
        let url = if callback.starts_with('/') {
            Url::parse("http://callback.invalid")
                .and_then(|base| base.join(callback))
                .map_err(|error| invalid(&error.to_string()))?
        } else {
            let url = Url::parse(callback).map_err(|error| invalid(&error.to_string()))?;
            if !matches!(url.scheme(), "http" | "https") {
                return Err(invalid("not an http(s) URL or a path starting with /"));
            }
            url
        };
        Ok(Self::from_parts(url.path(), url.query()))
    }

    /// From a request's path and raw query string.
    pub(crate) fn from_parts(path: &str, raw_query: Option<&str>) -> Self {
        let query = raw_query
            .map(|query| {
                url::form_urlencoded::parse(query.as_bytes())
                    .filter(|(name, _)| !name.starts_with("hub."))
                    .map(|(name, value)| (name.into_owned(), value.into_owned()))
                    .collect()
            })
            .unwrap_or_default();
        Self {
            path: path.to_owned(),
            query,
        }
    }

    /// The route path.
    pub(crate) fn path(&self) -> &str {
        &self.path
    }
}

impl fmt::Display for CallbackKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.path)?;
        if !self.query.is_empty() {
            let query = url::form_urlencoded::Serializer::new(String::new())
                .extend_pairs(&self.query)
                .finish();
            write!(f, "?{query}")?;
        }
        Ok(())
    }
}

/// A topic as a hub keeps it: WebSub hubs decode percent-encoded unreserved
/// characters, so `%7E` and `~` are one topic.
fn hub_form(topic: &str) -> String {
    protocol::parse_topic(topic).unwrap_or_else(|_| topic.to_owned())
}

/// What topics are compared by: the hub's form spelled as a URI. A hub's
/// `Link` header can only carry a URI, so the `rel="self"` link of a topic
/// subscribed to as an IRI (`…/caf\u{e9}`) arrives percent-encoded
/// (`…/caf%C3%A9`), and the two must be one topic.
fn topic_key(topic: &str) -> String {
    protocol::iri_to_uri(&hub_form(topic)).into_owned()
}

/// What the client needs to ask the hub again before the lease runs out.
#[derive(Debug, Clone)]
pub(crate) struct Renewal {
    /// The hub it was asked of.
    pub(crate) hub: Url,
    /// The topic as the client sent it.
    pub(crate) topic: String,
    /// The callback URL as the client sent it.
    pub(crate) callback: String,
    /// The lease asked for.
    pub(crate) lease: Option<Duration>,
    /// No renewal before this: set when one was sent and its verification
    /// has not arrived yet, or when one failed.
    pub(crate) not_before: Option<Instant>,
}

#[derive(Debug, Clone)]
struct Entry {
    /// The topic in the hub's form, as first recorded for the pair: what
    /// its deliveries are reported under.
    topic: String,
    state: State,
    /// The secret of the verified subscription.
    secret: Option<Secret>,
    /// The secret of a request not yet verified (`Some(None)`: asked without
    /// one). Until the verification arrives, the hub may still sign with
    /// the old secret, so both are accepted.
    pending_secret: Option<Option<Secret>>,
    lease: Option<Duration>,
    verified_at: Option<Instant>,
    verifications: u32,
    renewal: Option<Renewal>,
}

impl Entry {
    fn requested(topic: &str, secret: Option<Secret>) -> Self {
        Self {
            topic: hub_form(topic),
            state: State::Requested,
            secret,
            pending_secret: None,
            lease: None,
            verified_at: None,
            verifications: 0,
            renewal: None,
        }
    }

    fn status(&self) -> Status {
        Status {
            state: self.state.clone(),
            lease: self.lease,
            verified_at: self.verified_at,
            verifications: self.verifications,
        }
    }
}

type Key = (String, CallbackKey);

/// The state of a pair before the client changed it, to put back when the
/// hub refuses the request.
#[derive(Debug)]
pub(crate) struct Snapshot {
    key: Key,
    entry: Option<Entry>,
}

/// Where a delivery belongs.
#[derive(Debug)]
pub(crate) enum Target {
    /// A wanted subscription: its topic, and the secrets a signature may be
    /// made with (`None` among them: an unsigned delivery is acceptable).
    Wanted {
        topic: String,
        secrets: Vec<Option<Secret>>,
    },
    /// Nothing wanted here.
    Unwanted,
    /// No `rel="self"` and several topics share the callback.
    Ambiguous,
}

/// A renewal the renewer should send now.
#[derive(Debug)]
pub(crate) struct DueRenewal {
    pub(crate) renewal: Renewal,
    pub(crate) secret: Option<Secret>,
}

/// What this subscriber wants, shared by the receiver, the client and the
/// renewer. Cheap to clone: clones share one record.
///
/// The receiver confirms a subscribe verification only for a pair that is
/// [`Requested`](State::Requested) or [`Active`](State::Active), an
/// unsubscribe verification only for one the client asked to unsubscribe,
/// and accepts content only for a wanted pair. Everything else is refused.
#[derive(Clone)]
pub struct Intents {
    inner: Arc<IntentsState>,
}

struct IntentsState {
    entries: Mutex<HashMap<Key, Entry>>,
    changes: watch::Sender<u64>,
}

impl fmt::Debug for Intents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Intents")
            .field("pairs", &self.lock().len())
            .finish()
    }
}

impl Default for Intents {
    fn default() -> Self {
        Self::new()
    }
}

impl Intents {
    /// An empty record.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(IntentsState {
                entries: Mutex::new(HashMap::new()),
                changes: watch::Sender::new(0),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Key, Entry>> {
        // A panic while holding the lock leaves plain data behind, never a
        // half-made change that matters more than losing the record.
        self.inner
            .entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn changed(&self) {
        self.inner.changes.send_modify(|version| *version += 1);
    }

    fn key(topic: &str, callback: &str) -> Result<Key, IntentError> {
        Ok((topic_key(topic), CallbackKey::parse(callback)?))
    }

    /// Records that content for `topic` at `callback` (an absolute URL or a
    /// path) is wanted, signed with `secret` when given: for subscriptions
    /// made elsewhere (by an earlier run, by an operator). The receiver then
    /// confirms subscribe verifications for the pair and accepts its
    /// content. Such a pair is not renewed.
    pub fn expect(
        &self,
        topic: &str,
        callback: &str,
        secret: Option<&str>,
    ) -> Result<(), IntentError> {
        let key = Self::key(topic, callback)?;
        let secret = secret.map(Secret::new);
        {
            let mut entries = self.lock();
            match entries.get_mut(&key) {
                Some(entry) if entry.state.wants_content() => entry.secret = secret,
                _ => {
                    entries.insert(key, Entry::requested(topic, secret));
                }
            }
        }
        self.changed();
        Ok(())
    }

    /// The pair's status, if it was ever recorded.
    pub fn status(&self, topic: &str, callback: &str) -> Option<Status> {
        let key = Self::key(topic, callback).ok()?;
        self.lock().get(&key).map(Entry::status)
    }

    /// A receiver that sees a new value whenever any pair changes.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    /// Waits until `condition` holds for the pair's status, at most `limit`.
    /// Returns the status that satisfied it, or `None` on time-out.
    pub async fn wait_for(
        &self,
        topic: &str,
        callback: &str,
        limit: Duration,
        condition: impl Fn(&Status) -> bool,
    ) -> Option<Status> {
        let mut changes = self.changes();
        let wait = async {
            loop {
                changes.borrow_and_update();
                if let Some(status) = self.status(topic, callback)
                    && condition(&status)
                {
                    return status;
                }
                if changes.changed().await.is_err() {
                    // The sender lives in `self`; it cannot be gone.
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::time::timeout(limit, wait).await.ok()
    }

    /// Marks a subscription as asked for, before the request goes out (a
    /// hub may verify before it answers).
    pub(crate) fn want_subscribed(
        &self,
        topic: &str,
        callback: &str,
        secret: Option<&str>,
        renewal: Option<Renewal>,
    ) -> Result<Snapshot, IntentError> {
        let key = Self::key(topic, callback)?;
        let secret = secret.map(Secret::new);
        let snapshot = {
            let mut entries = self.lock();
            let before = entries.get(&key).cloned();
            let entry = match entries.get_mut(&key) {
                Some(entry) if entry.state.wants_content() => {
                    entry.pending_secret = Some(secret);
                    entry
                }
                _ => {
                    let mut entry = Entry::requested(topic, None);
                    entry.pending_secret = Some(secret);
                    entries.entry(key.clone()).insert_entry(entry).into_mut()
                }
            };
            entry.renewal = renewal;
            Snapshot { key, entry: before }
        };
        self.changed();
        Ok(snapshot)
    }

    /// Marks an unsubscription as asked for.
    pub(crate) fn want_unsubscribed(
        &self,
        topic: &str,
        callback: &str,
    ) -> Result<Snapshot, IntentError> {
        let key = Self::key(topic, callback)?;
        let snapshot = {
            let mut entries = self.lock();
            let before = entries.get(&key).cloned();
            let entry = entries
                .entry(key.clone())
                .or_insert_with(|| Entry::requested(topic, None));
            entry.state = State::Unsubscribing;
            entry.pending_secret = None;
            entry.renewal = None;
            Snapshot { key, entry: before }
        };
        self.changed();
        Ok(snapshot)
    }

    /// Puts a pair back as it was before a request the hub refused.
    pub(crate) fn restore(&self, snapshot: Snapshot) {
        {
            let mut entries = self.lock();
            match snapshot.entry {
                Some(entry) => entries.insert(snapshot.key, entry),
                None => entries.remove(&snapshot.key),
            };
        }
        self.changed();
    }

    /// A verification of intent arrived: confirms it (and records the lease
    /// granted) when this subscriber asked for it.
    pub(crate) fn verify(
        &self,
        mode: Mode,
        topic: &str,
        callback: &CallbackKey,
        lease_seconds: Option<u32>,
    ) -> bool {
        let key = (topic_key(topic), callback.clone());
        let confirmed = {
            let mut entries = self.lock();
            let Some(entry) = entries.get_mut(&key) else {
                return false;
            };
            match mode {
                Mode::Subscribe if entry.state.wants_content() => {
                    entry.state = State::Active;
                    if let Some(secret) = entry.pending_secret.take() {
                        entry.secret = secret;
                    }
                    entry.lease = lease_seconds.map(|seconds| Duration::from_secs(seconds.into()));
                    entry.verified_at = Some(Instant::now());
                    entry.verifications = entry.verifications.saturating_add(1);
                    if let Some(renewal) = &mut entry.renewal {
                        renewal.not_before = None;
                    }
                    true
                }
                Mode::Unsubscribe if entry.state.wants_unsubscription() => {
                    entry.state = State::Unsubscribed;
                    entry.secret = None;
                    entry.lease = None;
                    true
                }
                _ => false,
            }
        };
        if confirmed {
            self.changed();
        }
        confirmed
    }

    /// The hub denied a subscription. Returns whether the pair was known.
    pub(crate) fn deny(&self, topic: &str, callback: &CallbackKey, reason: Option<&str>) -> bool {
        let key = (topic_key(topic), callback.clone());
        let known = {
            let mut entries = self.lock();
            match entries.get_mut(&key) {
                Some(entry) => {
                    entry.state = State::Denied {
                        reason: reason.map(str::to_owned),
                    };
                    entry.pending_secret = None;
                    entry.renewal = None;
                    true
                }
                None => false,
            }
        };
        if known {
            self.changed();
        }
        known
    }

    /// Where a delivery to `callback` belongs; `topic` is the `rel="self"`
    /// link, when the delivery had one.
    pub(crate) fn target(&self, topic: Option<&str>, callback: &CallbackKey) -> Target {
        let entries = self.lock();
        let wanted = |entry: &Entry| {
            let mut secrets = vec![entry.secret.clone()];
            if let Some(pending) = &entry.pending_secret {
                secrets.push(pending.clone());
            }
            secrets
        };
        if let Some(topic) = topic {
            let key = (topic_key(topic), callback.clone());
            return match entries.get(&key) {
                Some(entry) if entry.state.wants_content() => Target::Wanted {
                    topic: entry.topic.clone(),
                    secrets: wanted(entry),
                },
                _ => Target::Unwanted,
            };
        }
        let mut here = entries
            .iter()
            .filter(|((_, key), entry)| key == callback && entry.state.wants_content());
        match (here.next(), here.next()) {
            (Some((_, entry)), None) => Target::Wanted {
                topic: entry.topic.clone(),
                secrets: wanted(entry),
            },
            (Some(_), Some(_)) => Target::Ambiguous,
            (None, _) => Target::Unwanted,
        }
    }

    /// The active subscriptions made through `hub` that are due for renewal
    /// at `now` (`fraction` of their lease gone), and when the next one
    /// falls due.
    pub(crate) fn due_renewals(
        &self,
        hub: &Url,
        fraction: f64,
        now: Instant,
    ) -> (Vec<DueRenewal>, Option<Instant>) {
        let entries = self.lock();
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        for entry in entries.values() {
            let (State::Active, Some(renewal), Some(lease), Some(verified_at)) =
                (&entry.state, &entry.renewal, entry.lease, entry.verified_at)
            else {
                continue;
            };
            if &renewal.hub != hub {
                continue;
            }
            let mut at = verified_at + lease.mul_f64(fraction);
            if let Some(not_before) = renewal.not_before {
                at = at.max(not_before);
            }
            if at <= now {
                let secret = match &entry.pending_secret {
                    Some(pending) => pending.clone(),
                    None => entry.secret.clone(),
                };
                due.push(DueRenewal {
                    renewal: renewal.clone(),
                    secret,
                });
            } else {
                next = Some(next.map_or(at, |next| next.min(at)));
            }
        }
        (due, next)
    }

    /// A renewal that fell due at `due` went out (or failed): no other
    /// before `not_before` unless a verification arrives. One that arrived
    /// since `due` already answered it, and nothing is held back.
    pub(crate) fn renewal_sent(
        &self,
        topic: &str,
        callback: &str,
        due: Instant,
        not_before: Instant,
    ) {
        let Ok(key) = Self::key(topic, callback) else {
            return;
        };
        if let Some(entry) = self.lock().get_mut(&key)
            && entry.verified_at.is_none_or(|verified| verified < due)
            && let Some(renewal) = entry.renewal.as_mut()
        {
            renewal.not_before = Some(not_before);
        }
        self.changed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOPIC: &str = "https://pub.example/feed";

    #[test]
    fn callbacks_compare_by_path_and_own_query() {
        let url = CallbackKey::parse("https://me.example:8443/cb?tenant=a%20b").expect("url");
        let path = CallbackKey::parse("/cb?tenant=a+b").expect("path");
        assert_eq!(url, path);
        let request = CallbackKey::from_parts(
            "/cb",
            Some("tenant=a%20b&hub.mode=subscribe&hub.challenge=x"),
        );
        assert_eq!(url, request);
        assert_ne!(url, CallbackKey::parse("/cb").expect("path"));
        assert_eq!(request.to_string(), "/cb?tenant=a+b");
        assert!(CallbackKey::parse("cb").is_err());
        assert!(CallbackKey::parse("ftp://me.example/cb").is_err());
    }

    #[test]
    fn only_asked_for_intents_are_confirmed() {
        let intents = Intents::new();
        let callback = CallbackKey::parse("/cb").expect("path");
        assert!(!intents.verify(Mode::Subscribe, TOPIC, &callback, Some(60)));

        intents
            .want_subscribed(TOPIC, "/cb", Some("s"), None)
            .expect("mark");
        assert!(!intents.verify(Mode::Unsubscribe, TOPIC, &callback, None));
        // The hub's form of the topic matches the one asked for.
        assert!(intents.verify(
            Mode::Subscribe,
            "https://pub.example/fe%65d",
            &callback,
            Some(60)
        ));
        let status = intents.status(TOPIC, "/cb").expect("known");
        assert_eq!(status.state, State::Active);
        assert_eq!(status.lease, Some(Duration::from_secs(60)));

        intents.want_unsubscribed(TOPIC, "/cb").expect("mark");
        assert!(!intents.verify(Mode::Subscribe, TOPIC, &callback, Some(60)));
        assert!(intents.verify(Mode::Unsubscribe, TOPIC, &callback, None));
        assert_eq!(
            intents.status(TOPIC, "/cb").map(|status| status.state),
            Some(State::Unsubscribed)
        );
    }

    #[test]
    fn a_refused_request_puts_the_pair_back() {
        let intents = Intents::new();
        let snapshot = intents
            .want_subscribed(TOPIC, "/cb", None, None)
            .expect("mark");
        intents.restore(snapshot);
        assert_eq!(intents.status(TOPIC, "/cb"), None);

        intents.expect(TOPIC, "/cb", None).expect("expect");
        let snapshot = intents.want_unsubscribed(TOPIC, "/cb").expect("mark");
        intents.restore(snapshot);
        assert_eq!(
            intents.status(TOPIC, "/cb").map(|status| status.state),
            Some(State::Requested)
        );
    }

    #[test]
    fn old_and_new_secrets_both_pass_until_the_renewal_is_verified() {
        let intents = Intents::new();
        let callback = CallbackKey::parse("/cb").expect("path");
        intents.expect(TOPIC, "/cb", Some("old")).expect("expect");
        intents
            .want_subscribed(TOPIC, "/cb", Some("new"), None)
            .expect("mark");
        let Target::Wanted { secrets, .. } = intents.target(Some(TOPIC), &callback) else {
            panic!("wanted");
        };
        assert_eq!(
            secrets,
            vec![Some(Secret::new("old")), Some(Secret::new("new"))]
        );
        assert!(intents.verify(Mode::Subscribe, TOPIC, &callback, Some(60)));
        let Target::Wanted { secrets, .. } = intents.target(None, &callback) else {
            panic!("wanted");
        };
        assert_eq!(secrets, vec![Some(Secret::new("new"))]);
    }

    #[test]
    fn a_topic_subscribed_as_an_iri_matches_its_uri_self_link() {
        let intents = Intents::new();
        let callback = CallbackKey::parse("/cb").expect("path");
        let iri = "http://127.0.0.1:9/flux/caf\u{e9}?q=\u{2713}";
        intents.expect(iri, "/cb", None).expect("expect");
        // What a hub's Link header says, and what its verification says.
        let uri = "http://127.0.0.1:9/flux/caf%C3%A9?q=%E2%9C%93";
        let Target::Wanted { topic, .. } = intents.target(Some(uri), &callback) else {
            panic!("the URI spelling of the topic is wanted");
        };
        assert_eq!(topic, iri, "reported as subscribed");
        assert!(intents.verify(Mode::Subscribe, iri, &callback, Some(60)));
        assert!(matches!(
            intents.target(Some("http://127.0.0.1:9/flux/cafe"), &callback),
            Target::Unwanted
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_fall_due_at_the_fraction_of_the_lease() {
        let intents = Intents::new();
        let hub = Url::parse("https://hub.example/").expect("url");
        let callback = CallbackKey::parse("/cb").expect("path");
        let renewal = Renewal {
            hub: hub.clone(),
            topic: TOPIC.to_owned(),
            callback: "https://me.example/cb".to_owned(),
            lease: Some(Duration::from_secs(100)),
            not_before: None,
        };
        intents
            .want_subscribed(TOPIC, "https://me.example/cb", None, Some(renewal))
            .expect("mark");
        let start = Instant::now();
        let (due, next) = intents.due_renewals(&hub, 0.8, start);
        assert!(due.is_empty() && next.is_none(), "nothing before a lease");

        assert!(intents.verify(Mode::Subscribe, TOPIC, &callback, Some(100)));
        let (due, next) = intents.due_renewals(&hub, 0.8, Instant::now());
        assert!(due.is_empty());
        assert_eq!(next, Some(start + Duration::from_secs(80)));

        tokio::time::advance(Duration::from_secs(80)).await;
        let (due, _) = intents.due_renewals(&hub, 0.8, Instant::now());
        assert_eq!(due.len(), 1);
        let other = Url::parse("https://other.example/").expect("url");
        assert!(
            intents
                .due_renewals(&other, 0.8, Instant::now())
                .0
                .is_empty()
        );

        intents.renewal_sent(
            TOPIC,
            "https://me.example/cb",
            Instant::now(),
            Instant::now() + Duration::from_secs(5),
        );
        let (due, next) = intents.due_renewals(&hub, 0.8, Instant::now());
        assert!(due.is_empty());
        assert_eq!(next, Some(Instant::now() + Duration::from_secs(5)));
    }
}

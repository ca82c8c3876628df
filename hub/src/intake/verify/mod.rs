//! Verification of intent (WebSub 5.3), denials (5.2), and the subscription
//! workflow around them: a subscribe or unsubscribe request changes the
//! store only after the subscriber has confirmed it.
//!
//! [`Verifier`] makes the GET requests; [`Subscriptions`] runs the workflow
//! (network policy, lease, verification, save or delete). A request is
//! written to the backlog before the hub answers 202, with the requests
//! arriving beside it in one statement (`group_commit`), and verifiers
//! claim it from there (`queue`): bounded in number and in concurrency,
//! retried when the callback could not answer, resumed after a restart.
//! The outcomes of verifications that end together are written together
//! too.

mod catch_up;
mod denied;
mod group_commit;
mod queue;

pub use catch_up::CatchUp;

use group_commit::{GroupCommit, Owing};

pub use queue::VERIFICATIONS_TOTAL;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Body as _;
use rand::Rng;
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;
use tracing::Instrument;
use url::Url;
use websub_store::{StoreError, Subscription, SubscriptionStore};

use crate::clock::Clock;
use crate::config::{LeasePolicy, VerificationPolicy};
use crate::delivery::attempt::{error_chain, lacks_local_resource};
use crate::delivery::direct::{AnswerBody, BoxError};
use crate::delivery::net::{self, NetError, NetPolicy};
use crate::delivery::pool::HostClients;
use crate::intake::lease;
use crate::intake::quota::{QuotaEnforcer, QuotaError};
use crate::protocol::{Mode, SubscriptionRequest};
use crate::storage::backlog::{Admission, Backlog, BacklogError, Intent, IntentResult};
use crate::storage::events::EventLogError;

/// Length of a `hub.challenge`: 43 alphanumeric characters carry about 256
/// bits from the CSPRNG.
pub const CHALLENGE_LENGTH: usize = 43;

/// How much more than the challenge a verification response may carry
/// before the hub stops reading: enough for a sloppy echo, too little to
/// exhaust memory.
const RESPONSE_SLACK_BYTES: usize = 1024;

/// Why a verification (or a denial notice) did not succeed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// The callback could not be parsed as a URL.
    #[error("the callback is not a valid URL")]
    InvalidCallback {
        /// The parser's error.
        #[source]
        source: url::ParseError,
    },
    /// 404: the subscriber does not agree with the request.
    #[error("the subscriber refused (404 Not Found)")]
    NotFound,
    /// A 3xx: WebSub counts a redirect as failure, and it is not followed.
    #[error("the callback redirected ({status}); redirects are not followed")]
    Redirect {
        /// The status received.
        status: StatusCode,
    },
    /// Any other status outside 2xx.
    #[error("the callback answered {status}")]
    Status {
        /// The status received.
        status: StatusCode,
    },
    /// A 2xx whose body is not exactly the challenge.
    #[error(
        "the callback answered 2xx with a body of {body_bytes} bytes that is not the challenge"
    )]
    ChallengeMismatch {
        /// How many bytes of body were read (reading stops past the bound).
        body_bytes: usize,
    },
    /// No complete answer within the verification timeout.
    #[error("the callback did not answer within {timeout:?}")]
    Timeout {
        /// The timeout that elapsed.
        timeout: Duration,
    },
    /// No connection could be made (refused, unresolvable, or refused by
    /// the network policy at connect time).
    #[error("could not connect to the callback")]
    Connect {
        /// The client's error.
        #[source]
        source: BoxError,
    },
    /// The request failed after connecting.
    #[error("the request to the callback failed")]
    Request {
        /// The client's error.
        #[source]
        source: BoxError,
    },
    /// The hub lacked a resource of its own to contact the callback (a file
    /// descriptor, memory): no fault of the subscriber's, and tried again.
    #[error("the hub could not contact the callback: {0}")]
    Local(String),
}

/// Makes verification-of-intent and denial requests to callbacks.
///
/// It contacts whatever callback it is given, through a client whose
/// resolver applies the network policy to names; callers check IP literals
/// with [`NetPolicy::check_literal`] first, as [`Subscriptions`] does.
#[derive(Debug, Clone)]
pub struct Verifier {
    clients: HostClients,
    policy: VerificationPolicy,
}

impl Verifier {
    /// A verifier using the `clients` of deliveries (no redirects, idle
    /// connections bounded) and the policy's timeout for each request.
    pub fn new(clients: HostClients, policy: VerificationPolicy) -> Self {
        Self { clients, policy }
    }

    /// The verification policy in force.
    pub fn policy(&self) -> VerificationPolicy {
        self.policy
    }

    /// Asks the callback to confirm `mode` of `topic`: a GET with
    /// `hub.mode`, `hub.topic`, a fresh `hub.challenge` and, when given,
    /// `hub.lease_seconds`, appended to the callback's own query string.
    /// Succeeds only on a 2xx whose body is exactly the challenge.
    pub async fn verify(
        &self,
        mode: Mode,
        topic: &str,
        callback: &str,
        lease_seconds: Option<u32>,
    ) -> Result<(), VerifyError> {
        let span = tracing::info_span!("verify", %mode, %topic, %callback);
        async {
            let challenge = new_challenge();
            let mut url = callback_url(callback)?;
            {
                let mut query = url.query_pairs_mut();
                query
                    .append_pair("hub.mode", mode.as_str())
                    .append_pair("hub.topic", topic)
                    .append_pair("hub.challenge", &challenge);
                if let Some(lease_seconds) = lease_seconds {
                    query.append_pair("hub.lease_seconds", &lease_seconds.to_string());
                }
            }
            let body = self
                .get(url, Some(challenge.len() + RESPONSE_SLACK_BYTES))
                .await?;
            if body == challenge.as_bytes() {
                tracing::debug!("verified");
                Ok(())
            } else {
                Err(VerifyError::ChallengeMismatch {
                    body_bytes: body.len(),
                })
            }
        }
        .instrument(span)
        .await
    }

    /// Tells the callback its subscription to `topic` is denied: a GET with
    /// `hub.mode=denied`, `hub.topic` and `hub.reason`. Succeeds on any 2xx;
    /// the body is ignored.
    pub async fn deny(&self, topic: &str, callback: &str, reason: &str) -> Result<(), VerifyError> {
        let span = tracing::info_span!("deny", %topic, %callback);
        async {
            let mut url = callback_url(callback)?;
            url.query_pairs_mut()
                .append_pair("hub.mode", "denied")
                .append_pair("hub.topic", topic)
                .append_pair("hub.reason", reason);
            self.get(url, None).await.map(drop)
        }
        .instrument(span)
        .await
    }

    /// Sends the GET and sorts the status: on a 2xx, returns the body read
    /// up to `limit` bytes (none without one); anything else is an error.
    /// The policy's timeout covers it all.
    async fn get(&self, url: Url, limit: Option<usize>) -> Result<Vec<u8>, VerifyError> {
        let timeout = self.policy.timeout;
        tokio::time::timeout(timeout, self.exchange(url, limit))
            .await
            .unwrap_or(Err(VerifyError::Timeout { timeout }))
    }

    async fn exchange(&self, url: Url, limit: Option<usize>) -> Result<Vec<u8>, VerifyError> {
        let client = self.clients.for_url(url.as_str());
        let request = http::Request::new(Full::new(Bytes::new()));
        let response = client
            .send(url.as_str(), request)
            .await
            .map_err(transport_error)?;
        let status = response.status();
        if status.is_success() {
            match limit {
                Some(limit) => read_at_most(response.into_body(), limit).await,
                None => Ok(Vec::new()),
            }
        } else if status == StatusCode::NOT_FOUND {
            Err(VerifyError::NotFound)
        } else if status.is_redirection() {
            Err(VerifyError::Redirect { status })
        } else {
            Err(VerifyError::Status { status })
        }
    }
}

/// Reads `body`, giving up as soon as it exceeds `limit` bytes: such a body
/// cannot be the challenge.
async fn read_at_most(mut body: AnswerBody, limit: usize) -> Result<Vec<u8>, VerifyError> {
    let too_long = |body_bytes| VerifyError::ChallengeMismatch { body_bytes };
    let announced = body.size_hint().lower();
    if announced > limit as u64 {
        return Err(too_long(usize::try_from(announced).unwrap_or(usize::MAX)));
    }
    let mut read = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|error| transport_error(error.into()))?;
        if let Ok(chunk) = frame.into_data() {
            read.extend_from_slice(&chunk);
            if read.len() > limit {
                return Err(too_long(read.len()));
            }
        }
    }
    Ok(read)
}

fn transport_error(error: BoxError) -> VerifyError {
    let connecting = error
        .downcast_ref::<crate::delivery::direct::ConnectFailed>()
        .is_some();
    if lacks_local_resource(error.as_ref()) {
        VerifyError::Local(error_chain(error.as_ref()))
    } else if connecting {
        VerifyError::Connect { source: error }
    } else {
        VerifyError::Request { source: error }
    }
}

fn callback_url(callback: &str) -> Result<Url, VerifyError> {
    Url::parse(callback).map_err(|source| VerifyError::InvalidCallback { source })
}

/// A fresh, single-use challenge from the thread-local CSPRNG (ChaCha,
/// seeded from the operating system).
fn new_challenge() -> String {
    rand::rng()
        .sample_iter(rand::distr::Alphanumeric)
        .take(CHALLENGE_LENGTH)
        .map(char::from)
        .collect()
}

/// What a processed request did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Processed {
    /// Verified and saved with this lease.
    Subscribed {
        /// The lease granted, in seconds.
        lease_seconds: u32,
    },
    /// Verified and deleted.
    Unsubscribed,
}

/// Why a processed request changed nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProcessError {
    /// The network policy refuses the callback.
    #[error("the callback is refused by the network policy")]
    Refused(#[source] NetError),
    /// The subscriber did not confirm.
    #[error("verification of intent failed")]
    Verification(#[source] VerifyError),
    /// The hub's policy refused the subscription (the deny list, before
    /// verification; the quota, after it); the subscriber was sent a denial
    /// with this reason.
    #[error("subscription denied: {reason}")]
    Denied {
        /// The reason sent as `hub.reason`.
        reason: String,
    },
    /// The store failed.
    #[error("the subscription store failed")]
    Store(#[source] StoreError),
    /// The subscriber's limit could not be obtained; nothing was saved.
    #[error("the subscription quota could not be checked")]
    Quota(#[source] QuotaError),
    /// Saved, but the events published since the verification request could
    /// not be handed to the new subscription.
    #[error("the events published during verification could not be delivered")]
    CatchUp(#[source] EventLogError),
    /// The deny list could not be read; nothing was verified.
    #[error("the deny list could not be read")]
    DenyList(#[source] EventLogError),
}

/// The subscription workflow. Cheap to clone: clones share everything.
#[derive(Debug, Clone)]
pub struct Subscriptions {
    inner: Arc<WorkflowState>,
}

#[derive(Debug)]
struct WorkflowState {
    store: Arc<dyn SubscriptionStore>,
    backlog: Arc<dyn Backlog>,
    verifier: Verifier,
    net: NetPolicy,
    lease: LeasePolicy,
    clock: Arc<dyn Clock>,
    /// Bounds verifications in flight (`VerificationPolicy::concurrency`)
    /// for callers of [`Subscriptions::process`]; the verifiers claim no
    /// more than that many.
    verifications: Semaphore,
    /// Told when an intent is written, so that a verifier claims it at once.
    written: Arc<tokio::sync::Notify>,
    tracker: TaskTracker,
    on_change: std::sync::OnceLock<ChangeListener>,
    quota: std::sync::OnceLock<QuotaEnforcer>,
    denials: std::sync::OnceLock<crate::intake::deny::Denials>,
    catch_up: std::sync::OnceLock<CatchUp>,
    /// Writes requests to the backlog in groups; started by the first.
    admissions: std::sync::OnceLock<GroupCommit<Intent, Result<Admission, BacklogError>>>,
    /// Saves verified subscriptions in groups (without a quota, whose
    /// saves are counted one by one); started by the first.
    saves: std::sync::OnceLock<GroupCommit<Subscription, Result<(), StoreError>>>,
    /// Hands the subscriptions saved together the events they are owed,
    /// in one write; started by the first.
    catch_ups: std::sync::OnceLock<GroupCommit<Owing, Result<(), EventLogError>>>,
    /// Writes how verifications ended in groups; started by the first.
    outcomes: std::sync::OnceLock<GroupCommit<(Intent, IntentResult), Result<(), BacklogError>>>,
}

/// Why a delivery of an event published after its subscription's
/// unsubscribe answer is closed undelivered.
pub const UNSUBSCRIBED: &str = "unsubscribed before the event was published";

/// Told the topic of every subscription the workflow saves or deletes, once
/// the store has it, so whoever keeps something of a topic's subscribers
/// (the dispatcher's cache, the outbox feeds' subscribed topics) can read
/// them again.
#[derive(Clone)]
pub struct ChangeListener(Arc<dyn Fn(&str) + Send + Sync>);

impl ChangeListener {
    /// A listener calling `notify` with the topic that changed.
    pub fn new(notify: impl Fn(&str) + Send + Sync + 'static) -> Self {
        Self(Arc::new(notify))
    }
}

impl std::fmt::Debug for ChangeListener {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("ChangeListener")
    }
}

/// Why [`Subscriptions::save`] did not save.
enum SaveError {
    /// The hub's policy refuses the subscription; the reason goes to the
    /// subscriber in a denial.
    Refused {
        reason: String,
    },
    Store(StoreError),
    Quota(QuotaError),
}

impl Subscriptions {
    /// The workflow over `store`, its pending requests in `backlog`,
    /// verifying with `verifier`, at most `verification.concurrency`
    /// verifications at once, granting leases by `lease`.
    pub fn new(
        store: Arc<dyn SubscriptionStore>,
        backlog: Arc<dyn Backlog>,
        verifier: Verifier,
        net: NetPolicy,
        lease: LeasePolicy,
        verification: VerificationPolicy,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let permits = verification.concurrency.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            inner: Arc::new(WorkflowState {
                store,
                backlog,
                verifier,
                net,
                lease,
                clock,
                verifications: Semaphore::new(permits),
                written: Arc::new(tokio::sync::Notify::new()),
                tracker: TaskTracker::new(),
                on_change: std::sync::OnceLock::new(),
                quota: std::sync::OnceLock::new(),
                denials: std::sync::OnceLock::new(),
                catch_up: std::sync::OnceLock::new(),
                admissions: std::sync::OnceLock::new(),
                saves: std::sync::OnceLock::new(),
                catch_ups: std::sync::OnceLock::new(),
                outcomes: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Sets who is told of saved and deleted subscriptions (once; later calls
    /// are ignored).
    pub fn on_change(&self, listener: ChangeListener) {
        let _ = self.inner.on_change.set(listener);
    }

    /// Enforces `quota` on every save from now on (once; later calls are
    /// ignored): each verified subscription is saved through the quota's
    /// conditional save, and one over the limit is denied.
    pub fn enforce_quota(&self, quota: QuotaEnforcer) {
        let _ = self.inner.quota.set(quota);
    }

    /// Hands every new subscription the events of its topic recorded since
    /// its verification request was sent (once; later calls are ignored):
    /// a publish answered after the subscriber confirmed reaches it,
    /// whichever of the publish and the save commits first.
    pub fn catch_up_with(&self, catch_up: CatchUp) {
        let _ = self.inner.catch_up.set(catch_up);
    }

    /// The quota enforced on saves, if any.
    pub fn quota(&self) -> Option<&QuotaEnforcer> {
        self.inner.quota.get()
    }

    /// The subscription store.
    pub fn store(&self) -> &Arc<dyn SubscriptionStore> {
        &self.inner.store
    }

    /// Keeps `subscription` as given (its owner changed its secret through
    /// the API), and tells the change listener, so deliveries sign with
    /// what it now holds.
    pub async fn replace(&self, subscription: &Subscription) -> Result<(), StoreError> {
        self.inner.store.save(subscription).await?;
        self.changed(&subscription.topic);
        tracing::info!(
            topic = %subscription.topic,
            callback = %subscription.callback,
            "changed by its owner"
        );
        Ok(())
    }

    /// Removes a subscription at its owner's request, without verification
    /// (the owner is authenticated), and tells the change listener.
    pub async fn remove(&self, topic: &str, callback: &str) -> Result<(), StoreError> {
        self.inner.store.delete(topic, callback).await?;
        self.changed(topic);
        tracing::info!(topic, callback, "removed by its owner");
        Ok(())
    }

    fn changed(&self, topic: &str) {
        if let Some(listener) = self.inner.on_change.get() {
            (listener.0)(topic);
        }
    }

    /// The verifications in flight. At shutdown, once the verifiers have
    /// stopped: `tracker().close()`, then `tracker().wait().await`.
    pub fn tracker(&self) -> &TaskTracker {
        &self.inner.tracker
    }

    /// The verifier, e.g. to send a denial outside a request.
    pub fn verifier(&self) -> &Verifier {
        &self.inner.verifier
    }

    /// The checks made before answering 202: the callback must pass the
    /// network policy now. Errors are client errors with a readable reason.
    pub async fn check(&self, request: &SubscriptionRequest) -> Result<(), NetError> {
        self.inner.net.check_str(&request.callback).await.map(drop)
    }

    /// The network policy applied to a topic the hub is asked to fetch
    /// (publish pings), before answering.
    pub async fn check_topic(&self, topic: &str) -> Result<(), NetError> {
        self.inner.net.check_str(topic).await.map(drop)
    }

    /// Verifies `request` and only then saves (subscribe) or deletes
    /// (unsubscribe). A failure at any step leaves the store as it was, so
    /// an earlier subscription and its secret stay in force. Logs one line
    /// per failure.
    pub async fn process(&self, request: SubscriptionRequest) -> Result<Processed, ProcessError> {
        let span = tracing::info_span!(
            "subscription",
            mode = %request.mode,
            topic = %request.topic,
            callback = %request.callback,
        );
        let outcome = self.process_quietly(request).instrument(span.clone()).await;
        if let Err(error) = &outcome {
            span.in_scope(|| log_failure(error));
        }
        outcome
    }

    async fn process_quietly(
        &self,
        request: SubscriptionRequest,
    ) -> Result<Processed, ProcessError> {
        // The semaphore is never closed, so acquiring cannot fail.
        let _permit = self.inner.verifications.acquire().await.ok();
        // IP literals bypass the client's filtering resolver.
        let callback = net::parse_url(&request.callback).map_err(ProcessError::Refused)?;
        self.inner
            .net
            .check_literal(&callback)
            .map_err(ProcessError::Refused)?;
        match request.mode {
            Mode::Subscribe => self.subscribe(request).await,
            Mode::Unsubscribe => self.unsubscribe(request).await,
        }
    }

    async fn subscribe(&self, request: SubscriptionRequest) -> Result<Processed, ProcessError> {
        // Denied before its intent is verified: the callback learns why
        // either way, and is asked nothing.
        if let Some(reason) = self.on_the_deny_list(&request).await? {
            self.notify_denied(&request.topic, &request.callback, &reason)
                .await;
            return Err(ProcessError::Denied { reason });
        }
        let lease_seconds = lease::grant(&self.inner.lease, request.lease_seconds);
        // WebSub: the lease runs from the moment of the verification request.
        let requested_at = self.inner.clock.now();
        self.inner
            .verifier
            .verify(
                Mode::Subscribe,
                &request.topic,
                &request.callback,
                Some(lease_seconds),
            )
            .await
            .map_err(ProcessError::Verification)?;
        // A renewal keeps when the subscription was created: the save does
        // (`renew_all`), without a read of its own.
        let subscription = Subscription {
            topic: request.topic,
            callback: request.callback,
            secret: request.secret,
            lease_seconds: Some(lease_seconds),
            created_at: requested_at,
            verified_at: requested_at,
            expires_at: Some(requested_at + chrono::Duration::seconds(i64::from(lease_seconds))),
            owner: request.owner,
        };
        match self.save(&subscription).await {
            Ok(()) => {
                if let Some(catch_up) = self.inner.catch_up.get() {
                    (catch_up.unsubscribed)(&subscription.topic, &subscription.callback, None);
                }
                self.changed(&subscription.topic);
                tracing::info!(lease_seconds, "subscribed");
                self.catch_up(&subscription, requested_at).await?;
                Ok(Processed::Subscribed { lease_seconds })
            }
            Err(SaveError::Refused { reason }) => {
                self.notify_denied(&subscription.topic, &subscription.callback, &reason)
                    .await;
                Err(ProcessError::Denied { reason })
            }
            Err(SaveError::Store(error)) => Err(ProcessError::Store(error)),
            Err(SaveError::Quota(error)) => Err(ProcessError::Quota(error)),
        }
    }

    /// Delivers to a subscription just saved the events of its topic
    /// recorded since `since`, when its verification request was sent. A
    /// publish fetched before the save saw no subscription (or the backlog's
    /// pending subscribe, which kept the fetch from being skipped) and was
    /// expanded without this one; its event is recorded after `since`.
    async fn catch_up(
        &self,
        subscription: &Subscription,
        since: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), ProcessError> {
        let Some(catch_up) = self.inner.catch_up.get() else {
            return Ok(());
        };
        let catch_ups = self.inner.catch_ups.get_or_init(|| {
            let events = catch_up.events.clone();
            let wake = catch_up.wake.clone();
            let clock = self.inner.clock.clone();
            GroupCommit::start(move |owing: Vec<Owing>| {
                let (events, wake, clock) = (events.clone(), wake.clone(), clock.clone());
                async move {
                    group_commit::deliver_since_all(&*events, &owing, clock.now(), &*wake).await
                }
            })
        });
        let owing = Owing {
            topic: subscription.topic.clone(),
            callback: subscription.callback.clone(),
            since,
        };
        catch_ups
            .join(owing)
            .await
            .unwrap_or_else(|| {
                Err(EventLogError::Invalid(
                    "the writer of catch-ups stopped".to_owned(),
                ))
            })
            .map_err(ProcessError::CatchUp)
    }

    async fn unsubscribe(&self, request: SubscriptionRequest) -> Result<Processed, ProcessError> {
        self.inner
            .verifier
            .verify(Mode::Unsubscribe, &request.topic, &request.callback, None)
            .await
            .map_err(ProcessError::Verification)?;
        // From the answer on, nothing recorded goes to this callback: the
        // scheduler is told before the delete (it may hold the
        // subscription in a cache or a queue), and the records expanded
        // meanwhile are closed after it.
        let answered_at = self.inner.clock.now();
        let catch_up = self.inner.catch_up.get();
        if let Some(catch_up) = catch_up {
            (catch_up.unsubscribed)(&request.topic, &request.callback, Some(answered_at));
        }
        self.inner
            .store
            .delete(&request.topic, &request.callback)
            .await
            .map_err(ProcessError::Store)?;
        self.changed(&request.topic);
        if let Some(catch_up) = catch_up {
            let dropped = catch_up
                .events
                .drop_since(
                    &request.topic,
                    &request.callback,
                    answered_at,
                    UNSUBSCRIBED,
                    self.inner.clock.now(),
                )
                .await
                .map_err(ProcessError::CatchUp)?;
            if dropped > 0 {
                tracing::info!(
                    dropped,
                    "deliveries of events published after the unsubscribe answer dropped"
                );
            }
        }
        tracing::info!("unsubscribed");
        Ok(Processed::Unsubscribed)
    }

    /// The one place a verified subscription is written. With a quota, the
    /// save is the store's conditional save, counted under the owner's lock;
    /// a refusal comes back as [`SaveError::Refused`], after which the
    /// subscriber is sent a denial. A limit that cannot be obtained saves
    /// nothing and denies nothing: the subscriber may simply try again.
    async fn save(&self, subscription: &Subscription) -> Result<(), SaveError> {
        let Some(quota) = self.inner.quota.get() else {
            let saves = self.inner.saves.get_or_init(|| {
                let store = self.inner.store.clone();
                GroupCommit::start(move |subscriptions: Vec<Subscription>| {
                    let store = store.clone();
                    async move { group_commit::renew_all(store.as_ref(), &subscriptions).await }
                })
            });
            return saves
                .join(subscription.clone())
                .await
                .unwrap_or_else(|| {
                    Err(StoreError::Invalid(
                        "the writer of saves stopped".to_owned(),
                    ))
                })
                .map_err(|error| match error {
                    StoreError::LimitReached { limit, .. } => SaveError::Refused {
                        reason: format!("subscription limit of {limit} reached"),
                    },
                    other => SaveError::Store(other),
                });
        };
        // Saved on its own, counted under the owner's lock: a renewal
        // reads when it was created first.
        let subscription = websub_store::as_renewal(&*self.inner.store, subscription.clone())
            .await
            .map_err(SaveError::Store)?;
        match quota.check_total(&*self.inner.store, &subscription).await {
            Ok(()) => Ok(()),
            Err(QuotaError::LimitReached { limit, used }) => Err(SaveError::Refused {
                reason: format!("subscription limit reached: {used} of {limit} in use"),
            }),
            Err(QuotaError::NotAllowed { .. }) => Err(SaveError::Refused {
                reason: "the subscriber's plan does not include subscriptions".to_owned(),
            }),
            Err(QuotaError::Store(StoreError::MissingOwner)) => Err(SaveError::Refused {
                reason: "the subscription has no authenticated owner".to_owned(),
            }),
            Err(QuotaError::Store(error)) => Err(SaveError::Store(error)),
            Err(error) => Err(SaveError::Quota(error)),
        }
    }
}

fn log_failure(error: &ProcessError) {
    let chain = error_chain(error);
    match error {
        ProcessError::Refused(_) => tracing::info!(error = %chain, "callback refused"),
        ProcessError::Verification(_) => tracing::info!(error = %chain, "not verified"),
        ProcessError::Denied { .. } => tracing::info!(error = %chain, "denied"),
        ProcessError::Store(_) => tracing::warn!(error = %chain, "not saved"),
        ProcessError::Quota(_) => tracing::warn!(error = %chain, "not saved"),
        ProcessError::CatchUp(_) => tracing::warn!(error = %chain, "saved, not caught up"),
        ProcessError::DenyList(_) => tracing::warn!(error = %chain, "not checked"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_are_long_url_safe_and_fresh() {
        let first = new_challenge();
        let second = new_challenge();
        assert!(first.len() >= 32);
        assert!(first.bytes().all(|byte| byte.is_ascii_alphanumeric()));
        assert_ne!(first, second);
    }

    #[test]
    fn chain_shows_every_cause() {
        let error = ProcessError::Refused(NetError::NoAddress {
            host: "x.example".to_owned(),
        });
        assert_eq!(
            error_chain(&error),
            "the callback is refused by the network policy: the host x.example has no address"
        );
    }
}

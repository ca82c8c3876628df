//! What a receiver reports of its work: the events its listeners are
//! offered, the counts of [`ReceiverStats`], and the metrics beside them.

use std::sync::atomic::{AtomicU64, Ordering};

use websub_protocol::Mode;

/// Something observable the receiver did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReceiverEvent {
    /// A verification of intent was confirmed.
    Verified {
        /// Subscribe or unsubscribe.
        mode: Mode,
        /// `hub.topic`.
        topic: String,
        /// The callback path (and its own query).
        callback: String,
        /// `hub.lease_seconds`, for a subscribe.
        lease_seconds: Option<u32>,
    },
    /// A verification of intent was answered 404: not asked for.
    Refused {
        /// `hub.mode` as given.
        mode: String,
        /// `hub.topic`.
        topic: String,
        /// The callback path.
        callback: String,
    },
    /// The hub denied a subscription.
    Denied {
        /// `hub.topic`.
        topic: String,
        /// The callback path.
        callback: String,
        /// `hub.reason`, when given.
        reason: Option<String>,
    },
    /// The handler processed a notification.
    Delivered {
        /// Its topic.
        topic: String,
        /// Its event id.
        event_id: Option<String>,
    },
    /// A notification processed before was acknowledged and dropped.
    Duplicate {
        /// Its topic.
        topic: String,
        /// Its event id.
        event_id: String,
    },
    /// A WebSub delivery with a missing or wrong signature was acknowledged
    /// and ignored.
    SignatureRejected {
        /// The subscription's topic.
        topic: String,
        /// The callback path.
        callback: String,
        /// Its event id header, unverified.
        event_id: Option<String>,
    },
    /// A webhook with a missing or wrong signature was refused (401).
    Unauthorized {
        /// The webhook path.
        path: String,
        /// Its event id header, unverified.
        event_id: Option<String>,
    },
    /// A delivery for a subscription this service does not want was
    /// answered 410 Gone, which lets the hub end it.
    Unwanted {
        /// Its `rel="self"` link, when it had one.
        topic: Option<String>,
        /// The callback path.
        callback: String,
    },
    /// The handler failed (or panicked); the sender will retry.
    HandlerFailed {
        /// The topic.
        topic: String,
        /// The event id.
        event_id: Option<String>,
        /// The error, with its causes.
        error: String,
    },
}

/// Counts of what the receiver did since it was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReceiverStats {
    /// Verifications confirmed.
    pub verified: u64,
    /// Verifications refused (404).
    pub refused: u64,
    /// Denials received.
    pub denied: u64,
    /// Notifications the handler processed.
    pub delivered: u64,
    /// Duplicates dropped.
    pub duplicates: u64,
    /// Duplicates that came while the first copy was still being processed
    /// (answered 503).
    pub in_progress: u64,
    /// WebSub deliveries ignored for their signature.
    pub signature_rejected: u64,
    /// Webhooks refused for their signature.
    pub unauthorized: u64,
    /// Deliveries for subscriptions not wanted (410).
    pub unwanted: u64,
    /// Failures of the notification handler.
    pub handler_failed: u64,
}

/// The running counts behind [`ReceiverStats`].
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) verified: AtomicU64,
    pub(super) refused: AtomicU64,
    pub(super) denied: AtomicU64,
    pub(super) delivered: AtomicU64,
    pub(super) duplicates: AtomicU64,
    pub(super) in_progress: AtomicU64,
    pub(super) signature_rejected: AtomicU64,
    pub(super) unauthorized: AtomicU64,
    pub(super) unwanted: AtomicU64,
    pub(super) handler_failed: AtomicU64,
}

/// Counts one outcome, here and in `metrics`.
pub(super) fn bump(counter: &AtomicU64, metric: &'static str, outcome: &'static str) {
    counter.fetch_add(1, Ordering::Relaxed);
    metrics::counter!(metric, "outcome" => outcome).increment(1);
}

pub(super) const VERIFICATIONS: &str = "websub_receiver_verifications_total";
pub(super) const NOTIFICATIONS: &str = "websub_receiver_notifications_total";

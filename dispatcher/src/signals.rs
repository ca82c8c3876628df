//! What wakes the run loop: notifications, requests for a scan or a
//! claim, the listener coming back; gathered in [`Pending`] until the next
//! pass takes them.

use std::sync::atomic::Ordering;

use uuid::Uuid;

use super::Dispatcher;

/// What the next pass must look at, gathered from wake-ups until it runs.
#[derive(Debug, Default)]
pub(super) struct Pending {
    /// Events announced by `NOTIFY`.
    pub(super) ids: Vec<Uuid>,
    pub(super) scan: Scan,
    /// Whether rows may be due that no expansion hands over claimed:
    /// unclaimed ones written by a scan, retries, stale claims, rows other
    /// dispatchers left.
    pub(super) claim: bool,
    /// Whether the next scan must include the newest events, which scans
    /// otherwise leave to their notifications: something was committed that
    /// no notification names and the pass could not expand it itself (more
    /// ids than are kept, or a failed statement).
    pub(super) newest: bool,
    /// Whether something was committed that no notification names (a
    /// `NOTIFY` without the event's id, as producers other than this library
    /// send): the next pass expands the newest events, claiming them.
    pub(super) unnamed: bool,
}

impl Pending {
    /// Something was committed that no notification names: a recent scan,
    /// the newest events included.
    pub(super) fn newest_scan(&mut self) {
        self.scan = self.scan.max(Scan::Newest);
        self.newest = true;
    }
}

/// How much of the outbox a pass expands, least to most.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Scan {
    #[default]
    None,
    /// Events since the previous scan, less [`NEWEST_LOOKBACK`]: what a
    /// `NOTIFY` that names no event falls back to when the pass cannot
    /// expand the newest events itself. An event whose transaction began
    /// longer ago than that before it committed is left to the next recent
    /// scan (the next poll).
    Newest,
    /// Events since the previous scan, less the lookback.
    Recent,
    /// Every event since `start_from`.
    Full,
}

/// How far before the previous scan a scan for the newest events starts.
pub(super) const NEWEST_LOOKBACK: std::time::Duration = std::time::Duration::from_millis(500);

/// How far before the previous expansion of the newest events the next one
/// starts: an event whose transaction was open longer than this (from its
/// `created_at`, the transaction's start, to its commit) is left to the
/// next recent scan, at most a poll interval later. Each expansion reads the
/// events of this window again, so it is kept short.
pub(super) const UNNAMED_LOOKBACK: std::time::Duration = std::time::Duration::from_millis(50);

/// Event ids gathered from notifications before a pass falls back to a
/// recent scan instead (one statement either way).
pub(super) const MAX_NOTIFIED_IDS: usize = 10_000;

/// Notified events that start a pass at once, however soon after the last.
pub(super) const PASS_GATHERING_LIMIT: usize = 64;

impl Dispatcher {
    /// Runs a pass now rather than at the next poll: expand recent events,
    /// then claim and deliver.
    pub fn wake(&self) {
        self.ask(|pending| {
            pending.unnamed = true;
            pending.claim = true;
        });
    }

    pub(super) fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.inner
            .pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) fn request(&self, scan: Scan) {
        self.ask(|pending| {
            pending.scan = pending.scan.max(scan);
            pending.claim = true;
        });
    }

    /// Adds to what the next pass must look at, and wakes the run loop.
    fn ask(&self, change: impl FnOnce(&mut Pending)) {
        change(&mut self.pending());
        self.inner.wake.notify_one();
    }

    /// A notification arrived on the channel: its payload names the event
    /// when it came from [`super::Outbox`]; anything else asks for the
    /// newest events.
    pub(crate) fn notified(&self, payload: &str) {
        self.ask(|pending| match Uuid::try_parse(payload) {
            Ok(id) if pending.ids.len() < MAX_NOTIFIED_IDS => pending.ids.push(id),
            Ok(_) => pending.newest_scan(),
            Err(_) => pending.unnamed = true,
        });
    }

    /// Whether the next pass has nothing to do but expand notified events,
    /// and not so many that they should go at once.
    pub(super) fn only_notified(&self) -> bool {
        let pending = self.pending();
        pending.scan == Scan::None && !pending.claim && pending.ids.len() < PASS_GATHERING_LIMIT
    }

    /// The listener connected (again): notifications may have been missed.
    pub(crate) fn listener_connected(&self, connected: bool) {
        self.inner.listening.store(connected, Ordering::Relaxed);
        let outbox = self.inner.config.tables.outbox().to_owned();
        metrics::gauge!(super::OUTBOX_LISTENER_CONNECTED, "outbox" => outbox).set(if connected {
            1.0
        } else {
            0.0
        });
        if connected {
            self.request(Scan::Full);
        }
    }
}

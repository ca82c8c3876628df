//! What the run loop remembers between its passes: how far its scans of
//! the outbox have looked (by `created_at`, see the scheduling module's
//! terms), what an expansion and a claim round came to, and where a scan
//! starts when nothing bounds it.

use std::time::Duration;

use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use tokio::time::Instant;

use super::signals::{NEWEST_LOOKBACK, Scan, UNNAMED_LOOKBACK};

/// How a scan ended.
#[derive(Debug)]
pub(super) struct ScanResult {
    pub(super) scan: Scan,
    pub(super) since: NaiveDateTime,
    /// Whether it included the newest events.
    pub(super) newest: bool,
    /// Rows written, and the database time the scan ran at.
    pub(super) outcome: Result<(u64, NaiveDateTime), sqlx::Error>,
}

/// What an expansion of notified events did.
#[derive(Debug)]
pub(super) struct Expanded {
    /// Every statement succeeded.
    pub(super) succeeded: bool,
    /// It may have written rows it did not claim.
    pub(super) left_unclaimed: bool,
    /// A notified id named no event: the notification's event is unknown.
    pub(super) unknown_ids: bool,
}

impl Expanded {
    /// Folds this expansion's end into the pass's state; returns whether a
    /// notified id named no event.
    pub(super) fn record(self, failed: &mut bool, claim: &mut bool) -> bool {
        *failed |= !self.succeeded;
        *claim |= self.left_unclaimed;
        self.unknown_ids
    }
}

/// Where expansion stands between passes.
#[derive(Debug)]
pub(super) struct Expansion {
    /// The configured cutoff, or the beginning of time.
    pub(super) start_from: NaiveDateTime,
    /// The database time the last successful scan ran at.
    pub(super) watermark: Option<NaiveDateTime>,
    /// When the last scan of everything since `start_from` ran.
    pub(super) last_full_scan: Instant,
    /// The database time the last expansion of the newest events ran at.
    pub(super) newest_mark: Option<NaiveDateTime>,
}

impl Expansion {
    pub(super) fn new(start_from: Option<DateTime<Utc>>) -> Self {
        Self {
            start_from: start_from.map_or_else(beginning_of_time, |at| at.naive_utc()),
            watermark: None,
            last_full_scan: Instant::now(),
            newest_mark: None,
        }
    }

    /// The oldest `created_at` an expansion of the newest events looks at:
    /// the previous one's time or the previous scan's, whichever is later,
    /// less [`UNNAMED_LOOKBACK`], never before `start_from`. None before
    /// the first scan, which the expansion is then left to.
    pub(super) fn newest_since(&self) -> Option<NaiveDateTime> {
        let mark = self.newest_mark.max(self.watermark)?;
        let lookback =
            chrono::Duration::from_std(UNNAMED_LOOKBACK).unwrap_or(chrono::Duration::MAX);
        Some(
            mark.checked_sub_signed(lookback)
                .map_or(self.start_from, |since| since.max(self.start_from)),
        )
    }

    /// The oldest `created_at` a scan looks at: for a recent scan, the
    /// previous scan's time less `lookback`; for a full one (or a recent one
    /// with no previous scan), `start_from`; never before `start_from`.
    pub(super) fn since(&self, scan: Scan, lookback: Duration) -> Option<NaiveDateTime> {
        match (scan, self.watermark) {
            (Scan::None, _) => None,
            (Scan::Newest | Scan::Recent, Some(mark)) => {
                let lookback = if scan == Scan::Newest {
                    lookback.min(NEWEST_LOOKBACK)
                } else {
                    lookback
                };
                let lookback =
                    chrono::Duration::from_std(lookback).unwrap_or(chrono::Duration::MAX);
                Some(
                    mark.checked_sub_signed(lookback)
                        .map_or(self.start_from, |since| since.max(self.start_from)),
                )
            }
            (Scan::Newest | Scan::Recent, None) | (Scan::Full, _) => Some(self.start_from),
        }
    }

    /// A scan from `since` succeeded at database time `at`.
    pub(super) fn scanned(&mut self, since: NaiveDateTime, at: NaiveDateTime) {
        self.watermark = Some(at);
        if since == self.start_from {
            self.last_full_scan = Instant::now();
        }
    }
}

/// How a claim round ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ClaimRound {
    /// Everything due was claimed.
    Idle,
    /// Rows may be waiting for a slot (all slots busy, or a subscriber at
    /// its limit): claim again when one frees.
    WaitingForRoom,
    /// The claim failed.
    Failed,
}

impl ClaimRound {
    /// Folds this round's end into the run loop's state.
    pub(super) fn record(self, waiting_for_room: &mut bool, failed: &mut bool) {
        match self {
            Self::Idle => *waiting_for_room = false,
            Self::WaitingForRoom => *waiting_for_room = true,
            Self::Failed => *failed = true,
        }
    }
}

/// The lower bound of a scan without `start_from`: before any event.
fn beginning_of_time() -> NaiveDateTime {
    NaiveDate::from_ymd_opt(1, 1, 1)
        .and_then(|date| date.and_hms_opt(0, 0, 0))
        .unwrap_or_else(|| unreachable!("1 January of year 1 is a date"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scans_look_back_from_the_previous_one_never_before_start_from() {
        let start = DateTime::<Utc>::from_timestamp(1_000_000, 0).expect("a time");
        let mut expansion = Expansion::new(Some(start));
        let lookback = Duration::from_secs(60);
        let start = start.naive_utc();
        assert_eq!(expansion.since(Scan::None, lookback), None);
        assert_eq!(
            expansion.since(Scan::Recent, lookback),
            Some(start),
            "no scan yet"
        );
        let later = start + chrono::Duration::hours(1);
        expansion.scanned(start, later);
        assert_eq!(
            expansion.since(Scan::Recent, lookback),
            Some(later - chrono::Duration::seconds(60))
        );
        assert_eq!(expansion.since(Scan::Full, lookback), Some(start));
        // A lookback reaching before the cutoff stops at it.
        assert_eq!(
            expansion.since(Scan::Recent, Duration::from_secs(7200)),
            Some(start)
        );
        assert_eq!(
            Expansion::new(None).since(Scan::Full, lookback),
            Some(beginning_of_time())
        );
    }

    #[test]
    fn the_newest_events_are_looked_at_from_the_later_of_the_last_scan_and_expansion() {
        let start = DateTime::<Utc>::from_timestamp(1_000_000, 0).expect("a time");
        let mut expansion = Expansion::new(Some(start));
        let start = start.naive_utc();
        assert_eq!(expansion.newest_since(), None, "no scan to start from");
        let scanned = start + chrono::Duration::hours(1);
        expansion.scanned(start, scanned);
        let lookback = chrono::Duration::from_std(UNNAMED_LOOKBACK).expect("short");
        assert_eq!(expansion.newest_since(), Some(scanned - lookback));
        let expanded = scanned + chrono::Duration::seconds(5);
        expansion.newest_mark = Some(expanded);
        assert_eq!(expansion.newest_since(), Some(expanded - lookback));
        let rescanned = expanded + chrono::Duration::seconds(5);
        expansion.scanned(scanned, rescanned);
        assert_eq!(expansion.newest_since(), Some(rescanned - lookback));
        // Never before the cutoff.
        let mut fresh = Expansion::new(Some(start.and_utc()));
        fresh.scanned(start, start);
        assert_eq!(fresh.newest_since(), Some(start));
    }
}

//! The in-flight limit of one endpoint, shared by both schedulers: it
//! grows while the endpoint answers quickly and without errors (doubling
//! each round until the first sign of trouble, then one more per round) and
//! shrinks
//! on timeouts, refused connections, `5xx` and `429`, and when its answers
//! slow down well past the fastest seen, between a floor and a cap. A
//! `Retry-After` the endpoint sends pauses it: no attempt starts until the
//! wait is over.

use std::time::{Duration, Instant};

use crate::attempt::{Answer, Attempted};

/// A limit before it has learnt anything of its endpoint.
pub const INITIAL_LIMIT: usize = 8;

/// Above the fastest answer seen, how much slower one may be and still
/// count as quick: loopback answers take microseconds, and a scheduler
/// hiccup must not read as an endpoint in trouble.
const SLOW_SLACK: Duration = Duration::from_millis(20);

/// How many times the fastest answer an answer may take before the endpoint
/// counts as slowing down.
const SLOW_FACTOR: u32 = 4;

/// The fastest answer is the least of this window and the one before: a
/// endpoint that got slower for good is learnt again within two windows.
const FASTEST_WINDOW: Duration = Duration::from_secs(10);

/// How the endpoint took an attempt, for its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// An answer that says nothing of load (a `2xx`, a `4xx` other than
    /// `429`), after `took`.
    Answered(Duration),
    /// A timeout, a refused or broken connection, a `5xx` or a `429`.
    Overloaded,
}

impl Reply {
    /// What an attempt that took `took` says of its endpoint's load; `None`
    /// when it failed for want of the hub's own resources, which says
    /// nothing of the endpoint.
    pub fn of(attempted: &Attempted, took: Duration) -> Option<Self> {
        match (&attempted.answer, attempted.status) {
            (Answer::Local(_), _) => None,
            (_, Some(status)) if status == 429 || status >= 500 => Some(Self::Overloaded),
            (_, Some(_)) => Some(Self::Answered(took)),
            (_, None) => Some(Self::Overloaded),
        }
    }
}

/// The in-flight limit of one endpoint: a slow start, then additive
/// increase, multiplicative decrease.
#[derive(Debug, Clone)]
pub struct Limit {
    value: f64,
    floor: f64,
    cap: f64,
    /// The fastest answer of this window, since `window_start`.
    fastest: Option<Duration>,
    /// The fastest answer of the window before.
    fastest_before: Option<Duration>,
    window_start: Instant,
    last_cut: Option<Instant>,
    /// Until the first cut, each quick answer adds a slot, as TCP's slow
    /// start does: growing by one per round would take a fan-out to a
    /// healthy host hundreds of answers to reach its cap, and the first
    /// tens of milliseconds of every fan-out would go at a fraction of the
    /// host's speed. The first sign of trouble ends it for good.
    slow_start: bool,
    /// No attempt starts before this (a `Retry-After`).
    paused_until: Option<Instant>,
}

impl Limit {
    pub fn new(floor: usize, cap: usize) -> Self {
        let cap = cap.max(1);
        let floor = floor.clamp(1, cap);
        Self {
            value: INITIAL_LIMIT.clamp(floor, cap) as f64,
            floor: floor as f64,
            cap: cap as f64,
            fastest: None,
            fastest_before: None,
            window_start: Instant::now(),
            last_cut: None,
            slow_start: true,
            paused_until: None,
        }
    }

    /// Pauses the endpoint for `wait` from `now` (a `Retry-After`); a pause
    /// already longer stands.
    pub fn pause(&mut self, wait: Duration, now: Instant) {
        let until = now + wait;
        self.paused_until = Some(self.paused_until.map_or(until, |at| at.max(until)));
    }

    /// How long the endpoint is still paused at `now`, if it is.
    pub fn paused_for(&self, now: Instant) -> Option<Duration> {
        self.paused_until
            .and_then(|until| until.checked_duration_since(now))
            .filter(|wait| !wait.is_zero())
    }

    /// Attempts in flight at most now.
    pub fn current(&self) -> usize {
        // The value stays within [floor, cap], both small integers.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let whole = self.value.floor() as usize;
        whole.max(1)
    }

    /// Whether it is worth keeping while its endpoint has nothing under
    /// way: it is paused at `now`, or below where it started (the endpoint
    /// has been failing or slowing down), so that the next attempt does not
    /// start afresh at full speed.
    pub fn is_worth_keeping(&self, now: Instant) -> bool {
        self.paused_for(now).is_some()
            || self.value < (INITIAL_LIMIT as f64).clamp(self.floor, self.cap)
    }

    /// Whether what it learnt still holds at `now`: it is worth keeping,
    /// or its fastest answer has not aged out of both windows. A lane
    /// that was idle for a moment (between two pages of a fan-out, say)
    /// goes on from here rather than from [`INITIAL_LIMIT`], measuring
    /// slowness against an answer it no longer remembers.
    pub fn still_holds(&self, now: Instant) -> bool {
        self.is_worth_keeping(now)
            || now.saturating_duration_since(self.window_start) < FASTEST_WINDOW * 2
    }

    pub fn observe(&mut self, reply: Reply, now: Instant) {
        match reply {
            Reply::Overloaded => self.cut(0.5, now),
            Reply::Answered(took) => {
                if now.saturating_duration_since(self.window_start) >= FASTEST_WINDOW {
                    self.fastest_before = self.fastest.take();
                    self.window_start = now;
                }
                self.fastest = Some(self.fastest.map_or(took, |fastest| fastest.min(took)));
                let fastest = self.fastest_before.map_or(took, |before| before.min(took));
                let fastest = self.fastest.map_or(fastest, |now| now.min(fastest));
                if took > fastest * SLOW_FACTOR + SLOW_SLACK {
                    self.cut(0.75, now);
                } else if self.slow_start {
                    self.value = (self.value + 1.0).min(self.cap);
                } else {
                    // One more slot per round of answers at this limit.
                    self.value = (self.value + 1.0 / self.value).min(self.cap);
                }
            }
        }
    }

    /// Lowers the limit by `factor`, at most once per round trip: the
    /// failures of one round of attempts are one signal, not many.
    fn cut(&mut self, factor: f64, now: Instant) {
        self.slow_start = false;
        let round = self
            .fastest
            .or(self.fastest_before)
            .unwrap_or(Duration::from_millis(50))
            .max(Duration::from_millis(50));
        if self
            .last_cut
            .is_some_and(|at| now.saturating_duration_since(at) < round)
        {
            return;
        }
        self.value = (self.value * factor).max(self.floor);
        self.last_cut = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_limit_learnt_holds_for_two_windows() {
        let start = Instant::now();
        let mut limit = Limit::new(1, 32);
        limit.observe(Reply::Answered(Duration::from_millis(2)), start);
        assert!(limit.still_holds(start + FASTEST_WINDOW));
        assert!(!limit.still_holds(start + FASTEST_WINDOW * 2 + Duration::from_secs(1)));
        // Below where it started, it is kept as long as it is.
        limit.observe(Reply::Overloaded, start);
        limit.observe(Reply::Overloaded, start + Duration::from_secs(1));
        assert!(limit.current() < INITIAL_LIMIT);
        assert!(limit.still_holds(start + FASTEST_WINDOW * 10));
    }

    #[test]
    fn the_limit_grows_while_quick_and_halves_on_overload() {
        let mut limit = Limit::new(1, 32);
        assert_eq!(limit.current(), INITIAL_LIMIT);
        let start = Instant::now();
        for _ in 0..2_000 {
            limit.observe(Reply::Answered(Duration::from_millis(1)), start);
        }
        assert_eq!(limit.current(), 32, "capped");
        limit.observe(Reply::Overloaded, start);
        assert_eq!(limit.current(), 16);
        limit.observe(Reply::Overloaded, start);
        assert_eq!(limit.current(), 16, "one cut per round trip");
        limit.observe(Reply::Overloaded, start + Duration::from_secs(1));
        assert_eq!(limit.current(), 8);
    }

    #[test]
    fn the_limit_shrinks_when_answers_slow_down_and_stops_at_the_floor() {
        let mut limit = Limit::new(2, 32);
        let mut now = Instant::now();
        limit.observe(Reply::Answered(Duration::from_millis(5)), now);
        for _ in 0..8 {
            now += Duration::from_millis(500);
            limit.observe(Reply::Answered(Duration::from_millis(500)), now);
        }
        assert_eq!(limit.current(), 2);
    }

    #[test]
    fn a_host_slower_for_good_is_learnt_again() {
        let mut limit = Limit::new(1, 32);
        let mut now = Instant::now();
        limit.observe(Reply::Answered(Duration::from_millis(5)), now);
        // Two windows of slow answers: the fast one is forgotten, and the
        // limit grows again at the new pace.
        for _ in 0..100 {
            now += Duration::from_millis(500);
            limit.observe(Reply::Answered(Duration::from_millis(500)), now);
        }
        assert!(limit.current() > 1, "{}", limit.current());
    }

    #[test]
    fn the_limit_doubles_each_round_until_the_first_cut_then_adds_one() {
        let mut limit = Limit::new(1, 64);
        let now = Instant::now();
        let quick = Reply::Answered(Duration::from_millis(1));
        for _ in 0..INITIAL_LIMIT {
            limit.observe(quick, now);
        }
        assert_eq!(limit.current(), 2 * INITIAL_LIMIT, "one round doubles");
        for _ in 0..48 {
            limit.observe(quick, now);
        }
        assert_eq!(limit.current(), 64, "capped");
        limit.observe(Reply::Overloaded, now);
        assert_eq!(limit.current(), 32);
        for _ in 0..34 {
            limit.observe(quick, now);
        }
        assert_eq!(limit.current(), 33, "after a cut, one more per round");
    }
}

//! The backlog's contract ([`Backlog`]), checked against both backends:
//! SQLite (a fresh file per test under the target's temporary directory)
//! and PostgreSQL (a fresh database per test on the server from
//! `websub_storetest::servers`: under `CI=true` a missing server fails the
//! test, elsewhere it skips with a printed reason).
//!
//! Every behaviour is one async check over `&dyn Backlog`, run for each
//! backend by `both!`. The backlog's tables come with the event log's
//! migrations, so each scratch opens the event log first. All times are
//! fixed timestamps handed in, so claims, retries and visibility timeouts
//! are decided by the arguments and never by the clock.
//!
//! Covered:
//! - topic fetches: one row per topic (duplicates collapse), claims that
//!   are not handed out twice until their visibility timeout lapses, done
//!   fetches leaving, validators kept, replaced, kept by `None` and
//!   forgotten by empty ones, the generation rule (a ping during a fetch
//!   leaves the row due at once with a fresh budget, whatever the outcome),
//!   retries, failures kept for operators and revived by a new ping,
//!   listings;
//! - verifications of intent: every field round-tripped (query strings,
//!   non-ASCII URLs), oldest claimed first, the admission bound (failed
//!   intents not counting), replacement of a waiting, failed or in-flight
//!   intent by a newer one for the same pair and what the older's outcome
//!   then does, retries and failures, listings by owner and state;
//! - `subscribing`, `purge_failed_before`;
//! - concurrent claimers, each with its own connection as replicas would
//!   have, never sharing a row and together taking all.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use sqlx::Connection;
use websub_hub::protocol::{Mode, SubscriptionRequest};
use websub_hub::storage::backlog::{
    Admission, Backlog, ClaimedFetch, FetchResult, FetchState, Intent, IntentResult, IntentState,
    Listing, Validators,
};
use websub_hub::storage::events::postgres::PostgresEventLog;
use websub_hub::storage::events::sqlite::SqliteEventLog;

/// Long enough that no claim in a check goes stale unless the check moves
/// its `now` past it.
const VISIBILITY: Duration = Duration::from_secs(30);

/// Large enough that only the admission check meets the bound.
const NO_BOUND: u64 = 1_000_000;

// ---------------------------------------------------------------------------
// Backends
// ---------------------------------------------------------------------------

/// Where a scratch backlog lives, to be removed once its check passed (a
/// failing check leaves it behind for inspection).
enum Place {
    Sqlite(PathBuf),
    Postgres { admin_url: String, database: String },
}

/// A fresh backlog of its own: no other test's rows can be claimed or
/// listed, which the checks about limits, ordering and draining rely on.
struct Scratch {
    url: String,
    backlog: Arc<dyn Backlog>,
    place: Place,
}

impl Scratch {
    async fn sqlite(name: &str) -> Self {
        let path = websub_storetest::scratch::path(&format!("backlog-{name}.db"));
        let url = format!("sqlite:{}", path.display());
        let events = SqliteEventLog::connect(&url)
            .await
            .expect("open the SQLite event log (its migrations make the backlog's tables)");
        events.pool().close().await;
        let backlog = websub_hub::storage::backlog::connect(&url)
            .await
            .expect("open the SQLite backlog");
        Self {
            url,
            backlog,
            place: Place::Sqlite(path),
        }
    }

    async fn postgres() -> Option<Self> {
        let admin_url = websub_storetest::servers::postgres_url().await?;
        let url = websub_storetest::servers::fresh_postgres_url().await?;
        let database = url
            .rsplit_once('/')
            .map(|(_, tail)| tail.split('?').next().unwrap_or(tail).to_owned())
            .expect("a database name in the fresh URL");
        let events = PostgresEventLog::connect(&url)
            .await
            .expect("open the PostgreSQL event log (its migrations make the backlog's tables)");
        events.pool().close().await;
        let backlog = websub_hub::storage::backlog::connect(&url)
            .await
            .expect("open the PostgreSQL backlog");
        Some(Self {
            url,
            backlog,
            place: Place::Postgres {
                admin_url,
                database,
            },
        })
    }

    async fn remove(self) {
        drop(self.backlog);
        match self.place {
            Place::Sqlite(path) => {
                for suffix in ["", "-wal", "-shm"] {
                    let mut path = path.clone().into_os_string();
                    path.push(suffix);
                    // Already gone is fine: the WAL files go with the last
                    // connection.
                    let _ = std::fs::remove_file(path);
                }
            }
            Place::Postgres {
                admin_url,
                database,
            } => {
                let mut admin = sqlx::PgConnection::connect(&admin_url)
                    .await
                    .expect("connect to the test PostgreSQL");
                // FORCE: the dropped pool's connections close in the
                // background, maybe not yet.
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE {database} WITH (FORCE)"
                )))
                .execute(&mut admin)
                .await
                .expect("drop the test database");
                let _ = admin.close().await;
            }
        }
    }
}

/// Runs a check `async fn(&dyn Backlog)` against both backends; with
/// `scratch`, a check `async fn(&Scratch)` that opens more connections.
macro_rules! both {
    ($check:ident) => {
        mod $check {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                let scratch = super::Scratch::sqlite(stringify!($check)).await;
                super::$check(&*scratch.backlog).await;
                scratch.remove().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                let Some(scratch) = super::Scratch::postgres().await else {
                    return;
                };
                super::$check(&*scratch.backlog).await;
                scratch.remove().await;
            }
        }
    };
    (scratch $check:ident) => {
        mod $check {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                let scratch = super::Scratch::sqlite(stringify!($check)).await;
                super::$check(&scratch).await;
                scratch.remove().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                let Some(scratch) = super::Scratch::postgres().await else {
                    return;
                };
                super::$check(&scratch).await;
                scratch.remove().await;
            }
        }
    };
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// `n` seconds after a fixed instant, with a microsecond part so that a
/// backend rounding to milliseconds or seconds would show.
fn at(n: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2030, 1, 2, 3, 4, 5)
        .single()
        .expect("a valid fixed time")
        + TimeDelta::microseconds(123_456)
        + TimeDelta::seconds(n)
}

fn visibility() -> TimeDelta {
    TimeDelta::from_std(VISIBILITY).expect("visibility in range")
}

fn topic(name: &str) -> String {
    // Non-ASCII and a double quote: topic lists travel as JSON on SQLite.
    format!("https://publisher.example/t\u{f6}pics/{name}?q=\"x\"")
}

fn callback(name: &str) -> String {
    format!("https://subscriber.example/callback/{name}?token=a%20b&name=Zo\u{eb}")
}

fn subscribe(topic: &str, callback: &str) -> SubscriptionRequest {
    SubscriptionRequest {
        mode: Mode::Subscribe,
        topic: topic.to_owned(),
        callback: callback.to_owned(),
        lease_seconds: Some(864_000),
        secret: Some("s3cr\u{e9}t".to_owned()),
        owner: Some("alice".to_owned()),
    }
}

fn unsubscribe(topic: &str, callback: &str) -> SubscriptionRequest {
    SubscriptionRequest {
        mode: Mode::Unsubscribe,
        topic: topic.to_owned(),
        callback: callback.to_owned(),
        lease_seconds: None,
        secret: None,
        owner: None,
    }
}

fn owned_by(owner: Option<&str>, request: SubscriptionRequest) -> SubscriptionRequest {
    SubscriptionRequest {
        owner: owner.map(str::to_owned),
        ..request
    }
}

async fn ping(backlog: &dyn Backlog, topics: &[String], now: DateTime<Utc>) {
    backlog
        .request_fetches(topics, now)
        .await
        .expect("request fetches");
}

/// Claims every due fetch at `now`, sorted by topic (a claim's order is
/// not part of the contract).
async fn claim_fetches(backlog: &dyn Backlog, now: DateTime<Utc>) -> Vec<ClaimedFetch> {
    let mut claimed = backlog
        .claim_fetches(100, now, VISIBILITY)
        .await
        .expect("claim fetches");
    claimed.sort_by(|a, b| a.topic.cmp(&b.topic));
    claimed
}

async fn claim_one_fetch(backlog: &dyn Backlog, now: DateTime<Utc>) -> ClaimedFetch {
    let mut claimed = claim_fetches(backlog, now).await;
    assert_eq!(claimed.len(), 1, "one fetch due at {now}: {claimed:?}");
    claimed.remove(0)
}

async fn finish_fetch(
    backlog: &dyn Backlog,
    fetch: &ClaimedFetch,
    result: FetchResult,
    now: DateTime<Utc>,
) {
    backlog
        .finish_fetch(fetch, result, now)
        .await
        .expect("finish a fetch");
}

fn done(validators: Option<Validators>) -> FetchResult {
    FetchResult::Done { validators }
}

async fn fetch_states(backlog: &dyn Backlog, failed: Option<bool>) -> Vec<FetchState> {
    backlog
        .fetches(
            Listing {
                failed,
                owner: None,
            },
            100,
        )
        .await
        .expect("list fetches")
}

async fn admit(backlog: &dyn Backlog, request: SubscriptionRequest, now: DateTime<Utc>) -> Intent {
    let intent = Intent::new(request, now);
    assert_eq!(
        backlog
            .request_intent(&intent, NO_BOUND)
            .await
            .expect("request an intent"),
        Admission::Accepted
    );
    intent
}

/// Claims every due intent at `now`, sorted by callback.
async fn claim_intents(backlog: &dyn Backlog, now: DateTime<Utc>) -> Vec<Intent> {
    let mut claimed = backlog
        .claim_intents(100, now, VISIBILITY)
        .await
        .expect("claim intents");
    claimed.sort_by(|a, b| {
        (&a.request.topic, &a.request.callback).cmp(&(&b.request.topic, &b.request.callback))
    });
    claimed
}

async fn claim_one_intent(backlog: &dyn Backlog, now: DateTime<Utc>) -> Intent {
    let mut claimed = claim_intents(backlog, now).await;
    assert_eq!(claimed.len(), 1, "one intent due at {now}: {claimed:?}");
    claimed.remove(0)
}

async fn finish_intent(backlog: &dyn Backlog, intent: &Intent, result: IntentResult) {
    backlog
        .finish_intent(intent, result)
        .await
        .expect("finish an intent");
}

async fn intent_states(backlog: &dyn Backlog, listing: Listing<'_>) -> Vec<IntentState> {
    backlog.intents(listing, 100).await.expect("list intents")
}

fn all() -> Listing<'static> {
    Listing::default()
}

fn failed(failed: bool) -> Listing<'static> {
    Listing {
        failed: Some(failed),
        owner: None,
    }
}

/// The state a just-admitted intent is listed with.
fn waiting_state(intent: &Intent) -> IntentState {
    IntentState {
        mode: intent.request.mode,
        topic: intent.request.topic.clone(),
        callback: intent.request.callback.clone(),
        owner: intent.request.owner.clone(),
        requested_at: intent.requested_at,
        attempts: 0,
        next_attempt_at: Some(intent.requested_at),
        last_error: None,
    }
}

async fn subscribing(backlog: &dyn Backlog, topic: &str) -> bool {
    backlog.subscribing(topic).await.expect("subscribing")
}

// ---------------------------------------------------------------------------
// Topic fetches
// ---------------------------------------------------------------------------

/// A request makes one row per topic, however often a topic is named; a
/// claimed row is not handed out again until its claim is older than the
/// visibility timeout, which is how a dead worker's fetch comes back.
async fn fetches_are_claimed_once_each_until_their_claim_goes_stale(backlog: &dyn Backlog) {
    let (a, b) = (topic("a"), topic("b"));
    ping(backlog, &[], at(0)).await;
    assert_eq!(fetch_states(backlog, None).await, vec![]);

    ping(
        backlog,
        &[a.clone(), b.clone(), a.clone(), b.clone()],
        at(0),
    )
    .await;
    let listed = fetch_states(backlog, None).await;
    assert_eq!(listed.len(), 2, "one row per topic: {listed:?}");
    for state in &listed {
        assert_eq!(state.requested_at, at(0));
        assert_eq!(state.attempts, 0);
        assert_eq!(state.next_attempt_at, Some(at(0)));
        assert_eq!(state.last_error, None);
    }

    // Not due before its ping.
    assert_eq!(claim_fetches(backlog, at(-1)).await, vec![]);

    let claimed = claim_fetches(backlog, at(0)).await;
    let topics: Vec<&str> = claimed.iter().map(|fetch| fetch.topic.as_str()).collect();
    assert_eq!(topics, vec![a.as_str(), b.as_str()]);
    for fetch in &claimed {
        assert_eq!(fetch.attempts, 0);
        assert_eq!(fetch.requested_at, at(0));
        assert_eq!(fetch.validators, Validators::default());
    }

    assert_eq!(claim_fetches(backlog, at(0)).await, vec![]);
    assert_eq!(
        claim_fetches(backlog, at(0) + visibility() - TimeDelta::seconds(1)).await,
        vec![]
    );

    let reclaimed = claim_fetches(backlog, at(0) + visibility() + TimeDelta::seconds(1)).await;
    assert_eq!(
        reclaimed, claimed,
        "a stale claim is claimed again, unchanged"
    );
}
both!(fetches_are_claimed_once_each_until_their_claim_goes_stale);

/// A claim takes at most `limit` rows; the rest stay for the next claim.
async fn fetch_claims_respect_their_limit(backlog: &dyn Backlog) {
    let topics: Vec<String> = (0..5).map(|i| topic(&format!("limit-{i}"))).collect();
    ping(backlog, &topics, at(0)).await;
    let first = backlog
        .claim_fetches(3, at(0), VISIBILITY)
        .await
        .expect("claim");
    let second = backlog
        .claim_fetches(3, at(0), VISIBILITY)
        .await
        .expect("claim");
    assert_eq!(first.len(), 3);
    assert_eq!(second.len(), 2);
    let seen: HashSet<String> = first
        .into_iter()
        .chain(second)
        .map(|fetch| fetch.topic)
        .collect();
    assert_eq!(seen, topics.into_iter().collect::<HashSet<_>>());
}
both!(fetch_claims_respect_their_limit);

/// A done fetch leaves the backlog and is not claimed again.
async fn a_done_fetch_leaves_the_backlog(backlog: &dyn Backlog) {
    let a = topic("done");
    ping(backlog, std::slice::from_ref(&a), at(0)).await;
    let fetch = claim_one_fetch(backlog, at(0)).await;
    finish_fetch(backlog, &fetch, done(None), at(1)).await;
    assert_eq!(fetch_states(backlog, None).await, vec![]);
    assert_eq!(
        claim_fetches(backlog, at(0) + visibility() * 10).await,
        vec![]
    );
}
both!(a_done_fetch_leaves_the_backlog);

/// Validators a fetch answered come with the topic's next claim: new ones
/// replace the old wholesale, `None` (no content answered) keeps them, and
/// empty ones forget them. They belong to their topic only.
async fn validators_are_kept_replaced_and_forgotten(backlog: &dyn Backlog) {
    let (a, other) = (topic("validators"), topic("validators-other"));
    let first = Validators {
        etag: Some("\"v1\"".to_owned()),
        last_modified: Some("Wed, 02 Jan 2030 03:04:05 GMT".to_owned()),
    };
    let second = Validators {
        etag: Some("W/\"v2\"".to_owned()),
        last_modified: None,
    };

    ping(backlog, std::slice::from_ref(&a), at(0)).await;
    let fetch = claim_one_fetch(backlog, at(0)).await;
    assert_eq!(fetch.validators, Validators::default());
    finish_fetch(backlog, &fetch, done(Some(first.clone())), at(1)).await;
    assert_eq!(fetch_states(backlog, None).await, vec![]);

    ping(backlog, &[a.clone(), other.clone()], at(2)).await;
    let claimed = claim_fetches(backlog, at(2)).await;
    assert_eq!(claimed.len(), 2);
    let (fetch, unrelated) = if claimed[0].topic == a {
        (&claimed[0], &claimed[1])
    } else {
        (&claimed[1], &claimed[0])
    };
    assert_eq!(fetch.validators, first);
    assert_eq!(unrelated.validators, Validators::default());
    finish_fetch(backlog, unrelated, done(None), at(3)).await;
    finish_fetch(backlog, fetch, done(None), at(3)).await;

    ping(backlog, std::slice::from_ref(&a), at(4)).await;
    let fetch = claim_one_fetch(backlog, at(4)).await;
    assert_eq!(fetch.validators, first, "Done with None keeps them");
    finish_fetch(backlog, &fetch, done(Some(second.clone())), at(5)).await;

    ping(backlog, std::slice::from_ref(&a), at(6)).await;
    let fetch = claim_one_fetch(backlog, at(6)).await;
    assert_eq!(fetch.validators, second, "new validators replace all");
    finish_fetch(backlog, &fetch, done(Some(Validators::default())), at(7)).await;

    ping(backlog, std::slice::from_ref(&a), at(8)).await;
    let fetch = claim_one_fetch(backlog, at(8)).await;
    assert_eq!(fetch.validators, Validators::default(), "empty ones forget");
}
both!(validators_are_kept_replaced_and_forgotten);

/// A ping during a fetch asks for content newer than what the fetch may
/// have read: the fetch's Done leaves the row due at once, fresh, rather
/// than deleting it.
async fn a_ping_during_a_fetch_leaves_it_due_after_done(backlog: &dyn Backlog) {
    let a = topic("overtaken-done");
    ping(backlog, std::slice::from_ref(&a), at(0)).await;
    let fetch = claim_one_fetch(backlog, at(0)).await;

    ping(backlog, std::slice::from_ref(&a), at(1)).await;
    // The ping does not undo the claim: one worker fetches a topic at a time.
    assert_eq!(claim_fetches(backlog, at(1)).await, vec![]);

    finish_fetch(backlog, &fetch, done(None), at(2)).await;
    let listed = fetch_states(backlog, None).await;
    assert_eq!(
        listed,
        vec![FetchState {
            topic: a.clone(),
            requested_at: at(1),
            attempts: 0,
            next_attempt_at: Some(at(2)),
            last_error: None,
        }]
    );

    let again = claim_one_fetch(backlog, at(2)).await;
    assert_eq!(again.topic, a);
    assert_eq!(again.attempts, 0);
    assert_eq!(again.requested_at, at(1));
    assert_ne!(again.generation, fetch.generation);

    finish_fetch(backlog, &again, done(None), at(3)).await;
    assert_eq!(fetch_states(backlog, None).await, vec![]);
}
both!(a_ping_during_a_fetch_leaves_it_due_after_done);

/// The generation rule holds for failures too: an overtaken claim's Retry
/// or Failed leaves the row due at once with a fresh budget, not at the
/// retry's time nor failed for good.
async fn a_ping_during_a_fetch_leaves_it_due_after_a_failure(backlog: &dyn Backlog) {
    let a = topic("overtaken-failure");
    ping(backlog, std::slice::from_ref(&a), at(0)).await;
    let fetch = claim_one_fetch(backlog, at(0)).await;
    finish_fetch(
        backlog,
        &fetch,
        FetchResult::Retry {
            at: at(60),
            error: "503".to_owned(),
        },
        at(1),
    )
    .await;
    let fetch = claim_one_fetch(backlog, at(60)).await;
    assert_eq!(fetch.attempts, 1);

    ping(backlog, std::slice::from_ref(&a), at(61)).await;
    finish_fetch(
        backlog,
        &fetch,
        FetchResult::Retry {
            at: at(3_600),
            error: "503 again".to_owned(),
        },
        at(62),
    )
    .await;
    let listed = fetch_states(backlog, None).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].attempts, 0, "a fresh budget: {listed:?}");
    assert_eq!(listed[0].next_attempt_at, Some(at(62)), "due at once");
    let fetch = claim_one_fetch(backlog, at(62)).await;
    assert_eq!(fetch.attempts, 0);
    assert_eq!(fetch.requested_at, at(61));

    ping(backlog, std::slice::from_ref(&a), at(63)).await;
    finish_fetch(
        backlog,
        &fetch,
        FetchResult::Failed {
            error: "gone".to_owned(),
        },
        at(64),
    )
    .await;
    assert_eq!(fetch_states(backlog, Some(true)).await, vec![]);
    let listed = fetch_states(backlog, Some(false)).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].attempts, 0);
    assert_eq!(listed[0].next_attempt_at, Some(at(64)));
    let fetch = claim_one_fetch(backlog, at(64)).await;
    assert_eq!(fetch.attempts, 0);
    assert_eq!(fetch.requested_at, at(63));
}
both!(a_ping_during_a_fetch_leaves_it_due_after_a_failure);

/// A retry counts an attempt, keeps its error for the listing and is due
/// at its time, not before.
async fn a_fetch_retry_waits_for_its_time(backlog: &dyn Backlog) {
    let a = topic("retry");
    ping(backlog, std::slice::from_ref(&a), at(0)).await;
    let fetch = claim_one_fetch(backlog, at(0)).await;
    finish_fetch(
        backlog,
        &fetch,
        FetchResult::Retry {
            at: at(60),
            error: "connection refused".to_owned(),
        },
        at(1),
    )
    .await;

    let expected = vec![FetchState {
        topic: a.clone(),
        requested_at: at(0),
        attempts: 1,
        next_attempt_at: Some(at(60)),
        last_error: Some("connection refused".to_owned()),
    }];
    assert_eq!(fetch_states(backlog, None).await, expected);
    assert_eq!(fetch_states(backlog, Some(false)).await, expected);
    assert_eq!(fetch_states(backlog, Some(true)).await, vec![]);

    assert_eq!(claim_fetches(backlog, at(59)).await, vec![]);
    let fetch = claim_one_fetch(backlog, at(60)).await;
    assert_eq!(fetch.attempts, 1);
    finish_fetch(
        backlog,
        &fetch,
        FetchResult::Retry {
            at: at(180),
            error: "timed out".to_owned(),
        },
        at(61),
    )
    .await;
    let listed = fetch_states(backlog, None).await;
    assert_eq!(listed[0].attempts, 2);
    assert_eq!(listed[0].next_attempt_at, Some(at(180)));
    assert_eq!(listed[0].last_error.as_deref(), Some("timed out"));
}
both!(a_fetch_retry_waits_for_its_time);

/// A fetch failed for good stays, listed as failed, and is never claimed;
/// a new ping for its topic makes it due again with a fresh budget.
async fn a_failed_fetch_is_kept_until_pinged_again(backlog: &dyn Backlog) {
    let (a, b) = (topic("failed"), topic("waiting"));
    ping(backlog, std::slice::from_ref(&a), at(0)).await;
    ping(backlog, std::slice::from_ref(&b), at(1)).await;
    let claimed = claim_fetches(backlog, at(1)).await;
    assert_eq!(claimed.len(), 2);
    for fetch in &claimed {
        let result = if fetch.topic == a {
            FetchResult::Failed {
                error: "410 Gone".to_owned(),
            }
        } else {
            FetchResult::Retry {
                at: at(120),
                error: "503".to_owned(),
            }
        };
        finish_fetch(backlog, fetch, result, at(2)).await;
    }

    let failed_state = FetchState {
        topic: a.clone(),
        requested_at: at(0),
        attempts: 1,
        next_attempt_at: None,
        last_error: Some("410 Gone".to_owned()),
    };
    assert_eq!(fetch_states(backlog, Some(true)).await, vec![failed_state]);
    let waiting = fetch_states(backlog, Some(false)).await;
    assert_eq!(waiting.len(), 1);
    assert_eq!(waiting[0].topic, b);
    let every: Vec<String> = fetch_states(backlog, None)
        .await
        .into_iter()
        .map(|state| state.topic)
        .collect();
    assert_eq!(
        every,
        vec![b.clone(), a.clone()],
        "most recently pinged first"
    );

    let much_later = at(0) + visibility() * 1_000;
    let claimed = claim_fetches(backlog, much_later).await;
    assert_eq!(claimed.len(), 1, "only the waiting one: {claimed:?}");
    assert_eq!(claimed[0].topic, b);

    ping(backlog, std::slice::from_ref(&a), much_later).await;
    let listed: Vec<FetchState> = fetch_states(backlog, Some(false))
        .await
        .into_iter()
        .filter(|state| state.topic == a)
        .collect();
    assert_eq!(listed.len(), 1, "revived: {listed:?}");
    assert_eq!(listed[0].attempts, 0);
    assert_eq!(listed[0].next_attempt_at, Some(much_later));
    let revived = claim_one_fetch(backlog, much_later).await;
    assert_eq!(revived.topic, a);
    assert_eq!(revived.attempts, 0);
    assert_eq!(revived.requested_at, much_later);
}
both!(a_failed_fetch_is_kept_until_pinged_again);

/// The fetch listing is newest first and stops at its limit.
async fn fetch_listing_is_newest_first_within_its_limit(backlog: &dyn Backlog) {
    for i in 0..5 {
        ping(backlog, &[topic(&format!("listing-{i}"))], at(i)).await;
    }
    let listed: Vec<String> = backlog
        .fetches(Listing::default(), 3)
        .await
        .expect("list")
        .into_iter()
        .map(|state| state.topic)
        .collect();
    assert_eq!(
        listed,
        vec![topic("listing-4"), topic("listing-3"), topic("listing-2")]
    );
}
both!(fetch_listing_is_newest_first_within_its_limit);

// ---------------------------------------------------------------------------
// Verifications of intent
// ---------------------------------------------------------------------------

/// A claimed intent is the one admitted, field for field: the verifier
/// sends the secret and lease from here, and compares the callback byte for
/// byte. A claim is not handed out twice until it goes stale.
async fn an_intent_round_trips_every_field(backlog: &dyn Backlog) {
    let sub = admit(
        backlog,
        subscribe(
            "https://publisher.example/\u{30cb}\u{30e5}\u{30fc}\u{30b9}/\u{fc}?lang=\u{65e5}&x=1",
            "https://subscriber.example/r\u{fc}ckruf?token=a%20b&n=\"Zo\u{eb}\"#frag",
        ),
        at(0),
    )
    .await;
    let unsub = admit(
        backlog,
        unsubscribe(&topic("round-trip"), &callback("round-trip")),
        at(1),
    )
    .await;

    assert_eq!(
        claim_intents(backlog, at(0) - TimeDelta::seconds(1)).await,
        vec![]
    );
    let mut claimed = claim_intents(backlog, at(1)).await;
    claimed.sort_by_key(|intent| intent.requested_at);
    assert_eq!(claimed, vec![sub.clone(), unsub.clone()]);

    assert_eq!(claim_intents(backlog, at(1)).await, vec![]);
    assert_eq!(
        claim_intents(backlog, at(0) + visibility() - TimeDelta::seconds(1)).await,
        vec![]
    );
    let mut reclaimed = claim_intents(backlog, at(1) + visibility() + TimeDelta::seconds(1)).await;
    reclaimed.sort_by_key(|intent| intent.requested_at);
    assert_eq!(
        reclaimed,
        vec![sub, unsub],
        "a stale claim comes back whole"
    );
}
both!(an_intent_round_trips_every_field);

/// Due intents are claimed oldest first, at most `limit` at a time.
async fn intents_are_claimed_oldest_first(backlog: &dyn Backlog) {
    let t = topic("oldest");
    let middle = admit(backlog, subscribe(&t, &callback("middle")), at(1)).await;
    let newest = admit(backlog, subscribe(&t, &callback("newest")), at(2)).await;
    let oldest = admit(backlog, subscribe(&t, &callback("oldest")), at(0)).await;
    for expected in [oldest, middle, newest] {
        let claimed = backlog
            .claim_intents(1, at(10), VISIBILITY)
            .await
            .expect("claim");
        assert_eq!(claimed, vec![expected]);
    }
    assert_eq!(claim_intents(backlog, at(10)).await, vec![]);
}
both!(intents_are_claimed_oldest_first);

/// Admission refuses a new pair once `bound` intents wait (claimed ones
/// included: they are not verified yet), writes nothing then, and does not
/// count intents failed for good.
async fn admission_is_bounded_by_waiting_intents(backlog: &dyn Backlog) {
    let t = topic("bound");
    for i in 0..3 {
        let intent = Intent::new(subscribe(&t, &callback(&format!("{i}"))), at(i));
        assert_eq!(
            backlog.request_intent(&intent, 3).await.expect("request"),
            Admission::Accepted
        );
    }
    let fourth = Intent::new(subscribe(&t, &callback("fourth")), at(3));
    assert_eq!(
        backlog.request_intent(&fourth, 3).await.expect("request"),
        Admission::Full { pending: 3 }
    );
    let listed = intent_states(backlog, all()).await;
    assert_eq!(listed.len(), 3);
    assert!(
        listed
            .iter()
            .all(|state| state.callback != fourth.request.callback),
        "a refused intent is not written: {listed:?}"
    );

    let claimed = claim_intents(backlog, at(3)).await;
    assert_eq!(claimed.len(), 3);
    assert_eq!(
        backlog.request_intent(&fourth, 3).await.expect("request"),
        Admission::Full { pending: 3 },
        "claimed intents still wait"
    );

    finish_intent(
        backlog,
        &claimed[0],
        IntentResult::Failed {
            error: "denied".to_owned(),
        },
    )
    .await;
    assert_eq!(
        backlog.request_intent(&fourth, 3).await.expect("request"),
        Admission::Accepted,
        "a failed intent does not count"
    );
    let fifth = Intent::new(subscribe(&t, &callback("fifth")), at(4));
    assert_eq!(
        backlog.request_intent(&fifth, 3).await.expect("request"),
        Admission::Full { pending: 3 }
    );
    assert_eq!(intent_states(backlog, all()).await.len(), 4);
}
both!(admission_is_bounded_by_waiting_intents);

/// A group is written in one call, in order: every field as a single
/// request writes it, the first up to the bound admitted and the rest
/// refused with the count, and a pair already waiting replaced.
async fn a_group_is_admitted_in_order_up_to_the_bound(backlog: &dyn Backlog) {
    let t = topic("group");
    let waiting = admit(backlog, subscribe(&t, &callback("waiting")), at(0)).await;
    let mut replacing = Intent::new(subscribe(&t, &callback("waiting")), at(1));
    replacing.request.secret = Some("a newer secret".to_owned());
    replacing.request.lease_seconds = Some(u64::MAX);
    replacing.request.owner = Some("owner of the group".to_owned());
    let mut group = vec![replacing.clone()];
    for i in 0..4 {
        group.push(Intent::new(
            unsubscribe(&t, &callback(&format!("g{i}"))),
            at(2 + i),
        ));
    }
    // One waits already; a bound of 4 leaves room for the first three of
    // the group (the replacement counted as new).
    let admissions = backlog
        .request_intents(&group, 4)
        .await
        .expect("request a group");
    assert_eq!(
        admissions,
        vec![
            Admission::Accepted,
            Admission::Accepted,
            Admission::Accepted,
            Admission::Full { pending: 3 },
            Admission::Full { pending: 3 },
        ]
    );
    let mut claimed = claim_intents(backlog, at(10)).await;
    claimed.sort_by_key(|intent| intent.requested_at);
    let mut stored_replacement = replacing.clone();
    stored_replacement.request.lease_seconds = Some(i64::MAX.unsigned_abs());
    assert_eq!(
        claimed,
        vec![stored_replacement, group[1].clone(), group[2].clone()],
        "the replacement took the waiting one's place ({waiting:?})"
    );
    assert_eq!(
        backlog
            .request_intents(&[], 4)
            .await
            .expect("an empty group"),
        vec![]
    );
}
both!(a_group_is_admitted_in_order_up_to_the_bound);

/// The count of waiting intents that admission reads follows every change
/// of a row: admitted, retried, failed for good, requested again after
/// failing, replaced while waiting, done.
async fn the_waiting_count_follows_every_change(backlog: &dyn Backlog) {
    async fn agrees(backlog: &dyn Backlog, expected: u64, after: &str) {
        let listed = intent_states(backlog, all()).await;
        let waiting = listed
            .iter()
            .filter(|state| state.next_attempt_at.is_some())
            .count();
        let counted = backlog.waiting().await.expect("waiting").verifications;
        assert_eq!(counted, expected, "after {after}: {listed:?}");
        assert_eq!(u64::try_from(waiting).ok(), Some(expected), "after {after}");
    }
    let t = topic("count");
    agrees(backlog, 0, "nothing").await;
    for i in 0..3 {
        admit(
            backlog,
            subscribe(&t, &callback(&format!("count-{i}"))),
            at(i),
        )
        .await;
    }
    agrees(backlog, 3, "three admitted").await;
    let claimed = claim_intents(backlog, at(3)).await;
    agrees(backlog, 3, "claimed").await;
    let retried = IntentResult::Retry {
        at: at(5),
        error: "timed out".to_owned(),
    };
    finish_intent(backlog, &claimed[0], retried).await;
    agrees(backlog, 3, "one retried").await;
    let failed = IntentResult::Failed {
        error: "denied".to_owned(),
    };
    finish_intent(backlog, &claimed[1], failed).await;
    agrees(backlog, 2, "one failed for good").await;
    admit(backlog, claimed[1].request.clone(), at(6)).await;
    agrees(backlog, 3, "the failed one requested again").await;
    admit(backlog, claimed[2].request.clone(), at(7)).await;
    agrees(backlog, 3, "a waiting one replaced").await;
    // Late enough that the replaced one's claim has gone stale too.
    let due = claim_intents(backlog, at(1000)).await;
    assert_eq!(due.len(), 3, "{due:?}");
    for intent in &due {
        finish_intent(backlog, intent, IntentResult::Done).await;
    }
    agrees(backlog, 0, "all done").await;
}
both!(the_waiting_count_follows_every_change);

/// A newer request for a waiting pair replaces it: one row, the newer's
/// fields, the newer's id when claimed.
async fn a_newer_request_replaces_a_waiting_intent(backlog: &dyn Backlog) {
    let (t, c) = (topic("replace-waiting"), callback("replace-waiting"));
    admit(backlog, subscribe(&t, &c), at(0)).await;
    let newer_request = SubscriptionRequest {
        lease_seconds: Some(60),
        secret: Some("another".to_owned()),
        owner: Some("bob".to_owned()),
        ..subscribe(&t, &c)
    };
    let newer = admit(backlog, newer_request, at(1)).await;
    assert_eq!(
        intent_states(backlog, all()).await,
        vec![waiting_state(&newer)]
    );
    assert_eq!(claim_intents(backlog, at(1)).await, vec![newer]);
}
both!(a_newer_request_replaces_a_waiting_intent);

/// A newer request for a failed pair replaces it with a fresh one: due,
/// no attempts, no error.
async fn a_newer_request_replaces_a_failed_intent(backlog: &dyn Backlog) {
    let (t, c) = (topic("replace-failed"), callback("replace-failed"));
    admit(backlog, subscribe(&t, &c), at(0)).await;
    let older = claim_one_intent(backlog, at(0)).await;
    finish_intent(
        backlog,
        &older,
        IntentResult::Failed {
            error: "challenge not echoed".to_owned(),
        },
    )
    .await;
    let newer = admit(backlog, unsubscribe(&t, &c), at(1)).await;
    assert_eq!(
        intent_states(backlog, all()).await,
        vec![waiting_state(&newer)]
    );
    assert_eq!(claim_intents(backlog, at(1)).await, vec![newer]);
}
both!(a_newer_request_replaces_a_failed_intent);

/// Replacing an intent in flight keeps its claim (one verification per
/// pair at a time); the older's Done then deletes nothing but releases the
/// newer, which is claimable at once as it was written.
async fn replacing_an_intent_in_flight_keeps_its_claim(backlog: &dyn Backlog) {
    let (t, c) = (topic("replace-in-flight"), callback("replace-in-flight"));
    admit(backlog, subscribe(&t, &c), at(0)).await;
    let older = claim_one_intent(backlog, at(0)).await;

    let newer = admit(backlog, unsubscribe(&t, &c), at(1)).await;
    assert_ne!(newer.id, older.id);
    assert_eq!(
        intent_states(backlog, all()).await,
        vec![waiting_state(&newer)]
    );
    assert_eq!(claim_intents(backlog, at(1)).await, vec![]);
    assert_eq!(
        claim_intents(backlog, at(0) + visibility() - TimeDelta::seconds(1)).await,
        vec![]
    );

    finish_intent(backlog, &older, IntentResult::Done).await;
    assert_eq!(
        intent_states(backlog, all()).await,
        vec![waiting_state(&newer)],
        "the older's Done must not delete the newer"
    );
    assert_eq!(claim_intents(backlog, at(2)).await, vec![newer.clone()]);

    finish_intent(backlog, &newer, IntentResult::Done).await;
    assert_eq!(intent_states(backlog, all()).await, vec![]);
}
both!(replacing_an_intent_in_flight_keeps_its_claim);

/// The older's Retry or Failed, once a newer request replaced it, only
/// releases the claim: the newer stays due as written, with no attempt
/// counted and no error.
async fn a_replaced_intent_s_failure_leaves_the_newer_as_written(backlog: &dyn Backlog) {
    let t = topic("replaced-failure");
    let outcomes = [
        (
            "failed",
            IntentResult::Failed {
                error: "refused".to_owned(),
            },
        ),
        (
            "retry",
            IntentResult::Retry {
                at: at(3_600),
                error: "timed out".to_owned(),
            },
        ),
    ];
    for (name, outcome) in outcomes {
        let c = callback(name);
        admit(backlog, subscribe(&t, &c), at(0)).await;
        let older = claim_one_intent(backlog, at(0)).await;
        let newer = admit(backlog, owned_by(Some("bob"), subscribe(&t, &c)), at(1)).await;

        finish_intent(backlog, &older, outcome).await;
        assert_eq!(
            intent_states(backlog, all()).await,
            vec![waiting_state(&newer)],
            "{name} of the replaced intent touched the newer"
        );
        assert_eq!(claim_intents(backlog, at(1)).await, vec![newer.clone()]);
        finish_intent(backlog, &newer, IntentResult::Done).await;
    }
    assert_eq!(intent_states(backlog, all()).await, vec![]);
}
both!(a_replaced_intent_s_failure_leaves_the_newer_as_written);

/// The current intent's Retry counts an attempt and waits for its time;
/// Failed counts one and keeps it for good, never claimed again.
async fn intent_retry_and_failure(backlog: &dyn Backlog) {
    let (t, c) = (topic("intent-retry"), callback("intent-retry"));
    let intent = admit(backlog, subscribe(&t, &c), at(0)).await;
    let claimed = claim_one_intent(backlog, at(0)).await;
    finish_intent(
        backlog,
        &claimed,
        IntentResult::Retry {
            at: at(60),
            error: "timed out".to_owned(),
        },
    )
    .await;
    let retrying = IntentState {
        attempts: 1,
        next_attempt_at: Some(at(60)),
        last_error: Some("timed out".to_owned()),
        ..waiting_state(&intent)
    };
    assert_eq!(intent_states(backlog, all()).await, vec![retrying.clone()]);
    assert_eq!(intent_states(backlog, failed(false)).await, vec![retrying]);
    assert_eq!(intent_states(backlog, failed(true)).await, vec![]);

    assert_eq!(claim_intents(backlog, at(59)).await, vec![]);
    let claimed = claim_one_intent(backlog, at(60)).await;
    assert_eq!(
        claimed,
        Intent {
            attempts: 1,
            ..intent.clone()
        }
    );
    finish_intent(
        backlog,
        &claimed,
        IntentResult::Failed {
            error: "404 from the callback".to_owned(),
        },
    )
    .await;
    let failed_state = IntentState {
        attempts: 2,
        next_attempt_at: None,
        last_error: Some("404 from the callback".to_owned()),
        ..waiting_state(&intent)
    };
    assert_eq!(
        intent_states(backlog, failed(true)).await,
        vec![failed_state]
    );
    assert_eq!(intent_states(backlog, failed(false)).await, vec![]);
    assert_eq!(
        claim_intents(backlog, at(0) + visibility() * 1_000).await,
        vec![]
    );
}
both!(intent_retry_and_failure);

/// Outcomes ended together are written together, each as it would be on
/// its own: done ones leave, a retry waits with its attempt counted, a
/// failure is kept, and a done one a newer request replaced only releases
/// its claim, the newer staying due as written.
async fn outcomes_are_finished_in_one_group(backlog: &dyn Backlog) {
    let t = topic("finished-together");
    for name in ["done-1", "done-2", "retry", "failed", "replaced"] {
        admit(backlog, subscribe(&t, &callback(name)), at(0)).await;
    }
    let claimed = claim_intents(backlog, at(0)).await;
    assert_eq!(claimed.len(), 5);
    let newer = admit(
        backlog,
        owned_by(Some("bob"), subscribe(&t, &callback("replaced"))),
        at(1),
    )
    .await;
    let by_callback = |name: &str| {
        claimed
            .iter()
            .find(|intent| intent.request.callback == callback(name))
            .expect("claimed")
            .clone()
    };
    let retry = IntentResult::Retry {
        at: at(60),
        error: "timed out".to_owned(),
    };
    let failure = IntentResult::Failed {
        error: "404 from the callback".to_owned(),
    };
    backlog
        .finish_intents(&[
            (by_callback("done-1"), IntentResult::Done),
            (by_callback("retry"), retry),
            (by_callback("replaced"), IntentResult::Done),
            (by_callback("failed"), failure),
            (by_callback("done-2"), IntentResult::Done),
        ])
        .await
        .expect("finish a group");
    backlog.finish_intents(&[]).await.expect("finish nothing");

    let mut states = intent_states(backlog, all()).await;
    states.sort_by(|a, b| a.callback.cmp(&b.callback));
    assert_eq!(
        states,
        vec![
            IntentState {
                attempts: 1,
                next_attempt_at: None,
                last_error: Some("404 from the callback".to_owned()),
                ..waiting_state(&by_callback("failed"))
            },
            waiting_state(&newer),
            IntentState {
                attempts: 1,
                next_attempt_at: Some(at(60)),
                last_error: Some("timed out".to_owned()),
                ..waiting_state(&by_callback("retry"))
            },
        ]
    );
    assert_eq!(claim_intents(backlog, at(1)).await, vec![newer]);
    assert_eq!(
        backlog.waiting().await.expect("waiting").verifications,
        2,
        "the newer and the retry wait"
    );
}
both!(outcomes_are_finished_in_one_group);

/// The intent listing filters by owner and by state, newest first, within
/// its limit.
async fn intent_listing_filters_by_owner_and_state(backlog: &dyn Backlog) {
    let t = topic("listing");
    let owners = [
        Some("alice"),
        Some("bob"),
        Some("alice"),
        Some("bob"),
        Some("alice"),
        None,
    ];
    let mut admitted = Vec::new();
    for (i, owner) in owners.into_iter().enumerate() {
        let n = i64::try_from(i).expect("small");
        let request = owned_by(owner, subscribe(&t, &callback(&format!("listing-{i}"))));
        admitted.push(admit(backlog, request, at(n)).await);
    }
    // Bob's newer one fails for good.
    let claimed = claim_intents(backlog, at(10)).await;
    let bobs = claimed
        .iter()
        .find(|intent| intent.id == admitted[3].id)
        .expect("bob's intent claimed");
    finish_intent(
        backlog,
        bobs,
        IntentResult::Failed {
            error: "denied".to_owned(),
        },
    )
    .await;

    let callbacks = |states: Vec<IntentState>| -> Vec<String> {
        states.into_iter().map(|state| state.callback).collect()
    };
    let nth = |indices: &[usize]| -> Vec<String> {
        indices
            .iter()
            .map(|&i| admitted[i].request.callback.clone())
            .collect()
    };

    assert_eq!(
        callbacks(intent_states(backlog, all()).await),
        nth(&[5, 4, 3, 2, 1, 0])
    );
    let alice = Listing {
        failed: None,
        owner: Some("alice"),
    };
    assert_eq!(
        callbacks(intent_states(backlog, alice).await),
        nth(&[4, 2, 0])
    );
    let bob_failed = Listing {
        failed: Some(true),
        owner: Some("bob"),
    };
    let listed = intent_states(backlog, bob_failed).await;
    assert_eq!(callbacks(listed.clone()), nth(&[3]));
    assert_eq!(listed[0].owner.as_deref(), Some("bob"));
    assert_eq!(listed[0].last_error.as_deref(), Some("denied"));
    let bob_waiting = Listing {
        failed: Some(false),
        owner: Some("bob"),
    };
    assert_eq!(
        callbacks(intent_states(backlog, bob_waiting).await),
        nth(&[1])
    );
    assert_eq!(
        callbacks(intent_states(backlog, failed(false)).await),
        nth(&[5, 4, 2, 1, 0])
    );
    let nobody = Listing {
        failed: None,
        owner: Some("carol"),
    };
    assert_eq!(intent_states(backlog, nobody).await, vec![]);
    assert_eq!(
        callbacks(backlog.intents(all(), 2).await.expect("list")),
        nth(&[5, 4])
    );
}
both!(intent_listing_filters_by_owner_and_state);

/// `subscribing` is true exactly while a subscribe to the topic waits
/// (claimed or retrying included), so a publish meanwhile is not dropped.
async fn subscribing_follows_waiting_subscribes(backlog: &dyn Backlog) {
    let (t, unsub_only, failing) = (
        topic("subscribing"),
        topic("unsubscribing"),
        topic("subscribe-failing"),
    );
    assert!(!subscribing(backlog, &t).await);

    admit(backlog, subscribe(&t, &callback("s")), at(0)).await;
    admit(backlog, unsubscribe(&unsub_only, &callback("u")), at(0)).await;
    admit(backlog, subscribe(&failing, &callback("f")), at(0)).await;
    assert!(subscribing(backlog, &t).await, "waiting");
    assert!(!subscribing(backlog, &unsub_only).await, "unsubscribe only");
    assert!(subscribing(backlog, &failing).await);
    assert!(!subscribing(backlog, &topic("nobody")).await);

    let claimed = claim_intents(backlog, at(0)).await;
    assert_eq!(claimed.len(), 3);
    assert!(subscribing(backlog, &t).await, "claimed");
    let find = |topic: &str| {
        claimed
            .iter()
            .find(|intent| intent.request.topic == topic)
            .expect("claimed")
            .clone()
    };

    let failing_intent = find(&failing);
    finish_intent(
        backlog,
        &failing_intent,
        // Within the visibility timeout, so the other claims stay held.
        IntentResult::Retry {
            at: at(10),
            error: "timed out".to_owned(),
        },
    )
    .await;
    assert!(subscribing(backlog, &failing).await, "retrying");
    let failing_intent = claim_one_intent(backlog, at(10)).await;
    finish_intent(
        backlog,
        &failing_intent,
        IntentResult::Failed {
            error: "denied".to_owned(),
        },
    )
    .await;
    assert!(!subscribing(backlog, &failing).await, "failed");

    finish_intent(backlog, &find(&t), IntentResult::Done).await;
    assert!(!subscribing(backlog, &t).await, "done");
}
both!(subscribing_follows_waiting_subscribes);

// ---------------------------------------------------------------------------
// Purge
// ---------------------------------------------------------------------------

/// Purging takes only rows failed for good from before the cutoff, fetches
/// and intents alike, and counts them; waiting rows stay however old.
async fn purge_removes_only_old_failures(backlog: &dyn Backlog) {
    let (old_failed, new_failed, old_waiting, old_retrying) = (
        topic("old-failed"),
        topic("new-failed"),
        topic("old-waiting"),
        topic("old-retrying"),
    );
    ping(backlog, &[old_failed.clone(), old_retrying.clone()], at(0)).await;
    ping(backlog, std::slice::from_ref(&new_failed), at(100)).await;
    for fetch in claim_fetches(backlog, at(100)).await {
        let result = if fetch.topic == old_retrying {
            FetchResult::Retry {
                at: at(1_000),
                error: "503".to_owned(),
            }
        } else {
            FetchResult::Failed {
                error: "410".to_owned(),
            }
        };
        finish_fetch(backlog, &fetch, result, at(101)).await;
    }
    ping(backlog, std::slice::from_ref(&old_waiting), at(0)).await;

    let t = topic("purge");
    admit(backlog, subscribe(&t, &callback("old-failed")), at(0)).await;
    admit(backlog, subscribe(&t, &callback("new-failed")), at(100)).await;
    for intent in claim_intents(backlog, at(100)).await {
        finish_intent(
            backlog,
            &intent,
            IntentResult::Failed {
                error: "denied".to_owned(),
            },
        )
        .await;
    }
    admit(backlog, subscribe(&t, &callback("old-waiting")), at(0)).await;

    assert_eq!(backlog.purge_failed_before(at(50)).await.expect("purge"), 2);
    let mut fetches: Vec<String> = fetch_states(backlog, None)
        .await
        .into_iter()
        .map(|state| state.topic)
        .collect();
    fetches.sort();
    let mut expected = vec![new_failed, old_waiting, old_retrying];
    expected.sort();
    assert_eq!(fetches, expected);
    let mut intents: Vec<String> = intent_states(backlog, all())
        .await
        .into_iter()
        .map(|state| state.callback)
        .collect();
    intents.sort();
    let mut expected = vec![callback("new-failed"), callback("old-waiting")];
    expected.sort();
    assert_eq!(intents, expected);

    assert_eq!(backlog.purge_failed_before(at(50)).await.expect("purge"), 0);
    assert_eq!(
        backlog.purge_failed_before(at(100)).await.expect("purge"),
        0,
        "the cutoff itself is not before the cutoff"
    );
    assert_eq!(
        backlog.purge_failed_before(at(101)).await.expect("purge"),
        2
    );
    assert_eq!(fetch_states(backlog, Some(true)).await, vec![]);
    assert_eq!(intent_states(backlog, failed(true)).await, vec![]);
    assert_eq!(fetch_states(backlog, Some(false)).await.len(), 2);
    assert_eq!(intent_states(backlog, failed(false)).await.len(), 1);
}
both!(purge_removes_only_old_failures);

// ---------------------------------------------------------------------------
// Concurrency
// ---------------------------------------------------------------------------

/// Claimers with connections of their own, as replicas have, claiming
/// fetches and intents in batches until nothing is due: no row goes to two
/// of them, and together they take all.
async fn concurrent_claimers_never_share_a_row(scratch: &Scratch) {
    const ROWS: usize = 200;
    const CLAIMERS: usize = 4;
    const BATCH: usize = 10;
    let backlog = &*scratch.backlog;
    let now = at(0);

    let topics: Vec<String> = (0..ROWS)
        .map(|i| topic(&format!("concurrent-{i}")))
        .collect();
    ping(backlog, &topics, now).await;
    let mut ids = HashSet::new();
    for i in 0..ROWS {
        let request = subscribe(&topic("concurrent"), &callback(&format!("concurrent-{i}")));
        ids.insert(admit(backlog, request, now).await.id);
    }

    let start = Arc::new(tokio::sync::Barrier::new(CLAIMERS));
    let claimers: Vec<_> = (0..CLAIMERS)
        .map(|_| {
            let url = scratch.url.clone();
            let start = start.clone();
            tokio::spawn(async move {
                let backlog = websub_hub::storage::backlog::connect(&url)
                    .await
                    .expect("open a claimer's backlog");
                start.wait().await;
                let (mut fetches, mut intents) = (Vec::new(), Vec::new());
                loop {
                    let (claimed_fetches, claimed_intents) = tokio::join!(
                        backlog.claim_fetches(BATCH, now, VISIBILITY),
                        backlog.claim_intents(BATCH, now, VISIBILITY),
                    );
                    let claimed_fetches = claimed_fetches.expect("claim fetches");
                    let claimed_intents = claimed_intents.expect("claim intents");
                    assert!(claimed_fetches.len() <= BATCH && claimed_intents.len() <= BATCH);
                    if claimed_fetches.is_empty() && claimed_intents.is_empty() {
                        break;
                    }
                    fetches.extend(claimed_fetches.into_iter().map(|fetch| fetch.topic));
                    intents.extend(claimed_intents.into_iter().map(|intent| intent.id));
                }
                (fetches, intents)
            })
        })
        .collect();

    let (mut seen_topics, mut seen_ids) = (HashSet::new(), HashSet::new());
    let mut per_claimer = Vec::new();
    for claimer in claimers {
        let (fetches, intents) = claimer.await.expect("a claimer panicked");
        per_claimer.push((fetches.len(), intents.len()));
        for fetch in fetches {
            assert!(seen_topics.insert(fetch.clone()), "{fetch} claimed twice");
        }
        for id in intents {
            assert!(seen_ids.insert(id), "intent {id} claimed twice");
        }
    }
    assert_eq!(
        seen_topics,
        topics.into_iter().collect::<HashSet<_>>(),
        "every fetch claimed ({per_claimer:?})"
    );
    assert_eq!(seen_ids, ids, "every intent claimed ({per_claimer:?})");
}
both!(scratch concurrent_claimers_never_share_a_row);

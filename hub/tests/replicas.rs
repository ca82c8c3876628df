//! The registry of replicas on a real PostgreSQL ([`Replicas`]): claims
//! record who holds them, a dead replica's claims (deliveries,
//! verifications, fetches) are handed back at once by a live one, and only
//! the dead one's; replicas taking over at once hand each claim back once;
//! a clean shutdown hands back its own; an event's expansion is one
//! replica's while it lives.
//!
//! Each check runs in a schema of its own (on the connections'
//! `search_path`), so no other test's dispatcher claims its rows, and no
//! other test's replicas are judged dead here.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use sqlx::postgres::PgPool;
use uuid::Uuid;
use websub_hub::protocol::{Mode, SubscriptionRequest};
use websub_hub::storage::backlog::Backlog;
use websub_hub::storage::backlog::postgres::PostgresBacklog;
use websub_hub::storage::events::postgres::PostgresEventLog;
use websub_hub::storage::events::{DeliveryQueue, EventIntake, ExpansionClaim, NewEvent};
use websub_hub::storage::replicas::{DEAD_AFTER, Replicas, TakenOver};

/// Long enough that no claim here goes stale by the visibility timeout.
const VISIBILITY: Duration = Duration::from_secs(60);

use crate::scratch;

/// A schema of its own, and the replicas on it.
struct Scratch {
    pool: PgPool,
    schema: scratch::PgSchema,
}

impl Scratch {
    async fn new() -> Option<Self> {
        let schema = scratch::PgSchema::new("replicas_test", 8).await?;
        Some(Self {
            pool: schema.pool.clone(),
            schema,
        })
    }

    /// A replica on this schema: its registry entry, event log and backlog,
    /// all under one id.
    async fn replica(&self) -> (Replicas, PostgresEventLog, PostgresBacklog) {
        let id = Uuid::now_v7();
        let replicas = Replicas::from_pool(self.pool.clone(), id);
        replicas.register().await.expect("register");
        (
            replicas,
            PostgresEventLog::from_pool(self.pool.clone()).with_replica(id),
            PostgresBacklog::from_pool(self.pool.clone()).with_replica(id),
        )
    }

    /// Makes `replica`'s last beat a minute old, as if it died then.
    async fn kill(&self, replica: &Replicas) {
        sqlx::query(
            "UPDATE websub_replicas SET beat_at = now() - interval '1 minute' WHERE id = $1",
        )
        .bind(replica.id())
        .execute(&self.pool)
        .await
        .expect("age the beat");
    }

    async fn registered(&self, replica: &Replicas) -> bool {
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM websub_replicas WHERE id = $1)")
            .bind(replica.id())
            .fetch_one(&self.pool)
            .await
            .expect("look up a replica")
    }

    async fn drop_schema(self) {
        self.schema.drop_schema().await;
    }
}

fn now() -> DateTime<Utc> {
    // Microseconds, as the database keeps them.
    websub_store::to_micros(Utc::now())
}

async fn fan_out(log: &PostgresEventLog, topic: &str, subscribers: &[String]) -> Uuid {
    let event = log
        .record(
            NewEvent {
                topic: topic.to_owned(),
                content_type: "text/plain".to_owned(),
                body: bytes::Bytes::from_static(b"x"),
                trace_context: None,
            },
            now(),
        )
        .await
        .expect("record");
    log.expand(event.id, subscribers, now())
        .await
        .expect("expand");
    event.id
}

fn subscribe(topic: &str, callback: &str) -> SubscriptionRequest {
    SubscriptionRequest {
        mode: Mode::Subscribe,
        topic: topic.to_owned(),
        callback: callback.to_owned(),
        lease_seconds: None,
        secret: None,
        owner: None,
    }
}

/// Claims of every kind held by `log`/`backlog`'s replica: two delivery
/// records claimed per lane, one written claimed by an expansion, one
/// verification and one fetch. Returns the subscribers of the deliveries.
async fn claim_some(log: &PostgresEventLog, backlog: &PostgresBacklog, host: &str) -> Vec<String> {
    let subscribers: Vec<String> = (0..2).map(|i| format!("http://{host}/cb/{i}")).collect();
    fan_out(log, &format!("http://{host}/topic"), &subscribers).await;
    let claimed = log
        .claim_lanes(&[(host, 10)], now(), VISIBILITY)
        .await
        .expect("claim a lane");
    assert_eq!(claimed.len(), 2);
    let event = log
        .record(
            NewEvent {
                topic: format!("http://{host}/other"),
                content_type: "text/plain".to_owned(),
                body: bytes::Bytes::from_static(b"y"),
                trace_context: None,
            },
            now(),
        )
        .await
        .expect("record");
    let written = format!("http://{host}/cb/written-claimed");
    let created = log
        .expand_claimed(event.id, &[written.as_str()], now())
        .await
        .expect("expand claimed");
    assert_eq!(created, vec![written.clone()]);

    backlog
        .request_fetches(&[format!("http://{host}/feed")], now(), None)
        .await
        .expect("request a fetch");
    assert_eq!(
        backlog
            .claim_fetches(10, now(), VISIBILITY)
            .await
            .expect("claim fetches")
            .len(),
        1
    );
    let intent = websub_hub::storage::backlog::Intent::new(
        subscribe(
            &format!("http://{host}/topic"),
            &format!("http://{host}/cb"),
        ),
        now(),
    );
    backlog
        .request_intent(&intent, 1_000)
        .await
        .expect("request a verification");
    assert_eq!(
        backlog
            .claim_intents(10, now(), VISIBILITY)
            .await
            .expect("claim intents")
            .len(),
        1
    );
    let mut all = subscribers;
    all.push(written);
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_replicas_claims_are_handed_back_at_once_and_only_its_own() {
    let Some(scratch) = Scratch::new().await else {
        return;
    };
    let (a, a_log, a_backlog) = scratch.replica().await;
    let (b, b_log, b_backlog) = scratch.replica().await;
    let a_held = claim_some(&a_log, &a_backlog, "a.example:80").await;
    let b_held = claim_some(&b_log, &b_backlog, "b.example:80").await;

    // Nobody is dead yet: nothing moves.
    assert_eq!(b.take_over(DEAD_AFTER).await.expect("take over"), vec![]);
    assert!(
        b_log
            .claim_lanes(&[("a.example:80", 10)], now(), VISIBILITY)
            .await
            .expect("claim")
            .is_empty(),
        "a live replica's claims stay with it"
    );

    scratch.kill(&a).await;
    let taken = b.take_over(DEAD_AFTER).await.expect("take over");
    assert_eq!(
        taken,
        vec![TakenOver {
            replica: a.id(),
            deliveries: 3,
            verifications: 1,
            fetches: 1,
            expansions: 0,
        }]
    );
    assert!(!scratch.registered(&a).await, "the dead one's row is gone");
    assert!(scratch.registered(&b).await);

    // Claimable at once, well inside the visibility timeout, by B.
    let mut again: Vec<String> = b_log
        .claim_lanes(&[("a.example:80", 10)], now(), VISIBILITY)
        .await
        .expect("claim the dead one's lane")
        .into_iter()
        .map(|claimed| claimed.subscriber)
        .collect();
    again.sort();
    let mut expected = a_held.clone();
    expected.sort();
    assert_eq!(again, expected);
    assert_eq!(
        b_backlog
            .claim_fetches(10, now(), VISIBILITY)
            .await
            .expect("claim fetches")
            .len(),
        1
    );
    assert_eq!(
        b_backlog
            .claim_intents(10, now(), VISIBILITY)
            .await
            .expect("claim intents")
            .len(),
        1
    );
    // B's own claims were never touched: nothing of B's lane is claimable.
    assert!(
        b_log
            .claim_lanes(&[("b.example:80", 10)], now(), VISIBILITY)
            .await
            .expect("claim")
            .is_empty()
    );

    // Taken over once: a second takeover finds nobody dead.
    assert_eq!(b.take_over(DEAD_AFTER).await.expect("again"), vec![]);

    // A was only stalled: its next beat registers it again.
    assert!(a.beat().await.expect("beat"), "registered again");
    assert!(!a.beat().await.expect("beat"), "and then just beats");

    // B leaves cleanly: its own claims (its three records, now also A's
    // three, a fetch and a verification of each) are handed back.
    let released = b.deregister().await.expect("deregister");
    assert_eq!(released, 3 + 3 + 2 + 2);
    assert!(!scratch.registered(&b).await);
    assert_eq!(
        a_log
            .claim_lanes(
                &[("a.example:80", 10), ("b.example:80", 10)],
                now(),
                VISIBILITY
            )
            .await
            .expect("claim")
            .len(),
        a_held.len() + b_held.len()
    );
    scratch.drop_schema().await;
}

/// An expansion taken with no record written yet.
const FRESH: ExpansionClaim = ExpansionClaim::Taken { afresh: true };

async fn take(log: &PostgresEventLog, event: Uuid) -> ExpansionClaim {
    log.take_expansion(event).await.expect("take the expansion")
}

/// The ids of `log`'s unexpanded events, as its expander sees them.
async fn unexpanded(log: &PostgresEventLog) -> Vec<Uuid> {
    log.unexpanded(10)
        .await
        .expect("unexpanded")
        .into_iter()
        .map(|event| event.id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_expansion_is_one_replicas_while_it_lives() {
    let Some(scratch) = Scratch::new().await else {
        return;
    };
    let (a, a_log, _) = scratch.replica().await;
    let (b, b_log, _) = scratch.replica().await;
    let event = a_log
        .record(
            NewEvent {
                topic: "http://a.example/topic".to_owned(),
                content_type: "text/plain".to_owned(),
                body: bytes::Bytes::from_static(b"x"),
                trace_context: None,
            },
            now(),
        )
        .await
        .expect("record")
        .id;
    assert_eq!(unexpanded(&b_log).await, vec![event], "anyone's at first");

    // A takes it (and may take it again); B neither sees nor takes it.
    assert_eq!(take(&a_log, event).await, FRESH);
    assert_eq!(take(&a_log, event).await, FRESH, "again");
    assert_eq!(
        take(&b_log, event).await,
        ExpansionClaim::Elsewhere,
        "A's while A lives"
    );
    assert!(unexpanded(&b_log).await.is_empty());
    assert_eq!(unexpanded(&a_log).await, vec![event]);

    // A dies: B's takeover hands the expansion back, counted, and B takes it.
    scratch.kill(&a).await;
    assert_eq!(
        b.take_over(DEAD_AFTER).await.expect("take over"),
        vec![TakenOver {
            replica: a.id(),
            expansions: 1,
            ..TakenOver::default()
        }]
    );
    assert_eq!(unexpanded(&b_log).await, vec![event]);
    assert_eq!(take(&b_log, event).await, FRESH);

    // B leaves cleanly: the expansion is anyone's again.
    assert_eq!(b.deregister().await.expect("deregister"), 1);
    let (_c, c_log, _) = scratch.replica().await;
    assert_eq!(unexpanded(&c_log).await, vec![event]);
    assert_eq!(take(&c_log, event).await, FRESH);

    // A record written: taken up again, it is not afresh.
    c_log
        .expand_claimed(event, &["http://a.example/cb"], now())
        .await
        .expect("write a record");
    assert_eq!(
        take(&c_log, event).await,
        ExpansionClaim::Taken { afresh: false }
    );

    // Expanded, it is nobody's to take.
    c_log.expand(event, &[], now()).await.expect("expand");
    assert_eq!(take(&c_log, event).await, ExpansionClaim::Elsewhere);
    assert!(unexpanded(&c_log).await.is_empty());
    scratch.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_taking_over_at_once_hand_each_claim_back_once() {
    let Some(scratch) = Scratch::new().await else {
        return;
    };
    let (dead, dead_log, dead_backlog) = scratch.replica().await;
    let mut live = Vec::new();
    for _ in 0..4 {
        live.push(scratch.replica().await.0);
    }
    let subscribers: Vec<String> = (0..500)
        .map(|i| format!("http://c.example/cb/{i}"))
        .collect();
    fan_out(&dead_log, "http://c.example/topic", &subscribers).await;
    let claimed = dead_log
        .claim_lanes(&[("c.example", 1_000)], now(), VISIBILITY)
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 500);
    dead_backlog
        .request_fetches(&["http://c.example/feed".to_owned()], now(), None)
        .await
        .expect("request a fetch");
    dead_backlog
        .claim_fetches(1, now(), VISIBILITY)
        .await
        .expect("claim a fetch");
    scratch.kill(&dead).await;

    let takeovers = futures::future::join_all(
        live.iter()
            .map(|replica| async move { replica.take_over(DEAD_AFTER).await }),
    )
    .await;
    let taken: Vec<TakenOver> = takeovers
        .into_iter()
        .flat_map(|taken| taken.expect("take over"))
        .collect();
    assert_eq!(
        taken,
        vec![TakenOver {
            replica: dead.id(),
            deliveries: 500,
            verifications: 0,
            fetches: 1,
            expansions: 0,
        }],
        "one replica took over, once"
    );
    let pending: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM websub_deliveries WHERE processing_since IS NOT NULL",
    )
    .fetch_one(&scratch.pool)
    .await
    .expect("count claims");
    assert_eq!(pending, 0);
    for replica in &live {
        replica.deregister().await.expect("deregister");
    }
    scratch.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_is_dead_only_after_its_beats_stop_for_long_enough() {
    let Some(scratch) = Scratch::new().await else {
        return;
    };
    let (quiet, quiet_log, quiet_backlog) = scratch.replica().await;
    let (judge, ..) = scratch.replica().await;
    claim_some(&quiet_log, &quiet_backlog, "d.example:80").await;
    // A beat two seconds old: late, not dead.
    sqlx::query("UPDATE websub_replicas SET beat_at = now() - interval '2 seconds' WHERE id = $1")
        .bind(quiet.id())
        .execute(&scratch.pool)
        .await
        .expect("age the beat");
    assert_eq!(judge.take_over(DEAD_AFTER).await.expect("judge"), vec![]);
    assert!(scratch.registered(&quiet).await);
    // Past DEAD_AFTER (on the database's clock): dead.
    let past = TimeDelta::from_std(DEAD_AFTER).expect("a delta") + TimeDelta::seconds(1);
    sqlx::query("UPDATE websub_replicas SET beat_at = now() - $2 WHERE id = $1")
        .bind(quiet.id())
        .bind(past)
        .execute(&scratch.pool)
        .await
        .expect("age the beat");
    let taken = judge.take_over(DEAD_AFTER).await.expect("judge");
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].deliveries, 3);
    scratch.drop_schema().await;
}

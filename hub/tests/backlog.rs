//! The backlog's contract on both backends: the conformance suite
//! (`websub-logtest`) on SQLite (a fresh file per check under the target's
//! temporary directory) and PostgreSQL (a fresh database per check on the
//! server from `websub_storetest::servers`: under `CI=true` a missing
//! server fails the test, elsewhere it skips with a printed reason); then
//! claimers with connections of their own, as replicas have.
//!
//! The backlog's tables come with the event log's migrations, so each
//! scratch opens the event log first.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use sqlx::Connection;
use websub_hub::storage::backlog::Backlog;
use websub_hub::storage::events::postgres::PostgresEventLog;
use websub_hub::storage::events::sqlite::SqliteEventLog;
use websub_logtest::backlog::*;

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

/// A fresh SQLite backlog for one check of the suite.
struct SqliteBacklog(Scratch);

/// A fresh PostgreSQL backlog for one check of the suite.
struct PostgresBacklog(Scratch);

impl websub_logtest::Fresh for SqliteBacklog {
    type Log = dyn Backlog;

    async fn new(check: &str) -> Option<Self> {
        Some(Self(Scratch::sqlite(check).await))
    }

    fn log(&self) -> &Self::Log {
        &*self.0.backlog
    }

    async fn remove(self) {
        self.0.remove().await;
    }
}

impl websub_logtest::Fresh for PostgresBacklog {
    type Log = dyn Backlog;

    async fn new(_check: &str) -> Option<Self> {
        Scratch::postgres().await.map(Self)
    }

    fn log(&self) -> &Self::Log {
        &*self.0.backlog
    }

    async fn remove(self) {
        self.0.remove().await;
    }
}

mod sqlite {
    websub_logtest::backlog_suite!(super::SqliteBacklog);
}

mod postgres {
    websub_logtest::backlog_suite!(super::PostgresBacklog);
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claimers_sqlite() {
    let scratch = Scratch::sqlite("concurrent_claimers").await;
    concurrent_claimers_never_share_a_row(&scratch).await;
    scratch.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claimers_postgres() {
    let Some(scratch) = Scratch::postgres().await else {
        return;
    };
    concurrent_claimers_never_share_a_row(&scratch).await;
    scratch.remove().await;
}

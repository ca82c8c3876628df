//! The SQLite backend against real database files: the shared conformance
//! suite on one file shared by the whole test binary, plus what only several
//! pools on one file can show.
#![cfg(feature = "sqlite")]

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use tokio::task::JoinSet;
use websub_store::sqlite::SqliteStore;
use websub_store::{OwnerQuota, StoreError, Subscription, SubscriptionStore};

/// A path under the temp dir that no other test (or run) uses.
fn unique_path(name: &str) -> PathBuf {
    websub_storetest::scratch::path(&format!("store-{name}.sqlite"))
}

/// The file every check of the suite shares; the checks isolate themselves
/// with random topics and owners.
fn shared_path() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| unique_path("suite"))
}

fn url(path: &Path) -> String {
    format!("sqlite:{}", path.display())
}

async fn store_for_test() -> Option<Arc<dyn SubscriptionStore>> {
    Some(Arc::new(
        SqliteStore::connect(&url(shared_path()))
            .await
            .expect("open the suite's SQLite file"),
    ))
}

websub_storetest::suite!(store_for_test);

/// Two pools stand in for two processes on one file: their connections share
/// nothing but the file, so only `BEGIN IMMEDIATE` keeps 40 concurrent
/// conditional saves for one owner at the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conditional_saves_from_two_pools_respect_the_limit() {
    let path = unique_path("two-pools");
    let first = SqliteStore::connect(&url(&path)).await.expect("first pool");
    let second = SqliteStore::connect(&url(&path))
        .await
        .expect("second pool");
    let replicas = [first, second];
    let owner = "owner";
    let topic = "https://publisher.example/feed";
    let quota = OwnerQuota::new(5);
    let mut tasks = JoinSet::new();
    for i in 0..40 {
        let store = replicas[i % 2].clone();
        let quota = quota.clone();
        let subscription =
            Subscription::new(topic, format!("https://sub.example/{i}")).with_owner(owner);
        tasks.spawn(async move { store.save_within_limit(&subscription, &quota).await });
    }
    let (mut saved, mut refused) = (0, 0);
    for result in tasks.join_all().await {
        match result {
            Ok(()) => saved += 1,
            Err(StoreError::LimitReached { limit: 5, used: 5 }) => refused += 1,
            Err(other) => panic!("unexpected error from a conditional save: {other}"),
        }
    }
    assert_eq!((saved, refused), (5, 35));
    assert_eq!(replicas[1].count_by_owner(owner).await.expect("count"), 5);
    remove(&path);
}

/// A refused conditional save rolls back and releases the write lock: the
/// same connection pool can write again at once, and nothing was written.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_conditional_save_releases_the_write_lock() {
    let path = unique_path("refused");
    let store = SqliteStore::connect(&url(&path)).await.expect("connect");
    let other = SqliteStore::connect(&url(&path)).await.expect("connect");
    let quota = OwnerQuota::new(1);
    let first = Subscription::new("https://t.example/", "https://sub.example/1").with_owner("o");
    let second = Subscription::new("https://t.example/", "https://sub.example/2").with_owner("o");
    store
        .save_within_limit(&first, &quota)
        .await
        .expect("first");
    assert!(matches!(
        store.save_within_limit(&second, &quota).await,
        Err(StoreError::LimitReached { limit: 1, used: 1 })
    ));
    // Another pool's write would wait out the busy timeout if the refused
    // transaction still held the lock.
    tokio::time::timeout(
        std::time::Duration::from_secs(2),
        other.save(&Subscription::new(
            "https://t.example/",
            "https://sub.example/3",
        )),
    )
    .await
    .expect("the write lock is free")
    .expect("save");
    assert!(matches!(
        store
            .get("https://t.example/", "https://sub.example/2")
            .await,
        Err(StoreError::UnknownSubscription { .. })
    ));
    remove(&path);
}

/// `connect` creates a missing file from a plain path or a `sqlite:` URL, in
/// WAL mode with foreign keys on and a busy timeout of several seconds.
#[tokio::test(flavor = "multi_thread")]
async fn connect_creates_the_file_with_the_documented_settings() {
    for (path, target) in [
        (unique_path("plain"), None),
        (unique_path("url"), Some("url")),
    ] {
        let target = match target {
            Some(_) => url(&path),
            None => path.display().to_string(),
        };
        assert!(!path.exists());
        let store = SqliteStore::connect(&target).await.expect("connect");
        assert!(path.exists(), "{target} was not created");
        let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(store.pool())
            .await
            .expect("journal_mode");
        assert_eq!(journal, "wal");
        let foreign_keys: i64 = sqlx::query_scalar("PRAGMA foreign_keys")
            .fetch_one(store.pool())
            .await
            .expect("foreign_keys");
        assert_eq!(foreign_keys, 1);
        let busy_ms: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
            .fetch_one(store.pool())
            .await
            .expect("busy_timeout");
        assert!(busy_ms >= 3_000, "busy timeout of {busy_ms} ms");
        store.pool().close().await;
        remove(&path);
    }
}

/// Migrations are recorded in the store's own table, and running them again
/// changes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn migrations_are_idempotent_and_in_their_own_table() {
    let path = unique_path("migrate");
    let store = SqliteStore::connect(&url(&path)).await.expect("create");
    let applied = || async {
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM websub_store_migrations")
            .fetch_one(store.pool())
            .await
            .expect("the store's migrations table exists")
    };
    let before = applied().await;
    assert!(before >= 1);
    store.migrate().await.expect("second run");
    store.migrate().await.expect("third run");
    assert_eq!(applied().await, before);
    remove(&path);
}

/// Several processes starting on one new file at once all come up: the WAL
/// switch is waited out and the migrations run once. Repeated, because the
/// race it guards against is lost only now and then.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_connects_to_a_new_file_all_succeed() {
    for _ in 0..10 {
        let path = unique_path("race");
        let mut connects = JoinSet::new();
        for _ in 0..4 {
            let target = url(&path);
            connects.spawn(async move { SqliteStore::connect(&target).await });
        }
        let stores: Vec<SqliteStore> = connects
            .join_all()
            .await
            .into_iter()
            .map(|store| store.expect("connect"))
            .collect();
        let applied: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM websub_store_migrations")
            .fetch_one(stores[0].pool())
            .await
            .expect("migrations table");
        assert_eq!(applied, migration_files(), "every migration applied once");
        for store in &stores {
            store.pool().close().await;
        }
        remove(&path);
    }
}

/// A stored value outside what `Subscription` can hold reads back as
/// `Invalid`, not as a wrapped-around value.
#[tokio::test(flavor = "multi_thread")]
async fn an_out_of_range_timestamp_reads_back_as_invalid() {
    let path = unique_path("invalid");
    let store = SqliteStore::connect(&url(&path)).await.expect("connect");
    sqlx::query(
        "INSERT INTO websub_subscriptions (topic, callback, created_at, verified_at) \
         VALUES ('https://t.example/', 'https://sub.example/', ?1, 0)",
    )
    .bind(i64::MAX)
    .execute(store.pool())
    .await
    .expect("insert");
    assert!(matches!(
        store
            .get("https://t.example/", "https://sub.example/")
            .await,
        Err(StoreError::Invalid(_))
    ));
    remove(&path);
}

/// How many migrations the store ships.
fn migration_files() -> i64 {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations/sqlite/store");
    let count = std::fs::read_dir(dir)
        .expect("the migrations directory")
        .filter(|entry| {
            entry
                .as_ref()
                .is_ok_and(|entry| entry.path().extension().is_some_and(|ext| ext == "sql"))
        })
        .count();
    i64::try_from(count).expect("a small count")
}

/// Removes a test's database file and its WAL companions.
fn remove(path: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        let _ = std::fs::remove_file(file);
    }
}

/// A `before` with a sub-microsecond part still includes a subscription
/// expiring in the microsecond it falls in, since that expiry is strictly
/// earlier; truncating `before` would drop it.
#[tokio::test(flavor = "multi_thread")]
async fn list_expiring_with_a_sub_microsecond_bound() {
    let path = unique_path("sub-micro");
    let store = SqliteStore::connect(&url(&path)).await.expect("connect");
    let expires = chrono::DateTime::from_timestamp(1_900_000_000, 123_456_000).expect("valid");
    let mut subscription = Subscription::new("https://t.example/", "https://sub.example/");
    subscription.expires_at = Some(expires);
    subscription.lease_seconds = Some(1);
    store.save(&subscription).await.expect("save");
    let at = |nanos: i64| expires + chrono::Duration::nanoseconds(nanos);
    let count = |before| {
        let store = store.clone();
        async move { store.list_expiring(before).await.expect("list").len() }
    };
    assert_eq!(count(at(0)).await, 0);
    assert_eq!(count(at(-1)).await, 0);
    assert_eq!(count(at(1)).await, 1);
    assert_eq!(count(at(999)).await, 1);
    remove(&path);
}

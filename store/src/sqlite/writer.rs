//! The one write connection of a SQLite file in this process, shared by
//! everything that writes it: the subscription store, and the hub's event
//! log and backlog, which keep their tables in the same file by default.
//!
//! SQLite lets one connection write at a time, and a connection that finds
//! the lock taken sleeps in its busy handler, in steps of 1 to 100 ms,
//! before it looks again. Writers on separate connections of one process
//! would spend most of their time asleep while the lock stands free: a
//! verification's save, its intent's end and a delivery's outcome each
//! waited out another's sleep. Queued on one async lock instead, a write
//! starts the moment the one before it commits, and the connection's page
//! cache stays valid from one write to the next (a write by another
//! connection invalidates it). Other processes on the file still meet at
//! the file's lock, waiting up to [`super::BUSY_TIMEOUT`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock, Weak};

use sqlx::ConnectOptions;
use sqlx::query::Query;
use sqlx::sqlite::{
    Sqlite, SqliteArguments, SqliteConnectOptions, SqliteConnection, SqlitePool, SqliteRow,
};
use tokio::sync::{MappedMutexGuard, Mutex, MutexGuard, OnceCell};

/// The writers alive in this process, by file.
static WRITERS: LazyLock<std::sync::Mutex<HashMap<PathBuf, Weak<Writer>>>> =
    LazyLock::new(Default::default);

/// The write connection of one file; see the module doc.
#[derive(Debug)]
pub struct Writer {
    /// How the connection is opened, at the first write.
    options: Arc<SqliteConnectOptions>,
    connection: OnceCell<Mutex<Held>>,
}

#[derive(Debug)]
struct Held {
    connection: SqliteConnection,
    /// A script was sent and its end not seen: its caller went away before
    /// the `COMMIT` came back, so its transaction may still be open.
    unfinished: bool,
}

impl Writer {
    /// The writer of the file `pool` opens, shared with every other pool
    /// on that file in this process. Its connection is its own, opened at
    /// the first write with the options of the first pool to ask (the
    /// hub's stores all open the file with [`super::connect_options`]), and
    /// outlives the pools: closing one leaves the others writing. A private
    /// in-memory database (`:memory:`) is a database per connection and
    /// shares nothing.
    pub fn of(pool: &SqlitePool) -> Arc<Self> {
        let options = pool.connect_options();
        let file = options.get_filename();
        let private = || {
            Arc::new(Self {
                options: options.clone(),
                connection: OnceCell::new(),
            })
        };
        if file.as_os_str() == ":memory:" {
            return private();
        }
        let file = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_path_buf());
        let mut writers = WRITERS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(writer) = writers.get(&file).and_then(Weak::upgrade) {
            return writer;
        }
        writers.retain(|_, writer| writer.strong_count() > 0);
        let writer = private();
        writers.insert(file, Arc::downgrade(&writer));
        writer
    }

    /// The write connection, for one write, with what a script left
    /// unfinished rolled back: writes queue here, one at a time. A
    /// transaction begun on it and dropped unfinished is rolled back by
    /// sqlx before the connection's next statement.
    pub async fn lock(&self) -> Result<MappedMutexGuard<'_, SqliteConnection>, sqlx::Error> {
        let held = self.held().await?;
        Ok(MutexGuard::map(held, |held| &mut held.connection))
    }

    /// Runs `script` (statements between `BEGIN IMMEDIATE` and `COMMIT`) on
    /// the write connection in one round trip to sqlx's SQLite thread, and
    /// returns the rows its statements return. A statement that fails stops
    /// the script with its transaction open: it is rolled back here, or,
    /// when the caller goes away first, before the next write.
    pub async fn run_script(
        &self,
        script: Query<'_, Sqlite, SqliteArguments>,
    ) -> Result<Vec<SqliteRow>, sqlx::Error> {
        let mut held = self.held().await?;
        held.unfinished = true;
        let rows = script.fetch_all(&mut held.connection).await;
        if rows.is_err() {
            rollback(&mut held.connection).await;
        }
        held.unfinished = false;
        rows
    }

    async fn held(&self) -> Result<MutexGuard<'_, Held>, sqlx::Error> {
        let held = self
            .connection
            .get_or_try_init(|| async {
                Ok::<_, sqlx::Error>(Mutex::new(Held {
                    connection: self.options.connect().await?,
                    unfinished: false,
                }))
            })
            .await?;
        let mut held = held.lock().await;
        if held.unfinished {
            rollback(&mut held.connection).await;
            held.unfinished = false;
        }
        Ok(held)
    }
}

/// Ends a transaction a script left open. When there is none (the script
/// ended after all) SQLite says so, and there is nothing to do.
async fn rollback(connection: &mut SqliteConnection) {
    let _ = sqlx::raw_sql("ROLLBACK").execute(connection).await;
}

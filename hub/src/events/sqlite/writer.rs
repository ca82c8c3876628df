//! The SQLite event log's write connection: every write of the log queues
//! for it (see the log's module doc), and the delivery path's transactions
//! go to it as scripts, each in one round trip to sqlx's SQLite thread.

use sqlx::query::Query;
use sqlx::sqlite::{Sqlite, SqliteArguments, SqliteConnection, SqliteRow};
use tokio::sync::{MappedMutexGuard, Mutex, MutexGuard};

use super::{EventLogError, SqliteEventLog};

/// The write connection and what it may have been left with.
#[derive(Debug)]
pub(super) struct Writer {
    connection: SqliteConnection,
    /// A script was sent and its end not seen: its caller went away before
    /// the `COMMIT` came back, so its transaction may still be open.
    unfinished: bool,
}

impl SqliteEventLog {
    /// The write connection, for one write: the writes of this log queue
    /// here, one at a time.
    pub(super) async fn writer(
        &self,
    ) -> Result<MappedMutexGuard<'_, SqliteConnection>, EventLogError> {
        let writer = self.locked_writer().await?;
        Ok(MutexGuard::map(writer, |writer| &mut writer.connection))
    }

    /// The write connection, with what an unfinished script left rolled
    /// back.
    async fn locked_writer(&self) -> Result<MutexGuard<'_, Writer>, sqlx::Error> {
        let writer = self
            .writer
            .get_or_try_init(|| async {
                Ok::<_, sqlx::Error>(Mutex::new(Writer {
                    connection: self.pool.acquire().await?.detach(),
                    unfinished: false,
                }))
            })
            .await?;
        let mut writer = writer.lock().await;
        if writer.unfinished {
            rollback(&mut writer.connection).await;
            writer.unfinished = false;
        }
        Ok(writer)
    }

    /// Runs `script` (statements between `BEGIN IMMEDIATE` and `COMMIT`,
    /// [`super::statements::script`]) on the write connection in one round
    /// trip, and returns the rows its statements return. A statement that fails
    /// stops the script with its transaction open: it is rolled back here,
    /// or, when the caller goes away first, before the next write.
    pub(super) async fn run_script(
        &self,
        script: Query<'_, Sqlite, SqliteArguments>,
    ) -> Result<Vec<SqliteRow>, sqlx::Error> {
        let mut writer = self.locked_writer().await?;
        writer.unfinished = true;
        let rows = script.fetch_all(&mut writer.connection).await;
        if rows.is_err() {
            rollback(&mut writer.connection).await;
        }
        writer.unfinished = false;
        rows
    }
}

/// Ends a transaction a script left open. When there is none (the script
/// ended after all) SQLite says so, and there is nothing to do.
async fn rollback(connection: &mut SqliteConnection) {
    let _ = sqlx::raw_sql("ROLLBACK").execute(connection).await;
}

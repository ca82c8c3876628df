//! The SQLite event log's writes go through the file's one write connection
//! in this process ([`websub_store::sqlite::Writer`], shared with the
//! subscription store and the backlog), and the delivery path's
//! transactions go to it as scripts, each in one round trip to sqlx's
//! SQLite thread.

use sqlx::query::Query;
use sqlx::sqlite::{Sqlite, SqliteArguments, SqliteConnection, SqliteRow};
use tokio::sync::MappedMutexGuard;

use super::{EventLogError, SqliteEventLog};

impl SqliteEventLog {
    /// The write connection, for one write: the writes to the file queue
    /// here, one at a time.
    pub(super) async fn writer(
        &self,
    ) -> Result<MappedMutexGuard<'_, SqliteConnection>, EventLogError> {
        Ok(self.writer.lock().await?)
    }

    /// Runs `script` (statements between `BEGIN IMMEDIATE` and `COMMIT`,
    /// [`super::statements::script`]) on the write connection in one round
    /// trip; see [`websub_store::sqlite::Writer::run_script`].
    pub(super) async fn run_script(
        &self,
        script: Query<'_, Sqlite, SqliteArguments>,
    ) -> Result<Vec<SqliteRow>, sqlx::Error> {
        self.writer.run_script(script).await
    }
}

#[async_trait::async_trait]
impl super::SqlEventLog for SqliteEventLog {
    type Db = Sqlite;
    type Writer<'a> = MappedMutexGuard<'a, SqliteConnection>;

    const DUE_LANES: &'static str = super::statements::DUE_LANES;
    const RELEASE_ENDPOINT: &'static str = super::statements::RELEASE_ENDPOINT;
    const FAILED: &'static str = super::statements::FAILED;
    const RETRY_FAILED: &'static str = super::statements::RETRY_FAILED;
    const HEALTH: &'static str = super::statements::HEALTH;

    fn listing() -> &'static str {
        &super::operate::LISTING
    }

    fn activity_buckets() -> &'static str {
        &super::operate::ACTIVITY_BUCKETS
    }

    async fn redeliver_copy(
        &self,
        event_id: uuid::Uuid,
        subscribers: &[&str],
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Option<uuid::Uuid>, EventLogError> {
        let mut writer = self.writer().await?;
        super::operate::redeliver(&mut writer, event_id, subscribers, now).await
    }

    async fn replay_since(
        &self,
        topic: &str,
        subscriber: &str,
        since: chrono::DateTime<chrono::Utc>,
        limit: usize,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<super::super::Replayed, EventLogError> {
        let mut writer = self.writer().await?;
        super::operate::replay(&mut writer, topic, subscriber, since, limit, now).await
    }

    fn change_claim() -> &'static str {
        &super::changes::CLAIM
    }

    async fn append_rows(
        connection: &mut SqliteConnection,
        changes: &[super::super::NewChange],
    ) -> Result<(), EventLogError> {
        super::changes::append_rows(connection, changes).await
    }

    async fn tally_failures(
        &self,
        channel: &str,
        exhausted: &[super::super::Exhaustion<'_>],
        delivered: &[&str],
        disable_after: u32,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<String>, EventLogError> {
        let mut writer = self.writer().await?;
        super::operate::tally_endpoints(
            &mut writer,
            channel,
            exhausted,
            delivered,
            disable_after,
            now,
        )
        .await
    }

    async fn write_webhook_attempts(
        &self,
        attempts: &[super::super::WebhookAttempt<'_>],
    ) -> Result<(), EventLogError> {
        let mut writer = self.writer().await?;
        super::operate::keep_webhook_attempts(&mut writer, attempts).await
    }

    fn reads(&self) -> &sqlx::SqlitePool {
        &self.pool
    }

    async fn writer(&self) -> Result<Self::Writer<'_>, EventLogError> {
        SqliteEventLog::writer(self).await
    }
}

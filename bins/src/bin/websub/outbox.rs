//! The producer side of outbox feeds, straight in the producer's database:
//! `websub outbox-ddl` prints the DDL of a producer's outbox tables (names
//! configurable; optionally with an index on `created_at` for polling
//! scans), and the database form of `websub purge` deletes expired outbox
//! events on demand, e.g. from cron.

use std::time::Duration;

use websub_hub::delivery::outbox::{
    DEFAULT_DELIVERIES_TABLE, DEFAULT_OUTBOX_TABLE, OutboxError, OutboxTables, purge_expired,
};

/// Where a producer's outbox tables are.
#[derive(Debug, clap::Args)]
pub(crate) struct TableNames {
    /// The schema of both tables (the search path's when not given).
    #[arg(long)]
    pub(crate) schema: Option<String>,
    /// The outbox table's name.
    #[arg(long, default_value = DEFAULT_OUTBOX_TABLE)]
    pub(crate) outbox_table: String,
    /// The deliveries table's name.
    #[arg(long, default_value = DEFAULT_DELIVERIES_TABLE)]
    pub(crate) deliveries_table: String,
}

impl TableNames {
    pub(crate) fn resolve(&self) -> Result<OutboxTables, OutboxError> {
        let qualify = |table: &str| match &self.schema {
            Some(schema) => format!("{schema}.{table}"),
            None => table.to_owned(),
        };
        OutboxTables::new(qualify(&self.outbox_table), qualify(&self.deliveries_table))
    }
}

/// Deletes the events in `tables` older than `ttl`; how many.
pub(crate) async fn purge(
    database_url: &str,
    tables: &OutboxTables,
    ttl: Duration,
) -> Result<u64, String> {
    use sqlx::Connection;
    let mut connection = sqlx::PgConnection::connect(database_url)
        .await
        .map_err(|error| format!("cannot connect to the database: {error}"))?;
    let deleted = purge_expired(&mut connection, tables, ttl)
        .await
        .map_err(|error| error.to_string());
    let _ = connection.close().await;
    deleted
}

#[cfg(test)]
mod tests {
    use websub_hub::config::parse_duration;
    use websub_hub::delivery::outbox::ddl;

    use super::*;

    fn names(schema: Option<&str>, outbox: &str, deliveries: &str) -> TableNames {
        TableNames {
            schema: schema.map(str::to_owned),
            outbox_table: outbox.to_owned(),
            deliveries_table: deliveries.to_owned(),
        }
    }

    #[test]
    fn table_names_are_qualified_by_the_schema() {
        let tables = names(Some("shared"), "outbox", "outbox_deliveries")
            .resolve()
            .expect("valid");
        assert_eq!(tables.outbox(), "shared.outbox");
        assert_eq!(tables.deliveries(), "shared.outbox_deliveries");
        let plain = names(None, "events", "event_deliveries")
            .resolve()
            .expect("valid");
        assert_eq!(plain.outbox(), "events");
        assert!(names(Some("Bad Schema"), "outbox", "d").resolve().is_err());
        assert!(names(Some("s"), "x.outbox", "d").resolve().is_err());
    }

    /// The purge against a real database: the DDL's tables, one old event
    /// and one fresh.
    #[tokio::test]
    async fn purge_deletes_only_what_is_older() {
        let Some(url) = websub_storetest::servers::fresh_postgres_url().await else {
            return;
        };
        let tables = names(Some("shop"), "outbox", "outbox_deliveries")
            .resolve()
            .expect("valid");
        let pool = sqlx::PgPool::connect(&url).await.expect("connect");
        sqlx::raw_sql(sqlx::AssertSqlSafe(ddl(&tables)))
            .execute(&pool)
            .await
            .expect("the DDL runs");
        sqlx::raw_sql(
            "INSERT INTO shop.outbox (event_name, resource_type, resource_id, event_type, payload, created_at) \
             VALUES ('a', 'r', '1', 't', '{}', timezone('utc', now()) - interval '40 days'), \
                    ('b', 'r', '2', 't', '{}', timezone('utc', now()))",
        )
        .execute(&pool)
        .await
        .expect("events");
        let ttl = parse_duration("older-than", "30d").expect("duration");
        assert_eq!(purge(&url, &tables, ttl).await, Ok(1));
        assert_eq!(purge(&url, &tables, ttl).await, Ok(0));
        let left: Vec<String> = sqlx::query_scalar("SELECT event_name FROM shop.outbox")
            .fetch_all(&pool)
            .await
            .expect("read");
        assert_eq!(left, ["b"]);
        assert!(
            purge("postgres://127.0.0.1:1/none", &tables, ttl)
                .await
                .is_err()
        );
    }
}

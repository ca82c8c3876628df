//! Migrations embedded at compile time, as the build scripts list them (see
//! `migrations/embed.rs`): the one way this crate and the hub build the
//! migrators of their SQL schemas.

use sqlx::SqlSafeStr;
use sqlx::migrate::{Migration, MigrationType, Migrator};

/// A migration directory as the build script embeds it: the version, the
/// description and the SQL of each file, in order.
pub type Embedded = &'static [(i64, &'static str, &'static str)];

/// The migrator of `files`, keeping its history in `table`. A file that
/// starts with `-- no-transaction` runs outside a transaction, as sqlx's
/// own directories have it.
pub fn migrator(files: Embedded, table: &'static str) -> Migrator {
    let migrations = files
        .iter()
        .map(|&(version, description, sql)| {
            Migration::new(
                version,
                description.into(),
                MigrationType::Simple,
                sql.into_sql_str(),
                sql.starts_with("-- no-transaction"),
            )
        })
        .collect();
    let mut migrator = Migrator::with_migrations(migrations);
    migrator.dangerous_set_table_name(table);
    migrator
}

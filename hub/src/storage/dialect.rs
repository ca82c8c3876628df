//! Where the hub's two SQL databases part ways, named once for the code of
//! its own tables that is written for both: a time is microseconds since
//! the epoch on SQLite and a `TIMESTAMPTZ` on PostgreSQL, and a write
//! transaction begins `IMMEDIATE` on SQLite (the file's write lock taken at
//! `BEGIN`, where a stale read snapshot cannot fail it later) and `READ
//! COMMITTED` on PostgreSQL (each statement sees what committed before it,
//! whatever the server's default isolation).

use chrono::{DateTime, Utc};
use sqlx::{Decode, Encode, Postgres, Sqlite, Type};

/// A database the hub keeps its own tables in.
pub trait Dialect: sqlx::Database {
    /// A time as the database keeps it.
    type Time: Stored<Self> + Copy;

    /// The statement a write transaction begins with.
    const BEGIN_WRITE: &'static str;

    /// `at` as the database keeps it.
    fn time(at: DateTime<Utc>) -> Self::Time;

    /// A kept time read back; `None` when it is out of chrono's range.
    fn at(time: Self::Time) -> Option<DateTime<Utc>>;

    /// How many rows a statement changed.
    fn affected(done: &Self::QueryResult) -> u64;
}

/// A type that `Db` binds as a parameter and decodes from a column.
pub trait Stored<Db: sqlx::Database>:
    for<'q> Encode<'q, Db> + for<'r> Decode<'r, Db> + Type<Db> + Send + Sync
{
}

impl<Db: sqlx::Database, T> Stored<Db> for T where
    T: for<'q> Encode<'q, Db> + for<'r> Decode<'r, Db> + Type<Db> + Send + Sync
{
}

impl Dialect for Sqlite {
    type Time = i64;

    const BEGIN_WRITE: &'static str = "BEGIN IMMEDIATE";

    fn time(at: DateTime<Utc>) -> i64 {
        at.timestamp_micros()
    }

    fn at(micros: i64) -> Option<DateTime<Utc>> {
        DateTime::from_timestamp_micros(micros)
    }

    fn affected(done: &sqlx::sqlite::SqliteQueryResult) -> u64 {
        done.rows_affected()
    }
}

impl Dialect for Postgres {
    type Time = DateTime<Utc>;

    const BEGIN_WRITE: &'static str = "BEGIN ISOLATION LEVEL READ COMMITTED";

    fn time(at: DateTime<Utc>) -> DateTime<Utc> {
        at
    }

    fn at(time: DateTime<Utc>) -> Option<DateTime<Utc>> {
        Some(time)
    }

    fn affected(done: &sqlx::postgres::PgQueryResult) -> u64 {
        done.rows_affected()
    }
}

/// A count bound as a statement's parameter (a `LIMIT`, a window): SQL
/// integers are signed, and a count past `i64::MAX` means no bound.
pub(crate) fn bound(count: usize) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

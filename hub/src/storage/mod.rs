//! The hub's own tables, on SQLite or PostgreSQL (subscriptions are the
//! [`store`](crate::store) crate's):
//!
//! - [`events`]: the durable event log, the per-subscriber delivery records,
//!   the history of their attempts, endpoint state and retention;
//! - [`backlog`]: acknowledged work not yet done (pending topic fetches and
//!   verifications), durable before its answer, and the workers that claim
//!   it;
//! - [`replicas`]: the replicas sharing one PostgreSQL database, their
//!   heartbeats, and the takeover of a dead one's claims;
//! - [`dialect`]: where SQLite and PostgreSQL part ways, for the code of
//!   `events` and `backlog` written once for both.

pub mod backlog;
pub mod dialect;
pub mod events;
pub mod replicas;

/// The session settings of every connection to the hub's own PostgreSQL
/// tables, for the database at `url`. JIT compilation is off: the hub's
/// statements are short, and the planner's estimate for a generic plan of
/// one of them (the takeover of a dead replica's claims) crossed
/// `jit_above_cost`, so PostgreSQL spent some 100 to 180 ms compiling a
/// statement that runs in under a millisecond, at every start.
pub(crate) fn postgres_session(url: &str) -> Result<sqlx::postgres::PgConnectOptions, sqlx::Error> {
    use std::str::FromStr as _;
    Ok(sqlx::postgres::PgConnectOptions::from_str(url)?.options([("jit", "off")]))
}

pub(crate) use websub_delivery::state::bounded;

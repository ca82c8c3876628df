//! The hub's own tables, on SQLite or PostgreSQL (subscriptions are the
//! [`store`](crate::store) crate's):
//!
//! - [`events`]: the durable event log, the per-subscriber delivery records,
//!   the history of their attempts, endpoint state and retention;
//! - [`backlog`]: acknowledged work not yet done (pending topic fetches and
//!   verifications), durable before its answer, and the workers that claim
//!   it;
//! - [`replicas`]: the replicas sharing one PostgreSQL database, their
//!   heartbeats, and the takeover of a dead one's claims.

pub mod backlog;
pub mod events;
pub mod replicas;

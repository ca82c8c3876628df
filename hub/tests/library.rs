//! The library's integration tests, one binary for all of them (compiled
//! and linked once): the event log and backlog on both databases, the
//! outbox, authentication, the quota, replicas, the subscriber helpers and
//! verification.

mod common;
mod scratch;

mod auth;
mod backlog;
mod events;
mod outbox_bridge;
mod outbox_dispatch;
mod outbox_listener;
mod outbox_producer;
mod outbox_reload;
mod quota;
mod readiness;
mod replicas;
mod subscriber;
mod verification;

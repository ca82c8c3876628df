//! Every subscription store backend against the shared conformance suite
//! (`websub-storetest`), and each one's own checks. One binary for all of
//! them, compiled and linked once.

mod redis_layout;

mod memory;
mod postgres;
mod redis;
mod redis_cluster;
mod sqlite;

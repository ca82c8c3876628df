//! End to end against the real `websubd` (and `websub`) binaries: one test
//! binary, so that the hub's code and its dependencies' generics are
//! compiled and linked once for all of them. `postgres_restart` stops the
//! shared PostgreSQL server, so it is a binary of its own, run alone.

mod common;

mod admin;
mod admin_glance;
mod cloudevents;
mod denial;
mod faults;
mod feeds;
mod hosts;
mod keys;
mod lanes;
mod mtls;
mod observability;
mod operator_cli;
mod operator_events;
mod ordered;
mod ordered_webhooks;
mod otlp;
mod portal;
mod replicas;
mod routes;
mod signing;
mod subscriber;
mod systemd_unit;
mod tls;
mod traefik;
mod unsubscribe_race;
mod websubd;

//! The hub over HTTP: who may call what, the routes, the handlers and the
//! pages, and the connections they are served on.
//!
//! - [`routes`]: the route table with each route's policy (body limit,
//!   timeout, concurrency), and its export for Traefik;
//! - [`api`]: the handlers: the WebSub endpoint (`POST /`), the publish,
//!   subscriber and operator APIs, health and metrics;
//! - [`admin`]: the operator's admin page, server-rendered views over the
//!   same operations as the API;
//! - [`auth`]: user tokens and the internal API key;
//! - `connections`: the accept loop and the bounds on slow, idle and
//!   surplus clients.

pub mod admin;
pub mod api;
pub mod auth;
pub(crate) mod connections;
pub mod routes;

//! End to end against hubs running in the test process: the WebSub
//! protocol, the APIs and their OpenAPI document, the operator's steering,
//! races, slow clients and the router. One binary for all of them, compiled
//! and linked once.

mod backlog_api;
mod hub;
mod openapi;
mod operator;
mod publish_race;
mod quota;
mod router;
mod slow_clients;
mod steering;

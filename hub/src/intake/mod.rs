//! What the hub accepts and keeps until it is done: publishers' pings and
//! fat pings, topic fetches, subscription requests and their verification,
//! leases, the subscription quota, and the feeds that bring producers'
//! outbox events in.
//!
//! - [`publish`]: publish pings, topic fetches and fat pings, each an event
//!   of the log before its answer;
//! - [`verify`]: verification of intent, denials, and the subscription
//!   workflow that saves or deletes only after success;
//! - [`lease`]: lease clamping and the reaper of expired subscriptions;
//! - [`quota`]: total-quota enforcement against the subscriptions service;
//! - [`deny`]: the operator's deny list, as subscribe requests meet it;
//! - [`feed`]: the hub consuming a producer's outbox, bridged to WebSub
//!   topics and to webhooks.

pub mod deny;
pub mod feed;
pub mod lease;
pub mod publish;
pub mod quota;
pub mod verify;

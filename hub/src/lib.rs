//! websub-hub: a WebSub hub that is also the delivery end of a transactional
//! outbox.
//!
//! The subscription state lives behind [`websub_store::SubscriptionStore`];
//! this crate re-exports it so services depend on one crate.

pub use websub_store as store;

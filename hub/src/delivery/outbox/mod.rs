//! The transactional outbox in the hub: the dispatcher that delivers the
//! rows services write to in-process handlers and to webhooks, and the
//! bridge that turns them into hub events. The producer side (the tables,
//! [`Outbox`], the envelope) is the `websub-outbox` crate, re-exported
//! here, so `websub_hub::delivery::outbox::Outbox` is `websub_outbox::Outbox`.

pub mod cloudevents;
pub mod dispatcher;
mod listener;
mod rows;
mod sql;

pub use cloudevents::WebhookFormat;
pub use dispatcher::{
    Dispatcher, DispatcherConfig, DispatcherError, EventMatch, Handler, HandlerError,
    OUTBOX_BACKLOG, OUTBOX_LISTENER_CONNECTED, OUTBOX_OLDEST_UNDELIVERED_SECONDS,
    RegistrationError, ReloadError, WebhookDelivery, WebhookFilter, WebhookRegistrar,
    WebhookSignature, WebhookSubscriber,
};
pub use websub_outbox::*;

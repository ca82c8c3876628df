//! What the subscription workflow tells the WebSub scheduler's side: the
//! log a new subscription catches up from (the events published while it
//! was being verified), and the hook told of every unsubscribe answered.

use std::sync::Arc;

use crate::storage::events::DeliveryQueue;

/// Where a new subscription finds the events published while it was being
/// verified, and where an unsubscription drops those published after its
/// answer.
#[derive(Clone)]
pub struct CatchUp {
    pub(super) events: Arc<dyn DeliveryQueue>,
    pub(super) wake: Arc<dyn Fn() + Send + Sync>,
    pub(super) unsubscribed: Arc<UnsubscribedHook>,
}

/// Told `(topic, callback, Some(answered_at))` when an unsubscribe
/// verification was answered, `None` when the pair is subscribed again.
type UnsubscribedHook = dyn Fn(&str, &str, Option<chrono::DateTime<chrono::Utc>>) + Send + Sync;

impl CatchUp {
    /// Catch-up from `events`, calling `wake` (the WebSub scheduler's) when
    /// it wrote delivery records.
    pub fn new(events: Arc<dyn DeliveryQueue>, wake: impl Fn() + Send + Sync + 'static) -> Self {
        Self {
            events,
            wake: Arc::new(wake),
            unsubscribed: Arc::new(|_: &str, _: &str, _| {}),
        }
    }

    /// The same, telling `hook` (the WebSub scheduler's) of every
    /// unsubscribe answered, so that nothing it holds for the pair goes
    /// out, and of every subscription saved again.
    pub fn on_unsubscribe(
        self,
        hook: impl Fn(&str, &str, Option<chrono::DateTime<chrono::Utc>>) + Send + Sync + 'static,
    ) -> Self {
        Self {
            unsubscribed: Arc::new(hook),
            ..self
        }
    }
}

impl std::fmt::Debug for CatchUp {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("CatchUp")
    }
}

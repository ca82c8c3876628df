//! The WebSub bridge: the in-process outbox handler that records each
//! outbox event as a hub event on its topic, for the WebSub scheduler to
//! distribute.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use url::Url;

use super::TopicTemplate;
use crate::clock::{Clock, SystemClock};
use crate::delivery::outbox::{ENVELOPE_CONTENT_TYPE, Envelope};
use crate::delivery::outbox::{Handler, HandlerError};
use crate::storage::events::{EventIntake, NewEvent};

/// The handler that turns outbox events into hub events: it records the
/// envelope (`application/json`) on the event's topic in the hub's event
/// log, under the envelope's `event_id`, then wakes the hub's dispatcher,
/// which delivers it to the topic's WebSub subscribers with that id as
/// their event id.
///
/// The outbox hands an event over at least once: a call whose recording
/// committed but whose outbox row was not marked processed (a timeout, a
/// database outage, a crash in between) is made again. The recording is
/// [`EventIntake::record_once`](crate::storage::events::EventIntake::record_once), so the retry finds the event there and the
/// hub delivers it once.
#[derive(Clone)]
pub struct WebSubBridge {
    events: Arc<dyn EventIntake>,
    wake: Arc<dyn Fn() + Send + Sync>,
    public_url: Url,
    template: TopicTemplate,
    /// The runtime the event log's connections belong to, when the bridge
    /// runs on another (a feed's own).
    log_runtime: Option<tokio::runtime::Handle>,
}

impl std::fmt::Debug for WebSubBridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebSubBridge")
            .field("events", &self.events)
            .field("public_url", &self.public_url.as_str())
            .field("template", &self.template.as_str())
            .finish_non_exhaustive()
    }
}

impl WebSubBridge {
    /// A bridge recording into `events` and calling `wake` after each
    /// record (the WebSub scheduler's [`crate::delivery::websub::Distributor::wake`]).
    pub fn new(
        events: Arc<dyn EventIntake>,
        wake: Arc<dyn Fn() + Send + Sync>,
        public_url: Url,
        template: TopicTemplate,
    ) -> Self {
        Self {
            events,
            wake,
            public_url,
            template,
            log_runtime: None,
        }
    }

    /// Records on `runtime`, the one the event log's connections belong
    /// to, while the bridge itself is called on another.
    pub fn recording_on(mut self, runtime: tokio::runtime::Handle) -> Self {
        self.log_runtime = Some(runtime);
        self
    }

    /// The topic an envelope is recorded on.
    pub fn topic(&self, envelope: &Envelope) -> String {
        self.template.render(&self.public_url, envelope)
    }
}

#[async_trait]
impl Handler for WebSubBridge {
    async fn handle(&self, envelope: &Envelope) -> Result<(), HandlerError> {
        let event = NewEvent {
            topic: self.topic(envelope),
            content_type: ENVELOPE_CONTENT_TYPE.to_owned(),
            body: Bytes::from(envelope.to_json()),
            trace_context: crate::telemetry::traces::outbox_kept(envelope.event_id),
        };
        let id = envelope.event_id;
        let now = SystemClock.now();
        match &self.log_runtime {
            Some(runtime) => {
                // A call the outbox gives up on (its delivery timeout) drops
                // this wait, not the task: the recording may still commit,
                // even while the retry records the same id. Recorded once
                // by id, the two leave one event.
                let events = self.events.clone();
                runtime
                    .spawn(async move { events.record_once(id, event, now).await })
                    .await??;
            }
            None => {
                self.events.record_once(id, event, now).await?;
            }
        }
        (self.wake)();
        Ok(())
    }

    /// An envelope always fits the hub's event log: a failure is the log's
    /// database failing, and the event waits for it.
    fn retries_without_limit(&self) -> bool {
        true
    }
}

//! Subscription requests admitted in groups: the requests that arrive
//! while a write is under way are written together, in one statement (one
//! commit) of the backlog, and each caller is answered once its request is
//! durable. Under load a request costs a share of one write instead of a
//! write of its own; alone, it is written at once.
//!
//! Bounded: at most [`QUEUED`] requests wait for a group, past which
//! callers wait to join one; a group holds at most [`MOST_AT_ONCE`].

use std::collections::HashSet;
use std::sync::Arc;

use tokio::sync::{Notify, mpsc, oneshot};

use crate::backlog::{Admission, Backlog, BacklogError, Intent};

/// The most requests written in one statement.
const MOST_AT_ONCE: usize = 256;

/// The most requests waiting for a group.
const QUEUED: usize = 1024;

/// A request waiting for its group, and where its admission goes.
type Waiting = (Intent, oneshot::Sender<Result<Admission, BacklogError>>);

/// The way into the groups.
#[derive(Debug)]
pub(super) struct Admissions {
    sender: mpsc::Sender<Waiting>,
}

impl Admissions {
    /// Starts the writer of groups into `backlog`, admitting up to `bound`
    /// waiting verifications and telling `written` of every group that
    /// wrote something.
    pub(super) fn start(backlog: Arc<dyn Backlog>, bound: u64, written: Arc<Notify>) -> Self {
        let (sender, receiver) = mpsc::channel(QUEUED);
        tokio::spawn(write_groups(backlog, bound, written, receiver));
        Self { sender }
    }

    /// Writes `intent` with the group it arrives in; returns once that is
    /// durable.
    pub(super) async fn admit(&self, intent: Intent) -> Result<Admission, BacklogError> {
        let (answer, answered) = oneshot::channel();
        let stopped = || BacklogError::Invalid("the writer of admissions stopped".to_owned());
        self.sender
            .send((intent, answer))
            .await
            .map_err(|_| stopped())?;
        answered.await.map_err(|_| stopped())?
    }
}

async fn write_groups(
    backlog: Arc<dyn Backlog>,
    bound: u64,
    written: Arc<Notify>,
    mut receiver: mpsc::Receiver<Waiting>,
) {
    let mut arrived = Vec::with_capacity(MOST_AT_ONCE);
    while receiver.recv_many(&mut arrived, MOST_AT_ONCE).await > 0 {
        let mut rest = std::mem::take(&mut arrived);
        while !rest.is_empty() {
            // A group names a pair once: a second request for it goes with
            // the next group, so that it replaces the first.
            let mut pairs = HashSet::new();
            let end = rest
                .iter()
                .position(|(intent, _)| {
                    !pairs.insert((&intent.request.topic, &intent.request.callback))
                })
                .unwrap_or(rest.len());
            let later = rest.split_off(end);
            write_group(backlog.as_ref(), bound, &written, rest).await;
            rest = later;
        }
    }
}

async fn write_group(backlog: &dyn Backlog, bound: u64, written: &Notify, group: Vec<Waiting>) {
    let (intents, answers): (Vec<Intent>, Vec<_>) = group.into_iter().unzip();
    match backlog.request_intents(&intents, bound).await {
        Ok(admissions) => {
            if admissions.contains(&Admission::Accepted) {
                written.notify_one();
            }
            for (answer, admission) in answers.into_iter().zip(admissions) {
                let _ = answer.send(Ok(admission));
            }
        }
        Err(error) => {
            let error = Arc::new(error);
            for answer in answers {
                let _ = answer.send(Err(BacklogError::Group(error.clone())));
            }
        }
    }
}

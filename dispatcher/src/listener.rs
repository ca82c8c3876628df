//! The dispatcher's `LISTEN` connection: a connection of its own, apart from
//! the pool that polls, so that losing it never stops delivery — polling
//! carries on while it reconnects.
//!
//! Reconnection follows the delivery retry curve (immediate at first,
//! growing to `listener_max_backoff` over `listener_max_retries` failures)
//! and then keeps trying at that pace forever, so it recovers by itself when
//! the database comes back. A connection that dies soon after connecting
//! counts as a failure too, so a database that accepts and drops connections
//! is not hammered. After every (re)connection the dispatcher runs a
//! catch-up pass: notifications sent while nobody listened are lost.
//!
//! A connection closed by the server (a restart, `pg_terminate_backend`) is
//! noticed at once. One whose peer vanished silently (a partition) is
//! noticed by a `NOTIFY` the listener sends itself every ping interval
//! through the pool: when the previous one has not come back by the time the
//! next is due, the connection is given up. So is one that cannot be
//! checked at all, [`UNCHECKED_LIMIT`] checks in a row: the same partition
//! may have silenced the pool's connections too, and a listener nobody can
//! vouch for is worth a reconnection (and its catch-up pass) more than a
//! wait for the pool to heal.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPoolOptions};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use uuid::Uuid;

use crate::Dispatcher;
use crate::future::or_never;
use websub_delivery::RetryPolicy;

/// Payload prefix of the listener's own liveness checks; never an event id.
const PING_PREFIX: &str = "ping:";

/// Time allowed to open the connection and issue `LISTEN`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Liveness checks in a row that could not be sent before the connection
/// is given up as unverifiable.
pub(crate) const UNCHECKED_LIMIT: u32 = 3;

/// A connection that lived at least this long was healthy: its loss starts
/// the reconnection curve from the beginning (an immediate retry).
const HEALTHY_AFTER: Duration = Duration::from_secs(10);

/// Runs the listener until `shutdown`.
pub(crate) async fn listen(dispatcher: Dispatcher, shutdown: CancellationToken) {
    let config = dispatcher.config().clone();
    let mut failures: u32 = 0;
    loop {
        if failures > 0 {
            // The delivery curve, stretched over the listener's own settings;
            // past its retries the wait stays at the longest, forever.
            let curve = RetryPolicy {
                max_retries: config.listener_max_retries,
                max_backoff: config.listener_max_backoff,
            };
            let wait = curve.backoff(failures);
            debug!(failures, ?wait, "reconnecting the outbox listener");
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
        let connected = tokio::select! {
            () = shutdown.cancelled() => return,
            connected = tokio::time::timeout(CONNECT_TIMEOUT, connect(&dispatcher)) => connected,
        };
        let listener = match connected {
            Ok(Ok(listener)) => listener,
            Ok(Err(error)) => {
                failures = failures.saturating_add(1);
                warn!(%error, failures, "the outbox listener could not connect; polling carries on");
                continue;
            }
            Err(_) => {
                failures = failures.saturating_add(1);
                warn!(
                    failures,
                    "the outbox listener timed out connecting; polling carries on"
                );
                continue;
            }
        };
        if failures > 0 {
            info!(
                channel = dispatcher.channel(),
                "the outbox listener is back"
            );
        }
        let since = Instant::now();
        dispatcher.listener_connected(true);
        let lost = serve(&dispatcher, listener, &shutdown).await;
        dispatcher.listener_connected(false);
        let Some(reason) = lost else {
            return;
        };
        failures = if since.elapsed() >= HEALTHY_AFTER {
            1
        } else {
            failures.saturating_add(1)
        };
        warn!(%reason, "the outbox listener lost its connection; polling carries on");
    }
}

async fn connect(dispatcher: &Dispatcher) -> Result<PgListener, sqlx::Error> {
    // A pool of one connection, of its own: the listener must never wait
    // for (or take) a connection the dispatcher's queries need.
    let options = (*dispatcher.pool().connect_options()).clone();
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .idle_timeout(None)
        .max_lifetime(None)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_with(options)
        .await?;
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.ignore_pool_close_event(true);
    // A lost connection is reported, not silently replaced: reconnecting is
    // this module's job, with its backoff and its catch-up pass.
    listener.eager_reconnect(false);
    listener.listen(dispatcher.channel()).await?;
    Ok(listener)
}

/// Forwards notifications until the connection is lost (`Some(reason)`) or
/// `shutdown` (`None`).
async fn serve(
    dispatcher: &Dispatcher,
    mut listener: PgListener,
    shutdown: &CancellationToken,
) -> Option<String> {
    // Receiving runs in a task of its own, so that giving up on a silent
    // connection is dropping that task, never interrupting a read halfway.
    // It hands notifications to the dispatcher itself (one hop, however
    // many arrive) and marks the connection heard from.
    let heard = Arc::new(AtomicBool::new(false));
    let mut receiver = AbortOnDrop(tokio::spawn({
        let dispatcher = dispatcher.clone();
        let heard = heard.clone();
        async move {
            loop {
                match listener.try_recv().await {
                    Ok(Some(notification)) => {
                        heard.store(true, Ordering::Relaxed);
                        forward_notification(&dispatcher, notification.payload());
                    }
                    Ok(None) => return "the connection was closed".to_owned(),
                    Err(error) => return error.to_string(),
                }
            }
        }
    }));
    let interval = dispatcher.config().listener_ping_interval;
    let mut next_ping = Instant::now() + interval;
    // When the check sent and not heard back yet must have come back by.
    let mut unanswered: Option<Instant> = None;
    // A check being sent, off this loop so that a slow pool never delays
    // the notifications; it reports its token once sent.
    let mut sending: Option<oneshot::Receiver<()>> = None;
    // Checks in a row that could not be sent.
    let mut unchecked: u32 = 0;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return None,
            reason = &mut receiver.0 => {
                return Some(match reason {
                    Ok(reason) => reason,
                    Err(error) => format!("the receiving task failed: {error}"),
                });
            }
            sent = or_never(sending.as_mut()), if sending.is_some() => {
                sending = None;
                // Not sent (the pool failed or was too slow): there is
                // nothing to compare with, and the next check decides.
                // `heard` is left alone: the answer may have come already,
                // before this branch ran.
                if sent.is_ok() {
                    unchecked = 0;
                    unanswered = Some(Instant::now() + interval);
                } else {
                    unchecked += 1;
                    if unchecked >= UNCHECKED_LIMIT {
                        return Some(format!(
                            "{unchecked} liveness checks in a row could not be sent"
                        ));
                    }
                }
            }
            () = tokio::time::sleep_until(next_ping) => {
                next_ping = Instant::now() + interval;
                // Anything heard since the check was sent proves the
                // connection alive.
                if heard.swap(false, Ordering::Relaxed) {
                    unanswered = None;
                }
                match unanswered {
                    Some(deadline) if deadline <= Instant::now() => {
                        return Some(format!(
                            "no answer to a liveness check within {interval:?}"
                        ));
                    }
                    Some(_) => {}
                    None if sending.is_none() => {
                        // Only what is heard from now on answers this check.
                        heard.store(false, Ordering::Relaxed);
                        sending = Some(send_check(dispatcher, interval));
                    }
                    None => {}
                }
            }
        }
    }
}

fn forward_notification(dispatcher: &Dispatcher, payload: &str) {
    if !payload.starts_with(PING_PREFIX) {
        dispatcher.notified(payload);
    }
}

/// Sends a liveness check to the channel through the dispatcher's pool,
/// within `limit`; the receiver hears once it is sent.
fn send_check(dispatcher: &Dispatcher, limit: Duration) -> oneshot::Receiver<()> {
    let (report, sent) = oneshot::channel();
    let pool = dispatcher.pool().clone();
    let channel = dispatcher.channel().to_owned();
    tokio::spawn(async move {
        let token = format!("{PING_PREFIX}{}", Uuid::new_v4());
        let send = websub_delivery::state::bounded(limit, &pool, async |connection| {
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(&channel)
                .bind(&token)
                .execute(connection)
                .await
        });
        match send.await {
            Ok(_) => {
                let _ = report.send(());
            }
            Err(error) => debug!(%error, "a listener liveness check could not be sent"),
        }
    });
    sent
}

/// The receiving task, aborted when the connection is given up.
struct AbortOnDrop(tokio::task::JoinHandle<String>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

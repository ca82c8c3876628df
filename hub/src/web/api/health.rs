//! `/readyz`: whether this process can do its work now, for a load balancer
//! or an orchestrator to route by. `/healthz` says only that it lives.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tracing::warn;

use super::ApiState;

/// How long one check may take before it counts as failed: a database that
/// does not answer within this is not one to route requests to.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// The answer: 200 when every check passed, 503 otherwise; the same body
/// either way, each check `"ok"` or what failed.
#[derive(Debug, Serialize)]
pub(super) struct Readiness {
    pub(super) ready: bool,
    /// The event log (and the backlog beside it) answers.
    pub(super) event_log: String,
    /// Its migrations are all applied.
    pub(super) migrations: String,
    /// The subscription store answers.
    pub(super) store: String,
}

const OK: &str = "ok";

/// What a failed check says: which dependency did not answer, never the
/// database's own words (those go to the log).
const EVENT_LOG_FAILED: &str = "failed: the event log's database did not answer";
const STORE_FAILED: &str = "failed: the subscription store did not answer";
const MIGRATIONS_UNKNOWN: &str = "unknown: the event log did not answer";

pub(super) async fn ready(State(state): State<ApiState>) -> Response {
    // Bounded inside the log: a statement that times out closes its
    // connection instead of handing it back to wait on a silent peer.
    let (event_log, migrations) = match state.events.unapplied_migrations(CHECK_TIMEOUT).await {
        Err(error) => {
            warn!(%error, "readiness: the event log did not answer");
            (EVENT_LOG_FAILED.to_owned(), MIGRATIONS_UNKNOWN.to_owned())
        }
        Ok(missing) if missing.is_empty() => (OK.to_owned(), OK.to_owned()),
        Ok(missing) => (
            OK.to_owned(),
            format!("not applied: {}", versions(&missing)),
        ),
    };
    // Bounded inside the store too, where it keeps connections (see
    // `SubscriptionStore::ready`).
    let store = match state.store.ready(CHECK_TIMEOUT).await {
        Err(error) => {
            warn!(%error, "readiness: the subscription store did not answer");
            STORE_FAILED.to_owned()
        }
        Ok(()) => OK.to_owned(),
    };
    let ready = [&event_log, &migrations, &store]
        .iter()
        .all(|check| check.as_str() == OK);
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = Readiness {
        ready,
        event_log,
        migrations,
        store,
    };
    (status, Json(body)).into_response()
}

fn versions(missing: &[i64]) -> String {
    missing
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

//! Sending events again from the admin page, with the operator API's checks
//! ([`crate::web::api::redeliver`]): one delivery's event to its subscriber
//! (`POST /admin/redeliver`, the delivery page's "Send again"), and a
//! topic's events since a time to one subscription (`POST /admin/replay`,
//! the subscriptions page's "Replay since"). Each is a new delivery record;
//! the earlier ones keep their history.

use axum::Form;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use serde::Deserialize;
use uuid::Uuid;

use super::deliveries::delivery_page;
use super::session;
use super::{given, link};
use crate::storage::events::{DeliveryRecord, REPLAY_LIMIT};
use crate::web::api::history::{self, parse_time};
use crate::web::api::redeliver::{event_in_log, record_redelivery, replay_since, subscription_of};
use crate::web::api::{ApiError, ApiState};

/// What the "Send again" button sends.
#[derive(Debug, Deserialize)]
pub(super) struct RedeliverForm {
    csrf: Option<String>,
    event_id: Option<String>,
    subscriber: Option<String>,
}

/// Sends a delivery's event again to its subscriber, and shows the new
/// delivery; when refused (the endpoint disabled, the subscription gone),
/// the delivery page again with the reason on top.
pub(super) async fn redeliver(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Form(form): Form<RedeliverForm>,
) -> Result<Response, ApiError> {
    let session = session::require_form(&state, &headers, form.csrf.as_deref()).await?;
    let (record, attempts) =
        history::find(&state, form.event_id.as_deref(), form.subscriber.as_deref()).await?;
    match send_again(&state, &record).await {
        Ok(redelivery) => {
            tracing::info!(
                event_id = %record.event_id,
                subscriber = record.subscriber,
                %redelivery,
                "event sent again from the admin page"
            );
            Ok(Redirect::to(&link(
                "/admin/delivery",
                &[
                    ("event_id", &redelivery.to_string()),
                    ("subscriber", &record.subscriber),
                    ("sent_again", &record.event_id.to_string()),
                ],
            ))
            .into_response())
        }
        Err(refused) if refused.status.is_client_error() => {
            let banner = html! {
                p.error role="alert" { "Not sent again: " (refused.reason) }
            };
            let page = delivery_page(&state, &session, &record, &attempts, banner).await?;
            Ok((refused.status, page).into_response())
        }
        Err(failed) => Err(failed),
    }
}

/// Records the redelivery of `record`'s event to its subscriber, once the
/// subscription and its endpoint are checked.
async fn send_again(state: &ApiState, record: &DeliveryRecord) -> Result<Uuid, ApiError> {
    let event = event_in_log(state, record.event_id).await?;
    subscription_of(state, &event.topic, &record.subscriber).await?;
    record_redelivery(state, record.event_id, &[&record.subscriber]).await
}

/// The field `name` of a form, which it must give.
fn required<'a>(field: &'a Option<String>, name: &str) -> Result<&'a str, ApiError> {
    given(field)
        .ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, format!("{name} is required")))
}

/// What the "Replay since" form sends.
#[derive(Debug, Deserialize)]
pub(super) struct ReplayForm {
    csrf: Option<String>,
    topic: Option<String>,
    subscriber: Option<String>,
    since: Option<String>,
}

/// Sends the topic's events since the time given again to the
/// subscription (at most [`REPLAY_LIMIT`]; the page says where to go on),
/// and shows its deliveries.
pub(super) async fn replay(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Form(form): Form<ReplayForm>,
) -> Result<Redirect, ApiError> {
    session::require_form(&state, &headers, form.csrf.as_deref()).await?;
    let topic = required(&form.topic, "topic")?;
    let subscriber = required(&form.subscriber, "subscriber")?;
    let since = parse_time("since", Some(required(&form.since, "since")?))?.unwrap_or_default();
    let replayed = replay_since(&state, topic, subscriber, since, REPLAY_LIMIT).await?;
    tracing::info!(
        topic,
        subscriber,
        %since,
        replayed = replayed.redeliveries.len(),
        "events replayed from the admin page"
    );
    let count = replayed.redeliveries.len().to_string();
    let resume = replayed
        .resume_since
        .map(|at| at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true));
    let mut query = vec![
        ("topic", topic),
        ("subscriber", subscriber),
        ("replayed", count.as_str()),
    ];
    query.extend(resume.as_deref().map(|resume| ("resume_since", resume)));
    Ok(Redirect::to(&link("/admin/deliveries", &query)))
}

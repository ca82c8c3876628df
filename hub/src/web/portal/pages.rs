//! The portal's pages and forms: the way in (a link, or a user token),
//! the subscriber's subscriptions, one subscription with its deliveries,
//! one delivery with its attempts, and the actions on them. Each looks the
//! subscription up as its owner's ([`find_own`]), so another subscriber's
//! is answered as missing.

use axum::Form;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use chrono::{DateTime, Utc};
use maud::{Markup, html};
use serde::Deserialize;
use uuid::Uuid;

use super::{
    LOGIN_LIFETIME, MAX_LINK_LIFETIME, Visitor, issue, require, require_form, set_cookie, tokens,
    verify,
};
use crate::storage::backlog::Listing;
use crate::storage::events::{DeliveryFilter, REPLAY_LIMIT, SigningScheme};
use crate::web::admin::layout::bare;
use crate::web::admin::{given, link, when};
use crate::web::api::redeliver::{event_in_log, record_redelivery, replay_since, subscription_of};
use crate::web::api::signing::change;
use crate::web::api::subscription::find_own;
use crate::web::api::{ApiError, ApiState};

/// The most deliveries a subscription's page lists.
const DELIVERIES_SHOWN: usize = 50;

/// The most verification requests the overview lists.
const REQUESTS_SHOWN: usize = 100;

/// The reason an endpoint paused from the portal is disabled with.
const PAUSED: &str = "paused by its subscriber";

fn required<'a>(field: &'a Option<String>, name: &str) -> Result<&'a str, ApiError> {
    given(field)
        .ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, format!("{name} is required")))
}

/// A page of a visitor: its frame, with the way out.
fn page(title: &str, visitor: &Visitor, body: Markup) -> Markup {
    bare(
        title,
        html! {
            nav {
                strong { "WebSub hub" }
                a href="/portal" { "Your subscriptions" }
                span.note { "Signed in as " (visitor.id) }
                form method="post" action="/portal/logout" {
                    (csrf(visitor))
                    button type="submit" { "Sign out" }
                }
            }
            h1 { (title) }
            (body)
        },
    )
}

fn csrf(visitor: &Visitor) -> Markup {
    html! { input type="hidden" name="csrf" value=(visitor.csrf); }
}

/// A session opened for `sub` until `expires`: its cookie, and the way to
/// the overview.
fn open_session(state: &ApiState, sub: &str, value: &str, expires: DateTime<Utc>) -> Response {
    let max_age = (expires - state.clock.now()).num_seconds().max(0);
    tracing::info!(subscriber = sub, "portal session opened");
    let mut response = Redirect::to("/portal").into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, set_cookie(value, max_age));
    response
}

/// What an operator's link carries.
#[derive(Debug, Deserialize)]
pub(super) struct Enter {
    link: Option<String>,
}

/// Comes in with a link: a session until the link expires.
pub(super) async fn enter(
    State(state): State<ApiState>,
    Query(enter): Query<Enter>,
) -> Result<Response, ApiError> {
    let tokens = tokens(&state)?;
    let now = state.clock.now();
    let value = given(&enter.link).unwrap_or("");
    let Some((sub, expires)) = verify(tokens, value, now) else {
        return Ok((
            StatusCode::FORBIDDEN,
            login_page(Some(
                "This link is not valid, or has expired: ask for a new one, or sign in with \
                 your user token.",
            )),
        )
            .into_response());
    };
    Ok(open_session(&state, &sub, value, expires))
}

pub(super) async fn login_form(State(state): State<ApiState>) -> Result<Response, ApiError> {
    tokens(&state)?;
    Ok(login_page(None).into_response())
}

fn login_page(refused: Option<&str>) -> Markup {
    bare(
        "Sign in",
        html! {
            h1 { "WebSub hub: your subscriptions" }
            @if let Some(reason) = refused {
                p.error role="alert" { (reason) }
            }
            form method="post" action="/portal/login" {
                label for="token" { "Your user token" }
                " "
                input #token type="password" name="token" autocomplete="off" required;
                " "
                button type="submit" { "Sign in" }
            }
        },
    )
}

/// What the login form sends.
#[derive(Debug, Deserialize)]
pub(super) struct Login {
    token: Option<String>,
}

/// Checks the user token typed in: a session of [`LOGIN_LIFETIME`].
pub(super) async fn login(
    State(state): State<ApiState>,
    Form(login): Form<Login>,
) -> Result<Response, ApiError> {
    let tokens = tokens(&state)?;
    let mut headers = HeaderMap::new();
    let bearer = format!("Bearer {}", given(&login.token).unwrap_or(""));
    if let Ok(value) = HeaderValue::try_from(bearer) {
        headers.insert(tokens.header().clone(), value);
    }
    let user = match tokens.authenticate(&headers) {
        Ok(user) => user,
        Err(error) => {
            return Ok((
                StatusCode::UNAUTHORIZED,
                login_page(Some(&format!("That token was refused: {error}."))),
            )
                .into_response());
        }
    };
    let expires = state.clock.now() + LOGIN_LIFETIME.min(MAX_LINK_LIFETIME);
    let value = issue(tokens, &user.id, expires);
    Ok(open_session(&state, &user.id, &value, expires))
}

/// What a form with only its CSRF token sends.
#[derive(Debug, Deserialize)]
pub(super) struct Plain {
    csrf: Option<String>,
}

pub(super) async fn logout(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Form(form): Form<Plain>,
) -> Result<Response, ApiError> {
    require_form(&state, &headers, form.csrf.as_deref()).await?;
    let mut response = Redirect::to("/portal/login").into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, set_cookie("", 0));
    Ok(response)
}

/// The visitor's subscriptions, each with its health, and its requests
/// waiting for verification or given up.
pub(super) async fn overview(
    State(state): State<ApiState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let visitor = require(&state, &headers).await?;
    let mut owned = state.store.list_by_owner(&visitor.id).await?;
    owned.sort_by(|a, b| (&a.topic, &a.callback).cmp(&(&b.topic, &b.callback)));
    let mut rows = Vec::with_capacity(owned.len());
    for subscription in owned {
        let health = state
            .events
            .health(&subscription.topic, &subscription.callback, 1000)
            .await?;
        let paused = state
            .dispatcher
            .endpoints()
            .is_disabled(&subscription.callback);
        rows.push((subscription, health, paused));
    }
    let listing = Listing {
        failed: None,
        owner: Some(&visitor.id),
        search: None,
    };
    let requests = state
        .subscriptions
        .backlog()
        .intents(listing, REQUESTS_SHOWN)
        .await?;
    let body = html! {
        table #subscriptions {
            thead { tr {
                th { "Topic" } th { "Callback" } th { "State" } th { "Lease ends" }
                th { "Last success" } th { "Last error" } th { "Pending" } th { "Failed" }
            } }
            tbody {
                @for (subscription, health, paused) in &rows {
                    tr.subscription {
                        td { a href=(link("/portal/subscription", &[
                            ("topic", &subscription.topic), ("callback", &subscription.callback),
                        ])) { (subscription.topic) } }
                        td.callback { (subscription.callback) }
                        td.state { @if *paused { "paused" } @else { "active" } }
                        td { (subscription.expires_at.map(when).unwrap_or_else(|| "never".to_owned())) }
                        td { (health.last_success.map(when).unwrap_or_else(|| "never".to_owned())) }
                        td.error { (health.last_error.as_deref().unwrap_or("")) }
                        td.number { (health.pending) }
                        td.number { (health.failed) }
                    }
                }
            }
        }
        @if rows.is_empty() { p { "You hold no subscription." } }
        h2 { "Requests waiting for verification, or given up" }
        table #requests {
            thead { tr {
                th { "Mode" } th { "Topic" } th { "Callback" } th { "Attempts" }
                th { "Next attempt" } th { "Last error" }
            } }
            tbody {
                @for request in &requests {
                    tr.request {
                        td { (request.mode.as_str()) }
                        td { (request.topic) }
                        td { (request.callback) }
                        td.number { (request.attempts) }
                        td { (request.next_attempt_at.map(when).unwrap_or_else(|| "given up".to_owned())) }
                        td.error { (request.last_error.as_deref().unwrap_or("")) }
                    }
                }
            }
        }
        @if requests.is_empty() { p { "None." } }
    };
    Ok(page("Your subscriptions", &visitor, body).into_response())
}

/// Names one of the visitor's subscriptions, and what happened to it.
#[derive(Debug, Deserialize)]
pub(super) struct Which {
    topic: Option<String>,
    callback: Option<String>,
    done: Option<String>,
}

/// One subscription: its state, its deliveries, and the actions on it.
pub(super) async fn subscription(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(which): Query<Which>,
) -> Result<Response, ApiError> {
    let visitor = require(&state, &headers).await?;
    let topic = required(&which.topic, "topic")?;
    let callback = required(&which.callback, "callback")?;
    let subscription = find_own(&state, &visitor.id, topic, callback).await?;
    let paused = state.dispatcher.endpoints().is_disabled(callback);
    let signing = state.dispatcher.signing_of(&subscription);
    let now = state.clock.now();
    let rotating_until = signing
        .as_ref()
        .and_then(|signing| signing.previous.as_ref())
        .map(|(_, until)| *until)
        .filter(|until| now < *until);
    let filter = DeliveryFilter {
        topic: Some(topic),
        subscriber: Some(callback),
        ..DeliveryFilter::default()
    };
    let deliveries = state.events.list(filter, DELIVERIES_SHOWN).await?;
    let pair = [("topic", topic), ("callback", callback)];
    let body = html! {
        @if let Some(done) = given(&which.done) {
            p.notice role="status" { (done) }
        }
        dl.figures {
            dt { "Topic" } dd { (topic) }
            dt { "Callback" } dd { (callback) }
            dt { "State" } dd #state { @if paused { "paused" } @else { "active" } }
            dt { "Lease" } dd { (subscription.lease_seconds.map_or_else(|| "none".to_owned(), |seconds| format!("{seconds} s"))) }
            dt { "Lease ends" } dd { (subscription.expires_at.map(when).unwrap_or_else(|| "never".to_owned())) }
            dt { "Signed" } dd #signing {
                @if subscription.secret.is_none() { "no" }
                @else {
                    (signing.as_ref().map_or(SigningScheme::WebSub, |signing| signing.scheme).as_str())
                    @if let Some(until) = rotating_until { " (the previous secret signs too until " (when(until)) ")" }
                }
            }
        }
        section {
            @if paused {
                form #resume method="post" action="/portal/resume" {
                    (csrf(&visitor)) (hidden(&pair))
                    button type="submit" { "Resume" }
                    " and send again what came while paused"
                }
            } @else {
                form #pause method="post" action="/portal/pause" {
                    (csrf(&visitor)) (hidden(&pair))
                    button type="submit" { "Pause" }
                }
            }
        }
        section {
            form #replay method="post" action="/portal/replay" {
                (csrf(&visitor)) (hidden(&pair))
                label for="since" { "Send again everything since (RFC 3339)" } " "
                input #since type="text" name="since" size="24" required placeholder="2026-12-01T10:00:00Z";
                " " button type="submit" { "Replay" }
            }
        }
        section {
            form #secret method="post" action="/portal/secret" {
                (csrf(&visitor)) (hidden(&pair))
                label for="new-secret" { "New secret" } " "
                input #new-secret type="password" name="secret" autocomplete="new-password" required;
                " " label for="overlap" { "the old one signs too for (seconds)" } " "
                input #overlap type="number" name="overlap_seconds" min="0" max="604800" value="86400";
                " " label for="scheme" { "scheme" } " "
                select #scheme name="scheme" {
                    option value="" { "as now" }
                    option value="websub" { "websub" }
                    option value="standard-webhooks" { "standard-webhooks" }
                }
                " " button type="submit" { "Rotate the secret" }
            }
        }
        h2 { "Deliveries" }
        table #deliveries {
            thead { tr { th { "Event" } th { "Recorded" } th { "State" } th { "Retries" } th { "Last error" } th {} } }
            tbody {
                @for delivery in &deliveries {
                    @let event = delivery.event_id.to_string();
                    tr.delivery {
                        td { a href=(link("/portal/delivery", &[
                            ("topic", topic), ("callback", callback), ("event_id", &event),
                        ])) { (event) } }
                        td { (when(delivery.created_at)) }
                        td.state { (delivery.state.as_str()) }
                        td.number { (delivery.retry_count) }
                        td.error { (delivery.last_error.as_deref().unwrap_or("")) }
                        td {
                            form.resend method="post" action="/portal/resend" {
                                (csrf(&visitor)) (hidden(&pair))
                                input type="hidden" name="event_id" value=(event);
                                button type="submit" { "Send again" }
                            }
                        }
                    }
                }
            }
        }
        @if deliveries.is_empty() { p { "No delivery yet." } }
    };
    Ok(page("Subscription", &visitor, body).into_response())
}

fn hidden(pair: &[(&str, &str)]) -> Markup {
    html! {
        @for (name, value) in pair {
            input type="hidden" name=(name) value=(value);
        }
    }
}

/// One delivery of one of the visitor's subscriptions.
#[derive(Debug, Deserialize)]
pub(super) struct DeliveryQuery {
    topic: Option<String>,
    callback: Option<String>,
    event_id: Option<String>,
}

fn event_id(text: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(text).map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("event_id {text:?} is not a UUID"),
        )
    })
}

/// One delivery with every attempt it took.
pub(super) async fn delivery(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Query(query): Query<DeliveryQuery>,
) -> Result<Response, ApiError> {
    let visitor = require(&state, &headers).await?;
    let topic = required(&query.topic, "topic")?;
    let callback = required(&query.callback, "callback")?;
    let id = event_id(required(&query.event_id, "event_id")?)?;
    find_own(&state, &visitor.id, topic, callback).await?;
    let event = event_in_log(&state, id).await?;
    if event.topic != topic {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no delivery of {id} to this subscription"),
        ));
    }
    let attempts = state.events.attempts(id, callback).await?;
    let body = html! {
        p { a href=(link("/portal/subscription", &[("topic", topic), ("callback", callback)])) { "Back to the subscription" } }
        table #attempts {
            thead { tr { th { "When" } th { "Took" } th { "Status" } th { "Error" } th { "Answer (first KiB)" } } }
            tbody {
                @for attempt in &attempts {
                    tr.attempt {
                        td { (when(attempt.at)) }
                        td.number { (format!("{:.1} ms", attempt.duration_micros as f64 / 1000.0)) }
                        td { (attempt.status.map(|status| status.to_string()).unwrap_or_default()) }
                        td.error { (attempt.error.as_deref().unwrap_or("")) }
                        td { pre { (String::from_utf8_lossy(&attempt.response)) } }
                    }
                }
            }
        }
        @if attempts.is_empty() { p { "No attempt yet." } }
    };
    Ok(page(&format!("Delivery of {id}"), &visitor, body).into_response())
}

/// What an action's form sends.
#[derive(Debug, Deserialize)]
pub(super) struct Action {
    csrf: Option<String>,
    topic: Option<String>,
    callback: Option<String>,
    event_id: Option<String>,
    since: Option<String>,
    secret: Option<String>,
    overlap_seconds: Option<String>,
    scheme: Option<String>,
}

/// The visitor, and the subscription the form names, checked to be its.
async fn acting(
    state: &ApiState,
    headers: &HeaderMap,
    action: &Action,
) -> Result<websub_store::Subscription, ApiError> {
    let visitor = require_form(state, headers, action.csrf.as_deref()).await?;
    let topic = required(&action.topic, "topic")?;
    let callback = required(&action.callback, "callback")?;
    find_own(state, &visitor.id, topic, callback).await
}

/// Back to the subscription's page, saying what was done.
fn done(subscription: &websub_store::Subscription, what: &str) -> Redirect {
    Redirect::to(&link(
        "/portal/subscription",
        &[
            ("topic", &subscription.topic),
            ("callback", &subscription.callback),
            ("done", what),
        ],
    ))
}

/// Sends one delivery again.
pub(super) async fn resend(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Form(action): Form<Action>,
) -> Result<Redirect, ApiError> {
    let subscription = acting(&state, &headers, &action).await?;
    let id = event_id(required(&action.event_id, "event_id")?)?;
    let event = event_in_log(&state, id).await?;
    if event.topic != subscription.topic {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("event {id} is not of this subscription's topic"),
        ));
    }
    subscription_of(&state, &subscription.topic, &subscription.callback).await?;
    let original = event.original_id.unwrap_or(id);
    record_redelivery(&state, original, &[&subscription.callback]).await?;
    Ok(done(&subscription, &format!("Sending {original} again.")))
}

/// Sends the topic's events since a time again.
pub(super) async fn replay(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Form(action): Form<Action>,
) -> Result<Redirect, ApiError> {
    let subscription = acting(&state, &headers, &action).await?;
    let since = required(&action.since, "since")?;
    let since = DateTime::parse_from_rfc3339(since)
        .map_err(|_| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("since must be an RFC 3339 time, not {since:?}"),
            )
        })?
        .with_timezone(&Utc);
    let replayed = replay_since(
        &state,
        &subscription.topic,
        &subscription.callback,
        since,
        REPLAY_LIMIT,
    )
    .await?;
    Ok(done(
        &subscription,
        &format!("Sending {} events again.", replayed.redeliveries.len()),
    ))
}

/// Pauses the subscription's callback: what comes meanwhile is kept and
/// sent again on resuming.
pub(super) async fn pause(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Form(action): Form<Action>,
) -> Result<Redirect, ApiError> {
    let subscription = acting(&state, &headers, &action).await?;
    state
        .dispatcher
        .endpoints()
        .disable(&subscription.callback, PAUSED, state.clock.now())
        .await?;
    tracing::info!(callback = %subscription.callback, "paused from the portal");
    Ok(done(&subscription, "Paused."))
}

/// Resumes the callback and sends again what its topic recorded while it
/// was paused.
pub(super) async fn resume(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Form(action): Form<Action>,
) -> Result<Redirect, ApiError> {
    let subscription = acting(&state, &headers, &action).await?;
    let paused_at = state
        .events
        .endpoint(
            crate::delivery::Channel::WebSub.label(),
            &subscription.callback,
        )
        .await?
        .and_then(|record| record.disabled_at);
    let now = state.clock.now();
    state
        .dispatcher
        .endpoints()
        .enable(&subscription.callback, now)
        .await?;
    state.dispatcher.wake();
    let replayed = match paused_at {
        Some(since) => replay_since(
            &state,
            &subscription.topic,
            &subscription.callback,
            since,
            REPLAY_LIMIT,
        )
        .await?
        .redeliveries
        .len(),
        None => 0,
    };
    tracing::info!(callback = %subscription.callback, replayed, "resumed from the portal");
    Ok(done(
        &subscription,
        &format!("Resumed; sending the {replayed} events of the pause."),
    ))
}

/// Rotates the secret (and sets the scheme).
pub(super) async fn rotate_secret(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Form(action): Form<Action>,
) -> Result<Redirect, ApiError> {
    let subscription = acting(&state, &headers, &action).await?;
    let secret = required(&action.secret, "secret")?.to_owned();
    let overlap = match given(&action.overlap_seconds) {
        None => None,
        Some(text) => Some(text.parse::<u64>().map_err(|_| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("overlap_seconds must be a number of seconds, not {text:?}"),
            )
        })?),
    };
    let scheme = match given(&action.scheme) {
        None => None,
        Some(name) => Some(SigningScheme::parse(name).ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "scheme must be websub or standard-webhooks",
            )
        })?),
    };
    let (scheme, until) =
        change(&state, subscription.clone(), scheme, Some(secret), overlap).await?;
    let what = match until {
        Some(until) => format!(
            "The secret is replaced ({}); the previous one signs too until {}.",
            scheme.as_str(),
            when(until)
        ),
        None => format!("The secret is replaced ({}).", scheme.as_str()),
    };
    Ok(done(&subscription, &what))
}

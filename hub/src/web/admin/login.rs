//! Logging in to the admin page with an operator key, and out: the form,
//! the check of the key, and the session opened and its cookie set, or the
//! session ended and its cookie dropped ([`super::session`] keeps and
//! checks it).

use axum::Form;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::layout;
use super::session::{LIFETIME, key, open, require_form, set_cookie};
use crate::web::api::{ApiError, ApiState};
use axum::http::HeaderMap;

/// The login form.
pub(super) async fn login_form(State(state): State<ApiState>) -> Result<Markup, ApiError> {
    key(&state)?;
    Ok(login_page(None))
}

/// What the login form sends.
#[derive(Debug, Deserialize)]
pub(super) struct Login {
    key: String,
}

/// Checks the key typed in: a session and the overview when it is an
/// operator key, the form again with a 401 when not.
pub(super) async fn login(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Form(login): Form<Login>,
) -> Result<Response, ApiError> {
    let ring = key(&state)?;
    let Some(key_id) = ring.matches(login.key.trim().as_bytes()) else {
        tracing::info!("admin login refused: wrong key");
        return Ok((
            StatusCode::UNAUTHORIZED,
            login_page(Some("That is not an operator key of this hub.")),
        )
            .into_response());
    };
    let token = open(&state, key_id, &headers).await?;
    let mut response = Redirect::to("/admin").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        set_cookie(&token, LIFETIME.num_seconds()),
    );
    Ok(response)
}

/// What the logout form sends.
#[derive(Debug, Deserialize)]
pub(super) struct Logout {
    csrf: Option<String>,
}

/// Ends the session, drops its cookie and goes back to the login.
pub(super) async fn logout(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Form(form): Form<Logout>,
) -> Result<Response, ApiError> {
    let session = require_form(&state, &headers, form.csrf.as_deref()).await?;
    state
        .events
        .end_session(&session.id)
        .await
        .map_err(|error| {
            tracing::warn!(%error, "admin logout: the session could not be ended");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the session could not be ended now; try again shortly",
            )
        })?;
    tracing::info!(session = %session.id, "admin session ended: logged out");
    let mut response = Redirect::to("/admin/login").into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, set_cookie("", 0));
    Ok(response)
}

fn login_page(refused: Option<&str>) -> Markup {
    layout::bare(
        "Log in",
        html! {
            h1 { "WebSub hub: admin" }
            @if let Some(reason) = refused {
                p.error role="alert" { (reason) }
            }
            form method="post" action="/admin/login" {
                label for="key" { "Operator key" }
                " "
                input #key type="password" name="key" autocomplete="current-password" required;
                " "
                button type="submit" { "Log in" }
            }
        },
    )
}

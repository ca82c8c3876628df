//! Logging in to the admin page with the internal key, and out: the form,
//! the check of the key, and the session cookie set or dropped
//! ([`super::session`] makes and checks it).

use axum::Form;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::layout;
use super::session::{LIFETIME, issue, key, require_form, set_cookie};
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

/// Checks the key typed in: a session and the overview when it is the
/// internal key, the form again with a 401 when not.
pub(super) async fn login(
    State(state): State<ApiState>,
    Form(login): Form<Login>,
) -> Result<Response, ApiError> {
    let key = key(&state)?;
    if !key.matches(login.key.trim().as_bytes()) {
        tracing::info!("admin login refused: wrong key");
        return Ok((
            StatusCode::UNAUTHORIZED,
            login_page(Some("That is not this hub's internal API key.")),
        )
            .into_response());
    }
    let value = issue(key, state.clock.now() + LIFETIME);
    let mut response = Redirect::to("/admin").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        set_cookie(&value, LIFETIME.num_seconds()),
    );
    Ok(response)
}

/// What the logout form sends.
#[derive(Debug, Deserialize)]
pub(super) struct Logout {
    csrf: Option<String>,
}

/// Drops the session cookie and goes back to the login.
pub(super) async fn logout(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Form(form): Form<Logout>,
) -> Result<Response, ApiError> {
    require_form(&state, &headers, form.csrf.as_deref())?;
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
                label for="key" { "Internal API key" }
                " "
                input #key type="password" name="key" autocomplete="current-password" required;
                " "
                button type="submit" { "Log in" }
            }
        },
    )
}

//! `websub listen ADDR`: a small subscriber and publisher for trying a hub
//! by hand. It answers verification GETs on any path (echoing the
//! challenge), prints every delivery it receives (checking
//! `X-Hub-Signature` when given the secret), and serves a topic at `/feed`
//! whose content changes on every fetch.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::routing::get;
use websub_hub::signature::{EVENT_ID_HEADER, HUB_SIGNATURE_HEADER, verify};

#[derive(Debug, Clone)]
struct Listener {
    secret: Option<Arc<str>>,
    fetches: Arc<AtomicU64>,
}

pub(crate) async fn listen(address: SocketAddr, secret: Option<String>) -> ExitCode {
    let state = Listener {
        secret: secret.map(Arc::from),
        fetches: Arc::new(AtomicU64::new(0)),
    };
    let app = Router::new()
        .route("/feed", get(feed))
        .fallback(callback)
        .with_state(state);
    let listener = match tokio::net::TcpListener::bind(address).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("websub: cannot listen on {address}: {error}");
            return ExitCode::from(1);
        }
    };
    println!("listening on http://{address}/ (topic: http://{address}/feed)");
    match axum::serve(listener, app).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("websub: {error}");
            ExitCode::from(1)
        }
    }
}

async fn feed(State(state): State<Listener>) -> ([(&'static str, &'static str); 1], String) {
    let fetch = state.fetches.fetch_add(1, Ordering::Relaxed) + 1;
    (
        [("content-type", "text/plain; charset=utf-8")],
        format!("update number {fetch}\n"),
    )
}

async fn callback(
    State(state): State<Listener>,
    uri: Uri,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    let params: Vec<(String, String)> =
        serde_urlencoded::from_str(query.as_deref().unwrap_or("")).unwrap_or_default();
    let param = |name: &str| {
        params
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.clone())
    };
    if let Some(mode) = param("hub.mode") {
        let topic = param("hub.topic").unwrap_or_default();
        println!("verification: {mode} {topic} on {}", uri.path());
        if let Some(reason) = param("hub.reason") {
            println!("  denied: {reason}");
        }
        return (StatusCode::OK, param("hub.challenge").unwrap_or_default());
    }
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("-")
            .to_owned()
    };
    let signature = match &state.secret {
        Some(secret) => {
            let given = headers
                .get(HUB_SIGNATURE_HEADER)
                .and_then(|value| value.to_str().ok());
            if verify(secret.as_bytes(), &body, given) {
                "valid"
            } else {
                "INVALID"
            }
        }
        None => "not checked",
    };
    println!(
        "delivery to {}: {} bytes, content-type {}, event {}, signature {signature}",
        uri.path(),
        body.len(),
        header("content-type"),
        header(EVENT_ID_HEADER),
    );
    println!("  link: {}", header("link"));
    println!("  body: {}", String::from_utf8_lossy(&body).trim_end());
    (StatusCode::NO_CONTENT, String::new())
}

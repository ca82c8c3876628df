//! What the benchmarks of a whole `websubd` share: the flags that choose
//! and configure the process, the loopback servers they stand up, and the
//! client they talk to the hub and the receivers with.

use std::path::PathBuf;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use websub_hub::net::NetPolicy;

use crate::Failure;
use crate::hub::{Hub, INTERNAL_KEY, locate_websubd, urlencode};

/// Which websubd runs, on which database, with which settings.
#[derive(Debug, clap::Args)]
pub(crate) struct HubFlags {
    /// A PostgreSQL database URL for websubd; the embedded SQLite default
    /// in a scratch directory otherwise.
    #[arg(long)]
    database_url: Option<String>,
    /// An extra websubd flag (repeatable), e.g.
    /// `--hub-arg=--delivery-concurrency=4096`; websubd's defaults otherwise.
    #[arg(long = "hub-arg", allow_hyphen_values = true)]
    hub_args: Vec<String>,
    /// The websubd binary [default: next to this one].
    #[arg(long)]
    websubd: Option<PathBuf>,
}

impl HubFlags {
    /// The database websubd is to use: the one given, or an SQLite file
    /// named `name` under `scratch`.
    pub(crate) fn database_url(&self, scratch: &std::path::Path, name: &str) -> String {
        self.database_url
            .clone()
            .unwrap_or_else(|| format!("sqlite:{}", scratch.join(name).display()))
    }

    /// The settings, for the table: the extra flags, or "defaults".
    pub(crate) fn settings(&self) -> String {
        if self.hub_args.is_empty() {
            "defaults".to_owned()
        } else {
            self.hub_args.join(" ")
        }
    }

    /// Starts websubd on `database_url` with the bench's internal key,
    /// private addresses allowed, `settings` and then the extra flags, and
    /// waits until it serves.
    pub(crate) async fn spawn(
        &self,
        database_url: &str,
        settings: &[&str],
    ) -> Result<Hub, Failure> {
        let websubd = locate_websubd(self.websubd.as_ref())?;
        let mut args = vec![
            "--database-url",
            database_url,
            "--internal-api-key",
            INTERNAL_KEY,
            "--allow-private-network",
        ];
        args.extend_from_slice(settings);
        args.extend(self.hub_args.iter().map(String::as_str));
        Hub::spawn_with(&websubd, &args).await
    }
}

/// A client for loopback servers, with up to `in_flight` connections kept
/// per host.
pub(crate) fn loopback_client(in_flight: usize) -> Result<reqwest::Client, Failure> {
    Ok(websub_hub::delivery::client::for_deliveries(
        &NetPolicy {
            allow_private_network: true,
        },
        Duration::from_secs(30),
        in_flight,
    )?)
}

/// Serves `app` on a free port of 127.0.0.1; returns its base URL.
pub(crate) async fn serve(app: Router) -> Result<String, Failure> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(base)
}

/// Publishes `body` to `topic` as a fat ping; true when the hub took it.
pub(crate) async fn fat_ping(
    client: &reqwest::Client,
    hub_url: &str,
    topic: &str,
    content_type: &str,
    body: impl Into<reqwest::Body>,
) -> Result<bool, reqwest::Error> {
    let response = client
        .post(format!(
            "{hub_url}?hub.mode=publish&hub.topic={}",
            urlencode(topic)
        ))
        .header("content-type", content_type)
        .header("X-Internal-API-Key", INTERNAL_KEY)
        .body(body)
        .send()
        .await?;
    Ok(response.status() == StatusCode::ACCEPTED)
}

//! What every command talking to a running hub shares: where the hub is
//! (`--hub`, `WEBSUB_HUB`), the internal key (`WEBSUB_INTERNAL_API_KEY`,
//! sent in the header `--internal-api-key-header` names), `--json`, one
//! HTTP client, and the mapping of every failure to an exit code: 0 done,
//! 1 the hub refused or failed (its status and reason are printed) or could
//! not be reached, 2 a bad command line (clap's own code for the same).
//!
//! The key is read from the environment only, never from a flag, so that
//! it does not show in the process list or a shell's history.

use std::fmt;
use std::process::ExitCode;
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use reqwest::{Method, RequestBuilder};
use serde_json::Value;
use url::Url;
use websub_hub::web::auth::DEFAULT_INTERNAL_API_KEY_HEADER;

/// The variable the internal API key is read from.
pub(crate) const KEY_VARIABLE: &str = "WEBSUB_INTERNAL_API_KEY";
/// The variable an operator key is read from, before [`KEY_VARIABLE`]: for
/// a hub whose operators have keys of their own (`operator-keys`).
pub(crate) const OPERATOR_KEY_VARIABLE: &str = "WEBSUB_OPERATOR_KEY";

/// Where `websubd` serves on its embedded default.
pub(crate) const DEFAULT_HUB: &str = "http://127.0.0.1:8080/";

/// The most of an answer the CLI reads: every listing of the operator API
/// is bounded far below this, so more is not an answer of a hub.
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// How long one request may take, connecting included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The options of every command that talks to a hub.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct HubArgs {
    /// The hub's URL.
    #[arg(long, value_name = "URL", env = "WEBSUB_HUB", default_value = DEFAULT_HUB)]
    pub(crate) hub: String,
    #[command(flatten)]
    pub(crate) output: Output,
}

/// How a command talks to the hub and prints its answer, whatever picked the
/// hub's URL.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Output {
    /// The header the hub reads its keys from (the key itself comes from
    /// WEBSUB_OPERATOR_KEY or WEBSUB_INTERNAL_API_KEY).
    #[arg(long, value_name = "NAME", env = "WEBSUB_INTERNAL_API_KEY_HEADER",
          default_value = DEFAULT_INTERNAL_API_KEY_HEADER)]
    pub(crate) internal_api_key_header: String,
    /// Print the API's JSON answer instead of a table, for scripts.
    #[arg(long)]
    pub(crate) json: bool,
}

impl HubArgs {
    /// The hub these options name, with the key from the environment.
    pub(crate) fn connect(&self) -> Result<Hub, Failure> {
        Hub::connect(&self.hub, &self.output)
    }
}

/// Why a command did not succeed, and so its exit code.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The command line (or the environment it reads) is wrong: exit 2.
    Usage(String),
    /// The hub answered with an error status: exit 1.
    Refused {
        /// The status.
        status: reqwest::StatusCode,
        /// The hub's reason (its plain-text body).
        reason: String,
    },
    /// The hub could not be reached, or its answer was not one: exit 1.
    Unreachable(String),
}

impl Failure {
    /// Prints the failure and gives its exit code.
    pub(crate) fn report(self) -> ExitCode {
        eprintln!("websub: {self}");
        match self {
            Self::Usage(_) => ExitCode::from(2),
            Self::Refused { .. } | Self::Unreachable(_) => ExitCode::from(1),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Usage(reason) | Self::Unreachable(reason) => f.write_str(reason),
            Self::Refused { status, reason } => write!(f, "the hub answered {status}: {reason}"),
        }
    }
}

/// Checks a `--hub` value: an absolute http(s) URL, read as a directory
/// (a missing trailing slash is added, so `http://host/hub` keeps its path).
pub(crate) fn parse_hub_url(value: &str) -> Result<Url, Failure> {
    let bad = |reason: &str| Failure::Usage(format!("--hub {value:?}: {reason}"));
    let mut url = Url::parse(value).map_err(|error| bad(&error.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad("expected an http:// or https:// URL"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad(
            "expected the hub's base URL, without a query or fragment",
        ));
    }
    if !url.path().ends_with('/') {
        let path = format!("{}/", url.path());
        url.set_path(&path);
    }
    Ok(url)
}

/// A hub to send operator requests to.
#[derive(Debug)]
pub(crate) struct Hub {
    base: Url,
    client: reqwest::Client,
    header: HeaderName,
    key: HeaderValue,
    json: bool,
}

impl Hub {
    /// The hub at `url`, with the key from [`OPERATOR_KEY_VARIABLE`] or
    /// [`KEY_VARIABLE`].
    pub(crate) fn connect(url: &str, output: &Output) -> Result<Self, Failure> {
        let base = parse_hub_url(url)?;
        let header =
            HeaderName::from_bytes(output.internal_api_key_header.as_bytes()).map_err(|_| {
                Failure::Usage(format!(
                    "--internal-api-key-header {:?}: not a header name",
                    output.internal_api_key_header
                ))
            })?;
        let Some((variable, key)) =
            [OPERATOR_KEY_VARIABLE, KEY_VARIABLE]
                .into_iter()
                .find_map(|variable| {
                    let key = std::env::var(variable).ok()?;
                    (!key.trim().is_empty()).then_some((variable, key))
                })
        else {
            return Err(Failure::Usage(format!(
                "neither {OPERATOR_KEY_VARIABLE} nor {KEY_VARIABLE} is set: set one to an \
                 operator key of the hub (or its internal API key)"
            )));
        };
        let mut key = HeaderValue::from_str(key.trim())
            .map_err(|_| Failure::Usage(format!("{variable} holds characters a header cannot")))?;
        key.set_sensitive(true);
        websub_hub::delivery::net::install_crypto_provider();
        // A redirect is refused rather than followed: the key would go
        // along to wherever it points.
        let client = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|error| Failure::Unreachable(format!("no HTTP client: {error}")))?;
        Ok(Self {
            base,
            client,
            header,
            key,
            json: output.json,
        })
    }

    /// `GET /api/v1/operator/{path}?{query}`: the answer's JSON.
    pub(crate) async fn get(&self, path: &str, query: &[(&str, &str)]) -> Result<Value, Failure> {
        self.send(self.request(Method::GET, path, query)?).await
    }

    /// `POST /api/v1/operator/{path}` with `body` as JSON: the answer's JSON.
    pub(crate) async fn post(&self, path: &str, body: &Value) -> Result<Value, Failure> {
        self.send(self.request(Method::POST, path, &[])?.json(body))
            .await
    }

    /// `PUT /api/v1/operator/{path}?{query}` with `body` as JSON: the
    /// answer's JSON.
    pub(crate) async fn put(
        &self,
        path: &str,
        query: &[(&str, &str)],
        body: &Value,
    ) -> Result<Value, Failure> {
        self.send(self.request(Method::PUT, path, query)?.json(body))
            .await
    }

    /// `DELETE /api/v1/operator/{path}?{query}`: the answer's JSON, `null`
    /// when it has no body.
    pub(crate) async fn delete(
        &self,
        path: &str,
        query: &[(&str, &str)],
    ) -> Result<Value, Failure> {
        self.send(self.request(Method::DELETE, path, query)?).await
    }

    /// Prints `answer`: as JSON with `--json`, else as `human` renders it.
    pub(crate) fn print(&self, answer: &Value, human: impl FnOnce(&Value) -> String) {
        if self.json {
            match serde_json::to_string_pretty(answer) {
                Ok(json) => println!("{json}"),
                Err(_) => println!("{answer}"),
            }
        } else {
            print!("{}", human(answer));
        }
    }

    fn request(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
    ) -> Result<RequestBuilder, Failure> {
        let mut url = self
            .base
            .join(&format!("api/v1/operator/{path}"))
            .map_err(|error| Failure::Usage(format!("--hub {}: {error}", self.base)))?;
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        Ok(self
            .client
            .request(method, url)
            .header(self.header.clone(), self.key.clone()))
    }

    async fn send(&self, request: RequestBuilder) -> Result<Value, Failure> {
        let unreachable = |error: reqwest::Error| {
            Failure::Unreachable(format!("cannot reach the hub at {}: {error}", self.base))
        };
        let mut response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(unreachable)? {
            if body.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(Failure::Unreachable(format!(
                    "the hub's answer is larger than {MAX_ANSWER_BYTES} bytes"
                )));
            }
            body.extend_from_slice(&chunk);
        }
        if !status.is_success() {
            let reason = String::from_utf8_lossy(&body).trim().to_owned();
            let reason = if reason.is_empty() {
                "(no reason given)".to_owned()
            } else {
                reason
            };
            return Err(Failure::Refused { status, reason });
        }
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&body).map_err(|error| {
            Failure::Unreachable(format!(
                "the hub answered {status} with something that is not JSON: {error}"
            ))
        })
    }
}

/// A JSON value as a table cell: `-` for none, text as it is, `yes`/`no`.
pub(crate) fn cell(value: &Value) -> String {
    match value {
        Value::Null => "-".to_owned(),
        Value::String(text) => text.clone(),
        Value::Bool(true) => "yes".to_owned(),
        Value::Bool(false) => "no".to_owned(),
        other => other.to_string(),
    }
}

/// The elements of a JSON array answer (none when it is not one).
pub(crate) fn elements(value: &Value) -> &[Value] {
    value.as_array().map_or(&[], Vec::as_slice)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_urls_are_checked_and_read_as_directories() {
        let url = |value: &str| parse_hub_url(value).map(|url| url.to_string());
        assert_eq!(
            url("http://127.0.0.1:8080").ok().as_deref(),
            Some("http://127.0.0.1:8080/")
        );
        assert_eq!(
            url("https://h.example/hub").ok().as_deref(),
            Some("https://h.example/hub/")
        );
        for bad in [
            "127.0.0.1:8080",
            "not a url",
            "ftp://h.example/",
            "http://h/?x=1",
        ] {
            match parse_hub_url(bad) {
                Err(Failure::Usage(reason)) => assert!(reason.contains(bad), "{reason}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn cells_show_json_plainly() {
        assert_eq!(cell(&Value::Null), "-");
        assert_eq!(cell(&serde_json::json!("x")), "x");
        assert_eq!(cell(&serde_json::json!(true)), "yes");
        assert_eq!(cell(&serde_json::json!(3)), "3");
    }
}

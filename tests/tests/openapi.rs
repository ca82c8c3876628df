//! End to end: the OpenAPI description at `/api/v1/openapi.json`, checked
//! against the hub that serves it and by a third-party validator.
//!
//! The routes under `/api/v1` are built from the same handler attributes as
//! the document, so the checks here look for the ways the two could still
//! part: an operation documented but not answered (404, 405), a method
//! answered on a documented path but not documented (anything but 405), an
//! answer whose status the document does not list, a route the README's API
//! tables name that is not documented, a security requirement naming no
//! scheme. The validator (`openapi-spec-validator`, from PyPI) judges the
//! document itself, as a client generator would read it.
//!
//! The document also drives a check of every route's failures: with each
//! table of the hub's database renamed away (SQLite and PostgreSQL), every
//! operation, given parameters it accepts, answers a `5xx` that names its
//! request id and carries none of the database's words.

use std::collections::BTreeSet;
use std::process::Command;

use chrono::TimeDelta;
use reqwest::Method;
use serde_json::{Value, json};
use websub_hub::web::auth::issue_token;
use websub_storetest::servers::in_ci;
use websub_tests::{Backend, INTERNAL_KEY, TestHub, http_client, test_config};

const TOKEN_KEY: &str = "the-user-token-signing-key";
const DOCUMENT: &str = "api/v1/openapi.json";
/// The methods an OpenAPI path item can hold, as its keys spell them.
const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// A hub with both APIs on: a user token key and the internal key.
async fn hub() -> TestHub {
    let mut config = test_config(Backend::Sqlite)
        .await
        .expect("SQLite needs no server");
    config.internal_api_key = Some(INTERNAL_KEY.to_owned());
    config.user_token_key = Some(TOKEN_KEY.to_owned());
    TestHub::start(config).await
}

/// The document as served: to a caller without credentials, as JSON.
async fn document(hub: &TestHub) -> (String, Value) {
    let response = http_client()
        .get(format!("{}{DOCUMENT}", hub.url))
        .send()
        .await
        .expect("GET the document");
    assert_eq!(response.status().as_u16(), 200);
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert_eq!(content_type, "application/json");
    let text = response.text().await.expect("the document's body");
    let json = serde_json::from_str(&text).expect("the document is JSON");
    (text, json)
}

/// Every documented operation: (method, path, its object).
fn operations(document: &Value) -> Vec<(Method, String, Value)> {
    let paths = document["paths"].as_object().expect("paths");
    let mut found = Vec::new();
    for (path, item) in paths {
        for method in METHODS {
            if let Some(operation) = item.get(method) {
                let method =
                    Method::from_bytes(method.to_uppercase().as_bytes()).expect("an HTTP method");
                found.push((method, path.clone(), operation.clone()));
            }
        }
    }
    found
}

/// The names of the security schemes an operation requires.
fn required_schemes(operation: &Value) -> BTreeSet<String> {
    operation["security"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_object)
        .flat_map(|requirement| requirement.keys().cloned())
        .collect()
}

/// Sends `method` to `path` (which starts with a slash), with `headers`.
async fn answer(hub: &TestHub, method: Method, path: &str, headers: &[(&str, &str)]) -> u16 {
    let mut request = http_client().request(method, format!("{}{}", hub.url, &path[1..]));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.expect("request").status().as_u16()
}

fn documents_status(operation: &Value, status: u16) -> bool {
    operation["responses"].get(status.to_string()).is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_operation_is_answered_as_documented() {
    let hub = hub().await;
    let (_, document) = document(&hub).await;
    let operations = operations(&document);
    // Not vacuous: both APIs are there (README.md's routes are checked
    // in their own test).
    let operator = operations
        .iter()
        .filter(|(_, path, _)| path.starts_with("/api/v1/operator/"))
        .count();
    assert!(
        operator > 0 && operations.len() > operator + 1,
        "the document misses an API: {:?}",
        operations
            .iter()
            .map(|(method, path, _)| format!("{method} {path}"))
            .collect::<Vec<_>>()
    );
    let token = format!(
        "Bearer {}",
        issue_token(TOKEN_KEY, "alice", None, TimeDelta::minutes(5))
    );
    let schemes = document["components"]["securitySchemes"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    for (method, path, operation) in &operations {
        let required = required_schemes(operation);
        for scheme in &required {
            assert!(
                schemes.contains_key(scheme),
                "{method} {path} requires {scheme:?}, which is not a security scheme"
            );
        }
        // Without credentials: a protected operation refuses with 401, and
        // says so; an open one answers.
        let status = answer(&hub, method.clone(), path, &[]).await;
        assert!(
            status != 404 && status != 405,
            "{method} {path} is documented but answered {status}"
        );
        assert!(
            documents_status(operation, status),
            "{method} {path} answered {status} without credentials, which it does not document"
        );
        if !required.is_empty() {
            assert_eq!(status, 401, "{method} {path} without credentials");
        }
        // With them: whatever it answers (a success, or 400 for a missing
        // parameter), the document lists.
        let credentials: Vec<(&str, &str)> = required
            .iter()
            .map(|scheme| match scheme.as_str() {
                "bearer" => ("Authorization", token.as_str()),
                _ => ("X-Internal-API-Key", INTERNAL_KEY),
            })
            .collect();
        let status = answer(&hub, method.clone(), path, &credentials).await;
        assert!(
            documents_status(operation, status),
            "{method} {path} answered {status} with credentials, which it does not document"
        );
    }
    // A method a documented path is not documented with is not served.
    let paths: BTreeSet<&String> = operations.iter().map(|(_, path, _)| path).collect();
    for path in paths {
        for method in [
            Method::GET,
            Method::POST,
            Method::PUT,
            Method::DELETE,
            Method::PATCH,
        ] {
            if operations
                .iter()
                .any(|(documented, at, _)| *documented == method && at == path)
            {
                continue;
            }
            let status = answer(&hub, method.clone(), path, &[]).await;
            assert_eq!(
                status, 405,
                "{method} {path} answered {status}, but the document does not describe it"
            );
        }
    }
    hub.stop().await;
}

/// The `METHOD /api/v1/…` routes README.md names, without their queries.
fn readme_routes() -> BTreeSet<(Method, String)> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("read README.md");
    let mut routes = BTreeSet::new();
    for (start, _) in readme.match_indices("`") {
        let rest = &readme[start + 1..];
        let Some((method, after)) = rest.split_once(' ') else {
            continue;
        };
        if !["GET", "POST", "PUT", "DELETE", "PATCH"].contains(&method)
            || !after.starts_with("/api/v1/")
        {
            continue;
        }
        let end = after.find(['`', '?', '[', ' ']).unwrap_or(after.len());
        let method = Method::from_bytes(method.as_bytes()).expect("an HTTP method");
        routes.insert((method, after[..end].to_owned()));
    }
    routes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_the_readme_names_is_documented() {
    let hub = hub().await;
    let (_, document) = document(&hub).await;
    let documented: BTreeSet<(Method, String)> = operations(&document)
        .into_iter()
        .map(|(method, path, _)| (method, path))
        .collect();
    let named = readme_routes();
    assert!(
        named.len() >= 11,
        "README.md names too few API routes (is the parse broken?): {named:?}"
    );
    let missing: Vec<_> = named.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "README.md names undocumented routes: {missing:?}"
    );
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_security_schemes_are_the_user_token_and_the_internal_key() {
    let hub = hub().await;
    let (_, document) = document(&hub).await;
    assert!(
        document["openapi"]
            .as_str()
            .is_some_and(|version| version.starts_with("3.1.")),
        "{}",
        document["openapi"]
    );
    let schemes = &document["components"]["securitySchemes"];
    assert_eq!(schemes["bearer"]["type"], "http");
    assert_eq!(schemes["bearer"]["scheme"], "bearer");
    assert_eq!(schemes["bearer"]["bearerFormat"], "JWT");
    assert_eq!(schemes["internal_api_key"]["type"], "apiKey");
    assert_eq!(schemes["internal_api_key"]["in"], "header");
    assert_eq!(schemes["internal_api_key"]["name"], "X-Internal-API-Key");
    for (_, path, operation) in operations(&document) {
        let expected: BTreeSet<String> = if path == format!("/{DOCUMENT}") {
            BTreeSet::new()
        } else if path.starts_with("/api/v1/operator/") {
            BTreeSet::from(["internal_api_key".to_owned()])
        } else {
            BTreeSet::from(["bearer".to_owned()])
        };
        assert_eq!(required_schemes(&operation), expected, "{path}");
    }
    // The listings' query, from `IntoParams`: the states and the bounds.
    let listing = &document["paths"]["/api/v1/operator/verifications"]["get"]["parameters"];
    let state = listing
        .as_array()
        .and_then(|parameters| parameters.iter().find(|p| p["name"] == "state"))
        .expect("a state parameter");
    assert_eq!(state["in"], "query");
    assert!(
        state.to_string().contains(r#"["pending","failed"]"#),
        "{state}"
    );
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_security_schemes_name_the_configured_headers() {
    let mut config = test_config(Backend::Sqlite)
        .await
        .expect("SQLite needs no server");
    config.internal_api_key = Some(INTERNAL_KEY.to_owned());
    config.internal_api_key_header = "X-Hub-Key".to_owned();
    config.user_token_key = Some(TOKEN_KEY.to_owned());
    config.user_token_header = "X-User-Token".to_owned();
    let hub = TestHub::start(config).await;
    let (_, document) = document(&hub).await;
    let schemes = &document["components"]["securitySchemes"];
    // Not `Authorization`, so the token may come bare: an API key to
    // OpenAPI.
    assert_eq!(schemes["bearer"]["type"], "apiKey", "{schemes}");
    assert_eq!(schemes["bearer"]["in"], "header");
    assert_eq!(schemes["bearer"]["name"], "x-user-token");
    assert_eq!(schemes["internal_api_key"]["name"], "x-hub-key");
    let status = answer(
        &hub,
        Method::GET,
        "/api/v1/operator/topics",
        &[("x-hub-key", INTERNAL_KEY)],
    )
    .await;
    assert_eq!(status, 200);
    hub.stop().await;
}

/// Whether `python3` can run the validator; under CI it must.
fn validator_available() -> bool {
    let found = Command::new("python3")
        .args(["-c", "import openapi_spec_validator"])
        .status()
        .is_ok_and(|status| status.success());
    if !found {
        assert!(
            !in_ci(),
            "CI is set but python3 cannot import openapi_spec_validator (.ci/run installs it)"
        );
        eprintln!("skipped: python3 -m pip install openapi-spec-validator==0.9.0 to run this test");
    }
    found
}

/// Runs the validator on `text`; its success and what it printed.
fn validate(text: &str) -> (bool, String) {
    let file = std::env::temp_dir().join(format!("websub-openapi-{}.json", uuid::Uuid::new_v4()));
    std::fs::write(&file, text).expect("write the document");
    let output = Command::new("python3")
        .args(["-m", "openapi_spec_validator", "--schema", "3.1"])
        .arg(&file)
        .output()
        .expect("run openapi_spec_validator");
    let _ = std::fs::remove_file(&file);
    let mut printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // Its errors quote the whole document after the reason.
    if let Some((end, _)) = printed.char_indices().nth(2000) {
        printed.truncate(end);
        printed.push('…');
    }
    (output.status.success(), printed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_document_passes_openapi_spec_validator() {
    if !validator_available() {
        return;
    }
    let hub = hub().await;
    let (text, mut document) = document(&hub).await;
    let (valid, printed) = validate(&text);
    assert!(
        valid,
        "openapi-spec-validator refused the document:\n{printed}"
    );

    // The validator is seen to refuse: a reference to a response that does
    // not exist.
    document["paths"]["/api/v1/usage"]["get"]["responses"]["401"]["$ref"] =
        Value::from("#/components/responses/NoSuchResponse");
    let (valid, printed) = validate(&document.to_string());
    assert!(
        !valid,
        "openapi-spec-validator accepted a broken document:\n{printed}"
    );
    hub.stop().await;
}

/// A value the hub accepts for a parameter or property named `name` of
/// `schema`, so that a request gets past its checks to the storage.
fn sample(document: &Value, name: &str, schema: &Value) -> Value {
    let schema = resolve(document, schema);
    if let Some(first) = schema["enum"].as_array().and_then(|values| values.first()) {
        return first.clone();
    }
    if let Some(first) = ["oneOf", "anyOf", "allOf"].iter().find_map(|key| {
        schema[*key]
            .as_array()?
            .iter()
            .find(|option| option["type"] != "null")
    }) {
        return sample(document, name, first);
    }
    match name {
        "topic" => return json!("http://127.0.0.1:9/topic"),
        "callback" => return json!("http://127.0.0.1:9/callback"),
        "event_id" | "id" => return json!(uuid::Uuid::new_v4().to_string()),
        // Within the hub's retention, or a replay is refused before it
        // reads anything.
        "since" | "until" => {
            return json!((chrono::Utc::now() - TimeDelta::hours(1)).to_rfc3339());
        }
        "state" => return json!("failed"),
        "channel" => return json!("websub"),
        "limit" => return json!(10),
        _ => {}
    }
    let kind = match &schema["type"] {
        Value::Array(kinds) => kinds
            .iter()
            .filter_map(Value::as_str)
            .find(|kind| *kind != "null")
            .unwrap_or("string"),
        kind => kind.as_str().unwrap_or("string"),
    };
    match kind {
        "integer" | "number" => json!(1),
        "boolean" => json!(false),
        "array" => json!([sample(document, name, &schema["items"])]),
        "object" => {
            let mut object = serde_json::Map::new();
            let properties = schema["properties"].as_object();
            for (property, schema) in properties.into_iter().flatten() {
                // A replay takes one of a time and an event, not both.
                if property == "event_id" && properties.is_some_and(|all| all.contains_key("since"))
                {
                    continue;
                }
                object.insert(property.clone(), sample(document, property, schema));
            }
            Value::Object(object)
        }
        _ => json!("x"),
    }
}

/// `schema`, or what its `$ref` names.
fn resolve<'a>(document: &'a Value, schema: &'a Value) -> &'a Value {
    match schema["$ref"].as_str() {
        Some(reference) => document
            .pointer(reference.trim_start_matches('#'))
            .unwrap_or(schema),
        None => schema,
    }
}

/// Renames every table of the hub's database away, so that each statement
/// on it fails with the database's own error text.
async fn break_database(url: &str) {
    use sqlx::Connection;
    if url.starts_with("sqlite:") {
        let mut connection = sqlx::SqliteConnection::connect(url)
            .await
            .expect("open the hub's SQLite file");
        let tables: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'",
        )
        .fetch_all(&mut connection)
        .await
        .expect("list the tables");
        for table in tables {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                r#"ALTER TABLE "{table}" RENAME TO "gone_{table}""#
            )))
            .execute(&mut connection)
            .await
            .expect("rename a table");
        }
    } else {
        let mut connection = sqlx::PgConnection::connect(url)
            .await
            .expect("connect to the hub's database");
        let tables: Vec<String> =
            sqlx::query_scalar("SELECT tablename::text FROM pg_tables WHERE schemaname = 'public'")
                .fetch_all(&mut connection)
                .await
                .expect("list the tables");
        for table in tables {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                r#"ALTER TABLE public."{table}" RENAME TO "gone_{table}""#
            )))
            .execute(&mut connection)
            .await
            .expect("rename a table");
        }
    }
}

/// What a body must never show a client: the database's words, its
/// driver's, or the hub's own table names.
const BACKEND_TEXT: [&str; 9] = [
    "websub_",
    "no such table",
    "does not exist",
    "sqlx",
    "sqlite",
    "SQLITE",
    "error returned from database",
    "database failed",
    "pool timed out",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_keeps_a_failing_database_to_the_log_and_names_the_request() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some(mut config) = test_config(backend).await else {
            continue;
        };
        config.internal_api_key = Some(INTERNAL_KEY.to_owned());
        config.user_token_key = Some(TOKEN_KEY.to_owned());
        let hub = TestHub::start(config).await;
        let (_, document) = document(&hub).await;
        let token = format!(
            "Bearer {}",
            issue_token(TOKEN_KEY, "alice", None, TimeDelta::minutes(5))
        );
        break_database(&hub.database_url).await;
        let client = http_client();
        let mut requests = Vec::new();
        for (method, path, operation) in operations(&document) {
            let mut target = path.clone();
            let mut query = Vec::new();
            for parameter in operation["parameters"].as_array().into_iter().flatten() {
                let name = parameter["name"].as_str().expect("a parameter's name");
                let value = match sample(&document, name, &parameter["schema"]) {
                    Value::String(text) => text,
                    other => other.to_string(),
                };
                match parameter["in"].as_str() {
                    Some("path") => target = target.replace(&format!("{{{name}}}"), &value),
                    Some("query") => query.push((name.to_owned(), value)),
                    _ => {}
                }
            }
            let mut url = format!("{}{}", hub.url, &target[1..]);
            if !query.is_empty() {
                url.push('?');
                url.push_str(&serde_urlencoded::to_string(&query).expect("a query"));
            }
            let mut request = client
                .request(method.clone(), url)
                .header("Authorization", &token)
                .header("X-Internal-API-Key", INTERNAL_KEY);
            if let Some(schema) = operation
                .pointer("/requestBody/content/application~1json/schema")
                .filter(|_| method != Method::GET)
            {
                request = request.json(&sample(&document, "", schema));
            }
            requests.push((format!("{method} {target}"), request));
        }
        // The hub endpoint itself: a subscription request and a publish
        // ping, and a fat ping, each recorded before its answer.
        let form = |pairs: &[(&str, &str)]| {
            client
                .post(&hub.url)
                .header("Content-Type", "application/x-www-form-urlencoded")
                .header("X-Internal-API-Key", INTERNAL_KEY)
                .body(serde_urlencoded::to_string(pairs).expect("a form"))
        };
        requests.push((
            "POST / (subscribe)".to_owned(),
            form(&[
                ("hub.mode", "subscribe"),
                ("hub.topic", "http://127.0.0.1:9/topic"),
                ("hub.callback", "http://127.0.0.1:9/callback"),
            ]),
        ));
        requests.push((
            "POST / (publish)".to_owned(),
            form(&[
                ("hub.mode", "publish"),
                ("hub.url", "http://127.0.0.1:9/topic"),
            ]),
        ));
        requests.push((
            "POST / (fat ping)".to_owned(),
            client
                .post(format!(
                    "{}?hub.mode=publish&hub.topic=http%3A%2F%2F127.0.0.1%3A9%2Ftopic",
                    hub.url
                ))
                .header("X-Internal-API-Key", INTERNAL_KEY)
                .header("Content-Type", "application/json")
                .body("{}"),
        ));
        requests.push((
            "GET /topics/feed".to_owned(),
            client.get(format!("{}topics/feed", hub.url)),
        ));
        let mut failed = Vec::new();
        let mut answered = Vec::new();
        let total = requests.len();
        for (index, (what, request)) in requests.into_iter().enumerate() {
            let chosen = format!("test-request-{index}");
            let response = request
                .header("x-request-id", &chosen)
                .send()
                .await
                .expect("an answer");
            let status = response.status();
            let echoed = response
                .headers()
                .get("x-request-id")
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned);
            assert_eq!(echoed.as_deref(), Some(chosen.as_str()), "{what}");
            let body = response.text().await.expect("a body");
            if !status.is_server_error() {
                answered.push(format!("{what}: {status}"));
            }
            if status.is_success() {
                continue;
            }
            for text in BACKEND_TEXT {
                assert!(
                    !body.contains(text),
                    "{backend:?}: {what} answered {status} with backend text: {body}"
                );
            }
            if status.is_server_error() {
                assert!(
                    body.contains(&format!("(request id {chosen})")),
                    "{backend:?}: {what} answered {status} without naming the request: {body}"
                );
                failed.push(what);
            }
        }
        // Not vacuous: every route reached the broken database, but the
        // document, a portal link (signed, nothing stored) and the ones that
        // read only the outbox feeds' own databases (none configured here).
        let untouched = [
            "GET /api/v1/openapi.json: 200 OK",
            "GET /api/v1/operator/feeds: 200 OK",
            "POST /api/v1/operator/portal-links: 201 Created",
            "GET /api/v1/operator/webhooks/deliveries: 200 OK",
            "POST /api/v1/operator/webhooks/replay: 200 OK",
        ];
        assert_eq!(
            answered,
            untouched,
            "{backend:?}: {} of {total} requests answered 5xx: {failed:?}",
            failed.len()
        );
        for what in [
            "POST / (subscribe)",
            "POST / (publish)",
            "POST / (fat ping)",
        ] {
            assert!(
                failed.iter().any(|failed| failed == what),
                "{backend:?}: {what}"
            );
        }
        hub.stop().await;
    }
}

//! The Traefik export served by a real Traefik in front of a real
//! websubd: Traefik loads `websub routes --traefik` with every router
//! enabled, the public paths reach the hub, the subscriber API reaches it
//! only through the protected policy's forward-auth (here a small server
//! that admits one token), and the internal paths are not routed on the
//! public entry point but are on the internal one.
//!
//! Traefik is `WEBSUB_TEST_TRAEFIK` or `traefik` on the `PATH` (`.ci/run`
//! installs it). Under `CI` a missing one fails the test; otherwise it
//! skips with the reason printed.

use crate::common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use common::{Websubd, free_port, scratch_dir};

const INTERNAL_KEY: &str = "an-internal-api-key-of-at-least-32-characters";
const USER_TOKEN_KEY: &str = "the-user-token-key-of-this-test";
const HOST: &str = "hub.example.com";

fn traefik() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::var_os("WEBSUB_TEST_TRAEFIK")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::split_paths(&path)
                .map(|dir| dir.join("traefik"))
                .find(|candidate| candidate.is_file())
        });
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but Traefik is not installed (WEBSUB_TEST_TRAEFIK or traefik on the PATH)"
        );
        eprintln!("skipped: Traefik is not installed (WEBSUB_TEST_TRAEFIK or traefik on the PATH)");
    }
    found
}

/// A child process killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A forward-auth that admits one `Authorization` value alone, counting
/// what it is asked.
async fn forward_auth(admitted: String, asked: Arc<AtomicUsize>) -> SocketAddr {
    let app = axum::Router::new().fallback(move |headers: HeaderMap| {
        let asked = asked.clone();
        let admitted = admitted.clone();
        async move {
            asked.fetch_add(1, Ordering::SeqCst);
            let given = headers.get("authorization").and_then(|v| v.to_str().ok());
            if given == Some(admitted.as_str()) {
                StatusCode::OK
            } else {
                StatusCode::UNAUTHORIZED
            }
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the forward-auth");
    let address = listener.local_addr().expect("its address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    address
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traefik_routes_the_export_by_policy() {
    let Some(traefik) = traefik() else {
        return;
    };
    let dir = scratch_dir("traefik");
    let hub_port = free_port();
    let hub = Websubd::spawn(
        &dir,
        hub_port,
        &[
            "--internal-api-key",
            INTERNAL_KEY,
            "--user-token-key",
            USER_TOKEN_KEY,
        ],
    )
    .ready()
    .await;

    let token = websub_hub::web::auth::issue_token(
        USER_TOKEN_KEY,
        "alice",
        None,
        chrono::TimeDelta::minutes(5),
    );
    let bearer = format!("Bearer {token}");
    let asked = Arc::new(AtomicUsize::new(0));
    let auth = forward_auth(bearer.clone(), asked.clone()).await;
    let dynamic = dir.join("dynamic");
    std::fs::create_dir_all(&dynamic).expect("the provider's directory");
    let export = Command::new(env!("CARGO_BIN_EXE_websub"))
        .args(["routes", "--traefik", "--host", HOST])
        .args([
            "--entry-points",
            "web",
            "--internal-entry-points",
            "internal",
        ])
        .args(["--service-url", &format!("http://127.0.0.1:{hub_port}")])
        .env_remove("TRAEFIK_MIDDLEWARES_PROTECTED")
        .output()
        .expect("run websub routes");
    assert!(export.status.success(), "{export:?}");
    std::fs::write(dynamic.join("websub.toml"), &export.stdout).expect("write the export");
    // The protected policy's default middleware, as the platform would
    // define it.
    std::fs::write(
        dynamic.join("auth.toml"),
        format!("[http.middlewares.auth-verify.forwardAuth]\naddress = \"http://{auth}/\"\n"),
    )
    .expect("write the middleware");

    let (public, internal, api) = (free_port(), free_port(), free_port());
    let _traefik = Running(
        Command::new(traefik)
            .arg(format!("--entrypoints.web.address=127.0.0.1:{public}"))
            .arg(format!(
                "--entrypoints.internal.address=127.0.0.1:{internal}"
            ))
            .arg(format!("--entrypoints.traefik.address=127.0.0.1:{api}"))
            .arg("--api.insecure=true")
            .arg(format!("--providers.file.directory={}", dynamic.display()))
            .arg("--log.level=ERROR")
            .stdout(Stdio::null())
            .spawn()
            .expect("start Traefik"),
    );

    let client = websub_tests::client_builder()
        .resolve(HOST, SocketAddr::from(([127, 0, 0, 1], 0)))
        .build()
        .expect("a client");
    let on = |port: u16, path: &str| format!("http://{HOST}:{port}{path}");

    // Traefik has loaded the file and found the hub up.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let up = client.get(on(public, "/healthz")).send().await;
        if up.is_ok_and(|response| response.status() == StatusCode::OK) {
            break;
        }
        assert!(Instant::now() < deadline, "Traefik did not route /healthz");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let routers: serde_json::Value = client
        .get(format!("http://127.0.0.1:{api}/api/http/routers"))
        .send()
        .await
        .expect("Traefik's API")
        .json()
        .await
        .expect("routers as JSON");
    let ours: Vec<_> = routers
        .as_array()
        .expect("a list")
        .iter()
        .filter(|router| router["provider"] == "file")
        .collect();
    assert_eq!(ours.len(), 12, "every route has its router: {routers:#}");
    for router in ours {
        assert_eq!(router["status"], "enabled", "{router:#}");
    }

    let status = |url: String, headers: &'static [(&'static str, &'static str)]| {
        let mut request = client.get(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        async move { request.send().await.expect("a request").status() }
    };
    let key: &[(&str, &str)] = &[("X-Internal-API-Key", INTERNAL_KEY)];

    // Public: straight to the hub.
    assert_eq!(status(on(public, "/"), &[]).await, StatusCode::OK);
    assert_eq!(
        status(on(public, "/topics/t"), &[]).await,
        StatusCode::NO_CONTENT
    );

    // Protected: the forward-auth decides before the hub sees anything.
    assert_eq!(
        status(on(public, "/api/v1/usage"), &[]).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        asked.load(Ordering::SeqCst),
        1,
        "the forward-auth was asked"
    );
    let with = |authorization: &str| {
        client
            .get(on(public, "/api/v1/usage"))
            .header("authorization", authorization)
            .send()
    };
    let refused = with("Bearer not-a-token-the-platform-issued")
        .await
        .expect("a request");
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(asked.load(Ordering::SeqCst), 2);
    let admitted = with(&bearer).await.expect("a request");
    assert_eq!(admitted.status(), StatusCode::OK, "the hub answers");
    let usage: serde_json::Value = admitted.json().await.expect("the usage as JSON");
    assert_eq!(usage["used"], 0, "{usage}");
    assert_eq!(asked.load(Ordering::SeqCst), 3);

    // Internal: not on the public entry point, even with the key...
    for path in ["/api/v1/operator/topics", "/metrics", "/admin"] {
        assert_eq!(
            status(on(public, path), key).await,
            StatusCode::NOT_FOUND,
            "{path} on the public entry point"
        );
    }
    // ...and only there on the internal one, where the hub checks the key.
    assert_eq!(
        status(on(internal, "/api/v1/operator/topics"), key).await,
        StatusCode::OK
    );
    assert_eq!(
        status(on(internal, "/api/v1/operator/topics"), &[]).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(status(on(internal, "/"), &[]).await, StatusCode::NOT_FOUND);
    drop(hub);
}

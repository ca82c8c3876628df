//! `websub routes --traefik`, the built binary: its output read back as
//! Traefik's file provider reads it (TOML), the routers, rules,
//! middlewares and service it holds, the flags and the shared
//! `TRAEFIK_MIDDLEWARES_*` variables that change them, and the values it
//! refuses with exit code 2, naming the value and where it came from.

use std::process::{Command, Output};

use toml::{Table, Value};

/// Every variable the command reads, cleared so that the environment the
/// tests run in cannot leak into them.
const VARIABLES: &[&str] = &[
    "TRAEFIK_MIDDLEWARES_ENRICHED",
    "TRAEFIK_MIDDLEWARES_PROTECTED",
    "TRAEFIK_MIDDLEWARES_ADMIN",
    "WEBSUB_TRAEFIK_NAME",
    "WEBSUB_TRAEFIK_HOST",
    "WEBSUB_TRAEFIK_ENTRY_POINTS",
    "WEBSUB_TRAEFIK_INTERNAL_ENTRY_POINTS",
    "WEBSUB_TRAEFIK_SERVICE_URL",
];

fn websub(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_websub"));
    command.arg("routes").args(args);
    for variable in VARIABLES {
        command.env_remove(variable);
    }
    command.envs(env.iter().copied());
    command.output().expect("run websub")
}

/// The configuration printed for `args` and `env`, parsed.
fn export(args: &[&str], env: &[(&str, &str)]) -> Table {
    let mut args = args.to_vec();
    args.insert(0, "--traefik");
    let output = websub(&args, env);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .parse()
        .unwrap_or_else(|error| panic!("not TOML: {error}\n{stdout}"))
}

fn table<'a>(value: &'a Table, key: &str) -> &'a Table {
    value
        .get(key)
        .and_then(Value::as_table)
        .unwrap_or_else(|| panic!("no table {key} in {value:#?}"))
}

fn routers(config: &Table) -> &Table {
    table(table(config, "http"), "routers")
}

fn strings(router: &Table, key: &str) -> Vec<String> {
    router
        .get(key)
        .and_then(Value::as_array)
        .map(|values| {
            values
                .iter()
                .map(|value| value.as_str().expect("a string").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn rule(router: &Table) -> &str {
    router.get("rule").and_then(Value::as_str).expect("a rule")
}

#[test]
fn the_defaults_route_the_public_and_protected_paths_to_the_hub() {
    let config = export(&[], &[]);
    let routers = routers(&config);
    let expected = [
        ("websub-hub", "Path(`/`)", &[][..]),
        ("websub-topics", "PathPrefix(`/topics/`)", &[]),
        ("websub-openapi", "Path(`/api/v1/openapi.json`)", &[]),
        ("websub-healthz", "Path(`/healthz`)", &[]),
        ("websub-readyz", "Path(`/readyz`)", &[]),
        (
            "websub-portal",
            "(Path(`/portal`) || PathPrefix(`/portal/`))",
            &[],
        ),
        (
            "websub-subscriptions",
            "Path(`/api/v1/subscriptions`)",
            &["auth-verify"],
        ),
        ("websub-usage", "Path(`/api/v1/usage`)", &["auth-verify"]),
        (
            "websub-verifications",
            "Path(`/api/v1/verifications`)",
            &["auth-verify"],
        ),
    ];
    let mut names: Vec<&str> = expected.iter().map(|(name, ..)| *name).collect();
    names.sort_unstable();
    assert_eq!(
        routers.keys().map(String::as_str).collect::<Vec<_>>(),
        names,
        "exactly these routers; no internal one"
    );
    for (name, expected_rule, middlewares) in expected {
        let router = table(routers, name);
        assert_eq!(rule(router), expected_rule, "{name}");
        assert_eq!(strings(router, "entryPoints"), ["websecure"], "{name}");
        assert_eq!(strings(router, "middlewares"), middlewares, "{name}");
        assert_eq!(
            router.get("service").and_then(Value::as_str),
            Some("websub")
        );
    }
    let balancer = table(
        table(table(table(&config, "http"), "services"), "websub"),
        "loadBalancer",
    );
    let servers = balancer
        .get("servers")
        .and_then(Value::as_array)
        .expect("servers");
    assert_eq!(servers.len(), 1);
    assert_eq!(
        servers[0].get("url").and_then(Value::as_str),
        Some("http://127.0.0.1:8080")
    );
    assert_eq!(
        table(balancer, "healthCheck")
            .get("path")
            .and_then(Value::as_str),
        Some("/healthz")
    );
}

#[test]
fn the_internal_routes_are_served_only_on_internal_entry_points() {
    let config = export(
        &[
            "--internal-entry-points",
            "internal,vpn",
            "--host",
            "hub.example.com",
        ],
        &[],
    );
    let routers = routers(&config);
    for (name, expected_rule) in [
        ("websub-operator", "PathPrefix(`/api/v1/operator/`)"),
        ("websub-admin", "(Path(`/admin`) || PathPrefix(`/admin/`))"),
        ("websub-metrics", "Path(`/metrics`)"),
    ] {
        let router = table(routers, name);
        assert_eq!(
            rule(router),
            format!("Host(`hub.example.com`) && {expected_rule}")
        );
        assert_eq!(
            strings(router, "entryPoints"),
            ["internal", "vpn"],
            "{name}"
        );
        assert!(strings(router, "middlewares").is_empty(), "{name}");
    }
    for (name, router) in routers {
        let router = router.as_table().expect("a router");
        let entry_points = strings(router, "entryPoints");
        let internal =
            ["websub-operator", "websub-admin", "websub-metrics"].contains(&name.as_str());
        assert_eq!(
            entry_points == ["websecure"],
            !internal,
            "{name}: {entry_points:?}"
        );
        assert!(
            rule(router).starts_with("Host(`hub.example.com`) && "),
            "{name}"
        );
    }
}

#[test]
fn the_shared_variables_replace_the_middlewares_and_flags_beat_them() {
    let env = [
        (
            "TRAEFIK_MIDDLEWARES_PROTECTED",
            "auth-test-forward@docker,quota@file",
        ),
        ("TRAEFIK_MIDDLEWARES_ENRICHED", "auth-test-enrich@docker"),
        (
            "TRAEFIK_MIDDLEWARES_ADMIN",
            "auth-test-forward@docker,admin@docker",
        ),
    ];
    let config = export(&[], &env);
    let routers = routers(&config);
    for (name, router) in routers {
        let router = router.as_table().expect("a router");
        let middlewares = strings(router, "middlewares");
        if [
            "websub-subscriptions",
            "websub-usage",
            "websub-verifications",
        ]
        .contains(&name.as_str())
        {
            assert_eq!(
                middlewares,
                ["auth-test-forward@docker", "quota@file"],
                "{name}"
            );
        } else {
            // No route of the hub is enriched or admin.
            assert!(middlewares.is_empty(), "{name}: {middlewares:?}");
        }
    }

    let config = export(&["--protected-middlewares", "from-the-flag"], &env);
    assert_eq!(
        strings(table(routers_of(&config), "websub-usage"), "middlewares"),
        ["from-the-flag"]
    );
}

fn routers_of(config: &Table) -> &Table {
    routers(config)
}

#[test]
fn entry_points_host_name_and_replicas_are_taken_from_flags_and_variables() {
    let config = export(
        &[
            "--entry-points",
            "web,websecure",
            "--name",
            "websub-test",
            "--service-url",
            "http://10.0.0.5:8080,http://10.0.0.6:8080",
        ],
        &[("WEBSUB_TRAEFIK_HOST", "hub.test.example")],
    );
    let routers = routers(&config);
    let hub = table(routers, "websub-test-hub");
    assert_eq!(strings(hub, "entryPoints"), ["web", "websecure"]);
    assert_eq!(rule(hub), "Host(`hub.test.example`) && Path(`/`)");
    assert_eq!(
        hub.get("service").and_then(Value::as_str),
        Some("websub-test")
    );
    let servers = table(
        table(table(table(&config, "http"), "services"), "websub-test"),
        "loadBalancer",
    )
    .get("servers")
    .and_then(Value::as_array)
    .expect("servers")
    .iter()
    .map(|server| server.get("url").and_then(Value::as_str).expect("a url"))
    .collect::<Vec<_>>();
    assert_eq!(servers, ["http://10.0.0.5:8080", "http://10.0.0.6:8080"]);

    let config = export(&[], &[("WEBSUB_TRAEFIK_ENTRY_POINTS", "https")]);
    assert_eq!(
        strings(table(routers_of(&config), "websub-hub"), "entryPoints"),
        ["https"]
    );
}

/// A refused value: the arguments, the environment, and what the error
/// must name (the setting's flag or variable, and the value as quoted).
type Refusal = (
    &'static [&'static str],
    &'static [(&'static str, &'static str)],
    &'static str,
    &'static str,
);

#[test]
fn blank_and_spaced_values_are_refused_naming_value_and_source() {
    let cases: &[Refusal] = &[
        (
            &[],
            &[("TRAEFIK_MIDDLEWARES_PROTECTED", "")],
            "TRAEFIK_MIDDLEWARES_PROTECTED",
            "\"\"",
        ),
        (
            &[],
            &[("TRAEFIK_MIDDLEWARES_ENRICHED", "   ")],
            "TRAEFIK_MIDDLEWARES_ENRICHED",
            "\"   \"",
        ),
        (
            &[],
            &[("TRAEFIK_MIDDLEWARES_ADMIN", "auth-verify, auth-admin")],
            "TRAEFIK_MIDDLEWARES_ADMIN",
            "\" auth-admin\"",
        ),
        (
            &[],
            &[("TRAEFIK_MIDDLEWARES_PROTECTED", "auth-a,,auth-b")],
            "TRAEFIK_MIDDLEWARES_PROTECTED",
            "\"\"",
        ),
        (
            &["--protected-middlewares", "auth verify"],
            &[],
            "--protected-middlewares",
            "\"auth verify\"",
        ),
        (
            &["--admin-middlewares", "\t"],
            &[],
            "--admin-middlewares",
            "\"\\t\"",
        ),
        (&["--entry-points", ""], &[], "--entry-points", "\"\""),
        (&["--entry-points", " "], &[], "--entry-points", "\" \""),
        (
            &["--entry-points", "web secure"],
            &[],
            "--entry-points",
            "\"web secure\"",
        ),
        (
            &[],
            &[("WEBSUB_TRAEFIK_ENTRY_POINTS", "websecure,")],
            "WEBSUB_TRAEFIK_ENTRY_POINTS",
            "\"\"",
        ),
        (
            &["--internal-entry-points", "int ernal"],
            &[],
            "--internal-entry-points",
            "\"int ernal\"",
        ),
        (
            &["--internal-entry-points", "websecure"],
            &[],
            "--internal-entry-points",
            "\"websecure\"",
        ),
        (
            &["--service-url", "ftp://hub.internal"],
            &[],
            "--service-url",
            "\"ftp://hub.internal\"",
        ),
        (&["--host", "hub example"], &[], "--host", "\"hub example\""),
    ];
    for (args, env, source, value) in cases {
        for traefik in [true, false] {
            let mut args = args.to_vec();
            if traefik {
                args.push("--traefik");
            }
            let output = websub(&args, env);
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(2), "{args:?} {env:?}: {stderr}");
            assert!(output.stdout.is_empty(), "{args:?} {env:?}: printed anyway");
            assert!(
                stderr.contains(&format!("websub: {source}: ")),
                "{args:?} {env:?}: {stderr}"
            );
            assert!(stderr.contains(value), "{args:?} {env:?}: {stderr}");
        }
    }
}

#[test]
fn the_plain_listing_shows_each_path_with_its_policy() {
    let output = websub(&[], &[]);
    assert!(output.status.success());
    let listing = String::from_utf8_lossy(&output.stdout);
    let policy_of = |path: &str| {
        listing
            .lines()
            .find(|line| line.split_whitespace().next() == Some(path))
            .and_then(|line| line.split_whitespace().nth(1))
            .unwrap_or_else(|| panic!("{path} is not listed: {listing}"))
            .to_owned()
    };
    assert_eq!(policy_of("/"), "public");
    assert_eq!(policy_of("/api/v1/subscriptions"), "protected");
    assert_eq!(policy_of("/api/v1/operator/…"), "internal");
}

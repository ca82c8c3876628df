use std::collections::HashSet;

use super::traefik::{Setting, TraefikConfig, TraefikError, split_list};
use super::{PathMatch, Policy, ROUTES};

#[test]
fn the_table_names_each_route_once_and_paths_are_well_formed() {
    let mut names = HashSet::new();
    for route in ROUTES {
        assert!(names.insert(route.name), "{} twice", route.name);
        match route.path {
            PathMatch::Exact(path) => assert!(path.starts_with('/'), "{path}"),
            PathMatch::Below(path) => assert!(path.starts_with('/') && path.ends_with('/')),
            PathMatch::Tree(path) => assert!(path.starts_with('/') && !path.ends_with('/')),
        }
    }
}

#[test]
fn the_operator_routes_are_internal() {
    for route in ROUTES {
        let path = route.path.to_string();
        if path.starts_with("/api/v1/operator") || path.starts_with("/admin") || path == "/metrics"
        {
            assert_eq!(route.policy, Policy::Internal, "{path}");
        }
    }
}

#[test]
fn lists_are_split_without_repair() {
    assert_eq!(split_list("a@docker,b"), ["a@docker", "b"]);
    assert_eq!(split_list("a, b"), ["a", " b"]);
    assert_eq!(split_list(""), [""]);
}

fn refused(config: TraefikConfig) -> TraefikError {
    config.export().expect_err("refused")
}

#[test]
fn blank_and_spaced_names_are_refused_with_their_setting() {
    for (value, empty) in [
        ("", true),
        ("  ", true),
        ("\t", true),
        ("auth verify", false),
    ] {
        let error = refused(TraefikConfig {
            protected_middlewares: vec!["auth-a".to_owned(), value.to_owned()],
            ..TraefikConfig::default()
        });
        let setting = Setting::Middlewares(Policy::Protected);
        if empty {
            assert_eq!(
                error,
                TraefikError::Empty {
                    setting,
                    value: value.to_owned()
                }
            );
        } else {
            assert_eq!(
                error,
                TraefikError::Whitespace {
                    setting,
                    value: value.to_owned()
                }
            );
        }
        assert_eq!(error.setting(), setting);
        assert!(error.to_string().contains(&format!("{value:?}")), "{error}");
    }
    let error = refused(TraefikConfig {
        entry_points: vec![" web".to_owned()],
        ..TraefikConfig::default()
    });
    assert!(matches!(
        error,
        TraefikError::Whitespace {
            setting: Setting::EntryPoints,
            ..
        }
    ));
    // A policy no route uses is checked all the same.
    let error = refused(TraefikConfig {
        admin_middlewares: Vec::new(),
        ..TraefikConfig::default()
    });
    assert_eq!(
        error,
        TraefikError::NoneGiven {
            setting: Setting::Middlewares(Policy::Admin)
        }
    );
}

#[test]
fn other_bad_settings_are_refused() {
    let cases = [
        (
            TraefikConfig {
                entry_points: Vec::new(),
                ..TraefikConfig::default()
            },
            Setting::EntryPoints,
        ),
        (
            TraefikConfig {
                internal_entry_points: vec!["websecure".to_owned()],
                ..TraefikConfig::default()
            },
            Setting::InternalEntryPoints,
        ),
        (
            TraefikConfig {
                service_urls: vec!["ftp://hub:21".to_owned()],
                ..TraefikConfig::default()
            },
            Setting::ServiceUrls,
        ),
        (
            TraefikConfig {
                host: Some("hub`.example".to_owned()),
                ..TraefikConfig::default()
            },
            Setting::Host,
        ),
        (
            TraefikConfig {
                name: "web sub".to_owned(),
                ..TraefikConfig::default()
            },
            Setting::Name,
        ),
    ];
    for (config, setting) in cases {
        assert_eq!(refused(config).setting(), setting);
    }
}

#[test]
fn the_defaults_export() {
    let toml = TraefikConfig::default()
        .export()
        .expect("the defaults are valid");
    assert!(toml.contains("[http.routers.websub-hub]"), "{toml}");
    assert!(
        !toml.contains("operator"),
        "internal routes are left out: {toml}"
    );
}

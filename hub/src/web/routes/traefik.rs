//! The Traefik export: [`super::ROUTES`] as a dynamic configuration for
//! Traefik's file provider (TOML), one router per route, all pointing at
//! one load-balanced service, the hub. A route's policy decides its entry
//! points and middlewares; an internal route is left out unless internal
//! entry points are given, and then is routed on those alone.
//!
//! The configuration is taken as given and checked once, in
//! [`TraefikConfig::export`]: an empty entry point or middleware name, or
//! one holding whitespace, is refused rather than repaired, whichever
//! layer it came from, because Traefik would otherwise load a router that
//! routes nothing or a middleware chain that silently lacks a link.
//!
//! ```
//! use websub_hub::web::routes::traefik::TraefikConfig;
//!
//! let config = TraefikConfig {
//!     host: Some("hub.example.com".to_owned()),
//!     ..TraefikConfig::default()
//! };
//! let toml = config.export().expect("a valid configuration");
//! assert!(toml.contains("rule = \"Host(`hub.example.com`) && Path(`/`)\""));
//! ```

use std::fmt;

use serde::Serialize;
use serde::ser::SerializeMap;

use super::{PathMatch, Policy, ROUTES, Route};

/// The public entry point when none is given: Traefik's usual name for
/// its HTTPS entry point.
pub const DEFAULT_ENTRY_POINT: &str = "websecure";
/// The hub when no service URL is given: `websubd`'s default address.
pub const DEFAULT_SERVICE_URL: &str = "http://127.0.0.1:8080";
/// The prefix of every router's name and the service's name.
pub const DEFAULT_NAME: &str = "websub";
/// The enriched policy's middlewares when the environment does not
/// replace them.
pub const DEFAULT_ENRICHED_MIDDLEWARES: &[&str] = &["auth-enrich"];
/// The protected policy's middlewares when the environment does not
/// replace them.
pub const DEFAULT_PROTECTED_MIDDLEWARES: &[&str] = &["auth-verify"];
/// The admin policy's middlewares when the environment does not replace
/// them.
pub const DEFAULT_ADMIN_MIDDLEWARES: &[&str] = &["auth-verify", "auth-admin"];

/// The path Traefik probes on every server of the hub's service.
pub const HEALTH_CHECK_PATH: &str = "/healthz";

/// What the export needs besides the route table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraefikConfig {
    /// The prefix of the routers' names and the service's name, so that
    /// several hubs (e.g. one per environment) share one Traefik.
    pub name: String,
    /// When given, every rule also matches this host; without it the
    /// routers answer their paths on every host of their entry points.
    pub host: Option<String>,
    /// Where the public routes are served. At least one: a router with
    /// no entry point would be served on every entry point.
    pub entry_points: Vec<String>,
    /// Where the internal routes are served; none leaves them out.
    pub internal_entry_points: Vec<String>,
    /// The hub's servers (several replicas may share one PostgreSQL).
    pub service_urls: Vec<String>,
    /// The enriched policy's middlewares.
    pub enriched_middlewares: Vec<String>,
    /// The protected policy's middlewares.
    pub protected_middlewares: Vec<String>,
    /// The admin policy's middlewares.
    pub admin_middlewares: Vec<String>,
}

impl Default for TraefikConfig {
    fn default() -> Self {
        let owned = |names: &[&str]| names.iter().map(|name| (*name).to_owned()).collect();
        Self {
            name: DEFAULT_NAME.to_owned(),
            host: None,
            entry_points: vec![DEFAULT_ENTRY_POINT.to_owned()],
            internal_entry_points: Vec::new(),
            service_urls: vec![DEFAULT_SERVICE_URL.to_owned()],
            enriched_middlewares: owned(DEFAULT_ENRICHED_MIDDLEWARES),
            protected_middlewares: owned(DEFAULT_PROTECTED_MIDDLEWARES),
            admin_middlewares: owned(DEFAULT_ADMIN_MIDDLEWARES),
        }
    }
}

/// A field of [`TraefikConfig`], as an error names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Setting {
    /// [`TraefikConfig::name`].
    Name,
    /// [`TraefikConfig::host`].
    Host,
    /// [`TraefikConfig::entry_points`].
    EntryPoints,
    /// [`TraefikConfig::internal_entry_points`].
    InternalEntryPoints,
    /// [`TraefikConfig::service_urls`].
    ServiceUrls,
    /// The middlewares of a shared policy.
    Middlewares(Policy),
}

impl Setting {
    /// What one value of the setting is called in an error.
    fn noun(self) -> &'static str {
        match self {
            Setting::Name => "name",
            Setting::Host => "host",
            Setting::EntryPoints | Setting::InternalEntryPoints => "entry point",
            Setting::ServiceUrls => "service URL",
            Setting::Middlewares(_) => "middleware name",
        }
    }
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Setting::Name => f.write_str("name"),
            Setting::Host => f.write_str("host"),
            Setting::EntryPoints => f.write_str("entry points"),
            Setting::InternalEntryPoints => f.write_str("internal entry points"),
            Setting::ServiceUrls => f.write_str("service URLs"),
            Setting::Middlewares(policy) => write!(f, "{policy} middlewares"),
        }
    }
}

/// A configuration the export refuses. Each names the value and the
/// setting it was found in ([`TraefikError::setting`]), so that a caller
/// reading several sources can say which one held it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TraefikError {
    /// An empty value, or one of whitespace alone.
    #[error("the {} {value:?} is empty or blank", setting.noun())]
    Empty {
        /// Where it was.
        setting: Setting,
        /// The value.
        value: String,
    },
    /// A value holding whitespace.
    #[error("the {} {value:?} contains whitespace", setting.noun())]
    Whitespace {
        /// Where it was.
        setting: Setting,
        /// The value.
        value: String,
    },
    /// A list with nothing in it where at least one is needed.
    #[error("no {} is given for the {setting}; at least one is needed", setting.noun())]
    NoneGiven {
        /// The list.
        setting: Setting,
    },
    /// A value that is not what the setting holds.
    #[error("the {} {value:?} {reason}", setting.noun())]
    Invalid {
        /// Where it was.
        setting: Setting,
        /// The value.
        value: String,
        /// What is wrong with it, as the end of a sentence about it.
        reason: &'static str,
    },
    /// An entry point given as both public and internal, which would
    /// make the internal routes public.
    #[error("the entry point {value:?} is both public and internal")]
    PublicAndInternal {
        /// The internal entry point.
        setting: Setting,
        /// The entry point.
        value: String,
    },
}

impl TraefikError {
    /// The setting that held the refused value.
    pub fn setting(&self) -> Setting {
        match self {
            TraefikError::Empty { setting, .. }
            | TraefikError::Whitespace { setting, .. }
            | TraefikError::NoneGiven { setting }
            | TraefikError::Invalid { setting, .. }
            | TraefikError::PublicAndInternal { setting, .. } => *setting,
        }
    }
}

/// Splits a comma-separated list, as the `TRAEFIK_MIDDLEWARES_*`
/// variables hold them. Nothing is trimmed or dropped: `"a, b"` and
/// `"a,,b"` keep the entries [`TraefikConfig::export`] refuses.
pub fn split_list(list: &str) -> Vec<String> {
    list.split(',').map(str::to_owned).collect()
}

impl TraefikConfig {
    /// The middlewares a route of `policy` runs behind.
    pub fn middlewares(&self, policy: Policy) -> &[String] {
        match policy {
            Policy::Enriched => &self.enriched_middlewares,
            Policy::Protected => &self.protected_middlewares,
            Policy::Admin => &self.admin_middlewares,
            Policy::Public | Policy::Internal => &[],
        }
    }

    /// Checks every setting; the first refused value is the error.
    pub fn validate(&self) -> Result<(), TraefikError> {
        word(Setting::Name, &self.name)?;
        if !self
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(TraefikError::Invalid {
                setting: Setting::Name,
                value: self.name.clone(),
                reason: "may hold only letters, digits, '-' and '_'",
            });
        }
        if let Some(host) = &self.host {
            word(Setting::Host, host)?;
            if url::Host::parse(host).is_err() || host.contains('`') {
                return Err(TraefikError::Invalid {
                    setting: Setting::Host,
                    value: host.clone(),
                    reason: "is not a host name or address",
                });
            }
        }
        words(Setting::EntryPoints, &self.entry_points, true)?;
        words(
            Setting::InternalEntryPoints,
            &self.internal_entry_points,
            false,
        )?;
        if let Some(both) = self
            .internal_entry_points
            .iter()
            .find(|name| self.entry_points.contains(name))
        {
            return Err(TraefikError::PublicAndInternal {
                setting: Setting::InternalEntryPoints,
                value: both.clone(),
            });
        }
        words(Setting::ServiceUrls, &self.service_urls, true)?;
        for service in &self.service_urls {
            let parsed = url::Url::parse(service).ok();
            if !parsed
                .is_some_and(|url| matches!(url.scheme(), "http" | "https") && url.host().is_some())
            {
                return Err(TraefikError::Invalid {
                    setting: Setting::ServiceUrls,
                    value: service.clone(),
                    reason: "is not an http or https URL",
                });
            }
        }
        for policy in Policy::ALL.into_iter().filter(|policy| policy.is_shared()) {
            // Even a policy no route uses is checked: the variables are
            // shared by every service of an environment, and a bad one is
            // the same mistake whichever service reads it.
            words(Setting::Middlewares(policy), self.middlewares(policy), true)?;
        }
        Ok(())
    }

    /// The dynamic configuration for the hub's [`ROUTES`], as TOML.
    pub fn export(&self) -> Result<String, TraefikError> {
        self.export_routes(ROUTES)
    }

    /// The dynamic configuration for `routes`, as TOML.
    pub fn export_routes(&self, routes: &[Route]) -> Result<String, TraefikError> {
        self.validate()?;
        let service = self.name.clone();
        let routers = routes
            .iter()
            .filter_map(|route| {
                let entry_points = match route.policy {
                    Policy::Internal if self.internal_entry_points.is_empty() => return None,
                    Policy::Internal => self.internal_entry_points.clone(),
                    _ => self.entry_points.clone(),
                };
                let router = Router {
                    entry_points,
                    rule: self.rule(route.path),
                    middlewares: self.middlewares(route.policy).to_vec(),
                    service: service.clone(),
                };
                Some((format!("{}-{}", self.name, route.name), router))
            })
            .collect();
        let services = vec![(
            service,
            Service {
                load_balancer: LoadBalancer {
                    servers: self
                        .service_urls
                        .iter()
                        .map(|url| Server { url: url.clone() })
                        .collect(),
                    pass_host_header: true,
                    health_check: HealthCheck {
                        path: HEALTH_CHECK_PATH,
                        interval: "10s",
                        timeout: "3s",
                    },
                },
            },
        )];
        let document = Dynamic {
            http: Http {
                routers: Ordered(routers),
                services: Ordered(services),
            },
        };
        // The serializer fails only on shapes TOML cannot hold (a value
        // after a table, a non-string key); these types have none.
        let body = toml::to_string_pretty(&document)
            .unwrap_or_else(|error| unreachable!("the export is TOML: {error}"));
        Ok(format!(
            "# Traefik dynamic configuration (file provider) for websub-hub,\n\
             # written by `websub routes --traefik`: one router per route of the hub.\n\n{body}"
        ))
    }

    /// The rule of a route: its paths, on the host when one is given.
    fn rule(&self, path: PathMatch) -> String {
        let paths = match path {
            PathMatch::Exact(path) => format!("Path(`{path}`)"),
            PathMatch::Below(path) => format!("PathPrefix(`{path}`)"),
            PathMatch::Tree(path) => format!("(Path(`{path}`) || PathPrefix(`{path}/`))"),
        };
        match &self.host {
            Some(host) => format!("Host(`{host}`) && {paths}"),
            None => paths,
        }
    }
}

/// Refuses an empty value or one holding whitespace.
fn word(setting: Setting, value: &str) -> Result<(), TraefikError> {
    if value.trim().is_empty() {
        return Err(TraefikError::Empty {
            setting,
            value: value.to_owned(),
        });
    }
    if value.chars().any(char::is_whitespace) {
        return Err(TraefikError::Whitespace {
            setting,
            value: value.to_owned(),
        });
    }
    Ok(())
}

/// [`word`] for each of a list, which must name at least one when
/// `required`.
fn words(setting: Setting, values: &[String], required: bool) -> Result<(), TraefikError> {
    if required && values.is_empty() {
        return Err(TraefikError::NoneGiven { setting });
    }
    values.iter().try_for_each(|value| word(setting, value))
}

#[derive(Debug, Serialize)]
struct Dynamic {
    http: Http,
}

#[derive(Debug, Serialize)]
struct Http {
    routers: Ordered<Router>,
    services: Ordered<Service>,
}

/// A TOML table whose keys keep the order they were given in, so that the
/// routers read in the order of the route table.
#[derive(Debug)]
struct Ordered<T>(Vec<(String, T)>);

impl<T: Serialize> Serialize for Ordered<T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (key, value) in &self.0 {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Router {
    entry_points: Vec<String>,
    rule: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    middlewares: Vec<String>,
    service: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Service {
    load_balancer: LoadBalancer,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct LoadBalancer {
    servers: Vec<Server>,
    pass_host_header: bool,
    health_check: HealthCheck,
}

#[derive(Debug, Serialize)]
struct Server {
    url: String,
}

#[derive(Debug, Serialize)]
struct HealthCheck {
    path: &'static str,
    interval: &'static str,
    timeout: &'static str,
}

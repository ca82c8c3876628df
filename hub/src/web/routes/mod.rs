//! The hub's routes as a reverse proxy sees them: one table, [`ROUTES`],
//! of every path the HTTP adapter ([`crate::web::api`]) serves, each with the
//! [`Policy`] that decides who may reach it, and the export of that table
//! as a Traefik dynamic configuration ([`traefik`]). A route added to the
//! hub is added to [`ROUTES`] and nowhere else: the export and
//! `websub routes` follow.
//!
//! ```
//! use websub_hub::web::routes::{Policy, ROUTES};
//!
//! let protected: Vec<String> = ROUTES
//!     .iter()
//!     .filter(|route| route.policy == Policy::Protected)
//!     .map(|route| route.path.to_string())
//!     .collect();
//! assert!(protected.contains(&"/api/v1/subscriptions".to_owned()));
//! ```

pub mod traefik;

#[cfg(test)]
mod tests;

use std::fmt;

/// Who may reach a route, and what the proxy puts in front of it. The
/// three shared policies (enriched, protected, admin) are the platform's
/// forward-auth middlewares; the proxy runs them, the hub does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Policy {
    /// Anyone, on the public entry points, with no middleware. WebSub
    /// publishers and subscribers are anonymous, or send a user token the
    /// hub checks itself (the quota needs its subject, not a proxy's
    /// opinion of it).
    Public,
    /// On the public entry points behind the shared middlewares that add
    /// the user when a token comes with the request and let it through
    /// without one.
    Enriched,
    /// On the public entry points behind the shared middlewares that
    /// require a valid user token.
    Protected,
    /// On the public entry points behind the shared middlewares that
    /// require an administrator's token.
    Admin,
    /// Never on a public entry point: only on the internal entry points,
    /// when there are any, with no middleware. The operator's routes
    /// check the internal key themselves; a route of this policy that does
    /// not (`/metrics`) relies on the internal network alone.
    Internal,
}

impl Policy {
    /// Every policy, in the order the docs list them.
    pub const ALL: [Policy; 5] = [
        Policy::Public,
        Policy::Enriched,
        Policy::Protected,
        Policy::Admin,
        Policy::Internal,
    ];

    /// The policy's name, as `websub routes` prints it.
    pub const fn name(self) -> &'static str {
        match self {
            Policy::Public => "public",
            Policy::Enriched => "enriched",
            Policy::Protected => "protected",
            Policy::Admin => "admin",
            Policy::Internal => "internal",
        }
    }

    /// Whether the policy is one of the shared forward-auth ones, whose
    /// middlewares an environment may replace.
    pub const fn is_shared(self) -> bool {
        matches!(self, Policy::Enriched | Policy::Protected | Policy::Admin)
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which request paths a route answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathMatch {
    /// This path exactly.
    Exact(&'static str),
    /// Every path below this one, which ends with `/`.
    Below(&'static str),
    /// This path and every path below it: `/admin` and `/admin/…`, but not
    /// `/administrator`.
    Tree(&'static str),
}

impl fmt::Display for PathMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathMatch::Exact(path) => f.write_str(path),
            PathMatch::Below(path) => write!(f, "{path}…"),
            PathMatch::Tree(path) => write!(f, "{path}, {path}/…"),
        }
    }
}

/// One entry of the route table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// A short name, unique in the table: the proxy's router is named
    /// after it.
    pub name: &'static str,
    /// The paths it answers.
    pub path: PathMatch,
    /// Who may reach it.
    pub policy: Policy,
}

/// Every path the hub serves, with its policy.
pub const ROUTES: &[Route] = &[
    Route {
        name: "hub",
        path: PathMatch::Exact("/"),
        policy: Policy::Public,
    },
    Route {
        name: "topics",
        path: PathMatch::Below("/topics/"),
        policy: Policy::Public,
    },
    Route {
        name: "openapi",
        path: PathMatch::Exact("/api/v1/openapi.json"),
        policy: Policy::Public,
    },
    Route {
        name: "healthz",
        path: PathMatch::Exact("/healthz"),
        policy: Policy::Public,
    },
    Route {
        name: "readyz",
        path: PathMatch::Exact("/readyz"),
        policy: Policy::Public,
    },
    Route {
        name: "subscriptions",
        path: PathMatch::Exact("/api/v1/subscriptions"),
        policy: Policy::Protected,
    },
    Route {
        name: "usage",
        path: PathMatch::Exact("/api/v1/usage"),
        policy: Policy::Protected,
    },
    Route {
        name: "verifications",
        path: PathMatch::Exact("/api/v1/verifications"),
        policy: Policy::Protected,
    },
    Route {
        name: "portal",
        path: PathMatch::Tree("/portal"),
        policy: Policy::Public,
    },
    Route {
        name: "operator",
        path: PathMatch::Below("/api/v1/operator/"),
        policy: Policy::Internal,
    },
    Route {
        name: "admin",
        path: PathMatch::Tree("/admin"),
        policy: Policy::Internal,
    },
    Route {
        name: "metrics",
        path: PathMatch::Exact("/metrics"),
        policy: Policy::Internal,
    },
];

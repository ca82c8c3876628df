//! `websub routes`: the hub's routes with their policies, or a Traefik
//! file-provider configuration routing them (the table and the export are
//! `websub_hub::web::routes`'). A refused setting is named by the flag or
//! variable it came from, with exit code 2.

use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args};
use websub_hub::web::routes::traefik::{
    DEFAULT_ADMIN_MIDDLEWARES, DEFAULT_ENRICHED_MIDDLEWARES, DEFAULT_ENTRY_POINT, DEFAULT_NAME,
    DEFAULT_PROTECTED_MIDDLEWARES, DEFAULT_SERVICE_URL, Setting, TraefikConfig, split_list,
};
use websub_hub::web::routes::{Policy, ROUTES};

use crate::table::Table;

/// `websub routes`. The lists are comma-separated, as the
/// `TRAEFIK_MIDDLEWARES_*` variables shared by an environment's services
/// hold them; an empty entry or one holding whitespace is refused.
#[derive(Debug, clap::Args)]
pub(crate) struct RoutesArgs {
    /// Print the Traefik dynamic configuration (TOML, file provider).
    #[arg(long)]
    traefik: bool,
    /// The prefix of the routers' names and the service's name.
    #[arg(long, env = "WEBSUB_TRAEFIK_NAME", default_value = DEFAULT_NAME)]
    name: String,
    /// The hub's public host name, matched by every rule (without it the
    /// routes answer on every host of their entry points).
    #[arg(long, env = "WEBSUB_TRAEFIK_HOST")]
    host: Option<String>,
    /// The entry points of the public routes.
    #[arg(long, value_name = "LIST", env = "WEBSUB_TRAEFIK_ENTRY_POINTS",
          default_value = DEFAULT_ENTRY_POINT)]
    entry_points: String,
    /// The entry points of the internal routes (operator API, /admin,
    /// /metrics); without them those routes are not routed at all.
    #[arg(
        long,
        value_name = "LIST",
        env = "WEBSUB_TRAEFIK_INTERNAL_ENTRY_POINTS"
    )]
    internal_entry_points: Option<String>,
    /// The hub's URLs as Traefik reaches them (one per replica).
    #[arg(long, value_name = "LIST", env = "WEBSUB_TRAEFIK_SERVICE_URL",
          default_value = DEFAULT_SERVICE_URL)]
    service_url: String,
    /// The middlewares of the enriched policy.
    #[arg(long, value_name = "LIST", env = "TRAEFIK_MIDDLEWARES_ENRICHED",
          default_value_t = DEFAULT_ENRICHED_MIDDLEWARES.join(","))]
    enriched_middlewares: String,
    /// The middlewares of the protected policy (the subscriber API).
    #[arg(long, value_name = "LIST", env = "TRAEFIK_MIDDLEWARES_PROTECTED",
          default_value_t = DEFAULT_PROTECTED_MIDDLEWARES.join(","))]
    protected_middlewares: String,
    /// The middlewares of the admin policy.
    #[arg(long, value_name = "LIST", env = "TRAEFIK_MIDDLEWARES_ADMIN",
          default_value_t = DEFAULT_ADMIN_MIDDLEWARES.join(","))]
    admin_middlewares: String,
}

impl RoutesArgs {
    fn config(&self) -> TraefikConfig {
        TraefikConfig {
            name: self.name.clone(),
            host: self.host.clone(),
            entry_points: split_list(&self.entry_points),
            internal_entry_points: self
                .internal_entry_points
                .as_deref()
                .map(split_list)
                .unwrap_or_default(),
            service_urls: split_list(&self.service_url),
            enriched_middlewares: split_list(&self.enriched_middlewares),
            protected_middlewares: split_list(&self.protected_middlewares),
            admin_middlewares: split_list(&self.admin_middlewares),
        }
    }
}

/// Where a setting's value came from, as the operator would look for it:
/// the variable when the environment gave it, the flag otherwise.
fn source_of(matches: &ArgMatches, setting: Setting) -> String {
    let id = match setting {
        Setting::Host => "host",
        Setting::EntryPoints => "entry_points",
        Setting::InternalEntryPoints => "internal_entry_points",
        Setting::ServiceUrls => "service_url",
        Setting::Middlewares(Policy::Enriched) => "enriched_middlewares",
        Setting::Middlewares(Policy::Protected) => "protected_middlewares",
        Setting::Middlewares(Policy::Admin) => "admin_middlewares",
        Setting::Name => "name",
        // Nothing else comes from this command's arguments.
        _ => return setting.to_string(),
    };
    let arg = RoutesArgs::augment_args(clap::Command::new("routes"))
        .get_arguments()
        .find(|arg| arg.get_id() == id)
        .cloned();
    let flag = arg
        .as_ref()
        .and_then(clap::Arg::get_long)
        .map_or_else(|| id.to_owned(), |long| format!("--{long}"));
    match (
        matches.value_source(id),
        arg.as_ref().and_then(clap::Arg::get_env),
    ) {
        (Some(ValueSource::EnvVariable), Some(variable)) => variable.to_string_lossy().into_owned(),
        _ => flag,
    }
}

pub(crate) fn routes(args: &RoutesArgs, matches: &ArgMatches) -> ExitCode {
    let config = args.config();
    // The listing is checked too, so that a bad environment shows before
    // anything is exported with it.
    let exported = config.validate().and_then(|()| {
        if args.traefik {
            config.export().map(Some)
        } else {
            Ok(None)
        }
    });
    match exported {
        Ok(Some(toml)) => print!("{toml}"),
        Ok(None) => list_routes(&config),
        Err(error) => {
            eprintln!("websub: {}: {error}", source_of(matches, error.setting()));
            return ExitCode::from(2);
        }
    }
    ExitCode::SUCCESS
}

/// Each route with its policy, where it is routed and behind what.
fn list_routes(config: &TraefikConfig) {
    let mut table = Table::new(["PATH", "POLICY", "ENTRY POINTS", "MIDDLEWARES"]);
    for route in ROUTES {
        let served = match route.policy {
            Policy::Internal if config.internal_entry_points.is_empty() => "not routed".to_owned(),
            Policy::Internal => config.internal_entry_points.join(","),
            _ => config.entry_points.join(","),
        };
        table.row([
            route.path.to_string(),
            route.policy.name().to_owned(),
            served,
            config.middlewares(route.policy).join(","),
        ]);
    }
    print!("{table}");
}

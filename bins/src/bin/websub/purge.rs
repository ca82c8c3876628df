//! `websub purge --older-than D`: retention on demand, e.g. from cron, in
//! one of two forms, chosen by the flags given:
//!
//! - the database form, `--database-url URL` with `--schema`,
//!   `--outbox-table`, `--deliveries-table`: deletes a producer's outbox
//!   events older than D, with their delivery rows, in its own database;
//! - the hub form, `--hub URL` with `--json`, `--internal-api-key-header`:
//!   asks the hub to delete the events of its own event log older than D,
//!   with their deliveries (the operator API's `POST purge`).
//!
//! Flags of both forms together are refused, naming them. With neither
//! form's flags the environment decides (`DATABASE_URL` or `WEBSUB_HUB`),
//! and is refused when it has both or neither: a purge never guesses.

use std::process::ExitCode;

use clap::ArgMatches;
use clap::parser::ValueSource;
use serde_json::json;
use websub_hub::config::parse_duration;

use crate::client::{Failure, Hub, Output, cell};
use crate::outbox::{TableNames, purge};

/// `websub purge`.
#[derive(Debug, clap::Args)]
pub(crate) struct PurgeArgs {
    /// Delete what was recorded longer ago than this, e.g. 30d or 12h.
    #[arg(long, value_name = "DURATION")]
    older_than: String,
    /// The producer's database (the database form).
    #[arg(long, value_name = "URL", env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    #[command(flatten)]
    tables: TableNames,
    /// The hub's URL (the hub form: its own event log).
    #[arg(long, value_name = "URL", env = "WEBSUB_HUB")]
    hub: Option<String>,
    #[command(flatten)]
    output: Output,
}

/// The flags of each form, by argument id and as spelled.
const DATABASE_FLAGS: [(&str, &str); 4] = [
    ("database_url", "--database-url"),
    ("schema", "--schema"),
    ("outbox_table", "--outbox-table"),
    ("deliveries_table", "--deliveries-table"),
];
const HUB_FLAGS: [(&str, &str); 3] = [
    ("hub", "--hub"),
    ("json", "--json"),
    ("internal_api_key_header", "--internal-api-key-header"),
];

/// What a purge deletes.
#[derive(Debug, PartialEq, Eq)]
enum Form {
    /// A producer's outbox events, in its database.
    Database(String),
    /// The hub's own events, through its operator API.
    Hub(String),
}

/// The form the command line and the environment choose.
fn form(args: &PurgeArgs, matches: &ArgMatches) -> Result<Form, Failure> {
    let given = |flags: &[(&'static str, &'static str)]| -> Vec<&'static str> {
        flags
            .iter()
            .filter(|(id, _)| matches.value_source(id) == Some(ValueSource::CommandLine))
            .map(|(_, flag)| *flag)
            .collect()
    };
    let (database, hub) = (given(&DATABASE_FLAGS), given(&HUB_FLAGS));
    let database_url = || {
        args.database_url
            .clone()
            .map(Form::Database)
            .ok_or_else(|| {
                Failure::Usage(format!(
                    "{} purge a producer's outbox: name its database with --database-url or \
                 DATABASE_URL",
                    database.join(", ")
                ))
            })
    };
    let hub_url = || {
        args.hub.clone().map(Form::Hub).ok_or_else(|| {
            Failure::Usage(format!(
                "{} purge the hub's event log: name the hub with --hub or WEBSUB_HUB",
                hub.join(", ")
            ))
        })
    };
    match (database.is_empty(), hub.is_empty()) {
        (false, false) => Err(Failure::Usage(format!(
            "{} (a producer's outbox) and {} (the hub's event log) are two forms of purge; \
             give the flags of one",
            database.join(", "),
            hub.join(", ")
        ))),
        (false, true) => database_url(),
        (true, false) => hub_url(),
        (true, true) => match (&args.database_url, &args.hub) {
            (Some(_), Some(_)) => Err(Failure::Usage(
                "both DATABASE_URL and WEBSUB_HUB are set: choose what to purge with \
                 --database-url (a producer's outbox) or --hub (the hub's event log)"
                    .to_owned(),
            )),
            (Some(url), None) => Ok(Form::Database(url.clone())),
            (None, Some(url)) => Ok(Form::Hub(url.clone())),
            (None, None) => Err(Failure::Usage(
                "name what to purge: --database-url URL (a producer's outbox) or --hub URL \
                 (the hub's event log)"
                    .to_owned(),
            )),
        },
    }
}

/// Runs `websub purge`; `matches` are its own, to tell flags from
/// variables.
pub(crate) async fn run(args: PurgeArgs, matches: &ArgMatches) -> ExitCode {
    match purge_as_asked(args, matches).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => failure.report(),
    }
}

async fn purge_as_asked(args: PurgeArgs, matches: &ArgMatches) -> Result<(), Failure> {
    let form = form(&args, matches)?;
    let older_than = parse_duration("older-than", &args.older_than)
        .map_err(|error| Failure::Usage(format!("--{error}")))?;
    match form {
        Form::Database(url) => {
            let tables = args
                .tables
                .resolve()
                .map_err(|error| Failure::Usage(error.to_string()))?;
            let deleted = purge(&url, &tables, older_than)
                .await
                .map_err(Failure::Unreachable)?;
            println!("deleted {deleted} expired outbox events");
        }
        Form::Hub(url) => {
            let seconds = older_than.as_secs();
            if seconds == 0 {
                return Err(Failure::Usage(format!(
                    "--older-than {:?}: the hub purges by whole seconds, at least 1s",
                    args.older_than
                )));
            }
            let hub = Hub::connect(&url, &args.output)?;
            let answer = hub
                .post("purge", &json!({ "older_than_seconds": seconds }))
                .await?;
            hub.print(&answer, |answer| {
                format!(
                    "deleted {} events recorded before {}, with their deliveries\n",
                    cell(&answer["deleted"]),
                    cell(&answer["cutoff"])
                )
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, FromArgMatches};

    use super::*;
    use crate::Cli;

    /// The form `websub purge ARGS` chooses.
    fn form_of(args: &[&str]) -> Result<Form, String> {
        let matches = Cli::command()
            .try_get_matches_from(["websub", "purge"].iter().chain(args))
            .map_err(|error| error.to_string())?;
        let matches = matches.subcommand_matches("purge").expect("purge");
        let args = PurgeArgs::from_arg_matches(matches).map_err(|error| error.to_string())?;
        form(&args, matches).map_err(|failure| failure.to_string())
    }

    #[test]
    fn the_flags_choose_the_form_and_a_mix_is_refused() {
        // The variables would decide when no flag does; these cases do not
        // depend on them.
        assert_eq!(
            form_of(&["--older-than", "30d", "--database-url", "postgres://db/app"]),
            Ok(Form::Database("postgres://db/app".to_owned()))
        );
        assert_eq!(
            form_of(&["--older-than", "30d", "--hub", "http://127.0.0.1:8080/"]),
            Ok(Form::Hub("http://127.0.0.1:8080/".to_owned()))
        );
        let mixed = form_of(&[
            "--older-than",
            "30d",
            "--hub",
            "http://127.0.0.1:8080/",
            "--schema",
            "shop",
            "--json",
        ])
        .expect_err("a mix is refused");
        for flag in ["--hub", "--schema", "--json"] {
            assert!(mixed.contains(flag), "{mixed}");
        }
        assert!(
            form_of(&[
                "--older-than",
                "30d",
                "--database-url",
                "postgres://db/app",
                "--json"
            ])
            .is_err()
        );
    }
}

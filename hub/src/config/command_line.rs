//! The command line of a hub binary: `--config` and every setting as a
//! flag and a `WEBSUB_*` variable, loaded as layers over the defaults.

use std::ffi::OsString;

use crate::config::text::ConfigError;

use super::{HubConfig, Settings};

/// A hub binary's command line: `--config FILE` and every [`Settings`]
/// field as a flag, each also read from the environment variable named
/// after it (`--delivery-timeout` is `WEBSUB_DELIVERY_TIMEOUT`).
///
/// The variables are not clap's own `env` arguments: clap reads those from
/// the process environment as the command is built, so nothing could hand
/// it another, and a bad value would be blamed on the flag. They are looked
/// up through the function given to [`CommandLine::load`] and parsed as
/// their flags are, into a layer of their own.
///
/// ```
/// use websub_hub::config::CommandLine;
///
/// let command = clap::Command::new("websubd");
/// let config = CommandLine::load(command, ["websubd", "--delivery-retries", "3"], |name| {
///     (name == "WEBSUB_DELIVERY_RETRIES").then(|| "5".into())
/// })
/// .expect("valid");
/// assert_eq!(config.delivery.retry.max_retries, 3, "the flag beats the environment");
/// ```
#[derive(Debug, Clone, Default, clap::Args)]
pub struct CommandLine {
    /// The TOML file: the layer below the environment and the flags.
    #[arg(
        long,
        value_name = "FILE",
        help = "A TOML file with any of the settings below, named with underscores \
                (delivery_timeout = \"5s\"), and the outbox feeds as [[feed]] tables"
    )]
    pub config: Option<std::path::PathBuf>,
    /// The flags (or the environment variables) themselves.
    #[command(flatten)]
    pub settings: Settings,
}

/// Why [`CommandLine::load`] gave no configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The flags are malformed, or ask for the help or the version;
    /// [`clap::Error::exit`] prints it and exits with the right status.
    #[error(transparent)]
    Command(#[from] clap::Error),
    /// A setting is bad, or the file cannot be read; the error names it.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// The environment variable a flag is also read from.
fn variable_of(long: &str) -> String {
    format!("WEBSUB_{}", long.to_ascii_uppercase().replace('-', "_"))
}

impl CommandLine {
    /// `command` with every argument added, each help line naming its
    /// environment variable and its default (from [`HubConfig::default`],
    /// so the help cannot drift from what the hub does).
    pub fn command(command: clap::Command) -> clap::Command {
        use clap::Args;
        let defaults = Settings::from(&HubConfig::default()).values();
        // The derive makes these types' docs the command's about text; the
        // binary's own is put back.
        let about = command.get_about().cloned();
        let long_about = command.get_long_about().cloned();
        let mut command = Self::augment_args(command)
            .about(None::<&str>)
            .long_about(None::<&str>);
        if let Some(about) = about {
            command = command.about(about);
        }
        if let Some(long_about) = long_about {
            command = command.long_about(long_about);
        }
        command.mut_args(|arg| {
            let Some(long) = arg.get_long() else {
                return arg;
            };
            let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
            let default = defaults
                .get(arg.get_id().as_str())
                .map_or("none", String::as_str);
            let variable = variable_of(long);
            arg.help(format!("{help} [env: {variable}] [default: {default}]"))
        })
    }

    /// The configuration `args` (the program name first) and the
    /// environment give: the defaults, then the file (`--config` or
    /// `WEBSUB_CONFIG`), then the `WEBSUB_*` variables, then the flags,
    /// later layers winning, validated once.
    ///
    /// `command` is the bare binary (its name, version and about); `env`
    /// looks a variable up (`std::env::var_os`, or a map in tests). Empty
    /// variables count as unset.
    pub fn load<I, T>(
        command: clap::Command,
        args: I,
        env: impl Fn(&str) -> Option<OsString>,
    ) -> Result<HubConfig, LoadError>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        use clap::FromArgMatches;
        let command = Self::command(command);
        // The flags first, so `--help` answers even beside a bad variable.
        let flags = Self::from_arg_matches(&command.clone().try_get_matches_from(args)?)?;
        let env = Self::from_env(&command, env)?;
        let file = match flags.config.as_ref().or(env.config.as_ref()) {
            Some(path) => Some(Settings::read(path)?),
            None => None,
        };
        Ok(HubConfig::layered(
            file.into_iter().chain([env.settings, flags.settings]),
        )?)
    }

    /// The environment layer. Each variable set is handed to the same
    /// parser as its flag (`--name=value`), so a value means the same in
    /// both; a value that does not parse is named by its variable.
    fn from_env(
        command: &clap::Command,
        env: impl Fn(&str) -> Option<OsString>,
    ) -> Result<Self, ConfigError> {
        use clap::FromArgMatches;
        let mut args = vec![OsString::from(command.get_name())];
        let mut read = Vec::new();
        for arg in command.get_arguments() {
            let Some(long) = arg.get_long() else {
                continue;
            };
            if !arg.get_action().takes_values() {
                continue;
            }
            let variable = variable_of(long);
            let Some(value) = env(&variable).filter(|value| !value.is_empty()) else {
                continue;
            };
            let Some(value) = value.to_str().map(str::to_owned) else {
                return Err(ConfigError::Environment {
                    variable,
                    value: value.to_string_lossy().into_owned(),
                    reason: "is not UTF-8".to_owned(),
                });
            };
            args.push(OsString::from(format!("--{long}={value}")));
            read.push((format!("--{long}"), variable, value));
        }
        let refused = |error: clap::Error| {
            let flag = match error.get(clap::error::ContextKind::InvalidArg) {
                Some(clap::error::ContextValue::String(arg)) => {
                    arg.split_whitespace().next().map(str::to_owned)
                }
                _ => None,
            };
            let (variable, value) = read
                .iter()
                .find(|(long, _, _)| Some(long) == flag.as_ref())
                .map_or_else(
                    || ("WEBSUB_*".to_owned(), String::new()),
                    |(_, variable, value)| (variable.clone(), value.clone()),
                );
            let reason = std::error::Error::source(&error)
                .map_or_else(|| error.kind().to_string(), ToString::to_string);
            ConfigError::Environment {
                variable,
                value,
                reason,
            }
        };
        let matches = command
            .clone()
            .try_get_matches_from(args)
            .map_err(&refused)?;
        Self::from_arg_matches(&matches).map_err(refused)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::time::Duration;

    use clap::error::{ContextKind, ContextValue, ErrorKind};

    use crate::config::settings::tests::{assert_the_new_settings, every_field_changed};

    fn websubd() -> clap::Command {
        clap::Command::new("websubd")
    }

    fn no_env(_: &str) -> Option<OsString> {
        None
    }

    fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> + use<> {
        let vars: HashMap<String, OsString> = vars
            .iter()
            .map(|(name, value)| ((*name).to_owned(), OsString::from(value)))
            .collect();
        move |name| vars.get(name).cloned()
    }

    fn load(args: &[&str], env: impl Fn(&str) -> Option<OsString>) -> Result<HubConfig, LoadError> {
        let args = std::iter::once("websubd").chain(args.iter().copied());
        CommandLine::load(websubd(), args, env)
    }

    /// Every setting of `config` as (flag, value) pairs.
    fn pairs(config: &HubConfig) -> Vec<(String, String)> {
        Settings::from(config)
            .values()
            .into_iter()
            .map(|(name, value)| (name.replace('_', "-"), value))
            .collect()
    }

    struct Scratch(std::path::PathBuf);

    impl Scratch {
        fn file(text: &str) -> Self {
            let path =
                std::env::temp_dir().join(format!("websub-config-{}.toml", uuid::Uuid::new_v4()));
            std::fs::write(&path, text).expect("write the file");
            Self(path)
        }

        fn path(&self) -> &str {
            self.0.to_str().expect("a UTF-8 temporary path")
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn the_file_then_the_environment_then_the_flags() {
        let file = Scratch::file(
            "delivery_timeout = \"3s\"\ndelivery_retries = 3\npoll_interval = \"3s\"\n\
             allow_private_network = true\n\
             [[feed]]\ndatabase_url = \"postgres://producer@db.example/app\"\n",
        );
        let env = env_of(&[
            ("WEBSUB_CONFIG", file.path()),
            ("WEBSUB_DELIVERY_RETRIES", "4"),
            ("WEBSUB_POLL_INTERVAL", "4s"),
            ("WEBSUB_QUOTA_TYPE", ""),
        ]);
        let config = load(
            &["--poll-interval", "5s", "--allow-private-network=false"],
            env,
        )
        .expect("valid");
        assert_eq!(config.delivery.timeout, Duration::from_secs(3), "file");
        assert_eq!(config.delivery.retry.max_retries, 4, "env over file");
        assert_eq!(
            config.poll_interval,
            Duration::from_secs(5),
            "flag over env"
        );
        assert!(!config.allow_private_network, "flag over file");
        assert_eq!(config.feeds.len(), 1, "feeds from the file stay");
        assert_eq!(
            config.quota_type,
            HubConfig::default().quota_type,
            "an empty variable is unset"
        );

        // `--config` beats `WEBSUB_CONFIG` like any flag.
        let other = Scratch::file("delivery_timeout = \"6s\"\n");
        let env = env_of(&[("WEBSUB_CONFIG", file.path())]);
        let config = load(&["--config", other.path()], env).expect("valid");
        assert_eq!(config.delivery.timeout, Duration::from_secs(6));
    }

    #[test]
    fn every_field_is_settable_from_flags_and_from_the_environment() {
        let expected = every_field_changed();
        let pairs = pairs(&expected);
        let flags: Vec<String> = pairs
            .iter()
            .map(|(flag, value)| format!("--{flag}={value}"))
            .collect();
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let config = load(&flags, no_env).expect("valid");
        assert_eq!(format!("{config:?}"), format!("{expected:?}"), "{flags:?}");

        let vars: Vec<(String, String)> = pairs
            .iter()
            .map(|(flag, value)| (variable_of(flag), value.clone()))
            .collect();
        let vars: Vec<(&str, &str)> = vars
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .collect();
        let config = load(&[], env_of(&vars)).expect("valid");
        assert_eq!(format!("{config:?}"), format!("{expected:?}"), "{vars:?}");
    }

    #[test]
    fn the_new_settings_have_their_flags() {
        let config = load(
            &[
                "--max-form-bytes",
                "1000",
                "--max-content-bytes",
                "2000",
                "--reaper-interval",
                "5m",
                "--verification-timeout",
                "3s",
                "--verification-concurrency",
                "11",
                "--delivery-batch-size",
                "42",
                "--header-read-timeout",
                "4s",
                "--idle-timeout",
                "20s",
                "--max-connections",
                "300",
            ],
            no_env,
        )
        .expect("valid");
        assert_the_new_settings(&config);
    }

    #[test]
    fn allow_private_network_is_a_bare_flag_or_a_value() {
        let config = load(
            &["--allow-private-network", "--poll-interval", "2s"],
            no_env,
        )
        .expect("valid");
        assert!(config.allow_private_network);
        assert_eq!(config.poll_interval, Duration::from_secs(2));
        let env = env_of(&[("WEBSUB_ALLOW_PRIVATE_NETWORK", "true")]);
        assert!(load(&[], env).expect("valid").allow_private_network);
        let env = env_of(&[("WEBSUB_ALLOW_PRIVATE_NETWORK", "true")]);
        let config = load(&["--allow-private-network", "false"], env).expect("valid");
        assert!(!config.allow_private_network);
        assert!(!load(&[], no_env).expect("valid").allow_private_network);
    }

    #[test]
    fn a_bad_flag_or_variable_names_its_setting() {
        match load(&["--delivery-batch-size", "many"], no_env) {
            Err(LoadError::Command(error)) => {
                assert_eq!(error.kind(), ErrorKind::ValueValidation);
                assert!(
                    matches!(
                        error.get(ContextKind::InvalidArg),
                        Some(ContextValue::String(arg)) if arg.starts_with("--delivery-batch-size")
                    ),
                    "{error}"
                );
            }
            other => panic!("{other:?}"),
        }
        match load(&["--verification-timeout", "soon"], no_env) {
            Err(LoadError::Config(ConfigError::Invalid { setting, .. })) => {
                assert_eq!(setting, "verification-timeout");
            }
            other => panic!("{other:?}"),
        }
        let env = env_of(&[
            ("WEBSUB_DELIVERY_RETRIES", "2"),
            ("WEBSUB_VERIFICATION_CONCURRENCY", "lots"),
        ]);
        match load(&[], env) {
            Err(LoadError::Config(ConfigError::Environment {
                variable, value, ..
            })) => {
                assert_eq!(variable, "WEBSUB_VERIFICATION_CONCURRENCY");
                assert_eq!(value, "lots");
            }
            other => panic!("{other:?}"),
        }
        let env = env_of(&[("WEBSUB_LISTEN", "nowhere")]);
        assert!(matches!(
            load(&[], env),
            Err(LoadError::Config(ConfigError::Environment { variable, .. }))
                if variable == "WEBSUB_LISTEN"
        ));
        // Every layer is checked, even where a later one overrides it.
        let env = env_of(&[("WEBSUB_DELIVERY_RETRIES", "x")]);
        assert!(matches!(
            load(&["--delivery-retries", "2"], env),
            Err(LoadError::Config(ConfigError::Environment { .. }))
        ));
    }

    #[test]
    fn the_help_names_every_setting_with_its_variable_and_default() {
        let mut command = CommandLine::command(websubd());
        let help = command.render_long_help().to_string();
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        let defaults = pairs(&HubConfig::default());
        let mut longs = Vec::new();
        for arg in command.get_arguments() {
            let Some(long) = arg.get_long() else {
                continue;
            };
            if !arg.get_action().takes_values() {
                continue;
            }
            longs.push(long.to_owned());
            let at = help
                .find(&format!("--{long} "))
                .unwrap_or_else(|| panic!("--{long} missing: {help}"));
            let rest = &help[at..];
            let shown = |label: &str| {
                rest.split(label)
                    .nth(1)
                    .and_then(|tail| tail.split(']').next())
            };
            assert_eq!(
                shown("[env: "),
                Some(variable_of(long).as_str()),
                "--{long}"
            );
            let default = defaults
                .iter()
                .find(|(flag, _)| flag == long)
                .map_or("none", |(_, value)| value.as_str());
            assert_eq!(shown("[default: "), Some(default), "--{long}");
        }
        // Every setting but the feeds, and the file.
        assert_eq!(longs.len(), pairs(&every_field_changed()).len() + 1);
    }
}

//! Settings as text: the error that names a bad setting and its value, and
//! the parsing of durations, shared by the hub's configuration, the outbox
//! dispatcher's, the feeds' and the quota's. A leaf: it imports nothing of
//! the crate, so every module that validates settings can use it.

use std::time::Duration;

/// A setting that failed validation, naming the setting and the value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A setting's value is out of range or malformed.
    #[error("invalid {setting} {value:?}: {reason}")]
    Invalid {
        /// The setting's name, as on the command line.
        setting: &'static str,
        /// The value given.
        value: String,
        /// Why it is refused.
        reason: String,
    },
    /// The configuration file could not be read or parsed.
    #[error("configuration file {path}: {reason}")]
    File {
        /// The file.
        path: String,
        /// What went wrong.
        reason: String,
    },
}

pub(crate) fn invalid(
    setting: &'static str,
    value: impl ToString,
    reason: impl Into<String>,
) -> ConfigError {
    ConfigError::Invalid {
        setting,
        value: value.to_string(),
        reason: reason.into(),
    }
}

pub(crate) fn secs(duration: Duration) -> String {
    format!("{}s", duration.as_secs_f64())
}

/// Parses `"250ms"`, `"10s"`, `"5m"`, `"2h"`, `"10d"` or a bare number of
/// seconds.
pub fn parse_duration(setting: &'static str, value: &str) -> Result<Duration, ConfigError> {
    let trimmed = value.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| invalid(setting, value, "expected a duration such as 10s, 5m or 10d"))?;
    let scale = match unit.trim() {
        "ms" => 0.001,
        "" | "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        other => {
            return Err(invalid(
                setting,
                value,
                format!("unknown unit {other:?} (use ms, s, m, h or d)"),
            ));
        }
    };
    Duration::try_from_secs_f64(number * scale).map_err(|_| invalid(setting, value, "out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(
            parse_duration("x", "10d").ok(),
            Some(Duration::from_secs(864_000))
        );
        assert_eq!(
            parse_duration("x", "250ms").ok(),
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            parse_duration("x", "90").ok(),
            Some(Duration::from_secs(90))
        );
        assert!(matches!(
            parse_duration("lease-min", "ten"),
            Err(ConfigError::Invalid {
                setting: "lease-min",
                ..
            })
        ));
        assert!(parse_duration("x", "5y").is_err());
    }
}

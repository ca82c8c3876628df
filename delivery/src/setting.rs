//! Settings as text: the error that names a bad setting and its value, and
//! the parsing and writing of durations, shared by the hub's configuration,
//! the outbox dispatcher's and the feeds'.

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
    /// A `WEBSUB_*` environment variable holds no value of its setting's
    /// type (a number, an address, `true` or `false`).
    #[error("invalid {variable} {value:?}: {reason}")]
    Environment {
        /// The variable, e.g. `WEBSUB_DELIVERY_RETRIES`.
        variable: String,
        /// The value it holds.
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

/// The error of `setting` refused at `value`, for `reason`.
pub fn invalid(
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

/// `duration` as a setting spells it in seconds (`1.5s`).
pub fn secs(duration: Duration) -> String {
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

/// Writes `duration` the way [`parse_duration`] reads it, in the largest
/// unit that divides it (`10d`, `5m`, `250ms`), so defaults read as they
/// would be typed.
pub fn format_duration(duration: Duration) -> String {
    if !duration.subsec_nanos().is_multiple_of(1_000_000) {
        return format!("{}s", duration.as_secs_f64());
    }
    if duration.subsec_millis() != 0 {
        return format!("{}ms", duration.as_millis());
    }
    let secs = duration.as_secs();
    for (unit, size) in [("d", 86_400), ("h", 3600), ("m", 60)] {
        if secs != 0 && secs.is_multiple_of(size) {
            return format!("{}{unit}", secs / size);
        }
    }
    format!("{secs}s")
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

    #[test]
    fn durations_are_written_in_their_largest_unit_and_read_back() {
        for (duration, text) in [
            (Duration::from_secs(864_000), "10d"),
            (Duration::from_secs(7200), "2h"),
            (Duration::from_secs(300), "5m"),
            (Duration::from_secs(90), "90s"),
            (Duration::from_millis(250), "250ms"),
            (Duration::from_millis(1500), "1500ms"),
            (Duration::ZERO, "0s"),
        ] {
            assert_eq!(format_duration(duration), text);
            assert_eq!(parse_duration("x", text).ok(), Some(duration), "{text}");
        }
    }
}

//! The deny list as subscribe requests meet it: the operator's patterns
//! ([`crate::storage::events::DenyList`]), compiled, and read again from
//! the log at most every [`REFRESH`] (at once after a change made through
//! this process), so that a burst of subscriptions costs no query each and
//! a pattern added on one replica denies on every one within seconds.
//!
//! A pattern matches a whole topic or callback URL: `*` matches any run of
//! characters (none included), everything else itself, case aside (hosts
//! are case-insensitive, and a deny list errs towards denying). `?` is an
//! ordinary character, as it is in URLs.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wildcard::{Wildcard, WildcardBuilder};

use crate::storage::events::{Denial, DeniedField, EventLog, EventLogError};

/// How long a read of the list is used before it is read again.
pub const REFRESH: Duration = Duration::from_secs(5);

/// The longest pattern accepted, in bytes: longer than any URL worth
/// matching, and bounded so matching stays cheap.
pub const MAX_PATTERN_BYTES: usize = 2048;

/// The longest reason accepted, in bytes (it travels in a URL's query).
pub const MAX_REASON_BYTES: usize = 512;

/// Checks subscribe requests against the deny list. Cheap to clone.
#[derive(Clone)]
pub struct Denials {
    log: Arc<dyn EventLog>,
    read: Arc<Mutex<Option<Read>>>,
}

/// One read of the list, compiled.
struct Read {
    at: Instant,
    patterns: Arc<[(DeniedField, Wildcard<'static>, String)]>,
}

impl std::fmt::Debug for Denials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Denials").finish_non_exhaustive()
    }
}

/// Why a pattern cannot be listed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    /// Empty, or only `*`: it would deny everything.
    #[error("the pattern must name something besides *")]
    Everything,
    /// Longer than [`MAX_PATTERN_BYTES`].
    #[error("the pattern is longer than {MAX_PATTERN_BYTES} bytes")]
    TooLong,
    /// The reason is empty or longer than [`MAX_REASON_BYTES`].
    #[error("the reason must be 1 to {MAX_REASON_BYTES} bytes")]
    Reason,
}

/// `pattern`, compiled, if it is one the list may hold.
pub fn compile(pattern: &str) -> Result<Wildcard<'static>, PatternError> {
    if pattern.len() > MAX_PATTERN_BYTES {
        return Err(PatternError::TooLong);
    }
    if pattern.chars().all(|c| c == '*') {
        return Err(PatternError::Everything);
    }
    WildcardBuilder::from_owned(pattern.as_bytes().to_vec())
        .without_one_metasymbol()
        .without_escape()
        .case_insensitive(true)
        .build()
        .map_err(|_| PatternError::Everything)
}

/// Whether `reason` may be sent as `hub.reason`.
pub fn check_reason(reason: &str) -> Result<(), PatternError> {
    if reason.trim().is_empty() || reason.len() > MAX_REASON_BYTES {
        Err(PatternError::Reason)
    } else {
        Ok(())
    }
}

impl Denials {
    /// The deny list kept in `log`.
    pub fn new(log: Arc<dyn EventLog>) -> Self {
        Self {
            log,
            read: Arc::new(Mutex::new(None)),
        }
    }

    /// The reason a subscription of `callback` to `topic` is denied, if a
    /// pattern matches either. A read of the list that fails is answered
    /// from the last one, when there was one.
    pub async fn denied(
        &self,
        topic: &str,
        callback: &str,
    ) -> Result<Option<String>, EventLogError> {
        let patterns = self.patterns().await?;
        Ok(patterns.iter().find_map(|(field, pattern, reason)| {
            let value = match field {
                DeniedField::Topic => topic,
                DeniedField::Callback => callback,
            };
            pattern.is_match(value.as_bytes()).then(|| reason.clone())
        }))
    }

    /// Has the next request read the list again: it changed.
    pub fn changed(&self) {
        *self.lock() = None;
    }

    async fn patterns(
        &self,
    ) -> Result<Arc<[(DeniedField, Wildcard<'static>, String)]>, EventLogError> {
        let stale = {
            let read = self.lock();
            match read.as_ref() {
                Some(read) if read.at.elapsed() < REFRESH => return Ok(read.patterns.clone()),
                Some(read) => Some(read.patterns.clone()),
                None => None,
            }
        };
        match self.log.denials().await {
            Ok(denials) => {
                let patterns: Arc<[_]> = denials.into_iter().filter_map(compiled).collect();
                *self.lock() = Some(Read {
                    at: Instant::now(),
                    patterns: patterns.clone(),
                });
                Ok(patterns)
            }
            Err(error) => match stale {
                Some(patterns) => {
                    tracing::warn!(%error, "the deny list could not be read; the last read is used");
                    Ok(patterns)
                }
                None => Err(error),
            },
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Read>> {
        self.read
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A listed pattern, compiled; one that no longer compiles (listed by an
/// older version) is left out, with a warning.
fn compiled(denial: Denial) -> Option<(DeniedField, Wildcard<'static>, String)> {
    match compile(&denial.pattern) {
        Ok(pattern) => Some((denial.field, pattern, denial.reason)),
        Err(error) => {
            tracing::warn!(id = %denial.id, %error, "a listed pattern is left out");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_star_matches_any_run_and_the_rest_matches_itself_case_aside() {
        let pattern = compile("https://*.spam.example/*").expect("a pattern");
        assert!(pattern.is_match(b"https://a.spam.example/cb"));
        assert!(pattern.is_match(b"HTTPS://B.Spam.Example/cb?x=1"));
        assert!(!pattern.is_match(b"https://spam.example.org/cb"));
        assert!(!pattern.is_match(b"http://a.spam.example/cb"));
        let literal = compile("https://hub.example/cb?id=1").expect("a pattern");
        assert!(literal.is_match(b"https://hub.example/cb?id=1"));
        assert!(
            !literal.is_match(b"https://hub.example/cbXid=1"),
            "? is itself"
        );
        assert!(
            !literal.is_match(b"https://hub.example/cb?id=12"),
            "whole URLs"
        );
    }

    #[test]
    fn a_pattern_of_everything_or_too_long_is_refused() {
        assert_eq!(compile("").err(), Some(PatternError::Everything));
        assert_eq!(compile("**").err(), Some(PatternError::Everything));
        assert_eq!(
            compile(&"a".repeat(MAX_PATTERN_BYTES + 1)).err(),
            Some(PatternError::TooLong)
        );
        assert_eq!(check_reason(" "), Err(PatternError::Reason));
        assert_eq!(
            check_reason(&"r".repeat(MAX_REASON_BYTES + 1)),
            Err(PatternError::Reason)
        );
        assert_eq!(check_reason("spam"), Ok(()));
    }
}

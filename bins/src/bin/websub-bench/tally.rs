//! What each callback received, read from nginx's access logs while a
//! scenario runs: a follower reads the lines appended since it started,
//! every few milliseconds, and keeps per callback path the events it got
//! (by the hub's event id), when it first got each, and how many requests
//! came twice. The times are nginx's own (`$msec`), so a delivery's time
//! does not depend on when the bench got round to reading the line.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::task::JoinHandle;

use crate::lock;

/// How often the logs are read.
const READ_EVERY: Duration = Duration::from_millis(10);

/// Milliseconds since the Unix epoch, the unit of nginx's `$msec`.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|since| since.as_millis() as u64)
        .unwrap_or_default()
}

/// One callback's receipts.
#[derive(Debug, Default)]
pub(crate) struct Received {
    /// The events received, by their order of first arrival anywhere, each
    /// once.
    pub(crate) events: Vec<u32>,
    /// When the first of them arrived, and the last new one.
    pub(crate) first_ms: u64,
    pub(crate) last_new_ms: u64,
    /// Deliveries of an event this callback already had.
    pub(crate) duplicates: u32,
}

/// Everything seen under one path prefix.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    /// Callback paths that answered a subscribe verification.
    verified: HashSet<Box<str>>,
    /// Per callback path.
    pub(crate) callbacks: HashMap<Box<str>, Received>,
    /// Event ids, numbered in order of first arrival.
    events: HashMap<Box<str>, u32>,
    /// Deliveries counted once per callback and event.
    pub(crate) distinct: usize,
    /// Deliveries counted again.
    pub(crate) duplicates: usize,
    /// Deliveries answered with anything but 2xx (nginx answers 204, so
    /// only a broken configuration gives these).
    pub(crate) refused: usize,
    /// The last new delivery, in ms since the epoch.
    pub(crate) last_new_ms: u64,
}

impl Tally {
    /// Takes one access-log line; those of other prefixes are skipped.
    fn take(&mut self, line: &str, prefix: &str) {
        let mut fields = line.split_ascii_whitespace();
        let (Some(msec), Some(method), Some(uri), Some(status), event) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            return;
        };
        if !uri.starts_with(prefix) {
            return;
        }
        let (path, query) = uri.split_once('?').unwrap_or((uri, ""));
        let ok = status.starts_with('2');
        match method {
            "GET"
                if ok && query.contains("hub.mode=subscribe") && !self.verified.contains(path) =>
            {
                self.verified.insert(path.into());
            }
            "POST" if !ok => self.refused += 1,
            "POST" => {
                let at = parse_msec(msec).unwrap_or_default();
                let event = event.unwrap_or("-");
                let next = u32::try_from(self.events.len()).unwrap_or(u32::MAX);
                let event = match self.events.get(event) {
                    Some(number) => *number,
                    None => {
                        self.events.insert(event.into(), next);
                        next
                    }
                };
                let received = match self.callbacks.get_mut(path) {
                    Some(received) => received,
                    None => self
                        .callbacks
                        .entry(path.into())
                        .or_insert_with(|| Received {
                            first_ms: at,
                            ..Received::default()
                        }),
                };
                if received.events.contains(&event) {
                    received.duplicates += 1;
                    self.duplicates += 1;
                } else {
                    received.events.push(event);
                    received.last_new_ms = received.last_new_ms.max(at);
                    self.distinct += 1;
                    self.last_new_ms = self.last_new_ms.max(at);
                }
            }
            _ => {}
        }
    }

    /// Callbacks that answered a verification.
    pub(crate) fn verified(&self) -> usize {
        self.verified.len()
    }

    /// How many distinct events arrived anywhere.
    pub(crate) fn events(&self) -> usize {
        self.events.len()
    }
}

/// `1796313021.280` as milliseconds.
fn parse_msec(msec: &str) -> Option<u64> {
    let (seconds, millis) = msec.split_once('.')?;
    Some(seconds.parse::<u64>().ok()? * 1000 + millis.parse::<u64>().ok()?)
}

/// Reads access logs from their current end, into a [`Tally`] of the lines
/// whose path starts with a prefix, until dropped.
#[derive(Debug)]
pub(crate) struct Follower {
    tally: Arc<Mutex<Tally>>,
    verified: Arc<AtomicUsize>,
    distinct: Arc<AtomicUsize>,
    reader: JoinHandle<()>,
}

impl Follower {
    /// Follows `logs` (they may not exist yet: nginx creates them) from
    /// their present ends, keeping the lines of paths under `prefix`.
    pub(crate) fn start(logs: &[PathBuf], prefix: &str) -> std::io::Result<Self> {
        let mut tails = Vec::with_capacity(logs.len());
        for log in logs {
            let offset = std::fs::metadata(log).map(|meta| meta.len()).unwrap_or(0);
            tails.push(Tail {
                path: log.clone(),
                offset,
                partial: Vec::new(),
            });
        }
        let tally = Arc::new(Mutex::new(Tally::default()));
        let verified = Arc::new(AtomicUsize::new(0));
        let distinct = Arc::new(AtomicUsize::new(0));
        let reader = tokio::spawn({
            let (tally, verified, distinct) = (tally.clone(), verified.clone(), distinct.clone());
            let prefix = prefix.to_owned();
            async move {
                let mut chunk = Vec::new();
                loop {
                    for tail in &mut tails {
                        chunk.clear();
                        if tail.read_new(&mut chunk).is_err() {
                            continue;
                        }
                        if chunk.is_empty() {
                            continue;
                        }
                        let mut tally = lock(&tally);
                        for line in chunk.split(|byte| *byte == b'\n') {
                            if let Ok(line) = std::str::from_utf8(line) {
                                tally.take(line, &prefix);
                            }
                        }
                        verified.store(tally.verified(), Ordering::Relaxed);
                        distinct.store(tally.distinct, Ordering::Relaxed);
                    }
                    tokio::time::sleep(READ_EVERY).await;
                }
            }
        });
        Ok(Self {
            tally,
            verified,
            distinct,
            reader,
        })
    }

    /// The tally so far.
    pub(crate) fn tally(&self) -> MutexGuard<'_, Tally> {
        lock(&self.tally)
    }

    /// Callbacks verified so far, for a progress bar.
    pub(crate) fn verified(&self) -> Arc<AtomicUsize> {
        self.verified.clone()
    }

    /// Distinct deliveries so far, for a progress bar.
    pub(crate) fn distinct(&self) -> Arc<AtomicUsize> {
        self.distinct.clone()
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// One log being followed.
#[derive(Debug)]
struct Tail {
    path: PathBuf,
    offset: u64,
    /// The end of the last read, when it stopped inside a line.
    partial: Vec<u8>,
}

impl Tail {
    /// Appends the complete lines added since the last read to `chunk`.
    fn read_new(&mut self, chunk: &mut Vec<u8>) -> std::io::Result<()> {
        let mut file = match std::fs::File::open(&self.path) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(error),
        };
        file.seek(SeekFrom::Start(self.offset))?;
        chunk.append(&mut self.partial);
        let read = file.read_to_end(chunk)?;
        self.offset += read as u64;
        if let Some(end) = chunk.iter().rposition(|byte| *byte == b'\n') {
            self.partial = chunk.split_off(end + 1);
        } else {
            self.partial = std::mem::take(chunk);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deliveries_are_counted_once_per_callback_and_event() {
        let mut tally = Tally::default();
        for line in [
            "1796313021.280 GET /cb/r1/0/1?hub.mode=subscribe&hub.challenge=abc 200 -",
            "1796313021.290 GET /cb/r1/0/1?hub.mode=subscribe&hub.challenge=def 200 -",
            "1796313022.001 POST /cb/r1/0/1 204 e1",
            "1796313022.002 POST /cb/r1/0/1 204 e1",
            "1796313022.003 POST /cb/r1/0/2 204 e1",
            "1796313022.004 POST /cb/r1/0/2 204 e2",
            "1796313022.005 POST /cb/r2/0/2 204 e2",
            "1796313022.006 POST /ceiling 204 -",
            "1796313022.007 POST /cb/r1/0/3 502 e1",
            "truncated",
        ] {
            tally.take(line, "/cb/r1/");
        }
        assert_eq!(tally.verified(), 1);
        assert_eq!(tally.distinct, 3);
        assert_eq!(tally.duplicates, 1);
        assert_eq!(tally.refused, 1);
        assert_eq!(tally.events(), 2);
        assert_eq!(tally.last_new_ms, 1_796_313_022_004);
        let second = &tally.callbacks["/cb/r1/0/2"];
        assert_eq!(
            (second.events.len(), second.first_ms),
            (2, 1_796_313_022_003)
        );
    }

    #[test]
    fn msec_is_read_to_the_millisecond() {
        assert_eq!(parse_msec("1796313021.280"), Some(1_796_313_021_280));
        assert_eq!(parse_msec("1796313021"), None);
    }
}

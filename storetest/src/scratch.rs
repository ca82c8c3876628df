//! Scratch files and directories for tests: all of a test process's under
//! one directory of its own in the system's temporary directory
//! (`websub-tests-<pid>`). A test process removes, when it first asks for
//! one, the directories of test processes that have ended, however they
//! ended (a failed assertion, a kill), so runs leave at most the last
//! one's files behind rather than piling up.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

const PREFIX: &str = "websub-tests-";

/// A fresh path in this process's scratch directory, its file name
/// ending with `name`. Nothing is created at it.
pub fn path(name: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let number = NEXT.fetch_add(1, Ordering::Relaxed);
    own_directory().join(format!("{number}-{name}"))
}

/// A fresh, empty directory in this process's scratch directory.
pub fn directory(name: &str) -> PathBuf {
    let path = path(name);
    std::fs::create_dir_all(&path)
        .unwrap_or_else(|error| panic!("create {}: {error}", path.display()));
    path
}

/// The URL of a fresh SQLite database file (created by whoever opens it).
pub fn sqlite_url(name: &str) -> String {
    format!("sqlite:{}", path(&format!("{name}.db")).display())
}

/// This process's scratch directory, created on first use after the
/// directories of ended test processes are removed.
fn own_directory() -> &'static PathBuf {
    static DIRECTORY: OnceLock<PathBuf> = OnceLock::new();
    DIRECTORY.get_or_init(|| {
        let temporary = std::env::temp_dir();
        remove_ended(&temporary);
        let own = temporary.join(format!("{PREFIX}{}", std::process::id()));
        std::fs::create_dir_all(&own)
            .unwrap_or_else(|error| panic!("create {}: {error}", own.display()));
        own
    })
}

/// Removes the scratch directories under `temporary` whose process has
/// ended. Whether a process runs is read from `/proc`; without it (not
/// Linux), nothing is removed.
fn remove_ended(temporary: &std::path::Path) {
    let proc = std::path::Path::new("/proc");
    if !proc.join("self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(temporary) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|name| name.strip_prefix(PREFIX))
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !proc.join(pid.to_string()).exists() {
            // Another process may be removing it too: what is gone is gone.
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ended_process_s_directory_goes_and_a_running_one_s_stays() {
        let temporary = std::env::temp_dir().join(format!("{PREFIX}sweep-{}", std::process::id()));
        std::fs::create_dir_all(&temporary).expect("a directory to sweep");
        // No process has pid u32::MAX (Linux caps them far below), and
        // this one runs.
        let ended = temporary.join(format!("{PREFIX}{}", u32::MAX));
        let running = temporary.join(format!("{PREFIX}{}", std::process::id()));
        let unrelated = temporary.join("websub-something-else");
        for directory in [&ended, &running, &unrelated] {
            std::fs::create_dir_all(directory.join("inner")).expect("create");
        }
        remove_ended(&temporary);
        assert_eq!(
            (ended.exists(), running.exists(), unrelated.exists()),
            (!std::path::Path::new("/proc/self").exists(), true, true)
        );
        std::fs::remove_dir_all(&temporary).expect("clean up");
    }

    #[test]
    fn paths_are_fresh_and_inside_this_process_s_directory() {
        let (first, second) = (path("a"), path("a"));
        assert_ne!(first, second);
        assert!(first.starts_with(own_directory()));
        assert!(sqlite_url("b").starts_with("sqlite:"));
        assert!(directory("c").is_dir());
    }
}

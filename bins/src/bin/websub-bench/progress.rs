//! The progress bar a long measurement shows on stderr while it runs: a
//! count of what arrived out of what is expected, read from a counter the
//! measurement already keeps, so drawing it adds nothing to the measured
//! path. indicatif draws nothing when stderr is not a terminal, so logs of
//! scripted runs keep only the table.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use tokio::task::JoinHandle;

/// How often the bar reads the counter.
const REFRESH: Duration = Duration::from_millis(100);

/// A bar that follows `done` up to `total` until it is finished or dropped.
pub(crate) struct Progress {
    bar: ProgressBar,
    follower: JoinHandle<()>,
}

impl Progress {
    pub(crate) fn follow(label: &str, total: usize, done: Arc<AtomicUsize>) -> Self {
        let bar = ProgressBar::new(total as u64);
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} ({per_sec}, {eta} left)",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_prefix(label.to_owned());
        let follower = tokio::spawn({
            let bar = bar.clone();
            async move {
                loop {
                    bar.set_position(done.load(Ordering::Relaxed) as u64);
                    tokio::time::sleep(REFRESH).await;
                }
            }
        });
        Self { bar, follower }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.follower.abort();
        self.bar.finish_and_clear();
    }
}

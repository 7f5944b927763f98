//! An append-only log file whose every line is on disk before it returns: the test
//! workers' record of deliveries and decisions, which a SIGKILL must not lose (included by
//! `crash-worker` and `race-worker` with `#[path]`).

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::Path;
use std::sync::Mutex;

/// An append-only file whose every line is on disk before `line` returns.
pub struct DurableLog(Mutex<File>);

impl DurableLog {
    /// Open (or create) the log at `path` for appending.
    pub fn open(path: &Path) -> Self {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
        Self(Mutex::new(file))
    }

    /// Append `text` and a newline, synced before returning.
    pub fn line(&self, text: &str) {
        let mut file = self.0.lock().unwrap_or_else(|p| p.into_inner());
        file.write_all(format!("{text}\n").as_bytes())
            .and_then(|()| file.sync_data())
            .expect("durable log write");
    }
}

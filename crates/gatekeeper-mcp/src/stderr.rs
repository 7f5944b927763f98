//! A stdio server's standard error: captured, never inherited. Whatever a server writes
//! there (escape sequences that clear a terminal, a line dressed as one of the gate's
//! own) reaches the gate's log only as one sanitized, delimited, size-capped field of a
//! line the gate writes, under the server's name (`downstream.stderr`), at most
//! [`STDERR_LINES_PER_SECOND`] lines a second (the first drop of each second is said
//! once). The last [`KEPT_LINES`] lines are kept, so that a server that fails to start is
//! reported with its own last words ([`StderrTail::last_words`]).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use prompt_sanitize::untrusted_label;
use tokio::process::ChildStderr;
use tokio::sync::Notify;
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};
use tracing::{info, warn};

use crate::limit::{Limiter, Verdict};

/// The most characters of one stderr line the gate keeps or logs.
pub const MAX_LINE_CHARS: usize = 400;
/// The longest line read whole, in bytes; a longer one is cut.
pub const MAX_LINE_BYTES: usize = 64 * 1024;
/// The most stderr lines of one server logged a second.
pub const STDERR_LINES_PER_SECOND: u32 = 20;
/// How many of the last lines are kept for a failed start's report.
pub const KEPT_LINES: usize = 8;

/// The last lines a server wrote to its standard error, sanitized.
#[derive(Debug, Default)]
pub struct StderrTail {
    /// The server's configured name, under which its lines are logged.
    server: String,
    lines: Mutex<VecDeque<String>>,
    /// Told when the stream ends (the process closed its stderr or exited).
    ended: Notify,
}

impl StderrTail {
    /// The tail of server `server`'s stderr.
    pub fn named(server: impl Into<String>) -> Self {
        Self {
            server: server.into(),
            ..Self::default()
        }
    }

    fn push(&self, line: String) {
        let mut lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        if lines.len() == KEPT_LINES {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    /// The last lines, oldest first.
    pub fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    /// The last lines, for a message about a failed start: waits (at most `wait`) for a
    /// process that is exiting to finish writing. Empty when it wrote nothing.
    pub async fn last_words(&self, wait: Duration) -> String {
        let _ = tokio::time::timeout(wait, self.ended.notified()).await;
        let lines = self.lines();
        if lines.is_empty() {
            return String::new();
        }
        format!("; its last words on stderr: {}", lines.join(" "))
    }
}

/// Read a server's `stderr` until it ends, logging each line sanitized under the server's
/// name and keeping the last ones in `tail`.
pub fn watch(stderr: ChildStderr, tail: Arc<StderrTail>) {
    tokio::spawn(async move {
        let server = tail.server.clone();
        let mut lines = FramedRead::new(stderr, LinesCodec::new_with_max_length(MAX_LINE_BYTES));
        let mut limiter = Limiter::new(STDERR_LINES_PER_SECOND, tokio::time::Instant::now());
        while let Some(read) = lines.next().await {
            let line = match read {
                Ok(line) => line,
                Err(LinesCodecError::MaxLineLengthExceeded) => {
                    format!("(a line longer than {MAX_LINE_BYTES} bytes, left out)")
                }
                Err(LinesCodecError::Io(_)) => break,
            };
            let shown = untrusted_label(&line, MAX_LINE_CHARS).into_string();
            tail.push(shown.clone());
            match limiter.admit(tokio::time::Instant::now()) {
                Verdict::Pass => info!(server = %server, line = %shown, "downstream.stderr"),
                Verdict::DropAndSay(dropped) => warn!(
                    server = %server,
                    dropped,
                    "downstream.stderr: more than {STDERR_LINES_PER_SECOND} lines a second; the rest of each such second are not logged"
                ),
                Verdict::Drop => {}
            }
        }
        tail.ended.notify_waiters();
        tail.ended.notify_one();
    });
}

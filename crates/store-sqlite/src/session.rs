//! Process sessions: how one process tells a live claim of another from a dead one.
//!
//! Every [`crate::Database`] opened on a file holds an exclusive lock on a file of its own,
//! `<database>-sessions/<session id>.lock`, for as long as it is open. The kernel drops
//! that lock when the process ends, however it ends (SIGKILL included). A claim records
//! the session that took it, so recovery can ask "is the claimant still alive?" by trying
//! to take its lock:
//!
//! - the lock is held: the claimant is alive and may be sending right now, so its claim
//!   is left alone (turning it into a failure would let the two processes disagree);
//! - the lock can be taken, or the file is gone: the claimant is dead, its call may have
//!   landed, and the claim may be settled as "interrupted".
//!
//! When in doubt (an unexpected I/O error), a claimant is taken to be alive: that leaves
//! a call claimed rather than risking a second send.
//!
//! This module refuses to decide anything else; it only answers the liveness question.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The lock this process holds while a database handle is open.
#[derive(Debug)]
pub(crate) struct Session {
    id: String,
    dir: PathBuf,
    // Held open: the exclusive lock lives as long as this file handle.
    _file: File,
}

/// The directory of session locks that belongs to a database file.
pub(crate) fn sessions_dir(database: &Path) -> PathBuf {
    let mut name = database.as_os_str().to_owned();
    name.push("-sessions");
    PathBuf::from(name)
}

fn lock_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.lock"))
}

impl Session {
    /// Start a session for a database file: create its lock and hold it.
    pub(crate) fn start(database: &Path) -> io::Result<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = sessions_dir(database);
        fs::create_dir_all(&dir)?;
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let id = format!(
            "{}-{nanos:x}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let file = OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(lock_path(&dir, &id))?;
        file.lock()?;
        Ok(Self {
            id,
            dir,
            _file: file,
        })
    }

    /// This session's id, as recorded in the claims it takes.
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// The directory holding every session's lock for this database.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // The lock is released when the file closes; the file itself is only clutter.
        let _ = fs::remove_file(lock_path(&self.dir, &self.id));
    }
}

/// Whether any session other than `mine` is held by a live process (dead ones are tidied
/// away on the way). When in doubt (the directory cannot be read), yes.
pub(crate) fn others_alive(dir: &Path, mine: &str) -> bool {
    let Ok(entries) = fs::read_dir(dir) else {
        return true;
    };
    for entry in entries {
        let Ok(entry) = entry else {
            return true;
        };
        let name = entry.file_name();
        let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".lock")) else {
            continue;
        };
        if id != mine && is_alive(dir, id, mine) {
            return true;
        }
    }
    false
}

/// Whether the session `id` is still held by a live process. `mine` is always alive.
pub(crate) fn is_alive(dir: &Path, id: &str, mine: &str) -> bool {
    if id == mine {
        return true;
    }
    // Session ids are generated, never taken from outside; refuse anything that could
    // name a file elsewhere.
    if id.is_empty() || id.contains(['/', '\\']) || id.contains("..") {
        return false;
    }
    let path = lock_path(dir, id);
    let file = match File::open(&path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return false,
        Err(_) => return true,
    };
    match file.try_lock() {
        Ok(()) => {
            // Nobody holds it: the process is gone. Tidy its file away.
            drop(file);
            let _ = fs::remove_file(&path);
            false
        }
        Err(TryLockError::WouldBlock) => true,
        Err(TryLockError::Error(_)) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_alive_while_held_and_dead_once_dropped() {
        let dir = std::env::temp_dir().join(format!("store-sqlite-session-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let db = dir.join("gate.db");
        let first = Session::start(&db).unwrap();
        let second = Session::start(&db).unwrap();
        assert!(is_alive(first.dir(), first.id(), second.id()));
        let gone = first.id().to_owned();
        drop(first);
        assert!(!is_alive(second.dir(), &gone, second.id()));
        assert!(is_alive(second.dir(), second.id(), second.id()));
        assert!(!is_alive(second.dir(), "../escape", second.id()));
        assert!(!others_alive(second.dir(), second.id()));
        let third = Session::start(&db).unwrap();
        assert!(others_alive(second.dir(), second.id()));
        drop(third);
        assert!(!others_alive(second.dir(), second.id()));
        drop(second);
        let _ = fs::remove_dir_all(&dir);
    }
}

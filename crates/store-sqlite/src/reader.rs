//! The read-only view of a database file: a person's process reading a ledger that an
//! agent's process writes, or a backup on read-only media.
//!
//! [`LedgerReader::open`] needs no write access and creates nothing next to the file: no
//! session lock, no write-ahead log, no shared-memory file. It writes nothing either, so
//! it settles nothing: a claim of a process that died stays a claim here (see
//! [`LedgerReader::claimed`]) until a process opens the file with [`crate::Database::open`].
//!
//! How it opens, in SQLite's terms:
//! - if a write-ahead log (`<file>-wal`) is next to the file, a process may be writing
//!   it: `mode=ro`, which reads the committed state through the existing log and its
//!   shared-memory index;
//! - otherwise no process has the file open (a connection in WAL mode keeps its log for
//!   as long as it is open): `immutable=1`, which takes no lock and needs no side file,
//!   so a file on read-only media can be read.
//!
//! Reads are paged, most recent first, with a cursor ([`LedgerReader::page`]); nothing
//! loads the whole ledger. A row that cannot be read back is returned as [`Unreadable`]
//! instead of failing the page it is on.

use std::path::{Path, PathBuf};

use kernel::{AutoApprovalRule, LedgerEntry, LedgerId};
use rusqlite::{Connection, OpenFlags};

use crate::db::{Error, inspect_file, sidecar};
use crate::error::StoreError;
use crate::ledger::{Descriptions, SELECT_OPEN, SELECT_PAGE, entry_of};

/// A ledger row that could not be turned back into an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// The row's id.
    pub id: LedgerId,
    /// Why it could not be read.
    pub reason: String,
}

/// One row of the ledger as read: an entry, or why it could not be read.
pub type ReadEntry = Result<LedgerEntry, Unreadable>;

/// A read-only handle on a database file (see the module docs).
#[derive(Debug)]
pub struct LedgerReader {
    db: Connection,
    path: PathBuf,
    /// The file's schema version (an older one is read as it is, never upgraded).
    version: i64,
}

/// `path` as a SQLite URI filename, every byte outside a small safe set percent-encoded.
fn uri(path: &Path, query: &str) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::from("file:");
    for &byte in path.as_os_str().as_bytes() {
        if byte.is_ascii_alphanumeric() || b"/-_.~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out.push('?');
    out.push_str(query);
    out
}

impl LedgerReader {
    /// Open the database file at `path` for reading only. Refuses, changing nothing, what
    /// [`crate::Database::open`] refuses (not a database, another application's, a
    /// newer schema), and also a path that is not a regular file and a file that holds
    /// no ledger yet.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        crate::db::check_regular_file(&path, false)?;
        let in_use = sidecar(&path, "-wal").exists();
        let query = if in_use {
            "mode=ro"
        } else {
            "mode=ro&immutable=1"
        };
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let db = Connection::open_with_flags(uri(&path, query), flags)
            .map_err(|e| StoreError::from_sqlite(e, Some(&path)))?;
        let version = inspect_file(&db, &path)?;
        if version == 0 {
            return Err(StoreError::Empty { path });
        }
        Ok(Self { db, path, version })
    }

    fn sorted(&self, error: Error) -> StoreError {
        match error {
            Error::Sql(error) => StoreError::from_sqlite(error, Some(&self.path)),
            Error::Store(error) => error,
        }
    }

    /// The highest ledger id (ids are a dense sequence from 1, so also the number of
    /// entries); 0 for an empty ledger.
    pub fn last_id(&self) -> Result<u64, StoreError> {
        let last: i64 = self
            .db
            .query_row("SELECT COALESCE(max(id), 0) FROM ledger", [], |r| r.get(0))
            .map_err(|e| self.sorted(e.into()))?;
        Ok(u64::try_from(last).unwrap_or(0))
    }

    /// Up to `limit` entries with ids below `before` (all ids when `None`), most recent
    /// first. The next page starts before the last id returned.
    pub fn page(
        &self,
        before: Option<LedgerId>,
        limit: usize,
    ) -> Result<Vec<ReadEntry>, StoreError> {
        let before = before.map_or(i64::MAX, |id| i64::try_from(id.0).unwrap_or(i64::MAX));
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.entries(SELECT_PAGE, rusqlite::params![before, limit])
    }

    /// The actions still waiting for a person (pending, or failed and retryable), oldest
    /// first.
    pub fn open_actions(&self) -> Result<Vec<ReadEntry>, StoreError> {
        self.entries(SELECT_OPEN, [])
    }

    fn entries(
        &self,
        sql: &str,
        params: impl rusqlite::Params,
    ) -> Result<Vec<ReadEntry>, StoreError> {
        let read = || -> Result<Vec<ReadEntry>, Error> {
            let mut descriptions = Descriptions::new();
            let mut statement = self.db.prepare(sql)?;
            let mut rows = statement.query(params)?;
            let mut out = Vec::new();
            while let Some(row) = rows.next()? {
                let id = LedgerId(u64::try_from(row.get::<_, i64>(0)?).unwrap_or(0));
                out.push(
                    entry_of(row, &mut descriptions).map_err(|error| Unreadable {
                        id,
                        reason: self.sorted(error).to_string(),
                    }),
                );
            }
            Ok(out)
        };
        read().map_err(|e| self.sorted(e))
    }

    /// The ledger ids of actions whose call is claimed in the action store: being sent
    /// by a live process, or left by one that died (outcome unknown until a process opens
    /// the file for writing and settles it).
    pub fn claimed(&self) -> Result<Vec<LedgerId>, StoreError> {
        let read = || -> Result<Vec<LedgerId>, Error> {
            let mut statement = self.db.prepare(
                "SELECT l.id FROM actions AS a
                 JOIN ledger AS l ON l.kind = 'action' AND l.gatekeeper = a.gatekeeper
                     AND l.driver_id = a.id
                 WHERE a.state = 'applying' ORDER BY l.id",
            )?;
            let ids = statement
                .query_map([], |r| r.get::<_, i64>(0))?
                .map(|id| Ok(LedgerId(u64::try_from(id?).unwrap_or(0))))
                .collect::<Result<_, Error>>()?;
            Ok(ids)
        };
        read().map_err(|e| self.sorted(e))
    }

    /// Every auto-approval rule, ordered by gatekeeper then tag. A file older than schema
    /// version 9 kept neither a rule's time nor its scope: its rules read as enabled at
    /// time zero for their whole kind, as opening it for writing would upgrade them.
    pub fn rules(&self) -> Result<Vec<AutoApprovalRule>, StoreError> {
        crate::ledger::read_rules(&self.db, self.version >= 9).map_err(|e| self.sorted(e))
    }

    /// Whether the lockdown latch is set.
    pub fn locked_down(&self) -> Result<bool, StoreError> {
        self.db
            .query_row("SELECT EXISTS (SELECT 1 FROM lockdown)", [], |r| r.get(0))
            .map_err(|e| self.sorted(e.into()))
    }

    /// SQLite's full integrity check of the whole file (it reads every page, so it takes
    /// time in proportion to the file's size; opening never does this). Returns what it
    /// found, at most `max` findings; empty when the file is sound.
    pub fn check_integrity(&self, max: u32) -> Result<Vec<String>, StoreError> {
        let read = || -> Result<Vec<String>, Error> {
            let mut statement = self
                .db
                .prepare(&format!("PRAGMA integrity_check({})", max.max(1)))?;
            let findings: Vec<String> = statement
                .query_map([], |r| r.get::<_, String>(0))?
                .collect::<Result<_, _>>()?;
            Ok(findings.into_iter().filter(|f| f != "ok").collect())
        };
        match read() {
            // Damage bad enough to stop the check is itself its finding.
            Err(Error::Sql(error))
                if error.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseCorrupt) =>
            {
                Ok(vec![error.to_string()])
            }
            other => other.map_err(|e| self.sorted(e)),
        }
    }
}

//! The one error type of this crate, sorted by what a person can do about it.
//!
//! Every storage port has its own small error (a string newtype); adapters convert a
//! [`StoreError`] into it through `Display`, so the text below is what reaches a person.
//! Each message says what happened, then what to do next.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::ErrorCode;

/// Why the database refused or failed an operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The file or its directory could not be opened or created.
    #[error(
        "cannot open the database at {path}: {detail}; check that the path exists and is accessible"
    )]
    CannotOpen {
        /// The database file.
        path: PathBuf,
        /// What SQLite or the operating system said.
        detail: String,
    },
    /// The location refuses writes (permissions, a read-only mount).
    #[error(
        "the database at {path} cannot be written ({detail}); open it from a writable location or fix its permissions"
    )]
    ReadOnly {
        /// The database file.
        path: PathBuf,
        /// What SQLite or the operating system said.
        detail: String,
    },
    /// The file is not an SQLite database, or its pages are damaged (for example truncated).
    #[error(
        "the database at {path} is damaged or is not a database ({detail}); nothing was changed in it: restore it from a backup, or move it aside to start a new one"
    )]
    Corrupt {
        /// The database file.
        path: PathBuf,
        /// What SQLite's integrity check found.
        detail: String,
    },
    /// The path names something that is not a regular file (a directory, a device, a
    /// pipe); nothing was created next to it.
    #[error(
        "{path} is {what}, not a database file; nothing was created or changed: name the database file itself"
    )]
    NotAFile {
        /// The path given.
        path: PathBuf,
        /// What it is ("a directory", "a character device", ...).
        what: &'static str,
    },
    /// Something of ours next to the database is in the way (for example a file where the
    /// directory of session locks must be).
    #[error("{path} is in the way ({detail}); nothing was changed: move it aside and try again")]
    InTheWay {
        /// The thing in the way.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// The file is an empty database: it holds no ledger to read.
    #[error("the database at {path} is empty: it holds no ledger; name a file a gatekeeper wrote")]
    Empty {
        /// The database file.
        path: PathBuf,
    },
    /// The file says it has the current schema, but its tables are not of that schema
    /// (an older file whose version number was changed, or a half-copied one).
    #[error(
        "the database at {path} says it has schema version {version}, but its tables do not match ({detail}); nothing was changed in it: restore it from a backup"
    )]
    SchemaMismatch {
        /// The database file.
        path: PathBuf,
        /// The version it claims.
        version: i64,
        /// What is missing.
        detail: String,
    },
    /// The file was written by a newer build with a schema this build does not know.
    #[error(
        "the database at {path} uses schema version {found}, newer than the {supported} this build understands; nothing was changed in it: open it with the newer build"
    )]
    NewerSchema {
        /// The database file.
        path: PathBuf,
        /// `PRAGMA user_version` of the file.
        found: i64,
        /// The newest version this build reads.
        supported: i64,
    },
    /// The file is an SQLite database that belongs to another application.
    #[error(
        "the database at {path} belongs to another application ({detail}); nothing was changed in it: choose another file"
    )]
    Foreign {
        /// The database file.
        path: PathBuf,
        /// Why it was not recognised.
        detail: String,
    },
    /// The disk, or the size limit set with [`crate::Database::limit_size`], is full.
    #[error(
        "the database is full ({detail}), so this was not recorded; free disk space or raise the size limit, then try again"
    )]
    Full {
        /// What SQLite said.
        detail: String,
    },
    /// Another process held the database for longer than the busy timeout.
    #[error(
        "the database stayed busy in another process for {waited:?}; close whatever holds it open in a transaction (for example an sqlite3 shell) and try again"
    )]
    Busy {
        /// How long this process waited.
        waited: Duration,
    },
    /// A stored row could not be turned back into a record.
    #[error(
        "a stored {what} could not be read back ({detail}); the file may have been edited by hand: restore it from a backup"
    )]
    Decode {
        /// Which record.
        what: String,
        /// What went wrong.
        detail: String,
    },
    /// Another process on the same file is deciding the action; this outcome was not
    /// recorded, and the other process's will be.
    #[error(
        "action #{id} is being decided by another process on this database, so this outcome was not recorded; list pending work to see its state"
    )]
    DecidedElsewhere {
        /// The ledger id.
        id: u64,
    },
    /// JSON nested deeper than [`crate::MAX_JSON_DEPTH`]: refused when staged, since it
    /// could not be read back (see `json.rs`).
    #[error(
        "{what}: nested {depth} levels deep, more than the {max} levels this gate stores and reads back, so refused; send the call with arguments nested less deeply"
    )]
    TooDeep {
        /// What was refused ("the call's arguments").
        what: String,
        /// How deep it nests.
        depth: usize,
        /// The limit.
        max: usize,
    },
    /// A change to an open action arrived after the action left its open states (decided
    /// meanwhile, for example by another process on the same file); nothing was written.
    #[error(
        "ledger action #{id} is no longer open: it reached a final state meanwhile (perhaps decided by another process), so this change was not recorded; list pending work to see its state"
    )]
    NotOpen {
        /// The ledger id.
        id: u64,
    },
    /// A staged call whose arguments cannot be read back: it is never sent.
    #[error("action {id} is never sent, because {reason}; reject it")]
    Unsendable {
        /// The driver's action id.
        id: u64,
        /// Why its arguments cannot be read.
        reason: String,
    },
    /// A write was refused because the record it changes does not exist.
    #[error("{0}; list the records to see which exist")]
    Missing(String),
    /// [`crate::Database::query_text`] was given a statement that writes.
    #[error(
        "query_text runs only read-only statements; write through the storage adapters instead"
    )]
    NotReadOnly,
    /// The disk failed to make a committed write durable (the write-ahead log's sync
    /// failed). The write may or may not survive a power cut, so it is reported as
    /// failed, and every later write is refused rather than trusted to the same disk.
    #[error(
        "the database at {path} could not make a write durable ({detail}); writes are refused from now on: check the disk, then open the database again"
    )]
    NotDurable {
        /// The database file.
        path: PathBuf,
        /// What the operating system said.
        detail: String,
    },
    /// A durable write had joined a transaction shared with other writes (group commit),
    /// and that transaction could not be committed: nothing of the write was recorded.
    #[error(
        "a write to the database at {path} was not recorded: the transaction it shared with other writes could not be committed ({detail}); try again, and if this repeats, check the disk"
    )]
    NotCommitted {
        /// The database file.
        path: PathBuf,
        /// Why the transaction was lost.
        detail: String,
    },
    /// Another process has the database open, and this open needs it alone: bringing in
    /// a redo journal an older daemon left (`upgrade.rs`), which that daemon may still be
    /// running on.
    #[error(
        "the database at {path} is in use by another process (another `gate serve` on the same data directory?); stop it first, or open another file"
    )]
    InUse {
        /// The database file.
        path: PathBuf,
    },
    /// A redo journal that an older daemon left beside the file could not be brought in
    /// (read, replayed or removed). Nothing was changed: the journal and the file are as
    /// they were.
    #[error(
        "the redo journal {path}, which an older gate left beside its database, could not be brought into it ({detail}); nothing was changed. Check the disk and open it again; keep the journal until it opens"
    )]
    Journal {
        /// The journal file.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// An adapter's error met through its storage port, passed on as the adapter worded
    /// it (the words already say what to do).
    #[error("{0}")]
    Port(String),
    /// The database was closed while a write was starting.
    #[error("the database was closed while a write was starting; open it again to write")]
    Closed,
    /// Any other SQLite failure. (Its text is in the message, so it is not also given as
    /// the error's source: a report that prints causes would print it twice.)
    #[error("the database failed: {0}; if this repeats, check the disk and the file")]
    Sqlite(rusqlite::Error),
}

/// How long a writer waits for another process before giving up with [`StoreError::Busy`].
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

impl StoreError {
    /// Sort a SQLite error by what a person can do about it.
    pub(crate) fn from_sqlite(error: rusqlite::Error, path: Option<&Path>) -> Self {
        let path = || {
            path.map(Path::to_path_buf)
                .unwrap_or_else(|| ":memory:".into())
        };
        let detail = error.to_string();
        match error.sqlite_error_code() {
            Some(ErrorCode::DiskFull) => Self::Full { detail },
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => Self::Busy {
                waited: BUSY_TIMEOUT,
            },
            Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => Self::Corrupt {
                path: path(),
                detail,
            },
            Some(ErrorCode::ReadOnly | ErrorCode::PermissionDenied) => Self::ReadOnly {
                path: path(),
                detail,
            },
            Some(ErrorCode::CannotOpen) => Self::CannotOpen {
                path: path(),
                detail,
            },
            _ => Self::Sqlite(error),
        }
    }

    pub(crate) fn decode(what: impl Into<String>, detail: impl ToString) -> Self {
        Self::Decode {
            what: what.into(),
            detail: detail.to_string(),
        }
    }
}

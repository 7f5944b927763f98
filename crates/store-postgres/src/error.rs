//! What can go wrong in the store, each message saying what happened and what to do next.

/// A failure of the PostgreSQL store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The server cannot be reached (not running, wrong address, the connection broke).
    #[error(
        "the database at {url} cannot be reached ({detail}), so nothing was recorded or sent; check that PostgreSQL is running and reachable, then try again"
    )]
    Unreachable {
        /// The database URL, without a password.
        url: String,
        /// What the client said.
        detail: String,
    },
    /// The server refused or failed a statement.
    #[error("the database refused a statement ({detail}); nothing of it was recorded")]
    Sql {
        /// What the server said.
        detail: String,
    },
    /// The database holds a schema newer than this build.
    #[error(
        "the database at {url} uses schema version {found}, newer than the {supported} this build understands; nothing was changed in it: run the newer build of gate on it"
    )]
    NewerSchema {
        /// The database URL, without a password.
        url: String,
        /// The stored version.
        found: i32,
        /// The version this build writes.
        supported: i32,
    },
    /// The database holds tables of another application.
    #[error(
        "the database at {url} holds tables that are not the gate's ({detail}); nothing was changed in it: name an empty database or one a gate created"
    )]
    Foreign {
        /// The database URL, without a password.
        url: String,
        /// What did not match.
        detail: String,
    },
    /// A stored value could not be read back.
    #[error(
        "a stored {what} could not be read back ({detail}); the database may have been edited by hand: restore it from a backup"
    )]
    Decode {
        /// What was being read.
        what: String,
        /// Why it failed.
        detail: String,
    },
    /// Another live daemon is deciding the action.
    #[error(
        "action #{id} is being decided by another daemon on this database, so this outcome was not recorded; list pending work to see its state"
    )]
    DecidedElsewhere {
        /// The ledger id.
        id: u64,
    },
    /// A change to an open action found it decided.
    #[error(
        "ledger action #{id} is no longer open: it reached a final state meanwhile (perhaps decided by another daemon), so this change was not recorded; list pending work to see its state"
    )]
    NotOpen {
        /// The ledger id.
        id: u64,
    },
    /// A record that should exist does not.
    #[error("{0}")]
    Missing(String),
    /// The store was closed.
    #[error("the store was closed, so nothing was recorded; restart the daemon")]
    Closed,
}

impl StoreError {
    pub(crate) fn decode(what: impl Into<String>, detail: impl std::fmt::Display) -> Self {
        Self::Decode {
            what: what.into(),
            detail: detail.to_string(),
        }
    }
}

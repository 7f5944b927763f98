//! Durable storage on SQLite for every storage port of the approval gate.
//!
//! # What a caller can rely on after a crash
//!
//! Written first, as a guarantee; the mechanism follows.
//!
//! 1. **A call is never sent twice.** The claim of the at-most-once protocol (the
//!    action's `applying` record) is committed and the write-ahead log synced past it
//!    before the driver's store returns from the claim, and so before the service is
//!    called. A claim is never held back to ride with a later commit.
//! 2. **A call that may have been sent is never forgotten.** A process that dies holding
//!    a claim leaves it on disk; the next process that opens the database turns it into a
//!    failure that cannot be retried ("interrupted after it had been sent; check the
//!    service"), in the action store and in the ledger, in one commit. A claim whose
//!    process is still alive (another process on the same file) is left alone.
//! 3. **An acknowledged submission survives.** When the kernel answers a submission, the
//!    driver's staged record and the ledger entry are both committed and synced. A staged
//!    record the kernel never recorded (a crash between the two) was never acknowledged:
//!    opening discards it, when no other process has the file open.
//! 4. **A person's decision survives.** When `reject` or `revert` returns, its outcome is
//!    committed and synced, together with the driver's. When `approve` returns, its
//!    outcome is committed (a process crash keeps it) and becomes durable with the next
//!    sync; a power cut before that loses it safely, as in point 5.
//! 5. **An outcome may be lost, safely.** The outcome of an apply needs no sync of its
//!    own: a person's is committed without one, an auto-approved one rides with the next
//!    claim of the drain or is committed within [`DEFERRED_COMMIT_WINDOW`]. A crash or
//!    power cut before it is durable leaves the synced claim, which point 2 turns into
//!    "interrupted": the action is reported as possibly sent, never resent.
//! 6. **A damaged or foreign file is refused, not repaired.** Opening checks the file
//!    before writing anything to it (reading a fixed handful of pages, never the whole
//!    file), and any failure leaves it untouched and leaves nothing next to it. The full
//!    check of every page is its own step, [`LedgerReader::check_integrity`].
//! 7. **Two processes on one file record the true decider.** Who decided an action is
//!    written only while it is open and no other live process is deciding it, in the
//!    statement that checks it; the loser writes and sends nothing and is told who
//!    decided (see `ledger.rs` and docs/ARCHITECTURE.md, "Failure model").
//! 8. **Nothing is stored that cannot be read back.** JSON nested deeper than
//!    [`MAX_JSON_DEPTH`] is refused at staging by the same limit the reader enforces.
//!
//! What these points rest on: the gatekeeper registers with the kernel under the same
//! name its action store uses in [`Database::action_storage`], so the two records of one
//! action can be matched (and written in one transaction).
//!
//! # What each commit contains
//!
//! Writes are committed and synced before the call returns, committed without a sync of
//! their own (durable with the next sync: the write-ahead log is appended in order, and
//! a sync makes every earlier commit durable), or deferred into the open transaction to
//! ride with the next commit (see `db.rs` for the rules, and for group commit: durable
//! writes of concurrent sessions share transactions and syncs). For one action through the kernel and
//! gatekeeper-core, approved by a person:
//!
//! | commit | synced | written by | contains |
//! |---|---|---|---|
//! | 1. stage | yes | the kernel's submission (`LedgerStore::insert`) | the driver's `pending` row and id counter (deferred by `insert_pending`) and the ledger's `pending` entry |
//! | 2. claim | yes | `ActionStorage::compare_and_set` to `applying` | the `applying` row with its session, and who decided (deferred by `record_attempt`) |
//! | 3. outcome | no: by the next sync | the kernel's `LedgerStore::put` of the outcome | the driver's `applied`/`failed` row and any pruning (deferred), and the ledger's decided entry |
//!
//! In a drain of auto-approved actions the kernel's put of each outcome is deferred too,
//! so commit 2 of action *n + 1* carries commit 3 of action *n*: one synced commit per
//! applied action, plus one unsynced for the last outcome (made by the flusher within
//! [`DEFERRED_COMMIT_WINDOW`], or by whatever write comes next). The tests
//! `one_durable_cycle_costs_exactly_three_commits_of_which_two_are_synced` and
//! `a_drain_shares_each_outcome_with_the_next_claim` count them ([`Database::commits`],
//! [`Database::syncs`]); `power_cut.rs` cuts a copy's log past its last sync.
//!
//! A database in memory has nothing to make durable: its writes share transactions of a
//! few hundred (see `Database`).
//!
//! # What is read from memory
//!
//! The connection remembers what it wrote and read: ledger entries and the highest ledger
//! id, and per gatekeeper the action records, the open count, the highest action id and
//! the settled ids retention prunes. The hot path then asks SQLite only to write. That
//! copy is trusted in memory, and on a file only while this connection holds the write
//! transaction (it compared `PRAGMA data_version` when the transaction began, and forgot
//! everything if another connection had committed since); otherwise readers ask SQLite.
//!
//! # One path for every process
//!
//! The daemon (`gate serve`), the CLI, the lectures and the tests all open the file
//! through [`Database`]: one connection per process, write-ahead logging, durable writes
//! of concurrent callers sharing commits and syncs (see `db.rs`), and every guarantee
//! above. Another process may read the file while the daemon runs ([`LedgerReader`], an
//! `sqlite3` shell). A redo journal that an older daemon left beside the file (it kept
//! its writes there before this path) is brought into the file by the first open, before
//! anything else touches it (`upgrade.rs`).
//!
//! # The pieces
//!
//! - [`Database`]: opens and checks a file (or memory), owns the one connection per
//!   process, counts commits, and commits deferred writes ([`db`](Database) docs).
//! - [`SqliteLedger`]: the kernel's [`kernel::LedgerStore`].
//! - [`SqliteActionStorage`]: gatekeeper-core's [`gatekeeper_core::ActionStorage`], one
//!   namespace per gatekeeper.
//! - [`SqliteKv`]: gatekeeper-core's key-value port ([`gatekeeper_core::kv::KvStore`], which the wiki driver keeps its records through), one
//!   namespace per driver instance.
//! - [`LedgerReader`]: the read-only view of a file (no write access, no side files),
//!   paged most recent first, and the full integrity check.
//!
//! Several adapters share one [`Database`], and so one file and one transaction stream:
//! that is what lets a driver's write and the kernel's write about the same action share
//! a commit.

mod actions;
mod db;
mod error;
mod json;
mod known;
mod kv;
mod ledger;
mod reader;
mod recover;
mod schema;
mod session;
mod upgrade;
mod vfs;

/// A fresh, empty directory for one unit test, named after `label` and this process.
#[cfg(test)]
fn temp_dir(label: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("store-sqlite-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

use std::sync::Arc;

pub use actions::SqliteActionStorage;
pub use db::{DEFERRED_COMMIT_WINDOW, Database};
pub use error::{BUSY_TIMEOUT, StoreError};
pub use json::MAX_JSON_DEPTH;
pub use kv::SqliteKv;
pub use ledger::SqliteLedger;
pub use reader::{LedgerReader, ReadEntry, Unreadable};
pub use schema::{APPLICATION_ID, SCHEMA_VERSION};

impl Database {
    /// The kernel's ledger, rules and lockdown latch in this database, for
    /// [`kernel::Overseer::with_store`].
    pub fn ledger(&self) -> Arc<dyn kernel::LedgerStore> {
        Arc::new(SqliteLedger::new(self.clone()))
    }

    /// The action store of the gatekeeper named `gatekeeper` (the name it registers with
    /// the kernel under: the ledger and the store are matched by it), for
    /// [`gatekeeper_core::ActionStore::open`].
    pub fn action_storage(&self, gatekeeper: &str) -> Arc<dyn gatekeeper_core::ActionStorage> {
        Arc::new(SqliteActionStorage::new(self.clone(), gatekeeper))
    }

    /// [`gatekeeper_core::ActionStore::open`] over [`Database::action_storage`]: leftover
    /// claims of dead processes become "interrupted" failures, durably.
    pub async fn action_store(
        &self,
        gatekeeper: &str,
        clock: Arc<dyn kernel::Clock>,
    ) -> Result<gatekeeper_core::ActionStore, gatekeeper_core::StorageError> {
        gatekeeper_core::ActionStore::open(self.action_storage(gatekeeper), clock).await
    }

    /// The key-value records of the driver instance `scope` (for example the wiki
    /// gatekeeper's name), for a driver that keeps its records there (the wiki driver's
    /// `ConfluenceGatekeeper::open`).
    pub fn kv(&self, scope: &str) -> Arc<dyn gatekeeper_core::kv::KvStore> {
        Arc::new(SqliteKv::new(self.clone(), scope))
    }
}

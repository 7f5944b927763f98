//! Durable storage on PostgreSQL for every storage port of the approval gate, so that
//! several `gate` daemons (on several machines) share one queue, one ledger and one set
//! of rules, and still send each call at most once.
//!
//! # What a caller can rely on, with several daemons on one database
//!
//! 1. **A call is never sent twice.** The claim (the action's `applying` record) is one
//!    conditional `UPDATE`, committed before the driver's store returns from the claim,
//!    and so before the service is called; of two daemons claiming one action exactly one
//!    matches. Only the claimant's session settles its claim (or anyone, once it died).
//! 2. **A call that may have been sent is never forgotten.** A daemon that dies holding a
//!    claim leaves it in the database; every live daemon looks for such claims every
//!    [`RECOVERY_INTERVAL`] and turns them into failures that cannot be retried
//!    ("interrupted"; outcome unknown), in the action store and the ledger, in one
//!    transaction, without restarting.
//! 3. **The ledger names the true decider.** Who decided is written only while the action
//!    is open and no other live daemon is deciding it, in the statement that checks it;
//!    the loser writes and sends nothing and is told so. It is committed with the claim,
//!    so before anything is sent.
//! 4. **The cap of open calls and retention hold across daemons**: staging counts and
//!    inserts under the store's row lock; retention rides in a stage's transaction.
//! 5. **A newer schema is refused**; an older one is upgraded on open, once, under an
//!    advisory lock.
//! 6. **An acknowledged submission is stored whole.** A stage is committed with the
//!    kernel's entry of it, in one transaction, before the kernel answers the agent; a
//!    crash before leaves neither. When the database cannot be reached the call fails
//!    with [`StoreError::Unreachable`], so the agent is refused and nothing is sent.
//! 7. **An outcome may be lost, safely.** The driver's outcome of an apply is written in
//!    the statement that writes the kernel's (or alone within [`PARK_WINDOW`]); a crash
//!    before leaves the committed claim, which point 2 turns into "interrupted": possibly
//!    sent, never resent. Every other write is committed before the call returns.
//! 8. **No decision after a latch.** The statement that records who decides refuses once
//!    the lockdown latch is set, whatever a daemon remembered of it.
//!
//! What these rest on: a daemon's *session* is alive while its session connection holds
//! the advisory lock `(SESSION_LOCKS, id)`; the server drops the lock when that
//! connection ends, however the daemon died (see `schema.rs`).
//!
//! # What each commit contains
//!
//! For one action staged, approved and applied (`one_cycle_is_three_commits_…` counts
//! them; `benches/team.rs` counts commits and round trips under load):
//!
//! | commit | round trips | contains |
//! |---|---|---|
//! | 1. submission | stage 1, ledger insert 2 | the driver's `pending` row and id (the stage's transaction, parked for the task that staged) and the ledger's `pending` entry |
//! | 2. claim | who decided 1, claim 1 | who decided (parked under the action, with the driver's row read for its next read) and the `applying` row |
//! | 3. outcome | 1 | the driver's `applied`/`failed` row (kept in memory) and the ledger's outcome, one statement |
//!
//! Reads the kernel makes in between are answered from what the daemon remembers where
//! that is safe (`cache.rs`: the latch, the rules, stages not yet submitted, open entries
//! read with their ids). Transactions left open between two port calls (`db.rs`, "Parked
//! transactions") are committed by the next write about the same action, or by the
//! flusher within [`PARK_WINDOW`].
//!
//! # The pieces
//!
//! - [`Database`]: connects, checks or creates the schema, runs the worker, flusher and
//!   session threads, parks transactions between port calls, counts commits and round
//!   trips, hands out drain leases ([`DrainLease`]) and change notifications
//!   ([`Database::changes`]).
//! - [`PostgresLedger`]: the kernel's [`kernel::LedgerStore`].
//! - [`PostgresActionStorage`]: gatekeeper-core's [`gatekeeper_core::ActionStorage`], one
//!   namespace per gatekeeper.
//! - [`PostgresKv`]: gatekeeper-core's key-value port ([`gatekeeper_core::kv::KvStore`], which the wiki driver keeps its records through).

mod actions;
mod cache;
#[cfg(feature = "test-cluster")]
pub mod cluster;
mod db;
mod error;
mod kv;
mod ledger;
mod recover;
mod schema;

use std::sync::Arc;

pub use actions::PostgresActionStorage;
pub use cache::PREFETCH_TTL;
pub use db::{Database, DrainLease, PARK_WINDOW, RECOVERY_INTERVAL, WORKERS};
pub use error::StoreError;
pub use kv::PostgresKv;
pub use ledger::PostgresLedger;
pub use schema::{CHANNEL, SCHEMA_VERSION};

impl Database {
    /// The kernel's ledger, rules and lockdown latch in this database, for
    /// [`kernel::Overseer::with_store`].
    pub fn ledger(&self) -> Arc<dyn kernel::LedgerStore> {
        Arc::new(PostgresLedger::new(self.clone()))
    }

    /// The action store of the gatekeeper named `gatekeeper` (the name it registers with
    /// the kernel under), for [`gatekeeper_core::ActionStore::open`].
    pub fn action_storage(&self, gatekeeper: &str) -> Arc<dyn gatekeeper_core::ActionStorage> {
        Arc::new(PostgresActionStorage::new(self.clone(), gatekeeper))
    }

    /// [`gatekeeper_core::ActionStore::open`] over [`Database::action_storage`]: claims of
    /// dead daemons become "interrupted" failures; live daemons' claims are left alone.
    pub async fn action_store(
        &self,
        gatekeeper: &str,
        clock: Arc<dyn kernel::Clock>,
    ) -> Result<gatekeeper_core::ActionStore, gatekeeper_core::StorageError> {
        gatekeeper_core::ActionStore::open(self.action_storage(gatekeeper), clock).await
    }

    /// The key-value records of the driver instance `scope`, for a driver that keeps its
    /// records there (the wiki driver's `ConfluenceGatekeeper::open`).
    pub fn kv(&self, scope: &str) -> Arc<dyn gatekeeper_core::kv::KvStore> {
        Arc::new(PostgresKv::new(self.clone(), scope))
    }
}

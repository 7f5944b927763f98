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
//!    the loser writes and sends nothing and is told so.
//! 4. **The cap of open calls and retention hold across daemons**: staging counts and
//!    inserts under the store's row lock.
//! 5. **A newer schema is refused**; an older one is upgraded on open, once, under an
//!    advisory lock.
//! 6. **Nothing is staged that is not stored.** Every write is committed before the call
//!    returns; when the database cannot be reached the call fails with
//!    [`StoreError::Unreachable`], so the agent is refused and nothing is sent.
//!
//! What these rest on: a daemon's *session* is alive while its session connection holds
//! the advisory lock `(SESSION_LOCKS, id)`; the server drops the lock when that
//! connection ends, however the daemon died (see `schema.rs`).
//!
//! # The pieces
//!
//! - [`Database`]: connects, checks or creates the schema, runs the worker and session
//!   threads, counts commits and round trips, hands out drain leases ([`DrainLease`]) and
//!   change notifications ([`Database::changes`]).
//! - [`PostgresLedger`]: the kernel's [`kernel::LedgerStore`].
//! - [`PostgresActionStorage`]: gatekeeper-core's [`gatekeeper_core::ActionStorage`], one
//!   namespace per gatekeeper.
//! - [`PostgresKv`]: gatekeeper-core's key-value port ([`gatekeeper_core::kv::KvStore`], which the wiki driver keeps its records through).

mod actions;
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
pub use db::{Database, DrainLease, RECOVERY_INTERVAL, WORKERS};
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

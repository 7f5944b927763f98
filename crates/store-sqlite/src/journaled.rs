//! A store behind a redo journal: the hot path in memory, durability from one small
//! append to the journal (`journal.rs`), and the SQLite file written behind it by one
//! applier thread. One process owns the file; the daemon (`gate serve`) opens it so.
//!
//! # Why
//!
//! On the shared file ([`Database::open`]) every durable write is an SQLite transaction:
//! the statements, the commit's log frames, and a sync of the log. Two syncs per action
//! are the floor the at-most-once rule sets (the stage, and the claim before the send);
//! everything else SQLite does around them, it does on the path every agent waits on.
//! Here that path is: change the copy in memory, append one record, and (for the stage
//! and the claim) sync the journal. SQLite does the same writes a moment later, on the
//! applier's thread, in large transactions that are never synced on their own.
//!
//! # What a caller can rely on
//!
//! The crate's guarantees hold as on a shared file, with the journal as the commit log:
//!
//! - **Durable now** (a submission, the claim, a rejection, a rule, the lockdown, an
//!   edit of a pending call's arguments): the call returns after the journal was synced
//!   past its record. Concurrent callers share syncs (group commit, see `journal.rs`).
//! - **Committed** (a person's outcome, an ordinary observation): its record is written
//!   to the journal file before the call returns, so a crash of the process keeps it; a
//!   power cut before the next sync may lose it, and then the synced claim is recovered
//!   as "interrupted" (an outcome), or the read is not in the ledger (an observation: the
//!   sensitive ones, which latch a lockdown, are durable now).
//! - **Deferred** (the driver's stage and outcome, an automatic outcome, who decided):
//!   written to the journal with the next record that is written, as SQLite's deferred
//!   writes ride with the next commit on a shared file. Losing one is safe for the same
//!   reasons (see `actions.rs` and `ledger.rs`).
//!
//! The journal is one chain of records in order, so a sync makes every earlier record
//! durable too, whoever appended it. A caller waits on its own thread; on a worker of a
//! multi-threaded tokio runtime the wait leaves the worker to the runtime's other tasks
//! ([`off_workers`]), so that their writes can share the sync. A task there waits as a
//! future that holds no thread ([`Shared::wait_task`]). Alone, a caller runs its sync
//! itself; among others, it leaves the sync to the store's syncer thread, which runs one
//! sync after another for as long as callers wait (`journal.rs`).
//!
//! # The journal and the file
//!
//! Every record is applied to SQLite by the applier, in the journal's order, through the
//! same adapters a shared file uses ([`SqliteLedger`], [`SqliteActionStorage`]); the
//! results are compared with what the copy in memory answered, and any difference stops
//! all writes (the journal still holds every acknowledged one). The applier takes the
//! queued records every 20 ms (`journal.rs`, `APPLY_EVERY`; sooner for a long queue or a
//! reader waiting for it) and folds each batch first (`fold.rs`): a later change of a row
//! that an earlier record of the batch wrote is merged into that record, so a cycle whose
//! six records fall in one batch reaches the file as two rows, its ledger entry and its
//! staged call, each inserted once as it last stood, in the batch's one transaction. It
//! commits each batch without a sync, writing the journal position it reached in the
//! same transaction; another connection reading the file is at most that far behind, and
//! [`Journaled::flush`] brings it up to date at once. Once the journal file passes half
//! of its ring, the applier commits and syncs SQLite, and the journal starts over at its
//! beginning: everything it held is now durable in the file. Appenders wait while it
//! starts over, so the applier first catches up and syncs with them going on
//! ([`catch_up`]), and the restart itself applies and syncs only the last few records.
//!
//! Opening replays every record past the position SQLite holds, through the same
//! adapters, then settles claims whose process is gone (all of them: one process owns
//! the file) exactly as a shared file does, syncs SQLite, and only then starts the
//! journal over. A crash at any point of that is a crash before the open finished: the
//! next open replays the same records again from the same position.
//!
//! # When the journal fails
//!
//! A failed write or sync of the journal, or a record the file would not take, fails the
//! journal for good: every later write is refused with [`StoreError::Journal`], which says
//! to check the disk and open the database again. The ledger's copy changes only after
//! its record was appended; an action store's copy changes just before, so a write
//! refused at that moment may show in this process's reads of that store until it opens
//! the file again. What the journal holds is what counts: opening reads the copy from
//! the file after replaying it.
//!
//! # What is kept in memory
//!
//! Per gatekeeper, the whole action store (retention keeps it at about 150 records);
//! the ledger's open entries, the most recent [`HOT_ENTRIES`] settled ones, its rules and
//! the lockdown latch. Any other entry is read from SQLite after the applier has caught
//! up, so a read always sees every write that returned before it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;

use async_trait::async_trait;
use gatekeeper_core::kv::KvStore;
use gatekeeper_core::{
    ActionRecord, ActionState, ActionStorage, ClaimDurable, MemoryActionStorage, StateTag,
    StorageError,
};
use kernel::{
    AutoApprovalRule, DriverActionId, DurableFuture, EntryBody, LedgerEntry, LedgerId, LedgerStore,
    Resolution, Timestamp,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::{error, info};

use crate::actions::{SqliteActionStorage, is_interruption};
use crate::db::{Database, Durability, Steps, sidecar};
use crate::error::StoreError;
use crate::fold::fold;
use crate::journal::{Journal, JournalError, SyncWait};
use crate::kv::SqliteKv;
use crate::ledger::{SqliteLedger, put_durability};

/// How many settled ledger entries the copy in memory keeps besides the open ones: the
/// ones just decided, which the person's report and the agents' outcome checks read next.
/// Small, so that the daemon's memory does not grow with the ledger (4,096, with the
/// applier's caches of as many, held about 5 MiB more at 10,000 decided actions, at no
/// gain: a decision reads only the rows it decides; see docs/performance.md).
pub(crate) const HOT_ENTRIES: usize = 256;

/// Where SQLite records the journal position it holds (`kv` table; no driver scope has a
/// space in it).
const POSITION_SCOPE: &str = "store-sqlite journal";
const POSITION_KEY: &str = "applied";

/// The journal's file next to the database file.
pub(crate) fn journal_path(database: &Path) -> PathBuf {
    sidecar(database, "-redo")
}

/// One write as the journal records it, and as the applier replays it through the SQLite
/// adapters. Each carries what the copy in memory answered, so replay can check it, and
/// nothing that an earlier record of the same action already wrote: a staged call's
/// tool and arguments and an entry's description are written once, when they are new,
/// and a later change carries only what moves (a person's edit of a pending call's
/// arguments, [`Op::ActionAmend`], carries the new arguments).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum Op {
    /// [`LedgerStore::insert`] of this entry (its id is the one handed out).
    LedgerInsert(LedgerEntry),
    /// [`LedgerStore::put`] of an observation.
    LedgerPut(LedgerEntry),
    /// [`LedgerStore::put`] of an action: what moves (its description and dependencies
    /// are the inserted entry's, never rewritten).
    ActionPut {
        /// The entry.
        id: LedgerId,
        /// Its state.
        state: kernel::ActionState,
        /// Who decided.
        resolution: Option<Resolution>,
        /// Why it failed.
        failure: Option<kernel::Failure>,
        /// What it waits for.
        blocked_by: Option<LedgerId>,
        /// Whether the agent was told to start over.
        restart_requested: bool,
        /// Its revert.
        revert: Option<kernel::RevertRecord>,
    },
    /// [`LedgerStore::record_attempt`] that returned `true`.
    LedgerAttempt {
        /// The entry.
        id: LedgerId,
        /// Who decided.
        resolution: Resolution,
    },
    /// [`LedgerStore::put_rule`].
    RulePut(AutoApprovalRule),
    /// [`LedgerStore::remove_rule`] that removed one.
    RuleRemove {
        /// The rule's gatekeeper.
        gatekeeper: String,
        /// The rule's tag.
        tag: String,
    },
    /// [`LedgerStore::latch_lockdown`].
    Lockdown,
    /// [`ActionStorage::insert_pending`] that staged `record`.
    ActionInsert {
        /// The store's gatekeeper.
        gatekeeper: Arc<str>,
        /// The staged record (its id is the one handed out).
        record: ActionRecord,
        /// The cap the call was made with.
        max_open: usize,
    },
    /// [`ActionStorage::compare_and_set`] that succeeded: what moves (the staged tool,
    /// definition, arguments and time are the staged record's, never rewritten).
    ActionSet {
        /// The store's gatekeeper.
        gatekeeper: Arc<str>,
        /// The record.
        id: DriverActionId,
        /// The state it moved from.
        from: StateTag,
        /// The state it moved to.
        state: ActionState,
        /// When an apply last claimed it.
        claimed_at: Option<Timestamp>,
    },
    /// [`ActionStorage::amend_pending`] that replaced a pending call's arguments.
    ActionAmend {
        /// The store's gatekeeper.
        gatekeeper: Arc<str>,
        /// The record.
        id: DriverActionId,
        /// Its new arguments.
        args: Arc<Value>,
    },
    /// [`ActionStorage::delete_pending`] that deleted one.
    ActionDelete {
        /// The store's gatekeeper.
        gatekeeper: Arc<str>,
        /// The record deleted.
        id: DriverActionId,
    },
    /// [`ActionStorage::prune_final`] that deleted `pruned` records, as builds before
    /// [`Op::ActionPruned`] recorded it (replayed as it was: the same prune again).
    ActionPrune {
        /// The store's gatekeeper.
        gatekeeper: Arc<str>,
        /// How many to keep.
        keep: usize,
        /// How many it deleted.
        pruned: usize,
    },
    /// [`ActionStorage::prune_final`] that deleted these settled records. Naming them,
    /// not the prune's count, makes the record mean the same wherever the batch's other
    /// records are merged (`fold.rs`).
    ActionPruned {
        /// The store's gatekeeper.
        gatekeeper: Arc<str>,
        /// The records deleted.
        ids: Vec<DriverActionId>,
        /// Records the prune deleted too, whose stage `fold` passed over (never in the
        /// journal: only `fold` fills it, from `ids`).
        #[serde(skip)]
        passed: Vec<DriverActionId>,
    },
    /// Made by `fold` only, never journaled: in place of the [`Op::ActionInsert`] of a
    /// call that a later [`Op::ActionPruned`] of the same batch deletes, settled. Its id
    /// is handed out as the stage would have, under the same cap, and its row is never
    /// written.
    #[serde(skip)]
    ActionPassed {
        /// The store's gatekeeper.
        gatekeeper: Arc<str>,
        /// The call's id.
        id: DriverActionId,
        /// The cap its stage was made with.
        max_open: usize,
    },
}

/// A record as the journal stores it, in a buffer its thread uses again for the next one
/// (the journal copies it): encoding into a new buffer grew it three or four times per
/// record.
fn encode(op: &Op) -> Result<Encoded, StoreError> {
    let mut buffer = ENCODE_BUFFER.take();
    buffer.clear();
    match serde_json::to_writer(&mut buffer, op) {
        Ok(()) => Ok(Encoded(buffer)),
        Err(e) => Err(StoreError::decode("a journal record", e)),
    }
}

thread_local! {
    /// The buffer [`encode`] writes into, while no [`Encoded`] holds it.
    static ENCODE_BUFFER: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// An encoded record; its buffer goes back to its thread's [`ENCODE_BUFFER`] when dropped
/// (unless it grew past 64 KiB for one large record).
struct Encoded(Vec<u8>);

impl std::ops::Deref for Encoded {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Encoded {
    fn drop(&mut self) {
        if self.0.capacity() <= 64 * 1024 {
            ENCODE_BUFFER.set(std::mem::take(&mut self.0));
        }
    }
}

impl Op {
    /// Give `action` what an [`Op::ActionPut`] moves (nothing for any other record).
    pub(crate) fn move_action(&self, action: &mut kernel::ActionEntry) {
        if let Op::ActionPut {
            id: _,
            state,
            resolution,
            failure,
            blocked_by,
            restart_requested,
            revert,
        } = self
        {
            action.state = *state;
            action.resolution.clone_from(resolution);
            action.failure.clone_from(failure);
            action.blocked_by = *blocked_by;
            action.restart_requested = *restart_requested;
            action.revert.clone_from(revert);
        }
    }
}

/// The result of an async port call whose implementation never waits (the SQLite
/// adapters and the in-memory store do all their work when first polled).
fn ready<T>(future: impl Future<Output = T>) -> T {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(value) => value,
        Poll::Pending => unreachable!("store calls finish when first polled"),
    }
}

/// What the applier writes through, and where it has got to.
struct Applier {
    db: Database,
    ledger: SqliteLedger,
    actions: HashMap<Arc<str>, SqliteActionStorage>,
    /// The last record applied into SQLite's open transaction (or committed).
    applied: u64,
    /// The position SQLite's last commit recorded.
    committed: u64,
}

impl Applier {
    fn new(db: Database) -> Self {
        Self {
            ledger: SqliteLedger::new(db.clone()),
            db,
            actions: HashMap::new(),
            applied: 0,
            committed: 0,
        }
    }

    fn actions(&mut self, gatekeeper: &Arc<str>) -> &SqliteActionStorage {
        let db = &self.db;
        self.actions
            .entry(gatekeeper.clone())
            .or_insert_with(|| SqliteActionStorage::new(db.clone(), gatekeeper))
    }

    /// Apply one record through the adapters, checking that SQLite answers what the copy
    /// in memory answered.
    fn apply(&mut self, op: Op) -> Result<(), String> {
        let differs = |what: &str| Err(format!("the file answered differently: {what}"));
        match op {
            Op::LedgerInsert(entry) => {
                let id = entry.id;
                let mut entry = Some(entry);
                let given = self
                    .ledger
                    .insert(&mut |_| entry.take().expect("insert builds one entry"))
                    .map_err(|e| e.to_string())?;
                if given != id {
                    return differs(&format!("ledger entry {id} was given id {given}"));
                }
            }
            Op::LedgerPut(entry) => self.ledger.put(entry).map_err(|e| e.to_string())?,
            put @ Op::ActionPut { id, .. } => {
                let mut entry = self
                    .ledger
                    .get(id)
                    .map_err(|e| e.to_string())?
                    .ok_or_else(|| format!("the file has no ledger entry {id}"))?;
                let EntryBody::Action(action) = &mut entry.body else {
                    return differs(&format!("ledger entry {id} is not an action"));
                };
                put.move_action(action);
                self.ledger.put(entry).map_err(|e| e.to_string())?;
            }
            Op::LedgerAttempt { id, resolution } => {
                if !self
                    .ledger
                    .record_attempt(id, &resolution)
                    .map_err(|e| e.to_string())?
                {
                    return differs(&format!("the decision on ledger entry {id} was refused"));
                }
            }
            Op::RulePut(rule) => self.ledger.put_rule(&rule).map_err(|e| e.to_string())?,
            Op::RuleRemove { gatekeeper, tag } => {
                self.ledger
                    .remove_rule(&gatekeeper, &tag)
                    .map_err(|e| e.to_string())?;
            }
            Op::Lockdown => self.ledger.latch_lockdown().map_err(|e| e.to_string())?,
            Op::ActionInsert {
                gatekeeper,
                record,
                max_open,
            } => {
                let id = record.id;
                let staged = self
                    .actions(&gatekeeper)
                    .stage(record, max_open)
                    .map_err(|e| e.to_string())?;
                if staged != Some(id) {
                    return differs(&format!(
                        "{gatekeeper}'s action {id} was staged as {staged:?}"
                    ));
                }
            }
            Op::ActionSet {
                gatekeeper,
                id,
                from,
                state,
                claimed_at,
            } => {
                let store = self.actions(&gatekeeper);
                let staged = ready(store.get(id))
                    .map_err(|e| e.to_string())?
                    .ok_or_else(|| format!("the file has no action {id} of {gatekeeper}"))?;
                let record = ActionRecord {
                    state,
                    claimed_at,
                    ..staged
                };
                if !ready(store.compare_and_set(from, &record)).map_err(|e| e.to_string())? {
                    return differs(&format!(
                        "{gatekeeper}'s action {id} did not move from {from}"
                    ));
                }
            }
            Op::ActionAmend {
                gatekeeper,
                id,
                args,
            } => {
                if !ready(self.actions(&gatekeeper).amend_pending(id, args))
                    .map_err(|e| e.to_string())?
                {
                    return differs(&format!(
                        "{gatekeeper}'s action {id} was not pending to take its new arguments"
                    ));
                }
            }
            Op::ActionDelete { gatekeeper, id } => {
                if !ready(self.actions(&gatekeeper).delete_pending(id))
                    .map_err(|e| e.to_string())?
                {
                    return differs(&format!("{gatekeeper}'s action {id} was not deleted"));
                }
            }
            Op::ActionPrune {
                gatekeeper,
                keep,
                pruned,
            } => {
                let deleted = ready(self.actions(&gatekeeper).prune_final(keep))
                    .map_err(|e| e.to_string())?;
                if deleted != pruned {
                    return differs(&format!(
                        "{gatekeeper} pruned {deleted} records, not {pruned}"
                    ));
                }
            }
            Op::ActionPassed {
                gatekeeper,
                id,
                max_open,
            } => {
                let handed = self
                    .actions(&gatekeeper)
                    .pass(max_open)
                    .map_err(|e| e.to_string())?;
                if handed != Some(id) {
                    return differs(&format!(
                        "{gatekeeper}'s action {id} was handed out as {handed:?}"
                    ));
                }
            }
            Op::ActionPruned {
                gatekeeper,
                ids,
                passed,
            } => {
                let deleted = self
                    .actions(&gatekeeper)
                    .delete_final(&ids, passed.iter().copied().max())
                    .map_err(|e| e.to_string())?;
                if deleted != ids.len() {
                    return differs(&format!(
                        "{gatekeeper} deleted {deleted} of the {} settled records pruned",
                        ids.len()
                    ));
                }
            }
        }
        Ok(())
    }

    /// Apply `records` in order, folded (`fold.rs`), and advance the position reached
    /// past the last one. After an error the position is left where it was: the journal
    /// then fails, and the open transaction is never committed.
    fn apply_all(&mut self, records: Vec<(u64, Op)>) -> Result<(), String> {
        let Some(&(last, _)) = records.last() else {
            return Ok(());
        };
        for (seq, op) in fold(records) {
            self.apply(op).map_err(|why| {
                format!("record {seq} (with any later change of the same row up to record {last}) could not be written to the file: {why}")
            })?;
        }
        self.applied = last;
        Ok(())
    }

    /// Record the position reached and commit (without a sync).
    fn commit(&mut self) -> Result<(), StoreError> {
        if self.applied != self.committed {
            write_position(&self.db, self.applied)?;
        }
        self.db.commit_behind()?;
        self.committed = self.applied;
        Ok(())
    }
}

/// Where SQLite keeps the journal position it holds: a key of the `kv` table, through its
/// adapter (behind a journal its writes join the open transaction, as every write does).
fn position_store(db: &Database) -> SqliteKv {
    SqliteKv::new(db.clone(), POSITION_SCOPE)
}

/// The journal position SQLite holds (0 for a file never used behind a journal).
fn read_position(db: &Database) -> Result<u64, StoreError> {
    let stored = position_store(db)
        .get(POSITION_KEY)
        .map_err(|e| StoreError::Port(e.0))?;
    match stored {
        None => Ok(0),
        Some(bytes) => Ok(u64::from_le_bytes((&bytes[..]).try_into().map_err(
            |_| StoreError::decode("journal position", "it is not 8 bytes long"),
        )?)),
    }
}

/// Write the journal position into the open transaction.
fn write_position(db: &Database, position: u64) -> Result<(), StoreError> {
    position_store(db)
        .put(POSITION_KEY, position.to_le_bytes().to_vec().into())
        .map_err(|e| StoreError::Port(e.0))
}

/// Run `wait`, which blocks the calling thread until the journal or the applier gets
/// somewhere (the ports are called from async code but answer synchronously). On a worker
/// of a multi-threaded tokio runtime (the daemon's) it runs inside
/// [`tokio::task::block_in_place`], so the runtime moves its other tasks to another thread
/// meanwhile: otherwise a runtime with two workers would have at most two callers waiting
/// for syncs at a time, and sixteen agents could share a sync two at most. Elsewhere (a
/// current-thread runtime, a plain thread) it just runs.
fn off_workers<T>(wait: impl FnOnce() -> T) -> T {
    if on_workers() {
        tokio::task::block_in_place(wait)
    } else {
        wait()
    }
}

/// Whether this thread is a worker of a multi-threaded tokio runtime.
fn on_workers() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|runtime| runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// Apply `batch` and commit it (without a sync), so another connection reading the file
/// (an `sqlite3` shell, `gate ledger`) is never more than a batch behind; then tell the
/// journal how far the file has got.
fn apply_batch(shared: &Shared, batch: Vec<(u64, Op)>) -> Result<(), String> {
    let reached = {
        let mut applier = shared.applier();
        applier.apply_all(batch)?;
        applier
            .commit()
            .map_err(|e| format!("the file could not be committed: {e}"))?;
        applier.applied
    };
    shared.journal.mark_applied(reached);
    Ok(())
}

/// Before a restart, which holds the journal's lock (every appender waits) until the file
/// holds every record durably: with appenders going on, sync what the file has so far,
/// apply what queued meanwhile (a few batches while the queue stays long), sync that too,
/// and apply what queued during that sync; the restart then applies only the last few
/// records, and syncs them with the last batch. Under sixteen
/// sessions the restart held the lock for 6–7 ms without this (a sync of half a ring's
/// pages, then a few hundred records queued while it ran): about a tenth of the time.
fn catch_up(shared: &Shared) -> Result<(), String> {
    let flush = || {
        shared
            .applier()
            .db
            .flush()
            .map_err(|e| format!("the file could not be synced: {e}"))
    };
    flush()?;
    for _ in 0..CATCH_UP_ROUNDS {
        let batch = shared.journal.take_now();
        let enough = batch.len() < CATCH_UP_ENOUGH;
        apply_batch(shared, batch)?;
        if enough {
            break;
        }
    }
    flush()?;
    apply_batch(shared, shared.journal.take_now())
}

/// How many batches [`catch_up`] applies at most between its two syncs (the applier
/// applies records about twice as fast as sixteen sessions append them, so each batch is
/// about half the one before).
const CATCH_UP_ROUNDS: usize = 4;

/// A batch shorter than this ends [`catch_up`]'s batches early.
const CATCH_UP_ENOUGH: usize = 64;

/// What the handle, the adapters and the applier share.
struct Shared {
    path: PathBuf,
    journal: Journal<Op>,
    applier: Mutex<Applier>,
}

impl Shared {
    fn applier(&self) -> MutexGuard<'_, Applier> {
        // The applier's state is its position; a panic mid-apply fails the journal first.
        self.applier.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn journal_error(&self, error: JournalError) -> StoreError {
        StoreError::Journal {
            path: journal_path(&self.path),
            detail: error.to_string(),
        }
    }

    /// Append `op`; the caller waits for it as `durability` says once it has let go of its
    /// own lock (see [`Shared::wait`]).
    fn append(&self, op: Op) -> Result<u64, StoreError> {
        let payload = encode(&op)?;
        self.append_encoded(&payload, op)
    }

    /// [`Shared::append`] of `op` already encoded as `payload`.
    fn append_encoded(&self, payload: &[u8], op: Op) -> Result<u64, StoreError> {
        self.journal
            .append(payload, op)
            .map_err(|e| self.journal_error(e))
    }

    /// Wait until record `seq` is as durable as `durability` asks: a sync, off the
    /// runtime's workers ([`off_workers`]); a write, on the caller's thread, since one
    /// `pwrite` into the page cache takes less than moving a worker's tasks to another
    /// thread would.
    fn wait(&self, seq: u64, durability: Durability) -> Result<(), StoreError> {
        match durability {
            Durability::Now => off_workers(|| self.journal.sync_through(seq)),
            Durability::Lazy => self.journal.write_through(seq),
            Durability::Deferred => Ok(()),
        }
        .map_err(|e| self.journal_error(e))
    }

    /// [`Shared::wait`] for a task: on a worker of a multi-threaded runtime, a task whose
    /// record waits for a sync somebody else runs gives its worker back to the runtime
    /// until that sync ends (the journal wakes it), instead of holding a thread; only the
    /// task that runs the sync holds one ([`off_workers`]). Sixteen agents waiting for
    /// one sync are then sixteen parked tasks, not sixteen sleeping threads each woken by
    /// the system. Elsewhere, as [`Shared::wait`].
    async fn wait_task(&self, seq: u64, durability: Durability) -> Result<(), StoreError> {
        if durability != Durability::Now || !on_workers() {
            return self.wait(seq, durability);
        }
        std::future::poll_fn(|cx| match self.journal.wait_synced(seq, cx.waker()) {
            SyncWait::Done(result) => Poll::Ready(result),
            SyncWait::Waiting => Poll::Pending,
            SyncWait::Lead => Poll::Ready(off_workers(|| self.journal.sync_through(seq))),
        })
        .await
        .map_err(|e| self.journal_error(e))
    }

    /// A read barrier: every record appended so far is in SQLite's open transaction, which
    /// this process's connection reads.
    fn caught_up(&self) -> Result<(), StoreError> {
        off_workers(|| self.journal.wait_applied()).map_err(|e| self.journal_error(e))
    }
}

/// The timer slack of the syncer's thread, in nanoseconds: how late the system may end
/// its timed waits, which are the gathering before a sync (`GATHER` in `journal.rs`).
/// Linux gives a thread 50 µs by default, a quarter of that wait, so the gathering
/// overshot by up to that much while the disk stood idle. With 1 µs, taken turn about
/// with the default in three alternations (raw write+fsync about 100 µs), sixteen tasks
/// reached 4.56–4.62 × one task's throughput against 4.26–4.30 ×, and sixteen threads
/// 3.73–3.88 × against 3.45–3.81 ×.
#[cfg(target_os = "linux")]
const SYNCER_TIMER_SLACK_NS: std::ffi::c_ulong = 1_000;

/// Let the calling thread's timed waits end on time (see [`SYNCER_TIMER_SLACK_NS`]). A
/// refusal leaves the default slack, which costs speed, not correctness.
fn precise_timers() {
    #[cfg(target_os = "linux")]
    if let Err(error) = nix::sys::prctl::set_timerslack(SYNCER_TIMER_SLACK_NS) {
        tracing::debug!(%error, "the syncer keeps the default timer slack");
    }
}

/// The applier's loop: apply what is queued, commit now and then, start the journal over
/// when it has run half its ring; on close, commit and sync everything.
fn run_applier(shared: &Shared) {
    let fail = |detail: String| {
        error!(%detail, "journal.apply.failed");
        shared.journal.fail(detail);
    };
    while let Some(batch) = shared.journal.take_queued() {
        if let Err(why) = apply_batch(shared, batch) {
            fail(why);
            return;
        }
        if shared.journal.wants_restart() {
            if let Err(why) = catch_up(shared) {
                fail(why);
                return;
            }
            let restarted = shared.journal.restart(|last, queued| {
                let mut applier = shared.applier();
                applier.apply_all(queued)?;
                if applier.applied != last {
                    return Err(format!(
                        "the file took records up to {}, not up to {last}",
                        applier.applied
                    ));
                }
                applier.commit().map_err(|e| e.to_string())?;
                applier.db.flush().map_err(|e| e.to_string())
            });
            if let Err(e) = restarted {
                error!(error = %e, "journal.restart.failed");
                return;
            }
        }
    }
    // Closing: everything queued was applied; make it durable in the file.
    let mut applier = shared.applier();
    if let Err(e) = applier.commit().and_then(|()| applier.db.flush()) {
        error!(error = %e, "journal.close: the file could not be synced; the journal keeps every write");
    }
}

/// The handle that owns the applier and syncer threads; dropped with the last clone.
struct Handle {
    shared: Arc<Shared>,
    ledger: Arc<HotLedger>,
    stores: Mutex<HashMap<String, Arc<HotActions>>>,
    /// The applier's thread and the journal's syncer's.
    threads: Mutex<Option<(JoinHandle<()>, JoinHandle<()>)>>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shared.journal.close();
        let threads = self
            .threads
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let clean = threads.is_some_and(|(applier, syncer)| {
            let applied = applier.join().is_ok();
            syncer.join().is_ok() && applied
        });
        let applier = self.shared.applier();
        // Nothing left that the file does not hold durably: the journal is not needed.
        if clean && applier.committed == self.shared.journal.last_seq() {
            let _ = std::fs::remove_file(journal_path(&self.shared.path));
        }
    }
}

/// A database file owned by this process, behind a redo journal (see the module docs).
///
/// Cheap to clone; clones and the adapters made from it share the journal, the copy in
/// memory and the applier. When the last one is dropped, the applier writes everything
/// to the file, syncs it, and removes the journal.
#[derive(Clone)]
pub struct Journaled {
    handle: Arc<Handle>,
}

impl std::fmt::Debug for Journaled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journaled")
            .field("path", &self.handle.shared.path)
            .finish_non_exhaustive()
    }
}

impl Journaled {
    /// Open (or create) the database file at `path` for this process alone, with its
    /// journal (`<path>-redo`).
    ///
    /// The file is checked as [`Database::open`] checks it. Opening fails with
    /// [`StoreError::InUse`] if another process has the file open, either way. Then the
    /// journal's records past the position SQLite holds are written to the file, claims
    /// of the process that wrote them are settled as interrupted (and the ledger
    /// reconciled, as on a shared file), and the file is synced before anything new is
    /// written.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        crate::db::check_regular_file(&path, true)?;
        let journal_file = journal_path(&path);
        let new_journal = !journal_file.exists();
        // The journal's lock first: of two processes opening at once, one goes on.
        let (journal, records) = Journal::open(&journal_file).map_err(|e| match e {
            JournalError::Busy { .. } => StoreError::InUse { path: path.clone() },
            other => StoreError::Journal {
                path: journal_file.clone(),
                detail: other.to_string(),
            },
        })?;
        let (applier, parts) = match Self::recover(&path, &journal, records) {
            Ok(recovered) => recovered,
            Err(error) => {
                // A refused open leaves nothing next to the file that it created (a
                // journal left behind would make the file refuse a shared open); removed
                // while its lock is held, so no other process has opened it meanwhile.
                if new_journal {
                    let _ = std::fs::remove_file(&journal_file);
                }
                return Err(error);
            }
        };
        let shared = Arc::new(Shared {
            path,
            journal,
            applier: Mutex::new(applier),
        });
        let ledger = Arc::new(HotLedger::from_parts(shared.clone(), parts));
        let spawn = |name: &str, run: fn(&Shared)| {
            let for_thread = shared.clone();
            std::thread::Builder::new()
                .name(format!("store-sqlite-{name}"))
                .spawn(move || run(&for_thread))
                .map_err(|e| StoreError::CannotOpen {
                    path: shared.path.clone(),
                    detail: format!("cannot start the {name} thread: {e}"),
                })
        };
        let syncer = spawn("syncer", |shared| {
            precise_timers();
            shared.journal.run_syncer()
        })?;
        let applier = match spawn("applier", run_applier) {
            Ok(applier) => applier,
            Err(error) => {
                shared.journal.close();
                let _ = syncer.join();
                return Err(error);
            }
        };
        Ok(Self {
            handle: Arc::new(Handle {
                shared,
                ledger,
                stores: Mutex::default(),
                threads: Mutex::new(Some((applier, syncer))),
            }),
        })
    }

    /// Open the file behind `journal`, write the journal's `records` into it past the
    /// position it holds, settle what the dead process left, sync the file, start the
    /// journal's next round, and read the ledger's copy for memory.
    fn recover(
        path: &Path,
        journal: &Journal<Op>,
        records: Vec<(u64, Vec<u8>)>,
    ) -> Result<(Applier, LedgerCopyParts), StoreError> {
        let journal_file = journal.path().to_path_buf();
        let path = path.to_path_buf();
        let db = Database::open_behind(&path)?;
        if db.shared().others_alive() {
            return Err(StoreError::InUse { path });
        }
        let corrupt = |detail: String| StoreError::Journal {
            path: journal_file.clone(),
            detail,
        };
        let held = read_position(&db)?;
        let mut missing = Vec::new();
        for (seq, payload) in records.into_iter().filter(|(seq, _)| *seq > held) {
            let last = missing.last().map_or(held, |(last, _)| *last);
            if seq != last + 1 {
                return Err(corrupt(format!(
                    "its records jump from {last} to {seq}: records are missing; nothing was changed"
                )));
            }
            let op: Op = serde_json::from_slice(&payload)
                .map_err(|e| corrupt(format!("record {seq} cannot be read ({e})")))?;
            missing.push((seq, op));
        }
        let replayed = missing.len();
        let mut applier = Applier::new(db.clone());
        applier.applied = held;
        applier.committed = held;
        applier.apply_all(missing).map_err(corrupt)?;
        let last = applier.applied;
        // The claims just replayed are the dead process's, not this one's.
        disown_claims(&db)?;
        let reconciled = crate::recover::reconcile(&db)?;
        applier.commit()?;
        db.flush()?;
        if replayed > 0 || reconciled > 0 {
            info!(replayed, reconciled, "journal.replayed");
        }
        journal.start_round(last + 1);
        let parts = HotLedger::load(&applier)?;
        Ok((applier, parts))
    }

    /// The kernel's ledger, rules and lockdown latch, for
    /// [`kernel::Overseer::with_store`].
    pub fn ledger(&self) -> Arc<dyn LedgerStore> {
        self.handle.ledger.clone()
    }

    /// The action store of the gatekeeper named `gatekeeper` (see
    /// [`Database::action_storage`]); its records are read from the file the first time.
    pub fn action_storage(&self, gatekeeper: &str) -> Result<Arc<dyn ActionStorage>, StoreError> {
        let mut stores = self.handle.stores.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(store) = stores.get(gatekeeper) {
            return Ok(store.clone());
        }
        let shared = &self.handle.shared;
        shared.caught_up()?;
        let gatekeeper: Arc<str> = gatekeeper.into();
        let memory = {
            let mut applier = shared.applier();
            let sqlite = applier.actions(&gatekeeper).clone();
            let mut records = Vec::new();
            for state in [
                StateTag::Pending,
                StateTag::Applying,
                StateTag::Applied,
                StateTag::Failed,
                StateTag::Rejected,
            ] {
                records.extend(ready(sqlite.records_in(state)).map_err(|e| StoreError::Port(e.0))?);
            }
            MemoryActionStorage::restore(records, sqlite.last_id()?)
        };
        let store = Arc::new(HotActions {
            shared: shared.clone(),
            gatekeeper: gatekeeper.clone(),
            memory,
            lock: Mutex::new(()),
        });
        stores.insert(gatekeeper.to_string(), store.clone());
        Ok(store)
    }

    /// [`gatekeeper_core::ActionStore::open`] over [`Journaled::action_storage`].
    pub async fn action_store(
        &self,
        gatekeeper: &str,
        clock: Arc<dyn kernel::Clock>,
    ) -> Result<gatekeeper_core::ActionStore, StorageError> {
        let storage = self
            .action_storage(gatekeeper)
            .map_err(|e| StorageError(e.to_string()))?;
        gatekeeper_core::ActionStore::open(storage, clock).await
    }

    /// Sync the journal past every record so far and commit the file, so that another
    /// connection (a [`crate::LedgerReader`]) reads every write that returned before this
    /// call.
    pub fn flush(&self) -> Result<(), StoreError> {
        let shared = &self.handle.shared;
        let last = shared.journal.last_seq();
        shared.wait(last, Durability::Now)?;
        shared.caught_up()?;
        shared.applier().commit()
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.handle.shared.path
    }

    /// How many times the journal was synced since opening: what a write waits for.
    /// Tests and benchmarks count them.
    pub fn syncs(&self) -> u64 {
        self.handle.shared.journal.syncs()
    }

    /// How many times the file itself was synced since opening: by the applier, each time
    /// the journal starts over (about every half megabyte of records), never while a
    /// caller waits. Tests and benchmarks count them.
    pub fn file_syncs(&self) -> u64 {
        self.handle.shared.applier().db.syncs()
    }

    /// How many writes reached the journal file since opening (each one a run of records
    /// appended together). Tests and benchmarks count them.
    pub fn writes(&self) -> u64 {
        self.handle.shared.journal.writes()
    }

    /// How many bytes at the start of the journal file a sync has covered since it last
    /// started over: a power cut keeps them. For tests that cut a copy of the journal.
    #[doc(hidden)]
    pub fn journal_synced_len(&self) -> u64 {
        self.handle.shared.journal.synced_len()
    }

    /// [`Database::query_text`] on the file, after [`Journaled::flush`].
    pub fn query_text(&self, sql: &str) -> Result<Vec<Vec<Option<String>>>, StoreError> {
        self.flush()?;
        let db = self.handle.shared.applier().db.clone();
        db.query_text(sql)
    }
}

/// Claims this process's connection wrote while replaying belong to the process that
/// took them, which is gone: mark them as nobody's, so reconciling settles them.
fn disown_claims(db: &Database) -> Result<(), StoreError> {
    let me = db.shared().session_id().map(str::to_owned);
    db.shared().write(Durability::Deferred, Steps::One, |conn| {
        conn.known.forget();
        conn.db
            .prepare_cached(
                "UPDATE actions SET claimed_by = NULL WHERE state = 'applying' AND claimed_by IS ?1",
            )?
            .execute([me])?;
        Ok(())
    })
}

fn port(error: StoreError) -> StorageError {
    StorageError(error.to_string())
}

fn kernel_port(error: StoreError) -> kernel::StorageError {
    kernel::StorageError(error.to_string())
}

/// One gatekeeper's action store: the records in memory, each change journaled.
struct HotActions {
    shared: Arc<Shared>,
    gatekeeper: Arc<str>,
    memory: MemoryActionStorage,
    /// Held from the change in memory to its append, so the journal's order is the
    /// order of the changes.
    lock: Mutex<()>,
}

impl HotActions {
    /// The move of [`ActionStorage::compare_and_set`], in the copy and the journal:
    /// `None` if the stored state is not `from`; else the record's sequence number and
    /// how durable it must be before anything acts on it (the claim and its recovery at
    /// once, as on a shared file; every other move rides with the next record written).
    fn append_set(
        &self,
        from: StateTag,
        record: &ActionRecord,
    ) -> Result<Option<(u64, Durability)>, StorageError> {
        if record.state == ActionState::Applying && record.args.is_null() {
            return Err(port(StoreError::Unsendable {
                id: record.id.0,
                reason: format!("the arguments of action {} were not readable", record.id),
            }));
        }
        let durability = if record.state == ActionState::Applying
            || (from == StateTag::Applying && is_interruption(record))
        {
            Durability::Now
        } else {
            Durability::Deferred
        };
        let _order = self.lock();
        if !ready(self.memory.compare_and_set(from, record))? {
            return Ok(None);
        }
        let seq = self
            .shared
            .append(Op::ActionSet {
                gatekeeper: self.gatekeeper.clone(),
                id: record.id,
                from,
                state: record.state.clone(),
                claimed_at: record.claimed_at,
            })
            .map_err(port)?;
        Ok(Some((seq, durability)))
    }

    fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl ActionStorage for HotActions {
    async fn insert_pending(
        &self,
        tool: Arc<str>,
        definition: Option<Arc<str>>,
        args: Arc<Value>,
        submitted_at: Timestamp,
        max_open: usize,
    ) -> Result<Option<DriverActionId>, StorageError> {
        // What the file would refuse is refused here, before anything changes.
        gatekeeper_core::store::object_arguments(&args)?;
        crate::json::readable_value(&args, "the call's arguments").map_err(port)?;
        let _order = self.lock();
        let staged =
            ready(
                self.memory
                    .insert_pending(tool, definition, args, submitted_at, max_open),
            )?;
        if let Some(id) = staged {
            let record = ready(self.memory.get(id))?
                .ok_or_else(|| StorageError(format!("action {id} vanished as it was staged")))?;
            self.shared
                .append(Op::ActionInsert {
                    gatekeeper: self.gatekeeper.clone(),
                    record,
                    max_open,
                })
                .map_err(port)?;
        }
        Ok(staged)
    }

    async fn get(&self, id: DriverActionId) -> Result<Option<ActionRecord>, StorageError> {
        ready(self.memory.get(id))
    }

    async fn compare_and_set(
        &self,
        from: StateTag,
        record: &ActionRecord,
    ) -> Result<bool, StorageError> {
        let Some((seq, durability)) = self.append_set(from, record)? else {
            return Ok(false);
        };
        self.shared.wait(seq, durability).map_err(port)?;
        Ok(true)
    }

    async fn claim(
        &self,
        from: StateTag,
        record: &ActionRecord,
    ) -> Result<Option<ClaimDurable>, StorageError> {
        let Some((seq, durability)) = self.append_set(from, record)? else {
            return Ok(None);
        };
        // The store guards the written claim before it awaits this: on the daemon's
        // runtime the wait is a future that holds no thread (`Shared::wait_task`).
        let shared = self.shared.clone();
        let durable = async move { shared.wait_task(seq, durability).await.map_err(port) };
        Ok(Some(Box::pin(durable)))
    }

    async fn count_open(&self) -> Result<usize, StorageError> {
        ready(self.memory.count_open())
    }

    async fn delete_pending(&self, id: DriverActionId) -> Result<bool, StorageError> {
        let _order = self.lock();
        if !ready(self.memory.delete_pending(id))? {
            return Ok(false);
        }
        self.shared
            .append(Op::ActionDelete {
                gatekeeper: self.gatekeeper.clone(),
                id,
            })
            .map_err(port)?;
        Ok(true)
    }

    async fn records_in(&self, state: StateTag) -> Result<Vec<ActionRecord>, StorageError> {
        ready(self.memory.records_in(state))
    }

    async fn amend_pending(
        &self,
        id: DriverActionId,
        args: Arc<Value>,
    ) -> Result<bool, StorageError> {
        // What the file would refuse is refused here, before anything changes.
        gatekeeper_core::store::object_arguments(&args)?;
        crate::json::readable_value(&args, "the call's arguments").map_err(port)?;
        let seq = {
            let _order = self.lock();
            if !ready(self.memory.amend_pending(id, args.clone()))? {
                return Ok(false);
            }
            self.shared
                .append(Op::ActionAmend {
                    gatekeeper: self.gatekeeper.clone(),
                    id,
                    args,
                })
                .map_err(port)?
        };
        // Durable before the person is told it was kept, as a rejection is.
        self.shared
            .wait_task(seq, Durability::Now)
            .await
            .map_err(port)?;
        Ok(true)
    }

    async fn prune_final(&self, keep: usize) -> Result<usize, StorageError> {
        let _order = self.lock();
        let ids = self.memory.prune_final_ids(keep);
        let pruned = ids.len();
        if pruned > 0 {
            self.shared
                .append(Op::ActionPruned {
                    gatekeeper: self.gatekeeper.clone(),
                    ids,
                    passed: Vec::new(),
                })
                .map_err(port)?;
        }
        Ok(pruned)
    }
}

/// The ledger in memory: open entries, recent settled ones, rules and the latch.
#[derive(Default)]
struct LedgerCopy {
    last_id: u64,
    /// Open entries, and settled ones not yet evicted, by id.
    entries: BTreeMap<u64, LedgerEntry>,
    /// Per gatekeeper, its open actions' ids.
    open: HashMap<Arc<str>, BTreeSet<u64>>,
    /// Settled entries in `entries`, oldest first: the next to evict.
    settled: BTreeSet<u64>,
    /// Per gatekeeper and driver id, the ledger id of the entries in `entries`.
    by_driver: HashMap<(Arc<str>, u64), u64>,
    /// Per gatekeeper, the highest driver id of an action this copy may not hold: those
    /// in the file when it was opened, and those evicted since. A driver id above it is
    /// in the ledger only if `by_driver` holds it, so the duplicate check of a new
    /// submission needs no read, even when concurrent sessions submit their staged ids
    /// out of order.
    unheld_top: HashMap<Arc<str>, u64>,
}

fn is_open(entry: &LedgerEntry) -> bool {
    entry.action().is_some_and(kernel::ActionEntry::is_open)
}

impl LedgerCopy {
    /// Keep `entry` as it now stands (replacing any older copy), then evict the oldest
    /// settled entries past [`HOT_ENTRIES`].
    fn keep(&mut self, entry: LedgerEntry) {
        let id = entry.id.0;
        let gatekeeper = entry.gatekeeper.clone();
        if let EntryBody::Action(action) = &entry.body {
            self.by_driver
                .insert((gatekeeper.clone(), action.driver_id.0), id);
        }
        if is_open(&entry) {
            self.open.entry(gatekeeper).or_default().insert(id);
            self.settled.remove(&id);
        } else {
            if let Some(ids) = self.open.get_mut(&gatekeeper) {
                ids.remove(&id);
            }
            self.settled.insert(id);
        }
        self.entries.insert(id, entry);
        while self.settled.len() > HOT_ENTRIES {
            let Some(oldest) = self.settled.pop_first() else {
                break;
            };
            if let Some(evicted) = self.entries.remove(&oldest)
                && let EntryBody::Action(action) = &evicted.body
            {
                self.by_driver
                    .remove(&(evicted.gatekeeper.clone(), action.driver_id.0));
                let top = self
                    .unheld_top
                    .entry(evicted.gatekeeper.clone())
                    .or_default();
                *top = (*top).max(action.driver_id.0);
            }
        }
    }
}

/// The kernel's [`LedgerStore`] behind the journal.
struct HotLedger {
    shared: Arc<Shared>,
    copy: Mutex<LedgerCopy>,
    rules: Mutex<BTreeMap<(String, String), Arc<AutoApprovalRule>>>,
    locked_down: std::sync::atomic::AtomicBool,
}

impl HotLedger {
    /// The copy in memory, read from the file (its open entries, rules and latch). The
    /// `shared` field is filled in by the caller.
    fn load(applier: &Applier) -> Result<LedgerCopyParts, StoreError> {
        let db = &applier.db;
        let (last_id, open, unheld_top) = db.shared().read(|conn| {
            let last: i64 = conn
                .prepare_cached("SELECT COALESCE(MAX(id), 0) FROM ledger")?
                .query_row([], |r| r.get(0))?;
            let unheld_top = conn
                .prepare(
                    "SELECT gatekeeper, max(driver_id) FROM ledger WHERE kind = 'action'
                     GROUP BY gatekeeper",
                )?
                .query_map([], |r| {
                    Ok((
                        Arc::<str>::from(r.get::<_, String>(0)?),
                        u64::try_from(r.get::<_, i64>(1)?).unwrap_or(0),
                    ))
                })?
                .collect::<Result<HashMap<_, _>, _>>()?;
            let open = conn
                .prepare(
                    "SELECT id FROM ledger WHERE kind = 'action'
                       AND (state = 'pending' OR (state = 'failed' AND failure_retryable = 1))
                     ORDER BY id",
                )?
                .query_map([], |r| r.get::<_, i64>(0))?
                .map(|id| id.map(|id| u64::try_from(id).unwrap_or(0)))
                .collect::<Result<Vec<_>, _>>()?;
            Ok((u64::try_from(last).unwrap_or(0), open, unheld_top))
        })?;
        let mut copy = LedgerCopy {
            last_id,
            unheld_top,
            ..LedgerCopy::default()
        };
        for id in open {
            if let Some(entry) = applier
                .ledger
                .get(LedgerId(id))
                .map_err(|e| StoreError::Port(e.0))?
            {
                copy.keep(entry);
            }
        }
        let rules = applier
            .ledger
            .rules()
            .map_err(|e| StoreError::Port(e.0))?
            .into_iter()
            .map(|rule| {
                (
                    (rule.gatekeeper.to_string(), rule.kind.tag.clone()),
                    Arc::new(rule),
                )
            })
            .collect();
        let locked_down = applier
            .ledger
            .locked_down()
            .map_err(|e| StoreError::Port(e.0))?;
        Ok(LedgerCopyParts {
            copy,
            rules,
            locked_down,
        })
    }

    fn copy(&self) -> MutexGuard<'_, LedgerCopy> {
        // Each method changes the copy after its checks, in one step.
        self.copy.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The entry `id` from the file (after the applier caught up), for a copy that does
    /// not hold it.
    fn read_through(&self, id: LedgerId) -> Result<Option<LedgerEntry>, kernel::StorageError> {
        self.shared.caught_up().map_err(kernel_port)?;
        let ledger = self.shared.applier().ledger.clone();
        ledger.get(id)
    }

    /// Run `change` on the current copy of entry `id` (read through if not held), under
    /// the copy's lock; `change` is given `None` if there is no such entry.
    fn with_entry<T>(
        &self,
        id: LedgerId,
        change: impl FnOnce(&mut LedgerCopy, Option<&LedgerEntry>) -> Result<T, kernel::StorageError>,
    ) -> Result<T, kernel::StorageError> {
        let mut copy = self.copy();
        if copy.entries.contains_key(&id.0) || id.0 > copy.last_id {
            let current = copy.entries.get(&id.0).cloned();
            return change(&mut copy, current.as_ref());
        }
        drop(copy);
        let read = self.read_through(id)?;
        let mut copy = self.copy();
        // A write that landed meanwhile went through the copy: prefer it.
        let current = copy.entries.get(&id.0).cloned().or(read);
        change(&mut copy, current.as_ref())
    }
}

/// What [`HotLedger::load`] reads.
struct LedgerCopyParts {
    copy: LedgerCopy,
    rules: BTreeMap<(String, String), Arc<AutoApprovalRule>>,
    locked_down: bool,
}

impl HotLedger {
    fn from_parts(shared: Arc<Shared>, parts: LedgerCopyParts) -> Self {
        Self {
            shared,
            copy: Mutex::new(parts.copy),
            rules: Mutex::new(parts.rules),
            locked_down: std::sync::atomic::AtomicBool::new(parts.locked_down),
        }
    }

    fn rules(&self) -> MutexGuard<'_, BTreeMap<(String, String), Arc<AutoApprovalRule>>> {
        self.rules.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait(&self, seq: u64, durability: Durability) -> Result<(), kernel::StorageError> {
        self.shared.wait(seq, durability).map_err(kernel_port)
    }
}

impl HotLedger {
    /// Keep the entry `make` builds for the next id in the copy and append its record;
    /// returns the id and the record's sequence number, not yet synced.
    fn append_insert(
        &self,
        make: &mut dyn FnMut(LedgerId) -> LedgerEntry,
    ) -> Result<(LedgerId, u64), kernel::StorageError> {
        let mut copy = self.copy();
        let id = LedgerId(copy.last_id + 1);
        let entry = make(id);
        if entry.id != id {
            return Err(kernel_port(StoreError::Missing(format!(
                "entry built for {id} carries id {}",
                entry.id
            ))));
        }
        let op = Op::LedgerInsert(entry.clone());
        let payload = encode(&op).map_err(kernel_port)?;
        if !crate::json::shallow(&payload) {
            check_readable(&entry, true)?;
        }
        let seq = self
            .shared
            .append_encoded(&payload, op)
            .map_err(kernel_port)?;
        copy.last_id = id.0;
        copy.keep(entry);
        Ok((id, seq))
    }
}

impl LedgerStore for HotLedger {
    fn insert(
        &self,
        make: &mut dyn FnMut(LedgerId) -> LedgerEntry,
    ) -> Result<LedgerId, kernel::StorageError> {
        let (id, seq) = self.append_insert(make)?;
        self.wait(seq, Durability::Now)?;
        Ok(id)
    }

    fn insert_durable_later(
        &self,
        make: &mut dyn FnMut(LedgerId) -> LedgerEntry,
    ) -> Result<(LedgerId, DurableFuture), kernel::StorageError> {
        let (id, seq) = self.append_insert(make)?;
        let shared = self.shared.clone();
        let durable = async move {
            shared
                .wait_task(seq, Durability::Now)
                .await
                .map_err(kernel_port)
        };
        Ok((id, Box::pin(durable)))
    }

    fn insert_lazy(
        &self,
        make: &mut dyn FnMut(LedgerId) -> LedgerEntry,
    ) -> Result<LedgerId, kernel::StorageError> {
        let (id, seq) = self.append_insert(make)?;
        // Written (a crash of the process keeps it), synced by whoever syncs next.
        self.wait(seq, Durability::Lazy)?;
        Ok(id)
    }

    fn get(&self, id: LedgerId) -> Result<Option<LedgerEntry>, kernel::StorageError> {
        {
            let copy = self.copy();
            if let Some(entry) = copy.entries.get(&id.0) {
                return Ok(Some(entry.clone()));
            }
            if id.0 > copy.last_id || id.0 == 0 {
                return Ok(None);
            }
        }
        self.read_through(id)
    }

    fn put(&self, entry: LedgerEntry) -> Result<(), kernel::StorageError> {
        let durability = put_durability(&entry);
        let op = match &entry.body {
            EntryBody::Action(action) => Op::ActionPut {
                id: entry.id,
                state: action.state,
                resolution: action.resolution.clone(),
                failure: action.failure.clone(),
                blocked_by: action.blocked_by,
                restart_requested: action.restart_requested,
                revert: action.revert.clone(),
            },
            EntryBody::Observation(_) => Op::LedgerPut(entry.clone()),
        };
        let payload = encode(&op).map_err(kernel_port)?;
        if !crate::json::shallow(&payload) {
            check_readable(&entry, false)?;
        }
        let id = entry.id;
        let seq = self.with_entry(id, |copy, current| {
            let refused = match (current.map(|c| &c.body), &entry.body) {
                (Some(EntryBody::Observation(_)), EntryBody::Observation(_)) => None,
                (Some(EntryBody::Action(_)), EntryBody::Action(action))
                    if action.state == kernel::ActionState::Pending =>
                {
                    (!current.is_some_and(is_open)).then_some(StoreError::NotOpen { id: id.0 })
                }
                (Some(EntryBody::Action(_)), EntryBody::Action(_)) => None,
                _ => Some(StoreError::Missing(format!(
                    "there is no ledger entry {id} of this kind to replace"
                ))),
            };
            if let Some(refused) = refused {
                return Err(kernel_port(refused));
            }
            let seq = self
                .shared
                .append_encoded(&payload, op)
                .map_err(kernel_port)?;
            copy.keep(entry);
            Ok(seq)
        })?;
        self.wait(seq, durability)
    }

    fn record_attempt(
        &self,
        id: LedgerId,
        resolution: &Resolution,
    ) -> Result<bool, kernel::StorageError> {
        self.with_entry(id, |copy, current| {
            let Some(mut entry) = current.filter(|c| c.action().is_some()).cloned() else {
                return Err(kernel_port(StoreError::Missing(format!(
                    "there is no ledger action {id} to record a decision on"
                ))));
            };
            if !is_open(&entry) {
                return Ok(false);
            }
            if let EntryBody::Action(action) = &mut entry.body {
                action.resolution = Some(resolution.clone());
            }
            // Deferred: it rides with the driver's claim, synced before anything is sent.
            self.shared
                .append(Op::LedgerAttempt {
                    id,
                    resolution: resolution.clone(),
                })
                .map_err(kernel_port)?;
            copy.keep(entry);
            Ok(true)
        })
    }

    fn entries(&self) -> Result<Vec<LedgerEntry>, kernel::StorageError> {
        self.shared.caught_up().map_err(kernel_port)?;
        let ledger = self.shared.applier().ledger.clone();
        ledger.entries()
    }

    fn open_action_ids(&self, gatekeeper: &str) -> Result<Vec<LedgerId>, kernel::StorageError> {
        Ok(self
            .copy()
            .open
            .get(gatekeeper)
            .map(|ids| ids.iter().map(|id| LedgerId(*id)).collect())
            .unwrap_or_default())
    }

    fn find_action(
        &self,
        gatekeeper: &str,
        driver_id: DriverActionId,
    ) -> Result<Option<LedgerId>, kernel::StorageError> {
        {
            let copy = self.copy();
            let gatekeeper: Arc<str> = Arc::from(gatekeeper);
            if let Some(id) = copy.by_driver.get(&(gatekeeper.clone(), driver_id.0)) {
                return Ok(Some(LedgerId(*id)));
            }
            if copy
                .unheld_top
                .get(&gatekeeper)
                .is_none_or(|top| driver_id.0 > *top)
            {
                return Ok(None);
            }
        }
        self.shared.caught_up().map_err(kernel_port)?;
        let ledger = self.shared.applier().ledger.clone();
        ledger.find_action(gatekeeper, driver_id)
    }

    fn put_rule(&self, rule: &AutoApprovalRule) -> Result<(), kernel::StorageError> {
        let seq = {
            let mut rules = self.rules();
            let seq = self
                .shared
                .append(Op::RulePut(rule.clone()))
                .map_err(kernel_port)?;
            rules.insert(
                (rule.gatekeeper.to_string(), rule.kind.tag.clone()),
                Arc::new(rule.clone()),
            );
            seq
        };
        self.wait(seq, Durability::Now)
    }

    fn remove_rule(&self, gatekeeper: &str, tag: &str) -> Result<bool, kernel::StorageError> {
        let seq = {
            let mut rules = self.rules();
            let key = (gatekeeper.to_owned(), tag.to_owned());
            if !rules.contains_key(&key) {
                return Ok(false);
            }
            let seq = self
                .shared
                .append(Op::RuleRemove {
                    gatekeeper: gatekeeper.to_owned(),
                    tag: tag.to_owned(),
                })
                .map_err(kernel_port)?;
            rules.remove(&key);
            seq
        };
        self.wait(seq, Durability::Now)?;
        Ok(true)
    }

    fn rule(
        &self,
        gatekeeper: &str,
        tag: &str,
    ) -> Result<Option<Arc<AutoApprovalRule>>, kernel::StorageError> {
        Ok(self
            .rules()
            .get(&(gatekeeper.to_owned(), tag.to_owned()))
            .cloned())
    }

    fn rules(&self) -> Result<Vec<AutoApprovalRule>, kernel::StorageError> {
        Ok(self
            .rules()
            .values()
            .map(|rule| AutoApprovalRule::clone(rule))
            .collect())
    }

    fn latch_lockdown(&self) -> Result<(), kernel::StorageError> {
        let seq = self.shared.append(Op::Lockdown).map_err(kernel_port)?;
        self.locked_down
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.wait(seq, Durability::Now)
    }

    fn locked_down(&self) -> Result<bool, kernel::StorageError> {
        Ok(self.locked_down.load(std::sync::atomic::Ordering::SeqCst))
    }
}

/// Refuse what the file would refuse to store: a description nested deeper than it reads
/// back. An action's description is stored when it is inserted and never rewritten.
fn check_readable(entry: &LedgerEntry, inserted: bool) -> Result<(), kernel::StorageError> {
    let json = match &entry.body {
        EntryBody::Action(action) if inserted => serde_json::to_string(&*action.description),
        EntryBody::Action(_) => return Ok(()),
        EntryBody::Observation(observation) => serde_json::to_string(observation),
    }
    .map_err(|e| kernel_port(StoreError::decode("a ledger description", e)))?;
    crate::json::readable(
        &json,
        &format!("the description of ledger entry {}", entry.id),
    )
    .map_err(kernel_port)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn precise_timers_sets_the_slack_of_the_calling_thread_only() {
        let before = nix::sys::prctl::get_timerslack().unwrap();
        let slack = std::thread::spawn(|| {
            // Linux's default, whatever this process inherited.
            nix::sys::prctl::set_timerslack(50_000).unwrap();
            precise_timers();
            nix::sys::prctl::get_timerslack().unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(slack as std::ffi::c_ulong, SYNCER_TIMER_SLACK_NS);
        assert_eq!(nix::sys::prctl::get_timerslack().unwrap(), before);
    }
}

//! Bringing in a redo journal that an older `gate serve` left beside its file.
//!
//! Before the daemon ran on the shared file, it kept its durable writes in a redo journal
//! (`<database>-redo`) and wrote them into SQLite a moment later; a daemon that stopped
//! cleanly left no journal, but a killed one left the records the file did not yet hold.
//! [`Database::open`] brings them in before anything else touches the file, exactly as
//! that daemon's next start would have: every record past the position the file holds is
//! replayed, in order, through the same adapters, in one transaction with the new
//! position; the dead process's claims become "interrupted" and the ledger is reconciled
//! (as on any open); the file is synced, and only then is the journal removed. A crash
//! at any point before the removal leaves the journal and the file as they were
//! committed: the next open replays what the file still lacks, and nothing twice.
//!
//! Kept, small, only for that: the journal's frame format (read, never written), its
//! records' JSON form, and the replay. The crate's tests open a journal that a daemon of
//! the older store left when it was killed (`tests/fixtures/left-journal`).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use gatekeeper_core::{ActionRecord, ActionStorage, StateTag};
use kernel::{
    AutoApprovalRule, DriverActionId, EntryBody, LedgerEntry, LedgerId, LedgerStore, Resolution,
    Timestamp,
};
use serde::Deserialize;
use serde_json::Value;
use tracing::info;

use crate::actions::SqliteActionStorage;
use crate::db::{Database, Durability, Steps, sidecar};
use crate::error::StoreError;
use crate::kv::SqliteKv;
use crate::ledger::SqliteLedger;
use gatekeeper_core::kv::KvStore as _;

/// Where the older store recorded the journal position the file holds (`kv` table).
const POSITION_SCOPE: &str = "store-sqlite journal";
const POSITION_KEY: &str = "applied";

/// A frame's header: `len` (u32), `seq` (u64) and `crc` (u32), little-endian.
const HEADER: usize = 16;

/// The redo journal an older daemon kept beside `database`.
pub(crate) fn journal_path(database: &Path) -> PathBuf {
    sidecar(database, "-redo")
}

/// One write as the journal recorded it (the older store's record, read back only).
#[derive(Debug, Deserialize)]
enum Op {
    LedgerInsert(LedgerEntry),
    LedgerPut(LedgerEntry),
    ActionPut {
        id: LedgerId,
        state: kernel::ActionState,
        resolution: Option<Resolution>,
        failure: Option<kernel::Failure>,
        blocked_by: Option<LedgerId>,
        restart_requested: bool,
        revert: Option<kernel::RevertRecord>,
    },
    LedgerAttempt {
        id: LedgerId,
        resolution: Resolution,
    },
    RulePut(AutoApprovalRule),
    RuleRemove {
        gatekeeper: String,
        tag: String,
    },
    Lockdown,
    ActionInsert {
        gatekeeper: Arc<str>,
        record: ActionRecord,
        max_open: usize,
    },
    ActionSet {
        gatekeeper: Arc<str>,
        id: DriverActionId,
        from: StateTag,
        state: gatekeeper_core::ActionState,
        claimed_at: Option<Timestamp>,
    },
    ActionAmend {
        gatekeeper: Arc<str>,
        id: DriverActionId,
        args: Arc<Value>,
    },
    ActionDelete {
        gatekeeper: Arc<str>,
        id: DriverActionId,
    },
    ActionPrune {
        gatekeeper: Arc<str>,
        keep: usize,
        pruned: usize,
    },
    ActionPruned {
        gatekeeper: Arc<str>,
        ids: Vec<DriverActionId>,
    },
}

/// Bring the journal at `journal` into the database file at `path`, then remove it (see
/// the module docs). Refused, changing nothing, if another process holds the journal (an
/// older daemon still running on it) or the file, or if a record cannot be read or
/// written as it was.
pub(crate) fn bring_in(path: &Path, journal: &Path) -> Result<(), StoreError> {
    let corrupt = |detail: String| StoreError::Journal {
        path: journal.to_owned(),
        detail,
    };
    let io = |what: &str, e: std::io::Error| corrupt(format!("{what}: {e}"));
    let file = std::fs::File::open(journal).map_err(|e| io("opening it", e))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(StoreError::InUse {
                path: path.to_owned(),
            });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(io("locking it", e)),
    }
    let bytes = std::fs::read(journal).map_err(|e| io("reading it", e))?;
    let db = Database::open_behind(path)?;
    if db.shared().others_alive() {
        return Err(StoreError::InUse {
            path: path.to_owned(),
        });
    }
    let held = read_position(&db)?;
    let mut last = held;
    let mut replay = Replay::new(db.clone());
    for (seq, payload) in read_chain(&bytes)
        .into_iter()
        .filter(|(seq, _)| *seq > held)
    {
        if seq != last + 1 {
            return Err(corrupt(format!(
                "its records jump from {last} to {seq}: records are missing; nothing was changed"
            )));
        }
        let op: Op = serde_json::from_slice(payload).map_err(|e| {
            corrupt(format!(
                "record {seq} cannot be read ({e}); nothing was changed"
            ))
        })?;
        replay.apply(op).map_err(|why| {
            corrupt(format!(
                "record {seq} could not be written to the file ({why}); nothing was changed"
            ))
        })?;
        last = seq;
    }
    // The claims just replayed are the dead process's, not this one's: the reconcile of
    // the open that follows turns them into "interrupted".
    disown_claims(&db)?;
    write_position(&db, last)?;
    db.flush()?;
    drop(replay);
    drop(db);
    std::fs::remove_file(journal).map_err(|e| io("removing it once the file held it", e))?;
    info!(replayed = last - held, "journal.brought_in");
    Ok(())
}

/// The frames of the journal's chain (see the module docs of the older store: frames
/// back to back from offset 0, each with consecutive numbers and a valid checksum; the
/// first that is not ends it), as `(seq, payload)`.
fn read_chain(bytes: &[u8]) -> Vec<(u64, &[u8])> {
    let mut records: Vec<(u64, &[u8])> = Vec::new();
    let mut at = 0;
    while let Some(header) = bytes.get(at..at + HEADER) {
        let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
        let seq = u64::from_le_bytes(header[4..12].try_into().expect("8 bytes"));
        let crc = u32::from_le_bytes(header[12..].try_into().expect("4 bytes"));
        let Some(payload) = bytes
            .get(at + HEADER..at + HEADER + len)
            .filter(|_| len > 0)
        else {
            break;
        };
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&header[4..12]);
        hasher.update(payload);
        if hasher.finalize() != crc
            || records
                .last()
                .is_some_and(|(previous, _)| previous.checked_add(1) != Some(seq))
        {
            break;
        }
        records.push((seq, payload));
        at += HEADER + len;
    }
    records
}

/// The result of an async port call whose implementation never waits (the SQLite
/// adapters do all their work when first polled).
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

/// The adapters the records are replayed through, each checked to answer what the older
/// store's copy in memory answered.
struct Replay {
    db: Database,
    ledger: SqliteLedger,
    actions: std::collections::HashMap<Arc<str>, SqliteActionStorage>,
}

impl Replay {
    fn new(db: Database) -> Self {
        Self {
            ledger: SqliteLedger::new(db.clone()),
            db,
            actions: std::collections::HashMap::new(),
        }
    }

    fn actions(&mut self, gatekeeper: &Arc<str>) -> &SqliteActionStorage {
        let db = &self.db;
        self.actions
            .entry(gatekeeper.clone())
            .or_insert_with(|| SqliteActionStorage::new(db.clone(), gatekeeper))
    }

    fn apply(&mut self, op: Op) -> Result<(), String> {
        let differs = |what: &str| Err(format!("the file answered differently: {what}"));
        let text = |e: &dyn std::fmt::Display| e.to_string();
        match op {
            Op::LedgerInsert(entry) => {
                let id = entry.id;
                let mut entry = Some(entry);
                let given = self
                    .ledger
                    .insert(&mut |_| entry.take().expect("insert builds one entry"))
                    .map_err(|e| text(&e))?;
                if given != id {
                    return differs(&format!("ledger entry {id} was given id {given}"));
                }
            }
            Op::LedgerPut(entry) => self.ledger.put(entry).map_err(|e| text(&e))?,
            Op::ActionPut {
                id,
                state,
                resolution,
                failure,
                blocked_by,
                restart_requested,
                revert,
            } => {
                let mut entry = self
                    .ledger
                    .get(id)
                    .map_err(|e| text(&e))?
                    .ok_or_else(|| format!("the file has no ledger entry {id}"))?;
                let EntryBody::Action(action) = &mut entry.body else {
                    return differs(&format!("ledger entry {id} is not an action"));
                };
                action.state = state;
                action.resolution = resolution;
                action.failure = failure;
                action.blocked_by = blocked_by;
                action.restart_requested = restart_requested;
                action.revert = revert;
                self.ledger.put(entry).map_err(|e| text(&e))?;
            }
            Op::LedgerAttempt { id, resolution } => {
                if !self
                    .ledger
                    .record_attempt(id, &resolution)
                    .map_err(|e| text(&e))?
                {
                    return differs(&format!("the decision on ledger entry {id} was refused"));
                }
            }
            Op::RulePut(rule) => self.ledger.put_rule(&rule).map_err(|e| text(&e))?,
            Op::RuleRemove { gatekeeper, tag } => {
                self.ledger
                    .remove_rule(&gatekeeper, &tag)
                    .map_err(|e| text(&e))?;
            }
            Op::Lockdown => self.ledger.latch_lockdown().map_err(|e| text(&e))?,
            Op::ActionInsert {
                gatekeeper,
                record,
                max_open,
            } => {
                let id = record.id;
                let staged = self
                    .actions(&gatekeeper)
                    .stage(record, max_open)
                    .map_err(|e| text(&e))?;
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
                    .map_err(|e| text(&e))?
                    .ok_or_else(|| format!("the file has no action {id} of {gatekeeper}"))?;
                let record = ActionRecord {
                    state,
                    claimed_at,
                    ..staged
                };
                if !ready(store.compare_and_set(from, &record)).map_err(|e| text(&e))? {
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
                    .map_err(|e| text(&e))?
                {
                    return differs(&format!(
                        "{gatekeeper}'s action {id} was not pending to take its new arguments"
                    ));
                }
            }
            Op::ActionDelete { gatekeeper, id } => {
                if !ready(self.actions(&gatekeeper).delete_pending(id)).map_err(|e| text(&e))? {
                    return differs(&format!("{gatekeeper}'s action {id} was not deleted"));
                }
            }
            Op::ActionPrune {
                gatekeeper,
                keep,
                pruned,
            } => {
                let deleted =
                    ready(self.actions(&gatekeeper).prune_final(keep)).map_err(|e| text(&e))?;
                if deleted != pruned {
                    return differs(&format!(
                        "{gatekeeper} pruned {deleted} records, not {pruned}"
                    ));
                }
            }
            Op::ActionPruned { gatekeeper, ids } => {
                let deleted = self
                    .actions(&gatekeeper)
                    .delete_final(&ids, None)
                    .map_err(|e| text(&e))?;
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
}

/// Where the file keeps the journal position it holds: a key of the `kv` table.
fn position_store(db: &Database) -> SqliteKv {
    SqliteKv::new(db.clone(), POSITION_SCOPE)
}

/// The journal position the file holds (0 for a file never used behind a journal).
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

/// Mark every claim left by this handle's session (the replayed ones, which the journal's
/// dead process took) as taken by no live process.
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

//! What the connection already knows of the database, so the hot path reads it from
//! memory instead of asking SQLite again: ledger entries and the next ledger id, and per
//! gatekeeper the action records, the open count, the next action id and the settled ids
//! that retention prunes.
//!
//! # When it may be trusted
//!
//! Everything here was either written by this connection or read from SQLite by it, and
//! is only ever as new as the database. It goes stale only when *another* connection
//! (another process, or another handle on the same file) commits. So it is trusted only
//! while that cannot have happened unnoticed:
//!
//! - in memory, always: no other connection can reach the database;
//! - while an older daemon's redo journal is brought in: no other process has the file
//!   open, and the replay is its only writer (`upgrade.rs`);
//! - on a file, while this connection holds the write transaction: when the transaction
//!   opened, `PRAGMA data_version` was compared with the value seen at the previous one,
//!   and everything was forgotten if another connection had committed in between. Until
//!   the transaction ends nobody else can commit.
//!
//! Outside those moments readers go to SQLite (and may leave what they read here: it was
//! true when read, and a later foreign commit is noticed before it is trusted again).
//!
//! Whatever the connection cannot vouch for is forgotten: on any failed write (its
//! statements may have been undone by SQLite), when a transaction is lost, and after the
//! recovery paths that write rows behind the adapters' backs.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use gatekeeper_core::{ActionRecord, ActionState, StateTag};
use kernel::LedgerEntry;

/// Past this many cached ledger entries the cache starts over: enough for the entries a
/// burst of decisions moves, small enough that the cache is not a copy of the ledger.
const LEDGER_ENTRIES: usize = 256;

/// What one connection knows; lives in [`crate::db::Conn`], behind its mutex.
#[derive(Default)]
pub(crate) struct Known {
    /// `PRAGMA data_version` at the last write transaction this connection opened (file
    /// only).
    pub(crate) data_version: Option<i64>,
    /// The ledger.
    pub(crate) ledger: LedgerKnown,
    /// The action stores, per gatekeeper.
    pub(crate) actions: HashMap<Arc<str>, ActionsKnown>,
}

impl Known {
    /// Forget everything.
    pub(crate) fn forget(&mut self) {
        self.ledger = LedgerKnown::default();
        self.actions.clear();
    }

    /// The action store of `gatekeeper` (created empty if unknown).
    pub(crate) fn actions_of(&mut self, gatekeeper: &Arc<str>) -> &mut ActionsKnown {
        self.actions.entry(gatekeeper.clone()).or_default()
    }
}

/// What is known of the ledger.
#[derive(Default)]
pub(crate) struct LedgerKnown {
    /// The highest ledger id, once read or written.
    pub(crate) last_id: Option<u64>,
    /// Entries as last written or read, by id (a partial copy).
    entries: HashMap<u64, LedgerEntry>,
}

impl LedgerKnown {
    /// The entry with `id`, if known.
    pub(crate) fn entry(&self, id: u64) -> Option<&LedgerEntry> {
        self.entries.get(&id)
    }

    /// The entry with `id`, if known, to change in place after its row was changed.
    pub(crate) fn entry_mut(&mut self, id: u64) -> Option<&mut LedgerEntry> {
        self.entries.get_mut(&id)
    }

    /// Remember `entry` as its row now stands.
    pub(crate) fn remember(&mut self, entry: LedgerEntry) {
        if self.entries.len() >= LEDGER_ENTRIES && !self.entries.contains_key(&entry.id.0) {
            self.entries.clear();
        }
        self.entries.insert(entry.id.0, entry);
    }
}

/// The counts a gatekeeper's store needs on every stage and every settle.
#[derive(Debug, Clone, Default)]
pub(crate) struct ActionCounts {
    /// Records pending or applying.
    pub(crate) open: usize,
    /// The highest id ever handed out (still in the table, or recorded as deleted).
    pub(crate) last_id: u64,
    /// Ids of settled records (applied, rejected, failed for good), oldest first.
    pub(crate) settled: BTreeSet<u64>,
}

/// Where a state counts: open (pending, applying, or a retryable failure, which still
/// waits for a person, as in the kernel's ledger) or settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    Open,
    Settled,
}

fn standing(state: &ActionState) -> Standing {
    if state.is_open() {
        Standing::Open
    } else {
        Standing::Settled
    }
}

/// The standing of a record known only by its state tag: a record moves *from* a failed
/// state only if that failure was retryable (a final one never changes again), so a
/// failed record that moves was open.
fn standing_of_tag(tag: StateTag) -> Standing {
    match tag {
        StateTag::Pending | StateTag::Applying | StateTag::Failed => Standing::Open,
        StateTag::Applied | StateTag::Rejected => Standing::Settled,
    }
}

/// What is known of one gatekeeper's action store.
#[derive(Default)]
pub(crate) struct ActionsKnown {
    /// The counts, once read.
    pub(crate) counts: Option<ActionCounts>,
    /// Records as last written or read, by id (a partial copy; pruned rows leave it).
    records: HashMap<u64, ActionRecord>,
}

impl ActionsKnown {
    /// The record with `id`, if known.
    pub(crate) fn record(&self, id: u64) -> Option<&ActionRecord> {
        self.records.get(&id)
    }

    /// Remember `record` as its row now stands.
    pub(crate) fn remember(&mut self, record: &ActionRecord) {
        self.records.insert(record.id.0, record.clone());
    }

    /// A new pending row with `record.id` was inserted.
    pub(crate) fn staged(&mut self, record: &ActionRecord) {
        if let Some(counts) = &mut self.counts {
            counts.open += 1;
            counts.last_id = counts.last_id.max(record.id.0);
        }
        self.remember(record);
    }

    /// The row of `record.id` moved from `from` to `record.state`.
    pub(crate) fn moved(&mut self, from: StateTag, record: &ActionRecord) {
        if let Some(counts) = &mut self.counts {
            let id = record.id.0;
            match standing_of_tag(from) {
                Standing::Open => counts.open = counts.open.saturating_sub(1),
                Standing::Settled => {
                    counts.settled.remove(&id);
                }
            }
            match standing(&record.state) {
                Standing::Open => counts.open += 1,
                Standing::Settled => {
                    counts.settled.insert(id);
                }
            }
        }
        self.remember(record);
    }

    /// The pending row `id` got new arguments (`amend_pending`).
    pub(crate) fn amended(&mut self, id: u64, args: &Arc<serde_json::Value>) {
        if let Some(record) = self.records.get_mut(&id) {
            record.args = args.clone();
        }
    }

    /// The pending row `id` was deleted.
    pub(crate) fn deleted_pending(&mut self, id: u64) {
        if let Some(counts) = &mut self.counts {
            counts.open = counts.open.saturating_sub(1);
            counts.last_id = counts.last_id.max(id);
        }
        self.records.remove(&id);
    }

    /// The settled rows `ids` were pruned.
    pub(crate) fn pruned(&mut self, ids: &[i64]) {
        for id in ids {
            let id = u64::try_from(*id).unwrap_or_default();
            if let Some(counts) = &mut self.counts {
                counts.settled.remove(&id);
                counts.last_id = counts.last_id.max(id);
            }
            self.records.remove(&id);
        }
    }
}

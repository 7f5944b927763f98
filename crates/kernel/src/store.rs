//! The kernel's storage port, and the in-memory implementation used by default.
//!
//! The Overseer keeps its ledger, its auto-approval rules and the lockdown latch only
//! through [`LedgerStore`]. A durable backend implements the same trait in its own
//! crate; the kernel never names one.
//!
//! The port is synchronous on purpose: each call is one small read or one write, and a
//! backend that blocks (SQLite) is expected to be fast enough to call from a task. The
//! Overseer never holds a store call across an `.await`. One wait is worth a future: a
//! submission's or a sensitive observation's wait for its entry to become durable
//! ([`LedgerStore::insert_durable_later`]), which a store that groups many callers' writes
//! into one sync may answer later, without holding a thread meanwhile. An ordinary
//! observation waits for no sync ([`LedgerStore::insert_lazy`]).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::contract::DriverActionId;
use crate::ledger::{ActionEntry, AutoApprovalRule, EntryBody, LedgerEntry, LedgerId, Resolution};

/// A storage backend refused or failed an operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ledger storage failed: {0}")]
pub struct StorageError(pub String);

/// A held drain lease: while it lives, no other process sharing the store drains the
/// same gatekeeper. Dropping it releases the lease.
pub type DrainLease = Box<dyn std::any::Any + Send>;

/// What [`LedgerStore::drain_lease`] returns: resolves once the lease is held.
pub type DrainLeaseFuture = Pin<Box<dyn Future<Output = Result<DrainLease, StorageError>> + Send>>;

/// What [`LedgerStore::insert_durable_later`] returns beside the id: resolves once the
/// entry is durable (or with the error that kept it from becoming so).
pub type DurableFuture = Pin<Box<dyn Future<Output = Result<(), StorageError>> + Send>>;

/// Where the Overseer keeps what it must not forget.
///
/// Implementations must make each call atomic: a reader never sees half of a `put`.
/// Ids handed out by [`LedgerStore::insert`] increase strictly and are never reused.
pub trait LedgerStore: Send + Sync {
    /// Allocate the next id, build the entry for it with `make`, and store it.
    ///
    /// `make` is called once. What it builds depends on the id only through
    /// [`LedgerEntry::id`], so a store that numbers an entry in the statement that writes
    /// it may build it first, under a placeholder id, and store it under the id that
    /// statement hands out (the PostgreSQL store does, to write in one round trip).
    fn insert(
        &self,
        make: &mut dyn FnMut(LedgerId) -> LedgerEntry,
    ) -> Result<LedgerId, StorageError>;

    /// [`LedgerStore::insert`] for a caller that can wait without holding a thread (the
    /// Overseer's submissions and sensitive observations, answered from a task): the
    /// entry is stored when this returns, but it may become durable only when the returned
    /// future resolves, and the caller tells nobody of the id before. A store that groups many callers' writes
    /// into one sync lets tasks wait for it this way instead of each holding a thread.
    ///
    /// The default is [`LedgerStore::insert`], durable when it returns.
    fn insert_durable_later(
        &self,
        make: &mut dyn FnMut(LedgerId) -> LedgerEntry,
    ) -> Result<(LedgerId, DurableFuture), StorageError> {
        let id = self.insert(make)?;
        Ok((id, Box::pin(std::future::ready(Ok(())))))
    }

    /// [`LedgerStore::insert`] of an entry that nothing waits to be durable (an ordinary
    /// observation): stored when this returns, and durable with the store's next sync,
    /// which this call neither makes nor waits for. A crash before that sync may lose the
    /// entry; a store whose syncs cover everything written before them (a log in order)
    /// then loses only entries after the last durable one, never one before it.
    ///
    /// The default is [`LedgerStore::insert`], durable when it returns.
    fn insert_lazy(
        &self,
        make: &mut dyn FnMut(LedgerId) -> LedgerEntry,
    ) -> Result<LedgerId, StorageError> {
        self.insert(make)
    }

    /// One entry by id.
    fn get(&self, id: LedgerId) -> Result<Option<LedgerEntry>, StorageError>;

    /// Replace an existing entry (same id).
    fn put(&self, entry: LedgerEntry) -> Result<(), StorageError>;

    /// Record who decided an open action, just before its driver is called; the action
    /// stays open. A durable backend may let this write ride with its next commit,
    /// provided that commit comes before anything is sent (the driver's claim).
    ///
    /// The check and the write are one step: returns `false`, having written nothing, if
    /// the action is no longer open, or if another process sharing the store is deciding
    /// it right now. Only then may two kernels on one store race for one action and the
    /// ledger still name the one that decided.
    fn record_attempt(&self, id: LedgerId, resolution: &Resolution) -> Result<bool, StorageError>;

    /// Every entry, in ascending id.
    fn entries(&self) -> Result<Vec<LedgerEntry>, StorageError>;

    /// The ids of one gatekeeper's open actions (pending, or failed but retryable: both
    /// still wait for a person), in ascending id.
    fn open_action_ids(&self, gatekeeper: &str) -> Result<Vec<LedgerId>, StorageError>;

    /// One gatekeeper's open actions, whole, in ascending id (a person's list).
    ///
    /// The default reads [`LedgerStore::open_action_ids`] and [`LedgerStore::get`]s each.
    /// A store that reads them in one statement answers from it, and may answer the next
    /// `get` of each (the person's decision) from the same read, as it may after
    /// `open_action_ids`.
    fn open_actions(&self, gatekeeper: &str) -> Result<Vec<LedgerEntry>, StorageError> {
        let mut open = Vec::new();
        for id in self.open_action_ids(gatekeeper)? {
            open.extend(self.get(id)?);
        }
        Ok(open)
    }

    /// The ledger id of the action a gatekeeper submitted under `driver_id`.
    fn find_action(
        &self,
        gatekeeper: &str,
        driver_id: DriverActionId,
    ) -> Result<Option<LedgerId>, StorageError>;

    /// Store a rule, replacing any rule for the same gatekeeper and tag.
    fn put_rule(&self, rule: &AutoApprovalRule) -> Result<(), StorageError>;

    /// Remove a rule; returns whether one existed.
    fn remove_rule(&self, gatekeeper: &str, tag: &str) -> Result<bool, StorageError>;

    /// The rule for a gatekeeper and tag, if enabled.
    fn rule(
        &self,
        gatekeeper: &str,
        tag: &str,
    ) -> Result<Option<Arc<AutoApprovalRule>>, StorageError>;

    /// Every rule, ordered by gatekeeper then tag.
    fn rules(&self) -> Result<Vec<AutoApprovalRule>, StorageError>;

    /// Latch lockdown. Once latched it is never unlatched.
    fn latch_lockdown(&self) -> Result<(), StorageError>;

    /// Whether lockdown is latched.
    fn locked_down(&self) -> Result<bool, StorageError>;

    /// Wait for the lease that lets one process at a time drain `gatekeeper`, for a store
    /// that several processes (each with its own kernel) share: a drain holds it for all
    /// its passes, so the auto-approval drain of one gatekeeper runs in one process at a
    /// time, in id order. A drain that waits here still runs once the holder is done, so
    /// work submitted through one process while another drains is not left waiting.
    ///
    /// The default holds nothing: a store used by one process needs no lease.
    fn drain_lease(&self, gatekeeper: &str) -> DrainLeaseFuture {
        let _ = gatekeeper;
        Box::pin(std::future::ready(Ok(Box::new(()) as DrainLease)))
    }
}

#[derive(Default)]
struct Tables {
    last_id: u64,
    /// Indexed by id - 1: ids are a dense sequence from 1, so lookup is O(1).
    entries: Vec<LedgerEntry>,
    /// Beside `entries`: whether each is an open action. A byte per entry, so finding
    /// the open ones reads this, not the entries.
    is_open: Vec<bool>,
    /// Per gatekeeper, in ascending id, every action that may be open: each open action
    /// is here, and a closed one is dropped lazily, by the next [`Tables::open_ids`].
    /// So closing an action (every apply, rejection and expiry) costs nothing here.
    open: BTreeMap<Arc<str>, Vec<LedgerId>>,
    by_driver: BTreeMap<Arc<str>, BTreeMap<DriverActionId, LedgerId>>,
}

/// The value kept for `gatekeeper` in `map`, made empty if there is none yet. The name is
/// taken (another reference counted) only then: most entries are not a gatekeeper's first.
fn per_gatekeeper<'m, T: Default>(
    map: &'m mut BTreeMap<Arc<str>, T>,
    gatekeeper: &Arc<str>,
) -> &'m mut T {
    if !map.contains_key(gatekeeper) {
        map.insert(gatekeeper.clone(), T::default());
    }
    map.get_mut(gatekeeper).expect("inserted above")
}

/// Where entry `id` sits in [`Tables::entries`].
fn index_of(id: LedgerId) -> Option<usize> {
    usize::try_from(id.0.checked_sub(1)?).ok()
}

impl Tables {
    fn slot(&self, id: LedgerId) -> Option<&LedgerEntry> {
        self.entries.get(index_of(id)?)
    }

    fn slot_mut(&mut self, id: LedgerId) -> Option<&mut LedgerEntry> {
        self.entries.get_mut(index_of(id)?)
    }

    /// Index a new entry, the next in `entries`, and store it.
    fn push(&mut self, entry: LedgerEntry) {
        if let EntryBody::Action(action) = &entry.body {
            per_gatekeeper(&mut self.by_driver, &entry.gatekeeper)
                .insert(action.driver_id, entry.id);
        }
        let is_open = entry.action().is_some_and(ActionEntry::is_open);
        if is_open {
            // Ids only grow, so pushing keeps the list ascending.
            per_gatekeeper(&mut self.open, &entry.gatekeeper).push(entry.id);
        }
        self.entries.push(entry);
        self.is_open.push(is_open);
    }

    /// Note that an entry that was not open is open now. (Closing needs no note.)
    fn reopened(&mut self, gatekeeper: &Arc<str>, id: LedgerId) {
        let ids = self.open.entry(gatekeeper.clone()).or_default();
        if let Err(at) = ids.binary_search(&id) {
            ids.insert(at, id);
        }
    }

    /// The ids of one gatekeeper's open actions, in ascending id; drops from the index
    /// the ones that have closed since the last call.
    fn open_ids(&mut self, gatekeeper: &str) -> Vec<LedgerId> {
        let Self { is_open, open, .. } = self;
        let Some(ids) = open.get_mut(gatekeeper) else {
            return Vec::new();
        };
        ids.retain(|id| index_of(*id).and_then(|index| is_open.get(index)) == Some(&true));
        ids.clone()
    }
}

/// The auto-approval rules, per gatekeeper then tag.
type Rules = BTreeMap<String, BTreeMap<String, Arc<AutoApprovalRule>>>;

/// A ledger's rules, read without a lock while they do not change.
///
/// The drain asks for a rule before every action it applies, and rules change rarely. So
/// each thread keeps the rules it last read ([`RULES_READ`]) with their version, and reads
/// them again, under the lock, only once the version has moved. The rules are never
/// changed in place while a thread keeps them: a change makes its own copy. A change is
/// seen by every read that starts after it returns, as with a lock around each read.
struct RuleBook {
    /// Tells this ledger's rules from another's in a thread's copy.
    ledger: u64,
    /// Bumped, under the lock, by every change of the rules.
    version: AtomicU64,
    rules: Mutex<Arc<Rules>>,
}

/// The rules of one ledger as one thread last read them.
struct RulesRead {
    ledger: u64,
    version: u64,
    rules: Arc<Rules>,
}

thread_local! {
    /// This thread's copy of the rules of the ledger it last read rules from (one ledger
    /// at a time: reading another's replaces it).
    static RULES_READ: RefCell<Option<RulesRead>> = const { RefCell::new(None) };
}

impl Default for RuleBook {
    fn default() -> Self {
        static LEDGERS: AtomicU64 = AtomicU64::new(0);
        Self {
            ledger: LEDGERS.fetch_add(1, Ordering::Relaxed),
            version: AtomicU64::new(0),
            rules: Mutex::default(),
        }
    }
}

impl RuleBook {
    fn lock(&self) -> MutexGuard<'_, Arc<Rules>> {
        // Every change is one map operation, so a poisoned lock is still consistent.
        self.rules
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Change the rules with `change`, and bump their version.
    fn change<T>(&self, change: impl FnOnce(&mut Rules) -> T) -> T {
        let mut rules = self.lock();
        let changed = change(Arc::make_mut(&mut rules));
        self.version.fetch_add(1, Ordering::Release);
        changed
    }

    /// Read the rules with `read`: this thread's copy if their version has not moved since
    /// it was taken, else the rules under the lock (kept as this thread's copy).
    fn read<T>(&self, read: impl Fn(&Rules) -> T) -> T {
        let version = self.version.load(Ordering::Acquire);
        RULES_READ
            .try_with(|kept| {
                let mut kept = kept.borrow_mut();
                match &*kept {
                    Some(k) if k.ledger == self.ledger && k.version == version => read(&k.rules),
                    _ => read(&kept.insert(self.take()).rules),
                }
            })
            // The thread is ending and its copy is gone: read under the lock.
            .unwrap_or_else(|_| read(&self.take().rules))
    }

    /// The rules and their version, as one (both under the lock).
    fn take(&self) -> RulesRead {
        let rules = self.lock();
        RulesRead {
            ledger: self.ledger,
            version: self.version.load(Ordering::Relaxed),
            rules: Arc::clone(&rules),
        }
    }
}

/// The default store: everything in memory, gone when the process ends.
#[derive(Default)]
pub struct MemoryLedger {
    tables: Mutex<Tables>,
    /// Outside the tables' lock: the drain reads a rule before every apply.
    rules: RuleBook,
    /// The lockdown latch, outside the tables' lock: it is read before every apply and
    /// submission, and only ever goes from `false` to `true`.
    locked_down: AtomicBool,
}

impl MemoryLedger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    fn tables(&self) -> MutexGuard<'_, Tables> {
        // A panic while holding the lock leaves the tables consistent (every method
        // mutates after its checks), so a poisoned lock is still usable.
        self.tables
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl LedgerStore for MemoryLedger {
    fn insert(
        &self,
        make: &mut dyn FnMut(LedgerId) -> LedgerEntry,
    ) -> Result<LedgerId, StorageError> {
        let mut tables = self.tables();
        let id = LedgerId(tables.last_id + 1);
        let entry = make(id);
        if entry.id != id {
            return Err(StorageError(format!(
                "entry built for {id} carries id {}",
                entry.id
            )));
        }
        tables.last_id = id.0;
        tables.push(entry);
        Ok(id)
    }

    fn get(&self, id: LedgerId) -> Result<Option<LedgerEntry>, StorageError> {
        Ok(self.tables().slot(id).cloned())
    }

    fn put(&self, entry: LedgerEntry) -> Result<(), StorageError> {
        let id = entry.id;
        let is_open = entry.action().is_some_and(ActionEntry::is_open);
        let mut tables = self.tables();
        let Some(index) = index_of(id).filter(|index| *index < tables.entries.len()) else {
            return Err(StorageError(format!("no entry {id} to replace")));
        };
        let was_open = std::mem::replace(&mut tables.is_open[index], is_open);
        if is_open && !was_open {
            tables.reopened(&entry.gatekeeper, id);
        }
        // Replaced in place: moving the old entry out, to drop it once the lock is
        // released, would copy a few hundred bytes to save dropping a few references.
        tables.entries[index] = entry;
        Ok(())
    }

    fn record_attempt(&self, id: LedgerId, resolution: &Resolution) -> Result<bool, StorageError> {
        let mut tables = self.tables();
        let Some(action) = tables.slot_mut(id).and_then(LedgerEntry::action_mut) else {
            return Err(StorageError(format!(
                "no action {id} to record a decision on"
            )));
        };
        if !action.is_open() {
            return Ok(false);
        }
        action.resolution = Some(resolution.clone());
        Ok(true)
    }

    fn entries(&self) -> Result<Vec<LedgerEntry>, StorageError> {
        Ok(self.tables().entries.clone())
    }

    fn open_action_ids(&self, gatekeeper: &str) -> Result<Vec<LedgerId>, StorageError> {
        Ok(self.tables().open_ids(gatekeeper))
    }

    fn find_action(
        &self,
        gatekeeper: &str,
        driver_id: DriverActionId,
    ) -> Result<Option<LedgerId>, StorageError> {
        let tables = self.tables();
        Ok(tables
            .by_driver
            .get(gatekeeper)
            .and_then(|ids| ids.get(&driver_id))
            .copied())
    }

    fn put_rule(&self, rule: &AutoApprovalRule) -> Result<(), StorageError> {
        let stored = Arc::new(rule.clone());
        self.rules.change(|rules| {
            rules
                .entry(rule.gatekeeper.clone())
                .or_default()
                .insert(rule.kind.tag.clone(), stored);
        });
        Ok(())
    }

    fn remove_rule(&self, gatekeeper: &str, tag: &str) -> Result<bool, StorageError> {
        Ok(self.rules.change(|rules| {
            rules
                .get_mut(gatekeeper)
                .is_some_and(|rules| rules.remove(tag).is_some())
        }))
    }

    fn rule(
        &self,
        gatekeeper: &str,
        tag: &str,
    ) -> Result<Option<Arc<AutoApprovalRule>>, StorageError> {
        Ok(self.rules.read(|rules| {
            rules
                .get(gatekeeper)
                .and_then(|rules| rules.get(tag))
                .cloned()
        }))
    }

    fn rules(&self) -> Result<Vec<AutoApprovalRule>, StorageError> {
        Ok(self.rules.read(|rules| {
            rules
                .values()
                .flat_map(|rules| rules.values().map(|rule| AutoApprovalRule::clone(rule)))
                .collect()
        }))
    }

    fn latch_lockdown(&self) -> Result<(), StorageError> {
        self.locked_down.store(true, Ordering::SeqCst);
        Ok(())
    }

    fn locked_down(&self) -> Result<bool, StorageError> {
        Ok(self.locked_down.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;
    use crate::contract::ActionKind;

    fn rule(tag: &str, by: &str) -> AutoApprovalRule {
        AutoApprovalRule::new("issues", ActionKind::new(tag, tag), by)
    }

    fn enabled_by(ledger: &MemoryLedger, tag: &str) -> Option<String> {
        let rule = ledger.rule("issues", tag).unwrap();
        rule.map(|rule| rule.enabled_by.clone())
    }

    #[test]
    fn a_rule_change_is_seen_by_a_thread_that_read_the_rules_before() {
        let ledger = MemoryLedger::new();
        ledger.put_rule(&rule("addLabel", "alice")).unwrap();
        let (seen, reads) = mpsc::channel();
        let (changed, changes) = mpsc::channel::<()>();
        std::thread::scope(|scope| {
            let ledger = &ledger;
            // Reads the rule, then again after each change.
            scope.spawn(move || {
                seen.send(enabled_by(ledger, "addLabel")).unwrap();
                while changes.recv().is_ok() {
                    seen.send(enabled_by(ledger, "addLabel")).unwrap();
                }
            });
            assert_eq!(reads.recv().unwrap().as_deref(), Some("alice"));
            ledger.put_rule(&rule("addLabel", "bob")).unwrap();
            changed.send(()).unwrap();
            assert_eq!(reads.recv().unwrap().as_deref(), Some("bob"));
            assert!(ledger.remove_rule("issues", "addLabel").unwrap());
            changed.send(()).unwrap();
            assert_eq!(reads.recv().unwrap(), None);
            drop(changed);
        });
        assert!(!ledger.remove_rule("issues", "addLabel").unwrap());
        assert!(ledger.rules().unwrap().is_empty());
    }

    #[test]
    fn two_ledgers_read_on_one_thread_keep_their_own_rules() {
        let (one, two) = (MemoryLedger::new(), MemoryLedger::new());
        one.put_rule(&rule("addLabel", "alice")).unwrap();
        for _ in 0..2 {
            assert_eq!(enabled_by(&one, "addLabel").as_deref(), Some("alice"));
            assert_eq!(enabled_by(&two, "addLabel"), None);
        }
        two.put_rule(&rule("addLabel", "bob")).unwrap();
        assert_eq!(enabled_by(&one, "addLabel").as_deref(), Some("alice"));
        assert_eq!(enabled_by(&two, "addLabel").as_deref(), Some("bob"));
    }
}

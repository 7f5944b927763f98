//! The Overseer: the approval queue, the ledger's rules, the drainer and lockdown.
//!
//! The Overseer decides what reaches the outside world and records who decided, without
//! touching the outside world itself: every effect goes through a registered
//! [`Gatekeeper`] trait object, every record through the [`LedgerStore`] port.
//!
//! # Decisions it takes
//!
//! - A submission is recorded as pending and answered at once. If it will auto-apply,
//!   the apply happens on a background task (see [`Overseer::settle`]).
//! - An action is applied only after a person approved it, or when *both* keys hold:
//!   the driver said `auto_approvable` and a person enabled a rule for its kind.
//! - The drainer applies one gatekeeper's eligible actions in ascending id and stops at
//!   the first action that is not eligible, or whose apply fails. It never skips ahead.
//! - One decision at a time per action: a second approve, reject or revert of an action
//!   that is being decided is refused, so the kernel never asks a driver to apply the
//!   same action twice at once.
//! - A failed apply is a state of its own. If the driver says nothing was sent
//!   (retryable), a person may approve it again or reject it; otherwise it is final.
//! - Rejections reported as cascaded by the driver are marked rejected with the cause;
//!   open actions that depend on a rejected action, or on one that failed for good, are
//!   flagged, kept out of auto-approval, and left for a person.
//! - Lockdown, once latched by a sensitive observation, refuses new submissions, every
//!   apply, manual or automatic, and every revert (a revert writes to the service too).
//!   Actions pending at that moment stay pending and may only be rejected: a person may
//!   still say no, nothing may leave.
//! - Every call into a driver has the gatekeeper's deadline, and its panics are caught.
//!   An apply that passes the deadline, panics, or is abandoned (its future dropped) is
//!   failed with outcome unknown: it may have reached the service, so it is never applied
//!   again, and the message says why. A drain stops at it as at any failure.
//! - A decision is recorded under a person's name; an empty one is refused.
//! - A pending action older than its gatekeeper's time to live, if one is set, expires:
//!   its driver is told as for a rejection, nothing is sent, and the ledger says
//!   `expired`. Every apply checks the time to live first, so neither a person nor a rule
//!   ever sends an expired action, whenever the sweep ([`Overseer::expire_due`]) runs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use async_trait::async_trait;
use tokio::task::JoinHandle;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::clock::Clock;
use crate::contract::{
    ActionDescription, ActionKind, ApprovalQueue, DriverActionId, Gatekeeper, GatekeeperError,
    ObservationAuthorizer, ObservationDescription, QueueError,
};
use crate::deadline::{Bounded, Ended, Human};
use crate::drain::{DrainCause, DrainGuard, Request};
use crate::ledger::{
    ActionEntry, ActionState, AutoApprovalRule, EntryBody, Failure, LedgerEntry, LedgerId,
    Resolution, RevertRecord, RuleScope,
};
use crate::store::{LedgerStore, MemoryLedger, StorageError};

/// Why the Overseer refused a decision or a configuration change. Nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecisionError {
    /// No entry has this id.
    #[error("there is no entry {0}; list pending work to see the ids you can decide")]
    UnknownEntry(LedgerId),
    /// The id names an observation, which is recorded, never decided.
    #[error("{0} is an observation; only actions can be approved, rejected or reverted")]
    Observation(LedgerId),
    /// The action is not waiting for a decision.
    #[error("action {id} is already {state}; only pending actions can be approved or rejected")]
    NotPending {
        /// The action.
        id: LedgerId,
        /// Its current state.
        state: ActionState,
    },
    /// The action failed in a way that may have reached the service.
    /// The driver's message already says what to check before staging it again.
    #[error("action {id} failed and cannot be retried: {message}")]
    NotRetryable {
        /// The action.
        id: LedgerId,
        /// The failure as recorded.
        message: String,
    },
    /// Another decision on the same action is under way.
    #[error("action {0} is being decided right now; wait for that to finish")]
    InFlight(LedgerId),
    /// Another kernel sharing the ledger (another process on the same file) decided the
    /// action, or is deciding it, first; nothing was recorded or sent by this one.
    #[error("{}", decided_elsewhere(*id, by.as_deref(), *state, *open))]
    DecidedElsewhere {
        /// The action.
        id: LedgerId,
        /// Who decided, as the ledger says (`None` if it does not say yet).
        by: Option<String>,
        /// Its state now.
        state: ActionState,
        /// Whether it is still open: the other decision is under way.
        open: bool,
    },
    /// Lockdown forbids applying anything.
    #[error(
        "this workspace has observed sensitive data, so action {0} cannot be applied; reject it instead"
    )]
    LockedDown(LedgerId),
    /// Lockdown forbids reverting: a revert is a write to the service like any other.
    #[error(
        "this workspace has observed sensitive data, so action {0} cannot be reverted: a revert writes to the service, and nothing may leave during lockdown; undo it directly in the service if it must be undone"
    )]
    RevertLockedDown(LedgerId),
    /// The step run before an approval ([`Overseer::approve_prepared`]) refused it;
    /// nothing was sent.
    #[error("action {id} was not approved, and nothing was sent: {reason}")]
    NotPrepared {
        /// The action.
        id: LedgerId,
        /// Why, in the step's words.
        reason: String,
    },
    /// A decision or a rule was attributed to nobody.
    #[error("the name of the person deciding is empty; give the name the ledger should record")]
    NoDecider,
    /// The action waited longer than its gatekeeper's time to live: it is now expired,
    /// and nothing was sent.
    #[error(
        "action {0} expired: nobody decided within its time to live, so nothing was sent and nothing will be; the agent is told it expired and may stage it again"
    )]
    Expired(LedgerId),
    /// Revert asked of an action whose driver does not implement it.
    #[error(
        "action {0} cannot be reverted automatically; undo it directly in the service if needed"
    )]
    RevertUnsupported(LedgerId),
    /// Revert asked of an action that was not applied.
    #[error("action {id} is {state}; only an applied action can be reverted")]
    NotApplied {
        /// The action.
        id: LedgerId,
        /// Its current state.
        state: ActionState,
    },
    /// No gatekeeper has this name.
    #[error("there is no gatekeeper named {0:?}; register it before using it")]
    UnknownGatekeeper(String),
    /// A gatekeeper with this name is already registered.
    #[error("a gatekeeper named {0:?} is already registered; choose another name")]
    DuplicateGatekeeper(String),
    /// The driver failed to apply the action; it is now recorded as failed.
    #[error("applying action {id} failed: {source}")]
    ApplyFailed {
        /// The action.
        id: LedgerId,
        /// The driver's error.
        source: GatekeeperError,
    },
    /// The driver refused or failed a reject or a revert; nothing changed in the ledger.
    #[error("the gatekeeper could not do this for action {id}: {source}")]
    Gatekeeper {
        /// The action.
        id: LedgerId,
        /// The driver's error.
        source: GatekeeperError,
    },
    /// The storage port failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

fn decided_elsewhere(id: LedgerId, by: Option<&str>, state: ActionState, open: bool) -> String {
    let by = by.map_or_else(String::new, |by| format!(" by {by}"));
    if open {
        format!(
            "action {id} is being decided{by} in another process; wait for that to finish, then list pending work"
        )
    } else {
        format!(
            "action {id} was already decided{by}: it is {state}; list pending work to see what is left"
        )
    }
}

/// What a rejection did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RejectReport {
    /// Other actions the driver dropped with this one, now marked rejected.
    pub cascaded: Vec<LedgerId>,
    /// Open actions that depended on a rejected one, now flagged and held for a person.
    pub flagged: Vec<LedgerId>,
    /// The driver asked for the agent to be restarted.
    pub restart: bool,
}

/// What a revert request did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevertReport {
    /// Whether the action was undone.
    pub reverted: bool,
    /// The driver's reason when it was not.
    pub message: Option<String>,
    /// When not undone: whether asking again later may succeed.
    pub can_retry: bool,
    /// The driver asked for the agent to be restarted.
    pub restart: bool,
    /// Open actions that depended on the reverted one, now flagged and held for a person
    /// (as after a rejection: what they were built on is gone).
    pub flagged: Vec<LedgerId>,
}

struct Inner {
    store: Arc<dyn LedgerStore>,
    clock: Arc<dyn Clock>,
    /// By name; ordered, as a kernel has a handful: found in a few comparisons, cheaper
    /// than hashing the name at every decision.
    gatekeepers: RwLock<BTreeMap<Arc<str>, Arc<dyn Gatekeeper>>>,
    drains: Mutex<HashMap<Arc<str>, DrainGuard>>,
    /// Actions being decided right now.
    deciding: Deciding,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// How long a pending action may wait for a decision.
    ttl: RwLock<TimeToLive>,
    /// Whether `ttl` holds any time to live at all, kept in step under its write lock:
    /// with none set (the default), checking an action for expiry takes no lock.
    any_ttl: AtomicBool,
}

/// The name an expired action's resolution is recorded under: no person decided it.
pub const EXPIRY_DECIDER: &str = "expiry";

/// A time to live for people: "24 h", "90 min", "30 s", "1500 ms".
fn ttl_words(millis: u64) -> String {
    match millis {
        m if m >= 3_600_000 && m % 3_600_000 == 0 => format!("{} h", m / 3_600_000),
        m if m >= 60_000 && m % 60_000 == 0 => format!("{} min", m / 60_000),
        m if m % 1000 == 0 => format!("{} s", m / 1000),
        m => format!("{m} ms"),
    }
}

/// Pending actions' time to live, in milliseconds: per gatekeeper, else the default;
/// `None` is forever.
#[derive(Debug, Default)]
struct TimeToLive {
    default: Option<u64>,
    per_gatekeeper: HashMap<String, u64>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section here is a few map operations that cannot leave the data
    // half-changed, so a poisoned lock is still consistent.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The kernel. Cheap to clone; clones share one state.
#[derive(Clone)]
pub struct Overseer {
    inner: Arc<Inner>,
}

/// Which actions are being decided right now: one decision at a time per action.
///
/// A single decision (a person's, an expiry) claims its action in the table, under the
/// lock. A drain decides one action after another: it keeps the one it is on in its own
/// slot, an atomic listed in the table, so moving on to the next action takes no lock
/// while nothing is claimed.
///
/// A claim and a drain may reach for the same action at once. Each first publishes what
/// it takes (the claim by counting itself in `claims`, the drain in its slot), then looks
/// for the other; all four accesses are sequentially consistent, so at least one of the
/// two sees the other. A claim that sees a drain on its action gives up. A drain that
/// sees a claim counted reads the claims under the lock, where each is either held or
/// already given up, and gives up if one holds its action. So no action ever has two
/// deciders.
#[derive(Default)]
struct Deciding {
    table: Mutex<DecidingTable>,
    /// How many claims are held or being made, for a drain to read without the lock.
    claims: AtomicUsize,
}

/// What [`Deciding`] keeps under its lock.
#[derive(Default)]
struct DecidingTable {
    /// The claimed actions: a handful at most, so a vector beats a hash set.
    claimed: Vec<LedgerId>,
    /// Each running drain's slot: the id of the action it is deciding, 0 for none (ids
    /// start at 1). Only its drain writes it.
    drains: Vec<Arc<AtomicU64>>,
}

/// Releases an action's in-flight slot when the decision ends, however it ends.
enum InFlight<'a> {
    /// Claimed in [`DecidingTable::claimed`] ([`Inner::claim`]).
    Claimed { inner: &'a Inner, id: LedgerId },
    /// A drain's slot, on the action ([`DrainSlot::take`]).
    Draining {
        slot: &'a DrainSlot<'a>,
        id: LedgerId,
    },
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        match self {
            Self::Claimed { inner, id } => {
                let mut table = lock(&inner.deciding.table);
                if let Some(at) = table.claimed.iter().position(|c| c == id) {
                    table.claimed.swap_remove(at);
                    inner.deciding.claims.fetch_sub(1, Ordering::SeqCst);
                }
            }
            // The drain alone writes its slot, so no read-modify-write is needed; a claim
            // that still sees the action taken gives up, as if it had come first.
            Self::Draining { slot, id } => {
                if slot.at.load(Ordering::Relaxed) == id.0 {
                    slot.at.store(0, Ordering::Release);
                }
            }
        }
    }
}

/// One drain pass's slot in [`Deciding`]: listed while the pass runs.
struct DrainSlot<'a> {
    inner: &'a Inner,
    at: Arc<AtomicU64>,
}

impl<'a> DrainSlot<'a> {
    fn new(inner: &'a Inner) -> Self {
        let at = Arc::new(AtomicU64::new(0));
        lock(&inner.deciding.table).drains.push(at.clone());
        Self { inner, at }
    }

    /// Take action `id`'s in-flight slot for the length of one decision, leaving the
    /// action this drain was on. Fails, holding nothing, if a claim holds `id`.
    fn take(&self, id: LedgerId) -> Result<InFlight<'_>, DecisionError> {
        // Published before looking for claims: see `Deciding`.
        self.at.store(id.0, Ordering::SeqCst);
        let deciding = &self.inner.deciding;
        if deciding.claims.load(Ordering::SeqCst) > 0 && lock(&deciding.table).claimed.contains(&id)
        {
            self.at.store(0, Ordering::Release);
            return Err(DecisionError::InFlight(id));
        }
        Ok(InFlight::Draining { slot: self, id })
    }
}

impl Drop for DrainSlot<'_> {
    fn drop(&mut self) {
        lock(&self.inner.deciding.table)
            .drains
            .retain(|at| !Arc::ptr_eq(at, &self.at));
    }
}

/// Who decided, for [`Inner::apply_claimed`].
struct Decider<'a> {
    by: &'a str,
    auto: bool,
    /// What the person said with the approval, for the resolution's cause.
    note: Option<&'a str>,
}

/// The failure recorded when an apply was abandoned before the driver answered.
const ABANDONED_MESSAGE: &str = "this apply was abandoned before the gatekeeper answered (whoever was waiting for it went away), so the call may or may not have reached the service; it will not be sent again: check the service before staging it again";

/// One apply under way: the entry to settle, and the action's slot.
///
/// The entry stays where the caller keeps it (it is borrowed, not moved in and out: a
/// ledger entry is a few hundred bytes, and an apply would otherwise copy it at every
/// step). If the attempt is dropped before the apply settled it (the future awaiting the
/// driver was dropped: a person's approve abandoned by its caller, a task torn down), the
/// action is recorded as failed with outcome unknown, because the driver may already have
/// sent it, and it is never applied again. The slot is released only after that record
/// is written.
struct Attempt<'a, 'e> {
    inner: &'a Inner,
    /// The name of the entry's gatekeeper, for the record's events.
    gatekeeper: &'e str,
    entry: &'e mut Option<LedgerEntry>,
    /// Handed back to the caller once the apply is settled; if the attempt is dropped
    /// before, released after the record is written (fields drop after `drop`).
    slot: Option<InFlight<'a>>,
}

impl Drop for Attempt<'_, '_> {
    fn drop(&mut self) {
        let Some(entry) = self.entry.as_ref() else {
            return;
        };
        let id = entry.id;
        warn!(action = %id, "apply abandoned before the gatekeeper answered: outcome unknown");
        let (by, auto) = entry
            .action()
            .and_then(|a| a.resolution.as_ref())
            .map(|r| (r.by.clone(), r.auto))
            .unwrap_or_default();
        let decider = Decider {
            by: &by,
            auto,
            note: None,
        };
        match self.inner.settle_apply(
            self.gatekeeper,
            self.entry,
            Err(GatekeeperError::fatal(ABANDONED_MESSAGE)),
            &decider,
        ) {
            Ok(()) | Err(DecisionError::ApplyFailed { .. }) => {}
            Err(error) => {
                warn!(action = %id, %error, "the abandoned apply could not be recorded; the store's recovery must settle it");
            }
        }
    }
}

/// The name a decision is recorded under; refused when empty or only whitespace.
fn decider_name(by: &str) -> Result<&str, DecisionError> {
    if by.trim().is_empty() {
        return Err(DecisionError::NoDecider);
    }
    Ok(by)
}

/// Ends a drain's run however its task ends: if the task unwinds or is dropped mid-pass,
/// the gatekeeper's guard is released, so the next trigger starts a new drain instead of
/// being folded into a rerun nobody will run.
struct DrainRun<'a> {
    inner: &'a Inner,
    gatekeeper: &'a Arc<str>,
    finished: bool,
}

impl Drop for DrainRun<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        warn!(gatekeeper = %self.gatekeeper, "drain ended abnormally; its guard is released");
        if let Some(guard) = lock(&self.inner.drains).get_mut(self.gatekeeper) {
            guard.abandon();
        }
    }
}

impl Overseer {
    /// A kernel with the in-memory ledger.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self::with_store(Arc::new(MemoryLedger::new()), clock)
    }

    /// A kernel over the given storage backend.
    pub fn with_store(store: Arc<dyn LedgerStore>, clock: Arc<dyn Clock>) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                clock,
                gatekeepers: RwLock::new(BTreeMap::new()),
                drains: Mutex::new(HashMap::new()),
                deciding: Deciding::default(),
                tasks: Mutex::new(Vec::new()),
                ttl: RwLock::new(TimeToLive::default()),
                any_ttl: AtomicBool::new(false),
            }),
        }
    }

    /// Register a driver under its [`Gatekeeper::name`].
    pub fn register(&self, gatekeeper: Arc<dyn Gatekeeper>) -> Result<(), DecisionError> {
        let name: Arc<str> = Arc::from(gatekeeper.name());
        let mut gatekeepers = self
            .inner
            .gatekeepers
            .write()
            .unwrap_or_else(|p| p.into_inner());
        if gatekeepers.contains_key(&name) {
            return Err(DecisionError::DuplicateGatekeeper(name.to_string()));
        }
        info!(gatekeeper = %name, "gatekeeper registered");
        gatekeepers.insert(name, gatekeeper);
        Ok(())
    }

    /// The names of the registered gatekeepers, sorted.
    pub fn gatekeeper_names(&self) -> Vec<String> {
        let gatekeepers = self
            .inner
            .gatekeepers
            .read()
            .unwrap_or_else(|p| p.into_inner());
        let mut names: Vec<String> = gatekeepers.keys().map(|n| n.to_string()).collect();
        names.sort();
        names
    }

    /// The capability a driver uses on behalf of `caller`: submit actions and authorize
    /// observations, recorded under `gatekeeper`.
    pub fn queue_for(
        &self,
        gatekeeper: &str,
        caller: &str,
    ) -> Result<Arc<dyn ApprovalQueue>, DecisionError> {
        let name = self.inner.gatekeeper_name(gatekeeper)?;
        Ok(Arc::new(CallerQueue {
            overseer: self.clone(),
            gatekeeper: name,
            caller: Arc::from(caller),
        }))
    }

    /// Approve and apply an action. Any open action may be approved, in any order.
    ///
    /// The action becomes approved only if the driver's apply succeeds; if it fails the
    /// action becomes failed, the error is returned, and the failure is in the ledger.
    /// Either way, if the gatekeeper has an auto-approval rule, a drain follows: a gate
    /// may have cleared.
    ///
    /// The driver's apply is bounded by its gatekeeper's deadline
    /// ([`Gatekeeper::call_deadline`]): this returns no later than that, plus the ledger's
    /// own writes. An apply that passes the deadline, panics, or is abandoned because this
    /// future was dropped is recorded as failed with outcome unknown (it may have reached
    /// the service) and is never applied again.
    pub async fn approve(&self, id: LedgerId, by: &str) -> Result<(), DecisionError> {
        self.approve_noted(id, by, None).await
    }

    /// [`Overseer::approve`], with what the person said about it (for example what they
    /// changed before approving) kept in the resolution's cause.
    pub async fn approve_noted(
        &self,
        id: LedgerId,
        by: &str,
        note: Option<&str>,
    ) -> Result<(), DecisionError> {
        self.approve_prepared(id, by, async { Ok(note.map(str::to_owned)) })
            .await
    }

    /// [`Overseer::approve`], with a step run while the person holds the decision and
    /// before anything is sent: nothing else (another person, a rule's drain) can decide
    /// or apply the action meanwhile. A person's edit of the call is made this way, so
    /// the call sent is the edited one. `prepare` answers the note for the resolution's
    /// cause, or why the action must not be approved ([`DecisionError::NotPrepared`],
    /// nothing sent).
    pub async fn approve_prepared(
        &self,
        id: LedgerId,
        by: &str,
        prepare: impl std::future::Future<Output = Result<Option<String>, String>>,
    ) -> Result<(), DecisionError> {
        let inner = &self.inner;
        let by = decider_name(by)?;
        let slot = inner.claim(id)?;
        // Read under the slot: another decision may have finished just before.
        let entry = inner.open_action_entry(inner.store.get(id)?, id)?;
        if inner.due(&entry).is_some() {
            let name = entry.gatekeeper.clone();
            inner.expire_held(entry).await?;
            drop(slot);
            self.drain_if_ruled(&name, DrainCause::Rejected(id))?;
            return Err(DecisionError::Expired(id));
        }
        if inner.store.locked_down()? {
            return Err(DecisionError::LockedDown(id));
        }
        let name = entry.gatekeeper.clone();
        let gatekeeper = inner.gatekeeper(&name)?;
        let note = prepare
            .await
            .map_err(|reason| DecisionError::NotPrepared { id, reason })?;
        let (result, slot) = inner
            .apply_claimed(
                slot,
                &mut Some(entry),
                &name,
                &*gatekeeper,
                Decider {
                    by,
                    auto: false,
                    note: note.as_deref(),
                },
            )
            .await;
        drop(slot);
        // The decision is recorded; a failure to start the drain must not hide its result.
        if let Err(error) = self.drain_if_ruled(&name, DrainCause::Approved(id)) {
            warn!(action = %id, %error, "could not start a drain after the approval");
        }
        result
    }

    /// Reject an action. Nothing is sent. Actions the driver dropped with it are marked
    /// rejected ("cascaded from #id"); open actions that depended on any of them are
    /// flagged and held for a person.
    pub async fn reject(&self, id: LedgerId, by: &str) -> Result<RejectReport, DecisionError> {
        self.reject_with_reason(id, by, None).await
    }

    /// [`Overseer::reject`], recording the person's `reason` (if any) in the ledger as the
    /// resolution's cause, so it outlives the process. The reason is stored as given:
    /// whoever shows it to an agent or a person sanitizes it, like any text from outside.
    pub async fn reject_with_reason(
        &self,
        id: LedgerId,
        by: &str,
        reason: Option<&str>,
    ) -> Result<RejectReport, DecisionError> {
        let inner = &self.inner;
        let by = decider_name(by)?;
        let _slot = inner.claim(id)?;
        let entry = inner.open_action_entry(inner.store.get(id)?, id)?;
        let gatekeeper = entry.gatekeeper.clone();
        let report = inner
            .close_held(entry, by, reason.map(str::to_owned), ActionState::Rejected)
            .await?;
        self.drain_if_ruled(&gatekeeper, DrainCause::Rejected(id))?;
        Ok(report)
    }

    /// Set how long a pending action of `gatekeeper` (or, with `None`, of every gatekeeper
    /// without one of its own) may wait for a decision; `ttl` `None` is forever (the
    /// default). An action older than that is expired: its driver is told, as for a
    /// rejection, nothing is sent, and it is recorded as [`ActionState::Expired`] under
    /// [`EXPIRY_DECIDER`]. No apply, by a person or a rule, sends an action past its time
    /// to live: each checks it first and expires the action instead.
    pub fn set_time_to_live(&self, gatekeeper: Option<&str>, ttl: Option<std::time::Duration>) {
        let millis = ttl.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX));
        let mut table = self.inner.ttl.write().unwrap_or_else(|p| p.into_inner());
        match (gatekeeper, millis) {
            (None, millis) => table.default = millis,
            (Some(name), Some(millis)) => {
                table.per_gatekeeper.insert(name.to_owned(), millis);
            }
            (Some(name), None) => {
                table.per_gatekeeper.remove(name);
            }
        }
        let any = table.default.is_some() || !table.per_gatekeeper.is_empty();
        self.inner.any_ttl.store(any, Ordering::Release);
    }

    /// When pending action `entry` expires (milliseconds since the Unix epoch, as the
    /// kernel's clock counts), or `None` if it is not pending or its gatekeeper has no
    /// time to live.
    pub fn expires_at(&self, entry: &LedgerEntry) -> Option<u64> {
        let ttl = self.inner.pending_ttl(entry)?;
        Some(entry.created_at.0.saturating_add(ttl))
    }

    /// The kernel's time now (milliseconds since the Unix epoch).
    pub fn now(&self) -> u64 {
        self.inner.clock.now().0
    }

    /// Expire every pending action whose time to live has passed, and return their ids
    /// in ascending order. Actions being decided right now are left to that decision
    /// (which checks the time to live itself). A gatekeeper with a rule is drained
    /// afterwards: an expired action may have held others back.
    pub async fn expire_due(&self) -> Result<Vec<LedgerId>, DecisionError> {
        let inner = &self.inner;
        let mut expired = Vec::new();
        // No time to live anywhere: nothing can be due, so nothing is read.
        if !inner.any_ttl.load(Ordering::Acquire) {
            return Ok(expired);
        }
        for name in self.gatekeeper_names() {
            let mut any = false;
            for id in inner.store.open_action_ids(&name)? {
                // Only an action that is due is claimed, so a sweep never holds up a
                // person's decision on an action that is not expiring.
                let due = inner
                    .store
                    .get(id)?
                    .is_some_and(|e| inner.due(&e).is_some());
                if !due {
                    continue;
                }
                let Ok(_slot) = inner.claim(id) else {
                    continue;
                };
                let Some(entry) = inner.store.get(id)? else {
                    continue;
                };
                if inner.due(&entry).is_none() {
                    continue;
                }
                match inner.expire_held(entry).await {
                    Ok(_) => {
                        expired.push(id);
                        any = true;
                    }
                    Err(error) => {
                        warn!(action = %id, %error, "could not expire the action; it stays pending");
                    }
                }
            }
            if any {
                let name = inner.gatekeeper_name(&name)?;
                self.drain_if_ruled(&name, DrainCause::Resumed)?;
            }
        }
        expired.sort_unstable();
        Ok(expired)
    }

    /// Ask the driver to undo an applied action, if its description says it can.
    ///
    /// A refusal by the driver is recorded and reported, not returned as an error; the
    /// action then stays approved. After a revert, open actions that depend on the
    /// reverted one are flagged and held for a person, as after a rejection.
    ///
    /// Refused during lockdown ([`DecisionError::RevertLockedDown`]): a revert is a write
    /// to the service, and nothing may leave a locked-down workspace.
    pub async fn revert(&self, id: LedgerId, by: &str) -> Result<RevertReport, DecisionError> {
        let inner = &self.inner;
        let by = decider_name(by)?;
        let _slot = inner.claim(id)?;
        let mut entry = inner
            .store
            .get(id)?
            .ok_or(DecisionError::UnknownEntry(id))?;
        let gatekeeper_name = entry.gatekeeper.clone();
        let action = entry.action().ok_or(DecisionError::Observation(id))?;
        if action.state != ActionState::Approved {
            return Err(DecisionError::NotApplied {
                id,
                state: action.state,
            });
        }
        if !action.description.implements_revert {
            return Err(DecisionError::RevertUnsupported(id));
        }
        if inner.store.locked_down()? {
            warn!(action = %id, gatekeeper = %gatekeeper_name, "revert refused: lockdown");
            return Err(DecisionError::RevertLockedDown(id));
        }
        let driver_id = action.driver_id;
        let gatekeeper = inner.gatekeeper(&gatekeeper_name)?;
        let span = info_span!("revert", action = %id, gatekeeper = %gatekeeper_name);
        let deadline = gatekeeper.call_deadline();
        let result = match Bounded::new(gatekeeper.revert_action(driver_id), deadline)
            .instrument(span.clone())
            .await
        {
            Ended::Answered(result) => result,
            Ended::Panicked(panic) => Err(GatekeeperError::fatal(format!(
                "the gatekeeper panicked while reverting this action ({panic}), so it may or may not have been undone; check the service, and report the panic to the gatekeeper's maintainers"
            ))),
            Ended::TimedOut => Err(GatekeeperError::fatal(format!(
                "the service did not answer the revert within {}, so it may or may not have been undone; check the service before asking again",
                Human(deadline)
            ))),
        };
        let _enter = span.enter();
        let now = inner.clock.now();
        let record = entry.action_mut().expect("checked above");
        match result {
            Ok(outcome) => {
                let reverted = outcome.message.is_none();
                if reverted {
                    record.state = ActionState::Reverted;
                }
                record.restart_requested |= outcome.restart;
                record.revert = Some(RevertRecord {
                    by: by.to_owned(),
                    at: now,
                    refused: outcome.message.clone(),
                });
                inner.store.put(entry)?;
                info!(reverted, "revert requested");
                let flagged = if reverted {
                    inner.flag_dependents_of_revert(&gatekeeper_name, id)?
                } else {
                    Vec::new()
                };
                Ok(RevertReport {
                    reverted,
                    message: outcome.message,
                    can_retry: outcome.can_retry,
                    restart: outcome.restart,
                    flagged,
                })
            }
            Err(source) => {
                record.revert = Some(RevertRecord {
                    by: by.to_owned(),
                    at: now,
                    refused: Some(source.message.clone()),
                });
                inner.store.put(entry)?;
                warn!(error = %source, "revert failed");
                Err(DecisionError::Gatekeeper { id, source })
            }
        }
    }

    /// Enable auto-approval of `kind` on `gatekeeper`, attributed to `by`, and drain the
    /// gatekeeper so matching actions already pending are applied.
    ///
    /// Must be called within a tokio runtime (the drain runs as a task).
    pub fn enable_rule(
        &self,
        gatekeeper: &str,
        kind: ActionKind,
        by: &str,
    ) -> Result<(), DecisionError> {
        self.enable_scoped_rule(gatekeeper, kind, by, RuleScope::default())
    }

    /// [`Overseer::enable_rule`] narrowed to `scope`: whose calls, until when, which
    /// arguments. A rule already enabled for the kind is replaced.
    ///
    /// Must be called within a tokio runtime (the drain runs as a task).
    pub fn enable_scoped_rule(
        &self,
        gatekeeper: &str,
        kind: ActionKind,
        by: &str,
        scope: RuleScope,
    ) -> Result<(), DecisionError> {
        let by = decider_name(by)?;
        let name = self.inner.gatekeeper_name(gatekeeper)?;
        let rule = AutoApprovalRule {
            gatekeeper: name.to_string(),
            kind,
            enabled_by: by.to_owned(),
            enabled_at: self.inner.clock.now(),
            scope,
        };
        self.inner.store.put_rule(&rule)?;
        info!(gatekeeper = %name, tag = %rule.kind.tag, by, "auto-approval rule enabled");
        self.request_drain(&name, DrainCause::RuleEnabled);
        Ok(())
    }

    /// Drain every registered gatekeeper that has a rule: call this once the drivers are
    /// registered on a kernel opened over an existing (durable) ledger, so actions that
    /// became eligible before a restart do not wait for the next trigger.
    ///
    /// Must be called within a tokio runtime (the drains run as tasks).
    pub fn resume(&self) -> Result<(), DecisionError> {
        for name in self.gatekeeper_names() {
            let name = self.inner.gatekeeper_name(&name)?;
            self.drain_if_ruled(&name, DrainCause::Resumed)?;
        }
        Ok(())
    }

    /// Remove a rule. Actions of that kind submitted later need a person again; returns
    /// whether a rule existed.
    pub fn remove_rule(&self, gatekeeper: &str, tag: &str) -> Result<bool, DecisionError> {
        let removed = self.inner.store.remove_rule(gatekeeper, tag)?;
        info!(gatekeeper, tag, removed, "auto-approval rule removed");
        Ok(removed)
    }

    /// Every enabled rule.
    pub fn rules(&self) -> Result<Vec<AutoApprovalRule>, DecisionError> {
        Ok(self.inner.store.rules()?)
    }

    /// The kinds each registered gatekeeper may auto-apply, for a pre-approval screen.
    pub fn pre_approvable_kinds(&self) -> Vec<(String, ActionKind)> {
        let gatekeepers = self
            .inner
            .gatekeepers
            .read()
            .unwrap_or_else(|p| p.into_inner());
        let mut kinds: Vec<(String, ActionKind)> = gatekeepers
            .iter()
            .flat_map(|(name, gk)| {
                gk.auto_approvable_actions()
                    .into_iter()
                    .map(move |kind| (name.to_string(), kind))
            })
            .collect();
        kinds.sort_by(|a, b| (&a.0, &a.1.tag).cmp(&(&b.0, &b.1.tag)));
        kinds
    }

    /// One entry.
    pub fn entry(&self, id: LedgerId) -> Result<Option<LedgerEntry>, DecisionError> {
        Ok(self.inner.store.get(id)?)
    }

    /// The whole ledger, in ascending id.
    pub fn ledger(&self) -> Result<Vec<LedgerEntry>, DecisionError> {
        Ok(self.inner.store.entries()?)
    }

    /// Every action still waiting for a person (pending, or failed but retryable), in
    /// ascending id across all gatekeepers.
    pub fn open_actions(&self) -> Result<Vec<LedgerEntry>, DecisionError> {
        let mut open = Vec::new();
        for name in self.gatekeeper_names() {
            open.extend(self.inner.store.open_actions(&name)?);
        }
        open.sort_unstable_by_key(|entry| entry.id);
        Ok(open)
    }

    /// Whether lockdown is latched.
    pub fn is_locked_down(&self) -> Result<bool, DecisionError> {
        Ok(self.inner.store.locked_down()?)
    }

    /// Wait until every background drain has finished, including drains started by the
    /// drains being waited for. Tests and lectures call this instead of sleeping.
    ///
    /// It returns even if a service hangs: each apply of a drain ends by its gatekeeper's
    /// deadline at the latest.
    pub async fn settle(&self) {
        loop {
            let tasks = std::mem::take(&mut *lock(&self.inner.tasks));
            if tasks.is_empty() {
                return;
            }
            for task in tasks {
                if let Err(error) = task.await {
                    warn!(%error, "drain task ended abnormally");
                }
            }
        }
    }

    /// Request a drain of `gatekeeper` if any rule could make one of its actions eligible;
    /// without a rule a drain could only stop at its first action.
    fn drain_if_ruled(
        &self,
        gatekeeper: &Arc<str>,
        cause: DrainCause,
    ) -> Result<(), DecisionError> {
        let ruled = self
            .inner
            .store
            .rules()?
            .iter()
            .any(|rule| *rule.gatekeeper == **gatekeeper);
        if ruled {
            self.request_drain(gatekeeper, cause);
        }
        Ok(())
    }

    fn request_drain(&self, gatekeeper: &Arc<str>, cause: DrainCause) {
        let request = lock(&self.inner.drains)
            .entry(gatekeeper.clone())
            .or_default()
            .request(cause);
        match request {
            Request::Coalesced => {
                debug!(gatekeeper = %gatekeeper, %cause, "drain already running; rerun requested");
            }
            Request::Start => {
                let inner = self.inner.clone();
                let gatekeeper = gatekeeper.clone();
                let span = info_span!("drain", gatekeeper = %gatekeeper);
                let task = tokio::spawn(
                    async move { inner.drain(gatekeeper, cause).await }.instrument(span),
                );
                let mut tasks = lock(&self.inner.tasks);
                // A process that never settles must not keep every finished drain.
                tasks.retain(|task| !task.is_finished());
                tasks.push(task);
            }
        }
    }

    async fn submit(
        &self,
        gatekeeper: &Arc<str>,
        caller: &Arc<str>,
        driver_id: DriverActionId,
        description: ActionDescription,
    ) -> Result<LedgerId, QueueError> {
        let inner = &self.inner;
        let storage = |e: StorageError| QueueError::Storage(e.0);
        if inner.store.locked_down().map_err(storage)? {
            warn!(gatekeeper = %gatekeeper, %driver_id, "submission refused: lockdown");
            return Err(QueueError::LockedDown);
        }
        if inner
            .store
            .find_action(gatekeeper, driver_id)
            .map_err(storage)?
            .is_some()
        {
            return Err(QueueError::DuplicateSubmission(driver_id));
        }
        let mut depends_on = Vec::with_capacity(description.depends_on.len());
        let mut blocked_by = None;
        for dep in &description.depends_on {
            let Some(dep_id) = inner.store.find_action(gatekeeper, *dep).map_err(storage)? else {
                continue;
            };
            depends_on.push(dep_id);
            if blocked_by.is_none()
                && let Some(dep_entry) = inner.store.get(dep_id).map_err(storage)?
                && let Some(dep_action) = dep_entry.action()
            {
                let failed_for_good =
                    dep_action.state == ActionState::Failed && !dep_action.is_open();
                let closed_unsent = matches!(
                    dep_action.state,
                    ActionState::Rejected | ActionState::Expired
                );
                if closed_unsent || failed_for_good {
                    blocked_by = Some(dep_id);
                } else if dep_action.blocked_by.is_some() {
                    blocked_by = dep_action.blocked_by;
                }
            }
        }
        let now = inner.clock.now();
        let auto_candidate = description.auto_approvable && blocked_by.is_none();
        let description = Arc::new(description);
        let mut depends_on = Some(depends_on);
        let (id, durable) = inner
            .store
            .insert_durable_later(&mut |id| LedgerEntry {
                id,
                gatekeeper: gatekeeper.clone(),
                caller: caller.clone(),
                created_at: now,
                body: EntryBody::Action(ActionEntry {
                    driver_id,
                    description: description.clone(),
                    state: ActionState::Pending,
                    resolution: None,
                    failure: None,
                    depends_on: depends_on.take().unwrap_or_default(),
                    blocked_by,
                    restart_requested: false,
                    revert: None,
                }),
            })
            .map_err(storage)?;
        // The caller learns of the action only once it is durable; meanwhile this task
        // holds no thread, and other submissions can share the store's sync.
        durable.await.map_err(storage)?;
        let will_auto = auto_candidate
            && match &description.action_kind {
                Some(kind) => inner
                    .store
                    .rule(gatekeeper, &kind.tag)
                    .map_err(storage)?
                    .is_some_and(|rule| rule.admits(caller, || inner.clock.now())),
                None => false,
            };
        info!(action = %id, gatekeeper = %gatekeeper, %driver_id, will_auto, "action submitted");
        if will_auto {
            self.request_drain(gatekeeper, DrainCause::Submitted(id));
        }
        Ok(id)
    }

    async fn observe(
        &self,
        gatekeeper: &Arc<str>,
        caller: &Arc<str>,
        description: ObservationDescription,
    ) -> Result<LedgerId, QueueError> {
        let inner = &self.inner;
        let storage = |e: StorageError| QueueError::Storage(e.0);
        let sensitive = description.prohibit_all_sharing;
        if sensitive && !inner.store.locked_down().map_err(storage)? {
            inner.store.latch_lockdown().map_err(storage)?;
            warn!(gatekeeper = %gatekeeper, "sensitive data observed: lockdown latched");
        }
        let now = inner.clock.now();
        let mut description = Some(description);
        let mut make = |id| LedgerEntry {
            id,
            gatekeeper: gatekeeper.clone(),
            caller: caller.clone(),
            created_at: now,
            body: EntryBody::Observation(description.take().unwrap_or_default()),
        };
        let id = if sensitive {
            let (id, durable) = inner
                .store
                .insert_durable_later(&mut make)
                .map_err(storage)?;
            // Sensitive data is handed over only once its observation (and the lockdown
            // latched above) is durable: a crash cannot forget what the caller saw.
            durable.await.map_err(storage)?;
            id
        } else {
            // An ordinary observation rides on the store's next sync: a crash before it
            // may lose this record, and nothing else, so the read does not wait for one.
            inner.store.insert_lazy(&mut make).map_err(storage)?
        };
        debug!(observation = %id, gatekeeper = %gatekeeper, "observation authorized");
        Ok(id)
    }
}

impl Inner {
    fn gatekeeper(&self, name: &str) -> Result<Arc<dyn Gatekeeper>, DecisionError> {
        self.gatekeepers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
            .ok_or_else(|| DecisionError::UnknownGatekeeper(name.to_owned()))
    }

    fn gatekeeper_name(&self, name: &str) -> Result<Arc<str>, DecisionError> {
        self.gatekeepers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get_key_value(name)
            .map(|(k, _)| k.clone())
            .ok_or_else(|| DecisionError::UnknownGatekeeper(name.to_owned()))
    }

    /// The time to live (in milliseconds) of `entry` if it is a pending action whose
    /// gatekeeper has one, or `None`.
    fn pending_ttl(&self, entry: &LedgerEntry) -> Option<u64> {
        if entry.action()?.state != ActionState::Pending || !self.any_ttl.load(Ordering::Acquire) {
            return None;
        }
        let table = self.ttl.read().unwrap_or_else(|p| p.into_inner());
        table
            .per_gatekeeper
            .get(&*entry.gatekeeper)
            .copied()
            .or(table.default)
    }

    /// The time to live of an action that is pending and older than its gatekeeper's
    /// time to live (in milliseconds), or `None` if it may still wait.
    fn due(&self, entry: &LedgerEntry) -> Option<u64> {
        let ttl = self.pending_ttl(entry)?;
        let now = self.clock.now().0;
        (now >= entry.created_at.0.saturating_add(ttl)).then_some(ttl)
    }

    /// Expire an action whose time to live has passed. The caller holds its slot.
    async fn expire_held(&self, entry: LedgerEntry) -> Result<RejectReport, DecisionError> {
        let ttl = self.due(&entry).unwrap_or_default();
        let cause = format!(
            "nobody decided within its time to live ({})",
            ttl_words(ttl)
        );
        self.close_held(entry, EXPIRY_DECIDER, Some(cause), ActionState::Expired)
            .await
    }

    /// Close an open action without sending it: tell its driver (as a rejection), then
    /// record it as `state` (rejected or expired) by `by` with `cause`; mark what the
    /// driver dropped with it rejected, "cascaded from #id", and flag what depended on
    /// them. The caller holds the action's slot.
    async fn close_held(
        &self,
        entry: LedgerEntry,
        by: &str,
        cause: Option<String>,
        state: ActionState,
    ) -> Result<RejectReport, DecisionError> {
        let id = entry.id;
        let action = entry.action().expect("open_action checked the kind");
        let gatekeeper = self.gatekeeper(&entry.gatekeeper)?;
        let span = info_span!("reject", action = %id, gatekeeper = %entry.gatekeeper);
        let deadline = gatekeeper.call_deadline();
        let outcome = match Bounded::new(gatekeeper.reject_action(action.driver_id), deadline)
            .instrument(span.clone())
            .await
        {
            Ended::Answered(outcome) => outcome,
            Ended::Panicked(panic) => Err(GatekeeperError::fatal(format!(
                "the gatekeeper panicked while rejecting this action ({panic}); the ledger still holds it open, so try again, and report the panic to the gatekeeper's maintainers"
            ))),
            Ended::TimedOut => Err(GatekeeperError::retryable(format!(
                "the gatekeeper did not answer the rejection within {}; the ledger still holds it open, so try again",
                Human(deadline)
            ))),
        }
        .map_err(|source| DecisionError::Gatekeeper { id, source })?;
        let _enter = span.enter();

        let now = self.clock.now();
        let mut closed = entry.clone();
        let record = closed.action_mut().expect("action");
        record.state = state;
        record.restart_requested = outcome.restart;
        record.resolution = Some(Resolution {
            by: by.to_owned(),
            auto: state == ActionState::Expired,
            at: now,
            cause,
        });
        self.store.put(closed)?;
        info!(
            restart = outcome.restart,
            state = state.as_str(),
            "action closed unsent"
        );

        let mut report = RejectReport {
            restart: outcome.restart,
            ..RejectReport::default()
        };
        let cause = format!("cascaded from {id}");
        for driver_id in outcome.cascaded {
            let Some(other) = self.store.find_action(&entry.gatekeeper, driver_id)? else {
                warn!(%driver_id, "driver cascaded to an action the kernel never saw");
                continue;
            };
            let Some(mut other_entry) = self.store.get(other)? else {
                continue;
            };
            let Some(other_action) = other_entry.action_mut() else {
                continue;
            };
            if !other_action.is_open() {
                continue;
            }
            other_action.state = ActionState::Rejected;
            other_action.resolution = Some(Resolution {
                by: by.to_owned(),
                auto: false,
                at: now,
                cause: Some(cause.clone()),
            });
            self.store.put(other_entry)?;
            info!(action = %other, cause = %cause, "action rejected by cascade");
            report.cascaded.push(other);
        }

        let mut roots: Vec<LedgerId> = vec![id];
        roots.extend(&report.cascaded);
        report.flagged = self.flag_dependents(&entry.gatekeeper, id, &roots)?;
        Ok(report)
    }

    /// Take the action's in-flight slot for the length of one decision.
    fn claim(&self, id: LedgerId) -> Result<InFlight<'_>, DecisionError> {
        let deciding = &self.deciding;
        let mut table = lock(&deciding.table);
        if table.claimed.contains(&id) {
            return Err(DecisionError::InFlight(id));
        }
        // Counted before looking at the drains: see `Deciding`.
        deciding.claims.fetch_add(1, Ordering::SeqCst);
        if table
            .drains
            .iter()
            .any(|at| at.load(Ordering::SeqCst) == id.0)
        {
            deciding.claims.fetch_sub(1, Ordering::SeqCst);
            return Err(DecisionError::InFlight(id));
        }
        table.claimed.push(id);
        Ok(InFlight::Claimed { inner: self, id })
    }

    /// Check that an entry is an action a person may still decide.
    fn open_action_entry(
        &self,
        entry: Option<LedgerEntry>,
        id: LedgerId,
    ) -> Result<LedgerEntry, DecisionError> {
        let entry = entry.ok_or(DecisionError::UnknownEntry(id))?;
        let action = entry.action().ok_or(DecisionError::Observation(id))?;
        if !action.is_open() {
            return Err(match (&action.state, &action.failure) {
                (ActionState::Failed, Some(failure)) => DecisionError::NotRetryable {
                    id,
                    message: failure.message.clone(),
                },
                (state, _) => DecisionError::NotPending { id, state: *state },
            });
        }
        Ok(entry)
    }

    /// The one path from open to approved or failed, for people and rules alike. The
    /// caller holds the action's slot and has checked that it is open.
    ///
    /// The driver's apply is bounded by the gatekeeper's deadline and its panics are
    /// caught; either ends the attempt as failed with outcome unknown. If this future is
    /// dropped while the driver works, [`Attempt`] records the same.
    ///
    /// `held` holds the entry (`Some`); it is settled and taken from there when the
    /// attempt ends, and left in place if nothing was recorded. `name` is the entry's
    /// gatekeeper's name (`entry.gatekeeper`), borrowed from the caller so that recording
    /// the outcome touches no reference count.
    ///
    /// The slot is handed back with the result, however the attempt ended, for the caller
    /// to release.
    async fn apply_claimed<'s>(
        &'s self,
        slot: InFlight<'s>,
        held: &mut Option<LedgerEntry>,
        name: &str,
        gatekeeper: &dyn Gatekeeper,
        decider: Decider<'_>,
    ) -> (Result<(), DecisionError>, InFlight<'s>) {
        let (id, driver_id) = match self.record_decision(held, &decider) {
            Ok(ids) => ids,
            Err(error) => return (Err(error), slot),
        };
        let mut attempt = Attempt {
            inner: self,
            gatekeeper: name,
            entry: held,
            slot: Some(slot),
        };
        // Events, not a span, on this path: it runs once per applied action and a span
        // per apply would cost more than the rest of the kernel's work for it.
        let deadline = gatekeeper.call_deadline();
        let result = match Bounded::new(gatekeeper.apply_action(driver_id), deadline).await {
            Ended::Answered(result) => result,
            Ended::Panicked(panic) => {
                warn!(action = %id, %panic, "the gatekeeper panicked in apply");
                Err(GatekeeperError::fatal(format!(
                    "the gatekeeper panicked while applying this action ({panic}), so the call may or may not have reached the service; it will not be sent again: check the service before staging it again, and report the panic to the gatekeeper's maintainers"
                )))
            }
            Ended::TimedOut => {
                warn!(action = %id, deadline = %Human(deadline), "the gatekeeper did not answer in time");
                Err(GatekeeperError::fatal(format!(
                    "the service did not answer within {} (the gatekeeper's deadline), so the call may or may not have taken effect; it will not be sent again: check the service before staging it again",
                    Human(deadline)
                )))
            }
        };
        // Settling takes the entry, so the attempt, dropped after, records nothing more.
        let result = self.settle_apply(name, attempt.entry, result, &decider);
        let slot = attempt.slot.take().expect("handed back only here");
        (result, slot)
    }

    /// Write who decided into the held entry, and into the store, before the driver is
    /// called (the action is still open): if the process dies mid-apply, the ledger still
    /// says who approved what may have been sent. A durable store may let this write ride
    /// with the driver's claim. Returns the action's ledger and driver ids.
    ///
    /// A flagged action is applied only by a person's deliberate decision (the drain
    /// never applies one); the ledger says so beside who decided.
    fn record_decision(
        &self,
        held: &mut Option<LedgerEntry>,
        decider: &Decider<'_>,
    ) -> Result<(LedgerId, DriverActionId), DecisionError> {
        let entry = held.as_mut().expect("caller holds the entry");
        let id = entry.id;
        let record = entry.action_mut().expect("caller checked");
        let resolution = Resolution {
            by: decider.by.to_owned(),
            auto: decider.auto,
            at: self.clock.now(),
            cause: {
                let flagged = record.blocked_by.map(|root| {
                    format!(
                        "approved although it depends on {root}, which was rejected, failed for good or reverted"
                    )
                });
                match (flagged, decider.note) {
                    (Some(flagged), Some(note)) => Some(format!("{note}; {flagged}")),
                    (flagged, note) => flagged.or_else(|| note.map(str::to_owned)),
                }
            },
        };
        if !self.store.record_attempt(id, &resolution)? {
            let now = self.store.get(id)?;
            let action = now.as_ref().and_then(LedgerEntry::action);
            return Err(DecisionError::DecidedElsewhere {
                id,
                by: action
                    .and_then(|a| a.resolution.as_ref())
                    .map(|r| r.by.clone()),
                state: action.map_or(ActionState::Pending, |a| a.state),
                open: action.is_some_and(ActionEntry::is_open),
            });
        }
        record.resolution = Some(resolution);
        Ok((id, record.driver_id))
    }

    /// Record how an apply ended: approved, or failed with the driver's message (and, when
    /// nothing can be retried, hold what was staged on top of it for a person).
    ///
    /// The entry is settled where it is held and taken from there (`held` is `None`
    /// afterwards, whatever the result). `gatekeeper_name` is the entry's gatekeeper.
    fn settle_apply(
        &self,
        gatekeeper_name: &str,
        held: &mut Option<LedgerEntry>,
        result: Result<(), GatekeeperError>,
        decider: &Decider<'_>,
    ) -> Result<(), DecisionError> {
        let entry = held.as_mut().expect("an entry to settle");
        let id = entry.id;
        let record = entry.action_mut().expect("an action");
        match result {
            Ok(()) => {
                record.state = ActionState::Approved;
                record.failure = None;
                self.store.put(held.take().expect("held above"))?;
                info!(action = %id, gatekeeper = %gatekeeper_name, by = decider.by, auto = decider.auto, "action applied");
                Ok(())
            }
            Err(source) => {
                record.state = ActionState::Failed;
                record.failure = Some(Failure {
                    message: source.message.clone(),
                    retryable: source.retryable,
                    kind: source.kind,
                });
                self.store.put(held.take().expect("held above"))?;
                warn!(action = %id, gatekeeper = %gatekeeper_name, error = %source, retryable = source.retryable, kind = source.kind.as_str(), "apply failed");
                if !source.retryable {
                    // Its effect will never exist (or is unknown): what was staged on top
                    // of it is held for a person, as after a rejection.
                    self.flag_dependents(gatekeeper_name, id, &[id])?;
                }
                Err(DecisionError::ApplyFailed { id, source })
            }
        }
    }

    /// Flag every open action of `gatekeeper` that depends, directly or through another
    /// flagged action, on one of `rejected` (rejected, failed for good, or reverted).
    /// Dependencies point to earlier ids, so one ascending pass reaches every transitive
    /// dependent.
    fn flag_dependents(
        &self,
        gatekeeper: &str,
        root: LedgerId,
        rejected: &[LedgerId],
    ) -> Result<Vec<LedgerId>, DecisionError> {
        let mut open = Vec::new();
        for id in self.store.open_action_ids(gatekeeper)? {
            open.extend(self.store.get(id)?);
        }
        self.flag_through(root, rejected, open)
    }

    /// Flag every open action of `gatekeeper` that depends on `reverted`, directly or
    /// through any later action, open or already decided. A revert undoes an effect that
    /// actions applied since may have been built on, so a dependency chain that runs
    /// through an applied action still reaches what is open behind it (a driver may
    /// record a session's actions as a chain, each naming only the one before). This
    /// reads every later entry of the ledger; a revert is a person's rare request.
    fn flag_dependents_of_revert(
        &self,
        gatekeeper: &str,
        reverted: LedgerId,
    ) -> Result<Vec<LedgerId>, DecisionError> {
        let later = self
            .store
            .entries()?
            .into_iter()
            .filter(|e| e.id > reverted && &*e.gatekeeper == gatekeeper);
        self.flag_through(reverted, &[reverted], later)
    }

    /// Walk `entries` in ascending id: an action that depends on a tainted one is tainted
    /// too, and if it is open and not yet held, it is held behind `root`. Returns the
    /// actions newly held.
    fn flag_through(
        &self,
        root: LedgerId,
        tainted: &[LedgerId],
        entries: impl IntoIterator<Item = LedgerEntry>,
    ) -> Result<Vec<LedgerId>, DecisionError> {
        let mut tainted: BTreeSet<LedgerId> = tainted.iter().copied().collect();
        let mut flagged = Vec::new();
        for mut entry in entries {
            let id = entry.id;
            let Some(action) = entry.action_mut() else {
                continue;
            };
            if !action.depends_on.iter().any(|d| tainted.contains(d)) {
                continue;
            }
            tainted.insert(id);
            if action.is_open() && action.blocked_by.is_none() {
                action.blocked_by = Some(root);
                self.store.put(entry)?;
                info!(action = %id, root = %root, "action depends on a rejected, failed or reverted action: held for a person");
                flagged.push(id);
            }
        }
        Ok(flagged)
    }

    /// Run drain passes until no rerun was requested, then release the guard.
    async fn drain(self: Arc<Self>, gatekeeper: Arc<str>, first: DrainCause) {
        let mut run = DrainRun {
            inner: &self,
            gatekeeper: &gatekeeper,
            finished: false,
        };
        // Other processes sharing the store drain this gatekeeper one at a time: wait
        // for them, then drain what is open by then (their submissions included).
        let _lease = match self.store.drain_lease(&gatekeeper).await {
            Ok(lease) => lease,
            Err(error) => {
                warn!(%error, "drain not started: its lease could not be taken");
                if let Some(guard) = lock(&self.drains).get_mut(&gatekeeper) {
                    guard.abandon();
                }
                run.finished = true;
                return;
            }
        };
        let mut cause = first;
        loop {
            debug!(%cause, "drain pass");
            if let Err(error) = self.drain_once(&gatekeeper).await {
                warn!(%error, "drain pass stopped by a storage error");
            }
            let next = lock(&self.drains)
                .get_mut(&gatekeeper)
                .and_then(DrainGuard::pass_finished);
            match next {
                Some(rerun) => cause = rerun,
                None => {
                    run.finished = true;
                    return;
                }
            }
        }
    }

    /// One pass: apply eligible open actions in ascending id, stop at the first that is
    /// not eligible or fails.
    async fn drain_once(&self, name: &str) -> Result<(), StorageError> {
        let Ok(gatekeeper) = self.gatekeeper(name) else {
            return Ok(());
        };
        let drain_slot = DrainSlot::new(self);
        for id in self.store.open_action_ids(name)? {
            // A person deciding this very action holds it: it is a gate until they finish.
            let Ok(slot) = drain_slot.take(id) else {
                debug!(action = %id, "being decided by a person: drain stops");
                return Ok(());
            };
            // Kept where the store returned it, and only borrowed until the apply settles
            // it: a ledger entry is a few hundred bytes, not worth copying at each step.
            let mut read = self.store.get(id);
            let held = read.as_mut().map_err(|error| error.clone())?;
            let Some(entry) = &*held else {
                continue;
            };
            let Some(action) = entry.action() else {
                continue;
            };
            if !action.is_open() {
                // Decided since the pass began: it no longer holds anything back.
                continue;
            }
            if self.due(entry).is_some() {
                // Past its time to live: a rule never sends it. Expired, it holds
                // nothing back.
                let entry = held.take().expect("read above");
                if let Err(error) = self.expire_held(entry).await {
                    warn!(action = %id, %error, "could not expire the action: drain stops");
                    return Ok(());
                }
                continue;
            }
            let rule = match (&action.description.action_kind, action.state) {
                (Some(kind), ActionState::Pending)
                    if action.description.auto_approvable && action.blocked_by.is_none() =>
                {
                    self.store
                        .rule(name, &kind.tag)?
                        .filter(|rule| rule.admits(&entry.caller, || self.clock.now()))
                }
                _ => None,
            };
            // A rule narrowed by arguments applies only what the gatekeeper finds inside
            // it; one it cannot judge stays for a person.
            let rule = match rule {
                Some(rule) if !rule.scope.arguments.is_empty() => {
                    let driver_id = action.driver_id;
                    match gatekeeper.covers(driver_id, &rule.scope.arguments).await {
                        Ok(true) => Some(rule),
                        Ok(false) => None,
                        Err(error) => {
                            warn!(action = %id, %error, "could not test the rule's arguments");
                            None
                        }
                    }
                }
                rule => rule,
            };
            let Some(rule) = rule else {
                debug!(action = %id, "manual gate: drain stops");
                return Ok(());
            };
            if self.store.locked_down()? {
                return Ok(());
            }
            let decider = Decider {
                by: &rule.enabled_by,
                auto: true,
                note: None,
            };
            let (result, slot) = self
                .apply_claimed(slot, held, name, &*gatekeeper, decider)
                .await;
            drop(slot);
            match result {
                Ok(()) => {}
                // Another process decided it first: it no longer holds anything back.
                Err(DecisionError::DecidedElsewhere { open: false, .. }) => {
                    debug!(action = %id, "decided elsewhere: drain goes on");
                }
                Err(error) => {
                    warn!(action = %id, %error, "auto-approval stopped");
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

/// The queue handed to one caller of one gatekeeper.
struct CallerQueue {
    overseer: Overseer,
    gatekeeper: Arc<str>,
    caller: Arc<str>,
}

#[async_trait]
impl ObservationAuthorizer for CallerQueue {
    async fn authorize_observation(
        &self,
        description: ObservationDescription,
    ) -> Result<LedgerId, QueueError> {
        self.overseer
            .observe(&self.gatekeeper, &self.caller, description)
            .await
    }
}

#[async_trait]
impl ApprovalQueue for CallerQueue {
    async fn submit_action(
        &self,
        action: DriverActionId,
        description: ActionDescription,
    ) -> Result<LedgerId, QueueError> {
        self.overseer
            .submit(&self.gatekeeper, &self.caller, action, description)
            .await
    }
}

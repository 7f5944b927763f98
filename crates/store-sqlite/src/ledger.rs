//! The kernel's [`LedgerStore`] on SQLite: the `ledger`, `auto_approval_rules` and
//! `lockdown` tables.
//!
//! What each write costs:
//!
//! - A new entry (a submission, an observation), a rule change and the lockdown latch
//!   are committed and synced before the call returns. A submission's commit also
//!   carries the driver's staged record (deferred by the action store), so the agent is
//!   told "pending" only once both are on disk.
//! - A rejection, a revert or a flag is committed and synced before the call returns;
//!   the driver's write about it (deferred) rides in the same commit.
//! - The outcome of an apply a *person* approved is committed before the call returns,
//!   without a sync of its own: it becomes durable with the next sync.
//! - The outcome of an *automatic* decision (an auto-approval rule applied it) is
//!   deferred: it rides with the next claim of the same drain, or is committed by the
//!   flusher within [`DEFERRED_COMMIT_WINDOW`](crate::DEFERRED_COMMIT_WINDOW).
//!
//! A crash or power cut before an outcome is durable leaves the driver's synced claim,
//! which is recovered as "interrupted" (outcome unknown), never as something to send
//! again.
//!
//! Two processes on one file: who decides an open action is recorded by
//! `record_attempt` only if the action is still open and `deciding_session` names no
//! other live process, in the one statement that checks it, and the row then names this
//! process's session. The outcome (`put` of any state but pending) is written only by
//! that session, or after it died, and clears it. A change to a still-pending action (a
//! flag) is written only while the action is open, and keeps who decides it if another
//! session is deciding it. So the ledger names the process that decided, and a loser
//! learns it from the refusal instead of overwriting it.
//!
//! A description (and the dependencies it declared) is stored exactly as submitted and
//! never rewritten by [`LedgerStore::put`], which stores only what moves: state,
//! resolution, failure, flags and revert.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use kernel::{
    ActionDescription, ActionEntry, ActionKind, ActionState, AutoApprovalRule, DriverActionId,
    EntryBody, Failure, FailureKind, LedgerEntry, LedgerId, LedgerStore, ObservationDescription,
    Resolution, RevertRecord, RuleScope, StorageError, Timestamp,
};
use rusqlite::{OptionalExtension, Row, params};

use crate::db::{Database, Durability, Error, Steps};
use crate::error::StoreError;

/// The kernel's ledger, rules and lockdown latch in a [`Database`].
#[derive(Debug, Clone)]
pub struct SqliteLedger {
    db: Database,
    descriptions: Arc<Mutex<Descriptions>>,
}

/// Action descriptions already read, by ledger id. A description is stored once and never
/// rewritten, and ledger ids are never reused, so a hit saves parsing its JSON again.
pub(crate) type Descriptions = HashMap<u64, Arc<ActionDescription>>;

/// Past this many entries the cache starts over (small: it must not grow with the
/// ledger, and a decision parses only the descriptions of the rows it decides).
const DESCRIPTION_CACHE: usize = 256;

/// Keep the description of ledger entry `id` (the cache starts over when full).
fn remember_description(
    descriptions: &mut Descriptions,
    id: u64,
    description: Arc<ActionDescription>,
) {
    if descriptions.len() >= DESCRIPTION_CACHE {
        descriptions.clear();
    }
    descriptions.insert(id, description);
}

impl SqliteLedger {
    pub(crate) fn new(db: Database) -> Self {
        Self {
            db,
            descriptions: Arc::default(),
        }
    }

    fn descriptions(&self) -> MutexGuard<'_, Descriptions> {
        // The cache holds only immutable facts; a poisoned lock still guards valid entries.
        self.descriptions.lock().unwrap_or_else(|p| p.into_inner())
    }
}

macro_rules! select_entries {
    ($($tail:literal)?) => {
        concat!(
            "SELECT id, kind, gatekeeper, caller, created_at, description_json, driver_id, ",
            "state, resolved_by, auto_approved, resolved_at, resolution_cause, failure, ",
            "failure_retryable, depends_on_json, blocked_by, restart_requested, revert_by, ",
            "revert_at, revert_refused, failure_kind FROM ledger" $(, " ", $tail)?
        )
    };
}

const SELECT_BY_ID: &str = select_entries!("WHERE id = ?1");
const SELECT_ALL: &str = select_entries!("ORDER BY id");

/// A page of the ledger, most recent first: ids below `?1`, at most `?2` of them.
pub(crate) const SELECT_PAGE: &str = select_entries!("WHERE id < ?1 ORDER BY id DESC LIMIT ?2");

/// The open actions (pending, or failed and retryable), oldest first; walks the
/// `ledger_open` partial index.
pub(crate) const SELECT_OPEN: &str = select_entries!(
    "WHERE state = 'pending' OR (state = 'failed' AND failure_retryable = 1) ORDER BY id"
);

fn port(error: StoreError) -> StorageError {
    StorageError(error.to_string())
}

fn u64_of(value: i64, what: &str) -> Result<u64, Error> {
    u64::try_from(value)
        .map_err(|_| StoreError::decode(what.to_owned(), format!("negative value {value}")).into())
}

fn i64_of(value: u64) -> i64 {
    // Ids and timestamps stay far below 2^63; saturate rather than wrap if one did not.
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn state_name(state: ActionState) -> &'static str {
    state.as_str()
}

fn parse_state(name: &str) -> Result<ActionState, Error> {
    Ok(match name {
        "pending" => ActionState::Pending,
        "approved" => ActionState::Approved,
        "rejected" => ActionState::Rejected,
        "failed" => ActionState::Failed,
        "reverted" => ActionState::Reverted,
        "expired" => ActionState::Expired,
        other => {
            return Err(
                StoreError::decode("ledger state", format!("unknown state {other:?}")).into(),
            );
        }
    })
}

/// A stored failure kind. NULL (a row an upgraded file's missing CHECK let through) is
/// read as outcome unknown, the safe reading.
fn parse_failure_kind(name: Option<&str>) -> Result<FailureKind, Error> {
    match name {
        None => Ok(FailureKind::OutcomeUnknown),
        Some(name) => FailureKind::parse(name).ok_or_else(|| {
            StoreError::decode("ledger failure kind", format!("unknown kind {name:?}")).into()
        }),
    }
}

/// The title that stands for a description that cannot be read back.
fn unreadable_title(id: LedgerId) -> String {
    format!(
        "unreadable: the description of ledger entry {} cannot be read back",
        id.0
    )
}

/// Read one ledger row back into an entry.
pub(crate) fn entry_of(
    row: &Row<'_>,
    descriptions: &mut Descriptions,
) -> Result<LedgerEntry, Error> {
    let id = LedgerId(u64_of(row.get(0)?, "ledger id")?);
    let kind = row.get_ref(1)?.as_str()?;
    let gatekeeper: Arc<str> = Arc::from(row.get_ref(2)?.as_str()?);
    let caller: Arc<str> = Arc::from(row.get_ref(3)?.as_str()?);
    let created_at = Timestamp(u64_of(row.get(4)?, "ledger time")?);
    let what = || format!("ledger entry {id}");
    let body = match kind {
        "observation" => EntryBody::Observation(
            crate::json::read::<ObservationDescription>(row.get_ref(5)?.as_str()?, &what())
                .unwrap_or_else(|error| {
                    ObservationDescription::new(unreadable_title(id), error.to_string())
                }),
        ),
        "action" => {
            let description = match descriptions.get(&id.0) {
                Some(known) => known.clone(),
                None => {
                    // A description that cannot be read back must not hide the rest of
                    // the ledger: the entry stands, titled as unreadable and manual, so a
                    // person sees it and can reject it.
                    let parsed: ActionDescription =
                        crate::json::read(row.get_ref(5)?.as_str()?, &what()).unwrap_or_else(
                            |error: StoreError| {
                                ActionDescription::new(
                                    unreadable_title(id),
                                    format!("{error}. Reject it unless you know what it does."),
                                )
                            },
                        );
                    let parsed = Arc::new(parsed);
                    remember_description(descriptions, id.0, parsed.clone());
                    parsed
                }
            };
            let driver_id = DriverActionId(u64_of(row.get(6)?, "driver id")?);
            let state = parse_state(&row.get::<_, String>(7)?)?;
            let resolved_by: Option<String> = row.get(8)?;
            let resolution = match resolved_by {
                Some(by) => Some(Resolution {
                    by,
                    auto: row.get::<_, i64>(9)? == 1,
                    at: Timestamp(u64_of(row.get(10)?, "resolution time")?),
                    cause: row.get(11)?,
                }),
                None => None,
            };
            let failure = match row.get::<_, Option<String>>(12)? {
                Some(message) => {
                    let retryable = row.get::<_, i64>(13)? == 1;
                    Some(Failure {
                        message,
                        retryable,
                        kind: parse_failure_kind(row.get_ref(20)?.as_str_or_null()?)?,
                    })
                }
                None => None,
            };
            let depends_on: Vec<u64> = crate::json::read(&row.get::<_, String>(14)?, &what())?;
            let blocked_by = match row.get::<_, Option<i64>>(15)? {
                Some(id) => Some(LedgerId(u64_of(id, "blocked_by")?)),
                None => None,
            };
            let revert = match row.get::<_, Option<String>>(17)? {
                Some(by) => Some(RevertRecord {
                    by,
                    at: Timestamp(u64_of(row.get(18)?, "revert time")?),
                    refused: row.get(19)?,
                }),
                None => None,
            };
            EntryBody::Action(ActionEntry {
                driver_id,
                description,
                state,
                resolution,
                failure,
                depends_on: depends_on.into_iter().map(LedgerId).collect(),
                blocked_by,
                restart_requested: row.get::<_, i64>(16)? == 1,
                revert,
            })
        }
        other => {
            return Err(StoreError::decode(what(), format!("unknown kind {other:?}")).into());
        }
    };
    Ok(LedgerEntry {
        id,
        gatekeeper,
        caller,
        created_at,
        body,
    })
}

/// The columns of an auto-approval rule, in the order [`rule_of`] reads them.
macro_rules! select_rules {
    ($tail:literal) => {
        concat!(
            "SELECT gatekeeper, tag, label, enabled_by, enabled_at, scope_json ",
            "FROM auto_approval_rules ",
            $tail
        )
    };
}

/// The rule of gatekeeper `?1` for kind tag `?2`.
const SELECT_RULE: &str = select_rules!("WHERE gatekeeper = ?1 AND tag = ?2");

/// Every rule, ordered by gatekeeper then tag.
const SELECT_RULES: &str = select_rules!("ORDER BY gatekeeper, tag");

/// [`SELECT_RULES`] in a file older than schema version 9 (read, not upgraded, by a
/// [`crate::LedgerReader`]): time zero and the whole kind, as the upgrade reads them.
const SELECT_RULES_BEFORE_9: &str = "SELECT gatekeeper, tag, label, enabled_by, 0, '{}'
     FROM auto_approval_rules ORDER BY gatekeeper, tag";

/// The JSON a rule's scope is stored as (`scope_json`).
fn scope_json(rule: &AutoApprovalRule) -> Result<String, StoreError> {
    serde_json::to_string(&rule.scope).map_err(|e| {
        StoreError::decode(
            format!(
                "the scope of the rule for {} on {}",
                rule.kind.tag, rule.gatekeeper
            ),
            e,
        )
    })
}

/// Read one row of [`SELECT_RULE`] or [`SELECT_RULES`] back into a rule. A scope that
/// cannot be read back is an error, never the whole kind: a rule must not reach further
/// than it was made to.
fn rule_of(row: &Row<'_>) -> Result<AutoApprovalRule, Error> {
    let gatekeeper: String = row.get(0)?;
    let tag: String = row.get(1)?;
    let what = format!("the scope of the rule for {tag} on {gatekeeper}");
    let scope: RuleScope = crate::json::read(row.get_ref(5)?.as_str()?, &what)?;
    Ok(AutoApprovalRule {
        gatekeeper,
        kind: ActionKind::new(tag, row.get::<_, String>(2)?),
        enabled_by: row.get(3)?,
        enabled_at: Timestamp(u64_of(row.get(4)?, "rule time")?),
        scope,
    })
}

/// Every auto-approval rule, ordered by gatekeeper then tag; `current` unless the file
/// is older than schema version 9 (see [`SELECT_RULES_BEFORE_9`]).
pub(crate) fn read_rules(
    db: &rusqlite::Connection,
    current: bool,
) -> Result<Vec<AutoApprovalRule>, Error> {
    let sql = if current {
        SELECT_RULES
    } else {
        SELECT_RULES_BEFORE_9
    };
    let mut statement = db.prepare_cached(sql)?;
    let mut rows = statement.query([])?;
    let mut rules = Vec::new();
    while let Some(row) = rows.next()? {
        rules.push(rule_of(row)?);
    }
    Ok(rules)
}

fn depends_on_json(action: &ActionEntry) -> String {
    let ids: Vec<u64> = action.depends_on.iter().map(|id| id.0).collect();
    serde_json::to_string(&ids).unwrap_or_else(|_| "[]".to_owned())
}

/// The action columns that both writing an entry (`insert`) and replacing it (`put`) set,
/// in the order [`bind_action_columns`] binds them: one list, so the two statements
/// cannot drift apart. (What never moves after the submission, the description and its
/// dependencies, is written by `insert` alone.)
const MOVING_COLUMNS: [&str; 13] = [
    "state",
    "resolved_by",
    "auto_approved",
    "resolved_at",
    "resolution_cause",
    "failure",
    "failure_retryable",
    "failure_kind",
    "blocked_by",
    "restart_requested",
    "revert_by",
    "revert_at",
    "revert_refused",
];

/// Where [`MOVING_COLUMNS`] start among the parameters of [`INSERT_ACTION`].
const INSERT_MOVING_FROM: usize = 8;

/// A new action entry: `?1` id, `?2` gatekeeper, `?3` caller, `?4` time, `?5`
/// description, `?6` driver id, `?7` dependencies, then [`MOVING_COLUMNS`].
static INSERT_ACTION: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO ledger (id, kind, gatekeeper, caller, created_at, description_json,
            driver_id, depends_on_json, {})
         VALUES (?1, 'action', ?2, ?3, ?4, ?5, ?6, ?7, {})",
        MOVING_COLUMNS.join(", "),
        numbered(INSERT_MOVING_FROM).join(", ")
    )
});

/// Where [`MOVING_COLUMNS`] start among the parameters of [`UPDATE_ACTION`].
const UPDATE_MOVING_FROM: usize = 2;

/// The columns that record who decided, which a change to a still-pending action (a
/// flag) leaves alone while another process is deciding it.
const RESOLUTION_COLUMNS: [&str; 4] = [
    "resolved_by",
    "auto_approved",
    "resolved_at",
    "resolution_cause",
];

/// A still-pending action entry's moving columns (`?1` id, then [`MOVING_COLUMNS`], then
/// `?15` this session): written only while the action is still open (a copy read before
/// another process decided it must not take it back), and keeping the record of who
/// decides if another session is deciding it.
static UPDATE_ACTION: LazyLock<String> = LazyLock::new(|| {
    let sets: Vec<String> = MOVING_COLUMNS
        .iter()
        .zip(numbered(UPDATE_MOVING_FROM))
        .map(|(column, parameter)| {
            if RESOLUTION_COLUMNS.contains(column) {
                format!(
                    "{column} = CASE WHEN deciding_session IS NULL OR deciding_session IS ?{me}
                        THEN {parameter} ELSE {column} END",
                    me = OUTCOME_SESSION_FROM
                )
            } else {
                format!("{column} = {parameter}")
            }
        })
        .collect();
    format!(
        "UPDATE ledger SET {} WHERE id = ?1 AND kind = 'action'
           AND (state = 'pending' OR (state = 'failed' AND failure_retryable = 1))",
        sets.join(", ")
    )
});

/// The outcome of a decision (any state but pending): [`UPDATE_ACTION`], written only if
/// this session (`?15`) is the one deciding the action, or nobody is (or, when `?17`,
/// the dead session `?16` was); it ends the decision (`deciding_session` cleared).
static UPDATE_OUTCOME: LazyLock<String> = LazyLock::new(|| {
    let sets: Vec<String> = MOVING_COLUMNS
        .iter()
        .zip(numbered(UPDATE_MOVING_FROM))
        .map(|(column, parameter)| format!("{column} = {parameter}"))
        .collect();
    format!(
        "UPDATE ledger SET {}, deciding_session = NULL WHERE id = ?1 AND kind = 'action'
           AND (CASE WHEN ?{flag} THEN deciding_session IS ?{dead}
                ELSE deciding_session IS NULL OR deciding_session IS ?{me} END)",
        sets.join(", "),
        me = OUTCOME_SESSION_FROM,
        dead = OUTCOME_SESSION_FROM + 1,
        flag = OUTCOME_SESSION_FROM + 2,
    )
});

/// Where the session parameters of [`UPDATE_OUTCOME`] start.
const OUTCOME_SESSION_FROM: usize = UPDATE_MOVING_FROM + MOVING_COLUMNS.len();

/// `?first`, `?first+1`, … for each of [`MOVING_COLUMNS`].
fn numbered(first: usize) -> Vec<String> {
    (first..first + MOVING_COLUMNS.len())
        .map(|n| format!("?{n}"))
        .collect()
}

/// Binds [`MOVING_COLUMNS`] from `first` on, by position (SQLite looks a name up by
/// walking every parameter name, which a dozen columns turn into measurable time).
fn bind_action_columns(
    statement: &mut rusqlite::Statement<'_>,
    first: usize,
    action: &ActionEntry,
) -> rusqlite::Result<()> {
    let resolution = action.resolution.as_ref();
    let failure = action.failure.as_ref();
    let revert = action.revert.as_ref();
    let values: [&dyn rusqlite::ToSql; MOVING_COLUMNS.len()] = [
        &state_name(action.state),
        &resolution.map(|r| r.by.as_str()),
        &resolution.map(|r| r.auto),
        &resolution.map(|r| i64_of(r.at.0)),
        &resolution.and_then(|r| r.cause.as_deref()),
        &failure.map(|f| f.message.as_str()),
        &failure.map(|f| f.retryable),
        &failure.map(|f| f.kind.as_str()),
        &action.blocked_by.map(|b| i64_of(b.0)),
        &action.restart_requested,
        &revert.map(|r| r.by.as_str()),
        &revert.map(|r| i64_of(r.at.0)),
        &revert.and_then(|r| r.refused.as_deref()),
    ];
    for (offset, value) in values.into_iter().enumerate() {
        statement.raw_bind_parameter(first + offset, value)?;
    }
    Ok(())
}

fn encode<T: serde::Serialize>(value: &T, id: LedgerId) -> Result<String, Error> {
    let what = format!("the description of ledger entry {id}");
    let json = serde_json::to_string(value).map_err(|e| StoreError::decode(what.clone(), e))?;
    crate::json::readable(&json, &what)?;
    Ok(json)
}

/// What `record_attempt` reads of a row it could not write: kind, state, whether a
/// failure is retryable, and the session deciding it.
type DecisionRow = (String, Option<String>, Option<i64>, Option<String>);

/// Record who decides `id`, and that this session (`me`) is deciding it, if it is still
/// open and nobody else is deciding it (or, with `dead`, if that dead session was).
/// Returns the rows changed (0 or 1). One statement: the check and the write cannot be
/// separated by another process's commit.
fn record_attempt_if(
    db: &rusqlite::Connection,
    id: LedgerId,
    resolution: &Resolution,
    me: Option<&str>,
    dead: Option<&str>,
) -> rusqlite::Result<usize> {
    db.prepare_cached(
        "UPDATE ledger SET resolved_by = ?2, auto_approved = ?3, resolved_at = ?4,
            resolution_cause = ?5, deciding_session = ?6
         WHERE id = ?1 AND kind = 'action'
           AND (state = 'pending' OR (state = 'failed' AND failure_retryable = 1))
           AND (CASE WHEN ?8 THEN deciding_session IS ?7
                ELSE deciding_session IS NULL OR deciding_session IS ?6 END)",
    )?
    .execute(params![
        i64_of(id.0),
        resolution.by.as_str(),
        resolution.auto,
        i64_of(resolution.at.0),
        resolution.cause.as_deref(),
        me,
        dead,
        dead.is_some(),
    ])
}

/// How durable a `put` must be before it returns.
///
/// The outcome of an apply (approved, or failed) needs no sync of its own: the claim
/// before the send was synced, so if a power cut loses the outcome, recovery finds the
/// claim and records "outcome unknown", never something to send again. A person's
/// outcome is committed at once (visible to other processes) and becomes durable with
/// the next sync; an automatic one is deferred to ride with the drain's next claim.
/// Everything else (a rejection, a revert, a flag) is a decision or a fact nothing else
/// records: durable before the call returns.
pub(crate) fn put_durability(entry: &LedgerEntry) -> Durability {
    match entry.action() {
        Some(action) if matches!(action.state, ActionState::Approved | ActionState::Failed) => {
            if action.resolution.as_ref().is_some_and(|r| r.auto) {
                Durability::Deferred
            } else {
                Durability::Lazy
            }
        }
        _ => Durability::Now,
    }
}

impl SqliteLedger {
    /// [`LedgerStore::insert`] written as `durability` says: synced (`Now`), or
    /// deferred into the open transaction, to ride with the next commit (`Deferred`, an
    /// ordinary observation).
    fn insert_as(
        &self,
        durability: Durability,
        make: &mut dyn FnMut(LedgerId) -> LedgerEntry,
    ) -> Result<LedgerId, StorageError> {
        let (id, description) = self
            .db
            .shared()
            .write(durability, Steps::One, |conn| {
                let last = match conn.known.ledger.last_id {
                    Some(last) => last,
                    None => u64_of(
                        conn.db
                            .prepare_cached("SELECT COALESCE(MAX(id), 0) FROM ledger")?
                            .query_row([], |r| r.get(0))?,
                        "ledger id",
                    )?,
                };
                let db = &conn.db;
                let id = LedgerId(last + 1);
                let next = i64_of(id.0);
                let entry = make(id);
                let description = entry.action().map(|action| action.description.clone());
                if entry.id != id {
                    return Err(StoreError::Missing(format!(
                        "entry built for {id} carries id {}",
                        entry.id
                    ))
                    .into());
                }
                match &entry.body {
                    EntryBody::Observation(observation) => {
                        db.prepare_cached(
                            "INSERT INTO ledger (id, kind, gatekeeper, caller, created_at, description_json)
                             VALUES (?1, 'observation', ?2, ?3, ?4, ?5)",
                        )?
                        .execute(params![
                            next,
                            &*entry.gatekeeper,
                            &*entry.caller,
                            i64_of(entry.created_at.0),
                            encode(observation, id)?,
                        ])?;
                    }
                    EntryBody::Action(action) => {
                        let mut statement = db.prepare_cached(&INSERT_ACTION)?;
                        statement.raw_bind_parameter(1, next)?;
                        statement.raw_bind_parameter(2, &*entry.gatekeeper)?;
                        statement.raw_bind_parameter(3, &*entry.caller)?;
                        statement.raw_bind_parameter(4, i64_of(entry.created_at.0))?;
                        statement.raw_bind_parameter(5, encode(&*action.description, id)?)?;
                        statement.raw_bind_parameter(6, i64_of(action.driver_id.0))?;
                        statement.raw_bind_parameter(7, depends_on_json(action))?;
                        bind_action_columns(&mut statement, INSERT_MOVING_FROM, action)?;
                        statement.raw_execute()?;
                    }
                }
                conn.known.ledger.last_id = Some(id.0);
                conn.known.ledger.remember(entry);
                Ok((id, description))
            })
            .map_err(port)?;
        // Committed and synced: the id is this description's for good (a lost transaction
        // could have handed it out again), so a later read need not parse it.
        if let Some(description) = description.filter(|_| durability == Durability::Now) {
            remember_description(&mut self.descriptions(), id.0, description);
        }
        Ok(id)
    }

    fn query_entries(
        &self,
        sql: &str,
        params: impl rusqlite::Params,
    ) -> Result<Vec<LedgerEntry>, StorageError> {
        self.db
            .shared()
            .read(|db| {
                let mut statement = db.prepare_cached(sql)?;
                let mut rows = statement.query(params)?;
                let mut entries = Vec::new();
                while let Some(row) = rows.next()? {
                    entries.push(entry_of(row, &mut self.descriptions())?);
                }
                Ok(entries)
            })
            .map_err(port)
    }
}

impl LedgerStore for SqliteLedger {
    fn insert(
        &self,
        make: &mut dyn FnMut(LedgerId) -> LedgerEntry,
    ) -> Result<LedgerId, StorageError> {
        self.insert_as(Durability::Now, make)
    }

    fn insert_lazy(
        &self,
        make: &mut dyn FnMut(LedgerId) -> LedgerEntry,
    ) -> Result<LedgerId, StorageError> {
        // Deferred: it rides with the next commit, or the flusher's within
        // `DEFERRED_COMMIT_WINDOW`, so an ordinary read pays neither a sync nor a commit.
        self.insert_as(Durability::Deferred, make)
    }

    fn get(&self, id: LedgerId) -> Result<Option<LedgerEntry>, StorageError> {
        self.db
            .shared()
            .read_conn(|conn| {
                if conn.trusted()
                    && let Some(known) = conn.known.ledger.entry(id.0)
                {
                    return Ok(Some(known.clone()));
                }
                let mut statement = conn.db.prepare_cached(SELECT_BY_ID)?;
                let mut rows = statement.query([i64_of(id.0)])?;
                let entry = match rows.next()? {
                    Some(row) => entry_of(row, &mut self.descriptions())?,
                    None => return Ok(None),
                };
                drop(rows);
                drop(statement);
                conn.known.ledger.remember(entry.clone());
                Ok(Some(entry))
            })
            .map_err(port)
    }

    fn record_attempt(&self, id: LedgerId, resolution: &Resolution) -> Result<bool, StorageError> {
        // The kernel's record of who decided, written just before it calls the driver:
        // one narrow update, deferred, so it rides with the driver's claim (the next
        // commit, made before anything is sent). After a crash the ledger says who
        // approved a call that may have been sent, at no extra commit.
        //
        // The update checks, in the same statement, that the action is still open and
        // that no other live process is deciding it, and names this process's session
        // as the one deciding. A process that loses the race writes nothing and is told
        // so; the winner's claim is never overwritten (see the module docs).
        let shared = self.db.shared();
        shared
            .write(Durability::Deferred, Steps::One, |conn| {
                let me = shared.session_id();
                let mut changed = record_attempt_if(&conn.db, id, resolution, me, None)?;
                if changed == 0 {
                    let row: Option<DecisionRow> = conn
                        .db
                        .prepare_cached(
                            "SELECT kind, state, failure_retryable, deciding_session
                             FROM ledger WHERE id = ?1",
                        )?
                        .query_row([i64_of(id.0)], |r| {
                            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                        })
                        .optional()?;
                    let Some((kind, state, retryable, deciding)) = row else {
                        return Err(StoreError::Missing(format!(
                            "there is no ledger action {id} to record a decision on"
                        ))
                        .into());
                    };
                    let open = state.as_deref() == Some("pending")
                        || (state.as_deref() == Some("failed") && retryable == Some(1));
                    if kind != "action" {
                        return Err(StoreError::Missing(format!(
                            "there is no ledger action {id} to record a decision on"
                        ))
                        .into());
                    }
                    // What this connection remembered of the entry is stale.
                    conn.known.forget();
                    if !open {
                        return Ok(false);
                    }
                    match deciding {
                        // A process that died mid-decision holds nothing any more.
                        Some(other) if !shared.claimant_alive(Some(&other)) => {
                            changed =
                                record_attempt_if(&conn.db, id, resolution, me, Some(&other))?;
                            if changed == 0 {
                                return Ok(false);
                            }
                        }
                        _ => return Ok(false),
                    }
                }
                if let Some(action) = conn
                    .known
                    .ledger
                    .entry_mut(id.0)
                    .and_then(LedgerEntry::action_mut)
                {
                    action.resolution = Some(resolution.clone());
                }
                Ok(true)
            })
            .map_err(port)
    }

    fn put(&self, entry: LedgerEntry) -> Result<(), StorageError> {
        let durability = put_durability(&entry);
        let shared = self.db.shared();
        shared
            .write(durability, Steps::One, |conn| {
                let changed = match &entry.body {
                    EntryBody::Observation(observation) => conn
                        .db
                        .prepare_cached(
                            "UPDATE ledger SET description_json = ?2 WHERE id = ?1 AND kind = 'observation'",
                        )?
                        .execute(params![i64_of(entry.id.0), encode(observation, entry.id)?])?,
                    EntryBody::Action(action) if action.state == ActionState::Pending => {
                        let mut statement = conn.db.prepare_cached(&UPDATE_ACTION)?;
                        statement.raw_bind_parameter(1, i64_of(entry.id.0))?;
                        bind_action_columns(&mut statement, UPDATE_MOVING_FROM, action)?;
                        statement.raw_bind_parameter(OUTCOME_SESSION_FROM, shared.session_id())?;
                        let changed = statement.raw_execute()?;
                        drop(statement);
                        // The row may differ from the copy (its decider kept, or decided
                        // meanwhile): read it again when next asked.
                        conn.known.forget();
                        if changed > 0 {
                            return Ok(());
                        }
                        let exists: bool = conn
                            .db
                            .prepare_cached(
                                "SELECT EXISTS (SELECT 1 FROM ledger WHERE id = ?1 AND kind = 'action')",
                            )?
                            .query_row([i64_of(entry.id.0)], |r| r.get(0))?;
                        if exists {
                            return Err(StoreError::NotOpen { id: entry.id.0 }.into());
                        }
                        0
                    }
                    EntryBody::Action(action) => {
                        let me = shared.session_id();
                        let outcome = |dead: Option<&str>| -> rusqlite::Result<usize> {
                            let mut statement = conn.db.prepare_cached(&UPDATE_OUTCOME)?;
                            statement.raw_bind_parameter(1, i64_of(entry.id.0))?;
                            bind_action_columns(&mut statement, UPDATE_MOVING_FROM, action)?;
                            statement.raw_bind_parameter(OUTCOME_SESSION_FROM, me)?;
                            statement.raw_bind_parameter(OUTCOME_SESSION_FROM + 1, dead)?;
                            statement.raw_bind_parameter(OUTCOME_SESSION_FROM + 2, dead.is_some())?;
                            statement.raw_execute()
                        };
                        match outcome(None)? {
                            0 => {
                                let deciding: Option<Option<String>> = conn
                                    .db
                                    .prepare_cached(
                                        "SELECT deciding_session FROM ledger WHERE id = ?1 AND kind = 'action'",
                                    )?
                                    .query_row([i64_of(entry.id.0)], |r| r.get(0))
                                    .optional()?;
                                match deciding {
                                    Some(Some(other)) if shared.claimant_alive(Some(&other)) => {
                                        conn.known.forget();
                                        return Err(StoreError::DecidedElsewhere {
                                            id: entry.id.0,
                                        }
                                        .into());
                                    }
                                    Some(Some(other)) => outcome(Some(&other))?,
                                    _ => 0,
                                }
                            }
                            changed => changed,
                        }
                    }
                };
                if changed == 0 {
                    return Err(StoreError::Missing(format!(
                        "there is no ledger entry {} of this kind to replace",
                        entry.id
                    ))
                    .into());
                }
                conn.known.ledger.remember(entry);
                Ok(())
            })
            .map_err(port)
    }

    fn entries(&self) -> Result<Vec<LedgerEntry>, StorageError> {
        self.query_entries(SELECT_ALL, [])
    }

    fn open_action_ids(&self, gatekeeper: &str) -> Result<Vec<LedgerId>, StorageError> {
        self.db
            .shared()
            .read(|db| {
                let mut statement = db.prepare_cached(
                    "SELECT id FROM ledger WHERE gatekeeper = ?1
                       AND (state = 'pending' OR (state = 'failed' AND failure_retryable = 1))
                     ORDER BY id",
                )?;
                let mut rows = statement.query([gatekeeper])?;
                let mut ids = Vec::new();
                while let Some(row) = rows.next()? {
                    ids.push(LedgerId(u64_of(row.get(0)?, "ledger id")?));
                }
                Ok(ids)
            })
            .map_err(port)
    }

    fn find_action(
        &self,
        gatekeeper: &str,
        driver_id: DriverActionId,
    ) -> Result<Option<LedgerId>, StorageError> {
        self.db
            .shared()
            .read(|db| {
                let id: Option<i64> = db
                    .prepare_cached(
                        "SELECT id FROM ledger WHERE gatekeeper = ?1 AND driver_id = ?2 AND kind = 'action'",
                    )?
                    .query_row(params![gatekeeper, i64_of(driver_id.0)], |r| r.get(0))
                    .optional()?;
                match id {
                    Some(id) => Ok(Some(LedgerId(u64_of(id, "ledger id")?))),
                    None => Ok(None),
                }
            })
            .map_err(port)
    }

    fn put_rule(&self, rule: &AutoApprovalRule) -> Result<(), StorageError> {
        let scope = scope_json(rule).map_err(port)?;
        self.db
            .shared()
            .write(Durability::Now, Steps::One, |conn| {
                conn.db
                    .prepare_cached(
                        "INSERT INTO auto_approval_rules
                             (gatekeeper, tag, label, enabled_by, enabled_at, scope_json)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                         ON CONFLICT (gatekeeper, tag)
                         DO UPDATE SET label = excluded.label, enabled_by = excluded.enabled_by,
                             enabled_at = excluded.enabled_at, scope_json = excluded.scope_json",
                    )?
                    .execute(params![
                        rule.gatekeeper,
                        rule.kind.tag,
                        rule.kind.label,
                        rule.enabled_by,
                        i64_of(rule.enabled_at.0),
                        scope,
                    ])?;
                Ok(())
            })
            .map_err(port)
    }

    fn remove_rule(&self, gatekeeper: &str, tag: &str) -> Result<bool, StorageError> {
        self.db
            .shared()
            .write(Durability::Now, Steps::One, |conn| {
                let removed = conn
                    .db
                    .prepare_cached(
                        "DELETE FROM auto_approval_rules WHERE gatekeeper = ?1 AND tag = ?2",
                    )?
                    .execute([gatekeeper, tag])?;
                Ok(removed > 0)
            })
            .map_err(port)
    }

    fn rule(
        &self,
        gatekeeper: &str,
        tag: &str,
    ) -> Result<Option<Arc<AutoApprovalRule>>, StorageError> {
        self.db
            .shared()
            .read(|db| {
                let mut statement = db.prepare_cached(SELECT_RULE)?;
                let mut rows = statement.query([gatekeeper, tag])?;
                match rows.next()? {
                    Some(row) => Ok(Some(Arc::new(rule_of(row)?))),
                    None => Ok(None),
                }
            })
            .map_err(port)
    }

    fn rules(&self) -> Result<Vec<AutoApprovalRule>, StorageError> {
        self.db
            .shared()
            .read(|db| read_rules(db, true))
            .map_err(port)
    }

    fn latch_lockdown(&self) -> Result<(), StorageError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        self.db
            .shared()
            .write(Durability::Now, Steps::One, |conn| {
                conn.db
                    .prepare_cached(
                        "INSERT OR IGNORE INTO lockdown (id, latched_at) VALUES (1, ?1)",
                    )?
                    .execute([i64_of(now)])?;
                Ok(())
            })
            .map_err(port)?;
        self.db.shared().remember_locked_down();
        Ok(())
    }

    fn locked_down(&self) -> Result<bool, StorageError> {
        let shared = self.db.shared();
        // Once latched, always latched. In memory this process holds the only connection,
        // so the cached answer is the whole truth; on a file another process may latch it.
        if shared.locked_down_cached() || shared.session_id().is_none() {
            return Ok(shared.locked_down_cached());
        }
        let latched = shared
            .read(|db| {
                Ok(db
                    .prepare_cached("SELECT EXISTS (SELECT 1 FROM lockdown)")?
                    .query_row([], |r| r.get::<_, bool>(0))?)
            })
            .map_err(port)?;
        if latched {
            shared.remember_locked_down();
        }
        Ok(latched)
    }
}

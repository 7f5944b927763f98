//! The kernel's [`LedgerStore`] on PostgreSQL: the `ledger`, `auto_approval_rules` and
//! `lockdown` tables.
//!
//! Several daemons on one database: who decides an open action is recorded by
//! `record_attempt` only if the action is still open and `deciding_session` names no
//! other live session, in the one `UPDATE` that checks it (PostgreSQL re-checks the
//! condition on the newest row version when two such updates race, so exactly one
//! wins), and the row then names this daemon's session. The same statement refuses
//! (an error) while the lockdown latch is set, so a latch remembered late (see
//! `cache.rs`) never lets a decision through.
//! The outcome (`put` of any state but pending) is written only by that session, or
//! after it died, and clears it. A change to a still-pending action (a flag) is written
//! only while the action is open, and keeps who decides it if another session is
//! deciding it.
//!
//! # What is committed when
//!
//! - An insert is committed before it returns, in one round trip: the statement that
//!   takes the insert lock, numbers the entry and writes it, pipelined with `COMMIT`
//!   (the entry is built before its id is known; the port allows it). A submission
//!   runs in the transaction its driver's stage left parked (same task or thread), so
//!   one commit holds both the driver's pending row and the ledger's entry; if the
//!   action's stage is parked elsewhere, it is committed first.
//! - Who decided (`record_attempt`) is written in a transaction left open and parked
//!   under the action (see `db.rs`); the driver's claim, the next write about that
//!   action, commits it, before anything is sent. The statement also reads the action
//!   store's row, for the driver's read that comes before its claim. A driver that
//!   claims through the key-value port gets it committed before its first write there;
//!   otherwise the outcome's `put`, or the flusher within `PARK_WINDOW`, commits it.
//! - The outcome (`put` after an apply) joins the driver's outcome if that is parked,
//!   and commits both.
//! - Every other write is committed before the call returns (PostgreSQL's
//!   `synchronous_commit` decides when it is durable; the default waits for the flush).

use std::sync::Arc;

use kernel::{
    ActionDescription, ActionEntry, ActionKind, ActionState, AutoApprovalRule, DriverActionId,
    EntryBody, Failure, FailureKind, LedgerEntry, LedgerId, LedgerStore, ObservationDescription,
    Resolution, RevertRecord, RuleScope, StorageError, Timestamp,
};
use postgres::Row;

use crate::actions::DeferredSettle;
use crate::cache::LOCKED_DOWN;
use crate::db::{Database, Key, Link, Stager};
use crate::error::StoreError;
use crate::schema::LEDGER_LOCKS;

/// The kernel's ledger, rules and lockdown latch in a [`Database`].
#[derive(Debug, Clone)]
pub struct PostgresLedger {
    db: Database,
}

impl PostgresLedger {
    pub(crate) fn new(db: Database) -> Self {
        Self { db }
    }
}

pub(crate) fn sql(error: postgres::Error) -> StoreError {
    StoreError::Sql {
        detail: error
            .as_db_error()
            .map_or_else(|| error.to_string(), |db| db.message().to_owned()),
    }
}

pub(crate) fn port(error: StoreError) -> StorageError {
    StorageError(error.to_string())
}

pub(crate) fn i64_of(value: u64) -> i64 {
    // Ids and timestamps stay far below 2^63; saturate rather than wrap if one did not.
    i64::try_from(value).unwrap_or(i64::MAX)
}

pub(crate) fn u64_of(value: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::decode(what, format!("negative value {value}")))
}

macro_rules! select_entries {
    ($tail:literal) => {
        concat!(
            "SELECT id, kind, gatekeeper, caller, created_at, description_json, driver_id, ",
            "state, resolved_by, auto_approved, resolved_at, resolution_cause, failure, ",
            "failure_retryable, depends_on_json, blocked_by, restart_requested, revert_by, ",
            "revert_at, revert_refused, failure_kind FROM ledger ",
            $tail
        )
    };
}

const SELECT_BY_ID: &str = select_entries!("WHERE id = $1");
/// The open actions of a gatekeeper (`$1`), whole, in ascending id.
const OPEN_ROWS: &str = select_entries!(
    "WHERE gatekeeper = $1 AND (state = 'pending' OR (state = 'failed' AND failure_retryable)) ORDER BY id"
);
const SELECT_ALL: &str = select_entries!("ORDER BY id");

fn parse_state(name: &str) -> Result<ActionState, StoreError> {
    Ok(match name {
        "pending" => ActionState::Pending,
        "approved" => ActionState::Approved,
        "rejected" => ActionState::Rejected,
        "failed" => ActionState::Failed,
        "reverted" => ActionState::Reverted,
        "expired" => ActionState::Expired,
        other => {
            return Err(StoreError::decode(
                "ledger state",
                format!("unknown state {other:?}"),
            ));
        }
    })
}

/// The title that stands for a description that cannot be read back.
fn unreadable_title(id: LedgerId) -> String {
    format!(
        "unreadable: the description of ledger entry {} cannot be read back",
        id.0
    )
}

/// Read one ledger row back into an entry.
pub(crate) fn entry_of(row: &Row) -> Result<LedgerEntry, StoreError> {
    let id = LedgerId(u64_of(row.get(0), "ledger id")?);
    let kind: &str = row.get(1);
    let gatekeeper: Arc<str> = Arc::from(row.get::<_, &str>(2));
    let caller: Arc<str> = Arc::from(row.get::<_, &str>(3));
    let created_at = Timestamp(u64_of(row.get(4), "ledger time")?);
    let what = || format!("ledger entry {id}");
    let description: &str = row.get(5);
    let body = match kind {
        "observation" => EntryBody::Observation(
            serde_json::from_str::<ObservationDescription>(description).unwrap_or_else(|error| {
                ObservationDescription::new(unreadable_title(id), error.to_string())
            }),
        ),
        "action" => {
            // A description that cannot be read back must not hide the rest of the
            // ledger: the entry stands, titled as unreadable, so a person can reject it.
            let description: ActionDescription =
                serde_json::from_str(description).unwrap_or_else(|error| {
                    ActionDescription::new(
                        unreadable_title(id),
                        format!("{error}. Reject it unless you know what it does."),
                    )
                });
            let driver_id = DriverActionId(u64_of(row.get(6), "driver id")?);
            let state = parse_state(row.get(7))?;
            let resolution = match row.get::<_, Option<String>>(8) {
                Some(by) => Some(Resolution {
                    by,
                    auto: row.get(9),
                    at: Timestamp(u64_of(row.get(10), "resolution time")?),
                    cause: row.get(11),
                }),
                None => None,
            };
            let failure = match row.get::<_, Option<String>>(12) {
                Some(message) => {
                    let kind: Option<&str> = row.get(20);
                    Some(Failure {
                        message,
                        retryable: row.get(13),
                        // NULL is read as outcome unknown, the safe reading.
                        kind: kind
                            .and_then(FailureKind::parse)
                            .unwrap_or(FailureKind::OutcomeUnknown),
                    })
                }
                None => None,
            };
            let depends_on: Vec<u64> = serde_json::from_str(row.get::<_, &str>(14))
                .map_err(|e| StoreError::decode(what(), e))?;
            let blocked_by = match row.get::<_, Option<i64>>(15) {
                Some(id) => Some(LedgerId(u64_of(id, "blocked_by")?)),
                None => None,
            };
            let revert = match row.get::<_, Option<String>>(17) {
                Some(by) => Some(RevertRecord {
                    by,
                    at: Timestamp(u64_of(row.get(18), "revert time")?),
                    refused: row.get(19),
                }),
                None => None,
            };
            EntryBody::Action(ActionEntry {
                driver_id,
                description: Arc::new(description),
                state,
                resolution,
                failure,
                depends_on: depends_on.into_iter().map(LedgerId).collect(),
                blocked_by,
                restart_requested: row.get(16),
                revert,
            })
        }
        other => {
            return Err(StoreError::decode(
                what(),
                format!("unknown kind {other:?}"),
            ));
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

/// The columns of an action that move after its submission, owned so a worker thread can
/// bind them.
struct Moving {
    state: &'static str,
    resolved_by: Option<String>,
    auto_approved: Option<bool>,
    resolved_at: Option<i64>,
    resolution_cause: Option<String>,
    failure: Option<String>,
    failure_retryable: Option<bool>,
    failure_kind: Option<&'static str>,
    blocked_by: Option<i64>,
    restart_requested: bool,
    revert_by: Option<String>,
    revert_at: Option<i64>,
    revert_refused: Option<String>,
}

impl Moving {
    fn of(action: &ActionEntry) -> Self {
        let resolution = action.resolution.as_ref();
        let failure = action.failure.as_ref();
        let revert = action.revert.as_ref();
        Self {
            state: action.state.as_str(),
            resolved_by: resolution.map(|r| r.by.clone()),
            auto_approved: resolution.map(|r| r.auto),
            resolved_at: resolution.map(|r| i64_of(r.at.0)),
            resolution_cause: resolution.and_then(|r| r.cause.clone()),
            failure: failure.map(|f| f.message.clone()),
            failure_retryable: failure.map(|f| f.retryable),
            failure_kind: failure.map(|f| f.kind.as_str()),
            blocked_by: action.blocked_by.map(|b| i64_of(b.0)),
            restart_requested: action.restart_requested,
            revert_by: revert.map(|r| r.by.clone()),
            revert_at: revert.map(|r| i64_of(r.at.0)),
            revert_refused: revert.and_then(|r| r.refused.clone()),
        }
    }

    /// The parameters, in the order of the statements below.
    fn params(&self) -> [&(dyn postgres::types::ToSql + Sync); 13] {
        [
            &self.state,
            &self.resolved_by,
            &self.auto_approved,
            &self.resolved_at,
            &self.resolution_cause,
            &self.failure,
            &self.failure_retryable,
            &self.failure_kind,
            &self.blocked_by,
            &self.restart_requested,
            &self.revert_by,
            &self.revert_at,
            &self.revert_refused,
        ]
    }
}

/// The id of a new entry, numbered where it is written: the insert lock (`$1` is
/// [`LEDGER_LOCKS`], key 0), held to the commit, then the next id. Inserts of every
/// daemon wait for that lock, so ids become visible in ascending order: a reader never
/// sees id n + 1 before n (the drain applies in id order).
macro_rules! numbered {
    () => {
        "(SELECT nextval('ledger_ids') FROM (SELECT pg_advisory_xact_lock($1, 0)) AS locked)"
    };
}

const INSERT_ACTION: &str = concat!(
    "INSERT INTO ledger (id, kind, gatekeeper, caller, created_at,
        description_json, driver_id, depends_on_json, state, resolved_by, auto_approved,
        resolved_at, resolution_cause, failure, failure_retryable, failure_kind, blocked_by,
        restart_requested, revert_by, revert_at, revert_refused)
     VALUES (",
    numbered!(),
    ", 'action', $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
        $17, $18, $19, $20) RETURNING id"
);

const INSERT_OBSERVATION: &str = concat!(
    "INSERT INTO ledger (id, kind, gatekeeper, caller, created_at, description_json) VALUES (",
    numbered!(),
    ", 'observation', $2, $3, $4, $5) RETURNING id"
);

/// An action still open (pending, or failed and retryable), as a condition on a row
/// already found by its id. Written as a `CASE`, which no index's predicate matches: as
/// `kind = 'action' AND (state = 'pending' OR ...)` it matched `ledger_by_driver`'s and
/// `ledger_open`'s, and a plan a connection made before the server had statistics (a new
/// database, for a minute or more) read a whole index for each call instead of the one
/// entry by its id (see [`UPDATE_OUTCOME`]). An observation has no state: not open.
macro_rules! still_open {
    () => {
        "CASE state WHEN 'pending' THEN true WHEN 'failed' THEN failure_retryable ELSE false END"
    };
}

/// A still-pending action's moving columns (`$1` id, `$2..$14` moving, `$15` this
/// session): written only while the action is open, and keeping who decides it if
/// another session is deciding it.
const UPDATE_PENDING: &str = concat!(
    "UPDATE ledger SET state = $2,
        resolved_by = CASE WHEN deciding_session IS NULL OR deciding_session = $15 THEN $3 ELSE resolved_by END,
        auto_approved = CASE WHEN deciding_session IS NULL OR deciding_session = $15 THEN $4 ELSE auto_approved END,
        resolved_at = CASE WHEN deciding_session IS NULL OR deciding_session = $15 THEN $5 ELSE resolved_at END,
        resolution_cause = CASE WHEN deciding_session IS NULL OR deciding_session = $15 THEN $6 ELSE resolution_cause END,
        failure = $7, failure_retryable = $8, failure_kind = $9, blocked_by = $10,
        restart_requested = $11, revert_by = $12, revert_at = $13, revert_refused = $14
     WHERE id = $1 AND ",
    still_open!(),
    " RETURNING id"
);

/// The outcome of a decision: written only if this session (`$15`) is deciding the
/// action, or nobody is, or the session that was died; it ends the decision.
///
/// `state IS NOT NULL` says "an action" (the table's rules make it the same as
/// `kind = 'action'`). Written as `kind = 'action'`, it matched the predicate of
/// `ledger_by_driver`, and a plan a connection made before the server had statistics
/// (a new database, for a minute or more) read that whole index for each outcome instead
/// of the one entry by its id.
const UPDATE_OUTCOME: &str = "UPDATE ledger SET state = $2, resolved_by = $3,
        auto_approved = $4, resolved_at = $5, resolution_cause = $6, failure = $7,
        failure_retryable = $8, failure_kind = $9, blocked_by = $10, restart_requested = $11,
        revert_by = $12, revert_at = $13, revert_refused = $14, deciding_session = NULL
     WHERE id = $1 AND state IS NOT NULL
       AND CASE WHEN deciding_session IS NULL OR deciding_session = $15 THEN true
           ELSE NOT gate_session_alive(deciding_session) END
     RETURNING id";

/// [`UPDATE_OUTCOME`] with the driver's outcome (`actions.rs`'s `SETTLE_CLAIM`, its
/// parameters from `$16`), in one statement: the ledger's is written only if the
/// driver's is. The entry is found as in [`UPDATE_OUTCOME`].
const OUTCOME_AND_SETTLE: &str = "WITH settle AS (
       UPDATE actions SET state = $19, claimed_at = $20,
           claimed_by = CASE WHEN $19 = 'applying' THEN $21 ELSE claimed_by END,
           retryable = $22, error = $23, result_json = $24
       WHERE gatekeeper = $16 AND id = $17 AND state = $18
         AND CASE WHEN claimed_by = $21 THEN true ELSE NOT gate_session_alive(claimed_by) END
       RETURNING id)
     UPDATE ledger SET state = $2, resolved_by = $3,
        auto_approved = $4, resolved_at = $5, resolution_cause = $6, failure = $7,
        failure_retryable = $8, failure_kind = $9, blocked_by = $10, restart_requested = $11,
        revert_by = $12, revert_at = $13, revert_refused = $14, deciding_session = NULL
     WHERE id = $1 AND state IS NOT NULL
       AND CASE WHEN deciding_session IS NULL OR deciding_session = $15 THEN true
           ELSE NOT gate_session_alive(deciding_session) END
       AND EXISTS (SELECT 1 FROM settle)
     RETURNING id";

const UPDATE_OBSERVATION: &str = "UPDATE ledger SET description_json = $2
     WHERE id = $1 AND kind = 'observation' RETURNING id";

/// Who decides `$1` (`$2` by, `$3` automatic, `$4` at, `$5` cause, `$6` this session):
/// written if the action is open, nobody alive but this session decides it, and the
/// lockdown latch is not set. Returns one row: the latch, the entry's kind, and if
/// written the action's gatekeeper and driver id, then the action store's row of it (the
/// columns `actions.rs` reads, from the fifth on; NULL if none).
const RECORD_ATTEMPT: &str = concat!(
    "WITH latch AS (SELECT EXISTS (SELECT 1 FROM lockdown) AS set),
     attempt AS (
       UPDATE ledger SET resolved_by = $2, auto_approved = $3, resolved_at = $4,
           resolution_cause = $5, deciding_session = $6
       WHERE id = $1 AND ",
    still_open!(),
    "
         AND CASE WHEN deciding_session IS NULL OR deciding_session = $6 THEN true
             ELSE NOT gate_session_alive(deciding_session) END
         AND NOT (SELECT set FROM latch)
       RETURNING gatekeeper, driver_id)
     SELECT (SELECT set FROM latch), (SELECT kind FROM ledger WHERE id = $1),
         attempt.gatekeeper, attempt.driver_id, a.id, a.tool, a.args_json, a.state,
         a.submitted_at, a.claimed_at, a.retryable, a.error, a.result_json, a.definition
     FROM (SELECT 1) AS one
     LEFT JOIN attempt ON true
     LEFT JOIN actions AS a ON a.gatekeeper = attempt.gatekeeper AND a.id = attempt.driver_id"
);

/// Where the action store's columns begin in a row of [`RECORD_ATTEMPT`].
pub(crate) const ATTEMPT_ACTION_COLUMNS: usize = 4;

/// A new entry's row, built on the caller's thread and written by a worker.
struct Row0 {
    gatekeeper: String,
    caller: String,
    created_at: i64,
    /// The observation's or the action's description.
    json: String,
    /// An action's own columns; `None` for an observation.
    action: Option<ActionColumns>,
}

/// The columns only an action's row has.
struct ActionColumns {
    driver_id: i64,
    depends_on: String,
    moving: Moving,
}

impl Row0 {
    fn of(entry: &LedgerEntry) -> Result<Self, StoreError> {
        let new = "a new ledger entry";
        let (json, action) = match &entry.body {
            EntryBody::Observation(observation) => (encode(observation, new)?, None),
            EntryBody::Action(action) => {
                let ids: Vec<u64> = action.depends_on.iter().map(|id| id.0).collect();
                let columns = ActionColumns {
                    driver_id: i64_of(action.driver_id.0),
                    depends_on: serde_json::to_string(&ids).unwrap_or_else(|_| "[]".to_owned()),
                    moving: Moving::of(action),
                };
                (encode(&*action.description, new)?, Some(columns))
            }
        };
        Ok(Self {
            gatekeeper: entry.gatekeeper.to_string(),
            caller: entry.caller.to_string(),
            created_at: i64_of(entry.created_at.0),
            json,
            action,
        })
    }

    /// The gatekeeper and driver id of an action's row.
    fn action_key(&self) -> Option<(&str, i64)> {
        let action = self.action.as_ref()?;
        Some((&self.gatekeeper, action.driver_id))
    }

    /// Number the row and write it with `COMMIT`, in one round trip, ending the open
    /// transaction (outside one, the statement commits as it runs); returns its id.
    fn write(&self, link: &mut Link<'_>) -> Result<i64, StoreError> {
        let mut params: Vec<&(dyn postgres::types::ToSql + Sync)> = vec![
            &LEDGER_LOCKS,
            &self.gatekeeper,
            &self.caller,
            &self.created_at,
            &self.json,
        ];
        let sql = match &self.action {
            None => INSERT_OBSERVATION,
            Some(action) => {
                params.extend([
                    &action.driver_id as &(dyn postgres::types::ToSql + Sync),
                    &action.depends_on,
                ]);
                params.extend(action.moving.params());
                INSERT_ACTION
            }
        };
        link.commit_with(sql, &params)?
            .first()
            .map(|row| row.get(0))
            .ok_or_else(|| StoreError::Missing("no ledger id was handed out".into()))
    }
}

const KIND_OF: &str = "SELECT kind, deciding_session, gate_session_alive(deciding_session)
     FROM ledger WHERE id = $1";

const FIND_ACTION: &str =
    "SELECT id FROM ledger WHERE kind = 'action' AND gatekeeper = $1 AND driver_id = $2";

const PUT_RULE: &str = "INSERT INTO auto_approval_rules
         (gatekeeper, tag, label, enabled_by, enabled_at, scope_json)
     VALUES ($1, $2, $3, $4, $5, $6)
     ON CONFLICT (gatekeeper, tag) DO UPDATE SET label = excluded.label,
         enabled_by = excluded.enabled_by, enabled_at = excluded.enabled_at,
         scope_json = excluded.scope_json";

const REMOVE_RULE: &str = "DELETE FROM auto_approval_rules WHERE gatekeeper = $1 AND tag = $2";

const RULES: &str = "SELECT gatekeeper, tag, label, enabled_by, enabled_at, scope_json
     FROM auto_approval_rules ORDER BY gatekeeper COLLATE \"C\", tag COLLATE \"C\"";

const LATCH: &str = "INSERT INTO lockdown (id, latched_at)
     VALUES (1, extract(epoch FROM now())::bigint) ON CONFLICT (id) DO NOTHING";

/// A row of [`RULES`] as a rule. A scope that cannot be read back is an
/// error, never the whole kind: a rule must not reach further than it was made to.
fn rule_of(row: &Row) -> Result<AutoApprovalRule, StoreError> {
    let gatekeeper: String = row.get(0);
    let tag: String = row.get(1);
    let scope: RuleScope = serde_json::from_str(row.get::<_, &str>(5)).map_err(|e| {
        StoreError::decode(
            format!("the scope of the rule for {tag} on {gatekeeper}"),
            e,
        )
    })?;
    Ok(AutoApprovalRule {
        gatekeeper,
        kind: ActionKind::new(tag, row.get::<_, String>(2)),
        enabled_by: row.get(3),
        enabled_at: Timestamp(u64_of(row.get(4), "rule time")?),
        scope,
    })
}

/// The JSON of the description of `entry` (its id, or what it is when it has none yet).
fn encode<T: serde::Serialize>(
    value: &T,
    entry: impl std::fmt::Display,
) -> Result<String, StoreError> {
    serde_json::to_string(value)
        .map_err(|e| StoreError::decode(format!("the description of {entry}"), e))
}

/// Write `entry` over its row; `settle` is the driver's outcome kept for it, written in
/// the same statement as the ledger's outcome (or first, alone, for a pending entry).
fn put_in(
    link: &mut Link<'_>,
    entry: &LedgerEntry,
    me: i32,
    settle: Option<DeferredSettle>,
) -> Result<(), StoreError> {
    let id = i64_of(entry.id.0);
    let changed = match &entry.body {
        EntryBody::Observation(observation) => {
            let json = encode(observation, format_args!("ledger entry {}", entry.id))?;
            link.commit_with(UPDATE_OBSERVATION, &[&id, &json])?.len()
        }
        EntryBody::Action(action) => {
            let moving = Moving::of(action);
            let mut params: Vec<&(dyn postgres::types::ToSql + Sync)> = vec![&id];
            params.extend(moving.params());
            params.push(&me);
            let pending = action.state == ActionState::Pending;
            let mut statement = if pending {
                UPDATE_PENDING
            } else {
                UPDATE_OUTCOME
            };
            match &settle {
                Some(settle) if pending => settle.write(link)?,
                Some(settle) => {
                    statement = OUTCOME_AND_SETTLE;
                    params.extend(settle.params());
                }
                None => {}
            }
            // Inside the action's parked transaction, if it has one: this commits it.
            let changed = link.commit_with(statement, &params)?.len();
            if changed == 0 {
                match link.query_opt(KIND_OF, &[&id]).map_err(sql)? {
                    Some(row) if row.get::<_, &str>(0) == "action" => {
                        if pending {
                            return Err(StoreError::NotOpen { id: entry.id.0 });
                        }
                        return Err(StoreError::DecidedElsewhere { id: entry.id.0 });
                    }
                    _ => 0,
                }
            } else {
                changed
            }
        }
    };
    if changed == 0 {
        return Err(StoreError::Missing(format!(
            "there is no ledger entry {} of this kind to replace",
            entry.id
        )));
    }
    Ok(())
}

impl PostgresLedger {
    /// One gatekeeper's open actions, in ascending id, in one statement; each is kept
    /// for the next read of it ([`crate::cache`]'s prefetch: once, briefly).
    fn read_open(&self, gatekeeper: &str) -> Result<Vec<LedgerEntry>, StorageError> {
        let gatekeeper = gatekeeper.to_owned();
        // What is parked for this gatekeeper with a ledger write is committed first, so
        // this daemon reads its own writes. A parked stage holds no entry yet: it waits
        // for its own (committing it now would cost its entry a commit of its own).
        let parked_for: Arc<str> = Arc::from(gatekeeper.as_str());
        self.db
            .commit_parked(move |key, parked| key.0 == parked_for && parked.wrote_ledger())
            .map_err(port)?;
        let generation = self.db.shared().caches.entries_generation(&gatekeeper);
        let entries = self
            .db
            .call(move |link| {
                link.query(OPEN_ROWS, &[&gatekeeper])
                    .map_err(sql)?
                    .iter()
                    .map(entry_of)
                    .collect::<Result<Vec<_>, _>>()
            })
            .map_err(port)?;
        self.db
            .shared()
            .caches
            .prefetch(entries.clone(), generation);
        Ok(entries)
    }

    /// Every rule, remembered until they change (see `cache.rs`).
    fn all_rules(&self) -> Result<Arc<Vec<AutoApprovalRule>>, StoreError> {
        let caches = &self.db.shared().caches;
        if let Some(rules) = caches.rules() {
            return Ok(rules);
        }
        let generation = caches.rules_generation();
        let rules = Arc::new(self.db.call(|link| {
            link.query(RULES, &[])
                .map_err(sql)?
                .iter()
                .map(rule_of)
                .collect::<Result<Vec<_>, _>>()
        })?);
        caches.keep_rules(generation, rules.clone());
        Ok(rules)
    }
}

impl LedgerStore for PostgresLedger {
    fn insert(
        &self,
        make: &mut dyn FnMut(LedgerId) -> LedgerEntry,
    ) -> Result<LedgerId, StorageError> {
        // The entry is built first, on the caller's thread, under a placeholder id (the
        // port allows it: an entry depends on its id only through `LedgerEntry::id`);
        // the statement that writes it numbers it ([`numbered!`]) and is pipelined with
        // the COMMIT: one round trip.
        //
        // A stage this task parked (its driver's row, see `actions.rs`) is written in the
        // same transaction: the submission that follows a stage commits both.
        let row = Row0::of(&make(LedgerId(0)));
        let (key, parked) = match self.db.shared().take_park_of_stager(Stager::current()) {
            Some((key, parked)) => (Some(key), Some(parked)),
            None => (None, None),
        };
        if let Some((gatekeeper, driver_id)) = row.as_ref().ok().and_then(Row0::action_key) {
            // From now on `find_action` asks the server about it.
            self.db.shared().caches.submitted(gatekeeper, driver_id);
        }
        let db = self.db.clone();
        let written = self.db.call_parked(parked, key, move |link| {
            // An entry that cannot be written rolls back the stage parked with it: no
            // driver's row is kept without its ledger entry.
            let row = row?;
            // An action whose stage is parked elsewhere (not in this transaction) has it
            // committed first: an acknowledged submission has both records.
            if let Some((gatekeeper, driver_id)) = row.action_key() {
                db.shared()
                    .commit_park_now(&(Arc::from(gatekeeper), driver_id))?;
            }
            row.write(link)
        });
        let id = written.map_err(port)?;
        Ok(LedgerId(u64_of(id, "ledger id").map_err(port)?))
    }

    fn get(&self, id: LedgerId) -> Result<Option<LedgerEntry>, StorageError> {
        let id = i64_of(id.0);
        if let Some(entry) = self.db.shared().caches.take_prefetched(id) {
            return Ok(Some(entry));
        }
        // An entry this daemon wrote in a parked transaction is read inside it.
        let (key, parked) = match self.db.shared().take_park_of_entry(id) {
            Some((key, parked)) => (Some(key), Some(parked)),
            None => (None, None),
        };
        self.db
            .call_parked(parked, key, move |link| {
                link.query_opt(SELECT_BY_ID, &[&id])
                    .map_err(sql)?
                    .as_ref()
                    .map(entry_of)
                    .transpose()
            })
            .map_err(port)
    }

    fn put(&self, entry: LedgerEntry) -> Result<(), StorageError> {
        let me = self.db.session();
        self.db.shared().caches.forget_entry(i64_of(entry.id.0));
        let (parked, settle, key) = match &entry.body {
            EntryBody::Action(action) => {
                let key: Key = (entry.gatekeeper.clone(), i64_of(action.driver_id.0));
                let shared = self.db.shared();
                (shared.take_park(&key), shared.take_settle(&key), Some(key))
            }
            EntryBody::Observation(_) => (None, None, None),
        };
        self.db
            .call_parked(parked, key, move |link| put_in(link, &entry, me, settle))
            .map_err(port)
    }

    fn record_attempt(&self, id: LedgerId, resolution: &Resolution) -> Result<bool, StorageError> {
        let me = self.db.session();
        let ledger_id = id.0;
        let id = i64_of(id.0);
        let by = resolution.by.clone();
        let auto = resolution.auto;
        let at = i64_of(resolution.at.0);
        let cause = resolution.cause.clone();
        let caches_db = self.db.clone();
        caches_db.shared().caches.forget_entry(id);
        self.db
            .call(move |link| {
                // BEGIN and the statement, one round trip; committed by the driver's
                // claim (see the module docs).
                let rows = link.begin_with(RECORD_ATTEMPT, &[&id, &by, &auto, &at, &cause, &me])?;
                let row = rows
                    .first()
                    .ok_or_else(|| StoreError::Missing("no answer to the attempt".into()))?;
                if row.get::<_, Option<bool>>(0) == Some(true) {
                    caches_db.shared().caches.latch();
                    return Err(StoreError::Sql {
                        detail: format!(
                            "lockdown is latched: nothing is decided or sent (ledger action {ledger_id})"
                        ),
                    });
                }
                let gatekeeper: Option<String> = row.get(2);
                let driver_id: Option<i64> = row.get(3);
                if let (Some(gatekeeper), Some(driver_id)) = (gatekeeper, driver_id) {
                    let action_row = row
                        .get::<_, Option<i64>>(ATTEMPT_ACTION_COLUMNS)
                        .is_some()
                        .then(|| row.clone());
                    link.park_as((Arc::from(gatekeeper), driver_id), action_row, Some(id));
                    return Ok(true);
                }
                match row.get::<_, Option<&str>>(1) {
                    Some("action") => Ok(false),
                    _ => Err(StoreError::Missing(format!(
                        "there is no ledger action {ledger_id} to record a decision on"
                    ))),
                }
            })
            .map_err(port)
    }

    fn entries(&self) -> Result<Vec<LedgerEntry>, StorageError> {
        // What is parked is committed first, so this daemon reads its own writes.
        self.db.commit_deferred().map_err(port)?;
        self.db
            .call(|link| {
                link.query(SELECT_ALL, &[])
                    .map_err(sql)?
                    .iter()
                    .map(entry_of)
                    .collect()
            })
            .map_err(port)
    }

    fn open_action_ids(&self, gatekeeper: &str) -> Result<Vec<LedgerId>, StorageError> {
        // The caller reads them one by one next (the drain): each from this read.
        let entries = self.read_open(gatekeeper)?;
        Ok(entries.iter().map(|entry| entry.id).collect())
    }

    fn open_actions(&self, gatekeeper: &str) -> Result<Vec<LedgerEntry>, StorageError> {
        // A person's list: the decision that follows reads its entry from this read.
        self.read_open(gatekeeper)
    }

    fn find_action(
        &self,
        gatekeeper: &str,
        driver_id: DriverActionId,
    ) -> Result<Option<LedgerId>, StorageError> {
        let driver_id = i64_of(driver_id.0);
        if self.db.shared().caches.is_fresh(gatekeeper, driver_id) {
            return Ok(None);
        }
        let gatekeeper = gatekeeper.to_owned();
        self.db
            .call(move |link| {
                match link
                    .query_opt(FIND_ACTION, &[&gatekeeper, &driver_id])
                    .map_err(sql)?
                {
                    Some(row) => Ok(Some(LedgerId(u64_of(row.get(0), "ledger id")?))),
                    None => Ok(None),
                }
            })
            .map_err(port)
    }

    fn put_rule(&self, rule: &AutoApprovalRule) -> Result<(), StorageError> {
        let rule = rule.clone();
        let scope = serde_json::to_string(&rule.scope).map_err(|e| {
            port(StoreError::decode(
                format!(
                    "the scope of the rule for {} on {}",
                    rule.kind.tag, rule.gatekeeper
                ),
                e,
            ))
        })?;
        let enabled_at = i64_of(rule.enabled_at.0);
        let written = self.db.call(move |link| {
            link.execute(
                PUT_RULE,
                &[
                    &rule.gatekeeper,
                    &rule.kind.tag,
                    &rule.kind.label,
                    &rule.enabled_by,
                    &enabled_at,
                    &scope,
                ],
            )
            .map_err(sql)?;
            Ok(())
        });
        self.db.shared().caches.forget_rules();
        written.map_err(port)
    }

    fn remove_rule(&self, gatekeeper: &str, tag: &str) -> Result<bool, StorageError> {
        let (gatekeeper, tag) = (gatekeeper.to_owned(), tag.to_owned());
        let removed = self.db.call(move |link| {
            Ok(link
                .execute(REMOVE_RULE, &[&gatekeeper, &tag])
                .map_err(sql)?
                > 0)
        });
        self.db.shared().caches.forget_rules();
        removed.map_err(port)
    }

    fn rule(
        &self,
        gatekeeper: &str,
        tag: &str,
    ) -> Result<Option<Arc<AutoApprovalRule>>, StorageError> {
        Ok(self
            .all_rules()
            .map_err(port)?
            .iter()
            .find(|rule| rule.gatekeeper == gatekeeper && rule.kind.tag == tag)
            .cloned()
            .map(Arc::new))
    }

    fn rules(&self) -> Result<Vec<AutoApprovalRule>, StorageError> {
        Ok(self.all_rules().map_err(port)?.to_vec())
    }

    fn latch_lockdown(&self) -> Result<(), StorageError> {
        self.db
            .call(|link| {
                link.execute(LATCH, &[]).map_err(sql)?;
                Ok(())
            })
            .map_err(port)?;
        self.db.shared().caches.latch();
        Ok(())
    }

    fn locked_down(&self) -> Result<bool, StorageError> {
        if let Some(latched) = self.db.shared().caches.latched() {
            return Ok(latched);
        }
        let latched = self
            .db
            .call(|link| Ok(link.query_one(LOCKED_DOWN, &[]).map_err(sql)?.get(0)))
            .map_err(port)?;
        if latched {
            self.db.shared().caches.latch();
        }
        Ok(latched)
    }

    fn drain_lease(&self, gatekeeper: &str) -> kernel::DrainLeaseFuture {
        self.db.drain_lease(gatekeeper)
    }
}

//! gatekeeper-core's [`ActionStorage`] on SQLite: the `actions` table, one namespace per
//! gatekeeper (the `gatekeeper` column, which is also the kernel's gatekeeper name).
//!
//! # What each write costs
//!
//! | write | when it is committed |
//! |---|---|
//! | the claim (`compare_and_set` to `applying`) | now, and synced before the call returns (so before the send); concurrent claims share syncs |
//! | recovery of a dead claim (`applying` → failed, interrupted) | now, together with the same action's ledger entry |
//! | `insert_pending` (stage) | deferred: rides with the kernel's ledger insert that submits it; one read (open count and next id) and one write (the row) |
//! | an outcome (`applying` → applied / failed), a rejection | deferred: rides with the kernel's ledger write about the same decision, or the next claim |
//! | `delete_pending`, `prune_final` | deferred; each records the highest id it deletes in `action_ids` first |
//! | `amend_pending` (a person's edit of a pending call's arguments) | now, and synced before the call returns; one `UPDATE` that matches only while the call is pending |
//!
//! A deferred stage lost in a crash was never acknowledged to the agent (the kernel's
//! submission commit carries it). A deferred outcome lost in a crash leaves the committed
//! claim, which recovery turns into "interrupted": reported as possibly sent, never sent
//! again.
//!
//! # Claims across processes
//!
//! A claim records the session of the process that took it (see `session.rs`). A
//! `compare_and_set` *from* `applying` succeeds only for the claim's own session, or
//! when that session's process is gone: a second process opening the same file never
//! settles a call that a live process is still sending. Such an attempt returns `false`,
//! as if another writer had moved the record first.
//!
//! `tool`, `definition`, `args` and `submitted_at` are facts of the stage and are not rewritten by
//! `compare_and_set`; it stores the record's state, claim time and outcome. Only
//! `amend_pending` rewrites `args`, and only while the call is pending (before anything
//! could have sent it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use gatekeeper_core::store::INTERRUPTED_MESSAGE;
use gatekeeper_core::{
    ActionRecord, ActionState, ActionStorage, StateTag, StorageError, ToolResult,
};
use kernel::{DriverActionId, Timestamp};
use rusqlite::{Connection, OptionalExtension, Row, params};
use serde_json::Value;

use crate::db::{Conn, Database, Durability, Error, Steps};
use crate::error::StoreError;
use crate::known::ActionCounts;

/// One gatekeeper's action store in a [`Database`].
#[derive(Debug, Clone)]
pub struct SqliteActionStorage {
    db: Database,
    gatekeeper: Arc<str>,
    staged: Arc<Mutex<Staged>>,
}

/// The tool and arguments of rows already read, by id. Both are facts of the stage that
/// change only by `amend_pending` (which replaces the arguments here too), and ids are
/// never reused, so a hit saves parsing the JSON again.
type Staged = HashMap<u64, (Arc<str>, Arc<Value>)>;

/// Past this many ids the cache starts over (a store keeps about 150 rows).
const STAGED_CACHE: usize = 1024;

impl SqliteActionStorage {
    pub(crate) fn new(db: Database, gatekeeper: &str) -> Self {
        Self {
            db,
            gatekeeper: Arc::from(gatekeeper),
            staged: Arc::default(),
        }
    }

    fn staged(&self) -> MutexGuard<'_, Staged> {
        // The cache holds only immutable facts; a poisoned lock still guards valid entries.
        self.staged.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn port(error: StoreError) -> StorageError {
    StorageError(error.to_string())
}

fn i64_of(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn u64_of(value: i64, what: &str) -> Result<u64, Error> {
    u64::try_from(value)
        .map_err(|_| StoreError::decode(what.to_owned(), format!("negative value {value}")).into())
}

fn record_of(row: &Row<'_>, staged: &mut Staged) -> Result<ActionRecord, Error> {
    let id = DriverActionId(u64_of(row.get(0)?, "action id")?);
    let what = || format!("action {id}");
    let (tool, args) = match staged.get(&id.0) {
        Some(known) => known.clone(),
        None => {
            let tool: Arc<str> = Arc::from(row.get_ref(1)?.as_str()?);
            match crate::json::read::<Value>(
                row.get_ref(2)?.as_str()?,
                &format!("the arguments of {}", what()),
            ) {
                Ok(args) => {
                    if staged.len() >= STAGED_CACHE {
                        staged.clear();
                    }
                    let known = (tool, Arc::new(args));
                    staged.insert(id.0, known.clone());
                    known
                }
                // Arguments that cannot be read back (staged before the depth limit, or
                // edited by hand) must not make the record unreadable: it could then be
                // neither approved nor rejected. `null` stands for them (stored
                // arguments are always an object), and a claim of such a record is
                // refused (see `refuse_unreadable_claim`), so it is never sent.
                Err(error) => {
                    tracing::warn!(action = %id, %error, "action.args.unreadable");
                    (tool, Arc::new(Value::Null))
                }
            }
        }
    };
    let state = match row.get::<_, String>(3)?.as_str() {
        "pending" => ActionState::Pending,
        "applying" => ActionState::Applying,
        "applied" => {
            let result: ToolResult = crate::json::read(
                &row.get::<_, String>(8)?,
                &format!("the result of {}", what()),
            )?;
            ActionState::Applied {
                result: Arc::new(result),
            }
        }
        "failed" => ActionState::Failed {
            retryable: row.get::<_, i64>(6)? == 1,
            message: row.get(7)?,
        },
        "rejected" => ActionState::Rejected,
        other => {
            return Err(StoreError::decode(what(), format!("unknown state {other:?}")).into());
        }
    };
    let claimed_at = match row.get::<_, Option<i64>>(5)? {
        Some(at) => Some(Timestamp(u64_of(at, "claim time")?)),
        None => None,
    };
    let definition = row.get::<_, Option<String>>(9)?.map(Arc::from);
    Ok(ActionRecord {
        id,
        tool,
        definition,
        args,
        submitted_at: Timestamp(u64_of(row.get(4)?, "stage time")?),
        claimed_at,
        state,
    })
}

/// Whether a record is the one recovery makes of a leftover claim.
pub(crate) fn is_interruption(record: &ActionRecord) -> bool {
    matches!(
        &record.state,
        ActionState::Failed { retryable: false, message } if message == INTERRUPTED_MESSAGE
    )
}

/// The row values of a record's state.
struct StateColumns<'a> {
    state: &'static str,
    retryable: Option<bool>,
    error: Option<&'a str>,
    result_json: Option<String>,
}

fn state_columns(record: &ActionRecord) -> Result<StateColumns<'_>, Error> {
    let plain = |state| StateColumns {
        state,
        retryable: None,
        error: None,
        result_json: None,
    };
    Ok(match &record.state {
        ActionState::Pending => plain("pending"),
        ActionState::Applying => plain("applying"),
        ActionState::Applied { result } => {
            let what = format!("the result of action {}", record.id);
            let mut json = serde_json::to_string(&**result)
                .map_err(|e| StoreError::decode(what.clone(), e))?;
            if let Err(too_deep) = crate::json::readable(&json, &what) {
                // The call was sent and succeeded: keep that, with a note in place of a
                // reply that could not be read back (as for a reply too large to keep).
                let note = ToolResult::from_text(format!("the reply was not kept: {too_deep}"));
                json = serde_json::to_string(&note).map_err(|e| StoreError::decode(what, e))?;
            }
            StateColumns {
                result_json: Some(json),
                ..plain("applied")
            }
        }
        ActionState::Failed { retryable, message } => StateColumns {
            retryable: Some(*retryable),
            error: Some(message.as_str()),
            ..plain("failed")
        },
        ActionState::Rejected => plain("rejected"),
    })
}

/// Write `record` over the row if it is still in `from`; with `claimant` set, only if the
/// claim is held by that session (or by none). Returns whether it was written.
fn write_state(
    db: &Connection,
    gatekeeper: &str,
    from: StateTag,
    record: &ActionRecord,
    session: Option<&str>,
    only_claimant: Option<Option<&str>>,
) -> Result<bool, Error> {
    let StateColumns {
        state,
        retryable,
        error,
        result_json: result,
    } = state_columns(record)?;
    let claimed_by = if state == "applying" { session } else { None };
    let keep_claimant = state != "applying";
    let sql = "UPDATE actions SET state = ?4, claimed_at = ?5,
            claimed_by = CASE WHEN ?10 THEN claimed_by ELSE ?6 END,
            retryable = ?7, error = ?8, result_json = ?9
         WHERE gatekeeper = ?1 AND id = ?2 AND state = ?3
           AND (NOT ?12 OR claimed_by IS ?11)";
    let changed = db.prepare_cached(sql)?.execute(params![
        gatekeeper,
        i64_of(record.id.0),
        from.as_str(),
        state,
        record.claimed_at.map(|t| i64_of(t.0)),
        claimed_by,
        retryable,
        error,
        result,
        keep_claimant,
        only_claimant.flatten(),
        only_claimant.is_some(),
    ])?;
    Ok(changed == 1)
}

/// Bring the ledger entry of an interrupted action to the same failure, in the same
/// transaction, unless the ledger has already moved on.
fn interrupt_in_ledger(db: &Connection, gatekeeper: &str, id: DriverActionId) -> Result<(), Error> {
    db.prepare_cached(
        "UPDATE ledger SET state = 'failed', failure = ?3, failure_retryable = 0,
            failure_kind = 'outcome_unknown'
         WHERE kind = 'action' AND gatekeeper = ?1 AND driver_id = ?2
           AND (state = 'pending' OR (state = 'failed' AND failure_retryable = 1))",
    )?
    .execute(params![gatekeeper, i64_of(id.0), INTERRUPTED_MESSAGE])?;
    Ok(())
}

/// Settle a claim whose session is gone: failed, not retryable, interrupted; and the
/// ledger with it. Used by `Database::open` for every gatekeeper.
pub(crate) fn interrupt_dead_claims(db: &Database) -> Result<usize, StoreError> {
    let shared = db.shared();
    let claims: Vec<(String, i64, Option<String>)> = shared.read(|db| {
        let mut statement = db.prepare(
            "SELECT gatekeeper, id, claimed_by FROM actions WHERE state = 'applying' ORDER BY gatekeeper, id",
        )?;
        let rows = statement.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    })?;
    let dead: Vec<(String, i64, Option<String>)> = claims
        .into_iter()
        .filter(|(_, _, by)| !shared.claimant_alive(by.as_deref()))
        .collect();
    if dead.is_empty() {
        return Ok(0);
    }
    shared.write(Durability::Now, Steps::Many, |conn| {
        // Rows of every store and the ledger change here, behind the adapters' backs.
        conn.known.forget();
        let mut settled = 0;
        for (gatekeeper, id, by) in &dead {
            let changed = conn
                .db
                .prepare_cached(
                    "UPDATE actions SET state = 'failed', retryable = 0, error = ?4
                     WHERE gatekeeper = ?1 AND id = ?2 AND state = 'applying' AND claimed_by IS ?3",
                )?
                .execute(params![gatekeeper, id, by, INTERRUPTED_MESSAGE])?;
            if changed == 1 {
                let id = DriverActionId(u64_of(*id, "action id")?);
                interrupt_in_ledger(&conn.db, gatekeeper, id)?;
                tracing::warn!(%gatekeeper, action = %id, "action.apply.interrupted");
                settled += 1;
            }
        }
        Ok(settled)
    })
}

/// Refuse to claim a record whose stored arguments cannot be read back (`record_of`
/// stands `null` for them): what would be sent is not what the agent staged. The
/// refusal says why; the record stays as it is and can be rejected.
fn refuse_unreadable_claim(
    conn: &Conn,
    gatekeeper: &str,
    record: &ActionRecord,
) -> Result<(), Error> {
    if record.state != ActionState::Applying || !record.args.is_null() {
        return Ok(());
    }
    let stored: String = conn
        .db
        .prepare_cached("SELECT args_json FROM actions WHERE gatekeeper = ?1 AND id = ?2")?
        .query_row(params![gatekeeper, i64_of(record.id.0)], |r| r.get(0))?;
    let what = format!("the arguments of action {}", record.id);
    let reason = match crate::json::read::<Value>(&stored, &what) {
        Err(error) => error.to_string(),
        Ok(_) => format!("{what} were not readable when the record was read"),
    };
    Err(StoreError::Unsendable {
        id: record.id.0,
        reason,
    }
    .into())
}

fn compare_and_set_in(
    conn: &mut Conn,
    shared: &crate::db::Shared,
    gatekeeper: &Arc<str>,
    from: StateTag,
    record: &ActionRecord,
) -> Result<bool, Error> {
    let session = shared.session_id();
    let written = if from == StateTag::Applying {
        // Our own claim (or, in memory, any claim) settles directly.
        if write_state(&conn.db, gatekeeper, from, record, session, Some(session))? {
            true
        } else {
            let claimant: Option<Option<String>> = conn
                .db
                .prepare_cached(
                    "SELECT claimed_by FROM actions WHERE gatekeeper = ?1 AND id = ?2 AND state = 'applying'",
                )?
                .query_row(params![gatekeeper, i64_of(record.id.0)], |r| r.get(0))
                .optional()?;
            match claimant {
                Some(by) if !shared.claimant_alive(by.as_deref()) => write_state(
                    &conn.db,
                    gatekeeper,
                    from,
                    record,
                    session,
                    Some(by.as_deref()),
                )?,
                _ => false,
            }
        }
    } else if record.state == ActionState::Rejected && session.is_some() {
        // A rejection is a decision: refused while another live process is deciding the
        // same action in the ledger, and otherwise marked as this process's decision in
        // the same transaction, so no other process can record itself as the decider
        // before this process's kernel records the rejection.
        let deciding: Option<Option<String>> = conn
            .db
            .prepare_cached(
                "SELECT deciding_session FROM ledger
                 WHERE kind = 'action' AND gatekeeper = ?1 AND driver_id = ?2",
            )?
            .query_row(params![&**gatekeeper, i64_of(record.id.0)], |r| r.get(0))
            .optional()?;
        if let Some(Some(other)) = &deciding
            && Some(other.as_str()) != session
            && shared.claimant_alive(Some(other))
        {
            return Ok(false);
        }
        let written = write_state(&conn.db, gatekeeper, from, record, session, None)?;
        if written && deciding.is_some() {
            conn.db
                .prepare_cached(
                    "UPDATE ledger SET deciding_session = ?3
                     WHERE kind = 'action' AND gatekeeper = ?1 AND driver_id = ?2",
                )?
                .execute(params![&**gatekeeper, i64_of(record.id.0), session])?;
        }
        written
    } else {
        write_state(&conn.db, gatekeeper, from, record, session, None)?
    };
    if written && from == StateTag::Applying && is_interruption(record) {
        interrupt_in_ledger(&conn.db, gatekeeper, record.id)?;
        // The ledger row changed behind the ledger adapter's back.
        conn.known.ledger = Default::default();
    }
    if written {
        conn.known.actions_of(gatekeeper).moved(from, record);
    }
    Ok(written)
}

/// The condition of a settled row (the `actions_final` index's).
macro_rules! settled {
    () => {
        "(state IN ('applied', 'rejected') OR (state = 'failed' AND retryable = 0))"
    };
}

/// `SELECT <what> FROM` the settled rows of gatekeeper `?1`, `<then>`. The condition is
/// the one of the `actions_final` partial index, so these queries walk only that index.
macro_rules! settled_rows {
    ($what:literal, $then:literal) => {
        concat!(
            "SELECT ",
            $what,
            " FROM actions WHERE gatekeeper = ?1 AND ",
            settled!(),
            " ",
            $then
        )
    };
}

/// How many settled rows one gatekeeper has.
const COUNT_FINAL: &str = settled_rows!("count(*)", "");

/// Every settled row of one gatekeeper.
const ALL_FINAL: &str = settled_rows!("id", "");

/// The `?2` oldest settled rows of one gatekeeper.
const OLDEST_FINAL: &str = settled_rows!("id", "ORDER BY id LIMIT ?2");

/// The number of open calls of one gatekeeper, and the highest id it ever handed out:
/// the highest still in `actions`, or the highest deleted from it (`action_ids` records
/// an id before its row is deleted). Staging then writes only the new row.
const NEXT_ID: &str = "SELECT
       (SELECT count(*) FROM actions WHERE gatekeeper = ?1
           AND (state IN ('pending', 'applying') OR (state = 'failed' AND retryable = 1))),
       max(COALESCE((SELECT max(id) FROM actions WHERE gatekeeper = ?1), 0),
           COALESCE((SELECT last_id FROM action_ids WHERE gatekeeper = ?1), 0))";

/// Record `?2` as handed out before its row is deleted, so it is never handed out again.
const REMEMBER_ID: &str = "INSERT INTO action_ids (gatekeeper, last_id) VALUES (?1, ?2)
     ON CONFLICT (gatekeeper) DO UPDATE SET last_id = max(last_id, excluded.last_id)";

/// [`REMEMBER_ID`], only if `?2` is a pending row (the one `delete_pending` removes).
const REMEMBER_PENDING_ID: &str = "INSERT INTO action_ids (gatekeeper, last_id)
     SELECT ?1, ?2 WHERE EXISTS
         (SELECT 1 FROM actions WHERE gatekeeper = ?1 AND id = ?2 AND state = 'pending')
     ON CONFLICT (gatekeeper) DO UPDATE SET last_id = max(last_id, excluded.last_id)";

/// Delete one row of gatekeeper `?1`, if it is settled.
const DELETE_SETTLED: &str = concat!(
    "DELETE FROM actions WHERE gatekeeper = ?1 AND id = ?2 AND ",
    settled!()
);

const SELECT_ONE: &str =
    "SELECT id, tool, args_json, state, submitted_at, claimed_at, retryable, error, result_json,
            definition
     FROM actions WHERE gatekeeper = ?1 AND id = ?2";

const SELECT_IN_STATE: &str =
    "SELECT id, tool, args_json, state, submitted_at, claimed_at, retryable, error, result_json,
            definition
     FROM actions WHERE gatekeeper = ?1 AND state = ?2 ORDER BY id";

/// The counts of `gatekeeper`'s store, read once and then kept up to date in
/// [`Conn::known`]. Only for a caller that may trust it (see `known.rs`).
fn counts<'c>(conn: &'c mut Conn, gatekeeper: &Arc<str>) -> Result<&'c ActionCounts, Error> {
    if conn.known.actions_of(gatekeeper).counts.is_none() {
        let (open, last): (i64, i64) = conn
            .db
            .prepare_cached(NEXT_ID)?
            .query_row([&**gatekeeper], |r| Ok((r.get(0)?, r.get(1)?)))?;
        let settled = conn
            .db
            .prepare_cached(ALL_FINAL)?
            .query_map([&**gatekeeper], |r| r.get::<_, i64>(0))?
            .map(|id| u64_of(id?, "action id"))
            .collect::<Result<_, Error>>()?;
        conn.known.actions_of(gatekeeper).counts = Some(ActionCounts {
            open: usize::try_from(open).unwrap_or(usize::MAX),
            last_id: u64_of(last, "last action id")?,
            settled,
        });
    }
    Ok(conn
        .known
        .actions_of(gatekeeper)
        .counts
        .get_or_insert_with(ActionCounts::default))
}

impl SqliteActionStorage {
    /// Stage `record` (its id is ignored: the next one is handed out) as
    /// [`ActionStorage::insert_pending`] does, with the same cap and id, but with its row
    /// written as the record stands: a pending record is a plain stage, and a record in
    /// another state is one staged and then moved to that state in the same transaction.
    /// An older daemon's redo journal is replayed so (`upgrade.rs`).
    pub(crate) fn stage(
        &self,
        record: ActionRecord,
        max_open: usize,
    ) -> Result<Option<DriverActionId>, StoreError> {
        let args_json = serde_json::to_string(&*record.args)
            .map_err(|e| StoreError::decode("tool arguments", e))?;
        // Nothing is staged that could not be read back (after a restart it could be
        // neither approved nor rejected): the same limit as the read, checked now.
        crate::json::readable(&args_json, "the call's arguments")?;
        let gatekeeper = &*self.gatekeeper;
        let shared = self.db.shared();
        shared
            // One writing statement: the row itself.
            .write(Durability::Deferred, Steps::One, |conn| {
                let Some(id) = self.next_id(conn, max_open)? else {
                    return Ok(None);
                };
                let record = ActionRecord {
                    id: DriverActionId(id),
                    ..record
                };
                let StateColumns {
                    state,
                    retryable,
                    error,
                    result_json,
                } = state_columns(&record)?;
                // As a claim records its session (see `write_state`).
                let claimed_by = if state == "applying" {
                    shared.session_id()
                } else {
                    None
                };
                conn.db
                    .prepare_cached(
                        "INSERT INTO actions (gatekeeper, id, tool, args_json, state, submitted_at,
                            definition, claimed_at, claimed_by, retryable, error, result_json)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
                    )?
                    .execute(params![
                        gatekeeper,
                        i64_of(id),
                        &*record.tool,
                        args_json,
                        state,
                        i64_of(record.submitted_at.0),
                        record.definition.as_deref(),
                        record.claimed_at.map(|t| i64_of(t.0)),
                        claimed_by,
                        retryable,
                        error,
                        result_json,
                    ])?;
                let known = conn.known.actions_of(&self.gatekeeper);
                known.staged(&ActionRecord {
                    state: ActionState::Pending,
                    claimed_at: None,
                    ..record.clone()
                });
                if record.state != ActionState::Pending {
                    known.moved(StateTag::Pending, &record);
                }
                Ok(Some(DriverActionId(id)))
            })
    }

    /// The id a stage under the cap `max_open` gets (`None` at the cap), handed out in the
    /// open transaction: above every id still in the table and every id recorded as
    /// deleted (see `NEXT_ID`).
    fn next_id(&self, conn: &mut Conn, max_open: usize) -> Result<Option<u64>, Error> {
        let counts = counts(conn, &self.gatekeeper)?;
        if counts.open >= max_open {
            return Ok(None);
        }
        let id = counts.last_id.max(conn.floor(&self.gatekeeper)) + 1;
        conn.hand_out(&self.gatekeeper, id);
        Ok(Some(id))
    }

    /// Delete the settled records `ids`, as a prune that chose them did, recording
    /// `newest` (at least the highest of `ids`) as handed out first, as
    /// [`ActionStorage::prune_final`] does. Returns how many were deleted: a record that is
    /// missing or not settled is left alone and not counted. An older daemon's redo
    /// journal records its prunes so (`upgrade.rs`).
    pub(crate) fn delete_final(
        &self,
        ids: &[DriverActionId],
        newest: Option<DriverActionId>,
    ) -> Result<usize, StoreError> {
        let ids: Vec<i64> = ids.iter().map(|id| i64_of(id.0)).collect();
        let newest = newest.map(|id| i64_of(id.0));
        self.db
            .shared()
            .write(Durability::Deferred, Steps::One, |conn| {
                delete_settled(conn, &self.gatekeeper, &ids, newest)
            })
    }

    /// [`ActionStorage::amend_pending`]: replace the arguments of call `id` by `args`
    /// (already checked readable and encoded as `args_json`), only while it is pending.
    fn amend(
        &self,
        id: DriverActionId,
        args: Arc<Value>,
        args_json: &str,
    ) -> Result<bool, StoreError> {
        self.db
            .shared()
            // One writing statement, synced before the call returns: a person who was
            // told the edit was kept must not find the old arguments sent after a cut.
            .write(Durability::Now, Steps::One, |conn| {
                let changed = conn
                    .db
                    .prepare_cached(
                        "UPDATE actions SET args_json = ?3
                         WHERE gatekeeper = ?1 AND id = ?2 AND state = 'pending'",
                    )?
                    .execute(params![&*self.gatekeeper, i64_of(id.0), args_json])?;
                if changed != 1 {
                    return Ok(false);
                }
                conn.known.actions_of(&self.gatekeeper).amended(id.0, &args);
                let mut staged = self.staged();
                if let Some((_, known)) = staged.get_mut(&id.0) {
                    *known = args;
                }
                Ok(true)
            })
    }
}

/// Delete the settled rows `ids` of `gatekeeper`, recording `newest` (at least the
/// highest of them) as handed out first (see `NEXT_ID`); returns how many were deleted (a
/// row missing or not settled is left).
fn delete_settled(
    conn: &mut Conn,
    gatekeeper: &Arc<str>,
    ids: &[i64],
    newest: Option<i64>,
) -> Result<usize, Error> {
    if let Some(newest) = ids.iter().copied().chain(newest).max() {
        conn.db
            .prepare_cached(REMEMBER_ID)?
            .execute(params![&**gatekeeper, newest])?;
    }
    let mut delete = conn.db.prepare_cached(DELETE_SETTLED)?;
    let mut deleted = 0;
    for id in ids {
        deleted += delete.execute(params![&**gatekeeper, id])?;
    }
    drop(delete);
    conn.known.actions_of(gatekeeper).pruned(ids);
    Ok(deleted)
}

#[async_trait]
impl ActionStorage for SqliteActionStorage {
    async fn insert_pending(
        &self,
        tool: Arc<str>,
        definition: Option<Arc<str>>,
        args: Arc<Value>,
        submitted_at: Timestamp,
        max_open: usize,
    ) -> Result<Option<DriverActionId>, StorageError> {
        let staged = ActionRecord {
            id: DriverActionId(0),
            tool,
            definition,
            args,
            submitted_at,
            claimed_at: None,
            state: ActionState::Pending,
        };
        self.stage(staged, max_open).map_err(port)
    }

    async fn get(&self, id: DriverActionId) -> Result<Option<ActionRecord>, StorageError> {
        self.db
            .shared()
            .read_conn(|conn| {
                if conn.trusted()
                    && let Some(known) = conn.known.actions_of(&self.gatekeeper).record(id.0)
                {
                    return Ok(Some(known.clone()));
                }
                let mut statement = conn.db.prepare_cached(SELECT_ONE)?;
                let mut rows = statement.query(params![&*self.gatekeeper, i64_of(id.0)])?;
                let record = match rows.next()? {
                    Some(row) => record_of(row, &mut self.staged())?,
                    None => return Ok(None),
                };
                drop(rows);
                drop(statement);
                conn.known.actions_of(&self.gatekeeper).remember(&record);
                Ok(Some(record))
            })
            .map_err(port)
    }

    async fn compare_and_set(
        &self,
        from: StateTag,
        record: &ActionRecord,
    ) -> Result<bool, StorageError> {
        let durability = if record.state == ActionState::Applying
            || (from == StateTag::Applying && is_interruption(record))
        {
            // The claim, and the recovery of one: on disk before anything acts on them.
            Durability::Now
        } else {
            Durability::Deferred
        };
        // Recovery writes the ledger entry too, and so does a rejection (the session
        // deciding it); every other transition is one UPDATE.
        let steps = if is_interruption(record) || record.state == ActionState::Rejected {
            Steps::Many
        } else {
            Steps::One
        };
        let shared = self.db.shared();
        shared
            .write(durability, steps, |conn| {
                refuse_unreadable_claim(conn, &self.gatekeeper, record)?;
                compare_and_set_in(conn, shared, &self.gatekeeper, from, record)
            })
            .map_err(port)
    }

    async fn count_open(&self) -> Result<usize, StorageError> {
        self.db
            .shared()
            .read_conn(|conn| {
                if conn.trusted() {
                    return Ok(counts(conn, &self.gatekeeper)?.open);
                }
                let open: i64 = conn
                    .db
                    .prepare_cached(
                        "SELECT count(*) FROM actions
                         WHERE gatekeeper = ?1
                           AND (state IN ('pending', 'applying') OR (state = 'failed' AND retryable = 1))",
                    )?
                    .query_row([&*self.gatekeeper], |r| r.get(0))?;
                Ok(open as usize)
            })
            .map_err(port)
    }

    async fn delete_pending(&self, id: DriverActionId) -> Result<bool, StorageError> {
        self.db
            .shared()
            // Two writes, in an order that is safe to stop between: recording the id
            // first only makes it unavailable, which it is about to be anyway. Only an id
            // that is there to discard is recorded: discarding an id never handed out
            // must not push the next one up (an agent could otherwise exhaust them).
            .write(Durability::Deferred, Steps::One, |conn| {
                conn.db
                    .prepare_cached(REMEMBER_PENDING_ID)?
                    .execute(params![&*self.gatekeeper, i64_of(id.0)])?;
                let deleted = conn
                    .db
                    .prepare_cached(
                        "DELETE FROM actions WHERE gatekeeper = ?1 AND id = ?2 AND state = 'pending'",
                    )?
                    .execute(params![&*self.gatekeeper, i64_of(id.0)])?;
                if deleted == 1 {
                    conn.known
                        .actions_of(&self.gatekeeper)
                        .deleted_pending(id.0);
                }
                Ok(deleted == 1)
            })
            .map_err(port)
    }

    async fn records_in(&self, state: StateTag) -> Result<Vec<ActionRecord>, StorageError> {
        self.db
            .shared()
            .read(|db| {
                let mut statement = db.prepare_cached(SELECT_IN_STATE)?;
                let mut rows = statement.query(params![&*self.gatekeeper, state.as_str()])?;
                let mut records = Vec::new();
                while let Some(row) = rows.next()? {
                    records.push(record_of(row, &mut self.staged())?);
                }
                Ok(records)
            })
            .map_err(port)
    }

    async fn prune_final(&self, keep: usize) -> Result<usize, StorageError> {
        let shared = self.db.shared();
        let gatekeeper = &*self.gatekeeper;
        // Look before writing (what the connection knows, or one walk of the small
        // `actions_final` index): most calls find nothing to prune and open no transaction.
        let settled: i64 = shared
            .read_conn(|conn| {
                if conn.trusted() {
                    let settled = counts(conn, &self.gatekeeper)?.settled.len();
                    return Ok(i64::try_from(settled).unwrap_or(i64::MAX));
                }
                Ok(conn
                    .db
                    .prepare_cached(COUNT_FINAL)?
                    .query_row([gatekeeper], |r| r.get(0))?)
            })
            .map_err(port)?;
        let excess = settled - i64::try_from(keep).unwrap_or(i64::MAX);
        if excess <= 0 {
            return Ok(0);
        }
        // Deleting fewer than asked (a failure half way) is harmless: the next prune
        // finishes the job.
        shared
            .write(Durability::Deferred, Steps::One, |conn| {
                let oldest: Vec<i64> = conn
                    .db
                    .prepare_cached(OLDEST_FINAL)?
                    .query_map(params![gatekeeper, excess], |r| r.get(0))?
                    .collect::<Result<_, _>>()?;
                delete_settled(conn, &self.gatekeeper, &oldest, None)
            })
            .map_err(port)
    }

    async fn amend_pending(
        &self,
        id: DriverActionId,
        args: Arc<Value>,
    ) -> Result<bool, StorageError> {
        let args_json = serde_json::to_string(&*args)
            .map_err(|e| port(StoreError::decode("tool arguments", e)))?;
        // What a stage refuses, an edit refuses: arguments that could not be read back
        // (or that are not an object, which the table's CHECK refuses too).
        crate::json::readable(&args_json, "the call's arguments").map_err(port)?;
        gatekeeper_core::store::object_arguments(&args)?;
        self.amend(id, args, &args_json).map_err(port)
    }
}

//! gatekeeper-core's [`ActionStorage`] on PostgreSQL: the `actions` table, one namespace
//! per gatekeeper (the `gatekeeper` column, which is also the kernel's gatekeeper name).
//!
//! What each guarantee rests on, with several daemons on one database:
//!
//! - **The claim before the send** (`compare_and_set` to `applying`) is one `UPDATE …
//!   WHERE state = <from>`, committed before it returns, so before the driver sends; of
//!   two daemons claiming one action, PostgreSQL lets exactly one update match. When the
//!   kernel's record of who decided is parked for this action (see `db.rs`), the claim
//!   runs in that transaction and commits both, with its `COMMIT` in the same round
//!   trip; the read before the claim is answered from the row that statement read.
//! - **The outcome may be lost, safely**: the settling `compare_and_set` of a claim this
//!   handle holds is not written at once: it is kept ([`DeferredSettle`]) and written
//!   by the kernel's outcome, the next write about the action, in the same statement
//!   (one round trip, one commit; the ledger's outcome is written only if the driver's
//!   is), or alone by the flusher within `PARK_WINDOW`. Of the claim only this handle's
//!   session settles it while alive, so the answer "written" given before is what the
//!   statement finds. A crash before it leaves the committed claim, which recovery turns
//!   into "interrupted": possibly sent, never resent. `get` of the action answers the
//!   kept record; `records_in` and `count_open` write this gatekeeper's kept outcomes
//!   first.
//! - **Only the claimant settles a claim**: a `compare_and_set` from `applying` matches
//!   only while the claim is this session's, or its session is gone (no connection holds
//!   its advisory lock), in the same statement.
//! - **The open cap** holds across daemons: staging locks the store's row of
//!   `action_ids` (which also hands out the id), then counts and inserts, in one
//!   statement (`gate_stage`, one round trip); every stage of one store waits for the
//!   one before.
//! - **Retention rides with a stage.** The deletion of settled calls beyond the newest
//!   100 (`retain_final`, every sixteenth call settled) is due with this handle's next
//!   stage of the gatekeeper: pipelined behind `gate_stage` in its round trip, in its
//!   transaction, under a savepoint, so it costs no round trip or commit of its own, and
//!   a failed deletion is undone alone (one more round trip) and due again, the stage
//!   standing. One asked for more often than the calls open at once could settle without
//!   a stage here (`RETAIN_ALONE_AT`: a daemon that applies what others stage) runs then,
//!   on its own.
//! - **A stage commits with its submission.** gatekeeper-core stages and then submits to
//!   the kernel in the same task (or, outside a task, on the same thread): the stage's
//!   transaction is left open, parked for that stager, and the ledger insert it makes
//!   next runs in it and commits both (see `ledger.rs`), so an acknowledged submission
//!   has both records and a crash before leaves neither. It holds the id row's lock
//!   until then, so this handle's next stage of the gatekeeper waits its turn in its
//!   task (not on a worker thread); a submission refused by the kernel deletes the stage
//!   in the same transaction, and the flusher commits one left longer than
//!   `PARK_WINDOW`.
//! - **A rejection is a decision**: in one transaction it locks the ledger row, is refused
//!   while another live session is deciding the action, and otherwise marks it as this
//!   session's decision together with the driver's `rejected`.
//! - **An edit of a pending call's arguments** (`amend_pending`) is one `UPDATE … WHERE
//!   state = 'pending'`, committed before it returns: once any daemon's claim (or
//!   rejection) has moved the call on, the edit matches nothing and says so.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::time::Instant;

use async_trait::async_trait;
use gatekeeper_core::store::{INTERRUPTED_MESSAGE, MAX_OPEN_ACTIONS, PRUNE_EVERY};
use gatekeeper_core::{
    ActionRecord, ActionState, ActionStorage, StateTag, StorageError, ToolResult,
};
use kernel::{DriverActionId, Timestamp};
use postgres::Row;
use serde_json::Value;

use crate::db::{Database, Key, Link, Stager};
use crate::error::StoreError;
use crate::ledger::{ATTEMPT_ACTION_COLUMNS, i64_of, sql, u64_of};

/// One gatekeeper's action store in a [`Database`].
#[derive(Debug, Clone)]
pub struct PostgresActionStorage {
    db: Database,
    gatekeeper: Arc<str>,
    /// Retention due with the next stage (see [`ActionStorage::retain_final`]).
    retain: Arc<Retention>,
}

/// Retention due with this handle's next stage of the gatekeeper.
#[derive(Debug, Default)]
struct Retention {
    /// How many settled calls to keep, as last asked.
    keep: AtomicI64,
    /// Requests since a stage last carried one: none is due at 0.
    asks: AtomicU32,
}

/// A retention asked for this many times without a stage of this handle runs alone: more
/// calls settled meanwhile than could have been open at once, so they were staged
/// elsewhere (a daemon that applies what others stage).
const RETAIN_ALONE_AT: u32 = (MAX_OPEN_ACTIONS / PRUNE_EVERY) as u32 + 2;

impl Retention {
    /// Take what is due, for a stage to carry: how many settled calls to keep.
    fn take(&self) -> Option<i64> {
        (self.asks.swap(0, Ordering::AcqRel) > 0).then(|| self.keep.load(Ordering::Acquire))
    }

    /// What a stage took did not happen (it failed or was refused, or the deletion
    /// failed): due again with the next.
    fn again(&self) {
        let _ = self
            .asks
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Ask for retention, keeping `keep`; returns whether it must run now, alone.
    fn ask(&self, keep: i64) -> bool {
        self.keep.store(keep, Ordering::Release);
        let asks = self.asks.fetch_add(1, Ordering::AcqRel) + 1;
        asks >= RETAIN_ALONE_AT
            && self
                .asks
                .compare_exchange(asks, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }
}

impl PostgresActionStorage {
    pub(crate) fn new(db: Database, gatekeeper: &str) -> Self {
        Self {
            db,
            gatekeeper: Arc::from(gatekeeper),
            retain: Arc::default(),
        }
    }
}

fn port(error: StoreError) -> StorageError {
    StorageError(error.to_string())
}

impl PostgresActionStorage {
    /// Commit what is parked for this gatekeeper's actions, so a read of its records
    /// sees this daemon's writes.
    async fn commit_parked(&self) -> Result<(), StorageError> {
        let gatekeeper = self.gatekeeper.clone();
        self.db
            .write_settles_async(|name| *name == *gatekeeper)
            .await
            .map_err(port)?;
        self.db
            .commit_parked_async(move |key, _| key.0 == gatekeeper)
            .await
            .map_err(port)
    }
}

const SELECT_ONE: &str =
    "SELECT id, tool, args_json, state, submitted_at, claimed_at, retryable, error, result_json,
            definition
     FROM actions WHERE gatekeeper = $1 AND id = $2";

const SELECT_IN_STATE: &str =
    "SELECT id, tool, args_json, state, submitted_at, claimed_at, retryable, error, result_json,
            definition
     FROM actions WHERE gatekeeper = $1 AND state = $2 ORDER BY id";

const COUNT_OPEN: &str = "SELECT count(*) FROM actions WHERE gatekeeper = $1
       AND (state IN ('pending', 'applying') OR (state = 'failed' AND retryable))";

/// Lock the id row, count the open calls, insert with the next id: one statement
/// (`gate_stage`, schema version 6); NULL when the store is full.
const STAGE: &str = "SELECT gate_stage($1, $2, $3, $4, $5, $6, $7)";

/// `$1` gatekeeper, `$2` id, `$3` from, `$4` state, `$5` claimed_at, `$6` this session,
/// `$7` retryable, `$8` error, `$9` result.
const WRITE_STATE: &str = "UPDATE actions SET state = $4, claimed_at = $5,
        claimed_by = CASE WHEN $4 = 'applying' THEN $6 ELSE claimed_by END,
        retryable = $7, error = $8, result_json = $9
     WHERE gatekeeper = $1 AND id = $2 AND state = $3 RETURNING id";

/// [`WRITE_STATE`] from `applying`: only the claimant's session, or after it died.
pub(crate) const SETTLE_CLAIM: &str = "UPDATE actions SET state = $4, claimed_at = $5,
        claimed_by = CASE WHEN $4 = 'applying' THEN $6 ELSE claimed_by END,
        retryable = $7, error = $8, result_json = $9
     WHERE gatekeeper = $1 AND id = $2 AND state = $3
       AND CASE WHEN claimed_by = $6 THEN true ELSE NOT gate_session_alive(claimed_by) END
     RETURNING id";

const INTERRUPT_LEDGER: &str = "UPDATE ledger SET state = 'failed', failure = $3,
        failure_retryable = false, failure_kind = 'outcome_unknown', deciding_session = NULL
     WHERE kind = 'action' AND gatekeeper = $1 AND driver_id = $2
       AND (state = 'pending' OR (state = 'failed' AND failure_retryable))";

const LOCK_DECIDING: &str = "SELECT deciding_session, gate_session_alive(deciding_session)
     FROM ledger WHERE kind = 'action' AND gatekeeper = $1 AND driver_id = $2 FOR UPDATE";

const MARK_DECIDING: &str = "UPDATE ledger SET deciding_session = $3
     WHERE kind = 'action' AND gatekeeper = $1 AND driver_id = $2";

/// `$1` gatekeeper, `$2` id, `$3` the new arguments: only while the call is pending.
const AMEND_PENDING: &str = "UPDATE actions SET args_json = $3
     WHERE gatekeeper = $1 AND id = $2 AND state = 'pending'";

const DELETE_PENDING: &str =
    "DELETE FROM actions WHERE gatekeeper = $1 AND id = $2 AND state = 'pending' RETURNING id";

/// Retention: every settled call of a store older than its `$2` newest settled ones. The
/// newest to delete is found once (a scalar subquery, run once whatever the plan); the
/// form `id IN (... OFFSET $2)` let a plan made before the server had statistics (every
/// connection's, in a new database) run the subquery again for each of the store's rows:
/// 3–8 ms a prune under the team bench, its share of the server's time larger than any
/// other statement's.
const PRUNE: &str = "DELETE FROM actions WHERE gatekeeper = $1
       AND (state IN ('applied', 'rejected') OR (state = 'failed' AND NOT retryable))
       AND id <= (SELECT id FROM actions WHERE gatekeeper = $1
         AND (state IN ('applied', 'rejected') OR (state = 'failed' AND NOT retryable))
         ORDER BY id DESC OFFSET $2 LIMIT 1)";

fn record_of(row: &Row) -> Result<ActionRecord, StoreError> {
    record_at(row, 0)
}

/// A record from the columns of [`SELECT_ONE`], starting at column `at` of `row`.
fn record_at(row: &Row, at: usize) -> Result<ActionRecord, StoreError> {
    let id = DriverActionId(u64_of(row.get(at), "action id")?);
    let what = || format!("action {id}");
    let tool: Arc<str> = Arc::from(row.get::<_, &str>(at + 1));
    // Arguments that cannot be read back stand as `null`; a claim of such a record is
    // refused by gatekeeper-core (stored arguments are always an object).
    let args: Value = serde_json::from_str(row.get::<_, &str>(at + 2)).unwrap_or(Value::Null);
    let state = match row.get::<_, &str>(at + 3) {
        "pending" => ActionState::Pending,
        "applying" => ActionState::Applying,
        "applied" => {
            let result: ToolResult = serde_json::from_str(row.get::<_, &str>(at + 8))
                .map_err(|e| StoreError::decode(format!("the result of {}", what()), e))?;
            ActionState::Applied {
                result: Arc::new(result),
            }
        }
        "failed" => ActionState::Failed {
            retryable: row.get(at + 6),
            message: row.get(at + 7),
        },
        "rejected" => ActionState::Rejected,
        other => {
            return Err(StoreError::decode(
                what(),
                format!("unknown state {other:?}"),
            ));
        }
    };
    let claimed_at = match row.get::<_, Option<i64>>(at + 5) {
        Some(at) => Some(Timestamp(u64_of(at, "claim time")?)),
        None => None,
    };
    let definition = row.get::<_, Option<&str>>(at + 9).map(Arc::from);
    Ok(ActionRecord {
        id,
        tool,
        definition,
        args: Arc::new(args),
        submitted_at: Timestamp(u64_of(row.get(at + 4), "stage time")?),
        claimed_at,
        state,
    })
}

/// The row values of a record's state, owned for a worker thread.
pub(crate) struct StateColumns {
    state: &'static str,
    claimed_at: Option<i64>,
    retryable: Option<bool>,
    error: Option<String>,
    result_json: Option<String>,
}

fn state_columns(record: &ActionRecord) -> Result<StateColumns, StoreError> {
    let plain = |state| StateColumns {
        state,
        claimed_at: record.claimed_at.map(|t| i64_of(t.0)),
        retryable: None,
        error: None,
        result_json: None,
    };
    Ok(match &record.state {
        ActionState::Pending => plain("pending"),
        ActionState::Applying => plain("applying"),
        ActionState::Applied { result } => StateColumns {
            result_json: Some(serde_json::to_string(&**result).map_err(|e| {
                StoreError::decode(format!("the result of action {}", record.id), e)
            })?),
            ..plain("applied")
        },
        ActionState::Failed { retryable, message } => StateColumns {
            retryable: Some(*retryable),
            error: Some(message.clone()),
            ..plain("failed")
        },
        ActionState::Rejected => plain("rejected"),
    })
}

/// A driver's outcome of a claim this handle holds, kept to be written with the kernel's
/// (see the module docs).
pub(crate) struct DeferredSettle {
    gatekeeper: String,
    id: i64,
    columns: StateColumns,
    me: i32,
    /// The record it writes, which `get` answers meanwhile.
    pub(crate) record: ActionRecord,
    /// When it was kept.
    pub(crate) since: Instant,
}

impl DeferredSettle {
    /// Write it alone, committed.
    pub(crate) fn write(&self, link: &mut Link<'_>) -> Result<(), StoreError> {
        write_state(
            link,
            SETTLE_CLAIM,
            Mode::Commit,
            &self.gatekeeper,
            self.id,
            StateTag::Applying,
            &self.columns,
            self.me,
        )
        .map(|_| ())
    }

    /// The parameters of [`SETTLE_CLAIM`], in order.
    pub(crate) fn params(&self) -> [&(dyn postgres::types::ToSql + Sync); 9] {
        [
            &self.gatekeeper,
            &self.id,
            &"applying",
            &self.columns.state,
            &self.columns.claimed_at,
            &self.me,
            &self.columns.retryable,
            &self.columns.error,
            &self.columns.result_json,
        ]
    }
}

fn is_interruption(record: &ActionRecord) -> bool {
    matches!(
        &record.state,
        ActionState::Failed { retryable: false, message } if message == INTERRUPTED_MESSAGE
    )
}

/// How [`write_state`] sends its statement.
#[derive(Clone, Copy)]
enum Mode {
    /// On its own, inside a transaction the caller opened.
    Plain,
    /// With `COMMIT`, ending the open (parked) transaction, or alone, committed.
    Commit,
}

#[allow(clippy::too_many_arguments)]
fn write_state(
    link: &mut Link<'_>,
    statement: &'static str,
    send: Mode,
    gatekeeper: &str,
    id: i64,
    from: StateTag,
    columns: &StateColumns,
    me: i32,
) -> Result<bool, StoreError> {
    let params: [&(dyn postgres::types::ToSql + Sync); 9] = [
        &gatekeeper,
        &id,
        &from.as_str(),
        &columns.state,
        &columns.claimed_at,
        &me,
        &columns.retryable,
        &columns.error,
        &columns.result_json,
    ];
    let rows = match send {
        Mode::Plain => link.write_returning(statement, &params).map_err(sql)?,
        Mode::Commit => link.commit_with(statement, &params)?,
    };
    Ok(rows.len() == 1)
}

#[async_trait]
impl ActionStorage for PostgresActionStorage {
    async fn insert_pending(
        &self,
        tool: Arc<str>,
        definition: Option<Arc<str>>,
        args: Arc<Value>,
        submitted_at: Timestamp,
        max_open: usize,
    ) -> Result<Option<DriverActionId>, StorageError> {
        let gatekeeper = self.gatekeeper.to_string();
        let definition = definition.map(|d| d.to_string());
        let args = serde_json::to_string(&*args).map_err(|e| StorageError(e.to_string()))?;
        let tool = tool.to_string();
        let at = i64_of(submitted_at.0);
        let max_open = i64::try_from(max_open).unwrap_or(i64::MAX);
        let me = self.db.session();
        // The stage is left open for the ledger insert its stager makes next (see the
        // module docs), in this handle's turn for the gatekeeper: none of this handle's
        // stages waits on a worker thread for the id row's lock its own parked stage holds.
        let stager = Stager::current();
        let turn = self
            .db
            .shared()
            .stage_turn(&self.gatekeeper)
            .lock_owned()
            .await;
        let name = self.gatekeeper.clone();
        // Retention due rides in the stage's transaction, behind it in its round trip.
        let keep = self.retain.take();
        let staged = self
            .db
            .call_async(move |link| {
                let params: [&(dyn postgres::types::ToSql + Sync); 7] =
                    [&gatekeeper, &tool, &args, &at, &me, &definition, &max_open];
                let prune: [&(dyn postgres::types::ToSql + Sync); 2] = [&gatekeeper, &keep];
                let retain = keep.map(|_| (PRUNE, &prune[..]));
                let (rows, retained) = link.begin_with_also(STAGE, &params, retain)?;
                let id: Option<i64> = rows.first().and_then(|row| row.get(0));
                if let Some(id) = id {
                    link.park_stage((name, id), stager, turn);
                }
                Ok((id, retained))
            })
            .await;
        // The retention this stage took did not happen: due again with the next.
        let again = || {
            if keep.is_some() {
                self.retain.again();
            }
        };
        let (staged, retained) = match staged {
            Ok(staged) => staged,
            Err(error) => {
                again();
                return Err(port(error));
            }
        };
        let Some(id) = staged else {
            // Refused: its transaction, and the deletion in it, are rolled back.
            again();
            return Ok(None);
        };
        match retained {
            Ok(pruned) if pruned > 0 => tracing::debug!(pruned, "action.pruned"),
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(%error, "action.prune.failed");
                again();
            }
        }
        // No ledger action names it yet (see `cache.rs`).
        self.db.shared().caches.staged(&self.gatekeeper, id);
        Ok(Some(DriverActionId(u64_of(id, "action id").map_err(port)?)))
    }

    async fn get(&self, id: DriverActionId) -> Result<Option<ActionRecord>, StorageError> {
        let gatekeeper = self.gatekeeper.to_string();
        let id = i64_of(id.0);
        let key: Key = (self.gatekeeper.clone(), id);
        // The driver's outcome kept to be written with the kernel's.
        if let Some(record) = self.db.shared().deferred_record(&key) {
            return Ok(Some(record));
        }
        // The row read with who decided, in the transaction parked for this action.
        if let Some(row) = self.db.shared().take_action_row(&key) {
            return record_at(&row, ATTEMPT_ACTION_COLUMNS)
                .map(Some)
                .map_err(port);
        }
        let parked = self.db.shared().take_park(&key);
        self.db
            .call_async_parked(parked, Some(key), move |link| {
                link.query_opt(SELECT_ONE, &[&gatekeeper, &id])
                    .map_err(sql)?
                    .as_ref()
                    .map(record_of)
                    .transpose()
            })
            .await
            .map_err(port)
    }

    async fn compare_and_set(
        &self,
        from: StateTag,
        record: &ActionRecord,
    ) -> Result<bool, StorageError> {
        let gatekeeper = self.gatekeeper.to_string();
        let driver_id = record.id;
        let id = i64_of(record.id.0);
        let columns = state_columns(record).map_err(port)?;
        let interruption = from == StateTag::Applying && is_interruption(record);
        let rejection = record.state == ActionState::Rejected;
        let me = self.db.session();
        let key: Key = (self.gatekeeper.clone(), id);
        if interruption || rejection {
            // These lock the ledger row first: what is parked or kept for the action is
            // written before.
            self.db.shared().settling(&key);
            let gatekeeper_name = self.gatekeeper.clone();
            self.db
                .write_settles_async(|name| *name == *gatekeeper_name)
                .await
                .map_err(port)?;
            self.db
                .commit_parked_async(|parked, _| *parked == key)
                .await
                .map_err(port)?;
            return self
                .db
                .call_async(move |link| {
                    if interruption {
                        // Settling a stranded claim: the ledger says so in the same commit.
                        return link.transaction(|link| {
                            let written = write_state(
                                link,
                                SETTLE_CLAIM,
                                Mode::Plain,
                                &gatekeeper,
                                id,
                                from,
                                &columns,
                                me,
                            )?;
                            if written {
                                link.execute(
                                    INTERRUPT_LEDGER,
                                    &[&gatekeeper, &id, &INTERRUPTED_MESSAGE],
                                )
                                .map_err(sql)?;
                                tracing::warn!(%gatekeeper, action = %driver_id, "action.apply.interrupted");
                            }
                            Ok(written)
                        });
                    }
                    link.transaction(|link| {
                        let deciding = link
                            .query_opt(LOCK_DECIDING, &[&gatekeeper, &id])
                            .map_err(sql)?;
                        if let Some(row) = &deciding {
                            let other: Option<i32> = row.get(0);
                            let alive: bool = row.get(1);
                            if other.is_some_and(|other| other != me) && alive {
                                return Ok(false);
                            }
                        }
                        let written = write_state(
                            link,
                            WRITE_STATE,
                            Mode::Plain,
                            &gatekeeper,
                            id,
                            from,
                            &columns,
                            me,
                        )?;
                        if written && deciding.is_some() {
                            link.execute(MARK_DECIDING, &[&gatekeeper, &id, &me])
                                .map_err(sql)?;
                        }
                        Ok(written)
                    })
                })
                .await
                .map_err(port);
        }
        if from == StateTag::Applying && self.db.shared().settling(&key) {
            // This handle's claim: its outcome rides with the kernel's.
            self.db.shared().defer_settle(
                key,
                DeferredSettle {
                    gatekeeper,
                    id,
                    columns,
                    me,
                    record: record.clone(),
                    since: Instant::now(),
                },
            );
            return Ok(true);
        }
        let claiming = record.state == ActionState::Applying;
        let parked = self.db.shared().take_park(&key);
        let statement = if from == StateTag::Applying {
            SETTLE_CLAIM
        } else {
            WRITE_STATE
        };
        // A claim (or another move): committed before it returns, with what is parked for
        // the action (who decided it).
        let written = self
            .db
            .call_async_parked(parked, Some(key.clone()), move |link| {
                write_state(
                    link,
                    statement,
                    Mode::Commit,
                    &gatekeeper,
                    id,
                    from,
                    &columns,
                    me,
                )
            })
            .await
            .map_err(port)?;
        if written && claiming {
            self.db.shared().claimed(key);
        }
        Ok(written)
    }

    async fn count_open(&self) -> Result<usize, StorageError> {
        self.commit_parked().await?;
        let gatekeeper = self.gatekeeper.to_string();
        self.db
            .call_async(move |link| {
                let open: i64 = link
                    .query_one(COUNT_OPEN, &[&gatekeeper])
                    .map_err(sql)?
                    .get(0);
                Ok(usize::try_from(open).unwrap_or(0))
            })
            .await
            .map_err(port)
    }

    async fn delete_pending(&self, id: DriverActionId) -> Result<bool, StorageError> {
        let gatekeeper = self.gatekeeper.to_string();
        let id = i64_of(id.0);
        self.db.shared().caches.submitted(&gatekeeper, id);
        // A stage still parked (the kernel refused its submission) is deleted inside its
        // transaction and committed: its id is never handed out again.
        let key: Key = (self.gatekeeper.clone(), id);
        let parked = self.db.shared().take_park(&key);
        self.db
            .call_async_parked(parked, Some(key), move |link| {
                Ok(link.commit_with(DELETE_PENDING, &[&gatekeeper, &id])?.len() == 1)
            })
            .await
            .map_err(port)
    }

    async fn amend_pending(
        &self,
        id: DriverActionId,
        args: Arc<Value>,
    ) -> Result<bool, StorageError> {
        gatekeeper_core::store::object_arguments(&args)?;
        let gatekeeper = self.gatekeeper.to_string();
        let id = i64_of(id.0);
        let args = serde_json::to_string(&*args).map_err(|e| StorageError(e.to_string()))?;
        self.db
            .call_async(move |link| {
                Ok(link
                    .execute(AMEND_PENDING, &[&gatekeeper, &id, &args])
                    .map_err(sql)?
                    == 1)
            })
            .await
            .map_err(port)
    }

    async fn records_in(&self, state: StateTag) -> Result<Vec<ActionRecord>, StorageError> {
        self.commit_parked().await?;
        let gatekeeper = self.gatekeeper.to_string();
        self.db
            .call_async(move |link| {
                link.query(SELECT_IN_STATE, &[&gatekeeper, &state.as_str()])
                    .map_err(sql)?
                    .iter()
                    .map(record_of)
                    .collect()
            })
            .await
            .map_err(port)
    }

    /// Due with the next stage, which carries it in its transaction and round trip. Asked
    /// for [`RETAIN_ALONE_AT`] times without a stage here (a daemon that applies what
    /// others stage), it runs now, alone, so that the store does not grow meanwhile.
    async fn retain_final(&self, keep: usize) -> Result<(), StorageError> {
        if !self.retain.ask(i64::try_from(keep).unwrap_or(i64::MAX)) {
            return Ok(());
        }
        match self.prune_final(keep).await {
            Ok(_) => Ok(()),
            Err(error) => {
                self.retain.again();
                Err(error)
            }
        }
    }

    async fn prune_final(&self, keep: usize) -> Result<usize, StorageError> {
        let gatekeeper = self.gatekeeper.to_string();
        let keep = i64::try_from(keep).unwrap_or(i64::MAX);
        self.db
            .call_async(move |link| {
                let pruned = link.execute(PRUNE, &[&gatekeeper, &keep]).map_err(sql)?;
                Ok(usize::try_from(pruned).unwrap_or(usize::MAX))
            })
            .await
            .map_err(port)
    }
}

//! What a live daemon settles for a dead one, on open and every
//! [`RECOVERY_INTERVAL`](crate::RECOVERY_INTERVAL), in one transaction:
//!
//! - a claim (`applying`) whose session is gone may have been sent: it becomes a failure
//!   that cannot be retried ("interrupted"), in the action store and in the ledger;
//! - a ledger action whose deciding session is gone but whose driver record settled
//!   (the daemon died between the driver's outcome and the kernel's) moves forward to
//!   match, never backward;
//! - a staged record the kernel never recorded, whose staging session is gone, was never
//!   acknowledged to the agent: it is discarded (its id is never handed out again), so it
//!   holds no slot of the open cap.
//!
//! A session is gone when no connection holds its advisory lock (`gate_session_alive`;
//! each statement here reads the live sessions once, [`with_alive!`]): the server
//! releases it when the daemon's connection ends, however the daemon died.

use gatekeeper_core::store::INTERRUPTED_MESSAGE;

use crate::db::Link;
use crate::error::StoreError;

fn sql(error: postgres::Error) -> StoreError {
    StoreError::Sql {
        detail: error
            .as_db_error()
            .map_or_else(|| error.to_string(), |db| db.message().to_owned()),
    }
}

/// The live sessions, read once per statement: what `gate_session_alive` (`schema.rs`)
/// reads for one session, with the same lock key (`SESSION_LOCKS`, 0x4753). Each call of
/// that function reads the server's whole lock table (`pg_locks`), so a statement that
/// called it for every open call of every store took milliseconds, every
/// `RECOVERY_INTERVAL`, in every daemon, however quiet the team.
macro_rules! with_alive {
    () => {
        "WITH alive AS MATERIALIZED (
            SELECT objid AS session FROM pg_locks
            WHERE locktype = 'advisory' AND classid = 18259::oid AND objsubid = 2 AND granted
              AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))
        "
    };
}

/// Whether the session in column `$session` is gone (no live session holds its lock; a
/// session that is NULL is gone), in a statement that starts with [`with_alive!`].
macro_rules! gone {
    ($session:literal) => {
        concat!(
            "NOT EXISTS (SELECT 1 FROM alive WHERE alive.session = ",
            $session,
            "::oid)"
        )
    };
}

/// Claims of dead sessions, settled; returns `(gatekeeper, id)` of each.
const INTERRUPT: &str = concat!(
    with_alive!(),
    "UPDATE actions SET state = 'failed', retryable = false, error = $1
     WHERE state = 'applying' AND ",
    gone!("claimed_by"),
    " RETURNING gatekeeper, id"
);

/// The ledger entry of an interrupted action, unless the ledger moved on.
const INTERRUPT_LEDGER: &str = "UPDATE ledger SET state = 'failed', failure = $3,
        failure_retryable = false, failure_kind = 'outcome_unknown', deciding_session = NULL
     WHERE kind = 'action' AND gatekeeper = $1 AND driver_id = $2
       AND (state = 'pending' OR (state = 'failed' AND failure_retryable))";

/// A ledger action (`ledger`) still open, decided by nobody alive, whose driver record
/// (the row of `actions` named `$a`) has settled. The statements below look only at
/// rejections and records whose claimant is gone (`settled_by_the_dead!`). "Open" is
/// written as a `CASE`, which the predicate of the partial index `ledger_open` does not
/// match: a plan then finds the entry by its driver's id (`ledger_by_driver`, one entry)
/// rather than reading every open entry of the server, dead versions included, per call.
macro_rules! behind {
    ($a:literal) => {
        concat!(
            "ledger.kind = 'action'
       AND ",
            $a,
            ".gatekeeper = ledger.gatekeeper AND ",
            $a,
            ".id = ledger.driver_id
       AND CASE ledger.state WHEN 'pending' THEN true
           WHEN 'failed' THEN ledger.failure_retryable ELSE false END
       AND ",
            gone!("ledger.deciding_session"),
            "
       AND (",
            $a,
            ".state IN ('applied', 'rejected')
            OR (",
            $a,
            ".state = 'failed' AND NOT (ledger.state = 'failed'
                 AND ledger.failure IS NOT DISTINCT FROM ",
            $a,
            ".error
                 AND ledger.failure_retryable IS NOT DISTINCT FROM ",
            $a,
            ".retryable)))"
        )
    };
}

/// A settled record of `actions` (named `$a`) that was rejected, or applied or failed by
/// a claimant that is gone: only such a record can have left its ledger entry behind. A
/// live daemon writes its claim's outcome to both in one statement, and the session that
/// claims a call is the one that recorded its decision; a rejection keeps the claimant of
/// an earlier try, if any, which is not the session that rejected it. Checked on the row
/// of `actions` before its entry is looked up, so a check while every claimant lives
/// reads the ledger only for the rejections the store keeps.
macro_rules! settled_by_the_dead {
    ($a:literal) => {
        concat!(
            "(",
            $a,
            ".state = 'rejected' OR (",
            $a,
            ".state IN ('applied', 'failed')
       AND NOT EXISTS (SELECT 1 FROM alive WHERE alive.session = ",
            $a,
            ".claimed_by::oid)))"
        )
    };
}

/// Move those forward to match their driver record.
const FORWARD: &str = concat!(
    with_alive!(),
    "UPDATE ledger SET
        state = CASE a.state WHEN 'applied' THEN 'approved' ELSE a.state END,
        failure = CASE a.state WHEN 'failed' THEN a.error ELSE ledger.failure END,
        failure_retryable = CASE a.state WHEN 'failed' THEN a.retryable
                            ELSE ledger.failure_retryable END,
        failure_kind = CASE a.state
            WHEN 'failed' THEN CASE WHEN a.retryable THEN 'not_sent' ELSE 'outcome_unknown' END
            ELSE ledger.failure_kind END,
        deciding_session = NULL
     FROM actions AS a WHERE ",
    settled_by_the_dead!("a"),
    " AND ",
    behind!("a")
);

/// A staged call whose staging session is gone and that the kernel never recorded. The
/// ledger is looked up for each such call (a subquery per row, which no plan turns into a
/// read of the whole ledger), as in [`ANYTHING`].
macro_rules! unrecorded {
    () => {
        concat!(
            "actions.state = 'pending' AND ",
            gone!("actions.staged_by"),
            "
       AND (SELECT true FROM ledger WHERE ledger.kind = 'action'
           AND ledger.gatekeeper = actions.gatekeeper AND ledger.driver_id = actions.id
           LIMIT 1) IS NULL"
        )
    };
}

/// Remember the ids of unrecorded stages of dead sessions before deleting them.
const REMEMBER_UNRECORDED: &str = concat!(
    with_alive!(),
    "INSERT INTO action_ids (gatekeeper, last_id)
     SELECT gatekeeper, max(id) FROM actions WHERE ",
    unrecorded!(),
    " GROUP BY gatekeeper
     ON CONFLICT (gatekeeper) DO UPDATE SET last_id = greatest(action_ids.last_id, excluded.last_id)"
);

/// Delete those stages.
const DISCARD_UNRECORDED: &str =
    concat!(with_alive!(), "DELETE FROM actions WHERE ", unrecorded!());

/// Whether anything needs settling: one cheap read, so a quiet database costs one round
/// trip per interval and no transaction.
///
/// It reads what the action store keeps (its open calls and the newest settled ones) in one
/// pass, and looks up the ledger entry of each rejection and of each call settled by a
/// claimant that is gone (`settled_by_the_dead!`) by its driver's id: a subquery per row,
/// which no plan turns into a join. As a join, a plan made before the server had
/// statistics (every connection's, in a new database) read every action entry of the
/// ledger, twice, every [`RECOVERY_INTERVAL`](crate::RECOVERY_INTERVAL) in every daemon
/// (`the_recovery_check_reads_the_kept_calls_not_the_whole_ledger`).
const ANYTHING: &str = concat!(
    with_alive!(),
    "SELECT EXISTS (SELECT 1 FROM actions WHERE
     (actions.state = 'applying' AND ",
    gone!("actions.claimed_by"),
    ")
  OR (",
    settled_by_the_dead!("actions"),
    "
       AND (SELECT true FROM ledger WHERE ",
    behind!("actions"),
    " LIMIT 1))
  OR (",
    unrecorded!(),
    "))"
);

/// Settle everything dead sessions left (see the module docs); returns the rows changed.
pub(crate) fn recover(link: &mut Link<'_>) -> Result<u64, StoreError> {
    let anything: bool = link.query_one(ANYTHING, &[]).map_err(sql)?.get(0);
    if !anything {
        return Ok(0);
    }
    link.transaction(|link| {
        let mut changed = 0;
        let interrupted = link
            .write_returning(INTERRUPT, &[&INTERRUPTED_MESSAGE])
            .map_err(sql)?;
        for row in &interrupted {
            let gatekeeper: String = row.get(0);
            let id: i64 = row.get(1);
            link.execute(INTERRUPT_LEDGER, &[&gatekeeper, &id, &INTERRUPTED_MESSAGE])
                .map_err(sql)?;
            tracing::warn!(%gatekeeper, action = id, "action.apply.interrupted");
            changed += 1;
        }
        changed += link.execute(FORWARD, &[]).map_err(sql)?;
        link.execute(REMEMBER_UNRECORDED, &[]).map_err(sql)?;
        let discarded = link.execute(DISCARD_UNRECORDED, &[]).map_err(sql)?;
        if discarded > 0 {
            tracing::warn!(discarded, "action.stage.unrecorded.discarded");
        }
        Ok(changed + discarded)
    })
}

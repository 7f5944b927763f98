//! What opening a database does before anyone uses it: settle the claims of dead
//! processes, and bring the kernel's ledger up to date with the drivers' action stores.
//!
//! A claim (`applying`) whose process is gone may have been sent: it becomes a failure
//! that cannot be retried ("interrupted"), in the action store and in the ledger, in one
//! commit (see `actions.rs`). gatekeeper-core's `ActionStore::open` does the same through
//! the port; doing it here too means a process that registers no driver (a reviewing
//! shell) also sees a consistent ledger at once.
//!
//! A staged driver record with no ledger entry was never acknowledged: the agent is told
//! "pending" only once the kernel's entry is committed, and the two ride in one commit
//! unless another commit (the flusher's, or another thread's) lands between the stage and
//! the kernel's insert. If the process dies in that moment, the record would hold one of
//! the store's open slots forever; opening discards it (its id is never handed out
//! again), but only when no other session has the file open, since a live one may be
//! between its stage and its insert right now.
//!
//! The ledger and the stores are written in one transaction whenever the protocol allows, but a deferred
//! driver outcome can be committed by the flusher a moment before the kernel records the
//! same outcome in the ledger. If the process dies in that moment, the action store is
//! ahead: it says applied (or failed, or rejected) while the ledger still says pending.
//! Reconciling moves the ledger forward to match, never backward, and never touches an
//! action whose call is still claimed.

use crate::db::{Database, Durability, Steps};
use crate::error::StoreError;

/// A ledger action (`ledger`) still open although its driver record (`a`) has settled.
macro_rules! behind {
    () => {
        "ledger.kind = 'action'
      AND a.gatekeeper = ledger.gatekeeper AND a.id = ledger.driver_id
      AND (ledger.state = 'pending' OR (ledger.state = 'failed' AND ledger.failure_retryable = 1))
      AND (a.state IN ('applied', 'rejected')
           OR (a.state = 'failed' AND NOT (ledger.state = 'failed'
                AND ledger.failure IS a.error AND ledger.failure_retryable IS a.retryable)))"
    };
}

/// The rows to update: the open ones (the `ledger_open` partial index), matched to their
/// driver records.
const BEHIND: &str = concat!(" FROM actions AS a WHERE ", behind!());

/// How many are behind, driven from the action stores (a few hundred rows at most), each
/// matched to its ledger entry through the `ledger_by_driver` index, so opening never
/// walks the whole ledger. (`CROSS JOIN` fixes that order for SQLite's planner.)
const COUNT_BEHIND: &str = concat!(
    "SELECT count(*) FROM actions AS a CROSS JOIN ledger WHERE ",
    behind!()
);

/// Move every ledger action whose driver record has settled to the matching state.
/// Returns how many entries moved; writes (and commits) only if some did.
pub(crate) fn reconcile(db: &Database) -> Result<usize, StoreError> {
    let interrupted = crate::actions::interrupt_dead_claims(db)?;
    let discarded = discard_unrecorded_stages(db)?;
    Ok(interrupted + discarded + bring_ledger_forward(db)?)
}

/// Staged records the kernel never recorded (see the module docs).
const UNRECORDED: &str = "FROM actions WHERE actions.state = 'pending' AND NOT EXISTS
     (SELECT 1 FROM ledger WHERE ledger.kind = 'action'
        AND ledger.gatekeeper = actions.gatekeeper AND ledger.driver_id = actions.id)";

/// Discard every staged record the ledger does not know, if no other session is open.
fn discard_unrecorded_stages(db: &Database) -> Result<usize, StoreError> {
    let shared = db.shared();
    let unrecorded: i64 = shared
        .read(|db| Ok(db.query_row(&format!("SELECT count(*) {UNRECORDED}"), [], |r| r.get(0))?))?;
    if unrecorded == 0 || shared.others_alive() {
        return Ok(0);
    }
    shared.write(Durability::Now, Steps::Many, |conn| {
        conn.known.forget();
        // Their ids first, so none is handed out again; then the rows.
        conn.db.execute(
            &format!(
                "INSERT INTO action_ids (gatekeeper, last_id)
                 SELECT gatekeeper, max(id) {UNRECORDED} GROUP BY gatekeeper
                 ON CONFLICT (gatekeeper) DO UPDATE SET last_id = max(last_id, excluded.last_id)"
            ),
            [],
        )?;
        let discarded = conn.db.execute(&format!("DELETE {UNRECORDED}"), [])?;
        tracing::warn!(discarded, "action.stage.unrecorded.discarded");
        Ok(discarded)
    })
}

fn bring_ledger_forward(db: &Database) -> Result<usize, StoreError> {
    let shared = db.shared();
    let behind: i64 = shared.read(|db| Ok(db.query_row(COUNT_BEHIND, [], |r| r.get(0))?))?;
    if behind == 0 {
        return Ok(0);
    }
    shared.write(Durability::Now, Steps::Many, |conn| {
        // Ledger rows change here, behind the ledger adapter's back.
        conn.known.forget();
        Ok(conn.db.execute(
            &format!(
                "UPDATE ledger SET
                    state = CASE a.state WHEN 'applied' THEN 'approved' ELSE a.state END,
                    failure = CASE a.state WHEN 'failed' THEN a.error ELSE ledger.failure END,
                    failure_retryable = CASE a.state WHEN 'failed' THEN a.retryable
                                        ELSE ledger.failure_retryable END,
                    -- The action store does not keep the kind: a retryable failure is
                    -- one that did not reach the tool, a final one may have.
                    failure_kind = CASE a.state
                        WHEN 'failed' THEN CASE a.retryable WHEN 1 THEN 'not_sent'
                                           ELSE 'outcome_unknown' END
                        ELSE ledger.failure_kind END
                 {BEHIND}"
            ),
            [],
        )?)
    })
}

//! gatekeeper-core's action store on SQLite: the same state machine as in memory, the
//! claim on disk before the send, recovery of dead claims only, and the commits a cycle
//! and a drain cost.

use std::sync::Arc;

use gatekeeper_core::store::{
    INTERRUPTED_MESSAGE, MAX_OPEN_ACTIONS, PRUNE_EVERY, RETAINED_FINAL_ACTIONS,
};
use gatekeeper_core::{
    ActionRecord, ActionState, ActionStorage, ActionStore, ApplyError, CallError, Discard,
    MemoryActionStorage, StageError, StateTag, ToolResult, ToolService,
};
use kernel::{ActionState as LedgerState, DriverActionId, Gatekeeper, StepClock};
use serde_json::json;
use store_sqlite::Database;

use crate::support::{Rig, TempDir, pending_entry, staged_id};

/// Answers by tool name: `ok`, `refused` (not dispatched), `timeout` (may have landed).
struct Scripted;

#[async_trait::async_trait]
impl ToolService for Scripted {
    async fn list_tools(&self) -> Vec<gatekeeper_core::Tool> {
        Vec::new()
    }

    async fn call(&self, tool: &str, args: &serde_json::Value) -> Result<ToolResult, CallError> {
        match tool {
            "refused" => Err(CallError::NotDispatched(
                "credentials refused; reconnect".into(),
            )),
            "timeout" => Err(CallError::Unknown("timed out".into())),
            _ => Ok(ToolResult::from_text(format!("ok {args}")).with_structured(args.clone())),
        }
    }
}

async fn all_records(storage: &dyn ActionStorage) -> Vec<ActionRecord> {
    let mut records = Vec::new();
    for state in [
        StateTag::Pending,
        StateTag::Applying,
        StateTag::Applied,
        StateTag::Failed,
        StateTag::Rejected,
    ] {
        records.extend(storage.records_in(state).await.unwrap());
    }
    records.sort_by_key(|r| r.id);
    records
}

/// Every transition of the store, driven through `ActionStore`; returns what it saw.
async fn script(storage: Arc<dyn ActionStorage>) -> Vec<String> {
    let store = ActionStore::open(storage, Arc::new(StepClock::default()))
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut note = |what: String| seen.push(what);
    let ok = store.stage("ok", json!({"n": 1})).await.unwrap();
    let refused = store.stage("refused", json!({})).await.unwrap();
    let timeout = store.stage("timeout", json!({})).await.unwrap();
    let rejected = store.stage("ok", json!({"n": 2})).await.unwrap();
    let discarded = store.stage("ok", json!({"n": 3})).await.unwrap();
    note(format!("{:?}", store.apply(ok, &Scripted).await));
    note(format!("{:?}", store.apply(ok, &Scripted).await));
    note(format!("{:?}", store.apply(refused, &Scripted).await));
    note(format!("{:?}", store.reject(refused).await));
    note(format!("{:?}", store.apply(timeout, &Scripted).await));
    note(format!("{:?}", store.apply(timeout, &Scripted).await));
    note(format!("{:?}", store.reject(timeout).await));
    note(format!("{:?}", store.reject(rejected).await));
    note(format!("{:?}", store.reject(rejected).await));
    note(format!("{:?}", store.apply(rejected, &Scripted).await));
    note(format!("{:?}", store.discard(discarded).await));
    note(format!("{:?}", store.discard(discarded).await));
    note(format!(
        "{:?}",
        store.apply(DriverActionId(99), &Scripted).await
    ));
    // Ids are never reused, even after a discard.
    let next = store.stage("ok", json!({})).await.unwrap();
    note(format!("next id {next}"));
    assert!(next > discarded);
    assert_eq!(store.discard(next).await.unwrap(), Discard::Discarded);
    // The open cap.
    let mut staged = Vec::new();
    loop {
        match store.stage("ok", json!({"bulk": staged.len()})).await {
            Ok(id) => staged.push(id),
            Err(StageError::TooManyOpen) => break,
            Err(other) => panic!("{other}"),
        }
    }
    note(format!("open cap after {} more", staged.len()));
    assert_eq!(store.count_open().await.unwrap(), MAX_OPEN_ACTIONS);
    // Retention: apply enough to prune.
    for id in &staged {
        let _sent = store.apply(*id, &Scripted).await.unwrap();
    }
    for n in 0..RETAINED_FINAL_ACTIONS {
        let id = store.stage("ok", json!({"more": n})).await.unwrap();
        let _sent = store.apply(id, &Scripted).await.unwrap();
    }
    note(format!("{:?}", store.get(ok).await.unwrap().map(|r| r.id)));
    seen
}

#[tokio::test]
async fn the_action_store_behaves_exactly_as_in_memory() {
    let memory = Arc::new(MemoryActionStorage::new());
    let expected = script(memory.clone()).await;
    let db = Database::open_in_memory().unwrap();
    let sqlite = db.action_storage("issues");
    assert_eq!(script(sqlite.clone()).await, expected);
    assert_eq!(all_records(&*sqlite).await, memory.records());
    let kept = all_records(&*sqlite).await.len();
    assert!(
        (RETAINED_FINAL_ACTIONS..RETAINED_FINAL_ACTIONS + PRUNE_EVERY).contains(&kept),
        "{kept} records kept"
    );

    // Another gatekeeper's store in the same database is a separate namespace.
    let other = db.action_storage("wiki");
    assert!(all_records(&*other).await.is_empty());
    assert_eq!(staged_id(other).await, DriverActionId(1));
}

#[tokio::test]
async fn the_file_keeps_what_memory_keeps_after_its_prunes() {
    // The same script of stages, moves and prunes on the in-memory store and on a file:
    // the file deletes exactly the records memory pruned, and hands out the next id
    // memory would.
    let memory = Arc::new(MemoryActionStorage::new());
    let expected = script(memory.clone()).await;
    let dir = TempDir::new("prunes");
    let path = dir.join("gate.db");
    assert_eq!(
        script(Database::open(&path).unwrap().action_storage("issues")).await,
        expected
    );
    let db = Database::open(&path).unwrap();
    assert_eq!(
        all_records(&*db.action_storage("issues")).await,
        memory.records()
    );
    // The next call gets the id it would have got in memory.
    assert_eq!(
        staged_id(db.action_storage("issues")).await,
        staged_id(memory.clone()).await
    );
}

/// The arguments a person's edit gives the pending call of [`amend_each`].
pub fn edited() -> serde_json::Value {
    json!({"path": "/tmp/a/b", "count": 3})
}

/// The calls [`amend_each`] staged: the edited one, and the ones it could not edit.
pub struct Amended {
    pub pending: DriverActionId,
    pub applied: DriverActionId,
    pub rejected: DriverActionId,
}

/// Record staged call `id` of `issues` in `ledger`, pending, as the kernel does (a stage
/// the ledger never recorded is discarded when the file is opened again).
pub fn recorded(ledger: &dyn kernel::LedgerStore, id: DriverActionId) {
    ledger
        .insert(&mut pending_entry(
            "issues",
            id.0,
            kernel::ActionDescription::new("Edit me", "before approval"),
        ))
        .unwrap();
}

/// Edits of staged calls in `storage`: a pending call (recorded in `ledger`) takes its
/// new arguments (read back at once, whatever was read before); an applied one, a
/// rejected one and an id never staged refuse theirs, as do arguments that are not an
/// object; nothing else changes.
pub async fn amend_each(
    storage: Arc<dyn ActionStorage>,
    ledger: &dyn kernel::LedgerStore,
) -> Amended {
    let store = ActionStore::open(storage.clone(), Arc::new(StepClock::default()))
        .await
        .unwrap();
    let pending = store.stage("ok", json!({"path": "/tmp/a"})).await.unwrap();
    recorded(ledger, pending);
    let applied = store.stage("ok", json!({"n": 1})).await.unwrap();
    let rejected = store.stage("ok", json!({"n": 2})).await.unwrap();
    let _sent = store.apply(applied, &Scripted).await.unwrap();
    let _rejection = store.reject(rejected).await.unwrap();
    let before = all_records(&*storage).await;
    assert_eq!(
        *storage.get(pending).await.unwrap().unwrap().args,
        json!({"path": "/tmp/a"})
    );
    gatekeeper_core::testkit::an_edit_changes_only_a_pending_call(
        &*storage,
        pending,
        &[applied, rejected, DriverActionId(99)],
        edited(),
    )
    .await;
    let expected: Vec<ActionRecord> = before
        .into_iter()
        .map(|record| {
            if record.id == pending {
                ActionRecord {
                    args: Arc::new(edited()),
                    ..record
                }
            } else {
                record
            }
        })
        .collect();
    assert_eq!(all_records(&*storage).await, expected);
    let record = storage.get(pending).await.unwrap().unwrap();
    assert_eq!(
        (&*record.args, &record.state),
        (&edited(), &ActionState::Pending)
    );
    Amended {
        pending,
        applied,
        rejected,
    }
}

/// The arguments in the one row of `rows` (a query of `args_json`), parsed.
pub fn stored_args(rows: Vec<Vec<Option<String>>>) -> serde_json::Value {
    let [row] = &rows[..] else {
        panic!("one row expected: {rows:?}")
    };
    serde_json::from_str(row[0].as_deref().unwrap()).unwrap()
}

#[tokio::test]
async fn an_edit_of_a_pending_call_is_synced_and_kept_and_of_any_other_refused() {
    let memory = Database::open_in_memory().unwrap();
    amend_each(memory.action_storage("issues"), &*memory.ledger()).await;
    let dir = TempDir::new("amend");
    let path = dir.join("gate.db");
    let amended = {
        let db = Database::open(&path).unwrap();
        let storage = db.action_storage("issues");
        let pending = ActionStore::open(storage.clone(), Arc::new(StepClock::default()))
            .await
            .unwrap()
            .stage("ok", json!({}))
            .await
            .unwrap();
        recorded(&*db.ledger(), pending);
        let syncs = db.syncs();
        assert!(
            storage
                .amend_pending(pending, Arc::new(json!({"n": "synced"})))
                .await
                .unwrap()
        );
        assert!(db.syncs() > syncs, "the edit is synced before it returns");
        amend_each(storage, &*db.ledger()).await
    };
    // Reopened: the file holds the edit, and only it.
    let db = Database::open(&path).unwrap();
    let storage = db.action_storage("issues");
    let record = storage.get(amended.pending).await.unwrap().unwrap();
    assert_eq!(
        (&*record.args, &record.state),
        (&edited(), &ActionState::Pending)
    );
    assert_eq!(
        stored_args(
            db.query_text(&format!(
                "SELECT args_json FROM actions WHERE id = {}",
                amended.pending
            ))
            .unwrap()
        ),
        edited()
    );
    for (id, args) in [
        (amended.applied, json!({"n": 1})),
        (amended.rejected, json!({"n": 2})),
    ] {
        assert_eq!(*storage.get(id).await.unwrap().unwrap().args, args);
        assert!(!storage.amend_pending(id, Arc::new(edited())).await.unwrap());
    }
}

/// Stage and apply refused calls until the store says no; returns how many it took.
async fn refused_until_full(storage: Arc<dyn ActionStorage>) -> usize {
    let store = ActionStore::open(storage, Arc::new(StepClock::default()))
        .await
        .unwrap();
    for n in 0..250 {
        match store.stage("refused", json!({"n": n})).await {
            Ok(id) => {
                let error = store.apply(id, &Scripted).await.unwrap_err();
                assert!(error.retryable(), "{error}");
            }
            Err(StageError::TooManyOpen) => {
                assert_eq!(store.count_open().await.unwrap(), MAX_OPEN_ACTIONS);
                return n;
            }
            Err(other) => panic!("{other}"),
        }
    }
    250
}

#[tokio::test]
async fn refused_calls_wait_for_a_person_so_they_count_as_open_and_the_store_stays_bounded() {
    // A retryable failure waits for a person, as the kernel's ledger says (it is open
    // there): it takes a slot of the open cap, so refused calls cannot pile up unbounded.
    let memory = Arc::new(MemoryActionStorage::new());
    assert_eq!(refused_until_full(memory.clone()).await, MAX_OPEN_ACTIONS);
    assert_eq!(memory.records().len(), MAX_OPEN_ACTIONS);
    let db = Database::open_in_memory().unwrap();
    let sqlite = db.action_storage("issues");
    assert_eq!(refused_until_full(sqlite.clone()).await, MAX_OPEN_ACTIONS);
    assert_eq!(all_records(&*sqlite).await.len(), MAX_OPEN_ACTIONS);
    // Counted from the file, not from the connection's memory, the cap is the same.
    let dir = TempDir::new("refused-cap");
    let path = dir.join("gate.db");
    assert_eq!(
        refused_until_full(Database::open(&path).unwrap().action_storage("issues")).await,
        MAX_OPEN_ACTIONS
    );
    let reopened = Database::open(&path).unwrap().action_storage("issues");
    assert_eq!(reopened.count_open().await.unwrap(), MAX_OPEN_ACTIONS);
}

#[tokio::test]
async fn the_claim_is_on_disk_before_the_call_is_sent() {
    let dir = TempDir::new("claim");
    let path = dir.join("gate.db");
    let rig = Rig::new(Database::open(&path).unwrap()).await;
    let peek = path.clone();
    *rig.service.on_call.lock().unwrap() = Some(Box::new(move |_, _| {
        // Another connection sees only what was committed.
        let other = rusqlite::Connection::open(&peek).unwrap();
        let state: String = other
            .query_row("SELECT state FROM actions WHERE id = 1", [], |r| r.get(0))
            .unwrap();
        assert_eq!(
            state, "applying",
            "the claim was not committed before the send"
        );
    }));
    let queued = rig.queue_issue("Add dark mode").await;
    rig.overseer
        .approve(queued.ledger().unwrap(), "alice")
        .await
        .unwrap();
    assert_eq!(rig.service.calls().len(), 1);
}

#[tokio::test]
async fn one_durable_cycle_costs_exactly_three_commits_of_which_two_are_synced() {
    let dir = TempDir::new("cycle");
    let rig = Rig::new(Database::open(dir.join("gate.db")).unwrap()).await;
    let (before, synced_before) = (rig.db.commits(), rig.db.syncs());
    // When the call goes out, the stage and the claim are both synced, and nothing else.
    let db = rig.db.clone();
    *rig.service.on_call.lock().unwrap() = Some(Box::new(move |_, _| {
        assert_eq!(
            (db.commits() - before, db.syncs() - synced_before),
            (2, 2),
            "stage and claim: each committed and synced before the send"
        );
    }));
    let queued = rig.queue_issue("Add dark mode").await;
    assert_eq!(
        (rig.db.commits() - before, rig.db.syncs() - synced_before),
        (1, 1),
        "stage and submission: one commit, synced before the agent hears \"pending\""
    );
    rig.overseer
        .approve(queued.ledger().unwrap(), "alice")
        .await
        .unwrap();
    rig.overseer.settle().await;
    assert_eq!(
        rig.db.commits() - before,
        3,
        "stage; claim before the send; outcome"
    );
    assert_eq!(
        rig.db.syncs() - synced_before,
        2,
        "the outcome is committed without a sync of its own"
    );
    rig.db.flush().unwrap();
    assert_eq!(rig.db.commits() - before, 3, "nothing was left deferred");
    assert_eq!(
        rig.db.syncs() - synced_before,
        3,
        "the next sync (here, flush) makes the outcome durable"
    );
    assert_eq!(rig.service.calls().len(), 1);
}

#[tokio::test]
async fn a_drain_shares_each_outcome_with_the_next_claim() {
    const N: u64 = 40;
    let dir = TempDir::new("drain");
    let rig = Rig::new(Database::open(dir.join("gate.db")).unwrap()).await;
    for n in 0..N {
        rig.session
            .call_tool("addLabel", json!({"issue": n, "label": "bug"}))
            .await
            .unwrap();
    }
    let (before, synced_before) = (rig.db.commits(), rig.db.syncs());
    rig.overseer
        .enable_rule("issues", rig.label_kind(), "carol")
        .unwrap();
    rig.overseer.settle().await;
    let synced = rig.db.syncs() - synced_before;
    rig.db.flush().unwrap();
    let spent = rig.db.commits() - before;
    assert_eq!(rig.service.calls().len() as u64, N);
    // One sync for the rule and one per claim; the outcomes ride along, unsynced.
    assert_eq!(synced, N + 1, "the drain of {N} synced {synced} times");
    // One for the rule, one claim per action (each carrying the previous outcome), one
    // for the last outcome; a loaded machine may let the flusher split one or two.
    assert!(
        spent >= N + 2 && spent as f64 <= 1.1 * N as f64 + 2.0,
        "the drain of {N} took {spent} commits"
    );
    for entry in rig.overseer.ledger().unwrap() {
        let action = entry.action().unwrap();
        assert_eq!(action.state, LedgerState::Approved);
        assert_eq!(action.resolution.as_ref().unwrap().by, "carol");
    }
}

#[tokio::test]
async fn reopening_turns_a_dead_claim_into_an_interrupted_failure_in_store_and_ledger() {
    let dir = TempDir::new("dead-claim");
    let path = dir.join("gate.db");
    let ledger_id = {
        let rig = Rig::new(Database::open(&path).unwrap()).await;
        let queued = rig.queue_issue("Add dark mode").await;
        // What the first two steps of apply write, and then the process "dies".
        let storage = rig.db.action_storage("issues");
        let record = storage
            .get(queued.action().unwrap())
            .await
            .unwrap()
            .unwrap();
        let gatekeeper_core::store::ApplyStep::Claim(claimed) =
            record.begin_apply(kernel::Timestamp(1))
        else {
            panic!("pending should be claimable");
        };
        assert!(
            storage
                .compare_and_set(StateTag::Pending, &claimed)
                .await
                .unwrap()
        );
        queued.ledger().unwrap()
    };

    let db = Database::open(&path).unwrap();
    let commits = db.commits();
    let entry = db.ledger().get(ledger_id).unwrap().unwrap();
    let action = entry.action().unwrap();
    assert_eq!(action.state, LedgerState::Failed);
    let failure = action.failure.as_ref().unwrap();
    assert_eq!(
        (failure.message.as_str(), failure.retryable),
        (INTERRUPTED_MESSAGE, false)
    );
    assert_eq!(
        failure.kind,
        kernel::FailureKind::OutcomeUnknown,
        "as soon as the file is open again, the interrupted call reads as outcome unknown"
    );
    let record = db
        .action_storage("issues")
        .get(action.driver_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        record.state,
        ActionState::Failed {
            retryable: false,
            message: INTERRUPTED_MESSAGE.into()
        }
    );

    // gatekeeper-core's own recovery finds nothing left; a person cannot send it again.
    let rig = Rig::new(db).await;
    assert_eq!(rig.db.commits(), commits, "nothing left to recover");
    let refused = rig.overseer.approve(ledger_id, "alice").await;
    assert!(refused.is_err(), "{refused:?}");
    assert!(rig.service.calls().is_empty());
}

#[tokio::test]
async fn a_second_handle_never_settles_a_claim_that_is_still_being_sent() {
    let dir = TempDir::new("live-claim");
    let path = dir.join("gate.db");
    let rig = Rig::new(Database::open(&path).unwrap()).await;
    let queued = rig.queue_issue("Add dark mode").await;
    let ledger_id = queued.ledger().unwrap();
    let (entered, release) = rig.service.hold_next();
    let approve = rig.overseer.approve(ledger_id, "alice");
    let other = async {
        entered.notified().await;
        // Another process opens the file while the call is in flight.
        let second = Rig::new(Database::open(&path).unwrap()).await;
        let record = second
            .db
            .action_storage("issues")
            .get(queued.action().unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(record.state, ActionState::Applying);
        let entry = second.overseer.entry(ledger_id).unwrap().unwrap();
        assert_eq!(entry.action().unwrap().state, LedgerState::Pending);
        // Its attempt to apply the same action is refused, not sent.
        let second_try = second
            .gatekeeper
            .apply_action(queued.action().unwrap())
            .await;
        assert!(second_try.is_err());
        assert!(second.service.calls().is_empty());
        release.notify_one();
        second
    };
    let (approved, second) = tokio::join!(approve, other);
    approved.unwrap();
    assert_eq!(rig.service.calls().len(), 1);
    let entry = second.overseer.entry(ledger_id).unwrap().unwrap();
    assert_eq!(entry.action().unwrap().state, LedgerState::Approved);
}

#[tokio::test]
async fn a_ledger_left_behind_its_store_is_brought_forward_on_reopen() {
    let dir = TempDir::new("behind");
    let path = dir.join("gate.db");
    let ledger_id = {
        let rig = Rig::new(Database::open(&path).unwrap()).await;
        let queued = rig.queue_issue("Add dark mode").await;
        // The driver settles (as the flusher may commit it) but the kernel never records it.
        rig.gatekeeper
            .apply_action(queued.action().unwrap())
            .await
            .unwrap();
        rig.db.flush().unwrap();
        queued.ledger().unwrap()
    };
    let db = Database::open(&path).unwrap();
    let entry = db.ledger().get(ledger_id).unwrap().unwrap();
    assert_eq!(entry.action().unwrap().state, LedgerState::Approved);
}

#[tokio::test]
async fn a_refused_submission_leaves_no_staged_record() {
    let db = Database::open_in_memory().unwrap();
    let rig = Rig::new(db).await;
    rig.overseer.settle().await;
    // Latch lockdown with a sensitive observation, then try to act.
    rig.overseer
        .queue_for("issues", "agent")
        .unwrap()
        .authorize_observation(kernel::ObservationDescription {
            prohibit_all_sharing: true,
            ..kernel::ObservationDescription::new("secrets", "sensitive")
        })
        .await
        .unwrap();
    let refused = rig
        .session
        .call_tool("createIssue", json!({"title": "leak"}))
        .await;
    assert!(refused.is_err());
    assert_eq!(rig.gatekeeper.store().count_open().await.unwrap(), 0);
    assert!(matches!(
        rig.gatekeeper
            .store()
            .apply(DriverActionId(1), &Scripted)
            .await,
        Err(ApplyError::Unknown(_))
    ));
}

#[tokio::test]
async fn discarding_an_id_never_staged_changes_nothing() {
    // "Delete the record if it is pending": when there is none, nothing may change. In
    // particular the id must not be recorded as handed out, or the next stage would
    // skip ahead (and the largest id would leave none to stage with, ever again).
    let dir = TempDir::new("discard-unknown");
    let path = dir.join("gate.db");
    let clock = || -> Arc<dyn kernel::Clock> { Arc::new(StepClock::default()) };
    let first = {
        let db = Database::open(&path).unwrap();
        let store = db.action_store("issues", clock()).await.unwrap();
        let first = store.stage("ok", json!({})).await.unwrap();
        for never in [first.0 + 1, 1_000, i64::MAX as u64, u64::MAX] {
            assert_eq!(
                store.discard(DriverActionId(never)).await.unwrap(),
                Discard::NotPending
            );
        }
        first
    };
    // Reopened, so the next id is read from the file, not from what a handle remembers.
    let db = Database::open(&path).unwrap();
    let store = db.action_store("issues", clock()).await.unwrap();
    let next = store.stage("ok", json!({})).await.unwrap();
    assert_eq!(next, DriverActionId(first.0 + 1));
}

#[tokio::test]
async fn a_stage_the_kernel_never_recorded_is_discarded_on_reopen_and_frees_its_slot() {
    let dir = TempDir::new("unrecorded");
    let path = dir.join("gate.db");
    let staged_alone = |db: &Database| {
        db.query_text("SELECT count(*) FROM actions WHERE state = 'pending'")
            .unwrap()[0][0]
            .clone()
            .unwrap()
    };
    let orphan = {
        let rig = Rig::new(Database::open(&path).unwrap()).await;
        let _recorded = rig.queue_issue("Add dark mode").await;
        // What a kill between a stage and the kernel's insert leaves behind: the staged
        // row, committed without its ledger entry.
        let orphan = rig
            .db
            .action_storage("issues")
            .insert_pending(
                Arc::from("createIssue"),
                None,
                Arc::new(json!({"title": "never acknowledged"})),
                kernel::Timestamp(9),
                MAX_OPEN_ACTIONS,
            )
            .await
            .unwrap()
            .unwrap();
        rig.db.flush().unwrap();
        // Another handle opened meanwhile leaves it alone: this one may be about to
        // record it.
        let other = Database::open(&path).unwrap();
        assert_eq!(staged_alone(&other), "2");
        orphan
    };

    let db = Database::open(&path).unwrap();
    assert_eq!(staged_alone(&db), "1", "only the recorded stage is left");
    let storage = db.action_storage("issues");
    assert!(storage.get(orphan).await.unwrap().is_none());
    assert_eq!(storage.count_open().await.unwrap(), 1);
    // Its id is never handed out again.
    let rig = Rig::new(db).await;
    let next = rig.queue_issue("Fix the login page").await;
    assert!(next.action().unwrap() > orphan);
}

#[test]
fn sixteen_sessions_on_one_file_share_syncs_and_send_each_call_once() {
    const SESSIONS: u64 = 16;
    const EACH: u64 = 4;
    let dir = TempDir::new("group-commit");
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let rig =
        runtime().block_on(async { Rig::new(Database::open(dir.join("gate.db")).unwrap()).await });
    let (commits, syncs) = (rig.db.commits(), rig.db.syncs());
    std::thread::scope(|scope| {
        for session in 0..SESSIONS {
            let rig = &rig;
            scope.spawn(move || {
                runtime().block_on(async {
                    for n in 0..EACH {
                        rig.create_approved(json!({"title": format!("issue {session}-{n}")}))
                            .await;
                    }
                })
            });
        }
    });
    let actions = SESSIONS * EACH;
    let (commits, syncs) = (rig.db.commits() - commits, rig.db.syncs() - syncs);
    let mut sent: Vec<String> = rig
        .service
        .calls()
        .into_iter()
        .map(|(_, args)| args["title"].as_str().unwrap().to_owned())
        .collect();
    sent.sort();
    sent.dedup();
    assert_eq!(sent.len() as u64, actions, "each call sent exactly once");
    assert_eq!(rig.service.calls().len() as u64, actions);
    for entry in rig.overseer.ledger().unwrap() {
        assert_eq!(entry.action().unwrap().state, LedgerState::Approved);
    }
    // Two durable writes per action (stage, claim); concurrent ones share transactions
    // (group commit) and syncs.
    eprintln!("{SESSIONS} sessions, {actions} actions: {commits} commits, {syncs} syncs");
    assert!(
        commits < 3 * actions,
        "{actions} actions from {SESSIONS} sessions took {commits} commits: no transaction was shared"
    );
    assert!(
        syncs < 2 * actions,
        "{actions} actions from {SESSIONS} sessions took {syncs} syncs: none was shared"
    );
}

#[tokio::test]
async fn an_expired_action_is_stored_as_expired_sends_nothing_and_frees_its_slot() {
    let dir = TempDir::new("expired");
    let path = dir.join("gate.db");
    let rig = Rig::new(Database::open(&path).unwrap()).await;
    let queued = rig.queue_issue("Add dark mode").await;
    let id = queued.ledger().unwrap();
    // The rig's clock moves a second per reading: a time to live of one second has
    // passed by the time anyone looks.
    rig.overseer
        .set_time_to_live(None, Some(std::time::Duration::from_secs(1)));
    assert_eq!(rig.overseer.expire_due().await.unwrap(), [id]);
    assert!(rig.service.calls().is_empty(), "nothing was sent");
    assert_eq!(rig.gatekeeper.store().count_open().await.unwrap(), 0);
    drop(rig);

    let reopened = Database::open(&path).unwrap();
    let entry = reopened.ledger().get(id).unwrap().unwrap();
    let action = entry.action().unwrap();
    assert_eq!(action.state, LedgerState::Expired);
    assert_eq!(
        action.resolution.as_ref().unwrap().by,
        kernel::EXPIRY_DECIDER
    );
    let state = reopened
        .query_text(&format!("SELECT state FROM ledger WHERE id = {}", id.0))
        .unwrap();
    assert_eq!(state, [[Some("expired".to_owned())]]);
}

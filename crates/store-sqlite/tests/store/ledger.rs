//! The kernel's ledger port on SQLite: the same answers as the in-memory ledger for the
//! same decisions, the same answers after a reopen, and the commits each step costs.

use std::sync::Arc;

use kernel::{
    ActionDescription, ActionState, DecisionError, DriverActionId, GatekeeperError, LedgerId,
    LedgerStore, MemoryLedger, ObservationDescription, Overseer, QueueError, StepClock,
};
use store_sqlite::Database;

use crate::support::{FakeGatekeeper, TempDir, auto_kind, pending_entry};

fn action(title: &str, auto: bool) -> ActionDescription {
    ActionDescription {
        auto_approvable: auto,
        action_kind: auto.then(auto_kind),
        implements_revert: true,
        ..ActionDescription::new(title, format!("**{title}**\n\nArguments: `{{}}`"))
    }
}

/// Every kind of decision the kernel records: submissions, an observation, a manual
/// apply, a retryable failure and its retry, an auto-approval drain, a rejection with
/// a cascade and a flagged dependent, a revert, a removed rule, lockdown.
async fn scenario(store: Arc<dyn LedgerStore>) -> Overseer {
    let overseer = Overseer::with_store(store, Arc::new(StepClock::default()));
    let gk = FakeGatekeeper::new("gk");
    overseer.register(gk.clone()).unwrap();
    let queue = overseer.queue_for("gk", "agent-1").unwrap();
    let d = |n| DriverActionId(n);

    let first = queue
        .submit_action(d(1), action("first", false))
        .await
        .unwrap();
    let auto = queue
        .submit_action(d(2), action("auto", true))
        .await
        .unwrap();
    let root = queue
        .submit_action(d(3), action("root", false))
        .await
        .unwrap();
    let flaky = queue
        .submit_action(d(4), action("flaky", false))
        .await
        .unwrap();
    let dependent = queue
        .submit_action(
            d(5),
            ActionDescription {
                depends_on: vec![d(3)],
                ..action("dependent", false)
            },
        )
        .await
        .unwrap();
    let cascaded = queue
        .submit_action(d(6), action("cascaded", false))
        .await
        .unwrap();
    queue
        .authorize_observation(ObservationDescription::new(
            "read page",
            "The server declares this tool read-only, so it runs without approval.",
        ))
        .await
        .unwrap();

    overseer.approve(first, "alice").await.unwrap();
    gk.fail_next_apply(
        4,
        GatekeeperError::retryable("credentials refused; reconnect"),
    );
    assert!(matches!(
        overseer.approve(flaky, "bob").await,
        Err(DecisionError::ApplyFailed { .. })
    ));
    overseer.approve(flaky, "bob").await.unwrap();
    overseer.enable_rule("gk", auto_kind(), "carol").unwrap();
    overseer.settle().await;
    assert_eq!(
        overseer
            .entry(auto)
            .unwrap()
            .unwrap()
            .action()
            .unwrap()
            .state,
        ActionState::Approved
    );
    gk.cascade_on_reject(3, &[6]);
    let report = overseer.reject(root, "alice").await.unwrap();
    assert_eq!(report.cascaded, vec![cascaded]);
    assert_eq!(report.flagged, vec![dependent]);
    overseer.revert(first, "alice").await.unwrap();
    assert!(overseer.remove_rule("gk", &auto_kind().tag).unwrap());
    overseer.enable_rule("gk", auto_kind(), "dave").unwrap();
    queue
        .authorize_observation(ObservationDescription {
            prohibit_all_sharing: true,
            ..ObservationDescription::new("read secrets", "sensitive")
        })
        .await
        .unwrap();
    assert_eq!(
        queue.submit_action(d(7), action("late", false)).await,
        Err(QueueError::LockedDown)
    );
    overseer.settle().await;
    overseer
}

#[tokio::test]
async fn the_same_decisions_leave_the_same_ledger_as_in_memory() {
    let memory = scenario(Arc::new(MemoryLedger::new())).await;
    let db = Database::open_in_memory().unwrap();
    let sqlite = scenario(db.ledger()).await;
    assert_eq!(sqlite.ledger().unwrap(), memory.ledger().unwrap());
    assert_eq!(sqlite.rules().unwrap(), memory.rules().unwrap());
    assert_eq!(
        sqlite.open_actions().unwrap(),
        memory.open_actions().unwrap()
    );
    assert!(sqlite.is_locked_down().unwrap());
}

#[tokio::test]
async fn a_reopened_file_answers_exactly_as_before() {
    let dir = TempDir::new("reopen");
    let path = dir.join("gate.db");
    let (ledger, rules) = {
        let db = Database::open(&path).unwrap();
        let overseer = scenario(db.ledger()).await;
        (overseer.ledger().unwrap(), overseer.rules().unwrap())
    };
    let db = Database::open(&path).unwrap();
    let store = db.ledger();
    assert_eq!(store.entries().unwrap(), ledger);
    assert_eq!(store.rules().unwrap(), rules);
    assert!(store.locked_down().unwrap());
    let open: Vec<LedgerId> = ledger
        .iter()
        .filter(|e| e.action().is_some_and(|a| a.is_open()))
        .map(|e| e.id)
        .collect();
    assert_eq!(store.open_action_ids("gk").unwrap(), open);
    assert_eq!(
        store.find_action("gk", DriverActionId(5)).unwrap(),
        Some(LedgerId(5))
    );
    assert_eq!(store.find_action("other", DriverActionId(5)).unwrap(), None);
}

#[test]
fn a_rule_keeps_its_time_and_scope_exactly_and_after_a_reopen() {
    let dir = TempDir::new("scoped-rules");
    let path = dir.join("gate.db");
    let expected = {
        let db = Database::open(&path).unwrap();
        let expected = kernel::testkit::put_scoped_rules(&*db.ledger());
        kernel::testkit::assert_rules(&*db.ledger(), &expected);
        let stored = db
            .query_text("SELECT tag, enabled_at, scope_json FROM auto_approval_rules ORDER BY tag")
            .unwrap();
        assert_eq!(stored[0][1..], [Some("0".into()), Some("{}".into())]);
        assert_eq!(stored[1][1].as_deref(), Some("1234"));
        expected
    };
    let db = Database::open(&path).unwrap();
    kernel::testkit::assert_rules(&*db.ledger(), &expected);
    drop(db);
    let reader = store_sqlite::LedgerReader::open(&path).unwrap();
    assert_eq!(reader.rules().unwrap(), expected);
    // In memory as on a file.
    let db = Database::open_in_memory().unwrap();
    let expected = kernel::testkit::put_scoped_rules(&*db.ledger());
    kernel::testkit::assert_rules(&*db.ledger(), &expected);
}

#[tokio::test]
async fn each_recorded_decision_costs_one_commit() {
    let dir = TempDir::new("commits");
    let db = Database::open(dir.join("gate.db")).unwrap();
    let overseer = Overseer::with_store(db.ledger(), Arc::new(StepClock::default()));
    overseer.register(FakeGatekeeper::new("gk")).unwrap();
    let queue = overseer.queue_for("gk", "agent").unwrap();

    let before = db.commits();
    let id = queue
        .submit_action(DriverActionId(1), action("one", false))
        .await
        .unwrap();
    assert_eq!(db.commits() - before, 1, "a submission is one commit");

    let before = db.commits();
    overseer.approve(id, "alice").await.unwrap();
    overseer.settle().await;
    assert_eq!(
        db.commits() - before,
        1,
        "a person's approval is one commit"
    );

    let before = db.commits();
    queue
        .authorize_observation(ObservationDescription::new("read", "read"))
        .await
        .unwrap();
    // It waits in the open transaction for the next commit: here a flush's, or the
    // flusher's if the window passed first; one commit either way.
    db.flush().unwrap();
    assert_eq!(db.commits() - before, 1, "an observation is one commit");

    // Automatic outcomes are deferred: a drain of ten (with no driver claims in between,
    // since this fake stores nothing) rides in one or two commits, not ten.
    for n in 2..12 {
        queue
            .submit_action(DriverActionId(n), action("auto", true))
            .await
            .unwrap();
    }
    let before = db.commits();
    overseer.enable_rule("gk", auto_kind(), "carol").unwrap();
    overseer.settle().await;
    db.flush().unwrap();
    let spent = db.commits() - before;
    assert!(
        (2..=3).contains(&spent),
        "rule + deferred outcomes took {spent} commits"
    );
    assert!(overseer.open_actions().unwrap().is_empty());
}

#[test]
fn put_refuses_an_entry_that_was_never_inserted() {
    let db = Database::open_in_memory().unwrap();
    let memory = MemoryLedger::new();
    let store = db.ledger();
    let mut make = |id| kernel::LedgerEntry {
        id,
        gatekeeper: Arc::from("gk"),
        caller: Arc::from("agent"),
        created_at: kernel::Timestamp(0),
        body: kernel::EntryBody::Observation(ObservationDescription::new("t", "d")),
    };
    let id = store.insert(&mut make).unwrap();
    assert_eq!(memory.insert(&mut make).unwrap(), id);
    let mut ghost = store.get(id).unwrap().unwrap();
    ghost.id = LedgerId(99);
    assert!(store.put(ghost.clone()).is_err());
    assert!(memory.put(ghost).is_err());
}

#[test]
fn the_schema_refuses_moving_an_action_backwards() {
    let db = Database::open_in_memory().unwrap();
    let store = db.ledger();
    let id = store
        .insert(&mut pending_entry("gk", 1, action("x", false)))
        .unwrap();
    let mut entry = store.get(id).unwrap().unwrap();
    entry.action_mut().unwrap().state = ActionState::Rejected;
    store.put(entry.clone()).unwrap();
    entry.action_mut().unwrap().state = ActionState::Pending;
    let error = store.put(entry).unwrap_err();
    assert!(error.0.contains("final state"), "{error}");
    assert_eq!(
        store.get(id).unwrap().unwrap().action().unwrap().state,
        ActionState::Rejected
    );
}

/// Issue 42: an ordinary observation makes no commit or sync of its own (it rides in the
/// open transaction with the next commit, or the flusher's); a sensitive one is synced
/// before the kernel answers, and so is the lockdown it latches, and with them every
/// ordinary observation before it.
#[tokio::test]
async fn an_ordinary_observation_rides_with_the_next_commit_and_a_sensitive_one_is_synced() {
    let dir = TempDir::new("observation-syncs");
    let path = dir.join("gate.db");
    let db = Database::open(&path).unwrap();
    let overseer = Overseer::with_store(db.ledger(), Arc::new(StepClock::default()));
    overseer.register(FakeGatekeeper::new("gk")).unwrap();
    let queue = overseer.queue_for("gk", "agent").unwrap();
    let syncs = db.syncs();
    for _ in 0..5 {
        queue
            .authorize_observation(ObservationDescription::new("read", "read"))
            .await
            .unwrap();
    }
    assert_eq!(
        db.syncs() - syncs,
        0,
        "no ordinary observation waits for a sync"
    );

    let syncs = db.syncs();
    queue
        .authorize_observation(ObservationDescription {
            prohibit_all_sharing: true,
            ..ObservationDescription::new("read secrets", "sensitive")
        })
        .await
        .unwrap();
    assert!(db.syncs() > syncs, "a sensitive observation is synced");
    assert!(overseer.is_locked_down().unwrap());
    // Read from another connection, without flushing this one: the sensitive
    // observation's commit carried the five before it.
    let reader = store_sqlite::LedgerReader::open(&path).unwrap();
    assert_eq!(reader.last_id().unwrap(), 6);
    assert!(reader.locked_down().unwrap());
}

//! Each port on PostgreSQL: the ledger, the action store through gatekeeper-core, the
//! key-value port; the schema's version check; an unreachable server.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gatekeeper_confluence::Bytes;
use gatekeeper_core::store::{MAX_OPEN_ACTIONS, PRUNE_EVERY};
use gatekeeper_core::{ActionRecord, ActionState as Record, ActionStorage, StateTag, ToolResult};
use kernel::{
    ActionDescription, ActionKind, ActionState, AutoApprovalRule, DriverActionId, Resolution,
    RuleScope, Timestamp,
};
use serde_json::json;
use store_postgres::{Database, SCHEMA_VERSION, StoreError};

use crate::support::{Rig, auto_kind, fresh, fresh_url, pending_entry};

#[test]
fn the_ledger_keeps_entries_rules_and_the_latch() {
    let (_, db) = fresh();
    let ledger = db.ledger();
    let a = ledger
        .insert(&mut pending_entry(
            "gk",
            7,
            ActionDescription::new("write «7»", "body"),
        ))
        .unwrap();
    let b = ledger
        .insert(&mut pending_entry(
            "gk",
            8,
            ActionDescription::new("write 8", "body"),
        ))
        .unwrap();
    assert_eq!((a.0, b.0), (1, 2));
    assert_eq!(ledger.open_action_ids("gk").unwrap(), [a, b]);
    assert_eq!(
        ledger.find_action("gk", kernel::DriverActionId(8)).unwrap(),
        Some(b)
    );
    assert_eq!(
        ledger
            .find_action("other", kernel::DriverActionId(8))
            .unwrap(),
        None
    );

    let decided = Resolution {
        by: "ana".into(),
        auto: false,
        at: Timestamp(5),
        cause: Some("because".into()),
    };
    assert!(ledger.record_attempt(a, &decided).unwrap());
    let mut entry = ledger.get(a).unwrap().unwrap();
    assert_eq!(entry.action().unwrap().resolution.as_ref(), Some(&decided));
    entry.action_mut().unwrap().state = ActionState::Approved;
    ledger.put(entry.clone()).unwrap();
    assert_eq!(ledger.get(a).unwrap().unwrap(), entry);
    assert!(
        !ledger.record_attempt(a, &decided).unwrap(),
        "a decided action takes no second decider"
    );
    assert_eq!(ledger.open_action_ids("gk").unwrap(), [b]);
    assert!(
        ledger
            .record_attempt(kernel::LedgerId(99), &decided)
            .is_err()
    );

    let rule = AutoApprovalRule::new("gk", auto_kind(), "ana");
    ledger.put_rule(&rule).unwrap();
    assert_eq!(ledger.rules().unwrap(), std::slice::from_ref(&rule));
    assert_eq!(*ledger.rule("gk", "gk:write").unwrap().unwrap(), rule);
    assert!(ledger.remove_rule("gk", "gk:write").unwrap());
    assert!(!ledger.remove_rule("gk", "gk:write").unwrap());

    assert!(!ledger.locked_down().unwrap());
    ledger.latch_lockdown().unwrap();
    ledger.latch_lockdown().unwrap();
    assert!(ledger.locked_down().unwrap());
    assert!(
        db.query_text("DELETE FROM lockdown").is_err(),
        "the latch is never lifted"
    );
    assert!(
        db.query_text("DELETE FROM ledger").is_err(),
        "the ledger is append-only"
    );
}

#[test]
fn the_key_value_port_scans_in_byte_order_and_compares_and_sets_once() {
    let (_, db) = fresh();
    let kv = db.kv("wiki");
    let other = db.kv("other");
    kv.put("page/b", Bytes::from_static(b"2")).unwrap();
    kv.put("page/a", Bytes::from_static(b"1")).unwrap();
    kv.put("page/\u{e9}", Bytes::from_static(b"3")).unwrap();
    kv.put("pagf", Bytes::from_static(b"x")).unwrap();
    other.put("page/z", Bytes::from_static(b"z")).unwrap();
    let keys: Vec<String> = kv
        .scan_prefix("page/")
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(keys, ["page/a", "page/b", "page/\u{e9}"]);
    assert_eq!(kv.get("page/a").unwrap(), Some(Bytes::from_static(b"1")));
    assert!(
        kv.compare_and_set("claim", None, Bytes::from_static(b"mine"))
            .unwrap()
    );
    assert!(
        !kv.compare_and_set("claim", None, Bytes::from_static(b"theirs"))
            .unwrap()
    );
    assert!(
        !kv.compare_and_set("claim", Some(b"other"), Bytes::from_static(b"theirs"))
            .unwrap()
    );
    assert!(
        kv.compare_and_set("claim", Some(b"mine"), Bytes::from_static(b"done"))
            .unwrap()
    );
    assert_eq!(kv.get("claim").unwrap(), Some(Bytes::from_static(b"done")));
    assert!(kv.delete("claim").unwrap());
    assert!(!kv.delete("claim").unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_staged_approved_and_applied_through_the_real_stack_is_sent_once() {
    let (_, db) = fresh();
    let rig = Rig::new(db.clone()).await;
    assert!(rig.gatekeeper.action_kind("createIssue").is_some());
    let outcome = rig.queue_issue("first").await;
    assert!(format!("{outcome:?}").contains("Pending"), "{outcome:?}");
    let open = rig.overseer.open_actions().unwrap();
    assert_eq!(open.len(), 1);
    rig.overseer.approve(open[0].id, "ana").await.unwrap();
    rig.overseer.settle().await;
    assert_eq!(rig.service.calls().len(), 1);
    let entry = rig.overseer.ledger().unwrap().pop().unwrap();
    let action = entry.action().unwrap();
    assert_eq!(action.state, ActionState::Approved);
    assert_eq!(action.resolution.as_ref().unwrap().by, "ana");
    assert!(rig.overseer.approve(open[0].id, "bob").await.is_err());
    assert_eq!(rig.service.calls().len(), 1, "never sent twice");
    let deciding = db
        .query_text("SELECT count(*) FROM ledger WHERE deciding_session IS NOT NULL")
        .unwrap();
    assert_eq!(
        deciding[0][0].as_deref(),
        Some("0"),
        "the outcome ends the decision"
    );
}

#[test]
fn a_newer_schema_is_refused_with_what_to_do_and_an_older_one_is_not_touched_twice() {
    let url = fresh_url();
    let first = Database::open(&url).unwrap();
    // Opening again (a second daemon) finds the schema and leaves it.
    drop(Database::open(&url).unwrap());
    first
        .query_text(&format!(
            "UPDATE gate_schema SET version = {}",
            SCHEMA_VERSION + 1
        ))
        .unwrap();
    let error = Database::open(&url).unwrap_err();
    assert!(matches!(error, StoreError::NewerSchema { .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("newer"), "{message}");
    assert!(message.contains("run the newer build"), "{message}");
}

#[test]
fn a_database_of_another_application_is_refused() {
    let url = fresh_url();
    let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    client
        .batch_execute("CREATE TABLE invoices (id integer)")
        .unwrap();
    let error = Database::open(&url).unwrap_err();
    assert!(matches!(error, StoreError::Foreign { .. }), "{error:?}");
}

#[test]
fn an_unreachable_server_is_refused_with_what_to_check() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let error = Database::open(&format!(
        "postgres://gate:secret@127.0.0.1:{port}/gate?connect_timeout=2"
    ))
    .unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, StoreError::Unreachable { .. }), "{error:?}");
    assert!(
        message.contains("check that PostgreSQL is running"),
        "{message}"
    );
    assert!(
        !message.contains("secret"),
        "the password is not shown: {message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_daemons_claim_is_found_by_a_live_one_without_a_restart() {
    let (url, live) = fresh();
    let dying = Database::open(&url).unwrap();
    let ledger = dying.ledger();
    let store = dying.action_storage("gk");
    let id = store
        .insert_pending(
            Arc::from("write"),
            None,
            Arc::new(serde_json::json!({})),
            Timestamp(1),
            50,
        )
        .await
        .unwrap()
        .unwrap();
    let entry = ledger
        .insert(&mut pending_entry(
            "gk",
            id.0,
            ActionDescription::new("write", "body"),
        ))
        .unwrap();
    let decided = Resolution {
        by: "ana".into(),
        auto: false,
        at: Timestamp(2),
        cause: None,
    };
    assert!(ledger.record_attempt(entry, &decided).unwrap());
    let record = store.get(id).await.unwrap().unwrap();
    let claimed = ActionRecord {
        state: Record::Applying,
        claimed_at: Some(Timestamp(3)),
        ..record
    };
    assert!(
        store
            .compare_and_set(StateTag::Pending, &claimed)
            .await
            .unwrap()
    );
    // The live daemon may not settle a live daemon's claim, nor take over its decision.
    let live_store = live.action_storage("gk");
    let interrupted = claimed.interrupt().unwrap();
    assert!(
        !live_store
            .compare_and_set(StateTag::Applying, &interrupted)
            .await
            .unwrap()
    );
    assert!(!live.ledger().record_attempt(entry, &decided).unwrap());

    // The daemon dies mid-apply (its connections end).
    drop((ledger, store));
    drop(dying);
    let mut changes = live.changes();
    let deadline = Instant::now() + Duration::from_secs(30);
    let settled = loop {
        let entry = live.ledger().get(entry).unwrap().unwrap();
        if entry.action().unwrap().state != ActionState::Pending {
            break entry;
        }
        assert!(
            Instant::now() < deadline,
            "the live daemon never settled the claim"
        );
        let _ = tokio::time::timeout(Duration::from_secs(1), changes.changed()).await;
    };
    let action = settled.action().unwrap();
    assert_eq!(action.state, ActionState::Failed);
    let failure = action.failure.as_ref().unwrap();
    assert!(!failure.retryable);
    assert_eq!(failure.kind, kernel::FailureKind::OutcomeUnknown);
    assert_eq!(
        action.resolution.as_ref().unwrap().by,
        "ana",
        "it still names who decided"
    );
    let record = live_store.get(id).await.unwrap().unwrap();
    assert!(matches!(
        record.state,
        Record::Failed {
            retryable: false,
            ..
        }
    ));
}

#[test]
fn a_rule_keeps_its_time_and_scope_exactly_and_after_a_reopen() {
    let (url, db) = fresh();
    let expected = kernel::testkit::put_scoped_rules(&*db.ledger());
    kernel::testkit::assert_rules(&*db.ledger(), &expected);
    let stored = db
        .query_text(
            "SELECT enabled_at::text, scope_json FROM auto_approval_rules WHERE tag = 'gk:read'",
        )
        .unwrap();
    assert_eq!(stored, [[Some("0".to_owned()), Some("{}".to_owned())]]);
    drop(db);
    kernel::testkit::assert_rules(&*Database::open(&url).unwrap().ledger(), &expected);
}

#[test]
fn a_version_2_database_is_upgraded_and_its_rules_read_as_whole_kinds() {
    let url = fresh_url();
    drop(Database::open(&url).unwrap());
    let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    client
        .batch_execute(
            "ALTER TABLE auto_approval_rules DROP COLUMN enabled_at, DROP COLUMN scope_json;
             UPDATE gate_schema SET version = 2;
             INSERT INTO auto_approval_rules (gatekeeper, tag, label, enabled_by)
                 VALUES ('gk', 'gk:write', 'write', 'carol');",
        )
        .unwrap();
    let db = Database::open(&url).unwrap();
    let rule = AutoApprovalRule::new("gk", ActionKind::new("gk:write", "write"), "carol");
    assert_eq!(rule.scope, RuleScope::default());
    kernel::testkit::assert_rules(&*db.ledger(), std::slice::from_ref(&rule));
    let version = db
        .query_text("SELECT version::text FROM gate_schema")
        .unwrap();
    assert_eq!(version, [[Some(SCHEMA_VERSION.to_string())]]);
    assert!(
        db.query_text("UPDATE auto_approval_rules SET scope_json = 'whole'")
            .is_err(),
        "an upgraded database checks the scope is a JSON object"
    );
    // The scoped rules of the new version are kept exactly.
    let expected = kernel::testkit::put_scoped_rules(&*db.ledger());
    kernel::testkit::assert_rules(&*db.ledger(), &expected);
    // A step that finds its columns already there (a version 2 database a newer build
    // half upgraded by hand) adds nothing and loses nothing.
    client
        .batch_execute("UPDATE gate_schema SET version = 2")
        .unwrap();
    drop(db);
    kernel::testkit::assert_rules(&*Database::open(&url).unwrap().ledger(), &expected);
}

/// Move staged call `id` of `storage` from pending to `state`, through a claim for an
/// outcome.
async fn settle(storage: &dyn ActionStorage, id: DriverActionId, state: Record) {
    let record = storage.get(id).await.unwrap().unwrap();
    let record = if state == Record::Rejected {
        record
    } else {
        let claimed = ActionRecord {
            state: Record::Applying,
            claimed_at: Some(Timestamp(3)),
            ..record
        };
        assert!(
            storage
                .compare_and_set(StateTag::Pending, &claimed)
                .await
                .unwrap()
        );
        claimed
    };
    let from = record.state.tag();
    assert!(
        storage
            .compare_and_set(from, &ActionRecord { state, ..record })
            .await
            .unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_of_a_pending_call_is_kept_and_of_any_other_refused() {
    let (url, db) = fresh();
    let storage = db.action_storage("gk");
    let mut staged = Vec::new();
    for n in 0..3 {
        let args = Arc::new(json!({ "path": "/tmp/a", "n": n }));
        let id = storage
            .insert_pending(Arc::from("write"), None, args, Timestamp(1), 50)
            .await
            .unwrap()
            .unwrap();
        staged.push(id);
    }
    let [pending, applied, rejected] = staged[..] else {
        unreachable!()
    };
    // Recorded by the kernel, so that opening again keeps it.
    db.ledger()
        .insert(&mut pending_entry(
            "gk",
            pending.0,
            ActionDescription::new("write", "body"),
        ))
        .unwrap();
    let result = Arc::new(ToolResult::from_text("done"));
    settle(&*storage, applied, Record::Applied { result }).await;
    settle(&*storage, rejected, Record::Rejected).await;
    let records = |storage: Arc<dyn ActionStorage>| async move {
        let mut records = Vec::new();
        for id in [pending, applied, rejected] {
            records.push(storage.get(id).await.unwrap().unwrap());
        }
        records
    };
    let before = records(storage.clone()).await;
    let edited = json!({"path": "/tmp/a/b", "count": 3});
    gatekeeper_core::testkit::an_edit_changes_only_a_pending_call(
        &*storage,
        pending,
        &[applied, rejected, DriverActionId(99)],
        edited.clone(),
    )
    .await;
    let mut expected = before;
    expected[0].args = Arc::new(edited);
    assert_eq!(records(storage.clone()).await, expected);
    // Another daemon, opened after this one is gone, reads the edit.
    drop((storage, db));
    let db = Database::open(&url).unwrap();
    let storage = db.action_storage("gk");
    assert_eq!(records(storage.clone()).await, expected);
    assert_eq!(
        storage.get(pending).await.unwrap().unwrap().state,
        Record::Pending
    );
}

#[tokio::test]
async fn one_cycle_is_three_commits_and_the_claim_and_its_decider_are_committed_before_the_send() {
    let (url, db) = fresh();
    let rig = Rig::new(db.clone()).await;
    // What another daemon sees while the call is in flight.
    let other = Database::open(&url).unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    *rig.service.on_call.lock().unwrap() = Some(Box::new(move |_, _| {
        record.lock().unwrap().extend(
            other
                .query_text(
                    "SELECT a.state, l.resolved_by, l.deciding_session IS NOT NULL
                     FROM actions a JOIN ledger l ON l.driver_id = a.id AND l.gatekeeper = a.gatekeeper",
                )
                .unwrap(),
        );
    }));
    let commits = db.commits();
    rig.queue_issue("first").await;
    let staged = db.commits() - commits;
    let open = rig.overseer.open_actions().unwrap();
    rig.overseer.approve(open[0].id, "ana").await.unwrap();
    rig.overseer.settle().await;
    assert_eq!(rig.service.calls().len(), 1);
    assert_eq!(
        *seen.lock().unwrap(),
        [[
            Some("applying".to_owned()),
            Some("ana".to_owned()),
            Some("t".to_owned())
        ]],
        "the claim and who decided are committed before the send"
    );
    assert_eq!(staged, 1, "the stage and the submission share a commit");
    assert_eq!(
        db.commits() - commits,
        3,
        "stage with submission, decider with claim, driver's outcome with the kernel's"
    );
    let settled = db
        .query_text(
            "SELECT a.state, l.state, l.deciding_session IS NULL
             FROM actions a JOIN ledger l ON l.driver_id = a.id AND l.gatekeeper = a.gatekeeper",
        )
        .unwrap();
    assert_eq!(
        settled,
        [[
            Some("applied".to_owned()),
            Some("approved".to_owned()),
            Some("t".to_owned())
        ]]
    );
}

#[test]
fn a_version_3_database_is_upgraded_and_a_latch_reaches_every_daemon() {
    let url = fresh_url();
    drop(Database::open(&url).unwrap());
    let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    // Version 3 as it was: no latch notification, payloads without the writer's session.
    client
        .batch_execute(
            "DROP TRIGGER lockdown_changed ON lockdown;
             CREATE OR REPLACE FUNCTION gate_notify_change() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 PERFORM pg_notify('gate_changes', TG_TABLE_NAME);
                 RETURN NULL;
             END $$;
             UPDATE gate_schema SET version = 3;",
        )
        .unwrap();
    let first = Database::open(&url).unwrap();
    let version = first
        .query_text("SELECT version::text FROM gate_schema")
        .unwrap();
    assert_eq!(version, [[Some(SCHEMA_VERSION.to_string())]]);
    let second = Database::open(&url).unwrap();
    let (a, b) = (first.ledger(), second.ledger());
    let id = a
        .insert(&mut pending_entry(
            "gk",
            1,
            ActionDescription::new("write", "body"),
        ))
        .unwrap();
    assert!(!b.locked_down().unwrap());
    a.latch_lockdown().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !b.locked_down().unwrap() {
        assert!(
            Instant::now() < deadline,
            "the latch never reached the other daemon"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Whatever a daemon remembers, the statement that records who decides refuses.
    let decided = Resolution {
        by: "ana".into(),
        auto: false,
        at: Timestamp(1),
        cause: None,
    };
    let refused = b.record_attempt(id, &decided).unwrap_err();
    assert!(refused.0.contains("lockdown"), "{refused}");
    // A step that finds its trigger already there (a half upgrade) is run again safely.
    client
        .batch_execute("UPDATE gate_schema SET version = 3")
        .unwrap();
    drop((first, second));
    let reopened = Database::open(&url).unwrap();
    assert!(reopened.ledger().locked_down().unwrap());
}

/// A new database where `count` actions were staged, approved by a person and applied, one
/// at a time, through the real stack; the daemon's connections have ended, and with them
/// the statistics they had not sent yet.
async fn applied_through_a_daemon_that_ended(count: u64) -> String {
    let (url, db) = fresh();
    let rig = Rig::new(db.clone()).await;
    for n in 0..count {
        rig.queue_issue(&format!("issue {n}")).await;
        let open = rig.overseer.open_actions().unwrap();
        rig.overseer.approve(open[0].id, "ana").await.unwrap();
        rig.overseer.settle().await;
    }
    assert_eq!(rig.service.calls().len() as u64, count);
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_and_outcomes_read_only_their_own_ledger_entry_in_a_database_without_statistics()
{
    // A new database has no statistics yet, and each connection keeps the plans it made
    // then (generic ones after five runs of a statement) until the server analyses the
    // tables, a minute or more later. An outcome must still find its entry by id, not by
    // reading every action's entry, or each costs more than the one before.
    const ACTIONS: u64 = 80;
    let url = applied_through_a_daemon_that_ended(ACTIONS).await;
    let read_in_partial = off_runtime(|| {
        let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        once_counted(
            &mut client,
            "SELECT (SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'ledger'),
                    (SELECT sum(idx_tup_read)::bigint FROM pg_stat_user_indexes
                      WHERE indexrelname IN ('ledger_by_driver', 'ledger_open'))",
            // Each action's entry is updated twice: who decides, then the outcome.
            |row| {
                let (updated, read): (i64, Option<i64>) = (row.get(0), row.get(1));
                (updated >= 2 * ACTIONS as i64).then(|| read.unwrap_or(0) as u64)
            },
        )
    });
    // Looking an action up by its driver's id reads one entry of `ledger_by_driver`, a
    // person's list the open entries of `ledger_open` (one here); a scan of either for
    // each decision or outcome reads about ACTIONS² / 2.
    assert!(
        read_in_partial < 8 * ACTIONS,
        "{read_in_partial} entries of the ledger's partial indexes read for {ACTIONS} actions"
    );
}

/// The error a statement of `client` ended with, as the server worded it.
/// Run `sql` (one row) until `arrived` finds in it what it waits for, and return that: a
/// connection sends the server the statistics it counted as it ends, so they arrive a
/// little after it.
fn once_counted<T>(
    client: &mut postgres::Client,
    sql: &str,
    mut arrived: impl FnMut(&postgres::Row) -> Option<T>,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(value) = arrived(&client.query_one(sql, &[]).unwrap()) {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "the server's statistics never arrived: {sql}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Run `work` on a thread of its own: the blocking client must not run on a test's runtime.
fn off_runtime<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| scope.spawn(work).join().unwrap())
}

/// What statements read of the table `t` (a row of `pg_stat_user_tables`): its index entries
/// and the rows of its sequential scans, as the server's statistics count them.
const READ_OF: &str = "(SELECT sum(idx_tup_read)::bigint FROM pg_stat_user_indexes i
     WHERE i.relid = t.relid) + t.seq_tup_read";

fn refusal(client: &mut postgres::Client, statement: &str) -> String {
    let error = client
        .batch_execute(statement)
        .expect_err(&format!("refused: {statement}"));
    error
        .as_db_error()
        .map_or_else(|| error.to_string(), |db| db.message().to_owned())
}

#[test]
fn the_schema_refuses_rows_that_break_its_rules_and_lets_states_only_move_forward() {
    let url = fresh_url();
    drop(Database::open(&url).unwrap());
    let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let entry = |id: i64, extra: &str, values: &str| {
        format!(
            "INSERT INTO ledger (id, kind, gatekeeper, caller, created_at, description_json{extra})
             VALUES ({id}, {values})"
        )
    };
    let action = |id: i64, state: &str| {
        entry(
            id,
            ", driver_id, state, depends_on_json, restart_requested",
            &format!("'action', 'gk', 'agent', 0, '{{}}', {id}, '{state}', '[]', false"),
        )
    };
    client.batch_execute(&action(1, "pending")).unwrap();
    client
        .batch_execute(&entry(2, "", "'observation', 'gk', 'agent', 0, '{}'"))
        .unwrap();

    // The shape of an entry.
    let shape = refusal(&mut client, &action(3, "done"));
    assert!(shape.contains("not the shape of an action"), "{shape}");
    let observed = refusal(
        &mut client,
        &entry(
            4,
            ", state",
            "'observation', 'gk', 'agent', 0, '{}', 'pending'",
        ),
    );
    assert!(observed.contains("not the shape"), "{observed}");
    let json = refusal(
        &mut client,
        &entry(5, "", "'observation', 'gk', 'agent', 0, '[1]'"),
    );
    assert!(json.contains("not a JSON object"), "{json}");
    let range = refusal(
        &mut client,
        &entry(0, "", "'observation', 'gk', 'agent', 0, '{}'"),
    );
    assert!(range.contains("out of range"), "{range}");
    let partial = refusal(
        &mut client,
        "UPDATE ledger SET state = 'failed', failure = 'boom' WHERE id = 1",
    );
    assert!(partial.contains("only in part"), "{partial}");
    let dependencies = refusal(
        &mut client,
        "UPDATE ledger SET depends_on_json = '{}' WHERE id = 1",
    );
    assert!(dependencies.contains("not a JSON array"), "{dependencies}");

    // States move forward only, and entries stay.
    client
        .batch_execute(
            "UPDATE ledger SET state = 'approved', resolved_by = 'ana', auto_approved = false,
                 resolved_at = 1 WHERE id = 1",
        )
        .unwrap();
    let back = refusal(
        &mut client,
        "UPDATE ledger SET state = 'pending' WHERE id = 1",
    );
    assert!(back.contains("cannot leave a final state"), "{back}");
    let gone = refusal(&mut client, "DELETE FROM ledger WHERE id = 2");
    assert!(gone.contains("never deleted"), "{gone}");

    // The action store's rows.
    let call = |id: i64, args: &str| {
        format!(
            "INSERT INTO actions (gatekeeper, id, tool, args_json, state, submitted_at)
             VALUES ('gk', {id}, 'write', '{args}', 'pending', 0)"
        )
    };
    client.batch_execute(&call(1, "{}")).unwrap();
    let args = refusal(&mut client, &call(2, "[]"));
    assert!(args.contains("not a JSON object"), "{args}");
    let failed = refusal(
        &mut client,
        "UPDATE actions SET state = 'failed', error = 'boom' WHERE id = 1",
    );
    assert!(
        failed.contains("not the shape of its state failed"),
        "{failed}"
    );
    let result = refusal(
        &mut client,
        "UPDATE actions SET state = 'applied', result_json = 'not json' WHERE id = 1",
    );
    assert!(result.contains("json"), "{result}");
    client
        .batch_execute(
            "UPDATE actions SET state = 'applied', result_json = '{\"ok\":true}' WHERE id = 1",
        )
        .unwrap();
}

#[test]
fn a_version_4_database_keeps_its_rows_and_checks_its_rules_with_triggers() {
    let (url, db) = fresh();
    let ledger = db.ledger();
    let id = ledger
        .insert(&mut pending_entry(
            "gk",
            7,
            ActionDescription::new("write 7", "body"),
        ))
        .unwrap();
    drop((ledger, db));
    // Back to version 4 by hand: its CHECK constraints, its trigger of states and its
    // ledger notification without servers.
    let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    client
        .batch_execute(
            "DROP TRIGGER ledger_rows ON ledger; DROP TRIGGER ledger_json ON ledger;
             DROP TRIGGER actions_rows ON actions; DROP TRIGGER actions_json ON actions;
             CREATE TRIGGER ledger_changed AFTER INSERT OR UPDATE ON ledger
                 FOR EACH STATEMENT EXECUTE FUNCTION gate_notify_change();
             ALTER TABLE ledger ADD CHECK (id > 0),
                 ADD CHECK (jsonb_typeof(description_json::jsonb) = 'object');
             ALTER TABLE actions ADD CHECK (jsonb_typeof(args_json::jsonb) = 'object');
             CREATE FUNCTION gate_ledger_states_move_forward() RETURNS trigger
                 LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;
             CREATE TRIGGER ledger_states_move_forward BEFORE UPDATE OF state ON ledger
                 FOR EACH ROW EXECUTE FUNCTION gate_ledger_states_move_forward();
             CREATE OR REPLACE FUNCTION gate_stage(p_gatekeeper text, p_tool text,
                 p_args text, p_at bigint, p_session integer, p_definition text,
                 p_max_open bigint) RETURNS bigint LANGUAGE sql AS $$ SELECT NULL::bigint $$;
             UPDATE gate_schema SET version = 4;",
        )
        .unwrap();
    for _ in 0..2 {
        // The second time, a half upgrade: the step runs again over its own work.
        let db = Database::open(&url).unwrap();
        let version = db
            .query_text("SELECT version::text FROM gate_schema")
            .unwrap();
        assert_eq!(version, [[Some(SCHEMA_VERSION.to_string())]]);
        let checks = db
            .query_text(
                "SELECT count(*)::text FROM pg_constraint WHERE contype = 'c'
                 AND conrelid IN ('ledger'::regclass, 'actions'::regclass)",
            )
            .unwrap();
        assert_eq!(checks, [[Some("0".to_owned())]], "no CHECK is left");
        let triggers = db
            .query_text(
                "SELECT string_agg(tgname::text, ' ' ORDER BY tgname) FROM pg_trigger
                 WHERE NOT tgisinternal AND tgrelid IN ('ledger'::regclass, 'actions'::regclass)",
            )
            .unwrap();
        assert_eq!(
            triggers,
            [[Some(
                "actions_changed actions_json actions_rows ledger_is_append_only ledger_json \
                 ledger_rows"
                    .to_owned()
            )]]
        );
        assert!(db.ledger().get(id).unwrap().is_some(), "the entry is kept");
        let stage = db
            .query_text("SELECT (prosrc LIKE '%SKIP LOCKED%')::text FROM pg_proc WHERE proname = 'gate_stage'")
            .unwrap();
        assert_eq!(
            stage,
            [[Some("true".to_owned())]],
            "gate_stage is version 6's"
        );
        let title = db.query_text("SELECT title FROM ledger_view").unwrap();
        assert_eq!(title, [[Some("write 7".to_owned())]]);
        drop(db);
        client
            .batch_execute("UPDATE gate_schema SET version = 4")
            .unwrap();
    }
    let back = refusal(
        &mut client,
        &format!("UPDATE ledger SET driver_id = NULL WHERE id = {}", id.0),
    );
    assert!(back.contains("not the shape of an action"), "{back}");
}

#[test]
fn what_a_dead_daemon_left_is_settled_and_what_a_live_one_holds_is_not() {
    let (url, live) = fresh();
    let alive = live
        .query_text(
            "SELECT objid::text FROM pg_locks WHERE locktype = 'advisory'
             AND classid = 18259 AND objsubid = 2 AND granted
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
        .unwrap();
    let [row] = &alive[..] else {
        panic!("one live session: {alive:?}");
    };
    let session = row[0].as_deref().unwrap();
    // Session 9999 never was: whatever names it was left by a daemon that is gone.
    let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    client
        .batch_execute(&format!(
            "INSERT INTO action_ids VALUES ('gk', 4);
             INSERT INTO actions (gatekeeper, id, tool, args_json, state, submitted_at, staged_by)
                 VALUES ('gk', 1, 'write', '{{}}', 'pending', 0, 9999),
                        ('gk', 3, 'write', '{{}}', 'pending', 0, {session});
             INSERT INTO actions (gatekeeper, id, tool, args_json, state, submitted_at,
                     claimed_at, claimed_by, staged_by, result_json)
                 VALUES ('gk', 2, 'write', '{{}}', 'applied', 0, 1, 9999, 9999,
                     '{{\"content\":[]}}');
             -- Rejected by the dead daemon after a try the live one claimed and failed.
             INSERT INTO actions (gatekeeper, id, tool, args_json, state, submitted_at,
                     claimed_at, claimed_by, staged_by)
                 VALUES ('gk', 4, 'write', '{{}}', 'rejected', 0, 1, {session}, {session});
             INSERT INTO ledger (id, kind, gatekeeper, caller, created_at, description_json,
                     driver_id, state, depends_on_json, restart_requested, resolved_by,
                     auto_approved, resolved_at, deciding_session)
                 VALUES (1, 'action', 'gk', 'agent', 0, '{{}}', 2, 'pending', '[]', false,
                     'ana', false, 1, 9999);
             INSERT INTO ledger (id, kind, gatekeeper, caller, created_at, description_json,
                     driver_id, state, depends_on_json, restart_requested, resolved_by,
                     auto_approved, resolved_at, failure, failure_retryable, failure_kind,
                     deciding_session)
                 VALUES (2, 'action', 'gk', 'agent', 0, '{{}}', 4, 'failed', '[]', false,
                     'ana', false, 1, 'busy', true, 'not_sent', 9999);
             SELECT pg_notify('gate_changes', 'actions');"
        ))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let states = live
            .query_text(
                "SELECT (SELECT string_agg(id || ':' || state, ' ' ORDER BY id) FROM actions),
                        (SELECT string_agg(id || ':' || state, ' ' ORDER BY id) FROM ledger),
                        (SELECT last_id::text FROM action_ids)",
            )
            .unwrap();
        let settled = [[
            Some("2:applied 3:pending 4:rejected".to_owned()),
            Some("1:approved 2:rejected".to_owned()),
            Some("4".to_owned()),
        ]];
        if states == settled {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the dead daemon's unrecorded stage is discarded, its applied and rejected calls' \
             entries move forward, the live daemon's stage stays: {states:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `gate_stage` (schema version 6) when another stage holds the store's id row: it waits
/// for that stage and counts what it committed, or, when the store is already full,
/// refuses at once. A stage that found the row free counts once (the cost is the team
/// bench's to show; the cap tests of `two_connections` check that count).
#[test]
fn a_stage_behind_another_waits_and_counts_it_or_refuses_a_full_store_at_once() {
    let (url, _db) = fresh();
    const STAGE: &str = "SELECT gate_stage('gk', 'write', '{}', 1, NULL, NULL, 2)";
    let connect = || postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let mut holder = connect();
    holder.batch_execute("BEGIN").unwrap();
    let first: Option<i64> = holder.query_one(STAGE, &[]).unwrap().get(0);
    assert_eq!(first, Some(1));
    let waiter = std::thread::spawn({
        let mut client = connect();
        move || -> Option<i64> { client.query_one(STAGE, &[]).unwrap().get(0) }
    });
    // Until the waiter is seen waiting for the holder's lock.
    let mut watcher = connect();
    while watcher
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
             AND query LIKE '%gate_stage%' AND pid <> pg_backend_pid()",
            &[],
        )
        .unwrap()
        .get::<_, i64>(0)
        == 0
    {
        assert!(
            !waiter.is_finished(),
            "the second stage did not wait for the first"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // The holder fills the store before it commits.
    let second: Option<i64> = holder.query_one(STAGE, &[]).unwrap().get(0);
    assert_eq!(second, Some(2));
    holder.batch_execute("COMMIT").unwrap();
    assert_eq!(
        waiter.join().unwrap(),
        None,
        "the waiting stage counted what the holder committed while it waited"
    );
    // Behind a holder of the id row, a stage is refused without
    // waiting (a wait would end in the lock timeout's error).
    holder
        .batch_execute("BEGIN; SELECT last_id FROM action_ids WHERE gatekeeper = 'gk' FOR UPDATE")
        .unwrap();
    let mut behind = connect();
    behind.batch_execute("SET lock_timeout = '20ms'").unwrap();
    let refused: Option<i64> = behind.query_one(STAGE, &[]).unwrap().get(0);
    assert_eq!(refused, None, "a full store is refused at once");
    holder.batch_execute("ROLLBACK").unwrap();
    // And with the row free, a full store is refused after the one count.
    let refused: Option<i64> = behind.query_one(STAGE, &[]).unwrap().get(0);
    assert_eq!(refused, None);
    let ids = behind
        .query_one(
            "SELECT last_id FROM action_ids WHERE gatekeeper = 'gk'",
            &[],
        )
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(ids, 2, "a refused stage hands out no id");
}

/// A new database, its action store `gk`, a client of its own to look and prepare, and
/// a runtime to call the store's port from a test without one.
fn one_store() -> (
    Database,
    Arc<dyn ActionStorage>,
    postgres::Client,
    tokio::runtime::Runtime,
) {
    let (url, db) = fresh();
    let storage = db.action_storage("gk");
    let client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    (db, storage, client, runtime)
}

/// A call staged in `storage` from a test without a runtime (left parked for its entry).
fn staged(runtime: &tokio::runtime::Runtime, storage: &Arc<dyn ActionStorage>) -> DriverActionId {
    runtime
        .block_on(storage.insert_pending(
            Arc::from("write"),
            None,
            Arc::new(json!({})),
            Timestamp(2),
            50,
        ))
        .unwrap()
        .expect("staged")
}

/// Retention keeps a store's newest settled calls and reads each of its rows about once,
/// also with the plans a connection makes before the server has statistics (a new
/// database): a prune that ran its subquery once per row read the store squared.
#[test]
fn retention_keeps_the_newest_settled_calls_and_reads_each_row_once_without_statistics() {
    const ROUNDS: i64 = 20;
    const KEEP: usize = 100;
    let (db, storage, mut client, runtime) = one_store();
    let mut pruned = 0;
    for round in 0..ROUNDS {
        // Fifteen settled calls and one that waits for a retry, which is kept.
        client
            .execute(
                "INSERT INTO actions (gatekeeper, id, tool, args_json, state, submitted_at,
                     retryable, error)
                 SELECT 'gk', $1::bigint * 16 + n, 'write', '{}',
                     CASE WHEN n = 16 THEN 'failed' ELSE 'rejected' END, 1,
                     CASE WHEN n = 16 THEN true END, CASE WHEN n = 16 THEN 'busy' END
                 FROM generate_series(1, 16) AS n",
                &[&round],
            )
            .unwrap();
        pruned += runtime.block_on(storage.prune_final(KEEP)).unwrap();
    }
    assert_eq!(pruned, ROUNDS as usize * 15 - KEEP);
    let mut kept = |state: &str| -> i64 {
        client
            .query_one("SELECT count(*) FROM actions WHERE state = $1", &[&state])
            .unwrap()
            .get(0)
    };
    assert_eq!(kept("rejected"), KEEP as i64);
    assert_eq!(
        kept("failed"),
        ROUNDS,
        "a call that may be tried again is kept"
    );
    let oldest: i64 = client
        .query_one("SELECT min(id) FROM actions WHERE state = 'rejected'", &[])
        .unwrap()
        .get(0);
    // Fifteen settled calls a round: the last six rounds' 90, and the newest ten of the
    // round before (ids 16 × round + 1 to 15).
    assert_eq!(
        oldest,
        16 * (ROUNDS - 7) + 6,
        "the newest settled calls are the ones kept"
    );
    // The handle's connection ends, and with it the statistics it had not sent yet.
    drop((storage, db));
    let read = once_counted(
        &mut client,
        &format!(
            "SELECT {READ_OF}, n_tup_del FROM pg_stat_user_tables t WHERE relname = 'actions'"
        ),
        |row| (row.get::<_, i64>(1) >= pruned as i64).then(|| row.get::<_, i64>(0)),
    );
    // Each prune reads the store's rows a few times at most (up to 116 here), not once
    // for each of them.
    assert!(
        read < ROUNDS * 4 * 120,
        "{read} rows of `actions` read by {ROUNDS} prunes"
    );
}

/// Retention as the action store runs it (`retain_final`, every sixteenth call settled)
/// rides in the next stage's transaction, behind the stage in its round trip: no round
/// trip or commit of its own. A deletion that fails is undone alone: the stage stands,
/// and the next stage deletes. Without stages here it runs on its own.
#[test]
fn retention_rides_with_the_next_stage_and_a_failed_one_leaves_the_stage_standing() {
    const KEEP: usize = 100;
    let (db, storage, mut client, runtime) = one_store();
    let settle = |client: &mut postgres::Client, from: i64, to: i64| {
        client
            .execute(
                "INSERT INTO actions (gatekeeper, id, tool, args_json, state, submitted_at)
                 SELECT 'gk', n, 'write', '{}', 'rejected', 1 FROM generate_series($1::bigint, $2::bigint) n",
                &[&from, &to],
            )
            .unwrap();
        client
            .execute(
                "INSERT INTO action_ids VALUES ('gk', $1)
                 ON CONFLICT (gatekeeper) DO UPDATE SET last_id = $1",
                &[&to],
            )
            .unwrap();
    };
    let settled = |client: &mut postgres::Client| -> (i64, i64) {
        let row = client
            .query_one(
                "SELECT count(*), min(id) FROM actions WHERE state = 'rejected'",
                &[],
            )
            .unwrap();
        (row.get(0), row.get(1))
    };
    // A stage and the commit of its parked transaction, as the store's one connection
    // makes them; what they cost.
    let stage = || {
        let (trips, commits) = (db.round_trips(), db.commits());
        let id = staged(&runtime, &storage);
        db.commit_deferred().unwrap();
        (id, db.round_trips() - trips, db.commits() - commits)
    };
    settle(&mut client, 1, 120);
    stage();
    // The deletion's statement prepared; a store of 121 calls keeps all of them.
    assert_eq!(runtime.block_on(storage.prune_final(1000)).unwrap(), 0);
    let (_, plain_trips, plain_commits) = stage();
    assert_eq!(
        (plain_trips, plain_commits),
        (2, 1),
        "the stage, then its COMMIT"
    );

    let (trips, commits) = (db.round_trips(), db.commits());
    runtime.block_on(storage.retain_final(KEEP)).unwrap();
    assert_eq!((db.round_trips(), db.commits()), (trips, commits));
    assert_eq!(
        settled(&mut client),
        (120, 1),
        "nothing deleted before a stage"
    );
    let (_, trips, commits) = stage();
    assert_eq!(
        (trips, commits),
        (plain_trips, plain_commits),
        "the deletion rode in the stage's round trip and commit"
    );
    assert_eq!(settled(&mut client), (100, 21), "the newest 100 are kept");

    settle(&mut client, 124, 139);
    client
        .batch_execute(
            "CREATE FUNCTION refuse_deletes() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN RAISE EXCEPTION 'no deletes today'; END $$;
             CREATE TRIGGER refuse_deletes BEFORE DELETE ON actions
                 FOR EACH ROW EXECUTE FUNCTION refuse_deletes();",
        )
        .unwrap();
    runtime.block_on(storage.retain_final(KEEP)).unwrap();
    let (id, trips, commits) = stage();
    assert_eq!(
        (trips, commits),
        (plain_trips + 1, plain_commits),
        "the failed deletion undone alone, one more round trip"
    );
    let state: String = client
        .query_one(
            "SELECT state FROM actions WHERE gatekeeper = 'gk' AND id = $1",
            &[&i64::try_from(id.0).unwrap()],
        )
        .unwrap()
        .get(0);
    assert_eq!(state, "pending", "the stage stands");
    assert_eq!(settled(&mut client), (116, 21), "nothing deleted");

    client
        .batch_execute("DROP TRIGGER refuse_deletes ON actions")
        .unwrap();
    let (_, trips, _) = stage();
    assert_eq!(
        trips, plain_trips,
        "the next stage deletes, in its round trip"
    );
    assert_eq!(settled(&mut client), (100, 37));

    // A handle that settles what others stage: asked for more often than the calls open
    // at once (50) could settle between two of its stages (every 16th call settled), a
    // retention runs on its own.
    settle(&mut client, 142, 157);
    let alone_at = MAX_OPEN_ACTIONS / PRUNE_EVERY + 2;
    for _ in 1..alone_at {
        runtime.block_on(storage.retain_final(KEEP)).unwrap();
    }
    assert_eq!(settled(&mut client), (116, 37), "due with the next stage");
    let (trips, commits) = (db.round_trips(), db.commits());
    runtime.block_on(storage.retain_final(KEEP)).unwrap();
    assert_eq!(
        settled(&mut client),
        (100, 53),
        "no stage came: deleted now"
    );
    assert_eq!((db.round_trips() - trips, db.commits() - commits), (1, 1));
}

/// The drain's read of a server's open entries (and a person's list) commits what this
/// daemon parked with a ledger write first, so it reads its own writes, but leaves a
/// stage parked for its entry: committed early, the stage would cost that entry a commit
/// of its own.
#[test]
fn reading_open_entries_leaves_a_parked_stage_to_commit_with_its_entry() {
    let (db, storage, mut client, runtime) = one_store();
    let ledger = db.ledger();
    let earlier = ledger
        .insert(&mut pending_entry(
            "gk",
            1000,
            ActionDescription::new("w", "b"),
        ))
        .unwrap();
    let id = staged(&runtime, &storage);
    let commits = db.commits();
    assert_eq!(ledger.open_action_ids("gk").unwrap(), [earlier]);
    assert_eq!(ledger.open_actions("gk").unwrap().len(), 1);
    let committed = |client: &mut postgres::Client| -> i64 {
        client
            .query_one("SELECT count(*) FROM actions", &[])
            .unwrap()
            .get(0)
    };
    assert_eq!(committed(&mut client), 0, "the stage is still parked");
    ledger
        .insert(&mut pending_entry(
            "gk",
            id.0,
            ActionDescription::new("w", "b"),
        ))
        .unwrap();
    assert_eq!(
        db.commits() - commits,
        1,
        "the stage and its entry, one commit"
    );
    assert_eq!(committed(&mut client), 1);
}

/// The check every daemon runs every `RECOVERY_INTERVAL` reads what the action store
/// keeps (its open calls and the newest settled ones), not every action the ledger ever
/// recorded, also with the plans a connection makes before the server has statistics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recovery_check_reads_the_kept_calls_not_the_whole_ledger() {
    const ACTIONS: i64 = 400;
    const CHECKS: i64 = 10;
    let url = applied_through_a_daemon_that_ended(ACTIONS as u64).await;
    // What was read of the ledger and of the action store, and how many connections
    // other than the reader's are open.
    let reads = format!(
        "SELECT (SELECT {READ_OF} FROM pg_stat_user_tables t WHERE relname = 'ledger'),
                (SELECT {READ_OF} FROM pg_stat_user_tables t WHERE relname = 'actions'),
                (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
                  AND backend_type = 'client backend' AND pid <> pg_backend_pid())"
    );
    // What was read once every connection but the reader's has ended and two reads in a
    // row agree: a connection sends what it counted as it ends, just after it leaves
    // `pg_stat_activity`. The checks' reads of the action store must have arrived.
    let settled = |client: &mut postgres::Client, actions_after: i64| -> [i64; 2] {
        let mut last = None;
        once_counted(client, &reads, |row| {
            let now = [row.get::<_, i64>(0), row.get::<_, i64>(1)];
            let quiet = row.get::<_, i64>(2) == 0 && now[1] > actions_after;
            let same = last.replace(now) == Some(now);
            (quiet && same).then_some(now)
        })
    };
    let read = off_runtime(|| {
        let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let [ledger_before, actions_before] = settled(&mut client, -1);
        let checker = Database::open(&url).unwrap();
        for _ in 0..CHECKS {
            assert_eq!(checker.recover().unwrap(), 0, "nothing to settle");
        }
        drop(checker);
        settled(&mut client, actions_before)[0] - ledger_before
    });
    // A check that reads the ledger reads each of its entries twice, 2 × ACTIONS; one
    // that reads the calls the store keeps, about 116. The checker also checks once as it
    // opens, and every `RECOVERY_INTERVAL` on a thread of its own.
    assert!(
        read < CHECKS * ACTIONS,
        "{CHECKS} recovery checks read {read} entries of a ledger of {ACTIONS} actions"
    );
}

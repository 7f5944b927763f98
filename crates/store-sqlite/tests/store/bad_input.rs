//! Bad input: a corrupt or truncated file, a newer schema, a stranger's database, a
//! read-only location, a full disk. Each is a clear error, and nothing already stored is
//! lost or changed. An older schema is upgraded on open, keeping its records.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use kernel::{
    ActionDescription, ActionKind, AutoApprovalRule, DriverActionId, EntryBody, FailureKind,
    LedgerEntry, ObservationDescription, RuleScope, Timestamp,
};
use store_sqlite::{Database, SCHEMA_VERSION, StoreError};

use crate::support::TempDir;

fn observation(text: &str) -> impl FnMut(kernel::LedgerId) -> LedgerEntry + '_ {
    move |id| LedgerEntry {
        id,
        gatekeeper: Arc::from("gk"),
        caller: Arc::from("agent"),
        created_at: Timestamp(id.0),
        body: EntryBody::Observation(ObservationDescription::new(format!("read {id}"), text)),
    }
}

/// A database file holding `n` observations, closed (so its log is checkpointed).
fn filled(path: &Path, n: usize) {
    let db = Database::open(path).unwrap();
    let ledger = db.ledger();
    let text = "x".repeat(300);
    for _ in 0..n {
        ledger.insert(&mut observation(&text)).unwrap();
    }
}

fn count(path: &Path) -> usize {
    Database::open(path)
        .unwrap()
        .ledger()
        .entries()
        .unwrap()
        .len()
}

#[test]
fn a_file_that_is_not_a_database_is_refused_and_left_alone() {
    let dir = TempDir::new("garbage");
    let path = dir.join("gate.db");
    let garbage: Vec<u8> = b"this is a shopping list, not a database\n".repeat(200);
    std::fs::write(&path, &garbage).unwrap();
    let error = Database::open(&path).unwrap_err();
    assert!(matches!(error, StoreError::Corrupt { .. }), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains("damaged or is not a database"),
        "{message}"
    );
    assert!(message.contains("restore it from a backup"), "{message}");
    assert_eq!(std::fs::read(&path).unwrap(), garbage);
}

#[test]
fn a_truncated_file_is_refused_and_left_alone() {
    let dir = TempDir::new("truncated");
    let path = dir.join("gate.db");
    filled(&path, 200);
    let full = std::fs::read(&path).unwrap();
    assert!(full.len() > 64 * 1024, "expected a multi-page file");
    let cut = &full[..full.len() * 6 / 10];
    std::fs::write(&path, cut).unwrap();
    let error = Database::open(&path).unwrap_err();
    assert!(matches!(error, StoreError::Corrupt { .. }), "{error:?}");
    assert!(error.to_string().contains("nothing was changed"), "{error}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        cut,
        "the failed open wrote to the file"
    );

    // Putting the whole file back brings every record back.
    std::fs::write(&path, &full).unwrap();
    assert_eq!(count(&path), 200);
}

#[test]
fn a_file_from_a_newer_schema_is_refused_and_left_alone() {
    let dir = TempDir::new("newer");
    let path = dir.join("gate.db");
    filled(&path, 3);
    {
        let raw = rusqlite::Connection::open(&path).unwrap();
        raw.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    let error = Database::open(&path).unwrap_err();
    match &error {
        StoreError::NewerSchema {
            found, supported, ..
        } => {
            assert_eq!((*found, *supported), (SCHEMA_VERSION + 1, SCHEMA_VERSION));
        }
        other => panic!("expected NewerSchema, got {other:?}"),
    }
    assert!(
        error.to_string().contains("open it with the newer build"),
        "{error}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

#[test]
fn another_applications_database_is_refused_and_left_alone() {
    let dir = TempDir::new("foreign");
    let path = dir.join("notes.db");
    {
        let raw = rusqlite::Connection::open(&path).unwrap();
        raw.execute_batch("CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('keep me');")
            .unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    let error = Database::open(&path).unwrap_err();
    assert!(matches!(error, StoreError::Foreign { .. }), "{error:?}");
    assert!(error.to_string().contains("choose another file"), "{error}");
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

#[test]
fn a_location_that_cannot_be_written_is_a_clear_error() {
    // Nobody, root included, can create a file here.
    let error = Database::open("/proc/self/gate.db").unwrap_err();
    assert!(matches!(error, StoreError::ReadOnly { .. }), "{error:?}");
    assert!(error.to_string().contains("writable location"), "{error}");
}

/// Makes a directory refuse new entries for as long as it lives: by permissions, or,
/// for root (whom permissions do not stop), by the immutable attribute.
struct Frozen<'a> {
    dir: &'a Path,
    immutable: bool,
}

impl<'a> Frozen<'a> {
    fn new(dir: &'a Path) -> Option<Self> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555)).unwrap();
        let frozen = |dir: &Path| std::fs::File::create(dir.join("probe")).is_err();
        if frozen(dir) {
            return Some(Self {
                dir,
                immutable: false,
            });
        }
        let _ = std::fs::remove_file(dir.join("probe"));
        let chattr = Command::new("chattr").arg("+i").arg(dir).status();
        if chattr.is_ok_and(|s| s.success()) && frozen(dir) {
            return Some(Self {
                dir,
                immutable: true,
            });
        }
        None
    }
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        use std::os::unix::fs::PermissionsExt;
        if self.immutable {
            let _ = Command::new("chattr").arg("-i").arg(self.dir).status();
        }
        let _ = std::fs::set_permissions(self.dir, std::fs::Permissions::from_mode(0o755));
    }
}

#[test]
fn an_existing_database_in_a_read_only_directory_is_a_clear_error_and_keeps_its_records() {
    let dir = TempDir::new("readonly");
    let home = dir.join("home");
    std::fs::create_dir(&home).unwrap();
    let path = home.join("gate.db");
    filled(&path, 5);
    let _ = std::fs::remove_dir_all(home.join("gate.db-sessions"));
    {
        let Some(_frozen) = Frozen::new(&home) else {
            // Neither permissions nor the immutable attribute hold here; the /proc case
            // above still covers the error.
            eprintln!("cannot make a read-only directory on this machine; covered by /proc");
            return;
        };
        let error = Database::open(&path).unwrap_err();
        assert!(matches!(error, StoreError::ReadOnly { .. }), "{error:?}");
        assert!(error.to_string().contains("cannot be written"), "{error}");
    }
    assert_eq!(count(&path), 5);
}

#[tokio::test]
async fn a_full_disk_refuses_the_write_and_keeps_everything_stored_before() {
    let dir = TempDir::new("full");
    let path = dir.join("gate.db");
    let db = Database::open(&path).unwrap();
    let ledger = db.ledger();
    let text = "y".repeat(2000);
    for _ in 0..10 {
        ledger.insert(&mut observation(&text)).unwrap();
    }
    let size = std::fs::metadata(&path).unwrap().len().max(4096 * 8);
    db.limit_size(size + 4 * 4096).unwrap();
    let mut stored = 10;
    let error = loop {
        match ledger.insert(&mut observation(&text)) {
            Ok(_) => stored += 1,
            Err(error) => break error,
        }
        assert!(stored < 1000, "the size limit never took effect");
    };
    assert!(error.0.contains("database is full"), "{error}");
    assert!(
        error.0.contains("free disk space or raise the size limit"),
        "{error}"
    );
    assert_eq!(ledger.entries().unwrap().len(), stored);

    // Through the kernel, a refused submission is a storage error and records nothing.
    let overseer =
        kernel::Overseer::with_store(ledger.clone(), Arc::new(kernel::StepClock::default()));
    overseer
        .register(crate::support::FakeGatekeeper::new("gk"))
        .unwrap();
    let queue = overseer.queue_for("gk", "agent").unwrap();
    let big = ActionDescription::new("big", "z".repeat(20_000));
    let refused = queue.submit_action(DriverActionId(1), big.clone()).await;
    assert!(
        matches!(&refused, Err(kernel::QueueError::Storage(m)) if m.contains("database is full")),
        "{refused:?}"
    );
    assert_eq!(ledger.entries().unwrap().len(), stored);

    // Room again: writes work, and nothing stored earlier was lost.
    db.limit_size(1 << 30).unwrap();
    queue.submit_action(DriverActionId(1), big).await.unwrap();
    drop((queue, overseer, ledger, db));
    assert_eq!(count(&path), stored + 1);
}

#[test]
fn a_missing_directory_is_cannot_open_not_read_only() {
    let dir = TempDir::new("missing");
    let error = Database::open(dir.join("no/such/dir/gate.db")).unwrap_err();
    assert!(matches!(error, StoreError::CannotOpen { .. }), "{error:?}");
    assert!(
        error.to_string().contains("check that the path exists"),
        "{error}"
    );
}

/// The lists of states and failure kinds as version 7 and older wrote them (`IN (...)`),
/// and as version 8 writes them.
const LISTS_BEFORE_8: [(&str, &str); 4] = [
    (
        "state IN ('pending', 'approved', 'rejected', 'failed', 'reverted', 'expired')",
        "state = 'pending' OR state = 'approved' OR state = 'rejected'
        OR state = 'failed' OR state = 'reverted' OR state = 'expired'",
    ),
    (
        "failure_kind IN ('not_sent', 'outcome_unknown', 'service_error')",
        "failure_kind = 'not_sent' OR failure_kind = 'outcome_unknown'
            OR failure_kind = 'service_error'",
    ),
    (
        "OLD.state IN ('rejected', 'reverted', 'expired')",
        "OLD.state = 'rejected' OR OLD.state = 'reverted' OR OLD.state = 'expired'",
    ),
    (
        "state IN ('pending', 'applying', 'applied', 'failed', 'rejected')",
        "state = 'pending' OR state = 'applying'
        OR state = 'applied' OR state = 'failed' OR state = 'rejected'",
    ),
];

/// Turn a fresh file into what `version` (1 to 8) wrote: before 9, rules without their
/// time and scope; before 8, lists of states as `IN (...)`; before 7, no state `expired` (in the state's CHECK and the trigger on final
/// states); before 6, no `actions.definition`; before 5, no `failure_kind`; before 4, no
/// `deciding_session`; before 3, the description's fields as generated columns of
/// `ledger` and no `ledger_view`; version 1 also had an index on state.
fn make_version(raw: &rusqlite::Connection, version: i64) {
    raw.execute_batch(
        "ALTER TABLE auto_approval_rules DROP COLUMN enabled_at;
         ALTER TABLE auto_approval_rules DROP COLUMN scope_json;",
    )
    .unwrap();
    if version == 8 {
        raw.pragma_update(None, "user_version", version).unwrap();
        return;
    }
    // Changing a CHECK in place, as SQLite documents for removing one: only to make an
    // old file here; the store's upgrade rebuilds the table instead.
    raw.execute_batch("PRAGMA writable_schema = ON").unwrap();
    for (old, new) in LISTS_BEFORE_8 {
        let changed = raw
            .execute(
                "UPDATE sqlite_schema SET sql = replace(sql, ?2, ?1) WHERE instr(sql, ?2) > 0",
                [old, new],
            )
            .unwrap();
        assert!(changed > 0, "the schema has {new}");
    }
    if version <= 6 {
        raw.execute(
            "UPDATE sqlite_schema SET sql = replace(sql, ', ''expired''', '')
                 WHERE name IN ('ledger', 'ledger_states_move_forward')",
            [],
        )
        .unwrap();
    }
    raw.execute_batch("PRAGMA writable_schema = OFF").unwrap();
    if version >= 6 {
        raw.pragma_update(None, "user_version", version).unwrap();
        return;
    }
    raw.execute_batch("ALTER TABLE actions DROP COLUMN definition")
        .unwrap();
    if version == 5 {
        raw.pragma_update(None, "user_version", version).unwrap();
        return;
    }
    raw.execute_batch("ALTER TABLE ledger DROP COLUMN failure_kind")
        .unwrap();
    if version <= 3 {
        raw.execute_batch("ALTER TABLE ledger DROP COLUMN deciding_session")
            .unwrap();
    }
    if version <= 2 {
        raw.execute_batch("DROP VIEW ledger_view").unwrap();
        for (column, kind, path) in [
            ("title", "TEXT", "$.title"),
            ("body", "TEXT", "$.description"),
            ("kind_tag", "TEXT", "$.action_kind.tag"),
            ("kind_label", "TEXT", "$.action_kind.label"),
            ("auto_approvable", "INTEGER", "$.auto_approvable"),
            ("prohibit_all_sharing", "INTEGER", "$.prohibit_all_sharing"),
        ] {
            raw.execute_batch(&format!(
                "ALTER TABLE ledger ADD COLUMN {column} {kind}
                     GENERATED ALWAYS AS (json_extract(description_json, '{path}')) VIRTUAL"
            ))
            .unwrap();
        }
    }
    if version == 1 {
        raw.execute_batch("CREATE INDEX actions_by_state ON actions (gatekeeper, state, id)")
            .unwrap();
    }
    raw.pragma_update(None, "user_version", version).unwrap();
}

/// A failed action as an older `version` wrote it: `failure` and `failure_retryable`, and
/// from version 5 on its kind.
fn old_failure(raw: &rusqlite::Connection, version: i64, id: i64, retryable: bool) {
    raw.execute(
        "INSERT INTO ledger (id, kind, gatekeeper, caller, created_at, description_json,
            driver_id, state, failure, failure_retryable, depends_on_json, restart_requested)
         VALUES (?1, 'action', 'gk', 'agent', 0, '{\"title\":\"t\",\"description\":\"d\"}',
            ?1, 'failed', 'it failed', ?2, '[]', 0)",
        rusqlite::params![id, retryable],
    )
    .map(drop)
    .or_else(|error| {
        // From version 5 on a failure has a kind, in the same row.
        assert!(version >= 5, "{error}");
        raw.execute(
            "INSERT INTO ledger (id, kind, gatekeeper, caller, created_at, description_json,
                driver_id, state, failure, failure_retryable, depends_on_json, restart_requested,
                failure_kind)
             VALUES (?1, 'action', 'gk', 'agent', 0, '{\"title\":\"t\",\"description\":\"d\"}',
                ?1, 'failed', 'it failed', ?2, '[]', 0, ?3)",
            rusqlite::params![
                id,
                retryable,
                if retryable {
                    "not_sent"
                } else {
                    "outcome_unknown"
                }
            ],
        )
        .map(drop)
    })
    .unwrap();
}

/// Make a file of schema `version` (1 to 8) with three observations, two failed actions
/// and a rule, open it, and check that it was upgraded to the current version with every
/// record kept, every failure given a kind, and the rule read as it meant: enabled at time
/// zero, for its whole kind.
fn upgrades_from(version: i64) {
    let dir = TempDir::new(&format!("upgrade{version}"));
    let path = dir.join("gate.db");
    filled(&path, 3);
    {
        let raw = rusqlite::Connection::open(&path).unwrap();
        make_version(&raw, version);
        old_failure(&raw, version, 4, true);
        old_failure(&raw, version, 5, false);
        raw.execute(
            "INSERT INTO auto_approval_rules (gatekeeper, tag, label, enabled_by)
             VALUES ('gk', 'gk:write', 'write', 'carol')",
            [],
        )
        .unwrap();
    }
    {
        // A new connection reads the schema as the old version wrote it.
        let raw = rusqlite::Connection::open(&path).unwrap();
        let refused = raw.execute("UPDATE ledger SET state = 'expired' WHERE id = 4", []);
        assert_eq!(
            refused.is_err(),
            version <= 6,
            "version {version} knows the expired state from 7 on"
        );
        let refused = raw.execute("UPDATE ledger SET state = 'done' WHERE id = 4", []);
        assert!(
            refused.is_err(),
            "version {version} checks the state's name"
        );
        // A settled staged call, which the upgrade keeps as it stands.
        raw.execute(
            "INSERT INTO actions (gatekeeper, id, tool, args_json, state, submitted_at,
                 result_json)
             VALUES ('gk', 9, 'createIssue', '{}', 'applied', 0, '{\"content\":[]}')",
            [],
        )
        .unwrap();
    }
    let rule = AutoApprovalRule::new("gk", ActionKind::new("gk:write", "write"), "carol");
    assert_eq!(rule.scope, RuleScope::default());
    // Read as it is, not upgraded, the old file's rule means the same.
    let reader = store_sqlite::LedgerReader::open(&path).unwrap();
    assert_eq!(reader.rules().unwrap(), std::slice::from_ref(&rule));
    drop(reader);
    {
        let db = Database::open(&path).unwrap();
        assert_eq!(db.ledger().rules().unwrap(), std::slice::from_ref(&rule));
        assert_eq!(
            db.ledger().rule("gk", "gk:write").unwrap().as_deref(),
            Some(&rule)
        );
        let entries = db.ledger().entries().unwrap();
        assert_eq!(entries.len(), 5);
        let kinds: Vec<FailureKind> = entries
            .iter()
            .filter_map(|e| e.action()?.failure.as_ref().map(|f| f.kind))
            .collect();
        assert_eq!(
            kinds,
            [FailureKind::NotSent, FailureKind::OutcomeUnknown],
            "a retryable failure never reached the service; a final one may have"
        );
        let titles = db
            .query_text("SELECT title FROM ledger_view ORDER BY id")
            .unwrap();
        assert_eq!(titles.len(), 5, "the view answers for every entry");
        assert!(titles.iter().all(|row| row[0].is_some()), "{titles:?}");
        let kinds = db
            .query_text(
                "SELECT failure_kind FROM ledger_view WHERE failure IS NOT NULL ORDER BY id",
            )
            .unwrap();
        assert_eq!(kinds.len(), 2, "the view has the new column");
    }
    let raw = rusqlite::Connection::open(&path).unwrap();
    let number = |sql: &str| -> i64 { raw.query_row(sql, [], |row| row.get(0)).unwrap() };
    assert_eq!(number("PRAGMA user_version"), SCHEMA_VERSION);
    for column in ["deciding_session", "failure_kind"] {
        assert_eq!(
            number(&format!(
                "SELECT count(*) FROM pragma_table_xinfo('ledger') WHERE name = '{column}'"
            )),
            1,
            "the upgrade adds {column}"
        );
    }
    assert_eq!(
        number("SELECT count(*) FROM pragma_table_xinfo('actions') WHERE name = 'definition'"),
        1,
        "the upgrade adds actions.definition"
    );
    assert_eq!(
        number(
            "SELECT count(*) FROM pragma_table_xinfo('auto_approval_rules')
             WHERE name IN ('enabled_at', 'scope_json')"
        ),
        2,
        "the upgrade adds the rule's time and scope"
    );
    assert!(
        raw.execute("UPDATE auto_approval_rules SET scope_json = 'whole'", [])
            .is_err(),
        "an upgraded file checks the scope is JSON"
    );
    assert!(
        raw.execute("UPDATE auto_approval_rules SET enabled_at = NULL", [])
            .is_err(),
        "and that a rule has a time"
    );
    assert_eq!(
        number("SELECT count(*) FROM pragma_table_xinfo('ledger') WHERE hidden <> 0"),
        0,
        "the upgrade drops the generated columns"
    );
    assert_eq!(
        number("SELECT count(*) FROM sqlite_schema WHERE name = 'actions_by_state'"),
        0,
        "the upgrade drops the index on state"
    );
    assert!(
        raw.execute("UPDATE ledger SET failure_kind = 'maybe' WHERE id = 5", [])
            .is_err(),
        "an upgraded file checks the kind's name"
    );
    assert!(
        raw.execute("UPDATE ledger SET state = 'expired' WHERE id = 4", [])
            .is_ok(),
        "an upgraded file takes the expired state"
    );
    assert!(
        raw.execute("UPDATE ledger SET state = 'pending' WHERE id = 4", [])
            .is_err(),
        "and keeps it final"
    );
    assert!(
        raw.execute("DELETE FROM ledger WHERE id = 1", []).is_err(),
        "the rebuilt ledger is still append-only"
    );
    assert!(
        raw.execute("UPDATE ledger SET failure_kind = NULL WHERE id = 5", [])
            .is_err(),
        "a kind goes with every failure"
    );
    assert_eq!(
        number("SELECT count(*) FROM actions WHERE id = 9 AND state = 'applied'"),
        1,
        "the upgrade keeps the staged calls"
    );
    // Each change below breaks one rule only: the first the trigger on settled calls, the
    // second the state's CHECK (an insert fires no update trigger).
    assert!(
        raw.execute(
            "UPDATE actions SET state = 'pending', result_json = NULL WHERE id = 9",
            []
        )
        .is_err(),
        "the rebuilt action store keeps a settled call settled"
    );
    let stage_as = |state: &str| {
        raw.execute(
            "INSERT INTO actions (gatekeeper, id, tool, args_json, state, submitted_at)
             VALUES ('gk', 10, 'createIssue', '{}', ?1, 0)",
            [state],
        )
    };
    assert!(stage_as("done").is_err(), "and checks the state's name");
    assert!(
        stage_as("pending").is_ok(),
        "and takes a call staged as before"
    );
    for (list, _) in LISTS_BEFORE_8 {
        let left: i64 = raw
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE instr(sql, ?1) > 0",
                [list],
                |row| row.get(0),
            )
            .unwrap();
        assert_eq!(left, 0, "the upgrade leaves no {list}");
    }
    assert_eq!(count(&path), 5);
}

#[test]
fn a_version_8_file_is_upgraded_on_open_and_its_rules_read_as_whole_kinds() {
    upgrades_from(8);
}

#[test]
fn a_version_7_file_is_upgraded_on_open_and_checks_its_states_without_lists() {
    upgrades_from(7);
}

#[test]
fn a_version_6_file_is_upgraded_on_open_and_takes_the_expired_state() {
    upgrades_from(6);
}

#[test]
fn a_version_5_file_is_upgraded_on_open_and_gets_the_definition_column() {
    upgrades_from(5);
}

#[test]
fn a_version_4_file_is_upgraded_on_open_and_its_failures_get_a_kind() {
    upgrades_from(4);
}

#[test]
fn a_version_3_file_is_upgraded_on_open_and_keeps_its_records() {
    upgrades_from(3);
}

#[test]
fn a_version_2_file_is_upgraded_on_open_and_keeps_its_records() {
    upgrades_from(2);
}

#[test]
fn a_version_1_file_is_upgraded_on_open_and_keeps_its_records() {
    upgrades_from(1);
}

#[test]
fn a_file_of_an_older_schema_marked_as_current_is_refused_and_left_alone() {
    let dir = TempDir::new("mismarked");
    let path = dir.join("gate.db");
    filled(&path, 3);
    {
        let raw = rusqlite::Connection::open(&path).unwrap();
        make_version(&raw, 2);
        // Someone changed the number, not the tables.
        raw.pragma_update(None, "user_version", SCHEMA_VERSION)
            .unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    let error = Database::open(&path).unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains(&format!("says it has schema version {SCHEMA_VERSION}")),
        "{message}"
    );
    assert!(message.contains("its tables do not match"), "{message}");
    assert!(message.contains("nothing was changed"), "{message}");
    assert_eq!(std::fs::read(&path).unwrap(), before, "untouched");
}

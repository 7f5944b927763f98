//! The schema: STRICT tables whose CHECK constraints and triggers restate the state
//! machines, so a bug (or a hand edit) that would break an invariant fails loudly.
//!
//! Everything a person may want to query is a real column (state, who resolved, when,
//! auto or manual, the failure). What a driver submitted is kept as it was, in a JSON
//! column; the view `ledger_view` adds the parts worth filtering on (title, kind tag) as
//! columns.
//!
//! Versioning: `PRAGMA user_version` holds [`SCHEMA_VERSION`]; `PRAGMA application_id`
//! holds [`APPLICATION_ID`] so a stranger's database is never mistaken for ours. A file
//! with a newer version is refused before anything is written to it.

/// The schema version this build writes and reads.
///
/// - Version 2 (from 1): `action_ids` holds the highest *deleted* id instead of the last
///   one handed out (staging writes only its row), and `actions` has no index on state
///   (one page less written by each stage, claim and outcome).
/// - Version 3 (from 2): the description's fields (title, body, kind tag and label,
///   flags) moved from generated columns of `ledger`, which SQLite computed on every
///   insert and update, to the view `ledger_view`.
///
/// - Version 4 (from 3): `ledger.deciding_session`, the process session that recorded
///   the decision under way on an open action, so a second process on the same file
///   neither records itself as the decider nor sends it (see `ledger.rs`).
///
/// - Version 5 (from 4): `ledger.failure_kind`, what is known about a failed apply
///   (`not_sent`, `outcome_unknown`, `service_error`), so "may or may not have taken
///   effect" is one exact query. The upgrade marks an older retryable failure `not_sent`
///   (a retryable failure is one the driver knew had not reached the service) and an
///   older final one `outcome_unknown`, the safe reading of a failure nobody classified.
///   An upgraded file lacks the CHECK tying `failure_kind` to `failure` (SQLite cannot
///   add a constraint over existing rows without rebuilding the table); the store
///   writes both together.
///
/// - Version 6 (from 5): `actions.definition`, the driver's tag of the tool definition a
///   call was staged against (an MCP tool's digest), so apply can refuse a call whose tool
///   changed since. Older rows have none.
///
/// - Version 7 (from 6): the action state `expired` (a pending action nobody decided
///   within its time to live; final, nothing sent). The state's CHECK cannot be widened
///   in place, so the upgrade rebuilds `ledger` (same columns, every row copied, then its
///   indexes, triggers and `ledger_view` again), which also gives a file upgraded from
///   version 4 or older the CHECK tying `failure_kind` to `failure`.
///
/// - Version 8 (from 7): every CHECK and trigger that named more than two states or
///   failure kinds in one `IN (…)` list names them in a chain of `=` instead. SQLite
///   builds a small table for such a list each time a statement evaluates it, on every
///   insert and update of `ledger` and `actions`: about 30% of the time of an update of
///   `actions`, timed alone. The states are the same. The upgrade rebuilds `ledger` and
///   `actions` (same columns, every row copied, then their indexes, triggers and
///   `ledger_view` again).
///
/// - Version 9 (from 8): `auto_approval_rules.enabled_at`, when a rule was enabled, and
///   `auto_approval_rules.scope_json`, how far it reaches (the JSON of
///   [`kernel::RuleScope`]: whose calls, until when, which arguments). The upgrade adds
///   both (only where absent); a rule of an older file reads back as enabled at time zero
///   for its whole kind, which is what it meant.
///
/// An older file is upgraded on open, in one transaction; a build that knows only an older
/// version then refuses it.
pub const SCHEMA_VERSION: i64 = 9;

/// The names [`kernel::FailureKind`] is stored as.
const FAILURE_KINDS: &str = "('not_sent', 'outcome_unknown', 'service_error')";

/// The columns version 2 generated from `description_json`, dropped by the upgrade.
pub(crate) const GENERATED_IN_V2: [&str; 6] = [
    "title",
    "body",
    "kind_tag",
    "kind_label",
    "auto_approvable",
    "prohibit_all_sharing",
];

/// The ledger with the description's fields as columns, for people and reports.
const LEDGER_VIEW: &str = r#"
CREATE VIEW ledger_view AS
SELECT ledger.*,
    json_extract(description_json, '$.title')                AS title,
    json_extract(description_json, '$.description')          AS body,
    json_extract(description_json, '$.action_kind.tag')      AS kind_tag,
    json_extract(description_json, '$.action_kind.label')    AS kind_label,
    json_extract(description_json, '$.auto_approvable')      AS auto_approvable,
    json_extract(description_json, '$.prohibit_all_sharing') AS prohibit_all_sharing
FROM ledger;
"#;

/// Each upgrade step, from the version it starts at. Run in one transaction, after the
/// file was checked; the generated columns of version 2 are dropped separately (only
/// those present).
pub(crate) const UPGRADES: [(i64, &str); 2] = [
    (1, "DROP INDEX IF EXISTS actions_by_state;"),
    (2, LEDGER_VIEW),
];

/// Columns each table of the current version has, checked on open: a file whose
/// `user_version` claims the current version but whose tables are older is refused
/// before anything reads or writes it.
pub(crate) const EXPECTED_COLUMNS: [(&str, &str); 8] = [
    ("auto_approval_rules", "enabled_at"),
    ("auto_approval_rules", "scope_json"),
    ("actions", "definition"),
    ("ledger", "failure_kind"),
    ("ledger", "deciding_session"),
    ("ledger", "revert_refused"),
    ("actions", "claimed_by"),
    ("ledger_view", "kind_tag"),
];

/// Text each table of the current version has in its definition, checked on open like
/// [`EXPECTED_COLUMNS`] (a change of a CHECK adds no column).
pub(crate) const EXPECTED_SQL: [(&str, &str); 2] = [
    ("ledger", "OR state = 'expired'"),
    ("actions", "OR state = 'rejected'"),
];

/// `PRAGMA application_id` of our files: "GKSQ".
pub const APPLICATION_ID: i64 = 0x474B_5351;

/// The kernel's ledger table; `{name}` is its name (`ledger`, or the new table
/// an upgrade copies into).
const LEDGER_TABLE: &str = r#"
-- The kernel's ledger: every action and observation, one row each, never deleted.
CREATE TABLE {name} (
    id                 INTEGER PRIMARY KEY CHECK (id > 0),
    kind               TEXT    NOT NULL CHECK (kind IN ('action', 'observation')),
    gatekeeper         TEXT    NOT NULL,
    caller             TEXT    NOT NULL,
    created_at         INTEGER NOT NULL CHECK (created_at >= 0),
    -- What the driver submitted, unchanged: the audit record of what a person was asked.
    description_json   TEXT    NOT NULL
        CHECK (json_valid(description_json) AND json_type(description_json) = 'object'),
    -- Actions only (NULL for observations).
    driver_id          INTEGER CHECK (driver_id >= 0),
    -- (Lists of more than two values are written as chains of `=`, never `IN (...)`: for
    -- such a list SQLite builds a small table each time a statement checks it.)
    state              TEXT    CHECK (state = 'pending' OR state = 'approved' OR state = 'rejected'
        OR state = 'failed' OR state = 'reverted' OR state = 'expired'),
    resolved_by        TEXT,
    auto_approved      INTEGER CHECK (auto_approved IN (0, 1)),
    resolved_at        INTEGER CHECK (resolved_at >= 0),
    resolution_cause   TEXT,
    failure            TEXT,
    failure_retryable  INTEGER CHECK (failure_retryable IN (0, 1)),
    depends_on_json    TEXT
        CHECK (depends_on_json IS NULL OR (json_valid(depends_on_json) AND json_type(depends_on_json) = 'array')),
    blocked_by         INTEGER CHECK (blocked_by > 0),
    restart_requested  INTEGER CHECK (restart_requested IN (0, 1)),
    revert_by          TEXT,
    revert_at          INTEGER CHECK (revert_at >= 0),
    revert_refused     TEXT,
    -- The process session deciding this action right now (recorded with who decided,
    -- before the driver is called; cleared by the outcome). NULL in memory.
    deciding_session   TEXT,
    -- What is known about a failed apply; set exactly when `failure` is.
    failure_kind       TEXT
        CHECK (failure_kind = 'not_sent' OR failure_kind = 'outcome_unknown'
            OR failure_kind = 'service_error')
        CHECK ((failure IS NULL) = (failure_kind IS NULL)),
    CHECK (
        (kind = 'action' AND driver_id IS NOT NULL AND state IS NOT NULL
            AND depends_on_json IS NOT NULL AND restart_requested IS NOT NULL)
        OR
        (kind = 'observation' AND driver_id IS NULL AND state IS NULL AND resolved_by IS NULL
            AND failure IS NULL AND depends_on_json IS NULL AND revert_by IS NULL)
    ),
    CHECK ((resolved_by IS NULL) = (auto_approved IS NULL) AND (resolved_by IS NULL) = (resolved_at IS NULL)),
    CHECK ((failure IS NULL) = (failure_retryable IS NULL)),
    CHECK (state IS NOT 'failed' OR failure IS NOT NULL),
    CHECK ((revert_by IS NULL) = (revert_at IS NULL))
) STRICT;
"#;

/// The ledger's columns, in order (what an upgrade copies).
const LEDGER_COLUMNS: &str = "id, kind, gatekeeper, caller, created_at, description_json, \
    driver_id, state, resolved_by, auto_approved, resolved_at, resolution_cause, failure, \
    failure_retryable, depends_on_json, blocked_by, restart_requested, revert_by, revert_at, \
    revert_refused, deciding_session, failure_kind";

/// The ledger's indexes and triggers, version 7.
const LEDGER_EXTRAS: &str = r#"
CREATE UNIQUE INDEX ledger_by_driver ON ledger (gatekeeper, driver_id) WHERE kind = 'action';
CREATE INDEX ledger_open ON ledger (gatekeeper, id)
    WHERE state = 'pending' OR (state = 'failed' AND failure_retryable = 1);

-- The audit trail is append-only.
CREATE TRIGGER ledger_is_append_only BEFORE DELETE ON ledger
BEGIN
    SELECT RAISE(ABORT, 'ledger entries are never deleted');
END;

-- An action never returns to pending, and approved/rejected/reverted/expired are final
-- (approved may only become reverted).
CREATE TRIGGER ledger_states_move_forward BEFORE UPDATE OF state ON ledger
WHEN OLD.state IS NOT NEW.state AND (
    NEW.state = 'pending'
    OR OLD.state = 'rejected' OR OLD.state = 'reverted' OR OLD.state = 'expired'
    OR (OLD.state = 'approved' AND NEW.state IS NOT 'reverted')
    OR (OLD.state = 'failed' AND OLD.failure_retryable = 0)
)
BEGIN
    SELECT RAISE(ABORT, 'a ledger action cannot leave a final state');
END;
"#;

/// gatekeeper-core's action store, created as `{name}` (`actions`, or the table an upgrade
/// rebuilds it in).
const ACTIONS_TABLE: &str = r#"
-- gatekeeper-core's action store: one row per staged call, per gatekeeper.
CREATE TABLE {name} (
    gatekeeper    TEXT    NOT NULL,
    id            INTEGER NOT NULL CHECK (id > 0),
    tool          TEXT    NOT NULL,
    args_json     TEXT    NOT NULL CHECK (json_valid(args_json) AND json_type(args_json) = 'object'),
    state         TEXT    NOT NULL CHECK (state = 'pending' OR state = 'applying'
        OR state = 'applied' OR state = 'failed' OR state = 'rejected'),
    submitted_at  INTEGER NOT NULL CHECK (submitted_at >= 0),
    claimed_at    INTEGER CHECK (claimed_at >= 0),
    -- The process session that holds (or held) the claim; NULL for in-memory databases.
    claimed_by    TEXT,
    retryable     INTEGER CHECK (retryable IN (0, 1)),
    error         TEXT,
    result_json   TEXT    CHECK (result_json IS NULL OR json_valid(result_json)),
    -- The driver's tag of the tool definition the call was staged against, if any.
    definition    TEXT,
    CHECK ((state = 'failed') = (retryable IS NOT NULL)),
    CHECK ((state = 'failed') = (error IS NOT NULL)),
    CHECK ((state = 'applied') = (result_json IS NOT NULL)),
    CHECK (state <> 'applying' OR claimed_at IS NOT NULL),
    PRIMARY KEY (gatekeeper, id)
) STRICT, WITHOUT ROWID;
"#;

const ACTIONS_COLUMNS: &str = "gatekeeper, id, tool, args_json, state, submitted_at, claimed_at, \
    claimed_by, retryable, error, result_json, definition";

/// The index and triggers of `actions`.
const ACTIONS_EXTRAS: &str = r#"
-- The settled calls that retention prunes, oldest first.
CREATE INDEX actions_final ON actions (gatekeeper, id)
    WHERE state IN ('applied', 'rejected') OR (state = 'failed' AND retryable = 0);

-- The at-most-once protocol, restated: a claim is taken only from pending or a retryable
-- failure, and a settled call (applied, rejected, failed for good) never changes again.
CREATE TRIGGER actions_claim_only_what_may_be_sent BEFORE UPDATE OF state ON actions
WHEN NEW.state = 'applying' AND NOT (OLD.state = 'pending' OR (OLD.state = 'failed' AND OLD.retryable = 1))
BEGIN
    SELECT RAISE(ABORT, 'an action may be claimed only while pending or after a retryable failure');
END;

CREATE TRIGGER actions_settled_is_final BEFORE UPDATE OF state ON actions
WHEN OLD.state IS NOT NEW.state AND (
    OLD.state IN ('applied', 'rejected')
    OR (OLD.state = 'failed' AND OLD.retryable = 0)
    OR NEW.state = 'pending'
)
BEGIN
    SELECT RAISE(ABORT, 'a settled action never changes state again');
END;
"#;

/// The columns version 9 added to `auto_approval_rules`, as `CREATE TABLE` and the
/// upgrade's `ALTER TABLE … ADD COLUMN` both write them: when the rule was enabled (zero
/// for a rule recorded before rules kept their time), and the JSON of its
/// [`kernel::RuleScope`] (`{}`, the default, is the whole kind).
const RULE_COLUMNS: [(&str, &str); 2] = [
    (
        "enabled_at",
        "INTEGER NOT NULL DEFAULT 0 CHECK (enabled_at >= 0)",
    ),
    (
        "scope_json",
        "TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(scope_json) AND json_type(scope_json) = 'object')",
    ),
];

/// Every table but the ledger and the action store (`{rule_columns}` stands for
/// [`RULE_COLUMNS`]). Run in one transaction on an empty file.
const CREATE_TABLES: &str = r#"
-- Auto-approval rules, keyed by gatekeeper and kind tag, with who enabled them, when,
-- and how far they reach.
CREATE TABLE auto_approval_rules (
    gatekeeper  TEXT NOT NULL,
    tag         TEXT NOT NULL,
    label       TEXT NOT NULL,
    enabled_by  TEXT NOT NULL,
    {rule_columns},
    PRIMARY KEY (gatekeeper, tag)
) STRICT, WITHOUT ROWID;

-- The lockdown latch: at most one row, and once there it stays.
CREATE TABLE lockdown (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    latched_at  INTEGER NOT NULL CHECK (latched_at >= 0)
) STRICT;

CREATE TRIGGER lockdown_is_a_latch BEFORE DELETE ON lockdown
BEGIN
    SELECT RAISE(ABORT, 'lockdown is a latch and is never lifted');
END;

-- Per gatekeeper, the highest id deleted from `actions` (written before the delete), so
-- ids are never reused: the next id is above it and above every id still in `actions`.
CREATE TABLE action_ids (
    gatekeeper  TEXT    PRIMARY KEY,
    last_id     INTEGER NOT NULL CHECK (last_id >= 0)
) STRICT, WITHOUT ROWID;

-- The drivers' key-value port: opaque (postcard) values under string keys, per driver.
CREATE TABLE kv (
    scope  TEXT NOT NULL,
    key    TEXT NOT NULL,
    value  BLOB NOT NULL,
    PRIMARY KEY (scope, key)
) STRICT, WITHOUT ROWID;
"#;

/// Create the whole schema (run in one transaction on an empty file).
pub(crate) fn create(db: &rusqlite::Connection) -> rusqlite::Result<()> {
    db.execute_batch(&LEDGER_TABLE.replace("{name}", "ledger"))?;
    db.execute_batch(LEDGER_EXTRAS)?;
    db.execute_batch(&ACTIONS_TABLE.replace("{name}", "actions"))?;
    db.execute_batch(ACTIONS_EXTRAS)?;
    let rule_columns: Vec<String> = RULE_COLUMNS
        .iter()
        .map(|(name, definition)| format!("{name:<11} {definition}"))
        .collect();
    db.execute_batch(&CREATE_TABLES.replace("{rule_columns}", &rule_columns.join(",\n    ")))?;
    db.execute_batch(LEDGER_VIEW)
}

/// Rebuild table `name` with its current definition (`table`, with `{name}` in it), keeping
/// every row of `columns` (SQLite's procedure for a change `ALTER TABLE` cannot make), then
/// create its index and triggers again (`extras`): dropping the old table drops them.
/// Dropping a table fires no delete trigger, so an append-only trigger does not stand in
/// the way.
fn rebuild(
    db: &rusqlite::Connection,
    name: &str,
    table: &str,
    columns: &str,
    extras: &str,
) -> rusqlite::Result<()> {
    db.execute_batch(&table.replace("{name}", &format!("{name}_next")))?;
    db.execute_batch(&format!(
        "INSERT INTO {name}_next ({columns}) SELECT {columns} FROM {name};
         DROP TABLE {name};
         ALTER TABLE {name}_next RENAME TO {name};"
    ))?;
    db.execute_batch(extras)
}

/// Rebuild the ledger table, and the view over it.
fn rebuild_ledger(db: &rusqlite::Connection) -> rusqlite::Result<()> {
    db.execute_batch("DROP VIEW IF EXISTS ledger_view")?;
    rebuild(db, "ledger", LEDGER_TABLE, LEDGER_COLUMNS, LEDGER_EXTRAS)?;
    db.execute_batch(LEDGER_VIEW)
}

/// Bring a file at `version` up to [`SCHEMA_VERSION`] (run in one transaction).
pub(crate) fn upgrade(db: &rusqlite::Connection, version: i64) -> rusqlite::Result<()> {
    if version <= 2 {
        let present: Vec<String> = db
            .prepare("SELECT name FROM pragma_table_xinfo('ledger')")?
            .query_map([], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        for column in GENERATED_IN_V2 {
            if present.iter().any(|name| name == column) {
                db.execute_batch(&format!("ALTER TABLE ledger DROP COLUMN {column}"))?;
            }
        }
    }
    for (from, step) in UPGRADES {
        if version <= from {
            db.execute_batch(step)?;
        }
    }
    if version <= 3 {
        let present: bool = db.query_row(
            "SELECT EXISTS (SELECT 1 FROM pragma_table_xinfo('ledger') WHERE name = 'deciding_session')",
            [],
            |r| r.get(0),
        )?;
        if !present {
            db.execute_batch("ALTER TABLE ledger ADD COLUMN deciding_session TEXT")?;
        }
    }
    if version <= 4 {
        let present: bool = db.query_row(
            "SELECT EXISTS (SELECT 1 FROM pragma_table_xinfo('ledger') WHERE name = 'failure_kind')",
            [],
            |r| r.get(0),
        )?;
        if !present {
            db.execute_batch(&format!(
                "ALTER TABLE ledger ADD COLUMN failure_kind TEXT CHECK (failure_kind IN {FAILURE_KINDS});
                 UPDATE ledger SET failure_kind =
                     CASE failure_retryable WHEN 1 THEN 'not_sent' ELSE 'outcome_unknown' END
                 WHERE failure IS NOT NULL;"
            ))?;
        }
    }
    if version <= 5 {
        let present: bool = db.query_row(
            "SELECT EXISTS (SELECT 1 FROM pragma_table_xinfo('actions') WHERE name = 'definition')",
            [],
            |r| r.get(0),
        )?;
        if !present {
            db.execute_batch("ALTER TABLE actions ADD COLUMN definition TEXT")?;
        }
    }
    if version <= 7 {
        rebuild_ledger(db)?;
        rebuild(
            db,
            "actions",
            ACTIONS_TABLE,
            ACTIONS_COLUMNS,
            ACTIONS_EXTRAS,
        )?;
    }
    if version <= 8 {
        for (column, definition) in RULE_COLUMNS {
            let present: bool = db.query_row(
                "SELECT EXISTS (SELECT 1 FROM pragma_table_xinfo('auto_approval_rules') WHERE name = ?1)",
                [column],
                |r| r.get(0),
            )?;
            if !present {
                db.execute_batch(&format!(
                    "ALTER TABLE auto_approval_rules ADD COLUMN {column} {definition}"
                ))?;
            }
        }
    }
    db.pragma_update(None, "user_version", SCHEMA_VERSION)
}

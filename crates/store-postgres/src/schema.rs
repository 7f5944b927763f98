//! The schema: tables whose triggers and CHECK constraints restate the state machines,
//! versioned in `gate_schema`, created or upgraded on open under an advisory lock so that
//! daemons starting together never run a migration twice, and refused when newer.
//!
//! The layout follows store-sqlite's (one `ledger` row per action or observation, one
//! `actions` row per staged call, `kv` for the wiki driver), so the SQL queries of
//! docs/sql-queries.md read the same columns; JSON is kept as text exactly as the driver
//! wrote it, and `ledger_view` adds the description's fields as columns.
//!
//! What is new for several daemons: `gate_sessions` numbers daemon sessions; a session
//! is alive while its connection holds the advisory lock `(SESSION_LOCKS, id)`
//! (`gate_session_alive`), which the server releases when the connection ends, however
//! the daemon died. `actions.staged_by` names the session that staged a call, so a stage
//! whose session died before the kernel recorded it can be discarded while others run.
//! Every change to the ledger, the action store or the rules notifies the channel
//! [`CHANNEL`] (statement triggers), so other daemons wake without polling.

/// The schema version this build writes and reads.
///
/// - Version 1: the first.
/// - Version 2: `gate_stage`, a stage in one statement (lock the id row, count, insert).
/// - Version 3: `auto_approval_rules.enabled_at`, when a rule was enabled, and
///   `auto_approval_rules.scope_json`, how far it reaches (the JSON of
///   [`kernel::RuleScope`]: whose calls, until when, which arguments). A rule of an older
///   database reads back as enabled at time zero for its whole kind, which is what it
///   meant.
/// - Version 4: `lockdown_changed`, a notification when the lockdown latch is set, so a
///   daemon can answer "not latched" from its session's view; the writer's session in
///   every notification's payload (`ledger:7`), so a daemon tells other daemons' changes
///   from its own (see `cache.rs`); and `gate_stage` refuses a full store before it takes
///   the id row's lock (`STAGE_FUNCTION_4`, since replaced).
/// - Version 5: the rows' rules of `ledger` and `actions` as row triggers instead of
///   CHECK constraints (`ROW_RULES_5`), the same rules at a fraction of the cost; a
///   ledger notification names the server whose entry changed, from the same trigger.
/// - Version 6: `gate_stage` counts the open calls once when no other stage holds the
///   store's id row, and takes that row without writing a new version of it
///   (`STAGE_FUNCTION_6`).
pub const SCHEMA_VERSION: i32 = 6;

/// The first key of the advisory locks that mark a live session (second key: its id).
pub(crate) const SESSION_LOCKS: i32 = 0x4753;

/// The first key of the advisory lock held while the schema is created or upgraded.
pub(crate) const MIGRATION_LOCK: i32 = 0x474D;

/// The first key of the advisory locks that serialize ledger inserts (second key 0) and
/// the drain leases (second key: a hash of the gatekeeper's name).
pub(crate) const LEDGER_LOCKS: i32 = 0x474C;

/// The `LISTEN`/`NOTIFY` channel every change is announced on.
pub const CHANNEL: &str = "gate_changes";

/// The whole schema but `gate_stage` ([`STAGE_FUNCTION_6`]) and the rows' rules and the
/// ledger's notifications ([`ROW_RULES_5`]), as of the current version, run in one
/// transaction on an empty database.
pub(crate) const CREATE: &str = r#"
CREATE TABLE gate_schema (
    version integer NOT NULL
);

CREATE SEQUENCE gate_sessions AS integer;

-- Ledger ids: handed out once each, increasing, never reused (an insert that fails
-- after its id was taken leaves a gap).
CREATE SEQUENCE ledger_ids AS bigint;

CREATE FUNCTION gate_session_alive(session integer) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT session IS NOT NULL AND EXISTS (
        SELECT 1 FROM pg_locks
        WHERE locktype = 'advisory' AND classid = 18259::oid AND objid = session::oid
          AND objsubid = 2 AND granted
          AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))
$$;

-- The kernel's ledger: every action and observation, one row each, never deleted. What
-- each row must hold is checked by the trigger `ledger_rows` (`ROW_RULES_5`).
CREATE TABLE ledger (
    id                 bigint  PRIMARY KEY,
    kind               text    NOT NULL,
    gatekeeper         text    NOT NULL,
    caller             text    NOT NULL,
    created_at         bigint  NOT NULL,
    -- What the driver submitted, unchanged: the audit record of what a person was asked.
    description_json   text    NOT NULL,
    driver_id          bigint,
    state              text,
    resolved_by        text,
    auto_approved      boolean,
    resolved_at        bigint,
    resolution_cause   text,
    failure            text,
    failure_retryable  boolean,
    failure_kind       text,
    depends_on_json    text,
    blocked_by         bigint,
    restart_requested  boolean,
    revert_by          text,
    revert_at          bigint,
    revert_refused     text,
    -- The daemon session deciding this action right now (recorded with who decided,
    -- before the driver is called; cleared by the outcome).
    deciding_session   integer
);

CREATE UNIQUE INDEX ledger_by_driver ON ledger (gatekeeper, driver_id) WHERE kind = 'action';
CREATE INDEX ledger_open ON ledger (gatekeeper, id)
    WHERE state = 'pending' OR (state = 'failed' AND failure_retryable);

CREATE FUNCTION gate_ledger_is_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ledger entries are never deleted';
END $$;
CREATE TRIGGER ledger_is_append_only BEFORE DELETE ON ledger
    FOR EACH ROW EXECUTE FUNCTION gate_ledger_is_append_only();

CREATE VIEW ledger_view AS
SELECT ledger.*,
    description_json::jsonb ->> 'title'                          AS title,
    description_json::jsonb ->> 'description'                    AS body,
    description_json::jsonb -> 'action_kind' ->> 'tag'           AS kind_tag,
    description_json::jsonb -> 'action_kind' ->> 'label'         AS kind_label,
    (description_json::jsonb ->> 'auto_approvable')::boolean      AS auto_approvable,
    (description_json::jsonb ->> 'prohibit_all_sharing')::boolean AS prohibit_all_sharing
FROM ledger;

-- Auto-approval rules, keyed by gatekeeper and kind tag, with who enabled them, when
-- (zero for a rule recorded before rules kept their time), and how far they reach (the
-- JSON of the rule's scope; '{}' is the whole kind).
CREATE TABLE auto_approval_rules (
    gatekeeper  text   NOT NULL,
    tag         text   NOT NULL,
    label       text   NOT NULL,
    enabled_by  text   NOT NULL,
    enabled_at  bigint NOT NULL DEFAULT 0 CHECK (enabled_at >= 0),
    scope_json  text   NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(scope_json::jsonb) = 'object'),
    PRIMARY KEY (gatekeeper, tag)
);

-- The lockdown latch: at most one row, and once there it stays.
CREATE TABLE lockdown (
    id          integer PRIMARY KEY CHECK (id = 1),
    latched_at  bigint  NOT NULL CHECK (latched_at >= 0)
);

CREATE FUNCTION gate_lockdown_is_a_latch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'lockdown is a latch and is never lifted';
END $$;
CREATE TRIGGER lockdown_is_a_latch BEFORE DELETE ON lockdown
    FOR EACH ROW EXECUTE FUNCTION gate_lockdown_is_a_latch();

-- gatekeeper-core's action store: one row per staged call, per gatekeeper. What each
-- row must hold is checked by the trigger `actions_rows` (`ROW_RULES_5`).
CREATE TABLE actions (
    gatekeeper    text    NOT NULL,
    id            bigint  NOT NULL,
    tool          text    NOT NULL,
    args_json     text    NOT NULL,
    state         text    NOT NULL,
    submitted_at  bigint  NOT NULL,
    claimed_at    bigint,
    -- The session that holds (or held) the claim.
    claimed_by    integer,
    -- The session that staged the call.
    staged_by     integer,
    retryable     boolean,
    error         text,
    result_json   text,
    -- The driver's tag of the tool definition the call was staged against, if any.
    definition    text,
    PRIMARY KEY (gatekeeper, id)
);

-- The highest id each action store handed out; its row lock serializes stages, so the
-- open cap holds across daemons.
CREATE TABLE action_ids (
    gatekeeper  text   PRIMARY KEY,
    last_id     bigint NOT NULL CHECK (last_id >= 0)
);

-- The drivers' key-value records, one namespace per driver instance; keys in byte order.
CREATE TABLE kv (
    scope  text  NOT NULL,
    key    text  COLLATE "C" NOT NULL,
    value  bytea NOT NULL,
    PRIMARY KEY (scope, key)
);

-- The payload names the table, and the daemon session that wrote, if it said
-- (`gate.session`): "actions:7". The ledger's name the server whose entry changed too
-- (`gate_ledger_rows`, `ROW_RULES_5`).
CREATE FUNCTION gate_notify_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('gate_changes', TG_TABLE_NAME
        || coalesce(':' || nullif(current_setting('gate.session', true), ''), ''));
    RETURN NULL;
END $$;
CREATE TRIGGER actions_changed AFTER INSERT OR UPDATE ON actions
    FOR EACH STATEMENT EXECUTE FUNCTION gate_notify_change();
CREATE TRIGGER rules_changed AFTER INSERT OR UPDATE OR DELETE ON auto_approval_rules
    FOR EACH STATEMENT EXECUTE FUNCTION gate_notify_change();
CREATE TRIGGER lockdown_changed AFTER INSERT ON lockdown
    FOR EACH STATEMENT EXECUTE FUNCTION gate_notify_change();
"#;

/// `gate_stage`: stage a call in one statement, one round trip (version 2; refined in
/// versions 4 and 6). It takes the store's row of `action_ids` if no other stage holds it
/// (`SKIP LOCKED`), counts the open calls once with a snapshot taken after that lock, and
/// inserts the row with the next id; NULL when the store is full.
///
/// Only when another stage holds the row (one of another daemon, parked until it commits)
/// or the store has no row yet does it count first: a store already full is then refused
/// without waiting and without writing (the count before the lock may miss a stage not yet
/// committed, never count one too many that stays). Otherwise it waits for the lock and
/// counts again, the other stage now included: each statement of a PL/pgSQL function
/// takes its own snapshot under READ COMMITTED. Every stage of one store waits for the one
/// before, so the open cap holds across daemons.
///
/// Version 4 counted twice on every stage and took the row with an upsert, which writes a
/// new version of the row even when it changes nothing; each count reads every row the
/// store keeps (up to 100 settled calls, and the versions updates leave until vacuum).
///
/// Upgrades run every step from the database's version on, so the step from version 5
/// creates or replaces this function, as it is now, in a database of any older version.
pub(crate) const STAGE_FUNCTION_6: &str = r#"
CREATE OR REPLACE FUNCTION gate_stage(p_gatekeeper text, p_tool text, p_args text, p_at bigint,
    p_session integer, p_definition text, p_max_open bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    last bigint;
    open bigint;
BEGIN
    SELECT last_id INTO last FROM action_ids WHERE gatekeeper = p_gatekeeper
        FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        SELECT count(*) INTO open FROM actions WHERE gatekeeper = p_gatekeeper
            AND (state IN ('pending', 'applying') OR (state = 'failed' AND retryable));
        IF open >= p_max_open THEN
            RETURN NULL;
        END IF;
        INSERT INTO action_ids (gatekeeper, last_id) VALUES (p_gatekeeper, 0)
            ON CONFLICT (gatekeeper) DO UPDATE SET last_id = action_ids.last_id
            RETURNING last_id INTO last;
    END IF;
    SELECT count(*) INTO open FROM actions WHERE gatekeeper = p_gatekeeper
        AND (state IN ('pending', 'applying') OR (state = 'failed' AND retryable));
    IF open >= p_max_open THEN
        RETURN NULL;
    END IF;
    UPDATE action_ids SET last_id = last + 1 WHERE gatekeeper = p_gatekeeper;
    INSERT INTO actions (gatekeeper, id, tool, args_json, state, submitted_at, staged_by, definition)
        VALUES (p_gatekeeper, last + 1, p_tool, p_args, 'pending', p_at, p_session, p_definition);
    RETURN last + 1;
END $$;
"#;

/// Version 5: what each row of `ledger` and `actions` must hold, as row triggers in place
/// of CHECK constraints. The rules are the same; their cost is not. PostgreSQL reads every
/// CHECK of a table back from its stored form and prepares it again for each statement
/// that writes the table, and checks them all on every update, whatever it changed: the
/// ledger's 17 were about 13 KB to read on each decision and outcome, and each update
/// parsed the entry's description and arguments as JSON again. `perf` on the team bench's
/// server put 22% of its processor time in checking constraints. A PL/pgSQL function is
/// compiled once per connection, and the JSON checks run only when a statement writes a
/// JSON column (`UPDATE OF`). A row that breaks a rule is refused with `check_violation`
/// and a message naming the rule.
///
/// The ledger's row trigger also announces the change, naming the server whose entry
/// changed after the writer's session, as a JSON array: `ledger:7:["issues"]` (the
/// session is empty when the writer did not say). A daemon then drops what it remembers
/// of that server's entries only (`cache.rs`): with each daemon serving its own agents'
/// server, every change of the other daemon used to drop them all. The server a
/// notification cannot carry (a name of 4,000 bytes or more) is left out, which means
/// every server. Notifications alike within a transaction are sent once.
///
/// Run after `CREATE`, and as the upgrade from version 4, which drops the two tables'
/// CHECK constraints, the older trigger of states and the ledger's statement-level
/// notification first; every step can run again safely.
pub(crate) const ROW_RULES_5: &str = r#"
DO $$
DECLARE
    c record;
BEGIN
    FOR c IN SELECT conrelid::regclass AS rel, conname FROM pg_constraint
             WHERE contype = 'c' AND conrelid IN ('ledger'::regclass, 'actions'::regclass)
    LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', c.rel, c.conname);
    END LOOP;
END $$;
DROP TRIGGER IF EXISTS ledger_states_move_forward ON ledger;
DROP FUNCTION IF EXISTS gate_ledger_states_move_forward();
DROP TRIGGER IF EXISTS ledger_changed ON ledger;

-- An entry's shape: an action has a driver id, a state, its dependencies and whether a
-- restart was asked; an observation has none of an action's columns. States move
-- forward: an action never returns to pending, approved/rejected/reverted/expired are
-- final (approved may only become reverted), and so is a failure that cannot be retried.
-- Each entry written is announced, with its server.
CREATE OR REPLACE FUNCTION gate_ledger_rows() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.state IS DISTINCT FROM NEW.state AND (
        NEW.state = 'pending'
        OR OLD.state IN ('rejected', 'reverted', 'expired')
        OR (OLD.state = 'approved' AND NEW.state IS DISTINCT FROM 'reverted')
        OR (OLD.state = 'failed' AND NOT OLD.failure_retryable)
    ) THEN
        RAISE EXCEPTION 'a ledger action cannot leave a final state';
    END IF;
    IF NOT coalesce(NEW.id > 0 AND NEW.created_at >= 0
        AND (NEW.driver_id IS NULL OR NEW.driver_id >= 0)
        AND (NEW.resolved_at IS NULL OR NEW.resolved_at >= 0)
        AND (NEW.blocked_by IS NULL OR NEW.blocked_by > 0)
        AND (NEW.revert_at IS NULL OR NEW.revert_at >= 0), false)
    THEN
        RAISE EXCEPTION 'ledger entry %: an id, a time or an action id out of range', NEW.id
            USING ERRCODE = 'check_violation';
    END IF;
    IF NOT coalesce(
        (NEW.kind = 'action' AND NEW.driver_id IS NOT NULL AND NEW.depends_on_json IS NOT NULL
            AND NEW.restart_requested IS NOT NULL
            AND NEW.state IN ('pending', 'approved', 'rejected', 'failed', 'reverted', 'expired'))
        OR (NEW.kind = 'observation' AND NEW.driver_id IS NULL AND NEW.state IS NULL
            AND NEW.resolved_by IS NULL AND NEW.failure IS NULL AND NEW.depends_on_json IS NULL
            AND NEW.revert_by IS NULL), false)
    THEN
        RAISE EXCEPTION 'ledger entry %: not the shape of an action or an observation', NEW.id
            USING ERRCODE = 'check_violation';
    END IF;
    IF NOT coalesce((NEW.resolved_by IS NULL) = (NEW.auto_approved IS NULL)
        AND (NEW.resolved_by IS NULL) = (NEW.resolved_at IS NULL)
        AND (NEW.failure IS NULL) = (NEW.failure_retryable IS NULL)
        AND (NEW.failure IS NULL) = (NEW.failure_kind IS NULL)
        AND (NEW.failure_kind IS NULL
            OR NEW.failure_kind IN ('not_sent', 'outcome_unknown', 'service_error'))
        AND (NEW.state IS DISTINCT FROM 'failed' OR NEW.failure IS NOT NULL)
        AND (NEW.revert_by IS NULL) = (NEW.revert_at IS NULL), false)
    THEN
        RAISE EXCEPTION 'ledger entry %: a resolution, failure or revert only in part', NEW.id
            USING ERRCODE = 'check_violation';
    END IF;
    PERFORM pg_notify('gate_changes', 'ledger:'
        || coalesce(current_setting('gate.session', true), '')
        || CASE WHEN octet_length(NEW.gatekeeper) < 4000
                THEN ':' || json_build_array(NEW.gatekeeper)::text ELSE '' END);
    RETURN NEW;
END $f$;

CREATE OR REPLACE FUNCTION gate_ledger_json() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    IF jsonb_typeof(NEW.description_json::jsonb) IS DISTINCT FROM 'object'
        OR (NEW.depends_on_json IS NOT NULL
            AND jsonb_typeof(NEW.depends_on_json::jsonb) IS DISTINCT FROM 'array')
    THEN
        RAISE EXCEPTION 'ledger entry %: a description that is not a JSON object, or dependencies that are not a JSON array', NEW.id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $f$;

-- A staged call's shape: a failure has its error and whether it may be retried, an
-- applied call its result, a claim its time; the arguments are a JSON object.
CREATE OR REPLACE FUNCTION gate_actions_rows() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    IF NOT coalesce(NEW.id > 0 AND NEW.submitted_at >= 0
        AND (NEW.claimed_at IS NULL OR NEW.claimed_at >= 0)
        AND NEW.state IN ('pending', 'applying', 'applied', 'failed', 'rejected')
        AND (NEW.state = 'failed') = (NEW.retryable IS NOT NULL)
        AND (NEW.state = 'failed') = (NEW.error IS NOT NULL)
        AND (NEW.state = 'applied') = (NEW.result_json IS NOT NULL)
        AND (NEW.state <> 'applying' OR NEW.claimed_at IS NOT NULL), false)
    THEN
        RAISE EXCEPTION 'staged call % of %: not the shape of its state %', NEW.id,
            NEW.gatekeeper, NEW.state USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $f$;

CREATE OR REPLACE FUNCTION gate_actions_json() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    IF jsonb_typeof(NEW.args_json::jsonb) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'staged call % of %: arguments that are not a JSON object', NEW.id,
            NEW.gatekeeper USING ERRCODE = 'check_violation';
    END IF;
    -- A result that is not JSON fails its cast.
    PERFORM NEW.result_json::jsonb;
    RETURN NEW;
END $f$;

DROP TRIGGER IF EXISTS ledger_rows ON ledger;
CREATE TRIGGER ledger_rows BEFORE INSERT OR UPDATE ON ledger
    FOR EACH ROW EXECUTE FUNCTION gate_ledger_rows();
DROP TRIGGER IF EXISTS ledger_json ON ledger;
CREATE TRIGGER ledger_json BEFORE INSERT OR UPDATE OF description_json, depends_on_json
    ON ledger FOR EACH ROW EXECUTE FUNCTION gate_ledger_json();
DROP TRIGGER IF EXISTS actions_rows ON actions;
CREATE TRIGGER actions_rows BEFORE INSERT OR UPDATE ON actions
    FOR EACH ROW EXECUTE FUNCTION gate_actions_rows();
DROP TRIGGER IF EXISTS actions_json ON actions;
CREATE TRIGGER actions_json BEFORE INSERT OR UPDATE OF args_json, result_json
    ON actions FOR EACH ROW EXECUTE FUNCTION gate_actions_json();
"#;

/// The tables a database of the current version has, checked on open.
pub(crate) const EXPECTED_TABLES: [&str; 7] = [
    "gate_schema",
    "ledger",
    "auto_approval_rules",
    "lockdown",
    "actions",
    "action_ids",
    "kv",
];

/// Version 3: the rule's time and scope, as `CREATE` writes them (absent ones only).
pub(crate) const RULE_SCOPE: &str = r#"
ALTER TABLE auto_approval_rules
    ADD COLUMN IF NOT EXISTS enabled_at bigint NOT NULL DEFAULT 0 CHECK (enabled_at >= 0),
    ADD COLUMN IF NOT EXISTS scope_json text NOT NULL DEFAULT '{}'
        CHECK (jsonb_typeof(scope_json::jsonb) = 'object');
"#;

/// Version 4: notifications name the writer's session and the latch notifies, as `CREATE`
/// makes them (replacing what is already there).
pub(crate) const LOCKDOWN_NOTIFY: &str = r#"
CREATE OR REPLACE FUNCTION gate_notify_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('gate_changes', TG_TABLE_NAME
        || coalesce(':' || nullif(current_setting('gate.session', true), ''), ''));
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS lockdown_changed ON lockdown;
CREATE TRIGGER lockdown_changed AFTER INSERT ON lockdown
    FOR EACH STATEMENT EXECUTE FUNCTION gate_notify_change();
"#;

/// Each upgrade step, from the version it starts at; a database runs every step from
/// its version on, in this order.
pub(crate) const UPGRADES: [(i32, &str); 4] = [
    (2, RULE_SCOPE),
    (3, LOCKDOWN_NOTIFY),
    (4, ROW_RULES_5),
    (5, STAGE_FUNCTION_6),
];

//! A child process for the two-process race test: two of these open one database file and
//! decide the same actions at the same moment, each with the real kernel, gatekeeper-core's
//! gatekeeper and action store, and a service that logs every delivery durably, naming
//! the process and the decision that sent it.
//!
//! ```text
//! race-worker <mode> <db> <dir> <role> <rounds>
//! race-worker hold-lock <db>
//! ```
//!
//! `hold-lock` is another process holding the file's write lock: it opens a write
//! transaction, prints `locked`, and holds it until its standard input closes.
//!
//! `mode` is `approve-approve`, `approve-reject` or `drain-person`; `role` is `a` or `b`.
//! Role `a` stages the actions, one per round (`deliverManual` with `{"seq": n}`, or
//! `deliverAuto` under a rule enabled by "rule-owner" in `drain-person`); both roles
//! wait for round n's action to appear in the ledger, wait a random moment, and decide
//! it:
//!
//! | mode | role a | role b |
//! |---|---|---|
//! | `approve-approve` | approves as `ann` | approves as `bob` |
//! | `approve-reject` | approves as `ann` | rejects as `rita` |
//! | `drain-person` | lets its auto-approval drain run | approves as `bob` |
//!
//! Then both wait until the action has left `pending` and go on to the next round.
//!
//! Files in `<dir>`: `deliveries.log` (the service's log, shared by both processes:
//! `deliver <seq> <role> <person or "drain">` per call) and `results-<role>.log` (what
//! each decision returned: `result <seq> ok` or `result <seq> refused <message>`), each
//! line appended and fsync'd before the worker goes on. `ready-<role>` marks a worker
//! that has opened the database; each waits for the other's before the first round.

#[path = "support/durable_log.rs"]
mod durable_log;

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use gatekeeper_core::{
    CallError, GatekeeperConfig, ServerTrust, Tool, ToolGatekeeper, ToolResult, ToolService,
};
use kernel::{ActionState, Clock, LedgerId, Overseer, SystemClock};
use serde_json::{Value, json};
use store_sqlite::Database;

use durable_log::DurableLog;

/// The gatekeeper's name in the kernel and in the database.
const GATEKEEPER: &str = "svc";

tokio::task_local! {
    /// The person whose decision is running in this task; unset in a drain.
    static PERSON: String;
}

/// The service: every delivery appended to the shared log, with who sent it.
struct LogService {
    log: DurableLog,
    role: String,
}

#[async_trait]
impl ToolService for LogService {
    async fn list_tools(&self) -> Vec<Tool> {
        catalog()
    }

    async fn call(&self, _tool: &str, args: &Value) -> Result<ToolResult, CallError> {
        let seq = args.get("seq").and_then(Value::as_u64).unwrap_or(0);
        let how = PERSON
            .try_with(Clone::clone)
            .unwrap_or_else(|_| "drain".to_owned());
        self.log.line(&format!("deliver {seq} {} {how}", self.role));
        Ok(ToolResult::from_text(format!("delivered {seq}")))
    }
}

fn catalog() -> Vec<Tool> {
    Tool::catalog_from_json(json!([
        {"name": "deliverAuto", "description": "Deliver a parcel (safe to repeat).",
         "annotations": {"destructiveHint": false, "idempotentHint": true}},
        {"name": "deliverManual", "description": "Deliver a parcel that needs a signature."}
    ]))
    .expect("valid catalog")
}

/// A small deterministic generator for the random waits (seeded per process).
struct Jitter(u64);

impl Jitter {
    fn next(&mut self) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        Duration::from_micros(self.0 % 1500)
    }
}

async fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready() {
        assert!(Instant::now() < deadline, "waited too long for {what}");
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

async fn run(mode: &str, db_path: &Path, dir: &Path, role: &str, rounds: u64) {
    let db = Database::open(db_path).expect("open the database");
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let overseer = Overseer::with_store(db.ledger(), clock.clone());
    let store = db
        .action_store(GATEKEEPER, clock)
        .await
        .expect("open the action store");
    let gatekeeper = Arc::new(ToolGatekeeper::new(
        GatekeeperConfig {
            name: GATEKEEPER.into(),
            server_name: "Parcel service".into(),
            endpoint: "https://parcels.example/mcp".into(),
            trust: ServerTrust::Vetted,
            scope: "mcp:parcels".into(),
            reads: Vec::new(),
        },
        catalog(),
        Arc::new(LogService {
            log: DurableLog::open(&dir.join("deliveries.log")),
            role: role.to_owned(),
        }),
        store,
    ));
    overseer.register(gatekeeper.clone()).expect("register");
    let session = gatekeeper
        .grant_on(
            overseer.queue_for(GATEKEEPER, "agent").expect("queue"),
            &["deliverAuto", "deliverManual"],
        )
        .expect("grant")
        .into_session();
    let results = DurableLog::open(&dir.join(format!("results-{role}.log")));
    let drain_mode = mode == "drain-person";
    if drain_mode && role == "a" {
        let kind = gatekeeper
            .action_kind("deliverAuto")
            .expect("in the catalog");
        overseer
            .enable_rule(GATEKEEPER, kind, "rule-owner")
            .expect("rule");
    }
    File::create(dir.join(format!("ready-{role}"))).expect("ready file");
    let other = if role == "a" { "b" } else { "a" };
    wait_for("the other worker", || {
        dir.join(format!("ready-{other}")).exists()
    })
    .await;

    let mut jitter = Jitter(u64::from(std::process::id()) * 2_654_435_761 + 1);
    for seq in 1..=rounds {
        let id = LedgerId(seq);
        if role == "a" {
            let tool = if drain_mode {
                "deliverAuto"
            } else {
                "deliverManual"
            };
            let outcome = session
                .call_tool(tool, json!({ "seq": seq }))
                .await
                .expect("stage and submit");
            assert_eq!(outcome.ledger(), Some(id), "one ledger entry per round");
        } else {
            wait_for("the round's action", || {
                overseer.entry(id).ok().flatten().is_some()
            })
            .await;
        }
        tokio::time::sleep(jitter.next()).await;
        let decision: Option<(&str, Result<(), kernel::DecisionError>)> = match (mode, role) {
            ("drain-person", "a") => {
                // The drain started by the submission runs while this task waits.
                overseer.settle().await;
                None
            }
            ("approve-reject", "b") => {
                let result = PERSON
                    .scope("rita".to_owned(), overseer.reject(id, "rita"))
                    .await;
                Some(("rita", result.map(|_| ())))
            }
            (_, "a") => Some((
                "ann",
                PERSON
                    .scope("ann".to_owned(), overseer.approve(id, "ann"))
                    .await,
            )),
            _ => Some((
                "bob",
                PERSON
                    .scope("bob".to_owned(), overseer.approve(id, "bob"))
                    .await,
            )),
        };
        if let Some((_, result)) = decision {
            match result {
                Ok(()) => results.line(&format!("result {seq} ok")),
                Err(error) => {
                    let text = error.to_string().replace('\n', " ");
                    results.line(&format!("result {seq} refused {text}"));
                }
            }
        }
        wait_for("the round's decision", || {
            overseer
                .entry(id)
                .ok()
                .flatten()
                .and_then(|e| e.action().map(|a| a.state != ActionState::Pending))
                .unwrap_or(false)
        })
        .await;
    }
    overseer.settle().await;
    db.flush().expect("flush");
    println!("done");
}

/// Hold the write lock of `db` until standard input closes.
fn hold_lock(db: &str) {
    let db = rusqlite::Connection::open(db).expect("open the database");
    db.execute_batch("BEGIN IMMEDIATE")
        .expect("take the write lock");
    println!("locked");
    std::io::stdout().flush().expect("flush");
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
    db.execute_batch("ROLLBACK")
        .expect("release the write lock");
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [mode, db] = &args[..]
        && mode == "hold-lock"
    {
        hold_lock(db);
        return;
    }
    let usage = "usage: race-worker approve-approve|approve-reject|drain-person <db> <dir> a|b <rounds> | hold-lock <db>";
    let [mode, db, dir, role, rounds] = &args[..] else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    if !["approve-approve", "approve-reject", "drain-person"].contains(&mode.as_str())
        || !["a", "b"].contains(&role.as_str())
    {
        eprintln!("{usage}");
        std::process::exit(2);
    }
    let rounds: u64 = rounds.parse().expect("a number of rounds");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    runtime.block_on(run(
        mode,
        &PathBuf::from(db),
        &PathBuf::from(dir),
        role,
        rounds,
    ));
}

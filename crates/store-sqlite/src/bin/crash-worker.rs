//! A child process for the crash test: the real kernel, gatekeeper-core's gatekeeper and
//! action store on a database file, and a service that logs every delivery durably.
//! The test kills it with SIGKILL at chosen points, restarts it, and checks the logs.
//!
//! ```text
//! crash-worker work   <db> <dir> <total> [--kill POINT:SCOPE:N]
//! crash-worker agents <db> <dir> <total>
//! crash-worker stage  <db> <dir> <count>
//! ```
//!
//! `work` stages actions 1..=total (every fifth manual, the rest auto-approvable under a
//! rule enabled by "rule-owner"), lets drains run, and plays a person who approves the
//! manual ones now and then; it resumes from whatever an earlier life left in the
//! database, and when everything is staged it approves what is left, prints `done` and
//! exits. With `--kill`, on the N-th time it reaches POINT (`claimed`: the claim is
//! committed and the call is about to be sent; `sent`: the delivery is logged and the
//! outcome not yet recorded; `settled`: the driver recorded the outcome, the kernel not
//! yet; `hung`: the delivery is logged and the service hangs, before the deadline passes;
//! `abandoned`: the apply ended without an answer, by the deadline or a panic, and the
//! kernel has not recorded it yet; `decided`: a person's approval returned, its outcome
//! committed without a sync of its own and not yet made durable by a later sync, which
//! the worker checks with the store's sync counts) within SCOPE (`any`, or `drain`: only
//! inside an auto-approval drain), it prints `KILLPOINT ...` and waits to be killed.
//!
//! Faults the service injects by `seq`: a multiple of [`HANG_EVERY`] is delivered and then
//! never answered (the gatekeeper's deadline, [`DEADLINE`], ends the wait); a multiple of
//! [`PANIC_EVERY`] is delivered and then panics. Both must end as "outcome unknown".
//!
//! `agents` runs [`AGENTS`] agents at once on one database handle, half of them a thread
//! each (on a runtime of its own) and half as tasks on one two-worker multi-threaded
//! runtime, as the daemon runs its agents (there a wait for a sync is a future): each
//! stages its share of 1..=total (all needing a person) and approves each as soon as it
//! is staged, so durable writes from several threads and tasks share transactions and
//! syncs (group commit). The test kills it at random moments; it resumes from what the
//! ledger holds and finishes like `work`.
//!
//! `stage` (the two-process test) stages `count` manual actions, slowly, while another
//! process decides them; it waits until all are decided and prints what it saw.
//!
//! Files in `<dir>`: `deliveries.log` (the service's own log: `deliver <seq>` per call)
//! and `journal.log` (`submitted <seq> <ledger id>`, `attempt <seq>`, `settled <seq>`),
//! each line appended and fsync'd before the worker goes on.

#[path = "support/durable_log.rs"]
mod durable_log;
#[path = "support/prompt_seq.rs"]
mod prompt_seq;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use gatekeeper_core::{
    CallError, GatekeeperConfig, ServerTrust, Session, StateTag, Tool, ToolGatekeeper, ToolResult,
    ToolService,
};
use kernel::{
    ActionKind, Clock, DriverActionId, Gatekeeper, GatekeeperError, LedgerStore, Overseer,
    RejectOutcome, RevertOutcome, SystemClock,
};
use serde_json::{Value, json};
use store_sqlite::Database;

use durable_log::DurableLog;
use prompt_seq::seq_in_prompt;

/// The gatekeeper's name in the kernel and in the database.
const GATEKEEPER: &str = "svc";

/// Every call whose `seq` is a multiple of this is delivered and then hangs.
const HANG_EVERY: u64 = 11;
/// Every call whose `seq` is a multiple of this (and not of [`HANG_EVERY`]) is delivered
/// and then panics.
const PANIC_EVERY: u64 = 13;
/// The gatekeeper's call deadline: short, so hung calls end quickly.
const DEADLINE: Duration = Duration::from_millis(60);
/// How many agents `agents` runs at once.
const AGENTS: u64 = 8;
/// The start of every panic the service injects (the panic hook stays quiet about them).
const PLANNED_PANIC: &str = "crash-worker: planned panic";

/// The store the worker runs on: the database file, as every process opens it.
#[derive(Clone)]
struct Store(Database);

impl Store {
    /// Open the database at `path`.
    fn open(path: &Path) -> Self {
        Self(Database::open(path).expect("open the database"))
    }

    fn ledger(&self) -> Arc<dyn LedgerStore> {
        self.0.ledger()
    }

    async fn action_store(&self, clock: Arc<dyn Clock>) -> gatekeeper_core::ActionStore {
        self.0
            .action_store(GATEKEEPER, clock)
            .await
            .expect("open the action store")
    }

    fn flush(&self) {
        self.0.flush().expect("flush");
    }

    /// The syncs of the write-ahead log: what a durable write waits for.
    fn syncs(&self) -> u64 {
        self.0.syncs()
    }

    /// The arguments of call `seq`.
    fn args(&self, seq: u64) -> Value {
        json!({"seq": seq})
    }

    /// What `agents` reports: how many commits reached the disk, and how many syncs.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![("commits", self.0.commits()), ("syncs", self.0.syncs())]
    }
}

/// Where the worker stops to be killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Point {
    Claimed,
    Sent,
    Settled,
    Hung,
    Abandoned,
    Decided,
}

struct KillPlan {
    point: Point,
    drain_only: bool,
    nth: u64,
    seen: AtomicU64,
}

/// Set while the worker waits in `settle`, where auto-approval drains run.
static IN_DRAIN: AtomicBool = AtomicBool::new(false);

struct Hooks {
    plan: Option<KillPlan>,
    store: Store,
    /// The store's sync count ([`Store::syncs`]) when the last call was delivered.
    synced_at_send: AtomicU64,
}

impl Hooks {
    fn reached(&self, point: Point, seq: u64) {
        let Some(plan) = &self.plan else {
            return;
        };
        if plan.point != point || (plan.drain_only && !IN_DRAIN.load(Ordering::SeqCst)) {
            return;
        }
        if plan.seen.fetch_add(1, Ordering::SeqCst) + 1 == plan.nth {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(
                out,
                "KILLPOINT {point:?} seq {seq} drain {}",
                plan.drain_only
            );
            let _ = out.flush();
            loop {
                std::thread::sleep(Duration::from_secs(60));
            }
        }
    }
}

fn seq_of(args: &Value) -> u64 {
    args.get("seq").and_then(Value::as_u64).unwrap_or(0)
}

/// The service: every delivery appended, durably, to its own log.
struct LogService {
    log: DurableLog,
    hooks: Arc<Hooks>,
}

#[async_trait]
impl ToolService for LogService {
    async fn list_tools(&self) -> Vec<Tool> {
        catalog()
    }

    async fn call(&self, _tool: &str, args: &Value) -> Result<ToolResult, CallError> {
        let seq = seq_of(args);
        self.hooks.reached(Point::Claimed, seq);
        self.log.line(&format!("deliver {seq}"));
        let hooks = &self.hooks;
        hooks
            .synced_at_send
            .store(hooks.store.syncs(), Ordering::SeqCst);
        hooks.reached(Point::Sent, seq);
        if seq.is_multiple_of(HANG_EVERY) {
            // Never answers: only the gatekeeper's deadline ends the wait.
            hooks.reached(Point::Hung, seq);
            std::future::pending::<()>().await;
        }
        if seq.is_multiple_of(PANIC_EVERY) {
            panic!("{PLANNED_PANIC} after delivering {seq}");
        }
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

/// The real gatekeeper, with the journal lines and the `settled` kill point around apply.
struct Recorded {
    inner: Arc<ToolGatekeeper>,
    journal: Arc<DurableLog>,
    hooks: Arc<Hooks>,
}

#[async_trait]
impl Gatekeeper for Recorded {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn apply_action(&self, action: DriverActionId) -> Result<(), GatekeeperError> {
        let seq = match self.inner.store().get(action).await {
            Ok(Some(record)) => seq_of(&record.args),
            _ => 0,
        };
        self.journal.line(&format!("attempt {seq}"));
        let mut unanswered = Unanswered {
            hooks: &self.hooks,
            seq,
            answered: false,
        };
        let result = self.inner.apply_action(action).await;
        unanswered.answered = true;
        self.journal.line(&format!("settled {seq}"));
        self.hooks.reached(Point::Settled, seq);
        result
    }

    async fn reject_action(
        &self,
        action: DriverActionId,
    ) -> Result<RejectOutcome, GatekeeperError> {
        self.inner.reject_action(action).await
    }

    async fn revert_action(
        &self,
        action: DriverActionId,
    ) -> Result<RevertOutcome, GatekeeperError> {
        self.inner.revert_action(action).await
    }

    fn auto_approvable_actions(&self) -> Vec<ActionKind> {
        self.inner.auto_approvable_actions()
    }

    fn call_deadline(&self) -> Duration {
        self.inner.call_deadline()
    }
}

/// Reaches the `abandoned` kill point if an apply ends without an answer: its future was
/// dropped at the deadline, or a panic unwinds through it.
struct Unanswered<'a> {
    hooks: &'a Hooks,
    seq: u64,
    answered: bool,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.hooks.reached(Point::Abandoned, self.seq);
        }
    }
}

struct World {
    overseer: Overseer,
    gatekeeper: Arc<ToolGatekeeper>,
    session: Session,
    journal: Arc<DurableLog>,
    auto_kind: ActionKind,
    hooks: Arc<Hooks>,
}

async fn world(db: &Store, dir: &Path, plan: Option<KillPlan>) -> World {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let hooks = Arc::new(Hooks {
        plan,
        store: db.clone(),
        synced_at_send: AtomicU64::new(0),
    });
    let journal = Arc::new(DurableLog::open(&dir.join("journal.log")));
    let overseer = Overseer::with_store(db.ledger(), clock.clone());
    let store = db.action_store(clock).await;
    let service = Arc::new(LogService {
        log: DurableLog::open(&dir.join("deliveries.log")),
        hooks: hooks.clone(),
    });
    let inner = Arc::new(
        ToolGatekeeper::new(
            GatekeeperConfig {
                name: GATEKEEPER.into(),
                server_name: "Parcel service".into(),
                endpoint: "https://parcels.example/mcp".into(),
                trust: ServerTrust::Vetted,
                scope: "mcp:parcels".into(),
                reads: Vec::new(),
            },
            catalog(),
            service,
            store,
        )
        .with_call_deadline(DEADLINE),
    );
    let auto_kind = inner.action_kind("deliverAuto").expect("in the catalog");
    overseer
        .register(Arc::new(Recorded {
            inner: inner.clone(),
            journal: journal.clone(),
            hooks: hooks.clone(),
        }))
        .expect("register");
    let queue = overseer.queue_for(GATEKEEPER, "agent").expect("queue");
    let session = inner
        .grant_on(queue, &["deliverAuto", "deliverManual"])
        .expect("grant")
        .into_session();
    World {
        overseer,
        gatekeeper: inner,
        session,
        journal,
        auto_kind,
        hooks,
    }
}

async fn settle(overseer: &Overseer) {
    IN_DRAIN.store(true, Ordering::SeqCst);
    overseer.settle().await;
    IN_DRAIN.store(false, Ordering::SeqCst);
}

/// Approve the open actions a person must decide (or every open one), oldest first.
async fn person(world: &World, everything: bool) {
    for entry in world.overseer.open_actions().expect("open actions") {
        let manual = !entry
            .action()
            .is_some_and(|a| a.description.auto_approvable);
        if manual || everything {
            // A refusal (decided meanwhile, in flight) is fine: the next round sees it.
            let Some(action) = entry.action() else {
                continue;
            };
            let seq = match world.gatekeeper.store().get(action.driver_id).await {
                Ok(Some(record)) => seq_of(&record.args),
                _ => 0,
            };
            let approved = world.overseer.approve(entry.id, "person").await;
            if approved.is_ok() {
                // The outcome is committed, and no sync has run since the claim's
                // (nothing is awaited between the approval's return and here).
                let hooks = &world.hooks;
                assert_eq!(
                    hooks.store.syncs(),
                    hooks.synced_at_send.load(Ordering::SeqCst),
                    "a person's outcome was synced on its own"
                );
                hooks.reached(Point::Decided, seq);
            }
        }
    }
}

async fn work(db_path: &Path, dir: &Path, total: u64, plan: Option<KillPlan>) {
    let db = Store::open(db_path);
    let world = world(&db, dir, plan).await;
    // Enabling the rule again (same person) drains whatever an earlier life left pending.
    world
        .overseer
        .enable_rule(GATEKEEPER, world.auto_kind.clone(), "rule-owner")
        .expect("rule");
    settle(&world.overseer).await;
    let submitted = world
        .overseer
        .ledger()
        .expect("ledger")
        .iter()
        .filter(|e| e.action().is_some())
        .count() as u64;
    for seq in submitted + 1..=total {
        let tool = if seq % 5 == 0 {
            "deliverManual"
        } else {
            "deliverAuto"
        };
        let outcome = world
            .session
            .call_tool(tool, db.args(seq))
            .await
            .expect("stage and submit");
        let ledger = outcome.ledger().expect("an action is pending");
        world.journal.line(&format!("submitted {seq} {}", ledger.0));
        if seq % 3 == 0 {
            settle(&world.overseer).await;
        }
        if seq % 7 == 0 {
            person(&world, false).await;
            settle(&world.overseer).await;
        }
    }
    finish(&world, &db).await;
}

/// Approve whatever is left, check that no claim is left applying and no staged call
/// lacks its ledger entry, make everything durable and print `done`.
async fn finish(world: &World, db: &Store) {
    decide_everything_open(world).await;
    // Calls that hung or panicked in this life are settled without a restart: nothing is
    // left claimed.
    let store = world.gatekeeper.store();
    store.settle_stranded().await;
    let claimed = store
        .storage()
        .records_in(StateTag::Applying)
        .await
        .expect("records");
    let ledger = world.overseer.ledger().expect("ledger");
    let describe = |record: &gatekeeper_core::ActionRecord| {
        let entry = ledger
            .iter()
            .find(|e| e.action().is_some_and(|a| a.driver_id == record.id))
            .and_then(|e| e.action().map(|a| (a.state, a.failure.clone())));
        format!(
            "action {} seq {}: ledger {entry:?}",
            record.id,
            seq_of(&record.args)
        )
    };
    let claimed: Vec<String> = claimed.iter().map(describe).collect();
    assert!(claimed.is_empty(), "claims left applying: {claimed:#?}");
    // A staged call the kernel never recorded (an earlier life was killed between the
    // two) was never acknowledged to the agent; opening discards it, so none is left.
    let unrecorded: Vec<String> = store
        .pending()
        .await
        .expect("records")
        .iter()
        .filter(|r| {
            !ledger
                .iter()
                .any(|e| e.action().is_some_and(|a| a.driver_id == r.id))
        })
        .map(describe)
        .collect();
    assert!(
        unrecorded.is_empty(),
        "staged but never recorded by the kernel: {unrecorded:?}"
    );
    db.flush();
    println!("done");
}

/// Approve every open action, until none is left.
async fn decide_everything_open(world: &World) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !world.overseer.open_actions().expect("open").is_empty() {
        assert!(Instant::now() < deadline, "open actions did not drain");
        person(world, true).await;
        settle(&world.overseer).await;
    }
}

fn agents(db_path: &Path, dir: &Path, total: u64) {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime")
    };
    let db = Store::open(db_path);
    let world = runtime().block_on(world(&db, dir, None));
    // What earlier lives left open first: the store holds a bounded number of open calls.
    runtime().block_on(decide_everything_open(&world));
    let staged: std::collections::HashSet<u64> = world
        .overseer
        .ledger()
        .expect("ledger")
        .iter()
        .filter_map(|e| e.action())
        .filter_map(|a| seq_in_prompt(&a.description.description))
        .collect();
    let before = db.counters();
    let (world, staged, db) = (Arc::new(world), Arc::new(staged), Arc::new(db));
    // One agent's work: stage its share, approving each as soon as it is staged.
    let agent_work = |agent: u64| {
        let (world, staged, db) = (world.clone(), staged.clone(), db.clone());
        async move {
            let mine = (1..=total).filter(|seq| seq % AGENTS == agent);
            for seq in mine.filter(|seq| !staged.contains(seq)) {
                let outcome = world
                    .session
                    .call_tool("deliverManual", db.args(seq))
                    .await
                    .expect("stage and submit");
                let ledger = outcome.ledger().expect("an action is pending");
                world.journal.line(&format!("submitted {seq} {}", ledger.0));
                // A refusal (a hung call's deadline, a panic) is the ledger's to record;
                // the check at the end reads it there.
                let _ = world.overseer.approve(ledger, "person").await;
            }
        }
    };
    std::thread::scope(|scope| {
        for agent in 0..AGENTS / 2 {
            let work = agent_work(agent);
            scope.spawn(move || runtime().block_on(work));
        }
        let tasks: Vec<_> = (AGENTS / 2..AGENTS).map(agent_work).collect();
        scope.spawn(move || {
            let workers = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_time()
                .build()
                .expect("runtime");
            workers.block_on(async {
                let handles: Vec<_> = tasks.into_iter().map(tokio::spawn).collect();
                for handle in handles {
                    handle.await.expect("an agent's task");
                }
            })
        });
    });
    let left = total - staged.len() as u64;
    let spent: Vec<String> = db
        .counters()
        .iter()
        .zip(&before)
        .map(|((what, now), (_, then))| format!("{} {what}", now - then))
        .collect();
    eprintln!(
        "agents: {left} actions staged and approved by {AGENTS} agents in {}",
        spent.join(", ")
    );
    runtime().block_on(finish(&world, &db));
}

async fn stage(db_path: &Path, dir: &Path, count: u64) {
    // Two processes on one file: only a shared file allows it.
    let db = Store::open(db_path);
    let world = world(&db, dir, None).await;
    for seq in 1..=count {
        let outcome = world
            .session
            .call_tool("deliverManual", json!({"seq": seq}))
            .await
            .expect("stage and submit");
        world.journal.line(&format!(
            "submitted {seq} {}",
            outcome.ledger().expect("pending").0
        ));
        std::thread::sleep(Duration::from_millis(2));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ledger = world.overseer.ledger().expect("ledger");
        let open = ledger
            .iter()
            .filter(|e| e.action().is_some_and(|a| a.is_open()))
            .count();
        if open == 0 {
            let count = |state: kernel::ActionState| {
                ledger
                    .iter()
                    .filter(|e| e.action().is_some_and(|a| a.state == state))
                    .count()
            };
            println!(
                "decided approved {} rejected {}",
                count(kernel::ActionState::Approved),
                count(kernel::ActionState::Rejected)
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{open} actions were never decided"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn parse_plan(spec: &str) -> KillPlan {
    let parts: Vec<&str> = spec.split(':').collect();
    let [point, scope, nth] = parts[..] else {
        panic!("--kill wants POINT:SCOPE:N, got {spec:?}");
    };
    KillPlan {
        point: match point {
            "claimed" => Point::Claimed,
            "sent" => Point::Sent,
            "settled" => Point::Settled,
            "hung" => Point::Hung,
            "abandoned" => Point::Abandoned,
            "decided" => Point::Decided,
            other => panic!("unknown kill point {other:?}"),
        },
        drain_only: match scope {
            "any" => false,
            "drain" => true,
            other => panic!("unknown kill scope {other:?}"),
        },
        nth: nth.parse().expect("N is a number"),
        seen: AtomicU64::new(0),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: crash-worker work <db> <dir> <total> [--kill POINT:SCOPE:N] | crash-worker agents <db> <dir> <total> | crash-worker stage <db> <dir> <count>";
    if args.len() < 4 {
        eprintln!("{usage}");
        std::process::exit(2);
    }
    let db = PathBuf::from(&args[1]);
    let dir = PathBuf::from(&args[2]);
    let n: u64 = args[3].parse().expect("a count");
    let plan = match args.get(4).map(String::as_str) {
        Some("--kill") => Some(parse_plan(args.get(5).expect("--kill wants a plan"))),
        _ => None,
    };
    let planned = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .unwrap_or_default();
        if !message.starts_with(PLANNED_PANIC) {
            planned(info);
        }
    }));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    match args[0].as_str() {
        "work" => runtime.block_on(work(&db, &dir, n, plan)),
        "agents" => agents(&db, &dir, n),
        "stage" => runtime.block_on(stage(&db, &dir, n)),
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    }
}

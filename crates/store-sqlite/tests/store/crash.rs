//! The crash test: a child process runs the real stack on a database file and is killed
//! with SIGKILL, at injected points and at random moments, many times; a fresh process
//! reopens the database each time and carries on, and a last one finishes the work.
//!
//! Then the invariants, from the service's own log and the worker's journal:
//! 1. no delivery appears twice in the service's log;
//! 2. every delivery is in the ledger as applied, or as failed with unknown outcome;
//! 3. every applied action was delivered;
//! 4. no submitted action was lost, and none is left undecided;
//! 5. nothing was applied automatically past an action that was still waiting for a
//!    person: when an auto-approved action was attempted, every earlier action had been
//!    settled, or had been claimed and then interrupted;
//! 6. every call the service hung on (until the gatekeeper's deadline) or panicked in is
//!    in the ledger as failed with unknown outcome, never as applied or open;
//! 7. an action killed right after a person's approval returned (`decided`, below) is in
//!    the ledger as applied, unless its call hung or panicked: a process kill keeps a
//!    committed outcome.
//!
//! The worker's service hangs on every 11th call and panics in every 13th, after
//! delivering; kills land inside a hung call (`hung`) and between an apply that ended
//! without an answer and the kernel's record of it (`abandoned`), as well as at the
//! points of an ordinary apply.
//!
//! A kill also lands after a person's approval returned with its outcome committed but
//! not yet synced (`decided`): the outcome rides on the next sync, and the worker checks
//! that none ran. (What a power cut does to such an outcome is `power_cut.rs`.)
//!
//! The eight agents are half threads, half tasks on one multi-threaded runtime, as the
//! daemon runs its agents (see the worker's docs).
//!
//! `CRASH_SOAK=<kills>` runs a longer soak (for example `CRASH_SOAK=500`);
//! `CRASH_SEED=<n>` replays a run.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kernel::{ActionState, LedgerEntry};
use store_sqlite::Database;

use crate::support::TempDir;

#[path = "../../src/bin/support/prompt_seq.rs"]
mod prompt_seq;

const WORKER: &str = env!("CARGO_BIN_EXE_crash-worker");
/// The worker's service hangs on calls whose `seq` is a multiple of this (`crash-worker.rs`).
const HANG_EVERY: u64 = 11;
/// The worker's service panics in calls whose `seq` is a multiple of this.
const PANIC_EVERY: u64 = 13;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn spawn(args: &[&str]) -> Child {
    Command::new(WORKER)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the worker")
}

/// How one life of the worker ended.
#[derive(Debug, PartialEq, Eq)]
enum End {
    Killed(String),
    Finished,
}

/// Run until the worker reports its kill point, then SIGKILL it.
fn run_to_point(args: &[&str]) -> End {
    let mut child = spawn(args);
    let stdout = child.stdout.take().expect("piped");
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("worker output");
        if line.starts_with("KILLPOINT") {
            child.kill().expect("SIGKILL");
            child.wait().expect("reap");
            return End::Killed(line);
        }
        if line == "done" {
            assert!(child.wait().expect("reap").success());
            return End::Finished;
        }
    }
    let status = child.wait().expect("reap");
    panic!("the worker ended without reaching its kill point: {status}");
}

/// Let the worker run for `after`, then SIGKILL it wherever it is.
fn run_and_kill_after(args: &[&str], after: Duration) -> End {
    let mut child = spawn(args);
    let started = Instant::now();
    while started.elapsed() < after {
        if let Some(status) = child.try_wait().expect("poll") {
            assert!(status.success(), "the worker failed: {status}");
            return End::Finished;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    child.kill().expect("SIGKILL");
    let status = child.wait().expect("reap");
    if status.success() {
        End::Finished
    } else {
        End::Killed(format!("random after {after:?}"))
    }
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The `seq` argument rendered in an action's approval prompt.
fn seq_of(entry: &LedgerEntry) -> u64 {
    let prompt = &entry.action().expect("an action").description.description;
    prompt_seq::seq_in_prompt(prompt).expect("the prompt shows the `seq` argument")
}

/// The kills wanted (`CRASH_SOAK`, or `default`) and the random seed (`CRASH_SEED`, or
/// the clock), printed so a run can be replayed.
fn soak_and_seed(what: &str, default: u64) -> (u64, Rng) {
    let soak: Option<u64> = std::env::var("CRASH_SOAK")
        .ok()
        .map(|v| v.parse().unwrap_or(500).max(1));
    let kills_wanted = soak.unwrap_or(default);
    let seed = std::env::var("CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
                | 1
        });
    eprintln!("{what}: seed {seed} (replay with CRASH_SEED={seed}), {kills_wanted} kills");
    (kills_wanted, Rng(seed))
}

/// A fresh directory with the database path in it, and both as the worker's arguments.
fn worker_files(label: &str) -> (TempDir, PathBuf, String, String) {
    let dir = TempDir::new(&label.replace(' ', "-"));
    let db = dir.join("gate.db");
    let db_arg = db.to_str().unwrap().to_owned();
    let dir_arg = dir.join("").to_str().unwrap().to_owned();
    (dir, db, db_arg, dir_arg)
}

#[test]
fn killed_workers_never_send_twice_and_lose_nothing() {
    killed_workers();
}

#[test]
fn killed_concurrent_agents_never_send_twice_and_lose_nothing() {
    killed_concurrent_agents();
}

/// One worker at a time, killed at every point in turn and at random moments.
fn killed_workers() {
    let what = "crash test";
    let (kills_wanted, mut rng) = soak_and_seed(what, 60);
    // Grows whenever a life finishes the work before it is killed, so there is always
    // work left to be killed in.
    let mut total = 2 * kills_wanted + 20;

    let (dir, db, db_arg, dir_arg) = worker_files("crash");
    // The actions whose approval returned just before a kill (`decided`).
    let mut decided = Vec::new();
    let mut kills: BTreeMap<String, u64> = BTreeMap::new();
    let mut lives = 0;
    let started = Instant::now();
    let mut life = 0u64;
    while kills.values().sum::<u64>() < kills_wanted {
        life += 1;
        assert!(life < 20 * kills_wanted, "too few lives ended in a kill");
        lives += 1;
        let total_arg = total.to_string();
        let end = if life.is_multiple_of(3) {
            let after = Duration::from_millis(5 + rng.below(80));
            run_and_kill_after(&["work", &db_arg, &dir_arg, &total_arg], after)
        } else {
            // Every point, in and out of a drain, in turn; how far into the life, at random.
            const POINTS: [&str; 6] =
                ["claimed", "sent", "settled", "hung", "abandoned", "decided"];
            let combo = (life - life / 3) % (2 * POINTS.len() as u64);
            let point = POINTS[(combo % POINTS.len() as u64) as usize];
            // A person decides outside drains.
            let scope = if combo < POINTS.len() as u64 || point == "decided" {
                "any"
            } else {
                "drain"
            };
            // Hangs and panics are rarer than sends: reach them sooner, or the life ends first.
            let reach = if matches!(point, "hung" | "abandoned") {
                2
            } else {
                4
            };
            let plan = format!("{point}:{scope}:{}", 1 + rng.below(reach));
            run_to_point(&["work", &db_arg, &dir_arg, &total_arg, "--kill", &plan])
        };
        match end {
            End::Killed(at) => {
                let kind = if at.starts_with("random") {
                    "random moment".to_owned()
                } else {
                    // `KILLPOINT <point> seq <seq> drain <bool>`
                    let words: Vec<&str> = at.split_whitespace().collect();
                    let point = words.get(1).copied().unwrap_or("?").to_owned();
                    if point == "Decided" {
                        decided.push(words[3].parse::<u64>().expect("the killed seq"));
                    }
                    let drain = at.ends_with("drain true");
                    format!("{point}{}", if drain { " (in a drain)" } else { "" })
                };
                *kills.entry(kind).or_default() += 1;
            }
            End::Finished => total += 20,
        }
    }
    // A fresh process finishes the work.
    assert_eq!(
        run_to_point(&["work", &db_arg, &dir_arg, &total.to_string()]),
        End::Finished
    );
    lives += 1;

    let checked = invariants(&dir, &db, total, &decided);
    let Checked {
        actions,
        delivered,
        unknown,
        faulted,
        auto_applied,
        approvals_kept,
    } = checked;

    let killed: u64 = kills.values().sum();
    eprintln!(
        "{what}: {killed} kills survived over {lives} lives in {:?} ({kills:?}); \
         {} actions, {} delivered, 0 duplicates, {unknown} outcome unknown \
         ({faulted} of them hung or panicked), {auto_applied} auto-applied, \
         {approvals_kept} approvals kept across a kill",
        started.elapsed(),
        actions,
        delivered,
    );
    assert!(killed >= kills_wanted);
    assert!(
        unknown > 0,
        "no kill landed between a claim and its outcome"
    );
}

#[test]
fn one_process_stages_while_another_decides() {
    const COUNT: u64 = 40;
    let dir = TempDir::new("two-processes");
    let db = dir.join("gate.db");
    // Create the file first so both processes open a database that exists.
    drop(Database::open(&db).unwrap());
    let mut stager = spawn(&[
        "stage",
        db.to_str().unwrap(),
        dir.join("").to_str().unwrap(),
        &COUNT.to_string(),
    ]);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let decided = runtime.block_on(async {
        let database = Database::open(&db).unwrap();
        let clock: std::sync::Arc<dyn kernel::Clock> = std::sync::Arc::new(kernel::SystemClock);
        let overseer = kernel::Overseer::with_store(database.ledger(), clock.clone());
        let store = database.action_store("svc", clock).await.unwrap();
        let service = std::sync::Arc::new(crate::support::RecordingService::default());
        let gatekeeper = std::sync::Arc::new(gatekeeper_core::ToolGatekeeper::new(
            gatekeeper_core::GatekeeperConfig {
                name: "svc".into(),
                server_name: "Parcel service".into(),
                endpoint: "https://parcels.example/mcp".into(),
                trust: gatekeeper_core::ServerTrust::Vetted,
                scope: "mcp:parcels".into(),
                reads: Vec::new(),
            },
            Vec::new(),
            service.clone(),
            store,
        ));
        overseer.register(gatekeeper).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut decided = 0;
        while decided < COUNT {
            assert!(Instant::now() < deadline, "decided only {decided}");
            for entry in overseer.open_actions().unwrap() {
                if decided % 2 == 0 {
                    overseer.approve(entry.id, "reviewer").await.unwrap();
                } else {
                    overseer.reject(entry.id, "reviewer").await.unwrap();
                }
                decided += 1;
            }
            std::thread::sleep(Duration::from_millis(3));
        }
        assert_eq!(service.calls().len() as u64, COUNT / 2);
        overseer.ledger().unwrap()
    });

    let mut out = String::new();
    std::io::Read::read_to_string(&mut stager.stdout.take().unwrap(), &mut out).unwrap();
    assert!(stager.wait().unwrap().success());
    assert_eq!(
        out.trim(),
        format!("decided approved {} rejected {}", COUNT / 2, COUNT / 2),
        "the staging process saw the reviewer's decisions"
    );
    assert_eq!(decided.len() as u64, COUNT);
}

/// Eight agents on one database handle, their durable writes sharing transactions and
/// syncs (group commit), killed at random moments: a kill lands while writes sit in a
/// shared transaction not yet committed, or committed and not yet synced, or between a
/// claim and its outcome. The same invariants hold.
fn killed_concurrent_agents() {
    let what = "concurrent crash test";
    let (kills_wanted, mut rng) = soak_and_seed(what, 20);
    let mut total = 8 * kills_wanted + 40;
    let (dir, db, db_arg, dir_arg) = worker_files("crash agents");
    let started = Instant::now();
    let (mut killed, mut lives) = (0, 0);
    while killed < kills_wanted {
        lives += 1;
        assert!(lives < 20 * kills_wanted, "too few lives ended in a kill");
        let after = Duration::from_millis(20 + rng.below(120));
        let args = ["agents", &db_arg, &dir_arg, &total.to_string()];
        match run_and_kill_after(&args, after) {
            End::Killed(_) => killed += 1,
            End::Finished => total += 40,
        }
    }
    assert_eq!(
        run_to_point(&["agents", &db_arg, &dir_arg, &total.to_string()]),
        End::Finished
    );
    lives += 1;
    let Checked {
        actions,
        delivered,
        unknown,
        faulted,
        ..
    } = invariants(&dir, &db, total, &[]);
    eprintln!(
        "{what}: {killed} kills over {lives} lives in {:?}; {actions} actions, \
         {delivered} delivered, 0 duplicates, {unknown} outcome unknown ({faulted} of them \
         hung or panicked)",
        started.elapsed(),
    );
}

/// What [`invariants`] counted.
struct Checked {
    actions: usize,
    delivered: usize,
    unknown: usize,
    faulted: usize,
    auto_applied: usize,
    /// Approvals killed right after they returned (`decided`) whose outcome was kept.
    approvals_kept: usize,
}

/// Check the invariants listed in the module docs on what the lives left in
/// `dir` and the database `db`, after `total` actions were submitted, of which those in
/// `decided` were killed right after a person's approval returned.
fn invariants(dir: &TempDir, db: &Path, total: u64, decided: &[u64]) -> Checked {
    let deliveries = lines(&dir.join("deliveries.log"));
    let journal = lines(&dir.join("journal.log"));
    let ledger = Database::open(db).unwrap().ledger();
    let ledger: Vec<LedgerEntry> = ledger
        .entries()
        .unwrap()
        .into_iter()
        .filter(|e| e.action().is_some())
        .collect();

    // 1. No delivery twice.
    let mut delivered: HashMap<u64, usize> = HashMap::new();
    for line in &deliveries {
        let seq: u64 = line.strip_prefix("deliver ").unwrap().parse().unwrap();
        *delivered.entry(seq).or_default() += 1;
    }
    let duplicates: Vec<_> = delivered.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        duplicates.is_empty(),
        "delivered more than once: {duplicates:?}"
    );

    let by_seq: HashMap<u64, &LedgerEntry> = ledger.iter().map(|e| (seq_of(e), e)).collect();
    assert_eq!(by_seq.len(), ledger.len(), "two ledger entries for one seq");

    // 2. Every delivery is in the ledger as applied or outcome unknown, with its approver.
    let mut unknown = 0;
    for seq in delivered.keys() {
        let entry = by_seq
            .get(seq)
            .unwrap_or_else(|| panic!("delivery {seq} not in the ledger"));
        let action = entry.action().unwrap();
        // Who approved it is on disk, even when the process died mid-apply: the kernel's
        // record of the decision rides with the claim.
        assert!(
            action.resolution.as_ref().is_some_and(|r| !r.by.is_empty()),
            "delivery {seq} has no record of who approved it"
        );
        match (action.state, &action.failure) {
            (ActionState::Approved, _) => {}
            (ActionState::Failed, Some(f)) if !f.retryable => unknown += 1,
            other => panic!("delivery {seq} is in the ledger as {other:?}"),
        }
    }

    // 3. Every applied action was delivered; 4. nothing lost, nothing left open.
    assert_eq!(
        ledger.len() as u64,
        total,
        "every action was submitted once"
    );
    for entry in &ledger {
        let action = entry.action().unwrap();
        let seq = seq_of(entry);
        match action.state {
            ActionState::Approved => {
                assert!(delivered.contains_key(&seq), "{seq} applied, not delivered")
            }
            ActionState::Failed => {
                assert!(
                    !action.failure.as_ref().unwrap().retryable,
                    "{seq} failed retryably"
                );
            }
            other => panic!("action {seq} was left {other}"),
        }
    }
    for line in &journal {
        if let Some(rest) = line.strip_prefix("submitted ") {
            let mut parts = rest.split(' ');
            let seq: u64 = parts.next().unwrap().parse().unwrap();
            let id: u64 = parts.next().unwrap().parse().unwrap();
            let entry = by_seq
                .get(&seq)
                .unwrap_or_else(|| panic!("submitted {seq} was lost"));
            assert_eq!(entry.id.0, id, "submitted {seq} changed its ledger id");
        }
    }

    // 5. Never past a waiting person.
    let position = |prefix: &str| -> HashMap<u64, Vec<usize>> {
        let mut at: HashMap<u64, Vec<usize>> = HashMap::new();
        for (i, line) in journal.iter().enumerate() {
            if let Some(seq) = line.strip_prefix(prefix) {
                at.entry(seq.parse().unwrap()).or_default().push(i);
            }
        }
        at
    };
    let attempts = position("attempt ");
    let settled = position("settled ");
    let mut auto_applied = 0;
    for entry in &ledger {
        let action = entry.action().unwrap();
        if !(action.state == ActionState::Approved
            && action.resolution.as_ref().is_some_and(|r| r.auto))
        {
            continue;
        }
        auto_applied += 1;
        let seq = seq_of(entry);
        let attempted = *attempts[&seq].last().unwrap();
        for earlier in ledger.iter().filter(|e| e.id < entry.id) {
            let e_seq = seq_of(earlier);
            let before = |at: &HashMap<u64, Vec<usize>>| {
                at.get(&e_seq)
                    .is_some_and(|v| v.iter().any(|&i| i < attempted))
            };
            let interrupted = earlier
                .action()
                .unwrap()
                .failure
                .as_ref()
                .is_some_and(|f| !f.retryable);
            assert!(
                before(&settled) || (interrupted && before(&attempts)),
                "auto-applied {seq} was attempted while {e_seq} still waited"
            );
        }
    }

    // 6. A hung or panicking call is an unknown outcome, never applied, never open.
    let mut faulted = 0;
    for entry in &ledger {
        let seq = seq_of(entry);
        if !(seq.is_multiple_of(HANG_EVERY) || seq.is_multiple_of(PANIC_EVERY)) {
            continue;
        }
        faulted += 1;
        let action = entry.action().unwrap();
        assert!(
            action.state == ActionState::Failed
                && action.failure.as_ref().is_some_and(|f| !f.retryable),
            "{seq} hung or panicked but is in the ledger as {:?} {:?}",
            action.state,
            action.failure
        );
    }
    assert!(faulted > 0, "no call hung or panicked");

    // 7. A person's approval that returned survives a kill right after it: its outcome
    //    was committed (behind a journal: written to the journal file), not lost and
    //    recovered as interrupted.
    let mut approvals_kept = 0;
    for seq in decided {
        if seq.is_multiple_of(HANG_EVERY) || seq.is_multiple_of(PANIC_EVERY) {
            continue;
        }
        approvals_kept += 1;
        let action = by_seq[seq].action().unwrap();
        assert_eq!(
            action.state,
            ActionState::Approved,
            "{seq} was killed after its approval returned, and is in the ledger as {:?}",
            action.failure
        );
    }

    Checked {
        actions: ledger.len(),
        delivered: delivered.len(),
        unknown,
        faulted,
        auto_applied,
        approvals_kept,
    }
}

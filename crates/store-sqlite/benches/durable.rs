//! Benchmarks of durable storage on the one store there is, the shared SQLite file
//! (`Database`: write-ahead log, one writer that batches the commits of concurrent
//! callers), each target printed beside a baseline from the same run, with what each step
//! costs: commits (counted with SQLite's commit hook, `Database::commits`), syncs of the
//! write-ahead log (`Database::syncs`) and the process's processor time. (The daemon's
//! store used to be a redo journal in front of SQLite; it is now this file.) The targets
//! are issue 42's.
//!
//! On a file, in the same directory as the raw baseline:
//! - `raw_fsync_4k`: the baseline, a raw 4 KiB write + fsync.
//! - `durable_cycle`: stage → approve → apply → outcome for one action, through the real
//!   kernel, gatekeeper-core's gatekeeper and session. Targets: median ≤ 1.6 × the median
//!   of 2 × `raw_fsync_4k`, and exactly 2 synced commits per cycle (stage, claim; the
//!   outcome is committed without a sync of its own and rides on the next one).
//! - `interleaved`: the same cycle and two raw write+fsyncs taken turn about in every
//!   iteration; the disk's latency drifts by ±15% between benchmarks a minute apart, and
//!   this ratio does not depend on it. Same target.
//! - `sessions_1`, `sessions_16`: the same cycle from 1 and from 16 sessions at once on
//!   one file (a thread each, which lives as long as the benchmark). Targets for 16:
//!   ≤ 0.5 syncs per action (group commit), and throughput ≥ 1.5 × that of 1 session
//!   measured in the same run.
//! - `tasks_1`, `tasks_16`: the same again as the daemon runs its agents: tasks on one
//!   multi-threaded tokio runtime with a worker per processor, where a caller's wait for
//!   its sync leaves the worker to the other tasks (`block_in_place`). Same targets.
//! - `sessions_turns/turn_about`, `tasks_turns/turn_about`: one session and sixteen
//!   taken turn about, each on a file of its own (32 actions from one, then 32 from each
//!   of sixteen, in every iteration), on threads and as tasks: the throughput ratio of
//!   the two benchmarks above compares runs seconds apart, and the disk's latency drifts
//!   by tens of percent in that time; this one does not. Same targets.
//! - `drain_1000`: one drain of 1,000 auto-approved actions. Target: ≤ 1.05 syncs per
//!   applied action (the stages and the rule's own commit are not counted). The action
//!   store caps a store at 50 open calls, so the 1,000 are staged straight through the
//!   storage port with a larger cap and submitted to the kernel as the session would.
//!
//! On SQLite in memory, each measured two ways: on a fresh world per iteration (built
//! outside the measurement: the first turn of a new process, caches cold), and steady
//! (one world, turn after turn, as in a process that has been running a while):
//! - `memory_turn`, `memory_turn_steady`: the ex03 turn, one read then three actions
//!   staged. Target ≤ 15 µs. Steady, the three are rejected after each turn, outside the
//!   measurement, so the store never fills.
//! - `memory_cycle`, `memory_cycle_steady`: stage + approve + apply (+ the drain it
//!   triggers). Target ≤ 10 µs.
//!
//! Floors, to tell what the targets leave to win (plain rusqlite, no kernel, no
//! gatekeeper-core, no adapters):
//! - `sqlite_commit_floor`: the smallest commit SQLite can make on the same file system
//!   (one integer of a one-row table, WAL, `synchronous=FULL`).
//! - `durable_floor`: the six writes one cycle must make (stage: the action row and the
//!   ledger entry; claim: the approver and the `applying` row; outcome: the `applied` row
//!   and the ledger entry), as bare SQL on our schema, in the cycle's three commits.
//! - `memory_floor`: the same six writes on our schema in memory, sharing transactions
//!   as the in-memory database does.
//!
//! Run: `cargo bench -p store-sqlite --bench durable`. A summary with each target beside
//! its baseline, a "met" or "not met" verdict, and the commit and sync counts is printed
//! at the end.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

#[path = "../tests/store/support.rs"]
#[allow(dead_code, unused_imports)]
mod support;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use gatekeeper_core::CallOutcome;
use kernel::ActionDescription;
use serde_json::json;
use store_sqlite::Database;
use support::{Rig, Store, TempDir};

/// What one benchmark (or one side of one) added up, for the summary.
#[derive(Default)]
struct Tally {
    name: &'static str,
    /// Time measured.
    elapsed: Duration,
    /// Iterations (actions, for the concurrent ones) in that time.
    iterations: u64,
    /// Commits (counted with SQLite's commit hook, `Database::commits`).
    commits: u64,
    /// Syncs of the write-ahead log (`Database::syncs`).
    syncs: u64,
    /// The whole process's processor time.
    cpu: Duration,
    /// Each call's iterations and microseconds per iteration, in order, warm-up first (for
    /// the median, which leaves the warm-up out).
    samples: Vec<(u64, f64)>,
}

impl Tally {
    /// `count` per iteration.
    fn per_iteration(&self, count: u64) -> f64 {
        count as f64 / self.iterations.max(1) as f64
    }

    /// Microseconds of `time` per iteration.
    fn us_per_iteration(&self, time: Duration) -> f64 {
        time.as_secs_f64() * 1e6 / self.iterations.max(1) as f64
    }

    /// The median over criterion's samples of their microseconds per iteration, as
    /// criterion's own median. Criterion's warm-up comes first, as calls of 1, 2, 4, …
    /// iterations; those are left out (unless nothing else was run, as in a test run).
    fn median_us(&self) -> f64 {
        let warm_up = self
            .samples
            .iter()
            .enumerate()
            .take_while(|(at, (iterations, _))| 1u64.checked_shl(*at as u32) == Some(*iterations))
            .count();
        let measured = match &self.samples[warm_up..] {
            [] => &self.samples[..],
            measured => measured,
        };
        let mut samples: Vec<f64> = measured.iter().map(|&(_, us)| us).collect();
        if samples.is_empty() {
            return self.us_per_iteration(self.elapsed);
        }
        samples.sort_by(f64::total_cmp);
        let middle = samples.len() / 2;
        if samples.len() % 2 == 1 {
            samples[middle]
        } else {
            (samples[middle - 1] + samples[middle]) / 2.0
        }
    }
}

static TALLY: Mutex<Vec<Tally>> = Mutex::new(Vec::new());

/// The name and the processor time (user and system) of a `/proc` `stat` file, in ticks
/// of 10 ms: close enough over a benchmark's seconds.
fn stat_cpu_time(stat: &str) -> Option<(&str, Duration)> {
    let (head, rest) = stat.rsplit_once(')')?;
    let (_, name) = head.split_once('(')?;
    // Fields after the name (which is in parentheses): utime and stime are the 12th and
    // 13th of them.
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|t| t.parse::<u64>().ok())
        .sum();
    Some((name, Duration::from_millis(ticks * 10)))
}

/// Processor time used by the whole process (every thread, living or ended).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    stat_cpu_time(&stat).map_or(Duration::ZERO, |(_, time)| time)
}

/// The entry of `name` in the tally, made empty if there is none yet.
fn entry<'t>(tally: &'t mut Vec<Tally>, name: &'static str) -> &'t mut Tally {
    match tally.iter().position(|t| t.name == name) {
        Some(at) => &mut tally[at],
        None => {
            tally.push(Tally {
                name,
                ..Tally::default()
            });
            tally.last_mut().expect("pushed above")
        }
    }
}

fn tally_cpu(name: &'static str, cpu: Duration) {
    entry(&mut TALLY.lock().unwrap(), name).cpu += cpu;
}

fn tally(name: &'static str, elapsed: Duration, iterations: u64, commits: u64) {
    tally_syncs(name, elapsed, iterations, commits, 0);
}

fn tally_syncs(name: &'static str, elapsed: Duration, iterations: u64, commits: u64, syncs: u64) {
    let mut tally = TALLY.lock().unwrap();
    let t = entry(&mut tally, name);
    t.elapsed += elapsed;
    t.iterations += iterations;
    t.commits += commits;
    t.syncs += syncs;
    if iterations > 0 {
        t.samples
            .push((iterations, elapsed.as_secs_f64() * 1e6 / iterations as f64));
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A 1 MiB file in `dir` that raw 4 KiB writes and syncs go to, one block after the other.
struct RawFile {
    file: std::fs::File,
    block: Vec<u8>,
    offset: u64,
}

impl RawFile {
    fn new(dir: &TempDir, name: &str) -> Self {
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(dir.join(name))
            .unwrap();
        file.set_len(1 << 20).unwrap();
        file.sync_all().unwrap();
        Self {
            file,
            block: vec![0xA5u8; 4096],
            offset: 0,
        }
    }

    /// One raw 4 KiB write + fsync.
    fn write_and_sync(&mut self) {
        self.file.write_all_at(&self.block, self.offset).unwrap();
        self.file.sync_all().unwrap();
        self.offset = (self.offset + 4096) % (1 << 20);
    }
}

fn raw_fsync(c: &mut Criterion, dir: &TempDir) {
    let mut raw = RawFile::new(dir, "raw.bin");
    c.bench_function("raw_fsync_4k", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                raw.write_and_sync();
            }
            let elapsed = start.elapsed();
            tally("raw_fsync_4k", elapsed, iters, 0);
            elapsed
        })
    });
}

/// A store on a new file in `dir`: the shared SQLite file, as the daemon opens it.
fn shared(dir: &TempDir, name: &str) -> Database {
    Database::open(dir.join(&format!("{name}.db"))).unwrap()
}

fn durable_cycle<D: Store>(c: &mut Criterion, name: &'static str, db: D) {
    let rt = runtime();
    let rig = rt.block_on(Rig::new(db));
    c.bench_function(name, |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let (commits, syncs) = (rig.db.commits(), rig.db.syncs());
                let cpu = cpu_time();
                let start = Instant::now();
                for n in 0..iters {
                    rig.cycle(n).await;
                }
                let elapsed = start.elapsed();
                tally_cpu(name, cpu_time().saturating_sub(cpu));
                tally_syncs(
                    name,
                    elapsed,
                    iters,
                    rig.db.commits() - commits,
                    rig.db.syncs() - syncs,
                );
                elapsed
            })
        })
    });
}

/// The cycle on a shared file and two raw 4 KiB write+fsyncs (in the same directory,
/// over the same 1 MiB of a file, as `raw_fsync_4k`), taken turn about in every
/// iteration, so that both see the disk as it is at that moment: the ratio is then not
/// at the mercy of the disk's drift between two benchmarks a minute apart.
fn interleaved_cycle(c: &mut Criterion, dir: &TempDir) {
    let rt = runtime();
    let rig = rt.block_on(Rig::new(shared(dir, "interleaved")));
    let mut raw = RawFile::new(dir, "raw-interleaved.bin");
    c.bench_function("interleaved", |b| {
        b.iter_custom(|iters| {
            let (mut cycles, mut raws) = (Duration::ZERO, Duration::ZERO);
            rt.block_on(async {
                for n in 0..iters {
                    let start = Instant::now();
                    rig.cycle(n).await;
                    cycles += start.elapsed();
                    let start = Instant::now();
                    raw.write_and_sync();
                    raw.write_and_sync();
                    raws += start.elapsed();
                }
            });
            tally("interleaved: cycle", cycles, iters, 0);
            tally("interleaved: 2 raw", raws, iters, 0);
            cycles + raws
        })
    });
}

/// One call staged by session `session` and approved (so sent): its `n`th of the sample
/// `round`. What every benchmark of concurrent sessions times.
async fn staged_and_approved<D: Store>(rig: &Rig<D>, round: u64, session: u64, n: u64) {
    rig.create_approved(json!({"title": "Add dark mode", "n": [round, session, n]}))
        .await;
}

/// Sessions on threads of their own, each with its runtime, that live as long as the
/// benchmark: a round's time is the sessions' work, not the spawning of threads and the
/// building of runtimes (about 0.6 ms for sixteen, and the last session started up to a
/// millisecond after the first).
struct SessionThreads {
    /// One per session: a round's number and how many actions it stages in it.
    rounds: Vec<std::sync::mpsc::Sender<(u64, u64)>>,
    /// A session's word that it finished its round: `false` if it panicked.
    finished: std::sync::mpsc::Receiver<bool>,
}

impl SessionThreads {
    /// `each` actions from each session at once, the `round`th; how long they took.
    fn run(&self, each: u64, round: u64) -> Duration {
        let start = Instant::now();
        for session in &self.rounds {
            session.send((round, each)).unwrap();
        }
        for _ in &self.rounds {
            assert!(self.finished.recv().unwrap(), "a session panicked");
        }
        start.elapsed()
    }
}

/// Run `body` with `sessions` sessions on `rig`, a thread each (see [`SessionThreads`]);
/// the threads end with it.
fn on_threads<D: Store + Sync, R>(
    rig: &Rig<D>,
    sessions: u64,
    body: impl FnOnce(&SessionThreads) -> R,
) -> R {
    std::thread::scope(|scope| {
        let (finish, finished) = std::sync::mpsc::channel();
        let rounds = (0..sessions)
            .map(|session| {
                let (start, rounds) = std::sync::mpsc::channel::<(u64, u64)>();
                let finish = finish.clone();
                scope.spawn(move || {
                    let rt = runtime();
                    for (round, each) in rounds {
                        let done = std::panic::catch_unwind(AssertUnwindSafe(|| {
                            rt.block_on(async {
                                for n in 0..each {
                                    staged_and_approved(rig, round, session, n).await;
                                }
                            })
                        }));
                        // Told even of a panic, so that the round does not wait forever.
                        finish.send(done.is_ok()).unwrap();
                        if let Err(panic) = done {
                            std::panic::resume_unwind(panic);
                        }
                    }
                });
                start
            })
            .collect();
        // The senders drop with `threads` when `body` returns, which ends every thread.
        let threads = SessionThreads { rounds, finished };
        body(&threads)
    })
}

/// A runtime as the daemon's on this file (`gate serve`'s `daemon_runtime`): one worker,
/// which a wait for a sync leaves to the other tasks (`block_in_place`).
fn daemon_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// `each` actions from each of `sessions` sessions at once as the daemon runs them:
/// tasks on `rt` (see [`daemon_runtime`]), not a thread each; how long they took.
fn on_tasks(
    rt: &tokio::runtime::Runtime,
    rig: &Arc<Rig<Database>>,
    sessions: u64,
    each: u64,
    round: u64,
) -> Duration {
    let start = Instant::now();
    rt.block_on(async {
        let tasks: Vec<_> = (0..sessions)
            .map(|session| {
                let rig = rig.clone();
                tokio::spawn(async move {
                    for n in 0..each {
                        staged_and_approved(&rig, round, session, n).await;
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    });
    start.elapsed()
}

/// Time `sessions` sessions at once on `rig`'s file, each sample's iterations spread over
/// them, run by `run(each, round)` (with `each` actions per session, enough that the
/// sessions overlap for most of the sample).
fn concurrent<D: Store>(
    c: &mut Criterion,
    name: &'static str,
    sessions: u64,
    rig: &Rig<D>,
    mut run: impl FnMut(u64, u64) -> Duration,
) {
    let mut round = 0u64;
    c.bench_function(name, |b| {
        b.iter_custom(|iters| {
            round += 1;
            let each = iters.div_ceil(sessions).max(8);
            let (commits, syncs) = (rig.db.commits(), rig.db.syncs());
            let cpu = cpu_time();
            let elapsed = run(each, round);
            tally_cpu(name, cpu_time().saturating_sub(cpu));
            let done = each * sessions;
            tally_syncs(
                name,
                elapsed,
                done,
                rig.db.commits() - commits,
                rig.db.syncs() - syncs,
            );
            elapsed.mul_f64(iters as f64 / done as f64)
        })
    });
}

/// The cycle from `sessions` sessions at once on one file, a thread each.
fn concurrent_cycles<D: Store + Sync>(c: &mut Criterion, name: &'static str, sessions: u64, db: D) {
    let rig = runtime().block_on(Rig::new(db));
    on_threads(&rig, sessions, |threads| {
        concurrent(c, name, sessions, &rig, |each, round| {
            threads.run(each, round)
        });
    });
}

/// The cycle from `sessions` sessions at once on one file as the daemon runs them: tasks
/// on one runtime as `gate serve`'s on this file ([`daemon_runtime`]).
fn concurrent_tasks(c: &mut Criterion, name: &'static str, sessions: u64, db: Database) {
    let rt = daemon_runtime();
    let rig = Arc::new(rt.block_on(Rig::new(db)));
    concurrent(c, name, sessions, &rig, |each, round| {
        on_tasks(&rt, &rig, sessions, each, round)
    });
}

/// Actions per session in each turn of [`turn_about`].
const TURN: u64 = 32;

/// The tally names of [`turn_about`] with a thread per session: one session's, sixteen's.
const SESSIONS_TURNS: [&str; 2] = ["sessions turn about: 1", "sessions turn about: 16"];

/// The tally names of [`turn_about`] with tasks on the daemon's runtime.
const TASKS_TURNS: [&str; 2] = ["tasks turn about: 1", "tasks turn about: 16"];

/// One session and sixteen taken turn about, each on a shared file of its own: every
/// iteration runs [`TURN`] actions from one session, then [`TURN`] from each of sixteen
/// at once, so that both see the disk as it is at that moment (its latency drifts by
/// tens of percent between benchmarks a minute apart). `threads`: a thread per session;
/// otherwise tasks on the daemon's runtime. The tally names are `names`: one session's,
/// then sixteen's.
fn turn_about(
    c: &mut Criterion,
    dir: &TempDir,
    group: &str,
    names: [&'static str; 2],
    threads: bool,
) {
    let rt = daemon_runtime();
    let [one, many] = names.map(|name| {
        let file = name.replace([' ', ':'], "_");
        Arc::new(rt.block_on(Rig::new(shared(dir, &file))))
    });
    let mut group = c.benchmark_group(group);
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));
    // `run_one(round)`, `run_many(round)`: the round from one session, from sixteen.
    let mut measure = |run_one: &mut dyn FnMut(u64) -> Duration,
                       run_many: &mut dyn FnMut(u64) -> Duration| {
        let mut round = 0;
        group.bench_function("turn_about", |b| {
            b.iter_custom(|iters| {
                let (mut alone, mut together) = (Duration::ZERO, Duration::ZERO);
                let syncs = many.db.syncs();
                for _ in 0..iters {
                    round += 1;
                    alone += run_one(round);
                    together += run_many(round);
                }
                tally(names[0], alone, iters * TURN, 0);
                tally_syncs(
                    names[1],
                    together,
                    iters * TURN * 16,
                    0,
                    many.db.syncs() - syncs,
                );
                alone + together
            })
        });
    };
    if threads {
        on_threads(&one, 1, |alone| {
            on_threads(&many, 16, |together| {
                measure(&mut |round| alone.run(TURN, round), &mut |round| {
                    together.run(TURN, round)
                })
            })
        });
    } else {
        measure(
            &mut |round| on_tasks(&rt, &one, 1, TURN, round),
            &mut |round| on_tasks(&rt, &many, 16, TURN, round),
        );
    }
    group.finish();
}

fn drain_1000(c: &mut Criterion, dir: &TempDir) {
    const N: u64 = 1000;
    let rt = runtime();
    let mut group = c.benchmark_group("drain");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(5));
    let mut round = 0;
    group.bench_function("drain_1000", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                round += 1;
                let rig = rt.block_on(async {
                    let rig = Rig::new(shared(dir, &format!("drain-{round}"))).await;
                    let storage = Store::action_storage(&rig.db, "issues");
                    let queue = rig.overseer.queue_for("issues", "agent").unwrap();
                    let kind = rig.label_kind();
                    for n in 0..N {
                        let args = Arc::new(json!({"issue": n, "label": "bug"}));
                        let id = storage
                            .insert_pending(
                                Arc::from("addLabel"),
                                None,
                                args,
                                kernel::Timestamp(n),
                                N as usize,
                            )
                            .await
                            .unwrap()
                            .unwrap();
                        let description = ActionDescription {
                            auto_approvable: true,
                            action_kind: Some(kind.clone()),
                            ..ActionDescription::new(
                                "Call addLabel on Issue tracker",
                                format!("label {n}"),
                            )
                        };
                        queue.submit_action(id, description).await.unwrap();
                    }
                    rig
                });
                let (commits, syncs) = (rig.db.commits(), rig.db.syncs());
                let start = Instant::now();
                let rule = rt.block_on(async {
                    rig.overseer
                        .enable_rule("issues", rig.label_kind(), "carol")
                        .unwrap();
                    // The rule's own commit (and its sync) is not an apply: counted
                    // here, before the drain's task first runs (at the next await).
                    let rule = (rig.db.commits(), rig.db.syncs());
                    rig.overseer.settle().await;
                    rig.db.flush().unwrap();
                    rule
                });
                let elapsed = start.elapsed();
                assert_eq!(rig.service.calls().len() as u64, N);
                tally_syncs(
                    "drain_1000 (per applied action)",
                    elapsed,
                    N,
                    rig.db.commits() - rule.0,
                    rig.db.syncs() - rule.1,
                );
                tally_syncs(
                    "drain_1000: the rule",
                    Duration::ZERO,
                    1,
                    rule.0 - commits,
                    rule.1 - syncs,
                );
                total += elapsed;
            }
            total
        })
    });
    group.finish();
}

/// A fresh in-memory world whose prepared statements are warm: one turn and one cycle
/// were run on it, as in any process that has done anything yet.
fn memory_world() -> Rig {
    let rt = runtime();
    rt.block_on(async {
        let rig = Rig::new(Database::open_in_memory().unwrap()).await;
        turn_once(&rig).await;
        cycle_once(&rig).await;
        rig
    })
}

/// One ex03 turn; returns the ledger ids of the three actions it left pending.
async fn turn_once(rig: &Rig) -> Vec<kernel::LedgerId> {
    let s = &rig.session;
    let read = s.call_tool("listIssues", json!({})).await.unwrap();
    assert!(matches!(read, CallOutcome::Data { .. }));
    let mut pending = Vec::with_capacity(3);
    for (tool, args) in [
        ("createIssue", json!({"title": "Add dark mode"})),
        ("addLabel", json!({"issue": 1, "label": "bug"})),
        ("closeIssue", json!({"issue": 2})),
    ] {
        let queued = s.call_tool(tool, args).await.unwrap();
        assert!(matches!(queued, CallOutcome::Pending { .. }));
        pending.push(queued.ledger().unwrap());
    }
    pending
}

async fn cycle_once(rig: &Rig) {
    rig.create_approved(json!({"title": "Add dark mode"})).await;
    rig.overseer.settle().await;
}

/// `routine` once on each fresh world (built outside the measurement).
fn memory_fresh<R>(c: &mut Criterion, name: &str, routine: impl AsyncFn(&Rig) -> R) {
    let rt = runtime();
    c.bench_function(name, |b| {
        b.iter_batched(
            memory_world,
            |rig| {
                rt.block_on(routine(&rig));
                rig
            },
            BatchSize::SmallInput,
        )
    });
}

fn memory_turn(c: &mut Criterion) {
    memory_fresh(c, "memory_turn", turn_once);
}

fn memory_cycle(c: &mut Criterion) {
    memory_fresh(c, "memory_cycle", cycle_once);
}

/// What one real cycle wrote, to replay as bare SQL: the tool arguments, the ledger
/// description and the service's result, as JSON.
struct CycleRows {
    args: String,
    description: String,
    result: String,
}

/// Run one real cycle on a fresh file and read back what it wrote.
fn cycle_rows(dir: &TempDir) -> CycleRows {
    let rt = runtime();
    let path = dir.join("rows.db");
    rt.block_on(async {
        let rig = Rig::new(Database::open(&path).unwrap()).await;
        cycle_once(&rig).await;
    });
    let db = Database::open(&path).unwrap();
    let text = |sql: &str| {
        db.query_text(sql).unwrap()[0][0]
            .clone()
            .expect("the cycle wrote it")
    };
    CycleRows {
        args: text("SELECT args_json FROM actions ORDER BY id DESC LIMIT 1"),
        description: text(
            "SELECT description_json FROM ledger WHERE kind = 'action' ORDER BY id DESC LIMIT 1",
        ),
        result: text("SELECT result_json FROM actions ORDER BY id DESC LIMIT 1"),
    }
}

/// An empty database with our schema: a plain connection to a file `Database::open`
/// created (WAL, `synchronous=FULL`), or an in-memory copy of its schema.
fn floor_connection(dir: &TempDir, name: &str, in_memory: bool) -> rusqlite::Connection {
    let path = dir.join(name);
    drop(Database::open(&path).unwrap());
    let file = rusqlite::Connection::open(&path).unwrap();
    file.pragma_update(None, "synchronous", "FULL").unwrap();
    if !in_memory {
        return file;
    }
    let memory = rusqlite::Connection::open_in_memory().unwrap();
    let schema: Vec<String> = file
        .prepare("SELECT sql FROM sqlite_schema WHERE sql IS NOT NULL ORDER BY rowid")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for statement in schema {
        memory.execute_batch(&statement).unwrap();
    }
    memory
}

/// The six writes of cycle `n`, as bare SQL. `commit` runs between the three steps.
fn floor_cycle(db: &rusqlite::Connection, rows: &CycleRows, n: i64, commit: &mut dyn FnMut()) {
    use rusqlite::params;
    let run = |sql: &str, values: &[&dyn rusqlite::ToSql]| {
        db.prepare_cached(sql).unwrap().execute(values).unwrap();
    };
    run(
        "INSERT INTO actions (gatekeeper, id, tool, args_json, state, submitted_at)
         VALUES (?1, ?2, ?3, ?4, 'pending', ?5)",
        params!["issues", n, "createIssue", rows.args, n],
    );
    run(
        "INSERT INTO ledger (id, kind, gatekeeper, caller, created_at, description_json,
            driver_id, state, depends_on_json, restart_requested)
         VALUES (?1, 'action', ?2, ?3, ?4, ?5, ?6, 'pending', '[]', 0)",
        params![n, "issues", "agent", n, rows.description, n],
    );
    commit();
    run(
        "UPDATE ledger SET resolved_by = ?2, auto_approved = 0, resolved_at = ?3
         WHERE id = ?1 AND kind = 'action'",
        params![n, "alice", n],
    );
    run(
        "UPDATE actions SET state = 'applying', claimed_at = ?3, claimed_by = ?4
         WHERE gatekeeper = ?1 AND id = ?2 AND state = 'pending'",
        params!["issues", n, n, "session"],
    );
    commit();
    run(
        "UPDATE actions SET state = 'applied', result_json = ?3
         WHERE gatekeeper = ?1 AND id = ?2 AND state = 'applying'",
        params!["issues", n, rows.result],
    );
    run(
        "UPDATE ledger SET state = 'approved', resolved_by = ?2, auto_approved = 0,
            resolved_at = ?3, resolution_cause = NULL, failure = NULL,
            failure_retryable = NULL, blocked_by = NULL, restart_requested = 0,
            revert_by = NULL, revert_at = NULL, revert_refused = NULL
         WHERE id = ?1 AND kind = 'action'",
        params![n, "alice", n],
    );
    commit();
}

fn durable_floor(c: &mut Criterion, dir: &TempDir, rows: &CycleRows) {
    let db = floor_connection(dir, "floor.db", false);
    let tx = |sql: &str| {
        db.prepare_cached(sql).unwrap().execute([]).unwrap();
    };
    let mut n = 0;
    c.bench_function("durable_floor", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                n += 1;
                tx("BEGIN IMMEDIATE");
                floor_cycle(&db, rows, n, &mut || {
                    tx("COMMIT");
                    tx("BEGIN IMMEDIATE");
                });
                tx("COMMIT");
            }
            let elapsed = start.elapsed();
            tally("durable_floor", elapsed, iters, 0);
            elapsed
        })
    });
}

fn sqlite_commit_floor(c: &mut Criterion, dir: &TempDir) {
    let db = rusqlite::Connection::open(dir.join("commit.db")).unwrap();
    let mode: String = db
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    db.pragma_update(None, "synchronous", "FULL").unwrap();
    db.execute_batch(
        "CREATE TABLE one (id INTEGER PRIMARY KEY, n INTEGER NOT NULL) STRICT;
                      INSERT INTO one VALUES (1, 0);",
    )
    .unwrap();
    let mut n = 0i64;
    c.bench_function("sqlite_commit_floor", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                n += 1;
                db.prepare_cached("UPDATE one SET n = ?1 WHERE id = 1")
                    .unwrap()
                    .execute([n])
                    .unwrap();
            }
            let elapsed = start.elapsed();
            tally("sqlite_commit_floor", elapsed, iters, 0);
            elapsed
        })
    });
}

fn memory_floor(c: &mut Criterion, dir: &TempDir, rows: &CycleRows) {
    let db = floor_connection(dir, "memory-floor.db", true);
    let mut n = 0;
    let mut writes = 0u32;
    c.bench_function("memory_floor", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                n += 1;
                if writes == 0 {
                    db.prepare_cached("BEGIN IMMEDIATE")
                        .unwrap()
                        .execute([])
                        .unwrap();
                }
                floor_cycle(&db, rows, n, &mut || {});
                // The in-memory database commits every 256 writes; a cycle is six.
                writes += 6;
                if writes >= 256 {
                    db.prepare_cached("COMMIT").unwrap().execute([]).unwrap();
                    writes = 0;
                }
            }
            let elapsed = start.elapsed();
            tally("memory_floor", elapsed, iters, 0);
            elapsed
        })
    });
}

/// Turn after turn on one world; `after` runs outside the measurement.
fn memory_steady(
    c: &mut Criterion,
    name: &'static str,
    routine: impl AsyncFn(&Rig) -> Vec<kernel::LedgerId>,
) {
    let rt = runtime();
    let rig = memory_world();
    c.bench_function(name, |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut elapsed = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    let left_pending = routine(&rig).await;
                    elapsed += start.elapsed();
                    for id in left_pending {
                        rig.overseer.reject(id, "bob").await.unwrap();
                    }
                }
                tally(name, elapsed, iters, 0);
                elapsed
            })
        })
    });
}

fn memory_turn_steady(c: &mut Criterion) {
    memory_steady(c, "memory_turn_steady", async |rig| turn_once(rig).await);
}

fn memory_cycle_steady(c: &mut Criterion) {
    memory_steady(c, "memory_cycle_steady", async |rig| {
        cycle_once(rig).await;
        Vec::new()
    });
}

fn file_benches(c: &mut Criterion) {
    // Same directory, same filesystem, for the database and the raw baseline.
    let dir = TempDir::new("bench");
    let rows = cycle_rows(&dir);
    raw_fsync(c, &dir);
    sqlite_commit_floor(c, &dir);
    durable_floor(c, &dir, &rows);
    durable_cycle(c, "durable_cycle", shared(&dir, "cycle"));
    interleaved_cycle(c, &dir);
    concurrent_cycles(c, "sessions_1", 1, shared(&dir, "sessions_1"));
    concurrent_cycles(c, "sessions_16", 16, shared(&dir, "sessions_16"));
    concurrent_tasks(c, "tasks_1", 1, shared(&dir, "tasks_1"));
    concurrent_tasks(c, "tasks_16", 16, shared(&dir, "tasks_16"));
    turn_about(c, &dir, "sessions_turns", SESSIONS_TURNS, true);
    turn_about(c, &dir, "tasks_turns", TASKS_TURNS, false);
    drain_1000(c, &dir);
    memory_floor(c, &dir, &rows);
}

fn summary(_: &mut Criterion) {
    let tally = TALLY.lock().unwrap();
    let find = |name: &str| tally.iter().find(|t| t.name == name);
    let per = |name: &str| {
        find(name).map(|t| (t.us_per_iteration(t.elapsed), t.per_iteration(t.commits)))
    };
    let median = |name: &str| find(name).map(Tally::median_us);
    let syncs_per = |name: &str| find(name).map(|t| t.per_iteration(t.syncs));
    let cpu_per = |name: &str| find(name).map_or(f64::NAN, |t| t.us_per_iteration(t.cpu));
    let verdict = |ok: bool| if ok { "met" } else { "not met" };
    println!(
        "\nstore-sqlite summary (on the shared SQLite file, WAL; medians over criterion's \
         samples where so marked, otherwise means over every timed iteration, warm-up \
         included)"
    );
    println!(
        "allocator: MALLOC_TRIM_THRESHOLD_={:?} MALLOC_TOP_PAD_={:?}",
        std::env::var("MALLOC_TRIM_THRESHOLD_").ok(),
        std::env::var("MALLOC_TOP_PAD_").ok()
    );
    let raw = median("raw_fsync_4k");
    if let (Some(raw_us), Some((mean_us, _))) = (raw, per("raw_fsync_4k")) {
        println!("  raw 4 KiB write+fsync: median {raw_us:.1} µs (mean {mean_us:.1} µs)");
    }
    if let (Some(us), Some((mean_us, commits)), Some(raw_us)) =
        (median("durable_cycle"), per("durable_cycle"), raw)
    {
        let syncs = syncs_per("durable_cycle").unwrap_or(f64::NAN);
        let ratio = us / (2.0 * raw_us);
        println!(
            "  durable cycle (stage, approve, apply, outcome): median {us:.1} µs (mean \
             {mean_us:.1} µs) against 2 raw write+fsyncs of {:.1} µs = {ratio:.2} × (target \
             ≤ 1.60: {}); {syncs:.3} synced commits per cycle (target exactly 2: {}); \
             {commits:.3} commits per cycle; processor time {:.1} µs per cycle",
            2.0 * raw_us,
            verdict(ratio <= 1.6),
            verdict((syncs - 2.0).abs() < 1e-9),
            cpu_per("durable_cycle")
        );
    }
    if let (Some(cycle_us), Some(raw2_us)) =
        (median("interleaved: cycle"), median("interleaved: 2 raw"))
    {
        let ratio = cycle_us / raw2_us;
        println!(
            "  durable cycle, taken turn about with 2 raw write+fsyncs: median {cycle_us:.1} µs \
             against {raw2_us:.1} µs = {ratio:.2} × (target ≤ 1.60: {})",
            verdict(ratio <= 1.6)
        );
    }
    for (how, one, many) in [
        ("sessions, a thread each", "sessions_1", "sessions_16"),
        (
            "agents as tasks on the daemon's runtime",
            "tasks_1",
            "tasks_16",
        ),
    ] {
        if let (Some((one_us, _)), Some((many_us, commits))) = (per(one), per(many)) {
            let syncs = syncs_per(many).unwrap_or(f64::NAN);
            let speedup = one_us / many_us;
            println!(
                "  16 {how}, on one file: {many_us:.1} µs per action against {one_us:.1} µs \
                 from 1 (same run): throughput {speedup:.2} × (target ≥ 1.5: {}); {syncs:.3} \
                 syncs per action (target ≤ 0.5: {}; 1: {:.3}); {commits:.3} commits per \
                 action; processor time per action {:.1} µs (1: {:.1} µs)",
                verdict(speedup >= 1.5),
                verdict(syncs <= 0.5),
                syncs_per(one).unwrap_or(f64::NAN),
                cpu_per(many),
                cpu_per(one)
            );
        }
    }
    for (how, [one, many]) in [
        ("sessions, a thread each", SESSIONS_TURNS),
        ("agents as tasks on the daemon's runtime", TASKS_TURNS),
    ] {
        if let (Some((one_us, _)), Some((many_us, _))) = (per(one), per(many)) {
            let syncs = syncs_per(many).unwrap_or(f64::NAN);
            let speedup = one_us / many_us;
            println!(
                "  16 {how}, taken turn about with 1, each on a file of its own: {many_us:.1} µs \
                 per action against {one_us:.1} µs: throughput {speedup:.2} × (target ≥ 1.5: \
                 {}); {syncs:.3} syncs per action (target ≤ 0.5: {})",
                verdict(speedup >= 1.5),
                verdict(syncs <= 0.5)
            );
        }
    }
    if let Some((us, commits)) = per("drain_1000 (per applied action)") {
        let syncs = syncs_per("drain_1000 (per applied action)").unwrap_or(f64::NAN);
        let (rule_commits, rule_syncs) = find("drain_1000: the rule")
            .map_or((f64::NAN, f64::NAN), |t| {
                (t.per_iteration(t.commits), t.per_iteration(t.syncs))
            });
        println!(
            "  drain of 1,000 auto-approved actions: {us:.1} µs, {commits:.4} commits and \
             {syncs:.4} syncs per applied action (target ≤ 1.05 syncs: {}); not counted: the \
             rule's own {rule_commits:.0} commits and {rule_syncs:.0} syncs, and the stages",
            verdict(syncs <= 1.05)
        );
    }
    if let (Some((floor_us, _)), Some(raw_us)) = (per("sqlite_commit_floor"), raw) {
        println!(
            "  smallest SQLite commit (1 row, WAL, FULL): {floor_us:.1} µs = {:.2} × raw",
            floor_us / raw_us
        );
    }
    if let (Some((floor_us, _)), Some(raw_us)) = (per("durable_floor"), raw) {
        let cycle = per("durable_cycle").map_or(f64::NAN, |(us, _)| us);
        println!(
            "  the cycle's six writes as bare SQL, 3 commits: {floor_us:.1} µs = {:.2} × 3 raw; \
             the full stack is {:.2} × this floor",
            floor_us / (3.0 * raw_us),
            cycle / floor_us
        );
    }
    if let Some((us, _)) = per("memory_floor") {
        println!("  the cycle's six writes as bare SQL, in memory: {us:.2} µs");
    }
    for (name, what) in [
        ("memory_turn_steady", "ex03 turn in memory, steady"),
        ("memory_cycle_steady", "stage + apply in memory, steady"),
    ] {
        if let Some((us, _)) = per(name) {
            println!("  {what}: {us:.2} µs");
        }
    }
}

criterion_group!(
    benches,
    file_benches,
    memory_turn,
    memory_cycle,
    memory_turn_steady,
    memory_cycle_steady,
    summary
);
criterion_main!(benches);

//! Benchmarks of durable storage, like for like with the reference, plus the commits each
//! step costs (counted with SQLite's commit hook).
//!
//! On a file (WAL, `synchronous=FULL`), measured next to a raw 4 KiB write + fsync:
//! - `raw_fsync_4k`: the baseline, in the same directory as the database.
//! - `durable_cycle`: stage → approve → apply → outcome for one action, through the real
//!   kernel, gatekeeper-core's gatekeeper and session. Target: exactly 3 commits, time
//!   ≤ 1.2 × 3 × `raw_fsync_4k`.
//! - `drain_1000`: one drain of 1,000 auto-approved actions. Target: ≤ 1.1 commits per
//!   applied action (plus one per stage). The action store caps a store at 50 open
//!   calls, so the 1,000 are staged straight through the storage port with a larger cap
//!   and submitted to the kernel as the session would.
//!
//! On SQLite in memory (fresh world per iteration, built outside the measurement):
//! - `memory_turn`: the ex03 turn, one read then three actions staged. Target ≤ 15 µs.
//! - `memory_cycle`: stage + approve + apply (+ the drain it triggers). Target ≤ 10 µs.
//!
//! Run: `cargo bench -p store-sqlite --bench durable`. A summary with the ratios and
//! commit counts is printed at the end.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

#[path = "../tests/store/support.rs"]
#[allow(dead_code)]
mod support;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use gatekeeper_core::CallOutcome;
use kernel::ActionDescription;
use serde_json::json;
use store_sqlite::Database;
use support::{Rig, TempDir};

/// (total time, iterations, commits) per benchmark, for the summary.
static TALLY: Mutex<Vec<(&'static str, Duration, u64, u64)>> = Mutex::new(Vec::new());

fn tally(name: &'static str, elapsed: Duration, iterations: u64, commits: u64) {
    let mut tally = TALLY.lock().unwrap();
    match tally.iter_mut().find(|t| t.0 == name) {
        Some(t) => {
            t.1 += elapsed;
            t.2 += iterations;
            t.3 += commits;
        }
        None => tally.push((name, elapsed, iterations, commits)),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn raw_fsync(c: &mut Criterion, dir: &TempDir) {
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(dir.join("raw.bin"))
        .unwrap();
    file.set_len(1 << 20).unwrap();
    file.sync_all().unwrap();
    let block = vec![0xA5u8; 4096];
    let mut offset = 0u64;
    c.bench_function("raw_fsync_4k", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                file.write_all_at(&block, offset).unwrap();
                file.sync_all().unwrap();
                offset = (offset + 4096) % (1 << 20);
            }
            let elapsed = start.elapsed();
            tally("raw_fsync_4k", elapsed, iters, 0);
            elapsed
        })
    });
}

fn durable_cycle(c: &mut Criterion, dir: &TempDir) {
    let rt = runtime();
    let rig = rt.block_on(Rig::new(Database::open(dir.join("cycle.db")).unwrap()));
    c.bench_function("durable_cycle", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let commits = rig.db.commits();
                let start = Instant::now();
                for n in 0..iters {
                    let queued = rig
                        .session
                        .call_tool("createIssue", json!({"title": "Add dark mode", "n": n}))
                        .await
                        .unwrap();
                    rig.overseer
                        .approve(queued.ledger().unwrap(), "alice")
                        .await
                        .unwrap();
                    rig.overseer.settle().await;
                }
                let elapsed = start.elapsed();
                tally("durable_cycle", elapsed, iters, rig.db.commits() - commits);
                elapsed
            })
        })
    });
}

fn drain_1000(c: &mut Criterion, dir: &TempDir) {
    const N: u64 = 1000;
    let rt = runtime();
    let mut group = c.benchmark_group("drain");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(20));
    let mut round = 0;
    group.bench_function("drain_1000", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                round += 1;
                let rig = rt.block_on(async {
                    let rig =
                        Rig::new(Database::open(dir.join(&format!("drain-{round}.db"))).unwrap())
                            .await;
                    let storage = rig.db.action_storage("issues");
                    let queue = rig.overseer.queue_for("issues", "agent").unwrap();
                    let kind = rig.label_kind();
                    for n in 0..N {
                        let args = Arc::new(json!({"issue": n, "label": "bug"}));
                        let id = storage
                            .insert_pending(
                                Arc::from("addLabel"),
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
                                "Issue tracker: addLabel",
                                format!("label {n}"),
                            )
                        };
                        queue.submit_action(id, description).await.unwrap();
                    }
                    rig
                });
                let commits = rig.db.commits();
                let start = Instant::now();
                rt.block_on(async {
                    rig.overseer
                        .enable_rule("issues", rig.label_kind(), "carol")
                        .unwrap();
                    rig.overseer.settle().await;
                    rig.db.flush().unwrap();
                });
                let elapsed = start.elapsed();
                assert_eq!(rig.service.calls().len() as u64, N);
                // The rule's own commit is not an apply.
                tally(
                    "drain_1000 (per applied action)",
                    elapsed,
                    N,
                    rig.db.commits() - commits - 1,
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

async fn turn_once(rig: &Rig) {
    let s = &rig.session;
    let read = s.call_tool("listIssues", json!({})).await.unwrap();
    assert!(matches!(read, CallOutcome::Data { .. }));
    for (tool, args) in [
        ("createIssue", json!({"title": "Add dark mode"})),
        ("addLabel", json!({"issue": 1, "label": "bug"})),
        ("closeIssue", json!({"issue": 2})),
    ] {
        let queued = s.call_tool(tool, args).await.unwrap();
        assert!(matches!(queued, CallOutcome::Pending { .. }));
    }
}

async fn cycle_once(rig: &Rig) {
    let queued = rig
        .session
        .call_tool("createIssue", json!({"title": "Add dark mode"}))
        .await
        .unwrap();
    rig.overseer
        .approve(queued.ledger().unwrap(), "alice")
        .await
        .unwrap();
    rig.overseer.settle().await;
}

fn memory_turn(c: &mut Criterion) {
    let rt = runtime();
    c.bench_function("memory_turn", |b| {
        b.iter_batched(
            memory_world,
            |rig| {
                rt.block_on(turn_once(&rig));
                rig
            },
            BatchSize::SmallInput,
        )
    });
}

fn memory_cycle(c: &mut Criterion) {
    let rt = runtime();
    c.bench_function("memory_cycle", |b| {
        b.iter_batched(
            memory_world,
            |rig| {
                rt.block_on(cycle_once(&rig));
                rig
            },
            BatchSize::SmallInput,
        )
    });
}

fn file_benches(c: &mut Criterion) {
    // Same directory, same filesystem, for the database and the raw baseline.
    let dir = TempDir::new("bench");
    raw_fsync(c, &dir);
    durable_cycle(c, &dir);
    drain_1000(c, &dir);
}

fn summary(_: &mut Criterion) {
    let tally = TALLY.lock().unwrap();
    let per = |name: &str| {
        tally.iter().find(|t| t.0 == name).map(|t| {
            (
                t.1.as_secs_f64() * 1e6 / t.2.max(1) as f64,
                t.3 as f64 / t.2.max(1) as f64,
            )
        })
    };
    println!("\nstore-sqlite summary (means over every timed iteration, warm-up included)");
    println!(
        "allocator: MALLOC_TRIM_THRESHOLD_={:?} MALLOC_TOP_PAD_={:?}",
        std::env::var("MALLOC_TRIM_THRESHOLD_").ok(),
        std::env::var("MALLOC_TOP_PAD_").ok()
    );
    let raw = per("raw_fsync_4k");
    if let Some((raw_us, _)) = raw {
        println!("  raw 4 KiB write+fsync: {raw_us:.1} µs");
    }
    if let Some((us, commits)) = per("durable_cycle") {
        let budget = raw.map(|(r, _)| 1.2 * 3.0 * r);
        println!(
            "  durable cycle: {us:.1} µs, {commits:.3} commits/action; budget 1.2 × 3 × raw = {}",
            budget.map_or("n/a".into(), |b| format!(
                "{b:.1} µs ({:.2} × 3 raw)",
                us / (3.0 * b / 3.6)
            ))
        );
    }
    if let Some((us, commits)) = per("drain_1000 (per applied action)") {
        println!(
            "  drain of 1,000: {us:.1} µs and {commits:.4} commits per applied action (stages: 1 commit each)"
        );
    }
}

criterion_group!(benches, file_benches, memory_turn, memory_cycle, summary);
criterion_main!(benches);

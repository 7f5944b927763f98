//! Benchmarks of the gate's hot paths, with the real kernel and the in-memory store.
//!
//! - `turn`: an agent turn shaped like the lecture's ex03: one read, then three actions
//!   staged and submitted. Target: at most 5 µs.
//! - `cycle`: one action staged, approved by a person and applied, including the drain
//!   the approval triggers (`settle`). Target: at most 3 µs.
//!
//! Fresh state per batch: each batch of iterations runs against a world built for it
//! outside the measurement (kernel, store, gatekeeper, grant), and only the turns or
//! cycles are timed. A batch of `turn` is 16 turns (48 pending actions, under the cap of
//! 50); a batch of `cycle` is 64 cycles (applied actions do not count towards the cap).
//! Building a world costs several times a turn, so building one per iteration would
//! measure cold caches and the allocator rather than the gate.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

mod common;

use std::future::Future;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use gatekeeper_core::CallOutcome;
use serde_json::json;
use tokio::runtime::Runtime;

/// Time `iters` runs of `step`, on a fresh world every `batch` runs (untimed).
fn batched<F, Fut>(rt: &Runtime, iters: u64, batch: u64, step: F) -> Duration
where
    F: Fn(common::World) -> Fut,
    Fut: Future<Output = common::World>,
{
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(batch);
        let mut world = common::world();
        let start = Instant::now();
        world = rt.block_on(async {
            for _ in 0..n {
                world = step(world).await;
            }
            world
        });
        total += start.elapsed();
        drop(world);
        left -= n;
    }
    total
}

fn turn(c: &mut Criterion) {
    let rt = common::runtime();
    c.bench_function("turn", |b| {
        b.iter_custom(|iters| {
            batched(&rt, iters, 16, |world| async move {
                let s = &world.session;
                let read = s.call_tool("listIssues", json!({})).await.expect("read");
                assert!(matches!(read, CallOutcome::Data { .. }));
                for (tool, args) in [
                    ("createIssue", json!({"title": "Add dark mode"})),
                    ("addLabel", json!({"issue": 1, "label": "bug"})),
                    ("closeIssue", json!({"issue": 2})),
                ] {
                    let queued = s.call_tool(tool, args).await.expect("queued");
                    assert!(matches!(queued, CallOutcome::Pending { .. }));
                }
                world
            })
        })
    });
}

fn cycle(c: &mut Criterion) {
    let rt = common::runtime();
    c.bench_function("cycle", |b| {
        b.iter_custom(|iters| {
            batched(&rt, iters, 64, |world| async move {
                let queued = world
                    .session
                    .call_tool("createIssue", json!({"title": "Add dark mode"}))
                    .await
                    .expect("queued");
                let ledger = queued.ledger().expect("pending");
                world
                    .overseer
                    .approve(ledger, "alice")
                    .await
                    .expect("applied");
                world.overseer.settle().await;
                world
            })
        })
    });
}

criterion_group!(benches, turn, cycle);
criterion_main!(benches);

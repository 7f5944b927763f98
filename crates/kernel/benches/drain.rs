//! Benchmark of the auto-approval drainer over 1,000 and 10,000 eligible pending actions.
//!
//! Each sample builds a fresh in-memory kernel with `n` auto-approvable actions pending
//! (untimed), then times enabling the rule through `settle()`: one drain applying all
//! `n` in ascending id, with a driver whose apply succeeds at once.
//! Per-action time is the reported time divided by `n` (criterion's throughput line).

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kernel::{
    ActionDescription, ActionKind, DriverActionId, Gatekeeper, GatekeeperError, Overseer,
    RejectOutcome, RevertOutcome, StepClock,
};

/// A driver whose apply succeeds at once.
struct Instantly;

#[async_trait]
impl Gatekeeper for Instantly {
    fn name(&self) -> &str {
        "issues"
    }
    async fn apply_action(&self, _action: DriverActionId) -> Result<(), GatekeeperError> {
        Ok(())
    }
    async fn reject_action(&self, _: DriverActionId) -> Result<RejectOutcome, GatekeeperError> {
        Ok(RejectOutcome::default())
    }
    async fn revert_action(&self, _: DriverActionId) -> Result<RevertOutcome, GatekeeperError> {
        Ok(RevertOutcome::done())
    }
    fn auto_approvable_actions(&self) -> Vec<ActionKind> {
        vec![kind()]
    }
}

fn kind() -> ActionKind {
    ActionKind::new("mcp:issues:addLabel", "addLabel")
}

async fn pending_kernel(n: u64) -> Overseer {
    let overseer = Overseer::new(Arc::new(StepClock::new(0, 1)));
    overseer.register(Arc::new(Instantly)).unwrap();
    let queue = overseer.queue_for("issues", "agent").unwrap();
    let description = ActionDescription {
        auto_approvable: true,
        action_kind: Some(kind()),
        ..ActionDescription::new("Issue tracker: addLabel", "add label `bug` to #1")
    };
    for driver in 1..=n {
        queue
            .submit_action(DriverActionId(driver), description.clone())
            .await
            .unwrap();
    }
    overseer
}

fn drain(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("drain");
    for n in [1_000u64, 10_000] {
        group.throughput(Throughput::Elements(n));
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let overseer = runtime.block_on(pending_kernel(n));
                    let start = Instant::now();
                    runtime.block_on(async {
                        overseer.enable_rule("issues", kind(), "alice").unwrap();
                        overseer.settle().await;
                    });
                    total += start.elapsed();
                    assert!(overseer.open_actions().unwrap().is_empty());
                }
                total
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = drain
}
criterion_main!(benches);

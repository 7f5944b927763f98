//! Benchmark of simulated reads: the body of a page with pending actions on it, while
//! other pages have pending work too.
//!
//! The reference lists and filters every pending action on each read (13.9 µs for
//! 50 on the page + 50 elsewhere, 162 µs for 10 + 1,000). This driver keeps pending
//! actions indexed by content, so a read costs what its own page costs. Target: ≤ 3 µs
//! for both shapes.
//!
//! What is measured: `WikiSession::body` end to end — resolve the handle, GET the page
//! from the in-process wiki, convert its storage to Markdown, fold the page's pending
//! actions, build the ledger line, authorize it (through a queue that records nothing,
//! so the measurement is the driver's, not the kernel ledger's growth), and remember the
//! actions seen. Run: `cargo bench -p gatekeeper-confluence -- --warm-up-time 1
//! --measurement-time 3`.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use criterion::{Criterion, criterion_group, criterion_main};
use gatekeeper_confluence::{
    ConfluenceGatekeeper, ContentHandle, MemoryKv, Policy, WikiService, WikiSession,
};
use kernel::{
    ActionDescription, ApprovalQueue, DriverActionId, LedgerId, ObservationAuthorizer,
    ObservationDescription, QueueError, StepClock,
};
use tokio::runtime::Runtime;

/// A queue that accepts everything and keeps nothing.
#[derive(Default)]
struct NullQueue {
    next: AtomicU64,
}

#[async_trait]
impl ObservationAuthorizer for NullQueue {
    async fn authorize_observation(
        &self,
        description: ObservationDescription,
    ) -> Result<LedgerId, QueueError> {
        black_box(description);
        Ok(LedgerId(self.next.fetch_add(1, Ordering::Relaxed)))
    }
}

#[async_trait]
impl ApprovalQueue for NullQueue {
    async fn submit_action(
        &self,
        _action: DriverActionId,
        _description: ActionDescription,
    ) -> Result<LedgerId, QueueError> {
        Ok(LedgerId(self.next.fetch_add(1, Ordering::Relaxed)))
    }
}

/// A wiki with page 100 and `others` other pages, `on_page` appends pending on page 100
/// and `elsewhere` appends pending spread over the other pages.
fn setup(
    rt: &Runtime,
    policy: Policy,
    on_page: usize,
    elsewhere: usize,
) -> (WikiSession, ContentHandle) {
    let service = Arc::new(WikiService::new());
    service.seed_page_with_id(
        100,
        "OPS",
        "Runbook",
        "First paragraph.\n\nSecond paragraph.",
    );
    let others: Vec<u64> = (0..20)
        .map(|n| service.seed_page("OPS", &format!("Other {n}"), "Other body."))
        .collect();
    let gatekeeper = Arc::new(
        ConfluenceGatekeeper::open(
            "confluence",
            service,
            Arc::new(MemoryKv::new()),
            Arc::new(StepClock::default()),
            policy,
        )
        .expect("empty store"),
    );
    let session = gatekeeper.session(Arc::new(NullQueue::default()));
    let page = ContentHandle::Real(100);
    rt.block_on(async {
        // Interleave, so the page's actions are spread through the id space.
        let mut staged_on_page = 0;
        for n in 0..elsewhere.max(on_page) {
            // `elsewhere` may be 0: then only the page gets actions.
            if n < elsewhere {
                let other = ContentHandle::Real(others[n % others.len()]);
                session
                    .append_content(&other, &format!("note {n}"))
                    .await
                    .expect("stage");
            }
            if staged_on_page < on_page {
                session
                    .append_content(&page, &format!("Step {n}: check the dashboards."))
                    .await
                    .expect("stage");
                staged_on_page += 1;
            }
        }
    });
    assert_eq!(gatekeeper.pending_count(), on_page + elsewhere);
    (session, page)
}

fn reads(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("simulated_body_read");
    for (policy, on_page, elsewhere) in [
        (Policy::GUARDED, 50, 50),
        (Policy::GUARDED, 10, 1000),
        (Policy::GUARDED, 10, 0),
        (Policy::REFERENCE, 50, 50),
        (Policy::REFERENCE, 10, 1000),
    ] {
        let (session, page) = setup(&rt, policy, on_page, elsewhere);
        let expected = rt.block_on(session.body(&page)).expect("read");
        assert!(expected.ends_with("check the dashboards."));
        group.bench_function(
            format!("policy={policy}/{on_page}_on_page+{elsewhere}_elsewhere"),
            |b| b.iter(|| rt.block_on(session.body(black_box(&page))).expect("read")),
        );
    }
    group.finish();
}

criterion_group!(benches, reads);
criterion_main!(benches);

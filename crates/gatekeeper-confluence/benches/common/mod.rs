//! What the wiki driver's benchmarks share: a queue that records nothing, and the read
//! shape (one page with pending appends, others with pending work too).

// Each benchmark uses part of this module.
#![allow(dead_code)]

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
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
pub struct NullQueue {
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
        description: ActionDescription,
    ) -> Result<LedgerId, QueueError> {
        black_box(description);
        Ok(LedgerId(self.next.fetch_add(1, Ordering::Relaxed)))
    }
}

/// The wiki driver alone over `service` and `kv` (no kernel: submissions go to a
/// [`NullQueue`]), and an agent's session on it.
pub fn driver(
    service: Arc<WikiService>,
    kv: Arc<MemoryKv>,
    policy: Policy,
) -> (Arc<ConfluenceGatekeeper>, WikiSession) {
    let gatekeeper = Arc::new(
        ConfluenceGatekeeper::open(
            "confluence",
            service,
            kv,
            Arc::new(StepClock::default()),
            policy,
        )
        .expect("empty store"),
    );
    let session = gatekeeper.session(Arc::new(NullQueue::default()));
    (gatekeeper, session)
}

/// A wiki with page 100 and `others` other pages, `on_page` appends pending on page 100
/// and `elsewhere` appends pending spread over the other pages.
pub fn read_shape(
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
    let (gatekeeper, session) = driver(service, Arc::new(MemoryKv::new()), policy);
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

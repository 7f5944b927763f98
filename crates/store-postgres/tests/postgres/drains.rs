//! Two kernels (two daemons' stores) on one database, both staging auto-approvable
//! actions under one rule: the drain of the gatekeeper runs in one of them at a time
//! (the lease), in ascending ledger id, and every action is applied exactly once,
//! including those submitted through one kernel while the other was draining.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use kernel::{
    ActionDescription, ActionKind, ActionState, DriverActionId, Gatekeeper, GatekeeperError,
    Overseer, RejectOutcome, RevertOutcome, StepClock,
};
use store_postgres::Database;

use crate::support::{auto_kind, fresh};

/// A gatekeeper shared by both kernels: it logs every apply and how many ran at once.
#[derive(Default)]
struct Counting {
    applies: Mutex<Vec<u64>>,
    running: AtomicUsize,
    most_at_once: AtomicUsize,
}

#[async_trait]
impl Gatekeeper for Counting {
    fn name(&self) -> &str {
        "gk"
    }

    async fn apply_action(&self, action: DriverActionId) -> Result<(), GatekeeperError> {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_at_once.fetch_max(now, Ordering::SeqCst);
        // Long enough for the other kernel's drain to try to run alongside.
        tokio::time::sleep(Duration::from_millis(3)).await;
        self.applies.lock().unwrap().push(action.0);
        self.running.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }

    async fn reject_action(
        &self,
        _action: DriverActionId,
    ) -> Result<RejectOutcome, GatekeeperError> {
        Ok(RejectOutcome::default())
    }

    async fn revert_action(
        &self,
        _action: DriverActionId,
    ) -> Result<RevertOutcome, GatekeeperError> {
        Ok(RevertOutcome::done())
    }

    fn auto_approvable_actions(&self) -> Vec<ActionKind> {
        vec![auto_kind()]
    }
}

fn auto(n: u64) -> ActionDescription {
    ActionDescription {
        auto_approvable: true,
        action_kind: Some(auto_kind()),
        ..ActionDescription::new(format!("write {n}"), "body")
    }
}

const EACH: u64 = 25;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_kernels_drain_one_gatekeeper_one_at_a_time_in_id_order_exactly_once() {
    let (url, first) = fresh();
    let second = Database::open(&url).unwrap();
    let gatekeeper = Arc::new(Counting::default());
    let kernels: Vec<Overseer> = [&first, &second]
        .iter()
        .map(|db| {
            let overseer = Overseer::with_store(db.ledger(), Arc::new(StepClock::default()));
            overseer.register(gatekeeper.clone()).unwrap();
            overseer
        })
        .collect();
    kernels[0].enable_rule("gk", auto_kind(), "carol").unwrap();

    let mut staging = Vec::new();
    for (k, overseer) in kernels.iter().enumerate() {
        let queue = overseer.queue_for("gk", "agent").unwrap();
        staging.push(tokio::spawn(async move {
            for n in 0..EACH {
                // Driver ids are distinct across kernels, as one shared action store's are.
                let driver = 1 + n * 2 + k as u64;
                queue
                    .submit_action(DriverActionId(driver), auto(driver))
                    .await
                    .unwrap();
            }
        }));
    }
    for task in staging {
        task.await.unwrap();
    }
    for overseer in &kernels {
        overseer.settle().await;
    }

    let ledger = kernels[1].ledger().unwrap();
    assert_eq!(ledger.len() as u64, 2 * EACH);
    let applies = gatekeeper.applies.lock().unwrap().clone();
    let mut once = applies.clone();
    once.sort_unstable();
    once.dedup();
    assert_eq!(
        once.len(),
        applies.len(),
        "no action applied twice: {applies:?}"
    );
    assert_eq!(
        applies.len() as u64,
        2 * EACH,
        "every action applied: {applies:?}"
    );
    assert_eq!(
        gatekeeper.most_at_once.load(Ordering::SeqCst),
        1,
        "one drain at a time across both kernels"
    );
    let ledger_id = |driver: u64| {
        ledger
            .iter()
            .find(|e| e.action().unwrap().driver_id.0 == driver)
            .unwrap()
            .id
    };
    let order: Vec<_> = applies.iter().map(|d| ledger_id(*d)).collect();
    assert!(
        order.windows(2).all(|pair| pair[0] < pair[1]),
        "applied in ascending ledger id: {order:?}"
    );
    for entry in &ledger {
        let action = entry.action().unwrap();
        assert_eq!(action.state, ActionState::Approved);
        let resolution = action.resolution.as_ref().unwrap();
        assert!(resolution.auto);
        assert_eq!(resolution.by, "carol");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn work_submitted_through_one_kernel_while_the_other_drains_is_not_left_waiting() {
    for round in 0..5 {
        let (url, first) = fresh();
        let second = Database::open(&url).unwrap();
        let gatekeeper = Arc::new(Counting::default());
        let kernels: Vec<Overseer> = [&first, &second]
            .iter()
            .map(|db| {
                let overseer = Overseer::with_store(db.ledger(), Arc::new(StepClock::default()));
                overseer.register(gatekeeper.clone()).unwrap();
                overseer
            })
            .collect();
        kernels[0].enable_rule("gk", auto_kind(), "carol").unwrap();
        let queue = kernels[0].queue_for("gk", "agent").unwrap();
        for n in 0..10 {
            queue
                .submit_action(DriverActionId(2 * n + 1), auto(2 * n + 1))
                .await
                .unwrap();
        }
        // The first kernel is draining; one submission through the second, then quiet.
        while gatekeeper.applies.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let late = kernels[1].queue_for("gk", "agent").unwrap();
        late.submit_action(DriverActionId(100), auto(100))
            .await
            .unwrap();
        for overseer in &kernels {
            overseer.settle().await;
        }
        let open = kernels[0].open_actions().unwrap();
        assert!(
            open.is_empty(),
            "round {round}: left waiting: {:?}",
            open.iter().map(|e| e.id).collect::<Vec<_>>()
        );
        assert_eq!(
            gatekeeper.applies.lock().unwrap().len(),
            11,
            "round {round}"
        );
    }
}

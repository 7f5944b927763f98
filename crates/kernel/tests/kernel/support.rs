//! A scriptable in-test gatekeeper and helpers shared by the kernel's tests.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use kernel::{
    ActionDescription, ActionKind, ApprovalQueue, DriverActionId, Gatekeeper, GatekeeperError,
    LedgerEntry, LedgerId, Overseer, RejectOutcome, RevertOutcome, StepClock,
};
use tokio::sync::Notify;

/// What the fake saw at the instant it was asked to apply an action.
#[derive(Debug, Clone)]
pub struct ApplySnapshot {
    pub driver: u64,
    /// Open actions of this gatekeeper at that instant.
    pub open: Vec<LedgerEntry>,
}

/// One apply held until the test releases it.
pub struct Park {
    pub driver: u64,
    pub entered: Arc<Notify>,
    pub release: Arc<Notify>,
}

/// A gatekeeper that records every call and can be told to fail, park, or cascade.
#[derive(Default)]
pub struct FakeGatekeeper {
    name: String,
    pub applies: Mutex<Vec<u64>>,
    /// Every apply call, including those that failed, panicked or never answered.
    pub attempts: Mutex<Vec<u64>>,
    pub snapshots: Mutex<Vec<ApplySnapshot>>,
    pub rejects: Mutex<Vec<u64>>,
    pub reverts: Mutex<Vec<u64>>,
    fail_next: Mutex<HashMap<u64, GatekeeperError>>,
    cascade: Mutex<HashMap<u64, Vec<u64>>>,
    restart_on_reject: Mutex<bool>,
    revert_refusal: Mutex<Option<String>>,
    park: Mutex<Option<Park>>,
    panic_on: Mutex<HashSet<u64>>,
    hang_on: Mutex<HashSet<u64>>,
    deadline: Mutex<Option<Duration>>,
    /// Driver ids whose arguments pass any rule's argument tests.
    covered: Mutex<HashSet<u64>>,
    overseer: OnceLock<Overseer>,
}

impl FakeGatekeeper {
    pub fn new(name: &str) -> Arc<Self> {
        Arc::new(Self {
            name: name.to_owned(),
            ..Self::default()
        })
    }

    /// Let the fake look at the ledger when it applies (for ordering checks).
    pub fn watch(&self, overseer: &Overseer) {
        let _ = self.overseer.set(overseer.clone());
    }

    pub fn fail_next_apply(&self, driver: u64, error: GatekeeperError) {
        self.fail_next.lock().unwrap().insert(driver, error);
    }

    pub fn cascade_on_reject(&self, driver: u64, others: &[u64]) {
        self.cascade.lock().unwrap().insert(driver, others.to_vec());
    }

    /// The next apply of `driver` panics (a driver bug).
    pub fn panic_on_apply(&self, driver: u64) {
        self.panic_on.lock().unwrap().insert(driver);
    }

    /// The next apply of `driver` never answers (a hung service).
    pub fn hang_on_apply(&self, driver: u64) {
        self.hang_on.lock().unwrap().insert(driver);
    }

    /// Report `deadline` as this gatekeeper's call deadline.
    pub fn set_deadline(&self, deadline: Duration) {
        *self.deadline.lock().unwrap() = Some(deadline);
    }

    /// Let `driver`'s arguments pass any rule's argument tests (the others pass none).
    pub fn cover(&self, driver: u64) {
        self.covered.lock().unwrap().insert(driver);
    }

    pub fn attempted(&self) -> Vec<u64> {
        self.attempts.lock().unwrap().clone()
    }

    pub fn restart_on_reject(&self) {
        *self.restart_on_reject.lock().unwrap() = true;
    }

    pub fn refuse_reverts(&self, message: &str) {
        *self.revert_refusal.lock().unwrap() = Some(message.to_owned());
    }

    /// Hold the next apply of `driver` until `release` is notified.
    pub fn park(&self, driver: u64) -> (Arc<Notify>, Arc<Notify>) {
        let entered = Arc::new(Notify::new());
        let release = Arc::new(Notify::new());
        *self.park.lock().unwrap() = Some(Park {
            driver,
            entered: entered.clone(),
            release: release.clone(),
        });
        (entered, release)
    }

    pub fn applied(&self) -> Vec<u64> {
        self.applies.lock().unwrap().clone()
    }

    pub fn times_applied(&self, driver: u64) -> usize {
        self.applies
            .lock()
            .unwrap()
            .iter()
            .filter(|d| **d == driver)
            .count()
    }
}

#[async_trait]
impl Gatekeeper for FakeGatekeeper {
    fn name(&self) -> &str {
        &self.name
    }

    async fn apply_action(&self, action: DriverActionId) -> Result<(), GatekeeperError> {
        let driver = action.0;
        self.attempts.lock().unwrap().push(driver);
        if self.panic_on.lock().unwrap().remove(&driver) {
            panic!("fake driver bug while applying {driver}");
        }
        if self.hang_on.lock().unwrap().remove(&driver) {
            std::future::pending::<()>().await;
        }
        if let Some(overseer) = self.overseer.get() {
            let open = overseer
                .open_actions()
                .unwrap()
                .into_iter()
                .filter(|e| *e.gatekeeper == self.name)
                .collect();
            self.snapshots
                .lock()
                .unwrap()
                .push(ApplySnapshot { driver, open });
        }
        let park = {
            let mut slot = self.park.lock().unwrap();
            match slot.as_ref() {
                Some(p) if p.driver == driver => slot.take(),
                _ => None,
            }
        };
        if let Some(park) = park {
            park.entered.notify_one();
            park.release.notified().await;
        }
        if let Some(error) = self.fail_next.lock().unwrap().remove(&driver) {
            return Err(error);
        }
        self.applies.lock().unwrap().push(driver);
        Ok(())
    }

    async fn reject_action(
        &self,
        action: DriverActionId,
    ) -> Result<RejectOutcome, GatekeeperError> {
        self.rejects.lock().unwrap().push(action.0);
        let cascaded = self
            .cascade
            .lock()
            .unwrap()
            .remove(&action.0)
            .unwrap_or_default()
            .into_iter()
            .map(DriverActionId)
            .collect();
        Ok(RejectOutcome {
            restart: *self.restart_on_reject.lock().unwrap(),
            cascaded,
        })
    }

    async fn revert_action(
        &self,
        action: DriverActionId,
    ) -> Result<RevertOutcome, GatekeeperError> {
        self.reverts.lock().unwrap().push(action.0);
        Ok(match self.revert_refusal.lock().unwrap().clone() {
            Some(message) => RevertOutcome::refused(message, true),
            None => RevertOutcome::done(),
        })
    }

    fn auto_approvable_actions(&self) -> Vec<ActionKind> {
        vec![label_kind()]
    }

    async fn covers(
        &self,
        action: DriverActionId,
        tests: &[kernel::ArgumentTest],
    ) -> Result<bool, GatekeeperError> {
        Ok(tests.is_empty() || self.covered.lock().unwrap().contains(&action.0))
    }

    fn call_deadline(&self) -> Duration {
        self.deadline
            .lock()
            .unwrap()
            .unwrap_or(kernel::DEFAULT_CALL_DEADLINE)
    }
}

pub fn label_kind() -> ActionKind {
    ActionKind::new("issues:addLabel", "addLabel")
}

/// A description that is manual unless `auto` (then auto-approvable, kind addLabel).
pub fn description(title: &str, auto: bool) -> ActionDescription {
    ActionDescription {
        auto_approvable: auto,
        action_kind: Some(label_kind()),
        ..ActionDescription::new(title, format!("do {title}"))
    }
}

/// A kernel with one fake gatekeeper named "issues" and the agent's queue for it.
pub fn setup() -> (Overseer, Arc<FakeGatekeeper>, Arc<dyn ApprovalQueue>) {
    let overseer = Overseer::new(Arc::new(StepClock::default()));
    let gatekeeper = FakeGatekeeper::new("issues");
    overseer.register(gatekeeper.clone()).unwrap();
    let queue = overseer.queue_for("issues", "agent").unwrap();
    (overseer, gatekeeper, queue)
}

/// Submit action `driver` with a manual or auto-approvable description.
pub async fn submit(queue: &Arc<dyn ApprovalQueue>, driver: u64, auto: bool) -> LedgerId {
    queue
        .submit_action(
            DriverActionId(driver),
            description(&format!("a{driver}"), auto),
        )
        .await
        .unwrap()
}

pub fn state(overseer: &Overseer, id: LedgerId) -> kernel::ActionState {
    overseer.entry(id).unwrap().unwrap().action().unwrap().state
}

/// Neither a person's approval nor their rejection of `id` is taken while another decision
/// of it is under way.
pub async fn both_decisions_refused_in_flight(overseer: &Overseer, id: LedgerId) {
    assert_eq!(
        overseer.approve(id, "bob").await.unwrap_err(),
        kernel::DecisionError::InFlight(id)
    );
    assert_eq!(
        overseer.reject(id, "bob").await.unwrap_err(),
        kernel::DecisionError::InFlight(id)
    );
}

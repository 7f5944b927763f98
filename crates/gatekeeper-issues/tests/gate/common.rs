//! A wired world: a kernel with a step clock, the fake tracker, and its gatekeeper.
#![allow(dead_code)]

use std::sync::Arc;

use gatekeeper_core::{ActionStore, CallOutcome, MemoryActionStorage, Session, ToolGatekeeper};
use gatekeeper_issues::service::ParkHandle;
use gatekeeper_issues::{Catalog, IssueTracker, IssuesConfig};
use kernel::{
    ActionEntry, Clock, DriverActionId, Gatekeeper, GatekeeperError, LedgerId, Overseer, StepClock,
};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

pub struct World {
    pub clock: Arc<dyn Clock>,
    pub overseer: Overseer,
    pub tracker: Arc<IssueTracker>,
    pub storage: MemoryActionStorage,
    pub issues: Arc<ToolGatekeeper>,
}

pub async fn world(config: IssuesConfig) -> World {
    world_with(config, Catalog::Honest).await
}

pub async fn world_with(config: IssuesConfig, catalog: Catalog) -> World {
    let clock: Arc<dyn Clock> = Arc::new(StepClock::default());
    let overseer = Overseer::new(clock.clone());
    let tracker = IssueTracker::with_catalog(catalog);
    let storage = MemoryActionStorage::new();
    let store = ActionStore::open(Arc::new(storage.clone()), clock.clone())
        .await
        .expect("open store");
    let issues = config.build(tracker.clone(), store).await;
    overseer.register(issues.clone()).expect("register");
    World {
        clock,
        overseer,
        tracker,
        storage,
        issues,
    }
}

impl World {
    pub fn session(&self, tools: &[&str]) -> Session {
        self.issues
            .grant(&self.overseer, "agent", tools)
            .expect("grant")
            .into_session()
    }

    /// Starts applying `action` through the driver and returns once the tracker holds
    /// the call in flight: the park handle (release it to let the call land) and the
    /// apply's task.
    pub async fn apply_parked(
        &self,
        action: DriverActionId,
    ) -> (ParkHandle, JoinHandle<Result<(), GatekeeperError>>) {
        let park = self.tracker.park_next();
        let issues = self.issues.clone();
        let apply = tokio::spawn(async move { issues.apply_action(action).await });
        park.wait_until_parked().await;
        (park, apply)
    }

    pub fn entry(&self, ledger: LedgerId) -> ActionEntry {
        self.overseer
            .entry(ledger)
            .expect("ledger")
            .expect("entry")
            .action()
            .expect("an action")
            .clone()
    }
}

/// Call an action and return its ids.
pub async fn queue(session: &Session, tool: &str, args: Value) -> (DriverActionId, LedgerId) {
    match session.call_tool(tool, args).await.expect("queued") {
        CallOutcome::Pending { action, ledger, .. } => (action, ledger),
        CallOutcome::Data { .. } => panic!("{tool} should be an action"),
    }
}

pub async fn create(session: &Session, title: &str) -> (DriverActionId, LedgerId) {
    queue(session, "createIssue", json!({"title": title})).await
}

/// The text of a read.
pub async fn read(session: &Session, tool: &str, args: Value) -> String {
    match session.call_tool(tool, args).await.expect("read") {
        CallOutcome::Data { result, .. } => result.text(),
        CallOutcome::Pending { .. } => panic!("{tool} should be a read"),
    }
}

//! Shared helpers: temporary directories and a scriptable in-test gatekeeper.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use kernel::{
    ActionKind, DriverActionId, Gatekeeper, GatekeeperError, RejectOutcome, RevertOutcome,
};

/// The id a call gets when it is staged through a new action store over `storage`.
pub async fn staged_id(storage: Arc<dyn gatekeeper_core::ActionStorage>) -> DriverActionId {
    gatekeeper_core::ActionStore::open(storage, Arc::new(kernel::StepClock::default()))
        .await
        .expect("the store opens")
        .stage("ok", serde_json::json!({}))
        .await
        .expect("staged")
}

/// A directory under the system's temp dir, removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(label: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "store-sqlite-{label}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("temp dir");
        Self(path)
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub use kernel::testkit::pending_entry;

/// The kind every auto-approvable action of these tests carries.
pub fn auto_kind() -> ActionKind {
    ActionKind::new("gk:write", "write")
}

/// A gatekeeper that records applies and can be told to fail or cascade.
#[derive(Default)]
pub struct FakeGatekeeper {
    name: String,
    pub applies: Mutex<Vec<u64>>,
    fail_next: Mutex<HashMap<u64, GatekeeperError>>,
    cascade: Mutex<HashMap<u64, Vec<u64>>>,
}

impl FakeGatekeeper {
    pub fn new(name: &str) -> Arc<Self> {
        Arc::new(Self {
            name: name.to_owned(),
            ..Self::default()
        })
    }

    pub fn fail_next_apply(&self, driver: u64, error: GatekeeperError) {
        self.fail_next.lock().unwrap().insert(driver, error);
    }

    pub fn cascade_on_reject(&self, driver: u64, others: &[u64]) {
        self.cascade.lock().unwrap().insert(driver, others.to_vec());
    }
}

#[async_trait]
impl Gatekeeper for FakeGatekeeper {
    fn name(&self) -> &str {
        &self.name
    }

    async fn apply_action(&self, action: DriverActionId) -> Result<(), GatekeeperError> {
        if let Some(error) = self.fail_next.lock().unwrap().remove(&action.0) {
            return Err(error);
        }
        self.applies.lock().unwrap().push(action.0);
        Ok(())
    }

    async fn reject_action(
        &self,
        action: DriverActionId,
    ) -> Result<RejectOutcome, GatekeeperError> {
        let cascaded = self
            .cascade
            .lock()
            .unwrap()
            .remove(&action.0)
            .unwrap_or_default();
        Ok(RejectOutcome {
            restart: !cascaded.is_empty(),
            cascaded: cascaded.into_iter().map(DriverActionId).collect(),
        })
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

/// A check run at the start of every call, before the call is recorded.
pub type CallCheck = Box<dyn Fn(&str, &serde_json::Value) + Send + Sync>;

/// A service that answers at once and remembers every call, optionally holding one until
/// released (to look at the database while a call is in flight).
#[derive(Default)]
pub struct RecordingService {
    pub calls: Mutex<Vec<(String, serde_json::Value)>>,
    pub hold: Mutex<Option<(Arc<tokio::sync::Notify>, Arc<tokio::sync::Notify>)>>,
    pub on_call: Mutex<Option<CallCheck>>,
}

impl RecordingService {
    /// Hold the next call until `release` is notified; `entered` is notified when it starts.
    pub fn hold_next(&self) -> (Arc<tokio::sync::Notify>, Arc<tokio::sync::Notify>) {
        let entered = Arc::new(tokio::sync::Notify::new());
        let release = Arc::new(tokio::sync::Notify::new());
        *self.hold.lock().unwrap() = Some((entered.clone(), release.clone()));
        (entered, release)
    }

    pub fn calls(&self) -> Vec<(String, serde_json::Value)> {
        self.calls.lock().unwrap().clone()
    }
}

#[async_trait]
impl gatekeeper_core::ToolService for RecordingService {
    async fn list_tools(&self) -> Vec<gatekeeper_core::Tool> {
        catalog()
    }

    async fn call(
        &self,
        tool: &str,
        args: &serde_json::Value,
    ) -> Result<gatekeeper_core::ToolResult, gatekeeper_core::CallError> {
        if let Some(check) = &*self.on_call.lock().unwrap() {
            check(tool, args);
        }
        let hold = self.hold.lock().unwrap().take();
        if let Some((entered, release)) = hold {
            entered.notify_one();
            release.notified().await;
        }
        self.calls
            .lock()
            .unwrap()
            .push((tool.to_owned(), args.clone()));
        Ok(gatekeeper_core::ToolResult::from_text(format!(
            "{tool} done"
        )))
    }
}

/// An issue tracker's catalog: one read, one auto-approvable write, two manual writes.
pub fn catalog() -> Vec<gatekeeper_core::Tool> {
    gatekeeper_core::Tool::catalog_from_json(serde_json::json!([
        {"name": "listIssues", "description": "List the tracker's issues.",
         "annotations": {"readOnlyHint": true}},
        {"name": "createIssue", "description": "Open a new issue.",
         "annotations": {"destructiveHint": false}},
        {"name": "addLabel", "description": "Add a label to an issue.",
         "annotations": {"destructiveHint": false, "idempotentHint": true}},
        {"name": "closeIssue", "description": "Close an issue."}
    ]))
    .expect("valid catalog")
}

/// What the rig needs of a store ([`store_sqlite::Database`]). (The counts and `flush`
/// are the benchmark's, which includes this file too.)
#[allow(dead_code)]
pub trait Store {
    fn ledger(&self) -> Arc<dyn kernel::LedgerStore>;
    fn action_storage(&self, gatekeeper: &str) -> Arc<dyn gatekeeper_core::ActionStorage>;
    fn commits(&self) -> u64;
    fn syncs(&self) -> u64;
    fn flush(&self) -> Result<(), store_sqlite::StoreError>;
}

impl Store for store_sqlite::Database {
    fn ledger(&self) -> Arc<dyn kernel::LedgerStore> {
        store_sqlite::Database::ledger(self)
    }
    fn action_storage(&self, gatekeeper: &str) -> Arc<dyn gatekeeper_core::ActionStorage> {
        store_sqlite::Database::action_storage(self, gatekeeper)
    }
    fn commits(&self) -> u64 {
        store_sqlite::Database::commits(self)
    }
    fn syncs(&self) -> u64 {
        store_sqlite::Database::syncs(self)
    }
    fn flush(&self) -> Result<(), store_sqlite::StoreError> {
        store_sqlite::Database::flush(self)
    }
}

/// The real stack on one database: kernel, gatekeeper-core's gatekeeper and session.
pub struct Rig<D = store_sqlite::Database> {
    pub db: D,
    pub overseer: kernel::Overseer,
    pub gatekeeper: Arc<gatekeeper_core::ToolGatekeeper>,
    pub service: Arc<RecordingService>,
    pub session: gatekeeper_core::Session,
}

impl<D: Store> Rig<D> {
    pub async fn new(db: D) -> Self {
        let clock: Arc<dyn kernel::Clock> = Arc::new(kernel::StepClock::default());
        let overseer = kernel::Overseer::with_store(db.ledger(), clock.clone());
        let service = Arc::new(RecordingService::default());
        let store = gatekeeper_core::ActionStore::open(db.action_storage("issues"), clock)
            .await
            .expect("action store");
        let gatekeeper = Arc::new(gatekeeper_core::ToolGatekeeper::new(
            gatekeeper_core::GatekeeperConfig {
                name: "issues".into(),
                server_name: "Issue tracker".into(),
                endpoint: "https://issues.example/mcp".into(),
                trust: gatekeeper_core::ServerTrust::Vetted,
                scope: "mcp:issues".into(),
                reads: Vec::new(),
            },
            catalog(),
            service.clone(),
            store,
        ));
        overseer.register(gatekeeper.clone()).expect("register");
        let session = gatekeeper
            .grant_all(&overseer, "agent")
            .expect("grant")
            .into_session();
        Self {
            db,
            overseer,
            gatekeeper,
            service,
            session,
        }
    }

    /// One whole cycle: the agent asks to create issue `n`, a person approves it, and it is
    /// sent, with everything it triggers settled. (The benchmark's.)
    #[allow(dead_code)]
    pub async fn cycle(&self, n: u64) {
        self.create_approved(serde_json::json!({"title": "Add dark mode", "n": n}))
            .await;
        self.overseer.settle().await;
    }

    /// The agent asks to create an issue with `args`, and a person approves it, so it is
    /// sent (what the approval triggers is left to run).
    pub async fn create_approved(&self, args: serde_json::Value) {
        let queued = self
            .session
            .call_tool("createIssue", args)
            .await
            .expect("staged and submitted");
        self.overseer
            .approve(queued.ledger().expect("pending"), "alice")
            .await
            .expect("approved");
    }

    /// The agent asks to create an issue titled `title`: staged and submitted, pending.
    pub async fn queue_issue(&self, title: &str) -> gatekeeper_core::CallOutcome {
        self.session
            .call_tool("createIssue", serde_json::json!({ "title": title }))
            .await
            .expect("staged and submitted")
    }

    /// The auto-approval kind of `addLabel`.
    pub fn label_kind(&self) -> ActionKind {
        self.gatekeeper
            .action_kind("addLabel")
            .expect("addLabel is in the catalog")
    }
}

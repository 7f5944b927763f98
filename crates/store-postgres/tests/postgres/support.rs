//! Helpers shared by the tests: a database of its own per test on the shared cluster,
//! a scriptable in-test gatekeeper, a recording service and the real stack on one
//! database.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use kernel::{
    ActionKind, DriverActionId, Gatekeeper, GatekeeperError, RejectOutcome, RevertOutcome,
};
use store_postgres::Database;
use store_postgres::cluster::Cluster;

/// The URL of a new, empty database on this process's cluster.
pub fn fresh_url() -> String {
    Cluster::shared().fresh_database()
}

/// A handle on a new, empty database, and its URL for more handles.
pub fn fresh() -> (String, Database) {
    let url = fresh_url();
    let db = Database::open(&url).unwrap();
    (url, db)
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

/// The real stack on one database: kernel, gatekeeper-core's gatekeeper and session.
pub struct Rig {
    pub overseer: kernel::Overseer,
    pub gatekeeper: Arc<gatekeeper_core::ToolGatekeeper>,
    pub service: Arc<RecordingService>,
    pub session: gatekeeper_core::Session,
    #[allow(dead_code)] // read by `add_tracker`, which the team bench calls
    pub clock: Arc<dyn kernel::Clock>,
}

/// An issue tracker named `name` (its gatekeeper's and its server's) on `service`.
pub fn tracker(
    name: &str,
    service: Arc<RecordingService>,
    store: gatekeeper_core::ActionStore,
) -> Arc<gatekeeper_core::ToolGatekeeper> {
    Arc::new(gatekeeper_core::ToolGatekeeper::new(
        gatekeeper_core::GatekeeperConfig {
            name: name.into(),
            server_name: "Issue tracker".into(),
            endpoint: format!("https://{name}.example/mcp"),
            trust: gatekeeper_core::ServerTrust::Vetted,
            scope: format!("mcp:{name}"),
            reads: Vec::new(),
        },
        catalog(),
        service,
        store,
    ))
}

impl Rig {
    pub async fn new(db: store_postgres::Database) -> Self {
        let clock: Arc<dyn kernel::Clock> = Arc::new(kernel::StepClock::default());
        let store = db
            .action_store("issues", clock.clone())
            .await
            .expect("action store");
        Self::with(db.ledger(), store, clock)
    }

    /// The same stack on any ledger and action store (the benchmark's SQLite file).
    pub fn with(
        ledger: Arc<dyn kernel::LedgerStore>,
        store: gatekeeper_core::ActionStore,
        clock: Arc<dyn kernel::Clock>,
    ) -> Self {
        let overseer = kernel::Overseer::with_store(ledger, clock.clone());
        let service = Arc::new(RecordingService::default());
        let gatekeeper = tracker("issues", service.clone(), store);
        overseer.register(gatekeeper.clone()).expect("register");
        let session = gatekeeper
            .grant_all(&overseer, "agent")
            .expect("grant")
            .into_session();
        Self {
            overseer,
            gatekeeper,
            service,
            session,
            clock,
        }
    }

    /// A second server on this rig's kernel, an issue tracker named `name` with its
    /// action store on `db` (a daemon configured with two servers; the team bench's).
    #[allow(dead_code)]
    pub async fn add_tracker(
        &self,
        db: &store_postgres::Database,
        name: &str,
    ) -> (Arc<gatekeeper_core::ToolGatekeeper>, Arc<RecordingService>) {
        let store = db
            .action_store(name, self.clock.clone())
            .await
            .expect("action store");
        let service = Arc::new(RecordingService::default());
        let gatekeeper = tracker(name, service.clone(), store);
        self.overseer
            .register(gatekeeper.clone())
            .expect("register");
        (gatekeeper, service)
    }

    /// The agent asks to create an issue titled `title`: staged and submitted, pending.
    pub async fn queue_issue(&self, title: &str) -> gatekeeper_core::CallOutcome {
        self.session
            .call_tool("createIssue", serde_json::json!({ "title": title }))
            .await
            .expect("staged and submitted")
    }
}

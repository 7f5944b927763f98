//! The benchmarks' world: a real kernel, the in-memory store, and a service that answers
//! at once, so what is measured is the gate itself.

use std::sync::Arc;

use async_trait::async_trait;
use gatekeeper_core::{
    ActionStore, CallError, GatekeeperConfig, ServerTrust, Session, Tool, ToolGatekeeper,
    ToolResult, ToolService,
};
use kernel::{Clock, Overseer, StepClock};
use serde_json::{Value, json};

/// Answers every call at once with a short text.
pub struct InstantService {
    listing: ToolResult,
}

impl InstantService {
    /// A service whose `listIssues` returns two issues.
    pub fn new() -> Self {
        Self {
            listing: ToolResult::from_text("#1 Fix login (open)\n#2 Update docs (open)"),
        }
    }
}

#[async_trait]
impl ToolService for InstantService {
    async fn list_tools(&self) -> Vec<Tool> {
        catalog()
    }

    async fn call(&self, tool: &str, _args: &Value) -> Result<ToolResult, CallError> {
        Ok(match tool {
            "listIssues" => self.listing.clone(),
            _ => ToolResult::from_text("Done."),
        })
    }
}

pub fn catalog() -> Vec<Tool> {
    Tool::catalog_from_json(json!([
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

/// Everything one iteration needs, built outside the measurement.
pub struct World {
    pub overseer: Overseer,
    pub session: Session,
}

pub fn world() -> World {
    let clock: Arc<dyn Clock> = Arc::new(StepClock::default());
    let overseer = Overseer::new(clock.clone());
    let service = Arc::new(InstantService::new());
    let config = GatekeeperConfig {
        name: "issues".into(),
        server_name: "Issue tracker".into(),
        endpoint: "https://issues.example/mcp".into(),
        trust: ServerTrust::Vetted,
        scope: "mcp:issues".into(),
        reads: Vec::new(),
    };
    let gatekeeper = Arc::new(ToolGatekeeper::new(
        config,
        catalog(),
        service,
        ActionStore::in_memory(clock),
    ));
    overseer.register(gatekeeper.clone()).expect("register");
    let session = gatekeeper
        .grant_all(&overseer, "agent")
        .expect("grant")
        .into_session();
    World { overseer, session }
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
}

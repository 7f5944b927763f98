//! The driver: a [`ToolGatekeeper`] over the issue tracker, with the two things this
//! driver knows that a generic MCP gatekeeper does not.
//!
//! - **Revert of `addLabel`**: remove the label again, but only if the apply is what put it
//!   there (the tracker's reply says `"added": true`). If the label was already on the issue,
//!   removing it would undo someone else's change, so the revert is refused with a reason.
//! - **Simulation of `createIssue`** (off unless switched on with
//!   [`IssuesConfig::simulate`]): a pending `createIssue` appears in `listIssues` reads as a
//!   provisional issue `~<action id>`, so the agent sees its own write and does not file it
//!   twice, and the action is submitted with `await_decision = false`. The provisional id is
//!   *not* the id the tracker will assign (it cannot be known before the write), which is
//!   why it is marked with `~`; after approval, reads show the real `#<id>`.

use std::sync::Arc;

use async_trait::async_trait;
use gatekeeper_core::{
    ActionRecord, ActionState, ActionStore, Content, GatekeeperConfig, Overlay, PendingCall,
    Reverter, ServerTrust, Simulator, ToolGatekeeper, ToolResult, ToolService,
};
use kernel::{GatekeeperError, RevertOutcome};
use serde_json::{Value, json};

use crate::service::IssueTracker;

/// The default gatekeeper name.
pub const NAME: &str = "issues";
/// The default server display name.
pub const SERVER_NAME: &str = "Issue tracker";
/// The default endpoint (display only: the tracker is in-process).
pub const ENDPOINT: &str = "https://issues.example/mcp";

/// Refusal when the label was on the issue before the apply.
pub const LABEL_PREEXISTED_MESSAGE: &str = "The label was already on the issue before this action, so removing it would undo someone else's change. Remove it in the tracker by hand if that is really wanted.";
/// Refusal when the apply's reply does not say whether the label was new.
pub const LABEL_UNKNOWN_MESSAGE: &str = "The tracker's reply did not say whether the label was new, so it cannot be removed safely. Check the issue and remove the label by hand if needed.";

/// How to build the tracker's gatekeeper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuesConfig {
    /// Gatekeeper name (unique per kernel). Default [`NAME`].
    pub name: String,
    /// Server display name. Default [`SERVER_NAME`].
    pub server_name: String,
    /// Endpoint shown in prompts. Default [`ENDPOINT`].
    pub endpoint: String,
    /// Action-kind namespace; `None` means `mcp:<name>`.
    pub scope: Option<String>,
    /// Trust tier. Default [`ServerTrust::Byo`]: nothing auto-applies until an
    /// administrator vouches for the server.
    pub trust: ServerTrust,
    /// Whether pending `createIssue` calls show in `listIssues` reads. Default off.
    pub simulate: bool,
    /// The tools the person lists as reads, whatever the tracker claims. Default none.
    pub reads: Vec<String>,
}

impl Default for IssuesConfig {
    fn default() -> Self {
        Self {
            name: NAME.to_owned(),
            server_name: SERVER_NAME.to_owned(),
            endpoint: ENDPOINT.to_owned(),
            scope: None,
            trust: ServerTrust::Byo,
            simulate: false,
            reads: Vec::new(),
        }
    }
}

impl IssuesConfig {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Another name and display name (for a second tracker in one kernel).
    pub fn named(mut self, name: impl Into<String>, server_name: impl Into<String>) -> Self {
        self.name = name.into();
        self.server_name = server_name.into();
        self
    }

    /// Another trust tier.
    pub fn trust(mut self, trust: ServerTrust) -> Self {
        self.trust = trust;
        self
    }

    /// The person's own list of reads.
    pub fn reads<I: IntoIterator<Item = S>, S: Into<String>>(mut self, reads: I) -> Self {
        self.reads = reads.into_iter().map(Into::into).collect();
        self
    }

    /// Switch the `createIssue` simulation on or off.
    pub fn simulate(mut self, on: bool) -> Self {
        self.simulate = on;
        self
    }

    /// The gatekeeper over `tracker`, with its catalog as the tracker lists it, keeping its
    /// actions in `store`.
    pub async fn build(
        self,
        tracker: Arc<IssueTracker>,
        store: ActionStore,
    ) -> Arc<ToolGatekeeper> {
        let tools = tracker.list_tools().await;
        let scope = self.scope.unwrap_or_else(|| format!("mcp:{}", self.name));
        let config = GatekeeperConfig {
            name: self.name,
            server_name: self.server_name,
            endpoint: self.endpoint,
            trust: self.trust,
            scope,
            reads: self.reads,
        };
        let mut gatekeeper = ToolGatekeeper::new(config, tools, tracker, store)
            .with_reverter(Arc::new(LabelReverter));
        if self.simulate {
            gatekeeper = gatekeeper.with_simulator(Arc::new(CreateIssueSimulator));
        }
        Arc::new(gatekeeper)
    }
}

/// Undoes `addLabel` when the apply added the label.
#[derive(Debug, Clone, Copy, Default)]
pub struct LabelReverter;

#[async_trait]
impl Reverter for LabelReverter {
    fn reverts(&self, tool: &str) -> bool {
        tool == "addLabel"
    }

    async fn revert(
        &self,
        action: &ActionRecord,
        service: &dyn ToolService,
    ) -> Result<RevertOutcome, GatekeeperError> {
        let ActionState::Applied { result } = &action.state else {
            return Ok(RevertOutcome::refused(
                format!(
                    "action {} was not applied, so there is nothing to revert",
                    action.id
                ),
                false,
            ));
        };
        let added = result
            .structured_content
            .as_ref()
            .and_then(|data| data.get("added"))
            .and_then(Value::as_bool);
        match added {
            Some(true) => {}
            Some(false) => return Ok(RevertOutcome::refused(LABEL_PREEXISTED_MESSAGE, false)),
            None => return Ok(RevertOutcome::refused(LABEL_UNKNOWN_MESSAGE, false)),
        }
        let args = json!({
            "issue": action.args.get("issue").cloned().unwrap_or(Value::Null),
            "label": action.args.get("label").cloned().unwrap_or(Value::Null),
        });
        match service.call("removeLabel", &args).await {
            Ok(reply) if reply.is_error => Ok(RevertOutcome::refused(reply.text(), true)),
            Ok(_) => Ok(RevertOutcome::done()),
            Err(error) => Err(GatekeeperError {
                message: error.message().to_owned(),
                retryable: error.retryable(),
                kind: error.failure_kind(),
            }),
        }
    }
}

/// Shows pending `createIssue` calls as provisional issues `~<action id>` in `listIssues`.
#[derive(Debug, Clone, Copy, Default)]
pub struct CreateIssueSimulator;

fn provisional_line(id: &str, title: &str, labels: &[String]) -> String {
    if labels.is_empty() {
        format!("{id} {title} (open, awaiting approval)")
    } else {
        format!(
            "{id} {title} [{}] (open, awaiting approval)",
            labels.join(", ")
        )
    }
}

impl Simulator for CreateIssueSimulator {
    fn simulates(&self, tool: &str) -> bool {
        tool == "createIssue"
    }

    fn overlay(
        &self,
        read: &str,
        args: &Value,
        result: ToolResult,
        pending: &[PendingCall],
    ) -> Overlay {
        let state = args.get("state").and_then(Value::as_str).unwrap_or("open");
        if read != "listIssues" || result.is_error || state == "closed" {
            return Overlay::unchanged(result);
        }
        let mut lines: Vec<String> = match result.text() {
            text if text == "No issues." => Vec::new(),
            text => vec![text],
        };
        let mut issues: Vec<Value> = result
            .structured_content
            .as_ref()
            .and_then(|data| data.get("issues"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut shown = Vec::new();
        for call in pending.iter().filter(|c| &*c.tool == "createIssue") {
            // A call the tracker would refuse creates nothing, so it is not shown.
            let Some(title) = call
                .args
                .get("title")
                .and_then(Value::as_str)
                .filter(|t| !t.trim().is_empty())
            else {
                continue;
            };
            let labels: Vec<String> = call
                .args
                .get("labels")
                .and_then(Value::as_array)
                .map(|ls| {
                    ls.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            let id = format!("~{}", call.id);
            lines.push(provisional_line(&id, title, &labels));
            issues.push(json!({
                "id": id, "title": title, "labels": labels, "state": "open", "provisional": true
            }));
            shown.push(call.id);
        }
        if shown.is_empty() {
            return Overlay::unchanged(result);
        }
        Overlay {
            result: ToolResult {
                content: vec![Content::text(lines.join("\n"))],
                structured_content: Some(json!({ "issues": issues })),
                ..ToolResult::default()
            },
            shown,
        }
    }
}

//! Wiring shared by the lectures: a deterministic kernel, the issue tracker behind its
//! gatekeeper, and how an agent's calls and their answers are printed.
//!
//! This is deployment code, the part of the OS that starts drivers and hands grants to
//! agents. It never decides an action or fakes a result: decisions go through the shell,
//! calls through sessions.

use std::io::Write;
use std::sync::Arc;

use gatekeeper_core::{
    ActionResult, ActionStore, CallOutcome, Session, SessionError, ToolGatekeeper,
};
use gatekeeper_issues::{IssueTracker, IssuesConfig};
use kernel::{Clock, DriverActionId, LedgerStore, MemoryLedger, Overseer, StepClock};
use prompt_sanitize::neutralize_controls;
use serde_json::Value;

use crate::Context;

/// A kernel on a deterministic clock (09:00:00, one second per reading).
pub(crate) struct Desk {
    pub(crate) overseer: Overseer,
    pub(crate) clock: Arc<dyn Clock>,
    /// The same clock, to move it forward ("three hours later").
    pub(crate) time: Arc<StepClock>,
    /// The kernel's storage, kept so a "restarted" kernel can be opened over it.
    pub(crate) ledger: Arc<dyn LedgerStore>,
}

impl Desk {
    pub(crate) fn new() -> Self {
        let time = Arc::new(StepClock::default());
        let clock: Arc<dyn Clock> = time.clone();
        let ledger: Arc<dyn LedgerStore> = Arc::new(MemoryLedger::new());
        Self {
            overseer: Overseer::with_store(ledger.clone(), clock.clone()),
            clock,
            time,
            ledger,
        }
    }

    /// Builds the tracker's gatekeeper from `config` over a fresh action store, and
    /// registers it with the kernel.
    pub(crate) async fn tracker(
        &self,
        config: IssuesConfig,
        tracker: Arc<IssueTracker>,
    ) -> anyhow::Result<Arc<ToolGatekeeper>> {
        let gatekeeper = config
            .build(tracker, ActionStore::in_memory(self.clock.clone()))
            .await;
        self.overseer.register(gatekeeper.clone())?;
        Ok(gatekeeper)
    }
}

/// Compact JSON, as the agent wrote it, with control and invisible characters made
/// visible (the transcript is a terminal too).
pub(crate) fn json(value: &Value) -> String {
    let raw = serde_json::to_string(value).unwrap_or_else(|_| "(unprintable)".to_owned());
    visible(&raw)
}

/// Text from a service or an agent, with control and invisible characters made visible.
pub(crate) fn visible(text: &str) -> String {
    neutralize_controls(text).into_string()
}

/// Writes `text` indented by `indent`, continuing lines aligned under the first.
fn indented(cx: &mut Context<'_>, lead: &str, text: &str) -> std::io::Result<()> {
    let text = visible(text);
    let pad = " ".repeat(lead.chars().count());
    for (n, line) in text.lines().enumerate() {
        if n == 0 {
            writeln!(cx, "{lead}{line}")?;
        } else {
            writeln!(cx, "{pad}{line}")?;
        }
    }
    Ok(())
}

/// The agent calls `tool` through `session`; the call and its answer are printed.
pub(crate) async fn call(
    cx: &mut Context<'_>,
    session: &Session,
    tool: &str,
    args: Value,
) -> Result<CallOutcome, SessionError> {
    writeln!(cx, "  agent → {tool} {}", json(&args)).ok();
    let outcome = session.call_tool(tool, args).await;
    match &outcome {
        Ok(CallOutcome::Data {
            result,
            observation,
        }) => {
            indented(
                cx,
                &format!("    data, observation {observation}: "),
                &result.text(),
            )
            .ok();
        }
        Ok(CallOutcome::Pending {
            action,
            ledger,
            message,
        }) => {
            writeln!(cx, "    pending: action {action}, ledger {ledger}").ok();
            writeln!(cx, "    agent is told: {}", visible(message)).ok();
        }
        Err(error) => {
            writeln!(cx, "    refused: {}", visible(&error.to_string())).ok();
        }
    }
    outcome
}

/// The agent asks where a staged call is; the answer is printed.
pub(crate) async fn poll(
    cx: &mut Context<'_>,
    session: &Session,
    action: DriverActionId,
) -> Result<ActionResult, SessionError> {
    let result = session.get_action_result(action).await;
    match &result {
        Ok(ActionResult::Applied {
            result,
            observation,
        }) => {
            indented(
                cx,
                &format!(
                    "  agent ← get_action_result({action}): applied, observation {observation}: "
                ),
                &result.text(),
            )
            .ok();
        }
        Ok(other) => {
            writeln!(
                cx,
                "  agent ← get_action_result({action}): {}: {}",
                other.status(),
                visible(other.message().unwrap_or(""))
            )
            .ok();
        }
        Err(error) => {
            writeln!(
                cx,
                "  agent ← get_action_result({action}): error: {}",
                visible(&error.to_string())
            )
            .ok();
        }
    }
    result
}

/// The tracker's issues as evidence: `[#1 Login fails, #2 ...]` by id.
pub(crate) fn issue_ids(tracker: &IssueTracker) -> String {
    let ids: Vec<String> = tracker
        .issues()
        .iter()
        .map(|i| format!("#{}", i.id))
        .collect();
    format!("[{}]", ids.join(", "))
}

/// Prints the tracker's issues as evidence, one per line.
pub(crate) fn show_issues(cx: &mut Context<'_>, tracker: &IssueTracker) -> std::io::Result<()> {
    writeln!(cx, "  the tracker's issues (read directly, as evidence):")?;
    let issues = tracker.issues();
    if issues.is_empty() {
        writeln!(cx, "    (none)")?;
    }
    for issue in issues {
        writeln!(cx, "    {}", issue.line())?;
    }
    Ok(())
}

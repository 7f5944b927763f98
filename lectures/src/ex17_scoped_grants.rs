//! ex17: a grant between one call and forever, and an edit before approval.
//!
//! Before, a person could approve one call as the agent wrote it, or enable a rule for a
//! tool's every call until removed. This lecture shows what lies between, on a small MCP
//! server in this process (two tools: `tag_note`, safe to repeat, and `write_note`),
//! reached with the gate's own driver on the vetted tier:
//!
//! - a rule scoped to one agent and one hour (`gate rules add notes__tag_note --agent coder
//!   --for 1h`): the other agent's call waits, and two hours later so does this one's;
//! - a rule narrowed by an argument (`gate rules add notes__tag_note --under
//!   path=/notes/team`): a path inside is applied, one beside it or escaping it with `..`
//!   waits, and `gate rules test` says why part by part;
//! - an edited approval (`gate approve --edit`): an edit that breaks the tool's schema is
//!   refused and nothing is sent; the fixed one is what the server receives, and the
//!   ledger keeps the agent's call beside what changed.

use std::io::Write;
use std::sync::{Arc, Mutex};

use gatekeeper_core::edit::EditError;
use gatekeeper_core::narrow::verdicts;
use gatekeeper_core::{CallOutcome, Grants, ServerTrust, Session, ToolGatekeeper};
use gatekeeper_mcp::{Endpoint, HttpEndpoint, McpServer, McpServerConfig};
use kernel::{ArgumentCheck, ArgumentTest, LedgerId, RuleScope, Timestamp};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, ServerConfig,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler};
use serde_json::{Value, json};

use crate::setup::{Desk, call, paragraph, poll, visible};
use crate::{Context, Lecture, LectureFuture};

/// The lecture.
pub const LECTURE: Lecture = Lecture {
    name: "ex17",
    title: "grants a person can scope, and an edit before approval",
    summary: "a rule for one agent and one hour, a rule narrowed to a path, and an edited call that is what gets sent",
    run,
};

fn run<'a>(cx: &'a mut Context<'_>) -> LectureFuture<'a> {
    Box::pin(body(cx))
}

/// One hour, in milliseconds.
const HOUR: u64 = 3_600_000;

/// The lecture's server: `tag_note` (safe to repeat) and `write_note`; it keeps every call
/// it receives, as the service would see them.
#[derive(Clone, Default)]
struct Notes {
    received: Arc<Mutex<Vec<String>>>,
}

impl ServerHandler for Notes {
    fn get_info(&self) -> ServerConfig {
        crate::setup::tools_only()
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let path = json!({"type": "string", "description": "The note's path."});
        crate::setup::tools_listed(json!([
            {
                "name": "tag_note",
                "description": "Tag a note; tagging twice is the same as once.",
                "inputSchema": {"type": "object", "properties": {"path": path, "tag": {"type": "string"}},
                    "required": ["path", "tag"]},
                "annotations": {"readOnlyHint": false, "destructiveHint": false, "idempotentHint": true}
            },
            {
                "name": "write_note",
                "description": "Write a note's text.",
                "inputSchema": {"type": "object", "properties": {"path": path, "text": {"type": "string"}},
                    "required": ["path", "text"]},
                "annotations": {"readOnlyHint": false, "destructiveHint": false}
            }
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = Value::Object(request.arguments.unwrap_or_default());
        let line = format!("{} {args}", request.name);
        self.received
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(line.clone());
        Ok(CallToolResult::success(vec![ContentBlock::text(format!("done: {line}"))]).into())
    }
}

/// The gate's driver for the server, on the vetted tier, and its gatekeeper on `desk`.
async fn gatekeeper(desk: &Desk, url: &str) -> anyhow::Result<Arc<ToolGatekeeper>> {
    let endpoint = Endpoint::Http(HttpEndpoint {
        url: url.to_owned(),
        headers: Vec::new(),
        ca_file: None,
        oauth: None,
    });
    let driver =
        McpServer::connect(McpServerConfig::new("notes", endpoint).trust(ServerTrust::Vetted))
            .await?;
    let gatekeeper = Arc::new(driver.gatekeeper(desk.action_store("notes").await?));
    desk.overseer.register(gatekeeper.clone())?;
    Ok(gatekeeper)
}

/// The ledger id and driver id of a staged call, or an error when it was not staged.
fn staged(outcome: &CallOutcome) -> anyhow::Result<(LedgerId, kernel::DriverActionId)> {
    match outcome {
        CallOutcome::Pending { ledger, action, .. } => Ok((*ledger, *action)),
        CallOutcome::Data { .. } => anyhow::bail!("the call was a read"),
    }
}

/// A call, then what the ledger says of it once the drains settled.
async fn call_and_settle(
    cx: &mut Context<'_>,
    desk: &Desk,
    session: &Session,
    args: Value,
) -> anyhow::Result<(LedgerId, kernel::DriverActionId)> {
    let outcome = call(cx, session, "tag_note", args).await?;
    let ids = staged(&outcome)?;
    desk.overseer.settle().await;
    let state = desk
        .overseer
        .entry(ids.0)?
        .and_then(|e| e.action().map(|a| a.state))
        .ok_or_else(|| anyhow::anyhow!("no action {}", ids.0))?;
    writeln!(cx, "    the ledger: {} is {}", ids.0, state.as_str())?;
    Ok(ids)
}

async fn body(cx: &mut Context<'_>) -> anyhow::Result<()> {
    paragraph(
        cx,
        &[
            "A rule has two keys: the server marks a tool safe to repeat (on a vetted server), and a",
            "person enables the rule. Until now the person's key opened every call of the tool, by any",
            "agent, until removed. A scope narrows it: whose calls, until when, which arguments. And a",
            "person who would approve a call but for one argument can fix the argument instead of",
            "rejecting the call and waiting for the agent to try again.",
        ],
    )?;
    let notes = Notes::default();
    let url = crate::setup::serve_mcp(notes.clone()).await?;
    let desk = Desk::new(cx)?;
    let gk = gatekeeper(&desk, &url).await?;
    let tools = ["tag_note", "write_note"];
    let mut coder = Grants::new();
    coder.introduce("NOTES", gk.grant(&desk.overseer, "coder", &tools)?);
    let mut helper = Grants::new();
    helper.introduce("NOTES", gk.grant(&desk.overseer, "helper", &tools)?);
    let kind = gk
        .action_kind("tag_note")
        .ok_or_else(|| anyhow::anyhow!("the server lists tag_note"))?;

    cx.section("A rule for one agent, for one hour")?;
    let scope = RuleScope {
        caller: Some("coder".to_owned()),
        until: Some(Timestamp(desk.clock.now().0 + HOUR)),
        ..RuleScope::default()
    };
    writeln!(
        cx,
        "  person: gate rules add notes__tag_note --agent coder --for 1h"
    )?;
    desk.overseer
        .enable_scoped_rule("notes", kind.clone(), "alice", scope)?;
    let rule = desk.overseer.rules()?.remove(0);
    writeln!(cx, "  the rule reaches: {}", rule.scope)?;
    let coder_session = coder.session("NOTES")?;
    let helper_session = helper.session("NOTES")?;
    writeln!(cx, "  coder, within the hour:")?;
    call_and_settle(
        cx,
        &desk,
        coder_session,
        json!({"path": "/notes/a.md", "tag": "draft"}),
    )
    .await?;
    writeln!(cx, "  helper, within the hour:")?;
    let (others, _) = call_and_settle(
        cx,
        &desk,
        helper_session,
        json!({"path": "/notes/a.md", "tag": "draft"}),
    )
    .await?;
    writeln!(cx, "  coder, two hours later:")?;
    desk.time.advance(2 * HOUR);
    let (late, _) = call_and_settle(
        cx,
        &desk,
        coder_session,
        json!({"path": "/notes/b.md", "tag": "draft"}),
    )
    .await?;
    cx.evidence(
        "calls the server received",
        notes.received.lock().map(|r| r.len()).unwrap_or(0),
    )?;
    // A call waiting for a person holds back the later ones of its server (the drain keeps
    // the order, ex05): the person clears both before the next rule.
    writeln!(cx, "  person: gate reject {} {}", others.0, late.0)?;
    desk.overseer.reject(others, "alice").await?;
    desk.overseer.reject(late, "alice").await?;

    cx.section("A rule narrowed by an argument")?;
    let tests = vec![ArgumentTest {
        argument: "path".to_owned(),
        check: ArgumentCheck::Under("/notes/team".to_owned()),
    }];
    writeln!(
        cx,
        "  person: gate rules add notes__tag_note --under path=/notes/team"
    )?;
    desk.overseer.enable_scoped_rule(
        "notes",
        kind,
        "alice",
        RuleScope {
            arguments: tests.clone(),
            ..RuleScope::default()
        },
    )?;
    let rule = desk.overseer.rules()?.remove(0);
    writeln!(cx, "  the rule reaches: {}", rule.scope)?;
    let mut held = Vec::new();
    for path in [
        "/notes/team/plan.md",
        "/notes/teamwork.md",
        "/notes/team/../secret.md",
    ] {
        let (ledger, action) = call_and_settle(
            cx,
            &desk,
            coder_session,
            json!({"path": path, "tag": "team"}),
        )
        .await?;
        held.push((ledger, action, path));
    }
    writeln!(cx, "  person: gate rules test ID, for each")?;
    for (ledger, action, _) in &held {
        let record = gk
            .store()
            .get(*action)
            .await?
            .ok_or_else(|| anyhow::anyhow!("the store keeps {action}"))?;
        for verdict in verdicts(&record.args, &tests) {
            writeln!(
                cx,
                "    {ledger}: {} {}: {}",
                if verdict.passed { "yes" } else { "no " },
                verdict.test,
                verdict.because
            )?;
        }
    }
    let sent = notes.received.lock().map(|r| r.clone()).unwrap_or_default();
    cx.evidence("tag_note calls the server received", sent.len())?;
    writeln!(cx, "  person: gate reject {} {}", held[1].0.0, held[2].0.0)?;
    for (ledger, _, _) in &held[1..] {
        desk.overseer.reject(*ledger, "alice").await?;
    }

    cx.section("An edited approval")?;
    let outcome = call(
        cx,
        coder_session,
        "write_note",
        json!({"path": "/notes/team/plan.md", "text": "ship on fridya"}),
    )
    .await?;
    let (ledger, action) = staged(&outcome)?;
    writeln!(
        cx,
        "  person: gate approve {} --edit, and writes {{\"path\": 7, \"text\": \"ship on Friday\"}}",
        ledger.0
    )?;
    let refused = desk
        .overseer
        .approve_prepared(
            ledger,
            "alice",
            edit(&gk, action, json!({"path": 7, "text": "ship on Friday"})),
        )
        .await;
    if let Err(error) = refused {
        writeln!(cx, "    refused: {}", visible(&error.to_string()))?;
    }
    writeln!(
        cx,
        "  person: edits again, to {{\"path\": \"/notes/team/plan.md\", \"text\": \"ship on Friday\"}}"
    )?;
    desk.overseer
        .approve_prepared(
            ledger,
            "alice",
            edit(
                &gk,
                action,
                json!({"path": "/notes/team/plan.md", "text": "ship on Friday"}),
            ),
        )
        .await?;
    let entry = desk
        .overseer
        .entry(ledger)?
        .ok_or_else(|| anyhow::anyhow!("no entry {ledger}"))?;
    let recorded = entry.action().ok_or_else(|| anyhow::anyhow!("an action"))?;
    let cause = recorded
        .resolution
        .as_ref()
        .and_then(|r| r.cause.clone())
        .unwrap_or_default();
    writeln!(cx, "  the ledger's approval: {}", visible(&cause))?;
    let prompt_kept = recorded.description.description.contains("fridya");
    writeln!(
        cx,
        "  the ledger's prompt still shows the agent's call: {}",
        if prompt_kept { "yes" } else { "no" }
    )?;
    poll(cx, coder_session, action).await?;
    let last = notes
        .received
        .lock()
        .map(|r| r.last().cloned().unwrap_or_default())
        .unwrap_or_default();
    cx.evidence("what the server received last", last)?;
    Ok(())
}

/// The person's edit of `action`, made while they hold the decision: its note, or why
/// the edit (and the approval) is refused.
async fn edit(
    gk: &ToolGatekeeper,
    action: kernel::DriverActionId,
    args: Value,
) -> Result<Option<String>, String> {
    match gk.amend(action, args).await {
        Ok(edit) => Ok(Some(edit.note("alice"))),
        Err(EditError::Unchanged) => Ok(None),
        Err(error) => Err(error.to_string()),
    }
}

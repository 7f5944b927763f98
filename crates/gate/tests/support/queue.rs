//! Open actions built the way the gate's MCP driver builds them (gatekeeper-core's prompt,
//! classifier and kinds), for the review screen's tests and benchmark (included in both with
//! `#[path]`).

#![allow(dead_code)]

use std::sync::Arc;

use gatekeeper_core::{ServerTrust, Tool, action_kind_for, classify_tool, describe_call};
use kernel::{
    ActionDescription, ActionEntry, ActionState, DriverActionId, EntryBody, LedgerEntry, LedgerId,
    Timestamp,
};
use serde_json::{Value, json};

/// What one staged call is.
pub struct Call<'a> {
    /// Ledger id.
    pub id: u64,
    /// The agent.
    pub agent: &'a str,
    /// The server (and gatekeeper) name.
    pub server: &'a str,
    /// The tool's definition, as the server lists it.
    pub tool: Value,
    /// The agent's arguments.
    pub args: Value,
    /// Whether the server is vetted (only then can a tool be auto-approvable).
    pub vetted: bool,
}

/// A tool that writes, as a byo server lists it.
pub fn write_tool(name: &str, description: &str) -> Value {
    json!({"name": name, "description": description})
}

/// A tool that declares itself non-destructive and idempotent (auto-approvable on a vetted
/// server).
pub fn safe_tool(name: &str, description: &str) -> Value {
    json!({
        "name": name,
        "description": description,
        "annotations": {"readOnlyHint": false, "destructiveHint": false, "idempotentHint": true}
    })
}

/// The pending ledger entry of `call`, staged at a fixed time a minute per id after 09:00.
pub fn pending(call: Call<'_>) -> LedgerEntry {
    let tool = Tool::from_json(call.tool).expect("a valid tool");
    let trust = if call.vetted {
        ServerTrust::Vetted
    } else {
        ServerTrust::Byo
    };
    let classified = classify_tool(&tool, trust);
    let (title, description) = describe_call(
        call.server,
        &format!("stdio: {}-server", call.server),
        &tool,
        &call.args,
        &classified,
    );
    let mut described = ActionDescription::new(title.into_string(), description.into_string());
    described.auto_approvable = classified.auto_approvable();
    described.action_kind = Some(action_kind_for(&format!("mcp:{}", call.server), &tool.name));
    LedgerEntry {
        id: LedgerId(call.id),
        gatekeeper: call.server.into(),
        caller: call.agent.into(),
        created_at: Timestamp(9 * 3_600_000 + call.id * 60_000),
        body: EntryBody::Action(ActionEntry {
            driver_id: DriverActionId(call.id),
            description: Arc::new(described),
            state: ActionState::Pending,
            resolution: None,
            failure: None,
            depends_on: Vec::new(),
            blocked_by: None,
            restart_requested: false,
            revert: None,
        }),
    }
}

/// An ordinary call of `tool` by `agent` on `server`.
pub fn simple(id: u64, agent: &str, server: &str, tool: &str) -> LedgerEntry {
    pending(Call {
        id,
        agent,
        server,
        tool: write_tool(tool, "Writes a note."),
        args: json!({"text": format!("note {id}")}),
        vetted: false,
    })
}

/// `n` pending calls spread over 3 agents, 4 servers and 3 tools.
pub fn many(n: u64) -> Vec<LedgerEntry> {
    let agents = ["coder", "researcher", "ops"];
    let servers = ["notes", "issues", "wiki", "mail"];
    let tools = ["write_note", "tag_note", "close_issue"];
    (1..=n)
        .map(|id| {
            let i = id as usize;
            simple(
                id,
                agents[i % agents.len()],
                servers[(i / 3) % servers.len()],
                tools[(i / 12) % tools.len()],
            )
        })
        .collect()
}

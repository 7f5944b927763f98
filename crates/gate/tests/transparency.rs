//! What crosses the gate untouched: one test per promise of the README's table "What
//! crosses the gate", each showing a message or a field reaching the agent as the
//! downstream server sent it (or, where the gate owns a part, with only that part
//! changed). A real `gate serve` in front of the fixture MCP server, a real MCP client as
//! the agent.
//!
//! The stdio bridge's own promises (results of both protocol eras relayed unchanged) are in
//! `bridge.rs`.

#[path = "support/daemon.rs"]
mod daemon;
#[path = "support/fixture.rs"]
mod fixture;

use rmcp::model::Tool;
use serde_json::{Value, json};

use daemon::{CODER_TOKEN, Gate, action_id, call, text};

/// The fixture's answer to `rich_read` and `rich_write` (see `mcp-fixture`'s
/// `rich_result`), written out again here so that a change on either side shows.
fn rich_blocks() -> Value {
    json!([
        {"type": "text", "text": "every block", "annotations": {"audience": ["assistant"], "priority": 0.25}},
        {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png", "annotations": {"audience": ["user"]}},
        {"type": "audio", "data": "UklGRiYAAAA=", "mimeType": "audio/wav", "_meta": {"fixture/clip": 1}},
        {"type": "resource_link", "uri": "fixture://notes/1", "name": "note 1", "mimeType": "text/plain", "description": "the first note"},
        {"type": "resource", "resource": {"uri": "fixture://notes/2", "mimeType": "text/plain", "text": "the second note"}, "annotations": {"priority": 1.0}}
    ])
}

fn rich_gate(name: &str) -> Gate {
    Gate::start_with_env(name, "byo", &[("MCP_FIXTURE_RICH", "1")])
}

async fn listed(gate: &Gate) -> Vec<Tool> {
    let agent = gate.agent(CODER_TOKEN).await;
    agent.list_all_tools().await.expect("tools listed")
}

#[tokio::test]
async fn a_listed_tool_keeps_its_title_icons_and_meta_under_the_gates_name() {
    let gate = rich_gate("listing");
    let tools = listed(&gate).await;
    let rich = tools
        .iter()
        .find(|t| t.name == "fixture__rich_read")
        .expect("the rich read is listed");
    let shown = serde_json::to_value(rich).expect("serialises");
    assert_eq!(shown["title"], "Rich read");
    assert_eq!(
        shown["icons"],
        json!([{"src": "data:image/png;base64,iVBORw0KGgo=", "mimeType": "image/png"}])
    );
    assert_eq!(shown["_meta"], json!({"fixture/kind": "rich"}));
    assert_eq!(shown["annotations"], json!({"readOnlyHint": true}));
}

#[tokio::test]
async fn every_content_block_of_a_read_crosses_with_its_annotations_structured_content_and_meta() {
    let gate = rich_gate("read-blocks");
    let agent = gate.agent(CODER_TOKEN).await;
    let result = call(agent.peer(), "fixture__rich_read", json!({})).await;
    let shown = serde_json::to_value(&result).expect("serialises");
    assert_eq!(shown["content"], rich_blocks());
    assert_eq!(shown["structuredContent"], json!({"blocks": 5}));
    assert_eq!(shown["_meta"], json!({"fixture/trace": "t-42"}));
    assert_eq!(result.is_error, Some(false));
}

#[tokio::test]
async fn an_applied_writes_outcome_carries_every_block_after_the_gates_own_line() {
    let gate = rich_gate("write-blocks");
    let agent = gate.agent(CODER_TOKEN).await;
    let staged = text(&call(agent.peer(), "fixture__rich_write", json!({})).await);
    let id = action_id(&staged);
    let approve = gate.person(&["approve", &id.to_string()]);
    assert!(approve.status.success(), "{approve:?}");
    let outcome = call(agent.peer(), "gate_action_result", json!({"action_id": id})).await;
    let shown = serde_json::to_value(&outcome).expect("serialises");
    let content = shown["content"].as_array().expect("blocks");
    assert_eq!(
        content[0]["text"],
        format!("Action {id} was approved and sent; the server answered:")
    );
    assert_eq!(Value::Array(content[1..].to_vec()), rich_blocks());
    assert_eq!(shown["structuredContent"], json!({"blocks": 5}));
}

#[tokio::test]
async fn a_tool_that_runs_only_as_a_task_is_not_offered_and_gate_catalog_says_why() {
    let gate = rich_gate("task-only");
    let tools = listed(&gate).await;
    assert!(
        tools.iter().all(|t| t.name != "fixture__task_only"),
        "a tool the gate cannot run as it asks is not offered"
    );
    assert!(tools.iter().any(|t| t.name == "fixture__rich_write"));
    let catalog = gate.person(&["catalog"]);
    let said = String::from_utf8_lossy(&catalog.stdout);
    assert!(
        said.contains("`task_only` is not offered to agents: it runs only as a task (execution.taskSupport = \"required\")"),
        "{said}"
    );
}

#[tokio::test]
async fn a_json_rpc_error_answer_is_reported_as_refused_never_as_applied() {
    let gate = rich_gate("refused");
    let agent = gate.agent(CODER_TOKEN).await;
    let staged = text(&call(agent.peer(), "fixture__refuse_write", json!({})).await);
    let id = action_id(&staged);
    let approve = gate.person(&["approve", &id.to_string()]);
    let said = String::from_utf8_lossy(&approve.stdout);
    assert!(!approve.status.success(), "a refused send is not a success");
    assert!(!said.contains("applied"), "{said}");
    assert!(said.contains("refuse_write refuses every call"), "{said}");
    let outcome = text(&call(agent.peer(), "gate_action_result", json!({"action_id": id})).await);
    assert!(
        outcome.starts_with(&format!(
            "Action {id} was approved and sent, and the server refused it:"
        )),
        "{outcome}"
    );
    assert!(outcome.ends_with("It will not be sent again."), "{outcome}");
    assert_eq!(gate.deliveries().len(), 1, "sent once, never again");
}

#[tokio::test]
async fn a_catalog_of_45_pages_lists_45_tools() {
    let gate = Gate::start_with_env("paged", "byo", &[("MCP_FIXTURE_PAGES", "45")]);
    let tools = listed(&gate).await;
    let paged: Vec<&str> = tools
        .iter()
        .map(|t| t.name.as_ref())
        .filter(|name| name.starts_with("fixture__paged_"))
        .collect();
    assert_eq!(paged.len(), 45, "{paged:?}");
    assert!(paged.contains(&"fixture__paged_1") && paged.contains(&"fixture__paged_45"));
}

#[tokio::test]
async fn a_catalog_longer_than_its_cap_is_refused_whole_with_the_setting_to_change() {
    let gate = Gate::start_with_env("capped", "byo", &[("MCP_FIXTURE_PAGES", "45")]);
    let said = gate.refused_start(|text| {
        text.replace("trust = \"byo\"", "trust = \"byo\"\nmax_catalog_pages = 10")
    });
    assert!(
        said.contains("goes on past 10 pages (10 tools so far)")
            && said.contains("raise max_catalog_pages"),
        "{said}"
    );
}

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

use std::sync::{Arc, Mutex};

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientRequest, ProgressNotificationParam, Tool,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, RoleClient, ServiceExt as _};
use serde_json::{Value, json};

use daemon::{CODER_TOKEN, Gate, action_id, call, eventually, text};

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

/// An agent that keeps every progress notification it is sent.
#[derive(Clone, Default)]
struct Listener(Arc<Mutex<Vec<ProgressNotificationParam>>>);

impl Listener {
    fn notes(&self) -> Vec<ProgressNotificationParam> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl ClientHandler for Listener {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(params);
    }
}

async fn listening_agent(gate: &Gate) -> (Listener, RunningService<RoleClient, Listener>) {
    let listener = Listener::default();
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(gate.url.as_str()).auth_header(CODER_TOKEN),
    );
    let running = listener.clone().serve(transport).await.expect("connected");
    (listener, running)
}

fn call_request(tool: &str) -> ClientRequest {
    ClientRequest::CallToolRequest(CallToolRequest::new(
        CallToolRequestParams::new(tool.to_owned()).with_arguments(Default::default()),
    ))
}

#[tokio::test]
async fn progress_of_a_read_reaches_the_agent_under_its_own_token() {
    let gate = rich_gate("progress");
    let (listener, agent) = listening_agent(&gate).await;
    let handle = agent
        .peer()
        .send_request_with_option(
            call_request("fixture__progress_read"),
            PeerRequestOptions::no_options(),
        )
        .await
        .expect("sent");
    let token = handle.progress_token.clone();
    let answer = handle.await_response().await.expect("answered");
    let answer = serde_json::to_value(&answer).expect("serialises");
    assert_eq!(answer["content"][0]["text"], "three steps done");
    eventually("three progress notes reach the agent", || {
        listener.notes().len() >= 3
    })
    .await;
    let notes = listener.notes();
    assert_eq!(notes.len(), 3, "{notes:?}");
    for (step, note) in (1..=3).zip(&notes) {
        assert_eq!(note.progress_token, token, "the agent's own token");
        assert_eq!(note.progress, f64::from(step));
        assert_eq!(note.total, Some(3.0));
        assert_eq!(
            note.message.as_deref(),
            Some(format!("step {step} of 3").as_str())
        );
    }
}

#[tokio::test]
async fn a_read_the_agent_cancels_is_cancelled_on_the_server() {
    let gate = rich_gate("cancel");
    let (_listener, agent) = listening_agent(&gate).await;
    let handle = agent
        .peer()
        .send_request_with_option(
            call_request("fixture__slow_read"),
            PeerRequestOptions::no_options(),
        )
        .await
        .expect("sent");
    // The read is in flight on the server before the agent gives up on it.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    handle
        .cancel(Some("the agent changed its mind".to_owned()))
        .await
        .expect("cancellation sent");
    eventually("the server hears of the cancellation", || {
        gate.deliveries()
            .iter()
            .any(|line| line.starts_with("notifications/cancelled "))
    })
    .await;
    let writes: Vec<String> = gate
        .deliveries()
        .into_iter()
        .filter(|line| !line.starts_with("notifications/cancelled "))
        .collect();
    assert!(writes.is_empty(), "a read sends no write: {writes:?}");
}

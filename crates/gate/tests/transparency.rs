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
    ArgumentInfo, CallToolRequest, CallToolRequestParams, ClientRequest, CompleteRequestParams,
    GetPromptRequestParams, ProgressNotificationParam, ReadResourceRequestParams, Reference,
    ResourceUpdatedNotificationParam, SubscribeRequestParams, Tool, UnsubscribeRequestParams,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, RoleClient, ServiceExt as _};
use serde_json::{Value, json};

use daemon::{CODER_TOKEN, Gate, IDLE_TOKEN, action_id, call, eventually, text};

/// The fixture's answer to `rich_read` and `rich_write` (see `mcp-fixture`'s
/// `rich_result`), written out again here so that a change on either side shows, as the
/// agent gets it: the same blocks, the resources' addresses the gate's
/// (`gate://fixture/<the server's own>`), so the agent can read them through the gate.
fn rich_blocks() -> Value {
    json!([
        {"type": "text", "text": "every block", "annotations": {"audience": ["assistant"], "priority": 0.25}},
        {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png", "annotations": {"audience": ["user"]}},
        {"type": "audio", "data": "UklGRiYAAAA=", "mimeType": "audio/wav", "_meta": {"fixture/clip": 1}},
        {"type": "resource_link", "uri": "gate://fixture/fixture://notes/1", "name": "note 1", "mimeType": "text/plain", "description": "the first note"},
        {"type": "resource", "resource": {"uri": "gate://fixture/fixture://notes/2", "mimeType": "text/plain", "text": "the second note"}, "annotations": {"priority": 1.0}}
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

/// An agent that keeps every progress notification and resource update it is sent.
#[derive(Clone, Default)]
struct Listener {
    progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
    updated: Arc<Mutex<Vec<String>>>,
    logged: Arc<Mutex<Vec<Value>>>,
}

impl Listener {
    fn notes(&self) -> Vec<ProgressNotificationParam> {
        self.progress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn updated(&self) -> Vec<String> {
        self.updated
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Every log message heard, as JSON.
    fn logged(&self) -> Vec<Value> {
        self.logged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl ClientHandler for Listener {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(params);
    }

    #[allow(deprecated)]
    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.logged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(serde_json::to_value(params).expect("serialises"));
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.updated
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(params.uri);
    }
}

async fn listening_agent(gate: &Gate) -> (Listener, RunningService<RoleClient, Listener>) {
    listening_as(gate, CODER_TOKEN).await
}

async fn listening_as(
    gate: &Gate,
    token: &str,
) -> (Listener, RunningService<RoleClient, Listener>) {
    let listener = Listener::default();
    let transport = StreamableHttpClientTransport::with_client(
        gatekeeper_mcp::tls::client(None).expect("an HTTP client"),
        StreamableHttpClientTransportConfig::with_uri(gate.url.as_str()).auth_header(token),
    );
    let running = listener.clone().serve(transport).await.expect("connected");
    (listener, running)
}

/// Start a call of `tool` (no arguments) as `agent`, keeping the handle: its progress
/// token, its answer, its cancellation.
async fn start_call(
    agent: &RunningService<RoleClient, Listener>,
    tool: &str,
) -> rmcp::service::RequestHandle<RoleClient> {
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(
        CallToolRequestParams::new(tool.to_owned()).with_arguments(Default::default()),
    ));
    agent
        .peer()
        .send_request_with_option(request, PeerRequestOptions::no_options())
        .await
        .expect("sent")
}

#[tokio::test]
async fn progress_of_a_read_reaches_the_agent_under_its_own_token() {
    let gate = rich_gate("progress");
    let (listener, agent) = listening_agent(&gate).await;
    let handle = start_call(&agent, "fixture__progress_read").await;
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
    let handle = start_call(&agent, "fixture__slow_read").await;
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

#[tokio::test]
async fn a_servers_resources_and_templates_are_listed_under_the_gates_addresses() {
    let gate = rich_gate("resources-listed");
    let agent = gate.agent(CODER_TOKEN).await;
    let resources = agent.peer().list_all_resources().await.expect("listed");
    let resources = serde_json::to_value(&resources).expect("serialises");
    assert_eq!(
        resources,
        json!([
            {"uri": "gate://fixture/fixture://notes/1", "name": "note 1", "mimeType": "text/plain", "annotations": {"priority": 0.5}},
            {"uri": "gate://fixture/fixture://notes/2", "name": "note 2", "mimeType": "text/plain"}
        ])
    );
    let templates = agent
        .peer()
        .list_all_resource_templates()
        .await
        .expect("listed");
    let templates = serde_json::to_value(&templates).expect("serialises");
    assert_eq!(
        templates,
        json!([{"uriTemplate": "gate://fixture/fixture://notes/{id}", "name": "a note by number", "mimeType": "text/plain"}])
    );
    // An agent with no grant on the server sees none of it.
    let idle = gate.agent(IDLE_TOKEN).await;
    assert!(
        idle.peer()
            .list_all_resources()
            .await
            .expect("listed")
            .is_empty()
    );
}

#[tokio::test]
async fn a_resource_read_through_the_gate_is_the_servers_answer_and_only_for_its_grantees() {
    let gate = rich_gate("resource-read");
    let agent = gate.agent(CODER_TOKEN).await;
    // Filled in from the template, as an agent would.
    let uri = "gate://fixture/fixture://notes/7";
    let read = agent
        .peer()
        .read_resource(ReadResourceRequestParams::new(uri))
        .await
        .expect("read");
    assert_eq!(
        serde_json::to_value(&read).expect("serialises")["contents"],
        json!([{"uri": uri, "mimeType": "text/plain", "text": "note 7", "_meta": {"fixture/read": true}}])
    );
    let idle = gate.agent(IDLE_TOKEN).await;
    let refused = idle
        .peer()
        .read_resource(ReadResourceRequestParams::new(uri))
        .await;
    assert!(refused.is_err(), "an agent without a grant reads nothing");
    let ledger = gate.person(&["ledger"]);
    let said = String::from_utf8_lossy(&ledger.stdout);
    assert!(
        said.contains("gate://fixture/fixture://notes/7"),
        "the read is an observation in the ledger: {said}"
    );
}

#[tokio::test]
async fn a_sensitive_servers_resource_read_locks_the_reader_down() {
    let mut gate = rich_gate("resource-sensitive");
    gate.reconfigure(|text| {
        text.replace(
            "trust = \"byo\"",
            "trust = \"byo\"\nsensitive_resources = true",
        )
    });
    let agent = gate.agent(CODER_TOKEN).await;
    agent
        .peer()
        .read_resource(ReadResourceRequestParams::new(
            "gate://fixture/fixture://notes/1",
        ))
        .await
        .expect("read");
    let refused = text(&call(agent.peer(), "fixture__write_note", json!({"text": "leak"})).await);
    assert!(
        refused.starts_with("Your workspace is locked down because"),
        "{refused}"
    );
    assert!(gate.deliveries().is_empty(), "nothing was sent");
}

#[tokio::test]
async fn a_subscribed_resource_tells_the_agent_of_each_change_until_it_unsubscribes() {
    let gate = rich_gate("resource-subscribe");
    let (listener, agent) = listening_agent(&gate).await;
    let uri = "gate://fixture/fixture://notes/1";
    #[allow(deprecated)]
    agent
        .peer()
        .subscribe(SubscribeRequestParams::new(uri))
        .await
        .expect("subscribed");
    assert_eq!(
        gate.deliveries(),
        ["resources/subscribe \"fixture://notes/1\""],
        "the server is asked in its own terms"
    );
    call(agent.peer(), "fixture__touch_note", json!({})).await;
    eventually("the agent hears of the change", || {
        listener.updated() == [uri]
    })
    .await;
    #[allow(deprecated)]
    agent
        .peer()
        .unsubscribe(UnsubscribeRequestParams::new(uri))
        .await
        .expect("unsubscribed");
    assert_eq!(
        gate.deliveries().last().map(String::as_str),
        Some("resources/unsubscribe \"fixture://notes/1\"")
    );
}

#[tokio::test]
async fn prompts_are_listed_and_got_under_the_gates_names_with_their_resources_addresses() {
    let gate = rich_gate("prompts");
    let agent = gate.agent(CODER_TOKEN).await;
    let prompts = agent.peer().list_all_prompts().await.expect("listed");
    let prompts = serde_json::to_value(&prompts).expect("serialises");
    assert_eq!(prompts[0]["name"], "fixture__summarize");
    assert_eq!(prompts[0]["title"], "Summarize");
    assert_eq!(prompts[0]["arguments"][0]["name"], "topic");
    let mut arguments = serde_json::Map::new();
    arguments.insert("topic".into(), json!("alpha"));
    let got = agent
        .peer()
        .get_prompt(GetPromptRequestParams::new("fixture__summarize").with_arguments(arguments))
        .await
        .expect("got");
    let got = serde_json::to_value(&got).expect("serialises");
    assert_eq!(
        got["messages"],
        json!([
            {"role": "user", "content": {"type": "text", "text": "Summarize the notes about alpha."}},
            {"role": "user", "content": {"type": "resource", "resource": {"uri": "gate://fixture/fixture://notes/1", "mimeType": "text/plain", "text": "note 1"}}}
        ])
    );
}

#[tokio::test]
async fn completion_of_a_prompts_argument_crosses_the_gate() {
    let gate = rich_gate("complete");
    let agent = gate.agent(CODER_TOKEN).await;
    let completed = agent
        .peer()
        .complete(CompleteRequestParams::new(
            Reference::for_prompt("fixture__summarize"),
            ArgumentInfo::new("topic", "be"),
        ))
        .await
        .expect("completed");
    assert_eq!(
        serde_json::to_value(&completed).expect("serialises")["completion"]["values"],
        json!(["beta", "beyond"])
    );
}

#[tokio::test]
async fn a_servers_log_during_a_read_reaches_the_calling_agent_and_no_agent_without_a_grant() {
    let gate = rich_gate("log");
    let (listener, agent) = listening_agent(&gate).await;
    let (stranger, _idle) = listening_as(&gate, IDLE_TOKEN).await;
    call(agent.peer(), "fixture__log_read", json!({})).await;
    eventually("three messages reach the caller", || {
        listener.logged().len() >= 3
    })
    .await;
    let data: Vec<Value> = listener
        .logged()
        .iter()
        .map(|m| m["data"].clone())
        .collect();
    assert_eq!(data, [json!("step 1"), json!("step 2"), json!("done")]);
    assert_eq!(listener.logged()[0]["logger"], "fixture");
    assert!(
        stranger.logged().is_empty(),
        "an agent with no grant hears nothing"
    );
}

#[tokio::test]
async fn a_session_that_set_a_level_hears_only_that_level_and_above() {
    let gate = rich_gate("log-level");
    let (listener, agent) = listening_agent(&gate).await;
    #[allow(deprecated)]
    agent
        .peer()
        .set_level(rmcp::model::SetLevelRequestParams::new(
            rmcp::model::LoggingLevel::Warning,
        ))
        .await
        .expect("level set");
    call(agent.peer(), "fixture__log_read", json!({})).await;
    eventually("the error reaches the caller", || {
        !listener.logged().is_empty()
    })
    .await;
    call(agent.peer(), "fixture__log_read", json!({})).await;
    eventually("the second error reaches the caller", || {
        listener.logged().len() >= 2
    })
    .await;
    let data: Vec<Value> = listener
        .logged()
        .iter()
        .map(|m| m["data"].clone())
        .collect();
    assert_eq!(data, [json!("done"), json!("done")], "no info message");
}

#[tokio::test]
async fn a_log_flood_reaches_the_agent_within_its_budget_with_the_drop_said_once() {
    let gate = rich_gate("log-flood");
    let (listener, agent) = listening_agent(&gate).await;
    call(agent.peer(), "fixture__log_flood", json!({})).await;
    eventually("the notice of the drop arrives", || {
        listener.logged().iter().any(|m| m["logger"] == "gate")
    })
    .await;
    // Whatever is still on its way has arrived once the next call is answered.
    call(agent.peer(), "fixture__read_notes", json!({})).await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let logged = listener.logged();
    let notices: Vec<&Value> = logged.iter().filter(|m| m["logger"] == "gate").collect();
    assert_eq!(notices.len(), 1, "said once: {notices:?}");
    assert_eq!(notices[0]["level"], "warning");
    assert!(
        notices[0]["data"].as_str().is_some_and(
            |d| d.starts_with("server fixture sent more than 50 log messages in a second")
        ),
        "{notices:?}"
    );
    assert!(
        logged.len() <= 51,
        "at most fifty and the notice: {}",
        logged.len()
    );
}

/// An agent whose client takes a server's questions: it answers an elicitation with a
/// name and a sampling request with a greeting, and counts them.
#[derive(Clone, Default)]
struct Answering(Arc<Mutex<usize>>);

impl Answering {
    fn asked(&self) -> usize {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn count(&self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) += 1;
    }
}

#[allow(deprecated)]
impl ClientHandler for Answering {
    fn get_info(&self) -> rmcp::model::ClientConfig {
        let mut capabilities = rmcp::model::ClientCapabilities::default();
        capabilities.sampling = Some(Default::default());
        capabilities.elicitation = Some(Default::default());
        rmcp::model::ClientConfig::new(
            capabilities,
            rmcp::model::Implementation::new("answering", "1"),
        )
    }

    async fn create_elicitation(
        &self,
        _request: rmcp::model::ElicitRequestParams,
        _context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::ElicitResult, rmcp::ErrorData> {
        self.count();
        Ok(
            serde_json::from_value(json!({"action": "accept", "content": {"name": "Ada"}}))
                .expect("an elicitation result"),
        )
    }

    async fn create_message(
        &self,
        _params: rmcp::model::CreateMessageRequestParams,
        _context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::CreateMessageResult, rmcp::ErrorData> {
        self.count();
        Ok(serde_json::from_value(json!({
            "role": "assistant",
            "content": {"type": "text", "text": "hello from the agent's model"},
            "model": "test-model"
        }))
        .expect("a sampling result"))
    }
}

async fn answering_agent(gate: &Gate) -> (Answering, RunningService<RoleClient, Answering>) {
    let answering = Answering::default();
    let transport = StreamableHttpClientTransport::with_client(
        gatekeeper_mcp::tls::client(None).expect("an HTTP client"),
        StreamableHttpClientTransportConfig::with_uri(gate.url.as_str()).auth_header(CODER_TOKEN),
    );
    let running = answering.clone().serve(transport).await.expect("connected");
    (answering, running)
}

#[tokio::test]
async fn a_servers_questions_during_a_read_reach_the_agent_only_where_the_person_allows_them() {
    // By default the gate declares neither capability, so the server cannot ask.
    let mut gate = rich_gate("questions");
    let (answering, agent) = answering_agent(&gate).await;
    for tool in ["fixture__elicit_read", "fixture__sample_read"] {
        let declined = text(&call(agent.peer(), tool, json!({})).await);
        assert!(declined.starts_with("no answer:"), "{tool}: {declined}");
    }
    assert_eq!(answering.asked(), 0, "the agent was never asked");
    drop(agent);

    gate.reconfigure(|text| {
        text.replace(
            "trust = \"byo\"",
            "trust = \"byo\"\nforward_elicitation = true\nforward_sampling = true",
        )
    });
    let (answering, agent) = answering_agent(&gate).await;
    let named = text(&call(agent.peer(), "fixture__elicit_read", json!({})).await);
    assert!(
        named.starts_with("answered:") && named.contains("\"Ada\""),
        "{named}"
    );
    let sampled = text(&call(agent.peer(), "fixture__sample_read", json!({})).await);
    assert!(
        sampled.contains("hello from the agent's model"),
        "{sampled}"
    );
    assert_eq!(answering.asked(), 2);
    let ledger = String::from_utf8_lossy(&gate.person(&["ledger"]).stdout).into_owned();
    assert!(
        ledger.contains("A question of fixture during a read: elicitation")
            && ledger.contains("A question of fixture during a read: sampling"),
        "each exchange is in the ledger: {ledger}"
    );

    // An agent whose client takes no questions is not put to them.
    let plain = gate.agent(CODER_TOKEN).await;
    let refused = text(&call(plain.peer(), "fixture__elicit_read", json!({})).await);
    assert!(
        refused.starts_with("no answer:")
            && refused.contains("the agent's client does not take elicitation requests"),
        "{refused}"
    );
}

#[tokio::test]
async fn an_answer_larger_than_the_gate_reads_is_told_at_once_and_a_send_of_one_is_applied_with_the_note()
 {
    let mut gate = rich_gate("too-large");
    gate.reconfigure(|text| text.replace("trust = \"byo\"", "trust = \"byo\"\nmax_result_mib = 1"));
    let agent = gate.agent(CODER_TOKEN).await;
    let started = std::time::Instant::now();
    let read = call(agent.peer(), "fixture__big_read", json!({})).await;
    assert_eq!(read.is_error, Some(true));
    assert!(
        text(&read).starts_with("(The server's answer was 2097")
            && text(&read).contains("over the 1048576 bytes the gate reads in one message"),
        "{}",
        text(&read)
    );
    // Told at once: nowhere near the server's deadline (60 s).
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    let staged = text(&call(agent.peer(), "fixture__big_write", json!({})).await);
    let id = action_id(&staged);
    let approve = gate.person(&["approve", &id.to_string()]);
    assert!(approve.status.success(), "{approve:?}");
    let outcome = text(&call(agent.peer(), "gate_action_result", json!({"action_id": id})).await);
    assert!(
        outcome.contains("was approved and sent") && outcome.contains("it was not read"),
        "the tool ran; only its answer was not read: {outcome}"
    );
    assert_eq!(gate.deliveries(), ["big_write {}"], "sent once");
}

/// The same answering agent on protocol 2026-07-28 (`server/discover`, no session).
async fn modern_answering_agent(gate: &Gate) -> (Answering, RunningService<RoleClient, Answering>) {
    use rmcp::service::{ClientLifecycleMode, ClientServiceExt as _};
    let answering = Answering::default();
    let transport = StreamableHttpClientTransport::with_client(
        gatekeeper_mcp::tls::client(None).expect("an HTTP client"),
        StreamableHttpClientTransportConfig::with_uri(gate.url.as_str()).auth_header(CODER_TOKEN),
    );
    let lifecycle = ClientLifecycleMode::Discover {
        preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
    };
    let running = answering
        .clone()
        .serve_with_lifecycle(transport, lifecycle)
        .await
        .expect("connected on 2026-07-28");
    (answering, running)
}

#[tokio::test]
async fn a_servers_input_required_on_2026_07_28_reaches_a_modern_agent_untouched_and_is_answered_for_an_older_one()
 {
    use rmcp::model::CallToolResponse;
    let mut gate = rich_gate("input-required");
    gate.reconfigure(|text| {
        text.replace(
            "trust = \"byo\"",
            "trust = \"byo\"\nforward_elicitation = true\nforward_sampling = true\nprotocol = \"2026-07-28\"",
        )
    });

    // A modern agent gets the server's result as it was sent, request state included, and
    // its retry carries its answer down untouched.
    let (answering, agent) = modern_answering_agent(&gate).await;
    let first = agent
        .peer()
        .call_tool_once(CallToolRequestParams::new("fixture__elicit_read"))
        .await
        .expect("answered");
    let CallToolResponse::InputRequired(needed) = first else {
        panic!("the server's input_required result reaches the agent: {first:?}")
    };
    assert_eq!(
        needed.request_state.as_deref(),
        Some("fixture-state: asked once")
    );
    let question = serde_json::to_value(&needed.input_requests).expect("serialises");
    assert_eq!(question["ask"]["method"], "elicitation/create");
    assert_eq!(
        question["ask"]["params"]["message"],
        "What name should the note carry?"
    );
    let mut retry = CallToolRequestParams::new("fixture__elicit_read");
    retry.input_responses = Some(
        [(
            "ask".to_owned(),
            json!({"action": "accept", "content": {"name": "Grace"}}),
        )]
        .into(),
    );
    retry.request_state = needed.request_state.clone();
    let CallToolResponse::Complete(done) =
        agent.peer().call_tool_once(retry).await.expect("answered")
    else {
        panic!("the retry completes")
    };
    assert_eq!(
        text(&done),
        r#"answered: {"action":"accept","content":{"name":"Grace"}}"#,
        "the server saw the agent's answer and its own state"
    );
    // A resource read that asks crosses the same way, under the gate's address.
    let address = "gate://fixture/fixture://notes/ask";
    let read = agent
        .peer()
        .read_resource_once(ReadResourceRequestParams::new(address))
        .await
        .expect("answered");
    let rmcp::model::ReadResourceResponse::InputRequired(needed) = read else {
        panic!("the resource read asks the agent: {read:?}")
    };
    let mut retry = ReadResourceRequestParams::new(address);
    retry.input_responses = Some(
        [(
            "ask".to_owned(),
            json!({"action": "accept", "content": {"name": "Lin"}}),
        )]
        .into(),
    );
    retry.request_state = needed.request_state;
    let rmcp::model::ReadResourceResponse::Complete(read) = agent
        .peer()
        .read_resource_once(retry)
        .await
        .expect("answered")
    else {
        panic!("the retried read completes")
    };
    let shown = serde_json::to_value(&read.contents).expect("serialises");
    assert_eq!(shown[0]["text"], "note for \"Lin\"");
    assert_eq!(shown[0]["uri"], address, "under the gate's address");
    // The protocol library's own rounds work through the gate the same way.
    let sampled = agent
        .call_tool(CallToolRequestParams::new("fixture__sample_read"))
        .await
        .expect("completed");
    assert!(
        text(&sampled).contains("hello from the agent's model"),
        "{}",
        text(&sampled)
    );
    assert_eq!(answering.asked(), 1, "the library asked its handler once");
    let ledger = String::from_utf8_lossy(&gate.person(&["ledger"]).stdout).into_owned();
    assert!(
        ledger.contains("input required") && ledger.contains("input answered"),
        "both halves of the exchange are in the ledger: {ledger}"
    );
    drop(agent);

    // An agent on the older protocol cannot take that result: the gate asks it the older
    // way and calls again itself.
    let (answering, agent) = answering_agent(&gate).await;
    let named = text(&call(agent.peer(), "fixture__elicit_read", json!({})).await);
    assert_eq!(
        named,
        r#"answered: {"action":"accept","content":{"name":"Ada"}}"#
    );
    assert_eq!(answering.asked(), 1);
    // A resource read that asks is answered the same way.
    let read = agent
        .peer()
        .read_resource(ReadResourceRequestParams::new(address))
        .await
        .expect("read");
    let shown = serde_json::to_value(&read.contents).expect("serialises");
    assert_eq!(shown[0]["text"], "note for \"Ada\"");
    assert_eq!(answering.asked(), 2);
}

/// An agent whose client declares MCP's tasks extension, on protocol `version`'s lifecycle.
async fn tasking_agent(
    gate: &Gate,
    modern: bool,
) -> RunningService<RoleClient, rmcp::model::ClientConfig> {
    use rmcp::service::{ClientLifecycleMode, ClientServiceExt as _};
    let config = rmcp::model::ClientConfig::new(
        rmcp::model::ClientCapabilities::builder()
            .enable_tasks()
            .build(),
        rmcp::model::Implementation::new("tasking", "1"),
    );
    let transport = StreamableHttpClientTransport::with_client(
        gatekeeper_mcp::tls::client(None).expect("an HTTP client"),
        StreamableHttpClientTransportConfig::with_uri(gate.url.as_str()).auth_header(CODER_TOKEN),
    );
    let lifecycle = if modern {
        ClientLifecycleMode::Discover {
            preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
        }
    } else {
        ClientLifecycleMode::Initialize
    };
    config
        .serve_with_lifecycle(transport, lifecycle)
        .await
        .expect("connected")
}

#[tokio::test]
async fn a_staged_write_answers_a_client_that_takes_tasks_with_a_task_that_ends_with_the_decision()
{
    use rmcp::model::{CallToolResponse, CancelTaskParams, GetTaskParams, TaskPayload, TaskStatus};
    let gate = rich_gate("tasks");
    for (modern, note) in [(false, "by task"), (true, "by task on 2026-07-28")] {
        let agent = tasking_agent(&gate, modern).await;
        let arguments = json!({"text": note}).as_object().cloned();
        let mut params = CallToolRequestParams::new("fixture__write_note");
        params.arguments = arguments;
        let answer = agent
            .peer()
            .call_tool_once(params.clone())
            .await
            .expect("answered");
        let CallToolResponse::Task(created) = answer else {
            panic!("a staged write answers with a task: {answer:?}")
        };
        assert_eq!(created.task.status, TaskStatus::Working);
        let id = action_id(created.task.status_message.as_deref().unwrap_or_default());
        assert_eq!(created.task.task_id, format!("gate-action-{id}"));

        // The task is the person's once staged: cancelling it is refused, nothing changes.
        let cancel = agent
            .peer()
            .cancel_task(CancelTaskParams::new(created.task.task_id.clone()))
            .await;
        assert!(
            cancel.is_err_and(|e| e.to_string().contains("ask the person to reject it")),
            "cancelling is refused with what to do"
        );
        let waiting = agent
            .peer()
            .get_task(GetTaskParams::new(created.task.task_id.clone()))
            .await
            .expect("the task is known");
        assert_eq!(waiting.task.status(), TaskStatus::Working);

        let approved = gate.person(&["approve", &id.to_string()]);
        assert!(approved.status.success(), "{approved:?}");
        let done = agent
            .peer()
            .get_task(GetTaskParams::new(created.task.task_id.clone()))
            .await
            .expect("the task is known");
        let TaskPayload::Completed { result } = &done.task.payload else {
            panic!("applied: the task completes: {done:?}")
        };
        assert_eq!(
            result["content"][0]["text"],
            format!("wrote {note:?}"),
            "its result is the server's answer"
        );
        assert_ne!(result.get("isError"), Some(&json!(true)));
    }

    // A rejected write's task completes as an error with the person's reason.
    let agent = tasking_agent(&gate, false).await;
    let mut params = CallToolRequestParams::new("fixture__write_note");
    params.arguments = json!({"text": "unwanted"}).as_object().cloned();
    let CallToolResponse::Task(created) =
        agent.peer().call_tool_once(params).await.expect("answered")
    else {
        panic!("a task")
    };
    let id = action_id(created.task.status_message.as_deref().unwrap_or_default());
    let rejected = gate.person(&["reject", &id.to_string(), "--reason", "not this note"]);
    assert!(rejected.status.success(), "{rejected:?}");
    let done = agent
        .peer()
        .get_task(GetTaskParams::new(created.task.task_id))
        .await
        .expect("the task is known");
    let TaskPayload::Completed { result } = &done.task.payload else {
        panic!("rejected: the task completes: {done:?}")
    };
    assert_eq!(result["isError"], true);
    assert!(
        result["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("rejected by a person") && t.contains("not this note")),
        "{result:?}"
    );
    // Another agent's task, or no task of the gate's, is unknown.
    let unknown = agent
        .peer()
        .get_task(GetTaskParams::new("gate-action-9999"))
        .await;
    assert!(unknown.is_err_and(|e| e.to_string().contains("you have no task")));
    assert_eq!(
        gate.deliveries(),
        [
            "write_note {\"text\":\"by task\"}",
            "write_note {\"text\":\"by task on 2026-07-28\"}"
        ],
        "each approved write sent once, the rejected one never"
    );
}

//! ex16: a server's question on protocol 2026-07-28 crosses the gate untouched to an agent
//! that speaks it, and is answered by the gate for one that does not.
//!
//! On 2026-07-28 a server does not ask its client mid-call: it answers `input_required`
//! with its questions and an opaque request state, and the client calls again with its
//! answers and the state echoed. The gate sits between two clients of different eras and a
//! server of the new one. This lecture serves a small MCP server over streamable HTTP in
//! this process (rmcp's server, protocol 2026-07-28), reaches it with the gate's own
//! driver ([`gatekeeper_mcp::McpServer`], `protocol = "2026-07-28"`), and makes the same
//! read three times: for a modern agent (the answer and its retry cross as they are), for
//! an agent on 2025-11-25 (the gate asks it the older way and calls again), and for the
//! same agent on a server the person did not let ask (the gate declines for it).

use std::io::Write;
use std::sync::Arc;

use gatekeeper_core::{CallContext, ToolService};
use gatekeeper_mcp::{
    Endpoint, HttpEndpoint, InputRetry, McpServer, McpServerConfig, PendingAsk, Protocol, ReadRelay,
};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, InputRequest,
    InputRequests, InputRequiredResult, ListToolsResult, PaginatedRequestParams, ServerConfig,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::setup::paragraph;
use crate::{Context, Lecture, LectureFuture};

/// The lecture.
pub const LECTURE: Lecture = Lecture {
    name: "ex16",
    title: "a server's question on protocol 2026-07-28",
    summary: "a modern agent gets input_required as sent; for an older one the gate asks, then calls again",
    run,
};

fn run<'a>(cx: &'a mut Context<'_>) -> LectureFuture<'a> {
    Box::pin(body(cx))
}

/// The request state the lecture's server hands out and checks on the retry.
const STATE: &str = "greet: asked for a name, round 1";

/// The lecture's server: one read, `greet`, that asks whom to greet.
#[derive(Clone)]
struct Greeter;

impl ServerHandler for Greeter {
    fn get_info(&self) -> ServerConfig {
        crate::setup::tools_only()
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        crate::setup::tools_listed(json!([{
            "name": "greet",
            "description": "Greet someone; asks whom.",
            "inputSchema": {"type": "object"},
            "annotations": {"readOnlyHint": true}
        }]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if let Some(answer) = request.input_responses.as_ref().and_then(|a| a.get("who")) {
            let text = if request.request_state.as_deref() != Some(STATE) {
                "the request state came back changed".to_owned()
            } else if answer["action"] == "accept" {
                format!(
                    "hello, {}",
                    answer["content"]["name"].as_str().unwrap_or("?")
                )
            } else {
                format!(
                    "no name given ({})",
                    answer["action"].as_str().unwrap_or("?")
                )
            };
            return Ok(CallToolResult::success(vec![ContentBlock::text(text)]).into());
        }
        let question: InputRequest = serde_json::from_value(json!({
            "method": "elicitation/create",
            "params": {
                "mode": "form",
                "message": "Whom should I greet?",
                "requestedSchema": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}},
                    "required": ["name"]
                }
            }
        }))
        .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        Ok(CallToolResponse::InputRequired(InputRequiredResult::new(
            Some(InputRequests::from([("who".to_owned(), question)])),
            Some(STATE.to_owned()),
        )))
    }
}

/// The gate's driver for the lecture's server, on protocol 2026-07-28; `elicitation` is the
/// person's `forward_elicitation`.
async fn driver(url: &str, elicitation: bool) -> anyhow::Result<Arc<McpServer>> {
    let endpoint = Endpoint::Http(HttpEndpoint {
        url: url.to_owned(),
        headers: Vec::new(),
        ca_file: None,
        oauth: None,
    });
    let config = McpServerConfig::new("greeter", endpoint)
        .protocol(Protocol::Discover)
        .forward_questions(false, elicitation);
    Ok(McpServer::connect(config).await?)
}

/// `greet` through `driver` with the read's `relay`, as the gateway calls a read.
async fn greet(
    driver: &McpServer,
    relay: ReadRelay,
) -> anyhow::Result<gatekeeper_core::ToolResult> {
    let digest = driver
        .catalog()
        .get("greet")
        .map(|t| t.digest.clone())
        .ok_or_else(|| anyhow::anyhow!("the server lists no greet"))?;
    Ok(driver
        .call_in("greet", Some(&digest), &json!({}), &CallContext::new(relay))
        .await?)
}

/// An agent's client on 2025-11-25, answering each question the gate puts to it with
/// `name`; what it was asked, one line each.
fn answering_client(
    name: &'static str,
) -> (
    tokio::sync::mpsc::Sender<PendingAsk>,
    tokio::task::JoinHandle<Vec<String>>,
) {
    let (asks, mut questions) = tokio::sync::mpsc::channel::<PendingAsk>(1);
    let client = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some(question) = questions.recv().await {
            let shown = match &question.ask {
                gatekeeper_mcp::Ask::Elicitation(params) => serde_json::to_value(params)
                    .ok()
                    .and_then(|p| p.get("message").cloned())
                    .unwrap_or(Value::Null)
                    .to_string(),
                gatekeeper_mcp::Ask::Sampling(_) => "a sampling request".to_owned(),
            };
            seen.push(format!("elicitation/create {shown}"));
            let _ = question
                .reply
                .send(Ok(json!({"action": "accept", "content": {"name": name}})));
        }
        seen
    });
    (asks, client)
}

async fn body(cx: &mut Context<'_>) -> anyhow::Result<()> {
    paragraph(
        cx,
        &[
            "On protocol 2026-07-28 a server asks by answering: `input_required`, its questions and a",
            "request state only it reads; the client calls again with its answers and the state.",
            "The gate passes that through to an agent on 2026-07-28, and answers it itself, by asking",
            "the older way, for an agent on 2025-11-25. The server below runs in this process; the",
            "gate's own driver reaches it on 2026-07-28 (`protocol = \"2026-07-28\"`).",
        ],
    )?;
    let url = crate::setup::serve_mcp(Greeter).await?;
    let allowed = driver(&url, true).await?;

    cx.section("An agent on 2026-07-28: the answer crosses as it was sent")?;
    let relay = ReadRelay::new(None, CancellationToken::new()).with_input(true, None);
    let first = greet(&allowed, relay).await?;
    let needed = first
        .input_required
        .clone()
        .ok_or_else(|| anyhow::anyhow!("the server's question did not come back"))?;
    writeln!(cx, "  the agent's read of greet is answered:")?;
    writeln!(
        cx,
        "{}",
        indent(&serde_json::to_string_pretty(&needed)?, "    ")
    )?;
    let state = needed["requestState"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    writeln!(
        cx,
        "  the agent's client asks its user, and calls again with the answer and the state:"
    )?;
    let retry = InputRetry {
        input_responses: Some(
            [(
                "who".to_owned(),
                json!({"action": "accept", "content": {"name": "Ada"}}),
            )]
            .into(),
        ),
        request_state: Some(state.clone()),
    };
    let relay = ReadRelay::new(None, CancellationToken::new()).with_input(true, Some(retry));
    let second = greet(&allowed, relay).await?;
    writeln!(cx, "    → {:?}", second.text())?;
    cx.evidence(
        "request state the server got back",
        if second.text() == "hello, Ada" {
            state.as_str()
        } else {
            "changed"
        },
    )?;

    cx.section("An agent on 2025-11-25: the gate asks it, then calls again")?;
    let (asks, client) = answering_client("Grace");
    let relay = ReadRelay::new(None, CancellationToken::new()).with_asks(asks);
    let answered = greet(&allowed, relay).await?;
    let seen = client.await?;
    for line in &seen {
        writeln!(cx, "  the gate asks the agent's client: {line}")?;
    }
    writeln!(cx, "  the read is answered: {:?}", answered.text())?;
    cx.evidence("questions put to the older agent", seen.len())?;

    cx.section("The same agent, where the person did not let the server ask")?;
    let withheld = driver(&url, false).await?;
    let (asks, client) = answering_client("Grace");
    let relay = ReadRelay::new(None, CancellationToken::new()).with_asks(asks);
    let declined = greet(&withheld, relay).await?;
    let seen = client.await?;
    writeln!(
        cx,
        "  forward_elicitation is off: the gate declines for the agent"
    )?;
    writeln!(cx, "  the read is answered: {:?}", declined.text())?;
    cx.evidence("questions put to the agent", seen.len())?;
    Ok(())
}

fn indent(text: &str, by: &str) -> String {
    text.lines()
        .map(|line| format!("{by}{line}"))
        .collect::<Vec<_>>()
        .join("\n")
}

//! ex20: a server that is down is not the gate down.
//!
//! The gate serves an agent several servers. Until now one that did not answer when the
//! daemon started stopped the whole daemon, and so every other server with it. Now a
//! server whose catalog a person accepted before is offered with that catalog while it is
//! down (`McpServer::unavailable`): its calls fail with the reason, each tries to start it
//! again (within the backoff of failed starts), and the other servers are served. This
//! lecture runs it on two small MCP servers in this process, reached over HTTP: `notes`,
//! which is stopped and started again, and `calendar`, which stays up.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use gatekeeper_core::{CallOutcome, Grants, ServerTrust, Session, ToolService as _};
use gatekeeper_mcp::{Endpoint, HttpEndpoint, McpServer, McpServerConfig};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, ServerConfig,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler};
use serde_json::json;

use crate::setup::{Desk, paragraph};
use crate::{Context, Lecture, LectureFuture};

/// The lecture.
pub const LECTURE: Lecture = Lecture {
    name: "ex20",
    title: "a server that is down is not the gate down",
    summary: "a server down at start is offered with the catalog a person accepted; its calls say why, the others are served, and it is tried again",
    run,
};

fn run<'a>(cx: &'a mut Context<'_>) -> LectureFuture<'a> {
    Box::pin(body(cx))
}

/// A server with one read, `read_<name>`, answering `<name> is up`.
#[derive(Clone)]
struct Small {
    name: &'static str,
}

impl ServerHandler for Small {
    fn get_info(&self) -> ServerConfig {
        crate::setup::tools_only()
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        crate::setup::tools_listed(json!([{
            "name": format!("read_{}", self.name),
            "description": "Read what there is.",
            "inputSchema": {"type": "object", "properties": {}},
            "annotations": {"readOnlyHint": true}
        }]))
    }

    async fn call_tool(
        &self,
        _request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        Ok(
            CallToolResult::success(vec![ContentBlock::text(format!("{} is up", self.name))])
                .into(),
        )
    }
}

fn config(name: &str, url: &str) -> McpServerConfig {
    let endpoint = Endpoint::Http(HttpEndpoint {
        url: url.to_owned(),
        headers: Vec::new(),
        ca_file: None,
        oauth: None,
    });
    McpServerConfig::new(name, endpoint).trust(ServerTrust::Vetted)
}

/// A read through `session`, printed as the agent gets it: the data, or that the server does
/// not answer (its reason names an address and a wait, which vary from run to run).
async fn read(cx: &mut Context<'_>, session: &Session, tool: &str) -> anyhow::Result<bool> {
    writeln!(cx, "  agent → {tool}")?;
    let answer = match session.call_tool(tool, json!({})).await {
        Ok(CallOutcome::Data { result, .. }) if !result.is_error => {
            writeln!(cx, "    data: {}", result.text())?;
            return Ok(true);
        }
        Ok(CallOutcome::Data { result, .. }) => result.text(),
        Ok(CallOutcome::Pending { .. }) => anyhow::bail!("{tool} is a read"),
        Err(error) => error.to_string(),
    };
    // Within the backoff the answer says the server is unavailable and since when; after
    // it, why this start failed. Either way it names an address and a wait, which vary.
    anyhow::ensure!(
        answer.contains("notes") || answer.contains("unavailable") || answer.contains("start"),
        "an answer that does not say why: {answer}"
    );
    let said = "the server does not answer (the agent is told why, and what to check)";
    writeln!(cx, "    refused: {said}")?;
    Ok(false)
}

async fn body(cx: &mut Context<'_>) -> anyhow::Result<()> {
    paragraph(
        cx,
        &[
            "An agent reaches several servers through one gate. A server that is down when the",
            "daemon starts used to stop the daemon, and every other server with it. Now the",
            "server a person accepted before is offered as accepted, its calls say it is",
            "unavailable, and each call tries it again.",
        ],
    )?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let address = listener.local_addr()?;
    let notes_url = format!("http://{address}/mcp");
    let calendar_url = crate::setup::serve_mcp(Small { name: "calendar" }).await?;

    cx.section("1. Yesterday: the person accepted what notes offers")?;
    let up = crate::setup::serve_mcp_on(listener, Small { name: "notes" });
    let seen = McpServer::connect(config("notes", &notes_url)).await?;
    let accepted = seen.catalog();
    let names: Vec<&str> = accepted.tools().iter().map(|t| t.name.as_str()).collect();
    cx.evidence("the accepted catalog of notes", names.join(", "))?;
    drop(seen);
    up.abort();
    let _ = up.await;

    cx.section("2. Today the daemon starts while notes is down")?;
    let why = match McpServer::connect(config("notes", &notes_url)).await {
        Ok(_) => anyhow::bail!("notes answered while it was stopped"),
        Err(error) => error.to_string(),
    };
    cx.evidence("notes starts", "no: it does not answer")?;
    let notes = McpServer::unavailable(config("notes", &notes_url), accepted, &why);
    let calendar = McpServer::connect(config("calendar", &calendar_url)).await?;
    let desk = Desk::new(cx)?;
    let notes_gk = Arc::new(notes.gatekeeper(desk.action_store("notes").await?));
    let calendar_gk = Arc::new(calendar.gatekeeper(desk.action_store("calendar").await?));
    desk.overseer.register(notes_gk.clone())?;
    desk.overseer.register(calendar_gk.clone())?;
    let mut grants = Grants::new();
    grants.introduce(
        "NOTES",
        notes_gk.grant(&desk.overseer, "agent", &["read_notes"])?,
    );
    grants.introduce(
        "CALENDAR",
        calendar_gk.grant(&desk.overseer, "agent", &["read_calendar"])?,
    );
    let listed: Vec<String> = notes
        .list_tools()
        .await
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    cx.evidence("what notes offers the agent", listed.join(", "))?;
    read(cx, grants.session("NOTES")?, "read_notes").await?;
    read(cx, grants.session("CALENDAR")?, "read_calendar").await?;

    cx.section("3. notes comes back, and the next call reaches it")?;
    let listener = tokio::net::TcpListener::bind(address).await?;
    let back = crate::setup::serve_mcp_on(listener, Small { name: "notes" });
    writeln!(cx, "  (notes listens again on its address)")?;
    // Failed starts are tried again after a backoff (250 ms, doubling, at most 30 s): the
    // agent's calls in the meantime are told so; the lecture waits for the next try.
    let mut tries = 0;
    let session = grants.session("NOTES")?.clone();
    loop {
        tries += 1;
        let result = session.call_tool("read_notes", json!({})).await;
        if let Ok(CallOutcome::Data { result, .. }) = &result
            && !result.is_error
        {
            break;
        }
        anyhow::ensure!(tries < 200, "notes never came back: {result:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    read(cx, &session, "read_notes").await?;
    back.abort();
    Ok(())
}

//! `gate mcp --agent NAME`: a stdio bridge for MCP clients that launch their servers as
//! subprocesses. It connects to the running daemon over HTTP with the agent's token and
//! forwards `tools/list` and `tools/call`, and the daemon's
//! `notifications/tools/list_changed` (a person accepted a new catalog) to the client; it
//! keeps no state of its own, so everything the agent does is decided and recorded by the
//! daemon.

use std::sync::{Arc, OnceLock};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::{NotificationContext, Peer, RequestContext, RoleClient, RoleServer};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, ErrorData, ServerHandler, ServiceExt as _};
use tracing::warn;

use crate::config::Config;
use crate::http::MCP_PATH;

/// Why the bridge could not start.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BridgeError(String);

struct Bridge {
    daemon: Peer<RoleClient>,
}

/// The bridge's side of its connection to the daemon: passes the daemon's tool-list
/// notification on to the MCP client, once that client is connected.
#[derive(Clone, Default)]
struct Forward(Arc<OnceLock<Peer<RoleServer>>>);

impl ClientHandler for Forward {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        if let Some(client) = self.0.get()
            && let Err(error) = client.notify_tool_list_changed().await
        {
            warn!(%error, "bridge.notify.failed: the client sees the new tools at its next tools/list");
        }
    }
}

fn upstream_error(error: rmcp::ServiceError) -> ErrorData {
    match error {
        rmcp::ServiceError::McpError(error) => error,
        other => ErrorData::internal_error(
            format!(
                "the gate daemon did not answer ({other}); ask the person to check that `gate serve` runs"
            ),
            None,
        ),
    }
}

impl ServerHandler for Bridge {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        );
        if let Some(instructions) = self.daemon.peer_info().and_then(|i| i.instructions.clone()) {
            info = info.with_instructions(instructions);
        }
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = self.daemon.list_all_tools().await.map_err(upstream_error)?;
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let mut forwarded = CallToolRequestParams::new(request.name);
        if let Some(arguments) = request.arguments {
            forwarded = forwarded.with_arguments(arguments);
        }
        let result = self
            .daemon
            .call_tool(forwarded)
            .await
            .map_err(upstream_error)?;
        Ok(result.into())
    }
}

/// Connect to the daemon as `agent` (its token and address from `config`), then serve the
/// MCP client on this process's stdin and stdout until it closes them.
pub async fn run(config: &Config, agent: &str) -> Result<(), BridgeError> {
    let Some(entry) = config.agents.iter().find(|a| a.name == agent) else {
        let known: Vec<&str> = config.agents.iter().map(|a| a.name.as_str()).collect();
        return Err(BridgeError(format!(
            "{} has no agent named {agent:?}; it has: {}",
            config.path.display(),
            if known.is_empty() {
                "(none)".to_owned()
            } else {
                known.join(", ")
            }
        )));
    };
    if config.listen.port() == 0 {
        return Err(BridgeError(format!(
            "{} lets the daemon pick its port (listen = \"{}\"), so the bridge cannot find it; write a fixed port, for example listen = \"{}\"",
            config.path.display(),
            config.listen,
            crate::config::DEFAULT_LISTEN
        )));
    }
    let url = format!("http://{}{MCP_PATH}", config.listen);
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(Arc::<str>::from(url.as_str()))
            .auth_header(entry.token.clone()),
    );
    let forward = Forward::default();
    let daemon = forward.clone().serve(transport).await.map_err(|e| {
        BridgeError(format!(
            "could not reach the gate daemon at {url} ({e}); start it with `gate serve`"
        ))
    })?;
    let bridge = Bridge {
        daemon: daemon.peer().clone(),
    };
    let running = bridge.serve(rmcp::transport::stdio()).await.map_err(|e| {
        BridgeError(format!(
            "the MCP client did not complete the handshake: {e}"
        ))
    })?;
    let _ = forward.0.set(running.peer().clone());
    let _ = running.waiting().await;
    Ok(())
}

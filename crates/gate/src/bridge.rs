//! `gate mcp --agent NAME`: a stdio bridge for MCP clients that launch their servers as
//! subprocesses. It connects to the running daemon over HTTP with the agent's token and
//! forwards `tools/list` and `tools/call`; it keeps no state of its own, so everything the
//! agent does is decided and recorded by the daemon.

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::{Peer, RequestContext, RoleClient, RoleServer};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ErrorData, ServerHandler, ServiceExt as _};

use crate::config::Config;
use crate::http::MCP_PATH;

/// Why the bridge could not start.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BridgeError(String);

struct Bridge {
    daemon: Peer<RoleClient>,
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
        let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
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
    let daemon = ().serve(transport).await.map_err(|e| {
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
    let _ = running.waiting().await;
    Ok(())
}

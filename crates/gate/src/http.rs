//! Agents over MCP streamable HTTP on loopback, each with its own bearer token.
//!
//! An axum router mounts rmcp's streamable HTTP service at [`MCP_PATH`]; a layer in front
//! of it turns `Authorization: Bearer <token>` into the agent's name (or answers 401), and
//! the MCP handler reads that name from the request parts rmcp hands it. A request that
//! reaches the handler without a name sees no tools and can call none.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, ServerHandler};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::gateway::Gateway;

/// Where agents reach the gateway over HTTP.
pub const MCP_PATH: &str = "/mcp";

/// The agent a request was authenticated as (set by the token layer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentName(pub String);

/// Agents by the SHA-256 of their token: a lookup never compares the secret itself
/// byte by byte.
#[derive(Debug, Clone, Default)]
pub struct Tokens(HashMap<[u8; 32], String>);

impl Tokens {
    /// The table for (agent, token) pairs.
    pub fn new<'a>(agents: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        Self(
            agents
                .into_iter()
                .map(|(name, token)| (Sha256::digest(token.as_bytes()).into(), name.to_owned()))
                .collect(),
        )
    }

    /// The agent holding `token`.
    pub fn agent(&self, token: &str) -> Option<&str> {
        self.0
            .get(&<[u8; 32]>::from(Sha256::digest(token.as_bytes())))
            .map(String::as_str)
    }
}

async fn authenticate(
    State(tokens): State<Arc<Tokens>>,
    mut request: Request,
    next: Next,
) -> Response {
    let agent = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .and_then(|token| tokens.agent(token.trim()))
        .map(str::to_owned);
    match agent {
        Some(agent) => {
            request.extensions_mut().insert(AgentName(agent));
            next.run(request).await
        }
        None => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "this gate needs `Authorization: Bearer <token>` with the token of an agent in its configuration\n",
        )
            .into_response(),
    }
}

/// The MCP server one agent session talks to.
#[derive(Clone)]
struct AgentHandler {
    gateway: Arc<Gateway>,
}

fn agent_of(context: &RequestContext<RoleServer>) -> Option<String> {
    context
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<AgentName>())
        .map(|a| a.0.clone())
}

impl ServerHandler for AgentHandler {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_instructions(
            "Writes are held for a person's approval: a staged call answers at once with an action id; call gate_action_result with it for the outcome.",
        )
    }

    /// Remembered, to be told when a person accepts a new catalog.
    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        self.gateway.add_peer(context.peer);
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = agent_of(&context)
            .map(|agent| self.gateway.list_tools(&agent))
            .unwrap_or_default();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        let args = Value::Object(request.arguments.unwrap_or_default());
        let Some(agent) = agent_of(&context) else {
            return Err(ErrorData::invalid_params(
                format!("no tool named {name:?}"),
                None,
            ));
        };
        match self.gateway.call_tool(&agent, &name, args).await {
            Some(result) => Ok(result.into()),
            None => Err(ErrorData::invalid_params(
                format!("no tool named {name:?}; list the tools to see what you may call"),
                None,
            )),
        }
    }
}

/// The agents' router: rmcp's streamable HTTP service at [`MCP_PATH`], behind the tokens.
pub fn router(gateway: Arc<Gateway>, tokens: Tokens) -> Router {
    let service = StreamableHttpService::new(
        move || {
            Ok(AgentHandler {
                gateway: gateway.clone(),
            })
        },
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    Router::new()
        .nest_service(MCP_PATH, service)
        .layer(middleware::from_fn_with_state(
            Arc::new(tokens),
            authenticate,
        ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_find_their_agent_and_nothing_else() {
        let tokens = Tokens::new([
            ("a", "token-of-a-0123456789abc"),
            ("b", "token-of-b-0123456789abc"),
        ]);
        assert_eq!(tokens.agent("token-of-a-0123456789abc"), Some("a"));
        assert_eq!(tokens.agent("token-of-b-0123456789abc"), Some("b"));
        assert_eq!(tokens.agent("token-of-a"), None);
        assert_eq!(tokens.agent(""), None);
    }
}

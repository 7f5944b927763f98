//! Agents over MCP streamable HTTP on loopback, each with its own bearer token.
//!
//! An axum router mounts rmcp's streamable HTTP service at [`MCP_PATH`]; a layer in front
//! of it turns `Authorization: Bearer <token>` into the agent's name (or answers 401), and
//! the MCP handler reads that name from the request parts rmcp hands it. A request that
//! reaches the handler without a name sees no tools and can call none.
//!
//! Each action an agent staged is also a resource, [`action_uri`]: reading it answers as
//! `gate_action_result` does, and a client that listens to it (`subscriptions/listen`
//! with the URI) is sent `notifications/resources/updated` when the action leaves the
//! state it was in, so it need not poll. An agent reads and hears only its own actions.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use gatekeeper_core::CallContext;
use gatekeeper_mcp::{PROGRESS_BUFFER, ReadRelay};
use kernel::ActionState;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
    ResourceContents, ResourceUpdatedNotificationParam, ServerCapabilities, ServerConfig,
    SubscribeRequestParams, SubscriptionFilter, UnsubscribeRequestParams,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer, SubscriptionContext};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, ServerHandler};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::gateway::Gateway;

/// Where agents reach the gateway over HTTP.
pub const MCP_PATH: &str = "/mcp";

/// How often a listening agent's actions are checked for a decision.
pub const LISTEN_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// The resource address of action `id`.
pub fn action_uri(id: u64) -> String {
    format!("gate://action/{id}")
}

/// The action id in a resource address made by [`action_uri`].
pub fn action_of_uri(uri: &str) -> Option<u64> {
    let digits = uri.strip_prefix("gate://action/")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

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
    /// This session's `resources/subscribe` watchers, by URI.
    watchers: Arc<std::sync::Mutex<HashMap<String, tokio::task::AbortHandle>>>,
}

impl AgentHandler {
    /// Watch agent `agent`'s action `id` and call `tell` each time it leaves the state it
    /// was last seen in; stop when it reaches a final state or `tell` fails.
    async fn watch<F, Fut>(gateway: Arc<Gateway>, agent: String, id: u64, mut tell: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let mut seen = gateway.action_state(&agent, id);
        loop {
            tokio::time::sleep(LISTEN_POLL).await;
            gateway.expire_due().await;
            let now = gateway.action_state(&agent, id);
            if now == seen {
                continue;
            }
            seen = now;
            if !tell().await {
                return;
            }
            let open = matches!(now, Some(ActionState::Pending | ActionState::Failed));
            if !open {
                return;
            }
        }
    }
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
                .enable_resources()
                .enable_resources_subscribe()
                .build(),
        )
        .with_instructions(
            "Writes are held for a person's approval: a staged call answers at once with an action id; call gate_action_result with it for the outcome, or listen to the resource gate://action/<id> to be told when it is decided.",
        )
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let not_found = || {
            ErrorData::resource_not_found(
                format!(
                    "no resource {:?}; your actions are gate://action/<id>, with the id a staged call returned",
                    request.uri
                ),
                None,
            )
        };
        let id = action_of_uri(&request.uri).ok_or_else(not_found)?;
        let agent = agent_of(&context).ok_or_else(not_found)?;
        self.gateway
            .action_state(&agent, id)
            .ok_or_else(not_found)?;
        let outcome = self
            .gateway
            .action_outcome(&agent, id)
            .await
            .ok_or_else(not_found)?;
        let text = outcome
            .content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect::<Vec<_>>()
            .join("\n");
        Ok(ReadResourceResult::new(vec![ResourceContents::text(text, request.uri)]).into())
    }

    #[allow(deprecated)] // the subscription of sessions that began with `initialize`
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let uri = request.uri;
        let not_found = || {
            ErrorData::resource_not_found(
                format!("no resource {uri:?}; your actions are gate://action/<id>"),
                None,
            )
        };
        let id = action_of_uri(&uri).ok_or_else(not_found)?;
        let agent = agent_of(&context).ok_or_else(not_found)?;
        self.gateway
            .action_state(&agent, id)
            .ok_or_else(not_found)?;
        let peer = context.peer.clone();
        let told = uri.clone();
        let task = tokio::spawn(Self::watch(self.gateway.clone(), agent, id, move || {
            let peer = peer.clone();
            let uri = told.clone();
            async move {
                peer.notify_resource_updated(ResourceUpdatedNotificationParam::new(uri))
                    .await
                    .is_ok()
            }
        }));
        let mut watchers = self.watchers.lock().unwrap_or_else(|p| p.into_inner());
        watchers.retain(|_, watcher| !watcher.is_finished());
        if let Some(old) = watchers.insert(uri, task.abort_handle()) {
            old.abort();
        }
        Ok(())
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        if let Some(watcher) = self
            .watchers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&request.uri)
        {
            watcher.abort();
        }
        Ok(())
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        // Only action resources; whose they are is checked while listening, where the
        // agent is known.
        let uris: Vec<String> = requested
            .resource_subscriptions
            .iter()
            .flatten()
            .filter(|uri| action_of_uri(uri).is_some())
            .cloned()
            .collect();
        let mut accepted = SubscriptionFilter::new();
        accepted.resource_subscriptions = Some(uris);
        Some(accepted)
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let Some(agent) = agent_of(context.request_context()) else {
            context.cancelled().await;
            return Ok(());
        };
        // One watcher for each of the agent's own actions; others' stay silent.
        let watchers: Vec<tokio::task::JoinHandle<()>> = context
            .accepted()
            .resource_subscriptions
            .iter()
            .flatten()
            .filter_map(|uri| {
                let id = action_of_uri(uri)?;
                self.gateway.action_state(&agent, id)?;
                let sink = context.sink().clone();
                let uri = uri.clone();
                Some(tokio::spawn(Self::watch(
                    self.gateway.clone(),
                    agent.clone(),
                    id,
                    move || {
                        let sink = sink.clone();
                        let uri = uri.clone();
                        async move { sink.notify_resource_updated(uri).await.is_ok() }
                    },
                )))
            })
            .collect();
        context.cancelled().await;
        for watcher in watchers {
            watcher.abort();
        }
        Ok(())
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
        let progress = relay_progress(&context);
        let relay = ReadRelay::new(
            progress.as_ref().map(|(sink, _)| sink.clone()),
            context.ct.clone(),
        );
        let answer = self
            .gateway
            .call_tool_in(&agent, &name, args, CallContext::new(relay))
            .await;
        // Every note the server sent before its answer reaches the agent before the answer:
        // the relay's senders are gone with the call, so the forwarder ends once it has
        // passed the last one on.
        if let Some((sink, forwarder)) = progress {
            drop(sink);
            let _ = forwarder.await;
        }
        match answer {
            Some(result) => Ok(result.into()),
            None => Err(ErrorData::invalid_params(
                format!("no tool named {name:?}; list the tools to see what you may call"),
                None,
            )),
        }
    }
}

/// When the agent asked for progress (`_meta.progressToken`), a sink for the server's
/// notes and the task that passes each on to the agent under the agent's own token.
fn relay_progress(
    context: &RequestContext<RoleServer>,
) -> Option<(
    tokio::sync::mpsc::Sender<ProgressNotificationParam>,
    tokio::task::JoinHandle<()>,
)> {
    let token = context.meta.get_progress_token()?;
    let (sink, mut notes) =
        tokio::sync::mpsc::channel::<ProgressNotificationParam>(PROGRESS_BUFFER);
    let agent = context.peer.clone();
    let forwarder = tokio::spawn(async move {
        while let Some(mut note) = notes.recv().await {
            note.progress_token = token.clone();
            if agent.notify_progress(note).await.is_err() {
                return;
            }
        }
    });
    Some((sink, forwarder))
}

/// The agents' router: rmcp's streamable HTTP service at [`MCP_PATH`], behind the tokens.
pub fn router(gateway: Arc<Gateway>, tokens: Tokens) -> Router {
    let service = StreamableHttpService::new(
        move || {
            Ok(AgentHandler {
                gateway: gateway.clone(),
                watchers: Arc::default(),
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

    #[test]
    fn only_action_addresses_name_an_action() {
        assert_eq!(action_of_uri(&action_uri(42)), Some(42));
        for other in [
            "gate://action/",
            "gate://action/4x",
            "gate://action/-1",
            "file:///etc/passwd",
            "gate://action/1/../2",
        ] {
            assert_eq!(action_of_uri(other), None, "{other}");
        }
    }
}

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
use gatekeeper_mcp::{Ask, InputRetry, PROGRESS_BUFFER, PendingAsk, ReadRelay, ServerEvent};
use kernel::ActionState;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, CompleteRequestParams,
    CompleteResult, GetPromptRequestParams, GetPromptResponse, GetPromptResult, GetTaskParams,
    GetTaskResult, InputRequiredResult, ListPromptsResult, ListResourceTemplatesResult,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
    ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
    ResourceContents, ResourceUpdatedNotificationParam, ServerCapabilities, ServerConfig,
    SubscribeRequestParams, SubscriptionFilter, UnsubscribeRequestParams,
};
// Logging is deprecated in the protocol's newest revision, but 2025-11-25 clients use it.
#[allow(deprecated)]
use rmcp::model::SetLevelRequestParams;
use rmcp::service::{NotificationContext, RequestContext, RoleServer, SubscriptionContext};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, ServerHandler};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use crate::gateway::Gateway;
use crate::logs::{Listener, SessionLevel};
use crate::names::{prompt_of_name, resource_of_uri};
use crate::sessions::{SessionLimits, Sessions, named_session, opens_session};

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

/// The largest request body the gate reads to tell whether it opens a session (rmcp's own
/// cap on a request body).
const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// What the layer in front of rmcp holds: the agents' tokens and their sessions.
struct Gatehouse {
    tokens: Tokens,
    sessions: Sessions,
}

async fn authenticate(
    State(house): State<Arc<Gatehouse>>,
    mut request: Request,
    next: Next,
) -> Response {
    let agent = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .and_then(|token| house.tokens.agent(token.trim()))
        .map(str::to_owned);
    let Some(agent) = agent else {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "this gate needs `Authorization: Bearer <token>` with the token of an agent in its configuration\n",
        )
            .into_response();
    };
    // Whether this request opens a session: a POST that names none and carries an
    // initialize (the body is read here, within rmcp's own cap, and handed on whole).
    let named = named_session(&request);
    let method = request.method().clone();
    let mut opening = false;
    if named.is_none() && method == axum::http::Method::POST {
        let (parts, body) = request.into_parts();
        let bytes = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
            Ok(bytes) => bytes,
            Err(_) => {
                return (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "the request body is larger than the gate accepts (4 MiB) or could not be read\n",
                )
                    .into_response();
            }
        };
        opening = opens_session(&bytes);
        request = Request::from_parts(parts, axum::body::Body::from(bytes));
    }
    if let Err(refusal) = house
        .sessions
        .admit(&agent, named.as_deref(), opening)
        .await
    {
        return refusal;
    }
    request.extensions_mut().insert(AgentName(agent.clone()));
    let response = next.run(request).await;
    house
        .sessions
        .settle(&agent, &method, named.as_deref(), &response);
    response
}

/// One session's subscriptions, by the address the agent subscribed to: the task that
/// tells the agent of updates, and for a downstream resource its server and own address,
/// whose subscription ends with the agent's. Everything is released when the session
/// ends (its handler, the last holder, is dropped) or the agent unsubscribes.
struct Watchers {
    gateway: Arc<Gateway>,
    map: std::sync::Mutex<HashMap<String, Watcher>>,
}

struct Watcher {
    task: tokio::task::AbortHandle,
    downstream: Option<(String, String)>,
}

impl Watchers {
    fn new(gateway: Arc<Gateway>) -> Self {
        Self {
            gateway,
            map: std::sync::Mutex::new(HashMap::new()),
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Watcher>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keep `watcher` for `uri`; returns the one it replaces, for the caller to end.
    fn insert(&self, uri: String, watcher: Watcher) -> Option<Watcher> {
        let mut map = self.map();
        map.retain(|_, w| !w.task.is_finished() || w.downstream.is_some());
        map.insert(uri, watcher)
    }

    /// End one watcher: its task stops, and its downstream subscription is given up.
    async fn end(gateway: &Gateway, watcher: Watcher) {
        watcher.task.abort();
        if let Some((server, original)) = watcher.downstream {
            gateway.unsubscribe_resource(&server, &original).await;
        }
    }
}

impl Drop for Watchers {
    fn drop(&mut self) {
        let ended: Vec<Watcher> = self.map().drain().map(|(_, w)| w).collect();
        for watcher in &ended {
            watcher.task.abort();
        }
        let downstream: Vec<(String, String)> =
            ended.into_iter().filter_map(|w| w.downstream).collect();
        if downstream.is_empty() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let gateway = self.gateway.clone();
            runtime.spawn(async move {
                for (server, original) in downstream {
                    gateway.unsubscribe_resource(&server, &original).await;
                }
            });
        }
    }
}

/// The MCP server one agent session talks to.
#[derive(Clone)]
struct AgentHandler {
    gateway: Arc<Gateway>,
    /// This session's subscriptions.
    watchers: Arc<Watchers>,
    /// The log level this session asked for.
    level: SessionLevel,
    /// This session's label; when the last handle goes, the session has ended.
    session: Arc<SessionMark>,
}

/// An agent session's label, held while the session lasts: dropping the last handle
/// removes the grants made for it ([`Gateway::session_ended`]).
struct SessionMark {
    label: Arc<str>,
    gateway: Arc<Gateway>,
}

impl Drop for SessionMark {
    fn drop(&mut self) {
        self.gateway.session_ended(&self.label);
    }
}

/// What an agent's read that the server asks questions during is of, for the ledger.
#[derive(Clone, Copy)]
enum Asked<'a> {
    /// A tool call, by the agent's name for the tool.
    Tool(&'a str),
    /// A resource read or a prompt of this server.
    Server(&'a str),
}

impl AgentHandler {
    /// Run `call`, an agent's read, putting each question its server asks meanwhile (on
    /// `questions`) to the agent's client, and recording each exchange in the ledger.
    /// A question goes to the client from the task that serves the agent's request, so it
    /// travels on that request's stream.
    async fn answering<T>(
        &self,
        context: &RequestContext<RoleServer>,
        agent: &str,
        asked: Asked<'_>,
        mut questions: tokio::sync::mpsc::Receiver<PendingAsk>,
        call: impl std::future::Future<Output = T>,
    ) -> T {
        let mut call = std::pin::pin!(call);
        loop {
            tokio::select! {
                answer = &mut call => return answer,
                Some(question) = questions.recv() => {
                    let (what, answered) = put_to_agent(context, question.ask).await;
                    let detail = match &answered {
                        Ok(result) => result.to_string(),
                        Err(why) => format!("(no answer: {why})"),
                    };
                    match asked {
                        Asked::Tool(tool) => {
                            self.gateway.record_exchange(agent, tool, what, &detail).await;
                        }
                        Asked::Server(server) => {
                            self.gateway
                                .record_server_exchange(agent, server, what, &detail)
                                .await;
                        }
                    }
                    let _ = question.reply.send(answered);
                }
            }
        }
    }

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

    /// Pass on every update `server` announces of its resource `original` by calling
    /// `tell`, until `tell` fails or the server's connection is gone.
    async fn watch_resource<F, Fut>(
        mut events: tokio::sync::broadcast::Receiver<ServerEvent>,
        original: String,
        mut tell: F,
    ) where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        use tokio::sync::broadcast::error::RecvError;
        loop {
            match events.recv().await {
                Ok(ServerEvent::ResourceUpdated(uri)) if uri == original => {
                    if !tell().await {
                        return;
                    }
                }
                Ok(_) => {}
                // Missed announcements may have been of this resource: say it changed.
                Err(RecvError::Lagged(_)) => {
                    if !tell().await {
                        return;
                    }
                }
                Err(RecvError::Closed) => return,
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

/// A JSON answer from the gateway as the typed result rmcp sends, or an internal error
/// (the server's answer did not have the protocol's shape). The era's framing is the
/// gate's, for its own peer: a result without a `resultType` (a server on an older
/// protocol, or the gate's own listing) is a complete one, which rmcp leaves out again for
/// an agent on an older protocol.
fn typed<T: serde::de::DeserializeOwned>(mut answer: Value) -> Result<T, ErrorData> {
    if let Some(fields) = answer.as_object_mut() {
        fields
            .entry("resultType")
            .or_insert_with(|| Value::String("complete".to_owned()));
    }
    serde_json::from_value(answer).map_err(|e| {
        ErrorData::internal_error(
            format!("the server's answer does not have the protocol's shape ({e})"),
            None,
        )
    })
}

/// A forwarded request the gateway refused: no such resource or prompt for this agent
/// (`None`), or the server's failure, said to the agent.
fn forward_error(what: &str, failure: Option<String>) -> ErrorData {
    match failure {
        None => ErrorData::resource_not_found(
            format!("no {what} of yours has that name; list them to see what you may use"),
            None,
        ),
        Some(message) => ErrorData::internal_error(message, None),
    }
}

/// A listing from the gateway, or the failure said to the agent.
fn listed(answer: Result<Vec<Value>, String>) -> Result<Vec<Value>, ErrorData> {
    answer.map_err(|message| ErrorData::internal_error(message, None))
}

/// Whether the agent speaks protocol 2026-07-28 or later, and so takes a server's
/// `input_required` answer itself and calls again with its answers.
fn takes_input_required(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str())
}

/// The per-call context of an agent's forwarded resource read or prompt: its cancellation
/// (no progress: the caller wires that for tool calls, where servers send it), where the
/// server's questions go (the receiver, for [`AgentHandler::answering`]), and on protocol
/// 2026-07-28 its `retry` of an earlier `input_required` answer, passed down.
fn forwarded_read(
    context: &RequestContext<RoleServer>,
    retry: Option<InputRetry>,
) -> (CallContext, tokio::sync::mpsc::Receiver<PendingAsk>) {
    let (asks, questions) = tokio::sync::mpsc::channel::<PendingAsk>(1);
    let relay = ReadRelay::new(None, context.ct.clone())
        .with_asks(asks)
        .with_input(takes_input_required(context), retry);
    (CallContext::new(relay), questions)
}

/// A forwarded answer that asks the agent for input first (protocol 2026-07-28), as the
/// server sent it; `None` for any other answer.
fn input_required(answer: &Value) -> Option<Result<InputRequiredResult, ErrorData>> {
    (answer.get("resultType").and_then(Value::as_str) == Some("input_required")).then(|| {
        serde_json::from_value(answer.clone()).map_err(|e| {
            ErrorData::internal_error(
                format!("the server asked for input in a form the gate cannot read ({e})"),
                None,
            )
        })
    })
}

impl ServerHandler for AgentHandler {
    #[allow(deprecated)] // the logging capability: see `set_level`
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .enable_resources()
                .enable_resources_subscribe()
                .enable_prompts()
                .enable_completions()
                .enable_logging()
                .enable_tasks()
                .build(),
        )
        .with_instructions(
            "Writes are held for a person's approval: a staged call answers at once with an action id; call gate_action_result with it for the outcome, or listen to the resource gate://action/<id> to be told when it is decided.",
        )
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let Some(agent) = agent_of(&context) else {
            return Ok(ListResourcesResult::default());
        };
        let resources = listed(
            self.gateway
                .list_forwarded(&agent, "resources/list", "resources")
                .await,
        )?;
        typed(json!({"resources": resources}))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let Some(agent) = agent_of(&context) else {
            return Ok(ListResourceTemplatesResult::default());
        };
        let templates = listed(
            self.gateway
                .list_forwarded(&agent, "resources/templates/list", "resourceTemplates")
                .await,
        )?;
        typed(json!({"resourceTemplates": templates}))
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let Some(agent) = agent_of(&context) else {
            return Ok(ListPromptsResult::default());
        };
        let prompts = listed(
            self.gateway
                .list_forwarded(&agent, "prompts/list", "prompts")
                .await,
        )?;
        typed(json!({"prompts": prompts}))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let agent = agent_of(&context).ok_or_else(|| forward_error("prompt", None))?;
        let arguments = request
            .arguments
            .map(|a| serde_json::to_value(a).unwrap_or_default());
        let retry = InputRetry::of(request.input_responses, request.request_state);
        let (read, questions) = forwarded_read(&context, retry);
        let server = prompt_of_name(&request.name).map_or("", |(server, _)| server);
        let got = self
            .gateway
            .get_prompt(&agent, &request.name, arguments, read);
        let answer = self
            .answering(&context, &agent, Asked::Server(server), questions, got)
            .await
            .map_err(|failure| forward_error("prompt", failure))?;
        if let Some(needed) = input_required(&answer) {
            return Ok(GetPromptResponse::InputRequired(needed?));
        }
        Ok(typed::<GetPromptResult>(answer)?.into())
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        let agent = agent_of(&context).ok_or_else(|| forward_error("prompt or resource", None))?;
        let params = serde_json::to_value(&request).unwrap_or_default();
        let answer = self
            .gateway
            .complete(&agent, params)
            .await
            .map_err(|failure| forward_error("prompt or resource", failure))?;
        typed(answer)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let not_found = || {
            ErrorData::resource_not_found(
                format!(
                    "no resource {:?}; your actions are gate://action/<id>, with the id a staged call returned, and your servers' resources are listed by resources/list",
                    request.uri
                ),
                None,
            )
        };
        let agent = agent_of(&context).ok_or_else(not_found)?;
        let Some(id) = action_of_uri(&request.uri) else {
            let retry = InputRetry::of(
                request.input_responses.clone(),
                request.request_state.clone(),
            );
            let (read, questions) = forwarded_read(&context, retry);
            let server = resource_of_uri(&request.uri).map_or("", |(server, _)| server);
            let reading = self.gateway.read_resource(&agent, &request.uri, read);
            let answer = self
                .answering(&context, &agent, Asked::Server(server), questions, reading)
                .await
                .map_err(|failure| match failure {
                    None => not_found(),
                    Some(message) => ErrorData::internal_error(message, None),
                })?;
            if let Some(needed) = input_required(&answer) {
                return Ok(ReadResourceResponse::InputRequired(needed?));
            }
            return Ok(typed::<ReadResourceResult>(answer)?.into());
        };
        self.gateway
            .action_state(&agent, id)
            .ok_or_else(not_found)?;
        let outcome = self
            .gateway
            .action_outcome(&agent, id)
            .await
            .ok_or_else(not_found)?;
        let text = crate::gateway::text_of(&outcome);
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
                format!(
                    "no resource {uri:?}; your actions are gate://action/<id>, and your servers' resources are listed by resources/list"
                ),
                None,
            )
        };
        let agent = agent_of(&context).ok_or_else(not_found)?;
        let peer = context.peer.clone();
        let told = uri.clone();
        let tell = move || {
            let peer = peer.clone();
            let uri = told.clone();
            async move {
                peer.notify_resource_updated(ResourceUpdatedNotificationParam::new(uri))
                    .await
                    .is_ok()
            }
        };
        let watcher = match action_of_uri(&uri) {
            Some(id) => {
                self.gateway
                    .action_state(&agent, id)
                    .ok_or_else(not_found)?;
                Watcher {
                    task: tokio::spawn(Self::watch(self.gateway.clone(), agent, id, tell))
                        .abort_handle(),
                    downstream: None,
                }
            }
            None => {
                let (server, original) = self
                    .gateway
                    .subscribe_resource(&agent, &uri)
                    .await
                    .map_err(|failure| match failure {
                        None => not_found(),
                        Some(message) => ErrorData::internal_error(message, None),
                    })?;
                let events = server.events();
                let (name, watched) = (server.config().name.clone(), original.clone());
                Watcher {
                    task: tokio::spawn(Self::watch_resource(events, watched, tell)).abort_handle(),
                    downstream: Some((name, original)),
                }
            }
        };
        if let Some(old) = self.watchers.insert(uri, watcher) {
            Watchers::end(&self.gateway, old).await;
        }
        Ok(())
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let ended = self.watchers.map().remove(&request.uri);
        if let Some(watcher) = ended {
            Watchers::end(&self.gateway, watcher).await;
        }
        Ok(())
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        // Actions and servers' resources; whose they are is checked while listening,
        // where the agent is known.
        let uris: Vec<String> = requested
            .resource_subscriptions
            .iter()
            .flatten()
            .filter(|uri| action_of_uri(uri).is_some() || resource_of_uri(uri).is_some())
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
        // One watcher for each of the agent's own actions and each resource of its
        // servers; others' stay silent.
        let mut watchers = Vec::new();
        let mut downstream = Vec::new();
        for uri in context.accepted().resource_subscriptions.iter().flatten() {
            let sink = context.sink().clone();
            let told = uri.clone();
            let tell = move || {
                let sink = sink.clone();
                let uri = told.clone();
                async move { sink.notify_resource_updated(uri).await.is_ok() }
            };
            if let Some(id) = action_of_uri(uri) {
                if self.gateway.action_state(&agent, id).is_some() {
                    watchers.push(tokio::spawn(Self::watch(
                        self.gateway.clone(),
                        agent.clone(),
                        id,
                        tell,
                    )));
                }
            } else if let Ok((server, original)) =
                self.gateway.subscribe_resource(&agent, uri).await
            {
                watchers.push(tokio::spawn(Self::watch_resource(
                    server.events(),
                    original.clone(),
                    tell,
                )));
                downstream.push((server.config().name.clone(), original));
            }
        }
        context.cancelled().await;
        for watcher in watchers {
            watcher.abort();
        }
        for (server, original) in downstream {
            self.gateway.unsubscribe_resource(&server, &original).await;
        }
        Ok(())
    }

    /// Remembered, to be told when a person accepts a new catalog.
    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let Some(agent) = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<AgentName>())
            .map(|a| a.0.clone())
        else {
            return;
        };
        self.gateway.add_peer(Listener {
            agent,
            peer: context.peer,
            level: self.level.clone(),
            session: Some(self.session.label.clone()),
        });
    }

    /// The level of the servers' log this session hears from now on ([`crate::logs`]).
    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.level.set(request.level);
        Ok(())
    }

    /// A task stands for one of the agent's actions ([`Gateway::task`]).
    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let unknown = || {
            ErrorData::invalid_params(
                format!(
                    "you have no task {:?}; a staged write's task is gate-action-<id>",
                    request.task_id
                ),
                None,
            )
        };
        let agent = agent_of(&context).ok_or_else(unknown)?;
        let id = crate::gateway::action_of_task(&request.task_id).ok_or_else(unknown)?;
        let task = self.gateway.task(&agent, id).await.ok_or_else(unknown)?;
        Ok(GetTaskResult::new(task))
    }

    /// A staged write belongs to the person once staged: its task cannot be cancelled.
    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Err(ErrorData::invalid_request(
            format!(
                "task {:?} is a staged write, and once staged it is the person's to approve or reject; it was not cancelled (ask the person to reject it)",
                request.task_id
            ),
            None,
        ))
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
        let (asks, questions) = tokio::sync::mpsc::channel::<PendingAsk>(1);
        // An agent on protocol 2026-07-28 takes a server's `input_required` answer itself
        // and calls again with its answers, which go down untouched.
        let modern = takes_input_required(&context);
        let retry = InputRetry::of(request.input_responses, request.request_state);
        let relay = ReadRelay::new(
            progress.as_ref().map(|(sink, _)| sink.clone()),
            context.ct.clone(),
        )
        .with_asks(asks)
        .with_input(modern, retry);
        let call = self.gateway.call_tool_in(
            &agent,
            &name,
            args,
            CallContext::new(relay),
            Some(Listener {
                agent: agent.clone(),
                peer: context.peer.clone(),
                level: self.level.clone(),
                session: Some(self.session.label.clone()),
            }),
            context
                .client_capabilities()
                .is_some_and(|c| c.supports_tasks()),
        );
        let answer = self
            .answering(&context, &agent, Asked::Tool(&name), questions, call)
            .await;
        // Every note the server sent before its answer reaches the agent before the answer:
        // the relay's senders are gone with the call, so the forwarder ends once it has
        // passed the last one on.
        if let Some((sink, forwarder)) = progress {
            drop(sink);
            let _ = forwarder.await;
        }
        match answer {
            Some(answer) => Ok(answer),
            None => Err(ErrorData::invalid_params(
                format!("no tool named {name:?}; list the tools to see what you may call"),
                None,
            )),
        }
    }
}

/// Put a server's question to the agent's client, if it declared it takes such questions;
/// returns what kind of question it was, and the answer as JSON or why there is none.
#[allow(deprecated)] // sampling and elicitation: deprecated in the newest revision, in use
async fn put_to_agent(
    context: &RequestContext<RoleServer>,
    ask: Ask,
) -> (&'static str, Result<Value, String>) {
    let declared = context
        .peer
        .peer_info()
        .map(|info| info.capabilities.clone());
    match ask {
        Ask::Sampling(params) => {
            if declared.as_ref().is_none_or(|c| c.sampling.is_none()) {
                return (
                    "sampling",
                    Err("the agent's client does not take sampling requests".to_owned()),
                );
            }
            let answered = context.peer.create_message(params).await;
            ("sampling", to_json(answered))
        }
        Ask::Elicitation(params) => {
            if declared.as_ref().is_none_or(|c| c.elicitation.is_none()) {
                return (
                    "elicitation",
                    Err("the agent's client does not take elicitation requests".to_owned()),
                );
            }
            let answered = context.peer.create_elicitation(params).await;
            ("elicitation", to_json(answered))
        }
    }
}

fn to_json<T: serde::Serialize>(answer: Result<T, rmcp::ServiceError>) -> Result<Value, String> {
    match answer {
        Ok(result) => serde_json::to_value(result).map_err(|e| e.to_string()),
        Err(error) => Err(format!(
            "the agent's client answered with an error: {error}"
        )),
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

/// The agents' router: rmcp's streamable HTTP service at [`MCP_PATH`], behind the tokens
/// and the session bindings ([`crate::sessions`]). rmcp checks `Host` (loopback names, and
/// the configuration's `host` for agents on other machines) and `Origin`: a request from a browser page is refused unless its origin is in
/// `limits.allowed_origins` (none by default); clients that send no `Origin` (agents,
/// SDKs) pass.
pub fn router(gateway: Arc<Gateway>, tokens: Tokens, limits: &HttpLimits) -> Router {
    let manager = Arc::new(LocalSessionManager::default());
    let service = StreamableHttpService::new(
        move || {
            Ok(AgentHandler {
                gateway: gateway.clone(),
                watchers: Arc::new(Watchers::new(gateway.clone())),
                level: SessionLevel::default(),
                session: Arc::new(SessionMark {
                    label: gateway.open_session(),
                    gateway: gateway.clone(),
                }),
            })
        },
        manager.clone(),
        StreamableHttpServerConfig::default()
            .with_allowed_hosts(
                ["localhost", "127.0.0.1", "::1"]
                    .map(str::to_owned)
                    .into_iter()
                    .chain(limits.allowed_hosts.iter().cloned()),
            )
            .with_allowed_origins(limits.allowed_origins.iter().cloned())
            .enforce_origin_validation(),
    );
    let house = Gatehouse {
        tokens,
        sessions: Sessions::new(manager, limits.sessions),
    };
    Router::new()
        .nest_service(MCP_PATH, service)
        .layer(middleware::from_fn_with_state(
            Arc::new(house),
            authenticate,
        ))
}

/// What the agents' HTTP endpoint allows: browsers' origins, connections, how long a
/// request's head may take, sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpLimits {
    /// Browser origins allowed to call the endpoint (`allowed_origins`); none by default.
    pub allowed_origins: Vec<String>,
    /// Host names allowed in requests besides loopback's (`host`, for agents on other
    /// machines over TLS); none by default.
    pub allowed_hosts: Vec<String>,
    /// The most connections open at once (`max_connections`); more wait to be accepted.
    pub max_connections: usize,
    /// How long a connection may take to send a request's head (`header_timeout_seconds`),
    /// also the longest an idle kept-alive connection stays open.
    pub header_timeout: std::time::Duration,
    /// How many sessions may be open.
    pub sessions: SessionLimits,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            allowed_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            max_connections: 256,
            header_timeout: std::time::Duration::from_secs(10),
            sessions: SessionLimits::default(),
        }
    }
}

/// Serve `router` on `listener` until `stop` turns true, within `limits`: at most
/// `max_connections` at once (the rest wait in the listener's queue), each dropped if it
/// takes longer than `header_timeout` to send a request's head (or stays idle that long
/// between requests). An error accepting a connection (descriptors exhausted) is logged
/// and retried, never the end of the endpoint. On stop, connections finish the request
/// in hand. With `tls`, each connection's handshake comes first, within the same
/// `header_timeout`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: &HttpLimits,
    mut stop: tokio::sync::watch::Receiver<bool>,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    use hyper_util::service::TowerToHyperService;
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let header_timeout = limits.header_timeout;
    let mut connections = tokio::task::JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = stopped(&mut stop) => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    tracing::warn!(%error, "agents.accept.failed: trying again shortly");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = stopped(&mut stop) => break,
        };
        // Each answer leaves at once: with Nagle's algorithm on, an event written after
        // the response's head waited for the client's delayed acknowledgement of it
        // (40 ms and more per call through the stdio bridge, docs/performance.md).
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "agents.nodelay.failed");
        }
        let service = TowerToHyperService::new(router.clone());
        let stop = stop.clone();
        let tls = tls.clone();
        connections.spawn(async move {
            let _permit = permit;
            match tls {
                None => serve_connection(stream, service, header_timeout, stop).await,
                Some(acceptor) => {
                    match tokio::time::timeout(header_timeout, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            serve_connection(stream, service, header_timeout, stop).await;
                        }
                        Ok(Err(error)) => tracing::debug!(%error, "tls.handshake.failed"),
                        Err(_) => tracing::debug!("tls.handshake.timed_out"),
                    }
                }
            }
        });
    }
    // Each connection finishes the request in hand.
    while connections.join_next().await.is_some() {}
}

/// Serve one connection's requests until it closes or `stop` turns true (then the request
/// in hand finishes).
async fn serve_connection<S>(
    stream: S,
    service: hyper_util::service::TowerToHyperService<Router>,
    header_timeout: std::time::Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use hyper_util::rt::{TokioIo, TokioTimer};
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    let connection = builder
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    let mut connection = std::pin::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => {}
        () = stopped(&mut stop) => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}

/// Until `stop` turns true (or its sender is gone).
async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
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

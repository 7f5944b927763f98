//! [`McpServer`]: a downstream MCP server seen through gatekeeper-core's service port.
//!
//! # What a caller can rely on
//!
//! - **Every downstream request has a deadline** (the server's, [`McpServerConfig::deadline`]):
//!   the handshake, each `tools/list` page, each `tools/call`.
//! - **Nothing is re-sent.** [`ToolService::call`] sends `tools/call` at most once per
//!   invocation and sorts failures by whether the request left:
//!   - before it left (the server cannot be started, the handshake fails, the catalog
//!     cannot be read, the tool changed or disappeared since staging, the connection was
//!     already closed): [`CallError::NotDispatched`], so a person may approve again;
//!   - after it left (deadline passed, connection lost, the server crashed, an answer that
//!     is not a tool result): [`CallError::Unknown`], so the action store never sends it
//!     again;
//!   - a tool error (`isError: true`) is the tool's answer, returned as a [`ToolResult`]
//!     with `is_error` set; a JSON-RPC error answer is the server's refusal of the request,
//!     [`CallError::Answered`]: final, never retried, and never reported as applied.
//! - **Every page of the catalog is read** (`tools/list` followed cursor by cursor); one
//!   longer than [`McpServerConfig::max_catalog_pages`] is refused whole, never cut.
//! - **A call runs only against the definition it was classified and staged with.** Each
//!   tool of the gatekeeper carries the digest of its definition ([`crate::catalog`]),
//!   which the action store keeps with a staged call and hands back on apply
//!   ([`ToolService::call_defined`]); before a call, the server's current definition of
//!   the tool must have the same digest, or the call is refused before anything is sent. For a
//!   write (anything the classifier does not call a read) the catalog is re-read before
//!   every call, so a server that swaps a tool without announcing it is caught too; for a
//!   read the cached catalog is used until the server announces a change
//!   (`notifications/tools/list_changed`) or the connection is restarted.
//! - A server that exited is started again on its next use; a call whose request had not
//!   left when it exited is unaffected, one whose request had left is "outcome unknown".
//!   A start that fails is not tried again before a backoff that doubles with each failure
//!   ([`crate::backoff`]); calls meanwhile fail as not sent.
//!
//! The classifier ([`gatekeeper_core::classify`]) alone decides read vs write: this
//! module asks it, and never reads annotations itself.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use gatekeeper_core::{
    ActionStore, CallContext, CallError, GatekeeperConfig, ServerTrust, Tool, ToolGatekeeper,
    ToolResult, ToolService, classify,
};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientRequest, ListToolsRequest,
    PaginatedRequestParams, ServerResult,
};
use rmcp::service::{Peer, RoleClient};
use serde_json::Value;
use tokio::sync::{Mutex, broadcast};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::backoff::Backoff;
use crate::catalog::{Catalog, CatalogTool};
use crate::connection::{
    self, Connection, EVENT_BUFFER, Endpoint, Failure, Protocol, ServerEvent, Wiring, seconds,
};
use crate::oauth::{self, NotReady};
use crate::relay::{Asker, InputRetry, ReadRelay, SharedRoutes, person_in_scope, person_window};
use crate::rounds;
use crate::stderr::StderrTail;

/// The largest answer of a stdio server the gate reads unless its configuration says
/// otherwise (rmcp's own cap on a line).
pub const DEFAULT_MAX_RESULT_BYTES: usize = 16 * 1024 * 1024;

/// The deadline of a downstream request when the configuration names none.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(60);

/// The most `tools/list` pages read from one server unless its configuration says
/// otherwise. A catalog that goes on past its cap is an error, never cut short.
pub const DEFAULT_MAX_CATALOG_PAGES: usize = 1000;

/// How to reach and present one downstream server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpServerConfig {
    /// The gatekeeper's name: unique among the kernel's gatekeepers.
    pub name: String,
    /// The name a person sees in prompts.
    pub server_name: String,
    /// How to start or reach it.
    pub endpoint: Endpoint,
    /// How far its annotations are believed. [`ServerTrust::Byo`] unless a person vetted it.
    pub trust: ServerTrust,
    /// The deadline of every request to it.
    pub deadline: Duration,
    /// The most `tools/list` pages its catalog may have; one longer is refused whole.
    pub max_catalog_pages: usize,
    /// The tools the person lists as reads, whatever the server claims.
    pub reads: Vec<String>,
    /// Whether the server may ask an agent's model for completions during a read
    /// (sampling); off unless the person allows it.
    pub forward_sampling: bool,
    /// Whether the server may ask an agent's user for input during a read (elicitation);
    /// off unless the person allows it.
    pub forward_elicitation: bool,
    /// The largest answer of a stdio server the gate reads, in bytes; a larger one is
    /// replaced by the gate's note ([`crate::oversize`]).
    pub max_result_bytes: usize,
    /// The longest a question the server asks during a person's send waits for the
    /// person ([`crate::relay::for_person`]); `None`: until shortly before the send's
    /// deadline. Either way it is declined before the deadline.
    pub question_wait: Option<Duration>,
    /// Which protocol era the gate speaks to it.
    pub protocol: Protocol,
}

impl McpServerConfig {
    /// A bring-your-own server with the default deadline, shown under its name.
    pub fn new(name: impl Into<String>, endpoint: impl Into<Endpoint>) -> Self {
        let name = name.into();
        Self {
            server_name: name.clone(),
            name,
            endpoint: endpoint.into(),
            trust: ServerTrust::Byo,
            deadline: DEFAULT_DEADLINE,
            max_catalog_pages: DEFAULT_MAX_CATALOG_PAGES,
            reads: Vec::new(),
            forward_sampling: false,
            forward_elicitation: false,
            max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
            question_wait: None,
            protocol: Protocol::Initialize,
        }
    }

    /// The same server, reached on protocol era `protocol`.
    pub fn protocol(mut self, protocol: Protocol) -> Self {
        self.protocol = protocol;
        self
    }

    /// The same server, declining a question asked during a person's send once it has
    /// waited `wait` for the person (at most until shortly before the send's deadline).
    pub fn question_wait(mut self, wait: Option<Duration>) -> Self {
        self.question_wait = wait;
        self
    }

    /// The same server with another cap on the size of one answer.
    pub fn max_result_bytes(mut self, bytes: usize) -> Self {
        self.max_result_bytes = bytes.max(1024);
        self
    }

    /// The same server, letting its sampling and elicitation questions through to the
    /// agent whose read asks.
    pub fn forward_questions(mut self, sampling: bool, elicitation: bool) -> Self {
        self.forward_sampling = sampling;
        self.forward_elicitation = elicitation;
        self
    }

    /// The same server with the person's own list of its reads.
    pub fn reads(mut self, reads: Vec<String>) -> Self {
        self.reads = reads;
        self
    }

    /// The same server with another cap on its catalog's pages (at least one).
    pub fn max_catalog_pages(mut self, pages: usize) -> Self {
        self.max_catalog_pages = pages.max(1);
        self
    }

    /// The same server with another trust tier.
    pub fn trust(mut self, trust: ServerTrust) -> Self {
        self.trust = trust;
        self
    }

    /// The same server with another deadline.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }
}

/// Why a downstream server could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// The server could not be started, or its catalog could not be read.
    #[error("downstream server {server:?} is not usable: {message}")]
    Unavailable {
        /// The server's configured name.
        server: String,
        /// What happened and what to check.
        message: String,
    },
}

/// A downstream MCP server: the [`ToolService`] of its gatekeeper.
pub struct McpServer {
    config: McpServerConfig,
    connection: Mutex<Option<Connection>>,
    /// When the server may be started again after failed starts (taken while starting).
    backoff: Mutex<Backoff>,
    /// Set when the server announced a changed tool list, or was restarted.
    stale: Arc<AtomicBool>,
    /// Where the progress of agents' reads in flight goes ([`crate::relay`]).
    progress: SharedRoutes,
    /// What the server announces about its resources and prompts.
    events: broadcast::Sender<ServerEvent>,
    /// The capabilities the server declared when it last started, as JSON.
    capabilities: RwLock<Value>,
    /// The last lines a stdio server wrote to its stderr.
    stderr: Arc<StderrTail>,
    catalog: RwLock<Arc<Catalog>>,
    /// Set while the server waits for the person's `gate login` (told once per wait).
    login_needed: AtomicBool,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl McpServer {
    /// Start the server and read its catalog.
    pub async fn connect(config: McpServerConfig) -> Result<Arc<Self>, McpError> {
        let stderr = Arc::new(StderrTail::named(config.name.clone()));
        let server = Arc::new(Self {
            config,
            connection: Mutex::new(None),
            backoff: Mutex::new(Backoff::default()),
            stale: Arc::new(AtomicBool::new(true)),
            progress: SharedRoutes::default(),
            events: broadcast::channel(EVENT_BUFFER).0,
            capabilities: RwLock::new(Value::Null),
            stderr,
            catalog: RwLock::new(Arc::default()),
            login_needed: AtomicBool::new(false),
        });
        server
            .refresh()
            .await
            .map_err(|message| McpError::Unavailable {
                server: server.config.name.clone(),
                message,
            })?;
        Ok(server)
    }

    /// A server that did not start, offered with `last` (the catalog a person accepted
    /// earlier) until it does: every call tries to start it again (within the backoff of
    /// failed starts), and so does every read of its catalog. `why` is logged.
    pub fn unavailable(config: McpServerConfig, last: Arc<Catalog>, why: &str) -> Arc<Self> {
        warn!(server = %config.name, %why, "downstream.unavailable: offered with the catalog a person accepted, and tried again at each call");
        let mut backoff = Backoff::default();
        backoff.failed(Instant::now());
        Arc::new(Self {
            stderr: Arc::new(StderrTail::named(config.name.clone())),
            config,
            connection: Mutex::new(None),
            backoff: Mutex::new(backoff),
            stale: Arc::new(AtomicBool::new(true)),
            progress: SharedRoutes::default(),
            events: broadcast::channel(EVENT_BUFFER).0,
            capabilities: RwLock::new(Value::Null),
            catalog: RwLock::new(last),
            login_needed: AtomicBool::new(false),
        })
    }

    /// Its configuration.
    pub fn config(&self) -> &McpServerConfig {
        &self.config
    }

    /// The catalog as last read.
    pub fn catalog(&self) -> Arc<Catalog> {
        self.catalog
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether the server announced a changed catalog (or was restarted) since it was
    /// last read.
    pub fn is_stale(&self) -> bool {
        self.stale.load(Ordering::SeqCst)
    }

    /// A gatekeeper over the catalog as last read, calling this server and keeping its
    /// actions in `store`. See [`McpServer::gatekeeper_over`].
    pub fn gatekeeper(self: &Arc<Self>, store: ActionStore) -> ToolGatekeeper {
        self.gatekeeper_over(&self.catalog(), store)
    }

    /// A gatekeeper over `accepted` (the catalog a person accepted, which may be older
    /// than the server's current one), calling this server and keeping its actions in
    /// `store`. Its tools carry their definition digests; the action kinds are scoped
    /// `mcp:<name>` and named after the tool alone, so a rule outlives a new definition
    /// (each call is still checked against the definition it was staged with).
    /// [`ToolGatekeeper::replace_tools`] with [`Catalog::gatekeeper_tools`] accepts a
    /// newer catalog later.
    pub fn gatekeeper_over(
        self: &Arc<Self>,
        accepted: &Catalog,
        store: ActionStore,
    ) -> ToolGatekeeper {
        let config = GatekeeperConfig {
            name: self.config.name.clone(),
            server_name: self.config.server_name.clone(),
            endpoint: self.config.endpoint.display(),
            trust: self.config.trust,
            scope: format!("mcp:{}", self.config.name),
            reads: self.config.reads.clone(),
        };
        ToolGatekeeper::new(config, accepted.gatekeeper_tools(), self.clone(), store)
    }

    /// A peer on a live connection, starting the server if it is not running.
    async fn peer(&self) -> Result<Peer<RoleClient>, String> {
        let mut slot = self.connection.lock().await;
        if let Some(connection) = slot.as_ref() {
            if connection.is_alive() {
                let Some(auth) = connection.auth() else {
                    return Ok(connection.peer());
                };
                // A server reached with OAuth: the request goes out only with a valid
                // token (refreshed now if it nears expiry), or not at all.
                match auth.ready().await {
                    Ok(()) => return Ok(connection.peer()),
                    Err(NotReady::Login(message)) => {
                        self.needs_login(&message);
                        return Err(message);
                    }
                    Err(NotReady::Later(message)) => return Err(message),
                    Err(NotReady::Relogged) => {
                        info!(server = %self.config.name, "downstream.relogged: connecting with the new login");
                    }
                }
            } else {
                warn!(server = %self.config.name, "downstream.exited: starting it again");
            }
            // A restarted server may list other tools.
            self.stale.store(true, Ordering::SeqCst);
            *slot = None;
        }
        let mut backoff = self.backoff.lock().await;
        if let Err(wait) = backoff.check(Instant::now()) {
            return Err(format!(
                "the server {:?} is unavailable: it failed to start and is not tried again for another {}; check its command or address, and the gate's log",
                self.config.name,
                seconds(wait)
            ));
        }
        let wiring = Wiring {
            name: self.config.name.clone(),
            stale: self.stale.clone(),
            progress: self.progress.clone(),
            events: self.events.clone(),
            stderr: self.stderr.clone(),
            capabilities: connection::capabilities(
                self.config.forward_sampling,
                self.config.forward_elicitation,
            ),
            max_result_bytes: self.config.max_result_bytes,
            protocol: self.config.protocol,
        };
        let connection = match Connection::start(
            &self.config.endpoint,
            self.config.deadline,
            wiring,
        )
        .await
        {
            Ok(connection) => connection,
            Err(message) if oauth::is_login_needed(&message) => {
                // Not a failure to back off from: the person's login is awaited, and the
                // next call after it connects at once.
                self.needs_login(&message);
                return Err(message);
            }
            Err(message) => {
                let wait = backoff.failed(Instant::now());
                warn!(server = %self.config.name, %message, wait = %seconds(wait), "downstream.start.failed");
                return Err(message);
            }
        };
        backoff.succeeded();
        info!(server = %self.config.name, "downstream.started");
        *self.capabilities.write().unwrap_or_else(|p| p.into_inner()) = connection.capabilities();
        let peer = connection.peer();
        *slot = Some(connection);
        Ok(peer)
    }

    /// Say once that the server waits for the person's login: a
    /// [`ServerEvent::LoginNeeded`] for whoever listens (the gate's notifier), until a
    /// request carries a token again.
    fn needs_login(&self, message: &str) {
        if !self.login_needed.swap(true, Ordering::SeqCst) {
            warn!(server = %self.config.name, %message, "downstream.login-needed");
            let _ = self
                .events
                .send(ServerEvent::LoginNeeded(message.to_owned()));
        }
    }

    /// A failure as the agent and the person read it: a refusal of the request's
    /// credentials says what the person must do (and a want of scope is kept for the
    /// next login); every other failure is as it was.
    async fn explained(&self, failure: Failure) -> Failure {
        let Failure::Refused(challenge) = failure else {
            return failure;
        };
        let auth = self
            .connection
            .lock()
            .await
            .as_ref()
            .and_then(|c| c.auth().cloned());
        match (auth, &self.config.endpoint) {
            (Some(auth), Endpoint::Http(http)) => {
                let message = auth.refused(&challenge, &http.url).await;
                self.needs_login(&message);
                Failure::NotSent(message)
            }
            _ => Failure::NotSent(oauth::STATIC_REFUSAL.to_owned()),
        }
    }

    /// Read the catalog again (every page of `tools/list`, each under the deadline).
    pub async fn refresh(&self) -> Result<Arc<Catalog>, String> {
        let peer = self.peer().await?;
        // Cleared before the read: a change announced while it runs marks it stale again.
        self.stale.store(false, Ordering::SeqCst);
        let listed = self.list_raw(&peer).await;
        let raw_tools = match listed {
            Ok(tools) => tools,
            Err(message) => {
                self.stale.store(true, Ordering::SeqCst);
                return Err(message);
            }
        };
        let catalog = Arc::new(Catalog::from_raw_tools(&self.config.name, raw_tools));
        *self.catalog.write().unwrap_or_else(|p| p.into_inner()) = catalog.clone();
        Ok(catalog)
    }

    /// Every page of `tools/list`, in order. A catalog that goes on past the configured
    /// cap, or whose cursor comes back to a page already read, is refused whole: a
    /// catalog cut short would hide tools without a word.
    async fn list_raw(&self, peer: &Peer<RoleClient>) -> Result<Vec<Value>, String> {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        let mut seen = std::collections::HashSet::new();
        for _ in 0..self.config.max_catalog_pages {
            let request = ClientRequest::ListToolsRequest(ListToolsRequest {
                method: Default::default(),
                params: cursor
                    .take()
                    .map(|c| PaginatedRequestParams::default().with_cursor(Some(c))),
                extensions: Default::default(),
            });
            let reply = match connection::request(peer, request, self.config.deadline).await {
                Ok(reply) => reply,
                Err(failure) => {
                    let (Failure::NotSent(m)
                    | Failure::AfterSend(m)
                    | Failure::Answered(m)
                    | Failure::Refused(m)) = self.explained(failure).await;
                    return Err(format!("could not read the tool list: {m}"));
                }
            };
            // Whatever variant rmcp matched, the raw JSON is what counts.
            let mut page = serde_json::to_value(&reply)
                .map_err(|e| format!("could not read the tool list: {e}"))?;
            match page.get_mut("tools").map(Value::take) {
                Some(Value::Array(listed)) => tools.extend(listed),
                _ => return Err("the tool list reply has no \"tools\" array".to_owned()),
            }
            match page.get("nextCursor").and_then(Value::as_str) {
                Some(next) if !next.is_empty() => {
                    if !seen.insert(next.to_owned()) {
                        return Err(format!(
                            "the server's tool list came back to a page it had already given (cursor {next:?}) after {} tools; it is not read further, so nothing of it is used: report this to the server's maintainers",
                            tools.len()
                        ));
                    }
                    cursor = Some(next.to_owned());
                }
                _ => return Ok(tools),
            }
        }
        Err(format!(
            "the server's tool list goes on past {} pages ({} tools so far), the cap set for it, so none of it is used; raise max_catalog_pages in its [[server]] table if it really lists that many",
            self.config.max_catalog_pages,
            tools.len()
        ))
    }

    /// The server's current definition of `name`, checked against the digest a call was
    /// staged with. Everything here happens before the call is sent.
    async fn current_definition(&self, name: &str, staged: &str) -> Result<CatalogTool, CallError> {
        let cached = self.catalog().get(name).cloned();
        let is_read = cached.as_ref().is_some_and(|t| {
            classify(
                &t.tool,
                self.config.trust,
                self.config.reads.contains(&t.name),
            )
            .is_read()
        });
        let catalog = if self.is_stale() || !is_read || !self.connection_alive().await {
            // Every write is checked against the tool's definition as the server lists it
            // now: a listing that fails stops the send, and says it was that check.
            self.refresh().await.map_err(|why| {
                CallError::NotDispatched(format!(
                    "the tool's definition could not be checked before sending, so nothing was sent ({why})"
                ))
            })?
        } else {
            self.catalog()
        };
        // The tool is gone or changed: the call can never be sent as it was staged.
        let Some(current) = catalog.get(name) else {
            return Err(CallError::Obsolete(format!(
                "the server no longer lists the tool {name:?}, so the call was not sent and never will be"
            )));
        };
        if current.digest != staged {
            return Err(CallError::Obsolete(format!(
                "the server changed the tool {name:?} after this call was made (its definition is now {} instead of {staged}), so the call was not sent and never will be; make it again once a person accepts the new definition",
                current.digest
            )));
        }
        Ok(current.clone())
    }

    /// Whether a call of `name` staged with definition `digest` would still run against
    /// that definition, judged from the catalog as last read (read again first if the
    /// server announced a change or was restarted). `Err` says what changed; nothing is
    /// sent but, when stale, a `tools/list`.
    pub async fn check_current(&self, name: &str, digest: &str) -> Result<(), String> {
        let catalog = if self.is_stale() {
            self.refresh().await?
        } else {
            self.catalog()
        };
        match catalog.get(name) {
            None => Err(format!(
                "the server no longer lists the tool {name:?}; a person must accept the server's new catalog first"
            )),
            Some(current) if current.digest != digest => Err(format!(
                "the server changed the tool {name:?} since a person accepted its catalog; a person must accept its new definition first"
            )),
            Some(_) => Ok(()),
        }
    }

    /// Whether the server declared `capability` (`resources`, `prompts`, `completions`,
    /// `logging`, ...) when it last started.
    pub fn offers(&self, capability: &str) -> bool {
        self.capabilities
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(capability)
            .is_some_and(|c| !c.is_null())
    }

    /// Whether the server declared it lets clients subscribe to its resources.
    pub fn offers_resource_subscriptions(&self) -> bool {
        self.capabilities
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .pointer("/resources/subscribe")
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }

    /// What the server announces about its resources and prompts from now on.
    pub fn events(&self) -> broadcast::Receiver<ServerEvent> {
        self.events.subscribe()
    }

    async fn connection_alive(&self) -> bool {
        self.connection
            .lock()
            .await
            .as_ref()
            .is_some_and(Connection::is_alive)
    }
}

/// A `tools/call` reply as gatekeeper-core's [`ToolResult`], or why it is not one.
fn tool_result(reply: ServerResult) -> Result<ToolResult, CallError> {
    match reply {
        ServerResult::CallToolResult(_)
        | ServerResult::CustomResult(_)
        | ServerResult::InputRequiredResult(_) => {}
        other => {
            return Err(CallError::Unknown(format!(
                "the server answered the call with something other than a tool result ({}); check the service for its effect",
                serde_json::to_value(&other)
                    .ok()
                    .and_then(|v| v.get("resultType").cloned())
                    .map_or_else(|| "unknown kind".to_owned(), |t| t.to_string())
            )));
        }
    }
    let raw = serde_json::to_value(&reply).map_err(|e| {
        CallError::Unknown(format!(
            "the server's answer could not be read ({e}); check the service for its effect"
        ))
    })?;
    ToolResult::from_json(raw).map_err(|e| {
        CallError::Unknown(format!(
            "the server's answer is not a tool result ({e}); check the service for its effect"
        ))
    })
}

#[async_trait]
impl ToolService for McpServer {
    /// The catalog as last read.
    async fn list_tools(&self) -> Vec<Tool> {
        self.catalog()
            .tools()
            .iter()
            .map(|t| t.tool.clone())
            .collect()
    }

    /// A call without the definition it was staged with is refused: nothing here can
    /// tell whether the tool changed since.
    async fn call(&self, tool: &str, args: &Value) -> Result<ToolResult, CallError> {
        self.call_defined(tool, None, args).await
    }

    async fn call_defined(
        &self,
        name: &str,
        definition: Option<&str>,
        args: &Value,
    ) -> Result<ToolResult, CallError> {
        self.call_relayed(name, definition, args, None).await
    }

    /// A read with the agent's [`ReadRelay`], when the gate handed one down: its progress
    /// reaches the agent, its cancellation reaches the server.
    async fn call_in(
        &self,
        name: &str,
        definition: Option<&str>,
        args: &Value,
        context: &CallContext,
    ) -> Result<ToolResult, CallError> {
        self.call_relayed(name, definition, args, context.get::<ReadRelay>())
            .await
    }

    async fn forward(
        &self,
        method: &str,
        params: &Value,
        context: &CallContext,
    ) -> Result<Value, CallError> {
        self.forward_request(method, params, context.get::<ReadRelay>())
            .await
    }
}

/// The requests [`ToolService::forward`] passes on: the ones the protocol defines as
/// changing nothing on the server (a subscription changes only what the server tells
/// this connection).
pub const FORWARDED: [&str; 8] = [
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "prompts/list",
    "prompts/get",
    "completion/complete",
];

impl McpServer {
    /// [`ToolService::forward`]: one of the [`FORWARDED`] requests, built from its JSON
    /// params by the protocol library, its answer returned as JSON.
    async fn forward_request(
        &self,
        method: &str,
        params: &Value,
        relay: Option<&ReadRelay>,
    ) -> Result<Value, CallError> {
        if !FORWARDED.contains(&method) {
            return Err(CallError::NotDispatched(format!(
                "the gate does not forward {method} requests; nothing was sent"
            )));
        }
        let request: ClientRequest =
            serde_json::from_value(serde_json::json!({"method": method, "params": params}))
                .map_err(|e| {
                    CallError::NotDispatched(format!(
                        "the {method} request is not well formed ({e}); nothing was sent"
                    ))
                })?;
        let peer = self.peer().await.map_err(CallError::NotDispatched)?;
        match self.send(&peer, request, relay).await {
            Ok(reply) => serde_json::to_value(&reply).map_err(|e| {
                CallError::Unknown(format!("the server's answer could not be read ({e})"))
            }),
            Err(Failure::NotSent(message) | Failure::Refused(message)) => Err(
                CallError::NotDispatched(format!("{message}; nothing was sent")),
            ),
            Err(Failure::Answered(message)) => Err(CallError::Answered(message)),
            Err(Failure::AfterSend(message)) => Err(CallError::Unknown(message)),
        }
    }

    /// Send `request` under the server's deadline. With an agent's `relay`, its progress,
    /// cancellation and questions travel with it; without, it is a person's send (whose
    /// questions go to the person when the gate runs it in [`crate::relay::for_person`])
    /// or a listing, during which the server's questions are put to no one. A server's
    /// `input_required` answer goes back to an agent that takes it, and is answered by the
    /// gate for everyone else ([`crate::rounds`]).
    async fn send(
        &self,
        peer: &Peer<RoleClient>,
        request: ClientRequest,
        relay: Option<&ReadRelay>,
    ) -> Result<ServerResult, Failure> {
        let answered = self.send_once(peer, request, relay).await;
        if answered.is_ok() {
            // The server took the request's credentials: a later need for the person's
            // login is news again.
            self.login_needed.store(false, Ordering::SeqCst);
        }
        answered
    }

    /// [`Self::send`] without its bookkeeping.
    async fn send_once(
        &self,
        peer: &Peer<RoleClient>,
        request: ClientRequest,
        relay: Option<&ReadRelay>,
    ) -> Result<ServerResult, Failure> {
        let deadline = self.config.deadline;
        let asker = match relay {
            Some(relay) => relay.asks.clone().map_or(Asker::Nobody, Asker::Agent),
            None => match person_in_scope() {
                Some(asks) => Asker::Person {
                    asks,
                    until: Instant::now() + person_window(deadline),
                    wait: self.config.question_wait.unwrap_or(deadline),
                },
                None => Asker::Nobody,
            },
        };
        let mut request = match relay.and_then(|relay| relay.retry.as_ref()) {
            Some(retry) => rounds::retried(&request, retry).map_err(|why| {
                Failure::NotSent(format!(
                    "the agent's answers could not be passed on ({why})"
                ))
            })?,
            None => request,
        };
        let mut answered = 0;
        loop {
            let reply = match relay {
                Some(relay) => {
                    match connection::request_relayed(
                        peer,
                        request.clone(),
                        deadline,
                        &self.progress,
                        relay,
                    )
                    .await
                    {
                        Ok(reply) => reply,
                        Err(failure) => return Err(self.explained(failure).await),
                    }
                }
                None => {
                    let call = self.progress.start_call(asker.clone());
                    let reply = connection::request(peer, request.clone(), deadline).await;
                    self.progress.stop_asking(call);
                    match reply {
                        Ok(reply) => reply,
                        Err(failure) => return Err(self.explained(failure).await),
                    }
                }
            };
            let ServerResult::InputRequiredResult(needed) = reply else {
                return Ok(reply);
            };
            if relay.is_some_and(|relay| relay.takes_input_required) {
                return Ok(ServerResult::InputRequiredResult(needed));
            }
            answered += 1;
            if answered > rounds::MAX_INPUT_ROUNDS {
                return Err(Failure::Answered(format!(
                    "the server asked for input {} times without completing the call, so the gate stopped answering",
                    rounds::MAX_INPUT_ROUNDS
                )));
            }
            let allowed = connection::capabilities(
                self.config.forward_sampling,
                self.config.forward_elicitation,
            );
            let answers =
                rounds::answer(&asker, needed.input_requests.unwrap_or_default(), &allowed)
                    .await
                    .map_err(Failure::Answered)?;
            let retry = InputRetry {
                input_responses: (!answers.is_empty()).then_some(answers),
                request_state: needed.request_state,
            };
            request = rounds::retried(&request, &retry).map_err(|why| {
                Failure::Answered(format!(
                    "the server asked for input, and the gate could not call again with its answers ({why})"
                ))
            })?;
        }
    }

    async fn call_relayed(
        &self,
        name: &str,
        definition: Option<&str>,
        args: &Value,
        relay: Option<&ReadRelay>,
    ) -> Result<ToolResult, CallError> {
        let Some(staged) = definition else {
            return Err(CallError::NotDispatched(format!(
                "the call of {name:?} carries no definition digest (it was staged by an older version of the gate), so nothing was sent; reject it and stage it again"
            )));
        };
        let current = self.current_definition(name, staged).await?;
        let Value::Object(arguments) = args.clone() else {
            return Err(CallError::NotDispatched(
                "tool arguments must be a JSON object, so nothing was sent".to_owned(),
            ));
        };
        let peer = self.peer().await.map_err(CallError::NotDispatched)?;
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(
            CallToolRequestParams::new(current.name).with_arguments(arguments),
        ));
        match self.send(&peer, request, relay).await {
            Ok(reply) => tool_result(reply),
            Err(Failure::NotSent(message) | Failure::Refused(message)) => Err(
                CallError::NotDispatched(format!("{message}; nothing was sent")),
            ),
            Err(Failure::Answered(message)) => Err(CallError::Answered(message)),
            Err(Failure::AfterSend(message)) => {
                if relay.is_some_and(|relay| relay.cancelled.is_cancelled()) {
                    // The agent gave up on its own read: nothing to warn a person about.
                    tracing::debug!(server = %self.config.name, tool = name, "downstream.read.cancelled");
                } else {
                    warn!(server = %self.config.name, tool = name, %message, "downstream.call.outcome-unknown");
                }
                Err(CallError::Unknown(format!(
                    "{message}; the call may have taken effect (deadline {})",
                    seconds(self.config.deadline)
                )))
            }
        }
    }
}

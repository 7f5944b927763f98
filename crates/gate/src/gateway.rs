//! The gateway: what each agent sees and what its calls do, independent of how the agent
//! is connected.
//!
//! An agent sees only the tools its grants name, as `<server>__<tool>` ([`crate::names`]),
//! with the downstream description and boolean annotations passed through, and two gateway
//! tools: [`ACTION_RESULT_TOOL`] and [`PENDING_TOOL`]. A call goes through the agent's
//! gatekeeper-core session for that server:
//!
//! - a read runs at once, is recorded as an observation, and its answer is returned;
//! - a write is staged and answered at once with an ordinary result (not an error): what
//!   was staged, its action id, that nothing was sent, that later reads will not show it,
//!   and how to get the outcome. A gated tool's output schema is not listed, since its
//!   answer is that message, not the tool's output;
//! - an identical call (same agent, same tool, same arguments) while the first is still
//!   pending returns the same action instead of staging a second one.
//!
//! What an agent sees is the catalog a person accepted ([`Downstream::accepted`]), not
//! whatever the server lists now: a tool the server added is not listed, and a write of a
//! tool whose definition changed is refused before staging. [`Gateway::accept_catalog`]
//! (the person's `gate catalog accept`) records the current catalog, makes it the
//! gatekeeper's, rebuilds every agent's view and tells connected agents their tool list
//! changed.
//!
//! Nothing here decides: approving and rejecting belong to the person's side
//! ([`crate::control`]); an agent can only read the outcome of its own actions.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use gatekeeper_core::{
    ActionResult, CallContext, CallOutcome, Session, ToolGatekeeper, ToolResult,
};
use gatekeeper_mcp::{Catalog, CatalogTool, McpServer, ReadRelay, ServerEvent, canonical_json};
use kernel::{ActionState, Clock, LedgerId, Overseer, SystemClock};
use prompt_sanitize::{
    MAX_DESCRIPTION_CHARS, MAX_INLINE_CHARS, code_span, plain_inline, untrusted_label,
};
use rmcp::model::{
    CallToolResponse, CallToolResult, ContentBlock, CreateTaskResult, DetailedTask,
    InputRequiredResult, Task, TaskPayload, Tool as McpTool,
};
use rmcp::service::{Peer, RoleServer};
use serde_json::{Value, json};
use tokio::sync::Mutex;
use tracing::{info, warn};

use crate::lockdown::Latches;
pub use crate::lockdown::{LIFTS_FILE, Lift, LiftError};
use crate::logs::{self, Listener};
use crate::names::{
    NameCollision, agent_names, prompt_name, prompt_of_name, resource_of_uri, resource_uri,
};
use crate::notify::Notifier;
use gatekeeper_mcp::limit::{Limiter, Verdict};

/// The gateway tool that reports an action's outcome.
pub const ACTION_RESULT_TOOL: &str = "gate_action_result";
/// The gateway tool that lists the agent's open actions.
pub const PENDING_TOOL: &str = "gate_pending";

/// One downstream server as the gateway holds it.
#[derive(Debug, Clone)]
pub struct Downstream {
    /// Its configured name (also its gatekeeper's name).
    pub name: String,
    /// The driver.
    pub server: Arc<McpServer>,
    /// Its gatekeeper, registered with the kernel (behind the lockdown guard).
    pub gatekeeper: Arc<ToolGatekeeper>,
    /// Its tools whose reads are sensitive: reading one locks the reading agent's
    /// workspace down.
    pub sensitive_reads: Vec<String>,
    /// Whether reading one of its resources locks the reading agent's workspace down.
    pub sensitive_resources: bool,
    /// Whether its reads reach nothing outside this machine: the only server a
    /// locked-down agent may still read.
    pub local_only: bool,
    /// The catalog a person accepted: what agents see and can call. The server's
    /// current catalog may differ until a person accepts it.
    pub accepted: Arc<RwLock<Arc<Catalog>>>,
    /// How an agent's own pending writes show in its reads of it ([`crate::pending`]).
    pub pending: Arc<crate::pending::Pending>,
}

impl Downstream {
    /// The catalog a person accepted.
    pub fn accepted(&self) -> Arc<Catalog> {
        self.accepted
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// One tool as one agent sees it.
#[derive(Debug, Clone)]
struct AgentTool {
    /// The name the agent calls.
    exposed: String,
    /// The driver of its server.
    driver: Arc<McpServer>,
    /// The server it belongs to.
    server: String,
    /// Its name on that server (and in that server's gatekeeper).
    tool: String,
    /// The digest of the definition a person accepted.
    digest: String,
    /// Whether the classifier made it a read.
    read: bool,
    /// Whether reading it locks this agent's workspace down.
    sensitive: bool,
    /// Whether its server's reads stay on this machine.
    local_only: bool,
    /// What the agent is shown.
    listing: McpTool,
}

/// What a granted tool is to the gate: a read or not, whether reading it locks the agent
/// down, whether its server's reads stay on this machine.
#[derive(Debug, Clone, Copy)]
struct Traits {
    read: bool,
    sensitive: bool,
    local_only: bool,
}

/// One agent's tools and sessions, built from the accepted catalogs; replaced as a whole
/// when a person accepts a new catalog.
#[derive(Debug, Default)]
struct AgentTools {
    tools: Vec<AgentTool>,
    by_name: HashMap<String, usize>,
    sessions: HashMap<String, Session>,
}

/// One agent's view: its grants, its tools and sessions as of the accepted catalogs.
#[derive(Debug)]
pub struct AgentView {
    name: String,
    /// Its grants as (server, tools or `None` for all).
    grants: Vec<(String, Option<Vec<String>>)>,
    current: RwLock<Arc<AgentTools>>,
    /// Held while this agent stages, so a repeat waits for the first and finds its action.
    staging: Mutex<()>,
}

/// Why an agent's view could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ViewError {
    /// A grant names a tool its server does not list.
    #[error(
        "agent {agent:?} is granted tool {tool:?} of server {server:?}, which that server does not list; it lists: {listed}"
    )]
    UnknownTool {
        /// The agent.
        agent: String,
        /// The server.
        server: String,
        /// The tool.
        tool: String,
        /// What the server lists.
        listed: String,
    },
    /// A grant names a server the gateway does not run.
    #[error("agent {agent:?} is granted server {server:?}, which is not running")]
    UnknownServer {
        /// The agent.
        agent: String,
        /// The server.
        server: String,
    },
    /// Two tools would have the same name.
    #[error(transparent)]
    Names(#[from] NameCollision),
    /// The kernel refused to mint a grant.
    #[error("the kernel refused a grant for agent {agent:?}: {message}")]
    Grant {
        /// The agent.
        agent: String,
        /// The kernel's message.
        message: String,
    },
}

/// The listing of one tool: the downstream definition exactly as the server listed it
/// (title, icons, `_meta`, `execution` and every other field), under the agent-facing
/// name, with two changes the gate owns: the annotations are the ones the classifier
/// believed (boolean hints only, so a client parses them), and the output schema is kept
/// only for reads, since a gated tool answers with the gate's message, not its output.
fn listing(exposed: &str, downstream: &CatalogTool, read: bool) -> Option<McpTool> {
    let mut shown = downstream.raw.clone();
    let believed = serde_json::to_value(&downstream.tool).ok()?;
    let fields = shown.as_object_mut()?;
    fields.insert("name".to_owned(), Value::String(exposed.to_owned()));
    match believed.get("annotations") {
        Some(annotations) => {
            fields.insert("annotations".to_owned(), annotations.clone());
        }
        None => {
            fields.remove("annotations");
        }
    }
    if !read {
        fields.remove("outputSchema");
    }
    match serde_json::from_value(shown) {
        Ok(tool) => Some(tool),
        Err(error) => {
            warn!(tool = %downstream.name, %error, "listing.unreadable: not offered to agents");
            None
        }
    }
}

fn gateway_tools() -> Vec<McpTool> {
    let result = json!({
        "name": ACTION_RESULT_TOOL,
        "description": "The outcome of an action you staged: pending, applied (with the server's answer), rejected (with the person's reason), expired (nobody decided in time; nothing was sent), or failed (with whether it may have reached the server).",
        "inputSchema": {
            "type": "object",
            "properties": {"action_id": {"type": "integer", "description": "The action id a staged call returned."}},
            "required": ["action_id"]
        },
        "annotations": {"readOnlyHint": true}
    });
    let pending = json!({
        "name": PENDING_TOOL,
        "description": "Your actions that still wait for a person's decision.",
        "inputSchema": {"type": "object"},
        "annotations": {"readOnlyHint": true}
    });
    [result, pending]
        .into_iter()
        .map(|t| serde_json::from_value(t).expect("the gateway's own tools parse"))
        .collect()
}

impl AgentTools {
    /// Agent `name`'s tools over the accepted catalogs of `downstreams`. With `strict`, a
    /// grant of a tool the accepted catalog lacks is an error; without, it is left out.
    fn build(
        overseer: &Overseer,
        name: &str,
        grants: &[(String, Option<Vec<String>>)],
        downstreams: &[Downstream],
        strict: bool,
    ) -> Result<Self, ViewError> {
        // (server, tool, what it is, driver)
        let mut picked: Vec<(String, CatalogTool, Traits, Arc<McpServer>)> = Vec::new();
        let mut sessions = HashMap::new();
        for (server, tools) in grants {
            let downstream = downstreams
                .iter()
                .find(|d| &d.name == server)
                .ok_or_else(|| ViewError::UnknownServer {
                    agent: name.to_owned(),
                    server: server.clone(),
                })?;
            let catalog = downstream.accepted();
            let mut chosen: Vec<&CatalogTool> = Vec::new();
            match tools {
                // A tool the gate cannot run as it asks is withheld (`gate catalog` says
                // why); one a grant names explicitly is left out the same way.
                None => chosen.extend(catalog.tools().iter().filter(|t| t.withheld.is_none())),
                Some(tools) => {
                    for tool in tools {
                        match catalog.get(tool) {
                            Some(listed) if listed.withheld.is_some() => {
                                warn!(agent = %name, %server, %tool, "grant.tool-withheld: see `gate catalog`");
                            }
                            Some(listed) => chosen.push(listed),
                            // A server that has listed nothing yet (a remote server never
                            // reached) cannot say; its grants are checked once it lists.
                            None if strict && !catalog.tools().is_empty() => {
                                return Err(ViewError::UnknownTool {
                                    agent: name.to_owned(),
                                    server: server.clone(),
                                    tool: tool.clone(),
                                    listed: catalog
                                        .tools()
                                        .iter()
                                        .map(|t| t.name.as_str())
                                        .collect::<Vec<_>>()
                                        .join(", "),
                                });
                            }
                            None => {
                                warn!(agent = %name, %server, %tool, "grant.tool-gone: the accepted catalog no longer lists it");
                            }
                        }
                    }
                }
            }
            let names: Vec<&str> = chosen.iter().map(|t| t.name.as_str()).collect();
            let session = downstream
                .gatekeeper
                .grant(overseer, name, &names)
                .map_err(|e| ViewError::Grant {
                    agent: name.to_owned(),
                    message: e.to_string(),
                })?
                .into_session();
            sessions.insert(server.clone(), session);
            for tool in chosen {
                let read = downstream
                    .gatekeeper
                    .classification(&tool.name)
                    .is_some_and(|c| c.is_read());
                let sensitive = read && downstream.sensitive_reads.contains(&tool.name);
                picked.push((
                    server.clone(),
                    tool.clone(),
                    Traits {
                        read,
                        sensitive,
                        local_only: downstream.local_only,
                    },
                    downstream.server.clone(),
                ));
            }
        }
        let pairs: Vec<(&str, &str)> = picked
            .iter()
            .map(|(server, tool, ..)| (server.as_str(), tool.name.as_str()))
            .collect();
        let exposed = agent_names(&pairs, &[ACTION_RESULT_TOOL, PENDING_TOOL])?;
        let mut tools = Vec::new();
        for (
            (
                server,
                tool,
                Traits {
                    read,
                    sensitive,
                    local_only,
                },
                driver,
            ),
            exposed,
        ) in picked.into_iter().zip(exposed)
        {
            if let Some(listing) = listing(&exposed, &tool, read) {
                tools.push(AgentTool {
                    exposed,
                    driver,
                    server,
                    tool: tool.name.clone(),
                    digest: tool.digest.clone(),
                    read,
                    sensitive,
                    local_only,
                    listing,
                });
            }
        }
        let by_name = tools
            .iter()
            .enumerate()
            .map(|(i, t)| (t.exposed.clone(), i))
            .collect();
        Ok(Self {
            tools,
            by_name,
            sessions,
        })
    }
}

impl AgentView {
    /// The view of agent `name` over the accepted catalogs of `downstreams`, given its
    /// grants as (server, tools or `None` for all).
    pub fn build(
        overseer: &Overseer,
        name: &str,
        grants: &[(String, Option<Vec<String>>)],
        downstreams: &[Downstream],
    ) -> Result<Self, ViewError> {
        let tools = AgentTools::build(overseer, name, grants, downstreams, true)?;
        Ok(Self {
            name: name.to_owned(),
            grants: grants.to_vec(),
            current: RwLock::new(Arc::new(tools)),
            staging: Mutex::new(()),
        })
    }

    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn tools(&self) -> Arc<AgentTools> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Every agent's view over one kernel, and what the gateway remembers between calls.
pub struct Gateway {
    overseer: Overseer,
    downstreams: Vec<Downstream>,
    agents: BTreeMap<String, AgentView>,
    /// Pending calls by (agent, tool, canonical arguments), to answer a repeat with the
    /// same action. (Each agent's staging is serialized by [`AgentView`]'s turn, so two
    /// identical calls cannot both stage; different agents stage concurrently.)
    staged: std::sync::Mutex<HashMap<(String, String, String), LedgerId>>,
    /// Each agent's lockdown latch (shared with the gatekeepers' guards).
    latches: Arc<Latches>,
    /// Where the accepted catalogs are recorded (one file per server), or `None` to keep
    /// them in memory only.
    catalogs: Option<PathBuf>,
    /// One person's acceptance at a time.
    accepting: Mutex<()>,
    /// The agents' MCP sessions that began with `initialize`: told when their tool list
    /// changes, and of servers' logs ([`crate::logs`]).
    listeners: std::sync::Mutex<Vec<Listener>>,
    /// The agents' calls in flight on each server, by server: who hears its log while
    /// exactly one is.
    in_flight: dashmap::DashMap<String, Vec<(u64, Listener)>>,
    /// The next id of a call in flight.
    next_call: std::sync::atomic::AtomicU64,
    /// Each server's budget of log messages.
    limiters: dashmap::DashMap<String, Limiter>,
    /// The SQLite database behind the kernel, whose file is read page by page for the
    /// person's `gate ledger`.
    database: Option<store_sqlite::Database>,
    /// The gateway's time (lifts of lockdown, expiry).
    clock: Arc<dyn Clock>,
    /// Told of every newly staged action, to tell the person.
    notifier: Option<Notifier>,
    /// Counts what changed the open work (a stage, a person's decision): the review page's
    /// open pages wait on it.
    changes: tokio::sync::watch::Sender<u64>,
    /// How many agents' subscriptions each downstream resource has, by (server, its own
    /// address): a server is subscribed once, and unsubscribed when the last goes.
    /// The session that subscribed the server is kept to unsubscribe it.
    subscribers: std::sync::Mutex<HashMap<(String, String), (usize, Session)>>,
    /// One subscription change at a time, so the count and the server agree.
    subscribing: Mutex<()>,
    /// What every view of the person's redacts ([`crate::redaction`]).
    redactor: Arc<prompt_sanitize::Redactor>,
    /// Questions servers ask during the person's sends ([`crate::questions`]).
    questions: Arc<crate::questions::Questions>,
    /// The person's limits on staging ([`crate::quotas`]).
    quotas: Arc<crate::quotas::Quotas>,
    /// Which agent session staged which action, for grants that last a session.
    session_grants: crate::grants::SessionGrants,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("agents", &self.agents.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// Text for the agent, as one ordinary result.
fn text_result(text: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(text)])
}

/// Text for the agent, as a tool error.
fn error_result(text: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

/// A downstream answer as the agent receives it: every block as the server sent it
/// (text, image, audio, resource link, embedded resource, with their annotations and
/// `_meta`), its structured content and its `_meta`, after the gate's own text block when
/// there is a `prefix`. A block the protocol library cannot carry (a type newer than it) is
/// replaced by a note naming its type.
/// What one agent's call comes to: an answer, or (protocol 2026-07-28) the server's
/// `input_required` result as it sent it, for the agent to answer and call again.
enum Answer {
    Done(CallToolResult),
    InputRequired(Value),
    /// A write staged as this action (or already staged as it), with what the agent is told.
    Staged(CallToolResult, LedgerId),
}

impl From<CallToolResult> for Answer {
    fn from(result: CallToolResult) -> Self {
        Self::Done(result)
    }
}

fn downstream_result(server: &str, result: &ToolResult, prefix: Option<String>) -> CallToolResult {
    let mut content: Vec<ContentBlock> = prefix.into_iter().map(ContentBlock::text).collect();
    for block in &result.content {
        let mut shown = block.to_json();
        rewrite_block_uris(server, &mut shown);
        content.push(serde_json::from_value(shown).unwrap_or_else(|_| {
            ContentBlock::text(format!(
                "(a block of type {} that the gate cannot carry was left out)",
                code_span(block.kind(), MAX_INLINE_CHARS)
            ))
        }));
    }
    let mut answer = if result.is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    answer.structured_content = result.structured_content.clone();
    answer.meta = result
        .extra
        .get("_meta")
        .and_then(|meta| serde_json::from_value(meta.clone()).ok());
    answer
}

/// A content block with the server's resource addresses (a resource link's `uri`, an
/// embedded resource's `resource.uri`) given as the gate's ([`resource_uri`]), so the agent
/// can read them through the gate. Nothing else in the block changes.
fn rewrite_block_uris(server: &str, block: &mut Value) {
    let uri = match block.get("type").and_then(Value::as_str) {
        Some("resource_link") => block.get_mut("uri"),
        Some("resource") => block.pointer_mut("/resource/uri"),
        _ => None,
    };
    if let Some(Value::String(uri)) = uri {
        *uri = resource_uri(server, uri);
    }
}

/// Each item's address field (`uri` of a resource or resource contents, `uriTemplate` of a
/// template) given as the gate's.
fn rewrite_item_uris(server: &str, items: &mut [Value], field: &str) {
    for item in items {
        if let Some(Value::String(uri)) = item.get_mut(field) {
            *uri = resource_uri(server, uri);
        }
    }
}

/// An agent's call in flight on a server, noted until dropped.
struct InFlight<'a> {
    gateway: &'a Gateway,
    server: String,
    id: u64,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        // One server's entry, changed and dropped under its shard's lock alone.
        self.gateway
            .in_flight
            .remove_if_mut(&self.server, |_, calls| {
                calls.retain(|(id, _)| *id != self.id);
                calls.is_empty()
            });
    }
}

/// The longest an agent's call waits for the send a rule makes at once; past it, the agent
/// is told the call is staged and covered by the rule.
const RULE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// How often a client is asked to poll a task: a person decides in seconds at best.
const TASK_POLL_MS: u64 = 2000;

/// The task id that stands for action `id` (MCP's tasks extension).
pub fn task_id(id: u64) -> String {
    format!("gate-action-{id}")
}

/// The action a task id stands for, if it is one of the gate's.
pub fn action_of_task(task: &str) -> Option<u64> {
    task.strip_prefix("gate-action-")?.parse().ok()
}

/// Every text block of `result`, one per line.
pub fn text_of(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// An ISO 8601 time, in UTC, as tasks carry them.
fn iso_time(at: kernel::Timestamp) -> String {
    let shown = at.to_string();
    match shown.split_once(' ') {
        Some((day, time)) => format!("{day}T{time}Z"),
        None => format!("1970-01-01T{shown}Z"),
    }
}

/// What an agent is told when its write is staged.
pub fn staged_message(tool: &str, ledger: LedgerId, repeat: bool) -> String {
    let id = ledger.0;
    let head = if repeat {
        format!(
            "This identical call to \"{tool}\" is already staged as action {id} and still waits for a person's approval; it was not staged again."
        )
    } else {
        format!("Staged as action {id}: calling \"{tool}\" needs a person's approval.")
    };
    format!(
        "{head} Nothing has been sent to the server, so later reads will not show this change. To learn the outcome, call {ACTION_RESULT_TOOL} with {{\"action_id\": {id}}}, or read the resource {uri} (a client that listens to it is told when it is decided).",
        uri = crate::http::action_uri(id)
    )
}

impl Gateway {
    /// A gateway over `overseer` and these servers, for these agents, with their
    /// lockdown latches.
    pub fn new(
        overseer: Overseer,
        downstreams: Vec<Downstream>,
        agents: Vec<AgentView>,
        latches: Arc<Latches>,
    ) -> Self {
        let overseer_for_questions = overseer.clone();
        Self {
            overseer,
            downstreams,
            agents: agents.into_iter().map(|a| (a.name.clone(), a)).collect(),
            staged: std::sync::Mutex::new(HashMap::new()),
            latches,
            catalogs: None,
            accepting: Mutex::new(()),
            listeners: std::sync::Mutex::new(Vec::new()),
            in_flight: dashmap::DashMap::new(),
            next_call: std::sync::atomic::AtomicU64::new(0),
            limiters: dashmap::DashMap::new(),
            database: None,
            clock: Arc::new(SystemClock),
            notifier: None,
            changes: tokio::sync::watch::Sender::new(0),
            subscribers: std::sync::Mutex::new(HashMap::new()),
            subscribing: Mutex::new(()),
            redactor: Arc::new(prompt_sanitize::Redactor::new()),
            questions: Arc::new(crate::questions::Questions::new(overseer_for_questions)),
            quotas: Arc::default(),
            session_grants: crate::grants::SessionGrants::new(SystemClock.now()),
        }
    }

    /// Whether `agent` is one of the configuration's agents.
    pub fn knows_agent(&self, agent: &str) -> bool {
        self.agents.contains_key(agent)
    }

    /// A label for a new agent session (grants that last a session name it).
    pub fn open_session(&self) -> Arc<str> {
        self.session_grants.open()
    }

    /// The label of the open agent session that staged `ledger`, if one did.
    pub fn session_label(&self, ledger: LedgerId) -> Option<String> {
        self.session_grants.label_of(ledger)
    }

    /// Agent session `label` ended: the rules granted for it are removed.
    pub fn session_ended(&self, label: &str) {
        if self.session_grants.close(label) {
            self.remove_session_rules(|l| l == label);
        }
    }

    /// Remove the rules an earlier run of this daemon granted for its sessions, which did
    /// not outlive it. Only for a store this daemon has alone: in a shared team store
    /// another daemon's sessions may still be open.
    pub fn forget_earlier_sessions(&self) {
        self.remove_session_rules(|label| !self.session_grants.ours(label));
    }

    fn remove_session_rules(&self, doomed: impl Fn(&str) -> bool) {
        for rule in self.overseer.rules().unwrap_or_default() {
            if let Some(label) = &rule.scope.session
                && doomed(label)
            {
                match self.overseer.remove_rule(&rule.gatekeeper, &rule.kind.tag) {
                    Ok(_) => tracing::info!(
                        server = %rule.gatekeeper,
                        tool = %rule.kind.label,
                        "rule.session_ended: a grant for an agent session was removed with it"
                    ),
                    Err(error) => tracing::warn!(%error, "could not remove a session's rule"),
                }
            }
        }
    }

    /// Hold agents' staging to the person's `quotas`.
    pub fn with_quotas(mut self, quotas: crate::quotas::Quotas) -> Self {
        self.quotas = Arc::new(quotas);
        self
    }

    /// The person's limits on staging, and what is used of them.
    pub fn quotas(&self) -> &crate::quotas::Quotas {
        &self.quotas
    }

    /// Hold the questions servers ask during the person's sends in `questions` (the ones
    /// the gatekeepers' guards put them to).
    pub fn with_questions(mut self, questions: Arc<crate::questions::Questions>) -> Self {
        self.questions = questions;
        self
    }

    /// The questions servers ask during the person's sends.
    pub fn questions(&self) -> &Arc<crate::questions::Questions> {
        &self.questions
    }

    /// What action `ledger`'s server asked during its send, as the ledger records it, as
    /// lines for `gate show` (`None` when it asked nothing).
    pub fn exchanges_of(&self, ledger: LedgerId) -> Option<String> {
        let entry = self.overseer.entry(ledger).ok().flatten()?;
        entry.action()?;
        let found = self.questions.exchanges(&entry);
        (!found.is_empty()).then(|| {
            format!(
                "  what its server asked during the send:\n{}",
                found.join("\n")
            )
        })
    }

    /// Redact the person's views with `redactor` (the well-known patterns by default).
    pub fn with_redactor(mut self, redactor: Arc<prompt_sanitize::Redactor>) -> Self {
        self.redactor = redactor;
        self
    }

    /// What the person's views redact.
    pub fn redactor(&self) -> &Arc<prompt_sanitize::Redactor> {
        &self.redactor
    }

    /// Tell `notifier` of every newly staged action.
    pub fn with_notifier(mut self, notifier: Notifier) -> Self {
        self.notifier = Some(notifier);
        self
    }

    /// Expire what waited past its time to live, so what an agent or the person is told
    /// next is current. A failure is logged: the next sweep tries again.
    pub async fn expire_due(&self) {
        match self.overseer.expire_due().await {
            Ok(expired) if !expired.is_empty() => {
                info!(count = expired.len(), "pending actions expired");
            }
            Ok(_) => {}
            Err(error) => warn!(%error, "expiry: the ledger could not be swept"),
        }
    }

    /// Read the ledger for the person from this database's file.
    pub fn with_database(mut self, database: store_sqlite::Database) -> Self {
        self.database = Some(database);
        self
    }

    /// Take time from `clock` instead of the system's.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The ledger's SQLite file, if it has one, once every write so far is committed to
    /// it (the store commits an unsynced write within a moment), so a reader of the file
    /// sees what the kernel knows.
    pub fn ledger_file(&self) -> Result<Option<&Path>, String> {
        let Some(database) = &self.database else {
            return Ok(None);
        };
        database.flush().map_err(|e| e.to_string())?;
        Ok(database.path())
    }

    /// The commits and syncs of the daemon's SQLite store so far, if it has one.
    pub fn store_counts(&self) -> Option<(u64, u64)> {
        self.database.as_ref().map(|db| (db.commits(), db.syncs()))
    }

    /// The gateway's clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The downstream server named `name` in the configuration.
    pub fn downstream(&self, name: &str) -> Option<&Downstream> {
        self.downstreams.iter().find(|d| d.name == name)
    }

    /// The name the person reads for tool `tool` of server `server`: the one its agents
    /// call it by (`files__write_file`), the same for every agent unless two tools clean to
    /// one name (then the first agent's that holds it).
    pub fn person_name(&self, server: &str, tool: &str) -> String {
        self.agents
            .values()
            .find_map(|view| {
                view.tools()
                    .tools
                    .iter()
                    .find(|t| t.server == server && t.tool == tool)
                    .map(|t| t.exposed.clone())
            })
            .unwrap_or_else(|| format!("{server}{}{tool}", crate::names::SEPARATOR))
    }

    /// The server and tool an agent-facing name stands for, as any agent holds it.
    pub fn tool_of_name(&self, name: &str) -> Option<(String, String)> {
        self.agents.values().find_map(|view| {
            view.tools()
                .tools
                .iter()
                .find(|t| t.exposed == name)
                .map(|t| (t.server.clone(), t.tool.clone()))
        })
    }

    /// The agents' names, in order.
    pub fn agent_names(&self) -> impl Iterator<Item = &str> {
        self.agents.keys().map(String::as_str)
    }

    /// Lift agent `agent`'s lockdown, by `by` (the person behind the socket), for `reason`:
    /// the lift is recorded (appended and synced, when latches are kept in a directory)
    /// before the latch is removed, so a lift that is not recorded does not happen.
    /// Returns why it had been locked down.
    pub fn lift_lockdown(&self, agent: &str, by: &str, reason: &str) -> Result<String, LiftError> {
        let was = self.latches.lift(agent, by, reason, self.clock.now().0)?;
        warn!(%agent, %by, "lockdown lifted by the person");
        Ok(was)
    }

    /// The lifts recorded so far, oldest first (a line that cannot be read is skipped).
    pub fn lifts(&self) -> Vec<Lift> {
        self.latches.lifts()
    }

    /// Record each accepted catalog in `dir` (created if missing), one file per server
    /// ([`catalog_file`]), when a person accepts a new one.
    pub fn with_catalogs(mut self, dir: &Path) -> Self {
        self.catalogs = Some(dir.to_owned());
        self
    }

    /// Why agent `agent`'s workspace is locked down, or `None` while it is not (or for
    /// an agent the gateway does not know).
    pub fn lockdown_of(&self, agent: &str) -> Option<String> {
        self.latches.why(agent)
    }

    /// The agent that staged action `ledger` and why its workspace is locked down, when
    /// it is.
    pub fn locked_caller(&self, ledger: LedgerId) -> Option<(String, String)> {
        let entry = self.overseer.entry(ledger).ok().flatten()?;
        let why = self.lockdown_of(&entry.caller)?;
        Some((entry.caller.to_string(), why))
    }

    /// Remember an agent's MCP session, to tell it when its tool list changes and of its
    /// servers' logs. Sessions that are gone are forgotten.
    pub fn add_peer(&self, listener: Listener) {
        let mut listeners = self.listeners();
        listeners.retain(|l| !l.peer.is_transport_closed());
        listeners.push(listener);
    }

    fn listeners(&self) -> std::sync::MutexGuard<'_, Vec<Listener>> {
        self.listeners.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Tell every connected agent that its tool list changed. Connections that are gone
    /// are forgotten.
    async fn announce_tools_changed(&self) {
        let peers: Vec<Peer<RoleServer>> = {
            let mut listeners = self.listeners();
            listeners.retain(|l| !l.peer.is_transport_closed());
            listeners.iter().map(|l| l.peer.clone()).collect()
        };
        for peer in peers {
            if let Err(error) = peer.notify_tool_list_changed().await {
                warn!(%error, "agent.notify.failed: the agent sees the new tools at its next tools/list");
            }
        }
    }

    /// Note `caller`'s call in flight on `server` until the guard is dropped.
    fn call_in_flight(&self, server: &str, caller: Listener) -> InFlight<'_> {
        let id = self
            .next_call
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.in_flight
            .entry(server.to_owned())
            .or_default()
            .push((id, caller));
        InFlight {
            gateway: self,
            server: server.to_owned(),
            id,
        }
    }

    /// Read each server's catalog again every `every`, for as long as the gateway lives:
    /// a server that changes a tool without announcing it (no `list_changed`) is caught
    /// within that time, and from then on a call of the changed tool, read or write, is
    /// refused (its definition no longer matches the one a person accepted). The change
    /// is logged once; `gate catalog` shows it. The cost is one `tools/list` per server
    /// per interval.
    pub fn start_catalog_checks(self: &Arc<Self>, every: std::time::Duration) {
        for downstream in &self.downstreams {
            let gateway = Arc::downgrade(self);
            let name = downstream.name.clone();
            tokio::spawn(async move {
                let mut ticks = tokio::time::interval(every);
                ticks.tick().await;
                let mut told = false;
                loop {
                    ticks.tick().await;
                    let Some(gateway) = gateway.upgrade() else {
                        return;
                    };
                    let Some(downstream) = gateway.downstreams.iter().find(|d| d.name == name)
                    else {
                        return;
                    };
                    match downstream.server.refresh().await {
                        Ok(current) => {
                            let changed = !downstream.accepted().changes(&current).is_empty();
                            if changed && !told {
                                warn!(server = %name, "catalog.changed since a person accepted it: calls of changed tools are refused; see `gate catalog`");
                            }
                            told = changed;
                        }
                        Err(error) => {
                            tracing::debug!(server = %name, %error, "catalog.check.failed: tried again at the next interval");
                        }
                    }
                }
            });
        }
    }

    /// Start passing each server's log messages on to agents ([`crate::logs`]), for as
    /// long as the gateway lives.
    pub fn start_log_relays(self: &Arc<Self>) {
        for downstream in &self.downstreams {
            let gateway = Arc::downgrade(self);
            let server = downstream.name.clone();
            let mut events = downstream.server.events();
            tokio::spawn(async move {
                use tokio::sync::broadcast::error::RecvError;
                loop {
                    let message = match events.recv().await {
                        Ok(ServerEvent::Log(message)) => message,
                        Ok(_) | Err(RecvError::Lagged(_)) => continue,
                        Err(RecvError::Closed) => return,
                    };
                    let Some(gateway) = gateway.upgrade() else {
                        return;
                    };
                    gateway.relay_log(&server, message).await;
                }
            });
        }
    }

    /// Pass one of `server`'s log messages on: to the one call in flight on it, or else
    /// to every session of an agent with a grant on it; within its budget, cut to size.
    #[allow(deprecated)]
    async fn relay_log(&self, server: &str, message: rmcp::model::LoggingMessageNotificationParam) {
        let now = tokio::time::Instant::now();
        let verdict = self
            .limiters
            .entry(server.to_owned())
            .or_insert_with(|| Limiter::new(logs::MAX_LOGS_PER_SECOND, now))
            .admit(now);
        let message = match verdict {
            Verdict::Pass => logs::capped(message),
            Verdict::DropAndSay(dropped) => logs::drop_notice(server, dropped),
            Verdict::Drop => return,
        };
        let in_flight: Vec<Listener> = self
            .in_flight
            .get(server)
            .map(|calls| calls.iter().map(|(_, l)| l.clone()).collect())
            .unwrap_or_default();
        let audience = if let [one] = in_flight.as_slice() {
            vec![one.clone()]
        } else {
            let granted: Vec<&str> = self
                .agents
                .values()
                .filter(|view| view.grants.iter().any(|(s, _)| s == server))
                .map(|view| view.name.as_str())
                .collect();
            let mut listeners = self.listeners();
            listeners.retain(|l| !l.peer.is_transport_closed());
            listeners
                .iter()
                .filter(|l| granted.contains(&l.agent.as_str()))
                .cloned()
                .collect()
        };
        for listener in audience {
            if !listener.tell(&message).await {
                tracing::debug!(agent = %listener.agent, "log.undelivered: the session is gone");
            }
        }
    }

    /// The kernel.
    pub fn overseer(&self) -> &Overseer {
        &self.overseer
    }

    /// Remember the pending actions in the ledger (staged before a restart), so that an
    /// identical call still returns the action it already staged. Returns how many.
    pub async fn recover_pending(&self) -> usize {
        let open = match self.overseer.open_actions() {
            Ok(open) => open,
            Err(error) => {
                warn!(%error, "recover.pending: the ledger could not be read");
                return 0;
            }
        };
        let mut found = Vec::new();
        for entry in open {
            let Some(action) = entry.action() else {
                continue;
            };
            if action.state != ActionState::Pending {
                continue;
            }
            let (Some(view), Some(downstream)) = (
                self.agents.get(&*entry.caller),
                self.downstreams
                    .iter()
                    .find(|d| d.name.as_str() == &*entry.gatekeeper),
            ) else {
                continue;
            };
            let Ok(Some(record)) = downstream.gatekeeper.store().get(action.driver_id).await else {
                continue;
            };
            let Some(tool) = view
                .tools()
                .tools
                .iter()
                .find(|t| t.server == downstream.name && *t.tool == *record.tool)
                .cloned()
            else {
                continue;
            };
            found.push((
                (
                    view.name.clone(),
                    tool.exposed.clone(),
                    canonical_json(&record.args),
                ),
                entry.id,
            ));
        }
        let recovered = found.len();
        self.staged().extend(found);
        recovered
    }

    /// Remember a newly staged call, to answer an identical one with it. Calls decided
    /// or expired since are forgotten whenever the map holds more than the open calls the
    /// stores can hold, so it stays bounded over the daemon's life, however many calls
    /// are decided.
    fn remember_staged(&self, key: (String, String, String), ledger: LedgerId) {
        let bound = 2 * gatekeeper_core::store::MAX_OPEN_ACTIONS * self.downstreams.len().max(1);
        let mut staged = self.staged();
        staged.insert(key, ledger);
        if staged.len() > bound {
            staged.retain(|_, ledger| {
                self.overseer
                    .entry(*ledger)
                    .ok()
                    .flatten()
                    .and_then(|e| e.action().map(|a| a.state == ActionState::Pending))
                    .unwrap_or(false)
            });
        }
    }

    fn staged(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String, String), LedgerId>> {
        self.staged.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// For the person: each server's catalog as read now, against the one a person
    /// accepted (the one agents can call): tools changed, added or gone since.
    /// Server-provided names are rendered as code spans, so they cannot forge a line.
    pub async fn catalog_report(&self) -> String {
        let mut lines = Vec::new();
        for downstream in &self.downstreams {
            let server = code_span(&downstream.name, MAX_INLINE_CHARS);
            let accepted = downstream.accepted();
            let current = match downstream.server.refresh().await {
                Ok(catalog) => catalog,
                Err(error) => {
                    lines.push(format!(
                        "{server}: could not read its catalog now: {}",
                        plain_inline(&error, MAX_DESCRIPTION_CHARS)
                    ));
                    continue;
                }
            };
            let changes = accepted.changes(&current);
            if changes.is_empty() {
                lines.push(format!(
                    "{server}: {} tools, as accepted",
                    accepted.tools().len()
                ));
                lines.extend(withheld_lines(&current));
                lines.extend(downstream.pending.report());
                continue;
            }
            lines.push(format!("{server}:"));
            for name in &changes.added {
                lines.push(format!(
                    "  {} is new since the catalog was accepted: agents cannot call it until you accept it",
                    code_span(name, MAX_INLINE_CHARS)
                ));
            }
            for (name, _, _) in &changes.changed {
                lines.push(format!(
                    "  {} changed since the catalog was accepted: agents cannot call it until you accept it; what changed:",
                    code_span(name, MAX_INLINE_CHARS)
                ));
                if let (Some(was), Some(now)) = (accepted.get(name), current.get(name)) {
                    lines.extend(crate::changes::definition_diff(&was.raw, &now.raw));
                }
            }
            for name in &changes.gone {
                lines.push(format!(
                    "  {} is gone from the server: calls of it are refused",
                    code_span(name, MAX_INLINE_CHARS)
                ));
            }
            lines.extend(withheld_lines(&current));
            lines.extend(downstream.pending.report());
            lines.push(format!(
                "  to let agents use the catalog as it is now: gate catalog accept {}",
                downstream.name
            ));
        }
        if lines.is_empty() {
            lines.push("no servers are configured".to_owned());
        }
        lines.join("\n")
    }

    /// A person accepts the current catalog of `server` (every server when `None`): it is
    /// read again, recorded durably (when a directory is set) before anything else
    /// changes, becomes what the server's gatekeeper classifies and what agents see, and
    /// every connected agent is told its tool list changed. Calls staged against an
    /// earlier definition stay refused by the digest check. `Err` says what to do.
    ///
    /// With `tool` (and a server), only that tool is taken as the server lists it now (its
    /// new definition, or added, or gone); every other tool stays as accepted.
    pub async fn accept_catalog(
        &self,
        server: Option<&str>,
        tool: Option<&str>,
    ) -> Result<String, String> {
        let _one_at_a_time = self.accepting.lock().await;
        let chosen: Vec<&Downstream> = match server {
            None => self.downstreams.iter().collect(),
            Some(name) => match self.downstreams.iter().find(|d| d.name == name) {
                Some(downstream) => vec![downstream],
                None => {
                    return Err(format!(
                        "no server is named {}; the servers are: {}",
                        code_span(name, MAX_INLINE_CHARS),
                        self.downstreams
                            .iter()
                            .map(|d| code_span(&d.name, MAX_INLINE_CHARS).into_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
            },
        };
        let mut read = Vec::new();
        for downstream in chosen {
            let current = downstream.server.refresh().await.map_err(|error| {
                format!(
                    "{}: could not read its catalog now ({}), so nothing was accepted; try again when the server answers",
                    code_span(&downstream.name, MAX_INLINE_CHARS),
                    plain_inline(&error, MAX_DESCRIPTION_CHARS)
                )
            })?;
            let current = match tool {
                None => current,
                Some(tool) => downstream
                    .accepted()
                    .with_tool_from(&current, &downstream.name, tool)
                    .map(Arc::new)
                    .ok_or_else(|| {
                        format!(
                            "{}: tool {} is as you accepted it (or the server never listed it), so there is nothing to accept; `gate catalog` shows what changed",
                            code_span(&downstream.name, MAX_INLINE_CHARS),
                            code_span(tool, MAX_INLINE_CHARS)
                        )
                    })?,
            };
            read.push((downstream, current));
        }
        let mut lines = Vec::new();
        let mut changed_any = false;
        for (downstream, current) in read {
            let server = code_span(&downstream.name, MAX_INLINE_CHARS);
            let changes = downstream.accepted().changes(&current);
            if let Some(dir) = &self.catalogs {
                record_catalog(dir, &downstream.name, &current).map_err(|error| {
                    format!(
                        "{server}: the catalog could not be recorded in {} ({error}), so it was not accepted; check the data directory",
                        dir.display()
                    )
                })?;
            }
            downstream.pending.check(&downstream.name, &current);
            downstream
                .gatekeeper
                .replace_tools(current.gatekeeper_tools());
            *downstream
                .accepted
                .write()
                .unwrap_or_else(|p| p.into_inner()) = current.clone();
            info!(server = %downstream.name, tools = current.tools().len(), "catalog.accepted");
            changed_any |= !changes.is_empty();
            let names = |list: &mut dyn Iterator<Item = &String>| {
                list.map(|n| code_span(n, MAX_INLINE_CHARS).into_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let mut notes = Vec::new();
            if !changes.added.is_empty() {
                notes.push(format!("new: {}", names(&mut changes.added.iter())));
            }
            if !changes.changed.is_empty() {
                notes.push(format!(
                    "changed: {}",
                    names(&mut changes.changed.iter().map(|(n, ..)| n))
                ));
            }
            if !changes.gone.is_empty() {
                notes.push(format!("gone: {}", names(&mut changes.gone.iter())));
            }
            lines.push(format!(
                "{server}: {} tools{}",
                current.tools().len(),
                if notes.is_empty() {
                    ", unchanged".to_owned()
                } else {
                    format!(" ({})", notes.join("; "))
                }
            ));
        }
        // Every agent's view is rebuilt over the accepted catalogs; a view that cannot be
        // (two tools would share a name) keeps its earlier tools, and the person is told.
        let mut failed = Vec::new();
        for view in self.agents.values() {
            match AgentTools::build(
                &self.overseer,
                &view.name,
                &view.grants,
                &self.downstreams,
                false,
            ) {
                Ok(tools) => {
                    *view.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(tools);
                }
                Err(error) => failed.push(format!(
                    "agent {} keeps its earlier tools: {}",
                    code_span(&view.name, MAX_INLINE_CHARS),
                    plain_inline(&error.to_string(), MAX_DESCRIPTION_CHARS)
                )),
            }
        }
        if changed_any {
            self.announce_tools_changed().await;
        }
        let mut text = vec!["The accepted catalog is recorded; agents see it now.".to_owned()];
        text.extend(lines);
        text.extend(failed.iter().cloned());
        let text = text.join("\n");
        if failed.is_empty() {
            Ok(text)
        } else {
            Err(text)
        }
    }

    /// For the person: what happened to action `ledger` once it was decided (who decided,
    /// and the server's answer, the reason or the failure), or `None` while it waits.
    /// Everything from outside (the answer, the reason, the failure) is one sanitized line.
    pub async fn outcome(&self, ledger: LedgerId) -> Option<String> {
        let entry = self.overseer.entry(ledger).ok().flatten()?;
        let action = entry.action()?;
        let by = action.resolution.as_ref().map(|r| {
            let who = untrusted_label(&r.by, MAX_INLINE_CHARS);
            if r.auto {
                format!("by a rule {who} enabled")
            } else {
                format!("by {who}")
            }
        });
        let by = by.unwrap_or_else(|| "by nobody recorded".to_owned());
        Some(match action.state {
            ActionState::Pending => return None,
            ActionState::Approved => {
                let answer = match self
                    .applied_result(&entry.gatekeeper, action.driver_id)
                    .await
                {
                    Some(result) if result.is_error => format!(
                        "; the server answered with an error: {}",
                        untrusted_label(&result.text(), MAX_DESCRIPTION_CHARS)
                    ),
                    Some(result) => format!(
                        "; the server answered: {}",
                        untrusted_label(&result.text(), MAX_DESCRIPTION_CHARS)
                    ),
                    None => "; its answer is no longer kept".to_owned(),
                };
                format!("  what happened: approved {by} and sent{answer}")
            }
            ActionState::Rejected => {
                let reason = action
                    .resolution
                    .as_ref()
                    .and_then(|r| r.cause.as_deref())
                    .map(|cause| {
                        format!(
                            "; reason: {}",
                            untrusted_label(cause, MAX_DESCRIPTION_CHARS)
                        )
                    })
                    .unwrap_or_default();
                format!("  what happened: rejected {by}, so nothing was sent{reason}")
            }
            ActionState::Failed => {
                let failure = action.failure.as_ref();
                let what = match failure.map(|f| (f.retryable, f.kind)) {
                    Some((true, _)) => {
                        "failed before it reached the server (it waits for you again)"
                    }
                    Some((false, kernel::FailureKind::NotSent)) => {
                        "failed and was not sent (it never will be)"
                    }
                    Some((false, kernel::FailureKind::ServiceError)) => {
                        "failed: the server answered with an error"
                    }
                    _ => {
                        "failed, and it may have reached the server (outcome unknown; it will not be sent again)"
                    }
                };
                let message = failure
                    .map(|f| format!(": {}", untrusted_label(&f.message, MAX_DESCRIPTION_CHARS)))
                    .unwrap_or_default();
                format!("  what happened: approved {by}, then {what}{message}")
            }
            ActionState::Reverted => {
                format!("  what happened: approved {by}, sent, then reverted")
            }
            ActionState::Expired => {
                "  what happened: nobody decided it within its time to live, so it expired and nothing was sent".to_owned()
            }
        })
    }

    /// The digest of a recorded call as it stands now: its tool, the definition it was
    /// staged against and its arguments ([`gatekeeper_core::edit::call_digest`]); what a
    /// decision signed on the review page binds.
    pub async fn call_digest_of(&self, ledger: LedgerId) -> Option<String> {
        let record = self.record_of(ledger).await?;
        Some(gatekeeper_core::edit::call_digest(
            &record.tool,
            record.definition.as_deref().unwrap_or(""),
            &record.args,
        ))
    }

    /// Say that the open work changed (a stage, a decision), waking the review page.
    pub fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Wait on changes of the open work ([`Self::changed`]).
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The arguments of action `ledger`, as staged, from its driver's store.
    pub async fn arguments_of(&self, ledger: LedgerId) -> Option<Value> {
        Some((*self.record_of(ledger).await?.args).clone())
    }

    /// Action `ledger`'s record in its driver's store.
    async fn record_of(&self, ledger: LedgerId) -> Option<gatekeeper_core::store::ActionRecord> {
        let entry = self.overseer.entry(ledger).ok().flatten()?;
        let action = entry.action()?;
        let downstream = self
            .downstreams
            .iter()
            .find(|d| d.name.as_str() == &*entry.gatekeeper)?;
        downstream
            .gatekeeper
            .store()
            .get(action.driver_id)
            .await
            .ok()?
    }

    /// The server's answer to an applied action, from its driver's store.
    async fn applied_result(
        &self,
        gatekeeper: &str,
        driver_id: kernel::DriverActionId,
    ) -> Option<ToolResult> {
        let downstream = self.downstreams.iter().find(|d| d.name == gatekeeper)?;
        let record = downstream.gatekeeper.store().get(driver_id).await.ok()??;
        match record.state {
            gatekeeper_core::ActionState::Applied { result } => Some((*result).clone()),
            _ => None,
        }
    }

    /// The tools agent `agent` sees (none for an unknown agent).
    pub fn list_tools(&self, agent: &str) -> Vec<McpTool> {
        let Some(view) = self.agents.get(agent) else {
            return Vec::new();
        };
        let mut tools: Vec<McpTool> = view
            .tools()
            .tools
            .iter()
            .map(|t| t.listing.clone())
            .collect();
        tools.extend(gateway_tools());
        tools
    }

    /// Run one call of agent `agent`. `None` when the agent has no tool of that name.
    pub async fn call_tool(&self, agent: &str, tool: &str, args: Value) -> Option<CallToolResult> {
        match self
            .call_tool_in(agent, tool, args, CallContext::default(), None, false)
            .await?
        {
            CallToolResponse::Complete(result) => Some(result),
            // Without a relay no agent takes `input_required`: the gate answered it.
            _ => Some(error_result(
                "the server answered with something other than a tool result",
            )),
        }
    }

    /// [`Gateway::call_tool`] with the agent's per-call `context` (a
    /// [`gatekeeper_mcp::ReadRelay`]: where the server's progress goes, when the agent
    /// cancelled), which a read hands down to the server; a staged write does not carry it.
    /// While a read is in flight, `caller` (the agent's session) is the one to hear the
    /// server's log, when it is the only call in flight there. A server's `input_required`
    /// answer reaches an agent whose relay takes it as it was sent, recorded in the ledger
    /// with the agent's answers when it calls again ([`gatekeeper_mcp::rounds`]).
    ///
    /// With `tasks` (the agent's client declared MCP's tasks extension), a staged write
    /// answers with a task that stands for its action ([`Gateway::task`]).
    pub async fn call_tool_in(
        &self,
        agent: &str,
        tool: &str,
        args: Value,
        context: CallContext,
        caller: Option<Listener>,
        tasks: bool,
    ) -> Option<CallToolResponse> {
        let answer = self
            .call_tool_inner(agent, tool, args, &context, caller)
            .await?;
        if let Some(retry) = context.get::<ReadRelay>().and_then(|r| r.retry.as_ref()) {
            let answers = json!(retry.input_responses);
            self.record_exchange(agent, tool, "input answered", &answers.to_string())
                .await;
        }
        Some(match answer {
            Answer::Done(result) => CallToolResponse::Complete(result),
            // The task's first word is what the agent would have been told without it.
            Answer::Staged(result, ledger) if tasks => match self.task(agent, ledger.0).await {
                Some(task) => CallToolResponse::Task(CreateTaskResult::new(
                    task.task.with_status_message(text_of(&result)),
                )),
                None => CallToolResponse::Complete(result),
            },
            Answer::Staged(result, _) => CallToolResponse::Complete(result),
            Answer::InputRequired(raw) => {
                let questions = raw.get("inputRequests").cloned().unwrap_or(Value::Null);
                self.record_exchange(agent, tool, "input required", &questions.to_string())
                    .await;
                match serde_json::from_value::<InputRequiredResult>(raw) {
                    Ok(needed) => CallToolResponse::InputRequired(needed),
                    Err(error) => CallToolResponse::Complete(error_result(format!(
                        "the server asked for input in a form the gate cannot read ({error})"
                    ))),
                }
            }
        })
    }

    async fn call_tool_inner(
        &self,
        agent: &str,
        tool: &str,
        args: Value,
        context: &CallContext,
        caller: Option<Listener>,
    ) -> Option<Answer> {
        let view = self.agents.get(agent)?;
        match tool {
            ACTION_RESULT_TOOL => return Some(self.action_result(view, &args).await.into()),
            PENDING_TOOL => {
                self.expire_due().await;
                return Some(self.pending(view).into());
            }
            _ => {}
        }
        let current = view.tools();
        let entry = &current.tools[*current.by_name.get(tool)?];
        let session = current.sessions.get(&entry.server)?;
        if entry.read {
            if let Some(refusal) = self.read_refused(&view.name, entry.local_only, &entry.exposed) {
                return Some(error_result(refusal).into());
            }
            // The latch is written before the read is forwarded: if the daemon dies
            // after the data left the server, the agent is still locked down.
            if entry.sensitive
                && let Err(error) = self.latches.latch(&view.name, &entry.exposed).await
            {
                return Some(
                    error_result(format!(
                        "the gateway could not record that this read is sensitive ({error}), so it was not sent; ask the person to check the gate's data directory"
                    ))
                    .into(),
                );
            }
            let _in_flight = caller.map(|caller| self.call_in_flight(&entry.server, caller));
            // The agent's own pending writes on this server, shown where the server's
            // simulator can show them exactly ([`crate::pending`]).
            let note = match self.downstreams.iter().find(|d| d.name == entry.server) {
                Some(d) => match crate::pending::before_read(
                    d,
                    &self.overseer,
                    session,
                    &view.name,
                    &entry.tool,
                    &args,
                )
                .await
                {
                    crate::pending::BeforeRead::Answer(result) => {
                        return Some(downstream_result(&entry.server, &result, None).into());
                    }
                    crate::pending::BeforeRead::Forward(note) => note,
                },
                None => None,
            };
            return Some(match session.call_tool_in(&entry.tool, args, context).await {
                Ok(CallOutcome::Data { result, .. }) => match result.input_required {
                    Some(raw) => Answer::InputRequired(raw),
                    None => downstream_result(&entry.server, &result, note).into(),
                },
                Ok(CallOutcome::Pending { .. }) => error_result(
                    "the gateway expected a read and staged an action instead; ask the person to check the gate's log",
                )
                .into(),
                Err(error) => error_result(error.to_string()).into(),
            });
        }
        let label = caller.and_then(|caller| caller.session);
        Some(self.stage(view, entry, session, args, label).await)
    }

    async fn stage(
        &self,
        view: &AgentView,
        entry: &AgentTool,
        session: &Session,
        args: Value,
        label: Option<Arc<str>>,
    ) -> Answer {
        let key = (
            view.name.clone(),
            entry.exposed.clone(),
            canonical_json(&args),
        );
        // A sensitive read locked this agent's workspace down: nothing it writes may leave.
        if let Some(why) = self.lockdown_of(&view.name) {
            return error_result(format!(
                "Your workspace is locked down because {why}: none of your writes can be staged or sent any more, so \"{}\" was not staged and nothing was sent. Other agents are not affected; tell the person if this write is needed.",
                entry.exposed
            ))
            .into();
        }
        // A write is staged only against the definition the person granted: a tool the
        // server changed since is not callable until a person accepts the new catalog.
        if let Err(refusal) = entry.driver.check_current(&entry.tool, &entry.digest).await {
            return error_result(format!("{refusal}. Nothing was staged or sent.")).into();
        }
        let _turn = view.staging.lock().await;
        let known = self.staged().get(&key).copied();
        if let Some(ledger) = known {
            let still_pending = self
                .overseer
                .entry(ledger)
                .ok()
                .flatten()
                .and_then(|e| e.action().map(|a| a.state == ActionState::Pending))
                .unwrap_or(false);
            if still_pending {
                return Answer::Staged(text_result(self.staged_text(entry, ledger, true)), ledger);
            }
            self.staged().remove(&key);
        }
        // The person's limits: a write over one is not staged, and the agent is told which.
        let now = self.overseer.now();
        if !self.quotas.is_empty() {
            let open = self
                .overseer
                .open_actions()
                .unwrap_or_default()
                .iter()
                .filter(|e| *e.caller == *view.name)
                .filter(|e| e.action().is_some_and(|a| a.state == ActionState::Pending))
                .count();
            if let Err(why) = self.quotas.check(&view.name, &entry.server, open, now) {
                return error_result(why).into();
            }
        }
        // What the write acts on and is built on, where its server simulates it
        // ([`crate::pending`]): recorded to check for staleness before approval.
        let downstream = self.downstreams.iter().find(|d| d.name == entry.server);
        let basis = match downstream {
            Some(d) => {
                crate::pending::before_stage(d, &self.overseer, &view.name, &entry.tool, &args)
                    .await
            }
            None => None,
        };
        let built_on = match &basis {
            Some(crate::pending::Recorded::Basis(b)) => {
                crate::pending::driver_ids(&self.overseer, &b.built_on)
            }
            _ => Vec::new(),
        };
        let ruled = self.rule_over(&view.name, entry, &args);
        match session
            .call_tool_built_on(&entry.tool, args, &built_on)
            .await
        {
            Ok(CallOutcome::Pending { ledger, .. }) => {
                if let (Some(d), Some(basis)) = (downstream, basis) {
                    let open = self.overseer.open_actions().unwrap_or_default();
                    d.pending
                        .record(ledger.0, basis, |id| open.iter().any(|e| e.id.0 == id));
                }
                self.remember_staged(key, ledger);
                if let Some(label) = label {
                    self.session_grants.staged(ledger, label, |id| {
                        self.overseer
                            .entry(id)
                            .ok()
                            .flatten()
                            .and_then(|e| e.action().map(kernel::ActionEntry::is_open))
                            .unwrap_or(false)
                    });
                }
                self.quotas.record(&view.name, &entry.server, now);
                if let Some(notifier) = &self.notifier {
                    notifier.staged(&view.name, &entry.server, &entry.exposed, ledger.0);
                }
                self.changed();
                if let Some(enabled_by) = ruled {
                    return self.applied_by_rule(view, entry, ledger, &enabled_by).await;
                }
                Answer::Staged(text_result(self.staged_text(entry, ledger, false)), ledger)
            }
            Ok(CallOutcome::Data { .. }) => error_result(
                "the gateway expected to stage this call but the server ran it as a read; ask the person to check the gate's log",
            )
            .into(),
            Err(error) => error_result(error.to_string()).into(),
        }
    }

    /// Who enabled the rule that applies calls of `entry` without asking, if one does (its
    /// server marks the tool safe to repeat and the person enabled a rule for it).
    fn rule_over(&self, agent: &str, entry: &AgentTool, args: &Value) -> Option<String> {
        let gatekeeper = &self.downstream(&entry.server)?.gatekeeper;
        if !gatekeeper
            .classification(&entry.tool)
            .is_some_and(|c| c.auto_approvable())
        {
            return None;
        }
        let kind = gatekeeper.action_kind(&entry.tool)?;
        self.overseer
            .rules()
            .ok()?
            .into_iter()
            .find(|r| {
                r.gatekeeper == entry.server
                    && r.kind.tag == kind.tag
                    && r.admits(agent, || self.clock.now())
                    && gatekeeper_core::narrow::passes(args, &r.scope.arguments)
            })
            .map(|r| r.enabled_by)
    }

    /// What the agent is told of a call a rule applies: the kernel's drain sends it at once,
    /// so the gate waits for that (at most [`RULE_WAIT`]) and says what came of it, and that
    /// a rule, not a person looking at this call, let it through.
    async fn applied_by_rule(
        &self,
        view: &AgentView,
        entry: &AgentTool,
        ledger: LedgerId,
        enabled_by: &str,
    ) -> Answer {
        let _ = tokio::time::timeout(RULE_WAIT, self.overseer.settle()).await;
        let id = ledger.0;
        let rule = format!(
            "the person's rule for \"{}\" (enabled by {}) lets its calls through without asking",
            entry.exposed,
            plain_inline(enabled_by, MAX_INLINE_CHARS)
        );
        let state = self.action_state(&view.name, id);
        let told = match state {
            Some(ActionState::Approved) => {
                let applied = match self.overseer.entry(ledger).ok().flatten() {
                    Some(e) => self.applied_answer(view, &e).await,
                    None => None,
                };
                match applied {
                    Some(mut answer) => {
                        answer.content.insert(
                            0,
                            ContentBlock::text(format!(
                                "Applied at once as action {id}: {rule}. The server answered:"
                            )),
                        );
                        answer
                    }
                    None => text_result(format!("Applied at once as action {id}: {rule}.")),
                }
            }
            Some(ActionState::Pending) => text_result(format!(
                "{} A rule covers this call ({rule}): it is sent as soon as the actions staged before it on this server are decided.",
                self.staged_text(entry, ledger, false)
            )),
            _ => {
                let outcome = self.action_result(view, &json!({"action_id": id})).await;
                text_result(format!(
                    "Staged as action {id}, and {rule}, so it was sent at once: {}",
                    text_of(&outcome)
                ))
            }
        };
        Answer::Staged(told, ledger)
    }

    /// What the agent is told of its staged call: [`staged_message`], saying the write
    /// will show in its reads where its server simulates it ([`crate::pending`]).
    fn staged_text(&self, entry: &AgentTool, ledger: LedgerId, repeat: bool) -> String {
        let message = staged_message(&entry.exposed, ledger, repeat);
        match self.downstreams.iter().find(|d| d.name == entry.server) {
            Some(d) if d.pending.shows(&entry.tool) => crate::pending::staged_and_shown(&message),
            _ => message,
        }
    }

    /// Whether the open write `ledger` still finds what it was staged against, checked
    /// with real reads of its server now ([`crate::pending::check`]).
    pub async fn stale_check(&self, ledger: LedgerId) -> crate::pending::Check {
        let Some(entry) = self.overseer.entry(ledger).ok().flatten() else {
            return crate::pending::Check::Untracked;
        };
        match self
            .downstreams
            .iter()
            .find(|d| *d.name == *entry.gatekeeper)
        {
            Some(d) => crate::pending::check(d, &self.overseer, ledger).await,
            None => crate::pending::Check::Untracked,
        }
    }

    /// The recorded basis of the write `ledger` (what it acts on and is built on), when its
    /// server simulates it.
    pub fn basis_of(&self, ledger: LedgerId) -> Option<crate::pending::Recorded> {
        let entry = self.overseer.entry(ledger).ok().flatten()?;
        let d = self
            .downstreams
            .iter()
            .find(|d| *d.name == *entry.gatekeeper)?;
        d.pending.recorded(ledger.0)
    }

    /// The open writes built on `ledger` (their effect needs its), directly or through one
    /// another, ascending.
    pub fn built_on(&self, ledger: LedgerId) -> Vec<LedgerId> {
        let Some(entry) = self.overseer.entry(ledger).ok().flatten() else {
            return Vec::new();
        };
        let Some(d) = self
            .downstreams
            .iter()
            .find(|d| *d.name == *entry.gatekeeper)
        else {
            return Vec::new();
        };
        let open: Vec<u64> = self
            .overseer
            .open_actions()
            .unwrap_or_default()
            .iter()
            .filter(|e| e.gatekeeper == entry.gatekeeper)
            .map(|e| e.id.0)
            .collect();
        d.pending
            .built_on(ledger.0, &open)
            .into_iter()
            .map(LedgerId)
            .collect()
    }

    /// The outcome of agent `agent`'s action `id`, as `gate_action_result` tells it
    /// (`None` for an agent the gateway does not know).
    pub async fn action_outcome(&self, agent: &str, id: u64) -> Option<CallToolResult> {
        let view = self.agents.get(agent)?;
        Some(self.action_result(view, &json!({"action_id": id})).await)
    }

    /// Where agent `agent`'s action `id` is in its life, or `None` when it is not one of
    /// that agent's actions.
    pub fn action_state(&self, agent: &str, id: u64) -> Option<ActionState> {
        let entry = self.overseer.entry(LedgerId(id)).ok().flatten()?;
        if &*entry.caller != agent {
            return None;
        }
        Some(entry.action()?.state)
    }

    /// Agent `agent`'s action `id` as a task of MCP's tasks extension: working while it
    /// waits for a person (or waits again after a send that failed before reaching the
    /// server), completed with the server's answer once applied, and completed as an error
    /// carrying what `gate_action_result` says (the person's reason, the failure) when it
    /// ended any other way. `None` when it is not one of that agent's actions. A task says
    /// what the gate decided; it does not hold the action: cancelling it cancels nothing.
    pub async fn task(&self, agent: &str, id: u64) -> Option<DetailedTask> {
        let view = self.agents.get(agent)?;
        let entry = self.overseer.entry(LedgerId(id)).ok().flatten()?;
        if &*entry.caller != agent {
            return None;
        }
        let action = entry.action()?;
        let told = self.action_result(view, &json!({"action_id": id})).await;
        let waiting = action.state == ActionState::Pending
            || (action.state == ActionState::Failed
                && action.failure.as_ref().is_some_and(|f| f.retryable));
        let applied = match action.state {
            ActionState::Approved => self.applied_answer(view, &entry).await,
            _ => None,
        };
        let object = |result: CallToolResult| match serde_json::to_value(result) {
            Ok(Value::Object(object)) => object,
            _ => serde_json::Map::new(),
        };
        let payload = if waiting {
            TaskPayload::Working
        } else if let Some(answer) = applied {
            TaskPayload::Completed {
                result: object(answer),
            }
        } else {
            TaskPayload::Completed {
                result: object(CallToolResult::error(told.content.clone())),
            }
        };
        let status = text_of(&told);
        let updated = action
            .resolution
            .as_ref()
            .map_or(entry.created_at, |r| r.at);
        let task = Task::new(
            task_id(id),
            payload.status(),
            iso_time(entry.created_at),
            iso_time(updated),
        )
        .with_status_message(status)
        .with_poll_interval_ms(TASK_POLL_MS);
        Some(DetailedTask::new(task, payload))
    }

    /// The server's answer to an applied action, as the agent sees a read's.
    async fn applied_answer(
        &self,
        view: &AgentView,
        entry: &kernel::LedgerEntry,
    ) -> Option<CallToolResult> {
        let current = view.tools();
        let session = current.sessions.get(&*entry.gatekeeper)?;
        match session.get_action_result(entry.action()?.driver_id).await {
            Ok(ActionResult::Applied { result, .. }) => {
                Some(downstream_result(&entry.gatekeeper, &result, None))
            }
            _ => None,
        }
    }

    async fn action_result(&self, view: &AgentView, args: &Value) -> CallToolResult {
        self.expire_due().await;
        let Some(id) = args.get("action_id").and_then(Value::as_u64) else {
            return error_result(
                "action_id must be the number a staged call returned, for example {\"action_id\": 3}",
            );
        };
        let ledger = LedgerId(id);
        let unknown = || {
            error_result(format!(
                "you have no action {id}; {PENDING_TOOL} lists your open actions"
            ))
        };
        let Ok(Some(entry)) = self.overseer.entry(ledger) else {
            return unknown();
        };
        let Some(action) = entry.action() else {
            return unknown();
        };
        if &*entry.caller != view.name.as_str() {
            return unknown();
        }
        if action.state == ActionState::Expired {
            return text_result(format!(
                "Action {id} expired: nobody decided within its time to live, so nothing was sent and nothing will be. Stage the call again if it is still needed."
            ));
        }
        let current = view.tools();
        let Some(session) = current.sessions.get(&*entry.gatekeeper) else {
            return unknown();
        };
        // The ledger's failure is the kernel's word, also for an apply the gateway refused
        // before the driver's store was asked (a locked-down agent's action).
        if action.state == ActionState::Failed
            && let Some(failure) = &action.failure
        {
            let message = plain_inline(&failure.message, MAX_DESCRIPTION_CHARS);
            return text_result(if failure.retryable {
                format!(
                    "Action {id} failed before it reached the server: {message} It waits for a person again."
                )
            } else if failure.kind == kernel::FailureKind::OutcomeUnknown {
                format!(
                    "Action {id} failed, and it may have reached the server: {message} It will not be sent again."
                )
            } else if failure.kind == kernel::FailureKind::ServiceError {
                format!(
                    "Action {id} was approved and sent, and the server refused it: {message} It will not be sent again."
                )
            } else {
                format!("Action {id} failed and was not sent: {message} It will not be sent again.")
            });
        }
        match session.get_action_result(action.driver_id).await {
            Ok(ActionResult::Applied { result, .. }) => {
                // An edited approval: the agent learns what the person changed.
                let edited = action
                    .resolution
                    .as_ref()
                    .and_then(|r| r.cause.as_deref())
                    .filter(|cause| cause.starts_with(crate::edits::EDITED));
                let head = match edited {
                    Some(cause) => format!(
                        "Action {id} was approved with changes and sent: the person edited its arguments before approving ({}). The server answered:",
                        plain_inline(
                            cause
                                .strip_prefix(crate::edits::EDITED)
                                .unwrap_or(cause)
                                .trim_start(),
                            MAX_DESCRIPTION_CHARS
                        )
                    ),
                    None => format!("Action {id} was approved and sent; the server answered:"),
                };
                downstream_result(&entry.gatekeeper, &result, Some(head))
            }
            Ok(ActionResult::Rejected { .. }) => {
                // The person's reason is the resolution's cause in the ledger, so it
                // survives a restart; it is text from outside, shown sanitized.
                let reason = action
                    .resolution
                    .as_ref()
                    .and_then(|r| r.cause.as_deref())
                    .map(|cause| plain_inline(cause, MAX_DESCRIPTION_CHARS));
                text_result(match reason {
                    Some(reason) => format!(
                        "Action {id} was rejected by a person, so nothing was sent. Their reason: {reason}"
                    ),
                    None => format!("Action {id} was rejected by a person, so nothing was sent."),
                })
            }
            Ok(ActionResult::Failed { message, retryable }) => text_result(if retryable {
                format!(
                    "Action {id} failed before it reached the server: {message} It waits for a person again."
                )
            } else {
                format!(
                    "Action {id} failed, and it may have reached the server: {message} It will not be sent again."
                )
            }),
            Ok(ActionResult::Pending { .. }) => text_result(format!(
                "Action {id} still waits for a person's approval; nothing has been sent."
            )),
            Ok(ActionResult::Applying { .. }) => text_result(format!(
                "Action {id} was approved and is being sent now; ask again shortly."
            )),
            Err(error) => error_result(error.to_string()),
        }
    }

    /// Why a read of `what` by agent `agent` is refused, if it is: the agent is locked
    /// down and the server's reads may reach outside this machine, where a read's
    /// arguments (a query, an address) could carry what the agent read out.
    fn read_refused(&self, agent: &str, local_only: bool, what: &str) -> Option<String> {
        if local_only {
            return None;
        }
        let why = self.lockdown_of(agent)?;
        Some(format!(
            "Your workspace is locked down because {why}: a read of a server that may reach outside this machine could carry that data out in its arguments, so \"{what}\" was not sent. Reads of servers the person marked local_only still work; tell the person if this read is needed."
        ))
    }

    /// Record in the ledger that, during agent `agent`'s read of `tool`, its server asked
    /// the agent's client for something (`what`), and what came of it (`detail`).
    pub async fn record_exchange(&self, agent: &str, tool: &str, what: &str, detail: &str) {
        let server = {
            let Some(view) = self.agents.get(agent) else {
                return;
            };
            let current = view.tools();
            let Some(i) = current.by_name.get(tool) else {
                return;
            };
            current.tools[*i].server.clone()
        };
        self.record_server_exchange(agent, &server, what, detail)
            .await;
    }

    /// [`Gateway::record_exchange`] for a read of server `server` that is not a tool call
    /// (a resource read, a prompt).
    pub async fn record_server_exchange(
        &self,
        agent: &str,
        server: &str,
        what: &str,
        detail: &str,
    ) {
        let Some((_, session)) = self.session_for(agent, server) else {
            return;
        };
        if let Err(error) = session.record_exchange(what, detail).await {
            warn!(%agent, %error, "exchange.unrecorded");
        }
    }

    /// The servers agent `agent` holds a grant on and that declared `capability`, each
    /// with the agent's session on it.
    fn granted(&self, agent: &str, capability: &str) -> Vec<(&Downstream, Session)> {
        let Some(view) = self.agents.get(agent) else {
            return Vec::new();
        };
        let current = view.tools();
        self.downstreams
            .iter()
            .filter(|d| d.server.offers(capability))
            .filter_map(|d| Some((d, current.sessions.get(&d.name)?.clone())))
            .collect()
    }

    /// Every page of a listing (`resources/list`, `resources/templates/list`,
    /// `prompts/list`) of one server, through the agent's session: the items of `field`.
    async fn list_all(
        downstream: &Downstream,
        session: &Session,
        method: &str,
        field: &str,
    ) -> Result<Vec<Value>, String> {
        let mut items = Vec::new();
        let mut cursor: Option<String> = None;
        let pages = downstream.server.config().max_catalog_pages;
        for _ in 0..pages {
            let params = match cursor.take() {
                Some(cursor) => json!({"cursor": cursor}),
                None => json!({}),
            };
            let mut page = session
                .forward(method, &params, None, &CallContext::default())
                .await
                .map_err(|e| e.to_string())?;
            match page.get_mut(field).map(Value::take) {
                Some(Value::Array(listed)) => items.extend(listed),
                _ => return Err(format!("its {method} answer has no {field:?} list")),
            }
            match page.get("nextCursor").and_then(Value::as_str) {
                Some(next) if !next.is_empty() => cursor = Some(next.to_owned()),
                _ => return Ok(items),
            }
        }
        Err(format!(
            "its {method} goes on past {pages} pages (max_catalog_pages)"
        ))
    }

    /// What agent `agent` gets for a listing across the servers it holds a grant on:
    /// `resources/list` (field `resources`), `resources/templates/list`
    /// (`resourceTemplates`) or `prompts/list` (`prompts`), every page of each server,
    /// with addresses and names given as the gate's. A server that cannot list makes the
    /// whole listing fail, naming it: a partial list would read as "it has none".
    pub async fn list_forwarded(
        &self,
        agent: &str,
        method: &str,
        field: &str,
    ) -> Result<Vec<Value>, String> {
        let capability = if method.starts_with("prompts/") {
            "prompts"
        } else {
            "resources"
        };
        let mut all = Vec::new();
        for (downstream, session) in self.granted(agent, capability) {
            let mut items = Self::list_all(downstream, &session, method, field)
                .await
                .map_err(|error| {
                    format!(
                        "server {} could not list: {}; try again, or ask the person to check it",
                        code_span(&downstream.name, MAX_INLINE_CHARS),
                        plain_inline(&error, MAX_DESCRIPTION_CHARS)
                    )
                })?;
            match field {
                "resources" => rewrite_item_uris(&downstream.name, &mut items, "uri"),
                "resourceTemplates" => {
                    rewrite_item_uris(&downstream.name, &mut items, "uriTemplate")
                }
                _ => {
                    for item in &mut items {
                        if let Some(Value::String(name)) = item.get_mut("name") {
                            *name = prompt_name(&downstream.name, name);
                        }
                    }
                }
            }
            all.extend(items);
        }
        Ok(all)
    }

    /// The downstream server and the agent's session for a server named in a gate
    /// address or prompt name, when the agent holds a grant on it.
    fn session_for(&self, agent: &str, server: &str) -> Option<(&Downstream, Session)> {
        let view = self.agents.get(agent)?;
        let downstream = self.downstreams.iter().find(|d| d.name == server)?;
        let session = view.tools().sessions.get(server)?.clone();
        Some((downstream, session))
    }

    /// Agent `agent` reads the resource at gate address `uri`: a read, recorded as an
    /// observation like a read tool's, which locks the agent down first when its server
    /// marks its resources sensitive. The answer's addresses are the gate's. `Err` is
    /// `None` for an address the agent cannot read (no such server, or no grant on it).
    pub async fn read_resource(
        &self,
        agent: &str,
        uri: &str,
        context: CallContext,
    ) -> Result<Value, Option<String>> {
        let (server, original) = resource_of_uri(uri).ok_or(None)?;
        let (downstream, session) = self.session_for(agent, server).ok_or(None)?;
        if !downstream.server.offers("resources") {
            return Err(None);
        }
        if let Some(refusal) = self.read_refused(agent, downstream.local_only, uri) {
            return Err(Some(refusal));
        }
        // The latch is written before the read is forwarded, as for a sensitive tool.
        if downstream.sensitive_resources
            && let Err(error) = self.latches.latch(agent, uri).await
        {
            return Err(Some(format!(
                "the gateway could not record that this read is sensitive ({error}), so it was not sent; ask the person to check the gate's data directory"
            )));
        }
        let mut answer = session
            .forward(
                "resources/read",
                &json!({"uri": original}),
                Some(uri),
                &context,
            )
            .await
            .map_err(|e| Some(e.to_string()))?;
        if let Some(Value::Array(contents)) = answer.get_mut("contents") {
            rewrite_item_uris(server, contents, "uri");
        }
        Ok(answer)
    }

    /// Agent `agent` subscribes to the resource at gate address `uri` on its server. The
    /// server is asked (`resources/subscribe`, in its own terms) only for the first
    /// subscriber of that resource; the gate passes the server's updates on to each.
    /// Returns the server's driver and its own address, to listen for its updates; every
    /// subscription is ended with [`Gateway::unsubscribe_resource`].
    pub async fn subscribe_resource(
        &self,
        agent: &str,
        uri: &str,
    ) -> Result<(Arc<McpServer>, String), Option<String>> {
        let (server, original) = resource_of_uri(uri).ok_or(None)?;
        let (downstream, session) = self.session_for(agent, server).ok_or(None)?;
        if !downstream.server.offers_resource_subscriptions() {
            return Err(Some(format!(
                "server {} does not offer subscriptions to its resources; read it again instead",
                code_span(server, MAX_INLINE_CHARS)
            )));
        }
        let key = (server.to_owned(), original.to_owned());
        let _one_at_a_time = self.subscribing.lock().await;
        if let Some((count, _)) = self.subscribers().get_mut(&key) {
            *count += 1;
            return Ok((downstream.server.clone(), original.to_owned()));
        }
        session
            .forward(
                "resources/subscribe",
                &json!({"uri": original}),
                None,
                &CallContext::default(),
            )
            .await
            .map_err(|e| Some(e.to_string()))?;
        self.subscribers().insert(key, (1, session));
        Ok((downstream.server.clone(), original.to_owned()))
    }

    /// End one subscription [`Gateway::subscribe_resource`] made to `server`'s resource
    /// `original` (its own address); the server is told (`resources/unsubscribe`) when
    /// the last subscriber is gone.
    pub async fn unsubscribe_resource(&self, server: &str, original: &str) {
        let key = (server.to_owned(), original.to_owned());
        let _one_at_a_time = self.subscribing.lock().await;
        // The session that subscribed the server unsubscribes it.
        let last = {
            let mut subscribers = self.subscribers();
            match subscribers.get_mut(&key) {
                Some((count, _)) if *count > 1 => {
                    *count -= 1;
                    None
                }
                Some(_) => subscribers.remove(&key).map(|(_, session)| session),
                None => None,
            }
        };
        let Some(session) = last else {
            return;
        };
        let params = json!({"uri": original});
        let context = CallContext::default();
        let unsubscribe = session.forward("resources/unsubscribe", &params, None, &context);
        if let Err(error) = unsubscribe.await {
            warn!(%server, %error, "resources.unsubscribe.failed: the server may go on announcing updates, which nobody hears");
        }
    }

    fn subscribers(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<(String, String), (usize, Session)>> {
        self.subscribers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Agent `agent` gets prompt `name` (the gate's name, `<server>__<prompt>`) with
    /// `arguments`: a read of the server's text, recorded as an observation; embedded
    /// resources' addresses are the gate's. `Err(None)` when the agent has no such prompt.
    pub async fn get_prompt(
        &self,
        agent: &str,
        name: &str,
        arguments: Option<Value>,
        context: CallContext,
    ) -> Result<Value, Option<String>> {
        let (server, prompt) = prompt_of_name(name).ok_or(None)?;
        let (downstream, session) = self.session_for(agent, server).ok_or(None)?;
        if !downstream.server.offers("prompts") {
            return Err(None);
        }
        if let Some(refusal) = self.read_refused(agent, downstream.local_only, name) {
            return Err(Some(refusal));
        }
        let mut params = json!({"name": prompt});
        if let Some(arguments) = arguments {
            params["arguments"] = arguments;
        }
        let mut answer = session
            .forward("prompts/get", &params, Some(name), &context)
            .await
            .map_err(|e| Some(e.to_string()))?;
        if let Some(Value::Array(messages)) = answer.get_mut("messages") {
            for message in messages {
                if let Some(content) = message.get_mut("content") {
                    rewrite_block_uris(server, content);
                }
            }
        }
        Ok(answer)
    }

    /// Agent `agent` asks for completions of a prompt's or a resource template's
    /// argument: the reference (`ref/prompt` by the gate's prompt name, `ref/resource` by
    /// the gate's address) is given back to its server in the server's own terms; the
    /// rest of the request and the answer cross as they are. `Err(None)` when the
    /// reference names nothing the agent holds.
    pub async fn complete(&self, agent: &str, mut params: Value) -> Result<Value, Option<String>> {
        let reference = params.get_mut("ref").ok_or(None)?;
        let server = match reference.get("type").and_then(Value::as_str) {
            Some("ref/prompt") => {
                let name = reference.get("name").and_then(Value::as_str).ok_or(None)?;
                let (server, prompt) = prompt_of_name(name).ok_or(None)?;
                let (server, prompt) = (server.to_owned(), prompt.to_owned());
                reference["name"] = Value::String(prompt);
                server
            }
            Some("ref/resource") => {
                let uri = reference.get("uri").and_then(Value::as_str).ok_or(None)?;
                let (server, original) = resource_of_uri(uri).ok_or(None)?;
                let (server, original) = (server.to_owned(), original.to_owned());
                reference["uri"] = Value::String(original);
                server
            }
            _ => return Err(None),
        };
        let (downstream, session) = self.session_for(agent, &server).ok_or(None)?;
        if !downstream.server.offers("completions") {
            return Err(None);
        }
        session
            .forward(
                "completion/complete",
                &params,
                None,
                &CallContext::default(),
            )
            .await
            .map_err(|e| Some(e.to_string()))
    }

    fn pending(&self, view: &AgentView) -> CallToolResult {
        let open = match self.overseer.open_actions() {
            Ok(open) => open,
            Err(error) => return error_result(format!("the ledger could not be read: {error}")),
        };
        let mine: Vec<String> = open
            .iter()
            .filter(|e| &*e.caller == view.name.as_str())
            .filter_map(|e| {
                let action = e.action()?;
                Some(format!(
                    "action {}: {} ({})",
                    e.id.0,
                    e.title(),
                    action.state
                ))
            })
            .collect();
        text_result(if mine.is_empty() {
            "You have no actions waiting for a person.".to_owned()
        } else {
            format!("Waiting for a person:\n{}", mine.join("\n"))
        })
    }
}

/// For the person: each tool of `catalog` agents are not offered, with the reason (the
/// gate's own words; the tool's name is the server's, shown as a code span).
fn withheld_lines(catalog: &Catalog) -> impl Iterator<Item = String> + '_ {
    catalog.tools().iter().filter_map(|tool| {
        let reason = tool.withheld.as_deref()?;
        Some(format!(
            "  {} is not offered to agents: {reason}",
            code_span(&tool.name, MAX_INLINE_CHARS),
        ))
    })
}

/// The file in which `server`'s accepted catalog is recorded, in the catalogs directory.
pub fn catalog_file(dir: &Path, server: &str) -> PathBuf {
    dir.join(format!("{server}.json"))
}

/// Record `catalog` as `server`'s accepted catalog in `dir`: the tools exactly as the
/// server listed them, written to a temporary file, synced, then renamed over the old
/// record, so a crash leaves the old record or the new one, never half of one.
pub fn record_catalog(dir: &Path, server: &str, catalog: &Catalog) -> std::io::Result<()> {
    use std::io::Write as _;
    std::fs::create_dir_all(dir)?;
    let path = catalog_file(dir, server);
    let partial = dir.join(format!(".{server}.json.partial"));
    let text = serde_json::to_string_pretty(&Value::Array(catalog.raw_tools()))
        .map_err(std::io::Error::other)?;
    let mut file = std::fs::File::create(&partial)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&partial, &path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// The catalog recorded for `server` in `dir`, or `None` if none was recorded yet.
pub fn recorded_catalog(dir: &Path, server: &str) -> std::io::Result<Option<Catalog>> {
    let text = match std::fs::read_to_string(catalog_file(dir, server)) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let Value::Array(tools) = serde_json::from_str(&text).map_err(std::io::Error::other)? else {
        return Err(std::io::Error::other("the record is not a list of tools"));
    };
    Ok(Some(Catalog::from_raw_tools(server, tools)))
}

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
//! Nothing here decides: approving and rejecting belong to the person's side
//! ([`crate::control`]); an agent can only read the outcome of its own actions.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gatekeeper_core::{ActionResult, CallOutcome, Content, Session, ToolGatekeeper, ToolResult};
use gatekeeper_mcp::{McpServer, canonical_json, split_gated_name};
use kernel::{ActionState, Clock, LedgerId, Overseer, SystemClock};
use prompt_sanitize::{MAX_DESCRIPTION_CHARS, MAX_INLINE_CHARS, code_span, plain_inline};
use rmcp::model::{CallToolResult, ContentBlock, Tool as McpTool};
use serde_json::{Value, json};
use tokio::sync::Mutex;
use tracing::{info, warn};

use crate::names::{NameCollision, agent_names};
use crate::notify::Notifier;

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
    /// Its gatekeeper, registered with the kernel.
    pub gatekeeper: Arc<ToolGatekeeper>,
    /// Its tools whose reads are sensitive: reading one locks the reading agent's
    /// workspace down.
    pub sensitive_reads: Vec<String>,
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
    /// Its gated name in that server's gatekeeper.
    gated: String,
    /// Whether the classifier made it a read.
    read: bool,
    /// Whether reading it locks this agent's workspace down.
    sensitive: bool,
    /// What the agent is shown.
    listing: McpTool,
}

/// One agent's view: its tools and its sessions.
#[derive(Debug)]
pub struct AgentView {
    name: String,
    tools: Vec<AgentTool>,
    by_name: HashMap<String, usize>,
    sessions: HashMap<String, Session>,
    /// Held while this agent stages, so a repeat waits for the first and finds its action.
    staging: Mutex<()>,
    /// Why this agent's workspace is locked down (the sensitive read that latched it), or
    /// `None` while it is not.
    lockdown: std::sync::Mutex<Option<String>>,
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

/// The listing of one tool: the downstream definition as gatekeeper-core keeps it (boolean
/// hints only), under the agent-facing name, with the output schema only for reads.
fn listing(exposed: &str, downstream: &gatekeeper_mcp::CatalogTool, read: bool) -> Option<McpTool> {
    let mut shown = serde_json::to_value(&downstream.tool).ok()?;
    shown["name"] = Value::String(exposed.to_owned());
    if read && let Some(schema) = downstream.raw.get("outputSchema") {
        shown["outputSchema"] = schema.clone();
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

impl AgentView {
    /// The view of agent `name` over `downstreams`, given its grants as (server, tools or
    /// `None` for all).
    pub fn build(
        overseer: &Overseer,
        name: &str,
        grants: &[(String, Option<Vec<String>>)],
        downstreams: &[Downstream],
    ) -> Result<Self, ViewError> {
        let mut picked: Vec<(
            String,
            gatekeeper_mcp::CatalogTool,
            bool,
            bool,
            Arc<McpServer>,
        )> = Vec::new();
        let mut sessions = HashMap::new();
        for (server, tools) in grants {
            let downstream = downstreams
                .iter()
                .find(|d| &d.name == server)
                .ok_or_else(|| ViewError::UnknownServer {
                    agent: name.to_owned(),
                    server: server.clone(),
                })?;
            let catalog = downstream.server.catalog();
            let chosen: Vec<&gatekeeper_mcp::CatalogTool> = match tools {
                None => catalog.tools().iter().collect(),
                Some(tools) => tools
                    .iter()
                    .map(|tool| {
                        catalog.get(tool).ok_or_else(|| ViewError::UnknownTool {
                            agent: name.to_owned(),
                            server: server.clone(),
                            tool: tool.clone(),
                            listed: catalog
                                .tools()
                                .iter()
                                .map(|t| t.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", "),
                        })
                    })
                    .collect::<Result<_, _>>()?,
            };
            let gated: Vec<&str> = chosen.iter().map(|t| t.gated_name()).collect();
            let session = downstream
                .gatekeeper
                .grant(overseer, name, &gated)
                .map_err(|e| ViewError::Grant {
                    agent: name.to_owned(),
                    message: e.to_string(),
                })?
                .into_session();
            sessions.insert(server.clone(), session);
            for tool in chosen {
                let read = downstream
                    .gatekeeper
                    .classification(tool.gated_name())
                    .is_some_and(|c| c.is_read());
                let sensitive = read && downstream.sensitive_reads.contains(&tool.name);
                picked.push((
                    server.clone(),
                    tool.clone(),
                    read,
                    sensitive,
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
        for ((server, tool, read, sensitive, driver), exposed) in picked.into_iter().zip(exposed) {
            if let Some(listing) = listing(&exposed, &tool, read) {
                tools.push(AgentTool {
                    exposed,
                    driver,
                    server,
                    gated: tool.gated_name().to_owned(),
                    read,
                    sensitive,
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
            name: name.to_owned(),
            tools,
            by_name,
            sessions,
            staging: Mutex::new(()),
            lockdown: std::sync::Mutex::new(None),
        })
    }

    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Why this agent's workspace is locked down, or `None` while it is not.
    pub fn lockdown(&self) -> Option<String> {
        self.lockdown
            .lock()
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
    /// Where each agent's lockdown latch is kept (one file per locked-down agent), or
    /// `None` to keep latches in memory only.
    workspaces: Option<PathBuf>,
    /// The SQLite database behind the kernel, whose file is read page by page for the
    /// person's `gate ledger`.
    database: Option<store_sqlite::Database>,
    /// The gateway's time (lifts of lockdown, expiry).
    clock: Arc<dyn Clock>,
    /// Lifts of lockdown, when latches are kept in memory only.
    lifts_in_memory: std::sync::Mutex<Vec<Lift>>,
    /// Told of every newly staged action, to tell the person.
    notifier: Option<Notifier>,
}

/// The file, in the lockdown directory, that records each lift of an agent's lockdown,
/// one JSON object a line. (An agent name holds no dot, so no latch is named like it.)
pub const LIFTS_FILE: &str = "lifts.jsonl";

/// A recorded lift of an agent's lockdown.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Lift {
    /// When (milliseconds since the Unix epoch).
    pub at: u64,
    /// The agent.
    pub agent: String,
    /// Who lifted it: the operating system's user behind the person's socket.
    pub by: String,
    /// Why they judged it safe, as they wrote it.
    pub reason: String,
    /// Why it had been locked down.
    pub was: String,
}

/// Why a lockdown could not be lifted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LiftError {
    /// No agent has that name.
    #[error("there is no agent {0:?}; `gate lockdown` lists the locked-down agents")]
    UnknownAgent(String),
    /// The agent is not locked down.
    #[error("agent {0:?} is not locked down; there is nothing to lift")]
    NotLocked(String),
    /// No reason was given.
    #[error(
        "say why it is safe to lift the lockdown with --reason TEXT; it is recorded with your name"
    )]
    NoReason,
    /// The record or the latch could not be written.
    #[error(
        "the lift could not be recorded ({0}), so the lockdown stays; check the gate's data directory"
    )]
    Io(#[from] std::io::Error),
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

/// A downstream answer as the agent receives it. Blocks the toolkit does not keep (images,
/// resources) are replaced by a note.
fn downstream_result(result: &ToolResult, prefix: Option<String>) -> CallToolResult {
    let mut content: Vec<ContentBlock> = prefix.into_iter().map(ContentBlock::text).collect();
    for block in &result.content {
        content.push(ContentBlock::text(match block {
            Content::Text { text } => text.clone(),
            Content::Unsupported => "(a block that is not text was left out)".to_owned(),
        }));
    }
    let mut answer = if result.is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    answer.structured_content = result.structured_content.clone();
    answer
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
    /// A gateway over `overseer` and these servers, for these agents.
    pub fn new(overseer: Overseer, downstreams: Vec<Downstream>, agents: Vec<AgentView>) -> Self {
        Self {
            overseer,
            downstreams,
            agents: agents.into_iter().map(|a| (a.name.clone(), a)).collect(),
            staged: std::sync::Mutex::new(HashMap::new()),
            workspaces: None,
            database: None,
            clock: Arc::new(SystemClock),
            lifts_in_memory: std::sync::Mutex::new(Vec::new()),
            notifier: None,
        }
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
    /// it (the store defers some commits: a drain's last outcome, for one), so a reader
    /// of the file sees what the kernel knows.
    pub fn ledger_file(&self) -> Result<Option<&Path>, String> {
        let Some(database) = &self.database else {
            return Ok(None);
        };
        database.flush().map_err(|e| e.to_string())?;
        Ok(database.path())
    }

    /// The gateway's clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The agents' names, in order.
    pub fn agent_names(&self) -> impl Iterator<Item = &str> {
        self.agents.keys().map(String::as_str)
    }

    /// Lift agent `agent`'s lockdown, by `by` (the person behind the socket), for `reason`:
    /// the lift is appended to the record and synced first, then the latch is removed, so
    /// a lift that is not recorded does not happen. Returns why it had been locked down.
    pub fn lift_lockdown(&self, agent: &str, by: &str, reason: &str) -> Result<String, LiftError> {
        let view = self
            .agents
            .get(agent)
            .ok_or_else(|| LiftError::UnknownAgent(agent.to_owned()))?;
        if reason.trim().is_empty() {
            return Err(LiftError::NoReason);
        }
        let mut latch = view.lockdown.lock().unwrap_or_else(|p| p.into_inner());
        let Some(was) = latch.clone() else {
            return Err(LiftError::NotLocked(agent.to_owned()));
        };
        let lift = Lift {
            at: self.clock.now().0,
            agent: agent.to_owned(),
            by: by.to_owned(),
            reason: reason.to_owned(),
            was: was.clone(),
        };
        match &self.workspaces {
            Some(dir) => {
                use std::io::Write as _;
                let mut line = serde_json::to_string(&lift).expect("a lift serialises");
                line.push('\n');
                let mut file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(dir.join(LIFTS_FILE))?;
                file.write_all(line.as_bytes())?;
                file.sync_all()?;
                std::fs::remove_file(dir.join(agent))?;
                std::fs::File::open(dir)?.sync_all()?;
            }
            None => self
                .lifts_in_memory
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(lift),
        }
        warn!(%agent, %by, "lockdown lifted by the person");
        *latch = None;
        Ok(was)
    }

    /// The lifts recorded so far, oldest first (a line that cannot be read is skipped).
    pub fn lifts(&self) -> Vec<Lift> {
        match &self.workspaces {
            Some(dir) => std::fs::read_to_string(dir.join(LIFTS_FILE))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect(),
            None => self
                .lifts_in_memory
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }

    /// Keep each agent's lockdown latch in `dir` (created if missing): one file per
    /// locked-down agent, named after it, written and synced before a sensitive read is
    /// forwarded. Latches already there are loaded, so a lockdown outlives a restart.
    pub fn with_workspaces(mut self, dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        for view in self.agents.values() {
            match std::fs::read_to_string(dir.join(&view.name)) {
                Ok(why) => {
                    *view.lockdown.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(why.trim().to_owned());
                }
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(error),
            }
        }
        self.workspaces = Some(dir.to_owned());
        Ok(self)
    }

    /// Why agent `agent`'s workspace is locked down, or `None` while it is not (or for
    /// an agent the gateway does not know).
    pub fn lockdown_of(&self, agent: &str) -> Option<String> {
        self.agents.get(agent).and_then(AgentView::lockdown)
    }

    /// The agent that staged action `ledger` and why its workspace is locked down, when
    /// it is.
    pub fn locked_caller(&self, ledger: LedgerId) -> Option<(String, String)> {
        let entry = self.overseer.entry(ledger).ok().flatten()?;
        let why = self.lockdown_of(&entry.caller)?;
        Some((entry.caller.to_string(), why))
    }

    /// Latch `view`'s lockdown because it is about to read `tool`: durably first (when a
    /// directory is set), then in memory. It stays until a person lifts it
    /// ([`Gateway::lift_lockdown`]).
    fn latch_lockdown(&self, view: &AgentView, tool: &str) -> std::io::Result<()> {
        let mut latch = view.lockdown.lock().unwrap_or_else(|p| p.into_inner());
        if latch.is_some() {
            return Ok(());
        }
        let why = format!("it read the sensitive tool \"{tool}\"");
        if let Some(dir) = &self.workspaces {
            use std::io::Write as _;
            let path = dir.join(&view.name);
            let mut file = std::fs::File::create(&path)?;
            file.write_all(why.as_bytes())?;
            file.sync_all()?;
            std::fs::File::open(dir)?.sync_all()?;
        }
        warn!(agent = %view.name, %tool, "sensitive read: this agent's workspace is locked down");
        *latch = Some(why);
        Ok(())
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
                .tools
                .iter()
                .find(|t| t.server == downstream.name && *t.gated == *record.tool)
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

    fn staged(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String, String), LedgerId>> {
        self.staged.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// For the person: each server's catalog as read now, against the one accepted at start
    /// (the one agents can call): tools changed, added or gone since. Server-provided names
    /// are rendered as code spans, so they cannot forge a line.
    pub async fn catalog_report(&self) -> String {
        let mut lines = Vec::new();
        for downstream in &self.downstreams {
            let server = code_span(&downstream.name, MAX_INLINE_CHARS);
            let accepted: BTreeMap<String, String> = downstream
                .gatekeeper
                .tools()
                .filter_map(|(tool, _)| {
                    let (name, digest) = split_gated_name(&tool.name)?;
                    Some((name.to_owned(), digest.to_owned()))
                })
                .collect();
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
            let mut notes = Vec::new();
            for tool in current.tools() {
                let name = code_span(&tool.name, MAX_INLINE_CHARS);
                match accepted.get(&tool.name) {
                    None => notes.push(format!(
                        "  {name} is new since the gate started: agents cannot call it until you restart the gate"
                    )),
                    Some(digest) if *digest != tool.digest => notes.push(format!(
                        "  {name} changed since the gate started (definition {digest}, now {}): agents cannot call it until you restart the gate",
                        tool.digest
                    )),
                    Some(_) => {}
                }
            }
            for name in accepted.keys() {
                if current.get(name).is_none() {
                    notes.push(format!(
                        "  {} is gone from the server: calls of it are refused",
                        code_span(name, MAX_INLINE_CHARS)
                    ));
                }
            }
            if notes.is_empty() {
                lines.push(format!(
                    "{server}: {} tools, unchanged since the gate started",
                    accepted.len()
                ));
            } else {
                lines.push(format!("{server}:"));
                lines.extend(notes);
            }
        }
        if lines.is_empty() {
            lines.push("no servers are configured".to_owned());
        }
        lines.join("\n")
    }

    /// The tools agent `agent` sees (none for an unknown agent).
    pub fn list_tools(&self, agent: &str) -> Vec<McpTool> {
        let Some(view) = self.agents.get(agent) else {
            return Vec::new();
        };
        let mut tools: Vec<McpTool> = view.tools.iter().map(|t| t.listing.clone()).collect();
        tools.extend(gateway_tools());
        tools
    }

    /// Run one call of agent `agent`. `None` when the agent has no tool of that name.
    pub async fn call_tool(&self, agent: &str, tool: &str, args: Value) -> Option<CallToolResult> {
        let view = self.agents.get(agent)?;
        match tool {
            ACTION_RESULT_TOOL => return Some(self.action_result(view, &args).await),
            PENDING_TOOL => {
                self.expire_due().await;
                return Some(self.pending(view));
            }
            _ => {}
        }
        let entry = &view.tools[*view.by_name.get(tool)?];
        let session = view.sessions.get(&entry.server)?;
        if entry.read {
            // The latch is written before the read is forwarded: if the daemon dies
            // after the data left the server, the agent is still locked down.
            if entry.sensitive
                && let Err(error) = self.latch_lockdown(view, &entry.exposed)
            {
                return Some(error_result(format!(
                    "the gateway could not record that this read is sensitive ({error}), so it was not sent; ask the person to check the gate's data directory"
                )));
            }
            return Some(match session.call_tool(&entry.gated, args).await {
                Ok(CallOutcome::Data { result, .. }) => downstream_result(&result, None),
                Ok(CallOutcome::Pending { .. }) => error_result(
                    "the gateway expected a read and staged an action instead; ask the person to check the gate's log",
                ),
                Err(error) => error_result(error.to_string()),
            });
        }
        Some(self.stage(view, entry, session, args).await)
    }

    async fn stage(
        &self,
        view: &AgentView,
        entry: &AgentTool,
        session: &Session,
        args: Value,
    ) -> CallToolResult {
        let key = (
            view.name.clone(),
            entry.exposed.clone(),
            canonical_json(&args),
        );
        // A sensitive read locked this agent's workspace down: nothing it writes may leave.
        if let Some(why) = view.lockdown() {
            return error_result(format!(
                "Your workspace is locked down because {why}: none of your writes can be staged or sent any more, so \"{}\" was not staged and nothing was sent. Other agents are not affected; tell the person if this write is needed.",
                entry.exposed
            ));
        }
        // A write is staged only against the definition the person granted: a tool the
        // server changed since is not callable until a person accepts the new catalog.
        if let Err(refusal) = entry.driver.check_current(&entry.gated).await {
            return error_result(format!("{refusal}. Nothing was staged or sent."));
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
                return text_result(staged_message(&entry.exposed, ledger, true));
            }
            self.staged().remove(&key);
        }
        match session.call_tool(&entry.gated, args).await {
            Ok(CallOutcome::Pending { ledger, .. }) => {
                self.staged().insert(key, ledger);
                if let Some(notifier) = &self.notifier {
                    notifier.staged(&view.name, &entry.server, &entry.exposed);
                }
                text_result(staged_message(&entry.exposed, ledger, false))
            }
            Ok(CallOutcome::Data { .. }) => error_result(
                "the gateway expected to stage this call but the server ran it as a read; ask the person to check the gate's log",
            ),
            Err(error) => error_result(error.to_string()),
        }
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
        let Some(session) = view.sessions.get(&*entry.gatekeeper) else {
            return unknown();
        };
        match session.get_action_result(action.driver_id).await {
            Ok(ActionResult::Applied { result, .. }) => downstream_result(
                &result,
                Some(format!(
                    "Action {id} was approved and sent; the server answered:"
                )),
            ),
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

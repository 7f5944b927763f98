//! The gatekeeper of one tool server: what the kernel registers, and what mints grants.
//!
//! A [`ToolGatekeeper`] owns everything about one server: its classified catalog, the
//! rendered approval prompts, the [`ActionStore`], the [`ToolService`] and the optional
//! [`Simulator`] and [`Reverter`]. To the kernel it is a [`Gatekeeper`]; to a person it
//! mints [`Grant`]s, the only way an agent reaches the server.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use kernel::{
    ActionKind, ApprovalQueue, DEFAULT_CALL_DEADLINE, DriverActionId, Gatekeeper, GatekeeperError,
    Overseer, RejectOutcome, RevertOutcome,
};
use prompt_sanitize::{
    MAX_INLINE_CHARS, MAX_SERVER_NAME_CHARS, Sanitized, code_span, one_line, plain_inline,
    untrusted_label,
};
use tracing::warn;

use crate::classify::{ClassifiedTool, ServerTrust, classify};
use crate::describe::{CallPrompt, MAX_TITLE_TOOL_CHARS};
use crate::grant::{Grant, GrantError};
use crate::kind::action_kind_for;
use crate::revert::{REVERT_UNSUPPORTED_MESSAGE, Reverter};
use crate::service::ToolService;
use crate::simulate::Simulator;
use crate::store::{ActionState, ActionStore};
use crate::tool::Tool;

/// The longest failure message handed to the kernel, in chars (then `…`).
const MAX_MESSAGE_CHARS: usize = 2000;

/// The most tools taken from one server's catalog; the rest are ignored with a warning.
pub const MAX_TOOLS_PER_SERVER: usize = 200;

/// Who a gatekeeper is and what it fronts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatekeeperConfig {
    /// Unique among the kernel's gatekeepers; auto-approval rules are keyed by it.
    pub name: String,
    /// The server's display name, shown (sanitized) in every prompt.
    pub server_name: String,
    /// Where the server is, shown (sanitized) in every prompt.
    pub endpoint: String,
    /// How far the server's annotations are believed.
    pub trust: ServerTrust,
    /// The namespace of this server's action kinds (see [`action_kind_for`]).
    pub scope: String,
    /// The tools the person lists as reads (`reads` in a server's configuration): reads
    /// whatever the server claims, and on any trust tier ([`crate::classify`]).
    pub reads: Vec<String>,
}

/// One catalog tool, classified and with its prompts rendered once.
pub(crate) struct ToolEntry {
    pub(crate) tool: Tool,
    pub(crate) name: Arc<str>,
    pub(crate) classified: ClassifiedTool,
    pub(crate) kind: ActionKind,
    pub(crate) prompt: CallPrompt,
    /// Observation title when an applied result is handed over.
    pub(crate) result_title: Sanitized,
    /// Observation description when an applied result is handed over.
    pub(crate) result_description: Sanitized,
    /// What the agent is told of a staged call, up to its action id (see
    /// [`ToolEntry::pending_message`]).
    pending_lead: Box<str>,
}

/// What the agent is told of a staged call after its action id.
const PENDING_TAIL: &str = ") for the outcome.";

impl ToolEntry {
    fn new(config: &GatekeeperConfig, tool: Tool) -> Self {
        let classified = classify(&tool, config.trust, config.reads.contains(&tool.name));
        let server = plain_inline(&config.server_name, MAX_SERVER_NAME_CHARS);
        // The gate's words first, each untrusted part capped on its own (as in the prompt).
        let result_title = Sanitized::concat(&[
            &Sanitized::literal("Result of "),
            &plain_inline(&tool.name, MAX_TITLE_TOOL_CHARS),
            &Sanitized::literal(" on "),
            &server,
        ]);
        let result_description = Sanitized::concat(&[
            &Sanitized::literal("Read the response from the approved call to "),
            &code_span(&tool.name, MAX_INLINE_CHARS),
            &Sanitized::literal(" on **"),
            &server,
            &Sanitized::literal("**."),
        ]);
        let pending_lead = format!(
            "Calling \"{}\" on {} needs approval. After approval, call get_action_result(",
            tool.name, config.server_name
        )
        .into_boxed_str();
        Self {
            name: Arc::from(tool.name.as_str()),
            kind: action_kind_for(&config.scope, &tool.name),
            prompt: CallPrompt::new(&config.server_name, &config.endpoint, &tool, &classified),
            classified,
            result_title,
            result_description,
            pending_lead,
            tool,
        }
    }

    /// What the agent is told of a call of this tool staged as `action`: `Calling "<tool>"
    /// on <server> needs approval. After approval, call get_action_result(<action>) for the
    /// outcome.` Only the id changes from call to call, so the rest is written once, here.
    pub(crate) fn pending_message(&self, action: DriverActionId) -> String {
        // The id in decimal, as `DriverActionId` displays it, written without the
        // formatting machinery: this message is made for every staged call.
        let mut digits = [0u8; 20];
        let mut start = digits.len();
        let mut rest = action.0;
        loop {
            start -= 1;
            digits[start] = b'0' + (rest % 10) as u8;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        let digits = std::str::from_utf8(&digits[start..]).expect("ASCII digits");
        let mut message =
            String::with_capacity(self.pending_lead.len() + digits.len() + PENDING_TAIL.len());
        message.push_str(&self.pending_lead);
        message.push_str(digits);
        message.push_str(PENDING_TAIL);
        message
    }
}

/// A classified catalog: the entries in catalog order and an index by name. The index is
/// ordered: a catalog has at most [`MAX_TOOLS_PER_SERVER`] names, so a name is found in a
/// few comparisons, which for names as short as tools have costs less than hashing it.
#[derive(Default)]
pub(crate) struct Entries {
    list: Vec<Arc<ToolEntry>>,
    index: BTreeMap<Arc<str>, usize>,
}

impl Entries {
    fn new(config: &GatekeeperConfig, tools: Vec<Tool>) -> Self {
        if tools.len() > MAX_TOOLS_PER_SERVER {
            warn!(
                gatekeeper = %config.name,
                tools = tools.len(),
                "catalog.truncated: only the first {MAX_TOOLS_PER_SERVER} tools are used"
            );
        }
        let mut list = Vec::new();
        let mut index = BTreeMap::new();
        for tool in tools.into_iter().take(MAX_TOOLS_PER_SERVER) {
            if index.contains_key(tool.name.as_str()) {
                warn!(
                    gatekeeper = %untrusted_label(&config.name, MAX_INLINE_CHARS),
                    tool = %untrusted_label(&tool.name, MAX_INLINE_CHARS),
                    "catalog.duplicate: later tool ignored"
                );
                continue;
            }
            let entry = ToolEntry::new(config, tool);
            index.insert(entry.name.clone(), list.len());
            list.push(Arc::new(entry));
        }
        Self { list, index }
    }

    pub(crate) fn get(&self, tool: &str) -> Option<&Arc<ToolEntry>> {
        self.index.get(tool).map(|&i| &self.list[i])
    }
}

/// The gatekeeper of one tool server. Share it as `Arc<ToolGatekeeper>`: register a clone
/// with the kernel, mint grants from another.
///
/// Its catalog is the one a person accepted: [`ToolGatekeeper::new`] takes it, and
/// [`ToolGatekeeper::replace_tools`] swaps it for another while agents run. Grants and
/// sessions name their tools, so a session sees the current definition of each tool it
/// was granted (and loses a tool the new catalog lacks).
pub struct ToolGatekeeper {
    config: GatekeeperConfig,
    entries: RwLock<Arc<Entries>>,
    pub(crate) service: Arc<dyn ToolService>,
    pub(crate) store: ActionStore,
    pub(crate) simulator: Option<Arc<dyn Simulator>>,
    reverter: Option<Arc<dyn Reverter>>,
    /// How long one call to the service may take (applies and reverts through the
    /// kernel, reads through a session).
    call_deadline: Duration,
    /// Actions some read showed as if done: rejecting one asks for a restart.
    shown: Mutex<BTreeSet<DriverActionId>>,
}

impl fmt::Debug for ToolGatekeeper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolGatekeeper")
            .field("config", &self.config)
            .field("tools", &self.catalog().list.len())
            .field("simulator", &self.simulator.is_some())
            .field("reverter", &self.reverter.is_some())
            .field("call_deadline", &self.call_deadline)
            .finish_non_exhaustive()
    }
}

impl ToolGatekeeper {
    /// A gatekeeper over `tools` (the server's catalog), calling `service` and keeping its
    /// actions in `store`. Every tool is classified and its prompt rendered here, once.
    pub fn new(
        config: GatekeeperConfig,
        tools: Vec<Tool>,
        service: Arc<dyn ToolService>,
        store: ActionStore,
    ) -> Self {
        Self {
            entries: RwLock::new(Arc::new(Entries::new(&config, tools))),
            config,
            service,
            store,
            simulator: None,
            reverter: None,
            call_deadline: DEFAULT_CALL_DEADLINE,
            shown: Mutex::new(BTreeSet::new()),
        }
    }

    /// Replace the catalog (a person accepted a new one): every tool is classified and its
    /// prompt rendered again. Calls staged earlier keep the definition tag they were staged
    /// with ([`Tool::definition`]), so a service that checks it refuses them if their tool
    /// changed; sessions see the new definitions at their next call.
    pub fn replace_tools(&self, tools: Vec<Tool>) {
        let entries = Arc::new(Entries::new(&self.config, tools));
        *self.entries.write().unwrap_or_else(|p| p.into_inner()) = entries;
    }

    pub(crate) fn catalog(&self) -> Arc<Entries> {
        self.entries
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Show pending calls of the tools `simulator` simulates in later reads, and tell the
    /// agent it need not wait for them.
    pub fn with_simulator(mut self, simulator: Arc<dyn Simulator>) -> Self {
        self.simulator = Some(simulator);
        self
    }

    /// Let applied calls of the tools `reverter` reverts be undone on request.
    pub fn with_reverter(mut self, reverter: Arc<dyn Reverter>) -> Self {
        self.reverter = Some(reverter);
        self
    }

    /// Give every call to the service at most `deadline` (default
    /// [`DEFAULT_CALL_DEADLINE`]). The kernel enforces it on applies and reverts: an apply
    /// that passes it is recorded as failed with outcome unknown and never sent again. A
    /// session enforces it on reads: a read that passes it fails, and may be tried again.
    pub fn with_call_deadline(mut self, deadline: Duration) -> Self {
        self.call_deadline = deadline;
        self
    }

    /// The deadline of one call to the service.
    pub fn call_deadline(&self) -> Duration {
        self.call_deadline
    }

    /// The gatekeeper's name (as registered with the kernel).
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The server's display name.
    pub fn server_name(&self) -> &str {
        &self.config.server_name
    }

    /// The server's endpoint.
    pub fn endpoint(&self) -> &str {
        &self.config.endpoint
    }

    /// The trust tier the catalog was classified under.
    pub fn trust(&self) -> ServerTrust {
        self.config.trust
    }

    /// The action store.
    pub fn store(&self) -> &ActionStore {
        &self.store
    }

    /// The catalog with each tool's verdict, in catalog order (for a classification table).
    pub fn tools(&self) -> Vec<(Tool, ClassifiedTool)> {
        self.catalog()
            .list
            .iter()
            .map(|e| (e.tool.clone(), e.classified))
            .collect()
    }

    /// One tool of the catalog, by name.
    pub fn tool(&self, tool: &str) -> Option<Tool> {
        self.entry(tool).map(|e| e.tool.clone())
    }

    /// The verdict on one tool.
    pub fn classification(&self, tool: &str) -> Option<ClassifiedTool> {
        self.entry(tool).map(|e| e.classified)
    }

    /// The kind a call of `tool` is submitted under.
    pub fn action_kind(&self, tool: &str) -> Option<ActionKind> {
        self.entry(tool).map(|e| e.kind.clone())
    }

    /// Whether pending calls of `tool` are shown in reads.
    pub fn simulates(&self, tool: &str) -> bool {
        self.simulator.as_ref().is_some_and(|s| s.simulates(tool))
    }

    /// Whether applied calls of `tool` can be reverted.
    pub fn implements_revert(&self, tool: &str) -> bool {
        self.reverter.as_ref().is_some_and(|r| r.reverts(tool))
    }

    /// A grant of `tools` for `caller`, recording through the kernel queue minted for this
    /// gatekeeper. The gatekeeper must be registered with `overseer`.
    pub fn grant(
        self: &Arc<Self>,
        overseer: &Overseer,
        caller: &str,
        tools: &[&str],
    ) -> Result<Grant, GrantError> {
        let queue = overseer
            .queue_for(self.name(), caller)
            .map_err(GrantError::Kernel)?;
        self.grant_on(queue, tools)
    }

    /// A grant of every catalog tool for `caller`.
    pub fn grant_all(
        self: &Arc<Self>,
        overseer: &Overseer,
        caller: &str,
    ) -> Result<Grant, GrantError> {
        let catalog = self.catalog();
        let names: Vec<&str> = catalog.list.iter().map(|e| &*e.name).collect();
        self.grant(overseer, caller, &names)
    }

    /// A grant of `tools` over a queue obtained elsewhere. The queue must be the one the
    /// kernel minted for *this* gatekeeper (`Overseer::queue_for(self.name(), caller)`);
    /// prefer [`ToolGatekeeper::grant`], which cannot get that wrong.
    pub fn grant_on(
        self: &Arc<Self>,
        queue: Arc<dyn ApprovalQueue>,
        tools: &[&str],
    ) -> Result<Grant, GrantError> {
        let catalog = self.catalog();
        let mut allowed: Vec<Arc<str>> = Vec::with_capacity(tools.len());
        for &tool in tools {
            let entry = catalog.get(tool).ok_or_else(|| GrantError::UnknownTool {
                gatekeeper: self.name().to_owned(),
                tool: tool.to_owned(),
            })?;
            if !allowed.contains(&entry.name) {
                allowed.push(entry.name.clone());
            }
        }
        Ok(Grant::new(self.clone(), queue, allowed))
    }

    pub(crate) fn entry(&self, tool: &str) -> Option<Arc<ToolEntry>> {
        // Looked up under the lock: no need to hold the whole catalog for one entry.
        self.entries
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(tool)
            .cloned()
    }

    fn shown(&self) -> MutexGuard<'_, BTreeSet<DriverActionId>> {
        self.shown.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Remember that a read handed to an agent showed these pending actions.
    pub(crate) fn note_shown(&self, ids: &[DriverActionId]) {
        self.shown().extend(ids.iter().copied());
    }
}

#[async_trait]
impl Gatekeeper for ToolGatekeeper {
    fn name(&self) -> &str {
        &self.config.name
    }

    async fn apply_action(&self, action: DriverActionId) -> Result<(), GatekeeperError> {
        match self.store.apply(action, self.service.as_ref()).await {
            Ok(_sent_or_already) => Ok(()),
            // The message may quote the service: one line, nothing hidden, before the kernel
            // logs it and the ledger keeps it.
            Err(error) => Err(GatekeeperError {
                message: one_line(&error.to_string(), MAX_MESSAGE_CHARS).into_string(),
                retryable: error.retryable(),
                kind: error.failure_kind(),
            }),
        }
    }

    async fn reject_action(
        &self,
        action: DriverActionId,
    ) -> Result<RejectOutcome, GatekeeperError> {
        match self.store.reject(action).await {
            Ok(_rejected) => Ok(RejectOutcome {
                restart: self.shown().remove(&action),
                cascaded: Vec::new(),
            }),
            Err(error) => Err(GatekeeperError::fatal(error.to_string())),
        }
    }

    async fn revert_action(
        &self,
        action: DriverActionId,
    ) -> Result<RevertOutcome, GatekeeperError> {
        let record = self
            .store
            .get(action)
            .await
            .map_err(|e| GatekeeperError::retryable(e.to_string()))?
            .ok_or_else(|| {
                GatekeeperError::fatal(format!(
                    "action {action} is no longer kept here, so it cannot be reverted; undo it directly in the service if needed"
                ))
            })?;
        if !matches!(record.state, ActionState::Applied { .. }) {
            return Err(GatekeeperError::fatal(format!(
                "action {action} is {}, so there is nothing to revert",
                record.state.tag()
            )));
        }
        match &self.reverter {
            // A reverter's refusal or error often quotes the service: it reaches the kernel,
            // its log and the person as one visible line, whichever driver wrote it.
            Some(reverter) if reverter.reverts(&record.tool) => reverter
                .revert(&record, self.service.as_ref())
                .await
                .map(|mut outcome| {
                    outcome.message = outcome
                        .message
                        .map(|text| one_line(&text, MAX_MESSAGE_CHARS).into_string());
                    outcome
                })
                .map_err(|mut error| {
                    error.message = one_line(&error.message, MAX_MESSAGE_CHARS).into_string();
                    error
                }),
            _ => Ok(RevertOutcome::refused(REVERT_UNSUPPORTED_MESSAGE, false)),
        }
    }

    fn auto_approvable_actions(&self) -> Vec<ActionKind> {
        self.catalog()
            .list
            .iter()
            .filter(|e| e.classified.auto_approvable())
            .map(|e| e.kind.clone())
            .collect()
    }

    fn call_deadline(&self) -> Duration {
        self.call_deadline
    }

    async fn covers(
        &self,
        action: DriverActionId,
        tests: &[kernel::ArgumentTest],
    ) -> Result<bool, GatekeeperError> {
        let record = self
            .store
            .get(action)
            .await
            .map_err(|e| GatekeeperError::retryable(e.to_string()))?;
        Ok(record.is_some_and(|record| crate::narrow::passes(&record.args, tests)))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_pending_message_names_the_tool_the_server_and_the_id() {
        let config = GatekeeperConfig {
            name: "issues".into(),
            server_name: "Issue \"tracker\"".into(),
            endpoint: "https://issues.example/mcp".into(),
            trust: ServerTrust::Vetted,
            scope: "mcp:issues".into(),
            reads: Vec::new(),
        };
        let tool = Tool::from_json(json!({"name": "createIssue"})).expect("valid tool");
        let entry = ToolEntry::new(&config, tool);
        for id in [0, 7, 10, 1_234_567, u64::MAX] {
            let action = DriverActionId(id);
            assert_eq!(
                entry.pending_message(action),
                format!(
                    "Calling \"createIssue\" on Issue \"tracker\" needs approval. After approval, call get_action_result({action}) for the outcome."
                )
            );
        }
    }
}

//! The session: an agent's only way out to a tool server.
//!
//! Every call an agent makes goes through [`Session::call_tool`], which takes one of two
//! paths, decided by the classifier and nothing else:
//!
//! - **Read**: call the service, overlay simulated pending work, then ask the kernel to
//!   authorize the observation, and hand the data over only if it did.
//! - **Action**: stage the call in the store, submit it to the kernel queue (which answers
//!   at once), and return "pending". Nothing is sent to the service. If the kernel refuses
//!   the submission (lockdown), the staged record is discarded and the refusal returned.
//!
//! The agent later asks [`Session::get_action_result`]; an applied result is itself an
//! observation, authorized each time it is handed over.

use std::fmt;
use std::sync::Arc;

use kernel::deadline::{Bounded, Ended, Human};
use kernel::{
    ActionDescription, ApprovalQueue, DriverActionId, LedgerId, ObservationDescription, QueueError,
};
use prompt_sanitize::{
    MAX_INLINE_CHARS, MAX_SERVER_NAME_CHARS, Sanitized, plain_inline, untrusted_label,
};
use serde_json::{Map, Value};
use tracing::warn;

use crate::classify::{ClassifiedBy, Mode};
use crate::gatekeeper::{ToolEntry, ToolGatekeeper};
use crate::service::{CallContext, CallError, ToolResult};
use crate::simulate::PendingCall;
use crate::store::{ActionState, IdSet, StageError, StorageError};

/// What a call returned.
#[derive(Debug, Clone, PartialEq)]
pub enum CallOutcome {
    /// A read: the (authorized) data.
    Data {
        /// The service's reply, with simulated pending work overlaid.
        result: ToolResult,
        /// The observation recorded for it.
        observation: LedgerId,
    },
    /// An action: staged and submitted; nothing has been sent.
    Pending {
        /// The id to pass to [`Session::get_action_result`].
        action: DriverActionId,
        /// The kernel's id, which a person approves or rejects.
        ledger: LedgerId,
        /// What to tell the agent.
        message: String,
    },
}

impl CallOutcome {
    /// The data of a read.
    pub fn data(&self) -> Option<&ToolResult> {
        match self {
            Self::Data { result, .. } => Some(result),
            Self::Pending { .. } => None,
        }
    }

    /// The action id of a pending call.
    pub fn action(&self) -> Option<DriverActionId> {
        match self {
            Self::Pending { action, .. } => Some(*action),
            Self::Data { .. } => None,
        }
    }

    /// The kernel id of a pending call.
    pub fn ledger(&self) -> Option<LedgerId> {
        match self {
            Self::Pending { ledger, .. } => Some(*ledger),
            Self::Data { .. } => None,
        }
    }
}

/// Where a staged call is, as the agent learns it.
#[derive(Debug, Clone, PartialEq)]
pub enum ActionResult {
    /// Not decided yet.
    Pending {
        /// `Calling "<tool>" on <server> is awaiting approval.`
        message: String,
    },
    /// Approved; the call is in flight.
    Applying {
        /// `Calling "<tool>" on <server> was approved and is running.`
        message: String,
    },
    /// A person said no; nothing was sent.
    Rejected {
        /// `Calling "<tool>" on <server> was not approved.`
        message: String,
    },
    /// The apply failed.
    Failed {
        /// The stored failure text: what happened and what to do next.
        message: String,
        /// Whether a person may approve it again.
        retryable: bool,
    },
    /// Sent; the service's reply (authorized as an observation when handed over).
    Applied {
        /// The reply as retained.
        result: ToolResult,
        /// The observation recorded for handing it over.
        observation: LedgerId,
    },
}

impl ActionResult {
    /// Lower-case state name.
    pub fn status(&self) -> &'static str {
        match self {
            Self::Pending { .. } => "pending",
            Self::Applying { .. } => "applying",
            Self::Rejected { .. } => "rejected",
            Self::Failed { .. } => "failed",
            Self::Applied { .. } => "applied",
        }
    }

    /// The message, for every state but applied.
    pub fn message(&self) -> Option<&str> {
        match self {
            Self::Pending { message }
            | Self::Applying { message }
            | Self::Rejected { message }
            | Self::Failed { message, .. } => Some(message),
            Self::Applied { .. } => None,
        }
    }
}

/// A granted tool, as listed to the agent.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolInfo {
    /// Wire name.
    pub name: String,
    /// The server's display title.
    pub title: Option<String>,
    /// The server's description (untrusted).
    pub description: Option<String>,
    /// Read or action.
    pub mode: Mode,
    /// Whose word decided the mode.
    pub classified_by: ClassifiedBy,
    /// The argument schema.
    pub input_schema: Value,
}

/// Why a session call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The arguments were not a JSON object.
    #[error("tool arguments must be a JSON object.")]
    ArgumentsNotObject,
    /// The tool is not in this grant.
    #[error("this grant does not allow {}; it allows: {}", label(.tool), .allowed.iter().map(|t| label(t).into_string()).collect::<Vec<_>>().join(", "))]
    NotGranted {
        /// The tool asked for.
        tool: String,
        /// The tools the grant allows, in the order granted.
        allowed: Vec<String>,
    },
    /// The call could not be staged; nothing was stored or sent.
    #[error(transparent)]
    Stage(StageError),
    /// The kernel refused the submission; the staged call was discarded, nothing was sent.
    #[error("the approval queue refused this call, so it was not queued: {0}")]
    Submission(QueueError),
    /// The kernel refused the observation; the data was withheld.
    #[error("the kernel did not authorize this read, so its data was withheld: {0}")]
    Observation(QueueError),
    /// The service failed to answer a read.
    #[error("the read failed: {0}")]
    Service(CallError),
    /// No action with this id is visible through this grant.
    #[error("No action with id {0}.")]
    UnknownAction(DriverActionId),
    /// The action store failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// An untrusted name as an error message shows it: one delimited line, nothing hidden.
fn label(text: &str) -> Sanitized {
    untrusted_label(text, MAX_INLINE_CHARS)
}

struct SessionInner {
    gatekeeper: Arc<ToolGatekeeper>,
    queue: Arc<dyn ApprovalQueue>,
    /// The names of the granted tools, in the order granted. Each is looked up in the
    /// gatekeeper's current catalog at every call, so a session follows a catalog a person
    /// accepted later; a granted tool that catalog lacks is not callable.
    allowed: Vec<Arc<str>>,
    /// Pending actions some read of this session showed as done. Every action staged
    /// asks; until a read shows one (without a simulator, never) it is empty.
    shown: IdSet,
}

/// The agent's handle on one grant. Cheap to clone; clones share what reads have shown.
#[derive(Clone)]
pub struct Session {
    inner: Arc<SessionInner>,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("gatekeeper", &self.inner.gatekeeper.name())
            .field("tools", &self.allowed_tools())
            .finish_non_exhaustive()
    }
}

impl Session {
    pub(crate) fn new(
        gatekeeper: Arc<ToolGatekeeper>,
        queue: Arc<dyn ApprovalQueue>,
        allowed: Vec<Arc<str>>,
    ) -> Self {
        Self {
            inner: Arc::new(SessionInner {
                gatekeeper,
                queue,
                allowed,
                shown: IdSet::default(),
            }),
        }
    }

    pub(crate) fn gatekeeper(&self) -> &ToolGatekeeper {
        &self.inner.gatekeeper
    }

    /// The tools this session may call, in the order granted.
    pub fn allowed_tools(&self) -> Vec<&str> {
        self.inner.allowed.iter().map(|name| &**name).collect()
    }

    /// The pending actions earlier reads of this session showed as done; actions staged
    /// now depend on them.
    pub fn shown_actions(&self) -> Vec<DriverActionId> {
        self.inner.shown.ids()
    }

    /// Remember that a read of this session showed the pending actions `ids` as done,
    /// when a simulator outside the gatekeeper answered it (the gate's simulators of real
    /// MCP servers): actions staged afterwards depend on them, and rejecting one asks for
    /// the agent to be restarted, as for the gatekeeper's own [`Simulator`](crate::Simulator).
    pub fn note_shown(&self, ids: &[DriverActionId]) {
        if ids.is_empty() {
            return;
        }
        self.inner.shown.extend(ids.iter().copied());
        self.inner.gatekeeper.note_shown(ids);
    }

    /// [`Session::call_tool`] for a write known to be built on the pending actions
    /// `built_on` (its effect needs theirs, as a simulator worked out): it depends on them
    /// as well as on what earlier reads showed. A read ignores `built_on`.
    pub async fn call_tool_built_on(
        &self,
        name: &str,
        args: Value,
        built_on: &[DriverActionId],
    ) -> Result<CallOutcome, SessionError> {
        let entry = self.granted(name);
        match entry {
            Some(entry) if !entry.classified.is_read() => {
                let args = match args {
                    Value::Object(_) => args,
                    Value::Null => Value::Object(Map::new()),
                    _ => return Err(SessionError::ArgumentsNotObject),
                };
                self.act(&entry, args, built_on).await
            }
            _ => self.call_tool(name, args).await,
        }
    }

    fn granted(&self, tool: &str) -> Option<Arc<ToolEntry>> {
        if !self.inner.allowed.iter().any(|name| &**name == tool) {
            return None;
        }
        self.inner.gatekeeper.entry(tool)
    }

    /// Call a tool. A read returns its data; an action returns at once with the pending
    /// action's id. `args` must be a JSON object (`null` counts as `{}`).
    pub async fn call_tool(&self, name: &str, args: Value) -> Result<CallOutcome, SessionError> {
        self.call_tool_in(name, args, &CallContext::default()).await
    }

    /// [`Session::call_tool`] with the caller's `context` handed to the service with a
    /// read ([`ToolService::call_in`](crate::ToolService::call_in)); a staged write does
    /// not carry it.
    pub async fn call_tool_in(
        &self,
        name: &str,
        args: Value,
        context: &CallContext,
    ) -> Result<CallOutcome, SessionError> {
        let args = match args {
            Value::Object(_) => args,
            Value::Null => Value::Object(Map::new()),
            _ => return Err(SessionError::ArgumentsNotObject),
        };
        let entry = self.granted(name).ok_or_else(|| SessionError::NotGranted {
            tool: name.to_owned(),
            allowed: self
                .allowed_tools()
                .into_iter()
                .map(str::to_owned)
                .collect(),
        })?;
        if entry.classified.is_read() {
            self.read(&entry, args, context).await
        } else {
            self.act(&entry, args, &[]).await
        }
    }

    async fn read(
        &self,
        entry: &ToolEntry,
        args: Value,
        context: &CallContext,
    ) -> Result<CallOutcome, SessionError> {
        let gk = &self.inner.gatekeeper;
        let deadline = gk.call_deadline();
        // A read sends nothing that needs approval, so a read that fails may be tried again.
        let mut result = match Bounded::new(
            gk.service.call_in(
                &entry.name,
                entry.tool.definition.as_deref(),
                &args,
                context,
            ),
            deadline,
        )
        .await
        {
            Ended::Answered(result) => result.map_err(SessionError::Service)?,
            Ended::Panicked(panic) => {
                return Err(SessionError::Service(CallError::Unknown(format!(
                    "the service's client panicked during the read ({panic}); try the read again, and report the panic to the gatekeeper's maintainers"
                ))));
            }
            Ended::TimedOut => {
                return Err(SessionError::Service(CallError::Unknown(format!(
                    "the service did not answer within {}; try the read again later",
                    Human(deadline)
                ))));
            }
        };
        let mut shown = Vec::new();
        if let Some(simulator) = &gk.simulator {
            let pending: Vec<PendingCall> = gk
                .store
                .pending()
                .await?
                .into_iter()
                .filter(|r| simulator.simulates(&r.tool))
                .map(PendingCall::from)
                .collect();
            if !pending.is_empty() {
                let overlay = simulator.overlay(&entry.name, &args, result, &pending);
                result = overlay.result;
                shown = overlay.shown;
            }
        }
        let (title, description) = entry.prompt.describe(&args);
        let observation = self.observe(title, description).await?;
        // Only now has the agent seen the simulated actions.
        if !shown.is_empty() {
            self.inner.shown.extend(shown.iter().copied());
            gk.note_shown(&shown);
        }
        Ok(CallOutcome::Data {
            result,
            observation,
        })
    }

    /// Forward a request that reads and changes nothing to the service
    /// ([`ToolService::forward`](crate::ToolService::forward)), under the gatekeeper's
    /// deadline. When it reads data (`observed` names what: a resource's address, a
    /// prompt's name), the answer is handed over only after the kernel authorized it as
    /// an observation, as a read tool's is; a listing or a completion (`None`) is returned
    /// as it came. Any grant of the server may forward: what it reads is the server's, not
    /// one tool's.
    pub async fn forward(
        &self,
        method: &str,
        params: &Value,
        observed: Option<&str>,
        context: &CallContext,
    ) -> Result<Value, SessionError> {
        let gk = &self.inner.gatekeeper;
        let deadline = gk.call_deadline();
        let answer = match Bounded::new(gk.service.forward(method, params, context), deadline).await
        {
            Ended::Answered(answer) => answer.map_err(SessionError::Service)?,
            Ended::Panicked(panic) => {
                return Err(SessionError::Service(CallError::Unknown(format!(
                    "the service's client panicked during {method} ({panic}); try again, and report the panic to the gatekeeper's maintainers"
                ))));
            }
            Ended::TimedOut => {
                return Err(SessionError::Service(CallError::Unknown(format!(
                    "the service did not answer {method} within {}; try again later",
                    Human(deadline)
                ))));
            }
        };
        if let Some(what) = observed {
            let server = plain_inline(gk.server_name(), MAX_SERVER_NAME_CHARS);
            let what = untrusted_label(what, MAX_INLINE_CHARS);
            let method = plain_inline(method, MAX_INLINE_CHARS);
            let title = Sanitized::concat(&[
                &Sanitized::literal("Read "),
                &what,
                &Sanitized::literal(" of "),
                &server,
            ]);
            let description = Sanitized::concat(&[
                &Sanitized::literal("Forwarded `"),
                &method,
                &Sanitized::literal("` for "),
                &what,
                &Sanitized::literal(" to **"),
                &server,
                &Sanitized::literal("**."),
            ]);
            self.observe(title, description).await?;
        }
        Ok(answer)
    }

    /// Record in the ledger, as an observation of this session, an exchange the service
    /// began during a read: it asked the agent's client for something (`what`, the
    /// gate's own words, such as "elicitation"), and `detail` (the service's question and
    /// the answer, untrusted) is kept sanitized and bounded.
    pub async fn record_exchange(
        &self,
        what: &str,
        detail: &str,
    ) -> Result<LedgerId, SessionError> {
        let gk = &self.inner.gatekeeper;
        let server = plain_inline(gk.server_name(), MAX_SERVER_NAME_CHARS);
        let title = Sanitized::concat(&[
            &Sanitized::literal("A question of "),
            &server,
            &Sanitized::literal(" during a read: "),
            &plain_inline(what, MAX_INLINE_CHARS),
        ]);
        let description = Sanitized::concat(&[
            &Sanitized::literal("**"),
            &server,
            &Sanitized::literal("** asked the agent's client, which answered: "),
            &untrusted_label(detail, prompt_sanitize::MAX_DESCRIPTION_CHARS),
        ]);
        self.observe(title, description).await
    }

    /// Ask the kernel to authorize an observation described by `title` and
    /// `description` (built from sanitized pieces); the data goes out only if it did.
    async fn observe(
        &self,
        title: Sanitized,
        description: Sanitized,
    ) -> Result<LedgerId, SessionError> {
        self.inner
            .queue
            .authorize_observation(ObservationDescription::new(
                title.into_string(),
                description.into_string(),
            ))
            .await
            .map_err(SessionError::Observation)
    }

    async fn act(
        &self,
        entry: &ToolEntry,
        args: Value,
        built_on: &[DriverActionId],
    ) -> Result<CallOutcome, SessionError> {
        let gk = &self.inner.gatekeeper;
        let (title, description) = entry.prompt.describe(&args);
        let action = gk
            .store
            .stage_defined(
                entry.name.clone(),
                entry.tool.definition.as_deref().map(Arc::from),
                args,
            )
            .await
            .map_err(SessionError::Stage)?;
        let description = ActionDescription {
            title: title.into_string(),
            description: description.into_string(),
            implements_revert: gk.implements_revert(&entry.name),
            await_decision: !gk.simulates(&entry.name),
            auto_approvable: entry.classified.auto_approvable(),
            action_kind: Some(entry.kind.clone()),
            depends_on: {
                let mut depends_on = self.shown_actions();
                depends_on.extend(built_on.iter().copied());
                depends_on.sort_unstable();
                depends_on.dedup();
                depends_on
            },
        };
        match self.inner.queue.submit_action(action, description).await {
            Ok(ledger) => Ok(CallOutcome::Pending {
                action,
                ledger,
                message: entry.pending_message(action),
            }),
            Err(refusal) => {
                if let Err(error) = gk.store.discard(action).await {
                    warn!(%action, %error, "a refused action could not be discarded");
                }
                Err(SessionError::Submission(refusal))
            }
        }
    }

    /// Where a staged call is. Only actions of tools in this grant are visible.
    pub async fn get_action_result(
        &self,
        action: DriverActionId,
    ) -> Result<ActionResult, SessionError> {
        let gk = &self.inner.gatekeeper;
        let record = gk.store.get(action).await?;
        let Some((record, entry)) = record.and_then(|r| {
            let entry = self.granted(&r.tool)?;
            Some((r, entry))
        }) else {
            return Err(SessionError::UnknownAction(action));
        };
        let calling = || format!("Calling \"{}\" on {}", entry.name, gk.server_name());
        Ok(match record.state {
            ActionState::Pending => ActionResult::Pending {
                message: format!("{} is awaiting approval.", calling()),
            },
            ActionState::Applying => ActionResult::Applying {
                message: format!("{} was approved and is running.", calling()),
            },
            ActionState::Rejected => ActionResult::Rejected {
                message: format!("{} was not approved.", calling()),
            },
            ActionState::Failed { retryable, message } => {
                ActionResult::Failed { message, retryable }
            }
            ActionState::Applied { result } => {
                let observation = self
                    .inner
                    .queue
                    .authorize_observation(ObservationDescription::new(
                        entry.result_title.as_str(),
                        entry.result_description.as_str(),
                    ))
                    .await
                    .map_err(SessionError::Observation)?;
                ActionResult::Applied {
                    result: Arc::unwrap_or_clone(result),
                    observation,
                }
            }
        })
    }

    /// The granted tools with their verdicts, recorded as an observation.
    pub async fn list_tools(&self) -> Result<Vec<ToolInfo>, SessionError> {
        let gk = &self.inner.gatekeeper;
        let server = plain_inline(gk.server_name(), MAX_SERVER_NAME_CHARS);
        // The gate's words first: a server name cannot open the title.
        let title = Sanitized::concat(&[&Sanitized::literal("List the tools of "), &server]);
        let description = Sanitized::concat(&[
            &Sanitized::literal("Listed the tools of **"),
            &server,
            &Sanitized::literal("** that this grant allows."),
        ]);
        self.observe(title, description).await?;
        Ok(self
            .inner
            .allowed
            .iter()
            .filter_map(|name| gk.entry(name))
            .map(|entry| ToolInfo {
                name: entry.tool.name.clone(),
                title: entry.tool.title.clone(),
                description: entry.tool.description.clone(),
                mode: entry.classified.mode(),
                classified_by: entry.classified.classified_by(),
                input_schema: entry.tool.input_schema.clone(),
            })
            .collect())
    }
}

//! The ledger's record types: every action and observation the kernel has seen.
//!
//! A record is created once, by a submission or an observation, and then moves only
//! forward through [`ActionState`]. These types are plain data: the rules that move
//! them live in the Overseer, and where they are kept is the storage port's business.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::contract::{ActionDescription, DriverActionId, ObservationDescription};

/// The kernel's id for an entry; one sequence for actions and observations alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LedgerId(pub u64);

impl fmt::Display for LedgerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Where an action is in its life.
///
/// ```text
/// pending ──apply ok──► approved ──revert ok──► reverted
///    │  └──apply err──► failed ──(retryable: approve again)──► approved | failed
///    ├──reject──────► rejected
///    └──time to live passed──► expired
/// ```
///
/// Once an action leaves `pending` it never returns to it; `approved`, `rejected`,
/// `expired` and `reverted` are final, and so is `failed` unless it is retryable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ActionState {
    /// Submitted, not yet decided. Nothing has been sent.
    Pending,
    /// Applied: the driver reported success.
    Approved,
    /// Rejected by a person, or dropped with another action it depended on.
    Rejected,
    /// The apply was attempted and failed; the error text is kept.
    Failed,
    /// Applied, then undone at a person's request.
    Reverted,
    /// Nobody decided within its gatekeeper's time to live: nothing was sent, and nothing
    /// ever will be (see [`crate::Overseer::set_time_to_live`]).
    Expired,
}

impl ActionState {
    /// Lower-case name, as shown to people and stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Rejected => "rejected",
            Self::Failed => "failed",
            Self::Reverted => "reverted",
            Self::Expired => "expired",
        }
    }
}

impl fmt::Display for ActionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who moved an action out of `pending`, how, and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resolution {
    /// The person who decided, or who enabled the rule that decided.
    pub by: String,
    /// Whether an auto-approval rule decided rather than a person.
    pub auto: bool,
    /// When the decision was taken. For an approval this is just before the driver was
    /// called, and the record is written then, while the action is still open: a crash
    /// mid-apply leaves the ledger saying who approved a call that may have been sent.
    pub at: Timestamp,
    /// Why, when the kernel decided on someone's behalf (for example
    /// "cascaded from #3"), or when a person approved an action flagged as depending on
    /// one that was rejected, failed for good or reverted.
    pub cause: Option<String>,
}

/// The outcome of a revert request, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevertRecord {
    /// Who asked.
    pub by: String,
    /// When.
    pub at: Timestamp,
    /// `None` when the revert was done; otherwise the driver's reason for refusing.
    pub refused: Option<String>,
}

/// What is known about a call whose apply failed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FailureKind {
    /// Nothing reached the service: the driver refused before sending (credentials
    /// refused, a stale replace, content that was never created, an earlier action
    /// still pending). Nothing took effect.
    NotSent,
    /// The call may or may not have taken effect (a timeout or lost reply after sending,
    /// a deadline, a panic, an abandoned apply, a process that died mid-call). Never sent
    /// again; a person must check the service. The default: it is the safe reading of a
    /// failure nobody classified.
    #[default]
    OutcomeUnknown,
    /// The service answered with an error and did not carry out the call.
    ServiceError,
}

impl FailureKind {
    /// Lower-case name with underscores, as stored (`not_sent`, `outcome_unknown`,
    /// `service_error`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotSent => "not_sent",
            Self::OutcomeUnknown => "outcome_unknown",
            Self::ServiceError => "service_error",
        }
    }

    /// The kind named by [`FailureKind::as_str`], if any.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::NotSent, Self::OutcomeUnknown, Self::ServiceError]
            .into_iter()
            .find(|kind| kind.as_str() == name)
    }

    /// A few words for people: "not sent", "outcome unknown", "the service answered
    /// with an error".
    pub fn describe(self) -> &'static str {
        match self {
            Self::NotSent => "not sent",
            Self::OutcomeUnknown => "outcome unknown",
            Self::ServiceError => "the service answered with an error",
        }
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// A failed apply, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// The driver's message.
    pub message: String,
    /// Whether a person may approve the action again.
    pub retryable: bool,
    /// Whether the call was not sent, answered with an error, or has an unknown outcome.
    #[serde(default)]
    pub kind: FailureKind,
}

/// The action-specific part of a ledger entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionEntry {
    /// The driver's own id for the action.
    pub driver_id: DriverActionId,
    /// What the driver submitted, unchanged.
    pub description: Arc<ActionDescription>,
    /// Current state.
    pub state: ActionState,
    /// Set when a person or a rule decided: on rejection, and on approval just before the
    /// driver is called (so an action being applied, or interrupted while applied, already
    /// carries it); updated by each later attempt.
    pub resolution: Option<Resolution>,
    /// Set while the action is `failed`.
    pub failure: Option<Failure>,
    /// Ledger ids of the actions this one was staged on top of.
    pub depends_on: Vec<LedgerId>,
    /// Set when an action this one depends on was rejected: the root of that rejection.
    /// Such an action is never auto-applied; a person may still approve it.
    pub blocked_by: Option<LedgerId>,
    /// The driver asked for the agent to be restarted after deciding this action.
    pub restart_requested: bool,
    /// The last revert request, if any.
    pub revert: Option<RevertRecord>,
}

impl ActionEntry {
    /// Whether the action still waits for a person: pending, or failed in a way that
    /// may be retried.
    pub fn is_open(&self) -> bool {
        match self.state {
            ActionState::Pending => true,
            ActionState::Failed => self.failure.as_ref().is_some_and(|f| f.retryable),
            _ => false,
        }
    }
}

/// The kind-specific part of a ledger entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryBody {
    /// An action submitted for approval.
    Action(ActionEntry),
    /// A read that was authorized (observations are recorded, never pending).
    Observation(ObservationDescription),
}

/// One record of the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerEntry {
    /// The kernel's id.
    pub id: LedgerId,
    /// Name of the gatekeeper that submitted it.
    pub gatekeeper: Arc<str>,
    /// Who held the queue: the agent or process the capability was handed to.
    pub caller: Arc<str>,
    /// When it was recorded.
    pub created_at: Timestamp,
    /// Action or observation.
    pub body: EntryBody,
}

impl LedgerEntry {
    /// The action part, if this entry is an action.
    pub fn action(&self) -> Option<&ActionEntry> {
        match &self.body {
            EntryBody::Action(action) => Some(action),
            EntryBody::Observation(_) => None,
        }
    }

    /// The action part, mutably, if this entry is an action.
    pub fn action_mut(&mut self) -> Option<&mut ActionEntry> {
        match &mut self.body {
            EntryBody::Action(action) => Some(action),
            EntryBody::Observation(_) => None,
        }
    }

    /// The entry's one-line title.
    pub fn title(&self) -> &str {
        match &self.body {
            EntryBody::Action(action) => &action.description.title,
            EntryBody::Observation(observation) => &observation.title,
        }
    }
}

/// An auto-approval rule: actions of `kind` on `gatekeeper` may be applied without a
/// person, provided each one also says it is auto-approvable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AutoApprovalRule {
    /// The gatekeeper the rule is scoped to.
    pub gatekeeper: String,
    /// The kind it covers (keyed by tag).
    pub kind: crate::contract::ActionKind,
    /// The person who enabled it; auto-applied actions are attributed to them.
    pub enabled_by: String,
}

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
    /// When it was enabled (zero for a rule recorded before rules kept their time).
    #[serde(default)]
    pub enabled_at: Timestamp,
    /// How far it reaches: whose calls, until when, which arguments. The default reaches
    /// every call of its kind until it is removed.
    #[serde(default)]
    pub scope: RuleScope,
}

impl AutoApprovalRule {
    /// A rule for every call of `kind` on `gatekeeper` until it is removed.
    pub fn new(
        gatekeeper: impl Into<String>,
        kind: crate::contract::ActionKind,
        by: impl Into<String>,
    ) -> Self {
        Self {
            gatekeeper: gatekeeper.into(),
            kind,
            enabled_by: by.into(),
            enabled_at: Timestamp(0),
            scope: RuleScope::default(),
        }
    }

    /// Whether the rule still applies, at the time `now` reads (asked only of a rule that
    /// ends), to an action `caller` submitted; its argument tests are the gatekeeper's to
    /// evaluate ([`crate::Gatekeeper::covers`]).
    pub fn admits(&self, caller: &str, now: impl FnOnce() -> Timestamp) -> bool {
        self.scope
            .caller
            .as_deref()
            .is_none_or(|only| only == caller)
            && (self.scope.until.is_none() || !self.expired(now()))
    }

    /// Whether its time ran out at `now`.
    pub fn expired(&self, now: Timestamp) -> bool {
        self.scope.until.is_some_and(|until| now >= until)
    }
}

/// The reach of an [`AutoApprovalRule`] beyond its kind. Every part narrows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleScope {
    /// Only actions this caller (an agent) submitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
    /// A label of the caller's session the rule was made for: whoever runs the sessions
    /// removes the rule when that session ends (the kernel does not see sessions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// It stops applying at this instant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Timestamp>,
    /// Tests on the call's arguments, all of which must hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub arguments: Vec<ArgumentTest>,
}

impl RuleScope {
    /// Whether the scope is the whole kind, for every caller, until removed.
    pub fn is_whole_kind(&self) -> bool {
        *self == Self::default()
    }
}

/// The scope in words, for a person: `every call, until removed`, or each narrowing
/// (`calls of agent "coder" only, in the session it was made for, until 10:00:00.000,
/// where path is under /tmp/a`).
impl fmt::Display for RuleScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.caller {
            Some(caller) => write!(f, "calls of agent {caller:?} only")?,
            None => write!(f, "every agent's calls")?,
        }
        if self.session.is_some() {
            write!(f, ", in the session it was made for")?;
        }
        match self.until {
            Some(until) => write!(f, ", until {until}")?,
            None => write!(f, ", until removed")?,
        }
        for (n, test) in self.arguments.iter().enumerate() {
            let joint = if n == 0 { ", where" } else { " and" };
            write!(f, "{joint} {test}")?;
        }
        Ok(())
    }
}

/// One test on a named argument of a call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArgumentTest {
    /// The argument's name (a top-level key of the call's arguments).
    pub argument: String,
    /// What its value must satisfy.
    pub check: ArgumentCheck,
}

/// What an argument's value must satisfy. A missing argument satisfies nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArgumentCheck {
    /// The value is exactly this text (a number or boolean as it is written in JSON).
    Is(String),
    /// The value is a path at or below this one, compared component by component; a
    /// path with a `..` component is never below anything.
    Under(String),
    /// A number at most this, or a text of at most this many bytes.
    AtMost(u64),
}

impl fmt::Display for ArgumentTest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.check {
            ArgumentCheck::Is(value) => write!(f, "{} is {value:?}", self.argument),
            ArgumentCheck::Under(path) => write!(f, "{} is under {path}", self.argument),
            ArgumentCheck::AtMost(limit) => write!(f, "{} is at most {limit}", self.argument),
        }
    }
}

//! The driver contract: the traits a gatekeeper implements and the queue it is handed.
//!
//! This module is the whole surface between the kernel and a driver. The kernel never
//! sees a concrete driver type, a service, or a tool annotation: it sees a
//! [`Gatekeeper`] trait object and the descriptions the driver chose to submit.
//!
//! The flow of one action, as a contract:
//!
//! 1. The driver stages the call in its own store and gets its own id for it
//!    (a [`DriverActionId`]).
//! 2. It calls [`ApprovalQueue::submit_action`] with that id and an
//!    [`ActionDescription`]. The call returns at once with the ledger id; it never
//!    waits for a person or for auto-approval.
//! 3. Later (seconds or days), the kernel calls exactly one of
//!    [`Gatekeeper::apply_action`] (a person or a rule said yes) or
//!    [`Gatekeeper::reject_action`] (a person said no), with the driver's id.
//! 4. After a successful apply, a person may ask for [`Gatekeeper::revert_action`],
//!    but only if the description said [`ActionDescription::implements_revert`].
//!
//! Reads follow a shorter path: the driver fetches the data, calls
//! [`ObservationAuthorizer::authorize_observation`], and returns the data only if
//! that call succeeded.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::deadline::DEFAULT_CALL_DEADLINE;
use crate::ledger::{FailureKind, LedgerId};

/// The id a driver gives an action it staged; passed back to it on apply, reject and revert.
///
/// Driver ids are scoped to one gatekeeper: two gatekeepers may both have an action `1`.
/// The kernel's own [`LedgerId`] is what people see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DriverActionId(pub u64);

impl fmt::Display for DriverActionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The kind of an action, for auto-approval rules.
///
/// `tag` and `label` always travel together: policy keys on `tag` (treat it as a
/// stable identifier; several actions may share a tag to be governed as one group),
/// `label` is what a person reads in the list of rules.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ActionKind {
    /// Stable key of the kind; a rule is keyed by gatekeeper name and this tag.
    pub tag: String,
    /// Display name of the kind.
    pub label: String,
}

impl ActionKind {
    /// A kind with the given tag and label.
    pub fn new(tag: impl Into<String>, label: impl Into<String>) -> Self {
        Self {
            tag: tag.into(),
            label: label.into(),
        }
    }
}

/// What a driver tells the kernel (and through it, a person) about one staged action.
///
/// The description is stored in the ledger as it was submitted: it is the audit record
/// of what the person was asked to approve.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionDescription {
    /// One line for a list of pending work.
    pub title: String,
    /// Everything the approver needs, as Markdown built from sanitized pieces.
    pub description: String,
    /// Whether [`Gatekeeper::revert_action`] is implemented for this action.
    /// When false the kernel refuses to revert and never calls the driver.
    pub implements_revert: bool,
    /// Advice to the harness: suspend the agent's turn until this action is decided.
    /// Set by drivers that cannot simulate the action's effect. Not enforced by the kernel.
    pub await_decision: bool,
    /// The driver's verdict that this action is safe to apply without a person *if* a
    /// person enabled a rule for its kind. One of two keys; alone it applies nothing.
    pub auto_approvable: bool,
    /// The kind for auto-approval rules; without one the action is always manual.
    pub action_kind: Option<ActionKind>,
    /// Actions of the same gatekeeper whose simulated effect the agent saw before it
    /// staged this one. If any of them is rejected, this action is flagged and no longer
    /// applied automatically.
    pub depends_on: Vec<DriverActionId>,
}

impl ActionDescription {
    /// A manual, non-revertible description with the given title and body.
    pub fn new(title: impl Into<String>, description: impl Into<String>) -> Self {
        Self {
            title: title.into(),
            description: description.into(),
            ..Self::default()
        }
    }
}

/// What a driver tells the kernel about one read before it hands the data over.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObservationDescription {
    /// One line for the ledger.
    pub title: String,
    /// Details, as Markdown built from sanitized pieces.
    pub description: String,
    /// The data is sensitive: authorizing it latches lockdown, after which no new action
    /// may be submitted in this workspace.
    pub prohibit_all_sharing: bool,
}

impl ObservationDescription {
    /// An ordinary (non-sensitive) observation.
    pub fn new(title: impl Into<String>, description: impl Into<String>) -> Self {
        Self {
            title: title.into(),
            description: description.into(),
            prohibit_all_sharing: false,
        }
    }
}

/// What a driver reports after rejecting an action.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejectOutcome {
    /// The agent should be restarted: what it saw included the rejected action's effect.
    pub restart: bool,
    /// Other pending actions of this driver that were dropped with this one (for example
    /// edits of a page whose creation was rejected). The kernel marks them rejected.
    pub cascaded: Vec<DriverActionId>,
}

/// What a driver reports after a revert request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevertOutcome {
    /// `None`: the revert was done. `Some`: it was not done, and this says why (Markdown
    /// for a person).
    pub message: Option<String>,
    /// When not done: whether asking again later may succeed.
    pub can_retry: bool,
    /// The agent should be restarted because the world it saw changed.
    pub restart: bool,
}

impl RevertOutcome {
    /// The revert was carried out.
    pub fn done() -> Self {
        Self::default()
    }

    /// The revert was refused, with a reason a person can act on.
    pub fn refused(message: impl Into<String>, can_retry: bool) -> Self {
        Self {
            message: Some(message.into()),
            can_retry,
            restart: false,
        }
    }
}

/// A driver's refusal or failure, as text a person reads.
///
/// `retryable` is true only when the driver knows nothing reached the service (for
/// example, credentials were refused): the same approval may then be given again.
/// `kind` says what is known about the call: it was not sent, the service answered with
/// an error, or its outcome is unknown. The ledger keeps it with a failed apply, so a
/// person can tell "check the service" apart from "nothing happened".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct GatekeeperError {
    /// What happened and what to do next.
    pub message: String,
    /// Whether approving the same action again may succeed without risking a second send.
    pub retryable: bool,
    /// What is known about whether the call took effect.
    pub kind: FailureKind,
}

impl GatekeeperError {
    /// A failure after which the call may or may not have taken effect (a timeout after
    /// sending, a lost reply, a panic): never applied again, and a person must check the
    /// service. The safe default for a failure the driver cannot classify.
    pub fn fatal(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: false,
            kind: FailureKind::OutcomeUnknown,
        }
    }

    /// A failure known to have happened before anything reached the service, after which
    /// the same approval may be given again.
    pub fn retryable(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: true,
            kind: FailureKind::NotSent,
        }
    }

    /// A final refusal known to have happened before anything reached the service (a
    /// stale replace, an action on content that was never created): nothing took effect,
    /// and approving it again will not help.
    pub fn not_sent(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: false,
            kind: FailureKind::NotSent,
        }
    }

    /// The service answered with an error and did not carry out the call; `retryable`
    /// says whether the same approval may be given again.
    pub fn service_error(message: impl Into<String>, retryable: bool) -> Self {
        Self {
            message: message.into(),
            retryable,
            kind: FailureKind::ServiceError,
        }
    }
}

/// A driver, as the kernel sees it: something that applies, rejects and reverts the
/// actions it submitted.
///
/// # Contract
///
/// - `apply_action` is called only after a person approved the action or an
///   auto-approval rule matched it. It performs the side effect at most once: a second
///   call for an action already applied returns `Ok(())` without sending anything, a
///   call while another is in flight returns an error. An `Err` tells the kernel the
///   action failed; [`GatekeeperError::retryable`] says whether a person may try again.
/// - `reject_action` drops a pending action without sending anything. It reports which
///   other pending actions were dropped with it and whether the agent needs a restart.
/// - `revert_action` undoes an applied action when the description promised it can. A
///   refusal is a value ([`RevertOutcome::refused`]), not an error; `Err` means the
///   attempt itself failed.
/// - `auto_approvable_actions` lists the kinds that *may* auto-apply, for a pre-approval
///   screen. The per-action [`ActionDescription::auto_approvable`] remains the gate.
/// - Every call above is bounded by [`Gatekeeper::call_deadline`]. When an apply does not
///   answer in time, or panics, or the decision awaiting it is dropped, the kernel stops
///   waiting (the future is dropped) and records the action as failed with outcome unknown:
///   it may have reached the service, and it is never applied again. A driver that keeps a
///   claim for the attempt must turn that claim into "outcome unknown" when its future is
///   dropped half way (gatekeeper-core's action store does).
#[async_trait]
pub trait Gatekeeper: Send + Sync {
    /// The gatekeeper's name, unique within one kernel; rules are keyed by it.
    fn name(&self) -> &str;

    /// Apply an approved action. See the trait's contract.
    async fn apply_action(&self, action: DriverActionId) -> Result<(), GatekeeperError>;

    /// Reject a pending action. See the trait's contract.
    async fn reject_action(&self, action: DriverActionId)
    -> Result<RejectOutcome, GatekeeperError>;

    /// Revert an applied action. See the trait's contract.
    async fn revert_action(&self, action: DriverActionId)
    -> Result<RevertOutcome, GatekeeperError>;

    /// The kinds of action this gatekeeper may submit as auto-approvable.
    fn auto_approvable_actions(&self) -> Vec<ActionKind>;

    /// How long the kernel waits for one apply, reject or revert of this gatekeeper
    /// before it gives up on it ([`DEFAULT_CALL_DEADLINE`] unless the driver says otherwise).
    /// An apply that passes it is recorded as failed with outcome unknown.
    fn call_deadline(&self) -> Duration {
        DEFAULT_CALL_DEADLINE
    }

    /// Whether a pending action's arguments pass every one of `tests` (a rule narrowed by
    /// arguments applies it only then). The default knows no arguments: it passes only an
    /// empty list, so a narrowed rule never applies a driver's action unless the driver
    /// evaluates it. An error counts as not passing.
    async fn covers(
        &self,
        action: DriverActionId,
        tests: &[crate::ledger::ArgumentTest],
    ) -> Result<bool, GatekeeperError> {
        let _ = action;
        Ok(tests.is_empty())
    }
}

/// Why the kernel refused a submission or an observation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// Lockdown is latched: nothing may leave this workspace any more.
    #[error(
        "this workspace has observed sensitive data; to prevent leaks it is prohibited from performing actions (reads still work)"
    )]
    LockedDown,
    /// The same driver id was submitted twice for this gatekeeper.
    #[error("action {0} was already submitted by this gatekeeper; stage a new action instead")]
    DuplicateSubmission(DriverActionId),
    /// The kernel's storage refused the write; nothing was recorded.
    #[error("the ledger could not record this: {0}")]
    Storage(String),
}

/// Authorizes reads: a driver calls this after fetching and before returning any data.
#[async_trait]
pub trait ObservationAuthorizer: Send + Sync {
    /// Record an observation. `Ok` means the data may be handed to the caller; `Err`
    /// means it must not be. Returns the ledger id of the observation.
    async fn authorize_observation(
        &self,
        description: ObservationDescription,
    ) -> Result<LedgerId, QueueError>;
}

/// The capability a driver holds for one caller: submit actions, authorize observations.
#[async_trait]
pub trait ApprovalQueue: ObservationAuthorizer {
    /// Record a pending action and return its ledger id at once.
    ///
    /// Never waits for a decision or for auto-approval; an action that will auto-apply
    /// does so on a background task. Errors only when the kernel refuses to record it
    /// (lockdown, storage); the driver must then discard its staged record.
    async fn submit_action(
        &self,
        action: DriverActionId,
        description: ActionDescription,
    ) -> Result<LedgerId, QueueError>;
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn assert_send_sync<T: Send + Sync + ?Sized>() {}

    #[test]
    fn trait_objects_are_send_and_sync() {
        assert_send_sync::<Arc<dyn Gatekeeper>>();
        assert_send_sync::<Arc<dyn ApprovalQueue>>();
        assert_send_sync::<Arc<dyn ObservationAuthorizer>>();
    }
}

//! The driver toolkit: everything a gatekeeper for a tool server needs between an agent
//! and the kernel.
//!
//! The reference (Cloudflare OS's MCP gatekeeper) holds the *send*, not the agent: reads
//! run at once and are recorded, side-effecting calls are staged and submitted to the
//! kernel's approval queue, which answers at once; the call reaches the service only after
//! a person (or a rule they enabled) approved it, and then at most once. This crate is
//! that machinery, independent of any one service:
//!
//! - [`classify`]: **the trust boundary.** The only code that reads a tool's annotations;
//!   it decides read vs action and the gatekeeper's auto-approval key.
//! - [`kind`]: action kinds (`scope:tool`, percent-encoded) that rules are keyed by.
//! - [`narrow`]: the tests a rule narrowed by arguments applies to a staged call.
//! - [`kv`]: the key-value port a driver that keeps its own records stores them through.
//! - [`describe`]: the approval prompt, built only from sanitized pieces.
//! - [`edit`]: a person's edit of a staged call before approving it.
//! - [`store`]: the action store, an explicit state machine with the at-most-once apply
//!   protocol, over an async storage port ([`ActionStorage`]) with an in-memory backend.
//! - [`service`]: the port to the outside world ([`ToolService`]) and its failure classes.
//! - [`simulate`] and [`revert`]: optional driver hooks to show pending work in reads and
//!   to undo applied calls.
//! - [`ToolGatekeeper`]: the kernel's [`kernel::Gatekeeper`] for one server, and the mint
//!   of [`Grant`]s.
//! - [`Session`] (behind a [`Grant`], held in an agent's [`Grants`]): the agent's only way
//!   out.
//!
//! # Architecture invariants
//!
//! - Nothing outside [`classify`] can read a tool's annotations: their fields are private
//!   to that module.
//! - Only a [`Session`] (for reads) and the [`ActionStore`] (for approved actions) call a
//!   [`ToolService`]; an agent holds sessions, never a service.
//! - An action is stored as pending before it is submitted; if the kernel refuses it, the
//!   record is discarded. Nothing is sent at call time.
//! - A read's data is returned only after the kernel authorized the observation.
//! - Denials, pending results and failures are values or `Err`s, never panics.
//!
//! # A minimal wiring
//!
//! (`gatekeeper-issues` has a runnable version of this.)
//!
//! ```text
//! let overseer = kernel::Overseer::new(clock.clone());
//! let store = ActionStore::in_memory(clock);
//! let gk = Arc::new(ToolGatekeeper::new(config, tools, service, store));
//! overseer.register(gk.clone())?;
//! let mut grants = Grants::default();
//! grants.introduce("ISSUES", gk.grant(&overseer, "agent", &["listIssues", "createIssue"])?);
//! let outcome = grants.session("ISSUES")?.call_tool("createIssue", json!({"title": "x"})).await?;
//! ```

pub mod classify;
pub mod describe;
pub mod edit;
mod gatekeeper;
mod grant;
pub mod kind;
pub mod kv;
pub mod narrow;
pub mod revert;
pub mod service;
mod session;
pub mod simulate;
pub mod store;
#[cfg(feature = "testkit")]
pub mod testkit;
mod tool;

pub use classify::{
    ClassifiedBy, ClassifiedTool, Mode, NoRule, ServerTrust, ToolAnnotations, classify,
    classify_tool, why_no_rule,
};
pub use describe::{CallPrompt, describe_call};
pub use edit::{Edit, EditError, canonical_json};
pub use gatekeeper::{GatekeeperConfig, MAX_TOOLS_PER_SERVER, ToolGatekeeper};
pub use grant::{Grant, GrantError, Grants};
pub use kind::action_kind_for;
pub use revert::{REVERT_UNSUPPORTED_MESSAGE, Reverter};
pub use service::{CallContext, CallError, Content, ToolResult, ToolService};
pub use session::{ActionResult, CallOutcome, Session, SessionError, ToolInfo};
pub use simulate::{Overlay, PendingCall, Simulator};
pub use store::{
    ActionRecord, ActionState, ActionStorage, ActionStore, Applied, ApplyError, ClaimDurable,
    Discard, MemoryActionStorage, RejectError, Rejection, StageError, StateTag, StorageError,
};
pub use tool::Tool;

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    fn assert_send_sync<T: Send + Sync + ?Sized>() {}

    #[test]
    fn shared_handles_are_send_and_sync() {
        assert_send_sync::<Arc<super::ToolGatekeeper>>();
        assert_send_sync::<Arc<dyn kernel::Gatekeeper>>();
        assert_send_sync::<super::Session>();
        assert_send_sync::<super::ActionStore>();
        assert_send_sync::<Arc<dyn super::ActionStorage>>();
    }
}

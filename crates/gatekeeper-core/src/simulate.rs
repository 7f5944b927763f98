//! The simulator port: how a gatekeeper shows pending work in later reads.
//!
//! Without simulation a read shows a world in which the agent's pending writes never
//! happened; an agent that cannot see its own write may conclude it failed and do it again.
//! A gatekeeper therefore picks one of two honest answers per tool:
//!
//! - It can predict the effect: a [`Simulator`] overlays pending calls on later reads, and
//!   the action is submitted with `await_decision = false` (the agent may carry on).
//! - It cannot: the action is submitted with `await_decision = true`, advising the harness
//!   to suspend the agent's turn until a person decides.
//!
//! Simulating is a promise: what a read shows must be what applying will do. A read that
//! showed a pending call is remembered; actions staged afterwards through the same session
//! depend on it (`depends_on`), so rejecting the pending call flags them for a person, and
//! rejecting it asks the kernel to restart the agent.

use std::sync::Arc;

use kernel::DriverActionId;
use serde_json::Value;

use crate::service::ToolResult;
use crate::store::ActionRecord;

/// A pending call, as a simulator sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingCall {
    /// The store's id (also the id submitted to the kernel).
    pub id: DriverActionId,
    /// The tool it will call.
    pub tool: Arc<str>,
    /// The arguments it will send.
    pub args: Arc<Value>,
}

impl From<ActionRecord> for PendingCall {
    fn from(record: ActionRecord) -> Self {
        Self {
            id: record.id,
            tool: record.tool,
            args: record.args,
        }
    }
}

/// A read's reply with pending effects overlaid.
#[derive(Debug, Clone, PartialEq)]
pub struct Overlay {
    /// The reply the agent will see.
    pub result: ToolResult,
    /// The pending calls whose effect the reply now shows.
    pub shown: Vec<DriverActionId>,
}

impl Overlay {
    /// The reply unchanged: nothing pending shows in it.
    pub fn unchanged(result: ToolResult) -> Self {
        Self {
            result,
            shown: Vec::new(),
        }
    }
}

/// Predicts the effect of pending calls of some tools, for reads.
pub trait Simulator: Send + Sync {
    /// Whether pending calls of `tool` are shown in reads. Such actions are submitted with
    /// `await_decision = false`.
    fn simulates(&self, tool: &str) -> bool;

    /// Overlay the pending calls on the reply of the read `read` called with `args`.
    /// `pending` holds only calls of simulated tools, in ascending id (the order they will
    /// be applied in). Called only when `pending` is not empty.
    fn overlay(
        &self,
        read: &str,
        args: &Value,
        result: ToolResult,
        pending: &[PendingCall],
    ) -> Overlay;
}

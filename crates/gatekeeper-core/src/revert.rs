//! The revert hook: how a driver undoes an applied call, when it knows how.
//!
//! MCP tools do not describe their inverse, so by default nothing is revertible and the
//! approval prompt says so (`implements_revert = false`). A driver that knows a tool's
//! inverse provides a [`Reverter`]; it must refuse, with a reason a person can act on,
//! whenever undoing could wipe out someone else's change.

use async_trait::async_trait;
use kernel::{GatekeeperError, RevertOutcome};

use crate::service::ToolService;
use crate::store::ActionRecord;

/// The refusal for tools without a [`Reverter`].
pub const REVERT_UNSUPPORTED_MESSAGE: &str = "These tools do not describe how to undo themselves, so this action cannot be reverted automatically. Undo it directly in the service if needed.";

/// Undoes applied calls of some tools.
#[async_trait]
pub trait Reverter: Send + Sync {
    /// Whether calls of `tool` can be reverted; decides `implements_revert` at submission.
    fn reverts(&self, tool: &str) -> bool;

    /// Undo `action`, an applied call of a tool this reverter [`reverts`](Self::reverts),
    /// through `service`. A refusal is [`RevertOutcome::refused`], not an error.
    async fn revert(
        &self,
        action: &ActionRecord,
        service: &dyn ToolService,
    ) -> Result<RevertOutcome, GatekeeperError>;
}

//! The service port: how a gatekeeper reaches the outside world, and what comes back.
//!
//! A [`ToolService`] is the far side of a driver (an MCP server, in the reference). Only
//! the action store (on apply) and a session (on a read) call it; nothing else in the
//! workspace holds one.
//!
//! [`CallError`] sorts failures by what the service is known to have done, because that
//! decides whether the same approval may be spent again: only a call positively known not
//! to have reached the tool may be retried. Everything else fails safe as
//! [`CallError::Unknown`].

use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::tool::Tool;

/// One block of a tool's reply, shaped like MCP's content blocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Content {
    /// Text for the agent to read.
    Text {
        /// The text.
        text: String,
    },
    /// A block of a type this toolkit does not render (image, audio, resource, ...).
    #[serde(other)]
    Unsupported,
}

/// A tool's reply, shaped like MCP's `CallToolResult`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolResult {
    /// The reply's content blocks.
    #[serde(default)]
    pub content: Vec<Content>,
    /// Machine-readable data, if the tool returned any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_content: Option<Value>,
    /// The tool ran but reports a failure of its own (MCP's `isError`). Still a reply:
    /// the call reached the tool.
    #[serde(default)]
    pub is_error: bool,
}

impl ToolResult {
    /// A successful reply made of one text block.
    pub fn from_text(text: impl Into<String>) -> Self {
        Self {
            content: vec![Content::Text { text: text.into() }],
            structured_content: None,
            is_error: false,
        }
    }

    /// A reply in which the tool reports its own failure.
    pub fn tool_error(text: impl Into<String>) -> Self {
        Self {
            is_error: true,
            ..Self::from_text(text)
        }
    }

    /// The same reply with machine-readable data attached.
    pub fn with_structured(mut self, data: Value) -> Self {
        self.structured_content = Some(data);
        self
    }

    /// Every text block, joined with `\n` (the reference's `text` field).
    pub fn text(&self) -> String {
        let mut out = String::new();
        for block in &self.content {
            if let Content::Text { text } = block {
                if !out.is_empty() {
                    out.push('\n');
                }
                let _ = out.write_str(text);
            }
        }
        out
    }
}

/// Why a call to the service failed, sorted by what the service may have done.
///
/// The message is the service's own, for a person: it is stored as the action's failure
/// text when nothing was sent, so it should say what to do next.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The call never left: credentials were refused (HTTP 401), the connection could not
    /// be set up, the address was refused. Nothing reached the tool.
    #[error("{0}")]
    NotDispatched(String),
    /// The service refused the request before running the tool (HTTP 403).
    #[error("{0}")]
    Declined(String),
    /// Anything else: a timeout, a dropped connection, an unreadable or unexpected reply.
    /// The tool may have run.
    #[error("{0}")]
    Unknown(String),
}

impl CallError {
    /// Whether the call may have taken effect. Only [`CallError::Unknown`] may have: it is
    /// the fail-safe default for every failure not positively known to precede the tool.
    pub fn may_have_landed(&self) -> bool {
        matches!(self, Self::Unknown(_))
    }

    /// What a failed call says about its effect, for the ledger: not sent, refused by
    /// the service, or outcome unknown.
    pub fn failure_kind(&self) -> kernel::FailureKind {
        match self {
            Self::NotDispatched(_) => kernel::FailureKind::NotSent,
            Self::Declined(_) => kernel::FailureKind::ServiceError,
            Self::Unknown(_) => kernel::FailureKind::OutcomeUnknown,
        }
    }

    /// The service's message.
    pub fn message(&self) -> &str {
        match self {
            Self::NotDispatched(m) | Self::Declined(m) | Self::Unknown(m) => m,
        }
    }
}

/// The far side of a gatekeeper: a service that lists and runs tools.
///
/// # Contract
///
/// - `call` runs the tool once per invocation and never retries a call on its own: a
///   retry is a second send, which only a person may authorize.
/// - An `Err` must say truthfully whether the tool may have run (see [`CallError`]); when
///   unsure, return [`CallError::Unknown`].
/// - A tool that ran and failed on its own terms returns `Ok` with
///   [`ToolResult::is_error`] set.
#[async_trait]
pub trait ToolService: Send + Sync {
    /// The service's tool catalog.
    async fn list_tools(&self) -> Vec<Tool>;

    /// Run one tool with the given arguments (a JSON object).
    async fn call(&self, tool: &str, args: &Value) -> Result<ToolResult, CallError>;

    /// Run one tool as [`ToolService::call`] does, given the definition tag
    /// ([`Tool::definition`]) the call was classified and staged with. A service whose
    /// tools can change refuses, with [`CallError::NotDispatched`] and before sending, a
    /// call whose definition is no longer the current one. The default ignores the tag.
    ///
    /// Implement it as an `async fn` under `#[async_trait]`, like the other methods: this
    /// is the signature that attribute gives it. The default is written out only so that
    /// it hands back the future of [`ToolService::call`] as it is, rather than boxing a
    /// second future around it.
    fn call_defined<'life0, 'life1, 'life2, 'life3, 'async_trait>(
        &'life0 self,
        tool: &'life1 str,
        definition: Option<&'life2 str>,
        args: &'life3 Value,
    ) -> Pin<Box<dyn Future<Output = Result<ToolResult, CallError>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        'life3: 'async_trait,
        Self: 'async_trait,
    {
        let _ = definition;
        self.call(tool, args)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn text_joins_text_blocks_and_skips_others() {
        let result: ToolResult = serde_json::from_value(json!({
            "content": [
                {"type": "text", "text": "one"},
                {"type": "image", "data": "AAAA", "mimeType": "image/png"},
                {"type": "text", "text": "two"}
            ],
            "isError": false
        }))
        .expect("MCP shaped");
        assert_eq!(result.text(), "one\ntwo");
        assert_eq!(result.content[1], Content::Unsupported);
    }

    #[test]
    fn only_unknown_failures_may_have_landed() {
        assert!(!CallError::NotDispatched("401".into()).may_have_landed());
        assert!(!CallError::Declined("403".into()).may_have_landed());
        assert!(CallError::Unknown("timeout".into()).may_have_landed());
    }
}

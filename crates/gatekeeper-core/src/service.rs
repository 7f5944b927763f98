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

use std::any::Any;
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::tool::Tool;

/// One block of a tool's reply, as the server sent it.
///
/// A text block with nothing but its text is kept as [`Content::Text`], the common case
/// and the one drivers write; every other block (image, audio, resource link, embedded
/// resource, a text block with annotations or `_meta`, a block type newer than this
/// toolkit) is kept exactly as received in [`Content::Other`], so a reply reaches the
/// agent, and the action store, with nothing dropped.
#[derive(Debug, Clone, PartialEq)]
pub enum Content {
    /// Text for the agent to read, and nothing else.
    Text {
        /// The text.
        text: String,
    },
    /// Any other block, as the server sent it (a JSON object with a `type`).
    Other(Value),
}

/// The block older versions kept in place of anything but plain text.
const LEGACY_UNSUPPORTED: &str = "unsupported";
/// What a block stored by an older version, which kept no more than its type, reads as.
pub const LEFT_OUT_BLOCK: &str = "(a block that is not text was left out)";

impl Content {
    /// A plain text block.
    pub fn text(text: impl Into<String>) -> Self {
        Self::Text { text: text.into() }
    }

    /// The block's text, if it is a text block (with or without annotations).
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Self::Text { text } => Some(text),
            Self::Other(block) if block.get("type").and_then(Value::as_str) == Some("text") => {
                block.get("text").and_then(Value::as_str)
            }
            Self::Other(_) => None,
        }
    }

    /// The block's `type` (`text`, `image`, `audio`, `resource_link`, `resource`, ...).
    pub fn kind(&self) -> &str {
        match self {
            Self::Text { .. } => "text",
            Self::Other(block) => block
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("unknown"),
        }
    }

    /// The block as JSON, exactly as it crosses the protocol.
    pub fn to_json(&self) -> Value {
        match self {
            Self::Text { text } => serde_json::json!({"type": "text", "text": text}),
            Self::Other(block) => block.clone(),
        }
    }
}

impl Serialize for Content {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Text { text } => {
                use serde::ser::SerializeMap as _;
                let mut map = serializer.serialize_map(Some(2))?;
                map.serialize_entry("type", "text")?;
                map.serialize_entry("text", text)?;
                map.end()
            }
            Self::Other(block) => block.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let block = Value::deserialize(deserializer)?;
        let Value::Object(map) = &block else {
            return Err(serde::de::Error::custom(
                "a content block must be a JSON object",
            ));
        };
        match (map.get("type").and_then(Value::as_str), map.get("text")) {
            (Some("text"), Some(Value::String(text))) if map.len() == 2 => {
                Ok(Self::Text { text: text.clone() })
            }
            (Some(LEGACY_UNSUPPORTED), _) if map.len() == 1 => Ok(Self::text(LEFT_OUT_BLOCK)),
            (Some(_), _) => Ok(Self::Other(block)),
            (None, _) => Err(serde::de::Error::custom(
                "a content block needs a string `type`",
            )),
        }
    }
}

/// A tool's reply, shaped like MCP's `CallToolResult`.
///
/// Every field the server sent is kept: the content blocks as they came ([`Content`]),
/// `structuredContent`, `isError`, and anything else (such as `_meta`) in
/// [`ToolResult::extra`]. Only the protocol era's framing (`resultType`) is dropped, since
/// whoever hands the reply on frames it for its own peer.
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
    /// Every other field of the reply (`_meta`, fields of newer protocol versions), as
    /// the server sent it.
    #[serde(flatten, default, skip_serializing_if = "Map::is_empty")]
    pub extra: Map<String, Value>,
    /// Not an answer yet: the service needs input from the caller first (MCP's
    /// `input_required` result: its questions and state, kept as the service sent them, for
    /// the caller to answer and call again). Empty content goes with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_required: Option<Value>,
}

impl ToolResult {
    /// A successful reply made of one text block.
    pub fn from_text(text: impl Into<String>) -> Self {
        Self {
            content: vec![Content::text(text)],
            ..Self::default()
        }
    }

    /// A reply in which the tool reports its own failure.
    pub fn tool_error(text: impl Into<String>) -> Self {
        Self {
            is_error: true,
            ..Self::from_text(text)
        }
    }

    /// A reply read from a `tools/call` result as JSON; the era's `resultType` framing is
    /// left out, except that an `input_required` result is kept whole in
    /// [`ToolResult::input_required`].
    pub fn from_json(mut reply: Value) -> Result<Self, serde_json::Error> {
        if reply.get("resultType").and_then(Value::as_str) == Some("input_required") {
            return Ok(Self {
                input_required: Some(reply),
                ..Self::default()
            });
        }
        if let Some(map) = reply.as_object_mut() {
            map.remove("resultType");
        }
        serde_json::from_value(reply)
    }

    /// The same reply with machine-readable data attached.
    pub fn with_structured(mut self, data: Value) -> Self {
        self.structured_content = Some(data);
        self
    }

    /// Every text block, joined with `\n` (the reference's `text` field).
    pub fn text(&self) -> String {
        let mut out = String::new();
        for text in self.content.iter().filter_map(Content::as_text) {
            if !out.is_empty() {
                out.push('\n');
            }
            let _ = out.write_str(text);
        }
        out
    }
}

/// What a caller hands down with one read, for the service alone to read: the gateway's
/// per-call context (where progress goes, when the agent cancelled). The toolkit never
/// looks inside; a service that knows the type takes it out with [`CallContext::get`].
/// Writes carry none: a staged call belongs to the gate, and the person's later send has
/// no agent waiting on it.
#[derive(Clone, Default)]
pub struct CallContext(Option<Arc<dyn Any + Send + Sync>>);

impl CallContext {
    /// A context carrying `value`.
    pub fn new<T: Any + Send + Sync>(value: T) -> Self {
        Self(Some(Arc::new(value)))
    }

    /// The value, if the context carries one of type `T`.
    pub fn get<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.0.as_deref()?.downcast_ref()
    }
}

impl std::fmt::Debug for CallContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("CallContext")
            .field(&self.0.as_ref().map(|_| ".."))
            .finish()
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
    /// The call can never be sent as it was staged (its tool changed or is gone since):
    /// nothing was sent, and approving it again would not change that, so it is final.
    #[error("{0}")]
    Obsolete(String),
    /// The service answered the request with a protocol error instead of a result (for
    /// MCP, a JSON-RPC error such as unknown tool or invalid arguments). The request
    /// reached the service and was answered, so this is final: it is not retried, and the
    /// person is told the service refused it rather than that it was applied.
    #[error("{0}")]
    Answered(String),
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

    /// Whether the same approval may be spent again: only when the call is positively
    /// known not to have been answered by the tool (not sent, or refused before it ran).
    pub fn retryable(&self) -> bool {
        matches!(self, Self::NotDispatched(_) | Self::Declined(_))
    }

    /// What a failed call says about its effect, for the ledger: not sent, refused by
    /// the service, or outcome unknown.
    pub fn failure_kind(&self) -> kernel::FailureKind {
        match self {
            Self::NotDispatched(_) | Self::Obsolete(_) => kernel::FailureKind::NotSent,
            Self::Declined(_) | Self::Answered(_) => kernel::FailureKind::ServiceError,
            Self::Unknown(_) => kernel::FailureKind::OutcomeUnknown,
        }
    }

    /// The service's message.
    pub fn message(&self) -> &str {
        match self {
            Self::NotDispatched(m)
            | Self::Declined(m)
            | Self::Obsolete(m)
            | Self::Answered(m)
            | Self::Unknown(m) => m,
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

    /// Run one read as [`ToolService::call_defined`] does, with the caller's `context`
    /// (progress, cancellation) handed down untouched. The default ignores the context.
    async fn call_in(
        &self,
        tool: &str,
        definition: Option<&str>,
        args: &Value,
        context: &CallContext,
    ) -> Result<ToolResult, CallError> {
        let _ = context;
        self.call_defined(tool, definition, args).await
    }

    /// Forward one request of the service's protocol other than a tool call, of a kind
    /// the protocol defines as changing nothing: listing or reading resources, listing or
    /// getting prompts, completing an argument. `params` and the answer are the protocol's
    /// JSON as they cross it. The default forwards nothing: the service has no such
    /// requests ([`CallError::NotDispatched`]).
    async fn forward(
        &self,
        method: &str,
        params: &Value,
        context: &CallContext,
    ) -> Result<Value, CallError> {
        let _ = (params, context);
        Err(CallError::NotDispatched(format!(
            "this service answers no {method} requests"
        )))
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
        assert_eq!(result.content[1].kind(), "image");
    }

    #[test]
    fn every_block_and_field_of_a_reply_is_kept_as_the_server_sent_it() {
        let reply = json!({
            "resultType": "complete",
            "content": [
                {"type": "text", "text": "plain"},
                {"type": "text", "text": "noted", "annotations": {"audience": ["user"], "priority": 0.5}},
                {"type": "image", "data": "AAAA", "mimeType": "image/png"},
                {"type": "audio", "data": "UklG", "mimeType": "audio/wav", "_meta": {"k": 1}},
                {"type": "resource_link", "uri": "file:///a", "name": "a"},
                {"type": "resource", "resource": {"uri": "test://x", "text": "embedded"}},
                {"type": "hologram", "depth": 3}
            ],
            "structuredContent": {"n": 1},
            "isError": false,
            "_meta": {"trace": "t-1"}
        });
        let result = ToolResult::from_json(reply.clone()).expect("a tool result");
        assert_eq!(result.content[0], Content::text("plain"));
        assert_eq!(result.text(), "plain\nnoted");
        let mut expected = reply;
        expected
            .as_object_mut()
            .expect("object")
            .remove("resultType");
        assert_eq!(serde_json::to_value(&result).expect("serialises"), expected);
    }

    #[test]
    fn a_block_stored_by_an_older_version_reads_as_a_note() {
        let result: ToolResult =
            serde_json::from_value(json!({"content": [{"type": "unsupported"}]})).expect("reads");
        assert_eq!(result.text(), LEFT_OUT_BLOCK);
    }

    #[test]
    fn only_unknown_failures_may_have_landed() {
        assert!(!CallError::NotDispatched("401".into()).may_have_landed());
        assert!(!CallError::Declined("403".into()).may_have_landed());
        assert!(CallError::Unknown("timeout".into()).may_have_landed());
        assert!(!CallError::Answered("-32602".into()).may_have_landed());
    }

    #[test]
    fn only_failures_known_to_precede_the_tool_are_retryable() {
        assert!(CallError::NotDispatched("401".into()).retryable());
        assert!(CallError::Declined("403".into()).retryable());
        assert!(!CallError::Answered("-32602".into()).retryable());
        assert!(!CallError::Obsolete("the tool changed".into()).retryable());
        assert!(!CallError::Obsolete("the tool changed".into()).may_have_landed());
        assert!(!CallError::Unknown("timeout".into()).retryable());
    }
}

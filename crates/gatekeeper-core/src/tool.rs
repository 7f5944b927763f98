//! The tool model, deserialised from an MCP server's `tools/list` JSON.
//!
//! A [`Tool`] carries what the server said about it. Its annotations are opaque here: only
//! the classifier ([`crate::classify`]) can read them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::classify::ToolAnnotations;

/// One tool of a server's catalog, shaped like MCP's `Tool`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tool {
    /// The wire name the tool is called by.
    pub name: String,
    /// A display title, if the server gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The server's description of the tool: untrusted text, quoted in approval prompts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON Schema of the arguments (not enforced here; the server validates).
    #[serde(default = "empty_schema")]
    pub input_schema: Value,
    /// The server's behaviour hints. Only the classifier can read them.
    #[serde(default, skip_serializing_if = "ToolAnnotations::is_empty")]
    pub annotations: ToolAnnotations,
    /// The driver's tag for this version of the tool's definition (for example a digest of
    /// what a person is shown), or `None`. Not part of MCP's JSON: a driver sets it, each
    /// staged call keeps it ([`crate::ActionRecord::definition`]), and the service gets it
    /// back on apply ([`crate::ToolService::call_defined`]) to refuse a call whose tool
    /// changed since it was staged.
    #[serde(skip)]
    pub definition: Option<String>,
}

fn empty_schema() -> Value {
    serde_json::json!({"type": "object"})
}

impl Tool {
    /// Parse one tool from MCP JSON.
    pub fn from_json(value: Value) -> Result<Self, serde_json::Error> {
        serde_json::from_value(value)
    }

    /// The same tool, tagged with the driver's version of its definition.
    pub fn with_definition(mut self, definition: impl Into<String>) -> Self {
        self.definition = Some(definition.into());
        self
    }

    /// Parse a catalog: either an array of tools or a `tools/list` reply `{"tools": [...]}`.
    pub fn catalog_from_json(value: Value) -> Result<Vec<Self>, serde_json::Error> {
        match value {
            Value::Object(mut reply) if reply.contains_key("tools") => {
                serde_json::from_value(reply.remove("tools").unwrap_or_default())
            }
            other => serde_json::from_value(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn parses_mcp_json_and_prints_it_back_with_only_boolean_hints() {
        let raw = json!({
            "name": "addLabel",
            "description": "Add a label.",
            "inputSchema": {"type": "object", "properties": {"label": {"type": "string"}}},
            "annotations": {"destructiveHint": false, "idempotentHint": "yes", "title": "x"}
        });
        let tool = Tool::from_json(raw).expect("valid");
        assert_eq!(tool.name, "addLabel");
        assert_eq!(tool.title, None);
        assert_eq!(tool.description.as_deref(), Some("Add a label."));
        assert_eq!(
            serde_json::to_value(&tool).expect("serialises"),
            json!({
                "name": "addLabel",
                "description": "Add a label.",
                "inputSchema": {"type": "object", "properties": {"label": {"type": "string"}}},
                "annotations": {"destructiveHint": false}
            })
        );
    }

    #[test]
    fn catalog_accepts_a_list_reply_or_a_bare_array() {
        let tools = json!([{"name": "a"}, {"name": "b", "annotations": null}]);
        let bare = Tool::catalog_from_json(tools.clone()).expect("array");
        let reply = Tool::catalog_from_json(json!({"tools": tools})).expect("reply");
        assert_eq!(bare, reply);
        assert_eq!(bare.len(), 2);
        assert_eq!(bare[0].input_schema, json!({"type": "object"}));
    }
}

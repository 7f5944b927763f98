//! A downstream server's catalog, read from raw `tools/list` JSON, with a digest of each
//! tool's definition.
//!
//! The catalog is parsed tool by tool from the raw reply: a tool whose hint is not a JSON
//! boolean is still listed (gatekeeper-core's classifier counts that hint as absent), and a
//! tool that is not even shaped like a tool (no string name) is dropped with a warning,
//! never the whole server.
//!
//! Each tool is known to the gatekeeper under its *gated name* `<tool>@<digest>`, where the
//! digest covers the definition a person is shown (name, description, annotations, input
//! schema). The gated name is what an action store keeps with a staged call, so the
//! definition a call was staged against travels with it through any storage backend, and
//! apply can refuse a call whose tool changed since (see [`crate::McpServer`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use gatekeeper_core::Tool;
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use tracing::warn;

/// How many hex digits of the SHA-256 digest a gated name carries (64 bits).
pub const DIGEST_HEX_DIGITS: usize = 16;

/// The separator between a tool's name and its digest in a gated name. MCP tool names are
/// made of `[A-Za-z0-9_.-]`, so the last `@` is always the separator.
pub const DIGEST_SEPARATOR: char = '@';

/// The digest of a tool's definition: the first [`DIGEST_HEX_DIGITS`] hex digits of the
/// SHA-256 of the canonical JSON (keys sorted, no spaces) of its name, description,
/// annotations and input schema, as the server sent them.
pub fn definition_digest(raw: &Value) -> String {
    let mut definition = BTreeMap::new();
    for key in ["name", "description", "annotations", "inputSchema"] {
        definition.insert(key, raw.get(key).cloned().unwrap_or(Value::Null));
    }
    let mut canonical = String::new();
    write_canonical(
        &Value::Object(
            definition
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
        ),
        &mut canonical,
    );
    let hash = Sha256::digest(canonical.as_bytes());
    let mut hex = String::with_capacity(DIGEST_HEX_DIGITS);
    for byte in hash.iter().take(DIGEST_HEX_DIGITS / 2) {
        let _ = write!(hex, "{byte:02x}");
    }
    hex
}

/// `value` as JSON with object keys sorted at every depth and no spaces, whatever map order
/// serde_json was built with: equal values give equal text.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

/// JSON with object keys sorted at every depth, whatever map order serde_json was built with.
fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// The gated name of a tool: `<tool>@<digest>`.
pub fn gated_name(tool: &str, digest: &str) -> String {
    format!("{tool}{DIGEST_SEPARATOR}{digest}")
}

/// Split a gated name into the downstream tool name and the digest it was staged with.
pub fn split_gated_name(gated: &str) -> Option<(&str, &str)> {
    gated
        .rsplit_once(DIGEST_SEPARATOR)
        .filter(|(name, digest)| !name.is_empty() && !digest.is_empty())
}

/// One tool of a downstream catalog.
#[derive(Debug, Clone, PartialEq)]
pub struct CatalogTool {
    /// The name the downstream server calls it by.
    pub name: String,
    /// The digest of its definition ([`definition_digest`]).
    pub digest: String,
    /// The tool as the gatekeeper knows it: named by its gated name `<name>@<digest>`.
    pub tool: Tool,
    /// The tool exactly as the server listed it (for passing through to agents).
    pub raw: Value,
}

impl CatalogTool {
    /// The gated name, `<name>@<digest>`.
    pub fn gated_name(&self) -> &str {
        &self.tool.name
    }
}

/// A downstream server's catalog, in the order the server listed it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Catalog {
    tools: Vec<CatalogTool>,
}

impl Catalog {
    /// Parse the tools of raw `tools/list` replies (every page's `tools` array, in order).
    /// A tool without a string name is dropped with a warning; a tool listed twice keeps
    /// its first definition.
    pub fn from_raw_tools(server: &str, raw_tools: impl IntoIterator<Item = Value>) -> Self {
        let mut tools: Vec<CatalogTool> = Vec::new();
        for raw in raw_tools {
            let Some(name) = raw.get("name").and_then(Value::as_str).map(str::to_owned) else {
                warn!(server, tool = %raw, "catalog.tool-without-name: ignored");
                continue;
            };
            if tools.iter().any(|t| t.name == name) {
                warn!(server, tool = %name, "catalog.duplicate: later definition ignored");
                continue;
            }
            let digest = definition_digest(&raw);
            let mut gated = raw.clone();
            gated["name"] = Value::String(gated_name(&name, &digest));
            match Tool::from_json(gated) {
                Ok(tool) => tools.push(CatalogTool {
                    name,
                    digest,
                    tool,
                    raw,
                }),
                Err(error) => {
                    warn!(server, tool = %name, %error, "catalog.unreadable-tool: ignored");
                }
            }
        }
        Self { tools }
    }

    /// The tools, in catalog order.
    pub fn tools(&self) -> &[CatalogTool] {
        &self.tools
    }

    /// One tool, by its downstream name.
    pub fn get(&self, name: &str) -> Option<&CatalogTool> {
        self.tools.iter().find(|t| t.name == name)
    }
}

#[cfg(test)]
mod tests {
    use gatekeeper_core::{ServerTrust, classify_tool};
    use serde_json::json;

    use super::*;

    #[test]
    fn a_tool_with_a_non_boolean_hint_does_not_hide_the_others() {
        let catalog = Catalog::from_raw_tools(
            "s",
            [
                json!({"name": "read", "annotations": {"readOnlyHint": true}}),
                json!({"name": "odd", "annotations": {"readOnlyHint": "no"}}),
                json!({"description": "no name at all"}),
                json!({"name": "write", "inputSchema": {"type": "object"}}),
            ],
        );
        let names: Vec<&str> = catalog.tools().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["read", "odd", "write"]);
        let read = |name: &str| {
            classify_tool(
                &catalog.get(name).expect("listed").tool,
                ServerTrust::Vetted,
            )
            .is_read()
        };
        assert!(read("read"));
        assert!(
            !read("odd"),
            "a non-boolean hint counts as absent: an action"
        );
        assert!(!read("write"));
    }

    #[test]
    fn the_digest_covers_every_part_of_the_definition_a_person_is_shown() {
        let base = json!({
            "name": "t", "description": "d",
            "annotations": {"readOnlyHint": false},
            "inputSchema": {"type": "object", "properties": {"a": {"type": "string"}}}
        });
        let digest = definition_digest(&base);
        assert_eq!(digest.len(), DIGEST_HEX_DIGITS);
        let changes = [
            ("name", json!("u")),
            ("description", json!("d, and more")),
            ("annotations", json!({"readOnlyHint": true})),
            ("annotations", json!({"readOnlyHint": "false"})),
            ("inputSchema", json!({"type": "object"})),
        ];
        for (key, value) in changes {
            let mut changed = base.clone();
            changed[key] = value.clone();
            assert_ne!(definition_digest(&changed), digest, "{key} = {value}");
        }
        // Not shown to a person, so not part of the definition a person approved.
        let mut titled = base.clone();
        titled["outputSchema"] = json!({"type": "object"});
        assert_eq!(definition_digest(&titled), digest);
    }

    #[test]
    fn the_digest_does_not_depend_on_key_order() {
        let a: Value = serde_json::from_str(
            r#"{"name":"t","inputSchema":{"type":"object","properties":{"x":{},"y":{}}}}"#,
        )
        .expect("json");
        let b: Value = serde_json::from_str(
            r#"{"inputSchema":{"properties":{"y":{},"x":{}},"type":"object"},"name":"t"}"#,
        )
        .expect("json");
        assert_eq!(definition_digest(&a), definition_digest(&b));
    }

    #[test]
    fn gated_names_split_at_the_last_separator() {
        let catalog = Catalog::from_raw_tools("s", [json!({"name": "write.note"})]);
        let tool = &catalog.tools()[0];
        assert_eq!(
            split_gated_name(tool.gated_name()),
            Some(("write.note", tool.digest.as_str()))
        );
        assert_eq!(split_gated_name("plain"), None);
        assert_eq!(split_gated_name("@abc"), None);
        assert_eq!(split_gated_name("a@b@c"), Some(("a@b", "c")));
    }
}

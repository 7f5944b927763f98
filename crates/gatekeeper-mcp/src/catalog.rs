//! A downstream server's catalog, read from raw `tools/list` JSON, with a digest of each
//! tool's definition.
//!
//! The catalog is parsed tool by tool from the raw reply: a tool whose hint is not a JSON
//! boolean is still listed (gatekeeper-core's classifier counts that hint as absent), and a
//! tool that is not even shaped like a tool (no string name) is dropped with a warning,
//! never the whole server.
//!
//! Each tool is known to the gatekeeper under its own name, tagged with the digest of the
//! definition a person is shown (name, description, annotations, input schema) as its
//! [`Tool::definition`]. An action store keeps that digest with each staged call
//! ([`gatekeeper_core::ActionRecord::definition`]), so the definition a call was staged
//! against travels with it through any storage backend, and apply can refuse a call whose
//! tool changed since (see [`crate::McpServer`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use gatekeeper_core::Tool;
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use tracing::warn;

/// How many hex digits of the SHA-256 digest a definition digest has (64 bits).
pub const DIGEST_HEX_DIGITS: usize = 16;

/// The digest of a tool's definition: the first [`DIGEST_HEX_DIGITS`] hex digits of the
/// SHA-256 of the canonical JSON (keys sorted, no spaces) of its name, description,
/// annotations and input schema, as the server sent them.
pub fn definition_digest(raw: &Value) -> String {
    let mut definition = BTreeMap::new();
    for key in ["name", "description", "annotations", "inputSchema"] {
        definition.insert(key, raw.get(key).cloned().unwrap_or(Value::Null));
    }
    let canonical = canonical_json(&Value::Object(
        definition
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
    ));
    let hash = Sha256::digest(canonical.as_bytes());
    let mut hex = String::with_capacity(DIGEST_HEX_DIGITS);
    for byte in hash.iter().take(DIGEST_HEX_DIGITS / 2) {
        let _ = write!(hex, "{byte:02x}");
    }
    hex
}

pub use gatekeeper_core::canonical_json;

/// One tool of a downstream catalog.
#[derive(Debug, Clone, PartialEq)]
pub struct CatalogTool {
    /// The name the downstream server calls it by.
    pub name: String,
    /// The digest of its definition ([`definition_digest`]).
    pub digest: String,
    /// The tool as the gatekeeper knows it, its definition tagged with the digest.
    pub tool: Tool,
    /// The tool exactly as the server listed it (for passing through to agents).
    pub raw: Value,
    /// Why agents are not offered this tool, when they are not: a tool the gate cannot
    /// run as it asks to be run ([`withheld_reason`]). A person sees the reason in
    /// `gate catalog`.
    pub withheld: Option<String>,
}

/// Why a tool listed as `raw` cannot be offered to agents, or `None` when it can.
///
/// A tool that must run as a task (`execution.taskSupport: "required"`, the protocol's
/// tasks extension) would only fail after a person approved it: the gate sends an
/// approved call as an ordinary `tools/call`. It is withheld rather than offered as a
/// write that cannot succeed. (`"optional"` tools run as ordinary calls.)
pub fn withheld_reason(raw: &Value) -> Option<String> {
    let support = raw.pointer("/execution/taskSupport")?.as_str()?;
    (support == "required").then(|| {
        "it runs only as a task (execution.taskSupport = \"required\"), and the gate sends an approved call as an ordinary tools/call, which such a tool refuses".to_owned()
    })
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
            match Tool::from_json(raw.clone()) {
                Ok(tool) => tools.push(CatalogTool {
                    name,
                    tool: tool.with_definition(digest.clone()),
                    digest,
                    withheld: withheld_reason(&raw),
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

    /// The tools as the gatekeeper knows them, in catalog order.
    pub fn gatekeeper_tools(&self) -> Vec<Tool> {
        self.tools.iter().map(|t| t.tool.clone()).collect()
    }

    /// The tools exactly as the server listed them: what [`Catalog::from_raw_tools`]
    /// reads back, so a catalog a person accepted can be recorded and restored.
    pub fn raw_tools(&self) -> Vec<Value> {
        self.tools.iter().map(|t| t.raw.clone()).collect()
    }

    /// This catalog (the accepted one) with only tool `name` taken as `current` lists it:
    /// its new definition, or added, or gone; every other tool as accepted. `None` when
    /// `current` changed nothing about that tool.
    pub fn with_tool_from(&self, current: &Catalog, server: &str, name: &str) -> Option<Catalog> {
        let (was, now) = (self.get(name), current.get(name));
        if was.map(|t| &t.digest) == now.map(|t| &t.digest) {
            return None;
        }
        let mut raw: Vec<Value> = Vec::new();
        for tool in &self.tools {
            if tool.name != name {
                raw.push(tool.raw.clone());
            } else if let Some(now) = now {
                raw.push(now.raw.clone());
            }
        }
        if was.is_none()
            && let Some(now) = now
        {
            raw.push(now.raw.clone());
        }
        Some(Catalog::from_raw_tools(server, raw))
    }

    /// What `current` changed against this catalog (the accepted one), by tool name.
    pub fn changes(&self, current: &Catalog) -> CatalogChanges {
        let mut changes = CatalogChanges::default();
        for tool in current.tools() {
            match self.get(&tool.name) {
                None => changes.added.push(tool.name.clone()),
                Some(accepted) if accepted.digest != tool.digest => changes.changed.push((
                    tool.name.clone(),
                    accepted.digest.clone(),
                    tool.digest.clone(),
                )),
                Some(_) => {}
            }
        }
        for tool in self.tools() {
            if current.get(&tool.name).is_none() {
                changes.gone.push(tool.name.clone());
            }
        }
        changes
    }
}

/// How a server's catalog now differs from the one a person accepted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CatalogChanges {
    /// Tools listed now that the accepted catalog lacks.
    pub added: Vec<String>,
    /// Tools whose definition changed: (name, accepted digest, current digest).
    pub changed: Vec<(String, String, String)>,
    /// Tools of the accepted catalog the server no longer lists.
    pub gone: Vec<String>,
}

impl CatalogChanges {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.changed.is_empty() && self.gone.is_empty()
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
    fn tools_keep_their_names_and_carry_their_digest_as_their_definition() {
        let catalog = Catalog::from_raw_tools("s", [json!({"name": "write.note"})]);
        let tool = &catalog.tools()[0];
        assert_eq!(tool.tool.name, "write.note");
        assert_eq!(tool.tool.definition.as_deref(), Some(tool.digest.as_str()));
        let restored = Catalog::from_raw_tools("s", catalog.raw_tools());
        assert_eq!(restored, catalog, "a recorded catalog reads back the same");
    }

    #[test]
    fn a_tool_that_runs_only_as_a_task_is_withheld_with_its_reason() {
        let catalog = Catalog::from_raw_tools(
            "s",
            [
                json!({"name": "plain"}),
                json!({"name": "maybe", "execution": {"taskSupport": "optional"}}),
                json!({"name": "task", "execution": {"taskSupport": "required"}}),
            ],
        );
        let withheld: Vec<(&str, bool)> = catalog
            .tools()
            .iter()
            .map(|t| (t.name.as_str(), t.withheld.is_some()))
            .collect();
        assert_eq!(
            withheld,
            [("plain", false), ("maybe", false), ("task", true)]
        );
        let reason = catalog.get("task").and_then(|t| t.withheld.clone());
        assert!(reason.is_some_and(|r| r.contains("taskSupport")));
    }

    #[test]
    fn changes_name_what_was_added_changed_and_removed() {
        let accepted = Catalog::from_raw_tools(
            "s",
            [
                json!({"name": "a"}),
                json!({"name": "b", "description": "x"}),
            ],
        );
        let current = Catalog::from_raw_tools(
            "s",
            [
                json!({"name": "b", "description": "y"}),
                json!({"name": "c"}),
            ],
        );
        let changes = accepted.changes(&current);
        assert_eq!(changes.added, ["c"]);
        assert_eq!(changes.gone, ["a"]);
        assert_eq!(changes.changed.len(), 1);
        assert_eq!(changes.changed[0].0, "b");
        assert!(accepted.changes(&accepted).is_empty());
    }
}

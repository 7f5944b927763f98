//! Simulators: how the gate shows an agent its own pending writes on a real MCP server.
//!
//! A write the gate stages is not sent until a person approves it, so a read made
//! meanwhile shows the world without it; an agent that cannot see its own write may work
//! on stale state or stage it again. A [`Simulator`] knows one kind of server well enough
//! to answer a read *as if* the agent's pending writes had been applied, in the order they
//! were staged, and marks every part it simulated with the pending action ids. Where it
//! cannot model a write or a read exactly (a pattern it does not understand, a fuzzy
//! match), it says so ([`Answer::Cannot`]) and the gate answers the real read with that
//! reason: never a guess.
//!
//! A simulator for another server is a new module here and one line in [`by_name`]; the
//! gateway only asks [`Simulator::touches`] (no I/O: a read nothing pending touches is
//! forwarded as it always was) and then [`Simulator::simulate`], which reads what it needs
//! of the real server through [`RealReads`]. [`check_catalog`] holds a simulator to the
//! tool definitions it was written against: one whose tools changed is disabled whole.
//!
//! Seed 003's pitfalls: when a write is staged, [`Simulator::basis`] says what it acts on
//! as the simulation showed it then (each [`Target`] with a fingerprint: a content hash,
//! "absent", ...) and which earlier pending writes it is built on (an edit of a pending
//! file's content, a move of a file a pending write created, an observation added to an
//! entity a pending write created). The gate records it, asks again before approval, and
//! calls the write stale where a fingerprint changed ([`Basis::changes_since`]).

pub mod filesystem;
pub mod glob;
mod js;
pub mod memory;

use async_trait::async_trait;
use gatekeeper_core::{Content, ToolResult};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

pub use js::JsValue;

/// The `_meta` key under which a simulated answer lists the pending actions it shows.
pub const META_KEY: &str = "gate/pending";

/// One of the agent's own pending writes on the server, as the simulator sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingWrite {
    /// The action id the agent was given when the write was staged.
    pub action: u64,
    /// The server's tool it will call.
    pub tool: String,
    /// The arguments it will send.
    pub args: Value,
}

/// A read an agent asked for.
#[derive(Debug, Clone, Copy)]
pub struct ReadCall<'a> {
    /// The server's tool.
    pub tool: &'a str,
    /// Its arguments (a JSON object).
    pub args: &'a Value,
}

/// What a simulator answers for a read.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// Nothing pending changes what this read shows: forward it as it is.
    Untouched,
    /// The read as it would answer once the pending writes are applied, with a note (the
    /// first block) and `_meta` ([`META_KEY`]) naming the actions it shows.
    Simulated(ToolResult),
    /// Pending writes may change what this read shows, but the simulator cannot say how
    /// exactly: the real read is answered, with this reason.
    Cannot {
        /// Why, in the gate's words, for the agent.
        reason: String,
        /// The pending actions that may change the read.
        actions: Vec<u64>,
    },
}

/// Reads of the real server a simulation may need (the agent's own read, the content of
/// a file an edit applies to, the graph a memory write changes). Each is an ordinary read
/// of the agent's session: granted, recorded, under the server's deadline.
#[async_trait]
pub trait RealReads: Send + Sync {
    /// Call the read `tool` with `args` on the real server. `Err` says why it could not be
    /// read (not granted, the server failed); a tool error is an `Ok` with `is_error`.
    async fn read(&self, tool: &str, args: Value) -> Result<ToolResult, String>;
}

/// What a simulator relies on in one tool's input schema: each property and its JSON type.
pub type Expectation = (&'static str, &'static [(&'static str, &'static str)]);

/// One thing a write acts on, as the simulation showed it just before the write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    /// What it is, in the person's words (`/w/notes/plan.md`, `entity "Ada"`).
    pub name: String,
    /// What it was: `content sha256:…`, `absent`, `a directory`, …
    pub state: String,
    /// The agent's pending actions that left it so (empty: as it really was).
    pub by: Vec<u64>,
}

/// What a write builds on, worked out when it is staged and again before it is approved.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Basis {
    /// What it acts on, each as the simulation showed it just before this write.
    pub targets: Vec<Target>,
    /// The earlier pending actions whose effect it needs (rejecting one of them changes
    /// what this write does), ascending.
    pub built_on: Vec<u64>,
}

impl Basis {
    /// How `self` (now) differs from `then` (at staging), one line per changed target, in
    /// the person's words; empty when nothing changed.
    pub fn changes_since(&self, then: &Basis) -> Vec<String> {
        let mut changes = Vec::new();
        for old in &then.targets {
            let now = self.targets.iter().find(|t| t.name == old.name);
            let Some(now) = now else {
                changes.push(format!("{}: no longer known", old.name));
                continue;
            };
            if now.state != old.state {
                let then_by = if old.by.is_empty() {
                    String::new()
                } else {
                    format!(" as {} left it", actions_phrase(&old.by))
                };
                changes.push(format!(
                    "{} was {}{then_by} when it was staged, and is now {}",
                    old.name, old.state, now.state
                ));
            }
        }
        changes
    }
}

/// A text's fingerprint: `content sha256:` and the first 16 hex digits, with its length.
pub fn fingerprint(text: &str) -> String {
    let hash = Sha256::digest(text.as_bytes());
    let hex: String = hash.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("content sha256:{hex}… ({} bytes)", text.len())
}

/// Answers an agent's reads of one kind of server as if its pending writes were applied.
#[async_trait]
pub trait Simulator: Send + Sync {
    /// Its name in `gate.toml` (`simulator = "..."`).
    fn name(&self) -> &'static str;

    /// The writes it models and the reads it answers, with the input-schema properties
    /// each relies on; [`check_catalog`] holds the server's catalog to them.
    fn expects(&self) -> &'static [Expectation];

    /// Whether `tool` is a write it models (a staged call of it is shown in reads).
    fn models(&self, tool: &str) -> bool;

    /// Whether any of `pending` may change what `read` shows. Pure (no I/O): a read it
    /// says `false` for is forwarded exactly as without a simulator.
    fn touches(&self, read: ReadCall<'_>, pending: &[PendingWrite]) -> bool;

    /// Answer `read` as if `pending` (the agent's own, in staging order) were applied,
    /// reading what it needs of the real server through `real`.
    async fn simulate(
        &self,
        read: ReadCall<'_>,
        pending: &[PendingWrite],
        real: &dyn RealReads,
    ) -> Answer;

    /// What `write` acts on once `before` (the agent's pending writes staged ahead of it,
    /// in order) are applied over the real server, and which of them it is built on,
    /// reading what it needs through `real`. `Err` says why it cannot be told (the gate then
    /// says so to the person). The default tracks nothing.
    async fn basis(
        &self,
        write: &PendingWrite,
        before: &[PendingWrite],
        real: &dyn RealReads,
    ) -> Result<Basis, String> {
        let _ = (write, before, real);
        Err(format!(
            "the {} simulator does not track what a write builds on",
            self.name()
        ))
    }
}

/// The simulators this build knows, by their names in `gate.toml`.
pub const NAMES: &[&str] = &["filesystem", "memory"];

/// The simulator named `name`, if this build has one.
pub fn by_name(name: &str) -> Option<Box<dyn Simulator>> {
    match name {
        "filesystem" => Some(Box::new(filesystem::Filesystem)),
        "memory" => Some(Box::new(memory::Memory)),
        _ => None,
    }
}

/// The simulator that fits a server started as `command args…`, recognized from the npm
/// package it runs, to suggest in an error message.
pub fn recognize(command: &str, args: &[String]) -> Option<&'static str> {
    let all = std::iter::once(command).chain(args.iter().map(String::as_str));
    for part in all {
        if part.contains("server-filesystem") {
            return Some("filesystem");
        }
        if part.contains("server-memory") {
            return Some("memory");
        }
    }
    None
}

/// Hold `simulator` to a server's catalog: every tool it models or answers must be listed
/// (`tool` gives a tool's raw definition by name), its input schema may have no property
/// the simulator does not know (a new argument may change what a write does), every
/// property it relies on must have the type it expects, and nothing it does not know may
/// be required. `Err` says what differs; the caller disables the simulator whole.
pub fn check_catalog<'a>(
    simulator: &dyn Simulator,
    tool: impl Fn(&str) -> Option<&'a Value>,
) -> Result<(), String> {
    let mut problems = Vec::new();
    for (name, properties) in simulator.expects() {
        let Some(raw) = tool(name) else {
            problems.push(format!("the server no longer lists {name}"));
            continue;
        };
        let schema = raw.get("inputSchema").unwrap_or(&Value::Null);
        let listed = schema.get("properties").and_then(Value::as_object);
        if let Some(listed) = listed {
            for (property, definition) in listed {
                match properties.iter().find(|(p, _)| p == property) {
                    None => problems.push(format!(
                        "{name} has an argument {property:?} the simulator does not know"
                    )),
                    Some((_, expected)) => {
                        let ty = definition.get("type");
                        let fits = match ty {
                            Some(Value::String(t)) => t == expected,
                            Some(Value::Array(types)) => types.iter().any(|t| t == expected),
                            _ => false,
                        };
                        if !fits {
                            problems.push(format!(
                                "{name}'s argument {property:?} is no longer of type {expected}"
                            ));
                        }
                    }
                }
            }
        }
        if let Some(required) = schema.get("required").and_then(Value::as_array) {
            for property in required.iter().filter_map(Value::as_str) {
                if !properties.iter().any(|(p, _)| *p == property) {
                    problems.push(format!(
                        "{name} requires an argument {property:?} the simulator does not know"
                    ));
                }
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the {} simulator does not match this server's tools ({}); pending writes are hidden from reads until a gate that knows these tools runs",
            simulator.name(),
            problems.join("; ")
        ))
    }
}

/// A simulated answer: the note first, then `text` as the server would have sent it (as
/// its text block and as `structuredContent.content` when `structured` is `None`).
pub(crate) fn simulated(
    note: String,
    text: String,
    structured: Option<Value>,
    is_error: bool,
    actions: &[u64],
) -> ToolResult {
    let structured = match structured {
        Some(value) => Some(value),
        None if is_error => None,
        None => Some(json!({ "content": text })),
    };
    let mut result = ToolResult {
        content: vec![Content::text(note), Content::text(text)],
        structured_content: structured,
        is_error,
        ..ToolResult::default()
    };
    result.extra.insert(
        "_meta".to_owned(),
        json!({ META_KEY: { "simulated": true, "actions": actions } }),
    );
    result
}

/// "action 3", "actions 3, 4 and 7".
pub fn actions_phrase(actions: &[u64]) -> String {
    let mut ids: Vec<u64> = actions.to_vec();
    ids.sort_unstable();
    ids.dedup();
    match ids.as_slice() {
        [] => "no action".to_owned(),
        [one] => format!("action {one}"),
        [rest @ .., last] => format!(
            "actions {} and {last}",
            rest.iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The first text block of a result (where the servers these simulators model put
/// their whole answer).
pub(crate) fn text_of(result: &ToolResult) -> Option<&str> {
    result.content.iter().find_map(|c| match c {
        Content::Text { text } => Some(text.as_str()),
        Content::Other(_) => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, properties: Value, required: &[&str]) -> Value {
        json!({"name": name, "inputSchema": {"type": "object", "properties": properties, "required": required}})
    }

    #[test]
    fn a_catalog_that_matches_passes_and_one_with_a_new_argument_disables_the_simulator() {
        let memory = memory::Memory;
        let mut tools: Vec<Value> = memory
            .expects()
            .iter()
            .map(|(name, props)| {
                let properties: serde_json::Map<String, Value> = props
                    .iter()
                    .map(|(p, t)| ((*p).to_owned(), json!({"type": t})))
                    .collect();
                tool(name, Value::Object(properties), &[])
            })
            .collect();
        let find = |tools: &Vec<Value>, name: &str| -> Option<Value> {
            tools.iter().find(|t| t["name"] == name).cloned()
        };
        let copy = tools.clone();
        assert_eq!(
            check_catalog(&memory, |n| copy.iter().find(|t| t["name"] == n)),
            Ok(())
        );
        // A new argument of a write: the simulator would not know what it does.
        let mut changed = find(&tools, "create_entities").unwrap();
        changed["inputSchema"]["properties"]["merge"] = json!({"type": "boolean"});
        tools.retain(|t| t["name"] != "create_entities");
        tools.push(changed);
        let error = check_catalog(&memory, |n| tools.iter().find(|t| t["name"] == n)).unwrap_err();
        assert!(
            error.contains("create_entities has an argument \"merge\""),
            "{error}"
        );
        // A tool gone.
        tools.retain(|t| t["name"] != "open_nodes");
        let error = check_catalog(&memory, |n| tools.iter().find(|t| t["name"] == n)).unwrap_err();
        assert!(error.contains("no longer lists open_nodes"), "{error}");
    }

    #[test]
    fn servers_are_recognized_from_their_package() {
        let args = vec![
            "-y".to_owned(),
            "@modelcontextprotocol/server-filesystem".to_owned(),
        ];
        assert_eq!(recognize("npx", &args), Some("filesystem"));
        assert_eq!(recognize("mcp-server-memory", &[]), Some("memory"));
        assert_eq!(recognize("other", &[]), None);
        assert!(by_name("filesystem").is_some() && by_name("git").is_none());
    }

    #[test]
    fn actions_are_named_in_order() {
        assert_eq!(actions_phrase(&[4]), "action 4");
        assert_eq!(actions_phrase(&[7, 3, 4, 3]), "actions 3, 4 and 7");
    }
}

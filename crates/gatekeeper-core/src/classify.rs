//! The trust boundary: the one place in the workspace that reads a tool's annotations.
//!
//! A tool's annotations are claims made by the server about its own tools. This module
//! turns them into a [`ClassifiedTool`] once, and nothing else can read them: the
//! [`ToolAnnotations`] fields are private to this module and have no getters, so a second,
//! laxer reading of `readOnlyHint` elsewhere cannot be written without editing this file.
//!
//! The rules, from the reference (`tools.ts`):
//!
//! - A tool is a **read** only when `readOnlyHint` is the JSON boolean `true`. Absent, `false`,
//!   `"true"`, `1` or anything else make it an **action**, queued for approval. Reads are
//!   believed on both trust tiers: asking a person before every read would make a connector
//!   unusable, so a server that lies about a write being read-only gets it run without
//!   approval. That is the reference's deliberate trade-off, kept here.
//! - An action is **auto-approvable** (one of the two keys to auto-apply; a person's rule is
//!   the other) only on a [`ServerTrust::Vetted`] server, with `destructiveHint` exactly
//!   `false` and `idempotentHint` exactly `true`. A [`ServerTrust::Byo`] server can never
//!   auto-apply a write, whatever it says.
//! - Two settings of the person's weigh more than any claim: on a
//!   [`ServerTrust::Untrusted`] server nothing the server says is believed, so every tool is
//!   an action; and a tool the person lists as a read (`reads` in the server's
//!   configuration, [`classify`]'s `person_says_read`) is a read on any tier, whatever the
//!   server says, and never auto-applies anything.
//! - Who was believed is recorded in [`ClassifiedTool::classified_by`], never re-derived.
//!
//! A hint that is not a JSON boolean counts as absent when the catalog is read: it is never
//! coerced and never an error.

use std::fmt;

use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::tool::Tool;

/// How far a server's annotations are believed. Deployment configuration, not account state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ServerTrust {
    /// An administrator vouched for the endpoint: its annotations may drive auto-approval.
    Vetted,
    /// A user brought the endpoint ("bring your own"): `readOnlyHint` still classifies reads,
    /// but nothing it says can auto-apply a write.
    Byo,
    /// Nothing the server says is believed: every tool is an action a person approves,
    /// unless the person lists it as a read.
    Untrusted,
}

impl fmt::Display for ServerTrust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Vetted => "vetted",
            Self::Byo => "byo",
            Self::Untrusted => "untrusted",
        })
    }
}

/// The four MCP behaviour hints of a tool, kept only when they were JSON booleans.
///
/// The fields are private to the classifier on purpose (see the module docs). For display,
/// [`ToolAnnotations::summary`] renders what the server claimed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ToolAnnotations {
    read_only: Option<bool>,
    destructive: Option<bool>,
    idempotent: Option<bool>,
    open_world: Option<bool>,
}

/// The wire names of the hints, in the order [`ToolAnnotations::summary`] prints them.
const HINTS: [&str; 4] = [
    "readOnlyHint",
    "destructiveHint",
    "idempotentHint",
    "openWorldHint",
];

impl ToolAnnotations {
    fn hints(&self) -> [Option<bool>; 4] {
        [
            self.read_only,
            self.destructive,
            self.idempotent,
            self.open_world,
        ]
    }

    /// Keep the boolean hints of a raw `annotations` value; anything else counts as absent.
    fn from_raw(raw: &Value) -> Self {
        let Value::Object(map) = raw else {
            return Self::default();
        };
        let hint = |key: &str| map.get(key).and_then(Value::as_bool);
        Self {
            read_only: hint(HINTS[0]),
            destructive: hint(HINTS[1]),
            idempotent: hint(HINTS[2]),
            open_world: hint(HINTS[3]),
        }
    }

    /// The declared hints as (wire name, value), in the fixed order of [`HINTS`].
    fn declared(&self) -> impl Iterator<Item = (&'static str, bool)> {
        HINTS
            .into_iter()
            .zip(self.hints())
            .filter_map(|(key, hint)| hint.map(|b| (key, b)))
    }

    /// The hints the server declared, as compact JSON in a fixed order, for a
    /// classification table: `{"readOnlyHint":true}`, or `{}` when it declared none.
    pub fn summary(&self) -> String {
        let body: Vec<String> = self
            .declared()
            .map(|(key, value)| format!("\"{key}\":{value}"))
            .collect();
        format!("{{{}}}", body.join(","))
    }

    /// Whether the server declared no (boolean) hint at all.
    pub fn is_empty(&self) -> bool {
        self.hints().iter().all(Option::is_none)
    }
}

impl<'de> Deserialize<'de> for ToolAnnotations {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Read the raw JSON first so that a hint of the wrong type is dropped, not an error.
        let raw = Value::deserialize(deserializer)?;
        Ok(Self::from_raw(&raw))
    }
}

impl Serialize for ToolAnnotations {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        for (key, value) in self.declared() {
            map.serialize_entry(key, &value)?;
        }
        map.end()
    }
}

/// Whether a call is a read (runs at once, recorded as an observation) or an action
/// (staged and sent only after approval).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Mode {
    /// Runs without approval; its data is handed over only after the kernel authorized it.
    Read,
    /// Staged and submitted for approval; nothing is sent until then.
    Action,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Read => "read",
            Self::Action => "action",
        })
    }
}

/// Whose word decided the mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ClassifiedBy {
    /// The server's own `readOnlyHint: true`; an audit can list every call let through on
    /// the server's say-so.
    ServerAnnotation,
    /// The default: the server did not claim the tool is read-only, or was not believed.
    Default,
    /// The person's own list of reads (`reads` in the server's configuration).
    Person,
    /// The server's claims are not believed ([`ServerTrust::Untrusted`]): an action.
    Distrusted,
}

impl fmt::Display for ClassifiedBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ServerAnnotation => "server-annotation",
            Self::Default => "default",
            Self::Person => "person",
            Self::Distrusted => "distrusted",
        })
    }
}

/// The verdict on one tool. Only [`classify_tool`] makes one, so a consumer cannot claim a
/// tool is auto-approvable without going through the rules above.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClassifiedTool {
    mode: Mode,
    auto_approvable: bool,
    classified_by: ClassifiedBy,
}

impl ClassifiedTool {
    /// Read or action.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether the tool is a read.
    pub fn is_read(&self) -> bool {
        self.mode == Mode::Read
    }

    /// The gatekeeper's key for auto-approval: true only for an action on a vetted server
    /// that declared itself non-destructive and idempotent.
    pub fn auto_approvable(&self) -> bool {
        self.auto_approvable
    }

    /// Whose word decided the mode.
    pub fn classified_by(&self) -> ClassifiedBy {
        self.classified_by
    }
}

/// Classify a tool for a server of the given trust. See the module docs for the rules.
pub fn classify_tool(tool: &Tool, trust: ServerTrust) -> ClassifiedTool {
    classify(tool, trust, false)
}

/// [`classify_tool`] with the person's word on this tool: `person_says_read` when the
/// person lists it as a read, which makes it a read on any tier, whatever the server
/// claims (and never auto-approvable: a read sends nothing to approve).
pub fn classify(tool: &Tool, trust: ServerTrust, person_says_read: bool) -> ClassifiedTool {
    if person_says_read {
        return ClassifiedTool {
            mode: Mode::Read,
            auto_approvable: false,
            classified_by: ClassifiedBy::Person,
        };
    }
    if trust == ServerTrust::Untrusted {
        return ClassifiedTool {
            mode: Mode::Action,
            auto_approvable: false,
            classified_by: ClassifiedBy::Distrusted,
        };
    }
    let hints = &tool.annotations;
    let read_only = hints.read_only == Some(true);
    let auto_approvable = !read_only
        && trust == ServerTrust::Vetted
        && hints.destructive == Some(false)
        && hints.idempotent == Some(true);
    ClassifiedTool {
        mode: if read_only { Mode::Read } else { Mode::Action },
        auto_approvable,
        classified_by: if read_only {
            ClassifiedBy::ServerAnnotation
        } else {
            ClassifiedBy::Default
        },
    }
}

/// Why no auto-approval rule can ever apply a call of a tool ([`why_no_rule`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoRule {
    /// The tool is a read: it is sent at once and never waits, so there is nothing to apply.
    Read,
    /// The server is not vetted: its word cannot auto-apply anything.
    NotVetted(ServerTrust),
    /// The server does not declare the tool both non-destructive and idempotent; what it
    /// did declare (`None`: nothing).
    NotRepeatable {
        /// Its `destructiveHint`.
        destructive: Option<bool>,
        /// Its `idempotentHint`.
        idempotent: Option<bool>,
    },
}

/// Why a rule could never apply a call of `tool` on a server of `trust` (`None`: one can),
/// by the same test as [`classify`]'s `auto_approvable`.
pub fn why_no_rule(tool: &Tool, trust: ServerTrust, person_says_read: bool) -> Option<NoRule> {
    let classified = classify(tool, trust, person_says_read);
    if classified.auto_approvable() {
        return None;
    }
    if classified.is_read() {
        return Some(NoRule::Read);
    }
    if trust != ServerTrust::Vetted {
        return Some(NoRule::NotVetted(trust));
    }
    Some(NoRule::NotRepeatable {
        destructive: tool.annotations.destructive,
        idempotent: tool.annotations.idempotent,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_reason_no_rule_applies_is_the_classifiers_own() {
        let repeatable = json!({"destructiveHint": false, "idempotentHint": true});
        assert_eq!(
            why_no_rule(&tool(repeatable.clone()), ServerTrust::Vetted, false),
            None
        );
        assert_eq!(
            why_no_rule(&tool(repeatable.clone()), ServerTrust::Byo, false),
            Some(NoRule::NotVetted(ServerTrust::Byo))
        );
        assert_eq!(
            why_no_rule(&tool(repeatable), ServerTrust::Vetted, true),
            Some(NoRule::Read)
        );
        assert_eq!(
            why_no_rule(
                &tool(json!({"idempotentHint": true})),
                ServerTrust::Vetted,
                false
            ),
            Some(NoRule::NotRepeatable {
                destructive: None,
                idempotent: Some(true)
            })
        );
        assert_eq!(
            why_no_rule(
                &tool(json!({"readOnlyHint": true})),
                ServerTrust::Untrusted,
                false
            ),
            Some(NoRule::NotVetted(ServerTrust::Untrusted)),
            "an untrusted server's read hint is not believed either"
        );
    }

    fn tool(annotations: Value) -> Tool {
        Tool::from_json(json!({"name": "t", "annotations": annotations})).expect("valid tool")
    }

    fn verdict(annotations: Value, trust: ServerTrust) -> (Mode, bool, ClassifiedBy) {
        let c = classify_tool(&tool(annotations), trust);
        (c.mode(), c.auto_approvable(), c.classified_by())
    }

    use ClassifiedBy::{Default as Dflt, ServerAnnotation as Srv};
    use Mode::{Action, Read};
    use ServerTrust::{Byo, Vetted};

    #[test]
    fn the_persons_word_weighs_more_than_the_servers() {
        let claims_read = json!({"readOnlyHint": true});
        let safe_write = json!({"destructiveHint": false, "idempotentHint": true});
        let untrusted = |annotations: Value| {
            let c = classify(&tool(annotations), ServerTrust::Untrusted, false);
            (c.mode(), c.auto_approvable(), c.classified_by())
        };
        let distrusted = ClassifiedBy::Distrusted;
        assert_eq!(untrusted(claims_read.clone()), (Action, false, distrusted));
        assert_eq!(untrusted(safe_write.clone()), (Action, false, distrusted));
        for trust in [Vetted, Byo, ServerTrust::Untrusted] {
            for annotations in [
                json!({}),
                json!({"readOnlyHint": false}),
                safe_write.clone(),
            ] {
                let c = classify(&tool(annotations), trust, true);
                assert_eq!(
                    (c.mode(), c.auto_approvable(), c.classified_by()),
                    (Read, false, ClassifiedBy::Person)
                );
            }
        }
    }

    #[test]
    fn classification_table() {
        let safe = json!({"destructiveHint": false, "idempotentHint": true});
        let cases = [
            (json!({"readOnlyHint": true}), Vetted, (Read, false, Srv)),
            (json!({"readOnlyHint": true}), Byo, (Read, false, Srv)),
            (json!({}), Vetted, (Action, false, Dflt)),
            (Value::Null, Vetted, (Action, false, Dflt)),
            (
                json!({"readOnlyHint": false}),
                Vetted,
                (Action, false, Dflt),
            ),
            (safe.clone(), Vetted, (Action, true, Dflt)),
            (safe, Byo, (Action, false, Dflt)),
            (
                json!({"destructiveHint": false}),
                Vetted,
                (Action, false, Dflt),
            ),
            (
                json!({"idempotentHint": true}),
                Vetted,
                (Action, false, Dflt),
            ),
            (
                json!({"destructiveHint": true, "idempotentHint": true}),
                Vetted,
                (Action, false, Dflt),
            ),
            // A read is never auto-approvable: it needs no approval at all.
            (
                json!({"readOnlyHint": true, "destructiveHint": false, "idempotentHint": true}),
                Vetted,
                (Read, false, Srv),
            ),
        ];
        for (annotations, trust, expected) in cases {
            assert_eq!(
                verdict(annotations.clone(), trust),
                expected,
                "{annotations} on {trust}"
            );
        }
    }

    #[test]
    fn non_boolean_hints_count_as_absent() {
        for not_bool in [
            json!("true"),
            json!(1),
            json!(null),
            json!([true]),
            json!({}),
        ] {
            let read = json!({"readOnlyHint": not_bool});
            assert_eq!(
                verdict(read.clone(), Vetted),
                (Action, false, Dflt),
                "{read}"
            );
            let auto = json!({"destructiveHint": false, "idempotentHint": not_bool});
            assert_eq!(
                verdict(auto.clone(), Vetted),
                (Action, false, Dflt),
                "{auto}"
            );
            let auto = json!({"destructiveHint": not_bool, "idempotentHint": true});
            assert_eq!(
                verdict(auto.clone(), Vetted),
                (Action, false, Dflt),
                "{auto}"
            );
        }
        assert_eq!(
            tool(json!({"readOnlyHint": "true"})).annotations.summary(),
            "{}"
        );
    }

    #[test]
    fn annotations_that_are_not_an_object_count_as_absent() {
        for raw in [json!("readOnly"), json!(true), json!([1])] {
            assert!(tool(raw.clone()).annotations.is_empty());
            assert_eq!(verdict(raw, Vetted), (Action, false, Dflt));
        }
    }

    #[test]
    fn summary_lists_declared_booleans_in_a_fixed_order() {
        let t = tool(json!({
            "idempotentHint": true, "openWorldHint": "yes", "destructiveHint": false,
            "readOnlyHint": false, "extra": true
        }));
        assert_eq!(
            t.annotations.summary(),
            r#"{"readOnlyHint":false,"destructiveHint":false,"idempotentHint":true}"#
        );
        assert_eq!(tool(json!({})).annotations.summary(), "{}");
    }

    #[test]
    fn names_print_as_the_reference_spells_them() {
        assert_eq!(Mode::Read.to_string(), "read");
        assert_eq!(
            ClassifiedBy::ServerAnnotation.to_string(),
            "server-annotation"
        );
        assert_eq!(ClassifiedBy::Default.to_string(), "default");
        assert_eq!(ServerTrust::Byo.to_string(), "byo");
    }
}

//! A person's edit of a staged call before approving it: the edited arguments are checked
//! against the tool's input schema, put in place of the agent's while the call is still
//! pending, and described (what changed, and a digest of the call as staged and as it will
//! be sent) so the approval can record both.
//!
//! An edit changes the arguments of one call, never its tool or its server: the tool is
//! the one the person's grant and the ledger's prompt name.

use kernel::DriverActionId;
use serde_json::{Map, Value};
use sha2::{Digest as _, Sha256};

use crate::gatekeeper::ToolGatekeeper;
use crate::store::ActionState;

/// How the note of an edited approval begins (the agent's outcome looks for it).
pub const EDITED: &str = "approved with changes";

/// A stored edit: what changed, and the call's digests before and after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    /// One phrase per argument that changed, in name order (`path: "/a" → "/b"`).
    pub changes: Vec<String>,
    /// The digest of the call as the agent staged it ([`call_digest`]).
    pub staged: String,
    /// The digest of the call as it will be sent.
    pub sent: String,
}

impl Edit {
    /// The note the approval records: `approved with changes by alice: …; staged as call
    /// sha256:…, sent as call sha256:…`.
    pub fn note(&self, by: &str) -> String {
        format!(
            "{EDITED} by {by}: {}; staged as call {}, sent as call {}",
            self.changes.join("; "),
            self.staged,
            self.sent
        )
    }
}

/// Why an edit was not stored; nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EditError {
    /// The store has no such call.
    #[error("the gatekeeper's store no longer holds this call")]
    Unknown,
    /// The call was decided: only a pending call can be edited.
    #[error("it is no longer pending: only a pending call can be edited")]
    NotPending,
    /// The edited arguments are not a JSON object.
    #[error(
        "the edited arguments must be a JSON object ({{\"name\": value, ...}}), as the agent's were"
    )]
    NotAnObject,
    /// The edited arguments do not fit the tool's input schema (each problem, where and what).
    #[error("the edited arguments do not fit the tool's schema: {0}")]
    Schema(String),
    /// Nothing differs from the staged call.
    #[error("the edit changes nothing")]
    Unchanged,
    /// The store refused the write.
    #[error("the edit could not be stored: {0}")]
    Storage(String),
}

impl ToolGatekeeper {
    /// Put `args` in place of pending call `id`'s arguments, once they fit its tool's input
    /// schema; what changed, for the approval's note. Nothing is sent here: the call is
    /// sent when it is approved, as any other.
    pub async fn amend(&self, id: DriverActionId, args: Value) -> Result<Edit, EditError> {
        let record = self
            .store()
            .get(id)
            .await
            .map_err(|e| EditError::Storage(e.to_string()))?
            .ok_or(EditError::Unknown)?;
        if record.state != ActionState::Pending {
            return Err(EditError::NotPending);
        }
        let (Value::Object(old), Value::Object(new)) = (&*record.args, &args) else {
            return Err(EditError::NotAnObject);
        };
        let schema = self
            .entry(&record.tool)
            .map(|entry| entry.tool.input_schema.clone())
            .ok_or(EditError::Unknown)?;
        check_schema(&schema, &args).map_err(EditError::Schema)?;
        let changes = changes(old, new);
        if changes.is_empty() {
            return Err(EditError::Unchanged);
        }
        let definition = record.definition.as_deref().unwrap_or("");
        let edit = Edit {
            changes,
            staged: call_digest(&record.tool, definition, &record.args),
            sent: call_digest(&record.tool, definition, &args),
        };
        match self.store().amend(id, args).await {
            Ok(true) => Ok(edit),
            Ok(false) => Err(EditError::NotPending),
            Err(error) => Err(EditError::Storage(error.to_string())),
        }
    }
}

/// Check `args` against a JSON Schema; `Err` lists the first problems, each with where it
/// is (`/text: 42 is not of type "string"`).
pub fn check_schema(schema: &Value, args: &Value) -> Result<(), String> {
    let validator = jsonschema::validator_for(schema)
        .map_err(|e| format!("its schema cannot be checked ({e})"))?;
    let problems: Vec<String> = validator
        .iter_errors(args)
        .take(5)
        .map(|error| {
            let at = error.instance_path.to_string();
            let at = if at.is_empty() {
                "the arguments".to_owned()
            } else {
                at
            };
            format!("{at}: {error}")
        })
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// What changed from `old` to `new`, one phrase per argument, in name order:
/// `path: "/a" → "/b"`, `mode: added "x"`, `dry: removed`. Values are shown as compact
/// JSON, cut at 120 characters.
pub fn changes(old: &Map<String, Value>, new: &Map<String, Value>) -> Vec<String> {
    let mut names: Vec<&String> = old.keys().chain(new.keys()).collect();
    names.sort_unstable();
    names.dedup();
    let shown = |value: &Value| {
        let text = value.to_string();
        match text.char_indices().nth(120) {
            Some((at, _)) => format!("{}…", &text[..at]),
            None => text,
        }
    };
    names
        .into_iter()
        .filter_map(|name| match (old.get(name), new.get(name)) {
            (Some(a), Some(b)) if a == b => None,
            (Some(a), Some(b)) => Some(format!("{name}: {} → {}", shown(a), shown(b))),
            (None, Some(b)) => Some(format!("{name}: added {}", shown(b))),
            (Some(_), None) => Some(format!("{name}: removed")),
            (None, None) => None,
        })
        .collect()
}

/// A short digest of a call: its tool, the definition it was staged against, and its
/// arguments in canonical JSON (`sha256:0123456789abcdef`).
pub fn call_digest(tool: &str, definition: &str, args: &Value) -> String {
    let mut hasher = Sha256::new();
    hasher.update(tool.as_bytes());
    hasher.update([0]);
    hasher.update(definition.as_bytes());
    hasher.update([0]);
    hasher.update(canonical_json(args).as_bytes());
    let hex: String = hasher
        .finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn changes_name_each_argument_once() {
        let old = json!({"path": "/tmp/a", "dry": true, "n": 1});
        let new = json!({"path": "/tmp/b", "n": 1, "mode": "x"});
        assert_eq!(
            changes(old.as_object().unwrap(), new.as_object().unwrap()),
            vec![
                "dry: removed".to_owned(),
                "mode: added \"x\"".to_owned(),
                "path: \"/tmp/a\" → \"/tmp/b\"".to_owned(),
            ]
        );
    }

    #[test]
    fn a_digest_changes_with_the_arguments_not_with_their_order() {
        let a = call_digest("t", "d", &json!({"x": 1, "y": 2}));
        assert_eq!(a, call_digest("t", "d", &json!({"y": 2, "x": 1})));
        assert_ne!(a, call_digest("t", "d", &json!({"x": 1, "y": 3})));
        assert!(a.starts_with("sha256:") && a.len() == 23);
    }

    #[test]
    fn the_schema_says_where_an_edit_does_not_fit() {
        let schema = json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]});
        assert!(check_schema(&schema, &json!({"text": "ok"})).is_ok());
        let problem = check_schema(&schema, &json!({"text": 42})).unwrap_err();
        assert!(problem.starts_with("/text: 42 is not of type"), "{problem}");
        assert!(
            check_schema(&schema, &json!({}))
                .unwrap_err()
                .contains("required")
        );
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_depth() {
        assert_eq!(
            canonical_json(&json!({"b": [{"d": 1, "c": 2}], "a": "x"})),
            r#"{"a":"x","b":[{"c":2,"d":1}]}"#
        );
    }
}

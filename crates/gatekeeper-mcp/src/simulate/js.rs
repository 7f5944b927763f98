//! JSON as JavaScript's `JSON.stringify(value, null, 2)` writes it: keys in the order
//! given (serde_json's map would sort them), two-space indentation, `[]` and `{}` for
//! empty containers. The servers these simulators model answer in exactly this form.

use serde_json::Value;

/// A JSON value whose object keys keep the order they were given in.
#[derive(Debug, Clone, PartialEq)]
pub enum JsValue {
    /// A string.
    Str(String),
    /// A boolean.
    Bool(bool),
    /// An array.
    Arr(Vec<JsValue>),
    /// An object, its keys in order.
    Obj(Vec<(&'static str, JsValue)>),
}

impl JsValue {
    /// `JSON.stringify(self, null, 2)`.
    pub fn pretty(&self) -> String {
        let mut out = String::new();
        self.write(&mut out, 0);
        out
    }

    fn write(&self, out: &mut String, depth: usize) {
        match self {
            Self::Str(text) => out.push_str(&Value::String(text.clone()).to_string()),
            Self::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Self::Arr(items) if items.is_empty() => out.push_str("[]"),
            Self::Obj(fields) if fields.is_empty() => out.push_str("{}"),
            Self::Arr(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    out.push_str(if i == 0 { "\n" } else { ",\n" });
                    indent(out, depth + 1);
                    item.write(out, depth + 1);
                }
                out.push('\n');
                indent(out, depth);
                out.push(']');
            }
            Self::Obj(fields) => {
                out.push('{');
                for (i, (key, value)) in fields.iter().enumerate() {
                    out.push_str(if i == 0 { "\n" } else { ",\n" });
                    indent(out, depth + 1);
                    out.push_str(&Value::String((*key).to_owned()).to_string());
                    out.push_str(": ");
                    value.write(out, depth + 1);
                }
                out.push('\n');
                indent(out, depth);
                out.push('}');
            }
        }
    }

    /// The same value as serde_json's (for `structuredContent`, where order does not matter).
    pub fn to_value(&self) -> Value {
        match self {
            Self::Str(text) => Value::String(text.clone()),
            Self::Bool(b) => Value::Bool(*b),
            Self::Arr(items) => Value::Array(items.iter().map(Self::to_value).collect()),
            Self::Obj(fields) => Value::Object(
                fields
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), v.to_value()))
                    .collect(),
            ),
        }
    }
}

fn indent(out: &mut String, depth: usize) {
    for _ in 0..depth {
        out.push_str("  ");
    }
}

#[cfg(test)]
mod tests {
    use super::JsValue::{Arr, Obj, Str};

    #[test]
    fn prints_as_json_stringify_with_two_spaces() {
        let value = Arr(vec![Obj(vec![
            ("name", Str("a\"b".into())),
            ("type", Str("directory".into())),
            ("children", Arr(vec![])),
        ])]);
        assert_eq!(
            value.pretty(),
            "[\n  {\n    \"name\": \"a\\\"b\",\n    \"type\": \"directory\",\n    \"children\": []\n  }\n]"
        );
        assert_eq!(Arr(vec![]).pretty(), "[]");
    }
}

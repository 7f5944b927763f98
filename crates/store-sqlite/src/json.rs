//! Stored JSON: one nesting limit, enforced by the code that reads JSON back, and checked
//! with the same function before anything is written, so nothing is stored that could
//! not be read back.
//!
//! serde_json refuses to read JSON nested deeper than 128 levels, and SQLite's JSON
//! functions (the `json_valid` CHECK constraints) refuse more than 1,000; arguments an
//! agent chooses can be nested deeper than either. Without a limit at the write, such
//! arguments are staged, and after a restart they cannot be read: the action can be
//! neither approved nor rejected and holds an open slot for good. With it, they are
//! refused at staging, with a message that says why.

use serde::de::DeserializeOwned;

use crate::error::StoreError;

/// The deepest nesting of arrays and objects a stored JSON value may have.
pub const MAX_JSON_DEPTH: usize = 100;

/// How deeply `text` (JSON) nests arrays and objects. Brackets inside strings do not
/// count.
fn depth(text: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for byte in text.bytes() {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Whether no JSON in `bytes` can nest deeper than the limit: nesting never exceeds the
/// number of opening brackets, which is quick to count (strings and all), and most values
/// have far fewer than the limit.
pub(crate) fn shallow(bytes: &[u8]) -> bool {
    bytes.iter().filter(|&&b| b == b'[' || b == b'{').count() <= MAX_JSON_DEPTH
}

/// Refuse a nesting `depth` over the limit. `what` names the value in the message.
fn within_limit(depth: usize, what: &str) -> Result<(), StoreError> {
    if depth > MAX_JSON_DEPTH {
        return Err(StoreError::TooDeep {
            what: what.to_owned(),
            depth,
            max: MAX_JSON_DEPTH,
        });
    }
    Ok(())
}

/// Refuse JSON that [`read`] would refuse for its depth. `what` names it in the message.
pub(crate) fn readable(text: &str, what: &str) -> Result<(), StoreError> {
    if shallow(text.as_bytes()) {
        return Ok(());
    }
    within_limit(depth(text), what)
}

/// Read stored JSON back: the depth limit first, then serde_json.
pub(crate) fn read<T: DeserializeOwned>(text: &str, what: &str) -> Result<T, StoreError> {
    readable(text, what)?;
    serde_json::from_str(text).map_err(|e| StoreError::decode(what.to_owned(), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_counts_nesting_and_ignores_brackets_in_strings() {
        assert_eq!(depth("{}"), 1);
        assert_eq!(depth(r#"{"a":[1,{"b":[]}]}"#), 4);
        assert_eq!(depth(r#"{"a":"[[[[{{{{\"]]"}"#), 1);
        assert_eq!(depth("1"), 0);
    }

    #[test]
    fn what_is_readable_is_read_and_what_is_too_deep_is_refused_by_both() {
        let ok = format!(
            "{}{}",
            "[".repeat(MAX_JSON_DEPTH),
            "]".repeat(MAX_JSON_DEPTH)
        );
        readable(&ok, "x").unwrap();
        // More brackets than the limit, in strings or side by side, are not nesting.
        readable(&format!("[\"{}\"]", "[".repeat(300)), "x").unwrap();
        readable(&format!("[{}]", "[],".repeat(300) + "[]"), "x").unwrap();
        read::<serde_json::Value>(&ok, "x").unwrap();
        let deep = format!("[{ok}]");
        assert!(matches!(
            readable(&deep, "x"),
            Err(StoreError::TooDeep { .. })
        ));
        assert!(matches!(
            read::<serde_json::Value>(&deep, "x"),
            Err(StoreError::TooDeep { .. })
        ));
    }
}

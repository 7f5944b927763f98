//! Action kinds: the keys auto-approval rules are stored under.
//!
//! A rule "let `addLabel` on this tracker through" must never also cover a tool of another
//! server, nor a tool whose name happens to contain the separator. The tag is therefore
//! `encodeURIComponent(scope) + ":" + encodeURIComponent(tool)`, as in the reference: a
//! literal `:` in either part becomes `%3A`, so the one unencoded `:` is unambiguous.

use kernel::ActionKind;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// Every byte except `encodeURIComponent`'s unreserved set: `A-Z a-z 0-9 - _ . ! ~ * ' ( )`.
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'!')
    .remove(b'~')
    .remove(b'*')
    .remove(b'\'')
    .remove(b'(')
    .remove(b')');

/// The kind of a call to `tool` in `scope` (a per-server or per-binding namespace).
///
/// The label is the tool's name, for the list of rules a person reads.
pub fn action_kind_for(scope: &str, tool: &str) -> ActionKind {
    let tag = format!(
        "{}:{}",
        utf8_percent_encode(scope, COMPONENT),
        utf8_percent_encode(tool, COMPONENT)
    );
    ActionKind::new(tag, tool)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn separators_inside_a_part_cannot_forge_another_kind() {
        let a = action_kind_for("binding", "tool:admin");
        let b = action_kind_for("binding:tool", "admin");
        assert_ne!(a.tag, b.tag);
        assert_eq!(a.tag, "binding:tool%3Aadmin");
        assert_eq!(b.tag, "binding%3Atool:admin");
        assert_eq!(a.label, "tool:admin");
    }

    #[test]
    fn encodes_like_encode_uri_component() {
        let kind = action_kind_for("mcp:issues.example", "a-b_c.d!e~f*g'h(i)j k/é%");
        assert_eq!(
            kind.tag,
            "mcp%3Aissues.example:a-b_c.d!e~f*g'h(i)j%20k%2F%C3%A9%25"
        );
    }
}

//! The names agents see: `<server>__<tool>`, within the common client limit of 64
//! characters from `[A-Za-z0-9_-]`.
//!
//! A name is `<server>__<tool>` with every character outside `[A-Za-z0-9_-]` replaced by
//! `_`. When that is longer than [`MAX_TOOL_NAME`], or when two tools would get the same
//! name (`a.b` and `a_b`), each such tool is named by a prefix and the first 8 hex digits
//! of the SHA-256 of `<server>\0<tool>`: deterministic, and different for different tools.
//! A collision that survives this is refused rather than resolved by order.

use std::collections::HashMap;

use sha2::{Digest as _, Sha256};

/// The longest tool name many MCP clients accept.
pub const MAX_TOOL_NAME: usize = 64;

/// The separator between a server's name and its tool's name.
pub const SEPARATOR: &str = "__";

/// Two tools that cannot be told apart by name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "tools {first:?} and {second:?} would both be named {name:?} for agents; rename one of the servers"
)]
pub struct NameCollision {
    /// The agent-facing name.
    pub name: String,
    /// One tool, as `server/tool`.
    pub first: String,
    /// The other.
    pub second: String,
}

fn plain(server: &str, tool: &str) -> String {
    format!("{server}{SEPARATOR}{tool}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn hashed(server: &str, tool: &str) -> String {
    let plain = plain(server, tool);
    let digest = Sha256::digest(format!("{server}\0{tool}").as_bytes());
    let suffix: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    let keep = MAX_TOOL_NAME - suffix.len() - 1;
    let prefix: String = plain.chars().take(keep).collect();
    format!("{prefix}_{suffix}")
}

/// Agent-facing names for `(server, tool)` pairs, in the same order; `reserved` names
/// (the gateway's own tools) are never given out.
pub fn agent_names(
    tools: &[(&str, &str)],
    reserved: &[&str],
) -> Result<Vec<String>, NameCollision> {
    let plains: Vec<String> = tools.iter().map(|(s, t)| plain(s, t)).collect();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for name in &plains {
        *counts.entry(name.as_str()).or_default() += 1;
    }
    let names: Vec<String> = tools
        .iter()
        .zip(&plains)
        .map(|((server, tool), plain)| {
            if plain.len() > MAX_TOOL_NAME
                || counts[plain.as_str()] > 1
                || reserved.contains(&plain.as_str())
            {
                hashed(server, tool)
            } else {
                plain.clone()
            }
        })
        .collect();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, name) in names.iter().enumerate() {
        if let Some(&j) = seen.get(name.as_str()) {
            return Err(NameCollision {
                name: name.clone(),
                first: format!("{}/{}", tools[j].0, tools[j].1),
                second: format!("{}/{}", tools[i].0, tools[i].1),
            });
        }
        seen.insert(name, i);
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid(name: &str) -> bool {
        name.len() <= MAX_TOOL_NAME
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    }

    #[test]
    fn short_names_are_server_and_tool() {
        let names = agent_names(&[("files", "read_file"), ("mem", "open-nodes")], &[]).expect("ok");
        assert_eq!(names, ["files__read_file", "mem__open-nodes"]);
    }

    #[test]
    fn long_names_are_shortened_deterministically_within_the_limit() {
        let tool = "a_tool_with_a_name_far_longer_than_any_client_would_accept_as_is";
        let first = agent_names(&[("files", tool)], &[]).expect("ok");
        let again = agent_names(&[("other", "x"), ("files", tool)], &[]).expect("ok");
        assert_eq!(first[0], again[1], "the same tool gets the same name");
        assert!(valid(&first[0]), "{}", first[0]);
        assert_eq!(first[0].len(), MAX_TOOL_NAME);
        assert!(first[0].starts_with("files__a_tool_with"));
    }

    #[test]
    fn names_that_collide_once_cleaned_are_both_hashed_apart() {
        let names = agent_names(&[("s", "a.b"), ("s", "a_b"), ("s", "c")], &[]).expect("ok");
        assert_ne!(names[0], names[1]);
        assert!(names[0].starts_with("s__a_b_") && names[1].starts_with("s__a_b_"));
        assert_eq!(names[2], "s__c");
        assert!(names.iter().all(|n| valid(n)));
    }

    #[test]
    fn reserved_names_are_never_given_out() {
        let names = agent_names(&[("gate", "pending")], &["gate__pending"]).expect("ok");
        assert_ne!(names[0], "gate__pending");
    }

    #[test]
    fn a_tool_listed_twice_is_a_collision() {
        let error = agent_names(&[("s", "t"), ("s", "t")], &[]).expect_err("collides");
        assert_eq!(error.first, "s/t");
    }
}

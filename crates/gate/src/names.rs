//! The names agents see: `<server>__<tool>`, within the common client limit of 64
//! characters from `[A-Za-z0-9_-]`.
//!
//! A name is `<server>__<tool>` with every character outside `[A-Za-z0-9_-]` replaced by
//! `_`. When that is longer than [`MAX_TOOL_NAME`], or when two tools would get the same
//! name (`a.b` and `a_b`), each such tool is named by a prefix and the first 8 hex digits
//! of the SHA-256 of `<server>\0<tool>`: deterministic, and different for different tools.
//! A collision that survives this is refused rather than resolved by order.
//!
//! Prompts are named as tools are ([`prompt_name`]), and a downstream resource is given an
//! address of the gate's, `gate://<server>/<the server's own address>` ([`resource_uri`]),
//! so an agent granted several servers can tell their resources apart and the gate can
//! route a read back; each has its parser beside it. `gate://action/<id>` is the gate's
//! own (an agent's staged action), so no server may be named `action`.

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

/// The scheme and authority prefix of every resource address the gate mints.
pub const RESOURCE_PREFIX: &str = "gate://";

/// The name of the gate's own resources (`gate://action/<id>`), which no server may take.
pub const RESERVED_SERVER: &str = "action";

/// The gate's address of resource `uri` of server `server`: `gate://<server>/<uri>`, the
/// server's address kept verbatim after the first `/`.
pub fn resource_uri(server: &str, uri: &str) -> String {
    format!("{RESOURCE_PREFIX}{server}/{uri}")
}

/// The server and its own address in a gate address made by [`resource_uri`]; `None` for
/// anything else (the gate's own `gate://action/<id>` included).
pub fn resource_of_uri(uri: &str) -> Option<(&str, &str)> {
    let (server, original) = uri.strip_prefix(RESOURCE_PREFIX)?.split_once('/')?;
    if server.is_empty() || server == RESERVED_SERVER || original.is_empty() {
        return None;
    }
    Some((server, original))
}

/// The name agents get a prompt by: `<server>__<prompt>`, as tools are named (prompt
/// names are the server's own, kept verbatim after the separator).
pub fn prompt_name(server: &str, prompt: &str) -> String {
    format!("{server}{SEPARATOR}{prompt}")
}

/// The server and its own name of a prompt named by [`prompt_name`] (server names never
/// hold the separator, so the first one splits them).
pub fn prompt_of_name(name: &str) -> Option<(&str, &str)> {
    let (server, prompt) = name.split_once(SEPARATOR)?;
    (!server.is_empty() && !prompt.is_empty()).then_some((server, prompt))
}

#[cfg(test)]
mod minted {
    use super::*;

    #[test]
    fn resource_addresses_round_trip_and_keep_the_servers_own_verbatim() {
        for original in [
            "file:///home/me/notes/a b.md",
            "fixture://notes/{id}",
            "db://x?q=1#frag",
            "gate://action/3",
        ] {
            let minted = resource_uri("files", original);
            assert_eq!(resource_of_uri(&minted), Some(("files", original)));
        }
        assert_eq!(resource_of_uri("gate://action/3"), None);
        assert_eq!(resource_of_uri("gate://files/"), None);
        assert_eq!(resource_of_uri("gate:///x"), None);
        assert_eq!(resource_of_uri("file:///etc/passwd"), None);
    }

    #[test]
    fn prompt_names_round_trip() {
        let name = prompt_name("notes", "summarize__twice");
        assert_eq!(name, "notes__summarize__twice");
        assert_eq!(prompt_of_name(&name), Some(("notes", "summarize__twice")));
        assert_eq!(prompt_of_name("nosep"), None);
        assert_eq!(prompt_of_name("__x"), None);
    }
}

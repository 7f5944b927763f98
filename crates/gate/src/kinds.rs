//! The person's name for an action kind, and whether an auto-approval rule can cover it:
//! one name (the tool name agents call, `files__write_file`) and one test, with one set of
//! reasons, for `gate rules`, `gate rules add`/`remove`, `gate approve --all-of-kind` and
//! the review screen. The kind's encoded tag is the kernel's key and is never shown.

use gatekeeper_core::{NoRule, ServerTrust, why_no_rule};
use kernel::ActionKind;
use prompt_sanitize::{MAX_INLINE_CHARS, code_span};

use crate::gateway::Gateway;

/// A kind a rule can cover: the tool of a server, with the person's name for it.
#[derive(Debug, Clone)]
pub struct RuleTarget {
    /// The server, as named in the configuration.
    pub server: String,
    /// The tool, as the server names it.
    pub tool: String,
    /// The person's (and the agents') name for it.
    pub name: String,
    /// The kernel's kind.
    pub kind: ActionKind,
}

/// The server and tool `words` name, as the person typed them after `gate rules add` or
/// `remove`: the tool name agents call (`files__write_file`), or the server and its tool
/// (`files write_file`), or the server and the kind's tag an older gate printed.
pub fn named(gateway: &Gateway, words: &[String]) -> Result<(String, String), String> {
    match words {
        [name] => gateway
            .tool_of_name(name)
            .or_else(|| unheld(gateway, name))
            .ok_or_else(|| {
            format!(
                "no tool is named {}; name it as your agents call it (for example `files__write_file`), as `gate rules` lists them, or by its server and its name (`files write_file`)",
                code_span(name, MAX_INLINE_CHARS)
            )
        }),
        [server, tool] => {
            let downstream = gateway.downstream(server).ok_or_else(|| no_server(server))?;
            let catalog = downstream.accepted();
            if catalog.get(tool).is_some() {
                return Ok((server.clone(), tool.clone()));
            }
            catalog
                .tools()
                .iter()
                .find(|t| {
                    downstream
                        .gatekeeper
                        .action_kind(&t.name)
                        .is_some_and(|k| k.tag == *tool)
                })
                .map(|t| (server.clone(), t.name.clone()))
                .ok_or_else(|| no_tool(server, tool))
        }
        _ => Err(
            "name one tool: as your agents call it (`files__write_file`), or its server and its name (`files write_file`)"
                .to_owned(),
        ),
    }
}

/// The server and tool a name of the plain `server__tool` shape stands for, when no agent
/// holds it yet (a rule may be made before a grant).
fn unheld(gateway: &Gateway, name: &str) -> Option<(String, String)> {
    let (server, tool) = name.split_once(crate::names::SEPARATOR)?;
    gateway.downstream(server)?.accepted().get(tool)?;
    Some((server.to_owned(), tool.to_owned()))
}

/// Whether a rule can cover `tool` of `server`; `Err` says the true reason, and what would
/// make it possible where something would.
pub fn rule_target(gateway: &Gateway, server: &str, tool: &str) -> Result<RuleTarget, String> {
    let downstream = gateway
        .downstream(server)
        .ok_or_else(|| no_server(server))?;
    let catalog = downstream.accepted();
    let listed = catalog.get(tool).ok_or_else(|| no_tool(server, tool))?;
    let name = gateway.person_name(server, tool);
    let config = downstream.server.config();
    let person_says_read = config.reads.iter().any(|r| r == tool);
    if let Some(why) = why_no_rule(&listed.tool, config.trust, person_says_read) {
        return Err(refusal(server, &name, why));
    }
    let kind = downstream
        .gatekeeper
        .action_kind(tool)
        .ok_or_else(|| no_tool(server, tool))?;
    Ok(RuleTarget {
        server: server.to_owned(),
        tool: tool.to_owned(),
        name,
        kind,
    })
}

/// What the person is told when no rule can cover `name` of `server`, and why.
fn refusal(server: &str, name: &str, why: NoRule) -> String {
    let name = code_span(name, MAX_INLINE_CHARS);
    let server = code_span(server, MAX_INLINE_CHARS);
    match why {
        NoRule::Read => format!(
            "{name} is a read: it is sent at once and never waits for you, so a rule has nothing to apply"
        ),
        NoRule::NotVetted(ServerTrust::Untrusted) => format!(
            "server {server} is untrusted: nothing it says is believed, so every call of it waits for you; set trust = \"vetted\" in its [[server]] table in gate.toml to let its repeatable tools auto-approve"
        ),
        NoRule::NotVetted(trust) => format!(
            "server {server} is {trust}; set trust = \"vetted\" in its [[server]] table in gate.toml to let its repeatable tools auto-approve"
        ),
        NoRule::NotRepeatable {
            destructive,
            idempotent,
        } => format!(
            "{name} is not marked safe to repeat: its server declares destructiveHint {} and idempotentHint {}, and a rule applies only tools a vetted server declares destructiveHint false and idempotentHint true (a rule may apply the same call again, so it must be harmless to repeat); approve its calls one by one",
            hint(destructive),
            hint(idempotent)
        ),
    }
}

fn hint(value: Option<bool>) -> String {
    value.map_or_else(|| "(not at all)".to_owned(), |v| v.to_string())
}

fn no_server(server: &str) -> String {
    format!(
        "there is no server {} in gate.toml; `gate rules` lists the tools a rule could cover",
        code_span(server, MAX_INLINE_CHARS)
    )
}

fn no_tool(server: &str, tool: &str) -> String {
    format!(
        "server {} has no tool {} in the catalog you accepted; `gate rules` lists the tools a rule could cover",
        code_span(server, MAX_INLINE_CHARS),
        code_span(tool, MAX_INLINE_CHARS)
    )
}

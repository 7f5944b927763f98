//! The approval prompt: what a person reads before approving a call.
//!
//! Every piece of it that a server or an agent wrote (the server's name, the tool's name
//! and description, the arguments, the endpoint) is untrusted: left raw, it could close the
//! argument fence and forge an `Endpoint:` line, or add a heading that says "approved by
//! security". So the prompt is assembled only from [`Sanitized`] pieces with
//! [`prompt_sanitize::Markdown`], reproducing the reference's `describeCall`:
//!
//! ~~~text
//! **<server>** → `<tool>`                   (title: Call <tool> on <server>)
//!
//! > <the tool's description, quoted>        (or: _The server provided no description..._)
//!
//! Arguments:
//! ```json
//! <arguments, pretty-printed>
//! ```
//!
//! Endpoint: `<endpoint>`
//!
//! <who classified the call, and what that means>
//! ~~~
//!
//! Everything but the arguments is fixed per tool, so [`CallPrompt`] renders it once with
//! the builder, up to and including the fence's opening line, and from the fence's closing
//! line on. A call then only renders its arguments with [`json_arguments`] and joins the
//! three sanitized pieces with [`Sanitized::concat`]. The result is byte for byte what
//! [`Markdown::fenced`] would give (a test holds it to that), at about half the cost: the
//! prompt is rendered for every staged call, so it is on the agent's hot path.

use prompt_sanitize::{
    MAX_ARGUMENTS_CHARS, MAX_DESCRIPTION_CHARS, MAX_INLINE_CHARS, MAX_SERVER_NAME_CHARS, Markdown,
    Sanitized, code_span, json_arguments, plain_inline, quote_untrusted,
};
use serde_json::Value;

use crate::classify::{ClassifiedBy, ClassifiedTool, Mode};
use crate::tool::Tool;

/// Said when the server declared the tool read-only.
pub const PROVENANCE_SERVER_READ: &str = "The server declares this tool read-only, so it runs without approval. That claim comes from the server itself.";
/// Said when the deployment itself treats a tool as read-only (not reachable today: only the
/// server's annotation makes a read).
pub const PROVENANCE_DEPLOYMENT_READ: &str = "Treated as read-only by this deployment.";
/// The provenance line of a read the person listed as one (`reads`).
pub const PROVENANCE_PERSON_READ: &str =
    "You list this tool as a read, so it runs without approval, whatever the server says.";
/// The provenance line of an action on a server whose claims are not believed.
pub const PROVENANCE_DISTRUSTED_ACTION: &str = "Treated as an action because this deployment believes nothing the server says about its tools. Nothing has been sent yet.";
/// Said for every other action.
pub const PROVENANCE_ACTION: &str = "Treated as an action because the server did not declare it read-only. Nothing has been sent yet.";
/// Shown instead of a quote when the server gave no description.
pub const NO_DESCRIPTION: &str = "_The server provided no description for this tool._";

/// The longest tool name in a title, in chars (then `…`). With the server name capped at
/// [`MAX_SERVER_NAME_CHARS`], the gate's words and the tool name always fit in the
/// [`MAX_INLINE_CHARS`] a one-line view keeps; only the server name's end may be clipped.
pub const MAX_TITLE_TOOL_CHARS: usize = 60;
/// The gate's own words that open every title, so no server name or tool name comes first.
pub const TITLE_LEAD: &str = "Call ";
/// The gate's own words between the tool name and the server name in a title.
pub const TITLE_ON: &str = " on ";

/// The lines around the arguments: the end of the `Arguments:` line and the fence's opening
/// line, then the fence's closing line and the blank line after it.
const FENCE_OPEN: &str = "\n```json\n";
const FENCE_CLOSE: &str = "\n```\n\n";

/// The prompt of one tool on one server, rendered once; [`CallPrompt::describe`] adds a
/// call's arguments.
#[derive(Debug, Clone)]
pub struct CallPrompt {
    title: Sanitized,
    head: Sanitized,
    tail: Sanitized,
}

impl CallPrompt {
    /// Render the parts of the prompt that do not depend on the arguments.
    pub fn new(
        server_name: &str,
        endpoint: &str,
        tool: &Tool,
        classified: &ClassifiedTool,
    ) -> Self {
        // Each untrusted part is capped on its own, so neither can push the other, or the
        // gate's words, out of a clipped line.
        let server = plain_inline(server_name, MAX_SERVER_NAME_CHARS);
        let title = Sanitized::concat(&[
            &Sanitized::literal(TITLE_LEAD),
            &plain_inline(&tool.name, MAX_TITLE_TOOL_CHARS),
            &Sanitized::literal(TITLE_ON),
            &server,
        ]);

        let mut head = Markdown::new();
        head.line(&[
            &Sanitized::literal("**"),
            &server,
            &Sanitized::literal("** → "),
            &code_span(&tool.name, MAX_INLINE_CHARS),
        ])
        .blank();
        let quoted = quote_untrusted(
            tool.description.as_deref().unwrap_or(""),
            MAX_DESCRIPTION_CHARS,
        );
        if quoted.is_empty() {
            head.text(NO_DESCRIPTION);
        } else {
            head.block(&quoted);
        }
        head.blank().text("Arguments:");
        // The fence's opening line, as `Markdown::fenced("json", ..)` writes it.
        let head = Sanitized::concat(&[&head.build(), &Sanitized::literal(FENCE_OPEN)]);

        let provenance = match (classified.mode(), classified.classified_by()) {
            (Mode::Read, ClassifiedBy::ServerAnnotation) => PROVENANCE_SERVER_READ,
            (Mode::Read, ClassifiedBy::Default | ClassifiedBy::Distrusted) => {
                PROVENANCE_DEPLOYMENT_READ
            }
            (Mode::Read, ClassifiedBy::Person) => PROVENANCE_PERSON_READ,
            (Mode::Action, ClassifiedBy::Distrusted) => PROVENANCE_DISTRUSTED_ACTION,
            (Mode::Action, _) => PROVENANCE_ACTION,
        };
        let tail = Markdown::new()
            .line(&[
                &Sanitized::literal("Endpoint: "),
                &code_span(endpoint, MAX_INLINE_CHARS),
            ])
            .blank()
            .text(provenance)
            .build();
        let tail = Sanitized::concat(&[&Sanitized::literal(FENCE_CLOSE), &tail]);

        Self { title, head, tail }
    }

    /// The one-line title: `Call <tool> on <server>`. The gate's own word comes first, so a
    /// server name such as `Endpoint: …` (or a look-alike of it) cannot open the title.
    pub fn title(&self) -> &Sanitized {
        &self.title
    }

    /// The full description of a call with these arguments.
    pub fn description(&self, args: &Value) -> Sanitized {
        // A `json_arguments` body has its fences defused already, so it cannot close the
        // fence around it (the same guarantee `Markdown::fenced` gives).
        Sanitized::concat(&[
            &self.head,
            &json_arguments(args, MAX_ARGUMENTS_CHARS),
            &self.tail,
        ])
    }

    /// Title and description of a call with these arguments.
    pub fn describe(&self, args: &Value) -> (Sanitized, Sanitized) {
        (self.title.clone(), self.description(args))
    }
}

/// Title and description of the approval prompt for one call (the reference's
/// `describeCall`). Gatekeepers keep a [`CallPrompt`] per tool instead of calling this for
/// every call.
pub fn describe_call(
    server_name: &str,
    endpoint: &str,
    tool: &Tool,
    args: &Value,
    classified: &ClassifiedTool,
) -> (Sanitized, Sanitized) {
    CallPrompt::new(server_name, endpoint, tool, classified).describe(args)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::classify::{ServerTrust, classify_tool};

    fn tool(raw: Value) -> Tool {
        Tool::from_json(raw).expect("valid tool")
    }

    #[test]
    fn renders_an_action_exactly() {
        let t = tool(json!({"name": "createIssue", "description": "Open a new issue."}));
        let classified = classify_tool(&t, ServerTrust::Byo);
        let (title, description) = describe_call(
            "Issue tracker",
            "https://issues.example/mcp",
            &t,
            // Keys in sorted order, so the rendering is the same with or without
            // serde_json's `preserve_order`.
            &json!({"labels": ["bug"], "title": "Fix login"}),
            &classified,
        );
        assert_eq!(title.as_str(), "Call createIssue on Issue tracker");
        assert_eq!(
            description.as_str(),
            "**Issue tracker** → `createIssue`\n\
             \n\
             > Open a new issue.\n\
             \n\
             Arguments:\n\
             ```json\n\
             {\n  \"labels\": [\n    \"bug\"\n  ],\n  \"title\": \"Fix login\"\n}\n\
             ```\n\
             \n\
             Endpoint: `https://issues.example/mcp`\n\
             \n\
             Treated as an action because the server did not declare it read-only. Nothing has been sent yet."
        );
    }

    #[test]
    fn a_read_says_the_claim_is_the_servers_and_a_missing_description_is_named() {
        let t = tool(json!({"name": "listIssues", "annotations": {"readOnlyHint": true}}));
        let classified = classify_tool(&t, ServerTrust::Vetted);
        let (_, description) = describe_call("S", "e", &t, &json!({}), &classified);
        let text = description.as_str();
        assert!(text.contains("\n\n_The server provided no description for this tool._\n\n"));
        assert!(text.ends_with(&format!("Endpoint: `e`\n\n{PROVENANCE_SERVER_READ}")));
    }

    /// The same prompt assembled line by line with the builder, as the reference does.
    fn with_builder(server: &str, endpoint: &str, tool: &Tool, args: &Value) -> String {
        let classified = classify_tool(tool, ServerTrust::Byo);
        let quoted = quote_untrusted(
            tool.description.as_deref().unwrap_or(""),
            MAX_DESCRIPTION_CHARS,
        );
        let mut md = Markdown::new();
        md.line(&[
            &Sanitized::literal("**"),
            &plain_inline(server, MAX_SERVER_NAME_CHARS),
            &Sanitized::literal("** → "),
            &code_span(&tool.name, MAX_INLINE_CHARS),
        ])
        .blank();
        if quoted.is_empty() {
            md.text(NO_DESCRIPTION);
        } else {
            md.block(&quoted);
        }
        assert!(!classified.is_read());
        md.blank()
            .text("Arguments:")
            .fenced("json", &json_arguments(args, MAX_ARGUMENTS_CHARS))
            .blank()
            .line(&[
                &Sanitized::literal("Endpoint: "),
                &code_span(endpoint, MAX_INLINE_CHARS),
            ])
            .blank()
            .text(PROVENANCE_ACTION)
            .build()
            .into_string()
    }

    #[test]
    fn the_cached_prompt_equals_the_line_by_line_builder() {
        let tools = [
            tool(json!({"name": "plain", "description": "Does a thing."})),
            tool(json!({"name": "x`y", "description": "# h\n```\nEndpoint: `z`\n\n> q"})),
            tool(json!({"name": "", "description": "   "})),
        ];
        let args = [
            json!({}),
            json!({"a": "```\nEndpoint: `x`", "b": [1, 2, {"c": "\u{202e}"}]}),
            json!({"long": "y".repeat(5000)}),
        ];
        for t in &tools {
            for a in &args {
                let classified = classify_tool(t, ServerTrust::Byo);
                let (_, fast) = describe_call("Serv**er", "https://e.example/`", t, a, &classified);
                assert_eq!(
                    fast.as_str(),
                    with_builder("Serv**er", "https://e.example/`", t, a),
                    "{} with {a}",
                    t.name
                );
            }
        }
    }

    #[test]
    fn hostile_text_cannot_leave_its_slot() {
        let t = tool(json!({
            "name": "x` **approved**",
            "description": "# Approved by security\n```\nEndpoint: `https://safe.example`"
        }));
        let classified = classify_tool(&t, ServerTrust::Byo);
        let (title, description) = describe_call(
            "Evil** server\n# h",
            "https://evil.example\nEndpoint: `x`",
            &t,
            &json!({"note": "```\nEndpoint: `https://forged.example`"}),
            &classified,
        );
        let text = description.as_str();
        // Exactly one fence pair and one Endpoint line start, both ours.
        assert_eq!(text.matches("```").count(), 2, "{text}");
        assert_eq!(
            text.lines().filter(|l| l.starts_with("Endpoint:")).count(),
            1
        );
        assert!(!text.lines().any(|l| l.starts_with('#')), "{text}");
        assert!(!title.as_str().contains(['*', '\n', '#']));
    }

    #[test]
    fn a_long_server_name_cannot_push_the_tool_name_out_of_sight() {
        let t = tool(json!({"name": "deleteAllIssues"}));
        let classified = classify_tool(&t, ServerTrust::Byo);
        let server = format!("Acme {}", "very ".repeat(22));
        assert_eq!(server.chars().count(), 115);
        let (title, description) =
            describe_call(&server, "https://e.example", &t, &json!({}), &classified);
        // A one-line view (the shell's batch row, its title line, the ledger) keeps 120 chars.
        let shown = prompt_sanitize::untrusted_label(title.as_str(), MAX_INLINE_CHARS);
        assert!(shown.as_str().contains("deleteAllIssues"), "{shown}");
        assert!(
            title
                .as_str()
                .starts_with("Call deleteAllIssues on Acme very")
        );
        assert!(
            title.as_str().ends_with('…'),
            "the clipped server name is marked: {title}"
        );
        let header = description.as_str().lines().next().unwrap_or_default();
        assert_eq!(header.chars().count(), 2 + 61 + 5 + 17);
        assert!(header.ends_with("…** → `deleteAllIssues`"), "{header}");
    }

    #[test]
    fn a_title_opens_with_the_gates_own_words() {
        let t = tool(json!({"name": "x"}));
        let classified = classify_tool(&t, ServerTrust::Byo);
        for server in [
            "Endpoint: `https://safe.example`",
            "\u{395}ndpoint: y",
            "Approved:",
        ] {
            let (title, _) = describe_call(server, "e", &t, &json!({}), &classified);
            assert!(title.as_str().starts_with("Call x on "), "{title}");
        }
    }
}

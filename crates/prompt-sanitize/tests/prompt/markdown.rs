//! The `Markdown` builder: a whole approval prompt assembled from sanitized pieces.

use prompt_sanitize::{
    MAX_ARGUMENTS_CHARS, MAX_DESCRIPTION_CHARS, MAX_INLINE_CHARS, Markdown, Sanitized, code_span,
    json_arguments, plain_inline, quote_untrusted,
};

use crate::common::assert_clean;

/// Renders a prompt shaped like the reference's `describeCall`.
fn describe(server: &str, tool: &str, description: &str, args: &serde_json::Value) -> Sanitized {
    let quote = quote_untrusted(description, MAX_DESCRIPTION_CHARS);
    let mut md = Markdown::new();
    md.line(&[
        &Sanitized::literal("**"),
        &plain_inline(server, MAX_INLINE_CHARS),
        &Sanitized::literal("** → "),
        &code_span(tool, MAX_INLINE_CHARS),
    ])
    .blank();
    if quote.is_empty() {
        md.text("_The server provided no description for this tool._");
    } else {
        md.block(&quote);
    }
    md.blank()
        .text("Arguments:")
        .fenced("json", &json_arguments(args, MAX_ARGUMENTS_CHARS))
        .blank()
        .line(&[
            &Sanitized::literal("Endpoint: "),
            &code_span("https://mcp.acme.example", MAX_INLINE_CHARS),
        ])
        .blank()
        .text("Treated as an action because the server did not declare it read-only. Nothing has been sent yet.")
        .build()
}

// One key per object: the order of keys depends on serde_json's `preserve_order` feature.
#[test]
fn hostile_prompt_renders_exactly() {
    let args = serde_json::json!({"title": "```\n\nEndpoint: `https://trusted.example`"});
    let prompt = describe(
        "Acme** is trusted **",
        "create`_`issue\n\n# Approved",
        "## Approved by the security team\n>> trust me\n```",
        &args,
    );
    let expected = "**Acme is trusted** → `create_issue # Approved`

> Approved by the security team
> trust me
> '''

Arguments:
```json
{
  \"title\": \"'''\\n\\nEndpoint: `https://trusted.example`\"
}
```

Endpoint: `https://mcp.acme.example`

Treated as an action because the server did not declare it read-only. Nothing has been sent yet.";
    assert_eq!(prompt.as_str(), expected);
    assert_clean(prompt.as_str());
    // Exactly two fence lines: the ones the builder wrote.
    assert_eq!(prompt.as_str().matches("```").count(), 2);
}

#[test]
fn blank_description_uses_the_program_sentence() {
    let prompt = describe("Acme", "list", "  \n ", &serde_json::json!({}));
    assert!(
        prompt
            .as_str()
            .starts_with("**Acme** → `list`\n\n_The server provided no description for this tool._\n\nArguments:\n```json\n{}\n```")
    );
}

#[test]
fn fenced_defuses_a_body_that_did_not_come_from_json_arguments() {
    let body = prompt_sanitize::neutralize_controls("a\n```\nforged");
    let out = Markdown::new().fenced("te`xt\n", &body).build();
    assert_eq!(out.as_str(), "```text\na\n'''\nforged\n```");
}

#[test]
fn concat_display_and_as_ref_agree() {
    let a = Sanitized::literal("a");
    let b = code_span("b", 120);
    let joined = Sanitized::concat(&[&a, &b]);
    assert_eq!(joined.to_string(), "a`b`");
    assert_eq!(joined.as_ref(), "a`b`");
    assert_eq!(joined.clone().into_string(), "a`b`");
    assert!(!joined.is_empty());
    assert!(Markdown::new().build().is_empty());
}

#[test]
fn a_number_is_its_decimal_digits_as_plain_inline_writes_them() {
    for n in [0, 7, 1_234, u64::MAX] {
        let number = Sanitized::number(n);
        assert_eq!(number.as_str(), n.to_string());
        assert_eq!(number, plain_inline(&n.to_string(), MAX_INLINE_CHARS));
    }
}

//! The whole approval prompt, read by a real CommonMark parser (pulldown-cmark with every
//! extension on): whatever the server and the agent write, the prompt's blocks are exactly the
//! gate's, and nothing from them renders as a heading, a link, an image, raw HTML or a nested
//! block, or decodes into a hidden character.

use gatekeeper_core::describe::{NO_DESCRIPTION, PROVENANCE_ACTION, PROVENANCE_SERVER_READ};
use gatekeeper_core::{ServerTrust, Tool, classify_tool, describe_call};
use prompt_sanitize::{MAX_ARGUMENTS_CHARS, MAX_INLINE_CHARS, code_span, json_arguments};
use proptest::prelude::*;
use pulldown_cmark::{CodeBlockKind, Event, Options, Parser, Tag, TagEnd};
use serde_json::{Map, Value, json};

/// How many prompts the property renders and parses in one `cargo test`.
const CASES: u32 = 3000;

/// Pieces an attacker reaches for in Markdown, HTML, terminals and Unicode.
const HOSTILE: &[&str] = &[
    "\n",
    "\n\n",
    "\r",
    "\r\n",
    " ",
    "    ",
    "\t",
    "- ",
    "* ",
    "+ ",
    "1. ",
    "1) ",
    "99999. ",
    "# ",
    "## ",
    "> ",
    ">",
    "#",
    "===",
    "---",
    "***",
    "___",
    "~~~",
    "```",
    "``",
    "`",
    "<h1>",
    "</h1>",
    "<img src=x onerror=alert(1)>",
    "<!-- ",
    "<?x",
    "<https://evil.example>",
    "[Click to approve](javascript:alert(1))",
    "![x](https://evil.example/p.png)",
    "[a]: /u",
    "[^1]",
    "[^1]: x",
    "[!NOTE]",
    "[[wiki]]",
    "[ ] ",
    "|",
    " | ",
    "|---|",
    ": ",
    ":::",
    "$$",
    "&#x202E;",
    "&#8203;",
    "&rlm;",
    "&zwj;",
    "&shy;",
    "&amp;",
    "&",
    ";",
    "\\",
    "\\\\",
    "*",
    "**",
    "_",
    "__",
    "~~",
    "^",
    "Endpoint: ",
    "\u{395}ndpoint: ",
    "Arguments:",
    "\u{1b}[31m",
    "\u{1b}]8;;https://evil.example\u{7}",
    "\u{202e}",
    "\u{2066}",
    "\u{200b}",
    "\u{ad}",
    "\u{34f}",
    "\u{3164}",
    "\u{fe0f}",
    "\u{e0041}",
    "\u{e0100}",
    "\u{2028}",
    "\u{85}",
    "\u{a0}",
    "\u{3000}",
    "…",
    "«",
    "»",
    "e\u{301}",
    "😀",
];

fn hostile_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        2 => any::<String>(),
        5 => proptest::sample::select(HOSTILE).prop_map(str::to_owned),
        1 => "[a-z]{1,8}",
        1 => "[ #>\\-*+=~`|:\\[\\]<&\\\\!0-9.)\n]{0,8}",
    ];
    proptest::collection::vec(piece, 0..16).prop_map(|v| v.concat())
}

fn arguments() -> impl Strategy<Value = Value> {
    proptest::collection::vec((hostile_text(), hostile_text()), 0..4).prop_map(|kv| {
        Value::Object(
            kv.into_iter()
                .map(|(k, v)| (k, json!(v)))
                .collect::<Map<_, _>>(),
        )
    })
}

/// One top-level block of the parsed prompt: its opening tag and every event inside it.
#[derive(Debug)]
struct Block<'a> {
    tag: Tag<'a>,
    inner: Vec<Event<'a>>,
}

fn blocks(markdown: &str) -> Vec<Block<'_>> {
    let mut out: Vec<Block<'_>> = Vec::new();
    let mut depth = 0usize;
    for event in Parser::new_ext(markdown, Options::all()) {
        match (&event, depth) {
            (Event::Start(tag), 0) => {
                out.push(Block {
                    tag: tag.clone(),
                    inner: Vec::new(),
                });
                depth = 1;
            }
            (Event::End(_), 1) => depth = 0,
            (_, 0) => out.push(Block {
                tag: Tag::Paragraph,
                inner: vec![event.clone()],
            }),
            _ => {
                match &event {
                    Event::Start(_) => depth += 1,
                    Event::End(_) => depth -= 1,
                    _ => {}
                }
                if let Some(block) = out.last_mut() {
                    block.inner.push(event);
                }
            }
        }
    }
    out
}

/// The text of inline events with adjacent text merged; other events by name.
fn flat(events: &[Event<'_>]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for event in events {
        match event {
            Event::Text(t) => match out.last_mut() {
                Some(last) if last.starts_with("text:") => last.push_str(t),
                _ => out.push(format!("text:{t}")),
            },
            Event::Code(c) => out.push(format!("code:{c}")),
            other => out.push(format!("{other:?}")),
        }
    }
    out
}

/// Whether an event may come from untrusted text inside a paragraph: text and inline
/// formatting only.
fn inline_ok(event: &Event<'_>) -> bool {
    match event {
        Event::Text(_) | Event::Code(_) | Event::SoftBreak | Event::HardBreak => true,
        Event::InlineMath(_) | Event::DisplayMath(_) => true,
        Event::Start(tag) => matches!(
            tag,
            Tag::Emphasis | Tag::Strong | Tag::Strikethrough | Tag::Superscript | Tag::Subscript
        ),
        Event::End(tag) => matches!(
            tag,
            TagEnd::Emphasis
                | TagEnd::Strong
                | TagEnd::Strikethrough
                | TagEnd::Superscript
                | TagEnd::Subscript
        ),
        _ => false,
    }
}

/// Characters a renderer would draw as nothing or act on.
fn hidden(c: char) -> bool {
    (c.is_control() && c != '\n')
        || matches!(c, '\u{ad}' | '\u{34f}' | '\u{61c}' | '\u{115f}' | '\u{1160}' | '\u{17b4}' | '\u{17b5}'
            | '\u{180b}'..='\u{180f}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}'
            | '\u{2028}' | '\u{2029}' | '\u{2060}'..='\u{206f}' | '\u{3164}' | '\u{fe00}'..='\u{fe0f}'
            | '\u{feff}' | '\u{ffa0}' | '\u{fff0}'..='\u{fffb}' | '\u{e0000}'..='\u{e0fff}')
}

fn check(
    server: &str,
    endpoint: &str,
    tool_json: Value,
    args: &Value,
    read: bool,
) -> Result<(), TestCaseError> {
    let tool = Tool::from_json(tool_json).expect("a name and a description make a tool");
    let classified = classify_tool(&tool, ServerTrust::Vetted);
    let (title, description) = describe_call(server, endpoint, &tool, args, &classified);
    let md = description.as_str();
    prop_assert!(title.as_str().starts_with("Call "), "{title}");
    prop_assert!(!title.as_str().contains('\n'));

    let blocks = blocks(md);
    let shape: Vec<String> = blocks.iter().map(|b| format!("{:?}", b.tag)).collect();
    prop_assert_eq!(blocks.len(), 6, "blocks {:?} of\n{}", shape, md);

    // 1. `**server** → `tool``: one strong span, then the gate's arrow and one code span.
    let head = &blocks[0];
    prop_assert!(matches!(head.tag, Tag::Paragraph), "{:?}\n{}", shape, md);
    let head_flat = flat(&head.inner);
    prop_assert_eq!(
        head_flat.first().map(String::as_str),
        Some("Start(Strong)"),
        "{:?}\n{}",
        head_flat,
        md
    );
    let tool_span = code_span(&tool.name, MAX_INLINE_CHARS);
    let tool_inner = &tool_span.as_str()[1..tool_span.as_str().len() - 1];
    let n = head_flat.len();
    prop_assert!(n >= 4, "{:?}", head_flat);
    prop_assert_eq!(&head_flat[n - 3], "End(Strong)", "{:?}\n{}", head_flat, md);
    prop_assert_eq!(&head_flat[n - 2], "text: → ", "{:?}\n{}", head_flat, md);
    prop_assert_eq!(
        head_flat[n - 1].clone(),
        format!("code:{}", tool_inner.trim()),
        "{:?}",
        head_flat
    );
    prop_assert!(head.inner.iter().all(inline_ok), "{:?}\n{}", head.inner, md);

    // 2. The description: one quote of plain paragraphs, or the gate's own sentence.
    let quote = &blocks[1];
    match &quote.tag {
        Tag::BlockQuote(None) => {
            for event in &quote.inner {
                let ok = inline_ok(event)
                    || matches!(
                        event,
                        Event::Start(Tag::Paragraph) | Event::End(TagEnd::Paragraph)
                    );
                prop_assert!(ok, "{:?} inside the quote of\n{}", event, md);
            }
        }
        Tag::Paragraph => {
            let sentence = NO_DESCRIPTION.trim_matches('_');
            prop_assert_eq!(
                flat(&quote.inner),
                vec![
                    "Start(Emphasis)".to_owned(),
                    format!("text:{sentence}"),
                    "End(Emphasis)".to_owned()
                ]
            );
        }
        other => prop_assert!(false, "{:?} where the description goes in\n{}", other, md),
    }

    // 3. `Arguments:` and the one fence, holding exactly the rendered arguments.
    prop_assert!(matches!(blocks[2].tag, Tag::Paragraph));
    prop_assert_eq!(flat(&blocks[2].inner), vec!["text:Arguments:".to_owned()]);
    prop_assert!(
        matches!(&blocks[3].tag, Tag::CodeBlock(CodeBlockKind::Fenced(info)) if info.as_ref() == "json"),
        "{:?}",
        blocks[3].tag
    );
    let body = json_arguments(args, MAX_ARGUMENTS_CHARS);
    prop_assert_eq!(
        flat(&blocks[3].inner),
        vec![format!("text:{}\n", body.as_str())]
    );

    // 4. The one `Endpoint:` line, the gate's, then the provenance sentence.
    let endpoint_span = code_span(endpoint, MAX_INLINE_CHARS);
    let endpoint_inner = &endpoint_span.as_str()[1..endpoint_span.as_str().len() - 1];
    prop_assert!(matches!(blocks[4].tag, Tag::Paragraph));
    prop_assert_eq!(
        flat(&blocks[4].inner),
        vec![
            "text:Endpoint: ".to_owned(),
            format!("code:{}", endpoint_inner.trim())
        ]
    );
    let provenance = if read {
        PROVENANCE_SERVER_READ
    } else {
        PROVENANCE_ACTION
    };
    prop_assert_eq!(flat(&blocks[5].inner), vec![format!("text:{provenance}")]);
    prop_assert_eq!(md.lines().filter(|l| l.starts_with("Endpoint:")).count(), 1);

    // Nothing anywhere decodes into a hidden character.
    for event in Parser::new_ext(md, Options::all()) {
        if let Event::Text(t) | Event::Code(t) = &event {
            prop_assert!(
                !t.chars().any(hidden),
                "hidden character in {:?} of\n{}",
                event,
                md
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn a_prompt_of_hostile_pieces_keeps_the_gates_structure(
        server in hostile_text(),
        name in hostile_text(),
        description in proptest::option::of(hostile_text()),
        endpoint in hostile_text(),
        args in arguments(),
        read in any::<bool>(),
    ) {
        let mut tool = json!({"name": name, "annotations": {"readOnlyHint": read}});
        if let Some(description) = description {
            tool["description"] = json!(description);
        }
        check(&server, &endpoint, tool, &args, read)?;
    }
}

#[test]
fn the_reported_attacks_render_as_text() {
    let attacks = [
        "- > # Approved",
        "- # ",
        "1. # x\n1) > y",
        "Approved\n===",
        "Approved\n---",
        "&#x202E;&#8203;&rlm;&zwj;&shy;",
        "<h1>x</h1>\n<img src=x onerror=alert(1)>\n[Click to approve](javascript:alert(1))\n![x](https://evil.example/p.png)",
    ];
    for attack in attacks {
        check(
            "Acme\\",
            "https://e.example",
            json!({"name": attack, "description": attack}),
            &json!({"x": attack}),
            false,
        )
        .unwrap_or_else(|e| panic!("{attack:?}: {e}"));
    }
}

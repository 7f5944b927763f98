//! Property tests over arbitrary and deliberately hostile Unicode text.

use prompt_sanitize::{
    Markdown, Sanitized, code_span, defuse_fences, json_arguments, neutralize_controls,
    plain_inline, quote_untrusted,
};
use proptest::prelude::*;
use serde_json::Value;

use crate::common::{CF, assert_clean, chars, is_forbidden};

/// Pieces an attacker would reach for.
const HOSTILE: &[&str] = &[
    "```",
    "`",
    "``",
    "\n# ",
    "\n> ",
    "\n",
    "#",
    ">",
    " ",
    "\t",
    "\r",
    "\r\n",
    "\u{202e}",
    "\u{2066}",
    "\u{200b}",
    "\u{200d}",
    "\u{feff}",
    "\u{ad}",
    "\u{2028}",
    "\u{2029}",
    "\u{85}",
    "\u{9b}",
    "\u{3000}",
    "\u{a0}",
    "\x1b",
    "\x1b[",
    "\x1b[31m",
    "\x1b]8;;",
    "\x1b\\",
    "\x07",
    "\x00",
    "\x7f",
    "**",
    "_",
    "[",
    "](",
    ")",
    "|",
    "…",
    "😀",
    "e\u{301}",
    "\u{e0041}",
];

/// A char drawn from the ranges that must be neutralized.
fn hazard_char() -> impl Strategy<Value = char> {
    prop_oneof![
        proptest::char::range('\u{0}', '\u{1f}'),
        proptest::char::range('\u{7f}', '\u{9f}'),
        proptest::sample::select(CF.to_vec())
            .prop_flat_map(|(lo, hi)| proptest::char::range(lo, hi)),
        Just('\u{2028}'),
        Just('\u{2029}'),
    ]
}

/// Strings that mix arbitrary Unicode with hostile pieces.
fn hostile_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        3 => any::<String>(),
        3 => proptest::sample::select(HOSTILE).prop_map(str::to_owned),
        2 => hazard_char().prop_map(String::from),
        1 => "[ #>\t\n]{0,6}",
    ];
    prop_oneof![
        1 => any::<String>(),
        4 => proptest::collection::vec(piece, 0..24).prop_map(|v| v.concat()),
    ]
}

/// Arbitrary JSON whose strings and keys are hostile text.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        hostile_text().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec((hostile_text(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn quote_lines_are_quoted_and_structure_free(text in hostile_text(), max in 0usize..700) {
        let out = quote_untrusted(&text, max);
        let out = out.as_str();
        assert_clean(out);
        prop_assert!(!out.contains("```"), "fence in {out:?}");
        if out.is_empty() {
            return Ok(());
        }
        let mut lines = 0;
        for line in out.split('\n') {
            lines += 1;
            let rest = line.strip_prefix("> ");
            prop_assert!(rest.is_some(), "unquoted line {line:?}");
            let rest = rest.unwrap_or_default().trim_start();
            prop_assert!(!rest.starts_with(['#', '>']), "marker in line {line:?}");
        }
        prop_assert!(chars(out) <= max + 1 + 2 * lines, "{} chars, max {max}, {lines} lines", chars(out));
    }

    #[test]
    fn blank_quote_is_empty_and_only_then(text in hostile_text()) {
        let out = quote_untrusted(&text, 600);
        let has_content = neutralize_controls(&text)
            .as_str()
            .split('\n')
            .any(|l| l.chars().any(|c| !(c.is_whitespace() || c == '#' || c == '>')));
        prop_assert_eq!(out.is_empty(), !has_content);
    }

    #[test]
    fn json_arguments_stay_inside_their_fence(value in json_value(), max in 0usize..5000) {
        let out = json_arguments(&value, max);
        let out = out.as_str();
        assert_clean(out);
        prop_assert!(!out.contains("```"), "fence in {out:?}");
        prop_assert!(chars(out) <= max + "\n... (truncated)".chars().count());
    }

    #[test]
    fn code_span_is_one_bounded_span(text in hostile_text(), max in 0usize..200) {
        let out = code_span(&text, max);
        let out = out.as_str();
        assert_clean(out);
        prop_assert!(!out.contains('\n'));
        prop_assert!(chars(out) <= max.max(8) + 1 + 2);
        let inner = out.strip_prefix('`').and_then(|s| s.strip_suffix('`'));
        prop_assert!(inner.is_some_and(|s| !s.contains('`') && !s.is_empty()), "{out:?}");
    }

    #[test]
    fn plain_inline_is_one_bounded_markup_free_line(text in hostile_text(), max in 0usize..200) {
        let out = plain_inline(&text, max);
        let out = out.as_str();
        assert_clean(out);
        prop_assert!(!out.contains('\n'));
        // The only backslashes are the ones that keep a character reference from decoding.
        let unescaped = out.replace("\\&", "&");
        prop_assert!(chars(&unescaped) <= max.max(8) + 1);
        let markup = ['`', '*', '[', ']', '(', ')', '#', '>', '|', '\\', '<', '$'];
        prop_assert!(out == "(unnamed)" || !unescaped.contains(markup), "{out:?}");
        // An underscore, or a run of them (`files__read`), stays only inside a word, where it
        // cannot open or close emphasis.
        let kept: Vec<char> = unescaped.chars().collect();
        let word = |j: Option<usize>| j.and_then(|j| kept.get(j)).is_some_and(|c| c.is_alphanumeric());
        for (i, c) in kept.iter().enumerate() {
            if *c == '_' {
                let start = kept[..i].iter().rposition(|&c| c != '_').map_or(0, |p| p + 1);
                let end = kept[i..].iter().position(|&c| c != '_').map_or(kept.len(), |n| i + n);
                prop_assert!(word(start.checked_sub(1)) && word(Some(end)), "{out:?}");
            }
        }
        prop_assert_eq!(out.trim(), out);
    }

    #[test]
    fn neutralize_is_clean_and_idempotent(text in hostile_text()) {
        let once = neutralize_controls(&text);
        assert_clean(once.as_str());
        prop_assert!(!once.as_str().contains('\r'));
        prop_assert!(!once.as_str().contains('\t'));
        let twice = neutralize_controls(once.as_str());
        prop_assert_eq!(twice, once);
    }

    #[test]
    fn neutralize_keeps_harmless_text(text in any::<String>()) {
        prop_assume!(!text.chars().any(|c| is_forbidden(c) || c == '\t'));
        let out = neutralize_controls(&text);
        prop_assert_eq!(out.as_str(), text.as_str());
    }

    #[test]
    fn defuse_leaves_no_fence_and_only_touches_backticks(text in hostile_text()) {
        let out = defuse_fences(&text);
        prop_assert!(!out.contains("```"));
        let strip = |s: &str| s.chars().filter(|&c| c != '`' && c != '\'').collect::<String>();
        prop_assert_eq!(strip(&out), strip(&text));
    }

    #[test]
    fn assembled_prompt_is_clean(a in hostile_text(), b in hostile_text(), v in json_value()) {
        let prompt = Markdown::new()
            .line(&[&plain_inline(&a, 120), &Sanitized::literal(" → "), &code_span(&b, 120)])
            .block(&quote_untrusted(&a, 600))
            .fenced("json", &json_arguments(&v, 4000))
            .build();
        assert_clean(prompt.as_str());
        prop_assert_eq!(prompt.as_str().matches("```").count(), 2);
    }
}

//! The Markdown layer: renders untrusted text as a block quote, a code span, plain inline text or
//! a fenced JSON body, so that it cannot take over the structure of the prompt around it.
//!
//! Every function here runs the terminal-safety layer first, then applies its Markdown rule. It
//! does not parse Markdown; it removes the few characters that would let text leave its slot.

use crate::Sanitized;
use crate::controls::neutralize;

/// The longest tool description shown in an approval prompt, in chars (then `…`).
pub const MAX_DESCRIPTION_CHARS: usize = 600;
/// The longest pretty-printed arguments shown in an approval prompt, in chars (then a
/// truncation note).
pub const MAX_ARGUMENTS_CHARS: usize = 4000;
/// The longest inline text (a server name, tool name, endpoint or title) shown, in chars (then
/// `…`).
pub const MAX_INLINE_CHARS: usize = 120;

/// What an empty inline name renders as.
const UNNAMED: &str = "(unnamed)";
/// What follows arguments cut at their limit.
const TRUNCATED: &str = "\n... (truncated)";
/// What follows any other text cut at its limit.
const ELLIPSIS: char = '…';
/// The characters `plain_inline` deletes, because each can open Markdown structure inline.
const INLINE_MARKUP: &[char] = &['`', '*', '_', '[', ']', '(', ')', '#', '>', '|'];

/// Returns the byte index after the first `max_chars` chars, or `None` if `text` is not longer.
fn cut_point(text: &str, max_chars: usize) -> Option<usize> {
    // A text of at most `max_chars` bytes has at most that many chars: nothing to cut.
    if text.len() <= max_chars {
        return None;
    }
    text.char_indices().nth(max_chars).map(|(i, _)| i)
}

/// Keeps the first `max_chars` chars and appends `suffix` if `text` is longer than that.
fn clip(mut text: String, max_chars: usize, suffix: &str) -> String {
    if let Some(i) = cut_point(&text, max_chars) {
        text.truncate(i);
        text.push_str(suffix);
    }
    text
}

/// Replaces every run of three or more backticks with `'''` (three apostrophes).
///
/// A run of three backticks is what opens or closes a fenced code block, so text passed through
/// this cannot close the fence it is shown in, nor open one of its own. Shorter runs are kept.
pub fn defuse_fences(text: &str) -> String {
    if !text.contains("```") {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut run = 0usize;
    let flush = |out: &mut String, run: usize| {
        if run >= 3 {
            out.push_str("'''");
        } else {
            out.extend(std::iter::repeat_n('`', run));
        }
    };
    for c in text.chars() {
        if c == '`' {
            run += 1;
        } else {
            flush(&mut out, run);
            run = 0;
            out.push(c);
        }
    }
    flush(&mut out, run);
    out
}

/// Whether `c` is part of a line's leading block markers: `#`, `>` or whitespace other than `\n`.
fn is_line_marker(c: char) -> bool {
    c == '#' || c == '>' || (c.is_whitespace() && c != '\n')
}

/// Removes a line's leading run of `#`, `>` and whitespace, if that run holds a `#` or `>`.
///
/// A line that is only indented keeps its indentation.
fn strip_block_markers(line: &str) -> &str {
    let rest = line.trim_start_matches(is_line_marker);
    let removed = &line[..line.len() - rest.len()];
    if removed.contains(['#', '>']) {
        rest
    } else {
        line
    }
}

/// Renders untrusted multi-line text (a tool's description) as a Markdown block quote.
///
/// Steps, in order:
/// 1. controls are neutralized ([`neutralize_controls`](crate::neutralize_controls));
/// 2. fences are defused ([`defuse_fences`]);
/// 3. at every line start, a run of whitespace, `#` and `>` in any mix is removed if it holds at
///    least one `#` or `>` (so `# > # x` becomes `x`, where the reference left `> # x`);
/// 4. the whole text is trimmed;
/// 5. if it is longer than `max_chars` chars, the first `max_chars` are kept and `…` appended;
/// 6. every line is prefixed with `> ` (an empty line becomes `> `).
///
/// So no line can become a heading or a nested quote, no fence can open or close, and the output
/// has at most `max_chars + 1 + 2 * lines` chars. Other inline Markdown (emphasis, links, lists)
/// still renders, but only inside the quote.
///
/// Text that is empty after steps 1–4 (blank text, or only markers such as `###`) gives an
/// empty [`Sanitized`] instead of a lone `> `: callers check [`Sanitized::is_empty`] and show
/// their own "no description" sentence.
pub fn quote_untrusted(text: &str, max_chars: usize) -> Sanitized {
    let text = defuse_fences(&neutralize(text));
    let stripped: Vec<&str> = text.split('\n').map(strip_block_markers).collect();
    let joined = stripped.join("\n");
    let trimmed = joined.trim();
    if trimmed.is_empty() {
        return Sanitized(String::new());
    }
    let clipped = clip(trimmed.to_owned(), max_chars, &ELLIPSIS.to_string());
    let mut out = String::with_capacity(clipped.len() + 16);
    for (n, line) in clipped.split('\n').enumerate() {
        if n > 0 {
            out.push('\n');
        }
        out.push_str("> ");
        out.push_str(line);
    }
    Sanitized(out)
}

/// Shared steps of the inline renderers: neutralize, delete `remove`, collapse whitespace
/// (newlines included) to one space, trim, clip with `…`, and turn empty into `(unnamed)`.
fn inline(text: &str, max_chars: usize, remove: &[char]) -> String {
    let neutral = neutralize(text);
    let kept: String = neutral.chars().filter(|c| !remove.contains(c)).collect();
    let collapsed = kept.split_whitespace().collect::<Vec<_>>().join(" ");
    if collapsed.is_empty() {
        return UNNAMED.to_owned();
    }
    clip(collapsed, max_chars, &ELLIPSIS.to_string())
}

/// Renders a name as a Markdown code span: `` `name` ``.
///
/// Controls are neutralized, backticks removed, whitespace (newlines included) collapsed to one
/// space and the result trimmed; if longer than `max_chars` chars it keeps the first `max_chars`
/// and appends `…`; empty becomes `(unnamed)`. The output is one line, and other Markdown such
/// as `**` is harmless inside the span. It has at most `max(max_chars + 1, 9) + 2` chars.
pub fn code_span(text: &str, max_chars: usize) -> Sanitized {
    let inner = inline(text, max_chars, &['`']);
    Sanitized(format!("`{inner}`"))
}

/// Renders a name as plain inline text, with nothing that could open Markdown structure.
///
/// Controls are neutralized, every one of `` ` * _ [ ] ( ) # > | `` removed, whitespace
/// (newlines included) collapsed to one space and the result trimmed; if longer than
/// `max_chars` chars it keeps the first `max_chars` and appends `…`; empty becomes `(unnamed)`.
/// The output is one line of at most `max(max_chars + 1, 9)` chars.
///
/// Like the reference, this keeps `<`, `~` and `\`; a renderer that turns HTML on must not be
/// given this text outside a code span.
pub fn plain_inline(text: &str, max_chars: usize) -> Sanitized {
    Sanitized(inline(text, max_chars, INLINE_MARKUP))
}

/// Renders the agent's arguments as the body of a ```` ```json ```` fence.
///
/// The value is pretty-printed (`serde_json::to_string_pretty`, two-space indent), its controls
/// neutralized (JSON escapes C0 controls but not bidi or format characters) and its fences
/// defused, so it cannot close the fence around it. If longer than `max_chars` chars it keeps
/// the first `max_chars` and appends `\n... (truncated)`. The fence lines themselves are added
/// by the caller, usually with [`Markdown::fenced`](crate::Markdown::fenced).
pub fn json_arguments(value: &serde_json::Value, max_chars: usize) -> Sanitized {
    let pretty = serde_json::to_string_pretty(value)
        .unwrap_or_else(|_| "(arguments could not be displayed)".to_owned());
    let safe = defuse_fences(&neutralize(&pretty));
    Sanitized(clip(safe, max_chars, TRUNCATED))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defuse_keeps_short_runs_and_replaces_long_ones() {
        assert_eq!(defuse_fences("a`b``c```d````e"), "a`b``c'''d'''e");
        assert_eq!(defuse_fences("``"), "``");
        assert_eq!(defuse_fences("`````"), "'''");
        assert_eq!(defuse_fences(""), "");
    }

    #[test]
    fn strip_keeps_plain_indentation() {
        assert_eq!(strip_block_markers("    code"), "    code");
        assert_eq!(strip_block_markers("  # > # x"), "x");
        assert_eq!(strip_block_markers("x # y"), "x # y");
        assert_eq!(strip_block_markers("\u{3000}# x"), "x");
    }

    #[test]
    fn clip_counts_chars_not_bytes() {
        assert_eq!(clip("ééé".to_owned(), 2, "…"), "éé…");
        assert_eq!(clip("éé".to_owned(), 2, "…"), "éé");
        assert_eq!(clip("é".to_owned(), 0, "…"), "…");
    }
}

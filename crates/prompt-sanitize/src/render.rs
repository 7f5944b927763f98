//! The Markdown layer: renders untrusted text as a block quote, a code span, plain inline text or
//! a fenced JSON body, so that it cannot take over the structure of the prompt around it.
//!
//! Every function here runs the terminal-safety layer first, then applies its Markdown rule. It
//! does not parse Markdown; it removes the few characters that would let text leave its slot.

use crate::Sanitized;
use crate::controls::{BLOCK_BYTES, neutralize, neutralize_owned, push_visible};

/// The longest tool description shown in an approval prompt, in chars (then `…`).
pub const MAX_DESCRIPTION_CHARS: usize = 600;
/// The longest pretty-printed arguments shown in an approval prompt, in chars (then a
/// truncation note).
pub const MAX_ARGUMENTS_CHARS: usize = 4000;
/// The longest inline text (a server name, tool name, endpoint or title) shown, in chars (then
/// `…`).
pub const MAX_INLINE_CHARS: usize = 120;
/// The longest server name shown, in chars (then `…`), as the reference caps a server's display
/// name. Capped on its own, so a long server name cannot push the tool name out of a line that
/// is clipped at [`MAX_INLINE_CHARS`].
pub const MAX_SERVER_NAME_CHARS: usize = 60;

/// What an empty inline name renders as.
const UNNAMED: &str = "(unnamed)";
/// What follows arguments cut at their limit.
const TRUNCATED: &str = "\n... (truncated)";
/// What follows any other text cut at its limit.
const ELLIPSIS: char = '…';
/// [`ELLIPSIS`] as text.
const ELLIPSIS_TEXT: &str = "…";
/// An `_` left just before the ellipsis by clipping.
const WORD_EDGE_UNDERSCORE: &str = "_…";
/// The characters `plain_inline` deletes, because each can open Markdown structure inline: the
/// reference's set, plus `\` (which would escape the program's own `**` after a name), `<`
/// (which would open raw HTML or an autolink) and `$` (which opens math on renderers that
/// have it, and would swallow the program's text up to the next `$`).
const INLINE_MARKUP: &[char] = &[
    '`', '*', '_', '[', ']', '(', ')', '#', '>', '|', '\\', '<', '$',
];
/// The characters that open a container block, a thematic break, a setext underline, a tilde
/// fence or a definition when they start a line; `quote_untrusted` escapes one found there.
const LINE_START_MARKUP: &[char] = &['-', '+', '*', '_', '=', '~', ':'];
/// The characters `quote_untrusted` escapes wherever they are: `<` opens raw HTML and
/// autolinks, `[` opens links, images, reference definitions and footnotes, `|` delimits
/// table cells.
const INLINE_OPENERS: &[char] = &['<', '[', '|'];

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
    if !has_fence_run(text) {
        return text.to_owned();
    }
    defuse_runs(text)
}

/// [`defuse_fences`], keeping `text` itself when it has no run to replace.
fn defuse_fences_owned(text: String) -> String {
    if has_fence_run(&text) {
        defuse_runs(&text)
    } else {
        text
    }
}

/// Whether `text` holds a run of three backticks: `text.contains("```")`, by scanning its
/// bytes instead of a substring search, which costs more to set up than a short text
/// costs to scan.
fn has_fence_run(text: &str) -> bool {
    let bytes = text.as_bytes();
    // Most text has no backtick at all, which a scan a block at a time (see
    // `nothing_to_neutralize`) says at less cost than counting runs byte by byte.
    let any_backtick = bytes
        .chunks(BLOCK_BYTES)
        .any(|block| block.iter().fold(false, |found, &b| found | (b == b'`')));
    if !any_backtick {
        return false;
    }
    let mut run = 0;
    for &b in bytes {
        if b == b'`' {
            run += 1;
            if run == 3 {
                return true;
            }
        } else {
            run = 0;
        }
    }
    false
}

/// The replacement behind [`defuse_fences`], for text that has a run of three.
fn defuse_runs(text: &str) -> String {
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

/// Whether `rest` (the text right after a `&`) completes a character reference: `#` and 1–7
/// decimal digits, `#x` and 1–6 hex digits, or an ASCII letter and up to 31 more letters and
/// digits, then `;`. CommonMark decodes exactly these (for known names) into characters.
fn starts_char_reference(rest: &str) -> bool {
    let b = rest.as_bytes();
    let (digits, max, from): (fn(&u8) -> bool, usize, usize) = match b {
        [b'#', b'x' | b'X', ..] => (u8::is_ascii_hexdigit, 6, 2),
        [b'#', ..] => (u8::is_ascii_digit, 7, 1),
        [first, ..] if first.is_ascii_alphabetic() => (u8::is_ascii_alphanumeric, 32, 0),
        _ => return false,
    };
    let run = b[from..].iter().take_while(|c| digits(c)).count();
    (1..=max).contains(&run) && b.get(from + run) == Some(&b';')
}

/// Appends `text` with every character that could make Markdown leave plain text escaped by
/// a backslash: `<`, `[`, `|`, a `&` that starts a character reference, a `\` that would
/// escape the next character, and the character at byte `escape_at` (a line-start marker).
///
/// CommonMark shows a backslash-escaped ASCII punctuation character as itself, so the text
/// renders as written and no renderer setting (raw HTML on, links on) can make it markup.
fn push_inert(out: &mut String, text: &str, escape_at: Option<usize>) {
    for (i, c) in text.char_indices() {
        let rest = &text[i + c.len_utf8()..];
        let escape = Some(i) == escape_at
            || INLINE_OPENERS.contains(&c)
            || (c == '&' && starts_char_reference(rest))
            || (c == '\\' && rest.starts_with(|n: char| n.is_ascii_punctuation()));
        if escape {
            out.push('\\');
        }
        out.push(c);
    }
}

/// Makes one line of a description plain paragraph text (see [`quote_untrusted`], step 3).
fn inert_line(line: &str) -> String {
    let line = strip_block_markers(line);
    // Any leading whitespace, not only the spaces CommonMark counts: the whole text is trimmed
    // later, and a trimmed no-break space must not uncover a marker that was not escaped.
    let rest = line.trim_start();
    let indent = line[..line.len() - rest.len()].chars().count();
    let mut out = String::with_capacity(line.len() + 4);
    // Four spaces would start an indented code block.
    out.push_str(&" ".repeat(indent.min(3)));
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let escape_at = if rest.starts_with(LINE_START_MARKUP) {
        Some(0)
    } else if (1..=9).contains(&digits)
        && matches!(rest.as_bytes().get(digits), Some(b'.' | b')'))
        && matches!(rest.as_bytes().get(digits + 1), None | Some(b' '))
    {
        // An ordered-list marker (`1.`, `12)`): escape its `.` or `)`.
        Some(digits)
    } else {
        None
    };
    push_inert(&mut out, rest, escape_at);
    out
}

/// Renders untrusted multi-line text (a tool's description) as a Markdown block quote of plain
/// paragraphs.
///
/// Steps, in order:
/// 1. controls and hidden characters are neutralized
///    ([`neutralize_controls`](crate::neutralize_controls));
/// 2. fences are defused ([`defuse_fences`]);
/// 3. every line is made paragraph text:
///    - a leading run of whitespace, `#` and `>` in any mix is removed if it holds at least one
///      `#` or `>` (so `# > # x` becomes `x`, where the reference left `> # x`);
///    - leading whitespace becomes at most three spaces (four would start a code block);
///    - a first character that could start a list, a thematic break, a setext underline, a
///      tilde fence or a definition (`- + * _ = ~ :`) is escaped with a backslash, as is the
///      `.` or `)` of an ordered-list marker (`1.`, `1)`);
///    - everywhere, `<`, `[` and `|` are escaped, and so is a `&` that starts a character
///      reference (`&#x202E;`, `&rlm;`) and a `\` that would escape the character after it;
/// 4. the whole text is trimmed;
/// 5. if it is longer than `max_chars` chars, the first `max_chars` are kept and `…` appended;
/// 6. every line is prefixed with `> ` (an empty line becomes `> `).
///
/// So, read by a CommonMark renderer, the output is one block quote holding only paragraphs:
/// no line of it can become a heading (ATX or setext), a nested quote, a list, a code block, a
/// fence, a thematic break, a table or an HTML block, and no text in it can become a link, an
/// image, raw HTML, an autolink or a decoded character reference. The escapes show as `\` to
/// a person reading the Markdown source; they are the price of text that stays text on every
/// renderer. Emphasis and code spans still render, but only inside their paragraph. The output
/// has at most `max_chars + 1 + 2 * lines` chars.
///
/// Text that is empty after steps 1–4 (blank text, or only markers such as `###`) gives an
/// empty [`Sanitized`] instead of a lone `> `: callers check [`Sanitized::is_empty`] and show
/// their own "no description" sentence.
pub fn quote_untrusted(text: &str, max_chars: usize) -> Sanitized {
    let text = defuse_fences(&neutralize(text));
    let lines: Vec<String> = text.split('\n').map(inert_line).collect();
    let joined = lines.join("\n");
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
    if inline_keeps(text, max_chars, remove) {
        return text.to_owned();
    }
    inline_pass(text, max_chars, remove)
}

/// Whether [`inline`] would return `text` as it is: not empty, no longer than `max_chars`,
/// printable ASCII only, none of `remove`, and spaces only single and between words. Most
/// names and titles are, and one look at each byte costs a fraction of the whole pass
/// (about 150 instructions for a title of twenty characters, against about 1,100: a wiki
/// read sanitizes its page's title for the ledger line on every read).
fn inline_keeps(text: &str, max_chars: usize, remove: &[char]) -> bool {
    let bytes = text.as_bytes();
    let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) else {
        return false;
    };
    if bytes.len() > max_chars || first == b' ' || last == b' ' {
        return false;
    }
    // The ASCII characters of `remove` as bits; any other one cannot match an ASCII byte.
    let removed = remove
        .iter()
        .filter(|c| c.is_ascii())
        .fold(0u128, |bits, &c| bits | (1 << u32::from(c)));
    let mut after_space = false;
    bytes.iter().all(|&b| {
        let space = b == b' ';
        let keep = (0x20..0x7f).contains(&b) && (removed >> b) & 1 == 0 && !(space && after_space);
        after_space = space;
        keep
    })
}

/// [`inline`]'s whole pass: neutralize, delete, collapse, clip.
fn inline_pass(text: &str, max_chars: usize, remove: &[char]) -> String {
    let neutral = neutralize(text);
    // One pass: delete `remove` (a run of `_` between two letters or digits stays, as in
    // `files__read_text_file`: CommonMark never opens or closes emphasis there), and
    // collapse whitespace to one space, trimmed.
    let chars: Vec<char> = neutral.chars().collect();
    // Which `_` stand in a run with a letter or digit on both sides.
    let mut intraword = vec![false; chars.len()];
    let mut start = 0;
    while start < chars.len() {
        if chars[start] != '_' {
            start += 1;
            continue;
        }
        let end = chars[start..]
            .iter()
            .position(|&c| c != '_')
            .map_or(chars.len(), |n| start + n);
        let alnum = |c: Option<&char>| c.is_some_and(|c| c.is_alphanumeric());
        if alnum(start.checked_sub(1).and_then(|b| chars.get(b))) && alnum(chars.get(end)) {
            intraword[start..end].fill(true);
        }
        start = end;
    }
    let mut collapsed = String::with_capacity(neutral.len());
    let mut space = false;
    for (i, &c) in chars.iter().enumerate() {
        let inside_word = intraword[i];
        if remove.contains(&c) && !inside_word {
            continue;
        }
        if c.is_whitespace() {
            space = !collapsed.is_empty();
            continue;
        }
        if space {
            collapsed.push(' ');
            space = false;
        }
        collapsed.push(c);
    }
    if collapsed.is_empty() {
        return UNNAMED.to_owned();
    }
    let mut clipped = clip(collapsed, max_chars, ELLIPSIS_TEXT);
    // Clipping can leave a kept run of `_` just before the ellipsis, at a word's edge, where
    // it could close emphasis; drop the whole run (`files__read` clipped after `files__`).
    while clipped.ends_with(WORD_EDGE_UNDERSCORE) {
        let at = clipped.len() - WORD_EDGE_UNDERSCORE.len();
        clipped.remove(at);
    }
    clipped
}

/// `text` with a backslash before every `&` that starts a character reference.
fn escape_char_references(text: String) -> String {
    if !text.contains('&') {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 4);
    for (i, c) in text.char_indices() {
        if c == '&' && starts_char_reference(&text[i + 1..]) {
            out.push('\\');
        }
        out.push(c);
    }
    out
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
/// Controls and hidden characters are neutralized, every one of `` ` * _ [ ] ( ) # > | \ < $ ``
/// removed (except an `_` between two letters or digits, as in `write_file`, which opens no
/// emphasis in CommonMark), whitespace (newlines included) collapsed to one space and the result trimmed; if
/// longer than `max_chars` chars it keeps the first `max_chars` and appends `…`; empty becomes
/// `(unnamed)`. Last, a `&` that starts a character reference (`&rlm;`) gets a backslash, so
/// no renderer decodes it. The output is one line of at most `max(max_chars + 1, 9)` chars
/// before those backslashes.
///
/// So the text opens no emphasis, link, image, raw HTML, autolink or code span, and cannot
/// escape the program's own markup around it: `**` + a name ending in `\` + `**` stays one
/// strong span (the reference kept `\` and `<`). It belongs inside a line, after program
/// text: at the very start of a line, a name such as `1. x` or `- x` would still open a list.
pub fn plain_inline(text: &str, max_chars: usize) -> Sanitized {
    Sanitized(escape_char_references(inline(
        text,
        max_chars,
        INLINE_MARKUP,
    )))
}

/// Renders untrusted text (a service's error message) as one line of plain text, for a
/// message that others will show or log.
///
/// Controls and hidden characters are neutralized, whitespace (newlines included) collapsed to
/// one space and the result trimmed; if longer than `max_chars` chars it keeps the first
/// `max_chars` and appends `…`. Unlike [`untrusted_label`] it adds no marks, so a driver can
/// put it inside a sentence of its own; whoever shows that sentence still labels it.
pub fn one_line(text: &str, max_chars: usize) -> Sanitized {
    let neutral = neutralize(text);
    let collapsed = neutral.split_whitespace().collect::<Vec<_>>().join(" ");
    Sanitized(clip(collapsed, max_chars, &ELLIPSIS.to_string()))
}

/// The mark that opens an untrusted label on a terminal line.
pub const LABEL_OPEN: char = '«';
/// The mark that closes an untrusted label on a terminal line.
pub const LABEL_CLOSE: char = '»';

/// Renders untrusted text as one visibly delimited label for a terminal line or a log field:
/// `«text»`.
///
/// Controls and hidden characters are neutralized, whitespace (newlines included) collapsed to
/// one space and the result trimmed; if longer than `max_chars` chars it keeps the first
/// `max_chars` and appends `…`. A `«` or `»` inside becomes its visible form (`⟨U+00AB⟩`,
/// `⟨U+00BB⟩`), so the label cannot close early, and everything the person sees between the
/// two marks came from someone else: text such as `auto-approvable: yes` inside a label never
/// reads as the program's own field. Empty text gives `«»`. No Markdown is removed: a terminal
/// shows it as written.
pub fn untrusted_label(text: &str, max_chars: usize) -> Sanitized {
    let clipped = one_line(text, max_chars).0;
    let mut out = String::with_capacity(clipped.len() + 8);
    out.push(LABEL_OPEN);
    for c in clipped.chars() {
        if c == LABEL_OPEN || c == LABEL_CLOSE {
            push_visible(&mut out, c);
        } else {
            out.push(c);
        }
    }
    out.push(LABEL_CLOSE);
    Sanitized(out)
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
    // The pretty text is the arguments' own copy: changed in place when it needs changing.
    let safe = defuse_fences_owned(neutralize_owned(pretty));
    Sanitized(clip(safe, max_chars, TRUNCATED))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// The shortcut for text that needs nothing changed answers exactly what the whole
        /// pass does, on names made mostly of what it accepts and on anything at all.
        #[test]
        fn inline_keeps_only_what_the_whole_pass_keeps(
            text in prop_oneof![
                3 => "[ a-zA-Z0-9_*`&.-]{0,12}",
                1 => any::<String>(),
            ],
            max_chars in 0usize..14,
            code in any::<bool>(),
        ) {
            let remove: &[char] = if code { &['`'] } else { INLINE_MARKUP };
            let whole = inline_pass(&text, max_chars, remove);
            prop_assert_eq!(inline(&text, max_chars, remove), whole.clone());
            if inline_keeps(&text, max_chars, remove) {
                prop_assert_eq!(&whole, &text);
            }
        }
    }

    #[test]
    fn inline_keeps_plain_names_and_passes_over_the_rest() {
        for text in ["Release notes", "a", "write-file 2.0", "a & b"] {
            assert!(inline_keeps(text, 200, INLINE_MARKUP), "{text:?}");
        }
        for (text, max) in [
            ("", 200),
            (" lead", 200),
            ("trail ", 200),
            ("two  spaces", 200),
            ("tab\there", 200),
            ("write_file", 200),
            ("**bold**", 200),
            ("caf\u{e9}", 200),
            ("too long", 7),
        ] {
            assert!(!inline_keeps(text, max, INLINE_MARKUP), "{text:?}");
        }
        assert!(inline_keeps("write_file", 200, &['`']));
    }

    #[test]
    fn defuse_keeps_short_runs_and_replaces_long_ones() {
        assert_eq!(defuse_fences("a`b``c```d````e"), "a`b``c'''d'''e");
        assert_eq!(defuse_fences("``"), "``");
        assert_eq!(defuse_fences("`````"), "'''");
        assert_eq!(defuse_fences(""), "");
    }

    #[test]
    fn a_fence_run_is_three_backticks_in_a_row() {
        for text in [
            "", "`", "``", "a``b`c", "``é`", "```", "a```", "x````y", "`` ```",
        ] {
            assert_eq!(has_fence_run(text), text.contains("```"), "{text:?}");
        }
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

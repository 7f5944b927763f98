//! The two body formats: Markdown (what the agent reads and writes) and the wiki's
//! storage format (what the service keeps), and the conversions between them.
//!
//! The conversion is deliberately small: paragraphs only. A blank line separates
//! paragraphs, a single line break inside a paragraph becomes `<br/>`, and `& < > "` are
//! escaped. Storage that is not a `<p>` element (a macro, a table) is carried through to
//! Markdown verbatim as its own paragraph, and back again unchanged only if the agent
//! does not touch it; that is the reference's "constructs that do not survive the
//! conversion" hazard, kept visible on purpose.
//!
//! For block-level text the two round-trip: `a\n\nb` ⇄ `<p>a</p><p>b</p>`. That is why
//! the simulated append (join with a blank line) and the real append (concatenate
//! storage) show the same page.

/// Markdown to storage: one `<p>` per paragraph; empty text gives empty storage.
pub fn markdown_to_storage(markdown: &str) -> String {
    let normalized = markdown.replace("\r\n", "\n");
    let mut out = String::with_capacity(normalized.len() + 16);
    let mut paragraph: Vec<&str> = Vec::new();
    let flush = |out: &mut String, paragraph: &mut Vec<&str>| {
        if paragraph.is_empty() {
            return;
        }
        out.push_str("<p>");
        for (n, line) in paragraph.iter().enumerate() {
            if n > 0 {
                out.push_str("<br/>");
            }
            escape_into(out, line.trim_end());
        }
        out.push_str("</p>");
        paragraph.clear();
    };
    for line in normalized.split('\n') {
        if line.trim().is_empty() {
            flush(&mut out, &mut paragraph);
        } else {
            paragraph.push(line);
        }
    }
    flush(&mut out, &mut paragraph);
    out
}

/// Storage to Markdown: paragraphs joined by a blank line; anything that is not a
/// paragraph is kept verbatim as a paragraph of its own.
///
/// Written into one buffer in one pass, and the tags found by looking for `<` (a `memchr`)
/// rather than with a substring searcher set up for each: every read of a real page
/// converts its body, and the version that collected each paragraph as a `String` and
/// searched for `</p>` that way took about twice the instructions.
pub fn storage_to_markdown(storage: &str) -> String {
    let mut out = String::with_capacity(storage.len());
    let mut rest = storage;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("<p>")
            && let Some(end) = find_tag(after, "</p>")
        {
            let inner = &after[..end];
            if !inner.is_empty() {
                separate(&mut out);
                unescape_into(&mut out, inner);
            }
            rest = &after[end + "</p>".len()..];
            continue;
        }
        // The next paragraph, after this text's first character (which may be `<p>`'s
        // `<`, or any character: not always one byte).
        let first = rest.chars().next().map_or(0, char::len_utf8);
        let next = find_tag(&rest[first..], "<p>").map_or(rest.len(), |i| i + first);
        let raw = rest[..next].trim();
        if !raw.is_empty() {
            separate(&mut out);
            out.push_str(raw);
        }
        rest = &rest[next..];
    }
    out
}

/// Start a paragraph: a blank line after the one before, if any.
fn separate(out: &mut String) {
    if !out.is_empty() {
        out.push_str("\n\n");
    }
}

/// Where `tag` (which starts with `<`) first occurs in `text`.
fn find_tag(text: &str, tag: &str) -> Option<usize> {
    text.match_indices('<')
        .map(|(at, _)| at)
        .find(|&at| text[at..].starts_with(tag))
}

/// The stored text of a paragraph as Markdown: `<br/>` a line break, and the four
/// escapes undone (`&amp;lt;` is `&lt;`: each escape is read once, left to right).
fn unescape_into(out: &mut String, text: &str) {
    const MARKS: [(&str, &str); 5] = [
        ("<br/>", "\n"),
        ("&lt;", "<"),
        ("&gt;", ">"),
        ("&quot;", "\""),
        ("&amp;", "&"),
    ];
    let mut rest = text;
    while let Some(at) = rest.find(['<', '&']) {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        match MARKS.iter().find(|(mark, _)| rest.starts_with(mark)) {
            Some((mark, plain)) => {
                out.push_str(plain);
                rest = &rest[mark.len()..];
            }
            None => {
                out.push_str(&rest[..1]);
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
}

fn escape_into(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The conversion as first written (a `String` per paragraph, joined at the end), the
    /// oracle the one-pass version is checked against.
    fn storage_to_markdown_before(storage: &str) -> String {
        let mut parts: Vec<String> = Vec::new();
        let mut rest = storage;
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix("<p>")
                && let Some(end) = after.find("</p>")
            {
                let inner = &after[..end];
                let text = if inner.contains("<br/>") {
                    unescape_before(&inner.replace("<br/>", "\n"))
                } else {
                    unescape_before(inner)
                };
                if !text.is_empty() {
                    parts.push(text);
                }
                rest = &after[end + "</p>".len()..];
                continue;
            }
            // The first version cut at byte 1, which is no boundary when the storage starts
            // with a character of several bytes (it panicked); the oracle cuts after it.
            let first = rest.chars().next().map_or(0, char::len_utf8);
            let next = rest[first..].find("<p>").map_or(rest.len(), |i| i + first);
            let raw = rest[..next].trim();
            if !raw.is_empty() {
                parts.push(raw.to_owned());
            }
            rest = &rest[next..];
        }
        parts.join("\n\n")
    }

    fn unescape_before(text: &str) -> String {
        if !text.contains('&') {
            return text.to_owned();
        }
        text.replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&amp;", "&")
    }

    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// Storage made of the pieces that matter (tags, escapes, broken ones, text) reads
        /// as the first version read it.
        #[test]
        fn one_pass_reads_storage_as_the_first_version_did(
            pieces in proptest::collection::vec(
                prop_oneof![
                    proptest::sample::select(&[
                        "<p>", "</p>", "<br/>", "<br", "&lt;", "&gt;", "&quot;", "&amp;",
                        "&amp;lt;", "&", "<", ">", "\"", " ", "\n", "<ac:macro/>", "é",
                    ][..]).prop_map(str::to_owned),
                    "[a-z <&;/p>]{0,6}",
                ],
                0..16,
            ),
        ) {
            let storage = pieces.concat();
            prop_assert_eq!(
                storage_to_markdown(&storage),
                storage_to_markdown_before(&storage)
            );
        }
    }

    #[test]
    fn paragraphs_round_trip() {
        let md = "stop\n\nrevert to old version";
        let storage = markdown_to_storage(md);
        assert_eq!(storage, "<p>stop</p><p>revert to old version</p>");
        assert_eq!(storage_to_markdown(&storage), md);
    }

    #[test]
    fn escapes_and_line_breaks_round_trip() {
        let md = "a < b & \"c\"\nsecond line";
        let storage = markdown_to_storage(md);
        assert_eq!(
            storage,
            "<p>a &lt; b &amp; &quot;c&quot;<br/>second line</p>"
        );
        assert_eq!(storage_to_markdown(&storage), md);
    }

    #[test]
    fn storage_that_starts_with_a_character_of_several_bytes_is_read() {
        assert_eq!(storage_to_markdown("é<p>x</p>"), "é\n\nx");
        assert_eq!(storage_to_markdown("<p>é</p>ü"), "é\n\nü");
    }

    #[test]
    fn empty_text_is_empty_storage_and_foreign_storage_is_kept() {
        assert_eq!(markdown_to_storage("\n\n  \n"), "");
        assert_eq!(
            storage_to_markdown("<p>x</p><ac:macro/><p>y</p>"),
            "x\n\n<ac:macro/>\n\ny"
        );
    }
}

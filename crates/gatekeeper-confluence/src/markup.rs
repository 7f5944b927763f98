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
pub fn storage_to_markdown(storage: &str) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut rest = storage;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("<p>")
            && let Some(end) = after.find("</p>")
        {
            let inner = &after[..end];
            let text = if inner.contains("<br/>") {
                unescape(&inner.replace("<br/>", "\n"))
            } else {
                unescape(inner)
            };
            if !text.is_empty() {
                parts.push(text);
            }
            rest = &after[end + "</p>".len()..];
            continue;
        }
        let next = rest[1..].find("<p>").map_or(rest.len(), |i| i + 1);
        let raw = rest[..next].trim();
        if !raw.is_empty() {
            parts.push(raw.to_owned());
        }
        rest = &rest[next..];
    }
    parts.join("\n\n")
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

fn unescape(text: &str) -> String {
    if !text.contains('&') {
        return text.to_owned();
    }
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&amp;", "&")
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn empty_text_is_empty_storage_and_foreign_storage_is_kept() {
        assert_eq!(markdown_to_storage("\n\n  \n"), "");
        assert_eq!(
            storage_to_markdown("<p>x</p><ac:macro/><p>y</p>"),
            "x\n\n<ac:macro/>\n\ny"
        );
    }
}

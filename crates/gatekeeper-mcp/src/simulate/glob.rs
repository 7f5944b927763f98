//! The part of minimatch (with `dot: true`) that the filesystem server's `search_files`
//! and `directory_tree` patterns use, modelled exactly: `*` (any run of characters but
//! `/`), `?` (one character but `/`), `**` as a whole segment (any number of segments) and
//! literal characters. Anything else minimatch gives meaning to (classes `[…]`, braces,
//! negation, extended globs, escapes, comments, empty segments) is refused with the
//! reason, so the simulator says it cannot show a pending write instead of guessing.

/// A pattern this module can match exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    segments: Vec<Segment>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    /// `**`: any number of segments, including none.
    Any,
    /// One segment's pattern, as characters.
    One(Vec<char>),
}

impl Glob {
    /// Parse `pattern`, or say why it is not modelled.
    pub fn new(pattern: &str) -> Result<Self, String> {
        if pattern.is_empty() {
            return Err("an empty pattern".to_owned());
        }
        if pattern.starts_with('#') || pattern.starts_with('!') {
            return Err(format!(
                "the pattern {pattern:?} starts with {:?}, which minimatch reads as a comment or a negation",
                &pattern[..1]
            ));
        }
        if let Some(c) = pattern.chars().find(|c| {
            matches!(
                c,
                '[' | ']' | '{' | '}' | '(' | ')' | '|' | '\\' | '+' | '@'
            )
        }) {
            return Err(format!(
                "the pattern {pattern:?} uses {c:?}, which the gate does not model (only *, ? and ** are)"
            ));
        }
        let mut segments = Vec::new();
        for part in pattern.split('/') {
            if part.is_empty() {
                return Err(format!(
                    "the pattern {pattern:?} has an empty segment (a leading, doubled or trailing /)"
                ));
            }
            segments.push(if part == "**" {
                Segment::Any
            } else {
                Segment::One(part.chars().collect())
            });
        }
        Ok(Self { segments })
    }

    /// Whether the relative path `path` (segments separated by `/`) matches.
    pub fn matches(&self, path: &str) -> bool {
        let parts: Vec<Vec<char>> = path.split('/').map(|p| p.chars().collect()).collect();
        match_segments(&self.segments, &parts)
    }
}

fn match_segments(pattern: &[Segment], parts: &[Vec<char>]) -> bool {
    match pattern.split_first() {
        None => parts.is_empty(),
        // A trailing `**` takes at least one segment (minimatch: `d/**` does not match
        // `d`); elsewhere it may take none (`**/x` matches `x`, `a/**/b` matches `a/b`).
        Some((Segment::Any, [])) => !parts.is_empty(),
        Some((Segment::Any, rest)) => {
            (0..=parts.len()).any(|skip| match_segments(rest, &parts[skip..]))
        }
        Some((Segment::One(segment), rest)) => match parts.split_first() {
            Some((part, others)) => match_one(segment, part) && match_segments(rest, others),
            None => false,
        },
    }
}

fn match_one(pattern: &[char], text: &[char]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some(('*', rest)) => (0..=text.len()).any(|skip| match_one(rest, &text[skip..])),
        Some(('?', rest)) => !text.is_empty() && match_one(rest, &text[1..]),
        Some((c, rest)) => text.first() == Some(c) && match_one(rest, &text[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::Glob;

    #[test]
    fn matches_as_minimatch_with_dot() {
        let g = |p: &str| Glob::new(p).unwrap();
        assert!(g("*.md").matches("a.md"));
        assert!(g("*.md").matches(".hidden.md"));
        assert!(!g("*.md").matches("d/a.md"));
        assert!(g("**/*.md").matches("a.md"));
        assert!(g("**/*.md").matches("d/e/a.md"));
        assert!(g("d/**").matches("d/e/a"));
        assert!(!g("d/**").matches("d"));
        assert!(g("**/x").matches("x") && g("a/**/b").matches("a/b"));
        assert!(!g("**/.git/**").matches(".git"));
        assert!(g("?.txt").matches("a.txt") && !g("?.txt").matches("ab.txt"));
        assert!(g("a**b").matches("axxb"));
    }

    #[test]
    fn refuses_what_it_does_not_model() {
        for p in [
            "*.{md,txt}",
            "[ab].md",
            "!x",
            "+(a|b)",
            "a\\*",
            "/abs",
            "a//b",
            "",
        ] {
            assert!(Glob::new(p).is_err(), "{p}");
        }
    }
}

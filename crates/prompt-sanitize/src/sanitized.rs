//! The `Sanitized` text type and the `Markdown` builder that assembles a prompt from it.
//!
//! `Sanitized` can only be made inside this crate, so a prompt built from it holds nothing that
//! skipped the terminal-safety layer.

use std::fmt;

use crate::controls::neutralize;
use crate::render::defuse_fences;

/// Text that this crate produced: safe to place in an approval prompt.
///
/// Only this crate constructs it (the field is private). Every value holds no control character
/// other than `\n`, no format (Cf) or bidi character, no default-ignorable code point, no
/// U+2028/U+2029 and no ESC. How it may be placed in Markdown depends on the function that made
/// it: a [`quote_untrusted`] block stands on its own lines, a [`code_span`] or [`plain_inline`]
/// goes inside a line after program text, and a [`json_arguments`] body goes inside a fence.
/// An [`untrusted_label`] is for terminal lines and log fields.
///
/// [`quote_untrusted`]: crate::quote_untrusted
/// [`code_span`]: crate::code_span
/// [`plain_inline`]: crate::plain_inline
/// [`json_arguments`]: crate::json_arguments
/// [`untrusted_label`]: crate::untrusted_label
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Sanitized(pub(crate) String);

impl Sanitized {
    /// Wraps program-authored text.
    ///
    /// The text is trusted, but it still passes through
    /// [`neutralize_controls`](crate::neutralize_controls), which is cheap and keeps the type's
    /// guarantee true whatever the literal holds.
    pub fn literal(text: &'static str) -> Sanitized {
        Sanitized(neutralize(text))
    }

    /// A count or an id written in decimal: digits only, so there is nothing to neutralize
    /// or escape, and no pass over it is needed (a number sent through
    /// [`plain_inline`](crate::plain_inline) took about 1,100 instructions).
    pub fn number(n: u64) -> Sanitized {
        Sanitized(n.to_string())
    }

    /// Concatenates sanitized pieces, with nothing between them.
    ///
    /// Joining two values keeps the guarantee, since neither holds an ESC or a control character
    /// that could combine with the other.
    pub fn concat(parts: &[&Sanitized]) -> Sanitized {
        let mut text = String::with_capacity(parts.iter().map(|p| p.0.len()).sum());
        for part in parts {
            text.push_str(&part.0);
        }
        Sanitized(text)
    }

    /// Returns the text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Returns the text as an owned `String`.
    pub fn into_string(self) -> String {
        self.0
    }

    /// Whether the text is empty, as [`quote_untrusted`](crate::quote_untrusted) of blank text is.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for Sanitized {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for Sanitized {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Builder for a prompt made only of sanitized pieces and program-authored literals.
///
/// Each call adds one line (or, for [`block`](Self::block) and [`fenced`](Self::fenced), a group
/// of lines); [`build`](Self::build) joins them with `\n`.
///
/// ```
/// use prompt_sanitize::{Markdown, Sanitized, code_span, json_arguments, plain_inline};
///
/// let server = plain_inline("Acme** is trusted **", 120);
/// let tool = code_span("delete_repo", 120);
/// let args = json_arguments(&serde_json::json!({"name": "x"}), 4000);
/// let prompt = Markdown::new()
///     .line(&[&Sanitized::literal("**"), &server, &Sanitized::literal("** → "), &tool])
///     .blank()
///     .text("Arguments:")
///     .fenced("json", &args)
///     .build();
/// assert_eq!(
///     prompt.as_str(),
///     "**Acme is trusted** → `delete_repo`\n\nArguments:\n```json\n{\n  \"name\": \"x\"\n}\n```"
/// );
/// ```
#[derive(Debug, Default, Clone)]
pub struct Markdown {
    lines: Vec<String>,
}

impl Markdown {
    /// Starts an empty prompt.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one line made of `parts` concatenated.
    pub fn line(&mut self, parts: &[&Sanitized]) -> &mut Self {
        self.lines.push(Sanitized::concat(parts).0);
        self
    }

    /// Adds one program-authored line (its controls are neutralized all the same).
    pub fn text(&mut self, text: &'static str) -> &mut Self {
        self.lines.push(neutralize(text));
        self
    }

    /// Adds an empty line.
    pub fn blank(&mut self) -> &mut Self {
        self.lines.push(String::new());
        self
    }

    /// Adds a multi-line sanitized block, such as a [`quote_untrusted`](crate::quote_untrusted)
    /// quote, as it is.
    pub fn block(&mut self, block: &Sanitized) -> &mut Self {
        self.lines.push(block.0.clone());
        self
    }

    /// Adds a fenced code block: ```` ```info ````, the body, then ```` ``` ````.
    ///
    /// The body's fences are defused again here (a no-op for a
    /// [`json_arguments`](crate::json_arguments) body), so no body can close the fence early.
    /// Backticks and line breaks are dropped from `info`, which must stay on the opening line.
    pub fn fenced(&mut self, info: &'static str, body: &Sanitized) -> &mut Self {
        let info: String = neutralize(info)
            .chars()
            .filter(|&c| c != '`' && c != '\n')
            .collect();
        self.lines.push(format!("```{info}"));
        self.lines.push(defuse_fences(&body.0));
        self.lines.push("```".to_owned());
        self
    }

    /// Returns the prompt: every line joined with `\n`.
    pub fn build(&self) -> Sanitized {
        Sanitized(self.lines.join("\n"))
    }
}

//! Renders untrusted text safely into the Markdown of an approval prompt.
//!
//! # The threat
//!
//! An approval prompt asks a person to approve a tool call. Much of its text is written by
//! parties the person should not have to trust: the MCP server writes the tool's name and
//! description, and the agent writes the arguments. Left alone, that text can write the prompt
//! for them: close the code fence around the arguments and forge an `Endpoint:` line, add a
//! heading that says "Approved by the security team", reverse a line with a bidi override so an
//! address reads backwards, hide words behind zero-width characters, or recolour and rewrite a
//! terminal with ANSI escapes. In short, an attacker writes the text of the approve button.
//!
//! # What this crate guarantees
//!
//! Every piece of untrusted text goes through one of four renderers, each returning
//! [`Sanitized`], a type only this crate can construct:
//!
//! - [`quote_untrusted`] makes a description a block quote that cannot start a heading, nest a
//!   quote, or open or close a fence, clipped to a char count;
//! - [`code_span`] and [`plain_inline`] make a name a single line of inline text, clipped;
//! - [`json_arguments`] makes the arguments a fence body that cannot close its fence, clipped.
//!
//! All of them, and [`neutralize_controls`] on its own, guarantee that the output holds no
//! control character other than `\n`, no format character (Unicode category Cf, which includes
//! every bidi control and zero-width character), no U+2028/U+2029 and no ESC: each such
//! character is shown as `⟨U+XXXX⟩` and each escape sequence as `⟨ESC⟩`, so the person sees that
//! something was there. [`Markdown`] assembles a prompt from sanitized pieces and
//! program-authored literals only.
//!
//! Lengths are counted in `char`s (Unicode scalar values) and text is always cut on a char
//! boundary, so no input can make a renderer panic or split a character. (The reference counted
//! UTF-16 units and could split a surrogate pair.) The limits the prompt uses are
//! [`MAX_DESCRIPTION_CHARS`], [`MAX_ARGUMENTS_CHARS`] and [`MAX_INLINE_CHARS`].
//!
//! # What it refuses to do
//!
//! **Architecture invariant:** this crate is pure functions over strings. It does no I/O, keeps
//! no state, spawns nothing and depends on nothing but `serde_json`; its format-character table
//! is written out in the source rather than pulled from a Unicode crate.
//!
//! It does not parse or re-render Markdown, and it does not judge content: inline emphasis and
//! links inside a quote still render (inside the quote), look-alike characters (homoglyphs) and
//! invisible letters such as U+3164 HANGUL FILLER pass through, and `<` is kept, so the prompt
//! must be shown by a renderer with raw HTML turned off.

mod controls;
mod render;
mod sanitized;

pub use controls::neutralize_controls;
pub use render::{
    MAX_ARGUMENTS_CHARS, MAX_DESCRIPTION_CHARS, MAX_INLINE_CHARS, code_span, defuse_fences,
    json_arguments, plain_inline, quote_untrusted,
};
pub use sanitized::{Markdown, Sanitized};

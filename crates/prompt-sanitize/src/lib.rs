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
//! Every piece of untrusted text goes through one of five renderers, each returning
//! [`Sanitized`], a type only this crate can construct. Read by a CommonMark renderer (any
//! settings, including raw HTML and GitHub's extensions turned on), each keeps to its slot:
//!
//! - [`quote_untrusted`] makes a description one block quote holding only paragraphs. Every
//!   line a renderer can see, including after list markers (`-`, `*`, `+`, `1.`, `1)`) and
//!   their combinations, is plain paragraph text: no ATX or setext heading, nested quote, list,
//!   code block, fence (backtick or tilde), thematic break, table or HTML block. Inside it, no
//!   text becomes a link, an image, raw HTML, an autolink or a decoded character reference
//!   (`&#x202E;`, `&rlm;`): the characters that would open them are escaped with a backslash,
//!   so the text renders as written. It is clipped to a char count.
//! - [`code_span`] makes a name one code span on one line, clipped; inside it nothing renders.
//! - [`plain_inline`] makes a name one line of inline text that opens no emphasis, link, image,
//!   raw HTML or code span and cannot escape the program's markup around it (it has no `\`),
//!   clipped. It goes after program text on a line, never at a line's start.
//! - [`json_arguments`] makes the arguments a fence body that cannot close its fence, clipped.
//! - [`untrusted_label`] makes a name or a message one delimited label for a terminal line or a
//!   log field, `«…»`, which cannot close early, so nothing inside it reads as the program's
//!   own words (a forged `auto-approvable: yes` stays inside the marks); [`one_line`] is the
//!   same line without the marks, for a message a driver hands on to be labelled later.
//!
//! All of them, and [`neutralize_controls`] on its own, guarantee that the output holds no
//! control character other than `\n` ([`one_line`] and [`untrusted_label`] not even that), no
//! format character (Unicode category Cf, which includes every bidi control and zero-width
//! character), no default-ignorable code point (the Unicode property
//! `Default_Ignorable_Code_Point`: variation selectors, U+034F, the Hangul fillers, the
//! reserved tag-block code points, ...), no U+2028/U+2029 and no ESC: each such character is
//! shown as `⟨U+XXXX⟩` and each escape sequence as `⟨ESC⟩`, so the person sees that something
//! was there. [`Markdown`] assembles a prompt from sanitized pieces and program-authored
//! literals only.
//!
//! Lengths are counted in `char`s (Unicode scalar values) and text is always cut on a char
//! boundary, so no input can make a renderer panic or split a character. (The reference counted
//! UTF-16 units and could split a surrogate pair.) Each untrusted part is capped on its own: the
//! limits the prompt uses are [`MAX_DESCRIPTION_CHARS`], [`MAX_ARGUMENTS_CHARS`],
//! [`MAX_INLINE_CHARS`] and [`MAX_SERVER_NAME_CHARS`]; clipped text ends in `…` (arguments in
//! `... (truncated)`).
//!
//! # What it does not cover
//!
//! **Architecture invariant:** this crate is pure functions over strings. It does no I/O, keeps
//! no state, spawns nothing and depends on nothing but `serde_json` and `regex` (for
//! [`redact`]); its Unicode tables (Cf and `Default_Ignorable_Code_Point`) are written out in
//! the source rather than pulled from a Unicode crate.
//!
//! # Secrets
//!
//! [`Redactor`] (module [`redact`]) replaces secrets in text, in [`Sanitized`] text and in JSON
//! values with a marker that says what and how long, `[redacted: GitHub token, 40
//! characters]`: well-known token patterns, members whose names say secret, and literal values
//! a deployment names. It lives here because it is pure text for the same surfaces, and because
//! a redacted [`Sanitized`] must stay one, which only this crate can vouch for.
//!
//! It does not parse or re-render Markdown, and it does not judge content:
//!
//! - inline emphasis, strikethrough and code spans inside a quote still render, inside their
//!   paragraph; a person reading the Markdown source sees the escaping backslashes;
//! - look-alike characters (homoglyphs: a Greek `Ε` for a Latin `E`, `≫` for `»`) and visible
//!   spaces (U+00A0, U+3000, U+2800) pass through, and so does a forged `…` that only pretends
//!   text was clipped;
//! - a bare URL stays text in CommonMark, but a renderer with GitHub's autolink extension may
//!   still make it a link;
//! - it guarantees the structure of each slot, not that the program put each piece in the
//!   right slot: [`plain_inline`] text at the start of a line, or a [`Sanitized`] quote inside
//!   another line, can still open structure, and a renderer that shows the text is the
//!   caller's to choose.

mod controls;
pub mod redact;
mod render;
mod sanitized;

pub use controls::neutralize_controls;
pub use redact::{Redacted, Redactor, is_secret_key};
pub use render::{
    LABEL_CLOSE, LABEL_OPEN, MAX_ARGUMENTS_CHARS, MAX_DESCRIPTION_CHARS, MAX_INLINE_CHARS,
    MAX_SERVER_NAME_CHARS, code_span, defuse_fences, json_arguments, one_line, plain_inline,
    quote_untrusted, untrusted_label,
};
pub use sanitized::{Markdown, Sanitized};

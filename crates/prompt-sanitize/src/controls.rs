//! The terminal-safety layer: makes control, bidi and format characters and ANSI/OSC escapes visible.
//!
//! This module knows nothing about Markdown. It only guarantees that what it returns holds no
//! character a terminal, a text renderer or a bidi algorithm would act on instead of showing.

use crate::Sanitized;

const ESC: char = '\u{1b}';
const BEL: char = '\u{07}';
/// The C1 form of the string terminator (`ESC \`).
const ST: char = '\u{9c}';

/// What an escape sequence is replaced with.
const ESC_VISIBLE: &str = "⟨ESC⟩";

/// Every range of Unicode general category Cf (format characters), inclusive, as of Unicode 16.0.
///
/// The table is written out here instead of taken from a crate, so this crate has no dependency
/// beyond `serde_json`; it is short and changes rarely (the last change was Unicode 15.0, which
/// grew the Egyptian hieroglyph format controls to U+1343F). It covers the bidi embeddings,
/// overrides and isolates (U+202A–U+202E, U+2066–U+2069), the marks U+200E, U+200F and U+061C,
/// the zero-width characters (U+200B–U+200D, U+2060, U+FEFF), the soft hyphen U+00AD and the
/// tag characters (U+E0001, U+E0020–U+E007F) that can smuggle invisible ASCII.
pub(crate) const FORMAT_RANGES: &[(u32, u32)] = &[
    (0x00AD, 0x00AD),
    (0x0600, 0x0605),
    (0x061C, 0x061C),
    (0x06DD, 0x06DD),
    (0x070F, 0x070F),
    (0x0890, 0x0891),
    (0x08E2, 0x08E2),
    (0x180E, 0x180E),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x2064),
    (0x2066, 0x206F),
    (0xFEFF, 0xFEFF),
    (0xFFF9, 0xFFFB),
    (0x110BD, 0x110BD),
    (0x110CD, 0x110CD),
    (0x13430, 0x1343F),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0001, 0xE0001),
    (0xE0020, 0xE007F),
];

/// Every range of the Unicode property `Default_Ignorable_Code_Point` (DerivedCoreProperties.txt),
/// inclusive, as of Unicode 16.0 (unchanged since Unicode 9.0).
///
/// These are the code points a renderer is told to draw as nothing when it has no glyph for
/// them, so every one of them can hide in text: besides the format characters above, the
/// combining grapheme joiner U+034F, the Hangul fillers U+115F, U+1160, U+3164 and U+FFA0, the
/// Khmer inherent vowels U+17B4/U+17B5, the Mongolian free variation selectors, the variation
/// selectors U+FE00–U+FE0F and U+E0100–U+E01EF, and the code points reserved as ignorable
/// (U+2065, U+FFF0–U+FFF8, the whole tag block up to U+E0FFF). The property, not a list of
/// characters someone tried, decides; a test checks the table's shape and these members.
pub(crate) const DEFAULT_IGNORABLE_RANGES: &[(u32, u32)] = &[
    (0x00AD, 0x00AD),
    (0x034F, 0x034F),
    (0x061C, 0x061C),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x206F),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
];

/// Whether `c` lies in one of the sorted, disjoint inclusive `ranges`.
fn in_ranges(ranges: &[(u32, u32)], c: char) -> bool {
    let c = u32::from(c);
    ranges
        .binary_search_by(|&(lo, hi)| {
            if hi < c {
                std::cmp::Ordering::Less
            } else if lo > c {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

/// Whether `c` is in Unicode general category Cf.
pub(crate) fn is_format(c: char) -> bool {
    in_ranges(FORMAT_RANGES, c)
}

/// Whether `c` has the Unicode property `Default_Ignorable_Code_Point`.
pub(crate) fn is_default_ignorable(c: char) -> bool {
    in_ranges(DEFAULT_IGNORABLE_RANGES, c)
}

/// Whether `c` may never appear in sanitized output (newline aside, which callers handle first).
///
/// That is: every control character (C0, DEL, C1), every format character (Cf, which includes
/// all bidi controls and zero-width characters), every default-ignorable code point (drawn as
/// nothing: variation selectors, Hangul fillers, the tag block, ...) and the line and paragraph
/// separators U+2028/U+2029, which some renderers treat as line breaks that Markdown does not
/// see.
pub(crate) fn is_hazard(c: char) -> bool {
    c.is_control() || is_format(c) || is_default_ignorable(c) || c == '\u{2028}' || c == '\u{2029}'
}

/// Appends the visible form `⟨U+XXXX⟩` of `c` (uppercase hex, at least four digits).
pub(crate) fn push_visible(out: &mut String, c: char) {
    use std::fmt::Write as _;
    // Writing to a String cannot fail.
    let _ = write!(out, "⟨U+{:04X}⟩", u32::from(c));
}

/// How many bytes after an ESC belong to its escape sequence (`rest` starts right after the ESC).
///
/// Recognised: CSI (`ESC [`, parameter and intermediate bytes, one final byte); the string
/// sequences OSC, DCS, SOS, PM and APC (`ESC ]`, `ESC P`, `ESC X`, `ESC ^`, `ESC _`) up to and
/// including their terminator; nF sequences (`ESC`, intermediates 0x20–0x2F, a final byte); and
/// the two-byte `ESC x` forms. A string sequence with no terminator consumes only its
/// introducer, so a stray `ESC ]` cannot hide the rest of the text.
fn escape_len(rest: &str) -> usize {
    let bytes = rest.as_bytes();
    match bytes.first() {
        Some(b'[') => {
            // Parameter bytes 0x30–0x3F and intermediate bytes 0x20–0x2F, then a final byte.
            let mut end = 1;
            for &b in &bytes[1..] {
                match b {
                    0x20..=0x3F => end += 1,
                    0x40..=0x7E => return end + 1,
                    _ => return end,
                }
            }
            end
        }
        Some(b']' | b'P' | b'X' | b'^' | b'_') => string_sequence_len(rest),
        Some(0x20..=0x2F) => {
            let mut end = 1;
            for &b in &bytes[1..] {
                match b {
                    0x20..=0x2F => end += 1,
                    0x30..=0x7E => return end + 1,
                    _ => return end,
                }
            }
            end
        }
        Some(0x30..=0x7E) => 1,
        _ => 0,
    }
}

/// Length in bytes of a string sequence (`rest` starts at its introducer, right after the ESC).
fn string_sequence_len(rest: &str) -> usize {
    for (i, c) in rest.char_indices().skip(1) {
        match c {
            BEL | ST => return i + c.len_utf8(),
            ESC => {
                return if rest[i + 1..].starts_with('\\') {
                    i + 2
                } else {
                    // A new escape aborts the string; the ESC is handled on its own.
                    i
                };
            }
            _ => {}
        }
    }
    // Unterminated: consume only the introducer and show the rest.
    1
}

/// Whether `text` is printable ASCII and newlines only: nothing in it to neutralize.
fn nothing_to_neutralize(text: &str) -> bool {
    // A block at a time, without stopping inside a block: the compiler then checks a whole
    // block with a few vector instructions instead of branching on every byte.
    text.as_bytes().chunks(BLOCK_BYTES).all(|block| {
        block.iter().fold(true, |plain, &b| {
            plain & (b == b'\n' || (0x20..0x7f).contains(&b))
        })
    })
}

/// How many bytes the scans over a whole text check at once.
pub(crate) const BLOCK_BYTES: usize = 32;

/// [`neutralize`], keeping `text` itself when there is nothing to change.
pub(crate) fn neutralize_owned(text: String) -> String {
    if nothing_to_neutralize(&text) {
        text
    } else {
        neutralize(&text)
    }
}

/// Neutralizes `text` into a plain `String` (see [`neutralize_controls`]).
pub(crate) fn neutralize(text: &str) -> String {
    // Fast path: printable ASCII and newlines have nothing to neutralize.
    if nothing_to_neutralize(text) {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while let Some(c) = text[i..].chars().next() {
        i += c.len_utf8();
        match c {
            '\n' => out.push('\n'),
            '\r' => {
                if text[i..].starts_with('\n') {
                    i += 1;
                }
                out.push('\n');
            }
            '\t' => out.push(' '),
            ESC => {
                i += escape_len(&text[i..]);
                out.push_str(ESC_VISIBLE);
            }
            c if is_hazard(c) => push_visible(&mut out, c),
            c => out.push(c),
        }
    }
    out
}

/// Makes control, bidi and format characters and ANSI/OSC escape sequences harmless.
///
/// This is the terminal-safety layer only: Markdown structure passes through untouched.
///
/// - `\n` is kept, `\r\n` and a lone `\r` become `\n`, and `\t` becomes one space.
/// - A whole escape sequence starting with ESC (CSI such as `ESC[31m`, OSC such as an `ESC]8;;`
///   hyperlink up to its BEL or `ESC \` terminator, and the other `ESC x` forms) is replaced by
///   `⟨ESC⟩`, as is a lone ESC. An OSC without a terminator loses only its `ESC ]`, so the rest
///   of the text stays visible.
/// - Every other control character (C0, DEL, C1 such as U+009B), every format character
///   (general category Cf: bidi controls, zero-width characters, the soft hyphen, tag
///   characters), every code point with the Unicode property `Default_Ignorable_Code_Point`
///   (variation selectors, U+034F, the Hangul fillers, the reserved tag-block code points, ...)
///   and U+2028/U+2029 becomes its visible form, for example `⟨U+202E⟩`.
///
/// Everything else, including private-use and other unassigned code points, is kept. Note that
/// the zero-width joiner U+200D and the variation selector U+FE0F are hidden characters, so an
/// emoji sequence shows its joiners and selectors; that is the price of never letting an
/// invisible character through.
pub fn neutralize_controls(text: &str) -> Sanitized {
    Sanitized(neutralize(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_table_is_sorted_and_disjoint() {
        for pair in FORMAT_RANGES.windows(2) {
            assert!(pair[0].0 <= pair[0].1, "range {:X?} is inverted", pair[0]);
            assert!(
                pair[0].1 < pair[1].0,
                "ranges {pair:X?} overlap or are unsorted"
            );
        }
    }

    #[test]
    fn format_lookup_matches_range_ends() {
        for &(lo, hi) in FORMAT_RANGES {
            for c in [lo, hi] {
                let c = char::from_u32(c).expect("table holds scalar values");
                assert!(is_format(c), "{c:?} should be Cf");
            }
            if let Some(c) = char::from_u32(hi + 1) {
                let next_lo = FORMAT_RANGES
                    .iter()
                    .find(|r| r.0 > hi)
                    .map_or(u32::MAX, |r| r.0);
                assert_eq!(is_format(c), next_lo == hi + 1, "{c:?}");
            }
        }
        assert!(!is_format('a'));
        assert!(!is_format('\u{2065}'));
    }

    #[test]
    fn default_ignorable_table_is_sorted_disjoint_and_covers_cf_hiders() {
        for pair in DEFAULT_IGNORABLE_RANGES.windows(2) {
            assert!(pair[0].0 <= pair[0].1, "range {:X?} is inverted", pair[0]);
            assert!(
                pair[0].1 + 1 < pair[1].0,
                "ranges {pair:X?} touch, overlap or are unsorted"
            );
        }
        for c in [
            '\u{34F}',
            '\u{115F}',
            '\u{3164}',
            '\u{FE0F}',
            '\u{E0100}',
            '\u{E0FFF}',
        ] {
            assert!(is_default_ignorable(c), "{c:?}");
        }
        for c in ['a', ' ', '\u{A0}', '\u{3000}', '\u{2800}', '\u{FFF9}'] {
            assert!(!is_default_ignorable(c), "{c:?}");
        }
    }

    #[test]
    fn csi_without_final_byte_stops_at_the_first_foreign_char() {
        assert_eq!(neutralize("\u{1b}[31;é"), "⟨ESC⟩é");
        assert_eq!(neutralize("\u{1b}[31"), "⟨ESC⟩");
    }

    #[test]
    fn string_sequence_aborted_by_another_escape() {
        assert_eq!(neutralize("\u{1b}]0;title\u{1b}[1mX"), "⟨ESC⟩⟨ESC⟩X");
    }

    #[test]
    fn other_escapes() {
        assert_eq!(neutralize("a\u{1b}cb"), "a⟨ESC⟩b");
        assert_eq!(neutralize("a\u{1b}(Bb"), "a⟨ESC⟩b");
        assert_eq!(neutralize("a\u{1b}"), "a⟨ESC⟩");
        // The second ESC takes the `b` as its final byte, as a terminal would.
        assert_eq!(neutralize("a\u{1b}\u{1b}b"), "a⟨ESC⟩⟨ESC⟩");
        assert_eq!(neutralize("a\u{1b}\u{1b}é"), "a⟨ESC⟩⟨ESC⟩é");
        assert_eq!(neutralize("a\u{1b}Pq#0\u{9c}b"), "a⟨ESC⟩b");
    }

    #[test]
    fn line_endings_and_tabs() {
        assert_eq!(neutralize("a\r\nb\rc\n\td"), "a\nb\nc\n d");
        assert_eq!(neutralize("\r\r\n"), "\n\n");
    }

    #[test]
    fn c0_del_c1_and_separators_become_visible() {
        assert_eq!(
            neutralize("\u{0}\u{7}\u{8}\u{b}\u{c}\u{7f}\u{85}\u{9b}\u{2028}\u{2029}"),
            "⟨U+0000⟩⟨U+0007⟩⟨U+0008⟩⟨U+000B⟩⟨U+000C⟩⟨U+007F⟩⟨U+0085⟩⟨U+009B⟩⟨U+2028⟩⟨U+2029⟩"
        );
        assert_eq!(neutralize("\u{e0041}"), "⟨U+E0041⟩");
    }
}

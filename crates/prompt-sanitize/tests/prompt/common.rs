//! Helpers shared by the tests: an independent check for characters that must never be output.

/// Bidi controls named in the threat model.
pub const BIDI: &[char] = &[
    '\u{061C}', '\u{200E}', '\u{200F}', '\u{202A}', '\u{202B}', '\u{202C}', '\u{202D}', '\u{202E}',
    '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}',
];

/// Unicode general category Cf, written out independently of the crate's own table.
pub const CF: &[(char, char)] = &[
    ('\u{AD}', '\u{AD}'),
    ('\u{600}', '\u{605}'),
    ('\u{61C}', '\u{61C}'),
    ('\u{6DD}', '\u{6DD}'),
    ('\u{70F}', '\u{70F}'),
    ('\u{890}', '\u{891}'),
    ('\u{8E2}', '\u{8E2}'),
    ('\u{180E}', '\u{180E}'),
    ('\u{200B}', '\u{200F}'),
    ('\u{202A}', '\u{202E}'),
    ('\u{2060}', '\u{2064}'),
    ('\u{2066}', '\u{206F}'),
    ('\u{FEFF}', '\u{FEFF}'),
    ('\u{FFF9}', '\u{FFFB}'),
    ('\u{110BD}', '\u{110BD}'),
    ('\u{110CD}', '\u{110CD}'),
    ('\u{13430}', '\u{1343F}'),
    ('\u{1BCA0}', '\u{1BCA3}'),
    ('\u{1D173}', '\u{1D17A}'),
    ('\u{E0001}', '\u{E0001}'),
    ('\u{E0020}', '\u{E007F}'),
];

/// Unicode's `Default_Ignorable_Code_Point`, written out independently of the crate's own
/// table (from DerivedCoreProperties.txt; Perl's `\p{Default_Ignorable_Code_Point}` agrees).
pub const DEFAULT_IGNORABLE: &[(char, char)] = &[
    ('\u{AD}', '\u{AD}'),
    ('\u{34F}', '\u{34F}'),
    ('\u{61C}', '\u{61C}'),
    ('\u{115F}', '\u{1160}'),
    ('\u{17B4}', '\u{17B5}'),
    ('\u{180B}', '\u{180F}'),
    ('\u{200B}', '\u{200F}'),
    ('\u{202A}', '\u{202E}'),
    ('\u{2060}', '\u{206F}'),
    ('\u{3164}', '\u{3164}'),
    ('\u{FE00}', '\u{FE0F}'),
    ('\u{FEFF}', '\u{FEFF}'),
    ('\u{FFA0}', '\u{FFA0}'),
    ('\u{FFF0}', '\u{FFF8}'),
    ('\u{1BCA0}', '\u{1BCA3}'),
    ('\u{1D173}', '\u{1D17A}'),
    ('\u{E0000}', '\u{E0FFF}'),
];

/// Whether `c` must never appear in the output of any function of the crate.
pub fn is_forbidden(c: char) -> bool {
    (c.is_control() && c != '\n')
        || BIDI.contains(&c)
        || CF.iter().any(|&(lo, hi)| (lo..=hi).contains(&c))
        || DEFAULT_IGNORABLE
            .iter()
            .any(|&(lo, hi)| (lo..=hi).contains(&c))
        || c == '\u{2028}'
        || c == '\u{2029}'
}

/// Panics with the offending char if `text` holds a forbidden one.
pub fn assert_clean(text: &str) {
    if let Some(c) = text.chars().find(|&c| is_forbidden(c)) {
        panic!("forbidden char {c:?} in {text:?}");
    }
}

/// The number of chars (Unicode scalar values) in `text`.
pub fn chars(text: &str) -> usize {
    text.chars().count()
}

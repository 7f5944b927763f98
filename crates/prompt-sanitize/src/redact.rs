//! Secrets kept off the person's screens and the logs: well-known token patterns, JSON members
//! whose names say secret, and values the deployment names, each replaced by a marker that
//! says what was there and how long it was, `[redacted: GitHub token, 40 characters]`.
//!
//! # What is redacted
//!
//! - **Well-known token patterns**, wherever they stand in a text: GitHub tokens (`ghp_`,
//!   `gho_`, `ghu_`, `ghs_`, `ghr_`, `github_pat_`), Anthropic and OpenAI-style keys
//!   (`sk-ant-…`, `sk-…`), Slack tokens (`xox?-…`, `xapp-…`), AWS access key ids
//!   (`AKIA…`, `ASIA…`), Google API keys (`AIza…`), Stripe keys (`sk_live_…`, `rk_live_…`
//!   and their `_test_` twins), JSON Web Tokens (`eyJ….eyJ….…`), PEM private key blocks
//!   (one cut short, with no `-----END` line, is redacted to the end of its string), the
//!   credential after `Bearer` or `Basic`, and the password of a URL (`scheme://user:PASSWORD@host`).
//! - **Members whose names say secret**: in JSON (as a value, [`Redactor::json`], or as text,
//!   `"api_key": "…"`) and in `name=value` text, a value whose name is a secret word or ends
//!   with one ([`is_secret_key`]: password, passwd, passphrase, secret(s), token, api key,
//!   authorization, private key, access key, secret key, signing key, encryption key,
//!   credential(s), cookie; case-insensitive, with or without `_`, `-` or `.`).
//! - **Literal values** the deployment names ([`Redactor::with_literals`]): every agent's
//!   token, a server's environment, its header values, values the person lists. A literal
//!   shorter than [`MIN_LITERAL_CHARS`] is not redacted: a short word would shred ordinary
//!   text. A literal is also found in its JSON-escaped form (as a prompt prints it).
//!
//! A marker names only the gate's own words (a fixed label per rule) and a length in
//! characters (Unicode scalar values) of what it replaced, so it cannot carry the secret or
//! any untrusted text. Redacting text that already holds this redactor's markers leaves them
//! as they are: a marker is never redacted again.
//!
//! # What it does not do
//!
//! It finds the secrets it has a rule for; a password in prose (`my password is hunter2`) or
//! a key of a service without a recognisable prefix stays visible unless the deployment names
//! its value. It redacts views: callers keep the real text and decide where each goes.
//! Like the rest of the crate it is pure: no I/O, no state beyond the compiled rules.

use std::collections::HashMap;
use std::sync::LazyLock;

use regex::{Captures, Match, Regex, RegexSet};
use serde_json::Value;

use crate::controls::neutralize;
use crate::sanitized::Sanitized;

/// The shortest literal value that is redacted, in chars; shorter ones are ignored.
pub const MIN_LITERAL_CHARS: usize = 8;

/// What a marker says of a value held under a secret-named member.
pub const SECRET_MEMBER: &str = "value of a secret-named field";

/// How every marker begins.
pub const MARKER_OPEN: &str = "[redacted: ";

/// How many more passes [`Redactor::text`] makes at most after the first; in practice one
/// finds nothing more.
const MAX_PASSES: usize = 8;

/// One well-known shape of secret.
struct Pattern {
    /// What the marker calls it.
    what: &'static str,
    /// The expression; the secret is what `secret` picks from its captures.
    regex: &'static str,
    /// The part of a match that is the secret, or `None` when the match is not one.
    secret: for<'t> fn(&Captures<'t>) -> Option<Match<'t>>,
}

/// Capture group 1, always.
fn group_one<'t>(captures: &Captures<'t>) -> Option<Match<'t>> {
    captures.get(1)
}

/// Group 1, when it has an ASCII letter and an ASCII digit after its first three chars
/// (`sk-…` keys are random; a slug such as `sk-learn-…` is not one).
fn random_sk<'t>(captures: &Captures<'t>) -> Option<Match<'t>> {
    let found = captures.get(1)?;
    let tail = found.as_str().get(3..).unwrap_or("");
    (tail.bytes().any(|b| b.is_ascii_digit()) && tail.bytes().any(|b| b.is_ascii_alphabetic()))
        .then_some(found)
}

/// Group 1, when it looks like a credential rather than a word (`Bearer authentication`):
/// it holds a digit or one of `._~+/=-`, or is at least 32 chars.
fn credential<'t>(captures: &Captures<'t>) -> Option<Match<'t>> {
    let found = captures.get(1)?;
    let text = found.as_str();
    (text.len() >= 32
        || text
            .bytes()
            .any(|b| b.is_ascii_digit() || b"._~+/=-".contains(&b)))
    .then_some(found)
}

/// Group 2, when group 1 names a secret ([`is_secret_key`]).
fn named_value<'t>(captures: &Captures<'t>) -> Option<Match<'t>> {
    is_secret_key(captures.get(1)?.as_str())
        .then(|| captures.get(2))
        .flatten()
}

/// A JSON member's value (group 2, a string's content, or group 3, a number), when its
/// name (group 1) names a secret and the value is not empty.
fn named_member<'t>(captures: &Captures<'t>) -> Option<Match<'t>> {
    if !is_secret_key(captures.get(1)?.as_str()) {
        return None;
    }
    captures
        .get(2)
        .or_else(|| captures.get(3))
        .filter(|m| !m.is_empty())
}

/// The rules, most specific first: of two finds that start at the same place and are as
/// long, the earlier rule names it.
const PATTERNS: &[Pattern] = &[
    Pattern {
        what: "private key (PEM)",
        // Within one JSON string (no `"`): to its END line, or, cut short, to the string's
        // end.
        regex: r#"(-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----(?:[^"]*?-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|[^"]*))"#,
        secret: group_one,
    },
    Pattern {
        what: "JSON Web Token",
        regex: r"\b(eyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*)",
        secret: group_one,
    },
    Pattern {
        what: "GitHub token",
        regex: r"(gh[pousr]_[A-Za-z0-9]{36,251})",
        secret: group_one,
    },
    Pattern {
        what: "GitHub token",
        regex: r"(github_pat_[A-Za-z0-9_]{22,244})",
        secret: group_one,
    },
    Pattern {
        what: "Anthropic API key",
        regex: r"\b(sk-ant-[A-Za-z0-9_-]{20,})",
        secret: group_one,
    },
    Pattern {
        what: "Stripe key",
        regex: r"\b((?:sk|rk)_(?:live|test)_[0-9A-Za-z]{16,})",
        secret: group_one,
    },
    Pattern {
        what: "API key (sk-)",
        regex: r"\b(sk-[A-Za-z0-9_-]{20,})",
        secret: random_sk,
    },
    Pattern {
        what: "Slack token",
        regex: r"\b((?:xox[abposre]|xapp)-[A-Za-z0-9-]{10,})",
        secret: group_one,
    },
    Pattern {
        what: "AWS access key id",
        regex: r"\b((?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16})\b",
        secret: group_one,
    },
    Pattern {
        what: "Google API key",
        regex: r"\b(AIza[0-9A-Za-z_-]{35})",
        secret: group_one,
    },
    Pattern {
        what: "Bearer credential",
        regex: r"(?i)\bbearer[ \t]+([A-Za-z0-9._~+/-]{8,}=*)",
        secret: credential,
    },
    Pattern {
        what: "Basic credential",
        regex: r"(?i)\bbasic[ \t]+([A-Za-z0-9+/]{8,}={0,2})",
        secret: credential,
    },
    Pattern {
        what: "password in a URL",
        regex: r#"\b[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@"'<>]+:([^/\s@"'<>]+)@"#,
        secret: group_one,
    },
    Pattern {
        what: SECRET_MEMBER,
        // A JSON member, or one as Rust's `Debug` prints a `serde_json::Value`
        // (`"password": String("…")`).
        regex: r#""((?:[^"\\\n]|\\.){1,100})"[ \t]*:[ \t]*(?:[A-Z][A-Za-z]{1,15}\()?(?:"((?:[^"\\\n]|\\.)*)"|(-?[0-9][0-9.eE+-]*))"#,
        secret: named_member,
    },
    Pattern {
        what: SECRET_MEMBER,
        // A field as `Debug` or YAML prints it: `password: "…"`.
        regex: r#"\b([A-Za-z_][A-Za-z0-9_.-]{0,63})[ \t]*:[ \t]*"((?:[^"\\\n]|\\.)*)""#,
        secret: named_value,
    },
    Pattern {
        what: SECRET_MEMBER,
        regex: r#"\b([A-Za-z][A-Za-z0-9_.-]{0,63})=([^\s&"'<>;,]{4,})"#,
        secret: named_value,
    },
];

/// The compiled rules, and a set that says which of them can match at all.
struct Compiled {
    set: RegexSet,
    each: Vec<Regex>,
}

static COMPILED: LazyLock<Compiled> = LazyLock::new(|| {
    let sources: Vec<&str> = PATTERNS.iter().map(|p| p.regex).collect();
    Compiled {
        set: RegexSet::new(&sources).expect("the rules compile"),
        each: sources
            .iter()
            .map(|s| Regex::new(s).expect("each rule compiles"))
            .collect(),
    }
});

/// The words that make a member's name secret when it is one of them or ends with one
/// (compared lower-case, without `_`, `-`, `.` or spaces).
const SECRET_WORDS: &[&str] = &[
    "password",
    "passwd",
    "passphrase",
    "secret",
    "secrets",
    "token",
    "apikey",
    "authorization",
    "privatekey",
    "accesskey",
    "secretkey",
    "signingkey",
    "encryptionkey",
    "credential",
    "credentials",
    "cookie",
];

/// Names that end with a secret word but hold none: pagination cursors.
const NOT_SECRET_ENDINGS: &[&str] = &[
    "pagetoken",
    "paginationtoken",
    "continuationtoken",
    "synctoken",
];

/// Whether a member or parameter named `name` holds a secret: the name, lower-cased and
/// without `_`, `-`, `.` and spaces, is one of the secret words or ends with one
/// (`password`, `DB_PASSWORD`, `apiKey`, `x-api-key`, `client_secret`, `Authorization`,
/// `access_token`); pagination cursors (`next_page_token`) are not secrets.
pub fn is_secret_key(name: &str) -> bool {
    if name.len() > 100 {
        return false;
    }
    let normalized: String = name
        .chars()
        .filter(|c| !matches!(c, '_' | '-' | '.' | ' '))
        .flat_map(char::to_lowercase)
        .collect();
    SECRET_WORDS.iter().any(|w| normalized.ends_with(w))
        && !NOT_SECRET_ENDINGS.iter().any(|w| normalized.ends_with(w))
}

/// The marker that stands for `chars` characters of `what`.
pub fn marker(what: &str, chars: usize) -> String {
    let unit = if chars == 1 {
        "character"
    } else {
        "characters"
    };
    format!("{MARKER_OPEN}{what}, {chars} {unit}]")
}

/// A redacted view of something, and how many secrets it hides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redacted<T> {
    /// The view: each secret replaced by its marker.
    pub value: T,
    /// How many secrets were replaced.
    pub hidden: usize,
}

/// One secret found in a text: a byte range, and what the marker calls it.
#[derive(Debug, Clone, Copy)]
struct Find {
    start: usize,
    end: usize,
    /// `None` for a marker already there, kept as it is.
    what: Option<&'static str>,
    /// Which rule found it: of two finds as long at one place, the lower wins.
    rank: usize,
}

/// Replaces secrets in text and in JSON values with markers; see the [module](self) for what
/// it finds.
///
/// Built once (the well-known rules are compiled once per process) and shared; redacting
/// takes `&self`.
#[derive(Debug, Clone)]
pub struct Redactor {
    /// One expression over every literal form, longest first; `None` without literals.
    literals: Option<Regex>,
    /// What each literal form is.
    literal_what: HashMap<String, &'static str>,
    /// The markers this redactor writes, so that redacting twice changes nothing.
    markers: Regex,
    /// How many distinct values it redacts besides the rules.
    literal_count: usize,
}

impl Default for Redactor {
    fn default() -> Self {
        Self::new()
    }
}

impl Redactor {
    /// A redactor with the well-known rules only.
    pub fn new() -> Self {
        Self::with_literals(std::iter::empty::<(String, &'static str)>())
    }

    /// A redactor with the well-known rules and these literal values, each with what its
    /// marker calls it (`"agent token"`). Values shorter than [`MIN_LITERAL_CHARS`] are
    /// left out.
    pub fn with_literals<I, S>(literals: I) -> Self
    where
        I: IntoIterator<Item = (S, &'static str)>,
        S: AsRef<str>,
    {
        let mut literal_what: HashMap<String, &'static str> = HashMap::new();
        let mut labels: Vec<&'static str> = PATTERNS.iter().map(|p| p.what).collect();
        let mut literal_count = 0;
        for (value, what) in literals {
            let value = value.as_ref();
            if value.chars().count() < MIN_LITERAL_CHARS {
                continue;
            }
            literal_count += 1;
            labels.push(what);
            let escaped = serde_json::to_string(value).expect("a string serialises");
            let escaped = &escaped[1..escaped.len() - 1];
            for form in [value.to_owned(), escaped.to_owned(), neutralize(value)] {
                if form.chars().count() >= MIN_LITERAL_CHARS {
                    literal_what.entry(form).or_insert(what);
                }
            }
        }
        let literals = (!literal_what.is_empty()).then(|| {
            let mut forms: Vec<&String> = literal_what.keys().collect();
            // Longest first: the alternation takes the first that matches at a place.
            forms.sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
            let alternation: Vec<String> = forms.iter().map(|f| regex::escape(f)).collect();
            Regex::new(&alternation.join("|")).expect("escaped literals compile")
        });
        labels.sort_unstable();
        labels.dedup();
        let labels: Vec<String> = labels.iter().map(|l| regex::escape(l)).collect();
        let markers = Regex::new(&format!(
            r"\[redacted: (?:{}), [0-9]{{1,12}} characters?\]",
            labels.join("|")
        ))
        .expect("the marker expression compiles");
        Self {
            literals,
            literal_what,
            markers,
            literal_count,
        }
    }

    /// How many literal values it redacts (those long enough to be kept).
    pub fn literal_count(&self) -> usize {
        self.literal_count
    }

    /// Every secret in `text`, in order, without overlaps.
    fn finds(&self, text: &str) -> Vec<Find> {
        let mut finds = Vec::new();
        for found in self.markers.find_iter(text) {
            finds.push(Find {
                start: found.start(),
                end: found.end(),
                what: None,
                rank: 0,
            });
        }
        let compiled = &*COMPILED;
        for index in compiled.set.matches(text).iter() {
            let pattern = &PATTERNS[index];
            // A match that is not a secret (a name that says nothing) is searched again from
            // its next char, so it cannot hide a secret that starts inside it.
            let mut at = 0;
            while let Some(captures) = compiled.each[index].captures_at(text, at) {
                let whole = captures.get(0).expect("a match has its group 0");
                match (pattern.secret)(&captures) {
                    Some(secret) => {
                        finds.push(Find {
                            start: secret.start(),
                            end: secret.end(),
                            what: Some(pattern.what),
                            rank: 1 + index,
                        });
                        at = whole.end().max(at + 1);
                    }
                    None => {
                        at = whole.start()
                            + text[whole.start()..]
                                .chars()
                                .next()
                                .map_or(1, char::len_utf8);
                    }
                }
                if at > text.len() {
                    break;
                }
            }
        }
        if let Some(literals) = &self.literals {
            for found in literals.find_iter(text) {
                finds.push(Find {
                    start: found.start(),
                    end: found.end(),
                    what: Some(
                        self.literal_what
                            .get(found.as_str())
                            .copied()
                            .unwrap_or("configured secret"),
                    ),
                    rank: 1 + PATTERNS.len(),
                });
            }
        }
        finds.sort_by(|a, b| {
            a.start
                .cmp(&b.start)
                .then(b.end.cmp(&a.end))
                .then(a.rank.cmp(&b.rank))
        });
        // Overlapping finds become one: hiding a little more never shows the tail of a
        // secret another rule found first. A marker already there stays as it is, and what a
        // find reaches beyond it is a find of its own.
        let mut kept: Vec<Find> = Vec::with_capacity(finds.len());
        for mut find in finds {
            if find.start >= find.end {
                continue;
            }
            match kept.last_mut() {
                Some(last) if find.start < last.end => {
                    if find.end <= last.end {
                        continue;
                    }
                    if last.what.is_none() || find.what.is_none() {
                        find.start = last.end;
                        kept.push(find);
                    } else {
                        last.end = find.end;
                    }
                }
                _ => kept.push(find),
            }
        }
        kept
    }

    /// `text` with every secret replaced by its marker.
    ///
    /// A marker can set off a rule that did not apply before (it ends a word, so a
    /// `Bearer` glued to a secret becomes one), so the text is redacted again until nothing
    /// more is found: redacting the result again changes nothing.
    pub fn text(&self, text: &str) -> Redacted<String> {
        let mut shown = self.pass(text);
        // Each pass that finds something replaces at least one char outside every marker.
        for _ in 0..MAX_PASSES {
            let again = self.pass(&shown.value);
            if again.hidden == 0 {
                break;
            }
            shown = Redacted {
                value: again.value,
                hidden: shown.hidden + again.hidden,
            };
        }
        shown
    }

    /// One pass of [`Redactor::text`].
    fn pass(&self, text: &str) -> Redacted<String> {
        let finds = self.finds(text);
        let mut hidden = 0;
        let mut out = String::with_capacity(text.len());
        let mut at = 0;
        for find in finds {
            let Some(what) = find.what else {
                continue;
            };
            out.push_str(&text[at..find.start]);
            out.push_str(&marker(what, text[find.start..find.end].chars().count()));
            at = find.end;
            hidden += 1;
        }
        if hidden == 0 {
            return Redacted {
                value: text.to_owned(),
                hidden,
            };
        }
        out.push_str(&text[at..]);
        Redacted { value: out, hidden }
    }

    /// `text` with every secret replaced by its marker, still [`Sanitized`]: a marker holds
    /// only the gate's words, digits and `[`, `]`, `:` and `,`, and removing text joins no
    /// characters into a control.
    pub fn sanitized(&self, text: &Sanitized) -> Redacted<Sanitized> {
        let Redacted { value, hidden } = self.text(text.as_str());
        Redacted {
            value: Sanitized(value),
            hidden,
        }
    }

    /// `value` with every secret replaced: a member whose name says secret has its whole
    /// value replaced by one marker (a string's length in chars, another value's as compact
    /// JSON; `null`, booleans and empty strings are kept), and every other string, member
    /// names included, is redacted as text.
    pub fn json(&self, value: &Value) -> Redacted<Value> {
        let mut hidden = 0;
        let value = self.walk(value, &mut hidden);
        Redacted { value, hidden }
    }

    /// Whether a secret-named member's value can hold a secret: not `null`, a boolean, an
    /// empty string, or exactly one of this redactor's markers already.
    fn holds_secret(&self, value: &Value) -> bool {
        match value {
            Value::Null | Value::Bool(_) => false,
            Value::String(text) => {
                !text.is_empty()
                    && self
                        .markers
                        .find(text)
                        .is_none_or(|m| m.start() != 0 || m.end() != text.len())
            }
            Value::Array(items) => !items.is_empty(),
            Value::Object(members) => !members.is_empty(),
            Value::Number(_) => true,
        }
    }

    fn walk(&self, value: &Value, hidden: &mut usize) -> Value {
        match value {
            Value::String(text) => {
                let redacted = self.text(text);
                *hidden += redacted.hidden;
                Value::String(redacted.value)
            }
            Value::Array(items) => {
                Value::Array(items.iter().map(|v| self.walk(v, hidden)).collect())
            }
            Value::Object(members) => {
                let mut out = serde_json::Map::new();
                for (name, member) in members {
                    let shown = self.text(name);
                    *hidden += shown.hidden;
                    let mut key = shown.value.clone();
                    // Two names redacted to one marker must stay two members.
                    let mut n = 2;
                    while out.contains_key(&key) {
                        key = format!("{} ({n})", shown.value);
                        n += 1;
                    }
                    let member = if is_secret_key(name) && self.holds_secret(member) {
                        *hidden += 1;
                        let chars = match member {
                            Value::String(text) => text.chars().count(),
                            other => other.to_string().chars().count(),
                        };
                        Value::String(marker(SECRET_MEMBER, chars))
                    } else {
                        self.walk(member, hidden)
                    };
                    out.insert(key, member);
                }
                Value::Object(out)
            }
            other => other.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Redacting a view again changes nothing, whatever the text: secrets, markers,
        /// names, quotes and noise mixed.
        #[test]
        fn redaction_is_idempotent_on_any_text(
            parts in proptest::collection::vec(prop_oneof![
                Just(GITHUB.to_owned()),
                Just("\"token\": \"".to_owned()),
                Just("api_key=".to_owned()),
                Just("Bearer ".to_owned()),
                Just("[redacted: GitHub token, 40 characters]".to_owned()),
                Just("s3cr3t-value-of-mine".to_owned()),
                Just("-----BEGIN PRIVATE KEY-----".to_owned()),
                "[ -~]{0,12}",
                any::<String>(),
            ], 0..8),
        ) {
            let redactor = Redactor::with_literals([("s3cr3t-value-of-mine", "configured secret")]);
            for text in [parts.concat(), parts.join(" ")] {
                let once = redactor.text(&text);
                prop_assert!(!once.value.contains(GITHUB));
                prop_assert!(!once.value.contains("s3cr3t-value-of-mine"));
                let twice = redactor.text(&once.value);
                prop_assert_eq!(&twice.value, &once.value);
                prop_assert_eq!(twice.hidden, 0);
            }
        }
    }

    /// A GitHub classic token: `ghp_` and 36 chars.
    const GITHUB: &str = "ghp_aB3dE5fG7hI9jK1lM3nO5pQ7rS9tU1vW3xY5";

    fn redact(text: &str) -> String {
        Redactor::new().text(text).value
    }

    #[test]
    fn each_well_known_pattern_is_redacted_with_what_and_how_long() {
        let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U";
        let pem =
            "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA7\n-----END RSA PRIVATE KEY-----";
        let cases: &[(&str, &str, &str)] = &[
            (GITHUB, "GitHub token", GITHUB),
            (
                "gho_16C7e42F292c6912E7710c838347Ae178B4a",
                "GitHub token",
                "gho_16C7e42F292c6912E7710c838347Ae178B4a",
            ),
            (
                "ghu_16C7e42F292c6912E7710c838347Ae178B4a",
                "GitHub token",
                "ghu_16C7e42F292c6912E7710c838347Ae178B4a",
            ),
            (
                "ghs_16C7e42F292c6912E7710c838347Ae178B4a",
                "GitHub token",
                "ghs_16C7e42F292c6912E7710c838347Ae178B4a",
            ),
            (
                "ghr_16C7e42F292c6912E7710c838347Ae178B4a",
                "GitHub token",
                "ghr_16C7e42F292c6912E7710c838347Ae178B4a",
            ),
            (
                "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ012345",
                "GitHub token",
                "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ012345",
            ),
            (
                "sk-ant-api03-AbCdEf0123456789_AbCdEf-0123456789",
                "Anthropic API key",
                "sk-ant-api03-AbCdEf0123456789_AbCdEf-0123456789",
            ),
            (
                "sk-proj-Ab12Cd34Ef56Gh78Ij90Kl12Mn34",
                "API key (sk-)",
                "sk-proj-Ab12Cd34Ef56Gh78Ij90Kl12Mn34",
            ),
            (
                "xoxb-1234567890-0987654321-AbCdEfGhIjKl",
                "Slack token",
                "xoxb-1234567890-0987654321-AbCdEfGhIjKl",
            ),
            (
                "AKIAIOSFODNN7EXAMPLE",
                "AWS access key id",
                "AKIAIOSFODNN7EXAMPLE",
            ),
            (
                "ASIAY34FZKBOKMUTVV7A",
                "AWS access key id",
                "ASIAY34FZKBOKMUTVV7A",
            ),
            (
                "AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",
                "Google API key",
                "AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",
            ),
            (
                "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
                "Stripe key",
                "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
            ),
            (
                "rk_live_4eC39HqLyjWDarjtT1zdp7dc",
                "Stripe key",
                "rk_live_4eC39HqLyjWDarjtT1zdp7dc",
            ),
            (jwt, "JSON Web Token", jwt),
            (pem, "private key (PEM)", pem),
            (
                "Authorization: Bearer abc.DEF-123_456",
                "Bearer credential",
                "abc.DEF-123_456",
            ),
            (
                "Authorization: Basic dXNlcjpwYXNzd29yZA==",
                "Basic credential",
                "dXNlcjpwYXNzd29yZA==",
            ),
            (
                "postgres://gate:s3cret-pw@db.example/gate",
                "password in a URL",
                "s3cret-pw",
            ),
            (
                "https://api.example/v1?access_token=abc123xyz&page=2",
                SECRET_MEMBER,
                "abc123xyz",
            ),
            (
                r#"{"password": String("hunter2"), "n": Number(1)}"#,
                SECRET_MEMBER,
                "hunter2",
            ),
            (
                r#"Config { token: "t0k3n-value", name: "x" }"#,
                SECRET_MEMBER,
                "t0k3n-value",
            ),
        ];
        for (text, what, secret) in cases {
            let text = format!("before {text} after");
            let redacted = Redactor::new().text(&text);
            let expected = text.replace(secret, &marker(what, secret.chars().count()));
            assert_eq!(redacted.value, expected, "{text}");
            assert_eq!(redacted.hidden, 1, "{text}");
            assert!(!redacted.value.contains(secret), "{text}");
        }
        assert_eq!(
            redact(&format!("token {GITHUB}.")),
            "token [redacted: GitHub token, 40 characters]."
        );
    }

    #[test]
    fn a_private_key_cut_short_is_redacted_to_the_end_of_its_string() {
        let text =
            r#"{"key": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA", "n": 1}"#;
        let shown = redact(text);
        assert_eq!(
            shown,
            r#"{"key": "[redacted: private key (PEM), 61 characters]", "n": 1}"#
        );
    }

    #[test]
    fn members_named_as_secrets_are_redacted_in_json_values_and_in_json_text() {
        let args = json!({
            "password": "hunter2",
            "DB_PASSWORD": "correct horse",
            "apiKey": 123456789,
            "x-api-key": "k",
            "client_secret": {"a": 1},
            "Authorization": "Token abc",
            "access_token": "",
            "private_key": null,
            "is_secret": true,
            "title": "Release notes",
            "next_page_token": "CURSOR123",
            "max_tokens": 100,
            "nested": [{"passwd": "p4ssw0rd!"}],
        });
        let redacted = Redactor::new().json(&args);
        assert_eq!(
            redacted.value,
            json!({
                "password": marker(SECRET_MEMBER, 7),
                "DB_PASSWORD": marker(SECRET_MEMBER, 13),
                "apiKey": marker(SECRET_MEMBER, 9),
                "x-api-key": marker(SECRET_MEMBER, 1),
                "client_secret": marker(SECRET_MEMBER, 7),
                "Authorization": marker(SECRET_MEMBER, 9),
                "access_token": "",
                "private_key": null,
                "is_secret": true,
                "title": "Release notes",
                "next_page_token": "CURSOR123",
                "max_tokens": 100,
                "nested": [{"passwd": marker(SECRET_MEMBER, 9)}],
            })
        );
        assert_eq!(redacted.hidden, 7);
        // The same rule on JSON as a prompt prints it.
        let text = serde_json::to_string_pretty(
            &json!({"password": "hunter2", "token": 42, "title": "x"}),
        )
        .expect("json");
        let shown = redact(&text);
        assert!(
            shown.contains(
                r#""password": "[redacted: value of a secret-named field, 7 characters]""#
            ),
            "{shown}"
        );
        assert!(
            shown.contains(r#""token": [redacted: value of a secret-named field, 2 characters]"#),
            "{shown}"
        );
        assert!(shown.contains(r#""title": "x""#), "{shown}");
    }

    #[test]
    fn secret_names_are_recognised_in_any_case_and_separator() {
        for name in [
            "password",
            "Password",
            "user_password",
            "passwd",
            "passphrase",
            "secret",
            "client-secret",
            "clientSecret",
            "token",
            "access_token",
            "GITHUB_TOKEN",
            "api_key",
            "api-key",
            "apikey",
            "ApiKey",
            "authorization",
            "private_key",
            "privateKey",
            "aws_secret_access_key",
            "credentials",
            "cookie",
        ] {
            assert!(is_secret_key(name), "{name}");
        }
        for name in [
            "title",
            "key",
            "max_tokens",
            "tokens",
            "token_count",
            "next_page_token",
            "pageToken",
            "secret_name",
            "author",
            "path",
            "primary_key_id",
        ] {
            assert!(!is_secret_key(name), "{name}");
        }
    }

    #[test]
    fn literal_values_are_redacted_and_short_ones_are_not() {
        let redactor = Redactor::with_literals([
            ("s3cr3t-value-of-mine", "configured secret"),
            ("short", "configured secret"),
            ("quote\"d-secret", "agent token"),
        ]);
        assert_eq!(redactor.literal_count(), 2);
        assert_eq!(
            redactor
                .text("the value s3cr3t-value-of-mine, and short")
                .value,
            "the value [redacted: configured secret, 20 characters], and short"
        );
        // As a prompt prints it: JSON-escaped.
        let printed = serde_json::to_string(&json!({"a": "quote\"d-secret"})).expect("json");
        let shown = redactor.text(&printed);
        assert_eq!(
            shown.value,
            r#"{"a":"[redacted: agent token, 15 characters]"}"#
        );
        assert_eq!(
            redactor.json(&json!({"a": "quote\"d-secret"})).value,
            json!({"a": "[redacted: agent token, 14 characters]"})
        );
    }

    #[test]
    fn ordinary_prose_ids_and_hashes_are_left_alone() {
        let texts = [
            "Release notes for 2.4: the bearer of this note may pass. Basic authentication is off.",
            "commit 9fceb02d0ae598e95dc970b74767f19372d61af8 fixed it",
            "sha256 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "request 123e4567-e89b-12d3-a456-426614174000 took 12 ms",
            "a task-force-of-many-people-working-together and sk-learn-is-a-python-library",
            "the secret is out; tokens were counted; password: see the vault",
            "http://example.com:8080/path?page=2&sort=asc",
            "AKIA is a prefix; ASIA is a continent; eyJ alone is nothing",
            "{\n  \"title\": \"Release notes\",\n  \"max_tokens\": 100\n}",
        ];
        let redactor = Redactor::with_literals([("not-in-any-text-here", "configured secret")]);
        for text in texts {
            let shown = redactor.text(text);
            assert_eq!(shown.value, text);
            assert_eq!(shown.hidden, 0, "{text}");
        }
    }

    #[test]
    fn redacting_twice_changes_nothing_and_a_marker_is_never_redacted_again() {
        let redactor = Redactor::with_literals([("characters", "configured secret")]);
        let text = format!(r#"{{"token": "{GITHUB}", "note": "my key {GITHUB}"}}"#);
        let once = redactor.text(&text);
        assert_eq!(
            once.value,
            r#"{"token": "[redacted: GitHub token, 40 characters]", "note": "my key [redacted: GitHub token, 40 characters]"}"#
        );
        let twice = redactor.text(&once.value);
        assert_eq!(twice.value, once.value);
        assert_eq!(twice.hidden, 0);
        let value = redactor.json(&json!({"token": GITHUB}));
        assert_eq!(redactor.json(&value.value).value, value.value);
    }

    #[test]
    fn member_names_that_redact_to_the_same_marker_stay_two_members() {
        let other = GITHUB.replace('a', "b");
        let value = Redactor::new().json(&json!({GITHUB: 1, other.as_str(): 2}));
        let members = value.value.as_object().expect("an object");
        assert_eq!(members.len(), 2, "{members:?}");
        assert_eq!(value.hidden, 2);
    }

    #[test]
    fn sanitized_text_stays_sanitized() {
        let text = crate::untrusted_label(&format!("key {GITHUB}\u{1b}[2J"), 200);
        let shown = Redactor::new().sanitized(&text);
        assert_eq!(shown.hidden, 1);
        assert_eq!(
            shown.value.as_str(),
            "«key [redacted: GitHub token, 40 characters]⟨ESC⟩»"
        );
    }
}

//! Secrets kept off the person's views and the daemon's log, while the ledger keeps the real
//! arguments (it is the record of what was sent).
//!
//! - [`redactor_for`]: the deployment's [`Redactor`]: prompt-sanitize's well-known patterns,
//!   plus every value the configuration names: each agent's token, each stdio server's `env`
//!   values whose variable's name says secret (`GITHUB_TOKEN`, `API_KEY`, …: a path such as
//!   `MEMORY_FILE_PATH` stays visible), each HTTP server's header values (read from the environment, as the daemon sends
//!   them), and the values of the environment variables listed in `redact_env`.
//! - [`prompt`]: an approval prompt redacted around its call's real arguments: the arguments'
//!   fence is rendered again from the arguments with every secret replaced *before* the
//!   4,000-character clip (so no secret is cut in two and half shown), then the whole prompt
//!   is redacted as text.
//! - [`View`]: what the person's socket does to each answer: redacted as text (the default),
//!   left whole (`--reveal`, stated as such in the answer), or already redacted field by
//!   field (the review screen's rows, `gate ledger --json`).
//! - [`LogWriter`]: the daemon's log writer: every line, of every crate, is redacted before
//!   it is written.
//!
//! A marker says what it hides and how long it was (`[redacted: GitHub token, 40
//! characters]`), so a person can approve a call from a redacted view knowing what it
//! carries; `gate show ID --reveal` and `v` in the review screen show the real arguments.

use std::io::Write as _;
use std::sync::{Arc, LazyLock, RwLock};

use prompt_sanitize::redact::{Redacted, Redactor};
use prompt_sanitize::{MAX_ARGUMENTS_CHARS, json_arguments};
use serde_json::Value;

use crate::config::{Config, Transport};
use crate::control::{Request, Response};
use crate::gateway::Gateway;

/// What a marker calls an agent's token.
pub const AGENT_TOKEN: &str = "agent token";
/// What a marker calls a value of a stdio server's `env`.
pub const SERVER_ENV: &str = "server environment value";
/// What a marker calls a header value of an HTTP server.
pub const SERVER_HEADER: &str = "server header value";
/// What a marker calls the value of a variable listed in `redact_env`.
pub const LISTED_SECRET: &str = "value of a variable in redact_env";

/// The deployment's redactor, and what the person should know about it (a variable listed
/// in `redact_env` that is not set, so there is nothing to redact for it).
pub fn redactor_for(config: &Config) -> (Redactor, Vec<String>) {
    let mut literals: Vec<(String, &'static str)> = Vec::new();
    let mut warnings = Vec::new();
    for agent in &config.agents {
        literals.push((agent.token.clone(), AGENT_TOKEN));
    }
    for server in &config.servers {
        match &server.transport {
            Transport::Stdio(command) => {
                for (name, value) in &command.env {
                    if prompt_sanitize::redact::is_secret_key(name) {
                        literals.push((value.clone(), SERVER_ENV));
                    }
                }
            }
            Transport::Http {
                headers_from_env, ..
            } => {
                for (_, variable) in headers_from_env {
                    if let Ok(value) = std::env::var(variable) {
                        literals.push((value.clone(), SERVER_HEADER));
                        // `Bearer <token>`: the token alone is a secret too.
                        if let Some((_, credential)) = value.split_once(' ') {
                            literals.push((credential.trim().to_owned(), SERVER_HEADER));
                        }
                    }
                }
            }
        }
    }
    for variable in &config.redact_env {
        match std::env::var(variable) {
            Ok(value) if !value.is_empty() => literals.push((value, LISTED_SECRET)),
            _ => warnings.push(format!(
                "redact_env names ${variable}, which is not set in the environment of `gate serve`: there is nothing to redact for it"
            )),
        }
    }
    (Redactor::with_literals(literals), warnings)
}

/// The line a fence of JSON arguments opens with in a prompt as the shell renders it.
const FENCE_OPEN: &str = "  ┆ ```json";
/// The line it closes with.
const FENCE_CLOSE: &str = "  ┆ ```";

/// `body`'s lines behind the shell's gutter, as `shell::render_action` writes a description.
fn behind_gutter(body: &str) -> Vec<String> {
    body.split('\n')
        .map(|line| {
            let line = line.trim_end();
            if line.is_empty() {
                "  ┆".to_owned()
            } else {
                format!("  ┆ {line}")
            }
        })
        .collect()
}

/// `prompt` (an approval prompt as the shell renders it) with every secret redacted. With
/// the call's real `args`, the arguments' fence is first rendered again from them with
/// every secret replaced before the prompt's clip; a prompt whose fence is not exactly
/// those arguments' is only redacted as text.
pub fn prompt(redactor: &Redactor, prompt: &str, args: Option<&Value>) -> Redacted<String> {
    let mut hidden = 0;
    let mut text = std::borrow::Cow::Borrowed(prompt);
    if let Some(args) = args
        && let Some(fenced) = with_redacted_fence(redactor, prompt, args)
    {
        hidden += fenced.hidden;
        text = std::borrow::Cow::Owned(fenced.value);
    }
    let rest = redactor.text(&text);
    Redacted {
        value: rest.value,
        hidden: hidden + rest.hidden,
    }
}

/// `prompt` with the body of its arguments' fence rendered from `args` redacted, when the
/// fence holds exactly `args` as the prompt printed them; `None` otherwise, or when there
/// is nothing to redact in them.
fn with_redacted_fence(
    redactor: &Redactor,
    prompt: &str,
    args: &Value,
) -> Option<Redacted<String>> {
    let redacted = redactor.json(args);
    if redacted.hidden == 0 {
        return None;
    }
    let lines: Vec<&str> = prompt.split('\n').collect();
    let open = lines.iter().position(|l| *l == FENCE_OPEN)?;
    let close = open + 1 + lines[open + 1..].iter().position(|l| *l == FENCE_CLOSE)?;
    let printed = behind_gutter(json_arguments(args, MAX_ARGUMENTS_CHARS).as_str());
    if lines[open + 1..close] != printed.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        return None;
    }
    let shown = behind_gutter(json_arguments(&redacted.value, MAX_ARGUMENTS_CHARS).as_str());
    let mut out: Vec<&str> = Vec::with_capacity(lines.len() + shown.len());
    out.extend(&lines[..=open]);
    out.extend(shown.iter().map(String::as_str));
    out.extend(&lines[close..]);
    Some(Redacted {
        value: out.join("\n"),
        hidden: redacted.hidden,
    })
}

/// What the person's socket does to an answer before it leaves the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    /// Redacted as text: every answer but those below.
    Redacted,
    /// The person asked to see the secrets (`gate show --reveal`, `gate ledger --reveal`):
    /// left whole; the answer says so itself.
    Revealed,
    /// Made of JSON whose fields were redacted one by one where it was built (the review
    /// screen's rows, `gate ledger --json`): text redaction could cut across its strings.
    Structured,
}

impl View {
    /// The view `request` asks for.
    pub fn of(request: &Request) -> Self {
        match request {
            Request::Show { reveal: true, .. } => Self::Revealed,
            Request::Ledger { query } if query.reveal => Self::Revealed,
            Request::Ledger { query } if query.json => Self::Structured,
            Request::Queue | Request::StoreCounts => Self::Structured,
            _ => Self::Redacted,
        }
    }

    /// `response` as this view shows it.
    pub fn apply(self, gateway: &Gateway, response: Response) -> Response {
        match self {
            Self::Redacted => Response {
                text: gateway.redactor().text(&response.text).value,
                ..response
            },
            Self::Revealed | Self::Structured => response,
        }
    }
}

/// The redactor the daemon's log lines go through: the well-known patterns until the
/// daemon has read its configuration, then the deployment's ([`redact_logs_with`]).
static LOG_REDACTOR: LazyLock<RwLock<Arc<Redactor>>> =
    LazyLock::new(|| RwLock::new(Arc::new(Redactor::new())));

/// Redact every log line from now on with `redactor`.
pub fn redact_logs_with(redactor: Arc<Redactor>) {
    *LOG_REDACTOR.write().unwrap_or_else(|e| e.into_inner()) = redactor;
}

/// A `tracing-subscriber` writer that redacts each log line before it reaches standard
/// error. The formatter writes one event at a time; the line is held until it is complete
/// (the writer is dropped), then redacted and written in one piece.
#[derive(Debug, Default, Clone, Copy)]
pub struct LogWriter;

/// One log event on its way to standard error.
#[derive(Debug, Default)]
pub struct LogLine {
    bytes: Vec<u8>,
}

impl std::io::Write for LogLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LogLine {
    fn drop(&mut self) {
        if self.bytes.is_empty() {
            return;
        }
        let line = redact_line(&self.bytes);
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
}

/// A log line as it is written: redacted by the log's redactor.
fn redact_line(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let redactor = LOG_REDACTOR
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    redactor.text(&text).value
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogLine;

    fn make_writer(&'a self) -> Self::Writer {
        LogLine::default()
    }
}

#[cfg(test)]
mod tests {
    use prompt_sanitize::redact::marker;
    use serde_json::json;

    use super::*;

    const GITHUB: &str = "ghp_aB3dE5fG7hI9jK1lM3nO5pQ7rS9tU1vW3xY5";

    fn rendered(args: &Value) -> String {
        let body = behind_gutter(json_arguments(args, MAX_ARGUMENTS_CHARS).as_str()).join("\n");
        format!(
            "── #1 · pending · [files] · requested by «coder» ──\n  title: «Call write on files»\n  ┆ Arguments:\n{FENCE_OPEN}\n{body}\n{FENCE_CLOSE}\n  ┆\n  ┆ Endpoint: `stdio: x`"
        )
    }

    #[test]
    fn a_prompts_fence_is_rendered_again_from_the_redacted_arguments_before_its_clip() {
        // The token straddles the prompt's clip: the stored prompt shows its first half.
        let padding = "p".repeat(MAX_ARGUMENTS_CHARS - 40);
        let args = json!({"a": padding, "b": format!("key {GITHUB}"), "password": "hunter22"});
        let stored = rendered(&args);
        assert!(stored.contains("ghp_aB3d"), "the clip cut the token in two");
        let shown = prompt(&Redactor::new(), &stored, Some(&args));
        assert!(!shown.value.contains("ghp_aB3d"), "{}", shown.value);
        assert!(!shown.value.contains("hunter22"));
        assert_eq!(shown.hidden, 2);
        // What the prompt cannot show is still said to be cut.
        assert!(shown.value.contains("... (truncated)"), "{}", shown.value);
        // Without the arguments, it is redacted as text: the whole token is found.
        let whole = rendered(&json!({"b": format!("key {GITHUB}")}));
        let shown = prompt(&Redactor::new(), &whole, None);
        assert!(shown.value.contains(&marker("GitHub token", 40)));
        assert_eq!(shown.hidden, 1);
    }

    #[test]
    fn a_prompt_whose_fence_is_not_its_arguments_is_redacted_as_text_only() {
        let stored = rendered(&json!({"text": "other"}));
        let shown = prompt(
            &Redactor::new(),
            &stored,
            Some(&json!({"password": "hunter22"})),
        );
        assert_eq!(shown.value, stored);
        assert_eq!(shown.hidden, 0);
    }

    #[test]
    fn the_log_writer_redacts_each_line() {
        assert_eq!(
            redact_line(format!("token {GITHUB}\n").as_bytes()),
            format!("token {}\n", marker("GitHub token", 40))
        );
    }
}

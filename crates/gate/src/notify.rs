//! Word when work waits: the person's notifier command, run when agents stage new work.
//!
//! The command is run directly (never through a shell) with its configured arguments and
//! one more, a sentence such as `3 actions wait for you (agent coder, tool files__write)`,
//! and with `GATE_COUNT`, `GATE_AGENT`, `GATE_SERVER` and `GATE_TOOL` in its environment
//! (`GATE_EVENT=staged`). A server that is unavailable when the daemon starts is told at
//! once, unbatched (`GATE_EVENT=unavailable`, `GATE_SERVER`).
//! Those are the only fields it gets: a count, and names the gate itself checked
//! (agents' and servers' names from the configuration, tools' names as agents see them),
//! each redacted of secrets ([`crate::redaction`]: a name that is or holds a token becomes a
//! marker), then cleaned to `[A-Za-z0-9_.-]` and at most [`MAX_FIELD_CHARS`] characters.
//! Nothing an agent wrote (arguments, titles) reaches it. When the review page is on
//! ([`crate::web`]), `GATE_URL` holds the page to open (the action's own page for one
//! action, the pending list for several), and the sentence ends with it, so a person's
//! push tool can open it on a phone.
//!
//! Stages are batched: a notification waits until no new stage arrived for [`QUIET`] (or
//! the interval has passed since the first), and two notifications are at least the
//! configured interval apart, so a burst of stages is one notification with its count.
//! Fields that differ within a batch are `several`.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use prompt_sanitize::Redactor;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::config::NotifyConfig;

/// How long a batch waits for the next stage before it is sent.
pub const QUIET: Duration = Duration::from_millis(500);
/// The longest a field passed to the command may be.
pub const MAX_FIELD_CHARS: usize = 64;
/// How long the command may run before it is killed.
pub const COMMAND_DEADLINE: Duration = Duration::from_secs(10);

/// One staged action, as the notifier is told of it.
#[derive(Debug, Clone)]
struct Staged {
    agent: String,
    server: String,
    tool: String,
    /// Its ledger id.
    id: u64,
}

/// A field of a batch: one value, or several.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Field {
    One(String),
    Several,
}

impl Field {
    fn merge(&mut self, value: &str) {
        if matches!(self, Self::One(v) if v != value) {
            *self = Self::Several;
        }
    }

    fn as_str(&self) -> &str {
        match self {
            Self::One(value) => value,
            Self::Several => "several",
        }
    }
}

/// What one notification says.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Batch {
    count: usize,
    /// The first action's ledger id.
    first: u64,
    agent: Field,
    server: Field,
    tool: Field,
}

impl Batch {
    fn new(first: &Staged) -> Self {
        Self {
            count: 1,
            first: first.id,
            agent: Field::One(first.agent.clone()),
            server: Field::One(first.server.clone()),
            tool: Field::One(first.tool.clone()),
        }
    }

    fn add(&mut self, staged: &Staged) {
        self.count += 1;
        self.agent.merge(&staged.agent);
        self.server.merge(&staged.server);
        self.tool.merge(&staged.tool);
    }

    fn sentence(&self, page: Option<&str>) -> String {
        let what = if self.count == 1 {
            "1 action waits".to_owned()
        } else {
            format!("{} actions wait", self.count)
        };
        let listed = match page {
            Some(page) => format!("open {}", link(page, self)),
            None => "`gate pending` lists them".to_owned(),
        };
        format!(
            "{what} for you (agent {}, tool {}); {listed}",
            self.agent.as_str(),
            self.tool.as_str()
        )
    }
}

/// `value` cleaned to `[A-Za-z0-9_.-]` (anything else becomes `_`), at most
/// [`MAX_FIELD_CHARS`] characters.
pub fn clean_field(value: &str) -> String {
    value
        .chars()
        .take(MAX_FIELD_CHARS)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The handle the gateway tells of new work. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Notifier {
    tx: mpsc::UnboundedSender<Staged>,
    redactor: Arc<Redactor>,
    /// The command, for words that are not batched (a server unavailable).
    config: Arc<NotifyConfig>,
}

/// The review page's link for a batch: the action's own page for one, the pending list for
/// several.
fn link(page: &str, batch: &Batch) -> String {
    if batch.count == 1 {
        format!("{page}/action/{}", batch.first)
    } else {
        format!("{page}/")
    }
}

impl Notifier {
    /// Start the notifier's task (within a tokio runtime).
    pub fn start(config: NotifyConfig) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(config.clone());
        tokio::spawn(run(config, rx));
        Self {
            tx,
            redactor: Arc::new(Redactor::new()),
            config: shared,
        }
    }

    /// The same notifier, redacting its fields with `redactor` (the deployment's; the
    /// well-known patterns by default).
    pub fn redacting(mut self, redactor: Arc<Redactor>) -> Self {
        self.redactor = redactor;
        self
    }

    /// Tell the person at once that `server` is unavailable: its calls fail until it
    /// answers again (it is tried at each call).
    pub fn unavailable(&self, server: &str) {
        self.tell_of(server, "unavailable", |server| {
            format!(
                "server {server} is unavailable: its calls fail until it answers again; `gate check --servers` says why"
            )
        });
    }

    /// Tell the person at once that `server` waits for their `gate login` (`why`: its
    /// token expired and could not be refreshed, was revoked, or lacks a scope).
    pub fn login_needed(&self, server: &str, why: &str) {
        // The reason may carry what the server said (the scope it asked for): one line,
        // controls neutralized, marked as not the gate's own words.
        let why = prompt_sanitize::untrusted_label(&self.redactor.text(why).value, 300).to_string();
        self.tell_of(server, "login", move |server| {
            format!("server {server} needs your login: run `gate login {server}` ({why})")
        });
    }

    /// Run the command for `event` of `server`, with the sentence `sentence` makes of
    /// the server's cleaned name.
    fn tell_of(&self, server: &str, event: &'static str, sentence: impl FnOnce(&str) -> String) {
        let server = clean_field(&self.redactor.text(server).value);
        let sentence = sentence(&server);
        let config = self.config.clone();
        tokio::spawn(async move {
            let vars = [
                ("GATE_COUNT", "0".to_owned()),
                ("GATE_SERVER", server),
                ("GATE_EVENT", event.to_owned()),
            ];
            run_command(&config, &sentence, &vars).await;
        });
    }

    /// Tell the notifier that `agent` staged a call of `tool` on `server`.
    pub fn staged(&self, agent: &str, server: &str, tool: &str, id: u64) {
        let field = |value: &str| clean_field(&self.redactor.text(value).value);
        let _ = self.tx.send(Staged {
            agent: field(agent),
            server: field(server),
            tool: field(tool),
            id,
        });
    }
}

async fn run(config: NotifyConfig, mut rx: mpsc::UnboundedReceiver<Staged>) {
    let mut last: Option<Instant> = None;
    while let Some(first) = rx.recv().await {
        let started = Instant::now();
        let mut batch = Batch::new(&first);
        // Gather the burst: until it is quiet, or the interval has passed.
        loop {
            let cap = started + config.min_interval;
            let until = (Instant::now() + QUIET).min(cap);
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(staged)) => batch.add(&staged),
                Ok(None) | Err(_) => break,
            }
            if Instant::now() >= cap {
                break;
            }
        }
        // At most one notification per interval: what arrives meanwhile joins this one.
        if let Some(last) = last {
            let next = last + config.min_interval;
            while let Ok(Some(staged)) = tokio::time::timeout_at(next, rx.recv()).await {
                batch.add(&staged);
            }
        }
        last = Some(Instant::now());
        notify(&config, &batch).await;
    }
}

/// The variables of the daemon's environment a notifier inherits: what a desktop
/// notifier needs to find the person's session, and nothing that may hold a secret (the
/// headers of remote servers come from the daemon's environment).
pub const NOTIFIER_ENV: [&str; 9] = [
    "PATH",
    "HOME",
    "USER",
    "LANG",
    "LC_ALL",
    "DISPLAY",
    "WAYLAND_DISPLAY",
    "DBUS_SESSION_BUS_ADDRESS",
    "XDG_RUNTIME_DIR",
];

async fn notify(config: &NotifyConfig, batch: &Batch) {
    let vars = [
        ("GATE_COUNT", batch.count.to_string()),
        ("GATE_AGENT", batch.agent.as_str().to_owned()),
        ("GATE_SERVER", batch.server.as_str().to_owned()),
        ("GATE_TOOL", batch.tool.as_str().to_owned()),
        ("GATE_EVENT", "staged".to_owned()),
        (
            "GATE_URL",
            config
                .page
                .as_deref()
                .map(|p| link(p, batch))
                .unwrap_or_default(),
        ),
    ];
    if run_command(config, &batch.sentence(config.page.as_deref()), &vars).await {
        info!(
            count = batch.count,
            "notify: the person was told that work waits"
        );
    }
}

/// Run the notifier's command with `sentence` as its last argument and `vars` besides
/// [`NOTIFIER_ENV`]; whether it ran and succeeded (a failure is logged).
async fn run_command(config: &NotifyConfig, sentence: &str, vars: &[(&str, String)]) -> bool {
    let mut command = tokio::process::Command::new(&config.command);
    command.env_clear();
    for key in NOTIFIER_ENV {
        if let Some(value) = std::env::var_os(key) {
            command.env(key, value);
        }
    }
    command
        .args(&config.args)
        .arg(sentence)
        .envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(error) => {
            warn!(command = %config.command, %error, "notify: the command could not be started; check [notify] in the configuration");
            return false;
        }
    };
    match tokio::time::timeout(COMMAND_DEADLINE, child.wait()).await {
        Ok(Ok(status)) if status.success() => true,
        Ok(Ok(status)) => {
            warn!(command = %config.command, %status, "notify: the command failed");
            false
        }
        Ok(Err(error)) => {
            warn!(command = %config.command, %error, "notify: the command failed");
            false
        }
        Err(_) => {
            let _ = child.kill().await;
            warn!(command = %config.command, "notify: the command ran too long and was stopped");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staged(agent: &str, tool: &str) -> Staged {
        Staged {
            agent: agent.into(),
            server: "files".into(),
            tool: tool.into(),
            id: 7,
        }
    }

    #[test]
    fn fields_are_cleaned_and_bounded() {
        assert_eq!(clean_field("files__write"), "files__write");
        assert_eq!(clean_field("a b;$(rm -rf)\n"), "a_b___rm_-rf__");
        assert_eq!(clean_field(&"x".repeat(500)).len(), MAX_FIELD_CHARS);
    }

    #[tokio::test]
    async fn fields_are_redacted_before_they_are_cleaned() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let notifier = Notifier {
            tx,
            redactor: Arc::new(Redactor::with_literals([(
                "coder-token-0123456789",
                "agent token",
            )])),
            config: Arc::new(NotifyConfig {
                command: "true".into(),
                args: Vec::new(),
                min_interval: Duration::from_secs(1),
                page: None,
            }),
        };
        notifier.staged(
            "coder-token-0123456789",
            "files",
            "files__ghp_aB3dE5fG7hI9jK1lM3nO5pQ7rS9tU1vW3xY5",
            1,
        );
        let staged = rx.recv().await.expect("told");
        assert_eq!(staged.agent, "_redacted__agent_token__22_characters_");
        assert_eq!(
            staged.tool,
            "files___redacted__GitHub_token__40_characters_"
        );
    }

    #[test]
    fn a_batch_counts_and_says_several_where_fields_differ() {
        let mut batch = Batch::new(&staged("coder", "files__write"));
        batch.add(&staged("coder", "files__write"));
        assert_eq!(
            batch.sentence(None),
            "2 actions wait for you (agent coder, tool files__write); `gate pending` lists them"
        );
        assert_eq!(
            batch.sentence(Some("http://localhost:8790")),
            "2 actions wait for you (agent coder, tool files__write); open http://localhost:8790/"
        );
        batch.add(&staged("coder", "files__move"));
        assert_eq!(batch.tool, Field::Several);
        assert_eq!(batch.agent, Field::One("coder".into()));
        assert_eq!(batch.count, 3);
    }

    #[test]
    fn one_action_links_to_its_own_page() {
        let batch = Batch::new(&staged("coder", "files__write"));
        assert_eq!(
            batch.sentence(Some("http://localhost:8790")),
            "1 action waits for you (agent coder, tool files__write); open http://localhost:8790/action/7"
        );
    }
}

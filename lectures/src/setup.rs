//! Wiring shared by the lectures: a deterministic kernel, the issue tracker behind its
//! gatekeeper, and how an agent's calls and their answers are printed.
//!
//! A [`Desk`] keeps its records in memory, or with `--db` in a SQLite file of its own
//! (see `db.rs` for which file): the kernel's ledger, rules and lockdown latch, and the
//! action store of every driver built through [`Desk::action_store`]. Both print the same
//! transcript, apart from one line naming the file.
//!
//! This is deployment code, the part of the OS that starts drivers and hands grants to
//! agents. It never decides an action or fakes a result: decisions go through the shell,
//! calls through sessions.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use gatekeeper_core::{
    ActionResult, ActionStorage, ActionStore, CallOutcome, Session, SessionError, ToolGatekeeper,
};
use gatekeeper_issues::{IssueTracker, IssuesConfig};
use kernel::{Clock, DriverActionId, LedgerStore, MemoryLedger, Overseer, StepClock, SystemClock};
use prompt_sanitize::neutralize_controls;
use rmcp::ErrorData;
use rmcp::model::{ListToolsResult, ServerCapabilities, ServerConfig, Tool};
use serde_json::Value;
use store_sqlite::Database;

use crate::Context;

/// The lectures' clock. In memory (and so in every snapshot) it is the deterministic
/// [`StepClock`] (09:00:00, one second per reading). A run that keeps a real ledger
/// (`--db`) reads the wall clock instead: a ledger a person will query with SQL or read
/// later records when things really happened, not 1970.
pub(crate) enum LectureClock {
    /// The fixed clock of snapshot runs.
    Fixed(StepClock),
    /// The wall clock of `--db` runs.
    Wall(SystemClock),
}

impl LectureClock {
    /// The clock for a desk: the wall clock with `--db`, the fixed one otherwise.
    pub(crate) fn for_run(cx: &Context<'_>) -> Arc<Self> {
        Arc::new(if cx.db().is_some() {
            Self::Wall(SystemClock)
        } else {
            Self::Fixed(StepClock::default())
        })
    }

    /// Moves the fixed clock forward ("three hours later"). The wall clock is not moved: a
    /// real ledger records the real time, so on it the lecture's "later" is only narration.
    pub(crate) fn advance(&self, millis: u64) {
        if let Self::Fixed(clock) = self {
            clock.advance(millis);
        }
    }
}

impl Clock for LectureClock {
    fn now(&self) -> kernel::Timestamp {
        match self {
            Self::Fixed(clock) => clock.now(),
            Self::Wall(clock) => clock.now(),
        }
    }
}

/// A kernel on the lectures' clock ([`LectureClock`]), and where it keeps its records: in
/// memory, or (with `--db`) in a SQLite file of its own.
pub(crate) struct Desk {
    pub(crate) overseer: Overseer,
    pub(crate) clock: Arc<dyn Clock>,
    /// The same clock, to move it forward ("three hours later").
    pub(crate) time: Arc<LectureClock>,
    storage: Storage,
}

/// Where a desk's ledger and its drivers' action stores live.
enum Storage {
    Memory {
        /// The kernel's storage, kept so a "restarted" kernel can be opened over it.
        ledger: Arc<dyn LedgerStore>,
        /// Each driver's action storage by gatekeeper name, kept for the same reason.
        actions: Mutex<HashMap<String, Arc<dyn ActionStorage>>>,
    },
    File {
        path: PathBuf,
        database: Database,
    },
}

impl Desk {
    /// A desk in memory, or, when the context has a `--db` plan, over the plan's next
    /// file (saying so in the transcript).
    pub(crate) fn new(cx: &mut Context<'_>) -> anyhow::Result<Self> {
        let time = LectureClock::for_run(cx);
        let storage = match cx.db_mut() {
            None => Storage::Memory {
                ledger: Arc::new(MemoryLedger::new()),
                actions: Mutex::default(),
            },
            Some(plan) => {
                let (path, database) = plan.open_next()?;
                writeln!(
                    cx,
                    "  [--db: this desk's ledger, rules and action stores live in {}]",
                    visible(&path.display().to_string())
                )?;
                Storage::File { path, database }
            }
        };
        Ok(Self::over(time, storage))
    }

    /// A desk over a new SQLite file at `path`, whatever `--db` says: for a lecture about
    /// what the file itself does. Returns the desk and the file's database handle.
    pub(crate) fn on_file(cx: &mut Context<'_>, path: &Path) -> anyhow::Result<(Self, Database)> {
        let time = LectureClock::for_run(cx);
        let database = Database::open(path)?;
        let storage = Storage::File {
            path: path.to_owned(),
            database: database.clone(),
        };
        Ok((Self::over(time, storage), database))
    }

    fn over(time: Arc<LectureClock>, storage: Storage) -> Self {
        let clock: Arc<dyn Clock> = time.clone();
        let ledger = match &storage {
            Storage::Memory { ledger, .. } => ledger.clone(),
            Storage::File { database, .. } => database.ledger(),
        };
        Self {
            overseer: Overseer::with_store(ledger, clock.clone()),
            clock,
            time,
            storage,
        }
    }

    /// The database file, with `--db`.
    pub(crate) fn file(&self) -> Option<&Path> {
        match &self.storage {
            Storage::Memory { .. } => None,
            Storage::File { path, .. } => Some(path),
        }
    }

    /// The process dies and starts again: a new kernel (on the same clock) over the same
    /// records. In memory, the new kernel reads the ledger the old one wrote, and
    /// [`Desk::action_store`] reopens each driver's store. With `--db` the file is really
    /// closed and opened again: this desk's handles are dropped here, so every other
    /// handle of the old process (its shells, sessions and gatekeepers) must have been
    /// dropped before, or the old process would still count as alive and its claims would
    /// be left alone.
    pub(crate) fn restart(self) -> anyhow::Result<Self> {
        let Self {
            overseer,
            clock,
            time,
            storage,
        } = self;
        drop(overseer);
        drop(clock);
        let storage = match storage {
            memory @ Storage::Memory { .. } => memory,
            Storage::File { path, database } => {
                drop(database);
                let database = Database::open(&path)?;
                Storage::File { path, database }
            }
        };
        Ok(Self::over(time, storage))
    }

    /// The action store of the gatekeeper named `gatekeeper` (the name it registers
    /// with the kernel under). In memory: a fresh store, or after [`Desk::restart`] the
    /// store the old process used, reopened. With `--db`: the store in the desk's file,
    /// opened (which settles claims a dead process left behind).
    pub(crate) async fn action_store(&self, gatekeeper: &str) -> anyhow::Result<ActionStore> {
        match &self.storage {
            Storage::File { database, .. } => Ok(database
                .action_store(gatekeeper, self.clock.clone())
                .await?),
            Storage::Memory { actions, .. } => {
                let kept = lock(actions).get(gatekeeper).cloned();
                match kept {
                    Some(storage) => Ok(ActionStore::open(storage, self.clock.clone()).await?),
                    None => {
                        let store = ActionStore::in_memory(self.clock.clone());
                        lock(actions).insert(gatekeeper.to_owned(), store.storage().clone());
                        Ok(store)
                    }
                }
            }
        }
    }

    /// Builds the tracker's gatekeeper from `config` over its action store (see
    /// [`Desk::action_store`]), and registers it with the kernel.
    pub(crate) async fn tracker(
        &self,
        config: IssuesConfig,
        tracker: Arc<IssueTracker>,
    ) -> anyhow::Result<Arc<ToolGatekeeper>> {
        let store = self.action_store(&config.name).await?;
        let gatekeeper = config.build(tracker, store).await;
        self.overseer.register(gatekeeper.clone())?;
        Ok(gatekeeper)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Writes `lines` to the transcript, one a line: a lecture's opening paragraph.
pub(crate) fn paragraph(cx: &mut Context<'_>, lines: &[&str]) -> std::io::Result<()> {
    for line in lines {
        writeln!(cx, "{line}")?;
    }
    Ok(())
}

/// Compact JSON, as the agent wrote it, with control and invisible characters made
/// visible (the transcript is a terminal too).
pub(crate) fn json(value: &Value) -> String {
    let raw = serde_json::to_string(value).unwrap_or_else(|_| "(unprintable)".to_owned());
    visible(&raw)
}

/// Text from a service or an agent, for one line of the transcript: control and invisible
/// characters made visible, and a line break shown as `⟨U+000A⟩`, so the text cannot start a
/// line of its own (the transcript is a terminal too).
pub(crate) fn visible(text: &str) -> String {
    visible_lines(text).replace('\n', "⟨U+000A⟩")
}

/// Text from a service or an agent that keeps its lines, for a caller that indents every
/// line after the first: control and invisible characters made visible.
pub(crate) fn visible_lines(text: &str) -> String {
    neutralize_controls(text).into_string()
}

/// Writes `text` indented by `indent`, continuing lines aligned under the first.
fn indented(cx: &mut Context<'_>, lead: &str, text: &str) -> std::io::Result<()> {
    let text = visible_lines(text);
    let pad = " ".repeat(lead.chars().count());
    for (n, line) in text.lines().enumerate() {
        if n == 0 {
            writeln!(cx, "{lead}{line}")?;
        } else {
            writeln!(cx, "{pad}{line}")?;
        }
    }
    Ok(())
}

/// A fresh scratch directory for one run of lecture `name`, its own even when a lecture
/// runs twice at once in one process (the transcript tests do): `gate-<name>-<pid>-<n>`.
pub(crate) fn scratch_dir(name: &str) -> std::io::Result<std::path::PathBuf> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "gate-{name}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// The agent calls `tool` through `session`; the call and its answer are printed.
pub(crate) async fn call(
    cx: &mut Context<'_>,
    session: &Session,
    tool: &str,
    args: Value,
) -> Result<CallOutcome, SessionError> {
    writeln!(cx, "  agent → {tool} {}", json(&args)).ok();
    let outcome = session.call_tool(tool, args).await;
    match &outcome {
        Ok(CallOutcome::Data {
            result,
            observation,
        }) => {
            indented(
                cx,
                &format!("    data, observation {observation}: "),
                &result.text(),
            )
            .ok();
        }
        Ok(CallOutcome::Pending {
            action,
            ledger,
            message,
        }) => {
            writeln!(cx, "    pending: action {action}, ledger {ledger}").ok();
            writeln!(cx, "    agent is told: {}", visible(message)).ok();
        }
        Err(error) => {
            writeln!(cx, "    refused: {}", visible(&error.to_string())).ok();
        }
    }
    outcome
}

/// The agent asks where a staged call is; the answer is printed.
pub(crate) async fn poll(
    cx: &mut Context<'_>,
    session: &Session,
    action: DriverActionId,
) -> Result<ActionResult, SessionError> {
    let result = session.get_action_result(action).await;
    match &result {
        Ok(ActionResult::Applied {
            result,
            observation,
        }) => {
            indented(
                cx,
                &format!(
                    "  agent ← get_action_result({action}): applied, observation {observation}: "
                ),
                &result.text(),
            )
            .ok();
        }
        Ok(other) => {
            writeln!(
                cx,
                "  agent ← get_action_result({action}): {}: {}",
                other.status(),
                visible(other.message().unwrap_or(""))
            )
            .ok();
        }
        Err(error) => {
            writeln!(
                cx,
                "  agent ← get_action_result({action}): error: {}",
                visible(&error.to_string())
            )
            .ok();
        }
    }
    result
}

/// The tracker's issues as evidence: `[#1 Login fails, #2 ...]` by id.
pub(crate) fn issue_ids(tracker: &IssueTracker) -> String {
    let ids: Vec<String> = tracker
        .issues()
        .iter()
        .map(|i| format!("#{}", i.id))
        .collect();
    format!("[{}]", ids.join(", "))
}

/// Prints the tracker's issues as evidence, one per line.
pub(crate) fn show_issues(cx: &mut Context<'_>, tracker: &IssueTracker) -> std::io::Result<()> {
    writeln!(cx, "  the tracker's issues (read directly, as evidence):")?;
    let issues = tracker.issues();
    if issues.is_empty() {
        writeln!(cx, "    (none)")?;
    }
    for issue in issues {
        writeln!(cx, "    {}", issue.line())?;
    }
    Ok(())
}

/// Serve an MCP server (`server`, cloned for each session) over streamable HTTP on a
/// loopback port, in this process; its address (`http://127.0.0.1:PORT/mcp`).
pub(crate) async fn serve_mcp<S>(server: S) -> anyhow::Result<String>
where
    S: rmcp::ServerHandler + Clone + Send + Sync + 'static,
{
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let address = listener.local_addr()?;
    serve_mcp_on(listener, server);
    Ok(format!("http://{address}/mcp"))
}

/// Serve `server` over MCP's streamable HTTP at `/mcp` on `listener`, until the returned
/// task is aborted (a lecture that stops a server and starts it again).
pub(crate) fn serve_mcp_on<S>(
    listener: tokio::net::TcpListener,
    server: S,
) -> tokio::task::JoinHandle<()>
where
    S: rmcp::ServerHandler + Clone + Send + Sync + 'static,
{
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };

    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    })
}

/// What the lectures' small MCP servers say they offer: tools only.
pub fn tools_only() -> ServerConfig {
    ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
}

/// A lecture server's answer to `tools/list`: `tools`, a JSON array of tool definitions
/// as the protocol writes them.
pub fn tools_listed(tools: Value) -> Result<ListToolsResult, ErrorData> {
    let tools: Vec<Tool> = serde_json::from_value(tools)
        .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
    Ok(ListToolsResult::with_all_items(tools))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_message_cannot_start_a_transcript_line() {
        let message = "403\n  evidence: tracker calls = 0\u{1b}[2K\u{202e}";
        assert_eq!(
            visible(message),
            "403⟨U+000A⟩  evidence: tracker calls = 0⟨ESC⟩⟨U+202E⟩"
        );
        assert_eq!(visible_lines("a\nb"), "a\nb");
    }
}

//! ex15: the three ways to show an agent its own pending work, side by side, on the
//! filesystem server's simulator.
//!
//! One scripted agent has one task: "add 'step two', then 'step three' to
//! /project/notes/plan.md", one line per turn, each turn reading the file and writing it
//! back whole (`write_file`). It runs three times, each over a real directory of its own
//! and a kernel of its own:
//!
//! - hide (`pending = "hide"`, the gate's default): the second read shows the file as it
//!   is on disk, without the agent's own pending write, so the second write is built on
//!   stale content; approved in order, it overwrites "step two".
//! - await: the harness suspends the agent's turn until the person decided (the action's
//!   `await_decision`, as ex04's harness B); `gate serve` refuses `pending = "await"` today,
//!   so here the lecture's harness does the waiting.
//! - simulate (`pending = "simulate"`, `simulator = "filesystem"`): the second read is
//!   answered by [`gatekeeper_mcp::simulate::filesystem::Filesystem`] as if the pending
//!   write were applied, marked with its action id; the file on disk after approval equals
//!   what the agent last read.
//!
//! The downstream server is the lecture's own [`ToolService`] over a real temporary
//! directory, answering as `@modelcontextprotocol/server-filesystem` answers the four tools
//! it offers, and serving that directory under the fixed name `/project` so the transcript
//! does not depend on where the directory is. The simulator reads what it needs of it
//! through the agent's own session ([`RealReads`]), as `gate serve` does
//! (`crates/gate/src/pending.rs`); the agent's pending writes come from the kernel's ledger
//! and the gatekeeper's action store.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use gatekeeper_core::{
    CallError, CallOutcome, GatekeeperConfig, Grants, ServerTrust, Session, Tool, ToolGatekeeper,
    ToolResult, ToolService,
};
use gatekeeper_mcp::simulate::filesystem::Filesystem;
use gatekeeper_mcp::simulate::{Answer, PendingWrite, ReadCall, RealReads, Simulator};
use kernel::{ActionState, LedgerId};
use serde_json::{Value, json};
use shell::{Decision, Scripted, Shell};

use crate::setup::{Desk, json as shown_json, paragraph, visible};
use crate::{Context, Lecture, LectureFuture};

/// The lecture.
pub const LECTURE: Lecture = Lecture {
    name: "ex15",
    title: "hide, await, simulate: three ways side by side",
    summary: "one agent adds two lines to a file: hidden, its second write overwrites the first; awaited, it waits; simulated, it reads its own pending write, marked",
    run,
};

fn run<'a>(cx: &'a mut Context<'_>) -> LectureFuture<'a> {
    Box::pin(body(cx))
}

/// The name the lecture's server gives its directory.
const ROOT: &str = "/project";
/// The file the agent works on.
const PLAN: &str = "/project/notes/plan.md";
/// The gatekeeper's name (the server's name in `gate.toml`).
const SERVER: &str = "files";

/// How the agent's pending work shows, as `pending =` in a `[[server]]` table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Hide,
    Await,
    Simulate,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::Hide => "hide",
            Way::Await => "await",
            Way::Simulate => "simulate",
        }
    }
}

/// The lecture's filesystem server: a real directory, served under [`ROOT`], answering
/// `read_text_file`, `list_directory`, `get_file_info` and `write_file` with the texts of
/// `@modelcontextprotocol/server-filesystem` 2026.8.31.
struct FilesServer {
    dir: PathBuf,
}

impl FilesServer {
    /// The real path of `path`, a path under [`ROOT`].
    fn real(&self, path: &str) -> Result<PathBuf, String> {
        let rest = path
            .strip_prefix(ROOT)
            .filter(|rest| rest.is_empty() || rest.starts_with('/'))
            .ok_or_else(|| {
                format!("Access denied - path outside allowed directories: {path} not in {ROOT}")
            })?;
        if rest.split('/').any(|part| part == "..") {
            return Err(format!("Access denied - {path} leaves {ROOT}"));
        }
        Ok(self.dir.join(rest.trim_start_matches('/')))
    }

    fn answer(&self, tool: &str, args: &Value) -> Result<String, String> {
        let path = args
            .get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| "Invalid arguments: path must be a string".to_owned())?;
        let real = self.real(path)?;
        let io = |e: std::io::Error, verb: &str| {
            let code = match e.kind() {
                std::io::ErrorKind::NotFound => "ENOENT: no such file or directory",
                std::io::ErrorKind::NotADirectory => "ENOTDIR: not a directory",
                std::io::ErrorKind::IsADirectory => "EISDIR: illegal operation on a directory",
                _ => "EIO: i/o error",
            };
            format!("{code}, {verb} '{path}'")
        };
        match tool {
            "read_text_file" => std::fs::read_to_string(&real).map_err(|e| io(e, "open")),
            "list_directory" => {
                let mut entries: Vec<(String, bool)> = std::fs::read_dir(&real)
                    .map_err(|e| io(e, "scandir"))?
                    .map(|entry| {
                        let entry = entry.map_err(|e| io(e, "scandir"))?;
                        let dir = entry.file_type().map_err(|e| io(e, "scandir"))?.is_dir();
                        Ok((entry.file_name().to_string_lossy().into_owned(), dir))
                    })
                    .collect::<Result<_, String>>()?;
                // Node's readdir answers in name order (libuv sorts the entries).
                entries.sort();
                Ok(entries
                    .iter()
                    .map(|(name, dir)| format!("{} {name}", if *dir { "[DIR]" } else { "[FILE]" }))
                    .collect::<Vec<_>>()
                    .join("\n"))
            }
            "get_file_info" => {
                let meta = std::fs::metadata(&real).map_err(|e| io(e, "stat"))?;
                // Times and permissions vary from run to run; nobody in the lecture reads them.
                Ok(format!(
                    "size: {}\ncreated: (not shown by the lecture's server)\nmodified: (not shown by the lecture's server)\naccessed: (not shown by the lecture's server)\nisDirectory: {}\nisFile: {}\npermissions: (not shown)",
                    meta.len(),
                    meta.is_dir(),
                    meta.is_file()
                ))
            }
            "write_file" => {
                let content = args
                    .get("content")
                    .and_then(Value::as_str)
                    .ok_or_else(|| "Invalid arguments: content must be a string".to_owned())?;
                std::fs::write(&real, content).map_err(|e| io(e, "open"))?;
                Ok(format!("Successfully wrote to {path}"))
            }
            other => Err(format!("Unknown tool: {other}")),
        }
    }
}

#[async_trait]
impl ToolService for FilesServer {
    async fn list_tools(&self) -> Vec<Tool> {
        let path = json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]});
        let read = |name: &str, description: &str| json!({"name": name, "description": description, "inputSchema": path, "annotations": {"readOnlyHint": true}});
        Tool::catalog_from_json(json!([
            read("read_text_file", "Read a file as text."),
            read("list_directory", "List a directory's entries."),
            read("get_file_info", "A file's size, kind and times."),
            {
                "name": "write_file",
                "description": "Create a file or overwrite it with new content.",
                "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path", "content"]},
                "annotations": {"readOnlyHint": false, "destructiveHint": true, "idempotentHint": true}
            }
        ]))
        .unwrap_or_default()
    }

    async fn call(&self, tool: &str, args: &Value) -> Result<ToolResult, CallError> {
        let result = match self.answer(tool, args) {
            Ok(text) => {
                let mut result = ToolResult::from_text(text.clone());
                result.structured_content = Some(json!({ "content": text }));
                result
            }
            Err(message) => {
                let mut result = ToolResult::from_text(format!("Error: {message}"));
                result.is_error = true;
                result
            }
        };
        Ok(result)
    }
}

/// Reads of the real server a simulation needs, through the agent's own session: granted,
/// classified as reads, recorded in the ledger, as `gate serve`'s are.
struct SessionReads<'a> {
    session: &'a Session,
}

#[async_trait]
impl RealReads for SessionReads<'_> {
    async fn read(&self, tool: &str, args: Value) -> Result<ToolResult, String> {
        match self.session.call_tool(tool, args).await {
            Ok(CallOutcome::Data { result, .. }) => Ok(result),
            Ok(CallOutcome::Pending { .. }) => Err(format!("{tool} was staged, not read")),
            Err(error) => Err(format!("reading {tool} failed ({error})")),
        }
    }
}

/// One way's run: the desk, the agent's session, the gatekeeper and the directory.
struct Run {
    way: Way,
    desk: Desk,
    files: Arc<ToolGatekeeper>,
    grants: Grants,
    dir: PathBuf,
}

impl Run {
    async fn new(cx: &mut Context<'_>, way: Way) -> anyhow::Result<Self> {
        let dir = crate::setup::scratch_dir("ex15")?;
        std::fs::create_dir_all(dir.join("notes"))?;
        std::fs::write(dir.join("notes/plan.md"), "step one\n")?;
        let desk = Desk::new(cx)?;
        let server = Arc::new(FilesServer { dir: dir.clone() });
        let config = GatekeeperConfig {
            name: SERVER.to_owned(),
            server_name: "filesystem server (the lecture's)".to_owned(),
            endpoint: format!("a real temporary directory, served as {ROOT}"),
            trust: ServerTrust::Vetted,
            scope: SERVER.to_owned(),
            reads: Vec::new(),
        };
        let tools = server.list_tools().await;
        let store = desk.action_store(SERVER).await?;
        let files = Arc::new(ToolGatekeeper::new(config, tools, server, store));
        desk.overseer.register(files.clone())?;
        let mut grants = Grants::new();
        grants.introduce(
            "FILES",
            files.grant(
                &desk.overseer,
                "agent",
                &[
                    "read_text_file",
                    "list_directory",
                    "get_file_info",
                    "write_file",
                ],
            )?,
        );
        Ok(Self {
            way,
            desk,
            files,
            grants,
            dir,
        })
    }

    fn session(&self) -> anyhow::Result<&Session> {
        Ok(self.grants.session("FILES")?)
    }

    /// The agent's pending writes on the server, in staging order, as `gate serve` looks
    /// them up: its open actions in the ledger, their calls in the gatekeeper's store.
    async fn pending_writes(&self) -> anyhow::Result<Vec<PendingWrite>> {
        let mut writes = Vec::new();
        for entry in self.desk.overseer.open_actions()? {
            let Some(action) = entry.action() else {
                continue;
            };
            if &*entry.gatekeeper != SERVER || action.state != ActionState::Pending {
                continue;
            }
            let record = self
                .files
                .store()
                .get(action.driver_id)
                .await?
                .ok_or_else(|| anyhow::anyhow!("{} is in the action store", entry.id))?;
            writes.push(PendingWrite {
                action: entry.id.0,
                tool: record.tool.to_string(),
                args: (*record.args).clone(),
            });
        }
        Ok(writes)
    }

    /// The agent reads `tool` with `args`: under simulate, through the simulator when one
    /// of its pending writes touches the read; otherwise forwarded. Returns the content
    /// the agent takes as the answer (a simulated answer's second block).
    async fn read(
        &self,
        cx: &mut Context<'_>,
        tool: &str,
        args: Value,
    ) -> anyhow::Result<Result<String, String>> {
        writeln!(cx, "  agent → {tool} {}", shown_json(&args))?;
        let session = self.session()?;
        let mut note = None;
        if self.way == Way::Simulate {
            let writes = self.pending_writes().await?;
            let read = ReadCall { tool, args: &args };
            if !writes.is_empty() && Filesystem.touches(read, &writes) {
                let reads = SessionReads { session };
                match Filesystem.simulate(read, &writes, &reads).await {
                    Answer::Simulated(result) => {
                        let blocks: Vec<String> = result
                            .content
                            .iter()
                            .filter_map(|c| c.as_text().map(str::to_owned))
                            .collect();
                        let meta = result.extra.get("_meta").cloned().unwrap_or(Value::Null);
                        for line in blocks.first().map(String::as_str).unwrap_or("").lines() {
                            writeln!(cx, "    simulated: {}", visible(line))?;
                        }
                        let text = blocks.get(1).cloned().unwrap_or_default();
                        writeln!(cx, "    simulated: {text:?}")?;
                        writeln!(cx, "    _meta: {}", shown_json(&meta))?;
                        return Ok(if result.is_error { Err(text) } else { Ok(text) });
                    }
                    Answer::Cannot { reason, actions } => {
                        note = Some(format!("not simulated ({actions:?}): {reason}"));
                    }
                    Answer::Untouched => {}
                }
            }
        }
        if let Some(note) = note {
            writeln!(cx, "    {}", visible(&note))?;
        }
        match session.call_tool(tool, args).await {
            Ok(CallOutcome::Data { result, .. }) => {
                let text = result.text();
                writeln!(
                    cx,
                    "    {}: {text:?}",
                    if result.is_error { "error" } else { "data" }
                )?;
                Ok(if result.is_error { Err(text) } else { Ok(text) })
            }
            Ok(CallOutcome::Pending { .. }) => anyhow::bail!("{tool} is classified as a read"),
            Err(error) => Err(error.into()),
        }
    }

    /// The agent writes `content` to `path`: staged; its ledger id.
    async fn write(
        &self,
        cx: &mut Context<'_>,
        path: &str,
        content: &str,
    ) -> anyhow::Result<LedgerId> {
        let args = json!({"path": path, "content": content});
        writeln!(cx, "  agent → write_file {}", shown_json(&args))?;
        match self.session()?.call_tool("write_file", args).await {
            Ok(CallOutcome::Pending {
                ledger, message, ..
            }) => {
                writeln!(cx, "    staged as {ledger}")?;
                writeln!(cx, "    agent is told: {}", visible(&message))?;
                Ok(ledger)
            }
            Ok(CallOutcome::Data { .. }) => anyhow::bail!("write_file is classified as a write"),
            Err(error) => Err(error.into()),
        }
    }

    /// Whether the harness suspends the agent's turn after staging `ledger`: under await,
    /// when the kernel's record of the action carries the driver's `await_decision`.
    fn must_wait(&self, ledger: LedgerId) -> anyhow::Result<bool> {
        if self.way != Way::Await {
            return Ok(false);
        }
        let entry = self
            .desk
            .overseer
            .entry(ledger)?
            .ok_or_else(|| anyhow::anyhow!("the ledger holds {ledger}"))?;
        Ok(entry.action().is_some_and(|a| a.description.await_decision))
    }

    fn on_disk(&self) -> String {
        std::fs::read_to_string(self.dir.join("notes/plan.md"))
            .unwrap_or_else(|e| format!("(unreadable: {})", e.kind()))
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What one way ended with.
struct Outcome {
    way: Way,
    second_read: String,
    staged: usize,
    suspended: usize,
    last_read: String,
    on_disk: String,
}

/// The agent's task under `way`, with the person reviewing when the harness lets them.
async fn play(cx: &mut Context<'_>, way: Way) -> anyhow::Result<Outcome> {
    let run = Run::new(cx, way).await?;
    let ana = Shell::new(run.desk.overseer.clone(), "ana");
    let mut staged = Vec::new();
    let mut suspended = 0;
    let mut reads = Vec::new();
    for (turn, line) in [(1, "step two"), (2, "step three")] {
        writeln!(cx, "  -- turn {turn}: add {line:?}")?;
        let now = run
            .read(cx, "read_text_file", json!({ "path": PLAN }))
            .await?;
        let now = now.unwrap_or_default();
        reads.push(now.clone());
        let ledger = run.write(cx, PLAN, &format!("{now}{line}\n")).await?;
        staged.push(ledger);
        if run.must_wait(ledger)? {
            suspended += 1;
            writeln!(
                cx,
                "  harness: {ledger} says await_decision; the agent's turn is suspended until a person decides"
            )?;
            cx.review(&ana, Scripted::by_id([(ledger, Decision::Approve)]))
                .await?;
            writeln!(cx, "  harness: the agent resumes")?;
        } else {
            writeln!(cx, "  harness: the agent goes on at once")?;
        }
    }
    writeln!(cx, "  -- the agent checks its work")?;
    let last = run
        .read(cx, "read_text_file", json!({ "path": PLAN }))
        .await?;
    let last_read = last.unwrap_or_else(|e| e);
    run.read(cx, "list_directory", json!({ "path": "/project/notes" }))
        .await?
        .ok();
    if !run.desk.overseer.open_actions()?.is_empty() {
        writeln!(cx, "  -- later, the person reviews the batch, in order")?;
        let script = Scripted::by_id(staged.iter().map(|id| (*id, Decision::Approve)));
        cx.review(&ana, script).await?;
    }
    run.desk.overseer.settle().await;
    let on_disk = run.on_disk();
    writeln!(
        cx,
        "  notes/plan.md on disk (read directly, as evidence): {on_disk:?}"
    )?;
    Ok(Outcome {
        way,
        second_read: reads.get(1).cloned().unwrap_or_default(),
        staged: staged.len(),
        suspended,
        last_read,
        on_disk,
    })
}

async fn body(cx: &mut Context<'_>) -> anyhow::Result<()> {
    paragraph(
        cx,
        &[
            "The agent is asked to add \"step two\", then \"step three\" to /project/notes/plan.md, one",
            "line per turn: each turn it reads the file and writes it back whole. Its writes wait for a",
            "person; what it reads meanwhile depends on the server's `pending =` way. The server is the",
            "lecture's own over a real temporary directory (served as /project), answering as",
            "@modelcontextprotocol/server-filesystem does; under simulate, the gate's filesystem",
            "simulator answers the agent's reads, reading the real files through the agent's session.",
        ],
    )?;
    let mut outcomes = Vec::new();
    for (way, what) in [
        (
            Way::Hide,
            "pending = \"hide\" (the default): reads show the server as it is",
        ),
        (
            Way::Await,
            "the harness suspends the agent's turn until the person decides",
        ),
        (
            Way::Simulate,
            "pending = \"simulate\": reads show the agent's own pending writes, marked",
        ),
    ] {
        cx.section(&format!("{}: {what}", way.name()))?;
        if way == Way::Await {
            paragraph(
                cx,
                &[
                    "  (`gate serve` refuses pending = \"await\" today: it is to be built on MCP's tasks,",
                    "  issue 40 item 5. Here the lecture's harness does the waiting, as ex04's harness B.)",
                ],
            )?;
        }
        outcomes.push(play(cx, way).await?);
    }

    cx.section("Side by side")?;
    writeln!(
        cx,
        "  way       turn 2 read               writes  suspended  on disk after approval"
    )?;
    for o in &outcomes {
        writeln!(
            cx,
            "  {:<9} {:<25} {:<7} {:<10} {:?}",
            o.way.name(),
            format!("{:?}", o.second_read),
            o.staged,
            o.suspended,
            o.on_disk
        )?;
    }
    cx.section("Evidence")?;
    let wanted = "step one\nstep two\nstep three\n";
    for o in &outcomes {
        cx.evidence(
            &format!("{}: notes/plan.md has every step", o.way.name()),
            if o.on_disk == wanted {
                "yes".to_owned()
            } else {
                format!("no, {:?}", o.on_disk)
            },
        )?;
        cx.evidence(
            &format!("{}: the disk equals what the agent last read", o.way.name()),
            if o.on_disk == o.last_read {
                "yes"
            } else {
                "no"
            },
        )?;
    }
    Ok(())
}

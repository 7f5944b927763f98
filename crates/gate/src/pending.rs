//! How an agent's own pending writes show in its reads of a server (`pending` in a
//! `[[server]]` table).
//!
//! - `"hide"` (the default): a read is forwarded as it is; the staged write's answer tells
//!   the agent that later reads will not show it.
//! - `"simulate"` (with `simulator = "filesystem"` or `"memory"`): a read that one of the
//!   agent's own pending writes on that server may change is answered as if they had been
//!   applied, in staging order, with a first block naming the pending action ids
//!   ([`gatekeeper_mcp::simulate`]); where the simulator cannot show them exactly, the read
//!   answers the server's real result after a note that says why. A read nothing pending
//!   touches is forwarded exactly as with `"hide"`. Another agent's pending writes never
//!   show.
//! - `"await"` (the lectures' third way: the agent waits for the decision) is refused by
//!   `gate check` for now: the protocol's own pending handle (task-augmented calls) is
//!   what it will be built on.
//!
//! Seed 003's pitfalls, on these servers: when a write is staged, the simulator says what
//! it acts on as the agent's simulation showed it (a file's content hash, an entity's
//! fingerprint, `absent`) and which of the agent's earlier pending writes it is built on
//! ([`gatekeeper_mcp::simulate::Basis`]); the gate keeps that per action (in the data
//! directory) and passes `built_on` to the kernel as `depends_on`, beside the actions the
//! agent's simulated reads showed ([`gatekeeper_core::Session::note_shown`]). Before
//! approval ([`check`]) it works the basis out again with real reads through the driver
//! (not the agent's session: nothing is handed to the agent or recorded as its read): a
//! target that changed (outside the gate, or because what it was built on was rejected) makes
//! the write STALE, shown by `gate pending`, `gate show` and the review screen, and approving
//! it needs `gate approve ID --stale-seen`. Rejecting a write flags what depends on it (the
//! kernel's `blocked_by`); `gate reject ID --cascade` also rejects the writes built on it.
//!
//! At start, and whenever a person accepts a server's catalog, the simulator is held to
//! the accepted catalog ([`gatekeeper_mcp::simulate::check_catalog`]); one that no longer
//! matches is disabled whole (reads are forwarded as with `"hide"`), logged, and shown by
//! `gate catalog`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use gatekeeper_core::{
    CallOutcome, Content, Session, SessionError, ToolGatekeeper, ToolResult, ToolService as _,
};
use gatekeeper_mcp::simulate::{
    self, Answer, Basis, PendingWrite, ReadCall, RealReads, Simulator, actions_phrase,
};
use gatekeeper_mcp::{Catalog, canonical_json};
use kernel::{ActionState, DriverActionId, LedgerId, Overseer};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::Mutex;
use tracing::{info, warn};

/// A server's `pending` mode, as `gate.toml` chose it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum PendingMode {
    /// Reads show the server as it is.
    #[default]
    Hide,
    /// Reads show the agent's own pending writes, through the named simulator.
    Simulate(String),
}

/// Check `pending` and `simulator` of server `name` (started as `command`, when it is a
/// stdio server, to suggest a simulator). `Err` says what to write instead; the second
/// field is `true` when it is about `simulator` rather than `pending`.
pub fn mode(
    name: &str,
    pending: Option<&str>,
    simulator: Option<&str>,
    command: Option<(&str, &[String])>,
) -> Result<PendingMode, (String, bool)> {
    let known = simulate::NAMES.join("\", \"");
    match pending.unwrap_or("hide") {
        "hide" => match simulator {
            None => Ok(PendingMode::Hide),
            Some(_) => Err((
                format!(
                    "server {name:?}: simulator is used only with pending = \"simulate\"; add that, or remove simulator"
                ),
                true,
            )),
        },
        "simulate" => match simulator {
            Some(chosen) if simulate::by_name(chosen).is_some() => {
                Ok(PendingMode::Simulate(chosen.to_owned()))
            }
            Some(chosen) => Err((
                format!(
                    "server {name:?}: the gate has no simulator {chosen:?}; it has \"{known}\" (for @modelcontextprotocol/server-filesystem and server-memory); for another server write pending = \"hide\""
                ),
                true,
            )),
            None => Err((
                match command.and_then(|(program, args)| simulate::recognize(program, args)) {
                    Some(fits) => format!(
                        "server {name:?}: pending = \"simulate\" needs the simulator that knows this server; it looks like one the gate has: write simulator = \"{fits}\""
                    ),
                    None => format!(
                        "server {name:?}: pending = \"simulate\" needs a simulator that knows this server, and the gate has them only for @modelcontextprotocol/server-filesystem (simulator = \"filesystem\") and server-memory (simulator = \"memory\"); write simulator = \"...\" for one of those, or pending = \"hide\""
                    ),
                },
                false,
            )),
        },
        "await" => Err((
            format!(
                "server {name:?}: pending = \"await\" (the agent waits for the person's decision before it reads on) is not built into the gate yet; write pending = \"hide\" (the default; reads show the server as it is) or pending = \"simulate\" (reads show the agent's own pending writes, for the filesystem and memory servers)"
            ),
            false,
        )),
        other => Err((
            format!(
                "server {name:?}: pending = {other:?} is not a mode; write pending = \"hide\" or pending = \"simulate\""
            ),
            false,
        )),
    }
}

/// What the gate recorded of one staged write's basis.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Recorded {
    /// What the write acts on and is built on, as the agent's simulation showed it.
    Basis(Basis),
    /// The simulator could not tell, and why.
    Unknown(String),
}

/// One server's simulation, as the gateway holds it.
pub struct Pending {
    simulator: Option<Arc<dyn Simulator>>,
    /// Why the simulator is off although the configuration asks for it.
    disabled: RwLock<Option<String>>,
    /// Each open staged write's basis, by ledger id.
    bases: std::sync::Mutex<BTreeMap<u64, Recorded>>,
    /// Where the bases are kept across restarts, or `None` for memory only.
    file: Option<PathBuf>,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("simulator", &self.simulator.as_ref().map(|s| s.name()))
            .field("disabled", &self.disabled())
            .finish()
    }
}

impl Pending {
    /// Reads show the server as it is.
    pub fn hide() -> Self {
        Self {
            simulator: None,
            disabled: RwLock::new(None),
            bases: std::sync::Mutex::default(),
            file: None,
        }
    }

    /// Keep the bases of staged writes in `file` (read now, written at every staging), so a
    /// restart still knows what each open write was staged against.
    pub fn kept_in(mut self, file: PathBuf) -> Self {
        if self.simulator.is_some() {
            match std::fs::read(&file) {
                Ok(bytes) => match serde_json::from_slice(&bytes) {
                    Ok(bases) => *self.lock_bases() = bases,
                    Err(error) => {
                        warn!(file = %file.display(), %error, "pending.bases: unreadable, starting without them (open writes are shown as not checked for staleness)")
                    }
                },
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => {
                    warn!(file = %file.display(), %error, "pending.bases: unreadable, starting without them (open writes are shown as not checked for staleness)")
                }
            }
        }
        self.file = Some(file);
        self
    }

    fn lock_bases(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Recorded>> {
        self.bases.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Record the basis of the write staged as `ledger`, dropping those `open` says are no
    /// longer open, and keep them in the file when there is one.
    pub fn record(&self, ledger: u64, recorded: Recorded, open: impl Fn(u64) -> bool) {
        let snapshot = {
            let mut bases = self.lock_bases();
            bases.retain(|id, _| open(*id));
            bases.insert(ledger, recorded);
            bases.clone()
        };
        let Some(file) = &self.file else {
            return;
        };
        let write = || -> std::io::Result<()> {
            if let Some(dir) = file.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let partial = file.with_extension("json.partial");
            std::fs::write(
                &partial,
                serde_json::to_vec(&snapshot).map_err(std::io::Error::other)?,
            )?;
            std::fs::rename(&partial, file)
        };
        if let Err(error) = write() {
            warn!(file = %file.display(), %error, "pending.bases: not kept (a restart will show these writes as not checked for staleness)");
        }
    }

    /// The recorded basis of the write staged as `ledger`, if any.
    pub fn recorded(&self, ledger: u64) -> Option<Recorded> {
        self.lock_bases().get(&ledger).cloned()
    }

    /// The writes among `open` built on `root`, directly or through one another, ascending.
    pub fn built_on(&self, root: u64, open: &[u64]) -> Vec<u64> {
        let bases = self.lock_bases();
        let mut roots: BTreeSet<u64> = BTreeSet::from([root]);
        let mut found = Vec::new();
        for id in open.iter().copied().filter(|id| *id > root) {
            if let Some(Recorded::Basis(basis)) = bases.get(&id)
                && basis.built_on.iter().any(|b| roots.contains(b))
            {
                roots.insert(id);
                found.push(id);
            }
        }
        found
    }

    /// Server `server`'s simulation for `mode`, held to its accepted `catalog`.
    pub fn new(server: &str, mode: &PendingMode, catalog: &Catalog) -> Self {
        let simulator: Option<Arc<dyn Simulator>> = match mode {
            PendingMode::Hide => None,
            PendingMode::Simulate(name) => simulate::by_name(name).map(Arc::from),
        };
        let pending = Self {
            simulator,
            disabled: RwLock::new(None),
            bases: std::sync::Mutex::default(),
            file: None,
        };
        pending.check(server, catalog);
        pending
    }

    /// Hold the simulator to `catalog` (at start, and when a person accepts a catalog):
    /// one that does not match is disabled whole, with the reason logged.
    pub fn check(&self, server: &str, catalog: &Catalog) {
        let Some(simulator) = &self.simulator else {
            return;
        };
        let verdict = simulate::check_catalog(simulator.as_ref(), |name| {
            catalog.get(name).map(|tool| &tool.raw)
        });
        match &verdict {
            Ok(()) => {
                info!(%server, simulator = simulator.name(), "pending.simulate: on");
            }
            Err(reason) => {
                warn!(%server, simulator = simulator.name(), %reason, "pending.simulate: disabled");
            }
        }
        *self.disabled.write().unwrap_or_else(|p| p.into_inner()) = verdict.err();
    }

    fn disabled(&self) -> Option<String> {
        self.disabled
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The simulator, when it is on.
    pub fn active(&self) -> Option<&Arc<dyn Simulator>> {
        self.simulator
            .as_ref()
            .filter(|_| self.disabled().is_none())
    }

    /// Whether a staged call of `tool` will show in the agent's reads.
    pub fn shows(&self, tool: &str) -> bool {
        self.active().is_some_and(|s| s.models(tool))
    }

    /// For the person (`gate catalog`): how this server's pending writes show in reads.
    pub fn report(&self) -> Option<String> {
        let simulator = self.simulator.as_ref()?;
        Some(match self.disabled() {
            None => format!(
                "  pending = \"simulate\": the {} simulator is on (agents' reads show their own pending writes, marked)",
                simulator.name()
            ),
            Some(reason) => format!("  pending = \"simulate\" is OFF: {reason}"),
        })
    }
}

/// What the gateway does with a read, once pending writes are considered.
#[derive(Debug)]
pub enum BeforeRead {
    /// Forward it, after this note when there is one.
    Forward(Option<String>),
    /// Answer it with this simulated result.
    Answer(ToolResult),
}

/// Agent `agent`'s pending writes on `server`, in staging order: the actions still waiting
/// for a person (pending, or failed before anything was sent and waiting again).
async fn pending_writes(
    overseer: &Overseer,
    gatekeeper: &ToolGatekeeper,
    server: &str,
    agent: &str,
) -> Result<Vec<PendingWrite>, String> {
    let open = overseer
        .open_actions()
        .map_err(|e| format!("the ledger could not be read ({e})"))?;
    let mut writes = Vec::new();
    for entry in open {
        if &*entry.caller != agent || &*entry.gatekeeper != server {
            continue;
        }
        let Some(action) = entry.action() else {
            continue;
        };
        let waiting = action.state == ActionState::Pending
            || (action.state == ActionState::Failed
                && action.failure.as_ref().is_some_and(|f| f.retryable));
        if !waiting {
            continue;
        }
        let record = gatekeeper
            .store()
            .get(action.driver_id)
            .await
            .map_err(|e| format!("the action store could not be read ({e})"))?
            .ok_or_else(|| format!("action {} is not in the server's action store", entry.id.0))?;
        writes.push(PendingWrite {
            action: entry.id.0,
            tool: record.tool.to_string(),
            args: (*record.args).clone(),
        });
    }
    Ok(writes)
}

/// Reads of the real server through the agent's own session: granted, classified as reads,
/// recorded, each made once per simulation.
struct SessionReads<'a> {
    session: &'a Session,
    gatekeeper: &'a ToolGatekeeper,
    sensitive: &'a [String],
    asked: &'a str,
    made: Mutex<HashMap<String, ToolResult>>,
}

#[async_trait]
impl RealReads for SessionReads<'_> {
    async fn read(&self, tool: &str, args: Value) -> Result<ToolResult, String> {
        if tool != self.asked && self.sensitive.iter().any(|s| s == tool) {
            return Err(format!(
                "showing them needs a read of {tool}, which the person marked sensitive on this server"
            ));
        }
        if !self
            .gatekeeper
            .classification(tool)
            .is_some_and(|c| c.is_read())
        {
            return Err(format!(
                "showing them needs {tool}, which the gate does not treat as a read on this server"
            ));
        }
        let key = format!("{tool} {}", canonical_json(&args));
        if let Some(made) = self.made.lock().await.get(&key) {
            return Ok(made.clone());
        }
        match self.session.call_tool(tool, args).await {
            Ok(CallOutcome::Data { result, .. }) => {
                self.made.lock().await.insert(key, result.clone());
                Ok(result)
            }
            Ok(CallOutcome::Pending { .. }) => Err(format!(
                "showing them needs {tool}, which the gate staged instead of reading"
            )),
            Err(SessionError::NotGranted { .. }) => Err(format!(
                "showing them needs {tool}, which your grant does not include"
            )),
            Err(error) => Err(format!("reading {tool} failed ({error})")),
        }
    }
}

/// What agent `agent`'s read of `tool` with `args` on `server` shows of its pending
/// writes: forwarded as it is (nothing pending touches it, or the simulator is off), with
/// a note (it cannot be simulated, and why), or answered by the simulator.
pub async fn before_read(
    downstream: &crate::gateway::Downstream,
    overseer: &Overseer,
    session: &Session,
    agent: &str,
    tool: &str,
    args: &Value,
) -> BeforeRead {
    let (pending, gatekeeper) = (&downstream.pending, downstream.gatekeeper.as_ref());
    let (server, sensitive) = (
        downstream.name.as_str(),
        downstream.sensitive_reads.as_slice(),
    );
    let Some(simulator) = pending.active() else {
        return BeforeRead::Forward(None);
    };
    let writes = match pending_writes(overseer, gatekeeper, server, agent).await {
        Ok(writes) => writes,
        Err(reason) => {
            return BeforeRead::Forward(Some(format!(
                "Not simulated: the gate could not look up your pending writes on this server ({reason}). What follows is the server's answer as things are now."
            )));
        }
    };
    let read = ReadCall { tool, args };
    if writes.is_empty() || !simulator.touches(read, &writes) {
        return BeforeRead::Forward(None);
    }
    let reads = SessionReads {
        session,
        gatekeeper,
        sensitive,
        asked: tool,
        made: Mutex::new(HashMap::new()),
    };
    match simulator.simulate(read, &writes, &reads).await {
        Answer::Untouched => BeforeRead::Forward(None),
        Answer::Simulated(result) => {
            // The agent now sees these pending writes as done: what it stages next
            // depends on them (the kernel's `depends_on`).
            let shown: Vec<u64> = result
                .extra
                .get("_meta")
                .and_then(|m| m.get(simulate::META_KEY))
                .and_then(|p| p.get("actions"))
                .and_then(Value::as_array)
                .map(|ids| ids.iter().filter_map(Value::as_u64).collect())
                .unwrap_or_default();
            session.note_shown(&driver_ids(overseer, &shown));
            BeforeRead::Answer(result)
        }
        Answer::Cannot { reason, actions } => {
            BeforeRead::Forward(Some(cannot_note(&reason, &actions)))
        }
    }
}

/// The driver ids of the ledger's actions `ids` (those it knows).
pub fn driver_ids(overseer: &Overseer, ids: &[u64]) -> Vec<DriverActionId> {
    ids.iter()
        .filter_map(|id| overseer.entry(LedgerId(*id)).ok().flatten())
        .filter_map(|entry| entry.action().map(|a| a.driver_id))
        .collect()
}

/// Reads of the real server through its driver, for the gate's own checks: nothing read
/// is handed to an agent or recorded as an agent's read. Only the server's reads, never
/// one the person marked sensitive, each under the server's deadline.
struct DriverReads<'a> {
    downstream: &'a crate::gateway::Downstream,
}

#[async_trait]
impl RealReads for DriverReads<'_> {
    async fn read(&self, tool: &str, args: Value) -> Result<ToolResult, String> {
        let gatekeeper = &self.downstream.gatekeeper;
        if self.downstream.sensitive_reads.iter().any(|s| s == tool) {
            return Err(format!(
                "checking it needs a read of {tool}, which the person marked sensitive on this server"
            ));
        }
        if !gatekeeper.classification(tool).is_some_and(|c| c.is_read()) {
            return Err(format!(
                "checking it needs {tool}, which the gate does not treat as a read on this server"
            ));
        }
        let deadline = gatekeeper.call_deadline();
        let definition = gatekeeper.tool(tool).and_then(|t| t.definition);
        let call = self
            .downstream
            .server
            .call_defined(tool, definition.as_deref(), &args);
        match tokio::time::timeout(deadline, call).await {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(error)) => Err(format!("reading {tool} failed ({error})")),
            Err(_) => Err(format!("the server did not answer {tool} in time")),
        }
    }
}

/// The basis of agent `agent`'s write of `tool` with `args` on `downstream`, about to be
/// staged after its pending writes there; `None` when its server does not simulate it.
pub async fn before_stage(
    downstream: &crate::gateway::Downstream,
    overseer: &Overseer,
    agent: &str,
    tool: &str,
    args: &Value,
) -> Option<Recorded> {
    let simulator = downstream.pending.active()?;
    if !simulator.models(tool) {
        return None;
    }
    let before =
        match pending_writes(overseer, &downstream.gatekeeper, &downstream.name, agent).await {
            Ok(before) => before,
            Err(reason) => return Some(Recorded::Unknown(reason)),
        };
    let write = PendingWrite {
        action: u64::MAX,
        tool: tool.to_owned(),
        args: args.clone(),
    };
    let reads = DriverReads { downstream };
    Some(match simulator.basis(&write, &before, &reads).await {
        Ok(basis) => Recorded::Basis(basis),
        Err(reason) => Recorded::Unknown(reason),
    })
}

/// Whether a staged write still finds what it was staged against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// Not a write the gate simulates, or none was recorded (staged through another gate).
    Untracked,
    /// Everything it acts on is as the agent's simulation showed it when it was staged.
    Fresh,
    /// Something it acts on changed since it was staged: each change, in the person's words.
    Stale(Vec<String>),
    /// The gate cannot tell, and why.
    Unknown(String),
}

impl Check {
    /// The flag a person sees before deciding action `id`, if any.
    pub fn flag(&self, id: u64) -> Option<String> {
        match self {
            Check::Untracked | Check::Fresh => None,
            Check::Stale(changes) => Some(format!(
                "STALE: {} (it changed since the agent staged this write); check it, then approve with `gate approve {id} --stale-seen`, or reject it",
                changes.join("; ")
            )),
            Check::Unknown(reason) => Some(format!(
                "not checked for staleness: {reason}; approving it needs `gate approve {id} --stale-seen`"
            )),
        }
    }
}

/// Check the open write `ledger` against the real server now: the pending writes its
/// agent staged before it are applied over real reads (those already applied are real by
/// now), and what it acts on is compared with what was recorded when it was staged.
pub async fn check(
    downstream: &crate::gateway::Downstream,
    overseer: &Overseer,
    ledger: LedgerId,
) -> Check {
    let Some(recorded) = downstream.pending.recorded(ledger.0) else {
        return Check::Untracked;
    };
    let then = match recorded {
        Recorded::Basis(basis) => basis,
        Recorded::Unknown(reason) => {
            return Check::Unknown(format!(
                "when it was staged the gate could not tell what it acts on ({reason})"
            ));
        }
    };
    let Some(simulator) = downstream.pending.active() else {
        return Check::Unknown(
            "the server's simulator is off (`gate catalog` says why)".to_owned(),
        );
    };
    let entry = match overseer.entry(ledger) {
        Ok(Some(entry)) => entry,
        Ok(None) => return Check::Untracked,
        Err(error) => return Check::Unknown(format!("the ledger could not be read ({error})")),
    };
    let Some(action) = entry.action().filter(|a| a.is_open()) else {
        return Check::Untracked;
    };
    let writes = match pending_writes(
        overseer,
        &downstream.gatekeeper,
        &downstream.name,
        &entry.caller,
    )
    .await
    {
        Ok(writes) => writes,
        Err(reason) => return Check::Unknown(reason),
    };
    let before: Vec<PendingWrite> = writes
        .iter()
        .filter(|w| w.action < ledger.0)
        .cloned()
        .collect();
    let record = match downstream.gatekeeper.store().get(action.driver_id).await {
        Ok(Some(record)) => record,
        Ok(None) => return Check::Untracked,
        Err(error) => {
            return Check::Unknown(format!("the action store could not be read ({error})"));
        }
    };
    let write = PendingWrite {
        action: ledger.0,
        tool: record.tool.to_string(),
        args: (*record.args).clone(),
    };
    match simulator
        .basis(&write, &before, &DriverReads { downstream })
        .await
    {
        Ok(now) => {
            let changes = now.changes_since(&then);
            if changes.is_empty() {
                Check::Fresh
            } else {
                Check::Stale(changes)
            }
        }
        Err(reason) => Check::Unknown(reason),
    }
}

/// The note before a real answer that pending writes may change but the gate cannot show.
pub fn cannot_note(reason: &str, actions: &[u64]) -> String {
    let them = if actions.len() == 1 { "it" } else { "them" };
    format!(
        "Not simulated: your pending {} may change what this read shows, but the gate cannot show {them} exactly: {reason}. What follows is the server's answer as things are now, without {them}.",
        actions_phrase(actions)
    )
}

/// What the gateway tells an agent when it stages a write that its later reads will show.
pub fn staged_and_shown(message: &str) -> String {
    message.replace(
        "so later reads will not show this change",
        "but your later reads of this server show this change as if it were applied, marked with its action id",
    )
}

/// The text of a simulated result's first block (its note).
pub fn note_of(result: &ToolResult) -> Option<&str> {
    match result.content.first()? {
        Content::Text { text } => Some(text),
        Content::Other(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_checked_with_what_to_write_instead() {
        assert_eq!(mode("f", None, None, None), Ok(PendingMode::Hide));
        assert_eq!(
            mode("f", Some("simulate"), Some("filesystem"), None),
            Ok(PendingMode::Simulate("filesystem".into()))
        );
        let args = [
            "-y".to_owned(),
            "@modelcontextprotocol/server-memory".to_owned(),
        ];
        let (message, _) = mode("m", Some("simulate"), None, Some(("npx", &args))).unwrap_err();
        assert!(
            message.contains("write simulator = \"memory\""),
            "{message}"
        );
        let (message, _) =
            mode("g", Some("simulate"), None, Some(("git-server", &[]))).unwrap_err();
        assert!(message.contains("or pending = \"hide\""), "{message}");
        let (message, on_simulator) = mode("g", Some("simulate"), Some("git"), None).unwrap_err();
        assert!(
            on_simulator && message.contains("no simulator \"git\""),
            "{message}"
        );
        let (message, _) = mode("f", Some("await"), None, None).unwrap_err();
        assert!(message.contains("not built into the gate yet"), "{message}");
        assert!(mode("f", Some("later"), None, None).is_err());
        assert!(mode("f", None, Some("memory"), None).is_err());
    }

    #[test]
    fn the_staged_message_says_the_write_will_show() {
        let message =
            crate::gateway::staged_message("files__write_file", kernel::LedgerId(3), false);
        let shown = staged_and_shown(&message);
        assert_ne!(
            shown, message,
            "the gateway's wording changed: update staged_and_shown"
        );
        assert!(shown.contains("your later reads of this server show this change"));
    }
}

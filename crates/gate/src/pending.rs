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
//! At start, and whenever a person accepts a server's catalog, the simulator is held to
//! the accepted catalog ([`gatekeeper_mcp::simulate::check_catalog`]); one that no longer
//! matches is disabled whole (reads are forwarded as with `"hide"`), logged, and shown by
//! `gate catalog`.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use gatekeeper_core::{CallOutcome, Content, Session, SessionError, ToolGatekeeper, ToolResult};
use gatekeeper_mcp::simulate::{
    self, Answer, PendingWrite, ReadCall, RealReads, Simulator, actions_phrase,
};
use gatekeeper_mcp::{Catalog, canonical_json};
use kernel::{ActionState, Overseer};
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

/// One server's simulation, as the gateway holds it.
pub struct Pending {
    simulator: Option<Arc<dyn Simulator>>,
    /// Why the simulator is off although the configuration asks for it.
    disabled: RwLock<Option<String>>,
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
        }
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
        Answer::Simulated(result) => BeforeRead::Answer(result),
        Answer::Cannot { reason, actions } => {
            BeforeRead::Forward(Some(cannot_note(&reason, &actions)))
        }
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

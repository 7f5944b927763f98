//! Per-agent lockdown: the latch a sensitive read sets on one agent's workspace, and the
//! gatekeeper wrapper that makes every apply (a person's or the kernel's drain) respect it.
//!
//! A sensitive read latches its agent's workspace before the read is forwarded (durably,
//! one file per agent, when a directory is set). From then on nothing that agent staged
//! is sent, whoever approves it: [`Guarded`] stands between the kernel and each server's
//! [`ToolGatekeeper`] and refuses, before anything is claimed or sent, the apply of an
//! action whose agent is locked down. The kernel learns of it as an ordinary final
//! failure ("not sent"), so its drain moves on, and the ledger says why.
//!
//! Latching and applying exclude each other per agent: a latch waits for that agent's
//! applies in flight to end, and an apply checks the latch while holding it, so no write
//! of that agent leaves after its sensitive read did.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use gatekeeper_core::ToolGatekeeper;
use kernel::{
    ActionKind, DriverActionId, Gatekeeper, GatekeeperError, LedgerId, LedgerStore, RejectOutcome,
    RevertOutcome,
};
use prompt_sanitize::{MAX_DESCRIPTION_CHARS, one_line};
use tokio::sync::RwLock;
use tracing::warn;

/// One agent's latch.
#[derive(Debug, Default)]
struct Latch {
    /// Why the agent is locked down, or `None` while it is not. Cleared only by a person's
    /// recorded lift ([`Latches::lift`]).
    why: std::sync::Mutex<Option<String>>,
    /// Held for reading by each apply of this agent's actions, for writing while latching.
    applying: RwLock<()>,
}

impl Latch {
    fn why(&self) -> Option<String> {
        self.why.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Every agent's lockdown latch.
#[derive(Debug, Default)]
pub struct Latches {
    agents: HashMap<String, Latch>,
    /// Where latches are kept (one file per locked-down agent), or `None` for memory only.
    dir: Option<PathBuf>,
    /// Lifts of lockdown, when latches are kept in memory only.
    lifts_in_memory: std::sync::Mutex<Vec<Lift>>,
}

/// The file, in the lockdown directory, that records each lift of an agent's lockdown,
/// one JSON object a line. (An agent name holds no dot, so no latch is named like it.)
pub const LIFTS_FILE: &str = "lifts.jsonl";

/// A recorded lift of an agent's lockdown.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Lift {
    /// When (milliseconds since the Unix epoch).
    pub at: u64,
    /// The agent.
    pub agent: String,
    /// Who lifted it: the operating system's user behind the person's socket.
    pub by: String,
    /// Why they judged it safe, as they wrote it.
    pub reason: String,
    /// Why it had been locked down.
    pub was: String,
}

/// Why a lockdown could not be lifted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LiftError {
    /// No agent has that name.
    #[error("there is no agent {0:?}; `gate lockdown` lists the locked-down agents")]
    UnknownAgent(String),
    /// The agent is not locked down.
    #[error("agent {0:?} is not locked down; there is nothing to lift")]
    NotLocked(String),
    /// No reason was given.
    #[error(
        "say why it is safe to lift the lockdown with --reason TEXT; it is recorded with your name"
    )]
    NoReason,
    /// The record or the latch could not be written.
    #[error(
        "the lift could not be recorded ({0}), so the lockdown stays; check the gate's data directory"
    )]
    Io(#[from] std::io::Error),
}

impl Latches {
    /// Latches for `agents`, none set, kept in memory only.
    pub fn new<'a>(agents: impl IntoIterator<Item = &'a str>) -> Self {
        Self {
            agents: agents
                .into_iter()
                .map(|a| (a.to_owned(), Latch::default()))
                .collect(),
            dir: None,
            lifts_in_memory: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Keep the latches in `dir` (created if missing): one file per locked-down agent,
    /// named after it, written and synced before a sensitive read is forwarded. Latches
    /// already there are loaded, so a lockdown outlives a restart.
    pub fn with_dir(mut self, dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        for (agent, latch) in &self.agents {
            match std::fs::read_to_string(dir.join(agent)) {
                Ok(why) => {
                    *latch.why.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(why.trim().to_owned());
                }
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(error),
            }
        }
        self.dir = Some(dir.to_owned());
        Ok(self)
    }

    /// Why `agent`'s workspace is locked down, or `None` while it is not (or for an agent
    /// not configured).
    pub fn why(&self, agent: &str) -> Option<String> {
        self.agents.get(agent).and_then(Latch::why)
    }

    /// Latch `agent`'s lockdown because it is about to read `tool`: after that agent's
    /// applies in flight end, durably first (when a directory is set), then in memory.
    /// Once latched it stays until a person lifts it ([`Latches::lift`]).
    pub async fn latch(&self, agent: &str, tool: &str) -> std::io::Result<()> {
        let Some(latch) = self.agents.get(agent) else {
            return Err(std::io::Error::other(format!(
                "agent {agent:?} is not configured"
            )));
        };
        let _no_apply = latch.applying.write().await;
        if latch.why().is_some() {
            return Ok(());
        }
        let why = format!("it read the sensitive tool \"{tool}\"");
        if let Some(dir) = &self.dir {
            use std::io::Write as _;
            let mut file = std::fs::File::create(dir.join(agent))?;
            file.write_all(why.as_bytes())?;
            file.sync_all()?;
            std::fs::File::open(dir)?.sync_all()?;
        }
        warn!(%agent, %tool, "sensitive read: this agent's workspace is locked down");
        *latch.why.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        Ok(())
    }

    /// Lift `agent`'s lockdown, by `by` (the person behind the socket), for `reason`, at
    /// `at` (milliseconds since the Unix epoch): the lift is appended to the record and
    /// synced first (when a directory is set), then the latch is removed, so a lift that
    /// is not recorded does not happen. Returns why it had been locked down.
    pub fn lift(&self, agent: &str, by: &str, reason: &str, at: u64) -> Result<String, LiftError> {
        let latch = self
            .agents
            .get(agent)
            .ok_or_else(|| LiftError::UnknownAgent(agent.to_owned()))?;
        if reason.trim().is_empty() {
            return Err(LiftError::NoReason);
        }
        let mut why = latch.why.lock().unwrap_or_else(|p| p.into_inner());
        let Some(was) = why.clone() else {
            return Err(LiftError::NotLocked(agent.to_owned()));
        };
        let lift = Lift {
            at,
            agent: agent.to_owned(),
            by: by.to_owned(),
            reason: reason.to_owned(),
            was: was.clone(),
        };
        match &self.dir {
            Some(dir) => {
                use std::io::Write as _;
                let mut line = serde_json::to_string(&lift).expect("a lift serialises");
                line.push('\n');
                let mut file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(dir.join(LIFTS_FILE))?;
                file.write_all(line.as_bytes())?;
                file.sync_all()?;
                std::fs::remove_file(dir.join(agent))?;
                std::fs::File::open(dir)?.sync_all()?;
            }
            None => self
                .lifts_in_memory
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(lift),
        }
        *why = None;
        Ok(was)
    }

    /// The lifts recorded so far, oldest first (a line that cannot be read is skipped).
    pub fn lifts(&self) -> Vec<Lift> {
        match &self.dir {
            Some(dir) => std::fs::read_to_string(dir.join(LIFTS_FILE))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect(),
            None => self
                .lifts_in_memory
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }
}

/// A server's gatekeeper as the kernel sees it: every call passes through to the
/// [`ToolGatekeeper`], but an apply of an action whose agent is locked down is refused
/// before anything is claimed or sent, and the driver's record is closed so nothing can
/// send it later.
pub struct Guarded {
    inner: Arc<ToolGatekeeper>,
    ledger: Arc<dyn LedgerStore>,
    latches: Arc<Latches>,
    /// Where questions its server asks during a send go ([`crate::questions`]).
    questions: Option<Arc<crate::questions::Questions>>,
}

impl std::fmt::Debug for Guarded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guarded")
            .field("gatekeeper", &self.inner.name())
            .finish_non_exhaustive()
    }
}

impl Guarded {
    /// `inner`, finding who staged an action in `ledger` and their latch in `latches`.
    pub fn new(
        inner: Arc<ToolGatekeeper>,
        ledger: Arc<dyn LedgerStore>,
        latches: Arc<Latches>,
    ) -> Self {
        Self {
            inner,
            ledger,
            latches,
            questions: None,
        }
    }

    /// The same guard, putting the questions its server asks during a send to the person
    /// through `questions`.
    pub fn with_questions(mut self, questions: Arc<crate::questions::Questions>) -> Self {
        self.questions = Some(questions);
        self
    }

    /// The ledger id of `action` and the agent that staged it, from the ledger.
    fn staged(&self, action: DriverActionId) -> Result<Option<(LedgerId, String)>, String> {
        let Some(id) = self
            .ledger
            .find_action(self.inner.name(), action)
            .map_err(|e| e.to_string())?
        else {
            return Ok(None);
        };
        Ok(self
            .ledger
            .get(id)
            .map_err(|e| e.to_string())?
            .map(|entry| (id, entry.caller.to_string())))
    }

    /// The send itself, its server's questions put to the person when the action is
    /// known.
    async fn send(
        &self,
        action: DriverActionId,
        staged: Option<&(LedgerId, String)>,
    ) -> Result<(), GatekeeperError> {
        match (&self.questions, staged) {
            (Some(questions), Some((id, caller))) => {
                questions
                    .during(
                        *id,
                        self.inner.name(),
                        caller,
                        self.inner.apply_action(action),
                    )
                    .await
            }
            _ => self.inner.apply_action(action).await,
        }
    }
}

#[async_trait]
impl Gatekeeper for Guarded {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn apply_action(&self, action: DriverActionId) -> Result<(), GatekeeperError> {
        let staged = self.staged(action).map_err(|error| {
            GatekeeperError::retryable(format!(
                "nothing was sent: the gate could not read who staged this action to check their lockdown ({error}); approve it again later"
            ))
        })?;
        let caller = staged.as_ref().map(|(_, caller)| caller.clone());
        let latch = caller
            .as_deref()
            .and_then(|agent| self.latches.agents.get(agent));
        let Some(latch) = latch else {
            return self.send(action, staged.as_ref()).await;
        };
        let _applying = latch.applying.read().await;
        if let Some(why) = latch.why() {
            let agent = caller.unwrap_or_default();
            // Closed in the driver's store too, so no later approval can send it.
            if let Err(error) = self.inner.store().reject(action).await {
                return Err(GatekeeperError::retryable(format!(
                    "nothing was sent: agent {agent:?} is locked down, and its action could not be closed ({error}); reject it"
                )));
            }
            warn!(%agent, %action, "apply refused: the agent is locked down");
            return Err(GatekeeperError::not_sent(
                one_line(
                    &format!(
                        "not sent, and never will be: agent {agent:?} is locked down because {why}, so nothing it staged may leave"
                    ),
                    MAX_DESCRIPTION_CHARS,
                )
                .into_string(),
            ));
        }
        self.send(action, staged.as_ref()).await
    }

    async fn reject_action(
        &self,
        action: DriverActionId,
    ) -> Result<RejectOutcome, GatekeeperError> {
        self.inner.reject_action(action).await
    }

    async fn revert_action(
        &self,
        action: DriverActionId,
    ) -> Result<RevertOutcome, GatekeeperError> {
        self.inner.revert_action(action).await
    }

    fn auto_approvable_actions(&self) -> Vec<ActionKind> {
        self.inner.auto_approvable_actions()
    }

    fn call_deadline(&self) -> Duration {
        Gatekeeper::call_deadline(&*self.inner)
    }

    async fn covers(
        &self,
        action: DriverActionId,
        tests: &[kernel::ArgumentTest],
    ) -> Result<bool, GatekeeperError> {
        self.inner.covers(action, tests).await
    }
}

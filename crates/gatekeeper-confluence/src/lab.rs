//! A ready-made bench for tests and lectures: the real kernel, the wiki service, and this
//! gatekeeper wired together with a deterministic clock.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use gatekeeper_confluence::{Lab, Policy};
//!
//! let lab = Lab::new(Policy::GUARDED);
//! let agent = lab.session("agent");
//! let parent = agent.create_page("OPS", "Parent", "").await?;       // ~1
//! let child = agent.create_child_page(&parent, "Child", "stop").await?; // ~2
//! for id in lab.open_ids()? {
//!     lab.overseer.approve(id, "ana").await?;
//! }
//! assert_eq!(agent.read(&child).await?.id.to_string(), "201");
//! # Ok(()) }
//! ```

use std::sync::Arc;

use kernel::{
    Clock, DecisionError, LedgerEntry, LedgerId, LedgerStore, MemoryLedger, Overseer, StepClock,
};

use crate::gatekeeper::ConfluenceGatekeeper;
use crate::kv::{KvError, KvStore, MemoryKv};
use crate::policy::Policy;
use crate::service::WikiService;
use crate::session::WikiSession;

/// The name the lab registers the gatekeeper under.
pub const GATEKEEPER_NAME: &str = "confluence";
/// The space the lab's wiki starts with.
pub const SPACE: &str = "OPS";

/// The kernel, the wiki and the gatekeeper, wired. Every field is public: a lecture
/// drives the kernel (`overseer.approve`, `reject`, `revert`, `ledger`), plays the other
/// people on the wiki (`service.human_edit`), and inspects the driver (`wiki`).
pub struct Lab {
    /// The clock everything reads: deterministic (09:00:00, one second per reading) unless
    /// the lab was built with [`Lab::over_with_clock`].
    pub clock: Arc<dyn Clock>,
    /// The real kernel.
    pub overseer: Overseer,
    /// The wiki, outside the OS. Starts with the space [`SPACE`] and no pages.
    pub service: Arc<WikiService>,
    /// The gatekeeper's key-value store.
    pub kv: Arc<dyn KvStore>,
    /// The gatekeeper, registered with the kernel as [`GATEKEEPER_NAME`].
    pub wiki: Arc<ConfluenceGatekeeper>,
}

impl Lab {
    /// A fresh lab under `policy`, everything in memory.
    pub fn new(policy: Policy) -> Self {
        Self::over(
            policy,
            Arc::new(MemoryLedger::new()),
            Arc::new(MemoryKv::new()),
        )
        .expect("an empty in-memory store always opens")
    }

    /// A lab under `policy` whose kernel keeps its ledger in `ledger` and whose driver
    /// keeps its records in `kv` (for example both in one SQLite file). The stores should
    /// be empty: the lab's wiki starts empty too.
    pub fn over(
        policy: Policy,
        ledger: Arc<dyn LedgerStore>,
        kv: Arc<dyn KvStore>,
    ) -> Result<Self, KvError> {
        Self::over_with_clock(policy, ledger, kv, Arc::new(StepClock::default()))
    }

    /// [`Lab::over`] on `clock` (for example the wall clock, for a ledger kept in a file a
    /// person will read later).
    pub fn over_with_clock(
        policy: Policy,
        ledger: Arc<dyn LedgerStore>,
        kv: Arc<dyn KvStore>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, KvError> {
        let overseer = Overseer::with_store(ledger, clock.clone());
        let service = Arc::new(WikiService::new());
        service.add_space(SPACE);
        let wiki = Arc::new(ConfluenceGatekeeper::open(
            GATEKEEPER_NAME,
            service.clone(),
            kv.clone(),
            clock.clone(),
            policy,
        )?);
        overseer
            .register(wiki.clone())
            .expect("a fresh kernel has no gatekeeper of this name");
        Ok(Self {
            clock,
            overseer,
            service,
            kv,
            wiki,
        })
    }

    /// A session for the agent `caller`.
    pub fn session(&self, caller: &str) -> WikiSession {
        let queue = self
            .overseer
            .queue_for(GATEKEEPER_NAME, caller)
            .expect("the lab registered its gatekeeper");
        self.wiki.session(queue)
    }

    /// The ids of every action still waiting for a person, ascending.
    pub fn open_ids(&self) -> Result<Vec<LedgerId>, DecisionError> {
        Ok(self.overseer.open_actions()?.iter().map(|e| e.id).collect())
    }

    /// One ledger entry (it must exist).
    pub fn entry(&self, id: LedgerId) -> Result<LedgerEntry, DecisionError> {
        self.overseer
            .entry(id)?
            .ok_or(DecisionError::UnknownEntry(id))
    }
}

//! Capabilities: an agent holds nothing until a person introduces a grant.
//!
//! A [`Grant`] is a bundle of tools of one gatekeeper, minted by that gatekeeper over the
//! kernel queue for one caller. A person hands it to an agent by introducing it into the
//! agent's [`Grants`] under a name; the agent then reaches the server only through the
//! [`Session`] behind that name, and only for the tools in the bundle. Nothing is ambient:
//! [`Grants::default`] is empty, and no configured server floats into an agent by itself.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use kernel::{ApprovalQueue, DecisionError};

use crate::gatekeeper::ToolGatekeeper;
use crate::session::Session;

/// Why a grant could not be minted or found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GrantError {
    /// The gatekeeper has no tool of that name.
    #[error(
        "gatekeeper {gatekeeper:?} has no tool named {tool:?}; grant only tools from its catalog"
    )]
    UnknownTool {
        /// The gatekeeper asked.
        gatekeeper: String,
        /// The missing tool.
        tool: String,
    },
    /// No grant of that name was introduced.
    #[error("no grant named {0:?} has been introduced; a person must introduce it first")]
    NotIntroduced(String),
    /// The kernel could not mint a queue (for example, the gatekeeper is not registered).
    #[error("the kernel could not mint a queue for this grant: {0}")]
    Kernel(DecisionError),
}

/// Some tools of one gatekeeper, for one caller. Only a gatekeeper mints one
/// ([`ToolGatekeeper::grant`]).
pub struct Grant {
    session: Session,
}

impl Grant {
    pub(crate) fn new(
        gatekeeper: Arc<ToolGatekeeper>,
        queue: Arc<dyn ApprovalQueue>,
        allowed: Vec<Arc<str>>,
    ) -> Self {
        Self {
            session: Session::new(gatekeeper, queue, allowed),
        }
    }

    /// The gatekeeper that minted it.
    pub fn gatekeeper(&self) -> &str {
        self.session.gatekeeper().name()
    }

    /// The tools it allows, in the order granted.
    pub fn tools(&self) -> Vec<&str> {
        self.session.allowed_tools()
    }

    /// The session it opens (what [`Grants::session`] hands out once introduced).
    pub fn into_session(self) -> Session {
        self.session
    }
}

impl fmt::Debug for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Grant")
            .field("gatekeeper", &self.gatekeeper())
            .field("tools", &self.tools())
            .finish()
    }
}

/// What one agent holds: the grants a person introduced, by name. Empty by default.
#[derive(Default)]
pub struct Grants {
    held: BTreeMap<String, Session>,
}

impl Grants {
    /// Nothing: an agent starts with no capabilities.
    pub fn new() -> Self {
        Self::default()
    }

    /// A person hands the agent `grant` under `name`, replacing any grant of that name.
    pub fn introduce(&mut self, name: impl Into<String>, grant: Grant) {
        self.held.insert(name.into(), grant.into_session());
    }

    /// A person takes a grant back. Returns whether one was held.
    pub fn revoke(&mut self, name: &str) -> bool {
        self.held.remove(name).is_some()
    }

    /// The names of the grants held, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.held.keys().map(String::as_str).collect()
    }

    /// The session behind a grant.
    pub fn session(&self, name: &str) -> Result<&Session, GrantError> {
        self.held
            .get(name)
            .ok_or_else(|| GrantError::NotIntroduced(name.to_owned()))
    }
}

impl fmt::Debug for Grants {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.held.iter().map(|(name, s)| (name, s.allowed_tools())))
            .finish()
    }
}

//! The kernel of the approval gate: it decides what may reach the outside world, and
//! records who decided, without ever touching the outside world itself.
//!
//! Drivers are known only as [`Gatekeeper`] trait objects; storage only through the
//! [`LedgerStore`] port. Nothing in this crate opens a socket, a file or a service.
//!
//! - [`contract`]: the traits and descriptions a driver implements and submits.
//! - [`Overseer`]: the approval queue, decisions, auto-approval rules, the drainer and
//!   lockdown.
//! - [`ledger`]: what is recorded about every action and observation.
//! - [`store`]: the storage port and its in-memory default.
//! - [`clock`]: injected time, so ledgers and transcripts are reproducible.
//! - [`deadline`]: how long the kernel waits for a driver, and what a panic becomes.

pub mod clock;
pub mod contract;
pub mod deadline;
pub mod drain;
pub mod ledger;
mod overseer;
pub mod store;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use clock::{Clock, StepClock, SystemClock, Timestamp};
pub use contract::{
    ActionDescription, ActionKind, ApprovalQueue, DriverActionId, Gatekeeper, GatekeeperError,
    ObservationAuthorizer, ObservationDescription, QueueError, RejectOutcome, RevertOutcome,
};
pub use deadline::DEFAULT_CALL_DEADLINE;
pub use drain::DrainCause;
pub use ledger::{
    ActionEntry, ActionState, ArgumentCheck, ArgumentTest, AutoApprovalRule, EntryBody, Failure,
    FailureKind, LedgerEntry, LedgerId, Resolution, RevertRecord, RuleScope,
};
pub use overseer::{DecisionError, EXPIRY_DECIDER, Overseer, RejectReport, RevertReport};
pub use store::{
    DrainLease, DrainLeaseFuture, DurableFuture, LedgerStore, MemoryLedger, StorageError,
};

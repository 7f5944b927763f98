//! A driver for an issue tracker, and the tracker itself as an in-process fake service.
//!
//! This is the device driver of the lecture's OS analogy: [`IssuesConfig::build`] makes a
//! [`gatekeeper_core::ToolGatekeeper`] over an [`IssueTracker`], classified from the
//! tracker's own MCP catalog, with a revert for `addLabel` and an optional simulator for
//! `createIssue`.
//!
//! The tracker lives in [`service`] and [`catalog`](mod@catalog), both **outside the OS**: they play the
//! external service, count what reaches them, and can be told to misbehave. Nothing in the
//! gate depends on them except through the [`gatekeeper_core::ToolService`] port.
//!
//! ```
//! use std::sync::Arc;
//!
//! use gatekeeper_core::{ActionStore, CallOutcome, Grants};
//! use gatekeeper_issues::{IssueTracker, IssuesConfig};
//! use kernel::{Clock, Overseer, StepClock};
//! use serde_json::json;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let clock: Arc<dyn Clock> = Arc::new(StepClock::default());
//! let overseer = Overseer::new(clock.clone());
//! let tracker = IssueTracker::new();
//! let issues = IssuesConfig::new()
//!     .build(tracker.clone(), ActionStore::in_memory(clock))
//!     .await;
//! overseer.register(issues.clone())?;
//!
//! let mut grants = Grants::default();
//! assert!(grants.names().is_empty(), "nothing is ambient");
//! grants.introduce("ISSUES", issues.grant(&overseer, "agent", &["listIssues", "createIssue"])?);
//! let session = grants.session("ISSUES")?;
//!
//! let CallOutcome::Pending { action, ledger, .. } =
//!     session.call_tool("createIssue", json!({"title": "Fix login"})).await?
//! else {
//!     unreachable!("createIssue is an action");
//! };
//! assert_eq!(tracker.calls(), 0, "nothing is sent before approval");
//!
//! overseer.approve(ledger, "alice").await?;
//! assert_eq!(tracker.issues()[0].title, "Fix login");
//! let result = session.get_action_result(action).await?;
//! assert_eq!(result.status(), "applied");
//! # Ok(())
//! # }
//! ```

pub mod catalog;
mod driver;
pub mod service;

pub use catalog::{Catalog, catalog, catalog_json};
pub use driver::{
    CreateIssueSimulator, ENDPOINT, IssuesConfig, LABEL_PREEXISTED_MESSAGE, LABEL_UNKNOWN_MESSAGE,
    LabelReverter, NAME, SERVER_NAME,
};
pub use service::{Issue, IssueTracker, ParkHandle, Write};

//! Integration tests of the wiki gatekeeper against the real kernel; one binary, whose
//! module list reads like a table of contents.
//!
//! - `cases`: the 11 review cases of the reference (a, b1, b2, c, d, e, f1, f2, g, h1, h2), each
//!   under the reference policy and ours where they differ.
//! - `sessions`: the agent's API: handles, reads, overlay details, staging refusals.
//! - `lifecycle`: apply, reject and revert beyond the 11 cases, and persistence.
//! - `claims`: the at-most-once apply: the claim before the write, a crash after it,
//!   concurrent applies.
//! - `review`: people act during review (issue 14): edits, trashes and decisions out of
//!   order while the agent's work waits; one test per hazard.

mod cases;
mod claims;
mod lifecycle;
mod review;
mod sessions;

use gatekeeper_confluence::{ContentHandle, Lab, Policy, WikiSession};
use kernel::{ActionState, DecisionError, GatekeeperError, LedgerId};

/// Both policies, for cases where they behave the same.
pub const BOTH: [Policy; 2] = [Policy::REFERENCE, Policy::GUARDED];

/// A lab whose wiki holds page 100 ("Manual", body `Original`) in space OPS.
pub fn lab_with_manual(policy: Policy, title: &str, body: &str) -> Lab {
    let lab = Lab::new(policy);
    lab.service.seed_page_with_id(100, "OPS", title, body);
    lab
}

/// A lab from [`lab_with_manual`], the agent's session and its handle on page 100.
pub async fn agent_on_manual(
    policy: Policy,
    title: &str,
    body: &str,
) -> (Lab, WikiSession, ContentHandle) {
    let lab = lab_with_manual(policy, title, body);
    let agent = lab.session("agent");
    let page = agent.open("100").await.expect("page 100 opens");
    (lab, agent, page)
}

/// The storage body of a page, as the wiki holds it now.
pub fn storage(lab: &Lab, id: u64) -> String {
    lab.service.page(id).expect("the page exists").body
}

/// The version of a page now.
pub fn version(lab: &Lab, id: u64) -> u64 {
    lab.service.page(id).expect("the page exists").version
}

/// The kernel's state of an action.
pub fn state(lab: &Lab, id: LedgerId) -> ActionState {
    lab.entry(id)
        .expect("entry")
        .action()
        .expect("an action")
        .state
}

/// Approve every open action in ascending id, each of which must succeed.
pub async fn approve_all(lab: &Lab) {
    for id in lab.open_ids().expect("ledger") {
        lab.overseer
            .approve(id, "ana")
            .await
            .unwrap_or_else(|e| panic!("approving {id} failed: {e}"));
    }
}

/// The driver's error inside a failed approval.
pub fn apply_error(result: Result<(), DecisionError>) -> GatekeeperError {
    match result {
        Err(DecisionError::ApplyFailed { source, .. }) => source,
        other => panic!("expected a failed apply, got {other:?}"),
    }
}

//! Revert, wired through the kernel: `addLabel` removes the label it added, and refuses
//! when the label was there before; other tools say they cannot be reverted.

use gatekeeper_core::REVERT_UNSUPPORTED_MESSAGE;
use gatekeeper_issues::{IssuesConfig, LABEL_PREEXISTED_MESSAGE};
use kernel::{ActionState, DecisionError, Gatekeeper};
use serde_json::json;

use crate::common::{create, queue, world};

#[tokio::test]
async fn reverting_add_label_removes_the_label_it_added() {
    let w = world(IssuesConfig::new()).await;
    w.tracker.seed("Fix login", &["ui"]);
    let s = w.session(&["addLabel"]);
    let (_, ledger) = queue(&s, "addLabel", json!({"issue": 1, "label": "bug"})).await;
    assert!(w.entry(ledger).description.implements_revert);
    w.overseer.approve(ledger, "alice").await.expect("applied");
    assert_eq!(w.tracker.issue(1).expect("issue").labels, ["ui", "bug"]);

    let report = w.overseer.revert(ledger, "alice").await.expect("reverted");
    assert!(report.reverted);
    assert_eq!(w.tracker.issue(1).expect("issue").labels, ["ui"]);
    assert_eq!(w.entry(ledger).state, ActionState::Reverted);
}

#[tokio::test]
async fn reverting_a_label_that_was_already_there_is_refused() {
    let w = world(IssuesConfig::new()).await;
    w.tracker.seed("Fix login", &["bug"]);
    let s = w.session(&["addLabel"]);
    let (_, ledger) = queue(&s, "addLabel", json!({"issue": 1, "label": "bug"})).await;
    w.overseer.approve(ledger, "alice").await.expect("applied");

    let report = w.overseer.revert(ledger, "alice").await.expect("answered");
    assert!(!report.reverted);
    assert_eq!(report.message.as_deref(), Some(LABEL_PREEXISTED_MESSAGE));
    assert_eq!(w.tracker.issue(1).expect("issue").labels, ["bug"]);
}

#[tokio::test]
async fn other_tools_cannot_be_reverted() {
    let w = world(IssuesConfig::new()).await;
    let s = w.session(&["createIssue"]);
    let (action, ledger) = create(&s, "Fix login").await;
    assert!(!w.entry(ledger).description.implements_revert);
    w.overseer.approve(ledger, "alice").await.expect("applied");
    assert_eq!(
        w.overseer.revert(ledger, "alice").await,
        Err(DecisionError::RevertUnsupported(ledger))
    );
    let direct = w.issues.revert_action(action).await.expect("answered");
    assert_eq!(direct.message.as_deref(), Some(REVERT_UNSUPPORTED_MESSAGE));
    assert_eq!(w.tracker.issues().len(), 1);
}

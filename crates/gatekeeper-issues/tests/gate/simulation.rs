//! ex04: with the simulator on, the agent sees its own pending writes as provisional
//! issues; what it stages after seeing them depends on them.

use gatekeeper_issues::IssuesConfig;
use serde_json::json;

use crate::common::{create, queue, read, world};

#[tokio::test]
async fn a_pending_create_shows_as_provisional_then_as_the_real_issue() {
    let w = world(IssuesConfig::new().simulate(true)).await;
    w.tracker.seed("Fix login", &[]);
    w.tracker.seed("Update docs", &[]);
    let s = w.session(&["listIssues", "createIssue"]);

    let (_, ledger) = create(&s, "Add dark mode").await;
    assert!(
        !w.entry(ledger).description.await_decision,
        "the agent need not wait"
    );
    assert_eq!(
        read(&s, "listIssues", json!({})).await,
        "#1 Fix login (open)\n#2 Update docs (open)\n~1 Add dark mode (open, awaiting approval)"
    );
    assert!(w.tracker.issues().len() == 2, "nothing was sent");

    w.overseer.approve(ledger, "alice").await.expect("applied");
    let after = read(&s, "listIssues", json!({})).await;
    assert_eq!(
        after,
        "#1 Fix login (open)\n#2 Update docs (open)\n#3 Add dark mode (open)"
    );
}

#[tokio::test]
async fn structured_data_marks_provisional_issues() {
    let w = world(IssuesConfig::new().simulate(true)).await;
    let s = w.session(&["listIssues", "createIssue"]);
    create(&s, "First").await;
    let outcome = s.call_tool("listIssues", json!({})).await.expect("read");
    let data = outcome.data().and_then(|r| r.structured_content.clone());
    assert_eq!(
        data,
        Some(json!({"issues": [
            {"id": "~1", "title": "First", "labels": [], "state": "open", "provisional": true}
        ]}))
    );
}

#[tokio::test]
async fn an_action_staged_after_a_read_that_showed_pending_work_depends_on_it() {
    let w = world(IssuesConfig::new().simulate(true)).await;
    w.tracker.seed("Fix login", &[]);
    let s = w.session(&["listIssues", "createIssue", "addLabel"]);

    let (create_id, create_ledger) = create(&s, "Add dark mode").await;
    let (_, before) = queue(&s, "addLabel", json!({"issue": 1, "label": "early"})).await;
    read(&s, "listIssues", json!({})).await;
    assert_eq!(s.shown_actions(), [create_id]);
    let (_, after) = queue(&s, "addLabel", json!({"issue": 1, "label": "ui"})).await;

    assert!(
        w.entry(before).depends_on.is_empty(),
        "staged before the read"
    );
    assert_eq!(w.entry(after).depends_on, [create_ledger]);

    let report = w
        .overseer
        .reject(create_ledger, "alice")
        .await
        .expect("rejected");
    assert!(report.restart, "the agent saw the rejected create");
    assert_eq!(report.flagged, [after]);
}

#[tokio::test]
async fn without_a_simulator_reads_show_nothing_pending_and_the_agent_should_wait() {
    let w = world(IssuesConfig::new()).await;
    let s = w.session(&["listIssues", "createIssue"]);
    let (_, ledger) = create(&s, "Add dark mode").await;
    assert!(w.entry(ledger).description.await_decision);
    assert_eq!(read(&s, "listIssues", json!({})).await, "No issues.");
    assert!(s.shown_actions().is_empty());
    let report = w.overseer.reject(ledger, "alice").await.expect("rejected");
    assert!(!report.restart);
}

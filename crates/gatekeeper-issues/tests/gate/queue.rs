//! ex03 and ex05: the agent's turn ends at once, nothing is sent until a person decides;
//! auto-approval needs two keys and never passes a manual gate.

use gatekeeper_core::ServerTrust;
use gatekeeper_issues::IssuesConfig;
use kernel::ActionState;
use serde_json::json;

use crate::common::{create, queue, read, world};

#[tokio::test]
async fn a_turn_reads_once_queues_three_writes_and_sends_nothing() {
    let w = world(IssuesConfig::new()).await;
    w.tracker.seed("Fix login", &[]);
    w.tracker.seed("Update docs", &[]);
    let s = w.session(&["listIssues", "createIssue", "addLabel", "closeIssue"]);

    let listing = read(&s, "listIssues", json!({})).await;
    assert_eq!(listing, "#1 Fix login (open)\n#2 Update docs (open)");
    let (_, create) = create(&s, "Add dark mode").await;
    let (_, label) = queue(&s, "addLabel", json!({"issue": 1, "label": "bug"})).await;
    let (_, close) = queue(&s, "closeIssue", json!({"issue": 2})).await;

    assert_eq!(w.tracker.calls(), 1, "only the read reached the tracker");
    let open = w.overseer.open_actions().expect("open");
    assert_eq!(open.len(), 3);
    assert!(
        open.iter()
            .all(|e| e.action().is_some_and(|a| a.description.await_decision))
    );

    w.overseer.approve(create, "alice").await.expect("applied");
    w.overseer.approve(label, "alice").await.expect("applied");
    w.overseer.reject(close, "alice").await.expect("rejected");
    assert_eq!(
        w.tracker.calls(),
        3,
        "the rejected call never reached the tracker"
    );
    assert!(w.tracker.issue(2).expect("issue").open);
    assert_eq!(w.tracker.issue(3).expect("created").title, "Add dark mode");
    assert_eq!(w.tracker.issue(1).expect("issue").labels, ["bug"]);
}

#[tokio::test]
async fn the_drain_stops_at_a_manual_gate_and_byo_never_auto_applies() {
    for trust in [ServerTrust::Vetted, ServerTrust::Byo] {
        let w = world(IssuesConfig::new().trust(trust)).await;
        w.tracker.seed("Fix login", &[]);
        let kind = w.issues.action_kind("addLabel").expect("kind");
        w.overseer
            .enable_rule(w.issues.name(), kind, "alice")
            .expect("rule");
        let s = w.session(&["createIssue", "addLabel"]);

        let (_, gate) = create(&s, "Manual").await;
        let (_, label) = queue(&s, "addLabel", json!({"issue": 1, "label": "bug"})).await;
        w.overseer.settle().await;
        assert_eq!(
            w.entry(label).state,
            ActionState::Pending,
            "{trust}: waits behind #gate"
        );

        w.overseer.approve(gate, "bob").await.expect("applied");
        w.overseer.settle().await;
        let entry = w.entry(label);
        match trust {
            ServerTrust::Vetted => {
                assert_eq!(entry.state, ActionState::Approved);
                let resolution = entry.resolution.expect("resolved");
                assert!(resolution.auto);
                assert_eq!(resolution.by, "alice", "attributed to the rule's author");
                assert_eq!(w.tracker.calls(), 2);
            }
            ServerTrust::Byo | ServerTrust::Untrusted => {
                assert_eq!(entry.state, ActionState::Pending);
                assert_eq!(w.tracker.calls(), 1);
            }
        }
    }
}

#[tokio::test]
async fn pending_message_names_the_tool_the_server_and_how_to_collect() {
    let w = world(IssuesConfig::new()).await;
    let s = w.session(&["createIssue"]);
    let outcome = s
        .call_tool("createIssue", json!({"title": "x"}))
        .await
        .expect("queued");
    let gatekeeper_core::CallOutcome::Pending { message, .. } = outcome else {
        panic!("pending");
    };
    assert_eq!(
        message,
        "Calling \"createIssue\" on Issue tracker needs approval. After approval, call get_action_result(1) for the outcome."
    );
}

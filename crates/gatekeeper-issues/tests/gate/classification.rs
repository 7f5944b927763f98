//! ex02: one trust boundary. The table a lecture prints, and the lying server.

use gatekeeper_core::describe::PROVENANCE_SERVER_READ;
use gatekeeper_core::{CallOutcome, ServerTrust};
use gatekeeper_issues::{Catalog, IssuesConfig};
use kernel::{EntryBody, Gatekeeper};
use serde_json::json;

use crate::common::{world, world_with};

fn table(gk: &gatekeeper_core::ToolGatekeeper) -> Vec<(String, String, String, String, bool)> {
    gk.tools()
        .into_iter()
        .map(|(tool, c)| {
            (
                tool.name.clone(),
                tool.annotations.summary(),
                c.mode().to_string(),
                c.classified_by().to_string(),
                c.auto_approvable(),
            )
        })
        .collect()
}

fn row(
    name: &str,
    hints: &str,
    mode: &str,
    by: &str,
    auto: bool,
) -> (String, String, String, String, bool) {
    (name.into(), hints.into(), mode.into(), by.into(), auto)
}

#[tokio::test]
async fn the_catalog_classifies_as_the_lecture_table_shows() {
    let vetted = world(IssuesConfig::new().trust(ServerTrust::Vetted)).await;
    assert_eq!(
        table(&vetted.issues),
        [
            row(
                "listIssues",
                r#"{"readOnlyHint":true}"#,
                "read",
                "server-annotation",
                false
            ),
            row("searchIssues", "{}", "action", "default", false),
            row(
                "createIssue",
                r#"{"destructiveHint":false}"#,
                "action",
                "default",
                false
            ),
            row(
                "addLabel",
                r#"{"destructiveHint":false,"idempotentHint":true}"#,
                "action",
                "default",
                true
            ),
            row("closeIssue", "{}", "action", "default", false),
            row(
                "deleteIssue",
                r#"{"destructiveHint":true}"#,
                "action",
                "default",
                false
            ),
        ]
    );
    let kinds: Vec<String> = vetted
        .issues
        .auto_approvable_actions()
        .into_iter()
        .map(|k| k.tag)
        .collect();
    assert_eq!(kinds, ["mcp%3Aissues:addLabel"]);

    let byo = world(IssuesConfig::new()).await;
    assert!(
        table(&byo.issues).iter().all(|r| !r.4),
        "byo never auto-applies"
    );
    assert!(byo.issues.auto_approvable_actions().is_empty());
}

#[tokio::test]
async fn a_read_that_does_not_say_so_is_queued_as_an_action() {
    let w = world(IssuesConfig::new()).await;
    w.tracker.seed("Fix login", &[]);
    let session = w.session(&["searchIssues"]);
    let outcome = session
        .call_tool("searchIssues", json!({"query": "login"}))
        .await
        .expect("queued");
    assert!(matches!(outcome, CallOutcome::Pending { .. }));
    assert_eq!(w.tracker.calls(), 0);
}

#[tokio::test]
async fn a_lying_delete_runs_as_a_read_with_no_approval() {
    // The reference's deliberate trade-off: readOnlyHint is believed on every tier.
    let w = world_with(IssuesConfig::new(), Catalog::Lying).await;
    w.tracker.seed("One", &[]);
    w.tracker.seed("Two", &[]);
    let session = w.session(&["deleteIssue"]);
    let outcome = session
        .call_tool("deleteIssue", json!({"issue": 1}))
        .await
        .expect("ran");
    assert_eq!(outcome.data().map(|r| r.text()), Some("Deleted #1.".into()));
    let ids: Vec<u64> = w.tracker.issues().iter().map(|i| i.id).collect();
    assert_eq!(ids, [2]);

    let ledger = w.overseer.ledger().expect("ledger");
    assert_eq!(ledger.len(), 1, "one observation, no action to approve");
    let EntryBody::Observation(seen) = &ledger[0].body else {
        panic!("recorded as an observation");
    };
    assert!(seen.description.ends_with(PROVENANCE_SERVER_READ));
}

//! ex01: an agent holds nothing until a person introduces a grant, and a grant names its
//! tools.

use gatekeeper_core::{GrantError, Grants};
use gatekeeper_issues::IssuesConfig;
use serde_json::json;

use crate::common::world;

#[tokio::test]
async fn an_agent_starts_empty_and_gets_only_the_tools_introduced() {
    let w = world(IssuesConfig::new()).await;
    let mut grants = Grants::default();
    assert!(grants.names().is_empty());
    assert!(matches!(
        grants.session("ISSUES"),
        Err(GrantError::NotIntroduced(_))
    ));

    let grant = w
        .issues
        .grant(&w.overseer, "agent", &["listIssues", "createIssue"])
        .expect("grant");
    grants.introduce("ISSUES", grant);
    assert_eq!(grants.names(), ["ISSUES"]);

    let session = grants.session("ISSUES").expect("introduced");
    let error = session
        .call_tool("deleteIssue", json!({"issue": 1}))
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "this grant does not allow «deleteIssue»; it allows: «listIssues», «createIssue»"
    );
    assert_eq!(w.tracker.calls(), 0);
    assert!(w.overseer.ledger().expect("ledger").is_empty());
}

#[tokio::test]
async fn the_revert_helper_tool_cannot_be_granted() {
    let w = world(IssuesConfig::new()).await;
    let error = w
        .issues
        .grant(&w.overseer, "agent", &["removeLabel"])
        .unwrap_err();
    assert_eq!(
        error,
        GrantError::UnknownTool {
            gatekeeper: "issues".into(),
            tool: "removeLabel".into()
        }
    );
}

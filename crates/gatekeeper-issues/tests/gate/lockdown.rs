//! ex08: after a sensitive observation nothing leaves, even through an unrelated tracker;
//! the refused call leaves no pending record behind.

use gatekeeper_core::SessionError;
use gatekeeper_issues::IssuesConfig;
use kernel::{ObservationDescription, QueueError};
use serde_json::json;

use crate::common::{read, world};

#[tokio::test]
async fn after_lockdown_a_write_is_refused_and_its_staged_record_discarded() {
    let w = world(IssuesConfig::new()).await;
    let s = w.session(&["listIssues", "createIssue"]);
    let payroll = ObservationDescription {
        prohibit_all_sharing: true,
        ..ObservationDescription::new("HR: payroll table", "Salaries of every employee.")
    };
    w.overseer
        .queue_for("issues", "agent")
        .expect("queue")
        .authorize_observation(payroll)
        .await
        .expect("authorized");

    let error = s
        .call_tool("createIssue", json!({"title": "Leak"}))
        .await
        .unwrap_err();
    assert_eq!(error, SessionError::Submission(QueueError::LockedDown));
    assert!(w.storage.records().is_empty());
    assert_eq!(w.tracker.calls(), 0);
    assert_eq!(read(&s, "listIssues", json!({})).await, "No issues.");
}

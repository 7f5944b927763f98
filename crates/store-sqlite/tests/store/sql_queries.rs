//! The queries documented in `docs/sql-queries.md`, read from that file and run against a
//! ledger with known contents.

use std::sync::Arc;

use kernel::{
    ActionDescription, DriverActionId, GatekeeperError, ObservationDescription, Overseer, StepClock,
};
use store_sqlite::Database;

use crate::support::{FakeGatekeeper, auto_kind};

const DOC: &str = include_str!("../../../../docs/sql-queries.md");

const READ_ONLY: &str = "The server declares this tool read-only, so it runs without approval. That claim comes from the server itself.";

fn documented_queries() -> Vec<String> {
    let mut queries = Vec::new();
    let mut current: Option<String> = None;
    for line in DOC.lines() {
        match (&mut current, line.trim()) {
            (None, "```sql") => current = Some(String::new()),
            (Some(query), "```") => {
                queries.push(std::mem::take(query));
                current = None;
            }
            (Some(query), _) => {
                query.push_str(line);
                query.push('\n');
            }
            (None, _) => {}
        }
    }
    queries
}

fn column(rows: &[Vec<Option<String>>], index: usize) -> Vec<String> {
    rows.iter()
        .map(|row| row[index].clone().unwrap_or_else(|| "NULL".into()))
        .collect()
}

#[tokio::test]
async fn the_documented_queries_answer_the_questions_they_claim_to() {
    let db = Database::open_in_memory().unwrap();
    let overseer = Overseer::with_store(db.ledger(), Arc::new(StepClock::default()));
    let gk = FakeGatekeeper::new("issues");
    overseer.register(gk.clone()).unwrap();
    let queue = overseer.queue_for("issues", "agent-7").unwrap();

    for title in ["issues: list_issues", "issues: get_issue"] {
        queue
            .authorize_observation(ObservationDescription::new(
                title,
                format!("**issues** → `x`\n\nEndpoint: `fake`\n\n{READ_ONLY}"),
            ))
            .await
            .unwrap();
    }
    queue
        .authorize_observation(ObservationDescription::new(
            "issues: search",
            "Treated as read-only by this deployment.",
        ))
        .await
        .unwrap();

    let auto = |title: &str| ActionDescription {
        auto_approvable: true,
        action_kind: Some(auto_kind()),
        ..ActionDescription::new(title, "Nothing has been sent yet.")
    };
    let d = DriverActionId;
    let manual = queue
        .submit_action(
            d(1),
            ActionDescription::new("issues: close_issue", "manual"),
        )
        .await
        .unwrap();
    queue
        .submit_action(d(2), auto("issues: add_label"))
        .await
        .unwrap();
    queue
        .submit_action(d(3), auto("issues: add_comment"))
        .await
        .unwrap();
    let lost = queue
        .submit_action(
            d(4),
            ActionDescription::new("issues: create_issue", "manual"),
        )
        .await
        .unwrap();
    overseer.approve(manual, "alice").await.unwrap();
    overseer
        .enable_rule("issues", auto_kind(), "carol")
        .unwrap();
    overseer.settle().await;
    let unknown = "This call failed after it had been sent, so it may or may not have taken effect. Check the service before staging it again.";
    gk.fail_next_apply(4, GatekeeperError::fatal(unknown));
    assert!(overseer.approve(lost, "bob").await.is_err());

    let queries = documented_queries();
    assert_eq!(
        queries.len(),
        3,
        "docs/sql-queries.md should hold three queries"
    );

    let reads = db.query_text(&queries[0]).unwrap();
    assert_eq!(
        column(&reads, 3),
        ["issues: list_issues", "issues: get_issue"]
    );
    assert_eq!(column(&reads, 2), ["agent-7", "agent-7"]);
    assert!(
        reads[0][4]
            .as_deref()
            .unwrap()
            .starts_with("1970-01-01T09:00:00")
    );

    let autos = db.query_text(&queries[1]).unwrap();
    assert_eq!(
        column(&autos, 3),
        ["issues: add_label", "issues: add_comment"]
    );
    assert_eq!(column(&autos, 2), [auto_kind().tag, auto_kind().tag]);
    assert_eq!(column(&autos, 4), ["approved", "approved"]);
    assert_eq!(column(&autos, 5), ["carol", "carol"]);

    let failed = db.query_text(&queries[2]).unwrap();
    assert_eq!(column(&failed, 2), ["issues: create_issue"]);
    assert_eq!(column(&failed, 3), [unknown]);
    assert_eq!(column(&failed, 4), ["bob"]);
}

#[test]
fn query_text_refuses_to_write() {
    let db = Database::open_in_memory().unwrap();
    let error = db
        .query_text("DELETE FROM auto_approval_rules")
        .unwrap_err();
    assert!(error.to_string().contains("read-only"), "{error}");
}

#[tokio::test]
async fn the_unknown_outcome_query_shows_what_an_interrupted_call_sent() {
    use gatekeeper_core::{StateTag, store::ApplyStep};

    let dir = crate::support::TempDir::new("sql-interrupted");
    let path = dir.join("gate.db");
    {
        let rig = crate::support::Rig::new(Database::open(&path).unwrap()).await;
        let queued = rig.queue_issue("Add dark mode").await;
        // The claim is committed, then the process "dies" before the send returns.
        let storage = rig.db.action_storage("issues");
        let record = storage
            .get(queued.action().unwrap())
            .await
            .unwrap()
            .unwrap();
        let ApplyStep::Claim(claimed) = record.begin_apply(kernel::Timestamp(1_000)) else {
            panic!("pending should be claimable");
        };
        assert!(
            storage
                .compare_and_set(StateTag::Pending, &claimed)
                .await
                .unwrap()
        );
    }
    let db = Database::open(&path).unwrap();
    let failed = db.query_text(&documented_queries()[2]).unwrap();
    assert_eq!(failed.len(), 1);
    let row = &failed[0];
    assert_eq!(row[2].as_deref(), Some("Call createIssue on Issue tracker"));
    assert_eq!(
        row[3].as_deref(),
        Some(gatekeeper_core::store::INTERRUPTED_MESSAGE)
    );
    assert_eq!(row[5].as_deref(), Some("createIssue"));
    assert_eq!(row[6].as_deref(), Some(r#"{"title":"Add dark mode"}"#));
    assert_eq!(row[7].as_deref(), Some("1970-01-01T00:00:01.000Z"));
}

#[tokio::test(start_paused = true)]
async fn the_unknown_outcome_query_finds_claims_stranded_in_a_live_process() {
    let dir = crate::support::TempDir::new("sql-stranded");
    let path = dir.join("gate.db");
    let rig = crate::support::Rig::new(Database::open(&path).unwrap()).await;

    // 1. A person's approval is abandoned (its caller went away) with the call in flight.
    let dropped = rig.queue_issue("Add dark mode").await;
    let (entered, _never) = rig.service.hold_next();
    {
        let approve = rig.overseer.approve(dropped.ledger().unwrap(), "alice");
        tokio::pin!(approve);
        tokio::select! {
            _ = &mut approve => panic!("the call is held"),
            () = entered.notified() => {}
        }
    }
    // 2. The service never answers another: the gatekeeper's deadline ends the wait.
    let hung = rig.queue_issue("Fix the login page").await;
    let (_entered, _never) = rig.service.hold_next();
    let error = tokio::time::timeout(
        std::time::Duration::from_secs(3600),
        rig.overseer.approve(hung.ledger().unwrap(), "bob"),
    )
    .await
    .expect("the deadline answers the person")
    .unwrap_err();
    assert!(
        error.to_string().contains("did not answer within 30 s"),
        "{error}"
    );

    // Without a restart, the agent is told the outcome is unknown, not "running".
    for outcome in [&dropped, &hung] {
        let result = rig
            .session
            .get_action_result(outcome.action().unwrap())
            .await
            .unwrap();
        assert_eq!(result.status(), "failed", "{result:?}");
        assert!(matches!(
            rig.overseer
                .reject(outcome.ledger().unwrap(), "carol")
                .await,
            Err(kernel::DecisionError::NotRetryable { .. })
        ));
    }

    // The documented query finds both, here and from another handle on the file.
    rig.db.flush().unwrap();
    let other = Database::open(&path).unwrap();
    for db in [&rig.db, &other] {
        let failed = db.query_text(&documented_queries()[2]).unwrap();
        assert_eq!(
            column(&failed, 2),
            [
                "Call createIssue on Issue tracker",
                "Call createIssue on Issue tracker"
            ]
        );
        assert!(failed[0][3].as_deref().unwrap().contains("abandoned"));
        assert!(failed[1][3].as_deref().unwrap().contains("did not answer"));
        assert_eq!(column(&failed, 4), ["alice", "bob"]);
        assert_eq!(column(&failed, 5), ["createIssue", "createIssue"]);
    }
    assert!(rig.service.calls().is_empty(), "neither call ever answered");
}

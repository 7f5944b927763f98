//! Sessions and grants end to end, against the real kernel and a fake service.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use common::{World, catalog, world};
use gatekeeper_core::describe::{PROVENANCE_ACTION, PROVENANCE_SERVER_READ};
use gatekeeper_core::{
    ActionResult, CallError, CallOutcome, GrantError, Grants, ServerTrust, SessionError,
    classify_tool, describe_call,
};
use kernel::{
    ActionDescription, ActionState as LedgerState, ApprovalQueue, DriverActionId, EntryBody,
    LedgerId, ObservationAuthorizer, ObservationDescription, QueueError,
};
use serde_json::json;

/// A queue that refuses every observation, and remembers how many service calls had been
/// made when it was asked.
struct RefusingQueue {
    service_calls_when_asked: AtomicUsize,
    world_calls: Arc<common::FakeService>,
}

#[async_trait]
impl ObservationAuthorizer for RefusingQueue {
    async fn authorize_observation(
        &self,
        _: ObservationDescription,
    ) -> Result<LedgerId, QueueError> {
        self.service_calls_when_asked
            .store(self.world_calls.calls(), Ordering::SeqCst);
        Err(QueueError::Storage(
            "observation refused by the test".into(),
        ))
    }
}

#[async_trait]
impl ApprovalQueue for RefusingQueue {
    async fn submit_action(
        &self,
        _: DriverActionId,
        _: ActionDescription,
    ) -> Result<LedgerId, QueueError> {
        Err(QueueError::Storage("submission refused by the test".into()))
    }
}

fn action_entry(w: &World, id: LedgerId) -> kernel::ActionEntry {
    w.overseer
        .entry(id)
        .expect("ledger")
        .expect("entry")
        .action()
        .expect("an action")
        .clone()
}

#[tokio::test]
async fn a_read_hands_over_no_data_unless_the_kernel_authorized_it() {
    let w = world(ServerTrust::Vetted).await;
    let queue = Arc::new(RefusingQueue {
        service_calls_when_asked: AtomicUsize::new(usize::MAX),
        world_calls: w.service.clone(),
    });
    let session = w
        .gatekeeper
        .grant_on(queue.clone(), &["read"])
        .expect("grant")
        .into_session();
    let error = session.call_tool("read", json!({})).await.unwrap_err();
    assert!(matches!(error, SessionError::Observation(_)), "{error}");
    assert!(error.to_string().contains("its data was withheld"));
    assert_eq!(queue.service_calls_when_asked.load(Ordering::SeqCst), 1);
    assert_eq!(w.service.calls(), 1);
}

#[tokio::test]
async fn a_read_runs_at_once_and_is_recorded_as_an_observation() {
    let w = world(ServerTrust::Byo).await;
    let session = w
        .gatekeeper
        .grant(&w.overseer, "agent", &["read"])
        .expect("grant")
        .into_session();
    let outcome = session
        .call_tool("read", json!({"q": 1}))
        .await
        .expect("read");
    let CallOutcome::Data {
        result,
        observation,
    } = outcome
    else {
        panic!("a read returns data");
    };
    assert_eq!(result.text(), "ran read");
    let entry = w
        .overseer
        .entry(observation)
        .expect("ledger")
        .expect("entry");
    let EntryBody::Observation(description) = &entry.body else {
        panic!("an observation");
    };
    assert_eq!(description.title, "Call read on Service");
    assert!(description.description.ends_with(PROVENANCE_SERVER_READ));
    assert_eq!(&*entry.caller, "agent");
}

#[tokio::test]
async fn an_action_is_staged_and_submitted_and_nothing_is_sent() {
    let w = world(ServerTrust::Vetted).await;
    let session = w
        .gatekeeper
        .grant(&w.overseer, "agent", &["write"])
        .expect("grant")
        .into_session();
    let args = json!({"text": "hello"});
    let outcome = session
        .call_tool("write", args.clone())
        .await
        .expect("queued");
    let CallOutcome::Pending {
        action,
        ledger,
        message,
    } = outcome
    else {
        panic!("an action is pending");
    };
    assert_eq!(
        message,
        "Calling \"write\" on Service needs approval. After approval, call get_action_result(1) for the outcome."
    );
    assert_eq!(w.service.calls(), 0);

    let entry = action_entry(&w, ledger);
    assert_eq!(entry.driver_id, action);
    assert_eq!(entry.state, LedgerState::Pending);
    let tools = catalog();
    let write = tools.iter().find(|t| t.name == "write").expect("write");
    let (title, body) = describe_call(
        "Service",
        "https://svc.example/mcp",
        write,
        &args,
        &classify_tool(write, ServerTrust::Vetted),
    );
    let d = &entry.description;
    assert_eq!(d.title, title.as_str());
    assert_eq!(d.description, body.as_str());
    assert!(d.description.ends_with(PROVENANCE_ACTION));
    assert!(d.await_decision, "no simulator: the agent should wait");
    assert!(!d.implements_revert);
    assert!(!d.auto_approvable);
    assert_eq!(
        d.action_kind.as_ref().map(|k| k.tag.as_str()),
        Some("mcp%3Asvc:write")
    );
    assert!(d.depends_on.is_empty());
}

#[tokio::test]
async fn a_refused_submission_discards_the_staged_call() {
    let w = world(ServerTrust::Vetted).await;
    let session = w
        .gatekeeper
        .grant(&w.overseer, "agent", &["read", "write"])
        .expect("grant")
        .into_session();
    // The agent reads something sensitive: lockdown latches.
    let sensitive = ObservationDescription {
        prohibit_all_sharing: true,
        ..ObservationDescription::new("payroll", "salaries")
    };
    w.overseer
        .queue_for("svc", "agent")
        .expect("queue")
        .authorize_observation(sensitive)
        .await
        .expect("authorized");

    let error = session.call_tool("write", json!({})).await.unwrap_err();
    assert_eq!(error, SessionError::Submission(QueueError::LockedDown));
    assert!(w.storage.records().is_empty(), "no ghost pending record");
    assert_eq!(w.gatekeeper.store().count_open().await, Ok(0));
    assert_eq!(w.service.calls(), 0);
    assert!(
        session.call_tool("read", json!({})).await.is_ok(),
        "reads still work"
    );
}

#[tokio::test]
async fn an_agent_holds_nothing_until_a_grant_is_introduced() {
    let w = world(ServerTrust::Byo).await;
    let mut grants = Grants::default();
    assert!(grants.names().is_empty());
    assert_eq!(
        grants.session("SVC").unwrap_err(),
        GrantError::NotIntroduced("SVC".into())
    );
    let grant = w
        .gatekeeper
        .grant(&w.overseer, "agent", &["read", "write"])
        .expect("grant");
    assert_eq!(grant.gatekeeper(), "svc");
    assert_eq!(grant.tools(), ["read", "write"]);
    grants.introduce("SVC", grant);
    assert_eq!(grants.names(), ["SVC"]);

    let error = grants
        .session("SVC")
        .expect("introduced")
        .call_tool("tag", json!({}))
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "this grant does not allow «tag»; it allows: «read», «write»"
    );
    assert_eq!(w.service.calls(), 0);
    assert!(w.overseer.ledger().expect("ledger").is_empty());

    assert!(grants.revoke("SVC"));
    assert!(grants.names().is_empty());
}

#[tokio::test]
async fn a_grant_can_only_name_catalog_tools_of_a_registered_gatekeeper() {
    let w = world(ServerTrust::Byo).await;
    let error = w
        .gatekeeper
        .grant(&w.overseer, "agent", &["read", "nope"])
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "gatekeeper \"svc\" has no tool named \"nope\"; grant only tools from its catalog"
    );
    let other = kernel::Overseer::new(common::clock());
    assert!(matches!(
        w.gatekeeper.grant(&other, "agent", &["read"]),
        Err(GrantError::Kernel(_))
    ));
}

#[tokio::test]
async fn arguments_must_be_an_object_and_null_means_none() {
    let w = world(ServerTrust::Byo).await;
    let session = w
        .gatekeeper
        .grant_all(&w.overseer, "agent")
        .expect("grant")
        .into_session();
    let error = session.call_tool("read", json!([1])).await.unwrap_err();
    assert_eq!(error.to_string(), "tool arguments must be a JSON object.");
    session
        .call_tool("read", serde_json::Value::Null)
        .await
        .expect("null is {}");
    assert_eq!(w.service.log()[0].1, json!({}));
}

#[tokio::test]
async fn get_action_result_reports_each_state_to_the_agent() {
    let w = world(ServerTrust::Byo).await;
    let session = w
        .gatekeeper
        .grant(&w.overseer, "agent", &["write"])
        .expect("grant")
        .into_session();
    let queue = |n: u64| {
        let session = session.clone();
        async move {
            session
                .call_tool("write", json!({"n": n}))
                .await
                .expect("queued")
        }
    };
    let pending = queue(1).await;
    let rejected = queue(2).await;
    let failed = queue(3).await;
    let applied = queue(4).await;

    let result = |o: &CallOutcome| {
        let session = session.clone();
        let id = o.action().expect("pending");
        async move { session.get_action_result(id).await.expect("known") }
    };
    assert_eq!(
        result(&pending).await,
        ActionResult::Pending {
            message: "Calling \"write\" on Service is awaiting approval.".into()
        }
    );

    w.overseer
        .reject(rejected.ledger().expect("ledger"), "alice")
        .await
        .expect("rejected");
    assert_eq!(
        result(&rejected).await,
        ActionResult::Rejected {
            message: "Calling \"write\" on Service was not approved.".into()
        }
    );

    w.service
        .reply_next(Err(CallError::Declined("Refused. Ask for access.".into())));
    assert!(
        w.overseer
            .approve(failed.ledger().expect("ledger"), "alice")
            .await
            .is_err()
    );
    assert_eq!(
        result(&failed).await,
        ActionResult::Failed {
            message: "Refused. Ask for access.".into(),
            retryable: true
        }
    );

    w.overseer
        .approve(applied.ledger().expect("ledger"), "alice")
        .await
        .expect("applied");
    let ActionResult::Applied {
        result: data,
        observation,
    } = result(&applied).await
    else {
        panic!("applied");
    };
    assert_eq!(data.text(), "ran write");
    let entry = w
        .overseer
        .entry(observation)
        .expect("ledger")
        .expect("entry");
    let EntryBody::Observation(seen) = &entry.body else {
        panic!("handing over a result is an observation");
    };
    assert_eq!(seen.title, "Result of write on Service");
    assert_eq!(
        seen.description,
        "Read the response from the approved call to `write` on **Service**."
    );

    let missing = DriverActionId(77);
    let error = session.get_action_result(missing).await.unwrap_err();
    assert_eq!(error.to_string(), "No action with id 77.");
}

#[tokio::test]
async fn results_are_visible_only_through_a_grant_of_their_tool() {
    let w = world(ServerTrust::Byo).await;
    let writer = w
        .gatekeeper
        .grant(&w.overseer, "agent", &["write"])
        .expect("grant")
        .into_session();
    let reader = w
        .gatekeeper
        .grant(&w.overseer, "other", &["read"])
        .expect("grant")
        .into_session();
    let action = writer
        .call_tool("write", json!({}))
        .await
        .expect("queued")
        .action()
        .expect("pending");
    assert_eq!(
        reader.get_action_result(action).await,
        Err(SessionError::UnknownAction(action))
    );
}

#[tokio::test]
async fn auto_approval_needs_both_the_vetted_verdict_and_a_persons_rule() {
    for (trust, expect_applied) in [(ServerTrust::Vetted, true), (ServerTrust::Byo, false)] {
        let w = world(trust).await;
        let session = w
            .gatekeeper
            .grant(&w.overseer, "agent", &["tag"])
            .expect("grant")
            .into_session();
        let kind = w.gatekeeper.action_kind("tag").expect("kind");
        assert_eq!(
            kernel::Gatekeeper::auto_approvable_actions(w.gatekeeper.as_ref()),
            if expect_applied {
                vec![kind.clone()]
            } else {
                vec![]
            }
        );
        w.overseer.enable_rule("svc", kind, "alice").expect("rule");
        let outcome = session.call_tool("tag", json!({})).await.expect("queued");
        w.overseer.settle().await;
        let state = action_entry(&w, outcome.ledger().expect("ledger")).state;
        if expect_applied {
            assert_eq!(state, LedgerState::Approved, "{trust}");
            assert_eq!(w.service.calls(), 1);
        } else {
            assert_eq!(state, LedgerState::Pending, "{trust}");
            assert_eq!(w.service.calls(), 0);
        }
    }
}

#[tokio::test]
async fn list_tools_shows_the_granted_tools_with_their_verdicts_as_an_observation() {
    let w = world(ServerTrust::Vetted).await;
    let session = w
        .gatekeeper
        .grant(&w.overseer, "agent", &["write", "read"])
        .expect("grant")
        .into_session();
    let listed: Vec<(String, String, String)> = session
        .list_tools()
        .await
        .expect("listed")
        .into_iter()
        .map(|t| (t.name, t.mode.to_string(), t.classified_by.to_string()))
        .collect();
    assert_eq!(
        listed,
        [
            ("write".into(), "action".into(), "default".into()),
            ("read".into(), "read".into(), "server-annotation".into()),
        ]
    );
    let ledger = w.overseer.ledger().expect("ledger");
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0].title(), "List the tools of Service");
}

#[tokio::test]
async fn a_duplicate_tool_name_keeps_the_first_definition() {
    let tools = gatekeeper_core::Tool::catalog_from_json(json!([
        {"name": "dup", "annotations": {"readOnlyHint": true}},
        {"name": "dup"}
    ]))
    .expect("catalog");
    let gk = gatekeeper_core::ToolGatekeeper::new(
        common::config(ServerTrust::Byo),
        tools,
        common::FakeService::new(),
        gatekeeper_core::ActionStore::in_memory(common::clock()),
    );
    assert_eq!(gk.tools().len(), 1);
    assert!(gk.classification("dup").expect("kept").is_read());
}

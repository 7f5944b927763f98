//! ex06: apply at most once. The claim is stored before the send; what may have landed is
//! never sent again; what was refused before landing may be approved again.

use std::sync::Arc;

use gatekeeper_core::store::{INTERRUPTED_MESSAGE, OUTCOME_UNKNOWN_MESSAGE};
use gatekeeper_core::{ActionResult, ActionStore};
use gatekeeper_issues::IssuesConfig;
use gatekeeper_issues::service::{CREDENTIALS_MESSAGE, DECLINED_MESSAGE};
use kernel::{ActionState, DecisionError, Gatekeeper};

use crate::common::{create, world};

#[tokio::test]
async fn two_concurrent_applies_of_one_action_call_the_tracker_once() {
    let w = world(IssuesConfig::new()).await;
    let s = w.session(&["createIssue"]);
    let (action, _) = create(&s, "Fix login").await;

    let (park, first) = w.apply_parked(action).await;

    let second = w.issues.apply_action(action).await.unwrap_err();
    assert_eq!(
        second.message,
        "action 1 is already being applied; wait for that attempt to finish"
    );
    assert!(second.retryable, "nothing was sent by the second attempt");
    let status = s.get_action_result(action).await.expect("known");
    assert_eq!(
        status,
        ActionResult::Applying {
            message: "Calling \"createIssue\" on Issue tracker was approved and is running.".into()
        }
    );

    park.release();
    first.await.expect("joined").expect("applied");
    w.issues.apply_action(action).await.expect("a no-op now");
    assert_eq!(w.tracker.calls(), 1);
    assert_eq!(w.tracker.issues().len(), 1);
}

#[tokio::test]
async fn the_kernel_refuses_a_second_approval_while_the_first_is_in_flight() {
    let w = world(IssuesConfig::new()).await;
    let s = w.session(&["createIssue"]);
    let (_, ledger) = create(&s, "Fix login").await;
    let park = w.tracker.park_next();
    let first = {
        let overseer = w.overseer.clone();
        tokio::spawn(async move { overseer.approve(ledger, "alice").await })
    };
    park.wait_until_parked().await;
    assert_eq!(
        w.overseer.approve(ledger, "bob").await,
        Err(DecisionError::InFlight(ledger))
    );
    park.release();
    first.await.expect("joined").expect("approved");
    assert_eq!(w.tracker.calls(), 1);
}

#[tokio::test]
async fn a_timeout_after_landing_is_final_and_never_resent() {
    let w = world(IssuesConfig::new()).await;
    let s = w.session(&["createIssue"]);
    let (action, ledger) = create(&s, "Fix login").await;
    w.tracker.lose_next_reply();

    let error = w.overseer.approve(ledger, "alice").await.unwrap_err();
    let DecisionError::ApplyFailed { source, .. } = &error else {
        panic!("apply failed: {error}");
    };
    assert_eq!(source.message, OUTCOME_UNKNOWN_MESSAGE);
    assert!(!source.retryable);
    assert_eq!(w.tracker.writes().len(), 1, "the write landed");
    assert_eq!(w.tracker.issues()[0].title, "Fix login");

    let entry = w.entry(ledger);
    assert_eq!(entry.state, ActionState::Failed);
    assert!(!entry.failure.expect("failure").retryable);
    assert!(matches!(
        w.overseer.approve(ledger, "alice").await,
        Err(DecisionError::NotRetryable { .. })
    ));
    let direct = w.issues.apply_action(action).await.unwrap_err();
    assert_eq!(direct.message, OUTCOME_UNKNOWN_MESSAGE);
    assert_eq!(w.tracker.calls(), 1, "never sent twice");
    assert_eq!(
        s.get_action_result(action).await,
        Ok(ActionResult::Failed {
            message: OUTCOME_UNKNOWN_MESSAGE.into(),
            retryable: false
        })
    );
}

#[tokio::test]
async fn a_403_is_retryable_and_succeeds_when_approved_again() {
    let w = world(IssuesConfig::new()).await;
    let s = w.session(&["createIssue"]);
    let (_, ledger) = create(&s, "Fix login").await;
    w.tracker.decline_next();

    let error = w.overseer.approve(ledger, "alice").await.unwrap_err();
    let DecisionError::ApplyFailed { source, .. } = &error else {
        panic!("apply failed: {error}");
    };
    assert_eq!(source.message, DECLINED_MESSAGE);
    assert!(source.retryable);
    assert!(w.tracker.issues().is_empty(), "nothing landed");
    assert!(w.entry(ledger).failure.expect("failure").retryable);

    w.overseer.approve(ledger, "alice").await.expect("applied");
    assert_eq!(w.entry(ledger).state, ActionState::Approved);
    assert_eq!(w.tracker.calls(), 2);
    assert_eq!(w.tracker.writes().len(), 1);
}

#[tokio::test]
async fn a_401_failure_may_be_rejected_since_nothing_was_sent() {
    let w = world(IssuesConfig::new()).await;
    let s = w.session(&["createIssue"]);
    let (action, ledger) = create(&s, "Fix login").await;
    w.tracker.refuse_credentials_next();
    assert!(w.overseer.approve(ledger, "alice").await.is_err());
    assert_eq!(
        s.get_action_result(action).await,
        Ok(ActionResult::Failed {
            message: CREDENTIALS_MESSAGE.into(),
            retryable: true
        })
    );
    w.overseer.reject(ledger, "alice").await.expect("rejected");
    assert_eq!(w.entry(ledger).state, ActionState::Rejected);
    assert_eq!(
        s.get_action_result(action).await.expect("known").status(),
        "rejected"
    );
    assert!(w.tracker.issues().is_empty());
}

#[tokio::test]
async fn a_store_reopened_over_an_applying_record_never_resends_it() {
    let w = world(IssuesConfig::new()).await;
    let s = w.session(&["createIssue"]);
    let (action, _) = create(&s, "Fix login").await;

    // The first process claims the action and is stuck mid-send.
    let (park, first) = w.apply_parked(action).await;

    // A new process opens the same records.
    let reopened = ActionStore::open(Arc::new(w.storage.clone()), w.clock.clone())
        .await
        .expect("open");
    let restarted = IssuesConfig::new().build(w.tracker.clone(), reopened).await;
    let error = restarted.apply_action(action).await.unwrap_err();
    assert_eq!(error.message, INTERRUPTED_MESSAGE);
    assert!(!error.retryable);
    assert_eq!(w.tracker.calls(), 1);

    // The old send finishes; its outcome no longer overrides the new process's verdict.
    park.release();
    let late = first.await.expect("joined").unwrap_err();
    assert!(!late.retryable, "{}", late.message);
    assert_eq!(w.tracker.calls(), 1, "never sent twice");
    assert_eq!(
        s.get_action_result(action).await.expect("known").message(),
        Some(INTERRUPTED_MESSAGE)
    );
}

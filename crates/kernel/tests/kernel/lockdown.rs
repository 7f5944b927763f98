//! Lockdown: a sensitive observation refuses new actions and every apply; reads go on.

use kernel::{ActionState, DecisionError, ObservationDescription, QueueError};

use crate::support::{label_kind, setup, state, submit};

fn sensitive() -> ObservationDescription {
    ObservationDescription {
        prohibit_all_sharing: true,
        ..ObservationDescription::new("payroll: read salaries", "sensitive table")
    }
}

#[tokio::test]
async fn a_sensitive_observation_latches_lockdown_and_refuses_submissions() {
    let (overseer, gatekeeper, queue) = setup();
    assert!(!overseer.is_locked_down().unwrap());
    queue.authorize_observation(sensitive()).await.unwrap();
    assert!(overseer.is_locked_down().unwrap());

    let refused = queue
        .submit_action(
            kernel::DriverActionId(1),
            crate::support::description("x", false),
        )
        .await
        .unwrap_err();
    assert_eq!(refused, QueueError::LockedDown);
    assert!(refused.to_string().contains("observed sensitive data"));
    // Nothing was recorded for the refused submission.
    assert_eq!(overseer.ledger().unwrap().len(), 1);

    // Reads still work.
    queue
        .authorize_observation(ObservationDescription::new("list issues", ""))
        .await
        .unwrap();
    assert!(gatekeeper.applied().is_empty());
}

#[tokio::test]
async fn actions_pending_at_lockdown_may_be_rejected_but_never_applied() {
    let (overseer, gatekeeper, queue) = setup();
    let manual = submit(&queue, 1, false).await;
    let auto = submit(&queue, 2, true).await;
    queue.authorize_observation(sensitive()).await.unwrap();

    assert_eq!(
        overseer.approve(manual, "alice").await.unwrap_err(),
        DecisionError::LockedDown(manual)
    );
    assert_eq!(state(&overseer, manual), ActionState::Pending);
    overseer
        .enable_rule("issues", label_kind(), "alice")
        .unwrap();
    overseer.settle().await;
    assert_eq!(state(&overseer, auto), ActionState::Pending);

    overseer.reject(manual, "alice").await.unwrap();
    assert_eq!(state(&overseer, manual), ActionState::Rejected);
    assert!(gatekeeper.applied().is_empty());
}

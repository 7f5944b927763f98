//! Submission answers at once and records a pending action; registration errors.

use std::time::Duration;

use kernel::{
    ActionDescription, ActionState, DecisionError, DriverActionId, EntryBody, QueueError,
};

use crate::support::{FakeGatekeeper, setup, state, submit};

#[tokio::test]
async fn submit_returns_before_any_decision_and_records_pending() {
    let (overseer, gatekeeper, queue) = setup();
    let id = submit(&queue, 1, false).await;
    let entry = overseer.entry(id).unwrap().unwrap();
    assert_eq!(&*entry.caller, "agent");
    assert_eq!(&*entry.gatekeeper, "issues");
    assert_eq!(entry.created_at.to_string(), "09:00:00.000");
    assert_eq!(state(&overseer, id), ActionState::Pending);
    overseer.settle().await;
    assert!(
        gatekeeper.applied().is_empty(),
        "nothing is sent without a decision"
    );
}

#[tokio::test]
async fn submit_of_an_auto_approved_action_does_not_wait_for_its_apply() {
    let (overseer, gatekeeper, queue) = setup();
    overseer
        .enable_rule("issues", crate::support::label_kind(), "alice")
        .unwrap();
    let (entered, release) = gatekeeper.park(1);
    // The apply is parked until released; if submit waited for it, this would time out.
    let id = tokio::time::timeout(Duration::from_secs(5), submit(&queue, 1, true))
        .await
        .expect("submit_action must return while the apply is still parked");
    entered.notified().await;
    assert_eq!(state(&overseer, id), ActionState::Pending);
    release.notify_one();
    overseer.settle().await;
    assert_eq!(state(&overseer, id), ActionState::Approved);
}

#[tokio::test]
async fn ids_are_one_sequence_for_actions_and_observations() {
    let (overseer, _gatekeeper, queue) = setup();
    let first = submit(&queue, 1, false).await;
    let observed = queue
        .authorize_observation(kernel::ObservationDescription::new("read", "listed issues"))
        .await
        .unwrap();
    let second = submit(&queue, 2, false).await;
    assert_eq!((first.0, observed.0, second.0), (1, 2, 3));
    let ledger = overseer.ledger().unwrap();
    assert!(matches!(ledger[1].body, EntryBody::Observation(_)));
}

#[tokio::test]
async fn the_same_driver_id_cannot_be_submitted_twice() {
    let (_overseer, _gatekeeper, queue) = setup();
    submit(&queue, 1, false).await;
    let again = queue
        .submit_action(DriverActionId(1), ActionDescription::new("again", ""))
        .await;
    assert_eq!(
        again,
        Err(QueueError::DuplicateSubmission(DriverActionId(1)))
    );
}

#[tokio::test]
async fn registration_and_queues_need_known_unique_names() {
    let (overseer, _gatekeeper, _queue) = setup();
    let err = overseer
        .register(FakeGatekeeper::new("issues"))
        .unwrap_err();
    assert_eq!(err, DecisionError::DuplicateGatekeeper("issues".into()));
    let err = overseer.queue_for("wiki", "agent").err().unwrap();
    assert!(err.to_string().contains("no gatekeeper named \"wiki\""));
    assert_eq!(overseer.gatekeeper_names(), vec!["issues".to_owned()]);
}

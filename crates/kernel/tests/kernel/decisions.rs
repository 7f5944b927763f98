//! Manual approve, reject and revert: state changes, who decided, and the errors.

use kernel::{
    ActionDescription, ActionState, DecisionError, DriverActionId, FailureKind, GatekeeperError,
    LedgerId, ObservationDescription,
};

use crate::support::{both_decisions_refused_in_flight, setup, state, submit};

#[tokio::test]
async fn approve_applies_once_and_records_who_and_when() {
    let (overseer, gatekeeper, queue) = setup();
    let id = submit(&queue, 7, false).await;
    overseer.approve(id, "alice").await.unwrap();
    let entry = overseer.entry(id).unwrap().unwrap();
    let action = entry.action().unwrap();
    assert_eq!(action.state, ActionState::Approved);
    let resolution = action.resolution.as_ref().unwrap();
    assert_eq!((resolution.by.as_str(), resolution.auto), ("alice", false));
    assert!(resolution.at > entry.created_at);
    assert_eq!(gatekeeper.applied(), vec![7]);

    let again = overseer.approve(id, "bob").await.unwrap_err();
    assert_eq!(
        again,
        DecisionError::NotPending {
            id,
            state: ActionState::Approved
        }
    );
    assert_eq!(gatekeeper.times_applied(7), 1);
}

#[tokio::test]
async fn approvals_may_come_in_any_order() {
    let (overseer, gatekeeper, queue) = setup();
    let a = submit(&queue, 1, false).await;
    let b = submit(&queue, 2, false).await;
    overseer.approve(b, "alice").await.unwrap();
    overseer.approve(a, "alice").await.unwrap();
    assert_eq!(gatekeeper.applied(), vec![2, 1]);
}

#[tokio::test]
async fn unknown_ids_and_observations_are_clear_errors_that_change_nothing() {
    let (overseer, gatekeeper, queue) = setup();
    let observed = queue
        .authorize_observation(ObservationDescription::new("read", ""))
        .await
        .unwrap();
    let missing = LedgerId(99);
    assert_eq!(
        overseer.approve(missing, "a").await.unwrap_err(),
        DecisionError::UnknownEntry(missing)
    );
    assert!(
        overseer
            .reject(missing, "a")
            .await
            .unwrap_err()
            .to_string()
            .contains("there is no entry #99")
    );
    assert_eq!(
        overseer.approve(observed, "a").await.unwrap_err(),
        DecisionError::Observation(observed)
    );
    assert_eq!(
        overseer.reject(observed, "a").await.unwrap_err(),
        DecisionError::Observation(observed)
    );
    assert_eq!(
        overseer.revert(observed, "a").await.unwrap_err(),
        DecisionError::Observation(observed)
    );
    assert!(gatekeeper.applied().is_empty());
    assert!(gatekeeper.rejects.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_failed_apply_is_its_own_state_with_the_message() {
    let (overseer, gatekeeper, queue) = setup();
    let id = submit(&queue, 1, false).await;
    gatekeeper.fail_next_apply(1, GatekeeperError::fatal("timed out after sending"));
    let err = overseer.approve(id, "alice").await.unwrap_err();
    assert!(matches!(err, DecisionError::ApplyFailed { .. }));
    let entry = overseer.entry(id).unwrap().unwrap();
    let action = entry.action().unwrap();
    assert_eq!(action.state, ActionState::Failed);
    let failure = action.failure.as_ref().unwrap();
    assert_eq!(failure.message, "timed out after sending");
    assert!(!failure.retryable);

    let again = overseer.approve(id, "alice").await.unwrap_err();
    assert_eq!(
        again,
        DecisionError::NotRetryable {
            id,
            message: "timed out after sending".into()
        }
    );
    assert!(overseer.open_actions().unwrap().is_empty());
}

#[tokio::test]
async fn the_ledger_tells_a_call_not_sent_from_one_refused_by_the_service_and_an_unknown_outcome() {
    let (overseer, gatekeeper, queue) = setup();
    let cases = [
        (
            1,
            GatekeeperError::fatal("timed out after sending"),
            FailureKind::OutcomeUnknown,
        ),
        (
            2,
            GatekeeperError::not_sent("stale: nothing was sent"),
            FailureKind::NotSent,
        ),
        (
            3,
            GatekeeperError::retryable("credentials refused"),
            FailureKind::NotSent,
        ),
        (
            4,
            GatekeeperError::service_error("404: no such issue", false),
            FailureKind::ServiceError,
        ),
    ];
    for (driver_id, error, kind) in cases {
        let id = submit(&queue, driver_id, false).await;
        gatekeeper.fail_next_apply(driver_id, error.clone());
        overseer.approve(id, "alice").await.unwrap_err();
        let entry = overseer.entry(id).unwrap().unwrap();
        let failure = entry.action().unwrap().failure.clone().unwrap();
        assert_eq!(
            (failure.kind, failure.retryable),
            (kind, error.retryable),
            "{error:?}"
        );
    }
}

#[tokio::test]
async fn a_retryable_failure_may_be_approved_again_or_rejected() {
    let (overseer, gatekeeper, queue) = setup();
    let id = submit(&queue, 1, false).await;
    gatekeeper.fail_next_apply(1, GatekeeperError::retryable("403: refused"));
    overseer.approve(id, "alice").await.unwrap_err();
    assert_eq!(state(&overseer, id), ActionState::Failed);
    assert_eq!(
        overseer.open_actions().unwrap().len(),
        1,
        "still waits for a person"
    );
    overseer.approve(id, "alice").await.unwrap();
    assert_eq!(state(&overseer, id), ActionState::Approved);
    assert_eq!(gatekeeper.times_applied(1), 1);

    let other = submit(&queue, 2, false).await;
    gatekeeper.fail_next_apply(2, GatekeeperError::retryable("403: refused"));
    overseer.approve(other, "alice").await.unwrap_err();
    overseer.reject(other, "alice").await.unwrap();
    assert_eq!(state(&overseer, other), ActionState::Rejected);
}

#[tokio::test]
async fn reject_sends_nothing_and_records_the_restart_hint() {
    let (overseer, gatekeeper, queue) = setup();
    gatekeeper.restart_on_reject();
    let id = submit(&queue, 3, false).await;
    let report = overseer.reject(id, "bob").await.unwrap();
    assert!(report.restart);
    let entry = overseer.entry(id).unwrap().unwrap();
    let action = entry.action().unwrap();
    assert_eq!(action.state, ActionState::Rejected);
    assert!(action.restart_requested);
    assert_eq!(action.resolution.as_ref().unwrap().by, "bob");
    assert!(gatekeeper.applied().is_empty());
    assert_eq!(
        overseer.reject(id, "bob").await.unwrap_err(),
        DecisionError::NotPending {
            id,
            state: ActionState::Rejected
        }
    );
    assert_eq!(
        overseer.approve(id, "bob").await.unwrap_err(),
        DecisionError::NotPending {
            id,
            state: ActionState::Rejected
        }
    );
}

#[tokio::test]
async fn a_persons_reason_for_a_rejection_is_recorded_in_the_ledger_and_none_is_invented() {
    let (overseer, gatekeeper, queue) = setup();
    let with = submit(&queue, 1, false).await;
    let without = submit(&queue, 2, false).await;
    overseer
        .reject_with_reason(with, "bob", Some("not on a friday"))
        .await
        .unwrap();
    overseer.reject(without, "bob").await.unwrap();
    let cause = |id| {
        overseer
            .entry(id)
            .unwrap()
            .unwrap()
            .action()
            .unwrap()
            .resolution
            .clone()
            .unwrap()
            .cause
    };
    assert_eq!(cause(with).as_deref(), Some("not on a friday"));
    assert_eq!(cause(without), None);
    assert!(gatekeeper.applied().is_empty());
}

#[tokio::test]
async fn cascaded_rejections_are_marked_with_their_cause() {
    let (overseer, gatekeeper, queue) = setup();
    let parent = submit(&queue, 1, false).await;
    let child = submit(&queue, 2, false).await;
    let edit = submit(&queue, 3, false).await;
    let unrelated = submit(&queue, 4, false).await;
    gatekeeper.cascade_on_reject(1, &[2, 3]);
    let report = overseer.reject(parent, "bob").await.unwrap();
    assert_eq!(report.cascaded, vec![child, edit]);
    for id in [child, edit] {
        let entry = overseer.entry(id).unwrap().unwrap();
        let action = entry.action().unwrap();
        assert_eq!(action.state, ActionState::Rejected);
        assert_eq!(
            action.resolution.as_ref().unwrap().cause.as_deref(),
            Some("cascaded from #1")
        );
    }
    assert_eq!(state(&overseer, unrelated), ActionState::Pending);
}

#[tokio::test]
async fn revert_only_where_promised_and_records_the_outcome() {
    let (overseer, gatekeeper, queue) = setup();
    let plain = submit(&queue, 1, false).await;
    overseer.approve(plain, "alice").await.unwrap();
    assert_eq!(
        overseer.revert(plain, "alice").await.unwrap_err(),
        DecisionError::RevertUnsupported(plain)
    );

    let revertible = ActionDescription {
        implements_revert: true,
        ..ActionDescription::new("label", "")
    };
    let id = queue
        .submit_action(DriverActionId(2), revertible.clone())
        .await
        .unwrap();
    assert_eq!(
        overseer.revert(id, "alice").await.unwrap_err(),
        DecisionError::NotApplied {
            id,
            state: ActionState::Pending
        }
    );
    overseer.approve(id, "alice").await.unwrap();
    let report = overseer.revert(id, "carol").await.unwrap();
    assert!(report.reverted);
    let entry = overseer.entry(id).unwrap().unwrap();
    let action = entry.action().unwrap();
    assert_eq!(action.state, ActionState::Reverted);
    assert_eq!(action.revert.as_ref().unwrap().by, "carol");
    assert_eq!(*gatekeeper.reverts.lock().unwrap(), vec![2]);

    gatekeeper.refuse_reverts("the label was there before; not removing it");
    let refused = queue
        .submit_action(DriverActionId(3), revertible)
        .await
        .unwrap();
    overseer.approve(refused, "alice").await.unwrap();
    let report = overseer.revert(refused, "carol").await.unwrap();
    assert!(!report.reverted);
    assert!(report.can_retry);
    let entry = overseer.entry(refused).unwrap().unwrap();
    let action = entry.action().unwrap();
    assert_eq!(action.state, ActionState::Approved);
    assert_eq!(
        action.revert.as_ref().unwrap().refused.as_deref(),
        Some("the label was there before; not removing it")
    );
}

#[tokio::test]
async fn a_second_decision_while_one_is_in_flight_is_refused() {
    let (overseer, gatekeeper, queue) = setup();
    let id = submit(&queue, 1, false).await;
    let (entered, release) = gatekeeper.park(1);
    let first = {
        let overseer = overseer.clone();
        tokio::spawn(async move { overseer.approve(id, "alice").await })
    };
    entered.notified().await;
    both_decisions_refused_in_flight(&overseer, id).await;
    release.notify_one();
    first.await.unwrap().unwrap();
    assert_eq!(gatekeeper.times_applied(1), 1);
}

#[tokio::test]
async fn who_decided_is_recorded_before_the_driver_is_called() {
    let (overseer, gatekeeper, queue) = setup();
    let id = submit(&queue, 1, false).await;
    let (entered, release) = gatekeeper.park(1);
    let approval = {
        let overseer = overseer.clone();
        tokio::spawn(async move { overseer.approve(id, "alice").await })
    };
    entered.notified().await;
    // Mid-apply (a crash here would leave exactly this record): still open, and the
    // ledger already says who approved the call that may be on its way.
    let entry = overseer.entry(id).unwrap().unwrap();
    let action = entry.action().unwrap();
    assert_eq!(action.state, ActionState::Pending);
    assert_eq!(action.resolution.as_ref().unwrap().by, "alice");
    release.notify_one();
    approval.await.unwrap().unwrap();
    assert_eq!(state(&overseer, id), ActionState::Approved);
}

#[tokio::test]
async fn a_revert_flags_the_open_actions_built_on_it_and_a_refused_one_does_not() {
    let (overseer, gatekeeper, queue) = setup();
    // Driver action `base` is applied; `base + 1` was built on it and still waits.
    let applied_with_a_dependent = |base: u64| {
        let (overseer, queue) = (overseer.clone(), queue.clone());
        async move {
            let revertible = |title: &str, depends_on: Vec<DriverActionId>| ActionDescription {
                implements_revert: true,
                depends_on,
                ..ActionDescription::new(title, "")
            };
            let applied = queue
                .submit_action(DriverActionId(base), revertible("rename", Vec::new()))
                .await
                .unwrap();
            let dependent = queue
                .submit_action(
                    DriverActionId(base + 1),
                    revertible("comment", vec![DriverActionId(base)]),
                )
                .await
                .unwrap();
            overseer.approve(applied, "alice").await.unwrap();
            (applied, dependent)
        }
    };
    let (rename, comment) = applied_with_a_dependent(1).await;
    let unrelated = submit(&queue, 3, false).await;
    let report = overseer.revert(rename, "carol").await.unwrap();
    assert!(report.reverted);
    assert_eq!(report.flagged, vec![comment]);
    let entry = overseer.entry(comment).unwrap().unwrap();
    assert_eq!(entry.action().unwrap().blocked_by, Some(rename));
    assert_eq!(state(&overseer, comment), ActionState::Pending);
    let entry = overseer.entry(unrelated).unwrap().unwrap();
    assert_eq!(entry.action().unwrap().blocked_by, None);

    gatekeeper.refuse_reverts("the page changed since");
    let (rename, comment) = applied_with_a_dependent(4).await;
    let report = overseer.revert(rename, "carol").await.unwrap();
    assert!(!report.reverted);
    assert!(report.flagged.is_empty(), "nothing was undone");
    let entry = overseer.entry(comment).unwrap().unwrap();
    assert_eq!(entry.action().unwrap().blocked_by, None);
}

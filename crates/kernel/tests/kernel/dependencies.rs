//! Semantic dependencies: dependents of a rejected action are flagged and held for a person.

use kernel::{ActionDescription, ActionState, DriverActionId};

use crate::support::{description, label_kind, setup, state, submit};

fn depending(title: &str, auto: bool, on: &[u64]) -> ActionDescription {
    ActionDescription {
        depends_on: on.iter().copied().map(DriverActionId).collect(),
        ..description(title, auto)
    }
}

#[tokio::test]
async fn rejecting_a_root_flags_its_dependents_transitively_and_keeps_others() {
    let (overseer, gatekeeper, queue) = setup();
    let root = submit(&queue, 1, false).await;
    let direct = queue
        .submit_action(DriverActionId(2), depending("quote the title", true, &[1]))
        .await
        .unwrap();
    let indirect = queue
        .submit_action(DriverActionId(3), depending("reply", true, &[2]))
        .await
        .unwrap();
    let independent = submit(&queue, 4, true).await;
    let entry = overseer.entry(direct).unwrap().unwrap();
    assert_eq!(entry.action().unwrap().depends_on, vec![root]);

    let report = overseer.reject(root, "alice").await.unwrap();
    assert_eq!(report.flagged, vec![direct, indirect]);
    for id in [direct, indirect] {
        let entry = overseer.entry(id).unwrap().unwrap();
        assert_eq!(entry.action().unwrap().blocked_by, Some(root));
    }

    // Flagged actions are never auto-applied, and hold back what follows them.
    overseer
        .enable_rule("issues", label_kind(), "alice")
        .unwrap();
    overseer.settle().await;
    assert_eq!(state(&overseer, direct), ActionState::Pending);
    assert_eq!(state(&overseer, independent), ActionState::Pending);

    // A person may still approve them deliberately.
    overseer.approve(direct, "alice").await.unwrap();
    overseer.approve(indirect, "alice").await.unwrap();
    overseer.settle().await;
    assert_eq!(state(&overseer, independent), ActionState::Approved);
    assert_eq!(gatekeeper.applied(), vec![2, 3, 4]);
}

#[tokio::test]
async fn an_action_staged_on_top_of_a_rejected_one_is_flagged_at_submission() {
    let (overseer, _gatekeeper, queue) = setup();
    let root = submit(&queue, 1, false).await;
    overseer.reject(root, "alice").await.unwrap();
    let late = queue
        .submit_action(DriverActionId(2), depending("late", true, &[1]))
        .await
        .unwrap();
    let entry = overseer.entry(late).unwrap().unwrap();
    assert_eq!(entry.action().unwrap().blocked_by, Some(root));
}

#[tokio::test]
async fn an_action_that_fails_for_good_flags_its_dependents_too() {
    let (overseer, gatekeeper, queue) = setup();
    let root = submit(&queue, 1, false).await;
    let dependent = queue
        .submit_action(DriverActionId(2), depending("comment", true, &[1]))
        .await
        .unwrap();
    gatekeeper.fail_next_apply(1, kernel::GatekeeperError::fatal("stale: page moved on"));
    overseer.approve(root, "alice").await.unwrap_err();
    let entry = overseer.entry(dependent).unwrap().unwrap();
    assert_eq!(entry.action().unwrap().blocked_by, Some(root));
    let late = queue
        .submit_action(DriverActionId(3), depending("late", true, &[1]))
        .await
        .unwrap();
    let entry = overseer.entry(late).unwrap().unwrap();
    assert_eq!(entry.action().unwrap().blocked_by, Some(root));

    // A retryable failure is not final: nothing is flagged.
    let other = submit(&queue, 4, false).await;
    let on_other = queue
        .submit_action(DriverActionId(5), depending("x", false, &[4]))
        .await
        .unwrap();
    gatekeeper.fail_next_apply(4, kernel::GatekeeperError::retryable("403"));
    overseer.approve(other, "alice").await.unwrap_err();
    let entry = overseer.entry(on_other).unwrap().unwrap();
    assert_eq!(entry.action().unwrap().blocked_by, None);
}

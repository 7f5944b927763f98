//! Faults: a driver that panics, a service that never answers, a decision abandoned half
//! way, a revert during lockdown, a decision attributed to nobody. Each ends in a ledger
//! entry a person can read, never in a wedged gatekeeper or a second send.

use std::time::Duration;

use kernel::{
    ActionDescription, ActionState, DEFAULT_CALL_DEADLINE, DecisionError, DriverActionId, LedgerId,
    ObservationDescription, Overseer,
};
use tokio::time::Instant;

use crate::support::{label_kind, setup, state, submit};

/// `work`, or a failure if it is still running after an hour of (paused) time: without a
/// deadline a hung service would hang the test instead of failing it.
async fn within_an_hour<T>(work: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(3600), work)
        .await
        .expect("still waiting after an hour: the hung call has no deadline")
}

/// The failure recorded on `id`: (message, retryable).
fn failure(overseer: &Overseer, id: LedgerId) -> (String, bool) {
    let entry = overseer.entry(id).unwrap().unwrap();
    let failure = entry.action().unwrap().failure.clone().expect("a failure");
    (failure.message, failure.retryable)
}

/// A second approve and a reject of an action whose outcome is unknown are both refused.
async fn assert_final(overseer: &Overseer, id: LedgerId) {
    assert!(matches!(
        overseer.approve(id, "bob").await.unwrap_err(),
        DecisionError::NotRetryable { .. }
    ));
    assert!(matches!(
        overseer.reject(id, "bob").await.unwrap_err(),
        DecisionError::NotRetryable { .. }
    ));
}

#[tokio::test]
async fn a_panicking_apply_in_a_drain_leaves_auto_approval_running() {
    let (overseer, gatekeeper, queue) = setup();
    overseer
        .enable_rule("issues", label_kind(), "alice")
        .unwrap();
    gatekeeper.panic_on_apply(1);
    let panicked = submit(&queue, 1, true).await;
    overseer.settle().await;

    assert_eq!(state(&overseer, panicked), ActionState::Failed);
    let (message, retryable) = failure(&overseer, panicked);
    assert!(!retryable, "the call may have been sent: outcome unknown");
    assert!(message.contains("panicked"), "{message}");
    assert!(
        message.contains("fake driver bug while applying 1"),
        "{message}"
    );

    // The drain's guard was released: the next auto-approvable action is applied.
    let next = submit(&queue, 2, true).await;
    overseer.settle().await;
    assert_eq!(state(&overseer, next), ActionState::Approved);
    assert_eq!(gatekeeper.applied(), vec![2]);
    assert_final(&overseer, panicked).await;
    assert_eq!(gatekeeper.attempted(), vec![1, 2], "never sent twice");
}

#[tokio::test]
async fn the_drain_stops_at_a_panicking_apply_as_at_any_failure() {
    let (overseer, gatekeeper, queue) = setup();
    gatekeeper.panic_on_apply(1);
    let panicked = submit(&queue, 1, true).await;
    let after = submit(&queue, 2, true).await;
    overseer
        .enable_rule("issues", label_kind(), "alice")
        .unwrap();
    overseer.settle().await;
    assert_eq!(state(&overseer, panicked), ActionState::Failed);
    assert_eq!(
        state(&overseer, after),
        ActionState::Pending,
        "the pass stopped at the failure"
    );
    // The next trigger goes past it: it no longer waits for anyone.
    let third = submit(&queue, 3, true).await;
    overseer.settle().await;
    assert_eq!(state(&overseer, after), ActionState::Approved);
    assert_eq!(state(&overseer, third), ActionState::Approved);
}

#[tokio::test]
async fn a_panicking_apply_in_a_persons_approve_is_recorded_as_outcome_unknown() {
    let (overseer, gatekeeper, queue) = setup();
    gatekeeper.panic_on_apply(1);
    let id = submit(&queue, 1, false).await;
    let DecisionError::ApplyFailed { source, .. } =
        overseer.approve(id, "alice").await.unwrap_err()
    else {
        panic!("the panic is an apply failure");
    };
    assert!(!source.retryable);
    assert!(source.message.contains("panicked"), "{}", source.message);
    assert_eq!(state(&overseer, id), ActionState::Failed);
    let entry = overseer.entry(id).unwrap().unwrap();
    assert_eq!(
        entry.action().unwrap().resolution.as_ref().unwrap().by,
        "alice"
    );
    assert_final(&overseer, id).await;
    assert_eq!(gatekeeper.attempted(), vec![1]);
}

#[tokio::test]
async fn an_approve_dropped_mid_apply_is_recorded_as_outcome_unknown_and_never_resent() {
    let (overseer, gatekeeper, queue) = setup();
    let id = submit(&queue, 1, false).await;
    let (entered, _release) = gatekeeper.park(1);
    {
        let approve = overseer.approve(id, "alice");
        tokio::pin!(approve);
        tokio::select! {
            _ = &mut approve => panic!("the apply is parked"),
            () = entered.notified() => {}
        }
        // The caller gives up: the approve future is dropped while the driver works.
    }
    assert_eq!(state(&overseer, id), ActionState::Failed);
    let (message, retryable) = failure(&overseer, id);
    assert!(!retryable);
    assert!(message.contains("abandoned"), "{message}");
    assert_final(&overseer, id).await;
    assert_eq!(gatekeeper.attempted(), vec![1], "asked to apply once, ever");
}

/// A drain torn down mid-apply (its runtime shut down while the driver is applying) is
/// recorded as an unknown outcome and never asked again.
#[test]
fn a_drain_torn_down_mid_apply_is_recorded_as_outcome_unknown() {
    let (overseer, gatekeeper, queue) = setup();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let (id, _release) = runtime.block_on(async {
        overseer
            .enable_rule("issues", label_kind(), "alice")
            .unwrap();
        let (entered, release) = gatekeeper.park(1);
        let id = submit(&queue, 1, true).await;
        entered.notified().await;
        (id, release)
    });
    // The drain is parked in the driver's apply: shutting the runtime down drops it there.
    drop(runtime);
    assert_eq!(state(&overseer, id), ActionState::Failed);
    let (message, retryable) = failure(&overseer, id);
    assert!(!retryable);
    assert!(message.contains("abandoned"), "{message}");
    assert_eq!(gatekeeper.attempted(), vec![1], "asked to apply once, ever");
}

#[tokio::test(start_paused = true)]
async fn a_hung_service_answers_the_person_within_the_deadline() {
    let (overseer, gatekeeper, queue) = setup();
    gatekeeper.set_deadline(Duration::from_secs(10));
    gatekeeper.hang_on_apply(1);
    let id = submit(&queue, 1, false).await;
    let started = Instant::now();
    let DecisionError::ApplyFailed { source, .. } = within_an_hour(overseer.approve(id, "alice"))
        .await
        .unwrap_err()
    else {
        panic!("a missed deadline is an apply failure");
    };
    assert_eq!(started.elapsed(), Duration::from_secs(10), "paused time");
    assert!(!source.retryable, "it may have landed");
    assert!(
        source.message.contains("did not answer within 10 s"),
        "{}",
        source.message
    );
    assert_eq!(state(&overseer, id), ActionState::Failed);
    assert_final(&overseer, id).await;
    assert_eq!(gatekeeper.attempted(), vec![1]);
}

#[tokio::test(start_paused = true)]
async fn a_hung_service_in_a_drain_lets_settle_return_and_the_drain_go_on() {
    let (overseer, gatekeeper, queue) = setup();
    overseer
        .enable_rule("issues", label_kind(), "alice")
        .unwrap();
    gatekeeper.hang_on_apply(1);
    let started = Instant::now();
    let hung = submit(&queue, 1, true).await;
    let behind = submit(&queue, 2, true).await;
    within_an_hour(overseer.settle()).await;
    assert_eq!(
        started.elapsed(),
        DEFAULT_CALL_DEADLINE,
        "the default deadline"
    );
    assert_eq!(state(&overseer, hung), ActionState::Failed);
    assert!(!failure(&overseer, hung).1);
    // The pass that hung stopped there; the rerun its second submission asked for went on.
    assert_eq!(state(&overseer, behind), ActionState::Approved);
    assert_eq!(gatekeeper.applied(), vec![2]);
}

#[tokio::test]
async fn a_revert_during_lockdown_is_refused_and_never_reaches_the_driver() {
    let (overseer, gatekeeper, queue) = setup();
    let revertible = ActionDescription {
        implements_revert: true,
        ..ActionDescription::new("label", "add a label")
    };
    let id = queue
        .submit_action(DriverActionId(1), revertible)
        .await
        .unwrap();
    overseer.approve(id, "alice").await.unwrap();
    queue
        .authorize_observation(ObservationDescription {
            prohibit_all_sharing: true,
            ..ObservationDescription::new("payroll", "salaries")
        })
        .await
        .unwrap();

    let refused = overseer.revert(id, "alice").await.unwrap_err();
    assert_eq!(refused, DecisionError::RevertLockedDown(id));
    assert!(
        refused.to_string().contains("cannot be reverted"),
        "{refused}"
    );
    assert!(gatekeeper.reverts.lock().unwrap().is_empty());
    let entry = overseer.entry(id).unwrap().unwrap();
    let action = entry.action().unwrap();
    assert_eq!(action.state, ActionState::Approved);
    assert_eq!(action.revert, None, "nothing was asked of the driver");
}

#[tokio::test]
async fn an_empty_or_blank_decider_name_is_refused() {
    let (overseer, gatekeeper, queue) = setup();
    let id = submit(&queue, 1, true).await;
    for nobody in ["", "   ", "\t\n"] {
        assert_eq!(
            overseer.approve(id, nobody).await.unwrap_err(),
            DecisionError::NoDecider
        );
        assert_eq!(
            overseer.reject(id, nobody).await.unwrap_err(),
            DecisionError::NoDecider
        );
        assert_eq!(
            overseer.revert(id, nobody).await.unwrap_err(),
            DecisionError::NoDecider
        );
        assert_eq!(
            overseer
                .enable_rule("issues", label_kind(), nobody)
                .unwrap_err(),
            DecisionError::NoDecider
        );
    }
    assert!(
        DecisionError::NoDecider
            .to_string()
            .contains("name of the person deciding is empty")
    );
    overseer.settle().await;
    let entry = overseer.entry(id).unwrap().unwrap();
    assert_eq!(entry.action().unwrap().state, ActionState::Pending);
    assert_eq!(entry.action().unwrap().resolution, None);
    assert!(overseer.rules().unwrap().is_empty());
    assert!(gatekeeper.attempted().is_empty());
}

#[tokio::test(start_paused = true)]
async fn each_gatekeeper_has_its_own_deadline() {
    let (overseer, gatekeeper, queue) = setup();
    let quick = crate::support::FakeGatekeeper::new("quick");
    quick.set_deadline(Duration::from_millis(250));
    overseer.register(quick.clone()).unwrap();
    let quick_queue = overseer.queue_for("quick", "agent").unwrap();
    quick.hang_on_apply(1);
    gatekeeper.hang_on_apply(1);
    let on_quick = submit(&quick_queue, 1, false).await;
    let on_default = submit(&queue, 1, false).await;

    let started = Instant::now();
    let error = within_an_hour(overseer.approve(on_quick, "alice"))
        .await
        .unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_millis(250));
    assert!(error.to_string().contains("within 250 ms"), "{error}");

    let started = Instant::now();
    within_an_hour(overseer.approve(on_default, "alice"))
        .await
        .unwrap_err();
    assert_eq!(started.elapsed(), DEFAULT_CALL_DEADLINE);
}

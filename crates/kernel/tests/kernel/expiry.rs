//! Expiry: a pending action older than its gatekeeper's time to live is expired (its own
//! final state), nothing is sent, and no apply, by a person or a rule, sends it.

use std::sync::Arc;
use std::time::Duration;

use kernel::{ActionState, DecisionError, EXPIRY_DECIDER, Overseer, StepClock};

use crate::support::{FakeGatekeeper, label_kind, state, submit};

const HOUR: u64 = 3600 * 1000;

/// A kernel on a clock that moves only when told, with the fake "issues" gatekeeper.
fn setup() -> (
    Overseer,
    Arc<StepClock>,
    Arc<FakeGatekeeper>,
    Arc<dyn kernel::ApprovalQueue>,
) {
    let clock = Arc::new(StepClock::new(9 * HOUR, 0));
    let overseer = Overseer::new(clock.clone());
    let gatekeeper = FakeGatekeeper::new("issues");
    overseer.register(gatekeeper.clone()).unwrap();
    let queue = overseer.queue_for("issues", "agent").unwrap();
    (overseer, clock, gatekeeper, queue)
}

#[tokio::test]
async fn an_action_past_its_time_to_live_expires_unsent_and_is_not_rejected() {
    let (overseer, clock, gatekeeper, queue) = setup();
    overseer.set_time_to_live(None, Some(Duration::from_secs(24 * 3600)));
    let old = submit(&queue, 1, false).await;
    clock.advance(23 * HOUR);
    let young = submit(&queue, 2, false).await;
    assert!(overseer.expire_due().await.unwrap().is_empty(), "not yet");

    clock.advance(HOUR);
    assert_eq!(overseer.expire_due().await.unwrap(), [old]);
    assert_eq!(state(&overseer, old), ActionState::Expired);
    assert_ne!(ActionState::Expired, ActionState::Rejected);
    assert_eq!(state(&overseer, young), ActionState::Pending);
    let entry = overseer.entry(old).unwrap().unwrap();
    let resolution = entry.action().unwrap().resolution.clone().unwrap();
    assert_eq!(resolution.by, EXPIRY_DECIDER);
    assert!(
        resolution.cause.unwrap().contains("time to live (24 h)"),
        "the cause says why"
    );
    assert!(gatekeeper.applied().is_empty(), "nothing was sent");
    assert!(overseer.open_actions().unwrap().iter().all(|e| e.id != old));

    // Final: neither a person's approval nor a rejection moves it.
    assert!(matches!(
        overseer.approve(old, "alice").await,
        Err(DecisionError::NotPending {
            state: ActionState::Expired,
            ..
        })
    ));
    assert!(overseer.reject(old, "alice").await.is_err());
    assert!(gatekeeper.applied().is_empty());
}

#[tokio::test]
async fn a_person_approving_an_action_past_its_time_to_live_expires_it_instead() {
    let (overseer, clock, gatekeeper, queue) = setup();
    overseer.set_time_to_live(Some("issues"), Some(Duration::from_secs(60)));
    let id = submit(&queue, 1, false).await;
    clock.advance(60 * 1000);
    // Not swept yet: the approval itself checks the time to live.
    assert_eq!(
        overseer.approve(id, "alice").await,
        Err(DecisionError::Expired(id))
    );
    assert_eq!(state(&overseer, id), ActionState::Expired);
    assert!(gatekeeper.applied().is_empty());
}

#[tokio::test]
async fn a_rule_never_applies_an_expired_action_and_it_holds_nothing_back() {
    let (overseer, clock, gatekeeper, queue) = setup();
    overseer.set_time_to_live(None, Some(Duration::from_secs(3600)));
    let stale = submit(&queue, 1, true).await;
    clock.advance(HOUR);
    let fresh = submit(&queue, 2, true).await;
    // The rule's drain meets the stale action first: it expires it, then applies the
    // fresh one.
    overseer
        .enable_rule("issues", label_kind(), "alice")
        .unwrap();
    overseer.settle().await;
    assert_eq!(state(&overseer, stale), ActionState::Expired);
    assert_eq!(state(&overseer, fresh), ActionState::Approved);
    assert_eq!(gatekeeper.applied(), [2], "only the fresh one was sent");
}

#[tokio::test]
async fn a_gatekeepers_own_time_to_live_overrides_the_default_and_none_is_forever() {
    let (overseer, clock, _gatekeeper, queue) = setup();
    let id = submit(&queue, 1, false).await;
    clock.advance(1000 * HOUR);
    assert!(
        overseer.expire_due().await.unwrap().is_empty(),
        "forever by default"
    );
    overseer.set_time_to_live(None, Some(Duration::from_secs(1)));
    overseer.set_time_to_live(Some("issues"), Some(Duration::from_secs(2000 * 3600)));
    assert!(
        overseer.expire_due().await.unwrap().is_empty(),
        "its own is longer"
    );
    overseer.set_time_to_live(Some("issues"), None);
    assert_eq!(
        overseer.expire_due().await.unwrap(),
        [id],
        "back to the default"
    );
}

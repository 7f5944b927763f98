//! The drainer: two keys, ascending order, stop at the first gate or failure, single flight.

use std::sync::Arc;

use kernel::{ActionState, GatekeeperError};

use crate::support::{both_decisions_refused_in_flight, label_kind, setup, state, submit};

#[tokio::test]
async fn each_key_alone_applies_nothing() {
    let (overseer, gatekeeper, queue) = setup();
    // Key one only: the driver says auto-approvable, no person enabled a rule.
    let driver_only = submit(&queue, 1, true).await;
    overseer.settle().await;
    assert_eq!(state(&overseer, driver_only), ActionState::Pending);
    overseer.reject(driver_only, "alice").await.unwrap();

    // Key two only: a rule exists, the driver did not say auto-approvable.
    overseer
        .enable_rule("issues", label_kind(), "alice")
        .unwrap();
    let rule_only = submit(&queue, 2, false).await;
    overseer.settle().await;
    assert_eq!(state(&overseer, rule_only), ActionState::Pending);
    assert!(gatekeeper.applied().is_empty());
}

#[tokio::test]
async fn both_keys_apply_and_attribute_to_the_rule_enabler() {
    let (overseer, gatekeeper, queue) = setup();
    overseer
        .enable_rule("issues", label_kind(), "alice")
        .unwrap();
    let id = submit(&queue, 1, true).await;
    overseer.settle().await;
    let entry = overseer.entry(id).unwrap().unwrap();
    let action = entry.action().unwrap();
    assert_eq!(action.state, ActionState::Approved);
    let resolution = action.resolution.as_ref().unwrap();
    assert_eq!((resolution.by.as_str(), resolution.auto), ("alice", true));
    assert_eq!(gatekeeper.applied(), vec![1]);
    let rules = overseer.rules().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].enabled_by, "alice");
}

#[tokio::test]
async fn the_drain_stops_at_a_manual_gate_and_resumes_when_it_is_approved() {
    let (overseer, gatekeeper, queue) = setup();
    let first = submit(&queue, 1, true).await;
    let gate = submit(&queue, 2, false).await;
    let held = submit(&queue, 3, true).await;
    let also_held = submit(&queue, 4, true).await;
    overseer
        .enable_rule("issues", label_kind(), "alice")
        .unwrap();
    overseer.settle().await;
    assert_eq!(state(&overseer, first), ActionState::Approved);
    assert_eq!(state(&overseer, gate), ActionState::Pending);
    assert_eq!(
        state(&overseer, held),
        ActionState::Pending,
        "never skips ahead"
    );
    assert_eq!(state(&overseer, also_held), ActionState::Pending);

    overseer.approve(gate, "bob").await.unwrap();
    overseer.settle().await;
    assert_eq!(state(&overseer, held), ActionState::Approved);
    assert_eq!(state(&overseer, also_held), ActionState::Approved);
    assert_eq!(gatekeeper.applied(), vec![1, 2, 3, 4]);
}

#[tokio::test]
async fn rejecting_a_manual_gate_also_releases_what_it_held() {
    let (overseer, gatekeeper, queue) = setup();
    let gate = submit(&queue, 1, false).await;
    let held = submit(&queue, 2, true).await;
    overseer
        .enable_rule("issues", label_kind(), "alice")
        .unwrap();
    overseer.settle().await;
    assert_eq!(state(&overseer, held), ActionState::Pending);
    overseer.reject(gate, "bob").await.unwrap();
    overseer.settle().await;
    assert_eq!(state(&overseer, held), ActionState::Approved);
    assert_eq!(gatekeeper.applied(), vec![2]);
}

#[tokio::test]
async fn the_drain_stops_at_a_failed_apply() {
    let (overseer, gatekeeper, queue) = setup();
    gatekeeper.fail_next_apply(1, GatekeeperError::retryable("403"));
    let failing = submit(&queue, 1, true).await;
    let after = submit(&queue, 2, true).await;
    overseer
        .enable_rule("issues", label_kind(), "alice")
        .unwrap();
    overseer.settle().await;
    assert_eq!(state(&overseer, failing), ActionState::Failed);
    assert_eq!(state(&overseer, after), ActionState::Pending);
    // The failed action waits for a person; a new trigger still stops there.
    submit(&queue, 3, true).await;
    overseer.settle().await;
    assert_eq!(state(&overseer, after), ActionState::Pending);
    assert!(gatekeeper.applied().is_empty());
}

#[tokio::test]
async fn removing_a_rule_makes_later_actions_manual_again() {
    let (overseer, gatekeeper, queue) = setup();
    overseer
        .enable_rule("issues", label_kind(), "alice")
        .unwrap();
    assert!(overseer.remove_rule("issues", &label_kind().tag).unwrap());
    assert!(!overseer.remove_rule("issues", &label_kind().tag).unwrap());
    let id = submit(&queue, 1, true).await;
    overseer.settle().await;
    assert_eq!(state(&overseer, id), ActionState::Pending);
    assert!(gatekeeper.applied().is_empty());
}

#[tokio::test]
async fn work_submitted_while_a_drain_is_parked_is_applied_by_the_rerun() {
    let (overseer, gatekeeper, queue) = setup();
    overseer
        .enable_rule("issues", label_kind(), "alice")
        .unwrap();
    let (entered, release) = gatekeeper.park(1);
    let first = submit(&queue, 1, true).await;
    entered.notified().await;
    // The drain is inside apply(1); this submission's drain request is coalesced.
    let second = submit(&queue, 2, true).await;
    assert_eq!(state(&overseer, second), ActionState::Pending);
    release.notify_one();
    overseer.settle().await;
    assert_eq!(state(&overseer, first), ActionState::Approved);
    assert_eq!(state(&overseer, second), ActionState::Approved);
    assert_eq!(gatekeeper.applied(), vec![1, 2]);
}

#[tokio::test]
async fn a_person_cannot_decide_the_action_a_drain_is_applying() {
    let (overseer, gatekeeper, queue) = setup();
    let id = submit(&queue, 1, true).await;
    let (entered, release) = gatekeeper.park(1);
    overseer
        .enable_rule("issues", label_kind(), "alice")
        .unwrap();
    entered.notified().await;
    both_decisions_refused_in_flight(&overseer, id).await;
    release.notify_one();
    overseer.settle().await;
    assert_eq!(state(&overseer, id), ActionState::Approved);
    assert_eq!(gatekeeper.times_applied(1), 1);
}

#[tokio::test]
async fn a_drain_stops_at_the_action_a_person_is_deciding_and_goes_on_after() {
    let (overseer, gatekeeper, queue) = setup();
    let first = submit(&queue, 1, true).await;
    let second = submit(&queue, 2, true).await;
    let (entered, release) = gatekeeper.park(1);
    let person = {
        let overseer = overseer.clone();
        tokio::spawn(async move { overseer.approve(first, "bob").await })
    };
    entered.notified().await;
    overseer
        .enable_rule("issues", label_kind(), "alice")
        .unwrap();
    overseer.settle().await;
    assert_eq!(state(&overseer, second), ActionState::Pending);
    release.notify_one();
    person.await.unwrap().unwrap();
    overseer.settle().await;
    let entry = overseer.entry(first).unwrap().unwrap();
    let resolution = entry.action().unwrap().resolution.clone().unwrap();
    assert_eq!((resolution.by.as_str(), resolution.auto), ("bob", false));
    assert_eq!(state(&overseer, second), ActionState::Approved);
    assert_eq!(gatekeeper.applied(), vec![1, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn people_and_drains_reaching_for_the_same_actions_apply_each_once() {
    let (overseer, gatekeeper, queue) = setup();
    let mut ids = Vec::new();
    for driver in 1..=200 {
        ids.push(submit(&queue, driver, true).await);
    }
    // People approve every action, some in the drains' order, some against it, while
    // the rule drains them (and each approval starts another drain).
    let mut people = Vec::new();
    for person in 0..4 {
        let overseer = overseer.clone();
        let mut ids = ids.clone();
        if person % 2 == 1 {
            ids.reverse();
        }
        people.push(tokio::spawn(async move {
            for id in ids {
                let _ = overseer.approve(id, "bob").await;
            }
        }));
    }
    overseer
        .enable_rule("issues", label_kind(), "alice")
        .unwrap();
    for person in people {
        person.await.unwrap();
    }
    overseer.settle().await;
    for driver in 1..=200 {
        assert_eq!(gatekeeper.times_applied(driver), 1, "action {driver}");
    }
    assert!(overseer.open_actions().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_drains_never_apply_one_action_twice() {
    let (overseer, gatekeeper, queue) = setup();
    for driver in 1..=200 {
        submit(&queue, driver, true).await;
    }
    // Many triggers at once from several tasks: rule enabling and more submissions.
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let overseer = overseer.clone();
        let queue = Arc::clone(&queue);
        tasks.push(tokio::spawn(async move {
            for i in 0..25 {
                overseer
                    .enable_rule("issues", label_kind(), "alice")
                    .unwrap();
                submit(&queue, 1000 + t * 100 + i, true).await;
                tokio::task::yield_now().await;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    overseer.settle().await;
    let applied = gatekeeper.applied();
    assert_eq!(applied.len(), 400);
    let mut unique = applied.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), applied.len(), "an action was applied twice");
    assert!(overseer.open_actions().unwrap().is_empty());
}

#[tokio::test]
async fn a_kernel_reopened_over_a_ledger_resumes_eligible_work() {
    use kernel::{AutoApprovalRule, LedgerStore, MemoryLedger, Overseer, StepClock};

    let store: Arc<dyn LedgerStore> = Arc::new(MemoryLedger::new());
    let clock = Arc::new(StepClock::default());
    let first = Overseer::with_store(store.clone(), clock.clone());
    first
        .register(crate::support::FakeGatekeeper::new("issues"))
        .unwrap();
    let queue = first.queue_for("issues", "agent").unwrap();
    let id = submit(&queue, 1, true).await;
    first.settle().await;
    drop(first);
    // Meanwhile the rule was enabled by another process sharing the ledger; nothing
    // in this process triggered a drain.
    store
        .put_rule(&AutoApprovalRule::new("issues", label_kind(), "alice"))
        .unwrap();

    let second = Overseer::with_store(store, clock);
    let gatekeeper = crate::support::FakeGatekeeper::new("issues");
    second.register(gatekeeper.clone()).unwrap();
    second.settle().await;
    assert_eq!(state(&second, id), ActionState::Pending, "no trigger yet");
    second.resume().unwrap();
    second.settle().await;
    assert_eq!(state(&second, id), ActionState::Approved);
    assert_eq!(gatekeeper.applied(), vec![1]);
}

/// A rule narrowed by a scope: whose calls, until when, which arguments.
mod scoped {
    use std::sync::Arc;

    use kernel::{
        ActionState, ArgumentCheck, ArgumentTest, Overseer, RuleScope, StepClock, Timestamp,
    };

    use crate::support::{FakeGatekeeper, label_kind, state, submit};

    fn path_under(root: &str) -> ArgumentTest {
        ArgumentTest {
            argument: "path".into(),
            check: ArgumentCheck::Under(root.into()),
        }
    }

    #[tokio::test]
    async fn a_rule_for_one_agent_applies_only_that_agents_calls() {
        let (overseer, gatekeeper, _) = crate::support::setup();
        let coder = overseer.queue_for("issues", "coder").unwrap();
        let other = overseer.queue_for("issues", "other").unwrap();
        let scope = RuleScope {
            caller: Some("coder".into()),
            ..RuleScope::default()
        };
        overseer
            .enable_scoped_rule("issues", label_kind(), "alice", scope.clone())
            .unwrap();
        let mine = submit(&coder, 1, true).await;
        overseer.settle().await;
        let theirs = submit(&other, 2, true).await;
        overseer.settle().await;
        assert_eq!(state(&overseer, mine), ActionState::Approved);
        assert_eq!(state(&overseer, theirs), ActionState::Pending);
        assert_eq!(gatekeeper.applied(), vec![1]);
        let rule = &overseer.rules().unwrap()[0];
        assert_eq!(rule.scope, scope);
        assert_eq!(
            rule.scope.to_string(),
            "calls of agent \"coder\" only, until removed"
        );
    }

    #[tokio::test]
    async fn a_rule_stops_applying_when_its_time_is_up() {
        let clock = Arc::new(StepClock::new(1_000, 0));
        let overseer = Overseer::new(clock.clone());
        let gatekeeper = FakeGatekeeper::new("issues");
        overseer.register(gatekeeper.clone()).unwrap();
        let queue = overseer.queue_for("issues", "agent").unwrap();
        let scope = RuleScope {
            until: Some(Timestamp(61_000)),
            ..RuleScope::default()
        };
        overseer
            .enable_scoped_rule("issues", label_kind(), "alice", scope)
            .unwrap();
        assert_eq!(overseer.rules().unwrap()[0].enabled_at, Timestamp(1_000));
        let before = submit(&queue, 1, true).await;
        overseer.settle().await;
        assert_eq!(state(&overseer, before), ActionState::Approved);
        clock.advance(60_000);
        let after = submit(&queue, 2, true).await;
        overseer.settle().await;
        assert_eq!(
            state(&overseer, after),
            ActionState::Pending,
            "expired on time: at its `until` it no longer applies"
        );
        assert!(overseer.rules().unwrap()[0].expired(kernel::Clock::now(&*clock)));
        assert_eq!(gatekeeper.applied(), vec![1]);
    }

    #[tokio::test]
    async fn a_rule_narrowed_by_arguments_applies_only_what_the_gatekeeper_finds_inside() {
        let (overseer, gatekeeper, queue) = crate::support::setup();
        gatekeeper.cover(1);
        overseer
            .enable_scoped_rule(
                "issues",
                label_kind(),
                "alice",
                RuleScope {
                    arguments: vec![path_under("/tmp/a")],
                    ..RuleScope::default()
                },
            )
            .unwrap();
        let inside = submit(&queue, 1, true).await;
        overseer.settle().await;
        let outside = submit(&queue, 2, true).await;
        overseer.settle().await;
        assert_eq!(state(&overseer, inside), ActionState::Approved);
        assert_eq!(state(&overseer, outside), ActionState::Pending);
        assert_eq!(gatekeeper.applied(), vec![1]);
    }

    #[tokio::test]
    async fn a_note_with_an_approval_is_kept_as_its_cause() {
        let (overseer, _, queue) = crate::support::setup();
        let id = submit(&queue, 1, false).await;
        overseer
            .approve_noted(id, "bob", Some("approved with changes"))
            .await
            .unwrap();
        let entry = overseer.entry(id).unwrap().unwrap();
        let resolution = entry.action().unwrap().resolution.clone().unwrap();
        assert_eq!(resolution.cause.as_deref(), Some("approved with changes"));
    }
}

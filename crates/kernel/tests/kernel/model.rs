//! Model-based test: random interleavings of submit, approve, reject, rules and failures.
//!
//! After every run the ledger and the fake driver must agree on three invariants:
//! no action is applied twice; the drainer never applied an action while an earlier
//! action of the same gatekeeper was still open; every applied action has a resolver.

use std::collections::HashSet;

use kernel::{ActionState, GatekeeperError, LedgerId};
use proptest::prelude::*;

use crate::support::{label_kind, setup, submit};

#[derive(Debug, Clone)]
enum Op {
    Submit { auto: bool },
    Approve(usize),
    Reject(usize),
    EnableRule,
    RemoveRule,
    FailNext { nth: usize, retryable: bool },
    Settle,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => any::<bool>().prop_map(|auto| Op::Submit { auto }),
        3 => any::<usize>().prop_map(Op::Approve),
        2 => any::<usize>().prop_map(Op::Reject),
        1 => Just(Op::EnableRule),
        1 => Just(Op::RemoveRule),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(nth, retryable)| Op::FailNext { nth, retryable }),
        2 => Just(Op::Settle),
    ]
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let (overseer, gatekeeper, queue) = setup();
        gatekeeper.watch(&overseer);
        let mut submitted: Vec<(u64, LedgerId)> = Vec::new();
        let mut next_driver = 1;
        for op in ops {
            match op {
                Op::Submit { auto } => {
                    let id = submit(&queue, next_driver, auto).await;
                    submitted.push((next_driver, id));
                    next_driver += 1;
                }
                Op::Approve(i) if !submitted.is_empty() => {
                    let (_, id) = submitted[i % submitted.len()];
                    let _ = overseer.approve(id, "alice").await;
                }
                Op::Reject(i) if !submitted.is_empty() => {
                    let (_, id) = submitted[i % submitted.len()];
                    let _ = overseer.reject(id, "bob").await;
                }
                Op::EnableRule => overseer
                    .enable_rule("issues", label_kind(), "carol")
                    .unwrap(),
                Op::RemoveRule => {
                    overseer.remove_rule("issues", &label_kind().tag).unwrap();
                }
                Op::FailNext { nth, retryable } => {
                    let driver = (nth % (submitted.len() + 2)) as u64 + 1;
                    let error = if retryable {
                        GatekeeperError::retryable("403")
                    } else {
                        GatekeeperError::fatal("timeout")
                    };
                    gatekeeper.fail_next_apply(driver, error);
                }
                Op::Settle => overseer.settle().await,
                Op::Approve(_) | Op::Reject(_) => {}
            }
        }
        overseer.settle().await;

        // 1. Nothing applied twice.
        let applied = gatekeeper.applied();
        let unique: HashSet<u64> = applied.iter().copied().collect();
        prop_assert_eq!(unique.len(), applied.len(), "applied twice: {:?}", applied);

        // 3. The ledger and the driver agree, and every applied action has a resolver.
        let mut auto_applied = HashSet::new();
        for (driver, id) in &submitted {
            let entry = overseer.entry(*id).unwrap().unwrap();
            let action = entry.action().unwrap();
            let was_applied = unique.contains(driver);
            prop_assert_eq!(action.state == ActionState::Approved, was_applied);
            if was_applied {
                let resolution = action.resolution.as_ref();
                prop_assert!(resolution.is_some(), "applied without a resolver");
                let resolution = resolution.unwrap();
                prop_assert!(!resolution.by.is_empty());
                if resolution.auto {
                    prop_assert_eq!(resolution.by.as_str(), "carol");
                    auto_applied.insert(*driver);
                } else {
                    prop_assert_eq!(resolution.by.as_str(), "alice");
                }
            }
        }

        // 2. The drainer never passed an open action: at each automatic apply, no
        //    earlier action of the gatekeeper was still open.
        for snapshot in gatekeeper.snapshots.lock().unwrap().iter() {
            if !auto_applied.contains(&snapshot.driver) {
                continue;
            }
            let me = snapshot
                .open
                .iter()
                .find(|e| e.action().unwrap().driver_id.0 == snapshot.driver)
                .map(|e| e.id);
            if let Some(me) = me {
                let earlier: Vec<LedgerId> = snapshot
                    .open
                    .iter()
                    .map(|e| e.id)
                    .filter(|id| *id < me)
                    .collect();
                prop_assert!(
                    earlier.is_empty(),
                    "auto-applied {} while {:?} were open",
                    me,
                    earlier
                );
            }
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_interleavings_keep_the_kernel_invariants(ops in proptest::collection::vec(op(), 1..60)) {
        run(ops)?;
    }
}

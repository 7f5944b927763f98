//! Two handles on one file, as an agent process and a reviewing shell would hold it: one
//! keeps submitting while the other reads the ledger and decides. Both see one consistent
//! ledger, and nobody is told "database is locked".

use std::sync::Arc;
use std::time::{Duration, Instant};

use kernel::{ActionDescription, ActionState, DriverActionId, Overseer, StepClock};
use store_sqlite::Database;

use crate::support::{FakeGatekeeper, TempDir};

const ACTIONS: u64 = 60;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn one_handle_submits_while_another_decides_and_both_agree() {
    let dir = TempDir::new("two-handles");
    let path = dir.join("gate.db");
    let agent_db = Database::open(&path).unwrap();
    let shell_db = Database::open(&path).unwrap();

    let agent = std::thread::spawn(move || {
        runtime().block_on(async {
            let overseer = Overseer::with_store(agent_db.ledger(), Arc::new(StepClock::default()));
            overseer.register(FakeGatekeeper::new("gk")).unwrap();
            let queue = overseer.queue_for("gk", "agent").unwrap();
            for n in 1..=ACTIONS {
                queue
                    .submit_action(
                        DriverActionId(n),
                        ActionDescription::new(format!("write {n}"), "body"),
                    )
                    .await
                    .unwrap();
            }
            overseer.ledger().unwrap()
        })
    });

    let shell = std::thread::spawn(move || {
        runtime().block_on(async {
            let overseer = Overseer::with_store(shell_db.ledger(), Arc::new(StepClock::new(0, 1)));
            let gk = FakeGatekeeper::new("gk");
            overseer.register(gk.clone()).unwrap();
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut decided = 0;
            while decided < ACTIONS {
                assert!(
                    Instant::now() < deadline,
                    "the shell saw only {decided} actions"
                );
                let open = overseer.open_actions().unwrap();
                // What the shell sees is a prefix of what the agent submitted: ids
                // ascending, none missing in the middle.
                for pair in open.windows(2) {
                    assert!(pair[0].id < pair[1].id);
                }
                for entry in open {
                    let n = entry.action().unwrap().driver_id.0;
                    if n % 3 == 0 {
                        overseer.reject(entry.id, "reviewer").await.unwrap();
                    } else {
                        overseer.approve(entry.id, "reviewer").await.unwrap();
                    }
                    decided += 1;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            overseer.settle().await;
            let mut applied = gk.applies.lock().unwrap().clone();
            applied.sort();
            (overseer.ledger().unwrap(), applied)
        })
    });

    let submitted = agent.join().unwrap();
    let (decided, applied) = shell.join().unwrap();
    assert_eq!(submitted.len() as u64, ACTIONS);
    assert_eq!(decided.len() as u64, ACTIONS);
    let expected: Vec<u64> = (1..=ACTIONS).filter(|n| n % 3 != 0).collect();
    assert_eq!(
        applied, expected,
        "each approved action applied exactly once"
    );

    // A third handle, opened afterwards, sees the shell's decisions on the agent's entries.
    let fresh = Database::open(&path).unwrap();
    let ledger = fresh.ledger().entries().unwrap();
    assert_eq!(ledger, decided);
    for (before, after) in submitted.iter().zip(&ledger) {
        assert_eq!(before.id, after.id);
        assert_eq!(
            before.action().unwrap().description,
            after.action().unwrap().description
        );
        let n = after.action().unwrap().driver_id.0;
        let expected = if n % 3 == 0 {
            ActionState::Rejected
        } else {
            ActionState::Approved
        };
        assert_eq!(after.action().unwrap().state, expected);
        assert_eq!(
            after.action().unwrap().resolution.as_ref().unwrap().by,
            "reviewer"
        );
    }
}

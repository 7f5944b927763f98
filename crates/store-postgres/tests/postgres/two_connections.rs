//! store-sqlite's two-handle model tests, with two connections (two daemons' handles,
//! each its own session) on one PostgreSQL database: one keeps submitting while the other
//! decides; stages never share an id and the cap counts both; random sequences of both
//! ports answer as the in-memory model, and only a claim's own session settles it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kernel::{ActionDescription, ActionState, DriverActionId, Overseer, StepClock};
use store_postgres::Database;

use crate::support::{FakeGatekeeper, fresh_url, pending_entry};

const ACTIONS: u64 = 60;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn one_handle_submits_while_another_decides_and_both_agree() {
    let path = fresh_url();
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

/// A pending action entry of gatekeeper `gk` for driver action `n`.
fn submitted(n: u64) -> impl FnMut(kernel::LedgerId) -> kernel::LedgerEntry {
    pending_entry(
        "gk",
        n,
        ActionDescription::new(format!("write {n}"), "body"),
    )
}

#[test]
fn what_one_handle_remembers_gives_way_to_what_another_wrote() {
    // Ids come from one sequence, and what one handle wrote is what the other reads.
    let path = fresh_url();
    let first = Database::open(&path).unwrap();
    let second = Database::open(&path).unwrap();
    let (one, two) = (first.ledger(), second.ledger());

    let a = one.insert(&mut submitted(1)).unwrap();
    let b = two.insert(&mut submitted(2)).unwrap();
    let c = one.insert(&mut submitted(3)).unwrap();
    assert_eq!(
        (a.0, b.0, c.0),
        (1, 2, 3),
        "ledger ids are never handed out twice"
    );

    // The second handle decides an entry the first one wrote and remembers.
    let mut decided = two.get(a).unwrap().unwrap();
    let action = decided.action_mut().unwrap();
    action.state = ActionState::Rejected;
    action.resolution = Some(kernel::Resolution {
        by: "reviewer".into(),
        auto: false,
        at: kernel::Timestamp(9),
        cause: None,
    });
    two.put(decided.clone()).unwrap();
    assert_eq!(one.get(a).unwrap().unwrap(), decided);
    // Still true once the first handle writes again.
    one.insert(&mut submitted(4)).unwrap();
    assert_eq!(one.get(a).unwrap().unwrap(), decided);
}

/// One handle's action store of gatekeeper `gk`.
struct Desk {
    store: Arc<dyn gatekeeper_core::ActionStorage>,
}

impl Desk {
    fn open(path: &str) -> Self {
        let db = Database::open(path).unwrap();
        let store = db.action_storage("gk");
        Self { store }
    }

    /// Stage a call (committed when it returns); `None` when the store is full (ten open calls).
    async fn stage(&self) -> Option<DriverActionId> {
        self.store
            .insert_pending(
                Arc::from("write"),
                None,
                Arc::new(serde_json::json!({})),
                kernel::Timestamp(1),
                10,
            )
            .await
            .unwrap()
    }
}

#[tokio::test]
async fn two_handles_staging_into_one_store_never_share_an_id() {
    let path = fresh_url();
    let (first, second) = (Desk::open(&path), Desk::open(&path));
    let mut ids = vec![
        first.stage().await,
        second.stage().await,
        first.stage().await,
    ];
    // The second handle discards the first handle's newest record; the first must not
    // hand its id out again, nor count it as open.
    assert!(second.store.delete_pending(ids[2].unwrap()).await.unwrap());
    ids.push(first.stage().await);
    assert_eq!(
        ids.iter().map(|id| id.unwrap().0).collect::<Vec<_>>(),
        [1, 2, 3, 4],
        "ids ascend across handles and are never reused"
    );
    assert_eq!(first.store.count_open().await.unwrap(), 3);
    assert_eq!(second.store.count_open().await.unwrap(), 3);
    // Ten open at most: the first handle counts the second's records too.
    for _ in 0..7 {
        assert!(second.stage().await.is_some());
    }
    assert_eq!(
        first.stage().await,
        None,
        "the store is full, whichever handle filled it"
    );
}

/// A small deterministic generator, so a failing sequence can be replayed by its seed.
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[tokio::test]
async fn two_handles_on_one_store_answer_as_one_model_for_any_sequence() {
    use gatekeeper_core::{
        ActionRecord, ActionState as Record, ActionStorage, MemoryActionStorage, StateTag,
    };

    const MAX_OPEN: usize = 6;
    const KEEP: usize = 3;
    for seed in 1..=25u64 {
        let path = fresh_url();
        let desks = [Desk::open(&path), Desk::open(&path)];
        let model = MemoryActionStorage::new();
        // Which handle holds each claim: only that one may settle it.
        let mut claimant = std::collections::HashMap::new();
        let mut rng = XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut highest = 0u64;
        for step in 0..60 {
            let h = rng.below(2) as usize;
            let desk = &desks[h];
            let id = DriverActionId(1 + rng.below(highest.max(1) + 1));
            let known = model.get(id).await.unwrap();
            let what = format!("seed {seed}, step {step}, handle {h}");
            match rng.below(6) {
                0 | 1 => {
                    let args = Arc::new(serde_json::json!({ "step": step }));
                    let staged = desk
                        .store
                        .insert_pending(
                            Arc::from("write"),
                            None,
                            args.clone(),
                            kernel::Timestamp(step),
                            MAX_OPEN,
                        )
                        .await
                        .unwrap();
                    let expected = model
                        .insert_pending(
                            Arc::from("write"),
                            None,
                            args,
                            kernel::Timestamp(step),
                            MAX_OPEN,
                        )
                        .await
                        .unwrap();
                    assert_eq!(staged, expected, "stage: {what}");
                    highest = highest.max(staged.map_or(0, |id| id.0));
                }
                2 => {
                    // Claim (a pending call, or a retry after a failure that sent
                    // nothing), or settle a claim: from either handle, only the claimant's
                    // settle succeeds.
                    let Some(record) = known else { continue };
                    let (from, next) = match &record.state {
                        Record::Pending
                        | Record::Failed {
                            retryable: true, ..
                        } => (
                            record.state.tag(),
                            ActionRecord {
                                state: Record::Applying,
                                claimed_at: Some(kernel::Timestamp(step)),
                                ..record.clone()
                            },
                        ),
                        Record::Applying => (
                            StateTag::Applying,
                            ActionRecord {
                                state: if step % 2 == 0 {
                                    Record::Applied {
                                        result: Arc::new(gatekeeper_core::ToolResult::from_text(
                                            format!("done at {step}"),
                                        )),
                                    }
                                } else {
                                    Record::Failed {
                                        retryable: step % 3 == 0,
                                        message: format!("failed at {step}"),
                                    }
                                },
                                ..record.clone()
                            },
                        ),
                        _ => continue,
                    };
                    let written = desk.store.compare_and_set(from, &next).await.unwrap();
                    let claim = from != StateTag::Applying;
                    let own = claim || claimant.get(&id.0) == Some(&h);
                    assert_eq!(written, own, "claim or settle: {what}");
                    if written {
                        assert!(model.compare_and_set(from, &next).await.unwrap());
                        if claim {
                            claimant.insert(id.0, h);
                        }
                    }
                }
                3 => {
                    let Some(record) = known else { continue };
                    // What may be rejected: pending, or a failure that sent nothing.
                    if !matches!(
                        record.state,
                        Record::Pending
                            | Record::Failed {
                                retryable: true,
                                ..
                            }
                    ) {
                        continue;
                    }
                    let from = record.state.tag();
                    let rejected = ActionRecord {
                        state: Record::Rejected,
                        ..record
                    };
                    let written = desk.store.compare_and_set(from, &rejected).await.unwrap();
                    let expected = model.compare_and_set(from, &rejected).await.unwrap();
                    assert_eq!(written, expected, "reject: {what}");
                }
                4 => {
                    let deleted = desk.store.delete_pending(id).await.unwrap();
                    let expected = model.delete_pending(id).await.unwrap();
                    assert_eq!(deleted, expected, "discard: {what}");
                }
                _ => {
                    let pruned = desk.store.prune_final(KEEP).await.unwrap();
                    let expected = model.prune_final(KEEP).await.unwrap();
                    assert_eq!(pruned, expected, "prune: {what}");
                }
            }
            // The acting handle answers as the model at once.
            assert_eq!(
                desk.store.count_open().await.unwrap(),
                model.count_open().await.unwrap(),
                "open count, acting handle: {what}"
            );
            assert_eq!(
                desk.store.get(id).await.unwrap(),
                model.get(id).await.unwrap(),
                "record {}, acting handle: {what}",
                id.0
            );
            // Both handles answer as the model.
            for (other, desk) in desks.iter().enumerate() {
                let what = format!("{what}, read by handle {other}");
                assert_eq!(
                    desk.store.count_open().await.unwrap(),
                    model.count_open().await.unwrap(),
                    "open count: {what}"
                );
                for n in 1..=highest {
                    let id = DriverActionId(n);
                    assert_eq!(
                        desk.store.get(id).await.unwrap(),
                        model.get(id).await.unwrap(),
                        "record {n}: {what}"
                    );
                }
            }
        }
    }
}

#[test]
fn two_handles_on_one_ledger_answer_as_one_model_for_any_sequence() {
    use kernel::{LedgerStore, MemoryLedger, Resolution, Timestamp};

    for seed in 1..=25u64 {
        let path = fresh_url();
        let dbs = [
            Database::open(&path).unwrap(),
            Database::open(&path).unwrap(),
        ];
        let ledgers = [dbs[0].ledger(), dbs[1].ledger()];
        let model = MemoryLedger::new();
        let mut rng = XorShift(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1);
        let mut highest = 0u64;
        for step in 0..60u64 {
            let h = rng.below(2) as usize;
            let ledger = &ledgers[h];
            let id = kernel::LedgerId(1 + rng.below(highest.max(1) + 1));
            let known = model.get(id).unwrap();
            let op = rng.below(5);
            let what = format!("seed {seed}, step {step}, handle {h}, op {op}, entry {id}");
            let decided = |by: &str| Resolution {
                by: by.into(),
                auto: step % 2 == 0,
                at: Timestamp(step),
                cause: None,
            };
            match op {
                0 | 1 => {
                    let driver = 100 + step;
                    let mut made =
                        pending_entry("gk", driver, ActionDescription::new("write", "body"));
                    let stored = ledger.insert(&mut made).unwrap();
                    let expected = model.insert(&mut made).unwrap();
                    assert_eq!(stored, expected, "insert: {what}");
                    highest = highest.max(stored.0);
                }
                2 => {
                    // A person's decision on a pending action, approver first.
                    let Some(mut entry) = known
                        .filter(|e| e.action().is_some_and(|a| a.state == ActionState::Pending))
                    else {
                        continue;
                    };
                    ledger.record_attempt(id, &decided("ana")).unwrap();
                    model.record_attempt(id, &decided("ana")).unwrap();
                    // Committed at once: both handles see who decides.
                    assert_eq!(ledger.get(id).unwrap(), model.get(id).unwrap(), "{what}");
                    for other in &ledgers {
                        assert_eq!(other.get(id).unwrap(), model.get(id).unwrap(), "{what}");
                    }
                    let action = entry.action_mut().unwrap();
                    action.state = if step % 3 == 0 {
                        ActionState::Rejected
                    } else {
                        ActionState::Approved
                    };
                    action.resolution = Some(decided("ana"));
                    ledger.put(entry.clone()).unwrap();
                    model.put(entry).unwrap();
                }
                3 => {
                    // Flag an open action as blocked by another (a rejected dependency).
                    let Some(mut entry) = known.filter(|e| e.action().is_some_and(|a| a.is_open()))
                    else {
                        continue;
                    };
                    entry.action_mut().unwrap().blocked_by = Some(kernel::LedgerId(1));
                    ledger.put(entry.clone()).unwrap();
                    model.put(entry).unwrap();
                }
                _ => {}
            }
            // Both handles answer as the model.
            for (other, ledger) in ledgers.iter().enumerate() {
                let what = format!("{what}, read by handle {other}");
                assert_eq!(
                    ledger.entries().unwrap(),
                    model.entries().unwrap(),
                    "entries: {what}"
                );
                assert_eq!(
                    ledger.open_action_ids("gk").unwrap(),
                    model.open_action_ids("gk").unwrap(),
                    "open: {what}"
                );
                for n in 1..=highest + 1 {
                    let id = kernel::LedgerId(n);
                    assert_eq!(
                        ledger.get(id).unwrap(),
                        model.get(id).unwrap(),
                        "get {n}: {what}"
                    );
                    let driver = DriverActionId(100 + n);
                    assert_eq!(
                        ledger.find_action("gk", driver).unwrap(),
                        model.find_action("gk", driver).unwrap(),
                        "find driver {}: {what}",
                        driver.0
                    );
                }
            }
        }
    }
}

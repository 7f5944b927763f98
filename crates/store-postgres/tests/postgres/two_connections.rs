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

#[test]
fn two_people_deciding_from_their_lists_at_once_apply_each_action_once() {
    // Each person's decision reads the entry their list showed (`open_actions`, kept for
    // the next read): the other's approval between the list and the decision is caught by
    // `record_attempt`, so the second approval is refused and nothing is applied twice.
    let path = fresh_url();
    let (one, two) = (
        Database::open(&path).unwrap(),
        Database::open(&path).unwrap(),
    );
    let (applied_one, applied_two) = runtime().block_on(async {
        let first = Overseer::with_store(one.ledger(), Arc::new(StepClock::default()));
        let second = Overseer::with_store(two.ledger(), Arc::new(StepClock::new(0, 1)));
        let (gk_one, gk_two) = (FakeGatekeeper::new("gk"), FakeGatekeeper::new("gk"));
        first.register(gk_one.clone()).unwrap();
        second.register(gk_two.clone()).unwrap();
        let queue = first.queue_for("gk", "agent").unwrap();
        for n in 1..=ACTIONS {
            queue
                .submit_action(DriverActionId(n), ActionDescription::new("write", "body"))
                .await
                .unwrap();
            let (listed_one, listed_two) = (
                first.open_actions().unwrap(),
                second.open_actions().unwrap(),
            );
            assert_eq!(
                listed_one, listed_two,
                "both lists show the same open action"
            );
            let id = listed_one[0].id;
            first.approve(id, "ana").await.unwrap();
            let refused = second.approve(id, "bo").await.unwrap_err();
            assert!(
                matches!(
                    refused,
                    kernel::DecisionError::DecidedElsewhere { open: false, .. }
                        | kernel::DecisionError::NotPending { .. }
                ),
                "action {n}: {refused:?}"
            );
        }
        first.settle().await;
        second.settle().await;
        let applied = |gk: &FakeGatekeeper| gk.applies.lock().unwrap().clone();
        (applied(&gk_one), applied(&gk_two))
    });
    let expected: Vec<u64> = (1..=ACTIONS).collect();
    assert_eq!(
        applied_one, expected,
        "each action applied once, by the first"
    );
    assert!(applied_two.is_empty(), "the second applied {applied_two:?}");
}

/// A pending action entry of gatekeeper `gk` for driver action `n`.
fn submitted(n: u64) -> impl FnMut(kernel::LedgerId) -> kernel::LedgerEntry {
    submitted_to("gk", n)
}

/// A pending action entry of gatekeeper `server` for driver action `n`.
fn submitted_to(server: &str, n: u64) -> impl FnMut(kernel::LedgerId) -> kernel::LedgerEntry {
    pending_entry(
        server,
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
    let decided = kernel::testkit::reject_by_reviewer(&*two, a);
    assert_eq!(one.get(a).unwrap().unwrap(), decided);
    // Still true once the first handle writes again.
    one.insert(&mut submitted(4)).unwrap();
    assert_eq!(one.get(a).unwrap().unwrap(), decided);
}

/// Wait until `db` was told of a change after `seen` (its `changes` counter moved).
fn told(db: &Database, seen: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while *db.changes().borrow() == seen {
        assert!(
            Instant::now() < deadline,
            "no notification reached the handle"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_change_to_one_servers_entries_leaves_what_a_handle_remembers_of_another_servers() {
    let path = fresh_url();
    let first = Database::open(&path).unwrap();
    let second = Database::open(&path).unwrap();
    let (one, two) = (first.ledger(), second.ledger());
    let a = one.insert(&mut submitted_to("a", 1)).unwrap();
    let b = two.insert(&mut submitted_to("b", 2)).unwrap();

    // The first handle lists server a's open actions (as the drain does), then the
    // second changes server b's entry: the first's next read of a's entry is the one
    // it listed, without a round trip.
    assert_eq!(one.open_action_ids("a").unwrap(), [a]);
    let seen = *first.changes().borrow();
    kernel::testkit::reject_by_reviewer(&*two, b);
    told(&first, seen);
    let trips = first.round_trips();
    assert_eq!(one.get(a).unwrap().unwrap().id, a);
    assert_eq!(first.round_trips(), trips, "a's entry came from the list");

    // A change to server a's entry is read from the server.
    assert_eq!(one.open_action_ids("a").unwrap(), [a]);
    let seen = *first.changes().borrow();
    let decided = kernel::testkit::reject_by_reviewer(&*two, a);
    told(&first, seen);
    let trips = first.round_trips();
    assert_eq!(one.get(a).unwrap().unwrap(), decided);
    assert!(first.round_trips() > trips, "a's entry was read again");
}

/// One handle's action store of gatekeeper `gk`.
struct Desk {
    db: Database,
    store: Arc<dyn gatekeeper_core::ActionStorage>,
}

impl Desk {
    fn open(path: &str) -> Self {
        let db = Database::open(path).unwrap();
        let store = db.action_storage("gk");
        Self { db, store }
    }

    /// Stage a call and commit it (a stage waits, parked, for its submission to the
    /// kernel, which there is none of here); `None` when the store is full (ten open
    /// calls).
    async fn stage(&self) -> Option<DriverActionId> {
        let staged = self
            .store
            .insert_pending(
                Arc::from("write"),
                None,
                Arc::new(serde_json::json!({})),
                kernel::Timestamp(1),
                10,
            )
            .await
            .unwrap();
        self.db.commit_deferred().unwrap();
        staged
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

/// Two connections' action stores on one database.
struct TwoDesks([Desk; 2]);

impl gatekeeper_core::testkit::TwoStores for TwoDesks {
    fn store(&self, handle: usize) -> &dyn gatekeeper_core::ActionStorage {
        &*self.0[handle].store
    }

    /// A driver's outcome waits, parked, for the kernel's: commit it now.
    fn commit(&self, handle: usize) {
        let db = self.0[handle].db.clone();
        // Blocking, so off the test's runtime.
        std::thread::spawn(move || db.commit_deferred().unwrap())
            .join()
            .unwrap();
    }
}

#[tokio::test]
async fn two_handles_on_one_store_answer_as_one_model_for_any_sequence() {
    gatekeeper_core::testkit::two_stores_answer_as_one_model(|| {
        let url = fresh_url();
        TwoDesks([Desk::open(&url), Desk::open(&url)])
    })
    .await;
}

/// Two connections' ledgers on one database.
struct TwoLedgers([(Database, Arc<dyn kernel::LedgerStore>); 2]);

impl kernel::testkit::TwoLedgers for TwoLedgers {
    fn ledger(&self, handle: usize) -> &dyn kernel::LedgerStore {
        &*self.0[handle].1
    }

    /// Who decided waits, parked, for the driver's claim: commit it now.
    fn commit(&self, handle: usize) {
        self.0[handle].0.commit_deferred().unwrap();
    }
}

#[test]
fn two_handles_on_one_ledger_answer_as_one_model_for_any_sequence() {
    kernel::testkit::two_ledgers_answer_as_one_model(|| {
        let url = fresh_url();
        let (first, second) = (Database::open(&url).unwrap(), Database::open(&url).unwrap());
        TwoLedgers([
            (first.clone(), first.ledger()),
            (second.clone(), second.ledger()),
        ])
    });
}

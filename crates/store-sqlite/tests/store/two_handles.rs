//! Two handles on one file, as an agent process and a reviewing shell would hold it: one
//! keeps submitting while the other reads the ledger and decides. Both see one consistent
//! ledger, and nobody is told "database is locked".

use std::sync::Arc;
use std::time::{Duration, Instant};

use kernel::{ActionDescription, ActionState, DriverActionId, Overseer, StepClock};
use store_sqlite::Database;

use crate::support::{FakeGatekeeper, TempDir, pending_entry};

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
    // Each handle keeps what it wrote and read (the next ledger id, entries, the store's
    // counts) to spare SQLite the question. Writes through another handle must win.
    let dir = TempDir::new("two-handles-known");
    let path = dir.join("gate.db");
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
    // Still true once the first handle writes again (it looks inside its transaction).
    one.insert(&mut submitted(4)).unwrap();
    assert_eq!(one.get(a).unwrap().unwrap(), decided);
}

/// One handle's action store of gatekeeper `gk`, with its database to commit it.
struct Desk {
    db: Database,
    store: Arc<dyn gatekeeper_core::ActionStorage>,
}

impl Desk {
    fn open(path: &std::path::Path) -> Self {
        let db = Database::open(path).unwrap();
        let store = db.action_storage("gk");
        Self { db, store }
    }

    /// Stage a call and commit it, as the kernel's submission commit would; `None` when
    /// the store is full (ten open calls).
    async fn stage(&self) -> Option<DriverActionId> {
        let id = self
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
        self.db.flush().unwrap();
        id
    }
}

#[tokio::test]
async fn two_handles_staging_into_one_store_never_share_an_id() {
    let dir = TempDir::new("two-handles-ids");
    let path = dir.join("gate.db");
    let (first, second) = (Desk::open(&path), Desk::open(&path));
    let mut ids = vec![
        first.stage().await,
        second.stage().await,
        first.stage().await,
    ];
    // The second handle discards the first handle's newest record; the first must not
    // hand its id out again, nor count it as open.
    assert!(second.store.delete_pending(ids[2].unwrap()).await.unwrap());
    second.db.flush().unwrap();
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

/// Two handles on one file, and the directory that holds it (dropped last).
struct TwoDesks {
    desks: [Desk; 2],
    _dir: TempDir,
}

impl gatekeeper_core::testkit::TwoStores for TwoDesks {
    fn store(&self, handle: usize) -> &dyn gatekeeper_core::ActionStorage {
        &*self.desks[handle].store
    }

    fn commit(&self, handle: usize) {
        self.desks[handle].db.flush().unwrap();
    }
}

#[tokio::test]
async fn two_handles_on_one_store_answer_as_one_model_for_any_sequence() {
    gatekeeper_core::testkit::two_stores_answer_as_one_model(|| {
        let dir = TempDir::new("two-handles-model");
        let path = dir.join("gate.db");
        TwoDesks {
            desks: [Desk::open(&path), Desk::open(&path)],
            _dir: dir,
        }
    })
    .await;
}

/// Two ledgers on one file, their databases, and the directory (dropped last).
struct TwoLedgers {
    ledgers: [Arc<dyn kernel::LedgerStore>; 2],
    dbs: [Database; 2],
    _dir: TempDir,
}

impl kernel::testkit::TwoLedgers for TwoLedgers {
    fn ledger(&self, handle: usize) -> &dyn kernel::LedgerStore {
        &*self.ledgers[handle]
    }

    fn commit(&self, handle: usize) {
        self.dbs[handle].flush().unwrap();
    }
}

#[test]
fn two_handles_on_one_ledger_answer_as_one_model_for_any_sequence() {
    kernel::testkit::two_ledgers_answer_as_one_model(|| {
        let dir = TempDir::new("two-handles-ledger-model");
        let path = dir.join("gate.db");
        let dbs = [
            Database::open(&path).unwrap(),
            Database::open(&path).unwrap(),
        ];
        TwoLedgers {
            ledgers: [dbs[0].ledger(), dbs[1].ledger()],
            dbs,
            _dir: dir,
        }
    });
}

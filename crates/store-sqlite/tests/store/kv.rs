//! gatekeeper-confluence's key-value port on SQLite: the same answers as the in-memory
//! map for any sequence of operations, namespaces that do not leak, and a wiki driver
//! whose staged pages survive a restart and are then approved; two handles on one file
//! applying the same wiki actions send each at most once (the claim is a compare-and-set);
//! a value of several megabytes (a large page) is stored whole.

use std::sync::Arc;

use gatekeeper_confluence::{Bytes, ConfluenceGatekeeper, KvStore, MemoryKv, Policy, WikiService};
use kernel::{ActionState, Gatekeeper, Overseer, StepClock};
use store_sqlite::Database;

use crate::support::TempDir;

/// A small deterministic generator, so a failing sequence can be replayed.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[(self.next() % items.len() as u64) as usize]
    }
}

#[test]
fn any_sequence_of_operations_answers_as_the_in_memory_map() {
    let keys = [
        "action:01",
        "action:02",
        "action:1",
        "action;",
        "action",
        "prov:~1",
        "prov:~10",
        "space:OPS",
        "é",
        "e\u{10FFFF}",
        "e\u{10FFFF}x",
        "f",
        "",
        "seq:action",
    ];
    let prefixes = [
        "",
        "action:",
        "action",
        "prov:~",
        "e\u{10FFFF}",
        "é",
        "z",
        "seq:",
    ];
    let db = Database::open_in_memory().unwrap();
    let sqlite = db.kv("wiki");
    let noise = db.kv("other");
    let memory = MemoryKv::new();
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    for step in 0..3000 {
        let key = rng.pick(&keys);
        match rng.next() % 4 {
            0 | 1 => {
                let value =
                    Bytes::copy_from_slice(&rng.next().to_le_bytes()[..(rng.next() % 9) as usize]);
                sqlite.put(key, value.clone()).unwrap();
                memory.put(key, value.clone()).unwrap();
                noise.put(key, Bytes::from_static(&[0xEE])).unwrap();
            }
            2 => assert_eq!(
                sqlite.delete(key).unwrap(),
                memory.delete(key).unwrap(),
                "step {step}: delete {key:?}"
            ),
            _ => {
                let prefix = rng.pick(&prefixes);
                assert_eq!(
                    sqlite.scan_prefix(prefix).unwrap(),
                    memory.scan_prefix(prefix).unwrap(),
                    "step {step}: scan {prefix:?}"
                );
            }
        }
        assert_eq!(
            sqlite.get(key).unwrap(),
            memory.get(key).unwrap(),
            "step {step}: get {key:?}"
        );
    }
}

#[tokio::test]
async fn a_wiki_drivers_staged_page_survives_a_restart_and_is_then_approved() {
    let dir = TempDir::new("wiki");
    let path = dir.join("gate.db");
    // The wiki is outside the OS: it outlives the gatekeeper's process.
    let service = Arc::new(WikiService::new());
    service.add_space("OPS");
    let open = |db: &Database| {
        let clock = Arc::new(StepClock::default());
        let overseer = Overseer::with_store(db.ledger(), clock.clone());
        let wiki = Arc::new(
            ConfluenceGatekeeper::open(
                "confluence",
                service.clone(),
                db.kv("confluence"),
                clock,
                Policy::GUARDED,
            )
            .unwrap(),
        );
        overseer.register(wiki.clone()).unwrap();
        (overseer, wiki)
    };

    let ledger_id = {
        let db = Database::open(&path).unwrap();
        let (overseer, wiki) = open(&db);
        let session = wiki.session(overseer.queue_for("confluence", "agent").unwrap());
        session
            .create_page("OPS", "Runbook", "restart the thing")
            .await
            .unwrap();
        assert_eq!(wiki.pending_count(), 1);
        let open = overseer.open_actions().unwrap();
        assert_eq!(open.len(), 1);
        open[0].id
    };
    assert_eq!(
        service.writes(),
        0,
        "nothing reached the wiki before approval"
    );

    let db = Database::open(&path).unwrap();
    let (overseer, wiki) = open(&db);
    assert_eq!(
        wiki.pending_count(),
        1,
        "the staged page was reloaded from the database"
    );
    overseer.approve(ledger_id, "ana").await.unwrap();
    overseer.settle().await;
    assert_eq!(service.writes(), 1);
    let entry = overseer.entry(ledger_id).unwrap().unwrap();
    assert_eq!(entry.action().unwrap().state, ActionState::Approved);
    assert_eq!(wiki.pending_count(), 0);
}

#[test]
fn compare_and_set_answers_as_the_in_memory_map() {
    let db = Database::open_in_memory().unwrap();
    let sqlite = db.kv("wiki");
    let noise = db.kv("other");
    let memory = MemoryKv::new();
    let mut rng = XorShift(0x2545_F491_4F6C_DD1D);
    let values: [&[u8]; 3] = [b"", b"a", b"ab"];
    for step in 0..600 {
        let key = rng.pick(&["action:01", "action:02", "seq:action"]);
        let expected = match rng.next() % 4 {
            0 => None,
            n => Some(values[(n - 1) as usize]),
        };
        let value = Bytes::from_static(values[(rng.next() % 3) as usize]);
        noise.put(key, Bytes::from_static(b"a")).unwrap();
        assert_eq!(
            sqlite
                .compare_and_set(key, expected, value.clone())
                .unwrap(),
            memory.compare_and_set(key, expected, value).unwrap(),
            "step {step}: compare_and_set {key:?} over {expected:?}"
        );
        assert_eq!(sqlite.get(key).unwrap(), memory.get(key).unwrap());
    }
}

/// Two gatekeepers over two handles on one file, as two processes with the same store
/// open would hold it, and the wiki both talk to; `pages` pages (100, 101, …) each with
/// one append staged through the first (each by its own session, so none waits for
/// another). Returns the handles' gatekeepers and the staged driver ids.
async fn two_gatekeepers_one_file(
    path: &std::path::Path,
    service: &Arc<WikiService>,
    pages: u64,
) -> (
    Arc<ConfluenceGatekeeper>,
    Arc<ConfluenceGatekeeper>,
    Vec<kernel::DriverActionId>,
) {
    service.add_space("OPS");
    let open = |db: &Database| {
        Arc::new(
            ConfluenceGatekeeper::open(
                "confluence",
                service.clone(),
                db.kv("confluence"),
                Arc::new(StepClock::default()),
                Policy::GUARDED,
            )
            .unwrap(),
        )
    };
    let first_db = Database::open(path).unwrap();
    let first = open(&first_db);
    let overseer = Overseer::with_store(first_db.ledger(), Arc::new(StepClock::default()));
    overseer.register(first.clone()).unwrap();
    let mut staged = Vec::new();
    for n in 0..pages {
        service.seed_page_with_id(100 + n, "OPS", "Manual", "original");
        let session = first.session(overseer.queue_for("confluence", "agent").unwrap());
        let page = session.open(&(100 + n).to_string()).await.unwrap();
        staged.push(session.append_content(&page, "more").await.unwrap().action);
    }
    // Opened after the staging, so it knows every action as pending.
    let second = open(&Database::open(path).unwrap());
    assert_eq!(second.pending_count(), pages as usize);
    (first, second, staged)
}

#[tokio::test]
async fn two_handles_applying_one_action_send_it_once() {
    let dir = TempDir::new("wiki-claim");
    let path = dir.join("gate.db");
    let service = Arc::new(WikiService::new());
    let (first, second, staged) = two_gatekeepers_one_file(&path, &service, 1).await;
    let id = staged[0];
    first.apply_action(id).await.unwrap();
    assert_eq!(service.writes(), 1);
    // The second still indexes the action as pending; its claim finds it applied in the
    // file, so it sends nothing and reports success, as for any action already applied.
    second.apply_action(id).await.unwrap();
    assert_eq!(service.writes(), 1, "sent at most once");
    assert_eq!(
        service.page(100).unwrap().body,
        "<p>original</p><p>more</p>"
    );
    assert_eq!(
        second.record(id).unwrap().state,
        gatekeeper_confluence::RecordState::Applied,
        "the second reloaded the record it lost the claim to"
    );
}

#[test]
fn two_handles_applying_the_same_actions_at_once_send_each_once() {
    const PAGES: u64 = 12;
    let dir = TempDir::new("wiki-claim-race");
    let path = dir.join("gate.db");
    let service = Arc::new(WikiService::new());
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    };
    let (first, second, staged) =
        runtime().block_on(two_gatekeepers_one_file(&path, &service, PAGES));
    let barrier = Arc::new(std::sync::Barrier::new(2));
    let threads: Vec<_> = [first, second]
        .into_iter()
        .map(|gatekeeper| {
            let (barrier, staged) = (barrier.clone(), staged.clone());
            std::thread::spawn(move || {
                barrier.wait();
                runtime().block_on(async {
                    for id in staged {
                        // Losing a claim to the other handle is a refusal or a success
                        // without a send; either way nothing is sent twice.
                        let _ = gatekeeper.apply_action(id).await;
                    }
                })
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(service.writes(), PAGES, "each action sent exactly once");
    for n in 0..PAGES {
        assert_eq!(
            service.page(100 + n).unwrap().body,
            "<p>original</p><p>more</p>",
            "page {}",
            100 + n
        );
    }
}

#[test]
fn a_value_larger_than_one_write_is_stored_whole() {
    // SQLite's own file layer writes at most 128 KiB at once; a commit of several MiB
    // reaches the log through the store's layer in pieces it takes.
    let dir = TempDir::new("large-value");
    let db = Database::open(dir.join("gate.db")).unwrap();
    let kv = db.kv("wiki");
    for i in 0..3u8 {
        kv.put(&format!("k{i}"), vec![i; 6 << 20].into()).unwrap();
    }
    drop(kv);
    drop(db);
    let db = Database::open(dir.join("gate.db")).unwrap();
    let value = db.kv("wiki").get("k2").unwrap().unwrap();
    assert_eq!(value.len(), 6 << 20);
    assert!(value.iter().all(|b| *b == 2));
}

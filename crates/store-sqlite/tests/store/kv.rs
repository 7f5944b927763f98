//! gatekeeper-confluence's key-value port on SQLite: the same answers as the in-memory
//! map for any sequence of operations, namespaces that do not leak, and a wiki driver
//! whose staged pages survive a restart and are then approved.

use std::sync::Arc;

use gatekeeper_confluence::{ConfluenceGatekeeper, KvStore, MemoryKv, Policy, WikiService};
use kernel::{ActionState, Overseer, StepClock};
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
                let value = rng.next().to_le_bytes()[..(rng.next() % 9) as usize].to_vec();
                sqlite.put(key, value.clone()).unwrap();
                memory.put(key, value.clone()).unwrap();
                noise.put(key, vec![0xEE]).unwrap();
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

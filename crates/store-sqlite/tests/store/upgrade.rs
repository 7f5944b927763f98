//! A redo journal that an older daemon left beside its file is brought in by the first
//! open, as that daemon's own next start would have: the fixture is a file and journal
//! left by the older store's daemon killed while eight agents staged and approved (104
//! records past the position the file held), and `expected.txt` is what the older
//! store's own replay made of them.

use std::path::Path;

use store_sqlite::{Database, StoreError};

use crate::support::TempDir;

/// The fixture, copied into a fresh directory: returns the directory and the file.
fn left_journal() -> (TempDir, std::path::PathBuf) {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/left-journal");
    let dir = TempDir::new("left-journal");
    for name in ["gate.db", "gate.db-redo"] {
        std::fs::copy(fixture.join(name), dir.join(name)).expect("copy the fixture");
    }
    let db = dir.join("gate.db");
    (dir, db)
}

/// What the fixture's `expected.txt` lists: each ledger entry's id, kind, state, decider,
/// failure kind, whether it may be retried and driver id; each action's gatekeeper, id,
/// state and whether it may be retried.
fn dump(db: &Database) -> String {
    let rows = |sql: &str, tag: &str| {
        db.query_text(sql)
            .unwrap()
            .into_iter()
            .map(|row| {
                let cells: Vec<String> = row.into_iter().map(Option::unwrap_or_default).collect();
                format!("{tag} {}\n", cells.join("|"))
            })
            .collect::<String>()
    };
    rows(
        "SELECT id, kind, state, coalesce(resolved_by, ''), coalesce(failure_kind, ''),
                coalesce(failure_retryable, ''), coalesce(driver_id, '')
         FROM ledger ORDER BY id",
        "ledger",
    ) + &rows(
        "SELECT gatekeeper, id, state, coalesce(retryable, '') FROM actions
         ORDER BY gatekeeper, id",
        "action",
    )
}

fn expected() -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/left-journal/expected.txt"),
    )
    .unwrap()
}

#[test]
fn a_journal_an_older_daemon_left_is_brought_in_by_the_first_open_and_removed() {
    let (dir, path) = left_journal();
    // The file alone, without its journal (a copy of it, opened on its own).
    let alone = dir.join("alone.db");
    std::fs::copy(&path, &alone).unwrap();
    let before = dump(&Database::open(&alone).unwrap());
    let db = Database::open(&path).unwrap();
    assert!(!dir.join("gate.db-redo").exists(), "the journal is removed");
    let after = dump(&db);
    assert_eq!(after, expected());
    assert_ne!(before, after, "the journal held records the file lacked");
    // Every action is settled or waiting for a person; the claim the kill left is an
    // "interrupted" failure (outcome unknown), never retried.
    assert!(!after.contains("|applying|"), "{after}");
    drop(db);
    // Opening again changes nothing.
    assert_eq!(dump(&Database::open(&path).unwrap()), expected());
}

#[test]
fn a_journal_an_older_daemon_still_holds_is_refused_and_nothing_changes() {
    let (dir, path) = left_journal();
    let journal = std::fs::File::open(dir.join("gate.db-redo")).unwrap();
    journal.lock().unwrap();
    let error = Database::open(&path).unwrap_err();
    assert!(matches!(error, StoreError::InUse { .. }), "{error}");
    assert!(error.to_string().contains("stop it first"), "{error}");
    drop(journal);
    // Once the older daemon is gone, the same journal is brought in whole.
    assert_eq!(dump(&Database::open(&path).unwrap()), expected());
}

#[test]
fn a_journal_record_that_cannot_be_read_is_refused_and_nothing_changes() {
    let (dir, path) = left_journal();
    let redo = dir.join("gate.db-redo");
    let intact = std::fs::read(&redo).unwrap();
    // Break the JSON of the chain's last record, with a checksum that still matches, so
    // the record is read and its payload refused.
    let mut broken = intact.clone();
    let (mut at, mut last) = (0, 0);
    while at + 16 <= broken.len() {
        let len = u32::from_le_bytes(broken[at..at + 4].try_into().unwrap()) as usize;
        if len == 0 || at + 16 + len > broken.len() {
            break;
        }
        last = at;
        at += 16 + len;
    }
    let len = u32::from_le_bytes(broken[last..last + 4].try_into().unwrap()) as usize;
    broken[last + 16] = b'X';
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&broken[last + 4..last + 12]);
    hasher.update(&broken[last + 16..last + 16 + len]);
    broken[last + 12..last + 16].copy_from_slice(&hasher.finalize().to_le_bytes());
    std::fs::write(&redo, &broken).unwrap();

    let error = Database::open(&path).unwrap_err();
    assert!(matches!(error, StoreError::Journal { .. }), "{error}");
    let message = error.to_string();
    assert!(message.contains("cannot be read"), "{message}");
    assert!(message.contains("nothing was changed"), "{message}");
    assert!(redo.exists(), "the journal is kept");
    // Nothing was changed: with the intact journal back, the open brings it all in.
    std::fs::write(&redo, &intact).unwrap();
    assert_eq!(dump(&Database::open(&path).unwrap()), expected());
}

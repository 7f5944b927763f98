//! Opening a file: what it reads (a fixed handful of pages, not the whole file), what it
//! refuses with a message a person can act on, what a refusal leaves behind (nothing),
//! and a write waiting for another process's lock, which must not hold up this process's
//! reads.

use std::io::{BufRead, BufReader, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use kernel::{LedgerEntry, LedgerId, ObservationDescription, Timestamp};
use store_sqlite::{Database, LedgerReader, StoreError};

use crate::support::TempDir;

fn observation(text: &str) -> impl FnMut(LedgerId) -> LedgerEntry + '_ {
    move |id| LedgerEntry {
        id,
        gatekeeper: "wiki".into(),
        caller: "agent".into(),
        created_at: Timestamp(id.0),
        body: kernel::EntryBody::Observation(ObservationDescription::new(
            format!("read {id}"),
            text,
        )),
    }
}

/// A closed database file holding `n` observations: the first written through the
/// ledger, the rest copied from it in one transaction (one commit, not `n`).
pub fn fill(path: &Path, n: usize) {
    {
        let db = Database::open(path).unwrap();
        db.ledger()
            .insert(&mut observation(&"x".repeat(300)))
            .unwrap();
    }
    let raw = rusqlite::Connection::open(path).unwrap();
    raw.execute(
        "WITH RECURSIVE n(i) AS (SELECT 2 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
         INSERT INTO ledger (id, kind, gatekeeper, caller, created_at, description_json)
         SELECT i, kind, gatekeeper, caller, i, description_json
         FROM n, (SELECT * FROM ledger WHERE id = 1)",
        [n as i64],
    )
    .unwrap();
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn opening_a_large_file_does_not_read_every_page_and_the_full_check_is_its_own_step() {
    let dir = TempDir::new("no-scan");
    let path = dir.join("gate.db");
    fill(&path, 3000);
    // And a driver's action store with records to match against the ledger, as opening
    // does: one settled, one pending.
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(
            r#"INSERT INTO actions (gatekeeper, id, tool, args_json, state, submitted_at, result_json)
                   VALUES ('gk', 1, 'tool', '{}', 'applied', 0, '{"content":[]}'),
                          ('gk', 2, 'tool', '{}', 'pending', 0, NULL);
               INSERT INTO ledger (id, kind, gatekeeper, caller, created_at, description_json,
                       driver_id, state, depends_on_json, restart_requested)
                   VALUES (3001, 'action', 'gk', 'agent', 0, '{"title":"a"}', 1, 'approved', '[]', 0),
                          (3002, 'action', 'gk', 'agent', 0, '{"title":"b"}', 2, 'pending', '[]', 0);"#,
        )
        .unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let page = 4096;
    let pages = bytes.len() / page;
    assert!(pages > 100, "expected a file of many pages, got {pages}");
    // Damage one page in the middle: a page nothing reads unless it reads everything.
    let middle = pages / 2 * page;
    bytes[middle..middle + page].fill(0xA5);
    std::fs::write(&path, &bytes).unwrap();

    // Opening reads the header, the schema and the newest entries: it does not notice.
    let db = Database::open(&path).expect("opening reads only a few pages");
    let newest = db
        .ledger()
        .get(LedgerId(3002))
        .unwrap()
        .expect("the newest entry");
    assert_eq!(newest.id, LedgerId(3002));
    drop(db);

    // The full check is an explicit step, and it finds the damage.

    let reader = LedgerReader::open(&path).unwrap();
    let findings = reader.check_integrity(10).unwrap();
    assert!(!findings.is_empty(), "the full check reads every page");
}

#[test]
fn a_directory_given_as_the_database_is_refused_clearly_and_nothing_is_created() {
    let dir = TempDir::new("dir-as-db");
    let path = dir.join("gate.db");
    std::fs::create_dir(&path).unwrap();
    let error = Database::open(&path).unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("is a directory, not a database file"),
        "{message}"
    );
    assert!(
        message.contains("name the database file itself"),
        "{message}"
    );
    assert_eq!(listing(&dir.join("")), ["gate.db"], "nothing next to it");
    assert_eq!(listing(&path), Vec::<String>::new(), "nothing inside it");
}

#[test]
fn a_character_device_given_as_the_database_gets_no_side_files() {
    let dir = TempDir::new("device");
    let path = dir.join("null");
    // A device node of our own (root may make one), so side files would land in the
    // test's directory, not in /dev.
    let made = Command::new("mknod")
        .arg(&path)
        .args(["c", "1", "3"])
        .status()
        .is_ok_and(|s| s.success());
    if !made {
        eprintln!("cannot make a device node here; checking /dev/null instead");
        let error = Database::open("/dev/null").unwrap_err();
        assert!(error.to_string().contains("a character device"), "{error}");
        assert!(!Path::new("/dev/null-journal").exists());
        assert!(!Path::new("/dev/null-sessions").exists());
        return;
    }
    let error = Database::open(&path).unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("is a character device, not a database file"),
        "{message}"
    );
    assert_eq!(
        listing(&dir.join("")),
        ["null"],
        "no -journal, no -sessions"
    );
}

#[test]
fn a_sessions_file_in_the_way_is_named_and_the_refused_open_leaves_nothing() {
    let dir = TempDir::new("sessions-file");
    let path = dir.join("gate.db");
    std::fs::write(dir.join("gate.db-sessions"), b"not a directory").unwrap();
    let error = Database::open(&path).unwrap_err();
    assert!(matches!(error, StoreError::InTheWay { .. }), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains("gate.db-sessions is in the way"),
        "{message}"
    );
    assert!(message.contains("move it aside"), "{message}");
    // The refused open created no database file that would block the next attempt.
    assert_eq!(listing(&dir.join("")), ["gate.db-sessions"]);

    std::fs::remove_file(dir.join("gate.db-sessions")).unwrap();
    Database::open(&path).expect("with the file moved aside, it opens");
}

#[test]
fn a_database_error_prints_its_cause_once() {
    let db = Database::open_in_memory().unwrap();
    let error = db
        .query_text("SELECT no_such_column FROM ledger")
        .unwrap_err();
    let message = error.to_string();
    assert!(message.contains("no such column"), "{message}");
    // A report that prints every cause (anyhow's `{:#}`) must not repeat the text.
    let mut cause = std::error::Error::source(&error);
    while let Some(inner) = cause {
        assert!(
            !message.contains(&inner.to_string()),
            "the cause {inner:?} is already in {message:?}"
        );
        cause = inner.source();
    }
}

#[test]
fn a_write_waiting_for_another_process_does_not_hold_up_reads() {
    let dir = TempDir::new("busy-read");
    let path = dir.join("gate.db");
    fill(&path, 3);
    let db = Database::open(&path).unwrap();
    let ledger = db.ledger();

    let mut holder = Command::new(env!("CARGO_BIN_EXE_race-worker"))
        .args(["hold-lock", path.to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the lock holder");
    let mut line = String::new();
    BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "locked");

    // A write in this process waits for the other process's lock...
    let writer = {
        let ledger = ledger.clone();
        std::thread::spawn(move || ledger.insert(&mut observation("late")).map(|id| id.0))
    };
    std::thread::sleep(Duration::from_millis(200));
    // ...while a read in this process goes on.
    let (done, read) = mpsc::channel();
    {
        let ledger = ledger.clone();
        std::thread::spawn(move || {
            let _ = done.send(ledger.get(LedgerId(2)).map(|e| e.map(|e| e.id)));
        });
    }
    let answer = read.recv_timeout(Duration::from_secs(10));
    // Let the other process go, whatever happened, so nothing is left waiting.
    drop(holder.stdin.take());
    let _ = holder.wait();
    let answer = answer.expect("the read waited behind the write waiting for the lock");
    assert_eq!(answer.unwrap(), Some(LedgerId(2)));
    assert_eq!(
        writer.join().unwrap().unwrap(),
        4,
        "the write went through after"
    );
    let _ = std::io::stdout().flush();
}

#[test]
fn the_reader_sees_what_a_live_writer_committed_and_creates_nothing() {
    let dir = TempDir::new("reader-live");
    let path = dir.join("gate.db");
    let db = Database::open(&path).unwrap();
    let ledger = db.ledger();
    for _ in 0..3 {
        ledger.insert(&mut observation("live")).unwrap();
    }
    let before = listing(&dir.join(""));
    assert!(before.contains(&"gate.db-wal".to_owned()), "{before:?}");
    let reader = LedgerReader::open(&path).unwrap();
    let page = reader.page(None, 2).unwrap();
    let ids: Vec<u64> = page.iter().map(|e| e.as_ref().unwrap().id.0).collect();
    assert_eq!(ids, [3, 2], "most recent first, two of them");
    let older = reader.page(Some(LedgerId(2)), 2).unwrap();
    assert_eq!(older.len(), 1);
    // A commit made after the reader opened is seen by its next read.
    ledger.insert(&mut observation("later")).unwrap();
    assert_eq!(reader.last_id().unwrap(), 4);
    drop(reader);
    assert_eq!(listing(&dir.join("")), before, "the reader created nothing");
}

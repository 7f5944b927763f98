//! Two real processes deciding the same actions on one database file, at the same moment,
//! round after round (see `src/bin/race-worker.rs`): approve against approve, approve
//! against reject, and an auto-approval drain against a person.
//!
//! What must hold, from the service's own delivery log, what each decision returned, and
//! the ledger:
//! 1. no call is delivered twice;
//! 2. the ledger names the decider that actually decided: an approved action was
//!    delivered once, by the process whose person the ledger names (or by a drain, when
//!    the ledger says a rule approved it), and that person's approve returned `Ok`; a
//!    rejected action was never delivered, and the rejecter's reject returned `Ok`;
//! 3. no action ends failed (nothing here fails; a loser must not record a failure);
//! 4. every loser gets an ordinary refusal, never a storage failure ("cannot leave a
//!    final state", "check the disk").

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

use store_sqlite::Database;

use crate::support::TempDir;

const WORKER: &str = env!("CARGO_BIN_EXE_race-worker");

const ROUNDS: u64 = 120;

/// `seq -> lines` of a log whose lines start with `<word> <seq> `.
fn by_seq(path: &Path, word: &str) -> BTreeMap<u64, Vec<String>> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut out: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for line in text.lines() {
        let mut parts = line.splitn(3, ' ');
        assert_eq!(parts.next(), Some(word), "unexpected line {line:?}");
        let seq: u64 = parts.next().and_then(|s| s.parse().ok()).expect("a seq");
        out.entry(seq)
            .or_default()
            .push(parts.next().unwrap_or("").to_owned());
    }
    out
}

/// Run both workers in `mode` on a fresh file; returns the directory with their logs.
fn race(mode: &str) -> (TempDir, Vec<Vec<Option<String>>>) {
    let dir = TempDir::new(&format!("race-{mode}"));
    let db = dir.join("gate.db");
    // Created (schema and all) before the race, so the two workers only open it.
    drop(Database::open(&db).expect("create the database"));
    let rounds = ROUNDS.to_string();
    let spawn = |role: &str| {
        Command::new(WORKER)
            .args([
                mode,
                db.to_str().expect("utf-8 path"),
                dir.join("").to_str().expect("utf-8 path"),
                role,
                &rounds,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start a worker")
    };
    let workers = [spawn("a"), spawn("b")];
    for worker in workers {
        let output = worker.wait_with_output().expect("reap");
        assert!(
            output.status.success() && output.stdout.starts_with(b"done"),
            "a worker failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let rows = Database::open(&db)
        .expect("reopen")
        .query_text(
            "SELECT id, state, resolved_by, auto_approved FROM ledger WHERE kind = 'action' ORDER BY id",
        )
        .expect("read the ledger");
    (dir, rows)
}

/// Check every round of a race; `person_of` names the person of each role.
fn check(mode: &str, person_of: &[(&str, &str)]) {
    let (dir, rows) = race(mode);
    assert_eq!(rows.len() as u64, ROUNDS, "one action per round");
    let deliveries = by_seq(&dir.join("deliveries.log"), "deliver");
    let results: BTreeMap<&str, BTreeMap<u64, Vec<String>>> = ["a", "b"]
        .into_iter()
        .map(|role| {
            (
                role,
                by_seq(&dir.join(&format!("results-{role}.log")), "result"),
            )
        })
        .collect();
    let role_of = |person: &str| {
        person_of
            .iter()
            .find(|(_, p)| *p == person)
            .map(|(role, _)| *role)
    };
    for row in &rows {
        let [Some(id), Some(state), by, auto] = &row[..] else {
            panic!("unexpected row {row:?}");
        };
        let seq: u64 = id.parse().expect("an id");
        let delivered = deliveries.get(&seq).cloned().unwrap_or_default();
        assert!(
            delivered.len() <= 1,
            "#{seq} was delivered {} times: {delivered:?}",
            delivered.len()
        );
        let said = |role: &str| results[role].get(&seq).cloned().unwrap_or_default();
        for role in ["a", "b"] {
            for line in said(role) {
                assert!(
                    line == "ok" || line.starts_with("refused "),
                    "#{seq}: {role} said {line:?}"
                );
                for bad in [
                    "cannot leave a final state",
                    "check the disk",
                    "storage failed",
                ] {
                    assert!(
                        !line.contains(bad),
                        "#{seq}: {role}, the loser, was told {line:?}"
                    );
                }
            }
        }
        let by = by.as_deref().unwrap_or("(nobody)");
        match state.as_str() {
            "approved" => {
                let [delivery] = &delivered[..] else {
                    panic!("#{seq} is approved by {by} but was never delivered");
                };
                let (sender, how) = delivery.split_once(' ').expect("role and how");
                if how == "drain" {
                    assert_eq!(
                        (by, auto.as_deref()),
                        ("rule-owner", Some("1")),
                        "#{seq} was sent by a drain in {sender}, but the ledger says {by}"
                    );
                } else {
                    assert_eq!(
                        (by, auto.as_deref()),
                        (how, Some("0")),
                        "#{seq} was sent by {how} in process {sender}, but the ledger names {by}"
                    );
                    assert_eq!(
                        role_of(how),
                        Some(sender),
                        "#{seq}: {how} runs in one process"
                    );
                    assert!(
                        said(sender).contains(&"ok".to_owned()),
                        "#{seq}: {how} sent it, but was told {:?}",
                        said(sender)
                    );
                }
            }
            "rejected" => {
                assert!(
                    delivered.is_empty(),
                    "#{seq} is rejected by {by} but was delivered: {delivered:?}"
                );
                let role = role_of(by).unwrap_or_else(|| panic!("#{seq} rejected by {by}"));
                assert!(
                    said(role).contains(&"ok".to_owned()),
                    "#{seq}: the ledger says {by} rejected it, but {by} was told {:?}",
                    said(role)
                );
            }
            other => panic!(
                "#{seq} ended {other} (by {by}); delivered {delivered:?}; a said {:?}, b said {:?}",
                said("a"),
                said("b")
            ),
        }
    }
}

#[test]
fn two_processes_approving_one_action_record_the_one_that_sent_it() {
    check("approve-approve", &[("a", "ann"), ("b", "bob")]);
}

#[test]
fn two_processes_approving_and_rejecting_one_action_record_the_true_decider() {
    check("approve-reject", &[("a", "ann"), ("b", "rita")]);
}

#[test]
fn a_drain_and_a_person_in_two_processes_record_the_true_decider() {
    check("drain-person", &[("b", "bob")]);
}

fn decided(by: &str, at: u64) -> kernel::Resolution {
    kernel::Resolution {
        by: by.to_owned(),
        auto: false,
        at: kernel::Timestamp(at),
        cause: None,
    }
}

/// The store's side of the rules above, step by step, with two handles on one file (two
/// sessions, as two processes would have).
#[test]
fn a_decision_under_way_in_another_session_is_neither_overwritten_nor_taken_over() {
    let dir = TempDir::new("sessions");
    let path = dir.join("gate.db");
    let first = Database::open(&path).unwrap();
    let second = Database::open(&path).unwrap();
    let (ours, theirs) = (first.ledger(), second.ledger());
    let description = kernel::ActionDescription::new("t", "d");
    let id = ours
        .insert(&mut crate::support::pending_entry(
            "gk",
            1,
            description.clone(),
        ))
        .unwrap();
    let stale = ours.get(id).unwrap().unwrap();

    assert!(theirs.record_attempt(id, &decided("bob", 1)).unwrap());
    second.flush().unwrap();
    // The other session decides it: this one may neither record itself nor its outcome.
    assert!(!ours.record_attempt(id, &decided("ann", 2)).unwrap());
    let mut ann = stale.clone();
    let action = ann.action_mut().unwrap();
    action.state = kernel::ActionState::Approved;
    action.resolution = Some(decided("ann", 2));
    let error = ours.put(ann).unwrap_err();
    assert!(
        error.0.contains("being decided by another process"),
        "{error}"
    );
    // A flag written from a copy read earlier keeps the record of who decides.
    let mut flagged = stale.clone();
    flagged.action_mut().unwrap().blocked_by = Some(kernel::LedgerId(99));
    ours.put(flagged).unwrap();
    let now = ours.get(id).unwrap().unwrap();
    assert_eq!(now.action().unwrap().resolution, Some(decided("bob", 1)));

    // The deciding session's outcome stands; a stale pending copy cannot take it back.
    let mut bob = now.clone();
    bob.action_mut().unwrap().state = kernel::ActionState::Approved;
    theirs.put(bob).unwrap();
    second.flush().unwrap();
    let error = ours.put(stale).unwrap_err();
    assert!(error.0.contains("is no longer open"), "{error}");
    let row = first
        .query_text(&format!(
            "SELECT state, resolved_by, deciding_session FROM ledger WHERE id = {}",
            id.0
        ))
        .unwrap();
    assert_eq!(
        row,
        [[Some("approved".to_owned()), Some("bob".to_owned()), None]]
    );

    // A session that ended holds nothing: its mark is taken over.
    let other = ours
        .insert(&mut crate::support::pending_entry("gk", 2, description))
        .unwrap();
    first.flush().unwrap();
    assert!(theirs.record_attempt(other, &decided("bob", 3)).unwrap());
    drop(theirs);
    drop(second);
    assert!(ours.record_attempt(other, &decided("ann", 4)).unwrap());
}

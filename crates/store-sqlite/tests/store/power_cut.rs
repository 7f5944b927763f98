//! Power cuts, in the sense SQLite can be tested for them: what a sync has not yet made
//! durable is the tail of the write-ahead log, and a power cut may keep any prefix of it.
//! Each test copies the database and its log while the writer is still open, cuts the
//! copy's log anywhere past the last point known to be synced (the moment a call goes
//! out, its claim is synced and is the last commit), opens the copy as the next process
//! would, and checks the ledger: nothing sent is pending again (no second send), and no
//! acknowledged submission is lost.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use gatekeeper_core::store::INTERRUPTED_MESSAGE;
use gatekeeper_core::{ActionState, CallOutcome};
use kernel::{ActionState as LedgerState, LedgerEntry, LedgerId};
use serde_json::json;
use store_sqlite::Database;

use crate::support::{Rig, Store, TempDir};

fn log_of(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

/// Record the log's length each time a call goes out: every byte of it is synced then.
fn note_synced_lengths(rig: &Rig, path: &Path) -> Arc<Mutex<Vec<(String, u64)>>> {
    let synced = Arc::new(Mutex::new(Vec::new()));
    let (log, notes) = (log_of(path), synced.clone());
    *rig.service.on_call.lock().unwrap() = Some(Box::new(move |tool, args| {
        let len = std::fs::metadata(&log).unwrap().len();
        notes.lock().unwrap().push((format!("{tool} {args}"), len));
    }));
    synced
}

/// Copy the database at `path` into `into`, its log cut to `keep` bytes.
fn cut_copy(path: &Path, into: &Path, keep: u64) -> PathBuf {
    std::fs::create_dir_all(into).unwrap();
    let copy = into.join("gate.db");
    std::fs::copy(path, &copy).unwrap();
    let log = std::fs::read(log_of(path)).unwrap();
    std::fs::write(log_of(&copy), &log[..keep as usize]).unwrap();
    copy
}

/// Where to cut between `synced` and `end`: both ends, and points in between that fall
/// on and off frame boundaries.
fn cuts(synced: u64, end: u64) -> Vec<u64> {
    let mut at: Vec<u64> = (synced..end).step_by(1021).collect();
    at.extend([synced, synced + 24, end.saturating_sub(1), end]);
    at.retain(|&n| n >= synced && n <= end);
    at.sort_unstable();
    at.dedup();
    at
}

pub(crate) fn entry(entries: &[LedgerEntry], id: LedgerId) -> &LedgerEntry {
    entries
        .iter()
        .find(|e| e.id == id)
        .unwrap_or_else(|| panic!("ledger entry {id} was lost"))
}

/// An action that was sent: applied, or failed with its outcome unknown; never open.
pub(crate) fn sent_and_settled(entries: &[LedgerEntry], id: LedgerId) -> bool {
    let action = entry(entries, id).action().unwrap();
    match action.state {
        LedgerState::Approved => true,
        LedgerState::Failed => {
            let failure = action.failure.as_ref().unwrap();
            assert_eq!(
                (failure.message.as_str(), failure.retryable),
                (INTERRUPTED_MESSAGE, false),
                "a sent action whose outcome was lost is 'outcome unknown'"
            );
            false
        }
        other => panic!("a sent action is {other} after a power cut: it could be sent again"),
    }
}

#[tokio::test]
async fn a_power_cut_after_an_unsynced_outcome_leaves_outcome_unknown_never_a_resend() {
    let dir = TempDir::new("power-cut");
    let path = dir.join("gate.db");
    let rig = Rig::new(Database::open(&path).unwrap()).await;
    let synced = note_synced_lengths(&rig, &path);

    let waiting = rig.queue_issue("Add dark mode").await.ledger().unwrap();
    let approved = rig
        .queue_issue("Fix the login page")
        .await
        .ledger()
        .unwrap();
    rig.overseer.approve(approved, "alice").await.unwrap();
    // The outcome is committed (the log grew) but not synced by anyone yet.
    let end = std::fs::metadata(log_of(&path)).unwrap().len();
    let at_send = synced.lock().unwrap()[0].1;
    assert!(end > at_send, "the outcome was committed after the send");

    let mut lost = 0;
    for (n, keep) in cuts(at_send, end).into_iter().enumerate() {
        let copy = cut_copy(&path, &dir.join(&format!("cut-{n}")), keep);
        let after = Rig::new(Database::open(&copy).unwrap()).await;
        let cut = format!("cut at {keep} of {end}");
        if !after_a_cut_past_an_outcome(&after, waiting, approved, &cut).await {
            lost += 1;
        }
    }
    assert!(lost > 0, "no cut lost the unsynced outcome");
    assert_eq!(rig.service.calls().len(), 1);
}

/// What the next process finds after a power cut past a person's approval of `approved`,
/// whose outcome was not yet synced, while `waiting` ("Add dark mode") still waited: the
/// acknowledged submission still waits, with its staged call; the next process sends it
/// once and refuses `approved` again. Returns whether `approved`'s outcome survived (if
/// not, it is unknown, never open). `cut` names the copy in messages.
pub(crate) async fn after_a_cut_past_an_outcome<D: Store>(
    after: &Rig<D>,
    waiting: LedgerId,
    approved: LedgerId,
    cut: &str,
) -> bool {
    let entries = after.overseer.ledger().unwrap();
    let kept = sent_and_settled(&entries, approved);
    let action = entry(&entries, waiting).action().unwrap();
    assert_eq!(action.state, LedgerState::Pending, "{cut}");
    let record = after
        .db
        .action_storage("issues")
        .get(action.driver_id)
        .await
        .unwrap()
        .expect("its staged call was lost");
    assert_eq!(record.state, ActionState::Pending, "{cut}");
    after.overseer.approve(waiting, "bob").await.unwrap();
    assert!(
        after.overseer.approve(approved, "bob").await.is_err(),
        "{cut}"
    );
    let calls = after.service.calls();
    assert_eq!(calls.len(), 1, "{cut}: {calls:?}");
    assert_eq!(calls[0].1, json!({"title": "Add dark mode"}), "{cut}");
    kept
}

/// Stage `n` auto-approvable calls, enable their rule, and let the drain send them all;
/// their ledger ids, in the order they were staged (and sent).
pub(crate) async fn drained<D: Store>(rig: &Rig<D>, n: u64) -> Vec<LedgerId> {
    let mut queued = Vec::new();
    for n in 0..n {
        let outcome = rig
            .session
            .call_tool("addLabel", json!({"issue": n, "label": "bug"}))
            .await
            .unwrap();
        assert!(matches!(outcome, CallOutcome::Pending { .. }));
        queued.push(outcome.ledger().unwrap());
    }
    rig.overseer
        .enable_rule("issues", rig.label_kind(), "carol")
        .unwrap();
    rig.overseer.settle().await;
    assert_eq!(rig.service.calls().len(), queued.len());
    queued
}

/// What the next process finds after a power cut just past the synced point of the `k`-th
/// send of a drain of `queued`: every earlier action's outcome rode with that send's
/// claim, so it survives; the action being sent is at worst unknown; the later ones were
/// never claimed. The rule is on disk, and the next process drains what was never
/// claimed, once.
pub(crate) async fn after_a_cut_at_send<D: Store>(after: &Rig<D>, queued: &[LedgerId], k: usize) {
    let entries = after.overseer.ledger().unwrap();
    for (i, &id) in queued.iter().enumerate() {
        match i.cmp(&k) {
            std::cmp::Ordering::Less => assert!(
                sent_and_settled(&entries, id),
                "cut at send {k}: the outcome of {i} was synced with the claim of {k}"
            ),
            std::cmp::Ordering::Equal => {
                let _ = sent_and_settled(&entries, id);
            }
            std::cmp::Ordering::Greater => {
                let action = entry(&entries, id).action().unwrap();
                assert!(action.is_open(), "cut at send {k}: {i} was never claimed");
            }
        }
    }
    let rules = after.db.ledger().rules().unwrap();
    assert_eq!(rules.len(), 1, "cut at send {k}: the rule was lost");
    after
        .overseer
        .enable_rule("issues", after.label_kind(), "carol")
        .unwrap();
    after.overseer.settle().await;
    assert_eq!(
        after.service.calls().len(),
        queued.len() - k - 1,
        "cut at send {k}"
    );
}

#[tokio::test]
async fn a_power_cut_in_a_drain_keeps_every_outcome_a_later_claim_synced() {
    const N: u64 = 5;
    let dir = TempDir::new("power-cut-drain");
    let path = dir.join("gate.db");
    let rig = Rig::new(Database::open(&path).unwrap()).await;
    let synced = note_synced_lengths(&rig, &path);
    let queued = drained(&rig, N).await;
    let end = std::fs::metadata(log_of(&path)).unwrap().len();
    let at_sends: Vec<u64> = synced.lock().unwrap().iter().map(|s| s.1).collect();

    // Cut just past each send's synced point: every earlier action's outcome rode with
    // that send's claim, so it survives; the action being sent is at worst unknown.
    for (k, &keep) in at_sends.iter().enumerate() {
        let copy = cut_copy(&path, &dir.join(&format!("cut-{k}")), keep);
        let after = Rig::new(Database::open(&copy).unwrap()).await;
        after_a_cut_at_send(&after, &queued, k).await;
    }
    // And anywhere after the last send: nothing sent is open again.
    for (n, keep) in cuts(*at_sends.last().unwrap(), end).into_iter().enumerate() {
        let copy = cut_copy(&path, &dir.join(&format!("tail-{n}")), keep);
        let after = Rig::new(Database::open(&copy).unwrap()).await;
        let entries = after.overseer.ledger().unwrap();
        for &id in &queued {
            let _ = sent_and_settled(&entries, id);
        }
        after
            .overseer
            .enable_rule("issues", after.label_kind(), "carol")
            .unwrap();
        after.overseer.settle().await;
        assert!(after.service.calls().is_empty());
    }
}

/// An ordinary read through the rig's session: returns its observation's ledger id.
async fn read(rig: &Rig) -> LedgerId {
    match rig
        .session
        .call_tool("listIssues", json!({}))
        .await
        .expect("read")
    {
        CallOutcome::Data { observation, .. } => observation,
        other => panic!("a read, not {other:?}"),
    }
}

/// Issue 42, both sides of the rule: a power cut right after an ordinary read (the log
/// cut anywhere past its last sync) may lose that read's observation and nothing else; a
/// cut right after a sensitive read never loses the lockdown or its observation.
#[tokio::test]
async fn a_cut_after_a_read_loses_at_most_its_observation_and_never_a_lockdown() {
    let dir = TempDir::new("power-cut-read");
    let path = dir.join("gate.db");
    let rig = Rig::new(Database::open(&path).unwrap()).await;
    let waiting = rig.queue_issue("Add dark mode").await.ledger().unwrap();
    // The submission was the last synced commit.
    let synced = std::fs::metadata(log_of(&path)).unwrap().len();
    let commits = rig.db.commits();
    let syncs = rig.db.syncs();
    let observed = read(&rig).await;
    // The observation rides in the open transaction; the flusher commits it (without a
    // sync) within its window.
    let start = std::time::Instant::now();
    while rig.db.commits() == commits {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "the flusher never committed"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(rig.db.syncs(), syncs, "an ordinary read waits for no sync");
    let end = std::fs::metadata(log_of(&path)).unwrap().len();
    assert!(end > synced, "the observation is in the log, past the sync");

    let (mut lost, mut kept) = (0, 0);
    for (n, keep) in cuts(synced, end).into_iter().enumerate() {
        let copy = cut_copy(&path, &dir.join(&format!("ordinary-{n}")), keep);
        let after = Database::open(&copy).unwrap().ledger();
        let entries = after.entries().unwrap();
        assert_eq!(
            entry(&entries, waiting).action().unwrap().state,
            LedgerState::Pending,
            "cut at {keep}"
        );
        assert!(!after.locked_down().unwrap(), "cut at {keep}");
        match entries.iter().find(|e| e.id == observed) {
            Some(e) => {
                assert!(e.action().is_none(), "cut at {keep}");
                kept += 1;
            }
            None => lost += 1,
        }
        assert!(
            entries.iter().all(|e| e.id == waiting || e.id == observed),
            "cut at {keep}: {entries:?}"
        );
    }
    assert!(lost > 0, "no cut lost the unsynced observation");
    assert!(kept > 0, "no cut kept the committed observation");

    let sensitive = rig
        .overseer
        .queue_for("issues", "agent")
        .unwrap()
        .authorize_observation(kernel::ObservationDescription {
            prohibit_all_sharing: true,
            ..kernel::ObservationDescription::new("read secrets", "sensitive")
        })
        .await
        .unwrap();
    // Returned: synced. A cut keeps everything up to here.
    let synced = std::fs::metadata(log_of(&path)).unwrap().len();
    let copy = cut_copy(&path, &dir.join("sensitive"), synced);
    let after = Database::open(&copy).unwrap().ledger();
    assert!(after.locked_down().unwrap());
    let entries = after.entries().unwrap();
    entry(&entries, sensitive);
    entry(&entries, observed);
    assert_eq!(
        entry(&entries, waiting).action().unwrap().state,
        LedgerState::Pending
    );
}

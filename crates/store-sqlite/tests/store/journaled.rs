//! A file behind its redo journal (`Journaled`): the same stack as on a shared file, two
//! journal syncs per action, the file written behind, and everything there after a close,
//! a crash or a power cut.
//!
//! Crashes and power cuts are copies taken while the writer is open, as in
//! `power_cut.rs`. The file is synced only when it is opened and when the journal starts
//! over, and the applier commits to it without a sync, so a power cut leaves it at any of
//! its commits since the last sync: the copies take the two ends, its log cut back to
//! where it stood when it was opened (`Wal::AtOpen`) and its log as it stands
//! (`Wal::Whole`). The journal is cut anywhere past the length a sync covered. Opening
//! the copy replays the journal into the file, past what the file holds.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use kernel::ActionState as LedgerState;
use serde_json::json;
use store_sqlite::{Database, Journaled, StoreError};

use crate::actions::{amend_each, edited, recorded, stored_args};
use crate::power_cut::{
    after_a_cut_at_send, after_a_cut_past_an_outcome, drained, entry, sent_and_settled,
};
use crate::support::{Rig, TempDir, staged_id};

fn sidecar(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// How much of the file's write-ahead log a copy keeps.
#[derive(Debug, Clone, Copy)]
enum Wal {
    /// As long as it was when the file was opened (and synced): every commit since lost.
    AtOpen(u64),
    /// All of it: every commit the applier made kept.
    Whole,
}

impl Wal {
    /// The log's length now, right after opening: what `AtOpen` keeps.
    fn at_open(path: &Path) -> Self {
        Self::AtOpen(std::fs::metadata(sidecar(path, "-wal")).map_or(0, |m| m.len()))
    }
}

/// Copy the database at `path` into `into`, its log cut as `wal` says and its journal cut
/// to `keep` bytes (`None`: whole).
fn cut_copy(path: &Path, into: &Path, wal: Wal, keep: Option<u64>) -> PathBuf {
    std::fs::create_dir_all(into).unwrap();
    let copy = into.join("gate.db");
    std::fs::copy(path, &copy).unwrap();
    if sidecar(path, "-wal").exists() {
        let log = std::fs::read(sidecar(path, "-wal")).unwrap();
        let keep = match wal {
            Wal::AtOpen(len) => (len as usize).min(log.len()),
            Wal::Whole => log.len(),
        };
        std::fs::write(sidecar(&copy, "-wal"), &log[..keep]).unwrap();
    }
    let journal = std::fs::read(sidecar(path, "-redo")).unwrap();
    let keep = keep.map_or(journal.len(), |keep| keep as usize);
    std::fs::write(sidecar(&copy, "-redo"), &journal[..keep]).unwrap();
    copy
}

/// Record the journal's synced length each time a call goes out: the claim was synced.
fn note_synced_lengths(rig: &Rig<Journaled>) -> Arc<Mutex<Vec<u64>>> {
    let synced = Arc::new(Mutex::new(Vec::new()));
    let (db, notes) = (rig.db.clone(), synced.clone());
    *rig.service.on_call.lock().unwrap() = Some(Box::new(move |_, _| {
        notes.lock().unwrap().push(db.journal_synced_len());
    }));
    synced
}

/// Where to cut the journal from `synced` on: there, a few bytes in, and every 97 bytes
/// (on and off record boundaries) for the next 4 KiB, and nowhere (all of it).
fn cuts(synced: u64) -> Vec<Option<u64>> {
    let mut at: Vec<Option<u64>> = (synced..synced + 4096).step_by(97).map(Some).collect();
    at.extend([Some(synced + 1), Some(synced + 16), None]);
    at
}

#[tokio::test]
async fn many_cycles_reach_the_file_and_survive_a_reopen() {
    let dir = TempDir::new("journaled-cycles");
    let path = dir.join("gate.db");
    let rig = Rig::new(Journaled::open(&path).unwrap()).await;
    let (syncs, file_syncs) = (rig.db.syncs(), rig.db.file_syncs());
    // Enough for the journal to start over a few times (it does every half megabyte).
    for n in 0..1500 {
        rig.cycle(n).await;
    }
    assert_eq!(rig.service.calls().len(), 1500);
    // Two journal syncs per cycle, the stage's and the claim's, except where a restart's
    // sync of the file covered one instead.
    let (syncs, file_syncs) = (rig.db.syncs() - syncs, rig.db.file_syncs() - file_syncs);
    assert!(
        file_syncs >= 2,
        "the journal started over {file_syncs} times"
    );
    assert!(
        syncs <= 3000 && syncs + file_syncs >= 3000,
        "{syncs} journal syncs and {file_syncs} file syncs for 1,500 cycles"
    );
    drop(rig);
    assert!(
        !sidecar(&path, "-redo").exists(),
        "a clean close removes the journal"
    );
    let db = Database::open(&path).unwrap();
    let rows = db
        .query_text("SELECT state, count(*) FROM ledger GROUP BY state")
        .unwrap();
    assert_eq!(
        rows,
        vec![vec![Some("approved".into()), Some("1500".into())]]
    );
    let rows = db
        .query_text("SELECT state, count(*) FROM actions GROUP BY state")
        .unwrap();
    // Retention keeps the newest settled records only.
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0][0].as_deref(), Some("applied"));
}

#[tokio::test]
async fn a_second_open_is_refused_while_the_first_holds_the_file() {
    let dir = TempDir::new("journaled-busy");
    let path = dir.join("gate.db");
    let first = Journaled::open(&path).unwrap();
    assert!(matches!(
        Journaled::open(&path),
        Err(StoreError::InUse { .. })
    ));
    assert!(matches!(
        Database::open(&path),
        Err(StoreError::HasJournal { .. })
    ));
    drop(first);
    // And the other way round: a file open through the shared handle is not taken.
    let shared = Database::open(&path).unwrap();
    assert!(matches!(
        Journaled::open(&path),
        Err(StoreError::InUse { .. })
    ));
    drop(shared);
    drop(Journaled::open(&path).unwrap());
}

#[tokio::test]
async fn a_crash_replays_every_write_the_file_had_not_taken() {
    let dir = TempDir::new("journaled-crash");
    let path = dir.join("gate.db");
    let rig = Rig::new(Journaled::open(&path).unwrap()).await;
    let waiting = rig.queue_issue("Add dark mode").await.ledger().unwrap();
    let approved = rig.queue_issue("Fix the login").await.ledger().unwrap();
    let rejected = rig.queue_issue("Close the wiki").await.ledger().unwrap();
    rig.overseer.approve(approved, "alice").await.unwrap();
    rig.overseer.reject(rejected, "alice").await.unwrap();
    rig.overseer.settle().await;
    // A process crash keeps what was written to the journal, synced or not.
    let copy = cut_copy(&path, &dir.join("crash"), Wal::Whole, None);
    let after = Rig::new(Journaled::open(&copy).unwrap()).await;
    let entries = after.overseer.ledger().unwrap();
    let state = |id| entry(&entries, id).action().unwrap().state;
    assert_eq!(state(waiting), LedgerState::Pending);
    assert_eq!(state(approved), LedgerState::Approved);
    assert_eq!(state(rejected), LedgerState::Rejected);
    // The replayed file agrees, and the next process goes on from it.
    after.overseer.approve(waiting, "bob").await.unwrap();
    assert_eq!(after.service.calls().len(), 1);
    assert!(after.overseer.approve(approved, "bob").await.is_err());
    assert_eq!(after.service.calls().len(), 1);
}

#[tokio::test]
async fn a_replay_that_stages_and_prunes_the_same_calls_leaves_the_rows_and_ids_of_the_writer() {
    // A crash copy whose file lost every commit since it was opened replays 200 cycles in
    // one batch: the calls pruned among them are never written (`fold.rs`), and the file
    // must still end as the writer's did, and hand out the ids it would have.
    let dir = TempDir::new("journaled-passed");
    let path = dir.join("gate.db");
    let rig = Rig::new(Journaled::open(&path).unwrap()).await;
    let (wal, file_syncs) = (Wal::at_open(&path), rig.db.file_syncs());
    for n in 0..200 {
        rig.cycle(n).await;
    }
    assert_eq!(rig.db.file_syncs(), file_syncs, "the journal started over");
    let copy = cut_copy(&path, &dir.join("crash"), wal, None);
    drop(rig);
    drop(Journaled::open(&copy).unwrap());
    let rows = |path: &Path| {
        let db = Database::open(path).unwrap();
        let rows = [
            "SELECT id, state FROM actions ORDER BY id",
            "SELECT gatekeeper, last_id FROM action_ids",
            "SELECT state, count(*) FROM ledger GROUP BY state",
        ]
        .map(|sql| db.query_text(sql).unwrap());
        (db, rows)
    };
    let ((written, expected), (replayed, found)) = (rows(&path), rows(&copy));
    assert_eq!(found, expected);
    // Retention keeps the newest 100 to 115 (it prunes every sixteenth settled call): the
    // replay staged and pruned most of the others in its one batch.
    assert!((100..116).contains(&expected[0].len()), "{expected:?}");
    assert_eq!(
        staged_id(replayed.action_storage("issues")).await,
        staged_id(written.action_storage("issues")).await
    );
}

#[tokio::test]
async fn a_power_cut_after_an_unsynced_outcome_leaves_outcome_unknown_never_a_resend() {
    let dir = TempDir::new("journaled-power-cut");
    let path = dir.join("gate.db");
    let db = Journaled::open(&path).unwrap();
    let at_open = Wal::at_open(&path);
    let rig = Rig::new(db).await;
    let synced = note_synced_lengths(&rig);
    let waiting = rig.queue_issue("Add dark mode").await.ledger().unwrap();
    let approved = rig.queue_issue("Fix the login").await.ledger().unwrap();
    rig.overseer.approve(approved, "alice").await.unwrap();
    let at_send = synced.lock().unwrap()[0];

    let (mut lost, mut kept) = (0, 0);
    let copies = cuts(at_send)
        .into_iter()
        .flat_map(|keep| [(at_open, keep), (Wal::Whole, keep)]);
    for (n, (wal, keep)) in copies.enumerate() {
        let copy = cut_copy(&path, &dir.join(&format!("cut-{n}")), wal, keep);
        let after = Rig::new(Journaled::open(&copy).unwrap()).await;
        let cut = format!("{wal:?}, cut at {keep:?}");
        if after_a_cut_past_an_outcome(&after, waiting, approved, &cut).await {
            kept += 1;
        } else {
            lost += 1;
        }
    }
    assert!(lost > 0, "no cut lost the unsynced outcome");
    assert!(kept > 0, "no cut kept the written outcome");
    assert_eq!(rig.service.calls().len(), 1);
}

#[tokio::test]
async fn a_power_cut_in_a_drain_keeps_every_outcome_a_later_claim_synced() {
    const N: u64 = 5;
    let dir = TempDir::new("journaled-power-cut-drain");
    let path = dir.join("gate.db");
    let db = Journaled::open(&path).unwrap();
    let at_open = Wal::at_open(&path);
    let rig = Rig::new(db).await;
    let synced = note_synced_lengths(&rig);
    let queued = drained(&rig, N).await;
    let at_sends = synced.lock().unwrap().clone();

    // The file as of its last sync, and the journal cut just past each send's synced
    // point: every earlier action's outcome was written before that send's claim, and
    // synced with it; the one being sent is at worst unknown.
    for (k, &keep) in at_sends.iter().enumerate() {
        let copy = cut_copy(&path, &dir.join(&format!("cut-{k}")), at_open, Some(keep));
        let after = Rig::new(Journaled::open(&copy).unwrap()).await;
        after_a_cut_at_send(&after, &queued, k).await;
    }
    // The file with every commit the applier made: it may hold more than the cut journal
    // (and then the journal adds nothing). Whatever it holds, nothing sent is open, and
    // the next process sends what is open, once each.
    for (k, &keep) in at_sends.iter().enumerate() {
        let copy = cut_copy(
            &path,
            &dir.join(&format!("whole-{k}")),
            Wal::Whole,
            Some(keep),
        );
        let after = Rig::new(Journaled::open(&copy).unwrap()).await;
        let entries = after.overseer.ledger().unwrap();
        let mut open = 0;
        for (i, &id) in queued.iter().enumerate() {
            let action = entry(&entries, id).action().unwrap();
            if action.is_open() {
                assert!(i > k, "cut at send {k}: {i} was sent, and is open again");
                open += 1;
            } else {
                let _ = sent_and_settled(&entries, id);
            }
        }
        after
            .overseer
            .enable_rule("issues", after.label_kind(), "carol")
            .unwrap();
        after.overseer.settle().await;
        assert_eq!(after.service.calls().len(), open, "cut at send {k}");
    }
}

#[test]
fn a_refused_open_leaves_no_journal_behind() {
    let dir = TempDir::new("journaled-refused");
    let path = dir.join("notes.db");
    std::fs::write(&path, b"these are not the droids you are looking for").unwrap();
    let refused = Journaled::open(&path).unwrap_err();
    assert!(
        matches!(
            refused,
            StoreError::Corrupt { .. } | StoreError::Foreign { .. }
        ),
        "{refused}"
    );
    assert!(!sidecar(&path, "-redo").exists());
    assert_eq!(
        std::fs::read(&path).unwrap(),
        b"these are not the droids you are looking for"
    );
}

/// The same work on a shared file and behind a journal leaves the same rows. Behind a
/// journal, the applier folds each batch (a cycle's six records become two rows, each
/// inserted once as it last stood, when they fall in one batch, as they do here): that changes how the file is written, not
/// what it holds. `claimed_by` and `deciding_session` name process sessions, which only
/// a shared file's processes read and which differ between any two files; they are left
/// out.
#[tokio::test]
async fn the_file_behind_a_journal_holds_what_a_shared_file_holds() {
    async fn work<D: crate::support::Store>(rig: &Rig<D>) {
        for n in 0..40 {
            rig.cycle(n).await;
        }
        let rejected = rig.queue_issue("Close the wiki").await.ledger().unwrap();
        rig.queue_issue("Add dark mode").await.ledger().unwrap();
        rig.overseer.reject(rejected, "alice").await.unwrap();
        let failing = rig.queue_issue("Fix the login").await.ledger().unwrap();
        rig.service.fail_next();
        rig.overseer.approve(failing, "bob").await.unwrap_err();
        rig.overseer.settle().await;
    }
    const LEDGER: &str = "SELECT id, kind, gatekeeper, caller, created_at, description_json,
        driver_id, state, resolved_by, auto_approved, resolved_at, resolution_cause, failure,
        failure_retryable, depends_on_json, blocked_by, restart_requested, revert_by, revert_at,
        revert_refused, failure_kind FROM ledger ORDER BY id";
    const ACTIONS: &str = "SELECT gatekeeper, id, tool, args_json, state, submitted_at, claimed_at,
        retryable, error, result_json, definition FROM actions ORDER BY gatekeeper, id";
    let dir = TempDir::new("journaled-same-rows");
    let (shared, behind) = (dir.join("shared.db"), dir.join("behind.db"));
    work(&Rig::new(Database::open(&shared).unwrap()).await).await;
    work(&Rig::new(Journaled::open(&behind).unwrap()).await).await;
    let (shared, behind) = (
        Database::open(&shared).unwrap(),
        Database::open(&behind).unwrap(),
    );
    for query in [LEDGER, ACTIONS] {
        let rows = shared.query_text(query).unwrap();
        let behind = behind.query_text(query).unwrap();
        assert!(rows.len() > 40, "{query}: {} rows", rows.len());
        assert_eq!(behind.len(), rows.len(), "{query}");
        for (row, (theirs, ours)) in rows.iter().zip(&behind).enumerate() {
            assert_eq!(ours, theirs, "{query}: row {row}");
        }
    }
}

/// The duplicate check of a submission reads the file only for a driver id the copy in
/// memory may not hold: an entry in the file when it was opened, or one evicted since.
/// Both are still found.
#[tokio::test]
async fn an_action_the_copy_no_longer_holds_is_still_found_by_its_driver_id() {
    let dir = TempDir::new("journaled-find");
    let path = dir.join("gate.db");
    let db = Journaled::open(&path).unwrap();
    let ledger = db.ledger();
    let settled = |id: kernel::LedgerId| kernel::LedgerEntry {
        id,
        gatekeeper: Arc::from("issues"),
        caller: Arc::from("agent"),
        created_at: kernel::Timestamp(id.0),
        body: kernel::EntryBody::Action(kernel::ActionEntry {
            driver_id: kernel::DriverActionId(id.0 * 10),
            description: Arc::new(kernel::ActionDescription::new("Add dark mode", "")),
            state: LedgerState::Rejected,
            resolution: Some(kernel::Resolution {
                by: "alice".into(),
                auto: false,
                at: kernel::Timestamp(id.0),
                cause: None,
            }),
            failure: None,
            depends_on: Vec::new(),
            blocked_by: None,
            restart_requested: false,
            revert: None,
        }),
    };
    // More settled entries than the copy keeps: the first ones are evicted.
    for _ in 0..4200 {
        ledger.insert(&mut |id| settled(id)).unwrap();
    }
    let find = |ledger: &Arc<dyn kernel::LedgerStore>, driver: u64| {
        ledger
            .find_action("issues", kernel::DriverActionId(driver))
            .unwrap()
    };
    assert_eq!(find(&ledger, 10), Some(kernel::LedgerId(1)));
    assert_eq!(find(&ledger, 42_000), Some(kernel::LedgerId(4200)));
    assert_eq!(find(&ledger, 15), None);
    assert_eq!(find(&ledger, 42_010), None);
    drop(ledger);
    drop(db);
    // Opened again, the copy holds no settled entry; the file has them all.
    let db = Journaled::open(&path).unwrap();
    let ledger = db.ledger();
    assert_eq!(find(&ledger, 20), Some(kernel::LedgerId(2)));
    assert_eq!(find(&ledger, 42_000), Some(kernel::LedgerId(4200)));
    assert_eq!(find(&ledger, 42_010), None);
}

/// On a multi-threaded runtime (the daemon's), a caller waiting for its sync does not
/// hold its worker: the runtime runs other tasks meanwhile, whose writes share the sync.
/// With one worker, a wait that held it would leave every synced write its own sync.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn callers_waiting_for_a_sync_leave_the_runtime_to_others_who_share_it() {
    let dir = TempDir::new("journaled-workers");
    let rig = Arc::new(Rig::new(Journaled::open(dir.join("gate.db")).unwrap()).await);
    let syncs = rig.db.syncs();
    let mut tasks = tokio::task::JoinSet::new();
    for agent in 0..16 {
        let rig = rig.clone();
        tasks.spawn(async move {
            for n in 0..4 {
                rig.cycle(agent * 100 + n).await;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    assert_eq!(rig.service.calls().len(), 64);
    // Two synced writes per cycle (the stage and the claim): 128 if none shared a sync.
    let syncs = rig.db.syncs() - syncs;
    assert!(syncs < 128, "{syncs} syncs for 128 synced writes");
}

/// The agent's read of `listIssues` through the whole stack; returns its observation's id.
async fn read(rig: &Rig<Journaled>) -> kernel::LedgerId {
    match rig
        .session
        .call_tool("listIssues", serde_json::json!({}))
        .await
        .expect("read")
    {
        gatekeeper_core::CallOutcome::Data { observation, .. } => observation,
        other => panic!("a read, not {other:?}"),
    }
}

/// A sensitive observation through the kernel: it latches the workspace's lockdown.
async fn read_sensitive(rig: &Rig<Journaled>) -> kernel::LedgerId {
    rig.overseer
        .queue_for("issues", "agent")
        .unwrap()
        .authorize_observation(kernel::ObservationDescription {
            prohibit_all_sharing: true,
            ..kernel::ObservationDescription::new("read secrets", "sensitive")
        })
        .await
        .unwrap()
}

/// Issue 42: an ordinary read's observation is written to the journal but waits for no
/// sync (it rides on the next one); a sensitive one is synced before its data is handed
/// over.
#[tokio::test]
async fn an_ordinary_read_waits_for_no_sync_and_a_sensitive_one_for_its_own() {
    let dir = TempDir::new("journaled-read-syncs");
    let rig = Rig::new(Journaled::open(dir.join("gate.db")).unwrap()).await;
    rig.queue_issue("Add dark mode").await;
    let (syncs, writes) = (rig.db.syncs(), rig.db.writes());
    for _ in 0..10 {
        read(&rig).await;
    }
    assert_eq!(rig.db.syncs() - syncs, 0, "ten ordinary reads made no sync");
    assert!(
        rig.db.writes() > writes,
        "their records are written, so a process crash keeps them"
    );
    let syncs = rig.db.syncs();
    read_sensitive(&rig).await;
    assert!(rig.db.syncs() > syncs, "a sensitive read is synced");
}

/// Issue 42, both sides of the rule: a power cut right after an ordinary read (the
/// journal cut anywhere past what its last sync covered, the file at either end) may lose
/// that read's observation and nothing else; a cut right after a sensitive read never
/// loses the lockdown or its observation.
#[tokio::test]
async fn a_cut_after_a_read_loses_at_most_its_observation_and_never_a_lockdown() {
    let dir = TempDir::new("journaled-read-cut");
    let path = dir.join("gate.db");
    let db = Journaled::open(&path).unwrap();
    let at_open = Wal::at_open(&path);
    let rig = Rig::new(db).await;
    let waiting = rig.queue_issue("Add dark mode").await.ledger().unwrap();
    let observed = read(&rig).await;
    let synced = rig.db.journal_synced_len();

    let (mut lost, mut kept) = (0, 0);
    let copies = cuts(synced)
        .into_iter()
        .flat_map(|keep| [(at_open, keep), (Wal::Whole, keep)]);
    for (n, (wal, keep)) in copies.enumerate() {
        let copy = cut_copy(&path, &dir.join(&format!("ordinary-{n}")), wal, keep);
        let after = Journaled::open(&copy).unwrap();
        let entries = after.ledger().entries().unwrap();
        let cut = format!("{wal:?}, cut at {keep:?}");
        assert_eq!(
            entry(&entries, waiting).action().unwrap().state,
            LedgerState::Pending,
            "{cut}"
        );
        assert!(!after.ledger().locked_down().unwrap(), "{cut}");
        match entries.iter().find(|e| e.id == observed) {
            Some(e) => {
                assert!(e.action().is_none(), "{cut}");
                kept += 1;
            }
            None => lost += 1,
        }
        assert!(
            entries.iter().all(|e| e.id == waiting || e.id == observed),
            "{cut}: {entries:?}"
        );
    }
    assert!(lost > 0, "no cut lost the unsynced observation");
    assert!(kept > 0, "no cut kept the written observation");

    let sensitive = read_sensitive(&rig).await;
    let synced = rig.db.journal_synced_len();
    let copies = cuts(synced)
        .into_iter()
        .flat_map(|keep| [(at_open, keep), (Wal::Whole, keep)]);
    for (n, (wal, keep)) in copies.enumerate() {
        let copy = cut_copy(&path, &dir.join(&format!("sensitive-{n}")), wal, keep);
        let after = Journaled::open(&copy).unwrap();
        let cut = format!("{wal:?}, cut at {keep:?}");
        assert!(after.ledger().locked_down().unwrap(), "{cut}");
        let entries = after.ledger().entries().unwrap();
        entry(&entries, sensitive);
        entry(&entries, observed);
        assert_eq!(
            entry(&entries, waiting).action().unwrap().state,
            LedgerState::Pending,
            "{cut}"
        );
    }
}

#[tokio::test]
async fn a_rule_keeps_its_time_and_scope_through_the_journal_a_replay_and_a_reopen() {
    let dir = TempDir::new("journaled-rules");
    let path = dir.join("gate.db");
    let db = Journaled::open(&path).unwrap();
    let wal = Wal::at_open(&path);
    let expected = kernel::testkit::put_scoped_rules(&*db.ledger());
    kernel::testkit::assert_rules(&*db.ledger(), &expected);
    // A crash copy whose file lost every commit since it was opened: the replay writes
    // each rule into the file through its adapter, and the copy in memory reads them back.
    let copy = cut_copy(&path, &dir.join("crash"), wal, None);
    drop(
        Journaled::open(&copy)
            .map(|replayed| kernel::testkit::assert_rules(&*replayed.ledger(), &expected)),
    );
    kernel::testkit::assert_rules(&*Database::open(&copy).unwrap().ledger(), &expected);
    drop(db);
    drop(
        Journaled::open(&path)
            .map(|reopened| kernel::testkit::assert_rules(&*reopened.ledger(), &expected)),
    );
    kernel::testkit::assert_rules(&*Database::open(&path).unwrap().ledger(), &expected);
}

#[tokio::test]
async fn an_edit_of_a_pending_call_is_synced_kept_and_replayed_and_of_any_other_refused() {
    let dir = TempDir::new("journaled-amend");
    let path = dir.join("gate.db");
    let db = Journaled::open(&path).unwrap();
    let wal = Wal::at_open(&path);
    let storage = db.action_storage("issues").unwrap();
    // An edit of a call whose stage the file already holds: written apart, through the
    // file's adapter.
    let first = staged_id(storage.clone()).await;
    recorded(&*db.ledger(), first);
    db.flush().unwrap();
    let syncs = db.syncs();
    assert!(
        storage
            .amend_pending(first, Arc::new(edited()))
            .await
            .unwrap()
    );
    assert!(db.syncs() > syncs, "the edit is synced before it returns");
    let query = |id| format!("SELECT args_json FROM actions WHERE id = {id}");
    assert_eq!(stored_args(db.query_text(&query(first)).unwrap()), edited());
    let amended = amend_each(storage, &*db.ledger()).await;
    // Replayed after a crash, from the file's last sync (every record in one batch) and
    // from its last commit.
    for (n, wal) in [wal, Wal::Whole].into_iter().enumerate() {
        let copy = cut_copy(&path, &dir.join(&format!("crash-{n}")), wal, None);
        let replayed = Journaled::open(&copy).unwrap();
        let storage = replayed.action_storage("issues").unwrap();
        for (id, args) in [
            (first, edited()),
            (amended.pending, edited()),
            (amended.applied, json!({"n": 1})),
            (amended.rejected, json!({"n": 2})),
        ] {
            assert_eq!(
                *storage.get(id).await.unwrap().unwrap().args,
                args,
                "{wal:?}"
            );
            assert_eq!(stored_args(replayed.query_text(&query(id)).unwrap()), args);
        }
    }
    drop(db);
    let db = Database::open(&path).unwrap();
    assert_eq!(
        stored_args(db.query_text(&query(amended.pending)).unwrap()),
        edited()
    );
}

#[tokio::test]
async fn an_edit_folded_into_its_stage_is_what_is_claimed_sent_and_kept() {
    let dir = TempDir::new("journaled-amend-fold");
    let path = dir.join("gate.db");
    let db = Journaled::open(&path).unwrap();
    let wal = Wal::at_open(&path);
    let rig = Rig::new(db).await;
    let file_syncs = rig.db.file_syncs();
    let queued = rig.queue_issue("Add dark mode").await.ledger().unwrap();
    let driver = rig.db.ledger().get(queued).unwrap().unwrap();
    let driver = driver.action().unwrap().driver_id;
    let edit = json!({"title": "Add dark mode, edited"});
    assert!(
        rig.db
            .action_storage("issues")
            .unwrap()
            .amend_pending(driver, Arc::new(edit.clone()))
            .await
            .unwrap()
    );
    rig.overseer.approve(queued, "alice").await.unwrap();
    rig.overseer.settle().await;
    assert_eq!(
        rig.service.calls(),
        [("createIssue".to_owned(), edit.clone())]
    );
    assert_eq!(rig.db.file_syncs(), file_syncs, "the journal started over");
    // The copy's file lost every commit since it was opened: its replay folds the stage,
    // the edit, the claim and the outcome into one batch, and inserts the row once.
    let copy = cut_copy(&path, &dir.join("crash"), wal, None);
    let rows = |db: &dyn Fn(&str) -> Vec<Vec<Option<String>>>| {
        let args = stored_args(db("SELECT args_json FROM actions"));
        let states = db("SELECT (SELECT state FROM actions), (SELECT state FROM ledger)");
        (args, states)
    };
    let expected = (
        edit,
        vec![vec![
            Some("applied".to_owned()),
            Some("approved".to_owned()),
        ]],
    );
    let replayed = Journaled::open(&copy).unwrap();
    assert_eq!(rows(&|sql| replayed.query_text(sql).unwrap()), expected);
    drop(replayed);
    drop(rig);
    let db = Database::open(&path).unwrap();
    assert_eq!(rows(&|sql| db.query_text(sql).unwrap()), expected);
}

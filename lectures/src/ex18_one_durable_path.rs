//! ex18: one durable path, and what a power cut may take from it.
//!
//! The daemon, the CLI and this lecture keep their records the same way: one SQLite file
//! in write-ahead-log mode, and the store syncs the log itself, only where a promise needs
//! it. This lecture runs an action and two reads on such a file (in a scratch directory,
//! whatever `--db` says) and counts the syncs each step makes:
//!
//! - the agent's write is staged: one sync, so the agent is never told of an action a
//!   power cut could lose;
//! - an ordinary read: no sync and no commit of its own; its record rides with the next
//!   commit (or the store's flusher's, within 10 ms);
//! - the person approves: one sync, the claim, before anything is sent; the outcome rides
//!   with the next sync;
//! - a sensitive read: its lockdown and its record are synced before the data is handed
//!   over.
//!
//! Then it cuts copies of the file's log where a power cut could (anywhere past the last
//! sync) and opens each as the next process would: a cut right after the ordinary read
//! loses that read's record and nothing else; a cut right after the sensitive read keeps
//! the lockdown.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gatekeeper_core::{CallOutcome, Grants};
use gatekeeper_issues::{IssueTracker, IssuesConfig};
use kernel::{ActionState, LedgerEntry, LedgerId};
use serde_json::json;
use shell::{Decision, Shell};
use store_sqlite::Database;

use crate::ex08_lockdown::payroll::{PayrollGatekeeper, PayrollService};
use crate::setup::{Desk, call, paragraph};
use crate::{Context, Lecture, LectureFuture, verb};

/// The lecture.
pub const LECTURE: Lecture = Lecture {
    name: "ex18",
    title: "one durable path: what each step syncs, and what a power cut may take",
    summary: "a stage and a claim are synced, an ordinary read is not; a cut loses at most that read, never a lockdown",
    run,
};

fn run<'a>(cx: &'a mut Context<'_>) -> LectureFuture<'a> {
    Box::pin(body(cx))
}

/// A scratch directory for the lecture's file and its cut copies, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> anyhow::Result<Self> {
        let dir = crate::setup::scratch_dir("lecture-ex18")?;
        Ok(Self(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The write-ahead log beside the file at `path`.
fn log_of(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

/// How long the log is now, in bytes.
fn log_len(path: &Path) -> anyhow::Result<u64> {
    Ok(std::fs::metadata(log_of(path))?.len())
}

/// What the next process finds if the power fails while only the first `keep` bytes of
/// the log are on disk: a copy of the file with its log cut there, opened afresh.
fn after_a_cut(path: &Path, into: &Path, keep: u64) -> anyhow::Result<(Vec<LedgerEntry>, bool)> {
    std::fs::create_dir_all(into)?;
    let copy = into.join("gate.db");
    std::fs::copy(path, &copy)?;
    let log = std::fs::read(log_of(path))?;
    let keep = usize::try_from(keep)?.min(log.len());
    std::fs::write(log_of(&copy), &log[..keep])?;
    let database = Database::open(&copy)?;
    let ledger = database.ledger();
    Ok((ledger.entries()?, ledger.locked_down()?))
}

/// Whether the ledger holds entry `id`.
fn holds(entries: &[LedgerEntry], id: LedgerId) -> &'static str {
    if entries.iter().any(|e| e.id == id) {
        "kept"
    } else {
        "lost"
    }
}

async fn body(cx: &mut Context<'_>) -> anyhow::Result<()> {
    let scratch = Scratch::new()?;
    let path = scratch.0.join("gate.db");
    let (desk, database) = Desk::on_file(cx, &path)?;
    let tracker = IssueTracker::new();
    tracker.seed("Login fails on Safari", &[]);
    let issues = desk.tracker(IssuesConfig::new(), tracker.clone()).await?;
    let payroll = PayrollGatekeeper::new("payroll", Arc::new(PayrollService::default()));
    desk.overseer.register(payroll.clone())?;
    let mut grants = Grants::new();
    grants.introduce(
        "ISSUES",
        issues.grant(&desk.overseer, "agent", &["listIssues", "createIssue"])?,
    );
    let session = grants.session("ISSUES")?.clone();
    let payroll_session = payroll.grant(&desk.overseer, "agent")?;
    let alice = Shell::new(desk.overseer.clone(), "alice");
    paragraph(
        cx,
        &[
            "One SQLite file holds the ledger and the action stores, as the daemon's does. The",
            "store syncs its log itself, and only where a promise needs it; the counts below",
            "are the syncs the file made during each step.",
        ],
    )?;

    cx.section("1. The agent stages a write")?;
    let syncs = database.syncs();
    let staged = call(
        cx,
        &session,
        "createIssue",
        json!({"title": "Plan the Q3 review"}),
    )
    .await?
    .ledger()
    .ok_or_else(|| anyhow::anyhow!("createIssue is an action"))?;
    cx.evidence("syncs while staging", database.syncs() - syncs)?;
    // The stage was the last synced commit: a power cut keeps the log up to here.
    let after_stage = log_len(&path)?;

    cx.section("2. The agent reads the tracker")?;
    let (syncs, commits) = (database.syncs(), database.commits());
    let read = match call(cx, &session, "listIssues", json!({})).await? {
        CallOutcome::Data { observation, .. } => observation,
        CallOutcome::Pending { .. } => anyhow::bail!("listIssues is a read"),
    };
    cx.evidence("syncs while reading", database.syncs() - syncs)?;
    writeln!(
        cx,
        "  (the read's record waits in the open transaction; the store's flusher commits it,"
    )?;
    writeln!(cx, "  without a sync, within 10 ms)")?;
    let start = Instant::now();
    while database.commits() == commits {
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(30),
            "the flusher never committed the read's record"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let after_read = log_len(&path)?;

    cx.section("3. The power fails right after the read")?;
    let (cut, locked) = after_a_cut(&path, &scratch.0.join("cut-read"), after_stage)?;
    writeln!(
        cx,
        "  the log cut at its last sync (the stage), opened as the next process would:"
    )?;
    cx.evidence(&format!("{staged}, the staged write"), holds(&cut, staged))?;
    cx.evidence(&format!("{read}, the read's record"), holds(&cut, read))?;
    cx.evidence("entries besides", cut.len().saturating_sub(1))?;
    cx.evidence("locked down", locked)?;
    let (whole, _) = after_a_cut(&path, &scratch.0.join("cut-later"), after_read)?;
    writeln!(cx, "  the log cut after the flusher's commit instead:")?;
    cx.evidence(&format!("{read}, the read's record"), holds(&whole, read))?;

    cx.section_for(
        "4. The person approves the write",
        "4. The person decides the write (the script approves)",
    )?;
    let decision = cx.decision(&alice, staged, Decision::Approve)?;
    let syncs = database.syncs();
    let decided = alice.decide(staged, decision).await?;
    writeln!(cx, "  [alice {}]", verb(decision))?;
    writeln!(cx, "{}", decided.report)?;
    let what = match decision {
        Decision::Approve => "syncs while approving and sending (the claim)",
        _ => "syncs while deciding",
    };
    cx.evidence(what, database.syncs() - syncs)?;
    let state = desk
        .overseer
        .ledger()?
        .into_iter()
        .find(|e| e.id == staged)
        .and_then(|e| e.action().map(|a| a.state))
        .unwrap_or(ActionState::Pending);
    cx.evidence(&format!("{staged} in the ledger"), state)?;
    cx.evidence("writes that reached the tracker", tracker.writes().len())?;

    cx.section("5. The agent reads the payroll table (a sensitive read)")?;
    writeln!(cx, "  agent → payroll.read_salaries")?;
    let syncs = database.syncs();
    let (_, sensitive) = payroll_session.read_salaries().await?;
    writeln!(cx, "    data, observation {sensitive} (not shown here)")?;
    cx.evidence(
        "syncs before the data was handed over",
        database.syncs() - syncs,
    )?;
    let (cut, locked) = after_a_cut(&path, &scratch.0.join("cut-sensitive"), log_len(&path)?)?;
    writeln!(
        cx,
        "  the power fails right after; the log cut at its last sync, opened afresh:"
    )?;
    cx.evidence(
        &format!("{sensitive}, the sensitive read's record"),
        holds(&cut, sensitive),
    )?;
    cx.evidence("locked down", locked)?;

    drop(alice);
    drop(grants);
    drop(session);
    drop(issues);
    drop(desk);
    drop(database);
    drop(scratch);
    Ok(())
}

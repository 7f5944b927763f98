//! ex04: decide how pending work is shown to the agent.
//!
//! The same scripted agent ("make sure an issue 'Crash on save' exists": list, and file it
//! if it is missing) runs under three harnesses:
//!
//! - A hides pending work and lets the agent go on: its next read shows a world without its
//!   own write, so it files the issue again. The person approves both: a duplicate.
//! - B honours `await_decision`: the turn is suspended until the person decided. The next
//!   read shows the real issue.
//! - C simulates: the gatekeeper overlays the pending `createIssue` on `listIssues` as a
//!   provisional `~1`, and says the agent need not wait. The next read shows it.

use std::io::Write;

use gatekeeper_core::{CallOutcome, Grants, Session};
use gatekeeper_issues::{IssueTracker, IssuesConfig};
use kernel::{LedgerId, Overseer};
use serde_json::json;
use shell::{Decision, Scripted, Shell};

use crate::setup::{Desk, call};
use crate::{Context, Lecture, LectureFuture};

/// The lecture.
pub const LECTURE: Lecture = Lecture {
    name: "ex04",
    title: "decide how pending work is shown",
    summary: "three harnesses: A hides pending work and the agent files the same issue twice; B waits, C simulates (~1): no duplicate",
    run,
};

const TITLE: &str = "Crash on save";

fn run<'a>(cx: &'a mut Context<'_>) -> LectureFuture<'a> {
    Box::pin(body(cx))
}

/// How a harness treats an agent's pending action between turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Harness {
    /// Ignores pending work: the next turn runs at once.
    A,
    /// Suspends the agent until the person decided, when the action says `await_decision`.
    B,
    /// Lets the agent go on; the gatekeeper simulates pending `createIssue` in reads.
    C,
}

/// One step of the agent's task.
enum Step {
    /// The issue is there (or shows as provisional): nothing to do.
    Done,
    /// The agent filed it; the call is pending.
    Filed(LedgerId),
}

/// The agent: "make sure an issue titled 'Crash on save' exists".
async fn agent_turn(cx: &mut Context<'_>, session: &Session) -> anyhow::Result<Step> {
    let listing = call(cx, session, "listIssues", json!({})).await?;
    let text = listing.data().map(|d| d.text()).unwrap_or_default();
    if let Some(line) = text.lines().find(|l| l.contains(TITLE)) {
        writeln!(cx, "  agent: \"{line}\" is there; nothing to do")?;
        return Ok(Step::Done);
    }
    writeln!(cx, "  agent: no issue \"{TITLE}\" in the list; filing it")?;
    match call(cx, session, "createIssue", json!({"title": TITLE})).await? {
        CallOutcome::Pending { ledger, .. } => Ok(Step::Filed(ledger)),
        CallOutcome::Data { .. } => Ok(Step::Done),
    }
}

/// Whether the harness must suspend the turn: B, when the kernel's record of the action
/// carries the driver's `await_decision` advice.
fn must_wait(harness: Harness, overseer: &Overseer, ledger: LedgerId) -> anyhow::Result<bool> {
    if harness != Harness::B {
        return Ok(false);
    }
    let entry = overseer
        .entry(ledger)?
        .ok_or_else(|| anyhow::anyhow!("the ledger holds {ledger}"))?;
    Ok(entry.action().is_some_and(|a| a.description.await_decision))
}

/// Runs the agent twice under `harness`, with a person reviewing at the point the harness
/// allows, and returns how many issues titled [`TITLE`] the tracker ends up with and how
/// many `createIssue` calls were staged.
async fn play(cx: &mut Context<'_>, harness: Harness) -> anyhow::Result<(usize, usize)> {
    let desk = Desk::new(cx)?;
    let tracker = IssueTracker::new();
    tracker.seed("Login fails on Safari", &[]);
    let config = IssuesConfig::new().simulate(harness == Harness::C);
    let issues = desk.tracker(config, tracker.clone()).await?;
    let mut grants = Grants::new();
    grants.introduce(
        "ISSUES",
        issues.grant(&desk.overseer, "agent", &["listIssues", "createIssue"])?,
    );
    let session = grants.session("ISSUES")?;
    let alice = Shell::new(desk.overseer.clone(), "alice");
    let mut filed = Vec::new();
    let mut reviewed = false;

    for turn in 1..=2 {
        writeln!(cx, "  -- turn {turn}")?;
        if let Step::Filed(ledger) = agent_turn(cx, session).await? {
            filed.push(ledger);
            if must_wait(harness, &desk.overseer, ledger)? {
                writeln!(
                    cx,
                    "  harness: {ledger} says await_decision; the turn is suspended until a person decides"
                )?;
                let script = Scripted::by_id([(ledger, Decision::Approve)]);
                cx.review(&alice, script).await?;
                reviewed = true;
                writeln!(cx, "  harness: the person decided; the agent resumes")?;
            } else {
                writeln!(cx, "  harness: the agent goes on at once")?;
            }
        }
    }
    if !reviewed || !desk.overseer.open_actions()?.is_empty() {
        writeln!(cx, "  -- later, the person reviews the batch")?;
        let script = Scripted::by_id(filed.iter().map(|id| (*id, Decision::Approve)));
        cx.review(&alice, script).await?;
    }
    if harness == Harness::C {
        writeln!(cx, "  -- after approval, the agent reads again")?;
        call(cx, session, "listIssues", json!({})).await?;
        writeln!(
            cx,
            "  (the provisional ~1 is gone; the tracker gave the issue its own number)"
        )?;
    }
    let count = tracker.issues().iter().filter(|i| i.title == TITLE).count();
    writeln!(cx, "  the tracker now lists (read directly, as evidence):")?;
    for issue in tracker.issues() {
        writeln!(cx, "    {}", issue.line())?;
    }
    Ok((count, filed.len()))
}

async fn body(cx: &mut Context<'_>) -> anyhow::Result<()> {
    writeln!(
        cx,
        "The agent is asked twice to make sure an issue \"{TITLE}\" exists. Between its turns the"
    )?;
    writeln!(
        cx,
        "harness decides what the agent sees of the write it has already queued."
    )?;
    let mut results = Vec::new();
    for (harness, what) in [
        (Harness::A, "hides pending work"),
        (Harness::B, "waits for the decision (await_decision)"),
        (Harness::C, "simulates pending createIssue in reads"),
    ] {
        cx.section(&format!("Harness {harness:?}: {what}"))?;
        results.push((harness, play(cx, harness).await?));
    }
    cx.section("Evidence")?;
    for (harness, (count, filed)) in results {
        cx.evidence(
            &format!("harness {harness:?}: createIssue calls staged"),
            filed,
        )?;
        cx.evidence(
            &format!("harness {harness:?}: issues titled \"{TITLE}\""),
            format!("{count}{}", if count > 1 { " (duplicate)" } else { "" }),
        )?;
    }
    Ok(())
}

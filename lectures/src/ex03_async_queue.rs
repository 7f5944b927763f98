//! ex03: `submit_action` returns immediately.
//!
//! The agent's turn (one read, three actions) ends at once: only the read reached the
//! tracker. Hours later a person approves two and rejects one in a batch; only then do the
//! two writes go out, and the rejected one never reaches the tracker at all.

use std::io::Write;
use std::time::Instant;

use gatekeeper_core::{CallOutcome, Grants};
use gatekeeper_issues::{IssueTracker, IssuesConfig};
use serde_json::json;
use shell::{Decision, Scripted, Shell};

use crate::setup::{Desk, call, json, poll};
use crate::{Context, Lecture, LectureFuture};

/// The lecture.
pub const LECTURE: Lecture = Lecture {
    name: "ex03",
    title: "the approval queue answers at once",
    summary: "a turn of one read and three actions ends immediately with one service call; writes go out only after the batch review",
    run,
};

fn run<'a>(cx: &'a mut Context<'_>) -> LectureFuture<'a> {
    Box::pin(body(cx))
}

async fn body(cx: &mut Context<'_>) -> anyhow::Result<()> {
    let desk = Desk::new(cx)?;
    let tracker = IssueTracker::new();
    tracker.seed("Login fails on Safari", &[]);
    tracker.seed("Dark mode", &[]);
    let issues = desk.tracker(IssuesConfig::new(), tracker.clone()).await?;
    let mut grants = Grants::new();
    grants.introduce(
        "ISSUES",
        issues.grant(
            &desk.overseer,
            "agent",
            &["listIssues", "createIssue", "addLabel", "closeIssue"],
        )?,
    );
    let session = grants.session("ISSUES")?;

    writeln!(
        cx,
        "The agent triages: it reads the list, files one issue, labels one, closes one. No person"
    )?;
    writeln!(cx, "is at the desk.")?;

    cx.section("The agent's turn")?;
    let started = Instant::now();
    call(cx, session, "listIssues", json!({})).await?;
    let calls = [
        ("createIssue", json!({"title": "Crash on save"})),
        ("addLabel", json!({"issue": 1, "label": "bug"})),
        ("closeIssue", json!({"issue": 2})),
    ];
    let mut staged = Vec::new();
    for (tool, args) in calls {
        let outcome = call(cx, session, tool, args.clone()).await?;
        if let CallOutcome::Pending { action, ledger, .. } = outcome {
            staged.push((tool, args, action, ledger));
        }
    }
    let elapsed = started.elapsed();
    cx.turn_duration(elapsed)?;
    let calls_after_turn = tracker.calls();
    writeln!(
        cx,
        "  the tracker has received {calls_after_turn} call(s); {} action(s) wait for a person",
        desk.overseer.open_actions()?.len()
    )?;

    cx.section("Three hours later, the person reviews the batch")?;
    desk.time.advance(3 * 3600 * 1000);
    let alice = Shell::new(desk.overseer.clone(), "alice");
    let [create, label, close] = [staged[0].3, staged[1].3, staged[2].3];
    let summary = cx
        .review(
            &alice,
            Scripted::by_id([
                (create, Decision::Approve),
                (label, Decision::Reject),
                (close, Decision::Approve),
            ]),
        )
        .await?;

    cx.section("The agent picks up the outcomes")?;
    for (_, _, action, _) in &staged {
        poll(cx, session, *action).await?;
    }

    cx.section("Evidence")?;
    cx.evidence("tracker calls when the turn ended", calls_after_turn)?;
    cx.evidence("tracker calls after the review", tracker.calls())?;
    let writes: Vec<String> = tracker
        .writes()
        .iter()
        .map(|w| format!("{} {}", w.tool, json(&w.args)))
        .collect();
    cx.evidence("writes that landed", writes.join("; "))?;
    for id in &summary.rejected {
        let (tool, args, _, _) = staged
            .iter()
            .find(|s| s.3 == *id)
            .ok_or_else(|| anyhow::anyhow!("a rejected id the agent staged"))?;
        let reached = tracker
            .writes()
            .iter()
            .any(|w| w.tool == *tool && w.args == *args);
        cx.evidence(
            &format!("rejected {id} ({tool}) reached the tracker"),
            if reached { "yes" } else { "no" },
        )?;
    }
    writeln!(cx)?;
    writeln!(cx, "The ledger, as the person's terminal shows it:")?;
    writeln!(cx, "{}", alice.ledger()?)?;
    Ok(())
}

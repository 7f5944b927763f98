//! ex05: auto-approval needs two keys, and the drain keeps the order.
//!
//! Key one is the gatekeeper's: the action is non-destructive and idempotent on a vetted
//! server. Key two is the person's: a rule for the action's kind. The drain applies a
//! gatekeeper's eligible actions in id order and stops at the first one that needs a
//! person: a manual `createIssue` (#3) holds back an eligible `addLabel` (#4) until it is
//! approved. A "bring your own" server's `addLabel` never auto-applies, rule or not.

use std::io::Write;

use gatekeeper_core::{CallOutcome, Grants, ServerTrust};
use gatekeeper_issues::{IssueTracker, IssuesConfig};
use kernel::LedgerId;
use serde_json::json;
use shell::{Decision, Scripted, Shell};

use crate::setup::{Desk, call};
use crate::{Context, Lecture, LectureFuture};

/// The lecture.
pub const LECTURE: Lecture = Lecture {
    name: "ex05",
    title: "two keys, and the drain keeps the order",
    summary: "a manual createIssue (#3) holds back an eligible addLabel (#4); a byo server never auto-applies; approving #3 releases #4",
    run,
};

fn run<'a>(cx: &'a mut Context<'_>) -> LectureFuture<'a> {
    Box::pin(body(cx))
}

fn ledger_of(outcome: &CallOutcome) -> anyhow::Result<LedgerId> {
    outcome
        .ledger()
        .ok_or_else(|| anyhow::anyhow!("expected a pending action"))
}

async fn body(cx: &mut Context<'_>) -> anyhow::Result<()> {
    let desk = Desk::new(cx)?;
    let vetted_tracker = IssueTracker::new();
    vetted_tracker.seed("Login fails on Safari", &[]);
    let byo_tracker = IssueTracker::new();
    byo_tracker.seed("Login fails on Safari", &[]);
    let vetted = desk
        .tracker(
            IssuesConfig::new()
                .named("issues", "Company tracker")
                .trust(ServerTrust::Vetted),
            vetted_tracker.clone(),
        )
        .await?;
    let byo = desk
        .tracker(
            IssuesConfig::new()
                .named("team-issues", "Team tracker")
                .trust(ServerTrust::Byo),
            byo_tracker.clone(),
        )
        .await?;
    let mut grants = Grants::new();
    grants.introduce(
        "ISSUES",
        vetted.grant(&desk.overseer, "agent", &["createIssue", "addLabel"])?,
    );
    grants.introduce("TEAM", byo.grant(&desk.overseer, "agent", &["addLabel"])?);
    let company = grants.session("ISSUES")?;
    let team = grants.session("TEAM")?;
    let alice = Shell::new(desk.overseer.clone(), "alice");

    writeln!(
        cx,
        "Two trackers: \"issues\" is vetted by the administrator, \"team-issues\" was brought by a"
    )?;
    writeln!(
        cx,
        "user (byo). Both list addLabel as non-destructive and idempotent."
    )?;

    cx.section("Turn 1: the agent labels issue 1 on both trackers")?;
    let first = call(
        cx,
        company,
        "addLabel",
        json!({"issue": 1, "label": "triage"}),
    )
    .await?;
    let first_team = call(cx, team, "addLabel", json!({"issue": 1, "label": "triage"})).await?;

    cx.section_for(
        "The person allows addLabel on both trackers (all-of-kind)",
        "The person reviews the two labels (the script allows addLabel on both trackers)",
    )?;
    cx.review(
        &alice,
        Scripted::by_id([
            (ledger_of(&first)?, Decision::ApproveAllOfKind),
            (ledger_of(&first_team)?, Decision::ApproveAllOfKind),
        ]),
    )
    .await?;

    cx.section("Turn 2: the agent files an issue, then labels on both trackers")?;
    let create = call(
        cx,
        company,
        "createIssue",
        json!({"title": "Crash on save"}),
    )
    .await?;
    let label = call(
        cx,
        company,
        "addLabel",
        json!({"issue": 1, "label": "crash"}),
    )
    .await?;
    let team_label = call(cx, team, "addLabel", json!({"issue": 1, "label": "crash"})).await?;
    desk.overseer.settle().await;
    let (create, label, team_label) = (
        ledger_of(&create)?,
        ledger_of(&label)?,
        ledger_of(&team_label)?,
    );
    writeln!(cx)?;
    writeln!(cx, "What waits, after every background drain has finished:")?;
    writeln!(cx, "{}", alice.batch()?)?;
    let held_state = state_of(&desk, label)?;
    let byo_state = state_of(&desk, team_label)?;
    let calls_before = vetted_tracker.calls();

    cx.section_for(
        "The person approves the manual gate",
        "The person reviews the batch (the script approves the manual gate, #3)",
    )?;
    cx.review(
        &alice,
        Scripted::by_id([
            (ledger_of(&first_team)?, Decision::Approve),
            (create, Decision::Approve),
            (team_label, Decision::Skip),
        ]),
    )
    .await?;

    cx.section("Evidence")?;
    let rules: Vec<String> = desk
        .overseer
        .rules()?
        .iter()
        .map(|r| format!("{}:{} by {}", r.gatekeeper, r.kind.label, r.enabled_by))
        .collect();
    cx.evidence(
        "rules enabled",
        if rules.is_empty() {
            "none".to_owned()
        } else {
            rules.join(", ")
        },
    )?;
    cx.evidence(
        &format!("{label} addLabel while {create} createIssue waited"),
        &held_state,
    )?;
    cx.evidence("company tracker calls while it waited", calls_before)?;
    cx.evidence(
        &format!("{team_label} addLabel on the byo tracker, rule on"),
        &byo_state,
    )?;
    cx.evidence(
        &format!("{label} after {create} was {}", state_of(&desk, create)?),
        describe(&desk, label)?,
    )?;
    cx.evidence(
        &format!("{team_label} after the review"),
        describe(&desk, team_label)?,
    )?;
    let order: Vec<String> = vetted_tracker
        .writes()
        .iter()
        .map(|w| w.tool.clone())
        .collect();
    cx.evidence("company tracker write order", order.join(" → "))?;
    writeln!(cx)?;
    writeln!(cx, "The ledger:")?;
    writeln!(cx, "{}", alice.ledger()?)?;
    Ok(())
}

fn state_of(desk: &Desk, id: LedgerId) -> anyhow::Result<String> {
    let entry = desk
        .overseer
        .entry(id)?
        .ok_or_else(|| anyhow::anyhow!("the ledger holds {id}"))?;
    Ok(entry
        .action()
        .map(|a| a.state.to_string())
        .unwrap_or_default())
}

fn describe(desk: &Desk, id: LedgerId) -> anyhow::Result<String> {
    let entry = desk
        .overseer
        .entry(id)?
        .ok_or_else(|| anyhow::anyhow!("the ledger holds {id}"))?;
    let Some(action) = entry.action() else {
        return Ok("an observation".to_owned());
    };
    Ok(match &action.resolution {
        Some(r) if r.auto => format!("{}, automatically (rule by {})", action.state, r.by),
        Some(r) => format!("{}, by {}", action.state, r.by),
        None => action.state.to_string(),
    })
}

//! ex08: gate observations too: lockdown after reading secrets.
//!
//! Guarding actions alone is not enough: data the agent has read can leave by any action.
//! The payroll driver marks its read sensitive; once the kernel authorizes it, lockdown is
//! latched. From then on the kernel refuses every new action, even on the unrelated issue
//! tracker, and applies nothing, not even an action queued before; reads still work.

pub(crate) mod payroll;

use std::io::Write;

use gatekeeper_core::Grants;
use gatekeeper_issues::{IssueTracker, IssuesConfig};
use serde_json::json;
use shell::{Decision, Scripted, Shell};

use crate::setup::{Desk, call, visible};
use crate::{Context, Lecture, LectureFuture, verb};
use payroll::{PayrollGatekeeper, PayrollService};

/// The lecture.
pub const LECTURE: Lecture = Lecture {
    name: "ex08",
    title: "gate observations too: lockdown after secrets",
    summary: "after reading a sensitive payroll table, writing to the unrelated issue tracker is refused; reads still work",
    run,
};

fn run<'a>(cx: &'a mut Context<'_>) -> LectureFuture<'a> {
    Box::pin(body(cx))
}

async fn body(cx: &mut Context<'_>) -> anyhow::Result<()> {
    let desk = Desk::new(cx)?;
    let tracker = IssueTracker::new();
    tracker.seed("Login fails on Safari", &[]);
    let issues = desk.tracker(IssuesConfig::new(), tracker.clone()).await?;
    let payroll_service = std::sync::Arc::new(PayrollService::default());
    let payroll = PayrollGatekeeper::new("payroll", payroll_service.clone());
    desk.overseer.register(payroll.clone())?;
    let mut grants = Grants::new();
    grants.introduce(
        "ISSUES",
        issues.grant(&desk.overseer, "agent", &["listIssues", "createIssue"])?,
    );
    let tracker_session = grants.session("ISSUES")?;
    let payroll_session = payroll.grant(&desk.overseer, "agent")?;
    let alice = Shell::new(desk.overseer.clone(), "alice");

    writeln!(
        cx,
        "The agent holds the issue tracker and, for an HR question, the payroll table."
    )?;

    cx.section("Before: the agent reads and writes the tracker")?;
    call(cx, tracker_session, "listIssues", json!({})).await?;
    let queued = call(
        cx,
        tracker_session,
        "createIssue",
        json!({"title": "Plan the Q3 review"}),
    )
    .await?;
    let queued = queued
        .ledger()
        .ok_or_else(|| anyhow::anyhow!("createIssue is an action"))?;
    let locked_before = desk.overseer.is_locked_down()?;

    cx.section("The agent reads the payroll table (a sensitive read)")?;
    writeln!(cx, "  agent → payroll.read_salaries")?;
    let (table, observation) = payroll_session.read_salaries().await?;
    writeln!(
        cx,
        "    data, observation {observation}: {} rows (not shown here)",
        table.lines().count().saturating_sub(1)
    )?;
    let locked_after = desk.overseer.is_locked_down()?;

    cx.section("After: the agent tries to write to the unrelated tracker")?;
    let refused = call(
        cx,
        tracker_session,
        "createIssue",
        json!({"title": "Salary bands: Aiko 9.1M, Bruno 8.4M"}),
    )
    .await;
    let read_after = call(cx, tracker_session, "listIssues", json!({})).await;

    cx.section_for(
        "The person tries to approve the action queued before the read",
        "The person reviews the action queued before the read (the script approves it)",
    )?;
    cx.review(&alice, Scripted::by_id([(queued, Decision::Approve)]))
        .await?;
    if desk.overseer.open_actions()?.iter().any(|e| e.id == queued) {
        let decision = cx.decision(&alice, queued, Decision::Reject)?;
        if cx.is_interactive() {
            writeln!(cx, "  [alice {} {queued}]", verb(decision))?;
        } else {
            writeln!(cx, "  [alice rejects {queued} instead]")?;
        }
        writeln!(cx, "{}", alice.decide(queued, decision).await?.report)?;
    }

    cx.section("Evidence")?;
    cx.evidence("locked down before the payroll read", locked_before)?;
    cx.evidence("locked down after the payroll read", locked_after)?;
    cx.evidence(
        "createIssue after the read",
        match &refused {
            Ok(_) => "queued".to_owned(),
            Err(error) => format!("refused: {}", visible(&error.to_string())),
        },
    )?;
    cx.evidence(
        "listIssues after the read",
        if read_after.is_ok() {
            "worked"
        } else {
            "refused"
        },
    )?;
    cx.evidence("payroll reads", payroll_service.calls())?;
    cx.evidence("tracker calls (reads only)", tracker.calls())?;
    cx.evidence("writes that reached the tracker", tracker.writes().len())?;
    writeln!(cx)?;
    writeln!(cx, "The ledger:")?;
    writeln!(cx, "{}", alice.ledger()?)?;
    Ok(())
}

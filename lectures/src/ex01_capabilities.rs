//! ex01: capabilities are introduced, none by default.
//!
//! A configured server is not a capability. The agent starts with empty grants; a person
//! introduces the tracker for exactly the tools it needs; a call outside the grant is
//! refused with the list of tools the grant does allow.

use std::io::Write;

use gatekeeper_issues::{IssueTracker, IssuesConfig};
use serde_json::json;

use crate::setup::{Desk, call};
use crate::{Context, Lecture, LectureFuture};

/// The lecture.
pub const LECTURE: Lecture = Lecture {
    name: "ex01",
    title: "capabilities are introduced, none by default",
    summary: "the agent holds nothing until a person introduces the tracker; calls outside the grant are refused",
    run,
};

fn run<'a>(cx: &'a mut Context<'_>) -> LectureFuture<'a> {
    Box::pin(body(cx))
}

async fn body(cx: &mut Context<'_>) -> anyhow::Result<()> {
    let desk = Desk::new(cx)?;
    let tracker = IssueTracker::new();
    tracker.seed("Login fails on Safari", &["bug"]);
    tracker.seed("Dark mode", &[]);
    let issues = desk.tracker(IssuesConfig::new(), tracker.clone()).await?;

    writeln!(
        cx,
        "The deployment has configured one server. The kernel knows its gatekeeper, but the agent"
    )?;
    writeln!(cx, "holds no grant, so it has no way to reach it.")?;
    writeln!(
        cx,
        "  registered gatekeepers: {:?}",
        desk.overseer.gatekeeper_names()
    )?;

    cx.section("Before introduction")?;
    let mut grants = gatekeeper_core::Grants::new();
    let before = format!("{:?}", grants.names());
    writeln!(cx, "  agent's grants: {before}")?;
    writeln!(cx, "  agent → ISSUES.listIssues {{}}")?;
    let missing = match grants.session("ISSUES") {
        Ok(_) => "a session was found".to_owned(),
        Err(error) => error.to_string(),
    };
    writeln!(cx, "    refused: {missing}")?;

    cx.section("A person introduces the tracker, for listIssues only")?;
    let grant = issues.grant(&desk.overseer, "agent", &["listIssues"])?;
    grants.introduce("ISSUES", grant);
    let after = format!("{:?}", grants.names());
    writeln!(cx, "  agent's grants: {after}")?;
    let session = grants.session("ISSUES")?;
    let allowed = session.allowed_tools().join(", ");
    writeln!(cx, "  ISSUES allows: {allowed}")?;
    call(cx, session, "listIssues", json!({})).await?;
    let refused = call(
        cx,
        session,
        "createIssue",
        json!({"title": "Add a logout button"}),
    )
    .await;
    let refusal = match &refused {
        Ok(_) => "the call went through".to_owned(),
        Err(error) => error.to_string(),
    };

    cx.section("Evidence")?;
    cx.evidence("grants before introduction", &before)?;
    cx.evidence("grants after introduction", &after)?;
    cx.evidence("tools the ISSUES grant allows", &allowed)?;
    cx.evidence("call outside the grant", &refusal)?;
    cx.evidence("calls that reached the tracker", tracker.calls())?;
    cx.evidence(
        "actions queued in the kernel",
        desk.overseer.open_actions()?.len(),
    )?;
    Ok(())
}

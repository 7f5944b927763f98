//! ex02: one trust boundary classifies read vs action.
//!
//! Only `gatekeeper_core::classify` reads a tool's annotations. The table shows its verdict
//! for every tool of the tracker: `searchIssues` reads, but does not *say* so, and is an
//! action. Then the price of believing `readOnlyHint`: a lying server's `deleteIssue`
//! claims to be read-only and runs with zero approvals.

use std::io::Write;

use gatekeeper_core::{Grants, ServerTrust, classify_tool};
use gatekeeper_issues::{Catalog, IssueTracker, IssuesConfig, catalog};
use serde_json::json;

use crate::setup::{Desk, call, issue_ids, paragraph};
use crate::{Context, Lecture, LectureFuture};

/// The lecture.
pub const LECTURE: Lecture = Lecture {
    name: "ex02",
    title: "one trust boundary classifies read vs action",
    summary: "the classification table (searchIssues is an action), and a lying deleteIssue that runs with no approval",
    run,
};

fn run<'a>(cx: &'a mut Context<'_>) -> LectureFuture<'a> {
    Box::pin(body(cx))
}

async fn body(cx: &mut Context<'_>) -> anyhow::Result<()> {
    paragraph(
        cx,
        &[
            "A tool is a read only if the server says readOnlyHint: true. Anything else is an action,",
            "queued for a person. Auto-approval also needs a vetted server, destructiveHint: false and",
            "idempotentHint: true. This is decided in one place only.",
        ],
    )?;

    cx.section("The tracker's catalog, classified")?;
    let tools = catalog(Catalog::Honest);
    // Two tables, what the server declares and what classify decides, so that each fits
    // the transcript's width.
    let declared: Vec<Vec<String>> = tools
        .iter()
        .map(|tool| vec![tool.name.clone(), tool.annotations.summary()])
        .collect();
    table(cx, &["tool", "annotations (the server's word)"], &declared)?;
    writeln!(cx)?;
    let decided: Vec<Vec<String>> = tools
        .iter()
        .map(|tool| {
            let vetted = classify_tool(tool, ServerTrust::Vetted);
            let byo = classify_tool(tool, ServerTrust::Byo);
            vec![
                tool.name.clone(),
                vetted.mode().to_string(),
                vetted.classified_by().to_string(),
                yes_no(vetted.auto_approvable()).to_owned(),
                yes_no(byo.auto_approvable()).to_owned(),
            ]
        })
        .collect();
    table(
        cx,
        &["tool", "mode", "whose word", "auto (vetted)", "auto (byo)"],
        &decided,
    )?;

    cx.section("An honest tracker: searchIssues and deleteIssue are queued")?;
    let desk = Desk::new(cx)?;
    let honest = IssueTracker::new();
    honest.seed("Login fails on Safari", &["bug"]);
    let gk = desk.tracker(IssuesConfig::new(), honest.clone()).await?;
    let mut grants = Grants::new();
    grants.introduce(
        "ISSUES",
        gk.grant(&desk.overseer, "agent", &["searchIssues", "deleteIssue"])?,
    );
    let session = grants.session("ISSUES")?;
    call(cx, session, "searchIssues", json!({"query": "login"})).await?;
    call(cx, session, "deleteIssue", json!({"issue": 1})).await?;
    let honest_calls = honest.calls();

    cx.section("A lying server: deleteIssue claims readOnlyHint: true")?;
    let liar_desk = Desk::new(cx)?;
    let liar = IssueTracker::with_catalog(Catalog::Lying);
    liar.seed("Login fails on Safari", &["bug"]);
    liar.seed("Dark mode", &[]);
    let before = issue_ids(&liar);
    let liar_gk = liar_desk
        .tracker(
            IssuesConfig::new().named("liar", "Lying tracker"),
            liar.clone(),
        )
        .await?;
    let delete = liar_gk
        .classification("deleteIssue")
        .ok_or_else(|| anyhow::anyhow!("the lying catalog has deleteIssue"))?;
    writeln!(
        cx,
        "  deleteIssue is classified: mode {}, whose word {}",
        delete.mode(),
        delete.classified_by()
    )?;
    let mut liar_grants = Grants::new();
    liar_grants.introduce(
        "LIAR",
        liar_gk.grant(&liar_desk.overseer, "agent", &["listIssues", "deleteIssue"])?,
    );
    let liar_session = liar_grants.session("LIAR")?;
    call(cx, liar_session, "deleteIssue", json!({"issue": 1})).await?;
    let after = issue_ids(&liar);
    let approvals = liar_desk
        .overseer
        .ledger()?
        .iter()
        .filter(|e| e.action().is_some())
        .count();

    cx.section("Evidence")?;
    for tool in ["listIssues", "searchIssues", "addLabel"] {
        if let Some(row) = decided.iter().find(|r| r[0] == tool) {
            cx.evidence(
                tool,
                format!(
                    "{} (whose word: {}); auto-approvable on vetted: {}, on byo: {}",
                    row[1], row[2], row[3], row[4]
                ),
            )?;
        }
    }
    cx.evidence(
        "honest tracker: open actions after search + delete",
        desk.overseer.open_actions()?.len(),
    )?;
    cx.evidence("honest tracker: calls that reached it", honest_calls)?;
    cx.evidence("honest tracker: issues", issue_ids(&honest))?;
    cx.evidence("lying tracker: issues before deleteIssue", &before)?;
    cx.evidence("lying tracker: issues after deleteIssue", &after)?;
    cx.evidence("lying tracker: approvals asked for", approvals)?;
    Ok(())
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// Writes `rows` under `header` as aligned columns, ` | ` between them.
fn table(cx: &mut Context<'_>, header: &[&str], rows: &[Vec<String>]) -> std::io::Result<()> {
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .chain(std::iter::once(&header))
                .map(|r| r[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in std::iter::once(&header).chain(rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        writeln!(cx, "  {}", cells.join(" | ").trim_end())?;
    }
    Ok(())
}

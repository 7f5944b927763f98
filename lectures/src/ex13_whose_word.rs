//! ex13: the person's word weighs more than the server's.
//!
//! ex02 showed the price of believing `readOnlyHint`: a lying tracker's `deleteIssue`
//! claims to be read-only and runs with no approval. Two settings of the person's overrule
//! the server: an `untrusted` tier, on which nothing the server says is believed, so every
//! call waits for a person; and the person's own list of reads (`reads`), which makes a
//! tool a read whatever the server says, so an honest read that forgot its hint
//! (`searchIssues`) need not wait.

use std::io::Write;

use gatekeeper_core::{Grants, ServerTrust};
use gatekeeper_issues::{Catalog, IssueTracker, IssuesConfig};
use serde_json::json;

use crate::setup::{Desk, call, issue_ids, paragraph};
use crate::{Context, Lecture, LectureFuture};

/// The lecture.
pub const LECTURE: Lecture = Lecture {
    name: "ex13",
    title: "the person's word weighs more than the server's",
    summary: "a lying tracker on the untrusted tier: its deleteIssue waits; the person's reads list makes searchIssues a read",
    run,
};

fn run<'a>(cx: &'a mut Context<'_>) -> LectureFuture<'a> {
    Box::pin(body(cx))
}

async fn body(cx: &mut Context<'_>) -> anyhow::Result<()> {
    paragraph(
        cx,
        &[
            "A server's annotations are its own claims. On the byo and vetted tiers the gate believes",
            "readOnlyHint, so a liar's write runs as a read (ex02). The person can say otherwise: the",
            "untrusted tier believes nothing the server says, and the person's reads list makes the",
            "tools it names reads, whatever the server says, on any tier.",
        ],
    )?;

    cx.section("The lying tracker on the untrusted tier")?;
    let desk = Desk::new(cx)?;
    let liar = IssueTracker::with_catalog(Catalog::Lying);
    liar.seed("Login fails on Safari", &["bug"]);
    liar.seed("Dark mode", &[]);
    let before = issue_ids(&liar);
    let gk = desk
        .tracker(
            IssuesConfig::new()
                .named("liar", "Lying tracker")
                .trust(ServerTrust::Untrusted)
                .reads(["searchIssues"]),
            liar.clone(),
        )
        .await?;
    for tool in ["deleteIssue", "listIssues", "searchIssues"] {
        let verdict = gk
            .classification(tool)
            .ok_or_else(|| anyhow::anyhow!("the lying catalog has {tool}"))?;
        writeln!(
            cx,
            "  {tool} is classified: mode {}, whose word {}",
            verdict.mode(),
            verdict.classified_by()
        )?;
    }
    let mut grants = Grants::new();
    grants.introduce(
        "LIAR",
        gk.grant(
            &desk.overseer,
            "agent",
            &["deleteIssue", "listIssues", "searchIssues"],
        )?,
    );
    let session = grants.session("LIAR")?;
    call(cx, session, "deleteIssue", json!({"issue": 1})).await?;
    call(cx, session, "listIssues", json!({})).await?;
    call(cx, session, "searchIssues", json!({"query": "login"})).await?;
    let after = issue_ids(&liar);
    let waiting = desk.overseer.open_actions()?;

    cx.section("Evidence")?;
    cx.evidence("issues before the agent's calls", &before)?;
    cx.evidence("issues after them", &after)?;
    cx.evidence("calls that reached the tracker", liar.calls())?;
    cx.evidence(
        "waiting for a person",
        waiting
            .iter()
            .map(|e| e.title().to_owned())
            .collect::<Vec<_>>()
            .join("; "),
    )?;
    Ok(())
}

//! ex06: apply at most once, by writing the claim before the send.
//!
//! Four ways a write could go out twice, and what the gate does about each:
//!
//! 1. Two people approve the same action at once: one send; the second is refused.
//! 2. The reply is lost after the write landed (a timeout): the outcome is unknown, so the
//!    action fails for good and is never sent again; the tracker shows the write happened.
//! 3. The tracker refuses with 403 before anything lands: the failure is retryable, and a
//!    second approval sends it once.
//! 4. The approval is abandoned while a call is in flight (whoever awaited it went away,
//!    as when a process stops waiting): the claim is stranded, and the kernel and the
//!    action store record it as a final failure at once, without a restart. The process
//!    then restarts, and approving again sends nothing.
//!    In memory the "restart" is a new kernel and gatekeeper over the same stores. With
//!    `--db` every handle of the old process is dropped and the file is opened again, as a
//!    new process would. (A process killed outright leaves the claim `applying` on disk;
//!    opening the file settles it the same way: the crash test in store-sqlite kills real
//!    processes to show it.)

use std::io::Write;

use gatekeeper_core::{Grants, Session};
use gatekeeper_issues::{IssueTracker, IssuesConfig};
use kernel::{LedgerId, Overseer};
use serde_json::{Value, json};
use shell::{Decision, Shell};

use crate::setup::{Desk, call, poll, show_issues, visible};
use crate::{Context, Lecture, LectureFuture};

/// The lecture.
pub const LECTURE: Lecture = Lecture {
    name: "ex06",
    title: "apply at most once: claim before send",
    summary: "double approval sends once; a timeout after landing is final; a 403 is retryable; a restart never re-sends an in-flight claim",
    run,
};

fn run<'a>(cx: &'a mut Context<'_>) -> LectureFuture<'a> {
    Box::pin(body(cx))
}

/// How many writes of `tool` with `args` landed on the tracker.
fn landed(tracker: &IssueTracker, tool: &str, args: &Value) -> usize {
    tracker
        .writes()
        .iter()
        .filter(|w| w.tool == tool && w.args == *args)
        .count()
}

/// The agent stages `createIssue` with `args`; returns the driver and ledger ids.
async fn stage(
    cx: &mut Context<'_>,
    session: &Session,
    args: &Value,
) -> anyhow::Result<(kernel::DriverActionId, LedgerId)> {
    let outcome = call(cx, session, "createIssue", args.clone()).await?;
    match (outcome.action(), outcome.ledger()) {
        (Some(action), Some(ledger)) => Ok((action, ledger)),
        _ => anyhow::bail!("createIssue should have been queued"),
    }
}

async fn body(cx: &mut Context<'_>) -> anyhow::Result<()> {
    let desk = Desk::new(cx)?;
    let tracker = IssueTracker::new();
    let issues = desk.tracker(IssuesConfig::new(), tracker.clone()).await?;
    let mut grants = Grants::new();
    grants.introduce(
        "ISSUES",
        issues.grant(&desk.overseer, "agent", &["createIssue"])?,
    );
    let session = grants.session("ISSUES")?.clone();
    let alice = Shell::new(desk.overseer.clone(), "alice");
    let bob = Shell::new(desk.overseer.clone(), "bob");
    let mut evidence: Vec<(String, String)> = Vec::new();

    // 1. Double approval.
    cx.section("1. Alice and Bob approve the same action at once")?;
    let first = json!({"title": "Fix login"});
    let (_, id) = stage(cx, &session, &first).await?;
    writeln!(
        cx,
        "  (the tracker is slow today: the next call is held in flight until released)"
    )?;
    let park = tracker.park_next();
    let alice_approves = alice.decide(id, Decision::Approve);
    let bob_approves = async {
        park.wait_until_parked().await;
        let bob_said = bob.decide(id, Decision::Approve).await;
        park.release();
        bob_said
    };
    let (alice_said, bob_said) = tokio::join!(alice_approves, bob_approves);
    writeln!(cx, "  [alice approves]")?;
    writeln!(cx, "{}", alice_said?.report)?;
    writeln!(cx, "  [bob approves while alice's apply is in flight]")?;
    writeln!(cx, "{}", bob_said?.report)?;
    let again = bob.decide(id, Decision::Approve).await?;
    writeln!(cx, "  [bob approves once more, afterwards]")?;
    writeln!(cx, "{}", again.report)?;
    evidence.push((
        format!("{id}: writes of \"Fix login\" that landed after two approvals"),
        landed(&tracker, "createIssue", &first).to_string(),
    ));

    // 2. Timeout after landing.
    cx.section("2. The write lands, the reply is lost")?;
    let second = json!({"title": "Update the docs"});
    let (action, id) = stage(cx, &session, &second).await?;
    writeln!(cx, "  (the tracker will lose its next reply)")?;
    tracker.lose_next_reply();
    writeln!(cx, "  [alice approves]")?;
    writeln!(cx, "{}", alice.decide(id, Decision::Approve).await?.report)?;
    poll(cx, &session, action).await?;
    show_issues(cx, &tracker)?;
    writeln!(cx, "  [alice approves again]")?;
    writeln!(cx, "{}", alice.decide(id, Decision::Approve).await?.report)?;
    evidence.push((
        format!("{id}: state after the lost reply"),
        state_of(&desk.overseer, id)?,
    ));
    evidence.push((
        format!("{id}: writes of \"Update the docs\" that landed"),
        landed(&tracker, "createIssue", &second).to_string(),
    ));

    // 3. 403.
    cx.section("3. The tracker refuses with 403 before anything lands")?;
    let third = json!({"title": "Rotate the keys"});
    let (action, id) = stage(cx, &session, &third).await?;
    writeln!(cx, "  (the tracker will decline its next call)")?;
    tracker.decline_next();
    writeln!(cx, "  [alice approves]")?;
    writeln!(cx, "{}", alice.decide(id, Decision::Approve).await?.report)?;
    poll(cx, &session, action).await?;
    let after_403 = state_of(&desk.overseer, id)?;
    let landed_403 = landed(&tracker, "createIssue", &third);
    writeln!(cx, "{}", alice.batch()?)?;
    writeln!(cx, "  [alice approves again]")?;
    writeln!(cx, "{}", alice.decide(id, Decision::Approve).await?.report)?;
    evidence.push((format!("{id}: state after the 403"), after_403));
    evidence.push((
        format!("{id}: writes that landed after the 403"),
        landed_403.to_string(),
    ));
    evidence.push((
        format!("{id}: writes that landed after re-approval"),
        landed(&tracker, "createIssue", &third).to_string(),
    ));

    // 4. Restart over an in-flight claim.
    cx.section(
        "4. The approval is abandoned while a call is in flight, then the process restarts",
    )?;
    let fourth = json!({"title": "Migrate the database"});
    let (action, id) = stage(cx, &session, &fourth).await?;
    let park = tracker.park_next();
    let calls_before = tracker.calls();
    writeln!(
        cx,
        "  [alice approves; the tracker holds the call in flight]"
    )?;
    {
        let approve = alice.decide(id, Decision::Approve);
        tokio::pin!(approve);
        tokio::select! {
            biased;
            _ = &mut approve => anyhow::bail!("the parked call should not have returned"),
            () = park.wait_until_parked() => {}
        }
        // Leaving this block drops the apply mid-flight: nobody waits for it any more.
    }
    drop(park);
    let received = tracker.calls() - calls_before;
    let record = issues
        .store()
        .get(action)
        .await?
        .map(|r| r.state.tag().to_string())
        .unwrap_or_else(|| "missing".to_owned());
    writeln!(
        cx,
        "  the approval was abandoned after the tracker received the call ({received} call): outcome unknown; the ledger says {id} is {}; the store says: {record}",
        state_of(&desk.overseer, id)?
    )?;

    // The process is gone, and everything it held goes with it: its people's shells, the
    // agent's grants and session, its gatekeeper, and (in `Desk::restart`) its kernel and
    // its handle on the database. With --db nothing of the old process may stay open: a
    // claim whose process still holds the file counts as live and is left alone.
    drop((alice, bob, grants, session, issues));
    match desk.file() {
        None => writeln!(
            cx,
            "  restart: a new kernel over the same ledger, a new gatekeeper over the same action store"
        )?,
        Some(path) => writeln!(
            cx,
            "  restart: every handle of {} is closed; a new process opens the file again: a new kernel over its ledger, a new gatekeeper over its action store",
            visible(&path.display().to_string())
        )?,
    }
    let desk = desk.restart()?;
    if desk.file().is_some() {
        let settled = state_of(&desk.overseer, id)?;
        if settled == "pending" {
            // The abandoned apply was recorded before the restart; a pending entry means
            // the file lost that record. That would be a bug here, not a lesson.
            anyhow::bail!("the reopened file lost the record of the abandoned apply of {id}");
        }
        writeln!(
            cx,
            "  the reopened file keeps the record: the ledger says {id} is {settled}"
        )?;
    }
    let restarted = desk.tracker(IssuesConfig::new(), tracker.clone()).await?;
    let overseer = desk.overseer.clone();
    let mut grants = Grants::new();
    grants.introduce(
        "ISSUES",
        restarted.grant(&overseer, "agent", &["createIssue"])?,
    );
    let session = grants.session("ISSUES")?.clone();
    let alice = Shell::new(overseer.clone(), "alice");
    let calls_at_restart = tracker.calls();
    writeln!(cx, "{}", alice.batch()?)?;
    writeln!(
        cx,
        "  [as soon as the gate is back, alice looks {id} up: it waits for nobody, and says why]"
    )?;
    writeln!(cx, "{}", alice.prompt(id)?)?;
    writeln!(
        cx,
        "  [alice approves {id} again, in the restarted process]"
    )?;
    writeln!(cx, "{}", alice.decide(id, Decision::Approve).await?.report)?;
    poll(cx, &session, action).await?;
    evidence.push((format!("{id}: store state before the restart"), record));
    evidence.push((
        format!("{id}: calls the tracker received before the restart"),
        received.to_string(),
    ));
    evidence.push((
        format!("{id}: calls sent after the restart"),
        (tracker.calls() - calls_at_restart).to_string(),
    ));
    evidence.push((
        format!("{id}: state after approving again"),
        state_of(&overseer, id)?,
    ));

    cx.section("Evidence")?;
    for (what, value) in &evidence {
        cx.evidence(what, value)?;
    }
    cx.evidence("tracker calls in all", tracker.calls())?;
    let titles: Vec<String> = tracker
        .writes()
        .iter()
        .map(|w| w.args["title"].to_string())
        .collect();
    cx.evidence("writes that landed", titles.join(", "))?;
    writeln!(cx)?;
    writeln!(cx, "The ledger after the restart:")?;
    writeln!(cx, "{}", Shell::new(overseer, "alice").ledger()?)?;
    Ok(())
}

fn state_of(overseer: &Overseer, id: LedgerId) -> anyhow::Result<String> {
    let entry = overseer
        .entry(id)?
        .ok_or_else(|| anyhow::anyhow!("the ledger holds {id}"))?;
    Ok(entry
        .action()
        .map(|a| match (&a.state, &a.failure) {
            (kernel::ActionState::Failed, Some(f)) if f.retryable => "failed, retryable".to_owned(),
            (kernel::ActionState::Failed, _) => "failed, not retryable".to_owned(),
            (state, _) => state.to_string(),
        })
        .unwrap_or_default())
}

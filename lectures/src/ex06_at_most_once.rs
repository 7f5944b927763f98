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
use crate::{Context, Lecture, LectureFuture, verb};

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
    cx.section_for(
        "1. Alice and Bob approve the same action at once",
        "1. Alice and Bob decide the same action at once (the script: both approve)",
    )?;
    let first = json!({"title": "Fix login"});
    let (_, id) = stage(cx, &session, &first).await?;
    let alice_says = cx.decision(&alice, id, Decision::Approve)?;
    let bob_says = cx.decision(&bob, id, Decision::Approve)?;
    let (alice_said, bob_said) = if alice_says == Decision::Approve {
        writeln!(
            cx,
            "  (the tracker is slow today: the next call is held in flight until released)"
        )?;
        let park = tracker.park_next();
        let alice_decides = alice.decide(id, alice_says);
        let bob_decides = async {
            park.wait_until_parked().await;
            let bob_said = bob.decide(id, bob_says).await;
            park.release();
            bob_said
        };
        tokio::join!(alice_decides, bob_decides)
    } else {
        let alice_said = alice.decide(id, alice_says).await;
        (alice_said, bob.decide(id, bob_says).await)
    };
    writeln!(cx, "  [alice {}]", verb(alice_says))?;
    writeln!(cx, "{}", alice_said?.report)?;
    if alice_says == Decision::Approve {
        writeln!(
            cx,
            "  [bob {} while alice's apply is in flight]",
            verb(bob_says)
        )?;
    } else {
        writeln!(cx, "  [bob {}]", verb(bob_says))?;
    }
    writeln!(cx, "{}", bob_said?.report)?;
    let bob_again = cx.decision(&bob, id, Decision::Approve)?;
    let again = bob.decide(id, bob_again).await?;
    if bob_again == Decision::Approve {
        writeln!(cx, "  [bob approves once more, afterwards]")?;
    } else {
        writeln!(cx, "  [bob {}, afterwards]", verb(bob_again))?;
    }
    writeln!(cx, "{}", again.report)?;
    evidence.push((
        if (alice_says, bob_says) == (Decision::Approve, Decision::Approve) {
            format!("{id}: writes of \"Fix login\" that landed after two approvals")
        } else {
            format!(
                "{id}: writes of \"Fix login\" that landed after alice's {alice_says} and bob's {bob_says}"
            )
        },
        landed(&tracker, "createIssue", &first).to_string(),
    ));

    // 2. Timeout after landing.
    cx.section_for(
        "2. The write lands, the reply is lost",
        "2. The tracker will lose its next reply (the script approves)",
    )?;
    let second = json!({"title": "Update the docs"});
    let (action, id) = stage(cx, &session, &second).await?;
    let says = cx.decision(&alice, id, Decision::Approve)?;
    let lost = says == Decision::Approve;
    if lost {
        writeln!(cx, "  (the tracker will lose its next reply)")?;
        tracker.lose_next_reply();
    }
    writeln!(cx, "  [alice {}]", verb(says))?;
    writeln!(cx, "{}", alice.decide(id, says).await?.report)?;
    poll(cx, &session, action).await?;
    show_issues(cx, &tracker)?;
    let says = cx.decision(&alice, id, Decision::Approve)?;
    writeln!(cx, "  [alice {} again]", verb(says))?;
    writeln!(cx, "{}", alice.decide(id, says).await?.report)?;
    evidence.push((
        if lost {
            format!("{id}: state after the lost reply")
        } else {
            format!("{id}: state (no reply was lost: it was not approved first)")
        },
        state_of(&desk.overseer, id)?,
    ));
    evidence.push((
        format!("{id}: writes of \"Update the docs\" that landed"),
        landed(&tracker, "createIssue", &second).to_string(),
    ));

    // 3. 403.
    cx.section_for(
        "3. The tracker refuses with 403 before anything lands",
        "3. The tracker will refuse its next call with 403 (the script approves twice)",
    )?;
    let third = json!({"title": "Rotate the keys"});
    let (action, id) = stage(cx, &session, &third).await?;
    let says = cx.decision(&alice, id, Decision::Approve)?;
    let declined = says == Decision::Approve;
    if declined {
        writeln!(cx, "  (the tracker will decline its next call)")?;
        tracker.decline_next();
    }
    writeln!(cx, "  [alice {}]", verb(says))?;
    writeln!(cx, "{}", alice.decide(id, says).await?.report)?;
    poll(cx, &session, action).await?;
    let after_403 = state_of(&desk.overseer, id)?;
    let landed_403 = landed(&tracker, "createIssue", &third);
    writeln!(cx, "{}", alice.batch()?)?;
    let says = cx.decision(&alice, id, Decision::Approve)?;
    writeln!(cx, "  [alice {} again]", verb(says))?;
    writeln!(cx, "{}", alice.decide(id, says).await?.report)?;
    let (after, again) = if declined {
        ("after the 403", "after re-approval")
    } else {
        (
            "after the first answer (no 403: nothing was sent)",
            "after the second answer",
        )
    };
    evidence.push((format!("{id}: state {after}"), after_403));
    evidence.push((
        format!("{id}: writes that landed {after}"),
        landed_403.to_string(),
    ));
    evidence.push((
        format!(
            "{id}: writes that landed {}",
            if says == Decision::Approve {
                again
            } else {
                "at the end"
            }
        ),
        landed(&tracker, "createIssue", &third).to_string(),
    ));

    // 4. Restart over an in-flight claim.
    cx.section_for(
        "4. The approval is abandoned while a call is in flight, then the process restarts",
        "4. An approval abandoned while its call is in flight, then a restart (the script approves)",
    )?;
    let fourth = json!({"title": "Migrate the database"});
    let (action, id) = stage(cx, &session, &fourth).await?;
    let says = cx.decision(&alice, id, Decision::Approve)?;
    let abandoned = says == Decision::Approve;
    let calls_before = tracker.calls();
    if abandoned {
        let park = tracker.park_next();
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
    } else {
        writeln!(cx, "  [alice {}]", verb(says))?;
        writeln!(cx, "{}", alice.decide(id, says).await?.report)?;
    }
    let received = tracker.calls() - calls_before;
    let record = issues
        .store()
        .get(action)
        .await?
        .map(|r| r.state.tag().to_string())
        .unwrap_or_else(|| "missing".to_owned());
    if abandoned {
        writeln!(
            cx,
            "  the approval was abandoned after the tracker received the call ({received} call): outcome unknown; the ledger says {id} is {}; the store says: {record}",
            state_of(&desk.overseer, id)?
        )?;
    }

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
        if abandoned && settled == "pending" {
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
    writeln!(cx, "  [as soon as the gate is back, alice looks {id} up]")?;
    writeln!(cx, "{}", alice.prompt(id)?)?;
    let says = cx.decision(&alice, id, Decision::Approve)?;
    writeln!(
        cx,
        "  [alice {} {id} again, in the restarted process]",
        verb(says)
    )?;
    writeln!(cx, "{}", alice.decide(id, says).await?.report)?;
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
        if says == Decision::Approve {
            format!("{id}: state after approving again")
        } else {
            format!("{id}: state at the end")
        },
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

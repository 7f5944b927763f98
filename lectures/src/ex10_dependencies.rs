//! ex10: dependencies: what becomes of the actions built on one a person rejects.
//!
//! The reference's review cases (d) and (e), run under the reference's policy and under ours. (d) The
//! agent stages a page, a child under it, a grandchild under that and an append to the
//! grandchild; ana rejects the page. Both drivers drop all four, but the reference does
//! not tell the kernel about the three it took along: they stay pending there as
//! orphans, and approving one fails with "unknown action". Ours reports them, and the
//! kernel's ledger marks them rejected, "cascaded from #1". (e) The agent renames a page,
//! reads the pending title back and comments quoting it; ana rejects the rename. The
//! reference flags nothing, so the comment would quote a title that never existed. Ours
//! remembered that the agent's read showed the rename: the comment depends on it, and
//! the kernel flags it as depending on a rejected action. It is held for a person, not
//! thrown away: she may still approve it.

use std::io::Write;

use gatekeeper_confluence::{Lab, Policy};
use kernel::LedgerId;
use shell::{Decision, Scripted};

use crate::ex09_approval_gap::{
    Row, Scene, action_state, agent_appends, blocked_by, both, comments_in_wiki, created, heading,
    page_evidence, read_body, rename_then_quote, review, review_step, side_by_side,
};
use crate::setup::{paragraph, visible};
use crate::{Context, Lecture, LectureFuture};

/// The lecture.
pub const LECTURE: Lecture = Lecture {
    name: "ex10",
    title: "dependencies: rejecting an action the agent built on",
    summary: "d: rejecting a parent page leaves 3 orphans pending (reference) or marks them cascaded (ours); e: a comment quoting a rejected title is flagged only by ours",
    run,
};

fn run<'a>(cx: &'a mut Context<'_>) -> LectureFuture<'a> {
    Box::pin(body(cx))
}

async fn body(cx: &mut Context<'_>) -> anyhow::Result<()> {
    paragraph(
        cx,
        &[
            "The agent keeps working while its writes wait: reads show its pending actions as if",
            "applied, so it builds on them. What happens to that work when ana rejects the action",
            "it was built on? Each case runs under the reference's policy (Policy::REFERENCE) and",
            "under ours (Policy::GUARDED).",
        ],
    )?;

    let mut rows = Vec::new();
    let (reference, ours) = both!(cx, d);
    rows.push(Row::new(
        "d  after rejecting the page: the other three in the kernel's ledger",
        reference.states,
        ours.states,
    ));
    rows.push(Row::new(
        "d  actions still waiting for a person",
        reference.open,
        ours.open,
    ));
    rows.push(Row::new(
        "d  approving the child page afterwards",
        reference.approve,
        ours.approve,
    ));
    rows.push(Row::new("d  wiki writes", reference.writes, ours.writes));
    let (reference, ours) = both!(cx, e);
    rows.push(Row::new(
        "e  the comment, after the rename was rejected",
        reference.comment,
        ours.comment,
    ));
    rows.push(Row::new(
        "e  page 100 after ana's second look",
        reference.page,
        ours.page,
    ));
    side_by_side(cx, &rows)?;
    Ok(())
}

/// What one run of d showed.
struct Cascade {
    states: String,
    open: String,
    approve: String,
    writes: String,
}

fn ids(list: &[LedgerId]) -> String {
    if list.is_empty() {
        return "none".to_owned();
    }
    list.iter()
        .map(LedgerId::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The kernel's state of each action, with the cause the kernel recorded if any.
fn states(lab: &Lab, list: &[LedgerId]) -> anyhow::Result<String> {
    let mut out = Vec::new();
    for id in list {
        let entry = lab.entry(*id)?;
        let cause = entry
            .action()
            .and_then(|a| a.resolution.as_ref())
            .and_then(|r| r.cause.clone())
            .map(|c| format!(" ({})", visible(&c)))
            .unwrap_or_default();
        out.push(format!("{id} {}{cause}", action_state(lab, *id)?));
    }
    Ok(out.join(", "))
}

async fn d(cx: &mut Context<'_>, policy: Policy) -> anyhow::Result<Cascade> {
    heading(
        cx,
        "d · a page, its child, its grandchild, an append",
        policy,
    )?;
    let Scene { lab, agent, shell } = Scene::new(cx, policy)?;
    let (page, page_id) = created(
        cx,
        &agent,
        r#"create_page("OPS", "Release", "")"#,
        agent.create_page("OPS", "Release", "").await,
    )?;
    let (child, child_id) = created(
        cx,
        &agent,
        &format!(r#"create_child_page({page}, "Rollback", "")"#),
        agent.create_child_page(&page, "Rollback", "").await,
    )?;
    let (grandchild, grandchild_id) = created(
        cx,
        &agent,
        &format!(r#"create_child_page({child}, "Checklist", "step 1")"#),
        agent.create_child_page(&child, "Checklist", "step 1").await,
    )?;
    let append_id = agent_appends(cx, &agent, &grandchild, "step 2").await?;
    read_body(cx, &agent, &grandchild).await?;
    cx.evidence("wiki writes", lab.service.writes())?;
    let took_along = [child_id, grandchild_id, append_id];

    review_step(
        cx,
        &lab,
        &shell,
        Some(&format!(
            "ana rejects the page {page_id}; the others she leaves for now."
        )),
        Scripted::by_id([(page_id, Decision::Reject)]),
    )
    .await?;
    let states_now = states(&lab, &took_along)?;
    cx.evidence("the other three in the kernel's ledger", &states_now)?;
    cx.evidence("actions the driver still holds", lab.wiki.pending_count())?;
    let open = lab.open_ids()?;
    cx.evidence("actions waiting for a person", ids(&open))?;

    writeln!(cx)?;
    cx.narrate(&format!(
        "ana comes back to approve the child page {child_id}:"
    ))?;
    let before = lab
        .overseer
        .entry(child_id)?
        .and_then(|e| e.action().map(|a| a.is_open()));
    let approve = if before == Some(true) {
        review(
            cx,
            &lab,
            &shell,
            Scripted::by_id([(child_id, Decision::Approve)]),
        )
        .await?;
        let entry = lab.entry(child_id)?;
        let failure = entry
            .action()
            .and_then(|a| a.failure.as_ref())
            .map(|f| visible(&f.message));
        match failure {
            Some(message) => {
                let head = message.split(':').next().unwrap_or_default().to_owned();
                format!("fails: {head}")
            }
            None => action_state(&lab, child_id)?,
        }
    } else {
        writeln!(cx, "{}", shell.batch()?)?;
        format!("nothing to approve: {child_id} is no longer waiting")
    };
    writeln!(cx)?;
    let writes = lab.service.writes();
    cx.evidence("wiki writes", writes)?;
    writeln!(cx)?;
    writeln!(cx, "The kernel's ledger:")?;
    writeln!(cx, "{}", shell.ledger()?)?;
    Ok(Cascade {
        states: states_now,
        open: ids(&open),
        approve,
        writes: writes.to_string(),
    })
}

/// What one run of e showed.
struct Flag {
    comment: String,
    page: String,
}

async fn e(cx: &mut Context<'_>, policy: Policy) -> anyhow::Result<Flag> {
    heading(
        cx,
        "e · a comment quoting a title that is then rejected",
        policy,
    )?;
    let (Scene { lab, agent, shell }, page) =
        Scene::manual(cx, policy, "Draft", "procedure").await?;
    let (rename, comment) = rename_then_quote(cx, &agent, &page).await?;
    let depends = lab
        .entry(comment)?
        .action()
        .map(|a| a.depends_on.clone())
        .unwrap_or_default();
    cx.evidence(
        &format!("{comment} depends on (kernel's ledger)"),
        ids(&depends),
    )?;

    let plan = format!(
        "ana rejects the rename {rename}: the page keeps its title. The comment she leaves for now."
    );
    review_step(
        cx,
        &lab,
        &shell,
        Some(&plan),
        Scripted::by_id([(rename, Decision::Reject)]),
    )
    .await?;
    let flagged = blocked_by(&lab, comment)?;
    let state = action_state(&lab, comment)?;
    cx.evidence(&format!("{comment} in the kernel's ledger"), &state)?;
    cx.evidence(
        &format!("{comment} flagged as depending on a rejected action"),
        flagged.map_or("no".to_owned(), |root| format!("yes, blocked by {root}")),
    )?;
    let open = lab.open_ids()?.contains(&comment);
    cx.evidence(
        &format!("{comment} still waits for a person, who may approve it"),
        if open { "yes" } else { "no" },
    )?;
    let comment_now = match flagged {
        Some(root) => format!("{state}, blocked by rejected {root}; a person may still approve it"),
        None => format!("{state}, nothing flagged"),
    };

    writeln!(cx)?;
    cx.narrate(&format!(
        "ana takes a second look at {comment} and decides on what the shell shows her: with no"
    ))?;
    cx.narrate(
        "sign of trouble she approves it; told it depends on the rejected rename, she rejects it.",
    )?;
    let decision = if flagged.is_some() {
        Decision::Reject
    } else {
        Decision::Approve
    };
    review(cx, &lab, &shell, Scripted::by_id([(comment, decision)])).await?;
    writeln!(cx)?;
    let wiki_page = lab
        .service
        .page(100)
        .ok_or_else(|| anyhow::anyhow!("page 100 exists"))?;
    cx.evidence("page 100's title in the wiki", visible(&wiki_page.title))?;
    let comments = comments_in_wiki(&lab, 100)?;
    cx.evidence("page 100's comments in the wiki", &comments)?;
    page_evidence(cx, &lab, 100)?;
    cx.evidence("wiki writes", lab.service.writes())?;
    Ok(Flag {
        comment: comment_now,
        page: format!(
            "title \"{}\", comments: {comments}",
            visible(&wiki_page.title)
        ),
    })
}

//! ex11: order and revert: the page should end as the agent was shown it, and undoing
//! one action should undo only that action.
//!
//! The reference's review cases (f), (g) and (h), run under the reference's policy and under ours.
//! (f1) A replace then an append: the simulation shows both. Approved in reverse order,
//! the reference ends with only the replacement; ours refuses the append with "apply #1
//! first", and the page ends as simulated. (f2) An append then a replace, approved in id
//! order: only the replacement, as simulated, under both. (g) A child page approved
//! before its parent fails under both ("content ~1 has not been created yet") and
//! nothing is created on the side; parent then child gives ids 200 and 201. (h1) Revert
//! of an append restores the page under both. (h2) After bob, another person, appends
//! to the page, the reference's revert writes back its snapshot and wipes his edit; ours
//! removes exactly the appended block and keeps it.

use std::io::Write;

use gatekeeper_confluence::{Edit, Lab, Policy};
use kernel::LedgerId;
use shell::{Decision, Scripted};

use crate::ex09_approval_gap::{
    Row, Scene, action_state, agent_appends, agent_replaces, ana_approves, both, created,
    heading_for, human_edit, page_evidence, read, read_body, revert, review_step, short,
    side_by_side, told,
};
use crate::setup::{paragraph, visible};
use crate::{Context, Lecture, LectureFuture};

/// The lecture.
pub const LECTURE: Lecture = Lecture {
    name: "ex11",
    title: "order and revert: the page ends as simulated, revert undoes only its own",
    summary: "f: approvals out of order lose an append (reference) or are refused, \"apply #1 first\" (ours); g: a child before its parent fails; h: revert wipes a later human edit (reference) or keeps it (ours)",
    run,
};

fn run<'a>(cx: &'a mut Context<'_>) -> LectureFuture<'a> {
    Box::pin(body(cx))
}

async fn body(cx: &mut Context<'_>) -> anyhow::Result<()> {
    paragraph(
        cx,
        &[
            "Reads fold the agent's pending actions in id order, so the agent is shown the page as it",
            "will be once everything is approved in that order. People approve in any order, and may",
            "revert an action after others edited the page. Each case runs under the reference's",
            "policy (Policy::REFERENCE) and under ours (Policy::GUARDED).",
        ],
    )?;

    let mut rows = Vec::new();
    let (reference, ours) = both!(cx, f1);
    rows.push(Row::new(
        "f1 the agent was shown",
        reference.simulated,
        ours.simulated,
    ));
    rows.push(Row::new(
        told(
            cx,
            "f1 approving the append first",
            "f1 the append, after ana's first review",
        ),
        reference.first,
        ours.first,
    ));
    rows.push(Row::new(
        "f1 page 100 in the end",
        reference.page,
        ours.page,
    ));
    let (reference, ours) = both!(cx, f2);
    rows.push(Row::new(
        "f2 the agent was shown",
        reference.simulated,
        ours.simulated,
    ));
    rows.push(Row::new(
        "f2 page 100 in the end",
        reference.page,
        ours.page,
    ));
    let (reference, ours) = both!(cx, g);
    rows.push(Row::new(
        told(
            cx,
            "g  approving the child first",
            "g  the child, after ana's first review",
        ),
        reference.first,
        ours.first,
    ));
    rows.push(Row::new(
        told(
            cx,
            "g  then parent, then child",
            "g  parent and child, after ana's second review",
        ),
        reference.page,
        ours.page,
    ));
    let h1 = told(
        cx,
        "h1 page 100 after reverting the append",
        "h1 what ana's decisions did, and page 100 after them",
    );
    rows.push(Row::pair(h1, both!(cx, h, false)));
    let h2 = told(
        cx,
        "h2 page 100 after reverting the append, bob's edit made in between",
        "h2 what ana's decisions did, and page 100 after them, bob's edit made in between",
    );
    rows.push(Row::pair(h2, both!(cx, h, true)));
    side_by_side(cx, &rows)?;
    Ok(())
}

/// What one run of f showed.
struct Order {
    simulated: String,
    first: String,
    page: String,
}

/// The first part of an action's last failure, or its state: `failed, retryable: ...`.
fn outcome(lab: &Lab, id: LedgerId) -> anyhow::Result<String> {
    let entry = lab.entry(id)?;
    let state = action_state(lab, id)?;
    Ok(match entry.action().and_then(|a| a.failure.as_ref()) {
        Some(failure) => format!("{state}: {}", visible(&failure.message)),
        None => state,
    })
}

fn one_line(text: &str) -> String {
    visible(&text.replace("\n\n", " ¶ "))
}

async fn f1(cx: &mut Context<'_>, policy: Policy) -> anyhow::Result<Order> {
    heading_for(
        cx,
        "f1 · replace then append, approved in reverse order",
        "f1 · replace then append, for ana to decide (the script: approved in reverse order)",
        policy,
    )?;
    let (Scene { lab, agent, shell }, page) =
        Scene::manual(cx, policy, "Manual", "old procedure").await?;
    let replace = agent_replaces(cx, &agent, &page, "new procedure").await?;
    let append = agent_appends(cx, &agent, &page, "safety notes").await?;
    let simulated = read_body(cx, &agent, &page).await?;

    review_step(
        cx,
        &lab,
        &shell,
        Some(&format!(
            "ana approves the append {append} first and leaves the replace {replace} for later:"
        )),
        Scripted::by_id([(replace, Decision::Skip), (append, Decision::Approve)]),
    )
    .await?;
    page_evidence(cx, &lab, 100)?;
    let first = outcome(&lab, append)?;
    cx.evidence(&format!("{append} in the kernel's ledger"), &first)?;

    review_step(
        cx,
        &lab,
        &shell,
        Some("ana approves whatever still waits, in the order the shell asks:"),
        Scripted::by_id([(replace, Decision::Approve), (append, Decision::Approve)]),
    )
    .await?;
    let page_now = page_evidence(cx, &lab, 100)?;
    cx.evidence("wiki writes", lab.service.writes())?;
    Ok(Order {
        simulated: one_line(&simulated),
        first: short(&first),
        page: page_now,
    })
}

async fn f2(cx: &mut Context<'_>, policy: Policy) -> anyhow::Result<Order> {
    heading_for(
        cx,
        "f2 · append then replace, approved in id order",
        "f2 · append then replace, for ana to decide (the script: approved in id order)",
        policy,
    )?;
    let (Scene { lab, agent, shell }, page) =
        Scene::manual(cx, policy, "Manual", "old procedure").await?;
    let append = agent_appends(cx, &agent, &page, "safety notes").await?;
    let replace = agent_replaces(cx, &agent, &page, "new procedure").await?;
    let simulated = read_body(cx, &agent, &page).await?;
    review_step(
        cx,
        &lab,
        &shell,
        None,
        Scripted::by_id([(append, Decision::Approve), (replace, Decision::Approve)]),
    )
    .await?;
    let page_now = page_evidence(cx, &lab, 100)?;
    cx.evidence("wiki writes", lab.service.writes())?;
    Ok(Order {
        simulated: one_line(&simulated),
        first: String::new(),
        page: page_now,
    })
}

async fn g(cx: &mut Context<'_>, policy: Policy) -> anyhow::Result<Order> {
    heading_for(
        cx,
        "g · a child page approved before its parent",
        "g · a child page and its parent, for ana to decide (the script: the child first)",
        policy,
    )?;
    let Scene { lab, agent, shell } = Scene::new(cx, policy)?;
    let (parent, parent_id) = created(
        cx,
        &agent,
        r#"create_page("OPS", "Parent", "")"#,
        agent.create_page("OPS", "Parent", "").await,
    )?;
    let (child, child_id) = created(
        cx,
        &agent,
        &format!(r#"create_child_page({parent}, "Child", "")"#),
        agent.create_child_page(&parent, "Child", "").await,
    )?;

    review_step(
        cx,
        &lab,
        &shell,
        Some(&format!(
            "ana approves the child {child_id} first and leaves the parent {parent_id} for later:"
        )),
        Scripted::by_id([(parent_id, Decision::Skip), (child_id, Decision::Approve)]),
    )
    .await?;
    let first = outcome(&lab, child_id)?;
    cx.evidence(&format!("{child_id} in the kernel's ledger"), &first)?;
    cx.evidence("wiki writes", lab.service.writes())?;
    cx.evidence(
        "page 200 in the wiki",
        if lab.service.page(200).is_some() {
            "exists"
        } else {
            "none: no parent was created on the side"
        },
    )?;

    review_step(
        cx,
        &lab,
        &shell,
        Some("ana approves the parent, then the child:"),
        Scripted::by_id([
            (parent_id, Decision::Approve),
            (child_id, Decision::Approve),
        ]),
    )
    .await?;
    let view = read(cx, &agent, &child).await?;
    let parent_now = agent.gatekeeper().resolve(parent);
    cx.evidence(&format!("{parent} resolves to"), parent_now)?;
    cx.evidence(&format!("{child} resolves to"), view.id)?;
    let wiki_child = view
        .id
        .real()
        .and_then(|id| lab.service.page(id))
        .map(|p| {
            format!(
                "page {} \"{}\", parent {}",
                p.id,
                visible(&p.title),
                p.parent.map_or("none".to_owned(), |id| id.to_string())
            )
        })
        .unwrap_or_else(|| "(not created)".to_owned());
    cx.evidence("the child in the wiki", &wiki_child)?;
    cx.evidence("wiki writes", lab.service.writes())?;
    Ok(Order {
        simulated: String::new(),
        first: short(&first),
        page: format!("{parent} → {parent_now}, {child} → {}", view.id),
    })
}

async fn h(cx: &mut Context<'_>, policy: Policy, human_in_between: bool) -> anyhow::Result<String> {
    let (case, asked) = if human_in_between {
        (
            "h2 · revert an append after bob appended too",
            "h2 · an append for ana to approve, then revert after bob appended too (the script does both)",
        )
    } else {
        (
            "h1 · revert an append",
            "h1 · an append for ana to approve, then revert (the script does both)",
        )
    };
    heading_for(cx, case, asked, policy)?;
    let (Scene { lab, agent, shell }, page) = Scene::manual(cx, policy, "Manual", "old").await?;
    read_body(cx, &agent, &page).await?;
    let append = agent_appends(cx, &agent, &page, "new").await?;
    ana_approves(cx, &lab, &shell, append).await?;
    page_evidence(cx, &lab, 100)?;
    if human_in_between {
        human_edit(cx, &lab, "bob", 100, Edit::AppendBody("human".into()))?;
        page_evidence(cx, &lab, 100)?;
    }

    writeln!(cx)?;
    let reverted = revert(cx, &lab, &shell, append).await?;
    let page_now = page_evidence(cx, &lab, 100)?;
    cx.evidence(
        &format!("{append} in the kernel's ledger"),
        action_state(&lab, append)?,
    )?;
    cx.evidence("wiki writes", lab.service.writes())?;
    Ok(if cx.is_interactive() {
        format!("{reverted}; page 100: {page_now}")
    } else {
        page_now
    })
}

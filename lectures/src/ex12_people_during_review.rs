//! ex12: people act during review: the three guarantees when others edit, trash and decide
//! out of order while the agent's work waits.
//!
//! Issue 14's hazards, each run under the reference's policy and under ours. (i) Bob edits
//! page 100 between the agent's read and its staging of a replace: the reference erases
//! his edit; ours stages the replace against the version the agent read and refuses it.
//! (t) Bob trashes the page while an append waits: the reference's apply brings the page
//! back from the trash; ours refuses and leaves it there. (o) Ana approves a comment that
//! quotes a pending rename before deciding the rename, then rejects the rename: the
//! reference publishes a comment quoting a title that never existed; ours refuses the
//! early approval ("approve or reject #1 first") and flags the comment when the rename is
//! rejected, although the agent never read the rename back (it staged it itself). (s) An
//! append stacked on a replace, bob edits, the replace fails as stale: ours holds the
//! append and refuses it, since it would land on text the agent never saw. (r) Reverts
//! after people acted: of an append on a page bob trashed, of a create bob has since
//! edited, and of a rename a pending comment quotes: the reference restores the page, trashes
//! bob's work and flags nothing; ours refuses the first two and flags the comment.

use std::io::Write;

use gatekeeper_confluence::{Edit, Lab, Policy};
use kernel::LedgerId;
use shell::{Decision, Scripted, Shell};

use crate::ex09_approval_gap::{
    Row, Scene, action_state, agent_appends, agent_renames, agent_replaces, ana_approves,
    blocked_by, both, comments_in_wiki, created, heading, heading_for, human_edit, page_evidence,
    read, read_body, rename_then_quote, revert, review_step, short, side_by_side, staged, told,
};
use crate::setup::{paragraph, visible};
use crate::{Context, Lecture, LectureFuture};

/// The lecture.
pub const LECTURE: Lecture = Lecture {
    name: "ex12",
    title: "people act during review: edits, trashes and decisions out of order",
    summary: "i: an edit between the agent's read and its staging; t: a page trashed while an edit waits; o: a dependent approved first; s: an append stacked on a replace that fails; r: reverts after people acted",
    run,
};

fn run<'a>(cx: &'a mut Context<'_>) -> LectureFuture<'a> {
    Box::pin(body(cx))
}

async fn body(cx: &mut Context<'_>) -> anyhow::Result<()> {
    paragraph(
        cx,
        &[
            "The agent's writes wait for ana, and the world does not: bob, another person, edits",
            "and trashes pages in the wiki's own editor, and ana decides in whatever order she",
            "likes. Each case runs under the reference's policy (Policy::REFERENCE) and under",
            "ours (Policy::GUARDED); every refusal and flag of ours is printed where it happens.",
        ],
    )?;

    let mut rows = Vec::new();
    let label = told(
        cx,
        "i  page 100 after ana approved the replace built on version 1",
        "i  page 100 after ana decided the replace built on version 1",
    );
    rows.push(Row::pair(label, both!(cx, i)));
    let label = told(
        cx,
        "t  page 100 after ana approved the append bob's trash overtook",
        "t  page 100 after ana decided the append bob's trash overtook",
    );
    rows.push(Row::pair(label, both!(cx, t)));
    let (reference, ours) = both!(cx, o);
    rows.push(Row::new(
        told(
            cx,
            "o  approving the comment while the rename waits",
            "o  the comment, after ana's first review",
        ),
        reference.early,
        ours.early,
    ));
    rows.push(Row::new(
        told(
            cx,
            "o  the comment, once the rename was rejected",
            "o  the comment, after ana's second review",
        ),
        reference.after,
        ours.after,
    ));
    rows.push(Row::new(
        "o  page 101's comments in the end",
        reference.comments,
        ours.comments,
    ));
    let (reference, ours) = both!(cx, s);
    rows.push(Row::new(
        "s  the append stacked on the replace",
        reference.append,
        ours.append,
    ));
    rows.push(Row::new(
        "s  page 100 in the end",
        reference.page,
        ours.page,
    ));
    let label = told(
        cx,
        "r1 page 100 after reverting the append, bob having trashed it",
        "r1 what ana's decisions did, and page 100 after them, bob having trashed it",
    );
    rows.push(Row::pair(label, both!(cx, r1)));
    let label = told(
        cx,
        "r2 page 200 after reverting its create, bob having added a step",
        "r2 what ana's decisions did, and page 200 after them (bob adds a step if it exists)",
    );
    rows.push(Row::pair(label, both!(cx, r2)));
    let label = told(
        cx,
        "r3 reverting the rename a pending comment quotes",
        "r3 what ana's decisions did to the rename a pending comment quotes",
    );
    rows.push(Row::pair(label, both!(cx, r3)));
    side_by_side(cx, &rows)?;
    Ok(())
}

/// Page `id` as the wiki holds it now, with its status, as evidence; returns the text.
fn status_evidence(cx: &mut Context<'_>, lab: &Lab, id: u64) -> anyhow::Result<String> {
    let text = match lab.service.page(id) {
        Some(page) => format!(
            "{}, version {}, {}",
            page.status.as_str(),
            page.version,
            visible(&page.body)
        ),
        None => "(no such page)".to_owned(),
    };
    cx.evidence(&format!("page {id} in the wiki"), &text)?;
    Ok(text)
}

/// Ana asks the kernel to revert `id` (see [`revert`]); prints and returns what happened,
/// then shows `id` in the kernel's ledger.
async fn revert_shown(
    cx: &mut Context<'_>,
    lab: &Lab,
    shell: &Shell,
    id: LedgerId,
) -> anyhow::Result<String> {
    let outcome = revert(cx, lab, shell, id).await?;
    cx.evidence(
        &format!("{id} in the kernel's ledger"),
        action_state(lab, id)?,
    )?;
    Ok(outcome)
}

/// The failure the kernel recorded for `id`, shortened, or its state.
fn outcome(lab: &Lab, id: LedgerId) -> anyhow::Result<String> {
    let entry = lab.entry(id)?;
    let failure = entry.action().and_then(|a| a.failure.as_ref());
    Ok(match failure {
        Some(failure) => format!("{}: {}", action_state(lab, id)?, short(&failure.message)),
        None => action_state(lab, id)?,
    })
}

async fn i(cx: &mut Context<'_>, policy: Policy) -> anyhow::Result<String> {
    heading(
        cx,
        "i · bob edits between the agent's read and its staging",
        policy,
    )?;
    let (Scene { lab, agent, shell }, page) =
        Scene::manual(cx, policy, "Manual", "original").await?;
    read(cx, &agent, &page).await?;
    human_edit(
        cx,
        &lab,
        "bob",
        100,
        Edit::ReplaceBody("bob's procedure".into()),
    )?;
    writeln!(
        cx,
        "The agent, still working from what it read at version 1, replaces the body:"
    )?;
    let replace = agent_replaces(cx, &agent, &page, "agent procedure").await?;
    ana_approves(cx, &lab, &shell, replace).await?;
    cx.evidence("wiki writes", lab.service.writes())?;
    page_evidence(cx, &lab, 100)
}

async fn t(cx: &mut Context<'_>, policy: Policy) -> anyhow::Result<String> {
    heading(cx, "t · bob trashes the page while an append waits", policy)?;
    let (Scene { lab, agent, shell }, page) =
        Scene::manual(cx, policy, "Manual", "original").await?;
    read_body(cx, &agent, &page).await?;
    let append = agent_appends(cx, &agent, &page, "agent note").await?;
    human_edit(cx, &lab, "bob", 100, Edit::Trash)?;
    ana_approves(cx, &lab, &shell, append).await?;
    cx.evidence("wiki writes", lab.service.writes())?;
    status_evidence(cx, &lab, 100)
}

/// What one run of o showed.
struct OutOfOrder {
    early: String,
    after: String,
    comments: String,
}

async fn o(cx: &mut Context<'_>, policy: Policy) -> anyhow::Result<OutOfOrder> {
    heading_for(
        cx,
        "o · a comment quoting a pending rename, decided before the rename",
        "o · a comment quoting a pending rename, for ana to decide (the script: the comment first)",
        policy,
    )?;
    let (Scene { lab, agent, shell }, page) =
        Scene::manual(cx, policy, "Draft", "procedure").await?;
    lab.service.seed_page_with_id(101, "OPS", "News", "");
    let news = agent.open("101").await?;
    let rename = agent_renames(cx, &agent, &page, "Publishable").await?;
    writeln!(
        cx,
        "Without reading page 100 again, the agent announces the new title on page 101:"
    )?;
    let text = "\"Publishable\" is ready";
    let comment = staged(
        cx,
        &format!("add_comment(101, {text:?})"),
        agent.add_comment(&news, text).await,
    )?;
    let depends: Vec<String> = lab
        .entry(comment)?
        .action()
        .map(|a| a.depends_on.iter().map(LedgerId::to_string).collect())
        .unwrap_or_default();
    cx.evidence(
        &format!("{comment} depends on (kernel's ledger)"),
        if depends.is_empty() {
            "nothing".to_owned()
        } else {
            depends.join(", ")
        },
    )?;

    review_step(
        cx,
        &lab,
        &shell,
        Some(&format!(
            "ana approves the comment {comment} first and leaves the rename {rename} for later:"
        )),
        Scripted::by_id([(rename, Decision::Skip), (comment, Decision::Approve)]),
    )
    .await?;
    let early = outcome(&lab, comment)?;
    cx.evidence(&format!("{comment} in the kernel's ledger"), &early)?;

    review_step(
        cx,
        &lab,
        &shell,
        Some(&format!(
            "ana rejects the rename {rename}; the page keeps its title."
        )),
        Scripted::by_id([(rename, Decision::Reject), (comment, Decision::Skip)]),
    )
    .await?;
    let blocked = blocked_by(&lab, comment)?;
    let state = action_state(&lab, comment)?;
    let after = match blocked {
        Some(root) => format!("{state}, blocked by {}", blocker(&lab, root)?),
        None => format!("{state}, nothing flagged"),
    };
    cx.evidence(&format!("{comment} in the kernel's ledger"), &after)?;
    if lab.open_ids()?.contains(&comment) {
        let plan = format!(
            "ana takes a second look at {comment}: told it depends on the rejected rename, she rejects it."
        );
        review_step(
            cx,
            &lab,
            &shell,
            Some(&plan),
            Scripted::by_id([(comment, Decision::Reject)]),
        )
        .await?;
    }
    let comments = comments_in_wiki(&lab, 101)?;
    cx.evidence("page 101's comments in the wiki", &comments)?;
    let title = lab
        .service
        .page(100)
        .map(|p| visible(&p.title))
        .unwrap_or_default();
    cx.evidence("page 100's title in the wiki", &title)?;
    Ok(OutOfOrder {
        early,
        after,
        comments: format!("{comments} (page 100 is titled \"{title}\")"),
    })
}

/// What one run of s showed.
struct Stacked {
    append: String,
    page: String,
}

async fn s(cx: &mut Context<'_>, policy: Policy) -> anyhow::Result<Stacked> {
    heading_for(
        cx,
        "s · an append stacked on a replace; bob edits before the replace is approved",
        "s · an append stacked on a replace; bob edits before ana decides the replace",
        policy,
    )?;
    let (Scene { lab, agent, shell }, page) =
        Scene::manual(cx, policy, "Manual", "original").await?;
    read_body(cx, &agent, &page).await?;
    let replace = agent_replaces(cx, &agent, &page, "new procedure").await?;
    let append = agent_appends(cx, &agent, &page, "safety notes").await?;
    read_body(cx, &agent, &page).await?;
    human_edit(
        cx,
        &lab,
        "bob",
        100,
        Edit::ReplaceBody("bob's procedure".into()),
    )?;
    review_step(
        cx,
        &lab,
        &shell,
        Some("ana approves both, in id order:"),
        Scripted::by_id([(replace, Decision::Approve), (append, Decision::Approve)]),
    )
    .await?;
    let append_now = outcome(&lab, append)?;
    cx.evidence(&format!("{append} in the kernel's ledger"), &append_now)?;
    cx.evidence("wiki writes", lab.service.writes())?;
    let page_now = page_evidence(cx, &lab, 100)?;
    Ok(Stacked {
        append: append_now,
        page: page_now,
    })
}

async fn r1(cx: &mut Context<'_>, policy: Policy) -> anyhow::Result<String> {
    heading_for(
        cx,
        "r1 · revert an append after bob trashed the page",
        "r1 · an append for ana to approve, then revert after bob trashed the page (the script does both)",
        policy,
    )?;
    let (Scene { lab, agent, shell }, page) =
        Scene::manual(cx, policy, "Manual", "original").await?;
    read_body(cx, &agent, &page).await?;
    let append = agent_appends(cx, &agent, &page, "agent note").await?;
    ana_approves(cx, &lab, &shell, append).await?;
    human_edit(cx, &lab, "bob", 100, Edit::Trash)?;
    let reverted = revert_shown(cx, &lab, &shell, append).await?;
    let page_now = status_evidence(cx, &lab, 100)?;
    Ok(with_outcome(cx, &reverted, 100, page_now))
}

/// A case's result for the closing comparison: the page as it is (`page_now`), after what
/// the revert did (`reverted`) in an interactive run, where the person may not have
/// reverted at all.
fn with_outcome(cx: &Context<'_>, reverted: &str, id: u64, page_now: String) -> String {
    if cx.is_interactive() {
        format!("{reverted}; page {id}: {page_now}")
    } else {
        page_now
    }
}

/// `id` and why it blocks others, from its state in the kernel's ledger: `rejected #1`,
/// `reverted #1`.
fn blocker(lab: &Lab, id: LedgerId) -> anyhow::Result<String> {
    let state = lab
        .entry(id)?
        .action()
        .map(|a| a.state.to_string())
        .ok_or_else(|| anyhow::anyhow!("{id} is an action"))?;
    Ok(format!("{state} {id}"))
}

async fn r2(cx: &mut Context<'_>, policy: Policy) -> anyhow::Result<String> {
    heading_for(
        cx,
        "r2 · revert a create after bob edited the new page",
        "r2 · a create for ana to approve, then revert after bob edited the new page (the script does both)",
        policy,
    )?;
    let Scene { lab, agent, shell } = Scene::new(cx, policy)?;
    let (_, create) = created(
        cx,
        &agent,
        r#"create_page("OPS", "Runbook", "step 1")"#,
        agent.create_page("OPS", "Runbook", "step 1").await,
    )?;
    ana_approves(cx, &lab, &shell, create).await?;
    if lab.service.page(200).is_some() {
        human_edit(cx, &lab, "bob", 200, Edit::AppendBody("step 2".into()))?;
    } else {
        writeln!(
            cx,
            "[bob would add a step to page 200, but the wiki has no page 200: {create} was not applied]"
        )?;
    }
    let reverted = revert_shown(cx, &lab, &shell, create).await?;
    let page_now = status_evidence(cx, &lab, 200)?;
    Ok(with_outcome(cx, &reverted, 200, page_now))
}

async fn r3(cx: &mut Context<'_>, policy: Policy) -> anyhow::Result<String> {
    heading_for(
        cx,
        "r3 · revert a rename that a pending comment quotes",
        "r3 · a rename a pending comment quotes, for ana to approve, then revert (the script does both)",
        policy,
    )?;
    let (Scene { lab, agent, shell }, page) =
        Scene::manual(cx, policy, "Draft", "procedure").await?;
    let (rename, comment) = rename_then_quote(cx, &agent, &page).await?;
    review_step(
        cx,
        &lab,
        &shell,
        Some(&format!(
            "ana approves the rename {rename}; the comment {comment} she leaves for later."
        )),
        Scripted::by_id([(rename, Decision::Approve), (comment, Decision::Skip)]),
    )
    .await?;
    let outcome = revert_shown(cx, &lab, &shell, rename).await?;
    let blocked = blocked_by(&lab, comment)?;
    cx.evidence(
        &format!("{comment} in the kernel's ledger"),
        match blocked {
            Some(root) => format!(
                "{}, blocked by {}",
                action_state(&lab, comment)?,
                blocker(&lab, root)?
            ),
            None => format!("{}, nothing flagged", action_state(&lab, comment)?),
        },
    )?;
    Ok(outcome)
}

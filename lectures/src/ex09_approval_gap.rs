//! ex09: the approval gap: what a wiki edit approved after someone else's edit does.
//!
//! The reference's review cases (b) and (c), run twice each, under the reference's policy and under
//! ours. The agent stages a change to page 100; while it waits for ana, bob (another
//! person, outside the gate) edits the page in the wiki's own editor. (b1) A replace
//! approved afterwards silently erases bob's edit under the reference; ours remembers the
//! version it was staged against and refuses, naming both versions. (b2) An append keeps
//! bob's edit under both. (c) An edit landing between the driver's read and its write is
//! a 409 under both, and nothing is written; approving again overwrites the edit under
//! the reference and is refused as stale under ours.
//!
//! This module also holds the small helpers the wiki lectures (ex09 to ex12)
//! share: how an agent's wiki calls, other people's edits, the wiki's state and the
//! side-by-side summary are printed.

use std::io::Write;
use std::sync::Arc;

use gatekeeper_confluence::{
    ContentHandle, Edit, Lab, PageView, Policy, Staged, WikiError, WikiSession,
};
use kernel::{ActionState, LedgerId};
use shell::{Decision, ReviewSummary, Scripted, Shell};

use crate::setup::{paragraph, visible, visible_lines};
use crate::{Context, Lecture, LectureFuture};

/// The lecture.
pub const LECTURE: Lecture = Lecture {
    name: "ex09",
    title: "the approval gap: an edit made while the agent's change waits",
    summary: "b1: a replace approved after a human edit erases it (reference) or is refused as stale (ours); b2: an append keeps it; c: a 409 between read and write, then approving again",
    run,
};

fn run<'a>(cx: &'a mut Context<'_>) -> LectureFuture<'a> {
    Box::pin(body(cx))
}

async fn body(cx: &mut Context<'_>) -> anyhow::Result<()> {
    paragraph(
        cx,
        &[
            "The wiki holds page 100, \"Manual\", at version 1. The agent stages a change to it; the",
            "change waits for ana at the shell. Meanwhile bob, another person, edits the page in the",
            "wiki's own editor: he is outside the gate, as people are. Each case runs twice, under",
            "the reference's policy (Policy::REFERENCE) and under ours (Policy::GUARDED).",
        ],
    )?;

    let mut rows = Vec::new();
    let (reference, ours) = both!(cx, b1);
    rows.push(Row::new(
        "b1 replace approved after bob's edit: page 100",
        reference.page,
        ours.page,
    ));
    rows.push(Row::new(
        "b1 the replace, in the kernel's ledger",
        reference.state,
        ours.state,
    ));
    let (reference, ours) = both!(cx, b2);
    rows.push(Row::new(
        "b2 append approved after bob's edit: page 100",
        reference.page,
        ours.page,
    ));
    let (reference, ours) = both!(cx, c);
    rows.push(Row::new(
        "c  first approval (bob's edit between read and write)",
        reference.first,
        ours.first,
    ));
    rows.push(Row::new(
        "c  approving again: page 100",
        reference.page,
        ours.page,
    ));
    side_by_side(cx, &rows)?;
    Ok(())
}

/// What one run of b1 or b2 left behind.
struct Ending {
    page: String,
    state: String,
}

/// The agent's write in b1 and b2, and bob's edit of the same kind.
#[derive(Clone, Copy)]
enum AgentWrite {
    /// b1: the agent replaces the body; bob replaced it first.
    Replace,
    /// b2: the agent appends; bob appended first.
    Append,
}

async fn b1(cx: &mut Context<'_>, policy: Policy) -> anyhow::Result<Ending> {
    approved_after_bobs_edit(cx, policy, AgentWrite::Replace).await
}

async fn b2(cx: &mut Context<'_>, policy: Policy) -> anyhow::Result<Ending> {
    approved_after_bobs_edit(cx, policy, AgentWrite::Append).await
}

/// b1 and b2: the agent stages `write`, bob edits the page the same way, ana approves.
async fn approved_after_bobs_edit(
    cx: &mut Context<'_>,
    policy: Policy,
    write: AgentWrite,
) -> anyhow::Result<Ending> {
    let title = match write {
        AgentWrite::Replace => "b1 · a replace approved after bob's edit",
        AgentWrite::Append => "b2 · an append approved after bob's edit",
    };
    heading(cx, title, policy)?;
    let (Scene { lab, agent, shell }, page) =
        Scene::manual(cx, policy, "Manual", "original").await?;
    read(cx, &agent, &page).await?;
    let (id, edit) = match write {
        AgentWrite::Replace => (
            agent_replaces(cx, &agent, &page, "agent body").await?,
            Edit::ReplaceBody("human edit".into()),
        ),
        AgentWrite::Append => (
            agent_appends(cx, &agent, &page, "agent proposal").await?,
            Edit::AppendBody("human edit".into()),
        ),
    };
    human_edit(cx, &lab, "bob", 100, edit)?;
    review(cx, &lab, &shell, Scripted::by_id([(id, Decision::Approve)])).await?;
    writeln!(cx)?;
    let page_now = page_evidence(cx, &lab, 100)?;
    cx.evidence("wiki writes", lab.service.writes())?;
    let state = action_state(&lab, id)?;
    cx.evidence(&format!("{id} in the kernel's ledger"), &state)?;
    if let AgentWrite::Replace = write {
        writeln!(cx)?;
        writeln!(cx, "The agent reads the page again:")?;
        read(cx, &agent, &page).await?;
    }
    Ok(Ending {
        page: page_now,
        state,
    })
}

/// What one run of c showed.
struct Conflict {
    first: String,
    page: String,
}

async fn c(cx: &mut Context<'_>, policy: Policy) -> anyhow::Result<Conflict> {
    heading(
        cx,
        "c · bob's edit lands between the driver's read and its write",
        policy,
    )?;
    let (Scene { lab, agent, shell }, page) =
        Scene::manual(cx, policy, "Manual", "original").await?;
    read(cx, &agent, &page).await?;
    let replace = agent_replaces(cx, &agent, &page, "agent body").await?;
    lab.service
        .edit_after_next_get(100, Edit::AppendBody("concurrent".into()));
    writeln!(
        cx,
        "[bob, another person, saves an append of \"concurrent\" to page 100 the moment after the"
    )?;
    writeln!(
        cx,
        " driver's next read of it: the wiki is told to let his edit land in that window]"
    )?;
    review(
        cx,
        &lab,
        &shell,
        Scripted::by_id([(replace, Decision::Approve)]),
    )
    .await?;
    writeln!(cx)?;
    page_evidence(cx, &lab, 100)?;
    let writes = lab.service.writes();
    cx.evidence("wiki writes", writes)?;
    let state = action_state(&lab, replace)?;
    cx.evidence(&format!("{replace} in the kernel's ledger"), &state)?;
    let open = lab.open_ids()?.contains(&replace);
    cx.evidence(&format!("{replace} still waits for a person"), yes_no(open))?;
    if let Some(entry) = lab.overseer.entry(replace)?
        && let Some(action) = entry.action()
        && let Some(record) = lab.wiki.record(action.driver_id)
    {
        cx.evidence(
            &format!("the driver's record of {replace}"),
            format!("{:?}", record.state).to_lowercase(),
        )?;
    }
    let first = format!("{state}, {writes} writes");

    review_step(
        cx,
        &lab,
        &shell,
        Some(&format!(
            "ana approves {replace} again, as the shell offered:"
        )),
        Scripted::by_id([(replace, Decision::Approve)]),
    )
    .await?;
    let page_now = page_evidence(cx, &lab, 100)?;
    cx.evidence("wiki writes", lab.service.writes())?;
    cx.evidence(
        &format!("{replace} in the kernel's ledger"),
        action_state(&lab, replace)?,
    )?;
    Ok(Conflict {
        first,
        page: page_now,
    })
}

// ----- shared by the wiki lectures (ex09 to ex12) -----

/// "reference" or "ours": how the transcript names a policy.
pub(crate) fn side(policy: Policy) -> &'static str {
    if policy == Policy::REFERENCE {
        "reference"
    } else if policy == Policy::GUARDED {
        "ours"
    } else {
        "custom"
    }
}

/// A section heading naming the case and the policy it runs under.
pub(crate) fn heading(cx: &mut Context<'_>, case: &str, policy: Policy) -> std::io::Result<()> {
    cx.section(&format!("{case} · {}", side(policy)))
}

/// A section heading naming the case and its policy: `scripted` says what the script's
/// person does, `interactive` what the person at the terminal is asked (see
/// [`Context::section_for`]).
pub(crate) fn heading_for(
    cx: &mut Context<'_>,
    scripted: &str,
    interactive: &str,
    policy: Policy,
) -> std::io::Result<()> {
    let side = side(policy);
    cx.section_for(
        &format!("{scripted} · {side}"),
        &format!("{interactive} · {side}"),
    )
}

/// `scripted` in a scripted run, `interactive` when a person answers: for the labels of
/// the closing comparison, which must not claim a decision the person did not take.
pub(crate) fn told<'t>(cx: &Context<'_>, scripted: &'t str, interactive: &'t str) -> &'t str {
    if cx.is_interactive() {
        interactive
    } else {
        scripted
    }
}

/// A lab under `policy`: in memory, or with `--db` over the plan's next file (its kernel
/// ledger and the wiki driver's records; the wiki itself, outside the OS, stays in memory).
fn wiki_lab(cx: &mut Context<'_>, policy: Policy) -> anyhow::Result<Lab> {
    let Some(plan) = cx.db_mut() else {
        return Ok(Lab::new(policy));
    };
    let (path, database) = plan.open_next()?;
    writeln!(
        cx,
        "  [--db: this desk's ledger, rules and action stores live in {}]",
        visible(&path.display().to_string())
    )?;
    // A ledger kept in a file records real time (see `LectureClock`).
    Ok(Lab::over_with_clock(
        policy,
        database.ledger(),
        database.kv(gatekeeper_confluence::lab::GATEKEEPER_NAME),
        Arc::new(kernel::SystemClock),
    )?)
}

/// Who is on stage in one case: the wiring, the agent's session and ana at the shell.
pub(crate) struct Scene {
    /// The kernel, the wiki and its gatekeeper.
    pub(crate) lab: Lab,
    /// The agent's session.
    pub(crate) agent: WikiSession,
    /// Ana, the person at the shell.
    pub(crate) shell: Shell,
}

impl Scene {
    /// A fresh lab under `policy` (see [`wiki_lab`]), the agent and ana.
    pub(crate) fn new(cx: &mut Context<'_>, policy: Policy) -> anyhow::Result<Self> {
        let lab = wiki_lab(cx, policy)?;
        let agent = lab.session("agent");
        let shell = Shell::new(lab.overseer.clone(), "ana");
        Ok(Self { lab, agent, shell })
    }

    /// A scene whose wiki holds page 100 in space OPS, at version 1, as if it had always
    /// been there, and the agent's handle on it.
    pub(crate) async fn manual(
        cx: &mut Context<'_>,
        policy: Policy,
        title: &str,
        body: &str,
    ) -> anyhow::Result<(Self, ContentHandle)> {
        let scene = Self::new(cx, policy)?;
        scene.lab.service.seed_page_with_id(100, "OPS", title, body);
        let page = scene.agent.open("100").await?;
        Ok((scene, page))
    }
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// Writes `text` after `lead`, continuing lines aligned under the first.
fn indented(cx: &mut Context<'_>, lead: &str, text: &str) -> std::io::Result<()> {
    let text = visible_lines(text);
    if text.is_empty() {
        return writeln!(cx, "{lead}(empty)");
    }
    let pad = " ".repeat(lead.chars().count());
    for (n, line) in text.lines().enumerate() {
        if n == 0 {
            writeln!(cx, "{lead}{line}")?;
        } else if line.is_empty() {
            writeln!(cx)?;
        } else {
            writeln!(cx, "{pad}{line}")?;
        }
    }
    Ok(())
}

/// Prints a page as the agent was shown it.
fn show_view(cx: &mut Context<'_>, view: &PageView) -> std::io::Result<()> {
    let parent = view
        .parent
        .map(|p| format!(", parent {p}"))
        .unwrap_or_default();
    let pending = match view.pending_changes {
        0 => String::new(),
        n => format!(", includes {n} pending change(s)"),
    };
    writeln!(
        cx,
        "    {} {}, title \"{}\", version {}{parent}{pending}",
        view.kind.as_str(),
        view.id,
        visible(&view.title),
        view.version,
    )?;
    indented(cx, "    body: ", &view.body)?;
    for comment in &view.comments {
        let by = comment.author.as_deref().unwrap_or("pending");
        writeln!(
            cx,
            "    comment {} ({}): {}",
            visible(&comment.id),
            visible(by),
            visible(&comment.text)
        )?;
    }
    Ok(())
}

/// The agent reads the whole page through its session; what it was shown is printed.
pub(crate) async fn read(
    cx: &mut Context<'_>,
    agent: &WikiSession,
    page: &ContentHandle,
) -> anyhow::Result<PageView> {
    writeln!(cx, "  agent → read({page})")?;
    match agent.read(page).await {
        Ok(view) => {
            show_view(cx, &view)?;
            Ok(view)
        }
        Err(error) => refused(cx, error),
    }
}

/// The agent reads only the body; what it was shown is printed.
pub(crate) async fn read_body(
    cx: &mut Context<'_>,
    agent: &WikiSession,
    page: &ContentHandle,
) -> anyhow::Result<String> {
    writeln!(cx, "  agent → body({page})")?;
    match agent.body(page).await {
        Ok(body) => {
            indented(cx, "    ", &body)?;
            Ok(body)
        }
        Err(error) => refused(cx, error),
    }
}

/// Prints a call the agent made (`what`) and the receipt of the action it staged.
pub(crate) fn staged(
    cx: &mut Context<'_>,
    what: &str,
    result: Result<Staged, WikiError>,
) -> anyhow::Result<LedgerId> {
    writeln!(cx, "  agent → {}", visible(what))?;
    match result {
        Ok(staged) => {
            writeln!(
                cx,
                "    pending as {}: nothing is sent until a person approves",
                staged.ledger
            )?;
            Ok(staged.ledger)
        }
        Err(error) => refused(cx, error),
    }
}

/// The agent replaces `page`'s body with `text`; printed as [`staged`] prints it.
pub(crate) async fn agent_replaces(
    cx: &mut Context<'_>,
    agent: &WikiSession,
    page: &ContentHandle,
    text: &str,
) -> anyhow::Result<LedgerId> {
    let what = format!("set_content({page}, {text:?})");
    staged(cx, &what, agent.set_content(page, text).await)
}

/// The agent appends `text` to `page`; printed as [`staged`] prints it.
pub(crate) async fn agent_appends(
    cx: &mut Context<'_>,
    agent: &WikiSession,
    page: &ContentHandle,
    text: &str,
) -> anyhow::Result<LedgerId> {
    let what = format!("append_content({page}, {text:?})");
    staged(cx, &what, agent.append_content(page, text).await)
}

/// The agent retitles `page` `title`; printed as [`staged`] prints it.
pub(crate) async fn agent_renames(
    cx: &mut Context<'_>,
    agent: &WikiSession,
    page: &ContentHandle,
    title: &str,
) -> anyhow::Result<LedgerId> {
    let what = format!("set_title({page}, {title:?})");
    staged(cx, &what, agent.set_title(page, title).await)
}

/// Prints the driver's refusal of an agent's call, and passes it on.
fn refused<T>(cx: &mut Context<'_>, error: WikiError) -> anyhow::Result<T> {
    writeln!(cx, "    refused: {}", visible(&error.to_string()))?;
    Err(error.into())
}

/// Prints a create the agent staged (`what`): the handle it works with at once, and the
/// ledger id the person decides on.
pub(crate) fn created(
    cx: &mut Context<'_>,
    agent: &WikiSession,
    what: &str,
    result: Result<ContentHandle, WikiError>,
) -> anyhow::Result<(ContentHandle, LedgerId)> {
    writeln!(cx, "  agent → {}", visible(what))?;
    match result {
        Ok(handle) => {
            let ledger = agent
                .last_staged()
                .ok_or_else(|| anyhow::anyhow!("a staged create leaves a receipt"))?
                .ledger;
            writeln!(
                cx,
                "    pending as {ledger}: the agent already works with it as {handle}"
            )?;
            Ok((handle, ledger))
        }
        Err(error) => refused(cx, error),
    }
}

/// Another person edits the page in the wiki's own editor, outside the gate.
pub(crate) fn human_edit(
    cx: &mut Context<'_>,
    lab: &Lab,
    who: &str,
    id: u64,
    edit: Edit,
) -> anyhow::Result<()> {
    let what = match &edit {
        Edit::ReplaceBody(text) => format!("replaces the body with \"{}\"", visible(text)),
        Edit::AppendBody(text) => format!("appends \"{}\"", visible(text)),
        Edit::SetTitle(text) => format!("renames it \"{}\"", visible(text)),
        Edit::Trash => "moves it to the trash".to_owned(),
        Edit::Restore => "restores it from the trash".to_owned(),
    };
    let version = lab.service.human_edit(id, edit)?;
    writeln!(
        cx,
        "[{who}, another person, edits page {id} in the wiki's own editor, outside the gate:"
    )?;
    writeln!(cx, " {what}; the page is now at version {version}]")?;
    Ok(())
}

/// Prints page `id` as the wiki holds it now (read directly, as evidence) and returns
/// the same text: `version 3, <p>agent body</p>`.
pub(crate) fn page_evidence(cx: &mut Context<'_>, lab: &Lab, id: u64) -> anyhow::Result<String> {
    let text = match lab.service.page(id) {
        Some(page) => format!("version {}, {}", page.version, visible(&page.body)),
        None => "(no such page)".to_owned(),
    };
    cx.evidence(&format!("page {id} in the wiki"), &text)?;
    Ok(text)
}

/// The person at `shell` reviews what waits, with `script` (or, in interactive mode, at
/// the terminal). When an action failed for good while the wiki counted no write, says
/// so, with the write counter as the evidence: a final failure is not necessarily one
/// that reached the service.
pub(crate) async fn review(
    cx: &mut Context<'_>,
    lab: &Lab,
    shell: &Shell,
    script: Scripted,
) -> anyhow::Result<ReviewSummary> {
    let writes = lab.service.writes();
    let summary = cx.review(shell, script).await?;
    if lab.service.writes() == writes {
        for id in &summary.failed {
            if action_state(lab, *id)?.ends_with("final") {
                writeln!(
                    cx,
                    "  note: {id} failed for good, yet the wiki counted no write during this review: nothing reached it"
                )?;
            }
        }
    }
    Ok(summary)
}

/// One review step of the script: a blank line, what ana sets out to do (`plan`, if
/// any), her review with `script` (see [`review`]), and a blank line.
pub(crate) async fn review_step(
    cx: &mut Context<'_>,
    lab: &Lab,
    shell: &Shell,
    plan: Option<&str>,
    script: Scripted,
) -> anyhow::Result<ReviewSummary> {
    writeln!(cx)?;
    if let Some(plan) = plan {
        cx.narrate(plan)?;
    }
    let summary = review(cx, lab, shell, script).await?;
    writeln!(cx)?;
    Ok(summary)
}

/// One review step (see [`review_step`]) in which ana approves `id`, with no plan said.
pub(crate) async fn ana_approves(
    cx: &mut Context<'_>,
    lab: &Lab,
    shell: &Shell,
    id: LedgerId,
) -> anyhow::Result<ReviewSummary> {
    review_step(
        cx,
        lab,
        shell,
        None,
        Scripted::by_id([(id, Decision::Approve)]),
    )
    .await
}

/// The person at `shell` asks the kernel to revert `id`; prints what happened, with the
/// actions the kernel flagged because they depended on it, and returns it in short.
///
/// In an interactive run the person is asked first ([`Context::revert_decision`]), and
/// not at all when `id` was never applied (then nothing is reverted, and the transcript
/// says why).
pub(crate) async fn revert(
    cx: &mut Context<'_>,
    lab: &Lab,
    shell: &Shell,
    id: LedgerId,
) -> anyhow::Result<String> {
    let person = shell.person();
    if cx.is_interactive() {
        let state = lab
            .entry(id)?
            .action()
            .map(|a| a.state)
            .ok_or_else(|| anyhow::anyhow!("{id} is an action"))?;
        if state != ActionState::Approved {
            writeln!(
                cx,
                "[{person} is not asked to revert {id}: it is {state}, never applied, so there is nothing to revert]"
            )?;
            return Ok(format!("not reverted: {id} is {state}, never applied"));
        }
        if !cx.revert_decision(shell, id, true)? {
            writeln!(cx, "  [{person} keeps {id}: nothing is reverted]")?;
            return Ok(format!("not reverted: {person} kept {id}"));
        }
    }
    writeln!(
        cx,
        "[{person} asks the kernel to revert {id} (Overseer::revert)]"
    )?;
    Ok(match lab.overseer.revert(id, person).await {
        Ok(report) if report.reverted => {
            writeln!(cx, "  reverted {id}")?;
            let flagged: Vec<String> = report.flagged.iter().map(LedgerId::to_string).collect();
            if flagged.is_empty() {
                "reverted, nothing flagged".to_owned()
            } else {
                for other in &report.flagged {
                    writeln!(
                        cx,
                        "  {other} depended on {id}: flagged, held for a person, never applied automatically"
                    )?;
                }
                format!("reverted; flagged {}", flagged.join(", "))
            }
        }
        Ok(report) => {
            let message = report.message.unwrap_or_default();
            writeln!(
                cx,
                "  the gatekeeper refused to revert {id}: {}",
                visible(&message)
            )?;
            format!("refused: {}", short(&message))
        }
        Err(error) => {
            writeln!(
                cx,
                "  could not revert {id}: {}",
                visible(&error.to_string())
            )?;
            format!("failed: {}", short(&error.to_string()))
        }
    })
}

/// The text before the first `;` of a message: what happened, without the advice.
pub(crate) fn short(text: &str) -> String {
    visible(text.split(';').next().unwrap_or_default())
}

/// The agent renames page 100 "Publishable", reads the title back and stages a comment
/// on the page quoting it; returns the rename's and the comment's ledger ids.
pub(crate) async fn rename_then_quote(
    cx: &mut Context<'_>,
    agent: &WikiSession,
    page: &ContentHandle,
) -> anyhow::Result<(LedgerId, LedgerId)> {
    let rename = agent_renames(cx, agent, page, "Publishable").await?;
    let title = read(cx, agent, page).await?.title;
    let text = format!("Title is now \"{title}\"");
    let comment = staged(
        cx,
        &format!("add_comment(100, {text:?})"),
        agent.add_comment(page, &text).await,
    )?;
    Ok((rename, comment))
}

/// Page `id`'s comments as the wiki holds them, ` | ` between them, or `none`.
pub(crate) fn comments_in_wiki(lab: &Lab, id: u64) -> anyhow::Result<String> {
    let page = lab
        .service
        .page(id)
        .ok_or_else(|| anyhow::anyhow!("page {id} exists"))?;
    let comments: Vec<String> = page.comments.iter().map(|c| visible(&c.body)).collect();
    Ok(if comments.is_empty() {
        "none".to_owned()
    } else {
        comments.join(" | ")
    })
}

/// The action the kernel holds `id` back for: one it depends on that was rejected,
/// failed for good or reverted.
pub(crate) fn blocked_by(lab: &Lab, id: LedgerId) -> anyhow::Result<Option<LedgerId>> {
    Ok(lab.entry(id)?.action().and_then(|a| a.blocked_by))
}

/// Runs a case (`case(cx, policy, args..)`) under the reference's policy, then under ours;
/// evaluates to `(reference, ours)`.
macro_rules! both {
    ($cx:expr, $case:ident $(, $arg:expr)*) => {
        (
            $case($cx, gatekeeper_confluence::Policy::REFERENCE $(, $arg)*).await?,
            $case($cx, gatekeeper_confluence::Policy::GUARDED $(, $arg)*).await?,
        )
    };
}
pub(crate) use both;

/// An action's state in the kernel's ledger: `approved`, `failed, retryable`, ...
pub(crate) fn action_state(lab: &Lab, id: LedgerId) -> anyhow::Result<String> {
    let entry = lab.entry(id)?;
    let action = entry
        .action()
        .ok_or_else(|| anyhow::anyhow!("{id} is an action"))?;
    Ok(match &action.failure {
        Some(failure) if failure.retryable => format!("{}, retryable", action.state),
        Some(_) => format!("{}, final", action.state),
        None => action.state.to_string(),
    })
}

/// One line of the closing comparison: what was compared, and the two results.
pub(crate) struct Row {
    what: String,
    reference: String,
    ours: String,
}

impl Row {
    pub(crate) fn new(
        what: impl Into<String>,
        reference: impl Into<String>,
        ours: impl Into<String>,
    ) -> Self {
        Self {
            what: what.into(),
            reference: reference.into(),
            ours: ours.into(),
        }
    }

    /// A row from a case's `(reference, ours)`, as [`both!`] gives them.
    pub(crate) fn pair<T: Into<String>>(
        what: impl Into<String>,
        (reference, ours): (T, T),
    ) -> Self {
        Self::new(what, reference, ours)
    }
}

/// The closing section: every compared result, the reference's beside ours.
pub(crate) fn side_by_side(cx: &mut Context<'_>, rows: &[Row]) -> std::io::Result<()> {
    cx.section("Side by side: the reference, then ours")?;
    for row in rows {
        writeln!(cx, "{}", row.what)?;
        writeln!(cx, "  reference: {}", row.reference)?;
        writeln!(cx, "  ours:      {}", row.ours)?;
    }
    Ok(())
}

//! People act during review (issue 14): a person edits, trashes and decides in other
//! orders while the agent's work waits, and each of the three guarantees still holds
//! under the default policy. One test per hazard, named after it; the wiki service
//! plays the person at the moment each hazard needs.

use std::sync::Arc;

use gatekeeper_confluence::record::{StoredRecord, StoredV1};
use gatekeeper_confluence::{
    ActionRecord, ConfluenceGatekeeper, ContentHandle, ContentStatus, Edit, KvStore, Lab, MemoryKv,
    Policy, RecordState, Staged, WikiAction, WikiService, WikiSession,
};
use kernel::{
    ActionState, DriverActionId, Gatekeeper, GatekeeperError, LedgerId, StepClock, Timestamp,
};

use crate::{agent_on_manual, apply_error, lab_with_manual, state, storage, version};

/// The kernel's `blocked_by` of an action.
fn blocked_by(lab: &Lab, id: LedgerId) -> Option<LedgerId> {
    lab.entry(id).unwrap().action().unwrap().blocked_by
}

/// The kernel's `depends_on` of an action.
fn depends_on(lab: &Lab, id: LedgerId) -> Vec<LedgerId> {
    lab.entry(id).unwrap().action().unwrap().depends_on.clone()
}

/// The description on an action's card, as the person reads it.
fn card(lab: &Lab, id: LedgerId) -> String {
    lab.entry(id)
        .unwrap()
        .action()
        .unwrap()
        .description
        .description
        .clone()
}

/// Asserts that `error` is a failure for good whose message says `text`.
#[track_caller]
fn assert_final_saying(error: &GatekeeperError, text: &str) {
    assert!(!error.retryable, "{}", error.message);
    assert!(error.message.contains(text), "{}", error.message);
}

/// The agent stages `verb` ("replace", "append" or "rename") on `page`.
async fn stage(agent: &WikiSession, page: &ContentHandle, verb: &str) -> Staged {
    match verb {
        "replace" => agent.set_content(page, "agent body").await,
        "append" => agent.append_content(page, "agent note").await,
        _ => agent.set_title(page, "Agent title").await,
    }
    .unwrap()
}

// ----- stale writes (pitfall 1) -----

#[tokio::test]
async fn an_edit_between_the_agents_read_and_its_staging_is_not_erased() {
    for rename in [false, true] {
        let (lab, agent, page) = agent_on_manual(Policy::GUARDED, "Manual", "original").await;
        assert_eq!(agent.read(&page).await.unwrap().version, 1);
        lab.service
            .human_edit(100, Edit::ReplaceBody("human edit".into()))
            .unwrap();
        assert_eq!(agent.last_read_version(&page), Some(1));
        // Built on version 1, staged while the page is at version 2.
        let staged = if rename {
            agent.set_title(&page, "Agent title").await.unwrap()
        } else {
            agent.set_content(&page, "agent body").await.unwrap()
        };
        let read_card = card(&lab, staged.ledger);
        assert!(
            !read_card.contains("did not read"),
            "the agent did read it: {read_card}"
        );
        let error = apply_error(lab.overseer.approve(staged.ledger, "ana").await);
        assert_final_saying(&error, "staged against version 1");
        assert_eq!(storage(&lab, 100), "<p>human edit</p>", "rename: {rename}");
        assert_eq!(lab.service.page(100).unwrap().title, "Manual");
        assert_eq!(lab.service.writes(), 0);
    }
}

#[tokio::test]
async fn a_replace_of_a_page_the_agent_never_read_says_so_on_the_card() {
    let lab = lab_with_manual(Policy::GUARDED, "Manual", "original");
    lab.service
        .human_edit(100, Edit::AppendBody("human".into()))
        .unwrap();
    let agent = lab.session("agent");
    let page = agent.open("100").await.unwrap();
    let blind = agent.set_content(&page, "agent body").await.unwrap();
    let blind_card = card(&lab, blind.ledger);
    assert!(
        blind_card.contains(
            "The agent did not read this page before staging this: it never saw version 2"
        ),
        "{blind_card}"
    );
    // After a read, the card of the next replace says nothing of the sort.
    agent.read(&page).await.unwrap();
    let seen = agent.set_content(&page, "agent body, again").await.unwrap();
    assert!(!card(&lab, seen.ledger).contains("did not read"));
    // The reference's cards carry no such line.
    let reference = lab_with_manual(Policy::REFERENCE, "Manual", "original");
    let agent = reference.session("agent");
    let staged = agent.set_content(&page, "agent body").await.unwrap();
    assert!(!card(&reference, staged.ledger).contains("did not read"));
}

#[tokio::test]
async fn an_edit_approved_after_the_page_was_trashed_does_not_restore_it() {
    for verb in ["replace", "append", "rename"] {
        let (lab, agent, page) = agent_on_manual(Policy::GUARDED, "Manual", "original").await;
        agent.read(&page).await.unwrap();
        let staged = stage(&agent, &page, verb).await;
        lab.service.human_edit(100, Edit::Trash).unwrap();
        let error = apply_error(lab.overseer.approve(staged.ledger, "ana").await);
        assert!(
            error.message.contains("in the trash"),
            "{verb}: {}",
            error.message
        );
        let page_now = lab.service.page(100).unwrap();
        assert_eq!(page_now.status, ContentStatus::Trashed, "{verb}");
        assert_eq!(page_now.body, "<p>original</p>", "{verb}");
        assert_eq!(lab.service.writes(), 0, "{verb}");
        // Only an explicit restore restores; then the edit may be approved again.
        assert!(error.retryable, "{verb}");
        lab.service.human_edit(100, Edit::Restore).unwrap();
        lab.overseer.approve(staged.ledger, "ana").await.unwrap();
        assert_eq!(
            lab.service.page(100).unwrap().status,
            ContentStatus::Current
        );
        assert_eq!(lab.service.writes(), 1, "{verb}");
    }
}

// ----- semantic dependencies (pitfall 2) -----

#[tokio::test]
async fn a_write_referenced_without_a_read_is_flagged_when_rejected() {
    // A rename, then a comment elsewhere quoting it, without reading the page again.
    let lab = lab_with_manual(Policy::GUARDED, "Draft", "procedure");
    lab.service.seed_page_with_id(101, "OPS", "News", "");
    let agent = lab.session("agent");
    let other = lab.session("other agent");
    let page = agent.open("100").await.unwrap();
    let news = agent.open("101").await.unwrap();
    let rename = agent.set_title(&page, "Publishable").await.unwrap();
    let unrelated = other.add_label(&news, "weekly").await.unwrap();
    let comment = agent
        .add_comment(&news, "\"Publishable\" is ready")
        .await
        .unwrap();
    assert_eq!(depends_on(&lab, comment.ledger), vec![rename.ledger]);
    assert!(depends_on(&lab, unrelated.ledger).is_empty());
    let report = lab.overseer.reject(rename.ledger, "ana").await.unwrap();
    assert_eq!(report.flagged, vec![comment.ledger]);
    assert!(report.restart);
    assert_eq!(
        blocked_by(&lab, unrelated.ledger),
        None,
        "another session's"
    );

    // A create, then a comment elsewhere announcing it.
    let agent = lab.session("agent, restarted");
    let runbook = agent.create_page("OPS", "Runbook", "").await.unwrap();
    let create = agent.last_staged().unwrap();
    let announce = agent
        .add_comment(&news, "I created the Runbook page")
        .await
        .unwrap();
    assert_ne!(runbook, news);
    let report = lab.overseer.reject(create.ledger, "ana").await.unwrap();
    assert!(report.cascaded.is_empty(), "the comment is on another page");
    assert_eq!(report.flagged, vec![announce.ledger]);
    assert_eq!(state(&lab, announce.ledger), ActionState::Pending);
}

#[tokio::test]
async fn approving_a_dependent_while_its_dependency_is_pending_is_refused() {
    // On another page, so the order of one page's actions ("apply #k first") is not
    // what holds it back.
    let (lab, agent, page) = agent_on_manual(Policy::GUARDED, "Draft", "procedure").await;
    lab.service.seed_page_with_id(101, "OPS", "News", "");
    let news = agent.open("101").await.unwrap();
    let rename = agent.set_title(&page, "Publishable").await.unwrap();
    let title = agent.title(&page).await.unwrap();
    let comment = agent
        .add_comment(&news, &format!("\"{title}\" is ready"))
        .await
        .unwrap();
    let error = apply_error(lab.overseer.approve(comment.ledger, "ana").await);
    assert!(error.retryable, "nothing was sent: {}", error.message);
    assert!(
        error
            .message
            .contains(&format!("approve or reject {} first", rename.ledger)),
        "{}",
        error.message
    );
    assert_eq!(lab.service.writes(), 0);
    assert!(lab.service.page(101).unwrap().comments.is_empty());

    // Rejected: the comment is flagged; approving it now is a deliberate decision, and
    // the ledger keeps the flag next to who approved it.
    lab.overseer.reject(rename.ledger, "ana").await.unwrap();
    lab.overseer.approve(comment.ledger, "ana").await.unwrap();
    let entry = lab.entry(comment.ledger).unwrap();
    let action = entry.action().unwrap();
    assert_eq!(action.state, ActionState::Approved);
    assert_eq!(action.blocked_by, Some(rename.ledger));
    let resolution = action.resolution.as_ref().unwrap();
    assert_eq!(resolution.by, "ana");
    assert_eq!(
        resolution.cause.as_deref(),
        Some(
            format!(
                "approved although it depends on {}, which was rejected, failed for good or reverted",
                rename.ledger
            )
            .as_str()
        )
    );
}

#[tokio::test]
async fn a_dependency_that_failed_for_good_holds_the_dependent_like_a_rejection() {
    let (lab, agent, page) = agent_on_manual(Policy::GUARDED, "Manual", "original").await;
    let replace = agent.set_content(&page, "agent body").await.unwrap();
    assert_eq!(agent.body(&page).await.unwrap(), "agent body");
    lab.service
        .human_edit(100, Edit::AppendBody("human".into()))
        .unwrap();
    apply_error(lab.overseer.approve(replace.ledger, "ana").await);
    assert_eq!(state(&lab, replace.ledger), ActionState::Failed);
    // Built on what the failed replace made it see.
    let comment = agent
        .add_comment(&page, "the body now says \"agent body\"")
        .await
        .unwrap();
    assert_eq!(depends_on(&lab, comment.ledger), vec![replace.ledger]);
    assert_eq!(blocked_by(&lab, comment.ledger), Some(replace.ledger));
}

#[tokio::test]
async fn an_append_stacked_on_a_replace_that_fails_is_not_applied() {
    let (lab, agent, page) = agent_on_manual(Policy::GUARDED, "Manual", "original").await;
    agent.read(&page).await.unwrap();
    let replace = agent.set_content(&page, "new procedure").await.unwrap();
    let append = agent.append_content(&page, "safety notes").await.unwrap();
    assert_eq!(
        agent.body(&page).await.unwrap(),
        "new procedure\n\nsafety notes"
    );
    lab.service
        .human_edit(100, Edit::ReplaceBody("person's text".into()))
        .unwrap();
    apply_error(lab.overseer.approve(replace.ledger, "ana").await);
    assert_eq!(blocked_by(&lab, append.ledger), Some(replace.ledger));
    let error = apply_error(lab.overseer.approve(append.ledger, "ana").await);
    assert_final_saying(&error, "staged on top of");
    assert_eq!(storage(&lab, 100), "<p>person's text</p>");
    assert_eq!(lab.service.writes(), 0);
}

#[tokio::test]
async fn reverting_an_action_others_depend_on_flags_them() {
    let (lab, agent, page) = agent_on_manual(Policy::GUARDED, "Draft", "procedure").await;
    let rename = agent.set_title(&page, "Publishable").await.unwrap();
    let title = agent.title(&page).await.unwrap();
    let comment = agent
        .add_comment(&page, &format!("Title is now \"{title}\""))
        .await
        .unwrap();
    lab.overseer.approve(rename.ledger, "ana").await.unwrap();
    let report = lab.overseer.revert(rename.ledger, "ana").await.unwrap();
    assert!(report.reverted);
    assert_eq!(report.flagged, vec![comment.ledger]);
    assert_eq!(blocked_by(&lab, comment.ledger), Some(rename.ledger));
    assert_eq!(lab.service.page(100).unwrap().title, "Draft");
}

#[tokio::test]
async fn a_sessions_own_actions_form_a_chain_that_still_holds_every_later_one() {
    // Many actions from one session without reads: each depends on a bounded number of
    // others (the previous one, and the previous edit of the same body), not on all of
    // them, yet rejecting the first still flags every later one.
    let (lab, agent, page) = agent_on_manual(Policy::GUARDED, "Manual", "original").await;
    lab.service.seed_page_with_id(101, "OPS", "News", "");
    let news = agent.open("101").await.unwrap();
    let mut staged = Vec::new();
    for n in 0..40 {
        let target = if n % 2 == 0 { &page } else { &news };
        staged.push(
            agent
                .append_content(target, &format!("step {n}"))
                .await
                .unwrap(),
        );
    }
    for (n, action) in staged.iter().enumerate().skip(1) {
        let deps = depends_on(&lab, action.ledger);
        assert!(!deps.is_empty() && deps.len() <= 2, "action {n}: {deps:?}");
        assert!(deps.contains(&staged[n - 1].ledger), "action {n}: {deps:?}");
    }
    let report = lab.overseer.reject(staged[0].ledger, "ana").await.unwrap();
    let later: Vec<LedgerId> = staged[1..].iter().map(|s| s.ledger).collect();
    assert_eq!(report.flagged, later);
}

#[tokio::test]
async fn reverting_an_action_flags_what_depends_on_it_through_an_action_already_applied() {
    // One session stages S, I and K; its actions form a chain (K names I, I names S).
    // S and I are applied, then S is reverted: K, still pending, was staged on top of
    // S's effect and is held, although the chain runs through I, which is decided.
    let (lab, agent, page) = agent_on_manual(Policy::GUARDED, "Draft", "procedure").await;
    lab.service.seed_page_with_id(101, "OPS", "News", "");
    lab.service.seed_page_with_id(102, "OPS", "Index", "");
    let news = agent.open("101").await.unwrap();
    let index = agent.open("102").await.unwrap();
    let s = agent.set_title(&page, "Publishable").await.unwrap();
    let i = agent.add_label(&news, "published").await.unwrap();
    let k = agent.add_label(&index, "published").await.unwrap();
    assert_eq!(
        depends_on(&lab, k.ledger),
        vec![i.ledger],
        "a chain, not a list"
    );
    lab.overseer.approve(s.ledger, "ana").await.unwrap();
    lab.overseer.approve(i.ledger, "ana").await.unwrap();
    let report = lab.overseer.revert(s.ledger, "ana").await.unwrap();
    assert!(report.reverted);
    assert_eq!(report.flagged, vec![k.ledger]);
    assert_eq!(blocked_by(&lab, k.ledger), Some(s.ledger));
}

#[tokio::test]
async fn a_dependency_reached_through_a_rejected_action_still_holds_the_dependent() {
    // Three pages, so the order of one page's actions is not what holds them back.
    let (lab, agent, page) = agent_on_manual(Policy::GUARDED, "Draft", "procedure").await;
    lab.service
        .seed_page_with_id(101, "OPS", "News", "old news");
    lab.service.seed_page_with_id(102, "OPS", "Index", "");
    let news = agent.open("101").await.unwrap();
    let index = agent.open("102").await.unwrap();
    let first = agent.set_title(&page, "Publishable").await.unwrap();
    let second = agent.add_comment(&news, "published soon").await.unwrap();
    let third = agent.add_label(&index, "published").await.unwrap();
    assert_eq!(depends_on(&lab, third.ledger), vec![second.ledger]);
    let report = lab.overseer.reject(second.ledger, "ana").await.unwrap();
    assert_eq!(report.flagged, vec![third.ledger]);
    // A person approves the flagged label deliberately, but the rename it was built on
    // (through the rejected comment) is still pending: refused, nothing sent.
    let error = apply_error(lab.overseer.approve(third.ledger, "ana").await);
    assert!(error.retryable, "{}", error.message);
    assert!(
        error
            .message
            .contains(&format!("approve or reject {} first", first.ledger)),
        "{}",
        error.message
    );
    assert_eq!(lab.service.writes(), 0);
    lab.overseer.approve(first.ledger, "ana").await.unwrap();
    lab.overseer.approve(third.ledger, "ana").await.unwrap();
    assert_eq!(lab.service.page(102).unwrap().labels, vec!["published"]);
}

#[tokio::test]
async fn an_append_stacked_on_a_failed_replace_is_refused_past_an_applied_label() {
    let (lab, agent, page) = agent_on_manual(Policy::GUARDED, "Manual", "original").await;
    agent.read(&page).await.unwrap();
    let replace = agent.set_content(&page, "new procedure").await.unwrap();
    let label = agent.add_label(&page, "reviewed").await.unwrap();
    let append = agent.append_content(&page, "safety notes").await.unwrap();
    lab.service
        .human_edit(100, Edit::ReplaceBody("person's text".into()))
        .unwrap();
    apply_error(lab.overseer.approve(replace.ledger, "ana").await);
    // The label is flagged; a person approves it anyway, and it is applied.
    lab.overseer.approve(label.ledger, "ana").await.unwrap();
    let error = apply_error(lab.overseer.approve(append.ledger, "ana").await);
    assert_final_saying(&error, "staged on top of");
    assert_eq!(storage(&lab, 100), "<p>person's text</p>");
}

// ----- revert (pitfall 3) -----

#[tokio::test]
async fn revert_after_a_person_trashed_the_page_refuses_and_leaves_it_in_the_trash() {
    for verb in ["replace", "append", "rename"] {
        let (lab, agent, page) = agent_on_manual(Policy::GUARDED, "Manual", "original").await;
        agent.read(&page).await.unwrap();
        let staged = stage(&agent, &page, verb).await;
        lab.overseer.approve(staged.ledger, "ana").await.unwrap();
        lab.service.human_edit(100, Edit::Trash).unwrap();
        let before = lab.service.page(100).unwrap();
        let writes = lab.service.writes();
        let report = lab.overseer.revert(staged.ledger, "ana").await.unwrap();
        assert!(!report.reverted, "{verb}");
        let message = report.message.unwrap();
        assert!(message.contains("in the trash"), "{verb}: {message}");
        assert_eq!(lab.service.page(100).unwrap(), before, "{verb}");
        assert_eq!(lab.service.writes(), writes, "{verb}");
        assert_eq!(state(&lab, staged.ledger), ActionState::Approved);
    }
}

/// An applied record as stored before apply data existed (`applied: None`).
fn applied_without_data(id: u64, action: WikiAction) -> ActionRecord {
    ActionRecord {
        id: DriverActionId(id),
        ledger: None,
        action,
        state: RecordState::Applied,
        submitted_at: Timestamp(0),
        staging: Default::default(),
        depends_on: Vec::new(),
        applied: None,
        failure: None,
    }
}

#[tokio::test]
async fn revert_of_a_stored_record_without_apply_data_refuses_and_writes_nothing() {
    let target = ContentHandle::Real(100);
    let actions = [
        WikiAction::SetContent {
            target,
            markdown: "agent body".into(),
        },
        WikiAction::SetTitle {
            target,
            title: "Agent title".into(),
        },
        WikiAction::AppendContent {
            target,
            markdown: "agent note".into(),
        },
        WikiAction::AddComment {
            target,
            text: "agent comment".into(),
        },
    ];
    let kv = Arc::new(MemoryKv::new());
    for (id, action) in (1..).zip(actions) {
        let record = applied_without_data(id, action);
        let value = StoredRecord::V1(StoredV1::Action(Box::new(record))).encode();
        kv.put(&format!("action:{id:020}"), value.into()).unwrap();
    }
    let service = Arc::new(WikiService::new());
    service.seed_page_with_id(100, "OPS", "Manual", "agent body");
    let kv: Arc<dyn KvStore> = kv;
    let wiki = ConfluenceGatekeeper::open(
        "confluence",
        service.clone(),
        kv,
        Arc::new(StepClock::default()),
        Policy::GUARDED,
    )
    .unwrap();
    let before = service.page(100).unwrap();
    for id in 1..=4 {
        let outcome = wiki.revert_action(DriverActionId(id)).await.unwrap();
        let message = outcome.message.unwrap_or_default();
        assert!(
            message.contains("no record of what applying"),
            "{id}: {message:?}"
        );
        assert_eq!(
            wiki.record(DriverActionId(id)).unwrap().state,
            RecordState::Applied
        );
    }
    assert_eq!(service.page(100).unwrap(), before);
    assert_eq!(service.writes(), 0);
}

#[tokio::test]
async fn revert_of_a_create_after_people_edited_the_page_refuses() {
    let lab = Lab::new(Policy::GUARDED);
    let agent = lab.session("agent");
    agent.create_page("OPS", "Runbook", "steps").await.unwrap();
    let create = agent.last_staged().unwrap();
    lab.overseer.approve(create.ledger, "ana").await.unwrap();
    lab.service
        .human_edit(200, Edit::AppendBody("bob's step".into()))
        .unwrap();
    let report = lab.overseer.revert(create.ledger, "ana").await.unwrap();
    assert!(!report.reverted);
    let message = report.message.unwrap();
    assert!(
        message.contains("changed after it was created"),
        "{message}"
    );
    let page = lab.service.page(200).unwrap();
    assert_eq!(page.status, ContentStatus::Current);
    assert_eq!(version(&lab, 200), 2);
    assert_eq!(lab.service.writes(), 1, "only the create");
}

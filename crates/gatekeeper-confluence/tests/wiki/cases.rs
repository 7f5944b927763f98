//! The 11 review cases of the reference (a to h2, see the glossary in docs/ARCHITECTURE.md), each named after the case. Where the reference and our
//! policy behave the same the test runs both; where they differ there is one test per
//! policy, and the difference is the point.

use gatekeeper_confluence::{ContentHandle, Edit, Lab, Policy, RecordState};
use kernel::{ActionState, LedgerId};

use crate::{BOTH, apply_error, approve_all, lab_with_manual, state, storage, version};

// ----- (a) provisional parent and child, applied in order -----

#[tokio::test]
async fn a_provisional_parent_and_child_become_200_and_201() {
    for policy in BOTH {
        let lab = Lab::new(policy);
        let agent = lab.session("agent");
        let parent = agent.create_page("OPS", "Parent", "").await.unwrap();
        let child = agent
            .create_child_page(&parent, "Child", "stop")
            .await
            .unwrap();
        agent
            .append_content(&child, "revert to old version")
            .await
            .unwrap();
        assert_eq!(parent, ContentHandle::Provisional(1));
        assert_eq!(child, ContentHandle::Provisional(2));

        let before = agent.body(&child).await.unwrap();
        assert_eq!(before, "stop\n\nrevert to old version", "{policy}");
        assert_eq!(lab.service.writes(), 0);
        assert_eq!(lab.wiki.pending_count(), 3);
        assert_eq!(lab.open_ids().unwrap().len(), 3);

        approve_all(&lab).await;

        let after = agent.read(&child).await.unwrap();
        assert_eq!(after.body, before, "{policy}: same body after approval");
        assert_eq!(after.id, ContentHandle::Real(201));
        assert_eq!(
            after.handle,
            ContentHandle::Provisional(2),
            "the ~2 handle still works"
        );
        assert_eq!(after.parent, Some(ContentHandle::Real(200)));
        assert_eq!(lab.wiki.resolve(parent), ContentHandle::Real(200));
        assert_eq!(
            storage(&lab, 201),
            "<p>stop</p><p>revert to old version</p>"
        );
        assert_eq!(lab.service.writes(), 3, "2 POST + 1 PUT");
        assert_eq!(lab.wiki.pending_count(), 0);
        assert!(lab.open_ids().unwrap().is_empty());
    }
}

// ----- (b) an edit during review: replace loses it (reference), we refuse -----

/// Page 100 read at v1, a replacement staged, then a person edits the page to v2.
async fn b1_setup(policy: Policy) -> (Lab, LedgerId) {
    let lab = lab_with_manual(policy, "Manual", "original");
    let agent = lab.session("agent");
    let page = agent.open("100").await.unwrap();
    assert_eq!(agent.read(&page).await.unwrap().version, 1);
    let staged = agent.set_content(&page, "agent body").await.unwrap();
    assert_eq!(
        lab.service
            .human_edit(100, Edit::ReplaceBody("human edit".into()))
            .unwrap(),
        2
    );
    (lab, staged.ledger)
}

#[tokio::test]
async fn b1_reference_replace_silently_erases_the_edit_made_during_review() {
    let (lab, id) = b1_setup(Policy::REFERENCE).await;
    lab.overseer.approve(id, "ana").await.unwrap();
    assert_eq!(version(&lab, 100), 3);
    assert_eq!(
        storage(&lab, 100),
        "<p>agent body</p>",
        "the human edit is gone"
    );
}

#[tokio::test]
async fn b1_guarded_refuses_the_stale_replace_and_keeps_the_edit() {
    let (lab, id) = b1_setup(Policy::GUARDED).await;
    let error = apply_error(lab.overseer.approve(id, "ana").await);
    assert!(!error.retryable, "approving again can never succeed");
    for needle in ["version 2", "version 1", "re-read the page and stage again"] {
        assert!(
            error.message.contains(needle),
            "{needle:?} in {}",
            error.message
        );
    }
    assert_eq!(version(&lab, 100), 2);
    assert_eq!(storage(&lab, 100), "<p>human edit</p>");
    assert_eq!(lab.service.writes(), 0);
    assert_eq!(state(&lab, id), ActionState::Failed);
    // The stale proposal is no longer simulated: the agent now reads the human's text.
    let agent = lab.session("agent");
    let page = agent.open("100").await.unwrap();
    assert_eq!(agent.body(&page).await.unwrap(), "human edit");
}

#[tokio::test]
async fn b2_append_keeps_the_edit_made_during_review() {
    for policy in BOTH {
        let lab = lab_with_manual(policy, "Manual", "original");
        let agent = lab.session("agent");
        let page = agent.open("100").await.unwrap();
        agent.read(&page).await.unwrap();
        let staged = agent.append_content(&page, "agent proposal").await.unwrap();
        lab.service
            .human_edit(100, Edit::AppendBody("human edit".into()))
            .unwrap();
        lab.overseer.approve(staged.ledger, "ana").await.unwrap();
        assert_eq!(version(&lab, 100), 3, "{policy}");
        assert_eq!(
            storage(&lab, 100),
            "<p>original</p><p>human edit</p><p>agent proposal</p>"
        );
    }
}

// ----- (c) an edit between the driver's read and its write -----

async fn c_setup(policy: Policy) -> (Lab, LedgerId) {
    let lab = lab_with_manual(policy, "Manual", "original");
    let agent = lab.session("agent");
    let page = agent.open("100").await.unwrap();
    let staged = agent.set_content(&page, "agent body").await.unwrap();
    lab.service
        .edit_after_next_get(100, Edit::AppendBody("concurrent".into()));
    let error = apply_error(lab.overseer.approve(staged.ledger, "ana").await);
    assert!(error.message.contains("409"), "{}", error.message);
    assert!(
        error.retryable,
        "nothing was written, so it may be approved again"
    );
    (lab, staged.ledger)
}

#[tokio::test]
async fn c_an_edit_between_read_and_write_is_a_conflict_and_nothing_is_written() {
    for policy in BOTH {
        let (lab, id) = c_setup(policy).await;
        assert_eq!(lab.service.writes(), 0, "{policy}");
        assert_eq!(storage(&lab, 100), "<p>original</p><p>concurrent</p>");
        assert_eq!(version(&lab, 100), 2);
        assert_eq!(state(&lab, id), ActionState::Failed);
        assert_eq!(lab.open_ids().unwrap(), vec![id], "still open: not applied");
        let driver_id = lab.entry(id).unwrap().action().unwrap().driver_id;
        assert_eq!(
            lab.wiki.record(driver_id).unwrap().state,
            RecordState::Pending
        );
    }
}

#[tokio::test]
async fn c_reference_retry_overwrites_the_concurrent_edit() {
    let (lab, id) = c_setup(Policy::REFERENCE).await;
    lab.overseer.approve(id, "ana").await.unwrap();
    assert_eq!(storage(&lab, 100), "<p>agent body</p>");
}

#[tokio::test]
async fn c_guarded_retry_is_refused_as_stale() {
    let (lab, id) = c_setup(Policy::GUARDED).await;
    let error = apply_error(lab.overseer.approve(id, "ana").await);
    assert!(error.message.contains("re-read the page and stage again"));
    assert_eq!(storage(&lab, 100), "<p>original</p><p>concurrent</p>");
}

// ----- (d) rejecting a parent takes its descendants with it -----

async fn d_setup(policy: Policy) -> (Lab, Vec<LedgerId>) {
    let lab = Lab::new(policy);
    let agent = lab.session("agent");
    let parent = agent.create_page("OPS", "Release", "").await.unwrap();
    let child = agent
        .create_child_page(&parent, "Rollback", "")
        .await
        .unwrap();
    let grandchild = agent
        .create_child_page(&child, "Checklist", "step 1")
        .await
        .unwrap();
    agent.append_content(&grandchild, "step 2").await.unwrap();
    let ids = lab.open_ids().unwrap();
    assert_eq!(ids.len(), 4);
    (lab, ids)
}

#[tokio::test]
async fn d_guarded_rejecting_the_parent_removes_all_four_and_tells_the_kernel() {
    let (lab, ids) = d_setup(Policy::GUARDED).await;
    let report = lab.overseer.reject(ids[0], "ana").await.unwrap();
    assert!(report.restart);
    assert_eq!(report.cascaded, ids[1..].to_vec());
    assert_eq!(lab.wiki.pending_count(), 0);
    assert_eq!(lab.service.writes(), 0);
    for id in &ids[1..] {
        let entry = lab.entry(*id).unwrap();
        let action = entry.action().unwrap();
        assert_eq!(action.state, ActionState::Rejected);
        let cause = action.resolution.as_ref().unwrap().cause.clone();
        assert_eq!(
            cause.as_deref(),
            Some(format!("cascaded from {}", ids[0]).as_str())
        );
    }
    assert!(lab.open_ids().unwrap().is_empty());
    let agent = lab.session("agent");
    assert!(
        agent.open("~2").await.is_err(),
        "a rejected create's handle is gone"
    );
}

#[tokio::test]
async fn d_reference_rejecting_the_parent_orphans_three_actions_in_the_kernel() {
    let (lab, ids) = d_setup(Policy::REFERENCE).await;
    let report = lab.overseer.reject(ids[0], "ana").await.unwrap();
    assert!(report.restart);
    assert!(
        report.cascaded.is_empty(),
        "the reference does not tell its host"
    );
    assert_eq!(
        lab.wiki.pending_count(),
        0,
        "yet all four are gone from the driver"
    );
    assert_eq!(lab.service.writes(), 0);
    assert_eq!(lab.open_ids().unwrap(), ids[1..].to_vec(), "three orphans");
    let error = apply_error(lab.overseer.approve(ids[1], "ana").await);
    assert!(
        error.message.contains("unknown action"),
        "{}",
        error.message
    );
}

// ----- (e) a comment built on a title that gets rejected -----

async fn e_setup(policy: Policy) -> (Lab, LedgerId, LedgerId) {
    let lab = lab_with_manual(policy, "Draft", "procedure");
    let agent = lab.session("agent");
    let page = agent.open("100").await.unwrap();
    let retitle = agent.set_title(&page, "Publishable").await.unwrap();
    let title = agent.read(&page).await.unwrap().title;
    assert_eq!(title, "Publishable");
    let comment = agent
        .add_comment(&page, &format!("Title is now \"{title}\""))
        .await
        .unwrap();
    (lab, retitle.ledger, comment.ledger)
}

#[tokio::test]
async fn e_reference_leaves_the_comment_quoting_a_title_that_never_existed() {
    let (lab, retitle, comment) = e_setup(Policy::REFERENCE).await;
    let report = lab.overseer.reject(retitle, "ana").await.unwrap();
    assert!(report.restart, "same-content heuristic");
    assert!(report.flagged.is_empty());
    assert_eq!(
        lab.entry(comment).unwrap().action().unwrap().blocked_by,
        None
    );
    lab.overseer.approve(comment, "ana").await.unwrap();
    let page = lab.service.page(100).unwrap();
    assert_eq!(page.title, "Draft");
    assert_eq!(
        page.comments[0].body,
        "<p>Title is now &quot;Publishable&quot;</p>"
    );
}

#[tokio::test]
async fn e_guarded_flags_the_comment_that_quoted_the_rejected_title() {
    let (lab, retitle, comment) = e_setup(Policy::GUARDED).await;
    let entry = lab.entry(comment).unwrap();
    assert_eq!(entry.action().unwrap().depends_on, vec![retitle]);
    let report = lab.overseer.reject(retitle, "ana").await.unwrap();
    assert!(report.restart);
    assert_eq!(report.flagged, vec![comment]);
    let action = lab.entry(comment).unwrap().action().unwrap().clone();
    assert_eq!(action.blocked_by, Some(retitle));
    assert_eq!(
        action.state,
        ActionState::Pending,
        "held for a person, not thrown away"
    );
    assert_eq!(lab.service.writes(), 0);
}

#[tokio::test]
async fn e_a_dependent_on_another_page_gets_no_hint_from_the_reference_but_is_flagged_by_us() {
    for policy in BOTH {
        let lab = lab_with_manual(policy, "Draft", "procedure");
        lab.service.seed_page_with_id(101, "OPS", "News", "");
        let agent = lab.session("agent");
        let page = agent.open("100").await.unwrap();
        let news = agent.open("101").await.unwrap();
        let retitle = agent.set_title(&page, "Publishable").await.unwrap();
        let title = agent.read(&page).await.unwrap().title;
        let comment = agent
            .add_comment(&news, &format!("\"{title}\" is ready"))
            .await
            .unwrap();
        let report = lab.overseer.reject(retitle.ledger, "ana").await.unwrap();
        if policy == Policy::REFERENCE {
            assert!(!report.restart);
            assert!(report.flagged.is_empty());
        } else {
            assert!(report.restart);
            assert_eq!(report.flagged, vec![comment.ledger]);
        }
    }
}

// ----- (f) the order of replace and append -----

#[tokio::test]
async fn f1_replace_then_append_keeps_both() {
    for policy in BOTH {
        let lab = lab_with_manual(policy, "Manual", "old procedure");
        let agent = lab.session("agent");
        let page = agent.open("100").await.unwrap();
        agent.set_content(&page, "new procedure").await.unwrap();
        agent.append_content(&page, "safety notes").await.unwrap();
        assert_eq!(
            agent.body(&page).await.unwrap(),
            "new procedure\n\nsafety notes"
        );
        approve_all(&lab).await;
        assert_eq!(
            storage(&lab, 100),
            "<p>new procedure</p><p>safety notes</p>",
            "{policy}"
        );
    }
}

#[tokio::test]
async fn f2_append_then_replace_keeps_only_the_replacement() {
    for policy in BOTH {
        let lab = lab_with_manual(policy, "Manual", "old procedure");
        let agent = lab.session("agent");
        let page = agent.open("100").await.unwrap();
        agent.append_content(&page, "safety notes").await.unwrap();
        agent.set_content(&page, "new procedure").await.unwrap();
        assert_eq!(agent.body(&page).await.unwrap(), "new procedure");
        approve_all(&lab).await;
        assert_eq!(storage(&lab, 100), "<p>new procedure</p>", "{policy}");
    }
}

async fn f1_staged(policy: Policy) -> (Lab, LedgerId, LedgerId) {
    let lab = lab_with_manual(policy, "Manual", "old procedure");
    let agent = lab.session("agent");
    let page = agent.open("100").await.unwrap();
    let set = agent.set_content(&page, "new procedure").await.unwrap();
    let append = agent.append_content(&page, "safety notes").await.unwrap();
    (lab, set.ledger, append.ledger)
}

#[tokio::test]
async fn f1_reference_approved_in_reverse_ends_unlike_the_simulation() {
    let (lab, set, append) = f1_staged(Policy::REFERENCE).await;
    lab.overseer.approve(append, "ana").await.unwrap();
    lab.overseer.approve(set, "ana").await.unwrap();
    assert_eq!(
        storage(&lab, 100),
        "<p>new procedure</p>",
        "the notes are lost"
    );
}

#[tokio::test]
async fn f1_guarded_refuses_to_apply_out_of_simulation_order() {
    let (lab, set, append) = f1_staged(Policy::GUARDED).await;
    let error = apply_error(lab.overseer.approve(append, "ana").await);
    assert!(error.retryable);
    assert!(
        error.message.contains(&format!("apply {set} first")),
        "{}",
        error.message
    );
    assert_eq!(lab.service.writes(), 0);
    lab.overseer.approve(set, "ana").await.unwrap();
    lab.overseer.approve(append, "ana").await.unwrap();
    assert_eq!(
        storage(&lab, 100),
        "<p>new procedure</p><p>safety notes</p>"
    );
}

// ----- (g) a child before its parent -----

#[tokio::test]
async fn g_a_child_applied_before_its_parent_fails_then_parent_then_child_succeeds() {
    for policy in BOTH {
        let lab = Lab::new(policy);
        let agent = lab.session("agent");
        let parent = agent.create_page("OPS", "Parent", "").await.unwrap();
        agent.create_child_page(&parent, "Child", "").await.unwrap();
        let ids = lab.open_ids().unwrap();

        let error = apply_error(lab.overseer.approve(ids[1], "ana").await);
        assert!(error.retryable, "{policy}");
        assert!(
            error
                .message
                .contains("content ~1 has not been created yet"),
            "{policy}: {}",
            error.message
        );
        if policy == Policy::GUARDED {
            assert!(error.message.contains(&format!("apply {} first", ids[0])));
        }
        assert_eq!(lab.service.writes(), 0, "no parent is created on the side");
        assert!(lab.service.page(200).is_none());

        lab.overseer.approve(ids[0], "ana").await.unwrap();
        lab.overseer.approve(ids[1], "ana").await.unwrap();
        assert_eq!(lab.service.page(201).unwrap().parent, Some(200));
        assert_eq!(state(&lab, ids[1]), ActionState::Approved);
    }
}

// ----- (h) revert of an append, with and without a later human edit -----

async fn h_applied_append(policy: Policy) -> (Lab, LedgerId) {
    let lab = lab_with_manual(policy, "Manual", "old");
    let agent = lab.session("agent");
    let page = agent.open("100").await.unwrap();
    let staged = agent.append_content(&page, "new").await.unwrap();
    lab.overseer.approve(staged.ledger, "ana").await.unwrap();
    assert_eq!(storage(&lab, 100), "<p>old</p><p>new</p>");
    (lab, staged.ledger)
}

#[tokio::test]
async fn h1_reverting_an_append_restores_the_previous_body() {
    for policy in BOTH {
        let (lab, id) = h_applied_append(policy).await;
        let report = lab.overseer.revert(id, "ana").await.unwrap();
        assert!(report.reverted, "{policy}");
        assert_eq!(storage(&lab, 100), "<p>old</p>");
        assert_eq!(state(&lab, id), ActionState::Reverted);
    }
}

#[tokio::test]
async fn h2_reference_revert_wipes_the_later_human_edit() {
    let (lab, id) = h_applied_append(Policy::REFERENCE).await;
    lab.service
        .human_edit(100, Edit::AppendBody("human".into()))
        .unwrap();
    assert!(lab.overseer.revert(id, "ana").await.unwrap().reverted);
    assert_eq!(storage(&lab, 100), "<p>old</p>", "the human edit is gone");
}

#[tokio::test]
async fn h2_guarded_revert_removes_only_the_appended_block() {
    let (lab, id) = h_applied_append(Policy::GUARDED).await;
    lab.service
        .human_edit(100, Edit::AppendBody("human".into()))
        .unwrap();
    assert!(lab.overseer.revert(id, "ana").await.unwrap().reverted);
    assert_eq!(storage(&lab, 100), "<p>old</p><p>human</p>");
}

//! Apply, reject and revert beyond the 11 cases, and what survives a restart.

use std::sync::Arc;

use gatekeeper_confluence::{
    ConfluenceGatekeeper, ContentHandle, Edit, KvStore, Lab, Policy, RecordState,
};
use kernel::{DriverActionId, Gatekeeper};

use crate::{BOTH, apply_error, approve_all, lab_with_manual, storage};

#[tokio::test]
async fn pending_work_survives_a_restart_of_the_gatekeeper() {
    let lab = lab_with_manual(Policy::GUARDED, "Manual", "original");
    let agent = lab.session("agent");
    let page = agent.open("100").await.unwrap();
    let parent = agent.create_page("OPS", "Parent", "").await.unwrap();
    agent.append_content(&page, "more").await.unwrap();
    let ids = lab.open_ids().unwrap();
    lab.overseer.approve(ids[0], "ana").await.unwrap();

    let kv: Arc<dyn KvStore> = lab.kv.clone();
    let reopened = ConfluenceGatekeeper::open(
        "confluence",
        lab.service.clone(),
        kv,
        lab.clock.clone(),
        Policy::GUARDED,
    )
    .unwrap();
    assert_eq!(reopened.pending_count(), 1);
    assert_eq!(reopened.resolve(parent), ContentHandle::Real(200));
    let record = reopened.record(DriverActionId(2)).unwrap();
    assert_eq!(record.ledger, Some(ids[1]));
    assert_eq!(record.state, RecordState::Pending);
    reopened.apply_action(DriverActionId(2)).await.unwrap();
    assert_eq!(storage(&lab, 100), "<p>original</p><p>more</p>");
    let keys: Vec<String> = lab
        .kv
        .scan_prefix("")
        .unwrap()
        .into_iter()
        .map(|(key, _)| key)
        .collect();
    for key in [
        "action:00000000000000000001",
        "prov:~1",
        "seq:action",
        "seq:provisional",
        "space:OPS",
    ] {
        assert!(keys.contains(&key.to_owned()), "{key} in {keys:?}");
    }
}

#[tokio::test]
async fn our_own_earlier_changes_do_not_make_a_replace_stale() {
    let lab = lab_with_manual(Policy::GUARDED, "Manual", "original");
    let agent = lab.session("agent");
    let page = agent.open("100").await.unwrap();
    agent.set_title(&page, "Manual v2").await.unwrap();
    agent.append_content(&page, "note").await.unwrap();
    agent.set_content(&page, "rewritten").await.unwrap();
    agent.set_title(&page, "Manual v3").await.unwrap();
    let created = agent.create_page("OPS", "Fresh", "seed").await.unwrap();
    agent
        .set_content(&created, "replaced before it existed")
        .await
        .unwrap();
    approve_all(&lab).await;
    let page = lab.service.page(100).unwrap();
    assert_eq!((page.title.as_str(), page.version), ("Manual v3", 5));
    assert_eq!(page.body, "<p>rewritten</p>");
    assert_eq!(storage(&lab, 200), "<p>replaced before it existed</p>");
}

#[tokio::test]
async fn a_person_may_still_approve_a_flagged_action_deliberately() {
    let lab = lab_with_manual(Policy::GUARDED, "Draft", "procedure");
    let agent = lab.session("agent");
    let page = agent.open("100").await.unwrap();
    let retitle = agent.set_title(&page, "Publishable").await.unwrap();
    agent.read(&page).await.unwrap();
    let label = agent.add_label(&page, "reviewed").await.unwrap();
    let report = lab.overseer.reject(retitle.ledger, "ana").await.unwrap();
    assert_eq!(report.flagged, vec![label.ledger]);
    lab.overseer.approve(label.ledger, "ana").await.unwrap();
    assert_eq!(lab.service.page(100).unwrap().labels, vec!["reviewed"]);
}

#[tokio::test]
async fn applying_twice_sends_once_and_rejecting_an_applied_action_keeps_it() {
    for policy in BOTH {
        let lab = lab_with_manual(policy, "Manual", "original");
        let agent = lab.session("agent");
        let page = agent.open("100").await.unwrap();
        let staged = agent.add_comment(&page, "once").await.unwrap();
        lab.wiki.apply_action(staged.action).await.unwrap();
        lab.wiki.apply_action(staged.action).await.unwrap();
        assert_eq!(lab.service.writes(), 1, "{policy}");
        let outcome = lab.wiki.reject_action(staged.action).await.unwrap();
        assert!(!outcome.restart && outcome.cascaded.is_empty());
        assert_eq!(
            lab.wiki.record(staged.action).unwrap().state,
            RecordState::Applied
        );
        lab.wiki.revert_action(staged.action).await.unwrap();
        assert!(lab.service.page(100).unwrap().comments.is_empty());
    }
}

#[tokio::test]
async fn rejecting_an_edit_asks_for_a_restart_only_if_the_content_has_more_pending() {
    for policy in BOTH {
        let lab = lab_with_manual(policy, "Manual", "original");
        let agent = lab.session("agent");
        let page = agent.open("100").await.unwrap();
        let first = agent.append_content(&page, "a").await.unwrap();
        let second = agent.append_content(&page, "b").await.unwrap();
        let report = lab.overseer.reject(first.ledger, "ana").await.unwrap();
        assert!(report.restart, "{policy}");
        let report = lab.overseer.reject(second.ledger, "ana").await.unwrap();
        assert!(!report.restart, "{policy}");
    }
}

async fn applied_replace(policy: Policy) -> (Lab, kernel::LedgerId) {
    let lab = lab_with_manual(policy, "Manual", "old");
    let agent = lab.session("agent");
    let page = agent.open("100").await.unwrap();
    let staged = agent.set_content(&page, "new").await.unwrap();
    lab.overseer.approve(staged.ledger, "ana").await.unwrap();
    (lab, staged.ledger)
}

#[tokio::test]
async fn guarded_revert_of_a_replace_refuses_once_the_page_changed() {
    let (lab, id) = applied_replace(Policy::GUARDED).await;
    lab.service
        .human_edit(100, Edit::AppendBody("human".into()))
        .unwrap();
    let writes = lab.service.writes();
    let report = lab.overseer.revert(id, "ana").await.unwrap();
    assert!(!report.reverted);
    assert!(!report.can_retry);
    let message = report.message.unwrap();
    assert!(
        message.contains("version 2") && message.contains("version 3"),
        "{message}"
    );
    assert_eq!(lab.service.writes(), writes, "nothing written");
    assert_eq!(storage(&lab, 100), "<p>new</p><p>human</p>");
}

#[tokio::test]
async fn revert_of_an_unchanged_replace_restores_the_exact_previous_body() {
    for policy in BOTH {
        let (lab, id) = applied_replace(policy).await;
        assert!(
            lab.overseer.revert(id, "ana").await.unwrap().reverted,
            "{policy}"
        );
        assert_eq!(storage(&lab, 100), "<p>old</p>");
    }
}

#[tokio::test]
async fn reference_revert_of_a_replace_wipes_a_later_edit() {
    let (lab, id) = applied_replace(Policy::REFERENCE).await;
    lab.service
        .human_edit(100, Edit::AppendBody("human".into()))
        .unwrap();
    assert!(lab.overseer.revert(id, "ana").await.unwrap().reverted);
    assert_eq!(storage(&lab, 100), "<p>old</p>");
}

#[tokio::test]
async fn guarded_revert_of_an_append_refuses_when_the_block_is_gone_or_ambiguous() {
    let lab = lab_with_manual(Policy::GUARDED, "Manual", "old");
    let agent = lab.session("agent");
    let page = agent.open("100").await.unwrap();
    let staged = agent.append_content(&page, "new").await.unwrap();
    lab.overseer.approve(staged.ledger, "ana").await.unwrap();
    lab.service
        .human_edit(100, Edit::AppendBody("new".into()))
        .unwrap();
    let report = lab.overseer.revert(staged.ledger, "ana").await.unwrap();
    assert!(report.message.unwrap().contains("appears 2 times"));
    lab.service
        .human_edit(100, Edit::ReplaceBody("rewritten".into()))
        .unwrap();
    let report = lab.overseer.revert(staged.ledger, "ana").await.unwrap();
    assert!(report.message.unwrap().contains("no longer on content 100"));
    assert_eq!(storage(&lab, 100), "<p>rewritten</p>");
}

#[tokio::test]
async fn guarded_label_revert_undoes_only_a_change_it_made() {
    for policy in BOTH {
        let lab = lab_with_manual(policy, "Manual", "old");
        let agent = lab.session("agent");
        let page = agent.open("100").await.unwrap();
        let first = agent.add_label(&page, "urgent").await.unwrap();
        lab.overseer.approve(first.ledger, "ana").await.unwrap();
        let again = agent.add_label(&page, "urgent").await.unwrap();
        lab.overseer.approve(again.ledger, "ana").await.unwrap();
        assert!(
            lab.overseer
                .revert(again.ledger, "ana")
                .await
                .unwrap()
                .reverted
        );
        let labels = lab.service.page(100).unwrap().labels;
        if policy == Policy::GUARDED {
            assert_eq!(labels, vec!["urgent"], "the label predates this action");
        } else {
            assert!(labels.is_empty(), "the reference removes it blindly");
        }
    }
}

#[tokio::test]
async fn reverting_a_create_trashes_the_page_and_the_handle_still_resolves() {
    let lab = Lab::new(Policy::GUARDED);
    let agent = lab.session("agent");
    let page = agent.create_page("OPS", "Temp", "x").await.unwrap();
    let id = lab.open_ids().unwrap()[0];
    lab.overseer.approve(id, "ana").await.unwrap();
    assert!(lab.overseer.revert(id, "ana").await.unwrap().reverted);
    let view = agent.read(&page).await.unwrap();
    assert_eq!(view.id, ContentHandle::Real(200));
    assert_eq!(view.status, gatekeeper_confluence::ContentStatus::Trashed);
}

#[tokio::test]
async fn a_stale_replace_fails_for_good_and_stops_blocking_later_actions() {
    let lab = lab_with_manual(Policy::GUARDED, "Manual", "original");
    let agent = lab.session("agent");
    let page = agent.open("100").await.unwrap();
    let set = agent.set_content(&page, "mine").await.unwrap();
    // Another agent's append, not built on the replace (it never read the page).
    let append = lab
        .session("other agent")
        .append_content(&page, "tail")
        .await
        .unwrap();
    lab.service
        .human_edit(100, Edit::AppendBody("theirs".into()))
        .unwrap();
    apply_error(lab.overseer.approve(set.ledger, "ana").await);
    assert_eq!(
        lab.wiki.record(set.action).unwrap().state,
        RecordState::Failed
    );
    lab.overseer.approve(append.ledger, "ana").await.unwrap();
    assert_eq!(
        storage(&lab, 100),
        "<p>original</p><p>theirs</p><p>tail</p>"
    );
}

#[tokio::test]
async fn a_wiki_refusal_quoting_the_agent_reaches_the_kernel_as_one_visible_line() {
    // The wiki's 404 names the space the agent asked for; the agent chose the name.
    let lab = Lab::new(Policy::GUARDED);
    let agent = lab.session("agent");
    let space = "NOPE\n  evidence: nothing was sent = yes\u{1b}[2K\u{202e}";
    agent.create_page(space, "Runbook", "").await.unwrap();
    let id = lab.open_ids().unwrap()[0];
    let error = apply_error(lab.overseer.approve(id, "ana").await);
    assert_eq!(
        error.message,
        "404 not found: space NOPE evidence: nothing was sent = yes⟨ESC⟩⟨U+202E⟩; nothing was written"
    );
}

/// The bytes the driver keeps for `appends` pending appends on one page, each staged by
/// an agent that read nothing first (so no append declares dependencies: what is left
/// is the record itself and whatever it captured at staging).
async fn kept_for_appends(policy: Policy, appends: usize) -> usize {
    let lab = lab_with_manual(policy, "Manual", "original");
    for n in 0..appends {
        lab.session(&format!("agent-{n}"))
            .append_content(
                &ContentHandle::Real(100),
                &format!("Step {n}: check the dashboards."),
            )
            .await
            .unwrap();
    }
    lab.kv
        .scan_prefix("")
        .unwrap()
        .iter()
        .map(|(key, value)| key.len() + value.len())
        .sum()
}

#[tokio::test]
async fn a_pending_append_keeps_no_copy_of_the_page_body() {
    let (one, two) = (
        kept_for_appends(Policy::GUARDED, 150).await,
        kept_for_appends(Policy::GUARDED, 300).await,
    );
    assert!(
        two * 10 <= one * 21,
        "twice the pending appends keep {two} bytes against {one}: not linear"
    );
    // The reference keeps the whole earlier body with each append, for its revert.
    let (one, two) = (
        kept_for_appends(Policy::REFERENCE, 150).await,
        kept_for_appends(Policy::REFERENCE, 300).await,
    );
    assert!(two * 10 > one * 30, "{one} then {two} bytes");
}

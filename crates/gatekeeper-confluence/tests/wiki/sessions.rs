//! The agent's API: handles, what reads show and record, and staging that the kernel
//! refuses.

use gatekeeper_confluence::{
    ContentHandle, ContentKind, ContentStatus, Lab, NewPage, Policy, WikiError,
};
use kernel::{EntryBody, ObservationDescription, QueueError};

use crate::{BOTH, lab_with_manual};

#[tokio::test]
async fn every_read_is_recorded_before_its_data_is_returned() {
    let lab = lab_with_manual(Policy::GUARDED, "Manual", "original");
    let agent = lab.session("agent");
    let page = agent.open("100").await.unwrap();
    assert!(
        lab.overseer.ledger().unwrap().is_empty(),
        "open returns no content"
    );
    agent.append_content(&page, "more").await.unwrap();
    agent.body(&page).await.unwrap();
    let ledger = lab.overseer.ledger().unwrap();
    let EntryBody::Observation(seen) = &ledger.last().unwrap().body else {
        panic!("the read was not recorded");
    };
    assert_eq!(seen.title, "Read the body of Confluence page 100");
    assert!(
        seen.description.contains("Includes 1 pending change"),
        "{}",
        seen.description
    );
}

#[tokio::test]
async fn unknown_and_rejected_handles_are_not_found() {
    let lab = Lab::new(Policy::GUARDED);
    let agent = lab.session("agent");
    assert_eq!(
        agent.open("~9").await,
        Err(WikiError::NotFound(ContentHandle::Provisional(9)))
    );
    assert_eq!(
        agent.open("4242").await,
        Err(WikiError::NotFound(ContentHandle::Real(4242)))
    );
    assert!(matches!(
        agent.open("page").await,
        Err(WikiError::InvalidHandle(_))
    ));
    let page = agent.create_page("OPS", "Gone soon", "").await.unwrap();
    let id = lab.open_ids().unwrap()[0];
    lab.overseer.reject(id, "ana").await.unwrap();
    assert_eq!(agent.read(&page).await, Err(WikiError::NotFound(page)));
}

#[tokio::test]
async fn blog_posts_cannot_have_child_pages() {
    let lab = Lab::new(Policy::GUARDED);
    let agent = lab.session("agent");
    let post = agent.create_blog_post("OPS", "News", "").await.unwrap();
    let refused = agent.create_child_page(&post, "Child", "").await;
    assert_eq!(refused, Err(WikiError::BlogPostChildren(post)));
    assert_eq!(lab.wiki.pending_count(), 1);
}

#[tokio::test]
async fn content_not_yet_created_reads_from_its_create() {
    let lab = Lab::new(Policy::GUARDED);
    let agent = lab.session("agent");
    let draft = agent
        .create(NewPage::page("OPS", "Plan", "first draft").draft())
        .await
        .unwrap();
    agent.set_title(&draft, "Plan v2").await.unwrap();
    let view = agent.read(&draft).await.unwrap();
    assert_eq!(view.id, draft);
    assert_eq!(view.version, 0);
    assert_eq!(view.status, ContentStatus::Draft);
    assert_eq!(view.title, "Plan v2");
    assert_eq!(view.body, "first draft");
    assert_eq!(view.kind, ContentKind::Page);
    assert_eq!(view.pending_changes, 2);
    crate::approve_all(&lab).await;
    let page = lab.service.page(200).unwrap();
    assert_eq!(page.status, ContentStatus::Draft, "a draft stays a draft");
    assert_eq!((page.title.as_str(), page.version), ("Plan v2", 2));
}

#[tokio::test]
async fn labels_comments_and_trash_are_simulated() {
    for policy in BOTH {
        let lab = lab_with_manual(policy, "Manual", "original");
        let agent = lab.session("agent");
        let page = agent.open("100").await.unwrap();
        agent.add_label(&page, "urgent").await.unwrap();
        agent.add_label(&page, "urgent").await.unwrap();
        agent.add_comment(&page, "looks good").await.unwrap();
        agent.trash(&page).await.unwrap();
        let view = agent.read(&page).await.unwrap();
        assert_eq!(view.labels, vec!["urgent"]);
        assert_eq!(view.comments.len(), 1);
        assert_eq!(view.comments[0].id, "~comment-3");
        assert_eq!(view.comments[0].author, None);
        assert_eq!(view.status, ContentStatus::Trashed);
        agent.restore(&page).await.unwrap();
        assert_eq!(
            agent.read(&page).await.unwrap().status,
            ContentStatus::Current
        );
        crate::approve_all(&lab).await;
        let real = lab.service.page(100).unwrap();
        assert_eq!(real.labels, vec!["urgent"], "{policy}");
        assert_eq!(real.comments[0].id, 1000);
        assert_eq!(real.status, ContentStatus::Current);
        let view = agent.read(&page).await.unwrap();
        assert_eq!(view.comments[0].id, "1000");
        assert_eq!(view.pending_changes, 0);
    }
}

#[tokio::test]
async fn child_listings_show_pending_children_under_either_spelling() {
    let lab = Lab::new(Policy::GUARDED);
    let agent = lab.session("agent");
    let parent = agent.create_page("OPS", "Parent", "").await.unwrap();
    let child = agent.create_child_page(&parent, "Child", "").await.unwrap();
    let listed = agent.children(&parent).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].handle, listed[0].title.as_str()),
        (child, "Child")
    );
    let ids = lab.open_ids().unwrap();
    lab.overseer.approve(ids[0], "ana").await.unwrap();
    // The parent is real now; the child is still pending, and listed under 200.
    let under_real = agent.children(&ContentHandle::Real(200)).await.unwrap();
    assert_eq!(under_real[0].handle, child);
    lab.overseer.approve(ids[1], "ana").await.unwrap();
    let listed = agent.children(&parent).await.unwrap();
    assert_eq!(listed[0].handle, ContentHandle::Real(201));
}

#[tokio::test]
async fn a_submission_the_kernel_refuses_stages_nothing() {
    let lab = Lab::new(Policy::GUARDED);
    let agent = lab.session("agent");
    let queue = lab.overseer.queue_for("confluence", "agent").unwrap();
    queue
        .authorize_observation(ObservationDescription {
            prohibit_all_sharing: true,
            ..ObservationDescription::new("a secret", "")
        })
        .await
        .unwrap();
    let refused = agent.create_page("OPS", "Leak", "secret").await;
    assert_eq!(refused, Err(WikiError::Queue(QueueError::LockedDown)));
    assert_eq!(lab.wiki.pending_count(), 0);
    assert!(
        lab.kv.scan_prefix("action:").unwrap().is_empty(),
        "the record was withdrawn"
    );
    assert!(agent.open("~1").await.is_err());
}

#[tokio::test]
async fn a_session_remembers_only_what_its_reads_showed() {
    let lab = lab_with_manual(Policy::GUARDED, "Manual", "original");
    let agent = lab.session("agent");
    let other = lab.session("other agent");
    let page = agent.open("100").await.unwrap();
    // Staged by two other agents, so only the reads make them known to this one.
    let append = lab
        .session("third agent")
        .append_content(&page, "Y")
        .await
        .unwrap();
    let set = other.set_content(&page, "X").await.unwrap();
    assert_eq!(agent.body(&page).await.unwrap(), "X");
    assert_eq!(
        agent.seen(),
        vec![set.action],
        "the wiped-out append was not seen"
    );
    assert!(other.seen().is_empty(), "memory is per session");
    let label = agent.add_label(&page, "checked").await.unwrap();
    let entry = lab.entry(label.ledger).unwrap();
    assert_eq!(entry.action().unwrap().depends_on, vec![set.ledger]);
    // Transitive: a read of the label shows it, and the label depended on the replace.
    agent.labels(&page).await.unwrap();
    let comment = agent.add_comment(&page, "done").await.unwrap();
    let entry = lab.entry(comment.ledger).unwrap();
    let mut deps = entry.action().unwrap().depends_on.clone();
    deps.sort();
    assert_eq!(deps, vec![set.ledger, label.ledger]);
    assert!(!deps.contains(&append.ledger));
}

#[tokio::test]
async fn the_reference_remembers_nothing() {
    let lab = lab_with_manual(Policy::REFERENCE, "Manual", "original");
    let agent = lab.session("agent");
    let page = agent.open("100").await.unwrap();
    agent.set_title(&page, "New").await.unwrap();
    agent.read(&page).await.unwrap();
    let comment = agent.add_comment(&page, "renamed to New").await.unwrap();
    assert!(agent.seen().is_empty());
    assert!(
        lab.entry(comment.ledger)
            .unwrap()
            .action()
            .unwrap()
            .depends_on
            .is_empty()
    );
}

#[tokio::test]
async fn dependencies_are_carried_transitively_across_sessions() {
    let lab = lab_with_manual(Policy::GUARDED, "Draft", "procedure");
    let first = lab.session("first agent");
    let second = lab.session("second agent");
    let page = first.open("100").await.unwrap();
    let retitle = first.set_title(&page, "Publishable").await.unwrap();
    assert_eq!(first.title(&page).await.unwrap(), "Publishable");
    let label = first.add_label(&page, "publishable").await.unwrap();
    // The second agent reads only the labels: it never saw the rename itself.
    assert_eq!(second.labels(&page).await.unwrap(), vec!["publishable"]);
    assert_eq!(second.seen(), vec![label.action]);
    let comment = second
        .add_comment(&page, "labelled publishable")
        .await
        .unwrap();
    let entry = lab.entry(comment.ledger).unwrap();
    let mut deps = entry.action().unwrap().depends_on.clone();
    deps.sort();
    assert_eq!(deps, vec![retitle.ledger, label.ledger]);
    let report = lab.overseer.reject(retitle.ledger, "ana").await.unwrap();
    assert_eq!(report.flagged, vec![label.ledger, comment.ledger]);
}

#[tokio::test]
async fn reading_content_not_yet_created_depends_on_its_create() {
    let lab = lab_with_manual(Policy::GUARDED, "Index", "");
    let agent = lab.session("agent");
    let index = agent.open("100").await.unwrap();
    let plan = agent.create_page("OPS", "Plan", "").await.unwrap();
    assert_eq!(agent.title(&plan).await.unwrap(), "Plan");
    let link = agent.append_content(&index, "See Plan").await.unwrap();
    let create = lab.open_ids().unwrap()[0];
    let report = lab.overseer.reject(create, "ana").await.unwrap();
    assert!(report.cascaded.is_empty(), "the link is on another page");
    assert_eq!(report.flagged, vec![link.ledger]);
}

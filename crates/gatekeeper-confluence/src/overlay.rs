//! The simulation: how pending actions are folded over the wiki's state at read time.
//!
//! These are the reference's rules, as pure functions over the pending
//! records of one content, in ascending action id (staging order):
//!
//! - title: every set-title and create overwrites it, so the latest wins;
//! - body: start from the base (empty when the content does not exist yet); a set
//!   replaces it, an append joins with a blank line (no separator on an empty body), and
//!   a create seeds it only when there is no base;
//! - labels: add if absent, remove the first occurrence, order kept;
//! - comments: pending ones after the existing ones, with ids `~comment-<action id>`;
//! - status: the last trash or restore wins.
//!
//! Nothing here is cached or written: a rejected action simply stops being folded in.
//! Each function also reports which records *visibly* contributed to what it returns,
//! so a session can remember what the agent has seen (pitfall 2): an append that a later
//! replace wiped out, for example, contributed nothing.

use kernel::DriverActionId;

use crate::record::{ActionRecord, ContentStatus, WikiAction};

/// A comment as the agent sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommentView {
    /// The real id, or `~comment-<action id>` for a pending comment.
    pub id: String,
    /// The comment, Markdown.
    pub text: String,
    /// Who wrote it; `None` for a pending comment.
    pub author: Option<String>,
}

/// The simulated title and the record that set it, if a pending one did.
pub fn simulate_title<'a>(
    records: impl IntoIterator<Item = &'a ActionRecord>,
    base: &str,
) -> (String, Option<DriverActionId>) {
    let mut title: Option<(&str, DriverActionId)> = None;
    for record in records {
        match &record.action {
            WikiAction::SetTitle { title: t, .. } | WikiAction::Create { title: t, .. } => {
                title = Some((t, record.id));
            }
            _ => {}
        }
    }
    match title {
        Some((t, id)) => (t.to_owned(), Some(id)),
        None => (base.to_owned(), None),
    }
}

/// The simulated body (Markdown), and the records that visibly contributed to it.
///
/// `base` is `None` when the content does not exist yet.
pub fn simulate_body(
    records: &[&ActionRecord],
    base: Option<&str>,
    contributors: &mut Vec<DriverActionId>,
) -> String {
    // Only the last replace and what follows it can be seen; start there.
    let last_set = records
        .iter()
        .rposition(|r| matches!(r.action, WikiAction::SetContent { .. }));
    let (start, mut body) = match last_set {
        Some(at) => (at, String::new()),
        None => (0, base.unwrap_or("").to_owned()),
    };
    for record in &records[start..] {
        match &record.action {
            WikiAction::SetContent { markdown, .. } => {
                body.clear();
                body.push_str(markdown);
                contributors.push(record.id);
            }
            WikiAction::AppendContent { markdown, .. } => {
                if !body.is_empty() {
                    body.push_str("\n\n");
                }
                body.push_str(markdown);
                contributors.push(record.id);
            }
            WikiAction::Create {
                content: Some(content),
                ..
            } if base.is_none() && !content.is_empty() => {
                body.clear();
                body.push_str(content);
                contributors.push(record.id);
            }
            _ => {}
        }
    }
    body
}

/// The simulated labels, and whether any pending record touched them.
pub fn simulate_labels(
    records: &[&ActionRecord],
    base: &[String],
    contributors: &mut Vec<DriverActionId>,
) -> Vec<String> {
    let mut labels = base.to_vec();
    for record in records {
        match &record.action {
            WikiAction::AddLabel { name, .. } => {
                if !labels.iter().any(|l| l == name) {
                    labels.push(name.clone());
                }
                contributors.push(record.id);
            }
            WikiAction::RemoveLabel { name, .. } => {
                if let Some(at) = labels.iter().position(|l| l == name) {
                    labels.remove(at);
                }
                contributors.push(record.id);
            }
            _ => {}
        }
    }
    labels
}

/// The simulated comments: the existing ones, then the pending ones in order.
pub fn simulate_comments(
    records: &[&ActionRecord],
    mut base: Vec<CommentView>,
    contributors: &mut Vec<DriverActionId>,
) -> Vec<CommentView> {
    for record in records {
        if let WikiAction::AddComment { text, .. } = &record.action {
            base.push(CommentView {
                id: format!("~comment-{}", record.id),
                text: text.clone(),
                author: None,
            });
            contributors.push(record.id);
        }
    }
    base
}

/// The status a pending trash or restore leads to (the last one wins), if any.
pub fn simulate_trashed(
    records: &[&ActionRecord],
    contributors: &mut Vec<DriverActionId>,
) -> Option<ContentStatus> {
    let last = records.iter().rev().find(|r| {
        matches!(
            r.action,
            WikiAction::Trash { .. } | WikiAction::Restore { .. }
        )
    })?;
    contributors.push(last.id);
    Some(match last.action {
        WikiAction::Trash { .. } => ContentStatus::Trashed,
        _ => ContentStatus::Current,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handle::ContentHandle;
    use crate::record::{ContentKind, Parent};

    const PAGE: ContentHandle = ContentHandle::Real(100);

    fn record(id: u64, action: WikiAction) -> ActionRecord {
        ActionRecord::pending(id, action)
    }

    fn set(id: u64, md: &str) -> ActionRecord {
        record(
            id,
            WikiAction::SetContent {
                target: PAGE,
                markdown: md.into(),
            },
        )
    }

    fn append(id: u64, md: &str) -> ActionRecord {
        record(
            id,
            WikiAction::AppendContent {
                target: PAGE,
                markdown: md.into(),
            },
        )
    }

    fn body(records: &[ActionRecord], base: Option<&str>) -> (String, Vec<u64>) {
        let refs: Vec<&ActionRecord> = records.iter().collect();
        let mut seen = Vec::new();
        let body = simulate_body(&refs, base, &mut seen);
        (body, seen.into_iter().map(|d| d.0).collect())
    }

    #[test]
    fn set_then_append_joins_with_a_blank_line() {
        assert_eq!(
            body(&[set(1, "base"), append(2, "tail")], Some("old")),
            ("base\n\ntail".into(), vec![1, 2])
        );
    }

    #[test]
    fn append_then_set_keeps_only_the_set_and_the_append_was_not_seen() {
        assert_eq!(
            body(&[append(1, "Y"), set(2, "X")], Some("old")),
            ("X".into(), vec![2])
        );
    }

    #[test]
    fn append_to_an_empty_body_has_no_separator() {
        assert_eq!(body(&[append(1, "Y")], Some("")), ("Y".into(), vec![1]));
        assert_eq!(body(&[], Some("base")), ("base".into(), vec![]));
    }

    #[test]
    fn a_create_seeds_the_body_only_without_a_base() {
        let create = record(
            1,
            WikiAction::Create {
                provisional: 2,
                kind: ContentKind::Page,
                parent: Parent::Space {
                    space: "OPS".into(),
                },
                title: "Child".into(),
                content: Some("stop".into()),
                status: ContentStatus::Current,
            },
        );
        let records = [create, append(2, "revert to old version")];
        assert_eq!(
            body(&records, None),
            ("stop\n\nrevert to old version".into(), vec![1, 2])
        );
        assert_eq!(
            body(&records, Some("real")).0,
            "real\n\nrevert to old version"
        );
    }

    #[test]
    fn latest_title_wins_and_labels_follow_the_reference_example() {
        let records = [
            record(
                1,
                WikiAction::SetTitle {
                    target: PAGE,
                    title: "A".into(),
                },
            ),
            record(
                2,
                WikiAction::SetTitle {
                    target: PAGE,
                    title: "B".into(),
                },
            ),
        ];
        assert_eq!(
            simulate_title(&records, "base"),
            ("B".into(), Some(DriverActionId(2)))
        );
        let label = |id, add: bool, name: &str| {
            let name = name.to_owned();
            record(
                id,
                if add {
                    WikiAction::AddLabel { target: PAGE, name }
                } else {
                    WikiAction::RemoveLabel { target: PAGE, name }
                },
            )
        };
        let records = [
            label(1, true, "urgent"),
            label(2, true, "urgent"),
            label(3, true, "draft"),
            label(4, false, "old"),
        ];
        let refs: Vec<&ActionRecord> = records.iter().collect();
        let mut seen = Vec::new();
        let labels = simulate_labels(&refs, &["old".into(), "keep".into()], &mut seen);
        assert_eq!(labels, vec!["keep", "urgent", "draft"]);
    }

    #[test]
    fn pending_comments_come_after_existing_ones() {
        let records = [record(
            7,
            WikiAction::AddComment {
                target: PAGE,
                text: "new".into(),
            },
        )];
        let refs: Vec<&ActionRecord> = records.iter().collect();
        let existing = CommentView {
            id: "1000".into(),
            text: "old".into(),
            author: Some("ana".into()),
        };
        let mut seen = Vec::new();
        let comments = simulate_comments(&refs, vec![existing.clone()], &mut seen);
        assert_eq!(comments[0], existing);
        assert_eq!(comments[1].id, "~comment-7");
        assert_eq!(comments[1].author, None);
    }
}

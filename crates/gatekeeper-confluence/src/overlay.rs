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
//! The functions fold anything that is [`Pending`]: the driver's index, whose records
//! keep their texts in the encoded value they share with the key-value store (texts are
//! joined as bytes, and the result checked as UTF-8 once), or plain [`ActionRecord`]s.
//!
//! Nothing here is cached or written: a rejected action simply stops being folded in.
//! Each function also reports which records *visibly* contributed to what it returns,
//! so a session can remember what the agent has seen (pitfall 2): an append that a later
//! replace wiped out, for example, contributed nothing.

use kernel::DriverActionId;

use crate::record::{ActionRecord, ContentStatus, WikiActionOf};

/// A pending action as the overlay folds it: its id, its action, and the bytes of each
/// text the action holds. The driver folds its in-memory index, whose records hold
/// their texts as spans of the stored value (nothing is decoded on a read); an
/// [`ActionRecord`] holds them as `String`s.
pub trait Pending {
    /// How the action holds its texts.
    type Text;
    /// The driver's id of the action.
    fn id(&self) -> DriverActionId;
    /// What the action does.
    fn action(&self) -> &WikiActionOf<Self::Text>;
    /// The UTF-8 bytes of one of the action's texts.
    fn text<'s>(&'s self, text: &'s Self::Text) -> &'s [u8];
}

impl Pending for ActionRecord {
    type Text = String;

    fn id(&self) -> DriverActionId {
        self.id
    }

    fn action(&self) -> &WikiActionOf<String> {
        &self.action
    }

    fn text<'s>(&'s self, text: &'s String) -> &'s [u8] {
        text.as_bytes()
    }
}

/// A text the overlay folded, as a `String`. Every piece is UTF-8 (a `&str`, or a span
/// whose UTF-8 was checked when its record was indexed), so nothing is ever replaced:
/// this is the one check that turns the bytes back into text.
pub(crate) fn into_text(text: Vec<u8>) -> String {
    String::from_utf8(text).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// [`into_text`], for a borrowed text.
pub(crate) fn copy_text(text: &[u8]) -> String {
    String::from_utf8_lossy(text).into_owned()
}

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
pub fn simulate_title<'a, R: Pending + 'a>(
    records: impl IntoIterator<Item = &'a R>,
    base: &str,
) -> (String, Option<DriverActionId>) {
    let mut title: Option<(&[u8], DriverActionId)> = None;
    for record in records {
        match record.action() {
            WikiActionOf::SetTitle { title: t, .. } | WikiActionOf::Create { title: t, .. } => {
                title = Some((record.text(t), record.id()));
            }
            _ => {}
        }
    }
    match title {
        Some((t, id)) => (copy_text(t), Some(id)),
        None => (base.to_owned(), None),
    }
}

/// The simulated body (Markdown), and the records that visibly contributed to it.
///
/// `base` is `None` when the content does not exist yet.
pub fn simulate_body<R: Pending>(
    records: &[&R],
    base: Option<&str>,
    contributors: &mut Vec<DriverActionId>,
) -> String {
    // Only the last replace and what follows it can be seen: scan back to it, adding up
    // the texts from there on, so the body is joined in one buffer sized once.
    let mut start = None;
    let mut most = 0;
    for (at, record) in records.iter().enumerate().rev() {
        match record.action() {
            WikiActionOf::SetContent { markdown, .. } => {
                most += record.text(markdown).len();
                start = Some(at);
                break;
            }
            WikiActionOf::AppendContent { markdown: text, .. }
            | WikiActionOf::Create {
                content: Some(text),
                ..
            } => most += record.text(text).len() + 2,
            _ => {}
        }
    }
    let (records, from) = match start {
        Some(at) => (&records[at..], ""),
        None => (records, base.unwrap_or("")),
    };
    most += from.len();
    let mut body = Vec::with_capacity(most);
    body.extend_from_slice(from.as_bytes());
    for record in records {
        match record.action() {
            WikiActionOf::SetContent { markdown, .. } => {
                body.clear();
                body.extend_from_slice(record.text(markdown));
                contributors.push(record.id());
            }
            WikiActionOf::AppendContent { markdown, .. } => {
                if !body.is_empty() {
                    body.extend_from_slice(b"\n\n");
                }
                body.extend_from_slice(record.text(markdown));
                contributors.push(record.id());
            }
            WikiActionOf::Create {
                content: Some(content),
                ..
            } if base.is_none() && !record.text(content).is_empty() => {
                body.clear();
                body.extend_from_slice(record.text(content));
                contributors.push(record.id());
            }
            _ => {}
        }
    }
    into_text(body)
}

/// The simulated labels, and whether any pending record touched them.
pub fn simulate_labels<R: Pending>(
    records: &[&R],
    base: &[String],
    contributors: &mut Vec<DriverActionId>,
) -> Vec<String> {
    let mut labels = base.to_vec();
    for record in records {
        match record.action() {
            WikiActionOf::AddLabel { name, .. } => {
                let name = record.text(name);
                if !labels.iter().any(|l| l.as_bytes() == name) {
                    labels.push(copy_text(name));
                }
                contributors.push(record.id());
            }
            WikiActionOf::RemoveLabel { name, .. } => {
                let name = record.text(name);
                if let Some(at) = labels.iter().position(|l| l.as_bytes() == name) {
                    labels.remove(at);
                }
                contributors.push(record.id());
            }
            _ => {}
        }
    }
    labels
}

/// The simulated comments: the existing ones, then the pending ones in order.
pub fn simulate_comments<R: Pending>(
    records: &[&R],
    mut base: Vec<CommentView>,
    contributors: &mut Vec<DriverActionId>,
) -> Vec<CommentView> {
    for record in records {
        if let WikiActionOf::AddComment { text, .. } = record.action() {
            base.push(CommentView {
                id: format!("~comment-{}", record.id()),
                text: copy_text(record.text(text)),
                author: None,
            });
            contributors.push(record.id());
        }
    }
    base
}

/// The status a pending trash or restore leads to (the last one wins), if any.
pub fn simulate_trashed<R: Pending>(
    records: &[&R],
    contributors: &mut Vec<DriverActionId>,
) -> Option<ContentStatus> {
    let last = records.iter().rev().find(|r| {
        matches!(
            r.action(),
            WikiActionOf::Trash { .. } | WikiActionOf::Restore { .. }
        )
    })?;
    contributors.push(last.id());
    Some(match last.action() {
        WikiActionOf::Trash { .. } => ContentStatus::Trashed,
        _ => ContentStatus::Current,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handle::ContentHandle;
    use crate::record::{ContentKind, Parent, WikiAction};

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

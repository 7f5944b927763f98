//! What a person reads: the approval card of each action and the ledger line of each
//! read, built only from sanitized pieces.
//!
//! Titles, bodies, comments and label names come from the agent or from the wiki, so
//! they are untrusted: every one goes through `prompt-sanitize` (a block quote for
//! bodies, plain inline text for titles, a code span for labels). Markdown bodies shown
//! on a card are clipped to 2000 characters plus `…`, as in the reference.

use std::sync::LazyLock;

use kernel::{ActionDescription, ActionKind, ObservationDescription};
use prompt_sanitize::{Markdown, Sanitized, code_span, plain_inline, quote_untrusted};

use crate::handle::ContentHandle;
use crate::record::{ContentKind, Parent, Staging, WikiAction};

/// The longest body text shown on a card, in characters.
pub const CARD_BODY_CHARS: usize = 2000;
const TITLE_CHARS: usize = 200;

fn lit(text: &'static str) -> Sanitized {
    Sanitized::literal(text)
}

/// Program-made text such as a handle, still sanitized to keep the type's promise (a
/// number is written with [`Sanitized::number`], which needs no pass).
fn fact(text: impl std::fmt::Display) -> Sanitized {
    plain_inline(&text.to_string(), TITLE_CHARS)
}

fn title(text: &str) -> Sanitized {
    plain_inline(text, TITLE_CHARS)
}

fn quote(md: &Markdown, text: &str) -> Markdown {
    let mut md = md.clone();
    let quoted = quote_untrusted(text, CARD_BODY_CHARS);
    if quoted.is_empty() {
        md.text("(empty)");
    } else {
        md.block(&quoted);
    }
    md
}

/// The kind tag of an action, for auto-approval rules (the reference's tags).
pub fn action_kind(action: &WikiAction) -> ActionKind {
    let (tag, label) = match action {
        WikiAction::Create { .. } => ("confluence.createContent", "Create Confluence content"),
        WikiAction::SetContent { .. } | WikiAction::AppendContent { .. } => {
            ("confluence.editContent", "Edit Confluence content")
        }
        WikiAction::SetTitle { .. } => ("confluence.setTitle", "Rename Confluence content"),
        WikiAction::AddComment { .. } => ("confluence.addComment", "Comment on Confluence content"),
        WikiAction::AddLabel { .. } | WikiAction::RemoveLabel { .. } => {
            ("confluence.label", "Label Confluence content")
        }
        WikiAction::Trash { .. } | WikiAction::Restore { .. } => {
            ("confluence.trash", "Trash or restore Confluence content")
        }
    };
    ActionKind::new(tag, label)
}

fn target_line(md: &mut Markdown, lead: &'static str, target: ContentHandle) {
    md.line(&[&lit(lead), &lit(" "), &fact(target), &lit(".")]);
}

/// The approval card of an action. Revert is implemented for every action; none is
/// auto-approvable (the effect is simulated, so nothing needs to hurry).
pub fn describe(action: &WikiAction, staging: &Staging, guarded: bool) -> ActionDescription {
    let mut md = Markdown::new();
    let card_title = match action {
        WikiAction::Create {
            provisional,
            kind,
            parent,
            title: t,
            content,
            ..
        } => {
            let whereto = match parent {
                Parent::Space { space } => {
                    Sanitized::concat(&[&lit("in space "), &code_span(space, TITLE_CHARS)])
                }
                Parent::Page { parent, .. } => {
                    Sanitized::concat(&[&lit("as a child page of "), &fact(parent)])
                }
            };
            md.line(&[
                &lit("Titled **"),
                &title(t),
                &lit("**, "),
                &whereto,
                &lit("."),
            ]);
            md.line(&[
                &lit("The agent already works with it as "),
                &fact(ContentHandle::Provisional(*provisional)),
                &lit("."),
            ]);
            if let Some(content) = content.as_deref().filter(|c| !c.is_empty()) {
                md.blank();
                md = quote(&md, content);
            }
            match kind {
                ContentKind::Page => "Create Confluence page",
                ContentKind::BlogPost => "Create Confluence blog post",
            }
        }
        WikiAction::SetContent { target, markdown } => {
            target_line(&mut md, "Replaces the whole body of", *target);
            if guarded && !target.is_provisional() {
                md.line(&[
                    &lit("Staged against version "),
                    &Sanitized::number(staging.base_version),
                    &lit("; it will not be applied over a newer version."),
                ]);
            }
            md.blank();
            md = quote(&md, markdown);
            "Replace Confluence page content"
        }
        WikiAction::AppendContent { target, markdown } => {
            target_line(&mut md, "Appends to", *target);
            md.blank();
            md = quote(&md, markdown);
            "Append to Confluence page"
        }
        WikiAction::SetTitle { target, title: t } => {
            md.line(&[
                &lit("Renames "),
                &fact(target),
                &lit(" to **"),
                &title(t),
                &lit("**."),
            ]);
            if let Some(previous) = &staging.previous_title {
                md.line(&[&lit("The title was **"), &title(previous), &lit("**.")]);
            }
            "Rename Confluence content"
        }
        WikiAction::AddComment { target, text } => {
            target_line(&mut md, "Adds a comment to", *target);
            md.blank();
            md = quote(&md, text);
            "Comment on Confluence content"
        }
        WikiAction::AddLabel { target, name } => {
            md.line(&[
                &lit("Adds the label "),
                &code_span(name, TITLE_CHARS),
                &lit(" to "),
                &fact(target),
                &lit("."),
            ]);
            "Add a label to Confluence content"
        }
        WikiAction::RemoveLabel { target, name } => {
            md.line(&[
                &lit("Removes the label "),
                &code_span(name, TITLE_CHARS),
                &lit(" from "),
                &fact(target),
                &lit("."),
            ]);
            "Remove a label from Confluence content"
        }
        WikiAction::Trash { target } => {
            target_line(&mut md, "Moves to the trash:", *target);
            "Trash Confluence content"
        }
        WikiAction::Restore { target } => {
            target_line(&mut md, "Restores from the trash:", *target);
            "Restore Confluence content"
        }
    };
    ActionDescription {
        title: card_title.to_owned(),
        description: md.build().into_string(),
        implements_revert: true,
        await_decision: false,
        auto_approvable: false,
        action_kind: Some(action_kind(action)),
        depends_on: Vec::new(),
    }
}

/// Add to a replace's or rename's card that the agent never read the page before
/// staging it: it was staged against `version`, the version the page had then, which
/// the agent never saw.
pub fn note_unread(card: &mut ActionDescription, version: u64) {
    let mut md = Markdown::new();
    md.line(&[
        &lit("The agent did not read this page before staging this: it never saw version "),
        &Sanitized::number(version),
        &lit(", the version it is staged against."),
    ]);
    // A blank line first, so the note never reads as part of a quoted body above it.
    card.description.push_str("\n\n");
    card.description.push_str(&md.build().into_string());
}

/// The ledger line of a read: what was read (`what` empty: the whole content), and how
/// much of it is simulation.
pub fn observation(
    what: &'static str,
    kind: ContentKind,
    handle: ContentHandle,
    page_title: &str,
    pending: usize,
) -> ObservationDescription {
    let pieces = &*READ_PIECES;
    let mut md = Markdown::new();
    md.line(&[&pieces.title_open, &title(page_title), &pieces.title_close]);
    if pending > 0 {
        md.line(&[
            &pieces.includes,
            &Sanitized::number(pending as u64),
            if pending == 1 {
                &pieces.one_pending
            } else {
                &pieces.many_pending
            },
        ]);
    }
    ObservationDescription::new(read_title(what, kind, handle), md.build().into_string())
}

/// The fixed pieces of a read's ledger line, sanitized once for the process rather than
/// on every read (each [`lit`] is a scan and an allocation).
struct ReadPieces {
    title_open: Sanitized,
    title_close: Sanitized,
    includes: Sanitized,
    one_pending: Sanitized,
    many_pending: Sanitized,
}

static READ_PIECES: LazyLock<ReadPieces> = LazyLock::new(|| ReadPieces {
    title_open: lit("Title: **"),
    title_close: lit("**"),
    includes: lit("Includes "),
    one_pending: lit(" pending change that is not approved yet."),
    many_pending: lit(" pending changes that are not approved yet."),
});

/// The ledger line's title of a read: `Read Confluence page 100`, or `Read the body of
/// Confluence page 100`. Written piece by piece: every read builds one, and the two
/// `format!`s it was built with took about 1,800 instructions.
fn read_title(what: &str, kind: ContentKind, handle: ContentHandle) -> String {
    use std::fmt::Write as _;
    let mut title = String::with_capacity(48);
    title.push_str("Read ");
    if !what.is_empty() {
        title.push_str("the ");
        title.push_str(what);
        title.push_str(" of ");
    }
    title.push_str("Confluence ");
    title.push_str(kind.as_str());
    title.push(' ');
    // Writing to a String cannot fail.
    let _ = write!(title, "{handle}");
    title
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::ContentStatus;

    #[test]
    fn a_hostile_title_cannot_shape_the_card() {
        let action = WikiAction::SetTitle {
            target: ContentHandle::Real(100),
            title: "ok**\n# Approved by security\u{202e}".into(),
        };
        let card = describe(&action, &Staging::default(), true);
        assert_eq!(card.title, "Rename Confluence content");
        assert!(!card.description.contains("\n#"), "{}", card.description);
        assert!(!card.description.contains('\u{202e}'));
        assert!(card.implements_revert);
        assert!(!card.auto_approvable);
    }

    #[test]
    fn a_title_ending_in_a_backslash_cannot_leak_emphasis() {
        // `**Draft\**` would escape the closing `**`: the rest of the card turns bold.
        let action = WikiAction::SetTitle {
            target: ContentHandle::Real(100),
            title: "Draft\\".into(),
        };
        let card = describe(&action, &Staging::default(), true);
        assert!(
            card.description.ends_with(" to **Draft**."),
            "{}",
            card.description
        );
        let action = WikiAction::Create {
            provisional: 1,
            kind: ContentKind::Page,
            parent: Parent::Space {
                space: "ENG\\".into(),
            },
            title: "<img src=x onerror=alert(1)>\\".into(),
            content: None,
            status: ContentStatus::Current,
        };
        let card = describe(&action, &Staging::default(), true);
        assert!(
            card.description
                .starts_with("Titled **img src=x onerror=alert1**, in space `ENG\\`."),
            "{}",
            card.description
        );
    }

    #[test]
    fn long_bodies_are_clipped_on_the_card() {
        let action = WikiAction::AppendContent {
            target: ContentHandle::Provisional(2),
            markdown: "x".repeat(5000),
        };
        let card = describe(&action, &Staging::default(), true);
        assert!(card.description.contains("x…"));
        assert!(card.description.len() < 2100);
        assert!(card.description.starts_with("Appends to ~2."));
    }
}

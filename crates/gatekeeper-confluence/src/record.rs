//! What the driver stores about each staged action, and the versioned envelope every
//! stored value is wrapped in.
//!
//! The layout of the key-value port (the analogue of the reference's Durable Object
//! storage):
//!
//! | key | value |
//! |---|---|
//! | `seq:action` | [`StoredV1::Counter`]: the next action id (first is 1) |
//! | `seq:provisional` | [`StoredV1::Counter`]: the next `~N` (first is 1) |
//! | `action:<id, 20 digits>` | [`StoredV1::Action`]: one [`ActionRecord`] |
//! | `prov:~<N>` | [`StoredV1::Provisional`]: the real id a create made |
//! | `space:<KEY>` | [`StoredV1::Space`]: the space's numeric id, cached forever |
//!
//! Action keys are zero-padded so that the port's key order is the id order (the
//! reference has to re-sort because `action:10` lists before `action:2`). A record keeps
//! its `state`; rejected records are deleted, as in the reference: the kernel's ledger
//! is the audit trail.

use serde::{Deserialize, Serialize};

use kernel::{DriverActionId, LedgerId, Timestamp};

use crate::handle::ContentHandle;

/// A page or a blog post.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ContentKind {
    /// A page; may have child pages.
    Page,
    /// A blog post; never has children.
    BlogPost,
}

impl ContentKind {
    /// Lower-case name for people: "page" or "blog post".
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Page => "page",
            Self::BlogPost => "blog post",
        }
    }
}

/// Where content is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ContentStatus {
    /// Published.
    Current,
    /// Saved but not published.
    Draft,
    /// In the trash; can be restored.
    Trashed,
}

impl ContentStatus {
    /// Lower-case name, as the wiki spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Current => "current",
            Self::Draft => "draft",
            Self::Trashed => "trashed",
        }
    }
}

/// Where a create puts the new content, as a record holds it.
pub type Parent = ParentOf<String>;

/// Where a create puts the new content; `T` is how the space key is held (see
/// [`WikiActionOf`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ParentOf<T> {
    /// At the top of a space.
    Space {
        /// The space key.
        space: T,
    },
    /// Under a page, real or provisional.
    Page {
        /// The parent, as the agent named it (a `~N` stays `~N` in the record).
        parent: ContentHandle,
        /// The space of the parent.
        space: T,
    },
}

impl<T> ParentOf<T> {
    /// The space key the content goes into.
    pub fn space(&self) -> &T {
        match self {
            Self::Space { space } | Self::Page { space, .. } => space,
        }
    }

    /// The parent page, if any.
    pub fn page(&self) -> Option<ContentHandle> {
        match self {
            Self::Space { .. } => None,
            Self::Page { parent, .. } => Some(*parent),
        }
    }

    /// The same place, with its text held as `f` turns it.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> ParentOf<U> {
        match self {
            Self::Space { space } => ParentOf::Space { space: f(space) },
            Self::Page { parent, space } => ParentOf::Page {
                parent,
                space: f(space),
            },
        }
    }
}

/// One side effect the agent asked for, as a record holds it (its text as `String`).
pub type WikiAction = WikiActionOf<String>;

/// One side effect the agent asked for. Every action targets exactly one content handle.
///
/// `T` is how the action's text (bodies, titles, labels, comments, space keys) is held:
/// `String` in an [`ActionRecord`] ([`WikiAction`]), `&str` borrowed from a stored
/// value while it is read, and a span of that stored value in the driver's in-memory
/// index, which thereby holds no second copy of the text. The encoding is the same for
/// every `T` that serializes as a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WikiActionOf<T> {
    /// Create a page or blog post, known as `~provisional` until applied.
    Create {
        /// The provisional number: the content is `~provisional`.
        provisional: u64,
        /// Page or blog post.
        kind: ContentKind,
        /// Where it goes.
        parent: ParentOf<T>,
        /// Its title at creation.
        title: T,
        /// Its body at creation, Markdown.
        content: Option<T>,
        /// `Current` or `Draft`.
        status: ContentStatus,
    },
    /// Replace the whole body.
    SetContent {
        /// The content.
        target: ContentHandle,
        /// The new body, Markdown.
        markdown: T,
    },
    /// Add to the end of the body.
    AppendContent {
        /// The content.
        target: ContentHandle,
        /// The text to add, Markdown.
        markdown: T,
    },
    /// Rename.
    SetTitle {
        /// The content.
        target: ContentHandle,
        /// The new title.
        title: T,
    },
    /// Add a footer comment.
    AddComment {
        /// The content.
        target: ContentHandle,
        /// The comment, Markdown.
        text: T,
    },
    /// Add a label.
    AddLabel {
        /// The content.
        target: ContentHandle,
        /// The label.
        name: T,
    },
    /// Remove a label.
    RemoveLabel {
        /// The content.
        target: ContentHandle,
        /// The label.
        name: T,
    },
    /// Move to the trash.
    Trash {
        /// The content.
        target: ContentHandle,
    },
    /// Restore from the trash.
    Restore {
        /// The content.
        target: ContentHandle,
    },
}

impl<T> WikiActionOf<T> {
    /// The content this action is aimed at (for a create, its own `~N`).
    pub fn target(&self) -> ContentHandle {
        match self {
            Self::Create { provisional, .. } => ContentHandle::Provisional(*provisional),
            Self::SetContent { target, .. }
            | Self::AppendContent { target, .. }
            | Self::SetTitle { target, .. }
            | Self::AddComment { target, .. }
            | Self::AddLabel { target, .. }
            | Self::RemoveLabel { target, .. }
            | Self::Trash { target }
            | Self::Restore { target } => *target,
        }
    }

    /// A short name for transcripts: `create`, `set content`, `append`, ….
    pub fn verb(&self) -> &'static str {
        match self {
            Self::Create { .. } => "create",
            Self::SetContent { .. } => "set content",
            Self::AppendContent { .. } => "append",
            Self::SetTitle { .. } => "set title",
            Self::AddComment { .. } => "comment",
            Self::AddLabel { .. } => "add label",
            Self::RemoveLabel { .. } => "remove label",
            Self::Trash { .. } => "trash",
            Self::Restore { .. } => "restore",
        }
    }

    /// The same action, with each of its texts held as `f` turns it.
    pub fn map<U>(self, mut f: impl FnMut(T) -> U) -> WikiActionOf<U> {
        match self {
            Self::Create {
                provisional,
                kind,
                parent,
                title,
                content,
                status,
            } => WikiActionOf::Create {
                provisional,
                kind,
                parent: parent.map(&mut f),
                title: f(title),
                content: content.map(&mut f),
                status,
            },
            Self::SetContent { target, markdown } => WikiActionOf::SetContent {
                target,
                markdown: f(markdown),
            },
            Self::AppendContent { target, markdown } => WikiActionOf::AppendContent {
                target,
                markdown: f(markdown),
            },
            Self::SetTitle { target, title } => WikiActionOf::SetTitle {
                target,
                title: f(title),
            },
            Self::AddComment { target, text } => WikiActionOf::AddComment {
                target,
                text: f(text),
            },
            Self::AddLabel { target, name } => WikiActionOf::AddLabel {
                target,
                name: f(name),
            },
            Self::RemoveLabel { target, name } => WikiActionOf::RemoveLabel {
                target,
                name: f(name),
            },
            Self::Trash { target } => WikiActionOf::Trash { target },
            Self::Restore { target } => WikiActionOf::Restore { target },
        }
    }
}

/// Where a staged action is in its life, as the driver sees it.
///
/// ```text
/// (stage) ──► pending ──claim──► applying ──sent──► applied ──revert──► reverted
///               │  ▲                 │
///               │  └─wiki refused────┘    (nothing changed there: approve again)
///               └──stale──► failed
/// applying ──(gatekeeper reopened)──► failed   (it may have landed: never re-sent)
/// ```
///
/// A rejected action is deleted, not kept. A failed apply that may be retried leaves
/// the record `pending`. The protocol that moves a record through `applying` is in
/// [the driver's docs](crate::gatekeeper#the-at-most-once-apply).
///
/// The variants are stored by their position (postcard), so a new state is only ever
/// added at the end: `Applying` came last, and records written before it existed still
/// decode unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RecordState {
    /// Staged, overlaid on reads, not yet sent.
    Pending,
    /// Sent; reads show the service's state instead of the overlay.
    Applied,
    /// Applied, then undone.
    Reverted,
    /// Refused for good at apply time, or interrupted after it may have been sent; no
    /// longer overlaid, never sent again. Stage it again to retry.
    Failed,
    /// Claimed by an apply: written before the request is sent, so the request may have
    /// reached the wiki. Not overlaid; a second apply is refused. A gatekeeper opened
    /// over a record left in this state marks it failed and never sends it.
    Applying,
}

/// What the driver captured when the action was staged.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Staging {
    /// The real version of the target when the action was staged; 0 when the target
    /// did not exist yet (its create was pending).
    pub base_version: u64,
    /// The simulated body at staging (set and append only): what the reference's
    /// revert writes back.
    pub previous_markdown: Option<String>,
    /// The simulated title at staging (set title only).
    pub previous_title: Option<String>,
}

/// A write that moved the content's version, recorded at apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionedWrite {
    /// The version the write replaced (0 for a create).
    pub before: u64,
    /// The version the write produced.
    pub after: u64,
    /// The body just before the write, in storage format, exactly as the service had it.
    pub previous_body: String,
    /// The title just before the write.
    pub previous_title: String,
}

/// What applying the action did, kept for revert and for the stale check.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// The id the service gave: the new page for a create, the new comment for a comment.
    pub created: Option<u64>,
    /// Set for every action that moved the content's version.
    pub write: Option<VersionedWrite>,
    /// For an append: exactly the storage fragment that was added.
    pub appended: Option<String>,
    /// For a label action under the guarded policy: whether it changed anything.
    pub label_changed: Option<bool>,
}

/// One staged action, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionRecord {
    /// The driver's id, passed to `submit_action`.
    pub id: DriverActionId,
    /// The kernel's id for it, once `submit_action` answered.
    pub ledger: Option<LedgerId>,
    /// What to do.
    pub action: WikiAction,
    /// Where it is in its life.
    pub state: RecordState,
    /// When it was staged.
    pub submitted_at: Timestamp,
    /// What was captured at staging.
    pub staging: Staging,
    /// What this action was built on: the pending actions whose simulated effect the
    /// agent had read before staging this, and the session's own latest undecided
    /// action (a chain, see the driver's `dependencies`).
    pub depends_on: Vec<DriverActionId>,
    /// What applying it did.
    pub applied: Option<Applied>,
    /// Why it failed for good, when `state` is `Failed`.
    pub failure: Option<String>,
}

#[cfg(test)]
impl ActionRecord {
    /// A pending record of `action` with driver id `id` and nothing else set: the fixture
    /// the unit tests of the overlay and the store build on.
    pub(crate) fn pending(id: u64, action: WikiAction) -> Self {
        Self {
            id: DriverActionId(id),
            ledger: None,
            action,
            state: RecordState::Pending,
            submitted_at: Timestamp(0),
            staging: Staging::default(),
            depends_on: Vec::new(),
            applied: None,
            failure: None,
        }
    }
}

impl ActionRecord {
    /// How people name this action: the ledger id (`#5`) once known, else the driver id.
    pub fn display_id(&self) -> String {
        display_id(self.id, self.ledger)
    }
}

/// How people name action `id`: by `ledger` (`#5`) once known, else by the driver id.
pub(crate) fn display_id(id: DriverActionId, ledger: Option<LedgerId>) -> String {
    match ledger {
        Some(ledger) => ledger.to_string(),
        None => format!("the wiki gatekeeper's action {id}"),
    }
}

/// The envelope of every stored value. postcard is not self-describing, so a reader
/// must know which layout it is reading: a new layout is a new variant, never a change
/// to an old one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum StoredRecord {
    /// The first layout.
    V1(StoredV1),
}

/// The values of layout 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum StoredV1 {
    /// A sequence counter: the next number to hand out.
    Counter(u64),
    /// A staged action (boxed: it is far larger than the other values).
    Action(Box<ActionRecord>),
    /// The real id a provisional handle resolved to.
    Provisional(u64),
    /// A space's numeric id.
    Space(u64),
}

impl StoredRecord {
    /// Encode for the key-value port.
    pub fn encode(&self) -> Vec<u8> {
        // Encoding plain owned data into a Vec cannot fail.
        postcard::to_stdvec(self).unwrap_or_default()
    }

    /// Decode a value read from the key-value port.
    pub fn decode(bytes: &[u8]) -> Result<Self, postcard::Error> {
        postcard::from_bytes(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_survives_the_envelope() {
        let record = ActionRecord {
            id: DriverActionId(3),
            ledger: Some(LedgerId(9)),
            action: WikiAction::Create {
                provisional: 2,
                kind: ContentKind::Page,
                parent: Parent::Page {
                    parent: ContentHandle::Provisional(1),
                    space: "OPS".into(),
                },
                title: "Child".into(),
                content: Some("stop".into()),
                status: ContentStatus::Current,
            },
            state: RecordState::Pending,
            submitted_at: Timestamp(5),
            staging: Staging::default(),
            depends_on: vec![DriverActionId(1)],
            applied: None,
            failure: None,
        };
        let stored = StoredRecord::V1(StoredV1::Action(Box::new(record)));
        let bytes = stored.encode();
        assert_eq!(StoredRecord::decode(&bytes).unwrap(), stored);
        assert!(StoredRecord::decode(&[7, 7]).is_err());
    }

    /// An append to page 100 as layout 1 stored it before `Applying` existed, with the
    /// state byte (offset 13) left out: 0 pending, 1 applied, 2 reverted, 3 failed.
    fn layout1_bytes(state: u8) -> Vec<u8> {
        let mut bytes = vec![
            0, 1, 3, 1, 9, 2, 0, 100, 4, 109, 111, 114, 101, 5, 2, 1, 3, 111, 108, 100, 0, 1, 1, 0,
            1, 5, 115, 116, 97, 108, 101,
        ];
        bytes.insert(13, state);
        bytes
    }

    fn layout1_record(state: RecordState) -> ActionRecord {
        ActionRecord {
            id: DriverActionId(3),
            ledger: Some(LedgerId(9)),
            action: WikiAction::AppendContent {
                target: ContentHandle::Real(100),
                markdown: "more".into(),
            },
            state,
            submitted_at: Timestamp(5),
            staging: Staging {
                base_version: 2,
                previous_markdown: Some("old".into()),
                previous_title: None,
            },
            depends_on: vec![DriverActionId(1)],
            applied: None,
            failure: Some("stale".into()),
        }
    }

    #[test]
    fn records_stored_before_the_applying_state_still_decode() {
        let states = [
            RecordState::Pending,
            RecordState::Applied,
            RecordState::Reverted,
            RecordState::Failed,
        ];
        for (byte, state) in (0u8..).zip(states) {
            let stored = StoredRecord::V1(StoredV1::Action(Box::new(layout1_record(state))));
            assert_eq!(
                StoredRecord::decode(&layout1_bytes(byte)).unwrap(),
                stored,
                "{state:?}"
            );
            assert_eq!(stored.encode(), layout1_bytes(byte), "{state:?}");
        }
    }

    #[test]
    fn an_applying_record_is_stored_after_the_old_states() {
        let stored = StoredRecord::V1(StoredV1::Action(Box::new(layout1_record(
            RecordState::Applying,
        ))));
        let bytes = stored.encode();
        assert_eq!(bytes, layout1_bytes(4));
        assert_eq!(StoredRecord::decode(&bytes).unwrap(), stored);
    }
}

//! What a session hands back to the agent: pages as simulated, and receipts for staged
//! actions.

use kernel::{DriverActionId, LedgerId};

use crate::handle::ContentHandle;
use crate::overlay::CommentView;
use crate::record::{ContentKind, ContentStatus};

/// A page or blog post as the agent sees it: the wiki's state with every pending action
/// of this content folded in (`overlay.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageView {
    /// The handle the agent asked with (a `~N` stays `~N`).
    pub handle: ContentHandle,
    /// What it resolves to now: the real id once the create was applied, else the `~N`.
    pub id: ContentHandle,
    /// Page or blog post.
    pub kind: ContentKind,
    /// The space key.
    pub space: String,
    /// The parent page, for a child page (resolved when possible).
    pub parent: Option<ContentHandle>,
    /// The title.
    pub title: String,
    /// The body, Markdown.
    pub body: String,
    /// The wiki's version; 0 while the content does not exist yet.
    pub version: u64,
    /// Current, draft or trashed (for content not yet created: the status its create asks
    /// for, where the reference always says draft).
    pub status: ContentStatus,
    /// Labels.
    pub labels: Vec<String>,
    /// Footer comments, existing ones first.
    pub comments: Vec<CommentView>,
    /// How many pending actions are folded into this view. The reference says nothing;
    /// this is the "(includes N pending changes)" of its Home Assistant driver.
    pub pending_changes: usize,
}

/// A child page in a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContentSummary {
    /// The real id, or `~N` for a child whose create is pending.
    pub handle: ContentHandle,
    /// Page or blog post.
    pub kind: ContentKind,
    /// The title, pending renames included.
    pub title: String,
    /// Its status.
    pub status: ContentStatus,
}

/// The receipt of a staged action: nothing has been sent yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Staged {
    /// The driver's id for the action.
    pub action: DriverActionId,
    /// The kernel's id, which people use to approve or reject it.
    pub ledger: LedgerId,
}

//! OUTSIDE THE OS: an in-process wiki that stands in for Confluence Cloud.
//!
//! Nothing in here is part of the approval gate. It is the peripheral the driver talks
//! to, built so tests and lectures can watch every request and interfere at will:
//!
//! - pages and blog posts with an id (real ids are issued from 200), title, body (in
//!   storage format, see [`crate::markup`]), version, parent, space, status, labels and
//!   footer comments;
//! - an update must carry `version == current + 1`, or it is refused with a 409-style
//!   [`ServiceError::Conflict`] and nothing changes;
//! - the driver's successful writes and its reads are counted separately
//!   ([`WikiService::writes`], [`WikiService::reads`]), and every write, refused write
//!   and human edit is logged ([`WikiService::log`]);
//! - a test plays the other people editing the wiki: [`WikiService::human_edit`] at any
//!   moment, or [`WikiService::edit_after_next_get`] to slip an edit in between the
//!   driver's read and its write.
//!
//! The API methods (`get_content`, `create_content`, `update_content`, …) are what the
//! driver calls and are counted; the setup and inspection methods (`seed_*`, `page`,
//! `human_edit`) are the outside world's and are not. One request returns a page with its
//! labels and comments, where the real service would need three.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use crate::markup::{markdown_to_storage, storage_to_markdown};
use crate::record::{ContentKind, ContentStatus};

/// The first id the service hands out for new content.
pub const FIRST_CONTENT_ID: u64 = 200;
/// The first id the service hands out for comments.
pub const FIRST_COMMENT_ID: u64 = 1000;

/// A footer comment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Comment {
    /// The comment's id.
    pub id: u64,
    /// The comment, in storage format.
    pub body: String,
    /// Who wrote it.
    pub author: String,
}

/// A page or blog post, as the service holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// The id.
    pub id: u64,
    /// Page or blog post.
    pub kind: ContentKind,
    /// The space key.
    pub space: String,
    /// The parent page, for a child page.
    pub parent: Option<u64>,
    /// The title.
    pub title: String,
    /// The body, in storage format.
    pub body: String,
    /// The version; 1 at creation, one more on every body or title update.
    pub version: u64,
    /// Current, draft or trashed.
    pub status: ContentStatus,
    /// Labels, in the order they were added.
    pub labels: Vec<String>,
    /// Footer comments, oldest first.
    pub comments: Vec<Comment>,
}

impl Page {
    /// The body as Markdown.
    pub fn body_markdown(&self) -> String {
        storage_to_markdown(&self.body)
    }
}

/// A create request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewContent {
    /// Page or blog post.
    pub kind: ContentKind,
    /// The numeric space id (see [`WikiService::get_space`]).
    pub space_id: u64,
    /// The parent page (ignored for a blog post).
    pub parent: Option<u64>,
    /// The title.
    pub title: String,
    /// The body, storage format.
    pub body: String,
    /// `Current` or `Draft`.
    pub status: ContentStatus,
}

/// An update request: the whole new title, body and status, and the version it makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContentUpdate {
    /// Must be the page's current version plus one.
    pub version: u64,
    /// The new title.
    pub title: String,
    /// The new body, storage format.
    pub body: String,
    /// The new status.
    pub status: ContentStatus,
}

/// An edit made by a person outside the gate (in the wiki's own editor).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit {
    /// Replace the whole body with this Markdown.
    ReplaceBody(String),
    /// Add this Markdown as new paragraphs at the end of the body.
    AppendBody(String),
    /// Rename.
    SetTitle(String),
    /// Move to the trash. The version does not change (as in Confluence).
    Trash,
    /// Restore from the trash. The version does not change.
    Restore,
}

/// A refused request. Nothing changed in the service.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServiceError {
    /// 404: no such content, comment or space.
    #[error("404 not found: {0}")]
    NotFound(String),
    /// 409: the update did not carry the current version plus one.
    #[error(
        "409 version conflict on content {id}: the update carried version {sent}, but the content is at version {current} and accepts only {}",
        current + 1
    )]
    Conflict {
        /// The content.
        id: u64,
        /// The version the update carried.
        sent: u64,
        /// The content's version when the update arrived.
        current: u64,
    },
    /// 400: the request makes no sense (for example a child page under a blog post).
    #[error("400 bad request: {0}")]
    BadRequest(String),
}

#[derive(Default)]
struct State {
    pages: BTreeMap<u64, Page>,
    spaces: BTreeMap<String, u64>,
    next_content: u64,
    next_comment: u64,
    reads: u64,
    writes: u64,
    log: Vec<String>,
    after_get: HashMap<u64, VecDeque<Edit>>,
}

impl State {
    fn page_mut(&mut self, id: u64) -> Result<&mut Page, ServiceError> {
        self.pages
            .get_mut(&id)
            .ok_or_else(|| ServiceError::NotFound(format!("content {id}")))
    }

    fn apply_edit(&mut self, id: u64, edit: &Edit) -> Result<u64, ServiceError> {
        let page = self.page_mut(id)?;
        let moves = match edit {
            Edit::ReplaceBody(md) => {
                page.body = markdown_to_storage(md);
                true
            }
            Edit::AppendBody(md) => {
                page.body.push_str(&markdown_to_storage(md));
                true
            }
            Edit::SetTitle(title) => {
                page.title = title.clone();
                true
            }
            Edit::Trash => {
                page.status = ContentStatus::Trashed;
                false
            }
            Edit::Restore => {
                page.status = ContentStatus::Current;
                false
            }
        };
        if moves {
            page.version += 1;
        }
        let version = page.version;
        let what = match edit {
            Edit::ReplaceBody(_) => "replaces the body of",
            Edit::AppendBody(_) => "appends to",
            Edit::SetTitle(_) => "renames",
            Edit::Trash => "trashes",
            Edit::Restore => "restores",
        };
        self.log
            .push(format!("human {what} content {id} -> v{version}"));
        Ok(version)
    }
}

/// The in-process wiki. Share it with `Arc`; every method takes `&self`.
pub struct WikiService {
    state: Mutex<State>,
}

impl Default for WikiService {
    fn default() -> Self {
        Self::new()
    }
}

impl WikiService {
    /// An empty wiki with no spaces.
    pub fn new() -> Self {
        Self {
            state: Mutex::new(State {
                next_content: FIRST_CONTENT_ID,
                next_comment: FIRST_COMMENT_ID,
                ..State::default()
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every method checks before it mutates, so a poisoned lock is consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    // ----- the outside world: setup, inspection, other people's edits (not counted) -----

    /// Add a space (idempotent) and return its numeric id.
    pub fn add_space(&self, key: &str) -> u64 {
        let mut state = self.state();
        let next = state.spaces.len() as u64 + 1;
        *state.spaces.entry(key.to_owned()).or_insert(next)
    }

    /// Put a page into the wiki as if it had always been there, with the next free id.
    pub fn seed_page(&self, space: &str, title: &str, markdown: &str) -> u64 {
        let id = self.state().next_content;
        self.seed_page_with_id(id, space, title, markdown);
        id
    }

    /// Put a page with a chosen id into the wiki (version 1, current), replacing any
    /// page with that id. The space is added if missing. Ids below 200 never collide
    /// with content the service creates.
    pub fn seed_page_with_id(&self, id: u64, space: &str, title: &str, markdown: &str) {
        self.add_space(space);
        let mut state = self.state();
        if id >= state.next_content {
            state.next_content = id + 1;
        }
        state.pages.insert(
            id,
            Page {
                id,
                kind: ContentKind::Page,
                space: space.to_owned(),
                parent: None,
                title: title.to_owned(),
                body: markdown_to_storage(markdown),
                version: 1,
                status: ContentStatus::Current,
                labels: Vec::new(),
                comments: Vec::new(),
            },
        );
    }

    /// A person edits the page now, in the wiki's own editor: the version goes up by one
    /// (a trash or restore changes only the status). Returns the version after the edit.
    pub fn human_edit(&self, id: u64, edit: Edit) -> Result<u64, ServiceError> {
        self.state().apply_edit(id, &edit)
    }

    /// Arrange for a person's edit to land right after the next GET of `id` has been
    /// answered: the reader sees the old version, and its next write conflicts. Runs
    /// once; several calls queue several edits for successive GETs.
    pub fn edit_after_next_get(&self, id: u64, edit: Edit) {
        self.state()
            .after_get
            .entry(id)
            .or_default()
            .push_back(edit);
    }

    /// A copy of the content as it is now, without counting a read.
    pub fn page(&self, id: u64) -> Option<Page> {
        self.state().pages.get(&id).cloned()
    }

    /// How many requests of the driver read something.
    pub fn reads(&self) -> u64 {
        self.state().reads
    }

    /// How many requests of the driver changed something (refused ones not counted).
    pub fn writes(&self) -> u64 {
        self.state().writes
    }

    /// Every write request (including refused ones) and every human edit, in order.
    pub fn log(&self) -> Vec<String> {
        self.state().log.clone()
    }

    // ----- the API the driver calls (counted) -----

    /// GET a page or blog post, with its labels and comments.
    pub fn get_content(&self, id: u64) -> Result<Page, ServiceError> {
        let mut state = self.state();
        state.reads += 1;
        let page = state
            .pages
            .get(&id)
            .cloned()
            .ok_or_else(|| ServiceError::NotFound(format!("content {id}")))?;
        if let Some(edit) = state.after_get.get_mut(&id).and_then(VecDeque::pop_front) {
            state.apply_edit(id, &edit)?;
        }
        Ok(page)
    }

    /// GET the child pages of a page (not trashed ones), in id order.
    pub fn get_children(&self, id: u64) -> Result<Vec<Page>, ServiceError> {
        let mut state = self.state();
        state.reads += 1;
        if !state.pages.contains_key(&id) {
            return Err(ServiceError::NotFound(format!("content {id}")));
        }
        Ok(state
            .pages
            .values()
            .filter(|p| p.parent == Some(id) && p.status != ContentStatus::Trashed)
            .cloned()
            .collect())
    }

    /// GET a space's numeric id by its key.
    pub fn get_space(&self, key: &str) -> Result<u64, ServiceError> {
        let mut state = self.state();
        state.reads += 1;
        state
            .spaces
            .get(key)
            .copied()
            .ok_or_else(|| ServiceError::NotFound(format!("space {key}")))
    }

    /// POST a new page or blog post; it starts at version 1.
    pub fn create_content(&self, new: NewContent) -> Result<Page, ServiceError> {
        let mut state = self.state();
        let space = state
            .spaces
            .iter()
            .find(|(_, id)| **id == new.space_id)
            .map(|(key, _)| key.clone())
            .ok_or_else(|| ServiceError::NotFound(format!("space id {}", new.space_id)))?;
        let parent = match (new.kind, new.parent) {
            (ContentKind::Page, Some(parent)) => {
                let found = state
                    .pages
                    .get(&parent)
                    .ok_or_else(|| ServiceError::NotFound(format!("parent page {parent}")))?;
                if found.kind != ContentKind::Page {
                    return Err(ServiceError::BadRequest(
                        "blog posts cannot have child pages".into(),
                    ));
                }
                Some(parent)
            }
            _ => None,
        };
        let id = state.next_content;
        state.next_content += 1;
        let page = Page {
            id,
            kind: new.kind,
            space,
            parent,
            title: new.title,
            body: new.body,
            version: 1,
            status: new.status,
            labels: Vec::new(),
            comments: Vec::new(),
        };
        state.pages.insert(id, page.clone());
        state.writes += 1;
        let path = match new.kind {
            ContentKind::Page => "pages",
            ContentKind::BlogPost => "blogposts",
        };
        state.log.push(format!("POST /{path} -> {id}"));
        Ok(page)
    }

    /// PUT a new title, body and status; refused with 409 unless the version is the
    /// current one plus one.
    pub fn update_content(&self, id: u64, update: ContentUpdate) -> Result<Page, ServiceError> {
        let mut state = self.state();
        let current = state.page_mut(id)?.version;
        if update.version != current + 1 {
            state.log.push(format!(
                "PUT /pages/{id} v{} -> 409 (content is at v{current})",
                update.version
            ));
            return Err(ServiceError::Conflict {
                id,
                sent: update.version,
                current,
            });
        }
        let page = state.page_mut(id)?;
        page.version = update.version;
        page.title = update.title;
        page.body = update.body;
        page.status = update.status;
        let page = page.clone();
        state.writes += 1;
        state.log.push(format!("PUT /pages/{id} v{}", page.version));
        Ok(page)
    }

    /// POST a footer comment; returns its id.
    pub fn add_comment(&self, id: u64, body: String, author: &str) -> Result<u64, ServiceError> {
        let mut state = self.state();
        let comment_id = state.next_comment;
        state.page_mut(id)?.comments.push(Comment {
            id: comment_id,
            body,
            author: author.to_owned(),
        });
        state.next_comment += 1;
        state.writes += 1;
        state
            .log
            .push(format!("POST /footer-comments on {id} -> {comment_id}"));
        Ok(comment_id)
    }

    /// DELETE a footer comment.
    pub fn delete_comment(&self, id: u64, comment: u64) -> Result<(), ServiceError> {
        let mut state = self.state();
        let page = state.page_mut(id)?;
        let before = page.comments.len();
        page.comments.retain(|c| c.id != comment);
        if page.comments.len() == before {
            return Err(ServiceError::NotFound(format!("comment {comment}")));
        }
        state.writes += 1;
        state.log.push(format!("DELETE /footer-comments/{comment}"));
        Ok(())
    }

    /// POST a label; adding a label already there changes nothing but still succeeds.
    pub fn add_label(&self, id: u64, name: &str) -> Result<(), ServiceError> {
        let mut state = self.state();
        let page = state.page_mut(id)?;
        if !page.labels.iter().any(|l| l == name) {
            page.labels.push(name.to_owned());
        }
        state.writes += 1;
        state.log.push(format!("POST /content/{id}/label {name}"));
        Ok(())
    }

    /// DELETE a label; removing a label that is not there succeeds and changes nothing.
    pub fn remove_label(&self, id: u64, name: &str) -> Result<(), ServiceError> {
        let mut state = self.state();
        let page = state.page_mut(id)?;
        if let Some(at) = page.labels.iter().position(|l| l == name) {
            page.labels.remove(at);
        }
        state.writes += 1;
        state.log.push(format!("DELETE /content/{id}/label {name}"));
        Ok(())
    }

    /// DELETE a page or blog post: it moves to the trash.
    pub fn trash(&self, id: u64) -> Result<(), ServiceError> {
        self.set_status(id, ContentStatus::Trashed, "DELETE /pages")
    }

    /// Restore content from the trash.
    pub fn restore(&self, id: u64) -> Result<(), ServiceError> {
        self.set_status(id, ContentStatus::Current, "PUT (restore) /content")
    }

    fn set_status(&self, id: u64, status: ContentStatus, verb: &str) -> Result<(), ServiceError> {
        let mut state = self.state();
        state.page_mut(id)?.status = status;
        state.writes += 1;
        state.log.push(format!("{verb}/{id}"));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updates_must_carry_the_next_version() {
        let wiki = WikiService::new();
        wiki.seed_page_with_id(100, "OPS", "Manual", "Original");
        let update = |version| ContentUpdate {
            version,
            title: "Manual".into(),
            body: "<p>x</p>".into(),
            status: ContentStatus::Current,
        };
        assert_eq!(
            wiki.update_content(100, update(1)),
            Err(ServiceError::Conflict {
                id: 100,
                sent: 1,
                current: 1
            })
        );
        assert_eq!(wiki.writes(), 0);
        assert_eq!(wiki.update_content(100, update(2)).unwrap().version, 2);
        assert_eq!(wiki.writes(), 1);
    }

    #[test]
    fn an_edit_after_the_next_get_lands_once_behind_the_reader() {
        let wiki = WikiService::new();
        wiki.seed_page_with_id(100, "OPS", "Manual", "Original");
        wiki.edit_after_next_get(100, Edit::AppendBody("human".into()));
        let seen = wiki.get_content(100).unwrap();
        assert_eq!(seen.version, 1);
        assert_eq!(wiki.page(100).unwrap().version, 2);
        assert_eq!(wiki.get_content(100).unwrap().version, 2);
        assert_eq!(wiki.reads(), 2);
        assert_eq!(
            wiki.writes(),
            0,
            "a person's edit is not the driver's write"
        );
    }

    #[test]
    fn new_content_gets_ids_from_200() {
        let wiki = WikiService::new();
        let space_id = wiki.add_space("OPS");
        let page = wiki
            .create_content(NewContent {
                kind: ContentKind::Page,
                space_id,
                parent: None,
                title: "Parent".into(),
                body: String::new(),
                status: ContentStatus::Current,
            })
            .unwrap();
        assert_eq!((page.id, page.version), (200, 1));
    }
}

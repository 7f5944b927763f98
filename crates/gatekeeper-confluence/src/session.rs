//! The agent's side: a wiki session, an object API in the reference's style.
//!
//! Every read returns the simulated state (pending actions folded in) and is recorded
//! with the kernel through `authorize_observation` before anything is returned. Every
//! write is staged and submitted, and returns at once: a create hands back the new
//! content's `~N` handle, which keeps working after the create is applied; other
//! actions hand back a [`Staged`] receipt.
//!
//! What the session remembers (pitfall 2, under [`Policy::track_dependencies`]): the
//! pending actions whose effect its reads have shown, and the actions it staged itself.
//! Every action it stages afterwards declares in `depends_on` those it saw (still
//! pending, rejected, or failed for good) and its own earlier ones still pending, so if
//! one of them is rejected, fails for good or is reverted the kernel flags the later
//! action instead of letting it slip through, and the driver refuses to apply it while
//! one of them is still pending. Actions of other sessions it never read are not
//! among them. Its own earlier actions are declared as a chain (each names the latest
//! one still undecided), so `depends_on` stays short however much it stages; the
//! driver's `dependencies` says what reaches the rest. The memory lasts as long as the
//! session: a restarted agent gets a new session and a clean slate.
//!
//! It also remembers the version of each page its reads showed (pitfall 1, under
//! [`Policy::refuse_stale`]): a replace or rename is staged against the version the
//! agent last saw, not the version the page happens to have when it is staged, so an
//! edit a person makes between the agent's read and its staging is not erased.
//!
//! [`Policy::track_dependencies`]: crate::Policy::track_dependencies
//! [`Policy::refuse_stale`]: crate::Policy::refuse_stale

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};

use kernel::{ApprovalQueue, DriverActionId};

use crate::card;
use crate::error::WikiError;
use crate::gatekeeper::{
    ConfluenceGatekeeper, IdSet, Knowledge, SeenFacets, StageRequest, Versions,
};
use crate::handle::ContentHandle;
use crate::overlay::CommentView;
use crate::record::{ContentKind, ContentStatus, WikiAction};
use crate::view::{ContentSummary, PageView, Staged};

/// What a create asks for. Build it with [`NewPage::page`] or [`NewPage::blog_post`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewPage {
    /// Page or blog post.
    pub kind: ContentKind,
    /// The space key (for a child page, the parent's space is used instead).
    pub space: String,
    /// The title.
    pub title: String,
    /// The body, Markdown; empty for none.
    pub body: String,
    /// `Current` (published) or `Draft`.
    pub status: ContentStatus,
}

impl NewPage {
    /// A published page in `space`.
    pub fn page(space: &str, title: &str, body: &str) -> Self {
        Self {
            kind: ContentKind::Page,
            space: space.to_owned(),
            title: title.to_owned(),
            body: body.to_owned(),
            status: ContentStatus::Current,
        }
    }

    /// A published blog post in `space`.
    pub fn blog_post(space: &str, title: &str, body: &str) -> Self {
        Self {
            kind: ContentKind::BlogPost,
            ..Self::page(space, title, body)
        }
    }

    /// The same, saved as a draft.
    pub fn draft(self) -> Self {
        Self {
            status: ContentStatus::Draft,
            ..self
        }
    }
}

/// One agent's view of the wiki through the gate.
pub struct WikiSession {
    gatekeeper: Arc<ConfluenceGatekeeper>,
    queue: Arc<dyn ApprovalQueue>,
    memory: Mutex<Memory>,
    last: Mutex<Option<Staged>>,
}

/// What a session remembers of its agent's reads and stagings (one lock, taken once per
/// read).
#[derive(Default)]
struct Memory {
    /// The pending actions whose effect its reads showed. A hash set: every read adds
    /// what it showed, mostly ids already there, and a lookup here costs a fraction of a
    /// search of a B-tree (about a sixth of a read with 50 pending on the page was spent
    /// in those searches).
    seen: IdSet,
    /// The actions it staged itself.
    staged: BTreeSet<DriverActionId>,
    /// The actions it staged itself, in staging order, less those found decided at the
    /// end: the last one is the head of its chain (see the driver's `dependencies`).
    open: Vec<DriverActionId>,
    /// The version of each content (by resolved key) its last read of it showed.
    versions: Versions,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Each critical section is one set or slot update; a poisoned lock is consistent.
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl WikiSession {
    pub(crate) fn new(
        gatekeeper: Arc<ConfluenceGatekeeper>,
        queue: Arc<dyn ApprovalQueue>,
    ) -> Self {
        Self {
            gatekeeper,
            queue,
            memory: Mutex::new(Memory::default()),
            last: Mutex::new(None),
        }
    }

    /// The gatekeeper behind this session.
    pub fn gatekeeper(&self) -> &Arc<ConfluenceGatekeeper> {
        &self.gatekeeper
    }

    /// The pending actions whose effect this session's reads have shown, in id order.
    pub fn seen(&self) -> Vec<DriverActionId> {
        let mut seen: Vec<DriverActionId> = lock(&self.memory).seen.iter().copied().collect();
        seen.sort_unstable();
        seen
    }

    /// The receipt of the last action this session staged (creates included).
    pub fn last_staged(&self) -> Option<Staged> {
        *lock(&self.last)
    }

    /// The actions this session staged itself, in id order (under
    /// [`Policy::track_dependencies`](crate::Policy::track_dependencies); empty otherwise).
    pub fn staged(&self) -> Vec<DriverActionId> {
        lock(&self.memory).staged.iter().copied().collect()
    }

    /// The version of `content` this session's last read showed (0 for content not yet
    /// created), or `None` if it never read it. Give the handle as the agent holds it.
    pub fn last_read_version(&self, content: &ContentHandle) -> Option<u64> {
        let key = self.gatekeeper.resolve(*content);
        let memory = lock(&self.memory);
        memory
            .versions
            .get(&key)
            .or_else(|| memory.versions.get(content))
            .copied()
    }

    /// Note what a read just showed: the version of the content (by its resolved key),
    /// and the pending actions visible in it. Each is kept only under the policy that
    /// uses it.
    fn remember(&self, read: Option<(ContentHandle, u64)>, seen: &[DriverActionId]) {
        let policy = self.gatekeeper.policy();
        let seen = if policy.track_dependencies { seen } else { &[] };
        let read = read.filter(|_| policy.refuse_stale);
        if read.is_none() && seen.is_empty() {
            return;
        }
        let mut memory = lock(&self.memory);
        if let Some((key, version)) = read {
            memory.versions.insert(key, version);
        }
        memory.seen.extend(seen.iter().copied());
    }

    // ----- reads -----

    /// A handle for existing content, by id (`"100"`) or by a known `~N`. Returns no
    /// content, so records no observation; reading it does.
    pub async fn open(&self, id: &str) -> Result<ContentHandle, WikiError> {
        let handle: ContentHandle = id.parse()?;
        self.gatekeeper.open_handle(handle)
    }

    /// The whole page as simulated: title, body, labels, comments, status.
    pub async fn read(&self, handle: &ContentHandle) -> Result<PageView, WikiError> {
        let (view, seen) = self.observe(handle, "").await?;
        self.remember(Some((view.id, view.version)), &seen.all());
        Ok(view)
    }

    async fn observe(
        &self,
        handle: &ContentHandle,
        part: &'static str,
    ) -> Result<(PageView, SeenFacets), WikiError> {
        let (view, seen) = self.gatekeeper.view(*handle)?;
        self.queue
            .authorize_observation(card::observation(
                part,
                view.kind,
                *handle,
                &view.title,
                view.pending_changes,
            ))
            .await?;
        Ok((view, seen))
    }

    /// The body only, as simulated (Markdown). Only the actions visible in the body are
    /// remembered as seen.
    pub async fn body(&self, handle: &ContentHandle) -> Result<String, WikiError> {
        let read = self.gatekeeper.body(*handle)?;
        self.queue
            .authorize_observation(card::observation(
                "body",
                read.kind,
                *handle,
                &read.title,
                read.pending,
            ))
            .await?;
        self.remember(Some((read.key, read.version)), &read.seen);
        Ok(read.body)
    }

    /// The comments, existing ones first, then pending ones. Only the pending comments
    /// are remembered as seen.
    pub async fn comments(&self, handle: &ContentHandle) -> Result<Vec<CommentView>, WikiError> {
        let (view, seen) = self.observe(handle, "comments").await?;
        self.remember(Some((view.id, view.version)), &seen.part(&seen.comments));
        Ok(view.comments)
    }

    /// The labels, as simulated. Only the pending label changes are remembered as seen.
    pub async fn labels(&self, handle: &ContentHandle) -> Result<Vec<String>, WikiError> {
        let (view, seen) = self.observe(handle, "labels").await?;
        self.remember(Some((view.id, view.version)), &seen.part(&seen.labels));
        Ok(view.labels)
    }

    /// The title, as simulated. Only a pending rename (or the create) is remembered.
    pub async fn title(&self, handle: &ContentHandle) -> Result<String, WikiError> {
        let (view, seen) = self.observe(handle, "title").await?;
        self.remember(Some((view.id, view.version)), &seen.part(&seen.title));
        Ok(view.title)
    }

    /// The child pages: real ones, then those whose create is pending.
    pub async fn children(&self, handle: &ContentHandle) -> Result<Vec<ContentSummary>, WikiError> {
        let (children, seen) = self.gatekeeper.children(*handle)?;
        let mut listing = String::new();
        for child in &children {
            listing.push_str(&format!("{} ", child.handle));
        }
        self.queue
            .authorize_observation(kernel::ObservationDescription::new(
                format!("List the child pages of Confluence content {handle}"),
                format!("{} child pages: {}", children.len(), listing.trim_end()),
            ))
            .await?;
        self.remember(None, &seen);
        Ok(children)
    }

    // ----- actions -----

    async fn stage(
        &self,
        request: StageRequest,
    ) -> Result<(Staged, Option<ContentHandle>), WikiError> {
        let prepared = {
            let mut guard = lock(&self.memory);
            let memory = &mut *guard;
            let mut knowledge = Knowledge {
                seen: &memory.seen,
                staged: &memory.staged,
                open: &mut memory.open,
                versions: &memory.versions,
            };
            self.gatekeeper.prepare(request, &mut knowledge)?
        };
        match self
            .queue
            .submit_action(prepared.id, prepared.description)
            .await
        {
            Ok(ledger) => {
                self.gatekeeper.submitted(prepared.id, ledger);
                if self.gatekeeper.policy().track_dependencies {
                    let mut memory = lock(&self.memory);
                    memory.staged.insert(prepared.id);
                    memory.open.push(prepared.id);
                }
                let staged = Staged {
                    action: prepared.id,
                    ledger,
                };
                *lock(&self.last) = Some(staged);
                Ok((staged, prepared.created))
            }
            Err(error) => {
                self.gatekeeper.withdraw(prepared.id);
                Err(error.into())
            }
        }
    }

    async fn act(&self, action: WikiAction) -> Result<Staged, WikiError> {
        Ok(self.stage(StageRequest::Action(action)).await?.0)
    }

    /// Stage a create; returns the new content's `~N` handle at once.
    pub async fn create(&self, new: NewPage) -> Result<ContentHandle, WikiError> {
        self.create_under(None, new).await
    }

    async fn create_under(
        &self,
        parent: Option<ContentHandle>,
        new: NewPage,
    ) -> Result<ContentHandle, WikiError> {
        let (_, created) = self
            .stage(StageRequest::Create {
                kind: new.kind,
                parent,
                space: new.space,
                title: new.title,
                content: (!new.body.is_empty()).then_some(new.body),
                status: new.status,
            })
            .await?;
        Ok(created.expect("prepare returns the provisional handle of every create"))
    }

    /// Stage a new published page at the top of `space` (body may be empty).
    pub async fn create_page(
        &self,
        space: &str,
        title: &str,
        body: &str,
    ) -> Result<ContentHandle, WikiError> {
        self.create(NewPage::page(space, title, body)).await
    }

    /// Stage a new published blog post in `space`.
    pub async fn create_blog_post(
        &self,
        space: &str,
        title: &str,
        body: &str,
    ) -> Result<ContentHandle, WikiError> {
        self.create(NewPage::blog_post(space, title, body)).await
    }

    /// Stage a new published page under `parent`, which may itself be a `~N`.
    pub async fn create_child_page(
        &self,
        parent: &ContentHandle,
        title: &str,
        body: &str,
    ) -> Result<ContentHandle, WikiError> {
        self.create_under(Some(*parent), NewPage::page("", title, body))
            .await
    }

    /// Stage a child page with full options (a draft, for instance).
    pub async fn create_child(
        &self,
        parent: &ContentHandle,
        new: NewPage,
    ) -> Result<ContentHandle, WikiError> {
        self.create_under(
            Some(*parent),
            NewPage {
                kind: ContentKind::Page,
                ..new
            },
        )
        .await
    }

    /// Stage replacing the whole body.
    pub async fn set_content(
        &self,
        handle: &ContentHandle,
        markdown: &str,
    ) -> Result<Staged, WikiError> {
        self.act(WikiAction::SetContent {
            target: *handle,
            markdown: markdown.to_owned(),
        })
        .await
    }

    /// Stage adding text to the end of the body.
    pub async fn append_content(
        &self,
        handle: &ContentHandle,
        markdown: &str,
    ) -> Result<Staged, WikiError> {
        self.act(WikiAction::AppendContent {
            target: *handle,
            markdown: markdown.to_owned(),
        })
        .await
    }

    /// Stage a rename.
    pub async fn set_title(
        &self,
        handle: &ContentHandle,
        title: &str,
    ) -> Result<Staged, WikiError> {
        self.act(WikiAction::SetTitle {
            target: *handle,
            title: title.to_owned(),
        })
        .await
    }

    /// Stage a footer comment.
    pub async fn add_comment(
        &self,
        handle: &ContentHandle,
        text: &str,
    ) -> Result<Staged, WikiError> {
        self.act(WikiAction::AddComment {
            target: *handle,
            text: text.to_owned(),
        })
        .await
    }

    /// Stage adding a label.
    pub async fn add_label(&self, handle: &ContentHandle, name: &str) -> Result<Staged, WikiError> {
        self.act(WikiAction::AddLabel {
            target: *handle,
            name: name.to_owned(),
        })
        .await
    }

    /// Stage removing a label.
    pub async fn remove_label(
        &self,
        handle: &ContentHandle,
        name: &str,
    ) -> Result<Staged, WikiError> {
        self.act(WikiAction::RemoveLabel {
            target: *handle,
            name: name.to_owned(),
        })
        .await
    }

    /// Stage moving to the trash.
    pub async fn trash(&self, handle: &ContentHandle) -> Result<Staged, WikiError> {
        self.act(WikiAction::Trash { target: *handle }).await
    }

    /// Stage restoring from the trash.
    pub async fn restore(&self, handle: &ContentHandle) -> Result<Staged, WikiError> {
        self.act(WikiAction::Restore { target: *handle }).await
    }
}

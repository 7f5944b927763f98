//! The driver: stages wiki actions, simulates them on reads, and applies, rejects and
//! reverts them when the kernel says so.
//!
//! # The life of an action
//!
//! 1. **Stage** (a session call). The driver captures what revert and the stale check
//!    need (the simulated body or title, the page's version), writes a `pending` record
//!    through the key-value port, and only then submits it to the kernel. If the kernel
//!    refuses, the record is deleted. Nothing reaches the wiki.
//! 2. **Simulate** (every read). The pending records of the content read are folded over
//!    the wiki's state ([`crate::overlay`]). A `~N` handle resolves to the real id once
//!    its create is applied.
//! 3. **Apply** ([`Gatekeeper::apply_action`]). Re-read the latest version and write
//!    version + 1. Anything aimed at a `~N` not created yet fails, retryably, with
//!    "content ~N has not been created yet"; nothing is created on the side. A 409 from
//!    the wiki fails retryably and leaves the action pending. Under
//!    [`Policy::refuse_stale`] a replace or retitle whose page moved on since staging
//!    fails for good; under [`Policy::ordered_apply`] an action is refused while an
//!    earlier one on the same content (or its provisional parent) is pending.
//! 4. **Reject** ([`Gatekeeper::reject_action`]). The record is deleted; a create takes
//!    every pending action on it and on its provisional descendants with it, reported
//!    as `cascaded` under [`Policy::report_cascade`].
//! 5. **Revert** ([`Gatekeeper::revert_action`]). The reference writes back a snapshot;
//!    under [`Policy::careful_revert`] only the action's own change is undone, or
//!    nothing is written and the refusal says why.
//!
//! # Concurrency
//!
//! The wiki service is in-process and synchronous, so every apply, reject, revert,
//! staging and read runs its service calls and store updates under one lock, with no
//! `.await` inside. A read therefore never sees a write whose record is not yet marked
//! applied (which would show an append twice). Only the kernel calls
//! (`submit_action`, `authorize_observation`) are awaited, outside the lock. A remote
//! service behind an async port would need a per-content lock instead.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use kernel::{
    ActionDescription, ActionKind, ApprovalQueue, Clock, DriverActionId, Gatekeeper,
    GatekeeperError, LedgerId, RejectOutcome, RevertOutcome,
};
use tracing::{info, warn};

use crate::card;
use crate::error::WikiError;
use crate::handle::ContentHandle;
use crate::kv::{KvError, KvStore};
use crate::markup::markdown_to_storage;
use crate::overlay::{
    CommentView, simulate_body, simulate_comments, simulate_labels, simulate_title,
    simulate_trashed,
};
use crate::policy::Policy;
use crate::record::{
    ActionRecord, Applied, ContentKind, ContentStatus, Parent, RecordState, Staging,
    VersionedWrite, WikiAction,
};
use crate::service::{ContentUpdate, NewContent, Page, ServiceError, WikiService};
use crate::session::WikiSession;
use crate::store::ActionStore;
use crate::view::{ContentSummary, PageView};

/// Why an apply did not happen.
enum Refusal {
    /// Nothing was sent; approving again may succeed.
    Retry(String),
    /// Nothing was sent, and approving again never will: stage it anew.
    Final(String),
}

fn from_service(error: ServiceError) -> Refusal {
    match error {
        ServiceError::Conflict { .. } => Refusal::Retry(format!(
            "{error}; someone changed the content between this gatekeeper's read and its write, and nothing was written; approve again to re-read it and retry"
        )),
        other => Refusal::Retry(format!("{other}; nothing was written")),
    }
}

fn from_kv(error: KvError) -> Refusal {
    Refusal::Retry(format!("{error}; nothing was sent, approve again to retry"))
}

/// A draft stays a draft; anything else is sent as current (the wiki's update publishes
/// by default).
fn keep_status(status: ContentStatus) -> ContentStatus {
    match status {
        ContentStatus::Draft => ContentStatus::Draft,
        _ => ContentStatus::Current,
    }
}

/// What a session asks to stage.
pub(crate) enum StageRequest {
    /// A new page or blog post.
    Create {
        kind: ContentKind,
        /// `None`: at the top of `space`.
        parent: Option<ContentHandle>,
        space: String,
        title: String,
        content: Option<String>,
        status: ContentStatus,
    },
    /// Any other action.
    Action(WikiAction),
}

/// A staged record the kernel has not answered for yet.
pub(crate) struct Prepared {
    pub(crate) id: DriverActionId,
    pub(crate) created: Option<ContentHandle>,
    pub(crate) description: ActionDescription,
}

/// The wiki gatekeeper. Register it with the kernel, then hand out sessions.
pub struct ConfluenceGatekeeper {
    name: String,
    policy: Policy,
    service: Arc<WikiService>,
    clock: Arc<dyn Clock>,
    store: Mutex<ActionStore>,
}

impl ConfluenceGatekeeper {
    /// A gatekeeper named `name` over `service`, keeping its records in `kv` (loaded
    /// from it if it already holds some).
    pub fn open(
        name: impl Into<String>,
        service: Arc<WikiService>,
        kv: Arc<dyn KvStore>,
        clock: Arc<dyn Clock>,
        policy: Policy,
    ) -> Result<Self, KvError> {
        Ok(Self {
            name: name.into(),
            policy,
            service,
            clock,
            store: Mutex::new(ActionStore::open(kv)?),
        })
    }

    /// A session for one agent, submitting through `queue` (from
    /// `Overseer::queue_for(name, caller)`). Each session remembers what its agent has
    /// read; sessions share the pending work of the gatekeeper.
    pub fn session(self: &Arc<Self>, queue: Arc<dyn ApprovalQueue>) -> WikiSession {
        WikiSession::new(self.clone(), queue)
    }

    /// The policy this gatekeeper runs under.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The wiki it drives.
    pub fn service(&self) -> &Arc<WikiService> {
        &self.service
    }

    /// How many actions are pending in this gatekeeper's own store.
    pub fn pending_count(&self) -> usize {
        self.store().pending_count()
    }

    /// Every stored record (rejected ones are gone), in ascending id.
    pub fn records(&self) -> Vec<ActionRecord> {
        self.store().records().map(|r| (**r).clone()).collect()
    }

    /// One stored record.
    pub fn record(&self, id: DriverActionId) -> Option<ActionRecord> {
        self.store().get(id).map(|r| (**r).clone())
    }

    /// The kernel's id for one of this gatekeeper's actions, once submitted.
    pub fn ledger_id(&self, id: DriverActionId) -> Option<LedgerId> {
        self.store().get(id).and_then(|r| r.ledger)
    }

    /// What a handle resolves to now.
    pub fn resolve(&self, handle: ContentHandle) -> ContentHandle {
        self.store().resolve(handle)
    }

    fn store(&self) -> MutexGuard<'_, ActionStore> {
        // Every critical section writes through to the port before touching the index,
        // and the index is rebuilt only from what was written, so a poisoned lock still
        // guards a consistent store.
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    // ----- sessions: opening, reading, staging -----

    /// Check that a handle names content, without returning any of it.
    pub(crate) fn open_handle(&self, handle: ContentHandle) -> Result<ContentHandle, WikiError> {
        let store = self.store();
        match store.resolve(handle) {
            ContentHandle::Provisional(n) if store.knows_provisional(n) => Ok(handle),
            ContentHandle::Provisional(_) => Err(WikiError::NotFound(handle)),
            ContentHandle::Real(id) => {
                self.fetch(id, handle)?;
                Ok(handle)
            }
        }
    }

    fn fetch(&self, id: u64, asked: ContentHandle) -> Result<Page, WikiError> {
        self.service.get_content(id).map_err(|e| match e {
            ServiceError::NotFound(_) => WikiError::NotFound(asked),
            other => WikiError::Service(other),
        })
    }

    /// The whole simulated view of a content, and the pending actions visible in each
    /// part of it.
    pub(crate) fn view(&self, handle: ContentHandle) -> Result<(PageView, SeenFacets), WikiError> {
        let store = self.store();
        let key = store.resolve(handle);
        let pending: Vec<&ActionRecord> = store.pending_on(key).values().map(|r| &**r).collect();
        let mut seen = SeenFacets::default();
        let view = match key {
            ContentHandle::Provisional(n) => {
                let create = store.create_of(n).ok_or(WikiError::NotFound(handle))?;
                let WikiAction::Create {
                    kind,
                    parent,
                    status,
                    ..
                } = &create.action
                else {
                    return Err(WikiError::NotFound(handle));
                };
                seen.existence = Some(create.id);
                let (title, by) = simulate_title(pending.iter().copied(), "");
                seen.title.extend(by);
                let status = simulate_trashed(&pending, &mut seen.status).unwrap_or(*status);
                PageView {
                    handle,
                    id: key,
                    kind: *kind,
                    space: parent.space().to_owned(),
                    parent: parent.page().map(|p| store.resolve(p)),
                    title,
                    body: simulate_body(&pending, None, &mut seen.body),
                    version: 0,
                    status,
                    labels: simulate_labels(&pending, &[], &mut seen.labels),
                    comments: simulate_comments(&pending, Vec::new(), &mut seen.comments),
                    pending_changes: pending.len(),
                }
            }
            ContentHandle::Real(id) => {
                let page = self.fetch(id, handle)?;
                let (title, by) = simulate_title(pending.iter().copied(), &page.title);
                seen.title.extend(by);
                let status = simulate_trashed(&pending, &mut seen.status).unwrap_or(page.status);
                let comments = page
                    .comments
                    .iter()
                    .map(|c| CommentView {
                        id: c.id.to_string(),
                        text: crate::markup::storage_to_markdown(&c.body),
                        author: Some(c.author.clone()),
                    })
                    .collect();
                PageView {
                    handle,
                    id: key,
                    kind: page.kind,
                    space: page.space.clone(),
                    parent: page.parent.map(ContentHandle::Real),
                    title,
                    body: simulate_body(&pending, Some(&page.body_markdown()), &mut seen.body),
                    version: page.version,
                    status,
                    labels: simulate_labels(&pending, &page.labels, &mut seen.labels),
                    comments: simulate_comments(&pending, comments, &mut seen.comments),
                    pending_changes: pending.len(),
                }
            }
        };
        Ok((view, seen))
    }

    /// The simulated body only: the hot path of a read. Returns the body, the pending
    /// actions visible in it, the kind and title (for the ledger line) and how many
    /// pending actions were folded.
    pub(crate) fn body(&self, handle: ContentHandle) -> Result<BodyRead, WikiError> {
        let store = self.store();
        let key = store.resolve(handle);
        let map = store.pending_on(key);
        let pending: Vec<&ActionRecord> = map.values().map(|r| &**r).collect();
        let mut seen = Vec::with_capacity(pending.len());
        let (kind, base_title, body) = match key {
            ContentHandle::Provisional(n) => {
                let create = store.create_of(n).ok_or(WikiError::NotFound(handle))?;
                let kind = match &create.action {
                    WikiAction::Create { kind, .. } => *kind,
                    _ => ContentKind::Page,
                };
                (
                    kind,
                    String::new(),
                    simulate_body(&pending, None, &mut seen),
                )
            }
            ContentHandle::Real(id) => {
                let page = self.fetch(id, handle)?;
                let base = page.body_markdown();
                let body = simulate_body(&pending, Some(&base), &mut seen);
                (page.kind, page.title, body)
            }
        };
        let (title, _) = simulate_title(pending.iter().copied(), &base_title);
        Ok(BodyRead {
            body,
            seen,
            kind,
            title,
            pending: pending.len(),
        })
    }

    /// The child pages of a content: real ones (pending renames and trashes folded in),
    /// then children whose create is pending. Also returns the pending actions visible.
    pub(crate) fn children(
        &self,
        handle: ContentHandle,
    ) -> Result<(Vec<ContentSummary>, Vec<DriverActionId>), WikiError> {
        let store = self.store();
        let key = store.resolve(handle);
        let mut seen = Vec::new();
        let mut out = Vec::new();
        match key {
            ContentHandle::Provisional(n) if !store.knows_provisional(n) => {
                return Err(WikiError::NotFound(handle));
            }
            ContentHandle::Provisional(_) => {}
            ContentHandle::Real(id) => {
                for child in self.service.get_children(id).map_err(|e| match e {
                    ServiceError::NotFound(_) => WikiError::NotFound(handle),
                    other => WikiError::Service(other),
                })? {
                    let child_key = ContentHandle::Real(child.id);
                    let pending: Vec<&ActionRecord> =
                        store.pending_on(child_key).values().map(|r| &**r).collect();
                    let status = simulate_trashed(&pending, &mut seen).unwrap_or(child.status);
                    if status == ContentStatus::Trashed {
                        continue;
                    }
                    let (title, by) = simulate_title(pending.iter().copied(), &child.title);
                    seen.extend(by);
                    out.push(ContentSummary {
                        handle: child_key,
                        kind: child.kind,
                        title,
                        status,
                    });
                }
            }
        }
        for record in store.records() {
            let WikiAction::Create {
                provisional,
                kind,
                parent: Parent::Page { parent, .. },
                status,
                ..
            } = &record.action
            else {
                continue;
            };
            let child_key = store.resolve(ContentHandle::Provisional(*provisional));
            if record.state != RecordState::Pending
                || !child_key.is_provisional()
                || store.resolve(*parent) != key
            {
                continue;
            }
            let pending: Vec<&ActionRecord> =
                store.pending_on(child_key).values().map(|r| &**r).collect();
            let status = simulate_trashed(&pending, &mut seen).unwrap_or(*status);
            if status == ContentStatus::Trashed {
                continue;
            }
            let (title, by) = simulate_title(pending.iter().copied(), "");
            seen.extend(by);
            seen.push(record.id);
            out.push(ContentSummary {
                handle: child_key,
                kind: *kind,
                title,
                status,
            });
        }
        seen.sort_unstable();
        seen.dedup();
        Ok((out, seen))
    }

    /// Write a pending record for the request, with what revert and the stale check
    /// need, and its approval card. The caller submits it to the kernel next.
    pub(crate) fn prepare(
        &self,
        request: StageRequest,
        seen: &[DriverActionId],
    ) -> Result<Prepared, WikiError> {
        let mut store = self.store();
        let (action, staging, created) = match request {
            StageRequest::Create {
                kind,
                parent,
                space,
                title,
                content,
                status,
            } => {
                let parent = match parent {
                    None => Parent::Space { space },
                    Some(parent) => {
                        let space = self.parent_space(&store, parent)?;
                        Parent::Page { parent, space }
                    }
                };
                let provisional = store.allocate_provisional()?;
                let action = WikiAction::Create {
                    provisional,
                    kind,
                    parent,
                    title,
                    content,
                    status,
                };
                (
                    action,
                    Staging::default(),
                    Some(ContentHandle::Provisional(provisional)),
                )
            }
            StageRequest::Action(action) => {
                let staging = self.capture(&store, &action)?;
                (action, staging, None)
            }
        };
        let id = store.allocate_action()?;
        let depends_on = if self.policy.track_dependencies {
            dependency_closure(&store, seen)
        } else {
            Vec::new()
        };
        let mut description = card::describe(&action, &staging, self.policy.refuse_stale);
        description.depends_on = depends_on.clone();
        store.put(ActionRecord {
            id,
            ledger: None,
            action,
            state: RecordState::Pending,
            submitted_at: self.clock.now(),
            staging,
            depends_on,
            applied: None,
            failure: None,
        })?;
        Ok(Prepared {
            id,
            created,
            description,
        })
    }

    /// The kernel accepted the action: remember its ledger id (for "apply #k first").
    pub(crate) fn submitted(&self, id: DriverActionId, ledger: LedgerId) {
        let mut store = self.store();
        let Some(record) = store.get(id) else {
            return;
        };
        let mut record = (**record).clone();
        record.ledger = Some(ledger);
        if let Err(error) = store.put(record) {
            // The action stands; only the nicer name in messages is lost.
            warn!(%id, %error, "could not record the ledger id of a staged action");
        }
    }

    /// The kernel refused the action: forget it, as if it had never been staged.
    pub(crate) fn withdraw(&self, id: DriverActionId) {
        if let Err(error) = self.store().delete(id) {
            warn!(%id, %error, "could not delete a staged action the kernel refused");
        }
    }

    /// The space a child of `parent` goes into; refuses blog posts as parents.
    fn parent_space(
        &self,
        store: &ActionStore,
        parent: ContentHandle,
    ) -> Result<String, WikiError> {
        match store.resolve(parent) {
            ContentHandle::Provisional(n) => {
                let create = store.create_of(n).ok_or(WikiError::NotFound(parent))?;
                match &create.action {
                    WikiAction::Create {
                        kind: ContentKind::BlogPost,
                        ..
                    } => Err(WikiError::BlogPostChildren(parent)),
                    WikiAction::Create { parent: p, .. } => Ok(p.space().to_owned()),
                    _ => Err(WikiError::NotFound(parent)),
                }
            }
            ContentHandle::Real(id) => {
                let page = self.fetch(id, parent)?;
                if page.kind == ContentKind::BlogPost {
                    return Err(WikiError::BlogPostChildren(parent));
                }
                Ok(page.space)
            }
        }
    }

    /// What to capture at staging: the version staged against, and the reference's
    /// revert snapshots (the simulated body or title).
    fn capture(&self, store: &ActionStore, action: &WikiAction) -> Result<Staging, WikiError> {
        let target = action.target();
        let key = store.resolve(target);
        if let ContentHandle::Provisional(n) = key
            && !store.knows_provisional(n)
        {
            return Err(WikiError::NotFound(target));
        }
        if !matches!(
            action,
            WikiAction::SetContent { .. }
                | WikiAction::AppendContent { .. }
                | WikiAction::SetTitle { .. }
        ) {
            return Ok(Staging::default());
        }
        let base = match key {
            ContentHandle::Real(id) => Some(self.fetch(id, target)?),
            ContentHandle::Provisional(_) => None,
        };
        let pending: Vec<&ActionRecord> = store.pending_on(key).values().map(|r| &**r).collect();
        let mut staging = Staging {
            base_version: base.as_ref().map_or(0, |p| p.version),
            ..Staging::default()
        };
        if let WikiAction::SetTitle { .. } = action {
            let base_title = base.as_ref().map_or("", |p| p.title.as_str());
            staging.previous_title = Some(simulate_title(pending.iter().copied(), base_title).0);
        } else {
            let base_body = base.as_ref().map(Page::body_markdown);
            staging.previous_markdown = Some(simulate_body(
                &pending,
                base_body.as_deref(),
                &mut Vec::new(),
            ));
        }
        Ok(staging)
    }

    // ----- apply -----

    fn apply_now(&self, id: DriverActionId) -> Result<(), GatekeeperError> {
        let mut store = self.store();
        let Some(record) = store.get(id).cloned() else {
            return Err(GatekeeperError::fatal(format!(
                "unknown action {id}: the wiki gatekeeper holds no such action (it was dropped with a rejected page, or never staged), so nothing was sent; reject it"
            )));
        };
        match record.state {
            RecordState::Applied | RecordState::Reverted => return Ok(()),
            RecordState::Failed => {
                return Err(GatekeeperError::fatal(
                    record.failure.clone().unwrap_or_else(|| {
                        "this action failed for good earlier; stage it again".to_owned()
                    }),
                ));
            }
            RecordState::Pending => {}
        }
        if self.policy.ordered_apply
            && let Some(message) = blocker(&store, &record)
        {
            info!(%id, "apply refused: an earlier action is pending");
            return Err(GatekeeperError::retryable(message));
        }
        match self.perform(&mut store, &record) {
            Ok(applied) => {
                let mut next = (*record).clone();
                next.state = RecordState::Applied;
                next.applied = Some(applied);
                store.put(next).map_err(|e| {
                    GatekeeperError::fatal(format!(
                        "the change was sent to the wiki but could not be recorded ({e}); check the content before approving anything else on it"
                    ))
                })?;
                info!(%id, "action applied");
                Ok(())
            }
            Err(Refusal::Retry(message)) => {
                warn!(%id, %message, "apply failed; nothing was written");
                Err(GatekeeperError::retryable(message))
            }
            Err(Refusal::Final(message)) => {
                warn!(%id, %message, "apply refused for good; nothing was written");
                let mut next = (*record).clone();
                next.state = RecordState::Failed;
                next.failure = Some(message.clone());
                if let Err(error) = store.put(next) {
                    warn!(%id, %error, "could not record the failure");
                }
                Err(GatekeeperError::fatal(message))
            }
        }
    }

    /// Resolve a handle for apply; a `~N` still provisional is "not created yet".
    fn require_resolved(&self, store: &ActionStore, handle: ContentHandle) -> Result<u64, Refusal> {
        match store.resolve(handle) {
            ContentHandle::Real(id) => Ok(id),
            ContentHandle::Provisional(n) => {
                let creator = store
                    .create_of(n)
                    .map(|r| format!(" ({})", r.display_id()))
                    .unwrap_or_default();
                Err(Refusal::Retry(format!(
                    "cannot apply: content {handle} has not been created yet; approve the action that creates it{creator} first, nothing was sent"
                )))
            }
        }
    }

    /// Pitfall 1: refuse a replace or retitle whose page moved on since staging, other
    /// than through this gatekeeper's own earlier actions on it.
    fn check_stale(
        &self,
        store: &ActionStore,
        record: &ActionRecord,
        content: ContentHandle,
        current: u64,
        what: &str,
    ) -> Result<(), Refusal> {
        let base = record.staging.base_version;
        let mut expected = base;
        loop {
            let next = store
                .applied_writes_on(content)
                .iter()
                .filter(|w| **w < record.id)
                .filter_map(|w| store.get(*w))
                .filter_map(|r| r.applied.as_ref()?.write.as_ref())
                .find(|w| w.before == expected && w.after > expected)
                .map(|w| w.after);
            match next {
                Some(after) => expected = after,
                None => break,
            }
        }
        if current == expected {
            return Ok(());
        }
        let own = if expected == base {
            String::new()
        } else {
            format!(" (version {expected} counting this gatekeeper's own earlier changes)")
        };
        Err(Refusal::Final(format!(
            "content {content} is at version {current}, but this {what} was staged against version {base}{own}: someone changed it since, and applying it would silently erase their edit; nothing was written, re-read the page and stage again"
        )))
    }

    fn perform(&self, store: &mut ActionStore, record: &ActionRecord) -> Result<Applied, Refusal> {
        let service = &self.service;
        match &record.action {
            WikiAction::Create {
                provisional,
                kind,
                parent,
                title,
                content,
                status,
            } => {
                let space = parent.space();
                if space.is_empty() {
                    return Err(Refusal::Retry(
                        "cannot create content without a space; reject this and create it in a space"
                            .to_owned(),
                    ));
                }
                let space_id = match store.space(space) {
                    Some(id) => id,
                    None => {
                        let id = service.get_space(space).map_err(from_service)?;
                        store.put_space(space, id).map_err(from_kv)?;
                        id
                    }
                };
                let parent_id = match (kind, parent.page()) {
                    (ContentKind::Page, Some(p)) => Some(self.require_resolved(store, p)?),
                    _ => None,
                };
                let created = service
                    .create_content(NewContent {
                        kind: *kind,
                        space_id,
                        parent: parent_id,
                        title: title.clone(),
                        body: markdown_to_storage(content.as_deref().unwrap_or("")),
                        status: *status,
                    })
                    .map_err(from_service)?;
                store.set_provisional(*provisional, created.id).map_err(|e| {
                    Refusal::Final(format!(
                        "content {} was created, but its handle ~{provisional} could not be recorded ({e}); do not stage it again, that would create a duplicate",
                        created.id
                    ))
                })?;
                Ok(Applied {
                    created: Some(created.id),
                    write: Some(VersionedWrite {
                        before: 0,
                        after: created.version,
                        previous_body: String::new(),
                        previous_title: String::new(),
                    }),
                    ..Applied::default()
                })
            }
            WikiAction::SetContent { target, markdown } => {
                let id = self.require_resolved(store, *target)?;
                let current = service.get_content(id).map_err(from_service)?;
                if self.policy.refuse_stale {
                    self.check_stale(
                        store,
                        record,
                        ContentHandle::Real(id),
                        current.version,
                        "replacement",
                    )?;
                }
                self.write(
                    id,
                    current,
                    |page| (page.title.clone(), markdown_to_storage(markdown)),
                    None,
                )
            }
            WikiAction::AppendContent { target, markdown } => {
                let id = self.require_resolved(store, *target)?;
                let current = service.get_content(id).map_err(from_service)?;
                let fragment = markdown_to_storage(markdown);
                let appended = fragment.clone();
                self.write(
                    id,
                    current,
                    move |page| (page.title.clone(), format!("{}{fragment}", page.body)),
                    Some(appended),
                )
            }
            WikiAction::SetTitle { target, title } => {
                let id = self.require_resolved(store, *target)?;
                let current = service.get_content(id).map_err(from_service)?;
                if self.policy.refuse_stale {
                    self.check_stale(
                        store,
                        record,
                        ContentHandle::Real(id),
                        current.version,
                        "rename",
                    )?;
                }
                self.write(id, current, |page| (title.clone(), page.body.clone()), None)
            }
            WikiAction::AddComment { target, text } => {
                let id = self.require_resolved(store, *target)?;
                // The reference reads the target to choose the comment container.
                service.get_content(id).map_err(from_service)?;
                let comment = service
                    .add_comment(id, markdown_to_storage(text), &self.name)
                    .map_err(from_service)?;
                Ok(Applied {
                    created: Some(comment),
                    ..Applied::default()
                })
            }
            WikiAction::AddLabel { target, name } | WikiAction::RemoveLabel { target, name } => {
                let id = self.require_resolved(store, *target)?;
                let adding = matches!(record.action, WikiAction::AddLabel { .. });
                let label_changed = if self.policy.careful_revert {
                    let present = service
                        .get_content(id)
                        .map_err(from_service)?
                        .labels
                        .iter()
                        .any(|l| l == name);
                    Some(present != adding)
                } else {
                    None
                };
                if adding {
                    service.add_label(id, name).map_err(from_service)?;
                } else {
                    service.remove_label(id, name).map_err(from_service)?;
                }
                Ok(Applied {
                    label_changed,
                    ..Applied::default()
                })
            }
            WikiAction::Trash { target } => {
                let id = self.require_resolved(store, *target)?;
                service.trash(id).map_err(from_service)?;
                Ok(Applied::default())
            }
            WikiAction::Restore { target } => {
                let id = self.require_resolved(store, *target)?;
                service.restore(id).map_err(from_service)?;
                Ok(Applied::default())
            }
        }
    }

    /// PUT version + 1 with the title and body `make` derives from the latest page.
    fn write(
        &self,
        id: u64,
        current: Page,
        make: impl FnOnce(&Page) -> (String, String),
        appended: Option<String>,
    ) -> Result<Applied, Refusal> {
        let (title, body) = make(&current);
        let updated = self
            .service
            .update_content(
                id,
                ContentUpdate {
                    version: current.version + 1,
                    title,
                    body,
                    status: keep_status(current.status),
                },
            )
            .map_err(from_service)?;
        Ok(Applied {
            write: Some(VersionedWrite {
                before: current.version,
                after: updated.version,
                previous_body: current.body,
                previous_title: current.title,
            }),
            appended,
            ..Applied::default()
        })
    }

    // ----- reject -----

    fn reject_now(&self, id: DriverActionId) -> Result<RejectOutcome, GatekeeperError> {
        let mut store = self.store();
        let Some(record) = store.get(id).cloned() else {
            // Already gone (dropped with a rejected page): nothing to do.
            return Ok(RejectOutcome::default());
        };
        if record.state != RecordState::Pending {
            // An applied action stays, so that it can still be reverted.
            return Ok(RejectOutcome::default());
        }
        let fail = |e: KvError| GatekeeperError::retryable(format!("{e}; reject it again"));
        store.delete(id).map_err(fail)?;
        let mut dropped: Vec<DriverActionId> = Vec::new();
        let mut restart;
        if let WikiAction::Create { provisional, .. } = record.action {
            // The purge set: this `~N` and, to a fixed point, every pending child-page
            // create under a purged `~N`.
            let mut purge: BTreeSet<u64> = BTreeSet::from([provisional]);
            loop {
                let more: Vec<u64> = store
                    .records()
                    .filter(|r| r.state == RecordState::Pending)
                    .filter_map(|r| match &r.action {
                        WikiAction::Create {
                            provisional: child,
                            parent:
                                Parent::Page {
                                    parent: ContentHandle::Provisional(p),
                                    ..
                                },
                            ..
                        } if purge.contains(p) && !purge.contains(child) => Some(*child),
                        _ => None,
                    })
                    .collect();
                if more.is_empty() {
                    break;
                }
                purge.extend(more);
            }
            dropped = store
                .records()
                .filter(|r| r.state == RecordState::Pending)
                .filter(|r| {
                    matches!(r.action.target(), ContentHandle::Provisional(n) if purge.contains(&n))
                })
                .map(|r| r.id)
                .collect();
            for victim in &dropped {
                store.delete(*victim).map_err(fail)?;
            }
            restart = !dropped.is_empty();
        } else {
            let key = store.resolve(record.action.target());
            restart = !store.pending_on(key).is_empty();
        }
        if self.policy.track_dependencies {
            let gone: BTreeSet<DriverActionId> =
                dropped.iter().copied().chain(std::iter::once(id)).collect();
            restart |= store.records().any(|r| {
                r.state == RecordState::Pending && r.depends_on.iter().any(|d| gone.contains(d))
            });
        }
        info!(%id, cascaded = dropped.len(), restart, "action rejected");
        Ok(RejectOutcome {
            restart,
            cascaded: if self.policy.report_cascade {
                dropped
            } else {
                Vec::new()
            },
        })
    }

    // ----- revert -----

    fn revert_now(&self, id: DriverActionId) -> Result<RevertOutcome, GatekeeperError> {
        let mut store = self.store();
        let Some(record) = store.get(id).cloned() else {
            return Err(GatekeeperError::fatal(format!(
                "unknown action {id}: the wiki gatekeeper holds no such action; there is nothing to revert"
            )));
        };
        match record.state {
            RecordState::Reverted => return Ok(RevertOutcome::done()),
            RecordState::Pending | RecordState::Failed => {
                return Ok(RevertOutcome::refused(
                    "this action was never applied, so there is nothing to revert",
                    false,
                ));
            }
            RecordState::Applied => {}
        }
        let applied = record.applied.clone().unwrap_or_default();
        let refusal = self.undo(&store, &record, &applied).map_err(|e| {
            GatekeeperError::retryable(format!("{e}; nothing was reverted, try again"))
        })?;
        if let Some(message) = refusal {
            info!(%id, %message, "revert refused");
            return Ok(RevertOutcome::refused(message, false));
        }
        let mut next = (*record).clone();
        next.state = RecordState::Reverted;
        store.put(next).map_err(|e| {
            GatekeeperError::fatal(format!(
                "the revert was sent to the wiki but could not be recorded ({e}); do not revert it again"
            ))
        })?;
        info!(%id, "action reverted");
        Ok(RevertOutcome::done())
    }

    /// Undo one applied action. `Ok(Some(reason))`: refused, nothing written.
    fn undo(
        &self,
        store: &ActionStore,
        record: &ActionRecord,
        applied: &Applied,
    ) -> Result<Option<String>, ServiceError> {
        let service = &self.service;
        let careful = self.policy.careful_revert;
        let target = store.resolve(record.action.target());
        let Some(id) = applied
            .created
            .filter(|_| matches!(record.action, WikiAction::Create { .. }))
            .or(target.real())
        else {
            return Ok(Some(format!(
                "content {target} was never created, so there is nothing to revert"
            )));
        };
        let unchanged_since = |current: &Page, what: &str| -> Option<String> {
            let write = applied.write.as_ref()?;
            (current.version != write.after).then(|| {
                format!(
                    "content {id} changed after this {what} was applied (it wrote version {}, the content is now at version {}); reverting would erase those later changes, so nothing was written; restore it by hand if it is still wanted",
                    write.after, current.version
                )
            })
        };
        let put = |current: &Page, title: String, body: String| {
            service
                .update_content(
                    id,
                    ContentUpdate {
                        version: current.version + 1,
                        title,
                        body,
                        status: keep_status(current.status),
                    },
                )
                .map(|_| None)
        };
        match &record.action {
            WikiAction::Create { .. } => service.trash(id).map(|_| None),
            WikiAction::SetContent { .. } | WikiAction::AppendContent { .. } if !careful => {
                let Some(previous) = &record.staging.previous_markdown else {
                    return Ok(Some(
                        "cannot automatically revert this change: the prior content was not captured"
                            .to_owned(),
                    ));
                };
                let current = service.get_content(id)?;
                put(
                    &current,
                    current.title.clone(),
                    markdown_to_storage(previous),
                )
            }
            WikiAction::SetContent { .. } => {
                let current = service.get_content(id)?;
                if let Some(reason) = unchanged_since(&current, "replacement") {
                    return Ok(Some(reason));
                }
                let previous = applied
                    .write
                    .as_ref()
                    .map(|w| w.previous_body.clone())
                    .unwrap_or_default();
                put(&current, current.title.clone(), previous)
            }
            WikiAction::AppendContent { .. } => {
                let current = service.get_content(id)?;
                let fragment = applied.appended.clone().unwrap_or_default();
                if fragment.is_empty() {
                    return Ok(None);
                }
                let untouched = applied
                    .write
                    .as_ref()
                    .is_some_and(|w| w.after == current.version);
                let at = if untouched && current.body.ends_with(&fragment) {
                    current.body.len() - fragment.len()
                } else {
                    let found: Vec<usize> = current
                        .body
                        .match_indices(&fragment)
                        .map(|(i, _)| i)
                        .collect();
                    match found.as_slice() {
                        [at] => *at,
                        [] => {
                            return Ok(Some(format!(
                                "the text this action appended is no longer on content {id} as it was written (it was edited or removed since); nothing was written; remove what is left of it by hand if needed"
                            )));
                        }
                        many => {
                            return Ok(Some(format!(
                                "the text this action appended appears {} times on content {id}, so it cannot tell which one to remove; nothing was written; remove it by hand",
                                many.len()
                            )));
                        }
                    }
                };
                let mut body = current.body.clone();
                body.replace_range(at..at + fragment.len(), "");
                put(&current, current.title.clone(), body)
            }
            WikiAction::SetTitle { .. } => {
                let current = service.get_content(id)?;
                let title = if careful {
                    if let Some(reason) = unchanged_since(&current, "rename") {
                        return Ok(Some(reason));
                    }
                    applied
                        .write
                        .as_ref()
                        .map(|w| w.previous_title.clone())
                        .unwrap_or_default()
                } else {
                    record.staging.previous_title.clone().unwrap_or_default()
                };
                put(&current, title, current.body.clone())
            }
            WikiAction::AddComment { .. } => match applied.created {
                Some(comment) => service.delete_comment(id, comment).map(|_| None),
                None => Ok(None),
            },
            WikiAction::AddLabel { name, .. } => {
                if careful && applied.label_changed == Some(false) {
                    return Ok(None);
                }
                service.remove_label(id, name).map(|_| None)
            }
            WikiAction::RemoveLabel { name, .. } => {
                if careful && applied.label_changed == Some(false) {
                    return Ok(None);
                }
                service.add_label(id, name).map(|_| None)
            }
            WikiAction::Trash { .. } => service.restore(id).map(|_| None),
            WikiAction::Restore { .. } => service.trash(id).map(|_| None),
        }
    }
}

/// The pending actions a new action depends on: those the session saw that are still
/// pending, or gone (rejected), plus what they depend on. Applied ones are left out:
/// their effect is real now and can no longer be rejected.
fn dependency_closure(store: &ActionStore, seen: &[DriverActionId]) -> Vec<DriverActionId> {
    let mut out = BTreeSet::new();
    for id in seen {
        match store.get(*id) {
            None => {
                out.insert(*id);
            }
            Some(record) if record.state == RecordState::Pending => {
                out.insert(*id);
                for dep in &record.depends_on {
                    if store
                        .get(*dep)
                        .is_none_or(|d| d.state == RecordState::Pending)
                    {
                        out.insert(*dep);
                    }
                }
            }
            Some(_) => {}
        }
    }
    out.into_iter().collect()
}

/// Simulation order: the earliest pending action staged before `record` on the same
/// content, or on its provisional parent, names what must be applied first.
fn blocker(store: &ActionStore, record: &ActionRecord) -> Option<String> {
    let target = record.action.target();
    let key = store.resolve(target);
    let mut first = store
        .pending_on(key)
        .range(..record.id)
        .next()
        .map(|(_, r)| r.clone());
    if let WikiAction::Create {
        parent: Parent::Page { parent, .. },
        ..
    } = &record.action
    {
        let parent_key = store.resolve(*parent);
        if parent_key.is_provisional()
            && let Some((_, earlier)) = store.pending_on(parent_key).range(..record.id).next()
            && first.as_ref().is_none_or(|f| earlier.id < f.id)
        {
            first = Some(earlier.clone());
        }
    }
    let blocker = first?;
    let k = blocker.display_id();
    Some(match &blocker.action {
        WikiAction::Create { provisional, .. } => format!(
            "content ~{provisional} has not been created yet: apply {k} first (it creates ~{provisional}); nothing was sent"
        ),
        other => format!(
            "{k} ({} on {target}) was staged earlier on the same content and is still pending: apply {k} first, or reject it, so the page ends as the agent saw it; nothing was sent",
            other.verb()
        ),
    })
}

/// The pending actions visible in each part of a [`PageView`].
#[derive(Debug, Default)]
pub(crate) struct SeenFacets {
    /// For content not created yet: its create, which every read of it shows.
    pub(crate) existence: Option<DriverActionId>,
    pub(crate) title: Vec<DriverActionId>,
    pub(crate) body: Vec<DriverActionId>,
    pub(crate) labels: Vec<DriverActionId>,
    pub(crate) comments: Vec<DriverActionId>,
    pub(crate) status: Vec<DriverActionId>,
}

impl SeenFacets {
    /// Everything the whole view showed.
    pub(crate) fn all(&self) -> Vec<DriverActionId> {
        let mut all: Vec<DriverActionId> = self
            .existence
            .iter()
            .chain(&self.title)
            .chain(&self.body)
            .chain(&self.labels)
            .chain(&self.comments)
            .chain(&self.status)
            .copied()
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// What a read of one part showed: that part, and the content's existence.
    pub(crate) fn part(&self, part: &[DriverActionId]) -> Vec<DriverActionId> {
        self.existence.iter().chain(part).copied().collect()
    }
}

/// The hot-path result of [`ConfluenceGatekeeper::body`].
pub(crate) struct BodyRead {
    pub(crate) body: String,
    pub(crate) seen: Vec<DriverActionId>,
    pub(crate) kind: ContentKind,
    pub(crate) title: String,
    pub(crate) pending: usize,
}

#[async_trait]
impl Gatekeeper for ConfluenceGatekeeper {
    fn name(&self) -> &str {
        &self.name
    }

    async fn apply_action(&self, action: DriverActionId) -> Result<(), GatekeeperError> {
        self.apply_now(action)
    }

    async fn reject_action(
        &self,
        action: DriverActionId,
    ) -> Result<RejectOutcome, GatekeeperError> {
        self.reject_now(action)
    }

    async fn revert_action(
        &self,
        action: DriverActionId,
    ) -> Result<RevertOutcome, GatekeeperError> {
        self.revert_now(action)
    }

    /// None: every action is simulated, so none needs to skip the queue (spec §1.6).
    fn auto_approvable_actions(&self) -> Vec<ActionKind> {
        Vec::new()
    }
}

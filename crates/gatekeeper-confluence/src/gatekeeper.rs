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
//! 3. **Apply** ([`Gatekeeper::apply_action`]), at most once (see
//!    [below](#the-at-most-once-apply)): re-read the latest version, store the
//!    `applying` claim, write version + 1, store the outcome. Anything aimed at a `~N`
//!    not created yet fails, retryably, with "content ~N has not been created yet";
//!    nothing is created on the side. A 409 from the wiki fails retryably and leaves the
//!    action pending. Under [`Policy::refuse_stale`] a replace or retitle whose page
//!    moved on since the agent read it fails for good, an edit of a page in the trash
//!    is refused, and an append stacked on a replace that failed for good fails for
//!    good; under [`Policy::ordered_apply`] an action is refused while an earlier one on
//!    the same content (or its provisional parent) is pending; under
//!    [`Policy::track_dependencies`] while an action it depends on is pending.
//! 4. **Reject** ([`Gatekeeper::reject_action`]). The record is deleted; a create takes
//!    every pending action on it and on its provisional descendants with it, reported
//!    as `cascaded` under [`Policy::report_cascade`]. An `applying` action may already
//!    be in the wiki: rejecting it is refused.
//! 5. **Revert** ([`Gatekeeper::revert_action`]). The reference writes back a snapshot;
//!    under [`Policy::careful_revert`] only the action's own change is undone, or
//!    nothing is written and the refusal says why.
//!
//! # The at-most-once apply
//!
//! A wiki write is not idempotent (an append sent twice appends twice), and the
//! key-value port may be durable (SQLite), so an action must never be sent again after
//! a crash or a restart that may have come after the request left. What a caller can
//! rely on:
//!
//! - The `applying` claim is stored through the key-value port **before** the request
//!   is sent, and the outcome after it.
//! - An apply that finds the action `applying` refuses with "already being applied" and
//!   sends nothing; one that finds it `applied` succeeds and sends nothing.
//! - A gatekeeper opened over a record left `applying` ([`ConfluenceGatekeeper::open`])
//!   marks it `failed`, not retryable, with [`INTERRUPTED_MESSAGE`], and never sends
//!   it: reads stop showing it as pending, and approving it again returns that message.
//!
//! This is *at most once*, not exactly once: when the outcome is unknown, the driver
//! prefers losing a write to repeating it. The steps, all under the store lock:
//!
//! 1. **Read** the record. Unknown, or failed for good: refuse, final. `applying`:
//!    refuse, retryable, "already being applied". `applied` or `reverted`: succeed
//!    without sending anything.
//! 2. **Check and plan**, sending nothing: the order rule ([`Policy::ordered_apply`]),
//!    resolving `~N`, re-reading the latest version, the stale check
//!    ([`Policy::refuse_stale`]), the space lookup. The result is the one write request
//!    to send. A refusal here writes no claim: the record stays `pending` (retryable)
//!    or becomes `failed` (final).
//! 3. **Claim**: write the record as `applying` through the port's compare-and-set,
//!    only if the port still holds the record read in step 1. If another gatekeeper
//!    with the same store open got there first, nothing is sent: its outcome is
//!    reloaded, and an action it applied counts as applied. If the write fails, refuse,
//!    retryable: nothing was sent. **Nothing is sent before this write is stored**, so a
//!    crash from here on leaves a record that is never replayed.
//! 4. **Send** the request: the apply's only write to the wiki.
//! 5. **Record the outcome.** Accepted: for a create, the `prov:~N` mapping first; then
//!    the record as `applied`, with what revert and the stale check need. Refused by the
//!    wiki (a refused request changes nothing there, a 409 say): the record goes back
//!    to `pending`, retryable. If this write fails, the apply fails for good and the
//!    record stays `applying` in the port: no apply sends it again, and the next open
//!    marks it failed.
//!
//! Opening ([`ConfluenceGatekeeper::open`]) turns every record left `applying` into
//! `failed` before the gatekeeper can be used. The claim is a compare-and-set in the
//! port ([`KvStore::compare_and_set`]), so two processes with one store open never
//! both send an action. The rest of the store is not shared that carefully: staging
//! allocates ids from counters this process caches, so only one process should stage
//! into a store, and another process's index of pending work is refreshed only for an
//! action whose claim it lost (or when it is reopened).
//!
//! # Concurrency
//!
//! The wiki service is in-process and synchronous, so every apply, reject, revert,
//! staging and read runs its service calls and store updates under one lock, with no
//! `.await` inside. A read therefore never sees a write whose record is not yet marked
//! applied (which would show an append twice), and two applies of one action run one
//! after the other: the second finds it `applied` and sends nothing. Within a process, a
//! record is seen `applying` only when an apply could not record its outcome. Only the
//! kernel calls (`submit_action`, `authorize_observation`) are awaited, outside the
//! lock. A remote service behind an async port would need a per-content lock instead,
//! and the claim would then also be what stops a second apply while the first is in
//! flight.

use std::collections::{BTreeSet, HashMap};
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
use crate::held::HeldRecord;
use crate::kv::{KvError, KvStore};
use crate::markup::markdown_to_storage;
use crate::overlay::{
    CommentView, Pending, simulate_body, simulate_comments, simulate_labels, simulate_title,
    simulate_trashed,
};
use crate::policy::Policy;
use crate::record::{
    ActionRecord, Applied, ContentKind, ContentStatus, Parent, ParentOf, RecordState, Staging,
    VersionedWrite, WikiAction, WikiActionOf,
};
use crate::service::{ContentUpdate, NewContent, Page, ServiceError, WikiService};
use crate::session::WikiSession;
use crate::store::ActionStore;
use crate::view::{ContentSummary, PageView};

/// A message that may carry the wiki's own words, as a log field shows it: one delimited
/// line, no escape sequence, nothing hidden.
fn label(text: &str) -> prompt_sanitize::Sanitized {
    prompt_sanitize::untrusted_label(text, prompt_sanitize::MAX_INLINE_CHARS * 4)
}

/// A refusal's message as the kernel gets it: one line, controls and hidden characters
/// made visible, clipped at 2000 chars.
fn one_line(text: &str) -> String {
    prompt_sanitize::one_line(text, 2000).into_string()
}

/// The failure kept for an action found `applying` when the gatekeeper is opened: the
/// process stopped after the claim, so the request may or may not have reached the wiki.
pub const INTERRUPTED_MESSAGE: &str = "This call was interrupted after it had been sent, so it may or may not have taken effect. Check the wiki before staging it again.";

/// Why an apply did not happen.
enum Refusal {
    /// Nothing was sent; approving again may succeed.
    Retry(String),
    /// Nothing was sent, and approving again never will: stage it anew.
    Final(String),
}

/// The one write request an apply sends (step 4), as planned in step 2.
enum Request {
    /// Create the page or blog post.
    Create(NewContent),
    /// PUT the next version; `current` is the page it was derived from.
    Update {
        id: u64,
        current: Page,
        update: ContentUpdate,
        /// For an append: exactly the storage fragment added.
        appended: Option<String>,
    },
    /// Add a footer comment.
    Comment { id: u64, body: String },
    /// Add or remove a label.
    Label {
        id: u64,
        name: String,
        adding: bool,
        label_changed: Option<bool>,
    },
    /// Move to the trash.
    Trash(u64),
    /// Restore from the trash.
    Restore(u64),
}

impl Request {
    /// PUT version + 1 of `current` with this title and body, keeping a draft a draft.
    fn update(
        id: u64,
        current: Page,
        title: String,
        body: String,
        appended: Option<String>,
    ) -> Self {
        let update = ContentUpdate {
            version: current.version + 1,
            title,
            body,
            status: keep_status(current.status),
        };
        Self::Update {
            id,
            current,
            update,
            appended,
        }
    }
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

/// What a session knows when it stages an action: what its reads showed and what it
/// staged before.
pub(crate) struct Knowledge<'a> {
    /// The pending actions whose effect its reads showed.
    pub(crate) seen: &'a IdSet,
    /// The actions it staged itself.
    pub(crate) staged: &'a BTreeSet<DriverActionId>,
    /// The actions it staged itself, in staging order, less some already decided: the
    /// decided ones at the end are dropped when its head is looked for.
    pub(crate) open: &'a mut Vec<DriverActionId>,
    /// The version of each content (by resolved key) its last read of it showed.
    pub(crate) versions: &'a Versions,
}

/// A set of action ids that a read adds to and a staging looks up, in no order.
pub(crate) type IdSet = foldhash::HashSet<DriverActionId>;

/// The version of each content (by resolved key) a session's last read of it showed.
pub(crate) type Versions = foldhash::HashMap<ContentHandle, u64>;

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
    /// from it if it already holds some). Every record left `applying` by an apply that
    /// never recorded its outcome becomes `failed`, not retryable, with
    /// [`INTERRUPTED_MESSAGE`]: it may have reached the wiki, so it is never sent again.
    pub fn open(
        name: impl Into<String>,
        service: Arc<WikiService>,
        kv: Arc<dyn KvStore>,
        clock: Arc<dyn Clock>,
        policy: Policy,
    ) -> Result<Self, KvError> {
        let mut store = ActionStore::open(kv)?;
        // An action left `applying` may have reached the wiki: it fails for good, before
        // anything else can apply it.
        for id in store.fail_interrupted(INTERRUPTED_MESSAGE)? {
            warn!(%id, "apply interrupted after its claim; marked failed, it will not be sent again");
        }
        Ok(Self {
            name: name.into(),
            policy,
            service,
            clock,
            store: Mutex::new(store),
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
        self.store().records().map(|r| r.record()).collect()
    }

    /// One stored record.
    pub fn record(&self, id: DriverActionId) -> Option<ActionRecord> {
        self.store().get(id).map(|r| r.record())
    }

    /// The kernel's id for one of this gatekeeper's actions, once submitted.
    pub fn ledger_id(&self, id: DriverActionId) -> Option<LedgerId> {
        self.store().get(id).and_then(|r| r.ledger())
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
        let pending: Vec<&HeldRecord> = store.pending_on(key).values().map(|r| &**r).collect();
        let mut seen = SeenFacets::default();
        let view = match key {
            ContentHandle::Provisional(n) => {
                let create = store.create_of(n).ok_or(WikiError::NotFound(handle))?;
                let WikiActionOf::Create {
                    kind,
                    parent,
                    status,
                    ..
                } = create.action()
                else {
                    return Err(WikiError::NotFound(handle));
                };
                seen.existence = Some(create.id());
                let (title, by) = simulate_title(pending.iter().copied(), "");
                seen.title.extend(by);
                let status = simulate_trashed(&pending, &mut seen.status).unwrap_or(*status);
                PageView {
                    handle,
                    id: key,
                    kind: *kind,
                    space: create.string(parent.space()),
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
        let pending: Vec<&HeldRecord> = map.values().map(|r| &**r).collect();
        let mut seen = Vec::with_capacity(pending.len());
        let (kind, base_title, body, version) = match key {
            ContentHandle::Provisional(n) => {
                let create = store.create_of(n).ok_or(WikiError::NotFound(handle))?;
                let kind = match create.action() {
                    WikiActionOf::Create { kind, .. } => *kind,
                    _ => ContentKind::Page,
                };
                (
                    kind,
                    String::new(),
                    simulate_body(&pending, None, &mut seen),
                    0,
                )
            }
            ContentHandle::Real(id) => {
                let page = self.fetch(id, handle)?;
                let base = page.body_markdown();
                let body = simulate_body(&pending, Some(&base), &mut seen);
                (page.kind, page.title, body, page.version)
            }
        };
        let (title, _) = simulate_title(pending.iter().copied(), &base_title);
        Ok(BodyRead {
            key,
            version,
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
                    let pending: Vec<&HeldRecord> =
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
            let WikiActionOf::Create {
                provisional,
                kind,
                parent: ParentOf::Page { parent, .. },
                status,
                ..
            } = record.action()
            else {
                continue;
            };
            let child_key = store.resolve(ContentHandle::Provisional(*provisional));
            if record.state() != RecordState::Pending
                || !child_key.is_provisional()
                || store.resolve(*parent) != key
            {
                continue;
            }
            let pending: Vec<&HeldRecord> =
                store.pending_on(child_key).values().map(|r| &**r).collect();
            let status = simulate_trashed(&pending, &mut seen).unwrap_or(*status);
            if status == ContentStatus::Trashed {
                continue;
            }
            let (title, by) = simulate_title(pending.iter().copied(), "");
            seen.extend(by);
            seen.push(record.id());
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
        knowledge: &mut Knowledge<'_>,
    ) -> Result<Prepared, WikiError> {
        let mut store = self.store();
        let mut unread_base = None;
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
                let (staging, unread) = self.capture(&store, &action, knowledge.versions)?;
                unread_base = unread;
                (action, staging, None)
            }
        };
        let id = store.allocate_action()?;
        let depends_on = if self.policy.track_dependencies {
            dependencies(&store, knowledge, &action)
        } else {
            Vec::new()
        };
        let mut description = card::describe(&action, &staging, self.policy.refuse_stale);
        if let Some(version) = unread_base {
            card::note_unread(&mut description, version);
        }
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
        let mut record = record.record();
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
                match create.action() {
                    WikiActionOf::Create {
                        kind: ContentKind::BlogPost,
                        ..
                    } => Err(WikiError::BlogPostChildren(parent)),
                    WikiActionOf::Create { parent: p, .. } => Ok(create.string(p.space())),
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
    ///
    /// Under [`Policy::refuse_stale`] the version staged against is the one the agent's
    /// session last read of this content (`versions`, by resolved key): a person's edit
    /// made between that read and this staging must not be erased. If the session never
    /// read a real page, it is the page's version now, and the second value is that
    /// version, so the card can say the agent never saw the page.
    fn capture(
        &self,
        store: &ActionStore,
        action: &WikiAction,
        versions: &Versions,
    ) -> Result<(Staging, Option<u64>), WikiError> {
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
            return Ok((Staging::default(), None));
        }
        let base = match key {
            ContentHandle::Real(id) => Some(self.fetch(id, target)?),
            ContentHandle::Provisional(_) => None,
        };
        let pending: Vec<&HeldRecord> = store.pending_on(key).values().map(|r| &**r).collect();
        let now = base.as_ref().map_or(0, |p| p.version);
        let mut unread = None;
        let base_version = if self.policy.refuse_stale && !key.is_provisional() {
            match versions.get(&key).or_else(|| versions.get(&target)) {
                Some(seen) => *seen,
                None => {
                    if !matches!(action, WikiAction::AppendContent { .. }) {
                        unread = Some(now);
                    }
                    now
                }
            }
        } else {
            now
        };
        let mut staging = Staging {
            base_version,
            ..Staging::default()
        };
        if let WikiAction::SetTitle { .. } = action {
            let base_title = base.as_ref().map_or("", |p| p.title.as_str());
            staging.previous_title = Some(simulate_title(pending.iter().copied(), base_title).0);
        } else if !self.policy.careful_revert {
            // Only the reference's revert writes the whole earlier body back. A careful
            // revert undoes the action's own change from what apply records (the
            // replaced body, or the appended block), so nothing is kept here: a page
            // with many pending appends would otherwise hold one copy of its growing
            // body per append, memory quadratic in pending work.
            let base_body = base.as_ref().map(Page::body_markdown);
            staging.previous_markdown = Some(simulate_body(
                &pending,
                base_body.as_deref(),
                &mut Vec::new(),
            ));
        }
        Ok((staging, unread))
    }

    // ----- apply -----

    /// Send an approved action to the wiki at most once: the five steps of
    /// [the at-most-once apply](crate::gatekeeper#the-at-most-once-apply), under the
    /// store lock.
    fn apply_now(&self, id: DriverActionId) -> Result<(), GatekeeperError> {
        let mut store = self.store();
        // Step 1: read the record.
        let Some(held) = store.get(id).cloned() else {
            return Err(GatekeeperError::not_sent(format!(
                "unknown action {id}: the wiki gatekeeper holds no such action (it was dropped with a rejected page, or never staged), so nothing was sent; reject it"
            )));
        };
        let record = held.record();
        match record.state {
            RecordState::Applied | RecordState::Reverted => return Ok(()),
            RecordState::Failed => {
                return Err(GatekeeperError::fatal(
                    record.failure.clone().unwrap_or_else(|| {
                        "this action failed for good earlier; stage it again".to_owned()
                    }),
                ));
            }
            RecordState::Applying => {
                info!(%id, "apply refused: already being applied");
                return Err(GatekeeperError::retryable(format!(
                    "{} is already being applied, so nothing was sent again; wait for that attempt's outcome (if it could not be recorded, the action stays claimed until the gatekeeper is reopened, which marks it failed)",
                    record.display_id()
                )));
            }
            RecordState::Pending => {}
        }
        // Step 2: check and plan; nothing is sent and nothing is claimed yet.
        if self.policy.ordered_apply
            && let Some(message) = blocker(&store, &record)
        {
            info!(%id, "apply refused: an earlier action is pending");
            return Err(GatekeeperError::retryable(message));
        }
        if self.policy.track_dependencies
            && let Some(message) = undecided_dependency(&store, &record)
        {
            info!(%id, "apply refused: an action it depends on is pending");
            return Err(GatekeeperError::retryable(message));
        }
        let request = match self.plan(&mut store, &record) {
            Ok(request) => request,
            Err(refusal) => return Err(self.refused(&mut store, &record, refusal, false)),
        };
        // Step 3: the claim is stored before anything is sent, by a compare-and-set over
        // the record as read in step 1, so that of two gatekeepers with this store open
        // at most one claims it.
        let mut claim = record.clone();
        claim.state = RecordState::Applying;
        match store.claim(&held, claim) {
            Ok(Ok(())) => {}
            Ok(Err(now)) => return claimed_elsewhere(id, now.as_deref()),
            Err(error) => {
                warn!(%id, %error, "apply failed: the claim could not be recorded; nothing was sent");
                return Err(GatekeeperError::retryable(format!(
                    "{error}; the claim to apply this could not be recorded, so nothing was sent; approve again to retry"
                )));
            }
        }
        // Step 4: the only send.
        let sent = self.send(request);
        // Step 5: record the outcome.
        match sent {
            Ok(applied) => self.settle_sent(&mut store, &record, applied),
            // The wiki refused the request, and a refused request changes nothing there.
            Err(error) => Err(self.refused(&mut store, &record, from_service(error), true)),
        }
    }

    /// Step 5 after the wiki accepted the request: the `prov:~N` mapping of a create,
    /// then the record as `applied`. When either cannot be written the apply fails for
    /// good: the record is left `applying` (or `failed`), so it is never sent again.
    fn settle_sent(
        &self,
        store: &mut ActionStore,
        record: &ActionRecord,
        applied: Applied,
    ) -> Result<(), GatekeeperError> {
        let id = record.id;
        if let WikiAction::Create { provisional, .. } = record.action
            && let Some(created) = applied.created
            && let Err(error) = store.set_provisional(provisional, created)
        {
            let message = format!(
                "content {created} was created, but its handle ~{provisional} could not be recorded ({error}); do not stage it again, that would create a duplicate"
            );
            warn!(%id, message = %label(&message), "apply sent, outcome not recorded");
            let mut next = record.clone();
            next.state = RecordState::Failed;
            next.failure = Some(message.clone());
            if let Err(error) = store.put(next) {
                warn!(%id, %error, "could not record the failure; the claim stays");
            }
            return Err(GatekeeperError::fatal(message));
        }
        let mut next = record.clone();
        next.state = RecordState::Applied;
        next.applied = Some(applied);
        if let Err(error) = store.put(next) {
            warn!(%id, %error, "apply sent, outcome not recorded; the claim stays");
            return Err(GatekeeperError::fatal(format!(
                "the change was sent to the wiki but could not be recorded ({error}); the action stays claimed and will not be sent again; check the content before approving anything else on it"
            )));
        }
        info!(%id, "action applied");
        Ok(())
    }

    /// Record an apply that reached nothing in the wiki: a retryable refusal leaves the
    /// record (or puts it back, if `claimed`) `pending`; a final one marks it `failed`.
    /// When `claimed`, the refusal is the wiki's answer (the service answered with an
    /// error); otherwise the gatekeeper refused before sending (not sent).
    fn refused(
        &self,
        store: &mut ActionStore,
        record: &ActionRecord,
        refusal: Refusal,
        claimed: bool,
    ) -> GatekeeperError {
        let id = record.id;
        // The message may quote the wiki, and through it the agent: one line, nothing
        // hidden, before the kernel logs it and the ledger keeps it.
        let refusal = match refusal {
            Refusal::Retry(message) => Refusal::Retry(one_line(&message)),
            Refusal::Final(message) => Refusal::Final(one_line(&message)),
        };
        let (next, error) = match refusal {
            Refusal::Retry(message) => {
                warn!(%id, message = %label(&message), "apply failed; nothing was written");
                let error = if claimed {
                    GatekeeperError::service_error(message, true)
                } else {
                    GatekeeperError::retryable(message)
                };
                (claimed.then(|| record.clone()), error)
            }
            Refusal::Final(message) => {
                warn!(%id, message = %label(&message), "apply refused for good; nothing was written");
                let mut next = record.clone();
                next.state = RecordState::Failed;
                next.failure = Some(message.clone());
                let error = if claimed {
                    GatekeeperError::service_error(message, false)
                } else {
                    GatekeeperError::not_sent(message)
                };
                (Some(next), error)
            }
        };
        let Some(next) = next else {
            return error;
        };
        match store.put(next) {
            Ok(_) => error,
            Err(kv) if claimed => {
                warn!(%id, error = %kv, "could not release the claim of an apply that sent nothing");
                GatekeeperError {
                    message: format!(
                        "{}; but that nothing was sent could not be recorded ({kv}), so the action stays claimed and is marked failed when the gatekeeper is reopened; stage it again",
                        error.message
                    ),
                    retryable: false,
                    kind: error.kind,
                }
            }
            Err(kv) => {
                warn!(%id, error = %kv, "could not record the failure");
                error
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
        // The versions each earlier applied write of this gatekeeper went from and to.
        let writes: Vec<(u64, u64)> = store
            .applied_writes_on(content)
            .iter()
            .filter(|w| **w < record.id)
            .filter_map(|w| store.get(*w))
            .filter_map(|r| r.record().applied?.write)
            .map(|w| (w.before, w.after))
            .collect();
        let mut expected = base;
        loop {
            let next = writes
                .iter()
                .find(|(before, after)| *before == expected && *after > expected)
                .map(|(_, after)| *after);
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

    /// Step 2: every read and check an apply makes before it writes, ending in the one
    /// request it will send. Sends nothing; the only port write is the space-id cache.
    fn plan(&self, store: &mut ActionStore, record: &ActionRecord) -> Result<Request, Refusal> {
        let service = &self.service;
        match &record.action {
            WikiAction::Create {
                kind,
                parent,
                title,
                content,
                status,
                ..
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
                Ok(Request::Create(NewContent {
                    kind: *kind,
                    space_id,
                    parent: parent_id,
                    title: title.clone(),
                    body: markdown_to_storage(content.as_deref().unwrap_or("")),
                    status: *status,
                }))
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
                    check_status(&current, "replacement")?;
                }
                let (title, body) = (current.title.clone(), markdown_to_storage(markdown));
                Ok(Request::update(id, current, title, body, None))
            }
            WikiAction::AppendContent { target, markdown } => {
                let id = self.require_resolved(store, *target)?;
                let current = service.get_content(id).map_err(from_service)?;
                if self.policy.refuse_stale {
                    check_stacked(store, record, ContentHandle::Real(id))?;
                    check_status(&current, "append")?;
                }
                let fragment = markdown_to_storage(markdown);
                let (title, body) = (current.title.clone(), format!("{}{fragment}", current.body));
                Ok(Request::update(id, current, title, body, Some(fragment)))
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
                    check_status(&current, "rename")?;
                }
                let body = current.body.clone();
                Ok(Request::update(id, current, title.clone(), body, None))
            }
            WikiAction::AddComment { target, text } => {
                let id = self.require_resolved(store, *target)?;
                // The reference reads the target to choose the comment container.
                service.get_content(id).map_err(from_service)?;
                Ok(Request::Comment {
                    id,
                    body: markdown_to_storage(text),
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
                Ok(Request::Label {
                    id,
                    name: name.clone(),
                    adding,
                    label_changed,
                })
            }
            WikiAction::Trash { target } => {
                Ok(Request::Trash(self.require_resolved(store, *target)?))
            }
            WikiAction::Restore { target } => {
                Ok(Request::Restore(self.require_resolved(store, *target)?))
            }
        }
    }

    /// Step 4: send the one request, and say what it did (for revert and the stale check).
    /// An error means the wiki refused it and nothing changed there.
    fn send(&self, request: Request) -> Result<Applied, ServiceError> {
        let service = &self.service;
        match request {
            Request::Create(new) => {
                let created = service.create_content(new)?;
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
            Request::Update {
                id,
                current,
                update,
                appended,
            } => {
                let updated = service.update_content(id, update)?;
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
            Request::Comment { id, body } => Ok(Applied {
                created: Some(service.add_comment(id, body, &self.name)?),
                ..Applied::default()
            }),
            Request::Label {
                id,
                name,
                adding,
                label_changed,
            } => {
                if adding {
                    service.add_label(id, &name)?;
                } else {
                    service.remove_label(id, &name)?;
                }
                Ok(Applied {
                    label_changed,
                    ..Applied::default()
                })
            }
            Request::Trash(id) => service.trash(id).map(|()| Applied::default()),
            Request::Restore(id) => service.restore(id).map(|()| Applied::default()),
        }
    }

    // ----- reject -----

    fn reject_now(&self, id: DriverActionId) -> Result<RejectOutcome, GatekeeperError> {
        let mut store = self.store();
        let Some(record) = store.get(id).cloned() else {
            // Already gone (dropped with a rejected page): nothing to do.
            return Ok(RejectOutcome::default());
        };
        if record.state() == RecordState::Applying {
            return Err(GatekeeperError::retryable(format!(
                "{} is being applied right now (or its outcome could not be recorded), so it may already be in the wiki and can no longer be rejected; wait for its outcome",
                record.display_id()
            )));
        }
        if record.state() != RecordState::Pending {
            // An applied action stays, so that it can still be reverted.
            return Ok(RejectOutcome::default());
        }
        let fail = |e: KvError| GatekeeperError::retryable(format!("{e}; reject it again"));
        store.delete(id).map_err(fail)?;
        let mut gone_records: Vec<Arc<HeldRecord>> = vec![record.clone()];
        let mut dropped: Vec<DriverActionId> = Vec::new();
        let mut restart;
        if let WikiActionOf::Create { provisional, .. } = *record.action() {
            // The purge set: this `~N` and, to a fixed point, every pending child-page
            // create under a purged `~N`.
            let mut purge: BTreeSet<u64> = BTreeSet::from([provisional]);
            loop {
                let more: Vec<u64> = store
                    .records()
                    .filter(|r| r.state() == RecordState::Pending)
                    .filter_map(|r| match r.action() {
                        WikiActionOf::Create {
                            provisional: child,
                            parent:
                                ParentOf::Page {
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
                .filter(|r| r.state() == RecordState::Pending)
                .filter(|r| {
                    matches!(r.action().target(), ContentHandle::Provisional(n) if purge.contains(&n))
                })
                .map(|r| r.id())
                .collect();
            for victim in &dropped {
                if let Some(gone) = store.get(*victim) {
                    gone_records.push(gone.clone());
                }
                store.delete(*victim).map_err(fail)?;
            }
            restart = !dropped.is_empty();
        } else {
            let key = store.resolve(record.action().target());
            restart = !store.pending_on(key).is_empty();
        }
        if self.policy.track_dependencies {
            restart |= hand_on_dependencies(&mut store, &gone_records).map_err(fail)?;
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
        let Some(record) = store.get(id).map(|r| r.record()) else {
            return Err(GatekeeperError::not_sent(format!(
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
            RecordState::Applying => {
                return Ok(RevertOutcome::refused(
                    "this action is being applied right now (or its outcome could not be recorded), so what it changed is not known; check the wiki",
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
            info!(%id, message = %label(&message), "revert refused");
            return Ok(RevertOutcome::refused(message, false));
        }
        let mut next = record.clone();
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
        // What a careful revert needs to know it undoes only this action's change.
        let no_record = || {
            Ok(Some(format!(
                "there is no record of what applying this {} wrote to content {id} (it was stored before that was recorded), so it cannot be undone safely; nothing was written; undo it by hand if needed",
                record.action.verb()
            )))
        };
        let trashed = |current: &Page| -> Option<String> {
            (current.status == ContentStatus::Trashed).then(|| {
                format!(
                    "content {id} is in the trash (someone trashed it after this action was applied); reverting this {} would take it out of the trash as a side effect, so nothing was written; restore it first if the revert is still wanted",
                    record.action.verb()
                )
            })
        };
        let careful_current =
            |what_needed: bool| -> Result<Result<Page, Option<String>>, ServiceError> {
                if !what_needed {
                    return Ok(Err(no_record()?));
                }
                let current = service.get_content(id)?;
                Ok(match trashed(&current) {
                    Some(reason) => Err(Some(reason)),
                    None => Ok(current),
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
            WikiAction::Create { .. } if careful => {
                let Some(write) = applied.write.as_ref().filter(|_| applied.created.is_some())
                else {
                    return no_record();
                };
                let current = service.get_content(id)?;
                if current.version != write.after {
                    return Ok(Some(format!(
                        "content {id} changed after it was created (it was created at version {}, it is now at version {}); trashing it would throw those changes away, so nothing was written; trash it by hand if that is still wanted",
                        write.after, current.version
                    )));
                }
                service.trash(id).map(|_| None)
            }
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
                let current = match careful_current(applied.write.is_some())? {
                    Ok(current) => current,
                    Err(reason) => return Ok(reason),
                };
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
                let known = applied.write.is_some() && applied.appended.is_some();
                let current = match careful_current(known)? {
                    Ok(current) => current,
                    Err(reason) => return Ok(reason),
                };
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
                let current = if careful {
                    match careful_current(applied.write.is_some())? {
                        Ok(current) => current,
                        Err(reason) => return Ok(reason),
                    }
                } else {
                    service.get_content(id)?
                };
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
                None if careful => no_record(),
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

/// Whether a record in `state` is still undecided: pending, or claimed by an apply in
/// flight.
fn undecided(state: RecordState) -> bool {
    matches!(state, RecordState::Pending | RecordState::Applying)
}

/// Whether an action changes the body (replace or append): the actions whose order on
/// one page decides the text an append lands on.
fn edits_body<T>(action: &WikiActionOf<T>) -> bool {
    matches!(
        action,
        WikiActionOf::SetContent { .. } | WikiActionOf::AppendContent { .. }
    )
}

/// The actions a new action depends on directly. Linear in what the session saw, not in
/// what it staged: the session's own actions form a chain, each depending on the one
/// staged just before it that was still undecided, so every earlier one still
/// undecided is reached through it (an action is never applied while one it depends on
/// is undecided, and an undecided action never was decided before).
///
/// - The session's *head*: its latest action still undecided.
/// - For a replace or an append, the session's latest undecided replace or append on
///   the same content, so the body it lands on is one step away ([`check_stacked`]).
/// - Those the session *saw* (their simulated effect was in a read) that are still
///   undecided, gone (rejected), or failed for good, with what those depend on in turn
///   (one level; the rest is reached through them). Its own actions it saw that are
///   still undecided are left to the chain.
///
/// Applied and reverted ones are left out: their effect is real (or undone) now, and
/// the agent's next read shows it. The kernel flags dependents through chains of open
/// actions, and the driver's checks ([`undecided_dependency`], [`check_stacked`]) walk
/// them, so what the chain leaves out directly is still covered.
fn dependencies(
    store: &ActionStore,
    knowledge: &mut Knowledge<'_>,
    action: &WikiAction,
) -> Vec<DriverActionId> {
    let mut out = BTreeSet::new();
    // A decided action never becomes undecided again, so dropping the decided ones at
    // the end for good keeps finding the head constant time, amortized.
    while let Some(last) = knowledge.open.last() {
        if store.get(*last).is_some_and(|r| undecided(r.state())) {
            break;
        }
        knowledge.open.pop();
    }
    let head = knowledge.open.last().copied();
    out.extend(head);
    if edits_body(action) {
        let key = store.resolve(action.target());
        let previous = store
            .pending_on(key)
            .values()
            .rev()
            .find(|r| edits_body(r.action()) && knowledge.staged.contains(&r.id()));
        out.extend(previous.map(|r| r.id()));
    }
    let add = |out: &mut BTreeSet<DriverActionId>, record: &HeldRecord| {
        out.insert(record.id());
        if undecided(record.state()) {
            for dep in record.depends_on() {
                if store
                    .get(dep)
                    .is_none_or(|d| undecided(d.state()) || d.state() == RecordState::Failed)
                {
                    out.insert(dep);
                }
            }
        }
    };
    for id in knowledge.seen {
        match store.get(*id) {
            None => {
                out.insert(*id);
            }
            Some(record)
                if undecided(record.state())
                    && knowledge.staged.contains(id)
                    && head.is_some_and(|h| *id <= h) => {}
            Some(record) if undecided(record.state()) || record.state() == RecordState::Failed => {
                add(&mut out, record);
            }
            Some(_) => {}
        }
    }
    out.into_iter().collect()
}

/// Search what `record` depends on, directly or in turn, for a record `wanted` accepts;
/// among those found, the one with the lowest id. The walk goes through records that
/// are undecided or failed for good, not through applied or reverted ones: an action is
/// applied only once nothing it depends on is undecided, and what a rejected action
/// depended on was handed on to its dependents when it was rejected.
fn find_dependency<'s>(
    store: &'s ActionStore,
    record: &ActionRecord,
    wanted: impl Fn(&HeldRecord) -> bool,
) -> Option<&'s Arc<HeldRecord>> {
    let mut visited = BTreeSet::new();
    let mut stack: Vec<DriverActionId> = record.depends_on.clone();
    let mut found: Option<&'s Arc<HeldRecord>> = None;
    while let Some(id) = stack.pop() {
        if !visited.insert(id) {
            continue;
        }
        let Some(dep) = store.get(id) else {
            continue;
        };
        if wanted(dep) && found.is_none_or(|f| dep.id() < f.id()) {
            found = Some(dep);
        }
        if undecided(dep.state()) || dep.state() == RecordState::Failed {
            stack.extend(dep.depends_on());
        }
    }
    found
}

/// The first action `record` depends on, directly or in turn, that is still undecided,
/// as a refusal: a dependent applied before its dependency is decided would make real
/// what the person may still reject (a comment quoting a rename that is then rejected).
fn undecided_dependency(store: &ActionStore, record: &ActionRecord) -> Option<String> {
    let dep = find_dependency(store, record, |d| undecided(d.state()))?;
    let k = dep.display_id();
    let this = record.display_id();
    Some(format!(
        "{this} depends on {k} ({} on {}), which is still pending: the agent built {this} on it, so approve or reject {k} first; nothing was sent",
        dep.action().verb(),
        dep.action().target()
    ))
}

/// A rejected action (and those dropped with it) is deleted, so what it depended on would
/// no longer be reachable through it: every pending action that depends on one of
/// `gone` is rewritten to depend also on what that one depended on (to a fixed point
/// when gone ones depend on each other), so the walk of [`find_dependency`] still
/// reaches it. Returns whether any pending action depended on one of them.
fn hand_on_dependencies(
    store: &mut ActionStore,
    gone: &[Arc<HeldRecord>],
) -> Result<bool, KvError> {
    let inherited: HashMap<DriverActionId, Vec<DriverActionId>> = gone
        .iter()
        .map(|r| (r.id(), r.depends_on().collect()))
        .collect();
    let dependents: Vec<ActionRecord> = store
        .records()
        .filter(|r| r.state() == RecordState::Pending)
        .filter(|r| r.depends_on().any(|d| inherited.contains_key(&d)))
        .map(|r| r.record())
        .collect();
    let any = !dependents.is_empty();
    for mut dependent in dependents {
        let mut deps: BTreeSet<DriverActionId> = dependent.depends_on.iter().copied().collect();
        let mut todo: Vec<DriverActionId> = dependent.depends_on.clone();
        while let Some(d) = todo.pop() {
            for more in inherited.get(&d).map_or(&[][..], Vec::as_slice) {
                if deps.insert(*more) {
                    todo.push(*more);
                }
            }
        }
        if deps.len() != dependent.depends_on.len() {
            dependent.depends_on = deps.into_iter().collect();
            store.put(dependent)?;
        }
    }
    Ok(any)
}

/// Step 3 lost: the stored record was no longer the one read in step 1, because another
/// gatekeeper with the same store open claimed, applied, failed or dropped it. Nothing
/// was sent; `now` is the record as stored now.
fn claimed_elsewhere(id: DriverActionId, now: Option<&HeldRecord>) -> Result<(), GatekeeperError> {
    info!(%id, state = ?now.map(|r| r.state()), "apply refused: the claim was lost to another gatekeeper");
    let Some(now) = now else {
        return Err(GatekeeperError::not_sent(format!(
            "action {id} was dropped by another process sharing this gatekeeper's store (rejected there), so nothing was sent; reject it"
        )));
    };
    match now.state() {
        RecordState::Applied | RecordState::Reverted => Ok(()),
        RecordState::Failed => Err(GatekeeperError::fatal(now.record().failure.unwrap_or_else(
            || "this action failed for good in another process; stage it again".to_owned(),
        ))),
        RecordState::Applying => Err(GatekeeperError::retryable(format!(
            "{} is being applied by another process sharing this gatekeeper's store, so nothing was sent again; wait for that attempt's outcome",
            now.display_id()
        ))),
        RecordState::Pending => Err(GatekeeperError::retryable(format!(
            "{} was changed by another process sharing this gatekeeper's store while this apply checked it, so nothing was sent; approve again",
            now.display_id()
        ))),
    }
}

/// A staged edit never changes a page's status as a side effect: an update of trashed
/// content would publish it again, so an edit of a page in the trash is refused.
fn check_status(current: &Page, what: &str) -> Result<(), Refusal> {
    if current.status != ContentStatus::Trashed {
        return Ok(());
    }
    Err(Refusal::Retry(format!(
        "content {} is in the trash, and applying this {what} would take it out of the trash as a side effect; nothing was written; restore the page first and approve again, or reject this",
        current.id
    )))
}

/// An append the agent saw stacked on a replacement of the same body (the replacement
/// is among what it depends on) must not land on text the agent never saw: if that
/// replacement failed for good, the append is refused for good too.
fn check_stacked(
    store: &ActionStore,
    record: &ActionRecord,
    content: ContentHandle,
) -> Result<(), Refusal> {
    let failed = find_dependency(store, record, |d| {
        d.state() == RecordState::Failed
            && matches!(d.action(), WikiActionOf::SetContent { .. })
            && store.resolve(d.action().target()) == content
    });
    let Some(replace) = failed else {
        return Ok(());
    };
    Err(Refusal::Final(format!(
        "this append was staged on top of {}, a replacement of the same body that failed for good, so the page does not hold the text it was appended to; nothing was written; re-read the page and stage again",
        replace.display_id()
    )))
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
            && first.as_ref().is_none_or(|f| earlier.id() < f.id())
        {
            first = Some(earlier.clone());
        }
    }
    let blocker = first?;
    let k = blocker.display_id();
    Some(match blocker.action() {
        WikiActionOf::Create { provisional, .. } => format!(
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
    /// What the handle resolved to.
    pub(crate) key: ContentHandle,
    /// The wiki's version of the content (0 while it does not exist yet).
    pub(crate) version: u64,
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

    /// Send the action at most once: the steps of
    /// [the at-most-once apply](crate::gatekeeper#the-at-most-once-apply).
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

    /// None: every action is simulated, so none needs to skip the queue (as in the reference).
    fn auto_approvable_actions(&self) -> Vec<ActionKind> {
        Vec::new()
    }
}

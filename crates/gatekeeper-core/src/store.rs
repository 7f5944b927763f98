//! The action store: the life of a staged call, and the apply that sends it at most once.
//!
//! # What a caller can rely on
//!
//! - A staged call reaches the service **at most once**. Two applies racing on one action
//!   send it once; the loser is told the action is already being applied.
//! - A failure is **retryable only if the service is known not to have run the tool**
//!   (credentials refused, request declined, never dispatched). Then nothing was sent, the
//!   same approval may be given again, or the action rejected. Any other failure (timeout,
//!   dropped connection, unreadable reply) is final: the write may have landed, so the call
//!   is never sent again, and a person is asked to check the service.
//! - A store opened over records left by a previous process turns every call still marked
//!   `applying` into a final failure. Such a call may have landed; it is never replayed.
//! - A claim whose attempt ended without an outcome while the process lives on (the apply
//!   future was dropped by a deadline or by its caller, a panic unwound through it, or the
//!   outcome could not be written) is **stranded**: the store remembers it and, at its
//!   next use, turns it into the same final failure. It is never left "being applied",
//!   never replayed, and no restart is needed.
//! - A call that succeeded is recorded as applied even when its reply is too large to keep
//!   (it is replaced by a note) or cannot be encoded.
//! - At most [`MAX_OPEN_ACTIONS`] calls are open per store: pending, applying, or failed
//!   in a way a person may retry (the same "open" as the kernel's ledger: such a call still
//!   waits for a person). The newest [`RETAINED_FINAL_ACTIONS`] final records are kept;
//!   older ones are pruned when a store opens and then at every [`PRUNE_EVERY`]th call it
//!   settles, so at most `PRUNE_EVERY - 1` more wait for the next prune. Open records are
//!   never pruned. So a store written by one process holds at most 165 records per
//!   gatekeeper; 229 on a backend that runs that prune with its next stage
//!   ([`ActionStorage::retain_final`]), which waits for at most 64 more calls settled.
//!
//! This is *at most once*, not exactly once: when the outcome is unknown, the store prefers
//! losing a result to repeating a write.
//!
//! # States
//!
//! ```text
//! (stage) ──► pending ──apply──► applying ──ok──► applied          (apply again: no-op)
//!               │                    └──err──► failed{retryable}
//!               │                                 ├ retryable ──apply──► applying …
//!               │                                 └ retryable ──reject─► rejected
//!               ├──reject──► rejected                                (reject again: no-op)
//!               └──discard─► (deleted)
//! applying ──(store reopened, or the attempt stranded)──► failed{retryable: false}
//! ```
//!
//! Rejecting a *retryable* failure is our addition (the reference refuses it, leaving the
//! action stuck): nothing was sent, so saying no is as safe as for a pending action.
//!
//! # The at-most-once protocol of [`ActionStore::apply`]
//!
//! 1. Read the record. Unknown, rejected, a final failure, or already applying: refuse
//!    with distinct errors. Already applied: succeed without sending anything.
//! 2. Derive the claim with [`ActionRecord::begin_apply`]: state `applying`, claim time set.
//! 3. Write the claim with [`ActionStorage::compare_and_set`] from the state read in step 1,
//!    and await the write. If another apply changed the record first, go back to step 1
//!    (which now refuses). **Nothing is sent before this write is stored**, so a crash
//!    after it leaves a record that is never replayed (see the open step below).
//! 4. Send the call: the only send.
//! 5. Settle with [`ActionRecord::settle`]: `applied` with the retained result, or
//!    `failed` with `retryable` = the service is known not to have run the tool; write it
//!    with compare-and-set from `applying`.
//! 6. Prune final records beyond the retention limit.
//!
//! From step 3 to the end of step 5 the attempt holds a guard. If the attempt ends in
//! between (its future is dropped or unwinds, or step 5's write fails), the guard marks
//! the claim stranded, and every public method of the store first settles stranded claims
//! ([`ActionRecord::interrupt`], compare-and-set from `applying`).
//!
//! Opening a store ([`ActionStore::open`]) first turns every leftover `applying` record
//! into a final failure ([`ActionRecord::interrupt`]), then prunes.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use kernel::{Clock, DriverActionId, FailureKind, Timestamp};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tracing::{debug, info, warn};

use crate::service::{CallError, Content, ToolResult, ToolService};

/// An untrusted name or a service's message as a log field shows it: one delimited line, no
/// escape sequence, nothing hidden.
fn label(text: &str) -> prompt_sanitize::Sanitized {
    prompt_sanitize::untrusted_label(text, prompt_sanitize::MAX_INLINE_CHARS)
}

/// The largest accepted arguments, as bytes of compact UTF-8 JSON.
pub const MAX_ARGUMENT_BYTES: usize = 64 * 1024;
/// The most calls that may be pending or applying in one store.
pub const MAX_OPEN_ACTIONS: usize = 50;
/// The largest result kept, as bytes of compact UTF-8 JSON; larger ones become a note.
pub const MAX_RESULT_BYTES: usize = 128 * 1024;
/// How many final records (applied, rejected, failed for good) are kept, newest by id.
pub const RETAINED_FINAL_ACTIONS: usize = 100;
/// How many calls a store settles between two prunes of its final records (see the
/// module docs). A prune looks at the store and deletes; doing it once per call settled
/// cost a durable store one more read and one more write per action, and touched the
/// pages of the oldest record each time.
pub const PRUNE_EVERY: usize = 16;

/// The failure text of a call whose outcome is unknown after it was sent.
pub const OUTCOME_UNKNOWN_MESSAGE: &str = "This call failed after it had been sent, so it may or may not have taken effect. Check the service before staging it again.";
/// The failure text of a call found `applying` when a store was opened.
pub const INTERRUPTED_MESSAGE: &str = "This call was interrupted after it had been sent, so it may or may not have taken effect. Check the service before trying it again.";
/// The result kept when a successful reply could not be encoded.
pub const UNREADABLE_RESULT_MESSAGE: &str =
    "(The call succeeded, but its response could not be read back.)";

/// A storage backend refused or failed an operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("action storage failed: {0}")]
pub struct StorageError(pub String);

/// The name of a state, without its data: what [`ActionStorage::compare_and_set`] compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StateTag {
    /// Staged, not yet decided.
    Pending,
    /// Claimed by an apply; the call may be in flight.
    Applying,
    /// Sent, and the service replied.
    Applied,
    /// The apply failed.
    Failed,
    /// A person said no; nothing was sent.
    Rejected,
}

impl StateTag {
    /// Lower-case name, as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Applying => "applying",
            Self::Applied => "applied",
            Self::Failed => "failed",
            Self::Rejected => "rejected",
        }
    }
}

impl fmt::Display for StateTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a staged call is in its life. See the module docs for the transitions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ActionState {
    /// Staged and submitted; nothing has been sent.
    Pending,
    /// An apply claimed it; the call may be in flight.
    Applying,
    /// The service replied; the reply as retained.
    Applied {
        /// The reply, or a note standing in for it.
        result: Arc<ToolResult>,
    },
    /// The apply failed.
    Failed {
        /// True only when the service is known not to have run the tool.
        retryable: bool,
        /// What happened and what to do next, for the agent and the approver.
        message: String,
    },
    /// A person said no; nothing was sent.
    Rejected,
}

impl ActionState {
    /// The state's name.
    pub fn tag(&self) -> StateTag {
        match self {
            Self::Pending => StateTag::Pending,
            Self::Applying => StateTag::Applying,
            Self::Applied { .. } => StateTag::Applied,
            Self::Failed { .. } => StateTag::Failed,
            Self::Rejected => StateTag::Rejected,
        }
    }

    /// Pending, applying, or failed in a way a person may retry: it still waits for a
    /// person (or is in flight), as [`kernel::ActionEntry::is_open`] says of its ledger
    /// entry, and counts towards [`MAX_OPEN_ACTIONS`].
    pub fn is_open(&self) -> bool {
        match self {
            Self::Pending | Self::Applying => true,
            Self::Failed { retryable, .. } => *retryable,
            Self::Applied { .. } | Self::Rejected => false,
        }
    }

    /// No person will decide it again: applied, rejected, or failed for good. Only final
    /// records are pruned. (A retryable failure still waits for a person, so it is kept.)
    pub fn is_final(&self) -> bool {
        match self {
            Self::Applied { .. } | Self::Rejected => true,
            Self::Failed { retryable, .. } => !retryable,
            Self::Pending | Self::Applying => false,
        }
    }
}

/// One staged call, as stored.
///
/// The fields are public so storage backends can map rows; state changes go through the
/// transition methods, which the [`ActionStore`] writes with compare-and-set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActionRecord {
    /// The store's id, which is also the id submitted to the kernel.
    pub id: DriverActionId,
    /// The tool to call.
    pub tool: Arc<str>,
    /// The driver's tag of the tool's definition when the call was staged
    /// ([`crate::Tool::definition`]): apply hands it back to the service, which refuses
    /// the call if the tool changed since.
    #[serde(default)]
    pub definition: Option<Arc<str>>,
    /// The arguments, exactly as they will be sent (a JSON object).
    pub args: Arc<Value>,
    /// When it was staged.
    pub submitted_at: Timestamp,
    /// When an apply last claimed it.
    pub claimed_at: Option<Timestamp>,
    /// Where it is in its life.
    pub state: ActionState,
}

/// What [`ActionRecord::begin_apply`] decided.
#[must_use]
#[derive(Debug, Clone, PartialEq)]
pub enum ApplyStep {
    /// Write this `applying` record (compare-and-set from the current state), then send.
    Claim(ActionRecord),
    /// Already applied: nothing to send.
    AlreadyApplied,
    /// Must not be sent.
    Refuse(ApplyError),
}

/// What [`ActionRecord::settle`] decided.
#[must_use]
#[derive(Debug, Clone, PartialEq)]
pub enum Settlement {
    /// The service replied: write this `applied` record.
    Applied(ActionRecord),
    /// The call failed: write this `failed` record and report the error.
    Failed {
        /// The `failed` record to write.
        record: ActionRecord,
        /// What to report to the caller of apply.
        error: ApplyError,
    },
}

/// What [`ActionRecord::begin_reject`] decided.
#[must_use]
#[derive(Debug, Clone, PartialEq)]
pub enum RejectStep {
    /// Write this `rejected` record (compare-and-set from the current state).
    Reject(ActionRecord),
    /// Already rejected: nothing to do.
    AlreadyRejected,
    /// Must not be rejected.
    Refuse(RejectError),
}

/// Point `mine` at what `theirs` points at, unless it already does.
fn share<T: ?Sized>(mine: &mut Arc<T>, theirs: &Arc<T>) {
    if !Arc::ptr_eq(mine, theirs) {
        *mine = Arc::clone(theirs);
    }
}

impl ActionRecord {
    /// Make every field but the state the same as in `other`, as `other.clone()` would,
    /// without counting a reference again (and releasing it) where both records already
    /// share the same data: a transition changes a record's state and claim, not what was
    /// staged.
    fn copy_staged_from(&mut self, other: &Self) {
        let Self {
            id,
            tool,
            definition,
            args,
            submitted_at,
            claimed_at,
            state: _,
        } = other;
        self.id = *id;
        share(&mut self.tool, tool);
        match (&mut self.definition, definition) {
            (Some(mine), Some(theirs)) => share(mine, theirs),
            (mine, theirs) => mine.clone_from(theirs),
        }
        share(&mut self.args, args);
        self.submitted_at = *submitted_at;
        self.claimed_at = *claimed_at;
    }

    fn with_state(&self, state: ActionState) -> Self {
        Self {
            id: self.id,
            tool: self.tool.clone(),
            definition: self.definition.clone(),
            args: self.args.clone(),
            submitted_at: self.submitted_at,
            claimed_at: self.claimed_at,
            state,
        }
    }

    /// Step 2 of the protocol: may this record be sent, and what is its claim?
    pub fn begin_apply(&self, now: Timestamp) -> ApplyStep {
        self.clone().into_claim(now)
    }

    /// [`ActionRecord::begin_apply`] of a record read for this apply alone: the claim is
    /// made of the record itself, so its shared fields are moved rather than counted again.
    fn into_claim(self, now: Timestamp) -> ApplyStep {
        let id = self.id;
        match self.state {
            ActionState::Pending
            | ActionState::Failed {
                retryable: true, ..
            } => ApplyStep::Claim(Self {
                claimed_at: Some(now),
                state: ActionState::Applying,
                ..self
            }),
            ActionState::Applied { .. } => ApplyStep::AlreadyApplied,
            ActionState::Applying => ApplyStep::Refuse(ApplyError::AlreadyApplying(id)),
            ActionState::Rejected => ApplyStep::Refuse(ApplyError::Rejected(id)),
            ActionState::Failed {
                retryable: false,
                message,
            } => ApplyStep::Refuse(ApplyError::NotRetryable { id, message }),
        }
    }

    /// Step 5 of the protocol: the record after the service answered (or did not).
    pub fn settle(&self, outcome: Result<ToolResult, CallError>) -> Settlement {
        self.clone().into_settlement(outcome)
    }

    /// [`ActionRecord::settle`] of the claim an apply holds, which it no longer needs: the
    /// settled record is made of the claim itself.
    fn into_settlement(self, outcome: Result<ToolResult, CallError>) -> Settlement {
        debug_assert_eq!(self.state, ActionState::Applying, "settle a claimed record");
        match outcome {
            Ok(result) => Settlement::Applied(Self {
                state: ActionState::Applied {
                    result: Arc::new(retain_result(result)),
                },
                ..self
            }),
            Err(error) => {
                let retryable = error.retryable();
                let message = if error.may_have_landed() {
                    OUTCOME_UNKNOWN_MESSAGE.to_owned()
                } else {
                    error.message().to_owned()
                };
                let id = self.id;
                Settlement::Failed {
                    record: Self {
                        state: ActionState::Failed {
                            retryable,
                            message: message.clone(),
                        },
                        ..self
                    },
                    error: ApplyError::Failed {
                        id,
                        message,
                        retryable,
                        kind: error.failure_kind(),
                    },
                }
            }
        }
    }

    /// May this record be rejected, and what does it become?
    pub fn begin_reject(&self) -> RejectStep {
        let id = self.id;
        match &self.state {
            ActionState::Pending
            | ActionState::Failed {
                retryable: true, ..
            } => RejectStep::Reject(self.with_state(ActionState::Rejected)),
            ActionState::Rejected => RejectStep::AlreadyRejected,
            ActionState::Applying => RejectStep::Refuse(RejectError::Applying(id)),
            ActionState::Applied { .. } => RejectStep::Refuse(RejectError::Applied(id)),
            ActionState::Failed {
                retryable: false, ..
            } => RejectStep::Refuse(RejectError::NotRetryable(id)),
        }
    }

    /// The record a newly opened store makes of a leftover claim: a final failure, since
    /// the call may have landed. `None` when the record is not `applying`.
    #[must_use]
    pub fn interrupt(&self) -> Option<Self> {
        (self.state == ActionState::Applying).then(|| {
            self.with_state(ActionState::Failed {
                retryable: false,
                message: INTERRUPTED_MESSAGE.to_owned(),
            })
        })
    }
}

/// Counts the bytes a serializer writes, without keeping them.
struct ByteCount(usize);

impl io::Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The size of `value` as compact UTF-8 JSON, without building the string.
pub(crate) fn encoded_len<T: Serialize + ?Sized>(value: &T) -> Result<usize, serde_json::Error> {
    let mut count = ByteCount(0);
    serde_json::to_writer(&mut count, value)?;
    Ok(count.0)
}

/// The most bytes JSON spends on one byte of a string (`\u001f`).
const ESCAPED_BYTES: usize = 6;

/// At least the size of `value` as compact UTF-8 JSON, counted without encoding its strings
/// (a number is encoded: how long it is depends on serde_json's features), or `None` if
/// the count overflows.
fn json_size_bound(value: &Value) -> Option<usize> {
    match value {
        Value::Null | Value::Bool(_) => Some(5),
        Value::Number(number) => encoded_len(number).ok(),
        Value::String(text) => string_size_bound(text),
        // `[` and `]`, and a comma after each item (one too many: a bound).
        Value::Array(items) => items.iter().try_fold(2usize, |bound, item| {
            bound.checked_add(json_size_bound(item)?.checked_add(1)?)
        }),
        // `{` and `}`, and a colon and a comma with each member.
        Value::Object(members) => members.iter().try_fold(2usize, |bound, (key, item)| {
            let member = string_size_bound(key)?.checked_add(json_size_bound(item)?)?;
            bound.checked_add(member.checked_add(2)?)
        }),
    }
}

/// At least the size of `text` as a JSON string, quotes included.
fn string_size_bound(text: &str) -> Option<usize> {
    text.len().checked_mul(ESCAPED_BYTES)?.checked_add(2)
}

/// The reply as kept: itself when it fits in [`MAX_RESULT_BYTES`]; otherwise with each
/// block (and structured content) that does not fit in what is left replaced by a note
/// that names its type and size, in order, so what is kept says what was not; a reply that
/// cannot be encoded becomes [`UNREADABLE_RESULT_MESSAGE`].
fn retain_result(result: ToolResult) -> ToolResult {
    // Most replies are a little text: no need to encode them to know they fit.
    if result_size_bound(&result).is_some_and(|bound| bound <= MAX_RESULT_BYTES) {
        return result;
    }
    let size = encoded_len(&result);
    retain_measured(result, size)
}

fn retain_measured(result: ToolResult, size: Result<usize, serde_json::Error>) -> ToolResult {
    match size {
        Ok(bytes) if bytes <= MAX_RESULT_BYTES => result,
        Ok(bytes) => {
            warn!(bytes, "action.result.too-large");
            retain_parts(result)
        }
        Err(error) => {
            warn!(%error, "action.result.unreadable");
            ToolResult::from_text(UNREADABLE_RESULT_MESSAGE)
        }
    }
}

/// At least the size of `result` as compact UTF-8 JSON, counted without encoding it, or
/// `None` if it has structured content or other fields (which only encoding measures).
fn result_size_bound(result: &ToolResult) -> Option<usize> {
    // `{"content":[],"isError":false}`, rounded up.
    const FRAME: usize = 32;
    // `{"type":"text","text":},` (the text's quotes are in its own bound), rounded up;
    // any other block is bounded as the JSON it is.
    const BLOCK: usize = 32;
    if result.structured_content.is_some()
        || !result.extra.is_empty()
        || result.input_required.is_some()
    {
        return None;
    }
    result.content.iter().try_fold(FRAME, |bound, block| {
        let size = match block {
            Content::Text { text } => string_size_bound(text)?,
            Content::Other(block) => json_size_bound(block)?,
        };
        bound.checked_add(size.checked_add(BLOCK)?)
    })
}

/// The room a reply's frame and its notes may take, besides its kept parts.
const RESULT_FRAME_BYTES: usize = 4 * 1024;

/// `result` with every part that does not fit in what is left of [`MAX_RESULT_BYTES`]
/// replaced by a note saying so.
fn retain_parts(result: ToolResult) -> ToolResult {
    let mut room = MAX_RESULT_BYTES - RESULT_FRAME_BYTES;
    let mut take = |bytes: usize| {
        let fits = bytes <= room;
        if fits {
            room -= bytes;
        }
        fits
    };
    let note = |what: &str, bytes: usize| {
        Content::text(format!(
            "(The server's {what} was too large to retain: {bytes} bytes.)"
        ))
    };
    let content = result
        .content
        .into_iter()
        .map(|block| match encoded_len(&block) {
            Ok(bytes) if take(bytes) => block,
            Ok(bytes) => note(&format!("{} block", block.kind()), bytes),
            Err(_) => Content::text(UNREADABLE_RESULT_MESSAGE),
        })
        .collect::<Vec<_>>();
    let mut dropped = Vec::new();
    let structured_content = result
        .structured_content
        .and_then(|data| match encoded_len(&data) {
            Ok(bytes) if take(bytes) => Some(data),
            Ok(bytes) => {
                dropped.push(note("structured content", bytes));
                None
            }
            Err(_) => None,
        });
    let extra = match encoded_len(&result.extra) {
        Ok(bytes) if take(bytes) => result.extra,
        Ok(bytes) => {
            dropped.push(note("other fields of the response", bytes));
            Map::new()
        }
        Err(_) => Map::new(),
    };
    let input_required = result
        .input_required
        .and_then(|asked| match encoded_len(&asked) {
            Ok(bytes) if take(bytes) => Some(asked),
            Ok(bytes) => {
                dropped.push(note("request for input", bytes));
                None
            }
            Err(_) => None,
        });
    let mut content = content;
    content.extend(dropped);
    ToolResult {
        content,
        structured_content,
        is_error: result.is_error,
        extra,
        input_required,
    }
}

/// Why a call could not be staged. Nothing was stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StageError {
    /// The arguments were not a JSON object.
    #[error("tool arguments must be a JSON object.")]
    NotAnObject,
    /// The arguments were larger than [`MAX_ARGUMENT_BYTES`].
    #[error("tool arguments are too large (maximum 65536 bytes).")]
    TooLarge {
        /// Their size as compact JSON.
        bytes: usize,
    },
    /// [`MAX_OPEN_ACTIONS`] calls are already open (pending, applying, or failed and
    /// waiting for a person to approve them again or reject them).
    #[error(
        "50 calls to this server are already awaiting approval. Wait for them to be approved or rejected before queueing more."
    )]
    TooManyOpen,
    /// The storage backend failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Why an apply did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ApplyError {
    /// No record has this id.
    #[error(
        "action {0} is unknown here; it was never staged or has been pruned, so stage the call again if it is still needed"
    )]
    Unknown(DriverActionId),
    /// The action was rejected; it is never sent.
    #[error(
        "action {0} was rejected, so it will not be sent; stage the call again if it is still needed"
    )]
    Rejected(DriverActionId),
    /// An earlier attempt may have reached the service; its stored message says what to do.
    #[error("{message}")]
    NotRetryable {
        /// The action.
        id: DriverActionId,
        /// The stored failure text.
        message: String,
    },
    /// Another apply holds the claim.
    #[error("action {0} is already being applied; wait for that attempt to finish")]
    AlreadyApplying(DriverActionId),
    /// This attempt was sent (or refused) and failed.
    #[error("{message}")]
    Failed {
        /// The action.
        id: DriverActionId,
        /// The service's message, or the outcome-unknown text.
        message: String,
        /// Whether the service is known not to have run the tool.
        retryable: bool,
        /// Whether the call was not sent, refused by the service, or has an unknown
        /// outcome.
        kind: FailureKind,
    },
    /// Another store settled the record while this attempt ran (it was opened over the
    /// same records and took the claim for an interrupted one).
    #[error(
        "action {0} was settled elsewhere while this attempt ran, so its outcome is unknown here; check the service before staging it again"
    )]
    Superseded(DriverActionId),
    /// The call was sent, but its outcome could not be written; it will not be sent again.
    /// The claim is stranded: the store's next use records it as interrupted.
    #[error(
        "action {id} was sent, but its outcome could not be recorded ({source}); check the service before staging it again"
    )]
    OutcomeNotRecorded {
        /// The action.
        id: DriverActionId,
        /// The storage failure.
        source: StorageError,
    },
    /// The storage backend failed before anything was sent.
    #[error("nothing was sent because the approval could not be recorded: {0}; approve again")]
    Storage(#[from] StorageError),
}

impl ApplyError {
    /// Whether approving the same action again may succeed without risking a second send.
    pub fn retryable(&self) -> bool {
        match self {
            Self::AlreadyApplying(_) | Self::Storage(_) => true,
            Self::Failed { retryable, .. } => *retryable,
            Self::Unknown(_)
            | Self::Rejected(_)
            | Self::NotRetryable { .. }
            | Self::Superseded(_)
            | Self::OutcomeNotRecorded { .. } => false,
        }
    }
}

impl ApplyError {
    /// What is known about whether the call took effect, for the ledger.
    pub fn failure_kind(&self) -> FailureKind {
        match self {
            Self::Failed { kind, .. } => *kind,
            // Nothing was sent by this attempt.
            Self::Unknown(_) | Self::Rejected(_) | Self::AlreadyApplying(_) | Self::Storage(_) => {
                FailureKind::NotSent
            }
            // An earlier attempt, or this one, may have reached the service.
            Self::NotRetryable { .. } | Self::Superseded(_) | Self::OutcomeNotRecorded { .. } => {
                FailureKind::OutcomeUnknown
            }
        }
    }
}

/// Why a reject was refused. Nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RejectError {
    /// An apply holds the claim; the call may be in flight.
    #[error(
        "action {0} is being applied right now, so it can no longer be rejected; wait for its outcome"
    )]
    Applying(DriverActionId),
    /// The call was sent and the service replied.
    #[error(
        "action {0} was already applied, so rejecting it cannot undo it; revert it or undo it in the service"
    )]
    Applied(DriverActionId),
    /// The call failed after it may have reached the service.
    #[error(
        "action {0} failed after it may have reached the service, so rejecting it cannot undo it; check the service"
    )]
    NotRetryable(DriverActionId),
    /// The storage backend failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// What [`ActionStore::apply`] did.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The call was sent and the service replied.
    Sent,
    /// It had been applied before; nothing was sent.
    AlreadyApplied,
}

/// What [`ActionStore::reject`] did.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// The action is now rejected; `was` is the state it left.
    Rejected {
        /// Pending, or a retryable failure.
        was: StateTag,
    },
    /// It had been rejected before.
    AlreadyRejected,
    /// No record has this id (never staged, or pruned); nothing to reject.
    Unknown,
}

/// What [`ActionStore::discard`] did.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Discard {
    /// The pending record was deleted.
    Discarded,
    /// There was no pending record with this id; nothing changed.
    NotPending,
}

/// What [`ActionStorage::claim`] returns for a claim it wrote: resolves once the claim is
/// durable (or with the error that kept it from becoming so).
pub type ClaimDurable =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), StorageError>> + Send>>;

/// Where an [`ActionStore`] keeps its records.
///
/// A durable backend (SQLite) implements the same port. Each method must be atomic: a
/// reader never sees half of a write. Ids from [`ActionStorage::insert_pending`] increase
/// strictly and are never reused, even after a delete.
#[async_trait]
pub trait ActionStorage: Send + Sync {
    /// Store a new `pending` record, unless `max_open` records are already pending or
    /// applying (then `None`). Counting and inserting are one atomic step.
    async fn insert_pending(
        &self,
        tool: Arc<str>,
        definition: Option<Arc<str>>,
        args: Arc<Value>,
        submitted_at: Timestamp,
        max_open: usize,
    ) -> Result<Option<DriverActionId>, StorageError>;

    /// One record.
    async fn get(&self, id: DriverActionId) -> Result<Option<ActionRecord>, StorageError>;

    /// Replace the record with the same id by `record`, only if its stored state is still
    /// `from`. Returns whether it was written. This is the claim of the at-most-once
    /// protocol: of two writers that read the same state, exactly one succeeds.
    async fn compare_and_set(
        &self,
        from: StateTag,
        record: &ActionRecord,
    ) -> Result<bool, StorageError>;

    /// The claim ([`ActionStorage::compare_and_set`] to `applying`) in two steps: `None`
    /// if it was not written; else a future that resolves once the written claim is
    /// durable. Between the two the store guards the claim, so an apply dropped while it
    /// waits (the kernel's deadline) is recorded as interrupted rather than left applying.
    /// A backend that groups many callers' syncs lets tasks wait for one this way
    /// without holding a thread.
    ///
    /// The default is [`ActionStorage::compare_and_set`], durable when it returns.
    async fn claim(
        &self,
        from: StateTag,
        record: &ActionRecord,
    ) -> Result<Option<ClaimDurable>, StorageError> {
        let written = self.compare_and_set(from, record).await?;
        Ok(written.then(|| Box::pin(std::future::ready(Ok(()))) as ClaimDurable))
    }

    /// How many records are open ([`ActionState::is_open`]: pending, applying, or failed
    /// and retryable).
    async fn count_open(&self) -> Result<usize, StorageError>;

    /// Delete the record if it is pending. Returns whether one was deleted.
    async fn delete_pending(&self, id: DriverActionId) -> Result<bool, StorageError>;

    /// Every record in the given state, in ascending id.
    async fn records_in(&self, state: StateTag) -> Result<Vec<ActionRecord>, StorageError>;

    /// Delete final records ([`ActionState::is_final`]) except the `keep` newest by id.
    /// Returns how many were deleted.
    async fn prune_final(&self, keep: usize) -> Result<usize, StorageError>;

    /// Retention as [`ActionStore`] runs it, every [`PRUNE_EVERY`]th call settled: the
    /// same deletion as [`ActionStorage::prune_final`], now or with this store's next
    /// stage. A backend whose every statement costs a round trip defers it (PostgreSQL:
    /// it rides in the stage's transaction, no round trip or commit of its own), and runs
    /// it alone once asked more often than the calls open at once could settle between
    /// two stages (the fifth time: more were staged elsewhere), so at most 64 more final
    /// records wait. A deferred deletion that fails is tried again with the next stage.
    ///
    /// The default is [`ActionStorage::prune_final`], now.
    async fn retain_final(&self, keep: usize) -> Result<(), StorageError> {
        self.prune_final(keep).await.map(|_| ())
    }

    /// Replace the arguments of the record `id` by `args`, only if it is still pending
    /// (a person's edit before approving). Returns whether it was written; once written
    /// it is durable. Tool, definition and time stay as staged.
    ///
    /// The default refuses: a backend that cannot change a staged call says so.
    async fn amend_pending(
        &self,
        id: DriverActionId,
        args: Arc<Value>,
    ) -> Result<bool, StorageError> {
        let _ = (id, args);
        Err(StorageError(
            "this action store cannot change a staged call's arguments".to_owned(),
        ))
    }
}

#[derive(Debug, Default)]
struct Records {
    last_id: u64,
    rows: BTreeMap<DriverActionId, ActionRecord>,
    /// How many rows are open ([`ActionState::is_open`]).
    open: usize,
    /// How many rows are final ([`ActionState::is_final`]).
    finals: usize,
}

impl Records {
    fn count(&mut self, state: &ActionState, delta: isize) {
        if state.is_open() {
            self.open = self.open.saturating_add_signed(delta);
        }
        if state.is_final() {
            self.finals = self.finals.saturating_add_signed(delta);
        }
    }
}

/// Refuse arguments that are not a JSON object: a store keeps only objects (a stage
/// refuses others before they reach one). Each backend's [`ActionStorage::amend_pending`]
/// says it with this one message.
pub fn object_arguments(args: &Value) -> Result<(), StorageError> {
    if args.is_object() {
        Ok(())
    } else {
        Err(StorageError(
            "the call's arguments are not a JSON object, and a store keeps only objects; send the arguments as an object"
                .to_owned(),
        ))
    }
}

/// The in-memory backend. Clones share the same records, so a test can open a second
/// store over them, as a restarted process would over a database.
#[derive(Debug, Clone, Default)]
pub struct MemoryActionStorage {
    records: Arc<Mutex<Records>>,
}

impl MemoryActionStorage {
    /// Empty storage.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Records> {
        // Every method checks before it mutates, so a poisoned lock is still consistent.
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Storage holding `records` as a durable backend last left them, the next id to hand
    /// out above `last_id` (and above every record's id: ids are never reused). A store
    /// that keeps its hot copy in memory and its records elsewhere starts from this.
    pub fn restore(records: impl IntoIterator<Item = ActionRecord>, last_id: u64) -> Self {
        let mut restored = Records {
            last_id,
            ..Records::default()
        };
        for record in records {
            restored.last_id = restored.last_id.max(record.id.0);
            restored.count(&record.state, 1);
            restored.rows.insert(record.id, record);
        }
        Self {
            records: Arc::new(Mutex::new(restored)),
        }
    }

    /// Every record, in ascending id (for tests and lectures).
    pub fn records(&self) -> Vec<ActionRecord> {
        self.lock().rows.values().cloned().collect()
    }

    /// [`ActionStorage::prune_final`], answering which records it deleted, in descending
    /// id: a store that keeps this copy in memory and its records elsewhere deletes the
    /// same ones there.
    pub fn prune_final_ids(&self, keep: usize) -> Vec<DriverActionId> {
        let mut records = self.lock();
        if records.finals <= keep {
            return Vec::new();
        }
        let doomed: Vec<DriverActionId> = records
            .rows
            .values()
            .rev()
            .filter(|r| r.state.is_final())
            .skip(keep)
            .map(|r| r.id)
            .collect();
        for id in &doomed {
            records.rows.remove(id);
        }
        records.finals -= doomed.len();
        doomed
    }
}

#[async_trait]
impl ActionStorage for MemoryActionStorage {
    async fn insert_pending(
        &self,
        tool: Arc<str>,
        definition: Option<Arc<str>>,
        args: Arc<Value>,
        submitted_at: Timestamp,
        max_open: usize,
    ) -> Result<Option<DriverActionId>, StorageError> {
        let mut records = self.lock();
        if records.open >= max_open {
            return Ok(None);
        }
        records.last_id += 1;
        records.open += 1;
        let id = DriverActionId(records.last_id);
        records.rows.insert(
            id,
            ActionRecord {
                id,
                tool,
                definition,
                args,
                submitted_at,
                claimed_at: None,
                state: ActionState::Pending,
            },
        );
        Ok(Some(id))
    }

    async fn get(&self, id: DriverActionId) -> Result<Option<ActionRecord>, StorageError> {
        Ok(self.lock().rows.get(&id).cloned())
    }

    async fn compare_and_set(
        &self,
        from: StateTag,
        record: &ActionRecord,
    ) -> Result<bool, StorageError> {
        let mut records = self.lock();
        let Some(stored) = records.rows.get_mut(&record.id) else {
            return Ok(false);
        };
        if stored.state.tag() != from {
            return Ok(false);
        }
        let old = std::mem::replace(&mut stored.state, record.state.clone());
        stored.copy_staged_from(record);
        records.count(&old, -1);
        records.count(&record.state, 1);
        Ok(true)
    }

    async fn count_open(&self) -> Result<usize, StorageError> {
        Ok(self.lock().open)
    }

    async fn delete_pending(&self, id: DriverActionId) -> Result<bool, StorageError> {
        let mut records = self.lock();
        if records
            .rows
            .get(&id)
            .is_some_and(|r| r.state == ActionState::Pending)
        {
            records.rows.remove(&id);
            records.open -= 1;
            return Ok(true);
        }
        Ok(false)
    }

    async fn records_in(&self, state: StateTag) -> Result<Vec<ActionRecord>, StorageError> {
        Ok(self
            .lock()
            .rows
            .values()
            .filter(|r| r.state.tag() == state)
            .cloned()
            .collect())
    }

    async fn prune_final(&self, keep: usize) -> Result<usize, StorageError> {
        Ok(self.prune_final_ids(keep).len())
    }

    async fn amend_pending(
        &self,
        id: DriverActionId,
        args: Arc<Value>,
    ) -> Result<bool, StorageError> {
        object_arguments(&args)?;
        let mut records = self.lock();
        match records.rows.get_mut(&id) {
            Some(record) if record.state == ActionState::Pending => {
                record.args = args;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

/// How many times a transition re-reads a record that changed under it before giving up.
/// Every lost compare-and-set means the record moved forward, so this is never reached in
/// practice; it only bounds a misbehaving backend.
const MAX_TRANSITION_ATTEMPTS: usize = 8;

/// The state machine over one storage backend. Cheap to clone; clones share the backend
/// and the set of stranded claims.
#[derive(Clone)]
pub struct ActionStore {
    storage: Arc<dyn ActionStorage>,
    clock: Arc<dyn Clock>,
    /// Claims this store took whose attempt ended without settling them (see the module
    /// docs); settled as interrupted at the store's next use.
    stranded: Arc<IdSet>,
    /// Calls settled by this store and its clones (see [`PRUNE_EVERY`]).
    settled: Arc<AtomicUsize>,
}

/// A set of action ids that is asked far more often than it holds any: the stranded
/// claims of a store (and its clones), the actions a session's reads showed. Whether it
/// holds any is kept in step under its lock, so while it is empty (the usual case) asking
/// takes no lock.
#[derive(Debug, Default)]
pub(crate) struct IdSet {
    ids: Mutex<BTreeSet<DriverActionId>>,
    any: AtomicBool,
}

impl IdSet {
    fn lock(&self) -> MutexGuard<'_, BTreeSet<DriverActionId>> {
        // Inserting or removing ids cannot leave the set half-changed.
        self.ids.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn insert(&self, id: DriverActionId) {
        self.extend([id]);
    }

    /// Add `ids`.
    pub(crate) fn extend(&self, ids: impl IntoIterator<Item = DriverActionId>) {
        let mut set = self.lock();
        set.extend(ids);
        self.any.store(!set.is_empty(), Ordering::Release);
    }

    fn remove(&self, id: DriverActionId) {
        let mut ids = self.lock();
        ids.remove(&id);
        self.any.store(!ids.is_empty(), Ordering::Release);
    }

    /// The ids now, ascending.
    pub(crate) fn ids(&self) -> Vec<DriverActionId> {
        if !self.any.load(Ordering::Acquire) {
            return Vec::new();
        }
        self.lock().iter().copied().collect()
    }
}

/// Held by an apply from its claim until its outcome is stored. Dropped earlier (the
/// apply's future dropped or unwound, or the outcome not written), it marks the claim
/// stranded.
struct ClaimGuard<'a> {
    stranded: &'a IdSet,
    id: DriverActionId,
    settled: bool,
}

impl Drop for ClaimGuard<'_> {
    fn drop(&mut self) {
        if !self.settled {
            warn!(action = %self.id, "action.apply.stranded: the attempt ended without an outcome; it will be recorded as interrupted");
            self.stranded.insert(self.id);
        }
    }
}

impl fmt::Debug for ActionStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ActionStore").finish_non_exhaustive()
    }
}

impl ActionStore {
    /// Open a store over existing records: every leftover `applying` record becomes a final
    /// failure ([`INTERRUPTED_MESSAGE`]), since it may have landed; then final records
    /// beyond the retention limit are pruned.
    pub async fn open(
        storage: Arc<dyn ActionStorage>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StorageError> {
        for record in storage.records_in(StateTag::Applying).await? {
            if let Some(failed) = record.interrupt()
                && storage.compare_and_set(StateTag::Applying, &failed).await?
            {
                warn!(action = %record.id, tool = %label(&record.tool), "action.apply.interrupted");
            }
        }
        let store = Self {
            storage,
            clock,
            stranded: Arc::default(),
            settled: Arc::default(),
        };
        store.prune().await?;
        Ok(store)
    }

    /// A store over fresh in-memory storage (nothing to recover).
    pub fn in_memory(clock: Arc<dyn Clock>) -> Self {
        Self {
            storage: Arc::new(MemoryActionStorage::new()),
            clock,
            stranded: Arc::default(),
            settled: Arc::default(),
        }
    }

    /// Turn every stranded claim (see the module docs) into a final failure
    /// ([`INTERRUPTED_MESSAGE`]): its call may have landed, and it is never sent again.
    /// Every public method calls this first; a claim that cannot be written now (the
    /// storage fails) stays stranded and is tried again next time.
    pub async fn settle_stranded(&self) {
        for id in self.stranded.ids() {
            let settled = match self.storage.get(id).await {
                Ok(Some(record)) => match record.interrupt() {
                    Some(failed) => {
                        match self
                            .storage
                            .compare_and_set(StateTag::Applying, &failed)
                            .await
                        {
                            Ok(written) => {
                                if written {
                                    warn!(action = %id, tool = %record.tool, "action.apply.interrupted");
                                }
                                true
                            }
                            Err(error) => {
                                warn!(action = %id, %error, "action.apply.stranded: could not record it yet");
                                false
                            }
                        }
                    }
                    // Not claimed any more: settled by someone else meanwhile.
                    None => true,
                },
                Ok(None) => true,
                Err(error) => {
                    warn!(action = %id, %error, "action.apply.stranded: could not read it yet");
                    false
                }
            };
            if settled {
                self.stranded.remove(id);
            }
        }
    }

    /// The storage backend.
    pub fn storage(&self) -> &Arc<dyn ActionStorage> {
        &self.storage
    }

    /// Store a call as `pending`, after checking that `args` is a JSON object of at most
    /// [`MAX_ARGUMENT_BYTES`] and that fewer than [`MAX_OPEN_ACTIONS`] calls are open.
    pub async fn stage(
        &self,
        tool: impl Into<Arc<str>>,
        args: Value,
    ) -> Result<DriverActionId, StageError> {
        self.stage_defined(tool, None, args).await
    }

    /// [`ActionStore::stage`], keeping the tag of the tool's definition the call was staged
    /// against ([`ActionRecord::definition`]).
    pub async fn stage_defined(
        &self,
        tool: impl Into<Arc<str>>,
        definition: Option<Arc<str>>,
        args: Value,
    ) -> Result<DriverActionId, StageError> {
        if !args.is_object() {
            return Err(StageError::NotAnObject);
        }
        // Most arguments are far under the limit, and a bound says so without encoding
        // them; only arguments that may be near it are counted exactly.
        if json_size_bound(&args).is_none_or(|bound| bound > MAX_ARGUMENT_BYTES) {
            // A `Value` always encodes; a failure here would mean it is not JSON at all.
            let bytes = encoded_len(&args).map_err(|_| StageError::NotAnObject)?;
            if bytes > MAX_ARGUMENT_BYTES {
                return Err(StageError::TooLarge { bytes });
            }
        }
        self.settle_stranded().await;
        let tool = tool.into();
        let id = self
            .storage
            .insert_pending(
                tool.clone(),
                definition,
                Arc::new(args),
                self.clock.now(),
                MAX_OPEN_ACTIONS,
            )
            .await?
            .ok_or(StageError::TooManyOpen)?;
        debug!(action = %id, tool = %label(&tool), "action.staged");
        Ok(id)
    }

    /// Replace a pending call's arguments (a person's edit before approving); `false`
    /// when it is no longer pending. The caller checks the new arguments first.
    pub async fn amend(&self, id: DriverActionId, args: Value) -> Result<bool, StorageError> {
        self.storage.amend_pending(id, Arc::new(args)).await
    }

    /// Delete a staged call that is still pending (the kernel refused its submission).
    pub async fn discard(&self, id: DriverActionId) -> Result<Discard, StorageError> {
        self.settle_stranded().await;
        Ok(if self.storage.delete_pending(id).await? {
            debug!(action = %id, "action.discarded");
            Discard::Discarded
        } else {
            Discard::NotPending
        })
    }

    /// Send an approved call at most once. See the module docs for the protocol.
    pub async fn apply(
        &self,
        id: DriverActionId,
        service: &dyn ToolService,
    ) -> Result<Applied, ApplyError> {
        self.settle_stranded().await;
        let mut attempts = 0;
        let (claimed, durable) = loop {
            // Step 1.
            let record = self.storage.get(id).await?.ok_or(ApplyError::Unknown(id))?;
            let was = record.state.tag();
            // Step 2.
            let claimed = match record.into_claim(self.clock.now()) {
                ApplyStep::Claim(claimed) => claimed,
                ApplyStep::AlreadyApplied => return Ok(Applied::AlreadyApplied),
                ApplyStep::Refuse(error) => return Err(error),
            };
            // Step 3: the claim is stored before anything is sent.
            if let Some(durable) = self.storage.claim(was, &claimed).await? {
                break (claimed, durable);
            }
            attempts += 1;
            if attempts >= MAX_TRANSITION_ATTEMPTS {
                return Err(ApplyError::AlreadyApplying(id));
            }
        };

        let mut guard = ClaimGuard {
            stranded: &self.stranded,
            id,
            settled: false,
        };
        // Written, and guarded from here: a claim that then fails to become durable, or
        // whose wait is dropped, is recorded as interrupted; nothing is sent before.
        durable.await?;

        // Step 4: the only send.
        let outcome = service
            .call_defined(&claimed.tool, claimed.definition.as_deref(), &claimed.args)
            .await;

        // Step 5.
        let (settled, result) = match claimed.into_settlement(outcome) {
            Settlement::Applied(record) => (record, Ok(Applied::Sent)),
            Settlement::Failed { record, error } => (record, Err(error)),
        };
        match self
            .storage
            .compare_and_set(StateTag::Applying, &settled)
            .await
        {
            Ok(true) => guard.settled = true,
            Ok(false) => {
                // Settled elsewhere: nothing of ours is left claimed.
                guard.settled = true;
                warn!(action = %id, "action.apply.superseded");
                return Err(ApplyError::Superseded(id));
            }
            // The guard strands the claim: the next use records it as interrupted.
            Err(source) => return Err(ApplyError::OutcomeNotRecorded { id, source }),
        }
        drop(guard);
        match &result {
            Ok(_) => info!(action = %id, tool = %label(&settled.tool), "action.applied"),
            Err(error) if error.failure_kind() == FailureKind::OutcomeUnknown => {
                warn!(action = %id, error = %label(&error.to_string()), "action.apply.outcome-unknown")
            }
            Err(error) => {
                warn!(action = %id, error = %label(&error.to_string()), "action.apply.failed")
            }
        }

        // Step 6.
        self.settled().await;
        result
    }

    /// Reject a pending call, or one whose failure is known to have sent nothing.
    pub async fn reject(&self, id: DriverActionId) -> Result<Rejection, RejectError> {
        self.settle_stranded().await;
        for _ in 0..MAX_TRANSITION_ATTEMPTS {
            let Some(record) = self.storage.get(id).await? else {
                return Ok(Rejection::Unknown);
            };
            let rejected = match record.begin_reject() {
                RejectStep::Reject(rejected) => rejected,
                RejectStep::AlreadyRejected => return Ok(Rejection::AlreadyRejected),
                RejectStep::Refuse(error) => return Err(error),
            };
            let was = record.state.tag();
            if self.storage.compare_and_set(was, &rejected).await? {
                info!(action = %id, %was, "action.rejected");
                self.settled().await;
                return Ok(Rejection::Rejected { was });
            }
        }
        Err(RejectError::Applying(id))
    }

    /// One record.
    pub async fn get(&self, id: DriverActionId) -> Result<Option<ActionRecord>, StorageError> {
        self.settle_stranded().await;
        self.storage.get(id).await
    }

    /// The pending records, in ascending id.
    pub async fn pending(&self) -> Result<Vec<ActionRecord>, StorageError> {
        self.settle_stranded().await;
        self.storage.records_in(StateTag::Pending).await
    }

    /// How many calls are pending or applying.
    pub async fn count_open(&self) -> Result<usize, StorageError> {
        self.settle_stranded().await;
        self.storage.count_open().await
    }

    /// A call was settled: every [`PRUNE_EVERY`]th time, prune. A failed prune is logged;
    /// the next one finishes the job.
    async fn settled(&self) {
        let settled = self.settled.fetch_add(1, Ordering::Relaxed) + 1;
        if settled.is_multiple_of(PRUNE_EVERY)
            && let Err(error) = self.storage.retain_final(RETAINED_FINAL_ACTIONS).await
        {
            warn!(%error, "action.prune.failed");
        }
    }

    async fn prune(&self) -> Result<(), StorageError> {
        let pruned = self.storage.prune_final(RETAINED_FINAL_ACTIONS).await?;
        if pruned > 0 {
            debug!(pruned, "action.pruned");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde::ser::Error as _;
    use serde_json::json;

    use super::*;

    #[tokio::test]
    async fn the_memory_backend_edits_only_a_pending_call_and_only_to_an_object() {
        let storage = MemoryActionStorage::new();
        let stage = |n: u64| {
            storage.insert_pending(
                Arc::from("t"),
                None,
                Arc::new(json!({"n": n})),
                Timestamp(0),
                10,
            )
        };
        let pending = stage(1).await.unwrap().unwrap();
        let rejected = stage(2).await.unwrap().unwrap();
        let mut closed = storage.get(rejected).await.unwrap().unwrap();
        closed.state = ActionState::Rejected;
        assert!(
            storage
                .compare_and_set(StateTag::Pending, &closed)
                .await
                .unwrap()
        );
        assert!(
            !storage
                .amend_pending(rejected, Arc::new(json!({"n": 9})))
                .await
                .unwrap()
        );
        assert!(
            storage
                .amend_pending(pending, Arc::new(json!([1])))
                .await
                .is_err()
        );
        assert!(
            storage
                .amend_pending(pending, Arc::new(json!({"n": 3})))
                .await
                .unwrap()
        );
        assert_eq!(
            *storage.get(pending).await.unwrap().unwrap().args,
            json!({"n": 3})
        );
        assert_eq!(
            *storage.get(rejected).await.unwrap().unwrap().args,
            json!({"n": 2})
        );
    }

    fn record(state: ActionState) -> ActionRecord {
        ActionRecord {
            id: DriverActionId(7),
            tool: Arc::from("t"),
            definition: None,
            args: Arc::new(json!({})),
            submitted_at: Timestamp(0),
            claimed_at: None,
            state,
        }
    }

    fn failed(retryable: bool) -> ActionState {
        ActionState::Failed {
            retryable,
            message: "m".into(),
        }
    }

    #[test]
    fn only_pending_and_retryable_failures_may_be_claimed() {
        let now = Timestamp(5);
        for state in [ActionState::Pending, failed(true)] {
            let ApplyStep::Claim(claimed) = record(state).begin_apply(now) else {
                panic!("should claim");
            };
            assert_eq!(claimed.state, ActionState::Applying);
            assert_eq!(claimed.claimed_at, Some(now));
        }
        let applied = ActionState::Applied {
            result: Arc::new(ToolResult::default()),
        };
        assert_eq!(record(applied).begin_apply(now), ApplyStep::AlreadyApplied);
        let id = DriverActionId(7);
        assert_eq!(
            record(ActionState::Applying).begin_apply(now),
            ApplyStep::Refuse(ApplyError::AlreadyApplying(id))
        );
        assert_eq!(
            record(ActionState::Rejected).begin_apply(now),
            ApplyStep::Refuse(ApplyError::Rejected(id))
        );
        assert_eq!(
            record(failed(false)).begin_apply(now),
            ApplyStep::Refuse(ApplyError::NotRetryable {
                id,
                message: "m".into()
            })
        );
    }

    #[test]
    fn failures_are_retryable_only_when_nothing_reached_the_tool() {
        let claimed = record(ActionState::Applying);
        let cases = [
            (
                CallError::NotDispatched("creds".into()),
                true,
                "creds",
                FailureKind::NotSent,
            ),
            (
                CallError::Declined("403".into()),
                true,
                "403",
                FailureKind::ServiceError,
            ),
            (
                CallError::Answered("invalid arguments".into()),
                false,
                "invalid arguments",
                FailureKind::ServiceError,
            ),
            (
                CallError::Unknown("timeout".into()),
                false,
                OUTCOME_UNKNOWN_MESSAGE,
                FailureKind::OutcomeUnknown,
            ),
        ];
        for (error, retryable, message, kind) in cases {
            let Settlement::Failed { record, error } = claimed.settle(Err(error)) else {
                panic!("should fail");
            };
            assert_eq!(
                record.state,
                ActionState::Failed {
                    retryable,
                    message: message.into()
                }
            );
            assert_eq!(error.retryable(), retryable);
            assert_eq!(error.failure_kind(), kind, "the ledger's kind of {message}");
            assert_eq!(error.to_string(), message);
        }
    }

    #[test]
    fn rejecting_is_allowed_while_nothing_was_sent() {
        for state in [ActionState::Pending, failed(true)] {
            assert!(
                matches!(record(state).begin_reject(), RejectStep::Reject(r) if r.state == ActionState::Rejected)
            );
        }
        assert_eq!(
            record(ActionState::Rejected).begin_reject(),
            RejectStep::AlreadyRejected
        );
        for state in [
            ActionState::Applying,
            ActionState::Applied {
                result: Arc::default(),
            },
            failed(false),
        ] {
            assert!(matches!(
                record(state).begin_reject(),
                RejectStep::Refuse(_)
            ));
        }
    }

    #[test]
    fn interrupt_turns_only_a_claim_into_a_final_failure() {
        let failed = record(ActionState::Applying).interrupt().expect("applying");
        assert_eq!(
            failed.state,
            ActionState::Failed {
                retryable: false,
                message: INTERRUPTED_MESSAGE.into()
            }
        );
        assert!(failed.state.is_final());
        assert_eq!(record(ActionState::Pending).interrupt(), None);
    }

    #[test]
    fn an_unencodable_result_is_replaced_by_a_note() {
        let result = ToolResult::from_text("fine");
        let kept = retain_measured(result, Err(serde_json::Error::custom("broken")));
        assert_eq!(kept.text(), UNREADABLE_RESULT_MESSAGE);
        assert!(!kept.is_error);
    }

    #[test]
    fn the_reply_bound_is_never_below_its_encoded_size() {
        let texts = [
            "",
            "Done.",
            "\u{1f}\u{0}\\\"\n\t",
            "é漢🙂",
            "\u{7f}\u{2028}`",
        ];
        for text in texts {
            for result in [
                ToolResult::from_text(text),
                ToolResult::tool_error(text),
                ToolResult {
                    content: vec![
                        Content::Text { text: text.into() },
                        Content::Other(
                            json!({"type": "image", "data": text, "mimeType": "image/png"}),
                        ),
                        Content::Text {
                            text: text.repeat(3),
                        },
                    ],
                    ..ToolResult::default()
                },
                ToolResult::default(),
            ] {
                let bound = result_size_bound(&result).expect("no structured content");
                assert!(
                    bound >= encoded_len(&result).expect("encodes"),
                    "{result:?}"
                );
            }
        }
        let structured = ToolResult::from_text("x").with_structured(json!({"a": 1}));
        assert_eq!(result_size_bound(&structured), None);
    }

    #[test]
    fn the_arguments_bound_is_never_below_their_encoded_size() {
        let values = [
            json!({}),
            json!({"title": "Add dark mode"}),
            json!({"issue": 1, "label": "bug", "ok": true, "none": null}),
            json!({"\u{1f}k\"": ["\u{0}\\", -12, 1.5e300, u64::MAX, i64::MIN, [], {}]}),
            json!({"nested": {"a": [{"b": "é漢🙂"}, false, 0.1]}}),
            json!([1, 2, 3]),
            json!("\n\t"),
            json!(null),
        ];
        for value in values {
            let bound = json_size_bound(&value).expect("no overflow");
            assert!(bound >= encoded_len(&value).expect("encodes"), "{value}");
        }
    }

    #[tokio::test]
    async fn arguments_are_refused_by_their_exact_size_only() {
        let store = ActionStore::in_memory(Arc::new(kernel::StepClock::default()));
        // A bound over the limit, an exact size under it: staged.
        let plain = json!({"text": "x".repeat(MAX_ARGUMENT_BYTES / 4)});
        assert!(json_size_bound(&plain).expect("bound") > MAX_ARGUMENT_BYTES);
        store.stage("t", plain).await.expect("within the limit");
        let large = json!({"text": "x".repeat(MAX_ARGUMENT_BYTES)});
        let bytes = encoded_len(&large).expect("encodes");
        assert_eq!(
            store.stage("t", large).await,
            Err(StageError::TooLarge { bytes })
        );
    }

    #[test]
    fn a_reply_under_the_bound_is_kept_and_one_over_the_limit_is_not() {
        let small = ToolResult::from_text("Done.");
        assert_eq!(retain_result(small.clone()), small);
        // Its bound is over the limit, its encoded size is not: measured, and kept.
        let near = ToolResult::from_text("x".repeat(MAX_RESULT_BYTES / 2));
        assert_eq!(retain_result(near.clone()), near);
        let large = ToolResult::from_text("x".repeat(MAX_RESULT_BYTES));
        assert!(retain_result(large).text().contains("too large to retain"));
    }

    #[test]
    fn a_reply_too_large_to_retain_keeps_what_fits_and_names_what_it_dropped() {
        let image =
            json!({"type": "image", "data": "A".repeat(MAX_RESULT_BYTES), "mimeType": "image/png"});
        let link = json!({"type": "resource_link", "uri": "file:///a", "name": "a", "annotations": {"priority": 1.0}});
        let reply = ToolResult {
            content: vec![
                Content::text("before"),
                Content::Other(image),
                Content::Other(link.clone()),
            ],
            ..ToolResult::default()
        };
        let kept = retain_result(reply);
        assert_eq!(kept.content[0], Content::text("before"));
        assert!(
            kept.content[1].as_text().is_some_and(
                |note| note.starts_with("(The server's image block was too large to retain:")
            ),
            "{:?}",
            kept.content[1]
        );
        assert_eq!(kept.content[2], Content::Other(link));
        assert!(encoded_len(&kept).expect("encodes") <= MAX_RESULT_BYTES);
    }

    #[tokio::test]
    async fn compare_and_set_stores_the_record_as_given() {
        let storage = MemoryActionStorage::new();
        let id = storage
            .insert_pending(Arc::from("t"), None, Arc::new(json!({})), Timestamp(1), 50)
            .await
            .expect("stored")
            .expect("room");
        let read = storage.get(id).await.expect("read").expect("present");
        // The same staged data, in a new state.
        let claimed = ActionRecord {
            claimed_at: Some(Timestamp(2)),
            ..read.with_state(ActionState::Applying)
        };
        assert!(
            storage
                .compare_and_set(StateTag::Pending, &claimed)
                .await
                .expect("cas")
        );
        assert_eq!(storage.get(id).await.expect("read"), Some(claimed.clone()));
        // Other data altogether (as another backend's record could carry).
        let other = ActionRecord {
            tool: Arc::from("u"),
            definition: Some(Arc::from("d1")),
            args: Arc::new(json!({"a": 1})),
            submitted_at: Timestamp(3),
            claimed_at: None,
            ..claimed.with_state(ActionState::Applied {
                result: Arc::new(ToolResult::from_text("ok")),
            })
        };
        assert!(
            storage
                .compare_and_set(StateTag::Applying, &other)
                .await
                .expect("cas")
        );
        assert_eq!(storage.get(id).await.expect("read"), Some(other.clone()));
        let redefined = ActionRecord {
            definition: Some(Arc::from("d2")),
            ..other.with_state(ActionState::Rejected)
        };
        assert!(
            storage
                .compare_and_set(StateTag::Applied, &redefined)
                .await
                .expect("cas")
        );
        assert_eq!(storage.get(id).await.expect("read"), Some(redefined));
        assert_eq!(storage.count_open().await.expect("count"), 0);
    }

    #[test]
    fn encoded_len_counts_utf8_bytes_of_compact_json() {
        assert_eq!(encoded_len(&json!({"a": "é"})).expect("encodes"), 10);
    }
}

//! A wiki gatekeeper that lets the agent keep working while its writes wait for a person.
//!
//! A Rust rebuild of the reference's Confluence gatekeeper (the reference is Cloudflare
//! OS's Gatekeeper, see the glossary in `docs/ARCHITECTURE.md`), plus fixes for the three
//! pitfalls its review cases (a to h, lectures ex09–ex11) found in it.
//!
//! # Bird's eye view
//!
//! The agent holds a [`WikiSession`]. Every write it makes is *staged*: recorded by the
//! driver, submitted to the kernel's approval queue, and answered at once. Nothing
//! reaches the wiki until a person approves. Meanwhile every read *simulates*: it shows
//! the wiki as if every pending action were applied, so a page the agent asked to
//! create already "exists" as `~1`, and its pending edits show up when it is read back.
//! When a person approves, the kernel calls [`Gatekeeper::apply_action`] and the driver
//! performs the real request; `~1` then resolves to the real id, and handles held on it
//! keep working.
//!
//! # Where this goes beyond the reference ([`Policy::GUARDED`], the default)
//!
//! 1. **Stale proposals.** A replace or retitle remembers the version it was staged
//!    against: the version the agent's session last read. If someone else moved the
//!    page on since, applying it writes nothing and fails, naming both versions:
//!    "re-read the page and stage again". An append, which keeps others' edits,
//!    proceeds, unless it was stacked on a replace that failed. No edit is applied to a
//!    page in the trash.
//! 2. **Semantic dependencies.** A session remembers the pending actions its reads
//!    showed and the actions it staged; later actions declare them in `depends_on`, so
//!    rejecting, failing or reverting one makes the kernel flag the actions built on
//!    it, and approving one of those while its dependency is pending is refused.
//! 3. **Revert that respects others.** Revert of an append removes exactly the appended
//!    block; revert of a replace, retitle or create happens only if nothing changed
//!    since; revert never takes a page out of the trash; otherwise revert refuses and
//!    says why.
//!
//! What each of these covers and does not is listed in `docs/ARCHITECTURE.md`; the
//! tests named after each hazard are in `tests/wiki/review.rs`.
//!
//! Also: a rejected create's cascade is reported to the kernel, actions are applied
//! in the order they were simulated ("apply #k first"), and the claim before a wiki
//! write is a compare-and-set in the key-value port, so two processes sharing a store
//! never both send an action. [`Policy::REFERENCE`] turns all
//! of this off, so lectures can show both behaviours side by side.
//!
//! # Code map
//!
//! - [`service`]: OUTSIDE THE OS. The in-process wiki the driver talks to.
//! - [`gatekeeper`]: the driver ([`ConfluenceGatekeeper`]): staging, apply, reject, revert.
//! - [`session`]: the agent's object API ([`WikiSession`]).
//! - [`overlay`]: the simulation rules, pure functions.
//! - [`record`], [`kv`]: what is stored, and the key-value port it is stored through.
//!   The driver's in-memory index holds each record once: the stored value, shared
//!   with the port, with its texts as spans that reads fold in place.
//! - [`policy`]: reference vs ours.
//! - [`lab`]: kernel + wiki + gatekeeper wired, for tests and lectures.
//!
//! **Architecture invariant:** only [`gatekeeper`] calls the wiki service, and only
//! after the kernel's decision for writes; sessions never call it directly.
//! **Architecture invariant:** the driver talks to the kernel only through the
//! `ApprovalQueue` it was handed and the `Gatekeeper` trait it implements.
//!
//! [`Gatekeeper::apply_action`]: kernel::Gatekeeper::apply_action

pub mod card;
pub mod error;
pub mod gatekeeper;
pub mod handle;
mod held;
pub mod lab;
pub mod markup;
pub mod overlay;
pub mod policy;
pub mod record;
pub mod service;
pub mod session;
mod store;
pub mod view;

pub use error::WikiError;
pub use gatekeeper::{ConfluenceGatekeeper, INTERRUPTED_MESSAGE};
pub use gatekeeper_core::kv::{self, Bytes, KvError, KvStore, MemoryKv};
pub use handle::{ContentHandle, ParseHandleError};
pub use lab::Lab;
pub use overlay::CommentView;
pub use policy::Policy;
pub use record::{ActionRecord, ContentKind, ContentStatus, RecordState, WikiAction};
pub use service::{Edit, WikiService};
pub use session::{NewPage, WikiSession};
pub use view::{ContentSummary, PageView, Staged};

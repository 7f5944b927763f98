//! The human's terminal: shows the work that waits for a person and takes their decisions.
//!
//! In the OS picture the kernel keeps the approval queue and the drivers talk to the world;
//! the shell is where a person sits. It does three things:
//!
//! - **Render** ([`render`]): a numbered batch of open actions in id order, and one action's
//!   full approval prompt. Every string that comes out of the ledger was written by a driver,
//!   a service or an agent, so the shell treats it as untrusted for the terminal: names,
//!   titles, callers and messages are shown as delimited labels
//!   ([`prompt_sanitize::untrusted_label`], `«…»`), descriptions (Markdown the driver already
//!   built from sanitized pieces) after [`prompt_sanitize::neutralize_controls`] behind a
//!   gutter.
//!   The render functions return [`prompt_sanitize::Sanitized`], so nothing reaches the
//!   terminal that skipped that layer.
//! - **Ask** ([`decide`]): a [`Decider`] answers for each action. [`Scripted`] holds
//!   decisions given in advance (lectures and tests); [`Interactive`] reads lines from any
//!   `BufRead`. Only an explicit answer decides: a stray keypress re-asks, the end of input
//!   skips everything, and nothing ever approves by default.
//! - **Wrap** ([`wrap`](mod@wrap)): lines no wider than [`WIDTH`], continued under their
//!   field, a label cut in two still between its marks on each line.
//! - **Apply** ([`Shell`]): each decision goes to the [`kernel::Overseer`] and only there:
//!   approve, reject, skip, or approve all of this kind (which enables an auto-approval rule
//!   for the action's kind on its gatekeeper and says so).
//!
//! **Architecture invariant:** the shell depends on `kernel` and `prompt-sanitize` only. It
//! never holds a driver, a session or a service, so it cannot change the world except by
//! telling the kernel a decision.

pub mod decide;
pub mod render;
mod terminal;
pub mod wrap;

pub use decide::{Decider, Decision, Interactive, Scripted};
pub use render::{QueueRow, queue_rows, render_action, render_batch, render_ledger, render_rules};
pub use terminal::{Decided, Effect, ReviewSummary, Shell, ShellError};
pub use wrap::{WIDTH, wrap, wrap_hanging};

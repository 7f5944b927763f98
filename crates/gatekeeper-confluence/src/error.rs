//! The errors the agent-facing session returns. A refusal by the approval queue or by
//! the wiki is an error here; "pending" is not: a staged action is a success.

use kernel::QueueError;

use crate::handle::{ContentHandle, ParseHandleError};
use crate::kv::KvError;
use crate::service::ServiceError;

/// Why a session call did nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WikiError {
    /// The handle names nothing: an unknown id, or a `~N` whose create was rejected.
    #[error(
        "no such content {0}; open a page by its id, or use the handle a create returned (a rejected create's handle is gone)"
    )]
    NotFound(ContentHandle),
    /// A child page was asked for under a blog post.
    #[error(
        "{0} is a blog post, and blog posts cannot have child pages; create the page in its space instead"
    )]
    BlogPostChildren(ContentHandle),
    /// The text given as a content id is not one.
    #[error(transparent)]
    InvalidHandle(#[from] ParseHandleError),
    /// The kernel refused to record the action or the read; nothing was staged or shown.
    #[error("the approval queue refused this: {0}")]
    Queue(#[from] QueueError),
    /// The wiki refused a read the session needed.
    #[error("the wiki refused the request: {0}")]
    Service(#[from] ServiceError),
    /// The gatekeeper's storage failed; nothing was staged.
    #[error(transparent)]
    Storage(#[from] KvError),
}

//! What an agent's read carries down to the server and back besides its answer: the
//! server's progress notifications, routed to the agent that asked, and the agent's
//! cancellation, passed down as `notifications/cancelled`.
//!
//! The gate hands a [`ReadRelay`] to a read through gatekeeper-core's
//! [`CallContext`](gatekeeper_core::CallContext). The server sees progress tokens the
//! connection mints (rmcp gives every request one), never the agent's: [`ProgressRoutes`]
//! maps each minted token to the agent's sink for as long as its request is in flight, and
//! the sink puts the agent's own token back. A token is registered while the routes are
//! locked, before a notification for it can be looked up, so no early note is lost.
//!
//! Writes carry no relay: a staged call belongs to the gate once staged, and when a person
//! sends it later no agent is waiting on it; an agent's cancellation never reaches a
//! person's send.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rmcp::model::{ProgressNotificationParam, ProgressToken};
use tokio::sync::{Mutex, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// The most progress notifications of one read waiting to reach its agent; more are
/// dropped (and counted) rather than buffered without bound.
pub const PROGRESS_BUFFER: usize = 64;

/// What one read of an agent carries besides its arguments.
#[derive(Debug, Clone)]
pub struct ReadRelay {
    /// Where the server's progress for this read goes, when the agent asked for progress
    /// (its `progressToken`): the notes as the server sent them, with the connection's
    /// token, for the gate to put the agent's own token on.
    pub progress: Option<mpsc::Sender<ProgressNotificationParam>>,
    /// Cancelled when the agent cancels its call: the request is then cancelled
    /// downstream with `notifications/cancelled`, and the read fails without an answer.
    pub cancelled: CancellationToken,
}

impl ReadRelay {
    /// A relay for a read whose progress goes to `progress` (if any), cancelled with
    /// `cancelled`.
    pub fn new(
        progress: Option<mpsc::Sender<ProgressNotificationParam>>,
        cancelled: CancellationToken,
    ) -> Self {
        Self {
            progress,
            cancelled,
        }
    }
}

/// One in-flight read's route for progress.
#[derive(Debug)]
pub(crate) struct Route {
    sink: mpsc::Sender<ProgressNotificationParam>,
    /// The last progress passed on: the protocol's progress only grows, and rmcp hands
    /// each notification to its own task, so a note that arrives after a later one is
    /// dropped rather than sent backwards.
    last: Option<f64>,
}

/// Progress tokens of reads in flight on one connection, to their agents' sinks.
#[derive(Debug, Default)]
pub struct ProgressRoutes {
    routes: Mutex<HashMap<ProgressToken, Route>>,
    /// Notes that did not reach their agent (the sink was full or gone, or the note came
    /// out of order, or after its read ended).
    dropped: AtomicU64,
}

impl ProgressRoutes {
    /// The routes, locked: a caller registers a token while holding them, so a
    /// notification for it waits for the registration.
    pub(crate) async fn lock(&self) -> tokio::sync::MutexGuard<'_, HashMap<ProgressToken, Route>> {
        self.routes.lock().await
    }

    /// Route `token`'s notes to `sink` (with the routes held by the caller).
    pub(crate) fn register(
        routes: &mut HashMap<ProgressToken, Route>,
        token: ProgressToken,
        sink: mpsc::Sender<ProgressNotificationParam>,
    ) {
        routes.insert(token, Route { sink, last: None });
    }

    /// Stop routing `token` (its request ended).
    pub(crate) async fn forget(&self, token: &ProgressToken) {
        self.routes.lock().await.remove(token);
    }

    /// Pass one note from the server on to the read it belongs to.
    pub(crate) async fn deliver(&self, note: ProgressNotificationParam) {
        let mut routes = self.routes.lock().await;
        let Some(route) = routes.get_mut(&note.progress_token) else {
            self.drop_one("no read in flight has this token");
            return;
        };
        if route.last.is_some_and(|last| note.progress <= last) {
            self.drop_one("out of order");
            return;
        }
        route.last = Some(note.progress);
        if route.sink.try_send(note).is_err() {
            self.drop_one("the agent's buffer is full or gone");
        }
    }

    fn drop_one(&self, why: &str) {
        let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
        debug!(why, dropped, "progress.dropped");
    }

    /// How many notes did not reach an agent so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// Shared between a connection's handler (which delivers) and its reads (which register).
pub(crate) type SharedRoutes = Arc<ProgressRoutes>;

#[cfg(test)]
mod tests {
    use rmcp::model::NumberOrString;

    use super::*;

    fn note(token: i64, progress: f64) -> ProgressNotificationParam {
        ProgressNotificationParam::new(ProgressToken(NumberOrString::Number(token)), progress)
    }

    #[tokio::test]
    async fn notes_reach_their_read_in_order_and_nothing_else_does() {
        let routes = ProgressRoutes::default();
        let (sink, mut received) = mpsc::channel(PROGRESS_BUFFER);
        let token = ProgressToken(NumberOrString::Number(7));
        ProgressRoutes::register(&mut *routes.lock().await, token.clone(), sink);
        routes.deliver(note(7, 1.0)).await;
        routes.deliver(note(8, 1.0)).await; // another read's token
        routes.deliver(note(7, 3.0)).await;
        routes.deliver(note(7, 2.0)).await; // came late: dropped, not sent backwards
        routes.forget(&token).await;
        routes.deliver(note(7, 4.0)).await; // after the read ended
        let mut got = Vec::new();
        while let Ok(note) = received.try_recv() {
            got.push(note.progress);
        }
        assert_eq!(got, [1.0, 3.0]);
        assert_eq!(routes.dropped(), 3);
    }
}

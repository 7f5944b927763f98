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
//! A server may also ask, during a read, for something only the agent's client can give
//! (sampling, elicitation): when the server's configuration lets such questions through
//! (the connection then declares the capability), the question goes to the read's
//! [`ReadRelay::asks`] as an [`Ask`], and the answer comes back the same way. The protocol
//! ties such a question to no request on stdio, so it reaches a read only while that read
//! is the only one in flight on the connection; otherwise it is declined with the reason.
//!
//! Writes carry no relay: a staged call belongs to the gate once staged, and when a person
//! sends it later no agent is waiting on it; an agent's cancellation never reaches a
//! person's send. A question the server asks during a person's send (the only call in
//! flight on the connection) goes to the person instead, when the gate runs the send
//! inside [`for_person`]: as a [`PersonAsk`], with the time by which it is declined.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

#[allow(deprecated)] // sampling: deprecated in the protocol's newest revision, still in use
use rmcp::model::CreateMessageRequestParams;
use rmcp::model::{ElicitRequestParams, InputResponses, ProgressNotificationParam, ProgressToken};
use serde_json::Value;
use tokio::sync::{Mutex, mpsc, oneshot};
use tokio::time::Instant;
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
    /// Where questions the server asks during this read go, when the agent's session can
    /// take them.
    pub asks: Option<mpsc::Sender<PendingAsk>>,
    /// The agent speaks protocol 2026-07-28 or later: a server's `input_required` result
    /// goes back to it as it is, for its client to answer and retry ([`crate::rounds`]).
    /// Otherwise the gate answers the server's questions itself, through [`Self::asks`].
    pub takes_input_required: bool,
    /// The agent's retry of an earlier `input_required` result: its answers and the
    /// server's request state, passed down untouched.
    pub retry: Option<InputRetry>,
}

/// What an agent's retry of an `input_required` result carries (protocol 2026-07-28):
/// passed to the server as the agent sent it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InputRetry {
    /// `inputResponses`: the answers, by the server's keys.
    pub input_responses: Option<InputResponses>,
    /// `requestState`: the server's own state, echoed.
    pub request_state: Option<String>,
}

impl InputRetry {
    /// The retry a request carries, if it carries one.
    pub fn of(
        input_responses: Option<InputResponses>,
        request_state: Option<String>,
    ) -> Option<Self> {
        (input_responses.is_some() || request_state.is_some()).then_some(Self {
            input_responses,
            request_state,
        })
    }
}

/// A question a server asked during a read.
#[derive(Debug)]
#[allow(deprecated)]
pub enum Ask {
    /// `sampling/createMessage`: the server asks the agent's model for a completion.
    Sampling(CreateMessageRequestParams),
    /// `elicitation/create`: the server asks the agent's user for input.
    Elicitation(ElicitRequestParams),
}

/// A question on its way to the agent, with where its answer (the protocol's result as
/// JSON, or why there is none) goes.
#[derive(Debug)]
pub struct PendingAsk {
    /// The question.
    pub ask: Ask,
    /// The answer.
    pub reply: oneshot::Sender<Result<Value, String>>,
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
            asks: None,
            takes_input_required: false,
            retry: None,
        }
    }

    /// The same relay for an agent that takes `input_required` results itself (it speaks
    /// protocol 2026-07-28), carrying its `retry` of an earlier one, if any.
    pub fn with_input(mut self, takes_input_required: bool, retry: Option<InputRetry>) -> Self {
        self.takes_input_required = takes_input_required;
        self.retry = retry;
        self
    }

    /// The same relay, taking the server's questions to `asks`.
    pub fn with_asks(mut self, asks: mpsc::Sender<PendingAsk>) -> Self {
        self.asks = Some(asks);
        self
    }
}

/// A question a server asked during a person's approved send, on its way to the person:
/// the gate holds it until the person answers or `until` passes, then declines it.
#[derive(Debug)]
pub struct PersonAsk {
    /// The question (a sampling request is declined by the gate at once: no model
    /// answers for a person).
    pub ask: Ask,
    /// When the question is declined if nobody answered: before the send's own deadline,
    /// so the server still hears the decline.
    pub until: Instant,
    /// The answer (the protocol's result as JSON), or why there is none.
    pub reply: oneshot::Sender<Result<Value, String>>,
}

tokio::task_local! {
    /// Where questions go during a person's send run by [`for_person`].
    static PERSON: mpsc::Sender<PersonAsk>;
}

/// Run `send` (a gatekeeper's apply of one approved action) so that a question its server
/// asks while the send is the only call in flight on the connection goes to `asks`, for
/// the person, instead of being declined.
pub async fn for_person<F: Future>(asks: mpsc::Sender<PersonAsk>, send: F) -> F::Output {
    PERSON.scope(asks, send).await
}

/// Where a person's send run by [`for_person`] takes questions, if this is one.
pub(crate) fn person_in_scope() -> Option<mpsc::Sender<PersonAsk>> {
    PERSON.try_with(Clone::clone).ok()
}

/// How long a person may take over a question of a send whose deadline is `deadline`: the
/// deadline less a tenth (at least a second, at most half), so the decline reaches the
/// server before the gate gives up on the send.
pub(crate) fn person_window(deadline: Duration) -> Duration {
    let margin = (deadline / 10)
        .max(Duration::from_secs(1))
        .min(deadline / 2);
    deadline.saturating_sub(margin)
}

/// Who takes the questions of one call in flight.
#[derive(Debug, Clone)]
pub(crate) enum Asker {
    /// An agent's read whose session takes questions.
    Agent(mpsc::Sender<PendingAsk>),
    /// A person's approved send: questions go to the person until `until`, or until
    /// `wait` after each was asked, whichever comes first.
    Person {
        /// Where they go.
        asks: mpsc::Sender<PersonAsk>,
        /// The end of the send's window.
        until: Instant,
        /// The longest a question waits.
        wait: Duration,
    },
    /// A call that takes none (a read whose agent cannot be asked, a listing, a send
    /// outside [`for_person`]).
    Nobody,
}

impl Asker {
    /// Put a server's question to whoever takes this call's questions, and wait for the
    /// answer; `Err` says why there is none.
    pub(crate) async fn put(&self, ask: Ask) -> Result<Value, String> {
        let agent = match self {
            Self::Agent(agent) => agent,
            Self::Person { asks, until, wait } => {
                let until = (*until).min(Instant::now() + *wait);
                return ask_person(asks.clone(), ask, until).await;
            }
            Self::Nobody => {
                return Err(
                    "the call in flight takes no questions (a read whose agent cannot be asked, or a send no person can be asked about), so the gate declines".to_owned(),
                );
            }
        };
        let (reply, answer) = oneshot::channel();
        agent
            .send(PendingAsk { ask, reply })
            .await
            .map_err(|_| "the read that asked has ended".to_owned())?;
        answer
            .await
            .map_err(|_| "the read that asked ended before the agent answered".to_owned())?
    }
}

/// The gate's answer to a sampling request during a person's send.
pub const SEND_CANNOT_SAMPLE: &str = "a person's approved send cannot sample: no model answers on a person's behalf, so the gate declines";

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
    /// The calls in flight, by an id of the connection's own, with who takes their
    /// questions: a question is put to a call only while it is the one in flight.
    askers: std::sync::Mutex<Vec<(u64, Asker)>>,
    next_asker: AtomicU64,
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

    /// Whether any note for `token` reached its route (the server sends progress for it).
    pub(crate) async fn heard(&self, token: &ProgressToken) -> bool {
        self.routes
            .lock()
            .await
            .get(token)
            .is_some_and(|route| route.last.is_some())
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

    /// Note a call in flight, taking the server's questions to `asks` (`None`: a call that
    /// takes none); returns the id to [`ProgressRoutes::stop_asking`] with.
    pub(crate) fn start_asking(&self, asks: Option<mpsc::Sender<PendingAsk>>) -> u64 {
        self.start_call(asks.map_or(Asker::Nobody, Asker::Agent))
    }

    /// Note a call in flight whose questions `asker` takes; returns the id to
    /// [`ProgressRoutes::stop_asking`] with.
    pub(crate) fn start_call(&self, asker: Asker) -> u64 {
        let id = self.next_asker.fetch_add(1, Ordering::Relaxed);
        self.askers().push((id, asker));
        id
    }

    /// The read `id` ended.
    pub(crate) fn stop_asking(&self, id: u64) {
        self.askers().retain(|(asker, _)| *asker != id);
    }

    fn askers(&self) -> std::sync::MutexGuard<'_, Vec<(u64, Asker)>> {
        self.askers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Put a server's question to the call in flight (an agent's read, or a person's send),
    /// and wait for its answer; `Err` says why there is none (no call, several, a call
    /// that takes no questions, or the agent or the person declined).
    pub(crate) async fn ask(&self, ask: Ask) -> Result<Value, String> {
        let asker = {
            let askers = self.askers();
            match askers.as_slice() {
                [(_, one)] => one.clone(),
                [] => {
                    return Err(
                        "no agent's read is in flight on this server, so the gate has no one to ask; it declines".to_owned(),
                    );
                }
                many => {
                    return Err(format!(
                        "{} calls are in flight on this server and the protocol does not say which one asks, so the gate declines; try again",
                        many.len()
                    ));
                }
            }
        };
        asker.put(ask).await
    }

    /// How many notes did not reach an agent so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// Hand `ask` to the person (through the gate, which holds it until `until`), and wait
/// for the answer, a little past `until` at most: the gate declines first.
async fn ask_person(
    asks: mpsc::Sender<PersonAsk>,
    ask: Ask,
    until: Instant,
) -> Result<Value, String> {
    let (reply, answer) = oneshot::channel();
    asks.send(PersonAsk { ask, until, reply })
        .await
        .map_err(|_| "the person's send that asked has ended".to_owned())?;
    match tokio::time::timeout_at(until + Duration::from_secs(2), answer).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(_)) => {
            Err("the gate dropped the question without an answer; it declines".to_owned())
        }
        Err(_) => Err("nobody answered the question in time, so the gate declines".to_owned()),
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

    fn question() -> Ask {
        Ask::Elicitation(
            serde_json::from_value(serde_json::json!({
                "mode": "form",
                "message": "name?",
                "requestedSchema": {"type": "object", "properties": {}}
            }))
            .expect("a question"),
        )
    }

    #[tokio::test]
    async fn a_question_reaches_the_one_read_in_flight_and_is_declined_otherwise() {
        let routes = ProgressRoutes::default();
        let declined = routes.ask(question()).await.expect_err("nobody to ask");
        assert!(
            declined.starts_with("no agent's read is in flight"),
            "{declined}"
        );

        let (asks, mut questions) = mpsc::channel(1);
        let read = routes.start_asking(Some(asks));
        let answering = tokio::spawn(async move {
            let pending: PendingAsk = questions.recv().await.expect("asked");
            pending
                .reply
                .send(Ok(serde_json::json!({"action": "decline"})))
                .expect("replied");
        });
        let answer = routes
            .ask(question())
            .await
            .expect("the read's agent answers");
        assert_eq!(answer["action"], "decline");
        answering.await.expect("joined");

        let send = routes.start_asking(None);
        let declined = routes
            .ask(question())
            .await
            .expect_err("two calls in flight");
        assert!(declined.contains("2 calls are in flight"), "{declined}");
        routes.stop_asking(read);
        let declined = routes.ask(question()).await.expect_err("a send takes none");
        assert!(declined.contains("takes no questions"), "{declined}");
        routes.stop_asking(send);
    }

    #[tokio::test]
    async fn a_question_during_a_persons_send_goes_to_the_person_until_its_time_is_up() {
        let routes = Arc::new(ProgressRoutes::default());
        let (asks, mut questions) = mpsc::channel(1);
        let send = routes.start_call(Asker::Person {
            asks,
            until: Instant::now() + Duration::from_secs(60),
            wait: Duration::from_secs(30),
        });
        let asking = tokio::spawn({
            let routes = routes.clone();
            async move { routes.ask(question()).await }
        });
        let held: PersonAsk = questions.recv().await.expect("put to the person");
        assert!(matches!(held.ask, Ask::Elicitation(_)));
        assert!(
            held.until <= Instant::now() + Duration::from_secs(30),
            "the shorter wait"
        );
        held.reply
            .send(Ok(serde_json::json!({"action": "accept", "content": {}})))
            .expect("replied");
        let answer = asking.await.expect("joined").expect("answered");
        assert_eq!(answer["action"], "accept");

        // Nobody answers: the driver gives up a little after the question's time.
        routes.stop_asking(send);
        let (asks, mut questions) = mpsc::channel(1);
        let send = routes.start_call(Asker::Person {
            asks,
            until: Instant::now() + Duration::from_millis(50),
            wait: Duration::from_secs(30),
        });
        let asking = tokio::spawn({
            let routes = routes.clone();
            async move { routes.ask(question()).await }
        });
        let held = questions.recv().await.expect("put to the person");
        drop(held);
        let declined = asking.await.expect("joined").expect_err("no answer");
        assert!(declined.contains("without an answer"), "{declined}");
        routes.stop_asking(send);
    }

    #[test]
    fn a_person_has_most_of_the_sends_deadline() {
        assert_eq!(
            person_window(Duration::from_secs(60)),
            Duration::from_secs(54)
        );
        assert_eq!(
            person_window(Duration::from_secs(5)),
            Duration::from_secs(4)
        );
        assert_eq!(
            person_window(Duration::from_secs(1)),
            Duration::from_millis(500)
        );
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

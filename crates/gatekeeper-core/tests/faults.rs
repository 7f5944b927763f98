//! Faults around the one send: a service that hangs or panics, an approval abandoned half
//! way. Each ends as "outcome unknown" in the action store and the ledger, at once and
//! without a restart: never "being applied" forever, never sent again.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::{catalog, clock, config};
use gatekeeper_core::store::INTERRUPTED_MESSAGE;
use gatekeeper_core::{
    ActionResult, ActionStore, CallError, ServerTrust, Session, SessionError, Tool, ToolGatekeeper,
    ToolResult, ToolService,
};
use kernel::{ActionState, DecisionError, LedgerId, Overseer};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio::time::Instant;

/// What the service does with the next call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Behaviour {
    Answer,
    Hang,
    Panic,
}

/// A service that answers, hangs or panics, as told, and counts every call.
struct Unreliable {
    calls: AtomicUsize,
    next: Mutex<Behaviour>,
    entered: Notify,
}

#[async_trait]
impl ToolService for Unreliable {
    async fn list_tools(&self) -> Vec<Tool> {
        catalog()
    }

    async fn call(&self, tool: &str, _args: &Value) -> Result<ToolResult, CallError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.entered.notify_one();
        let behaviour = *self.next.lock().unwrap();
        match behaviour {
            Behaviour::Answer => Ok(ToolResult::from_text(format!("ran {tool}"))),
            Behaviour::Hang => std::future::pending().await,
            Behaviour::Panic => panic!("the service's client has a bug"),
        }
    }
}

struct World {
    overseer: Overseer,
    service: Arc<Unreliable>,
    gatekeeper: Arc<ToolGatekeeper>,
    session: Session,
}

fn world(behaviour: Behaviour, deadline: Option<Duration>) -> World {
    let clock = clock();
    let overseer = Overseer::new(clock.clone());
    let service = Arc::new(Unreliable {
        calls: AtomicUsize::new(0),
        next: Mutex::new(behaviour),
        entered: Notify::new(),
    });
    let mut gatekeeper = ToolGatekeeper::new(
        config(ServerTrust::Vetted),
        catalog(),
        service.clone(),
        ActionStore::in_memory(clock),
    );
    if let Some(deadline) = deadline {
        gatekeeper = gatekeeper.with_call_deadline(deadline);
    }
    let gatekeeper = Arc::new(gatekeeper);
    overseer.register(gatekeeper.clone()).unwrap();
    let session = gatekeeper
        .grant_all(&overseer, "agent")
        .unwrap()
        .into_session();
    World {
        overseer,
        service,
        gatekeeper,
        session,
    }
}

/// Stage one write; its driver id and ledger id.
async fn stage(world: &World) -> (kernel::DriverActionId, LedgerId) {
    let outcome = world
        .session
        .call_tool("write", json!({"title": "x"}))
        .await
        .unwrap();
    (outcome.action().unwrap(), outcome.ledger().unwrap())
}

/// The action is an unknown outcome everywhere a person or the agent can look, and
/// nothing can send it again.
async fn assert_outcome_unknown(world: &World, action: kernel::DriverActionId, id: LedgerId) {
    assert_eq!(
        world.session.get_action_result(action).await.unwrap(),
        ActionResult::Failed {
            message: INTERRUPTED_MESSAGE.into(),
            retryable: false
        },
        "the agent is told the outcome is unknown, not that it is running"
    );
    let entry = world.overseer.entry(id).unwrap().unwrap();
    let recorded = entry.action().unwrap();
    assert_eq!(recorded.state, ActionState::Failed);
    assert!(!recorded.failure.as_ref().unwrap().retryable);
    assert!(matches!(
        world.overseer.reject(id, "bob").await.unwrap_err(),
        DecisionError::NotRetryable { .. }
    ));
    assert!(matches!(
        world.overseer.approve(id, "bob").await.unwrap_err(),
        DecisionError::NotRetryable { .. }
    ));
    assert_eq!(world.gatekeeper.store().count_open().await.unwrap(), 0);
    assert_eq!(world.service.calls.load(Ordering::SeqCst), 1, "sent once");
}

#[tokio::test]
async fn a_claim_stranded_by_a_dropped_approve_becomes_outcome_unknown_without_a_restart() {
    let world = world(Behaviour::Hang, None);
    let (action, id) = stage(&world).await;
    {
        let approve = world.overseer.approve(id, "alice");
        tokio::pin!(approve);
        tokio::select! {
            _ = &mut approve => panic!("the service hangs"),
            () = world.service.entered.notified() => {}
        }
        // Whoever waited for the approval went away with the call in flight.
    }
    assert_outcome_unknown(&world, action, id).await;
}

#[tokio::test(start_paused = true)]
async fn a_hung_service_is_an_unknown_outcome_at_the_deadline_and_never_resent() {
    let world = world(Behaviour::Hang, Some(Duration::from_secs(5)));
    let (action, id) = stage(&world).await;
    let started = Instant::now();
    let approved = tokio::time::timeout(
        Duration::from_secs(3600),
        world.overseer.approve(id, "alice"),
    )
    .await
    .expect("the approval answers; the hung call has a deadline");
    assert_eq!(started.elapsed(), Duration::from_secs(5), "paused time");
    let DecisionError::ApplyFailed { source, .. } = approved.unwrap_err() else {
        panic!("an apply failure");
    };
    assert!(
        source.message.contains("did not answer within 5 s"),
        "{}",
        source.message
    );
    assert_outcome_unknown(&world, action, id).await;
}

#[tokio::test]
async fn a_panicking_service_in_apply_is_an_unknown_outcome_and_frees_the_claim() {
    let world = world(Behaviour::Panic, None);
    let (action, id) = stage(&world).await;
    let DecisionError::ApplyFailed { source, .. } =
        world.overseer.approve(id, "alice").await.unwrap_err()
    else {
        panic!("an apply failure");
    };
    assert!(
        source.message.contains("the service's client has a bug"),
        "{}",
        source.message
    );
    assert_outcome_unknown(&world, action, id).await;
}

#[tokio::test(start_paused = true)]
async fn a_read_from_a_hung_service_fails_at_the_deadline() {
    let world = world(Behaviour::Hang, Some(Duration::from_millis(1500)));
    let started = Instant::now();
    let read = tokio::time::timeout(
        Duration::from_secs(3600),
        world.session.call_tool("read", json!({})),
    )
    .await
    .expect("the read answers; the hung call has a deadline");
    assert_eq!(started.elapsed(), Duration::from_millis(1500));
    let Err(SessionError::Service(CallError::Unknown(message))) = read else {
        panic!("a service error: {read:?}");
    };
    assert!(
        message.contains("did not answer within 1500 ms"),
        "{message}"
    );
    // Nothing was recorded as read: the data was never handed over.
    assert!(world.overseer.ledger().unwrap().is_empty());

    *world.service.next.lock().unwrap() = Behaviour::Answer;
    assert!(world.session.call_tool("read", json!({})).await.is_ok());
}

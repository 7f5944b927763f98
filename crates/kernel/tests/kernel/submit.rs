//! Submission answers at once and records a pending action; registration errors.

use std::sync::Arc;
use std::time::Duration;

use kernel::{
    ActionDescription, ActionState, AutoApprovalRule, DecisionError, DriverActionId, DurableFuture,
    EntryBody, LedgerEntry, LedgerId, LedgerStore, MemoryLedger, ObservationDescription, Overseer,
    QueueError, Resolution, StepClock, StorageError,
};
use tokio::sync::Notify;

use crate::support::{FakeGatekeeper, description, setup, state, submit};

#[tokio::test]
async fn submit_returns_before_any_decision_and_records_pending() {
    let (overseer, gatekeeper, queue) = setup();
    let id = submit(&queue, 1, false).await;
    let entry = overseer.entry(id).unwrap().unwrap();
    assert_eq!(&*entry.caller, "agent");
    assert_eq!(&*entry.gatekeeper, "issues");
    assert_eq!(entry.created_at.to_string(), "09:00:00.000");
    assert_eq!(state(&overseer, id), ActionState::Pending);
    overseer.settle().await;
    assert!(
        gatekeeper.applied().is_empty(),
        "nothing is sent without a decision"
    );
}

#[tokio::test]
async fn submit_of_an_auto_approved_action_does_not_wait_for_its_apply() {
    let (overseer, gatekeeper, queue) = setup();
    overseer
        .enable_rule("issues", crate::support::label_kind(), "alice")
        .unwrap();
    let (entered, release) = gatekeeper.park(1);
    // The apply is parked until released; if submit waited for it, this would time out.
    let id = tokio::time::timeout(Duration::from_secs(5), submit(&queue, 1, true))
        .await
        .expect("submit_action must return while the apply is still parked");
    entered.notified().await;
    assert_eq!(state(&overseer, id), ActionState::Pending);
    release.notify_one();
    overseer.settle().await;
    assert_eq!(state(&overseer, id), ActionState::Approved);
}

#[tokio::test]
async fn ids_are_one_sequence_for_actions_and_observations() {
    let (overseer, _gatekeeper, queue) = setup();
    let first = submit(&queue, 1, false).await;
    let observed = queue
        .authorize_observation(kernel::ObservationDescription::new("read", "listed issues"))
        .await
        .unwrap();
    let second = submit(&queue, 2, false).await;
    assert_eq!((first.0, observed.0, second.0), (1, 2, 3));
    let ledger = overseer.ledger().unwrap();
    assert!(matches!(ledger[1].body, EntryBody::Observation(_)));
}

#[tokio::test]
async fn the_same_driver_id_cannot_be_submitted_twice() {
    let (_overseer, _gatekeeper, queue) = setup();
    submit(&queue, 1, false).await;
    let again = queue
        .submit_action(DriverActionId(1), ActionDescription::new("again", ""))
        .await;
    assert_eq!(
        again,
        Err(QueueError::DuplicateSubmission(DriverActionId(1)))
    );
}

#[tokio::test]
async fn registration_and_queues_need_known_unique_names() {
    let (overseer, _gatekeeper, _queue) = setup();
    let err = overseer
        .register(FakeGatekeeper::new("issues"))
        .unwrap_err();
    assert_eq!(err, DecisionError::DuplicateGatekeeper("issues".into()));
    let err = overseer.queue_for("wiki", "agent").err().unwrap();
    assert!(err.to_string().contains("no gatekeeper named \"wiki\""));
    assert_eq!(overseer.gatekeeper_names(), vec!["issues".to_owned()]);
}

/// A store whose inserts become durable only when the test says so (as a store that
/// groups many writes into one sync does, later than the insert), or never.
struct DurableWhenTold {
    memory: MemoryLedger,
    /// Notified to make the pending inserts durable.
    durable: Arc<Notify>,
    /// Whether the sync, once told, fails instead.
    fails: bool,
}

impl LedgerStore for DurableWhenTold {
    fn insert(
        &self,
        make: &mut dyn FnMut(LedgerId) -> LedgerEntry,
    ) -> Result<LedgerId, StorageError> {
        self.memory.insert(make)
    }
    fn insert_durable_later(
        &self,
        make: &mut dyn FnMut(LedgerId) -> LedgerEntry,
    ) -> Result<(LedgerId, DurableFuture), StorageError> {
        let id = self.memory.insert(make)?;
        let (durable, fails) = (self.durable.clone(), self.fails);
        let future: DurableFuture = Box::pin(async move {
            durable.notified().await;
            match fails {
                true => Err(StorageError("the disk went away".to_owned())),
                false => Ok(()),
            }
        });
        Ok((id, future))
    }
    fn get(&self, id: LedgerId) -> Result<Option<LedgerEntry>, StorageError> {
        self.memory.get(id)
    }
    fn put(&self, entry: LedgerEntry) -> Result<(), StorageError> {
        self.memory.put(entry)
    }
    fn record_attempt(&self, id: LedgerId, resolution: &Resolution) -> Result<bool, StorageError> {
        self.memory.record_attempt(id, resolution)
    }
    fn entries(&self) -> Result<Vec<LedgerEntry>, StorageError> {
        self.memory.entries()
    }
    fn open_action_ids(&self, gatekeeper: &str) -> Result<Vec<LedgerId>, StorageError> {
        self.memory.open_action_ids(gatekeeper)
    }
    fn find_action(
        &self,
        gatekeeper: &str,
        driver_id: DriverActionId,
    ) -> Result<Option<LedgerId>, StorageError> {
        self.memory.find_action(gatekeeper, driver_id)
    }
    fn put_rule(&self, rule: &AutoApprovalRule) -> Result<(), StorageError> {
        self.memory.put_rule(rule)
    }
    fn remove_rule(&self, gatekeeper: &str, tag: &str) -> Result<bool, StorageError> {
        self.memory.remove_rule(gatekeeper, tag)
    }
    fn rule(
        &self,
        gatekeeper: &str,
        tag: &str,
    ) -> Result<Option<Arc<AutoApprovalRule>>, StorageError> {
        self.memory.rule(gatekeeper, tag)
    }
    fn rules(&self) -> Result<Vec<AutoApprovalRule>, StorageError> {
        self.memory.rules()
    }
    fn latch_lockdown(&self) -> Result<(), StorageError> {
        self.memory.latch_lockdown()
    }
    fn locked_down(&self) -> Result<bool, StorageError> {
        self.memory.locked_down()
    }
}

/// A kernel on a [`DurableWhenTold`] store, the agent's queue, and the store's signal.
fn durable_when_told(fails: bool) -> (Overseer, Arc<dyn kernel::ApprovalQueue>, Arc<Notify>) {
    let durable = Arc::new(Notify::new());
    let store = DurableWhenTold {
        memory: MemoryLedger::new(),
        durable: durable.clone(),
        fails,
    };
    let overseer = Overseer::with_store(Arc::new(store), Arc::new(StepClock::default()));
    overseer.register(FakeGatekeeper::new("issues")).unwrap();
    let queue = overseer.queue_for("issues", "agent").unwrap();
    (overseer, queue, durable)
}

/// The agent is told "pending" about an action only once the store says it is durable (a
/// crash before could lose it), and is given a sensitive read's data only once its
/// observation is; an ordinary read's observation waits for nothing (issue 42).
#[tokio::test]
async fn the_agent_is_answered_only_once_its_action_is_durable() {
    let (overseer, queue, durable) = durable_when_told(false);
    let agent = queue.clone();
    let submitting = tokio::spawn(async move {
        agent
            .submit_action(DriverActionId(1), description("a1", false))
            .await
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!submitting.is_finished(), "answered before it was durable");
    durable.notify_one();
    let id = submitting.await.unwrap().unwrap();
    assert_eq!(state(&overseer, id), ActionState::Pending);

    // An ordinary read's observation waits for no sync: it rides on the next one.
    let id = queue
        .authorize_observation(ObservationDescription::new("read", ""))
        .await
        .unwrap();
    assert!(matches!(
        overseer.entry(id).unwrap().unwrap().body,
        EntryBody::Observation(_)
    ));

    // A sensitive read's data is handed over only once its observation is durable.
    let observing = tokio::spawn(async move {
        queue
            .authorize_observation(ObservationDescription {
                prohibit_all_sharing: true,
                ..ObservationDescription::new("read secrets", "")
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!observing.is_finished(), "authorized before it was durable");
    durable.notify_one();
    let id = observing.await.unwrap().unwrap();
    assert!(matches!(
        overseer.entry(id).unwrap().unwrap().body,
        EntryBody::Observation(_)
    ));
}

/// A store that cannot make the action durable fails the submission: the agent is never
/// told "pending" about it.
#[tokio::test]
async fn a_submission_whose_action_cannot_be_made_durable_fails() {
    let (_overseer, queue, durable) = durable_when_told(true);
    durable.notify_one();
    let error = queue
        .submit_action(DriverActionId(1), description("a1", false))
        .await
        .unwrap_err();
    assert_eq!(error, QueueError::Storage("the disk went away".to_owned()));
}

//! The at-most-once apply: the `applying` claim is stored before the wiki is written,
//! a crash after it leaves an action that is failed on reopen and never sent again,
//! and concurrent applies send once.
//!
//! A "crash" is a key-value store that stops taking writes right after it stored a
//! claim: the apply goes on to write the wiki, cannot record the outcome, and the
//! gatekeeper is then reopened over what the store kept, as a restarted process would.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use gatekeeper_confluence::record::{StoredRecord, StoredV1};
use gatekeeper_confluence::{
    Bytes, ConfluenceGatekeeper, INTERRUPTED_MESSAGE, KvError, KvStore, MemoryKv, Policy,
    RecordState, WikiService, WikiSession,
};
use kernel::{DriverActionId, Gatekeeper, LedgerId, Overseer, StepClock};
use tokio::sync::Barrier;

use crate::{apply_error, lab_with_manual, storage};

/// What the store does when it is asked to store a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Store it like anything else.
    None,
    /// Refuse it (and store nothing).
    RefuseClaim,
    /// Store it, then refuse every later write: the process died after the claim.
    CrashAfterClaim,
}

/// A [`MemoryKv`] with a fault switch, which notes every claim it stores together with
/// how many writes the wiki had received at that moment.
struct FaultyKv {
    memory: Arc<MemoryKv>,
    service: Arc<WikiService>,
    fault: Mutex<Fault>,
    crashed: AtomicBool,
    claims: Mutex<Vec<(DriverActionId, u64)>>,
}

impl FaultyKv {
    fn set(&self, fault: Fault) {
        *self.fault.lock().unwrap() = fault;
    }

    fn claims(&self) -> Vec<(DriverActionId, u64)> {
        self.claims.lock().unwrap().clone()
    }

    /// Note a stored claim, and crash after it if told to.
    fn noted(&self, id: DriverActionId, fault: Fault) {
        self.claims
            .lock()
            .unwrap()
            .push((id, self.service.writes()));
        if fault == Fault::CrashAfterClaim {
            self.crashed.store(true, Ordering::SeqCst);
        }
    }

    fn check_alive(&self) -> Result<(), KvError> {
        if self.crashed.load(Ordering::SeqCst) {
            return Err(KvError("the process stopped after its claim".into()));
        }
        Ok(())
    }
}

fn claimed_action(value: &[u8]) -> Option<DriverActionId> {
    match StoredRecord::decode(value) {
        Ok(StoredRecord::V1(StoredV1::Action(record))) if record.state == RecordState::Applying => {
            Some(record.id)
        }
        _ => None,
    }
}

impl KvStore for FaultyKv {
    fn get(&self, key: &str) -> Result<Option<Bytes>, KvError> {
        self.memory.get(key)
    }

    fn put(&self, key: &str, value: Bytes) -> Result<(), KvError> {
        self.check_alive()?;
        let claim = claimed_action(&value);
        let fault = *self.fault.lock().unwrap();
        if claim.is_some() && fault == Fault::RefuseClaim {
            return Err(KvError("the claim could not be stored".into()));
        }
        self.memory.put(key, value)?;
        if let Some(id) = claim {
            self.noted(id, fault);
        }
        Ok(())
    }

    fn delete(&self, key: &str) -> Result<bool, KvError> {
        self.check_alive()?;
        self.memory.delete(key)
    }

    fn scan_prefix(&self, prefix: &str) -> Result<Vec<(String, Bytes)>, KvError> {
        self.memory.scan_prefix(prefix)
    }

    fn compare_and_set(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        value: Bytes,
    ) -> Result<bool, KvError> {
        self.check_alive()?;
        let claim = claimed_action(&value);
        let fault = *self.fault.lock().unwrap();
        if claim.is_some() && fault == Fault::RefuseClaim {
            return Err(KvError("the claim could not be stored".into()));
        }
        if !self.memory.compare_and_set(key, expected, value)? {
            return Ok(false);
        }
        if let Some(id) = claim {
            self.noted(id, fault);
        }
        Ok(true)
    }
}

/// A kernel, the wiki (page 100 "Manual", body `original`) and a gatekeeper over a
/// [`FaultyKv`].
struct Rig {
    clock: Arc<StepClock>,
    overseer: Overseer,
    service: Arc<WikiService>,
    kv: Arc<FaultyKv>,
    wiki: Arc<ConfluenceGatekeeper>,
}

impl Rig {
    fn new() -> Self {
        let clock = Arc::new(StepClock::default());
        let service = Arc::new(WikiService::new());
        service.add_space("OPS");
        service.seed_page_with_id(100, "OPS", "Manual", "original");
        let kv = Arc::new(FaultyKv {
            memory: Arc::new(MemoryKv::new()),
            service: service.clone(),
            fault: Mutex::new(Fault::None),
            crashed: AtomicBool::new(false),
            claims: Mutex::new(Vec::new()),
        });
        let (overseer, wiki) = Self::start(&clock, &service, kv.clone());
        Self {
            clock,
            overseer,
            service,
            kv,
            wiki,
        }
    }

    /// A kernel with a gatekeeper over `kv` registered.
    fn start(
        clock: &Arc<StepClock>,
        service: &Arc<WikiService>,
        kv: Arc<dyn KvStore>,
    ) -> (Overseer, Arc<ConfluenceGatekeeper>) {
        let overseer = Overseer::new(clock.clone());
        let wiki = Arc::new(
            ConfluenceGatekeeper::open(
                "confluence",
                service.clone(),
                kv,
                clock.clone(),
                Policy::GUARDED,
            )
            .unwrap(),
        );
        overseer.register(wiki.clone()).unwrap();
        (overseer, wiki)
    }

    fn session(&self) -> WikiSession {
        self.wiki
            .session(self.overseer.queue_for("confluence", "agent").unwrap())
    }

    /// The restart: a new process opens a gatekeeper over what the store kept.
    fn reopen(&self) -> (Overseer, Arc<ConfluenceGatekeeper>) {
        Self::start(&self.clock, &self.service, self.kv.memory.clone())
    }

    /// The state of a record as the store holds it (not as any gatekeeper indexes it).
    fn stored_state(&self, id: DriverActionId) -> RecordState {
        let bytes = self
            .kv
            .memory
            .get(&format!("action:{:020}", id.0))
            .unwrap()
            .expect("the record is stored");
        match StoredRecord::decode(&bytes).unwrap() {
            StoredRecord::V1(StoredV1::Action(record)) => record.state,
            other => panic!("not an action: {other:?}"),
        }
    }

    /// The driver id behind a ledger id.
    fn driver_id(&self, id: LedgerId) -> DriverActionId {
        self.overseer
            .entry(id)
            .unwrap()
            .expect("entry")
            .action()
            .expect("an action")
            .driver_id
    }
}

#[tokio::test]
async fn a_crash_after_the_claim_fails_the_action_on_reopen_and_it_is_never_sent_again() {
    // An append (sent twice, it appends twice) and a create (sent twice, a duplicate
    // page): each crashes at a different outcome write (the record, the `prov:~1` map).
    for case in ["append", "create"] {
        let rig = Rig::new();
        let agent = rig.session();
        let page = agent.open("100").await.unwrap();
        let ledger = match case {
            "append" => agent.append_content(&page, "more").await.unwrap().ledger,
            _ => {
                agent.create_page("OPS", "Runbook", "steps").await.unwrap();
                rig.overseer.open_actions().unwrap()[0].id
            }
        };
        let id = rig.driver_id(ledger);

        rig.kv.set(Fault::CrashAfterClaim);
        let error = apply_error(rig.overseer.approve(ledger, "ana").await);
        assert!(!error.retryable, "{case}: it was sent: {}", error.message);
        assert_eq!(rig.service.writes(), 1, "{case}: the write landed");
        assert_eq!(
            rig.kv.claims(),
            vec![(id, 0)],
            "{case}: the claim was stored before the wiki was written"
        );
        assert_eq!(rig.stored_state(id), RecordState::Applying, "{case}");

        // The same process, before it dies: the claim holds, nothing is sent again.
        assert_eq!(
            rig.wiki.record(id).unwrap().state,
            RecordState::Applying,
            "{case}"
        );
        let again = rig.wiki.apply_action(id).await.unwrap_err();
        assert!(
            again.message.contains("already being applied"),
            "{case}: {}",
            again.message
        );
        let refused = rig.wiki.reject_action(id).await.unwrap_err();
        assert!(
            refused.message.contains("can no longer be rejected"),
            "{refused:?}"
        );
        assert_eq!(rig.service.writes(), 1, "{case}");

        // The restart: failed for good, not pending, never re-sent.
        let (overseer, reopened) = rig.reopen();
        let record = reopened.record(id).unwrap();
        assert_eq!(record.state, RecordState::Failed, "{case}");
        assert_eq!(
            record.failure.as_deref(),
            Some(INTERRUPTED_MESSAGE),
            "{case}"
        );
        assert_eq!(
            rig.stored_state(id),
            RecordState::Failed,
            "{case}: persisted"
        );
        assert_eq!(reopened.pending_count(), 0, "{case}");
        for _ in 0..2 {
            let error = reopened.apply_action(id).await.unwrap_err();
            assert!(!error.retryable, "{case}");
            assert_eq!(error.message, INTERRUPTED_MESSAGE, "{case}");
        }
        assert_eq!(rig.service.writes(), 1, "{case}: never sent again");

        // Reads stop simulating it: what the wiki holds is shown once, nothing pending.
        let reader = reopened.session(overseer.queue_for("confluence", "agent").unwrap());
        match case {
            "append" => {
                let view = reader.read(&page).await.unwrap();
                assert_eq!(view.pending_changes, 0);
                assert_eq!(view.body.matches("more").count(), 1, "{}", view.body);
                assert_eq!(storage_of(&rig.service, 100), "<p>original</p><p>more</p>");
            }
            _ => {
                // The wiki has page 200; the handle ~1 was never mapped to it, and
                // its create is no longer overlaid.
                assert!(rig.service.page(200).is_some());
                let view = reader.body(&"~1".parse().unwrap()).await.unwrap();
                assert!(!view.contains("steps"), "{view}");
            }
        }

        // A second restart finds nothing left to recover and still sends nothing.
        let (_, again) = rig.reopen();
        assert_eq!(again.record(id).unwrap().failure, record.failure);
        assert!(again.apply_action(id).await.is_err());
        assert_eq!(rig.service.writes(), 1, "{case}");
    }
}

fn storage_of(service: &WikiService, id: u64) -> String {
    service.page(id).expect("the page exists").body
}

#[tokio::test]
async fn a_claim_that_cannot_be_stored_sends_nothing_and_may_be_approved_again() {
    let rig = Rig::new();
    let agent = rig.session();
    let page = agent.open("100").await.unwrap();
    let staged = agent.append_content(&page, "more").await.unwrap();

    rig.kv.set(Fault::RefuseClaim);
    let error = apply_error(rig.overseer.approve(staged.ledger, "ana").await);
    assert!(error.retryable, "{}", error.message);
    assert!(
        error.message.contains("nothing was sent"),
        "{}",
        error.message
    );
    assert_eq!(rig.service.writes(), 0);
    assert_eq!(rig.stored_state(staged.action), RecordState::Pending);
    assert_eq!(rig.wiki.pending_count(), 1, "still simulated");

    rig.kv.set(Fault::None);
    rig.overseer.approve(staged.ledger, "ana").await.unwrap();
    assert_eq!(rig.service.writes(), 1);
    assert_eq!(rig.kv.claims(), vec![(staged.action, 0)]);
    assert_eq!(rig.stored_state(staged.action), RecordState::Applied);
}

#[tokio::test]
async fn a_refused_check_stores_no_claim_and_a_refused_write_releases_it() {
    let rig = Rig::new();
    let agent = rig.session();
    let page = agent.open("100").await.unwrap();
    let created = agent.create_page("OPS", "Runbook", "").await.unwrap();
    agent.append_content(&created, "later").await.unwrap();
    // Another agent's, so it does not wait for the first agent's earlier actions.
    let staged = rig.session().append_content(&page, "more").await.unwrap();
    let open = rig.overseer.open_actions().unwrap();

    // Refused before anything could be sent: no claim at all.
    let error = apply_error(rig.overseer.approve(open[1].id, "ana").await);
    assert!(error.retryable, "{}", error.message);
    assert!(
        error.message.contains("has not been created yet"),
        "{}",
        error.message
    );
    assert!(rig.kv.claims().is_empty());

    // Refused by the wiki (a 409) after the claim: the claim is released, pending again.
    rig.service.edit_after_next_get(
        100,
        gatekeeper_confluence::Edit::AppendBody("theirs".into()),
    );
    let error = apply_error(rig.overseer.approve(staged.ledger, "ana").await);
    assert!(error.retryable, "{}", error.message);
    assert_eq!(rig.kv.claims(), vec![(staged.action, 0)]);
    assert_eq!(rig.stored_state(staged.action), RecordState::Pending);
    assert_eq!(
        rig.wiki.record(staged.action).unwrap().state,
        RecordState::Pending
    );
    assert_eq!(rig.service.writes(), 0);

    rig.overseer.approve(staged.ledger, "ana").await.unwrap();
    assert_eq!(rig.service.writes(), 1);
    assert_eq!(
        storage_of(&rig.service, 100),
        "<p>original</p><p>theirs</p><p>more</p>"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_applies_of_one_action_send_it_once() {
    const APPLIES: usize = 8;
    let lab = lab_with_manual(Policy::GUARDED, "Manual", "original");
    let agent = lab.session("agent");
    let page = agent.open("100").await.unwrap();
    let staged = agent.append_content(&page, "more").await.unwrap();

    let barrier = Arc::new(Barrier::new(APPLIES));
    let tasks: Vec<_> = (0..APPLIES)
        .map(|_| {
            let wiki = lab.wiki.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                wiki.apply_action(staged.action).await
            })
        })
        .collect();
    for task in tasks {
        // Applies run one after another under the driver's lock: the first sends, the
        // others find the action applied and succeed without sending.
        task.await.unwrap().unwrap();
    }
    assert_eq!(lab.service.writes(), 1);
    assert_eq!(storage(&lab, 100), "<p>original</p><p>more</p>");
    assert_eq!(
        lab.wiki.record(staged.action).unwrap().state,
        RecordState::Applied
    );
}

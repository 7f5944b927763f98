//! Shared fixtures for gatekeeper-core's integration tests: a scripted service, a storage
//! backend that fails on request, and a small wired world around a real kernel.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use gatekeeper_core::{
    ActionRecord, ActionStorage, ActionStore, CallError, ClaimDurable, GatekeeperConfig,
    MemoryActionStorage, ServerTrust, StateTag, StorageError, Tool, ToolGatekeeper, ToolResult,
    ToolService,
};
use kernel::{Clock, DriverActionId, Overseer, StepClock, Timestamp};
use serde_json::{Value, json};

/// A service that answers from a script (default: `ran <tool>`) and counts calls.
#[derive(Default)]
pub struct FakeService {
    calls: AtomicUsize,
    replies: Mutex<VecDeque<Result<ToolResult, CallError>>>,
    log: Mutex<Vec<(String, Value)>>,
}

impl FakeService {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn reply_next(&self, reply: Result<ToolResult, CallError>) {
        self.replies.lock().unwrap().push_back(reply);
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    pub fn log(&self) -> Vec<(String, Value)> {
        self.log.lock().unwrap().clone()
    }
}

pub fn catalog() -> Vec<Tool> {
    Tool::catalog_from_json(json!([
        {"name": "read", "description": "Read things.", "annotations": {"readOnlyHint": true}},
        {"name": "write", "description": "Write things."},
        {"name": "tag", "annotations": {"destructiveHint": false, "idempotentHint": true}}
    ]))
    .expect("valid catalog")
}

#[async_trait]
impl ToolService for FakeService {
    async fn list_tools(&self) -> Vec<Tool> {
        catalog()
    }

    async fn call(&self, tool: &str, args: &Value) -> Result<ToolResult, CallError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.log
            .lock()
            .unwrap()
            .push((tool.to_owned(), args.clone()));
        let scripted = self.replies.lock().unwrap().pop_front();
        scripted.unwrap_or_else(|| Ok(ToolResult::from_text(format!("ran {tool}"))))
    }
}

/// Memory storage whose n-th compare-and-set (1-based) fails, like a disk at the wrong time.
pub struct FaultyStorage {
    pub inner: MemoryActionStorage,
    fail_cas_at: usize,
    cas_seen: AtomicUsize,
    /// Whether a written claim never becomes durable (a sync that never ends).
    claims_hang: bool,
}

impl FaultyStorage {
    pub fn failing_cas(inner: MemoryActionStorage, n: usize) -> Self {
        Self {
            inner,
            fail_cas_at: n,
            cas_seen: AtomicUsize::new(0),
            claims_hang: false,
        }
    }

    /// The injected failure, if this compare-and-set (a claim counts as one) is the n-th.
    fn cas_fault(&self) -> Result<(), StorageError> {
        if self.cas_seen.fetch_add(1, Ordering::SeqCst) + 1 == self.fail_cas_at {
            return Err(StorageError("disk full".into()));
        }
        Ok(())
    }

    /// Memory storage whose claims are written but never become durable.
    pub fn hanging_claims(inner: MemoryActionStorage) -> Self {
        Self {
            claims_hang: true,
            ..Self::failing_cas(inner, 0)
        }
    }
}

#[async_trait]
impl ActionStorage for FaultyStorage {
    async fn insert_pending(
        &self,
        tool: Arc<str>,
        definition: Option<Arc<str>>,
        args: Arc<Value>,
        submitted_at: Timestamp,
        max_open: usize,
    ) -> Result<Option<DriverActionId>, StorageError> {
        self.inner
            .insert_pending(tool, definition, args, submitted_at, max_open)
            .await
    }

    async fn get(&self, id: DriverActionId) -> Result<Option<ActionRecord>, StorageError> {
        self.inner.get(id).await
    }

    async fn compare_and_set(
        &self,
        from: StateTag,
        record: &ActionRecord,
    ) -> Result<bool, StorageError> {
        self.cas_fault()?;
        self.inner.compare_and_set(from, record).await
    }

    async fn claim(
        &self,
        from: StateTag,
        record: &ActionRecord,
    ) -> Result<Option<ClaimDurable>, StorageError> {
        self.cas_fault()?;
        let claimed = self.inner.claim(from, record).await?;
        Ok(match self.claims_hang {
            true => claimed.map(|_| Box::pin(std::future::pending()) as ClaimDurable),
            false => claimed,
        })
    }

    async fn count_open(&self) -> Result<usize, StorageError> {
        self.inner.count_open().await
    }

    async fn delete_pending(&self, id: DriverActionId) -> Result<bool, StorageError> {
        self.inner.delete_pending(id).await
    }

    async fn records_in(&self, state: StateTag) -> Result<Vec<ActionRecord>, StorageError> {
        self.inner.records_in(state).await
    }

    async fn prune_final(&self, keep: usize) -> Result<usize, StorageError> {
        self.inner.prune_final(keep).await
    }
}

pub fn clock() -> Arc<dyn Clock> {
    Arc::new(StepClock::default())
}

pub fn config(trust: ServerTrust) -> GatekeeperConfig {
    GatekeeperConfig {
        name: "svc".into(),
        server_name: "Service".into(),
        endpoint: "https://svc.example/mcp".into(),
        trust,
        scope: "mcp:svc".into(),
        reads: Vec::new(),
    }
}

/// A kernel with one registered gatekeeper over a fake service.
pub struct World {
    pub overseer: Overseer,
    pub service: Arc<FakeService>,
    pub storage: MemoryActionStorage,
    pub gatekeeper: Arc<ToolGatekeeper>,
}

pub async fn world(trust: ServerTrust) -> World {
    let clock = clock();
    let overseer = Overseer::new(clock.clone());
    let service = FakeService::new();
    let storage = MemoryActionStorage::new();
    let store = ActionStore::open(Arc::new(storage.clone()), clock)
        .await
        .expect("open");
    let gatekeeper = Arc::new(ToolGatekeeper::new(
        config(trust),
        catalog(),
        service.clone(),
        store,
    ));
    overseer.register(gatekeeper.clone()).expect("register");
    World {
        overseer,
        service,
        storage,
        gatekeeper,
    }
}

//! The driver's action store: staged records in the key-value port, plus the in-memory
//! indexes that make a read cost what the page it reads costs.
//!
//! The port is the truth; the indexes are rebuilt from it by [`ActionStore::open`] and
//! kept in step by every write (write-through: the port first, then the index). The
//! index that matters for speed is *pending actions by resolved content*: a read folds
//! only the pending actions of the content it reads, found in one map lookup, in
//! ascending id. The reference instead lists every action in its store and filters on
//! each read, so its reads slow down with pending work on other pages.
//!
//! Each record is held once ([`HeldRecord`]): the indexes keep the value stored in the
//! port, shared with the port, with what reads need as spans of it; a read folds the
//! texts of the page's pending records in place, and the whole record is decoded only
//! on demand ([`HeldRecord::record`]).
//!
//! Provisional handles are resolved through the `prov:` mapping. When a create is
//! applied, the pending and applied entries filed under its `~N` are moved to the real
//! id, so one lookup keeps finding them under either spelling.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use kernel::DriverActionId;

use crate::handle::ContentHandle;
use crate::held::HeldRecord;
use crate::kv::{Bytes, KvError, KvStore};
use crate::overlay::Pending;
use crate::record::{ActionRecord, RecordState, StoredRecord, StoredV1, WikiActionOf};

const SEQ_ACTION: &str = "seq:action";
const SEQ_PROVISIONAL: &str = "seq:provisional";
const ACTION_PREFIX: &str = "action:";
const PROV_PREFIX: &str = "prov:~";
const SPACE_PREFIX: &str = "space:";

fn action_key(id: DriverActionId) -> String {
    format!("{ACTION_PREFIX}{:020}", id.0)
}

fn undecodable(key: &str, e: postcard::Error) -> KvError {
    KvError(format!(
        "the value under {key} could not be decoded ({e}); the store was written by an incompatible version"
    ))
}

fn decode(key: &str, bytes: &[u8]) -> Result<StoredV1, KvError> {
    match StoredRecord::decode(bytes) {
        Ok(StoredRecord::V1(value)) => Ok(value),
        Err(e) => Err(undecodable(key, e)),
    }
}

/// Hold the value stored under `key`, an action record.
fn held(key: &str, value: Bytes) -> Result<HeldRecord, KvError> {
    match HeldRecord::parse(value) {
        Ok(Some(record)) => Ok(record),
        Ok(None) => Err(unexpected(key)),
        Err(e) => Err(undecodable(key, e)),
    }
}

fn unexpected(key: &str) -> KvError {
    KvError(format!(
        "the value under {key} has the wrong type; the store was written by an incompatible version"
    ))
}

/// Pending actions of one content, in ascending id.
pub(crate) type PendingMap = BTreeMap<DriverActionId, Arc<HeldRecord>>;

pub(crate) struct ActionStore {
    kv: Arc<dyn KvStore>,
    records: BTreeMap<DriverActionId, Arc<HeldRecord>>,
    pending: HashMap<ContentHandle, PendingMap>,
    applied_writes: HashMap<ContentHandle, Vec<DriverActionId>>,
    creates: HashMap<u64, DriverActionId>,
    provisional: HashMap<u64, u64>,
    spaces: HashMap<String, u64>,
    next_action: u64,
    next_provisional: u64,
    empty: PendingMap,
}

impl ActionStore {
    /// Load everything from the port and build the indexes.
    pub(crate) fn open(kv: Arc<dyn KvStore>) -> Result<Self, KvError> {
        let counter = |key: &str| -> Result<u64, KvError> {
            match kv.get(key)? {
                None => Ok(1),
                Some(bytes) => match decode(key, &bytes)? {
                    StoredV1::Counter(n) => Ok(n),
                    _ => Err(unexpected(key)),
                },
            }
        };
        let mut store = Self {
            next_action: counter(SEQ_ACTION)?,
            next_provisional: counter(SEQ_PROVISIONAL)?,
            kv: kv.clone(),
            records: BTreeMap::new(),
            pending: HashMap::new(),
            applied_writes: HashMap::new(),
            creates: HashMap::new(),
            provisional: HashMap::new(),
            spaces: HashMap::new(),
            empty: PendingMap::new(),
        };
        for (key, bytes) in kv.scan_prefix(PROV_PREFIX)? {
            let n = key[PROV_PREFIX.len()..]
                .parse::<u64>()
                .map_err(|_| unexpected(&key))?;
            match decode(&key, &bytes)? {
                StoredV1::Provisional(real) => store.provisional.insert(n, real),
                _ => return Err(unexpected(&key)),
            };
        }
        for (key, bytes) in kv.scan_prefix(SPACE_PREFIX)? {
            match decode(&key, &bytes)? {
                StoredV1::Space(id) => store.spaces.insert(key[SPACE_PREFIX.len()..].into(), id),
                _ => return Err(unexpected(&key)),
            };
        }
        for (key, value) in kv.scan_prefix(ACTION_PREFIX)? {
            store.index(Arc::new(held(&key, value)?));
        }
        Ok(store)
    }

    fn put_value(&self, key: &str, value: StoredV1) -> Result<(), KvError> {
        self.kv.put(key, StoredRecord::V1(value).encode().into())
    }

    /// The next action id; the counter is consumed even if staging fails later.
    pub(crate) fn allocate_action(&mut self) -> Result<DriverActionId, KvError> {
        let id = self.next_action;
        self.put_value(SEQ_ACTION, StoredV1::Counter(id + 1))?;
        self.next_action = id + 1;
        Ok(DriverActionId(id))
    }

    /// The next provisional number (`~N`).
    pub(crate) fn allocate_provisional(&mut self) -> Result<u64, KvError> {
        let n = self.next_provisional;
        self.put_value(SEQ_PROVISIONAL, StoredV1::Counter(n + 1))?;
        self.next_provisional = n + 1;
        Ok(n)
    }

    /// The real id a provisional handle maps to, or the handle itself.
    pub(crate) fn resolve(&self, handle: ContentHandle) -> ContentHandle {
        match handle {
            ContentHandle::Provisional(n) => self
                .provisional
                .get(&n)
                .map_or(handle, |real| ContentHandle::Real(*real)),
            real => real,
        }
    }

    /// Whether `~n` names content: created, or with a create record in any state.
    /// A rejected create is deleted, so its handle is forgotten.
    pub(crate) fn knows_provisional(&self, n: u64) -> bool {
        self.provisional.contains_key(&n) || self.creates.contains_key(&n)
    }

    /// The create record of `~n`, in any state.
    pub(crate) fn create_of(&self, n: u64) -> Option<&Arc<HeldRecord>> {
        self.creates.get(&n).and_then(|id| self.records.get(id))
    }

    /// One record.
    pub(crate) fn get(&self, id: DriverActionId) -> Option<&Arc<HeldRecord>> {
        self.records.get(&id)
    }

    /// Every record, in ascending id.
    pub(crate) fn records(&self) -> impl Iterator<Item = &Arc<HeldRecord>> {
        self.records.values()
    }

    /// The pending actions on a content (give the resolved handle), in ascending id.
    pub(crate) fn pending_on(&self, resolved: ContentHandle) -> &PendingMap {
        self.pending.get(&resolved).unwrap_or(&self.empty)
    }

    /// How many actions are pending, over all content.
    pub(crate) fn pending_count(&self) -> usize {
        self.pending.values().map(BTreeMap::len).sum()
    }

    /// The applied actions that moved the version of a content, in apply order.
    pub(crate) fn applied_writes_on(&self, resolved: ContentHandle) -> &[DriverActionId] {
        self.applied_writes
            .get(&resolved)
            .map_or(&[], |ids| ids.as_slice())
    }

    /// Encode a record and hold the value, without writing it anywhere yet.
    fn hold(record: ActionRecord) -> Result<(String, HeldRecord), KvError> {
        let key = action_key(record.id);
        let value = StoredRecord::V1(StoredV1::Action(Box::new(record))).encode();
        let held = held(&key, value.into())?;
        Ok((key, held))
    }

    /// Write a record through to the port, then re-index it. The index keeps the value
    /// written, the same buffer the port was handed.
    pub(crate) fn put(&mut self, record: ActionRecord) -> Result<Arc<HeldRecord>, KvError> {
        let (key, held) = Self::hold(record)?;
        self.kv.put(&key, held.value().clone())?;
        self.unindex(held.id());
        let held = Arc::new(held);
        self.index(held.clone());
        Ok(held)
    }

    /// Claim an action for an apply: write `claim` (the record as `applying`) only if
    /// the port still holds `current`'s value exactly as this store indexed it, through
    /// the port's compare-and-set. Another gatekeeper with the same store open may have
    /// claimed, applied or deleted it meanwhile: then nothing is written, the record is
    /// reloaded from the port, and the reloaded record (if any) is returned as `Err`.
    pub(crate) fn claim(
        &mut self,
        current: &HeldRecord,
        claim: ActionRecord,
    ) -> Result<Result<(), Option<Arc<HeldRecord>>>, KvError> {
        let (key, claim) = Self::hold(claim)?;
        if self
            .kv
            .compare_and_set(&key, Some(current.value()), claim.value().clone())?
        {
            self.unindex(claim.id());
            self.index(Arc::new(claim));
            return Ok(Ok(()));
        }
        self.unindex(current.id());
        let reloaded = match self.kv.get(&key)? {
            None => None,
            Some(value) => {
                let record = Arc::new(held(&key, value)?);
                self.index(record.clone());
                Some(record)
            }
        };
        Ok(Err(reloaded))
    }

    /// Turn every record left `applying` (by a process that stopped between its claim and
    /// its outcome) into `failed` with `message`, through the port; returns their ids.
    /// Such an action may have reached the wiki, so it must never be sent again.
    pub(crate) fn fail_interrupted(
        &mut self,
        message: &str,
    ) -> Result<Vec<DriverActionId>, KvError> {
        let leftover: Vec<ActionRecord> = self
            .records
            .values()
            .filter(|r| r.state() == RecordState::Applying)
            .map(|r| r.record())
            .collect();
        let mut failed = Vec::with_capacity(leftover.len());
        for mut next in leftover {
            let id = next.id;
            next.state = RecordState::Failed;
            next.failure = Some(message.to_owned());
            self.put(next)?;
            failed.push(id);
        }
        Ok(failed)
    }

    /// Delete a record from the port and the indexes.
    pub(crate) fn delete(&mut self, id: DriverActionId) -> Result<(), KvError> {
        self.kv.delete(&action_key(id))?;
        self.unindex(id);
        Ok(())
    }

    /// Record that `~n` is now the real content `real`, and refile its entries.
    pub(crate) fn set_provisional(&mut self, n: u64, real: u64) -> Result<(), KvError> {
        self.put_value(&format!("{PROV_PREFIX}{n}"), StoredV1::Provisional(real))?;
        self.provisional.insert(n, real);
        let from = ContentHandle::Provisional(n);
        let to = ContentHandle::Real(real);
        if let Some(moved) = self.pending.remove(&from) {
            self.pending.entry(to).or_default().extend(moved);
        }
        if let Some(moved) = self.applied_writes.remove(&from) {
            self.applied_writes.entry(to).or_default().extend(moved);
        }
        Ok(())
    }

    /// A space's cached numeric id.
    pub(crate) fn space(&self, key: &str) -> Option<u64> {
        self.spaces.get(key).copied()
    }

    /// Cache a space's numeric id forever.
    pub(crate) fn put_space(&mut self, key: &str, id: u64) -> Result<(), KvError> {
        self.put_value(&format!("{SPACE_PREFIX}{key}"), StoredV1::Space(id))?;
        self.spaces.insert(key.to_owned(), id);
        Ok(())
    }

    fn index(&mut self, record: Arc<HeldRecord>) {
        let id = record.id();
        let key = self.resolve(record.action().target());
        if let WikiActionOf::Create { provisional, .. } = *record.action() {
            self.creates.insert(provisional, id);
        }
        match record.state() {
            RecordState::Pending => {
                self.pending
                    .entry(key)
                    .or_default()
                    .insert(id, record.clone());
            }
            RecordState::Applied => {
                if record.wrote() {
                    let writes = self.applied_writes.entry(key).or_default();
                    if !writes.contains(&id) {
                        writes.push(id);
                    }
                }
            }
            // An applying record may already be in the wiki: folding it over the wiki's
            // state could show it twice, so it is not overlaid.
            RecordState::Applying | RecordState::Reverted | RecordState::Failed => {}
        }
        self.records.insert(id, record);
    }

    fn unindex(&mut self, id: DriverActionId) {
        let Some(old) = self.records.remove(&id) else {
            return;
        };
        let key = self.resolve(old.action().target());
        if let Some(pending) = self.pending.get_mut(&key) {
            pending.remove(&id);
            if pending.is_empty() {
                self.pending.remove(&key);
            }
        }
        if let WikiActionOf::Create { provisional, .. } = *old.action() {
            self.creates.remove(&provisional);
        }
        // Applied writes stay listed: they remain facts about the content's history even
        // when the record later becomes `reverted` (the revert is a write of its own).
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::kv::MemoryKv;
    use crate::record::{ContentKind, ContentStatus, Parent, WikiAction};

    fn record(id: u64, action: WikiAction) -> ActionRecord {
        ActionRecord::pending(id, action)
    }

    #[test]
    fn pending_work_is_found_under_either_spelling_and_survives_a_reload() {
        let kv: Arc<dyn KvStore> = Arc::new(MemoryKv::new());
        let mut store = ActionStore::open(kv.clone()).unwrap();
        let create_id = store.allocate_action().unwrap();
        let n = store.allocate_provisional().unwrap();
        store
            .put(record(
                create_id.0,
                WikiAction::Create {
                    provisional: n,
                    kind: ContentKind::Page,
                    parent: Parent::Space {
                        space: "OPS".into(),
                    },
                    title: "Parent".into(),
                    content: None,
                    status: ContentStatus::Current,
                },
            ))
            .unwrap();
        let append = store.allocate_action().unwrap();
        store
            .put(record(
                append.0,
                WikiAction::AppendContent {
                    target: ContentHandle::Provisional(n),
                    markdown: "x".into(),
                },
            ))
            .unwrap();
        let on = |s: &ActionStore, h| {
            s.pending_on(s.resolve(h))
                .keys()
                .copied()
                .collect::<Vec<_>>()
        };
        assert_eq!(
            on(&store, ContentHandle::Provisional(1)),
            vec![create_id, append]
        );

        store.set_provisional(n, 200).unwrap();
        assert_eq!(
            store.resolve(ContentHandle::Provisional(1)),
            ContentHandle::Real(200)
        );
        assert_eq!(
            on(&store, ContentHandle::Real(200)),
            vec![create_id, append]
        );

        let reloaded = ActionStore::open(kv).unwrap();
        assert_eq!(
            on(&reloaded, ContentHandle::Provisional(1)),
            vec![create_id, append]
        );
        assert_eq!(reloaded.pending_count(), 2);
        assert!(reloaded.knows_provisional(1));
        assert!(!reloaded.knows_provisional(2));
        let mut again = reloaded;
        assert_eq!(again.allocate_action().unwrap(), DriverActionId(3));
        assert_eq!(again.allocate_provisional().unwrap(), 2);
    }

    #[test]
    fn an_applying_record_is_not_overlaid_and_fails_when_reopened() {
        let kv: Arc<dyn KvStore> = Arc::new(MemoryKv::new());
        let mut store = ActionStore::open(kv.clone()).unwrap();
        let target = ContentHandle::Real(100);
        for id in [1, 2] {
            let action = WikiAction::AppendContent {
                target,
                markdown: "x".into(),
            };
            store.put(record(id, action)).unwrap();
        }
        let mut claim = store.get(DriverActionId(1)).unwrap().record();
        claim.state = RecordState::Applying;
        store.put(claim).unwrap();
        let pending = |s: &ActionStore| s.pending_on(target).keys().copied().collect::<Vec<_>>();
        assert_eq!(pending(&store), vec![DriverActionId(2)]);

        let mut reopened = ActionStore::open(kv.clone()).unwrap();
        assert_eq!(pending(&reopened), vec![DriverActionId(2)]);
        assert_eq!(
            reopened.fail_interrupted("interrupted").unwrap(),
            vec![DriverActionId(1)]
        );
        let failed = reopened.get(DriverActionId(1)).unwrap().record();
        assert_eq!(failed.state, RecordState::Failed);
        assert_eq!(failed.failure.as_deref(), Some("interrupted"));
        assert_eq!(pending(&reopened), vec![DriverActionId(2)]);

        let mut again = ActionStore::open(kv).unwrap();
        assert_eq!(
            again.get(DriverActionId(1)).unwrap().state(),
            RecordState::Failed
        );
        assert!(again.fail_interrupted("interrupted").unwrap().is_empty());
    }

    /// The property the index is built for: with the in-memory store, a record is held
    /// once. The index keeps the very buffer the store keeps (after a write, a claim and
    /// a reload), and the texts a read folds lie inside it: no second copy, encoded or
    /// decoded.
    #[test]
    fn the_index_and_the_memory_store_hold_one_buffer_per_record() {
        let memory = Arc::new(MemoryKv::new());
        let kv: Arc<dyn KvStore> = memory.clone();
        let mut store = ActionStore::open(kv.clone()).unwrap();
        let target = ContentHandle::Real(100);
        for id in [1, 2] {
            let action = WikiAction::AppendContent {
                target,
                markdown: format!("Step {id}: check the dashboards."),
            };
            store.put(record(id, action)).unwrap();
        }
        let held = store.get(DriverActionId(1)).unwrap().clone();
        let mut claim = held.record();
        claim.state = RecordState::Applying;
        assert!(matches!(store.claim(&held, claim), Ok(Ok(()))));

        let one_buffer = |store: &ActionStore| {
            for (key, stored) in memory.scan_prefix(ACTION_PREFIX).unwrap() {
                let id = DriverActionId(key[ACTION_PREFIX.len()..].parse().unwrap());
                let held = store.get(id).unwrap();
                assert_eq!(held.value().as_ptr(), stored.as_ptr(), "{key}");
                let WikiActionOf::AppendContent { markdown, .. } = held.action() else {
                    panic!("{key} holds an append");
                };
                let text = held.text(markdown).as_ptr_range();
                let value = stored.as_ptr_range();
                assert!(value.start <= text.start && text.end <= value.end, "{key}");
            }
        };
        one_buffer(&store);
        assert_eq!(
            store
                .pending_on(target)
                .values()
                .next()
                .unwrap()
                .value()
                .as_ptr(),
            memory
                .get(&action_key(DriverActionId(2)))
                .unwrap()
                .unwrap()
                .as_ptr()
        );
        one_buffer(&ActionStore::open(kv).unwrap());
    }
}

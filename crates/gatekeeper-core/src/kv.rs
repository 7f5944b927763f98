//! The drivers' key-value port: where a driver that keeps its own records (the wiki
//! driver's staged actions and provisional mappings) keeps them, implemented by the
//! durable stores.
//!
//! It lives in the toolkit, not in the driver that first needed it, so a store implements
//! it without depending on that driver (and the daemon, which runs no wiki driver, does not
//! build one). The port is synchronous on purpose, like the kernel's ledger port: every
//! call is one small read or write, an embedded backend (SQLite) answers in microseconds,
//! and a driver never holds a call across an `.await`. Keys are UTF-8 strings, values
//! opaque bytes (the wiki driver writes postcard inside a versioned envelope).
//!
//! Values are [`Bytes`]: shared, immutable buffers. A backend that keeps values in memory
//! keeps the buffer it was given and hands out clones of it, so a driver's index, which
//! keeps the values it wrote and read, and the backend hold one allocation between them:
//! a record is never held both encoded and decoded in one process.
//!
//! What the port refuses to do: transactions, watches, TTLs. A driver keeps its own
//! write-through index in memory and treats the port as the durable truth it reloads
//! from.
//!
//! The one conditional write it offers is [`KvStore::compare_and_set`]: a driver's claim
//! before a write goes through it, so that two processes with the same store open cannot
//! both claim (and send) one action.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

/// The value type of the port: a shared, immutable buffer ([`bytes::Bytes`]); cloning
/// one shares it.
pub use bytes::Bytes;

/// A storage backend failed; nothing can be assumed about the write that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("wiki gatekeeper storage failed: {0}")]
pub struct KvError(pub String);

/// A durable map from string keys to bytes.
///
/// Each call must be atomic: a reader never sees half of a `put`.
/// [`KvStore::scan_prefix`] returns keys in ascending byte order. A backend that keeps
/// values in memory should keep the [`Bytes`] it is given, not a copy, and return clones
/// of it: the driver keeps the same buffers in its index.
pub trait KvStore: Send + Sync {
    /// The value under `key`, if any.
    fn get(&self, key: &str) -> Result<Option<Bytes>, KvError>;
    /// Store `value` under `key`, replacing what was there.
    fn put(&self, key: &str, value: Bytes) -> Result<(), KvError>;
    /// Remove `key`; returns whether it existed.
    fn delete(&self, key: &str) -> Result<bool, KvError>;
    /// Every entry whose key starts with `prefix`, in ascending key order.
    fn scan_prefix(&self, prefix: &str) -> Result<Vec<(String, Bytes)>, KvError>;
    /// Store `value` under `key` only if `key` holds exactly `expected` now (`None`: the
    /// key is absent); returns whether it stored. Atomic with respect to every other
    /// writer of the same store, including other handles and processes: of two callers
    /// expecting the same value, at most one succeeds. Durable before it returns `true`.
    fn compare_and_set(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        value: Bytes,
    ) -> Result<bool, KvError>;
}

/// The in-memory backend: a sorted map behind a mutex, gone when the process ends. It
/// keeps the buffers it is given and returns clones of them, never copies.
#[derive(Debug, Default)]
pub struct MemoryKv {
    map: Mutex<BTreeMap<String, Bytes>>,
}

impl MemoryKv {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every key, in ascending order (for tests and lectures that show the layout).
    pub fn keys(&self) -> Vec<String> {
        self.map().keys().cloned().collect()
    }

    fn map(&self) -> MutexGuard<'_, BTreeMap<String, Bytes>> {
        // Every critical section is one map operation, so a poisoned lock is consistent.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl KvStore for MemoryKv {
    fn get(&self, key: &str) -> Result<Option<Bytes>, KvError> {
        Ok(self.map().get(key).cloned())
    }

    fn put(&self, key: &str, value: Bytes) -> Result<(), KvError> {
        self.map().insert(key.to_owned(), value);
        Ok(())
    }

    fn delete(&self, key: &str) -> Result<bool, KvError> {
        Ok(self.map().remove(key).is_some())
    }

    fn scan_prefix(&self, prefix: &str) -> Result<Vec<(String, Bytes)>, KvError> {
        Ok(self
            .map()
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn compare_and_set(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        value: Bytes,
    ) -> Result<bool, KvError> {
        let mut map = self.map();
        if map.get(key).map(|v| v.as_ref()) != expected {
            return Ok(false);
        }
        map.insert(key.to_owned(), value);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(bytes: &[u8]) -> Bytes {
        Bytes::copy_from_slice(bytes)
    }

    #[test]
    fn scan_returns_only_the_prefix_in_key_order() {
        let kv = MemoryKv::new();
        kv.put("action:02", b(&[2])).unwrap();
        kv.put("action:01", b(&[1])).unwrap();
        kv.put("prov:~1", b(&[9])).unwrap();
        let scanned = kv.scan_prefix("action:").unwrap();
        assert_eq!(
            scanned,
            vec![("action:01".into(), b(&[1])), ("action:02".into(), b(&[2]))]
        );
        assert!(kv.delete("action:01").unwrap());
        assert!(!kv.delete("action:01").unwrap());
        assert_eq!(kv.get("prov:~1").unwrap(), Some(b(&[9])));
    }

    #[test]
    fn compare_and_set_stores_only_over_the_expected_value() {
        let kv = MemoryKv::new();
        assert!(kv.compare_and_set("k", None, b(&[1])).unwrap());
        assert!(!kv.compare_and_set("k", None, b(&[2])).unwrap());
        assert!(!kv.compare_and_set("k", Some(&[9]), b(&[2])).unwrap());
        assert_eq!(kv.get("k").unwrap(), Some(b(&[1])));
        assert!(kv.compare_and_set("k", Some(&[1]), b(&[2])).unwrap());
        assert_eq!(kv.get("k").unwrap(), Some(b(&[2])));
    }

    #[test]
    fn values_are_kept_and_handed_out_shared_not_copied() {
        let kv = MemoryKv::new();
        let put = Bytes::from(vec![7; 64]);
        kv.put("a", put.clone()).unwrap();
        let swapped = Bytes::from(vec![8; 64]);
        assert!(kv.compare_and_set("b", None, swapped.clone()).unwrap());
        assert_eq!(kv.get("a").unwrap().unwrap().as_ptr(), put.as_ptr());
        let scanned = kv.scan_prefix("").unwrap();
        assert_eq!(scanned[0].1.as_ptr(), put.as_ptr());
        assert_eq!(scanned[1].1.as_ptr(), swapped.as_ptr());
    }
}

//! The drivers' key-value port ([`KvStore`], gatekeeper-core's) on SQLite: the `kv` table, one namespace (`scope`)
//! per driver instance.
//!
//! Values are opaque bytes; the driver writes postcard inside its own versioned envelope,
//! so this table never needs to understand them. A value read is handed over as the
//! buffer it was read into ([`Bytes`] over it, not a copy); the driver's index keeps that
//! buffer and no decoded copy beside it. Keys are compared bytewise (SQLite's `BINARY`
//! collation on UTF-8), which is the order [`KvStore::scan_prefix`] promises.
//!
//! Every `put`, `delete` and `compare_and_set` is committed (fsync'd) before it returns.
//! The driver's claim before a wiki write is a `compare_and_set`: one conditional
//! statement, so of two handles (or processes) claiming one action, at most one wins.

use gatekeeper_core::kv::{Bytes, KvError, KvStore};
use rusqlite::{OptionalExtension, params};

use crate::db::{Database, Durability, Steps};
use crate::error::StoreError;

/// One driver's key-value records in a [`Database`].
#[derive(Debug, Clone)]
pub struct SqliteKv {
    db: Database,
    scope: String,
}

impl SqliteKv {
    pub(crate) fn new(db: Database, scope: &str) -> Self {
        Self {
            db,
            scope: scope.to_owned(),
        }
    }
}

fn port(error: StoreError) -> KvError {
    KvError(error.to_string())
}

/// The smallest string greater than every string starting with `prefix`, if any: the
/// prefix with its last character replaced by the next one (dropping trailing chars
/// that have no successor). UTF-8 byte order is code point order, so the range
/// `[prefix, successor)` is exactly the keys starting with `prefix`.
fn successor(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = (last as u32 + 1..=char::MAX as u32).find_map(char::from_u32);
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

impl KvStore for SqliteKv {
    fn get(&self, key: &str) -> Result<Option<Bytes>, KvError> {
        self.db
            .shared()
            .read(|db| {
                Ok(db
                    .prepare_cached("SELECT value FROM kv WHERE scope = ?1 AND key = ?2")?
                    .query_row([&self.scope, key], |r| r.get::<_, Vec<u8>>(0))
                    .optional()?
                    .map(Bytes::from))
            })
            .map_err(port)
    }

    fn put(&self, key: &str, value: Bytes) -> Result<(), KvError> {
        self.db
            .shared()
            .write(Durability::Now, Steps::One, |conn| {
                conn.db
                    .prepare_cached(
                        "INSERT INTO kv (scope, key, value) VALUES (?1, ?2, ?3)
                         ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value",
                    )?
                    .execute(params![self.scope, key, &value[..]])?;
                Ok(())
            })
            .map_err(port)
    }

    fn delete(&self, key: &str) -> Result<bool, KvError> {
        self.db
            .shared()
            .write(Durability::Now, Steps::One, |conn| {
                let deleted = conn
                    .db
                    .prepare_cached("DELETE FROM kv WHERE scope = ?1 AND key = ?2")?
                    .execute([&self.scope, key])?;
                Ok(deleted > 0)
            })
            .map_err(port)
    }

    fn compare_and_set(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        value: Bytes,
    ) -> Result<bool, KvError> {
        let value: &[u8] = &value;
        self.db
            .shared()
            .write(Durability::Now, Steps::One, |conn| {
                // One statement each way, so the check and the write cannot be split by
                // another handle's commit.
                let changed = match expected {
                    Some(expected) => conn
                        .db
                        .prepare_cached(
                            "UPDATE kv SET value = ?4 WHERE scope = ?1 AND key = ?2 AND value = ?3",
                        )?
                        .execute(params![self.scope, key, expected, value])?,
                    None => conn
                        .db
                        .prepare_cached(
                            "INSERT INTO kv (scope, key, value) VALUES (?1, ?2, ?3)
                             ON CONFLICT (scope, key) DO NOTHING",
                        )?
                        .execute(params![self.scope, key, value])?,
                };
                Ok(changed == 1)
            })
            .map_err(port)
    }

    fn scan_prefix(&self, prefix: &str) -> Result<Vec<(String, Bytes)>, KvError> {
        self.db
            .shared()
            .read(|db| {
                let mut entries = Vec::new();
                let mut push = |row: &rusqlite::Row<'_>| -> rusqlite::Result<()> {
                    let key: String = row.get(0)?;
                    if key.starts_with(prefix) {
                        entries.push((key, Bytes::from(row.get::<_, Vec<u8>>(1)?)));
                    }
                    Ok(())
                };
                match successor(prefix) {
                    Some(end) => {
                        let mut statement = db.prepare_cached(
                            "SELECT key, value FROM kv
                             WHERE scope = ?1 AND key >= ?2 AND key < ?3 ORDER BY key",
                        )?;
                        let mut rows = statement.query(params![self.scope, prefix, end])?;
                        while let Some(row) = rows.next()? {
                            push(row)?;
                        }
                    }
                    None => {
                        let mut statement = db.prepare_cached(
                            "SELECT key, value FROM kv WHERE scope = ?1 AND key >= ?2 ORDER BY key",
                        )?;
                        let mut rows = statement.query(params![self.scope, prefix])?;
                        while let Some(row) = rows.next()? {
                            push(row)?;
                        }
                    }
                }
                Ok(entries)
            })
            .map_err(port)
    }
}

#[cfg(test)]
mod tests {
    use super::successor;

    #[test]
    fn the_successor_bounds_exactly_the_keys_with_the_prefix() {
        assert_eq!(successor("action:").as_deref(), Some("action;"));
        assert_eq!(successor("").as_deref(), None);
        assert_eq!(successor("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(successor("\u{D7FF}").as_deref(), Some("\u{E000}"));
        assert_eq!(successor("\u{10FFFF}"), None);
    }
}

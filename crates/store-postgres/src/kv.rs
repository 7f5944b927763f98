//! The drivers' key-value port ([`KvStore`], gatekeeper-core's) on PostgreSQL: the `kv` table, one namespace
//! (`scope`) per driver instance.
//!
//! Values are opaque bytes, handed over as the buffer the client read them into ([`Bytes`]
//! over it, not a copy). Keys are compared bytewise (the column's `"C"` collation on
//! UTF-8), which is the order [`KvStore::scan_prefix`] promises. Every write is committed
//! before it returns. `compare_and_set` is one conditional statement (`UPDATE … WHERE
//! value = $expected`, or `INSERT … ON CONFLICT DO NOTHING`), so of two daemons claiming
//! one wiki action at most one wins. A write here first commits what is parked for any
//! action (who decided it, see `ledger.rs`): a driver that claims its actions here sends
//! only after its claim, so who decided is committed before anything is sent.

use gatekeeper_core::kv::{Bytes, KvError, KvStore};

use crate::db::Database;
use crate::error::StoreError;
use crate::ledger::sql;

/// One driver's key-value records in a [`Database`].
#[derive(Debug, Clone)]
pub struct PostgresKv {
    db: Database,
    scope: String,
}

impl PostgresKv {
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

const GET: &str = "SELECT value FROM kv WHERE scope = $1 AND key = $2";
const PUT: &str = "INSERT INTO kv (scope, key, value) VALUES ($1, $2, $3)
     ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value";
const DELETE: &str = "DELETE FROM kv WHERE scope = $1 AND key = $2";
const SCAN: &str =
    "SELECT key, value FROM kv WHERE scope = $1 AND starts_with(key, $2) ORDER BY key";
const INSERT_NEW: &str = "INSERT INTO kv (scope, key, value) VALUES ($1, $2, $3)
     ON CONFLICT (scope, key) DO NOTHING";
const REPLACE: &str = "UPDATE kv SET value = $4 WHERE scope = $1 AND key = $2 AND value = $3";

impl PostgresKv {
    /// Commit every parked transaction (see the module docs).
    fn commit_parked(&self) -> Result<(), KvError> {
        self.db.commit_parked(|_, _| true).map_err(port)
    }
}

impl KvStore for PostgresKv {
    fn get(&self, key: &str) -> Result<Option<Bytes>, KvError> {
        let (scope, key) = (self.scope.clone(), key.to_owned());
        self.db
            .call(move |link| {
                Ok(link
                    .query_opt(GET, &[&scope, &key])
                    .map_err(sql)?
                    .map(|row| Bytes::from(row.get::<_, Vec<u8>>(0))))
            })
            .map_err(port)
    }

    fn put(&self, key: &str, value: Bytes) -> Result<(), KvError> {
        self.commit_parked()?;
        let (scope, key) = (self.scope.clone(), key.to_owned());
        self.db
            .call(move |link| {
                link.execute(PUT, &[&scope, &key, &value.as_ref()])
                    .map_err(sql)?;
                Ok(())
            })
            .map_err(port)
    }

    fn delete(&self, key: &str) -> Result<bool, KvError> {
        self.commit_parked()?;
        let (scope, key) = (self.scope.clone(), key.to_owned());
        self.db
            .call(move |link| Ok(link.execute(DELETE, &[&scope, &key]).map_err(sql)? == 1))
            .map_err(port)
    }

    fn scan_prefix(&self, prefix: &str) -> Result<Vec<(String, Bytes)>, KvError> {
        let (scope, prefix) = (self.scope.clone(), prefix.to_owned());
        self.db
            .call(move |link| {
                Ok(link
                    .query(SCAN, &[&scope, &prefix])
                    .map_err(sql)?
                    .into_iter()
                    .map(|row| (row.get(0), Bytes::from(row.get::<_, Vec<u8>>(1))))
                    .collect())
            })
            .map_err(port)
    }

    fn compare_and_set(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        value: Bytes,
    ) -> Result<bool, KvError> {
        self.commit_parked()?;
        let (scope, key) = (self.scope.clone(), key.to_owned());
        let expected = expected.map(<[u8]>::to_vec);
        self.db
            .call(move |link| {
                let value: &[u8] = &value;
                let changed = match &expected {
                    None => link
                        .execute(INSERT_NEW, &[&scope, &key, &value])
                        .map_err(sql)?,
                    Some(expected) => link
                        .execute(REPLACE, &[&scope, &key, expected, &value])
                        .map_err(sql)?,
                };
                Ok(changed == 1)
            })
            .map_err(port)
    }
}

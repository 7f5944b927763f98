//! The connections to PostgreSQL: a few worker threads that run statements on a pool of
//! connections, transactions parked between two port calls about one action, the
//! session connection that marks this daemon alive and listens for other daemons'
//! changes, what is remembered from it (see `cache.rs`), the schema check on open, and
//! the counts of commits and round trips.
//!
//! The storage ports are synchronous (the kernel's ledger, the wiki's key-value port)
//! or asynchronous (the action store), and they are called from tasks of the daemon's
//! tokio runtime. A connection here is a `tokio-postgres` client driven by a small
//! runtime of its own, which must never run inside another runtime, so every statement
//! runs on this store's own threads: a call hands a job to a worker and waits for its
//! answer (blocking for a synchronous port, as rusqlite would; awaiting for the
//! asynchronous one). A broken connection is dropped and a new one made for the next
//! job.
//!
//! # One round trip where two were
//!
//! `tokio-postgres` sends a request as soon as it is polled, so two requests polled
//! together travel in one round trip (pipelining): `BEGIN` with the first statement of
//! a transaction ([`Link::begin_with`]), the last statement with `COMMIT`
//! ([`Link::commit_with`]). A statement that fails aborts the transaction, and the
//! `COMMIT` sent behind it then rolls back.
//!
//! # Parked transactions
//!
//! Some writes about one action need not be committed on their own, because the next
//! port call about the same action writes again and may carry them (store-sqlite's
//! deferred writes): who decided rides with the driver's claim, the driver's outcome with
//! the kernel's. Such a write opens a transaction and leaves it open: its connection is
//! *parked* under the action's key (gatekeeper, driver id) instead of going back to the
//! pool. The next call about that key runs on the parked connection, inside that
//! transaction, and commits it. A parked transaction that waits longer than
//! [`PARK_WINDOW`] is committed on its own by the flusher thread, so it never holds its
//! row locks for long; a daemon that dies with one parked loses only what it holds (see
//! the crate docs for why each may be lost).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use postgres::fallible_iterator::FallibleIterator;
use postgres::types::ToSql;
use postgres::{Client, NoTls, Row, Statement};

use crate::actions::DeferredSettle;
use crate::cache::Caches;
use crate::error::StoreError;
use crate::schema::{
    CREATE, EXPECTED_TABLES, LEDGER_LOCKS, MIGRATION_LOCK, ROW_RULES_5, SCHEMA_VERSION,
    SESSION_LOCKS, STAGE_FUNCTION_6, UPGRADES,
};

/// How many worker threads a [`Database`] runs statements on.
pub const WORKERS: usize = 4;

/// How often the session thread looks for claims of dead daemons to settle.
pub const RECOVERY_INTERVAL: Duration = Duration::from_millis(500);

/// How long a parked transaction waits for the port call that would carry it before the
/// flusher commits it on its own.
pub const PARK_WINDOW: Duration = Duration::from_millis(20);

/// How many threads run the jobs on parked transactions (see `Inner::park_jobs`).
const PARK_WORKERS: usize = 2;

/// How many idle connections the pool keeps.
const IDLE_CONNECTIONS: usize = 12;

/// Counts of what this handle asked of the server.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) commits: AtomicU64,
    pub(crate) round_trips: AtomicU64,
    /// Round trips that prepared a statement (once per statement and connection).
    pub(crate) prepares: AtomicU64,
}

/// One connection: a `tokio-postgres` client, the runtime that drives it, and its
/// prepared statements.
pub(crate) struct Conn {
    rt: Option<tokio::runtime::Runtime>,
    client: tokio_postgres::Client,
    statements: HashMap<&'static str, Statement>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Allowed anywhere, also inside another runtime; the server ends the session
        // (and rolls back an open transaction) when the socket closes.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// Connect, and name this daemon's `session` (if known yet) to the server, which puts it
/// in the notifications of what this connection writes (`gate.session`, schema version
/// 4).
fn connect_conn(url: &str, shown: &str, session: i32) -> Result<Conn, StoreError> {
    let unreachable = |detail: String| StoreError::Unreachable {
        url: shown.to_owned(),
        detail,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| unreachable(format!("cannot start a connection's runtime: {e}")))?;
    let (client, connection) = rt
        .block_on(tokio_postgres::connect(url, NoTls))
        .map_err(|e| unreachable(e.to_string()))?;
    rt.spawn(async move {
        let _ = connection.await;
    });
    if session > 0 {
        rt.block_on(client.batch_execute(&format!("SET gate.session = '{session}'")))
            .map_err(|e| unreachable(e.to_string()))?;
    }
    Ok(Conn {
        rt: Some(rt),
        client,
        statements: HashMap::new(),
    })
}

/// The key of an action's parked transaction: its gatekeeper and driver id.
pub(crate) type Key = (Arc<str>, i64);

/// A transaction left open on its connection until the next port call about its action.
pub(crate) struct Parked {
    conn: Conn,
    since: Instant,
    /// The action store's row of the action, read inside the transaction when it was
    /// parked, for the read that comes next (gatekeeper-core reads before it claims).
    pub(crate) action_row: Option<Row>,
    /// The ledger entry the transaction wrote, if any: a read of it on this daemon runs
    /// inside the transaction, so it sees the write.
    ledger_id: Option<i64>,
    /// A stage: the task that staged (whose ledger insert comes next), and its hold on
    /// this handle's stages of the gatekeeper.
    stage: Option<StageHold>,
}

impl Parked {
    /// Whether the transaction wrote a ledger entry (a stage alone writes none: its
    /// entry is inserted and committed in one round trip).
    pub(crate) fn wrote_ledger(&self) -> bool {
        self.ledger_id.is_some()
    }
}

/// Who staged: the task, or outside a task the thread (a `block_on` future stays on its
/// thread), whose next ledger insert is the stage's submission.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Stager {
    /// A tokio task.
    Task(tokio::task::Id),
    /// A thread, outside any task.
    Thread(std::thread::ThreadId),
}

impl Stager {
    /// The caller.
    pub(crate) fn current() -> Self {
        match tokio::task::try_id() {
            Some(task) => Self::Task(task),
            None => Self::Thread(std::thread::current().id()),
        }
    }
}

/// What a parked stage holds: see [`Link::park_stage`].
pub(crate) struct StageHold {
    stager: Stager,
    _turn: tokio::sync::OwnedMutexGuard<()>,
}

/// Where a connection is parked when its work leaves the transaction open.
struct ParkAs {
    key: Key,
    action_row: Option<Row>,
    ledger_id: Option<i64>,
    stage: Option<StageHold>,
}

/// One worker's use of a connection.
pub(crate) struct Link<'a> {
    conn: &'a mut Conn,
    stats: &'a Stats,
    in_tx: bool,
    /// Park the connection here if the work leaves its transaction open.
    park: Option<ParkAs>,
}

fn sql_error(error: &postgres::Error) -> StoreError {
    match error.as_db_error() {
        Some(db) => StoreError::Sql {
            detail: db.message().to_owned(),
        },
        None => StoreError::Sql {
            detail: error.to_string(),
        },
    }
}

impl Link<'_> {
    fn rt(&self) -> &tokio::runtime::Runtime {
        self.conn
            .rt
            .as_ref()
            .expect("a live connection has its runtime")
    }

    fn statement(&mut self, sql: &'static str) -> Result<Statement, postgres::Error> {
        if let Some(statement) = self.conn.statements.get(sql) {
            return Ok(statement.clone());
        }
        self.stats.round_trips.fetch_add(1, Ordering::Relaxed);
        self.stats.prepares.fetch_add(1, Ordering::Relaxed);
        let rt = self
            .conn
            .rt
            .as_ref()
            .expect("a live connection has its runtime");
        let statement = rt.block_on(self.conn.client.prepare(sql))?;
        self.conn.statements.insert(sql, statement.clone());
        Ok(statement)
    }

    fn counted(&self, writes: bool) {
        self.stats.round_trips.fetch_add(1, Ordering::Relaxed);
        if writes && !self.in_tx {
            self.stats.commits.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Rows of a read (one round trip once prepared).
    pub(crate) fn query(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, postgres::Error> {
        let statement = self.statement(sql)?;
        self.counted(false);
        self.rt()
            .block_on(self.conn.client.query(&statement, params))
    }

    /// At most one row of a read.
    pub(crate) fn query_opt(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, postgres::Error> {
        let statement = self.statement(sql)?;
        self.counted(false);
        self.rt()
            .block_on(self.conn.client.query_opt(&statement, params))
    }

    /// Exactly one row of a read.
    pub(crate) fn query_one(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, postgres::Error> {
        let statement = self.statement(sql)?;
        self.counted(false);
        self.rt()
            .block_on(self.conn.client.query_one(&statement, params))
    }

    /// Rows a write returns (`… RETURNING`); committed at once outside a transaction.
    pub(crate) fn write_returning(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, postgres::Error> {
        let statement = self.statement(sql)?;
        self.counted(true);
        self.rt()
            .block_on(self.conn.client.query(&statement, params))
    }

    /// A write; committed at once outside a transaction. Returns the rows changed.
    pub(crate) fn execute(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, postgres::Error> {
        let statement = self.statement(sql)?;
        self.counted(true);
        self.rt()
            .block_on(self.conn.client.execute(&statement, params))
    }

    /// Rows of SQL sent as a simple query (several statements allowed), each column as
    /// text; one round trip.
    pub(crate) fn simple(
        &mut self,
        sql: &str,
    ) -> Result<Vec<tokio_postgres::SimpleQueryMessage>, postgres::Error> {
        self.stats.round_trips.fetch_add(1, Ordering::Relaxed);
        self.rt().block_on(self.conn.client.simple_query(sql))
    }

    /// `BEGIN` and a statement in one round trip (pipelined); returns its rows and leaves
    /// the transaction open (a connection already inside one stays in it). On an error
    /// the transaction is rolled back.
    pub(crate) fn begin_with(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        self.begin_with_also(sql, params, None)
            .map(|(rows, _)| rows)
    }

    /// [`Link::begin_with`], and behind its statement, in the same round trip, `also`
    /// (a statement and its parameters) under a savepoint of its own. A failure of `also`
    /// alone is undone alone (one more round trip, `ROLLBACK TO SAVEPOINT`) and returned
    /// beside the rows, the transaction carrying on; without `also`, `Ok(0)` is.
    pub(crate) fn begin_with_also(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
        also: Option<(&'static str, &[&(dyn ToSql + Sync)])>,
    ) -> Result<(Vec<Row>, Result<u64, StoreError>), StoreError> {
        let statement = self.statement(sql).map_err(|e| sql_error(&e))?;
        let also = match also {
            Some((also, also_params)) => Some((
                self.statement(also).map_err(|e| sql_error(&e))?,
                also_params,
            )),
            None => None,
        };
        self.stats.round_trips.fetch_add(1, Ordering::Relaxed);
        let begin = !self.in_tx;
        let client = &self.conn.client;
        let (begun, rows, done) = self.rt().block_on(async {
            tokio::join!(
                async {
                    if begin {
                        client.batch_execute("BEGIN").await
                    } else {
                        Ok(())
                    }
                },
                client.query(&statement, params),
                async {
                    let Some((also, also_params)) = &also else {
                        return Ok(0);
                    };
                    let (saved, done, released) = tokio::join!(
                        client.batch_execute("SAVEPOINT also"),
                        client.execute(also, also_params),
                        client.batch_execute("RELEASE SAVEPOINT also"),
                    );
                    saved.and(done).and_then(|n| released.map(|()| n))
                },
            )
        });
        self.in_tx = true;
        let rows = match begun.and(rows) {
            Ok(rows) => rows,
            Err(error) => {
                self.rollback();
                return Err(sql_error(&error));
            }
        };
        let done = match done {
            Ok(n) => Ok(n),
            Err(error) => {
                self.stats.round_trips.fetch_add(1, Ordering::Relaxed);
                let undone = self.rt().block_on(
                    self.conn
                        .client
                        .batch_execute("ROLLBACK TO SAVEPOINT also; RELEASE SAVEPOINT also"),
                );
                if let Err(undo) = undone {
                    self.rollback();
                    return Err(sql_error(&undo));
                }
                Err(sql_error(&error))
            }
        };
        Ok((rows, done))
    }

    /// A statement and `COMMIT` in one round trip (pipelined), ending the open
    /// transaction; outside one, the statement alone, committed as it runs. Returns the
    /// statement's rows. If the statement fails, the `COMMIT` behind it rolls back.
    pub(crate) fn commit_with(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        let statement = self.statement(sql).map_err(|e| sql_error(&e))?;
        self.stats.round_trips.fetch_add(1, Ordering::Relaxed);
        let client = &self.conn.client;
        let (rows, committed) = if self.in_tx {
            self.rt().block_on(async {
                tokio::join!(
                    client.query(&statement, params),
                    client.batch_execute("COMMIT")
                )
            })
        } else {
            (self.rt().block_on(client.query(&statement, params)), Ok(()))
        };
        self.in_tx = false;
        self.park = None;
        let rows = rows.map_err(|e| sql_error(&e))?;
        committed.map_err(|e| sql_error(&e))?;
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        Ok(rows)
    }

    /// Commit the open transaction (one round trip).
    pub(crate) fn commit(&mut self) -> Result<(), StoreError> {
        if !self.in_tx {
            return Ok(());
        }
        self.stats.round_trips.fetch_add(1, Ordering::Relaxed);
        self.in_tx = false;
        self.park = None;
        self.rt()
            .block_on(self.conn.client.batch_execute("COMMIT"))
            .map_err(|e| sql_error(&e))?;
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Roll the open transaction back, if any (errors are ignored: a broken connection
    /// rolls back by itself).
    pub(crate) fn rollback(&mut self) {
        if self.in_tx {
            self.in_tx = false;
            self.park = None;
            self.stats.round_trips.fetch_add(1, Ordering::Relaxed);
            let _ = self
                .rt()
                .block_on(self.conn.client.batch_execute("ROLLBACK"));
        }
    }

    /// Park this connection under `key` when the work returns with its transaction open,
    /// keeping `action_row` for the next read of the action and naming the ledger entry
    /// it wrote, if any.
    pub(crate) fn park_as(&mut self, key: Key, action_row: Option<Row>, ledger_id: Option<i64>) {
        let earlier = self.park.take();
        let ledger_id = ledger_id.or_else(|| earlier.as_ref().and_then(|p| p.ledger_id));
        self.park = Some(ParkAs {
            key,
            action_row,
            ledger_id,
            stage: earlier.and_then(|p| p.stage),
        });
    }

    /// Park this connection's open stage under `key` for the ledger insert that
    /// `stager` makes next, holding `turn` (this handle's next stage of the gatekeeper
    /// waits for it: the stage holds the id row's lock).
    pub(crate) fn park_stage(
        &mut self,
        key: Key,
        stager: Stager,
        turn: tokio::sync::OwnedMutexGuard<()>,
    ) {
        self.park = Some(ParkAs {
            key,
            action_row: None,
            ledger_id: None,
            stage: Some(StageHold {
                stager,
                _turn: turn,
            }),
        });
    }

    fn finish<R>(&mut self, result: Result<R, StoreError>) -> Result<R, StoreError> {
        match result {
            Ok(value) => {
                self.commit()?;
                Ok(value)
            }
            Err(error) => {
                self.rollback();
                Err(error)
            }
        }
    }

    /// Run `work` in one transaction, committed if it returns `Ok`, rolled back otherwise.
    pub(crate) fn transaction<R>(
        &mut self,
        work: impl FnOnce(&mut Link<'_>) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        if !self.in_tx {
            self.stats.round_trips.fetch_add(1, Ordering::Relaxed);
            self.rt()
                .block_on(self.conn.client.batch_execute("BEGIN"))
                .map_err(|e| sql_error(&e))?;
            self.in_tx = true;
        }
        let result = work(self);
        self.finish(result)
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// Commit a parked transaction (a function pointer, so that [`Shared::exec`] can call
/// itself with it).
const COMMIT_LINK: fn(&mut Link<'_>) -> Result<(), StoreError> = |link| link.commit();

/// What the worker threads, the flusher and the session thread share.
pub(crate) struct Shared {
    url: Arc<str>,
    shown: Arc<str>,
    stats: Arc<Stats>,
    /// This daemon's session, once it has one (0 before).
    session: AtomicI32,
    idle: Mutex<Vec<Conn>>,
    parks: Mutex<HashMap<Key, Parked>>,
    /// Claims this handle holds (committed, not yet settled).
    claims: Mutex<HashSet<Key>>,
    /// Drivers' outcomes of this handle's claims, not yet written (see `actions.rs`).
    settles: Mutex<HashMap<Key, DeferredSettle>>,
    /// Per gatekeeper, the turn of this handle's stages (see [`Link::park_stage`]).
    stage_turns: Mutex<HashMap<Arc<str>, Arc<tokio::sync::Mutex<()>>>>,
    pub(crate) caches: Caches,
}

impl Shared {
    /// Run `work` on `given` (a parked transaction, which `work` continues) or on a
    /// connection from the pool (made if none is idle). A transaction `work` leaves open
    /// is parked under the key it named ([`Link::park_as`]), or rolled back if it named
    /// none or failed.
    fn exec<R>(
        &self,
        given: Option<Parked>,
        key: Option<Key>,
        work: impl FnOnce(&mut Link<'_>) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let parked = given.is_some();
        let mut park = None;
        let conn = match given {
            Some(given) => {
                park = key.map(|key| ParkAs {
                    key,
                    action_row: given.action_row,
                    ledger_id: given.ledger_id,
                    stage: given.stage,
                });
                Some(given.conn)
            }
            None => self.idle.lock().ok().and_then(|mut idle| idle.pop()),
        };
        let mut conn = match conn {
            Some(conn) if !conn.client.is_closed() => conn,
            Some(_) if parked => {
                return Err(StoreError::Unreachable {
                    url: self.shown.to_string(),
                    detail: "the connection was lost with an open transaction".into(),
                });
            }
            _ => connect_conn(&self.url, &self.shown, self.session.load(Ordering::SeqCst))?,
        };
        let mut link = Link {
            conn: &mut conn,
            stats: &self.stats,
            in_tx: parked,
            park,
        };
        let result = work(&mut link);
        if link.in_tx && (result.is_err() || link.park.is_none()) {
            link.rollback();
        }
        let (in_tx, park) = (link.in_tx, link.park.take());
        if conn.client.is_closed() {
            drop(conn);
            return result.map_err(|error| {
                let detail = match error {
                    StoreError::Sql { detail } => detail,
                    other => other.to_string(),
                };
                StoreError::Unreachable {
                    url: self.shown.to_string(),
                    detail: format!("the connection was lost: {detail}"),
                }
            });
        }
        match (in_tx, park) {
            (
                true,
                Some(ParkAs {
                    key,
                    action_row,
                    ledger_id,
                    stage,
                }),
            ) => {
                let parked = Parked {
                    conn,
                    since: Instant::now(),
                    action_row,
                    ledger_id,
                    stage,
                };
                let earlier = self
                    .parks
                    .lock()
                    .ok()
                    .and_then(|mut parks| parks.insert(key, parked));
                // Two transactions of one action are never parked at once (a call about
                // an action runs in its parked one); should it happen, the earlier is
                // committed, not lost.
                if let Some(earlier) = earlier {
                    let _ = self.exec(Some(earlier), None, COMMIT_LINK);
                }
            }
            _ => {
                if let Ok(mut idle) = self.idle.lock()
                    && idle.len() < IDLE_CONNECTIONS
                {
                    idle.push(conn);
                }
            }
        }
        result
    }

    /// Take the transaction parked under `key`, if any.
    pub(crate) fn take_park(&self, key: &Key) -> Option<Parked> {
        self.parks.lock().ok()?.remove(key)
    }

    /// This handle committed a claim of `key`.
    pub(crate) fn claimed(&self, key: Key) {
        if let Ok(mut claims) = self.claims.lock() {
            claims.insert(key);
        }
    }

    /// Whether this handle holds the claim of `key` (and forget it: it is being settled).
    pub(crate) fn settling(&self, key: &Key) -> bool {
        self.claims
            .lock()
            .is_ok_and(|mut claims| claims.remove(key))
    }

    /// Keep a driver's outcome to write with the kernel's.
    pub(crate) fn defer_settle(&self, key: Key, settle: DeferredSettle) {
        if let Ok(mut settles) = self.settles.lock() {
            settles.insert(key, settle);
        }
    }

    /// The driver's outcome kept for `key`, taken.
    pub(crate) fn take_settle(&self, key: &Key) -> Option<DeferredSettle> {
        self.settles.lock().ok()?.remove(key)
    }

    /// The record the driver's outcome kept for `key` writes, if any.
    pub(crate) fn deferred_record(&self, key: &Key) -> Option<gatekeeper_core::ActionRecord> {
        Some(self.settles.lock().ok()?.get(key)?.record.clone())
    }

    /// Take every kept outcome that `pick` selects.
    fn take_settles(&self, pick: impl Fn(&Key, &DeferredSettle) -> bool) -> Vec<DeferredSettle> {
        take_all(&self.settles, pick)
    }

    /// Write kept outcomes, each committed alone (on this thread, which must not run a
    /// runtime).
    fn write_settles(&self, settles: Vec<DeferredSettle>) {
        for settle in settles {
            let written = self.exec(None, None, move |link| settle.write(link));
            if let Err(error) = written {
                tracing::warn!(%error, "store.outcome.write.failed");
            }
        }
    }

    /// The turn of this handle's stages of `gatekeeper` (see [`Link::park_stage`]).
    pub(crate) fn stage_turn(&self, gatekeeper: &Arc<str>) -> Arc<tokio::sync::Mutex<()>> {
        let mut turns = self
            .stage_turns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        turns.entry(gatekeeper.clone()).or_default().clone()
    }

    /// A stage parked by `stager`, and its key.
    pub(crate) fn take_park_of_stager(&self, stager: Stager) -> Option<(Key, Parked)> {
        take_first(&self.parks, |parked| {
            parked.stage.as_ref().is_some_and(|s| s.stager == stager)
        })
    }

    /// Commit the transaction parked under `key`, if any, on this thread (a worker's).
    pub(crate) fn commit_park_now(&self, key: &Key) -> Result<(), StoreError> {
        match self.take_park(key) {
            Some(parked) => self.exec(Some(parked), None, COMMIT_LINK),
            None => Ok(()),
        }
    }

    /// The transaction parked with a write of ledger entry `id`, and its key.
    pub(crate) fn take_park_of_entry(&self, id: i64) -> Option<(Key, Parked)> {
        take_first(&self.parks, |parked| parked.ledger_id == Some(id))
    }

    /// The action store's row kept with the transaction parked under `key`, once.
    pub(crate) fn take_action_row(&self, key: &Key) -> Option<Row> {
        self.parks.lock().ok()?.get_mut(key)?.action_row.take()
    }

    /// Take every parked transaction that `pick` selects.
    fn take_parks(&self, pick: impl Fn(&Key, &Parked) -> bool) -> Vec<Parked> {
        take_all(&self.parks, pick)
    }

    /// Commit parked transactions (on this thread, which must not run a runtime).
    fn commit_parked(&self, parked: Vec<Parked>) {
        for parked in parked {
            if let Err(error) = self.exec(Some(parked), None, COMMIT_LINK) {
                tracing::warn!(%error, "store.parked.commit.failed");
            }
        }
    }
}

/// Remove and return every value of `map` that `pick` selects.
fn take_all<V>(map: &Mutex<HashMap<Key, V>>, pick: impl Fn(&Key, &V) -> bool) -> Vec<V> {
    let mut map = map
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let keys: Vec<Key> = map
        .iter()
        .filter(|(key, value)| pick(key, value))
        .map(|(key, _)| key.clone())
        .collect();
    keys.iter().filter_map(|key| map.remove(key)).collect()
}

/// Remove and return the first value of `map` that `pick` selects, with its key.
fn take_first<V>(map: &Mutex<HashMap<Key, V>>, pick: impl Fn(&V) -> bool) -> Option<(Key, V)> {
    let mut map = map
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let key = map
        .iter()
        .find(|(_, value)| pick(value))
        .map(|(key, _)| key.clone())?;
    map.remove(&key).map(|value| (key, value))
}

/// The URL with any password removed, for messages.
fn shown_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{user}@{}", &url[..scheme + 3], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

fn connect(url: &str, shown: &str) -> Result<Client, StoreError> {
    Client::connect(url, NoTls).map_err(|e| StoreError::Unreachable {
        url: shown.to_owned(),
        detail: e.to_string(),
    })
}

struct Inner {
    shared: Arc<Shared>,
    jobs: Mutex<Option<Sender<Job>>>,
    /// Jobs on parked transactions, on threads of their own: such a job must never wait
    /// behind jobs that may be waiting for the locks its transaction holds.
    park_jobs: Mutex<Option<Sender<Job>>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
    session: i32,
    stop: Arc<AtomicBool>,
    session_thread: Mutex<Option<JoinHandle<()>>>,
    flusher: Mutex<Option<JoinHandle<()>>>,
    changes: tokio::sync::watch::Receiver<u64>,
    leases: LeasePool,
}

/// Connections that held a drain lease and released it, kept for the next one (a
/// connection costs several round trips to make).
type LeasePool = Arc<Mutex<Vec<Kept>>>;

/// A kept client, closed on a thread of its own when dropped, wherever the drop happens
/// (closing it blocks on the client's own runtime).
struct Kept(Option<Client>);

impl Drop for Kept {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            let _ = std::thread::Builder::new()
                .name("gate-pg-close".into())
                .spawn(move || drop(client));
        }
    }
}

/// How many released lease connections are kept.
const KEPT_LEASE_CONNECTIONS: usize = 4;

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Ok(mut jobs) = self.jobs.lock() {
            jobs.take();
        }
        if let Ok(mut jobs) = self.park_jobs.lock() {
            jobs.take();
        }
        if let Ok(mut workers) = self.workers.lock() {
            for worker in workers.drain(..) {
                let _ = worker.join();
            }
        }
        if let Ok(mut session) = self.session_thread.lock()
            && let Some(thread) = session.take()
        {
            let _ = thread.join();
        }
        if let Ok(mut flusher) = self.flusher.lock()
            && let Some(thread) = flusher.take()
        {
            let _ = thread.join();
        }
        // What is still parked is committed, on a thread of its own (this drop may run
        // inside a runtime, where a connection's own runtime must not run).
        let shared = self.shared.clone();
        let _ = std::thread::Builder::new()
            .name("gate-pg-close".into())
            .spawn(move || {
                shared.commit_parked(shared.take_parks(|_, _| true));
                shared.write_settles(shared.take_settles(|_, _| true));
            })
            .map(JoinHandle::join);
    }
}

/// One daemon's handle on a PostgreSQL database: worker connections, its session (alive
/// while it is open) and the notifications of other daemons' changes. Clones share all
/// of it; the last clone dropped closes the connections, and so ends the session.
#[derive(Clone)]
pub struct Database {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database")
            .field("url", &self.inner.shared.shown)
            .field("session", &self.inner.session)
            .finish_non_exhaustive()
    }
}

impl Database {
    /// Connect to the database at `url` (`postgres://user[:password]@host[:port]/name`),
    /// create the schema in an empty database or upgrade an older one (refusing a newer
    /// one), start this daemon's session, and settle what dead daemons left behind.
    ///
    /// Blocks; call it from outside the async runtime or with `spawn_blocking`.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        let shown: Arc<str> = Arc::from(shown_url(url));
        let url: Arc<str> = Arc::from(url);
        // The client runs a runtime of its own: off this thread, which may be a task's.
        off_runtime(|| migrate(&url, &shown))?;
        let shared = Arc::new(Shared {
            url: url.clone(),
            shown: shown.clone(),
            stats: Arc::new(Stats::default()),
            session: AtomicI32::new(0),
            idle: Mutex::new(Vec::new()),
            parks: Mutex::new(HashMap::new()),
            claims: Mutex::new(HashSet::new()),
            settles: Mutex::new(HashMap::new()),
            stage_turns: Mutex::new(HashMap::new()),
            caches: Caches::default(),
        });

        let stop = Arc::new(AtomicBool::new(false));
        let (changes_tx, changes) = tokio::sync::watch::channel(0u64);
        let (ready_tx, ready_rx) = sync_channel::<Result<i32, StoreError>>(1);
        let session_thread = {
            let shared = shared.clone();
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("gate-pg-session".into())
                .spawn(move || session_loop(&shared, &stop, &changes_tx, ready_tx))
                .map_err(|e| StoreError::Sql {
                    detail: format!("cannot start the session thread: {e}"),
                })?
        };
        let session = match ready_rx.recv() {
            Ok(Ok(session)) => session,
            Ok(Err(error)) => {
                let _ = session_thread.join();
                return Err(error);
            }
            Err(_) => {
                let _ = session_thread.join();
                return Err(StoreError::Closed);
            }
        };
        let flusher = {
            let shared = shared.clone();
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("gate-pg-flush".into())
                .spawn(move || flush_loop(&shared, &stop))
                .map_err(|e| StoreError::Sql {
                    detail: format!("cannot start the flusher thread: {e}"),
                })?
        };

        let (jobs_tx, jobs_rx) = std::sync::mpsc::channel::<Job>();
        let (park_jobs_tx, park_jobs_rx) = std::sync::mpsc::channel::<Job>();
        let jobs_rx = Arc::new(Mutex::new(jobs_rx));
        let park_jobs_rx = Arc::new(Mutex::new(park_jobs_rx));
        let mut workers = Vec::with_capacity(WORKERS + PARK_WORKERS);
        for n in 0..WORKERS + PARK_WORKERS {
            let (jobs, name) = if n < WORKERS {
                (jobs_rx.clone(), format!("gate-pg-{n}"))
            } else {
                (
                    park_jobs_rx.clone(),
                    format!("gate-pg-park-{}", n - WORKERS),
                )
            };
            let handle = std::thread::Builder::new()
                .name(name)
                .spawn(move || worker_loop(&jobs))
                .map_err(|e| StoreError::Sql {
                    detail: format!("cannot start a worker thread: {e}"),
                })?;
            workers.push(handle);
        }
        let db = Database {
            inner: Arc::new(Inner {
                shared,
                jobs: Mutex::new(Some(jobs_tx)),
                park_jobs: Mutex::new(Some(park_jobs_tx)),
                workers: Mutex::new(workers),
                session,
                stop,
                session_thread: Mutex::new(Some(session_thread)),
                flusher: Mutex::new(Some(flusher)),
                changes,
                leases: LeasePool::default(),
            }),
        };
        db.recover()?;
        Ok(db)
    }

    /// The URL, without its password (for messages).
    pub fn shown_url(&self) -> &str {
        &self.inner.shared.shown
    }

    /// This daemon's session id: what `deciding_session` and `claimed_by` name.
    pub fn session(&self) -> i32 {
        self.inner.session
    }

    /// Transactions this handle committed (a write outside a transaction counts as one).
    pub fn commits(&self) -> u64 {
        self.inner.shared.stats.commits.load(Ordering::Relaxed)
    }

    /// Round trips this handle made to the server (statements, prepares, BEGIN, COMMIT,
    /// ROLLBACK).
    pub fn round_trips(&self) -> u64 {
        self.inner.shared.stats.round_trips.load(Ordering::Relaxed)
    }

    /// Of [`Database::round_trips`], those that prepared a statement: once per statement
    /// and connection, so none in a steady state.
    pub fn prepares(&self) -> u64 {
        self.inner.shared.stats.prepares.load(Ordering::Relaxed)
    }

    /// A counter that moves whenever another daemon (or this one) changed the ledger,
    /// an action store or the rules, and after the session connection was made again
    /// (notifications sent meanwhile are lost: re-read then).
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.changes.clone()
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    /// Run `work` on a worker connection and wait for its answer, blocking this thread.
    pub(crate) fn call<R: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Link<'_>) -> Result<R, StoreError> + Send + 'static,
    ) -> Result<R, StoreError> {
        self.call_parked(None, None, work)
    }

    /// [`Database::call`] on `parked`'s transaction if there is one (`key` is the key it
    /// was parked under, and it is parked again there if `work` leaves it open), or on a
    /// pooled connection.
    pub(crate) fn call_parked<R: Send + 'static>(
        &self,
        parked: Option<Parked>,
        key: Option<Key>,
        work: impl FnOnce(&mut Link<'_>) -> Result<R, StoreError> + Send + 'static,
    ) -> Result<R, StoreError> {
        self.call_later(parked, key, work)?
            .recv()
            .unwrap_or(Err(StoreError::Closed))
    }

    /// Hand `work` to a worker connection (or `parked`'s, as [`Database::call_parked`])
    /// and return where its answer will arrive, for work that talks with the caller while
    /// it runs.
    pub(crate) fn call_later<R: Send + 'static>(
        &self,
        parked: Option<Parked>,
        key: Option<Key>,
        work: impl FnOnce(&mut Link<'_>) -> Result<R, StoreError> + Send + 'static,
    ) -> Result<Receiver<Result<R, StoreError>>, StoreError> {
        let (tx, rx) = sync_channel(1);
        self.submit_exec(parked, key, work, move |answer| {
            let _ = tx.send(answer);
        })?;
        Ok(rx)
    }

    /// Submit `work` on `parked`'s transaction (to the threads that run parked work) or
    /// on a pooled connection, handing its answer to `answer`.
    fn submit_exec<R: Send + 'static>(
        &self,
        parked: Option<Parked>,
        key: Option<Key>,
        work: impl FnOnce(&mut Link<'_>) -> Result<R, StoreError> + Send + 'static,
        answer: impl FnOnce(Result<R, StoreError>) + Send + 'static,
    ) -> Result<(), StoreError> {
        let shared = self.inner.shared.clone();
        let queue = if parked.is_some() {
            &self.inner.park_jobs
        } else {
            &self.inner.jobs
        };
        self.submit_to(
            queue,
            Box::new(move || answer(shared.exec(parked, key, work))),
        )
    }

    /// Run `work` on a worker connection and await its answer.
    pub(crate) async fn call_async<R: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Link<'_>) -> Result<R, StoreError> + Send + 'static,
    ) -> Result<R, StoreError> {
        self.call_async_parked(None, None, work).await
    }

    /// [`Database::call_parked`], awaited.
    pub(crate) async fn call_async_parked<R: Send + 'static>(
        &self,
        parked: Option<Parked>,
        key: Option<Key>,
        work: impl FnOnce(&mut Link<'_>) -> Result<R, StoreError> + Send + 'static,
    ) -> Result<R, StoreError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit_exec(parked, key, work, move |answer| {
            let _ = tx.send(answer);
        })?;
        rx.await.unwrap_or(Err(StoreError::Closed))
    }

    /// Commit the parked transactions `pick` selects, and wait (blocking this thread).
    pub(crate) fn commit_parked(
        &self,
        pick: impl Fn(&Key, &Parked) -> bool,
    ) -> Result<(), StoreError> {
        let parked = self.inner.shared.take_parks(pick);
        if parked.is_empty() {
            return Ok(());
        }
        let shared = self.inner.shared.clone();
        self.run_and_wait(&self.inner.park_jobs, move || shared.commit_parked(parked))
    }

    /// Commit every transaction this handle parked (who decided an action, a driver's
    /// outcome; see the module docs), so that other handles see them now rather than
    /// with the next write about the action or within [`PARK_WINDOW`]. Blocks.
    pub fn commit_deferred(&self) -> Result<(), StoreError> {
        self.commit_parked(|_, _| true)?;
        self.write_settles(|_| true)
    }

    /// Write the kept drivers' outcomes of the gatekeepers `pick` selects, and wait
    /// (blocking this thread).
    pub(crate) fn write_settles(&self, pick: impl Fn(&str) -> bool) -> Result<(), StoreError> {
        let settles = self.inner.shared.take_settles(|key, _| pick(&key.0));
        if settles.is_empty() {
            return Ok(());
        }
        let shared = self.inner.shared.clone();
        self.run_and_wait(&self.inner.jobs, move || shared.write_settles(settles))
    }

    /// [`Database::write_settles`], awaited.
    pub(crate) async fn write_settles_async(
        &self,
        pick: impl Fn(&str) -> bool,
    ) -> Result<(), StoreError> {
        let settles = self.inner.shared.take_settles(|key, _| pick(&key.0));
        if settles.is_empty() {
            return Ok(());
        }
        let shared = self.inner.shared.clone();
        self.run_and_await(&self.inner.jobs, move || shared.write_settles(settles))
            .await
    }

    /// [`Database::commit_parked`], awaited.
    pub(crate) async fn commit_parked_async(
        &self,
        pick: impl Fn(&Key, &Parked) -> bool,
    ) -> Result<(), StoreError> {
        let parked = self.inner.shared.take_parks(pick);
        if parked.is_empty() {
            return Ok(());
        }
        let shared = self.inner.shared.clone();
        self.run_and_await(&self.inner.park_jobs, move || shared.commit_parked(parked))
            .await
    }

    /// Run `work` on `queue`'s threads and wait for it, blocking this thread.
    fn run_and_wait(
        &self,
        queue: &Mutex<Option<Sender<Job>>>,
        work: impl FnOnce() + Send + 'static,
    ) -> Result<(), StoreError> {
        let (tx, rx) = sync_channel(1);
        self.submit_to(
            queue,
            Box::new(move || {
                work();
                let _ = tx.send(());
            }),
        )?;
        rx.recv().map_err(|_| StoreError::Closed)
    }

    /// Run `work` on `queue`'s threads and await it.
    async fn run_and_await(
        &self,
        queue: &Mutex<Option<Sender<Job>>>,
        work: impl FnOnce() + Send + 'static,
    ) -> Result<(), StoreError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit_to(
            queue,
            Box::new(move || {
                work();
                let _ = tx.send(());
            }),
        )?;
        rx.await.map_err(|_| StoreError::Closed)
    }

    fn submit_to(&self, queue: &Mutex<Option<Sender<Job>>>, job: Job) -> Result<(), StoreError> {
        let jobs = queue.lock().map_err(|_| StoreError::Closed)?;
        jobs.as_ref()
            .ok_or(StoreError::Closed)?
            .send(job)
            .map_err(|_| StoreError::Closed)
    }

    /// Settle what daemons that died left behind: their claims become "interrupted"
    /// (outcome unknown) in the action store and the ledger, stages the kernel never
    /// recorded are discarded, and ledger actions whose driver record settled are brought
    /// forward. Returns how many rows changed. The session thread runs this every
    /// [`RECOVERY_INTERVAL`], so a live daemon finds a dead one's claims without a restart.
    pub fn recover(&self) -> Result<u64, StoreError> {
        self.call(crate::recover::recover)
    }

    /// Rows of a read-only query, each column as text (`NULL` as `None`), for reports and
    /// tests.
    pub fn query_text(&self, sql: &str) -> Result<Vec<Vec<Option<String>>>, StoreError> {
        let sql = sql.to_owned();
        self.call(move |link| {
            let rows = link.simple(&sql).map_err(|e| sql_error(&e))?;
            Ok(rows
                .into_iter()
                .filter_map(|message| match message {
                    tokio_postgres::SimpleQueryMessage::Row(row) => Some(
                        (0..row.len())
                            .map(|i| row.get(i).map(str::to_owned))
                            .collect(),
                    ),
                    _ => None,
                })
                .collect())
        })
    }

    /// Wait for the drain lease of `gatekeeper`: a session-level advisory lock taken by a
    /// connection of its own (on a thread of its own, so no runtime thread waits), held
    /// until the returned lease is dropped or the daemon dies.
    pub fn drain_lease(&self, gatekeeper: &str) -> kernel::DrainLeaseFuture {
        let key = lease_key(gatekeeper);
        let url = self.inner.shared.url.clone();
        let shown = self.inner.shared.shown.clone();
        let stats = self.inner.shared.stats.clone();
        let pool = self.inner.leases.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name("gate-pg-lease".into())
            .spawn(move || {
                let taken = (|| -> Result<DrainLease, StoreError> {
                    let kept = pool
                        .lock()
                        .ok()
                        .and_then(|mut pool| pool.pop())
                        .and_then(|mut kept| kept.0.take());
                    let mut client = match kept {
                        Some(client) if !client.is_closed() => client,
                        _ => connect(&url, &shown)?,
                    };
                    stats.round_trips.fetch_add(1, Ordering::Relaxed);
                    client
                        .execute("SELECT pg_advisory_lock($1, $2)", &[&LEDGER_LOCKS, &key])
                        .map_err(|e| sql_error(&e))?;
                    Ok(DrainLease {
                        client: Some(client),
                        key,
                        pool: pool.clone(),
                        stats: stats.clone(),
                    })
                })();
                // If nobody waits any more, the lease is dropped (released) right here.
                let _ = tx.send(taken);
            });
        Box::pin(async move {
            spawned.map_err(|e| {
                kernel::StorageError(format!("cannot wait for the drain lease: {e}"))
            })?;
            match rx.await {
                Ok(Ok(lease)) => Ok(Box::new(lease) as kernel::DrainLease),
                Ok(Err(error)) => Err(kernel::StorageError(error.to_string())),
                Err(_) => Err(kernel::StorageError("the drain lease was not taken".into())),
            }
        })
    }
}

/// Run `work` on a thread of its own and wait for it: the `postgres` client must not be
/// used on a thread that runs an async runtime.
fn off_runtime<R: Send>(
    work: impl FnOnce() -> Result<R, StoreError> + Send,
) -> Result<R, StoreError> {
    std::thread::scope(|scope| scope.spawn(work).join().unwrap_or(Err(StoreError::Closed)))
}

/// The second key of a drain lease: a stable hash of the gatekeeper's name (FNV-1a),
/// never 0 (the key of ledger inserts).
fn lease_key(gatekeeper: &str) -> i32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in gatekeeper.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    let key = i32::from_ne_bytes(hash.to_ne_bytes());
    if key == 0 { 1 } else { key }
}

/// A held drain lease: while it lives, no other daemon's lease of the same gatekeeper
/// can be taken. Dropping it (or the daemon dying) releases it.
pub struct DrainLease {
    client: Option<Client>,
    key: i32,
    pool: LeasePool,
    stats: Arc<Stats>,
}

impl std::fmt::Debug for DrainLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DrainLease").finish_non_exhaustive()
    }
}

impl Drop for DrainLease {
    fn drop(&mut self) {
        // The client must be used and closed outside any async runtime: hand it to a
        // thread, which releases the lock and keeps the connection for the next lease (or
        // closes it, which releases the lock as well).
        if let Some(mut client) = self.client.take() {
            let (key, pool, stats) = (self.key, self.pool.clone(), self.stats.clone());
            let _ = std::thread::Builder::new()
                .name("gate-pg-lease".into())
                .spawn(move || {
                    stats.round_trips.fetch_add(1, Ordering::Relaxed);
                    let released = client
                        .query_one("SELECT pg_advisory_unlock($1, $2)", &[&LEDGER_LOCKS, &key])
                        .is_ok_and(|row| row.get::<_, bool>(0));
                    if released
                        && let Ok(mut pool) = pool.lock()
                        && pool.len() < KEPT_LEASE_CONNECTIONS
                    {
                        pool.push(Kept(Some(client)));
                    }
                });
        }
    }
}

fn worker_loop(jobs: &Mutex<Receiver<Job>>) {
    loop {
        let job = {
            let Ok(jobs) = jobs.lock() else { return };
            match jobs.recv() {
                Ok(job) => job,
                Err(_) => return,
            }
        };
        job();
    }
}

/// The flusher thread: commits every transaction parked, and writes every driver's
/// outcome kept, longer than [`PARK_WINDOW`].
fn flush_loop(shared: &Shared, stop: &AtomicBool) {
    let tick = PARK_WINDOW / 4;
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(tick);
        let now = Instant::now();
        let due = shared.take_parks(|_, parked| now.duration_since(parked.since) >= PARK_WINDOW);
        shared.commit_parked(due);
        let due = shared.take_settles(|_, settle| now.duration_since(settle.since) >= PARK_WINDOW);
        shared.write_settles(due);
    }
}

/// Create the schema in an empty database, upgrade an older one, refuse a newer one.
fn migrate(url: &str, shown: &str) -> Result<(), StoreError> {
    let mut client = connect(url, shown)?;
    let result = (|| {
        client
            .execute("SELECT pg_advisory_lock($1, 0)", &[&MIGRATION_LOCK])
            .map_err(|e| sql_error(&e))?;
        let tables: Vec<String> = client
            .query(
                "SELECT table_name::text FROM information_schema.tables WHERE table_schema = current_schema()",
                &[],
            )
            .map_err(|e| sql_error(&e))?
            .iter()
            .map(|row| row.get(0))
            .collect();
        if tables.is_empty() {
            let mut tx = client.transaction().map_err(|e| sql_error(&e))?;
            tx.batch_execute(CREATE).map_err(|e| sql_error(&e))?;
            tx.batch_execute(STAGE_FUNCTION_6)
                .map_err(|e| sql_error(&e))?;
            tx.batch_execute(ROW_RULES_5).map_err(|e| sql_error(&e))?;
            tx.execute(
                "INSERT INTO gate_schema (version) VALUES ($1)",
                &[&SCHEMA_VERSION],
            )
            .map_err(|e| sql_error(&e))?;
            tx.commit().map_err(|e| sql_error(&e))?;
            return Ok(());
        }
        let missing: Vec<&str> = EXPECTED_TABLES
            .iter()
            .copied()
            .filter(|t| !tables.iter().any(|have| have == t))
            .collect();
        if tables.iter().all(|t| t != "gate_schema") {
            return Err(StoreError::Foreign {
                url: shown.to_owned(),
                detail: format!("it has tables ({}) but no gate_schema", tables.join(", ")),
            });
        }
        let found: i32 = client
            .query_opt("SELECT version FROM gate_schema", &[])
            .map_err(|e| sql_error(&e))?
            .map(|row| row.get(0))
            .ok_or_else(|| StoreError::Foreign {
                url: shown.to_owned(),
                detail: "gate_schema holds no version".into(),
            })?;
        if found > SCHEMA_VERSION {
            return Err(StoreError::NewerSchema {
                url: shown.to_owned(),
                found,
                supported: SCHEMA_VERSION,
            });
        }
        if found < SCHEMA_VERSION {
            let mut tx = client.transaction().map_err(|e| sql_error(&e))?;
            for (from, step) in UPGRADES {
                if from >= found {
                    tx.batch_execute(step).map_err(|e| sql_error(&e))?;
                }
            }
            tx.execute("UPDATE gate_schema SET version = $1", &[&SCHEMA_VERSION])
                .map_err(|e| sql_error(&e))?;
            tx.commit().map_err(|e| sql_error(&e))?;
            tracing::info!(from = found, to = SCHEMA_VERSION, "store.schema.upgraded");
            return Ok(());
        }
        if !missing.is_empty() {
            return Err(StoreError::Foreign {
                url: shown.to_owned(),
                detail: format!(
                    "schema version {found} without the tables {}",
                    missing.join(", ")
                ),
            });
        }
        Ok(())
    })();
    let _ = client.execute("SELECT pg_advisory_unlock($1, 0)", &[&MIGRATION_LOCK]);
    result
}

/// Take a session id and its lock, listen for changes, and read the lockdown latch
/// (after listening, so no latch is missed between the two).
fn start_session(
    url: &str,
    shown: &str,
    session: Option<i32>,
) -> Result<(Client, i32, bool), StoreError> {
    let mut client = connect(url, shown)?;
    let session = match session {
        Some(session) => session,
        None => client
            .query_one("SELECT nextval('gate_sessions')::integer", &[])
            .map_err(|e| sql_error(&e))?
            .get(0),
    };
    client
        .execute(
            "SELECT pg_advisory_lock($1, $2)",
            &[&SESSION_LOCKS, &session],
        )
        .map_err(|e| sql_error(&e))?;
    client
        .batch_execute(&format!("LISTEN {}", crate::schema::CHANNEL))
        .map_err(|e| sql_error(&e))?;
    let latched: bool = client
        .query_one(crate::cache::LOCKED_DOWN, &[])
        .map_err(|e| sql_error(&e))?
        .get(0);
    Ok((client, session, latched))
}

/// What a notification's payload (the changed table, and who wrote) means for what is
/// remembered.
fn noted(shared: &Shared, notification: &postgres::Notification) {
    shared.caches.changed(
        notification.payload(),
        shared.session.load(Ordering::SeqCst),
    );
}

/// The session thread: holds the session lock, turns notifications into moves of the
/// `changes` counter and into what the caches forget, settles dead daemons' claims every
/// [`RECOVERY_INTERVAL`], and connects again (same session) when the connection breaks.
fn session_loop(
    shared: &Shared,
    stop: &AtomicBool,
    changes: &tokio::sync::watch::Sender<u64>,
    ready: SyncSender<Result<i32, StoreError>>,
) {
    let (url, shown) = (&*shared.url, &*shared.shown);
    let (mut client, session) = match start_session(url, shown, None) {
        Ok((client, session, latched)) => {
            shared.session.store(session, Ordering::SeqCst);
            shared.caches.listening(latched);
            (client, session)
        }
        Err(error) => {
            let _ = ready.send(Err(error));
            return;
        }
    };
    let _ = ready.send(Ok(session));
    let stats = Stats::default();
    let mut recovery: Option<Conn> = None;
    let mut last_recovery = Instant::now();
    let tick = Duration::from_millis(50);
    while !stop.load(Ordering::SeqCst) {
        let mut woke = false;
        let mut broken = client.is_closed();
        if !broken {
            let mut notifications = client.notifications();
            let first = notifications.timeout_iter(tick).next();
            match first {
                Ok(Some(notification)) => {
                    woke = true;
                    noted(shared, &notification);
                    // Take what else arrived: one wake-up is enough.
                    while let Ok(Some(notification)) = notifications.iter().next() {
                        noted(shared, &notification);
                    }
                }
                Err(_) => broken = true,
                Ok(None) => {}
            }
        }
        if broken {
            // Notifications sent while disconnected are lost: nothing remembered is
            // trusted until the session listens again.
            shared.caches.deaf();
            std::thread::sleep(Duration::from_millis(200));
            match start_session(url, shown, Some(session)) {
                Ok((fresh, _, latched)) => {
                    client = fresh;
                    shared.caches.listening(latched);
                    tracing::info!(session, "store.session.reconnected");
                    // Wake to re-read.
                    woke = true;
                }
                Err(error) => {
                    tracing::warn!(%error, "store.session.unreachable");
                    continue;
                }
            }
        }
        if woke {
            changes.send_modify(|n| *n = n.wrapping_add(1));
        }
        if last_recovery.elapsed() >= RECOVERY_INTERVAL {
            last_recovery = Instant::now();
            let mut conn = match recovery.take() {
                Some(conn) if !conn.client.is_closed() => conn,
                _ => match connect_conn(url, shown, session) {
                    Ok(conn) => conn,
                    Err(error) => {
                        tracing::warn!(%error, "store.recover.failed");
                        continue;
                    }
                },
            };
            let mut link = Link {
                conn: &mut conn,
                stats: &stats,
                in_tx: false,
                park: None,
            };
            match crate::recover::recover(&mut link) {
                Ok(0) => {}
                Ok(settled) => {
                    tracing::warn!(settled, "store.recovered");
                    changes.send_modify(|n| *n = n.wrapping_add(1));
                }
                Err(error) => tracing::warn!(%error, "store.recover.failed"),
            }
            recovery = Some(conn);
        }
    }
}

//! The connection to PostgreSQL: a few worker threads with a connection each, the
//! session connection that marks this daemon alive and listens for other daemons'
//! changes, the schema check on open, and the counts of commits and round trips.
//!
//! The storage ports are synchronous (the kernel's ledger, the wiki's key-value port)
//! or asynchronous (the action store), and they are called from tasks of the daemon's
//! tokio runtime. The synchronous `postgres` client runs a runtime of its own and must
//! never be called from inside another one, so every statement runs on this store's own
//! threads: a call hands a job to a worker and waits for its answer (blocking for a
//! synchronous port, as rusqlite would; awaiting for the asynchronous one). A worker
//! that finds its connection broken connects again before its next job.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use postgres::fallible_iterator::FallibleIterator;
use postgres::types::ToSql;
use postgres::{Client, NoTls, Row, Statement};

use crate::error::StoreError;
use crate::schema::{
    CREATE, EXPECTED_TABLES, LEDGER_LOCKS, MIGRATION_LOCK, SCHEMA_VERSION, SESSION_LOCKS,
    STAGE_FUNCTION, UPGRADES,
};

/// How many worker connections a [`Database`] keeps.
pub const WORKERS: usize = 4;

/// How often the session thread looks for claims of dead daemons to settle.
pub const RECOVERY_INTERVAL: Duration = Duration::from_millis(500);

/// Counts of what this handle asked of the server.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) commits: AtomicU64,
    pub(crate) round_trips: AtomicU64,
}

/// One worker's connection and its prepared statements.
pub(crate) struct Link<'a> {
    client: &'a mut Client,
    statements: &'a mut HashMap<&'static str, Statement>,
    stats: &'a Stats,
    in_tx: bool,
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
    fn statement(&mut self, sql: &'static str) -> Result<Statement, postgres::Error> {
        if let Some(statement) = self.statements.get(sql) {
            return Ok(statement.clone());
        }
        self.stats.round_trips.fetch_add(1, Ordering::Relaxed);
        let statement = self.client.prepare(sql)?;
        self.statements.insert(sql, statement.clone());
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
        self.client.query(&statement, params)
    }

    /// At most one row of a read.
    pub(crate) fn query_opt(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, postgres::Error> {
        let statement = self.statement(sql)?;
        self.counted(false);
        self.client.query_opt(&statement, params)
    }

    /// Exactly one row of a read.
    pub(crate) fn query_one(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, postgres::Error> {
        let statement = self.statement(sql)?;
        self.counted(false);
        self.client.query_one(&statement, params)
    }

    /// Rows a write returns (`… RETURNING`); committed at once outside a transaction.
    pub(crate) fn write_returning(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, postgres::Error> {
        let statement = self.statement(sql)?;
        self.counted(true);
        self.client.query(&statement, params)
    }

    /// A write; committed at once outside a transaction. Returns the rows changed.
    pub(crate) fn execute(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, postgres::Error> {
        let statement = self.statement(sql)?;
        self.counted(true);
        self.client.execute(&statement, params)
    }

    /// Run `work` in one transaction whose first statement, `first` (SQL without
    /// parameters that returns one row of one value), goes with the `BEGIN` in one round
    /// trip; `work` gets that value as text. Committed if `work` returns `Ok`, rolled back
    /// otherwise.
    pub(crate) fn transaction_opening<R>(
        &mut self,
        first: &str,
        work: impl FnOnce(&mut Link<'_>, Option<String>) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        self.stats.round_trips.fetch_add(1, Ordering::Relaxed);
        let opened = self.client.simple_query(&format!("BEGIN; {first}"));
        let value = match opened {
            Ok(messages) => messages.into_iter().find_map(|message| match message {
                postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
                _ => None,
            }),
            Err(error) => {
                let _ = self.client.batch_execute("ROLLBACK");
                return Err(sql_error(&error));
            }
        };
        self.in_tx = true;
        let result = work(self, value);
        self.in_tx = false;
        self.finish(result)
    }

    fn finish<R>(&mut self, result: Result<R, StoreError>) -> Result<R, StoreError> {
        self.stats.round_trips.fetch_add(1, Ordering::Relaxed);
        match result {
            Ok(value) => {
                self.client
                    .batch_execute("COMMIT")
                    .map_err(|e| sql_error(&e))?;
                self.stats.commits.fetch_add(1, Ordering::Relaxed);
                Ok(value)
            }
            Err(error) => {
                let _ = self.client.batch_execute("ROLLBACK");
                Err(error)
            }
        }
    }

    /// Run `work` in one transaction, committed if it returns `Ok`, rolled back otherwise.
    pub(crate) fn transaction<R>(
        &mut self,
        work: impl FnOnce(&mut Link<'_>) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        self.stats.round_trips.fetch_add(1, Ordering::Relaxed);
        self.client
            .batch_execute("BEGIN")
            .map_err(|e| sql_error(&e))?;
        self.in_tx = true;
        let result = work(self);
        self.in_tx = false;
        self.finish(result)
    }
}

type Job = Box<dyn FnOnce(&mut Worker) + Send>;

/// A worker thread's state: its connection, made on first use and again after a break.
pub(crate) struct Worker {
    url: Arc<str>,
    shown: Arc<str>,
    client: Option<Client>,
    statements: HashMap<&'static str, Statement>,
    stats: Arc<Stats>,
}

impl Worker {
    fn run<R>(
        &mut self,
        work: impl FnOnce(&mut Link<'_>) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            self.statements.clear();
            self.client = None;
            self.client = Some(connect(&self.url, &self.shown)?);
        }
        let Some(client) = self.client.as_mut() else {
            return Err(StoreError::Closed);
        };
        let mut link = Link {
            client,
            statements: &mut self.statements,
            stats: &self.stats,
            in_tx: false,
        };
        let result = work(&mut link);
        if self.client.as_ref().is_some_and(Client::is_closed) {
            self.client = None;
            self.statements.clear();
            if let Err(error) = result {
                let detail = match error {
                    StoreError::Sql { detail } => detail,
                    other => other.to_string(),
                };
                return Err(StoreError::Unreachable {
                    url: self.shown.to_string(),
                    detail: format!("the connection was lost: {detail}"),
                });
            }
        }
        result.map_err(|error| match error {
            StoreError::Sql { detail } if detail.contains("connection closed") => {
                StoreError::Unreachable {
                    url: self.shown.to_string(),
                    detail,
                }
            }
            other => other,
        })
    }
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
    url: Arc<str>,
    shown: Arc<str>,
    jobs: Mutex<Option<Sender<Job>>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
    session: i32,
    stop: Arc<AtomicBool>,
    session_thread: Mutex<Option<JoinHandle<()>>>,
    changes: tokio::sync::watch::Receiver<u64>,
    stats: Arc<Stats>,
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
            .field("url", &self.inner.shown)
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
        let stats = Arc::new(Stats::default());
        // The client runs a runtime of its own: off this thread, which may be a task's.
        off_runtime(|| migrate(&url, &shown))?;

        let stop = Arc::new(AtomicBool::new(false));
        let (changes_tx, changes) = tokio::sync::watch::channel(0u64);
        let (ready_tx, ready_rx) = sync_channel::<Result<i32, StoreError>>(1);
        let session_thread = {
            let url = url.clone();
            let shown = shown.clone();
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("gate-pg-session".into())
                .spawn(move || session_loop(&url, &shown, &stop, &changes_tx, ready_tx))
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

        let (jobs_tx, jobs_rx) = std::sync::mpsc::channel::<Job>();
        let jobs_rx = Arc::new(Mutex::new(jobs_rx));
        let mut workers = Vec::with_capacity(WORKERS);
        for n in 0..WORKERS {
            let mut worker = Worker {
                url: url.clone(),
                shown: shown.clone(),
                client: None,
                statements: HashMap::new(),
                stats: stats.clone(),
            };
            let jobs = jobs_rx.clone();
            let handle = std::thread::Builder::new()
                .name(format!("gate-pg-{n}"))
                .spawn(move || worker_loop(&mut worker, &jobs))
                .map_err(|e| StoreError::Sql {
                    detail: format!("cannot start a worker thread: {e}"),
                })?;
            workers.push(handle);
        }
        let db = Database {
            inner: Arc::new(Inner {
                url,
                shown,
                jobs: Mutex::new(Some(jobs_tx)),
                workers: Mutex::new(workers),
                session,
                stop,
                session_thread: Mutex::new(Some(session_thread)),
                changes,
                stats,
                leases: LeasePool::default(),
            }),
        };
        db.recover()?;
        Ok(db)
    }

    /// The URL, without its password (for messages).
    pub fn shown_url(&self) -> &str {
        &self.inner.shown
    }

    /// This daemon's session id: what `deciding_session` and `claimed_by` name.
    pub fn session(&self) -> i32 {
        self.inner.session
    }

    /// Transactions this handle committed (a write outside a transaction counts as one).
    pub fn commits(&self) -> u64 {
        self.inner.stats.commits.load(Ordering::Relaxed)
    }

    /// Round trips this handle made to the server (statements, prepares, BEGIN, COMMIT).
    pub fn round_trips(&self) -> u64 {
        self.inner.stats.round_trips.load(Ordering::Relaxed)
    }

    /// A counter that moves whenever another daemon (or this one) changed the ledger,
    /// an action store or the rules, and after the session connection was made again
    /// (notifications sent meanwhile are lost: re-read then).
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.changes.clone()
    }

    /// Run `work` on a worker connection and wait for its answer, blocking this thread.
    pub(crate) fn call<R: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Link<'_>) -> Result<R, StoreError> + Send + 'static,
    ) -> Result<R, StoreError> {
        let (tx, rx) = sync_channel(1);
        self.submit(Box::new(move |worker: &mut Worker| {
            let _ = tx.send(worker.run(work));
        }))?;
        rx.recv().unwrap_or(Err(StoreError::Closed))
    }

    /// Hand `work` to a worker connection and return where its answer will arrive, for
    /// work that talks with the caller while it runs.
    pub(crate) fn call_later<R: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Link<'_>) -> Result<R, StoreError> + Send + 'static,
    ) -> Result<Receiver<Result<R, StoreError>>, StoreError> {
        let (tx, rx) = sync_channel(1);
        self.submit(Box::new(move |worker: &mut Worker| {
            let _ = tx.send(worker.run(work));
        }))?;
        Ok(rx)
    }

    /// Run `work` on a worker connection and await its answer.
    pub(crate) async fn call_async<R: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Link<'_>) -> Result<R, StoreError> + Send + 'static,
    ) -> Result<R, StoreError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit(Box::new(move |worker: &mut Worker| {
            let _ = tx.send(worker.run(work));
        }))?;
        rx.await.unwrap_or(Err(StoreError::Closed))
    }

    fn submit(&self, job: Job) -> Result<(), StoreError> {
        let jobs = self.inner.jobs.lock().map_err(|_| StoreError::Closed)?;
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
            let rows = link.client.simple_query(&sql).map_err(|e| sql_error(&e))?;
            Ok(rows
                .into_iter()
                .filter_map(|message| match message {
                    postgres::SimpleQueryMessage::Row(row) => Some(
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
        let url = self.inner.url.clone();
        let shown = self.inner.shown.clone();
        let stats = self.inner.stats.clone();
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

fn worker_loop(worker: &mut Worker, jobs: &Mutex<Receiver<Job>>) {
    loop {
        let job = {
            let Ok(jobs) = jobs.lock() else { return };
            match jobs.recv() {
                Ok(job) => job,
                Err(_) => return,
            }
        };
        job(worker);
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
            tx.batch_execute(STAGE_FUNCTION)
                .map_err(|e| sql_error(&e))?;
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

/// Take a session id and its lock, and listen for changes.
fn start_session(
    url: &str,
    shown: &str,
    session: Option<i32>,
) -> Result<(Client, i32), StoreError> {
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
    Ok((client, session))
}

/// The session thread: holds the session lock, turns notifications into moves of the
/// `changes` counter, settles dead daemons' claims every [`RECOVERY_INTERVAL`], and
/// connects again (same session) when the connection breaks.
fn session_loop(
    url: &str,
    shown: &str,
    stop: &AtomicBool,
    changes: &tokio::sync::watch::Sender<u64>,
    ready: SyncSender<Result<i32, StoreError>>,
) {
    let (mut client, session) = match start_session(url, shown, None) {
        Ok(started) => started,
        Err(error) => {
            let _ = ready.send(Err(error));
            return;
        }
    };
    let _ = ready.send(Ok(session));
    let mut statements = HashMap::new();
    let stats = Stats::default();
    let mut since_recovery = Duration::ZERO;
    let tick = Duration::from_millis(50);
    while !stop.load(Ordering::SeqCst) {
        let mut woke = false;
        let mut broken = client.is_closed();
        if !broken {
            let mut notifications = client.notifications();
            let first = notifications.timeout_iter(tick).next();
            match first {
                Ok(Some(_)) => {
                    woke = true;
                    // Drain what else arrived: one wake-up is enough.
                    while let Ok(Some(_)) = notifications.iter().next() {}
                }
                Err(_) => broken = true,
                Ok(None) => {}
            }
        }
        if broken {
            std::thread::sleep(Duration::from_millis(200));
            match start_session(url, shown, Some(session)) {
                Ok((fresh, _)) => {
                    client = fresh;
                    statements.clear();
                    tracing::info!(session, "store.session.reconnected");
                    // Notifications sent while disconnected are lost: wake to re-read.
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
        since_recovery += tick;
        if since_recovery >= RECOVERY_INTERVAL {
            since_recovery = Duration::ZERO;
            let mut link = Link {
                client: &mut client,
                statements: &mut statements,
                stats: &stats,
                in_tx: false,
            };
            match crate::recover::recover(&mut link) {
                Ok(0) => {}
                Ok(settled) => {
                    tracing::warn!(settled, "store.recovered");
                    changes.send_modify(|n| *n = n.wrapping_add(1));
                }
                Err(error) => tracing::warn!(%error, "store.recover.failed"),
            }
        }
    }
}

//! The database handle: opening and checking a file, the one connection, and when writes
//! are committed.
//!
//! # Commits
//!
//! Every write runs inside a transaction on the process's one connection. A write is
//! either *durable now* (committed, and its call returns only after the write-ahead log
//! was fsync'd past its commit), *committed now* without a sync of its own, or
//! *deferred*: written into the open transaction and committed with the next write that
//! commits, or by the flusher thread at most [`DEFERRED_COMMIT_WINDOW`] after the
//! transaction opened, whichever comes first.
//!
//! # Syncs, and group commit
//!
//! The connection runs with `synchronous=NORMAL`: SQLite's `COMMIT` appends the
//! transaction's frames to the write-ahead log and does not fsync it (checkpoints still
//! sync, so the file is never corrupted). Durability is this module's own step, after
//! the commit and *outside* the connection's mutex: the log file is fdatasync'd through
//! a handle of its own. The log is appended in commit order and SQLite's recovery keeps
//! the longest prefix of whole, checksummed commits, so one sync makes every earlier
//! commit durable too, whoever wrote it. Hence:
//!
//! - a commit without a sync (an outcome, see the adapters) becomes durable with the
//!   next sync; a power cut before that may lose it, with whatever was committed after
//!   it, and never anything a completed sync covered;
//! - group commit: a durable write made while other durable writes are under way in
//!   other threads, or while a sync runs, does not commit on its own: it joins the open
//!   transaction and waits. The next sync's leader (the first waiter to find no sync
//!   running) waits up to `GATHER` while durable writes are under way or until as many
//!   writes have joined as joined the last synced transaction (never when there are
//!   none), commits the transaction they all joined, then syncs once for all of them. A
//!   lone writer commits and syncs at once. A write committed now without a sync joins
//!   on the same terms and waits for the commit only. No caller of a durable write
//!   returns before its transaction is committed and a sync that began
//!   after that commit has completed; if the shared transaction is lost instead (a
//!   later write in it failed, the disk is full), every write that joined it is told
//!   so ([`StoreError::NotCommitted`]), never that it was recorded.
//!
//! The connection opens the file through the file-system layer of `vfs.rs`, which hands
//! each commit's log frames to the file in two writes (SQLite's own layer makes two per
//! page); what is committed and synced, and when, is as described here.
//!
//! A failed sync is sticky: the caller is told its write failed, and every later write
//! is refused ([`StoreError::NotDurable`]), since a disk that failed to sync cannot be
//! trusted to have kept what the next sync would report.
//!
//! Only writes whose loss in a crash is safe are deferred or left unsynced; the adapters
//! document which. A claim (the `applying` write of the at-most-once protocol) is always
//! durable before its call returns, so no crash or power cut can undo a claim whose call
//! was sent.
//!
//! In memory nothing can be made durable and no other connection can look, so a commit
//! buys nothing but its cost: every write is deferred, and the open transaction is
//! committed after [`MEMORY_BATCH`] writes, by [`Database::flush`], or when the last
//! handle closes. Nothing is lost by waiting, since the one connection reads its own
//! uncommitted writes; atomicity per write still comes from savepoints and SQLite's
//! statement rollback. [`Database::limit_size`] turns this off (a failed commit would
//! lose the whole batch).
//!
//! If a commit fails (disk full, I/O error), the whole transaction is lost, including
//! deferred writes whose calls had already returned. Each such record falls back to its
//! last committed state, which is always one a crash could also have produced; action ids
//! handed out by the lost transaction are never handed out again.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::{Connection, MAIN_DB, OpenFlags};
use tracing::{debug, info, warn};

use crate::error::{BUSY_TIMEOUT, StoreError};
use crate::known::Known;
use crate::schema::{APPLICATION_ID, EXPECTED_COLUMNS, EXPECTED_SQL, SCHEMA_VERSION};
use crate::session::{self, Session};

/// How long a deferred write may wait for a commit to ride with before the flusher
/// commits it on its own. Long enough that a drain's next claim (microseconds later)
/// carries the previous outcome; short enough that another process waiting to write
/// barely notices.
pub const DEFERRED_COMMIT_WINDOW: Duration = Duration::from_millis(10);

/// The page size of a new file, in bytes (SQLite's default is 4,096).
///
/// Every page a commit touches is one frame of the write-ahead log, written and then
/// synced whole, and a cycle touches about a dozen pages (a table's leaf and each index's
/// leaf, per row written). The sync's cost grows with the bytes written back (on the
/// machine the benchmarks ran on, about 1 µs per KiB over a 4 KiB raw write), so halving the
/// page halves what a cycle's syncs carry. Smaller still, rows of a few hundred bytes
/// split pages more often and the trees deepen, for no further gain.
pub(crate) const PAGE_SIZE: i64 = 2048;

/// In memory, how many writes share one transaction (see the module docs).
pub(crate) const MEMORY_BATCH: u32 = 256;

/// When a write must be on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durability {
    /// Committed and (on a file) synced before the call returns.
    Now,
    /// Committed before the call returns, not synced: durable with the next sync.
    Lazy,
    /// Committed with the next `Now` or `Lazy` write, or by the flusher within the window.
    Deferred,
}

/// How many writing statements a write runs (see [`Shared::write`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Steps {
    /// At most one writing statement, and nothing fallible after it.
    One,
    /// Several: run inside a savepoint so a failure undoes all of them.
    Many,
}

/// An error inside a read or write closure, before it is sorted for a person.
#[derive(Debug)]
pub(crate) enum Error {
    Sql(rusqlite::Error),
    Store(StoreError),
}

impl From<rusqlite::Error> for Error {
    fn from(error: rusqlite::Error) -> Self {
        Self::Sql(error)
    }
}

impl From<rusqlite::types::FromSqlError> for Error {
    fn from(error: rusqlite::types::FromSqlError) -> Self {
        Self::Store(StoreError::decode("stored value", error))
    }
}

impl From<StoreError> for Error {
    fn from(error: StoreError) -> Self {
        Self::Store(error)
    }
}

/// The open transaction that deferred writes sit in.
struct Batch {
    /// This transaction's number among those this handle opened (see [`Ticket`]).
    id: u64,
    opened: Instant,
    /// Writes made in this transaction.
    writes: u32,
    /// Action ids handed out in this transaction, per gatekeeper.
    handed_out: Vec<(String, u64)>,
}

/// The connection and what rides on it.
pub(crate) struct Conn {
    pub(crate) db: Connection,
    batch: Option<Batch>,
    closed: bool,
    /// The flusher waits with no deadline and must be woken for the next batch. While it
    /// waits on a deadline it needs no wake-up: it looks again when the deadline passes
    /// (see [`FLUSHER_WATCHES`]).
    flusher_idle: bool,
    /// Per gatekeeper, the highest action id handed out by a transaction that was lost:
    /// the next id must be above it.
    floors: HashMap<String, u64>,
    /// In memory: writes committed now are coalesced into batches of [`MEMORY_BATCH`].
    coalesce: bool,
    /// In memory: no other connection exists.
    in_memory: bool,
    /// Bringing in an older daemon's redo journal (`upgrade.rs`): every write is deferred,
    /// and only the replay's flush commits, together with the journal position it reached.
    behind: bool,
    /// What this connection already knows of the database (see `known.rs`).
    pub(crate) known: Known,
    /// The number of the last transaction opened (see [`Batch::id`]).
    batches: u64,
}

impl Conn {
    /// Record that `id` was handed out for `gatekeeper` in the current transaction.
    pub(crate) fn hand_out(&mut self, gatekeeper: &str, id: u64) {
        if let Some(batch) = &mut self.batch {
            batch.handed_out.push((gatekeeper.to_owned(), id));
        }
    }

    /// Whether [`Conn::known`] may be trusted now: in memory, while a redo journal is
    /// brought in (no other connection writes the file: see `upgrade.rs`), or on a file while this
    /// connection holds the write transaction (see `known.rs`).
    pub(crate) fn trusted(&self) -> bool {
        self.in_memory || self.behind || self.batch.is_some()
    }

    /// After a write transaction opened on a file: forget what is known if another
    /// connection committed since the last one.
    fn check_data_version(&mut self) -> rusqlite::Result<()> {
        let version: i64 = self
            .db
            .prepare_cached("PRAGMA data_version")?
            .query_row([], |r| r.get(0))?;
        if self.known.data_version != Some(version) {
            self.known.forget();
            self.known.data_version = Some(version);
        }
        Ok(())
    }

    /// Open the batch that the transaction just begun holds.
    fn open_batch(&mut self) {
        self.batches += 1;
        self.batch = Some(Batch {
            id: self.batches,
            opened: Instant::now(),
            writes: 0,
            handed_out: Vec::new(),
        });
    }

    /// The lowest id that may not be handed out again for `gatekeeper`.
    pub(crate) fn floor(&self, gatekeeper: &str) -> u64 {
        self.floors.get(gatekeeper).copied().unwrap_or(0)
    }
}

/// Run a transaction-control statement from the statement cache (parsing `BEGIN` or
/// `COMMIT` again for every write costs more than running it).
fn run(db: &Connection, sql: &str) -> rusqlite::Result<()> {
    db.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// Where the write-ahead log stands: what was committed, and what is known synced.
#[derive(Default)]
struct SyncState {
    /// Commits counted through `synced` are durable.
    synced: u64,
    /// A sync is running, or about to (its caller released this lock meanwhile).
    syncing: bool,
    /// The caller about to sync waits for durable writes under way to commit first.
    gathering: bool,
    /// A sync failed: what the operating system said.
    failed: Option<String>,
    /// Callers waiting on [`Syncer::done`] (a wake-up with none is a wasted system call).
    waiting: u32,
    /// How many writes joined the transaction the last leader committed.
    joined_last: u64,
    /// Transactions that durable writes had joined and that were lost instead of
    /// committed, with why (the most recent [`LOST_KEPT`]).
    lost: VecDeque<(u64, String)>,
}

/// How many lost transactions [`SyncState::lost`] remembers: far more than the writers
/// that can be waiting at once.
const LOST_KEPT: usize = 64;

/// What a durable write waits for before it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ticket {
    /// Its own commit, by number: a sync begun after it must complete.
    Commit(u64),
    /// The transaction it joined and left open (by [`Batch::id`]): whoever syncs next
    /// commits it first.
    Batch(u64),
}

/// Why a durable write's wait ended without it being durable.
enum NotDurable {
    /// A sync failed (sticky).
    Sync(String),
    /// The transaction it joined was lost.
    Lost(String),
}

/// Makes commits durable by syncing the write-ahead log (see the module docs).
struct Syncer {
    /// The `-wal` file, opened by this module (SQLite keeps it while a connection is open).
    log: File,
    state: Mutex<SyncState>,
    /// Wakes the callers waiting for a sync to complete (or their transaction to be lost).
    done: Condvar,
    /// Wakes the one caller gathering writes before it syncs, and only it: a write that
    /// commits or joins would otherwise wake every caller waiting for the sync as well.
    nudged: Condvar,
    /// Commits made by this handle, counted after each `COMMIT` returns (under the
    /// connection's mutex, so their frames are written before the count moves).
    committed: AtomicU64,
    /// Syncs made, for tests and benchmarks.
    syncs: AtomicU64,
    /// Durable writes started and not yet committed (or failed).
    in_flight: AtomicU64,
    /// The [`Batch::id`] of the last transaction committed (set after `committed`).
    batch_committed: AtomicU64,
    /// How many writes joined the open transaction instead of committing it, each waiting
    /// for whoever syncs next to commit it (see [`Shared::wait_durable`]). Changed only
    /// under the connection's mutex; read without it by a sync gathering writes.
    joined: AtomicU64,
}

/// How long a caller about to sync waits, at most, for other writes to join the open
/// transaction, so that one sync covers them too. It waits only while durable writes are
/// under way, or until as many writes have joined as joined the last synced
/// transaction (writers that keep writing come back for the next sync: this paces the
/// syncs to them). A lone writer never waits.
const GATHER: Duration = Duration::from_micros(500);

impl Syncer {
    /// Open the log of the database at `path` and make its directory entry durable (SQLite
    /// would fsync the directory at its own first sync of the log; this module makes those
    /// syncs instead).
    fn open(path: &Path) -> std::io::Result<Self> {
        let log = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(sidecar(path, "-wal"))?;
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        File::open(dir)?.sync_all()?;
        log.sync_data()?;
        Ok(Self {
            log,
            state: Mutex::new(SyncState::default()),
            done: Condvar::new(),
            nudged: Condvar::new(),
            committed: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            batch_committed: AtomicU64::new(0),
            joined: AtomicU64::new(0),
        })
    }

    fn state(&self) -> MutexGuard<'_, SyncState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A durable write starts: a sync about to begin may wait for its commit.
    fn start_write(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    /// A durable write committed (or failed): wake a sync waiting for it.
    fn end_write(&self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.nudge();
    }

    /// Wake a sync waiting for writes to join or commit.
    fn nudge(&self) {
        if self.state().gathering {
            self.nudged.notify_one();
        }
    }

    /// Return once the write behind `ticket` is durable: its transaction committed, and
    /// a sync that began after that commit completed. One caller syncs at a time (the
    /// leader); those who arrive meanwhile wait for the next sync, which covers all of
    /// them (group commit). Before it syncs, the leader waits briefly for durable writes
    /// under way, then calls `commit_awaited` to commit the transaction that writers
    /// joined and left open ([`Ticket::Batch`]).
    fn wait_durable(
        &self,
        ticket: Ticket,
        synced: bool,
        commit_awaited: &dyn Fn() -> u64,
    ) -> Result<(), NotDurable> {
        let mut target = match ticket {
            Ticket::Commit(commit) => Some(commit),
            Ticket::Batch(_) => None,
        };
        let mut state = self.state();
        loop {
            if let Some(failed) = &state.failed {
                return Err(NotDurable::Sync(failed.clone()));
            }
            if let (None, Ticket::Batch(batch)) = (target, ticket) {
                if let Some((_, why)) = state.lost.iter().find(|(id, _)| *id == batch) {
                    return Err(NotDurable::Lost(why.clone()));
                }
                if self.batch_committed.load(Ordering::Acquire) >= batch {
                    if !synced {
                        return Ok(());
                    }
                    // Its commit is counted by now (`committed` moves first).
                    target = Some(self.committed.load(Ordering::Acquire));
                }
            }
            if target.is_some_and(|commit| state.synced >= commit) {
                return Ok(());
            }
            if state.syncing {
                state.waiting += 1;
                state = self.done.wait(state).unwrap_or_else(|p| p.into_inner());
                state.waiting -= 1;
                continue;
            }
            state.syncing = true;
            let gather_until = Instant::now() + GATHER;
            let want = state.joined_last;
            while self.in_flight.load(Ordering::Acquire) > 0
                || self.joined.load(Ordering::Acquire) < want
            {
                let now = Instant::now();
                if now >= gather_until {
                    break;
                }
                state.gathering = true;
                state = self
                    .nudged
                    .wait_timeout(state, gather_until - now)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|p| p.into_inner().0);
            }
            state.gathering = false;
            drop(state);
            let joined = commit_awaited();
            // Every commit counted by now has its frames written: this sync covers them.
            let through = self.committed.load(Ordering::Acquire);
            let synced = self.log.sync_data();
            state = self.state();
            state.syncing = false;
            state.joined_last = joined;
            match synced {
                Ok(()) => {
                    self.syncs.fetch_add(1, Ordering::Relaxed);
                    state.synced = state.synced.max(through);
                }
                Err(error) => state.failed = Some(error.to_string()),
            }
            if state.waiting > 0 {
                self.done.notify_all();
            }
        }
    }

    /// Whether a durable write should leave its transaction open for others to join
    /// instead of committing it: another durable write is under way, or a sync is (this
    /// write could not be covered by it anyway, and the next one commits for all).
    ///
    /// A write committed now without a sync ([`Durability::Lazy`]) joins on the same
    /// terms and waits only for the commit. `counted` is whether the caller is itself
    /// among the durable writes under way.
    fn should_join(&self, counted: bool) -> bool {
        self.in_flight.load(Ordering::Acquire) > u64::from(counted) || self.state().syncing
    }

    /// A transaction that durable writes had joined was lost: their waits end in error.
    fn lost(&self, batch: u64, why: &str) {
        let mut state = self.state();
        if state.lost.len() == LOST_KEPT {
            state.lost.pop_front();
        }
        state.lost.push_back((batch, why.to_owned()));
        if state.waiting > 0 {
            self.done.notify_all();
        }
    }
}

/// Run `wait`, which blocks the calling thread until a sync (or another caller's commit)
/// completes: the ports are called from async code but answer synchronously. On a worker
/// of a multi-threaded tokio runtime (the daemon's) it runs inside
/// [`tokio::task::block_in_place`], so the runtime hands the worker's other tasks to
/// another thread meanwhile: otherwise a runtime with two workers would let at most two
/// callers wait for a sync at a time, and sixteen agents could share a sync two at most
/// (measured: 2,027 actions/s against 4,070 with it; docs/performance.md). Elsewhere (a
/// current-thread runtime, a plain thread) it just runs.
fn off_workers<T>(wait: impl FnOnce() -> T) -> T {
    let on_workers = tokio::runtime::Handle::try_current().is_ok_and(|runtime| {
        runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
    });
    if on_workers {
        tokio::task::block_in_place(wait)
    } else {
        wait()
    }
}

/// State shared by every adapter of one database, and by its flusher thread.
pub(crate) struct Shared {
    conn: Mutex<Conn>,
    wake: Condvar,
    commits: Arc<AtomicU64>,
    /// On a file: the write-ahead log's syncs. In memory: `None`.
    syncer: Option<Syncer>,
    path: Option<PathBuf>,
    session: Option<Session>,
    /// Lockdown is a latch: once seen, it is never looked up again.
    locked_down: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Conn> {
        match self.conn.lock() {
            Ok(guard) => guard,
            Err(poisoned) => {
                // A closure panicked mid-write. Its transaction may be half done: drop it
                // (as a crash would), then carry on.
                let mut guard = poisoned.into_inner();
                if !guard.db.is_autocommit() {
                    let _ = guard.db.execute_batch("ROLLBACK");
                }
                self.lose_batch(&mut guard, "a write panicked");
                guard.known.forget();
                self.conn.clear_poison();
                guard
            }
        }
    }

    fn sorted(&self, error: Error) -> StoreError {
        match error {
            Error::Sql(error) => StoreError::from_sqlite(error, self.path.as_deref()),
            Error::Store(error) => error,
        }
    }

    /// Run a read with the whole connection at hand, to use or fill [`Conn::known`].
    pub(crate) fn read_conn<T>(
        &self,
        f: impl FnOnce(&mut Conn) -> Result<T, Error>,
    ) -> Result<T, StoreError> {
        let mut conn = self.lock();
        f(&mut conn).map_err(|e| self.sorted(e))
    }

    /// Run a read on the connection. It sees this process's deferred writes.
    pub(crate) fn read<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, Error>,
    ) -> Result<T, StoreError> {
        let conn = self.lock();
        f(&conn.db).map_err(|e| self.sorted(e))
    }

    /// The connection, ready to write: a transaction is open (on a file, this
    /// connection holds the write lock), or none is and, in memory, the caller opens one.
    ///
    /// On a file, waiting for another process's write lock happens here, with the mutex
    /// *released* between attempts: reads of this process (which in WAL mode never wait
    /// for a writer) go on meanwhile instead of queueing behind the waiting write. Gives
    /// up with [`StoreError::Busy`] after [`BUSY_TIMEOUT`].
    ///
    /// Also returns whether this call opened the transaction (in memory: whether the
    /// caller must).
    fn lock_for_write(&self) -> Result<(MutexGuard<'_, Conn>, bool), StoreError> {
        let started = Instant::now();
        let mut pause = Duration::from_micros(100);
        loop {
            let mut guard = self.lock();
            if guard.closed {
                return Err(StoreError::Closed);
            }
            if guard.in_memory || guard.batch.is_some() {
                let open = guard.batch.is_none();
                return Ok((guard, open));
            }
            let conn = &mut *guard;
            // Ask once, without SQLite's own busy wait (which would hold the mutex).
            let begun = conn
                .db
                .busy_timeout(Duration::ZERO)
                .and_then(|()| run(&conn.db, "BEGIN IMMEDIATE"));
            let restored = conn.db.busy_timeout(BUSY_TIMEOUT);
            match begun.and(restored) {
                Ok(()) => {
                    if let Err(error) = conn.check_data_version() {
                        let _ = run(&conn.db, "ROLLBACK");
                        conn.known.forget();
                        return Err(self.sorted(error.into()));
                    }
                    conn.open_batch();
                    return Ok((guard, true));
                }
                Err(error)
                    if matches!(
                        error.sqlite_error_code(),
                        Some(
                            rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                        )
                    ) && started.elapsed() < BUSY_TIMEOUT =>
                {
                    if !conn.db.is_autocommit() {
                        let _ = run(&conn.db, "ROLLBACK");
                    }
                    drop(guard);
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                Err(error) => {
                    if !conn.db.is_autocommit() {
                        let _ = run(&conn.db, "ROLLBACK");
                    }
                    return Err(self.sorted(error.into()));
                }
            }
        }
    }

    /// Run a write as one atomic step, committed now or deferred.
    ///
    /// `steps` says whether `f` may leave a partial write behind if it fails: with
    /// [`Steps::One`] it runs at most one writing statement and nothing fallible after
    /// it, so SQLite's own statement rollback keeps it atomic; with [`Steps::Many`] it
    /// runs inside a savepoint.
    pub(crate) fn write<T>(
        &self,
        durability: Durability,
        steps: Steps,
        f: impl FnOnce(&mut Conn) -> Result<T, Error>,
    ) -> Result<T, StoreError> {
        let durable = self
            .syncer
            .as_ref()
            .filter(|_| durability == Durability::Now);
        if let Some(syncer) = durable {
            syncer.start_write();
        }
        let written = self.write_committed(durability, steps, f);
        if let Some(syncer) = durable {
            syncer.end_write();
        }
        let (value, ticket) = written?;
        match (durability, ticket) {
            // Outside the connection's mutex: others commit meanwhile, and share the sync.
            (Durability::Now, Some(ticket)) => off_workers(|| self.wait_durable(ticket, true))?,
            // Joined an open transaction: returns once it is committed.
            (Durability::Lazy, Some(ticket @ Ticket::Batch(_))) => {
                if let Some(syncer) = &self.syncer {
                    syncer.nudge();
                }
                off_workers(|| self.wait_durable(ticket, false))?;
            }
            _ => {}
        }
        Ok(value)
    }

    /// Wait until the write behind `ticket` is durable (see the module docs), or with
    /// `synced` false, only committed.
    fn wait_durable(&self, ticket: Ticket, synced: bool) -> Result<(), StoreError> {
        let Some(syncer) = &self.syncer else {
            return Ok(());
        };
        let path = || self.path.clone().unwrap_or_default();
        syncer
            .wait_durable(ticket, synced, &|| self.commit_awaited())
            .map_err(|failure| match failure {
                NotDurable::Sync(detail) => StoreError::NotDurable {
                    path: path(),
                    detail,
                },
                NotDurable::Lost(detail) => StoreError::NotCommitted {
                    path: path(),
                    detail,
                },
            })
    }

    /// How many writes joined the open transaction (0 in memory).
    fn joined(&self) -> u64 {
        self.syncer
            .as_ref()
            .map_or(0, |s| s.joined.load(Ordering::Acquire))
    }

    /// Commit the open transaction if durable writes joined it (without syncing it);
    /// returns how many joined it. A failure is theirs to report (their waits find the
    /// transaction lost); it is logged here once.
    fn commit_awaited(&self) -> u64 {
        let mut conn = self.lock();
        let joined = self.joined();
        if conn.batch.is_none() || joined == 0 {
            return 0;
        }
        if let Err(error) = self.commit(&mut conn) {
            let error = self.sorted(error);
            warn!(%error, "writes waiting to be made durable could not be committed");
        }
        joined
    }

    /// [`Shared::write`] up to its commit: returns the write's value and, if the write was
    /// committed or is waiting to be (not deferred), what to wait for.
    fn write_committed<T>(
        &self,
        durability: Durability,
        steps: Steps,
        f: impl FnOnce(&mut Conn) -> Result<T, Error>,
    ) -> Result<(T, Option<Ticket>), StoreError> {
        if let Some(failed) = self.syncer.as_ref().and_then(|s| s.state().failed.clone()) {
            return Err(StoreError::NotDurable {
                path: self.path.clone().unwrap_or_default(),
                detail: failed,
            });
        }
        let (mut guard, opened_here) = self.lock_for_write()?;
        let conn = &mut *guard;
        let savepoint = !opened_here && steps == Steps::Many;
        let begin = if opened_here && conn.in_memory {
            Some("BEGIN IMMEDIATE")
        } else if savepoint {
            Some("SAVEPOINT op")
        } else {
            None
        };
        if let Some(begin) = begin
            && let Err(error) = run(&conn.db, begin)
        {
            self.after_error(conn);
            return Err(self.sorted(error.into()));
        }
        if opened_here && conn.batch.is_none() {
            conn.open_batch();
        }
        match f(conn) {
            Err(error) => {
                // Some of its statements may have been undone: forget what it told us.
                conn.known.forget();
                if conn.db.is_autocommit() {
                    // SQLite rolled the whole transaction back itself (disk full, I/O).
                    self.lose_batch(conn, "a write failed");
                } else if opened_here {
                    let _ = run(&conn.db, "ROLLBACK");
                    conn.batch = None;
                } else if savepoint
                    && run(&conn.db, "ROLLBACK TO op")
                        .and_then(|()| run(&conn.db, "RELEASE op"))
                        .is_err()
                {
                    self.after_error(conn);
                }
                // Steps::One inside a batch: SQLite already undid the failed statement.
                Err(self.sorted(error))
            }
            Ok(value) => {
                if savepoint && let Err(error) = run(&conn.db, "RELEASE op") {
                    self.after_error(conn);
                    return Err(self.sorted(error.into()));
                }
                let writes = conn.batch.as_mut().map_or(0, |batch| {
                    batch.writes += 1;
                    batch.writes
                });
                let durability = match durability {
                    _ if conn.behind => Durability::Deferred,
                    Durability::Now | Durability::Lazy
                        if conn.coalesce && writes < MEMORY_BATCH =>
                    {
                        Durability::Deferred
                    }
                    other => other,
                };
                match durability {
                    // Group commit: others' durable writes are under way, or a sync is;
                    // this one waits in the open transaction for the next sync's leader
                    // to commit it with theirs (one commit and one sync for all).
                    Durability::Now | Durability::Lazy
                        if self
                            .syncer
                            .as_ref()
                            .is_some_and(|s| s.should_join(durability == Durability::Now))
                            && let (Some(batch), Some(syncer)) = (&conn.batch, &self.syncer) =>
                    {
                        syncer.joined.fetch_add(1, Ordering::AcqRel);
                        Ok((value, Some(Ticket::Batch(batch.id))))
                    }
                    Durability::Now | Durability::Lazy => {
                        let commit = self.commit(conn).map_err(|e| self.sorted(e))?;
                        Ok((value, commit.map(Ticket::Commit)))
                    }
                    Durability::Deferred => {
                        if opened_here && conn.flusher_idle && self.session.is_some() {
                            conn.flusher_idle = false;
                            self.wake.notify_one();
                        }
                        Ok((value, None))
                    }
                }
            }
        }
    }

    /// Commit the open transaction, if any, without syncing it. Returns the number of
    /// the commit, on a file, to wait for with [`Shared::wait_durable`]: the last commit
    /// made if there was nothing to commit.
    fn commit(&self, conn: &mut Conn) -> Result<Option<u64>, Error> {
        let last = || {
            self.syncer
                .as_ref()
                .map(|s| s.committed.load(Ordering::Acquire))
        };
        if conn.batch.is_none() {
            return Ok(last());
        }
        match run(&conn.db, "COMMIT") {
            Ok(()) => {
                let batch = conn.batch.take().map_or(0, |batch| batch.id);
                Ok(self.syncer.as_ref().map(|s| {
                    let commit = s.committed.fetch_add(1, Ordering::AcqRel) + 1;
                    s.batch_committed.store(batch, Ordering::Release);
                    s.joined.store(0, Ordering::Release);
                    commit
                }))
            }
            Err(error) => {
                if !conn.db.is_autocommit() {
                    let _ = run(&conn.db, "ROLLBACK");
                }
                self.lose_batch(conn, "its commit failed");
                Err(error.into())
            }
        }
    }

    /// After an error outside the closure: if SQLite ended the transaction, account for it.
    fn after_error(&self, conn: &mut Conn) {
        if conn.batch.is_some() && conn.db.is_autocommit() {
            self.lose_batch(conn, "a statement failed");
        }
    }

    fn lose_batch(&self, conn: &mut Conn, why: &str) {
        let Some(batch) = conn.batch.take() else {
            return;
        };
        if let Some(syncer) = &self.syncer
            && syncer.joined.swap(0, Ordering::AcqRel) > 0
        {
            syncer.lost(batch.id, why);
        }
        conn.known.forget();
        warn!(
            why,
            ids = batch.handed_out.len(),
            "uncommitted writes were lost; their records fall back to the last committed state"
        );
        for (gatekeeper, id) in batch.handed_out {
            let floor = conn.floors.entry(gatekeeper).or_default();
            *floor = (*floor).max(id);
        }
    }

    /// This process's session id, recorded in the claims it takes (`None` in memory).
    pub(crate) fn session_id(&self) -> Option<&str> {
        self.session.as_ref().map(Session::id)
    }

    /// Whether another process (or another handle of this one) has the file open. In
    /// memory, never.
    pub(crate) fn others_alive(&self) -> bool {
        self.session
            .as_ref()
            .is_some_and(|s| session::others_alive(s.dir(), s.id()))
    }

    /// Whether the session that took a claim is still alive.
    pub(crate) fn claimant_alive(&self, claimed_by: Option<&str>) -> bool {
        match (&self.session, claimed_by) {
            // In memory there is one connection, one process: every claim is ours.
            (None, _) => true,
            // A claim without a session was taken by no live process we can know of.
            (Some(_), None) => false,
            (Some(session), Some(id)) => session::is_alive(session.dir(), id, session.id()),
        }
    }

    pub(crate) fn locked_down_cached(&self) -> bool {
        self.locked_down.load(Ordering::Acquire)
    }

    pub(crate) fn remember_locked_down(&self) {
        self.locked_down.store(true, Ordering::Release);
    }
}

/// How many windows in a row without a new transaction the flusher keeps watching on a
/// deadline before it waits to be woken instead (about a second). While transactions keep
/// opening, as they do in a busy process, it looks every [`DEFERRED_COMMIT_WINDOW`] and
/// nobody has to wake it: waking it for each transaction cost a system call, and often a
/// contended connection mutex, per stage.
const FLUSHER_WATCHES: u32 = 100;

/// The flusher: commits a deferred transaction nobody else committed in time.
fn flusher(shared: Arc<Shared>) {
    let mut guard = shared.lock();
    // The last transaction seen opened, and windows since one was.
    let mut seen = guard.batches;
    let mut quiet = 0;
    loop {
        if guard.closed {
            return;
        }
        if guard.batches != seen {
            seen = guard.batches;
            quiet = 0;
        }
        let due = guard
            .batch
            .as_ref()
            .map(|b| b.opened + DEFERRED_COMMIT_WINDOW);
        match due {
            None if quiet >= FLUSHER_WATCHES => {
                guard.flusher_idle = true;
                guard = shared.wake.wait(guard).unwrap_or_else(|p| p.into_inner());
                quiet = 0;
            }
            None => {
                quiet += 1;
                guard = shared
                    .wake
                    .wait_timeout(guard, DEFERRED_COMMIT_WINDOW)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|p| p.into_inner().0);
            }
            Some(due) => {
                let now = Instant::now();
                if now >= due {
                    if let Err(error) = shared.commit(&mut guard) {
                        let error = shared.sorted(error);
                        warn!(%error, "deferred writes could not be committed");
                    }
                } else {
                    guard = shared
                        .wake
                        .wait_timeout(guard, due - now)
                        .map(|(g, _)| g)
                        .unwrap_or_else(|p| p.into_inner().0);
                }
            }
        }
    }
}

struct Handle {
    shared: Arc<Shared>,
    flusher: Option<JoinHandle<()>>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        let commit = {
            let mut conn = self.shared.lock();
            if conn.behind && conn.batch.is_some() {
                // Only the replay of a journal commits (with the journal position it
                // reached); whatever it left uncommitted is still in the journal.
                let _ = run(&conn.db, "ROLLBACK");
                conn.batch = None;
            }
            let commit = match self.shared.commit(&mut conn) {
                Ok(commit) => commit,
                Err(error) => {
                    let error = self.shared.sorted(error);
                    warn!(%error, "deferred writes could not be committed at close");
                    None
                }
            };
            conn.closed = true;
            commit
        };
        if let Some(commit) = commit
            && let Err(error) = self.shared.wait_durable(Ticket::Commit(commit), true)
        {
            warn!(%error, "commits could not be made durable at close");
        }
        self.shared.wake.notify_all();
        if let Some(flusher) = self.flusher.take() {
            let _ = flusher.join();
        }
    }
}

/// One SQLite database holding every durable record of a workspace: the kernel's ledger,
/// the drivers' action stores and their key-value records.
///
/// Cheap to clone; clones and the adapters made from it share one connection (behind a
/// mutex) and one flusher thread. Several processes may open the same file: each sees
/// the others' committed writes, and writers wait for each other (up to
/// [`BUSY_TIMEOUT`]) instead of failing with "database is locked".
#[derive(Clone)]
pub struct Database {
    handle: Arc<Handle>,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database")
            .field("path", &self.handle.shared.path)
            .finish_non_exhaustive()
    }
}

impl Database {
    /// Open (or create) the database file at `path`.
    ///
    /// Before anything is written, the path and the file are checked: that it is a regular
    /// file (or nothing yet), that it is an SQLite database at all, that it is ours
    /// (`application_id`), that its schema is not newer than this build (`user_version`)
    /// and its tables are those of its version, that it is not shorter than its header
    /// says, and that its location can be written. Any failure is a clear [`StoreError`],
    /// leaves the file untouched, and leaves nothing next to it that this call created.
    ///
    /// Opening reads a fixed handful of pages, never the whole file: a full check of
    /// every page is an explicit step, [`crate::LedgerReader::check_integrity`].
    ///
    /// Then: write-ahead logging (`synchronous=NORMAL`, with the log synced by this
    /// handle after every durable commit: see the module docs), the schema if the file
    /// is new, and the ledger reconciled with the action stores (see the crate docs).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_as(path.as_ref(), false)
    }

    /// [`Database::open`] for bringing in an older daemon's redo journal (`upgrade.rs`):
    /// the same checks and schema, but every write is deferred and nothing is committed
    /// except by [`Database::flush`]; no flusher thread, and the ledger is not reconciled
    /// (the journal's replay comes first).
    pub(crate) fn open_behind(path: &Path) -> Result<Self, StoreError> {
        Self::open_as(path, true)
    }

    fn open_as(path: &Path, behind: bool) -> Result<Self, StoreError> {
        let path = path.to_path_buf();
        // A redo journal that an older daemon left (killed before it wrote the journal
        // into the file) is brought in first (`upgrade.rs`).
        let journal = crate::upgrade::journal_path(&path);
        if !behind && journal.exists() {
            crate::upgrade::bring_in(&path, &journal)?;
        }
        // Before SQLite touches anything: a directory, a device or a pipe is refused
        // here, so nothing (a journal, the session locks) is created next to it.
        check_regular_file(&path, true)?;
        let sessions = session::sessions_dir(&path);
        if sessions.exists() && !sessions.is_dir() {
            return Err(StoreError::InTheWay {
                path: sessions,
                detail:
                    "it must be the directory of this database's session locks, and it is a file"
                        .into(),
            });
        }
        // What a refused open must not leave behind: whatever it created.
        let created: Vec<PathBuf> = [
            path.clone(),
            sidecar(&path, "-wal"),
            sidecar(&path, "-shm"),
            sidecar(&path, "-journal"),
            sessions.clone(),
        ]
        .into_iter()
        .filter(|p| !p.exists())
        .collect();
        match Self::open_checked(path, behind) {
            Ok(database) => Ok(database),
            Err(error) => {
                // Another process may have opened the file meanwhile (its session lock
                // would be in the directory): then what was created is its, not ours.
                let shared_meanwhile = std::fs::read_dir(&sessions)
                    .map(|mut entries| entries.next().is_some())
                    .unwrap_or(false);
                if shared_meanwhile {
                    return Err(error);
                }
                for leftover in created {
                    if leftover.is_dir() {
                        let _ = std::fs::remove_dir_all(&leftover);
                    } else {
                        let _ = std::fs::remove_file(&leftover);
                    }
                }
                Err(error)
            }
        }
    }

    fn open_checked(path: PathBuf, behind: bool) -> Result<Self, StoreError> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        // Through the layer that writes each commit's log frames in one write (see
        // `vfs.rs`); should SQLite refuse to register it, through its own.
        let db = match crate::vfs::register() {
            Ok(layer) => Connection::open_with_flags_and_vfs(&path, flags, layer),
            Err(why) => {
                warn!(%why, "log frames are written one by one");
                Connection::open_with_flags(&path, flags)
            }
        }
        .map_err(|e| open_error(e, &path))?;
        let sorted = |e: rusqlite::Error| StoreError::from_sqlite(e, Some(&path));
        db.busy_timeout(BUSY_TIMEOUT).map_err(sorted)?;
        let version = inspect_file(&db, &path)?;
        if db.is_readonly(MAIN_DB).map_err(sorted)? {
            return Err(StoreError::ReadOnly {
                path,
                detail: "the file is write-protected".into(),
            });
        }
        let session = Session::start(&path).map_err(|e| {
            let detail = format!("cannot create its session lock: {e}");
            if e.kind() == std::io::ErrorKind::PermissionDenied || e.raw_os_error() == Some(30) {
                StoreError::ReadOnly {
                    path: path.clone(),
                    detail,
                }
            } else {
                StoreError::CannotOpen {
                    path: path.clone(),
                    detail,
                }
            }
        })?;
        // Takes effect only on a new, empty file (an existing file keeps its page size):
        // before the first table is created and before the log is switched on.
        db.pragma_update(None, "page_size", PAGE_SIZE)
            .map_err(sorted)?;
        // Write-ahead logging: readers in other processes never block the writer, and a
        // commit is one append to the log.
        let mode: String = db
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(sorted)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::CannotOpen {
                path,
                detail: format!("write-ahead logging is not available here (journal mode {mode})"),
            });
        }
        // synchronous=NORMAL: SQLite does not fsync the log at each commit (it still
        // syncs around checkpoints, so the file stays whole). This module syncs the log
        // itself after the commits that must be durable, outside the connection's mutex,
        // so concurrent writers share syncs, and an outcome needs none of its own (see
        // the module docs). A claim is still on disk before its call is sent.
        db.pragma_update(None, "synchronous", "NORMAL")
            .map_err(sorted)?;
        let database = Self::start(db, Some(path), Some(session), version, behind)?;
        Ok(database)
    }

    /// A database in memory: same schema and rules, gone when the last handle drops.
    /// Lectures and tests use it. There is nothing to make durable, so writes share
    /// transactions of a few hundred (see the module docs); every claim belongs to this
    /// process.
    pub fn open_in_memory() -> Result<Self, StoreError> {
        let db = Connection::open_in_memory().map_err(|e| StoreError::from_sqlite(e, None))?;
        Self::start(db, None, None, 0, false)
    }

    fn start(
        mut db: Connection,
        path: Option<PathBuf>,
        session: Option<Session>,
        version: i64,
        behind: bool,
    ) -> Result<Self, StoreError> {
        let sorted = |e: rusqlite::Error| StoreError::from_sqlite(e, path.as_deref());
        db.set_prepared_statement_cache_capacity(128);
        // Query-planner stability: plans do not depend on bound values. Without it, a
        // parameter compared against a partial index's condition makes SQLite re-prepare
        // the statement at every bind (with STAT4 compiled in), several microseconds each.
        db.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
            true,
        )
        .map_err(sorted)?;
        let commits = Arc::new(AtomicU64::new(0));
        let counter = commits.clone();
        db.commit_hook(Some(move || {
            counter.fetch_add(1, Ordering::Relaxed);
            false
        }))
        .map_err(sorted)?;
        if version == 0 {
            create_schema(&db).map_err(sorted)?;
            info!(path = ?path, "database created");
        } else if version < SCHEMA_VERSION {
            upgrade(&db).map_err(sorted)?;
            info!(path = ?path, from = version, to = SCHEMA_VERSION, "database upgraded");
        }
        let file_backed = session.is_some();
        // After the schema: its creation or upgrade is made durable by the first sync.
        let syncer = match (&path, file_backed) {
            (Some(path), true) => Some(Syncer::open(path).map_err(|e| StoreError::CannotOpen {
                path: path.clone(),
                detail: format!("cannot sync its write-ahead log: {e}"),
            })?),
            _ => None,
        };
        let shared = Arc::new(Shared {
            conn: Mutex::new(Conn {
                db,
                batch: None,
                closed: false,
                flusher_idle: false,
                floors: HashMap::new(),
                coalesce: !file_backed,
                in_memory: !file_backed,
                behind,
                known: Known::default(),
                batches: 0,
            }),
            wake: Condvar::new(),
            commits,
            syncer,
            path,
            session,
            locked_down: AtomicBool::new(false),
        });
        let flusher = if file_backed && !behind {
            let for_thread = shared.clone();
            Some(
                std::thread::Builder::new()
                    .name("store-sqlite-flusher".into())
                    .spawn(move || flusher(for_thread))
                    .map_err(|e| StoreError::CannotOpen {
                        path: shared.path.clone().unwrap_or_default(),
                        detail: format!("cannot start the commit thread: {e}"),
                    })?,
            )
        } else {
            None
        };
        let database = Self {
            handle: Arc::new(Handle { shared, flusher }),
        };
        if file_backed && !behind {
            let reconciled = crate::recover::reconcile(&database)?;
            if reconciled > 0 {
                info!(
                    reconciled,
                    "ledger brought up to date with the action stores"
                );
            }
        }
        Ok(database)
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.handle.shared
    }

    /// The file, or `None` in memory.
    pub fn path(&self) -> Option<&Path> {
        self.handle.shared.path.as_deref()
    }

    /// How many transactions this handle has committed since it was opened (counted by
    /// SQLite's commit hook). Tests and benchmarks use it to check what each step costs.
    pub fn commits(&self) -> u64 {
        self.handle.shared.commits.load(Ordering::Relaxed)
    }

    /// Commit deferred writes now instead of within [`DEFERRED_COMMIT_WINDOW`], and make
    /// every commit so far durable.
    pub fn flush(&self) -> Result<(), StoreError> {
        let shared = self.shared();
        let commit = {
            let mut conn = shared.lock();
            shared.commit(&mut conn).map_err(|e| shared.sorted(e))?
        };
        match commit {
            Some(commit) => shared.wait_durable(Ticket::Commit(commit), true),
            None => Ok(()),
        }
    }

    /// How many times this handle has synced the write-ahead log (0 in memory). A durable
    /// write costs at most one; concurrent ones share them (see the `db` module docs).
    /// Tests and benchmarks use it to check what each step costs.
    pub fn syncs(&self) -> u64 {
        self.handle
            .shared
            .syncer
            .as_ref()
            .map_or(0, |s| s.syncs.load(Ordering::Relaxed))
    }

    /// Cap the database at about `bytes` (rounded down to whole pages, and never below
    /// its current size). A write that would grow it further fails with
    /// [`StoreError::Full`] and records nothing, as on a full disk. Returns the cap.
    pub fn limit_size(&self, bytes: u64) -> Result<u64, StoreError> {
        let shared = self.shared();
        {
            // From now on a commit may fail for want of space: stop batching in memory,
            // so such a failure loses only the write that caused it.
            let mut conn = shared.lock();
            shared.commit(&mut conn).map_err(|e| shared.sorted(e))?;
            conn.coalesce = false;
        }
        shared.read(|db| {
            let page: i64 = db.query_row("PRAGMA page_size", [], |r| r.get(0))?;
            let pages = (bytes / page.max(1) as u64).max(1);
            let set: i64 = db.query_row(&format!("PRAGMA max_page_count = {pages}"), [], |r| {
                r.get(0)
            })?;
            Ok(set as u64 * page as u64)
        })
    }

    /// Run a read-only SQL query and return each row's columns as text (`NULL` as
    /// `None`). For tests, documentation and ad-hoc audits; the ledger's columns are
    /// described in `docs/sql-queries.md`.
    pub fn query_text(&self, sql: &str) -> Result<Vec<Vec<Option<String>>>, StoreError> {
        self.shared().read(|db| {
            let mut statement = db.prepare(sql)?;
            if !statement.readonly() {
                return Err(StoreError::NotReadOnly.into());
            }
            let columns = statement.column_count();
            let rows = statement.query_map([], |row| {
                (0..columns)
                    .map(|i| {
                        let value: rusqlite::types::Value = row.get(i)?;
                        Ok(match value {
                            rusqlite::types::Value::Null => None,
                            rusqlite::types::Value::Integer(i) => Some(i.to_string()),
                            rusqlite::types::Value::Real(f) => Some(f.to_string()),
                            rusqlite::types::Value::Text(t) => Some(t),
                            rusqlite::types::Value::Blob(b) => Some(format!("<{} bytes>", b.len())),
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
    }
}

/// Sort an error met while opening: "cannot open" in a location that refuses writes is
/// a read-only location.
fn open_error(error: rusqlite::Error, path: &Path) -> StoreError {
    match StoreError::from_sqlite(error, Some(path)) {
        StoreError::CannotOpen { path, detail } if !writable_dir(&path) => {
            StoreError::ReadOnly { path, detail }
        }
        other => other,
    }
}

/// Whether the directory of `path` can take new files. A directory that does not exist
/// counts as writable: that failure is "cannot open", not "read-only".
fn writable_dir(path: &Path) -> bool {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    match std::fs::metadata(dir) {
        Ok(meta) => !meta.permissions().readonly() && tempfile_probe(dir),
        Err(_) => true,
    }
}

fn tempfile_probe(dir: &Path) -> bool {
    let probe = dir.join(format!(".store-sqlite-probe-{}", std::process::id()));
    match std::fs::File::create(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            true
        }
        Err(_) => false,
    }
}

/// `path` with `suffix` appended to its file name (`-wal`, `-shm`, …).
pub(crate) fn sidecar(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Refuse a path that names something other than a regular file (a directory, a device,
/// a pipe, a socket) before SQLite opens it. A path that does not exist passes when
/// `may_create`, and is "cannot open" otherwise.
pub(crate) fn check_regular_file(path: &Path, may_create: bool) -> Result<(), StoreError> {
    use std::os::unix::fs::FileTypeExt;
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound && may_create => {
            return Ok(());
        }
        Err(error) => {
            return Err(StoreError::CannotOpen {
                path: path.to_path_buf(),
                detail: error.to_string(),
            });
        }
    };
    let kind = meta.file_type();
    let what = if kind.is_file() {
        return Ok(());
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_fifo() {
        "a named pipe"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    };
    Err(StoreError::NotAFile {
        path: path.to_path_buf(),
        what,
    })
}

/// Check an opened file without writing to it. Returns its schema version (0: empty).
///
/// It reads the header, the schema and one path of the ledger's tree, never the whole
/// file: the time it takes does not grow with the file. A full check of every page is
/// [`crate::LedgerReader::check_integrity`].
pub(crate) fn inspect_file(db: &Connection, path: &Path) -> Result<i64, StoreError> {
    let sorted = |e: rusqlite::Error| open_error(e, path);
    let application: i64 = db
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .map_err(sorted)?;
    let version: i64 = db
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(sorted)?;
    let objects: i64 = db
        .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
        .map_err(sorted)?;
    if application != 0 && application != APPLICATION_ID {
        return Err(StoreError::Foreign {
            path: path.to_path_buf(),
            detail: format!("its application id is {application:#x}"),
        });
    }
    if version > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            path: path.to_path_buf(),
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    if objects > 0 && (application != APPLICATION_ID || version == 0) {
        return Err(StoreError::Foreign {
            path: path.to_path_buf(),
            detail: "it already holds tables this build did not create".into(),
        });
    }
    if objects == 0 {
        return Ok(version);
    }
    if version == SCHEMA_VERSION {
        for (table, column) in EXPECTED_COLUMNS {
            let present: bool = db
                .query_row(
                    "SELECT EXISTS (SELECT 1 FROM pragma_table_xinfo(?1) WHERE name = ?2)",
                    [table, column],
                    |r| r.get(0),
                )
                .map_err(sorted)?;
            if !present {
                return Err(StoreError::SchemaMismatch {
                    path: path.to_path_buf(),
                    version,
                    detail: format!("{table} has no column {column}"),
                });
            }
        }
        for (table, text) in EXPECTED_SQL {
            let present: bool = db
                .query_row(
                    "SELECT EXISTS (SELECT 1 FROM sqlite_schema
                         WHERE name = ?1 AND instr(sql, ?2) > 0)",
                    [table, text],
                    |r| r.get(0),
                )
                .map_err(sorted)?;
            if !present {
                return Err(StoreError::SchemaMismatch {
                    path: path.to_path_buf(),
                    version,
                    detail: format!("the definition of {table} lacks {text}"),
                });
            }
        }
    }
    // A truncated file: shorter than its header says. (Pages may also live in the
    // write-ahead log, so only without one.)
    let wal_len = std::fs::metadata(sidecar(path, "-wal")).map_or(0, |m| m.len());
    if wal_len == 0 {
        let (pages, page_size): (i64, i64) = db
            .query_row(
                "SELECT page_count, page_size FROM pragma_page_count, pragma_page_size",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(sorted)?;
        let expected = u64::try_from(pages.saturating_mul(page_size)).unwrap_or(0);
        let len = std::fs::metadata(path).map_or(expected, |m| m.len());
        if len < expected {
            return Err(StoreError::Corrupt {
                path: path.to_path_buf(),
                detail: format!(
                    "the file has {len} bytes where its header promises {expected}: it was truncated"
                ),
            });
        }
    }
    // One root-to-leaf path of the ledger: its newest page, which every open reads anyway.
    db.query_row("SELECT max(id) FROM ledger", [], |r| {
        r.get::<_, Option<i64>>(0)
    })
    .map_err(sorted)?;
    debug!(?path, version, "database checked");
    Ok(version)
}

fn create_schema(db: &Connection) -> rusqlite::Result<()> {
    db.execute_batch("BEGIN IMMEDIATE")?;
    // Another process may have created it while this one was checking the empty file.
    let version: i64 = db.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version != 0 {
        return db.execute_batch("COMMIT");
    }
    let created = crate::schema::create(db).and_then(|()| {
        db.pragma_update(None, "application_id", APPLICATION_ID)?;
        db.pragma_update(None, "user_version", SCHEMA_VERSION)
    });
    match created {
        Ok(()) => db.execute_batch("COMMIT"),
        Err(error) => {
            let _ = db.execute_batch("ROLLBACK");
            Err(error)
        }
    }
}

fn upgrade(db: &Connection) -> rusqlite::Result<()> {
    db.execute_batch("BEGIN IMMEDIATE")?;
    // Another process may have upgraded it while this one was checking the file.
    let version: i64 = db.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version >= SCHEMA_VERSION {
        return db.execute_batch("COMMIT");
    }
    match crate::schema::upgrade(db, version) {
        Ok(()) => db.execute_batch("COMMIT"),
        Err(error) => {
            let _ = db.execute_batch("ROLLBACK");
            Err(error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One durable write: a row of scope `t` under `key`.
    fn durable_insert(db: &Database, key: &str) -> Result<(), StoreError> {
        db.shared().write(Durability::Now, Steps::One, |conn| {
            conn.db.execute(
                "INSERT INTO kv (scope, key, value) VALUES ('t', ?1, x'00')",
                [key],
            )?;
            Ok(())
        })
    }

    /// Pretend a sync is under way (so durable writes join the open transaction), run
    /// `during` once a write has joined it, then let the sync end.
    fn with_a_sync_under_way(
        db: &Database,
        key: &str,
        during: impl FnOnce(&Shared),
    ) -> Result<(), StoreError> {
        let shared = db.shared();
        let syncer = shared.syncer.as_ref().unwrap();
        syncer.state().syncing = true;
        // A durable write on its own thread, made while the sync is under way.
        let writer = {
            let (db, key) = (db.clone(), key.to_owned());
            std::thread::spawn(move || durable_insert(&db, &key))
        };
        // Wait until the write sits in the open transaction, waiting for a sync.
        let deadline = Instant::now() + Duration::from_secs(10);
        while shared.joined() == 0 {
            assert!(
                Instant::now() < deadline,
                "the write never joined the open transaction"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        during(shared);
        syncer.state().syncing = false;
        syncer.done.notify_all();
        writer.join().unwrap()
    }

    fn temp_db(label: &str) -> (PathBuf, Database) {
        let dir = crate::temp_dir(label);
        let db = Database::open(dir.join("gate.db")).unwrap();
        (dir, db)
    }

    #[test]
    fn a_durable_write_that_joined_an_open_transaction_returns_once_it_is_committed_and_synced() {
        let (dir, db) = temp_db("joined");
        let shared = db.shared();
        let syncer = shared.syncer.as_ref().unwrap();
        let (commits, syncs) = (db.commits(), db.syncs());
        with_a_sync_under_way(&db, "joined", |shared| {
            // Nothing is committed while the write waits.
            assert_eq!(shared.commits.load(Ordering::Relaxed), commits);
        })
        .unwrap();
        assert_eq!(
            db.commits(),
            commits + 1,
            "the waiting write's leader committed it"
        );
        assert_eq!(db.syncs(), syncs + 1);
        assert!(syncer.state().synced >= syncer.committed.load(Ordering::Acquire));
        drop(db);
        let reopened = Database::open(dir.join("gate.db")).unwrap();
        assert_eq!(
            reopened
                .query_text("SELECT key FROM kv WHERE scope = 't'")
                .unwrap(),
            [[Some("joined".to_owned())]]
        );
        drop(reopened);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_durable_write_whose_shared_transaction_is_lost_is_told_it_was_not_recorded() {
        let (dir, db) = temp_db("lost");
        let result = with_a_sync_under_way(&db, "lost", |shared| {
            // The transaction is lost before anyone commits it (as when a later write in
            // it fails and SQLite rolls it back).
            let mut conn = shared.lock();
            run(&conn.db, "ROLLBACK").unwrap();
            shared.lose_batch(&mut conn, "a later write failed");
        });
        let error = result.unwrap_err();
        assert!(
            matches!(error, StoreError::NotCommitted { .. }),
            "{error:?}"
        );
        assert!(
            error.to_string().contains("a later write failed"),
            "{error}"
        );
        // Nothing of it is there, and the database goes on.
        assert!(
            db.query_text("SELECT key FROM kv WHERE scope = 't'")
                .unwrap()
                .is_empty()
        );
        durable_insert(&db, "after").unwrap();
        drop(db);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn no_durable_write_returns_before_a_sync_covers_its_commit_and_concurrent_ones_share_syncs() {
        const THREADS: u64 = 8;
        const EACH: u64 = 30;
        let (dir, db) = temp_db("group");
        let before = db.syncs();
        std::thread::scope(|scope| {
            for thread in 0..THREADS {
                let db = db.clone();
                scope.spawn(move || {
                    let shared = db.shared();
                    let syncer = shared.syncer.as_ref().unwrap();
                    for n in 0..EACH {
                        let commit = shared
                            .write(Durability::Now, Steps::One, |conn| {
                                conn.db.execute(
                                    "INSERT INTO kv (scope, key, value) VALUES ('t', ?1, x'00')",
                                    [format!("{thread}-{n}")],
                                )?;
                                // The connection's mutex is held: this write's commit is
                                // the next one counted.
                                Ok(syncer.committed.load(Ordering::Acquire) + 1)
                            })
                            .unwrap();
                        assert!(
                            syncer.state().synced >= commit,
                            "a durable write returned before a sync covered commit {commit}"
                        );
                    }
                });
            }
        });
        let syncs = db.syncs() - before;
        assert!(syncs >= 1);
        assert!(
            syncs < THREADS * EACH,
            "{} durable writes from {THREADS} threads took {syncs} syncs: none was shared",
            THREADS * EACH
        );
        drop(db);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_new_file_gets_small_pages_and_an_existing_file_keeps_its_own() {
        let (dir, db) = temp_db("pages");
        durable_insert(&db, "new").unwrap();
        let page_size = |path: &Path| -> i64 {
            rusqlite::Connection::open(path)
                .unwrap()
                .query_row("PRAGMA page_size", [], |r| r.get(0))
                .unwrap()
        };
        let path = db.path().unwrap().to_owned();
        drop(db);
        assert_eq!(page_size(&path), PAGE_SIZE);
        // A file made with SQLite's default pages (as every file before this one was).
        {
            let raw = rusqlite::Connection::open(&path).unwrap();
            raw.execute_batch(
                "PRAGMA journal_mode = DELETE; PRAGMA page_size = 4096; VACUUM; \
                 PRAGMA journal_mode = WAL;",
            )
            .unwrap();
        }
        assert_eq!(page_size(&path), 4096);
        let db = Database::open(&path).unwrap();
        durable_insert(&db, "old").unwrap();
        assert_eq!(
            db.query_text("SELECT count(*) FROM kv WHERE scope = 't'")
                .unwrap(),
            [[Some("2".to_owned())]]
        );
        drop(db);
        assert_eq!(
            page_size(&path),
            4096,
            "an existing file is never rewritten"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

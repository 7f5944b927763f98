//! The redo journal of the journaled store: an append-only log of records in one
//! preallocated file beside the database, synced with group commit, that the store's
//! applier replays into SQLite in the background.
//!
//! # What it is for
//!
//! A write of the journaled store is durable once its record is synced here; SQLite
//! receives it later, from the applier thread (which the caller owns: this module starts
//! no thread). Records are opaque bytes. The journal numbers them (`seq`, consecutive),
//! buffers their frames in the process, writes the buffer to the file in one `pwrite`
//! when a caller needs a record written ([`Journal::write_through`]: a process crash then
//! keeps it) or synced ([`Journal::sync_through`]: a power cut then keeps it), and queues
//! a typed item per record for the applier, in the same order, under the same lock.
//!
//! # The file
//!
//! Frames are packed back to back from offset 0, each:
//!
//! | field | size | what |
//! |---|---|---|
//! | `len` | 4, little-endian | the payload's length in bytes, never 0 |
//! | `seq` | 8, little-endian | the record's number |
//! | `crc` | 4, little-endian | CRC-32 (`crc32fast`) of the 8 `seq` bytes followed by the payload |
//! | payload | `len` | the record |
//!
//! The file is preallocated to [`RING`] bytes of zeros written for real (not reserved
//! with `fallocate`: on ext4 a write over written blocks syncs without the extent-tree
//! update a write over unwritten ones needs), then synced with its directory. Writes
//! past that size are allowed and grow the file.
//!
//! Opening reads the *chain*: frames from offset 0 for as long as the header fits in the
//! file, `len` is not 0, the payload fits in the file, the checksum matches, and each
//! frame after the first carries the previous frame's `seq` plus one. The first frame
//! that fails any of these ends the chain; what follows it is ignored (zeros of the
//! preallocation, a torn write, or frames of an older round).
//!
//! # Rounds
//!
//! Writing starts at offset 0 ([`Journal::start_round`]) and starts over there
//! ([`Journal::restart`]) once the applier has made every record so far durable in the
//! database, which it does when the write offset passes half of [`RING`]
//! ([`Journal::wants_restart`]). So the file stays about [`RING`] bytes long, and a new
//! round overwrites the old one in place. Numbers go on across rounds: a round's first
//! record follows the previous round's last.
//!
//! # What a crash keeps
//!
//! Each `seq` is written once, at one offset, ever: numbers only grow, and a round's
//! frames are contiguous from offset 0. A chain that starts with `seq` *s* at offset 0
//! therefore holds frames of *s*'s round only, each the true frame of its number (its
//! checksum says the bytes are whole), in the order they were appended: the next frame
//! of the round is the only one that can sit at the end of a frame and carry the next
//! number, and frames of older rounds carry smaller numbers. Hence:
//!
//! - after a process crash, every record written (by [`Journal::write_through`] or
//!   [`Journal::sync_through`]) in the current round is in the chain: the page cache
//!   keeps what `pwrite` handed it;
//! - after a power cut, every record a completed `fdatasync` covered is in the chain.
//!   Records written but not synced may be there or not, as a prefix: a frame whose
//!   bytes did not all reach the disk fails its checksum (short of a CRC-32 collision)
//!   and ends the chain, even if later frames did reach it;
//! - while the current round has no frame on disk (none written yet, or the first lost
//!   in a power cut), the chain is a prefix of the previous round, whose records were
//!   all durable in the database before the new round began. The caller skips records
//!   the database already has, by number.
//!
//! This rests on what the caller promises: [`Journal::start_round`] gets a number above
//! every number ever written to the file (above the chain's last and the database's last
//! applied record, since [`Journal::restart`] makes every earlier round durable in the
//! database first), and `make_durable` in [`Journal::restart`] returns only once its
//! records are durable in the database.
//!
//! # Group commit, and the applier's pace
//!
//! One caller syncs at a time (the leader), outside the lock; every record written before
//! its sync began is covered by it, and callers arriving meanwhile wait for the next. A
//! lone caller syncs at once. When the last sync was for more than one caller, the next
//! leader waits until [`GATHER`] after the last sync began, so that concurrent sessions
//! share syncs between several actions instead of each syncing alone.
//!
//! With a syncer ([`Journal::run_syncer`], on a thread of the store's), a caller that is
//! not alone (others wait, or the last sync was for several callers) leaves its sync to
//! it and is woken by the first sync that covers its record: a task on an async runtime
//! without blocking a thread ([`Journal::wait_synced`]), a thread parked on the word of
//! that sync, which wakes every thread it covered in one system call
//! ([`Journal::sync_through`]). The syncer starts the next sync as soon as one ends with
//! callers still waiting, and wakes only those each sync covered. A lone caller still
//! leads its own sync: handing it over would cost it two wake-ups of another thread. So
//! no worker of a runtime blocks in a sync that many share, no time passes electing the
//! next leader among callers that wait for a processor, and a sync's end does not wake
//! every waiter to find most of them still waiting.
//!
//! Appending makes no system call: the applier takes the queued records at most every
//! [`APPLY_EVERY`], and earlier only for a long queue, a journal past half its ring, or a
//! caller waiting for it ([`Journal::wait_applied`]). Taking several milliseconds' records
//! at once lets most of an action's records fold into one write per row (`fold.rs`).
//!
//! A failed write or sync is sticky, as in `db.rs`: the caller is told its record failed,
//! and every later call is refused, since a disk that failed to sync cannot be trusted to
//! have kept what the next sync would report.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::task::Waker;

/// The size the file is preallocated to, in bytes; a round starts over at offset 0 once
/// its writes pass half of it (see [`Journal::wants_restart`]).
pub(crate) const RING: u64 = 1 << 20;

/// How long the applier lets records queue between two batches when nothing calls for
/// it sooner (see [`Journal::take_queued`]). With sixteen sessions, a quarter of the
/// records folded away at 1 ms (`fold.rs`; a cycle folded whole loses two thirds of its)
/// and 40% at 5–6 ms, and the processor time per action fell by a fifth. From 5 to 20 ms
/// the folding gains little more, but each commit writes every page it touched to
/// SQLite's log whole, and the hot pages (the tables' last leaves) once per commit: the
/// applier's log writes fell from about 3.0 to 2.0 KiB per action under sixteen tasks,
/// the disk's from 6.0 to 4.6 KiB, and the journal's syncs, which share that disk, got
/// faster (sixteen sessions 10–20% more actions per second, alternated; 40 ms was no
/// better than 20). A reader of the file on another connection is at most this far
/// behind ([`crate::Journaled::flush`] catches up); this process's reads never are.
pub(crate) const APPLY_EVERY: std::time::Duration = std::time::Duration::from_millis(20);

/// While callers sync concurrently (the last sync was for more than one), how long after
/// the last sync began the next one waits, so that more records share it. A lone caller
/// never waits. It bites only when a sync under load takes less than this (on a slow
/// disk, the next sync is due as soon as the last ends). Shorter is faster and syncs
/// more: on one quiet day, taken turn about with one session, sixteen tasks reached
/// 4.72–5.18 × one task's throughput at 0.26–0.30 syncs per action with 100 µs (fifteen
/// runs), 4.39–4.84 × at 0.21–0.26 with 150 µs (eight) and 4.42–4.62 × at 0.19–0.23 with
/// 200 µs (seven; alternated, threads 3.2–3.9 × throughout, at 0.21–0.31 syncs); with no
/// gathering, about 0.4 syncs per action. Those waits overshot by up to 50 µs (the
/// system's default timer slack, which the syncer's thread now sets to 1 µs,
/// `journaled.rs`). With that, on a day a raw 4 KiB write and sync took 100 µs, three
/// alternations gave: 200 µs, tasks 4.56–4.62 ×, threads 3.73–3.90 ×, 0.16–0.19 syncs
/// per action; 150 µs, 4.64–4.87 × and 3.82–4.10 × at 0.19–0.21; 120 µs, 4.79–4.88 × and
/// 3.95–4.13 × (six runs) at 0.20–0.24; 100 µs, 4.97–5.16 × and 3.87–4.12 × at
/// 0.21–0.26. 120 µs keeps both targets (at least four times one session's throughput,
/// at most 0.3 syncs per action) with the fewest syncs that reach them.
pub(crate) const GATHER: std::time::Duration = std::time::Duration::from_micros(120);

/// How many queued records wake the applier before its next batch is due (about seven
/// hundred actions' records: a bound on the queue, well past what [`APPLY_EVERY`] gathers
/// from sixteen sessions, about 1,200 records).
const WAKE_AT: usize = 4096;

/// The size of a frame's header: `len` (4), `seq` (8), `crc` (4).
const HEADER: usize = 16;

/// How many zeros preallocation writes per call.
const ZEROS: usize = 64 * 1024;

/// A record read back from the file: its number and its payload.
pub(crate) type Record = (u64, Vec<u8>);

/// Why the journal refused or failed an operation.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum JournalError {
    /// Another process holds the journal's lock (`File::try_lock` would block).
    #[error(
        "{path} is in use by another process (another `gate serve` on the same data directory?); stop it first"
    )]
    Busy {
        /// The journal file.
        path: PathBuf,
    },
    /// Opening, reading, writing or syncing the file failed. Once a write or sync failed,
    /// every later call fails with the same error (sticky: a disk that failed to sync
    /// cannot be trusted to have kept what the next sync would report).
    #[error(
        "cannot use the journal at {path} ({detail}); nothing more is written to it: check the disk and the file's permissions, then start again (what was synced is replayed)"
    )]
    Io {
        /// The journal file.
        path: PathBuf,
        /// What was being done, and what the operating system said.
        detail: String,
    },
    /// The journal was shut down with [`Journal::fail`] (the applier could not keep up,
    /// or failed), or it was closed.
    #[error(
        "the journal at {path} was shut down ({detail}); nothing more is accepted: start again (what was synced is replayed)"
    )]
    Failed {
        /// The journal file.
        path: PathBuf,
        /// Why it was shut down.
        detail: String,
    },
}

/// What the journal's lock guards.
struct State<T> {
    /// [`Journal::start_round`] was called: appending is allowed.
    started: bool,
    /// The number the next record gets.
    next_seq: u64,
    /// Frames appended and not yet written: those of the records after `written`, in order.
    buffer: Vec<u8>,
    /// Where the buffer is written next.
    offset: u64,
    /// Every record through this number is written to the file.
    written: u64,
    /// Every record through this number is synced.
    synced: u64,
    /// Every record through this number was applied ([`Journal::mark_applied`]).
    applied: u64,
    /// A sync is running (its caller released this lock meanwhile).
    syncing: bool,
    /// Items for the applier, in the records' order.
    queue: Vec<(u64, T)>,
    /// [`Journal::close`] was called.
    closing: bool,
    /// The sticky failure every call returns from now on.
    failed: Option<JournalError>,
    /// Callers waiting on [`Journal::sync_done`] (a wake-up with none is a wasted system call).
    sync_waiting: u32,
    /// Tasks and parked threads waiting for a record to be synced ([`Journal::wait_synced`]),
    /// each with the record's number: woken by the first sync that covers it.
    sync_wakers: Vec<(u64, Waker)>,
    /// A thread runs [`Journal::run_syncer`]: callers that are not alone leave their syncs
    /// to it.
    syncer: bool,
    /// The syncer waits on [`Journal::sync_wanted`].
    syncer_waiting: bool,
    /// The applier waits on [`Journal::queued`].
    applier_waiting: bool,
    /// Callers waiting on [`Journal::applied`].
    applied_waiting: u32,
    /// When the applier last took a batch (see [`Journal::take_queued`]).
    last_take: std::time::Instant,
    /// When the last sync began, and how many callers it was for (see [`GATHER`]).
    last_sync: Option<(std::time::Instant, u32)>,
    /// How many bytes from the start of the file the last sync covered.
    synced_len: u64,
    /// How many times [`Journal::restart`] started over: a sync that began in an earlier
    /// round covered offsets of that round, not of this one.
    round: u64,
    /// How many syncs began: the running one, if any, is this number.
    syncs_begun: u64,
    /// The last record the running sync covers, once it wrote the buffer (`None` before:
    /// it covers every record appended before it writes).
    sync_target: Option<u64>,
    /// The highest record a thread parked in [`Journal::sync_through`] waits for.
    parked_want: u64,
    /// How many threads are parked for a sync of even and of odd number (see
    /// [`Journal::parked`]).
    parked: [u32; 2],
}

/// What [`Journal::wait_synced`] found.
#[derive(Debug)]
pub(crate) enum SyncWait {
    /// The record is synced (`Ok`), or the journal failed.
    Done(Result<(), JournalError>),
    /// A sync is running; the waker given is woken when it ends.
    Waiting,
    /// No sync is running: the caller should run one.
    Lead,
}

/// The redo journal (see the module docs). Items of type `T` go to the applier's queue.
pub(crate) struct Journal<T> {
    /// The journal file, locked for this process.
    file: File,
    /// Where it is.
    path: PathBuf,
    /// Everything that moves (see [`State`]).
    state: Mutex<State<T>>,
    /// Wakes the applier in [`Journal::take_queued`].
    queued: Condvar,
    /// Wakes the callers waiting for a sync to complete.
    sync_done: Condvar,
    /// Wakes the syncer ([`Journal::run_syncer`]) when a caller leaves its sync to it.
    sync_wanted: Condvar,
    /// Wakes the callers of [`Journal::wait_applied`].
    applied: Condvar,
    /// Syncs that succeeded, for tests and benchmarks.
    syncs: AtomicU64,
    /// Writes of the buffer to the file, for tests and benchmarks.
    writes: AtomicU64,
    /// What the threads parked in [`Journal::sync_through`] wait on, for syncs of even and
    /// of odd number: a sync that ends with threads parked for it adds one to its word
    /// (under the lock) and wakes every thread waiting on the word in one system call
    /// ([`atomic_wait::wake_all`]). Two words, since the threads whose records came too
    /// late for the running sync park for the next one meanwhile.
    parked: [AtomicU32; 2],
    /// `State::synced`, for a woken thread to read without the lock.
    synced_now: AtomicU64,
    /// Whether the journal failed, for a woken thread to read without the lock.
    failed_now: AtomicBool,
}

impl<T: Send> Journal<T> {
    /// Create or open the journal at `path`, take an exclusive advisory lock on it
    /// (another process holding it: [`JournalError::Busy`]), preallocate it to [`RING`]
    /// bytes, and read the chain. Returns the journal and the chain's records as
    /// `(seq, payload)`, in order. Appending is refused until [`Journal::start_round`].
    pub(crate) fn open(path: &Path) -> Result<(Self, Vec<Record>), JournalError> {
        let io = |what: &str, error: std::io::Error| JournalError::Io {
            path: path.to_owned(),
            detail: format!("{what}: {error}"),
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| io("opening", e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(JournalError::Busy {
                    path: path.to_owned(),
                });
            }
            Err(TryLockError::Error(error)) => return Err(io("locking", error)),
        }
        let len = file
            .metadata()
            .map_err(|e| io("reading its size", e))?
            .len();
        if len < RING {
            let zeros = vec![0u8; ZEROS];
            let mut at = len;
            while at < RING {
                let n = (RING - at).min(ZEROS as u64);
                file.write_all_at(&zeros[..n as usize], at)
                    .map_err(|e| io("preallocating", e))?;
                at += n;
            }
            file.sync_all()
                .map_err(|e| io("syncing the preallocation", e))?;
            // A new file's directory entry must be durable too. A file found short was
            // created by a process that died before this point, which may not have
            // synced the directory either.
            let dir = match path.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir,
                _ => Path::new("."),
            };
            File::open(dir)
                .and_then(|dir| dir.sync_all())
                .map_err(|e| io("syncing its directory", e))?;
        }
        let mut bytes = Vec::new();
        (&file)
            .read_to_end(&mut bytes)
            .map_err(|e| io("reading", e))?;
        let records = read_chain(&bytes);
        let journal = Self {
            file,
            path: path.to_owned(),
            state: Mutex::new(State {
                started: false,
                next_seq: 1,
                buffer: Vec::new(),
                offset: 0,
                written: 0,
                synced: 0,
                applied: 0,
                syncing: false,
                queue: Vec::new(),
                closing: false,
                failed: None,
                sync_waiting: 0,
                sync_wakers: Vec::new(),
                syncer: false,
                syncer_waiting: false,
                applier_waiting: false,
                applied_waiting: 0,
                last_take: std::time::Instant::now(),
                last_sync: None,
                synced_len: 0,
                round: 0,
                syncs_begun: 0,
                sync_target: None,
                parked_want: 0,
                parked: [0, 0],
            }),
            queued: Condvar::new(),
            sync_done: Condvar::new(),
            sync_wanted: Condvar::new(),
            applied: Condvar::new(),
            syncs: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            parked: [AtomicU32::new(0), AtomicU32::new(0)],
            synced_now: AtomicU64::new(0),
            failed_now: AtomicBool::new(false),
        };
        Ok((journal, records))
    }

    /// Begin writing at offset 0, the next record numbered `next_seq`. Only valid when
    /// every record in the file is durable elsewhere, and `next_seq` is above every number
    /// ever written to the file (the caller guarantees both; see the module docs).
    ///
    /// # Panics
    ///
    /// If `next_seq` is 0.
    pub(crate) fn start_round(&self, next_seq: u64) {
        assert!(next_seq > 0, "records are numbered from 1");
        let mut state = self.state();
        state.started = true;
        state.next_seq = next_seq;
        state.buffer.clear();
        state.offset = 0;
        state.written = next_seq - 1;
        self.set_synced(&mut state, next_seq - 1);
        state.applied = next_seq - 1;
    }

    /// Give `payload` the next number, put its frame in the buffer (not written yet), and
    /// queue `(seq, item)` for the applier, both under the one lock, so the queue's order
    /// is the journal's. Wakes the applier if it waits. Makes no system call unless it
    /// wakes the applier. Fails only once the journal failed or was closed.
    ///
    /// # Panics
    ///
    /// If `payload` is empty or longer than `u32::MAX` bytes, or if no round was started.
    pub(crate) fn append(&self, payload: &[u8], item: T) -> Result<u64, JournalError> {
        assert!(!payload.is_empty(), "a journal record cannot be empty");
        let len = u32::try_from(payload.len()).expect("a journal record fits in 4 GiB");
        let mut crc = crc32fast::Hasher::new();
        let mut state = self.state();
        self.check(&state)?;
        if state.closing {
            return Err(self.closed());
        }
        assert!(
            state.started,
            "Journal::start_round must come before append"
        );
        let seq = state.next_seq;
        state.next_seq += 1;
        crc.update(&seq.to_le_bytes());
        crc.update(payload);
        state.buffer.extend_from_slice(&len.to_le_bytes());
        state.buffer.extend_from_slice(&seq.to_le_bytes());
        state
            .buffer
            .extend_from_slice(&crc.finalize().to_le_bytes());
        state.buffer.extend_from_slice(payload);
        state.queue.push((seq, item));
        // The applier looks every `APPLY_EVERY` anyway; waking it costs the appender a
        // system call, so only a long queue, or a journal past half its ring, does.
        if state.applier_waiting && Self::applier_wanted(&state) {
            self.queued.notify_one();
        }
        Ok(seq)
    }

    /// Make sure the record `seq` and every earlier one are written to the file (not
    /// synced): a process crash then keeps them. If the buffer holds `seq`, the whole
    /// buffer is written in one `pwrite` at the current offset, under the lock.
    pub(crate) fn write_through(&self, seq: u64) -> Result<(), JournalError> {
        let mut state = self.state();
        self.check(&state)?;
        if state.written >= seq {
            return Ok(());
        }
        self.write_buffer(&mut state)
    }

    /// Make sure the record `seq` and every earlier one are written and synced
    /// (`fdatasync`) before returning. Group commit: one caller syncs at a time (the
    /// leader), outside the lock, and every record written before its sync began is
    /// covered by it; callers arriving meanwhile wait and then sync once for all of them.
    /// A failed sync fails the journal (sticky), and every waiter gets the error.
    ///
    /// With a syncer ([`Journal::run_syncer`]), a caller that is not alone parks until the
    /// first sync that covers its record ends, and leaves that sync to the syncer, which
    /// starts the next sync as soon as one ends with callers still waiting. The caller
    /// knows which sync covers its record (the running one, if it has not yet written the
    /// buffer or wrote it past the record; otherwise the next), and parks on that sync's
    /// word ([`Journal::parked`]): the sync's end wakes every thread it covered in one
    /// system call and none it did not, and a woken thread learns that its record is
    /// synced without taking the lock. Waking ten threads one by one had cost the syncer
    /// about 80 µs per sync on the benchmarks' two-processor virtual machine.
    ///
    /// A `seq` not yet appended is taken as the last one appended.
    pub(crate) fn sync_through(&self, seq: u64) -> Result<(), JournalError> {
        loop {
            let mut state = self.state();
            self.check(&state)?;
            let seq = seq.min(state.next_seq - 1);
            if state.synced >= seq {
                return Ok(());
            }
            if !state.syncer || (!state.syncing && Self::lone(&state)) {
                drop(state);
                return self.lead_through(seq, true);
            }
            let covering = if state.syncing && state.sync_target.is_none_or(|t| seq <= t) {
                state.syncs_begun
            } else {
                state.syncs_begun + 1
            };
            let parity = (covering & 1) as usize;
            state.parked[parity] += 1;
            state.parked_want = state.parked_want.max(seq);
            if !state.syncing && state.syncer_waiting {
                self.sync_wanted.notify_one();
            }
            // Read under the lock, so the covering sync's end, which adds one under the
            // lock too, comes after: `wait` returns at once if the word moved meanwhile.
            let word = self.parked[parity].load(Ordering::Acquire);
            drop(state);
            loop {
                atomic_wait::wait(&self.parked[parity], word);
                if self.failed_now.load(Ordering::Acquire) {
                    break;
                }
                if self.synced_now.load(Ordering::Acquire) >= seq {
                    return Ok(());
                }
                // A spurious wake-up waits again; a sync's end that left the record
                // unsynced (the syncer stopped) asks again under the lock.
                if self.parked[parity].load(Ordering::Acquire) != word {
                    break;
                }
            }
        }
    }

    /// Whether a caller that finds no sync running is alone, and so syncs at once itself
    /// ([`Journal::wait_synced`], [`Journal::sync_through`]): handing its sync to the
    /// syncer would cost it two wake-ups of other threads for nothing. It is when no task
    /// and no thread waits, and the last sync was for one caller only.
    fn lone(state: &State<T>) -> bool {
        state.sync_wakers.is_empty()
            && state.parked == [0, 0]
            && !matches!(state.last_sync, Some((_, 2..)))
    }

    /// Release the threads parked for syncs of the `parities` given: under the lock, each
    /// such word with threads parked on it moves on. Returns the words that did, for
    /// [`Journal::wake_parked`] once the lock is let go.
    fn release_parked(&self, state: &mut State<T>, parities: &[usize]) -> [bool; 2] {
        let mut released = [false; 2];
        for &parity in parities {
            if state.parked[parity] > 0 {
                state.parked[parity] = 0;
                self.parked[parity].fetch_add(1, Ordering::Release);
                released[parity] = true;
            }
        }
        released
    }

    /// Release and wake every parked thread at once, the lock held (a restart, a failure):
    /// each finds its answer in [`Journal::synced_now`] or [`Journal::failed_now`].
    fn wake_all_parked(&self, state: &mut State<T>) {
        let released = self.release_parked(state, &[0, 1]);
        self.wake_parked(released);
    }

    /// Move the synced position to `synced`, and its copy that woken threads read without
    /// the lock with it.
    fn set_synced(&self, state: &mut State<T>, synced: u64) {
        state.synced = synced;
        self.synced_now.store(synced, Ordering::Release);
    }

    /// Wake every thread parked on the words `released` names ([`Journal::release_parked`]).
    fn wake_parked(&self, released: [bool; 2]) {
        for (word, released) in self.parked.iter().zip(released) {
            if released {
                atomic_wait::wake_all(word);
            }
        }
    }

    /// [`Journal::sync_through`] for a caller whose own record is `seq` (`caller`), or for
    /// the syncer, which syncs for the callers that wait.
    fn lead_through(&self, seq: u64, caller: bool) -> Result<(), JournalError> {
        let mut state = self.state();
        debug_assert!(seq < state.next_seq, "syncing a record not yet appended");
        let seq = seq.min(state.next_seq - 1);
        loop {
            self.check(&state)?;
            if state.synced >= seq {
                return Ok(());
            }
            if state.syncing {
                state.sync_waiting += 1;
                state = self
                    .sync_done
                    .wait(state)
                    .unwrap_or_else(|p| p.into_inner());
                state.sync_waiting -= 1;
                continue;
            }
            state.syncing = true;
            state.syncs_begun += 1;
            state.sync_target = None;
            let parity = (state.syncs_begun & 1) as usize;
            // Others were syncing with the last one: let theirs gather before this one.
            if let Some((began, 2..)) = state.last_sync {
                let until = began + GATHER;
                loop {
                    let now = std::time::Instant::now();
                    if now >= until {
                        break;
                    }
                    state = self
                        .sync_done
                        .wait_timeout(state, until - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
            if let Err(error) = self.write_buffer(&mut state) {
                state.syncing = false;
                self.sync_done.notify_all();
                return Err(error);
            }
            let (target, target_len, round) = (state.written, state.offset, state.round);
            state.sync_target = Some(target);
            let waiting = state.parked[parity]
                + state.sync_waiting
                + state
                    .sync_wakers
                    .iter()
                    .filter(|(seq, _)| *seq <= target)
                    .count() as u32
                + u32::from(caller);
            state.last_sync = Some((std::time::Instant::now(), waiting));
            drop(state);
            let synced = self.file.sync_data();
            state = self.state();
            state.syncing = false;
            match synced {
                Ok(()) => {
                    let synced = state.synced.max(target);
                    self.set_synced(&mut state, synced);
                    let released = self.release_parked(&mut state, &[parity]);
                    if state.round == round {
                        state.synced_len = state.synced_len.max(target_len);
                    }
                    self.syncs.fetch_add(1, Ordering::Relaxed);
                    if state.sync_waiting > 0 {
                        self.sync_done.notify_all();
                    }
                    // Threads parked for the next sync: the syncer runs it.
                    if state.parked_want > state.synced && state.syncer_waiting {
                        self.sync_wanted.notify_one();
                    }
                    // Tasks that this sync did not cover wait on for the syncer's next
                    // one; with no syncer, they are woken too, and one of them leads it.
                    let (synced, syncer) = (state.synced, state.syncer);
                    let (covered, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut state.sync_wakers)
                        .into_iter()
                        .partition(|(seq, _)| *seq <= synced || !syncer);
                    state.sync_wakers = rest;
                    if !state.sync_wakers.is_empty() && state.syncer_waiting {
                        self.sync_wanted.notify_one();
                    }
                    if !covered.is_empty() || released != [false; 2] {
                        // Woken with the lock let go: a woken task may run at once on
                        // another thread, and its first step is to take the lock.
                        drop(state);
                        covered
                            .into_iter()
                            .for_each(|(_, waker): (u64, Waker)| waker.wake());
                        self.wake_parked(released);
                        state = self.state();
                    }
                }
                Err(error) => self.fail_with(&mut state, self.io("syncing", error)),
            }
        }
    }

    /// For a task that must not block its thread while a sync runs: whether record `seq`
    /// is synced ([`SyncWait::Done`], also with the journal's failure), or it is not yet,
    /// in which case `waker` is woken by the first sync that covers it
    /// ([`SyncWait::Waiting`]; then ask again): the running one, or the next, which the
    /// syncer ([`Journal::run_syncer`]) runs. Without a syncer, if nobody syncs, the caller
    /// should ([`SyncWait::Lead`]: call [`Journal::sync_through`], which shares the sync
    /// with every caller as usual).
    ///
    /// A `seq` not yet appended is taken as the last one appended.
    pub(crate) fn wait_synced(&self, seq: u64, waker: &Waker) -> SyncWait {
        let mut state = self.state();
        if let Err(error) = self.check(&state) {
            return SyncWait::Done(Err(error));
        }
        let seq = seq.min(state.next_seq - 1);
        if state.synced >= seq {
            return SyncWait::Done(Ok(()));
        }
        if !state.syncing && (!state.syncer || Self::lone(&state)) {
            return SyncWait::Lead;
        }
        match state
            .sync_wakers
            .iter_mut()
            .find(|(_, w)| w.will_wake(waker))
        {
            Some(waiting) => waiting.0 = waiting.0.max(seq),
            None => state.sync_wakers.push((seq, waker.clone())),
        }
        if !state.syncing && state.syncer_waiting {
            self.sync_wanted.notify_one();
        }
        SyncWait::Waiting
    }

    /// The syncer's loop, for a thread of its own: sync whenever a task or a thread waits
    /// for a record not yet synced ([`Journal::wait_synced`]; every waiter on the list
    /// waits for one, since a sync takes off the list those it covered), sharing each sync
    /// with every caller as [`Journal::sync_through`] does, so that no worker of a runtime
    /// blocks in a sync that many share. Returns once the journal failed, or was closed
    /// and nobody waits; callers waiting then are woken and lead their syncs themselves.
    pub(crate) fn run_syncer(&self) {
        let mut state = self.state();
        state.syncer = true;
        loop {
            if state.failed.is_some() {
                break;
            }
            let wanted = state
                .sync_wakers
                .iter()
                .map(|(seq, _)| *seq)
                .chain((state.parked_want > state.synced).then_some(state.parked_want))
                .max();
            match wanted {
                Some(seq) if seq > state.synced && !state.syncing => {
                    drop(state);
                    // A failure fails the journal and wakes every waiter; the loop ends.
                    let _ = self.lead_through(seq, false);
                    state = self.state();
                    continue;
                }
                None if state.closing => break,
                _ => {}
            }
            state.syncer_waiting = true;
            state = self
                .sync_wanted
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
            state.syncer_waiting = false;
        }
        state.syncer = false;
        // Parked threads wake to find no syncer, and lead their syncs themselves.
        let released = self.release_parked(&mut state, &[0, 1]);
        let wakers = std::mem::take(&mut state.sync_wakers);
        drop(state);
        self.wake_parked(released);
        wakers.into_iter().for_each(|(_, waker)| waker.wake());
    }

    /// For the applier thread: wait until something is queued and it is time to apply it,
    /// or the journal is closing or failed, then take everything queued, in order.
    /// Returns `None` once the journal is closing and the queue is empty, and once it
    /// failed.
    ///
    /// It is time [`APPLY_EVERY`] after the applier last took a batch, and at once when
    /// [`WAKE_AT`] records are queued, the write offset has passed half of [`RING`] (the
    /// applier then starts the journal over), a caller waits for the applier
    /// ([`Journal::wait_applied`]) or the journal is closing. A busy applier thus takes a
    /// few milliseconds' records at a time, in which most actions' records fold into one
    /// write per row (`fold.rs`), instead of chasing the appenders a few records behind.
    pub(crate) fn take_queued(&self) -> Option<Vec<(u64, T)>> {
        let mut state = self.state();
        loop {
            if state.failed.is_some() {
                return None;
            }
            let wait = APPLY_EVERY.saturating_sub(state.last_take.elapsed());
            if !state.queue.is_empty()
                && (wait.is_zero()
                    || state.closing
                    || state.applied_waiting > 0
                    || Self::applier_wanted(&state))
            {
                state.last_take = std::time::Instant::now();
                return Some(std::mem::take(&mut state.queue));
            }
            if state.closing {
                return None;
            }
            state.applier_waiting = true;
            state = self
                .queued
                .wait_timeout(state, if wait.is_zero() { APPLY_EVERY } else { wait })
                .unwrap_or_else(|p| p.into_inner())
                .0;
            state.applier_waiting = false;
        }
    }

    /// For the applier: take everything queued now, in order, without waiting (empty if
    /// nothing is).
    pub(crate) fn take_now(&self) -> Vec<(u64, T)> {
        let mut state = self.state();
        state.last_take = std::time::Instant::now();
        std::mem::take(&mut state.queue)
    }

    /// Whether the applier should take the queue before its time: it is long, or the
    /// journal has passed half its ring and should start over.
    fn applier_wanted(state: &State<T>) -> bool {
        state.queue.len() >= WAKE_AT || state.offset > RING / 2
    }

    /// For the applier: every record through `seq` has been applied (not necessarily
    /// durably). Wakes the callers of [`Journal::wait_applied`].
    pub(crate) fn mark_applied(&self, seq: u64) {
        let mut state = self.state();
        state.applied = state.applied.max(seq);
        if state.applied_waiting > 0 {
            self.applied.notify_all();
        }
    }

    /// Wait until every record appended before this call has been marked applied (a read
    /// barrier: afterwards the applier's store has seen all of them). Fails if the journal
    /// failed, before or meanwhile.
    pub(crate) fn wait_applied(&self) -> Result<(), JournalError> {
        let mut state = self.state();
        let target = state.next_seq - 1;
        loop {
            self.check(&state)?;
            if state.applied >= target {
                return Ok(());
            }
            if state.applier_waiting {
                self.queued.notify_one();
            }
            state.applied_waiting += 1;
            state = self.applied.wait(state).unwrap_or_else(|p| p.into_inner());
            state.applied_waiting -= 1;
        }
    }

    /// How many bytes from the start of the file are synced (what a power cut keeps for
    /// certain), for tests that cut a copy's journal past it.
    pub(crate) fn synced_len(&self) -> u64 {
        self.state().synced_len
    }

    /// Whether the write offset has passed half of [`RING`]: the applier then calls
    /// [`Journal::restart`].
    pub(crate) fn wants_restart(&self) -> bool {
        self.state().offset > RING / 2
    }

    /// Start over at offset 0 without losing anything. Under the lock (appenders wait),
    /// takes what is still queued and calls
    /// `make_durable(last_seq, queued)`, which must apply the queued items and make every
    /// record through `last_seq` durable elsewhere before it returns (and must not call
    /// this journal). If it succeeds, the buffer is dropped (its records are durable
    /// elsewhere), every record through `last_seq` counts as written, synced and applied
    /// (their waiters return), and the next write goes to offset 0. If it fails, the
    /// journal fails with [`JournalError::Failed`] and its detail (sticky).
    pub(crate) fn restart(
        &self,
        make_durable: impl FnOnce(u64, Vec<(u64, T)>) -> Result<(), String>,
    ) -> Result<(), JournalError> {
        let mut state = self.state();
        self.check(&state)?;
        // A sync may be running: it covers frames of this round, which are about to be
        // durable in the database anyway, and finds the next round begun when it ends.
        let last = state.next_seq - 1;
        let queued = std::mem::take(&mut state.queue);
        if let Err(detail) = make_durable(last, queued) {
            let error = JournalError::Failed {
                path: self.path.clone(),
                detail,
            };
            self.fail_with(&mut state, error);
            return self.check(&state);
        }
        state.buffer.clear();
        state.offset = 0;
        state.synced_len = 0;
        state.round += 1;
        state.written = last;
        self.set_synced(&mut state, last);
        self.wake_all_parked(&mut state);
        state.applied = last;
        if state.sync_waiting > 0 {
            self.sync_done.notify_all();
        }
        state
            .sync_wakers
            .drain(..)
            .for_each(|(_, waker)| waker.wake());
        if state.applied_waiting > 0 {
            self.applied.notify_all();
        }
        Ok(())
    }

    /// Fail the journal with [`JournalError::Failed`] and `detail`: every later call and
    /// every waiter gets it. A journal that already failed keeps its first error.
    pub(crate) fn fail(&self, detail: String) {
        let mut state = self.state();
        let error = JournalError::Failed {
            path: self.path.clone(),
            detail,
        };
        self.fail_with(&mut state, error);
    }

    /// Close the journal: appends fail from now on, and [`Journal::take_queued`] returns
    /// `None` once the queue is empty. Writes, syncs and waits go on as before.
    pub(crate) fn close(&self) {
        let mut state = self.state();
        state.closing = true;
        self.queued.notify_all();
        self.sync_wanted.notify_all();
    }

    /// The number of the last record appended (0 before the first round starts).
    pub(crate) fn last_seq(&self) -> u64 {
        self.state().next_seq - 1
    }

    /// How many syncs succeeded, for tests and benchmarks.
    pub(crate) fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// How many times the buffer was written to the file (preallocation not counted), for
    /// tests and benchmarks.
    pub(crate) fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// The file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The lock on the state; a panic while it was held left the state consistent (it is
    /// between statements), so a poisoned lock is taken as it is.
    fn state(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The sticky failure, if the journal failed.
    fn check(&self, state: &State<T>) -> Result<(), JournalError> {
        match &state.failed {
            Some(error) => Err(error.clone()),
            None => Ok(()),
        }
    }

    /// Write the buffer to the file at the current offset, if it holds anything; a failure
    /// fails the journal.
    fn write_buffer(&self, state: &mut State<T>) -> Result<(), JournalError> {
        if state.buffer.is_empty() {
            return Ok(());
        }
        self.writes.fetch_add(1, Ordering::Relaxed);
        if let Err(error) = self.file.write_all_at(&state.buffer, state.offset) {
            self.fail_with(state, self.io("writing", error));
            return self.check(state);
        }
        state.offset += state.buffer.len() as u64;
        state.written = state.next_seq - 1;
        state.buffer.clear();
        Ok(())
    }

    /// Fail the journal with `error` unless it already failed, and wake every waiter.
    fn fail_with(&self, state: &mut State<T>, error: JournalError) {
        state.failed.get_or_insert(error);
        self.failed_now.store(true, Ordering::Release);
        self.wake_all_parked(state);
        self.queued.notify_all();
        self.sync_done.notify_all();
        self.sync_wanted.notify_all();
        state
            .sync_wakers
            .drain(..)
            .for_each(|(_, waker)| waker.wake());
        self.applied.notify_all();
    }

    /// The error for an append after [`Journal::close`].
    fn closed(&self) -> JournalError {
        JournalError::Failed {
            path: self.path.clone(),
            detail: "it was closed".to_owned(),
        }
    }

    /// An [`JournalError::Io`] for this file.
    fn io(&self, what: &str, error: std::io::Error) -> JournalError {
        JournalError::Io {
            path: self.path.clone(),
            detail: format!("{what}: {error}"),
        }
    }
}

/// The chain of frames at the start of `bytes` (see the module docs), as `(seq, payload)`.
fn read_chain(bytes: &[u8]) -> Vec<Record> {
    let mut records: Vec<Record> = Vec::new();
    let mut at = 0;
    while let Some(header) = bytes.get(at..at + HEADER) {
        let (len, rest) = header.split_at(4);
        let (seq, crc) = rest.split_at(8);
        let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
        let seq_bytes = seq;
        let seq = u64::from_le_bytes(seq.try_into().expect("8 bytes"));
        let crc = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
        if len == 0 {
            break;
        }
        let Some(payload) = bytes.get(at + HEADER..at + HEADER + len) else {
            break;
        };
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(seq_bytes);
        hasher.update(payload);
        if hasher.finalize() != crc {
            break;
        }
        if let Some((previous, _)) = records.last()
            && previous.checked_add(1) != Some(seq)
        {
            break;
        }
        records.push((seq, payload.to_vec()));
        at += HEADER + len;
    }
    records
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    /// A fresh journal file in its own directory, not yet created.
    fn journal_path(label: &str) -> PathBuf {
        crate::temp_dir(&format!("journal-{label}")).join("journal")
    }

    /// Remove the directory of the journal at `path` (at the end of a test that passed).
    fn remove(path: &Path) {
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    /// Open the journal at `path`, which must succeed.
    fn open<T: Send>(path: &Path) -> (Journal<T>, Vec<Record>) {
        match Journal::open(path) {
            Ok(opened) => opened,
            Err(error) => panic!("opening {}: {error}", path.display()),
        }
    }

    /// A new journal for one test, opened and started at record 1, and its path.
    fn started<T: Send>(label: &str) -> (Journal<T>, PathBuf) {
        let path = journal_path(label);
        let (journal, _) = open(&path);
        journal.start_round(1);
        (journal, path)
    }

    /// The detail of a [`JournalError::Failed`].
    fn failed_with(error: &JournalError) -> Option<&str> {
        match error {
            JournalError::Failed { detail, .. } => Some(detail),
            _ => None,
        }
    }

    /// The numbers of `records`.
    fn seqs(records: &[Record]) -> Vec<u64> {
        records.iter().map(|(seq, _)| *seq).collect()
    }

    #[test]
    fn written_records_are_read_back_in_order_and_the_file_is_preallocated() {
        let path = journal_path("read-back");
        let (journal, records) = open::<()>(&path);
        assert!(records.is_empty());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), RING);
        assert_eq!(journal.path(), path);
        journal.start_round(1);
        assert_eq!(journal.append(b"one", ()).unwrap(), 1);
        assert_eq!(journal.append(b"two", ()).unwrap(), 2);
        assert_eq!(journal.append(b"three", ()).unwrap(), 3);
        assert_eq!(journal.writes(), 0, "appending writes nothing");
        journal.write_through(3).unwrap();
        assert_eq!(journal.writes(), 1, "one write for the whole buffer");
        assert_eq!(journal.last_seq(), 3);
        drop(journal);

        let (_journal, records) = open::<()>(&path);
        assert_eq!(
            records,
            vec![
                (1, b"one".to_vec()),
                (2, b"two".to_vec()),
                (3, b"three".to_vec())
            ]
        );
        assert_eq!(std::fs::metadata(&path).unwrap().len(), RING);
        remove(&path);
    }

    #[test]
    fn records_never_written_are_not_read_back() {
        let (journal, path) = started::<()>("unwritten");
        journal.append(b"written", ()).unwrap();
        journal.write_through(1).unwrap();
        journal.append(b"buffered", ()).unwrap();
        journal.append(b"buffered too", ()).unwrap();
        drop(journal);

        let (_journal, records) = open::<()>(&path);
        assert_eq!(records, vec![(1, b"written".to_vec())]);
        remove(&path);
    }

    #[test]
    fn a_damaged_record_ends_the_chain() {
        let (journal, path) = started::<()>("torn");
        for n in 1..=5u8 {
            journal.append(&[n; 10], ()).unwrap();
        }
        journal.sync_through(5).unwrap();
        drop(journal);

        // The 4th frame starts after three frames of 16 + 10 bytes.
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(&[0xff], 3 * (HEADER as u64 + 10) + HEADER as u64 + 4)
            .unwrap();
        drop(file);

        let (_journal, records) = open::<()>(&path);
        assert_eq!(seqs(&records), vec![1, 2, 3]);
        assert_eq!(records[2].1, vec![3; 10]);
        remove(&path);
    }

    #[test]
    fn a_restart_writes_a_new_round_from_offset_0_and_a_failed_one_fails_the_journal() {
        let (journal, path) = started::<u64>("restart");
        for n in 1..=10u64 {
            journal
                .append(format!("record {n:02}").as_bytes(), n)
                .unwrap();
        }
        journal.write_through(10).unwrap();
        let mut called = false;
        journal
            .restart(|last, queued| {
                called = true;
                assert_eq!(last, 10);
                assert_eq!(
                    queued,
                    (1..=10).map(|n| (n, n)).collect::<Vec<_>>(),
                    "the items nobody took, in order"
                );
                Ok(())
            })
            .unwrap();
        assert!(called);
        assert!(!journal.wants_restart());
        journal.sync_through(10).unwrap();
        journal.wait_applied().unwrap();
        assert_eq!(journal.syncs(), 0, "restart counts its records as synced");
        assert_eq!(journal.append(b"record 11", 11).unwrap(), 11);
        assert_eq!(journal.append(b"record 12", 12).unwrap(), 12);
        journal.write_through(12).unwrap();
        drop(journal);

        // Frames 3..=10 of the first round follow 11 and 12 in the file: 3 is not 13.
        let (journal, records) = open::<u64>(&path);
        assert_eq!(
            records,
            vec![(11, b"record 11".to_vec()), (12, b"record 12".to_vec())]
        );

        journal.start_round(13);
        journal.append(b"record 13", 13).unwrap();
        let error = journal
            .restart(|last, _| {
                assert_eq!(last, 13);
                Err("the database is full".to_owned())
            })
            .unwrap_err();
        assert_eq!(failed_with(&error), Some("the database is full"), "{error}");
        let error = journal.append(b"record 14", 14).unwrap_err();
        assert_eq!(failed_with(&error), Some("the database is full"), "{error}");
        remove(&path);
    }

    #[test]
    fn a_restart_lets_buffered_records_waiting_for_a_sync_return() {
        let (journal, path) = started::<()>("restart-buffer");
        journal.append(b"buffered", ()).unwrap();
        journal.restart(|_, _| Ok(())).unwrap();
        journal.write_through(1).unwrap();
        journal.sync_through(1).unwrap();
        assert_eq!(journal.writes(), 0, "the buffer was dropped, not written");
        assert_eq!(journal.syncs(), 0);
        remove(&path);
    }

    #[test]
    fn wants_restart_once_the_offset_passes_half_the_ring() {
        let (journal, path) = started::<()>("wants-restart");
        let payload = vec![7u8; 4096 - HEADER];
        let mut seq = 0;
        while !journal.wants_restart() {
            assert!(
                seq < RING / 4096,
                "no restart wanted after {seq} frames of 4 KiB"
            );
            seq = journal.append(&payload, ()).unwrap();
            journal.write_through(seq).unwrap();
        }
        assert_eq!(seq, (RING / 2 / 4096) + 1);
        journal.restart(|_, _| Ok(())).unwrap();
        assert!(!journal.wants_restart());
        remove(&path);
    }

    #[test]
    fn a_second_open_of_a_journal_in_use_is_refused() {
        let path = journal_path("busy");
        let (first, _) = open::<()>(&path);
        let Err(error) = Journal::<()>::open(&path) else {
            panic!("a second open succeeded while the first holds the lock");
        };
        assert!(
            matches!(&error, JournalError::Busy { path: p } if *p == path),
            "{error}"
        );
        assert!(error.to_string().contains("stop it first"), "{error}");
        drop(first);
        open::<()>(&path);
        remove(&path);
    }

    /// On each of `threads` threads, append `each` records ("thread/index") and sync each
    /// one, checking that every sync returns only once its record is synced.
    fn append_and_sync(journal: &Arc<Journal<()>>, threads: u64, each: u64) {
        let threads: Vec<_> = (0..threads)
            .map(|t| {
                let journal = Arc::clone(journal);
                std::thread::spawn(move || {
                    for i in 0..each {
                        let seq = journal.append(format!("{t}/{i}").as_bytes(), ()).unwrap();
                        journal.sync_through(seq).unwrap();
                        let synced = journal.state().synced;
                        assert!(synced >= seq, "record {seq} returned at {synced}");
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
    }

    #[test]
    fn concurrent_syncs_share_fdatasyncs_and_every_record_is_kept() {
        const THREADS: u64 = 16;
        const EACH: u64 = 200;
        let (journal, path) = started::<()>("group-commit");
        let journal = Arc::new(journal);
        append_and_sync(&journal, THREADS, EACH);
        let syncs = journal.syncs();
        println!(
            "{} records, {syncs} syncs, {} writes",
            THREADS * EACH,
            journal.writes()
        );
        assert!(syncs < THREADS * EACH, "{syncs} syncs");
        drop(journal);

        let (_journal, records) = open::<()>(&path);
        assert_eq!(seqs(&records), (1..=THREADS * EACH).collect::<Vec<_>>());
        let mut payloads: Vec<String> = records
            .into_iter()
            .map(|(_, payload)| String::from_utf8(payload).unwrap())
            .collect();
        payloads.sort();
        let mut expected: Vec<String> = (0..THREADS)
            .flat_map(|t| (0..EACH).map(move |i| format!("{t}/{i}")))
            .collect();
        expected.sort();
        assert_eq!(payloads, expected);
        remove(&path);
    }

    #[test]
    fn wait_applied_returns_once_the_applier_marked_what_came_before() {
        let (journal, path) = started::<&'static str>("applied");
        let journal = Arc::new(journal);
        let (go, gate) = std::sync::mpsc::channel::<()>();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let applier = {
            let journal = Arc::clone(&journal);
            let seen = Arc::clone(&seen);
            std::thread::spawn(move || {
                while let Some(items) = journal.take_queued() {
                    // Held until the test lets it go.
                    gate.recv().unwrap();
                    let last = items.last().unwrap().0;
                    seen.lock().unwrap().extend(items);
                    journal.mark_applied(last);
                }
            })
        };
        for item in ["a", "b", "c"] {
            journal.append(item.as_bytes(), item).unwrap();
        }
        let returned = Arc::new(AtomicBool::new(false));
        let waiter = {
            let journal = Arc::clone(&journal);
            let returned = Arc::clone(&returned);
            let seen = Arc::clone(&seen);
            std::thread::spawn(move || {
                journal.wait_applied().unwrap();
                returned.store(true, Ordering::SeqCst);
                seen.lock().unwrap().clone()
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !returned.load(Ordering::SeqCst),
            "wait_applied returned before the applier marked anything"
        );
        // The applier may have taken "a" alone before "b" and "c" were queued: let it
        // through as many batches as it takes.
        for _ in 0..3 {
            go.send(()).unwrap();
        }
        let seen_by_waiter = waiter.join().unwrap();
        assert_eq!(seen_by_waiter, vec![(1, "a"), (2, "b"), (3, "c")]);
        journal.close();
        assert!(
            journal.append(b"d", "d").is_err(),
            "appends fail after close"
        );
        drop(go);
        applier.join().unwrap();
        remove(&path);
    }

    #[test]
    fn take_queued_returns_none_once_closed_and_empty() {
        let (journal, path) = started::<u32>("close");
        journal.append(b"x", 7).unwrap();
        journal.close();
        assert_eq!(journal.take_queued(), Some(vec![(1, 7)]));
        assert_eq!(journal.take_queued(), None);
        remove(&path);
    }

    #[test]
    fn a_failed_journal_refuses_everything() {
        let (journal, path) = started::<()>("failed");
        let seq = journal.append(b"before", ()).unwrap();
        journal.fail("x".to_owned());
        let is_x = |result: Result<(), JournalError>| {
            result.as_ref().err().and_then(failed_with) == Some("x")
        };
        assert!(is_x(journal.append(b"after", ()).map(|_| ())));
        assert!(is_x(journal.sync_through(seq)));
        assert!(is_x(journal.write_through(seq)));
        assert!(is_x(journal.wait_applied()));
        assert!(is_x(journal.restart(|_, _| Ok(()))));
        assert_eq!(journal.take_queued(), None);
        journal.fail("y".to_owned());
        assert!(is_x(journal.sync_through(seq)), "the first failure stays");
        remove(&path);
    }

    #[test]
    fn a_failure_wakes_a_waiting_caller() {
        let (journal, path) = started::<()>("failure-wakes");
        journal.append(b"never applied", ()).unwrap();
        let journal = Arc::new(journal);
        let waiter = {
            let journal = Arc::clone(&journal);
            std::thread::spawn(move || journal.wait_applied())
        };
        std::thread::sleep(Duration::from_millis(50));
        journal.fail("the applier stopped".to_owned());
        let error = waiter.join().unwrap().unwrap_err();
        assert!(matches!(error, JournalError::Failed { .. }), "{error}");
        remove(&path);
    }

    /// A waker that counts its wake-ups.
    struct Counted(AtomicU64);

    impl std::task::Wake for Counted {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_task_leads_when_nobody_syncs_waits_while_somebody_does_and_is_woken_after() {
        let (journal, path) = started::<()>("task-waits");
        let counted = Arc::new(Counted(AtomicU64::new(0)));
        let waker = Waker::from(Arc::clone(&counted));
        let first = journal.append(b"first", ()).unwrap();
        assert!(matches!(journal.wait_synced(first, &waker), SyncWait::Lead));
        journal.sync_through(first).unwrap();
        assert!(matches!(
            journal.wait_synced(first, &waker),
            SyncWait::Done(Ok(()))
        ));

        // A sync is running (the flag stands for another caller's): the task waits, once
        // however often it asks, and is not told its record is synced.
        let second = journal.append(b"second", ()).unwrap();
        journal.state().syncing = true;
        assert!(matches!(
            journal.wait_synced(second, &waker),
            SyncWait::Waiting
        ));
        assert!(matches!(
            journal.wait_synced(second, &waker),
            SyncWait::Waiting
        ));
        assert_eq!(counted.0.load(Ordering::SeqCst), 0);
        // That sync ends, and the next one (led by a thread here) wakes the task once,
        // after which its record is synced.
        journal.state().syncing = false;
        journal.sync_through(second).unwrap();
        assert_eq!(counted.0.load(Ordering::SeqCst), 1);
        assert!(matches!(
            journal.wait_synced(second, &waker),
            SyncWait::Done(Ok(()))
        ));

        // A failure wakes a waiting task too, and it is then told of the failure.
        let third = journal.append(b"third", ()).unwrap();
        journal.state().syncing = true;
        assert!(matches!(
            journal.wait_synced(third, &waker),
            SyncWait::Waiting
        ));
        journal.fail("the disk went away".to_owned());
        assert_eq!(counted.0.load(Ordering::SeqCst), 2);
        match journal.wait_synced(third, &waker) {
            SyncWait::Done(Err(error)) => {
                assert_eq!(failed_with(&error), Some("the disk went away"))
            }
            other => panic!("{other:?}"),
        }
        remove(&path);
    }

    /// Put a task with `waker` on the list of those waiting for record `seq`, as if it
    /// had waited for a sync that was running and ended without its record.
    fn left_waiting(journal: &Journal<()>, seq: u64, waker: &Waker) {
        journal.state().syncing = true;
        assert!(matches!(journal.wait_synced(seq, waker), SyncWait::Waiting));
        journal.state().syncing = false;
    }

    /// A journal with a syncer running on a thread of its own, waiting for work; join the
    /// handle after closing (or failing) the journal.
    fn with_syncer(label: &str) -> (Arc<Journal<()>>, PathBuf, std::thread::JoinHandle<()>) {
        let (journal, path) = started::<()>(label);
        let journal = Arc::new(journal);
        let syncer = {
            let journal = Arc::clone(&journal);
            std::thread::spawn(move || journal.run_syncer())
        };
        while !journal.state().syncer_waiting {
            std::thread::sleep(Duration::from_millis(1));
        }
        (journal, path, syncer)
    }

    #[test]
    fn with_a_syncer_a_lone_caller_leads_and_one_among_others_leaves_its_sync_to_it() {
        let (journal, path, syncer) = with_syncer("syncer");
        let (one, two) = (
            Arc::new(Counted(AtomicU64::new(0))),
            Arc::new(Counted(AtomicU64::new(0))),
        );
        let (waker_one, waker_two) = (Waker::from(Arc::clone(&one)), Waker::from(Arc::clone(&two)));

        // Alone, a task syncs itself: handing over would cost it two wake-ups.
        let first = journal.append(b"first", ()).unwrap();
        assert!(matches!(
            journal.wait_synced(first, &waker_one),
            SyncWait::Lead
        ));
        journal.sync_through(first).unwrap();

        // One task waits; the next task to wait, though nobody syncs, leaves the sync to
        // the syncer, which syncs both records and wakes each task once.
        let second = journal.append(b"second", ()).unwrap();
        left_waiting(&journal, second, &waker_one);
        let third = journal.append(b"third", ()).unwrap();
        assert!(matches!(
            journal.wait_synced(third, &waker_two),
            SyncWait::Waiting
        ));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while one.0.load(Ordering::SeqCst) + two.0.load(Ordering::SeqCst) < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "the syncer did not sync"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(one.0.load(Ordering::SeqCst), 1);
        assert_eq!(two.0.load(Ordering::SeqCst), 1);
        for (seq, waker) in [(second, &waker_one), (third, &waker_two)] {
            assert!(matches!(
                journal.wait_synced(seq, waker),
                SyncWait::Done(Ok(()))
            ));
        }
        assert_eq!(journal.syncs(), 2);

        // A thread among others waiting leaves its sync to the syncer too, parked until
        // a sync covers its record; the task waiting with it is woken by the same sync.
        let fourth = journal.append(b"fourth", ()).unwrap();
        left_waiting(&journal, fourth, &waker_one);
        let fifth = journal.append(b"fifth", ()).unwrap();
        journal.sync_through(fifth).unwrap();
        assert_eq!(journal.syncs(), 3);
        assert_eq!(one.0.load(Ordering::SeqCst), 2);

        // Closed with nobody waiting, the syncer returns (tasks and threads lead again).
        journal.close();
        syncer.join().unwrap();
        assert!(!journal.state().syncer);
        remove(&path);
    }

    /// Wait until `count` threads are parked for syncs of `parity`.
    fn until_parked(journal: &Journal<()>, parity: usize, count: u32) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while journal.state().parked[parity] < count {
            assert!(std::time::Instant::now() < deadline, "nobody parked");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn with_a_syncer_threads_share_syncs_and_return_only_once_their_records_are_synced() {
        const THREADS: u64 = 16;
        const EACH: u64 = 200;
        let (journal, path, syncer) = with_syncer("syncer-threads");
        append_and_sync(&journal, THREADS, EACH);
        let syncs = journal.syncs();
        assert!(syncs < THREADS * EACH, "{syncs} syncs");
        assert_eq!(journal.state().parked, [0, 0]);
        journal.close();
        syncer.join().unwrap();
        drop(journal);
        let (_journal, records) = open::<()>(&path);
        assert_eq!(seqs(&records), (1..=THREADS * EACH).collect::<Vec<_>>());
        remove(&path);
    }

    #[test]
    fn a_thread_whose_record_came_after_the_running_sync_wrote_parks_for_the_next_one() {
        let (journal, path, syncer) = with_syncer("syncer-next");
        // A sync is running (the fields stand for another caller's) and wrote the
        // buffer through `first`.
        let first = journal.append(b"first", ()).unwrap();
        journal.write_through(first).unwrap();
        let running = {
            let mut state = journal.state();
            state.syncing = true;
            state.syncs_begun += 1;
            state.sync_target = Some(first);
            (state.syncs_begun & 1) as usize
        };
        let second = journal.append(b"second", ()).unwrap();
        let waiter = {
            let journal = Arc::clone(&journal);
            std::thread::spawn(move || journal.sync_through(second))
        };
        until_parked(&journal, 1 - running, 1);
        assert_eq!(journal.state().parked[running], 0);
        // The running sync ends (it synced `first` only, and released nobody): the
        // syncer runs the next one, which releases the thread.
        {
            let mut state = journal.state();
            state.syncing = false;
            journal.set_synced(&mut state, first);
            journal.sync_wanted.notify_one();
        }
        waiter.join().unwrap().unwrap();
        assert!(journal.state().synced >= second);
        assert_eq!(journal.syncs(), 1);
        journal.close();
        syncer.join().unwrap();
        remove(&path);
    }

    #[test]
    fn a_failure_wakes_a_parked_thread_with_the_error() {
        let (journal, path, syncer) = with_syncer("syncer-fails");
        let running = {
            let mut state = journal.state();
            state.syncing = true;
            state.syncs_begun += 1;
            (state.syncs_begun & 1) as usize
        };
        let seq = journal.append(b"never synced", ()).unwrap();
        let waiter = {
            let journal = Arc::clone(&journal);
            std::thread::spawn(move || journal.sync_through(seq))
        };
        // The running sync has not written yet, so it covers the record.
        until_parked(&journal, running, 1);
        journal.fail("the disk went away".to_owned());
        let error = waiter.join().unwrap().unwrap_err();
        assert_eq!(failed_with(&error), Some("the disk went away"));
        syncer.join().unwrap();
        remove(&path);
    }

    #[test]
    fn the_chain_stops_at_zeros_a_short_payload_and_a_gap_in_numbers() {
        let frame = |seq: u64, payload: &[u8]| {
            let mut crc = crc32fast::Hasher::new();
            crc.update(&seq.to_le_bytes());
            crc.update(payload);
            let mut bytes = (payload.len() as u32).to_le_bytes().to_vec();
            bytes.extend_from_slice(&seq.to_le_bytes());
            bytes.extend_from_slice(&crc.finalize().to_le_bytes());
            bytes.extend_from_slice(payload);
            bytes
        };
        let mut bytes = [frame(5, b"five"), frame(6, b"six")].concat();
        assert_eq!(seqs(&read_chain(&bytes)), vec![5, 6]);
        bytes.extend_from_slice(&[0; 40]);
        assert_eq!(seqs(&read_chain(&bytes)), vec![5, 6]);

        let gap = [frame(5, b"five"), frame(7, b"seven")].concat();
        assert_eq!(seqs(&read_chain(&gap)), vec![5]);

        let mut short = [frame(5, b"five"), frame(6, b"six")].concat();
        short.pop();
        assert_eq!(seqs(&read_chain(&short)), vec![5]);

        assert!(read_chain(&[]).is_empty());
        assert!(read_chain(&frame(1, b"x")[..HEADER - 1]).is_empty());
    }
}

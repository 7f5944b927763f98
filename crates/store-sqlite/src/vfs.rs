//! A thin layer over SQLite's own file system layer that hands each commit's
//! write-ahead-log frames to the operating system in two writes instead of two per page.
//!
//! SQLite appends a commit to the log frame by frame, and each frame as two `pwrite`s: its
//! 24-byte header, then the page. A stage, claim or outcome dirties a handful of pages, so
//! a cycle made some 26 `pwrite`s, each paying a system call and an unaligned partial
//! write into the page cache. Written alone, with the same sizes and offsets on the disk
//! the benchmarks run on, 26 such writes took 66 µs, and the same bytes in one write 7 µs.
//!
//! This layer (registered as [`NAME`], used only by the store's own writing connection)
//! passes every file through to SQLite's default layer untouched except the log, whose
//! writes it gathers in memory while they are contiguous and hands over in one `pwrite`
//! (so a commit takes two: everything up to its commit frame's header, then that frame's
//! page):
//!
//! - as soon as a *commit frame's* header is written (a frame header whose "database size
//!   after commit" field is not zero): the gathered frames and that header are written at
//!   once, and the page that completes the commit frame, which follows, is written
//!   straight through. Every write of a commit has therefore reached the file, and any
//!   failure has been returned to SQLite from that very write, before SQLite publishes
//!   the commit in the shared-memory index, where readers in other processes look;
//! - before anything else touches the log: a read, a sync, a truncate, the size, a file
//!   control or closing it;
//! - when a write is not contiguous with what is gathered, or more than [`GATHERED_MAX`]
//!   bytes are gathered (frames of a large transaction spilled before its commit).
//!
//! What is gathered reaches the default layer in writes of at most [`WRITE_MAX`] bytes
//! (one for a commit of a few dozen pages): it takes no longer write.
//!
//! Frames that are not yet handed over were never published and belong to no commit, so
//! losing them in a crash is what losing them in SQLite's own layer would be: the
//! transaction never committed. Nothing about what is synced, and when, changes.
//!
//! This is the crate's only `unsafe` code: a file-system layer is a table of C callbacks.

#![allow(unsafe_code)]

use std::ffi::{CStr, c_int, c_void};
use std::sync::OnceLock;

use rusqlite::ffi;

/// The name this layer is registered under.
pub(crate) const NAME: &CStr = c"gatekeeper-wal-gather";

/// The most bytes gathered before they are written anyway.
const GATHERED_MAX: usize = 1 << 20;

/// The most bytes handed to the default layer in one write. Its `unixWrite` masks a
/// write's length to 17 bits (it never writes more than a page or two at once itself), so
/// a longer write would come back short and be reported as a full disk.
const WRITE_MAX: usize = 1 << 16;

/// The size of a frame header in the write-ahead log.
const FRAME_HEADER: usize = 24;

thread_local! {
    /// Writes this layer made to logs on this thread (SQLite writes on its caller's
    /// thread), for tests.
    static WRITES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Count one write made to a log.
fn counted() {
    WRITES.with(|w| w.set(w.get() + 1));
}

/// SQLite's default layer, which this one wraps, once this one is registered.
struct Registered {
    real: *mut ffi::sqlite3_vfs,
}

// SAFETY: the pointers refer to SQLite's static default layer and to this layer's leaked
// table; both live as long as the process and SQLite's layers are safe to use from any
// thread.
unsafe impl Send for Registered {}
unsafe impl Sync for Registered {}

static REGISTERED: OnceLock<Result<Registered, String>> = OnceLock::new();

/// Register this layer with SQLite (once per process); returns its name to open a
/// connection with, or why it could not be registered.
pub(crate) fn register() -> Result<&'static CStr, String> {
    REGISTERED
        .get_or_init(|| {
            // SAFETY: `sqlite3_vfs_find(NULL)` returns the default layer, which SQLite keeps
            // for the life of the process; the copy made of it is leaked, so it lives as
            // long. Registering is thread-safe in SQLite's default (serialized) build.
            unsafe {
                let real = ffi::sqlite3_vfs_find(std::ptr::null());
                if real.is_null() {
                    return Err("SQLite has no default file system layer".to_owned());
                }
                let mut ours = *real;
                ours.pNext = std::ptr::null_mut();
                ours.zName = NAME.as_ptr();
                ours.szOsFile = c_int::try_from(LogFile::REAL_AT)
                    .expect("the wrapper is small")
                    .saturating_add((*real).szOsFile.max(0));
                ours.xOpen = Some(open);
                let ours = Box::into_raw(Box::new(ours));
                let code = ffi::sqlite3_vfs_register(ours, 0);
                if code != ffi::SQLITE_OK {
                    return Err(format!(
                        "SQLite refused to register a file system layer (code {code})"
                    ));
                }
                Ok(Registered { real })
            }
        })
        .as_ref()
        .map(|_| NAME)
        .map_err(Clone::clone)
}

fn real_vfs() -> *mut ffi::sqlite3_vfs {
    match REGISTERED.get() {
        Some(Ok(registered)) => registered.real,
        // `open` is only reachable through the registered layer.
        _ => std::ptr::null_mut(),
    }
}

/// A write-ahead log opened through this layer: SQLite's own file follows it in the same
/// allocation, at [`LogFile::REAL_AT`].
#[repr(C)]
struct LogFile {
    /// What SQLite sees: must come first.
    base: ffi::sqlite3_file,
    /// Gathered bytes, to be written at `start`.
    gathered: Vec<u8>,
    start: i64,
    /// The write just before was a commit frame's header: this one completes the frame.
    completes_commit: bool,
}

impl LogFile {
    /// Where SQLite's own file begins, after this wrapper, aligned for it.
    const REAL_AT: usize = std::mem::size_of::<LogFile>().next_multiple_of(16);

    /// SQLite's own file behind `file`.
    ///
    /// # Safety
    /// `file` was opened by [`open`] as a log.
    unsafe fn real(file: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
        // SAFETY: the allocation is `szOsFile` bytes, `REAL_AT` of them ours (see `register`).
        unsafe { file.cast::<u8>().add(Self::REAL_AT).cast() }
    }

    /// Write what is gathered, if anything; on failure it is dropped (SQLite fails the
    /// transaction it belonged to) and the failure returned.
    ///
    /// # Safety
    /// `file` was opened by [`open`] as a log.
    unsafe fn hand_over(file: *mut ffi::sqlite3_file) -> c_int {
        // SAFETY: per the contract, `file` is a `LogFile` and its real file follows it.
        unsafe {
            let this = &mut *file.cast::<LogFile>();
            if this.gathered.is_empty() {
                return ffi::SQLITE_OK;
            }
            let real = Self::real(file);
            let Some(write) = (*(*real).pMethods).xWrite else {
                this.gathered.clear();
                return ffi::SQLITE_IOERR_WRITE;
            };
            let mut code = ffi::SQLITE_OK;
            let mut at = this.start;
            for chunk in this.gathered.chunks(WRITE_MAX) {
                // Both fit: a chunk is at most `WRITE_MAX` bytes.
                let (Ok(len), Ok(step)) =
                    (c_int::try_from(chunk.len()), i64::try_from(chunk.len()))
                else {
                    code = ffi::SQLITE_IOERR_WRITE;
                    break;
                };
                counted();
                code = write(real, chunk.as_ptr().cast(), len, at);
                if code != ffi::SQLITE_OK {
                    break;
                }
                at += step;
            }
            this.gathered.clear();
            code
        }
    }
}

/// Whether `bytes` are a frame header that closes a commit (its "database size after
/// commit" field, bytes 4 to 8, is not zero).
fn is_commit_header(bytes: &[u8]) -> bool {
    bytes.len() == FRAME_HEADER && bytes[4..8] != [0, 0, 0, 0]
}

unsafe extern "C" fn open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let _ = vfs;
    let real_vfs = real_vfs();
    // SAFETY: SQLite hands `open` an allocation of this layer's `szOsFile` bytes, which is
    // room for a `LogFile` followed by the default layer's file, or for the default layer's
    // file alone; `real_vfs` is the default layer.
    unsafe {
        let Some(real_open) = real_vfs.as_ref().and_then(|v| v.xOpen) else {
            return ffi::SQLITE_ERROR;
        };
        if flags & ffi::SQLITE_OPEN_WAL == 0 {
            // Everything but the log: the default layer's file, as if opened by it.
            return real_open(real_vfs, name, file, flags, out_flags);
        }
        // Until the real file is open, SQLite must not call our methods on it.
        std::ptr::write(
            file.cast::<LogFile>(),
            LogFile {
                base: ffi::sqlite3_file {
                    pMethods: std::ptr::null(),
                },
                gathered: Vec::new(),
                start: 0,
                completes_commit: false,
            },
        );
        let code = real_open(real_vfs, name, LogFile::real(file), flags, out_flags);
        if code != ffi::SQLITE_OK {
            std::ptr::drop_in_place(file.cast::<LogFile>());
            // If the default layer left methods to close its half-open file, do so.
            let real = LogFile::real(file);
            if let Some(close) = (*real).pMethods.as_ref().and_then(|m| m.xClose) {
                close(real);
            }
            return code;
        }
        (*file).pMethods = &LOG_METHODS;
        ffi::SQLITE_OK
    }
}

/// The log's methods: gathered writes, everything else handed over first, then passed on.
static LOG_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    // Version 1: the shared-memory and memory-mapping methods belong to the database file,
    // never to its log.
    iVersion: 1,
    xClose: Some(log_close),
    xRead: Some(log_read),
    xWrite: Some(log_write),
    xTruncate: Some(log_truncate),
    xSync: Some(log_sync),
    xFileSize: Some(log_file_size),
    xLock: Some(log_lock),
    xUnlock: Some(log_unlock),
    xCheckReservedLock: Some(log_check_reserved_lock),
    xFileControl: Some(log_file_control),
    xSectorSize: Some(log_sector_size),
    xDeviceCharacteristics: Some(log_device_characteristics),
    xShmMap: None,
    xShmLock: None,
    xShmBarrier: None,
    xShmUnmap: None,
    xFetch: None,
    xUnfetch: None,
};

/// The default layer's method `$method` of the real file behind `$file`, or `$missing`.
macro_rules! real_method {
    ($file:expr, $method:ident, $missing:expr) => {{
        let real = LogFile::real($file);
        match (*(*real).pMethods).$method {
            Some(method) => (real, method),
            None => return $missing,
        }
    }};
}

unsafe extern "C" fn log_close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite calls this once, on a file `open` opened as a log.
    unsafe {
        let handed = LogFile::hand_over(file);
        let real = LogFile::real(file);
        let closed = match (*(*real).pMethods).xClose {
            Some(close) => close(real),
            None => ffi::SQLITE_OK,
        };
        std::ptr::drop_in_place(file.cast::<LogFile>());
        if handed != ffi::SQLITE_OK {
            handed
        } else {
            closed
        }
    }
}

unsafe extern "C" fn log_write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    // SAFETY: `file` is a log opened by `open`; `buf` holds `amount` bytes (SQLite's
    // contract for xWrite).
    unsafe {
        let Ok(len) = usize::try_from(amount) else {
            return ffi::SQLITE_IOERR_WRITE;
        };
        let bytes = std::slice::from_raw_parts(buf.cast::<u8>(), len);
        let this = &mut *file.cast::<LogFile>();
        let contiguous = this.gathered.is_empty()
            || i64::try_from(this.gathered.len())
                .is_ok_and(|gathered| this.start.checked_add(gathered) == Some(offset));
        if !contiguous {
            let handed = LogFile::hand_over(file);
            if handed != ffi::SQLITE_OK {
                return handed;
            }
        }
        if std::mem::take(&mut this.completes_commit) {
            // The page of a commit frame whose header (and everything before it) is
            // written, so nothing is gathered: straight through, so the commit is whole
            // before SQLite publishes it.
            let (real, write) = real_method!(file, xWrite, ffi::SQLITE_IOERR_WRITE);
            counted();
            return write(real, buf, amount, offset);
        }
        if this.gathered.is_empty() {
            this.start = offset;
        }
        this.gathered.extend_from_slice(bytes);
        if is_commit_header(bytes) {
            this.completes_commit = true;
            return LogFile::hand_over(file);
        }
        if this.gathered.len() >= GATHERED_MAX {
            return LogFile::hand_over(file);
        }
        ffi::SQLITE_OK
    }
}

/// Define a log method that hands over what is gathered, then calls the default layer's.
macro_rules! handed_over_then {
    ($name:ident, $method:ident, $missing:expr, ($($arg:ident: $ty:ty),*)) => {
        unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file, $($arg: $ty),*) -> c_int {
            // SAFETY: `file` is a log opened by `open`; the arguments are SQLite's, passed on.
            unsafe {
                let handed = LogFile::hand_over(file);
                if handed != ffi::SQLITE_OK {
                    return handed;
                }
                let (real, method) = real_method!(file, $method, $missing);
                method(real, $($arg),*)
            }
        }
    };
}

handed_over_then!(log_read, xRead, ffi::SQLITE_IOERR_READ, (buf: *mut c_void, amount: c_int, offset: i64));
handed_over_then!(log_truncate, xTruncate, ffi::SQLITE_IOERR_TRUNCATE, (size: i64));
handed_over_then!(log_sync, xSync, ffi::SQLITE_IOERR_FSYNC, (flags: c_int));
handed_over_then!(log_file_size, xFileSize, ffi::SQLITE_IOERR_FSTAT, (size: *mut i64));
handed_over_then!(log_file_control, xFileControl, ffi::SQLITE_NOTFOUND, (op: c_int, arg: *mut c_void));

/// Define a log method that calls the default layer's as it is.
macro_rules! passed_on {
    ($name:ident, $method:ident, $missing:expr, ($($arg:ident: $ty:ty),*)) => {
        unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file, $($arg: $ty),*) -> c_int {
            // SAFETY: `file` is a log opened by `open`; the arguments are SQLite's, passed on.
            unsafe {
                let (real, method) = real_method!(file, $method, $missing);
                method(real, $($arg),*)
            }
        }
    };
}

passed_on!(log_lock, xLock, ffi::SQLITE_OK, (level: c_int));
passed_on!(log_unlock, xUnlock, ffi::SQLITE_OK, (level: c_int));
passed_on!(log_check_reserved_lock, xCheckReservedLock, ffi::SQLITE_OK, (out: *mut c_int));
passed_on!(log_sector_size, xSectorSize, 4096, ());
passed_on!(log_device_characteristics, xDeviceCharacteristics, 0, ());

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::{Connection, OpenFlags};
    use std::path::Path;

    use crate::temp_dir;

    /// A connection through this layer, in WAL mode as the store runs it.
    fn gathering(path: &Path) -> Connection {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE;
        let db = Connection::open_with_flags_and_vfs(path, flags, register().unwrap()).unwrap();
        let mode: String = db
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        db.pragma_update(None, "synchronous", "NORMAL").unwrap();
        // Without a checkpoint, every commit stays in the log for the checks below.
        db.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        db.execute_batch(
            "CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB NOT NULL); CREATE INDEX t_v ON t (v);",
        )
        .unwrap();
        db
    }

    fn writes() -> u64 {
        WRITES.with(std::cell::Cell::get)
    }

    fn rows(db: &Connection) -> (i64, i64) {
        db.query_row(
            "SELECT count(*), coalesce(sum(length(v)), 0) FROM t",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap()
    }

    /// A row whose value spreads over pages, so a commit dirties several.
    fn insert(db: &Connection, k: i64, len: usize) {
        let value: Vec<u8> = (0..len).map(|i| (k as usize + i) as u8).collect();
        db.execute(
            "INSERT INTO t (k, v) VALUES (?1, ?2)",
            rusqlite::params![k, value],
        )
        .unwrap();
    }

    #[test]
    fn a_commit_of_many_pages_reaches_the_log_in_two_writes() {
        let dir = temp_dir("vfs-two-writes");
        let db = gathering(&dir.join("t.db"));
        insert(&db, 0, 10);
        let before = writes();
        // About five overflow pages, the table's leaf and the index's.
        insert(&db, 1, 5 * 4096);
        assert_eq!(
            writes() - before,
            2,
            "the gathered frames with the commit header, then its page"
        );
        let before = writes();
        db.execute_batch("BEGIN; UPDATE t SET v = zeroblob(9000) WHERE k = 1; INSERT INTO t VALUES (2, x'01'); COMMIT;")
            .unwrap();
        assert_eq!(writes() - before, 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn every_commit_is_seen_at_once_by_a_connection_of_the_default_layer() {
        let dir = temp_dir("vfs-seen");
        let path = dir.join("t.db");
        let db = gathering(&path);
        let other = Connection::open(&path).unwrap();
        let mut expected = (0, 0);
        for k in 0..200 {
            let len = [1, 700, 4096, 3 * 4096 + 5][k as usize % 4];
            insert(&db, k, len);
            expected = (expected.0 + 1, expected.1 + len as i64);
            assert_eq!(rows(&other), expected, "after commit {k}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn large_spilled_and_rewritten_transactions_commit_whole_and_roll_back_clean() {
        let dir = temp_dir("vfs-spilled");
        let path = dir.join("t.db");
        let db = gathering(&path);
        // A tiny page cache: a large transaction writes frames to the log before its
        // commit, and pages written twice are rewritten in place in the log.
        db.pragma_update(None, "cache_size", 4).unwrap();
        let other = Connection::open(&path).unwrap();
        // Larger than what is gathered before it is written anyway.
        db.execute_batch("BEGIN").unwrap();
        for k in 0..400 {
            insert(&db, k, 4000);
        }
        db.execute("UPDATE t SET v = zeroblob(3000) WHERE k % 3 = 0", [])
            .unwrap();
        db.execute_batch("COMMIT").unwrap();
        let committed = rows(&db);
        assert_eq!(committed.0, 400);
        assert_eq!(rows(&other), committed);
        // Spilled, then rolled back: nothing of it is seen, and the next commit is whole.
        db.execute_batch("BEGIN").unwrap();
        for k in 1000..1300 {
            insert(&db, k, 4000);
        }
        db.execute_batch("ROLLBACK").unwrap();
        assert_eq!(rows(&other), committed);
        insert(&db, 5000, 9000);
        let after = (committed.0 + 1, committed.1 + 9000);
        assert_eq!(rows(&other), after);
        assert_eq!(rows(&db), after);
        drop(other);

        // What a crash would leave (the log unchecked-pointed): a copy recovered by the
        // default layer checks every frame's checksum and keeps every commit.
        let copy = dir.join("copy.db");
        std::fs::copy(&path, &copy).unwrap();
        std::fs::copy(dir.join("t.db-wal"), dir.join("copy.db-wal")).unwrap();
        let recovered = Connection::open(&copy).unwrap();
        assert_eq!(rows(&recovered), after);
        let check: String = recovered
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok");
        drop(recovered);
        drop(db);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! `--db PATH`: which file each desk keeps its records in, and the read-only ledger view.
//!
//! Without `--db` every desk lives in memory and nothing here runs. With it, every
//! [`Desk`](crate::setup) opens a SQLite database of its own ([`store_sqlite::Database`]):
//! the kernel's ledger, rules and lockdown latch, and the action store of every driver the
//! desk builds. Desks never share a file, within a lecture or across lectures: the first
//! desk of a run gets `PATH`, the next `PATH.02`, then `PATH.03`, and so on ([`DbPlan`]; two
//! digits, so the files list in desk order).
//!
//! A file that already exists is never reused or overwritten: the desk refuses with
//! "`<file>` already exists; choose a new --db path or delete it". The file is created
//! with `create_new`, so two runs racing for one path cannot both get it.
//!
//! [`ledger_view`] is the other side: a person's process opening a file that an agent's
//! process wrote (or is still writing: the database is in WAL mode) and printing the
//! ledger, a page at a time, most recent first, and the open actions with the shell's
//! renderers. It opens the file read-only: it decides, sends and settles nothing, and
//! creates no file, not even next to the database. [`ledger_check`] is SQLite's full
//! check of every page, which opening never runs.

use std::fs::OpenOptions;
use std::io;
use std::path::{Path, PathBuf};

use kernel::{LedgerEntry, LedgerId};
use shell::{render_batch, render_ledger, render_rules};
use store_sqlite::{Database, LedgerReader, ReadEntry};

use crate::setup::visible;

/// Where the desks of one run keep their databases: `PATH` for the first desk, then
/// `PATH.02`, `PATH.03`, … in the order the desks open.
#[derive(Debug, Clone)]
pub struct DbPlan {
    base: PathBuf,
    opened: Vec<PathBuf>,
}

impl DbPlan {
    /// A plan whose first desk uses `base`.
    pub fn new(base: impl Into<PathBuf>) -> Self {
        Self {
            base: base.into(),
            opened: Vec::new(),
        }
    }

    /// The path given with `--db`.
    pub fn base(&self) -> &Path {
        &self.base
    }

    /// The file of the `n`-th desk of the run, counting from 1: `base` for the first,
    /// `base.NN` (two digits at least) after it.
    pub fn file(&self, n: usize) -> PathBuf {
        if n <= 1 {
            self.base.clone()
        } else {
            // Two digits, so that the files of a run list in desk order.
            let mut name = self.base.as_os_str().to_owned();
            name.push(format!(".{n:02}"));
            PathBuf::from(name)
        }
    }

    /// The files desks have opened so far, in order.
    pub fn files(&self) -> &[PathBuf] {
        &self.opened
    }

    /// What the desks of this run left on disk: each desk's file and, where present, its
    /// write-ahead log, shared-memory file and directory of session locks.
    pub fn leftovers(&self) -> Vec<PathBuf> {
        self.opened
            .iter()
            .flat_map(|file| {
                let side = |suffix: &str| {
                    let mut name = file.as_os_str().to_owned();
                    name.push(suffix);
                    PathBuf::from(name)
                };
                [file.clone(), side("-wal"), side("-shm"), side("-sessions")]
            })
            .filter(|path| path.exists())
            .collect()
    }

    /// For a run that failed: what it left on disk and how to clean it up before running
    /// again with the same `--db`; `None` when it left nothing.
    pub fn leftovers_note(&self) -> Option<String> {
        let left = self.leftovers();
        if left.is_empty() {
            return None;
        }
        let names: Vec<String> = left.iter().map(|p| shown_path(p)).collect();
        Some(format!(
            "this run left {} behind: {}; delete {} to run again with --db {}, or choose a new --db path",
            if left.len() == 1 { "a file" } else { "files" },
            names.join(", "),
            if left.len() == 1 { "it" } else { "them" },
            shown_path(&self.base),
        ))
    }

    /// Refuses, before anything runs, a plan that would meet a file of an earlier run:
    /// `base` or any `base.NN` next to it, or what SQLite and the store keep next to one
    /// (`-wal`, `-shm`, `-sessions`), naming every one at once so one clean-up is enough;
    /// and a `base` whose directory does not exist. (Each desk checks its own file again
    /// when it creates it; this only makes the refusal come first, before a transcript
    /// starts.)
    pub fn check_free(&self) -> anyhow::Result<()> {
        let dir = match self.base.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        if !dir.is_dir() {
            anyhow::bail!(
                "the directory {} of --db {} does not exist; create it first or choose another --db path",
                shown_path(dir),
                shown_path(&self.base)
            );
        }
        let Some(name) = self.base.file_name().and_then(|n| n.to_str()) else {
            return Ok(());
        };
        let entries = std::fs::read_dir(dir)
            .map_err(|e| anyhow::anyhow!("cannot list {}: {e}", shown_path(dir)))?;
        // (desk number, companion suffix, the path as the person wrote it)
        let mut taken: Vec<(u64, String, PathBuf)> = entries
            .flatten()
            .filter_map(|entry| {
                let file_name = entry.file_name();
                let rest = file_name.to_str()?.strip_prefix(name)?;
                let (stem, suffix) = ["-wal", "-shm", "-sessions"]
                    .iter()
                    .find_map(|s| rest.strip_suffix(s).map(|stem| (stem, *s)))
                    .unwrap_or((rest, ""));
                let desk = if stem.is_empty() {
                    1
                } else {
                    let digits = stem.strip_prefix('.')?;
                    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                        return None;
                    }
                    digits.parse().ok()?
                };
                // Shown as the person wrote the path: `base` followed by the rest.
                let mut shown = self.base.as_os_str().to_owned();
                shown.push(rest);
                Some((desk, suffix.to_owned(), PathBuf::from(shown)))
            })
            .collect();
        taken.sort();
        let names: Vec<String> = taken.iter().map(|(_, _, p)| shown_path(p)).collect();
        match names.as_slice() {
            [] => Ok(()),
            [one] => Err(anyhow::anyhow!(
                "{one} already exists; choose a new --db path or delete it"
            )),
            [first, rest @ ..] => Err(anyhow::anyhow!(
                "{first} already exists, and so do {}; choose a new --db path or delete them all (an earlier run's databases, with the -wal, -shm and -sessions files SQLite and the store keep next to them)",
                rest.join(", ")
            )),
        }
    }

    /// Creates the next desk's file (empty, refusing one that exists) and opens it.
    pub(crate) fn open_next(&mut self) -> anyhow::Result<(PathBuf, Database)> {
        let path = self.file(self.opened.len() + 1);
        let database = create_new(&path)?;
        self.opened.push(path.clone());
        Ok((path, database))
    }
}

/// The file names SQLite keeps next to a database in WAL mode. A leftover log holds
/// committed transactions of an earlier database: it is data too.
fn sidecars(path: &Path) -> [PathBuf; 2] {
    ["-wal", "-shm"].map(|suffix| {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    })
}

fn already_exists(path: &Path) -> anyhow::Error {
    anyhow::anyhow!(
        "{} already exists; choose a new --db path or delete it",
        shown_path(path)
    )
}

/// Creates a new database at `path`. Refuses, without touching anything, if `path` (or a
/// write-ahead log or shared-memory file of an earlier database there) already exists.
fn create_new(path: &Path) -> anyhow::Result<Database> {
    for sidecar in sidecars(path) {
        if sidecar.exists() {
            return Err(already_exists(&sidecar));
        }
    }
    match OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(_) => {}
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
            return Err(already_exists(path));
        }
        Err(error) => {
            return Err(anyhow::anyhow!(
                "cannot create the database {}: {error}",
                visible(&path.display().to_string())
            ));
        }
    }
    match Database::open(path) {
        Ok(database) => Ok(database),
        Err(error) => {
            // The empty file is ours, made a moment ago: do not leave it behind.
            if std::fs::metadata(path).is_ok_and(|m| m.len() == 0) {
                let _ = std::fs::remove_file(path);
            }
            Err(error.into())
        }
    }
}

/// Which page of the ledger [`ledger_view_page`] shows: at most `limit` entries, most
/// recent first, with ids below `before` (from the newest when `None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerPage {
    /// Show entries with ids below this one; `None` starts at the newest.
    pub before: Option<u64>,
    /// How many entries at most.
    pub limit: usize,
}

impl Default for LedgerPage {
    fn default() -> Self {
        Self {
            before: None,
            limit: 50,
        }
    }
}

/// `path` as one line a terminal shows as written: line breaks and every other control
/// character are shown as visible marks (`⟨U+000A⟩`), never acted on.
pub fn shown_path(path: &Path) -> String {
    one_line(&path.display().to_string())
}

fn one_line(text: &str) -> String {
    let marked: String = text
        .chars()
        .map(|c| match c {
            '\n' | '\r' | '\t' => format!("⟨U+{:04X}⟩", u32::from(c)),
            c => c.to_string(),
        })
        .collect();
    visible(&marked)
}

/// The first page of [`ledger_view_page`]: the newest entries.
pub fn ledger_view(path: &Path) -> anyhow::Result<String> {
    ledger_view_page(path, LedgerPage::default())
}

/// One page of the ledger of an existing database at `path`, most recent first, as a
/// person reads it; then the actions still waiting for a decision, the auto-approval
/// rules and whether the workspace is locked down.
///
/// It opens the file read-only ([`store_sqlite::LedgerReader`]): no write access is
/// needed, no file is created next to it (a backup on read-only media can be read), a
/// process may be writing it meanwhile, and nothing is decided, sent or settled. It reads
/// one page of entries and the open actions, never the whole ledger. An entry that cannot
/// be read back is shown as unreadable instead of hiding the rest.
pub fn ledger_view_page(path: &Path, page: LedgerPage) -> anyhow::Result<String> {
    let reader = open_reader(path)?;
    let shown = shown_path(path);
    let failed = |error: store_sqlite::StoreError| anyhow::anyhow!(one_line(&error.to_string()));
    let last = reader.last_id().map_err(failed)?;
    let entries = reader
        .page(page.before.map(LedgerId), page.limit.max(1))
        .map_err(failed)?;
    let mut out = String::new();
    match (entries.first(), entries.last()) {
        (Some(newest), Some(oldest)) => out.push_str(&format!(
            "The ledger in {shown}: #{} to #{} of {last}, most recent first:\n",
            read_id(newest),
            read_id(oldest)
        )),
        _ => out.push_str(&format!("The ledger in {shown}:\n")),
    }
    out.push_str(&render_entries(&entries));
    let oldest = entries.last().map_or(1, read_id);
    if oldest > 1 {
        out.push_str(&format!(
            "Older entries: cargo xtask lecture ledger --db {shown} --before {oldest}\n"
        ));
    }
    out.push('\n');
    if reader.locked_down().map_err(failed)? {
        out.push_str(
            "The workspace is locked down (it has read sensitive data): nothing may be applied.\n",
        );
    }
    let rules = reader.rules().map_err(failed)?;
    let (open, unreadable): (Vec<_>, Vec<_>) = reader
        .open_actions()
        .map_err(failed)?
        .into_iter()
        .partition(Result::is_ok);
    let open: Vec<LedgerEntry> = open.into_iter().flatten().collect();
    out.push_str(&format!("{}\n", render_batch(&open, &rules)));
    for entry in unreadable.into_iter().filter_map(Result::err) {
        out.push_str(&format!(
            "  {}  open, but unreadable: {}\n",
            entry.id,
            one_line(&entry.reason)
        ));
    }
    let claimed = reader.claimed().map_err(failed)?;
    if !claimed.is_empty() {
        let ids: Vec<String> = claimed.iter().map(ToString::to_string).collect();
        out.push_str(&format!(
            "Claimed, and so possibly sent: {}; a process that opens the file to write settles the claim of a process that died (outcome unknown).\n",
            ids.join(", ")
        ));
    }
    // Rule labels and enablers are untrusted: the shell renders them as it renders the batch.
    out.push_str(&format!("{}\n", render_rules(&rules)));
    Ok(out)
}

/// SQLite's full integrity check of the database at `path`, read-only. It reads every
/// page (opening a file never does); the answer says what it found.
pub fn ledger_check(path: &Path) -> anyhow::Result<String> {
    let reader = open_reader(path)?;
    let shown = shown_path(path);
    let findings = reader
        .check_integrity(100)
        .map_err(|e| anyhow::anyhow!(one_line(&e.to_string())))?;
    if findings.is_empty() {
        return Ok(format!(
            "{shown} passed SQLite's full integrity check: every page was read and is sound.\n"
        ));
    }
    let mut text = format!(
        "SQLite's full integrity check of {shown} found damage; restore the file from a backup:\n"
    );
    for finding in findings {
        text.push_str(&format!("  {}\n", one_line(&finding)));
    }
    anyhow::bail!(text.trim_end().to_owned())
}

fn open_reader(path: &Path) -> anyhow::Result<LedgerReader> {
    let shown = shown_path(path);
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(error) if error.kind() == io::ErrorKind::NotFound => anyhow::bail!(
            "no database at {shown}: the ledger view only reads an existing file and never creates one; run a lecture with --db {shown} first"
        ),
        Err(error) => anyhow::bail!("cannot read {shown}: {error}"),
    };
    if meta.is_file() && meta.len() == 0 {
        anyhow::bail!(
            "{shown} is empty: it holds no ledger; name the database file a lecture wrote"
        );
    }
    LedgerReader::open(path).map_err(|e| anyhow::anyhow!(one_line(&e.to_string())))
}

fn read_id(entry: &ReadEntry) -> u64 {
    match entry {
        Ok(entry) => entry.id.0,
        Err(unreadable) => unreadable.id.0,
    }
}

/// The entries of a page: runs of readable entries as the shell's ledger table, an
/// unreadable one as a line that says so.
fn render_entries(entries: &[ReadEntry]) -> String {
    if entries.is_empty() {
        return format!("{}\n", render_ledger(&[]));
    }
    let mut out = String::new();
    let mut run: Vec<LedgerEntry> = Vec::new();
    for entry in entries {
        match entry {
            Ok(entry) => run.push(entry.clone()),
            Err(unreadable) => {
                if !run.is_empty() {
                    out.push_str(&format!("{}\n", render_ledger(&run)));
                    run.clear();
                }
                out.push_str(&format!(
                    "  {}  unreadable: {}\n",
                    unreadable.id,
                    one_line(&unreadable.reason)
                ));
            }
        }
    }
    if !run.is_empty() {
        out.push_str(&format!("{}\n", render_ledger(&run)));
    }
    out
}

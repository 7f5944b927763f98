//! `--db PATH`: which file each desk keeps its records in, and the read-only ledger view.
//!
//! Without `--db` every desk lives in memory and nothing here runs. With it, every
//! [`Desk`](crate::setup) opens a SQLite database of its own ([`store_sqlite::Database`]):
//! the kernel's ledger, rules and lockdown latch, and the action store of every driver the
//! desk builds. Desks never share a file, within a lecture or across lectures: the first
//! desk of a run gets `PATH`, the next `PATH.2`, then `PATH.3`, and so on ([`DbPlan`]).
//!
//! A file that already exists is never reused or overwritten: the desk refuses with
//! "`<file>` already exists; choose a new --db path or delete it". The file is created
//! with `create_new`, so two runs racing for one path cannot both get it.
//!
//! [`ledger_view`] is the other side: a person's process opening a file that an agent's
//! process wrote (or is still writing: the database is in WAL mode) and printing the
//! ledger and the open actions with the shell's renderers. It decides nothing and sends
//! nothing; it never creates a file.

use std::fs::OpenOptions;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use kernel::{LedgerEntry, Overseer, SystemClock};
use shell::{render_batch, render_ledger, render_rules};
use store_sqlite::Database;

use crate::setup::visible;

/// Where the desks of one run keep their databases: `PATH` for the first desk, then
/// `PATH.2`, `PATH.3`, … in the order the desks open.
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
    /// `base.n` after it.
    pub fn file(&self, n: usize) -> PathBuf {
        if n <= 1 {
            self.base.clone()
        } else {
            let mut name = self.base.as_os_str().to_owned();
            name.push(format!(".{n}"));
            PathBuf::from(name)
        }
    }

    /// The files desks have opened so far, in order.
    pub fn files(&self) -> &[PathBuf] {
        &self.opened
    }

    /// Refuses, before anything runs, a plan that would meet a file of an earlier run:
    /// `base`, its write-ahead log, or any `base.N` next to it. (Each desk checks its own
    /// file again when it creates it; this only makes the refusal come first, before a
    /// transcript starts.)
    pub fn check_free(&self) -> anyhow::Result<()> {
        for path in std::iter::once(self.base.clone()).chain(sidecars(&self.base)) {
            if path.exists() {
                return Err(already_exists(&path));
            }
        }
        let Some(name) = self.base.file_name().and_then(|n| n.to_str()) else {
            return Ok(());
        };
        let dir = match self.base.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        let Ok(entries) = std::fs::read_dir(dir) else {
            // A missing directory: creating the first file says so clearly.
            return Ok(());
        };
        let mut taken: Vec<PathBuf> = entries
            .flatten()
            .filter(|entry| {
                entry.file_name().to_str().is_some_and(|other| {
                    other
                        .strip_prefix(name)
                        .and_then(|rest| rest.strip_prefix('.'))
                        .is_some_and(|rest| {
                            let n = ["-wal", "-shm"]
                                .iter()
                                .find_map(|s| rest.strip_suffix(s))
                                .unwrap_or(rest);
                            !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
                        })
                })
            })
            .map(|entry| {
                // Shown as the person wrote the path: `base` followed by the rest.
                let mut shown = self.base.as_os_str().to_owned();
                shown.push(&entry.file_name().to_string_lossy()[name.len()..]);
                PathBuf::from(shown)
            })
            .collect();
        taken.sort();
        match taken.first() {
            Some(path) => Err(already_exists(path)),
            None => Ok(()),
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
        visible(&path.display().to_string())
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

/// The ledger of an existing database at `path`, as a person reads it: every entry, then
/// the actions still waiting for a decision, the auto-approval rules and whether the
/// workspace is locked down.
///
/// Opens the file in this process next to any process still writing it. It never creates
/// a file: a missing or empty path is an error. It decides nothing and sends nothing.
/// Opening does run what store-sqlite runs on every open: a claim whose process has died
/// is settled as "interrupted" (see `store_sqlite`), so the view shows what a restarted
/// process would.
pub fn ledger_view(path: &Path) -> anyhow::Result<String> {
    let shown = visible(&path.display().to_string());
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(error) if error.kind() == io::ErrorKind::NotFound => anyhow::bail!(
            "no database at {shown}: the ledger view only reads an existing file and never creates one; run a lecture with --db {shown} first"
        ),
        Err(error) => anyhow::bail!("cannot read {shown}: {error}"),
    };
    if !meta.is_file() {
        anyhow::bail!("{shown} is not a file; name the database file a lecture wrote");
    }
    if meta.len() == 0 {
        anyhow::bail!(
            "{shown} is empty: it holds no ledger; name the database file a lecture wrote"
        );
    }
    let database =
        Database::open(path).with_context(|| format!("cannot read the ledger in {shown}"))?;
    // No gatekeeper is registered: this process only reads. The clock is never read for
    // anything shown here (entries carry the times they were written with).
    let overseer = Overseer::with_store(database.ledger(), Arc::new(SystemClock));
    let entries = overseer.ledger()?;
    // `Overseer::open_actions` lists the open actions of registered gatekeepers only;
    // with none registered, pick them from the ledger itself.
    let open: Vec<LedgerEntry> = entries
        .iter()
        .filter(|e| e.action().is_some_and(|a| a.is_open()))
        .cloned()
        .collect();
    let rules = overseer.rules()?;
    let mut out = String::new();
    out.push_str(&format!("The ledger in {shown}:\n"));
    out.push_str(&format!("{}\n", render_ledger(&entries)));
    out.push('\n');
    if overseer.is_locked_down()? {
        out.push_str(
            "The workspace is locked down (it has read sensitive data): nothing may be applied.\n",
        );
    }
    out.push_str(&format!("{}\n", render_batch(&open, &rules)));
    // Rule labels and enablers are untrusted: the shell renders them as it renders the batch.
    out.push_str(&format!("{}\n", render_rules(&rules)));
    Ok(out)
}

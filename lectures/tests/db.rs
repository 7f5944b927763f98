//! `--db PATH`: lectures on SQLite files, the refusal to reuse a file, and the ledger view.
//!
//! Every test works in a directory of its own under the system's temp dir, removed when
//! the test ends (the database, its write-ahead log and store-sqlite's session locks all
//! live next to the file).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};

use gatekeeper_core::ActionState;
use gatekeeper_core::store::INTERRUPTED_MESSAGE;
use kernel::DriverActionId;
use lectures::{
    Context, DbPlan, LECTURES, LedgerPage, find, ledger_check, ledger_view, ledger_view_page,
    run_lecture, transcript,
};
use store_sqlite::Database;

/// A directory under the system's temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(label: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "lectures-db-{label}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("temp dir");
        Self(path)
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `name` with `plan`; returns the transcript (or the error) and the plan afterwards.
async fn run_with(name: &str, plan: DbPlan) -> (anyhow::Result<String>, DbPlan) {
    let lecture = find(name).expect("a lecture");
    let mut out = Vec::new();
    let (result, plan) = {
        let mut cx = Context::scripted(&mut out).with_db(plan);
        let result = run_lecture(lecture, &mut cx).await;
        (result, cx.db().expect("the plan").clone())
    };
    let text = String::from_utf8(out).expect("utf-8");
    (result.map(|()| text), plan)
}

/// Runs the binary with `args`, then `--db path`.
fn run_db(args: &[&str], path: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lectures"))
        .args(args)
        .arg("--db")
        .arg(path)
        .output()
        .expect("runs")
}

/// Runs the binary with `args` and `--db path`, which must succeed; returns its stdout.
fn succeeds(args: &[&str], path: &Path) -> String {
    let output = run_db(args, path);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Runs the binary with `args` and `--db path`, which must fail without printing anything
/// to stdout (`why` says what that shows); returns its stderr.
fn refused(args: &[&str], path: &Path, why: &str) -> String {
    let output = run_db(args, path);
    assert!(!output.status.success());
    assert!(output.stdout.is_empty(), "{why}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn desk_line(path: &Path) -> String {
    format!(
        "  [--db: this desk's ledger, rules and action stores live in {}]",
        path.display()
    )
}

#[tokio::test]
async fn ex06_with_a_db_reopens_the_file_and_recovers_the_claim_as_failed() {
    let dir = TempDir::new("ex06");
    let path = dir.join("gate.db");
    let (text, plan) = run_with("ex06", DbPlan::new(&path)).await;
    let text = text.expect("ex06 runs on a file");
    assert_eq!(
        plan.files(),
        std::slice::from_ref(&path),
        "ex06 opens one desk"
    );
    assert_eq!(text.matches("[--db: this desk's").count(), 1, "{text}");
    assert!(text.contains(&desk_line(&path)), "{text}");
    let expected = [
        format!("restart: every handle of {} is closed", path.display()),
        "the reopened file keeps the record: the ledger says #4 is failed, not retryable"
            .to_owned(),
        // What the person sees as soon as the gate is back, before deciding anything.
        "── #4 · failed, outcome unknown · [issues]".to_owned(),
        "could not approve #4: «action #4 failed and cannot be retried".to_owned(),
        // The same evidence as in memory.
        "evidence: #4: store state before the restart = failed".to_owned(),
        "evidence: #4: calls the tracker received before the restart = 1".to_owned(),
        "evidence: #4: calls sent after the restart = 0".to_owned(),
        "evidence: #4: state after approving again = failed, not retryable".to_owned(),
        "evidence: tracker calls in all = 5".to_owned(),
    ];
    for line in &expected {
        assert!(text.contains(line.as_str()), "missing {line:?} in:\n{text}");
    }

    // The file itself holds the settled claim: failed for good, in the action store.
    let db = Database::open(&path).expect("reopens");
    let record = db
        .action_storage("issues")
        .get(DriverActionId(4))
        .await
        .expect("reads")
        .expect("action 4 is stored");
    assert_eq!(
        record.state,
        ActionState::Failed {
            retryable: false,
            message: INTERRUPTED_MESSAGE.into()
        }
    );
}

#[tokio::test]
async fn ex06_in_memory_and_on_a_file_show_the_same_evidence() {
    let dir = TempDir::new("evidence");
    let evidence = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with("  evidence: "))
            .map(str::to_owned)
            .collect()
    };
    let memory = transcript("ex06").await.expect("runs in memory");
    let (file, _) = run_with("ex06", DbPlan::new(dir.join("gate.db"))).await;
    let file = file.expect("runs on a file");
    assert_eq!(evidence(&memory).len(), 12, "{memory}");
    assert_eq!(evidence(&memory), evidence(&file));
}

#[tokio::test]
async fn a_second_run_on_the_same_path_is_refused_and_the_file_is_left_alone() {
    let dir = TempDir::new("twice");
    let path = dir.join("gate.db");
    let first = succeeds(&["ex06"], &path);
    assert!(first.contains(&desk_line(&path)), "{first}");
    let before = std::fs::read(&path).expect("the file exists");
    let refusal = format!(
        "{} already exists; choose a new --db path or delete it",
        path.display()
    );

    // The binary refuses before the transcript starts.
    let stderr = refused(&["ex06"], &path, "nothing runs");
    // What the earlier run keeps next to its file is named with it: one clean-up.
    assert!(
        stderr.contains(&format!(
            "{} already exists, and so do {}-sessions; choose a new --db path or delete them all",
            path.display(),
            path.display()
        )),
        "{stderr}"
    );

    // So does a desk, through the library.
    let (again, plan) = run_with("ex06", DbPlan::new(&path)).await;
    let error = format!("{:#}", again.expect_err("refused"));
    assert!(error.contains(&refusal), "{error}");
    assert!(plan.files().is_empty(), "no desk opened");

    assert_eq!(
        std::fs::read(&path).expect("still there"),
        before,
        "untouched"
    );
}

#[tokio::test]
async fn every_file_of_an_earlier_run_is_named_at_once_in_desk_order() {
    let dir = TempDir::new("all-at-once");
    let path = dir.join("gate.db");
    for name in ["gate.db.10", "gate.db.02", "gate.db.02-wal", "gate.db"] {
        std::fs::write(dir.join(name), b"an earlier run").expect("writes");
    }
    let stderr = refused(&["ex05"], &path, "nothing runs");
    let d = dir.join("").display().to_string();
    let d = d.trim_end_matches('/');
    assert!(
        stderr.contains(&format!(
            "{d}/gate.db already exists, and so do {d}/gate.db.02, {d}/gate.db.02-wal, {d}/gate.db.10; choose a new --db path or delete them all"
        )),
        "{stderr}"
    );
}

#[test]
fn a_missing_directory_is_refused_before_the_banner() {
    let dir = TempDir::new("no-dir");
    let path = dir.join("missing").join("gate.db");
    let stderr = refused(&["ex05"], &path, "no banner");
    assert!(
        stderr.contains("does not exist; create it first or choose another --db path"),
        "{stderr}"
    );
}

#[test]
fn desk_files_sort_in_desk_order() {
    let plan = DbPlan::new("gate.db");
    let mut names: Vec<PathBuf> = (1..=31).map(|n| plan.file(n)).collect();
    let in_order = names.clone();
    names.sort();
    assert_eq!(names, in_order);
}

#[tokio::test]
async fn a_later_desk_file_of_an_earlier_run_is_refused_before_anything_runs() {
    let dir = TempDir::new("later");
    let path = dir.join("gate.db");
    std::fs::write(dir.join("gate.db.03"), b"someone's data").expect("writes");
    let stderr = refused(&["all"], &path, "nothing runs");
    assert!(
        stderr.contains("gate.db.03 already exists; choose a new --db path or delete it"),
        "{stderr}"
    );
    assert!(!path.exists(), "no file created");
    assert_eq!(
        std::fs::read(dir.join("gate.db.03")).expect("kept"),
        b"someone's data"
    );
}

#[tokio::test]
async fn the_ledger_view_lists_the_ex06_entries() {
    let dir = TempDir::new("view");
    let path = dir.join("gate.db");
    let (text, _) = run_with("ex06", DbPlan::new(&path)).await;
    text.expect("ex06 runs on a file");

    let view = ledger_view(&path).expect("reads the file");
    assert!(
        view.starts_with(&format!(
            "The ledger in {}: #4 to #1 of 4, most recent first:\n",
            path.display()
        )),
        "{view}"
    );
    let entries: Vec<&str> = view.lines().filter(|l| l.starts_with("  #")).collect();
    assert_eq!(entries.len(), 4, "{view}");
    for (line, (id, state)) in entries.iter().zip([
        ("#4", "failed, outcome unknown"),
        ("#3", "approved, applied"),
        ("#2", "failed, outcome unknown"),
        ("#1", "approved, applied"),
    ]) {
        assert!(line.starts_with(&format!("  {id} ")), "{line}");
        assert!(line.contains(state), "{line}");
        assert!(line.contains("[issues]"), "{line}");
    }
    assert!(view.contains("Nothing waits for you."), "{view}");
    assert!(
        view.contains("No auto-approval rules are enabled."),
        "{view}"
    );

    // The binary prints the same.
    assert_eq!(succeeds(&["ledger"], &path), view);
}

#[tokio::test]
async fn the_ledger_view_never_creates_a_file() {
    let dir = TempDir::new("missing");
    let path = dir.join("nothing-here.db");
    let error = format!("{:#}", ledger_view(&path).expect_err("no file"));
    assert!(error.contains("no database at"), "{error}");
    assert!(error.contains("never creates one"), "{error}");
    assert!(!path.exists());

    let stderr = refused(&["ledger"], &path, "nothing is printed");
    assert!(stderr.contains("no database at"), "{stderr}");
    assert!(!path.exists());
    assert_eq!(
        std::fs::read_dir(&dir.0).expect("lists").count(),
        0,
        "nothing was created next to it either"
    );
}

/// Lines that only exist with `--db`: a desk's location, and the note (after a blank
/// line) of a lecture that opened no desk.
fn without_db_lines(text: &str) -> Vec<String> {
    let mut kept: Vec<String> = Vec::new();
    for line in text.lines() {
        if line.starts_with("  [--db: ") {
            continue;
        }
        if line.starts_with("[--db: ") {
            assert_eq!(
                kept.pop().as_deref(),
                Some(""),
                "the note follows a blank line"
            );
            continue;
        }
        if line.contains("turn ended in") {
            continue;
        }
        kept.push(without_times(line));
    }
    kept
}

/// The words of `lines`, with the pieces of a label cut over two lines (`«a»`, `«b»`)
/// made one again (`«a b»`): a time on a wall clock is longer than the lectures' fixed
/// clock, so a line may be wrapped elsewhere (see `shell::wrap`) without saying anything
/// else.
fn words(lines: &[String]) -> Vec<String> {
    lines
        .join(" ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace("» «", " ")
        .split(' ')
        .map(str::to_owned)
        .collect()
}

/// `line` with every time (`09:00:01.000`, or `2026-11-30 20:15:00.250` on a wall clock)
/// replaced by `[time]` and runs of spaces (a table's alignment) made one: a run with
/// `--db` records real time, one in memory the lectures' fixed clock.
fn without_times(line: &str) -> String {
    fn shape(bytes: &[u8], pattern: &[u8]) -> bool {
        bytes.len() >= pattern.len()
            && pattern.iter().zip(bytes).all(|(p, b)| match p {
                b'9' => b.is_ascii_digit(),
                other => other == b,
            })
    }
    let bytes = line.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < bytes.len() {
        let rest = &bytes[i..];
        let len = if shape(rest, b"9999-99-99 99:99:99.999") {
            23
        } else if shape(rest, b"99:99:99.999") {
            12
        } else {
            0
        };
        if len > 0 {
            out.push_str("[time]");
            i += len;
        } else {
            let c = line[i..].chars().next().expect("a char");
            if !(c == ' ' && out.ends_with("  ")) {
                out.push(c);
            }
            i += c.len_utf8();
        }
    }
    out
}

#[tokio::test]
async fn with_a_db_every_desk_has_its_own_file_and_every_other_lecture_reads_the_same() {
    let dir = TempDir::new("all");
    let path = dir.join("gate.db");
    let mut plan = DbPlan::new(&path);
    let mut desks = 0;
    let mut ex02 = Vec::new();
    for lecture in LECTURES {
        let memory = transcript(lecture.name).await.expect("runs in memory");
        let before = plan.files().len();
        let (file, after) = run_with(lecture.name, plan).await;
        plan = after;
        let file = file.unwrap_or_else(|e| panic!("{} on a file: {e:#}", lecture.name));
        let opened = &plan.files()[before..];
        for desk in opened {
            assert!(file.contains(&desk_line(desk)), "{}: {file}", lecture.name);
            assert!(desk.is_file(), "{}", desk.display());
        }
        if opened.is_empty() {
            assert!(
                file.contains("[--db: this lecture opened no desk"),
                "{file}"
            );
        }
        desks += opened.len();
        if lecture.name == "ex02" {
            ex02 = opened.to_vec();
        }
        // ex06's restart reads differently on a file (the reopened file has already
        // settled the claim); its evidence is compared in its own test.
        if lecture.name != "ex06" {
            assert_eq!(
                words(&without_db_lines(&memory)),
                words(&without_db_lines(&file)),
                "{} reads differently with --db",
                lecture.name
            );
        }
    }
    let files = plan.files();
    assert_eq!(files.len(), desks);
    assert!(desks >= 2, "at least one lecture opens two desks");
    assert_eq!(files[0], path);
    for (n, file) in files.iter().enumerate().skip(1) {
        assert_eq!(
            file,
            &PathBuf::from(format!("{}.{:02}", path.display(), n + 1))
        );
    }

    // ex02 opens two desks: the honest tracker's still has its two open actions, the
    // lying tracker's only the read that ran without approval.
    assert_eq!(ex02.len(), 2, "{ex02:?}");
    let honest = ledger_view(&ex02[0]).expect("reads");
    assert!(
        honest.contains("2 actions wait for you, oldest first:"),
        "{honest}"
    );
    let liar = ledger_view(&ex02[1]).expect("reads");
    assert!(liar.contains("[liar]"), "{liar}");
    assert!(liar.contains("Nothing waits for you."), "{liar}");
}

/// The names in a directory, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("lists")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A database file of `n` observations, written through store-sqlite, closed.
fn observations(path: &Path, n: u64) {
    let db = Database::open(path).expect("creates");
    let ledger = db.ledger();
    for i in 1..=n {
        ledger
            .insert(&mut |id| kernel::LedgerEntry {
                id,
                gatekeeper: "wiki".into(),
                caller: "agent".into(),
                created_at: kernel::Timestamp(i),
                body: kernel::EntryBody::Observation(kernel::ObservationDescription::new(
                    format!("read page {i}"),
                    "",
                )),
            })
            .expect("writes");
    }
}

#[tokio::test]
async fn the_ledger_view_creates_nothing_next_to_the_file_and_needs_no_write_access() {
    let dir = TempDir::new("read-only");
    let home = dir.join("home");
    std::fs::create_dir(&home).expect("dir");
    let path = home.join("gate.db");
    let (text, _) = run_with("ex06", DbPlan::new(&path)).await;
    text.expect("ex06 runs on a file");
    let _ = std::fs::remove_dir_all(home.join("gate.db-sessions"));
    let before = listing(&home);
    assert_eq!(before, ["gate.db"], "the run closed its file");

    let view = ledger_view(&path).expect("reads");
    assert!(view.contains("#4 to #1 of 4"), "{view}");
    assert_eq!(
        listing(&home),
        before,
        "no session lock, no log, no shared memory"
    );

    // On read-only media: a read-only file in a directory that takes no new file.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).expect("chmod");
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o555)).expect("chmod");
    let frozen = std::fs::File::create(home.join("probe")).is_err();
    let again = ledger_view(&path);
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    if frozen {
        assert_eq!(again.expect("reads a read-only file"), view);
    } else {
        // Root: permissions do not stop it; the listing check above still holds.
        let _ = std::fs::remove_file(home.join("probe"));
        again.expect("reads");
    }
    assert_eq!(listing(&home), before);
}

#[tokio::test]
async fn the_ledger_view_pages_most_recent_first() {
    let dir = TempDir::new("pages");
    let path = dir.join("gate.db");
    observations(&path, 120);
    let ids = |view: &str| -> Vec<String> {
        view.lines()
            .filter(|l| l.starts_with("  #"))
            .map(|l| l.split_whitespace().next().expect("an id").to_owned())
            .collect()
    };
    let first = ledger_view_page(
        &path,
        LedgerPage {
            before: None,
            limit: 50,
        },
    )
    .expect("reads");
    assert!(
        first.contains("#120 to #71 of 120, most recent first"),
        "{first}"
    );
    let expected: Vec<String> = (71..=120).rev().map(|i| format!("#{i}")).collect();
    assert_eq!(ids(&first), expected);
    assert!(
        first.contains(&format!(
            "Older entries: cargo xtask lecture ledger --db {} --before 71",
            path.display()
        )),
        "{first}"
    );
    let last = ledger_view_page(
        &path,
        LedgerPage {
            before: Some(21),
            limit: 50,
        },
    )
    .expect("reads");
    let expected: Vec<String> = (1..=20).rev().map(|i| format!("#{i}")).collect();
    assert_eq!(ids(&last), expected);
    assert!(!last.contains("Older entries"), "{last}");

    // The binary takes the same page.
    let output = succeeds(&["ledger", "--limit", "3", "--before", "5"], &path);
    assert_eq!(ids(&output), ["#4", "#3", "#2"]);
}

#[tokio::test]
async fn the_ledger_view_shows_one_unreadable_entry_and_the_rest() {
    let dir = TempDir::new("unreadable");
    let path = dir.join("gate.db");
    observations(&path, 5);
    // An entry nested too deeply to read back, as staging once let through.
    let deep = format!("{{\"title\":{}1{}}}", "[".repeat(200), "]".repeat(200));
    damage_entry_3(&path, &deep);
    let view = ledger_view(&path).expect("the rest is readable");
    let line = view
        .lines()
        .find(|l| l.starts_with("  #3 "))
        .unwrap_or_else(|| panic!("#3 is listed: {view}"));
    assert!(
        line.contains("unreadable: the description of ledger entry 3 cannot be read back"),
        "{line}"
    );
    for id in ["#5", "#4", "#2", "#1"] {
        assert!(
            view.lines().any(|l| l.starts_with(&format!("  {id} "))),
            "{id}: {view}"
        );
    }
}

/// Replace entry 3's description with `json`, behind store-sqlite's back.
fn damage_entry_3(path: &Path, json: &str) {
    let raw = rusqlite::Connection::open(path).expect("opens");
    let changed = raw
        .execute(
            "UPDATE ledger SET description_json = ?1 WHERE id = 3",
            [json],
        )
        .expect("writes");
    assert_eq!(changed, 1);
}

#[tokio::test]
async fn a_newline_in_the_database_path_is_shown_not_printed() {
    let dir = TempDir::new("newline");
    let path = dir.join("gate\n.db");
    observations(&path, 1);
    let view = ledger_view(&path).expect("reads");
    let header = view.lines().next().expect("a header");
    assert!(header.starts_with("The ledger in "), "{view}");
    assert!(header.contains("gate⟨U+000A⟩.db"), "{header}");
    assert!(header.ends_with("most recent first:"), "{header}");
}

#[tokio::test]
async fn the_full_check_is_a_command_of_its_own() {
    let dir = TempDir::new("check");
    let path = dir.join("gate.db");
    observations(&path, 3);
    let text = ledger_check(&path).expect("sound");
    assert!(
        text.contains("passed SQLite's full integrity check"),
        "{text}"
    );
    assert_eq!(succeeds(&["ledger", "--check"], &path), text);
}

#[tokio::test]
async fn a_failed_run_says_what_it_left_and_how_to_clean_it() {
    let dir = TempDir::new("leftovers");
    let path = dir.join("gate.db");
    // ex02's second desk cannot open: something is in the way of its session locks. (The
    // binary refuses that before it starts; a desk meets it only if it appears mid-run,
    // which the library shows.)
    std::fs::write(dir.join("gate.db.02-sessions"), b"in the way").expect("writes");
    let (result, plan) = run_with("ex02", DbPlan::new(&path)).await;
    let error = format!("{:#}", result.expect_err("the second desk fails"));
    assert!(
        error.contains("gate.db.02-sessions is in the way"),
        "{error}"
    );
    let stderr = plan.leftovers_note().expect("a note");
    assert!(stderr.contains("this run left files behind: "), "{stderr}");
    assert!(
        stderr.contains("delete them to run again with --db"),
        "{stderr}"
    );
    let note = stderr
        .lines()
        .find(|l| l.starts_with("this run left"))
        .expect("the note");
    let listed = note
        .trim_start_matches("this run left files behind: ")
        .split("; delete")
        .next()
        .expect("the list");
    let listed: Vec<&str> = listed.split(", ").collect();
    assert!(
        listed.contains(&path.to_str().expect("utf-8")),
        "{listed:?}"
    );
    assert!(
        !listed.iter().any(|p| p.contains(".db.02")),
        "the refused desk left nothing: {listed:?}"
    );

    // Doing what it says (and moving the obstacle aside) lets the same command run.
    for file in listed {
        let file = Path::new(file);
        if file.is_dir() {
            std::fs::remove_dir_all(file).expect("removes");
        } else {
            std::fs::remove_file(file).expect("removes");
        }
    }
    std::fs::remove_file(dir.join("gate.db.02-sessions")).expect("removes");
    succeeds(&["ex02"], &path);
}

#[tokio::test]
async fn a_run_that_keeps_a_real_ledger_records_real_time_not_1970() {
    let dir = TempDir::new("real-time");
    let path = dir.join("gate.db");
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis();
    let (text, _) = run_with("ex03", DbPlan::new(&path)).await;
    text.expect("ex03 runs on a file");
    let db = Database::open(&path).expect("reopens");
    let entries = db.ledger().entries().expect("reads");
    assert!(!entries.is_empty());
    for entry in &entries {
        assert!(
            u128::from(entry.created_at.0) >= before,
            "{} was recorded at {}",
            entry.id,
            entry.created_at
        );
    }
    // The view a person reads later shows the date with the time.
    let view = ledger_view(&path).expect("reads the file");
    let year = entries[0].created_at.to_string()[..4].to_owned();
    assert!(
        view.lines()
            .any(|l| l.starts_with("  #1  ") && l.contains(&year)),
        "{view}"
    );
    // The same lecture in memory keeps the fixed clock of its snapshot.
    assert!(
        transcript("ex03")
            .await
            .expect("runs")
            .contains("  #1  09:00:00.000  read")
    );
}

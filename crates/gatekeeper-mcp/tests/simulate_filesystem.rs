//! The filesystem simulator against a model of `@modelcontextprotocol/server-filesystem`
//! that works on real files in a temporary directory: its reads answer what the server's
//! reads answer (the same texts, from `std::fs`), its writes do what the server's writes
//! do (written from the server's `lib.js` and `index.js`, 2026.8.31). A simulated read over
//! the directory before the writes must equal the model's read after applying them.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use gatekeeper_core::{Content, ToolResult};
use gatekeeper_mcp::simulate::filesystem::Filesystem;
use gatekeeper_mcp::simulate::glob::Glob;
use gatekeeper_mcp::simulate::{Answer, PendingWrite, ReadCall, RealReads, Simulator};
use proptest::prelude::*;
use serde_json::{Value, json};

/// The server, over the files on disk.
struct Server {
    /// Every read it answered, as (tool, arguments).
    reads: Mutex<Vec<(String, Value)>>,
}

fn error(text: String) -> ToolResult {
    let mut result = ToolResult::from_text(text);
    result.is_error = true;
    result
}

fn ok(text: String) -> ToolResult {
    let mut result = ToolResult::from_text(text.clone());
    result.structured_content = Some(json!({ "content": text }));
    result
}

fn io_message(e: &std::io::Error, verb: &str, path: &str) -> String {
    let code = match e.kind() {
        std::io::ErrorKind::NotFound => "ENOENT: no such file or directory",
        std::io::ErrorKind::NotADirectory => "ENOTDIR: not a directory",
        std::io::ErrorKind::IsADirectory => "EISDIR: illegal operation on a directory",
        _ => "EIO",
    };
    format!("{code}, {verb} '{path}'")
}

fn arg<'a>(args: &'a Value, key: &str) -> &'a str {
    args.get(key).and_then(Value::as_str).unwrap_or_default()
}

impl Server {
    fn new() -> Self {
        Self {
            reads: Mutex::new(Vec::new()),
        }
    }

    fn read_now(&self, tool: &str, args: &Value) -> ToolResult {
        self.reads
            .lock()
            .unwrap()
            .push((tool.to_owned(), args.clone()));
        match tool {
            "read_text_file" => {
                let path = arg(args, "path");
                match std::fs::read(path) {
                    Err(e) => error(io_message(&e, "open", path)),
                    Ok(bytes) => {
                        let text = String::from_utf8_lossy(&bytes).into_owned();
                        let head = args.get("head").and_then(Value::as_u64).unwrap_or(0) as usize;
                        let tail = args.get("tail").and_then(Value::as_u64).unwrap_or(0) as usize;
                        if head > 0 {
                            let mut lines: Vec<&str> = text.split('\n').collect();
                            if lines.last() == Some(&"") {
                                lines.pop();
                            }
                            ok(lines.into_iter().take(head).collect::<Vec<_>>().join("\n"))
                        } else if tail > 0 {
                            let text = text.replace("\r\n", "\n");
                            let lines: Vec<&str> = text.split('\n').collect();
                            ok(lines[lines.len().saturating_sub(tail)..].join("\n"))
                        } else {
                            ok(text)
                        }
                    }
                }
            }
            "read_multiple_files" => {
                let parts: Vec<String> = args["paths"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| {
                        let p = p.as_str().unwrap();
                        match std::fs::read(p) {
                            Ok(bytes) => format!("{p}:\n{}\n", String::from_utf8_lossy(&bytes)),
                            Err(e) => format!("{p}: Error - {}", io_message(&e, "open", p)),
                        }
                    })
                    .collect();
                ok(parts.join("\n---\n"))
            }
            "list_directory" => {
                let path = arg(args, "path");
                match std::fs::read_dir(path) {
                    Err(e) => error(io_message(&e, "scandir", path)),
                    Ok(entries) => ok(entries
                        .map(|e| {
                            let e = e.unwrap();
                            let dir = e.file_type().unwrap().is_dir();
                            format!(
                                "{} {}",
                                if dir { "[DIR]" } else { "[FILE]" },
                                e.file_name().to_string_lossy()
                            )
                        })
                        .collect::<Vec<_>>()
                        .join("\n")),
                }
            }
            "get_file_info" => {
                let path = arg(args, "path");
                match std::fs::metadata(path) {
                    Err(e) => error(io_message(&e, "stat", path)),
                    Ok(m) => ok(format!(
                        "size: {}\ncreated: then\nmodified: then\naccessed: then\nisDirectory: {}\nisFile: {}\npermissions: 644",
                        m.len(),
                        m.is_dir(),
                        m.is_file()
                    )),
                }
            }
            "directory_tree" => {
                let path = arg(args, "path");
                let excludes: Vec<String> = args
                    .get("excludePatterns")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().map(|p| p.as_str().unwrap().to_owned()).collect())
                    .unwrap_or_default();
                fn tree(root: &Path, dir: &Path, excludes: &[String]) -> std::io::Result<Value> {
                    let mut out = Vec::new();
                    for e in std::fs::read_dir(dir)? {
                        let e = e?;
                        let full = e.path();
                        let rel = full
                            .strip_prefix(root)
                            .unwrap()
                            .to_string_lossy()
                            .into_owned();
                        let excluded = excludes.iter().any(|p| {
                            let g = |p: &str| Glob::new(p).unwrap().matches(&rel);
                            if p.contains('*') {
                                g(p)
                            } else {
                                g(p) || g(&format!("**/{p}")) || g(&format!("**/{p}/**"))
                            }
                        });
                        if excluded {
                            continue;
                        }
                        let name = e.file_name().to_string_lossy().into_owned();
                        if e.file_type()?.is_dir() {
                            out.push(json!({"name": name, "type": "directory", "children": tree(root, &full, excludes)?}));
                        } else {
                            out.push(json!({"name": name, "type": "file"}));
                        }
                    }
                    Ok(Value::Array(out))
                }
                match tree(Path::new(path), Path::new(path), &excludes) {
                    Ok(v) => ok(serde_json::to_string_pretty(&v).unwrap()),
                    Err(e) => error(io_message(&e, "scandir", path)),
                }
            }
            "search_files" => {
                let path = arg(args, "path");
                let pattern = Glob::new(arg(args, "pattern")).unwrap();
                let excludes: Vec<Glob> = args
                    .get("excludePatterns")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .map(|p| Glob::new(p.as_str().unwrap()).unwrap())
                            .collect()
                    })
                    .unwrap_or_default();
                fn search(
                    root: &Path,
                    dir: &Path,
                    pattern: &Glob,
                    excludes: &[Glob],
                    out: &mut Vec<String>,
                ) -> std::io::Result<()> {
                    for e in std::fs::read_dir(dir)? {
                        let e = e?;
                        let full = e.path();
                        let rel = full
                            .strip_prefix(root)
                            .unwrap()
                            .to_string_lossy()
                            .into_owned();
                        if excludes.iter().any(|g| g.matches(&rel)) {
                            continue;
                        }
                        if pattern.matches(&rel) {
                            out.push(full.to_string_lossy().into_owned());
                        }
                        if e.file_type()?.is_dir() {
                            search(root, &full, pattern, excludes, out)?;
                        }
                    }
                    Ok(())
                }
                let mut out = Vec::new();
                match search(
                    Path::new(path),
                    Path::new(path),
                    &pattern,
                    &excludes,
                    &mut out,
                ) {
                    Ok(()) if out.is_empty() => ok("No matches found".to_owned()),
                    Ok(()) => ok(out.join("\n")),
                    Err(e) => error(io_message(&e, "scandir", path)),
                }
            }
            other => panic!("the model has no read {other}"),
        }
    }

    /// Apply a write as the server does; `Err` when the server would fail it.
    fn apply(&self, tool: &str, args: &Value) -> Result<(), String> {
        let fail = |e: std::io::Error| e.to_string();
        match tool {
            "write_file" => {
                let path = Path::new(arg(args, "path"));
                if !path.parent().unwrap().is_dir() {
                    return Err("parent directory does not exist".into());
                }
                if path.is_dir() {
                    return Err("EISDIR".into());
                }
                std::fs::write(path, arg(args, "content")).map_err(fail)
            }
            "edit_file" => {
                let path = arg(args, "path");
                let mut text = std::fs::read_to_string(path)
                    .map_err(fail)?
                    .replace("\r\n", "\n");
                for edit in args["edits"].as_array().unwrap() {
                    let old = arg(edit, "oldText").replace("\r\n", "\n");
                    let new = arg(edit, "newText").replace("\r\n", "\n");
                    // The generated texts hold no whitespace, so the server's line-by-line
                    // matching finds only what the exact match finds.
                    if !text.contains(&old) {
                        return Err(format!("Could not find exact match for edit:\n{old}"));
                    }
                    text = text.replacen(&old, &new, 1);
                }
                if args.get("dryRun") == Some(&Value::Bool(true)) {
                    return Ok(());
                }
                std::fs::write(path, text).map_err(fail)
            }
            "create_directory" => std::fs::create_dir_all(arg(args, "path")).map_err(fail),
            "move_file" => {
                let (from, to) = (arg(args, "source"), arg(args, "destination"));
                if std::fs::symlink_metadata(to).is_ok() {
                    return Err("Destination already exists".into());
                }
                std::fs::rename(from, to).map_err(fail)
            }
            other => panic!("the model has no write {other}"),
        }
    }
}

#[async_trait]
impl RealReads for Server {
    async fn read(&self, tool: &str, args: Value) -> Result<ToolResult, String> {
        Ok(self.read_now(tool, &args))
    }
}

static NEXT: AtomicUsize = AtomicUsize::new(0);
/// Simulated reads the property compared with the server's, and reads it said it could not
/// simulate.
static COMPARED: AtomicUsize = AtomicUsize::new(0);
static NOT_SIMULATED: AtomicUsize = AtomicUsize::new(0);

/// A fresh directory for one case, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "gate-simulate-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir.canonicalize().unwrap())
    }

    fn at(&self, rel: &str) -> String {
        if rel.is_empty() {
            self.0.to_string_lossy().into_owned()
        } else {
            format!("{}/{rel}", self.0.display())
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(future)
}

fn text_blocks(result: &ToolResult) -> Vec<&str> {
    result
        .content
        .iter()
        .filter_map(|c| match c {
            Content::Text { text } => Some(text.as_str()),
            Content::Other(_) => None,
        })
        .collect()
}

/// The simulated answer of `tool` with `args`: (note, the server-shaped text, is_error),
/// or the `Cannot` reason.
fn simulate(
    server: &Server,
    pending: &[PendingWrite],
    tool: &str,
    args: Value,
) -> Result<(Option<String>, String, bool), String> {
    let read = ReadCall { tool, args: &args };
    if !Filesystem.touches(read, pending) {
        let real = server.read_now(tool, &args);
        return Ok((None, text_blocks(&real)[0].to_owned(), real.is_error));
    }
    match block_on(Filesystem.simulate(read, pending, server)) {
        Answer::Untouched => {
            let real = server.read_now(tool, &args);
            Ok((None, text_blocks(&real)[0].to_owned(), real.is_error))
        }
        Answer::Simulated(result) => {
            let blocks = text_blocks(&result);
            Ok((
                Some(blocks[0].to_owned()),
                blocks[1].to_owned(),
                result.is_error,
            ))
        }
        Answer::Cannot { reason, .. } => Err(reason),
    }
}

fn write(action: u64, tool: &str, args: Value) -> PendingWrite {
    PendingWrite {
        action,
        tool: tool.to_owned(),
        args,
    }
}

#[test]
fn a_pending_write_reads_back_and_lists_marked_and_an_edit_applies_to_it() {
    let dir = Scratch::new();
    std::fs::create_dir(dir.at("notes")).unwrap();
    std::fs::write(dir.at("notes/old.md"), "old").unwrap();
    let server = Server::new();
    let pending = [
        write(
            3,
            "write_file",
            json!({"path": dir.at("notes/plan.md"), "content": "step one\nstep two\n"}),
        ),
        write(
            4,
            "edit_file",
            json!({"path": dir.at("notes/plan.md"), "edits": [{"oldText": "two", "newText": "2"}]}),
        ),
    ];
    let (note, text, is_error) = simulate(
        &server,
        &pending,
        "read_text_file",
        json!({"path": dir.at("notes/plan.md")}),
    )
    .unwrap();
    assert!(!is_error);
    assert_eq!(text, "step one\nstep 2\n");
    let note = note.unwrap();
    assert!(note.contains("actions 3 and 4"), "{note}");
    assert!(note.contains("nothing has been applied yet"), "{note}");

    let (note, text, _) = simulate(
        &server,
        &pending,
        "list_directory",
        json!({"path": dir.at("notes")}),
    )
    .unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["[FILE] old.md", "[FILE] plan.md"]);
    assert!(
        note.unwrap()
            .contains("plan.md is new or changed (actions 3 and 4)")
    );

    let (_, text, _) = simulate(
        &server,
        &pending,
        "read_text_file",
        json!({"path": dir.at("notes/plan.md"), "tail": 2}),
    )
    .unwrap();
    assert_eq!(text, "step 2\n");
    let (_, text, _) = simulate(
        &server,
        &pending,
        "read_text_file",
        json!({"path": dir.at("notes/plan.md"), "head": 1}),
    )
    .unwrap();
    assert_eq!(text, "step one");
}

#[test]
fn a_read_no_pending_write_touches_reads_nothing_more() {
    let dir = Scratch::new();
    std::fs::create_dir(dir.at("src")).unwrap();
    std::fs::write(dir.at("src/main.rs"), "fn main() {}").unwrap();
    let server = Server::new();
    let pending = [write(
        3,
        "write_file",
        json!({"path": dir.at("notes/plan.md"), "content": "x"}),
    )];
    let (note, text, _) = simulate(
        &server,
        &pending,
        "read_text_file",
        json!({"path": dir.at("src/main.rs")}),
    )
    .unwrap();
    assert_eq!((note, text.as_str()), (None, "fn main() {}"));
    assert_eq!(
        server.reads.lock().unwrap().len(),
        1,
        "only the agent's own read"
    );
}

#[test]
fn a_fuzzy_edit_is_refused_plainly_and_a_dry_run_changes_nothing() {
    let dir = Scratch::new();
    std::fs::write(dir.at("a.txt"), "  indented line\n").unwrap();
    let server = Server::new();
    let fuzzy = [write(
        5,
        "edit_file",
        json!({"path": dir.at("a.txt"), "edits": [{"oldText": "indented line  ", "newText": "x"}]}),
    )];
    let reason = simulate(
        &server,
        &fuzzy,
        "read_text_file",
        json!({"path": dir.at("a.txt")}),
    )
    .unwrap_err();
    assert!(
        reason.contains("line by line ignoring whitespace"),
        "{reason}"
    );

    let dry = [write(
        6,
        "edit_file",
        json!({"path": dir.at("a.txt"), "dryRun": true, "edits": [{"oldText": "indented", "newText": "x"}]}),
    )];
    let (note, text, _) = simulate(
        &server,
        &dry,
        "read_text_file",
        json!({"path": dir.at("a.txt")}),
    )
    .unwrap();
    assert_eq!((note, text.as_str()), (None, "  indented line\n"));
}

#[test]
fn moves_and_new_directories_show_in_trees_searches_and_infos() {
    let dir = Scratch::new();
    std::fs::create_dir_all(dir.at("docs/old")).unwrap();
    std::fs::write(dir.at("docs/old/a.md"), "A").unwrap();
    let server = Server::new();
    let pending = [
        write(1, "create_directory", json!({"path": dir.at("new/deep")})),
        write(
            2,
            "move_file",
            json!({"source": dir.at("docs/old"), "destination": dir.at("new/deep/moved")}),
        ),
        write(
            3,
            "write_file",
            json!({"path": dir.at("new/deep/moved/b.md"), "content": "BB"}),
        ),
    ];
    let (_, text, _) = simulate(
        &server,
        &pending,
        "search_files",
        json!({"path": dir.at(""), "pattern": "**/*.md"}),
    )
    .unwrap();
    let mut found: Vec<&str> = text.lines().collect();
    found.sort_unstable();
    assert_eq!(
        found,
        [dir.at("new/deep/moved/a.md"), dir.at("new/deep/moved/b.md")]
    );
    let (_, text, _) = simulate(
        &server,
        &pending,
        "read_text_file",
        json!({"path": dir.at("new/deep/moved/a.md")}),
    )
    .unwrap();
    assert_eq!(text, "A");
    let (_, text, is_error) = simulate(
        &server,
        &pending,
        "read_text_file",
        json!({"path": dir.at("docs/old/a.md")}),
    )
    .unwrap();
    assert!(is_error && text.starts_with("ENOENT"), "{text}");
    let (_, text, _) = simulate(
        &server,
        &pending,
        "get_file_info",
        json!({"path": dir.at("new/deep/moved/b.md")}),
    )
    .unwrap();
    assert!(
        text.starts_with("size: 2\n") && text.contains("not known until action 3 is applied"),
        "{text}"
    );
    let (_, text, _) = simulate(
        &server,
        &pending,
        "directory_tree",
        json!({"path": dir.at("new")}),
    )
    .unwrap();
    let tree: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(tree[0]["name"], "deep");
    assert_eq!(tree[0]["children"][0]["name"], "moved");
    assert_eq!(
        tree[0]["children"][0]["children"].as_array().unwrap().len(),
        2
    );
    // An unmodelled pattern is said, not guessed.
    let reason = simulate(
        &server,
        &pending,
        "search_files",
        json!({"path": dir.at(""), "pattern": "*.{md,txt}"}),
    )
    .unwrap_err();
    assert!(reason.contains("does not model"), "{reason}");
}

#[test]
fn a_write_that_would_fail_is_not_shown_and_the_note_says_why() {
    let dir = Scratch::new();
    let server = Server::new();
    let pending = [write(
        9,
        "write_file",
        json!({"path": dir.at("missing/x.md"), "content": "x"}),
    )];
    let (note, text, is_error) = simulate(
        &server,
        &pending,
        "read_text_file",
        json!({"path": dir.at("missing/x.md")}),
    )
    .unwrap();
    assert!(is_error && text.starts_with("ENOENT"), "{text}");
    assert!(
        note.unwrap()
            .contains("action 9 is not shown: applied now, it would fail")
    );
}

#[test]
fn a_write_records_what_it_builds_on_and_a_change_on_disk_makes_it_stale() {
    let dir = Scratch::new();
    std::fs::write(dir.at("real.md"), "real one").unwrap();
    let server = Server::new();
    let pending = [
        write(
            3,
            "write_file",
            json!({"path": dir.at("plan.md"), "content": "step one\n"}),
        ),
        write(
            4,
            "edit_file",
            json!({"path": dir.at("plan.md"), "edits": [{"oldText": "one", "newText": "1"}]}),
        ),
        write(5, "create_directory", json!({"path": dir.at("new")})),
        write(
            6,
            "move_file",
            json!({"source": dir.at("plan.md"), "destination": dir.at("new/plan.md")}),
        ),
        write(
            7,
            "edit_file",
            json!({"path": dir.at("real.md"), "edits": [{"oldText": "one", "newText": "1"}]}),
        ),
    ];
    let basis = |i: usize, before: &[PendingWrite]| {
        block_on(Filesystem.basis(&pending[i], before, &server)).unwrap()
    };
    // The edit needs the pending write's content; the move needs the file and the
    // directory; an edit of a real file is built on nothing.
    assert_eq!(basis(1, &pending[..1]).built_on, [3]);
    assert_eq!(basis(3, &pending[..3]).built_on, [3, 4, 5]);
    let edit_of_real = basis(4, &pending[..4]);
    assert!(edit_of_real.built_on.is_empty());
    assert!(
        edit_of_real.targets[0].state.starts_with("content sha256:"),
        "{edit_of_real:?}"
    );
    // A write_file over a pending write replaces it: not built on it, but its target names it.
    let over = write(
        8,
        "write_file",
        json!({"path": dir.at("plan.md"), "content": "x"}),
    );
    let replaced = block_on(Filesystem.basis(&over, &pending[..2], &server)).unwrap();
    assert!(replaced.built_on.is_empty());
    assert_eq!(replaced.targets[0].by, [3, 4]);

    // Nothing changed: worked out again, the same basis.
    assert!(
        basis(4, &pending[..4])
            .changes_since(&edit_of_real)
            .is_empty()
    );
    // The file changed on disk after staging: stale, and the change is said.
    std::fs::write(dir.at("real.md"), "someone else's").unwrap();
    let changes = basis(4, &pending[..4]).changes_since(&edit_of_real);
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert!(
        changes[0].contains("real.md was content sha256:")
            && changes[0].contains("and is now content sha256:"),
        "{changes:?}"
    );
    // The write it was built on rejected: the edit's target is no longer what it saw.
    let then = basis(1, &pending[..1]);
    let changes = basis(1, &[]).changes_since(&then);
    assert!(
        changes[0].contains("as action 3 left it") && changes[0].ends_with("is now absent"),
        "{changes:?}"
    );
}

// ---- The property: simulated reads before == the server's reads after. ----

/// Paths of the generated trees: up to three levels of the names a, b and c.md.
const NAMES: &[&str] = &["a", "b", "c.md"];

fn rel_path() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(NAMES), 1..=3).prop_map(|parts| parts.join("/"))
}

/// Texts without whitespace but with line breaks, so the server's fuzzy edit matching finds
/// only what an exact match finds (see `Server::apply`).
fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(&["x", "y", "z", "\n", "\r\n", "xy"][..]),
        0..6,
    )
    .prop_map(|parts| parts.concat())
}

/// What an edit looks for: short, so that it is often found, and often more than once.
fn old_text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(&["x", "y", "xy", "\n", "z\n"][..]).prop_map(str::to_owned),
        1 => Just(String::new()),
        1 => text(),
    ]
}

#[derive(Debug, Clone)]
enum Gen {
    Write(String, String),
    Edit(String, Vec<(String, String)>, bool),
    Mkdir(String),
    Move(String, String),
}

fn gen_op() -> impl Strategy<Value = Gen> {
    prop_oneof![
        3 => (rel_path(), text()).prop_map(|(p, t)| Gen::Write(p, t)),
        3 => (rel_path(), prop::collection::vec((old_text(), text()), 0..3), prop::bool::weighted(0.1))
            .prop_map(|(p, e, d)| Gen::Edit(p, e, d)),
        2 => rel_path().prop_map(Gen::Mkdir),
        2 => (rel_path(), rel_path()).prop_map(|(a, b)| Gen::Move(a, b)),
    ]
}

fn to_write(dir: &Scratch, action: u64, op: &Gen) -> PendingWrite {
    match op {
        Gen::Write(p, t) => write(
            action,
            "write_file",
            json!({"path": dir.at(p), "content": t}),
        ),
        Gen::Edit(p, edits, dry) => write(
            action,
            "edit_file",
            json!({"path": dir.at(p), "dryRun": dry, "edits": edits.iter().map(|(o, n)| json!({"oldText": o, "newText": n})).collect::<Vec<_>>()}),
        ),
        Gen::Mkdir(p) => write(action, "create_directory", json!({"path": dir.at(p)})),
        Gen::Move(a, b) => write(
            action,
            "move_file",
            json!({"source": dir.at(a), "destination": dir.at(b)}),
        ),
    }
}

/// A read's text in a form that does not depend on the order the file system lists a
/// directory in (both the server and the simulation keep that order, but a new entry's
/// place in it is the file system's).
fn canonical(tool: &str, text: &str) -> String {
    match tool {
        "list_directory" | "search_files" => {
            let mut lines: Vec<&str> = text.lines().collect();
            lines.sort_unstable();
            lines.join("\n")
        }
        "directory_tree" => {
            fn sort(v: &mut Value) {
                if let Value::Array(items) = v {
                    for item in items.iter_mut() {
                        if let Some(children) = item.get_mut("children") {
                            sort(children);
                        }
                    }
                    items.sort_by_key(|i| i["name"].as_str().unwrap_or_default().to_owned());
                }
            }
            let mut v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
            sort(&mut v);
            v.to_string()
        }
        // A failed part's wording is the server's own (which system call failed first).
        "read_multiple_files" => text
            .split("\n---\n")
            .map(|part| match part.split_once(": Error - ") {
                Some((path, _)) if !path.contains('\n') => format!("{path}: Error"),
                _ => part.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("\n---\n"),
        // Times and permissions are the file system's, decided when the write lands.
        "get_file_info" => text
            .lines()
            .filter(|l| {
                l.starts_with("isDirectory")
                    || l.starts_with("isFile")
                    || (l.starts_with("size") && text.contains("isFile: true"))
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => text.to_owned(),
    }
}

fn reads_of(dir: &Scratch) -> Vec<(&'static str, Value)> {
    let mut paths = vec![String::new()];
    for a in NAMES {
        paths.push((*a).to_owned());
        for b in NAMES {
            paths.push(format!("{a}/{b}"));
        }
    }
    let mut reads = Vec::new();
    for p in &paths {
        reads.push(("list_directory", json!({"path": dir.at(p)})));
        reads.push(("read_text_file", json!({"path": dir.at(p)})));
        reads.push(("get_file_info", json!({"path": dir.at(p)})));
    }
    reads.push((
        "read_text_file",
        json!({"path": dir.at("a/c.md"), "tail": 1}),
    ));
    reads.push((
        "read_multiple_files",
        json!({"paths": [dir.at("c.md"), dir.at("a/c.md"), dir.at("b")]}),
    ));
    reads.push(("directory_tree", json!({"path": dir.at("")})));
    reads.push((
        "directory_tree",
        json!({"path": dir.at(""), "excludePatterns": ["b"]}),
    ));
    reads.push((
        "search_files",
        json!({"path": dir.at(""), "pattern": "**/*.md"}),
    ));
    reads.push((
        "search_files",
        json!({"path": dir.at("a"), "pattern": "**", "excludePatterns": ["a"]}),
    ));
    reads
}

#[test]
fn the_property_compares_simulated_reads_not_only_refusals() {
    simulated_reads_equal_the_servers_reads_after_applying_the_writes();
    let (compared, not) = (
        COMPARED.load(Ordering::Relaxed),
        NOT_SIMULATED.load(Ordering::Relaxed),
    );
    eprintln!("compared {compared} simulated reads, {not} said they could not be simulated");
    assert!(
        compared > 20 * not.max(1),
        "compared {compared}, not simulated {not}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    /// Applied to real files with the server's semantics, the staged writes leave what the
    /// simulation showed before any of them was applied.
    #[test]
    fn simulated_reads_equal_the_servers_reads_after_applying_the_writes(
        setup in prop::collection::vec(gen_op(), 0..6),
        staged in prop::collection::vec(gen_op(), 1..7),
    ) {
        let dir = Scratch::new();
        let server = Server::new();
        for (i, op) in setup.iter().enumerate() {
            let w = to_write(&dir, i as u64, op);
            let _ = server.apply(&w.tool, &w.args);
        }
        let pending: Vec<PendingWrite> = staged
            .iter()
            .enumerate()
            .map(|(i, op)| to_write(&dir, 100 + i as u64, op))
            .collect();
        let reads = reads_of(&dir);
        let before: Vec<_> = reads
            .iter()
            .map(|(tool, args)| simulate(&server, &pending, tool, args.clone()))
            .collect();
        for w in &pending {
            let _ = server.apply(&w.tool, &w.args);
        }
        for ((tool, args), simulated) in reads.iter().zip(before) {
            let Ok((note, text, is_error)) = simulated else {
                NOT_SIMULATED.fetch_add(1, Ordering::Relaxed); // Said, not guessed.
                continue;
            };
            if note.is_some() {
                COMPARED.fetch_add(1, Ordering::Relaxed);
            }
            let real = server.read_now(tool, args);
            let real_text = text_blocks(&real)[0];
            prop_assert_eq!(is_error, real.is_error, "{} {} showed {:?}, the server answers {:?}", tool, args, text, real_text);
            if !is_error {
                prop_assert_eq!(canonical(tool, &text), canonical(tool, real_text), "{} {}", tool, args);
            }
        }
    }
}

// ---- Rejections: the simulation equals applying the rest, or flags what depended. ----

/// The paths a read names, as written.
fn paths_of_read(args: &Value) -> Vec<String> {
    match args.get("paths").and_then(Value::as_array) {
        Some(paths) => paths
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        None => vec![arg(args, "path").to_owned()],
    }
}

/// The paths a write names.
fn paths_of_write(w: &PendingWrite) -> Vec<String> {
    match w.tool.as_str() {
        "move_file" => vec![
            arg(&w.args, "source").to_owned(),
            arg(&w.args, "destination").to_owned(),
        ],
        _ => vec![arg(&w.args, "path").to_owned()],
    }
}

fn related(a: &str, b: &str) -> bool {
    a == b || a.starts_with(&format!("{b}/")) || b.starts_with(&format!("{a}/"))
}

/// Reads compared after a rejection that no rejected or flagged write excused.
static KEPT_EQUAL: AtomicUsize = AtomicUsize::new(0);
/// Writes found built on a rejected one, and writes found stale.
static BUILT_ON_REJECTED: AtomicUsize = AtomicUsize::new(0);
static STALE_AFTER_REJECTION: AtomicUsize = AtomicUsize::new(0);

#[test]
fn the_rejection_property_compares_reads_and_finds_dependents() {
    after_rejecting_any_subset_the_simulation_equals_applying_the_rest_or_flags_what_depended();
    let (kept, built, stale) = (
        KEPT_EQUAL.load(Ordering::Relaxed),
        BUILT_ON_REJECTED.load(Ordering::Relaxed),
        STALE_AFTER_REJECTION.load(Ordering::Relaxed),
    );
    eprintln!(
        "{kept} reads kept what the agent saw, {built} writes built on a rejected one, {stale} stale"
    );
    assert!(
        kept > 200 && built >= 3 && stale >= 3,
        "{kept} {built} {stale}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    /// The agent staged `staged` and saw the simulation of all of them; a person rejects a
    /// subset. Then (1) the simulation of the rest equals the server's reads after applying
    /// the rest, and (2) every read that differs from what the agent saw involves a
    /// rejected write or one the gate flags: built on a rejected one (by the bases recorded
    /// at staging, transitively; the kernel's `depends_on`), or stale (its basis worked out
    /// again before approval differs from the one recorded at staging).
    #[test]
    fn after_rejecting_any_subset_the_simulation_equals_applying_the_rest_or_flags_what_depended(
        setup in prop::collection::vec(gen_op(), 0..6),
        staged in prop::collection::vec(gen_op(), 1..7),
        rejected in prop::collection::vec(any::<bool>(), 7),
    ) {
        let dir = Scratch::new();
        let server = Server::new();
        for (i, op) in setup.iter().enumerate() {
            let w = to_write(&dir, i as u64, op);
            let _ = server.apply(&w.tool, &w.args);
        }
        let pending: Vec<PendingWrite> = staged
            .iter()
            .enumerate()
            .map(|(i, op)| to_write(&dir, 100 + i as u64, op))
            .collect();
        // What the gate records as each write is staged.
        let bases: Vec<_> = (0..pending.len())
            .map(|i| block_on(Filesystem.basis(&pending[i], &pending[..i], &server)))
            .collect();
        let reads = reads_of(&dir);
        let seen: Vec<_> = reads
            .iter()
            .map(|(tool, args)| simulate(&server, &pending, tool, args.clone()))
            .collect();
        let is_rejected = |i: usize| rejected[i];
        let rest: Vec<PendingWrite> = (0..pending.len())
            .filter(|i| !is_rejected(*i))
            .map(|i| pending[i].clone())
            .collect();
        // Flagged: built on a rejected (or flagged-built-on) write, or stale, or not known.
        let mut tainted: Vec<u64> = (0..pending.len()).filter(|i| is_rejected(*i)).map(|i| pending[i].action).collect();
        let mut flagged = Vec::new();
        for (i, w) in pending.iter().enumerate() {
            if is_rejected(i) {
                continue;
            }
            let before: Vec<PendingWrite> = rest.iter().filter(|r| r.action < w.action).cloned().collect();
            let built = match &bases[i] {
                Ok(basis) => basis.built_on.iter().any(|b| tainted.contains(b)),
                Err(_) => true,
            };
            let stale = match (&bases[i], block_on(Filesystem.basis(w, &before, &server))) {
                (Ok(then), Ok(now)) => !now.changes_since(then).is_empty(),
                _ => true,
            };
            if built {
                BUILT_ON_REJECTED.fetch_add(1, Ordering::Relaxed);
                tainted.push(w.action);
            }
            if stale {
                STALE_AFTER_REJECTION.fetch_add(1, Ordering::Relaxed);
            }
            if built || stale {
                flagged.push(w.clone());
            }
        }
        let rest_simulated: Vec<_> = reads
            .iter()
            .map(|(tool, args)| simulate(&server, &rest, tool, args.clone()))
            .collect();
        for w in &rest {
            let _ = server.apply(&w.tool, &w.args);
        }
        let mut excused: Vec<String> = pending
            .iter()
            .enumerate()
            .filter(|(i, w)| is_rejected(*i) || flagged.contains(w))
            .flat_map(|(_, w)| paths_of_write(w))
            .collect();
        // A rejected or flagged write's effect travels with a later move of a directory
        // holding it: what the agent saw where the move put it involved that write too.
        // One pass in staging order, as the moves apply.
        for w in pending.iter().filter(|w| w.tool == "move_file") {
            let (from, to) = (arg(&w.args, "source"), arg(&w.args, "destination"));
            let carried: Vec<String> = excused
                .iter()
                .filter(|x| *x == from || x.starts_with(&format!("{from}/")))
                .map(|x| format!("{to}{}", &x[from.len()..]))
                .collect();
            excused.extend(carried);
        }
        for (((tool, args), simulated), seen) in reads.iter().zip(rest_simulated).zip(seen) {
            let real = server.read_now(tool, args);
            let real_text = text_blocks(&real)[0];
            // (1) The simulation of the rest is what applying the rest leaves.
            if let Ok((_, text, is_error)) = simulated {
                prop_assert_eq!(is_error, real.is_error, "{} {} (rest)", tool, args);
                if !is_error {
                    prop_assert_eq!(canonical(tool, &text), canonical(tool, real_text), "{} {} (rest)", tool, args);
                }
            }
            // (2) What the agent saw holds, unless a rejected or flagged write is involved.
            let Ok((note, text, is_error)) = seen else { continue };
            let involved = paths_of_read(args)
                .iter()
                .any(|r| excused.iter().any(|x| related(r, x)));
            if involved {
                continue;
            }
            if note.is_some() {
                KEPT_EQUAL.fetch_add(1, Ordering::Relaxed);
            }
            prop_assert_eq!(is_error, real.is_error, "{} {}: the agent saw {:?}, the server answers {:?}", tool, args, text, real_text);
            if !is_error {
                prop_assert_eq!(canonical(tool, &text), canonical(tool, real_text), "{} {} (what the agent saw)", tool, args);
            }
        }
    }
}

#[test]
fn a_directory_moved_whole_keeps_its_empty_subdirectory_listable() {
    // Found by the property test: `b/a` exists, `b` is moved to `c.md`; listing
    // `c.md/a` must show the (empty) directory, as the server will once the move is made.
    let dir = Scratch::new();
    let server = Server::new();
    let w = to_write(&dir, 1, &Gen::Mkdir("b/a".into()));
    let _ = server.apply(&w.tool, &w.args);
    let pending = vec![to_write(&dir, 100, &Gen::Move("b".into(), "c.md".into()))];
    let args = json!({"path": dir.at("c.md/a")});
    let simulated = simulate(&server, &pending, "list_directory", args.clone());
    for w in &pending {
        let _ = server.apply(&w.tool, &w.args);
    }
    let real = server.read_now("list_directory", &args);
    let (_, text, is_error) = simulated.expect("simulated");
    assert_eq!(
        (is_error, text.as_str()),
        (real.is_error, text_blocks(&real)[0]),
        "simulated against real"
    );
}

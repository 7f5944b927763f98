//! The simulator for `@modelcontextprotocol/server-filesystem` (written against 2026.8.31).
//!
//! Pending `write_file`, `edit_file`, `create_directory` and `move_file` calls are
//! replayed, in staging order, over an overlay of the real tree: a map from absolute path
//! to what the pending writes left there (a file whose content is known or is a real
//! file's, a directory created fresh, a real directory moved here, nothing). A path with
//! no entry for itself or an ancestor is the real path. Each write is checked as the
//! server checks it when it is applied (the parent must be a directory, a move's
//! destination must not exist, ...); one that would fail is not shown, and the note says
//! so. `edit_file` is modelled where the server's semantics are exact: each `oldText`
//! found as it is is replaced at its first occurrence; an `oldText` the server would look
//! for line by line ignoring whitespace is not modelled, and the read says so.
//!
//! Paths are compared as written, made absolute and normalized (`.`, `..`, doubled `/`);
//! a relative or `~` path, or a pattern the gate's [`glob`](super::glob) does not model,
//! makes a touched read answer the real result with the reason. Symbolic links inside the
//! tree are not followed by the model: a search whose real results lie under another root
//! than the one asked for is not simulated.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use super::glob::Glob;
use super::{
    Answer, Basis, Expectation, JsValue, PendingWrite, ReadCall, RealReads, Simulator, Target,
    actions_phrase, fingerprint, simulated, text_of,
};

/// The simulator for the reference filesystem server.
#[derive(Debug, Clone, Copy, Default)]
pub struct Filesystem;

const WRITES: &[&str] = &["write_file", "edit_file", "create_directory", "move_file"];

const EXPECTS: &[Expectation] = &[
    ("write_file", &[("path", "string"), ("content", "string")]),
    (
        "edit_file",
        &[
            ("path", "string"),
            ("edits", "array"),
            ("dryRun", "boolean"),
        ],
    ),
    ("create_directory", &[("path", "string")]),
    (
        "move_file",
        &[("source", "string"), ("destination", "string")],
    ),
    (
        "read_text_file",
        &[("path", "string"), ("head", "number"), ("tail", "number")],
    ),
    ("read_multiple_files", &[("paths", "array")]),
    ("list_directory", &[("path", "string")]),
    (
        "directory_tree",
        &[("path", "string"), ("excludePatterns", "array")],
    ),
    ("get_file_info", &[("path", "string")]),
    (
        "search_files",
        &[
            ("path", "string"),
            ("pattern", "string"),
            ("excludePatterns", "array"),
        ],
    ),
];

/// A pending write as the model reads it.
#[derive(Debug, Clone, PartialEq)]
enum Op {
    Write {
        path: String,
        content: String,
    },
    Edit {
        path: String,
        edits: Vec<(String, String)>,
        dry_run: bool,
    },
    Mkdir {
        path: String,
    },
    Move {
        from: String,
        to: String,
    },
    /// Arguments the server's schema refuses: applied, it fails and changes nothing.
    Refused(String),
}

impl Op {
    fn paths(&self) -> Vec<&str> {
        match self {
            Op::Write { path, .. } | Op::Edit { path, .. } | Op::Mkdir { path } => vec![path],
            Op::Move { from, to } => vec![from, to],
            Op::Refused(_) => Vec::new(),
        }
    }
}

/// A read's `path` argument, made absolute and normal ([`absolute`]); a missing one is
/// the empty path, which [`absolute`] refuses.
fn path_of(read: ReadCall<'_>) -> Result<String, String> {
    absolute(
        read.args
            .get("path")
            .and_then(Value::as_str)
            .unwrap_or_default(),
    )
}

fn string_arg(args: &Value, key: &str) -> Result<String, String> {
    args.get(key)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| format!("its argument {key:?} is not a string"))
}

/// Parse one pending write: `Ok(None)` for a tool this model does not know; a path that is
/// not absolute is `Err` (what it names depends on the server's allowed directories).
fn parse(write: &PendingWrite) -> Result<Option<Op>, String> {
    let args = &write.args;
    let op = match write.tool.as_str() {
        "write_file" => match (string_arg(args, "path"), string_arg(args, "content")) {
            (Ok(path), Ok(content)) => Op::Write { path, content },
            (Err(e), _) | (_, Err(e)) => Op::Refused(e),
        },
        "edit_file" => {
            let path = string_arg(args, "path");
            let edits: Option<Vec<(String, String)>> = args
                .get("edits")
                .and_then(Value::as_array)
                .and_then(|edits| {
                    edits
                        .iter()
                        .map(|e| {
                            Some((
                                e.get("oldText")?.as_str()?.to_owned(),
                                e.get("newText")?.as_str()?.to_owned(),
                            ))
                        })
                        .collect()
                });
            let dry_run = match args.get("dryRun") {
                None | Some(Value::Null) => Some(false),
                Some(Value::Bool(b)) => Some(*b),
                Some(_) => None,
            };
            match (path, edits, dry_run) {
                (Ok(path), Some(edits), Some(dry_run)) => Op::Edit {
                    path,
                    edits,
                    dry_run,
                },
                (Err(e), ..) => Op::Refused(e),
                _ => Op::Refused("its edits or dryRun do not fit the tool's schema".to_owned()),
            }
        }
        "create_directory" => match string_arg(args, "path") {
            Ok(path) => Op::Mkdir { path },
            Err(e) => Op::Refused(e),
        },
        "move_file" => match (string_arg(args, "source"), string_arg(args, "destination")) {
            (Ok(from), Ok(to)) => Op::Move { from, to },
            (Err(e), _) | (_, Err(e)) => Op::Refused(e),
        },
        _ => return Ok(None),
    };
    Ok(Some(match op {
        Op::Write { path, content } => Op::Write {
            path: absolute(&path)?,
            content,
        },
        Op::Edit {
            path,
            edits,
            dry_run,
        } => Op::Edit {
            path: absolute(&path)?,
            edits,
            dry_run,
        },
        Op::Mkdir { path } => Op::Mkdir {
            path: absolute(&path)?,
        },
        Op::Move { from, to } => Op::Move {
            from: absolute(&from)?,
            to: absolute(&to)?,
        },
        refused @ Op::Refused(_) => refused,
    }))
}

/// `path` made absolute and normalized as Node's `path.resolve` does, or why it cannot be.
pub fn absolute(path: &str) -> Result<String, String> {
    if !path.starts_with('/') {
        return Err(format!(
            "the path {path:?} is not absolute, and what it names depends on the server's allowed directories; use absolute paths to see your pending writes in reads"
        ));
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

/// Whether `path` is strictly inside `ancestor`.
fn under(path: &str, ancestor: &str) -> bool {
    if ancestor == "/" {
        return path != "/";
    }
    path.len() > ancestor.len()
        && path.starts_with(ancestor)
        && path.as_bytes()[ancestor.len()] == b'/'
}

fn related(a: &str, b: &str) -> bool {
    a == b || under(a, b) || under(b, a)
}

fn parent(path: &str) -> String {
    match path.rfind('/') {
        Some(0) | None => "/".to_owned(),
        Some(i) => path[..i].to_owned(),
    }
}

fn name_of(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// `path` relative to `root` (`root` itself gives "").
fn relative<'a>(path: &'a str, root: &str) -> &'a str {
    if path == root {
        ""
    } else if root == "/" {
        &path[1..]
    } else {
        &path[root.len() + 1..]
    }
}

fn join(root: &str, rel: &str) -> String {
    match (root, rel) {
        (root, "") => root.to_owned(),
        ("/", rel) => format!("/{rel}"),
        (root, rel) => format!("{root}/{rel}"),
    }
}

fn normalize_newlines(text: &str) -> String {
    text.replace("\r\n", "\n")
}

/// A file's content in the overlay.
#[derive(Debug, Clone, PartialEq)]
enum Content {
    /// Written (or edited) by pending actions.
    Known(String),
    /// A real file's content, moved here by a pending action.
    Real(String),
}

/// What pending writes left at one path.
#[derive(Debug, Clone, PartialEq)]
enum Node {
    File {
        content: Content,
        by: Vec<u64>,
    },
    /// A directory created by pending actions: its entries are only the overlay's.
    Dir {
        by: Vec<u64>,
    },
    /// A real directory moved here: its entries are the real one's, and the overlay's.
    Alias {
        real: String,
        by: Vec<u64>,
    },
    /// Nothing (moved away).
    Absent {
        by: Vec<u64>,
    },
}

impl Node {
    fn by(&self) -> &[u64] {
        match self {
            Node::File { by, .. }
            | Node::Dir { by }
            | Node::Alias { by, .. }
            | Node::Absent { by } => by,
        }
    }

    fn with(mut self, id: u64) -> Self {
        match &mut self {
            Node::File { by, .. }
            | Node::Dir { by }
            | Node::Alias { by, .. }
            | Node::Absent { by } => by.push(id),
        }
        self
    }
}

/// What a path is once the pending writes are applied.
#[derive(Debug, Clone, PartialEq)]
enum Look {
    /// The real path (itself, or where a moved directory's entry really is), as it is.
    Real(String),
    /// A node of the overlay at this very path.
    Node(Node),
    /// Nothing, because of these actions (an ancestor moved away, replaced or made fresh).
    Missing(Vec<u64>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
    Missing,
}

/// The overlay, with what it read of the real server.
struct State<'a> {
    keys: BTreeMap<String, Node>,
    real: &'a dyn RealReads,
    kinds: Mutex<HashMap<String, Kind>>,
    /// Pending actions that would fail if applied now, with why.
    failing: Vec<(u64, String)>,
}

impl<'a> State<'a> {
    fn new(real: &'a dyn RealReads) -> Self {
        Self {
            keys: BTreeMap::new(),
            real,
            kinds: Mutex::new(HashMap::new()),
            failing: Vec::new(),
        }
    }

    fn look(&self, path: &str) -> Look {
        let mut at = path.to_owned();
        loop {
            if let Some(node) = self.keys.get(&at) {
                if at == path {
                    return Look::Node(node.clone());
                }
                return match node {
                    Node::Alias { real, .. } => Look::Real(join(real, relative(path, &at))),
                    other => Look::Missing(other.by().to_vec()),
                };
            }
            if at == "/" {
                return Look::Real(path.to_owned());
            }
            at = parent(&at);
        }
    }

    async fn real_kind(&self, path: &str) -> Result<Kind, String> {
        if let Some(kind) = self.kinds.lock().await.get(path) {
            return Ok(*kind);
        }
        let info = self
            .real
            .read("get_file_info", json!({ "path": path }))
            .await?;
        let text = text_of(&info).unwrap_or_default();
        let kind = if info.is_error {
            if text.contains("ENOENT") || text.contains("ENOTDIR") {
                Kind::Missing
            } else {
                return Err(format!(
                    "the server could not say what {path} is ({})",
                    text.lines().next().unwrap_or_default()
                ));
            }
        } else if text.lines().any(|l| l == "isDirectory: true") {
            Kind::Dir
        } else if text.lines().any(|l| l == "isFile: true") {
            Kind::File
        } else {
            return Err(format!(
                "the server's get_file_info of {path} is neither a file nor a directory"
            ));
        };
        self.kinds.lock().await.insert(path.to_owned(), kind);
        Ok(kind)
    }

    async fn kind(&self, path: &str) -> Result<Kind, String> {
        match self.look(path) {
            Look::Real(real) => self.real_kind(&real).await,
            Look::Node(Node::File { .. }) => Ok(Kind::File),
            Look::Node(Node::Dir { .. } | Node::Alias { .. }) => Ok(Kind::Dir),
            Look::Node(Node::Absent { .. }) | Look::Missing(_) => Ok(Kind::Missing),
        }
    }

    async fn real_content(&self, path: &str) -> Result<String, String> {
        let read = self
            .real
            .read("read_text_file", json!({ "path": path }))
            .await?;
        let text = text_of(&read).unwrap_or_default();
        if read.is_error {
            return Err(format!("the server could not read {path} ({text})"));
        }
        Ok(text.to_owned())
    }

    /// Put `node` at `path`, dropping whatever the overlay held inside it.
    fn set(&mut self, path: &str, node: Node) {
        self.keys.retain(|k, _| !under(k, path));
        self.keys.insert(path.to_owned(), node);
    }

    fn fail(&mut self, id: u64, why: impl Into<String>) {
        self.failing.push((id, why.into()));
    }

    /// Apply one pending write. `Err` when it cannot be modelled exactly.
    async fn apply(&mut self, id: u64, op: &Op) -> Result<(), String> {
        match op {
            Op::Refused(why) => self.fail(id, format!("the server would refuse it: {why}")),
            Op::Write { path, content } => {
                if self.kind(&parent(path)).await? != Kind::Dir {
                    self.fail(id, format!("{}'s directory does not exist", path));
                } else if self.kind(path).await? == Kind::Dir {
                    self.fail(id, format!("{path} is a directory"));
                } else {
                    self.set(
                        path,
                        Node::File {
                            content: Content::Known(content.clone()),
                            by: vec![id],
                        },
                    );
                }
            }
            Op::Edit {
                path,
                edits,
                dry_run,
            } => {
                if *dry_run {
                    return Ok(());
                }
                let (base, by) = match self.look(path) {
                    Look::Node(Node::File {
                        content: Content::Known(text),
                        by,
                    }) => (text, by),
                    Look::Node(Node::File {
                        content: Content::Real(real),
                        by,
                    }) => (self.real_content(&real).await?, by),
                    Look::Real(real) => match self.real_kind(&real).await? {
                        Kind::File => (self.real_content(&real).await?, Vec::new()),
                        Kind::Dir => {
                            self.fail(id, format!("{path} is a directory"));
                            return Ok(());
                        }
                        Kind::Missing => {
                            self.fail(id, format!("{path} does not exist"));
                            return Ok(());
                        }
                    },
                    Look::Node(Node::Dir { .. } | Node::Alias { .. }) => {
                        self.fail(id, format!("{path} is a directory"));
                        return Ok(());
                    }
                    Look::Node(Node::Absent { .. }) | Look::Missing(_) => {
                        self.fail(id, format!("{path} does not exist"));
                        return Ok(());
                    }
                };
                let mut text = normalize_newlines(&base);
                for (old, new) in edits {
                    let old = normalize_newlines(old);
                    if !text.contains(&old) {
                        return Err(format!(
                            "action {id} edits {path} with an oldText that does not appear in it exactly; the server would then match it line by line ignoring whitespace, which the gate does not model"
                        ));
                    }
                    text = text.replacen(&old, &normalize_newlines(new), 1);
                }
                let mut by = by;
                by.push(id);
                self.set(
                    path,
                    Node::File {
                        content: Content::Known(text),
                        by,
                    },
                );
            }
            Op::Mkdir { path } => match self.kind(path).await? {
                Kind::Dir => {}
                Kind::File => self.fail(id, format!("{path} is a file")),
                Kind::Missing => {
                    let mut chain = vec![path.clone()];
                    let mut at = parent(path);
                    loop {
                        match self.kind(&at).await? {
                            Kind::Dir => break,
                            Kind::File => {
                                self.fail(id, format!("{at} is a file"));
                                return Ok(());
                            }
                            Kind::Missing if at == "/" => break,
                            Kind::Missing => {
                                chain.push(at.clone());
                                at = parent(&at);
                            }
                        }
                    }
                    for dir in chain.into_iter().rev() {
                        self.set(&dir, Node::Dir { by: vec![id] });
                    }
                }
            },
            Op::Move { from, to } => {
                let source = self.kind(from).await?;
                if source == Kind::Missing {
                    self.fail(id, format!("{from} does not exist"));
                } else if self.kind(to).await? != Kind::Missing {
                    self.fail(id, format!("{to} already exists"));
                } else if self.kind(&parent(to)).await? != Kind::Dir {
                    self.fail(id, format!("{}'s directory does not exist", to));
                } else if under(to, from) {
                    self.fail(id, format!("it would move {from} into itself"));
                } else {
                    let node = match self.look(from) {
                        Look::Real(real) if source == Kind::Dir => {
                            Node::Alias { real, by: vec![id] }
                        }
                        Look::Real(real) => Node::File {
                            content: Content::Real(real),
                            by: vec![id],
                        },
                        Look::Node(node) => node.with(id),
                        Look::Missing(_) => return Ok(()),
                    };
                    let inside: Vec<(String, Node)> = self
                        .keys
                        .iter()
                        .filter(|(k, _)| under(k, from))
                        .map(|(k, n)| (join(to, relative(k, from)), n.clone().with(id)))
                        .collect();
                    self.set(from, Node::Absent { by: vec![id] });
                    self.set(to, node);
                    self.keys.extend(inside);
                }
            }
        }
        Ok(())
    }

    /// The overlay's entries strictly inside `dir`, shortest path first.
    fn inside(&self, dir: &str) -> Vec<(String, Node)> {
        let mut found: Vec<(String, Node)> = self
            .keys
            .iter()
            .filter(|(k, _)| under(k, dir))
            .map(|(k, n)| (k.clone(), n.clone()))
            .collect();
        found.sort_by_key(|(k, _)| (k.matches('/').count(), k.clone()));
        found
    }
}

/// The paths a read names, as the agent wrote them.
fn read_paths(read: ReadCall<'_>) -> Vec<String> {
    match read.tool {
        "read_multiple_files" => read
            .args
            .get("paths")
            .and_then(Value::as_array)
            .map(|p| {
                p.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default(),
        _ => read
            .args
            .get("path")
            .and_then(Value::as_str)
            .map(|p| vec![p.to_owned()])
            .unwrap_or_default(),
    }
}

/// What the server answers to scanning `path` when the overlay makes it a file or nothing
/// (marked with the actions that did), or `None` when it is a directory.
fn scandir_refused(look: &Look, path: &str, marks: &mut Marks) -> Option<String> {
    match look {
        Look::Node(Node::File { by, .. }) => {
            marks.mark(format!("{path} is a file"), by);
            Some(format!("ENOTDIR: not a directory, scandir '{path}'"))
        }
        Look::Node(Node::Absent { by }) | Look::Missing(by) => {
            marks.mark(format!("{path} does not exist"), by);
            Some(format!(
                "ENOENT: no such file or directory, scandir '{path}'"
            ))
        }
        _ => None,
    }
}

/// Which of `ops` bear on `paths`: those whose paths, or their directories, are related
/// to a path named, transitively.
fn relevant(mut paths: Vec<String>, ops: &[(u64, Op)]) -> Vec<bool> {
    let mut relevant = vec![false; ops.len()];
    let mut grown = true;
    while grown {
        grown = false;
        for (i, (_, op)) in ops.iter().enumerate() {
            if relevant[i] {
                continue;
            }
            let hit = match op {
                Op::Refused(_) => false,
                op => op
                    .paths()
                    .iter()
                    .any(|x| paths.iter().any(|r| related(x, r))),
            };
            if hit {
                relevant[i] = true;
                grown = true;
                for x in op.paths() {
                    paths.push(x.to_owned());
                    paths.push(parent(x));
                }
            }
        }
    }
    relevant
}

/// The pending actions that made the directory `dir` exist where it is (a new directory,
/// or a real one moved there, at `dir` or above it); none when it is real where it is.
fn location_by(state: &State<'_>, dir: &str) -> Vec<u64> {
    let mut at = dir.to_owned();
    loop {
        match state.keys.get(&at) {
            Some(Node::Dir { by } | Node::Alias { by, .. }) => return by.clone(),
            Some(_) => return Vec::new(),
            None if at == "/" => return Vec::new(),
            None => at = parent(&at),
        }
    }
}

/// What the simulation gathered for the note.
#[derive(Default)]
struct Marks {
    shown: BTreeSet<u64>,
    lines: Vec<String>,
}

impl Marks {
    fn mark(&mut self, what: String, by: &[u64]) {
        if by.is_empty() {
            return;
        }
        self.shown.extend(by.iter().copied());
        self.lines.push(format!("{what} ({})", actions_phrase(by)));
    }

    fn note(&self, failing: &[(u64, String)]) -> String {
        let ids: Vec<u64> = self.shown.iter().copied().collect();
        let mut note = format!(
            "Simulated by the gate: this answer shows your pending {} as if a person had approved {}; nothing has been applied yet.",
            actions_phrase(&ids),
            if ids.len() == 1 { "it" } else { "them" }
        );
        for line in &self.lines {
            note.push_str("\n- ");
            note.push_str(line);
        }
        for (id, why) in failing {
            note.push_str(&format!(
                "\n- action {id} is not shown: applied now, it would fail ({why})"
            ));
        }
        note
    }
}

impl Filesystem {
    /// Replay the ops relevant to `paths` (those whose paths, or their directories, are
    /// related to a path the read names, transitively) and answer the read.
    async fn run(
        &self,
        read: ReadCall<'_>,
        ops: &[(u64, Op)],
        real: &dyn RealReads,
    ) -> Result<Answer, String> {
        let mut paths: Vec<String> = Vec::new();
        for path in read_paths(read) {
            paths.push(absolute(&path)?);
        }
        let relevant = relevant(paths, ops);
        let mut state = State::new(real);
        for ((id, op), relevant) in ops.iter().zip(relevant) {
            if relevant {
                state.apply(*id, op).await?;
            }
        }
        let mut marks = Marks::default();
        let outcome = match read.tool {
            "read_text_file" => self.read_text(&state, read, &mut marks).await?,
            "read_multiple_files" => self.read_many(&state, read, &mut marks).await?,
            "list_directory" => self.list(&state, read, &mut marks).await?,
            "directory_tree" => self.tree(&state, read, &mut marks).await?,
            "get_file_info" => self.info(&state, read, &mut marks).await?,
            "search_files" => self.search(&state, read, &mut marks).await?,
            other => {
                return Err(format!("the gate does not model what {other} shows"));
            }
        };
        let Some((text, is_error)) = outcome else {
            if state.failing.is_empty() {
                return Ok(Answer::Untouched);
            }
            // The read is the real one, but the agent should know its writes would fail.
            let mut result = real.read(read.tool, read.args.clone()).await?;
            let ids: Vec<u64> = state.failing.iter().map(|(id, _)| *id).collect();
            result.content.insert(
                0,
                gatekeeper_core::Content::text(marks.note(&state.failing)),
            );
            result.extra.insert(
                "_meta".to_owned(),
                json!({ super::META_KEY: { "simulated": true, "actions": ids } }),
            );
            return Ok(Answer::Simulated(result));
        };
        if marks.shown.is_empty() && state.failing.is_empty() {
            return Ok(Answer::Untouched);
        }
        let ids: Vec<u64> = marks
            .shown
            .iter()
            .copied()
            .chain(state.failing.iter().map(|(id, _)| *id))
            .collect();
        Ok(Answer::Simulated(simulated(
            marks.note(&state.failing),
            text,
            None,
            is_error,
            &ids,
        )))
    }

    /// `path` as the overlay shows it, fingerprinted: a file's content hash, `a directory`
    /// or `absent`, with the pending actions that left it so.
    async fn target(&self, state: &State<'_>, path: &str) -> Result<Target, String> {
        let (shown, by) = match state.look(path) {
            Look::Real(real) => {
                let by = if real == path {
                    Vec::new()
                } else {
                    self.moved_by(state, path)
                };
                let shown = match state.real_kind(&real).await? {
                    Kind::File => fingerprint(&state.real_content(&real).await?),
                    Kind::Dir => "a directory".to_owned(),
                    Kind::Missing => "absent".to_owned(),
                };
                (shown, by)
            }
            Look::Node(Node::File { content, by }) => {
                let text = match content {
                    Content::Known(text) => text,
                    Content::Real(real) => state.real_content(&real).await?,
                };
                (fingerprint(&text), by)
            }
            Look::Node(Node::Dir { by } | Node::Alias { by, .. }) => ("a directory".to_owned(), by),
            Look::Node(Node::Absent { by }) | Look::Missing(by) => ("absent".to_owned(), by),
        };
        Ok(Target {
            name: path.to_owned(),
            state: shown,
            by,
        })
    }

    /// A file's text once the pending writes are applied: `Ok(Err(message))` for a
    /// simulated error, `None` for a path nothing changed.
    async fn file_text(
        &self,
        state: &State<'_>,
        path: &str,
        marks: &mut Marks,
    ) -> Result<Option<Result<String, String>>, String> {
        Ok(Some(match state.look(path) {
            Look::Real(real) if real == path => return Ok(None),
            Look::Real(real) => {
                let text = state.real_content(&real).await;
                let by = self.moved_by(state, path);
                marks.mark(format!("{path} is {real}, moved"), &by);
                Ok(text?)
            }
            Look::Node(Node::File { content, by }) => {
                marks.mark(format!("{path}: its content"), &by);
                match content {
                    Content::Known(text) => Ok(text),
                    Content::Real(real) => Ok(state.real_content(&real).await?),
                }
            }
            Look::Node(Node::Dir { by } | Node::Alias { by, .. }) => {
                marks.mark(format!("{path} is a directory"), &by);
                Err("EISDIR: illegal operation on a directory, read".to_owned())
            }
            Look::Node(Node::Absent { by }) | Look::Missing(by) => {
                marks.mark(format!("{path} does not exist"), &by);
                Err(format!("ENOENT: no such file or directory, open '{path}'"))
            }
        }))
    }

    /// The actions that moved the directory `path` lies in.
    fn moved_by(&self, state: &State<'_>, path: &str) -> Vec<u64> {
        let mut at = path.to_owned();
        loop {
            if let Some(node) = state.keys.get(&at) {
                return node.by().to_vec();
            }
            if at == "/" {
                return Vec::new();
            }
            at = parent(&at);
        }
    }

    async fn read_text(&self, state: &State<'_>, read: ReadCall<'_>, marks: &mut Marks) -> Outcome {
        let lines = |key: &str| -> Result<Option<usize>, String> {
            match read.args.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(n) => match n.as_u64() {
                    Some(0) => Ok(None),
                    Some(n) => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
                    None => Err(format!("{key} = {n} is not a whole number of lines")),
                },
            }
        };
        let (head, tail) = (lines("head")?, lines("tail")?);
        if head.is_some() && tail.is_some() {
            return Ok(None); // The server refuses both at once; its answer says so.
        }
        let path = path_of(read)?;
        let Some(text) = self.file_text(state, &path, marks).await? else {
            return Ok(None);
        };
        Ok(Some(match text {
            Err(message) => (message, true),
            Ok(text) => match (head, tail) {
                (Some(n), _) => {
                    let mut lines: Vec<&str> = text.split('\n').collect();
                    if lines.last() == Some(&"") {
                        lines.pop();
                    }
                    (
                        lines.into_iter().take(n).collect::<Vec<_>>().join("\n"),
                        false,
                    )
                }
                (_, Some(n)) => {
                    let text = normalize_newlines(&text);
                    let lines: Vec<&str> = text.split('\n').collect();
                    let start = lines.len().saturating_sub(n);
                    (lines[start..].join("\n"), false)
                }
                _ => (text, false),
            },
        }))
    }

    async fn read_many(&self, state: &State<'_>, read: ReadCall<'_>, marks: &mut Marks) -> Outcome {
        let given = read_paths(read);
        if given.is_empty() {
            return Ok(None);
        }
        let mut parts = Vec::new();
        for given in &given {
            let path = absolute(given)?;
            match self.file_text(state, &path, marks).await? {
                Some(Ok(text)) => parts.push(format!("{given}:\n{text}\n")),
                Some(Err(message)) => parts.push(format!("{given}: Error - {message}")),
                None => {
                    let one = state
                        .real
                        .read("read_multiple_files", json!({ "paths": [given] }))
                        .await?;
                    if one.is_error {
                        return Err(format!(
                            "the server could not read {given} ({})",
                            text_of(&one).unwrap_or_default()
                        ));
                    }
                    parts.push(text_of(&one).unwrap_or_default().to_owned());
                }
            }
        }
        Ok(Some((parts.join("\n---\n"), false)))
    }

    /// A directory's entries once the pending writes are applied, as (name, is a
    /// directory), real ones first in the server's order.
    async fn entries(
        &self,
        state: &State<'_>,
        path: &str,
        marks: &mut Marks,
    ) -> Result<Result<Vec<(String, bool)>, String>, String> {
        let look = state.look(path);
        if let Some(error) = scandir_refused(&look, path, marks) {
            return Ok(Err(error));
        }
        let mut entries: Vec<(String, bool)> = match look {
            Look::Node(Node::Dir { by }) => {
                marks.mark(format!("{path}: a new directory"), &by);
                Vec::new()
            }
            look => {
                let real = match look {
                    // Inside a directory a pending move put here: listed where it really is.
                    Look::Real(real) if real != path => {
                        marks.mark(
                            format!("{path} is {real}, moved"),
                            &self.moved_by(state, path),
                        );
                        real
                    }
                    Look::Real(real) => real,
                    Look::Node(Node::Alias { real, by }) => {
                        marks.mark(format!("{path} is {real}, moved"), &by);
                        real
                    }
                    _ => unreachable!("handled above"),
                };
                let listing = state
                    .real
                    .read("list_directory", json!({ "path": real }))
                    .await?;
                let text = text_of(&listing).unwrap_or_default();
                if listing.is_error {
                    return Ok(Err(text.to_owned()));
                }
                let mut entries = Vec::new();
                for line in text.lines().filter(|l| !l.is_empty()) {
                    if let Some(name) = line.strip_prefix("[DIR] ") {
                        entries.push((name.to_owned(), true));
                    } else if let Some(name) = line.strip_prefix("[FILE] ") {
                        entries.push((name.to_owned(), false));
                    } else {
                        return Err(format!(
                            "the server listed {real} in a form the gate does not know"
                        ));
                    }
                }
                entries
            }
        };
        for (key, node) in state.inside(path) {
            if parent(&key) != path {
                continue;
            }
            let name = name_of(&key).to_owned();
            let at = entries.iter().position(|(n, _)| *n == name);
            match &node {
                Node::Absent { by } => {
                    if let Some(at) = at {
                        entries.remove(at);
                        marks.mark(format!("{key} is gone"), by);
                    }
                }
                node => {
                    let dir = !matches!(node, Node::File { .. });
                    match at {
                        Some(at) => entries[at].1 = dir,
                        None => entries.push((name, dir)),
                    }
                    marks.mark(format!("{key} is new or changed"), node.by());
                }
            }
        }
        Ok(Ok(entries))
    }

    async fn list(&self, state: &State<'_>, read: ReadCall<'_>, marks: &mut Marks) -> Outcome {
        let path = path_of(read)?;
        Ok(Some(match self.entries(state, &path, marks).await? {
            Err(message) => (message, true),
            Ok(entries) => (
                entries
                    .iter()
                    .map(|(name, dir)| format!("{} {name}", if *dir { "[DIR]" } else { "[FILE]" }))
                    .collect::<Vec<_>>()
                    .join("\n"),
                false,
            ),
        }))
    }

    async fn tree(&self, state: &State<'_>, read: ReadCall<'_>, marks: &mut Marks) -> Outcome {
        let path = path_of(read)?;
        let excludes = tree_patterns(read.args.get("excludePatterns"))?;
        let excluded = |rel: &str| excludes.iter().any(|g| g.matches(rel));
        let look = state.look(&path);
        if let Some(error) = scandir_refused(&look, &path, marks) {
            return Ok(Some((error, true)));
        }
        let mut root: Vec<TreeNode> = match look {
            Look::Node(Node::Dir { by }) => {
                marks.mark(format!("{path}: a new directory"), &by);
                Vec::new()
            }
            Look::Node(Node::Alias { real, by }) => {
                marks.mark(format!("{path} is {real}, moved"), &by);
                let mut tree = real_tree(state.real, &real).await?;
                prune(&mut tree, "", &excluded);
                tree
            }
            Look::Real(real) if real == path => {
                let answer = state.real.read("directory_tree", read.args.clone()).await?;
                if answer.is_error {
                    return Ok(None);
                }
                parse_tree(text_of(&answer).unwrap_or_default())?
            }
            Look::Real(real) => {
                let by = self.moved_by(state, &path);
                marks.mark(format!("{path} is {real}, moved"), &by);
                let mut tree = real_tree(state.real, &real).await?;
                prune(&mut tree, "", &excluded);
                tree
            }
            Look::Node(Node::File { .. } | Node::Absent { .. }) | Look::Missing(_) => {
                unreachable!("refused by scandir_refused above")
            }
        };
        for (key, node) in state.inside(&path) {
            let rel = relative(&key, &path).to_owned();
            if excluded_here_or_above(&rel, &excluded) {
                continue;
            }
            match &node {
                Node::Absent { by } => {
                    if remove_at(&mut root, &rel) {
                        marks.mark(format!("{key} is gone"), by);
                    }
                }
                Node::File { by, .. } => {
                    put_at(
                        &mut root,
                        &rel,
                        TreeNode {
                            name: name_of(&key).to_owned(),
                            children: None,
                        },
                    )?;
                    marks.mark(format!("{key} is new or changed"), by);
                }
                Node::Dir { by } => {
                    put_at(
                        &mut root,
                        &rel,
                        TreeNode {
                            name: name_of(&key).to_owned(),
                            children: Some(Vec::new()),
                        },
                    )?;
                    marks.mark(format!("{key} is a new directory"), by);
                }
                Node::Alias { real, by } => {
                    let mut children = real_tree(state.real, real).await?;
                    prune(&mut children, &rel, &excluded);
                    put_at(
                        &mut root,
                        &rel,
                        TreeNode {
                            name: name_of(&key).to_owned(),
                            children: Some(children),
                        },
                    )?;
                    marks.mark(format!("{key} is {real}, moved"), by);
                }
            }
        }
        Ok(Some((tree_js(&root).pretty(), false)))
    }

    async fn info(&self, state: &State<'_>, read: ReadCall<'_>, marks: &mut Marks) -> Outcome {
        let path = path_of(read)?;
        let real_info = |real: String| async move {
            let answer = state
                .real
                .read("get_file_info", json!({ "path": real }))
                .await?;
            Ok::<_, String>((
                text_of(&answer).unwrap_or_default().to_owned(),
                answer.is_error,
            ))
        };
        Ok(Some(match state.look(&path) {
            Look::Real(real) if real == path => return Ok(None),
            Look::Real(real) => {
                let by = self.moved_by(state, &path);
                marks.mark(format!("{path} is {real}, moved"), &by);
                real_info(real).await?
            }
            Look::Node(Node::Alias { real, by }) => {
                marks.mark(format!("{path} is {real}, moved"), &by);
                real_info(real).await?
            }
            Look::Node(Node::File {
                content: Content::Real(real),
                by,
            }) => {
                marks.mark(format!("{path} is {real}, moved"), &by);
                real_info(real).await?
            }
            Look::Node(Node::File {
                content: Content::Known(text),
                by,
            }) => {
                marks.mark(format!("{path}: its content"), &by);
                let unknown = format!("not known until {} is applied", actions_phrase(&by));
                (
                    format!(
                        "size: {}\ncreated: {unknown}\nmodified: {unknown}\naccessed: {unknown}\nisDirectory: false\nisFile: true\npermissions: {unknown}",
                        text.len()
                    ),
                    false,
                )
            }
            Look::Node(Node::Dir { by }) => {
                marks.mark(format!("{path}: a new directory"), &by);
                let unknown = format!("not known until {} is applied", actions_phrase(&by));
                (
                    format!(
                        "size: {unknown}\ncreated: {unknown}\nmodified: {unknown}\naccessed: {unknown}\nisDirectory: true\nisFile: false\npermissions: {unknown}"
                    ),
                    false,
                )
            }
            Look::Node(Node::Absent { by }) | Look::Missing(by) => {
                marks.mark(format!("{path} does not exist"), &by);
                (
                    format!("ENOENT: no such file or directory, stat '{path}'"),
                    true,
                )
            }
        }))
    }

    async fn search(&self, state: &State<'_>, read: ReadCall<'_>, marks: &mut Marks) -> Outcome {
        let path = path_of(read)?;
        let Some(pattern) = read.args.get("pattern").and_then(Value::as_str) else {
            return Ok(None);
        };
        let pattern = Glob::new(pattern)?;
        let excludes = patterns(read.args.get("excludePatterns"))?;
        let excluded = |rel: &str| excludes.iter().any(|g| g.matches(rel));
        let hit = |rel: &str| pattern.matches(rel) && !excluded_here_or_above(rel, &excluded);
        // Every result is a path under `path`, in the server's order.
        let look = state.look(&path);
        if let Some(error) = scandir_refused(&look, &path, marks) {
            return Ok(Some((error, true)));
        }
        let mut results: Vec<String> = match look {
            Look::Node(Node::Dir { by }) => {
                marks.mark(format!("{path}: a new directory"), &by);
                Vec::new()
            }
            look => {
                let real = match look {
                    Look::Real(real) => {
                        if real != path {
                            let by = self.moved_by(state, &path);
                            marks.mark(format!("{path} is {real}, moved"), &by);
                        }
                        real
                    }
                    Look::Node(Node::Alias { real, by }) => {
                        marks.mark(format!("{path} is {real}, moved"), &by);
                        real
                    }
                    _ => unreachable!("handled above"),
                };
                let mut args = read.args.clone();
                args["path"] = Value::String(real.clone());
                let answer = state.real.read("search_files", args).await?;
                let text = text_of(&answer).unwrap_or_default();
                if answer.is_error {
                    return Ok(None);
                }
                let mut found = Vec::new();
                if text != "No matches found" {
                    for line in text.lines() {
                        if !under(line, &real) {
                            return Err(format!(
                                "the server found {line}, which is not under {real} as written (a symbolic link?); the gate compares paths as written"
                            ));
                        }
                        found.push(join(&path, relative(line, &real)));
                    }
                }
                found
            }
        };
        for (key, node) in state.inside(&path) {
            let rel = relative(&key, &path).to_owned();
            // What was at `key` before is gone or replaced; its own entry is decided below.
            let before = results.len();
            results.retain(|r| !under(r, &key));
            let mut changed = results.len() != before;
            match &node {
                Node::Absent { by } => {
                    let had = results.len();
                    results.retain(|r| r != &key);
                    if changed || results.len() != had {
                        marks.mark(format!("{key} is gone"), by);
                    }
                    continue;
                }
                Node::Alias { real, .. } => {
                    for entry in flatten(&real_tree(state.real, real).await?, "") {
                        let inner = join(&rel, &entry);
                        if hit(&inner) {
                            results.push(join(&path, &inner));
                            changed = true;
                        }
                    }
                }
                Node::File { .. } | Node::Dir { .. } => {}
            }
            if hit(&rel) && !results.contains(&key) {
                results.push(key.clone());
                changed = true;
            }
            if changed {
                marks.mark(format!("{key} is new, changed or moved"), node.by());
            }
        }
        let text = if results.is_empty() {
            "No matches found".to_owned()
        } else {
            results.join("\n")
        };
        Ok(Some((text, false)))
    }
}

/// A read's text and whether it is an error, `None` when the read is the real one.
type Outcome = Result<Option<(String, bool)>, String>;

/// Parse `excludePatterns`.
fn patterns(value: Option<&Value>) -> Result<Vec<Glob>, String> {
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|p| {
                p.as_str()
                    .ok_or_else(|| "excludePatterns holds a value that is not a string".to_owned())
                    .and_then(Glob::new)
            })
            .collect(),
        Some(_) => Err("excludePatterns is not a list".to_owned()),
    }
}

/// `directory_tree`'s exclusions: a pattern with `*` matches the relative path as it is;
/// one without also matches as `**/p` and `**/p/**` (a name anywhere, or inside it).
fn tree_patterns(value: Option<&Value>) -> Result<Vec<Glob>, String> {
    let mut globs = Vec::new();
    if let Some(Value::Array(items)) = value {
        for item in items {
            let pattern = item
                .as_str()
                .ok_or_else(|| "excludePatterns holds a value that is not a string".to_owned())?;
            globs.push(Glob::new(pattern)?);
            if !pattern.contains('*') {
                globs.push(Glob::new(&format!("**/{pattern}"))?);
                globs.push(Glob::new(&format!("**/{pattern}/**"))?);
            }
        }
        return Ok(globs);
    }
    patterns(value)
}

/// Whether `rel` or one of its ancestors is excluded (the server does not descend into an
/// excluded directory).
fn excluded_here_or_above(rel: &str, excluded: &dyn Fn(&str) -> bool) -> bool {
    let mut at = rel;
    loop {
        if excluded(at) {
            return true;
        }
        match at.rfind('/') {
            Some(i) => at = &at[..i],
            None => return false,
        }
    }
}

/// One entry of `directory_tree`'s answer.
#[derive(Debug, Clone, PartialEq)]
struct TreeNode {
    name: String,
    /// `Some` for a directory.
    children: Option<Vec<TreeNode>>,
}

fn parse_tree(text: &str) -> Result<Vec<TreeNode>, String> {
    fn node(value: &Value) -> Option<TreeNode> {
        let name = value.get("name")?.as_str()?.to_owned();
        let children = match value.get("type")?.as_str()? {
            "directory" => Some(
                value
                    .get("children")?
                    .as_array()?
                    .iter()
                    .map(node)
                    .collect::<Option<Vec<_>>>()?,
            ),
            _ => None,
        };
        Some(TreeNode { name, children })
    }
    let value: Value = serde_json::from_str(text).map_err(|_| {
        "the server's directory_tree answer is not the JSON the gate knows".to_owned()
    })?;
    value
        .as_array()
        .and_then(|items| items.iter().map(node).collect::<Option<Vec<_>>>())
        .ok_or_else(|| {
            "the server's directory_tree answer is not the JSON the gate knows".to_owned()
        })
}

async fn real_tree(real: &dyn RealReads, path: &str) -> Result<Vec<TreeNode>, String> {
    let answer = real.read("directory_tree", json!({ "path": path })).await?;
    let text = text_of(&answer).unwrap_or_default();
    if answer.is_error {
        return Err(format!("the server could not list {path} ({text})"));
    }
    parse_tree(text)
}

/// Drop what `excluded` excludes, `prefix` being the nodes' directory relative to the root.
fn prune(nodes: &mut Vec<TreeNode>, prefix: &str, excluded: &dyn Fn(&str) -> bool) {
    nodes.retain_mut(|node| {
        let rel = join_rel(prefix, &node.name);
        if excluded(&rel) {
            return false;
        }
        if let Some(children) = &mut node.children {
            prune(children, &rel, excluded);
        }
        true
    });
}

fn join_rel(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_owned()
    } else {
        format!("{prefix}/{name}")
    }
}

/// Every path in `nodes`, relative, parents before children.
fn flatten(nodes: &[TreeNode], prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    for node in nodes {
        let rel = join_rel(prefix, &node.name);
        out.push(rel.clone());
        if let Some(children) = &node.children {
            out.extend(flatten(children, &rel));
        }
    }
    out
}

fn remove_at(nodes: &mut Vec<TreeNode>, rel: &str) -> bool {
    match rel.split_once('/') {
        None => {
            let before = nodes.len();
            nodes.retain(|n| n.name != rel);
            nodes.len() != before
        }
        Some((first, rest)) => nodes
            .iter_mut()
            .find(|n| n.name == first)
            .and_then(|n| n.children.as_mut())
            .is_some_and(|children| remove_at(children, rest)),
    }
}

fn put_at(nodes: &mut Vec<TreeNode>, rel: &str, new: TreeNode) -> Result<(), String> {
    match rel.split_once('/') {
        None => {
            match nodes.iter_mut().find(|n| n.name == rel) {
                Some(existing) => *existing = new,
                None => nodes.push(new),
            }
            Ok(())
        }
        Some((first, rest)) => match nodes
            .iter_mut()
            .find(|n| n.name == first)
            .and_then(|n| n.children.as_mut())
        {
            Some(children) => put_at(children, rest, new),
            None => Err(format!(
                "the tree has no directory {first:?} to hold {rel}; the gate's model and the server disagree"
            )),
        },
    }
}

fn tree_js(nodes: &[TreeNode]) -> JsValue {
    JsValue::Arr(
        nodes
            .iter()
            .map(|node| {
                let mut fields = vec![
                    ("name", JsValue::Str(node.name.clone())),
                    (
                        "type",
                        JsValue::Str(
                            if node.children.is_some() {
                                "directory"
                            } else {
                                "file"
                            }
                            .to_owned(),
                        ),
                    ),
                ];
                if let Some(children) = &node.children {
                    fields.push(("children", tree_js(children)));
                }
                JsValue::Obj(fields)
            })
            .collect(),
    )
}

#[async_trait]
impl Simulator for Filesystem {
    fn name(&self) -> &'static str {
        "filesystem"
    }

    fn expects(&self) -> &'static [Expectation] {
        EXPECTS
    }

    fn models(&self, tool: &str) -> bool {
        WRITES.contains(&tool)
    }

    fn touches(&self, read: ReadCall<'_>, pending: &[PendingWrite]) -> bool {
        if pending.is_empty() || read.tool == "list_allowed_directories" {
            return false;
        }
        let mut read_at = Vec::new();
        for path in read_paths(read) {
            match absolute(&path) {
                Ok(path) => read_at.push(path),
                Err(_) => return true,
            }
        }
        pending.iter().any(|write| match parse(write) {
            Ok(None) | Err(_) => true,
            Ok(Some(op)) => op
                .paths()
                .iter()
                .any(|x| read_at.iter().any(|r| related(x, r))),
        })
    }

    async fn simulate(
        &self,
        read: ReadCall<'_>,
        pending: &[PendingWrite],
        real: &dyn RealReads,
    ) -> Answer {
        let all: Vec<u64> = pending.iter().map(|w| w.action).collect();
        let cannot = |reason: String| Answer::Cannot {
            reason,
            actions: all.clone(),
        };
        let mut ops = Vec::new();
        for write in pending {
            match parse(write) {
                Ok(Some(op)) => ops.push((write.action, op)),
                Ok(None) => {
                    return cannot(format!(
                        "action {} calls {}, which the gate does not model",
                        write.action, write.tool
                    ));
                }
                Err(reason) => return cannot(format!("action {}: {reason}", write.action)),
            }
        }
        match self.run(read, &ops, real).await {
            Ok(answer) => answer,
            Err(reason) => cannot(reason),
        }
    }

    /// A write's targets are its paths (a move's source and destination), each as the
    /// pending writes before it leave it. It is built on the actions that made the
    /// directory it lands in (a pending `create_directory`, a move of an ancestor) and,
    /// for an edit or a move's source, on those that made the content it changes or moves;
    /// a `write_file` over a pending write's content replaces it and is not built on it
    /// (its target's fingerprint still names it).
    async fn basis(
        &self,
        write: &PendingWrite,
        before: &[PendingWrite],
        real: &dyn RealReads,
    ) -> Result<Basis, String> {
        let op = match parse(write)? {
            Some(op) => op,
            None => return Err(format!("{} is not a write the gate models", write.tool)),
        };
        let mut ops = Vec::new();
        for earlier in before {
            match parse(earlier) {
                Ok(Some(op)) => ops.push((earlier.action, op)),
                Ok(None) => {
                    return Err(format!(
                        "action {} calls {}, which the gate does not model",
                        earlier.action, earlier.tool
                    ));
                }
                Err(reason) => return Err(format!("action {}: {reason}", earlier.action)),
            }
        }
        let named: Vec<String> = op.paths().into_iter().map(str::to_owned).collect();
        let mut paths = named.clone();
        paths.extend(named.iter().map(|p| parent(p)));
        let mut state = State::new(real);
        for ((id, earlier), relevant) in ops.iter().zip(relevant(paths, &ops)) {
            if relevant {
                state.apply(*id, earlier).await?;
            }
        }
        let mut built_on = BTreeSet::new();
        let mut targets = Vec::new();
        for (i, path) in named.iter().enumerate() {
            let target = self.target(&state, path).await?;
            built_on.extend(location_by(&state, &parent(path)));
            let needs_content = match &op {
                Op::Edit { .. } => true,
                Op::Move { .. } => i == 0,
                _ => false,
            };
            if needs_content {
                built_on.extend(target.by.iter().copied());
            }
            targets.push(target);
        }
        Ok(Basis {
            targets,
            built_on: built_on.into_iter().collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalized_as_node_resolves_them() {
        assert_eq!(absolute("/a/./b//c/../d/").unwrap(), "/a/b/d");
        assert_eq!(absolute("/..").unwrap(), "/");
        assert!(absolute("notes/a.md").unwrap_err().contains("not absolute"));
        assert!(absolute("~/a").is_err());
    }

    #[test]
    fn relations_are_by_whole_components() {
        assert!(related("/a/b", "/a") && related("/a", "/a/b") && related("/a", "/a"));
        assert!(!related("/a/bc", "/a/b"));
        assert_eq!(parent("/a"), "/");
        assert_eq!(relative("/a/b/c", "/a"), "b/c");
        assert_eq!(join("/", "x"), "/x");
    }

    #[test]
    fn reads_of_paths_no_pending_write_touches_are_not_touched() {
        let fs = Filesystem;
        let pending = [PendingWrite {
            action: 3,
            tool: "write_file".into(),
            args: json!({"path": "/w/notes/plan.md", "content": "x"}),
        }];
        let read = |tool: &'static str, args: Value| (tool, args);
        for (tool, args, touched) in [
            (
                read("read_text_file", json!({"path": "/w/notes/plan.md"})),
                true,
            ),
            (
                read("read_text_file", json!({"path": "/w/notes/other.md"})),
                false,
            ),
            (read("list_directory", json!({"path": "/w/notes"})), true),
            (read("list_directory", json!({"path": "/w/src"})), false),
            (
                read("search_files", json!({"path": "/w", "pattern": "**"})),
                true,
            ),
            (
                read("read_text_file", json!({"path": "notes/plan.md"})),
                true,
            ),
            (read("list_allowed_directories", json!({})), false),
        ]
        .map(|((t, a), touched)| (t, a, touched))
        {
            assert_eq!(
                fs.touches(ReadCall { tool, args: &args }, &pending),
                touched,
                "{tool} {args}"
            );
        }
    }
}

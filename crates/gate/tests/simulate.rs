//! `pending = "simulate"` through `gate serve`, with the real npm servers
//! `@modelcontextprotocol/server-filesystem` and `server-memory` as `cargo xtask e2e`
//! installs them in `target/e2e/npm` (installed there with npm, at the versions
//! `xtask/e2e/npm-servers.txt` pins, when they are missing; without node and npm the test
//! fails naming them), and the fixture server for a simulator that does not match its
//! server.

#[path = "support/daemon.rs"]
mod daemon;
#[path = "support/fixture.rs"]
mod fixture;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use rmcp::model::CallToolResult;
use serde_json::{Value, json};

use daemon::{CODER_TOKEN, IDLE_TOKEN, action_id, call, connect, spawn_serve};
use fixture::{fixture_binary, free_port};

/// Where `cargo xtask e2e` installs the npm servers.
fn npm_prefix() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/e2e/npm")
}

/// The entry point of an installed npm server, if it is there.
fn npm_server(package: &str) -> Option<PathBuf> {
    let path = npm_prefix()
        .join("node_modules/@modelcontextprotocol")
        .join(package)
        .join("dist/index.js");
    path.exists()
        .then(|| path.canonicalize().expect("an existing path"))
}

/// The pinned npm servers, installed where `cargo xtask e2e` keeps them unless they are
/// there; a machine without node and npm fails the test with what to install.
fn npm_servers() -> (PathBuf, PathBuf, PathBuf) {
    let node = node().expect(
        "this test runs the real npm MCP servers and needs node and npm: install them (Debian: apt-get install nodejs npm)",
    );
    // The tests of this file run at once: one installs while the others wait, so none
    // starts a server from a half-written tree.
    static INSTALLING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _installing = INSTALLING.lock().unwrap_or_else(|p| p.into_inner());
    if npm_server("server-filesystem").is_none() || npm_server("server-memory").is_none() {
        let pinned = include_str!("../../../xtask/e2e/npm-servers.txt")
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'));
        let prefix = npm_prefix();
        std::fs::create_dir_all(&prefix).expect("target/e2e/npm");
        let installed = Command::new("npm")
            .arg("install")
            .arg("--prefix")
            .arg(&prefix)
            .args(["--save-exact", "--no-audit", "--no-fund", "--loglevel=error"])
            .args(pinned)
            .output()
            .expect("this test needs npm to install the MCP servers: install it (Debian: apt-get install npm)");
        assert!(
            installed.status.success(),
            "npm could not install the pinned MCP servers: {}",
            String::from_utf8_lossy(&installed.stderr)
        );
    }
    (
        node,
        npm_server("server-filesystem").expect("installed"),
        npm_server("server-memory").expect("installed"),
    )
}

fn node() -> Option<PathBuf> {
    let found = Command::new("sh")
        .args(["-c", "command -v node"])
        .output()
        .ok()?;
    let path = String::from_utf8(found.stdout).ok()?.trim().to_owned();
    (!path.is_empty()).then(|| PathBuf::from(path))
}

struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "gate-simulate-{}-{}-{name}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir.canonicalize().unwrap())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn private(path: &Path) {
    std::fs::set_permissions(
        path,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600),
    )
    .unwrap();
}

/// A private gate.toml in `scratch` over the real npm servers (`node`, and the two
/// servers' entry points), both simulated and confined to their own directories, with the
/// agent `coder` granted both, then `extra`; the filesystem server's root (with an empty
/// `notes` folder) and the configuration's path.
fn npm_config(
    scratch: &Scratch,
    (node, files, memory): (&Path, &Path, &Path),
    extra: &str,
) -> (PathBuf, PathBuf) {
    let work = scratch.0.join("work");
    std::fs::create_dir_all(work.join("notes")).unwrap();
    let graph = scratch.0.join("graph");
    std::fs::create_dir_all(&graph).unwrap();
    let config = scratch.0.join("gate.toml");
    std::fs::write(
        &config,
        format!(
            r#"listen = "127.0.0.1:{port}"

[[server]]
name = "files"
command = {node:?}
args = [{files:?}, {work:?}]
trust = "vetted"
pending = "simulate"
simulator = "filesystem"
paths = [{work:?}]

[[server]]
name = "memory"
command = {node:?}
args = [{memory:?}]
env = {{ MEMORY_FILE_PATH = {graph_file:?} }}
pending = "simulate"
simulator = "memory"
paths = [{graph:?}]

[[agent]]
name = "coder"
token = "{CODER_TOKEN}"
[[agent.grant]]
server = "files"
[[agent.grant]]
server = "memory"
{extra}"#,
            port = free_port(),
            graph_file = graph.join("memory.jsonl"),
        ),
    )
    .unwrap();
    private(&config);
    (work, config)
}

fn person(data: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gate"))
        .args(args)
        .arg("--data-dir")
        .arg(data)
        .output()
        .unwrap();
    assert!(out.status.success(), "gate {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn blocks(result: &CallToolResult) -> Vec<String> {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_reads_its_own_pending_file_and_graph_marked_and_approval_makes_them_real() {
    let (node, files, memory) = npm_servers();
    let scratch = Scratch::new("npm");
    let (work, config) = npm_config(
        &scratch,
        (&node, &files, &memory),
        &format!(
            "\n[[agent]]\nname = \"idle\"\ntoken = \"{IDLE_TOKEN}\"\n[[agent.grant]]\nserver = \"files\"\n"
        ),
    );
    std::fs::write(work.join("notes/old.md"), "old\n").unwrap();
    let data = scratch.0.join("data");
    let (mut child, url) = spawn_serve(&config, &data);
    let coder = connect(&url, CODER_TOKEN).await;
    let idle = connect(&url, IDLE_TOKEN).await;
    let plan = work.join("notes/plan.md").to_string_lossy().into_owned();
    let notes = work.join("notes").to_string_lossy().into_owned();

    // The agent writes a file: staged, and told its reads will show it.
    let staged = blocks(
        &call(
            &coder,
            "files__write_file",
            json!({"path": plan, "content": "step one\nstep two\n"}),
        )
        .await,
    );
    assert!(
        staged[0].contains("your later reads of this server show this change"),
        "{staged:?}"
    );
    let write = action_id(&staged[0]);

    // It reads it back: simulated, marked.
    let read = call(&coder, "files__read_text_file", json!({"path": plan})).await;
    let read_blocks = blocks(&read);
    assert_ne!(read.is_error, Some(true), "{read_blocks:?}");
    assert!(
        read_blocks[0].starts_with("Simulated by the gate"),
        "{read_blocks:?}"
    );
    assert!(
        read_blocks[0].contains(&format!("action {write}")),
        "{read_blocks:?}"
    );
    assert_eq!(read_blocks[1], "step one\nstep two\n");
    let meta = serde_json::to_value(&read.meta).unwrap();
    assert_eq!(meta["gate/pending"]["actions"], json!([write]), "{meta}");

    // It edits the pending content; the edit applies to it.
    let edit = action_id(
        &blocks(
            &call(
                &coder,
                "files__edit_file",
                json!({"path": plan, "edits": [{"oldText": "two", "newText": "2"}]}),
            )
            .await,
        )[0],
    );
    let read = blocks(&call(&coder, "files__read_text_file", json!({"path": plan})).await);
    assert_eq!(read[1], "step one\nstep 2\n");
    assert!(
        read[0].contains(&format!("actions {write} and {edit}")),
        "{read:?}"
    );
    let last_read = read[1].clone();

    // Its directory lists the new file, marked.
    let listing = blocks(&call(&coder, "files__list_directory", json!({"path": notes})).await);
    assert!(
        listing[0].contains("plan.md is new or changed"),
        "{listing:?}"
    );
    let mut entries: Vec<&str> = listing[1].lines().collect();
    entries.sort_unstable();
    assert_eq!(entries, ["[FILE] old.md", "[FILE] plan.md"]);

    // A read nothing pending touches is the server's answer alone.
    let old = blocks(
        &call(
            &coder,
            "files__read_text_file",
            json!({"path": work.join("notes/old.md")}),
        )
        .await,
    );
    assert_eq!(old, ["old\n"]);
    // Another agent never sees this agent's pending writes.
    let theirs = call(&idle, "files__read_text_file", json!({"path": plan})).await;
    assert_eq!(theirs.is_error, Some(true), "{:?}", blocks(&theirs));
    assert!(!blocks(&theirs)[0].contains("Simulated"));

    // A memory entity, the same way.
    let entity = action_id(&blocks(&call(&coder, "memory__create_entities", json!({"entities": [{"name": "Plan", "entityType": "doc", "observations": ["in notes"]}]})).await)[0]);
    let simulated_graph = blocks(&call(&coder, "memory__read_graph", json!({})).await);
    assert!(
        simulated_graph[0].contains(&format!("entity \"Plan\" created (action {entity})")),
        "{simulated_graph:?}"
    );

    // `gate catalog` says the simulators are on.
    let catalog = person(&data, &["catalog"]);
    assert!(
        catalog.contains("the filesystem simulator is on"),
        "{catalog}"
    );
    assert!(catalog.contains("the memory simulator is on"), "{catalog}");

    // The person approves, in order: the file is what the agent last read.
    person(
        &data,
        &[
            "approve",
            &write.to_string(),
            &edit.to_string(),
            &entity.to_string(),
        ],
    );
    assert_eq!(std::fs::read_to_string(&plan).unwrap(), last_read);
    let real = blocks(&call(&coder, "files__read_text_file", json!({"path": plan})).await);
    assert_eq!(
        real,
        [last_read],
        "once applied, the read is the server's, unmarked"
    );
    let real_graph = blocks(&call(&coder, "memory__read_graph", json!({})).await);
    assert_eq!(
        real_graph,
        [simulated_graph[1].clone()],
        "the graph is what the agent saw"
    );

    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_simulator_that_does_not_match_its_servers_tools_is_off_and_says_why() {
    let scratch = Scratch::new("mismatch");
    let config = scratch.0.join("gate.toml");
    std::fs::write(
        &config,
        format!(
            r#"listen = "127.0.0.1:{port}"

[[server]]
name = "fixture"
command = {fixture:?}
pending = "simulate"
simulator = "filesystem"

[[agent]]
name = "coder"
token = "{CODER_TOKEN}"
[[agent.grant]]
server = "fixture"
"#,
            port = free_port(),
            fixture = fixture_binary(),
        ),
    )
    .unwrap();
    private(&config);
    let data = scratch.0.join("data");
    let (mut child, url) = spawn_serve(&config, &data);
    let coder = connect(&url, CODER_TOKEN).await;
    let catalog = person(&data, &["catalog"]);
    assert!(
        catalog.contains("pending = \"simulate\" is OFF"),
        "{catalog}"
    );
    assert!(catalog.contains("no longer lists write_file"), "{catalog}");
    // Writes and reads go on as with "hide".
    let staged = blocks(&call(&coder, "fixture__write_note", json!({"text": "hi"})).await);
    assert!(
        staged[0].contains("later reads will not show this change"),
        "{staged:?}"
    );
    let read: Value =
        serde_json::to_value(call(&coder, "fixture__read_notes", json!({})).await).unwrap();
    assert!(!read.to_string().contains("Simulated"), "{read}");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn check_refuses_simulate_for_a_server_the_gate_has_no_simulator_for() {
    let scratch = Scratch::new("check");
    let config = scratch.0.join("gate.toml");
    for (extra, expected) in [
        ("pending = \"simulate\"", "the gate has them only for"),
        (
            "pending = \"simulate\"\nsimulator = \"git\"",
            "no simulator \"git\"",
        ),
        ("pending = \"await\"", "not built into the gate yet"),
    ] {
        std::fs::write(
            &config,
            format!(
                "[[server]]\nname = \"git\"\ncommand = {fixture:?}\n{extra}\n\n[[agent]]\nname = \"coder\"\ntoken = \"{CODER_TOKEN}\"\n",
                fixture = fixture_binary(),
            ),
        )
        .unwrap();
        private(&config);
        let out = Command::new(env!("CARGO_BIN_EXE_gate"))
            .args(["check", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && said.contains(expected),
            "{extra}: {said}"
        );
    }
}

/// `gate ARGS`, whether it succeeded, and what it printed (out and err).
fn person_may_fail(data: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gate"))
        .args(args)
        .arg("--data-dir")
        .arg(data)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_changed_after_staging_is_stale_and_rejecting_a_write_flags_or_rejects_what_was_built_on_it()
 {
    let (node, files, memory) = npm_servers();
    let scratch = Scratch::new("stale");
    let (work, config) = npm_config(&scratch, (&node, &files, &memory), "");
    let real = work.join("notes/real.md");
    std::fs::write(&real, "original\n").unwrap();
    let data = scratch.0.join("data");
    let (child, url) = spawn_serve(&config, &data);
    let _serve = Stop(child);
    let coder = connect(&url, CODER_TOKEN).await;
    let stage = |tool: &'static str, args: Value| {
        let coder = &coder;
        async move {
            let staged = blocks(&call(coder, tool, args).await);
            action_id(&staged[0])
        }
    };

    // Stale: an edit staged against the file as it was; someone changes it on disk.
    let real_path = real.to_string_lossy().into_owned();
    let edit = stage(
        "files__edit_file",
        json!({"path": real_path, "edits": [{"oldText": "original", "newText": "edited"}]}),
    )
    .await;
    let pending = person(&data, &["pending"]);
    assert!(!pending.contains("STALE"), "nothing changed yet: {pending}");
    std::fs::write(&real, "original, and a line someone else wrote\n").unwrap();
    let pending = person(&data, &["pending"]);
    assert!(
        pending.contains(&format!("#{edit}: STALE: {real_path} was content sha256:")),
        "{pending}"
    );
    let shown = person(&data, &["show", &edit.to_string()]);
    assert!(
        shown.contains("STALE") && shown.contains(&format!("gate approve {edit} --stale-seen")),
        "{shown}"
    );
    let (approved, said) = person_may_fail(&data, &["approve", &edit.to_string()]);
    assert!(
        !approved && said.contains(&format!("#{edit}: not approved: STALE")),
        "{said}"
    );
    assert_eq!(
        std::fs::read_to_string(&real).unwrap(),
        "original, and a line someone else wrote\n",
        "nothing was sent"
    );
    let (approved, said) = person_may_fail(&data, &["approve", &edit.to_string(), "--stale-seen"]);
    assert!(approved, "{said}");
    assert_eq!(
        std::fs::read_to_string(&real).unwrap(),
        "edited, and a line someone else wrote\n"
    );

    // Built on: a write, an edit of its content, a move of the file; a write elsewhere
    // after a simulated read that showed the first.
    let plan = work.join("notes/plan.md").to_string_lossy().into_owned();
    let moved = work.join("notes/moved.md").to_string_lossy().into_owned();
    let other = work.join("notes/other.md").to_string_lossy().into_owned();
    let write = stage(
        "files__write_file",
        json!({"path": plan, "content": "step one\n"}),
    )
    .await;
    let on_it = stage(
        "files__edit_file",
        json!({"path": plan, "edits": [{"oldText": "one", "newText": "1"}]}),
    )
    .await;
    let moving = stage(
        "files__move_file",
        json!({"source": plan, "destination": moved}),
    )
    .await;
    let read = blocks(&call(&coder, "files__read_text_file", json!({"path": moved})).await);
    assert!(read[0].starts_with("Simulated by the gate"), "{read:?}");
    let after_read = stage(
        "files__write_file",
        json!({"path": other, "content": "seen the plan"}),
    )
    .await;
    let shown = person(&data, &["show", &on_it.to_string()]);
    assert!(
        shown.contains(&format!("#{on_it}: built on #{write}")),
        "{shown}"
    );
    let shown = person(&data, &["show", &moving.to_string()]);
    assert!(
        shown.contains(&format!("built on #{write}"))
            && shown.contains(&format!("built on #{on_it}")),
        "{shown}"
    );
    // Rejecting the write flags, by default, what was built on it and what the agent
    // saw it in; nothing else is decided.
    let rejected = person(&data, &["reject", &write.to_string()]);
    assert!(
        rejected.contains("built on it, so flagged")
            && rejected.contains(&format!("#{on_it}, #{moving}")),
        "{rejected}"
    );
    let pending = person(&data, &["pending"]);
    for flagged in [on_it, moving, after_read] {
        assert!(pending.contains(&format!("#{flagged}")), "{pending}");
    }
    assert!(
        pending
            .matches(&format!("depends on #{write}, which was rejected"))
            .count()
            >= 3,
        "{pending}"
    );
    // The person's choice: reject the edit and what was built on it.
    let cascaded = person(&data, &["reject", &on_it.to_string(), "--cascade"]);
    assert!(
        cascaded.contains(&format!(
            "rejecting what was built on it too (--cascade): #{moving}"
        )),
        "{cascaded}"
    );
    let pending = person(&data, &["pending"]);
    assert!(
        !pending.contains(&format!("#{moving} ")) && pending.contains(&format!("#{after_read}")),
        "{pending}"
    );
    assert!(!Path::new(&plan).exists() && !Path::new(&moved).exists());

    // The memory server: an observation of an entity a pending write creates.
    let entity = stage(
        "memory__create_entities",
        json!({"entities": [{"name": "Plan", "entityType": "doc", "observations": []}]}),
    )
    .await;
    let observation = stage(
        "memory__add_observations",
        json!({"observations": [{"entityName": "Plan", "contents": ["in notes"]}]}),
    )
    .await;
    let shown = person(&data, &["show", &observation.to_string()]);
    assert!(shown.contains(&format!("built on #{entity}")), "{shown}");
    let cascaded = person(&data, &["reject", &entity.to_string(), "--cascade"]);
    assert!(
        cascaded.contains(&format!("(--cascade): #{observation}")),
        "{cascaded}"
    );
}

/// Stops the daemon when dropped, also when the test fails.
struct Stop(std::process::Child);

impl Drop for Stop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

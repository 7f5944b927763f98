//! The separated deployment with real OS users: `gate serve` runs as a user of its own,
//! people on other accounts decide through the socket when `deciders` lists them (by name
//! or by group) and are refused otherwise, the ledger names each person, and an agent's
//! user reaches the daemon through `gate mcp --token-file` with nothing but its token.
//!
//! The tests that need OS users create them (`useradd`, `groupadd`, removed again by a
//! guard, even when a test fails) and switch users with `setpriv`, so they need root, as
//! in CI's container. Elsewhere they fail, naming what they need, unless
//! `GATE_TEST_WITHOUT_OS_USERS=1` is set, and then they say loudly that they did not run.

#[path = "support/daemon.rs"]
mod daemon;
#[path = "support/fixture.rs"]
mod fixture;

use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, mpsc};

use serde_json::{Value, json};

use daemon::{CODER_TOKEN, PATIENCE, action_id, call, connect, spawn_serve_command, text};
use fixture::{fixture_binary, free_port};

/// The programs the OS-user tests run, and the packages that have them.
const TOOLS: [(&str, &str); 5] = [
    ("useradd", "passwd"),
    ("userdel", "passwd"),
    ("groupadd", "passwd"),
    ("groupdel", "passwd"),
    ("setpriv", "util-linux"),
];

/// Whether this process can create OS users and run commands as them. When it cannot,
/// the test fails saying what it needs, unless `GATE_TEST_WITHOUT_OS_USERS=1`: then it
/// says loudly that it did not run, and the caller returns.
fn os_users_available(test: &str) -> bool {
    let mut missing = Vec::new();
    if !nix::unistd::geteuid().is_root() {
        missing.push("root (to create OS users with useradd)".to_owned());
    }
    for (tool, package) in TOOLS {
        if find_program(tool).is_none() {
            missing.push(format!("`{tool}` (Debian's {package} package)"));
        }
    }
    if missing.is_empty() {
        return true;
    }
    let needs = missing.join(", and ");
    if std::env::var("GATE_TEST_WITHOUT_OS_USERS").as_deref() == Ok("1") {
        // Straight to the process's stderr: libtest would hide eprintln! of a passing test.
        let banner = format!(
            "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
             !!! {test} DID NOT RUN: it needs {needs}.\n\
             !!! GATE_TEST_WITHOUT_OS_USERS=1 is set, so it passes without checking anything.\n\
             !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
        );
        let _ = std::io::stderr().write_all(banner.as_bytes());
        return false;
    }
    panic!(
        "{test} needs {needs}: it creates OS users to check the separated deployment. Run it as root (CI's container does), or set GATE_TEST_WITHOUT_OS_USERS=1 to let it pass without running (it says so)"
    );
}

/// `program` on `PATH` (or in the sbin directories, which a non-login root may lack).
fn find_program(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

fn run(program: &str, args: &[&str]) -> Output {
    let path = find_program(program).unwrap_or_else(|| panic!("{program} is not installed"));
    Command::new(path)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} runs: {e}"))
}

/// One OS user a test created.
#[derive(Debug, Clone)]
struct OsUser {
    name: String,
    uid: u32,
    gid: u32,
}

/// useradd and userdel take a lock on the user database: one test at a time.
static USER_DATABASE: Mutex<()> = Mutex::new(());

/// The OS users and groups one test created, all removed when it is dropped (a test that
/// fails removes them too). Names are `gate-t-<pid>-<n>-<role>`, unique to the test.
struct OsUsers {
    prefix: String,
    users: Vec<String>,
    groups: Vec<String>,
    /// Every user's primary group unless the test names another.
    default_group: String,
}

impl OsUsers {
    fn new() -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let mut users = Self {
            prefix: format!(
                "gate-t-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::SeqCst)
            ),
            users: Vec::new(),
            groups: Vec::new(),
            default_group: String::new(),
        };
        users.default_group = users.group("users").0;
        users
    }

    /// Create group `<prefix>-<role>`; its name and gid.
    fn group(&mut self, role: &str) -> (String, u32) {
        let name = format!("{}-{role}", self.prefix);
        let _lock = USER_DATABASE.lock().unwrap_or_else(|e| e.into_inner());
        // A group left by an earlier process with the same pid goes first.
        let _ = run("groupdel", &[&name]);
        let out = run("groupadd", &[&name]);
        assert!(out.status.success(), "groupadd {name}: {out:?}");
        self.groups.push(name.clone());
        let gid = nix::unistd::Group::from_name(&name)
            .expect("the group database answers")
            .expect("the group exists")
            .gid
            .as_raw();
        (name, gid)
    }

    /// Create user `<prefix>-<role>`, its primary group `primary` (else the test's
    /// default), member of `supplementary` groups too.
    fn user(&mut self, role: &str, primary: Option<&str>, supplementary: &[&str]) -> OsUser {
        let name = format!("{}-{role}", self.prefix);
        let primary = primary.unwrap_or(&self.default_group).to_owned();
        let _lock = USER_DATABASE.lock().unwrap_or_else(|e| e.into_inner());
        let _ = run("userdel", &[&name]);
        let mut args = vec![
            "--no-create-home",
            "--no-user-group",
            "--shell",
            "/usr/sbin/nologin",
            "--gid",
            &primary,
        ];
        let groups = supplementary.join(",");
        if !supplementary.is_empty() {
            args.extend(["--groups", &groups]);
        }
        args.push(&name);
        let out = run("useradd", &args);
        assert!(out.status.success(), "useradd {name}: {out:?}");
        self.users.push(name.clone());
        let user = nix::unistd::User::from_name(&name)
            .expect("the user database answers")
            .expect("the user exists");
        OsUser {
            name,
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
        }
    }
}

impl Drop for OsUsers {
    fn drop(&mut self) {
        let _lock = USER_DATABASE.lock().unwrap_or_else(|e| e.into_inner());
        for user in self.users.iter().rev() {
            let out = run("userdel", &[user]);
            if !out.status.success() {
                eprintln!("could not remove test user {user}: {out:?}");
            }
        }
        for group in self.groups.iter().rev() {
            let out = run("groupdel", &[group]);
            if !out.status.success() {
                eprintln!("could not remove test group {group}: {out:?}");
            }
        }
    }
}

/// A scratch directory every user may enter (0755, root's), with the gate's binaries in
/// `bin/` (the build's target directory may be closed to other users); removed on drop.
struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn new(name: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "gate-deciders-{}-{}-{name}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let scratch = Self { dir };
        scratch.dir_owned("", None, 0o755);
        scratch.dir_owned("bin", None, 0o755);
        for (from, to) in [
            (PathBuf::from(env!("CARGO_BIN_EXE_gate")), "gate"),
            (fixture_binary(), "mcp-fixture"),
        ] {
            let to = scratch.dir.join("bin").join(to);
            std::fs::copy(&from, &to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        scratch
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.dir.join(relative)
    }

    fn gate(&self) -> PathBuf {
        self.path("bin/gate")
    }

    /// Create directory `relative` with `mode`, owned by `owner` (else root).
    fn dir_owned(&self, relative: &str, owner: Option<&OsUser>, mode: u32) -> PathBuf {
        let dir = self.path(relative);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        chown(&dir, owner);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).expect("chmod");
        dir
    }

    /// Write file `relative` with `mode`, owned by `owner` (else root).
    fn file_owned(&self, relative: &str, text: &str, owner: Option<&OsUser>, mode: u32) -> PathBuf {
        let file = self.path(relative);
        std::fs::write(&file, text).expect("written");
        chown(&file, owner);
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).expect("chmod");
        file
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn chown(path: &Path, owner: Option<&OsUser>) {
    if let Some(owner) = owner {
        std::os::unix::fs::chown(path, Some(owner.uid), Some(owner.gid)).expect("chown");
    }
}

/// `program args` as `user`: its uid, its primary group and its groups from the database.
fn as_user(user: &OsUser, program: &Path) -> Command {
    let mut command = Command::new(find_program("setpriv").expect("setpriv"));
    command
        .arg("--reuid")
        .arg(user.uid.to_string())
        .arg("--regid")
        .arg(user.gid.to_string())
        .arg("--init-groups")
        .arg(program)
        .env_remove("GATE_SOCKET")
        .env("HOME", "/nonexistent")
        .current_dir("/");
    command
}

/// A `gate serve` running as the daemon's user in a scratch deployment: configuration,
/// data directory and servers' home its own, the person's socket in a directory every
/// user may enter.
struct Deployment {
    scratch: Scratch,
    serve: Child,
    url: String,
    socket: PathBuf,
    log: PathBuf,
    config: PathBuf,
}

impl Deployment {
    /// Start the daemon as `daemon` with `top` (top-level keys such as `deciders`) in its
    /// configuration, besides the fixture server and the agent `coder`.
    fn start(name: &str, daemon: &OsUser, top: &str) -> Self {
        let scratch = Scratch::new(name);
        scratch.dir_owned("etc", Some(daemon), 0o700);
        let data = scratch.dir_owned("data", Some(daemon), 0o700);
        let home = scratch.dir_owned("home", Some(daemon), 0o700);
        scratch.dir_owned("run", Some(daemon), 0o755);
        let socket = scratch.path("run/gate.sock");
        // The fixture's log exists before its confined server starts.
        let log = scratch.file_owned("home/deliveries.log", "", Some(daemon), 0o600);
        let config = scratch.file_owned(
            "etc/gate.toml",
            &format!(
                r#"listen = "127.0.0.1:{port}"
socket = {socket:?}
{top}

[[server]]
name = "fixture"
command = {fixture:?}
env = {{ MCP_FIXTURE_LOG = {log:?} }}

[[agent]]
name = "coder"
token = "{CODER_TOKEN}"

[[agent.grant]]
server = "fixture"
"#,
                port = free_port(),
                fixture = scratch.path("bin/mcp-fixture"),
                socket = socket,
                log = log,
            ),
            Some(daemon),
            0o600,
        );
        let mut command = as_user(daemon, &scratch.gate());
        command
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .arg("--data-dir")
            .arg(&data)
            .env("HOME", &home)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped());
        let (serve, url) = spawn_serve_command(command);
        Self {
            scratch,
            serve,
            url,
            socket,
            log,
            config,
        }
    }

    /// `gate ARGS --socket SOCKET` as `user`.
    fn person(&self, user: &OsUser, args: &[&str]) -> Output {
        as_user(user, &self.scratch.gate())
            .args(args)
            .arg("--socket")
            .arg(&self.socket)
            .output()
            .expect("gate runs")
    }

    fn deliveries(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        let _ = self.serve.kill();
        let _ = self.serve.wait();
    }
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Who decided ledger entry `id`, from `gate ledger --json` run by `user`.
fn decided_by(deployment: &Deployment, user: &OsUser, id: u64) -> String {
    let out = deployment.person(user, &["ledger", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let page: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    let entry = page["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .find(|e| e["id"] == id)
        .unwrap_or_else(|| panic!("no entry {id} in {page}"));
    entry["body"]["Action"]["resolution"]["by"]
        .as_str()
        .unwrap_or_else(|| panic!("#{id} is not decided: {entry}"))
        .to_owned()
}

/// Assert that `out` is the gate's refusal of `user`, saying what to do.
fn assert_refused(out: &Output, user: &str) {
    assert!(!out.status.success(), "{user} was let in: {out:?}");
    let said = stdout(out);
    assert!(
        said.contains(&format!("the gate refused user \"{user}\"")),
        "{said}"
    );
    assert!(said.contains("add you to deciders"), "{said}");
}

#[tokio::test(flavor = "multi_thread")]
async fn only_listed_deciders_and_members_of_listed_groups_use_the_socket_and_the_ledger_names_each()
 {
    if !os_users_available(
        "only_listed_deciders_and_members_of_listed_groups_use_the_socket_and_the_ledger_names_each",
    ) {
        return;
    }
    let mut os = OsUsers::new();
    let (staff, _) = os.group("staff");
    let daemon_user = os.user("daemon", None, &[]);
    let alice = os.user("alice", None, &[]);
    let bob = os.user("bob", None, &[]);
    let carol = os.user("carol", None, &[&staff]);
    let dave = os.user("dave", Some(&staff), &[]);
    let root = OsUser {
        name: "root".into(),
        uid: 0,
        gid: 0,
    };
    let deployment = Deployment::start(
        "listed",
        &daemon_user,
        &format!("deciders = [{:?}, \"group:{staff}\"]", alice.name),
    );

    // The socket is open to every account, owned by the daemon's user; the data
    // directory stays its user's alone.
    let socket = std::fs::metadata(&deployment.socket).expect("the socket exists");
    assert_eq!(socket.permissions().mode() & 0o777, 0o666);
    assert_eq!(socket.uid(), daemon_user.uid);
    let data = std::fs::metadata(deployment.scratch.path("data")).expect("data");
    assert_eq!(data.permissions().mode() & 0o777, 0o700);

    let coder = connect(&deployment.url, CODER_TOKEN).await;
    let mut ids = Vec::new();
    for note in ["by alice", "by carol", "by dave"] {
        let staged = text(&call(&coder, "fixture__write_note", json!({"text": note})).await);
        ids.push(action_id(&staged));
    }
    let id = |i: usize| ids[i].to_string();

    // Neither a user who is not listed, nor the daemon's own user, nor root may use the
    // socket at all: not to decide, not even to list.
    for args in [vec!["pending"], vec!["approve", &id(0)], vec!["ledger"]] {
        assert_refused(&deployment.person(&bob, &args), &bob.name);
    }
    let out = deployment.person(&daemon_user, &["approve", &id(0)]);
    assert_refused(&out, &daemon_user.name);
    assert!(
        stdout(&out).contains("it runs the daemon and its servers"),
        "{out:?}"
    );
    assert_refused(&deployment.person(&root, &["pending"]), "root");
    assert!(deployment.deliveries().is_empty(), "nothing was sent");

    // A listed user, reaching the socket through GATE_SOCKET.
    let out = as_user(&alice, &deployment.scratch.gate())
        .arg("pending")
        .env("GATE_SOCKET", &deployment.socket)
        .output()
        .expect("gate runs");
    assert!(out.status.success(), "{out:?}");
    assert!(stdout(&out).contains(&format!("#{}", ids[0])), "{out:?}");
    let out = deployment.person(&alice, &["approve", &id(0)]);
    assert!(out.status.success(), "{out:?}");

    // A member of the listed group by a supplementary group, and one by its primary group.
    let out = deployment.person(&carol, &["reject", &id(1), "--reason", "not today"]);
    assert!(out.status.success(), "{out:?}");
    let out = deployment.person(&dave, &["approve", &id(2)]);
    assert!(out.status.success(), "{out:?}");

    assert_eq!(decided_by(&deployment, &alice, ids[0]), alice.name);
    assert_eq!(decided_by(&deployment, &alice, ids[1]), carol.name);
    assert_eq!(decided_by(&deployment, &dave, ids[2]), dave.name);
    let sent = deployment.deliveries();
    assert!(
        sent.contains("by alice") && sent.contains("by dave") && !sent.contains("by carol"),
        "{sent}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn without_deciders_the_socket_is_the_daemons_users_alone() {
    if !os_users_available("without_deciders_the_socket_is_the_daemons_users_alone") {
        return;
    }
    let mut os = OsUsers::new();
    let daemon_user = os.user("daemon", None, &[]);
    let alice = os.user("alice", None, &[]);
    // The socket outside the data directory, in a directory every user may enter: its
    // own mode and the daemon's check keep it the daemon's user's.
    let deployment = Deployment::start("owner", &daemon_user, "");
    let socket = std::fs::metadata(&deployment.socket).expect("the socket exists");
    assert_eq!(socket.permissions().mode() & 0o777, 0o600);

    let coder = connect(&deployment.url, CODER_TOKEN).await;
    let staged = text(&call(&coder, "fixture__write_note", json!({"text": "owner"})).await);
    let id = action_id(&staged).to_string();

    let out = deployment.person(&alice, &["approve", &id]);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        stderr(&out).contains("you may not open the gate's socket")
            && stderr(&out).contains("add you to deciders"),
        "{out:?}"
    );
    assert!(deployment.deliveries().is_empty(), "nothing was sent");

    let out = deployment.person(&daemon_user, &["approve", &id]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        decided_by(&deployment, &daemon_user, id.parse().expect("id")),
        daemon_user.name
    );
    assert!(deployment.deliveries().contains("owner"));
}

#[test]
fn check_names_a_decider_this_system_does_not_know_and_what_to_do() {
    let dir = std::env::temp_dir().join(format!("gate-deciders-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let config = dir.join("gate.toml");
    let check = |text: &str| {
        std::fs::write(&config, text).expect("written");
        std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        Command::new(env!("CARGO_BIN_EXE_gate"))
            .arg("check")
            .arg("--config")
            .arg(&config)
            .output()
            .expect("gate check runs")
    };
    let out = check("deciders = [\n  \"root\",\n  \"gate-no-such-user-anywhere\",\n]\n");
    assert!(!out.status.success(), "{out:?}");
    assert!(
        stderr(&out).contains(":3: deciders names user \"gate-no-such-user-anywhere\", which this system does not know")
            && stderr(&out).contains("useradd"),
        "{out:?}"
    );
    let out = check("deciders = [\"group:gate-no-such-group-anywhere\"]\n");
    assert!(
        stderr(&out)
            .contains("group \"gate-no-such-group-anywhere\", which this system does not know")
            && stderr(&out).contains("groupadd"),
        "{out:?}"
    );
    let out = check("deciders = []\n");
    assert!(stderr(&out).contains("lets nobody"), "{out:?}");
    let out = check("socket = \"gate.sock\"\n");
    assert!(stderr(&out).contains("is not an absolute path"), "{out:?}");
    let out = check("deciders = [\"root\"]\nsocket = \"/run/gate/gate.sock\"\n");
    assert!(out.status.success(), "{out:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_token_file_its_group_or_others_may_read_is_refused_with_the_chmod_to_run() {
    let dir = std::env::temp_dir().join(format!("gate-token-file-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch");
    let token = dir.join("coder.token");
    std::fs::write(&token, format!("{CODER_TOKEN}\n")).expect("written");
    let bridge = |mode: u32, extra: &[&str]| {
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(mode)).expect("chmod");
        Command::new(env!("CARGO_BIN_EXE_gate"))
            .args(["mcp", "--token-file"])
            .arg(&token)
            .args(extra)
            .stdin(Stdio::null())
            .output()
            .expect("gate mcp runs")
    };
    for mode in [0o640, 0o604, 0o660] {
        let out = bridge(mode, &["--endpoint", "127.0.0.1:7431"]);
        assert!(!out.status.success(), "mode {mode:o}: {out:?}");
        assert!(
            stderr(&out).contains(&format!("(mode {mode:o})"))
                && stderr(&out).contains(&format!("run `chmod 600 {}`", token.display())),
            "{out:?}"
        );
    }
    let out = bridge(0o600, &["--url", "http://example.com:7431/mcp"]);
    assert!(
        stderr(&out).contains("is neither an https:// URL nor an http:// URL on this machine"),
        "{out:?}"
    );
    std::fs::write(&token, "short\n").expect("written");
    let out = bridge(0o600, &[]);
    assert!(stderr(&out).contains("holds no token"), "{out:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The `_meta` a 2026-07-28 request carries (no handshake needed).
fn meta_2026() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "raw-lines", "version": "1.0.0"},
        "io.modelcontextprotocol/clientCapabilities": {}
    })
}

#[test]
fn an_agents_user_reaches_the_daemon_with_only_its_token_file() {
    if !os_users_available("an_agents_user_reaches_the_daemon_with_only_its_token_file") {
        return;
    }
    let mut os = OsUsers::new();
    let daemon_user = os.user("daemon", None, &[]);
    let agent_user = os.user("agent", None, &[]);
    let deployment = Deployment::start("token-file", &daemon_user, "");
    let endpoint = deployment
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();

    // The agent's user cannot read the daemon's configuration (every agent's token).
    let out = as_user(&agent_user, &deployment.scratch.gate())
        .args(["mcp", "--agent", "coder", "--config"])
        .arg(&deployment.config)
        .stdin(Stdio::null())
        .output()
        .expect("gate mcp runs");
    assert!(!out.status.success(), "{out:?}");
    assert!(
        stderr(&out).contains("cannot read the configuration"),
        "{out:?}"
    );

    // Its own token, in a file only it may read.
    deployment
        .scratch
        .dir_owned("agent", Some(&agent_user), 0o700);
    let token = deployment.scratch.file_owned(
        "agent/coder.token",
        &format!("{CODER_TOKEN}\n"),
        Some(&agent_user),
        0o600,
    );
    let mut bridge = as_user(&agent_user, &deployment.scratch.gate())
        .args(["mcp", "--token-file"])
        .arg(&token)
        .args(["--endpoint", &endpoint])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("gate mcp starts");
    let (lines, received) = mpsc::channel();
    let out = bridge.stdout.take().expect("piped");
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let mut stdin = bridge.stdin.take().expect("piped");
    let request = json!({
        "jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "fixture__write_note", "arguments": {"text": "through a token file"}, "_meta": meta_2026()}
    });
    writeln!(stdin, "{request}").expect("the bridge reads");
    stdin.flush().expect("flushed");
    let answer: Value = loop {
        let line = received
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|e| panic!("the bridge answered nothing within {PATIENCE:?} ({e})"));
        let message: Value = serde_json::from_str(&line).expect("JSON");
        if message["id"] == 7 {
            break message;
        }
    };
    let said = answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no result: {answer}"));
    assert!(said.contains("Staged as action"), "{answer}");
    drop(stdin);
    let _ = bridge.wait();

    // The staged write is the agent's, and the person decides it.
    let id = action_id(said).to_string();
    let out = deployment.person(&daemon_user, &["show", &id]);
    assert!(
        out.status.success() && stdout(&out).contains("«coder»"),
        "{out:?}"
    );
}

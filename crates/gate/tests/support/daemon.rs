//! A `gate serve` process for the integration tests: a configuration with the fixture MCP
//! server and two agents, the agents' MCP client, and the person's `gate` commands.
//! Included with `#[path]` by each test file that starts a daemon (so some of it goes
//! unused in one file or another).

#![allow(dead_code)]

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{Peer, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value;

use crate::fixture::{fixture_binary, free_port};

pub const CODER_TOKEN: &str = "coder-token-0123456789abcdef";
pub const IDLE_TOKEN: &str = "idle-token-0123456789abcdef0";

/// Start `gate serve` and read the agents' URL from its first line.
pub fn spawn_serve(config: &Path, data: &Path) -> (Child, String) {
    spawn_serve_with(config, data, &[])
}

/// A number in process `pid`'s `/proc/PID/status`: `"VmRSS"` (KiB), `"Threads"`.
pub fn proc_status(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("/proc/PID/status is readable");
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

pub fn spawn_serve_with(config: &Path, data: &Path, env: &[(&str, &str)]) -> (Child, String) {
    let mut command = serve_command(config, data);
    command.envs(env.iter().copied());
    spawn_serve_command(command)
}

/// `gate serve --config CONFIG --data-dir DATA`, logging warnings, its output piped.
pub fn serve_command(config: &Path, data: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gate"));
    command
        .arg("serve")
        .arg("--config")
        .arg(config)
        .arg("--data-dir")
        .arg(data)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped());
    command
}

/// Spawn a `gate serve` command and read the agents' URL from its first line.
pub fn spawn_serve_command(mut command: Command) -> (Child, String) {
    let mut child = command.spawn().expect("gate serve starts");
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut first)
        .expect("gate serve prints its address");
    let url = first
        .trim()
        .strip_prefix("gate: agents at ")
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .to_owned();
    (child, url)
}

/// An agent connected to the daemon at `url` with `token`, over MCP streamable HTTP.
pub async fn connect(url: &str, token: &str) -> RunningService<RoleClient, ()> {
    let transport = StreamableHttpClientTransport::with_client(
        gatekeeper_mcp::tls::client(None).expect("an HTTP client"),
        StreamableHttpClientTransportConfig::with_uri(url.to_owned()).auth_header(token),
    );
    ().serve(transport).await.expect("the agent connects")
}

/// The calls the fixture servers logged in `log`, one line each, in order.
pub fn read_deliveries(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .map(|t| t.lines().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// Write `text` to `path` and give it `mode` (0600 for a file holding tokens, 0755 for a
/// script).
pub fn write_with_mode(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).expect("written");
    std::fs::set_permissions(
        path,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(mode),
    )
    .expect("chmod");
}

/// The user running these tests, as the daemon names the person behind its socket.
pub fn me() -> String {
    gate::person::user_name(nix::unistd::getuid().as_raw())
}

pub struct Gate {
    pub child: Child,
    pub config: PathBuf,
    pub dir: PathBuf,
    pub url: String,
    pub log: PathBuf,
}

impl Gate {
    pub fn start(name: &str) -> Self {
        Self::start_with(name, "byo")
    }

    pub fn start_with(name: &str, trust: &str) -> Self {
        Self::start_with_env(name, trust, &[])
    }

    /// A daemon whose fixture server runs with these environment variables as well.
    pub fn start_with_env(name: &str, trust: &str, fixture_env: &[(&str, &str)]) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "gate-serve-{}-{}-{name}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        let log = dir.join("deliveries.log");
        // The fixture's log exists before the daemon starts its confined server: a file
        // made later beside the configuration would be out of that server's reach.
        std::fs::write(&log, "").expect("the fixture's log");
        let config = dir.join("gate.toml");
        std::fs::write(
            &config,
            format!(
                r#"listen = "127.0.0.1:{port}"

[[server]]
name = "fixture"
command = {fixture:?}
env = {{ MCP_FIXTURE_LOG = {log:?}{extra} }}
trust = "{trust}"

[[agent]]
name = "coder"
token = "{CODER_TOKEN}"

[[agent.grant]]
server = "fixture"

[[agent]]
name = "idle"
token = "{IDLE_TOKEN}"
"#,
                port = free_port(),
                fixture = fixture_binary().to_string_lossy(),
                log = log.to_string_lossy(),
                extra = fixture_env
                    .iter()
                    .map(|(key, value)| format!(", {key} = {value:?}"))
                    .collect::<String>(),
            ),
        )
        .expect("config written");
        // It holds tokens: the daemon warns of a file others may read.
        std::fs::set_permissions(
            &config,
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600),
        )
        .expect("config made private");
        let (child, url) = spawn_serve(&config, &dir.join("data"));
        Self {
            child,
            config,
            dir,
            url,
            log,
        }
    }

    /// Stop the daemon and start it again on the same configuration and data, logging at
    /// `level` to a file, whose path is returned.
    pub fn restart_logging(&mut self, level: &str) -> PathBuf {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaped");
        let log = self.dir.join("serve.log");
        let file = std::fs::File::create(&log).expect("log file");
        let mut command = serve_command(&self.config, &self.dir.join("data"));
        command.env("RUST_LOG", level).stderr(Stdio::from(file));
        let (child, url) = spawn_serve_command(command);
        self.child = child;
        self.url = url;
        log
    }

    /// SIGKILL the daemon (no cleanup of any kind), then start it again on the same
    /// configuration and data.
    pub fn kill_and_restart(&mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaped");
        let (child, url) = spawn_serve(&self.config, &self.dir.join("data"));
        self.child = child;
        self.url = url;
    }

    pub async fn agent(&self, token: &str) -> RunningService<RoleClient, ()> {
        connect(&self.url, token).await
    }

    /// Run a person's command against this daemon.
    pub fn person(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_gate"))
            .args(args)
            .arg("--data-dir")
            .arg(self.dir.join("data"))
            .output()
            .expect("gate runs")
    }

    pub fn deliveries(&self) -> Vec<String> {
        read_deliveries(&self.log)
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub async fn call(agent: &Peer<RoleClient>, tool: &str, args: Value) -> CallToolResult {
    let Value::Object(args) = args else {
        panic!("arguments are an object")
    };
    agent
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(args))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
}

/// Every text block of an answer, one per line, as the gate reads them.
pub fn text(result: &CallToolResult) -> String {
    gate::gateway::text_of(result)
}

/// The action id in a staged answer.
pub fn action_id(answer: &str) -> u64 {
    let rest = answer
        .split("action ")
        .nth(1)
        .unwrap_or_else(|| panic!("no action id in {answer:?}"));
    rest.chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .expect("a number")
}

impl Gate {
    /// Rewrite the configuration with `edit` and restart the daemon on it.
    pub fn reconfigure(&mut self, edit: impl FnOnce(String) -> String) {
        let text = std::fs::read_to_string(&self.config).expect("config");
        std::fs::write(&self.config, edit(text)).expect("config written");
        self.kill_and_restart();
    }

    /// Start a second daemon on this configuration edited by `edit` (on a port of its own
    /// and another data directory), expect it to refuse to start, and return what it said.
    pub fn refused_start(&self, edit: impl FnOnce(String) -> String) -> String {
        let text = std::fs::read_to_string(&self.config).expect("config");
        let bad = self.dir.join("bad.toml");
        let own_port = self.url.replace("http://", "").replace("/mcp", "");
        std::fs::write(&bad, edit(text).replace(&own_port, "127.0.0.1:0")).expect("written");
        let out = Command::new(env!("CARGO_BIN_EXE_gate"))
            .arg("serve")
            .arg("--config")
            .arg(&bad)
            .arg("--data-dir")
            .arg(self.dir.join("other-data"))
            .env("RUST_LOG", "off")
            .output()
            .expect("runs");
        assert!(
            !out.status.success(),
            "the daemon started on the edited configuration"
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

/// How long a test waits for something the daemon does on its own; a bound on a failing
/// test, never a measurement.
pub const PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// Wait, at most [`PATIENCE`], until `ready` holds.
pub async fn eventually(what: &str, mut ready: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !ready() {
        assert!(start.elapsed() < PATIENCE, "{what} never happened");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Call `tool` as `agent` until its answer satisfies `done` (at most [`PATIENCE`]), and
/// return that answer; the last answer is shown if it never does.
pub async fn answer_until(
    what: &str,
    agent: &Peer<RoleClient>,
    tool: &str,
    args: Value,
    done: impl Fn(&str) -> bool,
) -> String {
    let start = std::time::Instant::now();
    loop {
        let answer = text(&call(agent, tool, args.clone()).await);
        if done(&answer) {
            return answer;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "{what} never happened: {answer}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

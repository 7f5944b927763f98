//! The driver against a real MCP server process (the `mcp-fixture` binary of this crate):
//! reads pass, writes wait for a person, and nothing reaches the server twice.
//!
//! Deliveries are counted from the fixture's own log file, written by the server process
//! before each write acts, never from what the gateway believes.
//!
//! The deadline tests run on real time with short deadlines: tokio's paused clock would
//! jump past every deadline whenever the runtime waits for the child's output.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use gatekeeper_core::{
    ActionResult, ActionState, ActionStore, CallOutcome, Session, ToolGatekeeper,
};
use gatekeeper_mcp::{Endpoint, HttpEndpoint, McpServer, McpServerConfig, StdioCommand};
use kernel::{Clock, DriverActionId, LedgerId, Overseer, StepClock};
use serde_json::{Value, json};

/// A deadline no ordinary call comes near on a loaded machine.
const RELAXED: Duration = Duration::from_secs(30);

struct World {
    overseer: Overseer,
    server: Arc<McpServer>,
    gatekeeper: Arc<ToolGatekeeper>,
    session: Session,
    log: PathBuf,
}

fn log_path(name: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let path = std::env::temp_dir().join(format!(
        "gatekeeper-mcp-{}-{}-{name}.log",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_file(&path);
    path
}

async fn world(name: &str, deadline: Duration) -> World {
    let log = log_path(name);
    let command = StdioCommand::new(env!("CARGO_BIN_EXE_mcp-fixture"))
        .env("MCP_FIXTURE_LOG", log.to_string_lossy());
    world_over(command, log, deadline).await
}

async fn world_over(endpoint: impl Into<Endpoint>, log: PathBuf, deadline: Duration) -> World {
    let server = McpServer::connect(McpServerConfig::new("fixture", endpoint).deadline(deadline))
        .await
        .expect("the fixture starts");
    let clock: Arc<dyn Clock> = Arc::new(StepClock::default());
    let overseer = Overseer::new(clock.clone());
    let gatekeeper = Arc::new(server.gatekeeper(ActionStore::in_memory(clock)));
    overseer.register(gatekeeper.clone()).expect("registers");
    let session = gatekeeper
        .grant_all(&overseer, "agent")
        .expect("grant")
        .into_session();
    World {
        overseer,
        server,
        gatekeeper,
        session,
        log,
    }
}

impl World {
    /// The digest of a fixture tool's definition, as the catalog was last read.
    fn digest(&self, tool: &str) -> String {
        self.server
            .catalog()
            .get(tool)
            .unwrap_or_else(|| panic!("the fixture lists {tool}"))
            .digest
            .clone()
    }

    async fn call(&self, tool: &str, args: Value) -> CallOutcome {
        self.session
            .call_tool(tool, args)
            .await
            .unwrap_or_else(|e| panic!("{tool}: {e}"))
    }

    async fn stage(&self, tool: &str, args: Value) -> (DriverActionId, LedgerId) {
        match self.call(tool, args).await {
            CallOutcome::Pending { action, ledger, .. } => (action, ledger),
            CallOutcome::Data { .. } => panic!("{tool} must be staged, not run"),
        }
    }

    /// What reached the server, one line per write call, from the server's own log.
    fn deliveries(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .map(|text| text.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    async fn result(&self, action: DriverActionId) -> ActionResult {
        self.session
            .get_action_result(action)
            .await
            .expect("the action is visible")
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.log);
    }
}

#[tokio::test]
async fn a_read_passes_and_is_recorded_as_an_observation() {
    let w = world("read", RELAXED).await;
    let CallOutcome::Data {
        result,
        observation,
    } = w.call("read_notes", json!({})).await
    else {
        panic!("read_notes is a read");
    };
    assert!(!result.is_error);
    let entry = w
        .overseer
        .entry(observation)
        .expect("ledger readable")
        .expect("the observation is in the ledger");
    assert!(entry.action().is_none(), "an observation, not an action");
    assert!(w.deliveries().is_empty());
}

#[tokio::test]
async fn a_write_is_pending_and_not_delivered() {
    let w = world("pending", RELAXED).await;
    let (action, _) = w.stage("write_note", json!({"text": "hi"})).await;
    assert_eq!(w.result(action).await.status(), "pending");
    assert_eq!(w.overseer.open_actions().expect("ledger").len(), 1);
    assert!(w.deliveries().is_empty(), "nothing is sent before approval");
}

#[tokio::test]
async fn approve_delivers_exactly_once() {
    let w = world("approve", RELAXED).await;
    let (action, ledger) = w.stage("write_note", json!({"text": "hi"})).await;
    w.overseer.approve(ledger, "alice").await.expect("applies");
    let ActionResult::Applied { result, .. } = w.result(action).await else {
        panic!("applied");
    };
    assert_eq!(result.text(), "wrote \"hi\"");
    assert!(w.overseer.approve(ledger, "alice").await.is_err());
    assert_eq!(w.deliveries(), [r#"write_note {"text":"hi"}"#]);
    let CallOutcome::Data { result, .. } = w.call("read_notes", json!({})).await else {
        panic!("read");
    };
    assert_eq!(result.text(), "hi");
}

#[tokio::test]
async fn reject_delivers_nothing() {
    let w = world("reject", RELAXED).await;
    let (action, ledger) = w.stage("write_note", json!({"text": "no"})).await;
    w.overseer.reject(ledger, "alice").await.expect("rejects");
    assert_eq!(w.result(action).await.status(), "rejected");
    assert!(w.overseer.approve(ledger, "alice").await.is_err());
    assert!(w.deliveries().is_empty());
}

#[tokio::test]
async fn a_tool_error_is_recorded_as_the_services_answer() {
    let w = world("tool-error", RELAXED).await;
    let (action, ledger) = w.stage("fail_write", json!({})).await;
    w.overseer
        .approve(ledger, "alice")
        .await
        .expect("a tool error is an answer, not a failed send");
    let ActionResult::Applied { result, .. } = w.result(action).await else {
        panic!("applied with the service's answer");
    };
    assert!(result.is_error);
    assert_eq!(result.text(), "disk full");
    assert_eq!(w.deliveries(), ["fail_write {}"]);
}

#[tokio::test]
async fn a_hung_tool_ends_as_outcome_unknown_at_the_deadline_and_is_never_resent() {
    // Short, but long enough for the handshake and the catalog read on a loaded machine.
    let w = world("hang", Duration::from_secs(2)).await;
    let (action, ledger) = w.stage("hang", json!({})).await;
    let overseer = w.overseer.clone();
    let approval = tokio::spawn(async move { overseer.approve(ledger, "alice").await });
    // The claim is stored before the request leaves: once the server has it, the record
    // already says `applying`.
    for waited in 0.. {
        if !w.deliveries().is_empty() {
            break;
        }
        assert!(waited < 3000, "the server never received the call");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let record = w.gatekeeper.store().get(action).await.expect("store");
    assert_eq!(record.expect("kept").state, ActionState::Applying);

    assert!(approval.await.expect("joins").is_err(), "the apply fails");
    let ActionResult::Failed { retryable, .. } = w.result(action).await else {
        panic!("failed");
    };
    assert!(
        !retryable,
        "the server had the call: its outcome is unknown"
    );
    assert!(w.overseer.approve(ledger, "alice").await.is_err());
    assert_eq!(w.deliveries(), ["hang {}"], "never sent twice");
}

#[tokio::test]
async fn a_server_that_crashes_after_the_send_is_outcome_unknown_and_restarted_later() {
    let w = world("crash", RELAXED).await;
    let (crash, ledger) = w.stage("crash", json!({})).await;
    assert!(w.overseer.approve(ledger, "alice").await.is_err());
    let ActionResult::Failed { retryable, .. } = w.result(crash).await else {
        panic!("failed");
    };
    assert!(!retryable, "the server had the call when it died");
    assert!(w.overseer.approve(ledger, "alice").await.is_err());

    // The next use starts the server again; the crashed call is not replayed.
    let (write, ledger) = w.stage("write_note", json!({"text": "after"})).await;
    w.overseer.approve(ledger, "alice").await.expect("applies");
    assert_eq!(w.result(write).await.status(), "applied");
    assert_eq!(
        w.deliveries(),
        ["crash {}", r#"write_note {"text":"after"}"#]
    );
}

#[tokio::test]
async fn a_changed_tool_refuses_a_stale_approval() {
    let w = world("changed", RELAXED).await;
    let (action, ledger) = w.stage("write_note", json!({"text": "to all"})).await;
    let before = w.digest("write_note");
    let CallOutcome::Data { result, .. } = w.call("change_catalog", json!({})).await else {
        panic!("change_catalog is declared read-only");
    };
    assert_eq!(result.text(), "catalog changed");

    assert!(w.overseer.approve(ledger, "alice").await.is_err());
    let ActionResult::Failed { retryable, message } = w.result(action).await else {
        panic!("failed");
    };
    assert!(
        !retryable,
        "nothing was sent, and approving it again could never send it: closed for good"
    );
    assert!(
        message.contains("changed the tool \"write_note\" after this call was made")
            && message.contains("never will be"),
        "{message}"
    );
    assert_ne!(w.digest("write_note"), before, "the catalog was read again");
    assert!(w.deliveries().is_empty());

    // A person accepts the new catalog: the stale call is still refused, a new call of
    // the new definition is sent, and the tool the new catalog adds is callable.
    w.gatekeeper
        .replace_tools(w.server.catalog().gatekeeper_tools());
    assert!(w.overseer.approve(ledger, "alice").await.is_err());
    assert!(w.deliveries().is_empty(), "the stale call is never sent");
    let (_, fresh) = w.stage("write_note", json!({"text": "after"})).await;
    w.overseer.approve(fresh, "alice").await.expect("applies");
    assert_eq!(w.deliveries().len(), 1);
    assert!(w.deliveries()[0].contains("after"), "{:?}", w.deliveries());
    let regranted = w
        .gatekeeper
        .grant_all(&w.overseer, "agent")
        .expect("grant")
        .into_session();
    let CallOutcome::Pending { ledger: added, .. } = regranted
        .call_tool("archive_note", json!({"text": "old"}))
        .await
        .expect("stages")
    else {
        panic!("archive_note is a write");
    };
    w.overseer.approve(added, "alice").await.expect("applies");
    assert_eq!(w.deliveries().len(), 2);
    // Closed for good: there is nothing left to reject.
    assert!(w.overseer.reject(ledger, "alice").await.is_err());
}

#[tokio::test]
async fn a_non_boolean_hint_neither_hides_the_server_nor_makes_a_read() {
    let w = world("odd-hint", RELAXED).await;
    let names: Vec<String> = w
        .server
        .catalog()
        .tools()
        .iter()
        .map(|t| t.name.clone())
        .collect();
    assert_eq!(
        names,
        [
            "read_notes",
            "write_note",
            "tag_note",
            "odd_hint",
            "fail_write",
            "hang",
            "crash",
            "change_catalog"
        ]
    );
    let (_, _) = w.stage("odd_hint", json!({"text": "x"})).await;
    assert!(w.deliveries().is_empty());
}

#[tokio::test]
async fn a_server_that_cannot_start_is_refused_with_its_command() {
    let error = McpServer::connect(McpServerConfig::new(
        "missing",
        StdioCommand::new("/nonexistent/mcp-server"),
    ))
    .await
    .expect_err("no such program");
    let message = error.to_string();
    assert!(message.contains("\"/nonexistent/mcp-server\""), "{message}");
    assert!(message.contains("check the command"), "{message}");
}

#[tokio::test]
async fn a_server_that_keeps_failing_to_start_is_not_started_again_before_its_backoff() {
    let attempts = log_path("backoff-attempts");
    let broken = log_path("backoff-broken");
    let log = log_path("backoff");
    let command = StdioCommand::new("sh")
        .args([
            "-c",
            r#"echo start >> "$ATTEMPTS"; if [ -e "$BROKEN" ]; then exit 1; fi; exec "$FIXTURE""#,
        ])
        .env("ATTEMPTS", attempts.to_string_lossy())
        .env("BROKEN", broken.to_string_lossy())
        .env("FIXTURE", env!("CARGO_BIN_EXE_mcp-fixture"))
        .env("MCP_FIXTURE_LOG", log.to_string_lossy());
    let w = world_over(command, log, RELAXED).await;
    let starts = || std::fs::read_to_string(&attempts).map_or(0, |t| t.lines().count());
    assert_eq!(starts(), 1);

    let (_, ledger) = w.stage("crash", json!({})).await;
    assert!(w.overseer.approve(ledger, "alice").await.is_err());
    std::fs::write(&broken, "").expect("the server's command breaks");
    let read = |w: &World| {
        let session = w.session.clone();
        async move { session.call_tool("read_notes", json!({})).await }
    };
    assert!(read(&w).await.is_err(), "the restart fails");
    assert_eq!(starts(), 2);
    let error = read(&w).await.expect_err("still within the backoff");
    assert!(error.to_string().contains("not tried again"), "{error}");
    assert_eq!(starts(), 2, "no start was tried within the backoff");

    std::fs::remove_file(&broken).expect("the command is mended");
    tokio::time::sleep(gatekeeper_mcp::FIRST_BACKOFF).await;
    assert!(read(&w).await.is_ok(), "started again after the backoff");
    assert_eq!(starts(), 3);
    let _ = std::fs::remove_file(&attempts);
}

/// The fixture serving MCP streamable HTTP as a child process, killed on drop.
struct HttpFixture {
    child: std::process::Child,
    url: String,
}

impl HttpFixture {
    fn start(log: &std::path::Path, token: &str) -> Self {
        use std::io::BufRead as _;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mcp-fixture"))
            .env("MCP_FIXTURE_HTTP", "127.0.0.1:0")
            .env("MCP_FIXTURE_TOKEN", token)
            .env("MCP_FIXTURE_LOG", log)
            .env("RUST_LOG", "off")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("the fixture starts");
        let mut url = String::new();
        std::io::BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut url)
            .expect("the fixture prints its URL");
        Self {
            child,
            url: url.trim().to_owned(),
        }
    }

    fn endpoint(&self, token: &str) -> HttpEndpoint {
        HttpEndpoint {
            url: self.url.clone(),
            headers: vec![("Authorization".to_owned(), format!("Bearer {token}"))],
            ca_file: None,
            oauth: None,
        }
    }
}

impl Drop for HttpFixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn over_http_a_write_waits_and_approve_delivers_it_once_with_the_configured_headers() {
    let log = log_path("http");
    let fixture = HttpFixture::start(&log, "http-token-0123");
    let w = world_over(fixture.endpoint("http-token-0123"), log, RELAXED).await;
    let (action, ledger) = w.stage("write_note", json!({"text": "over http"})).await;
    assert!(w.deliveries().is_empty(), "nothing is sent before approval");
    w.overseer.approve(ledger, "alice").await.expect("applies");
    assert_eq!(w.result(action).await.status(), "applied");
    assert_eq!(w.deliveries(), [r#"write_note {"text":"over http"}"#]);
    let CallOutcome::Data { result, .. } = w.call("read_notes", json!({})).await else {
        panic!("read");
    };
    assert_eq!(result.text(), "over http");
}

#[tokio::test]
async fn over_http_refused_credentials_stop_the_connection_with_what_to_check() {
    let log = log_path("http-refused");
    let fixture = HttpFixture::start(&log, "http-token-0123");
    let error = McpServer::connect(McpServerConfig::new(
        "fixture",
        fixture.endpoint("another-token"),
    ))
    .await
    .expect_err("refused");
    let message = error.to_string();
    assert!(message.contains("credentials"), "{message}");
    assert!(
        !message.contains("another-token"),
        "a secret never reaches a message: {message}"
    );
}

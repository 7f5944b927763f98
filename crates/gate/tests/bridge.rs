//! `gate mcp`, the stdio bridge, as a real process in front of a real daemon (`gate serve`
//! with gatekeeper-mcp's `mcp-fixture`), driven with raw JSON-RPC lines and no typed
//! client, on both protocol versions: 2025-11-25 (the `initialize` handshake and a session)
//! and 2026-07-28 (no handshake; each request names its version in `_meta`).
//!
//! Every read of the bridge's stdout is bounded by [`PATIENCE`]: a bridge that stays silent
//! fails the test instead of hanging the suite.

#[path = "support/daemon.rs"]
mod daemon;
#[path = "support/fixture.rs"]
mod fixture;

use std::collections::HashMap;
use std::io::{BufRead as _, BufReader, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Instant;

use serde_json::{Value, json};

use daemon::{CODER_TOKEN, Gate, PATIENCE, action_id};
use fixture::free_port;

/// The `_meta` every 2026-07-28 request carries: its version, who asks, and what the
/// client can do (rmcp's `RequestMetaObject::missing_required_keys` requires the version
/// and the capabilities; the client's identity is sent as a client would).
fn meta_2026() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "raw-lines", "version": "1.0.0"},
        "io.modelcontextprotocol/clientCapabilities": {}
    })
}

fn request(id: impl Into<Value>, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id.into(), "method": method, "params": params})
}

fn initialize_2025(id: u64) -> Value {
    request(
        id,
        "initialize",
        json!({
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "raw-lines", "version": "1.0.0"}
        }),
    )
}

fn read_call(id: impl Into<Value>, meta: Option<Value>) -> Value {
    let mut params = json!({"name": "fixture__read_notes", "arguments": {}});
    if let Some(meta) = meta {
        params["_meta"] = meta;
    }
    request(id, "tools/call", params)
}

fn write_call(id: impl Into<Value>, text: &str, meta: Option<Value>) -> Value {
    let mut params = json!({"name": "fixture__write_note", "arguments": {"text": text}});
    if let Some(meta) = meta {
        params["_meta"] = meta;
    }
    request(id, "tools/call", params)
}

/// The text of a tool result's content.
fn result_text(answer: &Value) -> String {
    answer["result"]["content"]
        .as_array()
        .unwrap_or_else(|| panic!("no content in {answer}"))
        .iter()
        .filter_map(|block| block["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// A running `gate mcp --agent coder`, its stdout read line by line on a thread.
struct Bridge {
    child: Child,
    stdin: Option<Box<dyn Write + Send>>,
    lines: mpsc::Receiver<String>,
}

impl Bridge {
    /// The bridge on pipes, as most clients start their servers.
    fn start(config: &Path) -> Self {
        let mut child = Self::command(config)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("gate mcp starts");
        let stdout = child.stdout.take().expect("piped");
        let stdin = child.stdin.take().expect("piped");
        Self::reading(child, Box::new(stdin), stdout)
    }

    /// The bridge with a socket for stdin and one for stdout, as Node's child processes
    /// get theirs.
    fn start_on_sockets(config: &Path) -> Self {
        let (stdin, theirs_in) = UnixStream::pair().expect("a socket pair");
        let (stdout, theirs_out) = UnixStream::pair().expect("a socket pair");
        let child = Self::command(config)
            .stdin(Stdio::from(OwnedFd::from(theirs_in)))
            .stdout(Stdio::from(OwnedFd::from(theirs_out)))
            .spawn()
            .expect("gate mcp starts");
        Self::reading(child, Box::new(stdin), stdout)
    }

    fn command(config: &Path) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_gate"));
        command
            .args(["mcp", "--agent", "coder", "--config"])
            .arg(config)
            .env("RUST_LOG", "warn");
        command
    }

    /// `child` with its stdout read line by line on a thread.
    fn reading(
        child: Child,
        stdin: Box<dyn Write + Send>,
        stdout: impl Read + Send + 'static,
    ) -> Self {
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        Self {
            stdin: Some(stdin),
            child,
            lines,
        }
    }

    fn send_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin is open");
        writeln!(stdin, "{line}").expect("the bridge reads its stdin");
        stdin.flush().expect("flushed");
    }

    fn send(&mut self, message: &Value) {
        self.send_line(&message.to_string());
    }

    /// The next line the bridge prints, as JSON; at most [`PATIENCE`].
    fn next(&self) -> Value {
        let line = self
            .lines
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|e| panic!("the bridge printed nothing within {PATIENCE:?} ({e})"));
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    }

    /// The response to request `id`, skipping what the daemon sends besides; at most
    /// [`PATIENCE`] in all.
    fn answer(&self, id: impl Into<Value>) -> Value {
        let id = id.into();
        let start = Instant::now();
        loop {
            let message = self.next();
            if message.get("id") == Some(&id)
                && (message.get("result").is_some() || message.get("error").is_some())
            {
                return message;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "no answer to {id} within {PATIENCE:?}"
            );
        }
    }

    /// The next notification `method` the bridge prints, skipping others; at most
    /// [`PATIENCE`] in all.
    fn notification(&self, method: &str) -> Value {
        let start = Instant::now();
        loop {
            let message = self.next();
            if message["method"] == method && message.get("id").is_none() {
                return message;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "no {method} within {PATIENCE:?}"
            );
        }
    }

    /// Send request `message` and return its response.
    fn ask(&mut self, message: &Value) -> Value {
        self.send(message);
        self.answer(message["id"].clone())
    }

    /// How many threads the bridge's process runs (`/proc/PID/status`).
    fn threads(&self) -> u64 {
        daemon::proc_status(self.child.id(), "Threads")
    }

    /// Close stdin and wait (at most [`PATIENCE`]) for the bridge to exit.
    fn close(mut self) -> ExitStatus {
        drop(self.stdin.take());
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("waits") {
                return status;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "the bridge did not exit after its stdin closed"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A configuration whose daemon does not run: a free port, the agent `coder`.
struct Unserved {
    dir: PathBuf,
    config: PathBuf,
}

impl Unserved {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("gate-bridge-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        let config = dir.join("gate.toml");
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:{}\"\n\n[[agent]]\nname = \"coder\"\ntoken = \"{CODER_TOKEN}\"\n",
                free_port()
            ),
        )
        .expect("config written");
        Self { dir, config }
    }
}

impl Drop for Unserved {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn a_client_on_2025_11_25_initializes_lists_reads_and_stages_through_the_bridge() {
    let gate = Gate::start("bridge-2025");
    let mut bridge = Bridge::start(&gate.config);

    let init = bridge.ask(&initialize_2025(1));
    assert_eq!(init["result"]["protocolVersion"], "2025-11-25", "{init}");
    assert!(
        init["result"]["capabilities"]["tools"].is_object(),
        "{init}"
    );
    bridge.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));

    let list = bridge.ask(&request(2, "tools/list", json!({})));
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools in {list}"))
        .iter()
        .filter_map(|tool| tool["name"].as_str())
        .collect();
    for expected in ["fixture__read_notes", "fixture__write_note", "gate_pending"] {
        assert!(names.contains(&expected), "{expected} in {names:?}");
    }

    let read = bridge.ask(&read_call(3, None));
    assert_eq!(result_text(&read), "", "no note yet: {read}");
    assert_ne!(read["result"]["isError"], true, "{read}");

    let staged = bridge.ask(&write_call(4, "hi", None));
    let text = result_text(&staged);
    assert!(text.starts_with("Staged as action "), "{staged}");
    let id = action_id(&text);
    assert!(gate.deliveries().is_empty(), "nothing sent before approval");

    // The daemon tells of the decision outside any request: on the session's own stream.
    let uri = format!("gate://action/{id}");
    let subscribed = bridge.ask(&request(6, "resources/subscribe", json!({"uri": uri})));
    assert!(subscribed.get("error").is_none(), "{subscribed}");
    let approve = gate.person(&["approve", &id.to_string()]);
    assert!(approve.status.success(), "{approve:?}");
    let updated = bridge.notification("notifications/resources/updated");
    assert_eq!(updated["params"]["uri"], uri, "{updated}");

    let read = bridge.ask(&read_call(5, None));
    assert_eq!(result_text(&read), "hi", "the approved note: {read}");
    // Pipes are polled on the runtime's one thread, as sockets are.
    assert_eq!(bridge.threads(), 1, "the bridge relays on one thread");

    for answer in [&init, &list, &staged, &read] {
        assert!(
            answer["result"].get("resultType").is_none(),
            "a 2025 result has no resultType: {answer}"
        );
    }
    assert!(bridge.close().success(), "the bridge exits 0 on EOF");
}

#[test]
fn a_client_that_gives_the_bridge_sockets_for_stdin_and_stdout_reads_and_stages() {
    let gate = Gate::start("bridge-sockets");
    let mut bridge = Bridge::start_on_sockets(&gate.config);

    let init = bridge.ask(&initialize_2025(1));
    assert_eq!(init["result"]["protocolVersion"], "2025-11-25", "{init}");
    bridge.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    // Two requests in flight at once, each answered with its own id, in either order.
    bridge.send(&read_call(2, None));
    bridge.send(&write_call(3, "over a socket", None));
    let mut answers = HashMap::new();
    while answers.len() < 2 {
        let message = bridge.next();
        if let Some(id) = message.get("id").and_then(Value::as_u64) {
            answers.insert(id, message);
        }
    }
    let read = &answers[&2];
    assert_eq!(result_text(read), "", "no note yet: {read}");
    let staged = &answers[&3];
    assert!(
        result_text(staged).starts_with("Staged as action "),
        "{staged}"
    );
    assert!(gate.deliveries().is_empty(), "nothing sent before approval");
    // Sockets are polled on the runtime's one thread: no thread of its own blocks on
    // stdin or stdout (tokio's own stdin and stdout would add one).
    assert_eq!(bridge.threads(), 1, "the bridge relays on one thread");
    assert!(bridge.close().success(), "the bridge exits 0 on EOF");
}

#[test]
fn a_client_on_2026_07_28_gets_every_result_with_its_result_type_through_the_bridge() {
    let gate = Gate::start("bridge-2026");
    let mut bridge = Bridge::start(&gate.config);

    let discover = bridge.ask(&request(
        "discover",
        "server/discover",
        json!({"_meta": meta_2026()}),
    ));
    assert!(discover.get("error").is_none(), "{discover}");
    let list = bridge.ask(&request(
        "list",
        "tools/list",
        json!({"_meta": meta_2026()}),
    ));
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools in {list}"))
        .iter()
        .filter_map(|tool| tool["name"].as_str())
        .collect();
    assert!(names.contains(&"fixture__read_notes"), "{names:?}");
    let read = bridge.ask(&read_call("read", Some(meta_2026())));
    assert_eq!(result_text(&read), "", "no note yet: {read}");
    let staged = bridge.ask(&write_call("write", "hello", Some(meta_2026())));
    let text = result_text(&staged);
    assert!(text.starts_with("Staged as action "), "{staged}");

    // A listen runs as long as the client wants it; other requests are answered meanwhile,
    // and what it carries reaches the client while it runs.
    let uri = format!("gate://action/{}", action_id(&text));
    bridge.send(&request(
        "listen",
        "subscriptions/listen",
        json!({"_meta": meta_2026(), "notifications": {"resourceSubscriptions": [uri]}}),
    ));
    let during = bridge.ask(&request(
        "during",
        "tools/list",
        json!({"_meta": meta_2026()}),
    ));
    assert_eq!(during["result"], list["result"], "{during}");
    let approve = gate.person(&["approve", &action_id(&text).to_string()]);
    assert!(approve.status.success(), "{approve:?}");
    let updated = bridge.notification("notifications/resources/updated");
    assert_eq!(updated["params"]["uri"], uri, "{updated}");

    for answer in [&discover, &list, &read, &staged] {
        assert_eq!(
            answer["result"]["resultType"], "complete",
            "a 2026-07-28 result says it is complete: {answer}"
        );
    }
    // Cancelling the listen ends it without an answer; the bridge goes on answering.
    bridge.send(
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": "listen", "reason": "done"}}),
    );
    let again = bridge.ask(&request(
        "again",
        "tools/list",
        json!({"_meta": meta_2026()}),
    ));
    assert_eq!(again["result"], list["result"], "{again}");
    assert!(bridge.close().success(), "the bridge exits 0 on EOF");
}

/// POST `message` to the daemon with the coder's token and `headers`, and return the
/// response to it and the session id the daemon gave, if any.
async fn post_directly(
    url: &str,
    message: &Value,
    headers: &[(&str, &str)],
) -> (Option<Value>, Option<String>) {
    let mut post = gatekeeper_mcp::tls::client(None)
        .expect("an HTTP client")
        .post(url)
        .bearer_auth(CODER_TOKEN)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(message.to_string());
    for (name, value) in headers {
        post = post.header(*name, *value);
    }
    let response = post.send().await.expect("the daemon answers");
    assert!(response.status().is_success(), "{response:?}");
    let session = response
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().expect("text").to_owned());
    let body = response.text().await.expect("a body");
    let id = message.get("id");
    let answer = std::iter::once(body.as_str())
        .chain(body.lines().filter_map(|l| l.strip_prefix("data:")))
        .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
        .find(|m| id.is_some() && m.get("id") == id);
    (answer, session)
}

#[tokio::test(flavor = "multi_thread")]
async fn fields_the_daemon_sends_reach_the_client_unchanged() {
    let gate = Gate::start("bridge-unchanged");
    let mut bridge = Bridge::start(&gate.config);

    // 2026-07-28: the same request, through the bridge and straight to the daemon.
    let call = read_call(7, Some(meta_2026()));
    let bridged = bridge.ask(&call);
    let (direct, _) = post_directly(
        &gate.url,
        &call,
        &[
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "fixture__read_notes"),
        ],
    )
    .await;
    assert_eq!(Some(&bridged), direct.as_ref());
    assert_eq!(bridged["result"]["resultType"], "complete", "{bridged}");

    // 2025-11-25: each in its own session.
    bridge.ask(&initialize_2025(1));
    bridge.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let call = read_call(8, None);
    let bridged = bridge.ask(&call);
    let (_, session) = post_directly(&gate.url, &initialize_2025(1), &[]).await;
    let session = session.expect("initialize opens a session");
    let headers = [
        ("mcp-session-id", session.as_str()),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    post_directly(
        &gate.url,
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        &headers,
    )
    .await;
    let (direct, _) = post_directly(&gate.url, &call, &headers).await;
    assert_eq!(Some(&bridged), direct.as_ref());
    assert!(bridge.close().success());
}

#[test]
fn a_request_the_daemon_cannot_answer_gets_a_json_rpc_error_with_its_id() {
    let unserved = Unserved::new("unanswered");
    let mut bridge = Bridge::start(&unserved.config);
    for message in [
        initialize_2025(41),
        read_call("forty-two", Some(meta_2026())),
    ] {
        let answer = bridge.ask(&message);
        assert_eq!(answer["id"], message["id"], "{answer}");
        let said = answer["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("an error: {answer}"));
        assert!(said.contains("`gate serve`"), "{said}");
        assert!(said.contains("did not answer"), "{said}");
    }
    assert!(bridge.close().success());
}

#[test]
fn a_line_that_is_not_json_gets_a_parse_error() {
    let unserved = Unserved::new("not-json");
    let mut bridge = Bridge::start(&unserved.config);
    bridge.send_line("this is not {json");
    let answer = bridge.next();
    assert_eq!(answer["jsonrpc"], "2.0", "{answer}");
    assert_eq!(answer["id"], Value::Null, "{answer}");
    assert_eq!(answer["error"]["code"], -32700, "{answer}");
    assert!(bridge.close().success());
}

#[test]
fn through_the_bridge_an_agent_hears_of_a_narrowed_rule_and_an_edited_approval() {
    let gate = Gate::start_with("bridge-grants", "vetted");
    let mut bridge = Bridge::start(&gate.config);
    bridge.ask(&initialize_2025(1));
    bridge.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));

    let add = gate.person(&["rules", "add", "fixture__tag_note", "--is", "tag=weekly"]);
    assert!(add.status.success(), "{add:?}");
    let tag = |id: u64, tag: &str| {
        request(
            id,
            "tools/call",
            json!({"name": "fixture__tag_note", "arguments": {"tag": tag}}),
        )
    };
    let applied = result_text(&bridge.ask(&tag(2, "weekly")));
    assert!(
        applied.starts_with("Applied at once as action "),
        "{applied}"
    );
    let waiting = result_text(&bridge.ask(&tag(3, "daily")));
    assert!(
        waiting.starts_with("Staged as action ") && !waiting.contains("A rule covers"),
        "{waiting}"
    );

    let staged = result_text(&bridge.ask(&write_call(4, "helo", None)));
    let id = action_id(&staged);
    let edit = gate.dir.join("edit.json");
    std::fs::write(&edit, r#"{"text": "hello"}"#).expect("the edit");
    let approve = gate.person(&[
        "approve",
        &id.to_string(),
        "--arguments",
        edit.to_str().expect("a UTF-8 path"),
    ]);
    assert!(approve.status.success(), "{approve:?}");
    let told = result_text(&bridge.ask(&request(
        5,
        "tools/call",
        json!({"name": "gate_action_result", "arguments": {"action_id": id}}),
    )));
    assert!(
        told.contains("approved with changes") && told.contains(r#"text: "helo" → "hello""#),
        "{told}"
    );
    assert!(
        gate.deliveries()
            .iter()
            .any(|d| d == r#"write_note {"text":"hello"}"#),
        "{:?}",
        gate.deliveries()
    );
    assert!(bridge.close().success());
}

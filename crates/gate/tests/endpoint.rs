//! The agents' HTTP endpoint against clients that are not well-behaved agents: pages in a
//! browser (`Origin`), another agent's token on a session, a client that never finishes
//! its request's head, an agent that opens session after session. Raw HTTP/1.1 over TCP,
//! so every header is the test's own.

#[path = "support/daemon.rs"]
mod daemon;
#[path = "support/fixture.rs"]
mod fixture;

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use daemon::{CODER_TOKEN, Gate, IDLE_TOKEN};

/// One answer: its status, its headers (names in lower case) and its body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

fn authority(gate: &Gate) -> String {
    gate.url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned()
}

/// Send one request on its own connection and read the whole answer (bounded).
async fn send(gate: &Gate, method: &str, headers: &[(&str, &str)], body: &str) -> Answer {
    let host = authority(gate);
    let mut stream = TcpStream::connect(&host).await.expect("connects");
    let mut request = format!(
        "{method} /mcp HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).await.expect("sent");
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
        .await
        .expect("answered in time")
        .expect("read");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_owned(),
    }
}

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
const LIST: &str = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

#[tokio::test]
async fn a_page_in_a_browser_is_refused_unless_its_origin_is_allowed() {
    let mut gate = Gate::start("origin");
    let token = bearer(CODER_TOKEN);
    for origin in ["http://evil.example", "null"] {
        let refused = send(
            &gate,
            "POST",
            &[("Authorization", &token), ("Origin", origin)],
            INITIALIZE,
        )
        .await;
        assert_eq!(refused.status, 403, "{origin}: {}", refused.body);
    }
    let agent = send(&gate, "POST", &[("Authorization", &token)], INITIALIZE).await;
    assert_eq!(agent.status, 200, "no Origin: an agent, not a page");
    gate.reconfigure(|text| {
        text.replacen(
            "listen =",
            "allowed_origins = [\"http://localhost:3000\"]\nlisten =",
            1,
        )
    });
    let allowed = send(
        &gate,
        "POST",
        &[
            ("Authorization", &token),
            ("Origin", "http://localhost:3000"),
        ],
        INITIALIZE,
    )
    .await;
    assert_eq!(allowed.status, 200, "{}", allowed.body);
}

#[tokio::test]
async fn a_session_answers_only_the_agent_whose_token_opened_it() {
    let gate = Gate::start("bound");
    let mine = bearer(CODER_TOKEN);
    let opened = send(&gate, "POST", &[("Authorization", &mine)], INITIALIZE).await;
    assert_eq!(opened.status, 200);
    let session = opened
        .header("mcp-session-id")
        .expect("a session is handed out")
        .to_owned();
    let theirs = bearer(IDLE_TOKEN);
    let version = ("MCP-Protocol-Version", "2025-11-25");
    for method in ["POST", "GET", "DELETE"] {
        let body = if method == "POST" { LIST } else { "" };
        let foreign = send(
            &gate,
            method,
            &[
                ("Authorization", &theirs),
                ("Mcp-Session-Id", &session),
                version,
            ],
            body,
        )
        .await;
        assert_eq!(foreign.status, 404, "{method} with another agent's token");
    }
    let own = send(
        &gate,
        "POST",
        &[
            ("Authorization", &mine),
            ("Mcp-Session-Id", &session),
            version,
        ],
        LIST,
    )
    .await;
    assert_eq!(own.status, 200, "the session lives on: {}", own.body);
}

#[tokio::test]
async fn an_agent_may_hold_only_so_many_sessions_and_is_told_how_to_free_one() {
    let mut gate = Gate::start("capped-sessions");
    gate.reconfigure(|text| text.replacen("listen =", "max_sessions_per_agent = 2\nlisten =", 1));
    let token = bearer(CODER_TOKEN);
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let opened = send(&gate, "POST", &[("Authorization", &token)], INITIALIZE).await;
        assert_eq!(opened.status, 200);
        sessions.push(opened.header("mcp-session-id").expect("session").to_owned());
    }
    let third = send(&gate, "POST", &[("Authorization", &token)], INITIALIZE).await;
    assert_eq!(third.status, 503);
    assert!(third.body.contains("close one (DELETE"), "{}", third.body);
    // Another agent is not held back by this one's sessions.
    let other = send(
        &gate,
        "POST",
        &[("Authorization", &bearer(IDLE_TOKEN))],
        INITIALIZE,
    )
    .await;
    assert_eq!(other.status, 200);
    let closed = send(
        &gate,
        "DELETE",
        &[
            ("Authorization", &token),
            ("Mcp-Session-Id", &sessions[0]),
            ("MCP-Protocol-Version", "2025-11-25"),
        ],
        "",
    )
    .await;
    assert!(closed.status < 300, "closed: {}", closed.status);
    let again = send(&gate, "POST", &[("Authorization", &token)], INITIALIZE).await;
    assert_eq!(again.status, 200, "a closed session frees its place");
}

#[tokio::test]
async fn a_client_that_never_finishes_its_request_is_cut_off_and_others_are_served() {
    let mut gate = Gate::start("slow");
    gate.reconfigure(|text| text.replacen("listen =", "header_timeout_seconds = 1\nlisten =", 1));
    let host = authority(&gate);
    let mut slow = Vec::new();
    for _ in 0..20 {
        let mut stream = TcpStream::connect(&host).await.expect("connects");
        stream
            .write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            .await
            .expect("sent");
        slow.push(stream);
    }
    let served = send(
        &gate,
        "POST",
        &[("Authorization", &bearer(CODER_TOKEN))],
        INITIALIZE,
    )
    .await;
    assert_eq!(served.status, 200, "an agent is served beside them");
    // Each is closed by the gate (the read ends, with an answer, an end of stream or a
    // reset); without the timeout the read would wait forever.
    for mut stream in slow {
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest))
            .await
            .expect("the gate closes a connection that sends no whole head in time")
            .ok();
    }
}

#[tokio::test]
async fn the_persons_socket_keeps_answering_after_the_daemon_ran_out_of_descriptors() {
    let mut gate = Gate::start("descriptors");
    gate.reconfigure(|text| text.replacen("listen =", "header_timeout_seconds = 1\nlisten =", 1));
    let limited = std::process::Command::new("prlimit")
        .arg(format!("--pid={}", gate.child.id()))
        .arg("--nofile=48:48")
        .status()
        .expect("prlimit runs (util-linux)");
    assert!(limited.success());
    // Agents' connections until the daemon can open no more descriptors.
    let host = authority(&gate);
    let mut held = Vec::new();
    for _ in 0..80 {
        if let Ok(stream) = TcpStream::connect(&host).await {
            held.push(stream);
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The person asks while the daemon is out of descriptors...
    let person = std::process::Command::new("timeout")
        .arg("30")
        .arg(env!("CARGO_BIN_EXE_gate"))
        .arg("pending")
        .arg("--data-dir")
        .arg(gate.dir.join("data"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("gate pending starts");
    tokio::time::sleep(Duration::from_millis(700)).await;
    // ...and is answered once descriptors are free again.
    drop(held);
    let answered = tokio::task::spawn_blocking(move || person.wait_with_output())
        .await
        .expect("joined")
        .expect("waited");
    assert!(
        answered.status.success(),
        "the person's socket still answers: {answered:?}"
    );
}

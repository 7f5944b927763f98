//! Servers and agents on other machines, over TLS: a gate whose agents' listener serves
//! TLS with a certificate it generated is reached (1) as a downstream `https://` MCP server
//! by a second gate that trusts the certificate through `ca_file`, and (2) by the stdio
//! bridge with `--ca-file`. A server whose certificate nobody trusts is refused, naming
//! the server and what to do. A server that is down when the daemon starts is offered with
//! the catalog a person accepted, leaves the others working, and is tried again.

#[path = "support/daemon.rs"]
mod daemon;
#[path = "support/fixture.rs"]
mod fixture;

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use daemon::{
    CODER_TOKEN, Gate, action_id, answer_until, call, connect, spawn_serve_with, text,
    write_with_mode,
};
use fixture::{fixture_binary, free_port};

/// `gate`'s agents' listener turned to TLS with a certificate it makes for `localhost`;
/// that certificate's file.
fn over_tls(gate: &mut Gate) -> PathBuf {
    gate.reconfigure(|text| text.replacen('\n', "\ntls = \"self-signed\"\n", 1));
    assert!(gate.url.starts_with("https://localhost:"), "{}", gate.url);
    gate.dir.join("data").join("tls").join("localhost.pem")
}

/// A second gate's configuration, in `dir`, with `upstream` (the first gate, by https) as
/// its server `up`, trusting `ca_file` when given.
fn downstream_config(dir: &Path, upstream: &str, ca_file: Option<&Path>) -> PathBuf {
    std::fs::create_dir_all(dir).expect("directory");
    let ca = ca_file
        .map(|c| format!("ca_file = {:?}\n", c.display().to_string()))
        .unwrap_or_default();
    let config = dir.join("gate.toml");
    write_with_mode(
        &config,
        &format!(
            r#"listen = "127.0.0.1:{port}"

[[server]]
name = "up"
url = "{upstream}"
{ca}headers_from_env = {{ Authorization = "UP_AUTHORIZATION" }}

[[agent]]
name = "coder"
token = "{CODER_TOKEN}"

[[agent.grant]]
server = "up"
"#,
            port = free_port(),
        ),
        0o600,
    );
    config
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gate_reaches_an_https_server_whose_certificate_its_ca_file_trusts() {
    let mut upstream = Gate::start("remote-up");
    let certificate = over_tls(&mut upstream);
    let dir = upstream.dir.join("downstream");
    let bearer = format!("Bearer {CODER_TOKEN}");
    let env = [("UP_AUTHORIZATION", bearer.as_str())];

    // Nobody trusts the generated certificate: refused, naming the server and ca_file.
    let untrusted = downstream_config(&dir, &upstream.url, None);
    let out = Command::new(env!("CARGO_BIN_EXE_gate"))
        .args(["check", "--servers", "--config"])
        .arg(&untrusted)
        .env("UP_AUTHORIZATION", &bearer)
        .output()
        .expect("gate check runs");
    let said =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("\"up\"") && said.contains("ca_file"),
        "{said}"
    );

    // With ca_file, the second gate reaches it: reads pass, writes wait at both gates.
    let config = downstream_config(&dir, &upstream.url, Some(&certificate));
    let (mut child, url) = spawn_serve_with(&config, &dir.join("data"), &env);
    let agent = connect(&url, CODER_TOKEN).await;
    let tools = agent.list_all_tools().await.expect("tools");
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert!(names.contains(&"up__fixture__read_notes"), "{names:?}");
    let read = call(&agent, "up__fixture__read_notes", json!({})).await;
    assert_ne!(read.is_error, Some(true), "{read:?}");

    let staged = text(
        &call(
            &agent,
            "up__fixture__write_note",
            json!({"text": "over https"}),
        )
        .await,
    );
    let here = action_id(&staged);
    let approve = Command::new(env!("CARGO_BIN_EXE_gate"))
        .args(["approve", &here.to_string(), "--data-dir"])
        .arg(dir.join("data"))
        .output()
        .expect("gate approve runs");
    assert!(approve.status.success(), "{approve:?}");
    // The first gate staged what the second sent: the person approves it there too.
    let pending = upstream.person(&["pending"]);
    let pending = String::from_utf8_lossy(&pending.stdout).into_owned();
    let there = pending
        .split('#')
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|id| id.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("nothing waits upstream: {pending}"));
    let approve = upstream.person(&["approve", &there.to_string()]);
    assert!(approve.status.success(), "{approve:?}");
    assert_eq!(
        upstream.deliveries(),
        [r#"write_note {"text":"over https"}"#]
    );
    drop(agent);
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn the_bridge_reaches_a_daemon_over_tls_trusting_its_certificate() {
    let mut gate = Gate::start("remote-bridge");
    let certificate = over_tls(&mut gate);
    let token = gate.dir.join("coder.token");
    write_with_mode(&token, &format!("{CODER_TOKEN}\n"), 0o600);
    // An agent's user with a token file and the certificate.
    let mut with_token = Command::new(env!("CARGO_BIN_EXE_gate"));
    with_token
        .args(["mcp", "--token-file"])
        .arg(&token)
        .args(["--url", &gate.url, "--ca-file"])
        .arg(&certificate);
    lists_the_fixtures_tools(with_token);
    // The daemon's own user: the bridge reads the configuration, and finds the certificate
    // the daemon generated in its data directory ($XDG_DATA_HOME/gate).
    let xdg = gate.dir.join("xdg");
    std::fs::create_dir_all(&xdg).expect("directory");
    std::os::unix::fs::symlink(gate.dir.join("data"), xdg.join("gate")).expect("linked");
    let mut with_config = Command::new(env!("CARGO_BIN_EXE_gate"));
    with_config
        .args(["mcp", "--agent", "coder", "--config"])
        .arg(&gate.config)
        .env("XDG_DATA_HOME", &xdg);
    lists_the_fixtures_tools(with_config);
}

/// Run the bridge `command`, initialize through it and list the tools: the fixture's are
/// there.
fn lists_the_fixtures_tools(mut command: Command) {
    let mut child = command
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("gate mcp starts");
    let mut stdin = child.stdin.take().expect("piped");
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let mut ask = |message: Value| -> Value {
        writeln!(stdin, "{message}").expect("written");
        stdin.flush().expect("flushed");
        let line = lines.next().expect("an answer").expect("a line");
        serde_json::from_str(&line).expect("JSON")
    };
    let init = ask(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw-lines", "version": "1.0.0"}}}),
    );
    assert!(
        init["result"]["capabilities"]["tools"].is_object(),
        "{init}"
    );
    let list = ask(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}));
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools in {list}"))
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"fixture__read_notes"), "{names:?}");
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_down_at_start_leaves_the_others_working_and_is_tried_again() {
    let mut gate = Gate::start("remote-down");
    // The fixture's catalog was accepted at the first start. From now on it starts only
    // once the file `up` exists; a second server beside it is always there.
    let up = gate.dir.join("up");
    let wrapper = gate.dir.join("fixture-when-up.sh");
    write_with_mode(
        &wrapper,
        &format!(
            "#!/bin/sh\n[ -e {up:?} ] || {{ echo 'not up yet' >&2; exit 1; }}\nexec {:?} \"$@\"\n",
            fixture_binary()
        ),
        0o755,
    );
    let fixture = format!("{:?}", fixture_binary().to_string_lossy());
    let other = format!("[[server]]\nname = \"other\"\ncommand = {fixture}\n\n[[agent]]");
    // The person's notifier writes what it is told to a file.
    let told = gate.dir.join("told.txt");
    let notify = format!(
        "\n[notify]\ncommand = \"/bin/sh\"\nargs = [\"-c\", {:?}]\n",
        format!("echo \"$GATE_EVENT: $0\" >> '{}'", told.display())
    );
    gate.reconfigure(|text| {
        (text + &notify)
            .replacen(&fixture, &format!("{:?}", wrapper.to_string_lossy()), 1)
            .replacen("[[agent]]", &other, 1)
            .replacen(
                "[[agent.grant]]\nserver = \"fixture\"\n",
                "[[agent.grant]]\nserver = \"fixture\"\n\n[[agent.grant]]\nserver = \"other\"\n",
                1,
            )
    });
    let agent = gate.agent(CODER_TOKEN).await;
    let tools = agent.list_all_tools().await.expect("tools");
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert!(
        names.contains(&"fixture__read_notes"),
        "the accepted catalog is offered: {names:?}"
    );
    assert!(names.contains(&"other__read_notes"), "{names:?}");

    let working = call(&agent, "other__read_notes", json!({})).await;
    assert_ne!(working.is_error, Some(true), "{working:?}");
    let down = call(&agent, "fixture__read_notes", json!({})).await;
    assert_eq!(down.is_error, Some(true), "{down:?}");
    assert!(text(&down).contains("unavailable"), "{}", text(&down));
    daemon::eventually("the person told", || {
        std::fs::read_to_string(&told).is_ok_and(|t| {
            t.contains(
                "unavailable: server fixture is unavailable: its calls fail until it answers again",
            )
        })
    })
    .await;

    std::fs::write(&up, "").expect("up");
    answer_until(
        "the server back",
        &agent,
        "fixture__read_notes",
        json!({}),
        |answer| !answer.contains("unavailable") && !answer.contains("failed"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_remote_server_never_reached_does_not_stop_the_start() {
    let mut gate = Gate::start("remote-never");
    // `far` has never answered (nothing listens on its port): the daemon starts anyway,
    // offers none of its tools (even the one a grant names), and tells the person.
    let far = format!(
        "[[server]]\nname = \"far\"\nurl = \"http://127.0.0.1:{}/mcp\"\n\n[[agent]]",
        free_port()
    );
    let told = gate.dir.join("told.txt");
    let notify = format!(
        "\n[notify]\ncommand = \"/bin/sh\"\nargs = [\"-c\", {:?}]\n",
        format!("echo \"$GATE_EVENT: $0\" >> '{}'", told.display())
    );
    gate.reconfigure(|text| {
        (text + &notify).replacen("[[agent]]", &far, 1).replacen(
            "[[agent.grant]]\nserver = \"fixture\"\n",
            "[[agent.grant]]\nserver = \"fixture\"\n\n[[agent.grant]]\nserver = \"far\"\ntools = [\"search\"]\n",
            1,
        )
    });
    let agent = gate.agent(CODER_TOKEN).await;
    let tools = agent.list_all_tools().await.expect("tools");
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert!(names.contains(&"fixture__read_notes"), "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with("far__")), "{names:?}");
    let working = call(&agent, "fixture__read_notes", json!({})).await;
    assert_ne!(working.is_error, Some(true), "{working:?}");
    daemon::eventually("the person told", || {
        std::fs::read_to_string(&told)
            .is_ok_and(|t| t.contains("unavailable: server far is unavailable"))
    })
    .await;
}

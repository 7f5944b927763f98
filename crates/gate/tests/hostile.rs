//! A downstream server that behaves as an attacker would, against what reaches the
//! person: its standard error never reaches a terminal or the gate's log raw, and a
//! server that fails to start is reported with its own words, sanitized.

#[path = "support/daemon.rs"]
mod daemon;
#[path = "support/fixture.rs"]
mod fixture;

use serde_json::json;

use daemon::{CODER_TOKEN, Gate, call, eventually};

#[tokio::test]
async fn a_servers_stderr_reaches_the_gates_log_only_sanitized_under_its_name() {
    let mut gate = Gate::start_with_env("stderr", "byo", &[("MCP_FIXTURE_RICH", "1")]);
    let log = gate.restart_logging("info,rmcp=warn");
    let agent = gate.agent(CODER_TOKEN).await;
    call(agent.peer(), "fixture__shout", json!({})).await;
    eventually("the line is logged", || {
        std::fs::read_to_string(&log).is_ok_and(|text| text.contains("downstream.stderr"))
    })
    .await;
    let text = std::fs::read_to_string(&log).expect("log");
    let line = text
        .lines()
        .find(|l| l.contains("downstream.stderr"))
        .expect("logged");
    assert!(
        !text.contains('\u{1b}'),
        "no escape sequence reaches the log: {text:?}"
    );
    assert!(line.contains("fixture"), "under the server's name: {line}");
    assert!(
        line.contains("«") && line.contains("gate::control: person approved #1»"),
        "the forged line is a delimited field of the gate's own line: {line}"
    );
    assert!(
        !text.lines().any(|l| l.starts_with("gate::control")),
        "no line of the log is the server's own"
    );
}

#[test]
fn a_server_that_fails_to_start_is_reported_with_its_own_last_words() {
    let gate = Gate::start("last-words");
    let said = gate.refused_start(|text| {
        text.replacen(
            "[[agent]]",
            "[[server]]\nname = \"broken\"\ncommand = \"sh\"\nargs = [\"-c\", \"printf 'None of the specified directories are accessible\\\\033[2J\\\\n' >&2; exit 1\"]\n\n[[agent]]",
            1,
        )
    });
    assert!(
        said.contains(
            "its last words on stderr: «None of the specified directories are accessible"
        ),
        "{said}"
    );
    assert!(!said.contains('\u{1b}'), "sanitized: {said:?}");
    assert!(said.contains("what it wrote says why"), "{said}");
}

#[tokio::test]
async fn an_untrusted_servers_read_only_claim_is_not_believed() {
    let gate = Gate::start_with("untrusted", "untrusted");
    let agent = gate.agent(CODER_TOKEN).await;
    let answer = daemon::text(&call(agent.peer(), "fixture__read_notes", json!({})).await);
    assert!(
        answer.starts_with("Staged as action"),
        "a tool that claims to be read-only waits for the person: {answer}"
    );
    let id = daemon::action_id(&answer);
    let shown = gate.person(&["show", &id.to_string()]);
    assert!(
        String::from_utf8_lossy(&shown.stdout)
            .contains("this deployment believes nothing the server says about its tools"),
        "{shown:?}"
    );
}

#[tokio::test]
async fn a_tool_the_person_lists_as_a_read_runs_at_once_whatever_the_server_says() {
    let mut gate = Gate::start_with("person-reads", "untrusted");
    gate.reconfigure(|text| {
        text.replace(
            "trust = \"untrusted\"",
            "trust = \"untrusted\"\nreads = [\"read_notes\"]",
        )
    });
    let agent = gate.agent(CODER_TOKEN).await;
    let read = call(agent.peer(), "fixture__read_notes", json!({})).await;
    assert_eq!(read.is_error, Some(false));
    assert!(
        !daemon::text(&read).starts_with("Staged"),
        "the person's word makes it a read"
    );
    let write = daemon::text(&call(agent.peer(), "fixture__tag_note", json!({"tag": "x"})).await);
    assert!(write.starts_with("Staged as action"), "{write}");
}

#[test]
fn a_read_the_person_lists_must_be_a_tool_the_server_lists() {
    let gate = Gate::start("unknown-read");
    let said = gate.refused_start(|text| {
        text.replace(
            "trust = \"byo\"",
            "trust = \"byo\"\nreads = [\"delete_everything\"]",
        )
    });
    assert!(
        said.contains("lists read \"delete_everything\", which that server does not list"),
        "{said}"
    );
}

#[tokio::test]
async fn a_read_tool_changed_without_a_word_is_refused_once_the_periodic_check_sees_it() {
    let mut gate = Gate::start_with_env("rug-pull", "byo", &[("MCP_FIXTURE_RICH", "1")]);
    gate.reconfigure(|text| text.replacen("listen =", "catalog_check_seconds = 1\nlisten =", 1));
    let agent = gate.agent(CODER_TOKEN).await;
    let before = call(agent.peer(), "fixture__read_notes", json!({})).await;
    assert_eq!(before.is_error, Some(false));
    call(agent.peer(), "fixture__rug_pull", json!({})).await;
    let start = std::time::Instant::now();
    let refused = loop {
        let after = call(agent.peer(), "fixture__read_notes", json!({})).await;
        if after.is_error == Some(true) {
            break daemon::text(&after);
        }
        assert!(
            start.elapsed() < daemon::PATIENCE,
            "the changed read was never refused"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert!(
        refused.contains("the server changed the tool \"read_notes\""),
        "{refused}"
    );
    let catalog = gate.person(&["catalog"]);
    assert!(
        String::from_utf8_lossy(&catalog.stdout)
            .contains("`read_notes` changed since the catalog was accepted"),
        "{catalog:?}"
    );
}

#[tokio::test]
async fn a_locked_down_agents_reads_go_out_only_to_servers_marked_local_only() {
    let mut gate = Gate::start_with_env("locked-reads", "byo", &[("MCP_FIXTURE_RICH", "1")]);
    gate.reconfigure(|text| {
        text.replace(
            "trust = \"byo\"",
            "trust = \"byo\"\nsensitive_reads = [\"read_notes\"]",
        )
    });
    let agent = gate.agent(CODER_TOKEN).await;
    let secret = call(agent.peer(), "fixture__read_notes", json!({})).await;
    assert_eq!(
        secret.is_error,
        Some(false),
        "the sensitive read itself is served"
    );
    for tool in ["fixture__read_notes", "fixture__progress_read"] {
        let refused = call(agent.peer(), tool, json!({})).await;
        assert_eq!(refused.is_error, Some(true), "{tool}");
        assert!(
            daemon::text(&refused).starts_with("Your workspace is locked down because"),
            "{tool}: {}",
            daemon::text(&refused)
        );
    }
    let resource = agent
        .peer()
        .read_resource(rmcp::model::ReadResourceRequestParams::new(
            "gate://fixture/fixture://notes/1",
        ))
        .await;
    assert!(resource.is_err(), "a resource read can carry data out too");
    drop(agent);
    gate.reconfigure(|text| text.replace("trust = \"byo\"", "trust = \"byo\"\nlocal_only = true"));
    let agent = gate.agent(CODER_TOKEN).await;
    let local = call(agent.peer(), "fixture__progress_read", json!({})).await;
    assert_eq!(
        local.is_error,
        Some(false),
        "a server marked local_only is still read: {}",
        daemon::text(&local)
    );
}

#[tokio::test]
async fn a_call_whose_prompt_cannot_show_all_its_arguments_is_approved_only_once_read_in_full() {
    let gate = Gate::start("long-arguments");
    let agent = gate.agent(CODER_TOKEN).await;
    // Padding first, the part that matters last: past what a prompt shows.
    let text = format!(
        "{} and send everything to attacker@example.com",
        "pad ".repeat(1100)
    );
    let staged =
        daemon::text(&call(agent.peer(), "fixture__write_note", json!({"text": text})).await);
    let id = daemon::action_id(&staged).to_string();
    let shown = gate.person(&["show", &id]);
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(
        !shown.contains("attacker@example.com"),
        "the prompt is clipped"
    );
    let refused = gate.person(&["approve", &id]);
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stdout).into_owned();
    assert!(
        said.contains("not approved: its arguments are")
            && said.contains(&format!("gate show {id} --full")),
        "{said}"
    );
    assert!(gate.deliveries().is_empty(), "nothing sent");
    let full = gate.person(&["show", &id, "--full"]);
    let full = String::from_utf8_lossy(&full.stdout).into_owned();
    assert!(
        full.contains("its arguments in full (") && full.contains("attacker@example.com"),
        "{full}"
    );
    let approved = gate.person(&["approve", &id, "--full-seen"]);
    assert!(approved.status.success(), "{approved:?}");
    assert_eq!(gate.deliveries().len(), 1);
    // A short call is approved as before.
    let short = daemon::text(
        &call(
            agent.peer(),
            "fixture__write_note",
            json!({"text": "short"}),
        )
        .await,
    );
    let short = daemon::action_id(&short).to_string();
    assert!(gate.person(&["approve", &short]).status.success());
}

#[tokio::test]
async fn a_stdio_server_cannot_reach_the_gates_files_environment_or_socket_from_inside_a_call() {
    let gate = Gate::start_with_env("break-out", "byo", &[("MCP_FIXTURE_RICH", "1")]);
    let agent = gate.agent(CODER_TOKEN).await;
    let staged =
        daemon::text(&call(agent.peer(), "fixture__write_note", json!({"text": "x"})).await);
    let id = daemon::action_id(&staged);
    let data = gate.dir.join("data");
    let approve = serde_json::to_string(&gate::control::Request::Approve {
        ids: vec![id],
        all_of_kind: false,
        full_seen: false,
        stale_seen: false,
        scope: Default::default(),
        edited: None,
    })
    .expect("a request serialises");
    let report = daemon::text(
        &call(
            agent.peer(),
            "fixture__break_out",
            json!({
                "read": [
                    gate.config.to_string_lossy(),
                    data.join("gate.db").to_string_lossy(),
                    "/etc/passwd",
                ],
                "socket": data.join("gate.sock").to_string_lossy(),
                "request": approve,
            }),
        )
        .await,
    );
    let line = |start: &str| {
        report
            .lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no line {start:?} in {report}"))
            .to_string()
    };
    assert!(
        line(&format!("read {}", gate.config.display())).contains("refused"),
        "the configuration (every agent's token) is out of reach: {report}"
    );
    assert!(
        line(&format!("read {}", data.join("gate.db").display())).contains("refused"),
        "the data directory is out of reach: {report}"
    );
    assert!(
        line("read /etc/passwd").contains("ok"),
        "what is not the gate's stays the server's: {report}"
    );
    // Its first two ancestors are its launcher and the daemon: neither is dumpable, and
    // the server has no capability to read them anyway.
    let environs: Vec<&str> = report.lines().filter(|l| l.contains("/environ")).collect();
    assert!(
        environs.len() >= 2 && environs[..2].iter().all(|l| l.contains("refused")),
        "the daemon's environment (and its launcher's) cannot be read: {report}"
    );
    assert!(
        report
            .lines()
            .filter(|l| l.starts_with("signal "))
            .all(|l| l.ends_with("refused")),
        "no ancestor can be signalled: {report}"
    );
    for who in ["socket, itself", "socket, from a child"] {
        let said = line(who);
        assert!(
            said.contains("refused") && said.contains("started by the gate"),
            "the person's socket refuses the server and what it starts: {said}"
        );
    }
    let pending = gate.person(&["pending"]);
    assert!(
        String::from_utf8_lossy(&pending.stdout).contains(&format!("#{id}")),
        "the write still waits for the person: {pending:?}"
    );
    assert!(gate.deliveries().is_empty(), "nothing was sent");
}

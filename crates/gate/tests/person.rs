//! The person's side of `gate serve` beyond deciding one action: who decided (the user
//! behind the socket), rules, revert, the ledger and lockdown, each over the same socket
//! as a script would use them.

#[path = "support/daemon.rs"]
mod daemon;
#[path = "support/fixture.rs"]
mod fixture;

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::Output;

use serde_json::{Value, json};

use daemon::{CODER_TOKEN, Gate, action_id, call, eventually, me, text};

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Send one raw request line to the daemon's socket and return its answer.
fn raw_request(gate: &Gate, line: &str) -> Value {
    let mut stream =
        std::os::unix::net::UnixStream::connect(gate.dir.join("data").join("gate.sock"))
            .expect("the socket answers");
    stream.write_all(line.as_bytes()).expect("sent");
    stream.write_all(b"\n").expect("sent");
    let mut answer = String::new();
    BufReader::new(stream)
        .read_line(&mut answer)
        .expect("an answer");
    serde_json::from_str(&answer).expect("a JSON answer")
}

/// The ledger as `gate ledger --json` gives it, with extra arguments.
fn ledger(gate: &Gate, args: &[&str]) -> Value {
    let mut all = vec!["ledger", "--json"];
    all.extend_from_slice(args);
    let out = gate.person(&all);
    assert!(out.status.success(), "{out:?}");
    serde_json::from_str(&stdout(&out)).expect("JSON")
}

fn ids(page: &Value) -> Vec<u64> {
    page["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| e["id"].as_u64().expect("an id"))
        .collect()
}

fn entry(gate: &Gate, id: u64) -> Value {
    let page = ledger(gate, &["--before", &(id + 1).to_string(), "--limit", "1"]);
    let entry = page["entries"][0].clone();
    assert_eq!(entry["id"], id, "{page}");
    entry
}

fn resolution_by(entry: &Value) -> String {
    entry["body"]["Action"]["resolution"]["by"]
        .as_str()
        .unwrap_or_else(|| panic!("no resolution in {entry}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_ledger_names_the_user_behind_the_socket_and_a_name_in_a_request_is_refused() {
    let gate = Gate::start("who");
    let coder = gate.agent(CODER_TOKEN).await;
    let first = action_id(&text(
        &call(&coder, "fixture__write_note", json!({"text": "one"})).await,
    ));
    let second = action_id(&text(
        &call(&coder, "fixture__write_note", json!({"text": "two"})).await,
    ));

    // A request that names its own decider is not understood, and decides nothing.
    for forged in [
        json!({"command": "approve", "ids": [first], "all_of_kind": false, "person": "mallory"}),
        json!({"command": "reject", "ids": [second], "reason": null, "person": ""}),
    ] {
        let answer = raw_request(&gate, &forged.to_string());
        assert_eq!(answer["ok"], false, "{answer}");
        assert!(
            answer["text"]
                .as_str()
                .unwrap_or_default()
                .contains("did not understand"),
            "{answer}"
        );
    }
    assert!(gate.deliveries().is_empty(), "nothing was approved");
    assert_eq!(entry(&gate, first)["body"]["Action"]["state"], "Pending");

    // The same requests without a name are decided by the user the socket reports.
    let approve = raw_request(
        &gate,
        &json!({"command": "approve", "ids": [first], "all_of_kind": false}).to_string(),
    );
    assert_eq!(approve["ok"], true, "{approve}");
    assert!(
        gate.person(&["reject", &second.to_string()])
            .status
            .success()
    );
    let me = me();
    assert!(!me.trim().is_empty());
    assert_eq!(resolution_by(&entry(&gate, first)), me);
    assert_eq!(resolution_by(&entry(&gate, second)), me);
    let shown = stdout(&gate.person(&["ledger"]));
    assert!(shown.contains(&format!("by «{me}»")), "{shown}");
    assert!(!shown.contains("mallory"), "{shown}");
}

#[tokio::test(flavor = "multi_thread")]
async fn rules_are_listed_added_and_removed_over_the_socket() {
    let gate = Gate::start_with("rules", "vetted");
    let coder = gate.agent(CODER_TOKEN).await;

    let none = gate.person(&["rules"]);
    assert!(none.status.success(), "{none:?}");
    let none = stdout(&none);
    assert!(
        none.contains("No auto-approval rules are enabled."),
        "{none}"
    );
    // Each tool a rule could cover is named as the agents call it, never by its tag.
    assert!(
        none.contains("`fixture__tag_note` (server `fixture`)") && !none.contains("%3A"),
        "{none}"
    );

    let refused = gate.person(&["rules", "add", "fixture__write_note"]);
    assert!(
        !refused.status.success(),
        "a tool not safe to repeat has no rule"
    );
    assert!(
        stdout(&refused).contains("`fixture__write_note` is not marked safe to repeat"),
        "the true reason: {}",
        stdout(&refused)
    );
    let read = gate.person(&["rules", "add", "fixture", "read_notes"]);
    assert!(
        stdout(&read).contains("is a read: it is sent at once"),
        "{}",
        stdout(&read)
    );
    let unknown = gate.person(&["rules", "add", "fixture__nothing"]);
    assert!(
        stdout(&unknown).contains("no tool is named `fixture__nothing`"),
        "{}",
        stdout(&unknown)
    );

    let pending = action_id(&text(
        &call(&coder, "fixture__tag_note", json!({"tag": "waiting"})).await,
    ));
    let add = gate.person(&["rules", "add", "fixture__tag_note"]);
    assert!(add.status.success(), "{add:?}");
    assert!(
        stdout(&add).contains("gate rules remove fixture__tag_note"),
        "{}",
        stdout(&add)
    );
    // Enabling the rule drains what was already pending, attributed to its enabler.
    let applied = entry(&gate, pending);
    assert_eq!(applied["body"]["Action"]["state"], "Approved", "{applied}");
    assert_eq!(applied["body"]["Action"]["resolution"]["auto"], true);
    assert_eq!(resolution_by(&applied), me());
    let listed = stdout(&gate.person(&["rules", "list"]));
    assert!(
        listed.contains(&format!(
            "`fixture__tag_note` (server `fixture`), enabled by `{}`",
            me()
        )),
        "{listed}"
    );

    // The server and the tool's own name name it too.
    let remove = gate.person(&["rules", "remove", "fixture", "tag_note"]);
    assert!(remove.status.success(), "{remove:?}");
    let later = action_id(&text(
        &call(&coder, "fixture__tag_note", json!({"tag": "later"})).await,
    ));
    assert!(gate.person(&["pending"]).status.success());
    let outcome = text(&call(&coder, "gate_action_result", json!({"action_id": later})).await);
    assert!(outcome.contains("still waits"), "{outcome}");
    let again = gate.person(&["rules", "remove", "fixture__tag_note"]);
    assert!(!again.status.success());
    assert!(
        stdout(&again).contains("there is no rule for `fixture__tag_note`"),
        "{}",
        stdout(&again)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rule_and_approve_all_of_kind_are_refused_alike_on_a_server_that_is_not_vetted() {
    let gate = Gate::start_with("rules-byo", "byo");
    let coder = gate.agent(CODER_TOKEN).await;
    let expected = "server `fixture` is byo; set trust = \"vetted\"";
    let add = gate.person(&["rules", "add", "fixture__tag_note"]);
    assert!(!add.status.success());
    assert!(stdout(&add).contains(expected), "{}", stdout(&add));
    let id = action_id(&text(
        &call(&coder, "fixture__tag_note", json!({"tag": "one"})).await,
    ));
    let all = gate.person(&["approve", "--all-of-kind", &id.to_string()]);
    assert!(!all.status.success());
    assert!(
        stdout(&all).contains(expected) && stdout(&all).contains("no rule was enabled"),
        "{}",
        stdout(&all)
    );
    let none = stdout(&gate.person(&["rules"]));
    assert!(
        none.contains("No auto-approval rules are enabled."),
        "{none}"
    );
    assert_eq!(
        entry(&gate, id)["body"]["Action"]["state"],
        "Pending",
        "nothing was approved"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn revert_is_refused_clearly_where_the_server_cannot_undo_and_for_what_is_not_applied() {
    let gate = Gate::start("revert");
    let coder = gate.agent(CODER_TOKEN).await;
    let id = action_id(&text(
        &call(&coder, "fixture__write_note", json!({"text": "kept"})).await,
    ));
    let early = gate.person(&["revert", &id.to_string()]);
    assert!(!early.status.success());
    assert!(
        stdout(&early).contains("only an applied action can be reverted"),
        "{}",
        stdout(&early)
    );
    assert!(gate.person(&["approve", &id.to_string()]).status.success());
    let refused = gate.person(&["revert", &id.to_string()]);
    assert!(!refused.status.success());
    assert!(
        stdout(&refused)
            .contains("cannot be reverted automatically; undo it directly in the service"),
        "{}",
        stdout(&refused)
    );
    assert_eq!(gate.deliveries().len(), 1, "a refused revert sends nothing");
    assert_eq!(entry(&gate, id)["body"]["Action"]["state"], "Approved");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_ledger_filters_by_agent_server_state_and_time_and_pages_most_recent_first() {
    let gate = Gate::start("ledger");
    let coder = gate.agent(CODER_TOKEN).await;
    let read = call(&coder, "fixture__read_notes", json!({})).await;
    assert_ne!(read.is_error, Some(true));
    let mut staged = Vec::new();
    for n in 0..5 {
        staged.push(action_id(&text(
            &call(
                &coder,
                "fixture__write_note",
                json!({"text": format!("n{n}")}),
            )
            .await,
        )));
    }
    assert!(
        gate.person(&["reject", &staged[1].to_string()])
            .status
            .success()
    );

    let everything = ledger(&gate, &[]);
    let all = ids(&everything);
    assert_eq!(all.len(), 6, "{everything}");
    assert!(
        all.windows(2).all(|w| w[0] > w[1]),
        "most recent first: {all:?}"
    );
    assert_eq!(everything["next_before"], Value::Null);

    // Pages of two, each starting where the last ended, cover everything once.
    let mut paged = Vec::new();
    let mut before: Option<u64> = None;
    loop {
        let mut args = vec!["--limit".to_owned(), "2".to_owned()];
        if let Some(b) = before {
            args.extend(["--before".to_owned(), b.to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let page = ledger(&gate, &args);
        paged.extend(ids(&page));
        match page["next_before"].as_u64() {
            Some(next) => before = Some(next),
            None => break,
        }
    }
    assert_eq!(paged, all);

    assert_eq!(ids(&ledger(&gate, &["--state", "rejected"])), [staged[1]]);
    assert_eq!(ids(&ledger(&gate, &["--state", "read"])).len(), 1);
    assert_eq!(ids(&ledger(&gate, &["--state", "pending"])).len(), 4);
    assert_eq!(ids(&ledger(&gate, &["--agent", "coder"])), all);
    assert!(ids(&ledger(&gate, &["--agent", "idle"])).is_empty());
    assert_eq!(ids(&ledger(&gate, &["--server", "fixture"])), all);
    assert!(ids(&ledger(&gate, &["--server", "other"])).is_empty());
    // Every entry was recorded after 2020 and before 9000.
    assert_eq!(ids(&ledger(&gate, &["--since", "2020-01-01"])), all);
    assert!(ids(&ledger(&gate, &["--until", "2020-01-01T00:00"])).is_empty());
    assert!(ids(&ledger(&gate, &["--since", "9000-01-01"])).is_empty());

    let unknown = gate.person(&["ledger", "--state", "lost"]);
    assert!(!unknown.status.success());
    assert!(
        stdout(&unknown).contains("use one of: pending"),
        "{}",
        stdout(&unknown)
    );
    let bad_time = gate.person(&["ledger", "--since", "yesterday"]);
    assert!(!bad_time.status.success());
    assert!(
        String::from_utf8_lossy(&bad_time.stderr).contains("write a UTC date"),
        "{bad_time:?}"
    );

    let lines = stdout(&gate.person(&["ledger", "--limit", "3"]));
    assert!(lines.contains(&format!("#{}", staged[4])), "{lines}");
    assert!(lines.contains("(more: add --before"), "{lines}");
}

#[tokio::test(flavor = "multi_thread")]
async fn lifting_a_lockdown_is_recorded_with_the_user_and_lets_the_agent_write_again() {
    let mut gate = Gate::start("lift");
    gate.reconfigure(|text| {
        text.replacen(
            "trust = \"byo\"\n",
            "trust = \"byo\"\nsensitive_reads = [\"read_notes\"]\n",
            1,
        )
    });
    let coder = gate.agent(CODER_TOKEN).await;
    let clear = stdout(&gate.person(&["lockdown"]));
    assert!(clear.contains("No agent is locked down."), "{clear}");
    let applied = action_id(&text(
        &call(&coder, "fixture__write_note", json!({"text": "sent"})).await,
    ));
    assert!(
        gate.person(&["approve", &applied.to_string()])
            .status
            .success()
    );
    let staged = action_id(&text(
        &call(&coder, "fixture__write_note", json!({"text": "before"})).await,
    ));
    assert_ne!(
        call(&coder, "fixture__read_notes", json!({}))
            .await
            .is_error,
        Some(true)
    );
    let status = stdout(&gate.person(&["lockdown", "status"]));
    assert!(
        status.contains("agent `coder` is locked down because"),
        "{status}"
    );
    // A revert writes to the server too: refused before its driver is asked.
    let revert = gate.person(&["revert", &applied.to_string()]);
    assert!(!revert.status.success());
    assert!(
        stdout(&revert).contains("not reverted: agent `coder` is locked down"),
        "{}",
        stdout(&revert)
    );
    assert_eq!(gate.deliveries().len(), 1);

    let refused = gate.person(&["lockdown", "lift", "idle", "--reason", "checked"]);
    assert!(!refused.status.success());
    assert!(
        stdout(&refused).contains("not locked down"),
        "{}",
        stdout(&refused)
    );
    let blank = gate.person(&["lockdown", "lift", "coder", "--reason", "  "]);
    assert!(!blank.status.success());
    assert!(stdout(&blank).contains("--reason"), "{}", stdout(&blank));
    let still = call(&coder, "fixture__write_note", json!({"text": "during"})).await;
    assert_eq!(still.is_error, Some(true), "still locked down");

    let lift = gate.person(&[
        "lockdown",
        "lift",
        "coder",
        "--reason",
        "the notes were a test fixture",
    ]);
    assert!(lift.status.success(), "{lift:?}");
    let said = stdout(&lift);
    assert!(said.contains(&format!("lifted by `{}`", me())), "{said}");
    assert!(
        said.contains(&format!("review each before approving: #{staged}")),
        "{said}"
    );

    // The lift is durable: after a restart the agent writes again and the record stays.
    drop(coder);
    gate.kill_and_restart();
    let coder = gate.agent(CODER_TOKEN).await;
    let after = call(&coder, "fixture__write_note", json!({"text": "after"})).await;
    assert_ne!(after.is_error, Some(true), "{}", text(&after));
    let status = stdout(&gate.person(&["lockdown"]));
    assert!(status.contains("No agent is locked down."), "{status}");
    assert!(status.contains("Lifted before:"), "{status}");
    assert!(
        status.contains(&format!("agent `coder` by `{}`", me())),
        "{status}"
    );
    assert!(status.contains("the notes were a test fixture"), "{status}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_action_past_its_time_to_live_expires_unsent_and_the_agent_is_told() {
    let mut gate = Gate::start("expiry");
    gate.reconfigure(|text| {
        text.replacen(
            "trust = \"byo\"\n",
            "trust = \"byo\"\npending_ttl_seconds = 1\n",
            1,
        )
    });
    let coder = gate.agent(CODER_TOKEN).await;
    let id = action_id(&text(
        &call(&coder, "fixture__write_note", json!({"text": "late"})).await,
    ));
    // The daemon sweeps on its own; nobody asks in the meantime.
    eventually("the action's expiry", || {
        ids(&ledger(&gate, &["--state", "expired"])) == [id]
    })
    .await;
    let entry = entry(&gate, id);
    assert_eq!(entry["body"]["Action"]["state"], "Expired", "{entry}");
    assert_eq!(resolution_by(&entry), kernel::EXPIRY_DECIDER);
    let outcome = text(&call(&coder, "gate_action_result", json!({"action_id": id})).await);
    assert!(
        outcome.contains(&format!("Action {id} expired")),
        "{outcome}"
    );
    assert!(outcome.contains("nothing was sent"), "{outcome}");
    let approve = gate.person(&["approve", &id.to_string()]);
    assert!(!approve.status.success(), "an expired action is final");
    assert!(
        stdout(&approve).contains("already expired"),
        "{}",
        stdout(&approve)
    );
    assert!(gate.deliveries().is_empty(), "nothing was sent");
    // An identical call is a new action, not the expired one.
    let again = text(&call(&coder, "fixture__write_note", json!({"text": "late"})).await);
    assert!(again.starts_with("Staged as action"), "{again}");
    assert_ne!(action_id(&again), id);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_burst_of_a_hundred_stages_is_one_notification_with_clean_fields_only() {
    use std::os::unix::fs::PermissionsExt as _;

    let mut gate = Gate::start("notify");
    let told = gate.dir.join("told.log");
    let script = gate.dir.join("notifier.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nprintf '%s|%s|%s|%s|%s\\n' \"$GATE_COUNT\" \"$GATE_AGENT\" \"$GATE_SERVER\" \"$GATE_TOOL\" \"$*\" >> {}\n",
            told.display()
        ),
    )
    .expect("script written");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let fixture = fixture::fixture_binary();
    let log = gate.log.clone();
    gate.reconfigure(|text| {
        // A second server, so a hundred stages fit under each server's cap of open calls.
        text.replacen(
            "[[agent]]",
            &format!(
                "[[server]]\nname = \"other\"\ncommand = {:?}\nenv = {{ MCP_FIXTURE_LOG = {:?} }}\n\n[notify]\ncommand = {:?}\nargs = [\"gate\"]\nmin_interval_seconds = 3600\n\n[[agent]]",
                fixture.to_string_lossy(),
                log.to_string_lossy(),
                script.to_string_lossy()
            ),
            1,
        )
        .replacen(
            "[[agent.grant]]\nserver = \"fixture\"\n",
            "[[agent.grant]]\nserver = \"fixture\"\n\n[[agent.grant]]\nserver = \"other\"\n",
            1,
        )
    });
    let coder = gate.agent(CODER_TOKEN).await;
    for n in 0..100 {
        let tool = if n % 2 == 0 {
            "fixture__write_note"
        } else {
            "other__write_note"
        };
        // An agent's text never reaches the notifier.
        let staged = call(&coder, tool, json!({"text": format!("$(touch pwned) {n}")})).await;
        assert_ne!(staged.is_error, Some(true), "{}", text(&staged));
    }
    let read = || std::fs::read_to_string(&told).unwrap_or_default();
    eventually("a notification", || !read().is_empty()).await;
    // Whatever else arrives within the interval would join the next one; none is due.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let lines: Vec<String> = read().lines().map(str::to_owned).collect();
    assert_eq!(
        lines,
        [
            "100|coder|several|several|gate 100 actions wait for you (agent coder, tool several); `gate pending` lists them"
        ],
        "one notification for the burst"
    );
    assert!(!gate.dir.join("pwned").exists());
    assert!(gate.deliveries().is_empty());
}

#[tokio::test]
async fn the_notifier_gets_the_gates_fields_and_none_of_the_daemons_secrets() {
    use std::os::unix::fs::PermissionsExt as _;

    let mut gate = Gate::start("notify-env");
    let seen = gate.dir.join("env.log");
    let script = gate.dir.join("notifier.sh");
    std::fs::write(&script, format!("#!/bin/sh\nenv > {}\n", seen.display()))
        .expect("script written");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    gate.reconfigure(|text| {
        text.replacen(
            "[[agent]]",
            &format!(
                "[notify]\ncommand = {:?}\n\n[[agent]]",
                script.to_string_lossy()
            ),
            1,
        )
    });
    // The daemon again, now with a secret in its environment, as a remote server's
    // header would be.
    gate.child.kill().expect("killed");
    gate.child.wait().expect("reaped");
    let (child, url) = daemon::spawn_serve_with(
        &gate.config,
        &gate.dir.join("data"),
        &[("REMOTE_MCP_AUTHORIZATION", "Bearer do-not-leak")],
    );
    gate.child = child;
    gate.url = url;
    let coder = gate.agent(CODER_TOKEN).await;
    call(&coder, "fixture__write_note", json!({"text": "x"})).await;
    let read = || std::fs::read_to_string(&seen).unwrap_or_default();
    eventually("the notifier runs", || read().contains("GATE_COUNT=1")).await;
    let env = read();
    assert!(!env.contains("do-not-leak"), "{env}");
    assert!(!env.contains("REMOTE_MCP_AUTHORIZATION"), "{env}");
    assert!(
        !env.contains("RUST_LOG"),
        "only what a notifier needs: {env}"
    );
}

#[test]
fn a_time_to_live_out_of_range_is_refused_with_its_line() {
    let path = std::path::Path::new("gate.toml");
    for (text, line) in [
        ("pending_ttl_seconds = 0\n", 1),
        (
            "[[server]]\nname = \"a\"\ncommand = \"sh\"\npending_ttl_seconds = 99999999999\n",
            4,
        ),
        ("[notify]\ncommand = \"sh\"\nmin_interval_seconds = 0\n", 3),
        ("[notify]\ncommand = \"sh\"\nshell = true\n", 3),
    ] {
        let error = gate::config::Config::parse(path, text).unwrap_err();
        assert_eq!(error.line, Some(line), "{text}: {error}");
    }
    let ok = gate::config::Config::parse(
        path,
        "pending_ttl_seconds = 86400\n[[server]]\nname = \"a\"\ncommand = \"sh\"\npending_ttl_seconds = 60\n",
    )
    .unwrap();
    assert_eq!(ok.pending_ttl, Some(std::time::Duration::from_secs(86400)));
    assert_eq!(
        ok.servers[0].pending_ttl,
        Some(std::time::Duration::from_secs(60))
    );
}

/// An agent's MCP client that keeps the resource updates it is sent.
struct Listener(tokio::sync::mpsc::UnboundedSender<String>);

impl rmcp::ClientHandler for Listener {
    async fn on_resource_updated(
        &self,
        params: rmcp::model::ResourceUpdatedNotificationParam,
        _context: rmcp::service::NotificationContext<rmcp::RoleClient>,
    ) {
        let _ = self.0.send(params.uri);
    }
}

#[tokio::test(flavor = "multi_thread")]
#[allow(deprecated)] // resources/subscribe: the subscription of sessions begun with initialize
async fn an_agent_subscribed_to_its_action_is_told_when_the_person_decides() {
    use rmcp::ServiceExt as _;
    use rmcp::model::{ReadResourceRequestParams, SubscribeRequestParams};
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

    let gate = Gate::start("listen");
    let (tx, mut heard) = tokio::sync::mpsc::unbounded_channel();
    let coder = Listener(tx)
        .serve(StreamableHttpClientTransport::with_client(
            gatekeeper_mcp::tls::client(None).expect("an HTTP client"),
            StreamableHttpClientTransportConfig::with_uri(gate.url.clone())
                .auth_header(CODER_TOKEN),
        ))
        .await
        .expect("the agent connects");
    let staged = text(&call_as(&coder, "fixture__write_note", json!({"text": "hear"})).await);
    let id = action_id(&staged);
    let uri = format!("gate://action/{id}");
    assert!(staged.contains(&uri), "{staged}");

    assert!(
        coder
            .subscribe(SubscribeRequestParams::new("file:///etc/passwd"))
            .await
            .is_err(),
        "only action resources"
    );
    coder
        .subscribe(SubscribeRequestParams::new(uri.clone()))
        .await
        .expect("its own action");
    let reject = gate.person(&["reject", &id.to_string(), "--reason", "not now"]);
    assert!(reject.status.success(), "{reject:?}");
    let told = tokio::time::timeout(std::time::Duration::from_secs(30), heard.recv())
        .await
        .expect("told within the wait")
        .expect("a notification");
    assert_eq!(told, uri);

    let read = coder
        .read_resource(ReadResourceRequestParams::new(uri.clone()))
        .await
        .expect("its own action reads");
    let shown = serde_json::to_string(&read).expect("serialises");
    assert!(shown.contains("rejected"), "{shown}");
    assert!(shown.contains("not now"), "{shown}");

    let idle = gate.agent(daemon::IDLE_TOKEN).await;
    assert!(
        idle.read_resource(ReadResourceRequestParams::new(uri.clone()))
            .await
            .is_err(),
        "another agent's action is not a resource it can read"
    );
    assert!(
        idle.subscribe(SubscribeRequestParams::new(uri))
            .await
            .is_err(),
        "nor one it can subscribe to"
    );
}

async fn call_as<H: rmcp::ClientHandler>(
    agent: &rmcp::service::RunningService<rmcp::RoleClient, H>,
    tool: &str,
    args: Value,
) -> rmcp::model::CallToolResult {
    let Value::Object(args) = args else {
        panic!("arguments are an object")
    };
    agent
        .call_tool(rmcp::model::CallToolRequestParams::new(tool.to_owned()).with_arguments(args))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_review_queue_says_when_a_pending_action_expires() {
    let mut gate = Gate::start("expiry-flag");
    gate.reconfigure(|text| {
        text.replacen(
            "trust = \"byo\"\n",
            "trust = \"byo\"\npending_ttl_seconds = 86400\n",
            1,
        )
    });
    let coder = gate.agent(CODER_TOKEN).await;
    let id = action_id(&text(
        &call(&coder, "fixture__write_note", json!({"text": "tomorrow"})).await,
    ));
    let answer = raw_request(&gate, &json!({"command": "queue"}).to_string());
    assert_eq!(answer["ok"], true, "{answer}");
    let queue: Value = serde_json::from_str(answer["text"].as_str().expect("rows as text"))
        .expect("the queue is JSON");
    let row = queue["rows"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["id"] == id))
        .unwrap_or_else(|| panic!("#{id} is in the queue: {queue}"));
    let flags = row["flags"].to_string();
    assert!(
        flags.contains("expires in 24 h") || flags.contains("expires in 23 h 59 min"),
        "{flags}"
    );
}

#[tokio::test]
async fn a_tool_name_in_a_message_to_the_person_keeps_its_underscores() {
    let gate = Gate::start("names");
    let agent = gate.agent(CODER_TOKEN).await;
    let answer = text(&call(agent.peer(), "fixture__write_note", json!({"text": "x"})).await);
    let id = action_id(&answer).to_string();
    let reason = "use fixture__tag_note instead";
    assert!(
        gate.person(&["reject", &id, "--reason", reason])
            .status
            .success()
    );
    let shown = stdout(&gate.person(&["show", &id]));
    assert!(
        shown.contains("fixture__tag_note"),
        "the reason names the tool as the agent calls it: {shown}"
    );
    let told = text(
        &call(
            agent.peer(),
            "gate_action_result",
            json!({"action_id": id.parse::<u64>().unwrap()}),
        )
        .await,
    );
    assert!(
        told.contains("fixture__tag_note"),
        "and so is the agent told: {told}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_over_its_limits_is_told_which_and_the_person_sees_the_counts_across_a_restart() {
    let mut gate = Gate::start("quotas");
    gate.reconfigure(|text| {
        text.replace(
            &format!("token = \"{CODER_TOKEN}\"\n"),
            &format!("token = \"{CODER_TOKEN}\"\nmax_open_actions = 2\nmax_writes_per_hour = 3\n"),
        )
    });
    let coder = gate.agent(CODER_TOKEN).await;
    let write = |n: u32| json!({"text": format!("note {n}")});
    let first = action_id(&text(&call(&coder, "fixture__write_note", write(1)).await));
    action_id(&text(&call(&coder, "fixture__write_note", write(2)).await));
    let full = call(&coder, "fixture__write_note", write(3)).await;
    assert_eq!(full.is_error, Some(true));
    assert!(
        text(&full).contains("2 of your writes already wait for the person")
            && text(&full).contains("max_open_actions = 2 for agent coder"),
        "{}",
        text(&full)
    );
    assert!(
        gate.person(&["approve", &first.to_string()])
            .status
            .success()
    );
    action_id(&text(&call(&coder, "fixture__write_note", write(3)).await));
    let pending = stdout(&gate.person(&["pending"]));
    assert!(
        pending.contains("agent coder: 2 of 2 open actions, 3 of 3 writes in the last hour"),
        "{pending}"
    );

    // The hour is counted from the ledger: a restart forgets nothing.
    gate.kill_and_restart();
    let coder = gate.agent(CODER_TOKEN).await;
    let pending = stdout(&gate.person(&["pending"]));
    assert!(
        pending.contains("3 of 3 writes in the last hour"),
        "{pending}"
    );
    assert!(gate.person(&["approve", "2"]).status.success());
    let hour = call(&coder, "fixture__write_note", write(4)).await;
    assert_eq!(hour.is_error, Some(true));
    assert!(
        text(&hour).contains("you staged 3 writes in the last hour")
            && text(&hour).contains("You may stage again in 60 minutes"),
        "{}",
        text(&hour)
    );
    assert_eq!(gate.deliveries().len(), 2, "nothing over a limit was sent");
}

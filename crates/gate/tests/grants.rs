//! Grants a person can scope and edits before approval, through `gate serve` as a person
//! and an agent use it: a rule for one agent, for a while, or narrowed by arguments;
//! `gate rules test`; `gate approve --edit` and `--arguments`.

#[path = "support/daemon.rs"]
mod daemon;
#[path = "support/fixture.rs"]
mod fixture;

use std::process::Output;

use serde_json::json;

use daemon::{CODER_TOKEN, Gate, action_id, call, text};

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The state the ledger records for action `id`.
fn state(gate: &Gate, id: u64) -> String {
    let out = gate.person(&[
        "ledger",
        "--json",
        "--before",
        &(id + 1).to_string(),
        "--limit",
        "1",
    ]);
    let page: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    page["entries"][0]["body"]["Action"]["state"]
        .as_str()
        .expect("an action")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rule_narrowed_by_an_argument_applies_one_value_and_not_another_and_says_why() {
    let gate = Gate::start_with("narrowed", "vetted");
    let coder = gate.agent(CODER_TOKEN).await;

    // A test on an argument the tool does not take could never pass: refused, with why.
    let never = gate.person(&[
        "rules",
        "add",
        "fixture__tag_note",
        "--under",
        "path=/notes",
    ]);
    assert!(!never.status.success());
    assert!(
        stdout(&never).contains("takes no argument `path`") && stdout(&never).contains("tag"),
        "{}",
        stdout(&never)
    );
    let bad = gate.person(&["rules", "add", "fixture__tag_note", "--under", "/notes"]);
    assert!(!bad.status.success());

    let add = gate.person(&[
        "rules",
        "add",
        "fixture__tag_note",
        "--under",
        "tag=/team/a",
    ]);
    assert!(add.status.success(), "{add:?}");
    assert!(
        stdout(&add).contains("where tag is under /team/a"),
        "{}",
        stdout(&add)
    );
    let listed = stdout(&gate.person(&["rules"]));
    assert!(
        listed.contains("every agent's calls, until removed, where tag is under /team/a"),
        "{listed}"
    );

    let inside = text(&call(&coder, "fixture__tag_note", json!({"tag": "/team/a/x"})).await);
    assert!(inside.contains("Applied at once"), "{inside}");
    let outside = text(&call(&coder, "fixture__tag_note", json!({"tag": "/team/ab"})).await);
    assert!(
        outside.contains("needs a person's approval") && !outside.contains("A rule covers"),
        "the agent is not told a rule covers a call it does not: {outside}"
    );
    let outside = action_id(&outside);
    assert_eq!(state(&gate, outside), "Pending");
    assert_eq!(
        gate.deliveries()
            .iter()
            .filter(|d| d.starts_with("tag_note"))
            .count(),
        1,
        "{:?}",
        gate.deliveries()
    );

    // `gate rules test` says why, part by part, and tries a rule before it is made.
    let why = stdout(&gate.person(&["rules", "test", &outside.to_string()]));
    assert!(
        why.contains("no  tag is under /team/a: it is \"/team/ab\"")
            && why.contains("would not apply"),
        "{why}"
    );
    let would = gate.person(&[
        "rules",
        "test",
        &outside.to_string(),
        "--under",
        "tag=/team",
    ]);
    assert!(would.status.success());
    assert!(
        stdout(&would).contains("yes tag is under /team") && stdout(&would).contains("would apply"),
        "{}",
        stdout(&would)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rule_for_one_agent_or_for_a_while_reaches_no_further() {
    let gate = Gate::start_with("scoped", "vetted");
    let coder = gate.agent(CODER_TOKEN).await;

    let unknown = gate.person(&["rules", "add", "fixture__tag_note", "--agent", "nobody"]);
    assert!(!unknown.status.success());
    assert!(
        stdout(&unknown).contains("there is no agent `nobody`"),
        "{}",
        stdout(&unknown)
    );
    let other = gate.person(&["rules", "add", "fixture__tag_note", "--agent", "idle"]);
    assert!(other.status.success(), "{other:?}");
    let mine = action_id(&text(
        &call(&coder, "fixture__tag_note", json!({"tag": "one"})).await,
    ));
    assert_eq!(state(&gate, mine), "Pending", "a rule for agent idle");
    let why = stdout(&gate.person(&["rules", "test", &mine.to_string()]));
    assert!(why.contains("no  the rule covers its agent"), "{why}");

    // From an approval: this kind, this agent, for a while (the pending call is approved).
    let refused = gate.person(&["approve", &mine.to_string(), "--for", "5m"]);
    assert!(!refused.status.success(), "--for without --all-of-kind");
    let grant = gate.person(&[
        "approve",
        &mine.to_string(),
        "--all-of-kind",
        "--this-agent",
        "--for",
        "2s",
    ]);
    assert!(grant.status.success(), "{grant:?}");
    assert!(
        stdout(&grant).contains("calls of agent \"coder\" only, until"),
        "{}",
        stdout(&grant)
    );
    assert_eq!(state(&gate, mine), "Approved");
    let during = text(&call(&coder, "fixture__tag_note", json!({"tag": "two"})).await);
    assert!(during.contains("Applied at once"), "{during}");

    // Once its time is up it applies nothing, and the list says so.
    std::thread::sleep(std::time::Duration::from_millis(2_500));
    let after = text(&call(&coder, "fixture__tag_note", json!({"tag": "three"})).await);
    assert!(after.contains("needs a person's approval"), "{after}");
    assert_eq!(state(&gate, action_id(&after)), "Pending");
    let listed = stdout(&gate.person(&["rules"]));
    assert!(listed.contains("(expired: it applies nothing)"), "{listed}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_edited_approval_sends_the_edit_records_both_and_tells_the_agent() {
    let gate = Gate::start("edited");
    let coder = gate.agent(CODER_TOKEN).await;
    let id = action_id(&text(
        &call(&coder, "fixture__write_note", json!({"text": "helo wrld"})).await,
    ));
    let edit = gate.dir.join("edit.json");

    // An edit that breaks the schema is refused; nothing is sent, nothing changes.
    std::fs::write(&edit, r#"{"text": 42}"#).unwrap();
    let broken = gate.person(&[
        "approve",
        &id.to_string(),
        "--arguments",
        edit.to_str().unwrap(),
    ]);
    assert!(!broken.status.success());
    assert!(
        stdout(&broken).contains("do not fit") && stdout(&broken).contains("/text"),
        "{}",
        stdout(&broken)
    );
    std::fs::write(&edit, "{not json").unwrap();
    let garbled = gate.person(&[
        "approve",
        &id.to_string(),
        "--arguments",
        edit.to_str().unwrap(),
    ]);
    assert!(!garbled.status.success());
    assert_eq!(state(&gate, id), "Pending");
    assert!(gate.deliveries().is_empty(), "{:?}", gate.deliveries());

    // Through the person's editor: here a script that fixes the spelling.
    let editor = gate.dir.join("editor.sh");
    std::fs::write(
        &editor,
        "#!/bin/sh\nsed -i 's/helo wrld/hello world/' \"$1\"\n",
    )
    .unwrap();
    std::fs::set_permissions(
        &editor,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o700),
    )
    .unwrap();
    let approved = std::process::Command::new(env!("CARGO_BIN_EXE_gate"))
        .args(["approve", &id.to_string(), "--edit", "--data-dir"])
        .arg(gate.dir.join("data"))
        .env("VISUAL", &editor)
        .output()
        .expect("gate runs");
    assert!(approved.status.success(), "{approved:?}");
    assert!(
        stdout(&approved).contains("text: \"helo wrld\" → \"hello world\""),
        "{}",
        stdout(&approved)
    );
    let sent = gate.deliveries();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert!(
        sent[0].contains("hello world") && !sent[0].contains("helo"),
        "{sent:?}"
    );

    // The ledger keeps the agent's call as staged, and the change beside the approval.
    let page: serde_json::Value = serde_json::from_str(&stdout(
        &gate.person(&["ledger", "--json", "--state", "approved", "--reveal"]),
    ))
    .unwrap();
    let entry = &page["entries"][0];
    let cause = entry["body"]["Action"]["resolution"]["cause"]
        .as_str()
        .unwrap();
    assert!(
        cause.starts_with("approved with changes by ") && cause.contains("sent as call sha256:"),
        "{cause}"
    );
    assert!(
        entry["body"]["Action"]["description"]["description"]
            .as_str()
            .unwrap()
            .contains("helo wrld"),
        "the prompt the agent's call was staged with stays: {entry}"
    );
    let told = text(&call(&coder, "gate_action_result", json!({"action_id": id})).await);
    assert!(
        told.contains("approved with changes") && told.contains("hello world"),
        "{told}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_grant_for_a_session_ends_with_the_session() {
    let gate = Gate::start_with("session", "vetted");
    let first = gate.agent(CODER_TOKEN).await;
    let staged = action_id(&text(
        &call(&first, "fixture__tag_note", json!({"tag": "one"})).await,
    ));
    let grant = gate.person(&["approve", &staged.to_string(), "--all-of-kind", "--session"]);
    assert!(grant.status.success(), "{grant:?}");
    assert!(
        stdout(&grant).contains("in the session it was made for"),
        "{}",
        stdout(&grant)
    );
    let during = text(&call(&first, "fixture__tag_note", json!({"tag": "two"})).await);
    assert!(during.contains("Applied at once"), "{during}");

    // The session ends: its grant goes with it, and a new session asks the person again.
    first.cancel().await.expect("the session closes");
    daemon::eventually("the session's rule removed", || {
        stdout(&gate.person(&["rules"])).contains("No auto-approval rules are enabled.")
    })
    .await;
    let second = gate.agent(CODER_TOKEN).await;
    let after = text(&call(&second, "fixture__tag_note", json!({"tag": "three"})).await);
    assert!(after.contains("needs a person's approval"), "{after}");
    // A call whose session ended cannot have a grant for that session.
    let again = gate.person(&["approve", &staged.to_string(), "--all-of-kind", "--session"]);
    assert!(!again.status.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_expired_rule_stays_expired_and_a_sessions_grant_is_gone_after_a_restart() {
    let mut gate = Gate::start_with("restart", "vetted");
    let coder = gate.agent(CODER_TOKEN).await;
    let staged = action_id(&text(
        &call(&coder, "fixture__tag_note", json!({"tag": "one"})).await,
    ));
    assert!(
        gate.person(&["approve", &staged.to_string(), "--all-of-kind", "--session"])
            .status
            .success()
    );
    drop(coder);
    gate.kill_and_restart();
    // The killed daemon's session did not end cleanly; its grant goes at the next start.
    let listed = stdout(&gate.person(&["rules"]));
    assert!(
        listed.contains("No auto-approval rules are enabled."),
        "{listed}"
    );

    let add = gate.person(&["rules", "add", "fixture__tag_note", "--for", "1s"]);
    assert!(add.status.success(), "{add:?}");
    std::thread::sleep(std::time::Duration::from_millis(1_500));
    gate.kill_and_restart();
    let coder = gate.agent(CODER_TOKEN).await;
    let after = text(&call(&coder, "fixture__tag_note", json!({"tag": "two"})).await);
    assert!(after.contains("needs a person's approval"), "{after}");
    assert!(stdout(&gate.person(&["rules"])).contains("(expired"));
}

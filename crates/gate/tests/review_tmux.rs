//! `gate review` end to end, in a real terminal: `gate serve` as a process in front of the
//! fixture MCP server, an agent staging writes over MCP, and the review screen running in a
//! tmux session driven with `send-keys` and read with `capture-pane`.
//!
//! Needs tmux (`apt-get install -y tmux`); without it the test fails and says so.
//! Deliveries are counted from the fixture server's own log.

#[path = "support/daemon.rs"]
mod daemon;
#[path = "support/fixture.rs"]
mod fixture;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rmcp::RoleClient;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use serde_json::{Value, json};

use daemon::{CODER_TOKEN, Gate, action_id, call, text};

/// How long the screen may take to show what is waited for; a bound on a failing test,
/// never a measurement.
const PATIENCE: Duration = Duration::from_secs(30);

/// A tmux server of this test's own (its own socket), holding one session.
struct Tmux {
    socket: PathBuf,
}

impl Tmux {
    /// Start `command` in a detached session `columns` wide and 40 lines high.
    fn start_sized(socket: &Path, command: &str, columns: u16) -> Self {
        match Command::new("tmux").arg("-V").output() {
            Ok(out) if out.status.success() => {}
            _ => panic!(
                "tmux is not installed: the review screen's end-to-end test needs it; install it (apt-get install -y tmux) and run the test again"
            ),
        }
        let tmux = Self {
            socket: socket.to_owned(),
        };
        tmux.run(&[
            "new-session",
            "-d",
            "-s",
            "review",
            "-x",
            &columns.to_string(),
            "-y",
            "40",
            command,
        ]);
        tmux
    }

    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("tmux runs");
        assert!(out.status.success(), "tmux {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "review"];
        args.extend_from_slice(keys);
        self.run(&args);
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "review"])
    }

    /// Wait until the screen satisfies `ready`, and return it.
    fn wait_for(&self, what: &str, ready: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let screen = self.screen();
            if ready(&screen) {
                return screen;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "the screen never showed {what}:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("kill-server")
            .output();
    }
}

/// Stage a write as `agent` and return its action id.
async fn stage(agent: &RunningService<RoleClient, ()>, tool: &str, args: Value) -> u64 {
    action_id(&text(&call(agent, tool, args).await))
}

/// `gate review` on `gate`'s daemon in a tmux session; the shell says when it exits.
fn review(gate: &Gate) -> Tmux {
    review_sized(gate, 120)
}

/// [`review`] in a terminal `columns` wide.
fn review_sized(gate: &Gate, columns: u16) -> Tmux {
    Tmux::start_sized(
        &gate.dir.join("tmux.sock"),
        &format!(
            "'{}' review --data-dir '{}'; echo \"review exited: $?\"; sleep 60",
            env!("CARGO_BIN_EXE_gate"),
            gate.dir.join("data").display()
        ),
        columns,
    )
}

async fn outcome(agent: &RunningService<RoleClient, ()>, id: u64) -> String {
    let Value::Object(args) = json!({"action_id": id}) else {
        unreachable!()
    };
    let result = agent
        .call_tool(CallToolRequestParams::new("gate_action_result").with_arguments(args))
        .await
        .expect("gate_action_result answers");
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect()
}

/// The screen's row of action `id`.
fn row(screen: &str, id: u64) -> Option<&str> {
    let tag = format!("#{id} ");
    screen
        .lines()
        .find(|l| l.contains("] ") && l.contains(&tag) && l.contains("pending"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_person_approves_one_staged_write_through_keys_and_the_server_gets_it_once() {
    let gate = Gate::start("one");
    let coder = gate.agent(CODER_TOKEN).await;
    let first = stage(
        &coder,
        "fixture__write_note",
        json!({"text": "release notes for 2.4"}),
    )
    .await;
    let tmux = review(&gate);
    tmux.wait_for("the staged write", |s| row(s, first).is_some());

    // Work staged while the screen is open shows up.
    let second = stage(&coder, "fixture__tag_note", json!({"tag": "weekly"})).await;
    tmux.wait_for("the second write, live", |s| row(s, second).is_some());

    // Keys it did not ask for, and a resize, decide nothing. The skip that follows
    // them shows on the screen once they have all been read.
    tmux.keys(&["x", "Y", "Enter", "n", "Tab"]);
    // The skip comes right after the resizes: a reader that dropped the terminal's
    // readiness on a resize would leave it unread until another key came.
    tmux.run(&["resize-window", "-t", "review", "-x", "100", "-y", "30"]);
    tmux.run(&["resize-window", "-t", "review", "-x", "120", "-y", "40"]);
    tmux.keys(&["s"]);
    tmux.wait_for("the skip", |s| s.contains(&format!("#{first} skipped")));
    assert!(gate.deliveries().is_empty(), "{:?}", gate.deliveries());

    // Back up to the first write and approve it.
    tmux.keys(&["k"]);
    let before = tmux.wait_for("the cursor on the first write", |s| {
        row(s, first).is_some_and(|l| l.starts_with('›'))
    });
    println!("{before}");
    tmux.keys(&["a"]);
    let screen = tmux.wait_for("the first write gone from the queue", |s| {
        row(s, first).is_none() && row(s, second).is_some()
    });
    println!("{screen}");
    assert_eq!(
        gate.deliveries(),
        [r#"write_note {"text":"release notes for 2.4"}"#]
    );

    // Leaving decides nothing: the second write still waits, nothing else was sent.
    tmux.keys(&["q"]);
    tmux.wait_for("the screen closed", |s| s.contains("review exited: 0"));
    let pending = gate.person(&["pending"]);
    assert!(pending.status.success(), "{pending:?}");
    let listed = String::from_utf8_lossy(&pending.stdout);
    assert!(listed.contains(&format!("#{second}  pending")), "{listed}");
    assert!(!listed.contains(&format!("#{first} ")), "{listed}");
    assert_eq!(gate.deliveries().len(), 1, "delivered exactly once");
}

#[tokio::test(flavor = "multi_thread")]
async fn several_writes_are_approved_together_after_a_confirmation_and_a_reason_reaches_the_agent()
{
    let gate = Gate::start("several");
    let coder = gate.agent(CODER_TOKEN).await;
    let mut ids = Vec::new();
    for text in ["one", "two", "three"] {
        ids.push(stage(&coder, "fixture__write_note", json!({"text": text})).await);
    }
    let tmux = review(&gate);
    tmux.wait_for("three writes", |s| {
        ids.iter().all(|id| row(s, *id).is_some())
    });

    // Select the first two and approve: the screen shows what will be sent, and waits.
    tmux.keys(&["Space", "Space", "a"]);
    let confirm = tmux.wait_for("the confirmation", |s| s.contains("Approve 2 actions?"));
    println!("{confirm}");
    assert!(gate.deliveries().is_empty(), "{:?}", gate.deliveries());
    tmux.keys(&["y"]);
    tmux.wait_for("both approved", |s| {
        row(s, ids[0]).is_none() && row(s, ids[1]).is_none()
    });
    assert_eq!(
        gate.deliveries(),
        [
            r#"write_note {"text":"one"}"#,
            r#"write_note {"text":"two"}"#
        ]
    );

    // Reject the third with a reason typed in the input line.
    tmux.wait_for("the cursor on the third", |s| {
        row(s, ids[2]).is_some_and(|l| l.starts_with('›'))
    });
    tmux.keys(&["r"]);
    tmux.wait_for("the reason line", |s| s.contains("Reason for rejecting"));
    tmux.keys(&["-l", "use the staging notes"]);
    tmux.keys(&["Enter"]);
    tmux.wait_for("nothing left", |s| s.contains("nothing waits"));
    let told = outcome(&coder, ids[2]).await;
    assert!(told.contains("use the staging notes"), "{told}");
    assert_eq!(
        gate.deliveries().len(),
        2,
        "the rejected write was not sent"
    );
    tmux.keys(&["q"]);
    tmux.wait_for("the screen closed", |s| s.contains("review exited: 0"));
}

#[tokio::test(flavor = "multi_thread")]
async fn at_60_100_and_200_columns_the_keys_fit_and_approving_twice_in_a_row_approves_two() {
    let gate = Gate::start("widths");
    let coder = gate.agent(CODER_TOKEN).await;
    let mut ids = Vec::new();
    for text in ["first", "second", "third"] {
        ids.push(stage(&coder, "fixture__write_note", json!({"text": text})).await);
    }
    let tmux = review_sized(&gate, 60);
    for columns in ["60", "100", "200"] {
        tmux.run(&["resize-window", "-t", "review", "-x", columns, "-y", "40"]);
        let screen = tmux.wait_for(&format!("every key at {columns} columns"), |s| {
            row(s, ids[0]).is_some()
                && ["a approve", "A allow kind", "q quit (decides nothing)"]
                    .iter()
                    .all(|key| s.contains(key))
        });
        println!("{screen}");
    }
    // The key after a decision acts on the action the screen then shows.
    tmux.keys(&["a"]);
    tmux.wait_for("the first approved and the cursor on the second", |s| {
        row(s, ids[0]).is_none() && row(s, ids[1]).is_some_and(|l| l.starts_with('›'))
    });
    tmux.keys(&["a"]);
    tmux.wait_for("the second approved", |s| row(s, ids[1]).is_none());
    assert_eq!(
        gate.deliveries(),
        [
            r#"write_note {"text":"first"}"#,
            r#"write_note {"text":"second"}"#
        ]
    );
    tmux.keys(&["q"]);
    tmux.wait_for("the screen closed", |s| s.contains("review exited: 0"));
}

#[tokio::test(flavor = "multi_thread")]
async fn e_hands_the_terminal_to_the_editor_and_the_edited_call_is_what_is_sent() {
    let gate = Gate::start("edit");
    let coder = gate.agent(CODER_TOKEN).await;
    let id = stage(&coder, "fixture__write_note", json!({"text": "helo wrld"})).await;
    // The person's editor: a script that fixes the spelling, as a person would by hand.
    let editor = gate.dir.join("editor.sh");
    std::fs::write(
        &editor,
        "#!/bin/sh\nsed -i 's/helo wrld/hello world/' \"$1\"\n",
    )
    .expect("the editor script");
    std::fs::set_permissions(
        &editor,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o700),
    )
    .expect("made runnable");
    let tmux = Tmux::start_sized(
        &gate.dir.join("tmux.sock"),
        &format!(
            "VISUAL='{}' '{}' review --data-dir '{}'; echo \"review exited: $?\"; sleep 60",
            editor.display(),
            env!("CARGO_BIN_EXE_gate"),
            gate.dir.join("data").display()
        ),
        120,
    );
    tmux.wait_for("the staged write and the edit key", |s| {
        row(s, id).is_some() && s.contains("e edit")
    });
    tmux.keys(&["e"]);
    let screen = tmux.wait_for("the edited approval's report", |s| s.contains("edited by"));
    assert!(
        screen.contains("text: \"helo wrld\" → \"hello world\""),
        "{screen}"
    );
    assert_eq!(gate.deliveries(), [r#"write_note {"text":"hello world"}"#]);
    let told = outcome(&coder, id).await;
    assert!(told.contains("approved with changes"), "{told}");
    tmux.keys(&["q"]);
    tmux.wait_for("the screen closed", |s| s.contains("review exited: 0"));
}

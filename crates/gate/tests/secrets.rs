//! Secrets in an agent's arguments, end to end against `gate serve`: redacted from every
//! view of the person's (`gate show`, `gate pending`, `gate ledger`, the review screen, the
//! notifier) and from the daemon's log, shown by `--reveal` and the review screen's `v`, and
//! kept whole in the ledger and in what is sent. Also: the data directory and everything in
//! it are the daemon's user's alone.

#[path = "support/daemon.rs"]
mod daemon;
#[path = "support/fixture.rs"]
mod fixture;

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use gate::review::model::{Command, Input, Key, Model};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use serde_json::{Value, json};

use daemon::{CODER_TOKEN, Gate, action_id, call, eventually, text};

/// A GitHub token an agent put in its arguments.
const TOKEN: &str = "ghp_aB3dE5fG7hI9jK1lM3nO5pQ7rS9tU1vW3xY5";
/// A value the person named in `redact_env`, by its variable.
const LISTED: &str = "listed-secret-value-42";
/// A password under a member named as one.
const PASSWORD: &str = "hunter2hunter2";

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Whether `text` shows none of the secrets.
fn clean(text: &str) -> bool {
    !text.contains(TOKEN)
        && !text.contains(LISTED)
        && !text.contains(PASSWORD)
        && !text.contains(CODER_TOKEN)
}

/// The review screen of `model`, as text, 120 columns by 40 lines.
fn screen(model: &Model) -> String {
    let mut terminal = Terminal::new(TestBackend::new(120, 40)).expect("a test terminal");
    terminal
        .draw(|frame| gate::review::view::draw(model, frame))
        .expect("drawn");
    terminal.backend().to_string()
}

/// A daemon with a notifier that records what it is given, `redact_env` naming
/// `GATE_TEST_SECRET` (set to [`LISTED`]), logging at `debug` to a file.
fn start() -> (Gate, PathBuf, PathBuf) {
    let mut gate = Gate::start("secrets");
    let told = gate.dir.join("told.log");
    let script = gate.dir.join("notifier.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n{{ printf '%s\\n' \"$*\"; env; }} >> {}\n",
            told.display()
        ),
    )
    .expect("script written");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let config = std::fs::read_to_string(&gate.config).expect("config");
    let config = format!("redact_env = [\"GATE_TEST_SECRET\"]\n{config}").replacen(
        "[[agent]]",
        &format!(
            "[notify]\ncommand = {:?}\nmin_interval_seconds = 1\n\n[[agent]]",
            script.to_string_lossy()
        ),
        1,
    );
    std::fs::write(&gate.config, config).expect("config written");
    gate.child.kill().expect("killed");
    gate.child.wait().expect("reaped");
    let log = gate.dir.join("serve.log");
    let mut command = daemon::serve_command(&gate.config, &gate.dir.join("data"));
    command
        .env("RUST_LOG", "debug")
        .env("GATE_TEST_SECRET", LISTED)
        .stderr(Stdio::from(std::fs::File::create(&log).expect("log file")));
    let (child, url) = daemon::spawn_serve_command(command);
    gate.child = child;
    gate.url = url;
    (gate, told, log)
}

fn socket(gate: &Gate) -> PathBuf {
    gate.dir.join("data").join("gate.sock")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_in_a_staged_write_is_redacted_from_every_view_and_the_log_and_shown_with_reveal() {
    let (gate, told, log) = start();
    let coder = gate.agent(CODER_TOKEN).await;
    let args = json!({
        "text": format!("deploy with {TOKEN} and {LISTED}, as {CODER_TOKEN}"),
        "password": PASSWORD,
    });
    let id = action_id(&text(
        &call(&coder, "fixture__write_note", args.clone()).await,
    ));
    let id_arg = id.to_string();

    // gate pending.
    let pending = gate.person(&["pending"]);
    assert!(pending.status.success(), "{pending:?}");
    assert!(clean(&stdout(&pending)), "{}", stdout(&pending));
    assert!(stdout(&pending).contains(&format!("#{id}")));

    // gate show: each secret replaced by what it was and how long, and said so.
    let shown = stdout(&gate.person(&["show", &id_arg]));
    assert!(clean(&shown), "{shown}");
    for marker in [
        "[redacted: GitHub token, 40 characters]",
        "[redacted: value of a variable in redact_env, 22 characters]",
        "[redacted: agent token, 28 characters]",
        "\"password\": \"[redacted: value of a secret-named field, 14 characters]\"",
    ] {
        assert!(shown.contains(marker), "{marker}: {shown}");
    }
    assert!(
        shown.contains(&format!(
            "#{id}: 4 secrets are hidden in this view, each shown as [redacted: what it is, its length]; `gate show {id} --reveal` shows the real arguments"
        )),
        "{shown}"
    );
    let full = stdout(&gate.person(&["show", &id_arg, "--full"]));
    assert!(clean(&full), "{full}");
    assert!(full.contains("secrets redacted;"), "{full}");

    // --reveal: the real arguments, said to be so.
    let revealed = stdout(&gate.person(&["show", &id_arg, "--reveal", "--full"]));
    assert!(
        revealed.contains(TOKEN) && revealed.contains(PASSWORD),
        "{revealed}"
    );
    assert!(
        revealed.contains(&format!(
            "#{id}: shown with its secrets revealed (--reveal)"
        )),
        "{revealed}"
    );

    // The review screen: the daemon's rows, the model and what it draws.
    let queue = gate::queue::fetch(&socket(&gate)).expect("the queue");
    let row = queue.rows.iter().find(|r| r.id == id).expect("the row");
    assert!(clean(&row.prompt), "{}", row.prompt);
    assert_eq!(row.hidden, 4);
    let mut model = Model::new(queue);
    let drawn = screen(&model);
    assert!(clean(&drawn), "{drawn}");
    assert!(
        drawn.contains("4 secrets redacted, v reveals them"),
        "{drawn}"
    );
    let Some(Command::Reveal(asked)) = model.input(Input::Key(Key::Char('v'))) else {
        panic!("v asks for the real prompt");
    };
    let answer = gate::control::request(&socket(&gate), &gate::review::request_to_reveal(asked))
        .expect("answered");
    model.revealed(asked, answer.ok, &answer.text);
    let drawn = screen(&model);
    assert!(drawn.contains(TOKEN), "{drawn}");
    assert!(drawn.contains("SECRETS REVEALED"), "{drawn}");

    // The notifier was told, with nothing of the arguments.
    let read = || std::fs::read_to_string(&told).unwrap_or_default();
    eventually("the notifier runs", || read().contains("GATE_COUNT=1")).await;
    assert!(clean(&read()), "{}", read());

    // Approved, the real arguments are sent, and the server's answer (which echoes them)
    // is redacted too.
    let approved = gate.person(&["approve", &id_arg]);
    assert!(approved.status.success(), "{approved:?}");
    assert!(clean(&stdout(&approved)), "{}", stdout(&approved));
    let sent = gate.deliveries().join("\n");
    assert!(sent.contains(TOKEN) && sent.contains(PASSWORD), "{sent}");
    let shown = stdout(&gate.person(&["show", &id_arg]));
    assert!(shown.contains("the server answered"), "{shown}");
    assert!(clean(&shown), "{shown}");
    let revealed = stdout(&gate.person(&["show", &id_arg, "--reveal"]));
    assert!(
        revealed.contains(&format!("wrote \"deploy with {TOKEN}")),
        "{revealed}"
    );

    // The ledger's views are redacted; the ledger keeps what was sent.
    let listed = stdout(&gate.person(&["ledger"]));
    assert!(clean(&listed), "{listed}");
    let exported = stdout(&gate.person(&["ledger", "--json"]));
    assert!(clean(&exported), "{exported}");
    let page: Value = serde_json::from_str(&exported).expect("JSON");
    assert_eq!(page["revealed"], false);
    let recorded = stdout(&gate.person(&["ledger", "--json", "--reveal"]));
    assert!(recorded.contains(TOKEN), "{recorded}");
    let page: Value = serde_json::from_str(&recorded).expect("JSON");
    assert_eq!(page["revealed"], true);

    // Nothing of it in the log, where the debug lines carried it.
    drop(coder);
    let logged = std::fs::read_to_string(&log).expect("the log");
    assert!(clean(&logged), "{logged}");
    assert!(
        logged.contains("[redacted: GitHub token, 40 characters]"),
        "a debug line carried the arguments: {logged}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_view_that_redaction_makes_longer_than_a_prompt_shows_is_approved_only_once_read_in_full()
{
    let gate = Gate::start("secrets-long");
    let coder = gate.agent(CODER_TOKEN).await;
    // 3,992 characters as sent; the password's marker makes the view 4,039, past the
    // 4,000 a prompt shows.
    let args = json!({"password": "x".repeat(8), "text": "a".repeat(3950)});
    let id = action_id(&text(&call(&coder, "fixture__write_note", args).await));
    let id = id.to_string();
    let refused = gate.person(&["approve", &id]);
    assert!(!refused.status.success());
    assert!(
        stdout(&refused).contains("then approve with `gate approve"),
        "{}",
        stdout(&refused)
    );
    let full = stdout(&gate.person(&["show", &id, "--full"]));
    assert!(
        full.contains("characters, secrets redacted; 3992 characters with them)"),
        "{full}"
    );
    let approved = gate.person(&["approve", &id, "--full-seen"]);
    assert!(approved.status.success(), "{approved:?}");
    assert_eq!(gate.deliveries().len(), 1);
}

/// Every entry under `dir`, with its mode and owner.
fn entries(dir: &Path, out: &mut Vec<(PathBuf, u32, u32)>) {
    use std::os::unix::fs::MetadataExt as _;
    for entry in std::fs::read_dir(dir).expect("readable") {
        let path = entry.expect("an entry").path();
        let meta = std::fs::symlink_metadata(&path).expect("metadata");
        out.push((path.clone(), meta.mode() & 0o7777, meta.uid()));
        if meta.is_dir() {
            entries(&path, out);
        }
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .expect("exists")
        .permissions()
        .mode()
        & 0o7777
}

#[tokio::test(flavor = "multi_thread")]
async fn the_data_directory_and_the_ledger_file_are_the_daemons_users_alone() {
    let mut gate = Gate::start("private-data");
    let coder = gate.agent(CODER_TOKEN).await;
    let id = action_id(&text(
        &call(&coder, "fixture__write_note", json!({"text": TOKEN})).await,
    ));
    assert!(gate.person(&["approve", &id.to_string()]).status.success());
    drop(coder);
    let data = gate.dir.join("data");
    // The ledger keeps the real arguments; no other user may even look inside.
    assert_eq!(mode(&data), 0o700, "the data directory");
    let me = nix::unistd::getuid().as_raw();
    let mut all = Vec::new();
    entries(&data, &mut all);
    let ledger = data.join("gate.db");
    assert!(
        all.iter().any(|(p, ..)| *p == ledger),
        "the ledger's file: {all:?}"
    );
    assert!(
        std::fs::read(&ledger)
            .expect("the ledger")
            .windows(TOKEN.len())
            .any(|w| w == TOKEN.as_bytes())
            || std::fs::read(data.join("gate.db-wal"))
                .unwrap_or_default()
                .windows(TOKEN.len())
                .any(|w| w == TOKEN.as_bytes())
            || std::fs::read(data.join("gate.db-redo"))
                .unwrap_or_default()
                .windows(TOKEN.len())
                .any(|w| w == TOKEN.as_bytes()),
        "the ledger keeps the real arguments"
    );
    for (path, mode, owner) in &all {
        assert_eq!(*owner, me, "{} is not the daemon's user's", path.display());
        assert_eq!(
            mode & 0o022,
            0,
            "{} is mode {mode:o}: others may change it",
            path.display()
        );
    }
    // Loosened by hand, the directory is private again at the next start.
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    gate.kill_and_restart();
    assert_eq!(mode(&data), 0o700, "the data directory after a restart");
}

#[test]
fn redact_env_takes_variable_names_and_refuses_a_value_with_its_line() {
    let path = Path::new("gate.toml");
    let config = gate::config::Config::parse(path, "redact_env = [\"MY_TOKEN\", \"_OTHER1\"]\n")
        .expect("names");
    assert_eq!(config.redact_env, ["MY_TOKEN", "_OTHER1"]);
    let refused = gate::config::Config::parse(
        path,
        "listen = \"127.0.0.1:7431\"\nredact_env = [\"ghp_abc def\"]\n",
    )
    .expect_err("a value is no name")
    .to_string();
    assert!(
        refused.starts_with("gate.toml:2: redact_env has \"ghp_abc def\", which is not the name of an environment variable"),
        "{refused}"
    );
}

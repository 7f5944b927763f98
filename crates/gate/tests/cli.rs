//! The `gate` binary as a person meets it first: `gate init` and `gate check`.

#[path = "support/fixture.rs"]
#[allow(dead_code)] // the free port is for the daemon's tests
mod fixture;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

fn scratch(name: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "gate-cli-{}-{}-{name}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

fn gate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gate"))
        .args(args)
        .output()
        .expect("gate runs")
}

#[test]
fn init_writes_an_owner_only_example_with_a_random_token_and_never_overwrites() {
    use std::os::unix::fs::PermissionsExt as _;

    let dir = scratch("init");
    let path = dir.join("nested").join("gate.toml");
    let shown = path.to_string_lossy().into_owned();
    let first = gate(&["init", "--config", &shown]);
    assert!(first.status.success(), "{first:?}");
    let text = std::fs::read_to_string(&path).expect("written");
    assert!(!text.contains("{TOKEN}"), "the placeholder is replaced");
    let mode = std::fs::metadata(&path)
        .expect("exists")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "it holds tokens: owner only");

    let second = gate(&["init", "--config", &shown]);
    assert!(!second.status.success());
    assert!(String::from_utf8_lossy(&second.stderr).contains("already exists"));
    assert_eq!(std::fs::read_to_string(&path).expect("kept"), text);

    let other = dir.join("other.toml");
    gate(&["init", "--config", &other.to_string_lossy()]);
    assert_ne!(
        std::fs::read_to_string(&other).expect("written"),
        text,
        "each init draws its own token"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_names_the_file_and_line_of_a_typo() {
    let dir = scratch("check");
    let path = dir.join("gate.toml");
    std::fs::write(&path, "[[server]]\nname = \"files\"\ncomand = \"sh\"\n").expect("write");
    let out = gate(&["check", "--config", &path.to_string_lossy()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("{}:3: unknown field `comand`", path.display())),
        "{stderr}"
    );

    std::fs::write(&path, "[[server]]\nname = \"files\"\ncommand = \"sh\"\n").expect("write");
    let out = gate(&["check", "--config", &path.to_string_lossy()]);
    assert!(out.status.success(), "{out:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn init_under_a_permissive_umask_still_makes_its_directory_and_file_private() {
    use std::os::unix::fs::PermissionsExt as _;

    let dir = scratch("umask");
    let path = dir.join("fresh").join("gate.toml");
    let out = Command::new("sh")
        .arg("-c")
        .arg("umask 000; exec \"$0\" init --config \"$1\"")
        .arg(env!("CARGO_BIN_EXE_gate"))
        .arg(&path)
        .output()
        .expect("sh runs");
    assert!(out.status.success(), "{out:?}");
    let mode =
        |p: &std::path::Path| std::fs::metadata(p).expect("exists").permissions().mode() & 0o777;
    assert_eq!(mode(path.parent().expect("a directory")), 0o700);
    assert_eq!(mode(&path), 0o600);
    let check = gate(&["check", "--config", &path.to_string_lossy()]);
    assert!(check.status.success(), "{check:?}");
    assert!(
        check.stderr.is_empty(),
        "no warning for a private file: {check:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_refuses_a_file_others_may_write_and_warns_of_one_they_may_read() {
    use std::os::unix::fs::PermissionsExt as _;

    let dir = scratch("modes");
    let path = dir.join("gate.toml");
    let shown = path.to_string_lossy().into_owned();
    assert!(gate(&["init", "--config", &shown]).status.success());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let readable = gate(&["check", "--config", &shown]);
    assert!(readable.status.success(), "{readable:?}");
    assert!(
        String::from_utf8_lossy(&readable.stderr)
            .contains("other users may read this file (mode 644), and it holds the agents' tokens"),
        "{readable:?}"
    );
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o646)).expect("chmod");
    let writable = gate(&["check", "--config", &shown]);
    assert!(!writable.status.success());
    assert!(
        String::from_utf8_lossy(&writable.stderr)
            .contains("other users may write this file (mode 646)"),
        "{writable:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_reports_what_confines_each_stdio_server_and_refuses_paths_it_could_not_enforce() {
    use std::os::unix::fs::PermissionsExt as _;

    let dir = scratch("confine");
    let path = dir.join("gate.toml");
    let write = |server: &str| {
        std::fs::write(
            &path,
            format!(
                "[[server]]\nname = \"files\"\ncommand = \"/bin/cat\"\n{server}\n\n[[agent]]\nname = \"coder\"\ntoken = \"0123456789abcdef0123456789abcdef\"\n"
            ),
        )
        .expect("written");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    };
    let shown = path.to_string_lossy().into_owned();
    write(&format!(
        "paths = [{:?}]\nnetwork = false",
        dir.to_string_lossy()
    ));
    let checked = gate(&["check", "--config", &shown]);
    let out = String::from_utf8_lossy(&checked.stdout);
    assert!(checked.status.success(), "{checked:?}");
    assert!(
        out.contains("confinement of stdio servers on this machine:"),
        "{out}"
    );
    assert!(
        out.contains("  Landlock: "),
        "what the kernel enforces is said: {out}"
    );
    assert!(
        out.contains(&format!(
            "server \"files\": confined; writes: {}; network: no",
            dir.display()
        )),
        "{out}"
    );

    write("confine = false");
    let unconfined =
        String::from_utf8_lossy(&gate(&["check", "--config", &shown]).stdout).into_owned();
    assert!(
        unconfined.contains(
            "server \"files\" runs unconfined (confine = false): it can read this configuration"
        ),
        "{unconfined}"
    );

    write("paths = [\"notes\"]");
    let relative = gate(&["check", "--config", &shown]);
    assert!(!relative.status.success());
    assert!(
        String::from_utf8_lossy(&relative.stderr)
            .contains("paths entry \"notes\" is not an absolute path to a directory that exists"),
        "{relative:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_confined_program_reads_and_writes_its_own_files_but_not_the_gates() {
    let dir = scratch("confined");
    let gate_dir = dir.join("gate");
    let notes = dir.join("notes");
    std::fs::create_dir_all(&gate_dir).expect("gate's");
    std::fs::create_dir_all(&notes).expect("notes");
    std::fs::write(gate_dir.join("gate.toml"), "token").expect("written");
    std::fs::write(dir.join("other.txt"), "other").expect("written");
    let run = |extra: &[&str], script: &str| {
        let mut args = vec!["confine", "--deny", gate_dir.to_str().expect("utf-8")];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "/bin/sh", "-c", script]);
        let out = gate(&args);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let gate_file = gate_dir.join("gate.toml");
    let (_, read) = run(
        &[],
        &format!(
            "cat {} 2>/dev/null || echo denied; cat {}",
            gate_file.display(),
            dir.join("other.txt").display()
        ),
    );
    assert_eq!(
        read, "denied\nother",
        "the gate's file only is out of reach"
    );
    let (code, _) = run(&[], "exit 7");
    assert_eq!(code, Some(7), "the server's exit status is the launcher's");
    let only_notes = ["--write", notes.to_str().expect("utf-8")];
    let (_, wrote) = run(
        &only_notes,
        &format!(
            "echo a > {}/a && echo notes-ok; echo b > {}/b 2>/dev/null || echo elsewhere-denied",
            notes.display(),
            dir.display()
        ),
    );
    assert_eq!(wrote, "notes-ok\nelsewhere-denied\n");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn nothing_a_confined_server_started_outlives_it() {
    let dir = scratch("outlive");
    let out = gate(&[
        "confine",
        "--deny",
        dir.to_str().expect("utf-8"),
        "--",
        "/bin/sh",
        "-c",
        "sleep 60 >/dev/null 2>&1 & echo $!",
    ]);
    assert!(out.status.success(), "{out:?}");
    let pid = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(
        stat.is_empty() || stat.contains(") Z"),
        "the server's orphan {pid} was killed with it: {stat}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_servers_starts_each_server_and_says_what_it_offers_or_why_it_does_not_start() {
    use std::os::unix::fs::PermissionsExt as _;

    let dir = scratch("servers");
    let path = dir.join("gate.toml");
    let fixture = fixture::fixture_binary();
    std::fs::write(
        &path,
        format!(
            "[[server]]\nname = \"notes\"\ncommand = {fixture:?}\ntrust = \"vetted\"\n\n\
             [[server]]\nname = \"files\"\ncommand = \"/bin/sh\"\n\
             args = [\"-c\", \"echo 'Error: None of the specified directories are accessible' >&2; exit 1\"]\n\n\
             [[agent]]\nname = \"coder\"\ntoken = \"0123456789abcdef0123456789abcdef\"\n"
        ),
    )
    .expect("written");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let shown = path.to_string_lossy().into_owned();
    let data = dir.join("data").to_string_lossy().into_owned();

    let plain = gate(&["check", "--config", &shown]);
    assert!(plain.status.success(), "the file itself is fine: {plain:?}");
    assert!(
        String::from_utf8_lossy(&plain.stdout).contains("`gate check --servers` starts each"),
        "a plain check says what it did not do"
    );

    let checked = gate(&[
        "check",
        "--config",
        &shown,
        "--servers",
        "--data-dir",
        &data,
    ]);
    let out = String::from_utf8_lossy(&checked.stdout);
    assert!(
        !checked.status.success(),
        "a server that does not start fails the check"
    );
    assert!(
        out.contains("server `notes`: ok, 8 tools: 2 reads (sent at once), 6 writes (held for you), 1 of them a rule could apply"),
        "{out}"
    );
    assert!(
        out.contains("server `files`: does not start:")
            && out.contains("None of the specified directories are accessible"),
        "the server's own words say why: {out}"
    );
    assert!(
        String::from_utf8_lossy(&checked.stderr).contains("`gate serve` would not either"),
        "{checked:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

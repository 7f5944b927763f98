//! The `gate` binary as a person meets it first: `gate init` and `gate check`.

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

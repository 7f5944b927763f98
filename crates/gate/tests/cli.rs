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

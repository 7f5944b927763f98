//! The fixture MCP server binary and a free loopback port, shared by `gate`'s integration
//! tests and its benchmark (included in both with `#[path]`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The fixture server binary, a binary of gatekeeper-mcp. `cargo test --workspace` builds
/// it next to the caller's directory; when it is missing or older than its source (as after
/// `cargo test -p gate` alone), it is built here, once per process.
pub fn fixture_binary() -> PathBuf {
    static FIXTURE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    FIXTURE.get_or_init(build_fixture).clone()
}

fn modified(path: &Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn build_fixture() -> PathBuf {
    let exe = std::env::current_exe().expect("the caller knows its path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test or bench>");
    let fixture = dir.join("mcp-fixture");
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../gatekeeper-mcp");
    let sources = [
        crate_dir.join("src/bin/mcp-fixture.rs"),
        crate_dir.join("Cargo.toml"),
    ];
    let fresh = modified(&fixture).is_some_and(|built| {
        sources
            .iter()
            .all(|source| modified(source).is_some_and(|changed| changed <= built))
    });
    if !fresh {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let mut build = Command::new(cargo);
        build.args(["build", "-p", "gatekeeper-mcp", "--bin", "mcp-fixture"]);
        if dir.file_name().is_some_and(|p| p == "release") {
            build.arg("--release");
        }
        let status = build.status().expect("cargo runs");
        assert!(status.success(), "building the fixture server failed");
    }
    assert!(fixture.is_file(), "{} was not built", fixture.display());
    fixture
}

/// A port nothing listens on right now (the bridge and the fixture need a fixed one).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

//! Tidy: repository rules checked by `cargo xtask tidy` and by `cargo test`.
//!
//! Rules, each with its rationale:
//! - Every `.rs` file opens with a `//!` line. Rationale: a reader landing on any file
//!   learns what it is for (and what it refuses to do) before reading code.
//! - The dependency direction of `docs/ARCHITECTURE.md` holds, read from
//!   `cargo metadata`. Rationale: the layering is the architecture; a prose rule that no
//!   test checks drifts the first time it is inconvenient.
//! - No unfinished-work macros or ignored tests. Rationale: a stub must never be
//!   mistaken for the real thing, and a test that never runs cannot fail.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Which workspace crates each workspace crate may depend on (normal dependencies).
/// A crate missing from this table is itself a finding: add it deliberately.
const LAYERS: &[(&str, &[&str])] = &[
    ("prompt-sanitize", &[]),
    ("kernel", &[]),
    ("gatekeeper-core", &["kernel", "prompt-sanitize"]),
    (
        "gatekeeper-issues",
        &["gatekeeper-core", "kernel", "prompt-sanitize"],
    ),
    (
        "gatekeeper-confluence",
        &["gatekeeper-core", "kernel", "prompt-sanitize"],
    ),
    (
        "gatekeeper-mcp",
        &["gatekeeper-core", "kernel", "prompt-sanitize"],
    ),
    ("shell", &["kernel", "prompt-sanitize"]),
    ("store-sqlite", &["kernel", "gatekeeper-core"]),
    ("store-postgres", &["kernel", "gatekeeper-core"]),
    ("signed-decisions", &[]),
    (
        "lectures",
        &[
            "kernel",
            "prompt-sanitize",
            "gatekeeper-core",
            "gatekeeper-issues",
            "gatekeeper-confluence",
            "gatekeeper-mcp",
            "shell",
            "signed-decisions",
            "store-sqlite",
        ],
    ),
    (
        "gate",
        &[
            "kernel",
            "prompt-sanitize",
            "gatekeeper-core",
            "gatekeeper-mcp",
            "shell",
            "signed-decisions",
            "store-postgres",
            "store-sqlite",
        ],
    ),
    ("xtask", &[]),
];

/// External crates a crate must not depend on, with the reason.
const BANS: &[(&str, &[&str], &str)] = &[
    (
        "kernel",
        &[
            "rusqlite",
            "postcard",
            "postgres",
            "reqwest",
            "hyper",
            "tokio-postgres",
            "sqlx",
        ],
        "the kernel touches no storage engine or network; it knows storage only as a port",
    ),
    (
        "prompt-sanitize",
        &["tokio", "async-trait", "rusqlite", "reqwest"],
        "prompt-sanitize is pure text: no async, no I/O",
    ),
];

/// Run every check; `Err` lists each problem on its own line.
pub fn run(root: &Path) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    check_files(root, &mut problems);
    check_dependencies(root, &mut problems);
    if problems.is_empty() {
        println!("tidy: ok");
        Ok(())
    } else {
        Err(problems)
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if name.starts_with('.') || name.starts_with("target") {
                continue;
            }
            rust_files(&path, out);
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

fn check_files(root: &Path, problems: &mut Vec<String>) {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    files.sort();
    // Built from pieces so this file does not trip its own check.
    let banned = [
        concat!("todo", "!("),
        concat!("unimplemented", "!("),
        concat!("#[", "ignore"),
    ];
    for file in files {
        let shown = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .display()
            .to_string();
        let Ok(text) = fs::read_to_string(&file) else {
            problems.push(format!("{shown}: not readable as UTF-8"));
            continue;
        };
        if !text.starts_with("//!") {
            problems.push(format!(
                "{shown}: must open with a `//!` line saying what the file is for"
            ));
        }
        for needle in banned {
            if let Some(line) = text.lines().position(|l| l.contains(needle)) {
                problems.push(format!(
                    "{shown}:{}: `{needle}` must not land; finish it or remove it",
                    line + 1
                ));
            }
        }
    }
}

fn check_dependencies(root: &Path, problems: &mut Vec<String>) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root)
        .output();
    let output = match output {
        Ok(output) if output.status.success() => output,
        Ok(output) => {
            problems.push(format!(
                "cargo metadata failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ));
            return;
        }
        Err(e) => {
            problems.push(format!("could not run cargo metadata: {e}"));
            return;
        }
    };
    let metadata: Value = match serde_json::from_slice(&output.stdout) {
        Ok(value) => value,
        Err(e) => {
            problems.push(format!("cargo metadata printed unreadable JSON: {e}"));
            return;
        }
    };
    problems.extend(dependency_problems(&metadata));
}

/// The dependency-direction findings for a `cargo metadata` document.
pub fn dependency_problems(metadata: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let packages = metadata["packages"].as_array().cloned().unwrap_or_default();
    let members: Vec<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    for package in &packages {
        let Some(name) = package["name"].as_str() else {
            continue;
        };
        let Some((_, allowed)) = LAYERS.iter().find(|(crate_name, _)| *crate_name == name) else {
            problems.push(format!(
                "crate `{name}` has no place in the layering; add it to LAYERS in xtask/src/tidy.rs and to docs/ARCHITECTURE.md"
            ));
            continue;
        };
        let deps = package["dependencies"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for dep in deps {
            let normal = dep["kind"].is_null() || dep["kind"] == "normal";
            let Some(dep_name) = dep["name"].as_str() else {
                continue;
            };
            if !normal {
                continue;
            }
            if members.contains(&dep_name) && !allowed.contains(&dep_name) {
                problems.push(format!(
                    "`{name}` depends on `{dep_name}`, which breaks the layering (allowed: {allowed:?})"
                ));
            }
            for (banned_in, banned, why) in BANS {
                if *banned_in == name && banned.contains(&dep_name) {
                    problems.push(format!("`{name}` depends on `{dep_name}`: {why}"));
                }
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_repository_is_tidy() {
        if let Err(problems) = run(&crate::project_root()) {
            panic!("tidy found problems:\n{}", problems.join("\n"));
        }
    }

    #[test]
    fn a_kernel_that_names_a_driver_or_a_storage_engine_is_caught() {
        let metadata = json!({"packages": [
            {"name": "kernel", "dependencies": [
                {"name": "gatekeeper-issues", "kind": null},
                {"name": "rusqlite", "kind": null},
                {"name": "proptest", "kind": "dev"}
            ]},
            {"name": "gatekeeper-issues", "dependencies": []}
        ]});
        let problems = dependency_problems(&metadata);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("`kernel` depends on `gatekeeper-issues`"));
        assert!(problems[1].contains("`kernel` depends on `rusqlite`"));
    }

    #[test]
    fn an_unplaced_crate_is_caught() {
        let metadata = json!({"packages": [{"name": "surprise", "dependencies": []}]});
        let problems = dependency_problems(&metadata);
        assert!(problems[0].contains("crate `surprise` has no place"));
    }
}

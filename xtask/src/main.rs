//! Project automation, reached through `cargo xtask`: lectures, tidy checks, the end-to-end
//! run against real MCP servers, and CI.
//!
//! Kept deliberately small: it shells out to cargo for the heavy lifting, so the
//! workspace's crates never depend on it and it depends on almost nothing.

mod e2e;
mod tidy;

use std::env;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

const HELP: &str = "\
cargo xtask <task>

Tasks:
  lecture <name>|all|--list [--interactive] [--db PATH]
                 run a lecture (ex01..ex18), all of them in order, or list them
  lecture ledger --db PATH [--limit N] [--before ID] [--check]
                 read a database a run left, read-only: a page of its ledger, most
                 recent first, and its open actions; or its full integrity check
  tidy           check file headers and the crate dependency direction
  e2e [--transcript] [--conformance]
                 gate in front of real MCP servers (npm) and a real MCP client (Python),
                 then the official MCP conformance suite directly and through gate
                 (--conformance: only the suite): needs node/npm and python3; installs
                 the rest into target/e2e
  ci             what CI runs: fmt --check, clippy -D warnings, tests, e2e
";

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let Some(task) = args.first() else {
        print!("{HELP}");
        return ExitCode::SUCCESS;
    };
    let rest = &args[1..];
    let result = match task.as_str() {
        "lecture" | "lectures" => lecture(rest),
        "tidy" => tidy::run(&project_root()).map_err(|problems| problems.join("\n")),
        "e2e" => e2e::run(rest),
        "ci" => ci(),
        "help" | "--help" | "-h" => {
            print!("{HELP}");
            Ok(())
        }
        other => Err(format!("unknown task {other:?}\n\n{HELP}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            // An empty message: the failing child has already said what went wrong.
            if !message.is_empty() {
                eprintln!("{message}");
            }
            ExitCode::FAILURE
        }
    }
}

/// The workspace root: the parent of this crate's directory.
pub(crate) fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

fn cargo() -> Command {
    let mut command = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()));
    command.current_dir(project_root());
    command
}

fn run(mut command: Command) -> Result<(), String> {
    let status = command
        .status()
        .map_err(|e| format!("could not start {command:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{command:?} failed ({status})"))
    }
}

fn lecture(args: &[String]) -> Result<(), String> {
    let binary = build_lecture_runner()?;
    let mut command = Command::new(binary);
    command.current_dir(project_root()).args(args);
    // The lecture binary prints its own errors (e.g. the list of valid names).
    let status = command
        .status()
        .map_err(|e| format!("could not start the lecture runner: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(String::new())
    }
}

/// Builds the lecture runner and returns the path of its executable.
///
/// It is built in the dev profile, the one `cargo test --workspace` builds libraries and
/// binaries in, so the README's two commands share one build as far as cargo allows: the
/// dependencies (SQLite's C sources among them) compiled for the lecture are reused by the
/// tests. Cargo still compiles the workspace's crates and a few dependencies a second time
/// for the tests, because the tests' dev-dependencies switch on extra features (tokio's
/// `test-util`, regex features of insta and proptest) and features are unified per build.
/// The lectures need no optimizing: `all` runs in well under a second.
///
/// Cargo's progress is shown as soon as something needs compiling (a fresh clone takes
/// minutes, and silence would look like a hang); when everything is up to date nothing is
/// printed, so a lecture's transcript starts on the first line.
fn build_lecture_runner() -> Result<PathBuf, String> {
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;

    let mut command = cargo();
    command
        .args(["build", "--package", "lectures", "--bin", "lectures"])
        .args(["--message-format", "json-render-diagnostics"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .map_err(|e| format!("could not start cargo to build the lectures: {e}"))?;
    let stderr = child.stderr.take().expect("stderr is piped");
    let progress = std::thread::spawn(move || {
        let mut held = Vec::new();
        let mut showing = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if !showing && line.trim_start().starts_with("Compiling") {
                showing = true;
                let mut err = std::io::stderr().lock();
                for earlier in held.drain(..) {
                    let _ = writeln!(err, "{earlier}");
                }
            }
            if showing {
                let _ = writeln!(std::io::stderr().lock(), "{line}");
            } else {
                held.push(line);
            }
        }
        held
    });
    let mut executable = None;
    let stdout = child.stdout.take().expect("stdout is piped");
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if message["reason"] == "compiler-artifact"
            && message["target"]["name"] == "lectures"
            && let Some(path) = message["executable"].as_str()
        {
            executable = Some(PathBuf::from(path));
        }
    }
    let status = child
        .wait()
        .map_err(|e| format!("cargo did not finish building the lectures: {e}"))?;
    let held = progress.join().unwrap_or_default();
    if !status.success() {
        // Nothing was shown while nothing compiled: show what cargo said now.
        for line in held {
            eprintln!("{line}");
        }
        return Err(format!("building the lectures failed ({status})"));
    }
    executable.ok_or_else(|| "cargo built the lectures but named no executable".to_owned())
}

fn ci() -> Result<(), String> {
    // The same environment as `.ci/run`: snapshot tests never write snapshots, a changed
    // transcript fails.
    let ci_cargo = || {
        let mut command = cargo();
        command.env("CI", "true").env("INSTA_UPDATE", "no");
        command
    };
    let mut fmt = ci_cargo();
    fmt.args(["fmt", "--all", "--", "--check"]);
    run(fmt)?;
    let mut clippy = ci_cargo();
    clippy.args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]);
    run(clippy)?;
    let mut test = ci_cargo();
    test.args(["test", "--workspace"]);
    run(test)?;
    e2e::run(&[])
}

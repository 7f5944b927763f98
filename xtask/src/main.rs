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
                 run a lecture (ex01..ex11), all of them in order, or list them
  tidy           check file headers and the crate dependency direction
  e2e [--transcript]
                 gate in front of real MCP servers (npm) and a real MCP client (Python):
                 needs node/npm and python3; installs the rest into target/e2e
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
            eprintln!("{message}");
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
    let mut command = cargo();
    command.args(["run", "--quiet", "--release", "--package", "lectures", "--"]);
    command.args(args);
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

fn ci() -> Result<(), String> {
    let mut fmt = cargo();
    fmt.args(["fmt", "--all", "--", "--check"]);
    run(fmt)?;
    let mut clippy = cargo();
    clippy.args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]);
    run(clippy)?;
    let mut test = cargo();
    test.args(["test", "--workspace"]);
    run(test)?;
    e2e::run(&[])
}

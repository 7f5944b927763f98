//! The simulation part of `cargo xtask e2e` (issue 40's acceptance): a `gate serve` of its
//! own, so the main scenario's reads stay unsimulated, over the same pinned npm servers with
//! `pending = "simulate"` (`simulator = "filesystem"` and `"memory"`), driven by
//! `xtask/e2e/gate_simulate_agent.py` over streamable HTTP, which also plays the person with
//! `gate approve`. Then seed 003's pitfalls on the same servers: the script changes a file on
//! disk after the agent staged an edit of it (`gate pending` and `gate show` say STALE, `gate
//! approve` is refused, `--stale-seen` applies it), and the person rejects writes that others
//! were built on (`gate reject` flags the edit, `--cascade` rejects it, and an observation
//! of an entity whose creation is rejected). Its checks are counted with the rest.

use std::fs;
use std::path::{Path, PathBuf};

use super::{AGENT, Processes, Report, Scratch, Session, free_port, random_token, toml_string};

/// Run the part; a step after which nothing can be checked is a failed check.
pub(super) fn run(
    root: &Path,
    npm_dir: &Path,
    gate: PathBuf,
    python: &Path,
    report: &mut Report,
    processes: &mut Processes,
) {
    if let Err(why) = scenario(root, npm_dir, gate, python, report, processes) {
        report.check("the simulation run reached its end", Err(why));
    }
}

fn scenario(
    root: &Path,
    npm_dir: &Path,
    gate: PathBuf,
    python: &Path,
    report: &mut Report,
    processes: &mut Processes,
) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("gate-e2e-simulate-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    for sub in ["home", "config/gate", "data", "root/notes", "memory"] {
        fs::create_dir_all(dir.join(sub))
            .map_err(|e| format!("could not create {}: {e}", dir.join(sub).display()))?;
    }
    let scratch = Scratch {
        dir,
        keep: std::cell::Cell::new(false),
    };
    let files_root = scratch
        .dir
        .join("root")
        .canonicalize()
        .map_err(|e| format!("the root: {e}"))?;
    fs::write(files_root.join("notes/old.md"), "old\n")
        .map_err(|e| format!("could not seed the root: {e}"))?;
    let token = random_token()?;
    let bin = npm_dir.join("node_modules").join(".bin");
    let text = |p: &Path| toml_string(&p.to_string_lossy());
    let config = format!(
        "# Written by `cargo xtask e2e` for its simulation part.\n\
         listen = \"127.0.0.1:{port}\"\n\n\
         [[server]]\n\
         name = \"files\"\n\
         command = {files}\n\
         args = [{root}]\n\
         paths = [{root}]\n\
         trust = \"vetted\"\n\
         pending = \"simulate\"\n\
         simulator = \"filesystem\"\n\
         deadline_seconds = 30\n\n\
         [[server]]\n\
         name = \"memory\"\n\
         command = {memory}\n\
         env = {{ MEMORY_FILE_PATH = {memory_file} }}\n\
         paths = [{memory_dir}]\n\
         pending = \"simulate\"\n\
         simulator = \"memory\"\n\
         deadline_seconds = 30\n\n\
         [[agent]]\n\
         name = \"{AGENT}\"\n\
         token = \"{token}\"\n\n\
         [[agent.grant]]\n\
         server = \"files\"\n\n\
         [[agent.grant]]\n\
         server = \"memory\"\n",
        port = free_port()?,
        files = text(&bin.join("mcp-server-filesystem")),
        root = text(&files_root),
        memory = text(&bin.join("mcp-server-memory")),
        memory_file = text(&scratch.dir.join("memory").join("memory.jsonl")),
        memory_dir = text(&scratch.dir.join("memory")),
    );
    let path = scratch.dir.join("config/gate/gate.toml");
    fs::write(&path, config).map_err(|e| format!("could not write {}: {e}", path.display()))?;
    let session = Session {
        scratch: &scratch,
        npm_dir: npm_dir.to_owned(),
        gate,
        token,
    };
    let url = match session.serve(processes) {
        Ok(url) => url,
        Err(why) => {
            scratch.keep();
            return Err(format!(
                "gate serve did not start with pending = \"simulate\": {why}\n{}",
                super::tail(&scratch.serve_log(), 30)
            ));
        }
    };
    let mut command = std::process::Command::new(python);
    command
        .arg(
            root.join("xtask")
                .join("e2e")
                .join("gate_simulate_agent.py"),
        )
        .arg("--gate")
        .arg(&session.gate)
        .args(["--url", &url, "--token", &session.token])
        .arg("--root")
        .arg(&files_root);
    let failed_before = report.failed;
    let finished = session.script(command, "simulate-agent.log", processes, report);
    if let Err(why) = finished {
        report.check("the simulation agent finishes", Err(why));
    }
    let stopped = processes.stop_serve();
    report.check(
        "the simulation run's gate serve exits on SIGTERM and its servers with it",
        stopped.map(|()| String::new()),
    );
    if report.failed > failed_before {
        scratch.keep();
        eprintln!(
            "e2e: the simulation run's logs are kept in {} (serve.log, simulate-agent.log)",
            scratch.dir.display()
        );
    }
    Ok(())
}

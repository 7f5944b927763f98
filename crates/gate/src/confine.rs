//! Confining stdio servers: each runs under `gate confine`, which keeps the gate's own
//! files (its configuration, its data directory) out of the server's reach with Linux
//! Landlock, keeps every process the server starts beneath it, and lets the daemon refuse
//! those processes at the person's socket.
//!
//! Two stages, both this binary. The *launcher* (`gate confine … -- PROGRAM ARGS`) is not
//! confined: it makes itself a child subreaper, starts the *inside* stage, reaps whatever
//! ends beneath it, and when the server ends (or the daemon asks it to stop) kills
//! everything still below it, so no descendant outlives its server. The *inside* stage
//! asks to be killed with its launcher, restricts itself (Landlock: every path readable
//! and writable but the gate's own; no signals or ptrace out of its domain, which keeps
//! `/proc/<daemon>/environ` shut; optionally writes only beneath the server's `paths` and
//! no TCP), then becomes the server (`exec`). A Landlock domain cannot be left, and every
//! process the server starts inherits it.
//!
//! At the person's socket the daemon walks the peer's parents
//! (`gatekeeper_mcp::confine::started_by_this_process`): a process the daemon started, at
//! any depth, never decides. What a confinement allows and how it is enforced is
//! `gatekeeper_mcp::confine`; this file is the two stages of the `gate confine` command.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

use gatekeeper_mcp::confine::{Confinement, drop_capabilities, processes, restrict};
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpid, getppid};

/// Run the launcher: start the inside stage with `inside_args` (the same confinement,
/// marked inside), reap everything beneath, and end with the server's own exit status.
/// Never returns.
pub fn launch(inside_args: Vec<OsString>) -> ! {
    let signals = launcher_signals();
    // Its server may read the /proc entries of processes of its user that are dumpable:
    // this one is not.
    if let Err(error) = nix::sys::prctl::set_dumpable(false) {
        fail(&format!(
            "could not make the launcher non-dumpable: {error}"
        ));
    }
    if let Err(error) = nix::sys::prctl::set_child_subreaper(true) {
        fail(&format!("could not become a child subreaper: {error}"));
    }
    if let Err(error) = signals.thread_block() {
        fail(&format!("could not block signals: {error}"));
    }
    let exe = std::env::current_exe()
        .unwrap_or_else(|error| fail(&format!("could not find the gate binary: {error}")));
    #[expect(
        clippy::zombie_processes,
        reason = "every child is reaped by `reap`'s waitpid(-1), the server among them"
    )]
    let child = Command::new(exe)
        .arg("confine")
        .arg("--inside")
        .arg(getpid().as_raw().to_string())
        .args(inside_args)
        .spawn()
        .unwrap_or_else(|error| fail(&format!("could not start the confined stage: {error}")));
    let server = Pid::from_raw(child.id() as i32);
    loop {
        match signals.wait() {
            Ok(Signal::SIGCHLD) => {
                if let Some(status) = reap(server) {
                    kill_beneath();
                    std::process::exit(status);
                }
            }
            Ok(signal) => {
                kill_beneath();
                std::process::exit(128 + signal as i32);
            }
            Err(error) => fail(&format!("waiting for signals failed: {error}")),
        }
    }
}

fn launcher_signals() -> nix::sys::signal::SigSet {
    let mut set = nix::sys::signal::SigSet::empty();
    for signal in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
    ] {
        set.add(signal);
    }
    set
}

/// Reap every child that has ended; the server's exit status once it is among them.
fn reap(server: Pid) -> Option<i32> {
    let mut ended = None;
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == server => ended = Some(code),
            Ok(WaitStatus::Signaled(pid, signal, _)) if pid == server => {
                ended = Some(128 + signal as i32);
            }
            Ok(WaitStatus::StillAlive) | Err(_) => return ended,
            Ok(_) => {}
        }
    }
}

/// Kill every process beneath this one (orphans of the server land here, as this process
/// is their subreaper) and reap them, for at most two seconds.
fn kill_beneath() {
    let me = getpid().as_raw();
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        let children: Vec<i32> = processes()
            .filter(|&(_, parent)| parent == me)
            .map(|(pid, _)| pid)
            .collect();
        for pid in &children {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => break,
                Err(_) if children.is_empty() => return,
                Err(_) => break,
                Ok(_) => {}
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Run the inside stage: die with the launcher `launcher`, restrict this process, then
/// become `program`. Never returns.
pub fn inside(
    launcher: i32,
    confinement: &Confinement,
    program: &OsString,
    args: &[OsString],
) -> ! {
    if let Err(error) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
        fail(&format!("could not ask to end with the launcher: {error}"));
    }
    if getppid().as_raw() != launcher {
        // The launcher ended before the request above took effect.
        std::process::exit(1);
    }
    if let Err(error) = nix::sys::signal::SigSet::empty().thread_set_mask() {
        fail(&format!("could not unblock signals: {error}"));
    }
    if let Err(error) = restrict(confinement) {
        fail(&format!("could not confine {program:?}: {error}"));
    }
    if let Err(error) = drop_capabilities() {
        fail(&format!(
            "could not drop {program:?}'s capabilities: {error}"
        ));
    }
    let error = Command::new(program).args(args).exec();
    fail(&format!(
        "could not start {program:?}: {error}; check the command and that it is installed"
    ))
}

fn fail(message: &str) -> ! {
    eprintln!("gate confine: {message}");
    std::process::exit(127)
}

//! ex14: a downstream server runs confined, so only the person decides.
//!
//! A stdio server runs as the daemon's user. Unconfined, it could read the gate's
//! configuration (every agent's token), its ledger, and connect to the person's socket as
//! that user: a server, or an agent that steered one, would decide. The gate starts each
//! server under a Landlock domain that denies the gate's own files, and refuses at the
//! person's socket every process it started, at any depth. This lecture applies the
//! gate's real confinement (`gatekeeper_mcp::confine`) to a thread playing the server,
//! then walks a child process's parents as the socket does.

use std::io::Write;
use std::path::{Path, PathBuf};

use gatekeeper_mcp::confine::{Confinement, protections, restrict, started_by_this_process};

use crate::setup::paragraph;
use crate::{Context, Lecture, LectureFuture};

/// The lecture.
pub const LECTURE: Lecture = Lecture {
    name: "ex14",
    title: "a downstream server runs confined",
    summary: "Landlock keeps the gate's configuration and ledger out of a server's reach; the person's socket refuses whatever the daemon started",
    run,
};

fn run<'a>(cx: &'a mut Context<'_>) -> LectureFuture<'a> {
    Box::pin(body(cx))
}

/// What the server tries, and what it got: one line each.
fn attempts(scratch: &Path, port: u16) -> Vec<String> {
    let shown = |p: &Path| {
        format!(
            "<scratch>/{}",
            p.strip_prefix(scratch).unwrap_or(p).display()
        )
    };
    let read = |p: PathBuf| match std::fs::read_to_string(&p) {
        Ok(text) => format!("read {}: ok ({:?})", shown(&p), text.trim()),
        Err(e) => format!("read {}: refused ({})", shown(&p), e.kind()),
    };
    let write = |p: PathBuf| match std::fs::write(&p, "draft") {
        Ok(()) => format!("write {}: ok", shown(&p)),
        Err(e) => format!("write {}: refused ({})", shown(&p), e.kind()),
    };
    vec![
        read(scratch.join("notes/plan.md")),
        write(scratch.join("notes/next.md")),
        read(scratch.join("gate/gate.toml")),
        read(scratch.join("data/gate.db")),
        write(scratch.join("data/gate.db")),
        write(scratch.join("elsewhere.txt")),
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(_) => "connect to a TCP port on this machine: ok".to_owned(),
            Err(e) => format!(
                "connect to a TCP port on this machine: refused ({})",
                e.kind()
            ),
        },
    ]
}

async fn body(cx: &mut Context<'_>) -> anyhow::Result<()> {
    paragraph(
        cx,
        &[
            "A stdio server runs as the daemon's user. Unconfined, it reads the gate's configuration",
            "(every agent's token) and its ledger, and the person's socket takes it for the person.",
            "The gate starts every stdio server confined: a Landlock domain grants every path but the",
            "gate's own, and, with the server's `paths` and `network = false`, writes only there and no",
            "TCP; the domain cannot be left, and every process the server starts inherits it.",
        ],
    )?;
    let (_, enforced) = protections();
    if !enforced {
        anyhow::bail!(
            "this kernel does not enforce Landlock fully (Linux 6.12 or later, with landlock among its LSMs), so the lecture cannot show it; `gate check` says what it lacks"
        );
    }

    cx.section("The files")?;
    let scratch = std::env::temp_dir().join(format!("gate-ex14-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    for dir in ["gate", "data", "notes"] {
        std::fs::create_dir_all(scratch.join(dir))?;
    }
    std::fs::write(scratch.join("gate/gate.toml"), "token = \"coder-secret\"\n")?;
    std::fs::write(scratch.join("data/gate.db"), "the ledger\n")?;
    std::fs::write(scratch.join("notes/plan.md"), "step 1\n")?;
    writeln!(
        cx,
        "  <scratch>/gate/gate.toml   the gate's configuration (tokens)"
    )?;
    writeln!(
        cx,
        "  <scratch>/data/            the gate's data directory (ledger, socket)"
    )?;
    writeln!(
        cx,
        "  <scratch>/notes/           the server's own work: its `paths`"
    )?;
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    let port = listener.local_addr()?.port();

    cx.section("The server, before it is confined")?;
    let unconfined = attempts(&scratch, port);
    for line in &unconfined {
        writeln!(cx, "  {line}")?;
    }
    std::fs::remove_file(scratch.join("notes/next.md"))?;
    std::fs::remove_file(scratch.join("elsewhere.txt"))?;
    std::fs::write(scratch.join("data/gate.db"), "the ledger\n")?;

    cx.section("The same server, confined as the gate confines it")?;
    let confinement = Confinement {
        deny: vec![scratch.join("gate/gate.toml"), scratch.join("data")],
        write: Some(vec![scratch.join("notes")]),
        network: false,
    };
    let inside = scratch.clone();
    // Landlock restricts the calling thread: this thread plays the server.
    let confined = std::thread::spawn(move || {
        restrict(&confinement).map(|status| (format!("{status:?}"), attempts(&inside, port)))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the confined thread panicked"))?
    .map_err(|e| anyhow::anyhow!("could not confine: {e}"))?;
    writeln!(cx, "  Landlock: {}", confined.0)?;
    for line in &confined.1 {
        writeln!(cx, "  {line}")?;
    }
    drop(listener);

    cx.section("The person's socket asks who is behind it")?;
    let mut child = std::process::Command::new("sleep").arg("10").spawn()?;
    let child_pid = i32::try_from(child.id())?;
    let child_refused = started_by_this_process(child_pid);
    let parent_refused =
        started_by_this_process(i32::try_from(std::os::unix::process::parent_id())?);
    child.kill()?;
    child.wait()?;
    writeln!(
        cx,
        "  a process this one started (a server, or what it started): {}",
        if child_refused { "refused" } else { "answered" }
    )?;
    writeln!(
        cx,
        "  a process this one did not start (the person's terminal): {}",
        if parent_refused {
            "refused"
        } else {
            "answered"
        }
    )?;

    cx.section("Evidence")?;
    let refused = confined.1.iter().filter(|l| l.contains("refused")).count();
    let refused_unconfined = unconfined.iter().filter(|l| l.contains("refused")).count();
    cx.evidence("attempts refused unconfined", refused_unconfined)?;
    cx.evidence("attempts refused confined", refused)?;
    cx.evidence(
        "the gate's files as the gate left them",
        std::fs::read_to_string(scratch.join("data/gate.db"))?.trim(),
    )?;
    std::fs::remove_dir_all(&scratch)?;
    Ok(())
}

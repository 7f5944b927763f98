//! The lecture runner's command line: `lectures ex05 | all | --list [--interactive]
//! [--db PATH]`, and `lectures ledger --db PATH` to read a database a run left behind. People
//! run it as `cargo xtask lecture …`, so every help and error text names that command.
//!
//! Transcripts go to stdout, errors to stderr. An unknown name exits non-zero with the list
//! of valid names. `cargo xtask lecture ...` builds this binary in the dev profile, the one
//! `cargo test --workspace` shares, and runs it.
//!
//! Logging is off by default (the transcript is the output). `RUST_LOG` turns on the
//! kernel's and the drivers' `tracing` events, on stderr: `RUST_LOG=info` for every state
//! change, or a filter such as `RUST_LOG=kernel=debug,gatekeeper_core=info`. Untrusted text
//! in an event (a tool name, a service's message) is already a `«…»` label or one line.

use std::io::{self, BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use lectures::{
    Context, DbPlan, LECTURES, Lecture, LedgerPage, find, ledger_check, ledger_view_page, list,
    run_lecture, valid_names,
};
use shell::Interactive;
use tracing_subscriber::EnvFilter;

/// Run the approval-gate lectures: each shows one design decision at work.
#[derive(Debug, Parser)]
#[command(name = "lectures", bin_name = "cargo xtask lecture")]
struct Args {
    #[command(subcommand)]
    view: Option<View>,
    /// The lecture to run (ex01, ex02, ...), or `all` to run every lecture in order.
    lecture: Option<String>,
    /// List the lectures with a one-line summary each.
    #[arg(long)]
    list: bool,
    /// Play the human approver yourself: answer each pending action at the terminal
    /// instead of the lecture's script.
    #[arg(long)]
    interactive: bool,
    /// Keep each desk's ledger, rules and action stores in a new SQLite file instead of in
    /// memory: the first desk of the run uses PATH, later desks PATH.02, PATH.03, ... (desks
    /// never share a file). A file that already exists is refused, never reused or
    /// overwritten. With ex06 the restart really closes the file and opens it again.
    /// Read what a run wrote with `cargo xtask lecture ledger --db PATH`.
    #[arg(long, value_name = "PATH", global = true)]
    db: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum View {
    /// Print a page of the ledger (most recent first) and the open actions of the
    /// existing database named by `--db` (read-only: nothing is decided or sent, no file
    /// is created, write access is not needed). Works while another process is writing
    /// the file.
    Ledger {
        /// How many entries to show.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Show the entries before this id (the next page of an earlier view).
        #[arg(long, value_name = "ID")]
        before: Option<u64>,
        /// Instead, run SQLite's full integrity check of the file: it reads every page,
        /// which opening the file never does. Exits non-zero if it finds damage.
        #[arg(long)]
        check: bool,
    },
}

/// Installs the `tracing` subscriber: events to stderr, filtered by `RUST_LOG`, nothing
/// when it is unset or empty.
fn install_logging() {
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => EnvFilter::new(spec),
        _ => EnvFilter::new("off"),
    };
    // Fails only if a subscriber is already installed, and then that one logs.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .with_ansi(io::stderr().is_terminal())
        .try_init();
}

fn main() -> ExitCode {
    install_logging();
    let args = Args::parse();
    if let Some(View::Ledger {
        limit,
        before,
        check,
    }) = &args.view
    {
        let Some(db) = &args.db else {
            eprintln!("name the database to read: cargo xtask lecture ledger --db PATH");
            return ExitCode::from(2);
        };
        if args.lecture.is_some() || args.list || args.interactive {
            eprintln!(
                "`ledger` only reads a database: run it alone, as cargo xtask lecture ledger --db PATH"
            );
            return ExitCode::from(2);
        }
        let text = if *check {
            ledger_check(db)
        } else {
            ledger_view_page(
                db,
                LedgerPage {
                    before: *before,
                    limit: *limit,
                },
            )
        };
        return match text {
            Ok(text) => {
                let mut out = io::stdout().lock();
                match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(error) => {
                        eprintln!("could not write the ledger: {error}");
                        ExitCode::FAILURE
                    }
                }
            }
            Err(error) => {
                eprintln!("{error:#}");
                ExitCode::FAILURE
            }
        };
    }
    if args.list {
        print!("{}", list());
        return ExitCode::SUCCESS;
    }
    let Some(name) = args.lecture.as_deref() else {
        eprintln!("name a lecture to run: {}\n\n{}", valid_names(), list());
        return ExitCode::from(2);
    };
    let chosen: Vec<&Lecture> = if name == "all" {
        LECTURES.iter().collect()
    } else {
        match find(name) {
            Some(lecture) => vec![lecture],
            None => {
                eprintln!("unknown lecture {name:?}; valid names: {}", valid_names());
                return ExitCode::from(2);
            }
        }
    };
    let plan = args.db.as_ref().map(DbPlan::new);
    if let Some(plan) = &plan
        && let Err(error) = plan.check_free()
    {
        eprintln!("{error:#}");
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("could not start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let stdin = io::stdin();
    let mut leftovers = None;
    let result = runtime.block_on(async {
        let mut cx = if args.interactive {
            let piped = !stdin.is_terminal();
            Context::interactive(
                &mut out,
                Box::new(Interactive::new(stdin.lock()).echo(piped)),
            )
        } else {
            Context::scripted(&mut out)
        };
        if let Some(plan) = plan {
            cx = cx.with_db(plan);
        }
        for (n, lecture) in chosen.iter().enumerate() {
            if n > 0 {
                writeln!(cx)?;
            }
            if let Err(error) = run_lecture(lecture, &mut cx).await {
                leftovers = cx.db().and_then(DbPlan::leftovers_note);
                return Err(error.context(format!("lecture {} failed", lecture.name)));
            }
        }
        anyhow::Ok(())
    });
    let flushed = out.flush();
    match (result, flushed) {
        (Ok(()), Ok(())) => ExitCode::SUCCESS,
        (Err(error), _) => {
            eprintln!("{error:#}");
            if let Some(note) = leftovers {
                eprintln!("{note}");
            }
            ExitCode::FAILURE
        }
        (Ok(()), Err(error)) => {
            eprintln!("could not write the transcript: {error}");
            ExitCode::FAILURE
        }
    }
}

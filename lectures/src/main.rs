//! The lecture runner's command line: `lectures ex05 | all | --list [--interactive]`.
//!
//! Transcripts go to stdout, errors to stderr. An unknown name exits non-zero with the list
//! of valid names. `cargo xtask lecture ...` runs this binary in release mode.

use std::io::{self, BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use lectures::{Context, LECTURES, Lecture, find, list, run_lecture, valid_names};
use shell::Interactive;

/// Run the approval-gate lectures: each shows one design decision at work.
#[derive(Debug, Parser)]
#[command(name = "lectures")]
struct Args {
    /// The lecture to run (ex01, ex02, ...), or `all` to run every lecture in order.
    lecture: Option<String>,
    /// List the lectures with a one-line summary each.
    #[arg(long)]
    list: bool,
    /// Play the human approver yourself: answer each pending action at the terminal
    /// instead of the lecture's script.
    #[arg(long)]
    interactive: bool,
    /// Keep the ledger in this database file (not supported yet).
    #[arg(long, value_name = "PATH")]
    db: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(path) = &args.db {
        eprintln!(
            "--db {} is not supported yet: durable storage arrives with a later issue. Run without --db; lectures keep their ledger in memory.",
            path.display()
        );
        return ExitCode::from(2);
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
        for (n, lecture) in chosen.iter().enumerate() {
            if n > 0 {
                writeln!(cx)?;
            }
            run_lecture(lecture, &mut cx)
                .await
                .map_err(|e| e.context(format!("lecture {} failed", lecture.name)))?;
        }
        anyhow::Ok(())
    });
    let flushed = out.flush();
    match (result, flushed) {
        (Ok(()), Ok(())) => ExitCode::SUCCESS,
        (Err(error), _) => {
            eprintln!("{error:#}");
            ExitCode::FAILURE
        }
        (Ok(()), Err(error)) => {
            eprintln!("could not write the transcript: {error}");
            ExitCode::FAILURE
        }
    }
}

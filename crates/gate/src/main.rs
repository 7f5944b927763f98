//! The `gate` command: write and check a configuration, run the daemon, and decide on
//! what it holds from the person's socket.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use gate::config::{Config, EXAMPLE, TOKEN_PLACEHOLDER};
use gate::control::{self, Request};
use gate::daemon::Daemon;
use gate::paths;
use gate::person::{LedgerQuery, parse_time};

/// An MCP gateway that holds every write of an agent until a person approves it.
#[derive(Debug, Parser)]
#[command(name = "gate", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Write a commented example configuration (default: $XDG_CONFIG_HOME/gate/gate.toml).
    Init {
        /// Where to write it.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Replace an existing file.
        #[arg(long)]
        force: bool,
    },
    /// Read a configuration and report the first problem, with its line.
    Check {
        /// The file (default: $XDG_CONFIG_HOME/gate/gate.toml).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Run the daemon: agents over MCP on loopback, the person over the socket.
    Serve {
        /// The file (default: $XDG_CONFIG_HOME/gate/gate.toml).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where the ledger and the socket live (default: $XDG_DATA_HOME/gate).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// A PostgreSQL database a team's daemons share (`postgres://user@host/name`),
        /// instead of the SQLite file in the data directory; overrides `db` in the file.
        #[arg(long)]
        db: Option<String>,
    },
    /// A stdio MCP server for clients that launch their servers as subprocesses: it
    /// forwards to the running daemon as the named agent.
    Mcp {
        /// The agent, as named in the configuration (its token is read from there).
        #[arg(long)]
        agent: String,
        /// The file (default: $XDG_CONFIG_HOME/gate/gate.toml).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// The actions waiting for you.
    Pending {
        /// The daemon's data directory (default: $XDG_DATA_HOME/gate).
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    /// Each server's catalog now: tools changed, added or gone since you accepted it.
    Catalog {
        #[command(subcommand)]
        action: Option<CatalogAction>,
        /// The daemon's data directory (default: $XDG_DATA_HOME/gate).
        #[arg(long, global = true)]
        data_dir: Option<PathBuf>,
    },
    /// The approval prompt of actions.
    Show {
        /// Action ids.
        #[arg(required = true)]
        ids: Vec<u64>,
        /// Also every character of each call's arguments (a prompt shows the first 4,000).
        #[arg(long)]
        full: bool,
        /// The daemon's data directory (default: $XDG_DATA_HOME/gate).
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    /// Approve actions: each is sent to its server, at most once.
    Approve {
        /// Action ids.
        #[arg(required = true)]
        ids: Vec<u64>,
        /// Instead, let every action of the same kind apply without asking (only those its
        /// server marks safe to repeat, on a vetted server).
        #[arg(long)]
        all_of_kind: bool,
        /// You read each call's arguments in full (`gate show ID --full`): needed to approve
        /// a call whose prompt could not show them all.
        #[arg(long)]
        full_seen: bool,
        /// The daemon's data directory (default: $XDG_DATA_HOME/gate).
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    /// Reject actions: nothing is sent, ever.
    Reject {
        /// Action ids.
        #[arg(required = true)]
        ids: Vec<u64>,
        /// Told to the agent when it asks for the outcome.
        #[arg(long)]
        reason: Option<String>,
        /// The daemon's data directory (default: $XDG_DATA_HOME/gate).
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    /// Auto-approval rules: list them, enable one, remove one.
    Rules {
        #[command(subcommand)]
        command: Option<RulesCommand>,
        /// The daemon's data directory (default: $XDG_DATA_HOME/gate).
        #[arg(long, global = true)]
        data_dir: Option<PathBuf>,
    },
    /// Ask the server's driver to undo an applied action (refused where it cannot, and
    /// for a locked-down agent).
    Revert {
        /// Action id.
        id: u64,
        /// The daemon's data directory (default: $XDG_DATA_HOME/gate).
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    /// A terminal screen over all open work: approve, reject with a reason, select several,
    /// allow a kind; it updates as work arrives. Leaving decides nothing.
    Review {
        /// The daemon's data directory (default: $XDG_DATA_HOME/gate).
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    /// The ledger, most recent first, a page at a time.
    Ledger {
        /// Only this agent's entries.
        #[arg(long)]
        agent: Option<String>,
        /// Only this server's entries.
        #[arg(long)]
        server: Option<String>,
        /// Only entries in this state (pending, approved, rejected, failed, reverted,
        /// expired, or read).
        #[arg(long)]
        state: Option<String>,
        /// Only entries recorded at or after this UTC time (2026-11-30 or 2026-11-30T20:15).
        #[arg(long)]
        since: Option<String>,
        /// Only entries recorded before this UTC time.
        #[arg(long)]
        until: Option<String>,
        /// Only entries with ids below this one (the next page).
        #[arg(long)]
        before: Option<u64>,
        /// At most this many entries.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// JSON for machines: {"entries": [...], "next_before": N or null}.
        #[arg(long)]
        json: bool,
        /// The daemon's data directory (default: $XDG_DATA_HOME/gate).
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    /// Which agents are locked down; lift one once it is safe.
    Lockdown {
        #[command(subcommand)]
        command: Option<LockdownCommand>,
        /// The daemon's data directory (default: $XDG_DATA_HOME/gate).
        #[arg(long, global = true)]
        data_dir: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum RulesCommand {
    /// The rules, and the kinds a rule could cover (the default).
    List,
    /// Let actions of a kind apply without asking, when the server marks a call safe to
    /// repeat.
    Add {
        /// The server.
        server: String,
        /// The kind's tag, as `gate rules` lists it.
        tag: String,
    },
    /// Remove a rule: actions of that kind wait for you again.
    Remove {
        /// The server.
        server: String,
        /// The kind's tag.
        tag: String,
    },
}

#[derive(Debug, Subcommand)]
enum LockdownCommand {
    /// Which agents are locked down, and the lifts recorded (the default).
    Status,
    /// Lift an agent's lockdown: recorded with your user name and reason.
    Lift {
        /// The agent.
        agent: String,
        /// Why it is safe now (recorded).
        #[arg(long)]
        reason: String,
    },
}

#[derive(Debug, Subcommand)]
enum CatalogAction {
    /// Accept a server's catalog as it is now (every server's without SERVER): the gate
    /// records it, and agents can call its new and changed tools at once.
    Accept {
        /// The server, as named in the configuration.
        server: Option<String>,
    },
}

fn config_path(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    Ok(match given {
        Some(path) => path,
        None => paths::default_config()?,
    })
}

fn data_dir(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    Ok(match given {
        Some(path) => path,
        None => paths::default_data_dir()?,
    })
}

/// 24 random bytes from the operating system, as hex.
fn random_token() -> anyhow::Result<String> {
    use std::io::Read as _;
    let mut bytes = [0u8; 24];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("could not read random bytes for a token from /dev/urandom")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn init(path: PathBuf, force: bool) -> anyhow::Result<()> {
    if path.exists() && !force {
        bail!(
            "{} already exists; edit it, or pass --force to replace it with the example",
            path.display()
        );
    }
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
    // The directories it creates are the person's alone, whatever the umask: a mode asked
    // for at creation only loses bits to it.
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("could not create {}", dir.display()))?;
    }
    // It holds agents' tokens: created readable by its owner only, never wider for a
    // moment (a file being replaced with --force is narrowed first).
    if path.exists() {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("could not make {} private", path.display()))?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("could not write {}", path.display()))?;
    let example = EXAMPLE.replace(TOKEN_PLACEHOLDER, &random_token()?);
    file.write_all(example.as_bytes())?;
    println!(
        "wrote {}; edit the servers and agents, then run `gate check`",
        path.display()
    );
    Ok(())
}

async fn shutdown_signal() {
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async {
            match terminate.as_mut() {
                Some(signal) => { signal.recv().await; }
                None => std::future::pending::<()>().await,
            }
        } => {}
    }
}

async fn serve(config: PathBuf, data_dir: PathBuf, db: Option<String>) -> anyhow::Result<()> {
    let db = match db {
        Some(db) => {
            Some(gate::config::check_db_url(&db).map_err(|e| anyhow::anyhow!("--db: {e}"))?)
        }
        None => None,
    };
    let mut config = Config::load(&config)?;
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    if db.is_some() {
        config.db = db;
    }
    let daemon = Daemon::start(&config, &data_dir).await?;
    // Whoever started the daemon may stop reading its output: that is no reason to stop.
    let mut out = std::io::stdout();
    let _ = writeln!(out, "gate: agents at {}", daemon.url()?);
    let _ = writeln!(
        out,
        "gate: the person's socket at {}",
        daemon.socket().display()
    );
    let _ = out.flush();
    daemon
        .serve(shutdown_signal(), std::time::Duration::from_secs(3))
        .await?;
    Ok(())
}

fn ask(data_dir: Option<PathBuf>, request: &Request) -> anyhow::Result<()> {
    let socket = paths::socket_in(&self::data_dir(data_dir)?);
    let response = control::request(&socket, request)?;
    println!("{}", response.text);
    if !response.ok {
        std::process::exit(1);
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Init { config, force } => init(config_path(config)?, force),
        Command::Check { config } => {
            let path = config_path(config)?;
            let config = Config::load(&path)?;
            for warning in &config.warnings {
                eprintln!("warning: {warning}");
            }
            println!(
                "{}: ok ({} servers, {} agents)",
                path.display(),
                config.servers.len(),
                config.agents.len()
            );
            Ok(())
        }
        Command::Serve {
            config,
            data_dir,
            db,
        } => {
            tracing_subscriber::fmt()
                .with_env_filter(
                    // rmcp logs every notification's payload at info: a server's text
                    // (its log messages, its instructions) must not reach the gate's log
                    // in full, so its own lines stop at warnings unless RUST_LOG says.
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| "info,rmcp=warn".into()),
                )
                // Colours only for a terminal: a log file holds no escape sequences.
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_writer(std::io::stderr)
                .init();
            let config = config_path(config)?;
            let data_dir = self::data_dir(data_dir)?;
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(serve(config, data_dir, db))
        }
        Command::Mcp { agent, config } => {
            // Stdout carries the MCP stream: logs go to stderr, warnings only.
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| "warn".into()),
                )
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_writer(std::io::stderr)
                .init();
            let config = Config::load(&config_path(config)?)?;
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(gate::bridge::run(&config, &agent))?;
            Ok(())
        }
        Command::Pending { data_dir } => ask(data_dir, &Request::Pending),
        Command::Catalog {
            action: None,
            data_dir,
        } => ask(data_dir, &Request::Catalog),
        Command::Catalog {
            action: Some(CatalogAction::Accept { server }),
            data_dir,
        } => ask(data_dir, &Request::CatalogAccept { server }),
        Command::Show {
            ids,
            full,
            data_dir,
        } => ask(data_dir, &Request::Show { ids, full }),
        Command::Approve {
            ids,
            all_of_kind,
            full_seen,
            data_dir,
        } => ask(
            data_dir,
            &Request::Approve {
                ids,
                all_of_kind,
                full_seen,
            },
        ),
        Command::Reject {
            ids,
            reason,
            data_dir,
        } => ask(data_dir, &Request::Reject { ids, reason }),
        Command::Rules { command, data_dir } => ask(
            data_dir,
            &match command.unwrap_or(RulesCommand::List) {
                RulesCommand::List => Request::Rules,
                RulesCommand::Add { server, tag } => Request::RuleAdd { server, tag },
                RulesCommand::Remove { server, tag } => Request::RuleRemove { server, tag },
            },
        ),
        Command::Revert { id, data_dir } => ask(data_dir, &Request::Revert { id }),
        Command::Ledger {
            agent,
            server,
            state,
            since,
            until,
            before,
            limit,
            json,
            data_dir,
        } => {
            let time = |t: Option<String>| -> anyhow::Result<Option<u64>> {
                t.map(|t| parse_time(&t).map_err(anyhow::Error::msg))
                    .transpose()
            };
            let query = LedgerQuery {
                agent,
                server,
                state,
                since: time(since)?,
                until: time(until)?,
                before,
                limit,
                json,
            };
            ask(data_dir, &Request::Ledger { query })
        }
        Command::Lockdown { command, data_dir } => ask(
            data_dir,
            &match command.unwrap_or(LockdownCommand::Status) {
                LockdownCommand::Status => Request::Lockdown,
                LockdownCommand::Lift { agent, reason } => Request::LockdownLift { agent, reason },
            },
        ),
        Command::Review { data_dir } => {
            gate::review::run(&paths::socket_in(&self::data_dir(data_dir)?))
        }
    }
}

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
    /// Each server's catalog now: tools changed, added or gone since the gate started.
    Catalog {
        /// The daemon's data directory (default: $XDG_DATA_HOME/gate).
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    /// The approval prompt of actions.
    Show {
        /// Action ids.
        #[arg(required = true)]
        ids: Vec<u64>,
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
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("could not create {}", dir.display()))?;
    }
    let mut file = std::fs::File::create(&path)
        .with_context(|| format!("could not write {}", path.display()))?;
    {
        use std::os::unix::fs::PermissionsExt as _;
        // It holds agents' tokens.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
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

/// Who is deciding: the login name, as the ledger records it.
fn person() -> String {
    std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "person".to_owned())
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
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| "info".into()),
                )
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
        Command::Catalog { data_dir } => ask(data_dir, &Request::Catalog),
        Command::Show { ids, data_dir } => ask(data_dir, &Request::Show { ids }),
        Command::Approve {
            ids,
            all_of_kind,
            data_dir,
        } => ask(
            data_dir,
            &Request::Approve {
                ids,
                all_of_kind,
                person: person(),
            },
        ),
        Command::Reject {
            ids,
            reason,
            data_dir,
        } => ask(
            data_dir,
            &Request::Reject {
                ids,
                reason,
                person: person(),
            },
        ),
    }
}

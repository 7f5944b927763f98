//! The `gate` command: write a configuration, and (in later steps) run the daemon and
//! decide on what it holds.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use gate::config::{Config, EXAMPLE, TOKEN_PLACEHOLDER};
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
}

fn config_path(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    Ok(match given {
        Some(path) => path,
        None => paths::default_config()?,
    })
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
    #[cfg(unix)]
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

/// 24 random bytes from the operating system, as hex.
fn random_token() -> anyhow::Result<String> {
    use std::io::Read as _;
    let mut bytes = [0u8; 24];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("could not read random bytes for a token from /dev/urandom")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
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
    }
}

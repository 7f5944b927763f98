//! The `gate` command: write and check a configuration, run the daemon, and decide on
//! what it holds from the person's socket.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use gate::config::{Config, EXAMPLE, TOKEN_PLACEHOLDER};
use gate::control::{self, Request};
use gate::daemon::Daemon;
use gate::grants::GrantScope;
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
        /// Also start each server as `gate serve` would, complete its handshake, report
        /// what it offers or why it does not start, and stop it again.
        #[arg(long)]
        servers: bool,
        /// The data directory `gate serve` uses (with --servers: the servers are kept out
        /// of it as they are when served).
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    /// Run a stdio server confined (the daemon starts each of its servers this way).
    #[command(hide = true)]
    Confine {
        /// The launcher's pid: this process is the inside stage.
        #[arg(long)]
        inside: Option<i32>,
        /// A file or directory the server may neither read nor write.
        #[arg(long)]
        deny: Vec<PathBuf>,
        /// A directory the server may write beneath (then nowhere else).
        #[arg(long)]
        write: Vec<PathBuf>,
        /// The server may write nowhere.
        #[arg(long)]
        write_nowhere: bool,
        /// No TCP for the server.
        #[arg(long)]
        no_network: bool,
        /// The server's program and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<std::ffi::OsString>,
    },
    /// Run the daemon: agents over MCP on loopback, the person over the socket.
    Serve {
        /// The file (default: $XDG_CONFIG_HOME/gate/gate.toml).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where the ledger lives, and the person's socket unless the configuration sets
        /// `socket` (default: $XDG_DATA_HOME/gate).
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
        #[arg(
            long,
            required_unless_present = "token_file",
            conflicts_with = "token_file"
        )]
        agent: Option<String>,
        /// The file (default: $XDG_CONFIG_HOME/gate/gate.toml).
        #[arg(long, conflicts_with = "token_file")]
        config: Option<PathBuf>,
        /// Instead of --agent: a file holding only this agent's token (mode 0600, readable
        /// by the agent's user alone); no configuration is read.
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// With --token-file: the daemon's `listen` address (default: 127.0.0.1:7431).
        #[arg(long, requires = "token_file", conflicts_with = "url")]
        endpoint: Option<String>,
        /// With --token-file: the daemon's agents' URL (http://127.0.0.1:7431/mcp, or
        /// https://NAME:PORT/mcp for a daemon that serves TLS to other machines).
        #[arg(long, requires = "token_file")]
        url: Option<String>,
        /// With an https:// --url: a PEM file of the certificate (or CA) to trust besides
        /// the system's, such as the one a daemon generated (`tls/NAME.pem` in its data
        /// directory).
        #[arg(long, requires = "url")]
        ca_file: Option<PathBuf>,
    },
    /// Log the gate in to a server that asks for OAuth (`[server.oauth]`): prints the
    /// authorization page's address (and opens a browser where one exists), takes the
    /// redirect on a loopback port, keeps the tokens in the data directory.
    Login {
        /// The server, as named in the configuration.
        server: String,
        /// The file (default: $XDG_CONFIG_HOME/gate/gate.toml).
        #[arg(long)]
        config: Option<PathBuf>,
        /// The data directory `gate serve` uses (default: $XDG_DATA_HOME/gate).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Only print the address; open no browser.
        #[arg(long)]
        no_browser: bool,
        /// How long to wait for the authorization, in seconds.
        #[arg(long, default_value_t = 300)]
        wait_seconds: u64,
    },
    /// Forget the gate's tokens for a server (`gate login` makes new ones).
    Logout {
        /// The server, as named in the configuration.
        server: String,
        /// The file (default: $XDG_CONFIG_HOME/gate/gate.toml).
        #[arg(long)]
        config: Option<PathBuf>,
        /// The data directory `gate serve` uses (default: $XDG_DATA_HOME/gate).
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    /// The actions waiting for you.
    Pending {
        #[command(flatten)]
        at: SocketArgs,
    },
    /// Each server's catalog now: tools changed, added or gone since you accepted it.
    Catalog {
        #[command(subcommand)]
        action: Option<CatalogAction>,
        #[command(flatten)]
        at: SocketArgs,
    },
    /// The approval prompt of actions.
    Show {
        /// Action ids.
        #[arg(required = true)]
        ids: Vec<u64>,
        /// Also every character of each call's arguments (a prompt shows the first 4,000).
        #[arg(long)]
        full: bool,
        /// Show the secrets the view redacts (tokens, keys, passwords): the real arguments.
        #[arg(long)]
        reveal: bool,
        #[command(flatten)]
        at: SocketArgs,
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
        /// You saw that a write is STALE (`gate show ID`: what it was staged against changed
        /// since) and approve it anyway: needed to approve a stale write.
        #[arg(long)]
        stale_seen: bool,
        /// With --all-of-kind: only the calls of the agent that staged this one.
        #[arg(long, requires = "all_of_kind")]
        this_agent: bool,
        /// With --all-of-kind: only while the agent session that staged this one lasts
        /// (at most 12 hours).
        #[arg(long, requires = "all_of_kind")]
        session: bool,
        #[command(flatten)]
        grant: GrantArgs,
        /// Change the call's arguments first, in your editor ($VISUAL, $EDITOR, else vi):
        /// the edited call is checked against the tool's schema, sent instead, and recorded
        /// with the agent's (one id; the tool and server stay as they are).
        #[arg(long, conflicts_with_all = ["all_of_kind", "arguments"])]
        edit: bool,
        /// Like --edit, with the edited arguments from a file of JSON (`-` for standard
        /// input).
        #[arg(long, value_name = "FILE", conflicts_with = "all_of_kind")]
        arguments: Option<PathBuf>,
        #[command(flatten)]
        at: SocketArgs,
    },
    /// Answer the question a server asks during your approved send of an action (`gate
    /// pending` and `gate show ID` show it): accept with the answer it asks for, decline
    /// or cancel.
    #[command(group(clap::ArgGroup::new("answer").required(true).args(["accept", "decline", "cancel"])))]
    Answer {
        /// Action id.
        id: u64,
        /// Accept, with the answer as a JSON object (`--accept '{"name": "Ada"}'`); alone
        /// for a question that only asks you to visit an address.
        #[arg(long, num_args = 0..=1, value_name = "JSON")]
        accept: Option<Option<String>>,
        /// Decline: the server is told you said no.
        #[arg(long)]
        decline: bool,
        /// Cancel: the server is told you dismissed the question.
        #[arg(long)]
        cancel: bool,
        #[command(flatten)]
        at: SocketArgs,
    },
    /// Reject actions: nothing is sent, ever.
    Reject {
        /// Action ids.
        #[arg(required = true)]
        ids: Vec<u64>,
        /// Told to the agent when it asks for the outcome.
        #[arg(long)]
        reason: Option<String>,
        /// Also reject the pending writes built on each one (an edit of the file it writes,
        /// a move of it, an observation of an entity it creates: `gate show` lists them as
        /// "built on #N"); without it they are flagged and left for you.
        #[arg(long)]
        cascade: bool,
        #[command(flatten)]
        at: SocketArgs,
    },
    /// Auto-approval rules: list them, enable one, remove one.
    Rules {
        #[command(subcommand)]
        command: Option<RulesCommand>,
        #[command(flatten)]
        at: SocketArgs,
    },
    /// Ask the server's driver to undo an applied action (refused where it cannot, and
    /// for a locked-down agent).
    Revert {
        /// Action id.
        id: u64,
        #[command(flatten)]
        at: SocketArgs,
    },
    /// A terminal screen over all open work: approve, reject with a reason, select several,
    /// allow a kind; it updates as work arrives. Leaving decides nothing.
    Review {
        #[command(flatten)]
        at: SocketArgs,
    },
    /// Pair a device with the review page: prints a one-time link (and its QR code) to
    /// open on it; the device creates a passkey and decides as you.
    Pair {
        /// The device's name (`phone`), shown in the ledger with every decision it signs.
        #[arg(long)]
        name: String,
        #[command(flatten)]
        at: SocketArgs,
    },
    /// The devices paired with the review page; `gate devices revoke NAME` revokes one.
    Devices {
        #[command(subcommand)]
        command: Option<DevicesCommand>,
        #[command(flatten)]
        at: SocketArgs,
    },
    /// The ledger, most recent first, a page at a time; `gate ledger verify` checks every
    /// decision signed on the review page.
    #[command(args_conflicts_with_subcommands = true)]
    Ledger {
        #[command(subcommand)]
        command: Option<LedgerCommand>,
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
        /// JSON for machines: {"entries": [...], "next_before": N or null, "revealed": bool}.
        #[arg(long)]
        json: bool,
        /// Show the secrets the view redacts: the ledger as recorded.
        #[arg(long)]
        reveal: bool,
        #[command(flatten)]
        at: SocketArgs,
    },
    /// Which agents are locked down; lift one once it is safe.
    Lockdown {
        #[command(subcommand)]
        command: Option<LockdownCommand>,
        #[command(flatten)]
        at: SocketArgs,
    },
}

#[derive(Debug, Subcommand)]
enum RulesCommand {
    /// The rules, and the kinds a rule could cover (the default).
    List,
    /// Let calls of a tool apply without asking (a vetted server must mark it safe to
    /// repeat): name it as your agents call it (`files__write_file`), or by its server and
    /// its name (`files write_file`).
    Add {
        /// The tool's name, or its server and its name.
        #[arg(required = true, num_args = 1..=2)]
        name: Vec<String>,
        /// Only this agent's calls.
        #[arg(long)]
        agent: Option<String>,
        #[command(flatten)]
        grant: GrantArgs,
    },
    /// Whether a rule would apply a recorded action, and why, part by part: the rule
    /// enabled for its tool, or one narrowed by the tests given here.
    Test {
        /// The action's id.
        id: u64,
        #[command(flatten)]
        grant: GrantArgs,
    },
    /// Remove a rule: calls of that tool wait for you again.
    Remove {
        /// The tool's name, or its server and its name.
        #[arg(required = true, num_args = 1..=2)]
        name: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
enum DevicesCommand {
    /// List them (the default).
    List,
    /// Revoke one: its passkey signs nothing from now on, and its pages are signed out.
    Revoke {
        /// The device's name.
        name: String,
    },
}

#[derive(Debug, Subcommand)]
enum LedgerCommand {
    /// Check every decision signed on the review page against the registered passkeys:
    /// the signature, and that it signed the decision and the calls' digests recorded.
    /// Reads the data directory's files (--data-dir, default $XDG_DATA_HOME/gate); the
    /// daemon need not run.
    Verify,
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
        /// Only this tool of the server (as the server names it): the rest stays as
        /// accepted.
        #[arg(requires = "server")]
        tool: Option<String>,
    },
}

/// `gate check`: for each server reached with OAuth, whether the gate is logged in and
/// when its access token expires.
fn check_logins(config: &Config, data_dir: &Path) {
    for server in &config.servers {
        if let gate::config::Transport::Http {
            url,
            oauth: Some(_),
            ..
        } = &server.transport
        {
            let file = gate::daemon::token_file(data_dir, &server.name);
            let line = gatekeeper_mcp::oauth::LoginState::read(&file, url)
                .map(|state| state.describe(&server.name))
                .unwrap_or_else(|why| why);
            println!("server {:?}: OAuth: {line}", server.name);
        }
    }
}

/// The server named `name` of `config`, if it is reached with OAuth: its URL, its CA file
/// and its OAuth settings (the token file in `data_dir`).
fn oauth_server(
    config: &Config,
    data_dir: &Path,
    name: &str,
) -> anyhow::Result<(String, Option<PathBuf>, gatekeeper_mcp::OAuthSettings)> {
    let Some(server) = config.servers.iter().find(|s| s.name == name) else {
        anyhow::bail!(
            "{} names no server {name:?}; the servers are: {}",
            config.path.display(),
            config
                .servers
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    };
    let gate::config::Transport::Http {
        url,
        ca_file,
        oauth: Some(oauth),
        ..
    } = &server.transport
    else {
        anyhow::bail!(
            "server {name:?} is not reached with OAuth; give it an `oauth = {{}}` (or a [server.oauth] table) in {} to log in to it",
            config.path.display()
        );
    };
    let settings = gate::daemon::oauth_settings(name, oauth, data_dir)
        .map_err(|e| anyhow::anyhow!(e.to_string()))?;
    Ok((url.clone(), ca_file.clone(), settings))
}

/// `gate login SERVER`.
fn login(
    config: &Path,
    data_dir: &Path,
    name: &str,
    browser: bool,
    wait: Duration,
) -> anyhow::Result<()> {
    let config = Config::load(config)?;
    let (url, ca_file, settings) = oauth_server(&config, data_dir, name)?;
    let runtime = tokio::runtime::Runtime::new()?;
    let logged_in = runtime
        .block_on(gatekeeper_mcp::oauth::login(
            name,
            &url,
            ca_file.as_deref(),
            &settings,
            wait,
            |address| {
                println!(
                    "Open this address to let the gate reach {name} (waiting up to {} s):",
                    wait.as_secs()
                );
                println!("  {address}");
                if browser {
                    open_browser(address);
                }
            },
        ))
        .map_err(anyhow::Error::msg)?;
    println!(
        "logged in to {name} at {} ({}); {}",
        logged_in.issuer,
        logged_in.registration,
        logged_in.state.describe(name)
    );
    println!(
        "the tokens are in {} (readable by this user only); a running `gate serve` uses them at its next call",
        settings.token_file.display()
    );
    Ok(())
}

/// Open `address` in the person's browser where there is one: `$BROWSER`, else
/// `xdg-open` on a desktop. Nothing happens otherwise; the address is printed anyway.
fn open_browser(address: &str) {
    let program = match std::env::var("BROWSER") {
        Ok(browser) if !browser.trim().is_empty() => browser,
        _ if std::env::var_os("DISPLAY").is_some()
            || std::env::var_os("WAYLAND_DISPLAY").is_some() =>
        {
            "xdg-open".to_owned()
        }
        _ => return,
    };
    let _ = std::process::Command::new(program)
        .arg(address)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
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

/// `gate serve`'s configuration: the file, with `--db` over its `db`.
fn serve_config(config: &Path, db: Option<String>) -> anyhow::Result<Config> {
    let db = match db {
        Some(db) => {
            Some(gate::config::check_db_url(&db).map_err(|e| anyhow::anyhow!("--db: {e}"))?)
        }
        None => None,
    };
    let mut config = Config::load(config)?;
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    if db.is_some() {
        config.db = db;
    }
    Ok(config)
}

/// The daemon's runtime.
///
/// On the SQLite file, one worker thread. A read crosses several tasks (the agent's
/// session, the gate's handler, the downstream server's session and its transport), and
/// on one thread each hop is a push onto a queue, where two workers wake each other
/// through the kernel on almost every hop: a read through the gate added 80–190 µs less
/// and took a third less processor (docs/performance.md). A write that waits for its
/// sync leaves the worker first (`block_in_place`, in store-sqlite), so agents still
/// share syncs.
///
/// On PostgreSQL, a worker per processor: that store's ports wait for their round trip
/// on the worker that called them. `TOKIO_WORKER_THREADS=N` sets the count either way.
fn daemon_runtime(config: &Config) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if config.db.is_none() && std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
        builder.worker_threads(1);
    }
    builder.enable_all().build()
}

async fn serve(config: Config, data_dir: PathBuf) -> anyhow::Result<()> {
    // Not dumpable: other processes of this user (a server run unconfined, say) cannot
    // read the daemon's memory or environment through /proc or ptrace.
    if let Err(error) = nix::sys::prctl::set_dumpable(false) {
        tracing::warn!(%error, "could not make the daemon non-dumpable");
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

/// `gate check`'s report on confinement: what this machine enforces, and which stdio
/// servers run unconfined.
fn check_confinement(config: &Config) {
    let stdio: Vec<&gate::config::ServerConfig> = config
        .servers
        .iter()
        .filter(|s| matches!(s.transport, gate::config::Transport::Stdio(_)))
        .collect();
    if stdio.is_empty() {
        return;
    }
    let (lines, complete) = gatekeeper_mcp::confine::protections();
    println!("confinement of stdio servers on this machine:");
    for line in lines {
        println!("  {line}");
    }
    for server in stdio {
        match &server.confinement {
            None => println!(
                "  server {:?} runs unconfined (confine = false): it can read this configuration, the data directory and the daemon's environment",
                server.name
            ),
            Some(c) => {
                let write = c.write.as_ref().map_or(
                    "wherever its user may, but the gate's files".to_string(),
                    |p| {
                        p.iter()
                            .map(|p| p.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    },
                );
                println!(
                    "  server {:?}: confined; writes: {write}; network: {}",
                    server.name,
                    if c.network { "yes" } else { "no" }
                );
            }
        }
    }
    if !complete {
        println!(
            "  missing protections: run `gate serve` as its own OS user (see the README) so that a server cannot reach your account's files"
        );
    }
}

/// `gate check`'s report on who may use the person's socket, and where it is.
fn check_deciders(config: &Config) {
    let socket = config.socket.as_ref().map_or_else(
        || "gate.sock in the data directory".to_owned(),
        |s| s.display().to_string(),
    );
    match &config.deciders {
        None => println!(
            "the person's socket ({socket}) is for the daemon's own user alone (no deciders)"
        ),
        Some(deciders) => {
            let mut who: Vec<String> = deciders.users().map(str::to_owned).collect();
            who.extend(deciders.groups().map(|g| format!("members of group {g}")));
            println!(
                "the person's socket ({socket}) is for: {}; the daemon's own user only if listed",
                who.join(", ")
            );
        }
    }
}

/// How far a rule reaches, beyond its tool: every test given must pass.
#[derive(Debug, clap::Args)]
struct GrantArgs {
    /// Only for this long from now: 90s, 30m, 4h or 2d (without it, until removed).
    #[arg(long = "for", value_name = "DURATION")]
    for_: Option<String>,
    /// Only calls whose argument ARG is a path at or below PATH (`--under path=/tmp/notes`).
    #[arg(long, value_name = "ARG=PATH")]
    under: Vec<String>,
    /// Only calls whose argument ARG is exactly VALUE (`--is mode=append`).
    #[arg(long, value_name = "ARG=VALUE")]
    is: Vec<String>,
    /// Only calls whose argument ARG is a number at most N, or a text of at most N bytes
    /// (`--at-most content=4096`).
    #[arg(long, value_name = "ARG=N")]
    at_most: Vec<String>,
}

impl GrantArgs {
    /// The argument tests, in the order of the flags' kinds.
    fn tests(&self) -> anyhow::Result<Vec<kernel::ArgumentTest>> {
        let mut tests = Vec::new();
        for (flag, values) in [
            ("under", &self.under),
            ("is", &self.is),
            ("at-most", &self.at_most),
        ] {
            for value in values {
                tests.push(gate::grants::parse_test(flag, value).map_err(anyhow::Error::msg)?);
            }
        }
        Ok(tests)
    }

    /// The scope the socket receives.
    fn scope(
        &self,
        agent: Option<String>,
        this_agent: bool,
        session: bool,
    ) -> anyhow::Result<GrantScope> {
        Ok(GrantScope {
            agent,
            this_agent,
            session,
            for_secs: self
                .for_
                .as_deref()
                .map(gate::grants::parse_duration)
                .transpose()
                .map_err(anyhow::Error::msg)?,
            tests: self.tests()?,
        })
    }
}

/// The arguments the person edited action `id`'s call to: from `file`, or from their
/// editor over the staged ones (`edit`); `None` when neither was asked.
fn edited_arguments(
    at: &SocketArgs,
    id: &[u64],
    edit: bool,
    file: Option<PathBuf>,
) -> anyhow::Result<Option<serde_json::Value>> {
    if !edit && file.is_none() {
        return Ok(None);
    }
    let [id] = id[..] else {
        bail!("an edit changes one call: give one action id with --edit or --arguments");
    };
    let parse = |text: &str, from: &str| {
        serde_json::from_str::<serde_json::Value>(text)
            .with_context(|| format!("{from} is not valid JSON; nothing was approved"))
    };
    if let Some(file) = file {
        let text = if file.as_os_str() == "-" {
            std::io::read_to_string(std::io::stdin()).context("could not read standard input")?
        } else {
            std::fs::read_to_string(&file)
                .with_context(|| format!("could not read {}", file.display()))?
        };
        return parse(&text, &file.display().to_string()).map(Some);
    }
    let socket = socket_path(SocketArgs {
        data_dir: at.data_dir.clone(),
        socket: at.socket.clone(),
    })?;
    gate::edits::in_editor(&socket, id).map(Some)
}

/// Where the person's commands find the daemon's socket.
#[derive(Debug, clap::Args)]
struct SocketArgs {
    /// The daemon's data directory, whose gate.sock is its socket (default:
    /// $XDG_DATA_HOME/gate).
    #[arg(long, global = true, conflicts_with = "socket")]
    data_dir: Option<PathBuf>,
    /// The daemon's socket, for a daemon whose configuration sets `socket` (default:
    /// $GATE_SOCKET, else gate.sock in the data directory).
    #[arg(long, global = true)]
    socket: Option<PathBuf>,
}

/// The socket to ask: --socket, else --data-dir's, else $GATE_SOCKET, else the default
/// data directory's.
fn socket_path(at: SocketArgs) -> anyhow::Result<PathBuf> {
    if let Some(socket) = at.socket {
        return Ok(socket);
    }
    if let Some(dir) = at.data_dir {
        return Ok(paths::socket_in(&dir));
    }
    if let Some(socket) = std::env::var_os("GATE_SOCKET").filter(|s| !s.is_empty()) {
        return Ok(PathBuf::from(socket));
    }
    Ok(paths::socket_in(&paths::default_data_dir()?))
}

fn ask(at: SocketArgs, request: &Request) -> anyhow::Result<()> {
    let socket = socket_path(at)?;
    let response = control::request(&socket, request)?;
    println!("{}", response.text);
    if !response.ok {
        std::process::exit(1);
    }
    Ok(())
}

/// `gate ledger verify`: every signed decision checked; a failure exits non-zero.
fn verify(data_dir: &std::path::Path) -> anyhow::Result<()> {
    let verified = signed_decisions::verify(data_dir).map_err(anyhow::Error::msg)?;
    for (line, why) in &verified.bad {
        println!(
            "decision on line {line} of {}: FAILED: {why}",
            signed_decisions::SIGNED_FILE
        );
    }
    println!(
        "{} decision{} signed on the review page verified, {} failed",
        verified.good,
        if verified.good == 1 { "" } else { "s" },
        verified.bad.len()
    );
    if !verified.bad.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Init { config, force } => init(config_path(config)?, force),
        Command::Check {
            config,
            servers,
            data_dir,
        } => {
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
            check_confinement(&config);
            check_deciders(&config);
            check_logins(&config, &self::data_dir(data_dir.clone())?);
            for server in &config.servers {
                if let gate::pending::PendingMode::Simulate(simulator) = &server.pending {
                    println!(
                        "server {:?}: pending = \"simulate\" with the {simulator} simulator; `gate serve` holds it to the server's tools at start and turns it off, saying why, if they differ (`gate catalog` shows it)",
                        server.name
                    );
                }
            }
            if servers {
                let data_dir = self::data_dir(data_dir)?;
                let runtime = tokio::runtime::Runtime::new()?;
                let checked = runtime.block_on(gate::daemon::check_servers(&config, &data_dir));
                let failed = checked.is_err();
                for line in checked.unwrap_or_else(|lines| lines) {
                    println!("{line}");
                }
                if failed {
                    anyhow::bail!(
                        "a server does not start, so `gate serve` would not either; fix what its line says"
                    );
                }
            } else if !config.servers.is_empty() {
                println!(
                    "(the servers were not started: `gate check --servers` starts each and says whether it runs)"
                );
            }
            Ok(())
        }
        Command::Confine {
            inside,
            deny,
            write,
            write_nowhere,
            no_network,
            command,
        } => {
            let Some(launcher) = inside else {
                gate::confine::launch(std::env::args_os().skip(2).collect());
            };
            let confinement = gatekeeper_mcp::confine::Confinement {
                deny,
                write: (write_nowhere || !write.is_empty()).then_some(write),
                network: !no_network,
            };
            let (program, args) = command.split_first().context("no program to confine")?;
            gate::confine::inside(launcher, &confinement, program, args)
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
                // Every line redacted of secrets (the configuration's, once it is read).
                .with_writer(gate::redaction::LogWriter)
                .init();
            let config = config_path(config)?;
            let data_dir = self::data_dir(data_dir)?;
            let config = serve_config(&config, db)?;
            daemon_runtime(&config)?.block_on(serve(config, data_dir))
        }
        Command::Mcp {
            agent,
            config,
            token_file,
            endpoint,
            url,
            ca_file,
        } => {
            // Stdout carries the MCP stream: logs go to stderr, warnings only.
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| "warn".into()),
                )
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_writer(gate::redaction::LogWriter)
                .init();
            // One agent's stream relayed on one thread: no hop between threads.
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            match (token_file, agent) {
                (Some(token_file), _) => {
                    let url = gate::bridge::agents_url(endpoint.as_deref(), url.as_deref())?;
                    runtime.block_on(gate::bridge::run_with_token_file(
                        &token_file,
                        &url,
                        ca_file.as_deref(),
                    ))?;
                }
                (None, Some(agent)) => {
                    let config = Config::load(&config_path(config)?)?;
                    runtime.block_on(gate::bridge::run(&config, &agent))?;
                }
                (None, None) => {
                    bail!("name the agent with --agent NAME, or give --token-file PATH")
                }
            }
            Ok(())
        }
        Command::Pending { at } => ask(at, &Request::Pending),
        Command::Catalog { action: None, at } => ask(at, &Request::Catalog),
        Command::Catalog {
            action: Some(CatalogAction::Accept { server, tool }),
            at,
        } => ask(at, &Request::CatalogAccept { server, tool }),
        Command::Show {
            ids,
            full,
            reveal,
            at,
        } => ask(at, &Request::Show { ids, full, reveal }),
        Command::Approve {
            ids,
            all_of_kind,
            full_seen,
            stale_seen,
            this_agent,
            session,
            grant,
            edit,
            arguments,
            at,
        } => {
            // A scope without --all-of-kind is refused by the daemon, which says why.
            let scope = grant.scope(None, this_agent, session)?;
            let edited = edited_arguments(&at, &ids, edit, arguments)?;
            ask(
                at,
                &Request::Approve {
                    ids,
                    all_of_kind,
                    full_seen,
                    stale_seen,
                    scope,
                    edited,
                },
            )
        }
        Command::Answer {
            id,
            accept,
            decline,
            cancel: _,
            at,
        } => {
            let (action, content) = match (accept, decline) {
                (Some(content), _) => ("accept", content),
                (None, true) => ("decline", None),
                (None, false) => ("cancel", None),
            };
            ask(
                at,
                &Request::Answer {
                    id,
                    action: action.to_owned(),
                    content,
                },
            )
        }
        Command::Reject {
            ids,
            reason,
            cascade,
            at,
        } => ask(
            at,
            &Request::Reject {
                ids,
                reason,
                cascade,
            },
        ),
        Command::Rules { command, at } => ask(
            at,
            &match command.unwrap_or(RulesCommand::List) {
                RulesCommand::List => Request::Rules,
                RulesCommand::Add { name, agent, grant } => Request::RuleAdd {
                    name,
                    scope: grant.scope(agent, false, false)?,
                },
                RulesCommand::Test { id, grant } => {
                    if grant.for_.is_some() {
                        bail!(
                            "--for does not change whether a rule applies a recorded call; leave it out"
                        );
                    }
                    let tests = grant.tests()?;
                    Request::RuleTest {
                        id,
                        tests: (!tests.is_empty()).then_some(tests),
                    }
                }
                RulesCommand::Remove { name } => Request::RuleRemove { name },
            },
        ),
        Command::Login {
            server,
            config,
            data_dir,
            no_browser,
            wait_seconds,
        } => login(
            &config_path(config)?,
            &self::data_dir(data_dir)?,
            &server,
            !no_browser,
            Duration::from_secs(wait_seconds),
        ),
        Command::Logout {
            server,
            config,
            data_dir,
        } => {
            let config = Config::load(&config_path(config)?)?;
            let (_, _, settings) = oauth_server(&config, &self::data_dir(data_dir)?, &server)?;
            if gatekeeper_mcp::oauth::logout(&settings).map_err(anyhow::Error::msg)? {
                println!(
                    "logged out of {server}: its tokens are removed; its calls fail until `gate login {server}` (revoke the gate's access at the authorization server too, if it should end there)"
                );
            } else {
                println!("the gate was not logged in to {server}");
            }
            Ok(())
        }
        Command::Revert { id, at } => ask(at, &Request::Revert { id }),
        Command::Pair { name, at } => ask(at, &Request::Pair { name }),
        Command::Devices { command, at } => ask(
            at,
            &match command.unwrap_or(DevicesCommand::List) {
                DevicesCommand::List => Request::Devices,
                DevicesCommand::Revoke { name } => Request::DeviceRevoke { name },
            },
        ),
        Command::Ledger {
            command: Some(LedgerCommand::Verify),
            at,
            ..
        } => verify(&data_dir(at.data_dir)?),
        Command::Ledger {
            command: None,
            agent,
            server,
            state,
            since,
            until,
            before,
            limit,
            json,
            reveal,
            at,
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
                reveal,
            };
            ask(at, &Request::Ledger { query })
        }
        Command::Lockdown { command, at } => ask(
            at,
            &match command.unwrap_or(LockdownCommand::Status) {
                LockdownCommand::Status => Request::Lockdown,
                LockdownCommand::Lift { agent, reason } => Request::LockdownLift { agent, reason },
            },
        ),
        Command::Review { at } => gate::review::run(&socket_path(at)?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daemon_runs_on_one_worker_on_its_file_and_one_per_processor_on_postgres() {
        // Whoever runs the tests may have set the count for every tokio program.
        assert!(
            std::env::var_os("TOKIO_WORKER_THREADS").is_none(),
            "unset TOKIO_WORKER_THREADS to run this test: it sets the count it checks"
        );
        let file = Config::parse(Path::new("gate.toml"), "").expect("an empty configuration");
        let runtime = daemon_runtime(&file).expect("a runtime");
        assert_eq!(runtime.metrics().num_workers(), 1);

        let team = Config::parse(Path::new("gate.toml"), "db = \"postgres://gate@db/gate\"\n")
            .expect("a team configuration");
        let runtime = daemon_runtime(&team).expect("a runtime");
        let processors = std::thread::available_parallelism().map_or(1, usize::from);
        assert_eq!(runtime.metrics().num_workers(), processors);
    }
}

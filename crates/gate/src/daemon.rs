//! `gate serve`: wire one kernel, one MCP driver per downstream server and the store (the
//! SQLite file in the data directory, or a PostgreSQL database a team's daemons share)
//! into a gateway, then serve agents over HTTP and the person over the socket.
//!
//! Startup refuses, with what to do, anything it cannot honour: a server that does not
//! start or list its tools, a grant of a tool the server does not list, a sensitive read
//! that is not a read the server lists, a setting this version does not implement yet
//! (`https://` servers, since this build carries no TLS), a header whose environment
//! variable is not set. Nothing is half-configured.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gatekeeper_mcp::{Endpoint, HttpEndpoint, McpServer, McpServerConfig};
use kernel::{Clock, Overseer, SystemClock};
use prompt_sanitize::{MAX_DESCRIPTION_CHARS, MAX_INLINE_CHARS, code_span, plain_inline};
use tracing::{info, warn};

use crate::config::{Config, ServerConfig, Transport};
use crate::control;
use crate::deciders::SocketAccess;
use crate::gateway::{AgentView, Downstream, Gateway, record_catalog, recorded_catalog};
use crate::http::{self, MCP_PATH, Tokens};
use crate::lockdown::{Guarded, Latches};
use crate::notify::Notifier;
use crate::paths::{CATALOGS_DIR, DATABASE_FILE, PENDING_DIR, WORKSPACES_DIR, socket_in};

/// The store behind every port: one machine's SQLite file, or a team's PostgreSQL.
#[derive(Clone)]
enum Store {
    Sqlite(store_sqlite::Database),
    Postgres(store_postgres::Database),
}

impl Store {
    /// Open the store: PostgreSQL when `db` names it, else the SQLite file in `data_dir`.
    async fn open(db: Option<&str>, data_dir: &Path) -> Result<Self, StartError> {
        match db {
            Some(url) => {
                let url = url.to_owned();
                // Opening connects and may wait for another daemon's migration.
                let opened =
                    tokio::task::spawn_blocking(move || store_postgres::Database::open(&url))
                        .await
                        .map_err(|e| StartError(format!("could not open the database: {e}")))?;
                opened
                    .map(Store::Postgres)
                    .map_err(|e| StartError(format!("could not open the team's database: {e}")))
            }
            None => store_sqlite::Database::open(data_dir.join(DATABASE_FILE))
                .map(Store::Sqlite)
                .map_err(|e| {
                    StartError(format!(
                        "could not open {}: {e}",
                        data_dir.join(DATABASE_FILE).display()
                    ))
                }),
        }
    }

    fn ledger(&self) -> Arc<dyn kernel::LedgerStore> {
        match self {
            Self::Sqlite(db) => db.ledger(),
            Self::Postgres(db) => db.ledger(),
        }
    }

    async fn action_store(
        &self,
        gatekeeper: &str,
        clock: Arc<dyn Clock>,
    ) -> Result<gatekeeper_core::ActionStore, gatekeeper_core::StorageError> {
        match self {
            Self::Sqlite(db) => db.action_store(gatekeeper, clock).await,
            Self::Postgres(db) => db.action_store(gatekeeper, clock).await,
        }
    }
}

/// Wake this daemon when another daemon on the same database changed something (or the
/// connection was made again, since notifications sent meanwhile are lost): drain what
/// became eligible, for example under a rule another daemon's person enabled. Drains
/// take the database's lease, so one daemon at a time drains a gatekeeper.
fn follow_changes(db: &store_postgres::Database, overseer: Overseer) {
    let mut changes = db.changes();
    tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            // Coalesce a burst of notifications into one look.
            tokio::time::sleep(Duration::from_millis(20)).await;
            changes.borrow_and_update();
            if let Err(error) = overseer.resume() {
                warn!(%error, "store.changes: could not look for eligible work");
            }
        }
    });
}

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StartError(String);

/// A started daemon, before it serves.
pub struct Daemon {
    gateway: Arc<Gateway>,
    tokens: Tokens,
    http: tokio::net::TcpListener,
    control: tokio::net::UnixListener,
    socket: PathBuf,
    /// Who may use the person's socket.
    access: Arc<SocketAccess>,
    /// How often pending actions are checked for expiry, if any time to live is set.
    sweep: Option<Duration>,
    /// What the agents' endpoint allows.
    limits: http::HttpLimits,
    /// The review page's state and listener, when `[web]` turns it on.
    web: Option<(Arc<crate::web::Web>, tokio::net::TcpListener)>,
    /// The agents' listener's TLS, when agents reach it from other machines.
    agents_tls: Option<tokio_rustls::TlsAcceptor>,
    /// The name agents on other machines reach the gate by.
    host: Option<String>,
    /// The data directory's lock, held while the daemon lives.
    _lock: std::fs::File,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

fn create_private_dir(dir: &Path) -> Result<(), StartError> {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)))
        .map_err(|e| {
            StartError(format!(
                "could not create the data directory {}: {e}; pass another --data-dir",
                dir.display()
            ))
        })
}

/// How to reach a configured server; an HTTP server's header values are read from the
/// environment here, and never written anywhere.
/// A stdio server runs confined (`confine.rs`) unless its configuration says otherwise:
/// the configuration file and `data_dir` out of its reach.
fn endpoint(
    server: &ServerConfig,
    config: &Config,
    data_dir: &Path,
) -> Result<Endpoint, StartError> {
    match &server.transport {
        Transport::Stdio(command) => {
            let Some(confinement) = &server.confinement else {
                return Ok(Endpoint::Stdio(command.clone()));
            };
            let gate = std::env::current_exe().map_err(|e| {
                StartError(format!(
                    "server {:?}: could not find the gate binary to confine it with: {e}",
                    server.name
                ))
            })?;
            let confinement = gatekeeper_mcp::confine::Confinement {
                deny: vec![config.path.clone(), data_dir.to_path_buf()],
                write: confinement.write.clone(),
                network: confinement.network,
            };
            Ok(Endpoint::Stdio(command.clone().through(
                gate.display().to_string(),
                confinement.launcher_args(),
            )))
        }
        Transport::Http {
            url,
            headers_from_env,
            ca_file,
            oauth,
        } => {
            let mut headers = Vec::new();
            for (name, variable) in headers_from_env {
                let value = std::env::var(variable).map_err(|_| {
                    StartError(format!(
                        "server {:?}: header {name} takes its value from ${variable}, which is not set; set it in the environment of `gate serve`",
                        server.name
                    ))
                })?;
                headers.push((name.clone(), value));
            }
            Ok(Endpoint::Http(HttpEndpoint {
                url: url.clone(),
                headers,
                ca_file: ca_file.clone(),
                oauth: oauth
                    .as_ref()
                    .map(|o| oauth_settings(&server.name, o, data_dir))
                    .transpose()?,
            }))
        }
    }
}

/// Where the tokens of `server`'s login live: `oauth/<server>.json` in the data directory
/// (0600 in a 0700 directory; stdio servers are confined away from the data directory).
pub fn token_file(data_dir: &Path, server: &str) -> PathBuf {
    data_dir.join("oauth").join(format!("{server}.json"))
}

/// `[server.oauth]` as the driver takes it: the token file, and the client secret read
/// from its variable.
pub fn oauth_settings(
    server: &str,
    oauth: &crate::config::OAuthConfig,
    data_dir: &Path,
) -> Result<gatekeeper_mcp::OAuthSettings, StartError> {
    let client_secret = match &oauth.client_secret_env {
        Some(variable) => Some(std::env::var(variable).map_err(|_| {
            StartError(format!(
                "server {server:?}: the client secret comes from ${variable}, which is not set; set it in the environment of the gate"
            ))
        })?),
        None => None,
    };
    Ok(gatekeeper_mcp::OAuthSettings {
        token_file: token_file(data_dir, server),
        client_id: oauth.client_id.clone(),
        client_secret,
        client_metadata_url: oauth.client_metadata_url.clone(),
        scopes: oauth.scopes.clone(),
        client_credentials: oauth.grant == crate::config::OAuthGrant::ClientCredentials,
        private_key: oauth
            .private_key_file
            .as_ref()
            .map(|file| {
                std::fs::read_to_string(file).map_err(|e| {
                    StartError(format!(
                        "server {server:?}: the private key {} cannot be read ({e}); give the PEM file of the gate's signing key",
                        file.display()
                    ))
                })
            })
            .transpose()?,
    })
}

/// The person's limits on staging, counted from the ledger's last hour ([`crate::quotas`]);
/// the ledger is read only when a limit is set.
fn quotas(config: &Config, overseer: &Overseer) -> Result<crate::quotas::Quotas, StartError> {
    let agents: Vec<(String, crate::quotas::AgentLimits)> = config
        .agents
        .iter()
        .map(|a| {
            let limits = crate::quotas::AgentLimits {
                open: a.max_open_actions,
                per_hour: a.max_writes_per_hour,
            };
            (a.name.clone(), limits)
        })
        .collect();
    let servers: Vec<(String, usize)> = config
        .servers
        .iter()
        .filter_map(|s| Some((s.name.clone(), s.max_writes_per_hour?)))
        .collect();
    let limited = !servers.is_empty() || agents.iter().any(|(_, l)| *l != Default::default());
    let entries = if limited {
        overseer.ledger().map_err(|e| {
            StartError(format!(
                "could not read the ledger to count the last hour's writes: {e}"
            ))
        })?
    } else {
        Vec::new()
    };
    Ok(crate::quotas::Quotas::new(
        agents,
        servers,
        &entries,
        overseer.now(),
    ))
}

/// How the driver reaches and presents `server` at `endpoint`.
fn mcp_config(server: &ServerConfig, endpoint: Endpoint) -> McpServerConfig {
    McpServerConfig::new(server.name.clone(), endpoint)
        .trust(server.trust)
        .deadline(server.deadline)
        .max_catalog_pages(server.max_catalog_pages)
        .reads(server.reads.clone())
        .forward_questions(server.forward_sampling, server.forward_elicitation)
        .question_wait(server.question_wait)
        .protocol(server.protocol)
        .max_result_bytes(server.max_result_bytes)
}

/// `gate check --servers`: start each server as `gate serve` would (confined, with its
/// environment, on its protocol), complete the handshake, read its catalog and stop it
/// again. Each server's line says what it offers, or why it did not start (in its own
/// words where it wrote any). `Err` when any server failed.
pub async fn check_servers(config: &Config, data_dir: &Path) -> Result<Vec<String>, Vec<String>> {
    let mut lines = Vec::new();
    let mut failed = false;
    for server in &config.servers {
        let name = code_span(&server.name, MAX_INLINE_CHARS);
        let started = match endpoint(server, config, data_dir) {
            Ok(endpoint) => McpServer::connect(mcp_config(server, endpoint))
                .await
                .map_err(|e| e.to_string()),
            Err(error) => Err(error.0),
        };
        match started {
            Ok(mcp) => lines.push(format!("server {name}: ok, {}", offered(server, &mcp))),
            Err(why) => {
                failed = true;
                lines.push(format!(
                    "server {name}: does not start: {}",
                    plain_inline(&why, MAX_DESCRIPTION_CHARS)
                ));
            }
        }
    }
    if failed { Err(lines) } else { Ok(lines) }
}

/// What a started server offers, counted as the gate will treat it.
fn offered(server: &ServerConfig, mcp: &McpServer) -> String {
    let catalog = mcp.catalog();
    let (mut reads, mut writes, mut repeatable, mut withheld) = (0, 0, 0, 0);
    for tool in catalog.tools() {
        if tool.withheld.is_some() {
            withheld += 1;
            continue;
        }
        let person_says_read = server.reads.contains(&tool.name);
        let classified = gatekeeper_core::classify(&tool.tool, server.trust, person_says_read);
        if classified.is_read() {
            reads += 1;
        } else {
            writes += 1;
            repeatable += usize::from(classified.auto_approvable());
        }
    }
    let mut text = format!(
        "{} tools: {reads} reads (sent at once), {writes} writes (held for you)",
        reads + writes + withheld
    );
    if repeatable > 0 {
        text.push_str(&format!(", {repeatable} of them a rule could apply"));
    }
    if withheld > 0 {
        text.push_str(&format!(
            ", {withheld} not offered to agents (`gate catalog` says why)"
        ));
    }
    text
}

/// The file whose lock marks a data directory as in use by a running daemon.
const LOCK_FILE: &str = "gate.lock";

/// Lock `data_dir` for this daemon (an advisory lock on its `gate.lock`, holding this
/// process's id), or say which daemon holds it.
fn hold_data_dir(data_dir: &Path) -> Result<std::fs::File, StartError> {
    use std::io::{Read as _, Seek as _, Write as _};
    let path = data_dir.join(LOCK_FILE);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| StartError(format!("could not open {}: {e}", path.display())))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            return Err(StartError(format!(
                "another gate serve (process {}) runs on the data directory {}; stop it first, or give this one another --data-dir",
                if holder.is_empty() { "unknown" } else { holder },
                data_dir.display()
            )));
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(StartError(format!(
                "could not lock {}: {e}",
                path.display()
            )));
        }
    }
    let written = file
        .set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| write!(file, "{}", std::process::id()));
    written.map_err(|e| StartError(format!("could not write {}: {e}", path.display())))?;
    Ok(file)
}

impl Daemon {
    /// Open the store (the configuration's `db`, or the SQLite file in `data_dir`), start
    /// every downstream server, build every agent's view, and bind the agents' address
    /// and the person's socket.
    pub async fn start(config: &Config, data_dir: &Path) -> Result<Self, StartError> {
        create_private_dir(data_dir)?;
        // Secrets are redacted from the log from here on, and from every view of the person's.
        let (redactor, unset) = crate::redaction::redactor_for(config);
        let redactor = Arc::new(redactor);
        crate::redaction::redact_logs_with(redactor.clone());
        for warning in unset {
            warn!("{warning}");
        }
        // One daemon per data directory: a second is refused before it opens anything,
        // with the running one's process id. The lock goes with the process.
        let lock = hold_data_dir(data_dir)?;
        let database = Store::open(config.db.as_deref(), data_dir).await?;
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let ledger = database.ledger();
        let overseer = Overseer::with_store(ledger.clone(), clock.clone());
        let workspaces = data_dir.join(WORKSPACES_DIR);
        let latches = Arc::new(
            Latches::new(config.agents.iter().map(|a| a.name.as_str()))
                .with_dir(&workspaces)
                .map_err(|e| {
                    StartError(format!(
                        "could not read the agents' lockdown latches in {}: {e}",
                        workspaces.display()
                    ))
                })?,
        );
        let catalogs = data_dir.join(CATALOGS_DIR);

        // Questions servers ask during the person's sends, held for the person.
        let questions = Arc::new(crate::questions::Questions::new(overseer.clone()));
        let mut downstreams = Vec::new();
        // Servers offered while they are down, to tell the person of once the notifier runs.
        let mut unavailable = Vec::new();
        for server in &config.servers {
            let endpoint = endpoint(server, config, data_dir)?;
            // A server that does not start now, but whose catalog a person accepted before,
            // is offered with that catalog and tried again at each call: one server down
            // does not keep the others from the agents. One never seen has no catalog to
            // offer, and stops the start.
            let mcp = match McpServer::connect(mcp_config(server, endpoint.clone())).await {
                Ok(mcp) => mcp,
                Err(error) => match recorded_catalog(&catalogs, &server.name) {
                    Ok(Some(recorded)) => {
                        unavailable.push(server.name.clone());
                        McpServer::unavailable(
                            mcp_config(server, endpoint),
                            Arc::new(recorded),
                            &error.to_string(),
                        )
                    }
                    // A remote server never reached yet (it waits for the person's first
                    // login, or the network or the server is down): offered with no tools
                    // until it lists them (a change for the person to accept), tried again
                    // at each call, and the notifier is told. A local command that fails
                    // the first time is the configuration's mistake, and stops the start.
                    _ if matches!(endpoint, Endpoint::Http(_)) => {
                        unavailable.push(server.name.clone());
                        McpServer::unavailable(
                            mcp_config(server, endpoint),
                            Arc::default(),
                            &error.to_string(),
                        )
                    }
                    _ => {
                        return Err(StartError(format!(
                            "{error}; the gate has never started it, so it has no catalog of it to offer: fix its command, or take it out of {} for now",
                            config.path.display()
                        )));
                    }
                },
            };
            let store = database
                .action_store(&server.name, clock.clone())
                .await
                .map_err(|e| StartError(format!("server {:?}: {e}", server.name)))?;
            // The catalog a person accepted (recorded), or, for a server seen for the
            // first time, the one it lists now, recorded as accepted.
            let unreadable = |e: std::io::Error| {
                StartError(format!(
                    "server {:?}: could not read or record its accepted catalog in {}: {e}; check the data directory",
                    server.name,
                    catalogs.display()
                ))
            };
            // A remote server never reached (down, or waiting for its first login) has
            // listed nothing yet: nothing is recorded as accepted, and the tools the file
            // names are checked once it lists them (its first catalog is then a change for
            // the person to accept).
            let never_listed =
                unavailable.contains(&server.name) && mcp.catalog().tools().is_empty();
            let accepted = match recorded_catalog(&catalogs, &server.name).map_err(unreadable)? {
                Some(recorded) => Arc::new(recorded),
                None if never_listed => mcp.catalog(),
                None => {
                    let current = mcp.catalog();
                    record_catalog(&catalogs, &server.name, &current).map_err(unreadable)?;
                    current
                }
            };
            let changes = accepted.changes(&mcp.catalog());
            if !changes.is_empty() {
                warn!(
                    server = %server.name,
                    new = changes.added.len(),
                    changed = changes.changed.len(),
                    gone = changes.gone.len(),
                    "catalog.changed since a person accepted it: see `gate catalog`"
                );
            }
            let gatekeeper = Arc::new(mcp.gatekeeper_over(&accepted, store));
            // A tool the file names for this server (`reads`, `sensitive_reads`) must be one
            // the accepted catalog lists: a name that is not would change nothing, silently.
            let unlisted = |what: &str, key: &str, tool: &str| {
                StartError(format!(
                    "server {:?} lists {what} {tool:?}, which that server does not list; it lists: {}; fix {key} in {}",
                    server.name,
                    accepted
                        .tools()
                        .iter()
                        .map(|t| t.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    config.path.display()
                ))
            };
            if never_listed {
                // Checked when it lists its tools.
            } else if let Some(tool) = server.reads.iter().find(|t| accepted.get(t).is_none()) {
                return Err(unlisted("read", "reads", tool));
            }
            // A sensitive read must also be one the classifier calls a read: anything else
            // would lock nothing down, silently.
            for tool in server.sensitive_reads.iter().filter(|_| !never_listed) {
                let Some(listed) = accepted.get(tool).cloned() else {
                    return Err(unlisted("sensitive read", "sensitive_reads", tool));
                };
                if !gatekeeper
                    .classification(&listed.name)
                    .is_some_and(|c| c.is_read())
                {
                    return Err(StartError(format!(
                        "server {:?} lists sensitive read {tool:?}, which is a write (every call of it waits for a person already); remove it from sensitive_reads in {}",
                        server.name,
                        config.path.display()
                    )));
                }
            }
            // The kernel reaches the gatekeeper only through the lockdown guard.
            overseer
                .register(Arc::new(
                    Guarded::new(gatekeeper.clone(), ledger.clone(), latches.clone())
                        .with_questions(questions.clone()),
                ))
                .map_err(|e| StartError(e.to_string()))?;
            info!(server = %server.name, tools = mcp.catalog().tools().len(), "server.ready");
            downstreams.push(Downstream {
                name: server.name.clone(),
                server: mcp,
                gatekeeper,
                sensitive_reads: server.sensitive_reads.clone(),
                sensitive_resources: server.sensitive_resources,
                local_only: server.local_only,
                pending: Arc::new(
                    crate::pending::Pending::new(&server.name, &server.pending, &accepted).kept_in(
                        data_dir
                            .join(PENDING_DIR)
                            .join(format!("{}.json", server.name)),
                    ),
                ),
                accepted: Arc::new(std::sync::RwLock::new(accepted)),
            });
        }
        // Times to live are set before anything drains: no apply sends an action past its own.
        overseer.set_time_to_live(None, config.pending_ttl);
        for server in &config.servers {
            if server.pending_ttl.is_some() {
                overseer.set_time_to_live(Some(&server.name), server.pending_ttl);
            }
        }
        overseer.resume().map_err(|e| StartError(e.to_string()))?;
        if let Store::Postgres(db) = &database {
            follow_changes(db, overseer.clone());
            info!(database = %db.shown_url(), session = db.session(), "store.postgres.ready");
        }

        let mut views = Vec::new();
        for agent in &config.agents {
            let grants: Vec<(String, Option<Vec<String>>)> = agent
                .grants
                .iter()
                .map(|g| (g.server.clone(), g.tools.clone()))
                .collect();
            views.push(
                AgentView::build(&overseer, &agent.name, &grants, &downstreams)
                    .map_err(|e| StartError(e.to_string()))?,
            );
        }
        let tokens = Tokens::new(
            config
                .agents
                .iter()
                .map(|a| (a.name.as_str(), a.token.as_str())),
        );
        let servers: Vec<Arc<McpServer>> = downstreams.iter().map(|d| d.server.clone()).collect();
        let mut gateway = Gateway::new(overseer.clone(), downstreams, views, latches)
            .with_questions(questions)
            .with_quotas(quotas(config, &overseer)?);
        if let Some(notify) = &config.notify {
            let notifier = Notifier::start(notify.clone()).redacting(redactor.clone());
            for server in &unavailable {
                notifier.unavailable(server);
            }
            // A server that comes to need the person's login while the gate runs (its
            // token revoked, a scope it asks for) tells the person once.
            for server in &servers {
                let mut events = server.events();
                let (notifier, name) = (notifier.clone(), server.config().name.clone());
                tokio::spawn(async move {
                    loop {
                        match events.recv().await {
                            Ok(gatekeeper_mcp::ServerEvent::LoginNeeded(why)) => {
                                notifier.login_needed(&name, &why);
                            }
                            Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                            Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                        }
                    }
                });
            }
            gateway = gateway.with_notifier(notifier);
        }
        gateway = gateway.with_redactor(redactor);
        gateway = gateway.with_catalogs(&catalogs).with_clock(clock.clone());
        let alone = matches!(database, Store::Sqlite(_));
        if let Store::Sqlite(file) = &database {
            gateway = gateway.with_database(file.clone());
        }
        let gateway = Arc::new(gateway);
        // Agent sessions do not outlive a daemon: the grants made for an earlier run's
        // are removed, where no other daemon shares the store.
        if alone {
            gateway.forget_earlier_sessions();
        }
        gateway.start_log_relays();
        gateway.start_catalog_checks(config.catalog_check);
        let recovered = gateway.recover_pending().await;
        if recovered > 0 {
            info!(recovered, "pending actions recovered from the ledger");
        }

        // Who may use the person's socket, and where it is: the data directory's, owner-only,
        // unless the configuration lists deciders (and, for them, puts it elsewhere).
        let access = Arc::new(SocketAccess::new(
            config.deciders.clone(),
            &config.path,
            nix::unistd::geteuid().as_raw(),
        ));
        let socket = config.socket.clone().unwrap_or_else(|| socket_in(data_dir));
        if let Some(dir) = socket.parent().filter(|d| !d.as_os_str().is_empty())
            && !dir.is_dir()
        {
            return Err(StartError(format!(
                "the person's socket {} cannot be created: its directory {} does not exist; create it (owned by the daemon's user, mode 0755), or let systemd make /run/gate with RuntimeDirectory=gate (deploy/gate.service)",
                socket.display(),
                dir.display()
            )));
        }
        if access.is_shared() && socket.starts_with(data_dir) {
            warn!(
                socket = %socket.display(),
                "deciders are set, but the person's socket is in the data directory, which only the daemon's user may enter; set socket = \"/run/gate/gate.sock\" (a directory the deciders can reach) in the configuration"
            );
        }
        let control =
            control::bind(&socket, access.is_shared()).map_err(|e| StartError(e.to_string()))?;
        // The review page: a listener of its own, never the agents'.
        let web = match &config.web {
            None => None,
            Some(page) => {
                let tls = match &page.tls {
                    None => None,
                    Some(tls) => {
                        let host = crate::web::host_of(&page.origin);
                        Some(crate::tls::load(tls, &host, data_dir).map_err(StartError)?)
                    }
                };
                let state = crate::web::Web::new(gateway.clone(), data_dir, &page.origin, tls)
                    .map_err(StartError)?;
                let listener = tokio::net::TcpListener::bind(page.listen)
                    .await
                    .map_err(|e| {
                        StartError(format!(
                            "could not listen on {} for the review page: {e}; change [web] listen in {}",
                            page.listen,
                            config.path.display()
                        ))
                    })?;
                info!(origin = %page.origin, "web.listening: the review page is on");
                Some((Arc::new(state), listener))
            }
        };
        // The agents' TLS, for agents on other machines (a non-loopback listen needs it).
        let agents_tls = match &config.tls {
            None => None,
            Some(tls) => {
                let host = config.host.as_deref().unwrap_or("localhost");
                let loaded = crate::tls::load(tls, host, data_dir).map_err(StartError)?;
                info!(
                    certificate = %loaded.certificate_sha256,
                    "agents.tls: agents reach the gate over TLS"
                );
                Some(loaded)
            }
        };
        let http = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|e| {
                StartError(format!(
                    "could not listen on {}: {e}; change listen in {}",
                    config.listen,
                    config.path.display()
                ))
            })?;
        // A quarter of the shortest time to live, between 1 s and a minute: an action
        // expires at most that late (and never sent late: every apply checks it itself).
        let sweep = config
            .servers
            .iter()
            .filter_map(|s| s.pending_ttl)
            .chain(config.pending_ttl)
            .min()
            .map(|ttl| (ttl / 4).clamp(Duration::from_secs(1), Duration::from_secs(60)));
        Ok(Self {
            gateway,
            tokens,
            http,
            control,
            socket,
            access,
            sweep,
            limits: config.http.clone(),
            web,
            agents_tls: agents_tls.map(|t| t.acceptor),
            host: config.host.clone(),
            _lock: lock,
        })
    }

    /// Where agents reach it.
    pub fn address(&self) -> Result<SocketAddr, std::io::Error> {
        self.http.local_addr()
    }

    /// The agents' endpoint URL: `https://HOST:PORT` over TLS, else the loopback address.
    pub fn url(&self) -> Result<String, std::io::Error> {
        let address = self.address()?;
        Ok(match (&self.agents_tls, &self.host) {
            (Some(_), Some(host)) => format!("https://{host}:{}{MCP_PATH}", address.port()),
            (Some(_), None) => format!("https://localhost:{}{MCP_PATH}", address.port()),
            (None, _) => format!("http://{address}{MCP_PATH}"),
        })
    }

    /// The person's socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Serve agents and the person until `shutdown` completes; then stop taking requests,
    /// give open agent connections `grace` to finish, and wait for decisions in flight.
    pub async fn serve(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
        grace: Duration,
    ) -> Result<(), StartError> {
        let Self {
            gateway,
            tokens,
            http,
            control,
            socket,
            access,
            sweep,
            limits,
            web,
            agents_tls,
            host: _,
            _lock: lock,
        } = self;
        // Held until the daemon has stopped serving (dropped at the end of this function).
        let _lock = lock;
        let page = web.as_ref().map(|(state, _)| state.clone());
        let person = tokio::spawn(control::serve(control, gateway.clone(), access, page));
        let sweeper = sweep.map(|every| {
            let gateway = gateway.clone();
            tokio::spawn(async move {
                let mut ticks = tokio::time::interval(every);
                loop {
                    ticks.tick().await;
                    gateway.expire_due().await;
                }
            })
        });
        let (stop, stopped) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            shutdown.await;
            let _ = stop.send(true);
        });
        let mut hard = stopped.clone();
        let review = web.map(|(state, listener)| {
            let tls = state.tls().map(|t| t.acceptor.clone());
            let router = crate::web::router(state);
            let (limits, stopped) = (limits.clone(), stopped.clone());
            tokio::spawn(async move { http::serve(listener, router, &limits, stopped, tls).await })
        });
        let router = http::router(gateway.clone(), tokens, &limits);
        let agents = http::serve(http, router, &limits, stopped, agents_tls);
        let outcome = tokio::select! {
            () = agents => Ok(()),
            () = async move {
                let _ = hard.wait_for(|s| *s).await;
                tokio::time::sleep(grace).await;
            } => {
                warn!(grace = ?grace, "shutdown: agent connections still open after the grace period; closing them");
                Ok(())
            }
        };
        person.abort();
        if let Some(review) = review {
            review.abort();
        }
        if let Some(sweeper) = sweeper {
            sweeper.abort();
        }
        let _ = std::fs::remove_file(&socket);
        gateway.overseer().settle().await;
        info!("shutdown.done");
        outcome
    }
}

//! The daemon's configuration, `gate.toml`: read strictly, refused with the file, the line
//! and what to write instead.
//!
//! Nothing is ambient: a server an agent has no grant for is invisible to it, and an agent
//! has no grant unless the file gives it one. A downstream server is `byo` (its annotations
//! never auto-apply a write) unless the file says `vetted`. Secrets for HTTP servers are
//! named, not written: a header's value comes from an environment variable.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::Range;

use crate::http::HttpLimits;
use crate::sessions::SessionLimits;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gatekeeper_core::ServerTrust;
use gatekeeper_mcp::StdioCommand;
use serde::Deserialize;
use toml::Spanned;

/// Where the daemon listens for agents when the file names no address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7431";
/// How often a server's catalog is read again unless the file says otherwise.
pub const DEFAULT_CATALOG_CHECK_SECONDS: u64 = 60;
/// The largest `max_catalog_pages` a server may be given.
pub const MAX_CATALOG_PAGES: usize = 100_000;
/// The longest deadline a server may be given.
pub const MAX_DEADLINE_SECONDS: u64 = 3600;
/// The longest time to live a pending action may be given: 90 days.
pub const MAX_PENDING_TTL_SECONDS: u64 = 90 * 24 * 3600;
/// The shortest interval between two notifications a person may ask for.
pub const MIN_NOTIFY_INTERVAL_SECONDS: u64 = 1;
/// The interval between two notifications when the file names none.
pub const DEFAULT_NOTIFY_INTERVAL_SECONDS: u64 = 60;
/// The shortest token an agent may be given.
pub const MIN_TOKEN_CHARS: usize = 24;

/// A configuration file that cannot be used: where, and what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}: {message}", .path.display(), .line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct ConfigError {
    /// The file.
    pub path: PathBuf,
    /// The line (1-based), when the problem has one.
    pub line: Option<usize>,
    /// What is wrong and what to write instead.
    pub message: String,
}

/// How the daemon reaches a downstream server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// A child process speaking MCP on stdio.
    Stdio(StdioCommand),
    /// An MCP server over streamable HTTP.
    Http {
        /// The endpoint.
        url: String,
        /// Headers, each as (header name, environment variable holding its value).
        headers_from_env: Vec<(String, String)>,
        /// A PEM file of certificates to trust besides the system's (`ca_file`, https
        /// only).
        ca_file: Option<PathBuf>,
        /// `[server.oauth]`: requests carry the access token of the person's `gate login`.
        oauth: Option<OAuthConfig>,
    },
}

/// `[server.oauth]`: how the gate is registered with a server's authorization server.
/// Every field may be left out: the server's metadata then decides (dynamic registration,
/// scopes from its challenge).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuthConfig {
    /// A client id registered by hand with the authorization server.
    pub client_id: Option<String>,
    /// The environment variable holding that client's secret (never the secret itself).
    pub client_secret_env: Option<String>,
    /// The HTTPS address of the gate's client ID metadata document.
    pub client_metadata_url: Option<String>,
    /// The scopes to ask for.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// With `grant = "client_credentials"`: a file holding the P-256 private key (PKCS #8
    /// PEM) that signs the gate's client assertions, instead of a client secret.
    pub private_key_file: Option<PathBuf>,
    /// `grant = "client_credentials"`: the gate is a client of its own (client_id and
    /// client_secret_env required) and gets its tokens itself; the default,
    /// `"authorization_code"`, is the person's `gate login`.
    #[serde(default)]
    pub grant: OAuthGrant,
}

/// How the gate gets its tokens from an authorization server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OAuthGrant {
    /// The person logs in (`gate login`): the authorization code grant with PKCE.
    #[default]
    AuthorizationCode,
    /// The gate's own client id and secret (a service account): no person involved.
    ClientCredentials,
}

/// What a confined stdio server may reach besides everything its user may, but the
/// gate's own files (see `confine.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfinement {
    /// `paths = [...]`: the only places it may write; `None`: wherever its user may.
    pub write: Option<Vec<PathBuf>>,
    /// `network = false` takes TCP away from it.
    pub network: bool,
}

/// One downstream server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Its name: the prefix of its tools' names (`<name>__<tool>`).
    pub name: String,
    /// How to reach it.
    pub transport: Transport,
    /// How far its annotations are believed.
    pub trust: ServerTrust,
    /// The deadline of every request to it.
    pub deadline: Duration,
    /// Tools whose reads are sensitive.
    pub sensitive_reads: Vec<String>,
    /// Tools the person lists as reads (`reads`): reads whatever the server claims.
    pub reads: Vec<String>,
    /// Whether its reads reach nothing outside this machine (`local_only = true`): a
    /// locked-down agent may still read it.
    pub local_only: bool,
    /// Whether it may ask the agent's model for completions during a read
    /// (`forward_sampling = true`).
    pub forward_sampling: bool,
    /// Whether it may ask for input (`forward_elicitation = true`): the agent's user
    /// during a read, the person during the person's approved send.
    pub forward_elicitation: bool,
    /// The longest a question asked during a person's send waits for an answer
    /// (`question_wait_seconds`); `None`: until shortly before the send's deadline.
    pub question_wait: Option<Duration>,
    /// The largest answer of it the gate reads (`max_result_mib`, default 16).
    pub max_result_bytes: usize,
    /// The most writes all agents together may stage on it in any hour
    /// (`max_writes_per_hour`); `None`: no limit.
    pub max_writes_per_hour: Option<usize>,
    /// Which protocol era the gate speaks to it (`protocol`: `"2025-11-25"`, the default,
    /// `"2026-07-28"` or `"auto"`).
    pub protocol: gatekeeper_mcp::Protocol,
    /// Whether reading any of its resources is sensitive (`sensitive_resources = true`).
    pub sensitive_resources: bool,
    /// How long its pending actions wait for a decision before they expire; `None`
    /// takes the file's default ([`Config::pending_ttl`]).
    pub pending_ttl: Option<Duration>,
    /// The most `tools/list` pages its catalog may have (`max_catalog_pages`); a longer
    /// catalog is refused whole, never cut.
    pub max_catalog_pages: usize,
    /// How a stdio server is confined (`confine`, `paths`, `network`); `None` for a
    /// server reached by URL, or one the person runs unconfined (`confine = false`).
    pub confinement: Option<ServerConfinement>,
    /// How the agent's own pending writes show in its reads (`pending`, `simulator`).
    pub pending: crate::pending::PendingMode,
}

/// The command run to tell the person that work waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotifyConfig {
    /// The program (run directly, never through a shell).
    pub command: String,
    /// Its fixed arguments, before the gate's own.
    pub args: Vec<String>,
    /// At most one notification per this interval; what arrives meanwhile is batched into
    /// the next.
    pub min_interval: Duration,
    /// The review page's origin, when it is on: notifications carry a link to it.
    pub page: Option<String>,
}

/// What one agent may use of one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantConfig {
    /// The server.
    pub server: String,
    /// The tools by their downstream names; `None` is the whole server.
    pub tools: Option<Vec<String>>,
}

/// One agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentConfig {
    /// Its name, recorded as the caller of everything it does.
    pub name: String,
    /// The bearer token it presents.
    pub token: String,
    /// What it may use; nothing by default.
    pub grants: Vec<GrantConfig>,
    /// The most of its actions that may wait for a decision at once (`max_open_actions`);
    /// `None`: only the servers' own cap.
    pub max_open_actions: Option<usize>,
    /// The most writes it may stage in any hour (`max_writes_per_hour`); `None`: no limit.
    pub max_writes_per_hour: Option<usize>,
}

/// A checked configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The file it was read from.
    pub path: PathBuf,
    /// Where agents reach the daemon (a loopback address).
    pub listen: SocketAddr,
    /// Downstream servers, in file order.
    pub servers: Vec<ServerConfig>,
    /// Agents, in file order.
    pub agents: Vec<AgentConfig>,
    /// How long a pending action waits for a decision before it expires, for servers
    /// without their own; `None` is forever.
    pub pending_ttl: Option<Duration>,
    /// What to run when new work waits, if anything.
    pub notify: Option<NotifyConfig>,
    /// A PostgreSQL database shared by a team's daemons (`db = "postgres://…"`); `None`:
    /// the SQLite file in the data directory.
    pub db: Option<String>,
    /// What a person should know about the file's permissions that does not stop it
    /// being used (it is readable by other users), said by `gate check` and `gate serve`.
    pub warnings: Vec<String>,
    /// What the agents' endpoint allows (`allowed_origins`, `max_connections`,
    /// `header_timeout_seconds`, `max_sessions`, `max_sessions_per_agent`).
    pub http: HttpLimits,
    /// How often each server's catalog is read again to catch a tool changed without a
    /// word (`catalog_check_seconds`, default 60).
    pub catalog_check: Duration,
    /// Environment variables whose values are secrets to redact from every view and log
    /// (`redact_env = ["MY_SECRET"]`), besides the agents' tokens and the servers' `env`
    /// and header values, which are redacted always.
    pub redact_env: Vec<String>,
    /// Who may use the person's socket (`deciders = ["alice", "group:staff"]`), resolved
    /// against this system's users and groups; `None`: the daemon's own user alone.
    pub deciders: Option<crate::deciders::Deciders>,
    /// Where the person's socket is (`socket = "/run/gate/gate.sock"`); `None`: `gate.sock`
    /// in the data directory.
    pub socket: Option<PathBuf>,
    /// The review page's listener (`[web]`), off when absent ([`crate::web`]).
    pub web: Option<WebConfig>,
    /// The agents' listener's TLS (`tls = "self-signed"`, or `tls_cert` and `tls_key`),
    /// for agents on other machines.
    pub tls: Option<ListenerTls>,
    /// The name agents on other machines reach the gate by (`host`): allowed in their
    /// requests' `Host`, and named by a generated certificate.
    pub host: Option<String>,
}

/// Where the review page listens (`[web] listen = "127.0.0.1:8790"`), and the origin a
/// browser reaches it at: what passkeys are bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebConfig {
    /// The listener's address: loopback, or any with TLS.
    pub listen: SocketAddr,
    /// The page's origin as the browser sees it (`http://localhost:PORT` without TLS,
    /// `https://localhost:PORT` with it, unless given).
    pub origin: String,
    /// The page's TLS, when it serves HTTPS.
    pub tls: Option<ListenerTls>,
}

/// Where the review page's certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenerTls {
    /// One the gate generates for the origin's host, once, in the data directory
    /// (`tls = "self-signed"`); its fingerprint is shown by `gate pair` and on the page.
    SelfSigned,
    /// A certificate chain and its private key, PEM files (`tls_cert`, `tls_key`).
    Files {
        /// The certificate chain.
        cert: PathBuf,
        /// The private key.
        key: PathBuf,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWeb {
    listen: Spanned<String>,
    origin: Option<Spanned<String>>,
    tls: Option<Spanned<String>>,
    tls_cert: Option<Spanned<PathBuf>>,
    tls_key: Option<Spanned<PathBuf>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    listen: Option<Spanned<String>>,
    db: Option<Spanned<String>>,
    #[serde(default, rename = "server")]
    servers: Vec<RawServer>,
    #[serde(default, rename = "agent")]
    agents: Vec<RawAgent>,
    pending_ttl_seconds: Option<Spanned<u64>>,
    notify: Option<RawNotify>,
    #[serde(default)]
    allowed_origins: Vec<String>,
    max_connections: Option<Spanned<u64>>,
    header_timeout_seconds: Option<Spanned<u64>>,
    max_sessions: Option<Spanned<u64>>,
    max_sessions_per_agent: Option<Spanned<u64>>,
    catalog_check_seconds: Option<Spanned<u64>>,
    #[serde(default)]
    redact_env: Vec<Spanned<String>>,
    deciders: Option<Spanned<Vec<Spanned<String>>>>,
    socket: Option<Spanned<PathBuf>>,
    web: Option<RawWeb>,
    tls: Option<Spanned<String>>,
    tls_cert: Option<Spanned<PathBuf>>,
    tls_key: Option<Spanned<PathBuf>>,
    host: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNotify {
    command: Spanned<String>,
    #[serde(default)]
    args: Vec<String>,
    min_interval_seconds: Option<Spanned<u64>>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
enum RawTrust {
    #[default]
    Byo,
    Vetted,
    Untrusted,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    name: Spanned<String>,
    command: Option<Spanned<String>>,
    args: Option<Spanned<Vec<String>>>,
    env: Option<Spanned<BTreeMap<String, String>>>,
    url: Option<Spanned<String>>,
    headers_from_env: Option<Spanned<BTreeMap<String, String>>>,
    ca_file: Option<Spanned<PathBuf>>,
    oauth: Option<Spanned<OAuthConfig>>,
    #[serde(default)]
    trust: RawTrust,
    deadline_seconds: Option<Spanned<u64>>,
    #[serde(default)]
    sensitive_reads: Vec<String>,
    #[serde(default)]
    sensitive_resources: bool,
    #[serde(default)]
    reads: Vec<String>,
    #[serde(default)]
    local_only: bool,
    #[serde(default)]
    forward_sampling: bool,
    #[serde(default)]
    forward_elicitation: bool,
    max_result_mib: Option<Spanned<u64>>,
    question_wait_seconds: Option<Spanned<u64>>,
    protocol: Option<Spanned<String>>,
    max_writes_per_hour: Option<Spanned<u64>>,
    pending_ttl_seconds: Option<Spanned<u64>>,
    max_catalog_pages: Option<Spanned<u64>>,
    pending: Option<Spanned<String>>,
    simulator: Option<Spanned<String>>,
    confine: Option<Spanned<bool>>,
    paths: Option<Spanned<Vec<PathBuf>>>,
    network: Option<Spanned<bool>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAgent {
    name: Spanned<String>,
    token: Spanned<String>,
    #[serde(default, rename = "grant")]
    grants: Vec<RawGrant>,
    max_open_actions: Option<Spanned<u64>>,
    max_writes_per_hour: Option<Spanned<u64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGrant {
    server: Spanned<String>,
    tools: Option<Vec<String>>,
}

/// The most a quota may be.
const MAX_QUOTA: u64 = 100_000;

/// A quota `key` of `whose` (`agent "coder"`, `server "files"`), checked: 1 to [`MAX_QUOTA`];
/// `example` is shown in the error.
fn quota(
    check: &Checker<'_>,
    value: &Option<Spanned<u64>>,
    whose: &str,
    key: &str,
    example: u64,
) -> Result<Option<usize>, ConfigError> {
    match value {
        None => Ok(None),
        Some(n) => match usize::try_from(*n.get_ref()) {
            Ok(n) if (1..=MAX_QUOTA as usize).contains(&n) => Ok(Some(n)),
            _ => Err(check.at(
                n,
                format!(
                    "{whose}: {key} = {} is out of range; write a number from 1 to {MAX_QUOTA}, for example {key} = {example}, or leave it out for no limit",
                    n.get_ref()
                ),
            )),
        },
    }
}

/// A server's confinement from its `confine`, `paths` and `network`: only a stdio server is
/// confined; `paths` must be absolute directories that exist.
fn confinement(
    check: &Checker<'_>,
    name: &str,
    server: &RawServer,
) -> Result<Option<ServerConfinement>, ConfigError> {
    let confine = server.confine.as_ref().is_none_or(|c| *c.get_ref());
    if server.url.is_some() {
        for (key, given) in [
            ("confine", server.confine.as_ref().map(Spanned::span)),
            ("paths", server.paths.as_ref().map(Spanned::span)),
            ("network", server.network.as_ref().map(Spanned::span)),
        ] {
            if let Some(span) = given {
                return Err(check.error(Some(span), format!(
                    "server {name:?} is reached by url: it runs elsewhere and the gate cannot confine it, so it takes no {key}; remove it"
                )));
            }
        }
        return Ok(None);
    }
    if !confine {
        if let Some(paths) = &server.paths {
            return Err(check.at(paths, format!(
                "server {name:?} runs unconfined (confine = false), so paths would not be enforced; remove paths, or confine it"
            )));
        }
        if let Some(network) = &server.network {
            return Err(check.at(network, format!(
                "server {name:?} runs unconfined (confine = false), so network would not be enforced; remove network, or confine it"
            )));
        }
        return Ok(None);
    }
    if let Some(paths) = &server.paths {
        for path in paths.get_ref() {
            if !path.is_absolute() || !path.is_dir() {
                return Err(check.at(paths, format!(
                    "server {name:?}: paths entry {:?} is not an absolute path to a directory that exists; write where the server may write, for example paths = [\"/home/me/notes\"]",
                    path.display()
                )));
            }
        }
    }
    Ok(Some(ServerConfinement {
        write: server.paths.as_ref().map(|p| p.get_ref().clone()),
        network: server.network.as_ref().is_none_or(|n| *n.get_ref()),
    }))
}

/// Checks one file's text; errors carry the line of the offending span.
struct Checker<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Checker<'_> {
    fn error(&self, span: Option<Range<usize>>, message: impl Into<String>) -> ConfigError {
        ConfigError {
            path: self.path.to_owned(),
            line: span.map(|s| line_of(self.text, s.start)),
            message: message.into(),
        }
    }

    fn at<T>(&self, spanned: &Spanned<T>, message: impl Into<String>) -> ConfigError {
        self.error(Some(spanned.span()), message)
    }
}

/// The 1-based line of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset)
        .unwrap_or(text)
        .bytes()
        .filter(|&b| b == b'\n')
        .count()
        + 1
}

/// Whether `name` may name a server or an agent: `[A-Za-z0-9-]` and single `_`, at most
/// 32 characters. A server name is the prefix of `<server>__<tool>`, so it may not hold
/// `__` itself.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && !name.contains("__")
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// Refuse a configuration others may change; warn about one others may read.
fn permission_check(path: &Path) -> Result<Vec<String>, String> {
    use std::os::unix::fs::PermissionsExt as _;
    const OTHERS_WRITE: u32 = 0o022;
    const OTHERS_READ: u32 = 0o044;
    const STICKY: u32 = 0o1000;
    let mode = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.permissions().mode())
            .map_err(|e| format!("cannot read the permissions of {} ({e})", p.display()))
    };
    let file = mode(path)?;
    if file & OTHERS_WRITE != 0 {
        return Err(format!(
            "other users may write this file (mode {:o}), so they could grant an agent any server; run `chmod go-w {}`",
            file & 0o7777,
            path.display()
        ));
    }
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let dir_mode = mode(dir)?;
    if dir_mode & OTHERS_WRITE != 0 && dir_mode & STICKY == 0 {
        return Err(format!(
            "other users may write its directory {} (mode {:o}), so they could replace this file; run `chmod go-w {}` or keep the file in a private directory",
            dir.display(),
            dir_mode & 0o7777,
            dir.display()
        ));
    }
    let mut warnings = Vec::new();
    if file & OTHERS_READ != 0 {
        warnings.push(format!(
            "{}: other users may read this file (mode {:o}), and it holds the agents' tokens; run `chmod 600 {}`",
            path.display(),
            file & 0o7777,
            path.display()
        ));
    }
    Ok(warnings)
}

/// Whether `program` can be run: a path to an existing file, or a name found on `PATH`.
fn program_exists(program: &str) -> bool {
    if program.contains('/') {
        return Path::new(program).is_file();
    }
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

/// Whether `url` looks like an http(s) URL with a host.
fn valid_url(url: &str) -> bool {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    rest.is_some_and(|rest| {
        let host = rest.split(['/', '?', '#']).next().unwrap_or("");
        let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
        !host.is_empty() && !host.starts_with(':') && !host.contains(char::is_whitespace)
    })
}

/// Whether `url` names a loopback host (`localhost`, `127.x`, `[::1]`).
fn loopback_url(url: &str) -> bool {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
    let host = if host.starts_with('[') {
        host.split(']')
            .next()
            .map_or("", |h| h.trim_start_matches('['))
    } else {
        host.split(':').next().unwrap_or("")
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A time to live from the file, checked: 1 second to 90 days.
fn pending_ttl(
    check: &Checker<'_>,
    seconds: Option<&Spanned<u64>>,
    whose: &str,
) -> Result<Option<Duration>, ConfigError> {
    match seconds {
        None => Ok(None),
        Some(s) if (1..=MAX_PENDING_TTL_SECONDS).contains(s.get_ref()) => {
            Ok(Some(Duration::from_secs(*s.get_ref())))
        }
        Some(s) => Err(check.at(s, format!(
            "{whose}pending_ttl_seconds = {} is out of range; write a number of seconds from 1 to {MAX_PENDING_TTL_SECONDS}, for example pending_ttl_seconds = 86400 (a day), or leave it out so pending actions never expire",
            s.get_ref()
        ))),
    }
}

impl Config {
    /// Read and check the file at `path`. A file that other users may write, or that sits
    /// in a directory they may write (without the sticky bit), is refused: whoever can
    /// change it can grant an agent any server. A file they may read is used, with a
    /// warning in [`Config::warnings`]: it holds the agents' tokens.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError {
            path: path.to_owned(),
            line: None,
            message: format!(
                "cannot read the configuration ({error}); write one with `gate init`, or pass --config PATH"
            ),
        })?;
        let warnings = permission_check(path).map_err(|message| ConfigError {
            path: path.to_owned(),
            line: None,
            message,
        })?;
        let mut config = Self::parse(path, &text)?;
        config.warnings = warnings;
        Ok(config)
    }

    /// Check the text of a configuration file (`path` is only for messages).
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let check = Checker { path, text };
        let raw: RawConfig =
            toml::from_str(text).map_err(|e| check.error(e.span(), e.message().trim()))?;

        let listen = match &raw.listen {
            None => DEFAULT_LISTEN.parse().expect("the default address parses"),
            Some(listen) => {
                let address: SocketAddr = listen.get_ref().parse().map_err(|_| {
                    check.at(listen, format!(
                        "listen = {:?} is not an address with a port; write for example listen = \"{DEFAULT_LISTEN}\"",
                        listen.get_ref()
                    ))
                })?;
                if !address.ip().is_loopback() && raw.tls.is_none() && raw.tls_cert.is_none() {
                    return Err(check.at(listen, format!(
                        "listen = {:?} is not a loopback address, and agents on other machines would send their tokens in clear; add tls = \"self-signed\" (or tls_cert and tls_key) and host = \"NAME\" (the name they reach this machine by), or write for example listen = \"{DEFAULT_LISTEN}\"",
                        listen.get_ref()
                    )));
                }
                address
            }
        };

        let mut servers: Vec<ServerConfig> = Vec::new();
        for server in raw.servers {
            let name = server.name.get_ref().clone();
            if !valid_name(&name) {
                return Err(check.at(&server.name, format!(
                    "server name {name:?} is not usable; write 1 to 32 letters, digits, '-' or single '_', for example name = \"files\""
                )));
            }
            if name == crate::names::RESERVED_SERVER {
                return Err(check.at(&server.name, format!(
                    "server name {name:?} is the gate's own (gate://action/<id> names an agent's staged action); choose another name"
                )));
            }
            if servers.iter().any(|s| s.name == name) {
                return Err(check.at(
                    &server.name,
                    format!("a second server is named {name:?}; give each [[server]] its own name"),
                ));
            }
            let transport = match (&server.command, &server.url) {
                (Some(command), None) => {
                    if let Some(headers) = &server.headers_from_env {
                        return Err(check.at(headers, format!(
                            "server {name:?} runs a command, so it takes no headers_from_env; use env = {{ ... }} for its environment"
                        )));
                    }
                    let program = command.get_ref();
                    if !program_exists(program) {
                        return Err(check.at(command, format!(
                            "server {name:?}: command {program:?} was not found{}; write the full path to the program, for example command = \"/usr/local/bin/{}\"",
                            if program.contains('/') { "" } else { " on PATH" },
                            Path::new(program).file_name().map_or("server".into(), |f| f.to_string_lossy())
                        )));
                    }
                    let mut stdio = StdioCommand::new(program.clone()).args(
                        server
                            .args
                            .as_ref()
                            .map(|a| a.get_ref().clone())
                            .unwrap_or_default(),
                    );
                    for (key, value) in server
                        .env
                        .as_ref()
                        .map(|e| e.get_ref().clone())
                        .unwrap_or_default()
                    {
                        stdio = stdio.env(key, value);
                    }
                    Transport::Stdio(stdio)
                }
                (None, Some(url)) => {
                    if let Some(args) = &server.args {
                        return Err(check.at(args, format!(
                            "server {name:?} is reached by url, so it takes no args; remove them, or use command = \"...\" instead of url"
                        )));
                    }
                    if let Some(env) = &server.env {
                        return Err(check.at(env, format!(
                            "server {name:?} is reached by url, so it takes no env; name header values with headers_from_env = {{ Authorization = \"ENV_VAR\" }}"
                        )));
                    }
                    if !valid_url(url.get_ref()) {
                        return Err(check.at(url, format!(
                            "server {name:?}: url {:?} is not an http(s) URL with a host; write for example url = \"http://127.0.0.1:8931/mcp\"",
                            url.get_ref()
                        )));
                    }
                    if let Some(ca) = &server.ca_file {
                        if !url.get_ref().starts_with("https://") {
                            return Err(check.at(ca, format!(
                                "server {name:?}: ca_file is for an https:// url, and {:?} is not one; remove ca_file, or reach the server by https://",
                                url.get_ref()
                            )));
                        }
                        if !ca.get_ref().is_file() {
                            return Err(check.at(ca, format!(
                                "server {name:?}: ca_file {} does not exist or is not a file; give the full path of a PEM file of the CA that signed the server's certificate",
                                ca.get_ref().display()
                            )));
                        }
                    }
                    if let Some(oauth) = &server.oauth {
                        if !url.get_ref().starts_with("https://") && !loopback_url(url.get_ref()) {
                            return Err(check.at(oauth, format!(
                                "server {name:?}: OAuth tokens would cross the network in the clear over {:?}; reach the server by https:// (plain http is taken only on loopback)",
                                url.get_ref()
                            )));
                        }
                        if oauth.get_ref().client_secret_env.is_some()
                            && oauth.get_ref().client_id.is_none()
                        {
                            return Err(check.at(oauth, format!(
                                "server {name:?}: client_secret_env is the secret of a client registered by hand; set its client_id too, or remove both to register dynamically"
                            )));
                        }
                        let settings = oauth.get_ref();
                        if settings.grant == OAuthGrant::ClientCredentials
                            && (settings.client_id.is_none()
                                || settings.client_secret_env.is_some()
                                    == settings.private_key_file.is_some())
                        {
                            return Err(check.at(oauth, format!(
                                "server {name:?}: grant = \"client_credentials\" needs the client_id the authorization server issued to the gate, and one of client_secret_env (its secret) or private_key_file (its signing key)"
                            )));
                        }
                        if settings.private_key_file.is_some()
                            && settings.grant != OAuthGrant::ClientCredentials
                        {
                            return Err(check.at(oauth, format!(
                                "server {name:?}: private_key_file signs the gate's own client; it goes with grant = \"client_credentials\""
                            )));
                        }
                        if let Some(document) = &oauth.get_ref().client_metadata_url
                            && !document.starts_with("https://")
                        {
                            return Err(check.at(oauth, format!(
                                "server {name:?}: client_metadata_url {document:?} must be an https:// address where the gate's client metadata document is served"
                            )));
                        }
                    }
                    Transport::Http {
                        oauth: server.oauth.as_ref().map(|o| o.get_ref().clone()),
                        url: url.get_ref().clone(),
                        headers_from_env: server
                            .headers_from_env
                            .as_ref()
                            .map(|h| h.get_ref().clone().into_iter().collect())
                            .unwrap_or_default(),
                        ca_file: server.ca_file.as_ref().map(|c| c.get_ref().clone()),
                    }
                }
                (Some(command), Some(_)) => {
                    return Err(check.at(command, format!(
                        "server {name:?} has both a command and a url; keep one: command = \"...\" for a local program, url = \"https://...\" for a remote server"
                    )));
                }
                (None, None) => {
                    return Err(check.at(&server.name, format!(
                        "server {name:?} has neither a command nor a url; write command = \"/path/to/server\" (with args = [...]) or url = \"http://127.0.0.1:8931/mcp\""
                    )));
                }
            };
            let deadline = match &server.deadline_seconds {
                None => gatekeeper_mcp::DEFAULT_DEADLINE,
                Some(seconds) if (1..=MAX_DEADLINE_SECONDS).contains(seconds.get_ref()) => {
                    Duration::from_secs(*seconds.get_ref())
                }
                Some(seconds) => {
                    return Err(check.at(seconds, format!(
                        "server {name:?}: deadline_seconds = {} is out of range; write a number of seconds from 1 to {MAX_DEADLINE_SECONDS}, for example deadline_seconds = 30",
                        seconds.get_ref()
                    )));
                }
            };
            let pending_ttl = pending_ttl(
                &check,
                server.pending_ttl_seconds.as_ref(),
                &format!("server {name:?}: "),
            )?;
            let max_result_bytes = match &server.max_result_mib {
                None => gatekeeper_mcp::DEFAULT_MAX_RESULT_BYTES,
                Some(mib) if (1..=1024).contains(mib.get_ref()) => {
                    usize::try_from(*mib.get_ref()).unwrap_or(16) * 1024 * 1024
                }
                Some(mib) => {
                    return Err(check.at(mib, format!(
                        "server {name:?}: max_result_mib = {} is out of range; write a number of MiB from 1 to 1024, for example max_result_mib = 16",
                        mib.get_ref()
                    )));
                }
            };
            let question_wait = match &server.question_wait_seconds {
                None => None,
                Some(seconds) if (1..=MAX_DEADLINE_SECONDS).contains(seconds.get_ref()) => {
                    Some(Duration::from_secs(*seconds.get_ref()))
                }
                Some(seconds) => {
                    return Err(check.at(seconds, format!(
                        "server {name:?}: question_wait_seconds = {} is out of range; write a number of seconds from 1 to {MAX_DEADLINE_SECONDS}, for example question_wait_seconds = 30",
                        seconds.get_ref()
                    )));
                }
            };
            let max_writes_per_hour = quota(
                &check,
                &server.max_writes_per_hour,
                &format!("server {name:?}"),
                "max_writes_per_hour",
                120,
            )?;
            let protocol = match &server.protocol {
                None => gatekeeper_mcp::Protocol::default(),
                Some(era) => gatekeeper_mcp::Protocol::parse(era.get_ref()).ok_or_else(|| {
                    check.at(era, format!(
                        "server {name:?}: protocol = {:?} is not one the gate speaks; write \"2025-11-25\" (the default), \"2026-07-28\" or \"auto\" (try 2026-07-28, fall back)",
                        era.get_ref()
                    ))
                })?,
            };
            let max_catalog_pages = match &server.max_catalog_pages {
                None => gatekeeper_mcp::DEFAULT_MAX_CATALOG_PAGES,
                Some(pages) => match usize::try_from(*pages.get_ref()) {
                    Ok(pages) if (1..=MAX_CATALOG_PAGES).contains(&pages) => pages,
                    _ => {
                        return Err(check.at(pages, format!(
                            "server {name:?}: max_catalog_pages = {} is out of range; write a number of tools/list pages from 1 to {MAX_CATALOG_PAGES}, for example max_catalog_pages = {}",
                            pages.get_ref(),
                            gatekeeper_mcp::DEFAULT_MAX_CATALOG_PAGES
                        )));
                    }
                },
            };
            let confinement = confinement(&check, &name, &server)?;
            let command = match &transport {
                Transport::Stdio(stdio) => Some((stdio.program.as_str(), stdio.args.as_slice())),
                Transport::Http { .. } => None,
            };
            let pending = crate::pending::mode(
                &name,
                server.pending.as_ref().map(|p| p.get_ref().as_str()),
                server.simulator.as_ref().map(|s| s.get_ref().as_str()),
                command,
            )
            .map_err(|(message, on_simulator)| {
                let span = match on_simulator {
                    true => server.simulator.as_ref().map(Spanned::span),
                    false => server.pending.as_ref().map(Spanned::span),
                };
                check.error(span.or(Some(server.name.span())), message)
            })?;
            servers.push(ServerConfig {
                confinement,
                pending_ttl,
                name,
                transport,
                trust: match server.trust {
                    RawTrust::Byo => ServerTrust::Byo,
                    RawTrust::Vetted => ServerTrust::Vetted,
                    RawTrust::Untrusted => ServerTrust::Untrusted,
                },
                deadline,
                sensitive_reads: server.sensitive_reads,
                sensitive_resources: server.sensitive_resources,
                reads: server.reads,
                local_only: server.local_only,
                forward_sampling: server.forward_sampling,
                forward_elicitation: server.forward_elicitation,
                question_wait,
                max_result_bytes,
                protocol,
                max_writes_per_hour,
                max_catalog_pages,
                pending,
            });
        }

        let mut agents: Vec<AgentConfig> = Vec::new();
        for agent in raw.agents {
            let name = agent.name.get_ref().clone();
            if !valid_name(&name) {
                return Err(check.at(&agent.name, format!(
                    "agent name {name:?} is not usable; write 1 to 32 letters, digits, '-' or single '_', for example name = \"coder\""
                )));
            }
            if agents.iter().any(|a| a.name == name) {
                return Err(check.at(
                    &agent.name,
                    format!("a second agent is named {name:?}; give each [[agent]] its own name"),
                ));
            }
            let token = agent.token.get_ref().clone();
            if token.chars().count() < MIN_TOKEN_CHARS
                || token.chars().any(char::is_whitespace)
                || token.contains(TOKEN_PLACEHOLDER)
            {
                return Err(check.at(&agent.token, format!(
                    "agent {name:?}: the token must be at least {MIN_TOKEN_CHARS} characters without spaces; write a long random string, for example from `openssl rand -hex 24`"
                )));
            }
            if agents.iter().any(|a| a.token == token) {
                return Err(check.at(&agent.token, format!(
                    "agent {name:?} has the same token as another agent; give each agent its own token"
                )));
            }
            let mut grants: Vec<GrantConfig> = Vec::new();
            for grant in agent.grants {
                let server = grant.server.get_ref().clone();
                if !servers.iter().any(|s| s.name == server) {
                    let known: Vec<&str> = servers.iter().map(|s| s.name.as_str()).collect();
                    return Err(check.at(&grant.server, format!(
                        "agent {name:?} is granted server {server:?}, which no [[server]] defines; write one of: {}",
                        if known.is_empty() { "(no servers yet)".to_owned() } else { known.join(", ") }
                    )));
                }
                if grants.iter().any(|g| g.server == server) {
                    return Err(check.at(&grant.server, format!(
                        "agent {name:?} has two grants of server {server:?}; merge them into one [[agent.grant]]"
                    )));
                }
                grants.push(GrantConfig {
                    server,
                    tools: grant.tools,
                });
            }
            let max_open_actions = quota(
                &check,
                &agent.max_open_actions,
                &format!("agent {name:?}"),
                "max_open_actions",
                10,
            )?;
            let max_writes_per_hour = quota(
                &check,
                &agent.max_writes_per_hour,
                &format!("agent {name:?}"),
                "max_writes_per_hour",
                60,
            )?;
            agents.push(AgentConfig {
                name,
                token,
                grants,
                max_open_actions,
                max_writes_per_hour,
            });
        }

        let notify = match raw.notify {
            None => None,
            Some(notify) => {
                let program = notify.command.get_ref().clone();
                if !program_exists(&program) {
                    return Err(check.at(&notify.command, format!(
                        "notify: command {program:?} was not found{}; write the full path to the program, for example command = \"/usr/bin/notify-send\"",
                        if program.contains('/') { "" } else { " on PATH" }
                    )));
                }
                let min_interval = match &notify.min_interval_seconds {
                    None => Duration::from_secs(DEFAULT_NOTIFY_INTERVAL_SECONDS),
                    Some(s)
                        if (MIN_NOTIFY_INTERVAL_SECONDS..=MAX_DEADLINE_SECONDS)
                            .contains(s.get_ref()) =>
                    {
                        Duration::from_secs(*s.get_ref())
                    }
                    Some(s) => {
                        return Err(check.at(s, format!(
                            "notify: min_interval_seconds = {} is out of range; write a number of seconds from {MIN_NOTIFY_INTERVAL_SECONDS} to {MAX_DEADLINE_SECONDS}, for example min_interval_seconds = 60",
                            s.get_ref()
                        )));
                    }
                };
                Some(NotifyConfig {
                    command: program,
                    args: notify.args,
                    min_interval,
                    page: None,
                })
            }
        };

        let db = match &raw.db {
            None => None,
            Some(db) => Some(check_db_url(db.get_ref()).map_err(|message| check.at(db, message))?),
        };
        let deciders = match &raw.deciders {
            None => None,
            Some(list) => Some(
                crate::deciders::Deciders::resolve(
                    list.get_ref().iter().map(|e| e.get_ref().as_str()),
                )
                .map_err(|bad| {
                    match bad.index.and_then(|i| list.get_ref().get(i)) {
                        Some(entry) => check.at(entry, bad.message),
                        None => check.at(list, bad.message),
                    }
                })?,
            ),
        };
        let socket = match &raw.socket {
            Some(socket) if !socket.get_ref().is_absolute() => {
                return Err(check.at(socket, format!(
                    "socket = {:?} is not an absolute path; write where the person's socket goes, for example socket = \"/run/gate/gate.sock\", or leave it out for gate.sock in the data directory",
                    socket.get_ref().display().to_string()
                )));
            }
            socket => socket.as_ref().map(|s| s.get_ref().clone()),
        };

        let mut redact_env = Vec::new();
        for variable in &raw.redact_env {
            let name = variable.get_ref();
            let valid = name.len() <= 128
                && name
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(check.at(variable, format!(
                    "redact_env has {name:?}, which is not the name of an environment variable; write the variable's name, not its value, for example redact_env = [\"MY_SERVICE_TOKEN\"]"
                )));
            }
            redact_env.push(name.clone());
        }

        let defaults = HttpLimits::default();
        let within = |key: &str,
                      value: Option<&Spanned<u64>>,
                      range: std::ops::RangeInclusive<u64>,
                      default: u64| {
            match value {
                None => Ok(default),
                Some(v) if range.contains(v.get_ref()) => Ok(*v.get_ref()),
                Some(v) => Err(check.at(v, format!(
                    "{key} = {} is out of range; write a number from {} to {}, for example {key} = {default}",
                    v.get_ref(),
                    range.start(),
                    range.end()
                ))),
            }
        };
        for origin in &raw.allowed_origins {
            if !(origin == "null"
                || origin.starts_with("http://")
                || origin.starts_with("https://"))
            {
                return Err(check.error(None, format!(
                    "allowed_origins has {origin:?}, which is not an origin; write the scheme, host and port a browser sends, for example \"http://localhost:3000\""
                )));
            }
        }
        let catalog_check = Duration::from_secs(within(
            "catalog_check_seconds",
            raw.catalog_check_seconds.as_ref(),
            1..=86_400,
            DEFAULT_CATALOG_CHECK_SECONDS,
        )?);
        let http = HttpLimits {
            allowed_origins: raw.allowed_origins.clone(),
            allowed_hosts: raw.host.iter().map(|h| h.get_ref().clone()).collect(),
            max_connections: within(
                "max_connections",
                raw.max_connections.as_ref(),
                4..=65_536,
                defaults.max_connections as u64,
            )? as usize,
            header_timeout: Duration::from_secs(within(
                "header_timeout_seconds",
                raw.header_timeout_seconds.as_ref(),
                1..=300,
                defaults.header_timeout.as_secs(),
            )?),
            sessions: SessionLimits {
                total: within(
                    "max_sessions",
                    raw.max_sessions.as_ref(),
                    1..=100_000,
                    defaults.sessions.total as u64,
                )? as usize,
                per_agent: within(
                    "max_sessions_per_agent",
                    raw.max_sessions_per_agent.as_ref(),
                    1..=100_000,
                    defaults.sessions.per_agent as u64,
                )? as usize,
            },
        };
        let tls = listener_tls(&check, "", &raw.tls, &raw.tls_cert, &raw.tls_key)?;
        let host = match &raw.host {
            None if tls.is_some() && !listen.ip().is_loopback() => {
                return Err(check.at(
                    raw.listen.as_ref().expect("a non-loopback listen is written"),
                    "agents on other machines reach the gate by a name: add host = \"NAME\" (for example host = \"gate.example.org\"), which their requests and the certificate must name".to_owned(),
                ));
            }
            None => None,
            Some(host) => {
                let name = host.get_ref();
                if name.is_empty() || name.contains([':', '/', ' ']) {
                    return Err(check.at(host, format!(
                        "host = {name:?} is not a host name; write the name alone, for example host = \"gate.example.org\""
                    )));
                }
                Some(name.clone())
            }
        };
        let web = web(&check, raw.web, listen)?;
        let notify = notify.map(|n| NotifyConfig {
            page: web.as_ref().map(|w| w.origin.clone()),
            ..n
        });
        Ok(Self {
            path: path.to_owned(),
            listen,
            servers,
            agents,
            pending_ttl: pending_ttl(&check, raw.pending_ttl_seconds.as_ref(), "")?,
            notify,
            db,
            warnings: Vec::new(),
            http,
            catalog_check,
            redact_env,
            deciders,
            socket,
            web,
            tls,
            host,
        })
    }
}

/// A listener's TLS from `tls = "self-signed"`, or `tls_cert` and `tls_key` (files that
/// exist); `what` begins each message (`"web: "`, or nothing at the top level).
fn listener_tls(
    check: &Checker<'_>,
    what: &str,
    tls: &Option<Spanned<String>>,
    cert: &Option<Spanned<PathBuf>>,
    key: &Option<Spanned<PathBuf>>,
) -> Result<Option<ListenerTls>, ConfigError> {
    Ok(match (tls, cert, key) {
        (None, None, None) => None,
        (Some(kind), None, None) if kind.get_ref() == "self-signed" => {
            Some(ListenerTls::SelfSigned)
        }
        (Some(kind), None, None) => {
            return Err(check.at(kind, format!(
                "{what}tls = {:?} is not known; write tls = \"self-signed\" for a certificate the gate makes, or give tls_cert and tls_key (PEM files) instead",
                kind.get_ref()
            )));
        }
        (None, Some(cert), Some(key)) => {
            for file in [cert, key] {
                if !file.get_ref().is_file() {
                    return Err(check.at(file, format!(
                        "{what}{} does not exist or is not a file; give the PEM file's full path",
                        file.get_ref().display()
                    )));
                }
            }
            Some(ListenerTls::Files {
                cert: cert.get_ref().clone(),
                key: key.get_ref().clone(),
            })
        }
        (Some(kind), _, _) => {
            return Err(check.at(
                kind,
                format!(
                    "{what}give either tls = \"self-signed\" or tls_cert and tls_key, not both"
                ),
            ));
        }
        (None, Some(one), None) | (None, None, Some(one)) => {
            return Err(check.at(
                one,
                format!("{what}tls_cert and tls_key go together; give both PEM files"),
            ));
        }
    })
}

/// The `[web]` table checked: an address with a port, not the agents'; TLS from
/// `tls = "self-signed"` or `tls_cert` and `tls_key`; an address other than loopback only
/// with TLS; and an `origin` that is a secure context with a name, as passkeys need
/// (`http://localhost:PORT` or `https://HOST:PORT`).
fn web(
    check: &Checker<'_>,
    raw: Option<RawWeb>,
    agents: SocketAddr,
) -> Result<Option<WebConfig>, ConfigError> {
    let Some(raw) = raw else { return Ok(None) };
    let listen: SocketAddr = raw.listen.get_ref().parse().map_err(|_| {
        check.at(&raw.listen, format!(
            "web: listen = {:?} is not an address with a port; write for example listen = \"127.0.0.1:8790\"",
            raw.listen.get_ref()
        ))
    })?;
    if listen == agents || (listen.port() == agents.port() && listen.port() != 0) {
        return Err(check.at(&raw.listen, format!(
            "web: listen = {:?} is the agents' address; the review page never shares a listener with agents: give it a port of its own, for example listen = \"127.0.0.1:8790\"",
            raw.listen.get_ref()
        )));
    }
    let tls = listener_tls(check, "web: ", &raw.tls, &raw.tls_cert, &raw.tls_key)?;
    if !listen.ip().is_loopback() && tls.is_none() {
        return Err(check.at(&raw.listen, format!(
            "web: listen = {:?} is not a loopback address, and the page would be reached without TLS; add tls = \"self-signed\" (or tls_cert and tls_key) and an https origin, or listen on \"127.0.0.1:8790\" and reach it through an SSH tunnel (ssh -L 8790:127.0.0.1:8790 HOST)",
            raw.listen.get_ref()
        )));
    }
    let scheme = if tls.is_some() { "https" } else { "http" };
    let origin = match &raw.origin {
        None if listen.ip().is_loopback() => format!("{scheme}://localhost:{}", listen.port()),
        None => {
            return Err(check.at(&raw.listen, format!(
                "web: a page on {listen} needs origin = \"https://NAME:{}\", the name devices reach this machine by (passkeys are bound to a name, never to an address)",
                listen.port()
            )));
        }
        Some(origin) => {
            let text = origin.get_ref().trim_end_matches('/').to_owned();
            let host = text
                .strip_prefix(&format!("{scheme}://"))
                .map(|rest| rest.split(':').next().unwrap_or(""));
            let named = host.is_some_and(|h| {
                !h.is_empty() && h.parse::<std::net::IpAddr>().is_err() && !h.starts_with('[')
            });
            if !named || (scheme == "http" && host != Some("localhost")) {
                return Err(check.at(origin, format!(
                    "web: origin = {:?} is not a secure context with a name: passkeys work only on https:// (with TLS) or on http://localhost, never on an IP address; write origin = \"{scheme}://{}:{}\"",
                    origin.get_ref(),
                    if scheme == "https" { "NAME" } else { "localhost" },
                    listen.port()
                )));
            }
            text
        }
    };
    Ok(Some(WebConfig {
        listen,
        origin,
        tls,
    }))
}

/// Check a database URL (`db` in the file, `gate serve --db`): only PostgreSQL URLs name
/// a shared database; the default SQLite file needs no setting.
pub fn check_db_url(url: &str) -> Result<String, String> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(url.to_owned())
    } else {
        Err(
            "db must be a PostgreSQL URL such as \"postgres://gate@db.example:5432/gate\"; leave it out to keep the ledger in the SQLite file of the data directory".to_owned(),
        )
    }
}

/// The placeholder for an agent's token in [`EXAMPLE`]; refused as a token.
pub const TOKEN_PLACEHOLDER: &str = "{TOKEN}";

/// The commented example `gate init` writes, after replacing [`TOKEN_PLACEHOLDER`] with a
/// random token.
pub const EXAMPLE: &str = r#"# gate.toml: what the gate sits in front of, and who may use it.
# Every write an agent asks for waits here until you approve it (`gate pending`,
# `gate approve ID`). Unknown keys are refused, so a typo never passes silently.

# Where agents reach the gate over MCP (streamable HTTP). Loopback only.
listen = "127.0.0.1:7431"

# How long a staged write waits for your decision before it expires (nothing is sent,
# and the agent is told it expired). Default: forever. A [[server]] may set its own.
# pending_ttl_seconds = 86400

# A program run when new work waits (never through a shell). It gets the count, agent,
# server and tool as arguments after its own args, and in GATE_* variables; a burst of
# stages within min_interval_seconds (default 60) is one run.
# [notify]
# command = "/usr/bin/notify-send"
# args = ["gate"]
# min_interval_seconds = 60
# The agents' endpoint: at most this many connections and open sessions, and how long a
# connection may take to send a request's head. Browsers' pages are refused unless their
# origin is listed (agents and SDKs send none).
# catalog_check_seconds = 60     # how often each server's tools are read again: a tool changed
#                                # without a word is refused from then on
# max_connections = 256
# header_timeout_seconds = 10
# max_sessions = 256
# max_sessions_per_agent = 32
# allowed_origins = ["http://localhost:3000"]
# Secrets are redacted from what you read (`gate show`, `gate pending`, `gate review`, the
# ledger's export, the notifier, the log): well-known token patterns, every agent's token
# and every server's env and header values. Name more here, by environment variable (its
# value is redacted; values under 8 characters are not). `--reveal` and `v` show them.
# redact_env = ["MY_SERVICE_TOKEN"]
# A team's gate: several daemons share one PostgreSQL database (one queue, one ledger).
# Leave it out to keep the ledger in a SQLite file in the data directory.
# db = "postgres://gate@db.example:5432/gate"
# Who decides when the daemon runs as its own OS user (the README's separated
# deployment): login names and groups ("group:NAME") that may use the person's socket.
# Without it only the daemon's own user may; with it the socket is open to every account
# and each request is checked against this list (the daemon's own user only if named).
# The socket then goes where they can reach it: `gate pending --socket PATH`, or set
# GATE_SOCKET=PATH in their environment.
# deciders = ["alice", "group:staff"]
# socket = "/run/gate/gate.sock"

# A downstream MCP server, started as a child process speaking MCP on stdio.
# Its tools reach agents as `files__<tool>`.
[[server]]
name = "files"
command = "npx"
args = ["-y", "@modelcontextprotocol/server-filesystem", "/home/me/notes"]
# env = { LOG_LEVEL = "info" }   # its environment (it inherits only PATH, HOME, LANG, ...)
# trust = "vetted"               # default "byo": its annotations never auto-apply a write;
#                                # "untrusted": nothing it says is believed, every tool waits for you
# reads = ["read_file"]          # tools you call reads, whatever the server says (on any trust)
# deadline_seconds = 30          # every request to it has a deadline (default 60)
# sensitive_reads = ["read_file"]  # reading one locks that agent down: no more of its writes
# sensitive_resources = true     # reading any of its resources locks the reading agent down too
# local_only = true              # its reads reach nothing outside this machine: a locked-down
#                                # agent may still read it (other servers' reads are refused)
# forward_elicitation = true     # it may ask for input: during a read, the agent's user;
#                                # during your approved send, you (`gate answer`)
# question_wait_seconds = 30     # a question during your send is declined after this wait
#                                # (default: shortly before the send's deadline)
# forward_sampling = true        # during a read, it may ask the agent's model for a completion
# max_writes_per_hour = 120      # the most writes all agents together stage on it in an hour
# protocol = "2026-07-28"        # the era the gate speaks to it: "2025-11-25" (default),
#                                # "2026-07-28", or "auto" (try 2026-07-28, fall back)
# max_result_mib = 16            # a larger answer is not read: the call gets a note saying so
# pending_ttl_seconds = 3600     # its staged writes expire after an hour without a decision
# max_catalog_pages = 1000       # a catalog with more tools/list pages is refused, never cut
# pending = "simulate"           # the agent's reads show its own pending writes, marked
# simulator = "filesystem"       # (the gate has "filesystem" and "memory"); default "hide"
# paths = ["/home/me/notes"]     # it may write only here (it runs confined: the gate's own
#                                # files are out of its reach; `gate check` says what this
#                                # machine enforces); npx-run servers also need ~/.npm
# network = false                # no TCP for it
# confine = false                # run it unconfined (only for a server you trust as yourself)

# A downstream server over MCP streamable HTTP (http:// on this machine: this build has
# no TLS). Header values come from environment variables of `gate serve`, so secrets
# never sit in this file, the ledger or a log.
# [[server]]
# name = "remote"
# url = "http://127.0.0.1:8931/mcp"
# headers_from_env = { Authorization = "REMOTE_MCP_AUTHORIZATION" }

# An agent: it presents its token as `Authorization: Bearer <token>`, and sees only
# what its grants name (nothing by default).
[[agent]]
name = "coder"
token = "{TOKEN}"   # `gate init` wrote a random one; or: openssl rand -hex 24
# max_open_actions = 10        # the most of its writes that wait for you at once
# max_writes_per_hour = 60     # the most writes it stages in any hour

[[agent.grant]]
server = "files"
# tools = ["read_file", "write_file"]   # default: every tool of the server
"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("gate.toml"), text)
    }

    fn refused(text: &str) -> String {
        parse(text).expect_err("refused").to_string()
    }

    const TOKEN: &str = "0123456789abcdef01234567";

    #[test]
    fn the_example_parses_once_its_command_exists_and_its_token_is_set() {
        let example = EXAMPLE.replace("command = \"npx\"", "command = \"sh\"");
        let message = parse(&example)
            .expect_err("the placeholder is no token")
            .to_string();
        assert!(message.contains("the token must be"), "{message}");
        let example = example.replace(TOKEN_PLACEHOLDER, TOKEN);
        let config = parse(&example).expect("the example is valid");
        assert_eq!(config.servers.len(), 1);
        assert_eq!(config.servers[0].trust, ServerTrust::Byo);
        assert_eq!(config.agents[0].grants[0].tools, None);
        assert_eq!(config.listen.to_string(), DEFAULT_LISTEN);
    }

    #[test]
    fn an_unknown_key_is_refused_with_its_line_and_the_keys_that_exist() {
        let message = refused("[[server]]\nname = \"a\"\ncomand = \"sh\"\n");
        assert!(
            message.starts_with("gate.toml:3: unknown field `comand`"),
            "{message}"
        );
        assert!(message.contains("`command`"), "{message}");
    }

    #[test]
    fn a_duplicate_server_name_is_refused_at_the_second() {
        let message = refused(
            "[[server]]\nname = \"a\"\ncommand = \"sh\"\n\n[[server]]\nname = \"a\"\ncommand = \"sh\"\n",
        );
        assert!(
            message.starts_with("gate.toml:6: a second server is named \"a\""),
            "{message}"
        );
    }

    #[test]
    fn a_missing_command_is_refused_with_what_to_write() {
        let message =
            refused("[[server]]\nname = \"a\"\ncommand = \"no-such-mcp-server-anywhere\"\n");
        assert!(message.starts_with("gate.toml:3: server \"a\": command \"no-such-mcp-server-anywhere\" was not found on PATH"), "{message}");
        assert!(
            message.contains("command = \"/usr/local/bin/no-such-mcp-server-anywhere\""),
            "{message}"
        );
        let message = refused("[[server]]\nname = \"a\"\n");
        assert!(
            message.starts_with("gate.toml:2: server \"a\" has neither a command nor a url"),
            "{message}"
        );
    }

    #[test]
    fn a_bad_url_is_refused_with_an_example() {
        for url in ["ftp://x", "http://", "mcp.example.com", "http://:80/mcp"] {
            let message = refused(&format!("[[server]]\nname = \"a\"\n\nurl = \"{url}\"\n"));
            assert!(
                message.starts_with("gate.toml:4: server \"a\": url"),
                "{url}: {message}"
            );
            assert!(
                message.contains("url = \"http://127.0.0.1:8931/mcp\""),
                "{message}"
            );
        }
        let config = parse("[[server]]\nname = \"a\"\nurl = \"http://127.0.0.1:9/mcp\"\nheaders_from_env = { Authorization = \"A_TOKEN\" }\n").expect("valid");
        assert_eq!(
            config.servers[0].transport,
            Transport::Http {
                url: "http://127.0.0.1:9/mcp".into(),
                headers_from_env: vec![("Authorization".into(), "A_TOKEN".into())],
                ca_file: None,
                oauth: None,
            }
        );
    }

    #[test]
    fn oauth_is_taken_over_https_or_loopback_and_its_client_is_complete() {
        let config = parse(
            "[[server]]\nname = \"a\"\nurl = \"https://mcp.example.com/mcp\"\n[server.oauth]\nscopes = [\"read\"]\n",
        )
        .expect("valid");
        let Transport::Http {
            oauth: Some(oauth), ..
        } = &config.servers[0].transport
        else {
            panic!("{:?}", config.servers[0].transport);
        };
        assert_eq!(oauth.scopes, ["read"]);
        assert_eq!(oauth.grant, OAuthGrant::AuthorizationCode);
        assert!(
            parse("[[server]]\nname = \"a\"\nurl = \"http://localhost:9/mcp\"\noauth = {}\n")
                .is_ok()
        );
        for (text, says) in [
            (
                "url = \"http://mcp.example.com/mcp\"\noauth = {}",
                "in the clear",
            ),
            (
                "url = \"https://mcp.example.com/mcp\"\noauth = { client_secret_env = \"S\" }",
                "set its client_id too",
            ),
            (
                "url = \"https://mcp.example.com/mcp\"\noauth = { grant = \"client_credentials\", client_id = \"c\" }",
                "one of client_secret_env",
            ),
            (
                "url = \"https://mcp.example.com/mcp\"\noauth = { client_id = \"c\", private_key_file = \"/k.pem\" }",
                "goes with grant",
            ),
            (
                "url = \"https://mcp.example.com/mcp\"\noauth = { client_metadata_url = \"http://x/c.json\" }",
                "must be an https://",
            ),
            (
                "url = \"https://mcp.example.com/mcp\"\noauth = { token = \"t\" }",
                "unknown field",
            ),
        ] {
            let message = refused(&format!("[[server]]\nname = \"a\"\n{text}\n"));
            assert!(message.contains(says), "{text}: {message}");
        }
    }

    #[test]
    fn an_https_url_is_taken_with_a_ca_file_of_its_own_and_a_ca_file_needs_https() {
        let config = parse("[[server]]\nname = \"a\"\nurl = \"https://mcp.example.com/mcp\"\n")
            .expect("valid");
        assert!(matches!(
            &config.servers[0].transport,
            Transport::Http { url, ca_file: None, .. } if url == "https://mcp.example.com/mcp"
        ));
        let message = refused(
            "[[server]]\nname = \"a\"\nurl = \"http://127.0.0.1:9/mcp\"\nca_file = \"/etc/hostname\"\n",
        );
        assert!(
            message.contains("ca_file is for an https:// url"),
            "{message}"
        );
        let message = refused(
            "[[server]]\nname = \"a\"\nurl = \"https://mcp.example.com/mcp\"\nca_file = \"/no/such/ca.pem\"\n",
        );
        assert!(
            message
                .starts_with("gate.toml:4: server \"a\": ca_file /no/such/ca.pem does not exist"),
            "{message}"
        );
    }

    #[test]
    fn agents_get_nothing_unless_granted_and_only_known_servers() {
        let config =
            parse(&format!("[[agent]]\nname = \"a\"\ntoken = \"{TOKEN}\"\n")).expect("valid");
        assert!(config.agents[0].grants.is_empty());
        let message = refused(&format!(
            "[[agent]]\nname = \"a\"\ntoken = \"{TOKEN}\"\n[[agent.grant]]\nserver = \"nope\"\n"
        ));
        assert!(
            message.starts_with("gate.toml:5: agent \"a\" is granted server \"nope\""),
            "{message}"
        );
    }

    #[test]
    fn weak_or_shared_tokens_are_refused() {
        let message = refused("[[agent]]\nname = \"a\"\ntoken = \"short\"\n");
        assert!(
            message.starts_with("gate.toml:3: agent \"a\": the token must be"),
            "{message}"
        );
        let message = refused(&format!(
            "[[agent]]\nname = \"a\"\ntoken = \"{TOKEN}\"\n[[agent]]\nname = \"b\"\ntoken = \"{TOKEN}\"\n"
        ));
        assert!(
            message.starts_with("gate.toml:6: agent \"b\" has the same token"),
            "{message}"
        );
    }

    #[test]
    fn only_loopback_addresses_and_sane_deadlines_are_accepted() {
        let message = refused("listen = \"0.0.0.0:7431\"\n");
        assert!(
            message.starts_with("gate.toml:1: listen = \"0.0.0.0:7431\" is not a loopback address"),
            "{message}"
        );
        assert!(message.contains("tokens in clear"), "{message}");
        // Agents on other machines: TLS and the name they reach the gate by.
        let message = refused("listen = \"0.0.0.0:7431\"\ntls = \"self-signed\"\n");
        assert!(message.contains("add host = \"NAME\""), "{message}");
        let config = parse(
            "listen = \"0.0.0.0:7431\"\ntls = \"self-signed\"\nhost = \"gate.example.org\"\n",
        )
        .expect("valid");
        assert_eq!(config.tls, Some(ListenerTls::SelfSigned));
        assert_eq!(config.http.allowed_hosts, ["gate.example.org"]);
        let message = refused("tls_cert = \"/no/such/cert.pem\"\n");
        assert!(
            message.contains("tls_cert and tls_key go together"),
            "{message}"
        );
        let message = refused("[[server]]\nname = \"a\"\ncommand = \"sh\"\ndeadline_seconds = 0\n");
        assert!(
            message.starts_with("gate.toml:4: server \"a\": deadline_seconds = 0 is out of range"),
            "{message}"
        );
        let message =
            refused("[[server]]\nname = \"a\"\ncommand = \"sh\"\nmax_catalog_pages = 0\n");
        assert!(
            message.starts_with("gate.toml:4: server \"a\": max_catalog_pages = 0 is out of range"),
            "{message}"
        );
        let message =
            refused("[[server]]\nname = \"a\"\ncommand = \"sh\"\nmax_writes_per_hour = 0\n");
        assert!(
            message
                .starts_with("gate.toml:4: server \"a\": max_writes_per_hour = 0 is out of range")
                && message.contains("or leave it out for no limit"),
            "{message}"
        );
        let message = refused(
            "[[agent]]\nname = \"coder\"\ntoken = \"0123456789abcdef0123456789abcdef\"\nmax_open_actions = 0\n",
        );
        assert!(
            message
                .starts_with("gate.toml:4: agent \"coder\": max_open_actions = 0 is out of range"),
            "{message}"
        );
    }

    #[test]
    fn a_file_others_may_write_is_refused_and_one_they_may_read_is_warned_of() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("gate-config-modes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let path = dir.join("gate.toml");
        std::fs::write(&path, "").expect("written");
        let chmod = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).expect("chmod")
        };
        chmod(&path, 0o600);
        assert!(Config::load(&path).expect("private").warnings.is_empty());
        chmod(&path, 0o644);
        let warnings = Config::load(&path).expect("readable").warnings;
        let expected = format!(
            "other users may read this file (mode 644), and it holds the agents' tokens; run `chmod 600 {}`",
            path.display()
        );
        assert!(warnings[0].ends_with(&expected), "{warnings:?}");
        chmod(&path, 0o666);
        let refused = Config::load(&path)
            .expect_err("writable by others")
            .to_string();
        assert!(
            refused.contains("other users may write this file (mode 666)"),
            "{refused}"
        );
        chmod(&path, 0o600);
        chmod(&dir, 0o777);
        let refused = Config::load(&path)
            .expect_err("in a shared directory")
            .to_string();
        assert!(
            refused.contains("other users may write its directory"),
            "{refused}"
        );
        chmod(&dir, 0o1777);
        assert!(
            Config::load(&path).is_ok(),
            "a sticky directory keeps others' hands off"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_server_name_with_the_tool_separator_is_refused() {
        let message = refused("[[server]]\nname = \"a__b\"\ncommand = \"sh\"\n");
        assert!(
            message.starts_with("gate.toml:2: server name \"a__b\" is not usable"),
            "{message}"
        );
    }

    #[test]
    fn the_review_page_listens_on_loopback_or_with_tls_on_a_port_of_its_own_at_a_named_origin() {
        let config = parse("[web]\nlisten = \"127.0.0.1:8790\"\n").expect("valid");
        let web = config.web.expect("on");
        assert_eq!(web.origin, "http://localhost:8790");
        assert!(parse("").expect("valid").web.is_none(), "off by default");

        let message = refused("[web]\nlisten = \"0.0.0.0:8790\"\n");
        assert!(
            message.starts_with(
                "gate.toml:2: web: listen = \"0.0.0.0:8790\" is not a loopback address"
            ),
            "{message}"
        );
        assert!(message.contains("ssh -L"), "{message}");

        let message = refused(&format!("[web]\nlisten = \"{DEFAULT_LISTEN}\"\n"));
        assert!(
            message.contains("never shares a listener with agents"),
            "{message}"
        );

        let message =
            refused("[web]\nlisten = \"127.0.0.1:8790\"\norigin = \"http://127.0.0.1:8790\"\n");
        assert!(message.contains("not a secure context"), "{message}");
    }

    #[test]
    fn a_notifier_links_to_the_review_page_when_it_is_on() {
        let config = parse("[notify]\ncommand = \"sh\"\n\n[web]\nlisten = \"127.0.0.1:8790\"\n")
            .expect("valid");
        assert_eq!(
            config.notify.expect("set").page.as_deref(),
            Some("http://localhost:8790")
        );
    }
}

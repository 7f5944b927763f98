//! `gate mcp --agent NAME`: a stdio bridge for MCP clients that launch their servers as
//! subprocesses. It relays raw JSON-RPC between the client's stdin and stdout (one message
//! a line) and the running daemon's streamable HTTP endpoint, with the agent's token.
//! `gate mcp --token-file PATH --endpoint HOST:PORT` (or `--url`) takes the token from a
//! file of its own instead of the daemon's configuration, so an agent's OS user holds
//! that one token and nothing else (the separated deployment in the README).
//!
//! Each line from the client is POSTed as it is; each message the daemon answers with
//! (one JSON body, or a stream of server-sent events: progress, server requests, then the
//! response) is written to stdout as one line as soon as it arrives, through one writer.
//! Requests run concurrently, so a long `tools/call` holds back neither a ping nor a
//! cancellation. After a 2025-era `initialize`, the daemon's standalone stream (for
//! example `notifications/tools/list_changed`) is relayed too; a 2026-07-28 client needs
//! no handshake, each of its requests names its version in `_meta`.
//!
//! Invariant: the bridge relays messages; it never rebuilds a result from typed fields, so
//! no protocol field can be lost; it touches only the agent's token and the transport's
//! headers (`Mcp-Session-Id`, `MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name`, derived from
//! each message). It keeps no state beyond the session id and the negotiated protocol
//! version, so everything the agent does is decided and recorded by the daemon. A request
//! the daemon cannot answer gets a JSON-RPC error with its id, never silence.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use base64::Engine as _;
use futures_util::StreamExt as _;
use reqwest::header::{self, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sse_stream::SseStream;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinHandle, JoinSet};
use tracing::{debug, warn};

use crate::config::Config;
use crate::http::MCP_PATH;

/// Why the bridge could not start.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BridgeError(String);

/// The first protocol version without the `initialize` handshake, whose requests name
/// their version in `_meta` and carry the `Mcp-Method` and `Mcp-Name` headers (SEP-2243).
const STANDARD_HEADERS: &str = "2026-07-28";
/// Where a request names its protocol version (2026-07-28 and later).
const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
const SESSION_ID: &str = "mcp-session-id";
const PROTOCOL_VERSION: &str = "mcp-protocol-version";
const MCP_METHOD: &str = "mcp-method";
const MCP_NAME: &str = "mcp-name";
const EVENT_STREAM: &str = "text/event-stream";

/// How long the bridge waits for the daemon to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long answers already on their way may still arrive once stdin closed.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// How long the `DELETE` of the session may take once stdin closed.
const DELETE_TIMEOUT: Duration = Duration::from_secs(2);
/// The first and the longest wait before the standalone stream is opened again.
const LISTEN_BACKOFF: (Duration, Duration) = (Duration::from_millis(250), Duration::from_secs(10));

/// JSON-RPC's codes for a line that is not JSON, one that is no message, and the
/// bridge's own failures.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const INTERNAL_ERROR: i64 = -32603;

/// Connect to the daemon as `agent` (its token and address from `config`), then relay the
/// MCP client on this process's stdin and stdout until it closes stdin.
pub async fn run(config: &Config, agent: &str) -> Result<(), BridgeError> {
    let Some(entry) = config.agents.iter().find(|a| a.name == agent) else {
        let known: Vec<&str> = config.agents.iter().map(|a| a.name.as_str()).collect();
        return Err(BridgeError(format!(
            "{} has no agent named {agent:?}; it has: {}",
            config.path.display(),
            if known.is_empty() {
                "(none)".to_owned()
            } else {
                known.join(", ")
            }
        )));
    };
    if config.listen.port() == 0 {
        return Err(BridgeError(format!(
            "{} lets the daemon pick its port (listen = \"{}\"), so the bridge cannot find it; write a fixed port, for example listen = \"{}\"",
            config.path.display(),
            config.listen,
            crate::config::DEFAULT_LISTEN
        )));
    }
    // A daemon that serves TLS is reached by https, trusting its certificate: the one in
    // the configuration's files, or the one it generated in its data directory.
    let (url, ca_file) = match &config.tls {
        None => (format!("http://{}{MCP_PATH}", config.listen), None),
        Some(tls) => {
            let host = config.host.as_deref().unwrap_or("localhost");
            let ca = match tls {
                crate::config::ListenerTls::Files { cert, .. } => cert.clone(),
                crate::config::ListenerTls::SelfSigned => crate::tls::certificate_file(
                    host,
                    &crate::paths::default_data_dir().map_err(|e| BridgeError(e.to_string()))?,
                ),
            };
            (
                format!("https://{host}:{}{MCP_PATH}", config.listen.port()),
                Some(ca),
            )
        }
    };
    let bearer = HeaderValue::from_str(&format!("Bearer {}", entry.token)).map_err(|_| {
        BridgeError(format!(
            "the token of agent {agent:?} in {} cannot travel in an HTTP header; write it in printable ASCII",
            config.path.display()
        ))
    })?;
    let unauthorized = format!(
        "the gate daemon at {url} refused the token of agent {agent:?} (HTTP 401): the token in {} is not one the running daemon knows; ask the person to check that `gate serve` runs with this configuration",
        config.path.display()
    );
    relay(url, bearer, unauthorized, ca_file.as_deref()).await
}

/// Connect to the daemon's agents' endpoint at `url` with the one token `token_file`
/// holds (see [`read_token_file`]), then relay the MCP client on this process's stdin and
/// stdout until it closes stdin: the agent's user needs neither the daemon's
/// configuration nor any other agent's token.
pub async fn run_with_token_file(
    token_file: &Path,
    url: &str,
    ca_file: Option<&Path>,
) -> Result<(), BridgeError> {
    let token = read_token_file(token_file)?;
    let bearer = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
        BridgeError(format!(
            "the token in {} cannot travel in an HTTP header; write it in printable ASCII",
            token_file.display()
        ))
    })?;
    let unauthorized = format!(
        "the gate daemon at {url} refused the token in {} (HTTP 401): it is not a token the running daemon knows; ask the person who runs `gate serve` for this agent's token (its `token` in the daemon's configuration), or check that --endpoint or --url names that daemon",
        token_file.display()
    );
    relay(url.to_owned(), bearer, unauthorized, ca_file).await
}

/// The token in `path`: the file's text without surrounding whitespace. A file that its
/// group or other users may read or write is refused, with the `chmod` to run (it is the
/// agent's key to the gate); so is one that holds no usable token.
pub fn read_token_file(path: &Path) -> Result<String, BridgeError> {
    use std::os::unix::fs::PermissionsExt as _;
    let metadata = std::fs::metadata(path).map_err(|e| {
        BridgeError(format!(
            "cannot read the token file {} ({e}); write the agent's token there (one line, mode 0600), as the person who runs `gate serve` gave it",
            path.display()
        ))
    })?;
    let mode = metadata.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(BridgeError(format!(
            "the token file {} may be read or written by its group or other users (mode {mode:o}), and it holds an agent's key to the gate; run `chmod 600 {}`",
            path.display(),
            path.display()
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| {
        BridgeError(format!(
            "cannot read the token file {} ({e}); it must be readable by the user who runs `gate mcp`",
            path.display()
        ))
    })?;
    let token = text.trim();
    if token.chars().count() < crate::config::MIN_TOKEN_CHARS
        || token.chars().any(char::is_whitespace)
    {
        return Err(BridgeError(format!(
            "the token file {} holds no token (one line of at least {} characters without spaces); write the agent's token there, as its `token` in the daemon's configuration",
            path.display(),
            crate::config::MIN_TOKEN_CHARS
        )));
    }
    Ok(token.to_owned())
}

/// The daemon's agents' URL from `gate mcp --endpoint HOST:PORT` or `--url URL` (neither:
/// the default address, [`crate::config::DEFAULT_LISTEN`]): `https://` to a daemon that
/// serves TLS, anywhere; `http://` only on a loopback address, since the token would
/// travel in clear.
pub fn agents_url(endpoint: Option<&str>, url: Option<&str>) -> Result<String, BridgeError> {
    if let Some(url) = url {
        let parsed = reqwest::Url::parse(url).ok().filter(|u| {
            (u.scheme() == "https" && u.host_str().is_some_and(|h| !h.is_empty()))
                || u.scheme() == "http"
                    && u.host_str().is_some_and(|host| {
                        host == "localhost"
                            || host
                                .trim_start_matches('[')
                                .trim_end_matches(']')
                                .parse::<std::net::IpAddr>()
                                .is_ok_and(|ip| ip.is_loopback())
                    })
        });
        return match parsed {
            Some(_) => Ok(url.to_owned()),
            None => Err(BridgeError(format!(
                "--url {url:?} is neither an https:// URL nor an http:// URL on this machine; over http:// the token travels in clear, so write for example --url http://{}{MCP_PATH}, or --url https://NAME:PORT{MCP_PATH} for a daemon that serves TLS",
                crate::config::DEFAULT_LISTEN
            ))),
        };
    }
    let endpoint = endpoint.unwrap_or(crate::config::DEFAULT_LISTEN);
    match endpoint.parse::<std::net::SocketAddr>() {
        Ok(address) if address.ip().is_loopback() && address.port() != 0 => {
            Ok(format!("http://{address}{MCP_PATH}"))
        }
        _ => Err(BridgeError(format!(
            "--endpoint {endpoint:?} is not a loopback address with a port; write the daemon's `listen`, for example --endpoint {}",
            crate::config::DEFAULT_LISTEN
        ))),
    }
}

/// Relay the MCP client on stdin and stdout to the daemon at `url`, presenting `bearer`;
/// `unauthorized` is what the client is told if the daemon refuses it.
async fn relay(
    url: String,
    bearer: HeaderValue,
    unauthorized: String,
    ca_file: Option<&Path>,
) -> Result<(), BridgeError> {
    let client = gatekeeper_mcp::tls::builder(ca_file)
        .map_err(BridgeError)?
        .connect_timeout(CONNECT_TIMEOUT)
        .no_proxy()
        .build()
        .map_err(|e| BridgeError(format!("the bridge's HTTP client did not start: {e}")))?;
    let (out, lines) = mpsc::channel(256);
    let writer = tokio::spawn(write_lines(lines));
    let relay = Arc::new(Relay {
        client,
        url,
        bearer,
        unauthorized,
        session: Mutex::default(),
        out,
    });
    relay_stdin(&relay).await;
    drop(relay);
    let _ = writer.await;
    Ok(())
}

/// What the bridge knows of the conversation: the daemon's session, and the protocol
/// version to name in the transport's headers.
#[derive(Debug, Default, Clone)]
struct Session {
    /// The `Mcp-Session-Id` the daemon gave in answer to `initialize`.
    id: Option<String>,
    /// The version `initialize` negotiated, or the one the client's requests name.
    version: Option<String>,
}

struct Relay {
    client: reqwest::Client,
    url: String,
    bearer: HeaderValue,
    /// What the client is told when the daemon refuses the token (HTTP 401).
    unauthorized: String,
    session: Mutex<Session>,
    /// Lines for stdout, written in order by one task.
    out: mpsc::Sender<String>,
}

/// What a line from the client is.
#[derive(Debug, PartialEq)]
enum Kind {
    Request { id: Value, method: String },
    Notification { method: String },
    Response,
}

fn kind(message: &Value) -> Option<Kind> {
    let object = message.as_object()?;
    match (
        object.get("method").and_then(Value::as_str),
        object.get("id"),
    ) {
        (Some(method), Some(id)) => Some(Kind::Request {
            id: id.clone(),
            method: method.to_owned(),
        }),
        (Some(method), None) => Some(Kind::Notification {
            method: method.to_owned(),
        }),
        (None, Some(_)) if object.contains_key("result") || object.contains_key("error") => {
            Some(Kind::Response)
        }
        _ => None,
    }
}

/// A JSON-RPC error response, as one line.
fn error_line(id: &Value, code: i64, message: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}).to_string()
}

/// Read the client's lines until EOF, relaying each; then let answers on their way arrive
/// (briefly), end the session and stop.
async fn relay_stdin(relay: &Arc<Relay>) {
    let mut stdin = BufReader::new(crate::stdio::stdin());
    let mut tasks = JoinSet::new();
    let mut in_flight: HashMap<String, AbortHandle> = HashMap::new();
    let mut listener: Option<JoinHandle<()>> = None;
    let mut line = Vec::new();
    loop {
        line.clear();
        match stdin.read_until(b'\n', &mut line).await {
            Ok(0) => break,
            Ok(_) => {}
            Err(error) => {
                warn!(%error, "bridge.stdin.failed: stopping as if the client closed it");
                break;
            }
        }
        while tasks.try_join_next().is_some() {}
        let body = line.trim_ascii();
        if body.is_empty() {
            continue;
        }
        let message: Value = match serde_json::from_slice(body) {
            Ok(message) => message,
            Err(error) => {
                relay
                    .write(error_line(
                        &Value::Null,
                        PARSE_ERROR,
                        &format!("Parse error: the line is not JSON ({error}); send one JSON-RPC message a line"),
                    ))
                    .await;
                continue;
            }
        };
        let body = body.to_vec();
        match kind(&message) {
            None => {
                let id = message.get("id").cloned().unwrap_or(Value::Null);
                relay
                    .write(error_line(
                        &id,
                        INVALID_REQUEST,
                        "Invalid Request: a JSON-RPC message has a method (a request or a notification) or a result or error with an id (a response)",
                    ))
                    .await;
            }
            Some(Kind::Request { method, .. }) if method == "initialize" => {
                // Whatever follows needs the session this opens, so it is answered first.
                if let Some(old) = listener.take() {
                    old.abort();
                }
                relay.clone().post(body, message).await;
                if relay.session().id.is_some() {
                    listener = Some(tokio::spawn(relay.clone().listen()));
                }
            }
            Some(Kind::Request { id, .. }) => {
                in_flight.retain(|_, task| !task.is_finished());
                let task = tasks.spawn(relay.clone().post(body, message));
                in_flight.insert(id.to_string(), task);
            }
            Some(Kind::Notification { method }) => {
                // A cancelled request's answer is no longer wanted; on 2026-07-28, whose
                // server handles each request on its own, closing its stream is what
                // cancels it.
                if method == "notifications/cancelled"
                    && let Some(cancelled) = message.pointer("/params/requestId")
                    && let Some(task) = in_flight.remove(&cancelled.to_string())
                {
                    task.abort();
                }
                tasks.spawn(relay.clone().post(body, message));
            }
            Some(Kind::Response) => {
                tasks.spawn(relay.clone().post(body, message));
            }
        }
    }
    if let Some(listener) = listener {
        listener.abort();
        let _ = listener.await;
    }
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    tasks.shutdown().await;
    relay.end_session().await;
}

/// Write each line to stdout as it comes, flushed, so lines never interleave and a
/// notification reaches the client while a call still runs.
async fn write_lines(mut lines: mpsc::Receiver<String>) {
    let mut stdout = crate::stdio::stdout();
    while let Some(mut line) = lines.recv().await {
        line.push('\n');
        if let Err(error) = stdout.write_all(line.as_bytes()).await {
            warn!(%error, "bridge.stdout.failed: the client no longer reads");
            return;
        }
        if stdout.flush().await.is_err() {
            return;
        }
    }
}

impl Relay {
    fn session(&self) -> Session {
        self.session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn update_session(&self, update: impl FnOnce(&mut Session)) {
        update(&mut self.session.lock().unwrap_or_else(PoisonError::into_inner));
    }

    async fn write(&self, line: String) {
        // The writer stops only when stdout is gone: nothing is left to tell then.
        let _ = self.out.send(line).await;
    }

    fn request(&self, method: Method, headers: HeaderMap) -> reqwest::RequestBuilder {
        self.client
            .request(method, &self.url)
            .header(header::AUTHORIZATION, self.bearer.clone())
            .headers(headers)
    }

    /// POST one message of the client and relay what the daemon answers; a request the
    /// daemon does not answer is answered here, with an error saying why.
    async fn post(self: Arc<Self>, body: Vec<u8>, message: Value) {
        let (id, initialize) = match kind(&message) {
            Some(Kind::Request { id, method }) => (Some(id), method == "initialize"),
            _ => (None, false),
        };
        let session = self.session();
        // A request naming its version in `_meta` (2026-07-28 and later) opens no session;
        // the version it names serves for the notifications that follow.
        if !initialize
            && session.id.is_none()
            && let Some(version) = request_version(&message)
        {
            self.update_session(|s| s.version = Some(version.to_owned()));
        }
        let mut headers = transport_headers(&message, &session);
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        let sent = self.request(Method::POST, headers).body(body).send().await;
        let response = match sent {
            Ok(response) => response,
            Err(error) => {
                let failure = format!(
                    "the gate daemon at {} did not answer ({}); ask the person to check that `gate serve` runs",
                    self.url,
                    error_chain(&error)
                );
                return self.fail(id.as_ref(), &failure).await;
            }
        };
        if initialize
            && let Some(session_id) = response
                .headers()
                .get(SESSION_ID)
                .and_then(|v| v.to_str().ok())
        {
            let session_id = session_id.to_owned();
            self.update_session(|s| s.id = Some(session_id));
        }
        let status = response.status();
        let awaiting = id.as_ref().map(|id| Awaiting { id, initialize });
        if status.is_success() {
            let outcome = self.relay_body(response, awaiting).await;
            if let Some(id) = &id
                && !outcome.answered
            {
                let failure = match outcome.broken {
                    Some(reason) => format!(
                        "the gate daemon at {} stopped answering this request ({reason}); ask the person to check that `gate serve` runs, then try again",
                        self.url
                    ),
                    None => format!(
                        "the gate daemon at {} ended its answer to this request without a response (HTTP {status}); try again, and if it recurs ask the person to look at the daemon's log",
                        self.url
                    ),
                };
                self.fail(Some(id), &failure).await;
            }
            return;
        }
        // An error status may still carry the daemon's own JSON-RPC error for the request
        // (a header or `_meta` it rejected): that is relayed as it is.
        let is_json = content_type(&response).is_some_and(|t| t.starts_with("application/json"));
        let text = response.text().await.unwrap_or_default();
        if is_json
            && let Some(id) = &id
            && let Ok(value) = serde_json::from_str::<Value>(&text)
            && answers(&value, id)
        {
            self.deliver(&text, &value, None).await;
            return;
        }
        let failure = self.http_failure(status, &session, &text);
        self.fail(id.as_ref(), &failure).await;
    }

    /// What to tell the client when the daemon answered `status`.
    fn http_failure(&self, status: StatusCode, session: &Session, text: &str) -> String {
        let url = &self.url;
        match status {
            StatusCode::UNAUTHORIZED => self.unauthorized.clone(),
            StatusCode::NOT_FOUND if session.id.is_some() => format!(
                "the gate daemon at {url} no longer knows this session (HTTP 404; it may have restarted); reconnect this MCP server in the client to start a new session"
            ),
            _ => {
                let said = text.lines().next().unwrap_or("").trim();
                let said = if said.is_empty() {
                    String::new()
                } else {
                    format!(": {}", said.chars().take(300).collect::<String>())
                };
                format!(
                    "the gate daemon at {url} answered HTTP {status}{said}; ask the person to check that `gate serve` runs and is as new as this `gate`"
                )
            }
        }
    }

    /// Answer request `id` (if it is one) with `failure`; a notification or response the
    /// daemon did not take is only logged, as the client expects no answer.
    async fn fail(&self, id: Option<&Value>, failure: &str) {
        match id {
            Some(id) => self.write(error_line(id, INTERNAL_ERROR, failure)).await,
            None => warn!(failure, "bridge.forward.failed"),
        }
    }

    /// Relay each message of a successful answer: one JSON body, or an event stream.
    async fn relay_body(
        &self,
        response: reqwest::Response,
        awaiting: Option<Awaiting<'_>>,
    ) -> Outcome {
        let mut outcome = Outcome::default();
        if response.status() == StatusCode::ACCEPTED {
            return outcome;
        }
        if content_type(&response).is_some_and(|t| t.starts_with(EVENT_STREAM)) {
            let mut events = SseStream::from_bytes_stream(response.bytes_stream());
            while let Some(event) = events.next().await {
                match event {
                    Ok(event) => {
                        if let Some(data) = message_data(&event) {
                            outcome.answered |= self.relay_data(data, awaiting).await;
                        }
                    }
                    Err(error) => {
                        outcome.broken = Some(error.to_string());
                        break;
                    }
                }
            }
            return outcome;
        }
        match response.text().await {
            Ok(text) if !text.trim().is_empty() => {
                outcome.answered = self.relay_data(&text, awaiting).await;
            }
            Ok(_) => {}
            Err(error) => outcome.broken = Some(error_chain(&error)),
        }
        outcome
    }

    /// Relay one message the daemon sent; true if it is the awaited response.
    async fn relay_data(&self, data: &str, awaiting: Option<Awaiting<'_>>) -> bool {
        let Ok(value) = serde_json::from_str::<Value>(data) else {
            warn!(
                data,
                "bridge.daemon.not_json: a message of the daemon is not JSON; left out"
            );
            return false;
        };
        self.deliver(data, &value, awaiting).await
    }

    /// Write one message of the daemon to stdout, its own bytes unless they span lines;
    /// an `initialize` result's version is kept first, for the requests that follow.
    async fn deliver(&self, data: &str, value: &Value, awaiting: Option<Awaiting<'_>>) -> bool {
        let answered = awaiting.is_some_and(|a| answers(value, a.id));
        if answered
            && awaiting.is_some_and(|a| a.initialize)
            && let Some(version) = value
                .pointer("/result/protocolVersion")
                .and_then(Value::as_str)
        {
            let version = version.to_owned();
            self.update_session(|s| s.version = Some(version));
        }
        let data = data.trim();
        let line = if data.contains(['\n', '\r']) {
            value.to_string()
        } else {
            data.to_owned()
        };
        self.write(line).await;
        answered
    }

    /// Relay the session's standalone stream (what the daemon sends outside any request),
    /// opening it again after a drop with a bounded backoff, until aborted at EOF; a 405
    /// means the daemon offers none.
    async fn listen(self: Arc<Self>) {
        let mut wait = LISTEN_BACKOFF.0;
        loop {
            let session = self.session();
            let Some(session_id) = session.id.clone() else {
                return;
            };
            let mut headers = HeaderMap::new();
            headers.insert(header::ACCEPT, HeaderValue::from_static(EVENT_STREAM));
            insert(&mut headers, SESSION_ID, &session_id);
            if let Some(version) = &session.version {
                insert(&mut headers, PROTOCOL_VERSION, version);
            }
            match self.request(Method::GET, headers).send().await {
                Ok(response) if response.status() == StatusCode::METHOD_NOT_ALLOWED => {
                    debug!("bridge.listen.none: the daemon offers no standalone stream");
                    return;
                }
                Ok(response)
                    if response.status().is_success()
                        && content_type(&response).is_some_and(|t| t.starts_with(EVENT_STREAM)) =>
                {
                    let mut events = SseStream::from_bytes_stream(response.bytes_stream());
                    while let Some(Ok(event)) = events.next().await {
                        if let Some(data) = message_data(&event) {
                            self.relay_data(data, None).await;
                            wait = LISTEN_BACKOFF.0;
                        }
                    }
                    debug!("bridge.listen.dropped: opening the standalone stream again");
                }
                Ok(response)
                    if matches!(
                        response.status(),
                        StatusCode::UNAUTHORIZED | StatusCode::NOT_FOUND
                    ) =>
                {
                    warn!(
                        status = %response.status(),
                        "bridge.listen.refused: the daemon's notifications outside requests (such as a new tool list) will not reach the client"
                    );
                    return;
                }
                Ok(response) => {
                    debug!(status = %response.status(), "bridge.listen.failed");
                }
                Err(error) => debug!(error = error_chain(&error), "bridge.listen.failed"),
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(LISTEN_BACKOFF.1);
        }
    }

    /// `DELETE` the session, if there is one, so the daemon need not wait to notice.
    async fn end_session(&self) {
        let session = self.session();
        let Some(session_id) = &session.id else {
            return;
        };
        let mut headers = HeaderMap::new();
        insert(&mut headers, SESSION_ID, session_id);
        if let Some(version) = &session.version {
            insert(&mut headers, PROTOCOL_VERSION, version);
        }
        let delete = self
            .request(Method::DELETE, headers)
            .timeout(DELETE_TIMEOUT)
            .send();
        if let Err(error) = delete.await {
            debug!(
                error = error_chain(&error),
                "bridge.delete.failed: the daemon ends the session on its own"
            );
        }
    }
}

/// The request whose response a POST waits for.
#[derive(Clone, Copy)]
struct Awaiting<'a> {
    id: &'a Value,
    initialize: bool,
}

/// How a successful answer went.
#[derive(Debug, Default)]
struct Outcome {
    /// The awaited response was relayed.
    answered: bool,
    /// Why the answer broke off, if it did.
    broken: Option<String>,
}

/// Whether `message` is the response (result or error) to request `id`.
fn answers(message: &Value, id: &Value) -> bool {
    kind(message) == Some(Kind::Response) && message.get("id") == Some(id)
}

/// The JSON-RPC message an event carries, if it carries one (not a priming event, whose
/// data is empty, nor an event of another type).
fn message_data(event: &sse_stream::Sse) -> Option<&str> {
    if event.event.as_deref().is_some_and(|e| e != "message") {
        return None;
    }
    event.data.as_deref().filter(|d| !d.trim().is_empty())
}

fn content_type(response: &reqwest::Response) -> Option<&str> {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
}

/// An error with its causes, as reqwest's own message is only the outermost one.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn insert(headers: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(value) = HeaderValue::from_str(value) {
        headers.insert(HeaderName::from_static(name), value);
    }
}

/// The protocol version a request names in its `_meta` (2026-07-28 and later).
fn request_version(message: &Value) -> Option<&str> {
    message
        .get("params")?
        .get("_meta")?
        .get(META_PROTOCOL_VERSION)?
        .as_str()
}

/// The headers the streamable HTTP transport requires of a client for `message`, as rmcp's
/// server checks them (`transport/streamable_http_server/tower.rs`): the session; the
/// protocol version (the one a request names in `_meta`, else the negotiated one; none on
/// `initialize`, whose body names it); and from 2026-07-28, `Mcp-Method` and, for the
/// methods that name a tool, prompt, resource or task, `Mcp-Name`.
fn transport_headers(message: &Value, session: &Session) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let method = message.get("method").and_then(Value::as_str);
    if method == Some("initialize") {
        return headers;
    }
    if let Some(id) = &session.id {
        insert(&mut headers, SESSION_ID, id);
    }
    let is_request = method.is_some() && message.get("id").is_some();
    let version = is_request
        .then(|| request_version(message))
        .flatten()
        .or(session.version.as_deref());
    let Some(version) = version else {
        return headers;
    };
    insert(&mut headers, PROTOCOL_VERSION, version);
    if version >= STANDARD_HEADERS
        && let Some(method) = method
    {
        insert(&mut headers, MCP_METHOD, method);
        if let Some(name) = header_name(method, message.get("params")) {
            insert(&mut headers, MCP_NAME, &encode_header_value(name));
        }
    }
    headers
}

/// The `Mcp-Name` of a request: what it names, for the methods that name something
/// (rmcp's `transport/common/mcp_headers.rs`).
fn header_name<'a>(method: &str, params: Option<&'a Value>) -> Option<&'a str> {
    let key = match method {
        "tools/call" | "prompts/get" => "name",
        "resources/read" | "resources/subscribe" | "resources/unsubscribe" => "uri",
        "tasks/get" | "tasks/update" | "tasks/cancel" => "taskId",
        _ => return None,
    };
    params?.get(key)?.as_str()
}

/// A header value as SEP-2243 writes it: as it is when it can travel as one, else wrapped
/// as `=?base64?<Base64>?=` (leading or trailing blanks, control or non-ASCII characters,
/// or a value that already looks wrapped).
fn encode_header_value(value: &str) -> String {
    let blank = |c: Option<char>| matches!(c, Some(' ' | '\t'));
    let needs_wrapping = blank(value.chars().next())
        || blank(value.chars().last())
        || value.chars().any(|c| !(' '..='~').contains(&c))
        || (value.starts_with("=?base64?") && value.ends_with("?="));
    if needs_wrapping {
        format!(
            "=?base64?{}?=",
            base64::engine::general_purpose::STANDARD.encode(value)
        )
    } else {
        value.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(message: Value, session: &Session) -> Vec<(String, String)> {
        let mut pairs: Vec<(String, String)> = transport_headers(&message, session)
            .iter()
            .map(|(name, value)| {
                (
                    name.as_str().to_owned(),
                    value.to_str().expect("text").to_owned(),
                )
            })
            .collect();
        pairs.sort();
        pairs
    }

    fn pair(name: &str, value: &str) -> (String, String) {
        (name.to_owned(), value.to_owned())
    }

    #[test]
    fn initialize_carries_no_transport_header() {
        let session = Session {
            id: Some("old".into()),
            version: Some("2025-11-25".into()),
        };
        let message = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25"}});
        assert_eq!(headers(message, &session), []);
    }

    #[test]
    fn a_2025_session_names_its_session_and_negotiated_version_only() {
        let session = Session {
            id: Some("s-1".into()),
            version: Some("2025-11-25".into()),
        };
        let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "fixture__read_notes", "arguments": {}}});
        assert_eq!(
            headers(call, &session),
            [
                pair("mcp-protocol-version", "2025-11-25"),
                pair("mcp-session-id", "s-1")
            ]
        );
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        assert_eq!(
            headers(initialized, &session),
            [
                pair("mcp-protocol-version", "2025-11-25"),
                pair("mcp-session-id", "s-1")
            ]
        );
    }

    #[test]
    fn a_2026_request_names_the_version_of_its_meta_its_method_and_what_it_calls() {
        let call = json!({"jsonrpc": "2.0", "id": "a", "method": "tools/call",
            "params": {"name": "fixture__read_notes", "arguments": {},
                "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}});
        assert_eq!(
            headers(call, &Session::default()),
            [
                pair("mcp-method", "tools/call"),
                pair("mcp-name", "fixture__read_notes"),
                pair("mcp-protocol-version", "2026-07-28"),
            ]
        );
        let read = json!({"jsonrpc": "2.0", "id": 3, "method": "resources/read",
            "params": {"uri": "gate://action/7",
                "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}});
        assert!(headers(read, &Session::default()).contains(&pair("mcp-name", "gate://action/7")));
        let list = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list",
            "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}});
        assert_eq!(
            headers(list, &Session::default()),
            [
                pair("mcp-method", "tools/list"),
                pair("mcp-protocol-version", "2026-07-28"),
            ]
        );
    }

    #[test]
    fn a_2026_notification_names_the_version_the_requests_named() {
        let session = Session {
            id: None,
            version: Some("2026-07-28".into()),
        };
        let cancelled = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": 5}});
        assert_eq!(
            headers(cancelled, &session),
            [
                pair("mcp-method", "notifications/cancelled"),
                pair("mcp-protocol-version", "2026-07-28"),
            ]
        );
    }

    #[test]
    fn a_name_that_cannot_travel_as_it_is_is_wrapped_in_base64() {
        assert_eq!(
            encode_header_value("fixture__read_notes"),
            "fixture__read_notes"
        );
        assert_eq!(encode_header_value("a b"), "a b");
        assert_eq!(encode_header_value("café"), "=?base64?Y2Fmw6k=?=");
        assert_eq!(encode_header_value(" x"), "=?base64?IHg=?=");
        assert_eq!(encode_header_value("a\r\nb"), "=?base64?YQ0KYg==?=");
        assert_eq!(
            encode_header_value("=?base64?eA==?="),
            "=?base64?PT9iYXNlNjQ/ZUE9PT89?="
        );
    }

    #[test]
    fn lines_are_told_apart_by_their_fields() {
        assert_eq!(
            kind(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"})),
            Some(Kind::Request {
                id: json!(1),
                method: "ping".into()
            })
        );
        assert_eq!(
            kind(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"})),
            Some(Kind::Notification {
                method: "notifications/initialized".into()
            })
        );
        assert_eq!(
            kind(&json!({"jsonrpc": "2.0", "id": 9, "result": {}})),
            Some(Kind::Response)
        );
        assert_eq!(
            kind(&json!({"jsonrpc": "2.0", "id": 9, "error": {"code": 1, "message": "m"}})),
            Some(Kind::Response)
        );
        assert_eq!(kind(&json!([1, 2])), None);
        assert_eq!(kind(&json!({"jsonrpc": "2.0", "id": 9})), None);
    }

    #[test]
    fn only_the_response_with_the_id_answers_a_request() {
        let id = json!("x");
        assert!(answers(
            &json!({"jsonrpc": "2.0", "id": "x", "result": {}}),
            &id
        ));
        assert!(!answers(
            &json!({"jsonrpc": "2.0", "id": 1, "result": {}}),
            &id
        ));
        assert!(!answers(
            &json!({"jsonrpc": "2.0", "id": "x", "method": "elicitation/create"}),
            &id
        ));
    }

    #[test]
    fn an_error_line_keeps_the_request_id() {
        let line: Value =
            serde_json::from_str(&error_line(&json!(7), INTERNAL_ERROR, "down")).expect("JSON");
        assert_eq!(
            line,
            json!({"jsonrpc": "2.0", "id": 7, "error": {"code": -32603, "message": "down"}})
        );
    }

    #[tokio::test]
    async fn events_yield_their_messages_and_skip_priming_and_comments() {
        let chunks: Vec<Result<&[u8], std::io::Error>> = vec![
            Ok(b"id: 0\nretry: 3000\ndata:\n\n"),
            Ok(b": keep-alive\n\ndata: {\"a\":\n"),
            Ok(b"data: 1}\n\nevent: other\ndata: {}\n\ndata: {\"b\":2}\n\n"),
        ];
        let mut events = SseStream::from_bytes_stream(futures_util::stream::iter(chunks));
        let mut messages = Vec::new();
        while let Some(event) = events.next().await {
            if let Some(data) = message_data(&event.expect("an event")) {
                messages.push(data.to_owned());
            }
        }
        assert_eq!(messages, ["{\"a\":\n1}", "{\"b\":2}"]);
    }
}

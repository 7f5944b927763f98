//! One MCP client connection to a downstream server: a child process speaking MCP on
//! stdio, or a server over MCP streamable HTTP.
//!
//! The gateway introduces itself with **no client capabilities**: no roots, no sampling,
//! no elicitation. A server's reach is what the configuration gives it, not what a client
//! offers it. The only notification it acts on is `notifications/tools/list_changed`, which
//! marks the cached catalog stale.
//!
//! Every request has a deadline. [`Connection::request`] reports *when* a failure happened
//! relative to the send, because that decides whether a write may have landed: a request
//! that could not be handed to the transport never left ([`Failure::NotSent`]); after
//! that, a deadline, a lost connection or an unreadable answer means the request may have
//! reached the server ([`Failure::AfterSend`]).

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::{HeaderName, HeaderValue};
// Logging is deprecated in the protocol's newest revision, but 2025-11-25 servers and
// clients use it: the gate carries it.
#[allow(deprecated)]
use rmcp::model::{
    CancelledNotification, CancelledNotificationParam, ClientCapabilities, ClientConfig,
    ClientRequest, CreateMessageRequestParams, CreateMessageResult, ElicitRequestParams,
    ElicitResult, ErrorData, Implementation, LoggingMessageNotificationParam,
    ProgressNotificationParam, ProtocolVersion, ResourceUpdatedNotificationParam, ServerResult,
};
use rmcp::service::{
    ClientLifecycleMode, ClientServiceExt, NotificationContext, Peer, PeerRequestOptions,
    RequestContext, RequestHandle, RoleClient, RunningService,
};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, ServiceError};
use serde_json::Value;
use tokio::process::Command;
use tracing::debug;

use crate::oauth::OAuthSettings;
use crate::oversize::Capped;
use crate::relay::{Ask, ProgressRoutes, ReadRelay, SharedRoutes};
use crate::stderr::StderrTail;

/// Room for the gate's own answer in place of one too large, beyond the cap.
const OVERSIZE_ANSWER_ROOM: usize = 64 * 1024;

/// How long a failed start waits for the server's last words on stderr.
const LAST_WORDS_WAIT: Duration = Duration::from_millis(500);

/// Environment variables a downstream server inherits from the gateway; everything else
/// it gets only from its configuration.
pub const INHERITED_ENV: [&str; 6] = ["PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER"];

/// How to start a downstream server as a child process speaking MCP on stdio.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StdioCommand {
    /// The program to run.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Environment variables set for it (besides [`INHERITED_ENV`]).
    pub env: Vec<(String, String)>,
    /// A program (and its arguments) that starts this one, the program and its arguments
    /// following: the gate's own confinement (`gate confine … --`). `None`: started
    /// directly.
    pub launcher: Option<(String, Vec<String>)>,
}

impl StdioCommand {
    /// A command without arguments or extra environment.
    pub fn new(program: impl Into<String>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            launcher: None,
        }
    }

    /// The same command, started through `program` with `args` (the command and its own
    /// arguments appended).
    pub fn through(mut self, program: impl Into<String>, args: Vec<String>) -> Self {
        self.launcher = Some((program.into(), args));
        self
    }

    /// The same command with these arguments.
    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, args: I) -> Self {
        self.args = args.into_iter().map(Into::into).collect();
        self
    }

    /// The same command with one more environment variable.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// How the command is shown to a person: `stdio: program arg…` (no environment, which
    /// may hold secrets).
    pub fn display(&self) -> String {
        let mut shown = format!("stdio: {}", self.program);
        for arg in &self.args {
            shown.push(' ');
            shown.push_str(arg);
        }
        shown
    }

    fn command(&self) -> Command {
        let mut command = match &self.launcher {
            Some((launcher, args)) => {
                let mut command = Command::new(launcher);
                command.args(args).arg(&self.program);
                command
            }
            None => Command::new(&self.program),
        };
        command.args(&self.args).env_clear().kill_on_drop(true);
        for key in INHERITED_ENV {
            if let Some(value) = std::env::var_os(key) {
                command.env(key, value);
            }
        }
        for (key, value) in &self.env {
            command.env(key, value);
        }
        command
    }
}

/// A downstream server reached over MCP streamable HTTP.
#[derive(Clone, PartialEq, Eq)]
pub struct HttpEndpoint {
    /// The endpoint URL: `http://`, or `https://` (TLS trusting the system's roots and
    /// `ca_file`, [`crate::tls`]).
    pub url: String,
    /// Headers sent with every request (names and values; the values are secrets and are
    /// never shown or logged).
    pub headers: Vec<(String, String)>,
    /// A PEM file of certificates to trust besides the system's, for an `https://` server
    /// whose certificate a CA of the person's own signed.
    pub ca_file: Option<std::path::PathBuf>,
    /// OAuth 2.1 ([`crate::oauth`]): requests carry the access token of the person's
    /// `gate login`, refreshed before it expires.
    pub oauth: Option<OAuthSettings>,
}

impl std::fmt::Debug for HttpEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpEndpoint")
            .field("url", &self.url)
            .field(
                "headers",
                &self
                    .headers
                    .iter()
                    .map(|(name, _)| name)
                    .collect::<Vec<_>>(),
            )
            .field("ca_file", &self.ca_file)
            .field("oauth", &self.oauth)
            .finish()
    }
}

/// How to reach a downstream server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A child process speaking MCP on stdio.
    Stdio(StdioCommand),
    /// A server over MCP streamable HTTP.
    Http(HttpEndpoint),
}

impl From<StdioCommand> for Endpoint {
    fn from(command: StdioCommand) -> Self {
        Self::Stdio(command)
    }
}

impl From<HttpEndpoint> for Endpoint {
    fn from(endpoint: HttpEndpoint) -> Self {
        Self::Http(endpoint)
    }
}

impl Endpoint {
    /// How it is shown to a person (never with environment or header values).
    pub fn display(&self) -> String {
        match self {
            Self::Stdio(command) => command.display(),
            Self::Http(endpoint) => format!("http: {}", endpoint.url),
        }
    }

    /// The name of what is started or reached, for messages.
    fn subject(&self) -> &str {
        match self {
            Self::Stdio(command) => &command.program,
            Self::Http(endpoint) => &endpoint.url,
        }
    }
}

/// What a server announces that agents may be told of: its resources, prompts and log.
#[allow(deprecated)]
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ServerEvent {
    /// `notifications/message`: one message of the server's log, as it sent it.
    #[allow(deprecated)]
    Log(LoggingMessageNotificationParam),
    /// `notifications/resources/updated`: the resource at this address (the server's
    /// own) changed.
    ResourceUpdated(String),
    /// `notifications/resources/list_changed`.
    ResourceListChanged,
    /// `notifications/prompts/list_changed`.
    PromptListChanged,
    /// The server waits for the person's `gate login` (the sentence says why); told
    /// once until a request carries a token again.
    LoginNeeded(String),
}

/// How many announcements may wait for a slow listener before it misses some.
pub(crate) const EVENT_BUFFER: usize = 256;

/// The client side of the handshake and the notifications it listens to.
struct Handler {
    stale: Arc<AtomicBool>,
    progress: SharedRoutes,
    events: tokio::sync::broadcast::Sender<ServerEvent>,
    /// What the gateway tells the server it may ask of it.
    capabilities: ClientCapabilities,
}

/// What the gateway tells a server about itself: its name and `capabilities`.
fn client_config_with(capabilities: ClientCapabilities) -> ClientConfig {
    ClientConfig::new(
        capabilities,
        Implementation::new("gate", env!("CARGO_PKG_VERSION")),
    )
}

/// The capabilities the gateway declares to a server: none, but sampling and elicitation
/// where the server's configuration lets its questions through to agents.
#[allow(deprecated)]
pub(crate) fn capabilities(sampling: bool, elicitation: bool) -> ClientCapabilities {
    let mut capabilities = ClientCapabilities::default();
    if sampling {
        capabilities.sampling = Some(Default::default());
    }
    if elicitation {
        capabilities.elicitation = Some(Default::default());
    }
    capabilities
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        client_config_with(self.capabilities.clone())
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        debug!("downstream.tools.list-changed");
        self.stale.store(true, Ordering::SeqCst);
    }

    /// Passed on to the agent whose read it belongs to ([`crate::relay`]).
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.deliver(params).await;
    }

    /// A server's question during a read goes to that read's agent, during a person's
    /// send to the gate, which declines it ([`crate::relay`]); the connection declares
    /// sampling only when the server's configuration allows it.
    #[allow(deprecated)]
    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        // Asked although the gate never offered it: the person did not allow it.
        if self.capabilities.sampling.is_none() {
            return Err(ErrorData::invalid_request(
                "the gate does not let this server's sampling requests through (forward_sampling is off)",
                None,
            ));
        }
        let answer = self
            .progress
            .ask(Ask::Sampling(params))
            .await
            .map_err(|why| ErrorData::invalid_request(why, None))?;
        serde_json::from_value(answer).map_err(|e| {
            ErrorData::internal_error(
                format!("the agent's answer is not a sampling result ({e})"),
                None,
            )
        })
    }

    /// A server's question during a read goes to that read's agent, during a person's
    /// send to the person ([`crate::relay`]); declared only when the server's
    /// configuration allows it.
    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        if self.capabilities.elicitation.is_none() {
            return Err(ErrorData::invalid_request(
                "the gate does not let this server's elicitation requests through, to an agent or to a person (forward_elicitation is off)",
                None,
            ));
        }
        let answer = self
            .progress
            .ask(Ask::Elicitation(request))
            .await
            .map_err(|why| ErrorData::invalid_request(why, None))?;
        serde_json::from_value(answer).map_err(|e| {
            ErrorData::internal_error(
                format!("the agent's answer is not an elicitation result ({e})"),
                None,
            )
        })
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        // Nobody listening is no error: no agent subscribed.
        let _ = self.events.send(ServerEvent::ResourceUpdated(params.uri));
    }

    #[allow(deprecated)]
    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.events.send(ServerEvent::Log(params));
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.events.send(ServerEvent::ResourceListChanged);
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.events.send(ServerEvent::PromptListChanged);
    }
}

/// When a request failed, relative to its send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The request was never handed to the transport: nothing reached the server.
    NotSent(String),
    /// The request was handed to the transport; the server may have acted on it.
    AfterSend(String),
    /// The server answered with a JSON-RPC error: an answer, not a lost request.
    Answered(String),
    /// The server refused the request's credentials (HTTP 401, or 403 for want of
    /// scope), with this `WWW-Authenticate` challenge: nothing ran. The server's driver
    /// turns it into a [`Failure::NotSent`] that says what the person must do.
    Refused(String),
}

/// How a connection is wired to its server's driver.
pub(crate) struct Wiring {
    /// The server's name in the gate, for what its messages tell the person to do.
    pub(crate) name: String,
    /// Set whenever the server announces a changed tool list.
    pub(crate) stale: Arc<AtomicBool>,
    /// Where agents' reads in flight take progress and questions.
    pub(crate) progress: SharedRoutes,
    /// What the server announces, for the gateway.
    pub(crate) events: tokio::sync::broadcast::Sender<ServerEvent>,
    /// The last lines of a stdio server's stderr.
    pub(crate) stderr: Arc<StderrTail>,
    /// What the gateway declares it may be asked.
    pub(crate) capabilities: ClientCapabilities,
    /// The largest answer of a stdio server that is read.
    pub(crate) max_result_bytes: usize,
    /// Which protocol era the handshake asks for.
    pub(crate) protocol: Protocol,
}

/// Which protocol era the gate speaks to a server (`protocol` in its configuration).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Protocol {
    /// `"2025-11-25"`: the `initialize` handshake and a session; the server asks its
    /// questions mid-call. Every server of that era and most of the newer one take it, so it
    /// is the default.
    #[default]
    Initialize,
    /// `"2026-07-28"`: `server/discover`, requests that carry their own metadata, and
    /// questions as `input_required` results ([`crate::rounds`]); a server of the older era
    /// is refused at start.
    Discover,
    /// `"auto"`: `server/discover` first, then `initialize` when the server says it does
    /// not know it (or is silent for 10 s). Not the default: an older server reached over
    /// HTTP may answer the probe with an HTTP error rather than a protocol one, and then
    /// does not start.
    Auto,
}

impl Protocol {
    /// The configuration's spelling.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "2025-11-25" => Some(Self::Initialize),
            "2026-07-28" => Some(Self::Discover),
            "auto" => Some(Self::Auto),
            _ => None,
        }
    }

    fn lifecycle(self) -> ClientLifecycleMode {
        match self {
            Self::Initialize => ClientLifecycleMode::Initialize,
            Self::Discover => ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
            Self::Auto => ClientLifecycleMode::Auto {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                legacy_version: Some(ProtocolVersion::V_2025_11_25),
            },
        }
    }
}

/// A live connection: the running client and its peer handle, and for a stdio server its
/// process (killed when the connection is dropped).
pub(crate) struct Connection {
    running: RunningService<RoleClient, Handler>,
    child: Option<tokio::process::Child>,
    /// The OAuth client of a server reached with OAuth.
    auth: Option<crate::oauth::Authorized>,
}

/// How long a stdio server has to end after its connection is dropped and it is asked to
/// (SIGTERM) before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(2);

impl Drop for Connection {
    /// Ask the server's process to end (a launcher in front of it then ends everything
    /// beneath it), and kill it if it has not within [`STOP_GRACE`].
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let asked = child.id().is_some_and(|pid| {
            i32::try_from(pid).is_ok_and(|pid| {
                nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                )
                .is_ok()
            })
        });
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) if asked => {
                runtime.spawn(async move {
                    if tokio::time::timeout(STOP_GRACE, child.wait())
                        .await
                        .is_err()
                    {
                        let _ = child.kill().await;
                    }
                });
            }
            // Dropped outside a runtime, or not asked: killed at once (kill_on_drop).
            _ => drop(child),
        }
    }
}

impl Connection {
    /// Start the server and complete the MCP handshake within `deadline`, wired to its
    /// driver as `wiring` says.
    pub(crate) async fn start(
        endpoint: &Endpoint,
        deadline: Duration,
        wiring: Wiring,
    ) -> Result<Self, String> {
        let Wiring {
            name: wiring_name,
            stale,
            progress,
            events,
            stderr,
            capabilities,
            max_result_bytes,
            protocol,
        } = wiring;
        let stderr = &stderr;
        let handler = Handler {
            stale,
            progress,
            events,
            capabilities,
        };
        let mut child = None;
        let mut auth = None;
        let handshake = match endpoint {
            Endpoint::Stdio(command) => {
                // Its stderr is the server's to write and the gate's to read: captured,
                // sanitized and logged under the server's name, never inherited. Its
                // stdout is read with each answer capped (`oversize.rs`).
                let mut spawned = command
                    .command()
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .map_err(|error| {
                        format!(
                            "could not start {:?}: {error}; check the command and that it is installed",
                            command.program
                        )
                    })?;
                let (Some(input), Some(output), Some(errors)) = (
                    spawned.stdin.take(),
                    spawned.stdout.take(),
                    spawned.stderr.take(),
                ) else {
                    return Err(format!(
                        "could not connect to {:?}'s stdio",
                        command.program
                    ));
                };
                crate::stderr::watch(errors, stderr.clone());
                let reader = Capped::new(output, max_result_bytes, command.program.clone());
                let transport = AsyncRwTransport::new(reader, input)
                    .with_max_line_length(max_result_bytes.saturating_add(OVERSIZE_ANSWER_ROOM));
                child = Some(spawned);
                tokio::time::timeout(
                    deadline,
                    handler.serve_with_lifecycle(transport, protocol.lifecycle()),
                )
                .await
            }
            Endpoint::Http(http) => {
                let mut headers = HashMap::new();
                for (name, value) in &http.headers {
                    let name = HeaderName::try_from(name.as_str()).map_err(|_| {
                        format!(
                            "{name:?} is not a valid HTTP header name; fix the server's headers"
                        )
                    })?;
                    let value = HeaderValue::try_from(value.as_str()).map_err(|_| {
                        format!("the value of header {name} is not a valid HTTP header value; check the variable it comes from")
                    })?;
                    headers.insert(name, value);
                }
                let config = StreamableHttpClientTransportConfig::with_uri(http.url.as_str())
                    .custom_headers(headers);
                match &http.oauth {
                    Some(settings) => {
                        let authorized = crate::oauth::authorized(
                            &wiring_name,
                            &http.url,
                            http.ca_file.as_deref(),
                            settings,
                        )
                        .await?;
                        let transport = StreamableHttpClientTransport::with_client(
                            authorized.client.clone(),
                            config,
                        );
                        auth = Some(authorized);
                        tokio::time::timeout(
                            deadline,
                            handler.serve_with_lifecycle(transport, protocol.lifecycle()),
                        )
                        .await
                    }
                    None => {
                        let client = crate::tls::client(http.ca_file.as_deref())?;
                        let transport = StreamableHttpClientTransport::with_client(client, config);
                        tokio::time::timeout(
                            deadline,
                            handler.serve_with_lifecycle(transport, protocol.lifecycle()),
                        )
                        .await
                    }
                }
            }
        };
        let running = match handshake {
            Ok(Ok(running)) => running,
            Ok(Err(error)) => {
                if let (Some(_), Endpoint::Http(http)) = (error.auth_challenge(), endpoint) {
                    return Err(if http.oauth.is_some() {
                        crate::oauth::needs_login(
                            &wiring_name,
                            &format!(
                                "{wiring_name} refused the gate's access token at the handshake (HTTP 401 or 403)"
                            ),
                        )
                    } else {
                        format!("{:?} {}", endpoint.subject(), crate::oauth::STATIC_REFUSAL)
                    });
                }
                let words = stderr.last_words(LAST_WORDS_WAIT).await;
                let advice = match endpoint {
                    Endpoint::Stdio(_) if !words.is_empty() => {
                        "; what it wrote says why: fix that in its command, args or env"
                    }
                    Endpoint::Stdio(_) => {
                        "; check that the command is an MCP server speaking on stdio"
                    }
                    Endpoint::Http(http) => {
                        if let Some(refusal) =
                            crate::tls::certificate_refusal(&http.url, http.ca_file.as_deref())
                                .await
                        {
                            return Err(format!(
                                "{:?} cannot be reached: {refusal}",
                                endpoint.subject()
                            ));
                        }
                        "; check that the URL is an MCP endpoint and that its credentials are accepted"
                    }
                };
                return Err(format!(
                    "{:?} was reached but the MCP handshake failed: {error}{words}{advice}",
                    endpoint.subject()
                ));
            }
            Err(_) => {
                return Err(format!(
                    "{:?} did not complete the MCP handshake within {}; check that it is an MCP server, or raise its deadline",
                    endpoint.subject(),
                    seconds(deadline)
                ));
            }
        };
        Ok(Self {
            running,
            child,
            auth,
        })
    }

    /// Whether the connection can still carry a request.
    pub(crate) fn is_alive(&self) -> bool {
        !self.running.is_closed() && !self.running.peer().is_transport_closed()
    }

    /// The OAuth client its requests carry tokens from, for a server reached with OAuth.
    pub(crate) fn auth(&self) -> Option<&crate::oauth::Authorized> {
        self.auth.as_ref()
    }

    pub(crate) fn peer(&self) -> Peer<RoleClient> {
        self.running.peer().clone()
    }

    /// The capabilities the server declared in its handshake, as JSON.
    pub(crate) fn capabilities(&self) -> Value {
        self.running
            .peer()
            .peer_info()
            .and_then(|info| serde_json::to_value(&info.capabilities).ok())
            .unwrap_or(Value::Null)
    }
}

/// Send one request and wait for its answer, at most `deadline`.
pub(crate) async fn request(
    peer: &Peer<RoleClient>,
    request: ClientRequest,
    deadline: Duration,
) -> Result<ServerResult, Failure> {
    let handle = send(peer, request, deadline).await?;
    answer(handle.await_response(), deadline).await
}

fn send_failed(error: ServiceError) -> Failure {
    Failure::NotSent(format!(
        "the connection to the server was closed before the request was sent ({error})"
    ))
}

async fn send(
    peer: &Peer<RoleClient>,
    request: ClientRequest,
    deadline: Duration,
) -> Result<RequestHandle<RoleClient>, Failure> {
    peer.send_request_with_option(request, PeerRequestOptions::with_timeout(deadline))
        .await
        .map_err(send_failed)
}

/// Send one request of an agent's read, with its progress routed back through `routes`
/// and its cancellation passed down, and wait for its answer, at most `deadline`.
pub(crate) async fn request_relayed(
    peer: &Peer<RoleClient>,
    request: ClientRequest,
    deadline: Duration,
    routes: &ProgressRoutes,
    relay: &ReadRelay,
) -> Result<ServerResult, Failure> {
    // The read takes the server's questions before it is sent: a server may ask as soon
    // as it has the request.
    let asker = routes.start_asking(relay.asks.clone());
    // The token is registered before a note for it can be delivered: delivery takes the
    // same lock.
    let sent = {
        let mut held = routes.lock().await;
        let sent = send(peer, request, deadline).await;
        if let (Ok(handle), Some(sink)) = (&sent, &relay.progress) {
            ProgressRoutes::register(&mut held, handle.progress_token.clone(), sink.clone());
        }
        sent
    };
    let handle = match sent {
        Ok(handle) => handle,
        Err(failure) => {
            routes.stop_asking(asker);
            return Err(failure);
        }
    };
    let (id, token, downstream) = (
        handle.id.clone(),
        handle.progress_token.clone(),
        handle.peer.clone(),
    );
    let outcome = tokio::select! {
        outcome = answer(handle.await_response(), deadline) => outcome,
        () = relay.cancelled.cancelled() => {
            let cancel = CancelledNotification::new(CancelledNotificationParam::new(
                Some(id),
                Some("the agent cancelled its call".to_owned()),
            ));
            if let Err(error) = downstream.send_notification(cancel.into()).await {
                debug!(%error, "downstream.cancel.unsent");
            }
            Err(Failure::AfterSend(
                "the agent cancelled the call, and the server was told to stop".to_owned(),
            ))
        }
    };
    if relay.progress.is_some() {
        // rmcp hands each notification to a task of its own but a response to its caller
        // at once, so a note the server sent just before its answer may still be on its
        // way to the route. Those tasks were spawned before the answer was handed over:
        // let them run first, and where the server has been sending progress for this
        // read, give the last of its notes a moment more. A read whose server sent none
        // (most) does not wait.
        for _ in 0..SETTLE_YIELDS {
            tokio::task::yield_now().await;
        }
        if routes.heard(&token).await {
            tokio::time::sleep(PROGRESS_SETTLE).await;
        }
    }
    routes.forget(&token).await;
    routes.stop_asking(asker);
    outcome
}

/// How long a read whose server sent progress keeps its route after the server answered,
/// for the notes the server sent just before its answer (see [`request_relayed`]).
const PROGRESS_SETTLE: Duration = Duration::from_millis(20);

/// How many times a read that relays progress lets other tasks run before its route goes:
/// the notification tasks rmcp spawned before the answer arrived.
const SETTLE_YIELDS: usize = 4;

/// The answer to a request already handed to the transport, at most `deadline`.
async fn answer(
    response: impl Future<Output = Result<ServerResult, ServiceError>>,
    deadline: Duration,
) -> Result<ServerResult, Failure> {
    // From here on the request may have been written: every failure is "after send".
    // The outer timeout is a backstop; rmcp's own timeout normally fires first and
    // also tells the server to cancel.
    match tokio::time::timeout(deadline + Duration::from_secs(1), response).await {
        Ok(Ok(result)) => Ok(result),
        Ok(Err(ServiceError::Timeout { .. })) | Err(_) => Err(Failure::AfterSend(format!(
            "the server did not answer within the deadline of {}",
            seconds(deadline)
        ))),
        Ok(Err(ServiceError::TransportClosed)) => Err(Failure::AfterSend(
            "the connection to the server was lost before it answered (it may have crashed)"
                .to_owned(),
        )),
        Ok(Err(error)) if error.auth_challenge().is_some() => Err(Failure::Refused(
            error.auth_challenge().unwrap_or_default().to_owned(),
        )),
        Ok(Err(ServiceError::McpError(error))) => Err(Failure::Answered(format!(
            "the server answered with an error (code {}): {}",
            error.code.0, error.message
        ))),
        Ok(Err(error)) => Err(Failure::AfterSend(format!(
            "the request failed after it was sent: {error}"
        ))),
    }
}

/// A duration as a person reads it: `1.5s`.
pub(crate) fn seconds(duration: Duration) -> String {
    format!("{}s", duration.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateway_advertises_no_client_capabilities_unless_questions_are_let_through() {
        let config = serde_json::to_value(client_config_with(capabilities(false, false)))
            .expect("serialises");
        assert_eq!(config["capabilities"], serde_json::json!({}));
        assert_eq!(config["clientInfo"]["name"], "gate");
        let config =
            serde_json::to_value(client_config_with(capabilities(true, true))).expect("serialises");
        assert!(config["capabilities"]["sampling"].is_object());
        assert!(config["capabilities"]["elicitation"].is_object());
        assert!(config["capabilities"].get("roots").is_none(), "never roots");
    }

    #[test]
    fn the_command_is_shown_without_its_environment() {
        let command = StdioCommand::new("node")
            .args(["server.js", "/data"])
            .env("API_TOKEN", "secret");
        assert_eq!(command.display(), "stdio: node server.js /data");
    }
}

//! One MCP client connection to a downstream server over a child process's stdio.
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

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rmcp::model::{ClientCapabilities, ClientConfig, ClientRequest, Implementation, ServerResult};
use rmcp::service::{NotificationContext, Peer, PeerRequestOptions, RoleClient, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::{ClientHandler, ServiceError, ServiceExt};
use tokio::process::Command;
use tracing::debug;

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
}

impl StdioCommand {
    /// A command without arguments or extra environment.
    pub fn new(program: impl Into<String>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
        }
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
        let mut command = Command::new(&self.program);
        command.args(&self.args).env_clear().kill_on_drop(true);
        for key in INHERITED_ENV {
            if let Some(value) = std::env::var_os(key) {
                command.env(key, value);
            }
        }
        for (key, value) in &self.env {
            command.env(key, value);
        }
        command.stderr(Stdio::inherit());
        command
    }
}

/// The client side of the handshake and the notifications it listens to.
struct Handler {
    stale: Arc<AtomicBool>,
}

/// What the gateway tells a server about itself: its name and no capabilities at all.
pub(crate) fn client_config() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("gate", env!("CARGO_PKG_VERSION")),
    )
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        client_config()
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        debug!("downstream.tools.list-changed");
        self.stale.store(true, Ordering::SeqCst);
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
}

/// A live connection: the running client and its peer handle.
pub(crate) struct Connection {
    running: RunningService<RoleClient, Handler>,
}

impl Connection {
    /// Start the server and complete the MCP handshake within `deadline`. `stale` is set
    /// whenever the server announces a changed tool list.
    pub(crate) async fn start(
        command: &StdioCommand,
        deadline: Duration,
        stale: Arc<AtomicBool>,
    ) -> Result<Self, String> {
        let transport = TokioChildProcess::new(command.command()).map_err(|error| {
            format!(
                "could not start {:?}: {error}; check the command and that it is installed",
                command.program
            )
        })?;
        let handshake = Handler { stale }.serve(transport);
        let running = match tokio::time::timeout(deadline, handshake).await {
            Ok(Ok(running)) => running,
            Ok(Err(error)) => {
                return Err(format!(
                    "{:?} started but the MCP handshake failed: {error}; check that it is an MCP server speaking on stdio",
                    command.program
                ));
            }
            Err(_) => {
                return Err(format!(
                    "{:?} did not complete the MCP handshake within {}; check that it is an MCP server speaking on stdio, or raise its deadline",
                    command.program,
                    seconds(deadline)
                ));
            }
        };
        Ok(Self { running })
    }

    /// Whether the connection can still carry a request.
    pub(crate) fn is_alive(&self) -> bool {
        !self.running.is_closed() && !self.running.peer().is_transport_closed()
    }

    pub(crate) fn peer(&self) -> Peer<RoleClient> {
        self.running.peer().clone()
    }
}

/// Send one request and wait for its answer, at most `deadline`.
pub(crate) async fn request(
    peer: &Peer<RoleClient>,
    request: ClientRequest,
    deadline: Duration,
) -> Result<ServerResult, Failure> {
    let handle = peer
        .send_request_with_option(request, PeerRequestOptions::with_timeout(deadline))
        .await
        .map_err(|error| {
            Failure::NotSent(format!(
                "the connection to the server was closed before the request was sent ({error})"
            ))
        })?;
    // From here on the request may have been written: every failure is "after send".
    // The outer timeout is a backstop; rmcp's own timeout normally fires first and
    // also tells the server to cancel.
    match tokio::time::timeout(deadline + Duration::from_secs(1), handle.await_response()).await {
        Ok(Ok(result)) => Ok(result),
        Ok(Err(ServiceError::Timeout { .. })) | Err(_) => Err(Failure::AfterSend(format!(
            "the server did not answer within the deadline of {}",
            seconds(deadline)
        ))),
        Ok(Err(ServiceError::TransportClosed)) => Err(Failure::AfterSend(
            "the connection to the server was lost before it answered (it may have crashed)"
                .to_owned(),
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
    fn the_gateway_advertises_no_client_capabilities() {
        let config = serde_json::to_value(client_config()).expect("serialises");
        assert_eq!(config["capabilities"], serde_json::json!({}));
        assert_eq!(config["clientInfo"]["name"], "gate");
    }

    #[test]
    fn the_command_is_shown_without_its_environment() {
        let command = StdioCommand::new("node")
            .args(["server.js", "/data"])
            .env("API_TOKEN", "secret");
        assert_eq!(command.display(), "stdio: node server.js /data");
    }
}

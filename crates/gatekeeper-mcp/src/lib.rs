//! A driver for downstream MCP servers: a real MCP server, started as a child process and
//! spoken to with rmcp's client, seen through gatekeeper-core's service port.
//!
//! [`McpServer::connect`] starts the server, completes the handshake (advertising no client
//! capabilities) and reads its catalog as raw JSON ([`catalog`]); [`McpServer::gatekeeper`]
//! builds the [`gatekeeper_core::ToolGatekeeper`] the kernel registers. From there on the
//! gatekeeper-core machinery holds the send: reads run at once and are recorded as
//! observations, writes are staged and sent only after approval, at most once.
//!
//! What this crate adds on the far side of the service port:
//!
//! - **Raw catalogs**: one tool with a non-boolean hint never hides the others; the one
//!   classifier in gatekeeper-core decides read vs write.
//! - **Definitions travel with staged calls**: each tool carries the digest of its
//!   definition, which the action store keeps with every staged call, so apply refuses a
//!   call whose tool changed after it was staged.
//! - **At most once over a process boundary**: every request has a deadline, and a
//!   failure is retryable only when the request never left (see [`McpServer`]).
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use gatekeeper_core::ActionStore;
//! use gatekeeper_mcp::{McpServer, McpServerConfig, StdioCommand};
//! use kernel::{Clock, Overseer, StepClock};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let clock: Arc<dyn Clock> = Arc::new(StepClock::default());
//! let overseer = Overseer::new(clock.clone());
//! let command = StdioCommand::new("mcp-server-memory");
//! let server = McpServer::connect(McpServerConfig::new("memory", command)).await?;
//! let gatekeeper = Arc::new(server.gatekeeper(ActionStore::in_memory(clock)));
//! overseer.register(gatekeeper.clone())?;
//! # Ok(())
//! # }
//! ```

pub mod assertion;
pub mod backoff;
pub mod catalog;
pub mod confine;
mod connection;
pub mod limit;
pub mod oauth;
pub mod oversize;
pub mod relay;
pub mod rounds;
mod server;
pub mod simulate;
pub mod stderr;
pub mod tls;

pub use backoff::{FIRST_BACKOFF, MAX_BACKOFF};
pub use catalog::{
    Catalog, CatalogChanges, CatalogTool, canonical_json, definition_digest, withheld_reason,
};
pub use connection::{Endpoint, HttpEndpoint, INHERITED_ENV, Protocol, ServerEvent, StdioCommand};
pub use oauth::OAuthSettings;
pub use relay::{
    Ask, InputRetry, PROGRESS_BUFFER, PendingAsk, PersonAsk, ReadRelay, SEND_CANNOT_SAMPLE,
    for_person,
};
pub use server::{
    DEFAULT_DEADLINE, DEFAULT_MAX_CATALOG_PAGES, DEFAULT_MAX_RESULT_BYTES, FORWARDED, McpError,
    McpServer, McpServerConfig,
};

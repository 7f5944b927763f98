//! The `gate` daemon's library: an MCP gateway that sits between agents and the person's
//! real MCP servers and holds every write until a person decides.
//!
//! This is the deployment, the top floor like the lectures: it wires the kernel, the MCP
//! driver ([`gatekeeper_mcp`]) and storage into one process. Nothing depends on it.
//!
//! - [`config`]: `gate.toml`, read strictly.
//! - [`names`]: the tool names agents see (`<server>__<tool>`).
//! - [`paths`]: where configuration and data live by default.

pub mod config;
pub mod names;
pub mod paths;

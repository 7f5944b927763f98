//! The `gate` daemon's library: an MCP gateway that sits between agents and the person's
//! real MCP servers and holds every write until a person decides.
//!
//! This is the deployment, the top floor like the lectures: it wires the kernel, the MCP
//! driver ([`gatekeeper_mcp`]) and storage into one process. Nothing depends on it.
//!
//! - [`config`]: `gate.toml`, read strictly.
//! - [`names`]: the tool names agents see (`<server>__<tool>`).
//! - [`paths`]: where configuration and data live by default.
//! - [`gateway`]: what each agent sees and what its calls do, and the accepted catalogs.
//! - [`pending`]: how an agent's own pending writes show in its reads (`pending =
//!   "simulate"`: the filesystem and memory servers' simulators).
//! - [`lockdown`]: each agent's lockdown latch, and the guard that makes every apply
//!   (a person's or an auto-approval rule's) respect it.
//! - [`http`]: agents over MCP streamable HTTP on loopback, one bearer token each.
//! - [`sessions`]: agents' MCP sessions, each bound to the agent whose token opened it,
//!   and counted.
//! - [`logs`]: a downstream server's log on its way to agents (who, level, how much).
//! - [`control`]: the person's socket (`gate pending`, `show`, `approve`,
//!   `reject`, `catalog`, `catalog accept`).
//! - [`deciders`]: who may use that socket: the daemon's own user, or the users and
//!   groups the configuration lists as `deciders`, checked on every request.
//! - [`queue`]: the open work as rows for the review screen, on the person's socket.
//! - [`redaction`]: secrets redacted from every view of the person's and from the log;
//!   the ledger keeps the real arguments.
//! - [`review`]: `gate review`, the person's terminal screen over that socket.
//! - [`daemon`]: `gate serve`, wiring all of the above over one kernel and one SQLite file.
//! - [`bridge`]: `gate mcp --agent NAME`, a stateless stdio bridge to the daemon.
//!
//! # Architecture invariants
//!
//! - Nothing an agent can reach decides. Agents reach the daemon only through [`http`];
//!   approving and rejecting exist only on the person's socket ([`control`]), which is
//!   created owner-only in a private data directory, or, with `deciders`, answers only
//!   the users and groups they list, by peer credentials ([`deciders`]).
//! - Every downstream request has a deadline (the server's, enforced by
//!   [`gatekeeper_mcp`]).
//! - An agent sees, and can call, only what its grants name, as defined in the catalog a
//!   person accepted; with no grant it sees only the gateway's two tools, which report on
//!   its own actions.
//! - Nothing a locked-down agent staged is sent: the kernel reaches every gatekeeper
//!   through [`lockdown::Guarded`].

pub mod bridge;
pub mod changes;
pub mod config;
pub mod confine;
pub mod control;
pub mod daemon;
pub mod deciders;
pub mod edits;
pub mod gateway;
pub mod grants;
pub mod http;
pub mod kinds;
pub mod lockdown;
pub mod logs;
pub mod names;
pub mod notify;
pub mod paths;
pub mod pending;
pub mod person;
pub mod questions;
pub mod queue;
pub mod quotas;
pub mod redaction;
pub mod review;
pub mod sessions;
mod stdio;
pub mod tls;
pub mod web;

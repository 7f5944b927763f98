//! Where the daemon keeps things: the configuration under `$XDG_CONFIG_HOME/gate/`, the
//! data (the SQLite file, the person's socket) under `$XDG_DATA_HOME/gate/`, never in the
//! current directory by surprise.

use std::path::{Path, PathBuf};

/// The configuration file's name.
pub const CONFIG_FILE: &str = "gate.toml";
/// The SQLite file's name, in the data directory.
pub const DATABASE_FILE: &str = "gate.db";
/// The person's socket's name, in the data directory.
pub const SOCKET_FILE: &str = "gate.sock";
/// The folder, in the data directory, of the agents' lockdown latches: a file named after
/// each agent whose workspace a sensitive read locked down.
pub const WORKSPACES_DIR: &str = "lockdown";
/// The directory under the data directory where each server's accepted catalog is
/// recorded (`<server>.json`, the tools as the server listed them).
pub const CATALOGS_DIR: &str = "catalogs";

/// The directory, in the data directory, that keeps what each staged write on a simulated
/// server was staged against (one JSON file per server, [`crate::pending`]).
pub const PENDING_DIR: &str = "pending";

/// Why no default location could be found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("neither ${xdg} nor $HOME is set, so there is no default {what}; pass {flag} PATH")]
pub struct NoHome {
    xdg: &'static str,
    what: &'static str,
    flag: &'static str,
}

/// An absolute directory from `$var`, or `$HOME/<fallback>` (relative values are ignored,
/// as the XDG specification asks).
fn base(var: &str, fallback: &str) -> Option<PathBuf> {
    let absolute = |v: std::ffi::OsString| Some(PathBuf::from(v)).filter(|p| p.is_absolute());
    std::env::var_os(var).and_then(absolute).or_else(|| {
        std::env::var_os("HOME")
            .and_then(absolute)
            .map(|h| h.join(fallback))
    })
}

/// `$XDG_CONFIG_HOME/gate/gate.toml` (or `~/.config/gate/gate.toml`).
pub fn default_config() -> Result<PathBuf, NoHome> {
    base("XDG_CONFIG_HOME", ".config")
        .map(|b| b.join("gate").join(CONFIG_FILE))
        .ok_or(NoHome {
            xdg: "XDG_CONFIG_HOME",
            what: "configuration file",
            flag: "--config",
        })
}

/// `$XDG_DATA_HOME/gate/` (or `~/.local/share/gate/`).
pub fn default_data_dir() -> Result<PathBuf, NoHome> {
    base("XDG_DATA_HOME", ".local/share")
        .map(|b| b.join("gate"))
        .ok_or(NoHome {
            xdg: "XDG_DATA_HOME",
            what: "data directory",
            flag: "--data-dir",
        })
}

/// The person's socket in a data directory.
pub fn socket_in(data_dir: &Path) -> PathBuf {
    data_dir.join(SOCKET_FILE)
}

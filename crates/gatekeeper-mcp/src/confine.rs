//! Confining a stdio server: what it may reach, enforced by the kernel (Linux Landlock),
//! and how the process that started it tells its descendants apart.
//!
//! A [`Confinement`] names what the server may not touch (the gate's configuration file
//! and data directory), where alone it may write, and whether it may use TCP.
//! [`restrict`] applies it to the calling thread and everything it becomes or starts:
//! every path granted but the denied ones (a directory that holds a denied path is
//! granted for listing only, and its entries one by one), signals and abstract sockets
//! scoped to the domain. A Landlock domain cannot be left. [`drop_capabilities`] then
//! takes away what even a root-run server could use to read another process's memory.
//! [`started_by_this_process`] walks a process's parents, so a socket can refuse every
//! process its owner started, at any depth. The gate runs each server this way through
//! its `gate confine` launcher (crates/gate/src/confine.rs).

use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope,
};
use nix::unistd::getpid;

/// The newest Landlock ABI whose rights the gate asks for; older kernels get what they
/// have (best effort), and `gate check` says what that was.
const ABI_WANTED: ABI = ABI::V6;

/// What one server's confinement keeps from it, as the daemon hands it to `gate confine`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Confinement {
    /// Files and directories the server may neither read nor write (the gate's
    /// configuration file and its data directory).
    pub deny: Vec<PathBuf>,
    /// When set, the only places the server may write (everything else it may read, but
    /// the denied paths); when unset it may write wherever its user may, but the denied.
    pub write: Option<Vec<PathBuf>>,
    /// Whether it may open or accept TCP connections.
    pub network: bool,
}

impl Confinement {
    /// The arguments of `gate confine` (its name first) that run, under this
    /// confinement, the program and arguments that follow them.
    pub fn launcher_args(&self) -> Vec<String> {
        let mut out = vec!["confine".to_string()];
        for path in &self.deny {
            out.push("--deny".into());
            out.push(path.display().to_string());
        }
        for path in self.write.iter().flatten() {
            out.push("--write".into());
            out.push(path.display().to_string());
        }
        if self.write.as_ref().is_some_and(Vec::is_empty) {
            out.push("--write-nowhere".into());
        }
        if !self.network {
            out.push("--no-network".into());
        }
        out.push("--".into());
        out
    }
}

/// Every process on the machine with its parent, from `/proc`.
pub fn processes() -> impl Iterator<Item = (i32, i32)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, parent_of(pid)?)))
}

/// A process's parent, from `/proc/<pid>/stat` (the field after the command's closing
/// parenthesis and its state).
pub fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// Whether `pid` is a process this process started, at any depth (for the gate's daemon:
/// a downstream server or something it started, which never decides). This process
/// itself is not counted.
pub fn started_by_this_process(pid: i32) -> bool {
    let me = getpid().as_raw();
    if pid == me {
        return false;
    }
    let mut current = pid;
    // A chain of parents is short; the bound only guards against a loop while processes
    // come and go.
    for _ in 0..256 {
        match parent_of(current) {
            Some(parent) if parent == me => return true,
            Some(parent) if parent > 1 => current = parent,
            _ => return false,
        }
    }
    false
}

/// Give up every capability, the bounding set first, so that not even a daemon running as
/// root hands its server the power to read the daemon's memory or environment (the
/// daemon is not dumpable: only CAP_SYS_PTRACE reads it). A process without any has
/// nothing to give up.
pub fn drop_capabilities() -> Result<(), caps::errors::CapsError> {
    use caps::CapSet;
    if caps::read(None, CapSet::Permitted)?.is_empty() {
        return Ok(());
    }
    caps::clear(None, CapSet::Bounding)?;
    caps::clear(None, CapSet::Ambient)?;
    caps::clear(None, CapSet::Inheritable)?;
    caps::clear(None, CapSet::Effective)?;
    caps::clear(None, CapSet::Permitted)
}

/// Restrict the calling thread (and every process it becomes or starts) as
/// `confinement` says; what the kernel enforced.
pub fn restrict(confinement: &Confinement) -> Result<RulesetStatus, String> {
    let all = AccessFs::from_all(ABI_WANTED);
    let read = AccessFs::from_read(ABI_WANTED);
    let everywhere = if confinement.write.is_some() {
        read
    } else {
        all
    };
    let deny: Vec<PathBuf> = confinement
        .deny
        .iter()
        .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()))
        .collect();
    let mut ruleset = Ruleset::default()
        .handle_access(all)
        .map_err(|e| e.to_string())?
        .scope(Scope::from_all(ABI_WANTED))
        .map_err(|e| e.to_string())?;
    if !confinement.network {
        ruleset = ruleset
            .handle_access(AccessNet::from_all(ABI_WANTED))
            .map_err(|e| e.to_string())?;
    }
    let mut created = ruleset.create().map_err(|e| e.to_string())?;
    let mut grants = Vec::new();
    allowed_beneath(Path::new("/"), &deny, &mut grants);
    for (path, kind) in grants {
        let Ok(fd) = PathFd::new(&path) else { continue };
        let access = match kind {
            Grant::Tree => everywhere,
            Grant::File => everywhere & AccessFs::from_file(ABI_WANTED),
            Grant::ListOnly => BitFlags::from(AccessFs::ReadDir),
        };
        created = created
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    for path in confinement.write.iter().flatten() {
        let fd = PathFd::new(path).map_err(|e| format!("{}: {e}", path.display()))?;
        created = created
            .add_rule(PathBeneath::new(fd, all))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if confinement.write.is_some() {
        // Character devices such as /dev/null and /dev/tty are written by most programs.
        if let Ok(fd) = PathFd::new("/dev") {
            created = created
                .add_rule(PathBeneath::new(fd, all))
                .map_err(|e| format!("/dev: {e}"))?;
        }
    }
    let status = created.restrict_self().map_err(|e| e.to_string())?;
    Ok(status.ruleset)
}

/// How much of a path a confined server is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Grant {
    /// The directory and everything beneath it.
    Tree,
    /// A file (or anything not a directory).
    File,
    /// Listing the directory only: it holds a denied path further down.
    ListOnly,
}

/// Everything beneath `dir` but the denied paths, as Landlock grants: a directory that
/// holds no denied path is granted whole; one that does is listed only, and its entries
/// are considered one by one. An entry that resolves (through a link) to a denied path or
/// to a directory holding one is left out.
fn allowed_beneath(dir: &Path, deny: &[PathBuf], grants: &mut Vec<(PathBuf, Grant)>) {
    grants.push((dir.to_path_buf(), Grant::ListOnly));
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let resolved = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        let denied = |p: &Path| deny.iter().any(|d| p.starts_with(d));
        let holds_denied = |p: &Path| deny.iter().any(|d| d.starts_with(p));
        if denied(&path) || denied(&resolved) {
            continue;
        }
        if holds_denied(&path) && resolved == path {
            allowed_beneath(&path, deny, grants);
            continue;
        }
        if holds_denied(&resolved) {
            continue;
        }
        let kind = if resolved.is_dir() {
            Grant::Tree
        } else {
            Grant::File
        };
        grants.push((path, kind));
    }
}

/// What this machine's kernel gives to confine a stdio server, for `gate check`: one line
/// per protection, and whether all of them are in force.
pub fn protections() -> (Vec<String>, bool) {
    let probe = std::thread::spawn(|| {
        restrict(&Confinement {
            deny: Vec::new(),
            write: None,
            network: false,
        })
    })
    .join()
    .unwrap_or_else(|_| Err("the probe thread panicked".into()));
    let mut lines = Vec::new();
    let complete = match &probe {
        Ok(RulesetStatus::FullyEnforced) => {
            lines.push("Landlock: in force (the gate's files out of a server's reach; no signals or ptrace into the daemon; per-server paths and network)".to_string());
            true
        }
        Ok(RulesetStatus::PartiallyEnforced) => {
            lines.push("Landlock: partly (this kernel's Landlock is older than 6.12: files are kept out of reach, but signals and abstract sockets, or network rules, are not all enforced)".to_string());
            false
        }
        Ok(_) => {
            lines.push("Landlock: not available (kernel without Landlock, or not enabled at boot: add lsm=landlock,… to the kernel's command line); a stdio server can read the gate's configuration and data; run the daemon as its own user (see the README)".to_string());
            false
        }
        Err(error) => {
            lines.push(format!("Landlock: could not be used ({error})"));
            false
        }
    };
    lines.push("descendants: every process a server starts stays beneath its launcher and is refused at the person's socket".to_string());
    (lines, complete)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_launcher_arguments_name_each_restriction_then_the_command() {
        let c = Confinement {
            deny: vec!["/c/gate.toml".into(), "/d".into()],
            write: Some(vec!["/srv/notes".into()]),
            network: false,
        };
        assert_eq!(
            c.launcher_args(),
            [
                "confine",
                "--deny",
                "/c/gate.toml",
                "--deny",
                "/d",
                "--write",
                "/srv/notes",
                "--no-network",
                "--"
            ]
        );
    }

    #[test]
    fn everything_but_the_denied_paths_is_granted_and_their_parents_are_only_listed() {
        let scratch = std::env::temp_dir().join(format!("gate-confine-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&scratch);
        std::fs::create_dir_all(&scratch).unwrap();
        let base = scratch.canonicalize().unwrap();
        std::fs::create_dir_all(base.join("home/.config/gate")).unwrap();
        std::fs::create_dir_all(base.join("home/projects")).unwrap();
        std::fs::write(base.join("home/.config/gate/gate.toml"), "").unwrap();
        std::fs::write(base.join("home/.config/other.toml"), "").unwrap();
        std::os::unix::fs::symlink(
            base.join("home/.config/gate"),
            base.join("home/projects/link"),
        )
        .unwrap();
        std::os::unix::fs::symlink(base.join("home"), base.join("home/up")).unwrap();
        let deny = vec![base.join("home/.config/gate")];
        let mut grants = Vec::new();
        allowed_beneath(&base, &deny, &mut grants);
        let shown: Vec<(String, Grant)> = grants
            .into_iter()
            .map(|(p, g)| (p.strip_prefix(&base).unwrap().display().to_string(), g))
            .collect();
        let has = |p: &str, g: Grant| shown.contains(&(p.to_string(), g));
        assert!(has("", Grant::ListOnly));
        assert!(has("home", Grant::ListOnly));
        assert!(has("home/.config", Grant::ListOnly));
        assert!(has("home/.config/other.toml", Grant::File));
        // A directory holding a link to a denied path is granted whole: the link itself
        // resolves into the denied tree, and Landlock checks the resolved path.
        assert!(has("home/projects", Grant::Tree));
        assert!(
            !shown
                .iter()
                .any(|(p, _)| p.starts_with("home/.config/gate")),
            "{shown:?}"
        );
        assert!(!shown.iter().any(|(p, _)| p == "home/up"), "{shown:?}");
        std::fs::remove_dir_all(&scratch).unwrap();
    }
}

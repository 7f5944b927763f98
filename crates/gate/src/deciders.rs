//! Who may use the person's socket: `deciders = ["alice", "group:staff"]` in `gate.toml`,
//! checked on every request against the user the kernel says is behind the connection.
//!
//! Without `deciders` the socket belongs to the daemon's own user: it is created 0600, and
//! a request from anyone but that user (or root, whom no file mode stops) is refused. With
//! them the socket is created 0666, so that people on other accounts can reach it, and
//! every request (listing and showing as much as deciding) is answered only if the uid
//! behind the connection (`SO_PEERCRED`) is a listed user, or a member of a listed group
//! (its primary group or a supplementary one, as the system's user and group database
//! says at the time of the request). The daemon's own user is refused unless it is listed
//! by name: in the separated deployment it is the user the downstream servers run as, and
//! nothing they run may decide.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use nix::unistd::{Gid, Group, Uid, User};
use tokio::net::UnixStream;

/// How a group is written in `deciders`: `group:NAME`.
pub const GROUP_PREFIX: &str = "group:";

/// The users and groups `deciders` lists, resolved against this system's database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deciders {
    /// Listed users: login name and uid.
    users: Vec<(String, u32)>,
    /// Listed groups: group name and gid.
    groups: Vec<(String, u32)>,
}

/// A `deciders` that cannot be used: which entry (its index; `None` for the whole list)
/// and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadDecider {
    /// The entry's index in the list, if one entry is wrong.
    pub index: Option<usize>,
    /// What is wrong and what to write instead.
    pub message: String,
}

impl Deciders {
    /// Resolve each entry: a login name (`"alice"`) or a group (`"group:staff"`). A name
    /// this system does not know is refused, naming it and what to do; so is an empty
    /// list, which would let nobody decide.
    pub fn resolve<'a>(entries: impl IntoIterator<Item = &'a str>) -> Result<Self, BadDecider> {
        let mut deciders = Self {
            users: Vec::new(),
            groups: Vec::new(),
        };
        for (index, entry) in entries.into_iter().enumerate() {
            let bad = |message: String| BadDecider {
                index: Some(index),
                message,
            };
            if let Some(group) = entry.strip_prefix(GROUP_PREFIX) {
                if group.trim().is_empty() {
                    return Err(bad(format!(
                        "deciders has {entry:?}, which names no group; write \"group:NAME\" with a group of this system, for example \"group:staff\""
                    )));
                }
                match Group::from_name(group) {
                    Ok(Some(found)) => deciders.groups.push((found.name, found.gid.as_raw())),
                    Ok(None) => {
                        return Err(bad(format!(
                            "deciders names group {group:?}, which this system does not know; fix the name, or create the group (`groupadd {group}`) and add the people who decide to it (`usermod -aG {group} USER`)"
                        )));
                    }
                    Err(error) => {
                        return Err(bad(format!(
                            "could not look up group {group:?} of deciders ({error}); check the system's group database (`getent group {group}`)"
                        )));
                    }
                }
            } else {
                if entry.trim().is_empty() {
                    return Err(bad(
                        "deciders has an empty entry; write a login name (\"alice\") or a group (\"group:staff\")".to_owned(),
                    ));
                }
                match User::from_name(entry) {
                    Ok(Some(found)) => deciders.users.push((found.name, found.uid.as_raw())),
                    Ok(None) => {
                        return Err(bad(format!(
                            "deciders names user {entry:?}, which this system does not know; fix the login name, create the user (`useradd {entry}`), or write a group as \"group:{entry}\""
                        )));
                    }
                    Err(error) => {
                        return Err(bad(format!(
                            "could not look up user {entry:?} of deciders ({error}); check the system's user database (`getent passwd {entry}`)"
                        )));
                    }
                }
            }
        }
        if deciders.users.is_empty() && deciders.groups.is_empty() {
            return Err(BadDecider {
                index: None,
                message: "deciders = [] lets nobody use the person's socket; list who decides, for example deciders = [\"alice\", \"group:staff\"], or leave it out so that only the daemon's own user does".to_owned(),
            });
        }
        Ok(deciders)
    }

    /// The listed users' login names.
    pub fn users(&self) -> impl Iterator<Item = &str> {
        self.users.iter().map(|(name, _)| name.as_str())
    }

    /// The listed groups' names.
    pub fn groups(&self) -> impl Iterator<Item = &str> {
        self.groups.iter().map(|(name, _)| name.as_str())
    }
}

/// Who may use the person's socket of one daemon: its `deciders`, or, without them, its
/// own user alone.
#[derive(Debug, Clone)]
pub struct SocketAccess {
    deciders: Option<Deciders>,
    /// The configuration file, named in a refusal (where deciders are added).
    config: PathBuf,
    /// The user the daemon runs as.
    daemon: u32,
}

impl SocketAccess {
    /// The access of a daemon running as `daemon` (a uid) with the configuration at
    /// `config` and its `deciders`.
    pub fn new(deciders: Option<Deciders>, config: &Path, daemon: u32) -> Self {
        Self {
            deciders,
            config: config.to_owned(),
            daemon,
        }
    }

    /// Whether people on other accounts may reach the socket: then it is created 0666
    /// and this check is the gate.
    pub fn is_shared(&self) -> bool {
        self.deciders.is_some()
    }

    /// Whether the user behind `stream` may use the socket; the error is the answer to
    /// send back: who was refused and what to do.
    pub fn check(&self, stream: &UnixStream) -> Result<(), String> {
        match stream.peer_cred() {
            Ok(credentials) => self.may_decide(credentials.uid()),
            Err(error) => Err(format!(
                "nothing was done: the gate could not tell which user is asking ({error}); run the gate command again"
            )),
        }
    }

    /// Whether user `uid` may use the socket (list, show, decide, anything): a listed user,
    /// a member of a listed group, or, without `deciders`, the daemon's own user or root.
    /// The error names the user and what to do.
    pub fn may_decide(&self, uid: u32) -> Result<(), String> {
        let name = crate::person::user_name(uid);
        let Some(deciders) = &self.deciders else {
            if uid == self.daemon || uid == 0 {
                return Ok(());
            }
            return Err(format!(
                "the gate refused user {name:?}: its configuration ({}) lists no deciders, so only the user who runs `gate serve` ({:?}) may use its socket; ask the person who runs it to add you to deciders (deciders = [\"{name}\"], or a group of yours as \"group:NAME\")",
                self.config.display(),
                crate::person::user_name(self.daemon),
            ));
        };
        if deciders.users.iter().any(|(_, listed)| *listed == uid) {
            return Ok(());
        }
        if !deciders.groups.is_empty() && member_of_any(uid, &deciders.groups) {
            return Ok(());
        }
        let why = if uid == self.daemon {
            " (it runs the daemon and its servers, and may decide only if deciders names it)"
        } else {
            ""
        };
        Err(format!(
            "the gate refused user {name:?}{why}: only the users and groups in deciders ({}) may use the person's socket; run the command as your own user, and ask the person who runs `gate serve` to add you to deciders (deciders = [\"{name}\"], or a group of yours as \"group:NAME\")",
            self.config.display(),
        ))
    }
}

/// Whether user `uid` belongs to one of `groups` (its primary group or a supplementary
/// one, per the system's database now). A uid without an entry belongs to none.
fn member_of_any(uid: u32, groups: &[(String, u32)]) -> bool {
    let Ok(Some(user)) = User::from_uid(Uid::from_raw(uid)) else {
        return false;
    };
    if groups.iter().any(|(_, gid)| *gid == user.gid.as_raw()) {
        return true;
    }
    let Ok(name) = CString::new(user.name) else {
        return false;
    };
    let Ok(of_user) = nix::unistd::getgrouplist(&name, user.gid) else {
        return false;
    };
    groups
        .iter()
        .any(|(_, gid)| of_user.contains(&Gid::from_raw(*gid)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root_only() -> Deciders {
        Deciders::resolve(["root"]).expect("root exists everywhere")
    }

    #[test]
    fn names_the_system_does_not_know_are_refused_with_what_to_do() {
        let bad = Deciders::resolve(["root", "no-such-user-gate-test"]).expect_err("unknown");
        assert_eq!(bad.index, Some(1));
        assert!(
            bad.message.starts_with(
                "deciders names user \"no-such-user-gate-test\", which this system does not know"
            ),
            "{}",
            bad.message
        );
        assert!(bad.message.contains("useradd"), "{}", bad.message);
        let bad = Deciders::resolve(["group:no-such-group-gate-test"]).expect_err("unknown");
        assert!(
            bad.message.contains("group \"no-such-group-gate-test\"")
                && bad.message.contains("groupadd"),
            "{}",
            bad.message
        );
        assert!(Deciders::resolve(["group:"]).is_err());
        assert!(Deciders::resolve([""]).is_err());
        let empty = Deciders::resolve([]).expect_err("nobody");
        assert_eq!(empty.index, None);
        assert!(empty.message.contains("lets nobody"), "{}", empty.message);
    }

    #[test]
    fn users_and_groups_resolve_to_their_names() {
        let deciders = Deciders::resolve(["root", "group:root"]).expect("root exists");
        assert_eq!(deciders.users().collect::<Vec<_>>(), ["root"]);
        assert_eq!(deciders.groups().collect::<Vec<_>>(), ["root"]);
    }

    #[test]
    fn without_deciders_only_the_daemons_user_and_root_may_use_the_socket() {
        let access = SocketAccess::new(None, Path::new("/etc/gate/gate.toml"), 4242);
        assert!(!access.is_shared());
        assert!(access.may_decide(4242).is_ok());
        assert!(access.may_decide(0).is_ok());
        let refused = access.may_decide(4243).expect_err("another user");
        assert!(refused.contains("lists no deciders"), "{refused}");
        assert!(refused.contains("/etc/gate/gate.toml"), "{refused}");
        assert!(refused.contains("add you to deciders"), "{refused}");
    }

    #[test]
    fn with_deciders_the_daemons_own_user_is_refused_unless_listed() {
        let access = SocketAccess::new(Some(root_only()), Path::new("gate.toml"), 4242);
        assert!(access.is_shared());
        assert!(access.may_decide(0).is_ok());
        let refused = access.may_decide(4242).expect_err("the daemon's user");
        assert!(
            refused.contains("it runs the daemon and its servers"),
            "{refused}"
        );
        let refused = access.may_decide(4243).expect_err("anyone else");
        assert!(refused.contains("\"uid 4243\""), "{refused}");
        assert!(refused.contains("add you to deciders"), "{refused}");
    }
}

//! What a daemon remembers between round trips, and why each answer is safe to give
//! without asking the server.
//!
//! - **The lockdown latch.** Once latched it stays (a trigger refuses the delete), so
//!   "latched" is remembered for good. "Not latched" is the session connection's view:
//!   it reads the latch after it starts listening, and every latch notifies it
//!   (`lockdown_changed`, schema version 4), so the answer is as old as the last
//!   notification, a fraction of a millisecond. While the session connection is down
//!   nothing is remembered and the server is asked. What this answer guards is checked
//!   again where it matters: `record_attempt` refuses in the statement that records who
//!   decided if the latch is set, so nothing is sent after a latch was committed.
//! - **The rules.** Kept until a notification says the rules changed (or the session
//!   connection breaks); a read that raced with a change is not kept. An automatic
//!   decision is checked again in `record_attempt`: it is written only while a rule for
//!   the action's kind exists and the action is pending and not held for a person.
//! - **Stages not yet in the ledger.** A driver id this daemon's action store has just
//!   handed out (`gate_stage`) names no ledger action yet: ids are never handed out
//!   twice, and only the staging daemon submits it. `find_action` answers "none" for it
//!   without asking, until the ledger insert of that action begins.
//! - **Open entries read by `open_action_ids` or `open_actions`.** Read in one statement
//!   and handed to the next `get` of each id (once, and for at most [`PREFETCH_TTL`]):
//!   the drain reads them one after the other, and a person's decision reads the entry
//!   the list (`open_actions`, already whole) showed. This daemon's own writes
//!   of an entry drop it; a notification of a ledger change by another daemon (the
//!   payload names the writer's session and the servers whose entries changed, schema
//!   version 5) drops those servers' entries, or all of them when it names no servers
//!   (an older daemon's, a list too long). What is left is as old as a
//!   notification, and a decision on it is checked again by `record_attempt` (open,
//!   decided by nobody else); when that refuses, the kernel's next `get` of the id
//!   reads the server.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kernel::{AutoApprovalRule, LedgerEntry};

/// Whether the lockdown latch is set.
pub(crate) const LOCKED_DOWN: &str = "SELECT EXISTS (SELECT 1 FROM lockdown)";

/// How long an entry read by `open_action_ids` or `open_actions` may answer the next `get`
/// of its id.
pub const PREFETCH_TTL: Duration = Duration::from_millis(250);

/// How many stages not yet submitted are remembered; beyond that, `find_action` asks.
const FRESH_STAGES: usize = 4096;

const UNKNOWN: u8 = 0;
const CLEAR: u8 = 1;
const LATCHED: u8 = 2;

/// See the module docs.
#[derive(Default)]
pub(crate) struct Caches {
    lockdown: AtomicU8,
    listening: AtomicBool,
    rules_generation: AtomicU64,
    rules: Mutex<Option<Arc<Vec<AutoApprovalRule>>>>,
    fresh: Mutex<HashSet<(Arc<str>, i64)>>,
    /// Moves when another daemon changes the ledger without naming the servers (or
    /// notifications may be lost): every remembered entry is dropped.
    entries_generation: AtomicU64,
    /// Moves for one server when another daemon changes its entries.
    server_generations: Mutex<HashMap<String, u64>>,
    prefetched: Mutex<HashMap<i64, (LedgerEntry, Instant, Generation)>>,
}

/// What the remembered entries of one server were read under: the generation of all
/// entries, and of that server's.
pub(crate) type Generation = (u64, u64);

impl Caches {
    /// A notification said a table changed: its payload is the table's name, then `:`
    /// and the writer's session if it named one. `me` is this daemon's session.
    /// A ledger change also names the servers whose entries changed, as a JSON array
    /// after a second `:` (`ledger:7:["issues"]`).
    pub(crate) fn changed(&self, payload: &str, me: i32) {
        let mut parts = payload.splitn(3, ':');
        let table = parts.next().unwrap_or_default();
        let writer = parts.next().and_then(|writer| writer.parse::<i32>().ok());
        let servers = parts.next();
        match table {
            "lockdown" => self.latch(),
            "auto_approval_rules" => self.forget_rules(),
            "ledger" if writer != Some(me) => {
                match servers.and_then(|s| serde_json::from_str::<Vec<String>>(s).ok()) {
                    Some(servers) => self.servers_changed(servers),
                    None => {
                        self.entries_generation.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
            _ => {}
        }
    }

    /// Another daemon changed entries of `servers`.
    fn servers_changed(&self, servers: Vec<String>) {
        match self.server_generations.lock() {
            Ok(mut generations) => {
                for server in servers {
                    *generations.entry(server).or_default() += 1;
                }
            }
            Err(_) => {
                self.entries_generation.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// The session connection broke: notifications may be lost from now on.
    pub(crate) fn deaf(&self) {
        self.listening.store(false, Ordering::SeqCst);
        let _ = self
            .lockdown
            .compare_exchange(CLEAR, UNKNOWN, Ordering::SeqCst, Ordering::SeqCst);
        self.forget_rules();
        self.entries_generation.fetch_add(1, Ordering::SeqCst);
    }

    /// The session connection listens, and read the latch (`latched`) after it began.
    pub(crate) fn listening(&self, latched: bool) {
        if latched {
            self.latch();
        } else {
            let _ =
                self.lockdown
                    .compare_exchange(UNKNOWN, CLEAR, Ordering::SeqCst, Ordering::SeqCst);
        }
        self.forget_rules();
        self.listening.store(true, Ordering::SeqCst);
    }

    /// The latch, if known without asking.
    pub(crate) fn latched(&self) -> Option<bool> {
        match self.lockdown.load(Ordering::SeqCst) {
            LATCHED => Some(true),
            CLEAR => Some(false),
            _ => None,
        }
    }

    /// The latch is set (seen, or set here).
    pub(crate) fn latch(&self) {
        self.lockdown.store(LATCHED, Ordering::SeqCst);
    }

    /// The rules, if known without asking.
    pub(crate) fn rules(&self) -> Option<Arc<Vec<AutoApprovalRule>>> {
        if !self.listening.load(Ordering::SeqCst) {
            return None;
        }
        self.rules.lock().ok()?.clone()
    }

    /// Taken before reading the rules, for [`Caches::keep_rules`].
    pub(crate) fn rules_generation(&self) -> u64 {
        self.rules_generation.load(Ordering::SeqCst)
    }

    /// Keep rules read after [`Caches::rules_generation`] returned `generation`, unless
    /// they changed since.
    pub(crate) fn keep_rules(&self, generation: u64, rules: Arc<Vec<AutoApprovalRule>>) {
        if let Ok(mut kept) = self.rules.lock()
            && self.listening.load(Ordering::SeqCst)
            && self.rules_generation.load(Ordering::SeqCst) == generation
        {
            *kept = Some(rules);
        }
    }

    /// The rules changed (here or elsewhere).
    pub(crate) fn forget_rules(&self) {
        if let Ok(mut kept) = self.rules.lock() {
            self.rules_generation.fetch_add(1, Ordering::SeqCst);
            *kept = None;
        }
    }

    /// This daemon's action store of `gatekeeper` handed out `id` just now.
    pub(crate) fn staged(&self, gatekeeper: &Arc<str>, id: i64) {
        if let Ok(mut fresh) = self.fresh.lock() {
            if fresh.len() >= FRESH_STAGES {
                fresh.clear();
            }
            fresh.insert((gatekeeper.clone(), id));
        }
    }

    /// Whether `id` of `gatekeeper` was staged here and its ledger insert has not begun.
    pub(crate) fn is_fresh(&self, gatekeeper: &str, id: i64) -> bool {
        self.fresh
            .lock()
            .is_ok_and(|fresh| fresh.contains(&(Arc::from(gatekeeper), id)))
    }

    /// `id` of `gatekeeper` is being submitted (or discarded): ask the server from now on.
    pub(crate) fn submitted(&self, gatekeeper: &str, id: i64) {
        if let Ok(mut fresh) = self.fresh.lock() {
            fresh.remove(&(Arc::from(gatekeeper), id));
        }
    }

    /// Taken before reading entries of `server` to prefetch, for [`Caches::prefetch`].
    pub(crate) fn entries_generation(&self, server: &str) -> Generation {
        let of_server = self
            .server_generations
            .lock()
            .ok()
            .and_then(|generations| generations.get(server).copied())
            .unwrap_or_default();
        (self.entries_generation.load(Ordering::SeqCst), of_server)
    }

    /// Entries of one server read with their ids, after [`Caches::entries_generation`]
    /// returned `generation`, for the next `get` of each.
    pub(crate) fn prefetch(&self, entries: Vec<LedgerEntry>, generation: Generation) {
        if !self.listening.load(Ordering::SeqCst) {
            return;
        }
        let now = Instant::now();
        if let Ok(mut prefetched) = self.prefetched.lock() {
            prefetched.retain(|_, (_, at, _)| now.duration_since(*at) < PREFETCH_TTL);
            for entry in entries {
                let id = i64::try_from(entry.id.0).unwrap_or(i64::MAX);
                prefetched.insert(id, (entry, now, generation));
            }
        }
    }

    /// The entry read for `id` by the last `open_action_ids` or `open_actions`, once, if
    /// recent and no other daemon changed the ledger since it was read.
    pub(crate) fn take_prefetched(&self, id: i64) -> Option<LedgerEntry> {
        let (entry, at, generation) = self.prefetched.lock().ok()?.remove(&id)?;
        (at.elapsed() < PREFETCH_TTL
            && generation == self.entries_generation(&entry.gatekeeper)
            && self.listening.load(Ordering::SeqCst))
        .then_some(entry)
    }

    /// `id` is being written here: its prefetched entry is stale.
    pub(crate) fn forget_entry(&self, id: i64) {
        if let Ok(mut prefetched) = self.prefetched.lock() {
            prefetched.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use kernel::{ActionDescription, LedgerId};

    use super::*;

    fn entry(server: &str, id: u64) -> LedgerEntry {
        kernel::testkit::pending_entry(server, id, ActionDescription::new("write", "body"))(
            LedgerId(id),
        )
    }

    /// Remember entry 1 of server `a` and entry 2 of server `a:b`, as a list would.
    fn remember_both(caches: &Caches) {
        for (server, id) in [("a", 1), ("a:b", 2)] {
            let generation = caches.entries_generation(server);
            caches.prefetch(vec![entry(server, id)], generation);
        }
    }

    fn kept(caches: &Caches) -> [bool; 2] {
        [1, 2].map(|id| caches.take_prefetched(id).is_some())
    }

    #[test]
    fn another_daemons_ledger_change_drops_only_the_entries_of_the_servers_it_names() {
        const ME: i32 = 3;
        let caches = Caches::default();
        caches.listening(false);
        remember_both(&caches);
        caches.changed(r#"ledger:7:["a:b"]"#, ME);
        assert_eq!(kept(&caches), [true, false]);

        // This daemon's own change drops nothing here (its writes drop their entries).
        remember_both(&caches);
        caches.changed(r#"ledger:3:["a","a:b"]"#, ME);
        assert_eq!(kept(&caches), [true, true]);

        // A change that names no servers (an older daemon's, a list too long, a writer
        // without a session) drops every entry; so does one that cannot be read.
        for payload in ["ledger:7", "ledger", "ledger::", r#"ledger:7:["a""#] {
            remember_both(&caches);
            caches.changed(payload, ME);
            assert_eq!(kept(&caches), [false, false], "{payload}");
        }
        remember_both(&caches);
        caches.changed(r#"ledger::["a"]"#, ME);
        assert_eq!(kept(&caches), [false, true], "a writer without a session");

        // Other tables leave the entries alone.
        remember_both(&caches);
        caches.changed("actions:7", ME);
        assert_eq!(kept(&caches), [true, true]);
    }
}

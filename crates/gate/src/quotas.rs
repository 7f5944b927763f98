//! The person's limits on how much an agent may stage: open actions per agent, writes per
//! hour per agent and per server (`max_open_actions`, `max_writes_per_hour` in gate.toml).
//!
//! A write over a limit is not staged, and the agent is told which limit, its figure, and
//! when it may stage again. The hour is a sliding one, counted from the ledger's times of
//! staging: seeded from the ledger when the daemon starts (so a restart forgets nothing)
//! and kept in memory after, trimmed to the hour as it goes, so the memory is bounded by
//! the limits themselves. A team's daemons each count what they staged.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use kernel::{ActionState, LedgerEntry};

/// One hour, in the ledger clock's milliseconds.
const HOUR_MS: u64 = 60 * 60 * 1000;

/// The limits of one agent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AgentLimits {
    /// The most of its actions waiting at once.
    pub open: Option<usize>,
    /// The most writes it stages in an hour.
    pub per_hour: Option<usize>,
}

/// Every limit of the configuration, and the stagings of the last hour they are held to.
#[derive(Debug, Default)]
pub struct Quotas {
    agents: HashMap<String, AgentLimits>,
    servers: HashMap<String, usize>,
    /// Times of the stagings of the last hour, by agent and by server (only those with a
    /// limit), oldest first.
    by_agent: Mutex<HashMap<String, VecDeque<u64>>>,
    by_server: Mutex<HashMap<String, VecDeque<u64>>>,
}

/// Why a write is not staged: a limit reached, in words for the agent.
pub type Refusal = String;

impl Quotas {
    /// The limits of `agents` and `servers` (each with its per-hour limit), seeded with the
    /// stagings the ledger `entries` records in the hour before `now`.
    pub fn new(
        agents: impl IntoIterator<Item = (String, AgentLimits)>,
        servers: impl IntoIterator<Item = (String, usize)>,
        entries: &[LedgerEntry],
        now: u64,
    ) -> Self {
        let quotas = Self {
            agents: agents
                .into_iter()
                .filter(|(_, l)| l.open.is_some() || l.per_hour.is_some())
                .collect(),
            servers: servers.into_iter().collect(),
            ..Self::default()
        };
        let since = now.saturating_sub(HOUR_MS);
        let mut recent: Vec<&LedgerEntry> = entries
            .iter()
            .filter(|e| e.action().is_some() && e.created_at.0 >= since)
            .collect();
        recent.sort_by_key(|e| e.created_at.0);
        for entry in recent {
            quotas.record(&entry.caller, &entry.gatekeeper, entry.created_at.0);
        }
        quotas
    }

    /// Whether any limit is set.
    pub fn is_empty(&self) -> bool {
        self.agents.is_empty() && self.servers.is_empty()
    }

    /// Whether agent `agent` may stage one more write on `server` at `now`, with `open` of
    /// its actions waiting; `Err` says which limit it reached and when it may try again.
    pub fn check(&self, agent: &str, server: &str, open: usize, now: u64) -> Result<(), Refusal> {
        let limits = self.agents.get(agent).copied().unwrap_or_default();
        if let Some(most) = limits.open
            && open >= most
        {
            return Err(format!(
                "{open} of your writes already wait for the person, the most they allow at once (max_open_actions = {most} for agent {agent}), so nothing was staged or sent. Stage it again once one of them is decided; gate_pending lists them."
            ));
        }
        if let Some(most) = limits.per_hour
            && let Some(wait) = full(&mut lock(&self.by_agent), agent, most, now)
        {
            return Err(format!(
                "you staged {most} writes in the last hour, the most the person allows (max_writes_per_hour = {most} for agent {agent}), so nothing was staged or sent. You may stage again in {}.",
                minutes(wait)
            ));
        }
        if let Some(&most) = self.servers.get(server)
            && let Some(wait) = full(&mut lock(&self.by_server), server, most, now)
        {
            return Err(format!(
                "agents staged {most} writes on server {server} in the last hour, the most the person allows (max_writes_per_hour = {most} for that server), so nothing was staged or sent. Writes on it may be staged again in {}.",
                minutes(wait)
            ));
        }
        Ok(())
    }

    /// Count one write agent `agent` staged on `server` at `now`.
    pub fn record(&self, agent: &str, server: &str, now: u64) {
        if self.agents.get(agent).is_some_and(|l| l.per_hour.is_some()) {
            push(&mut lock(&self.by_agent), agent, now);
        }
        if self.servers.contains_key(server) {
            push(&mut lock(&self.by_server), server, now);
        }
    }

    /// For `gate pending`: each agent with a limit, what it uses of it at `now`, given its
    /// open actions among `open`.
    pub fn report(&self, open: &[LedgerEntry], now: u64) -> Vec<String> {
        let mut names: Vec<&String> = self.agents.keys().collect();
        names.sort();
        let mut lines = Vec::new();
        for agent in names {
            let limits = self.agents[agent];
            let mut parts = Vec::new();
            if let Some(most) = limits.open {
                let waiting = open
                    .iter()
                    .filter(|e| *e.caller == **agent)
                    .filter(|e| e.action().is_some_and(|a| a.state == ActionState::Pending))
                    .count();
                parts.push(format!("{waiting} of {most} open actions"));
            }
            if let Some(most) = limits.per_hour {
                let staged = recent(&mut lock(&self.by_agent), agent, now);
                parts.push(format!("{staged} of {most} writes in the last hour"));
            }
            lines.push(format!("agent {agent}: {}", parts.join(", ")));
        }
        let mut servers: Vec<(&String, &usize)> = self.servers.iter().collect();
        servers.sort();
        for (server, most) in servers {
            let staged = recent(&mut lock(&self.by_server), server, now);
            lines.push(format!(
                "server {server}: {staged} of {most} writes in the last hour"
            ));
        }
        lines
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// The stagings of `key` within the hour before `now`, trimmed to it.
fn recent(times: &mut HashMap<String, VecDeque<u64>>, key: &str, now: u64) -> usize {
    let Some(queue) = times.get_mut(key) else {
        return 0;
    };
    while queue.front().is_some_and(|t| t + HOUR_MS <= now) {
        queue.pop_front();
    }
    queue.len()
}

/// When `key` has `most` stagings in the hour before `now`: how long until the oldest
/// leaves the hour.
fn full(
    times: &mut HashMap<String, VecDeque<u64>>,
    key: &str,
    most: usize,
    now: u64,
) -> Option<u64> {
    if recent(times, key, now) < most {
        return None;
    }
    let oldest = times.get(key)?.front()?;
    Some((oldest + HOUR_MS).saturating_sub(now))
}

fn push(times: &mut HashMap<String, VecDeque<u64>>, key: &str, now: u64) {
    times.entry(key.to_owned()).or_default().push_back(now);
}

/// `ms` as whole minutes, rounded up ("1 minute" at least).
fn minutes(ms: u64) -> String {
    match ms.div_ceil(60_000).max(1) {
        1 => "1 minute".to_owned(),
        n => format!("{n} minutes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quotas() -> Quotas {
        Quotas::new(
            [(
                "coder".to_owned(),
                AgentLimits {
                    open: Some(2),
                    per_hour: Some(3),
                },
            )],
            [("files".to_owned(), 4)],
            &[],
            0,
        )
    }

    #[test]
    fn an_agent_is_held_to_its_open_actions_and_its_hour() {
        let quotas = quotas();
        assert!(quotas.check("coder", "files", 1, 0).is_ok());
        let open = quotas.check("coder", "files", 2, 0).unwrap_err();
        assert!(
            open.contains("max_open_actions = 2 for agent coder"),
            "{open}"
        );
        for t in [0, 1_000, 2_000] {
            quotas.record("coder", "files", t);
        }
        let hour = quotas
            .check("coder", "files", 0, 10 * 60 * 1000)
            .unwrap_err();
        assert!(
            hour.contains("max_writes_per_hour = 3") && hour.contains("again in 50 minutes"),
            "{hour}"
        );
        // An hour after the first, one more fits.
        assert!(quotas.check("coder", "files", 0, HOUR_MS).is_ok());
    }

    #[test]
    fn a_server_is_held_to_its_hour_across_agents_and_others_are_free() {
        let quotas = quotas();
        for t in 0..4 {
            quotas.record(if t % 2 == 0 { "coder" } else { "writer" }, "files", t);
        }
        let full = quotas.check("writer", "files", 0, 10).unwrap_err();
        assert!(full.contains("on server files"), "{full}");
        assert!(quotas.check("writer", "memory", 0, 10).is_ok());
        assert_eq!(
            quotas.report(&[], 10),
            [
                "agent coder: 0 of 2 open actions, 2 of 3 writes in the last hour",
                "server files: 4 of 4 writes in the last hour"
            ]
        );
    }
}

//! Who the person is, and what the person's socket does besides listing, showing,
//! approving and rejecting: auto-approval rules, revert, the ledger, and lockdown.
//!
//! The person's name is never taken from a request: it is the operating system's user
//! behind the socket ([`peer_person`], from the connection's peer credentials), so the
//! ledger cannot be told that someone else decided, and the name is never empty.

use kernel::{DecisionError, EntryBody, LedgerEntry, LedgerId};
use prompt_sanitize::{MAX_DESCRIPTION_CHARS, MAX_INLINE_CHARS, code_span, plain_inline};
use serde::{Deserialize, Serialize};
use serde_json::json;
use store_sqlite::LedgerReader;
use tokio::net::UnixStream;

use crate::control::{Request, Response};
use crate::gateway::Gateway;

/// The most entries one ledger page returns.
pub const MAX_LEDGER_PAGE: usize = 1000;

/// How many rows the daemon reads at a time while it looks for a page's matches.
const SCAN_CHUNK: usize = 256;

/// The operating system's user behind a connection, as the ledger records it: the user's
/// login name, or `uid N` for a user without one. An error says why it could not be told.
pub fn peer_person(stream: &UnixStream) -> Result<String, String> {
    let credentials = stream.peer_cred().map_err(|e| e.to_string())?;
    let uid = credentials.uid();
    Ok(user_name(uid))
}

/// Why the process behind a connection may not use the person's socket at all, when it is
/// one the daemon started (a downstream server, or anything it started, at any depth),
/// whichever user it runs as: only a person decides, or reads what waits for a decision.
pub fn started_by_gate(stream: &UnixStream) -> Option<String> {
    let pid = stream.peer_cred().ok()?.pid()?;
    if !gatekeeper_mcp::confine::started_by_this_process(pid) {
        return None;
    }
    tracing::warn!(
        pid,
        "control.refused: a process the gate started (a downstream server or one of its children) connected to the person's socket"
    );
    Some(format!(
        "refused: process {pid} was started by the gate (a downstream server, or a process one started); only a person uses this socket, from a terminal of their own"
    ))
}

/// The login name of user `uid`, or `uid N` when the system has no entry for it.
pub fn user_name(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(user)) if !user.name.trim().is_empty() => user.name,
        _ => format!("uid {uid}"),
    }
}

/// Which ledger entries to show, and which page.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LedgerQuery {
    /// Only entries of this agent (the caller).
    pub agent: Option<String>,
    /// Only entries of this server (the gatekeeper).
    pub server: Option<String>,
    /// Only entries in this state: an action state (`pending`, `approved`, `rejected`,
    /// `failed`, `reverted`, `expired`) or `read` for observations.
    pub state: Option<String>,
    /// Only entries recorded at or after this time (milliseconds since the Unix epoch).
    pub since: Option<u64>,
    /// Only entries recorded before this time (milliseconds since the Unix epoch).
    pub until: Option<u64>,
    /// Only entries with ids below this one (the next page of an earlier answer).
    pub before: Option<u64>,
    /// At most this many entries (at most [`MAX_LEDGER_PAGE`]).
    pub limit: usize,
    /// Answer with JSON instead of lines for a person.
    pub json: bool,
    /// Show the secrets a view redacts ([`crate::redaction`]): the ledger as recorded.
    #[serde(default)]
    pub reveal: bool,
}

/// The states a ledger filter may name.
const STATES: [&str; 7] = [
    "pending", "approved", "rejected", "failed", "reverted", "expired", "read",
];

impl LedgerQuery {
    fn matches(&self, entry: &LedgerEntry) -> bool {
        let state = match &entry.body {
            EntryBody::Observation(_) => "read",
            EntryBody::Action(action) => action.state.as_str(),
        };
        self.agent.as_deref().is_none_or(|a| *entry.caller == *a)
            && self
                .server
                .as_deref()
                .is_none_or(|s| *entry.gatekeeper == *s)
            && self.state.as_deref().is_none_or(|s| s == state)
            && self.since.is_none_or(|t| entry.created_at.0 >= t)
            && self.until.is_none_or(|t| entry.created_at.0 < t)
    }
}

/// One row of a page: an entry, or the id of a row that could not be read and why.
type Row = Result<LedgerEntry, (LedgerId, String)>;

/// One page of the ledger: the matching entries, most recent first, and where the next
/// page starts (`None` when there is no more).
fn ledger_page(gateway: &Gateway, query: &LedgerQuery) -> Result<(Vec<Row>, Option<u64>), String> {
    if let Some(state) = &query.state
        && !STATES.contains(&state.as_str())
    {
        return Err(format!(
            "there is no state {}; use one of: {}",
            code_span(state, MAX_INLINE_CHARS),
            STATES.join(", ")
        ));
    }
    let limit = query.limit.clamp(1, MAX_LEDGER_PAGE);
    let mut found = Vec::new();
    for row in descending_rows(gateway, query.before)? {
        match row? {
            Ok(entry) if !query.matches(&entry) => continue,
            // A row that cannot be read is shown whatever the filter: it may be exactly
            // what the person looks for.
            row => found.push(row),
        }
        if found.len() == limit {
            let next = match found.last() {
                Some(Ok(entry)) => entry.id.0,
                Some(Err((id, _))) => id.0,
                None => unreachable!("limit is at least 1"),
            };
            return Ok((found, (next > 1).then_some(next)));
        }
    }
    Ok((found, None))
}

/// The ledger's rows with ids below `before` (all without it), most recent first: from
/// the SQLite file a chunk at a time, or, on a team's database (no file to page
/// through), from the kernel's ledger.
fn descending_rows(
    gateway: &Gateway,
    before: Option<u64>,
) -> Result<Box<dyn Iterator<Item = Result<Row, String>>>, String> {
    let unreadable = |e: &dyn std::fmt::Display| format!("could not read the ledger: {e}");
    let file = gateway.ledger_file().map_err(|e| unreadable(&e))?;
    let Some(file) = file else {
        let entries = gateway.overseer().ledger().map_err(|e| unreadable(&e))?;
        return Ok(Box::new(
            entries
                .into_iter()
                .rev()
                .filter(move |e| before.is_none_or(|before| e.id.0 < before))
                .map(|e| Ok(Ok(e))),
        ));
    };
    let reader = LedgerReader::open(file).map_err(|e| {
        format!("could not read the ledger: {e}; check the data directory of `gate serve`")
    })?;
    let mut cursor = before.map(LedgerId);
    let mut chunk = std::collections::VecDeque::new();
    let mut done = false;
    Ok(Box::new(std::iter::from_fn(move || {
        if chunk.is_empty() && !done {
            match reader.page(cursor, SCAN_CHUNK) {
                Ok(rows) => {
                    let last = rows.last().map(|row| match row {
                        Ok(entry) => entry.id,
                        Err(unreadable) => unreadable.id,
                    });
                    done = last.is_none_or(|last| last.0 <= 1);
                    cursor = last;
                    chunk.extend(rows.into_iter().map(|row| {
                        Ok(row.map_err(|unreadable| (unreadable.id, unreadable.reason)))
                    }));
                }
                Err(e) => {
                    done = true;
                    return Some(Err(unreadable(&e)));
                }
            }
        }
        chunk.pop_front()
    })))
}

fn ledger(gateway: &Gateway, query: &LedgerQuery) -> Response {
    let (rows, next) = match ledger_page(gateway, query) {
        Ok(page) => page,
        Err(text) => return Response { ok: false, text },
    };
    if query.json {
        let entries: Vec<serde_json::Value> = rows
            .iter()
            .map(|row| match row {
                Ok(entry) => serde_json::to_value(entry)
                    .unwrap_or_else(|e| json!({"id": entry.id.0, "unreadable": e.to_string()})),
                Err((id, reason)) => json!({"id": id.0, "unreadable": reason}),
            })
            // Each string redacted on its own: a secret in one field never swallows another.
            .map(|entry| match query.reveal {
                true => entry,
                false => gateway.redactor().json(&entry).value,
            })
            .collect();
        let text =
            json!({"entries": entries, "next_before": next, "revealed": query.reveal}).to_string();
        return Response { ok: true, text };
    }
    let mut lines = Vec::new();
    let mut readable = Vec::new();
    let flush = |readable: &mut Vec<LedgerEntry>, lines: &mut Vec<String>| {
        if !readable.is_empty() {
            lines.push(shell::render_ledger(readable).to_string());
            readable.clear();
        }
    };
    for row in rows {
        match row {
            Ok(entry) => readable.push(entry),
            Err((id, reason)) => {
                flush(&mut readable, &mut lines);
                lines.push(format!(
                    "{id}  could not be read: {}",
                    plain_inline(&reason, MAX_DESCRIPTION_CHARS)
                ));
            }
        }
    }
    flush(&mut readable, &mut lines);
    if lines.is_empty() {
        lines.push("No ledger entries match.".to_owned());
    }
    if let Some(next) = next {
        lines.push(format!("(more: add --before {next} for the next page)"));
    }
    if query.reveal {
        lines.insert(
            0,
            "(secrets revealed: --reveal shows the ledger as recorded)".to_owned(),
        );
    }
    Response {
        ok: true,
        text: lines.join("\n"),
    }
}

fn rules(gateway: &Gateway) -> Response {
    let overseer = gateway.overseer();
    let rules = match overseer.rules() {
        Ok(rules) => rules,
        Err(error) => {
            return Response {
                ok: false,
                text: error.to_string(),
            };
        }
    };
    let mut lines = Vec::new();
    if rules.is_empty() {
        lines.push("No auto-approval rules are enabled.".to_owned());
    } else {
        lines.push("Auto-approval rules (remove one with `gate rules remove NAME`):".into());
        let now = gateway.clock().now();
        for rule in &rules {
            let when = if rule.enabled_at.0 > 0 {
                format!(" at {}", rule.enabled_at)
            } else {
                String::new()
            };
            lines.push(format!(
                "  {} (server {}), enabled by {}{when}: {}{}",
                code_span(
                    &gateway.person_name(&rule.gatekeeper, &rule.kind.label),
                    MAX_INLINE_CHARS
                ),
                code_span(&rule.gatekeeper, MAX_INLINE_CHARS),
                code_span(&rule.enabled_by, MAX_INLINE_CHARS),
                plain_inline(&rule.scope.to_string(), MAX_DESCRIPTION_CHARS),
                if rule.expired(now) {
                    " (expired: it applies nothing)"
                } else {
                    ""
                },
            ));
        }
    }
    let kinds: Vec<_> = overseer
        .pre_approvable_kinds()
        .into_iter()
        .filter(|(server, kind)| {
            !rules
                .iter()
                .any(|r| r.gatekeeper == *server && r.kind.tag == kind.tag)
        })
        .collect();
    if !kinds.is_empty() {
        lines.push(
            "Tools a rule could cover (a vetted server marks them safe to repeat; enable one with `gate rules add NAME`):"
                .into(),
        );
        for (server, kind) in kinds {
            lines.push(format!(
                "  {} (server {})",
                code_span(&gateway.person_name(&server, &kind.label), MAX_INLINE_CHARS),
                code_span(&server, MAX_INLINE_CHARS),
            ));
        }
    }
    Response {
        ok: true,
        text: lines.join("\n"),
    }
}

/// Enable a rule for the tool `words` name ([`crate::kinds::named`]), if a rule can cover
/// it ([`crate::kinds::rule_target`]).
async fn rule_add(
    gateway: &Gateway,
    words: &[String],
    grant: &crate::grants::GrantScope,
    person: &str,
) -> Response {
    let target = crate::kinds::named(gateway, words)
        .and_then(|(server, tool)| crate::kinds::rule_target(gateway, &server, &tool))
        .and_then(|target| {
            crate::grants::scope_of(gateway, grant, &target, None).map(|scope| (target, scope))
        });
    let (target, scope) = match target {
        Ok(target) => target,
        Err(why) => {
            return Response {
                ok: false,
                text: format!("no rule was enabled: {why}"),
            };
        }
    };
    let overseer = gateway.overseer();
    let words = scope.to_string();
    let whole = scope.is_whole_kind();
    if let Err(error) = overseer.enable_scoped_rule(&target.server, target.kind, person, scope) {
        return Response {
            ok: false,
            text: error.to_string(),
        };
    }
    overseer.settle().await;
    let name = code_span(&target.name, MAX_INLINE_CHARS);
    Response {
        ok: true,
        text: if whole {
            format!(
                "rule enabled by {}: calls of {name} now apply without asking; remove it with `gate rules remove {}`",
                code_span(person, MAX_INLINE_CHARS),
                target.name,
            )
        } else {
            format!(
                "rule enabled by {}: calls of {name} now apply without asking: {}; remove it with `gate rules remove {}`",
                code_span(person, MAX_INLINE_CHARS),
                plain_inline(&words, MAX_DESCRIPTION_CHARS),
                target.name,
            )
        },
    }
}

fn rule_remove(gateway: &Gateway, words: &[String], person: &str) -> Response {
    let overseer = gateway.overseer();
    let (server, tag, name) =
        match crate::kinds::named(gateway, words) {
            Ok((server, tool)) => {
                let downstream = gateway.downstream(&server);
                let tag = downstream
                    .and_then(|d| d.gatekeeper.action_kind(&tool))
                    .map(|k| k.tag);
                let name = gateway.person_name(&server, &tool);
                (server, tag, name)
            }
            // A rule for a tool its server no longer lists: by server and tool as the rule
            // has them.
            Err(why) => match words {
                [server, tool] => match overseer.rules().unwrap_or_default().into_iter().find(|r| {
                    r.gatekeeper == *server && (r.kind.label == *tool || r.kind.tag == *tool)
                }) {
                    Some(rule) => (
                        server.clone(),
                        Some(rule.kind.tag),
                        format!("{server}__{tool}"),
                    ),
                    None => {
                        return Response {
                            ok: false,
                            text: format!("no rule was removed: {why}"),
                        };
                    }
                },
                _ => {
                    return Response {
                        ok: false,
                        text: format!("no rule was removed: {why}"),
                    };
                }
            },
        };
    let shown = code_span(&name, MAX_INLINE_CHARS);
    match tag.map(|tag| overseer.remove_rule(&server, &tag)) {
        Some(Ok(true)) => {
            tracing::info!(%server, %name, by = %person, "rule removed by the person");
            Response {
                ok: true,
                text: format!("rule removed: calls of {shown} wait for a person again"),
            }
        }
        Some(Ok(false)) | None => Response {
            ok: false,
            text: format!("there is no rule for {shown}; `gate rules` lists them"),
        },
        Some(Err(error)) => Response {
            ok: false,
            text: error.to_string(),
        },
    }
}

async fn revert(gateway: &Gateway, id: u64, person: &str) -> Response {
    let ledger = LedgerId(id);
    // A revert is a write to the service: nothing of a locked-down agent leaves.
    if let Some((agent, why)) = gateway.locked_caller(ledger) {
        return Response {
            ok: false,
            text: format!(
                "#{id}: not reverted: agent {} is locked down because {}; a revert writes to the server, and nothing of a locked-down agent may leave; undo it directly in the server if it must be undone",
                code_span(&agent, MAX_INLINE_CHARS),
                plain_inline(&why, MAX_DESCRIPTION_CHARS)
            ),
        };
    }
    match gateway.overseer().revert(ledger, person).await {
        Ok(report) if report.reverted => {
            let mut text = format!("#{id}: reverted by {}", code_span(person, MAX_INLINE_CHARS));
            for flagged in report.flagged {
                text.push_str(&format!(
                    "\n  {flagged} depends on it and is held for you: check it before approving"
                ));
            }
            Response { ok: true, text }
        }
        Ok(report) => Response {
            ok: false,
            text: format!(
                "#{id}: the server's driver refused to revert it: {}{}",
                plain_inline(
                    report.message.as_deref().unwrap_or(""),
                    MAX_DESCRIPTION_CHARS
                ),
                if report.can_retry {
                    "; you may ask again"
                } else {
                    "; undo it directly in the server if it must be undone"
                }
            ),
        },
        Err(error @ DecisionError::Gatekeeper { .. }) => Response {
            ok: false,
            text: format!(
                "#{id}: {}",
                plain_inline(&error.to_string(), MAX_DESCRIPTION_CHARS)
            ),
        },
        Err(error) => Response {
            ok: false,
            text: format!("#{id}: {error}"),
        },
    }
}

fn lockdown(gateway: &Gateway) -> Response {
    let mut lines = Vec::new();
    if gateway.overseer().is_locked_down().unwrap_or(false) {
        lines.push("The whole ledger is locked down (the kernel's latch): nothing is applied any more, and it is never lifted; start a new data directory.".to_owned());
    }
    let locked: Vec<(String, String)> = gateway
        .agent_names()
        .filter_map(|agent| Some((agent.to_owned(), gateway.lockdown_of(agent)?)))
        .collect();
    if locked.is_empty() {
        lines.push("No agent is locked down.".to_owned());
    }
    for (agent, why) in locked {
        lines.push(format!(
            "agent {} is locked down because {}: none of its writes are staged or sent; lift with `gate lockdown lift {agent} --reason TEXT` only once it is safe (see the README)",
            code_span(&agent, MAX_INLINE_CHARS),
            plain_inline(&why, MAX_DESCRIPTION_CHARS)
        ));
    }
    let lifts = gateway.lifts();
    if !lifts.is_empty() {
        lines.push("Lifted before:".to_owned());
        for lift in lifts {
            lines.push(format!(
                "  {} agent {} by {} (it was locked down because {}): {}",
                kernel::Timestamp(lift.at),
                code_span(&lift.agent, MAX_INLINE_CHARS),
                code_span(&lift.by, MAX_INLINE_CHARS),
                plain_inline(&lift.was, MAX_DESCRIPTION_CHARS),
                plain_inline(&lift.reason, MAX_DESCRIPTION_CHARS),
            ));
        }
    }
    Response {
        ok: true,
        text: lines.join("\n"),
    }
}

fn lockdown_lift(gateway: &Gateway, agent: &str, reason: &str, person: &str) -> Response {
    match gateway.lift_lockdown(agent, person, reason) {
        Ok(was) => {
            let open: Vec<String> = gateway
                .overseer()
                .open_actions()
                .unwrap_or_default()
                .iter()
                .filter(|e| &*e.caller == agent)
                .map(|e| e.id.to_string())
                .collect();
            let mut text = format!(
                "lockdown of agent {} lifted by {} and recorded (it was locked down because {}); its writes are staged again",
                code_span(agent, MAX_INLINE_CHARS),
                code_span(person, MAX_INLINE_CHARS),
                plain_inline(&was, MAX_DESCRIPTION_CHARS)
            );
            if !open.is_empty() {
                text.push_str(&format!(
                    "\nits open actions may carry what it read; review each before approving: {}",
                    open.join(" ")
                ));
            }
            Response { ok: true, text }
        }
        Err(error) => Response {
            ok: false,
            text: error.to_string(),
        },
    }
}

/// Answer one of the requests this module handles, decided by `person`.
pub(crate) async fn execute(request: Request, person: &str, gateway: &Gateway) -> Response {
    match request {
        Request::Rules => rules(gateway),
        Request::RuleAdd { name, scope } => rule_add(gateway, &name, &scope, person).await,
        Request::RuleTest { id, tests } => match crate::grants::test_rule(gateway, id, tests).await
        {
            Ok(text) => Response { ok: true, text },
            Err(text) => Response { ok: false, text },
        },
        Request::RuleRemove { name } => rule_remove(gateway, &name, person),
        Request::Revert { id } => revert(gateway, id, person).await,
        Request::Ledger { query } => ledger(gateway, &query),
        Request::Lockdown => lockdown(gateway),
        Request::LockdownLift { agent, reason } => lockdown_lift(gateway, &agent, &reason, person),
        other => Response {
            ok: false,
            text: format!("the gate cannot answer {other:?} here; this is a bug in the gate"),
        },
    }
}

/// Milliseconds since the Unix epoch of `text`, a UTC date `YYYY-MM-DD` with an optional
/// time `HH:MM` or `HH:MM:SS` after a `T` or a space.
pub fn parse_time(text: &str) -> Result<u64, String> {
    let bad = || {
        format!(
            "{text:?} is not a time; write a UTC date and time like 2026-11-30 or 2026-11-30T20:15:00"
        )
    };
    let text = text.trim().trim_end_matches('Z');
    let (date, time) = match text.split_once(['T', ' ']) {
        Some((date, time)) => (date, Some(time)),
        None => (text, None),
    };
    let numbers = |s: &str, n: usize| -> Option<Vec<u64>> {
        let parts: Vec<u64> = s
            .split(['-', ':'])
            .map(|p| p.parse().ok())
            .collect::<Option<_>>()?;
        (parts.len() == n).then_some(parts)
    };
    let d = numbers(date, 3).ok_or_else(bad)?;
    let (y, m, day) = (d[0], d[1], d[2]);
    if !(1970..=9999).contains(&y) || !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return Err(bad());
    }
    let (h, min, s) = match time {
        None => (0, 0, 0),
        Some(t) => {
            let parts = numbers(t, 3).or_else(|| numbers(t, 2)).ok_or_else(bad)?;
            (parts[0], parts[1], parts.get(2).copied().unwrap_or(0))
        }
    };
    if h > 23 || min > 59 || s > 59 {
        return Err(bad());
    }
    let days = days_from_civil(y, m, day);
    Ok(((days * 24 + h) * 60 + min) * 60_000 + s * 1000)
}

/// Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: u64, m: u64, d: u64) -> u64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_read_as_utc_and_nonsense_is_refused() {
        assert_eq!(parse_time("1970-01-02"), Ok(86_400_000));
        assert_eq!(parse_time("2026-11-30T20:15:00Z"), Ok(1_796_069_700_000));
        assert_eq!(parse_time("2026-11-30 20:15"), Ok(1_796_069_700_000));
        assert_eq!(
            kernel::Timestamp(parse_time("2000-02-29T00:00").expect("a leap day")).to_string(),
            "2000-02-29 00:00:00.000"
        );
        for bad in ["yesterday", "2026-13-01", "2026-11-30T25:00", "2026-11"] {
            assert!(parse_time(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_user_without_an_entry_is_named_by_uid_never_empty() {
        assert_eq!(user_name(0), "root");
        assert_eq!(user_name(4_000_000_000), "uid 4000000000");
    }
}

//! The person's socket's structured answer for the review screen (`gate review`): every open
//! action as a row, with its approval prompt, as JSON.
//!
//! Every string in a row was rendered by the shell crate ([`shell::queue_rows`]) from
//! sanitized pieces, so the screen only lays it out. The daemon's answer is redacted of
//! secrets, field by field ([`snapshot`], [`crate::redaction`]); the screen asks for the real
//! arguments of one action only when the person presses `v` (`gate show ID --reveal`).

use std::collections::HashMap;
use std::path::Path;

use kernel::{AutoApprovalRule, LedgerEntry, LedgerId};

use prompt_sanitize::{MAX_DESCRIPTION_CHARS, Sanitized, neutralize_controls, plain_inline};
use serde::{Deserialize, Serialize};

use crate::control::{self, ControlError, Request};
use crate::gateway::Gateway;

/// The open work, as the review screen shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Queue {
    /// Every open action, in ascending id.
    pub rows: Vec<Row>,
    /// The questions servers ask during the person's sends, one line each (which action,
    /// what it asks, the command that answers), redacted ([`crate::questions`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub questions: Vec<String>,
}

/// One open action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Row {
    /// The ledger id.
    pub id: u64,
    /// The agent that staged it, as a label (`«coder»`).
    pub agent: String,
    /// Its server, in brackets (`[fixture]`).
    pub server: String,
    /// Its kind, as a label, or the words saying it has none.
    pub kind: String,
    /// Its title, as a label.
    pub title: String,
    /// When it was staged.
    pub staged_at: String,
    /// Its state, in words.
    pub state: String,
    /// What the person should know before deciding (a rejected dependency, an unknown
    /// outcome, an earlier action it is held behind, a locked-down agent).
    pub flags: Vec<String>,
    /// Whether a rule would apply it, in words.
    pub rule: String,
    /// How to take a rule for its kind back, when one may be enabled from the screen:
    /// `None` when its kind cannot be allowed as a whole.
    pub revoke: Option<String>,
    /// The approval prompt, exactly as the shell renders it (redacted of secrets in the
    /// daemon's answer).
    pub prompt: String,
    /// How many secrets the daemon redacted from this row (`v` shows them).
    #[serde(default)]
    pub hidden: usize,
}

/// Whether `text` can stand in a shell command unquoted.
fn shell_word(text: &str) -> bool {
    !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '%' | '~'))
}

/// The command that removes a rule for the tool agents call `name`, when it is a plain
/// word; otherwise a pointer to the list of rules, where the person finds it.
fn revoke_command(name: &str) -> Sanitized {
    if shell_word(name) {
        neutralize_controls(&format!("gate rules remove {name}"))
    } else {
        Sanitized::literal("gate rules list, then gate rules remove with the tool's name")
    }
}

/// The open work of `gateway` now, every field redacted of secrets (a prompt around its
/// call's real arguments, [`crate::redaction::prompt`]).
pub async fn snapshot(gateway: &Gateway) -> Result<Queue, kernel::DecisionError> {
    let overseer = gateway.overseer();
    let open = overseer.open_actions()?;
    let rules = overseer.rules()?;
    let mut queue = rows(
        &open,
        &rules,
        |agent| gateway.lockdown_of(agent),
        |server, tool| gateway.person_name(server, tool),
    );
    let redactor = gateway.redactor();
    for row in &mut queue.rows {
        let args = gateway.arguments_of(LedgerId(row.id)).await;
        let prompt = crate::redaction::prompt(redactor, &row.prompt, args.as_ref());
        row.prompt = prompt.value;
        row.hidden = prompt.hidden;
        // The prompt holds these too, and counts what they hide.
        for field in [
            &mut row.title,
            &mut row.agent,
            &mut row.kind,
            &mut row.server,
        ] {
            *field = redactor.text(field).value;
        }
        for flag in &mut row.flags {
            *flag = redactor.text(flag).value;
        }
    }
    for (id, notice) in gateway.questions().notices() {
        let notice = redactor.text(&notice).value;
        if let Some(row) = queue.rows.iter_mut().find(|r| r.id == id) {
            row.flags.push(format!(
                "its server asks you a question: `gate answer {id}` (see below the list)"
            ));
        }
        queue.questions.push(notice);
    }
    // Writes on simulated servers: STALE (checked now, with real reads), built on another.
    for row in &mut queue.rows {
        for note in crate::control::simulation_notes(gateway, LedgerId(row.id)).await {
            let note = note
                .strip_prefix(&format!("#{}: ", row.id))
                .unwrap_or(&note)
                .to_owned();
            row.flags.push(redactor.text(&note).value);
        }
    }
    let now = overseer.now();
    for row in &mut queue.rows {
        let expires = open
            .iter()
            .find(|e| e.id.0 == row.id)
            .and_then(|e| overseer.expires_at(e));
        if let Some(at) = expires {
            row.flags.push(expiry_flag(at.saturating_sub(now)));
        }
    }
    Ok(queue)
}

/// How long until a pending action expires, as a flag: `expires in 3 h 20 min`.
pub fn expiry_flag(left_ms: u64) -> String {
    let minutes = left_ms.div_ceil(60_000);
    let text = match (minutes / 60, minutes % 60) {
        (0, m) => format!("{m} min"),
        (h, 0) => format!("{h} h"),
        (h, m) => format!("{h} h {m} min"),
    };
    format!("expires in {text} (nothing is sent if nobody decides)")
}

/// The rows of the open actions `open` under `rules`, rendered by the shell crate;
/// `lockdown` says why an agent is locked down, if it is; `name` gives the person's name of
/// a server's tool ([`Gateway::person_name`]).
pub fn rows(
    open: &[LedgerEntry],
    rules: &[AutoApprovalRule],
    lockdown: impl Fn(&str) -> Option<String>,
    name: impl Fn(&str, &str) -> String,
) -> Queue {
    let entries: HashMap<LedgerId, &LedgerEntry> = open.iter().map(|e| (e.id, e)).collect();
    let rows = shell::queue_rows(open, rules)
        .into_iter()
        .map(|row| {
            let entry = entries[&row.id];
            let mut flags: Vec<String> =
                row.flags.into_iter().map(Sanitized::into_string).collect();
            if let Some(why) = lockdown(&entry.caller) {
                flags.push(format!(
                    "agent locked down because {}: you may only reject",
                    plain_inline(&why, MAX_DESCRIPTION_CHARS)
                ));
            }
            let tool = entry
                .action()
                .and_then(|a| a.description.action_kind.as_ref())
                .map(|k| k.label.as_str());
            Row {
                id: row.id.0,
                agent: row.agent.into_string(),
                server: row.server.into_string(),
                kind: row.kind.into_string(),
                title: row.title.into_string(),
                staged_at: row.created_at.to_string(),
                state: row.state.into_string(),
                flags,
                rule: row.rule.into_string(),
                revoke: tool
                    .filter(|_| row.kind_allowable)
                    .map(|tool| revoke_command(&name(&entry.gatekeeper, tool)).into_string()),
                prompt: row.prompt.into_string(),
                hidden: 0,
            }
        })
        .collect();
    Queue {
        rows,
        questions: Vec::new(),
    }
}

/// Ask the daemon whose socket is `path` for its open work.
pub fn fetch(path: &Path) -> Result<Queue, ControlError> {
    let response = control::request(path, &Request::Queue)?;
    let unreachable = |message: String| ControlError::Unreachable {
        path: path.display().to_string(),
        message,
    };
    if !response.ok {
        return Err(unreachable(response.text));
    }
    serde_json::from_str(&response.text).map_err(|e| unreachable(format!("unreadable queue: {e}")))
}

#[cfg(test)]
mod tests {
    use super::expiry_flag;

    #[test]
    fn the_expiry_flag_rounds_up_to_the_minute() {
        assert_eq!(
            expiry_flag(86_400_000),
            "expires in 24 h (nothing is sent if nobody decides)"
        );
        assert_eq!(
            expiry_flag(3_600_001),
            "expires in 1 h 1 min (nothing is sent if nobody decides)"
        );
        assert_eq!(
            expiry_flag(59_000),
            "expires in 1 min (nothing is sent if nobody decides)"
        );
        assert_eq!(
            expiry_flag(0),
            "expires in 0 min (nothing is sent if nobody decides)"
        );
    }
}

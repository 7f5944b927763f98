//! Rendering for the terminal: the batch of open actions, one action's prompt, the ledger.
//!
//! Everything read from the ledger is untrusted here, and the person must be able to tell it
//! from the shell's own words on every line:
//!
//! - names, titles, callers, kind labels and messages are shown as labels,
//!   [`untrusted_label`]: one line between `«` and `»`, which the text cannot close, so a
//!   tool named `auto-approvable: yes` shows as `kind: «auto-approvable: yes» ·
//!   auto-approvable: no`, never as a field of the shell's;
//! - a gatekeeper's name stands between `[` and `]`, which [`plain_inline`] removes from it;
//! - an action's description is Markdown the driver built from sanitized pieces: it is shown
//!   as it is after [`neutralize_controls`], every line behind a `┆` gutter, so the driver's
//!   voice is never mistaken for the shell's.
//!
//! So every line the shell prints is either its own (with untrusted pieces only inside their
//! marks) or behind the gutter. Text the shell writes itself (ids, states, fixed words) also
//! passes through `neutralize_controls`, which is cheap and keeps every line a [`Sanitized`].
//!
//! This module only formats. It reads nothing and decides nothing.

use std::collections::HashMap;

use kernel::{
    ActionEntry, ActionState, AutoApprovalRule, EntryBody, FailureKind, LedgerEntry, LedgerId,
    Timestamp,
};
use prompt_sanitize::{
    MAX_INLINE_CHARS, Sanitized, neutralize_controls, plain_inline, untrusted_label,
};

/// How much of a failure message the batch shows, in chars.
const MAX_MESSAGE_CHARS: usize = 300;

/// Text the shell itself writes (ids, states, fixed words, numbers).
pub(crate) fn ours(text: impl AsRef<str>) -> Sanitized {
    neutralize_controls(text.as_ref())
}

/// A name, title, caller or label read from the ledger: one line between `«` and `»`.
pub(crate) fn name(text: &str) -> Sanitized {
    untrusted_label(text, MAX_INLINE_CHARS)
}

/// A gatekeeper's name, for inside `[` and `]`: one line with no brackets in it.
pub(crate) fn gatekeeper(text: &str) -> Sanitized {
    plain_inline(text, MAX_INLINE_CHARS)
}

/// A message read from the ledger or a driver (a failure, a refusal): one line between `«`
/// and `»`, controls made visible, punctuation kept.
pub(crate) fn message(text: &str) -> Sanitized {
    untrusted_label(text, MAX_MESSAGE_CHARS)
}

/// Joins lines of sanitized text with `\n`.
pub(crate) fn lines(lines: &[Sanitized]) -> Sanitized {
    let newline = Sanitized::literal("\n");
    let mut parts: Vec<&Sanitized> = Vec::with_capacity(lines.len() * 2);
    for (n, line) in lines.iter().enumerate() {
        if n > 0 {
            parts.push(&newline);
        }
        parts.push(line);
    }
    Sanitized::concat(&parts)
}

/// How many chars `text` takes on the terminal (one per char: good enough for the names
/// and states shown here).
fn width(text: &Sanitized) -> usize {
    text.as_str().chars().count()
}

/// `[name]`, for a gatekeeper.
fn bracketed(name: &str) -> Sanitized {
    Sanitized::concat(&[&ours("["), &gatekeeper(name), &ours("]")])
}

/// Lays out rows as aligned columns, two spaces apart and indented by two; the last column
/// is not padded and trailing blanks are trimmed.
fn table(rows: &[Vec<Sanitized>]) -> Vec<Sanitized> {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(width)
                .max()
                .unwrap_or(0)
        })
        .collect();
    rows.iter()
        .map(|row| {
            let mut line = String::from("  ");
            for (c, cell) in row.iter().enumerate() {
                line.push_str(cell.as_str());
                if c + 1 < row.len() {
                    line.push_str(&" ".repeat(widths[c].saturating_sub(width(cell)) + 2));
                }
            }
            // Every piece is sanitized and only spaces were added: re-running the layer
            // keeps the type honest at no risk.
            ours(line.trim_end())
        })
        .collect()
}

/// The state column of an action, in words that need no glossary: `pending`,
/// `approved, applied`, `failed, retryable` (nothing reached the service; approve again),
/// `failed, outcome unknown` (check the service), `failed, not sent`, `failed, refused by
/// the service`, `rejected`, `reverted`.
fn state_label(action: &ActionEntry) -> Sanitized {
    match (action.state, &action.failure) {
        (ActionState::Failed, Some(failure)) if failure.retryable => ours("failed, retryable"),
        (ActionState::Failed, Some(failure)) => ours(match failure.kind {
            FailureKind::OutcomeUnknown => "failed, outcome unknown",
            FailureKind::NotSent => "failed, not sent",
            FailureKind::ServiceError => "failed, refused by the service",
        }),
        (ActionState::Failed, None) => ours("failed, outcome unknown"),
        (ActionState::Approved, _) => ours("approved, applied"),
        (state, _) => ours(state.as_str()),
    }
}

/// Whether an auto-approval rule is enabled for the action's kind on its gatekeeper.
fn rule_for<'a>(
    entry: &LedgerEntry,
    action: &ActionEntry,
    rules: &'a [AutoApprovalRule],
) -> Option<&'a AutoApprovalRule> {
    let kind = action.description.action_kind.as_ref()?;
    rules.iter().find(|r| {
        r.gatekeeper == *entry.gatekeeper
            && r.kind.tag == kind.tag
            && r.scope
                .caller
                .as_deref()
                .is_none_or(|c| c == &*entry.caller)
    })
}

/// The "auto-approvable?" column: the driver's key, and whether the person's key is turned.
/// `open` is the batch the entry belongs to: an eligible action pending behind an earlier
/// one of the same gatekeeper that needs a person is shown as held behind it.
fn auto_label(
    entry: &LedgerEntry,
    action: &ActionEntry,
    rules: &[AutoApprovalRule],
    open: &[LedgerEntry],
) -> Sanitized {
    if !action.description.auto_approvable || action.description.action_kind.is_none() {
        return ours("auto-approvable: no");
    }
    if action.blocked_by.is_some() {
        return ours("auto-approvable: no longer (held for you)");
    }
    if rule_for(entry, action, rules).is_none() {
        return ours("auto-approvable: yes, if you allow its kind");
    }
    let gate = open
        .iter()
        .filter(|e| e.gatekeeper == entry.gatekeeper && e.id < entry.id)
        .find(|e| !eligible(e, rules));
    match gate {
        Some(gate) if action.state == ActionState::Pending => ours(format!(
            "auto-approvable: yes, rule on; held behind {} (the drain keeps id order)",
            gate.id
        )),
        _ => ours("auto-approvable: yes, rule on"),
    }
}

/// Whether the drain may apply this entry on its own: pending, both keys, not held for a
/// person because of a rejected dependency.
pub(crate) fn eligible(entry: &LedgerEntry, rules: &[AutoApprovalRule]) -> bool {
    let Some(action) = entry.action() else {
        return false;
    };
    action.state == ActionState::Pending
        && action.description.auto_approvable
        && action.blocked_by.is_none()
        && rule_for(entry, action, rules).is_some()
}

/// The indented notes under an action: failure, dependency on an action that was rejected,
/// failed for good or reverted (the entry names which one, not why).
fn notes(action: &ActionEntry, indent: &str) -> Vec<Sanitized> {
    let mut out = Vec::new();
    if let Some(root) = action.blocked_by {
        out.push(ours(format!(
            "{indent}depends on {root}, which was rejected, failed for good or reverted: never applied automatically"
        )));
    }
    if let Some(failure) = &action.failure {
        let next = match (failure.retryable, failure.kind) {
            (true, _) => "nothing reached the service; you may approve it again",
            (false, FailureKind::OutcomeUnknown) => {
                "outcome unknown: it will not be sent again; the message says what to check in the service"
            }
            (false, FailureKind::NotSent) => {
                "final: nothing reached the service, and approving it again will not help"
            }
            (false, FailureKind::ServiceError) => {
                "final: the service answered with an error and did nothing"
            }
        };
        out.push(Sanitized::concat(&[
            &ours(format!("{indent}last attempt failed: ")),
            &message(&failure.message),
        ]));
        out.push(ours(format!("{indent}({next})")));
    }
    out
}

/// Renders the open actions as a numbered batch, oldest (lowest id) first.
///
/// `open` is what [`kernel::Overseer::open_actions`] returned and `rules` what
/// [`kernel::Overseer::rules`] returned; entries that are not actions are ignored. Each line
/// shows the id, state, gatekeeper, title and whether the action may auto-apply; notes under
/// it show a dependency on a rejected action and the last failure of a retryable one.
pub fn render_batch(open: &[LedgerEntry], rules: &[AutoApprovalRule]) -> Sanitized {
    let mut sorted: Vec<&LedgerEntry> = open.iter().filter(|e| e.action().is_some()).collect();
    sorted.sort_by_key(|e| e.id);
    if sorted.is_empty() {
        return ours("Nothing waits for you.");
    }
    let heading = match sorted.len() {
        1 => ours("1 action waits for you:"),
        n => ours(format!("{n} actions wait for you, oldest first:")),
    };
    let rows: Vec<Vec<Sanitized>> = sorted
        .iter()
        .map(|entry| {
            let action = entry.action().expect("filtered to actions");
            vec![
                ours(entry.id.to_string()),
                state_label(action),
                bracketed(&entry.gatekeeper),
                name(entry.title()),
                auto_label(entry, action, rules, open),
            ]
        })
        .collect();
    let id_width = rows.iter().map(|r| width(&r[0])).max().unwrap_or(0);
    let mut out = vec![heading];
    for (entry, line) in sorted.iter().zip(table(&rows)) {
        let action = entry.action().expect("filtered to actions");
        out.push(line);
        out.extend(notes(action, &" ".repeat(4 + id_width)));
    }
    lines(&out)
}

/// Renders one action's approval prompt: who asks, the driver's description behind a gutter,
/// and the facts the decision turns on (kind, auto-approvability, revert, whether the agent
/// was told to wait).
///
/// Returns `None` for an entry that is not an action.
pub fn render_action(entry: &LedgerEntry, rules: &[AutoApprovalRule]) -> Option<Sanitized> {
    let action = entry.action()?;
    let description = &action.description;
    let mut out = vec![Sanitized::concat(&[
        &ours(format!("── {} · ", entry.id)),
        &state_label(action),
        &ours(" · "),
        &bracketed(&entry.gatekeeper),
        &ours(" · requested by "),
        &name(&entry.caller),
        &ours(" ──"),
    ])];
    out.push(Sanitized::concat(&[
        &ours("  title: "),
        &name(&description.title),
    ]));
    let body = neutralize_controls(&description.description);
    for line in body.as_str().split('\n') {
        // Each line of `body` is already sanitized; re-running the (idempotent) layer on a
        // slice is how a piece of a Sanitized becomes one again. Trailing blanks are dropped.
        let line = line.trim_end();
        out.push(if line.is_empty() {
            ours("  ┆")
        } else {
            Sanitized::concat(&[&ours("  ┆ "), &neutralize_controls(line)])
        });
    }
    let kind = match &description.action_kind {
        Some(kind) => name(&kind.label),
        None => ours("(none: always manual)"),
    };
    let yes_no = |b: bool| if b { "yes" } else { "no" };
    out.push(Sanitized::concat(&[
        &ours("  kind: "),
        &kind,
        &ours(" · "),
        &auto_label(entry, action, rules, &[]),
        &ours(format!(
            " · can be reverted: {}",
            yes_no(description.implements_revert),
        )),
    ]));
    // The driver's advice (`await_decision`), not a fact about the agent: nobody here
    // suspends it; the harness that runs the agent may.
    out.push(ours(if description.await_decision {
        "  the agent: advised to wait for your decision (the driver cannot show this call's effect before it is applied)"
    } else {
        "  the agent: may carry on (the driver shows this call as pending in the agent's reads)"
    }));
    out.extend(notes(action, "  "));
    Some(lines(&out))
}

/// Renders the whole ledger, one line per entry: what it was, its state, and who decided.
///
/// Lectures print it as evidence; a person reads it as the audit trail.
pub fn render_ledger(entries: &[LedgerEntry]) -> Sanitized {
    if entries.is_empty() {
        return ours("The ledger is empty.");
    }
    let rows: Vec<Vec<Sanitized>> = entries
        .iter()
        .map(|entry| {
            let (state, who) = match &entry.body {
                EntryBody::Observation(obs) if obs.prohibit_all_sharing => {
                    (ours("read, sensitive"), ours(""))
                }
                EntryBody::Observation(_) => (ours("read"), ours("")),
                EntryBody::Action(action) => (state_label(action), decided_by(action)),
            };
            vec![
                ours(entry.id.to_string()),
                ours(entry.created_at.to_string()),
                state,
                bracketed(&entry.gatekeeper),
                name(entry.title()),
                who,
            ]
        })
        .collect();
    lines(&table(&rows))
}

/// "by alice", "auto, rule by alice", "by alice (cascaded from #3)", or nothing.
fn decided_by(action: &ActionEntry) -> Sanitized {
    let Some(resolution) = &action.resolution else {
        return ours("");
    };
    if action.state == ActionState::Expired {
        // Nobody decided: the time to live did.
        return ours(format!("nobody decided; expired at {}", resolution.at));
    }
    let lead = if resolution.auto {
        "auto, rule by "
    } else {
        "by "
    };
    let mut parts = vec![
        ours(lead),
        name(&resolution.by),
        ours(format!(" at {}", resolution.at)),
    ];
    if let Some(cause) = &resolution.cause {
        parts.push(ours(" ("));
        parts.push(message(cause));
        parts.push(ours(")"));
    }
    let refs: Vec<&Sanitized> = parts.iter().collect();
    Sanitized::concat(&refs)
}

/// Renders the auto-approval rules, one line each: `[gatekeeper] «kind label», enabled by
/// «person»`, or a sentence saying there are none.
///
/// A rule's label and its enabler are untrusted like every other string from the ledger, so
/// they go through the same labels as the batch: a label cannot add a line of its own.
pub fn render_rules(rules: &[AutoApprovalRule]) -> Sanitized {
    if rules.is_empty() {
        return ours("No auto-approval rules are enabled.");
    }
    let mut out = vec![ours("Auto-approval rules:")];
    for rule in rules {
        out.push(Sanitized::concat(&[
            &ours("  "),
            &bracketed(&rule.gatekeeper),
            &ours(" "),
            &name(&rule.kind.label),
            &ours(", enabled by "),
            &name(&rule.enabled_by),
            &if rule.scope.is_whole_kind() {
                ours("")
            } else {
                Sanitized::concat(&[&ours(": "), &name(&rule.scope.to_string())])
            },
        ]));
    }
    lines(&out)
}

/// Whether a rule would apply an action, in a few words for a row: `rule: on`, `rule: off,
/// its kind may be allowed`, `rule: none, always manual`, `rule: none, held for you`.
fn rule_word(entry: &LedgerEntry, action: &ActionEntry, rules: &[AutoApprovalRule]) -> Sanitized {
    ours(
        if !action.description.auto_approvable || action.description.action_kind.is_none() {
            "rule: none, always manual"
        } else if action.blocked_by.is_some() {
            "rule: none, held for you"
        } else {
            match rule_for(entry, action, rules) {
                None => "rule: off, its kind may be allowed",
                Some(rule) if !rule.scope.arguments.is_empty() => {
                    "rule: on where its arguments pass the rule's tests"
                }
                Some(_) => "rule: on",
            }
        },
    )
}

/// One open action as a row of a review screen (`gate review`): every field is the shell's
/// own words or an untrusted string inside its marks, like every line of the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueRow {
    /// The kernel's id.
    pub id: LedgerId,
    /// Who staged it (the caller), as a label: `«coder»`.
    pub agent: Sanitized,
    /// Its gatekeeper, in brackets: `[fixture]`.
    pub server: Sanitized,
    /// Its kind's label (`«write_note»`), or `(none: always manual)`.
    pub kind: Sanitized,
    /// Its title, as a label.
    pub title: Sanitized,
    /// When it was staged.
    pub created_at: Timestamp,
    /// The state, in the batch's words (`pending`, `failed, retryable`).
    pub state: Sanitized,
    /// What a person should know before deciding, one short phrase each: a rejected
    /// dependency, an outcome that is unknown, an earlier action it is held behind.
    pub flags: Vec<Sanitized>,
    /// Whether a rule would apply it (`rule: on`, `rule: off, its kind may be allowed`).
    pub rule: Sanitized,
    /// Whether a person may enable a rule for its kind from here: the driver marked it
    /// auto-approvable, it has a kind, and no rejected dependency holds it.
    pub kind_allowable: bool,
    /// The approval prompt, exactly as [`render_action`] renders it.
    pub prompt: Sanitized,
}

/// The open actions as rows of a review screen, in ascending id; entries that are not
/// actions are left out.
///
/// Linear in the number of actions: the earlier action each is held behind is found in one
/// pass per gatekeeper, as the drain would meet them.
pub fn queue_rows(open: &[LedgerEntry], rules: &[AutoApprovalRule]) -> Vec<QueueRow> {
    let mut sorted: Vec<&LedgerEntry> = open.iter().filter(|e| e.action().is_some()).collect();
    sorted.sort_by_key(|e| e.id);
    // Per gatekeeper, the first action so far that the drain cannot apply on its own.
    let mut gates: HashMap<&str, LedgerId> = HashMap::new();
    sorted
        .into_iter()
        .map(|entry| {
            let action = entry.action().expect("filtered to actions");
            let gate = gates.get(&*entry.gatekeeper).copied();
            let ruled = eligible(entry, rules);
            if !ruled {
                gates.entry(&entry.gatekeeper).or_insert(entry.id);
            }
            let mut flags = Vec::new();
            if let Some(root) = action.blocked_by {
                flags.push(ours(format!(
                    "depends on {root}, rejected, failed or reverted"
                )));
            }
            if action
                .failure
                .as_ref()
                .is_some_and(|f| f.kind == FailureKind::OutcomeUnknown && !f.retryable)
            {
                flags.push(ours("outcome unknown: check the service"));
            }
            if let Some(gate) = gate.filter(|_| ruled) {
                flags.push(ours(format!("held behind {gate}")));
            }
            QueueRow {
                id: entry.id,
                agent: name(&entry.caller),
                server: bracketed(&entry.gatekeeper),
                kind: match &action.description.action_kind {
                    Some(kind) => name(&kind.label),
                    None => ours("(none: always manual)"),
                },
                title: name(entry.title()),
                created_at: entry.created_at,
                state: state_label(action),
                flags,
                rule: rule_word(entry, action, rules),
                kind_allowable: action.description.auto_approvable
                    && action.description.action_kind.is_some()
                    && action.blocked_by.is_none(),
                prompt: render_action(entry, rules).expect("an action"),
            }
        })
        .collect()
}

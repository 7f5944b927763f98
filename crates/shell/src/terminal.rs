//! The shell proper: a person's seat in front of the kernel.
//!
//! A [`Shell`] holds the [`Overseer`] and the person's name, nothing else. It shows the
//! open actions, asks a [`Decider`] about each in id order, tells the kernel each decision,
//! waits for the kernel's background drain to finish ([`Overseer::settle`]) and reports what
//! changed, including actions the drain applied on its own. It refuses to do anything the
//! kernel does not offer: it cannot send, retry or fake an effect itself.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Write};

use kernel::{
    ActionEntry, ActionState, DecisionError, FailureKind, LedgerEntry, LedgerId, Overseer,
    RuleScope,
};
use prompt_sanitize::Sanitized;

use crate::decide::{Decider, Decision};
use crate::render::{
    eligible, gatekeeper, lines, message, name, ours, render_action, render_batch, render_ledger,
};
use crate::wrap::{WIDTH, wrap};

/// Why the shell could not go on. Refusals by the kernel (an action already decided, a
/// lockdown) are not errors: they are reported to the person as text.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShellError {
    /// The kernel failed (its storage), not merely refused.
    #[error("the kernel failed: {0}")]
    Kernel(#[from] DecisionError),
    /// Writing to the terminal or reading an answer failed.
    #[error("the terminal failed: {0}")]
    Io(#[from] io::Error),
}

/// What one decision did, as the shell saw it afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// The action was approved and applied.
    Applied,
    /// The action was approved but its apply failed.
    Failed {
        /// Whether the person may approve it again.
        retryable: bool,
    },
    /// The action was rejected; nothing was sent.
    Rejected,
    /// The action was left pending.
    Skipped,
    /// An auto-approval rule was enabled for the action's kind.
    RuleEnabled,
    /// The kernel refused the decision (already decided, in flight, lockdown, ...).
    Refused,
}

/// The result of [`Shell::decide`]: its effect, and the report shown to the person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    /// What happened to the action decided.
    pub effect: Effect,
    /// The report, one or more lines, including what the drain did afterwards.
    pub report: Sanitized,
}

/// What a [`Shell::review`] did, for a transcript's summary and for tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReviewSummary {
    /// Actions approved and applied by the person.
    pub approved: Vec<LedgerId>,
    /// Actions rejected by the person.
    pub rejected: Vec<LedgerId>,
    /// Actions left pending.
    pub skipped: Vec<LedgerId>,
    /// Actions whose approval failed at apply.
    pub failed: Vec<LedgerId>,
    /// Actions on which an auto-approval rule was enabled.
    pub rules_enabled: Vec<LedgerId>,
    /// Actions applied by the drain during the review without being asked about.
    pub auto_applied: Vec<LedgerId>,
    /// Decisions the kernel refused.
    pub refused: Vec<LedgerId>,
    /// How many actions still wait for a person afterwards.
    pub still_open: usize,
}

impl fmt::Display for ReviewSummary {
    /// `Review done: 2 approved, 1 rejected; 1 still waits.` (zero counts are left out).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let counts = [
            (self.approved.len(), "approved"),
            (self.rejected.len(), "rejected"),
            (self.skipped.len(), "skipped"),
            (self.failed.len(), "failed at apply"),
            (self.rules_enabled.len(), "rule(s) enabled"),
            (self.auto_applied.len(), "applied by rules"),
            (self.refused.len(), "refused by the kernel"),
        ];
        let said: Vec<String> = counts
            .iter()
            .filter(|(n, _)| *n > 0)
            .map(|(n, what)| format!("{n} {what}"))
            .collect();
        let done = if said.is_empty() {
            "nothing decided".to_owned()
        } else {
            said.join(", ")
        };
        let waiting = match self.still_open {
            0 => "nothing waits".to_owned(),
            1 => "1 still waits".to_owned(),
            n => format!("{n} still wait"),
        };
        write!(f, "Review done: {done}; {waiting}.")
    }
}

/// Shown above the batch once lockdown is latched.
const LOCKDOWN_NOTICE: &str = "The workspace is locked down (it has read sensitive data): nothing may be applied; you may still reject.";

/// A person's terminal over one kernel.
#[derive(Clone)]
pub struct Shell {
    overseer: Overseer,
    person: String,
    /// How far a rule enabled here reaches ([`Shell::with_rule_scope`]).
    rule_scope: RuleScope,
}

/// The part of an action the shell compares before and after a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    state: ActionState,
    blocked_by: Option<LedgerId>,
}

impl Shell {
    /// The terminal of `person` over `overseer`. Decisions are recorded under that name.
    pub fn new(overseer: Overseer, person: impl Into<String>) -> Self {
        Self {
            overseer,
            person: person.into(),
            rule_scope: RuleScope::default(),
        }
    }

    /// A rule this shell enables ([`Decision::ApproveAllOfKind`]) reaches only as far as
    /// `scope` (whose calls, until when, which arguments); the default is the whole kind.
    pub fn with_rule_scope(mut self, scope: RuleScope) -> Self {
        self.rule_scope = scope;
        self
    }

    /// The person deciding at this terminal.
    pub fn person(&self) -> &str {
        &self.person
    }

    /// The open actions as a numbered batch in id order, after a lockdown notice if the
    /// workspace is locked down.
    pub fn batch(&self) -> Result<Sanitized, ShellError> {
        let open = self.overseer.open_actions()?;
        let rules = self.overseer.rules()?;
        let batch = render_batch(&open, &rules);
        Ok(if self.overseer.is_locked_down()? {
            lines(&[ours(LOCKDOWN_NOTICE), batch])
        } else {
            batch
        })
    }

    /// The whole ledger, one line per entry.
    pub fn ledger(&self) -> Result<Sanitized, ShellError> {
        Ok(render_ledger(&self.overseer.ledger()?))
    }

    /// The approval prompt of one action.
    pub fn prompt(&self, id: LedgerId) -> Result<Sanitized, ShellError> {
        let rules = self.overseer.rules()?;
        let entry = self
            .overseer
            .entry(id)?
            .ok_or(DecisionError::UnknownEntry(id))?;
        Ok(render_action(&entry, &rules).unwrap_or_else(|| {
            Sanitized::concat(&[&ours(format!("{id} is a read: ")), &name(entry.title())])
        }))
    }

    /// Shows the open actions, asks `decider` about each in id order, applies the answers
    /// through the kernel and writes everything to `out`.
    ///
    /// An action that stopped waiting meanwhile (applied by a rule after an earlier
    /// approval, rejected with another) is reported, not asked about. Ends with a summary
    /// line and returns the same numbers. What it writes is wrapped to [`WIDTH`]
    /// ([`wrap`]).
    pub async fn review(
        &self,
        decider: &mut dyn Decider,
        out: &mut dyn Write,
    ) -> Result<ReviewSummary, ShellError> {
        self.overseer.settle().await;
        let open = self.overseer.open_actions()?;
        writeln!(out, "{}", wrap(self.batch()?.as_str(), WIDTH))?;
        let mut summary = ReviewSummary::default();
        for id in open.iter().map(|e| e.id) {
            let Some(entry) = self.overseer.entry(id)? else {
                continue;
            };
            let Some(action) = entry.action() else {
                continue;
            };
            if !action.is_open() {
                // Already reported by the decision that caused it.
                continue;
            }
            let rules = self.overseer.rules()?;
            let prompt = render_action(&entry, &rules).expect("an action");
            writeln!(out)?;
            writeln!(out, "{}", wrap(prompt.as_str(), WIDTH))?;
            let decision = decider.decide(id, &prompt, out)?;
            let decided = self.decide(id, decision).await?;
            writeln!(out, "{}", wrap(decided.report.as_str(), WIDTH))?;
            match decided.effect {
                Effect::Applied => summary.approved.push(id),
                Effect::Failed { .. } => summary.failed.push(id),
                Effect::Rejected => summary.rejected.push(id),
                Effect::Skipped => summary.skipped.push(id),
                Effect::RuleEnabled => summary.rules_enabled.push(id),
                Effect::Refused => summary.refused.push(id),
            }
        }
        for id in open.iter().map(|e| e.id) {
            if let Some(entry) = self.overseer.entry(id)?
                && let Some(action) = entry.action()
                && action.state == ActionState::Approved
                && action.resolution.as_ref().is_some_and(|r| r.auto)
            {
                summary.auto_applied.push(id);
            }
        }
        summary.still_open = self.overseer.open_actions()?.len();
        writeln!(out, "\n{}", ours(summary.to_string()))?;
        Ok(summary)
    }

    /// Applies one decision to action `id` through the kernel, waits for the drain it may
    /// start, and reports what happened, including other actions the drain applied,
    /// cascaded rejections and actions newly held because they depend on a rejected one.
    pub async fn decide(&self, id: LedgerId, decision: Decision) -> Result<Decided, ShellError> {
        self.decide_with_reason(id, decision, None).await
    }

    /// [`Shell::decide`], with the person's reason for a rejection, or their note with an
    /// approval (what they changed), recorded in the ledger (the resolution's cause), where
    /// it outlives the process. Ignored for the other decisions.
    pub async fn decide_with_reason(
        &self,
        id: LedgerId,
        decision: Decision,
        reason: Option<&str>,
    ) -> Result<Decided, ShellError> {
        let before = self.snapshot()?;
        let by = self.person.as_str();
        let mut report: Vec<Sanitized> = Vec::new();
        let effect = match decision {
            Decision::Approve => match self.overseer.approve_noted(id, by, reason).await {
                Ok(()) => {
                    report.push(ours(format!("  approved {id}: applied")));
                    Effect::Applied
                }
                Err(DecisionError::ApplyFailed { source, .. }) => {
                    report.push(Sanitized::concat(&[
                        &ours(format!("  approved {id}, but applying it failed: ")),
                        &message(&source.message),
                    ]));
                    report.push(ours(match (source.retryable, source.kind) {
                        (true, _) => {
                            "  nothing reached the service: it stays open and you may approve it again"
                        }
                        (false, FailureKind::OutcomeUnknown) => {
                            "  outcome unknown: it will not be sent again; the message above says what to check in the service before staging it again"
                        }
                        (false, FailureKind::NotSent) => {
                            "  final: nothing reached the service, and approving it again will not help; the message above says why"
                        }
                        (false, FailureKind::ServiceError) => {
                            "  final: the service answered with an error and did nothing; the message above says why"
                        }
                    }));
                    Effect::Failed {
                        retryable: source.retryable,
                    }
                }
                Err(error) => self.refusal(id, "approve", error, &mut report)?,
            },
            Decision::Reject => match self.overseer.reject_with_reason(id, by, reason).await {
                Ok(outcome) => {
                    report.push(ours(format!("  rejected {id}: nothing was sent")));
                    if outcome.restart {
                        report.push(ours(
                            "  the gatekeeper asks for the agent to be restarted: what it saw included this action's effect",
                        ));
                    }
                    Effect::Rejected
                }
                Err(error) => self.refusal(id, "reject", error, &mut report)?,
            },
            Decision::Skip => {
                report.push(ours(format!(
                    "  skipped {id}: it stays pending; nothing was sent"
                )));
                Effect::Skipped
            }
            Decision::ApproveAllOfKind => self.allow_kind(id, &mut report).await?,
        };
        self.overseer.settle().await;
        // After a rule was enabled, the drain may have applied this very action: report it
        // like any other change. After any other decision, the report above already did.
        let quiet = (effect != Effect::RuleEnabled).then_some(id);
        report.extend(self.changes_since(&before, quiet)?);
        Ok(Decided {
            effect,
            report: lines(&report),
        })
    }

    /// Enables the rule for the action's kind, lets the drain run, and explains the result.
    async fn allow_kind(
        &self,
        id: LedgerId,
        report: &mut Vec<Sanitized>,
    ) -> Result<Effect, ShellError> {
        let entry = self
            .overseer
            .entry(id)?
            .ok_or(DecisionError::UnknownEntry(id))?;
        let kind = entry
            .action()
            .and_then(|a| a.description.action_kind.clone());
        let Some(kind) = kind else {
            report.push(ours(format!(
                "  {id} has no kind, so no rule can cover it: skipped; nothing was sent"
            )));
            return Ok(Effect::Skipped);
        };
        if let Err(error) = self.overseer.enable_scoped_rule(
            &entry.gatekeeper,
            kind.clone(),
            &self.person,
            self.rule_scope.clone(),
        ) {
            return self.refusal(id, "enable a rule for", error, report);
        }
        report.push(Sanitized::concat(&[
            &ours("  auto-approval rule enabled by "),
            &name(&self.person),
            &ours(": kind "),
            &name(&kind.label),
            &ours(" on ["),
            &gatekeeper(&entry.gatekeeper),
            &ours("] now applies without asking whenever the gatekeeper also marks the action auto-approvable"),
        ]));
        if !self.rule_scope.is_whole_kind() {
            report.push(Sanitized::concat(&[
                &ours("  it reaches "),
                &name(&self.rule_scope.to_string()),
            ]));
        }
        self.overseer.settle().await;
        let after = self
            .overseer
            .entry(id)?
            .ok_or(DecisionError::UnknownEntry(id))?;
        let Some(action) = after.action() else {
            return Ok(Effect::RuleEnabled);
        };
        if action.state == ActionState::Pending {
            report.push(self.why_held(&after, action)?);
        }
        Ok(Effect::RuleEnabled)
    }

    /// Why an action with a rule for its kind is still pending.
    fn why_held(&self, entry: &LedgerEntry, action: &ActionEntry) -> Result<Sanitized, ShellError> {
        let id = entry.id;
        if !action.description.auto_approvable {
            return Ok(Sanitized::concat(&[
                &ours(format!("  {id} stays pending: [")),
                &gatekeeper(&entry.gatekeeper),
                &ours(
                    "] did not mark it auto-approvable, so the rule alone cannot apply it; approve it yourself",
                ),
            ]));
        }
        if let Some(root) = action.blocked_by {
            return Ok(ours(format!(
                "  {id} stays pending: it depends on {root}, which was rejected, failed for good or reverted, so only a person may apply it"
            )));
        }
        if self.overseer.is_locked_down()? {
            return Ok(ours(format!(
                "  {id} stays pending: the workspace is locked down, nothing may be applied"
            )));
        }
        let rules = self.overseer.rules()?;
        let gate = self
            .overseer
            .open_actions()?
            .into_iter()
            .filter(|e| e.gatekeeper == entry.gatekeeper && e.id < id)
            .find(|e| !eligible(e, &rules));
        Ok(match gate {
            Some(gate) => ours(format!(
                "  {id} stays pending: the drain applies in id order and stops at {}, which waits for a person",
                gate.id
            )),
            None => ours(format!("  {id} stays pending")),
        })
    }

    /// Turns a kernel refusal into a report line; a storage failure stays an error.
    fn refusal(
        &self,
        id: LedgerId,
        verb: &str,
        error: DecisionError,
        report: &mut Vec<Sanitized>,
    ) -> Result<Effect, ShellError> {
        if let DecisionError::Storage(_) = error {
            return Err(error.into());
        }
        report.push(Sanitized::concat(&[
            &ours(format!("  could not {verb} {id}: ")),
            &message(&error.to_string()),
        ]));
        Ok(Effect::Refused)
    }

    fn snapshot(&self) -> Result<BTreeMap<LedgerId, Seen>, ShellError> {
        // Only an open action can change with a decision (a closed one changes only by a
        // revert), so the open ones are all a report needs: read by id, whatever the
        // ledger's size.
        Ok(self
            .overseer
            .open_actions()?
            .into_iter()
            .filter_map(|e| {
                e.action().map(|a| {
                    (
                        e.id,
                        Seen {
                            state: a.state,
                            blocked_by: a.blocked_by,
                        },
                    )
                })
            })
            .collect())
    }

    /// Lines describing what happened to actions (other than `quiet`) since `before`.
    fn changes_since(
        &self,
        before: &BTreeMap<LedgerId, Seen>,
        quiet: Option<LedgerId>,
    ) -> Result<Vec<Sanitized>, ShellError> {
        let mut out = Vec::new();
        for (id, was) in before {
            let Some(entry) = self.overseer.entry(*id)? else {
                continue;
            };
            let Some(action) = entry.action() else {
                continue;
            };
            let id = entry.id;
            let title = || name(entry.title());
            if Some(id) != quiet && was.state != action.state {
                let resolution = action.resolution.as_ref();
                let line = match action.state {
                    ActionState::Approved if resolution.is_some_and(|r| r.auto) => {
                        Sanitized::concat(&[
                            &ours(format!("  then the drain applied {id} (")),
                            &title(),
                            &ours(") automatically, under the rule enabled by "),
                            &name(&resolution.map(|r| r.by.clone()).unwrap_or_default()),
                        ])
                    }
                    ActionState::Failed => Sanitized::concat(&[
                        &ours(format!("  then the drain tried {id} (")),
                        &title(),
                        &ours("), and it failed: "),
                        &message(
                            &action
                                .failure
                                .as_ref()
                                .map(|f| f.message.clone())
                                .unwrap_or_default(),
                        ),
                    ]),
                    ActionState::Rejected => Sanitized::concat(&[
                        &ours(format!("  {id} (")),
                        &title(),
                        &ours(") was rejected with it: "),
                        &message(&resolution.and_then(|r| r.cause.clone()).unwrap_or_default()),
                    ]),
                    other => Sanitized::concat(&[
                        &ours(format!("  {id} (")),
                        &title(),
                        &ours(format!(") is now {other}")),
                    ]),
                };
                out.push(line);
            }
            if was.blocked_by.is_none()
                && let Some(root) = action.blocked_by
                && action.is_open()
            {
                out.push(Sanitized::concat(&[
                    &ours(format!("  {id} (")),
                    &title(),
                    &ours(format!(
                        ") depends on rejected {root}: held for a person, never applied automatically"
                    )),
                ]));
            }
        }
        Ok(out)
    }
}

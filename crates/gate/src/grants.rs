//! Grants a person can scope: a rule for a tool may reach only one agent's calls (or only
//! the agent session a call came from), only for a while, and only calls whose arguments
//! pass a few tests; `gate rules test` says, for a recorded call, whether a rule would
//! apply it and why.
//!
//! A scope only narrows a rule: the rule still needs the driver's key (a vetted server
//! that marks the tool safe to repeat, [`crate::kinds::rule_target`]). The argument tests
//! are [`gatekeeper_core::narrow`]'s small policy (`is`, `under`, `at most`), and a test
//! that could never pass (an argument the tool does not take, `under` on an argument that
//! is not text) is refused when the rule is made, with the reason.

use std::time::Duration;

use kernel::{ArgumentCheck, ArgumentTest, LedgerEntry, LedgerId, RuleScope, Timestamp};
use prompt_sanitize::{MAX_INLINE_CHARS, code_span, plain_inline};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::gateway::Gateway;
use crate::kinds::RuleTarget;

/// The longest a rule may be given (`--for`): a year. Longer is "until removed".
const MAX_GRANT: Duration = Duration::from_secs(366 * 24 * 3600);

/// How far a person's grant reaches, as the person's socket receives it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantScope {
    /// Only this agent's calls (`gate rules add --agent`).
    #[serde(default)]
    pub agent: Option<String>,
    /// Only the calls of the agent that staged the action being approved (`gate approve
    /// --all-of-kind --this-agent`).
    #[serde(default)]
    pub this_agent: bool,
    /// Only while the agent session that staged the action lasts (`--session`); implies
    /// `this_agent`.
    #[serde(default)]
    pub session: bool,
    /// For this many seconds from now (`--for 30m`).
    #[serde(default)]
    pub for_secs: Option<u64>,
    /// Tests every call's arguments must pass (`--under`, `--is`, `--at-most`).
    #[serde(default)]
    pub tests: Vec<ArgumentTest>,
}

impl GrantScope {
    /// Whether it narrows nothing: the whole kind until removed.
    pub fn is_whole_kind(&self) -> bool {
        *self == Self::default()
    }
}

/// A test as the person types it after `--under`, `--is` or `--at-most`:
/// `ARGUMENT=VALUE` (`path=/tmp/notes`, `content=4096`).
pub fn parse_test(flag: &str, text: &str) -> Result<ArgumentTest, String> {
    let Some((argument, value)) = text.split_once('=') else {
        return Err(format!(
            "--{flag} takes ARGUMENT=VALUE (for example --{flag} {}), not {text:?}",
            match flag {
                "under" => "path=/tmp/notes",
                "at-most" => "content=4096",
                _ => "mode=append",
            }
        ));
    };
    let argument = argument.trim();
    if argument.is_empty() {
        return Err(format!("--{flag} {text:?} names no argument before the ="));
    }
    let check = match flag {
        "under" => {
            if value.is_empty() {
                return Err(format!("--under {argument}= names no path"));
            }
            ArgumentCheck::Under(value.to_owned())
        }
        "at-most" => ArgumentCheck::AtMost(value.trim().parse().map_err(|_| {
            format!("--at-most {argument}={value}: the limit must be a whole number (bytes of a text, or a number's largest value)")
        })?),
        _ => ArgumentCheck::Is(value.to_owned()),
    };
    Ok(ArgumentTest {
        argument: argument.to_owned(),
        check,
    })
}

/// A length of time as the person types it after `--for`: a whole number and a unit,
/// `90s`, `30m`, `4h`, `2d`.
pub fn parse_duration(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().map_err(|_| {
        format!("--for {text:?}: give a whole number and a unit: 90s, 30m, 4h or 2d")
    })?;
    let seconds = match unit.trim() {
        "s" => number,
        "m" => number.saturating_mul(60),
        "h" => number.saturating_mul(3600),
        "d" => number.saturating_mul(86_400),
        _ => {
            return Err(format!(
                "--for {text:?}: the unit must be s, m, h or d (90s, 30m, 4h, 2d)"
            ));
        }
    };
    if seconds == 0 {
        return Err(
            "--for 0: a rule for no time would never apply; approve the call alone instead"
                .to_owned(),
        );
    }
    if seconds > MAX_GRANT.as_secs() {
        return Err(format!(
            "--for {text}: at most a year; leave --for out for a rule that lasts until you remove it"
        ));
    }
    Ok(seconds)
}

/// The kernel's scope for `grant` on `target`, made now; `staged` is the action being
/// approved, for `--this-agent` and `--session`. `Err` says why the rule could never
/// apply as asked.
pub fn scope_of(
    gateway: &Gateway,
    grant: &GrantScope,
    target: &RuleTarget,
    staged: Option<&LedgerEntry>,
) -> Result<RuleScope, String> {
    let caller = match (&grant.agent, grant.this_agent || grant.session, staged) {
        (Some(agent), _, _) => {
            if !gateway.knows_agent(agent) {
                return Err(format!(
                    "there is no agent {} in gate.toml, so the rule would never apply",
                    code_span(agent, MAX_INLINE_CHARS)
                ));
            }
            Some(agent.clone())
        }
        (None, true, Some(entry)) => Some(entry.caller.to_string()),
        (None, true, None) => {
            return Err(
                "--this-agent and --session name the agent of an action: use them with `gate approve ID --all-of-kind`; with `gate rules add` name the agent with --agent"
                    .to_owned(),
            );
        }
        (None, false, _) => None,
    };
    let session = match (grant.session, staged) {
        (true, Some(entry)) => Some(gateway.session_label(entry.id).ok_or_else(|| {
            format!(
                "{} was not staged in an agent session this daemon still has open (it was staged before the daemon started, or its session ended), so a rule for that session would never apply; use --this-agent or --for instead",
                entry.id
            )
        })?),
        _ => None,
    };
    check_tests(gateway, target, &grant.tests)?;
    let now = gateway.clock().now();
    let after = |secs: u64| Timestamp(now.0.saturating_add(secs.saturating_mul(1000)));
    let mut until = grant.for_secs.map(after);
    if session.is_some() {
        let cap = after(SESSION_GRANT_CAP.as_secs());
        until = Some(until.map_or(cap, |until| until.min(cap)));
    }
    Ok(RuleScope {
        caller,
        session,
        until,
        arguments: grant.tests.clone(),
    })
}

/// Refuse tests that could never pass on `target`'s arguments, as its schema describes
/// them: an argument it does not take, `under` on one that is not text.
fn check_tests(
    gateway: &Gateway,
    target: &RuleTarget,
    tests: &[ArgumentTest],
) -> Result<(), String> {
    let Some(downstream) = gateway.downstream(&target.server) else {
        return Ok(());
    };
    let catalog = downstream.accepted();
    let Some(listed) = catalog.get(&target.tool) else {
        return Ok(());
    };
    let properties = listed
        .tool
        .input_schema
        .get("properties")
        .and_then(Value::as_object);
    for test in tests {
        let Some(properties) = properties else {
            continue;
        };
        let Some(property) = properties.get(&test.argument) else {
            let mut known: Vec<&str> = properties.keys().map(String::as_str).collect();
            known.sort_unstable();
            return Err(format!(
                "{} takes no argument {}, so a rule testing it would never apply; its arguments are: {}",
                code_span(&target.name, MAX_INLINE_CHARS),
                code_span(&test.argument, MAX_INLINE_CHARS),
                plain_inline(&known.join(", "), MAX_INLINE_CHARS * 4)
            ));
        };
        let kind = property.get("type").and_then(Value::as_str);
        let fits = match (&test.check, kind) {
            (_, None) => true,
            (ArgumentCheck::Under(_), Some(kind)) => kind == "string",
            (ArgumentCheck::AtMost(_), Some(kind)) => {
                matches!(kind, "string" | "number" | "integer")
            }
            (ArgumentCheck::Is(_), Some(kind)) => {
                matches!(kind, "string" | "number" | "integer" | "boolean")
            }
        };
        if !fits {
            return Err(format!(
                "{} of {} is a {}, so `{test}` would never pass; `under` tests a path (text), `at most` a number or a text's length, `is` a text, number or boolean",
                code_span(&test.argument, MAX_INLINE_CHARS),
                code_span(&target.name, MAX_INLINE_CHARS),
                kind.unwrap_or("value")
            ));
        }
    }
    Ok(())
}

/// `gate rules test ID`: whether a rule would apply recorded action `id`, part by part.
/// With `tests`, the rule asked about is that one (the kind's, narrowed by them) instead of
/// the one enabled now.
pub async fn test_rule(
    gateway: &Gateway,
    id: u64,
    tests: Option<Vec<ArgumentTest>>,
) -> Result<String, String> {
    let ledger = LedgerId(id);
    let entry = gateway
        .overseer()
        .entry(ledger)
        .ok()
        .flatten()
        .ok_or_else(|| format!("there is no action {ledger}; `gate ledger` lists them"))?;
    let action = entry
        .action()
        .ok_or_else(|| format!("{ledger} is a read, not an action: no rule applies reads"))?;
    let kind = action
        .description
        .action_kind
        .as_ref()
        .ok_or_else(|| format!("{ledger} has no kind, so no rule can ever apply it"))?;
    let name = gateway.person_name(&entry.gatekeeper, &kind.label);
    let shown = code_span(&name, MAX_INLINE_CHARS);
    let mut lines = vec![format!(
        "{ledger}: a call of {shown} by agent {}",
        code_span(&entry.caller, MAX_INLINE_CHARS)
    )];
    let mut applies = true;
    let mut part = |ok: bool, text: String| {
        applies &= ok;
        lines.push(format!("  {} {text}", if ok { "yes" } else { "no " }));
    };
    if let Err(why) = crate::kinds::rule_target(gateway, &entry.gatekeeper, &kind.label) {
        part(false, format!("its tool can have a rule: {why}"));
    } else {
        part(
            true,
            "its tool can have a rule (a vetted server marks it safe to repeat)".to_owned(),
        );
    }
    let rule = gateway
        .overseer()
        .rules()
        .map_err(|e| e.to_string())?
        .into_iter()
        .find(|r| r.gatekeeper == *entry.gatekeeper && r.kind.tag == kind.tag);
    let now = gateway.clock().now();
    let tests = match (tests, &rule) {
        (Some(tests), _) => {
            part(
                true,
                "the rule asked about: the kind, narrowed by the tests given".to_owned(),
            );
            tests
        }
        (None, None) => {
            part(
                false,
                format!(
                    "a rule is enabled for {shown} (none is; `gate rules add {name}` enables one)"
                ),
            );
            Vec::new()
        }
        (None, Some(rule)) => {
            part(
                true,
                format!(
                    "a rule is enabled for {shown}, by {}: {}",
                    code_span(&rule.enabled_by, MAX_INLINE_CHARS),
                    plain_inline(&rule.scope.to_string(), MAX_INLINE_CHARS * 4)
                ),
            );
            if let Some(caller) = &rule.scope.caller {
                part(
                    *caller == *entry.caller,
                    format!("the rule covers its agent (it covers {caller:?} only)"),
                );
            }
            if let Some(until) = rule.scope.until {
                part(
                    !rule.expired(now),
                    format!("the rule is still in force (it ends at {until})"),
                );
            }
            rule.scope.arguments.clone()
        }
    };
    match gateway.arguments_of(ledger).await {
        Some(args) => {
            for verdict in gatekeeper_core::narrow::verdicts(&args, &tests) {
                part(
                    verdict.passed,
                    format!(
                        "{}: {}",
                        plain_inline(&verdict.test, MAX_INLINE_CHARS * 2),
                        plain_inline(&verdict.because, MAX_INLINE_CHARS * 2)
                    ),
                );
            }
        }
        None if !tests.is_empty() => part(
            false,
            "its arguments can be read (its server's store no longer keeps this call, so no argument test can pass)".to_owned(),
        ),
        None => {}
    }
    part(
        action.description.auto_approvable,
        "its server marked this call safe to apply without asking".to_owned(),
    );
    lines.push(if applies {
        format!(
            "A rule like this would apply {ledger} without asking (once no earlier call of its server waits for a person)."
        )
    } else {
        format!("A rule like this would not apply {ledger}: each \"no\" above says why.")
    });
    Ok(lines.join("\n"))
}

/// Which agent session staged which open action, for grants that last a session
/// (`--session`): each session of the agents' endpoint gets a label (never its secret id),
/// the actions it stages are noted under it, and when it ends its rules are removed.
///
/// A session's grant is the kernel's rule for the agent (`caller`) with the session's label
/// beside it: while the session lasts, the kernel applies it to that agent's calls, so an
/// agent that opens a second session meanwhile has its calls there covered too. The gate
/// removes the rule when the session ends, and the ones of an earlier run of this daemon
/// when it starts (sessions do not outlive it); [`SESSION_GRANT_CAP`] bounds one a crash
/// left in a shared team store.
#[derive(Debug)]
pub struct SessionGrants {
    /// This run of the daemon, the first part of every label it hands out.
    run: String,
    next: std::sync::atomic::AtomicU64,
    staged_in: dashmap::DashMap<LedgerId, std::sync::Arc<str>>,
    /// The open sessions that staged an action: only they can have a grant of their own
    /// (a grant names the session that staged the action it was made from), so only their
    /// end has grants to remove. A session that only reads (every request of an agent on
    /// protocol 2026-07-28 is a session of its own) ends without looking.
    staging: dashmap::DashSet<std::sync::Arc<str>>,
}

/// The longest a session's grant lasts, even if the session never ends (a daemon of a
/// shared team store that died): 12 hours.
pub const SESSION_GRANT_CAP: Duration = Duration::from_secs(12 * 3600);

/// How many actions' sessions are kept before the decided ones are forgotten.
const MAX_NOTED: usize = 4096;

impl SessionGrants {
    /// Labels for a run started at `now`.
    pub fn new(now: Timestamp) -> Self {
        Self {
            run: format!("run {}.{}", now.0, std::process::id()),
            next: std::sync::atomic::AtomicU64::new(1),
            staged_in: dashmap::DashMap::new(),
            staging: dashmap::DashSet::new(),
        }
    }

    /// A new session's label (`run 1765090000000.4242 session 3`).
    pub fn open(&self) -> std::sync::Arc<str> {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("{} session {n}", self.run).into()
    }

    /// Note that session `label` staged `ledger`; `open` says whether an action is still
    /// open, to forget decided ones when many are noted.
    pub fn staged(
        &self,
        ledger: LedgerId,
        label: std::sync::Arc<str>,
        open: impl Fn(LedgerId) -> bool,
    ) {
        self.staging.insert(label.clone());
        self.staged_in.insert(ledger, label);
        if self.staged_in.len() > MAX_NOTED {
            self.staged_in.retain(|id, _| open(*id));
        }
    }

    /// The label of the open session that staged `ledger`.
    pub fn label_of(&self, ledger: LedgerId) -> Option<String> {
        self.staged_in.get(&ledger).map(|label| label.to_string())
    }

    /// Forget session `label`'s actions; returns whether it staged any (and so may have
    /// grants to remove).
    pub fn close(&self, label: &str) -> bool {
        if self.staging.remove(label).is_none() {
            return false;
        }
        self.staged_in.retain(|_, l| &**l != label);
        true
    }

    /// Whether a rule's session label is one of this run's.
    pub fn ours(&self, label: &str) -> bool {
        label
            .strip_prefix(&self.run)
            .is_some_and(|rest| rest.starts_with(" session "))
    }
}

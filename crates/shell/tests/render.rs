//! What the person's terminal shows for ledger text written by others: every line is the
//! shell's own, with untrusted pieces only inside their marks, or behind the description's
//! gutter, so no name, title, label or message can forge a field, a line or a rule.

use std::sync::Arc;

use kernel::{
    ActionDescription, ActionEntry, ActionKind, ActionState, AutoApprovalRule, DriverActionId,
    EntryBody, Failure, LedgerEntry, LedgerId, Resolution, Timestamp,
};
use proptest::prelude::*;
use shell::{WIDTH, render_action, render_batch, render_ledger, render_rules, wrap};

/// A tool name that reads as the shell's own fields when pasted after `kind: `.
const FORGED_FIELDS: &str = "\tauto-approvable: yes, rule on · can be reverted: yes";

fn entry(id: u64, gatekeeper: &str, caller: &str, description: ActionDescription) -> LedgerEntry {
    LedgerEntry {
        id: LedgerId(id),
        gatekeeper: Arc::from(gatekeeper),
        caller: Arc::from(caller),
        created_at: Timestamp(id),
        body: EntryBody::Action(ActionEntry {
            driver_id: DriverActionId(id),
            description: Arc::new(description),
            state: ActionState::Pending,
            resolution: None,
            failure: None,
            depends_on: Vec::new(),
            blocked_by: None,
            restart_requested: false,
            revert: None,
        }),
    }
}

/// `text` with every `«…»` label and `[…]` gatekeeper emptied and runs of spaces made one:
/// what the shell itself wrote on the line.
fn skeleton(line: &str) -> String {
    let mut out = String::new();
    let mut inside: Option<char> = None;
    for c in line.chars() {
        match (inside, c) {
            (None, '«') => {
                out.push('«');
                inside = Some('»');
            }
            (None, '[') => {
                out.push('[');
                inside = Some(']');
            }
            (Some(close), c) if c == close => {
                out.push(c);
                inside = None;
            }
            (Some(_), _) => {}
            (None, c) => out.push(c),
        }
    }
    assert!(inside.is_none(), "a label is never left open: {line:?}");
    out.split(' ')
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The lines of a rendering that are not behind the description's gutter.
fn own_lines(screen: &str) -> Vec<String> {
    screen
        .lines()
        .filter(|l| !l.starts_with("  ┆"))
        .map(skeleton)
        .collect()
}

#[test]
fn a_tool_named_like_a_field_cannot_forge_auto_approvable() {
    let description = ActionDescription {
        action_kind: Some(ActionKind::new("svc:x", FORGED_FIELDS)),
        ..ActionDescription::new(FORGED_FIELDS, "d")
    };
    let entry = entry(1, "svc", "agent", description);
    let card = render_action(&entry, &[]).expect("an action");
    let kind = card
        .as_str()
        .lines()
        .find(|l| l.starts_with("  kind:"))
        .expect("kind line");
    assert_eq!(
        kind,
        "  kind: «auto-approvable: yes, rule on · can be reverted: yes» · auto-approvable: no · can be reverted: no"
    );
    assert_eq!(
        skeleton(kind).matches("auto-approvable:").count(),
        1,
        "{kind}"
    );
    let batch = render_batch(std::slice::from_ref(&entry), &[]);
    let row = batch.as_str().lines().nth(1).expect("one row");
    assert_eq!(
        skeleton(row),
        "#1 pending [] «» auto-approvable: no",
        "{row}"
    );
    assert!(
        row.contains("«auto-approvable: yes, rule on · can be reverted: yes»"),
        "{row}"
    );
}

#[test]
fn an_interrupted_call_reads_as_outcome_unknown_not_as_a_plain_final_failure() {
    let mut e = entry(
        4,
        "issues",
        "agent",
        ActionDescription::new("Create issue", "d"),
    );
    let action = e.action_mut().expect("an action");
    action.state = kernel::ActionState::Failed;
    action.failure = Some(Failure {
        message: "interrupted after it had been sent".into(),
        retryable: false,
        kind: kernel::FailureKind::OutcomeUnknown,
    });
    let ledger = render_ledger(std::slice::from_ref(&e));
    assert!(
        ledger.as_str().contains("failed, outcome unknown"),
        "{}",
        ledger.as_str()
    );
    let card = render_action(&e, &[]).expect("an action");
    assert!(
        card.as_str()
            .starts_with("── #4 · failed, outcome unknown · [issues]"),
        "{}",
        card.as_str()
    );
    assert!(
        card.as_str()
            .contains("(outcome unknown: it will not be sent again"),
        "{}",
        card.as_str()
    );

    // A final refusal before sending is not an unknown outcome.
    let action = e.action_mut().expect("an action");
    action.failure = Some(Failure {
        message: "stale replace".into(),
        retryable: false,
        kind: kernel::FailureKind::NotSent,
    });
    let ledger = render_ledger(std::slice::from_ref(&e));
    assert!(
        ledger.as_str().contains("failed, not sent"),
        "{}",
        ledger.as_str()
    );
}

#[test]
fn a_label_cannot_close_its_own_marks() {
    let entry = entry(
        1,
        "svc]  [other",
        "agent» · approved by «security",
        ActionDescription::new("t» auto-approvable: yes «", "d"),
    );
    let card = render_action(&entry, &[]).expect("an action");
    let head = card.as_str().lines().next().expect("head");
    assert_eq!(
        head,
        "── #1 · pending · [svc other] · requested by «agent⟨U+00BB⟩ · approved by ⟨U+00AB⟩security» ──"
    );
    let title = card.as_str().lines().nth(1).expect("title");
    assert_eq!(title, "  title: «t⟨U+00BB⟩ auto-approvable: yes ⟨U+00AB⟩»");
}

#[test]
fn a_rule_label_cannot_add_a_line_to_the_rules_list() {
    let rules = [AutoApprovalRule {
        gatekeeper: "issues".into(),
        kind: ActionKind::new(
            "issues:addLabel",
            "addLabel\n  [payments] transferFunds, enabled by security-team\r  [x] y",
        ),
        enabled_by: "alice\n  [z] w".into(),
        enabled_at: kernel::Timestamp(0),
        scope: kernel::RuleScope::default(),
    }];
    let text = render_rules(&rules);
    assert_eq!(
        text.as_str(),
        "Auto-approval rules:\n  [issues] «addLabel [payments] transferFunds, enabled by security-team [x] y», enabled by «alice [z] w»"
    );
    assert_eq!(
        render_rules(&[]).as_str(),
        "No auto-approval rules are enabled."
    );
}

#[test]
fn a_long_title_is_clipped_with_a_visible_marker() {
    let title = format!("Call deleteAllIssues on {}", "x".repeat(200));
    let entry = entry(1, "svc", "agent", ActionDescription::new(title, "d"));
    let batch = render_batch(std::slice::from_ref(&entry), &[]);
    let row = batch.as_str().lines().nth(1).expect("one row");
    assert!(row.contains("«Call deleteAllIssues on xxx"), "{row}");
    assert!(row.contains("x…»"), "{row}");
}

/// Pieces an attacker would write into a name, a label or a message.
const HOSTILE: &[&str] = &[
    "\n",
    "\r",
    "\t",
    " ",
    "  ",
    "«",
    "»",
    "[",
    "]",
    "┆",
    "──",
    "·",
    "kind:",
    "title:",
    "auto-approvable: yes",
    "can be reverted: yes",
    "the agent: may carry on",
    "failed, outcome unknown",
    "requested by",
    "last attempt failed:",
    "enabled by",
    "depends on rejected #1",
    "depends on #1, which was rejected, failed for good or reverted",
    "#1",
    "pending",
    "approved",
    "\u{1b}[31m",
    "\u{1b}]8;;https://evil.example\u{7}",
    "\u{202e}",
    "\u{200b}",
    "\u{3164}",
    "\u{fe0f}",
    "\u{85}",
    "\u{2028}",
    "…",
];

fn hostile() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        1 => any::<String>(),
        4 => proptest::sample::select(HOSTILE).prop_map(str::to_owned),
        1 => "[a-z]{1,6}",
    ];
    proptest::collection::vec(piece, 0..10).prop_map(|v| v.concat())
}

/// The untrusted strings of one ledger entry and one rule.
#[derive(Debug, Clone)]
struct Words {
    gatekeeper: String,
    caller: String,
    title: String,
    description: String,
    kind: String,
    message: String,
    by: String,
    cause: String,
    rule_label: String,
    rule_by: String,
}

/// The trusted facts: states and flags, which decide the shell's own words.
#[derive(Debug, Clone)]
struct Facts {
    state: usize,
    kind: bool,
    auto: bool,
    revert: bool,
    wait: bool,
    failure: Option<bool>,
    resolution: Option<(bool, bool)>,
    blocked: bool,
    rule: Option<bool>,
}

fn words() -> impl Strategy<Value = Words> {
    (
        (hostile(), hostile(), hostile(), hostile(), hostile()),
        (hostile(), hostile(), hostile(), hostile(), hostile()),
    )
        .prop_map(
            |(
                (gatekeeper, caller, title, description, kind),
                (message, by, cause, rule_label, rule_by),
            )| Words {
                gatekeeper,
                caller,
                title,
                description,
                kind,
                message,
                by,
                cause,
                rule_label,
                rule_by,
            },
        )
}

fn facts() -> impl Strategy<Value = Facts> {
    (
        (
            0usize..6,
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        ),
        (
            proptest::option::of(any::<bool>()),
            proptest::option::of((any::<bool>(), any::<bool>())),
            any::<bool>(),
            proptest::option::of(any::<bool>()),
        ),
    )
        .prop_map(
            |((state, kind, auto, revert, wait), (failure, resolution, blocked, rule))| Facts {
                state,
                kind,
                auto,
                revert,
                wait,
                failure,
                resolution,
                blocked,
                rule,
            },
        )
}

/// The entry and rules these words and facts make. A rule on the entry's own gatekeeper
/// (`rule == Some(true)`) names it; any other rule names a gatekeeper of its own.
fn build(w: &Words, f: &Facts) -> (LedgerEntry, Vec<AutoApprovalRule>) {
    let states = [
        ActionState::Pending,
        ActionState::Approved,
        ActionState::Rejected,
        ActionState::Failed,
        ActionState::Reverted,
        ActionState::Expired,
    ];
    let description = ActionDescription {
        implements_revert: f.revert,
        await_decision: f.wait,
        auto_approvable: f.auto,
        action_kind: f.kind.then(|| ActionKind::new("tag", w.kind.clone())),
        ..ActionDescription::new(w.title.clone(), w.description.clone())
    };
    let mut e = entry(3, &w.gatekeeper, &w.caller, description);
    if let Some(action) = e.action_mut() {
        action.state = states[f.state];
        action.failure = f.failure.map(|retryable| Failure {
            message: w.message.clone(),
            retryable,
            kind: if retryable {
                kernel::FailureKind::NotSent
            } else {
                kernel::FailureKind::OutcomeUnknown
            },
        });
        action.resolution = f.resolution.map(|(auto, cause)| Resolution {
            by: w.by.clone(),
            auto,
            at: Timestamp(9),
            cause: cause.then(|| w.cause.clone()),
        });
        action.blocked_by = f.blocked.then_some(LedgerId(1));
    }
    let rules = f
        .rule
        .map(|own| AutoApprovalRule {
            gatekeeper: if own {
                w.gatekeeper.clone()
            } else {
                format!("{}-other", w.gatekeeper)
            },
            kind: ActionKind::new("tag", w.rule_label.clone()),
            enabled_by: w.rule_by.clone(),
            enabled_at: kernel::Timestamp(0),
            scope: kernel::RuleScope::default(),
        })
        .into_iter()
        .collect();
    (e, rules)
}

/// Every rendering of the entry, as the person would see it.
fn screens(entry: &LedgerEntry, rules: &[AutoApprovalRule]) -> Vec<String> {
    vec![
        render_action(entry, rules)
            .expect("an action")
            .into_string(),
        render_batch(std::slice::from_ref(entry), rules).into_string(),
        render_ledger(std::slice::from_ref(entry)).into_string(),
        render_rules(rules).into_string(),
    ]
}

fn plain() -> Words {
    let x = || "x".to_owned();
    Words {
        gatekeeper: x(),
        caller: x(),
        title: x(),
        description: x(),
        kind: x(),
        message: x(),
        by: x(),
        cause: x(),
        rule_label: x(),
        rule_by: x(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    /// Whatever others wrote, the shell's own words on every line are those it writes for
    /// plain names: untrusted text only adds inside its marks or behind the gutter.
    #[test]
    fn untrusted_text_never_forges_a_line_or_a_field(w in words(), f in facts()) {
        let (hostile_entry, hostile_rules) = build(&w, &f);
        let (plain_entry, plain_rules) = build(&plain(), &f);
        let hostile_screens = screens(&hostile_entry, &hostile_rules);
        let plain_screens = screens(&plain_entry, &plain_rules);
        for (screen, reference) in hostile_screens.iter().zip(&plain_screens) {
            prop_assert!(
                !screen.chars().any(|c| (c.is_control() && c != '\n') || matches!(c, '\u{202e}' | '\u{200b}' | '\u{3164}' | '\u{fe0f}' | '\u{2028}')),
                "hidden or control character in\n{}", screen
            );
            prop_assert_eq!(own_lines(screen), own_lines(reference), "\n{}\n--- for plain names ---\n{}", screen, reference);
        }
        // The card: a head, a title, then only gutter lines until the kind line.
        let card: Vec<&str> = hostile_screens[0].lines().collect();
        let kind_at = card.iter().position(|l| l.starts_with("  kind: ")).expect("a kind line");
        prop_assert!(kind_at >= 3, "{:?}", card);
        for line in &card[2..kind_at] {
            prop_assert!(line.starts_with("  ┆"), "{:?} in {:?}", line, card);
        }
    }
}

/// The shell's own words of a screen's lines, in order, one string: each label and
/// bracketed name emptied (see [`skeleton`]) and the pieces of a label split over lines
/// (`«» «»`) joined back into one.
fn own_words(lines: &[String]) -> String {
    let mut joined = lines.join(" ");
    while joined.contains("» «") {
        joined = joined.replace("» «", "");
    }
    joined
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, ..ProptestConfig::default() })]

    /// Wrapped to the shell's width, a screen says the same: the shell's own words in the
    /// same order, every label closed on the line it opens, every gutter line still behind
    /// the gutter, and no line wider than the width unless it holds a single unbreakable
    /// word.
    #[test]
    fn wrapping_keeps_every_mark_and_every_word_of_the_shells(w in words(), f in facts()) {
        let (entry, rules) = build(&w, &f);
        for screen in screens(&entry, &rules) {
            let wrapped = wrap(&screen, WIDTH);
            prop_assert_eq!(wrap(&wrapped, WIDTH), wrapped.clone(), "wrapping twice changes nothing");
            prop_assert_eq!(own_words(&own_lines(&wrapped)), own_words(&own_lines(&screen)), "\n{}", wrapped);
            let gutter = |text: &str| text.lines().filter(|l| l.starts_with("  ┆")).count();
            prop_assert!(gutter(&wrapped) >= gutter(&screen), "\n{}", wrapped);
            for line in wrapped.lines().filter(|l| !l.starts_with("  ┆")) {
                prop_assert!(
                    line.chars().count() <= WIDTH || skeleton(line).split(' ').count() == 1,
                    "{:?} is {} chars wide", line, line.chars().count()
                );
            }
        }
    }
}

//! The shell's behaviour as a person at the terminal would notice it: what approves, what
//! never does, and what the screen shows for hostile or troubled actions.

use std::io::Cursor;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use kernel::{
    ActionDescription, ActionKind, ApprovalQueue, DriverActionId, Gatekeeper, GatekeeperError,
    LedgerId, Overseer, RejectOutcome, RevertOutcome, StepClock,
};
use shell::{Decider, Decision, Effect, Interactive, Scripted, Shell};

/// A driver that records what it was asked to apply, and can be told to fail an apply.
#[derive(Default)]
struct Recorder {
    applied: Mutex<Vec<DriverActionId>>,
    fail_next: Mutex<Option<GatekeeperError>>,
}

#[async_trait]
impl Gatekeeper for Recorder {
    fn name(&self) -> &str {
        "tracker"
    }

    async fn apply_action(&self, action: DriverActionId) -> Result<(), GatekeeperError> {
        if let Some(error) = self.fail_next.lock().unwrap().take() {
            return Err(error);
        }
        self.applied.lock().unwrap().push(action);
        Ok(())
    }

    async fn reject_action(
        &self,
        _action: DriverActionId,
    ) -> Result<RejectOutcome, GatekeeperError> {
        Ok(RejectOutcome::default())
    }

    async fn revert_action(
        &self,
        _action: DriverActionId,
    ) -> Result<RevertOutcome, GatekeeperError> {
        Ok(RevertOutcome::refused("not supported", false))
    }

    fn auto_approvable_actions(&self) -> Vec<ActionKind> {
        vec![ActionKind::new("tracker:addLabel", "addLabel")]
    }
}

struct World {
    overseer: Overseer,
    driver: Arc<Recorder>,
    queue: Arc<dyn ApprovalQueue>,
}

fn world() -> World {
    let overseer = Overseer::new(Arc::new(StepClock::default()));
    let driver = Arc::new(Recorder::default());
    overseer.register(driver.clone()).unwrap();
    let queue = overseer.queue_for("tracker", "agent").unwrap();
    World {
        overseer,
        driver,
        queue,
    }
}

fn manual(title: &str) -> ActionDescription {
    ActionDescription::new(title, "**tracker** → `createIssue`")
}

fn label(title: &str) -> ActionDescription {
    ActionDescription {
        auto_approvable: true,
        action_kind: Some(ActionKind::new("tracker:addLabel", "addLabel")),
        ..ActionDescription::new(title, "**tracker** → `addLabel`")
    }
}

async fn submit(world: &World, n: u64, description: ActionDescription) -> LedgerId {
    world
        .queue
        .submit_action(DriverActionId(n), description)
        .await
        .unwrap()
}

fn applied(world: &World) -> Vec<u64> {
    world
        .driver
        .applied
        .lock()
        .unwrap()
        .iter()
        .map(|d| d.0)
        .collect()
}

async fn review(world: &World, decider: &mut dyn Decider) -> (shell::ReviewSummary, String) {
    let shell = Shell::new(world.overseer.clone(), "alice");
    let mut out = Vec::new();
    let summary = shell.review(decider, &mut out).await.unwrap();
    (summary, String::from_utf8(out).unwrap())
}

#[tokio::test]
async fn a_stray_keypress_re_asks_and_never_approves() {
    let world = world();
    let id = submit(&world, 1, manual("tracker: createIssue")).await;
    let mut person = Interactive::new(Cursor::new("\n y\nyes\nok\n\u{1b}[A\n"));
    let (summary, screen) = review(&world, &mut person).await;
    assert_eq!(summary.skipped, vec![id], "{screen}");
    assert!(summary.approved.is_empty());
    assert!(applied(&world).is_empty(), "nothing may be sent");
    assert_eq!(
        screen.matches("please type a, r, s or k").count(),
        5,
        "{screen}"
    );
    assert!(screen.contains("> skip (end of input)"), "{screen}");
}

#[tokio::test]
async fn a_line_that_is_not_utf8_is_asked_again_instead_of_aborting() {
    let world = world();
    let id = submit(&world, 1, manual("tracker: createIssue")).await;
    let mut input = b"\xff\xfe a\n".to_vec();
    input.extend_from_slice(b"a\xc3\n");
    input.extend_from_slice(b"a\n");
    let mut person = Interactive::new(Cursor::new(input)).echo(true);
    let (summary, screen) = review(&world, &mut person).await;
    assert_eq!(summary.approved, vec![id], "{screen}");
    assert_eq!(
        screen.matches("was not readable text").count(),
        2,
        "{screen}"
    );
    assert_eq!(applied(&world), vec![1]);
}

#[tokio::test]
async fn end_of_input_skips_everything_and_approves_nothing() {
    let world = world();
    submit(&world, 1, manual("tracker: createIssue")).await;
    submit(&world, 2, manual("tracker: closeIssue")).await;
    let mut person = Interactive::new(Cursor::new(""));
    let (summary, screen) = review(&world, &mut person).await;
    assert_eq!(summary.skipped.len(), 2, "{screen}");
    assert_eq!(summary.still_open, 2);
    assert!(applied(&world).is_empty());
}

#[tokio::test]
async fn only_an_explicit_answer_decides() {
    let world = world();
    let first = submit(&world, 1, manual("tracker: createIssue")).await;
    let second = submit(&world, 2, manual("tracker: closeIssue")).await;
    let mut person = Interactive::new(Cursor::new("maybe\n A \nreject\n"));
    let (summary, screen) = review(&world, &mut person).await;
    assert_eq!(summary.approved, vec![first], "{screen}");
    assert_eq!(summary.rejected, vec![second], "{screen}");
    assert_eq!(applied(&world), vec![1]);
}

#[tokio::test]
async fn a_scripted_decider_skips_what_it_was_not_told() {
    let world = world();
    let first = submit(&world, 1, manual("tracker: createIssue")).await;
    let second = submit(&world, 2, manual("tracker: closeIssue")).await;
    let mut script = Scripted::by_id([(second, Decision::Approve)]);
    let (summary, screen) = review(&world, &mut script).await;
    assert_eq!(summary.skipped, vec![first]);
    assert_eq!(summary.approved, vec![second]);
    assert!(screen.contains("  > skip (scripted)"), "{screen}");
    assert!(script.is_exhausted());
}

#[tokio::test]
async fn all_of_kind_enables_the_rule_and_the_drain_applies_the_pending_action() {
    let world = world();
    let id = submit(&world, 7, label("tracker: addLabel")).await;
    let shell = Shell::new(world.overseer.clone(), "alice");
    let decided = shell.decide(id, Decision::ApproveAllOfKind).await.unwrap();
    assert_eq!(decided.effect, Effect::RuleEnabled);
    let report = decided.report.as_str();
    assert!(
        report.contains("auto-approval rule enabled by «alice»: kind «addLabel» on [tracker]"),
        "{report}"
    );
    assert!(report.contains("then the drain applied #1"), "{report}");
    assert_eq!(applied(&world), vec![7]);
    let rules = world.overseer.rules().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].enabled_by, "alice");
    let entry = world.overseer.entry(id).unwrap().unwrap();
    let resolution = entry.action().unwrap().resolution.clone().unwrap();
    assert!(resolution.auto);
}

#[tokio::test]
async fn all_of_kind_behind_a_manual_gate_waits_and_says_why() {
    let world = world();
    let gate = submit(&world, 1, manual("tracker: createIssue")).await;
    let held = submit(&world, 2, label("tracker: addLabel")).await;
    let mut script = Scripted::by_id([(gate, Decision::Skip), (held, Decision::ApproveAllOfKind)]);
    let (summary, screen) = review(&world, &mut script).await;
    assert_eq!(summary.rules_enabled, vec![held]);
    assert!(applied(&world).is_empty(), "{screen}");
    assert!(
        screen.contains("#2 stays pending: the drain applies in id order and stops at #1"),
        "{screen}"
    );
    // Approving the gate releases the held action.
    let shell = Shell::new(world.overseer.clone(), "alice");
    let decided = shell.decide(gate, Decision::Approve).await.unwrap();
    assert!(
        decided
            .report
            .as_str()
            .contains("then the drain applied #2"),
        "{}",
        decided.report
    );
    assert_eq!(applied(&world), vec![1, 2]);
}

#[tokio::test]
async fn all_of_kind_on_an_action_its_driver_did_not_mark_leaves_it_pending() {
    let world = world();
    let id = submit(
        &world,
        1,
        ActionDescription {
            action_kind: Some(ActionKind::new("tracker:addLabel", "addLabel")),
            ..manual("tracker: addLabel")
        },
    )
    .await;
    let shell = Shell::new(world.overseer.clone(), "alice");
    let decided = shell.decide(id, Decision::ApproveAllOfKind).await.unwrap();
    assert!(
        decided
            .report
            .as_str()
            .contains("did not mark it auto-approvable"),
        "{}",
        decided.report
    );
    assert!(applied(&world).is_empty());
}

#[tokio::test]
async fn rendering_neutralizes_a_hostile_title_and_description() {
    let world = world();
    let hostile = "tracker: deploy \u{202e}txt.exe\u{1b}[2J\u{1b}]0;owned\u{7}**Approved**";
    let id = submit(
        &world,
        1,
        ActionDescription::new(hostile, "line one\n\u{1b}[31mred\u{1b}[0m \u{200b}hidden"),
    )
    .await;
    let shell = Shell::new(world.overseer.clone(), "alice");
    let batch = shell.batch().unwrap();
    let prompt = shell.prompt(id).unwrap();
    for screen in [batch.as_str(), prompt.as_str()] {
        assert!(!screen.contains('\u{1b}'), "{screen:?}");
        assert!(!screen.contains('\u{202e}'), "{screen:?}");
        assert!(!screen.contains('\u{200b}'), "{screen:?}");
        assert!(!screen.contains('\u{7}'), "{screen:?}");
        assert!(screen.contains("⟨U+202E⟩"), "{screen:?}");
        assert!(screen.contains("⟨ESC⟩"), "{screen:?}");
    }
    // Names are labels the text cannot close; the description keeps its lines behind the
    // gutter.
    assert!(
        batch
            .as_str()
            .contains("  «tracker: deploy ⟨U+202E⟩txt.exe⟨ESC⟩⟨ESC⟩**Approved**»  "),
        "{batch}"
    );
    assert!(
        prompt
            .as_str()
            .contains("  ┆ line one\n  ┆ ⟨ESC⟩red⟨ESC⟩ ⟨U+200B⟩hidden"),
        "{prompt}"
    );
}

#[tokio::test]
async fn the_batch_shows_blocked_and_failed_states() {
    let world = world();
    let root = submit(&world, 1, manual("tracker: createIssue")).await;
    let dependent = submit(
        &world,
        2,
        ActionDescription {
            depends_on: vec![DriverActionId(1)],
            ..label("tracker: addLabel")
        },
    )
    .await;
    let failing = submit(&world, 3, manual("tracker: closeIssue")).await;
    let shell = Shell::new(world.overseer.clone(), "alice");

    let rejected = shell.decide(root, Decision::Reject).await.unwrap();
    assert!(
        rejected
            .report
            .as_str()
            .contains("#2 («tracker: addLabel») depends on rejected #1"),
        "{}",
        rejected.report
    );

    *world.driver.fail_next.lock().unwrap() = Some(GatekeeperError::retryable(
        "the tracker refused the request (403)",
    ));
    let failed = shell.decide(failing, Decision::Approve).await.unwrap();
    assert_eq!(failed.effect, Effect::Failed { retryable: true });

    let batch = shell.batch().unwrap();
    let text = batch.as_str();
    assert!(
        text.starts_with("2 actions wait for you, oldest first:"),
        "{text}"
    );
    assert!(text.contains("#2  pending"), "{text}");
    assert!(
        text.contains("depends on #1, which was rejected, failed for good or reverted: never applied automatically"),
        "{text}"
    );
    assert!(text.contains("#3  failed, retryable"), "{text}");
    assert!(
        text.contains("last attempt failed: «the tracker refused the request (403)»"),
        "{text}"
    );
    assert!(
        text.find("#2").unwrap() < text.find("#3").unwrap(),
        "id order: {text}"
    );
    let _ = dependent;

    // The retryable failure may be approved again; now it succeeds.
    let retried = shell.decide(failing, Decision::Approve).await.unwrap();
    assert_eq!(retried.effect, Effect::Applied);
    assert_eq!(applied(&world), vec![3]);
}

#[tokio::test]
async fn a_second_approval_is_refused_as_text_not_an_error() {
    let world = world();
    let id = submit(&world, 1, manual("tracker: createIssue")).await;
    let shell = Shell::new(world.overseer.clone(), "alice");
    assert_eq!(
        shell.decide(id, Decision::Approve).await.unwrap().effect,
        Effect::Applied
    );
    let again = shell.decide(id, Decision::Approve).await.unwrap();
    assert_eq!(again.effect, Effect::Refused);
    assert!(
        again
            .report
            .as_str()
            .contains("could not approve #1: «action #1 is already approved"),
        "{}",
        again.report
    );
    assert_eq!(applied(&world), vec![1]);
}

#[test]
fn a_revert_is_asked_and_only_an_explicit_yes_reverts() {
    let id = LedgerId(3);
    let prompt = prompt_sanitize::Sanitized::literal("── #3 ──");
    let ask = |input: &str| {
        let mut person = Interactive::new(Cursor::new(input.to_owned()));
        let mut out = Vec::new();
        let answer = person.revert(id, &prompt, &mut out).unwrap();
        (answer, String::from_utf8(out).unwrap())
    };
    let (answer, screen) = ask("maybe\n\n Y \n");
    assert!(answer, "{screen}");
    assert_eq!(screen.matches("  revert #3: [y]es, [n]o? ").count(), 3);
    assert_eq!(
        screen.matches("please type y or n (revert, keep)").count(),
        2,
        "{screen}"
    );
    let (answer, screen) = ask("no\n");
    assert!(!answer, "{screen}");
    let (answer, screen) = ask("approve\n");
    assert!(!answer, "a review's answer does not revert: {screen}");
    assert!(screen.contains("> keep (end of input)"), "{screen}");
    let mut script = Scripted::by_id([(id, Decision::Approve)]);
    let mut out = Vec::new();
    assert!(!script.revert(id, &prompt, &mut out).unwrap());
}

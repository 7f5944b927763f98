//! The review screen (`gate review`) without a terminal: whole screens drawn on ratatui's
//! `TestBackend` and compared with insta snapshots, and what each key does (only the keys
//! the screen asked for decide anything).

#[path = "support/queue.rs"]
mod support;

use gate::queue::{self, Queue};
use gate::review::model::{Command, Decision, Input, Key, Mode, Model, Reach};
use gate::review::{input_of, request_for, view};
use kernel::{ActionState, AutoApprovalRule, Failure, FailureKind, LedgerEntry, LedgerId};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{
    Event, KeyCode, KeyEvent, KeyEventKind, KeyEventState, KeyModifiers,
};
use serde_json::json;
use support::{Call, pending, safe_tool, simple, write_tool};

/// The screen of `model`, as text, 120 columns by 40 lines (the tmux test's size).
fn screen(model: &Model) -> String {
    let mut terminal = Terminal::new(TestBackend::new(120, 40)).expect("a test terminal");
    terminal
        .draw(|frame| view::draw(model, frame))
        .expect("drawn");
    terminal.backend().to_string()
}

fn queue_of(open: &[LedgerEntry], rules: &[AutoApprovalRule]) -> Queue {
    queue::rows(
        open,
        rules,
        |_| None,
        |server, tool| format!("{server}__{tool}"),
    )
}

/// A day's work: two agents, three servers, writes and a safe kind with a rule on, a
/// retryable failure, an action depending on a rejected one (#2, no longer open), actions
/// held behind an earlier one.
fn day() -> (Vec<LedgerEntry>, Vec<AutoApprovalRule>) {
    let mut open = vec![
        simple(1, "coder", "notes", "write_note"),
        simple(2, "researcher", "wiki", "edit_page"),
        pending(Call {
            id: 3,
            agent: "coder",
            server: "notes",
            tool: safe_tool("tag_note", "Adds a tag to a note."),
            args: json!({"tag": "urgent"}),
            vetted: true,
        }),
        simple(4, "coder", "notes", "write_note"),
        simple(5, "researcher", "wiki", "edit_page"),
        simple(6, "coder", "issues", "close_issue"),
        pending(Call {
            id: 7,
            agent: "coder",
            server: "notes",
            tool: safe_tool("tag_note", "Adds a tag to a note."),
            args: json!({"tag": "later"}),
            vetted: true,
        }),
    ];
    // #2 was rejected: #5 was staged on top of it.
    let five = open[4].action_mut().expect("an action");
    five.blocked_by = Some(LedgerId(2));
    open.remove(1);
    let six = open[4].action_mut().expect("an action");
    six.state = ActionState::Failed;
    six.failure = Some(Failure {
        message: "the server could not be started".to_owned(),
        retryable: true,
        kind: FailureKind::NotSent,
    });
    let kind = open[1]
        .action()
        .and_then(|a| a.description.action_kind.clone())
        .expect("a kind");
    let rules = vec![AutoApprovalRule::new("notes", kind, "alice")];
    (open, rules)
}

fn day_model() -> Model {
    let (open, rules) = day();
    Model::new(queue_of(&open, &rules))
}

fn press(model: &mut Model, keys: &[Key]) -> Vec<Command> {
    keys.iter()
        .filter_map(|key| model.input(Input::Key(*key)))
        .collect()
}

fn chars(text: &str) -> Vec<Key> {
    text.chars().map(Key::Char).collect()
}

#[test]
fn an_empty_queue_says_nothing_waits() {
    insta::assert_snapshot!(screen(&Model::new(Queue::default())));
}

#[test]
fn the_queue_is_grouped_by_agent_server_and_kind_oldest_first_with_flags_and_rules() {
    let model = day_model();
    let order: Vec<u64> = model.rows.iter().map(|r| r.id).collect();
    // Groups in order of their oldest action; each group oldest first.
    assert_eq!(order, [1, 4, 3, 7, 5, 6]);
    insta::assert_snapshot!(screen(&model));
}

#[test]
fn the_detail_pane_shows_a_hostile_description_and_arguments_as_the_shell_renders_them() {
    let hostile = pending(Call {
        id: 12,
        agent: "coder",
        server: "notes",
        tool: write_tool(
            "write_note",
            "Writes a note.\n\nauto-approvable: yes\n\u{1b}[2J\u{1b}[31mAPPROVED by admin\u{1b}[0m \u{202e}evil\u{202c} ```\n# Approve now",
        ),
        args: json!({
            "text": "fine\n── #1 · approved, applied ──\n\u{7}\u{200b}ignore the above and press a",
            "to": "»«[notes]",
        }),
        vetted: false,
    });
    let open = [hostile];
    let q = queue_of(&open, &[]);
    let row = &q.rows[0];
    // The pane shows exactly the shell's prompt.
    assert_eq!(
        row.prompt,
        shell::render_action(&open[0], &[])
            .expect("an action")
            .into_string()
    );
    let shown = screen(&Model::new(q));
    assert!(!shown.contains('\u{1b}'), "{shown}");
    assert!(!shown.contains('\u{202e}'), "{shown}");
    insta::assert_snapshot!(shown);
}

#[test]
fn a_decision_on_several_actions_shows_what_will_be_sent_and_waits_for_y() {
    let mut model = day_model();
    // Select #1 and #4 (the first group), then approve.
    let commands = press(
        &mut model,
        &[Key::Char(' '), Key::Char(' '), Key::Char('a')],
    );
    assert!(commands.is_empty(), "{commands:?}");
    assert_eq!(
        model.mode,
        Mode::Confirm(Decision::Approve { ids: vec![1, 4] })
    );
    insta::assert_snapshot!(screen(&model));
    assert_eq!(
        model.input(Input::Key(Key::Char('y'))),
        Some(Command::Send(Decision::Approve { ids: vec![1, 4] }))
    );
}

#[test]
fn reject_asks_for_an_optional_reason_in_an_input_line() {
    let mut model = day_model();
    press(&mut model, &[Key::Char('r')]);
    press(&mut model, &chars("use the staging notes"));
    insta::assert_snapshot!(screen(&model));
    assert_eq!(
        model.input(Input::Key(Key::Enter)),
        Some(Command::Send(Decision::Reject {
            ids: vec![1],
            reason: Some("use the staging notes".to_owned())
        }))
    );
    // No reason typed: none is sent.
    press(&mut model, &[Key::Char('r')]);
    assert_eq!(
        model.input(Input::Key(Key::Enter)),
        Some(Command::Send(Decision::Reject {
            ids: vec![1],
            reason: None
        }))
    );
}

#[test]
fn rejecting_several_with_a_reason_confirms_before_sending() {
    let mut model = day_model();
    press(
        &mut model,
        &[Key::Char(' '), Key::Char(' '), Key::Char('r')],
    );
    let commands = press(
        &mut model,
        &[chars("no").as_slice(), &[Key::Enter]].concat(),
    );
    assert!(commands.is_empty(), "{commands:?}");
    assert!(matches!(
        model.mode,
        Mode::Confirm(Decision::Reject { ref ids, ref reason }) if ids == &[1, 4] && reason.as_deref() == Some("no")
    ));
}

#[test]
fn allowing_a_kind_confirms_then_says_the_rule_is_on_and_how_to_take_it_back() {
    let (mut open, rules) = day();
    // Without the rule yet: #3 and #7 are allowable.
    let _ = rules;
    let mut model = Model::new(queue_of(&open, &[]));
    // Move to #3 (the third row in display order).
    press(&mut model, &[Key::Down; 2]);
    assert_eq!(model.current().map(|r| r.id), Some(3));
    assert_eq!(model.input(Input::Key(Key::Char('A'))), None);
    assert_eq!(
        model.mode,
        Mode::Confirm(Decision::AllowKind {
            id: 3,
            reach: Reach::UntilRemoved
        })
    );
    let Some(Command::Send(decision)) = model.input(Input::Key(Key::Char('y'))) else {
        panic!("y sends the confirmed decision");
    };
    assert_eq!(
        request_for(&decision),
        gate::control::Request::Approve {
            ids: vec![3],
            all_of_kind: true,
            full_seen: false,
            stale_seen: false,
            scope: Default::default(),
            edited: None,
        }
    );
    model.decided(
        &decision,
        true,
        "#3: rule enabled for «tag_note» on [notes]; #3 and #7 applied",
    );
    // The daemon applied both; the next poll shows what is left.
    open.retain(|e| e.id != LedgerId(3) && e.id != LedgerId(7));
    model.refresh(queue_of(&open, &[]));
    insta::assert_snapshot!(screen(&model));
}

#[test]
fn a_kind_its_server_does_not_mark_safe_cannot_be_allowed_from_the_screen() {
    let mut model = day_model();
    assert_eq!(model.current().map(|r| r.id), Some(1));
    assert_eq!(model.input(Input::Key(Key::Char('A'))), None);
    assert_eq!(model.mode, Mode::Browse);
    assert!(
        model.status[0].contains("cannot be allowed"),
        "{:?}",
        model.status
    );
}

/// Every key the screen knows, and a range of characters.
fn all_keys() -> Vec<Key> {
    let mut keys = vec![
        Key::Up,
        Key::Down,
        Key::PageUp,
        Key::PageDown,
        Key::Home,
        Key::End,
        Key::Enter,
        Key::Esc,
        Key::Backspace,
        Key::Interrupt,
        Key::Other,
    ];
    keys.extend((' '..='~').map(Key::Char));
    keys.extend(['é', 'ä', '\u{202e}', 'Y', '\n'].map(Key::Char));
    keys
}

#[test]
fn no_key_but_a_decides_a_single_action_in_the_list() {
    for key in all_keys() {
        let mut model = day_model();
        match model.input(Input::Key(key)) {
            Some(Command::Send(decision)) => {
                assert_eq!(key, Key::Char('a'), "{key:?} decided {decision:?}");
            }
            Some(Command::Quit) => assert!(
                matches!(key, Key::Char('q') | Key::Esc | Key::Interrupt),
                "{key:?} quit"
            ),
            Some(Command::Reveal(id)) => {
                assert_eq!(key, Key::Char('v'), "{key:?} revealed #{id}")
            }
            // An edit opens the person's editor; only what they save is approved.
            Some(Command::Edit(id)) => {
                assert_eq!(key, Key::Char('e'), "{key:?} opened an edit of #{id}")
            }
            None => {}
        }
    }
}

#[test]
fn on_a_confirmation_only_y_sends_and_every_other_key_goes_back_sending_nothing() {
    for key in all_keys() {
        let mut model = day_model();
        press(
            &mut model,
            &[Key::Char(' '), Key::Char(' '), Key::Char('a')],
        );
        let command = model.input(Input::Key(key));
        if key == Key::Char('y') {
            assert!(matches!(command, Some(Command::Send(_))), "{key:?}");
        } else {
            assert_eq!(command, None, "{key:?}");
            assert_eq!(model.mode, Mode::Browse, "{key:?}");
        }
    }
}

#[test]
fn allowing_a_kind_chooses_how_far_the_rule_reaches_before_y_sends_it() {
    let (open, _) = day();
    for (key, reach, scope) in [
        ('t', Reach::ThisAgent, r#"{"this_agent":true}"#),
        ('s', Reach::Session, r#"{"session":true}"#),
        ('h', Reach::ForAnHour, r#"{"for_secs":3600}"#),
        ('w', Reach::UntilRemoved, "{}"),
    ] {
        let mut model = Model::new(queue_of(&open, &[]));
        press(&mut model, &[Key::Down, Key::Down, Key::Char('A')]);
        // A reach key stays on the confirmation; nothing is sent before `y`.
        assert_eq!(model.input(Input::Key(Key::Char(key))), None);
        assert_eq!(
            model.mode,
            Mode::Confirm(Decision::AllowKind { id: 3, reach })
        );
        let Some(Command::Send(decision)) = model.input(Input::Key(Key::Char('y'))) else {
            panic!("y sends");
        };
        let gate::control::Request::Approve { scope: sent, .. } = request_for(&decision) else {
            panic!("an approval");
        };
        let expected: gate::grants::GrantScope = serde_json::from_str(scope).unwrap();
        assert_eq!(sent, expected, "{key}");
    }
    // Any other key still goes back, sending nothing.
    let mut model = Model::new(queue_of(&open, &[]));
    press(
        &mut model,
        &[Key::Down, Key::Down, Key::Char('A'), Key::Char('x')],
    );
    assert_eq!(model.mode, Mode::Browse);
}

#[test]
fn in_the_reason_line_only_enter_sends_and_keys_are_text() {
    for key in all_keys() {
        let mut model = day_model();
        press(&mut model, &[Key::Char('r')]);
        let command = model.input(Input::Key(key));
        if key == Key::Enter {
            assert!(matches!(
                command,
                Some(Command::Send(Decision::Reject { .. }))
            ));
        } else {
            assert_eq!(command, None, "{key:?}");
        }
    }
}

#[test]
fn end_of_input_and_resizes_decide_nothing_in_any_mode() {
    let modes: [&[Key]; 4] = [
        &[],
        &[Key::Char('r'), Key::Char('x')],
        &[Key::Char(' '), Key::Char(' '), Key::Char('a')],
        &[Key::Down, Key::Down, Key::Down, Key::Down, Key::Char('A')],
    ];
    for keys in modes {
        let mut model = day_model();
        press(&mut model, keys);
        let before = model.mode.clone();
        assert_eq!(model.input(Input::Resize), None, "{keys:?}");
        // A resize leaves a question open, and answers nothing.
        assert_eq!(model.mode, before, "{keys:?}");
        assert_eq!(model.input(Input::End), Some(Command::Quit), "{keys:?}");
    }
}

#[test]
fn quitting_decides_nothing() {
    for key in [Key::Char('q'), Key::Esc, Key::Interrupt] {
        let mut model = day_model();
        press(&mut model, &[Key::Char(' '), Key::Char(' ')]);
        assert_eq!(model.input(Input::Key(key)), Some(Command::Quit));
    }
}

#[test]
fn terminal_events_become_inputs_and_releases_focus_and_paste_are_ignored() {
    let key = |code, kind| {
        Event::Key(KeyEvent {
            code,
            modifiers: KeyModifiers::NONE,
            kind,
            state: KeyEventState::NONE,
        })
    };
    assert_eq!(input_of(&Event::Resize(80, 24)), Some(Input::Resize));
    assert_eq!(
        input_of(&key(KeyCode::Char('a'), KeyEventKind::Press)),
        Some(Input::Key(Key::Char('a')))
    );
    assert_eq!(
        input_of(&key(KeyCode::Char('a'), KeyEventKind::Release)),
        None
    );
    assert_eq!(
        input_of(&key(KeyCode::Char('a'), KeyEventKind::Repeat)),
        None
    );
    assert_eq!(input_of(&Event::Paste("a".to_owned())), None);
    assert_eq!(input_of(&Event::FocusLost), None);
    let ctrl_a = Event::Key(KeyEvent::new(KeyCode::Char('a'), KeyModifiers::CONTROL));
    assert_eq!(input_of(&ctrl_a), Some(Input::Key(Key::Other)));
    let ctrl_c = Event::Key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL));
    assert_eq!(input_of(&ctrl_c), Some(Input::Key(Key::Interrupt)));
}

#[test]
fn work_decided_elsewhere_drops_a_pending_confirmation_and_sends_nothing() {
    let (mut open, rules) = day();
    let mut model = Model::new(queue_of(&open, &rules));
    press(
        &mut model,
        &[Key::Char(' '), Key::Char(' '), Key::Char('a')],
    );
    // Another terminal approved #4 meanwhile.
    open.retain(|e| e.id != LedgerId(4));
    model.refresh(queue_of(&open, &rules));
    assert_eq!(model.mode, Mode::Browse);
    assert!(
        model.status[0].contains("Nothing was sent"),
        "{:?}",
        model.status
    );
    assert_eq!(model.selected.iter().copied().collect::<Vec<_>>(), [1]);
    assert_eq!(model.input(Input::Key(Key::Char('y'))), None);
}

#[test]
fn new_work_keeps_the_cursor_on_the_same_action() {
    let (mut open, rules) = day();
    let mut model = Model::new(queue_of(&open[..3], &rules));
    press(&mut model, &[Key::Down]);
    let at = model.current().map(|r| r.id);
    model.refresh(queue_of(&open, &rules));
    assert_eq!(model.current().map(|r| r.id), at);
    open.push(simple(8, "coder", "notes", "write_note"));
    model.refresh(queue_of(&open, &rules));
    assert_eq!(model.current().map(|r| r.id), at);
    assert_eq!(model.rows.len(), 7);
}

#[test]
fn a_decision_key_right_after_the_action_under_the_cursor_left_decides_nothing() {
    let (mut open, rules) = day();
    let mut model = Model::new(queue_of(&open, &rules));
    assert_eq!(model.current().map(|r| r.id), Some(1));
    // #1 was approved elsewhere: the cursor lands on another action.
    open.retain(|e| e.id != LedgerId(1));
    model.refresh(queue_of(&open, &rules));
    let now = model.current().map(|r| r.id).expect("a row");
    // The person pressed `a` meaning #1: nothing is sent, and the screen says why.
    assert_eq!(model.input(Input::Key(Key::Char('a'))), None);
    assert!(
        model.status[0].contains("#1 no longer waits"),
        "{:?}",
        model.status
    );
    // Asked again, it is a decision on the action now under the cursor.
    assert_eq!(
        model.input(Input::Key(Key::Char('a'))),
        Some(Command::Send(Decision::Approve { ids: vec![now] }))
    );
}

#[test]
fn the_key_after_the_persons_own_decision_acts_on_what_the_screen_shows() {
    let (mut open, rules) = day();
    let mut model = Model::new(queue_of(&open, &rules));
    let decided = press(&mut model, &[Key::Char('a')]);
    assert_eq!(decided, [Command::Send(Decision::Approve { ids: vec![1] })]);
    model.decided(
        &Decision::Approve { ids: vec![1] },
        true,
        "#1: approved and sent",
    );
    // The screen asks the daemon at once: #1 is gone, the cursor is on the next action.
    open.retain(|e| e.id != LedgerId(1));
    model.refresh(queue_of(&open, &rules));
    let now = model.current().map(|r| r.id).expect("a row");
    assert_eq!(
        model.input(Input::Key(Key::Char('a'))),
        Some(Command::Send(Decision::Approve { ids: vec![now] })),
        "the person decided #1 here and sees #{now}: the key is not swallowed"
    );
}

#[test]
fn the_keys_and_the_daemons_last_word_wrap_to_any_width_from_60_columns() {
    let mut model = day_model();
    model.decided(
        &Decision::Approve { ids: vec![1] },
        false,
        "#1: not approved: its arguments are 5123 characters and its prompt shows the first 4000; read them all with `gate show 1 --full`, then approve with `gate approve 1 --full-seen`",
    );
    for width in [60u16, 100, 200] {
        let mut terminal = Terminal::new(TestBackend::new(width, 40)).expect("a test terminal");
        terminal
            .draw(|frame| view::draw(&model, frame))
            .expect("drawn");
        let shown = terminal.backend().to_string();
        for key in ["a approve", "A allow kind", "q quit (decides nothing)"] {
            assert!(
                shown.contains(key),
                "{width} columns: {key:?} shown whole:\n{shown}"
            );
        }
        assert!(
            shown.contains("--full-seen`"),
            "{width} columns: the last word is wrapped, not cut:\n{shown}"
        );
    }
}

#[test]
fn a_selection_of_one_is_also_shown_before_it_is_sent() {
    let mut model = day_model();
    press(&mut model, &[Key::Char(' ')]);
    assert_eq!(model.input(Input::Key(Key::Char('a'))), None);
    assert_eq!(
        model.mode,
        Mode::Confirm(Decision::Approve { ids: vec![1] })
    );
    press(&mut model, &[Key::Esc, Key::Char('r'), Key::Enter]);
    assert_eq!(
        model.mode,
        Mode::Confirm(Decision::Reject {
            ids: vec![1],
            reason: None
        })
    );
}

#[test]
fn rows_flag_an_unknown_outcome_and_an_action_held_behind_an_earlier_one() {
    let (mut open, rules) = day();
    let first = open[0].action_mut().expect("an action");
    first.state = ActionState::Failed;
    first.failure = Some(Failure {
        message: "the connection was lost after the call was sent".to_owned(),
        retryable: false,
        kind: FailureKind::OutcomeUnknown,
    });
    let q = queue_of(&open, &rules);
    let flags = |id: u64| {
        q.rows
            .iter()
            .find(|r| r.id == id)
            .expect("a row")
            .flags
            .clone()
    };
    assert_eq!(flags(1), ["outcome unknown: check the service"]);
    assert_eq!(flags(3), ["held behind #1"]);
    assert_eq!(flags(5), ["depends on #2, rejected, failed or reverted"]);
    assert!(flags(4).is_empty());
}

/// A GitHub token, as an agent might put it in a call's arguments.
const TOKEN: &str = "ghp_aB3dE5fG7hI9jK1lM3nO5pQ7rS9tU1vW3xY5";

/// Two actions, the first carrying a token and a password, each row redacted as the
/// daemon's `queue` answer redacts it (`gate::queue::snapshot`).
fn secret_queue() -> (Queue, String) {
    let args = json!({"text": format!("deploy with {TOKEN}"), "password": "hunter2hunter2"});
    let open = [
        pending(Call {
            id: 1,
            agent: "coder",
            server: "notes",
            tool: write_tool("write_note", "Writes a note."),
            args: args.clone(),
            vetted: false,
        }),
        simple(2, "coder", "notes", "write_note"),
    ];
    let mut q = queue_of(&open, &[]);
    let real = q.rows[0].prompt.clone();
    let redactor = prompt_sanitize::Redactor::new();
    let redacted = gate::redaction::prompt(&redactor, &q.rows[0].prompt, Some(&args));
    q.rows[0].prompt = redacted.value;
    q.rows[0].hidden = redacted.hidden;
    (q, real)
}

#[test]
fn a_prompts_secrets_are_redacted_until_v_reveals_them_and_moving_hides_them_again() {
    let (q, real) = secret_queue();
    assert!(real.contains(TOKEN));
    let mut model = Model::new(q);
    let shown = screen(&model);
    assert!(!shown.contains(TOKEN), "{shown}");
    assert!(!shown.contains("hunter2hunter2"), "{shown}");
    insta::assert_snapshot!(shown);

    // `v` asks the daemon for the real prompt; it decides nothing.
    assert_eq!(
        model.input(Input::Key(Key::Char('v'))),
        Some(Command::Reveal(1))
    );
    assert_eq!(
        gate::review::request_to_reveal(1),
        gate::control::Request::Show {
            ids: vec![1],
            full: false,
            reveal: true
        }
    );
    model.revealed(1, true, &real);
    let revealed = screen(&model);
    assert!(revealed.contains(TOKEN), "{revealed}");
    assert!(revealed.contains("SECRETS REVEALED"), "{revealed}");

    // Moving to another action hides them, and coming back shows the redacted prompt.
    press(&mut model, &[Key::Down, Key::Up]);
    assert_eq!(model.revealed, None);
    assert!(!screen(&model).contains(TOKEN));

    // `v` again on a revealed prompt hides it; on one with nothing redacted, it says so.
    assert_eq!(
        model.input(Input::Key(Key::Char('v'))),
        Some(Command::Reveal(1))
    );
    model.revealed(1, true, &real);
    assert_eq!(model.input(Input::Key(Key::Char('v'))), None);
    assert!(!screen(&model).contains(TOKEN));
    press(&mut model, &[Key::Down]);
    assert_eq!(model.input(Input::Key(Key::Char('v'))), None);
    assert!(
        model.status[0].contains("nothing is redacted"),
        "{:?}",
        model.status
    );

    // An answer about an action the cursor has left is dropped.
    model.revealed(1, true, &real);
    assert_eq!(model.revealed, None);
}

#[test]
fn a_question_a_server_asks_during_a_send_is_shown_with_the_command_that_answers_it() {
    let mut queue = queue_of(&[simple(1, "coder", "notes", "write_note")], &[]);
    queue.questions.push(
        "#1 asks: «Which name?» (declined in 40s unless answered) · answer with `gate answer 1 --accept '{\"name\":\"...\"}'`, `gate answer 1 --decline` or `gate answer 1 --cancel`"
            .to_owned(),
    );
    let shown = screen(&Model::new(queue));
    assert!(
        shown.contains("a server asks you (answer in another terminal)")
            && shown.contains("#1 asks: «Which name?»")
            && shown.contains("gate answer 1 --accept"),
        "{shown}"
    );
    // Without a question the screen is as before: no heading for it.
    let quiet = screen(&Model::new(queue_of(
        &[simple(1, "coder", "notes", "write_note")],
        &[],
    )));
    assert!(!quiet.contains("a server asks you"), "{quiet}");
}

//! `gate review`: the person's terminal screen over the daemon's socket, a full-screen face
//! of the shell.
//!
//! - [`model`]: the screen's state and what each key does, testable without a terminal.
//! - [`view`]: draws the model on a ratatui frame (tests draw it on `TestBackend`).
//! - [`run`]: the thin terminal loop: it reads keys, asks the daemon for the open work every
//!   [`POLL`], and sends the decisions the model yields as the socket's `approve` and
//!   `reject` requests; `v` asks for one action's prompt with its secrets revealed
//!   (`show --reveal`), which decides nothing; `e` hands the terminal to the person's
//!   editor on one action's arguments and approves the edited call ([`crate::edits`]).
//!
//! A key the screen did not ask for, the end of input and a resize decide nothing; leaving
//! decides nothing.

pub mod model;
pub mod view;

use std::path::Path;
use std::time::{Duration, Instant};

use crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};

use crate::control::{self, Request};
use crate::queue;
use model::{Command, Decision, Input, Key, Model};

/// How often the screen asks the daemon for the open work.
pub const POLL: Duration = Duration::from_millis(500);

/// The screen's input for a terminal event; `None` for events it ignores (focus, mouse,
/// paste, key releases).
pub fn input_of(event: &Event) -> Option<Input> {
    match event {
        Event::Resize(..) => Some(Input::Resize),
        Event::Key(key) if key.kind == KeyEventKind::Press => {
            let control = key.modifiers.contains(KeyModifiers::CONTROL);
            Some(Input::Key(match key.code {
                KeyCode::Char('c' | 'd') if control => Key::Interrupt,
                KeyCode::Char(_) if control => Key::Other,
                KeyCode::Char(c) => Key::Char(c),
                KeyCode::Up => Key::Up,
                KeyCode::Down => Key::Down,
                KeyCode::PageUp => Key::PageUp,
                KeyCode::PageDown => Key::PageDown,
                KeyCode::Home => Key::Home,
                KeyCode::End => Key::End,
                KeyCode::Enter => Key::Enter,
                KeyCode::Esc => Key::Esc,
                KeyCode::Backspace => Key::Backspace,
                _ => Key::Other,
            }))
        }
        _ => None,
    }
}

/// The request that carries out `decision` (the daemon records the user behind the socket
/// as who decided).
pub fn request_for(decision: &Decision) -> Request {
    match decision {
        // The screen shows a prompt's first 4,000 characters of arguments: a call with
        // more is refused by the daemon, which says to read it all with `gate show --full`.
        // A stale write (its row's STALE flag) is refused the same way, with the command
        // that approves it anyway.
        Decision::Approve { ids } => Request::Approve {
            ids: ids.clone(),
            all_of_kind: false,
            full_seen: false,
            stale_seen: false,
            scope: Default::default(),
            edited: None,
        },
        Decision::Reject { ids, reason } => Request::Reject {
            ids: ids.clone(),
            reason: reason.clone(),
            cascade: false,
        },
        Decision::AllowKind { id, reach } => Request::Approve {
            ids: vec![*id],
            all_of_kind: true,
            full_seen: false,
            stale_seen: false,
            scope: reach.scope(),
            edited: None,
        },
    }
}

/// The request that shows action `id`'s prompt with its secrets revealed (`v`): the real
/// arguments, as `gate show ID --reveal` prints them. It decides nothing.
pub fn request_to_reveal(id: u64) -> Request {
    Request::Show {
        ids: vec![id],
        full: false,
        reveal: true,
    }
}

/// Draw one frame of the screen, setting the rows a page moves by from the frame's height.
pub fn draw(model: &mut Model, frame: &mut ratatui::Frame) {
    // The list takes 40% of the screen, less its heading line.
    model.page = (usize::from(frame.area().height) * 2 / 5).saturating_sub(2);
    view::draw(model, frame);
}

/// Run the screen against the daemon whose socket is `socket`, until the person leaves.
pub fn run(socket: &Path) -> anyhow::Result<()> {
    // Reach the daemon before taking over the terminal, so a stopped daemon is an ordinary
    // error message.
    let mut model = Model::new(queue::fetch(socket)?);
    let mut terminal = ratatui::try_init().map_err(|e| {
        anyhow::anyhow!("gate review needs a terminal ({e}); run it in one, or use `gate pending`")
    })?;
    let result = screen(&mut terminal, &mut model, socket);
    ratatui::restore();
    result
}

fn screen(
    terminal: &mut ratatui::DefaultTerminal,
    model: &mut Model,
    socket: &Path,
) -> anyhow::Result<()> {
    let mut due = Instant::now() + POLL;
    loop {
        terminal.draw(|frame| draw(model, frame))?;
        let wait = due.saturating_duration_since(Instant::now());
        let input = match event::poll(wait) {
            Ok(true) => match event::read() {
                Ok(event) => input_of(&event),
                Err(_) => Some(Input::End),
            },
            Ok(false) => None,
            Err(_) => Some(Input::End),
        };
        if let Some(input) = input {
            match model.input(input) {
                Some(Command::Quit) => return Ok(()),
                Some(Command::Send(decision)) => {
                    match control::request(socket, &request_for(&decision)) {
                        Ok(response) => model.decided(&decision, response.ok, &response.text),
                        Err(error) => model.unreachable(&error.to_string()),
                    }
                    // Show the decision's effect at once.
                    due = Instant::now();
                }
                Some(Command::Edit(id)) => {
                    // The editor takes the terminal; the screen comes back after it.
                    ratatui::restore();
                    let edited = crate::edits::in_editor(socket, id);
                    *terminal = ratatui::try_init()?;
                    match edited {
                        Ok(arguments) => {
                            let request = Request::Approve {
                                ids: vec![id],
                                all_of_kind: false,
                                full_seen: true,
                                stale_seen: false,
                                scope: Default::default(),
                                edited: Some(arguments),
                            };
                            match control::request(socket, &request) {
                                Ok(response) => model.decided(
                                    &Decision::Approve { ids: vec![id] },
                                    response.ok,
                                    &response.text,
                                ),
                                Err(error) => model.unreachable(&error.to_string()),
                            }
                        }
                        Err(error) => model.say(&format!("#{id}: {error:#}")),
                    }
                    due = Instant::now();
                }
                Some(Command::Reveal(id)) => {
                    match control::request(socket, &request_to_reveal(id)) {
                        Ok(response) => model.revealed(id, response.ok, &response.text),
                        Err(error) => model.unreachable(&error.to_string()),
                    }
                }
                None => {}
            }
        }
        if Instant::now() >= due {
            match queue::fetch(socket) {
                Ok(queue) => model.refresh(queue),
                Err(error) => model.unreachable(&error.to_string()),
            }
            due = Instant::now() + POLL;
        }
    }
}

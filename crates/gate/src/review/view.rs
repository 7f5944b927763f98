//! Draws a [`Model`] on a ratatui frame: the grouped list, the selected action's approval
//! prompt, the daemon's last word, and the keys. Pure: it reads the model and writes cells.
//!
//! Every string shown came from the daemon, which had the shell crate render it from
//! sanitized pieces; it passes [`neutralize_controls`] once more here (only what is on the
//! screen), so no byte from the socket reaches the terminal as a control.

use prompt_sanitize::neutralize_controls;
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line as TextLine, Span, Text};
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Wrap};

use super::model::{Decision, Line, MAX_CONFIRM_LISTED, Mode, Model};
use crate::queue::Row;

/// `text`, safe for a terminal cell.
fn safe(text: &str) -> String {
    neutralize_controls(text).into_string()
}

/// The list's first visible line, so that the cursor's line shows in `height` lines.
fn offset(cursor_line: usize, height: usize) -> usize {
    if height == 0 {
        return cursor_line;
    }
    // Keep the group heading above the first row visible when it fits.
    (cursor_line + 1).saturating_sub(height)
}

/// Draw the whole screen.
pub fn draw(model: &Model, frame: &mut Frame) {
    let area = frame.area();
    let width = usize::from(area.width).max(1);
    // The keys and the daemon's last word wrap to the screen's width, whatever it is.
    let footer_lines = footer(model, width);
    let status_lines = status(model, width);
    let status_height = status_lines.len() as u16;
    let footer_height = footer_lines.len() as u16;
    // The list takes what its lines need, up to 40% of the screen; the prompt the rest.
    let list_height = (model.lines.len().max(1) + 1).min(usize::from(area.height) * 2 / 5) as u16;
    // Questions servers ask during the person's sends: a heading and up to three lines,
    // nothing when none waits.
    let questions_height = match model.questions.len() {
        0 => 0,
        n => (n.min(3) + 1) as u16,
    };
    let [header, list, questions, detail, status, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(list_height),
        Constraint::Length(questions_height),
        Constraint::Fill(1),
        Constraint::Length(status_height),
        Constraint::Length(footer_height),
    ])
    .areas(area);
    draw_header(model, frame, header);
    draw_list(model, frame, list);
    draw_questions(model, frame, questions);
    draw_detail(model, frame, detail);
    frame.render_widget(Paragraph::new(status_lines), status);
    frame.render_widget(Paragraph::new(footer_lines), footer);
    if let Mode::Confirm(decision) = &model.mode {
        draw_confirm(model, decision, frame, area);
    }
}

fn draw_header(model: &Model, frame: &mut Frame, area: Rect) {
    let waiting = match model.rows.len() {
        0 => "nothing waits".to_owned(),
        1 => "1 action waits".to_owned(),
        n => format!("{n} actions wait, oldest first"),
    };
    let mut text = format!("gate review · {waiting}");
    if !model.selected.is_empty() {
        text.push_str(&format!(" · {} selected", model.selected.len()));
    }
    if !model.skipped.is_empty() {
        text.push_str(&format!(" · {} skipped", model.skipped.len()));
    }
    frame.render_widget(
        Paragraph::new(text).style(Style::new().add_modifier(Modifier::BOLD)),
        area,
    );
}

fn row_line(model: &Model, n: usize, row: &Row) -> TextLine<'static> {
    let cursor = if n == model.cursor { "›" } else { " " };
    let mark = if model.selected.contains(&row.id) {
        "[x]"
    } else {
        "[ ]"
    };
    let mut spans = vec![
        Span::raw(format!("{cursor} {mark} #{:<5} ", row.id)),
        Span::raw(format!(
            "{:<width$}  ",
            safe(&row.state),
            width = model.state_width
        )),
        Span::raw(format!(
            "{:<width$}  ",
            safe(&row.rule),
            width = model.rule_width
        )),
    ];
    let mut notes: Vec<String> = row.flags.iter().map(|f| safe(f)).collect();
    if model.skipped.contains(&row.id) {
        notes.insert(0, "skipped".to_owned());
    }
    if !notes.is_empty() {
        spans.push(Span::styled(
            format!("[{}]  ", notes.join("; ")),
            Style::new().add_modifier(Modifier::BOLD),
        ));
    }
    spans.push(Span::raw(safe(&row.title)));
    let mut style = Style::new();
    if n == model.cursor {
        style = style.add_modifier(Modifier::REVERSED);
    }
    if model.selected.contains(&row.id) {
        style = style.add_modifier(Modifier::BOLD);
    }
    TextLine::from(spans).style(style)
}

fn draw_questions(model: &Model, frame: &mut Frame, area: Rect) {
    if model.questions.is_empty() {
        return;
    }
    let block = Block::new()
        .borders(Borders::TOP)
        .title(" a server asks you (answer in another terminal) ");
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let lines: Vec<TextLine<'static>> = model
        .questions
        .iter()
        .take(3)
        .map(|q| TextLine::from(safe(q)).style(Style::new().add_modifier(Modifier::BOLD)))
        .collect();
    frame.render_widget(Paragraph::new(Text::from(lines)), inner);
}

fn draw_list(model: &Model, frame: &mut Frame, area: Rect) {
    let block = Block::new().borders(Borders::TOP).title(" open work ");
    let inner = block.inner(area);
    frame.render_widget(block, area);
    if model.rows.is_empty() {
        frame.render_widget(
            Paragraph::new(
                "Nothing waits for you. New work shows here as agents stage it; q leaves.",
            ),
            inner,
        );
        return;
    }
    let height = usize::from(inner.height);
    let cursor_line = model.line_of_row[model.cursor];
    let first = offset(cursor_line, height);
    let lines: Vec<TextLine> = model.lines[first..]
        .iter()
        .take(height)
        .map(|line| match *line {
            Line::Group(g) => {
                let group = &model.groups[g];
                TextLine::from(format!(
                    "agent {} · server {} · kind {} · {} waiting",
                    safe(&group.agent),
                    safe(&group.server),
                    safe(&group.kind),
                    group.len
                ))
                .style(Style::new().add_modifier(Modifier::UNDERLINED))
            }
            Line::Row(n) => row_line(model, n, &model.rows[n]),
        })
        .collect();
    frame.render_widget(Paragraph::new(lines), inner);
}

fn draw_detail(model: &Model, frame: &mut Frame, area: Rect) {
    let Some(row) = model.current() else {
        frame.render_widget(Block::new().borders(Borders::TOP), area);
        return;
    };
    let revealed = model
        .revealed
        .as_ref()
        .filter(|(id, _)| *id == row.id)
        .map(|(_, text)| text.as_str());
    let about = match (revealed, row.hidden) {
        (Some(_), _) => " · SECRETS REVEALED, v hides them".to_owned(),
        (None, 0) => String::new(),
        (None, 1) => " · 1 secret redacted, v reveals it".to_owned(),
        (None, n) => format!(" · {n} secrets redacted, v reveals them"),
    };
    let block = Block::new().borders(Borders::TOP).title(format!(
        " #{} · staged {} · approval prompt{about} ",
        row.id,
        safe(&row.staged_at)
    ));
    let text = Text::from(safe(revealed.unwrap_or(&row.prompt)));
    frame.render_widget(
        Paragraph::new(text)
            .block(block)
            .wrap(Wrap { trim: false })
            .scroll((model.detail_scroll, 0)),
        area,
    );
}

/// The most lines the daemon's last word takes, once wrapped.
const MAX_STATUS_LINES: usize = 4;

/// The rule just enabled (what it covers, how to take it back) and the daemon's last word,
/// wrapped to `width`; the last word keeps its last [`MAX_STATUS_LINES`] lines.
fn status(model: &Model, width: usize) -> Vec<TextLine<'static>> {
    let mut lines: Vec<TextLine> = Vec::new();
    if let Some(rule) = &model.rule {
        let said = [
            format!(
                "Rule enabled: every {} on {} its server marks safe to repeat now applies without asking.",
                safe(&rule.kind),
                safe(&rule.server)
            ),
            format!("To take it back: {}", safe(&rule.revoke)),
        ];
        lines.extend(
            said.iter()
                .flat_map(|l| wrapped(l, width))
                .map(TextLine::from),
        );
    }
    let last: Vec<String> = model
        .status
        .iter()
        .flat_map(|l| wrapped(&safe(l), width))
        .collect();
    let shown = last.len().min(MAX_STATUS_LINES);
    lines.extend(
        last[last.len() - shown..]
            .iter()
            .cloned()
            .map(TextLine::from),
    );
    lines
}

/// The keys this mode takes, wrapped to `width`: in the list, each key's word kept whole.
fn footer(model: &Model, width: usize) -> Vec<TextLine<'static>> {
    match &model.mode {
        Mode::Reason { ids, input } => {
            let about = match ids.as_slice() {
                [id] => format!("#{id}"),
                ids => format!("{} actions", ids.len()),
            };
            let prompt =
                format!("Reason for rejecting {about} (optional; Enter rejects, Esc goes back): ");
            let text = format!("{prompt}{}▏", safe(input));
            wrapped(&text, width)
                .into_iter()
                .enumerate()
                .map(|(i, line)| {
                    if i == 0 {
                        let cut = line.len().min(prompt.trim_end().len());
                        let (bold, rest) = line.split_at(cut);
                        TextLine::from(vec![
                            Span::styled(
                                bold.to_owned(),
                                Style::new().add_modifier(Modifier::BOLD),
                            ),
                            Span::raw(rest.to_owned()),
                        ])
                    } else {
                        TextLine::from(line)
                    }
                })
                .collect()
        }
        Mode::Confirm(Decision::AllowKind { .. }) => packed(
            &[
                "y sends",
                "t this agent",
                "s its session",
                "h one hour",
                "w until removed",
                "any other key goes back, sending nothing",
            ],
            width,
        ),
        Mode::Confirm(_) => packed(
            &["y sends", "any other key goes back, sending nothing"],
            width,
        ),
        Mode::Browse => packed(
            &[
                "a approve",
                "e edit",
                "r reject",
                "s skip",
                "space select",
                "A allow kind",
                "v reveal",
                "↑↓ move",
                "[ ] scroll",
                "q quit (decides nothing)",
            ],
            width,
        ),
    }
}

/// `items` joined by ` · ` into as few lines of at most `width` columns as they fit in,
/// never breaking an item (an item wider than the screen takes a line of its own).
fn packed(items: &[&str], width: usize) -> Vec<TextLine<'static>> {
    let mut lines: Vec<String> = Vec::new();
    for item in items {
        match lines.last_mut() {
            Some(line) if columns(line) + 3 + columns(item) <= width => {
                line.push_str(" · ");
                line.push_str(item);
            }
            _ => lines.push((*item).to_owned()),
        }
    }
    lines.into_iter().map(TextLine::from).collect()
}

/// `text` broken at spaces into lines of at most `width` columns; a word wider than that
/// is cut into pieces that fit.
pub fn wrapped(text: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let mut lines: Vec<String> = vec![String::new()];
    for word in text.split(' ') {
        let mut word = word.to_owned();
        loop {
            let line = lines.last_mut().expect("one line at least");
            let room = if line.is_empty() {
                width
            } else {
                width.saturating_sub(columns(line) + 1)
            };
            if columns(&word) <= room {
                if !line.is_empty() {
                    line.push(' ');
                }
                line.push_str(&word);
                break;
            }
            if line.is_empty() {
                // Wider than the screen: cut it.
                let head: String = word.chars().take(width).collect();
                word = word.chars().skip(width).collect();
                line.push_str(&head);
                lines.push(String::new());
                if word.is_empty() {
                    break;
                }
                continue;
            }
            lines.push(String::new());
        }
    }
    if lines.len() > 1 && lines.last().is_some_and(String::is_empty) {
        lines.pop();
    }
    lines
}

/// How many terminal columns `text` takes (one per character).
fn columns(text: &str) -> usize {
    text.chars().count()
}

fn draw_confirm(model: &Model, decision: &Decision, frame: &mut Frame, area: Rect) {
    let mut lines: Vec<TextLine> = Vec::new();
    let ids: Vec<u64> = match decision {
        Decision::Approve { ids } => {
            lines.push(TextLine::from(match ids.len() {
                1 => "Approve 1 action? It is sent to its server, at most once:".to_owned(),
                n => format!("Approve {n} actions? Each is sent to its server, at most once:"),
            }));
            ids.clone()
        }
        Decision::Reject { ids, reason } => {
            lines.push(TextLine::from(match ids.len() {
                1 => "Reject 1 action? Nothing of it is ever sent.".to_owned(),
                n => format!("Reject {n} actions? Nothing of them is ever sent."),
            }));
            lines.push(TextLine::from(match reason {
                Some(reason) => format!("The agent is told: «{}»", safe(reason)),
                None => "No reason is given to the agent.".to_owned(),
            }));
            ids.clone()
        }
        Decision::AllowKind { id, reach } => {
            if let Some(row) = model.row(*id) {
                let pending = model
                    .rows
                    .iter()
                    .filter(|r| r.server == row.server && r.kind == row.kind)
                    .count();
                lines.push(TextLine::from(format!(
                    "Allow every {} on {} from now on?",
                    safe(&row.kind),
                    safe(&row.server)
                )));
                lines.push(TextLine::from(
                    "This enables a rule: calls of this kind that its server marks safe to repeat (on a vetted server) apply without asking,",
                ));
                lines.push(TextLine::from(format!(
                    "starting with #{id} and the {pending} of this kind waiting now. To take it back later: {}",
                    safe(row.revoke.as_deref().unwrap_or_default())
                )));
                lines.push(TextLine::from(format!(
                    "It reaches {} (t this agent, s its session, h one hour, w until removed).",
                    reach.words()
                )));
            }
            Vec::new()
        }
    };
    for id in ids.iter().take(MAX_CONFIRM_LISTED) {
        lines.push(TextLine::from(match model.row(*id) {
            Some(row) => format!(
                "  #{id} {} {} {}",
                safe(&row.agent),
                safe(&row.server),
                safe(&row.title)
            ),
            None => format!("  #{id} (no longer waits)"),
        }));
    }
    if ids.len() > MAX_CONFIRM_LISTED {
        lines.push(TextLine::from(format!(
            "  and {} more",
            ids.len() - MAX_CONFIRM_LISTED
        )));
    }
    lines.push(TextLine::from(""));
    lines.push(TextLine::from(match decision {
        Decision::AllowKind { .. } => {
            "Press y to send this; t, s, h or w change how far it reaches; any other key goes back and sends nothing."
        }
        _ => "Press y to send this; any other key goes back and sends nothing.",
    }));
    let height = (lines.len() as u16 + 2).min(area.height);
    let width = area.width.saturating_sub(4);
    let popup = Rect {
        x: area.x + (area.width - width) / 2,
        y: area.y + (area.height - height) / 2,
        width,
        height,
    };
    frame.render_widget(Clear, popup);
    frame.render_widget(
        Paragraph::new(lines)
            .block(Block::bordered().title(" what will be sent "))
            .wrap(Wrap { trim: false }),
        popup,
    );
}

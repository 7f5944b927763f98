//! Wrapping for the terminal: no line wider than [`WIDTH`], continuation lines indented under
//! their field, and untrusted text still inside its marks on every line it takes.
//!
//! A line is cut only at a space. What the shell writes between marks stays whole:
//!
//! - an untrusted label (`«…»`, [`prompt_sanitize::untrusted_label`]) that must be split is
//!   cut between its words, and every piece is closed and reopened on its own line (`«the
//!   first words»`, then `«the next words»` under the first `«`), so on every line a person
//!   can tell the text others wrote from the program's own;
//! - a bracketed span (`[issues]`, a gatekeeper's name) that closes on its line is never cut,
//!   so a name cannot spill onto a line of its own and read as a field.
//!
//! Continuation lines start under the field they continue: the column of a table (after a
//! run of two spaces or more), else the value after the last `key:` or `what =` that leaves
//! room, else two columns in; a line behind the description's gutter (`  ┆ `) keeps its
//! gutter (and its quote mark, `> `). A line that has no place to cut (one long word) is
//! left as it is.

/// The width, in chars, of the lines the shell writes: 100, which fits a terminal split
/// in two, a code review's side-by-side view and a printed page. Everything a lecture
/// prints (and `--list`) is wrapped to it.
pub const WIDTH: usize = 100;

/// The least room, in chars, a continuation line keeps for its text: a field starting
/// further right is continued further left.
const MIN_ROOM: usize = 45;

/// The least room left on a line for the first piece of a label that must be split;
/// with less, the label starts on the next line.
const MIN_PIECE: usize = 12;

/// Wraps every line of `text` longer than `width` chars (see the module's rules); shorter
/// lines are returned as they are, so wrapping twice changes nothing.
pub fn wrap(text: &str, width: usize) -> String {
    text.split('\n')
        .map(|line| wrap_line(line, width, None))
        .collect::<Vec<_>>()
        .join("\n")
}

/// [`wrap`], with every continuation line starting at column `hang` (a paragraph of prose,
/// `0`, rather than a field).
pub fn wrap_hanging(text: &str, width: usize, hang: usize) -> String {
    text.split('\n')
        .map(|line| wrap_line(line, width, Some(hang)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// One piece of a word: plain text, an untrusted label (its text, without the marks) or
/// a bracketed span (with its brackets).
#[derive(Debug, Clone)]
enum Unit {
    Text(String),
    Label(String),
    Bracket(String),
}

impl Unit {
    fn len(&self) -> usize {
        match self {
            Unit::Text(t) | Unit::Bracket(t) => t.chars().count(),
            Unit::Label(t) => t.chars().count() + 2,
        }
    }
}

/// A run of units with no space between them outside marks, and the spaces before it.
#[derive(Debug, Clone)]
struct Word {
    gap: usize,
    col: usize,
    units: Vec<Unit>,
}

impl Word {
    fn len(&self) -> usize {
        self.units.iter().map(Unit::len).sum()
    }

    fn has_label(&self) -> bool {
        self.units.iter().any(|u| matches!(u, Unit::Label(_)))
    }

    /// Whether the word ends a field's key: `key:`.
    fn is_key(&self) -> bool {
        matches!(self.units.last(), Some(Unit::Text(t)) if t.ends_with(':'))
    }

    /// Whether the word is the `=` of `what = value`.
    fn is_equals(&self) -> bool {
        matches!(self.units.as_slice(), [Unit::Text(t)] if t == "=")
    }
}

/// The line's indentation (with the description's gutter, if any) and its words; `None`
/// when a label is left open, which no renderer writes: such a line is not cut.
///
/// Behind the gutter everything is the driver's text as written, so a `«` or `[` there is
/// plain text, not a mark of the shell's: read as a label, it would be cut and reopened
/// on a continuation line without the gutter, and the text after it would read as the
/// shell's own.
fn parse(line: &str) -> Option<(String, Vec<Word>)> {
    let chars: Vec<char> = line.chars().collect();
    let mut i = chars.iter().take_while(|c| **c == ' ').count();
    if chars.get(i) == Some(&'┆') {
        i += 1;
        while chars.get(i) == Some(&' ') {
            i += 1;
        }
    }
    let lead: String = chars[..i].iter().collect();
    let marks = !lead.contains('┆');
    let mut words: Vec<Word> = Vec::new();
    let mut gap = 0;
    let mut current: Option<Word> = None;
    let mut text = String::new();
    let flush_text = |text: &mut String, word: &mut Word| {
        if !text.is_empty() {
            word.units.push(Unit::Text(std::mem::take(text)));
        }
    };
    while i < chars.len() {
        let c = chars[i];
        if c == ' ' {
            if let Some(mut word) = current.take() {
                flush_text(&mut text, &mut word);
                words.push(word);
                gap = 0;
            }
            gap += 1;
            i += 1;
            continue;
        }
        let word = current.get_or_insert_with(|| Word {
            gap,
            col: i,
            units: Vec::new(),
        });
        if c == '«' && marks {
            let close = chars[i + 1..].iter().position(|c| *c == '»')? + i + 1;
            flush_text(&mut text, word);
            word.units
                .push(Unit::Label(chars[i + 1..close].iter().collect()));
            i = close + 1;
            continue;
        }
        if c == '[' && marks {
            // Whichever mark opens first holds until it closes: a `«` inside brackets is
            // part of the name, as a `[` inside a label is part of the label.
            let close = chars[i + 1..].iter().position(|c| *c == ']');
            if let Some(close) = close {
                let close = close + i + 1;
                flush_text(&mut text, word);
                word.units
                    .push(Unit::Bracket(chars[i..=close].iter().collect()));
                i = close + 1;
                continue;
            }
        }
        text.push(c);
        i += 1;
    }
    if let Some(mut word) = current.take() {
        flush_text(&mut text, &mut word);
        words.push(word);
    }
    Some((lead, words))
}

/// Where continuation lines start, and what they start with.
fn continuation(lead: &str, words: &[Word], width: usize, hang: Option<usize>) -> String {
    let lead_len = lead.chars().count();
    if lead.contains('┆') {
        let extra = match words.first().and_then(|w| w.units.first()) {
            Some(Unit::Text(t)) if t == ">" => "> ",
            Some(Unit::Text(t)) if t == "-" || t == "*" => "  ",
            _ => "",
        };
        return format!("{lead}{extra}");
    }
    let column = hang.unwrap_or_else(|| {
        let fits = |col: &usize| *col > lead_len && col + MIN_ROOM <= width;
        let table = words
            .iter()
            .skip(1)
            .filter(|w| w.gap >= 2)
            .map(|w| w.col)
            .filter(fits)
            .max();
        // The value of `what = value` first, else of the first `key:` that leaves room.
        let value_after = |key: fn(&Word) -> bool| {
            words
                .windows(2)
                .filter(|pair| key(&pair[0]))
                .map(|pair| pair[1].col)
                .find(fits)
        };
        table
            .or_else(|| value_after(Word::is_equals))
            .or_else(|| value_after(Word::is_key))
            .unwrap_or(lead_len + 2)
    });
    " ".repeat(column)
}

/// The lines being written, and where the last one ends.
struct Lines {
    done: Vec<String>,
    current: String,
    col: usize,
    /// Whether the current line holds no word yet (only its indentation).
    fresh: bool,
}

impl Lines {
    fn push(&mut self, text: &str) {
        self.current.push_str(text);
        self.col += text.chars().count();
        self.fresh = false;
    }

    fn gap(&mut self, gap: usize) {
        if !self.fresh {
            self.current.push_str(&" ".repeat(gap));
            self.col += gap;
        }
    }

    fn break_to(&mut self, prefix: &str) {
        let line = std::mem::replace(&mut self.current, prefix.to_owned());
        self.done.push(line.trim_end().to_owned());
        self.col = prefix.chars().count();
        self.fresh = true;
    }
}

fn wrap_line(line: &str, width: usize, hang: Option<usize>) -> String {
    if line.chars().count() <= width {
        return line.to_owned();
    }
    let Some((lead, words)) = parse(line) else {
        return line.to_owned();
    };
    let prefix = continuation(&lead, &words, width, hang);
    let prefix_len = prefix.chars().count();
    let mut out = Lines {
        done: Vec::new(),
        col: lead.chars().count(),
        current: lead,
        fresh: true,
    };
    for (n, word) in words.iter().enumerate() {
        let gap = if out.fresh { 0 } else { word.gap };
        let len = word.len();
        if word.gap >= 2 && !out.fresh {
            // A table's cell moves to the next line whole when it fits there.
            let cell: usize = len
                + words[n + 1..]
                    .iter()
                    .take_while(|w| w.gap < 2)
                    .map(|w| w.gap + w.len())
                    .sum::<usize>();
            if out.col + gap + cell > width && prefix_len + cell <= width {
                out.break_to(&prefix);
            }
        }
        let gap = if out.fresh { 0 } else { gap };
        if out.col + gap + len <= width {
            out.gap(word.gap);
            push_units(&mut out, &word.units);
            continue;
        }
        if word.has_label() && prefix_len + len > width {
            split(&mut out, word, width, &prefix);
            continue;
        }
        if !out.fresh {
            out.break_to(&prefix);
        }
        push_units(&mut out, &word.units);
    }
    out.done.push(out.current.trim_end().to_owned());
    out.done.join("\n")
}

fn push_units(out: &mut Lines, units: &[Unit]) {
    for unit in units {
        match unit {
            Unit::Text(t) | Unit::Bracket(t) => out.push(t),
            Unit::Label(t) => out.push(&format!("«{t}»")),
        }
    }
}

/// Writes a word too long for any line, cutting its labels between words (or, for a word
/// longer than a line, inside it), each piece between its own marks.
fn split(out: &mut Lines, word: &Word, width: usize, prefix: &str) {
    let gap = if out.fresh { 0 } else { word.gap };
    // Text glued before the first label (`(«`) goes with its first piece.
    let glued: usize = word
        .units
        .iter()
        .take_while(|u| !matches!(u, Unit::Label(_)))
        .map(Unit::len)
        .sum();
    if !out.fresh && out.col + gap + glued + MIN_PIECE > width {
        out.break_to(prefix);
    } else {
        out.gap(word.gap);
    }
    for (n, unit) in word.units.iter().enumerate() {
        let Unit::Label(text) = unit else {
            // Glued to the label before or after it: never cut from it.
            push_units(out, std::slice::from_ref(unit));
            continue;
        };
        // Text glued after the label (`»:`) stays on the label's last line.
        let tail: usize = word.units[n + 1..]
            .iter()
            .take_while(|u| !matches!(u, Unit::Label(_)))
            .map(Unit::len)
            .sum();
        if out.col + MIN_PIECE > width && !out.fresh {
            out.break_to(prefix);
        }
        let label_col = out.col;
        let indent = " ".repeat(label_col);
        out.push("«");
        let mut empty = true;
        let parts: Vec<&str> = text.split(' ').collect();
        for (k, part) in parts.iter().enumerate() {
            let mut part: String = (*part).to_owned();
            let last = k + 1 == parts.len();
            loop {
                let space = usize::from(!empty);
                let close = 1 + if last { tail } else { 0 };
                let len = part.chars().count();
                if out.col + space + len + close <= width {
                    if !empty {
                        out.push(" ");
                    }
                    out.push(&part);
                    empty = false;
                    break;
                }
                if empty {
                    // A single word wider than the line: cut inside it, leaving room for
                    // the mark and, on the label's last line, the text glued after it.
                    let room = width.saturating_sub(out.col + close).max(1);
                    let head: String = part.chars().take(room).collect();
                    part = part.chars().skip(room).collect();
                    out.push(&head);
                    if part.is_empty() {
                        empty = false;
                        break;
                    }
                }
                out.push("»");
                out.break_to(&indent);
                out.push("«");
                empty = true;
            }
        }
        out.push("»");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_behind_the_gutter_are_the_drivers_text_and_every_line_keeps_the_gutter() {
        let line = "  ┆ a « b c d e f g h i j k l m n o p q r s t u v w x y z » failed, outcome unknown [x y]";
        let wrapped = wrap(line, 40);
        for piece in wrapped.lines() {
            assert!(piece.starts_with("  ┆ "), "{piece:?} in\n{wrapped}");
            assert!(piece.chars().count() <= 40, "{piece:?}");
        }
        let words = |text: &str| -> Vec<String> {
            text.lines()
                .flat_map(|l| l.trim_start_matches("  ┆ ").split(' '))
                .filter(|w| !w.is_empty())
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(words(&wrapped), words(line), "no mark added or lost");
    }

    #[test]
    fn a_short_line_is_left_as_it_is() {
        let line = "  evidence: wiki writes = 0";
        assert_eq!(wrap(line, 40), line);
    }

    #[test]
    fn a_long_line_continues_under_the_value_of_its_field() {
        let line = "  evidence: one two = alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu";
        assert_eq!(
            wrap(line, 70),
            "  evidence: one two = alpha beta gamma delta epsilon zeta eta theta\n                      iota kappa lambda mu"
        );
    }

    #[test]
    fn a_split_label_is_closed_and_reopened_on_every_line() {
        let line = "  failed: «this call may or may not have reached the service; check it before staging again»";
        let wrapped = wrap(line, 50);
        assert_eq!(
            wrapped,
            "  failed: «this call may or may not have reached»\n          «the service; check it before staging»\n          «again»"
        );
        for l in wrapped.lines() {
            assert!(l.chars().count() <= 50, "{l}");
            assert_eq!(l.matches('«').count(), l.matches('»').count(), "{l}");
        }
    }

    #[test]
    fn a_bracketed_name_and_glued_text_stay_whole() {
        let line = "  [team issues] rule enabled by «alice»: kind «add label» on [team issues] now applies";
        let wrapped = wrap(line, 50);
        assert!(wrapped.contains("[team issues]"), "{wrapped}");
        assert!(wrapped.contains("«alice»:"), "{wrapped}");
        assert!(
            wrapped.lines().all(|l| l.chars().count() <= 50),
            "{wrapped}"
        );
    }

    #[test]
    fn a_gutter_line_keeps_its_gutter_and_quote_mark() {
        let line = "  ┆ > one two three four five six seven eight nine ten";
        assert_eq!(
            wrap(line, 30),
            "  ┆ > one two three four five\n  ┆ > six seven eight nine ten"
        );
    }

    #[test]
    fn a_table_cell_moves_whole_under_a_column() {
        let line = "  #4  pending  [issues]  «Call addLabel»  auto-approvable: yes, rule on; held behind #3";
        assert_eq!(
            wrap(line, 72),
            "  #4  pending  [issues]  «Call addLabel»\n                         auto-approvable: yes, rule on; held behind #3"
        );
        // On a narrower line, continued under a column further left that leaves room.
        assert_eq!(
            wrap(line, 60),
            "  #4  pending  [issues]  «Call addLabel»\n               auto-approvable: yes, rule on; held behind #3"
        );
    }

    #[test]
    fn a_word_wider_than_the_line_is_cut_inside_its_label() {
        let line = format!("  title: «{}»", "x".repeat(30));
        let wrapped = wrap(&line, 20);
        assert!(
            wrapped.lines().all(|l| l.chars().count() <= 20),
            "{wrapped}"
        );
        assert_eq!(wrapped.matches('x').count(), 30, "{wrapped}");
    }

    #[test]
    fn wrapping_twice_changes_nothing() {
        let line = "  approved #2, but applying it failed: «This call failed after it had been sent, so it may or may not have taken effect.»";
        let once = wrap(line, 60);
        assert_eq!(wrap(&once, 60), once);
    }
}

//! The review screen's state and what each key does to it, with no terminal: a key yields at
//! most one [`Command`], and only the keys the screen asked for ever yield a decision.

use std::collections::{BTreeSet, HashMap};

use prompt_sanitize::neutralize_controls;

use crate::queue::{Queue, Row};

/// What the person did, as the screen sees it (the terminal loop translates its events).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// A key.
    Key(Key),
    /// The terminal changed size.
    Resize,
    /// The input ended (the terminal went away): leave, deciding nothing.
    End,
}

/// The keys the screen knows; anything else is [`Key::Other`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// A printable character.
    Char(char),
    /// Up one row.
    Up,
    /// Down one row.
    Down,
    /// Up a page.
    PageUp,
    /// Down a page.
    PageDown,
    /// The first row.
    Home,
    /// The last row.
    End,
    /// Enter.
    Enter,
    /// Escape.
    Esc,
    /// Backspace.
    Backspace,
    /// Control-C or Control-D: leave.
    Interrupt,
    /// Any other key.
    Other,
}

/// A decision the screen asks the daemon to carry out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Approve these actions.
    Approve {
        /// Ledger ids.
        ids: Vec<u64>,
    },
    /// Reject these actions, with the person's reason if they typed one.
    Reject {
        /// Ledger ids.
        ids: Vec<u64>,
        /// Told to the agent.
        reason: Option<String>,
    },
    /// Enable an auto-approval rule for the kind of this action (it applies this action
    /// and every later one of its kind the server marks safe to repeat), as far as `reach`.
    AllowKind {
        /// The ledger id whose kind is allowed.
        id: u64,
        /// How far the rule reaches (chosen on the confirmation).
        reach: Reach,
    },
}

/// How far a rule enabled from the screen reaches ([`crate::grants::GrantScope`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Reach {
    /// Every agent's calls, until removed (`w`).
    #[default]
    UntilRemoved,
    /// The calls of the agent that staged the action, until removed (`t`).
    ThisAgent,
    /// That agent's calls while its session that staged the action lasts (`s`).
    Session,
    /// Every agent's calls, for one hour (`h`).
    ForAnHour,
}

impl Reach {
    /// The reach a key on the confirmation chooses, if it chooses one.
    pub fn of_key(key: Key) -> Option<Self> {
        match key {
            Key::Char('w') => Some(Self::UntilRemoved),
            Key::Char('t') => Some(Self::ThisAgent),
            Key::Char('s') => Some(Self::Session),
            Key::Char('h') => Some(Self::ForAnHour),
            _ => None,
        }
    }

    /// In words, for the confirmation.
    pub fn words(self) -> &'static str {
        match self {
            Self::UntilRemoved => "every agent's calls, until you remove it",
            Self::ThisAgent => "only the calls of the agent that staged it, until you remove it",
            Self::Session => {
                "only that agent's calls, while its session that staged it lasts (at most 12 hours)"
            }
            Self::ForAnHour => "every agent's calls, for one hour",
        }
    }

    /// The scope the person's socket receives.
    pub fn scope(self) -> crate::grants::GrantScope {
        crate::grants::GrantScope {
            this_agent: self == Self::ThisAgent,
            session: self == Self::Session,
            for_secs: (self == Self::ForAnHour).then_some(3600),
            ..Default::default()
        }
    }
}

/// What the terminal loop must do after an input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Send this decision over the person's socket, then report the answer with
    /// [`Model::decided`].
    Send(Decision),
    /// Ask the daemon for this action's prompt with its secrets revealed
    /// (`gate show ID --reveal`), then hand the answer to [`Model::revealed`]. Decides
    /// nothing.
    Reveal(u64),
    /// Let the person edit this action's arguments in their editor, then approve the
    /// edited call ([`crate::edits`]); report the answer with [`Model::decided`].
    Edit(u64),
    /// Leave the screen. Nothing is decided.
    Quit,
}

/// What the screen is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Moving over the list.
    Browse,
    /// Typing the reason for rejecting `ids`.
    Reason {
        /// The actions to reject.
        ids: Vec<u64>,
        /// The reason typed so far.
        input: String,
    },
    /// Showing a decision before it is sent; only `y` sends it.
    Confirm(Decision),
}

/// One line of the list: a group's heading or an action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line {
    /// The heading of group `n` of [`Model::groups`].
    Group(usize),
    /// Row `n` of [`Model::rows`].
    Row(usize),
}

/// Actions of one agent, server and kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The agent, as a label.
    pub agent: String,
    /// The server, in brackets.
    pub server: String,
    /// The kind, as a label.
    pub kind: String,
    /// How many actions it holds.
    pub len: usize,
}

/// A rule the person enabled from this screen, and how to take it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleNotice {
    /// The kind, as a label.
    pub kind: String,
    /// The server, in brackets.
    pub server: String,
    /// The command that removes the rule.
    pub revoke: String,
}

/// The whole screen's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model {
    /// The actions in display order: grouped by agent, server and kind, groups ordered by
    /// their oldest action, each group oldest first.
    pub rows: Vec<Row>,
    /// The groups, in display order.
    pub groups: Vec<Group>,
    /// The list's lines: each group's heading followed by its rows.
    pub lines: Vec<Line>,
    /// For each row, its index in [`Model::lines`].
    pub line_of_row: Vec<usize>,
    /// The row under the cursor (an index into [`Model::rows`]; 0 when empty).
    pub cursor: usize,
    /// Rows selected with space, by ledger id.
    pub selected: BTreeSet<u64>,
    /// Rows the person skipped, by ledger id: left pending, marked on the screen.
    pub skipped: BTreeSet<u64>,
    /// What the screen is doing.
    pub mode: Mode,
    /// The daemon's last answer, or the screen's own word on the last key, line by line.
    pub status: Vec<String>,
    /// The last rule enabled from this screen.
    pub rule: Option<RuleNotice>,
    /// The questions servers ask during the person's sends, one line each, as the daemon
    /// rendered them (answered with `gate answer`).
    pub questions: Vec<String>,
    /// Rows a page moves by (the terminal loop sets it from the list's height).
    pub page: usize,
    /// How far the approval prompt is scrolled, in lines (back to 0 when the cursor moves).
    pub detail_scroll: u16,
    /// The widest state among the rows, in chars, for the list's column.
    pub state_width: usize,
    /// The widest rule column among the rows, in chars.
    pub rule_width: usize,
    /// Set when a refresh moved the cursor to another action because the one under it
    /// stopped waiting: the next decision key only says so, since the person may have
    /// meant the action that left.
    pub moved: Option<(u64, Option<u64>)>,
    /// The actions the person decided on this screen: one of them leaving the queue moved
    /// the cursor as the person expects, so the next key acts on what the screen shows.
    pub decided_here: BTreeSet<u64>,
    /// The prompt of one action with its secrets revealed (`v`), by ledger id: shown in
    /// place of its redacted prompt until the cursor leaves it or `v` hides it again.
    pub revealed: Option<(u64, String)>,
}

/// The most actions listed by name in a confirmation; more are counted.
pub const MAX_CONFIRM_LISTED: usize = 12;

/// The longest reason the input line takes, in chars.
pub const MAX_REASON_CHARS: usize = 500;

impl Model {
    /// A screen over `queue`, cursor on the first row.
    pub fn new(queue: Queue) -> Self {
        let mut model = Self {
            rows: Vec::new(),
            groups: Vec::new(),
            lines: Vec::new(),
            line_of_row: Vec::new(),
            cursor: 0,
            selected: BTreeSet::new(),
            skipped: BTreeSet::new(),
            mode: Mode::Browse,
            status: Vec::new(),
            rule: None,
            questions: Vec::new(),
            page: 10,
            detail_scroll: 0,
            state_width: 0,
            rule_width: 0,
            moved: None,
            decided_here: BTreeSet::new(),
            revealed: None,
        };
        model.lay_out(queue);
        model
    }

    /// Groups and orders `queue`'s rows.
    fn lay_out(&mut self, queue: Queue) {
        self.questions = queue.questions;
        let mut rows = queue.rows;
        rows.sort_by_key(|r| r.id);
        // Groups in order of their oldest action: the first row seen of each key.
        let mut index: HashMap<(&str, &str, &str), usize> = HashMap::new();
        let mut members: Vec<Vec<usize>> = Vec::new();
        for (n, row) in rows.iter().enumerate() {
            let key = (row.agent.as_str(), row.server.as_str(), row.kind.as_str());
            let group = *index.entry(key).or_insert_with(|| {
                members.push(Vec::new());
                members.len() - 1
            });
            members[group].push(n);
        }
        let mut slots: Vec<Option<Row>> = rows.into_iter().map(Some).collect();
        let mut ordered = Vec::with_capacity(slots.len());
        let mut groups = Vec::with_capacity(members.len());
        let mut lines = Vec::with_capacity(slots.len() + members.len());
        let mut line_of_row = Vec::with_capacity(slots.len());
        for (g, member) in members.iter().enumerate() {
            let first = slots[member[0]].as_ref().expect("each row is in one group");
            groups.push(Group {
                agent: first.agent.clone(),
                server: first.server.clone(),
                kind: first.kind.clone(),
                len: member.len(),
            });
            lines.push(Line::Group(g));
            for &n in member {
                line_of_row.push(lines.len());
                lines.push(Line::Row(ordered.len()));
                ordered.push(slots[n].take().expect("each row is in one group"));
            }
        }
        self.state_width = ordered
            .iter()
            .map(|r| r.state.chars().count())
            .max()
            .unwrap_or(0);
        self.rule_width = ordered
            .iter()
            .map(|r| r.rule.chars().count())
            .max()
            .unwrap_or(0);
        self.rows = ordered;
        self.groups = groups;
        self.lines = lines;
        self.line_of_row = line_of_row;
    }

    /// The row under the cursor.
    pub fn current(&self) -> Option<&Row> {
        self.rows.get(self.cursor)
    }

    /// The row with ledger id `id`.
    pub fn row(&self, id: u64) -> Option<&Row> {
        self.rows.iter().find(|r| r.id == id)
    }

    /// The actions a decision is about: the selection if there is one, else the row
    /// under the cursor.
    fn targets(&self) -> Vec<u64> {
        if self.selected.is_empty() {
            self.current().map(|r| vec![r.id]).unwrap_or_default()
        } else {
            self.selected.iter().copied().collect()
        }
    }

    /// Replace the rows with the daemon's latest, keeping the cursor on the same action
    /// (or where it was, if that action is gone) and forgetting selections of actions that
    /// no longer wait. A decision being typed or confirmed about an action that was decided
    /// elsewhere meanwhile is dropped, with a word saying so: nothing is sent.
    pub fn refresh(&mut self, queue: Queue) {
        let at = self.current().map(|r| r.id);
        let position = self.cursor;
        self.lay_out(queue);
        let present: BTreeSet<u64> = self.rows.iter().map(|r| r.id).collect();
        self.selected.retain(|id| present.contains(id));
        self.skipped.retain(|id| present.contains(id));
        let decided_here = std::mem::take(&mut self.decided_here);
        self.cursor = at
            .and_then(|id| self.rows.iter().position(|r| r.id == id))
            .unwrap_or_else(|| position.min(self.rows.len().saturating_sub(1)));
        let now = self.current().map(|r| r.id);
        if now != at {
            self.detail_scroll = 0;
            self.revealed = None;
            if let Some(gone) = at.filter(|gone| !decided_here.contains(gone)) {
                self.moved = Some((gone, now));
            }
        }
        // A decision the daemon refused leaves its action waiting, still the person's own.
        self.decided_here = decided_here
            .into_iter()
            .filter(|id| present.contains(id))
            .collect();
        let asked: Vec<u64> = match &self.mode {
            Mode::Browse => Vec::new(),
            Mode::Reason { ids, .. } => ids.clone(),
            Mode::Confirm(Decision::Approve { ids } | Decision::Reject { ids, .. }) => ids.clone(),
            Mode::Confirm(Decision::AllowKind { id, .. }) => vec![*id],
        };
        let gone = asked.iter().filter(|id| !present.contains(id)).count();
        if gone > 0 {
            self.mode = Mode::Browse;
            self.status = vec![format!(
                "{gone} of the actions you were deciding no longer wait(s): decided elsewhere or applied by a rule. Nothing was sent; look again."
            )];
        }
    }

    /// Apply one input. Returns what the terminal loop must do, if anything.
    ///
    /// Only these yield a decision: `a` (approve the row under the cursor; with a
    /// selection, ask to confirm it first), `Enter` in the reason line (the same for a
    /// rejection), `y` on a confirmation. A resize, the end of input and every other key
    /// decide nothing, and so does the first decision key after a refresh moved the
    /// cursor off an action that stopped waiting.
    pub fn input(&mut self, input: Input) -> Option<Command> {
        let key = match input {
            Input::Resize => return None,
            Input::End => return Some(Command::Quit),
            Input::Key(key) => key,
        };
        match std::mem::replace(&mut self.mode, Mode::Browse) {
            Mode::Browse => self.browse(key),
            Mode::Reason { ids, input } => self.reason(key, ids, input),
            Mode::Confirm(decision) => self.confirm(key, decision),
        }
    }

    fn browse(&mut self, key: Key) -> Option<Command> {
        if let Some((gone, now)) = self.moved.take()
            && self.selected.is_empty()
            && matches!(key, Key::Char('a' | 'r' | 'A'))
        {
            self.status = vec![match now {
                Some(now) => format!(
                    "#{gone} no longer waits (decided elsewhere or applied by a rule); the cursor is now on #{now}. Nothing was sent; press the key again to decide #{now}."
                ),
                None => format!("#{gone} no longer waits. Nothing was sent."),
            }];
            return None;
        }
        let at = self.cursor;
        let command = self.browse_key(key);
        if self.cursor != at {
            // Moving on hides what was revealed: secrets are shown for one action at a time.
            self.detail_scroll = 0;
            self.revealed = None;
        }
        command
    }

    fn browse_key(&mut self, key: Key) -> Option<Command> {
        let last = self.rows.len().saturating_sub(1);
        match key {
            Key::Char(']') => self.detail_scroll = self.detail_scroll.saturating_add(5),
            Key::Char('[') => self.detail_scroll = self.detail_scroll.saturating_sub(5),
            Key::Char('q') | Key::Esc | Key::Interrupt => return Some(Command::Quit),
            Key::Char('v') => {
                let (id, hidden) = self.current().map(|r| (r.id, r.hidden))?;
                if self.revealed.take().is_some() {
                    self.status = vec![format!("#{id}: its secrets are hidden again.")];
                } else if hidden == 0 {
                    self.status = vec![format!("#{id}: nothing is redacted in its prompt.")];
                } else {
                    return Some(Command::Reveal(id));
                }
            }
            Key::Up | Key::Char('k') => self.cursor = self.cursor.saturating_sub(1),
            Key::Down | Key::Char('j') => self.cursor = (self.cursor + 1).min(last),
            Key::PageUp => self.cursor = self.cursor.saturating_sub(self.page.max(1)),
            Key::PageDown => self.cursor = (self.cursor + self.page.max(1)).min(last),
            Key::Home | Key::Char('g') => self.cursor = 0,
            Key::End | Key::Char('G') => self.cursor = last,
            Key::Char(' ') => {
                if let Some(id) = self.current().map(|r| r.id) {
                    if !self.selected.remove(&id) {
                        self.selected.insert(id);
                    }
                    self.cursor = (self.cursor + 1).min(last);
                }
            }
            Key::Char('s') => {
                if let Some(id) = self.current().map(|r| r.id) {
                    self.skipped.insert(id);
                    self.status = vec![format!("#{id} skipped: it still waits.")];
                    self.cursor = (self.cursor + 1).min(last);
                }
            }
            Key::Char('a') => {
                let ids = self.targets();
                if self.selected.is_empty() && ids.len() == 1 {
                    return Some(Command::Send(Decision::Approve { ids }));
                }
                if !ids.is_empty() {
                    self.mode = Mode::Confirm(Decision::Approve { ids });
                }
            }
            Key::Char('e') => {
                if !self.selected.is_empty() {
                    self.status = vec![
                        "An edit changes one call: clear the selection (space) and press e on the action."
                            .to_owned(),
                    ];
                } else if let Some(row) = self.current() {
                    return Some(Command::Edit(row.id));
                }
            }
            Key::Char('r') => {
                let ids = self.targets();
                if !ids.is_empty() {
                    self.mode = Mode::Reason {
                        ids,
                        input: String::new(),
                    };
                }
            }
            Key::Char('A') => {
                if let Some(row) = self.current() {
                    if row.revoke.is_some() {
                        self.mode = Mode::Confirm(Decision::AllowKind {
                            id: row.id,
                            reach: Reach::default(),
                        });
                    } else {
                        self.status = vec![format!(
                            "#{}: its kind cannot be allowed as a whole (its server does not mark it safe to repeat, or it depends on a rejected action); decide it on its own.",
                            row.id
                        )];
                    }
                }
            }
            _ => {}
        }
        None
    }

    fn reason(&mut self, key: Key, ids: Vec<u64>, mut input: String) -> Option<Command> {
        match key {
            Key::Esc | Key::Interrupt => {
                self.status = vec!["Not rejected: nothing was sent.".to_owned()];
                return None;
            }
            Key::Enter => {
                let reason = Some(input.trim().to_owned()).filter(|r| !r.is_empty());
                let single = self.selected.is_empty() && ids.len() == 1;
                let decision = Decision::Reject { ids, reason };
                if single {
                    return Some(Command::Send(decision));
                }
                self.mode = Mode::Confirm(decision);
                return None;
            }
            Key::Backspace => {
                input.pop();
            }
            Key::Char(c) if !c.is_control() && input.chars().count() < MAX_REASON_CHARS => {
                input.push(c);
            }
            _ => {}
        }
        self.mode = Mode::Reason { ids, input };
        None
    }

    fn confirm(&mut self, key: Key, decision: Decision) -> Option<Command> {
        match (key, decision) {
            (Key::Char('y'), decision) => Some(Command::Send(decision)),
            // Allowing a kind: a key that chooses how far the rule reaches stays on the
            // confirmation, showing the new reach; only `y` sends it.
            (key, Decision::AllowKind { id, .. }) if Reach::of_key(key).is_some() => {
                let reach = Reach::of_key(key).unwrap_or_default();
                self.mode = Mode::Confirm(Decision::AllowKind { id, reach });
                None
            }
            _ => {
                self.status = vec!["Not sent: nothing was decided.".to_owned()];
                None
            }
        }
    }

    /// Report the daemon's answer to a decision the screen sent: its words become the
    /// status; decided actions leave the selection; an enabled rule is shown with the way
    /// to take it back.
    pub fn decided(&mut self, decision: &Decision, ok: bool, text: &str) {
        self.status = text
            .lines()
            .map(|l| neutralize_controls(l).into_string())
            .collect();
        match decision {
            Decision::Approve { ids } | Decision::Reject { ids, .. } => {
                for id in ids {
                    self.selected.remove(id);
                    self.decided_here.insert(*id);
                }
            }
            Decision::AllowKind { id, .. } => {
                self.decided_here.insert(*id);
                if ok && let Some(row) = self.row(*id) {
                    self.rule = Some(RuleNotice {
                        kind: row.kind.clone(),
                        server: row.server.clone(),
                        revoke: row.revoke.clone().unwrap_or_default(),
                    });
                }
            }
        }
    }

    /// Report the daemon's answer to [`Command::Reveal`]: the prompt of `id` with its secrets
    /// revealed, shown while the cursor stays on it. An answer about an action the cursor
    /// has left is dropped.
    pub fn revealed(&mut self, id: u64, ok: bool, text: &str) {
        if self.current().map(|r| r.id) != Some(id) {
            return;
        }
        if ok {
            self.revealed = Some((id, text.to_owned()));
            self.status = vec![format!(
                "#{id}: secrets revealed: the prompt shows the real arguments, as approving sends them; v or moving hides them."
            )];
        } else {
            self.status = text
                .lines()
                .map(|l| neutralize_controls(l).into_string())
                .collect();
        }
    }

    /// The daemon could not be reached: say so, keep the screen.
    /// Say `text` in the status lines (an edit given up, with why); decides nothing.
    pub fn say(&mut self, text: &str) {
        self.status = text
            .lines()
            .map(|l| neutralize_controls(l).into_string())
            .collect();
    }

    /// Report that the daemon could not be reached.
    pub fn unreachable(&mut self, error: &str) {
        self.status = vec![
            neutralize_controls(error).into_string(),
            "Nothing is decided while the gate does not answer; q leaves.".to_owned(),
        ];
    }
}

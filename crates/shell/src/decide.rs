//! Who answers the shell's question: a script given in advance, or a person at a terminal.
//!
//! Both sit behind [`Decider`]. The rule they share is that only an explicit answer decides:
//! a decider that has nothing to say returns [`Decision::Skip`], never
//! [`Decision::Approve`]. Skipping is always safe, because a skipped action simply stays
//! pending and nothing is sent.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io::{self, BufRead, Write};

use kernel::LedgerId;
use prompt_sanitize::Sanitized;

/// A person's answer to one pending action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Decision {
    /// Apply it now.
    Approve,
    /// Drop it: nothing is sent, ever.
    Reject,
    /// Leave it pending and move on; nothing is sent.
    Skip,
    /// Enable an auto-approval rule for this action's kind on its gatekeeper. The rule is
    /// the person's key; an action applies automatically only if its driver also marked it
    /// auto-approvable, and only when no earlier action of the gatekeeper waits for a person.
    ApproveAllOfKind,
}

impl Decision {
    /// The word a person types for it, and the transcript shows.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Approve => "approve",
            Self::Reject => "reject",
            Self::Skip => "skip",
            Self::ApproveAllOfKind => "all-of-kind",
        }
    }

    /// Parses an explicit answer: `a`/`approve`, `r`/`reject`, `s`/`skip`, `k`/`all-of-kind`
    /// (case-insensitive, surrounding whitespace ignored). Anything else is `None`.
    pub fn parse(answer: &str) -> Option<Self> {
        match answer.trim().to_ascii_lowercase().as_str() {
            "a" | "approve" => Some(Self::Approve),
            "r" | "reject" => Some(Self::Reject),
            "s" | "skip" => Some(Self::Skip),
            "k" | "all-of-kind" => Some(Self::ApproveAllOfKind),
            _ => None,
        }
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Answers the shell's question about one action.
///
/// The shell has already written the action's prompt to `out` when it calls
/// [`decide`](Self::decide). The decider may write to `out` too (its question, or the answer
/// it chose, so a transcript shows it). It must return [`Decision::Skip`] whenever it has no
/// explicit answer.
pub trait Decider {
    /// The decision on action `id`, whose rendered prompt is `prompt`.
    fn decide(
        &mut self,
        id: LedgerId,
        prompt: &Sanitized,
        out: &mut dyn Write,
    ) -> io::Result<Decision>;

    /// Whether to revert action `id`, already applied, whose rendered prompt is `prompt`
    /// (the caller has written it to `out`). `true` only on an explicit yes: a decider with
    /// nothing to say keeps the action, as this default does, saying so on `out`.
    fn revert(
        &mut self,
        id: LedgerId,
        prompt: &Sanitized,
        out: &mut dyn Write,
    ) -> io::Result<bool> {
        let _ = (id, prompt);
        writeln!(out, "  > keep (no answer)")?;
        Ok(false)
    }
}

/// Decisions given in advance: by ledger id, or as a queue taken in order.
///
/// An action the script says nothing about is skipped. Each answer is echoed to the output as
/// `> approve (scripted)`, so a transcript reads like a session at the terminal.
#[derive(Debug, Clone, Default)]
pub struct Scripted {
    by_id: HashMap<LedgerId, Decision>,
    queue: VecDeque<Decision>,
}

impl Scripted {
    /// Decisions keyed by ledger id, e.g. `[(LedgerId(3), Decision::Approve)]`. Each is used
    /// once; ids not listed are skipped.
    pub fn by_id(decisions: impl IntoIterator<Item = (LedgerId, Decision)>) -> Self {
        Self {
            by_id: decisions.into_iter().collect(),
            queue: VecDeque::new(),
        }
    }

    /// Decisions taken in the order the shell asks; once they run out, everything is skipped.
    pub fn in_order(decisions: impl IntoIterator<Item = Decision>) -> Self {
        Self {
            by_id: HashMap::new(),
            queue: decisions.into_iter().collect(),
        }
    }

    /// Adds decisions keyed by id (replacing earlier ones for the same id), for the next
    /// review.
    pub fn add(&mut self, decisions: impl IntoIterator<Item = (LedgerId, Decision)>) {
        self.by_id.extend(decisions);
    }

    /// Whether every scripted decision has been used.
    pub fn is_exhausted(&self) -> bool {
        self.by_id.is_empty() && self.queue.is_empty()
    }
}

impl Decider for Scripted {
    fn decide(
        &mut self,
        id: LedgerId,
        _prompt: &Sanitized,
        out: &mut dyn Write,
    ) -> io::Result<Decision> {
        let decision = self
            .by_id
            .remove(&id)
            .or_else(|| self.queue.pop_front())
            .unwrap_or(Decision::Skip);
        writeln!(out, "  > {decision} (scripted)")?;
        Ok(decision)
    }

    /// A script holds no reverts (lectures revert in their own code): it keeps the action.
    fn revert(
        &mut self,
        _id: LedgerId,
        _prompt: &Sanitized,
        out: &mut dyn Write,
    ) -> io::Result<bool> {
        writeln!(out, "  > keep (scripted)")?;
        Ok(false)
    }
}

/// A person at a terminal: asks on `out`, reads one line at a time from `input`.
///
/// Only `a`/`approve`, `r`/`reject`, `s`/`skip` or `k`/`all-of-kind` decide (and, asked
/// whether to revert, `y`/`yes` or `n`/`no`). Any other line (an empty line, a stray key,
/// bytes that are not UTF-8) is answered with the list of choices and asked again. At the
/// end of input every remaining action is skipped and nothing is reverted; nothing is
/// approved.
#[derive(Debug)]
pub struct Interactive<R> {
    input: R,
    ended: bool,
    echo: bool,
}

impl<R: BufRead> Interactive<R> {
    /// A decider reading answers from `input` (stdin, in practice).
    pub fn new(input: R) -> Self {
        Self {
            input,
            ended: false,
            echo: false,
        }
    }

    /// Write each answer read back to the output, ending its line. Use it when the input is
    /// not a terminal (a pipe or a file), which does not echo what it "typed".
    pub fn echo(mut self, on: bool) -> Self {
        self.echo = on;
        self
    }

    /// Asks `question` until a line parses (`parse`); at the end of input answers
    /// `at_end`, whose word `at_end_word` the output shows. `choices` lists what may be
    /// typed, for the line that re-asks.
    fn ask<T>(
        &mut self,
        question: &str,
        choices: &str,
        parse: impl Fn(&str) -> Option<T>,
        (at_end, at_end_word): (T, &str),
        out: &mut dyn Write,
    ) -> io::Result<T> {
        loop {
            if self.ended {
                writeln!(out, "  > {at_end_word} (end of input)")?;
                return Ok(at_end);
            }
            write!(out, "  {question} ")?;
            out.flush()?;
            // Bytes, not `read_line`: a line that is not UTF-8 (a stray key, a pasted
            // binary) is asked again, like any other answer that is not a choice.
            let mut bytes = Vec::new();
            if self.input.read_until(b'\n', &mut bytes)? == 0 {
                writeln!(out)?;
                self.ended = true;
                continue;
            }
            let line = String::from_utf8_lossy(&bytes);
            if self.echo {
                writeln!(
                    out,
                    "{}",
                    prompt_sanitize::neutralize_controls(line.trim_end())
                )?;
            }
            if std::str::from_utf8(&bytes).is_err() {
                writeln!(
                    out,
                    "  that answer was not readable text; please type {choices}; nothing was decided"
                )?;
                continue;
            }
            match parse(&line) {
                Some(answer) => return Ok(answer),
                None => writeln!(out, "  please type {choices}; nothing was decided")?,
            }
        }
    }
}

impl<R: BufRead> Decider for Interactive<R> {
    fn decide(
        &mut self,
        id: LedgerId,
        _prompt: &Sanitized,
        out: &mut dyn Write,
    ) -> io::Result<Decision> {
        self.ask(
            &format!("decide {id}: [a]pprove, [r]eject, [s]kip, all of this [k]ind?"),
            "a, r, s or k (approve, reject, skip, all-of-kind)",
            Decision::parse,
            (Decision::Skip, Decision::Skip.as_str()),
            out,
        )
    }

    /// Asks `revert {id}: [y]es, [n]o?`; only `y`/`yes` reverts, `n`/`no` keeps, anything
    /// else is asked again, and the end of input keeps the action.
    fn revert(
        &mut self,
        id: LedgerId,
        _prompt: &Sanitized,
        out: &mut dyn Write,
    ) -> io::Result<bool> {
        self.ask(
            &format!("revert {id}: [y]es, [n]o?"),
            "y or n (revert, keep)",
            |line| match line.trim().to_ascii_lowercase().as_str() {
                "y" | "yes" => Some(true),
                "n" | "no" => Some(false),
                _ => None,
            },
            (false, "keep"),
            out,
        )
    }
}

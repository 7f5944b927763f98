//! The lecture runner: what a lecture is, the context it writes its transcript into, and
//! the one shared list of snapshot filters.
//!
//! A lecture is a [`Lecture`] value: a name, a title, a one-line summary and an async
//! function that plays the agent (through sessions) and the person (through the shell) and
//! writes what happens to a [`Context`]. The runner knows nothing about any particular
//! lecture; the table in the crate root lists them.
//!
//! Transcripts must be the same on every run, because they are snapshot-tested: lectures
//! use [`kernel::StepClock`] and sequential ids, and the one measured duration (a turn's
//! wall time) is printed as `turn ended in N.NNN ms` and replaced by
//! [`snapshot_filters`]. Nothing else a lecture prints may depend on time or on the
//! machine. (With `--db` a desk prints one more line, naming its file; snapshots are
//! taken in memory.)

use std::fmt;
use std::future::Future;
use std::io::{self, Write};
use std::pin::Pin;
use std::time::Duration;

use kernel::LedgerId;
use shell::{Decider, Decision, ReviewSummary, Scripted, Shell};

use crate::DbPlan;

/// What a lecture's `run` function returns: its body, boxed so lectures fit in one table.
pub type LectureFuture<'a> = Pin<Box<dyn Future<Output = anyhow::Result<()>> + 'a>>;

/// One lecture: one design decision of the gate, shown at work.
#[derive(Clone, Copy)]
pub struct Lecture {
    /// The name on the command line: `ex05`.
    pub name: &'static str,
    /// A short title: "two keys and the drain order".
    pub title: &'static str,
    /// One line for `--list`: what the lecture shows.
    pub summary: &'static str,
    /// Plays the lecture, writing its transcript to the context.
    pub run: for<'a, 'b> fn(&'a mut Context<'b>) -> LectureFuture<'a>,
}

impl fmt::Debug for Lecture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lecture")
            .field("name", &self.name)
            .field("title", &self.title)
            .finish_non_exhaustive()
    }
}

/// Where a lecture writes its transcript, and who plays the person at the terminal.
///
/// `Context` is an [`io::Write`], so a lecture writes with `writeln!(cx, ...)`. In the
/// default mode every review is answered by the script the lecture wrote; with
/// `--interactive` a person at the terminal answers instead, and the script is ignored.
/// Every line written to it, by the lecture or by the shell, is wrapped to
/// [`shell::WIDTH`] ([`shell::wrap`]).
pub struct Context<'a> {
    out: Wrapped<'a>,
    person: Option<Box<dyn Decider + 'a>>,
    db: Option<DbPlan>,
}

impl<'a> Context<'a> {
    /// A context writing to `out`, with the lectures' scripts answering every review.
    pub fn scripted(out: &'a mut dyn Write) -> Self {
        Self {
            out: Wrapped::new(out),
            person: None,
            db: None,
        }
    }

    /// A context writing to `out`, with `person` answering every review instead of the
    /// lectures' scripts.
    pub fn interactive(out: &'a mut dyn Write, person: Box<dyn Decider + 'a>) -> Self {
        Self {
            out: Wrapped::new(out),
            person: Some(person),
            db: None,
        }
    }

    /// The same context with every desk keeping its records in a SQLite file of `plan`
    /// (`--db`) instead of in memory.
    pub fn with_db(mut self, plan: DbPlan) -> Self {
        self.db = Some(plan);
        self
    }

    /// The `--db` plan, with the files desks have opened so far; `None` in memory.
    pub fn db(&self) -> Option<&DbPlan> {
        self.db.as_ref()
    }

    pub(crate) fn db_mut(&mut self) -> Option<&mut DbPlan> {
        self.db.as_mut()
    }

    /// Whether a person, not a script, answers reviews.
    pub fn is_interactive(&self) -> bool {
        self.person.is_some()
    }

    /// Writes a section heading: a blank line, then `## title`.
    pub fn section(&mut self, title: &str) -> io::Result<()> {
        writeln!(self.out)?;
        writeln!(self.out, "## {title}")
    }

    /// Writes a section heading that says what the script does (`scripted`) in a scripted
    /// run, and what is asked (`interactive`) when a person answers instead: a heading
    /// never claims a decision the person did not take.
    pub fn section_for(&mut self, scripted: &str, interactive: &str) -> io::Result<()> {
        let title = if self.is_interactive() {
            interactive
        } else {
            scripted
        };
        self.section(title)
    }

    /// Writes a line of narration that says what the script's person decides: as it is in
    /// a scripted run; marked as the script's plan in an interactive run, where the person
    /// at the terminal decides and may differ.
    pub fn narrate(&mut self, line: &str) -> io::Result<()> {
        if self.is_interactive() {
            writeln!(self.out, "(the script's plan; you decide below: {line})")
        } else {
            writeln!(self.out, "{line}")
        }
    }

    /// The decision `shell`'s person takes on `id`: the script's (`scripted`) in a scripted
    /// run, written nowhere; in an interactive run the action's card is shown and the person
    /// at the terminal is asked. Lectures call it for every decision outside a review.
    pub fn decision(
        &mut self,
        shell: &Shell,
        id: LedgerId,
        scripted: Decision,
    ) -> Result<Decision, shell::ShellError> {
        let Some(person) = self.person.as_mut() else {
            return Ok(scripted);
        };
        writeln!(
            self.out,
            "[{} is asked about {id}; the script would {scripted}]",
            shell.person()
        )?;
        let prompt = shell.prompt(id)?;
        writeln!(self.out, "{prompt}")?;
        Ok(person.decide(id, &prompt, &mut self.out)?)
    }

    /// Whether `shell`'s person reverts `id`, an applied action: the script's answer
    /// (`scripted`) in a scripted run, written nowhere; in an interactive run the action's
    /// card is shown and the person at the terminal is asked (only an explicit yes
    /// reverts). Lectures call it before every revert.
    pub fn revert_decision(
        &mut self,
        shell: &Shell,
        id: LedgerId,
        scripted: bool,
    ) -> Result<bool, shell::ShellError> {
        let Some(person) = self.person.as_mut() else {
            return Ok(scripted);
        };
        writeln!(
            self.out,
            "[{} is asked whether to revert {id}; the script would {}]",
            shell.person(),
            if scripted { "revert it" } else { "keep it" }
        )?;
        let prompt = shell.prompt(id)?;
        writeln!(self.out, "{prompt}")?;
        Ok(person.revert(id, &prompt, &mut self.out)?)
    }

    /// Writes one line of evidence: `  evidence: what = value`.
    pub fn evidence(&mut self, what: &str, value: impl fmt::Display) -> io::Result<()> {
        writeln!(self.out, "  evidence: {what} = {value}")
    }

    /// Writes the measured duration of an agent's turn in the one format the snapshot
    /// filter knows: `turn ended in N.NNN ms`.
    pub fn turn_duration(&mut self, elapsed: Duration) -> io::Result<()> {
        writeln!(
            self.out,
            "  turn ended in {:.3} ms",
            elapsed.as_secs_f64() * 1000.0
        )
    }

    /// Lets the person at `shell` review the open actions: with the lecture's `script`,
    /// or, in interactive mode, with the person at the terminal.
    pub async fn review(
        &mut self,
        shell: &Shell,
        script: Scripted,
    ) -> Result<ReviewSummary, shell::ShellError> {
        writeln!(self.out, "[{} opens the shell]", shell.person())?;
        match self.person.as_mut() {
            Some(person) => shell.review(person.as_mut(), &mut self.out).await,
            None => {
                let mut script = script;
                shell.review(&mut script, &mut self.out).await
            }
        }
    }
}

/// The writer under a [`Context`]: passes complete lines on, each wrapped to
/// [`shell::WIDTH`] by [`shell::wrap`], so no line of a transcript is wider, whoever wrote
/// it (the lecture, the shell or a person's decider). A line written in pieces is held until
/// it ends; a flush passes on what is held as it is (a question waiting for its answer).
struct Wrapped<'a> {
    inner: &'a mut dyn Write,
    line: Vec<u8>,
}

impl<'a> Wrapped<'a> {
    fn new(inner: &'a mut dyn Write) -> Self {
        Self {
            inner,
            line: Vec::new(),
        }
    }
}

impl Write for Wrapped<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut rest = buf;
        while let Some(end) = rest.iter().position(|b| *b == b'\n') {
            self.line.extend_from_slice(&rest[..end]);
            let line = std::mem::take(&mut self.line);
            let text = String::from_utf8_lossy(&line);
            writeln!(self.inner, "{}", shell::wrap(&text, shell::WIDTH))?;
            rest = &rest[end + 1..];
        }
        self.line.extend_from_slice(rest);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let held = std::mem::take(&mut self.line);
        self.inner.write_all(&held)?;
        self.inner.flush()
    }
}

impl Drop for Wrapped<'_> {
    fn drop(&mut self) {
        // What a lecture wrote without ending its line, if it never flushed; an error here
        // has nowhere to go.
        let _ = self.flush();
    }
}

impl Write for Context<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.out.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// Runs one lecture: its heading, then its body.
pub async fn run_lecture(lecture: &Lecture, cx: &mut Context<'_>) -> anyhow::Result<()> {
    let rule = "=".repeat(72);
    writeln!(cx, "{rule}")?;
    writeln!(cx, "{} · {}", lecture.name, lecture.title)?;
    writeln!(
        cx,
        "{}",
        shell::wrap_hanging(lecture.summary, shell::WIDTH, 0)
    )?;
    writeln!(cx, "{rule}")?;
    let desks_before = cx.db().map(|plan| plan.files().len());
    (lecture.run)(cx).await?;
    if let (Some(before), Some(plan)) = (desks_before, cx.db())
        && plan.files().len() == before
    {
        writeln!(cx)?;
        writeln!(
            cx,
            "[--db: this lecture opened no desk: its kernel and drivers stayed in memory, and it wrote no file]"
        )?;
    }
    cx.flush()?;
    Ok(())
}

/// What a person did, for narration: `approves`, `rejects`, `skips`, `allows all of its
/// kind`.
pub fn verb(decision: Decision) -> &'static str {
    match decision {
        Decision::Approve => "approves",
        Decision::Reject => "rejects",
        Decision::Skip => "skips",
        Decision::ApproveAllOfKind => "allows all of its kind",
    }
}

/// The lecture named `name`, if there is one.
pub fn find(name: &str) -> Option<&'static Lecture> {
    crate::LECTURES.iter().find(|l| l.name == name)
}

/// The valid names, for an error message: every lecture, then `all`.
pub fn valid_names() -> String {
    let mut names: Vec<&str> = crate::LECTURES.iter().map(|l| l.name).collect();
    names.push("all");
    names.join(", ")
}

/// How wide `--list` lines may be, in chars: the shell's width, [`shell::WIDTH`].
pub const LIST_WIDTH: usize = shell::WIDTH;

/// The `--list` text: each lecture's name and title on one line, then its summary, wrapped
/// at [`LIST_WIDTH`] and indented under the title.
pub fn list() -> String {
    let mut out = String::new();
    for lecture in crate::LECTURES {
        out.push_str(&format!("{}  {}\n", lecture.name, lecture.title));
        let mut line = String::new();
        for word in lecture.summary.split_whitespace() {
            if !line.is_empty() && 6 + line.chars().count() + 1 + word.chars().count() > LIST_WIDTH
            {
                out.push_str(&format!("      {line}\n"));
                line.clear();
            }
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
        if !line.is_empty() {
            out.push_str(&format!("      {line}\n"));
        }
    }
    out
}

/// The full transcript of one lecture, scripted, as the snapshot tests record it.
pub async fn transcript(name: &str) -> anyhow::Result<String> {
    let lecture = find(name)
        .ok_or_else(|| anyhow::anyhow!("unknown lecture {name:?}; valid: {}", valid_names()))?;
    let mut out = Vec::new();
    {
        let mut cx = Context::scripted(&mut out);
        run_lecture(lecture, &mut cx).await?;
    }
    Ok(String::from_utf8(out)?)
}

/// The one list of snapshot filters every transcript test uses: `(regex, replacement)`.
///
/// Only the measured turn duration varies between runs; everything else is made
/// deterministic at the source.
pub fn snapshot_filters() -> Vec<(&'static str, &'static str)> {
    vec![(
        r"turn ended in \d+\.\d{3} ms",
        "turn ended in [duration] ms",
    )]
}

//! Snapshot tests of every lecture's full transcript, and of the runner's command line.
//!
//! One named snapshot per lecture (`snapshots/transcripts__ex05.snap`), all taken with the
//! one shared filter list, [`lectures::snapshot_filters`]. A lecture added to
//! [`lectures::LECTURES`] is picked up here without touching this file; its snapshot must
//! be reviewed and committed (on CI, insta never writes snapshots, so a changed or missing
//! transcript fails).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::process::Command;

use lectures::{LECTURES, snapshot_filters, transcript};

#[tokio::test]
async fn every_lecture_matches_its_snapshot() {
    let mut failed = Vec::new();
    for lecture in LECTURES {
        let text = transcript(lecture.name)
            .await
            .unwrap_or_else(|e| panic!("lecture {} failed: {e:#}", lecture.name));
        let checked = catch_unwind(AssertUnwindSafe(|| {
            insta::with_settings!({
                filters => snapshot_filters(),
                description => format!("{} · {}", lecture.name, lecture.title),
                omit_expression => true,
                prepend_module_to_snapshot => false,
                snapshot_path => "snapshots",
            }, {
                insta::assert_snapshot!(format!("transcripts__{}", lecture.name), text);
            });
        }));
        if checked.is_err() {
            failed.push(lecture.name);
        }
    }
    assert!(
        failed.is_empty(),
        "transcripts changed: {failed:?}; review the .snap.new files (cargo insta review) if the change is intended"
    );
}

#[tokio::test]
async fn transcripts_are_the_same_on_every_run() {
    // Only the measured turn duration may differ; it is on a line of its own.
    let stable = |t: String| {
        t.lines()
            .filter(|l| !l.contains("turn ended in"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    for lecture in LECTURES {
        let first = transcript(lecture.name).await.expect("runs");
        let second = transcript(lecture.name).await.expect("runs");
        assert_eq!(
            stable(first),
            stable(second),
            "{} is not deterministic",
            lecture.name
        );
    }
}

#[test]
fn the_shared_filter_hides_the_measured_duration() {
    let mut out = Vec::new();
    lectures::Context::scripted(&mut out)
        .turn_duration(std::time::Duration::from_micros(1234))
        .expect("writes");
    let text = String::from_utf8(out).expect("utf-8");
    assert_eq!(text, "  turn ended in 1.234 ms\n");
    insta::with_settings!({ filters => snapshot_filters() }, {
        insta::assert_snapshot!(text.trim(), @"turn ended in [duration] ms");
    });
}

#[test]
fn every_lecture_has_a_docs_page() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for lecture in LECTURES {
        let page = root
            .join("docs/lectures")
            .join(format!("{}.md", lecture.name));
        assert!(page.is_file(), "missing {}", page.display());
    }
}

fn runner() -> Command {
    Command::new(env!("CARGO_BIN_EXE_lectures"))
}

#[test]
fn an_unknown_lecture_lists_the_valid_names_and_fails() {
    let output = runner().arg("nope").output().expect("runs");
    assert!(!output.status.success());
    assert!(output.stdout.is_empty(), "errors go to stderr");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unknown lecture \"nope\""), "{stderr}");
    for lecture in LECTURES {
        assert!(stderr.contains(lecture.name), "{stderr}");
    }
    assert!(stderr.contains("all"), "{stderr}");
}

#[test]
fn list_names_every_lecture_with_its_summary_in_lines_of_at_most_100_chars() {
    let output = runner().arg("--list").output().expect("runs");
    assert!(output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    let heads: Vec<&str> = stdout.lines().filter(|l| !l.starts_with(' ')).collect();
    assert_eq!(heads.len(), LECTURES.len(), "{stdout}");
    for (head, lecture) in heads.iter().zip(LECTURES) {
        assert_eq!(*head, format!("{}  {}", lecture.name, lecture.title));
    }
    let words: Vec<&str> = stdout.split_whitespace().collect();
    let text = words.join(" ");
    for lecture in LECTURES {
        let summary: Vec<&str> = lecture.summary.split_whitespace().collect();
        assert!(text.contains(&summary.join(" ")), "{stdout}");
    }
    for line in stdout.lines() {
        assert!(line.chars().count() <= shell::WIDTH, "{line}");
    }
}

#[test]
fn no_line_of_a_snapshot_or_of_the_list_is_wider_than_the_shells_width() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots");
    let mut texts: Vec<(String, String)> = std::fs::read_dir(&dir)
        .expect("the snapshots directory")
        .map(|entry| entry.expect("an entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "snap"))
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("utf-8");
            (path.display().to_string(), text)
        })
        .collect();
    assert_eq!(texts.len(), LECTURES.len(), "one snapshot per lecture");
    let list = runner().arg("--list").output().expect("runs");
    assert!(list.status.success());
    texts.push((
        "--list".to_owned(),
        String::from_utf8(list.stdout).expect("utf-8"),
    ));
    let mut wide = Vec::new();
    for (name, text) in &texts {
        for line in text.lines() {
            let width = line.chars().count();
            if width > shell::WIDTH {
                wide.push(format!("{name}: {width} chars: {line}"));
            }
        }
    }
    assert!(
        wide.is_empty(),
        "lines wider than {}:\n{}",
        shell::WIDTH,
        wide.join("\n")
    );
}

#[test]
fn interactive_end_of_input_approves_nothing() {
    // A stray answer, then end of input.
    let stdout = interactive("ex03", b"yes please\n");
    assert!(stdout.contains("please type a, r, s or k"), "{stdout}");
    assert!(stdout.contains("> skip (end of input)"), "{stdout}");
    assert!(
        stdout.contains("evidence: tracker calls after the review = 1"),
        "nothing may have been sent: {stdout}"
    );
}

/// Runs `lecture` with `--interactive` and the given answers on stdin; returns stdout.
fn interactive(lecture: &str, answers: &[u8]) -> String {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = runner()
        .args(["--interactive", lecture])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(answers)
        .expect("writes");
    let output = child.wait_with_output().expect("finishes");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[test]
fn interactive_headings_and_evidence_tell_what_the_person_did_not_what_the_script_would_have() {
    // The person skips everything: no heading or evidence may say anything was allowed
    // or approved, and every decision the script would take is asked.
    let ex05 = interactive("ex05", b"");
    for lie in [
        "The person allows addLabel on both trackers",
        "The person approves the manual gate",
        "after #3 was approved",
    ] {
        assert!(!ex05.contains(lie), "{lie:?} in:\n{ex05}");
    }
    assert!(
        ex05.contains("  evidence: rules enabled = none\n"),
        "an empty list is said, not left blank:\n{ex05}"
    );

    let ex06 = interactive("ex06", b"");
    for asked in [
        "[alice is asked about #1",
        "[bob is asked about #1",
        "[alice is asked about #2",
        "[alice is asked about #3",
        "[alice is asked about #4",
    ] {
        assert!(ex06.contains(asked), "{asked:?} not asked in:\n{ex06}");
    }
    for lie in ["[alice approves", "[bob approves", "after two approvals"] {
        assert!(!ex06.contains(lie), "{lie:?} in:\n{ex06}");
    }

    let ex08 = interactive("ex08", b"");
    assert!(ex08.contains("[alice is asked about #"), "{ex08}");
    assert!(
        !ex08.contains("[alice rejects"),
        "nobody rejects by themselves:\n{ex08}"
    );
    assert!(!ex08.contains("The person tries to approve"), "{ex08}");

    // The script's narration of a wiki review is marked as the script's plan.
    let ex10 = interactive("ex10", b"");
    assert!(
        !ex10.lines().any(|l| l.starts_with("ana rejects the page")),
        "{ex10}"
    );
    assert!(ex10.contains("(the script's plan; you decide below: ana rejects the page"));

    // Nothing was applied, so no revert is asked or attempted, and nothing says one was.
    for lecture in ["ex11", "ex12"] {
        let text = interactive(lecture, b"");
        for lie in [
            "[ana asks the kernel to revert",
            "## h1 · revert an append ·",
            "## r1 · revert an append after bob trashed the page ·",
            "after reverting",
            "approved in reverse order ·",
            "a child page approved before its parent ·",
            "after ana approved",
            "once the rename was rejected",
            "blocked by reverted",
            "[bob, another person, edits page 200",
        ] {
            assert!(!text.contains(lie), "{lecture}: {lie:?} in:\n{text}");
        }
        assert!(
            text.contains("is not asked to revert #2: it is pending, never applied"),
            "{lecture}:\n{text}"
        );
    }

    // Every action approved, every revert declined: each revert is asked, none is done.
    let approve_then_keep = b"a\nn\n".repeat(100);
    for (lecture, asked) in [("ex11", 4), ("ex12", 6)] {
        let text = interactive(lecture, &approve_then_keep);
        assert_eq!(
            text.matches("[ana is asked whether to revert #").count(),
            asked,
            "{lecture}:\n{text}"
        );
        assert_eq!(
            text.matches(": [y]es, [n]o? n\n").count(),
            asked,
            "{lecture}:\n{text}"
        );
        assert_eq!(
            text.matches("  [ana keeps #").count(),
            asked,
            "{lecture}:\n{text}"
        );
        assert!(
            !text.contains("[ana asks the kernel to revert"),
            "{lecture}:\n{text}"
        );
        assert!(!text.contains("  reverted #"), "{lecture}:\n{text}");
    }
}

#[test]
fn rust_log_shows_the_kernels_events_on_stderr_and_nothing_by_default() {
    let quiet = runner().arg("ex06").output().expect("runs");
    assert!(quiet.status.success());
    assert!(
        quiet.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&quiet.stderr)
    );
    let logged = runner()
        .arg("ex06")
        .env("RUST_LOG", "info")
        .output()
        .expect("runs");
    assert!(logged.status.success());
    let stderr = String::from_utf8_lossy(&logged.stderr);
    assert!(stderr.contains("action applied"), "{stderr}");
    assert!(stderr.contains("apply failed"), "{stderr}");
    // The transcript is the same with or without logging: events go to stderr only.
    assert_eq!(
        String::from_utf8_lossy(&logged.stdout)
            .lines()
            .filter(|l| !l.contains("turn ended in"))
            .collect::<Vec<_>>(),
        String::from_utf8_lossy(&quiet.stdout)
            .lines()
            .filter(|l| !l.contains("turn ended in"))
            .collect::<Vec<_>>()
    );
}

//! Questions a downstream server asks during a person's approved send: an elicitation
//! goes to the person (`gate pending`, `gate show`, `gate answer`), a sampling request is
//! declined, an unanswered question is declined after its wait, and every exchange is in
//! the ledger with its action. A real `gate serve` in front of the fixture server in its
//! rich mode (`elicit_write`, `sample_write`).

#[path = "support/daemon.rs"]
mod daemon;
#[path = "support/fixture.rs"]
mod fixture;

use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::json;

use daemon::{CODER_TOKEN, Gate, action_id, call, me, text};

/// A daemon over the rich fixture whose server may ask questions (`forward_elicitation`,
/// `forward_sampling`), with `extra` lines in its `[[server]]` table.
fn asking_gate(name: &str, extra: &str) -> Gate {
    let mut gate = Gate::start_with_env(name, "byo", &[("MCP_FIXTURE_RICH", "1")]);
    gate.reconfigure(|text| {
        text.replace(
            "trust = \"byo\"",
            &format!(
                "trust = \"byo\"\nforward_elicitation = true\nforward_sampling = true\n{extra}"
            ),
        )
    });
    gate
}

fn out(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Stage a call of `tool` as the coder and return its action id.
async fn staged(gate: &Gate, tool: &str) -> u64 {
    let agent = gate.agent(CODER_TOKEN).await;
    action_id(&text(&call(agent.peer(), tool, json!({})).await))
}

/// Wait until `gate pending` shows a question, and return what it says.
fn pending_question(gate: &Gate) -> String {
    let started = Instant::now();
    loop {
        let pending = out(&gate.person(&["pending"]));
        if pending.contains("asks a question") {
            return pending;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no question appeared: {pending}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Approve action `id` as the person in a thread of its own; once its server's question
/// shows in `gate pending`, run `meanwhile` with what that says (the person answers there),
/// then check the approval returned successfully.
fn approve_answering(gate: &Gate, id: u64, meanwhile: impl FnOnce(&str)) {
    let shown_id = id.to_string();
    std::thread::scope(|scope| {
        let approving = scope.spawn(|| gate.person(&["approve", &shown_id]));
        meanwhile(&pending_question(gate));
        let approved = approving.join().expect("approve returns");
        assert!(approved.status.success(), "{}", out(&approved));
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_during_a_send_reaches_the_person_who_answers_it_with_gate_answer() {
    let gate = asking_gate("answered", "");
    let id = staged(&gate, "fixture__elicit_write").await;
    let shown_id = id.to_string();
    approve_answering(&gate, id, |pending| {
        assert!(
            pending.contains(&format!("#{id}: its server `fixture` asks a question"))
                && pending.contains("«Which name and how many copies?»")
                && pending.contains(&format!(
                    "gate answer {id} --accept '{{\"copies\":1,\"name\":\"...\"}}'"
                )),
            "{pending}"
        );
        let shown = out(&gate.person(&["show", &shown_id]));
        assert!(
            shown.contains("asks a question") && shown.contains("\"maxLength\": 20"),
            "gate show shows the question and its schema: {shown}"
        );

        // A bad answer is refused with what to do, and the question still waits.
        let bad = gate.person(&[
            "answer",
            &shown_id,
            "--accept",
            r#"{"name": "Ada", "copies": 12}"#,
        ]);
        assert!(!bad.status.success());
        assert!(
            out(&bad).contains("`copies` must be at most 9") && out(&bad).contains("still waits"),
            "{}",
            out(&bad)
        );
        let unknown = gate.person(&["answer", &shown_id, "--accept", r#"{"nom": "Ada"}"#]);
        assert!(
            out(&unknown).contains("the field `name` is required"),
            "{}",
            out(&unknown)
        );
        let answered = gate.person(&[
            "answer",
            &shown_id,
            "--accept",
            r#"{"name": "Ada", "copies": 2}"#,
        ]);
        assert!(answered.status.success(), "{}", out(&answered));
        assert!(
            out(&answered).contains("went to the server"),
            "{}",
            out(&answered)
        );
    });
    let delivered = gate.deliveries();
    assert_eq!(delivered.len(), 2, "{delivered:?}");
    assert!(
        delivered[1].starts_with("elicit_write \"answered: ")
            && delivered[1].contains(r#"\"action\":\"accept\""#)
            && delivered[1].contains(r#"\"name\":\"Ada\""#)
            && delivered[1].contains(r#"\"copies\":2"#),
        "the server received the person's answer: {delivered:?}"
    );

    // Decided: `gate show` lists the exchange, and the ledger holds it with the action.
    let shown = out(&gate.person(&["show", &shown_id]));
    assert!(
        shown.contains("what its server asked during the send")
            && shown.contains(&format!("answered by {}: accept", me())),
        "{shown}"
    );
    let ledger = out(&gate.person(&["ledger"]));
    assert!(
        ledger.contains(&format!(
            "A question of fixture during the send of action #{id}: elicitation"
        )),
        "{ledger}"
    );
    let again = gate.person(&["answer", &shown_id, "--decline"]);
    assert!(
        !again.status.success() && out(&again).contains("no question of its server waits"),
        "{}",
        out(&again)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_nobody_answers_is_declined_after_its_wait() {
    let gate = asking_gate("unanswered", "question_wait_seconds = 1");
    let id = staged(&gate, "fixture__elicit_write").await;
    let started = Instant::now();
    let approved = gate.person(&["approve", &id.to_string()]);
    assert!(approved.status.success(), "{}", out(&approved));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "declined after the wait, not at the deadline"
    );
    let delivered = gate.deliveries();
    assert!(
        delivered[1].starts_with("elicit_write \"no answer: ")
            && delivered[1].contains("nobody answered in time"),
        "the server was told why: {delivered:?}"
    );
    let shown = out(&gate.person(&["show", &id.to_string()]));
    assert!(
        shown.contains("declined by the gate: nobody answered in time"),
        "{shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_during_a_send_is_declined_and_recorded() {
    let gate = asking_gate("sampling", "");
    let id = staged(&gate, "fixture__sample_write").await;
    let approved = gate.person(&["approve", &id.to_string()]);
    assert!(approved.status.success(), "{}", out(&approved));
    let delivered = gate.deliveries();
    assert!(
        delivered[1].starts_with("sample_write \"no answer: ")
            && delivered[1].contains("a person's approved send cannot sample"),
        "{delivered:?}"
    );
    let ledger = out(&gate.person(&["ledger"]));
    assert!(
        ledger.contains(&format!(
            "A question of fixture during the send of action #{id}: sampling"
        )),
        "{ledger}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_2026_07_28_a_question_in_an_input_required_result_goes_to_the_person_and_sampling_ends_the_send()
 {
    let gate = asking_gate("input-required", "protocol = \"2026-07-28\"");
    let id = staged(&gate, "fixture__elicit_write").await;
    let shown_id = id.to_string();
    approve_answering(&gate, id, |pending| {
        assert!(
            pending.contains("«Which name and how many copies?»"),
            "{pending}"
        );
        let answered = gate.person(&[
            "answer",
            &shown_id,
            "--accept",
            r#"{"name": "Ada", "copies": 3}"#,
        ]);
        assert!(answered.status.success(), "{}", out(&answered));
    });
    let delivered = gate.deliveries();
    assert_eq!(
        delivered.len(),
        2,
        "one call, answered on its retry: {delivered:?}"
    );
    assert!(
        delivered[1].contains(r#"\"name\":\"Ada\""#) && delivered[1].contains(r#"\"copies\":3"#),
        "the server's retry carried the person's answer: {delivered:?}"
    );

    // No model answers for a person, and the protocol has no way to decline sampling in
    // an answer: the send ends, said so, and nothing was applied.
    let id = staged(&gate, "fixture__sample_write").await;
    let approved = gate.person(&["approve", &id.to_string()]);
    assert!(
        out(&approved).contains("sampling completion"),
        "{}",
        out(&approved)
    );
    let delivered = gate.deliveries();
    assert_eq!(
        delivered.last().map(String::as_str),
        Some("sample_write {}"),
        "asked, never completed: {delivered:?}"
    );
    let shown = out(&gate.person(&["show", &id.to_string()]));
    assert!(
        shown.contains("a person's approved send cannot sample"),
        "{shown}"
    );
}

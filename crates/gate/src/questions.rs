//! Questions a downstream server asks during a person's approved send: the daemon holds an
//! elicitation (`elicitation/create`) for the person, who sees it in `gate pending`,
//! `gate show N` and `gate review` and answers it with `gate answer N`; a sampling request
//! (`sampling/createMessage`) is declined at once, since no model answers for a person.
//!
//! Each apply of an approved action runs inside [`Questions::during`], which hands the
//! driver a channel for the send ([`gatekeeper_mcp::for_person`]); the driver puts a
//! question there only while that send is the one call in flight on the server's
//! connection (several calls at once: declined, as the protocol does not say which one
//! asks). A question not answered by its time (shortly before the send's deadline, or
//! the server's `question_wait_seconds`) is declined with the reason.
//!
//! Every exchange (the question, the answer or the decline, and who answered) is recorded
//! in the ledger as an observation under the action's server and agent, titled with the
//! action's id ([`exchange_title`]), so `gate show N` of a decided action lists them.
//! Everything shown to the person is built from sanitized pieces; the socket redacts it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use gatekeeper_mcp::{Ask, PersonAsk, SEND_CANNOT_SAMPLE};
use kernel::{EntryBody, LedgerEntry, LedgerId, ObservationDescription, Overseer};
use prompt_sanitize::{
    MAX_ARGUMENTS_CHARS, MAX_DESCRIPTION_CHARS, MAX_INLINE_CHARS, MAX_SERVER_NAME_CHARS, Sanitized,
    code_span, json_arguments, plain_inline, untrusted_label,
};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tracing::warn;

/// How many ledger entries after an action `gate show` looks through for its exchanges.
const EXCHANGE_SCAN: u64 = 20_000;

/// A question held for the person.
#[derive(Debug)]
struct Held {
    /// Which question of the daemon's life this is (a timer declines only its own).
    seq: u64,
    /// The action's server (its gatekeeper's name).
    server: String,
    /// The agent that staged the action.
    caller: String,
    /// The question's params, as the server sent them.
    params: Value,
    /// When it is declined unless answered.
    until: Instant,
    /// Where the answer goes.
    reply: oneshot::Sender<Result<Value, String>>,
}

/// The questions the person has to answer, and the record of every exchange.
pub struct Questions {
    overseer: Overseer,
    held: std::sync::Mutex<BTreeMap<u64, Held>>,
    next: AtomicU64,
    /// How many questions are held: the person's commands stop waiting for a drain to
    /// settle while one is (the drain may be the send that asks).
    count: watch::Sender<usize>,
}

/// The person's answer to a question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Accept, with the form's content (JSON text; none for a question that only asks to
    /// visit an address).
    Accept(Option<String>),
    /// Decline.
    Decline,
    /// Cancel.
    Cancel,
}

impl Answer {
    fn word(&self) -> &'static str {
        match self {
            Self::Accept(_) => "accept",
            Self::Decline => "decline",
            Self::Cancel => "cancel",
        }
    }
}

/// The ledger title of an exchange during the send of `action`; `gate show` finds them
/// by it.
pub fn exchange_title(server: &str, action: LedgerId, what: &str) -> Sanitized {
    Sanitized::concat(&[
        &Sanitized::literal("A question of "),
        &plain_inline(server, MAX_SERVER_NAME_CHARS),
        &Sanitized::literal(" during the send of action #"),
        &Sanitized::number(action.0),
        &Sanitized::literal(": "),
        &plain_inline(what, MAX_INLINE_CHARS),
    ])
}

impl std::fmt::Debug for Questions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Questions")
            .field("held", &self.held().len())
            .finish_non_exhaustive()
    }
}

impl Questions {
    /// No question held; exchanges recorded in `overseer`'s ledger.
    pub fn new(overseer: Overseer) -> Self {
        Self {
            overseer,
            held: std::sync::Mutex::new(BTreeMap::new()),
            next: AtomicU64::new(0),
            count: watch::channel(0).0,
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Held>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn counted(&self, held: &BTreeMap<u64, Held>) {
        self.count.send_replace(held.len());
    }

    /// Told how many questions are held, whenever that changes.
    pub fn watch(&self) -> watch::Receiver<usize> {
        self.count.subscribe()
    }

    /// Run `send`, the apply of action `action` (staged by `caller` on `server`), taking
    /// the questions its server asks meanwhile to the person. A question still held when
    /// the send ends is dropped (the driver has given up on it).
    pub async fn during<F: Future>(
        self: &Arc<Self>,
        action: LedgerId,
        server: &str,
        caller: &str,
        send: F,
    ) -> F::Output {
        let (asks, mut questions) = mpsc::channel::<PersonAsk>(1);
        let send = gatekeeper_mcp::for_person(asks, send);
        let mut send = std::pin::pin!(send);
        let outcome = loop {
            tokio::select! {
                outcome = &mut send => break outcome,
                Some(question) = questions.recv() => {
                    self.hold(action, server, caller, question).await;
                }
            }
        };
        let mut held = self.held();
        held.remove(&action.0);
        self.counted(&held);
        outcome
    }

    /// Take one question of the send of `action`.
    async fn hold(
        self: &Arc<Self>,
        action: LedgerId,
        server: &str,
        caller: &str,
        asked: PersonAsk,
    ) {
        let PersonAsk { ask, until, reply } = asked;
        #[allow(deprecated)] // sampling: deprecated in the newest revision, in use
        let params = match ask {
            Ask::Sampling(params) => {
                let question = serde_json::to_value(&params).unwrap_or(Value::Null);
                self.record(
                    action,
                    server,
                    caller,
                    "sampling",
                    &question,
                    &format!("declined by the gate: {SEND_CANNOT_SAMPLE}"),
                )
                .await;
                let _ = reply.send(Err(SEND_CANNOT_SAMPLE.to_owned()));
                return;
            }
            Ask::Elicitation(params) => serde_json::to_value(&params).unwrap_or(Value::Null),
        };
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let refused = {
            let mut held = self.held();
            let refused = match held.entry(action.0) {
                std::collections::btree_map::Entry::Occupied(_) => Some(reply),
                std::collections::btree_map::Entry::Vacant(slot) => {
                    slot.insert(Held {
                        seq,
                        server: server.to_owned(),
                        caller: caller.to_owned(),
                        params: params.clone(),
                        until,
                        reply,
                    });
                    None
                }
            };
            self.counted(&held);
            refused
        };
        if let Some(reply) = refused {
            let why = "the server asked again while its first question waits for the person; the gate takes one at a time and declines";
            self.record(
                action,
                server,
                caller,
                "elicitation",
                &params,
                &format!("declined by the gate: {why}"),
            )
            .await;
            let _ = reply.send(Err(why.to_owned()));
            return;
        }
        warn!(action = action.0, %server, "send.question: a server asks the person (gate pending)");
        let questions = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(until).await;
            questions.expire(action, seq).await;
        });
    }

    /// Decline the question `seq` of `action` if it still waits.
    async fn expire(&self, action: LedgerId, seq: u64) {
        let taken = {
            let mut held = self.held();
            match held.get(&action.0) {
                Some(question) if question.seq == seq => {
                    let taken = held.remove(&action.0);
                    self.counted(&held);
                    taken
                }
                _ => None,
            }
        };
        let Some(question) = taken else {
            return;
        };
        let why = "nobody answered in time (before the send's deadline, or the server's question_wait_seconds), so the gate declines";
        self.record(
            action,
            &question.server,
            &question.caller,
            "elicitation",
            &question.params,
            &format!("declined by the gate: {why}"),
        )
        .await;
        let _ = question.reply.send(Err(why.to_owned()));
    }

    /// The person `person` answers the question of action `id`. A bad answer is refused
    /// with what to do, and the question still waits.
    pub async fn answer(&self, id: u64, answer: &Answer, person: &str) -> Result<String, String> {
        let result = {
            let held = self.held();
            let Some(question) = held.get(&id) else {
                return Err(format!(
                    "#{id}: no question of its server waits for an answer (it may have been answered, or declined when its time ran out: `gate show {id}` says); `gate pending` lists the questions that wait"
                ));
            };
            match answer {
                Answer::Accept(content) => {
                    let content = accepted_content(id, &question.params, content.as_deref())?;
                    match content {
                        Some(content) => json!({"action": "accept", "content": content}),
                        None => json!({"action": "accept"}),
                    }
                }
                Answer::Decline => json!({"action": "decline"}),
                Answer::Cancel => json!({"action": "cancel"}),
            }
        };
        let question = {
            let mut held = self.held();
            let taken = held.remove(&id);
            self.counted(&held);
            taken
        };
        let Some(question) = question else {
            return Err(format!(
                "#{id}: its question was declined or withdrawn a moment ago; `gate show {id}` says what happened"
            ));
        };
        let shown = match answer {
            Answer::Accept(_) => format!(
                "answered by {person}: accept {}",
                result
                    .get("content")
                    .map(Value::to_string)
                    .unwrap_or_default()
            ),
            other => format!("answered by {person}: {}", other.word()),
        };
        self.record(
            LedgerId(id),
            &question.server,
            &question.caller,
            "elicitation",
            &question.params,
            &shown,
        )
        .await;
        if question.reply.send(Ok(result)).is_err() {
            return Err(format!(
                "#{id}: your answer is recorded, but the send ended before it reached the server"
            ));
        }
        Ok(format!(
            "#{id}: your answer ({}) went to the server; the send goes on (`gate show {id}` for its outcome)",
            answer.word()
        ))
    }

    /// Record one exchange of the send of `action` in the ledger.
    async fn record(
        &self,
        action: LedgerId,
        server: &str,
        caller: &str,
        what: &str,
        question: &Value,
        outcome: &str,
    ) {
        let title = exchange_title(server, action, what);
        let description = Sanitized::concat(&[
            &Sanitized::literal("**"),
            &plain_inline(server, MAX_SERVER_NAME_CHARS),
            &Sanitized::literal("** asked during the person's approved send of action #"),
            &Sanitized::number(action.0),
            &Sanitized::literal(": "),
            &untrusted_label(&question.to_string(), MAX_DESCRIPTION_CHARS),
            &Sanitized::literal("; "),
            &untrusted_label(outcome, MAX_DESCRIPTION_CHARS),
        ]);
        let recorded = match self.overseer.queue_for(server, caller) {
            Ok(queue) => queue
                .authorize_observation(ObservationDescription::new(
                    title.into_string(),
                    description.into_string(),
                ))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Err(error) => Err(error.to_string()),
        };
        if let Err(error) = recorded {
            warn!(action = action.0, %error, "exchange.unrecorded");
        }
    }

    /// The question waiting for action `id`, as the person reads it, if one waits.
    pub fn shown(&self, id: u64) -> Option<String> {
        let held = self.held();
        held.get(&id).map(|question| render(id, question))
    }

    /// Every question waiting, as the person reads them, by action id.
    pub fn waiting(&self) -> Vec<(u64, String)> {
        let held = self.held();
        held.iter().map(|(id, q)| (*id, render(*id, q))).collect()
    }

    /// One line per question waiting, for the review screen.
    pub fn notices(&self) -> Vec<(u64, String)> {
        let held = self.held();
        held.iter()
            .map(|(id, q)| {
                let message = q
                    .params
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                (
                    *id,
                    format!(
                        "#{id} asks: {} (declined in {}s unless answered) · answer with {}",
                        untrusted_label(message, MAX_INLINE_CHARS).as_str(),
                        q.until.saturating_duration_since(Instant::now()).as_secs(),
                        how_to_answer(*id, &q.params)
                    ),
                )
            })
            .collect()
    }

    /// The exchanges recorded for the send of `action`, as the ledger has them: the
    /// entries after it (at most [`EXCHANGE_SCAN`]) whose title names it.
    pub fn exchanges(&self, action: &LedgerEntry) -> Vec<String> {
        let prefix = format!(" during the send of action #{}: ", action.id.0);
        let mut found = Vec::new();
        for id in action.id.0 + 1..=action.id.0.saturating_add(EXCHANGE_SCAN) {
            let Ok(Some(entry)) = self.overseer.entry(LedgerId(id)) else {
                break;
            };
            if let EntryBody::Observation(observed) = &entry.body
                && entry.gatekeeper == action.gatekeeper
                && observed.title.starts_with("A question of ")
                && observed.title.contains(&prefix)
            {
                found.push(format!(
                    "  #{id} {}\n      {}",
                    observed.title, observed.description
                ));
            }
        }
        found
    }
}

/// A question as the person reads it: what the server asks, what it wants, how to answer.
fn render(id: u64, question: &Held) -> String {
    let params = &question.params;
    let message = params.get("message").and_then(Value::as_str).unwrap_or("");
    let left = question
        .until
        .saturating_duration_since(Instant::now())
        .as_secs();
    let mut lines = vec![
        format!(
            "#{id}: its server {} asks a question during your approved send (declined in {left}s unless you answer):",
            code_span(&question.server, MAX_SERVER_NAME_CHARS).as_str()
        ),
        format!(
            "  {}",
            untrusted_label(message, MAX_DESCRIPTION_CHARS).as_str()
        ),
    ];
    if let Some(url) = params.get("url").and_then(Value::as_str) {
        lines.push(format!(
            "  it asks you to visit {} (accepting says you did)",
            untrusted_label(url, MAX_DESCRIPTION_CHARS).as_str()
        ));
    }
    if let Some(schema) = params.get("requestedSchema") {
        lines.push("  the answer it asks for (its schema):".to_owned());
        lines.push(format!(
            "```json\n{}\n```",
            json_arguments(schema, MAX_ARGUMENTS_CHARS).as_str()
        ));
    }
    lines.push(format!("  answer with {}", how_to_answer(id, params)));
    lines.join("\n")
}

/// The commands that answer question `id`: an example `--accept` built from the schema's
/// fields when each field name is a plain word (nothing the server wrote reaches a
/// command line the person may copy otherwise).
fn how_to_answer(id: u64, params: &Value) -> String {
    let accept = match params
        .pointer("/requestedSchema/properties")
        .and_then(Value::as_object)
    {
        Some(fields) if !fields.is_empty() => {
            let plain = fields.keys().all(|k| {
                !k.is_empty()
                    && k.len() <= 40
                    && k.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            });
            let example: serde_json::Map<String, Value> = if plain {
                fields
                    .iter()
                    .map(|(k, field)| (k.clone(), example_value(field)))
                    .collect()
            } else {
                [("FIELD".to_owned(), json!("value"))].into_iter().collect()
            };
            format!("--accept '{}'", Value::Object(example))
        }
        _ => "--accept".to_owned(),
    };
    format!(
        "`gate answer {id} {accept}`, `gate answer {id} --decline` or `gate answer {id} --cancel`"
    )
}

/// A value of the right type for a field, for the example command (never the server's
/// own text).
fn example_value(field: &Value) -> Value {
    match field.get("type").and_then(Value::as_str) {
        Some("integer" | "number") => json!(1),
        Some("boolean") => json!(true),
        Some("array") => json!([]),
        _ => json!("..."),
    }
}

/// The content of an accept for the question `params` of action `id`, read from the
/// person's JSON and checked against the question's `requestedSchema`; `Err` says what is
/// wrong and what to do.
fn accepted_content(
    id: u64,
    params: &Value,
    content: Option<&str>,
) -> Result<Option<Value>, String> {
    let schema = params.get("requestedSchema");
    let Some(text) = content else {
        return match schema {
            None => Ok(None),
            Some(_) => Err(format!(
                "#{id}: an accept carries the answer the server asks for, as a JSON object: {}; nothing was sent, the question still waits",
                how_to_answer(id, params)
            )),
        };
    };
    let content: Value = serde_json::from_str(text).map_err(|e| {
        format!("#{id}: --accept takes a JSON object ({e}), such as {}; nothing was sent, the question still waits", how_to_answer(id, params))
    })?;
    if let Some(schema) = schema {
        check_content(schema, &content).map_err(|problem| {
            format!("#{id}: the answer does not fit the question: {problem}; nothing was sent, the question still waits (`gate show {id}` shows what it asks)")
        })?;
    } else if !content.is_object() {
        return Err(format!(
            "#{id}: --accept takes a JSON object; nothing was sent, the question still waits"
        ));
    }
    Ok(Some(content))
}

/// Whether `content` fits an elicitation's `requestedSchema` (a flat object of strings,
/// numbers, booleans and lists of choices, as the protocol restricts it).
pub fn check_content(schema: &Value, content: &Value) -> Result<(), String> {
    let Some(content) = content.as_object() else {
        return Err("it must be a JSON object of fields".to_owned());
    };
    let fields = schema.get("properties").and_then(Value::as_object);
    let name = |k: &str| code_span(k, MAX_INLINE_CHARS).into_string();
    if let Some(required) = schema.get("required").and_then(Value::as_array) {
        for field in required.iter().filter_map(Value::as_str) {
            if !content.contains_key(field) {
                return Err(format!("the field {} is required", name(field)));
            }
        }
    }
    for (key, value) in content {
        let Some(field) = fields.and_then(|f| f.get(key)) else {
            let known: Vec<String> = fields
                .map(|f| f.keys().map(|k| name(k)).collect())
                .unwrap_or_default();
            return Err(format!(
                "the question has no field {} (its fields: {})",
                name(key),
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            ));
        };
        check_field(field, value).map_err(|problem| format!("{} {problem}", name(key)))?;
    }
    Ok(())
}

fn check_field(field: &Value, value: &Value) -> Result<(), String> {
    let choices: Option<Vec<&Value>> = field
        .get("enum")
        .and_then(Value::as_array)
        .map(|c| c.iter().collect())
        .or_else(|| {
            field
                .get("oneOf")
                .and_then(Value::as_array)
                .map(|c| c.iter().filter_map(|o| o.get("const")).collect())
        });
    let bound = |key: &str| field.get(key).and_then(Value::as_f64);
    match field.get("type").and_then(Value::as_str) {
        Some("string") => {
            let Some(text) = value.as_str() else {
                return Err("must be a string".to_owned());
            };
            let length = text.chars().count() as f64;
            if bound("minLength").is_some_and(|min| length < min) {
                return Err(format!(
                    "must be at least {} characters",
                    bound("minLength").unwrap_or_default()
                ));
            }
            if bound("maxLength").is_some_and(|max| length > max) {
                return Err(format!(
                    "must be at most {} characters",
                    bound("maxLength").unwrap_or_default()
                ));
            }
            let format_ok = match field.get("format").and_then(Value::as_str) {
                Some("email") => text.contains('@'),
                Some("uri") => text.contains(':'),
                Some("date") => {
                    text.len() == 10 && text.as_bytes()[4] == b'-' && text.as_bytes()[7] == b'-'
                }
                Some("date-time") => text.contains('T'),
                _ => true,
            };
            if !format_ok {
                return Err(format!(
                    "must be a {}",
                    field
                        .get("format")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                ));
            }
        }
        Some(kind @ ("number" | "integer")) => {
            let Some(number) = value.as_f64() else {
                return Err(format!("must be a {kind}"));
            };
            if kind == "integer" && number.fract() != 0.0 {
                return Err("must be a whole number".to_owned());
            }
            if bound("minimum").is_some_and(|min| number < min) {
                return Err(format!("must be at least {}", field["minimum"]));
            }
            if bound("maximum").is_some_and(|max| number > max) {
                return Err(format!("must be at most {}", field["maximum"]));
            }
        }
        Some("boolean") if !value.is_boolean() => return Err("must be true or false".to_owned()),
        Some("array") => {
            let Some(items) = value.as_array() else {
                return Err("must be a list".to_owned());
            };
            let allowed: Option<Vec<&Value>> = field.get("items").and_then(|items| {
                items
                    .get("enum")
                    .and_then(Value::as_array)
                    .map(|c| c.iter().collect())
                    .or_else(|| {
                        items
                            .get("anyOf")
                            .and_then(Value::as_array)
                            .map(|c| c.iter().filter_map(|o| o.get("const")).collect())
                    })
            });
            if let Some(allowed) = allowed
                && let Some(bad) = items.iter().find(|item| !allowed.contains(item))
            {
                return Err(format!(
                    "holds {}, which is not one of its choices",
                    untrusted_label(&bad.to_string(), MAX_INLINE_CHARS).as_str()
                ));
            }
            let count = items.len() as f64;
            if bound("minItems").is_some_and(|min| count < min)
                || bound("maxItems").is_some_and(|max| count > max)
            {
                return Err("has too few or too many choices".to_owned());
            }
            return Ok(());
        }
        _ => {}
    }
    if let Some(choices) = choices
        && !choices.contains(&value)
    {
        let listed: Vec<String> = choices
            .iter()
            .map(|c| untrusted_label(&c.to_string(), MAX_INLINE_CHARS).into_string())
            .collect();
        return Err(format!("must be one of {}", listed.join(", ")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 5},
                "copies": {"type": "integer", "minimum": 1, "maximum": 9},
                "color": {"type": "string", "enum": ["red", "blue"]}
            },
            "required": ["name"]
        })
    }

    #[test]
    fn an_answer_is_checked_against_the_questions_schema() {
        assert!(check_content(&schema(), &json!({"name": "Ada", "copies": 2})).is_ok());
        for (bad, why) in [
            (json!({"copies": 2}), "is required"),
            (json!({"name": "Ada", "size": 1}), "has no field `size`"),
            (json!({"name": "Adalbert"}), "at most 5 characters"),
            (json!({"name": "Ada", "copies": 10}), "at most 9"),
            (json!({"name": "Ada", "copies": 1.5}), "whole number"),
            (json!({"name": "Ada", "color": "green"}), "must be one of"),
            (json!(["Ada"]), "JSON object"),
        ] {
            let problem = check_content(&schema(), &bad).expect_err("refused");
            assert!(problem.contains(why), "{bad}: {problem}");
        }
    }

    #[test]
    fn the_example_command_never_carries_the_servers_words() {
        let hostile = json!({"requestedSchema": {"type": "object", "properties": {"'; rm -rf ~; '": {"type": "string"}}}});
        let how = how_to_answer(3, &hostile);
        assert!(!how.contains("rm -rf"), "{how}");
        assert!(how.contains("--accept '{\"FIELD\":\"value\"}'"), "{how}");
        let plain = how_to_answer(3, &json!({"requestedSchema": schema()}));
        assert!(
            plain.contains("\"copies\":1") && plain.contains("\"name\":\"...\""),
            "{plain}"
        );
    }
}

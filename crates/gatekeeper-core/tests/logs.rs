//! Log events and errors carry untrusted names and service messages only as delimited, visible
//! labels: once a log subscriber writes to a terminal, no tool name or service message may add
//! a line, colour or link it, or hide a character there.

mod common;

use std::fmt::{self, Write as _};
use std::sync::{Arc, Mutex};

use gatekeeper_core::{ActionStore, CallError, ServerTrust, Tool, ToolGatekeeper};
use serde_json::json;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// A tool name that would add a line, a hyperlink and a bidi override to a log.
const HOSTILE: &str = "listIssues\n2026-01-01 INFO action approved by=security\u{1b}]8;;https://evil.example\u{7}x\u{202e}\u{3164}";

/// Records every event's fields as one string, `name=value` each, as a formatter would.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<String>>>);

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // `%value` fields arrive here with Debug forwarding to Display, so this is what a
        // formatter prints.
        let _ = write!(self.0, "{}={:?} ", field.name(), value);
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        let _ = write!(self.0, "{}={} ", field.name(), value);
    }
}

impl Subscriber for Recorder {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        self.0.lock().unwrap().push(fields.0);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// Held by every test here for its whole run. tracing caches per callsite whether anyone
/// listens, across threads: a test that emits events with no subscriber while another
/// test's recorder is being installed can leave a callsite cached as unheard, and the
/// recorder misses its event. One test at a time keeps the recorders' view exact.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Panics if `text` holds a character a terminal would act on or hide.
fn assert_terminal_safe(text: &str) {
    for c in ['\n', '\r', '\u{1b}', '\u{7}', '\u{202e}', '\u{3164}'] {
        assert!(!text.contains(c), "{c:?} reached the output: {text:?}");
    }
}

#[tokio::test]
async fn log_events_show_hostile_tool_names_and_service_messages_as_labels() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let recorder = Recorder::default();
    let _guard = tracing::subscriber::set_default(recorder.clone());

    let tools =
        Tool::catalog_from_json(json!([{"name": HOSTILE}, {"name": HOSTILE}])).expect("catalog");
    let _gk = ToolGatekeeper::new(
        common::config(ServerTrust::Byo),
        tools,
        common::FakeService::new(),
        ActionStore::in_memory(common::clock()),
    );
    let store = ActionStore::in_memory(common::clock());
    let service = common::FakeService::new();
    let id = store.stage(HOSTILE, json!({})).await.expect("staged");
    service.reply_next(Err(CallError::Declined(
        "403\n2026-01-01 INFO action applied\u{1b}[2K\u{202e}".into(),
    )));
    let _ = store.apply(id, &*service).await;

    let events = recorder.0.lock().unwrap().clone();
    let tool_events: Vec<&String> = events.iter().filter(|e| e.contains("tool=")).collect();
    assert_eq!(
        tool_events.len(),
        2,
        "catalog.duplicate and action.staged: {events:#?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e.contains("error=«403 2026-01-01 INFO action applied⟨ESC⟩⟨U+202E⟩»")),
        "{events:#?}"
    );
    for event in &events {
        assert_terminal_safe(event);
    }
    for event in tool_events {
        assert!(event.contains("tool=«listIssues 2026-01-01"), "{event}");
    }
}

/// Grant the agent the catalog's `write` tool and stage one call of it; its ledger id.
async fn stage_write(
    gatekeeper: &Arc<ToolGatekeeper>,
    overseer: &kernel::Overseer,
) -> kernel::LedgerId {
    let mut grants = gatekeeper_core::Grants::new();
    grants.introduce(
        "SVC",
        gatekeeper
            .grant(overseer, "agent", &["write"])
            .expect("grant"),
    );
    let outcome = grants
        .session("SVC")
        .expect("session")
        .call_tool("write", json!({}))
        .await
        .expect("staged");
    outcome.ledger().expect("an action")
}

#[tokio::test]
async fn not_granted_lists_hostile_tool_names_as_labels() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let w = common::world(ServerTrust::Byo).await;
    let mut grants = gatekeeper_core::Grants::new();
    grants.introduce(
        "SVC",
        w.gatekeeper
            .grant(&w.overseer, "agent", &["read"])
            .expect("grant"),
    );
    let error = grants
        .session("SVC")
        .expect("session")
        .call_tool(HOSTILE, json!({}))
        .await
        .unwrap_err();
    let text = error.to_string();
    assert_terminal_safe(&text);
    assert!(
        text.starts_with("this grant does not allow «listIssues 2026-01-01 INFO action approved by=security⟨ESC⟩x⟨U+202E⟩⟨U+3164⟩»; it allows: «read»"),
        "{text}"
    );
}

#[tokio::test]
async fn a_service_failure_reaches_the_kernel_and_its_log_as_one_visible_line() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let w = common::world(ServerTrust::Byo).await;
    let ledger = stage_write(&w.gatekeeper, &w.overseer).await;
    let recorder = Recorder::default();
    let _guard = tracing::subscriber::set_default(recorder.clone());
    w.service.reply_next(Err(CallError::Declined(
        "403\n2026-01-01 INFO action applied by=alice\u{1b}[2K\u{202e}".into(),
    )));
    assert!(w.overseer.approve(ledger, "alice").await.is_err());
    let entry = w.overseer.entry(ledger).expect("ledger").expect("entry");
    let failure = entry
        .action()
        .and_then(|a| a.failure.clone())
        .expect("failed");
    assert_eq!(
        failure.message,
        "403 2026-01-01 INFO action applied by=alice⟨ESC⟩⟨U+202E⟩"
    );
    let events = recorder.0.lock().unwrap().clone();
    assert!(
        events.iter().any(|e| e.contains("403 2026-01-01")),
        "{events:#?}"
    );
    for event in &events {
        assert_terminal_safe(event);
    }
}

/// A reverter whose refusal quotes the service's multi-line text, as a driver's may.
struct QuotingReverter;

#[async_trait::async_trait]
impl gatekeeper_core::Reverter for QuotingReverter {
    fn reverts(&self, _tool: &str) -> bool {
        true
    }

    async fn revert(
        &self,
        _action: &gatekeeper_core::ActionRecord,
        _service: &dyn gatekeeper_core::ToolService,
    ) -> Result<kernel::RevertOutcome, kernel::GatekeeperError> {
        Ok(kernel::RevertOutcome::refused(
            "the service said:\n2026-01-01 INFO action reverted by=alice\u{1b}[2K\u{202e}",
            false,
        ))
    }
}

#[tokio::test]
async fn a_reverters_refusal_reaches_the_kernel_as_one_visible_line() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let clock = common::clock();
    let overseer = kernel::Overseer::new(clock.clone());
    let service = common::FakeService::new();
    let gatekeeper = Arc::new(
        ToolGatekeeper::new(
            common::config(ServerTrust::Byo),
            common::catalog(),
            service.clone(),
            ActionStore::in_memory(clock),
        )
        .with_reverter(Arc::new(QuotingReverter)),
    );
    overseer.register(gatekeeper.clone()).expect("register");
    let ledger = stage_write(&gatekeeper, &overseer).await;
    overseer.approve(ledger, "alice").await.expect("applied");
    let report = overseer.revert(ledger, "alice").await.expect("answered");
    assert!(!report.reverted);
    let message = report.message.expect("a refusal says why");
    assert_terminal_safe(&message);
    assert_eq!(
        message,
        "the service said: 2026-01-01 INFO action reverted by=alice⟨ESC⟩⟨U+202E⟩"
    );
}

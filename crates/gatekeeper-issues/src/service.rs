//! OUTSIDE THE OS: an in-process issue tracker standing in for a real service.
//!
//! Nothing in this module is part of the approval gate. It plays the peripheral a driver
//! talks to (GitHub, in the lecture): it keeps issues, answers tool calls, and lets a test
//! or lecture see what actually reached it ([`IssueTracker::calls`],
//! [`IssueTracker::writes`], [`IssueTracker::issues`]) and make it misbehave on the next
//! calls, the way a network does:
//!
//! - [`IssueTracker::lose_next_reply`]: the write lands, the reply is lost (a timeout).
//! - [`IssueTracker::decline_next`]: refused before anything lands (HTTP 403).
//! - [`IssueTracker::refuse_credentials_next`]: credentials refused (HTTP 401).
//! - [`IssueTracker::park_next`]: the call is received and held until released, so a test
//!   can look at the world while an apply is mid-flight.
//!
//! Faults are queued and consumed one per call, in order, whatever the tool.
//!
//! The tools: `listIssues`, `searchIssues`, `createIssue`, `addLabel`, `closeIssue`,
//! `deleteIssue`, and `removeLabel`, which the catalog does not list (the driver uses it to
//! revert `addLabel`; an agent cannot be granted it).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use gatekeeper_core::{CallError, Tool, ToolResult, ToolService};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::catalog::{Catalog, catalog};

/// The 403 text the tracker answers a declined call with.
pub const DECLINED_MESSAGE: &str =
    "The server refused this request. The connected account may not have access to it.";
/// The 401 text the tracker answers refused credentials with.
pub const CREDENTIALS_MESSAGE: &str =
    "The server rejected this connection's credentials. Reconnect the account, then approve again.";
/// What a lost reply looks like to the caller.
pub const TIMEOUT_MESSAGE: &str = "The server did not answer within 30 seconds.";

/// One issue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Issue {
    /// Its number, from 1.
    pub id: u64,
    /// Its title.
    pub title: String,
    /// Its labels, in the order added.
    pub labels: Vec<String>,
    /// Open or closed.
    pub open: bool,
}

impl Issue {
    fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "title": self.title,
            "labels": self.labels,
            "state": if self.open { "open" } else { "closed" },
        })
    }

    /// One line of a listing: `#3 Fix login [bug] (open)`.
    pub fn line(&self) -> String {
        issue_line(
            &format!("#{}", self.id),
            &self.title,
            &self.labels,
            if self.open { "open" } else { "closed" },
        )
    }
}

/// The tracker's listing line format.
fn issue_line(id: &str, title: &str, labels: &[String], state: &str) -> String {
    if labels.is_empty() {
        format!("{id} {title} ({state})")
    } else {
        format!("{id} {title} [{}] ({state})", labels.join(", "))
    }
}

/// A write that landed: a tool call that changed the tracker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// The tool.
    pub tool: String,
    /// The arguments it was called with.
    pub args: Value,
}

/// The other side of [`IssueTracker::park_next`]: see when the call arrived, release it.
///
/// Dropping the handle releases the call too, so a forgotten handle cannot hang a test.
#[derive(Debug)]
pub struct ParkHandle {
    slot: Arc<ParkSlot>,
}

#[derive(Debug, Default)]
struct ParkSlot {
    arrived: Notify,
    release: Notify,
}

impl ParkHandle {
    /// Wait until the parked call has been received (and counted) by the tracker.
    pub async fn wait_until_parked(&self) {
        self.slot.arrived.notified().await;
    }

    /// Let the parked call go on: it lands and replies.
    pub fn release(self) {
        // Drop does it.
    }
}

impl Drop for ParkHandle {
    fn drop(&mut self) {
        self.slot.release.notify_one();
    }
}

#[derive(Debug)]
enum Fault {
    LoseReply,
    Decline,
    RefuseCredentials,
    Park(Arc<ParkSlot>),
}

#[derive(Debug, Default)]
struct Tracker {
    last_id: u64,
    issues: BTreeMap<u64, Issue>,
    writes: Vec<Write>,
}

/// The fake issue tracker. Share it as `Arc<IssueTracker>`: the driver calls it as a
/// [`ToolService`], a test reads its counters.
#[derive(Debug)]
pub struct IssueTracker {
    catalog: Catalog,
    state: Mutex<Tracker>,
    faults: Mutex<VecDeque<Fault>>,
    calls: AtomicUsize,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl IssueTracker {
    /// An empty tracker serving the honest catalog.
    pub fn new() -> Arc<Self> {
        Self::with_catalog(Catalog::Honest)
    }

    /// An empty tracker serving the given catalog (see [`Catalog::Lying`]).
    pub fn with_catalog(catalog: Catalog) -> Arc<Self> {
        Arc::new(Self {
            catalog,
            state: Mutex::new(Tracker::default()),
            faults: Mutex::new(VecDeque::new()),
            calls: AtomicUsize::new(0),
        })
    }

    /// Someone outside the OS opens an issue directly (not a tool call; not counted).
    pub fn seed(&self, title: &str, labels: &[&str]) -> u64 {
        let mut state = lock(&self.state);
        state.create(title, labels.iter().map(|l| (*l).to_owned()).collect())
    }

    /// How many tool calls the tracker has received, including refused and parked ones.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// Every write that landed, in order.
    pub fn writes(&self) -> Vec<Write> {
        lock(&self.state).writes.clone()
    }

    /// Every issue, open and closed, by id.
    pub fn issues(&self) -> Vec<Issue> {
        lock(&self.state).issues.values().cloned().collect()
    }

    /// One issue.
    pub fn issue(&self, id: u64) -> Option<Issue> {
        lock(&self.state).issues.get(&id).cloned()
    }

    /// The next call lands, but its reply is lost: the caller sees a timeout.
    pub fn lose_next_reply(&self) {
        lock(&self.faults).push_back(Fault::LoseReply);
    }

    /// The next call is refused before anything lands (HTTP 403).
    pub fn decline_next(&self) {
        lock(&self.faults).push_back(Fault::Decline);
    }

    /// The next call's credentials are refused before anything lands (HTTP 401).
    pub fn refuse_credentials_next(&self) {
        lock(&self.faults).push_back(Fault::RefuseCredentials);
    }

    /// The next call is received and held until the returned handle is released.
    pub fn park_next(&self) -> ParkHandle {
        let slot = Arc::new(ParkSlot::default());
        lock(&self.faults).push_back(Fault::Park(slot.clone()));
        ParkHandle { slot }
    }

    fn run(&self, tool: &str, args: &Value) -> ToolResult {
        let mut state = lock(&self.state);
        let result = state.run(tool, args);
        if is_write(tool) && !result.is_error {
            state.writes.push(Write {
                tool: tool.to_owned(),
                args: args.clone(),
            });
        }
        result
    }
}

fn is_write(tool: &str) -> bool {
    matches!(
        tool,
        "createIssue" | "addLabel" | "removeLabel" | "closeIssue" | "deleteIssue"
    )
}

fn issue_arg(args: &Value) -> Result<u64, ToolResult> {
    args.get("issue")
        .and_then(Value::as_u64)
        .ok_or_else(|| ToolResult::tool_error("An \"issue\" number is required."))
}

fn string_arg<'a>(args: &'a Value, key: &str) -> Result<&'a str, ToolResult> {
    args.get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.trim().is_empty())
        .ok_or_else(|| ToolResult::tool_error(format!("A non-empty \"{key}\" string is required.")))
}

fn listing(issues: Vec<&Issue>) -> ToolResult {
    let text = if issues.is_empty() {
        "No issues.".to_owned()
    } else {
        issues
            .iter()
            .map(|i| i.line())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let data: Vec<Value> = issues.iter().map(|i| i.to_json()).collect();
    ToolResult::from_text(text).with_structured(json!({ "issues": data }))
}

impl Tracker {
    fn create(&mut self, title: &str, labels: Vec<String>) -> u64 {
        self.last_id += 1;
        let id = self.last_id;
        self.issues.insert(
            id,
            Issue {
                id,
                title: title.to_owned(),
                labels,
                open: true,
            },
        );
        id
    }

    fn run(&mut self, tool: &str, args: &Value) -> ToolResult {
        let result = match tool {
            "listIssues" => self.list(args),
            "searchIssues" => self.search(args),
            "createIssue" => self.create_tool(args),
            "addLabel" => self.add_label(args),
            "removeLabel" => self.remove_label(args),
            "closeIssue" => self.close(args),
            "deleteIssue" => self.delete(args),
            other => Err(ToolResult::tool_error(format!(
                "The tracker has no tool named \"{other}\"."
            ))),
        };
        result.unwrap_or_else(|error| error)
    }

    fn existing(&mut self, id: u64) -> Result<&mut Issue, ToolResult> {
        self.issues
            .get_mut(&id)
            .ok_or_else(|| ToolResult::tool_error(format!("There is no issue #{id}.")))
    }

    fn list(&self, args: &Value) -> Result<ToolResult, ToolResult> {
        let state = args.get("state").and_then(Value::as_str).unwrap_or("open");
        let keep = |i: &&Issue| match state {
            "all" => true,
            "closed" => !i.open,
            _ => i.open,
        };
        Ok(listing(self.issues.values().filter(keep).collect()))
    }

    fn search(&self, args: &Value) -> Result<ToolResult, ToolResult> {
        let query = string_arg(args, "query")?.to_lowercase();
        Ok(listing(
            self.issues
                .values()
                .filter(|i| i.title.to_lowercase().contains(&query))
                .collect(),
        ))
    }

    fn create_tool(&mut self, args: &Value) -> Result<ToolResult, ToolResult> {
        let title = string_arg(args, "title")?.to_owned();
        let labels = args
            .get("labels")
            .and_then(Value::as_array)
            .map(|ls| {
                ls.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        let id = self.create(&title, labels);
        let issue = &self.issues[&id];
        Ok(
            ToolResult::from_text(format!("Created issue #{id}: {title}"))
                .with_structured(json!({ "issue": issue.to_json() })),
        )
    }

    fn add_label(&mut self, args: &Value) -> Result<ToolResult, ToolResult> {
        let id = issue_arg(args)?;
        let label = string_arg(args, "label")?.to_owned();
        let issue = self.existing(id)?;
        let added = !issue.labels.contains(&label);
        if added {
            issue.labels.push(label.clone());
        }
        let text = if added {
            format!("Added label \"{label}\" to #{id}.")
        } else {
            format!("Issue #{id} already had label \"{label}\".")
        };
        Ok(ToolResult::from_text(text)
            .with_structured(json!({ "issue": id, "label": label, "added": added })))
    }

    fn remove_label(&mut self, args: &Value) -> Result<ToolResult, ToolResult> {
        let id = issue_arg(args)?;
        let label = string_arg(args, "label")?.to_owned();
        let issue = self.existing(id)?;
        let before = issue.labels.len();
        issue.labels.retain(|l| *l != label);
        let removed = issue.labels.len() != before;
        Ok(
            ToolResult::from_text(format!("Removed label \"{label}\" from #{id}."))
                .with_structured(json!({ "issue": id, "label": label, "removed": removed })),
        )
    }

    fn close(&mut self, args: &Value) -> Result<ToolResult, ToolResult> {
        let id = issue_arg(args)?;
        self.existing(id)?.open = false;
        Ok(ToolResult::from_text(format!("Closed #{id}.")))
    }

    fn delete(&mut self, args: &Value) -> Result<ToolResult, ToolResult> {
        let id = issue_arg(args)?;
        self.existing(id)?;
        self.issues.remove(&id);
        Ok(ToolResult::from_text(format!("Deleted #{id}.")))
    }
}

#[async_trait]
impl ToolService for IssueTracker {
    async fn list_tools(&self) -> Vec<Tool> {
        catalog(self.catalog)
    }

    async fn call(&self, tool: &str, args: &Value) -> Result<ToolResult, CallError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let fault = lock(&self.faults).pop_front();
        match fault {
            None => Ok(self.run(tool, args)),
            Some(Fault::Decline) => Err(CallError::Declined(DECLINED_MESSAGE.to_owned())),
            Some(Fault::RefuseCredentials) => {
                Err(CallError::NotDispatched(CREDENTIALS_MESSAGE.to_owned()))
            }
            Some(Fault::LoseReply) => {
                let _lost = self.run(tool, args);
                Err(CallError::Unknown(TIMEOUT_MESSAGE.to_owned()))
            }
            Some(Fault::Park(slot)) => {
                slot.arrived.notify_one();
                slot.release.notified().await;
                Ok(self.run(tool, args))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tools_change_the_tracker_and_only_landed_writes_are_recorded() {
        let tracker = IssueTracker::new();
        tracker.seed("Existing", &[]);
        let created = tracker
            .call(
                "createIssue",
                &json!({"title": "Fix login", "labels": ["bug"]}),
            )
            .await
            .expect("reply");
        assert_eq!(created.text(), "Created issue #2: Fix login");
        let missing = tracker
            .call("addLabel", &json!({"issue": 9, "label": "x"}))
            .await
            .expect("reply");
        assert!(missing.is_error);
        tracker
            .call("closeIssue", &json!({"issue": 1}))
            .await
            .expect("reply");
        let open = tracker.call("listIssues", &json!({})).await.expect("reply");
        assert_eq!(open.text(), "#2 Fix login [bug] (open)");
        assert_eq!(tracker.calls(), 4);
        let tools: Vec<String> = tracker.writes().into_iter().map(|w| w.tool).collect();
        assert_eq!(tools, ["createIssue", "closeIssue"]);
    }

    #[tokio::test]
    async fn faults_are_consumed_one_per_call_in_order() {
        let tracker = IssueTracker::new();
        tracker.decline_next();
        tracker.lose_next_reply();
        let args = json!({"title": "t"});
        assert_eq!(
            tracker.call("createIssue", &args).await,
            Err(CallError::Declined(DECLINED_MESSAGE.into()))
        );
        assert!(tracker.issues().is_empty(), "a declined call lands nothing");
        assert_eq!(
            tracker.call("createIssue", &args).await,
            Err(CallError::Unknown(TIMEOUT_MESSAGE.into()))
        );
        assert_eq!(tracker.issues().len(), 1, "a lost reply still landed");
        assert!(tracker.call("createIssue", &args).await.is_ok());
        assert_eq!(tracker.calls(), 3);
    }

    #[tokio::test]
    async fn a_parked_call_is_counted_but_lands_only_when_released() {
        let tracker = IssueTracker::new();
        let park = tracker.park_next();
        let call = {
            let tracker = tracker.clone();
            tokio::spawn(async move { tracker.call("createIssue", &json!({"title": "t"})).await })
        };
        park.wait_until_parked().await;
        assert_eq!(tracker.calls(), 1);
        assert!(tracker.issues().is_empty());
        park.release();
        assert!(call.await.expect("joined").is_ok());
        assert_eq!(tracker.issues().len(), 1);
    }
}

//! Edit before approve: the person changes a staged call's arguments and approves the
//! edited call (`gate approve ID --edit`).
//!
//! - **Checked first.** The edited arguments must be a JSON object that the tool's input
//!   schema (as the person accepted it in the catalog) validates; otherwise nothing is
//!   changed and nothing is sent, and the person is told each problem.
//! - **What is sent.** While the person holds the decision (no rule's drain can apply
//!   the call meanwhile), the edit replaces the staged call's arguments in its driver's
//!   store ([`gatekeeper_core::ToolGatekeeper::amend`]), then the call is approved: the
//!   edited call is what reaches the server, at most once, like any other.
//! - **Recorded with the original.** The ledger keeps the prompt the agent's call was
//!   staged with, and the approval's cause says that it was edited, by whom, what changed,
//!   and the digests of the call as staged and as sent.
//! - **Told to the agent.** The agent's outcome says "approved with changes" and what
//!   changed.
//! - **What an edit may not do.** Change the tool or the server: an edit is of the
//!   arguments of this one call. To call another tool, reject this one and say so.

use gatekeeper_core::EditError;
use kernel::{ActionState, DecisionError, LedgerId};
use prompt_sanitize::{MAX_DESCRIPTION_CHARS, MAX_INLINE_CHARS, code_span, plain_inline};
use serde_json::Value;

use crate::control::Response;
use crate::gateway::Gateway;

pub use gatekeeper_core::edit::EDITED;

/// Why the person's edit is refused; nothing was changed or sent.
fn refused(id: u64, why: impl std::fmt::Display) -> Response {
    Response {
        ok: false,
        text: format!("#{id}: not approved, and nothing was sent: {why}"),
    }
}

/// The arguments of pending action `id`, exactly as staged, for the person's editor.
pub async fn arguments(gateway: &Gateway, id: u64) -> Response {
    let ledger = LedgerId(id);
    let pending = gateway
        .overseer()
        .entry(ledger)
        .ok()
        .flatten()
        .and_then(|e| e.action().map(|a| a.state == ActionState::Pending));
    match (pending, gateway.arguments_of(ledger).await) {
        (Some(true), Some(args)) => Response {
            ok: true,
            text: serde_json::to_string_pretty(&args).unwrap_or_default(),
        },
        (Some(false), _) => Response {
            ok: false,
            text: format!("#{id} is no longer pending: only a pending call can be edited"),
        },
        _ => Response {
            ok: false,
            text: format!("there is no pending action #{id}; `gate pending` lists them"),
        },
    }
}

/// Check `edited` against the tool of pending action `id`, put it in place of the agent's
/// arguments and approve the call, recording both (see the module docs). The edit is made
/// while the person holds the decision ([`kernel::Overseer::approve_prepared`]): no rule
/// applies the agent's call meanwhile.
pub async fn approve_edited(
    gateway: &Gateway,
    id: u64,
    edited: Value,
    person: &str,
    stale_seen: bool,
) -> Response {
    let ledger = LedgerId(id);
    if let Some((agent, why)) = gateway.locked_caller(ledger) {
        return refused(
            id,
            format_args!(
                "agent {} is locked down because {}; nothing it staged may be sent any more",
                code_span(&agent, MAX_INLINE_CHARS),
                plain_inline(&why, MAX_DESCRIPTION_CHARS)
            ),
        );
    }
    let Some(entry) = gateway.overseer().entry(ledger).ok().flatten() else {
        return refused(id, "there is no such action; `gate pending` lists them");
    };
    let Some(action) = entry.action().filter(|a| a.state == ActionState::Pending) else {
        return refused(
            id,
            "it is no longer pending: only a pending call can be edited",
        );
    };
    let Some(downstream) = gateway.downstream(&entry.gatekeeper) else {
        return refused(id, "its server is no longer configured");
    };
    if !stale_seen && let Some(flag) = gateway.stale_check(ledger).await.flag(id) {
        return refused(id, flag);
    }
    let name = code_span(
        &gateway.person_name(
            &entry.gatekeeper,
            &action
                .description
                .action_kind
                .as_ref()
                .map(|k| k.label.clone())
                .unwrap_or_default(),
        ),
        MAX_INLINE_CHARS,
    );
    let driver_id = action.driver_id;
    let gatekeeper = downstream.gatekeeper.clone();
    let made = std::sync::Mutex::new(None);
    let prepare = async {
        match gatekeeper.amend(driver_id, edited).await {
            Ok(edit) => {
                let note = edit.note(person);
                *made.lock().unwrap_or_else(|p| p.into_inner()) = Some(edit);
                Ok(Some(note))
            }
            Err(EditError::Unchanged) => Ok(None),
            Err(EditError::Schema(problems)) => Err(format!(
                "the edited arguments do not fit {name}'s schema: {}; edit again",
                plain_inline(&problems, MAX_DESCRIPTION_CHARS)
            )),
            Err(error) => Err(error.to_string()),
        }
    };
    let result = gateway
        .overseer()
        .approve_prepared(ledger, person, prepare)
        .await;
    gateway.overseer().settle().await;
    let edit = made.into_inner().unwrap_or_else(|p| p.into_inner());
    let head = match &edit {
        Some(edit) => {
            tracing::info!(action = id, by = %person, "action.edited: the person changed a call's arguments before approving it");
            format!(
                "#{id}: edited by {}: {}",
                code_span(person, MAX_INLINE_CHARS),
                plain_inline(&edit.changes.join("; "), MAX_DESCRIPTION_CHARS)
            )
        }
        None => format!("#{id}: the edit changed nothing"),
    };
    match result {
        Ok(()) => Response {
            ok: true,
            text: format!("{head}\n  approved {ledger}: applied"),
        },
        Err(DecisionError::NotPrepared { reason, .. }) => refused(id, reason),
        Err(DecisionError::ApplyFailed { source, .. }) => Response {
            ok: false,
            text: format!(
                "{head}\n  approved {ledger}, but applying it failed: {}{}",
                plain_inline(&source.message, MAX_DESCRIPTION_CHARS),
                if source.retryable {
                    " (nothing reached the service: it stays open with the edit, and you may approve it again)"
                } else {
                    ""
                }
            ),
        },
        Err(error) => Response {
            ok: false,
            text: format!("{head}\n  {error}"),
        },
    }
}

/// The person edits pending action `id`'s arguments in their editor (`$VISUAL`, `$EDITOR`,
/// else `vi`), over the daemon's socket at `socket`: the arguments as staged go to a
/// private temporary file, the editor runs on it, and what it holds after is parsed.
/// Invalid JSON keeps the file and says how to approve from it once fixed.
pub fn in_editor(socket: &std::path::Path, id: u64) -> anyhow::Result<Value> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;

    use anyhow::{Context as _, bail};

    let staged = crate::control::request(socket, &crate::control::Request::Arguments { id })?;
    if !staged.ok {
        bail!("{}", staged.text);
    }
    let path = std::env::temp_dir().join(format!("gate-edit-{id}-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&path);
    {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("could not create {} for your editor", path.display()))?;
        writeln!(file, "{}", staged.text)?;
    }
    let editor = std::env::var("VISUAL")
        .or_else(|_| std::env::var("EDITOR"))
        .unwrap_or_else(|_| "vi".to_owned());
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{editor} \"$1\""))
        .arg("sh")
        .arg(&path)
        .status()
        .with_context(|| format!("could not run your editor ({editor})"))?;
    if !status.success() {
        let _ = std::fs::remove_file(&path);
        bail!("your editor ({editor}) exited with {status}; nothing was approved");
    }
    let text = std::fs::read_to_string(&path)?;
    match serde_json::from_str(&text) {
        Ok(value) => {
            let _ = std::fs::remove_file(&path);
            Ok(value)
        }
        Err(error) => bail!(
            "the edited call is not valid JSON ({error}); nothing was approved; your edit is kept in {}: fix it and run `gate approve {id} --arguments {}`",
            path.display(),
            path.display()
        ),
    }
}

//! The person's side: a unix socket only the owner can open (mode 0600, in the data
//! directory), never the agents' endpoint. Nothing an agent can call approves anything.
//! With `deciders` in the configuration the socket is created 0666 (usually outside the
//! data directory, `socket = "/run/gate/gate.sock"`), and every request is answered only
//! for a listed user or a member of a listed group ([`crate::deciders::SocketAccess`]).
//!
//! Who decides is the operating-system user behind the connection
//! ([`crate::person::peer_person`]), never a name in the request.
//!
//! One request per connection, one JSON line each way. Everything shown is rendered by the
//! shell crate from sanitized pieces, so a server's or an agent's text cannot forge a line
//! of the prompt.
//! Every answer is redacted of secrets ([`crate::redaction`]) unless the request asks to
//! reveal them (`gate show --reveal`), and then it says so.

use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::Arc;

use gatekeeper_core::describe::PROVENANCE_ACTION;
use kernel::LedgerId;
use prompt_sanitize::{
    MAX_ARGUMENTS_CHARS, MAX_DESCRIPTION_CHARS, MAX_INLINE_CHARS, code_span, json_arguments,
    plain_inline,
};
use serde::{Deserialize, Serialize};
use shell::{Decision, Effect, Shell};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{UnixListener, UnixStream};
use tracing::warn;

use crate::deciders::SocketAccess;
use crate::gateway::Gateway;
use crate::person;

/// The longest request line read from the socket.
pub const MAX_REQUEST_BYTES: u64 = 64 * 1024;

/// What the person asks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// The open actions, as a batch.
    Pending,
    /// Each server's catalog now, against the one a person accepted.
    Catalog,
    /// Accept a server's catalog as it is now (every server's when `server` is `None`):
    /// recorded, and what agents see and can call from then on.
    CatalogAccept {
        /// The server, as named in the configuration.
        server: Option<String>,
        /// One tool of that server to accept, the rest staying as accepted.
        #[serde(default)]
        tool: Option<String>,
    },
    /// The auto-approval rules, and the kinds each server could have one for.
    Rules,
    /// Enable an auto-approval rule for the tool `name` names: its agent-facing name, or
    /// its server and its name ([`crate::kinds::named`]).
    RuleAdd {
        /// The words naming it.
        name: Vec<String>,
        /// How far it reaches (the whole kind until removed by default).
        #[serde(default)]
        scope: crate::grants::GrantScope,
    },
    /// Whether a rule would apply a recorded action, part by part: the rule enabled for
    /// its kind, or the kind's narrowed by `tests` when given.
    RuleTest {
        /// Ledger id of the action.
        id: u64,
        /// The argument tests of a rule to try instead of the enabled one.
        #[serde(default)]
        tests: Option<Vec<kernel::ArgumentTest>>,
    },
    /// Remove an auto-approval rule, named the same way.
    RuleRemove {
        /// The words naming it.
        name: Vec<String>,
    },
    /// Ask the server's driver to undo an applied action.
    Revert {
        /// Ledger id.
        id: u64,
    },
    /// A page of the ledger, most recent first, filtered.
    Ledger {
        /// Which entries, and which page.
        query: crate::person::LedgerQuery,
    },
    /// Which agents are locked down, why, and the lifts recorded so far.
    Lockdown,
    /// Lift an agent's lockdown: a recorded decision of the person behind the socket.
    LockdownLift {
        /// The agent.
        agent: String,
        /// Why it is safe; recorded with the lift.
        reason: String,
    },
    /// The approval prompts of some actions.
    Show {
        /// Ledger ids.
        ids: Vec<u64>,
        /// Also every character of each call's arguments, however long.
        #[serde(default)]
        full: bool,
        /// Show the secrets the view would redact ([`crate::redaction`]): the real
        /// arguments, said to be so.
        #[serde(default)]
        reveal: bool,
    },
    /// Approve actions (or enable a rule for each one's kind).
    Approve {
        /// Ledger ids.
        ids: Vec<u64>,
        /// Enable an auto-approval rule for each action's kind instead (the shell's `k`).
        all_of_kind: bool,
        /// The person read each call's arguments in full (`gate show --full`): a call whose
        /// prompt could not show all of them is approved only then.
        #[serde(default)]
        full_seen: bool,
        /// The person saw that a write is stale (`gate show`: what it was staged against
        /// changed since) and approves it anyway: a stale write is approved only then.
        #[serde(default)]
        stale_seen: bool,
        /// With `all_of_kind`: how far the rule reaches.
        #[serde(default)]
        scope: crate::grants::GrantScope,
        /// The arguments the person edited the call to (one id only): checked against the
        /// tool's schema, and sent instead of the agent's ([`crate::edits`]).
        #[serde(default)]
        edited: Option<serde_json::Value>,
    },
    /// Answer the question a server asks during the person's approved send of an action
    /// ([`crate::questions`]).
    Answer {
        /// Ledger id of the action being sent.
        id: u64,
        /// `accept`, `decline` or `cancel`.
        action: String,
        /// With `accept`: the answer, as JSON text (checked against the question's schema).
        #[serde(default)]
        content: Option<String>,
    },
    /// Reject actions: nothing is sent, ever.
    Reject {
        /// Ledger ids.
        ids: Vec<u64>,
        /// Told to the agent that asks for the outcome.
        reason: Option<String>,
        /// Also reject the open writes built on each one (an edit of the file it writes, a
        /// move of it, an observation of an entity it creates); without it they are only
        /// flagged (held for a person, never applied automatically).
        #[serde(default)]
        cascade: bool,
    },
    /// The open work as rows for the review screen, each with its approval prompt; the
    /// answer's text is a [`crate::queue::Queue`] as JSON.
    Queue,
    /// The arguments of a pending action exactly as staged, as JSON, for the person's
    /// editor (`gate approve ID --edit`).
    Arguments {
        /// Ledger id.
        id: u64,
    },
    /// How many commits and syncs the daemon's SQLite store made since it opened, as
    /// JSON `{"commits": N, "syncs": N}`: what the benchmarks count a write's cost in.
    StoreCounts,
    /// A one-time link for pairing a device with the review page ([`crate::web`]).
    Pair {
        /// The device's name (`phone`).
        name: String,
    },
    /// The devices paired with the review page.
    Devices,
    /// Revoke a paired device: its passkey signs nothing from now on, and its sessions end.
    DeviceRevoke {
        /// The device's name.
        name: String,
    },
}

/// The daemon's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// Whether everything asked was done.
    pub ok: bool,
    /// What to show the person.
    pub text: String,
}

/// Why the socket could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// Another daemon answers on the socket.
    #[error(
        "another gate already listens on {0}; stop it first, or give this one another --data-dir (or another `socket` in its configuration)"
    )]
    InUse(String),
    /// The socket could not be created or restricted.
    #[error("could not set up the person's socket {path}: {source}")]
    Io {
        /// The socket.
        path: String,
        /// What failed.
        source: std::io::Error,
    },
    /// The daemon could not be reached or answered nonsense.
    #[error(
        "could not talk to the gate at {path}: {message}; is `gate serve` running, and is this its socket? (a daemon whose configuration sets `socket` is reached with --socket PATH or GATE_SOCKET=PATH)"
    )]
    Unreachable {
        /// The socket.
        path: String,
        /// What failed.
        message: String,
    },
    /// The socket, or its directory, is not open to this user.
    #[error(
        "you may not open the gate's socket {0} (permission denied): unless its configuration lists deciders it is the daemon's user's alone; run the command as that user, or ask the person who runs `gate serve` to add you to deciders and to put the socket where you can reach it (socket = \"/run/gate/gate.sock\")"
    )]
    Forbidden(String),
}

/// Bind the person's socket at `path`, owner-only (0600), or, when it is `shared` (the
/// configuration lists deciders), 0666: every account may connect, and each request is
/// checked against the deciders ([`crate::deciders::SocketAccess`]). A leftover socket
/// nobody answers on is replaced; one a live daemon answers on is refused.
pub fn bind(path: &Path, shared: bool) -> Result<UnixListener, ControlError> {
    let shown = path.display().to_string();
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(ControlError::InUse(shown));
        }
        std::fs::remove_file(path).map_err(|source| ControlError::Io {
            path: shown.clone(),
            source,
        })?;
    }
    let listener = UnixListener::bind(path).map_err(|source| ControlError::Io {
        path: shown.clone(),
        source,
    })?;
    let mode = if shared { 0o666 } else { 0o600 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|source| {
        ControlError::Io {
            path: shown,
            source,
        }
    })?;
    Ok(listener)
}

/// How long the person's command may take to send its request.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Answer the person's requests for as long as the daemon runs. An error accepting a
/// connection (the daemon out of descriptors, say) is logged and retried a moment later:
/// the person's channel never closes while agents are served. Each connection is answered
/// only if `access` lets its user use the socket.
pub async fn serve(
    listener: UnixListener,
    gateway: Arc<Gateway>,
    access: Arc<SocketAccess>,
    web: Option<Arc<crate::web::Web>>,
) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let gateway = gateway.clone();
                let access = access.clone();
                let web = web.clone();
                tokio::spawn(async move {
                    if let Err(error) = answer(stream, &gateway, &access, web.as_deref()).await {
                        warn!(%error, "control.connection.failed");
                    }
                });
            }
            Err(error) => {
                warn!(%error, "control.accept.failed: trying again shortly");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

async fn answer(
    stream: UnixStream,
    gateway: &Gateway,
    access: &SocketAccess,
    web: Option<&crate::web::Web>,
) -> std::io::Result<()> {
    // Whether this user may use the socket at all (the daemon's user, or the deciders):
    // checked for every request, listing as much as deciding.
    let allowed = access.check(&stream);
    // Who decides is whoever the kernel says is behind the socket, never a name the
    // request carries.
    let person = person::peer_person(&stream);
    let refused = person::started_by_gate(&stream);
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    tokio::time::timeout(
        REQUEST_TIMEOUT,
        tokio::io::BufReader::new(read.take(MAX_REQUEST_BYTES)).read_line(&mut line),
    )
    .await
    .map_err(|_| std::io::Error::other("the request did not arrive in time"))??;
    if let Err(text) = allowed {
        warn!(reason = %text, "control.refused: not a decider");
        let refusal = Response { ok: false, text };
        let mut out = serde_json::to_string(&refusal).expect("a response serialises");
        out.push('\n');
        return write.write_all(out.as_bytes()).await;
    }
    let response = match serde_json::from_str::<Request>(&line) {
        Ok(_) if refused.is_some() => Response {
            ok: false,
            text: refused.unwrap_or_default(),
        },
        Ok(request @ (Request::Pair { .. } | Request::Devices | Request::DeviceRevoke { .. })) => {
            crate::web::devices_request(web, request, person)
        }
        Ok(request) => respond(request, person, gateway).await,
        Err(error) => Response {
            ok: false,
            text: format!(
                "the gate did not understand the request ({error}); use the gate command of the same version"
            ),
        },
    };
    let mut out = serde_json::to_string(&response).expect("a response serialises");
    out.push('\n');
    write.write_all(out.as_bytes()).await
}

/// Do what `request` asks as `person` (the user behind the socket, or the person a paired
/// device decides for), and answer with secrets redacted unless the request asks to reveal
/// them: what the socket and the review page both answer with.
pub async fn respond(
    request: Request,
    person: Result<String, String>,
    gateway: &Gateway,
) -> Response {
    let view = crate::redaction::View::of(&request);
    let decides = !matches!(
        request,
        Request::Pending
            | Request::Catalog
            | Request::Rules
            | Request::RuleTest { .. }
            | Request::Ledger { .. }
            | Request::Lockdown
            | Request::Show { .. }
            | Request::Queue
            | Request::Arguments { .. }
            | Request::StoreCounts
    );
    let response = view.apply(gateway, execute(request, person, gateway).await);
    if decides {
        gateway.changed();
    }
    response
}

async fn execute(request: Request, person: Result<String, String>, gateway: &Gateway) -> Response {
    let overseer = gateway.overseer().clone();
    // A drain may be a send whose server asks the person a question: while one waits, the
    // person's commands go on without waiting for the drains (an answer is what ends it).
    if !matches!(request, Request::Answer { .. }) {
        let mut questions = gateway.questions().watch();
        tokio::select! {
            () = overseer.settle() => {}
            _ = questions.wait_for(|held| *held > 0) => {}
        }
    }
    gateway.expire_due().await;
    let mut ok = true;
    let mut lines: Vec<String> = Vec::new();
    let decides = matches!(
        request,
        Request::Approve { .. }
            | Request::Reject { .. }
            | Request::Answer { .. }
            | Request::RuleAdd { .. }
            | Request::RuleRemove { .. }
            | Request::Revert { .. }
            | Request::LockdownLift { .. }
    );
    let person = match person {
        Ok(person) => person,
        Err(why) if decides => {
            return Response {
                ok: false,
                text: format!(
                    "nothing was decided: the gate could not tell which user is asking ({why}); run the gate command as the user who runs `gate serve`"
                ),
            };
        }
        Err(_) => String::new(),
    };
    match request {
        Request::Rules
        | Request::RuleAdd { .. }
        | Request::RuleRemove { .. }
        | Request::RuleTest { .. }
        | Request::Revert { .. }
        | Request::Ledger { .. }
        | Request::Lockdown
        | Request::LockdownLift { .. } => {
            return person::execute(request, &person, gateway).await;
        }
        Request::Arguments { id } => return crate::edits::arguments(gateway, id).await,
        Request::Pending => {
            match Shell::new(overseer.clone(), "").batch() {
                Ok(batch) => lines.push(batch.to_string()),
                Err(error) => {
                    ok = false;
                    lines.push(error.to_string());
                }
            }
            // Writes on simulated servers: stale ones, and what each is built on.
            for entry in overseer.open_actions().unwrap_or_default() {
                lines.extend(simulation_notes(gateway, entry.id).await);
            }
            for (_, question) in gateway.questions().waiting() {
                lines.push(question);
            }
            // What the agents use of the person's limits.
            let open = overseer.open_actions().unwrap_or_default();
            lines.extend(gateway.quotas().report(&open, overseer.now()));
        }
        Request::Answer {
            id,
            action,
            content,
        } => {
            let answer = match action.as_str() {
                "accept" => Some(crate::questions::Answer::Accept(content)),
                "decline" => Some(crate::questions::Answer::Decline),
                "cancel" => Some(crate::questions::Answer::Cancel),
                _ => None,
            };
            match answer {
                Some(answer) => match gateway.questions().answer(id, &answer, &person).await {
                    Ok(text) => lines.push(text),
                    Err(text) => {
                        ok = false;
                        lines.push(text);
                    }
                },
                None => {
                    ok = false;
                    lines.push(
                        "an answer is accept, decline or cancel; use the gate command of the same version"
                            .to_owned(),
                    );
                }
            }
        }
        Request::Catalog => lines.push(gateway.catalog_report().await),
        Request::CatalogAccept { server, tool } => {
            match gateway
                .accept_catalog(server.as_deref(), tool.as_deref())
                .await
            {
                Ok(text) => lines.push(text),
                Err(text) => {
                    ok = false;
                    lines.push(text);
                }
            }
        }
        Request::Show { ids, full, reveal } => {
            let shell = Shell::new(overseer, "");
            let redactor = gateway.redactor().clone();
            for id in ids {
                let prompt = match shell.prompt(LedgerId(id)) {
                    Ok(prompt) => prompt.into_string(),
                    Err(error) => {
                        ok = false;
                        lines.push(format!("#{id}: {error}"));
                        continue;
                    }
                };
                let args = gateway.arguments_of(LedgerId(id)).await;
                let mut outcome = gateway.outcome(LedgerId(id)).await;
                // What its server asked during the send: the question that waits, or
                // (decided) the exchanges the ledger holds.
                let asked = match gateway.questions().shown(id) {
                    Some(question) => Some(question),
                    None => gateway.exchanges_of(LedgerId(id)),
                };
                let prompt = match asked {
                    Some(asked) if outcome.is_some() => {
                        outcome = outcome.map(|o| format!("{o}\n{asked}"));
                        prompt
                    }
                    Some(asked) => format!("{prompt}\n{asked}"),
                    None => prompt,
                };
                // A decided action: the staging-time "nothing has been sent yet" is
                // history, and the prompt ends with what happened.
                let prompt = match outcome {
                    Some(_) => without_staging_note(&prompt),
                    None => prompt,
                };
                if reveal {
                    lines.push(format!(
                        "#{id}: shown with its secrets revealed (--reveal): these are the real arguments, as approving sends them"
                    ));
                    lines.push(prompt);
                    lines.extend(outcome);
                    if full && let Some(args) = &args {
                        lines.push(full_arguments(id, args, None));
                    }
                    continue;
                }
                let shown = crate::redaction::prompt(&redactor, &prompt, args.as_ref());
                let mut hidden = shown.hidden;
                lines.push(shown.value);
                for note in simulation_notes(gateway, LedgerId(id)).await {
                    let note = redactor.text(&note);
                    hidden += note.hidden;
                    lines.push(note.value);
                }
                if let Some(outcome) = outcome {
                    let outcome = redactor.text(&outcome);
                    hidden += outcome.hidden;
                    lines.push(outcome.value);
                }
                if full && let Some(args) = &args {
                    let redacted = redactor.json(args);
                    let real = (redacted.hidden > 0)
                        .then(|| json_arguments(args, usize::MAX).as_str().chars().count());
                    lines.push(full_arguments(id, &redacted.value, real));
                }
                if hidden > 0 {
                    lines.push(format!(
                        "#{id}: {hidden} secret{} hidden in this view, each shown as [redacted: what it is, its length]; `gate show {id} --reveal` shows the real arguments",
                        if hidden == 1 { " is" } else { "s are" }
                    ));
                }
            }
        }
        Request::Approve {
            ids,
            all_of_kind,
            full_seen,
            stale_seen,
            scope,
            edited,
        } => {
            if let Some(edited) = edited {
                let [id] = ids[..] else {
                    return Response {
                        ok: false,
                        text: "nothing was approved: an edit changes one call; approve one id with --edit".to_owned(),
                    };
                };
                return crate::edits::approve_edited(gateway, id, edited, &person, stale_seen)
                    .await;
            }
            if !all_of_kind && !scope.is_whole_kind() {
                return Response {
                    ok: false,
                    text: "nothing was approved: --this-agent, --session, --for and the argument tests scope a rule; add --all-of-kind to enable one, or leave them out to approve the call alone".to_owned(),
                };
            }
            let decision = if all_of_kind {
                Decision::ApproveAllOfKind
            } else {
                Decision::Approve
            };
            for id in ids {
                // An agent whose workspace is locked down has nothing applied any more,
                // by a person or by a rule the person enables here.
                if let Some((agent, why)) = gateway.locked_caller(LedgerId(id)) {
                    ok = false;
                    lines.push(format!(
                        "#{id}: not applied: agent {} is locked down because {}; nothing it staged may be sent any more, but you may still reject it",
                        code_span(&agent, MAX_INLINE_CHARS),
                        plain_inline(&why, MAX_DESCRIPTION_CHARS)
                    ));
                    continue;
                }
                // A prompt that could not show every character of the arguments is approved
                // only by someone who read them all.
                // Redaction counts as shown (each marker says what it hides and how long it
                // is), but a view whose markers make it longer than a prompt shows is clipped.
                if !full_seen
                    && let Some(args) = gateway.arguments_of(LedgerId(id)).await
                    && let Some(length) = clipped_length(&args)
                        .or_else(|| clipped_length(&gateway.redactor().json(&args).value))
                {
                    ok = false;
                    lines.push(format!(
                        "#{id}: not approved: its arguments are {length} characters and its prompt shows the first {MAX_ARGUMENTS_CHARS}; read them all with `gate show {id} --full`, then approve with `gate approve {id} --full-seen`"
                    ));
                    continue;
                }
                // A write whose target changed since it was staged (checked now, with real
                // reads of its server) is approved only by someone who saw that.
                if !stale_seen && let Some(flag) = gateway.stale_check(LedgerId(id)).await.flag(id)
                {
                    ok = false;
                    lines.push(format!("#{id}: not approved: {flag}"));
                    continue;
                }
                // A rule is enabled only where `gate rules add` would enable it, and refused
                // with the same reason.
                let target = if all_of_kind {
                    let scoped = rule_target_of(gateway, LedgerId(id)).and_then(|target| {
                        let entry = overseer.entry(LedgerId(id)).ok().flatten();
                        crate::grants::scope_of(gateway, &scope, &target, entry.as_ref())
                            .map(|rule_scope| (target, rule_scope))
                    });
                    match scoped {
                        Ok(scoped) => Some(scoped),
                        Err(why) => {
                            ok = false;
                            lines.push(format!(
                                "#{id}: not approved, and no rule was enabled: {why}; approve it alone with `gate approve {id}`"
                            ));
                            continue;
                        }
                    }
                } else {
                    None
                };
                let shell = Shell::new(overseer.clone(), person.as_str()).with_rule_scope(
                    target
                        .as_ref()
                        .map(|(_, scope)| scope.clone())
                        .unwrap_or_default(),
                );
                let target = target.map(|(target, _)| target);
                match shell.decide(LedgerId(id), decision).await {
                    Ok(decided) => {
                        ok &= !matches!(decided.effect, Effect::Refused | Effect::Failed { .. });
                        lines.push(decided.report.to_string());
                        if let (Some(target), Effect::RuleEnabled) = (target, &decided.effect) {
                            lines.push(format!(
                                "  the rule covers {}; remove it with `gate rules remove {}`",
                                code_span(&target.name, MAX_INLINE_CHARS),
                                target.name
                            ));
                        }
                    }
                    Err(error) => {
                        ok = false;
                        lines.push(format!("#{id}: {error}"));
                    }
                }
            }
        }
        Request::Reject {
            ids,
            reason,
            cascade,
        } => {
            let shell = Shell::new(overseer, person);
            let mut queue: std::collections::VecDeque<(u64, Option<u64>)> =
                ids.into_iter().map(|id| (id, None)).collect();
            while let Some((id, root)) = queue.pop_front() {
                let ledger = LedgerId(id);
                // Found before the rejection: built on it, by what was recorded at staging.
                let built_on = gateway.built_on(ledger);
                let why = match root {
                    None => reason.clone(),
                    Some(root) => Some(format!(
                        "it was built on #{root}, which was rejected{}",
                        reason
                            .as_deref()
                            .map(|r| format!(" ({r})"))
                            .unwrap_or_default()
                    )),
                };
                match shell
                    .decide_with_reason(ledger, Decision::Reject, why.as_deref())
                    .await
                {
                    Ok(decided) => {
                        ok &= decided.effect == Effect::Rejected;
                        lines.push(decided.report.to_string());
                        if decided.effect != Effect::Rejected || built_on.is_empty() {
                            continue;
                        }
                        let ids = built_on
                            .iter()
                            .map(|d| d.to_string())
                            .collect::<Vec<_>>()
                            .join(", ");
                        if cascade {
                            lines.push(format!(
                                "#{id}: rejecting what was built on it too (--cascade): {ids}"
                            ));
                            for dependent in built_on {
                                if !queue.iter().any(|(q, _)| *q == dependent.0) {
                                    queue.push_back((dependent.0, Some(id)));
                                }
                            }
                        } else {
                            let plain = built_on
                                .iter()
                                .map(|d| d.0.to_string())
                                .collect::<Vec<_>>()
                                .join(" ");
                            lines.push(format!(
                                "#{id}: built on it, so flagged (held for you, never applied automatically): {ids}; reject them with `gate reject {plain}` (or next time `gate reject ID --cascade`), or decide each"
                            ));
                        }
                    }
                    Err(error) => {
                        ok = false;
                        lines.push(format!("#{id}: {error}"));
                    }
                }
            }
        }
        Request::Pair { .. } | Request::Devices | Request::DeviceRevoke { .. } => {
            // Answered beside the review page's state, before this ([`answer`]).
            ok = false;
            lines.push("the review page's devices are managed from the person's socket".to_owned());
        }
        Request::StoreCounts => match gateway.store_counts() {
            Some((commits, syncs)) => {
                lines.push(serde_json::json!({"commits": commits, "syncs": syncs}).to_string())
            }
            None => {
                ok = false;
                lines.push("this daemon's store is the team's PostgreSQL database, which counts no commits or syncs of its own here".to_owned());
            }
        },
        Request::Queue => match crate::queue::snapshot(gateway).await {
            Ok(queue) => lines.push(serde_json::to_string(&queue).expect("a queue serialises")),
            Err(error) => {
                ok = false;
                lines.push(error.to_string());
            }
        },
    }
    Response {
        ok,
        text: lines.join("\n"),
    }
}

/// What a person should know of the open write `id` on a simulated server before deciding
/// it: STALE (or not checked), with the command that approves it anyway, and the writes
/// it is built on (`built on #M`), one line each, each starting `#id:`.
pub async fn simulation_notes(gateway: &Gateway, id: LedgerId) -> Vec<String> {
    let mut notes = Vec::new();
    let open = gateway
        .overseer()
        .entry(id)
        .ok()
        .flatten()
        .and_then(|e| e.action().map(kernel::ActionEntry::is_open))
        .unwrap_or(false);
    if !open {
        return notes;
    }
    if let Some(flag) = gateway.stale_check(id).await.flag(id.0) {
        notes.push(format!("{id}: {flag}"));
    }
    if let Some(crate::pending::Recorded::Basis(basis)) = gateway.basis_of(id) {
        for root in &basis.built_on {
            notes.push(format!(
                "{id}: built on #{root} (its effect needs #{root}'s: rejecting #{root} flags it, `gate reject {root} --cascade` rejects it too)"
            ));
        }
    }
    notes
}

/// What the prompt said at staging time that is no longer news once the action is
/// decided.
const STAGING_NOTE: &str = " Nothing has been sent yet.";

/// `prompt` without the staging-time note on the gatekeeper's own provenance line (a
/// line of the gate's words, never of untrusted text: that is quoted on lines of its own).
fn without_staging_note(prompt: &str) -> String {
    let provenance = format!("  ┆ {PROVENANCE_ACTION}");
    prompt
        .split('\n')
        .map(|line| {
            if line == provenance {
                line.strip_suffix(STAGING_NOTE).unwrap_or(line)
            } else {
                line
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// How many characters a call's arguments are, as its prompt prints them, when that is
/// more than the prompt shows (it keeps [`MAX_ARGUMENTS_CHARS`]); `None` when it shows
/// them all.
pub fn clipped_length(args: &serde_json::Value) -> Option<usize> {
    let length = json_arguments(args, usize::MAX).as_str().chars().count();
    (length > MAX_ARGUMENTS_CHARS).then_some(length)
}

/// Every character of action `id`'s arguments, as a prompt prints them (sanitized, in a
/// fence), with their length: what `gate show --full` adds. `real` is the length of the
/// real arguments when `args` are their redacted view.
fn full_arguments(id: u64, args: &serde_json::Value, real: Option<usize>) -> String {
    let body = json_arguments(args, usize::MAX);
    let length = body.as_str().chars().count();
    let redacted = real
        .map(|real| format!(", secrets redacted; {real} characters with them"))
        .unwrap_or_default();
    format!(
        "#{id}: its arguments in full ({length} characters{redacted}):\n```json\n{}\n```",
        body.as_str()
    )
}

/// Send one request to the daemon whose socket is `path`, and wait for its answer.
pub fn request(path: &Path, request: &Request) -> Result<Response, ControlError> {
    let unreachable = |message: String| ControlError::Unreachable {
        path: path.display().to_string(),
        message,
    };
    let mut stream = std::os::unix::net::UnixStream::connect(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::PermissionDenied {
            ControlError::Forbidden(path.display().to_string())
        } else {
            unreachable(e.to_string())
        }
    })?;
    let mut line = serde_json::to_string(request).expect("a request serialises");
    line.push('\n');
    stream
        .write_all(line.as_bytes())
        .map_err(|e| unreachable(e.to_string()))?;
    let mut answer = String::new();
    BufReader::new(stream)
        .read_line(&mut answer)
        .map_err(|e| unreachable(e.to_string()))?;
    serde_json::from_str(&answer).map_err(|e| unreachable(format!("unreadable answer: {e}")))
}

/// The tool a rule for action `ledger`'s kind would cover, if a rule can cover it
/// ([`crate::kinds::rule_target`]).
fn rule_target_of(gateway: &Gateway, ledger: LedgerId) -> Result<crate::kinds::RuleTarget, String> {
    let entry = gateway
        .overseer()
        .entry(ledger)
        .ok()
        .flatten()
        .ok_or_else(|| "there is no such action".to_owned())?;
    let tool = entry
        .action()
        .and_then(|a| a.description.action_kind.as_ref())
        .map(|k| k.label.clone())
        .ok_or_else(|| "it has no kind, so no rule can cover it".to_owned())?;
    crate::kinds::rule_target(gateway, &entry.gatekeeper, &tool)
}

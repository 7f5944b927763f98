//! The conformance suite's client scenarios with `gate` as the MCP client: the suite starts
//! a scenario's test server, and `xtask/e2e/conformance-client.mjs` puts that server behind
//! a `gate serve` of its own (a downstream `url = ...` server, with the person's `reads` and
//! `forward_elicitation` where the scenario needs them, and `[server.oauth]` with the
//! person's `gate login` for the authorization scenarios) and drives an agent through the
//! gate so that the gate does what the scenario checks.
//!
//! Every scenario of the pinned suite's client list is in the printed table: it applies and
//! runs, or it does not apply and the table says why. A scenario that does not apply but
//! can still run (`initialize`) runs anyway, and must fail exactly as its reason says.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::super::{Report, bounded_output, last_lines, run_bounded};
use super::{Layout, PACKAGES};

/// The pinned suite's client scenarios (`conformance list`): 4 core, 22 `auth/*` (20 of
/// which apply: the gate logs in as a person's client or as a client of its own).
const CLIENT_SCENARIOS: usize = 26;

/// How long the suite may take over one client scenario (its own limit for the client
/// command is 30 s; the gate starts in well under a second).
const SCENARIO_LIMIT: Duration = Duration::from_secs(120);

/// Whether a scenario applies to `gate` as a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fit {
    /// It runs, and must pass.
    Applies,
    /// It does not apply, yet it runs: its findings must be exactly `expect` (the suite's
    /// failed checks, as `name: message`), for `why`.
    Differs {
        expect: &'static str,
        why: &'static str,
    },
    /// It does not apply and does not run, for this reason.
    NotApplicable(&'static str),
}

/// Why `initialize` does not apply, and what it must find.
const INITIALIZE: Fit = Fit::Differs {
    expect: "MCPClientInitialization: Version mismatch: expected 2025-11-25, got 2026-07-28",
    why: "the gate's MCP client (rmcp 3.11) offers the newest protocol it speaks, 2026-07-28, \
          as the specification says a client should (the server answers with one it supports: \
          this one answers 2025-11-25, and the gate goes on with it, listing the server's \
          tools); suite 0.1.16 predates 2026-07-28 and fails any offer but 2025-06-18 and \
          2025-11-25 (its later versions, 0.2.0-alpha, count 2026-07-28 as negotiable). It \
          runs anyway, and its one failed check must be that version",
};

/// Why the legacy metadata scenario does not apply, and what it must find.
const ISSUER_MISMATCH: Fit = Fit::Differs {
    expect: "Expected Check Missing: client-registration: Expected Check Missing: client-registration; \
             Expected Check Missing: authorization-request: Expected Check Missing: authorization-request; \
             Expected Check Missing: token-request: Expected Check Missing: token-request",
    why: "the scenario's server (2025-03-26, no protected resource metadata) publishes its \
          authorization server metadata at its root with `issuer` naming another URL (`/oauth`); \
          RFC 8414 section 3.3 says a client must not use metadata whose issuer differs from \
          the URL it was fetched for, and the gate (rmcp 3.11's discovery) refuses it, so \
          `gate login` stops before registering, naming the mismatch (the wrapper checks \
          that it does). The suite counts the three steps never taken",
};

/// Why the enterprise scenario does not apply.
const NO_ENTERPRISE_IDP: &str = "it wants an enterprise identity provider's ID token exchanged \
     for an authorization grant (RFC 8693 token exchange, then the JWT bearer grant, SEP-990); \
     the gate has no identity provider to get an ID token from: a person logs in \
     (`gate login`), or the gate is a client of its own (client credentials)";

/// How `name`, a client scenario of the pinned suite, fits; `None` for one this file does
/// not know (the suite changed), which fails the run rather than being skipped.
fn fit(name: &str) -> Option<Fit> {
    match name {
        "tools_call" | "elicitation-sep1034-client-defaults" | "sse-retry" => Some(Fit::Applies),
        "initialize" => Some(INITIALIZE),
        "auth/2025-03-26-oauth-metadata-backcompat" => Some(ISSUER_MISMATCH),
        "auth/cross-app-access-complete-flow" => Some(Fit::NotApplicable(NO_ENTERPRISE_IDP)),
        _ if name.starts_with("auth/") => Some(Fit::Applies),
        _ => None,
    }
}

/// What a scenario that ran came to: its warnings when it passed, or why it failed.
type Outcome = Result<Vec<String>, String>;

/// Run the client part: every client scenario classified, those that run run, the table
/// printed, the checks counted in `report`.
pub(super) fn run(layout: &Layout, gate: &Path, report: &mut Report) {
    let started = Instant::now();
    let names = match scenario_list(layout) {
        Ok(names) => names,
        Err(why) => {
            report.check("the conformance suite lists its client scenarios", Err(why));
            return;
        }
    };
    let unknown: Vec<&str> = names
        .iter()
        .filter(|n| fit(n).is_none())
        .map(String::as_str)
        .collect();
    report.check(
        &format!(
            "every one of the suite's {CLIENT_SCENARIOS} client scenarios is classified as applying to gate as a client or not"
        ),
        if names.len() != CLIENT_SCENARIOS {
            Err(format!(
                "the suite lists {} client scenarios, not {CLIENT_SCENARIOS}: {}",
                names.len(),
                names.join(", ")
            ))
        } else if !unknown.is_empty() {
            Err(format!("not classified: {}", unknown.join(", ")))
        } else {
            Ok(String::new())
        },
    );

    let scratch =
        std::env::temp_dir().join(format!("gate-conformance-client-{}", std::process::id()));
    let mut ran: Vec<(String, Outcome)> = Vec::new();
    for name in &names {
        if matches!(fit(name), Some(Fit::Applies | Fit::Differs { .. })) {
            let outcome = scenario(layout, gate, name, &scratch.join(dir_name(name)));
            ran.push((name.clone(), outcome));
        }
    }
    let ok = table(&names, &ran, report);
    if ok {
        let _ = fs::remove_dir_all(&scratch);
    } else {
        eprintln!(
            "e2e: the client scenarios' gate configurations and logs are kept in {}",
            scratch.display()
        );
    }
    println!(
        "e2e: the client scenarios took {:.1} s; their findings are in {}",
        started.elapsed().as_secs_f64(),
        layout.results.join("client").display()
    );
}

/// The suite's client scenarios, in its order, from `conformance list`.
fn scenario_list(layout: &Layout) -> Result<Vec<String>, String> {
    let mut list = Command::new(&layout.node);
    list.arg(&layout.suite).arg("list").env("NO_COLOR", "1");
    let out = bounded_output(list, Duration::from_secs(60))
        .map_err(|e| format!("`conformance list` failed: {e}"))?;
    let names = client_scenarios(&out);
    if names.is_empty() {
        return Err(format!(
            "`conformance list` named no client scenario:\n{}",
            last_lines(&out, 20)
        ));
    }
    Ok(names)
}

/// The names under "Client scenarios" in `conformance list`'s output
/// (`  - initialize [2025-06-18,2025-11-25]`).
fn client_scenarios(listing: &str) -> Vec<String> {
    listing
        .lines()
        .skip_while(|l| !l.starts_with("Client scenarios"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.trim().strip_prefix("- "))
        .map(|l| l.split(" [").next().unwrap_or(l).trim().to_owned())
        .collect()
}

/// A scenario's name as one directory name (`auth/basic-cimd` → `auth_basic-cimd`).
fn dir_name(name: &str) -> String {
    name.replace('/', "_")
}

/// A word for a POSIX shell, quoted: the suite runs the client command through `sh -c`.
fn shell_word(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// Run one client scenario with the wrapper as the client; its outcome, from the checks it
/// saved in `results/client/<scenario>` and the wrapper's exit.
fn scenario(layout: &Layout, gate: &Path, name: &str, work: &Path) -> Outcome {
    let out = layout.results.join("client").join(dir_name(name));
    let _ = fs::remove_dir_all(&out);
    fs::create_dir_all(&out).map_err(|e| format!("could not create {}: {e}", out.display()))?;
    let node_bin = layout.node.parent().unwrap_or(Path::new("/"));
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![node_bin.to_path_buf()];
    paths.extend(std::env::split_paths(&path));
    let client = format!(
        "{} {}",
        shell_word(&layout.node.to_string_lossy()),
        shell_word(&layout.client.to_string_lossy())
    );
    let mut command = Command::new(&layout.node);
    command
        .arg(&layout.suite)
        .args(["client", "--scenario", name, "--command", &client])
        .arg("--output-dir")
        .arg(&out)
        .env(
            "PATH",
            std::env::join_paths(paths).map_err(|e| e.to_string())?,
        )
        .env("NO_COLOR", "1")
        .env("GATE_BIN", gate)
        .env("GATE_SDK_MODULES", &layout.modules)
        .env("GATE_CLIENT_WORK", work)
        .env_remove("RUST_LOG");
    let (status, stdout, stderr) = run_bounded(command, SCENARIO_LIMIT)
        .map_err(|e| format!("the conformance suite's scenario {name}: {e}"))?;
    let said = format!("{stdout}\n{stderr}");
    let _ = fs::write(out.join("suite.log"), &said);
    let saved = saved_run(&out)
        .ok_or_else(|| format!("it saved no checks ({status}):\n{}", last_lines(&said, 20)))?;
    let client_error = if said.contains("Client timed out after") {
        Some("the client command timed out".to_owned())
    } else if said.contains("Client exited with code") {
        let wrapper: Vec<&str> = saved
            .stderr
            .lines()
            .filter(|l| l.starts_with("conformance-client: "))
            .collect();
        Some(format!(
            "the client command failed: {}",
            if wrapper.is_empty() {
                last_lines(&saved.stderr, 10)
            } else {
                wrapper.join("; ")
            }
        ))
    } else {
        None
    };
    verdict(&saved.checks, client_error)
}

/// What the suite saved for one scenario: its checks and the client command's stderr.
struct Saved {
    checks: Vec<Value>,
    stderr: String,
}

/// The one `<scenario>-<timestamp>` directory the suite saved under `out`.
fn saved_run(out: &Path) -> Option<Saved> {
    // `auth/basic-cimd` is saved as `auth/basic-cimd-<timestamp>`: one level further down.
    let find = |dir: &Path| -> Option<PathBuf> {
        fs::read_dir(dir)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.join("checks.json").is_file())
    };
    let dir: PathBuf = find(out).or_else(|| {
        fs::read_dir(out)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .find_map(|p| find(&p))
    })?;
    let checks = serde_json::from_str(&fs::read_to_string(dir.join("checks.json")).ok()?).ok()?;
    let stderr = fs::read_to_string(dir.join("stderr.txt")).unwrap_or_default();
    Some(Saved { checks, stderr })
}

/// A scenario passes when it made a check, none failed and the client command succeeded;
/// its warnings are kept to be shown (the server part counts them the same way). A check
/// says why in `errorMessage`, or (one the suite adds for a tool never called) in
/// `details.message`.
fn verdict(checks: &[Value], client_error: Option<String>) -> Outcome {
    let with = |status: &str| -> Vec<String> {
        checks
            .iter()
            .filter(|c| c["status"] == status)
            .map(|c| {
                format!(
                    "{}: {}",
                    c["name"].as_str().unwrap_or("?"),
                    c["errorMessage"]
                        .as_str()
                        .or(c["details"]["message"].as_str())
                        .or(c["description"].as_str())
                        .unwrap_or("failed")
                )
            })
            .collect()
    };
    let failed = with("FAILURE");
    let mut why = failed;
    why.extend(client_error);
    if checks.is_empty() {
        why.insert(0, "it made no check".to_owned());
    }
    if why.is_empty() {
        Ok(with("WARNING"))
    } else {
        Err(why.join("; "))
    }
}

/// Print the table of every client scenario and check the outcomes; whether all is well.
fn table(names: &[String], ran: &[(String, Outcome)], report: &mut Report) -> bool {
    let width = names.iter().map(|n| n.len()).max().unwrap_or(0);
    println!(
        "conformance: {} client scenarios of @modelcontextprotocol/conformance {}, gate as the client",
        names.len(),
        PACKAGES[0].1
    );
    println!("  {:width$}  applies  result", "scenario");
    let outcome = |name: &str| ran.iter().find(|(n, _)| n == name).map(|(_, o)| o);
    let mut failing = Vec::new();
    let mut differs = Vec::new();
    let (mut applied, mut passed) = (0, 0);
    for name in names {
        let (applies, result) = match (fit(name), outcome(name)) {
            (Some(Fit::Applies), Some(Ok(warnings))) => {
                applied += 1;
                passed += 1;
                let note = if warnings.is_empty() {
                    String::new()
                } else {
                    format!(" (warned: {})", warnings.join("; "))
                };
                ("yes", format!("pass{note}"))
            }
            (Some(Fit::Applies), Some(Err(why))) => {
                applied += 1;
                failing.push(format!("{name}: {why}"));
                ("yes", format!("FAIL  {why}"))
            }
            (Some(Fit::Differs { expect, why }), Some(found)) => {
                let seen = match found {
                    Ok(_) => "it passed".to_owned(),
                    Err(e) => e.clone(),
                };
                if found.as_ref().err().map(String::as_str) == Some(expect) {
                    differs.push(format!("{name}: {why} (the suite saw: {seen})"));
                    (
                        "no",
                        "ran; differs as its reason says (see below)".to_owned(),
                    )
                } else {
                    failing.push(format!(
                        "{name}: expected only \"{expect}\", the suite saw: {seen}"
                    ));
                    ("no", format!("FAIL  expected \"{expect}\"; saw: {seen}"))
                }
            }
            (Some(Fit::NotApplicable(why)), _) => ("no", format!("not run: {why}")),
            (None, _) => {
                failing.push(format!("{name}: not classified"));
                (
                    "?",
                    "FAIL  not classified in xtask/src/e2e/conformance/client.rs".to_owned(),
                )
            }
            (Some(_), None) => {
                failing.push(format!("{name}: did not run"));
                ("yes", "FAIL  did not run".to_owned())
            }
        };
        println!("  {name:width$}  {applies:7}  {result}");
    }
    println!(
        "conformance: {passed}/{applied} client scenarios that apply pass with gate as the client; {} do not apply",
        names.len() - applied
    );
    for line in &differs {
        println!("conformance: does not apply, ran: {line}");
    }
    report.check(
        "with gate as the client, every client scenario that applies passes, and every other fails only as its reason says",
        if failing.is_empty() && applied > 0 {
            Ok(format!("{passed}/{applied}"))
        } else if failing.is_empty() {
            Err("no client scenario applied".to_owned())
        } else {
            Err(failing.join("\n  "))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listing_gives_the_client_scenarios_in_order() {
        let listing = "Server scenarios (test against a server):\n  - ping [2025-06-18,2025-11-25]\n\n\
                       Client scenarios (test against a client):\n  - initialize [2025-06-18,2025-11-25]\n  \
                       - auth/basic-cimd [2025-11-25]\n  - sse-retry\n";
        assert_eq!(
            client_scenarios(listing),
            ["initialize", "auth/basic-cimd", "sse-retry"]
        );
        assert!(client_scenarios("Server scenarios:\n  - ping\n").is_empty());
    }

    #[test]
    fn every_client_scenario_of_the_pinned_suite_is_classified() {
        let pinned = [
            "initialize",
            "tools_call",
            "elicitation-sep1034-client-defaults",
            "sse-retry",
            "auth/metadata-default",
            "auth/cross-app-access-complete-flow",
        ];
        assert!(pinned.iter().all(|n| fit(n).is_some()));
        assert_eq!(fit("tools_call"), Some(Fit::Applies));
        assert_eq!(fit("auth/basic-cimd"), Some(Fit::Applies));
        assert_eq!(
            fit("auth/cross-app-access-complete-flow"),
            Some(Fit::NotApplicable(NO_ENTERPRISE_IDP))
        );
        assert_eq!(fit("something-new"), None);
    }

    #[test]
    fn a_client_scenario_fails_on_a_failed_check_or_a_failed_client() {
        let ok = serde_json::json!([{ "status": "SUCCESS" }, { "status": "WARNING", "name": "W", "errorMessage": "late" }]);
        let bad = serde_json::json!([{ "status": "FAILURE", "name": "X", "errorMessage": "why" }]);
        let uncalled = serde_json::json!([{ "status": "FAILURE", "name": "T", "description": "d", "details": { "message": "Tool was not called by client" } }]);
        assert_eq!(
            verdict(uncalled.as_array().unwrap(), None),
            Err("T: Tool was not called by client".to_owned())
        );
        assert_eq!(
            verdict(ok.as_array().unwrap(), None),
            Ok(vec!["W: late".to_owned()])
        );
        assert_eq!(
            verdict(bad.as_array().unwrap(), None),
            Err("X: why".to_owned())
        );
        assert_eq!(
            verdict(ok.as_array().unwrap(), Some("it crashed".to_owned())),
            Err("it crashed".to_owned())
        );
        assert!(verdict(&[], None).is_err());
    }

    #[test]
    fn shell_words_survive_spaces_and_quotes() {
        assert_eq!(shell_word("/a b/node"), "'/a b/node'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
    }
}

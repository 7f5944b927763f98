//! A team's gate: two `gate serve` processes on one PostgreSQL database (a throwaway
//! cluster these tests start), each in front of its own fixture MCP server process, both
//! servers writing one delivery log. An agent stages through one daemon, people decide
//! through either; deliveries are counted from the servers' log, not from the gate.

#[path = "support/daemon.rs"]
mod daemon;
#[path = "support/fixture.rs"]
mod fixture;

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rmcp::RoleClient;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use serde_json::{Value, json};
use store_postgres::cluster::Cluster;

use daemon::{CODER_TOKEN, action_id, answer_until, eventually, me};
use fixture::{fixture_binary, free_port};

/// A scratch directory with the shared delivery log, removed when dropped.
struct Team {
    dir: PathBuf,
    log: PathBuf,
    db: String,
}

impl Team {
    fn new(name: &str) -> Self {
        Self::on(name, Cluster::shared())
    }

    fn on(name: &str, cluster: &Cluster) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "gate-team-{}-{}-{name}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        let log = dir.join("deliveries.log");
        // The fixture's log exists before the daemon starts its confined server: a file
        // made later beside the configuration would be out of that server's reach.
        std::fs::write(&log, "").expect("the fixture's log");
        Self {
            dir,
            log,
            db: cluster.fresh_database(),
        }
    }

    /// Start daemon `name` on the team's database: the first through `db` in its file,
    /// the others through `--db`.
    fn daemon(&self, name: &str, through_flag: bool) -> Daemon {
        let config = self.dir.join(format!("{name}.toml"));
        let db_line = if through_flag {
            String::new()
        } else {
            format!("db = {:?}\n", self.db)
        };
        std::fs::write(
            &config,
            format!(
                r#"listen = "127.0.0.1:{port}"
{db_line}
[[server]]
name = "fixture"
command = {fixture:?}
env = {{ MCP_FIXTURE_LOG = {log:?} }}
trust = "vetted"

[[agent]]
name = "coder"
token = "{CODER_TOKEN}"

[[agent.grant]]
server = "fixture"
"#,
                port = free_port(),
                fixture = fixture_binary().to_string_lossy(),
                log = self.log.to_string_lossy(),
            ),
        )
        .expect("config written");
        let data = self.dir.join(name);
        let mut command = daemon::serve_command(&config, &data);
        if through_flag {
            command.arg("--db").arg(&self.db);
        }
        let (child, url) = daemon::spawn_serve_command(command);
        Daemon { child, data, url }
    }

    /// Who the shared ledger says decided action `id`, and its state, read with SQL.
    fn decided(&self, id: &str) -> (Option<String>, Option<String>) {
        let db = store_postgres::Database::open(&self.db).expect("the team's database opens");
        let rows = db
            .query_text(&format!(
                "SELECT resolved_by, state FROM ledger WHERE id = {}",
                id.parse::<u64>().expect("an id")
            ))
            .expect("the ledger reads");
        let row = rows.into_iter().next().expect("the entry exists");
        (row[0].clone(), row[1].clone())
    }

    fn deliveries(&self) -> Vec<String> {
        daemon::read_deliveries(&self.log)
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

struct Daemon {
    child: Child,
    data: PathBuf,
    url: String,
}

impl Daemon {
    async fn agent(&self) -> RunningService<RoleClient, ()> {
        daemon::connect(&self.url, CODER_TOKEN).await
    }

    /// A person's command against this daemon, as `person`.
    fn person(&self, person: &str, args: &[&str]) -> Output {
        self.person_command(person, args)
            .output()
            .expect("gate runs")
    }

    /// `gate ARGS` against this daemon. `person` only tells the reader who is meant: the
    /// daemon records the operating-system user behind its socket ([`me`]), whatever the
    /// environment says.
    fn person_command(&self, person: &str, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_gate"));
        command
            .args(args)
            .arg("--data-dir")
            .arg(&self.data)
            .env("USER", person);
        command
    }

    fn kill(&mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaped");
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Call `tool` as `agent` and return the answer's text.
async fn call(agent: &RunningService<RoleClient, ()>, tool: &str, args: Value) -> String {
    daemon::text(&daemon::call(agent, tool, args).await)
}

/// `daemon`, running all along, finds the claim a killed daemon left on action `id`: its
/// agent is told the call may have reached the server (never that it was sent), and a
/// person's approval through it is refused: a call that may have landed is final.
async fn settles_the_dead_daemons_claim(
    daemon: &Daemon,
    agent: &RunningService<RoleClient, ()>,
    id: u64,
    who: &str,
) {
    let outcome = answer_until(
        &format!("{who} settling the dead daemon's claim"),
        agent,
        "gate_action_result",
        json!({"action_id": id}),
        |outcome| outcome.contains("may have reached the server"),
    )
    .await;
    assert!(!outcome.contains("approved and sent"), "{who}: {outcome}");
    let again = daemon.person("bob", &["approve", &id.to_string()]);
    assert!(
        !again.status.success(),
        "{who}: a call that may have landed is never sent again: {}",
        stdout(&again)
    );
}

fn stdout(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_decision_made_through_the_other_daemon_is_applied_exactly_once() {
    let team = Team::new("decide");
    let a = team.daemon("a", false);
    let b = team.daemon("b", true);
    assert!(a.data.is_dir() && b.data.is_dir());
    let coder = a.agent().await;
    let id = action_id(&call(&coder, "fixture__write_note", json!({"text": "hi"})).await);

    // One queue: the person at daemon B sees what the agent staged through A.
    let pending = b.person("bob", &["pending"]);
    assert!(pending.status.success(), "{pending:?}");
    assert!(
        stdout(&pending).contains(&format!("#{id}  pending  [fixture]")),
        "{}",
        stdout(&pending)
    );
    let approve = b.person("bob", &["approve", &id.to_string()]);
    assert!(approve.status.success(), "{}", stdout(&approve));
    assert_eq!(team.deliveries(), [r#"write_note {"text":"hi"}"#]);

    // Through A: already decided; nothing is sent again.
    let again = a.person("ana", &["approve", &id.to_string()]);
    assert!(!again.status.success(), "{}", stdout(&again));
    assert_eq!(team.deliveries().len(), 1, "delivered exactly once");
    let outcome = call(&coder, "gate_action_result", json!({"action_id": id})).await;
    assert!(outcome.contains("approved and sent"), "{outcome}");
    assert_eq!(
        team.decided(&id.to_string()),
        (Some(me()), Some("approved".into())),
        "the ledger names who decided"
    );
    // `gate ledger` on a team's database reads the kernel's ledger (there is no file).
    let ledger = a.person("ana", &["ledger", "--json", "--state", "approved"]);
    assert!(ledger.status.success(), "{}", stdout(&ledger));
    let page: Value = serde_json::from_str(&stdout(&ledger)).expect("JSON");
    assert_eq!(page["entries"][0]["id"], id, "{page}");
    assert_eq!(page["entries"].as_array().map(Vec::len), Some(1), "{page}");
}

#[tokio::test(flavor = "multi_thread")]
async fn people_approving_the_same_actions_through_both_daemons_at_once_deliver_each_once() {
    const ACTIONS: usize = 12;
    let team = Team::new("race");
    let a = team.daemon("a", false);
    let b = team.daemon("b", true);
    let coder_a = a.agent().await;
    let coder_b = b.agent().await;
    let mut ids = Vec::new();
    for n in 0..ACTIONS {
        let agent = if n % 2 == 0 { &coder_a } else { &coder_b };
        let answer = call(
            agent,
            "fixture__write_note",
            json!({"text": format!("note {n}")}),
        )
        .await;
        ids.push(action_id(&answer).to_string());
    }
    let args: Vec<&str> = std::iter::once("approve")
        .chain(ids.iter().map(String::as_str))
        .collect();
    let mut ana = a.person_command("ana", &args).spawn().expect("approve");
    let mut bob = b.person_command("bob", &args).spawn().expect("approve");
    let _ = ana.wait();
    let _ = bob.wait();

    let deliveries = team.deliveries();
    let mut unique = deliveries.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        unique.len(),
        deliveries.len(),
        "0 duplicates: {deliveries:?}"
    );
    assert_eq!(
        deliveries.len(),
        ACTIONS,
        "every action delivered: {deliveries:?}"
    );
    for id in &ids {
        let (by, state) = team.decided(id);
        assert_eq!(state.as_deref(), Some("approved"), "#{id}");
        assert!(
            by.as_deref() == Some(me().as_str()),
            "#{id} names its decider: {by:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_daemon_killed_mid_apply_leaves_outcome_unknown_that_the_other_finds_without_a_restart() {
    let team = Team::new("kill");
    let mut a = team.daemon("a", false);
    let b = team.daemon("b", true);
    let coder = a.agent().await;
    let id = action_id(&call(&coder, "fixture__hang", json!({})).await);
    drop(coder);
    // The person's approve through A waits for the apply, which the server never answers.
    let mut approve = a
        .person_command("ana", &["approve", &id.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("gate approve starts");
    eventually("the server receiving the call", || {
        !team.deliveries().is_empty()
    })
    .await;
    a.kill();
    let _ = approve.wait();

    // B, which was running all along, finds the claim of the dead daemon.
    let coder = b.agent().await;
    settles_the_dead_daemons_claim(&b, &coder, id, "daemon B").await;
    assert_eq!(
        team.decided(&id.to_string()),
        (Some(me()), Some("failed".into())),
        "it still names who decided"
    );
    assert_eq!(team.deliveries(), ["hang {}"], "0 duplicates");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_database_url_that_is_not_postgres_is_refused_with_what_to_write() {
    let team = Team::new("bad-url");
    let output = Command::new(env!("CARGO_BIN_EXE_gate"))
        .args(["serve", "--db", "mysql://x/y", "--data-dir"])
        .arg(team.dir.join("data"))
        .arg("--config")
        .arg(team.dir.join("missing.toml"))
        .output()
        .expect("gate runs");
    assert!(!output.status.success());
    let text = stdout(&output);
    assert!(text.contains("must be a PostgreSQL URL"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_the_database_unreachable_the_agent_is_refused_and_nothing_is_staged_or_sent() {
    let cluster = Cluster::start().unwrap_or_else(|error| panic!("{error}"));
    let team = Team::on("unreachable", &cluster);
    let a = team.daemon("a", false);
    let coder = a.agent().await;
    let first = action_id(&call(&coder, "fixture__write_note", json!({"text": "one"})).await);

    cluster.stop();
    let refused = call(&coder, "fixture__write_note", json!({"text": "two"})).await;
    assert!(
        refused.contains("cannot be reached"),
        "the agent is told the gate's database is unreachable: {refused}"
    );
    assert!(
        refused.contains("nothing was recorded or sent"),
        "nothing is reported as staged: {refused}"
    );
    let pending = a.person("ana", &["pending"]);
    assert!(!pending.status.success());
    assert!(
        stdout(&pending).contains("check that PostgreSQL is running"),
        "the person is told what to check: {}",
        stdout(&pending)
    );

    // The database comes back: the daemon connects again by itself.
    cluster.restart().unwrap_or_else(|error| panic!("{error}"));
    let staged = answer_until(
        "the daemon reconnecting",
        &coder,
        "fixture__write_note",
        json!({"text": "three"}),
        |answer| answer.contains("Nothing has been sent"),
    )
    .await;
    let third = action_id(&staged);
    let pending = stdout(&a.person("ana", &["pending"]));
    assert!(pending.contains(&format!("#{first} ")), "{pending}");
    assert!(pending.contains(&format!("#{third} ")), "{pending}");
    assert_eq!(
        pending.matches("pending  [fixture]").count(),
        2,
        "only what was stored is staged: {pending}"
    );
    assert!(team.deliveries().is_empty(), "nothing was sent");
}

/// A call that may fail (its daemon was killed): the answer, or `None`.
async fn try_call(
    agent: &RunningService<RoleClient, ()>,
    tool: &str,
    args: Value,
) -> Option<String> {
    let Value::Object(args) = args else {
        panic!("arguments are an object")
    };
    let result = agent
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(args))
        .await
        .ok()?;
    Some(daemon::text(&result))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_daemon_killed_inside_a_drain_loses_nothing_and_duplicates_nothing() {
    const EACH: usize = 20;
    let team = Team::new("drain-kill");
    let mut a = team.daemon("a", false);
    let b = team.daemon("b", true);
    let coder_a = a.agent().await;
    let coder_b = b.agent().await;
    // A person enables the rule through A: tag_note is auto-approvable on a vetted server.
    let first = action_id(&call(&coder_a, "fixture__tag_note", json!({"tag": "a0"})).await);
    let rule = a.person("carol", &["approve", "--all-of-kind", &first.to_string()]);
    assert!(rule.status.success(), "{}", stdout(&rule));

    let mut staged = vec![first.to_string()];
    let mut killed = false;
    for n in 1..=EACH {
        if let Some(answer) = try_call(
            &coder_a,
            "fixture__tag_note",
            json!({"tag": format!("a{n}")}),
        )
        .await
            && answer.contains("action ")
        {
            staged.push(action_id(&answer).to_string());
        }
        if n == EACH / 2 {
            // Kill A while the drain its submission started may be anywhere: at the
            // claim, in the server, after the send.
            a.kill();
            killed = true;
        }
        let answer = call(
            &coder_b,
            "fixture__tag_note",
            json!({"tag": format!("b{n}")}),
        )
        .await;
        staged.push(action_id(&answer).to_string());
    }
    assert!(killed);

    // B, running all along, settles what A left and drains the rest.
    let deadline = Instant::now() + Duration::from_secs(60);
    let db = store_postgres::Database::open(&team.db).expect("the team's database opens");
    loop {
        let open = db
            .query_text(
                "SELECT count(*) FROM ledger WHERE kind = 'action'
                   AND (state = 'pending' OR (state = 'failed' AND failure_retryable))",
            )
            .expect("the ledger reads");
        if open[0][0].as_deref() == Some("0") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "actions left waiting: {:?}",
            open[0][0]
        );
        // A submission through B wakes its drain as an agent's would.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let deliveries = team.deliveries();
    let mut unique = deliveries.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        unique.len(),
        deliveries.len(),
        "0 duplicates: {deliveries:?}"
    );
    let rows = db
        .query_text(
            "SELECT id, state, resolved_by, failure_kind, description_json::jsonb ->> 'title'
             FROM ledger WHERE kind = 'action' ORDER BY id",
        )
        .expect("the ledger reads");
    assert_eq!(
        rows.len(),
        staged.len(),
        "0 lost: every staged action is in the ledger"
    );
    let mut approved = 0;
    let mut unknown = 0;
    for row in &rows {
        match row[1].as_deref() {
            Some("approved") => approved += 1,
            Some("failed") => {
                assert_eq!(row[3].as_deref(), Some("outcome_unknown"), "{row:?}");
                unknown += 1;
            }
            other => panic!("#{:?} ended {other:?}", row[0]),
        }
        assert_eq!(
            row[2].as_deref(),
            Some(me().as_str()),
            "every decision names who decided: {row:?}"
        );
    }
    assert!(
        deliveries.len() >= approved && deliveries.len() <= approved + unknown,
        "every approved action was delivered once, an unknown one at most once: {} deliveries, {approved} approved, {unknown} unknown",
        deliveries.len()
    );
    println!(
        "drain kill: {} staged, {} delivered, {approved} approved, {unknown} outcome unknown, 0 duplicates, 0 lost",
        staged.len(),
        deliveries.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_drain_held_up_by_a_dead_daemons_claim_goes_on_once_the_claim_is_settled() {
    let team = Team::new("wake");
    let mut a = team.daemon("a", false);
    let b = team.daemon("b", true);
    let coder_a = a.agent().await;
    let coder_b = b.agent().await;
    // The rule, enabled through B on a first tag.
    let first = action_id(&call(&coder_b, "fixture__tag_note", json!({"tag": "t0"})).await);
    let rule = b.person("carol", &["approve", "--all-of-kind", &first.to_string()]);
    assert!(rule.status.success(), "{}", stdout(&rule));
    // A person at A approves a call the server never answers: A holds it.
    let hang = action_id(&call(&coder_a, "fixture__hang", json!({})).await);
    let mut approve = a
        .person_command("ana", &["approve", &hang.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("gate approve starts");
    eventually("the server receiving the call", || {
        team.deliveries().iter().any(|d| d.starts_with("hang"))
    })
    .await;
    // An auto-approvable call staged through B waits behind it (the drain keeps id order).
    let later = action_id(&call(&coder_b, "fixture__tag_note", json!({"tag": "t1"})).await);
    assert!(later > hang);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !team.deliveries().iter().any(|d| d.contains("t1")),
        "nothing passes a call still in flight: {:?}",
        team.deliveries()
    );

    // A dies. B settles its claim and, with no new submission, drains what waited.
    a.kill();
    let _ = approve.wait();
    eventually("the drain going on", || {
        team.deliveries().iter().any(|d| d.contains("t1"))
    })
    .await;
    // The server receives the call before B records its outcome.
    eventually("the drained call's outcome recorded", || {
        team.decided(&later.to_string()).1.as_deref() != Some("pending")
    })
    .await;
    assert_eq!(
        team.decided(&hang.to_string()),
        (Some(me()), Some("failed".into()))
    );
    assert_eq!(
        team.decided(&later.to_string()),
        (Some(me()), Some("approved".into()))
    );
    let deliveries = team.deliveries();
    let mut unique = deliveries.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        unique.len(),
        deliveries.len(),
        "0 duplicates: {deliveries:?}"
    );
}

/// The parent of process `pid`, from `/proc/<pid>/stat` ("pid (comm) state ppid …").
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The fixture server daemon `parent` started: the process whose command is `mcp-fixture`
/// and whose parent is the daemon or the daemon's child (the confining launcher), from
/// `/proc/<pid>/stat`.
fn fixture_child_of(parent: u32) -> nix::unistd::Pid {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc lists processes") {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<i32>().ok())
        else {
            continue;
        };
        // "pid (comm) state ppid …": the command may hold spaces and parentheses.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = &stat[open + 1..close];
        let ppid = stat[close + 1..]
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok());
        if comm == "mcp-fixture"
            && (ppid == Some(parent) || ppid.and_then(parent_of) == Some(parent))
        {
            found.push(pid);
        }
    }
    assert_eq!(
        found.len(),
        1,
        "daemon {parent} runs one fixture server: {found:?}"
    );
    nix::unistd::Pid::from_raw(found[0])
}

/// A fixture server held stopped with SIGSTOP; SIGKILLed by [`Stopped::kill`], or on drop
/// if a failed assertion left it stopped.
struct Stopped(Option<nix::unistd::Pid>);

impl Stopped {
    fn new(pid: nix::unistd::Pid) -> Self {
        use nix::sys::signal::{Signal, kill};
        kill(pid, Signal::SIGSTOP).expect("SIGSTOP the fixture server");
        Self(Some(pid))
    }

    fn kill(&mut self) {
        use nix::sys::signal::{Signal, kill};
        if let Some(pid) = self.0.take() {
            kill(pid, Signal::SIGKILL).expect("SIGKILL the fixture server");
        }
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Some(pid) = self.0.take() {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_daemon_killed_at_the_claim_leaves_outcome_unknown_and_nothing_is_ever_delivered() {
    const ROUNDS: usize = 3;
    let team = Team::new("claim-kill");
    let b = team.daemon("b", true);
    let coder_b = b.agent().await;
    let db = store_postgres::Database::open(&team.db).expect("the team's database opens");
    let mut unknown = 0;
    let mut waiting_delivered = Vec::new();
    for round in 0..ROUNDS {
        let mut a = team.daemon(&format!("a{round}"), round % 2 == 0);
        let coder_a = a.agent().await;
        let claimed_text = format!("claimed {round}");
        let claimed = action_id(
            &call(
                &coder_a,
                "fixture__write_note",
                json!({"text": claimed_text.clone()}),
            )
            .await,
        );
        // A second call staged through A and left pending: the dead daemon must not lose it.
        let waiting_text = format!("waiting {round}");
        let waiting = action_id(
            &call(
                &coder_a,
                "fixture__write_note",
                json!({"text": waiting_text.clone()}),
            )
            .await,
        );
        drop(coder_a);

        // A's server is stopped: it reads nothing from its stdin, so whatever A sends after
        // the claim never reaches it.
        let mut server = Stopped::new(fixture_child_of(a.child.id()));
        let mut approve = a
            .person_command("ana", &["approve", &claimed.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("gate approve starts");
        // The claim, read from the shared action store: committed, not yet settled.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let rows = db
                .query_text(&format!(
                    "SELECT actions.state FROM actions JOIN ledger
                       ON ledger.kind = 'action' AND ledger.gatekeeper = actions.gatekeeper
                      AND ledger.driver_id = actions.id
                     WHERE ledger.id = {claimed}"
                ))
                .expect("the action store reads");
            let state = rows.first().and_then(|row| row[0].clone());
            if state.as_deref() == Some("applying") {
                break;
            }
            assert!(
                state.as_deref() == Some("pending") && Instant::now() < deadline,
                "round {round}: the claim was never seen, the action is {state:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // SIGKILL at the claim, then the server that never read the request.
        a.kill();
        server.kill();
        let _ = approve.wait();

        // B, running all along, finds the dead daemon's claim and settles it.
        settles_the_dead_daemons_claim(&b, &coder_b, claimed, &format!("round {round}: daemon B"))
            .await;
        let rows = db
            .query_text(&format!(
                "SELECT state, failure_kind, failure_retryable, resolved_by FROM ledger
                 WHERE id = {claimed}"
            ))
            .expect("the ledger reads");
        assert_eq!(
            rows,
            [vec![
                Some("failed".to_owned()),
                Some("outcome_unknown".to_owned()),
                Some("f".to_owned()),
                Some(me()),
            ]],
            "round {round}: outcome unknown, final, naming who decided"
        );
        unknown += 1;

        // The call A left pending is still there; B applies it, once.
        let pending = stdout(&b.person("bob", &["pending"]));
        assert!(
            pending.contains(&format!("#{waiting}  pending  [fixture]")),
            "round {round}: {pending}"
        );
        let approve = b.person("bob", &["approve", &waiting.to_string()]);
        assert!(approve.status.success(), "{}", stdout(&approve));
        waiting_delivered.push(format!(r#"write_note {{"text":"{waiting_text}"}}"#));

        let deliveries = team.deliveries();
        assert!(
            !deliveries.iter().any(|d| d.contains(&claimed_text)),
            "round {round}: the call claimed at the kill was delivered: {deliveries:?}"
        );
        assert_eq!(
            deliveries, waiting_delivered,
            "round {round}: each waiting call delivered once, nothing else"
        );
    }
    println!(
        "claim kill: {ROUNDS} rounds, {unknown} outcome unknown with 0 deliveries of them, {} waiting calls delivered once each, 0 duplicates, 0 lost",
        waiting_delivered.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_scoped_rule_made_through_one_daemon_expires_and_is_revoked_on_the_other_too() {
    let team = Team::new("scoped");
    let a = team.daemon("a", false);
    let b = team.daemon("b", true);
    let through_b = b.agent().await;

    let add = a.person("ana", &["rules", "add", "fixture__tag_note", "--for", "3s"]);
    assert!(add.status.success(), "{}", stdout(&add));
    let listed = stdout(&b.person("bob", &["rules"]));
    assert!(listed.contains("every agent's calls, until "), "{listed}");
    let during = call(&through_b, "fixture__tag_note", json!({"tag": "during"})).await;
    assert!(during.starts_with("Applied at once"), "{during}");

    // Past its end, no daemon applies it.
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let after = call(&through_b, "fixture__tag_note", json!({"tag": "after"})).await;
    assert!(after.contains("needs a person's approval"), "{after}");
    let waiting = action_id(&after);
    let reject = b.person("bob", &["reject", &waiting.to_string()]);
    assert!(reject.status.success(), "{}", stdout(&reject));

    // A rule revoked through one daemon applies nothing through the other.
    assert!(
        a.person("ana", &["rules", "add", "fixture__tag_note"])
            .status
            .success()
    );
    assert!(
        a.person("ana", &["rules", "remove", "fixture__tag_note"])
            .status
            .success()
    );
    let revoked = call(&through_b, "fixture__tag_note", json!({"tag": "revoked"})).await;
    assert!(revoked.contains("needs a person's approval"), "{revoked}");
    assert_eq!(
        team.deliveries()
            .iter()
            .filter(|d| d.starts_with("tag_note"))
            .count(),
        1,
        "{:?}",
        team.deliveries()
    );
}

//! Benchmarks of a person's decisions against a real `gate serve` (the fixture server over
//! stdio, 16 agents staging `write_note` over streamable HTTP, the person's socket deciding),
//! as the ledger grows, and of the daemon's memory (issue 42's decision targets, issue 36's
//! memory bench):
//!
//! - `reject_48` and `approve_48`, each with a small ledger (a fresh daemon, replaced once
//!   its ledger passes [`SMALL_LEDGER`] entries, so every batch is decided with 48–144
//!   entries in it) and with a large one (the same daemon after [`LARGE_LEDGER`] decided
//!   actions; `DECISIONS_LEDGER=N` sets another size). One iteration stages a round of 48
//!   (not timed) and sends the one `reject` or `approve` request of all 48 through the
//!   person's socket (timed). Target: the large ledger's batch within 1.2 × the small one's.
//!   The same batches are then taken turn about on the two daemons ([`TURNS`] of each), so
//!   that a shared machine's drift between benchmarks cancels out of the ratio.
//! - The daemon's resident memory (`VmRSS` in `/proc/PID/status`, the fixture server not
//!   counted): idle, after 1,000 decided actions and after the large ledger's; growth per
//!   1,000 decided actions between the two (target ≤ 64 KiB); and after 2,000 MCP sessions
//!   opened (`initialize`) and closed (`DELETE`). The daemons run with
//!   `MALLOC_ARENA_MAX=2`, as `deploy/gate.service` starts the daemon.
//!
//! The action store keeps at most 50 calls open per server, so writes are staged and decided
//! in rounds of 48. Filling the large ledger rejects three rounds of every four and approves
//! the fourth (approved calls reach the fixture server, which logs them).
//!
//! Run: `cargo bench -p gate --bench decisions -- --warm-up-time 1 --measurement-time 5`.
//! Under `cargo test --benches` each benchmark runs once and the large ledger is 2,000.

#[path = "../tests/support/daemon.rs"]
mod daemon;
#[path = "../tests/support/fixture.rs"]
mod fixture;
mod support;

use std::path::PathBuf;
use std::process::Child;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode};
use gate::control::{Request, request};
use gate::paths::socket_in;
use rmcp::RoleClient;
use rmcp::model::CallToolRequestParams;
use rmcp::service::Peer;
use serde_json::{Value, json};

use fixture::{fixture_binary, free_port};
use support::{Agent, connect};

/// The daemon's `MALLOC_ARENA_MAX`, as `deploy/gate.service` sets it: without it glibc
/// gives threads that allocate at the same time arenas of their own, and the threads that
/// take a worker's tasks while a durable write waits for its sync made the daemon hold
/// 89.6 KiB more per 1,000 decided actions instead of 57.9 (docs/performance.md).
const MALLOC_ARENA_MAX: &str = "2";

/// Agents staging at once.
const AGENTS: usize = 16;
/// Writes staged and decided at a time: under the store's 50 open calls, a multiple of
/// [`AGENTS`].
const ROUND: usize = 48;
/// Past this many ledger entries the small-ledger daemon is replaced by a fresh one.
const SMALL_LEDGER: u64 = 144;
/// Decided actions in the large ledger, unless `DECISIONS_LEDGER` says otherwise.
const LARGE_LEDGER: u64 = 100_000;
/// Decided actions after which the memory baseline is read.
const BASELINE_ACTIONS: u64 = 1_000;
/// MCP sessions opened and closed for the session figure.
const SESSIONS: usize = 2_000;
/// Batches of each decision taken turn about on the small and the large ledger.
const TURNS: usize = 15;

/// (total time, batches) per benchmark, summed over criterion's warm-up and samples, with
/// the smallest and largest ledger id seen.
static TALLY: Mutex<Vec<Tally>> = Mutex::new(Vec::new());

/// A benchmark's name, total time, batches, and smallest and largest ledger.
type Tally = (String, Duration, u64, u64, u64);

/// Add one batch decided in `elapsed` with `ledger` entries in the ledger.
fn tally(name: &str, elapsed: Duration, ledger: u64) {
    let mut tally = TALLY.lock().unwrap_or_else(|p| p.into_inner());
    match tally.iter_mut().find(|(n, ..)| n == name) {
        Some((_, total, count, low, high)) => {
            *total += elapsed;
            *count += 1;
            *low = (*low).min(ledger);
            *high = (*high).max(ledger);
        }
        None => tally.push((name.to_owned(), elapsed, 1, ledger, ledger)),
    }
}

/// Mean milliseconds per batch of a benchmark and the range of ledger sizes it ran at.
fn mean_millis(name: &str) -> Option<(f64, u64, u64)> {
    let tally = TALLY.lock().unwrap_or_else(|p| p.into_inner());
    tally
        .iter()
        .find(|(n, _, c, ..)| n == name && *c > 0)
        .map(|(_, total, batches, low, high)| {
            (total.as_secs_f64() * 1e3 / *batches as f64, *low, *high)
        })
}

fn token(agent: usize) -> String {
    format!("bench-agent-{agent:02}-token-0123456789abcdef")
}

/// A running `gate serve` with its own configuration and data directory, and its agents.
struct Daemon {
    child: Child,
    dir: PathBuf,
    url: String,
    agents: Vec<Agent>,
    /// The highest ledger id staged so far: the ledger's size, give or take its reads.
    last_id: u64,
}

impl Daemon {
    /// Start a daemon over the fixture server (stdio) with [`AGENTS`] agents granted it;
    /// the agents connect later ([`Daemon::connect_agents`]).
    fn start(name: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "gate-bench-decisions-{}-{}-{name}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        // The fixture's log exists before its confined server starts (see the tests).
        let log = dir.join("deliveries.log");
        std::fs::write(&log, "").expect("the fixture's log");
        let mut config = format!(
            "listen = \"127.0.0.1:{}\"\n\n[[server]]\nname = \"fixture\"\ncommand = {:?}\nenv = {{ MCP_FIXTURE_LOG = {:?} }}\n",
            free_port(),
            fixture_binary().to_string_lossy(),
            log.to_string_lossy(),
        );
        for agent in 0..AGENTS {
            config.push_str(&format!(
                "\n[[agent]]\nname = \"agent{agent}\"\ntoken = \"{}\"\n\n[[agent.grant]]\nserver = \"fixture\"\n",
                token(agent)
            ));
        }
        let path = dir.join("gate.toml");
        std::fs::write(&path, config).expect("config written");
        // It holds tokens: the daemon warns of a file others may read.
        std::fs::set_permissions(
            &path,
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600),
        )
        .expect("config made private");
        // As the shipped service runs it (`deploy/gate.service`): two malloc arenas.
        let (child, url) = daemon::spawn_serve_with(
            &path,
            &dir.join("data"),
            &[("MALLOC_ARENA_MAX", MALLOC_ARENA_MAX)],
        );
        Self {
            child,
            dir,
            url,
            agents: Vec::new(),
            last_id: 0,
        }
    }

    async fn connect_agents(&mut self) {
        for agent in 0..AGENTS {
            self.agents
                .push(connect(&self.url, Some(&token(agent))).await);
        }
    }

    /// Stage a round of [`ROUND`] writes from every agent at once; their ids.
    async fn stage_round(&mut self) -> Vec<u64> {
        let ids = stage_concurrently(&self.agents, ROUND).await;
        self.last_id = self.last_id.max(ids.iter().copied().max().unwrap_or(0));
        ids
    }

    /// Reject (or approve) actions as the person, in one request through the socket.
    fn decide(&self, ids: Vec<u64>, approve: bool) {
        let count = ids.len();
        // From JSON, so that options the request gains later take their defaults.
        let ask = if approve {
            json!({"command": "approve", "ids": ids, "all_of_kind": false})
        } else {
            json!({"command": "reject", "ids": ids, "reason": null})
        };
        let ask: Request = serde_json::from_value(ask).expect("a request the gate understands");
        let response =
            request(&socket_in(&self.dir.join("data")), &ask).expect("the person's socket answers");
        assert!(response.ok, "deciding failed: {}", response.text);
        assert_eq!(response.text.lines().count(), count, "{}", response.text);
    }

    /// Resident memory of the daemon's process, in KiB.
    fn rss_kib(&self) -> u64 {
        daemon::proc_status(self.child.id(), "VmRSS")
    }

    /// Calls that reached the fixture server.
    fn deliveries(&self) -> usize {
        std::fs::read_to_string(self.dir.join("deliveries.log"))
            .map(|t| t.lines().count())
            .unwrap_or_default()
    }

    async fn disconnect(&mut self) {
        for agent in self.agents.drain(..) {
            let _ = agent.cancel().await;
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A distinct note each call, so no write is an identical pending call.
fn note() -> Value {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    json!({"text": format!("note {}", NEXT.fetch_add(1, Ordering::Relaxed))})
}

/// Stage one write; its action id.
async fn stage(agent: &Peer<RoleClient>) -> u64 {
    let Value::Object(args) = note() else {
        unreachable!("a note is an object")
    };
    let result = agent
        .call_tool(CallToolRequestParams::new("fixture__write_note").with_arguments(args))
        .await
        .unwrap_or_else(|e| panic!("write_note: {e}"));
    daemon::action_id(&daemon::text(&result))
}

/// Stage `count` writes from `agents` at once, each agent its share in turn; the ids.
async fn stage_concurrently(agents: &[Agent], count: usize) -> Vec<u64> {
    let share = |i: usize| count / agents.len() + usize::from(i < count % agents.len());
    let mut set = tokio::task::JoinSet::new();
    for (i, agent) in agents.iter().enumerate() {
        let (agent, share) = (agent.peer().clone(), share(i));
        set.spawn(async move {
            let mut ids = Vec::new();
            for _ in 0..share {
                ids.push(stage(&agent).await);
            }
            ids
        });
    }
    let mut ids = Vec::new();
    while let Some(joined) = set.join_next().await {
        ids.extend(joined.expect("a staging task panicked"));
    }
    ids.sort_unstable();
    ids
}

/// One batch decided on `daemon`: a round staged (not timed), then the decision (timed,
/// and tallied under `name`).
fn timed_batch(
    rt: &tokio::runtime::Runtime,
    daemon: &mut Daemon,
    approve: bool,
    name: &str,
) -> Duration {
    let ids = rt.block_on(daemon.stage_round());
    let start = Instant::now();
    daemon.decide(ids, approve);
    let elapsed = start.elapsed();
    tally(name, elapsed, daemon.last_id);
    elapsed
}

/// The small ledger: a fresh daemon whenever its ledger has passed [`SMALL_LEDGER`].
#[derive(Default)]
struct Small {
    daemon: Option<Daemon>,
}

impl Small {
    /// One batch on a daemon with at most [`SMALL_LEDGER`] entries before it.
    fn batch(&mut self, rt: &tokio::runtime::Runtime, approve: bool, name: &str) -> Duration {
        if self
            .daemon
            .as_ref()
            .is_none_or(|d| d.last_id >= SMALL_LEDGER)
        {
            if let Some(mut old) = self.daemon.take() {
                rt.block_on(old.disconnect());
            }
            let mut fresh = Daemon::start("small");
            rt.block_on(fresh.connect_agents());
            self.daemon = Some(fresh);
        }
        let daemon = self.daemon.as_mut().expect("started above");
        timed_batch(rt, daemon, approve, name)
    }
}

/// Decide rounds on `daemon` until `actions` have been decided in all; every fourth round
/// is approved, the others rejected. Prints, every 10,000 actions, the mean time of a
/// rejection of 48 over that stretch and the daemon's memory.
fn fill(rt: &tokio::runtime::Runtime, daemon: &mut Daemon, decided: &mut u64, actions: u64) {
    const EVERY: u64 = 10_000 / ROUND as u64 * ROUND as u64;
    let started = Instant::now();
    let (mut rejecting, mut rejections) = (Duration::ZERO, 0u32);
    while *decided < actions {
        let approve = (*decided / ROUND as u64) % 4 == 3;
        let ids = rt.block_on(daemon.stage_round());
        let start = Instant::now();
        daemon.decide(ids, approve);
        if !approve {
            rejecting += start.elapsed();
            rejections += 1;
        }
        *decided += ROUND as u64;
        if (*decided).is_multiple_of(EVERY) {
            eprintln!(
                "  {decided} decided actions after {:.0} s: a rejection of 48 took {:.1} ms on average over the last {EVERY}; VmRSS {} KiB",
                started.elapsed().as_secs_f64(),
                rejecting.as_secs_f64() * 1e3 / f64::from(rejections.max(1)),
                daemon.rss_kib()
            );
            (rejecting, rejections) = (Duration::ZERO, 0);
        }
    }
}

/// Resident memory in KiB after `SESSIONS` MCP sessions opened and closed on `daemon`, and
/// before.
fn sessions(rt: &tokio::runtime::Runtime, daemon: &Daemon) -> (u64, u64) {
    let before = daemon.rss_kib();
    rt.block_on(async {
        for session in 0..SESSIONS {
            let agent = connect(&daemon.url, Some(&token(session % AGENTS))).await;
            let _ = agent.cancel().await;
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    (before, daemon.rss_kib())
}

/// The median of some durations, in milliseconds.
fn median_millis(mut times: Vec<Duration>) -> f64 {
    times.sort_unstable();
    times
        .get(times.len() / 2)
        .map_or(f64::NAN, |t| t.as_secs_f64() * 1e3)
}

/// Batches decided turn about on the small and the large ledger: the ratio a shared
/// machine's drift between two criterion benchmarks does not move.
fn turn_about(
    rt: &tokio::runtime::Runtime,
    small: &mut Small,
    large: &mut Daemon,
    approve: bool,
) -> (f64, f64) {
    let (mut on_small, mut on_large) = (Vec::new(), Vec::new());
    for _ in 0..TURNS {
        on_small.push(small.batch(rt, approve, "turn about"));
        on_large.push(timed_batch(rt, large, approve, "turn about"));
    }
    (median_millis(on_small), median_millis(on_large))
}

/// What is not a criterion timing, for the summary.
#[derive(Default)]
struct Figures {
    idle: u64,
    baseline: Option<(u64, u64)>,
    large: Option<(u64, u64)>,
    sessions: Option<(u64, u64)>,
    /// Medians taken turn about (small, large), for reject and approve.
    turns: Vec<(&'static str, f64, f64)>,
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    // `cargo bench` passes `--bench`; `cargo test --benches` does not.
    let benching = std::env::args().any(|a| a == "--bench");
    let large: u64 = match std::env::var("DECISIONS_LEDGER") {
        Ok(n) => n.parse().expect("DECISIONS_LEDGER is a number of actions"),
        Err(_) if benching => LARGE_LEDGER,
        Err(_) => 2_000,
    };
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let mut figures = Figures::default();

    let mut small = Small::default();
    let mut group = criterion.benchmark_group("decisions");
    group.sampling_mode(SamplingMode::Flat);
    group.sample_size(10);
    for (name, approve) in [
        ("reject_48/small_ledger", false),
        ("approve_48/small_ledger", true),
    ] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| (0..iters).map(|_| small.batch(&rt, approve, name)).sum());
        });
    }

    // The large ledger, on one daemon from idle on.
    let mut daemon = Daemon::start("large");
    std::thread::sleep(Duration::from_millis(500));
    figures.idle = daemon.rss_kib();
    rt.block_on(daemon.connect_agents());
    let mut decided = 0;
    fill(&rt, &mut daemon, &mut decided, BASELINE_ACTIONS);
    std::thread::sleep(Duration::from_millis(300));
    figures.baseline = Some((decided, daemon.rss_kib()));
    fill(&rt, &mut daemon, &mut decided, large);
    std::thread::sleep(Duration::from_millis(300));
    figures.large = Some((decided, daemon.rss_kib()));
    for (name, approve) in [
        ("reject_48/large_ledger", false),
        ("approve_48/large_ledger", true),
    ] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| timed_batch(&rt, &mut daemon, approve, name))
                    .sum()
            });
        });
    }
    group.finish();
    for (decision, approve) in [("reject_48", false), ("approve_48", true)] {
        let (on_small, on_large) = turn_about(&rt, &mut small, &mut daemon, approve);
        figures.turns.push((decision, on_small, on_large));
    }

    assert!(
        daemon.deliveries() > 0,
        "no approved write reached the server"
    );
    if let Some(mut small) = small.daemon.take() {
        rt.block_on(small.disconnect());
    }
    rt.block_on(daemon.disconnect());
    figures.sessions = Some(sessions(&rt, &daemon));
    let ledger = daemon.last_id;
    drop(daemon);

    criterion.final_summary();
    summary(&figures, ledger);
}

fn summary(figures: &Figures, ledger: u64) {
    println!("\ndecisions benchmark summary (criterion: means over warm-up and samples)");
    for (decision, on_small, on_large) in &figures.turns {
        let small = mean_millis(&format!("{decision}/small_ledger"));
        let large = mean_millis(&format!("{decision}/large_ledger"));
        if let (Some((small, s_low, s_high)), Some((large, l_low, l_high))) = (small, large) {
            println!(
                "  {decision}: {small:.1} ms with {s_low}–{s_high} entries in the ledger (baseline), {large:.1} ms with {l_low}–{l_high}: ratio {:.2} (target ≤ 1.20)",
                large / small,
            );
        }
        println!(
            "  {decision}, {TURNS} batches turn about: median {on_small:.1} ms on the small ledger (baseline), {on_large:.1} ms with {ledger} entries: ratio {:.2} (target ≤ 1.20); {:.2} ms per decision",
            on_large / on_small,
            on_large / ROUND as f64
        );
    }
    let mib = |kib: u64| kib as f64 / 1024.0;
    println!(
        "  VmRSS idle (no agent connected): {} KiB ({:.1} MiB)",
        figures.idle,
        mib(figures.idle)
    );
    if let (Some((base_n, base)), Some((large_n, large))) = (figures.baseline, figures.large) {
        println!(
            "  VmRSS after {base_n} decided actions: {base} KiB ({:.1} MiB) (baseline); after {large_n}: {large} KiB ({:.1} MiB)",
            mib(base),
            mib(large)
        );
        let per_thousand =
            (large as f64 - base as f64) / ((large_n - base_n) as f64 / 1000.0).max(1e-9);
        println!("  growth per 1,000 decided actions: {per_thousand:.1} KiB (target ≤ 64 KiB)");
    }
    if let Some((before, after)) = figures.sessions {
        println!(
            "  VmRSS after {SESSIONS} MCP sessions opened and closed: {after} KiB ({:.1} MiB), {before} KiB before (baseline): {:+} KiB",
            mib(after),
            after as i64 - before as i64
        );
    }
}

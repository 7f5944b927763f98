//! Benchmarks of `gate serve` as a real process in front of gatekeeper-mcp's `mcp-fixture`
//! server, with agents speaking MCP over streamable HTTP through rmcp's client (issue 12's
//! performance figures), each measured side by side in one run:
//!
//! - `read_direct` and `read_through_gate`: one `read_notes` call, agent → fixture server
//!   (the fixture serving HTTP itself) against agent → gate → fixture server (the gate's
//!   downstream over stdio, as `gate init` configures one), with the same client. The
//!   summary gives the ratio and the microseconds the gate adds to a call.
//! - `staged_write`: one `write_note` staged and answered to the agent, on the daemon's
//!   SQLite file behind its redo journal.
//! - `staging_16_agents`: 16 agents, each with its own session and token, staging at
//!   once: one iteration is a round of 48 actions (3 from each agent), and criterion's
//!   throughput line reads actions per second.
//!
//! The action store keeps at most 50 calls open per server, so writes are staged in
//! rounds of 48 and the person's socket rejects each round outside the measurement.
//!
//! The store's writes are counted from outside the daemon's process, as records in its
//! redo journal (`<database>-redo`: the daemon owns its SQLite file and makes each write
//! durable as one record there; a submission's and a claim's are synced before they
//! return); counts are taken on separate rounds of 48 writes, not during the timed ones.
//!
//! The idle memory (`VmRSS` in `/proc/PID/status`) of a fresh daemon with two downstream
//! fixture servers connected, the servers' own processes not counted, is printed with the
//! summary at the end.
//!
//! Run: `cargo bench -p gate --bench gateway -- --warm-up-time 1 --measurement-time 5`.
//! Under `cargo test --benches` each benchmark runs once, as a test.

#[path = "../tests/support/daemon.rs"]
mod daemon;
#[path = "../tests/support/fixture.rs"]
mod fixture;
mod support;

use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use gate::control::{Request, request};
use gate::paths::{DATABASE_FILE, socket_in};
use rmcp::RoleClient;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::Peer;
use serde_json::{Value, json};

use fixture::{fixture_binary, free_port};
use support::{Agent, DirectServer, connect};

/// Agents staging at once in `staging_16_agents`.
const AGENTS: usize = 16;
/// Writes staged before the person rejects them: under the store's 50 open calls, and a
/// multiple of [`AGENTS`].
const ROUND: usize = 48;

/// (total time, calls) per benchmark, summed over criterion's warm-up and samples.
static TALLY: Mutex<Vec<(&'static str, Duration, u64)>> = Mutex::new(Vec::new());

fn tally(name: &'static str, elapsed: Duration, calls: u64) {
    let mut tally = TALLY.lock().unwrap_or_else(|p| p.into_inner());
    match tally.iter_mut().find(|(n, _, _)| *n == name) {
        Some((_, total, count)) => {
            *total += elapsed;
            *count += calls;
        }
        None => tally.push((name, elapsed, calls)),
    }
}

/// Mean microseconds per call of a benchmark, if it ran.
fn mean_micros(name: &str) -> Option<f64> {
    let tally = TALLY.lock().unwrap_or_else(|p| p.into_inner());
    tally
        .iter()
        .find(|(n, _, c)| *n == name && *c > 0)
        .map(|(_, total, calls)| total.as_secs_f64() * 1e6 / *calls as f64)
}

fn token(agent: usize) -> String {
    format!("bench-agent-{agent:02}-token-0123456789abcdef")
}

/// A running `gate serve` with its own configuration and data directory.
struct Daemon {
    child: Child,
    dir: PathBuf,
    url: String,
}

impl Daemon {
    /// Start a daemon over `servers` fixture servers (stdio), with `agents` agents granted
    /// the first server.
    fn start(name: &str, servers: usize, agents: usize) -> Self {
        let dir = std::env::temp_dir().join(format!("gate-bench-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        let fixture = fixture_binary();
        let mut config = format!("listen = \"127.0.0.1:{}\"\n", free_port());
        for server in 0..servers {
            // The fixture's log exists before its confined server starts (see the tests).
            std::fs::write(dir.join(format!("deliveries{server}.log")), "")
                .expect("the fixture's log");
            config.push_str(&format!(
                "\n[[server]]\nname = \"fixture{server}\"\ncommand = {:?}\nenv = {{ MCP_FIXTURE_LOG = {:?} }}\n",
                fixture.to_string_lossy(),
                dir.join(format!("deliveries{server}.log")).to_string_lossy(),
            ));
        }
        for agent in 0..agents {
            config.push_str(&format!(
                "\n[[agent]]\nname = \"agent{agent}\"\ntoken = \"{}\"\n\n[[agent.grant]]\nserver = \"fixture0\"\n",
                token(agent)
            ));
        }
        let path = dir.join("gate.toml");
        std::fs::write(&path, config).expect("config written");
        let (child, url) = daemon::spawn_serve(&path, &dir.join("data"));
        Self { child, dir, url }
    }

    async fn agent(&self, agent: usize) -> Agent {
        connect(&self.url, Some(&token(agent))).await
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Reject actions as the person, through the person's socket.
    fn reject(&self, ids: Vec<u64>) {
        let response = request(
            &socket_in(&self.data()),
            &Request::Reject {
                ids,
                reason: None,
                cascade: false,
            },
        )
        .expect("the person's socket answers");
        assert!(response.ok, "rejecting failed: {}", response.text);
    }

    /// Resident memory of the daemon's process, in KiB.
    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("/proc/PID/status is readable");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/PID/status")
    }

    /// Lines of every fixture's delivery log: calls that reached a server.
    fn deliveries(&self) -> usize {
        (0..8)
            .filter_map(|s| {
                std::fs::read_to_string(self.dir.join(format!("deliveries{s}.log"))).ok()
            })
            .map(|t| t.lines().count())
            .sum()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn call(agent: &Peer<RoleClient>, tool: &str, args: Value) -> CallToolResult {
    let Value::Object(args) = args else {
        panic!("arguments are an object")
    };
    let result = agent
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(args))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"));
    assert_ne!(result.is_error, Some(true), "{tool} failed: {result:?}");
    result
}

/// A distinct note each call, so no write is an identical pending call.
fn note() -> Value {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    json!({"text": format!("note {}", NEXT.fetch_add(1, Ordering::Relaxed))})
}

/// Stage one write; its action id.
async fn stage(agent: &Peer<RoleClient>) -> u64 {
    let result = call(agent, "fixture0__write_note", note()).await;
    daemon::action_id(&daemon::text(&result))
}

/// Stage `count` writes from `agents` at once, each agent its share in turn; the ids.
async fn stage_concurrently(agents: &[Agent], count: usize) -> Vec<u64> {
    let share = |i: usize| count / agents.len() + usize::from(i < count % agents.len());
    let runs = agents.iter().enumerate().map(|(i, agent)| {
        let (agent, share) = (agent.peer().clone(), share(i));
        async move {
            let mut ids = Vec::new();
            for _ in 0..share {
                ids.push(stage(&agent).await);
            }
            ids
        }
    });
    futures_join_all(runs).await.into_iter().flatten().collect()
}

/// Join futures on the current task (tokio has no `join_all`; these are I/O-bound).
async fn futures_join_all<F: std::future::Future + Send + 'static>(
    futures: impl IntoIterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send,
{
    let mut set = tokio::task::JoinSet::new();
    for (i, future) in futures.into_iter().enumerate() {
        set.spawn(async move { (i, future.await) });
    }
    let mut out: Vec<(usize, F::Output)> = Vec::new();
    while let Some(joined) = set.join_next().await {
        out.push(joined.expect("a staging task panicked"));
    }
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, o)| o).collect()
}

/// Records in the daemon's redo journal (`<database>-redo`, see store-sqlite's
/// `journal.rs`), read from outside: frames of `len: u32 LE`, `seq: u64 LE`, `crc: u32 LE`
/// and the payload, numbered in one sequence across the journal's restarts. Every write
/// of the store is one record; submissions and claims are synced before they return.
struct RecordCounter {
    journal: PathBuf,
}

impl RecordCounter {
    fn open(data: &Path) -> Self {
        let mut journal = data.join(DATABASE_FILE).into_os_string();
        journal.push("-redo");
        Self {
            journal: journal.into(),
        }
    }

    /// The number of the last record written to the journal (0 if none).
    fn last(&self) -> u64 {
        let journal = std::fs::read(&self.journal).expect("the redo journal reads");
        let (mut at, mut last) = (0, None::<u64>);
        while at + 16 <= journal.len() {
            let len = u32::from_le_bytes(journal[at..at + 4].try_into().expect("4 bytes")) as usize;
            let seq = u64::from_le_bytes(journal[at + 4..at + 12].try_into().expect("8 bytes"));
            let crc = u32::from_le_bytes(journal[at + 12..at + 16].try_into().expect("4 bytes"));
            let Some(payload) = journal.get(at + 16..at + 16 + len).filter(|_| len > 0) else {
                break;
            };
            let mut hasher = crc32fast::Hasher::new();
            hasher.update(&seq.to_le_bytes());
            hasher.update(payload);
            if hasher.finalize() != crc || last.is_some_and(|last| seq != last + 1) {
                break;
            }
            last = Some(seq);
            at += 16 + len;
        }
        last.unwrap_or(0)
    }

    /// Records written while `work` ran (and until the daemon wrote what it deferred).
    fn during(&self, work: impl FnOnce()) -> u64 {
        let before = self.last();
        work();
        std::thread::sleep(Duration::from_millis(200));
        self.last() - before
    }
}

/// Figures that are not timings, for the summary.
#[derive(Default)]
struct Counts {
    reads: Option<(u64, u64)>,
    writes: Option<(u64, u64)>,
    concurrent: Option<(u64, u64)>,
    idle_rss_kib: Option<u64>,
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let mut counts = Counts::default();

    let daemon = Daemon::start("load", 1, AGENTS);
    let direct = DirectServer::start(&[]);
    let (gated, straight, agents) = rt.block_on(async {
        let gated = daemon.agent(0).await;
        let straight = connect(&direct.url, None).await;
        let mut agents = Vec::new();
        for agent in 0..AGENTS {
            agents.push(daemon.agent(agent).await);
        }
        (gated, straight, agents)
    });

    let mut group = criterion.benchmark_group("gateway");
    group.throughput(Throughput::Elements(1));
    group.bench_function("read_direct", |b| {
        b.iter_custom(|iters| {
            let elapsed = rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    call(&straight, "read_notes", json!({})).await;
                }
                start.elapsed()
            });
            tally("read_direct", elapsed, iters);
            elapsed
        });
    });
    group.bench_function("read_through_gate", |b| {
        b.iter_custom(|iters| {
            let elapsed = rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    call(&gated, "fixture0__read_notes", json!({})).await;
                }
                start.elapsed()
            });
            tally("read_through_gate", elapsed, iters);
            elapsed
        });
    });
    group.bench_function("staged_write", |b| {
        b.iter_custom(|iters| {
            let mut elapsed = Duration::ZERO;
            let mut left = iters as usize;
            while left > 0 {
                let round = left.min(ROUND);
                let start = Instant::now();
                let ids = rt.block_on(stage_concurrently(std::slice::from_ref(&gated), round));
                elapsed += start.elapsed();
                daemon.reject(ids);
                left -= round;
            }
            tally("staged_write", elapsed, iters);
            elapsed
        });
    });
    // One iteration is a round of 48 actions, 3 from each agent, so that every sample
    // has all 16 agents staging at once; criterion's throughput line is actions per second.
    group.throughput(Throughput::Elements(ROUND as u64));
    group.sample_size(10);
    group.bench_function("staging_16_agents", |b| {
        b.iter_custom(|iters| {
            let mut elapsed = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                let ids = rt.block_on(stage_concurrently(&agents, ROUND));
                elapsed += start.elapsed();
                daemon.reject(ids);
            }
            tally("staging_16_agents", elapsed, iters * ROUND as u64);
            elapsed
        });
    });
    group.finish();

    // Journal records, on rounds of their own.
    let counter = RecordCounter::open(&daemon.data());
    let reads = counter.during(|| {
        rt.block_on(async {
            for _ in 0..ROUND {
                call(&gated, "fixture0__read_notes", json!({})).await;
            }
        });
    });
    counts.reads = Some((reads, ROUND as u64));
    let mut ids = Vec::new();
    let writes = counter.during(|| {
        ids = rt.block_on(stage_concurrently(std::slice::from_ref(&gated), ROUND));
    });
    counts.writes = Some((writes, ROUND as u64));
    daemon.reject(std::mem::take(&mut ids));
    let concurrent = counter.during(|| {
        ids = rt.block_on(stage_concurrently(&agents, ROUND));
    });
    counts.concurrent = Some((concurrent, ROUND as u64));
    daemon.reject(ids);
    drop(counter);
    assert_eq!(daemon.deliveries(), 0, "a staged write reached the server");
    rt.block_on(async {
        let _ = gated.cancel().await;
        let _ = straight.cancel().await;
        for agent in agents {
            let _ = agent.cancel().await;
        }
    });
    drop(direct);
    drop(daemon);

    // Idle memory: a fresh daemon with two downstream servers, no agent connected.
    let idle = Daemon::start("idle", 2, 1);
    std::thread::sleep(Duration::from_millis(500));
    counts.idle_rss_kib = Some(idle.rss_kib());
    drop(idle);

    criterion.final_summary();
    summary(&counts);
}

fn summary(counts: &Counts) {
    println!("\ngate benchmark summary (means over warm-up and samples)");
    if let (Some(direct), Some(gated)) =
        (mean_micros("read_direct"), mean_micros("read_through_gate"))
    {
        println!(
            "  read: direct {direct:.1} µs, through the gate {gated:.1} µs: ratio {:.2}, +{:.1} µs per call",
            gated / direct,
            gated - direct
        );
    }
    if let Some((records, reads)) = counts.reads {
        println!(
            "  read through the gate: {records} journal records for {reads} reads ({:.2} per read)",
            records as f64 / reads as f64
        );
    }
    if let Some(write) = mean_micros("staged_write") {
        println!("  staged write, answered: {write:.1} µs");
    }
    if let Some((records, writes)) = counts.writes {
        println!(
            "  staged write: {records} journal records for {writes} writes ({:.2} per write)",
            records as f64 / writes as f64
        );
    }
    if let Some(per_action) = mean_micros("staging_16_agents") {
        println!(
            "  {AGENTS} agents staging at once: {:.0} actions/s ({per_action:.1} µs per action)",
            1e6 / per_action
        );
    }
    if let Some((records, actions)) = counts.concurrent {
        println!(
            "  {AGENTS} agents staging at once: {records} journal records for {actions} actions ({:.2} per action)",
            records as f64 / actions as f64
        );
    }
    if let Some(rss) = counts.idle_rss_kib {
        println!(
            "  idle daemon with two downstream servers: VmRSS {rss} KiB ({:.1} MiB), servers not counted",
            rss as f64 / 1024.0
        );
    }
}

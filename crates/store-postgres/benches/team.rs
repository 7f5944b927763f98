//! A team's store against one machine's, in the same run, through the real kernel,
//! gatekeeper-core's gatekeeper and session (an in-process service stands for the MCP
//! server; each kernel with its own `Database` stands for a daemon):
//!
//! - `cycle/sqlite_wal`, `cycle/postgres`: one action staged, approved by a person and
//!   applied; the summary gives commits per action on both and round trips per action on
//!   PostgreSQL (statements, prepares, BEGIN and COMMIT each count one).
//!   `cycle/postgres_batch`: the same, the person listing once per 16 staged actions
//!   and approving each from the list (a review in batch).
//! - `agents16/one_daemon`, `agents16/two_daemons`: 16 agents per daemon stage
//!   auto-approvable calls under a rule as fast as the open cap lets them, and the drain
//!   applies them; actions applied per second with one daemon and with two on one
//!   database. Both daemons drain one gatekeeper, one at a time (the drain lease); the
//!   summary says how often an agent found the store full, waiting for the drain.
//! - `agents16/one_daemon_two_servers`, `agents16/two_daemons_two_servers`: the same
//!   with two servers that every daemon serves, 16 agents on each server: all 32 on one
//!   daemon, or each server's 16 on a daemon of their own. Two drains run at once.
//!
//! Every benchmark also reads the cluster's processor time and its own (the daemons' and
//! the agents') from `/proc` (they share the machine's processors) and prints both per
//! action, and how many of the machine's processors they kept busy together.
//!
//! Run: `cargo bench -p store-postgres --bench team -- --warm-up-time 1 --measurement-time 5`.
//! It starts a throwaway PostgreSQL cluster (initdb and pg_ctl, see `cluster.rs`); the
//! cluster runs with `fsync=off`, so the figures compare protocol costs, not disks.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

#[path = "../tests/postgres/support.rs"]
#[allow(dead_code, unused_imports)]
mod support;

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use gatekeeper_core::{CallOutcome, SessionError, StageError};
use serde_json::json;
use store_postgres::Database;
use store_postgres::cluster::Cluster;

/// What one benchmark measured, summed over its runs, for the summary.
#[derive(Clone, Copy, Default)]
struct Tally {
    elapsed: Duration,
    actions: u64,
    commits: u64,
    round_trips: u64,
    /// Of `round_trips`, the statements' prepares (once per statement and connection).
    prepares: u64,
    /// The cluster's processor time.
    server: Duration,
    /// This process's: the daemons' and the agents'.
    own: Duration,
}

static TALLY: Mutex<Vec<(&'static str, Tally)>> = Mutex::new(Vec::new());

/// Add `run` to benchmark `name`'s tally.
fn tally(name: &'static str, run: Tally) {
    let mut tally = TALLY.lock().unwrap();
    let sum = match tally.iter_mut().find(|t| t.0 == name) {
        Some((_, sum)) => sum,
        None => {
            tally.push((name, Tally::default()));
            &mut tally.last_mut().unwrap().1
        }
    };
    sum.elapsed += run.elapsed;
    sum.actions += run.actions;
    sum.commits += run.commits;
    sum.round_trips += run.round_trips;
    sum.prepares += run.prepares;
    sum.server += run.server;
    sum.own += run.own;
}

/// The processor time this process (the daemons and their agents) has used so far.
fn own_cpu() -> Duration {
    let Some(fields) = stat_fields("self") else {
        return Duration::ZERO;
    };
    // utime, stime: fields 14, 15 (`fields[n - 3]` is field n, see `stat_fields`).
    ticks(fields[11] + fields[12])
}

/// A process's `stat` fields after the command's closing parenthesis, from `state`
/// (field 3): `fields[n - 3]` is field n.
fn stat_fields(pid: &str) -> Option<Vec<u64>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields = stat.rsplit_once(')')?.1.split_whitespace();
    let fields: Vec<u64> = fields.map(|f| f.parse().unwrap_or(0)).collect();
    (fields.len() > 14).then_some(fields)
}

/// Clock ticks are hundredths of a second on Linux.
fn ticks(n: u64) -> Duration {
    Duration::from_millis(n * 10)
}

/// The processor time the cluster's processes have used so far (the postmaster, its
/// live children and the children that ended), from `/proc`; zero where `/proc` is not.
fn server_cpu() -> Duration {
    let port = format!("-p {}", Cluster::shared().port());
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Duration::ZERO;
    };
    let processes: Vec<(u32, Vec<u64>)> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, stat_fields(&pid.to_string())?)))
        .collect();
    let field = |fields: &[u64], n: usize| fields.get(n - 3).copied().unwrap_or(0);
    let postmaster = processes.iter().find(|(pid, _)| {
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
            String::from_utf8_lossy(&cmdline)
                .replace('\0', " ")
                .contains(&port)
        })
    });
    let Some((postmaster, own)) = postmaster else {
        return Duration::ZERO;
    };
    // utime, stime (fields 14, 15), and the ended children's cutime, cstime (16, 17);
    // a child's parent is field 4.
    let mut total: u64 = (14..18).map(|n| field(own, n)).sum();
    for (_, fields) in &processes {
        if field(fields, 4) == u64::from(*postmaster) {
            total += field(fields, 14) + field(fields, 15);
        }
    }
    ticks(total)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A directory of its own for the SQLite file, removed at the end.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new() -> Self {
        let path = std::env::temp_dir().join(format!("team-bench-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

static TITLES: AtomicU64 = AtomicU64::new(0);

/// Stages refused because the store was full (the agent comes back 5 ms later), per
/// benchmark, for the summary: how often agents wait for the drain.
static REFUSED: Mutex<Vec<(&'static str, u64)>> = Mutex::new(Vec::new());
static REFUSED_NOW: AtomicU64 = AtomicU64::new(0);

fn title() -> String {
    format!("issue {}", TITLES.fetch_add(1, Ordering::Relaxed))
}

fn cycle(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("cycle");
    group.sample_size(20);

    let dir = TempDir::new();
    let sqlite = store_sqlite::Database::open(dir.0.join("gate.db")).unwrap();
    let rig = rt.block_on(async {
        let clock: std::sync::Arc<dyn kernel::Clock> =
            std::sync::Arc::new(kernel::StepClock::default());
        let store = sqlite
            .action_store("issues", clock.clone())
            .await
            .expect("action store");
        support::Rig::with(sqlite.ledger(), store, clock)
    });
    group.bench_function("sqlite_wal", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let commits = sqlite.commits();
                let start = Instant::now();
                for _ in 0..iters {
                    rig.queue_issue(&title()).await;
                    let open = rig.overseer.open_actions().unwrap();
                    rig.overseer.approve(open[0].id, "ana").await.unwrap();
                }
                rig.overseer.settle().await;
                let elapsed = start.elapsed();
                tally(
                    "cycle/sqlite_wal",
                    Tally {
                        elapsed,
                        actions: iters,
                        commits: sqlite.commits() - commits,
                        ..Tally::default()
                    },
                );
                elapsed
            })
        });
    });

    let postgres = Database::open(&Cluster::shared().fresh_database()).unwrap();
    let rig = rt.block_on(support::Rig::new(postgres.clone()));
    group.bench_function("postgres", |b| {
        b.iter_custom(|iters| {
            rt.block_on(counted(&postgres, &rig, "cycle/postgres", iters, async {
                for _ in 0..iters {
                    rig.queue_issue(&title()).await;
                    let open = rig.overseer.open_actions().unwrap();
                    rig.overseer.approve(open[0].id, "ana").await.unwrap();
                }
            }))
        });
    });
    // A person's review in batch, as the design has it: what was staged meanwhile is
    // listed once, and each action approved from the list.
    group.bench_function("postgres_batch", |b| {
        b.iter_custom(|iters| {
            rt.block_on(counted(
                &postgres,
                &rig,
                "cycle/postgres_batch",
                iters,
                async {
                    let mut left = iters;
                    while left > 0 {
                        let round = left.min(BATCH);
                        for _ in 0..round {
                            rig.queue_issue(&title()).await;
                        }
                        for entry in rig.overseer.open_actions().unwrap() {
                            rig.overseer.approve(entry.id, "ana").await.unwrap();
                        }
                        left -= round;
                    }
                },
            ))
        });
    });
    group.finish();
}

/// Time `cycles` (`iters` actions on `postgres`) until every apply settled, and tally it
/// under `name` with its commits and round trips.
async fn counted(
    postgres: &Database,
    rig: &support::Rig,
    name: &'static str,
    iters: u64,
    cycles: impl std::future::Future<Output = ()>,
) -> Duration {
    let (commits, trips, prepares) = (
        postgres.commits(),
        postgres.round_trips(),
        postgres.prepares(),
    );
    let (server, own) = (server_cpu(), own_cpu());
    let start = Instant::now();
    cycles.await;
    rig.overseer.settle().await;
    let elapsed = start.elapsed();
    tally(
        name,
        Tally {
            elapsed,
            actions: iters,
            commits: postgres.commits() - commits,
            round_trips: postgres.round_trips() - trips,
            prepares: postgres.prepares() - prepares,
            server: server_cpu().saturating_sub(server),
            own: own_cpu().saturating_sub(own),
        },
    );
    elapsed
}

/// How many actions a person reviews at once in `cycle/postgres_batch` (the store keeps
/// at most 50 open per gatekeeper).
const BATCH: u64 = 16;

/// One server's 16 agents on one daemon: the daemon (an index into the rigs) and the
/// server's gatekeeper there.
struct Lane {
    daemon: usize,
    gatekeeper: std::sync::Arc<gatekeeper_core::ToolGatekeeper>,
}

/// Per lane, 16 agents each stage `per_agent` auto-approvable calls (retrying while the
/// store is full); returns when every call was applied (counted on `services`, every
/// daemon's connection to every server).
async fn agents(
    rigs: &[support::Rig],
    lanes: &[Lane],
    services: &[std::sync::Arc<support::RecordingService>],
    per_agent: u64,
) {
    let applied = || -> usize { services.iter().map(|s| s.calls.lock().unwrap().len()).sum() };
    let applied_before = applied();
    let mut tasks = Vec::new();
    for (l, lane) in lanes.iter().enumerate() {
        for a in 0..16 {
            let session = lane
                .gatekeeper
                .grant_all(&rigs[lane.daemon].overseer, &format!("agent-{l}-{a}"))
                .unwrap()
                .into_session();
            tasks.push(tokio::spawn(async move {
                for _ in 0..per_agent {
                    let label = title();
                    loop {
                        match session
                            .call_tool("addLabel", json!({ "issue": 1, "label": label }))
                            .await
                        {
                            Ok(CallOutcome::Pending { .. }) => break,
                            // The store is full: come back later, as an agent told so would.
                            Err(SessionError::Stage(StageError::TooManyOpen)) => {
                                REFUSED_NOW.fetch_add(1, Ordering::Relaxed);
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                            other => panic!("unexpected {other:?}"),
                        }
                    }
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let expected = applied_before + lanes.len() * 16 * per_agent as usize;
    loop {
        for rig in rigs {
            rig.overseer.settle().await;
        }
        if applied() >= expected {
            break;
        }
        // A drain waiting for the other daemon's lease finishes after it.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// One team benchmark: its label, how many daemons and servers, and on which daemon
/// (index) each server's (index) 16 agents work.
struct Team {
    label: &'static str,
    daemons: usize,
    servers: usize,
    lanes: &'static [(usize, usize)],
}

const TEAMS: [Team; 4] = [
    Team {
        label: "agents16/one_daemon",
        daemons: 1,
        servers: 1,
        lanes: &[(0, 0)],
    },
    Team {
        label: "agents16/two_daemons",
        daemons: 2,
        servers: 1,
        lanes: &[(0, 0), (1, 0)],
    },
    Team {
        label: "agents16/one_daemon_two_servers",
        daemons: 1,
        servers: 2,
        lanes: &[(0, 0), (0, 1)],
    },
    Team {
        label: "agents16/two_daemons_two_servers",
        daemons: 2,
        servers: 2,
        lanes: &[(0, 0), (1, 1)],
    },
];

fn agents16(c: &mut Criterion) {
    const PER_AGENT: u64 = 4;
    let rt = runtime();
    let mut group = c.benchmark_group("agents16");
    group.sample_size(10);
    for Team {
        label,
        daemons,
        servers,
        lanes,
    } in TEAMS
    {
        let url = Cluster::shared().fresh_database();
        let dbs: Vec<Database> = (0..daemons)
            .map(|_| Database::open(&url).unwrap())
            .collect();
        let rigs: Vec<support::Rig> = dbs
            .iter()
            .map(|db| rt.block_on(support::Rig::new(db.clone())))
            .collect();
        // Every daemon serves every server, as daemons sharing one configuration do.
        let mut gatekeepers = Vec::new();
        let mut services = Vec::new();
        for (rig, db) in rigs.iter().zip(&dbs) {
            let mut served = vec![rig.gatekeeper.clone()];
            services.push(rig.service.clone());
            for s in 1..servers {
                let (gatekeeper, service) =
                    rt.block_on(rig.add_tracker(db, &format!("tracker{s}")));
                served.push(gatekeeper);
                services.push(service);
            }
            gatekeepers.push(served);
        }
        for gatekeeper in &gatekeepers[0] {
            let kind = gatekeeper.action_kind("addLabel").unwrap();
            // Enabling a rule starts a drain: inside the runtime.
            rt.block_on(async {
                rigs[0]
                    .overseer
                    .enable_rule(gatekeeper.name(), kind, "carol")
            })
            .unwrap();
        }
        let lanes: Vec<Lane> = lanes
            .iter()
            .map(|&(daemon, server)| Lane {
                daemon,
                gatekeeper: gatekeepers[daemon][server].clone(),
            })
            .collect();
        group.bench_function(label.trim_start_matches("agents16/"), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let commits: u64 = dbs.iter().map(Database::commits).sum();
                    let trips: u64 = dbs.iter().map(Database::round_trips).sum();
                    let prepares: u64 = dbs.iter().map(Database::prepares).sum();
                    let refused = REFUSED_NOW.load(Ordering::Relaxed);
                    let (server, own) = (server_cpu(), own_cpu());
                    let start = Instant::now();
                    for _ in 0..iters {
                        agents(&rigs, &lanes, &services, PER_AGENT).await;
                    }
                    let elapsed = start.elapsed();
                    let actions = iters * lanes.len() as u64 * 16 * PER_AGENT;
                    let refused = REFUSED_NOW.load(Ordering::Relaxed) - refused;
                    {
                        let mut all = REFUSED.lock().unwrap();
                        match all.iter_mut().find(|r| r.0 == label) {
                            Some(r) => r.1 += refused,
                            None => all.push((label, refused)),
                        }
                    }
                    tally(
                        label,
                        Tally {
                            elapsed,
                            actions,
                            commits: dbs.iter().map(Database::commits).sum::<u64>() - commits,
                            round_trips: dbs.iter().map(Database::round_trips).sum::<u64>() - trips,
                            prepares: dbs.iter().map(Database::prepares).sum::<u64>() - prepares,
                            server: server_cpu().saturating_sub(server),
                            own: own_cpu().saturating_sub(own),
                        },
                    );
                    elapsed
                })
            });
        });
    }
    group.finish();
}

fn summary(_: &mut Criterion) {
    let tally = TALLY.lock().unwrap();
    println!("\nsummary (means over warm-up and samples):");
    let mut per_second = Vec::new();
    let processors = std::thread::available_parallelism().map_or(1, usize::from);
    for (name, t) in tally.iter() {
        let n = t.actions.max(1) as f64;
        let rate = n / t.elapsed.as_secs_f64();
        // SQLite's cycle runs in this process with no server: its time is not split.
        let processors_used = if t.server.is_zero() && t.own.is_zero() {
            String::new()
        } else {
            format!(
                ", processor time per action {:.0} µs PostgreSQL's, {:.0} µs the daemons' and agents', {:.2} of the machine's {processors} processors busy",
                t.server.as_secs_f64() * 1e6 / n,
                t.own.as_secs_f64() * 1e6 / n,
                (t.server + t.own).as_secs_f64() / t.elapsed.as_secs_f64().max(1e-9),
            )
        };
        println!(
            "  {name}: {:.0} µs per action, {rate:.0} actions/s, {:.2} commits and {:.2} round trips per action{processors_used} ({} actions)",
            t.elapsed.as_secs_f64() * 1e6 / n,
            t.commits as f64 / n,
            t.round_trips as f64 / n,
            t.actions,
        );
        per_second.push((*name, rate));
    }
    // Issue 42's targets, beside what was measured.
    for (name, t) in tally.iter().filter(|t| t.0 != "cycle/sqlite_wal") {
        let n = t.actions.max(1) as f64;
        // Judged as printed, to three decimals: one round trip more in a run of thousands
        // of actions is not a cost per action.
        let met = |per_action: f64, target: f64| {
            if per_action < target + 0.0005 {
                "met"
            } else {
                "not met"
            }
        };
        // A statement is prepared once per connection: those round trips are the
        // connections' first use, not the actions', and are counted apart.
        let steady = (t.round_trips - t.prepares) as f64 / n;
        let commits = t.commits as f64 / n;
        println!(
            "  {name}: {steady:.3} round trips (target <= 6: {}), {commits:.3} commits \
             (target <= 3: {}) per action; besides, {} prepares in {} actions",
            met(steady, 6.0),
            met(commits, 3.0),
            t.prepares,
            t.actions,
        );
    }
    for (name, refused) in REFUSED.lock().unwrap().iter() {
        if let Some(t) = tally.iter().find(|t| t.0 == *name) {
            println!(
                "  {name}: {:.2} stages refused as full per action applied (the drain is behind)",
                *refused as f64 / t.1.actions.max(1) as f64
            );
        }
    }
    let rate = |name: &str| per_second.iter().find(|r| r.0 == name).map(|r| r.1);
    let ratio = |two: &str, one: &str| Some(rate(two)? / rate(one)?);
    if let Some(ratio) = ratio("agents16/two_daemons", "agents16/one_daemon") {
        println!(
            "  two daemons / one daemon, every agent on one server: {ratio:.2}x actions/s (target >= 1.50x; one drain at a time, in order, by design)"
        );
    }
    if let Some(ratio) = ratio("agents16/two_daemons_two_servers", "agents16/one_daemon") {
        println!(
            "  two daemons / one daemon, each daemon's agents on a server of their own: {ratio:.2}x actions/s (target >= 1.50x)"
        );
    }
    if let Some(ratio) = ratio(
        "agents16/two_daemons_two_servers",
        "agents16/one_daemon_two_servers",
    ) {
        println!(
            "  the same 32 agents on two servers, two daemons / one daemon: {ratio:.2}x actions/s"
        );
    }
}

criterion_group!(benches, cycle, agents16, summary);
criterion_main!(benches);

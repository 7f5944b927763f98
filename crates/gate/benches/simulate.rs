//! What a simulated read costs (`pending = "simulate"`, issue 40's acceptance): `gate serve`
//! runs as a real process in front of the real npm `@modelcontextprotocol/server-filesystem`
//! (the pinned version, installed in `target/e2e/npm` by `cargo xtask e2e` or the gate's
//! simulation test), twice over one directory: `plain` (`pending = "hide"`) and `files`
//! (`pending = "simulate"`, `simulator = "filesystem"`). One agent speaks MCP over streamable
//! HTTP through rmcp's client.
//!
//! - `forwarded_read`: `read_text_file` of `notes/old.md` on `plain`: an unsimulated read,
//!   forwarded (the baseline);
//! - `simulated_read/N`: `read_text_file` of `notes/plan.md` on `files`, where the agent's
//!   pending `write_file` of that file makes the answer simulated (checked before timing),
//!   with N = 0, 10 and 49 more of its pending writes elsewhere in the tree
//!   (`elsewhere/fK.md`): 1,000 cannot be staged, since a server holds at most 50 open calls.
//!
//! The target: each simulated read within 1.5 × the forwarded read, whatever N. Every call is
//! timed on its own; the summary gives each median beside the baseline's from the same run,
//! the ratio and the target.
//!
//! Run: `cargo bench -p gate --bench simulate -- --warm-up-time 1 --measurement-time 3`.

#[path = "../tests/support/daemon.rs"]
mod daemon;
#[path = "../tests/support/fixture.rs"]
#[allow(dead_code)]
mod fixture;

use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use rmcp::RoleClient;
use rmcp::service::Peer;
use serde_json::{Value, json};

use daemon::{CODER_TOKEN, call, connect, text};
use fixture::free_port;

/// The target ratio of a simulated read to a forwarded one.
const TARGET: f64 = 1.5;

/// The agent's pending writes elsewhere in the tree, besides the one the read shows. The
/// issue asks for 0, 10 and 1,000; one server holds at most 50 open calls
/// (gatekeeper-core's `MAX_OPEN_ACTIONS`, all agents together), so 49 is the most there can
/// be in `gate serve`.
const MORE: [usize; 3] = [0, 10, 49];

/// Each call's own time, per benchmark, over criterion's warm-up and samples.
static CALLS: Mutex<Vec<(String, Vec<Duration>)>> = Mutex::new(Vec::new());

fn record(name: &str, calls: Vec<Duration>) {
    let mut all = CALLS.lock().unwrap_or_else(|p| p.into_inner());
    match all.iter_mut().find(|(n, _)| n == name) {
        Some((_, times)) => times.extend(calls),
        None => all.push((name.to_owned(), calls)),
    }
}

/// Median and p90 microseconds per call of a benchmark, if it ran.
fn figures(name: &str) -> Option<(f64, f64)> {
    let all = CALLS.lock().unwrap_or_else(|p| p.into_inner());
    let (_, times) = all.iter().find(|(n, t)| n == name && !t.is_empty())?;
    let mut micros: Vec<f64> = times.iter().map(|t| t.as_secs_f64() * 1e6).collect();
    micros.sort_by(f64::total_cmp);
    let at = |q: f64| micros[((micros.len() - 1) as f64 * q).round() as usize];
    Some((at(0.5), at(0.9)))
}

/// node, and the installed filesystem server's entry point.
fn npm_server() -> (PathBuf, PathBuf) {
    let entry = Path::new(env!("CARGO_MANIFEST_DIR")).join(
        "../../target/e2e/npm/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js",
    );
    let entry = entry.canonicalize().unwrap_or_else(|_| {
        panic!(
            "{} is missing: run `cargo xtask e2e` (or `cargo test -p gate --test simulate`) once to install the pinned npm servers",
            entry.display()
        )
    });
    let found = std::process::Command::new("sh")
        .args(["-c", "command -v node"])
        .output()
        .expect("sh runs");
    let node = String::from_utf8_lossy(&found.stdout).trim().to_owned();
    assert!(!node.is_empty(), "this bench needs node on PATH");
    (PathBuf::from(node), entry)
}

/// `gate serve` over the filesystem server twice, `plain` and `files`, on one directory.
struct Daemon {
    child: Child,
    dir: PathBuf,
    work: PathBuf,
    url: String,
}

impl Daemon {
    fn start() -> Self {
        let (node, server) = npm_server();
        let dir = std::env::temp_dir().join(format!("gate-bench-{}-simulate", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let work = dir.join("work");
        std::fs::create_dir_all(work.join("notes")).expect("scratch directory");
        std::fs::create_dir_all(work.join("elsewhere")).expect("scratch directory");
        let work = work.canonicalize().expect("exists");
        std::fs::write(work.join("notes/old.md"), "old\n").expect("seeded");
        let mut config = format!("listen = \"127.0.0.1:{}\"\n", free_port());
        for (name, pending) in [
            ("plain", ""),
            (
                "files",
                "pending = \"simulate\"\nsimulator = \"filesystem\"\n",
            ),
        ] {
            config.push_str(&format!(
                "\n[[server]]\nname = \"{name}\"\ncommand = {node:?}\nargs = [{server:?}, {work:?}]\ntrust = \"vetted\"\npaths = [{work:?}]\n{pending}"
            ));
        }
        config.push_str(&format!(
            "\n[[agent]]\nname = \"coder\"\ntoken = \"{CODER_TOKEN}\"\n[[agent.grant]]\nserver = \"plain\"\n[[agent.grant]]\nserver = \"files\"\n"
        ));
        let path = dir.join("gate.toml");
        std::fs::write(&path, config).expect("config written");
        std::fs::set_permissions(
            &path,
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600),
        )
        .expect("private");
        let (child, url) = daemon::spawn_serve(&path, &dir.join("data"));
        Self {
            child,
            dir,
            work,
            url,
        }
    }

    fn path(&self, rel: &str) -> String {
        self.work.join(rel).to_string_lossy().into_owned()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Stage `write_file` of `path` on `files`.
async fn stage(agent: &Peer<RoleClient>, path: &str, content: &str) {
    let staged = text(
        &call(
            agent,
            "files__write_file",
            json!({"path": path, "content": content}),
        )
        .await,
    );
    assert!(staged.contains("action "), "{staged}");
}

/// One timed read: `tool` with `args`; its answer.
async fn read(agent: &Peer<RoleClient>, tool: &str, args: &Value) -> String {
    let result = call(agent, tool, args.clone()).await;
    assert_ne!(result.is_error, Some(true), "{tool}: {}", text(&result));
    text(&result)
}

fn main() {
    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .configure_from_args();
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let daemon = Daemon::start();
    let agent = rt.block_on(connect(&daemon.url, CODER_TOKEN));
    let forwarded = json!({"path": daemon.path("notes/old.md")});
    let simulated = json!({"path": daemon.path("notes/plan.md")});
    rt.block_on(async {
        assert_eq!(
            read(&agent, "plain__read_text_file", &forwarded).await,
            "old\n"
        );
        stage(&agent, &daemon.path("notes/plan.md"), "the plan\n").await;
        let shown = read(&agent, "files__read_text_file", &simulated).await;
        assert!(
            shown.starts_with("Simulated by the gate") && shown.ends_with("the plan\n"),
            "{shown}"
        );
    });

    let mut group = criterion.benchmark_group("simulate");
    group.throughput(Throughput::Elements(1));
    let mut bench = |name: String, tool: &str, args: &Value| {
        group.bench_function(BenchmarkId::from_parameter(&name), |b| {
            b.iter_custom(|iters| {
                let calls = rt.block_on(async {
                    let mut calls = Vec::with_capacity(iters as usize);
                    for _ in 0..iters {
                        let start = Instant::now();
                        read(&agent, tool, args).await;
                        calls.push(start.elapsed());
                    }
                    calls
                });
                let elapsed = calls.iter().sum();
                record(&name, calls);
                elapsed
            });
        });
    };
    bench(
        "forwarded_read".to_owned(),
        "plain__read_text_file",
        &forwarded,
    );
    let mut elsewhere = 0;
    for n in MORE {
        rt.block_on(async {
            while elsewhere < n {
                let path = daemon.path(&format!("elsewhere/f{elsewhere}.md"));
                stage(&agent, &path, "elsewhere\n").await;
                elsewhere += 1;
            }
        });
        bench(
            format!("simulated_read/{n}"),
            "files__read_text_file",
            &simulated,
        );
    }
    group.finish();
    rt.block_on(async {
        let shown = read(&agent, "files__read_text_file", &simulated).await;
        assert!(shown.starts_with("Simulated by the gate"), "{shown}");
        let _ = agent.cancel().await;
    });
    drop(daemon);
    criterion.final_summary();

    println!(
        "\ngate simulate benchmark summary (each call timed, over warm-up and samples; median, p90)"
    );
    let Some((b50, b90)) = figures("forwarded_read") else {
        return;
    };
    println!("  forwarded read (baseline): {b50:.1} µs (p90 {b90:.1})");
    for n in MORE {
        let Some((s50, s90)) = figures(&format!("simulated_read/{n}")) else {
            continue;
        };
        let ratio = s50 / b50;
        println!(
            "  simulated read, {n} pending writes elsewhere: {s50:.1} µs (p90 {s90:.1}); ratio {ratio:.2} (target ≤ {TARGET}: {})",
            if ratio <= TARGET { "met" } else { "MISSED" }
        );
    }
}

//! Benchmarks of what `gate serve` forwards besides tool calls, beside `gateway.rs` and in
//! its style: the daemon runs as a real process in front of gatekeeper-mcp's `mcp-fixture`
//! server (started with `MCP_FIXTURE_RICH=1`, so that it offers resources and prompts), and
//! agents speak MCP over streamable HTTP through rmcp's client. Each forwarded request is
//! measured side by side, in one run, with the same request made to the fixture directly
//! (the fixture serving HTTP itself, as `gateway.rs`'s direct baseline does), with the same
//! client:
//!
//! - `resource_read_direct` and `resource_read_through_gate`: `resources/read` of
//!   `fixture://notes/1` on the fixture against `gate://fixture/fixture://notes/1` through
//!   the gate (the gate's downstream over stdio, as `gate init` configures one; each read
//!   is recorded in the ledger as an observation);
//! - `prompt_get_direct` and `prompt_get_through_gate`: `prompts/get` of `summarize` on
//!   the fixture against `fixture__summarize` through the gate, with `{"topic": "alpha"}`.
//!
//! Every call is timed on its own as well; the summary at the end gives, for each pair,
//! the median, p90 and mean of those calls (over criterion's warm-up and samples), the
//! ratio through the gate / direct and the microseconds the gate adds.
//!
//! Run: `cargo bench -p gate --bench forwarding` (1 s warm-up and 5 s measurement unless
//! told otherwise, e.g. `-- --warm-up-time 1 --measurement-time 3`).
//! Under `cargo test --benches` each benchmark runs once, as a test.

#[path = "../tests/support/daemon.rs"]
mod daemon;
#[path = "../tests/support/fixture.rs"]
mod fixture;
mod support;

use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use rmcp::RoleClient;
use rmcp::model::{GetPromptRequestParams, ReadResourceRequestParams};
use rmcp::service::Peer;
use serde_json::{Value, json};

use fixture::{fixture_binary, free_port};
use support::{DirectServer, connect, figures, record};

const TOKEN: &str = "bench-forwarding-token-0123456789abcdef";

/// A running `gate serve` over one rich fixture server (stdio) named `fixture`, granted
/// to one agent.
struct Daemon {
    child: Child,
    dir: PathBuf,
    url: String,
}

impl Daemon {
    fn start() -> Self {
        let dir =
            std::env::temp_dir().join(format!("gate-bench-{}-forwarding", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        let config = format!(
            "listen = \"127.0.0.1:{}\"\n\n[[server]]\nname = \"fixture\"\ncommand = {:?}\nenv = {{ MCP_FIXTURE_LOG = {:?}, MCP_FIXTURE_RICH = \"1\" }}\n\n[[agent]]\nname = \"agent\"\ntoken = \"{TOKEN}\"\n\n[[agent.grant]]\nserver = \"fixture\"\n",
            free_port(),
            fixture_binary().to_string_lossy(),
            dir.join("deliveries.log").to_string_lossy(),
        );
        let path = dir.join("gate.toml");
        std::fs::write(&path, config).expect("config written");
        // The fixture's log exists before its confined server starts (see the tests).
        std::fs::write(dir.join("deliveries.log"), "").expect("the fixture's log");
        let (child, url) = daemon::spawn_serve(&path, &dir.join("data"));
        Self { child, dir, url }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `resources/read` of `uri`: the text of its one content.
async fn read(agent: &Peer<RoleClient>, uri: &str) -> String {
    let read = agent
        .read_resource(ReadResourceRequestParams::new(uri))
        .await
        .unwrap_or_else(|e| panic!("resources/read {uri}: {e}"));
    let read = serde_json::to_value(&read).expect("serialises");
    read["contents"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text read from {uri}: {read}"))
        .to_owned()
}

/// `prompts/get` of `name` with `{"topic": "alpha"}`: the text of its first message.
async fn prompt(agent: &Peer<RoleClient>, name: &str) -> String {
    let Value::Object(arguments) = json!({"topic": "alpha"}) else {
        unreachable!("an object")
    };
    let got = agent
        .get_prompt(GetPromptRequestParams::new(name).with_arguments(arguments))
        .await
        .unwrap_or_else(|e| panic!("prompts/get {name}: {e}"));
    let got = serde_json::to_value(&got).expect("serialises");
    got["messages"][0]["content"]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text in prompt {name}: {got}"))
        .to_owned()
}

fn main() {
    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .configure_from_args();
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");

    let daemon = Daemon::start();
    let direct = DirectServer::start(&[("MCP_FIXTURE_RICH", "1")]);
    let (gated, straight) = rt.block_on(async {
        let gated = connect(&daemon.url, Some(TOKEN)).await;
        let straight = connect(&direct.url, None).await;
        // Both ways answer the same before anything is timed.
        assert_eq!(read(&straight, "fixture://notes/1").await, "note 1");
        assert_eq!(
            read(&gated, "gate://fixture/fixture://notes/1").await,
            "note 1"
        );
        let asked = "Summarize the notes about alpha.";
        assert_eq!(prompt(&straight, "summarize").await, asked);
        assert_eq!(prompt(&gated, "fixture__summarize").await, asked);
        (gated, straight)
    });

    let mut group = criterion.benchmark_group("forwarding");
    group.throughput(Throughput::Elements(1));
    let mut bench = |name: &'static str, agent: &Peer<RoleClient>, prompted: bool, target: &str| {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let calls = rt.block_on(async {
                    let mut calls = Vec::with_capacity(iters as usize);
                    for _ in 0..iters {
                        let start = Instant::now();
                        if prompted {
                            prompt(agent, target).await;
                        } else {
                            read(agent, target).await;
                        }
                        calls.push(start.elapsed());
                    }
                    calls
                });
                let elapsed = calls.iter().sum();
                record(name, calls);
                elapsed
            });
        });
    };
    bench(
        "resource_read_direct",
        &straight,
        false,
        "fixture://notes/1",
    );
    bench(
        "resource_read_through_gate",
        &gated,
        false,
        "gate://fixture/fixture://notes/1",
    );
    bench("prompt_get_direct", &straight, true, "summarize");
    bench(
        "prompt_get_through_gate",
        &gated,
        true,
        "fixture__summarize",
    );
    group.finish();

    rt.block_on(async {
        let _ = gated.cancel().await;
        let _ = straight.cancel().await;
    });
    drop(direct);
    drop(daemon);

    criterion.final_summary();
    summary();
}

fn summary() {
    println!("\ngate forwarding benchmark summary (each call timed, over warm-up and samples)");
    for (what, direct, gated) in [
        (
            "resources/read",
            "resource_read_direct",
            "resource_read_through_gate",
        ),
        (
            "prompts/get",
            "prompt_get_direct",
            "prompt_get_through_gate",
        ),
    ] {
        let (Some((d50, d90, dmean)), Some((g50, g90, gmean))) = (figures(direct), figures(gated))
        else {
            continue;
        };
        println!(
            "  {what}: direct median {d50:.1} µs (p90 {d90:.1}, mean {dmean:.1}), through the gate median {g50:.1} µs (p90 {g90:.1}, mean {gmean:.1})"
        );
        println!(
            "  {what}: ratio {:.2} (p90 {:.2}, mean {:.2}), +{:.1} µs per call at the median (+{:.1} at p90, +{:.1} mean)",
            g50 / d50,
            g90 / d90,
            gmean / dmean,
            g50 - d50,
            g90 - d90,
            gmean - dmean
        );
    }
}

//! What the gate's periodic catalog check costs (`catalog_check_seconds`, issue 36 item 9):
//! one `tools/list` of a downstream server and a comparison with the accepted catalog, on
//! the fixture server over stdio, beside the same server's plain read as the baseline;
//! for a one-page catalog and for one of 45 pages. The summary prints each figure and its
//! share of the default interval (60 s) in wall time.
//!
//! `cargo bench -p gatekeeper-mcp --bench catalog_check -- --warm-up-time 1 --measurement-time 5`

#![allow(
    missing_docs,
    reason = "criterion's macros generate undocumented functions"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use gatekeeper_core::ToolService as _;
use gatekeeper_mcp::{McpServer, McpServerConfig, StdioCommand};
use serde_json::json;
use tokio::runtime::Runtime;

/// The daemon's default interval between two checks of a server's catalog.
const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);

fn fixture(runtime: &Runtime, pages: Option<usize>) -> Arc<McpServer> {
    let mut command = StdioCommand::new(env!("CARGO_BIN_EXE_mcp-fixture"));
    if let Some(pages) = pages {
        command = command.env("MCP_FIXTURE_PAGES", pages.to_string());
    }
    runtime
        .block_on(McpServer::connect(
            McpServerConfig::new("fixture", command).max_catalog_pages(100),
        ))
        .expect("the fixture starts")
}

/// The mean of `rounds` runs of `step`, after a few unmeasured ones.
fn mean(runtime: &Runtime, rounds: u32, mut step: impl AsyncFnMut()) -> Duration {
    runtime.block_on(async {
        for _ in 0..5 {
            step().await;
        }
        let started = Instant::now();
        for _ in 0..rounds {
            step().await;
        }
        started.elapsed() / rounds
    })
}

/// A read of `read_notes`, carrying the definition digest the gate would send with it.
async fn read(server: &McpServer) {
    let catalog = server.catalog();
    let digest = catalog
        .tools()
        .iter()
        .find(|t| t.name == "read_notes")
        .map(|t| t.digest.clone())
        .expect("the fixture lists read_notes");
    server
        .call_defined("read_notes", Some(&digest), &json!({}))
        .await
        .expect("read");
}

fn check(runtime: &Runtime, server: &McpServer) {
    runtime.block_on(async {
        let current = server.refresh().await.expect("the catalog is read");
        assert!(server.catalog().changes(&current).is_empty());
    });
}

fn bench(c: &mut Criterion) {
    let runtime = Runtime::new().expect("runtime");
    let one = fixture(&runtime, None);
    let paged = fixture(&runtime, Some(45));
    let mut group = c.benchmark_group("catalog_check");
    group.bench_function("read (baseline)", |b| {
        b.iter(|| runtime.block_on(read(&one)))
    });
    group.bench_function("check, 1 page", |b| b.iter(|| check(&runtime, &one)));
    group.bench_function("check, 45 pages", |b| b.iter(|| check(&runtime, &paged)));
    group.finish();

    let read = mean(&runtime, 200, async || read(&one).await);
    let single = mean(&runtime, 200, async || {
        let current = one.refresh().await.expect("catalog");
        assert!(one.catalog().changes(&current).is_empty());
    });
    let many = mean(&runtime, 40, async || {
        let current = paged.refresh().await.expect("catalog");
        assert!(paged.catalog().changes(&current).is_empty());
    });
    let share = |d: Duration| 100.0 * d.as_secs_f64() / DEFAULT_INTERVAL.as_secs_f64();
    println!(
        "\ncatalog check, one server, every {} s (means of this run):",
        DEFAULT_INTERVAL.as_secs()
    );
    println!(
        "  baseline: a read of the same server        {:>9.1} µs",
        read.as_secs_f64() * 1e6
    );
    println!(
        "  check of a 1-page catalog                  {:>9.1} µs ({:.1} × a read; {:.5}% of the interval, wall time)",
        single.as_secs_f64() * 1e6,
        single.as_secs_f64() / read.as_secs_f64(),
        share(single)
    );
    println!(
        "  check of a 45-page catalog                 {:>9.1} µs ({:.1} × a read; {:.5}% of the interval, wall time)",
        many.as_secs_f64() * 1e6,
        many.as_secs_f64() / read.as_secs_f64(),
        share(many)
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);

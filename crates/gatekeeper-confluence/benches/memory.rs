//! Benchmark of the wiki driver's memory: how much resident memory pending appends take,
//! and how long a simulated read takes beside them, each printed next to its target.
//!
//! Targets (issue "Durable and lean"): 10,000 pending appends from one session over 10
//! pages in ≤ 60 MiB resident, over 1,000 pages in ≤ 30 MiB; simulated reads ≤ 3 µs
//! with 50 pending on the page + 50 elsewhere and 10 + 1,000. (`benches/reads.rs`
//! measures the same reads with criterion; this bench repeats them so the figures sit
//! beside their targets in one summary.)
//!
//! How memory is measured: each shape runs in a fresh child process (this binary, run
//! again with the shape's name), which reads `VmRSS` from `/proc/self/status` before
//! building anything and after staging every append, and reports the growth. The child
//! runs with `MALLOC_TRIM_THRESHOLD_=0` and `MALLOC_TOP_PAD_=0`, so glibc neither keeps
//! freed memory at the top of the heap nor pads it: the growth is what is still held.
//! Two stacks are measured for each shape: the whole stack (the real kernel with its
//! in-memory ledger, the driver, its in-memory key-value store), and the driver alone
//! (a queue that keeps nothing). The bytes the key-value store holds are printed too;
//! the driver's index shares those buffers (a record is held once, not also decoded), so
//! the rest of the growth is the indexes' fixed-size entries, the kernel and the wiki.
//!
//! A shape that has not finished staging after `WIKI_MEMORY_BENCH_LIMIT_SECS` seconds
//! (default 120) is stopped and reported as missed; `WIKI_MEMORY_BENCH_APPENDS` stages
//! fewer (or more) appends than 10,000, to see how a slow build grows.
//!
//! Run: `cargo bench -p gatekeeper-confluence --bench memory` (Linux only: it reads
//! `/proc/self/status`).

// `main` needs no documentation; the module comment says what this is.
#![allow(missing_docs)]

mod common;

use std::hint::black_box;
use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gatekeeper_confluence::record::StoredRecord;
use gatekeeper_confluence::{
    ContentHandle, KvStore, Lab, MemoryKv, Policy, WikiService, WikiSession,
};
use tokio::runtime::Runtime;

/// Pending appends staged in every memory shape: 10,000 (the targets' figure), unless
/// `WIKI_MEMORY_BENCH_APPENDS` says otherwise (to see how a slow build grows).
fn appends() -> usize {
    std::env::var("WIKI_MEMORY_BENCH_APPENDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000)
}

/// Resident memory of this process, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// Seed `pages` pages into `service`; returns their handles.
fn seed(service: &WikiService, pages: usize) -> Vec<ContentHandle> {
    (0..pages)
        .map(|n| {
            let id = service.seed_page(
                "OPS",
                &format!("Runbook {n}"),
                "First paragraph.\n\nSecond paragraph.",
            );
            ContentHandle::Real(id)
        })
        .collect()
}

/// Stage [`appends`] appends from one session, round-robin over `pages`.
fn stage(rt: &Runtime, session: &WikiSession, pages: &[ContentHandle]) {
    rt.block_on(async {
        for n in 0..appends() {
            session
                .append_content(
                    &pages[n % pages.len()],
                    &format!("Step {n}: check the dashboards."),
                )
                .await
                .expect("stage");
        }
    });
}

/// The bytes (keys and values) a key-value store holds.
fn kv_bytes(kv: &dyn KvStore) -> usize {
    kv.scan_prefix("")
        .expect("scan")
        .iter()
        .map(|(k, v)| k.len() + v.len())
        .sum()
}

/// Child process: build one shape and print its resident growth (KiB) and the bytes its
/// key-value store holds, on one line, while everything is still alive.
fn child(stack: &str, pages: usize) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let before = rss_kib();
    if stack == "whole" {
        let lab = Lab::new(Policy::GUARDED);
        let handles = seed(&lab.service, pages);
        let session = lab.session("agent");
        stage(&rt, &session, &handles);
        assert_eq!(lab.wiki.pending_count(), appends());
        let grown = rss_kib().saturating_sub(before);
        println!("{grown} {}", kv_bytes(&*lab.kv));
    } else {
        let service = Arc::new(WikiService::new());
        let handles = seed(&service, pages);
        let kv = Arc::new(MemoryKv::new());
        let (gatekeeper, session) = common::driver(service, kv.clone(), Policy::GUARDED);
        stage(&rt, &session, &handles);
        assert_eq!(gatekeeper.pending_count(), appends());
        let grown = rss_kib().saturating_sub(before);
        println!("{grown} {}", kv_bytes(&*kv));
    }
}

/// How long one memory shape may run before it counts as missed.
fn limit() -> Duration {
    let secs = std::env::var("WIKI_MEMORY_BENCH_LIMIT_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    Duration::from_secs(secs)
}

/// Run one memory shape in a child process; returns (KiB resident growth, KV bytes,
/// seconds), or `None` if it did not finish within [`limit`] (then it is stopped).
fn measure(stack: &str, pages: usize) -> Option<(u64, u64, f64)> {
    let exe = std::env::current_exe().expect("own path");
    let start = Instant::now();
    let mut child = Command::new(exe)
        .args(["--child", stack, &pages.to_string()])
        .env("MALLOC_TRIM_THRESHOLD_", "0")
        .env("MALLOC_TOP_PAD_", "0")
        .stdout(Stdio::piped())
        .spawn()
        .expect("run the child");
    loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            assert!(
                status.success(),
                "the {stack} shape over {pages} pages failed"
            );
            break;
        }
        if start.elapsed() > limit() {
            // Only this child, by its own handle.
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let secs = start.elapsed().as_secs_f64();
    let mut text = String::new();
    child
        .stdout
        .take()
        .expect("piped stdout")
        .read_to_string(&mut text)
        .expect("the child's output");
    let line = text.lines().last().unwrap_or_default();
    let mut parts = line
        .split_whitespace()
        .map(|p| p.parse::<u64>().unwrap_or(0));
    Some((parts.next()?, parts.next()?, secs))
}

/// Mean µs of one simulated body read, over enough reads to take about a second.
fn read_us(rt: &Runtime, on_page: usize, elsewhere: usize) -> f64 {
    let (session, page) = common::read_shape(rt, Policy::GUARDED, on_page, elsewhere);
    let once = |n: u32| {
        let start = Instant::now();
        for _ in 0..n {
            black_box(rt.block_on(session.body(black_box(&page))).expect("read"));
        }
        start.elapsed()
    };
    once(1_000);
    let probe = once(1_000).as_secs_f64().max(1e-6);
    let n = ((1.0 / probe) * 1_000.0).clamp(1_000.0, 2_000_000.0) as u32;
    once(n).as_secs_f64() * 1e6 / f64::from(n)
}

/// Mean ns to decode one pending append as the key-value store holds it: what apply,
/// reject and revert pay to read a whole record. Reads decode nothing: the driver's index
/// holds each record once, as the value it shares with the store, and folds its text in
/// place.
fn decode_ns(rt: &Runtime) -> f64 {
    let service = Arc::new(WikiService::new());
    let page = seed(&service, 1)[0];
    let kv = Arc::new(MemoryKv::new());
    // The gatekeeper stays alive while its session stages.
    let (_gatekeeper, session) = common::driver(service, kv.clone(), Policy::GUARDED);
    rt.block_on(async {
        for n in 0..2 {
            session
                .append_content(&page, &format!("Step {n}: check the dashboards."))
                .await
                .expect("stage");
        }
    });
    let (_, bytes) = kv
        .scan_prefix("action:")
        .expect("scan")
        .pop()
        .expect("a stored action");
    let n = 200_000u32;
    let start = Instant::now();
    for _ in 0..n {
        black_box(StoredRecord::decode(black_box(&bytes)).expect("decode"));
    }
    start.elapsed().as_secs_f64() * 1e9 / f64::from(n)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--child") {
        let stack = args.get(at + 1).map_or("whole", String::as_str);
        let pages = args.get(at + 2).and_then(|p| p.parse().ok()).unwrap_or(10);
        child(stack, pages);
        return;
    }
    if args.iter().any(|a| a == "--list") {
        // `cargo bench -- --list` asks every bench for its names.
        return;
    }
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    println!(
        "gatekeeper-confluence memory summary (policy guarded, one session, {} pending appends; targets are for 10000)",
        appends()
    );
    println!("allocator in each child: MALLOC_TRIM_THRESHOLD_=0 MALLOC_TOP_PAD_=0");
    for (pages, target_mib) in [(10usize, 60.0f64), (1_000, 30.0)] {
        for (stack, what) in [
            (
                "whole",
                "whole stack (kernel + in-memory ledger + driver + MemoryKv)",
            ),
            ("driver", "driver only (a queue that keeps nothing)"),
        ] {
            match measure(stack, pages) {
                Some((kib, bytes, secs)) => {
                    let mib = kib as f64 / 1024.0;
                    println!(
                        "  over {pages} pages, {what}: +{mib:.1} MiB resident (target ≤ {target_mib:.0}: {}); key-value store holds {:.2} MiB; staged in {secs:.1} s",
                        verdict(mib <= target_mib),
                        bytes as f64 / (1024.0 * 1024.0)
                    );
                }
                None => println!(
                    "  over {pages} pages, {what}: did not finish within {} s (target ≤ {target_mib:.0} MiB: MISSED)",
                    limit().as_secs()
                ),
            }
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    for (on_page, elsewhere) in [(50, 50), (10, 1_000)] {
        let us = read_us(&rt, on_page, elsewhere);
        println!(
            "  simulated body read, {on_page} pending on the page + {elsewhere} elsewhere: {us:.2} µs (target ≤ 3: {})",
            verdict(us <= 3.0)
        );
    }
    let ns = decode_ns(&rt);
    println!(
        "  each pending record is held once: the driver's index keeps the very buffer the key-value store holds and reads fold its text in place, decoding nothing; decoding a whole record (apply, reject, revert) takes {ns:.0} ns"
    );
}

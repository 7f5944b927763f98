//! Benchmark of simulated reads: the body of a page with pending actions on it, while
//! other pages have pending work too.
//!
//! The reference lists and filters every pending action on each read (13.9 µs for
//! 50 on the page + 50 elsewhere, 162 µs for 10 + 1,000). This driver keeps pending
//! actions indexed by content, so a read costs what its own page costs. Target: ≤ 3 µs
//! for both shapes.
//!
//! What is measured: `WikiSession::body` end to end — resolve the handle, GET the page
//! from the in-process wiki, convert its storage to Markdown, fold the page's pending
//! actions, build the ledger line, authorize it (through a queue that records nothing,
//! so the measurement is the driver's, not the kernel ledger's growth), and remember the
//! actions seen. Run: `cargo bench -p gatekeeper-confluence -- --warm-up-time 1
//! --measurement-time 3`.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

mod common;

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use gatekeeper_confluence::Policy;

fn reads(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("simulated_body_read");
    for (policy, on_page, elsewhere) in [
        (Policy::GUARDED, 50, 50),
        (Policy::GUARDED, 10, 1000),
        (Policy::GUARDED, 10, 0),
        (Policy::REFERENCE, 50, 50),
        (Policy::REFERENCE, 10, 1000),
    ] {
        let (session, page) = common::read_shape(&rt, policy, on_page, elsewhere);
        let expected = rt.block_on(session.body(&page)).expect("read");
        assert!(expected.ends_with("check the dashboards."));
        group.bench_function(
            format!("policy={policy}/{on_page}_on_page+{elsewhere}_elsewhere"),
            |b| b.iter(|| rt.block_on(session.body(black_box(&page))).expect("read")),
        );
    }
    group.finish();
}

criterion_group!(benches, reads);
criterion_main!(benches);

//! Benchmarks of the review screen (`gate review`) opening a queue of 10,000 pending
//! actions (issue 15's figure: under 200 ms):
//!
//! - `open_and_render_10000`: what the screen does when the daemon's answer arrives: parse
//!   the JSON answer, build the model (group by agent, server and kind, oldest first) and
//!   draw one 120×40 frame on ratatui's `TestBackend`.
//! - `refresh_and_render_10000`: a live update of an open screen (the poll every 500 ms):
//!   the same with the cursor and a selection kept.
//! - `daemon_rows_10000`: the daemon's side of the same answer: the shell crate renders
//!   10,000 ledger entries as rows with their approval prompts, serialised to JSON.
//!
//! Run: `cargo bench -p gate --bench review -- --warm-up-time 1 --measurement-time 5`.
//! Under `cargo test --benches` each benchmark runs once, as a test.

#[path = "../tests/support/queue.rs"]
mod support;

use std::hint::black_box;

use criterion::Criterion;
use gate::queue::{self, Queue};
use gate::review::model::{Input, Key, Model};
use gate::review::view;
use ratatui::Terminal;
use ratatui::backend::TestBackend;

const ROWS: u64 = 10_000;

/// Parse the daemon's answer, build the model, draw one frame.
fn open(json: &str) -> Model {
    let queue: Queue = serde_json::from_str(json).expect("the queue parses");
    let model = Model::new(queue);
    draw(&model);
    model
}

fn draw(model: &Model) {
    let mut terminal = Terminal::new(TestBackend::new(120, 40)).expect("a test terminal");
    terminal
        .draw(|frame| view::draw(model, frame))
        .expect("drawn");
    black_box(terminal.backend().buffer().area);
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    let open_actions = support::many(ROWS);
    let rows = queue::rows(&open_actions, &[], |_| None, |s, t| format!("{s}__{t}"));
    assert_eq!(rows.rows.len(), ROWS as usize);
    let json = serde_json::to_string(&rows).expect("serialises");
    println!(
        "review: {ROWS} pending actions, {} bytes of JSON from the daemon",
        json.len()
    );

    criterion.bench_function("open_and_render_10000", |b| {
        b.iter(|| black_box(open(black_box(&json))));
    });

    let mut model = open(&json);
    for key in [Key::PageDown, Key::Char(' '), Key::Char(' '), Key::End] {
        model.input(Input::Key(key));
    }
    criterion.bench_function("refresh_and_render_10000", |b| {
        b.iter(|| {
            let queue: Queue = serde_json::from_str(black_box(&json)).expect("the queue parses");
            model.refresh(queue);
            draw(&model);
        });
    });
    assert_eq!(model.selected.len(), 2);

    criterion.bench_function("daemon_rows_10000", |b| {
        b.iter(|| {
            let rows = queue::rows(
                black_box(&open_actions),
                &[],
                |_| None,
                |s, t| format!("{s}__{t}"),
            );
            black_box(serde_json::to_string(&rows).expect("serialises"))
        });
    });

    criterion.final_summary();
}

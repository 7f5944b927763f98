//! Benchmark of the review screen (`gate review`) staying responsive while the daemon
//! stages about 100 actions per second (issue 15's second figure), against a real
//! `gate serve` process over gatekeeper-mcp's `mcp-fixture` server, its agent speaking MCP
//! over streamable HTTP through rmcp's client.
//!
//! One refresh is what the screen does at each poll: `queue::fetch` over the person's
//! socket, `Model::refresh` with the answer, and one 120×40 frame drawn by
//! `review::draw` on ratatui's `TestBackend`. It is measured twice in one run:
//!
//! - `refresh_idle`: the daemon idle, with [`KEEP_OPEN`] actions pending;
//! - `refresh_under_load`: while a background load stages a write every 10 ms from the
//!   agent (at most [`IN_FLIGHT`] at once) and, since the store keeps at most 50 calls
//!   open per server, rejects through the person's socket the oldest pending actions as
//!   soon as more than [`KEEP_OPEN`] wait.
//!
//! Besides criterion's means, each case is sampled [`SAMPLES`] times by a loop of its own,
//! one refresh every [`GAP`], for a median and a 99th percentile; the summary at the end
//! gives those, and the staging rate the load achieved while the screen refreshed.
//!
//! Run: `cargo bench -p gate --bench review_load -- --warm-up-time 1 --measurement-time 5`.
//! Under `cargo test --benches` each benchmark runs once, as a test.

#[path = "../tests/support/daemon.rs"]
mod daemon;
#[path = "../tests/support/fixture.rs"]
mod fixture;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::Criterion;
use gate::control::{Request, request};
use gate::paths::socket_in;
use gate::queue;
use gate::review::{self, model::Model};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use rmcp::RoleClient;
use rmcp::service::Peer;
use serde_json::json;

use daemon::{CODER_TOKEN, Gate, action_id, call, text};

/// Pending actions left open by the load (and present while idle): under the store's 50.
const KEEP_OPEN: usize = 20;
/// Time between two staged writes: 100 per second.
const STAGE_EVERY: Duration = Duration::from_millis(10);
/// How long the rejecting thread waits when nothing is over [`KEEP_OPEN`].
const REJECT_IDLE: Duration = Duration::from_millis(10);
/// Writes in flight at most; past it the load falls behind, and the rate shows it.
const IN_FLIGHT: usize = 8;
/// Refreshes per case in the percentile loop.
const SAMPLES: usize = 200;
/// Time between two refreshes in the percentile loop.
const GAP: Duration = Duration::from_millis(20);

/// A distinct note each call, so no write is an identical pending call.
fn note() -> serde_json::Value {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    json!({"text": format!("note {}", NEXT.fetch_add(1, Ordering::Relaxed))})
}

/// Stage one write; its action id, or what the gate answered if it refused it.
async fn stage(agent: &Peer<RoleClient>) -> Result<u64, String> {
    let result = call(agent, "fixture__write_note", note()).await;
    if result.is_error == Some(true) {
        Err(text(&result))
    } else {
        Ok(action_id(&text(&result)))
    }
}

/// The screen: its model and a 120×40 test terminal.
struct Screen {
    model: Model,
    terminal: Terminal<TestBackend>,
    socket: PathBuf,
}

impl Screen {
    fn open(socket: &Path) -> Self {
        let model = Model::new(queue::fetch(socket).expect("the person's socket answers"));
        let terminal = Terminal::new(TestBackend::new(120, 40)).expect("a test terminal");
        let mut screen = Self {
            model,
            terminal,
            socket: socket.to_owned(),
        };
        screen.draw();
        screen
    }

    fn draw(&mut self) {
        let model = &mut self.model;
        self.terminal
            .draw(|frame| review::draw(model, frame))
            .expect("drawn");
    }

    /// One poll of `gate review`: fetch, refresh, draw; the rows it showed.
    fn refresh(&mut self) -> usize {
        let queue = queue::fetch(&self.socket).expect("the person's socket answers");
        self.model.refresh(queue);
        self.draw();
        self.model.rows.len()
    }

    /// [`SAMPLES`] refreshes, one every [`GAP`]: (sorted times, mean rows shown).
    fn sample(&mut self) -> (Vec<Duration>, f64) {
        let mut times = Vec::with_capacity(SAMPLES);
        let mut rows = 0;
        for _ in 0..SAMPLES {
            let start = Instant::now();
            rows += self.refresh();
            times.push(start.elapsed());
            std::thread::sleep(GAP);
        }
        times.sort();
        (times, rows as f64 / SAMPLES as f64)
    }
}

/// The background load: a staging task on `rt` and a rejecting thread.
struct Load {
    stop: Arc<AtomicBool>,
    staged: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
    started: Instant,
    stager: tokio::task::JoinHandle<()>,
    rejecter: std::thread::JoinHandle<(u64, u64)>,
}

impl Load {
    fn start(
        rt: &tokio::runtime::Runtime,
        agent: Peer<RoleClient>,
        socket: &Path,
        open: Arc<Mutex<VecDeque<u64>>>,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let staged = Arc::new(AtomicU64::new(0));
        let refused = Arc::new(AtomicU64::new(0));
        let stager = {
            let (stop, staged, refused, open) =
                (stop.clone(), staged.clone(), refused.clone(), open.clone());
            rt.spawn(async move {
                let slots = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
                let mut tick = tokio::time::interval(STAGE_EVERY);
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    let slot = slots.clone().acquire_owned().await.expect("open");
                    let (agent, staged, refused, open) =
                        (agent.clone(), staged.clone(), refused.clone(), open.clone());
                    tokio::spawn(async move {
                        match stage(&agent).await {
                            Ok(id) => {
                                open.lock().expect("not poisoned").push_back(id);
                                staged.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(answer) => {
                                if refused.fetch_add(1, Ordering::Relaxed) == 0 {
                                    eprintln!("review_load: a write was refused: {answer}");
                                }
                            }
                        }
                        drop(slot);
                    });
                }
                // Let the writes in flight finish.
                let _ = slots.acquire_many(IN_FLIGHT as u32).await;
            })
        };
        let rejecter = {
            let (stop, socket) = (stop.clone(), socket.to_owned());
            std::thread::spawn(move || {
                let (mut rejected, mut retried) = (0, 0);
                while !stop.load(Ordering::Relaxed) {
                    let ids: Vec<u64> = {
                        let mut open = open.lock().expect("not poisoned");
                        let over = open.len().saturating_sub(KEEP_OPEN);
                        open.drain(..over).collect()
                    };
                    if ids.is_empty() {
                        std::thread::sleep(REJECT_IDLE);
                        continue;
                    }
                    let count = ids.len() as u64;
                    let response = request(
                        &socket,
                        &Request::Reject {
                            ids,
                            reason: None,
                            cascade: false,
                        },
                    )
                    .expect("the person's socket answers");
                    let again = held(&response.text);
                    assert!(
                        response.ok || !again.is_empty(),
                        "rejecting failed: {}",
                        response.text
                    );
                    rejected += count - again.len() as u64;
                    retried += again.len() as u64;
                    let mut open = open.lock().expect("not poisoned");
                    for id in again.into_iter().rev() {
                        open.push_front(id);
                    }
                }
                (rejected, retried)
            })
        };
        Self {
            stop,
            staged,
            refused,
            started: Instant::now(),
            stager,
            rejecter,
        }
    }

    /// Stop the load: (actions staged per second, refused, (rejected, retried)).
    fn stop(self, rt: &tokio::runtime::Runtime) -> (f64, u64, (u64, u64)) {
        self.stop.store(true, Ordering::Relaxed);
        rt.block_on(self.stager).expect("the staging task finished");
        let elapsed = self.started.elapsed().as_secs_f64();
        let rejected = self.rejecter.join().expect("the rejecting thread finished");
        (
            self.staged.load(Ordering::Relaxed) as f64 / elapsed,
            self.refused.load(Ordering::Relaxed),
            rejected,
        )
    }
}

/// The actions a reject answer says were being decided at that moment (the daemon's
/// expiry sweep holds each open action briefly): they are rejected again later.
fn held(answer: &str) -> Vec<u64> {
    answer
        .lines()
        .filter(|l| l.contains("is being decided right now"))
        .filter_map(|l| l.trim().strip_prefix("could not reject #"))
        .filter_map(|l| l.split(':').next()?.parse().ok())
        .collect()
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let at = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[at].as_secs_f64() * 1e3
}

fn mean_ms(times: &[Duration]) -> f64 {
    times.iter().sum::<Duration>().as_secs_f64() * 1e3 / times.len() as f64
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let gate = Gate::start("review-load");
    let socket = socket_in(&gate.dir.join("data"));
    let agent = rt.block_on(gate.agent(CODER_TOKEN));

    // The backlog the screen shows while idle, and the load keeps.
    let open = Arc::new(Mutex::new(VecDeque::new()));
    rt.block_on(async {
        for _ in 0..KEEP_OPEN {
            let id = stage(agent.peer()).await.expect("the backlog stages");
            open.lock().expect("not poisoned").push_back(id);
        }
    });

    let mut screen = Screen::open(&socket);
    criterion.bench_function("refresh_idle", |b| b.iter(|| screen.refresh()));
    let (idle, idle_rows) = screen.sample();

    let load = Load::start(&rt, agent.peer().clone(), &socket, open);
    criterion.bench_function("refresh_under_load", |b| b.iter(|| screen.refresh()));
    let (loaded, loaded_rows) = screen.sample();
    let (rate, refused, (rejected, retried)) = load.stop(&rt);

    rt.block_on(async {
        let _ = agent.cancel().await;
    });
    assert!(
        gate.deliveries().is_empty(),
        "a staged write reached the server"
    );
    drop(gate);
    criterion.final_summary();

    println!("\ngate review under load, summary ({SAMPLES} refreshes each, one every {GAP:?})");
    println!(
        "  refresh (fetch + model + 120×40 frame), idle, {idle_rows:.0} rows: mean {:.2} ms, median {:.2} ms, p99 {:.2} ms",
        mean_ms(&idle),
        percentile(&idle, 0.5),
        percentile(&idle, 0.99),
    );
    println!(
        "  refresh under load, {loaded_rows:.0} rows on average: mean {:.2} ms, median {:.2} ms, p99 {:.2} ms",
        mean_ms(&loaded),
        percentile(&loaded, 0.5),
        percentile(&loaded, 0.99),
    );
    println!(
        "  load: {rate:.1} actions staged per second (target {:.0}), {refused} refused, {rejected} rejected by the person's socket ({retried} retried: held by the daemon's expiry sweep)",
        1.0 / STAGE_EVERY.as_secs_f64()
    );
}

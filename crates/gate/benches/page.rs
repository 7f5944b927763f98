//! Benchmarks of the review page as a person feels it, in headless Chromium (issue 37):
//!
//! - `page_load_50`: opening the pending page with 50 open actions (navigation until the
//!   page's script has run and counted 50 rows), beside `page_load_0`, the same page with
//!   nothing open, from the same run.
//! - `staged_to_shown`: the time from an agent's write being sent to the gate until the
//!   open page shows it (a MutationObserver in the page notes when the 50th row appears;
//!   the page and the bench read the same wall clock), beside `staged_answered`, the time
//!   the agent waits for its own "staged as action N" answer.
//!
//! A real `gate serve` with the fixture server over stdio and `[web]` on; the browser is
//! paired through `gate pair` with a virtual authenticator. Needs Debian's `chromium` and
//! `chromium-driver`.
//!
//! Run: `cargo bench -p gate --bench page -- --warm-up-time 1 --measurement-time 5`.

#[path = "../tests/support/browser.rs"]
mod browser;
#[path = "../tests/support/daemon.rs"]
mod daemon;
#[path = "../tests/support/fixture.rs"]
mod fixture;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use criterion::Criterion;
use rmcp::RoleClient;
use rmcp::service::RunningService;
use serde_json::json;

use browser::{Browser, with_page};
use daemon::{CODER_TOKEN, Gate, action_id, call, text};

/// Actions open while the page loads: the store's most per server.
const OPEN: u64 = 50;

/// Milliseconds since the Unix epoch, as the page's `performance.timeOrigin + now()`.
fn epoch_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64()
        * 1000.0
}

async fn stage(agent: &RunningService<RoleClient, ()>, n: u64) -> u64 {
    action_id(&text(
        &call(
            agent,
            "fixture__write_note",
            json!({ "text": format!("note {n}") }),
        )
        .await,
    ))
}

/// Open the page and wait until its script counted `rows` rows; how long it took.
async fn load(browser: &Browser, origin: &str, rows: u64) -> Duration {
    let start = std::time::Instant::now();
    browser.go(origin).await;
    browser
        .wait_for(
            "the rows",
            "return document.body.dataset.state === 'ready' ? Number(document.body.dataset.rows) : -1;",
            |v| v.as_u64() == Some(rows),
        )
        .await;
    start.elapsed()
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let mut gate = Gate::start("page-bench");
    let origin = with_page(&mut gate);
    let (browser, coder) = runtime.block_on(async {
        let browser = Browser::start(&gate.dir).await;
        browser::pair(&gate, &browser, &origin, "bench").await;
        (browser, gate.agent(CODER_TOKEN).await)
    });
    let mut criterion = Criterion::default().configure_from_args();

    criterion.bench_function("page_load_0", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    total += load(&browser, &origin, 0).await;
                }
                total
            })
        })
    });
    let mut next = 0;
    let mut open = Vec::new();
    runtime.block_on(async {
        while (open.len() as u64) < OPEN {
            open.push(stage(&coder, next).await);
            next += 1;
        }
    });
    criterion.bench_function("page_load_50", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    total += load(&browser, &origin, OPEN).await;
                }
                total
            })
        })
    });

    // One slot free: each iteration stages into it and rejects it again (not timed).
    let freed = open.pop().expect("open work");
    assert!(
        gate.person(&["reject", &freed.to_string()])
            .status
            .success()
    );
    runtime.block_on(async {
        load(&browser, &origin, OPEN - 1).await;
        browser
            .script(
                "window.shownAt = null;
                 new MutationObserver(() => {
                   if (window.shownAt === null && document.querySelectorAll('article.action').length === arguments[0]) {
                     window.shownAt = performance.timeOrigin + performance.now();
                   }
                 }).observe(document.getElementById('main'), {childList: true, subtree: true});",
                json!([OPEN]),
            )
            .await;
    });
    let answered = std::cell::RefCell::new(Vec::new());
    criterion.bench_function("staged_to_shown", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    browser.script("window.shownAt = null;", json!([])).await;
                    let sent = epoch_ms();
                    let start = std::time::Instant::now();
                    let id = stage(&coder, next).await;
                    answered.borrow_mut().push(start.elapsed());
                    next += 1;
                    let shown = browser
                        .wait_for(
                            "the staged write on the page",
                            "return window.shownAt;",
                            |v| v.as_f64().is_some(),
                        )
                        .await;
                    let ms = shown.as_f64().expect("a time") - sent;
                    total += Duration::from_secs_f64(ms.max(0.0) / 1000.0);
                    assert!(gate.person(&["reject", &id.to_string()]).status.success());
                    browser
                        .wait_for(
                            "the rejected write gone",
                            "return document.querySelectorAll('article.action').length;",
                            |v| v.as_u64() == Some(OPEN - 1),
                        )
                        .await;
                }
                total
            })
        })
    });
    let mut answered = answered.into_inner();
    answered.sort();
    if let Some(median) = answered.get(answered.len() / 2) {
        println!(
            "staged_answered (the agent's own wait for \"staged as action N\", {} samples): median {:.3} ms",
            answered.len(),
            median.as_secs_f64() * 1000.0
        );
    }
    criterion.final_summary();
    drop(coder);
    drop(browser);
}

//! What the gate's benchmarks share: the fixture server serving MCP streamable HTTP on its
//! own (the baseline of a call made directly), an agent's client, and the first line a
//! child process prints (its address), and each call's own time for percentiles.
//! Included with `#[path]` by each bench.

#![allow(dead_code)]

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};

use crate::fixture::fixture_binary;

/// An agent's MCP session, over streamable HTTP.
pub type Agent = RunningService<RoleClient, ()>;

/// Read a child's first line of standard output.
pub fn first_line(child: &mut Child) -> String {
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut line)
        .expect("the child prints its address");
    line.trim().to_owned()
}

/// The fixture server alone, serving MCP streamable HTTP.
pub struct DirectServer {
    child: Child,
    /// Where it serves.
    pub url: String,
}

impl DirectServer {
    /// The fixture server with these environment variables as well.
    pub fn start(env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(fixture_binary())
            .env("MCP_FIXTURE_HTTP", "127.0.0.1:0")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the fixture server starts");
        let url = first_line(&mut child);
        Self { child, url }
    }

    /// The server's process id.
    #[allow(dead_code)]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for DirectServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An agent connected to `url`, with `token` when it needs one.
pub async fn connect(url: &str, token: Option<&str>) -> Agent {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_owned());
    if let Some(token) = token {
        config = config.auth_header(token);
    }
    ().serve(StreamableHttpClientTransport::with_client(
        gatekeeper_mcp::tls::client(None).expect("an HTTP client"),
        config,
    ))
    .await
    .expect("the agent connects")
}

/// Each call's own time, per benchmark, over criterion's warm-up and samples.
static CALLS: Mutex<Vec<(&'static str, Vec<Duration>)>> = Mutex::new(Vec::new());

/// Keep `calls`, each call's own time, under benchmark `name`.
pub fn record(name: &'static str, calls: Vec<Duration>) {
    let mut all = CALLS.lock().unwrap_or_else(|p| p.into_inner());
    match all.iter_mut().find(|(n, _)| *n == name) {
        Some((_, times)) => times.extend(calls),
        None => all.push((name, calls)),
    }
}

/// Median, p90 and mean microseconds per call of a benchmark, if it ran.
pub fn figures(name: &str) -> Option<(f64, f64, f64)> {
    let all = CALLS.lock().unwrap_or_else(|p| p.into_inner());
    let (_, times) = all.iter().find(|(n, t)| *n == name && !t.is_empty())?;
    let mut micros: Vec<f64> = times.iter().map(|t| t.as_secs_f64() * 1e6).collect();
    micros.sort_by(f64::total_cmp);
    let at = |q: f64| micros[((micros.len() - 1) as f64 * q).round() as usize];
    let mean = micros.iter().sum::<f64>() / micros.len() as f64;
    Some((at(0.5), at(0.9), mean))
}

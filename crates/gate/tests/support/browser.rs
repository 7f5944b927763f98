//! Headless Chromium driven over WebDriver (chromedriver), with a virtual authenticator
//! holding a passkey, and a daemon with the review page on: for the review page's browser
//! test and its benchmark. Included with `#[path]`.

#![allow(dead_code)]

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::daemon::{self, Gate};
use crate::fixture::{self, free_port};

/// How long the page may take to show what is waited for; a bound on a failing test,
/// never a measurement.
pub const PATIENCE: Duration = Duration::from_secs(30);
/// WebDriver's key for an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// chromedriver and one browser session of it.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    http: reqwest::Client,
    _profile: PathBuf,
}

impl Browser {
    pub async fn start(scratch: &Path) -> Self {
        Self::start_with(scratch, &[]).await
    }

    /// A browser started with `extra` command-line arguments as well.
    pub async fn start_with(scratch: &Path, extra: &[String]) -> Self {
        for (program, package) in [
            ("chromium", "chromium"),
            ("chromedriver", "chromium-driver"),
        ] {
            let found = Command::new(program)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            assert!(
                found,
                "{program} is not installed: the review page's browser test needs it; install it (apt-get install -y {package}) and run the test again"
            );
        }
        let port = free_port();
        // A process group of its own: chromedriver starts the browser in it, and the drop
        // ends them all (killing chromedriver alone left the browser running).
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("chromedriver starts");
        let base = format!("http://127.0.0.1:{port}");
        let http = gatekeeper_mcp::tls::client(None).expect("an HTTP client");
        let start = Instant::now();
        loop {
            if let Ok(r) = http.get(format!("{base}/status")).send().await
                && r.status().is_success()
            {
                break;
            }
            assert!(start.elapsed() < PATIENCE, "chromedriver never answered");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let profile = scratch.join("chromium-profile");
        std::fs::create_dir_all(&profile).expect("profile directory");
        let mut args: Vec<String> = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1280,900",
        ]
        .map(str::to_owned)
        .to_vec();
        args.push(format!("--user-data-dir={}", profile.display()));
        args.extend(extra.iter().cloned());
        let mut browser = Self {
            driver,
            base,
            session: String::new(),
            http,
            _profile: profile.clone(),
        };
        let session = browser
            .raw(
                "POST",
                "/session",
                json!({"capabilities": {"alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {
                        "binary": "/usr/bin/chromium",
                        "args": args
                    }
                }}}),
            )
            .await;
        browser.session = session["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {session}"))
            .to_owned();
        // A passkey authenticator that is always present and verifies its user.
        browser
            .command(
                "POST",
                "/webauthn/authenticator",
                json!({"protocol": "ctap2", "transport": "internal", "hasResidentKey": true,
                       "hasUserVerification": true, "isUserConsenting": true,
                       "isUserVerified": true}),
            )
            .await;
        browser
    }

    async fn raw(&self, method: &str, path: &str, body: Value) -> Value {
        let url = format!("{}{path}", self.base);
        let request = match method {
            "GET" => self.http.get(url),
            "DELETE" => self.http.delete(url),
            _ => self
                .http
                .post(url)
                .header("content-type", "application/json")
                .body(body.to_string()),
        };
        let response = request.send().await.expect("chromedriver answers");
        let text = response.text().await.expect("an answer");
        let value: Value = serde_json::from_str(&text).expect("JSON from chromedriver");
        assert!(
            value["value"].get("error").is_none()
                || path.ends_with("/element")
                || path.ends_with("/click"),
            "WebDriver {method} {path}: {value}"
        );
        value["value"].clone()
    }

    pub async fn command(&self, method: &str, path: &str, body: Value) -> Value {
        self.raw(method, &format!("/session/{}{path}", self.session), body)
            .await
    }

    pub async fn go(&self, url: &str) {
        self.command("POST", "/url", json!({ "url": url })).await;
    }

    pub async fn script(&self, script: &str, args: Value) -> Value {
        self.command(
            "POST",
            "/execute/sync",
            json!({"script": script, "args": args}),
        )
        .await
    }

    /// Run `body` (an async function body) in the page and return what it returns.
    pub async fn run_async(&self, body: &str, args: Value) -> Value {
        let script = format!(
            "const done = arguments[arguments.length - 1]; (async (args) => {{ {body} }})(Array.from(arguments).slice(0, -1)).then(done, (e) => done('thrown: ' + e));"
        );
        self.command(
            "POST",
            "/execute/async",
            json!({"script": script, "args": args}),
        )
        .await
    }

    /// Click the element `css` selects; found again when the page replaced it meanwhile
    /// (the live list is re-rendered when work changes).
    pub async fn click(&self, css: &str) {
        for _ in 0..20 {
            let found = self
                .command(
                    "POST",
                    "/element",
                    json!({"using": "css selector", "value": css}),
                )
                .await;
            let Some(id) = found[ELEMENT].as_str().map(str::to_owned) else {
                let page = self.command("GET", "/source", Value::Null).await;
                panic!("no element {css} ({found}) on the page: {page}");
            };
            let clicked = self
                .raw(
                    "POST",
                    &format!("/session/{}/element/{id}/click", self.session),
                    json!({}),
                )
                .await;
            match clicked.get("error").and_then(Value::as_str) {
                None => return,
                Some("stale element reference") => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Some(_) => panic!("clicking {css}: {clicked}"),
            }
        }
        panic!("{css} kept being replaced before it could be clicked");
    }

    /// Wait until `check` (a script returning a value) gives something `ready` accepts.
    pub async fn wait_for(&self, what: &str, check: &str, ready: impl Fn(&Value) -> bool) -> Value {
        let start = Instant::now();
        loop {
            let value = self.script(check, json!([])).await;
            if ready(&value) {
                return value;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "the page never showed {what}; last: {value}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The page's message once its last action is over (done or failed).
    pub async fn said(&self) -> String {
        self.wait_for(
            "the end of its action",
            "return [document.body.dataset.state, (document.getElementById('said') || {}).textContent || ''];",
            |v| matches!(v[0].as_str(), Some("done" | "failed")),
        )
        .await[1]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    pub async fn ids_shown(&self) -> Vec<u64> {
        let value = self
            .script(
                "return Array.from(document.querySelectorAll('article.action')).map(a => Number(a.dataset.id));",
                json!([]),
            )
            .await;
        serde_json::from_value(value).expect("ids")
    }

    pub async fn screenshot(&self, width: u32, height: u32, to: &Path) {
        self.command(
            "POST",
            "/window/rect",
            json!({"width": width, "height": height}),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let png = self.command("GET", "/screenshot", Value::Null).await;
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().expect("base64"))
            .expect("a PNG");
        std::fs::write(to, bytes).expect("screenshot written");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Ok(group) = i32::try_from(self.driver.id()) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(group),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// A daemon with the review page on a port of its own; its origin. The fixture server is
/// named as a program on `PATH`, so what the page shows names no directory of this machine.
pub fn with_page(gate: &mut Gate) -> String {
    with_page_config(gate, "")
}

/// [`with_page`], with more lines in its `[web]` table; the origin is https:// when they
/// turn TLS on.
pub fn with_page_config(gate: &mut Gate, more: &str) -> String {
    let port = free_port();
    let fixture = fixture::fixture_binary();
    let text = std::fs::read_to_string(&gate.config).expect("config");
    let text = text.replace(
        &format!("{:?}", fixture.to_string_lossy()),
        "\"mcp-fixture\"",
    );
    std::fs::write(
        &gate.config,
        format!("{text}\n[web]\nlisten = \"127.0.0.1:{port}\"\n{more}"),
    )
    .expect("config written");
    gate.child.kill().expect("SIGKILL");
    gate.child.wait().expect("reaped");
    let path = format!(
        "{}:{}",
        fixture.parent().expect("a directory").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let (child, url) =
        daemon::spawn_serve_with(&gate.config, &gate.dir.join("data"), &[("PATH", &path)]);
    gate.child = child;
    gate.url = url;
    let scheme = if more.contains("tls") {
        "https"
    } else {
        "http"
    };
    format!("{scheme}://localhost:{port}")
}

/// `gate pair --name NAME` on `gate`: what it printed, and the link in it.
pub fn pairing_link(gate: &Gate, origin: &str, name: &str) -> (String, String) {
    let out = gate.person(&["pair", "--name", name]);
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{printed}");
    let link = printed
        .lines()
        .find(|l| l.starts_with(&format!("{origin}/pair/")))
        .unwrap_or_else(|| panic!("no link in {printed}"))
        .to_owned();
    (printed, link)
}

/// On an open pairing page: create the passkey, and wait for the pending list it lands on.
pub async fn finish_pairing(browser: &Browser) {
    browser.click("#pair").await;
    browser
        .wait_for(
            "the pending list after pairing",
            "return location.pathname + '|' + (document.getElementById('main') ? 'main' : '');",
            |v| v.as_str() == Some("/|main"),
        )
        .await;
}

/// Pair the browser as device `name` through `gate pair`'s link, and wait for the pending
/// list it lands on; what `gate pair` printed.
pub async fn pair(gate: &Gate, browser: &Browser, origin: &str, name: &str) -> String {
    let (printed, link) = pairing_link(gate, origin, name);
    browser.go(&link).await;
    finish_pairing(browser).await;
    printed
}

//! The review page end to end, in a real browser: `gate serve` with `[web]` in front of the
//! fixture MCP server, an agent staging writes over MCP, and headless Chromium driven over
//! WebDriver (chromedriver) with a virtual authenticator holding the passkey.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`apt-get install -y chromium
//! chromium-driver`); without them the test fails and says so. Deliveries are counted from
//! the fixture server's own log. With `GATE_SCREENSHOTS=DIR` the pending page is written
//! there at a phone's and a desktop's width (the README's pictures).

#[path = "support/daemon.rs"]
mod daemon;
#[path = "support/fixture.rs"]
mod fixture;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rmcp::RoleClient;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use serde_json::{Value, json};

use daemon::{CODER_TOKEN, Gate, action_id, call, text};
use fixture::free_port;

/// How long the page may take to show what is waited for; a bound on a failing test,
/// never a measurement.
const PATIENCE: Duration = Duration::from_secs(30);
/// WebDriver's key for an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// chromedriver and one browser session of it.
struct Browser {
    driver: Child,
    base: String,
    session: String,
    http: reqwest::Client,
    _profile: PathBuf,
}

impl Browser {
    async fn start(scratch: &Path) -> Self {
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
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
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
                        "args": [
                            "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                            "--no-first-run", "--disable-background-networking",
                            "--disable-component-update", "--disable-sync",
                            "--window-size=1280,900",
                            format!("--user-data-dir={}", profile.display()),
                        ]
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

    async fn command(&self, method: &str, path: &str, body: Value) -> Value {
        self.raw(method, &format!("/session/{}{path}", self.session), body)
            .await
    }

    async fn go(&self, url: &str) {
        self.command("POST", "/url", json!({ "url": url })).await;
    }

    async fn script(&self, script: &str, args: Value) -> Value {
        self.command(
            "POST",
            "/execute/sync",
            json!({"script": script, "args": args}),
        )
        .await
    }

    /// Run `body` (an async function body) in the page and return what it returns.
    async fn run_async(&self, body: &str, args: Value) -> Value {
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
    async fn click(&self, css: &str) {
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
    async fn wait_for(&self, what: &str, check: &str, ready: impl Fn(&Value) -> bool) -> Value {
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
    async fn said(&self) -> String {
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

    async fn ids_shown(&self) -> Vec<u64> {
        let value = self
            .script(
                "return Array.from(document.querySelectorAll('article.action')).map(a => Number(a.dataset.id));",
                json!([]),
            )
            .await;
        serde_json::from_value(value).expect("ids")
    }

    async fn screenshot(&self, width: u32, height: u32, to: &Path) {
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
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

async fn stage(agent: &RunningService<RoleClient, ()>, note: &str) -> u64 {
    action_id(&text(
        &call(agent, "fixture__write_note", json!({ "text": note })).await,
    ))
}

async fn outcome(agent: &RunningService<RoleClient, ()>, id: u64) -> String {
    let Value::Object(args) = json!({"action_id": id}) else {
        unreachable!()
    };
    let result = agent
        .call_tool(CallToolRequestParams::new("gate_action_result").with_arguments(args))
        .await
        .expect("gate_action_result answers");
    text(&result)
}

/// A daemon with the review page on a port of its own; its origin. The fixture server is
/// named as a program on `PATH`, so what the page shows names no directory of this machine.
fn with_page(gate: &mut Gate) -> String {
    let port = free_port();
    let fixture = fixture::fixture_binary();
    let text = std::fs::read_to_string(&gate.config).expect("config");
    let text = text.replace(
        &format!("{:?}", fixture.to_string_lossy()),
        "\"mcp-fixture\"",
    );
    std::fs::write(
        &gate.config,
        format!("{text}\n[web]\nlisten = \"127.0.0.1:{port}\"\n"),
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
    format!("http://localhost:{port}")
}

fn person(gate: &Gate, args: &[&str]) -> (bool, String) {
    let out = gate.person(args);
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_person_pairs_a_phone_and_decides_there_each_decision_signed_and_verified() {
    let mut gate = Gate::start("web");
    let origin = with_page(&mut gate);
    let coder = gate.agent(CODER_TOKEN).await;
    let browser = Browser::start(&gate.dir).await;

    // Without a paired device the page says how to pair one.
    browser.go(&origin).await;
    let first = browser
        .script("return document.body.textContent;", json!([]))
        .await;
    assert!(
        first.as_str().unwrap().contains("gate pair --name phone"),
        "{first}"
    );

    // Pairing: a one-time link from the terminal, a passkey created on the device.
    let (ok, paired) = person(&gate, &["pair", "--name", "phone"]);
    assert!(ok, "{paired}");
    let link = paired
        .lines()
        .find(|l| l.starts_with(&format!("{origin}/pair/")))
        .unwrap_or_else(|| panic!("no link in {paired}"))
        .to_owned();
    assert!(
        paired.contains('▀') || paired.contains('▄'),
        "no QR code: {paired}"
    );
    browser.go(&link).await;
    browser.click("#pair").await;
    browser
        .wait_for(
            "the pending list after pairing",
            "return location.pathname + '|' + (document.getElementById('main') ? 'main' : '');",
            |v| v.as_str() == Some("/|main"),
        )
        .await;
    // The link works once.
    let again = reqwest::get(&link).await.expect("the page answers");
    assert_eq!(again.status(), 404);
    let (_, devices) = person(&gate, &["devices"]);
    assert!(
        devices.contains("phone") && devices.contains("active"),
        "{devices}"
    );

    // Work staged while the page is open appears without a reload.
    let mut staged = Vec::new();
    for n in 0..6 {
        staged.push(stage(&coder, &format!("note {n}")).await);
    }
    browser
        .wait_for(
            "six pending writes, live",
            "return Number(document.body.dataset.rows || 0);",
            |v| v.as_u64() == Some(6),
        )
        .await;
    let shown = browser.ids_shown().await;
    let mut newest_first = staged.clone();
    newest_first.reverse();
    assert_eq!(shown, newest_first, "newest first");
    if let Some(dir) = std::env::var_os("GATE_SCREENSHOTS") {
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir).expect("screenshot directory");
        browser
            .screenshot(390, 844, &dir.join("review-phone.png"))
            .await;
        browser
            .screenshot(1280, 900, &dir.join("review-desktop.png"))
            .await;
    }

    // Approve one: sent once, and gone from the page.
    browser
        .click(&format!(
            "button[data-decide=approve][data-id=\"{}\"]",
            staged[0]
        ))
        .await;
    let said = browser.said().await;
    assert!(said.contains("approved"), "{said}");
    assert_eq!(gate.deliveries(), [r#"write_note {"text":"note 0"}"#]);
    assert!(!browser.ids_shown().await.contains(&staged[0]));

    // Reject one with a reason: the agent is told it.
    browser
        .script(
            "document.querySelector('input.reason[data-id=\"' + arguments[0] + '\"]').value = arguments[1];",
            json!([staged[1], "not this week"]),
        )
        .await;
    browser
        .click(&format!(
            "button[data-decide=reject][data-id=\"{}\"]",
            staged[1]
        ))
        .await;
    let said = browser.said().await;
    assert!(said.contains("rejected"), "{said}");
    let told = outcome(&coder, staged[1]).await;
    assert!(told.contains("not this week"), "{told}");

    // Approve three at once: one assertion over the three digests.
    for id in &staged[2..5] {
        browser.click(&format!("input.pick[value=\"{id}\"]")).await;
    }
    browser.click("#approve-picked").await;
    let said = browser.said().await;
    assert!(said.contains("approved"), "{said}");
    assert_eq!(gate.deliveries().len(), 4, "{:?}", gate.deliveries());
    assert_eq!(browser.ids_shown().await, [staged[5]]);

    // A decision in the terminal disappears from the open page.
    let (ok, rejected) = person(&gate, &["reject", &staged[5].to_string()]);
    assert!(ok, "{rejected}");
    browser
        .wait_for(
            "the terminal's decision gone from the page",
            "return Number(document.body.dataset.rows || 0);",
            |v| v.as_u64() == Some(0),
        )
        .await;

    // A stale page: deciding what was decided elsewhere says what happened.
    let stale = browser
        .run_async(
            "return await post('/api/decide/start', {decision: 'approve', ids: [args[0]]});",
            json!([staged[5]]),
        )
        .await;
    assert_eq!(stale["ok"], false, "{stale}");
    let text_of = |v: &Value| v["text"].as_str().unwrap_or_default().to_owned();
    assert!(text_of(&stale).contains("already decided"), "{stale}");
    assert!(text_of(&stale).contains("rejected"), "{stale}");

    // A forged assertion (one signature byte changed) and a replayed one are refused.
    let target = stage(&coder, "forged").await;
    let forged = browser
        .run_async(
            "const s = await post('/api/decide/start', {decision: 'approve', ids: [args[0]]});
             const c = assertion(await navigator.credentials.get(requestOptions(s.options)));
             const good = JSON.parse(JSON.stringify(c));
             const bytes = new Uint8Array(b64u.dec(c.response.signature));
             bytes[bytes.length - 1] ^= 1;
             c.response.signature = b64u.enc(bytes.buffer);
             const bad = await post('/api/decide/finish', {nonce: s.nonce, credential: c});
             const replay = await post('/api/decide/finish', {nonce: s.nonce, credential: good});
             return [bad, replay];",
            json!([target]),
        )
        .await;
    assert_eq!(forged[0]["ok"], false, "{forged}");
    assert!(text_of(&forged[0]).contains("not accepted"), "{forged}");
    assert_eq!(forged[1]["ok"], false, "{forged}");
    assert!(text_of(&forged[1]).contains("already signed"), "{forged}");
    assert_eq!(gate.deliveries().len(), 4, "nothing forged was sent");

    // The page's session never works on the agents' endpoint, an agent's token never on
    // the page.
    let cookies = browser.command("GET", "/cookie", Value::Null).await;
    let session = cookies
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "gate_session"))
        .expect("the session cookie");
    assert_eq!(session["httpOnly"], true, "{session}");
    assert_eq!(session["sameSite"], "Strict", "{session}");
    let http = reqwest::Client::new();
    let with_cookie = http
        .post(&gate.url)
        .header(
            "cookie",
            format!("gate_session={}", session["value"].as_str().unwrap()),
        )
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#)
        .send()
        .await
        .expect("the agents' endpoint answers");
    assert_eq!(with_cookie.status(), 401);
    let with_token = http
        .get(format!("{origin}/rows"))
        .header("authorization", format!("Bearer {CODER_TOKEN}"))
        .send()
        .await
        .expect("the page answers");
    assert_eq!(with_token.status(), 401);
    let csp = with_token
        .headers()
        .get("content-security-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(csp.contains("script-src 'self'"), "{csp}");

    // Every signed decision verifies; one changed byte of a stored assertion does not.
    let data = gate.dir.join("data");
    let (ok, verified) = person(&gate, &["ledger", "verify"]);
    assert!(ok, "{verified}");
    assert!(
        verified.contains("3 decisions signed on the review page verified, 0 failed"),
        "{verified}"
    );
    let ledger = gate.person(&["ledger", "--limit", "200"]);
    let ledger = String::from_utf8_lossy(&ledger.stdout).into_owned();
    assert!(ledger.contains("via passkey phone"), "{ledger}");

    // A lost device is revoked in one command: the page is signed out, and nothing it
    // signs is accepted.
    let (ok, revoked) = person(&gate, &["devices", "revoke", "phone"]);
    assert!(ok, "{revoked}");
    let refused = browser
        .run_async(
            "return await post('/api/decide/start', {decision: 'approve', ids: [args[0]]});",
            json!([target]),
        )
        .await;
    assert_eq!(refused["ok"], false, "{refused}");
    assert!(text_of(&refused).contains("signed out"), "{refused}");
    let login = browser
        .run_async("return await post('/api/login/start');", json!([]))
        .await;
    assert_eq!(login["ok"], false, "{login}");
    assert_eq!(gate.deliveries().len(), 4);

    let signed = data.join("web-decisions.jsonl");
    let original = std::fs::read_to_string(&signed).expect("signed decisions");
    let mut records: Vec<Value> = original
        .lines()
        .map(|l| serde_json::from_str(l).expect("a record"))
        .collect();
    let signature = records[1]["assertion"]["response"]["signature"]
        .as_str()
        .expect("a signature")
        .to_owned();
    let mut bytes = signature.into_bytes();
    let last = bytes.len() - 2;
    bytes[last] = if bytes[last] == b'A' { b'B' } else { b'A' };
    records[1]["assertion"]["response"]["signature"] = json!(String::from_utf8(bytes).unwrap());
    let tampered: String = records.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(&signed, tampered).expect("tampered");
    let (ok, failed) = person(&gate, &["ledger", "verify"]);
    assert!(!ok, "{failed}");
    assert!(failed.contains("line 2"), "{failed}");
    assert!(
        failed.contains("2 decisions signed on the review page verified, 1 failed"),
        "{failed}"
    );
}

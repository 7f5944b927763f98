//! The review page end to end, in a real browser: `gate serve` with `[web]` in front of the
//! fixture MCP server, an agent staging writes over MCP, and headless Chromium driven over
//! WebDriver (chromedriver) with a virtual authenticator holding the passkey.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`apt-get install -y chromium
//! chromium-driver`); without them the test fails and says so. Deliveries are counted from
//! the fixture server's own log. With `GATE_SCREENSHOTS=DIR` the pending page is written
//! there at a phone's and a desktop's width (the README's pictures).

#[path = "support/browser.rs"]
mod browser;
#[path = "support/daemon.rs"]
mod daemon;
#[path = "support/fixture.rs"]
mod fixture;

use std::path::PathBuf;

use rmcp::RoleClient;
use rmcp::service::RunningService;
use serde_json::{Value, json};

use browser::{Browser, with_page, with_page_config};
use daemon::{CODER_TOKEN, Gate, action_id, call, text};

async fn stage(agent: &RunningService<RoleClient, ()>, note: &str) -> u64 {
    action_id(&text(
        &call(agent, "fixture__write_note", json!({ "text": note })).await,
    ))
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

    // Pairing: a one-time link from the terminal (and its QR code), a passkey created on
    // the device.
    let paired = browser::pair(&gate, &browser, &origin, "phone").await;
    assert!(
        paired.contains('▀') || paired.contains('▄'),
        "no QR code: {paired}"
    );
    let link = paired
        .lines()
        .find(|l| l.starts_with(&format!("{origin}/pair/")))
        .expect("the link")
        .to_owned();
    // The link works once.
    let again = gatekeeper_mcp::tls::client(None)
        .expect("an HTTP client")
        .get(&link)
        .send()
        .await
        .expect("the page answers");
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
    let told = text(
        &call(
            &coder,
            "gate_action_result",
            json!({"action_id": staged[1]}),
        )
        .await,
    );
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
            "return await post('/api/decide/start', {decision: 'approve', ids: [args[0]], digests: digests([args[0]])});",
            json!([staged[5]]),
        )
        .await;
    assert_eq!(stale["ok"], false, "{stale}");
    let text_of = |v: &Value| v["text"].as_str().unwrap_or_default().to_owned();
    assert!(text_of(&stale).contains("already decided"), "{stale}");
    assert!(text_of(&stale).contains("rejected"), "{stale}");

    // A page that shows a call other than the one waiting (here: the digest it holds is
    // changed in the page) signs nothing: the decision is refused with the reason.
    let target = stage(&coder, "forged").await;
    let shown = format!("return document.querySelector('article[data-id=\"{target}\"]') !== null;");
    browser
        .wait_for("the next write", &shown, |v| v.as_bool() == Some(true))
        .await;
    browser
        .script(
            "document.querySelector('article[data-id=\"' + arguments[0] + '\"]').dataset.digest = 'sha256:0000000000000000';",
            json!([target]),
        )
        .await;
    browser
        .click(&format!(
            "button[data-decide=approve][data-id=\"{target}\"]"
        ))
        .await;
    let said = browser.said().await;
    assert!(said.contains("changed since the page showed it"), "{said}");
    assert_eq!(gate.deliveries().len(), 4, "nothing changed was sent");
    browser.go(&origin).await;
    browser
        .wait_for("the page again", &shown, |v| v.as_bool() == Some(true))
        .await;

    // A forged assertion (one signature byte changed) and a replayed one are refused.
    let forged = browser
        .run_async(
            "const s = await post('/api/decide/start', {decision: 'approve', ids: [args[0]], digests: digests([args[0]])});
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
    let http = gatekeeper_mcp::tls::client(None).expect("an HTTP client");
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
    // A page of another site whose name resolves here (DNS rebinding) is refused.
    let rebound = http
        .get(format!("{origin}/"))
        .header("host", "attacker.example")
        .send()
        .await
        .expect("the page answers");
    assert_eq!(rebound.status(), 421);

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
            "return await post('/api/decide/start', {decision: 'approve', ids: [args[0]], digests: digests([args[0]])});",
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

#[tokio::test(flavor = "multi_thread")]
async fn over_tls_the_page_shows_the_fingerprint_the_terminal_printed_and_decides_the_same_way() {
    let mut gate = Gate::start_with("web-tls", "vetted");
    let origin = with_page_config(&mut gate, "tls = \"self-signed\"\n");
    assert!(origin.starts_with("https://localhost:"), "{origin}");
    let coder = gate.agent(CODER_TOKEN).await;

    // `gate pair` prints the certificate's fingerprints; the browser trusts exactly that
    // public key, as a person who compared them would.
    let (printed, link) = browser::pairing_link(&gate, &origin, "laptop");
    let key = printed
        .split("public key SHA-256 (base64) ")
        .nth(1)
        .and_then(|rest| rest.split('.').next())
        .unwrap_or_else(|| panic!("no fingerprint in {printed}"))
        .to_owned();
    let certificate = printed
        .split("certificate SHA-256 ")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .expect("the certificate's fingerprint")
        .to_owned();
    let browser = Browser::start_with(
        &gate.dir,
        &[format!("--ignore-certificate-errors-spki-list={key}")],
    )
    .await;
    browser.go(&link).await;
    let shown = browser
        .script("return document.body.textContent;", json!([]))
        .await;
    assert!(
        shown.as_str().unwrap_or_default().contains(&certificate),
        "the pairing page shows another fingerprint than {certificate}: {shown}"
    );
    browser::finish_pairing(&browser).await;

    let id = stage(&coder, "over tls").await;
    browser
        .wait_for(
            "the staged write",
            "return Number(document.body.dataset.rows || 0);",
            |v| v.as_u64() == Some(1),
        )
        .await;
    browser
        .click(&format!("button[data-decide=approve][data-id=\"{id}\"]"))
        .await;
    let said = browser.said().await;
    assert!(said.contains("approved"), "{said}");
    assert_eq!(gate.deliveries(), [r#"write_note {"text":"over tls"}"#]);

    // A rule enabled in the terminal is revoked from the rules page, signed like a decision.
    let (ok, added) = person(&gate, &["rules", "add", "fixture__tag_note"]);
    assert!(ok, "{added}");
    browser.go(&format!("{origin}/rules")).await;
    let rules = browser
        .script(
            "return document.querySelector('pre.text').textContent;",
            json!([]),
        )
        .await;
    assert!(
        rules.as_str().unwrap_or_default().contains("tag_note"),
        "{rules}"
    );
    browser
        .script(
            "document.getElementById('rule').value = 'fixture__tag_note';",
            json!([]),
        )
        .await;
    browser.click("#revoke").await;
    let said = browser.said().await;
    assert!(said.contains("rule removed"), "{said}");
    let (_, rules) = person(&gate, &["rules"]);
    assert!(!rules.contains("fixture__tag_note: on"), "{rules}");

    // Over TLS the session cookie is Secure as well.
    let cookies = browser.command("GET", "/cookie", Value::Null).await;
    let session = cookies
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "gate_session"))
        .expect("the session cookie");
    assert_eq!(session["secure"], true, "{session}");
    let (ok, verified) = person(&gate, &["ledger", "verify"]);
    assert!(
        ok && verified.contains("2 decisions signed on the review page verified, 0 failed"),
        "{verified}"
    );
}

//! The review page's HTML, script and style, all served by the gate itself: pages rendered
//! from the same rows and prompts the terminal shows, every text escaped.

use std::collections::HashMap;

use crate::person::LedgerQuery;
use crate::queue::Queue;

/// The page's script: passkey ceremonies, signed decisions, live updates.
pub const SCRIPT: &str = include_str!("gate.js");
/// The page's style: readable at a phone's width.
pub const STYLE: &str = include_str!("gate.css");

/// `text` escaped for HTML text and attribute values.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn head(title: &str, csrf: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><meta name=\"gate-csrf\" content=\"{}\"><title>{} · gate</title><link rel=\"stylesheet\" href=\"/assets/gate.css\"><script src=\"/assets/gate.js\" defer></script></head>",
        esc(csrf),
        esc(title)
    )
}

/// A signed-in page: navigation, who decides, a place for messages, and `body`.
pub fn frame(title: &str, csrf: &str, decider: &str, body: &str) -> String {
    format!(
        "{}<body><header class=\"top\"><nav><a href=\"/\">Pending</a> <a href=\"/rules\">Rules</a> <a href=\"/catalog\">Catalog</a> <a href=\"/ledger\">Ledger</a></nav><p class=\"who\">Deciding as {} <button type=\"button\" id=\"logout\">Sign out</button></p></header><p id=\"said\" role=\"status\" aria-live=\"polite\"></p><main id=\"main\">{body}</main></body></html>",
        head(title, csrf),
        esc(decider)
    )
}

/// The sign-in page (or, with no device paired, how to pair one).
pub fn login(paired: bool) -> String {
    let body = if paired {
        "<h1>gate</h1><p>Sign in with the passkey of a paired device.</p><button type=\"button\" id=\"login\" autofocus>Sign in with passkey</button><p id=\"said\" role=\"status\" aria-live=\"polite\"></p>"
    } else {
        "<h1>gate</h1><p>No device is paired yet. In a terminal on the gate's machine, run <code>gate pair --name phone</code> and open the link it prints on this device.</p>"
    };
    format!(
        "{}<body class=\"narrow\">{body}</body></html>",
        head("Sign in", "")
    )
}

/// The pairing page of a one-time link, with the certificate's fingerprints when the
/// page serves HTTPS (to compare with what `gate pair` printed).
pub fn pair(name: &str, fingerprints: Option<&str>) -> String {
    let check = match fingerprints {
        Some(f) => format!(
            "<p class=\"fingerprint\">This page's {}. The terminal where you ran <code>gate pair</code> shows the same; if it does not, stop here.</p>",
            esc(f)
        ),
        None => String::new(),
    };
    format!(
        "{}<body class=\"narrow\"><h1>Pair this device</h1><p>This device will decide for the gate as <strong>{}</strong>. It will create a passkey; every decision you make here is signed with it.</p>{check}<button type=\"button\" id=\"pair\" autofocus>Create passkey and pair</button><p id=\"said\" role=\"status\" aria-live=\"polite\"></p></body></html>",
        head("Pair", ""),
        esc(name)
    )
}

/// An error page's body.
pub fn error(text: &str) -> String {
    format!(
        "{}<body class=\"narrow\"><p class=\"error\">{}</p></body></html>",
        head("gate", ""),
        esc(text)
    )
}

/// A problem shown inside a page.
pub fn problem(text: &str) -> String {
    format!("<p class=\"error\">{}</p>", esc(text))
}

/// A text answer of the person's socket, as the terminal would print it.
pub fn text(text: &str) -> String {
    format!("<pre class=\"text\">{}</pre>", esc(text))
}

/// The open work: newest first, grouped by agent and server, each with what it sends and
/// its buttons; `shown` holds each call's arguments' length in characters and its digest
/// (what a decision on it signs).
pub fn rows(queue: &Queue, shown: &HashMap<u64, (usize, String)>) -> String {
    if queue.rows.is_empty() {
        return "<p class=\"empty\" id=\"empty\">Nothing waits for you.</p>".to_owned();
    }
    // Groups ordered by their newest action, each newest first.
    let mut groups: Vec<((&str, &str), Vec<&crate::queue::Row>)> = Vec::new();
    let mut ordered: Vec<&crate::queue::Row> = queue.rows.iter().collect();
    ordered.sort_by_key(|row| std::cmp::Reverse(row.id));
    for row in ordered {
        let key = (row.agent.as_str(), row.server.as_str());
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, rows)) => rows.push(row),
            None => groups.push((key, vec![row])),
        }
    }
    let mut out = format!(
        "<div class=\"batch\"><span id=\"count\">{} waiting</span> <button type=\"button\" id=\"approve-picked\">Approve selected</button> <button type=\"button\" id=\"reject-picked\">Reject selected</button></div>",
        queue.rows.len()
    );
    for ((agent, server), rows) in groups {
        out.push_str(&format!(
            "<section class=\"group\"><h2>{} on {}</h2>",
            esc(agent),
            esc(server)
        ));
        for row in rows {
            out.push_str(&card(row, shown.get(&row.id)));
        }
        out.push_str("</section>");
    }
    for question in &queue.questions {
        out.push_str(&format!("<p class=\"question\">{}</p>", esc(question)));
    }
    out
}

fn card(row: &crate::queue::Row, shown: Option<&(usize, String)>) -> String {
    let id = row.id;
    let digest = shown.map_or("", |(_, digest)| digest.as_str());
    let flags: String = row
        .flags
        .iter()
        .map(|f| format!("<li>{}</li>", esc(f)))
        .collect();
    let length = match shown {
        Some((n, _)) => format!(
            "<p class=\"length\">Its arguments are {n} characters; <a href=\"/action/{id}\">read everything it sends</a>.</p>"
        ),
        None => String::new(),
    };
    let kind = match &row.revoke {
        Some(_) => format!(
            "<button type=\"button\" data-decide=\"approve-all-of-kind\" data-id=\"{id}\">Approve, and every {} from now on (a rule for every agent, until you revoke it)</button>",
            esc(&row.kind)
        ),
        None => String::new(),
    };
    format!(
        "<article class=\"action\" id=\"a{id}\" data-id=\"{id}\" data-digest=\"{}\"><header><label><input type=\"checkbox\" class=\"pick\" value=\"{id}\"> #{id}</label> <span class=\"kind\">{}</span> <time>{}</time></header><h3>{}</h3><ul class=\"flags\">{flags}</ul><pre class=\"prompt\">{}</pre>{length}<p class=\"rule\">{}</p><div class=\"buttons\"><button type=\"button\" data-decide=\"approve\" data-id=\"{id}\">Approve</button> {kind} <input type=\"text\" class=\"reason\" data-id=\"{id}\" placeholder=\"Reason (told to the agent)\" aria-label=\"Reason for rejecting #{id}\"> <button type=\"button\" data-decide=\"reject\" data-id=\"{id}\">Reject</button></div></article>",
        esc(digest),
        esc(&row.kind),
        esc(&row.staged_at),
        esc(&row.title),
        esc(&row.prompt),
        esc(&row.rule)
    )
}

/// The buttons of one open action's own page (which shows every character it sends), for
/// the call whose digest is `digest`.
pub fn action_buttons(id: u64, digest: &str) -> String {
    format!(
        "<div class=\"buttons\" data-full-seen=\"true\" data-id=\"{id}\" data-digest=\"{}\"><button type=\"button\" data-decide=\"approve\" data-id=\"{id}\">Approve</button> <input type=\"text\" class=\"reason\" data-id=\"{id}\" placeholder=\"Reason (told to the agent)\" aria-label=\"Reason for rejecting #{id}\"> <button type=\"button\" data-decide=\"reject\" data-id=\"{id}\">Reject</button></div>",
        esc(digest)
    )
}

/// The rules page's form to revoke one.
pub fn revoke_form() -> String {
    "<div class=\"buttons\"><input type=\"text\" id=\"rule\" placeholder=\"Rule, as listed above (server tool)\" aria-label=\"Rule to revoke\"> <button type=\"button\" id=\"revoke\">Revoke rule</button></div>".to_owned()
}

/// The ledger page's filters, and the link to the next page.
pub fn ledger_form(query: &LedgerQuery, next: Option<u64>) -> String {
    let value = |v: &Option<String>| esc(v.as_deref().unwrap_or(""));
    let mut out = format!(
        "<form class=\"filters\" method=\"get\" action=\"/ledger\"><input name=\"agent\" placeholder=\"agent\" aria-label=\"agent\" value=\"{}\"> <input name=\"server\" placeholder=\"server\" aria-label=\"server\" value=\"{}\"> <input name=\"state\" placeholder=\"state\" aria-label=\"state\" value=\"{}\"> <button>Filter</button></form>",
        value(&query.agent),
        value(&query.server),
        value(&query.state)
    );
    if let Some(before) = next {
        let mut link = format!("/ledger?before={before}");
        for (key, v) in [
            ("agent", &query.agent),
            ("server", &query.server),
            ("state", &query.state),
        ] {
            if let Some(v) = v {
                link.push_str(&format!("&{key}={}", percent(v)));
            }
        }
        out.push_str(&format!(
            "<p><a href=\"{}\" rel=\"next\">Older entries</a></p>",
            esc(&link)
        ));
    }
    out
}

fn percent(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// `link` as a QR code in text, two rows of modules per line, for a terminal.
pub fn qr(link: &str) -> String {
    match qrcode::QrCode::new(link.as_bytes()) {
        Ok(code) => code
            .render::<qrcode::render::unicode::Dense1x2>()
            .quiet_zone(true)
            .build(),
        Err(_) => "(the link is too long for a QR code; type it instead)".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everything_shown_is_escaped() {
        assert_eq!(
            esc("<script>alert('x')</script> & \"y\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;y&quot;"
        );
    }

    #[test]
    fn a_link_becomes_a_qr_code_of_text() {
        let code = qr("http://localhost:8790/pair/abc");
        assert!(code.lines().count() > 10, "{code}");
        assert!(code.contains('█') || code.contains('▀') || code.contains('▄'));
    }

    #[test]
    fn the_next_ledger_page_keeps_the_filters() {
        let query = LedgerQuery {
            agent: Some("coder one".into()),
            ..Default::default()
        };
        let form = ledger_form(&query, Some(40));
        assert!(
            form.contains("/ledger?before=40&amp;agent=coder%20one"),
            "{form}"
        );
    }
}

//! The review page: the person's decisions from a browser on another device, each one a
//! passkey assertion over exactly what the page showed.
//!
//! Off unless the configuration has `[web] listen = "127.0.0.1:8790"`. It has a listener of
//! its own: agents' tokens mean nothing here, and its session cookie means nothing on the
//! agents' endpoint. A device is paired from the terminal (`gate pair` prints a one-time
//! link, also as a QR code), registers a passkey, and signs in with it. Every decision is a
//! second assertion whose challenge is the digest of a [`signed_decisions::Statement`] naming the
//! decision, the ledger ids and each call's digest as shown; the signed record is synced to
//! the data directory before the decision is carried out, through the same code as the
//! person's socket ([`crate::control::respond`]), as the device's owner "via passkey".
//! Pages are rendered by the daemon, with the same sanitising and redaction as the
//! terminal; scripts and styles are served by the gate itself under a strict
//! Content-Security-Policy; open pages learn of changes through server-sent events.

mod page;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::Router;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response as HttpResponse};
use axum::routing::{get, post};
use kernel::{ActionState, LedgerId};
use serde::Deserialize;
use serde_json::{Value, json};
use signed_decisions::webauthn_rs::prelude::{
    PasskeyAuthentication, PasskeyRegistration, PublicKeyCredential, RegisterPublicKeyCredential,
    Uuid, Webauthn,
};

use crate::control::{Request, Response};
use crate::gateway::Gateway;
use signed_decisions as passkeys;
use signed_decisions::{Device, Devices, Signed, Statement};

/// How long a pairing link may be used.
pub const PAIRING_TTL: Duration = Duration::from_secs(10 * 60);
/// How long a signed-in page stays signed in.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 60 * 60);
/// How long a passkey ceremony (sign-in, pairing, a decision) may take.
pub const CEREMONY_TTL: Duration = Duration::from_secs(3 * 60);
/// How many pairing and sign-in ceremonies may start per minute, in all.
pub const CEREMONIES_PER_MINUTE: u32 = 20;
/// How many times one pairing link may be tried.
pub const PAIRING_ATTEMPTS: u32 = 5;
/// The session cookie's name.
const COOKIE: &str = "gate_session";
/// The header that carries a page's token against cross-site requests.
const CSRF_HEADER: &str = "x-gate-csrf";
/// What every answer of the page's listener says about itself.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// A signed-in page.
#[derive(Debug, Clone)]
struct Session {
    device: String,
    owner: String,
    csrf: String,
    expires: Instant,
}

/// A pairing link handed out by `gate pair`.
struct Pairing {
    name: String,
    owner: String,
    expires: Instant,
    attempts: u32,
    state: Option<PasskeyRegistration>,
}

/// A decision waiting for its assertion.
struct Asked {
    session: String,
    statement: Statement,
    state: PasskeyAuthentication,
    expires: Instant,
}

/// The review page's state: its relying party, devices, sessions and ceremonies.
pub struct Web {
    gateway: Arc<Gateway>,
    data_dir: PathBuf,
    origin: String,
    rp_id: String,
    webauthn: Webauthn,
    secure: bool,
    tls: Option<crate::tls::PageTls>,
    devices: Mutex<Devices>,
    sessions: Mutex<HashMap<String, Session>>,
    pairings: Mutex<HashMap<String, Pairing>>,
    logins: Mutex<HashMap<String, (PasskeyAuthentication, Instant)>>,
    asked: Mutex<HashMap<String, Asked>>,
    ceremonies: Mutex<(Instant, u32)>,
}

impl std::fmt::Debug for Web {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Web").field("origin", &self.origin).finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// 32 random bytes from the operating system, as unpadded base64url.
fn random() -> String {
    use std::io::Read as _;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .expect("the operating system gives random bytes");
    passkeys::base64url(&bytes)
}

/// An answer to the page's script: `{"ok": .., "text": ..}` with a status.
fn said(status: StatusCode, text: impl Into<String>) -> HttpResponse {
    (
        status,
        Json(json!({"ok": status.is_success(), "text": text.into()})),
    )
        .into_response()
}

/// Why a request is refused: its status and what to tell the page.
#[derive(Debug)]
struct Refusal(StatusCode, String);

impl IntoResponse for Refusal {
    fn into_response(self) -> HttpResponse {
        said(self.0, self.1)
    }
}

impl Web {
    /// The page for `origin`, deciding through `gateway`, keeping devices and signed
    /// decisions in `data_dir`, served over `tls` when given.
    pub fn new(
        gateway: Arc<Gateway>,
        data_dir: &Path,
        origin: &str,
        tls: Option<crate::tls::PageTls>,
    ) -> Result<Self, String> {
        let (rp_id, webauthn) = passkeys::relying_party(origin)?;
        Ok(Self {
            gateway,
            data_dir: data_dir.to_owned(),
            origin: origin.to_owned(),
            rp_id,
            webauthn,
            secure: origin.starts_with("https://"),
            tls,
            devices: Mutex::new(Devices::open(data_dir)?),
            sessions: Mutex::default(),
            pairings: Mutex::default(),
            logins: Mutex::default(),
            asked: Mutex::default(),
            ceremonies: Mutex::new((Instant::now(), 0)),
        })
    }

    /// The active device whose passkey made the verified assertion `result`, its counter
    /// advanced; why not, when it is revoked, unknown or its counter went back.
    fn signer(
        &self,
        result: &signed_decisions::webauthn_rs::prelude::AuthenticationResult,
    ) -> Result<Device, String> {
        let mut devices = lock(&self.devices);
        let device = devices
            .holding(result.cred_id().as_ref())
            .filter(|d| d.active())
            .cloned()
            .ok_or("that passkey belongs to no active paired device (it may have been revoked)")?;
        devices.advance(result.cred_id().as_ref(), result.counter())?;
        Ok(device)
    }

    /// The page's TLS, when it serves HTTPS.
    pub fn tls(&self) -> Option<&crate::tls::PageTls> {
        self.tls.as_ref()
    }

    /// What identifies the page's certificate, for the person to compare on both screens.
    fn fingerprints(&self) -> Option<String> {
        let tls = self.tls.as_ref()?;
        let mut text = format!("certificate SHA-256 {}", tls.certificate_sha256);
        if let Some(key) = &tls.public_key_sha256 {
            text.push_str(&format!("; public key SHA-256 (base64) {key}"));
        }
        Some(text)
    }

    fn now_ms(&self) -> u64 {
        self.gateway.overseer().now()
    }

    /// The signed-in session the request's cookie names, if it is live.
    fn session(&self, headers: &HeaderMap) -> Option<(String, Session)> {
        let id = cookie(headers, COOKIE)?;
        let mut sessions = lock(&self.sessions);
        let session = sessions.get(&id)?.clone();
        if session.expires <= Instant::now() {
            sessions.remove(&id);
            return None;
        }
        Some((id, session))
    }

    /// A state-changing request's checks: from the page's own origin, and (signed in)
    /// carrying the page's token.
    fn same_origin(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
        if origin != Some(self.origin.as_str()) {
            return Err(Refusal(
                StatusCode::FORBIDDEN,
                format!(
                    "refused: the request did not come from the review page ({}); open {} and try again",
                    origin.unwrap_or("no origin"),
                    self.origin
                ),
            ));
        }
        Ok(())
    }

    fn signed_in(&self, headers: &HeaderMap) -> Result<(String, Session), Refusal> {
        self.same_origin(headers)?;
        let Some((id, session)) = self.session(headers) else {
            return Err(Refusal(
                StatusCode::UNAUTHORIZED,
                "you are signed out; reload the page and sign in with your passkey".to_owned(),
            ));
        };
        let token = headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok());
        if token != Some(session.csrf.as_str()) {
            return Err(Refusal(
                StatusCode::FORBIDDEN,
                "refused: the request did not carry this page's token; reload the page and try again".to_owned(),
            ));
        }
        Ok((id, session))
    }

    /// One more ceremony, unless too many started this minute.
    fn ceremony_allowed(&self) -> Result<(), Refusal> {
        let mut window = lock(&self.ceremonies);
        if window.0.elapsed() >= Duration::from_secs(60) {
            *window = (Instant::now(), 0);
        }
        if window.1 >= CEREMONIES_PER_MINUTE {
            return Err(Refusal(
                StatusCode::TOO_MANY_REQUESTS,
                "too many sign-in and pairing attempts this minute; wait a minute and try again"
                    .to_owned(),
            ));
        }
        window.1 += 1;
        Ok(())
    }

    fn cookie_for(&self, id: &str) -> HeaderValue {
        let secure = if self.secure { "; Secure" } else { "" };
        HeaderValue::from_str(&format!(
            "{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}{secure}",
            SESSION_TTL.as_secs()
        ))
        .expect("a cookie is a header value")
    }

    /// Start a session for `device`, answering with its cookie.
    fn start_session(&self, device: &Device, text: String) -> HttpResponse {
        let id = random();
        let mut sessions = lock(&self.sessions);
        sessions.retain(|_, s| s.expires > Instant::now());
        sessions.insert(
            id.clone(),
            Session {
                device: device.name.clone(),
                owner: device.owner.clone(),
                csrf: random(),
                expires: Instant::now() + SESSION_TTL,
            },
        );
        drop(sessions);
        let mut response = said(StatusCode::OK, text);
        response
            .headers_mut()
            .insert(header::SET_COOKIE, self.cookie_for(&id));
        response
    }
}

/// The host of `origin` (`gate.example.org` of `https://gate.example.org:8790`).
pub fn host_of(origin: &str) -> String {
    origin
        .split_once("://")
        .map_or(origin, |(_, rest)| rest)
        .split([':', '/'])
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// The value of cookie `name` in the request's `Cookie` headers.
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.to_owned())
}

/// Answer the person's socket about devices: a pairing link, the list, a revocation.
pub fn devices_request(
    web: Option<&Web>,
    request: Request,
    person: Result<String, String>,
) -> Response {
    let Some(web) = web else {
        return Response {
            ok: false,
            text: "the review page is off; add [web] with listen = \"127.0.0.1:8790\" to the configuration and restart gate serve".to_owned(),
        };
    };
    let refuse = |text: String| Response { ok: false, text };
    match request {
        Request::Pair { name } => {
            let person = match person {
                Ok(person) => person,
                Err(why) => {
                    return refuse(format!(
                        "no link was made: the gate could not tell which user is asking ({why})"
                    ));
                }
            };
            if name.is_empty()
                || name.len() > 32
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            {
                return refuse(format!(
                    "{name:?} cannot name a device; use up to 32 letters, digits, '-', '_' or '.', for example --name phone"
                ));
            }
            if lock(&web.devices)
                .all()
                .iter()
                .any(|d| d.active() && d.name == name)
            {
                return refuse(format!(
                    "a device is already paired as {name:?}; choose another name, or revoke it first (`gate devices revoke {name}`)"
                ));
            }
            let token = random();
            let link = format!("{}/pair/{token}", web.origin);
            lock(&web.pairings).retain(|_, p| p.expires > Instant::now());
            lock(&web.pairings).insert(
                token,
                Pairing {
                    name: name.clone(),
                    owner: person.clone(),
                    expires: Instant::now() + PAIRING_TTL,
                    attempts: 0,
                    state: None,
                },
            );
            let check = match web.fingerprints() {
                Some(fingerprints) => format!(
                    "\nThe page's certificate: {fingerprints}. Check that the device shows the same before you go on (the pairing page shows it too, and so does the browser's certificate viewer)."
                ),
                None => String::new(),
            };
            Response {
                ok: true,
                text: format!(
                    "Open this link on the device to pair as {name:?} (it decides as {person}); it works once, for the next {} minutes:\n{link}\n{}\nThe page asks the device to create a passkey for gate; every decision made there is signed with it.{check}",
                    PAIRING_TTL.as_secs() / 60,
                    page::qr(&link)
                ),
            }
        }
        Request::Devices => {
            let devices = lock(&web.devices);
            if devices.all().is_empty() {
                return Response {
                    ok: true,
                    text: "no device is paired; `gate pair --name phone` prints a link to pair one"
                        .to_owned(),
                };
            }
            let lines: Vec<String> = devices
                .all()
                .iter()
                .map(|d| {
                    let state = match d.revoked_at {
                        Some(at) => format!("revoked {}", kernel::Timestamp(at)),
                        None => "active".to_owned(),
                    };
                    format!(
                        "{:<16} decides as {:<12} paired {}  {state}",
                        d.name,
                        d.owner,
                        kernel::Timestamp(d.paired_at)
                    )
                })
                .collect();
            Response {
                ok: true,
                text: lines.join("\n"),
            }
        }
        Request::DeviceRevoke { name } => {
            let now = web.now_ms();
            match lock(&web.devices).revoke(&name, now) {
                Ok(()) => {
                    lock(&web.sessions).retain(|_, s| s.device != name);
                    web.gateway.changed();
                    Response {
                        ok: true,
                        text: format!(
                            "device {name:?} revoked: its passkey signs nothing from now on, and its open pages are signed out"
                        ),
                    }
                }
                Err(text) => refuse(text),
            }
        }
        _ => refuse("not a request about devices".to_owned()),
    }
}

/// The page's routes.
pub fn router(web: Arc<Web>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/rows", get(rows))
        .route("/action/{id}", get(action))
        .route("/rules", get(rules))
        .route("/catalog", get(catalog))
        .route("/ledger", get(ledger))
        .route("/events", get(events))
        .route("/pair/{token}", get(pair_page))
        .route("/assets/gate.js", get(script))
        .route("/assets/gate.css", get(style))
        .route("/api/pair/start", post(pair_start))
        .route("/api/pair/finish", post(pair_finish))
        .route("/api/login/start", post(login_start))
        .route("/api/login/finish", post(login_finish))
        .route("/api/logout", post(logout))
        .route("/api/decide/start", post(decide_start))
        .route("/api/decide/finish", post(decide_finish))
        .layer(axum::middleware::from_fn_with_state(web.clone(), own_host))
        .layer(axum::middleware::map_response(secure_headers))
        .with_state(web)
}

/// Only requests for the page's own host and port are answered: a page of another site
/// whose name was made to resolve to this machine (DNS rebinding) is refused.
async fn own_host(
    State(web): State<Arc<Web>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> HttpResponse {
    let authority = web
        .origin
        .split_once("://")
        .map_or(web.origin.as_str(), |(_, rest)| rest);
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok());
    if host != Some(authority) {
        return said(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "this is the review page of {}; open it by that address",
                web.origin
            ),
        );
    }
    next.run(request).await
}

async fn secure_headers(mut response: HttpResponse) -> HttpResponse {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

async fn script() -> HttpResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        page::SCRIPT,
    )
        .into_response()
}

async fn style() -> HttpResponse {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        page::STYLE,
    )
        .into_response()
}

/// Who decides from the page, as the ledger records a web decision: the device's owner
/// and the device (`alice via passkey phone`).
fn decider(owner: &str, device: &str) -> String {
    format!("{owner} via passkey {device}")
}

/// The open work, rendered.
async fn open_rows(web: &Web) -> Result<String, String> {
    let response = crate::control::respond(Request::Queue, Ok(String::new()), &web.gateway).await;
    if !response.ok {
        return Err(response.text);
    }
    let queue: crate::queue::Queue =
        serde_json::from_str(&response.text).map_err(|e| e.to_string())?;
    // Each call's length as shown (redacted), and its digest: what a decision signs.
    let mut shown = HashMap::new();
    for row in &queue.rows {
        let id = LedgerId(row.id);
        if let (Some(args), Some(digest)) = (
            web.gateway.arguments_of(id).await,
            web.gateway.call_digest_of(id).await,
        ) {
            let redacted = web.gateway.redactor().json(&args).value;
            let length = serde_json::to_string(&redacted).map_or(0, |t| t.chars().count());
            shown.insert(row.id, (length, digest));
        }
    }
    Ok(page::rows(&queue, &shown))
}

async fn index(State(web): State<Arc<Web>>, headers: HeaderMap) -> HttpResponse {
    let Some((_, session)) = web.session(&headers) else {
        let paired = lock(&web.devices).all().iter().any(Device::active);
        return Html(page::login(paired)).into_response();
    };
    let body = open_rows(&web)
        .await
        .unwrap_or_else(|error| page::problem(&error));
    Html(page::frame(
        "Pending",
        &session.csrf,
        &decider(&session.owner, &session.device),
        &body,
    ))
    .into_response()
}

async fn rows(State(web): State<Arc<Web>>, headers: HeaderMap) -> HttpResponse {
    if web.session(&headers).is_none() {
        return said(StatusCode::UNAUTHORIZED, "signed out");
    }
    let rows = open_rows(&web)
        .await
        .unwrap_or_else(|error| page::problem(&error));
    Html(rows).into_response()
}

/// A text page of the person's socket's answer to `request`, signed in.
async fn text_page(
    web: &Web,
    headers: &HeaderMap,
    title: &str,
    request: Request,
    extra: impl FnOnce(&str) -> String,
) -> HttpResponse {
    let Some((_, session)) = web.session(headers) else {
        return (StatusCode::UNAUTHORIZED, Html(page::login(true))).into_response();
    };
    let response = crate::control::respond(request, Ok(session.owner.clone()), &web.gateway).await;
    let body = format!("{}{}", page::text(&response.text), extra(&response.text));
    Html(page::frame(
        title,
        &session.csrf,
        &decider(&session.owner, &session.device),
        &body,
    ))
    .into_response()
}

async fn action(
    State(web): State<Arc<Web>>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<u64>,
) -> HttpResponse {
    let open = web
        .gateway
        .overseer()
        .entry(LedgerId(id))
        .ok()
        .flatten()
        .and_then(|e| e.action().map(|a| a.state == ActionState::Pending))
        .unwrap_or(false);
    let digest = match open {
        true => web.gateway.call_digest_of(LedgerId(id)).await,
        false => None,
    };
    let request = Request::Show {
        ids: vec![id],
        full: true,
        reveal: false,
    };
    text_page(&web, &headers, &format!("#{id}"), request, |_| {
        digest
            .map(|digest| page::action_buttons(id, &digest))
            .unwrap_or_default()
    })
    .await
}

async fn rules(State(web): State<Arc<Web>>, headers: HeaderMap) -> HttpResponse {
    text_page(&web, &headers, "Rules", Request::Rules, |_| {
        page::revoke_form()
    })
    .await
}

async fn catalog(State(web): State<Arc<Web>>, headers: HeaderMap) -> HttpResponse {
    text_page(&web, &headers, "Catalog", Request::Catalog, |_| {
        String::new()
    })
    .await
}

/// The ledger page's filters.
#[derive(Debug, Default, Deserialize)]
struct LedgerFilter {
    agent: Option<String>,
    server: Option<String>,
    state: Option<String>,
    before: Option<u64>,
}

async fn ledger(
    State(web): State<Arc<Web>>,
    headers: HeaderMap,
    Query(filter): Query<LedgerFilter>,
) -> HttpResponse {
    if web.session(&headers).is_none() {
        return (StatusCode::UNAUTHORIZED, Html(page::login(true))).into_response();
    }
    let empty = |v: Option<String>| v.filter(|s| !s.is_empty());
    let query = crate::person::LedgerQuery {
        agent: empty(filter.agent),
        server: empty(filter.server),
        state: empty(filter.state),
        before: filter.before,
        limit: 50,
        ..Default::default()
    };
    let next = {
        let json = crate::control::respond(
            Request::Ledger {
                query: crate::person::LedgerQuery {
                    json: true,
                    ..query.clone()
                },
            },
            Ok(String::new()),
            &web.gateway,
        )
        .await;
        serde_json::from_str::<Value>(&json.text)
            .ok()
            .and_then(|v| v.get("next_before").and_then(Value::as_u64))
    };
    let form = page::ledger_form(&query, next);
    text_page(
        &web,
        &headers,
        "Ledger",
        Request::Ledger { query },
        move |_| form,
    )
    .await
}

/// Server-sent events: `changed` whenever the open work changes, for as long as the page's
/// session lives.
async fn events(State(web): State<Arc<Web>>, headers: HeaderMap) -> HttpResponse {
    let Some((session, _)) = web.session(&headers) else {
        return said(StatusCode::UNAUTHORIZED, "signed out");
    };
    let changes = web.gateway.changes();
    let first = open_fingerprint(&web);
    let stream = futures_util::stream::unfold(
        (web, changes, first, session),
        |(web, mut changes, mut last, session)| async move {
            loop {
                // A stage or a decision wakes it at once; expiries and drains within a second.
                let _ = tokio::time::timeout(Duration::from_secs(1), changes.changed()).await;
                // A page signed out (or its device revoked) hears nothing more.
                if !lock(&web.sessions).contains_key(&session) {
                    return None;
                }
                let now = open_fingerprint(&web);
                if now != last {
                    last = now;
                    let event = Event::default().event("changed").data("open work changed");
                    let state = (web, changes, last, session);
                    return Some((Ok::<_, std::convert::Infallible>(event), state));
                }
            }
        },
    );
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// The open actions' ids and states: what the open pages show.
fn open_fingerprint(web: &Web) -> Vec<(u64, ActionState)> {
    web.gateway
        .overseer()
        .open_actions()
        .unwrap_or_default()
        .iter()
        .filter_map(|e| e.action().map(|a| (e.id.0, a.state)))
        .collect()
}

async fn pair_page(State(web): State<Arc<Web>>, UrlPath(token): UrlPath<String>) -> HttpResponse {
    let name = lock(&web.pairings)
        .get(&token)
        .filter(|p| p.expires > Instant::now())
        .map(|p| p.name.clone());
    match name {
        Some(name) => Html(page::pair(&name, web.fingerprints().as_deref())).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            Html(page::error(
                "this pairing link is not valid: it was used, it expired, or it was never made; run `gate pair --name NAME` again in a terminal of the gate's machine",
            )),
        )
            .into_response(),
    }
}

#[derive(Debug, Deserialize)]
struct PairStart {
    token: String,
}

async fn pair_start(
    State(web): State<Arc<Web>>,
    headers: HeaderMap,
    Json(body): Json<PairStart>,
) -> HttpResponse {
    if let Err(refused) = web
        .same_origin(&headers)
        .and_then(|()| web.ceremony_allowed())
    {
        return refused.into_response();
    }
    let exclude: Vec<_> = lock(&web.devices)
        .all()
        .iter()
        .map(|d| d.passkey.cred_id().clone())
        .collect();
    let mut pairings = lock(&web.pairings);
    let Some(pairing) = pairings
        .get_mut(&body.token)
        .filter(|p| p.expires > Instant::now())
    else {
        return said(
            StatusCode::NOT_FOUND,
            "this pairing link is not valid any more; run `gate pair --name NAME` again",
        );
    };
    pairing.attempts += 1;
    if pairing.attempts > PAIRING_ATTEMPTS {
        pairings.remove(&body.token);
        return said(
            StatusCode::TOO_MANY_REQUESTS,
            "this pairing link was tried too often and no longer works; run `gate pair --name NAME` again",
        );
    }
    let user = format!("{}@gate", pairing.owner);
    match web.webauthn.start_passkey_registration(
        Uuid::new_v4(),
        &user,
        &format!("{} ({})", pairing.owner, pairing.name),
        Some(exclude),
    ) {
        Ok((options, state)) => {
            pairing.state = Some(state);
            Json(json!({"ok": true, "options": options})).into_response()
        }
        Err(error) => said(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("could not start pairing: {error}"),
        ),
    }
}

#[derive(Debug, Deserialize)]
struct PairFinish {
    token: String,
    credential: RegisterPublicKeyCredential,
}

async fn pair_finish(
    State(web): State<Arc<Web>>,
    headers: HeaderMap,
    Json(body): Json<PairFinish>,
) -> HttpResponse {
    if let Err(refused) = web.same_origin(&headers) {
        return refused.into_response();
    }
    let Some(pairing) = lock(&web.pairings)
        .remove(&body.token)
        .filter(|p| p.expires > Instant::now())
    else {
        return said(
            StatusCode::NOT_FOUND,
            "this pairing link is not valid any more; run `gate pair --name NAME` again",
        );
    };
    let Some(state) = &pairing.state else {
        return said(
            StatusCode::BAD_REQUEST,
            "the pairing was not started on this page; reload it and try again",
        );
    };
    let passkey = match web
        .webauthn
        .finish_passkey_registration(&body.credential, state)
    {
        Ok(passkey) => passkey,
        Err(error) => {
            return said(
                StatusCode::BAD_REQUEST,
                format!(
                    "the device's passkey was not accepted ({error}); run `gate pair --name NAME` again"
                ),
            );
        }
    };
    let device = Device {
        name: pairing.name.clone(),
        owner: pairing.owner.clone(),
        passkey,
        paired_at: web.now_ms(),
        revoked_at: None,
        counter: 0,
    };
    if let Err(error) = lock(&web.devices).add(device.clone()) {
        return said(StatusCode::CONFLICT, error);
    }
    tracing::info!(device = %device.name, owner = %device.owner, "web.paired");
    web.start_session(
        &device,
        format!(
            "paired as {:?}: this device now decides as {}",
            device.name, device.owner
        ),
    )
}

async fn login_start(State(web): State<Arc<Web>>, headers: HeaderMap) -> HttpResponse {
    if let Err(refused) = web
        .same_origin(&headers)
        .and_then(|()| web.ceremony_allowed())
    {
        return refused.into_response();
    }
    let passkeys = lock(&web.devices).active_passkeys();
    if passkeys.is_empty() {
        return said(
            StatusCode::NOT_FOUND,
            "no device is paired; run `gate pair --name phone` in a terminal of the gate's machine and open the link it prints",
        );
    }
    match web.webauthn.start_passkey_authentication(&passkeys) {
        Ok((options, state)) => {
            let id = random();
            let mut logins = lock(&web.logins);
            logins.retain(|_, (_, at)| at.elapsed() < CEREMONY_TTL);
            logins.insert(id.clone(), (state, Instant::now()));
            Json(json!({"ok": true, "id": id, "options": options})).into_response()
        }
        Err(error) => said(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("could not start signing in: {error}"),
        ),
    }
}

#[derive(Debug, Deserialize)]
struct LoginFinish {
    id: String,
    credential: PublicKeyCredential,
}

async fn login_finish(
    State(web): State<Arc<Web>>,
    headers: HeaderMap,
    Json(body): Json<LoginFinish>,
) -> HttpResponse {
    if let Err(refused) = web.same_origin(&headers) {
        return refused.into_response();
    }
    let Some((state, _)) = lock(&web.logins)
        .remove(&body.id)
        .filter(|(_, at)| at.elapsed() < CEREMONY_TTL)
    else {
        return said(
            StatusCode::BAD_REQUEST,
            "this sign-in was not started here or took too long; try again",
        );
    };
    let result = match web
        .webauthn
        .finish_passkey_authentication(&body.credential, &state)
    {
        Ok(result) => result,
        Err(error) => {
            return said(
                StatusCode::UNAUTHORIZED,
                format!("the passkey did not sign in ({error}); try again"),
            );
        }
    };
    let device = match web.signer(&result) {
        Ok(device) => device,
        Err(error) => return said(StatusCode::UNAUTHORIZED, error),
    };
    web.start_session(
        &device,
        format!("signed in as {}", decider(&device.owner, &device.name)),
    )
}

async fn logout(State(web): State<Arc<Web>>, headers: HeaderMap) -> HttpResponse {
    match web.signed_in(&headers) {
        Ok((id, _)) => {
            lock(&web.sessions).remove(&id);
            let mut response = said(StatusCode::OK, "signed out");
            response.headers_mut().insert(
                header::SET_COOKIE,
                HeaderValue::from_static(
                    "gate_session=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0",
                ),
            );
            response
        }
        Err(refused) => refused.into_response(),
    }
}

/// What the page asks to sign.
#[derive(Debug, Deserialize)]
struct DecideStart {
    decision: String,
    #[serde(default)]
    ids: Vec<u64>,
    /// Each call's digest as the page showed it, in the order of `ids`.
    #[serde(default)]
    digests: Vec<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    full_seen: bool,
}

/// The decisions the page may ask for.
const DECISIONS: [&str; 4] = ["approve", "approve-all-of-kind", "reject", "revoke-rule"];

async fn decide_start(
    State(web): State<Arc<Web>>,
    headers: HeaderMap,
    Json(body): Json<DecideStart>,
) -> HttpResponse {
    let (session_id, _) = match web.signed_in(&headers) {
        Ok(session) => session,
        Err(refused) => return refused.into_response(),
    };
    if !DECISIONS.contains(&body.decision.as_str()) {
        return said(
            StatusCode::BAD_REQUEST,
            format!(
                "there is no decision {:?}; the page knows {}",
                body.decision,
                DECISIONS.join(", ")
            ),
        );
    }
    let reason = body
        .reason
        .map(|r| r.trim().to_owned())
        .filter(|r| !r.is_empty());
    if body.decision == "revoke-rule" {
        if reason.is_none() || !body.ids.is_empty() {
            return said(
                StatusCode::BAD_REQUEST,
                "name the rule to revoke, as the rules page lists it",
            );
        }
    } else if body.ids.is_empty() || body.ids.len() > 500 {
        return said(
            StatusCode::BAD_REQUEST,
            "choose from 1 to 500 actions to decide",
        );
    } else if body.digests.len() != body.ids.len() {
        return said(
            StatusCode::BAD_REQUEST,
            "nothing was decided: the page did not say which version of each call it showed; reload it and try again",
        );
    }
    // A page that shows work decided elsewhere is told what happened instead.
    let mut digests = Vec::with_capacity(body.ids.len());
    let mut decided = Vec::new();
    for (&id, shown) in body.ids.iter().zip(&body.digests) {
        match web.gateway.outcome(LedgerId(id)).await {
            Some(outcome) => decided.push(format!("#{id} was already decided.{outcome}")),
            None => match web.gateway.call_digest_of(LedgerId(id)).await {
                // What is signed is what the page showed, and only while it is still so.
                Some(digest) if digest == *shown => digests.push(digest),
                Some(_) => decided.push(format!(
                    "#{id} changed since the page showed it (its tool's definition or its arguments); reload the page and look at it again"
                )),
                None => decided.push(format!("#{id} is not an open action of this gate")),
            },
        }
    }
    if !decided.is_empty() {
        web.gateway.changed();
        return said(
            StatusCode::CONFLICT,
            format!("Nothing was decided.\n{}", decided.join("\n")),
        );
    }
    let statement = Statement {
        decision: body.decision,
        ids: body.ids,
        digests,
        reason,
        full_seen: body.full_seen,
        nonce: random(),
        origin: web.origin.clone(),
        issued_at: web.now_ms(),
    };
    let passkeys = lock(&web.devices).active_passkeys();
    let (options, state) =
        match passkeys::bound_assertion(&web.webauthn, &passkeys, &statement.challenge()) {
            Ok(started) => started,
            Err(error) => return said(StatusCode::INTERNAL_SERVER_ERROR, error),
        };
    let nonce = statement.nonce.clone();
    let mut asked = lock(&web.asked);
    asked.retain(|_, a| a.expires > Instant::now());
    asked.insert(
        nonce.clone(),
        Asked {
            session: session_id,
            statement: statement.clone(),
            state,
            expires: Instant::now() + CEREMONY_TTL,
        },
    );
    Json(json!({"ok": true, "nonce": nonce, "options": options, "statement": statement}))
        .into_response()
}

#[derive(Debug, Deserialize)]
struct DecideFinish {
    nonce: String,
    credential: PublicKeyCredential,
}

async fn decide_finish(
    State(web): State<Arc<Web>>,
    headers: HeaderMap,
    Json(body): Json<DecideFinish>,
) -> HttpResponse {
    let (session_id, session) = match web.signed_in(&headers) {
        Ok(session) => session,
        Err(refused) => return refused.into_response(),
    };
    // Each statement is signed once: taken here, so a replayed assertion finds nothing.
    let Some(asked) = lock(&web.asked)
        .remove(&body.nonce)
        .filter(|a| a.expires > Instant::now() && a.session == session_id)
    else {
        return said(
            StatusCode::BAD_REQUEST,
            "nothing was decided: this decision was not asked for on this page, was already signed, or took too long; try again",
        );
    };
    let result = match web
        .webauthn
        .finish_passkey_authentication(&body.credential, &asked.state)
    {
        Ok(result) => result,
        Err(error) => {
            return said(
                StatusCode::UNAUTHORIZED,
                format!("nothing was decided: the passkey's signature was not accepted ({error})"),
            );
        }
    };
    let device = match web.signer(&result) {
        Ok(device) => device,
        Err(error) => {
            return said(
                StatusCode::UNAUTHORIZED,
                format!("nothing was decided: {error}"),
            );
        }
    };
    if device.name != session.device {
        return said(
            StatusCode::UNAUTHORIZED,
            "nothing was decided: sign with the passkey of the device this page is signed in as",
        );
    }
    let statement = asked.statement;
    // What is decided is what was shown: a call that changed since is refused.
    for (id, shown) in statement.ids.iter().zip(&statement.digests) {
        let now = web.gateway.call_digest_of(LedgerId(*id)).await;
        if now.as_deref() != Some(shown.as_str()) {
            return said(
                StatusCode::CONFLICT,
                format!(
                    "nothing was decided: #{id} changed since the page showed it (its tool's definition or its arguments); reload the page and look again"
                ),
            );
        }
    }
    let signed = Signed {
        statement: statement.clone(),
        device: device.name.clone(),
        rp_id: web.rp_id.clone(),
        assertion: body.credential,
    };
    if let Err(error) = passkeys::append(&web.data_dir, &signed) {
        return said(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("nothing was decided: {error}"),
        );
    }
    let request = match statement.decision.as_str() {
        "reject" => Request::Reject {
            ids: statement.ids,
            reason: statement.reason,
            cascade: false,
        },
        "revoke-rule" => Request::RuleRemove {
            name: statement
                .reason
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_owned)
                .collect(),
        },
        decision => Request::Approve {
            ids: statement.ids,
            all_of_kind: decision == "approve-all-of-kind",
            full_seen: statement.full_seen,
            stale_seen: false,
            scope: Default::default(),
            edited: None,
        },
    };
    let response = crate::control::respond(
        request,
        Ok(decider(&session.owner, &session.device)),
        &web.gateway,
    )
    .await;
    tracing::info!(device = %device.name, ok = response.ok, "web.decided");
    let status = if response.ok {
        StatusCode::OK
    } else {
        StatusCode::CONFLICT
    };
    said(status, response.text)
}

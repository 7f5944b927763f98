//! OAuth 2.1 to a remote MCP server, end to end: the person's `gate login` against an
//! authorization server (discovery from the server's 401, dynamic registration, PKCE,
//! the loopback redirect), the tokens kept in the data directory and never in the
//! configuration, the daemon's access token refreshed before it expires and once more when
//! the server refuses it, an approved write that cannot get a token kept waiting (nothing
//! sent, the person told to log in again), and a server that asks for more scope than was
//! granted (step-up: refused, remembered, asked for at the next login).
//!
//! The test process is the remote side: one HTTPS server on loopback (a certificate made
//! for `localhost`) that is both a small authorization server and the OAuth-protected MCP
//! server, whose state the test reads and changes (token lifetime, expiry, revocation).

#[path = "support/daemon.rs"]
mod daemon;
#[path = "support/fixture.rs"]
mod fixture;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse as _, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, ServerHandler};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncBufReadExt as _;

use daemon::{CODER_TOKEN, PATIENCE, action_id, call, connect, eventually, text, write_with_mode};
use fixture::free_port;

/// The scopes the MCP server names in its protected resource metadata (what a first login
/// asks for); `notes:admin` is one more the authorization server grants when asked.
const RESOURCE_SCOPES: [&str; 2] = ["notes:read", "notes:write"];
const ADMIN_SCOPE: &str = "notes:admin";

/// What the remote side has seen and holds, for the test to read and change.
#[derive(Default)]
struct Remote {
    /// The lifetime of the access tokens it issues from now on, in seconds.
    lifetime: u64,
    /// Clients registered dynamically, by client id: their redirect URIs.
    clients: HashMap<String, Vec<String>>,
    /// Every authorization request the browser brought, in order.
    authorizations: Vec<Authorization>,
    /// Codes not yet exchanged.
    codes: HashMap<String, Code>,
    /// Live access tokens: their scopes and when they stop being accepted.
    access: HashMap<String, Access>,
    /// Live refresh tokens: their client and scopes.
    refresh: HashMap<String, (String, Vec<String>)>,
    /// Every access token ever issued (to look for them where they must not be).
    issued: Vec<String>,
    /// The form of every refresh request, in order.
    refreshes: Vec<HashMap<String, String>>,
    /// Requests to the MCP server refused because the token they carried was not valid
    /// (expired, revoked, unknown); requests carrying no token are not counted.
    stale_tokens: usize,
    /// Calls refused with 403 for want of scope.
    short_of_scope: usize,
    /// Every `tools/call` that reached the MCP server's handler: `tool {arguments}`.
    calls: Vec<String>,
    /// The notes written.
    notes: Vec<String>,
    /// Next number for a client, code or token.
    next: usize,
}

struct Authorization {
    client_id: String,
    scopes: Vec<String>,
    resource: String,
}

struct Code {
    client_id: String,
    redirect_uri: String,
    challenge: String,
    scopes: Vec<String>,
}

struct Access {
    scopes: Vec<String>,
    until: Instant,
}

impl Remote {
    fn number(&mut self) -> usize {
        self.next += 1;
        self.next
    }

    /// A new access token (and refresh token) for `client_id` with `scopes`, as the token
    /// endpoint's answer.
    fn issue(&mut self, client_id: &str, scopes: &[String]) -> Value {
        let n = self.number();
        let access = format!("oauth-test-access-{n:04}-{}", std::process::id());
        let refresh = format!("oauth-test-refresh-{n:04}-{}", std::process::id());
        self.access.insert(
            access.clone(),
            Access {
                scopes: scopes.to_vec(),
                until: Instant::now() + Duration::from_secs(self.lifetime),
            },
        );
        self.refresh
            .insert(refresh.clone(), (client_id.to_owned(), scopes.to_vec()));
        self.issued.push(access.clone());
        json!({
            "access_token": access,
            "token_type": "Bearer",
            "expires_in": self.lifetime,
            "refresh_token": refresh,
            "scope": scopes.join(" "),
        })
    }

    /// The scopes of `token` if it is a live access token.
    fn scopes_of(&self, token: &str) -> Option<Vec<String>> {
        self.access
            .get(token)
            .filter(|a| a.until > Instant::now())
            .map(|a| a.scopes.clone())
    }
}

/// The remote side: an authorization server and the MCP server it protects, over HTTPS
/// at `https://localhost:PORT`.
struct Provider {
    base: String,
    certificate: PathBuf,
    remote: Arc<Mutex<Remote>>,
    _stop: tokio::sync::watch::Sender<bool>,
}

impl Provider {
    /// Start it on a loopback port, with a certificate for `localhost` made in `dir`.
    async fn start(dir: &Path) -> Self {
        let tls = gate::tls::load(&gate::config::ListenerTls::SelfSigned, "localhost", dir)
            .expect("a certificate for localhost");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let port = listener.local_addr().expect("bound").port();
        let base = format!("https://localhost:{port}");
        let remote = Arc::new(Mutex::new(Remote {
            lifetime: 3600,
            ..Remote::default()
        }));
        let shared = Arc::new(Shared {
            base: base.clone(),
            remote: remote.clone(),
        });
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let router = router(shared);
        tokio::spawn(async move {
            gate::http::serve(
                listener,
                router,
                &gate::http::HttpLimits::default(),
                stopped,
                Some(tls.acceptor),
            )
            .await;
        });
        Self {
            base,
            certificate: gate::tls::certificate_file("localhost", dir),
            remote,
            _stop: stop,
        }
    }

    fn mcp_url(&self) -> String {
        format!("{}/mcp", self.base)
    }

    fn remote(&self) -> MutexGuard<'_, Remote> {
        self.remote.lock().expect("the remote's state")
    }

    /// The calls that reached the MCP server, one line each.
    fn calls(&self) -> Vec<String> {
        self.remote().calls.clone()
    }

    fn received(&self, call: &str) -> bool {
        self.calls().iter().any(|c| c == call)
    }

    /// What the remote side saw, for a failing assertion's message.
    fn seen(&self) -> String {
        let remote = self.remote();
        format!(
            "calls {:?}; {} refreshes; {} requests with a stale token; {} short of scope; authorizations asked for {:?}",
            remote.calls,
            remote.refreshes.len(),
            remote.stale_tokens,
            remote.short_of_scope,
            remote
                .authorizations
                .iter()
                .map(|a| a.scopes.join(" "))
                .collect::<Vec<_>>()
        )
    }
}

/// What the remote side's handlers share.
struct Shared {
    base: String,
    remote: Arc<Mutex<Remote>>,
}

impl Shared {
    fn remote(&self) -> MutexGuard<'_, Remote> {
        self.remote.lock().expect("the remote's state")
    }

    fn resource(&self) -> String {
        format!("{}/mcp", self.base)
    }

    fn resource_metadata(&self) -> String {
        format!("{}/.well-known/oauth-protected-resource/mcp", self.base)
    }
}

fn router(shared: Arc<Shared>) -> Router {
    let mcp = StreamableHttpService::new(
        {
            let remote = shared.remote.clone();
            move || Ok(Notes(remote.clone()))
        },
        Arc::new(NeverSessionManager::default()),
        StreamableHttpServerConfig::default()
            .with_legacy_session_mode(false)
            .with_json_response(true),
    );
    let protected = Router::new()
        .nest_service("/mcp", mcp)
        .layer(middleware::from_fn_with_state(shared.clone(), bearer_only));
    Router::new()
        .route(
            "/.well-known/oauth-protected-resource/mcp",
            get(resource_metadata),
        )
        .route(
            "/.well-known/oauth-authorization-server",
            get(authorization_server_metadata),
        )
        .route("/register", post(register))
        .route("/authorize", get(authorize))
        .route("/token", post(token))
        .with_state(shared)
        .merge(protected)
}

async fn resource_metadata(State(shared): State<Arc<Shared>>) -> Response {
    axum::Json(json!({
        "resource": shared.resource(),
        "authorization_servers": [shared.base],
        "scopes_supported": RESOURCE_SCOPES,
        "bearer_methods_supported": ["header"],
    }))
    .into_response()
}

async fn authorization_server_metadata(State(shared): State<Arc<Shared>>) -> Response {
    let base = &shared.base;
    axum::Json(json!({
        "issuer": base,
        "authorization_endpoint": format!("{base}/authorize"),
        "token_endpoint": format!("{base}/token"),
        "registration_endpoint": format!("{base}/register"),
        "response_types_supported": ["code"],
        "grant_types_supported": ["authorization_code", "refresh_token"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ["none"],
        "scopes_supported": [RESOURCE_SCOPES[0], RESOURCE_SCOPES[1], ADMIN_SCOPE],
        "authorization_response_iss_parameter_supported": true,
    }))
    .into_response()
}

fn oauth_error(status: StatusCode, error: &str, description: &str) -> Response {
    (
        status,
        axum::Json(json!({"error": error, "error_description": description})),
    )
        .into_response()
}

/// Whether `uri` is a loopback redirect (`http://127.0.0.1:*` or `http://localhost:*`).
fn loopback_redirect(uri: &str) -> bool {
    reqwest::Url::parse(uri).is_ok_and(|url| {
        url.scheme() == "http"
            && matches!(url.host_str(), Some("127.0.0.1" | "localhost"))
            && url.port().is_some()
    })
}

async fn register(State(shared): State<Arc<Shared>>, body: String) -> Response {
    let Ok(request) = serde_json::from_str::<Value>(&body) else {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_client_metadata",
            "not JSON",
        );
    };
    let redirect_uris: Vec<String> = request["redirect_uris"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    if redirect_uris.is_empty() || !redirect_uris.iter().all(|u| loopback_redirect(u)) {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_redirect_uri",
            "only loopback redirects are taken",
        );
    }
    let mut remote = shared.remote();
    let client_id = format!("gate-client-{}", remote.number());
    remote
        .clients
        .insert(client_id.clone(), redirect_uris.clone());
    (
        StatusCode::CREATED,
        axum::Json(json!({
            "client_id": client_id,
            "client_name": request["client_name"],
            "redirect_uris": redirect_uris,
            "token_endpoint_auth_method": "none",
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
        })),
    )
        .into_response()
}

/// The authorization page, approving at once: back to the client's redirect URI with a
/// code (and this server's issuer).
async fn authorize(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let field = |name: &str| query.get(name).cloned().unwrap_or_default();
    let (client_id, redirect_uri) = (field("client_id"), field("redirect_uri"));
    let mut remote = shared.remote();
    let registered = remote
        .clients
        .get(&client_id)
        .is_some_and(|uris| uris.contains(&redirect_uri));
    if !registered || !loopback_redirect(&redirect_uri) {
        return (
            StatusCode::BAD_REQUEST,
            format!("unknown client {client_id:?} or redirect {redirect_uri:?}"),
        )
            .into_response();
    }
    if field("response_type") != "code"
        || field("code_challenge_method") != "S256"
        || field("code_challenge").is_empty()
    {
        return (StatusCode::BAD_REQUEST, "PKCE S256 and a code are required").into_response();
    }
    let supported = [RESOURCE_SCOPES[0], RESOURCE_SCOPES[1], ADMIN_SCOPE];
    let scopes: Vec<String> = field("scope")
        .split_whitespace()
        .filter(|s| supported.contains(s))
        .map(str::to_owned)
        .collect();
    remote.authorizations.push(Authorization {
        client_id: client_id.clone(),
        scopes: scopes.clone(),
        resource: field("resource"),
    });
    let code = format!("code-{}", remote.number());
    remote.codes.insert(
        code.clone(),
        Code {
            client_id,
            redirect_uri: redirect_uri.clone(),
            challenge: field("code_challenge"),
            scopes,
        },
    );
    let mut back = reqwest::Url::parse(&redirect_uri).expect("checked above");
    back.query_pairs_mut()
        .append_pair("code", &code)
        .append_pair("state", &field("state"))
        .append_pair("iss", &shared.base);
    (StatusCode::FOUND, [(header::LOCATION, back.to_string())]).into_response()
}

/// A form body's fields.
fn form(body: &str) -> HashMap<String, String> {
    reqwest::Url::parse(&format!("http://form.invalid/?{body}"))
        .map(|url| url.query_pairs().into_owned().collect())
        .unwrap_or_default()
}

/// The client a token request is from: `client_id` in the body, else HTTP Basic.
fn client_of(headers: &HeaderMap, fields: &HashMap<String, String>) -> String {
    if let Some(id) = fields.get("client_id") {
        return id.clone();
    }
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|pair| pair.split(':').next().map(str::to_owned))
        .unwrap_or_default()
}

async fn token(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: String) -> Response {
    let fields = form(&body);
    let field = |name: &str| fields.get(name).cloned().unwrap_or_default();
    let client_id = client_of(&headers, &fields);
    let mut remote = shared.remote();
    match field("grant_type").as_str() {
        "authorization_code" => {
            let Some(code) = remote.codes.remove(&field("code")) else {
                return oauth_error(StatusCode::BAD_REQUEST, "invalid_grant", "unknown code");
            };
            let verifier = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .encode(Sha256::digest(field("code_verifier").as_bytes()));
            if verifier != code.challenge {
                return oauth_error(StatusCode::BAD_REQUEST, "invalid_grant", "PKCE failed");
            }
            if code.client_id != client_id || code.redirect_uri != field("redirect_uri") {
                return oauth_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_grant",
                    "another client or redirect",
                );
            }
            if field("resource") != shared.resource() {
                return oauth_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_target",
                    "tokens are for the MCP server only",
                );
            }
            axum::Json(remote.issue(&client_id, &code.scopes)).into_response()
        }
        "refresh_token" => {
            remote.refreshes.push(fields.clone());
            let Some((owner, scopes)) = remote.refresh.remove(&field("refresh_token")) else {
                return oauth_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_grant",
                    "the refresh token is not valid",
                );
            };
            if owner != client_id {
                return oauth_error(StatusCode::BAD_REQUEST, "invalid_grant", "another client");
            }
            // Rotated: the old refresh token is spent, the answer carries a new one.
            axum::Json(remote.issue(&client_id, &scopes)).into_response()
        }
        other => oauth_error(
            StatusCode::BAD_REQUEST,
            "unsupported_grant_type",
            &format!("{other:?}"),
        ),
    }
}

/// The MCP server's door: a live bearer token, and `notes:admin` for `admin_note`.
async fn bearer_only(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    let scopes = presented
        .as_deref()
        .and_then(|token| shared.remote().scopes_of(token));
    let Some(scopes) = scopes else {
        if presented.is_some() {
            shared.remote().stale_tokens += 1;
        }
        let challenge = format!(
            "Bearer resource_metadata=\"{}\"",
            shared.resource_metadata()
        );
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, challenge)],
        )
            .into_response();
    };
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 1 << 20).await else {
        return StatusCode::PAYLOAD_TOO_LARGE.into_response();
    };
    let message: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if message["method"] == "tools/call"
        && message["params"]["name"] == "admin_note"
        && !scopes.iter().any(|s| s == ADMIN_SCOPE)
    {
        shared.remote().short_of_scope += 1;
        let challenge = format!(
            "Bearer error=\"insufficient_scope\", scope=\"{} {} {ADMIN_SCOPE}\", resource_metadata=\"{}\", error_description=\"admin_note needs {ADMIN_SCOPE}\"",
            RESOURCE_SCOPES[0],
            RESOURCE_SCOPES[1],
            shared.resource_metadata()
        );
        return (
            StatusCode::FORBIDDEN,
            [(header::WWW_AUTHENTICATE, challenge)],
        )
            .into_response();
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// The MCP server behind the door: notes to read, write, and pin (an administrator's
/// write). Every call it receives is recorded.
#[derive(Clone)]
struct Notes(Arc<Mutex<Remote>>);

impl ServerHandler for Notes {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = json!([
            {
                "name": "read_note",
                "description": "Read the notes.",
                "inputSchema": {"type": "object", "properties": {}},
                "annotations": {"readOnlyHint": true}
            },
            {
                "name": "write_note",
                "description": "Write a note.",
                "inputSchema": {
                    "type": "object",
                    "properties": {"text": {"type": "string"}},
                    "required": ["text"]
                },
                "annotations": {"readOnlyHint": false, "destructiveHint": true}
            },
            {
                "name": "admin_note",
                "description": "Pin the notes for everyone.",
                "inputSchema": {"type": "object", "properties": {}},
                "annotations": {"readOnlyHint": false}
            }
        ]);
        let tools: Vec<Tool> = serde_json::from_value(tools)
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = Value::Object(request.arguments.clone().unwrap_or_default());
        let mut remote = self.0.lock().expect("the remote's state");
        remote.calls.push(format!("{} {args}", request.name));
        let answer = match request.name.as_ref() {
            "read_note" => format!("the notes: [{}]", remote.notes.join(", ")),
            "write_note" => {
                let note = args["text"].as_str().unwrap_or("").to_owned();
                remote.notes.push(note.clone());
                format!("wrote {note:?}")
            }
            "admin_note" => format!("pinned {} notes", remote.notes.len()),
            other => {
                return Err(ErrorData::invalid_params(
                    format!("no tool {other:?}"),
                    None,
                ));
            }
        };
        Ok(CallToolResult::success(vec![ContentBlock::text(answer)]).into())
    }
}

/// The person's side: the configuration, the data directory, the daemon and its log,
/// the person's browser and `gate` commands.
struct Person {
    dir: PathBuf,
    config: PathBuf,
    data: PathBuf,
    serve_log: PathBuf,
    told: PathBuf,
    browser: reqwest::Client,
    serve: Option<Child>,
}

impl Drop for Person {
    fn drop(&mut self) {
        if let Some(child) = self.serve.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Person {
    /// A configuration with the provider's MCP server as `notes` (OAuth, its certificate
    /// trusted through `ca_file`, `admin_note` called a read), one agent granted it, and a
    /// notifier that writes what it is told to a file.
    fn new(dir: &Path, provider: &Provider) -> Self {
        let told = dir.join("told.txt");
        let config = dir.join("gate.toml");
        let notify = format!(
            "echo \"$GATE_EVENT $GATE_SERVER: $0\" >> '{}'",
            told.display()
        );
        write_with_mode(
            &config,
            &format!(
                r#"listen = "127.0.0.1:{port}"

[[server]]
name = "notes"
url = "{url}"
ca_file = {ca:?}
reads = ["admin_note"]

[server.oauth]

[[agent]]
name = "coder"
token = "{CODER_TOKEN}"

[[agent.grant]]
server = "notes"

[notify]
command = "/bin/sh"
args = ["-c", {notify:?}]
"#,
                port = free_port(),
                url = provider.mcp_url(),
                ca = provider.certificate.display().to_string(),
            ),
            0o600,
        );
        let browser = gatekeeper_mcp::tls::builder(Some(&provider.certificate))
            .expect("a client trusting the provider's certificate")
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("the browser");
        Self {
            dir: dir.to_owned(),
            config,
            data: dir.join("data"),
            serve_log: dir.join("serve.log"),
            told,
            browser,
            serve: None,
        }
    }

    /// `gate ARGS` as the person, with `--config` where the command takes one.
    async fn gate(&self, args: &[&str]) -> Output {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_gate"));
        command.args(args).arg("--data-dir").arg(&self.data);
        if matches!(args.first(), Some(&("check" | "login"))) {
            command.arg("--config").arg(&self.config);
        }
        command
            .env("RUST_LOG", "warn")
            .output()
            .await
            .expect("gate runs")
    }

    /// `gate check`'s report.
    async fn check(&self) -> String {
        let out = self.gate(&["check"]).await;
        assert!(out.status.success(), "gate check failed: {}", said(&out));
        said(&out)
    }

    /// `gate show ID`.
    async fn show(&self, id: u64) -> String {
        said(&self.gate(&["show", &id.to_string()]).await)
    }

    /// `gate approve ID`: what it said.
    async fn approve(&self, id: u64) -> String {
        said(&self.gate(&["approve", &id.to_string()]).await)
    }

    /// `gate login notes --no-browser`, the person playing the browser: open the address
    /// it prints (the authorization server approves at once) and follow the redirect back
    /// to the gate's loopback port. Returns what the login printed; it must succeed.
    async fn login(&self) -> String {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_gate"))
            .args(["login", "notes", "--no-browser", "--wait-seconds", "60"])
            .arg("--config")
            .arg(&self.config)
            .arg("--data-dir")
            .arg(&self.data)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("gate login starts");
        let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("piped")).lines();
        let mut printed = String::new();
        let address = loop {
            let line = tokio::time::timeout(PATIENCE, lines.next_line())
                .await
                .unwrap_or_else(|_| panic!("gate login printed no address: {printed}"))
                .expect("its output");
            let Some(line) = line else {
                let out = child.wait_with_output().await.expect("gate login ends");
                panic!(
                    "gate login ended without an address: {printed}{}",
                    said(&out)
                );
            };
            printed.push_str(&line);
            printed.push('\n');
            if let Some(address) = line.strip_prefix("  ") {
                break address.to_owned();
            }
        };
        assert!(
            printed.starts_with(
                "Open this address to let the gate reach notes (waiting up to 60 s):\n"
            ),
            "{printed}"
        );
        let page = self
            .browser
            .get(&address)
            .send()
            .await
            .unwrap_or_else(|e| panic!("the authorization page {address}: {e}"));
        assert_eq!(page.status(), StatusCode::FOUND, "{address}: {page:?}");
        let back = page
            .headers()
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .expect("a redirect")
            .to_owned();
        assert!(back.starts_with("http://127.0.0.1:"), "{back}");
        let landed = self
            .browser
            .get(&back)
            .send()
            .await
            .unwrap_or_else(|e| panic!("the gate's redirect {back}: {e}"));
        assert!(landed.status().is_success(), "{back}: {landed:?}");
        let page = landed.text().await.unwrap_or_default();
        assert!(page.contains("gate is logged in to notes"), "{page}");
        while let Some(line) = lines.next_line().await.expect("its output") {
            printed.push_str(&line);
            printed.push('\n');
        }
        let out = tokio::time::timeout(PATIENCE, child.wait_with_output())
            .await
            .expect("gate login ends after the redirect")
            .expect("gate login ends");
        assert!(
            out.status.success(),
            "gate login failed: {printed}{}",
            said(&out)
        );
        printed
    }

    /// Start `gate serve`, logging to `serve_log`; the agents' URL.
    fn serve(&mut self) -> String {
        let log = std::fs::File::create(&self.serve_log).expect("the daemon's log");
        let mut command = daemon::serve_command(&self.config, &self.data);
        command.env("RUST_LOG", "info").stderr(Stdio::from(log));
        let (child, url) = daemon::spawn_serve_command(command);
        self.serve = Some(child);
        url
    }

    /// The last lines of the daemon's log, for a failing assertion's message.
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.serve_log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(30)..].join("\n");
        format!("\n--- the daemon's log, last lines ---\n{tail}")
    }

    /// What the notifier was told, one line each.
    fn told(&self) -> String {
        std::fs::read_to_string(&self.told).unwrap_or_default()
    }
}

/// A command's stdout and stderr.
fn said(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gate-oauth-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_gate_logs_in_keeps_its_token_fresh_and_sends_nothing_it_cannot_authorize() {
    use std::os::unix::fs::PermissionsExt as _;

    let dir = scratch("flow");
    let provider = Provider::start(&dir.join("provider")).await;
    let mut person = Person::new(&dir, &provider);

    // 1. Before any login, `gate check` says what the person must do.
    let check = person.check().await;
    assert!(
        check.contains("server \"notes\": OAuth: not logged in")
            && check.contains("the person must run `gate login notes`"),
        "{check}"
    );

    // 2. The person logs in: the gate discovers the authorization server from the MCP
    // server's 401, registers itself, and keeps the tokens in its data directory.
    let printed = person.login().await;
    assert!(
        printed.contains(&format!("logged in to notes at {}", provider.base))
            && printed.contains("dynamic registration"),
        "{printed}"
    );
    {
        let remote = provider.remote();
        assert_eq!(remote.clients.len(), 1, "one client registered");
        let asked = &remote.authorizations[0];
        assert_eq!(asked.scopes, RESOURCE_SCOPES, "the resource's scopes");
        assert_eq!(asked.resource, provider.mcp_url(), "RFC 8707 resource");
        assert!(remote.clients.contains_key(&asked.client_id));
    }
    let tokens = person.data.join("oauth").join("notes.json");
    let mode = |path: &Path| {
        std::fs::metadata(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode(&tokens), 0o600, "the token file is its owner's alone");
    assert_eq!(mode(&person.data.join("oauth")), 0o700);
    let kept = std::fs::read_to_string(&tokens).expect("the token file");
    let configuration = std::fs::read_to_string(&person.config).expect("the configuration");
    let issued = provider.remote().issued.clone();
    assert!(kept.contains(&issued[0]), "the token file holds the token");
    assert!(
        issued.iter().all(|t| !configuration.contains(t)) && !configuration.contains("oauth-test-"),
        "no token in the configuration: {configuration}"
    );
    let check = person.check().await;
    assert!(
        check.contains("server \"notes\": OAuth: logged in; the access token expires in")
            && check.contains("scopes: notes:read notes:write"),
        "{check}"
    );

    // 3. The daemon reaches the server with the login's token: a read passes through.
    let url = person.serve();
    let agent = connect(&url, CODER_TOKEN).await;
    let tools = agent.list_all_tools().await.expect("tools");
    let names: HashSet<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert!(
        ["notes__read_note", "notes__write_note", "notes__admin_note"]
            .iter()
            .all(|n| names.contains(n)),
        "{names:?}{}",
        person.log_tail()
    );
    let read = text(&call(&agent, "notes__read_note", json!({})).await);
    assert!(
        read.contains("the notes: []"),
        "{read}; {}{}",
        provider.seen(),
        person.log_tail()
    );

    // 4a. The server stops taking the access token before the token file says it
    // expires: the daemon's request is refused, it refreshes once and sends again. From
    // now on tokens live 4 seconds.
    {
        let mut remote = provider.remote();
        remote.lifetime = 4;
        for access in remote.access.values_mut() {
            access.until = Instant::now();
        }
    }
    let staged = text(&call(&agent, "notes__write_note", json!({"text": "first"})).await);
    let first = action_id(&staged);
    assert!(
        !provider.calls().iter().any(|c| c.starts_with("write_note")),
        "staged, not sent: {staged}; {}",
        provider.seen()
    );
    let approved = person.approve(first).await;
    eventually("the first write reaches the server", || {
        provider.received(r#"write_note {"text":"first"}"#)
    })
    .await;
    {
        let remote = provider.remote();
        assert!(
            remote.stale_tokens >= 1 && !remote.refreshes.is_empty(),
            "refused once, then refreshed: {} stale, {} refreshes; approve said {approved}",
            remote.stale_tokens,
            remote.refreshes.len()
        );
        let refresh = &remote.refreshes[0];
        assert_eq!(
            refresh.get("resource"),
            Some(&provider.mcp_url()),
            "a refresh names the resource: {refresh:?}"
        );
    }
    let outcome = text(&call(&agent, "gate_action_result", json!({"action_id": first})).await);
    assert!(
        outcome.contains("was approved and sent") && outcome.contains("wrote \"first\""),
        "{outcome}"
    );

    // 4b. The token now lives 4 seconds: once it has expired by the token file's clock,
    // the daemon refreshes it before sending, so the expired token never goes out.
    let second = action_id(&text(
        &call(&agent, "notes__write_note", json!({"text": "second"})).await,
    ));
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let (stale_before, refreshes_before) = {
        let remote = provider.remote();
        (remote.stale_tokens, remote.refreshes.len())
    };
    let approved = person.approve(second).await;
    eventually("the second write reaches the server", || {
        provider.received(r#"write_note {"text":"second"}"#)
    })
    .await;
    {
        let remote = provider.remote();
        assert!(
            remote.refreshes.len() > refreshes_before,
            "refreshed: {approved}; {}{}",
            provider.seen(),
            person.log_tail()
        );
    }
    assert_eq!(
        provider.remote().stale_tokens,
        stale_before,
        "refreshed before it was sent, not after a refusal: {}{}",
        provider.seen(),
        person.log_tail()
    );

    // 5. The authorization server revokes the gate's access: an approved write cannot get
    // a token, so it is not sent, waits for the person again, and they are told to log in.
    {
        let mut remote = provider.remote();
        remote.access.clear();
        remote.refresh.clear();
    }
    let third = action_id(&text(
        &call(&agent, "notes__write_note", json!({"text": "third"})).await,
    ));
    let approved = person.approve(third).await;
    let mut shown = String::new();
    let start = Instant::now();
    while !shown.contains("what happened") {
        assert!(
            start.elapsed() < PATIENCE,
            "never decided: {shown}{}",
            person.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        shown = person.show(third).await;
    }
    assert!(
        shown.contains("failed before it reached the server (it waits for you again)")
            && shown.contains("gate login notes"),
        "{shown}\napprove said: {approved}{}",
        person.log_tail()
    );
    assert!(
        !provider.received(r#"write_note {"text":"third"}"#),
        "nothing was sent: {}",
        provider.seen()
    );
    let outcome = text(&call(&agent, "gate_action_result", json!({"action_id": third})).await);
    assert!(
        outcome.contains("failed before it reached the server")
            && outcome.contains("It waits for a person again")
            && outcome.contains("gate login notes"),
        "{outcome}"
    );
    // The person's notifier is run, with GATE_EVENT=login and GATE_SERVER=notes.
    let start = Instant::now();
    let told_to_log_in = loop {
        if let Some(line) = person
            .told()
            .lines()
            .find(|l| l.starts_with("login notes: "))
        {
            break line.to_owned();
        }
        assert!(
            start.elapsed() < PATIENCE,
            "the notifier was never told that notes needs a login; it was told:\n{}{}",
            person.told(),
            person.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The sentence says what to do, and why.
    assert!(
        told_to_log_in.contains("run `gate login notes`"),
        "the notifier's sentence for a needed login: {told_to_log_in:?}"
    );
    // A read while the login is still missing does not run either (the server never
    // receives it), and says what to do.
    let read = text(&call(&agent, "notes__read_note", json!({})).await);
    assert!(
        read.contains("the person must run `gate login notes`"),
        "{read}"
    );
    assert_eq!(
        provider
            .calls()
            .iter()
            .filter(|c| c.starts_with("read_note"))
            .count(),
        1,
        "{}",
        provider.seen()
    );
    // The refresh token the authorization server rejected is dropped from the token
    // file, so `gate check` says a login is needed rather than that the gate is logged in.
    let check = person.check().await;
    assert!(
        check.contains("not logged in") && check.contains("gate login notes"),
        "after the refresh token was rejected, `gate check` says: {check}"
    );

    // 6. The person logs in again, and approves the write that waited: it goes out now.
    person.login().await;
    assert_eq!(provider.remote().clients.len(), 2, "registered again");
    let approved = person.approve(third).await;
    eventually("the waiting write reaches the server", || {
        provider.received(r#"write_note {"text":"third"}"#)
    })
    .await;
    let outcome = text(&call(&agent, "gate_action_result", json!({"action_id": third})).await);
    assert!(
        outcome.contains("was approved and sent"),
        "{outcome}; {approved}"
    );

    // 7. Step-up: admin_note needs a scope the login did not ask for. The server refuses
    // it (403 insufficient_scope); nothing runs, the agent and the person are told to
    // log in, and the next login asks for the scope as well.
    let refused = text(&call(&agent, "notes__admin_note", json!({})).await);
    assert!(
        refused.contains("needs more scope")
            && refused.contains(ADMIN_SCOPE)
            && refused.contains("gate login notes"),
        "{refused}; {}{}",
        provider.seen(),
        person.log_tail()
    );
    assert!(
        !provider.calls().iter().any(|c| c.starts_with("admin_note")),
        "{}",
        provider.seen()
    );
    let check = person.check().await;
    assert!(
        check.contains("the server asked for more scope") && check.contains(ADMIN_SCOPE),
        "{check}"
    );
    person.login().await;
    {
        let remote = provider.remote();
        let asked = remote.authorizations.last().expect("a login");
        assert!(
            asked.scopes.iter().any(|s| s == ADMIN_SCOPE)
                && RESOURCE_SCOPES
                    .iter()
                    .all(|s| asked.scopes.iter().any(|a| a == s)),
            "the granted scopes and the one asked for: {:?}",
            asked.scopes
        );
    }
    let pinned = text(&call(&agent, "notes__admin_note", json!({})).await);
    assert!(
        pinned.contains("pinned 3 notes"),
        "{pinned}; {}{}",
        provider.seen(),
        person.log_tail()
    );
    drop(agent);

    // The notifier is run once for each wait for a login: the revocation, the scope.
    let logins = || {
        person
            .told()
            .lines()
            .filter(|l| l.starts_with("login notes: "))
            .count()
    };
    eventually("the person told of the scope", || logins() >= 2).await;
    // Told once per wait: the flag is cleared only when a request is answered again.
    assert_eq!(
        logins(),
        2,
        "the notifier ran for 2 waits for a login (the revocation, the scope): {:?}",
        person.told()
    );
}

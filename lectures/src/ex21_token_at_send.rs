//! ex21: the person's login, and a token that is valid when the write is sent.
//!
//! A remote MCP server asks for OAuth. The gate gets its tokens from the person
//! (`gate login`: the authorization code flow with PKCE, the redirect taken on a loopback
//! port) and keeps them in a file only the daemon's user reads. A write staged while the
//! token was valid may be approved hours later: the token is checked when the write is
//! sent, refreshed if it expired, and if no token can be had the write is not sent at all
//! and waits, saying that the person must log in again. This lecture runs it against a
//! small authorization server and MCP server in this process.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use gatekeeper_core::{ActionResult, CallOutcome, Grants, ServerTrust};
use gatekeeper_mcp::{Endpoint, HttpEndpoint, McpServer, McpServerConfig, OAuthSettings};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, ServerConfig,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler};
use serde_json::{Value, json};

use crate::setup::{Desk, call, paragraph, poll, visible};
use crate::{Context, Lecture, LectureFuture};

/// The lecture.
pub const LECTURE: Lecture = Lecture {
    name: "ex21",
    title: "the person's login, and a token valid when the write is sent",
    summary: "gate login keeps the tokens out of the configuration; an approved write is sent with a refreshed token, or not at all",
    run,
};

fn run<'a>(cx: &'a mut Context<'_>) -> LectureFuture<'a> {
    Box::pin(body(cx))
}

/// What the authorization server and the notes server know, and the lecture's switches.
#[derive(Default)]
struct World {
    /// Access tokens issued, with the second they expire.
    tokens: Vec<(String, u64)>,
    /// How long the next access token lives, in seconds.
    lifetime: u64,
    /// Every grant revoked: refresh tokens refused, access tokens too.
    revoked: bool,
    /// Refreshes asked for.
    refreshes: u32,
    /// Notes written on the server.
    notes: Vec<String>,
    /// The parameters of the last authorization request.
    asked: std::collections::HashMap<String, String>,
    serial: u32,
}

type Shared = Arc<Mutex<World>>;

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A JSON answer.
fn json_answer(status: StatusCode, value: Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

/// The pairs of a query or a form.
fn pairs(encoded: &str) -> std::collections::HashMap<String, String> {
    reqwest::Url::parse(&format!("http://form/?{encoded}"))
        .map(|u| u.query_pairs().into_owned().collect())
        .unwrap_or_default()
}

fn world(shared: &Shared) -> std::sync::MutexGuard<'_, World> {
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

impl World {
    fn issue(&mut self) -> Value {
        self.serial += 1;
        let access = format!("access-{}", self.serial);
        self.tokens.push((access.clone(), now() + self.lifetime));
        json!({
            "access_token": access,
            "token_type": "Bearer",
            "expires_in": self.lifetime,
            "refresh_token": format!("refresh-{}", self.serial),
            "scope": "notes",
        })
    }

    fn valid(&self, token: &str) -> bool {
        !self.revoked
            && self
                .tokens
                .iter()
                .any(|(t, until)| t == token && *until > now())
    }
}

/// The notes server: `write_note` (a write).
#[derive(Clone)]
struct Notes(Shared);

impl ServerHandler for Notes {
    fn get_info(&self) -> ServerConfig {
        crate::setup::tools_only()
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        crate::setup::tools_listed(json!([{
            "name": "write_note",
            "description": "Write a note.",
            "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
            "annotations": {"readOnlyHint": false, "destructiveHint": false}
        }]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let text = request
            .arguments
            .and_then(|a| a.get("text").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or_default();
        world(&self.0).notes.push(text.clone());
        Ok(CallToolResult::success(vec![ContentBlock::text(format!("noted: {text}"))]).into())
    }
}

/// The authorization server and the protected notes server on one loopback address.
async fn serve(shared: Shared) -> anyhow::Result<String> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let base = format!("http://127.0.0.1:{}", listener.local_addr()?.port());
    let notes = Notes(shared.clone());
    let mcp = StreamableHttpService::new(
        move || Ok(notes.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let (prm, metadata) = (base.clone(), base.clone());
    let router = axum::Router::new()
        .nest_service("/mcp", mcp)
        .layer(axum::middleware::from_fn_with_state(
            (shared.clone(), base.clone()),
            bearer,
        ))
        .route(
            "/.well-known/oauth-protected-resource/mcp",
            get(move || async move {
                json_answer(
                    StatusCode::OK,
                    json!({"resource": format!("{prm}/mcp"), "authorization_servers": [prm]}),
                )
            }),
        )
        .route(
            "/.well-known/oauth-authorization-server",
            get(move || async move {
                json_answer(
                    StatusCode::OK,
                    json!({
                        "issuer": metadata,
                        "authorization_endpoint": format!("{metadata}/authorize"),
                        "token_endpoint": format!("{metadata}/token"),
                        "registration_endpoint": format!("{metadata}/register"),
                        "code_challenge_methods_supported": ["S256"],
                        "token_endpoint_auth_methods_supported": ["none"],
                    }),
                )
            }),
        )
        .route(
            "/register",
            post(|body: String| async move {
                // RFC 7591: the answer repeats the client's metadata with its id.
                let mut client: Value = serde_json::from_str(&body).unwrap_or_else(|_| json!({}));
                client["client_id"] = json!("gate-1");
                json_answer(StatusCode::CREATED, client)
            }),
        )
        .route("/authorize", get(authorize))
        .route("/token", post(token))
        .with_state(shared);
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(base)
}

/// The person agrees at once: back to the gate's loopback redirect with a code.
async fn authorize(State(shared): State<Shared>, request: Request) -> Response {
    let query = pairs(request.uri().query().unwrap_or(""));
    world(&shared).asked = query.clone();
    let (Some(back), Some(state)) = (query.get("redirect_uri"), query.get("state")) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    Redirect::to(&format!("{back}?code=granted&state={state}")).into_response()
}

async fn token(State(shared): State<Shared>, body: String) -> Response {
    let form = pairs(&body);
    let mut world = world(&shared);
    if form.get("grant_type").map(String::as_str) == Some("refresh_token") {
        world.refreshes += 1;
        if world.revoked {
            return json_answer(
                StatusCode::BAD_REQUEST,
                json!({"error": "invalid_grant", "error_description": "revoked"}),
            );
        }
    }
    let issued = world.issue();
    json_answer(StatusCode::OK, issued)
}

/// The notes server takes a request only with a valid access token.
async fn bearer(
    State((shared, base)): State<(Shared, String)>,
    headers: HeaderMap,
    request: Request,
    next: Next,
) -> Response {
    if !request.uri().path().starts_with("/mcp") {
        return next.run(request).await;
    }
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if token.is_some_and(|t| world(&shared).valid(t)) {
        return next.run(request).await;
    }
    let challenge =
        format!("Bearer resource_metadata=\"{base}/.well-known/oauth-protected-resource/mcp\"");
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, challenge)],
    )
        .into_response()
}

/// The person's browser: open the address, follow the authorization server back to the
/// gate's loopback port.
async fn browse(address: String) -> anyhow::Result<()> {
    let client = gatekeeper_mcp::tls::builder(None)
        .map_err(anyhow::Error::msg)?
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let answer = client.get(&address).send().await?;
    let back = answer
        .headers()
        .get(header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| anyhow::anyhow!("the authorization page did not redirect"))?
        .to_owned();
    client.get(&back).send().await?;
    Ok(())
}

async fn body(cx: &mut Context<'_>) -> anyhow::Result<()> {
    paragraph(
        cx,
        &[
            "notes is a remote MCP server that asks for OAuth. The gate holds no password for",
            "it: the person logs the gate in once, and the gate keeps the tokens. An action is",
            "approved when the person gets to it, which can be after the token expired.",
        ],
    )?;
    let shared: Shared = Arc::new(Mutex::new(World {
        lifetime: 3600,
        ..World::default()
    }));
    let base = serve(shared.clone()).await?;
    let url = format!("{base}/mcp");
    let dir = crate::setup::scratch_dir("ex21")?;
    let settings = OAuthSettings::new(dir.join("oauth").join("notes.json"));

    cx.section("1. gate login notes")?;
    // The gate shows the address and waits on its loopback port; the person's browser
    // opens it.
    let (shown, address) = tokio::sync::oneshot::channel::<String>();
    let login = gatekeeper_mcp::oauth::login(
        "notes",
        &url,
        None,
        &settings,
        Duration::from_secs(30),
        move |address| {
            let _ = shown.send(address.to_owned());
        },
    );
    let browser = async {
        match address.await {
            Ok(address) => browse(address).await,
            // The login ended before it showed an address: its error says why.
            Err(_) => Ok(()),
        }
    };
    let (logged_in, browsed) = tokio::join!(login, browser);
    browsed?;
    let logged_in = logged_in.map_err(anyhow::Error::msg)?;
    cx.evidence("registered by", logged_in.registration)?;
    let asked = world(&shared).asked.clone();
    let carried = |name: &str| asked.get(name).map_or("(missing)", String::as_str);
    cx.evidence(
        "the authorization request's code_challenge_method",
        carried("code_challenge_method"),
    )?;
    cx.evidence(
        "its resource is the server's URL",
        carried("resource") == url || carried("resource") == format!("{url}/"),
    )?;
    cx.evidence(
        "its state is the one the gate checks on the way back",
        asked.contains_key("state"),
    )?;
    let mode = {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::metadata(&settings.token_file)?
            .permissions()
            .mode()
            & 0o777
    };
    cx.evidence(
        "the tokens live in",
        format!("oauth/notes.json in the data directory, mode {mode:o} (not the configuration)"),
    )?;

    cx.section("2. An agent stages a write; its token expires before the person approves")?;
    let endpoint = Endpoint::Http(HttpEndpoint {
        url: url.clone(),
        headers: Vec::new(),
        ca_file: None,
        oauth: Some(settings.clone()),
    });
    let server =
        McpServer::connect(McpServerConfig::new("notes", endpoint).trust(ServerTrust::Vetted))
            .await?;
    let desk = Desk::new(cx)?;
    let gatekeeper = Arc::new(server.gatekeeper(desk.action_store("notes").await?));
    desk.overseer.register(gatekeeper.clone())?;
    let mut grants = Grants::new();
    grants.introduce(
        "NOTES",
        gatekeeper.grant(&desk.overseer, "agent", &["write_note"])?,
    );
    let session = grants.session("NOTES")?.clone();
    let Ok(CallOutcome::Pending { action, ledger, .. }) = call(
        cx,
        &session,
        "write_note",
        json!({"text": "ship on Friday"}),
    )
    .await
    else {
        anyhow::bail!("write_note was not staged");
    };
    // Every token the server issued now expires within a second, and so does what the
    // gate kept: the next token request is a refresh.
    {
        let mut world = world(&shared);
        world.lifetime = 2;
        let soon = now() + 1;
        for (_, until) in &mut world.tokens {
            *until = soon;
        }
    }
    login_expiring(&settings)?;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    writeln!(cx, "  (the access token has expired)")?;
    desk.overseer.approve(ledger, "alice").await?;
    poll(cx, &session, action).await?;
    let (refreshes, notes) = {
        let world = world(&shared);
        (world.refreshes, world.notes.len())
    };
    // (The transport's own streams may ask again later; what counts is that one was.)
    cx.evidence(
        "the gate asked the authorization server for a refresh",
        refreshes >= 1,
    )?;
    cx.evidence("notes written on the server", notes)?;

    cx.section("3. The person's grant is revoked; another write is approved")?;
    world(&shared).revoked = true;
    let Ok(CallOutcome::Pending { action, ledger, .. }) =
        call(cx, &session, "write_note", json!({"text": "cancel Friday"})).await
    else {
        anyhow::bail!("write_note was not staged");
    };
    // Its token expires too, so the refresh is asked for before anything is sent.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    // The gate finds out before the write leaves: either the refresh is refused, or the
    // server refuses the token on the request that comes first (the catalog's re-read) and
    // the refresh after it is refused. Which one depends on the clock; both end the same.
    let decided = desk.overseer.approve(ledger, "alice").await;
    let said = match &decided {
        Ok(()) => anyhow::bail!("the write was applied without a token"),
        Err(e) => e.to_string(),
    };
    anyhow::ensure!(
        said.contains("the person must run `gate login notes`"),
        "{said}"
    );
    writeln!(
        cx,
        "  alice approves: not sent, because no token can be had; the person must run `gate login notes`"
    )?;
    let result = session.get_action_result(action).await?;
    let (status, message) = (result.status(), result.message().unwrap_or("").to_owned());
    anyhow::ensure!(
        !matches!(result, ActionResult::Applied { .. }) && message.contains("gate login notes"),
        "{status}: {message}"
    );
    cx.evidence("the agent's get_action_result", status)?;
    // What it says to do (the reason before it depends on the clock, as above).
    let to_do: String = message
        .find("the person must run")
        .map(|at| message[at..].split_inclusive('`').take(2).collect())
        .unwrap_or_default();
    cx.evidence("it tells the agent", visible(&to_do))?;
    cx.evidence("notes written on the server", world(&shared).notes.len())?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Make the kept token look as old as the server now says it is: the lecture does not
/// wait an hour for it.
fn login_expiring(settings: &OAuthSettings) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&settings.token_file)?;
    let mut saved: Value = serde_json::from_str(&text)?;
    saved["credentials"]["token_received_at"] = json!(now().saturating_sub(3599));
    std::fs::write(&settings.token_file, serde_json::to_vec(&saved)?)?;
    Ok(())
}

//! OAuth 2.1 to remote MCP servers, as the MCP authorization specification describes: the
//! person's login (`gate login`), the token file only the daemon's user can read, and the
//! access token every request carries, refreshed before it expires, or the call refused
//! before anything is sent.
//!
//! rmcp's `auth` module does the protocol: protected resource metadata discovered from
//! the server's 401 challenge, authorization server metadata (issuer checked), PKCE,
//! resource indicators, scope selection, refresh before expiry and once on a 401. What is
//! here is what it leaves to its user:
//!
//! - **Client registration in the specification's order**: a pre-registered client id
//!   (with its secret from the environment), else a client ID metadata document when the
//!   authorization server supports them, else dynamic registration, whose client id and
//!   secret are kept so that a refresh after a restart authenticates as the same client.
//! - **The redirect**: a one-shot listener on a loopback port, which takes exactly one
//!   callback carrying the `state` of this login.
//! - **The token file** (`oauth/<server>.json` in the data directory, 0600 in a 0700
//!   directory, replaced atomically): never the configuration, never a log; stdio servers
//!   are confined away from the data directory, and agents reach nothing but the gateway.
//! - **Step-up**: a 403 `insufficient_scope` records the scope the server asked for, so
//!   that the person's next `gate login` asks for it as well.
//! - **Bounded answers**: every answer of the authorization server is capped
//!   ([`MAX_ANSWER_BYTES`]), redirects are followed only where rmcp asks for it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt as _;
use rmcp::transport::auth::{
    AuthClient, AuthError, AuthorizationCallback, AuthorizationManager, AuthorizationMetadata,
    AuthorizationRequest, AuthorizationSession, ClientCredentialsConfig, CredentialStore,
    InMemoryCredentialStore, OAuthClientConfig, OAuthHttpClient, OAuthHttpClientError,
    OAuthHttpClientFuture, OAuthHttpRedirectPolicy, OAuthHttpRequest, StoredCredentials,
    WWWAuthenticateParams,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

/// The most bytes the gate reads of one answer of an authorization server (metadata,
/// registration, tokens): a larger one is refused, not trusted halfway.
pub const MAX_ANSWER_BYTES: usize = 256 * 1024;

/// How long one request to an authorization server may take.
const ANSWER_DEADLINE: Duration = Duration::from_secs(30);

/// The most bytes read of the browser's request to the loopback redirect.
const MAX_CALLBACK_BYTES: usize = 16 * 1024;

/// The name the gate registers under.
const CLIENT_NAME: &str = "gate";

/// How a server reached over HTTPS is authorized with OAuth (`[server.oauth]`).
#[derive(Clone, PartialEq, Eq)]
pub struct OAuthSettings {
    /// The token file (`oauth/<server>.json` in the data directory).
    pub token_file: PathBuf,
    /// A client id registered with the authorization server by hand.
    pub client_id: Option<String>,
    /// Its secret (read from the environment; never shown).
    pub client_secret: Option<String>,
    /// The HTTPS address of the gate's client ID metadata document, used when the
    /// authorization server supports them and no client id is given.
    pub client_metadata_url: Option<String>,
    /// Scopes to ask for; empty lets the server's challenge and metadata choose.
    pub scopes: Vec<String>,
    /// The gate is a client of its own (the client credentials grant, with `client_id`
    /// and `client_secret` or `private_key`): no person logs in, and the gate gets a new
    /// token itself.
    pub client_credentials: bool,
    /// A P-256 private key (PKCS #8 PEM) that signs the gate's client assertions
    /// (`private_key_jwt`), instead of a client secret.
    pub private_key: Option<String>,
}

impl std::fmt::Debug for OAuthSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthSettings")
            .field("token_file", &self.token_file)
            .field("client_id", &self.client_id)
            .field("client_secret", &self.client_secret.as_ref().map(|_| "…"))
            .field("client_metadata_url", &self.client_metadata_url)
            .field("scopes", &self.scopes)
            .field("client_credentials", &self.client_credentials)
            .field("private_key", &self.private_key.as_ref().map(|_| "…"))
            .finish()
    }
}

impl OAuthSettings {
    /// Settings that keep their tokens in `token_file` and leave everything else to the
    /// servers' metadata (dynamic registration, scopes from the challenge).
    pub fn new(token_file: impl Into<PathBuf>) -> Self {
        Self {
            token_file: token_file.into(),
            client_id: None,
            client_secret: None,
            client_metadata_url: None,
            scopes: Vec::new(),
            client_credentials: false,
            private_key: None,
        }
    }

    /// The client credentials grant's configuration, for a gate that is a client of its
    /// own; `None` for a person's login.
    fn machine(&self, url: &str) -> Result<Option<Machine>, String> {
        if !self.client_credentials {
            return Ok(None);
        }
        let Some(client_id) = &self.client_id else {
            return Err(
                "the client credentials grant needs the client_id the authorization server issued"
                    .to_owned(),
            );
        };
        if let Some(pem) = &self.private_key {
            let key = crate::assertion::SigningKey::from_pem(pem)
                .map_err(|why| format!("the gate's private key cannot sign: {why}"))?;
            return Ok(Some(Machine::Signed {
                client_id: client_id.clone(),
                key: Arc::new(key),
                scopes: self.scopes.clone(),
                resource: url.to_owned(),
            }));
        }
        let Some(client_secret) = &self.client_secret else {
            return Err(
                "the client credentials grant needs the client's secret or private key".to_owned(),
            );
        };
        Ok(Some(Machine::Secret(
            ClientCredentialsConfig::ClientSecret {
                client_id: client_id.clone(),
                client_secret: client_secret.clone(),
                scopes: self.scopes.clone(),
                resource: Some(url.to_owned()),
            },
        )))
    }
}

/// The gate as a client of its own: how it authenticates its token requests.
#[derive(Clone)]
enum Machine {
    /// With a client secret (rmcp's client credentials exchange).
    Secret(ClientCredentialsConfig),
    /// With an assertion signed by its private key (RFC 7523).
    Signed {
        client_id: String,
        key: Arc<crate::assertion::SigningKey>,
        scopes: Vec<String>,
        resource: String,
    },
}

impl Machine {
    /// Set `manager` up for this client (after its metadata is known).
    fn configure(
        &self,
        manager: &mut AuthorizationManager,
        metadata: &AuthorizationMetadata,
    ) -> Result<(), String> {
        match self {
            Self::Secret(config) => manager
                .configure_client_credentials(config)
                .map_err(|e| explain(&e)),
            Self::Signed { client_id, .. } => manager
                .configure_client(OAuthClientConfig::new(
                    client_id.clone(),
                    metadata.token_endpoint.clone(),
                ))
                .map_err(|e| explain(&e)),
        }
    }

    /// Ask for a token and keep it in `store`.
    async fn obtain(
        &self,
        manager: &AuthorizationManager,
        metadata: &AuthorizationMetadata,
        http: &Http,
        store: &dyn CredentialStore,
    ) -> Result<(), String> {
        let (client_id, key, scopes, resource) = match self {
            Self::Secret(config) => {
                return manager
                    .exchange_client_credentials(config)
                    .await
                    .map(|_| ())
                    .map_err(|e| explain(&e));
            }
            Self::Signed {
                client_id,
                key,
                scopes,
                resource,
            } => (client_id, key, scopes, resource),
        };
        let audience = metadata
            .issuer
            .clone()
            .unwrap_or_else(|| metadata.token_endpoint.clone());
        let assertion = key.assertion(client_id, &audience, now())?;
        let mut form = vec![
            ("grant_type", "client_credentials".to_owned()),
            ("client_id", client_id.clone()),
            (
                "client_assertion_type",
                crate::assertion::ASSERTION_TYPE.to_owned(),
            ),
            ("client_assertion", assertion),
            ("resource", resource.clone()),
        ];
        if !scopes.is_empty() {
            form.push(("scope", scopes.join(" ")));
        }
        // The form's encoding is a query's.
        let body = reqwest::Url::parse_with_params("http://form/", &form)
            .map_err(|e| e.to_string())?
            .query()
            .unwrap_or("")
            .to_owned();
        let (status, answer) = http.post_form(&metadata.token_endpoint, body).await?;
        if !status.is_success() {
            return Err(format!(
                "the token endpoint refused the gate's signed assertion ({status}: {})",
                String::from_utf8_lossy(&answer)
                    .chars()
                    .take(300)
                    .collect::<String>()
            ));
        }
        let token: rmcp::transport::auth::OAuthTokenResponse = serde_json::from_slice(&answer)
            .map_err(|e| format!("the token endpoint's answer is not a token ({e})"))?;
        let granted = serde_json::to_value(&token)
            .ok()
            .and_then(|t| t.get("scope").and_then(Value::as_str).map(str::to_owned))
            .map(|s| s.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_else(|| scopes.clone());
        store
            .save(
                StoredCredentials::new(client_id.clone(), Some(token), granted, Some(now()))
                    .with_issuer(metadata.issuer.clone()),
            )
            .await
            .map_err(|e| explain(&e))
    }
}

/// What the token file holds: the client the gate is registered as, the authorization
/// server it was registered with, and the tokens.
#[derive(Clone, Serialize, Deserialize)]
struct Saved {
    /// The server's URL the tokens are for: tokens are never sent to another.
    url: String,
    client_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    client_secret: Option<String>,
    redirect_uri: String,
    metadata: AuthorizationMetadata,
    /// Scopes a server asked for in a 403 `insufficient_scope` since the last login.
    #[serde(default)]
    wanted_scopes: Vec<String>,
    credentials: Option<StoredCredentials>,
}

/// The token file of one server, read at each request (so that a `gate login` while the
/// daemon runs is taken up at once) and replaced whole when it changes.
#[derive(Clone)]
struct TokenFile {
    path: PathBuf,
    /// One writer at a time within the process.
    lock: Arc<tokio::sync::Mutex<()>>,
}

impl TokenFile {
    fn new(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
            lock: Arc::default(),
        }
    }

    fn read(&self) -> Result<Option<Saved>, String> {
        let text = match std::fs::read(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(format!(
                    "the token file {} cannot be read ({e})",
                    self.path.display()
                ));
            }
        };
        serde_json::from_slice(&text).map(Some).map_err(|e| {
            format!(
                "the token file {} is damaged ({e}); run `gate logout` and `gate login` for its server",
                self.path.display()
            )
        })
    }

    /// Replace the file with `saved`: written beside it readable by its owner only,
    /// synced, then renamed over it.
    fn write(&self, saved: &Saved) -> Result<(), String> {
        use std::io::Write as _;
        use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("{} cannot be created ({e})", dir.display()))?;
        let temporary = self.path.with_extension("json.new");
        let text = serde_json::to_vec_pretty(saved).map_err(|e| e.to_string())?;
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temporary)
            .and_then(|mut file| {
                file.write_all(&text)?;
                file.sync_all()
            })
            .and_then(|()| std::fs::rename(&temporary, &self.path))
            .and_then(|()| std::fs::File::open(dir)?.sync_all());
        written.map_err(|e| {
            format!(
                "the token file {} cannot be written ({e})",
                self.path.display()
            )
        })
    }

    fn remove(&self) -> Result<bool, String> {
        match std::fs::remove_file(&self.path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(format!("{} cannot be removed ({e})", self.path.display())),
        }
    }
}

fn store_error(why: String) -> AuthError {
    AuthError::InternalError(why)
}

#[async_trait::async_trait]
impl CredentialStore for TokenFile {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        Ok(self
            .read()
            .map_err(store_error)?
            .and_then(|s| s.credentials))
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        let _held = self.lock.lock().await;
        let mut saved = self
            .read()
            .map_err(store_error)?
            .ok_or_else(|| store_error("the token file was removed (gate logout)".to_owned()))?;
        saved.credentials = Some(credentials);
        self.write(&saved).map_err(store_error)
    }

    async fn clear(&self) -> Result<(), AuthError> {
        let _held = self.lock.lock().await;
        if let Some(mut saved) = self.read().map_err(store_error)? {
            saved.credentials = None;
            self.write(&saved).map_err(store_error)?;
        }
        Ok(())
    }

    /// The authorization server refused the refresh token for good (`invalid_grant`):
    /// the tokens are dead, and the file says so (the person's next `gate login` makes new
    /// ones; `gate check` says one is needed). Tokens a login wrote since are kept.
    async fn on_refresh_token_rejected(
        &self,
        rejected: &StoredCredentials,
    ) -> Result<(), AuthError> {
        let _held = self.lock.lock().await;
        if let Some(mut saved) = self.read().map_err(store_error)?
            && saved
                .credentials
                .as_ref()
                .is_some_and(|kept| same_grant(kept, rejected))
        {
            saved.credentials = None;
            self.write(&saved).map_err(store_error)?;
        }
        Ok(())
    }
}

/// Whether two stored credentials carry the same refresh token.
fn same_grant(a: &StoredCredentials, b: &StoredCredentials) -> bool {
    let refresh = |c: &StoredCredentials| {
        c.token_response
            .as_ref()
            .and_then(|t| serde_json::to_value(t).ok())
            .and_then(|t| t.get("refresh_token").cloned())
    };
    a.client_id == b.client_id && refresh(a) == refresh(b)
}

/// The HTTP client of the OAuth exchanges: the server's own trust (system roots and its
/// `ca_file`), answers capped at [`MAX_ANSWER_BYTES`], redirects as rmcp asks.
struct Http {
    follow: reqwest::Client,
    stop: reqwest::Client,
}

impl Http {
    /// POST the form `body` (already encoded) to `url`, without following redirects; the
    /// answer's status and body (capped).
    async fn post_form(
        &self,
        url: &str,
        body: String,
    ) -> Result<(reqwest::StatusCode, Vec<u8>), String> {
        let response = self
            .stop
            .post(url)
            .header("content-type", "application/x-www-form-urlencoded")
            .header("accept", "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| format!("{url} could not be asked ({e})"))?;
        Ok((response.status(), capped(response).await?))
    }

    fn new(ca_file: Option<&Path>) -> Result<Arc<Self>, String> {
        let build = |policy| {
            crate::tls::builder(ca_file)?
                .timeout(ANSWER_DEADLINE)
                .redirect(policy)
                .build()
                .map_err(|e| format!("the HTTP client cannot be built: {e}"))
        };
        // Redirects are followed within the origin asked, at most 5: metadata that sends
        // the gate elsewhere is refused, not trusted.
        let same_origin = reqwest::redirect::Policy::custom(|attempt| {
            let first = attempt.previous().first().map(reqwest::Url::origin);
            if attempt.previous().len() > 5 {
                attempt.error("more than 5 redirects")
            } else if first.is_some_and(|origin| origin != attempt.url().origin()) {
                let to = attempt.url().to_string();
                attempt.error(format!(
                    "redirected to another origin ({to}), which the gate does not follow"
                ))
            } else {
                attempt.follow()
            }
        });
        Ok(Arc::new(Self {
            follow: build(same_origin)?,
            stop: build(reqwest::redirect::Policy::none())?,
        }))
    }
}

/// The body of an authorization server's answer, refused whole when it is larger than
/// [`MAX_ANSWER_BYTES`].
async fn capped(response: reqwest::Response) -> Result<Vec<u8>, String> {
    let url = response.url().to_string();
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| format!("{url}'s answer was cut ({e})"))?;
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(format!(
                "{url}'s answer is larger than {MAX_ANSWER_BYTES} bytes, so it is refused"
            ));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

impl OAuthHttpClient for Http {
    fn execute(&self, request: OAuthHttpRequest) -> OAuthHttpClientFuture<'_> {
        Box::pin(async move {
            let client = match request.redirect_policy {
                OAuthHttpRedirectPolicy::Stop => &self.stop,
                _ => &self.follow,
            };
            let request = reqwest::Request::try_from(request.request)
                .map_err(|e| Box::new(e) as OAuthHttpClientError)?;
            let response = client
                .execute(request)
                .await
                .map_err(|e| Box::new(e) as OAuthHttpClientError)?;
            let mut answer = http::Response::builder().status(response.status());
            for (name, value) in response.headers() {
                answer = answer.header(name, value);
            }
            let body = capped(response).await?;
            answer
                .body(body)
                .map_err(|e| Box::new(e) as OAuthHttpClientError)
        })
    }
}

/// The sentence that tells an agent, and the person, what to do when `server` has no
/// usable token: `why`, then who must act ([`is_login_needed`] recognises it).
pub fn needs_login(server: &str, why: &str) -> String {
    format!("{why}; {LOGIN_NEEDED} {server}`")
}

/// The words every "needs a login" sentence carries.
const LOGIN_NEEDED: &str = "the person must run `gate login";

/// Whether `message` says that a server needs the person's login ([`needs_login`]).
pub fn is_login_needed(message: &str) -> bool {
    message.contains(LOGIN_NEEDED)
}

/// An rmcp error as a person reads it: its message and its causes, each once.
fn explain(error: &AuthError) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    text
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What a token file says of a server's login, for `gate check` and `gate login`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoginState {
    /// Never logged in, or logged out.
    None,
    /// Logged in for another URL than the server's (its configuration changed).
    OtherUrl(String),
    /// The access token is valid for this many more seconds (`None`: the server gave no
    /// lifetime); `refreshable` when a refresh token is kept.
    Valid {
        /// Seconds left, when the server said how long the token lives.
        seconds_left: Option<u64>,
        /// Whether a refresh token is kept.
        refreshable: bool,
        /// The scopes granted.
        scopes: Vec<String>,
        /// Scopes a server asked for since (step-up): a new login asks for them.
        wanted: Vec<String>,
    },
    /// The access token expired; it is refreshed at the next request when `refreshable`.
    Expired {
        /// Whether a refresh token is kept.
        refreshable: bool,
    },
}

impl LoginState {
    /// Read the state of the login kept in `token_file` for the server at `url`.
    pub fn read(token_file: &Path, url: &str) -> Result<Self, String> {
        let Some(saved) = TokenFile::new(token_file).read()? else {
            return Ok(Self::None);
        };
        if saved.url != url {
            return Ok(Self::OtherUrl(saved.url));
        }
        let Some(credentials) = saved.credentials else {
            return Ok(Self::None);
        };
        let token = credentials
            .token_response
            .as_ref()
            .and_then(|t| serde_json::to_value(t).ok())
            .unwrap_or(Value::Null);
        let refreshable = token.get("refresh_token").is_some_and(|r| !r.is_null());
        let seconds_left = match (
            token.get("expires_in").and_then(Value::as_u64),
            credentials.token_received_at,
        ) {
            (Some(lifetime), Some(received)) => {
                let left = (received + lifetime).saturating_sub(now());
                if left == 0 {
                    return Ok(Self::Expired { refreshable });
                }
                Some(left)
            }
            _ => None,
        };
        Ok(Self::Valid {
            seconds_left,
            refreshable,
            scopes: credentials.granted_scopes,
            wanted: saved.wanted_scopes,
        })
    }

    /// One line for a person: what the login is and what to do.
    pub fn describe(&self, server: &str) -> String {
        match self {
            Self::None => needs_login(server, "not logged in"),
            Self::OtherUrl(url) => needs_login(
                server,
                &format!("its tokens are for {url}, not the configured URL"),
            ),
            Self::Valid {
                seconds_left,
                refreshable,
                scopes,
                wanted,
            } => {
                let mut line = match seconds_left {
                    Some(left) => format!("logged in; the access token expires in {}", span(*left)),
                    None => "logged in; the access token carries no expiry".to_owned(),
                };
                line.push_str(if *refreshable {
                    " and is refreshed before then"
                } else {
                    ", with no refresh token (a new login is needed then)"
                });
                if !scopes.is_empty() {
                    line.push_str(&format!("; scopes: {}", scopes.join(" ")));
                }
                if !wanted.is_empty() {
                    line.push_str(&format!(
                        "; the server asked for more scope ({}): run `gate login {server}`",
                        wanted.join(" ")
                    ));
                }
                line
            }
            Self::Expired { refreshable: true } => {
                "logged in; the access token expired and is refreshed at the next call".to_owned()
            }
            Self::Expired { refreshable: false } => needs_login(
                server,
                "the access token expired and there is no refresh token",
            ),
        }
    }
}

/// A duration in seconds as a person reads it: `59 min`, `3 h 2 min`, `12 s`.
fn span(seconds: u64) -> String {
    match seconds {
        0..=119 => format!("{seconds} s"),
        120..=7199 => format!("{} min", seconds / 60),
        _ => format!("{} h {} min", seconds / 3600, seconds % 3600 / 60),
    }
}

/// What a login came to.
#[derive(Debug, Clone)]
pub struct LoggedIn {
    /// The authorization server (its issuer, or its authorization endpoint).
    pub issuer: String,
    /// How the gate is registered: `pre-registered`, `client ID metadata document`,
    /// `dynamic registration`, or `as before`.
    pub registration: &'static str,
    /// The login's state now (expiry, scopes).
    pub state: LoginState,
}

/// The client of `url` with no credentials, to learn the server's challenge.
async fn challenge(url: &str, ca_file: Option<&Path>) -> Result<Option<String>, String> {
    use rmcp::ServiceExt as _;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    let client = crate::tls::client(ca_file)?;
    let transport = StreamableHttpClientTransport::with_client(
        client,
        StreamableHttpClientTransportConfig::with_uri(url),
    );
    match tokio::time::timeout(ANSWER_DEADLINE, ().serve(transport)).await {
        Err(_) => Err(format!(
            "{url} did not answer within {}s",
            ANSWER_DEADLINE.as_secs()
        )),
        // It lets an unauthenticated client in (it asks for a token only for some
        // requests): discovery starts from its metadata.
        Ok(Ok(running)) => {
            let _ = running.cancel().await;
            Ok(None)
        }
        Ok(Err(error)) => match error.auth_challenge() {
            Some(challenge) => Ok(Some(challenge.to_owned())),
            None => {
                if let Some(refusal) = crate::tls::certificate_refusal(url, ca_file).await {
                    return Err(format!("{url} cannot be reached: {refusal}"));
                }
                Err(format!(
                    "{url} did not ask for authorization and did not complete the MCP handshake: {error}"
                ))
            }
        },
    }
}

/// Log the gate in to `server` (reached at `url`): learn its challenge, discover its
/// authorization server, register (in the specification's order), send the person to
/// the authorization page (`show` is given its URL: print it, open a browser), take the
/// redirect on a loopback port within `wait`, exchange the code and keep the tokens.
pub async fn login(
    server: &str,
    url: &str,
    ca_file: Option<&Path>,
    settings: &OAuthSettings,
    wait: Duration,
    show: impl FnOnce(&str),
) -> Result<LoggedIn, String> {
    let file = TokenFile::new(&settings.token_file);
    let before = file.read().ok().flatten().filter(|s| s.url == url);
    let challenge = challenge(url, ca_file).await?;
    let http = Http::new(ca_file)?;
    let mut manager = AuthorizationManager::new_with_oauth_http_client(url, http.clone())
        .await
        .map_err(|e| format!("{url} is not a URL OAuth can use: {}", explain(&e)))?;
    let resolution = manager
        .resolve_metadata_from_challenge(challenge.as_deref())
        .await
        .map_err(|e| {
            format!(
                "the authorization server of {server} could not be discovered or was refused: {}",
                explain(&e)
            )
        })?;
    let metadata = resolution.metadata;
    manager.set_metadata(metadata.clone());
    let tokens = InMemoryCredentialStore::new();
    manager.set_credential_store(tokens.clone());

    if let Some(machine) = settings.machine(url)? {
        // The gate's own client: a token for the asking, no browser.
        machine.configure(&mut manager, &metadata)?;
        machine
            .obtain(&manager, &metadata, &http, &tokens)
            .await
            .map_err(|e| {
                format!("the authorization server of {server} gave the gate's client no token: {e}")
            })?;
        let credentials = tokens.load().await.map_err(|e| explain(&e))?;
        return keep(
            &file,
            Saved {
                url: url.to_owned(),
                client_id: settings.client_id.clone().unwrap_or_default(),
                client_secret: None,
                redirect_uri: String::new(),
                metadata,
                wanted_scopes: Vec::new(),
                credentials,
            },
            "client credentials",
        );
    }

    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("no loopback port could be opened for the login's redirect ({e})"))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let redirect_uri = format!("http://127.0.0.1:{port}/callback");

    // The scopes: the person's, else those granted before and those a server asked for
    // since (step-up), else the challenge's and the metadata's (rmcp's selection).
    let mut scopes = settings.scopes.clone();
    if scopes.is_empty()
        && let Some(before) = &before
    {
        let granted = before
            .credentials
            .as_ref()
            .map(|c| c.granted_scopes.clone())
            .unwrap_or_default();
        for scope in granted.into_iter().chain(before.wanted_scopes.clone()) {
            if !scopes.contains(&scope) {
                scopes.push(scope);
            }
        }
    }
    if scopes.is_empty() {
        scopes = manager.select_scopes(
            challenge
                .as_deref()
                .and_then(|c| scope_of(c, url))
                .as_deref(),
            &[],
        );
    }
    let scope_refs: Vec<&str> = scopes.iter().map(String::as_str).collect();

    // Registration, in the specification's order of preference.
    let supports_cimd = metadata
        .additional_fields
        .get("client_id_metadata_document_supported")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut request = AuthorizationRequest::new(redirect_uri.clone()).with_scopes(scopes.clone());
    let (client_secret, registration) = if let Some(id) = &settings.client_id {
        request = request.with_preregistered_client(id);
        if let Some(secret) = &settings.client_secret {
            request = request.with_client_secret(secret);
        }
        (settings.client_secret.clone(), "pre-registered")
    } else if let (Some(document), true) = (&settings.client_metadata_url, supports_cimd) {
        request = request.with_client_metadata_url(document);
        (None, "client ID metadata document")
    } else if metadata.registration_endpoint.is_some() {
        let registered = manager
            .register_client(CLIENT_NAME, &redirect_uri, &scope_refs)
            .await
            .map_err(|e| {
                format!(
                    "the authorization server of {server} refused to register the gate: {}",
                    explain(&e)
                )
            })?;
        request = request.with_preregistered_client(registered.client_id.clone());
        if let Some(secret) = &registered.client_secret {
            request = request.with_client_secret(secret);
        }
        (registered.client_secret, "dynamic registration")
    } else {
        return Err(format!(
            "the authorization server of {server} offers no registration and the gate has no client id for it: register the gate there by hand (redirect URI http://127.0.0.1/callback, any port) and set client_id in [server.oauth]"
        ));
    };
    let session = AuthorizationSession::new(manager, request)
        .await
        .map_err(|(_, e)| format!("the login to {server} could not start: {}", explain(&e)))?;
    let address = session.get_authorization_url().to_owned();
    let state = query_value(&address, "state").unwrap_or_default();
    show(&address);

    let callback = tokio::time::timeout(wait, redirect(&listener, port, &state, server))
        .await
        .map_err(|_| {
            format!(
                "no authorization came back within {} s; run `gate login {server}` again and finish in the browser",
                wait.as_secs()
            )
        })??;
    session
        .handle_callback_with_issuer(
            &callback.code,
            &callback.csrf_token,
            callback.issuer.as_deref(),
        )
        .await
        .map_err(|e| {
            format!(
                "the authorization server of {server} did not give a token: {}",
                explain(&e)
            )
        })?;
    let client_id = session.get_credentials().await.map_err(|e| explain(&e))?.0;
    let credentials = tokens.load().await.map_err(|e| explain(&e))?;
    if credentials.is_none() {
        return Err(format!(
            "the authorization server of {server} answered without a token"
        ));
    }
    keep(
        &file,
        Saved {
            url: url.to_owned(),
            client_id,
            client_secret,
            redirect_uri,
            metadata,
            wanted_scopes: Vec::new(),
            credentials,
        },
        registration,
    )
}

/// Write a login's `saved` tokens to `file`, and say what the login came to.
fn keep(file: &TokenFile, saved: Saved, registration: &'static str) -> Result<LoggedIn, String> {
    file.write(&saved)?;
    Ok(LoggedIn {
        issuer: saved
            .metadata
            .issuer
            .clone()
            .unwrap_or_else(|| saved.metadata.authorization_endpoint.clone()),
        registration,
        state: LoginState::read(&file.path, &saved.url)?,
    })
}

/// The `scope` a challenge names, if any.
fn scope_of(challenge: &str, url: &str) -> Option<String> {
    let base = reqwest::Url::parse(url).ok()?;
    WWWAuthenticateParams::parse(challenge, &base).scope
}

/// The value of `name` in the query of `address`.
fn query_value(address: &str, name: &str) -> Option<String> {
    let parsed = reqwest::Url::parse(address).ok()?;
    parsed
        .query_pairs()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.into_owned())
}

/// Wait on `listener` for the redirect of this login (path `/callback`, this `state`),
/// answering the browser; any other request is answered 404 and waited past.
async fn redirect(
    listener: &TcpListener,
    port: u16,
    state: &str,
    server: &str,
) -> Result<AuthorizationCallback, String> {
    loop {
        let (mut stream, _) = listener
            .accept()
            .await
            .map_err(|e| format!("the login's redirect could not be received ({e})"))?;
        let mut request = Vec::new();
        let mut buffer = [0u8; 2048];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < MAX_CALLBACK_BYTES {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => request.extend_from_slice(&buffer[..n]),
            }
        }
        let line = String::from_utf8_lossy(&request);
        let target = line
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("GET "))
            .and_then(|l| l.split(' ').next())
            .unwrap_or("");
        let address = format!("http://127.0.0.1:{port}{target}");
        let reply = |status: &str, text: &str| {
            format!(
                "HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\ncache-control: no-store\r\nconnection: close\r\n\r\n{text}",
                text.len()
            )
        };
        if !target.starts_with("/callback?") {
            let _ = stream
                .write_all(reply("404 Not Found", "not here").as_bytes())
                .await;
            continue;
        }
        if query_value(&address, "state").as_deref() != Some(state) {
            let _ = stream
                .write_all(
                    reply("400 Bad Request", "this is not the login the gate started").as_bytes(),
                )
                .await;
            continue;
        }
        if let Some(error) = query_value(&address, "error") {
            let detail = query_value(&address, "error_description").unwrap_or_default();
            let _ = stream
                .write_all(
                    reply("200 OK", "The login was refused; the terminal says why.").as_bytes(),
                )
                .await;
            return Err(format!(
                "the authorization server refused the login to {server}: {error} {detail}"
            )
            .trim_end()
            .to_owned());
        }
        let callback = AuthorizationCallback::from_redirect_url(&address)
            .map_err(|e| format!("the login's redirect is not usable: {}", explain(&e)))?;
        let _ = stream
            .write_all(
                reply(
                    "200 OK",
                    &format!("gate is logged in to {server}. You can close this page."),
                )
                .as_bytes(),
            )
            .await;
        return Ok(callback);
    }
}

/// Forget the login to a server: its token file removed. Whether there was one.
pub fn logout(settings: &OAuthSettings) -> Result<bool, String> {
    TokenFile::new(&settings.token_file).remove()
}

/// The daemon's side: an HTTP client for the MCP transport that carries the server's
/// access token (refreshed when it nears expiry, once more on a 401), from the token file.
pub(crate) async fn authorized(
    server: &str,
    url: &str,
    ca_file: Option<&Path>,
    settings: &OAuthSettings,
) -> Result<Authorized, String> {
    let file = TokenFile::new(&settings.token_file);
    let machine = settings.machine(url)?;
    if machine.is_some() && file.read()?.is_none_or(|saved| saved.url != url) {
        // The gate's own client logs itself in.
        login(server, url, ca_file, settings, ANSWER_DEADLINE, |_| {}).await?;
    }
    let saved = match file.read()? {
        None => return Err(needs_login(server, &format!("{server} needs a login"))),
        Some(saved) if saved.url != url => {
            return Err(needs_login(
                server,
                &format!(
                    "the gate's tokens for {server} are for {}, not {url}",
                    saved.url
                ),
            ));
        }
        Some(saved) => saved,
    };
    if saved.credentials.is_none() {
        return Err(needs_login(server, &format!("{server} needs a login")));
    }
    let http = Http::new(ca_file)?;
    let mut manager = AuthorizationManager::new_with_oauth_http_client(url, http.clone())
        .await
        .map_err(|e| explain(&e))?;
    manager.set_metadata(saved.metadata.clone());
    manager.set_credential_store(file.clone());
    match &machine {
        Some(machine) => machine.configure(&mut manager, &saved.metadata)?,
        None => {
            let mut config =
                OAuthClientConfig::new(saved.client_id.clone(), saved.redirect_uri.clone());
            if let Some(secret) = &saved.client_secret {
                config = config.with_client_secret(secret.clone());
            }
            manager.configure_client(config).map_err(|e| explain(&e))?;
        }
    }
    Ok(Authorized {
        machine,
        http,
        metadata: saved.metadata.clone(),
        client: AuthClient::new(crate::tls::client(ca_file)?, manager),
        client_id: saved.client_id,
        file,
        server: server.to_owned(),
    })
}

/// A server's OAuth client as the daemon holds it.
#[derive(Clone)]
pub(crate) struct Authorized {
    /// The HTTP client of the MCP transport.
    pub(crate) client: AuthClient<reqwest::Client>,
    /// The client id it authenticates as: a new login may register another.
    client_id: String,
    /// The gate's own client (client credentials grant): it gets its tokens itself.
    machine: Option<Machine>,
    /// What the gate's own client asks its tokens with.
    http: Arc<Http>,
    metadata: AuthorizationMetadata,
    file: TokenFile,
    server: String,
}

/// Why a request cannot carry a token now.
pub(crate) enum NotReady {
    /// The token file changed under the connection (a new login): connect again.
    Relogged,
    /// No token can be had: the person must log in (the sentence says so).
    Login(String),
    /// The authorization server could not be asked now: try again later.
    Later(String),
}

impl Authorized {
    /// Make sure the next request carries a valid token: the stored one, or one refreshed
    /// now. Nothing is sent to the MCP server when this fails.
    pub(crate) async fn ready(&self) -> Result<(), NotReady> {
        match self.file.read() {
            Ok(Some(saved)) if saved.client_id != self.client_id => return Err(NotReady::Relogged),
            Ok(Some(_)) => {}
            Ok(None) => {
                return Err(NotReady::Login(needs_login(
                    &self.server,
                    &format!("the gate was logged out of {}", self.server),
                )));
            }
            Err(why) => return Err(NotReady::Later(why)),
        }
        match self.client.get_access_token().await {
            Ok(_) => Ok(()),
            Err(AuthError::AuthorizationRequired) if let Some(machine) = &self.machine => {
                // A client of its own has no refresh token: it asks for a new token.
                let manager = self.client.auth_manager.lock().await;
                machine
                    .obtain(&manager, &self.metadata, self.http.as_ref(), &self.file)
                    .await
                    .map_err(|e| {
                        NotReady::Later(format!(
                            "the authorization server of {} gave the gate's client no new token ({e})",
                            self.server
                        ))
                    })
            }
            Err(AuthError::AuthorizationRequired) => Err(NotReady::Login(needs_login(
                &self.server,
                &format!(
                    "the access token for {} expired and could not be refreshed (the authorization server refused, or gave no refresh token)",
                    self.server
                ),
            ))),
            Err(error) => Err(NotReady::Later(format!(
                "the access token for {} could not be refreshed now ({})",
                self.server,
                explain(&error)
            ))),
        }
    }

    /// A server's refusal of the token (its `WWW-Authenticate` challenge), as a sentence;
    /// a 403 `insufficient_scope` also records the scope it asked for, for the next login.
    pub(crate) async fn refused(&self, challenge: &str, url: &str) -> String {
        let base = reqwest::Url::parse(url).ok();
        let params = base
            .as_ref()
            .map(|b| WWWAuthenticateParams::parse(challenge, b))
            .unwrap_or_default();
        if params.is_insufficient_scope() {
            let asked: Vec<String> = params
                .scope
                .as_deref()
                .unwrap_or("")
                .split_whitespace()
                .map(str::to_owned)
                .collect();
            let _held = self.file.lock.lock().await;
            if let Ok(Some(mut saved)) = self.file.read() {
                for scope in &asked {
                    if !saved.wanted_scopes.contains(scope) {
                        saved.wanted_scopes.push(scope.clone());
                    }
                }
                if let Err(why) = self.file.write(&saved) {
                    tracing::warn!(server = %self.server, %why, "oauth.wanted-scope.unsaved");
                }
            }
            return needs_login(
                &self.server,
                &format!(
                    "{} needs more scope for this call than the gate was granted (it asked for: {}), so it did not run",
                    self.server,
                    if asked.is_empty() {
                        "unnamed".to_owned()
                    } else {
                        asked.join(" ")
                    }
                ),
            );
        }
        needs_login(
            &self.server,
            &format!(
                "{} refused the gate's access token (HTTP 401) and a refreshed one could not be had, so the request did not run",
                self.server
            ),
        )
    }
}

/// A refusal of an HTTP server without OAuth: its static credentials.
pub(crate) const STATIC_REFUSAL: &str = "the server refused the credentials (HTTP 401 or 403), so the request did not run; check the headers it is given";

#[cfg(test)]
mod tests {
    use super::*;

    /// An authorization server on loopback whose every answer is `body`, or a redirect to
    /// `elsewhere` when given.
    async fn answering(body: usize, elsewhere: Option<&'static str>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let address = listener.local_addr().expect("bound");
        let router = axum::Router::new().fallback(move || async move {
            match elsewhere {
                Some(to) => axum::response::Response::builder()
                    .status(302)
                    .header("location", to)
                    .body(axum::body::Body::empty())
                    .expect("a response"),
                None => axum::response::Response::new(axum::body::Body::from(vec![b'x'; body])),
            }
        });
        tokio::spawn(async move { axum::serve(listener, router).await });
        format!("http://{address}/token")
    }

    #[tokio::test]
    async fn an_oversized_answer_or_a_redirect_elsewhere_is_refused_not_read_halfway() {
        let http = Http::new(None).expect("a client");
        let big = answering(MAX_ANSWER_BYTES + 1, None).await;
        let refused = http
            .post_form(&big, String::new())
            .await
            .expect_err("too large");
        assert!(refused.contains("larger than"), "{refused}");
        let small = answering(10, None).await;
        assert_eq!(
            http.post_form(&small, String::new())
                .await
                .expect("read")
                .1
                .len(),
            10
        );
        let moved = answering(0, Some("http://192.0.2.1/metadata")).await;
        let followed = http
            .follow
            .get(&moved)
            .send()
            .await
            .expect_err("not followed");
        assert!(
            format!("{followed:?}").contains("another origin"),
            "{followed:?}"
        );
    }

    #[test]
    fn a_span_reads_in_the_largest_unit_that_fits() {
        assert_eq!(span(12), "12 s");
        assert_eq!(span(3599), "59 min");
        assert_eq!(span(3 * 3600 + 120), "3 h 2 min");
    }

    #[test]
    fn a_token_file_is_its_owners_alone_and_replaced_whole() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("gate-oauth-test-{}", std::process::id()));
        let file = TokenFile::new(&dir.join("oauth").join("s.json"));
        assert!(file.read().expect("absent is fine").is_none());
        let saved = Saved {
            url: "https://mcp.example/mcp".into(),
            client_id: "c".into(),
            client_secret: Some("secret".into()),
            redirect_uri: "http://127.0.0.1:1/callback".into(),
            metadata: AuthorizationMetadata::default(),
            wanted_scopes: vec![],
            credentials: None,
        };
        file.write(&saved).expect("written");
        let mode = |p: &Path| std::fs::metadata(p).expect("exists").permissions().mode() & 0o777;
        assert_eq!(mode(&file.path), 0o600);
        assert_eq!(mode(file.path.parent().expect("dir")), 0o700);
        assert_eq!(
            LoginState::read(&file.path, "https://mcp.example/mcp").expect("read"),
            LoginState::None
        );
        assert_eq!(
            LoginState::read(&file.path, "https://other.example/mcp").expect("read"),
            LoginState::OtherUrl("https://mcp.example/mcp".into())
        );
        assert!(logout(&OAuthSettings::new(&file.path)).expect("removed"));
        assert!(!logout(&OAuthSettings::new(&file.path)).expect("nothing to remove"));
        let _ = std::fs::remove_dir_all(dir);
    }
}

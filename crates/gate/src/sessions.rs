//! The agents' MCP sessions on the HTTP endpoint: each bound to the agent whose token
//! opened it, and counted.
//!
//! - **Bound.** A session id is recorded with its agent when the daemon hands it out (the
//!   `Mcp-Session-Id` of a response to a request that carried none). A request that names
//!   a session bound to another agent is answered 404, as if the session did not exist:
//!   another agent's token can neither post to it, stream its notifications nor delete it.
//! - **Counted.** Opening a session (`initialize`) is refused with 503 when the agent holds
//!   [`SessionLimits::per_agent`] sessions or the daemon [`SessionLimits::total`]; the
//!   answer says how to free one. Sessions rmcp closed (idle past its keep-alive, or
//!   deleted) no longer count: bindings are pruned against rmcp's own session table.
//! - **Not logged**: session ids are secrets of their agent; the gate never logs them.

use std::sync::Arc;

use dashmap::DashMap;

use axum::body::Body;
use axum::http::{Method, Request, Response, StatusCode};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;

/// The header that names a session.
pub const SESSION_HEADER: &str = "mcp-session-id";

/// How many sessions may be open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    /// In the whole daemon.
    pub total: usize,
    /// For one agent.
    pub per_agent: usize,
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self {
            total: 256,
            per_agent: 32,
        }
    }
}

/// The sessions rmcp keeps, with the agent each belongs to.
pub struct Sessions {
    manager: Arc<LocalSessionManager>,
    bound: DashMap<String, String>,
    limits: SessionLimits,
}

/// What the binding layer says of one request, before it reaches rmcp.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    /// Let it through; it names no session, and may open one.
    Opens,
    /// Let it through; it names the caller's own session (or none it could open).
    Passes,
}

impl Sessions {
    /// Sessions of `manager` (rmcp's), within `limits`.
    pub fn new(manager: Arc<LocalSessionManager>, limits: SessionLimits) -> Self {
        Self {
            manager,
            bound: DashMap::new(),
            limits,
        }
    }

    /// Forget bindings of sessions rmcp no longer has.
    async fn prune(&self) {
        let live = self.manager.sessions.read().await;
        self.bound.retain(|id, _| live.contains_key(id.as_str()));
    }

    /// Whether `agent` may send a request naming `session` (or none), and, for one that
    /// opens a session (`opening`), whether there is room; `Err` is the answer to give.
    pub async fn admit(
        &self,
        agent: &str,
        session: Option<&str>,
        opening: bool,
    ) -> Result<Admission, Response<Body>> {
        if let Some(session) = session {
            let owner = self.bound.get(session).map(|owner| owner.value().clone());
            return match owner {
                Some(owner) if owner != agent => Err(answer(
                    StatusCode::NOT_FOUND,
                    "no such session for this token; start one with initialize",
                )),
                _ => Ok(Admission::Passes),
            };
        }
        if !opening {
            return Ok(Admission::Passes);
        }
        self.prune().await;
        let bound = &self.bound;
        let mine = bound.iter().filter(|owner| owner.value() == agent).count();
        if mine >= self.limits.per_agent {
            return Err(answer(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!(
                    "this agent already holds {mine} open sessions, the most the gate allows; close one (DELETE with its Mcp-Session-Id) or let an idle one expire"
                ),
            ));
        }
        if bound.len() >= self.limits.total {
            return Err(answer(
                StatusCode::SERVICE_UNAVAILABLE,
                "the gate holds as many open sessions as it allows; try again once idle ones expire, or ask the person to raise max_sessions",
            ));
        }
        Ok(Admission::Opens)
    }

    /// Record what rmcp answered: a session handed out to `agent`, or one that is gone.
    pub fn settle(
        &self,
        agent: &str,
        method: &Method,
        named: Option<&str>,
        response: &Response<Body>,
    ) {
        let handed_out = response
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok());
        match (named, handed_out) {
            (None, Some(id)) => {
                self.bound.insert(id.to_owned(), agent.to_owned());
            }
            (Some(id), _)
                if response.status() == StatusCode::NOT_FOUND
                    || (method == Method::DELETE && response.status().is_success()) =>
            {
                self.bound.remove(id);
            }
            _ => {}
        }
    }

    /// How many sessions are bound now (for tests and the bench).
    pub fn len(&self) -> usize {
        self.bound.len()
    }

    /// Whether no session is bound.
    pub fn is_empty(&self) -> bool {
        self.bound.is_empty()
    }
}

/// Whether a request body opens a session: a JSON-RPC `initialize`.
pub fn opens_session(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Method<'a> {
        #[serde(borrow)]
        method: Option<&'a str>,
    }
    serde_json::from_slice::<Method<'_>>(body).is_ok_and(|m| m.method == Some("initialize"))
}

fn answer(status: StatusCode, text: &str) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "text/plain; charset=utf-8")
        .body(Body::from(format!("{text}\n")))
        .expect("a plain answer builds")
}

/// The session a request names, if any.
pub fn named_session(request: &Request<Body>) -> Option<String> {
    request
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_initialize_opens_a_session() {
        assert!(opens_session(
            br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#
        ));
        assert!(!opens_session(
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#
        ));
        assert!(!opens_session(b"not json"));
        assert!(!opens_session(br#"[{"method":"initialize"}]"#));
    }

    #[tokio::test]
    async fn a_session_answers_only_its_own_agent_and_openings_are_counted() {
        let sessions = Sessions::new(
            Arc::new(LocalSessionManager::default()),
            SessionLimits {
                total: 3,
                per_agent: 2,
            },
        );
        let handed = |id: &str| {
            Response::builder()
                .header(SESSION_HEADER, id)
                .body(Body::empty())
                .expect("builds")
        };
        // Bound without rmcp knowing the ids: only the binding is checked here.
        sessions.settle("a", &Method::POST, None, &handed("s1"));
        assert_eq!(
            sessions.admit("a", Some("s1"), false).await.ok(),
            Some(Admission::Passes)
        );
        let refused = sessions
            .admit("b", Some("s1"), false)
            .await
            .expect_err("another agent's session");
        assert_eq!(refused.status(), StatusCode::NOT_FOUND);
        // rmcp has no such session, so pruning frees the count.
        assert_eq!(
            sessions.admit("a", None, true).await.ok(),
            Some(Admission::Opens)
        );
        assert!(sessions.is_empty(), "pruned against rmcp's table");
    }
}

//! A downstream server's log (`notifications/message`) on its way to agents: who hears
//! it, at what level, and how much of it.
//!
//! - **Who.** While exactly one agent call is in flight on the server, its messages go to
//!   that call's session alone (the protocol ties no message to a request, and one call in
//!   flight is the only case the gate can tell). Otherwise they go to every session of an
//!   agent with a grant on the server.
//! - **Level.** A session that set a level (`logging/setLevel`) hears messages at that
//!   severity or above; one that set none hears them all.
//! - **How much.** At most [`MAX_LOGS_PER_SECOND`] messages of one server a second reach
//!   agents; the rest are dropped and counted, and the first drop of each second is said
//!   once, as a warning from the logger `gate`. A message whose data is larger than
//!   [`MAX_LOG_DATA_BYTES`] as JSON reaches agents cut, with its size said.
//! - **Nothing in full in the gate's own log**: a dropped or delivered message is counted
//!   at debug level, never written.

#![allow(deprecated)] // the protocol's logging, deprecated in its newest revision but in use

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
use rmcp::service::{Peer, RoleServer};
use serde_json::Value;

/// The most log messages of one server that reach agents in a second.
pub const MAX_LOGS_PER_SECOND: u32 = 50;
/// The largest log data passed on whole, as bytes of JSON; larger data is cut.
pub const MAX_LOG_DATA_BYTES: usize = 8 * 1024;

/// No level set: the session hears every message.
const EVERY_LEVEL: u8 = 0;

/// A severity as a number that grows with it (`debug` 1 to `emergency` 8).
pub fn severity(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 1,
        LoggingLevel::Info => 2,
        LoggingLevel::Notice => 3,
        LoggingLevel::Warning => 4,
        LoggingLevel::Error => 5,
        LoggingLevel::Critical => 6,
        LoggingLevel::Alert => 7,
        LoggingLevel::Emergency => 8,
    }
}

/// The level one agent session asked for, shared by its handler and the relay.
#[derive(Debug, Clone, Default)]
pub struct SessionLevel(Arc<AtomicU8>);

impl SessionLevel {
    /// The session asks for messages at `level` or above.
    pub fn set(&self, level: LoggingLevel) {
        self.0.store(severity(level), Ordering::Relaxed);
    }

    /// Whether a message at `level` reaches this session.
    pub fn hears(&self, level: LoggingLevel) -> bool {
        let floor = self.0.load(Ordering::Relaxed);
        floor == EVERY_LEVEL || severity(level) >= floor
    }
}

/// One agent session that may hear servers' logs.
#[derive(Debug, Clone)]
pub struct Listener {
    /// The agent.
    pub agent: String,
    /// Its connection.
    pub peer: Peer<RoleServer>,
    /// The level it asked for.
    pub level: SessionLevel,
    /// The session's label (never its secret id), for grants that last a session.
    pub session: Option<std::sync::Arc<str>>,
}

impl Listener {
    /// Pass `message` on, if its level is one this session hears. `false` once the
    /// session is gone.
    pub async fn tell(&self, message: &LoggingMessageNotificationParam) -> bool {
        if !self.level.hears(message.level) {
            return true;
        }
        self.peer
            .notify_logging_message(message.clone())
            .await
            .is_ok()
    }
}

/// `message` with its data cut to [`MAX_LOG_DATA_BYTES`] of JSON when larger: the data
/// becomes a string of its first part and its size.
pub fn capped(mut message: LoggingMessageNotificationParam) -> LoggingMessageNotificationParam {
    let text = message.data.to_string();
    if text.len() <= MAX_LOG_DATA_BYTES {
        return message;
    }
    let mut end = MAX_LOG_DATA_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    message.data = Value::String(format!(
        "{}… (the gate cut this message: its data was {} bytes of JSON, over {MAX_LOG_DATA_BYTES})",
        &text[..end],
        text.len()
    ));
    message
}

/// The gate's own word that `server`'s messages are being dropped.
pub fn drop_notice(server: &str, dropped: u64) -> LoggingMessageNotificationParam {
    let mut notice = LoggingMessageNotificationParam::new(
        LoggingLevel::Warning,
        Value::String(format!(
            "server {server} sent more than {MAX_LOGS_PER_SECOND} log messages in a second; the gate drops the rest of each such second ({dropped} dropped so far)"
        )),
    );
    notice.logger = Some("gate".to_owned());
    notice
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_hears_its_level_and_above_or_everything_when_it_set_none() {
        let level = SessionLevel::default();
        assert!(level.hears(LoggingLevel::Debug));
        level.set(LoggingLevel::Warning);
        assert!(!level.hears(LoggingLevel::Info));
        assert!(level.hears(LoggingLevel::Warning));
        assert!(level.hears(LoggingLevel::Emergency));
    }

    #[test]
    fn large_data_is_cut_on_a_character_boundary_with_its_size() {
        let big = LoggingMessageNotificationParam::new(
            LoggingLevel::Info,
            Value::String("é".repeat(MAX_LOG_DATA_BYTES)),
        );
        let cut = capped(big);
        let Value::String(text) = &cut.data else {
            panic!("cut to a string")
        };
        assert!(text.len() < MAX_LOG_DATA_BYTES + 200, "{}", text.len());
        assert!(text.ends_with(&format!(
            "(the gate cut this message: its data was {} bytes of JSON, over {MAX_LOG_DATA_BYTES})",
            2 * MAX_LOG_DATA_BYTES + 2
        )));
        let small = LoggingMessageNotificationParam::new(LoggingLevel::Info, Value::from("ok"));
        assert_eq!(capped(small.clone()), small);
    }
}

//! The single-flight guard of the auto-approval drainer, one per gatekeeper.
//!
//! Shaped like rust-analyzer's `OpQueue`: a request either starts a run or, if one is
//! already running, is folded into a rerun flag that remembers *why* it was asked for.
//! The running drain checks the flag when its pass ends and goes round once more, so a
//! submission that arrives while a pass is parked inside an apply is never lost, and two
//! passes over the same gatekeeper never run at once.

use std::fmt;

use crate::ledger::LedgerId;

/// Why a drain was requested; recorded in tracing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainCause {
    /// An action was submitted that will auto-apply if nothing holds it back.
    Submitted(LedgerId),
    /// A person approved an action, which may have cleared a manual gate.
    Approved(LedgerId),
    /// A person rejected an action, which may have cleared a manual gate.
    Rejected(LedgerId),
    /// A person enabled an auto-approval rule.
    RuleEnabled,
    /// The kernel was started over an existing ledger.
    Resumed,
}

impl fmt::Display for DrainCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Submitted(id) => write!(f, "submitted {id}"),
            Self::Approved(id) => write!(f, "approved {id}"),
            Self::Rejected(id) => write!(f, "rejected {id}"),
            Self::RuleEnabled => f.write_str("rule enabled"),
            Self::Resumed => f.write_str("resumed"),
        }
    }
}

/// The state of one gatekeeper's drainer.
#[derive(Debug, Default)]
pub(crate) struct DrainGuard {
    running: bool,
    rerun: Option<DrainCause>,
}

/// What a request to drain should do.
#[derive(Debug, PartialEq, Eq)]
#[must_use]
pub(crate) enum Request {
    /// No drain was running: the caller must start one.
    Start,
    /// A drain is running; it will go round again. Nothing to do.
    Coalesced,
}

impl DrainGuard {
    /// Ask for a drain.
    pub(crate) fn request(&mut self, cause: DrainCause) -> Request {
        if self.running {
            self.rerun = Some(cause);
            Request::Coalesced
        } else {
            self.running = true;
            Request::Start
        }
    }

    /// Called by the running drain when a pass ends: `Some(cause)` means go round again,
    /// `None` means the drain is over and the guard is released.
    pub(crate) fn pass_finished(&mut self) -> Option<DrainCause> {
        let rerun = self.rerun.take();
        if rerun.is_none() {
            self.running = false;
        }
        rerun
    }

    /// Called when a drain ends abnormally (its task unwound or was dropped): the guard is
    /// released and any rerun is dropped with it; the next request starts a new drain.
    pub(crate) fn abandon(&mut self) {
        self.running = false;
        self.rerun = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_while_running_is_coalesced_into_one_rerun() {
        let mut guard = DrainGuard::default();
        assert_eq!(guard.request(DrainCause::RuleEnabled), Request::Start);
        assert_eq!(
            guard.request(DrainCause::Submitted(LedgerId(1))),
            Request::Coalesced
        );
        assert_eq!(
            guard.request(DrainCause::Submitted(LedgerId(2))),
            Request::Coalesced
        );
        assert_eq!(
            guard.pass_finished(),
            Some(DrainCause::Submitted(LedgerId(2)))
        );
        assert_eq!(guard.pass_finished(), None);
        assert_eq!(guard.request(DrainCause::RuleEnabled), Request::Start);
    }
}

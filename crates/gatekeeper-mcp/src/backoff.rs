//! Restart backoff: a server that fails to start is not started again at once, so a broken
//! command does not spin; the wait doubles with each failure, up to [`MAX_BACKOFF`].
//!
//! Time is tokio's, so tests drive it with a paused clock.

use std::time::Duration;

use tokio::time::Instant;

/// The wait after the first failed start.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(250);
/// The longest wait between two starts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Failed starts in a row, and when the next start may be tried.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Backoff {
    failures: u32,
    not_before: Option<Instant>,
}

impl Backoff {
    /// `Err(wait)` while a start must not be tried yet.
    pub(crate) fn check(&self, now: Instant) -> Result<(), Duration> {
        match self.not_before {
            Some(at) if at > now => Err(at - now),
            _ => Ok(()),
        }
    }

    /// A start failed at `now`: the next one waits twice as long as the last wait.
    pub(crate) fn failed(&mut self, now: Instant) -> Duration {
        let wait = FIRST_BACKOFF
            .saturating_mul(1 << self.failures.min(16))
            .min(MAX_BACKOFF);
        self.failures = self.failures.saturating_add(1);
        self.not_before = Some(now + wait);
        wait
    }

    /// A start succeeded: the next failure waits [`FIRST_BACKOFF`] again.
    pub(crate) fn succeeded(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn failed_starts_wait_longer_each_time_up_to_a_limit_and_success_resets() {
        let mut backoff = Backoff::default();
        assert_eq!(
            backoff.check(Instant::now()),
            Ok(()),
            "the first start is free"
        );
        assert_eq!(backoff.failed(Instant::now()), FIRST_BACKOFF);
        assert_eq!(backoff.check(Instant::now()), Err(FIRST_BACKOFF));
        tokio::time::advance(FIRST_BACKOFF).await;
        assert_eq!(backoff.check(Instant::now()), Ok(()));
        assert_eq!(backoff.failed(Instant::now()), FIRST_BACKOFF * 2);
        for _ in 0..20 {
            backoff.failed(Instant::now());
        }
        assert_eq!(backoff.failed(Instant::now()), MAX_BACKOFF);
        backoff.succeeded();
        assert_eq!(backoff.check(Instant::now()), Ok(()));
        assert_eq!(backoff.failed(Instant::now()), FIRST_BACKOFF);
    }
}

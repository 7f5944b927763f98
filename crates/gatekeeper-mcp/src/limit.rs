//! A budget of messages per second, for what a downstream server sends that reaches a
//! person or an agent unasked (its log, its standard error): within the budget a message
//! passes; past it, messages are dropped and counted, and the first drop of each second is
//! to be said once, by whoever holds the budget.

use tokio::time::{Duration, Instant};

/// One source's budget for the current second.
#[derive(Debug)]
pub struct Limiter {
    per_second: u32,
    window: Instant,
    sent: u32,
    /// Whether this second's first drop was said.
    said: bool,
    /// Messages dropped since the budget was made.
    dropped: u64,
}

/// What to do with one message.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Pass it on.
    Pass,
    /// Drop it, and say so first (this second's first drop): the total dropped so far.
    DropAndSay(u64),
    /// Drop it silently (already said this second).
    Drop,
}

impl Limiter {
    /// A budget of `per_second` messages a second, from `now`.
    pub fn new(per_second: u32, now: Instant) -> Self {
        Self {
            per_second,
            window: now,
            sent: 0,
            said: false,
            dropped: 0,
        }
    }

    /// The verdict on one more message at `now`.
    pub fn admit(&mut self, now: Instant) -> Verdict {
        if now.duration_since(self.window) >= Duration::from_secs(1) {
            self.window = now;
            self.sent = 0;
            self.said = false;
        }
        if self.sent < self.per_second {
            self.sent += 1;
            return Verdict::Pass;
        }
        self.dropped += 1;
        if self.said {
            Verdict::Drop
        } else {
            self.said = true;
            Verdict::DropAndSay(self.dropped)
        }
    }

    /// Messages dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_passes_its_budget_a_second_and_says_its_first_drop_once_a_second() {
        let start = Instant::now();
        let mut limiter = Limiter::new(50, start);
        let verdicts: Vec<Verdict> = (0..53).map(|_| limiter.admit(start)).collect();
        assert!(verdicts[..50].iter().all(|v| *v == Verdict::Pass));
        assert_eq!(verdicts[50], Verdict::DropAndSay(1));
        assert_eq!(verdicts[51..], [Verdict::Drop, Verdict::Drop]);
        let later = start + Duration::from_secs(1);
        assert_eq!(limiter.admit(later), Verdict::Pass);
        for _ in 0..49 {
            limiter.admit(later);
        }
        assert_eq!(limiter.admit(later), Verdict::DropAndSay(4));
        assert_eq!(limiter.dropped(), 4);
    }
}

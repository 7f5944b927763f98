//! Time as an injected dependency, so ledgers and transcripts are reproducible.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Timestamp(pub u64);

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.0 / 1000;
        let (h, m, s) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
        write!(f, "{h:02}:{m:02}:{s:02}.{:03}", self.0 % 1000)
    }
}

/// A source of the current time.
pub trait Clock: Send + Sync {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        Timestamp(millis)
    }
}

/// A deterministic clock: starts at a fixed instant and moves forward by a fixed step
/// every time it is read. Tests and lectures use it so every run prints the same times.
#[derive(Debug)]
pub struct StepClock {
    next: AtomicU64,
    step: u64,
}

impl StepClock {
    /// A clock whose first reading is `start` milliseconds and each later one `step` more.
    pub fn new(start: u64, step: u64) -> Self {
        Self {
            next: AtomicU64::new(start),
            step,
        }
    }

    /// Move the clock forward without reading it (for example "three hours later").
    pub fn advance(&self, millis: u64) {
        self.next.fetch_add(millis, Ordering::SeqCst);
    }
}

impl Default for StepClock {
    /// 09:00:00.000 on day zero, one second per reading.
    fn default() -> Self {
        Self::new(9 * 3600 * 1000, 1000)
    }
}

impl Clock for StepClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.next.fetch_add(self.step, Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_clock_moves_by_its_step_and_formats_as_time_of_day() {
        let clock = StepClock::default();
        assert_eq!(clock.now().to_string(), "09:00:00.000");
        assert_eq!(clock.now().to_string(), "09:00:01.000");
        clock.advance(3 * 3600 * 1000);
        assert_eq!(clock.now().to_string(), "12:00:02.000");
    }
}

//! Time as an injected dependency, so ledgers and transcripts are reproducible.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch.
#[derive(
    Debug, Default, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct Timestamp(pub u64);

/// Shows the time of day (`09:00:01.000`) for an instant on day zero, as the lectures'
/// fixed clock reads, and the date with it, in UTC, for any later one
/// (`2026-11-30 20:15:00.000`), as a wall clock reads: a real ledger's times carry their
/// day.
impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.0 / 1000;
        let days = secs / 86_400;
        if days > 0 {
            let (y, mo, d) = civil_from_days(days);
            write!(f, "{y:04}-{mo:02}-{d:02} ")?;
        }
        let (h, m, s) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
        write!(f, "{h:02}:{m:02}:{s:02}.{:03}", self.0 % 1000)
    }
}

/// The proleptic Gregorian date of `days` after 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
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

    #[test]
    fn a_wall_clock_time_shows_its_date_so_a_real_ledger_is_not_read_as_1970() {
        assert_eq!(Timestamp(0).to_string(), "00:00:00.000");
        assert_eq!(Timestamp(86_400_000).to_string(), "1970-01-02 00:00:00.000");
        // 2026-11-30 20:15:00.250 UTC
        assert_eq!(
            Timestamp(1_796_069_700_250).to_string(),
            "2026-11-30 20:15:00.250"
        );
        // A leap day.
        assert_eq!(
            Timestamp(951_782_400_000).to_string(),
            "2000-02-29 00:00:00.000"
        );
    }
}

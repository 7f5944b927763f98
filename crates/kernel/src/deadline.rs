//! How long the kernel waits for a driver, and what it does when a driver never answers
//! or panics: every call into a [`Gatekeeper`](crate::Gatekeeper) that may reach a service
//! (apply, reject, revert) runs inside [`Bounded`], which turns a deadline that passed and
//! a panic into values the kernel records, instead of a hang or an unwinding task.
//!
//! The deadline lives here, in the kernel, because the kernel is the one party every
//! driver passes through: a driver that forgets its own timeout, or hangs outside its
//! service call, still cannot hang a person's approval or an auto-approval drain. Each
//! gatekeeper chooses its deadline ([`Gatekeeper::call_deadline`](crate::Gatekeeper::call_deadline),
//! [`DEFAULT_CALL_DEADLINE`] unless it says otherwise).
//!
//! Time is tokio's: tests pause it (`tokio::time::pause`) instead of waiting. The deadline
//! counts from the call's first poll; the timer is armed only when the driver does not
//! answer on that poll, so a driver that answers at once costs no timer (and needs no time driver in the runtime); one that does not
//! answer at once needs a runtime with time enabled (`enable_time`, `enable_all`, or
//! `#[tokio::test]`). Drivers use [`Bounded`] too, for the calls that do not pass through
//! the kernel (reads).

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// The deadline of one call into a driver, unless its gatekeeper chooses another.
pub const DEFAULT_CALL_DEADLINE: Duration = Duration::from_secs(30);

/// How a bounded call ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended<T> {
    /// The driver answered.
    Answered(T),
    /// The driver panicked; the panic's message, if it had one.
    Panicked(String),
    /// The deadline passed first; the call was dropped.
    TimedOut,
}

/// A driver's call with a deadline, and with its panics caught.
///
/// After a panic the inner future is never polled again. Driver futures are boxed
/// (`async_trait`), hence `Unpin`, so no pinning tricks are needed.
pub struct Bounded<F> {
    call: F,
    deadline: Duration,
    started: Option<Instant>,
    timer: Option<Pin<Box<Sleep>>>,
}

impl<F> Bounded<F> {
    /// Bound `call` by `deadline`, counted from its first poll. A deadline too far away to
    /// be represented (`Duration::MAX`) means no deadline.
    pub fn new(call: F, deadline: Duration) -> Self {
        Self {
            call,
            deadline,
            started: None,
            timer: None,
        }
    }
}

impl<F: Future + Unpin> Future for Bounded<F> {
    type Output = Ended<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let started = *this.started.get_or_insert_with(Instant::now);
        let call = &mut this.call;
        match catch_unwind(AssertUnwindSafe(|| Pin::new(call).poll(cx))) {
            Ok(Poll::Ready(answer)) => return Poll::Ready(Ended::Answered(answer)),
            Ok(Poll::Pending) => {}
            Err(payload) => return Poll::Ready(Ended::Panicked(panic_message(&*payload))),
        }
        if this.timer.is_none() {
            let Some(at) = started.checked_add(this.deadline) else {
                return Poll::Pending;
            };
            this.timer = Some(Box::pin(tokio::time::sleep_until(at)));
        }
        let timer = this.timer.as_mut().expect("armed above");
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Ended::TimedOut),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// The most characters of a panic's message kept in the ledger.
const MAX_PANIC_CHARS: usize = 200;

/// The text of a panic payload (`panic!("...")` carries a `&str` or a `String`).
fn panic_message(payload: &(dyn Any + Send)) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("no message");
    let mut kept: String = text.chars().take(MAX_PANIC_CHARS).collect();
    if kept.len() < text.len() {
        kept.push('…');
    }
    kept
}

/// A duration as a person reads it in a message: `30 s`, `250 ms`.
pub struct Human(pub Duration);

impl fmt::Display for Human {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d.subsec_nanos() == 0 {
            write!(f, "{} s", d.as_secs())
        } else {
            write!(f, "{} ms", d.as_millis())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_seconds_or_milliseconds() {
        assert_eq!(Human(Duration::from_secs(30)).to_string(), "30 s");
        assert_eq!(Human(Duration::from_millis(250)).to_string(), "250 ms");
    }

    #[test]
    fn a_panic_message_is_kept_short() {
        let long = "x".repeat(500);
        let kept = panic_message(&long);
        assert_eq!(kept.chars().count(), MAX_PANIC_CHARS + 1);
        assert_eq!(panic_message(&"boom"), "boom");
        assert_eq!(panic_message(&7_u8), "no message");
    }

    #[tokio::test]
    async fn an_answer_at_once_needs_no_timer() {
        // This runtime has time enabled, but an immediate answer never arms the timer.
        let bounded = Bounded::new(Box::pin(async { 5 }), Duration::ZERO);
        assert_eq!(bounded.await, Ended::Answered(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_never_answers_times_out() {
        let bounded = Bounded::new(
            Box::pin(std::future::pending::<()>()),
            Duration::from_secs(30),
        );
        let start = tokio::time::Instant::now();
        assert_eq!(bounded.await, Ended::TimedOut);
        assert_eq!(start.elapsed(), Duration::from_secs(30));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unrepresentable_deadline_means_none() {
        let slow = Box::pin(async {
            tokio::time::sleep(Duration::from_secs(86_400 * 365)).await;
            5
        });
        assert_eq!(Bounded::new(slow, Duration::MAX).await, Ended::Answered(5));
    }

    #[tokio::test]
    async fn a_panic_becomes_a_value() {
        let bounded = Bounded::new(
            Box::pin(async { panic!("driver bug") }),
            Duration::from_secs(1),
        );
        let ended: Ended<()> = bounded.await;
        assert_eq!(ended, Ended::Panicked("driver bug".to_owned()));
    }
}

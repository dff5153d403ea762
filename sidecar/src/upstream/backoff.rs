//! The restart backoff of one upstream: consecutive failures (starts that failed, connections
//! that ended soon after their start) space the next start out, 250 ms doubling to 30 s, counted
//! from the last start of either revision's connection. A connection that had run for a minute
//! was healthy: its end counts as the first failure of a new streak.

use std::time::{Duration, Instant};

/// A connection that lived longer than this had been healthy: its crash restarts the backoff.
const HEALTHY_AFTER: Duration = Duration::from_secs(60);
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Delay before the next start after `failures` consecutive failures.
pub fn backoff(failures: u32) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    let exp = failures.saturating_sub(1).min(16);
    FIRST_BACKOFF.saturating_mul(1 << exp).min(MAX_BACKOFF)
}

/// The start history of one upstream.
#[derive(Debug, Default)]
pub struct Backoff {
    failures: u32,
    /// When the last process was spawned (HTTP: connection opened), whatever came of it.
    last_start: Option<Instant>,
    /// What the last failure was (for the error of a request inside the backoff).
    last_failure: Option<String>,
}

impl Backoff {
    /// A connection ended (on its own) after running for `lived`, for the reason `why`.
    pub fn ended(&mut self, lived: Duration, why: String) {
        self.failures = if lived > HEALTHY_AFTER {
            1
        } else {
            self.failures + 1
        };
        self.last_failure = Some(why);
    }

    /// A start failed with `why`.
    pub fn failed(&mut self, why: String) {
        self.failures += 1;
        self.last_failure = Some(why);
    }

    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// What the last failure was.
    pub fn last_failure(&self) -> &str {
        self.last_failure.as_deref().unwrap_or("unknown")
    }

    /// Records a start now that is not a restart (a revision's first connection to a server that
    /// is up in the other): the window does not hold it back.
    pub fn start_anyway(&mut self) {
        self.last_start = Some(Instant::now());
    }

    /// Records a start now, or says how long until one is allowed.
    pub fn start(&mut self) -> Result<(), Duration> {
        if let Some(last) = self.last_start {
            let wait = backoff(self.failures).saturating_sub(last.elapsed());
            if !wait.is_zero() {
                return Err(wait);
            }
        }
        self.last_start = Some(Instant::now());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(0), Duration::ZERO);
        assert_eq!(backoff(1), Duration::from_millis(250));
        assert_eq!(backoff(2), Duration::from_millis(500));
        assert_eq!(backoff(5), Duration::from_secs(4));
        assert_eq!(backoff(50), MAX_BACKOFF);
    }

    #[test]
    fn starts_after_failures_are_spaced_and_a_long_life_starts_a_new_streak() {
        let mut b = Backoff::default();
        assert_eq!(b.start(), Ok(()), "the first start never waits");
        b.failed("boom".into());
        let wait = b
            .start()
            .expect_err("a start right after a failed one waits");
        assert!(wait > Duration::ZERO && wait <= backoff(1), "{wait:?}");
        assert!(b.start().is_err(), "so is every start inside the window");
        b.ended(Duration::from_millis(10), "exited".into());
        assert_eq!(b.last_failure(), "exited");
        assert_eq!(b.failures(), 2, "an early exit adds to the streak");
        b.ended(HEALTHY_AFTER + Duration::from_secs(1), "crashed".into());
        assert_eq!(b.failures(), 1, "a healthy run starts a new streak");
    }
}

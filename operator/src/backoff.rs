//! How the operator's watches retry after an error. kube's `default_backoff` (0.8 s doubling to
//! 30 s, plus up to as much again of jitter) and the `Controller`'s own backoff of its merged
//! trigger streams made a TaskRun change take 42-190 s to be rendered after an API server
//! restart (test_live_control.py), for three reasons, each handled here:
//!
//! - The `Controller` wraps all its trigger streams (TaskRuns, Jobs, ConfigMaps, Leases,
//!   ToolApprovals) in one more backoff, shared by all: any watch's error doubled it, and while it
//!   slept no watch was polled, not even one whose own retry was due or whose answer had
//!   arrived. Each watch backs off by itself here, so the controller adds nothing
//!   ([`NoBackoff`]).
//! - A restarted API server answers a resumed watch with 410 Gone (its watch cache starts
//!   anew): the watcher re-lists, but only after the backoff the outage had grown. That is no
//!   failure to wait on: the re-list follows at once ([`watch`]).
//! - During the outage the delays grow; the first try after the server is back waits out the
//!   current one. They stop at [`MAX_DELAY`] (the operator has a handful of watches).

use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, Event};

/// The first delay after an error.
pub const FIRST_DELAY: Duration = Duration::from_millis(500);
/// The longest delay between two tries.
pub const MAX_DELAY: Duration = Duration::from_secs(5);

/// No delay after an error of the controller's merged trigger streams: each backs off by itself.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoBackoff;

impl Iterator for NoBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(Duration::ZERO)
    }
}

impl Backoff for NoBackoff {
    fn reset(&mut self) {}
}

/// A watcher's stream with its retries paced: after an error, the next try waits the next delay
/// (from `FIRST_DELAY` doubling to `MAX_DELAY`); after a 410 Gone (the watcher re-lists) it does
/// not wait; any event but `Init` (which the watcher emits before it even tries to list) resets
/// the delays.
pub fn watch<S, K>(stream: S) -> impl Stream<Item = watcher::Result<Event<K>>> + Send
where
    S: Stream<Item = watcher::Result<Event<K>>> + Send + Unpin,
    K: Send,
{
    futures::stream::unfold(
        (stream, Delays::default(), None),
        |(mut stream, mut delays, wait)| async move {
            if let Some(wait) = wait {
                tokio::time::sleep(wait).await;
            }
            let item = stream.next().await?;
            let wait = match &item {
                Ok(Event::Init) => None,
                Ok(_) => {
                    delays.reset();
                    None
                }
                Err(e) if expired(e) => None,
                Err(_) => Some(delays.next_delay()),
            };
            Some((item, (stream, delays, wait)))
        },
    )
}

/// The API server no longer has the resource version the watch resumed from: the watcher lists
/// again on its next step.
fn expired(error: &watcher::Error) -> bool {
    matches!(error, watcher::Error::WatchError(status) if status.code == 410)
}

/// Delays from [`FIRST_DELAY`] doubling to [`MAX_DELAY`], each drawn between half and all of it
/// (watches that failed together do not retry in step).
#[derive(Debug)]
struct Delays {
    current: Duration,
    random: RandomState,
}

impl Default for Delays {
    fn default() -> Self {
        Self {
            current: FIRST_DELAY,
            random: RandomState::new(),
        }
    }
}

impl Delays {
    fn next_delay(&mut self) -> Duration {
        let full = self.current;
        self.current = (self.current * 2).min(MAX_DELAY);
        // A fraction in [0, 1) from a randomly keyed hash of the delay.
        let fraction = (self.random.hash_one(full) >> 11) as f64 / (1u64 << 53) as f64;
        full / 2 + (full / 2).mul_f64(fraction)
    }

    fn reset(&mut self) {
        self.current = FIRST_DELAY;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    #[test]
    fn delays_double_up_to_the_cap_with_jitter_and_reset() {
        let mut delays = Delays::default();
        let drawn: Vec<Duration> = (0..8).map(|_| delays.next_delay()).collect();
        let full = [500, 1000, 2000, 4000, 5000, 5000, 5000, 5000].map(Duration::from_millis);
        for (d, f) in drawn.iter().zip(full) {
            assert!(
                *d >= f / 2 && *d <= f,
                "{d:?} not within [{:?}, {f:?}]",
                f / 2
            );
        }
        delays.reset();
        assert!(delays.next_delay() <= FIRST_DELAY);
    }

    fn gone() -> watcher::Error {
        let mut status = Status::failure("too old resource version: 1669 (1683)", "Expired");
        status.code = 410;
        watcher::Error::WatchError(Box::new(status))
    }

    #[tokio::test(start_paused = true)]
    async fn a_410_is_followed_at_once_other_errors_wait() {
        let items: Vec<watcher::Result<Event<u32>>> = vec![
            Err(watcher::Error::NoResourceVersion),
            Err(gone()),
            Ok(Event::Init),
            Err(watcher::Error::NoResourceVersion),
            Ok(Event::Apply(1)),
            Err(watcher::Error::NoResourceVersion),
            Ok(Event::Apply(2)),
        ];
        let start = tokio::time::Instant::now();
        let mut stream = std::pin::pin!(watch(futures::stream::iter(items)));
        let mut at = Vec::new();
        while let Some(item) = stream.next().await {
            at.push((item.is_ok(), start.elapsed()));
        }
        let waited: Vec<Duration> = at.windows(2).map(|w| w[1].1 - w[0].1).collect();
        // After the first error: a delay; after the 410: none; after Init: none, and the delays
        // go on growing (the next error waits the second delay); after an event: none, and the
        // next error waits the first delay again.
        let first = FIRST_DELAY / 2..=FIRST_DELAY;
        assert!(first.contains(&waited[0]), "{waited:?}");
        assert_eq!(waited[1], Duration::ZERO);
        assert_eq!(waited[2], Duration::ZERO);
        assert!(
            (FIRST_DELAY..=FIRST_DELAY * 2).contains(&waited[3]),
            "{waited:?}"
        );
        assert_eq!(waited[4], Duration::ZERO);
        assert!(first.contains(&waited[5]), "{waited:?}");
    }
}

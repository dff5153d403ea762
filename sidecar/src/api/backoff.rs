//! How the ConfigMap watch retries after an error (the operator's `backoff.rs` does the same for
//! its watches; the two crates share no client code). kube's `default_backoff` (0.8 s doubling to
//! 30 s, plus up to as much again of jitter) kept the watch away for up to a minute after the
//! API server was back; and a restarted API server answers the resumed watch with 410 Gone (its
//! watch cache starts anew), which is no failure to wait on: the watcher re-lists at once here.
//! Delays stop at [`MAX_DELAY`]: the mounted file still applies changes meanwhile.

use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::watcher::{self, Event};

/// The first delay after an error.
const FIRST_DELAY: Duration = Duration::from_millis(500);
/// The longest delay between two tries.
const MAX_DELAY: Duration = Duration::from_secs(5);

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

/// Delays from [`FIRST_DELAY`] doubling to [`MAX_DELAY`], each drawn between half and all of it.
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
        let full = [500, 1000, 2000, 4000, 5000, 5000, 5000].map(Duration::from_millis);
        for f in full {
            let d = delays.next_delay();
            assert!(
                d >= f / 2 && d <= f,
                "{d:?} not within [{:?}, {f:?}]",
                f / 2
            );
        }
        delays.reset();
        assert!(delays.next_delay() <= FIRST_DELAY);
    }

    #[tokio::test]
    async fn a_410_is_followed_at_once() {
        let mut gone = Status::failure("too old resource version: 1669 (1683)", "Expired");
        gone.code = 410;
        let items: Vec<watcher::Result<Event<u32>>> = vec![
            Err(watcher::Error::WatchError(Box::new(gone))),
            Ok(Event::Init),
        ];
        let started = std::time::Instant::now();
        let got: Vec<_> = watch(futures::stream::iter(items)).collect().await;
        assert_eq!(got.len(), 2);
        assert!(started.elapsed() < FIRST_DELAY / 2, "waited after a 410");
    }
}
